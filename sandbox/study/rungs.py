"""The study's rungs and its unit of work. A :class:`Rung` is a run kind
(:mod:`sandbox.experiments.runs`) with the study's settings for it; :data:`RUNGS` holds the toy
rungs registered here, in ladder order (cheapest first); ``llm.claims`` adds the ``llm`` rung with
:func:`register_rung` (``sandbox`` never imports ``llm``). A :class:`StudyJob` is one run of one
rung; the rung maps it to a run spec, the planner (:mod:`.plan`) makes and groups them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

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
from .settings import section_settings, task_setting, unknown

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
    - ``written(spec)``: called once a run's part is written (``llm``: its scratch folder goes);
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
