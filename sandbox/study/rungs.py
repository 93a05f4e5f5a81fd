"""The study's rungs, their settings and its unit of work. A :class:`Rung` is a run kind
(:mod:`sandbox.experiments.runs`) with its typed settings section (one frozen dataclass, each field
one flag, below); :data:`RUNGS` holds the toy rungs registered here, in ladder order (cheapest
first); ``llm.claims`` adds the ``llm`` rung and its section with :func:`register_rung` and
:func:`register_section` (``sandbox`` never imports ``llm``). A :class:`StudyJob` is one run of one
rung; the rung maps it to a run spec, the planner (:mod:`.plan`) makes and groups them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from sandbox.configs import arg, check_int, check_keys, check_number
from sandbox.experiments.compare import check_setting_names, check_task
from sandbox.experiments.results import part_stem
from sandbox.experiments.runs import (
    RunKind,
    RunSpec,
    has_exact_flow,
    objective_of,
    optimum,
    run_kind,
)

from .claims import Bounds

# -- sections: each rung's typed settings, one way to set each -------------------------------------
# Typed per-rung settings: one frozen dataclass per *section*, one way to set each setting.
#
# A section holds the settings of one or more rungs (``bandit``: ``bandit_exact`` and
# ``bandit_sampled``; ``tf``: ``tiny_tf``; ``llm``: registered by ``llm.claims``), the paired
# ``seeds`` of its rungs among them. :class:`~.config.StudyConfig` holds one instance per section
# (``config.section("bandit")``), the CLI (:mod:`.cli`) gives each field one flag,
# ``--<section>-<field>`` (``--tf-knobs op=reverse length=2``), and a folder's ``config.json``
# records them under ``sections``. A setting's error names it ``<section>_<field>``
# (``bandit_steps``).

#: The registered sections: name -> settings dataclass.
SECTIONS: dict[str, type] = {}


def unknown(kind: str, name: str, names: Iterable[str]) -> ValueError:
    """The error for an unregistered name: ``rungs: unknown rung 'x'; rungs: a, b``."""
    return ValueError(f"{kind}s: unknown {kind} {name!r}; {kind}s: {', '.join(names)}")


def register_section(name: str, settings: type) -> type:
    """Add the section ``name`` (``llm.claims`` adds ``llm``); ``settings`` is a frozen dataclass
    with a ``seeds`` field, its fields declared with :func:`~sandbox.configs.arg`."""
    names = [f.name for f in dataclasses.fields(settings)]
    if "seeds" not in names:
        raise ValueError(f"section {name!r}: its settings need a 'seeds' field (paired seeds)")
    SECTIONS[name] = settings
    return settings


def unregister_section(name: str) -> None:
    """Remove the section ``name`` (a test's throwaway section)."""
    if SECTIONS.pop(name, None) is None:
        raise unknown("section", name, SECTIONS)


def section_settings(name: str, value: Any = None) -> Any:
    """The settings of section ``name`` from an instance, a mapping of its fields (a
    ``config.json``, a profile) or None (its defaults); ``ValueError`` naming an unknown section
    or setting."""
    if name not in SECTIONS:
        raise unknown("section", name, SECTIONS)
    cls = SECTIONS[name]
    if value is None or isinstance(value, cls):
        return cls() if value is None else value
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: settings must be a mapping of its fields, got {value!r}")
    check_keys(name, value, [f.name for f in dataclasses.fields(cls)], "setting")
    try:
        return cls(**value)
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from None


# -- value checks, each naming its setting ------------------------------------------------------


def step_sizes(name: str, value: Any) -> list[float]:
    """A step-size grid: finite numbers > 0 (strings of numbers too: an old record)."""
    values = value if isinstance(value, list | tuple) else [value]
    try:
        out = [check_number(name, v, text=True) for v in values]
    except ValueError:
        out = []
    if not out:
        raise ValueError(f"{name} must be finite numbers > 0, got {value!r}")
    return out


def mu_grid(name: str, value: Any) -> list[int]:
    """A mu grid: integers >= 1; one int (an old config.json) is a grid of one."""
    values = [value] if isinstance(value, int | str) else list(value)
    try:
        ints = [int(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be integers, got {value!r}") from None
    if not ints or ints != [float(v) for v in values] or min(ints) < 1:
        raise ValueError(f"{name} must be integers >= 1, got {value!r}")
    return ints


def knobs(name: str, value: Any) -> dict[str, Any]:
    """A task's knobs: a mapping (checked by the task itself)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be key=value pairs, got {value!r}")
    return dict(value)


def optional_path(name: str, value: Any) -> str | None:
    """A file path, or None where ``value`` is None or ``none`` (the command line's word for it:
    ``--tf-init none`` trains from scratch)."""
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return None
    return text(name, value)


def text(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def settle(
    settings: Any, section: str, low: Mapping[str, int] | None = None, **checks: Callable
) -> None:
    """Check a section's settings in ``__post_init__``: each field of ``checks`` replaced by
    ``check("<section>_<field>", value)`` (in order), then :func:`check_fields`."""
    for field, check in checks.items():
        value = check(f"{section}_{field}", getattr(settings, field))
        object.__setattr__(settings, field, value)
    check_fields(settings, f"{section}_", low)


def check_fields(settings: Any, prefix: str = "", low: Mapping[str, int] | None = None) -> None:
    """Every field of dataclass ``settings`` with ``choices`` (its :func:`sandbox.configs.arg`)
    one of them (or None where its type allows None), and every ``int`` field an integer >= its
    bound in ``low`` (default 1); a ``ValueError`` naming ``<prefix><field>``."""
    for f in dataclasses.fields(settings):
        value, choices = getattr(settings, f.name), f.metadata.get("choices")
        optional = value is None and "None" in str(f.type)
        if choices is not None and value not in choices and not optional:
            raise ValueError(
                f"{prefix}{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}"
            )
        if f.type in (int, "int"):
            check_int(f"{prefix}{f.name}", value, (low or {}).get(f.name, 1))


def knob_text(value: Any) -> str:
    """A knob's value in a setting name or on the page: a list as its items joined
    (``ops=['+','-']`` -> ``+-``), anything else as ``str``."""
    return "".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def task_setting(task: str, task_knobs: Mapping[str, Any]) -> str:
    """A task's setting name: the task and its sorted knobs (``bits-length2-opreverse``)."""
    return "-".join([task, *(f"{k}{knob_text(v)}" for k, v in sorted(task_knobs.items()))])


# -- the sandbox sections -----------------------------------------------------------------------


@dataclass(frozen=True)
class BanditSettings:
    """The bandit rungs' settings (``bandit_exact``, ``bandit_sampled``)."""

    setting: str = arg("mixed", "envs.make_bandit_suite name")
    # the regime (setting, steps, seeds): chosen by `python -m sandbox.study.regimes`
    # (results/regimes): `mixed` at 60 steps left every comparator within 2 margins of the optimum
    steps: int = arg(15, "bandit_sampled steps")
    # the exact flow's horizon, chosen by the same rule (results/regimes): at 15 steps every
    # comparator of the exact flow sat within 2 margins of the optimum (no headroom)
    exact_steps: int = arg(5, "bandit_exact steps (the expected-gradient flow's horizon)")
    prompts_per_step: int = arg(4, "groups per bandit step")
    lrs: list[float] = arg(
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], "bandit step-size grid (SGD)"
    )
    seeds: int = arg(99, "paired seeds per rule on bandit_sampled (the exact flow: 1)")

    def __post_init__(self) -> None:
        settle(self, "bandit", lrs=step_sizes)

    def check(self) -> None:
        """The bandit setting exists."""
        from envs import make_bandit_suite

        check_setting_names([self.setting], make_bandit_suite(), where="bandit_setting")


#: The tiny_tf rung's warm start: made by ``python -m sandbox.study.regimes`` (the chosen
#: candidate's ``warm_start``: held-out pass@1 0.3 on the test partition, at most 400 supervised
#: steps) and committed.
WARM_START = "results/regimes/warm_start/sequence-alphabetdigits-length4-opreverse-e87869c26c.pt"


@dataclass(frozen=True)
class TfSettings:
    """The tiny_tf rung's settings."""

    # the regime (task, knobs, steps, step-size grid, warm start, seeds): chosen by
    # `python -m sandbox.study.regimes` (results/regimes): 4-digit reversal from one warm start,
    # on held-out problems of its test partition (the 2-bit reversal it replaced had 4 problems;
    # on `mod_arith` (steps 2) no rule beat always answering "0")
    task: str = arg("sequence", "tiny_tf task (envs.reasoning)")
    knobs: dict[str, Any] = arg(
        {"op": "reverse", "length": 4, "alphabet": "digits"},
        "tiny_tf task knobs, key=value (the task checks them)",
    )
    steps: int = arg(40, "tiny_tf steps")
    prompts_per_step: int = arg(4, "tiny_tf prompts per step")
    lrs: list[float] = arg(
        [1e-5, 3e-5, 1e-4, 3e-4, 1e-3],
        "tiny_tf step-size grid (Adam; every rule's own step size was 3e-4 in "
        "results/warm_start_pilot/sequence4_grid, so the grid brackets it)",
    )
    epochs: list[int] = arg(
        [4, 8],
        "mu grid on tiny_tf: epochs (x minibatches); 2 x 2 left dapo's clip share below 4%% at "
        "every step size tried, 4 x 2 below 5%%, so this rung calibrates over more passes",
    )
    eval_prompts: int = arg(512, "tiny_tf held-out problems (fixed by the seed)")
    eval_k: int = arg(2, "tiny_tf samples per held-out problem")
    split: bool = arg(
        True,
        "tiny_tf trains on the task's train partition and scores held-out problems from its test "
        "partition (disjoint by construction; envs.reasoning.problem_split)",
    )
    init: str | None = arg(
        WARM_START,
        "tiny_tf warm start: a file of python -m sandbox.train.warm_start every replicate starts "
        "from (none: from scratch; a relative path not found from the working directory is read "
        "from the checkout)",
    )
    seeds: int = arg(26, "paired seeds per rule on tiny_tf")

    def __post_init__(self) -> None:
        settle(self, "tf", lrs=step_sizes, epochs=mu_grid, knobs=knobs, init=optional_path)

    def check(self) -> None:
        """The task exists with these knobs, and a warm start fits them."""
        check_task("tf_task, tf_knobs", self.task, self.knobs)
        if self.init is not None:
            from sandbox.train import SequenceTrainConfig

            try:
                SequenceTrainConfig(task=self.task, task_knobs=dict(self.knobs), init=self.init)
            except ValueError as exc:
                hint = "; give --tf-init a warm start of this task, or none (from scratch)"
                raise ValueError(f"tf_{exc}{hint}") from None


register_section("bandit", BanditSettings)
register_section("tf", TfSettings)

# -- the rungs ------------------------------------------------------------------------------------

#: A study's :class:`~.config.StudyConfig`, as the rungs' hooks take it (``config`` imports
#: this module to check a study's rungs, so the hooks name its type without importing it back).
StudyConfig = Any


@dataclass(frozen=True)
class StudyJob:
    """One run of the study: ``phase`` (``calib`` or ``study``), ``rung``, ``rule``, step size
    ``lr``, ``epochs`` (mu) and base ``seed`` (the paired seed of a rung without replicates; 0
    where one spec trains every paired seed)."""

    phase: str
    rung: str
    rule: str
    lr: float
    epochs: int
    seed: int

    @property
    def stem(self) -> str:
        """The readable start of the job's part name
        (``<phase>__<rung>__<rule>__lr=<lr>__epochs=<epochs>__s<seed>``, the names of the
        study's flags and table columns; the part adds the hash of its run spec:
        :func:`.plan.job_part`)."""
        lr, epochs = f"lr={self.lr!r}", f"epochs={self.epochs}"
        return part_stem(self.phase, self.rung, self.rule, lr, epochs, f"s{self.seed}")

    def group_key(self, varies: Sequence[str]) -> StudyJob:
        """What the jobs that may run as one group share: the job less its seed and, where its
        kind's batch ``varies`` in the step size (:attr:`~.runs.RunKind.batch_varies`), its
        ``lr`` (a calibration's step sizes as one ensemble). One rule's, one mu's."""
        return replace(self, seed=0, **({"lr": 0.0} if "lr" in varies else {}))


@dataclass(frozen=True)
class Rung:
    """A rung: a run kind (``kind``, default the rung's name) and its settings ``section``
    (default the rung's name; ``config.section(name)``: its ``seeds`` are the rung's paired
    seeds, its ``lrs`` the step-size grid, its ``steps`` the run length and its ``epochs``, where
    it has one that is not None, the μ grid, else the study's). What the kind is (deterministic
    or sampled, with replicates or one seed per spec, its columns, whether it logs step 0) is read
    from :attr:`traits`, never repeated here. At most five hooks:

    - ``spec(config, job, *, seeds, steps)``: the :class:`RunSpec` of a :class:`StudyJob` (its
      ``epochs`` is replaced by the job's);
    - ``members(config)``: on a kind without replicates, how many of one rule's runs one job
      runs through :func:`~.runs.run_specs` together (``llm``: one ensemble; default 1), each
      still its own part: paired seeds, or calibration step sizes where the kind's batch varies
      in ``lr`` (:meth:`StudyJob.group_key`);
    - ``written(spec)``: called where the run ran (a pool worker too), once its part is written
      and before a stop acts (``llm``: its scratch folder goes);
    - ``bounds(config)``: the ceiling and answer baseline of its pass metrics, for the headroom
      rule (:func:`~.claims.headroom`);
    - ``unit_seconds(config, group)``: a time budget's first guess for one job before any has
      run (None: 0)."""

    name: str
    spec: Callable[..., RunSpec]
    section: str = ""
    kind: str = ""
    #: The section's field holding the rung's run length (``bandit_exact``: ``exact_steps``).
    steps_field: str = "steps"
    members: Callable[[StudyConfig], int] | None = None
    written: Callable[[RunSpec], None] | None = None
    bounds: Callable[[StudyConfig], Bounds] | None = None
    unit_seconds: Callable[[StudyConfig, Sequence[StudyJob]], float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "section", self.section or self.name)
        object.__setattr__(self, "kind", self.kind or self.name)

    @property
    def traits(self) -> RunKind:
        """The rung's run kind with its traits (``ValueError`` naming an unregistered kind)."""
        return run_kind(self.kind)

    def lrs(self, config: StudyConfig) -> list[float]:
        """The step sizes calibration tries: the section's ``lrs`` (``--<section>-lrs``)."""
        return list(config.section(self.section).lrs)

    def steps(self, config: StudyConfig) -> int:
        """The run length: the section's :attr:`steps_field` (default ``steps``)."""
        return getattr(config.section(self.section), self.steps_field)

    def epochs(self, config: StudyConfig) -> list[int]:
        """The μ grid calibration tries: the section's ``epochs`` where it has one (not None),
        else the study's."""
        own = getattr(config.section(self.section), "epochs", None)
        return list(config.epochs if own is None else own)


RUNGS: dict[str, Rung] = {}


def register_rung(rung: Rung) -> Rung:
    """Add a rung to the study; its kind and settings section must be registered."""
    run_kind(rung.kind)  # the ValueError naming an unregistered kind
    section_settings(rung.section)  # ... and an unregistered section
    RUNGS[rung.name] = rung
    return rung


def unregister_rung(name: str) -> None:
    """Remove the rung ``name`` (a test's throwaway rung)."""
    if RUNGS.pop(name, None) is None:
        raise unknown("rung", name, RUNGS)


def probe_settings(config: StudyConfig, rule: str) -> dict[str, Any]:
    """The ``train`` settings of a sampled run on any rung, toy or llm: the study's aggregation
    (the paper's, else token-mean) and the mechanism probes, (a) the entropy-covariance law, (b)
    the gradient-mass shares and, for a rule with an expectation, (c) NSR's noise against its
    decay."""
    train = {"aggregation": None if config.paper_aggregation else "token-mean", "entropy_law": True}
    train["grad_mass"] = True
    if objective_of(rule).expectation() is not None:
        train["grad_noise"] = True
    return train


def _shared(config: StudyConfig, rule: str) -> dict[str, Any]:
    """A toy spec's settings every rung shares: :func:`probe_settings` and the study's dtype."""
    train = probe_settings(config, rule)
    if config.dtype is not None:
        train["dtype"] = config.dtype
    return {"minibatches": config.minibatches, "device": config.device, "train": train}


def _bandit(config: StudyConfig, job: StudyJob, *, seeds: int, steps: int) -> RunSpec:
    kind = RUNGS[job.rung].traits
    shared = _shared(config, job.rule)
    if kind.deterministic:  # the flow takes neither aggregation nor the probes' flags
        shared.pop("train")
    bandit = config.section("bandit")
    return RunSpec.make(
        kind.name,
        bandit.setting,
        job.rule,
        **shared,
        seed=job.seed,
        seeds=1 if kind.deterministic else seeds,
        steps=steps,
        group_size=config.group_size,
        optimizer="sgd",
        lr=job.lr,
        prompts_per_step=bandit.prompts_per_step,
    )


def _tiny_tf(config: StudyConfig, job: StudyJob, *, seeds: int, steps: int) -> RunSpec:
    tf, shared = config.section("tf"), _shared(config, job.rule)
    shared["train"].update(eval_prompts=tf.eval_prompts, eval_k=tf.eval_k)
    if tf.split:  # only when on: the specs of a study without it stay as they were
        shared["train"]["split"] = True
    if tf.init is not None:
        shared["train"]["init"] = tf.init
    return RunSpec.make(
        "tiny_tf",
        task_setting(tf.task, tf.knobs),
        job.rule,
        **shared,
        seed=job.seed,
        seeds=seeds,
        steps=steps,
        group_size=config.group_size,
        prompts_per_step=tf.prompts_per_step,
        lr=job.lr,
        definition={"task": tf.task, **tf.knobs},
    )


def _bandit_bounds(config: StudyConfig) -> Bounds:
    """The bandit's optimum (expected reward of the best arm per prompt) as the ceiling."""
    from envs import make_bandit_suite

    best = optimum(make_bandit_suite()[config.section("bandit").setting].make().unwrapped)
    return Bounds(best, note=f"optimum {best:.4f}")


def task_bounds(task: Any, answer_sets: Sequence[Sequence[str]]) -> Bounds:
    """Ceiling 1 and, as the floor, the constant-answer baseline of a task's held-out sets (one
    per paired seed; their mean) — never below the answer-prior one
    (:func:`envs.reasoning.answer_baselines`)."""
    from envs.reasoning import answer_baselines

    found = [answer_baselines(task, answers) for answers in answer_sets]
    constant = float(np.mean([b["constant"] for b in found]))
    prior = float(np.mean([b["prior"] for b in found]))
    answers = sorted({b["constant_answer"] for b in found})
    note = (
        f"constant answer {'/'.join(map(repr, answers))} {constant:.4f}; answer prior {prior:.4f}"
    )
    return Bounds(1.0, max(constant, prior), note=note)


def _tiny_tf_bounds(config: StudyConfig) -> Bounds:
    """:func:`task_bounds` of the held-out sets the tiny_tf replicates score (replicate s its
    own, every rule the same one)."""
    from envs.reasoning import make_task
    from sandbox.train.sequence import held_out_problems

    tf = config.section("tf")
    task, n = make_task(tf.task, **tf.knobs), tf.eval_prompts
    sets = [held_out_problems(task, 0, n, s, tf.split)[1] for s in range(tf.seeds)]
    return task_bounds(task, sets)


register_rung(
    Rung("bandit_exact", _bandit, "bandit", steps_field="exact_steps", bounds=_bandit_bounds)
)
register_rung(Rung("bandit_sampled", _bandit, "bandit", bounds=_bandit_bounds))
register_rung(Rung("tiny_tf", _tiny_tf, "tf", bounds=_tiny_tf_bounds))


def rung_rules(config: StudyConfig, rung: str) -> list[str]:
    """The rules a rung runs: every rule on a sampled kind; on an exact flow those it admits
    (:func:`~sandbox.experiments.runs.has_exact_flow`: not clip_cov, kl_cov)."""
    r = RUNGS[rung]
    if not r.traits.deterministic:
        return list(config.rules)
    lr, mu = r.lrs(config)[0], r.epochs(config)[0]

    def admitted(rule: str) -> bool:
        job = StudyJob("study", rung, rule, lr, mu, 0)
        return has_exact_flow(replace(r.spec(config, job, seeds=1, steps=1), epochs=mu))

    return [rule for rule in config.rules if admitted(rule)]


def evaluation_only(rows: pd.DataFrame) -> pd.Series:
    """Which of the study's ``rows`` only evaluate: step 0 of a kind that logs it before
    training (:attr:`RunKind.logs_step0`; so is an unregistered rung's)."""

    def logs_step0(rung: str) -> bool:
        return rung not in RUNGS or RUNGS[rung].traits.logs_step0

    return rows["rung"].map(logs_step0).astype(bool) & (rows["step"] == 0)


def members_per_job(config: StudyConfig, rung: str) -> int:
    """How many runs of one rule one job of ``rung`` runs, its paired seeds or its calibration's
    step sizes (:attr:`Rung.members`; 1 on a kind with replicates)."""
    r = RUNGS[rung]
    if r.traits.replicates or r.members is None:
        return 1
    size = r.members(config)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{rung}: members per job must be an integer >= 1, got {size!r}")
    return size


def study_bounds(config: StudyConfig) -> dict[str, Bounds]:
    """Each of the study's rungs with :attr:`Rung.bounds`: its pass metrics' bounds."""
    return {r: RUNGS[r].bounds(config) for r in config.rungs if RUNGS[r].bounds is not None}
