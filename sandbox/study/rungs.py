"""The study's rungs: a :class:`Rung` is a run kind (:mod:`sandbox.experiments.runs`) with the
study's settings for it (its spec, step-size and mu grids, run length, paired seeds, bounds).
:data:`RUNGS` holds the toy rungs registered here, in ladder order (cheapest first); the ``llm``
rung is added by ``llm.claims`` (``sandbox`` never imports ``llm``) with :func:`register_rung`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sandbox.experiments.runs import (
    RunKind,
    RunSpec,
    has_exact_flow,
    objective_of,
    optimum,
    run_kind,
)
from sandbox.streams import HELD_OUT

from .claims import Bounds
from .jobs import StudyJob
from .settings import knob_text, section_settings

if TYPE_CHECKING:
    from .config import StudyConfig


@dataclass(frozen=True)
class Rung:
    """A rung: a run kind (``kind``, default the rung's name) with its spec for a job
    (:class:`~.jobs.StudyJob`: rule, step size, mu, base seed; ``spec(config, job, seeds=...,
    steps=...)``) and its typed settings (``section``, default the rung's name: a registered
    section of :mod:`.settings`, ``config.section(name)``; its ``seeds`` are the rung's paired
    seeds). Its step-size ``grid`` and run length ``steps`` default to the section's ``lrs`` and
    ``steps``; ``epochs`` is its mu grid (the epochs calibration tries with each step size; the
    spec's ``epochs`` is replaced by the job's; default the study's). What the kind is
    (deterministic or sampled, whether one spec trains all paired seeds, which columns are the
    study's ``pass_rate`` and ``train_reward``, whether it logs step 0) is read from the kind's
    traits (:attr:`traits`, :func:`~sandbox.experiments.runs.run_kind`), never repeated here.

    A rung whose kind has no replicates runs one spec per paired seed; ``members(config)``
    (default 1) bounds how many of one rule's seeds (at one step size and mu) run as one job:
    their specs go to :func:`~.runs.run_specs` together, so a batched kind trains them as one
    program (``llm``: one ensemble), and each seed is still written as its own part
    (:func:`job_groups`). ``check(config)``: a ``ValueError`` naming a bad setting of the rung
    beyond its section's own checks (:meth:`StudyConfig.validate`, before anything runs).
    ``written(spec)``: called once a run's part is written (``llm``: its resumable scratch
    folder, kept until then, goes). ``bounds(config)``: the ceiling and the answer baseline of
    the rung's pass metrics (:class:`~.claims.Bounds`), for the headroom rule
    (:func:`~.claims.headroom`)."""

    name: str
    spec: Callable[..., RunSpec]  # (config, job, *, seeds, steps)
    section: str = ""  # its settings section (default: the rung's name)
    kind: str = ""  # its run kind (default: the rung's name)
    grid: Callable[[StudyConfig], list[float]] | None = None  # default: the section's lrs
    steps: Callable[[StudyConfig], int] | None = None  # default: the section's steps
    epochs: Callable[[StudyConfig], list[int]] = lambda c: c.epochs
    members: Callable[[StudyConfig], int] | None = None  # seeds per job (default 1)
    check: Callable[[StudyConfig], None] | None = None  # ValueError naming a bad setting
    written: Callable[[RunSpec], None] | None = None  # after a run's part is written
    bounds: Callable[[StudyConfig], Bounds] | None = None  # ceiling and answer baseline
    # seconds one job of these jobs (one group) is expected to take before any has run (a time
    # budget's first guess, :func:`~.plan.run_study`); None: 0, the first job of a kind starts
    unit_seconds: Callable[[StudyConfig, Sequence[StudyJob]], float] | None = None

    def __post_init__(self) -> None:
        section = self.section or self.name
        defaults = {
            "section": section,
            "kind": self.kind or self.name,
            "grid": self.grid or (lambda c: c.section(section).lrs),
            "steps": self.steps or (lambda c: c.section(section).steps),
        }
        for key, value in defaults.items():
            object.__setattr__(self, key, value)

    @property
    def traits(self) -> RunKind:
        """The rung's run kind with its traits (``ValueError`` naming an unregistered kind)."""
        return run_kind(self.kind)


RUNGS: dict[str, Rung] = {}


def register_rung(rung: Rung) -> Rung:
    """Add a rung to the study (``llm.claims`` adds ``llm``); its kind and its settings section
    must be registered."""
    run_kind(rung.kind)  # the ValueError naming an unregistered kind
    section_settings(rung.section)  # ... and an unregistered section
    RUNGS[rung.name] = rung
    return rung


def unregister_rung(name: str) -> None:
    """Remove the rung ``name`` (a test's throwaway rung); ``ValueError`` if unknown."""
    if name not in RUNGS:
        raise ValueError(f"rungs: unknown rung {name!r}; rungs: {', '.join(RUNGS)}")
    del RUNGS[name]


def _shared(config: StudyConfig, rule: str) -> dict[str, Any]:
    aggregation = None if config.paper_aggregation else "token-mean"
    train = {"aggregation": aggregation, "grad_mass": True}
    if config.dtype is not None:
        train["dtype"] = config.dtype
    if objective_of(rule).expectation() is not None:  # mechanism check (c): NSR vs its decay
        train["grad_noise"] = True
    return {
        "minibatches": config.minibatches,
        "device": config.device,
        "train": train,
    }


def _bandit(kind: str) -> Callable[..., RunSpec]:
    def spec(config: StudyConfig, job: StudyJob, *, seeds: int, steps: int) -> RunSpec:
        exact = run_kind(kind).deterministic
        shared = _shared(config, job.rule)
        if exact:  # the flow takes neither aggregation nor gradient-mass flags
            shared.pop("train")
        else:
            shared["train"]["entropy_law"] = True
        bandit = config.section("bandit")
        return RunSpec.make(
            kind,
            bandit.setting,
            job.rule,
            **shared,
            seed=job.seed,
            seeds=1 if exact else seeds,
            steps=steps,
            group_size=config.group_size,
            optimizer="sgd",
            lr=job.lr,
            prompts_per_step=bandit.prompts_per_step,
        )

    return spec


def _tiny_tf(config: StudyConfig, job: StudyJob, *, seeds: int, steps: int) -> RunSpec:
    tf, shared = config.section("tf"), _shared(config, job.rule)
    shared["train"].update(eval_prompts=tf.eval_prompts, eval_k=tf.eval_k, entropy_law=True)
    knobs = "-".join(f"{k}{knob_text(v)}" for k, v in sorted(tf.knobs.items()))
    return RunSpec.make(
        "tiny_tf",
        f"{tf.task}-{knobs}",
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
    """The answer baselines of the held-out sets the tiny_tf replicates score (base seed 0,
    replicate s scores its own set, every rule the same one): their mean over the replicates."""
    from envs.reasoning import make_task
    from sandbox.train.sequence import held_out_problems

    tf = config.section("tf")
    task, n = make_task(tf.task, **tf.knobs), tf.eval_prompts
    if config.rng is None:  # a run made before per-replicate sets: all scored base seed 0's one
        return task_bounds(task, [task.sample_batch(np.random.default_rng([0, HELD_OUT]), n)[1]])
    return task_bounds(task, [held_out_problems(task, 0, n, s)[1] for s in range(tf.seeds)])


register_rung(Rung("bandit_exact", _bandit("bandit_exact"), "bandit", bounds=_bandit_bounds))
register_rung(Rung("bandit_sampled", _bandit("bandit_sampled"), "bandit", bounds=_bandit_bounds))
register_rung(
    Rung(
        "tiny_tf",
        _tiny_tf,
        "tf",
        epochs=lambda c: c.section("tf").epochs,
        bounds=_tiny_tf_bounds,
    )
)


def rung_rules(config: StudyConfig, rung: str) -> list[str]:
    """The rules a rung runs: on a deterministic kind (an exact flow) only those whose spec it
    admits (:func:`~sandbox.experiments.runs.has_exact_flow`: not clip_cov, kl_cov, whose batch
    ranking has no closed-form expectation); every rule on a sampled one."""
    r = RUNGS[rung]
    if not r.traits.deterministic:
        return list(config.rules)
    lr, mu = r.grid(config)[0], r.epochs(config)[0]

    def admitted(rule: str) -> bool:
        job = StudyJob("study", rung, rule, lr, mu, 0)
        return has_exact_flow(replace(r.spec(config, job, seeds=1, steps=1), epochs=mu))

    return [rule for rule in config.rules if admitted(rule)]


def evaluation_only(rows: pd.DataFrame) -> pd.Series:
    """Which of the study's ``rows`` only evaluate: the step-0 row of a rung whose kind logs
    its evaluation before training (:attr:`RunKind.logs_step0`; a rung not registered here is
    read the same way: a step 0 never follows an update)."""

    def logs_step0(rung: str) -> bool:
        return rung not in RUNGS or RUNGS[rung].traits.logs_step0

    return rows["rung"].map(logs_step0).astype(bool) & (rows["step"] == 0)


def members_per_job(config: StudyConfig, rung: str) -> int:
    """How many paired seeds of one rule one job of ``rung`` runs (:attr:`Rung.members`; 1 for a
    rung with replicates, whose one spec trains every seed)."""
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
