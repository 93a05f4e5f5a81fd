"""The claims study's settings and rungs. :class:`StudyConfig` holds the study's settings and one
typed settings section per rung family (one frozen dataclass, each field one flag); a
:class:`Rung` is a run kind (:mod:`sandbox.experiments.runs`) with its section and at most five
hooks. :data:`RUNGS` holds the toy rungs registered here, in ladder order (cheapest first);
``llm.claims`` adds the ``llm`` rung and its section with :func:`register_rung` and
:func:`register_section` (``sandbox`` never imports ``llm``). A :class:`StudyJob` is one run of
one rung; the rung maps it to a run spec, the planner (:mod:`.plan`) makes and groups them. A
study folder's record (``config.json``) is read and written here too."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sandbox.configs import arg, check_device, check_int, check_keys, check_number
from sandbox.experiments.compare import check_setting_names, check_task
from sandbox.experiments.results import part_stem, write_text
from sandbox.experiments.runs import (
    RunKind,
    RunSpec,
    has_exact_flow,
    objective_of,
    optimum,
    run_kind,
)
from sandbox.streams import RNG

from .claims import CLAIMS, Bounds, Claim, claim_from_record, claim_record, claim_rules

# -- the study's constants -------------------------------------------------------------------------

#: The reference rule every rung is calibrated with.
REFERENCE = "dapo"
#: A rule whose gap is a step-size effect (its bounds are 1e3 x narrower): the page names its
#: zeroed gradient mass apart from the hard clips'.
STEP_SIZE_RULE = "gspo"
#: The smallest effect of interest per metric (the power line and the "contradicted" margin):
#: 0.02 pass@1 (a gap a paper would report), 0.05 nats of entropy.
MARGINS = {"final_pass": 0.02, "reward_auc": 0.02, "final_entropy": 0.05}
#: A rung measures one axis where the rules' means correlate with the gradient mass they zero
#: beyond this |r| with 95% confidence (:func:`.analysis.one_axis`): it then ranks rules by how
#: much gradient they discard, i.e. by effective step size, whatever else they do.
ONE_AXIS = 0.8
#: Rules whose clip share stays below this are flagged: their bounds never bind.
NEVER_BINDS = 1e-3
#: Mechanism columns averaged per run (the loss's gradient-mass metrics, the objective's shares).
MECHANISM = (
    "clip_frac",
    "rescue_frac",
    "grad_mass_zero_lo",
    "grad_mass_zero_hi",
    "grad_mass_rescued",
)


# -- sections: each rung's typed settings, one way to set each -------------------------------------
# Typed per-rung settings: one frozen dataclass per *section*, one way to set each setting.
#
# A section holds the settings of one or more rungs (``bandit``: ``bandit_exact`` and
# ``bandit_sampled``; ``tf``: ``tiny_tf``; ``llm``: registered by ``llm.claims``), the paired
# ``seeds`` of its rungs among them. :class:`StudyConfig` holds one instance per section
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


# -- value checks, each naming its setting ---------------------------------------------------------


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


# -- the sandbox sections --------------------------------------------------------------------------


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

# -- the rungs -------------------------------------------------------------------------------------


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


# -- the study's settings and a folder's record ----------------------------------------------------


@dataclass
class StudyConfig:
    """Settings of the claims study; every field is a flag of ``python -m llm.claims``."""

    rules: list[str] = arg(
        [*claim_rules(), STEP_SIZE_RULE],
        "rules (default: every claim's); a claim whose two rules are not both given is left out "
        "of the ledger, and a note on stderr names it",
    )
    rungs: list[str] = dataclasses.field(
        default_factory=lambda: list(RUNGS),  # a rung joins the default study as it registers
        metadata={"help": "rungs, cheapest first (a rung joins the default as it registers)"},
    )
    epochs: list[int] = arg(
        [2], "mu grid: epochs (x minibatches) calibration tries on the bandit and llm rungs"
    )
    minibatches: int = arg(2, "optimizer steps per epoch (all rungs)")
    group_size: int = arg(8, "G on the toy rungs")
    paper_aggregation: bool = arg(False, "each rule's own aggregation (default: token-mean)")
    target_low: float = arg(0.05, "calibration: lowest clip share of dapo")
    target_high: float = arg(0.10, "calibration: highest clip share of dapo")
    calib_seeds: int = arg(4, "calibration seeds per step size")
    calib_steps: int = arg(
        0,
        "calibration steps (0: the rung's own run length; the clip share falls as the policy "
        "sharpens, so a shorter window overstates it)",
    )
    control_seeds: int = arg(
        0,
        "step-size control (0: off): on this many paired seeds disjoint from the study's, every "
        "rule of a sampled toy rung runs at each step size of the rung's grid (at its calibrated "
        "mu); the one with the highest mean final_pass is the rule's own, and each rule then "
        "runs there on the study's seeds (ledger_control.csv)",
    )
    sections: dict[str, Any] = arg(
        {},
        "each rung's typed settings by section (sandbox.study.rungs: bandit, tf; llm from "
        "llm.claims), given as settings or mappings; a section not given has its defaults",
    )
    rng: str | None = arg(
        RNG,
        "the toy trainers' random-number scheme (sandbox.streams.RNG; recorded, not a flag): a "
        "study recorded with another, or None (made before it was recorded), does not run; "
        "--tables-only rebuilds its tables as they were made",
    )
    device: str = arg("cpu", "cpu | cuda")
    claims: list[dict[str, Any]] = arg(
        [], "claims of your own besides the papers' (records of sandbox.study.claims.Claim)"
    )
    dtype: str | None = arg(
        None,
        "float64: the sampled toy rungs in double precision (default: the trainers' float32)",
        choices=("float32", "float64"),
    )

    def __post_init__(self) -> None:
        self.epochs = mu_grid("epochs", self.epochs)
        if not isinstance(self.sections, Mapping):
            raise ValueError(f"sections must be a mapping of sections, got {self.sections!r}")
        for name in self.sections:
            if name not in SECTIONS:
                raise unknown("section", name, SECTIONS)
        given = dict(self.sections)
        self.sections = {name: section_settings(name, given.get(name)) for name in SECTIONS}
        if not isinstance(self.claims, list):
            raise ValueError(f"claims must be a list of claim records, got {self.claims!r}")
        self.claims = [claim_record(claim_from_record(c)) for c in self.claims]

    def validate(self) -> None:
        """``ValueError`` naming the first bad field, before anything runs or ``config.json`` is
        written."""
        self.check_claims()  # first: a claim's unknown rule is named with its claim
        if self.rng != RNG:
            raise ValueError(
                f"rng: this code trains with the random-number scheme {RNG!r}, got {self.rng!r} "
                "(a record of an earlier run: --tables-only rebuilds its tables)"
            )
        for name in self.rules:
            objective_of(name)  # ValueError listing the valid names
        if REFERENCE not in self.rules:
            raise ValueError(f"rules must include the reference rule {REFERENCE!r}")
        for rung in self.rungs:
            if rung not in RUNGS:
                raise unknown("rung", rung, RUNGS)
            members_per_job(self, rung)  # ValueError naming the rung's setting
        # the int fields (>= 1; group_size 2: group-relative advantages) and dtype's choices
        check_fields(self, low={"group_size": 2, "calib_steps": 0, "control_seeds": 0})
        check_number("target_low", self.target_low, above=None)
        check_number("target_high", self.target_high, above=None)
        if not 0 <= self.target_low < self.target_high <= 1:
            raise ValueError(
                f"target_low, target_high must satisfy 0 <= low < high <= 1, got "
                f"{self.target_low}, {self.target_high}"
            )
        grids = [e for rung in self.rungs for e in RUNGS[rung].epochs(self)]
        if min(self.epochs + grids) * self.minibatches < 2:
            raise ValueError("epochs x minibatches must be >= 2: on-policy no rule clips")
        check_device(self.device)
        for name in dict.fromkeys(RUNGS[rung].section for rung in self.rungs):
            check = getattr(self.sections[name], "check", None)
            if check is not None:
                check()  # ValueError naming the section's setting

    def record(self) -> dict[str, Any]:
        """The settings as a folder records them (``config.json``): every field, and the sections
        of the study's rungs only (another section's defaults are no setting this study used)."""
        values = asdict(self)
        used = {RUNGS[r].section for r in self.rungs if r in RUNGS}
        values["sections"] = {k: v for k, v in values["sections"].items() if k in used}
        return values

    def section(self, name: str) -> Any:
        """The settings of section ``name`` (above), e.g. ``config.section("tf")``."""
        if name not in self.sections:
            raise unknown("section", name, SECTIONS)
        return self.sections[name]

    def seeds(self, rung: str) -> int:
        """The paired seeds of ``rung``: its section's ``seeds``."""
        return self.section(RUNGS[rung].section).seeds

    def check_claims(self) -> None:
        """``ValueError`` for an own claim whose rule is unknown or not in ``rules``, or a claim
        name used twice (the papers' included)."""
        for claim in map(claim_from_record, self.claims):
            for rule in claim.rules:
                try:
                    objective_of(rule)
                except ValueError as exc:
                    raise ValueError(f"claim {claim.name}: {exc}") from None
                if rule not in self.rules:
                    raise ValueError(f"claim {claim.name}: rule {rule!r} is not in rules")
        names = [c.name for c in study_claims(self)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"claims: the name(s) {twice} are used twice (the papers' included)")


def study_claims(config: StudyConfig | None) -> tuple[Claim, ...]:
    """The claims a study's ledger tests: the papers' (:data:`.claims.CLAIMS`) and its own
    (``--claim``, ``--claims FILE``)."""
    return CLAIMS if config is None else (*CLAIMS, *map(claim_from_record, config.claims))


#: The key of a study folder's ``config.json`` that records each rung's calibrated point.
CALIBRATED = "calibrated"


def read_record(out: str | Path) -> tuple[StudyConfig, dict[str, tuple[float, int]] | None]:
    """A study folder's ``config.json``: its settings and, once calibrated, each rung's
    calibrated (step size, epochs); ``rng`` None where the record has none (made before)."""
    path = Path(out) / "config.json"
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable study record ({exc})") from None
    point = values.pop(CALIBRATED, None)
    values.setdefault("rng", None)
    try:
        config = StudyConfig(**values)
    except TypeError as exc:
        raise ValueError(f"{path}: not a study record of this version ({exc})") from None
    calibrated = None if point is None else {r: (float(v[0]), int(v[1])) for r, v in point.items()}
    return config, calibrated


def record_calibration(out: Path, config: StudyConfig, point: Mapping[str, tuple[float, int]]):
    """Write ``config.json`` with the calibrated point of every rung."""
    record = {**config.record(), CALIBRATED: {r: [lr, epochs] for r, (lr, epochs) in point.items()}}
    write_text(json.dumps(record, indent=2, default=str), Path(out) / "config.json")


def joined_claims(
    recorded: Sequence[Mapping[str, Any]], given: Sequence[Mapping[str, Any]], out: str | Path
) -> list[dict[str, Any]]:
    """The claims a study folder ``out`` records, then those given now that it does not. A given
    claim of a recorded name that says something else is a ``ValueError``: a folder's claim is
    never replaced (its ledger rows would change meaning under the same name), on a run as on
    ``--tables-only``."""
    claims = {c["name"]: dict(c) for c in recorded}
    for c in given:
        if claims.setdefault(c["name"], dict(c)) != c:
            raise ValueError(
                f"claim {c['name']}: {out} records another claim of that name; rename it, or use "
                "another --out"
            )
    return list(claims.values())


def with_folder(config: StudyConfig, out: str | Path, force: bool = False) -> StudyConfig:
    """``config`` grown by what the study folder ``out`` already holds (unless ``force`` or a new
    folder): the union of its rules, rungs and own claims with the folder's, the folder's first,
    so a run of fewer or other rules adds to the folder's tables. A claim of a recorded name
    that says something else is refused (:func:`joined_claims`)."""
    path = Path(out) / "config.json"
    if force or not path.is_file() or not any((Path(out) / "parts").glob("*.parquet")):
        return config
    try:
        previous, _ = read_record(out)
    except ValueError:
        return config  # an unreadable record: this study alone (its record replaces it)
    rules = list(dict.fromkeys([*previous.rules, *config.rules]))
    rungs = list(dict.fromkeys([*previous.rungs, *config.rungs]))
    claims = joined_claims(previous.claims, config.claims, out)
    rules += [r for c in claims for r in (c["rule_a"], c["rule_b"]) if r not in rules]
    grown = replace(config, rules=rules, rungs=rungs, claims=claims)
    if (rules, rungs) != (config.rules, config.rungs):
        print(
            f"{out} holds a study of {len(previous.rules)} rules on {', '.join(previous.rungs)}: "
            f"this run adds to it (tables over {len(rules)} rules on {', '.join(rungs)}; a new "
            "--out for a study of its own)",
            file=sys.stderr,
            flush=True,
        )
    return grown


def rules_note(config: StudyConfig) -> str | None:
    """The line that names the claims the study's rules leave out (the ledger tests a claim
    only where both its rules run) and the rules they need; None when every claim is in."""
    claims = study_claims(config)
    left = [c for c in claims if not set(c.rules) <= set(config.rules)]
    if not left:
        return None
    names = ", ".join(c.name for c in left)
    needed = ", ".join(dict.fromkeys(r for c in left for r in c.rules if r not in config.rules))
    if len(left) < len(claims):
        return (
            f"note: --rules leaves out the claims {names} (they need the rules {needed}); the "
            f"ledger tests the other {len(claims) - len(left)}"
        )
    return (
        f"note: --rules leaves out every claim ({names}: they need the rules {needed}); the "
        "ledger will be empty (--claim NAME:A>B tests a claim of your own)"
    )


# -- the toy rungs ---------------------------------------------------------------------------------


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
    lr, epochs = r.lrs(config)[0], r.epochs(config)[0]

    def admitted(rule: str) -> bool:
        job = StudyJob("study", rung, rule, lr, epochs, 0)
        return has_exact_flow(replace(r.spec(config, job, seeds=1, steps=1), epochs=epochs))

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
