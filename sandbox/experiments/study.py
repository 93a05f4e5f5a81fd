"""The claims study on the toy rungs: calibrate each rung, run every claim rule paired by seed,
and test the claims (:mod:`.claims`) with paired intervals (:mod:`.evidence`).

Two phases, both run specs (:mod:`.runs`) through the one planner (:class:`.planner.RunFolder`:
resumable parts, progress bar, the refusal of a folder made with other settings):

1. **Calibration** (parts ``calib__<rung>__lr=<lr>``): the reference rule ``dapo`` on a short grid
   of step sizes, ``calib_seeds`` seeds, ``calib_steps`` steps (default: the rung's run length). Its clip share (``clip_low_frac +
   clip_high_frac``, the objective's own Z_lo/Z_hi token shares, averaged over steps and seeds)
   against the step size is the curve; :func:`pick_step_size` takes the grid point inside the
   target band (default 5-10%) closest to its middle, else the one closest to the band.
2. **Study** (parts ``study__<rung>__<rule>__lr=<lr>``): every rule at the rung's calibrated step
   size, ``seeds`` paired seeds. The same aggregation for every rule (``token-mean``; the papers'
   own with ``paper_aggregation``).

Pairing: a seed fixes the prompts, the held-out set and the initial model for every rule on a rung.
On the toy rungs the ``seeds`` paired seeds are the replicates of one vectorised run (replicate
``s`` of every rule starts from the same weights and sees the same prompt stream and the same first
rollout: ``tests/test_experiments_study.py`` checks it; every later rollout comes from the same
fixed noise, :mod:`sandbox.streams`, so pairs stay paired while the policies agree; on tiny_tf
replicate ``s`` of every rule scores the same held-out set, each replicate its own, and a study
records the scheme as ``rng``); the exact flow is deterministic (one
"seed"); a rung whose kind trains one seed per run (``llm``) runs one spec per seed, and one
job runs up to :attr:`Rung.members` of one rule's seeds (``llm``: as one ensemble), each seed
still its own part (``study__<rung>__<rule>__lr=<lr>__s<seed>``), so parts made either way are
interchangeable and a resumed study reruns no finished seed.

Per run (rung, rule, seed) the scores are the metrics of :mod:`.claims`: ``final_pass`` (bandits:
the exact expected reward of the last logged policy; ``tiny_tf``: held-out pass@1 of the final
model on ``tf_eval_prompts`` problems fixed by the seed, ``tf_eval_k`` samples each), ``reward_auc``
(mean per-step training reward), ``final_entropy``; and the mechanism columns: ``clip_frac``,
``rescue_frac`` and the advantage-weighted gradient mass shares (:func:`sandbox.loss.grad_mass_shares`:
``grad_mass_zero_lo``, ``grad_mass_zero_hi``, ``grad_mass_rescued``), averaged over steps.
Per step, on ``bandit_sampled`` and ``tiny_tf`` (``entropy_law=True``), the observed entropy change
and the entropy-covariance law's prediction (``entropy_change``, ``entropy_change_pred``; on
``tiny_tf`` over the visited prefixes of the step's rollout), tabulated by :func:`entropy_law`.

Rules with a deterministic counterpart (:meth:`sandbox.objectives.Objective.expectation`: NSR ->
NSR-decay) also log mechanism check (c) on the toy trainers' rungs (:mod:`sandbox.grad_noise`:
``grad_rescue_var``, ``grad_sampling_var``, ``grad_signal``), tabled by :func:`gradient_noise`.

The ``llm`` rung is added by ``llm.claims`` (``sandbox`` never imports ``llm``) with
:func:`register_rung`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sandbox.configs import arg, check_device, check_int
from sandbox.grad_noise import GRAD_NOISE_COLUMNS
from sandbox.streams import HELD_OUT, RNG
from sandbox.study.transfer import write_transfer

from . import evidence
from .claims import (
    CLAIMS,
    Bounds,
    Claim,
    claim_from_record,
    claim_record,
    claim_rules,
    headroom,
    holm_by_rung,
    ledger,
    power_lines,
)
from .planner import Job, RunFolder
from .results import (
    changed_settings,
    part_name,
    read_parts,
    recording_tables,
    sorted_rows,
    write_csv,
    write_figure,
    write_parquet_if_changed,
)
from .runs import RunSpec, objective_of, optimum, run_specs, setting_model

#: The reference rule every rung is calibrated with.
REFERENCE = "dapo"
#: A rule whose gap is a step-size effect (its bounds are 1e3 x narrower): rank agreement is
#: reported with and without it.
STEP_SIZE_RULE = "gspo"
#: The smallest effect of interest per metric (the power line and the "contradicted" margin):
#: 0.02 pass@1 (a gap a paper would report), 0.05 nats of entropy.
MARGINS = {"final_pass": 0.02, "reward_auc": 0.02, "final_entropy": 0.05}
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
ROW_COLUMNS = (
    "pass_rate",
    "train_reward",
    "eval_pass",
    "entropy",
    "clip_low_frac",
    "clip_high_frac",
    "rescue_frac",
    "grad_mass_zero_lo",
    "grad_mass_zero_hi",
    "grad_mass_rescued",
    "entropy_change",
    "entropy_change_pred",
    *GRAD_NOISE_COLUMNS,
)


@dataclass
class StudyConfig:
    """Settings of the claims study; every field is a flag of ``python -m llm.claims``."""

    rules: list[str] = arg([*claim_rules(), STEP_SIZE_RULE], "rules (default: every claim's)")
    rungs: list[str] = arg(["bandit_exact", "bandit_sampled", "tiny_tf"], "rungs, cheapest first")
    seeds: int = arg(16, "paired seeds per rule (exact flow: 1)")
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
    bandit_setting: str = arg("mixed", "envs.make_bandit_suite name")
    bandit_steps: int = arg(60, "bandit steps")
    bandit_prompts_per_step: int = arg(4, "groups per bandit step")
    bandit_lrs: list[float] = arg(
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], "bandit step-size grid (SGD)"
    )
    tf_task: str = arg("mod_arith", "tiny_tf task (envs.reasoning)")
    tf_knobs: dict[str, Any] = arg({"steps": 2}, "tiny_tf task knobs")
    tf_steps: int = arg(40, "tiny_tf steps")
    tf_prompts_per_step: int = arg(4, "tiny_tf prompts per step")
    tf_lrs: list[float] = arg([3e-4, 1e-3, 3e-3, 1e-2], "tiny_tf step-size grid (Adam)")
    tf_epochs: list[int] = arg(
        [4, 8],
        "mu grid on tiny_tf: epochs (x minibatches); 2 x 2 left dapo's clip share below 4%% at "
        "every step size tried, 4 x 2 below 5%%, so this rung calibrates over more passes",
    )
    tf_eval_prompts: int = arg(512, "tiny_tf held-out problems (fixed by the seed)")
    tf_eval_k: int = arg(2, "tiny_tf samples per held-out problem")
    extra: dict[str, Any] = arg({}, "settings of rungs registered elsewhere (llm.claims)")
    rng: str | None = arg(
        RNG,
        "the toy trainers' random-number scheme (sandbox.streams.RNG; recorded, not a flag): a "
        "folder recorded with another, or None (made before it was recorded), is refused; "
        "--tables-only rebuilds its tables as they were made",
    )
    device: str = arg("cpu", "cpu | cuda")
    claims: list[dict[str, Any]] = arg(
        [], "claims of your own besides the papers' (records of sandbox.experiments.claims.Claim)"
    )
    dtype: str | None = arg(
        None,
        "float64: the sampled toy rungs in double precision (default: the trainers' float32)",
        choices=("float32", "float64"),
    )

    def __post_init__(self) -> None:
        for name in ("bandit_lrs", "tf_lrs"):  # the CLI gives strings
            try:
                values = [float(v) for v in getattr(self, name)]
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be numbers, got {getattr(self, name)!r}") from None
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"{name} must be finite numbers > 0, got {values}")
            setattr(self, name, values)
        for name in (
            "epochs",
            "tf_epochs",
        ):  # a grid; one int (an old config.json) is a grid of one
            value = getattr(self, name)
            values = [value] if isinstance(value, int | str) else list(value)
            try:
                ints = [int(v) for v in values]
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be integers, got {value!r}") from None
            if not ints or ints != [float(v) for v in values] or min(ints) < 1:
                raise ValueError(f"{name} must be integers >= 1, got {value!r}")
            setattr(self, name, ints)
        if not isinstance(self.claims, list):
            raise ValueError(f"claims must be a list of claim records, got {self.claims!r}")
        self.claims = [claim_record(claim_from_record(c)) for c in self.claims]

    def validate(self) -> None:
        """``ValueError`` naming the first bad field: every setting is checked here, before
        anything runs or a folder's ``config.json`` is written."""
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
                raise ValueError(f"rungs: unknown rung {rung!r}; rungs: {', '.join(RUNGS)}")
            members_per_job(self, rung)  # ValueError naming the rung's setting
        for name in (
            "seeds",
            "minibatches",
            "calib_seeds",
            "bandit_steps",
            "bandit_prompts_per_step",
            "tf_steps",
            "tf_prompts_per_step",
            "tf_eval_prompts",
            "tf_eval_k",
        ):
            check_int(name, getattr(self, name))
        check_int("group_size", self.group_size, 2)  # group-relative advantages
        check_int("calib_steps", self.calib_steps, 0)
        for name in ("target_low", "target_high"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not 0 <= self.target_low < self.target_high <= 1:
            raise ValueError(
                f"target_low, target_high must satisfy 0 <= low < high <= 1, got "
                f"{self.target_low}, {self.target_high}"
            )
        if self.dtype not in (None, "float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if min(self.epochs + self.tf_epochs) * self.minibatches < 2:
            raise ValueError("epochs x minibatches must be >= 2: on-policy no rule clips")
        self._check_tasks()
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a mapping of rung settings, got {self.extra!r}")
        check_device(self.device)
        for rung in self.rungs:
            if RUNGS[rung].check is not None:
                RUNGS[rung].check(self)  # ValueError naming the rung's setting

    def _check_tasks(self) -> None:
        from envs import make_bandit_suite
        from envs.reasoning import make_task

        suite = make_bandit_suite()
        if self.bandit_setting not in suite:
            raise ValueError(
                f"bandit_setting: unknown setting {self.bandit_setting!r}; settings: "
                f"{', '.join(suite)}"
            )
        if not isinstance(self.tf_knobs, dict):
            raise ValueError(f"tf_knobs must be key=value pairs, got {self.tf_knobs!r}")
        try:
            make_task(self.tf_task, **self.tf_knobs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tf_task, tf_knobs: {exc}") from None

    def check_claims(self) -> None:
        """``ValueError`` for an own claim whose rule is unknown or not in ``rules``, or a claim
        name used twice (the papers' included)."""
        for claim in own_claims(self):
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

    def fields_of_parts(self) -> dict[str, Any]:
        """What every part depends on besides its name (rung, rule, step size, base seed): a
        folder's parts are reused only while these are unchanged (:func:`part_fields`; ``rng``
        among them)."""
        return part_fields(asdict(self))


def own_claims(config: StudyConfig) -> list[Claim]:
    """The claims given with ``--claim`` / ``--claims FILE`` (recorded in ``config.json``)."""
    return [claim_from_record(c) for c in config.claims]


def study_claims(config: StudyConfig | None) -> tuple[Claim, ...]:
    """The claims a study's ledger tests: the papers' (:data:`.claims.CLAIMS`) and its own."""
    return CLAIMS if config is None else (*CLAIMS, *own_claims(config))


def part_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a study (a :class:`StudyConfig` as a dict, or a folder's recorded
    ``config.json``) that its parts depend on. Not among them: the rules, rungs and claims (a
    folder's study grows by them: :func:`with_folder`), the calibrated point (recorded after
    calibration) and a rung's execution settings (:attr:`Rung.execution`, e.g. the llm rung's
    ``ensemble``: parts made with any value are interchangeable). The step-size and mu grids are
    among them: another grid calibrates to another point, and a folder holding study runs at two
    points would mix them."""
    skip = ("rules", "rungs", "claims", CALIBRATED)
    out = {k: v for k, v in values.items() if k not in skip}
    if isinstance(out.get("extra"), Mapping):
        extra = {}
        for rung, settings in out["extra"].items():
            execution = RUNGS[rung].execution if rung in RUNGS else ()
            if isinstance(settings, Mapping):
                settings = {k: v for k, v in settings.items() if k not in execution}
            if settings != {}:
                extra[rung] = settings
        out["extra"] = extra
    return out


@dataclass(frozen=True)
class Rung:
    """A rung: its run kind's spec for (rule, step size, seeds, steps, base seed), its step-size
    grid, its training length, whether one spec trains all paired seeds (``replicates``), which
    of the kind's columns are the study's ``pass_rate`` and ``train_reward``, and its mu grid
    (``epochs``: the epochs calibration tries with each step size; the spec's ``epochs`` is
    replaced by the job's).

    A rung without replicates runs one spec per paired seed; ``members(config)`` (default 1)
    bounds how many of one rule's seeds (at one step size and mu) run as one job: their specs go
    to :func:`~.runs.run_specs` together, so a batched kind trains them as one program (``llm``:
    one ensemble), and each seed is still written as its own part (:func:`job_groups`).
    ``execution``: the keys of ``config.extra[name]`` that choose how the runs execute, not what
    they compute (left out of :func:`part_fields`). ``check(config)``: a ``ValueError`` naming
    a bad setting of the rung (:meth:`StudyConfig.validate`, before anything runs).
    ``written(spec)``: called once a run's part is written (``llm``: its resumable scratch
    folder, kept until then, goes). ``bounds(config)``: the ceiling and the answer baseline of
    the rung's pass metrics (:class:`~.claims.Bounds`), for the headroom rule
    (:func:`~.claims.headroom`)."""

    name: str
    spec: Callable[[StudyConfig, str, float, int, int, int], RunSpec]
    grid: Callable[[StudyConfig], list[float]]
    steps: Callable[[StudyConfig], int]
    replicates: bool = True
    deterministic: bool = False
    seeds: Callable[[StudyConfig], int] | None = None  # paired seeds (default: config.seeds)
    columns: tuple[tuple[str, str], ...] = (("pass_rate", "pass_rate"), ("train_reward", "reward"))
    epochs: Callable[[StudyConfig], list[int]] = lambda c: c.epochs
    members: Callable[[StudyConfig], int] | None = None  # seeds per job (default 1)
    execution: tuple[str, ...] = ()
    check: Callable[[StudyConfig], None] | None = None  # ValueError naming a bad setting
    written: Callable[[RunSpec], None] | None = None  # after a run's part is written
    bounds: Callable[[StudyConfig], Bounds] | None = None  # ceiling and answer baseline


RUNGS: dict[str, Rung] = {}


def register_rung(rung: Rung) -> Rung:
    """Add a rung to the study (``llm.claims`` adds ``llm``)."""
    RUNGS[rung.name] = rung
    return rung


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
    def spec(config: StudyConfig, rule: str, lr: float, seeds: int, steps: int, seed: int):
        exact = kind == "bandit_exact"
        shared = _shared(config, rule)
        if exact:  # the flow takes neither aggregation nor gradient-mass flags
            shared.pop("train")
        else:
            shared["train"]["entropy_law"] = True
        return RunSpec.make(
            kind,
            config.bandit_setting,
            rule,
            **shared,
            seed=seed,
            seeds=1 if exact else seeds,
            steps=steps,
            group_size=config.group_size,
            optimizer="sgd",
            lr=lr,
            prompts_per_step=config.bandit_prompts_per_step,
        )

    return spec


def _tiny_tf(config: StudyConfig, rule: str, lr: float, seeds: int, steps: int, seed: int):
    shared = _shared(config, rule)
    shared["train"].update(
        eval_prompts=config.tf_eval_prompts, eval_k=config.tf_eval_k, entropy_law=True
    )
    knobs = "-".join(f"{k}{v}" for k, v in sorted(config.tf_knobs.items()))
    return RunSpec.make(
        "tiny_tf",
        f"{config.tf_task}-{knobs}",
        rule,
        **shared,
        seed=seed,
        seeds=seeds,
        steps=steps,
        group_size=config.group_size,
        prompts_per_step=config.tf_prompts_per_step,
        lr=lr,
        definition={"task": config.tf_task, **config.tf_knobs},
    )


def _bandit_bounds(config: StudyConfig) -> Bounds:
    """The bandit's optimum (expected reward of the best arm per prompt) as the ceiling."""
    best = optimum(setting_model(_bandit("bandit_sampled")(config, REFERENCE, 1.0, 1, 1, 0)))
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

    task = make_task(config.tf_task, **config.tf_knobs)
    n = config.tf_eval_prompts
    if config.rng is None:  # a run made before per-replicate sets: all scored base seed 0's one
        return task_bounds(task, [task.sample_batch(np.random.default_rng([0, HELD_OUT]), n)[1]])
    return task_bounds(task, [held_out_problems(task, 0, n, s)[1] for s in range(config.seeds)])


register_rung(
    Rung(
        "bandit_exact",
        _bandit("bandit_exact"),
        lambda c: c.bandit_lrs,
        lambda c: c.bandit_steps,
        deterministic=True,
        columns=(("pass_rate", "expected_reward"), ("train_reward", "expected_reward")),
        bounds=_bandit_bounds,
    )
)
register_rung(
    Rung(
        "bandit_sampled",
        _bandit("bandit_sampled"),
        lambda c: c.bandit_lrs,
        lambda c: c.bandit_steps,
        columns=(("pass_rate", "expected_reward"), ("train_reward", "reward")),
        bounds=_bandit_bounds,
    )
)
register_rung(
    Rung(
        "tiny_tf",
        _tiny_tf,
        lambda c: c.tf_lrs,
        lambda c: c.tf_steps,
        epochs=lambda c: c.tf_epochs,
        bounds=_tiny_tf_bounds,
    )
)


def rung_rules(config: StudyConfig, rung: str) -> list[str]:
    """The rules a rung runs: the exact flow only those with an exact flow (not clip_cov,
    kl_cov: their batch ranking has no closed-form expectation)."""
    if not RUNGS[rung].deterministic:
        return list(config.rules)
    return [r for r in config.rules if objective_of(r).has_expected_coef()]


# -- planning ---------------------------------------------------------------------------------


def calibration_jobs(config: StudyConfig) -> list[tuple[str, str, str, float, int, int]]:
    """(phase, rung, rule, lr, epochs, base seed) of every calibration run: the rung's step-size
    grid times its mu grid."""
    return [
        ("calib", rung, REFERENCE, lr, mu, 0)
        for rung in config.rungs
        for mu in RUNGS[rung].epochs(config)
        for lr in RUNGS[rung].grid(config)
    ]


def study_jobs(config: StudyConfig, settings: dict[str, tuple[float, int]]) -> list[tuple]:
    """(phase, rung, rule, lr, epochs, base seed) of every study run at each rung's calibrated
    (step size, epochs); a rung without replicates runs one spec per seed."""
    out = []
    for rung in config.rungs:
        r = RUNGS[rung]
        seeds = [0] if r.replicates else range(r.seeds(config) if r.seeds else config.seeds)
        lr, mu = settings[rung]
        out += [("study", rung, r, lr, mu, s) for s in seeds for r in rung_rules(config, rung)]
    return out


def members_per_job(config: StudyConfig, rung: str) -> int:
    """How many paired seeds of one rule one job of ``rung`` runs (:attr:`Rung.members`; 1 for a
    rung with replicates, whose one spec trains every seed)."""
    r = RUNGS[rung]
    if r.replicates or r.members is None:
        return 1
    size = r.members(config)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{rung}: members per job must be an integer >= 1, got {size!r}")
    return size


def job_groups(config: StudyConfig, jobs: Sequence[tuple]) -> list[tuple[tuple, ...]]:
    """``jobs`` in groups run as one job: the seeds of one (phase, rung, rule, step size, mu) in
    order, at most :func:`members_per_job` per group; every other job alone. Pass the unfinished
    jobs only: a resumed study groups what is left and reruns no finished seed."""
    groups: dict[tuple, list[tuple]] = {}
    for job in jobs:
        phase, rung, rule, lr, mu, _ = job
        key = (phase, rung, rule, lr, mu) if members_per_job(config, rung) > 1 else job
        groups.setdefault(key, []).append(job)
    out = []
    for members in groups.values():
        size = members_per_job(config, members[0][1])
        out += [tuple(members[i : i + size]) for i in range(0, len(members), size)]
    return out


def job_part(job: tuple) -> str:
    phase, rung, rule, lr, mu, seed = job
    return part_name(phase, rung, rule, f"lr={lr!r}", f"mu={mu}", f"s{seed}")


def job_spec(config: StudyConfig, job: tuple) -> RunSpec:
    phase, rung, rule, lr, mu, seed = job
    r = RUNGS[rung]
    if phase == "calib":
        steps = config.calib_steps or r.steps(config)
        spec = r.spec(config, rule, lr, config.calib_seeds, steps, seed)
    else:
        seeds = 1 if not r.replicates else config.seeds
        spec = r.spec(config, rule, lr, seeds, r.steps(config), seed)
    return replace(spec, epochs=mu)


def run_job(config: StudyConfig, job: tuple) -> list[pd.DataFrame]:
    """One run as the study's tidy rows: phase, rung, rule, lr, epochs, seed (paired id), step
    and :data:`ROW_COLUMNS` (NaN where the kind does not log one)."""
    return run_jobs(config, (job,))


def run_jobs(config: StudyConfig, jobs: Sequence[tuple]) -> list[pd.DataFrame]:
    """The runs of ``jobs`` (a group of :func:`job_groups`) in one :func:`~.runs.run_specs`
    call (a batched kind runs them as one program), one frame of tidy rows per job
    (:func:`job_rows`)."""
    frames = run_specs([job_spec(config, job) for job in jobs])
    return [job_rows(job, frame) for job, frame in zip(jobs, frames, strict=True)]


def job_rows(job: tuple, frame: pd.DataFrame) -> pd.DataFrame:
    """A run kind's frame of ``job`` as the study's rows."""
    phase, rung, rule, lr, mu, base = job
    if RUNGS[rung].replicates:  # replicate s -> base + s (the flow's -1 -> base)
        seed = frame["seed"].clip(lower=0) + base
    else:  # one seed per spec: the kind logs the spec's own seed
        seed = pd.Series(base, index=frame.index)
    rows = pd.DataFrame(
        {"phase": phase, "rung": rung, "rule": rule, "lr": lr, "epochs": mu, "seed": seed}
    )
    rows["step"] = frame["step"]
    renamed = dict(RUNGS[rung].columns)
    for name in ROW_COLUMNS:
        column = renamed.get(name, name)
        rows[name] = frame[column].astype(float) if column in frame else np.nan
    return rows


def _run(folder: RunFolder, config: StudyConfig, jobs: list[tuple], desc: str, **kw: Any) -> None:
    left = [j for j in jobs if not folder.done(job_part(j))]
    todo = [
        Job(
            "/".join(map(str, group[0][1:5])) + "/" + ",".join(str(j[5]) for j in group),
            tuple(job_part(j) for j in group),
            (config, group),
        )
        for group in job_groups(config, left)
    ]

    def written(job: Job) -> None:  # the job's parts are on disk: a rung's clean-up may run
        for one in job.args[1]:
            hook = RUNGS[one[1]].written
            if hook is not None:
                hook(job_spec(config, one))

    folder.run(run_jobs, todo, total=len(jobs), desc=desc, written=written, **kw)


#: The key of a study folder's ``config.json`` that records each rung's calibrated point.
CALIBRATED = "calibrated"


def read_record(out: str | Path) -> tuple[StudyConfig, dict[str, tuple[float, int]] | None]:
    """A study folder's ``config.json``: its settings and, once calibrated, each rung's
    calibrated (step size, epochs). A record without ``rng`` was made with the toy trainers'
    earlier random-number scheme: its config's ``rng`` is ``None``."""
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
    """Write ``config.json`` with the calibrated point of every rung (atomically)."""
    values = asdict(config)
    if values["rng"] is None:  # a record made before rng was recorded stays without it
        del values["rng"]
    record = {**values, CALIBRATED: {r: [lr, mu] for r, (lr, mu) in point.items()}}
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(out / "config.json")


def with_folder(config: StudyConfig, out: str | Path, force: bool = False) -> StudyConfig:
    """``config`` grown by what the study folder ``out`` already holds: the union of its rules,
    rungs and own claims with the folder's (in the folder's order, new ones after), so that a
    run with a subset or other rules adds to the folder's tables instead of shrinking them (the
    folder's runs are reused). With ``force`` (the parts are recomputed) or a new folder:
    ``config`` itself. A claim of the folder's name that says something else is refused."""
    path = Path(out) / "config.json"
    if force or not path.is_file() or not any((Path(out) / "parts").glob("*.parquet")):
        return config
    try:
        previous, _ = read_record(out)
    except ValueError:
        return config  # the planner refuses an unreadable record
    rules = list(dict.fromkeys([*previous.rules, *config.rules]))
    rungs = list(dict.fromkeys([*previous.rungs, *config.rungs]))
    claims = {c["name"]: c for c in previous.claims}
    for c in config.claims:
        if claims.setdefault(c["name"], c) != c:
            raise ValueError(
                f"claim {c['name']}: {out} records another claim of that name; rename it, or use "
                "another --out"
            )
    rules += [r for c in claims.values() for r in (c["rule_a"], c["rule_b"]) if r not in rules]
    grown = replace(config, rules=rules, rungs=rungs, claims=list(claims.values()))
    if (rules, rungs) != (config.rules, config.rungs):
        print(
            f"{out} holds a study of {len(previous.rules)} rules on {', '.join(previous.rungs)}: "
            f"this run adds to it (tables over {len(rules)} rules on {', '.join(rungs)}; a new "
            "--out for a study of its own)",
            file=sys.stderr,
            flush=True,
        )
    return grown


def study_files(parts: Path, config: StudyConfig, point: Mapping[str, tuple[float, int]]):
    """The parts of the study ``config`` in ``parts``: its calibration grid and its rules at each
    rung's calibrated ``point``, never a run at another step size or mu."""
    rungs = [r for r in config.rungs if r in point]
    at = replace(config, rungs=rungs)
    wanted = {job_part(j) for j in calibration_jobs(config) + study_jobs(at, dict(point))}
    return [f for f in sorted(Path(parts).glob("*.parquet")) if f.name in wanted]


def rebuild_tables(out: str | Path, config: StudyConfig | None = None) -> dict[str, pd.DataFrame]:
    """``--tables-only``: the tables of the study recorded in ``out/config.json`` (else
    ``config``) from its parts: the calibration grid and every rule at the calibrated point the
    record holds (a record without one: calibrated again from the parts). Parts of other
    settings in ``out/parts`` (another step size or mu, rules or rungs of no record) are left
    out, so the tables never mix two calibrations."""
    out = Path(out)
    files = sorted((out / "parts").glob("*.parquet"))
    if not files:
        raise ValueError(f"--tables-only: no result parts in {out}/parts")
    point, given = None, config.claims if config is not None else []
    if (out / "config.json").exists():
        config, point = read_record(out)
        if given:  # claims given now join the recorded ones (and the record)
            names = {c["name"] for c in given}
            claims = [*(c for c in config.claims if c["name"] not in names), *given]
            config = replace(config, claims=claims)
            config.check_claims()
    elif config is None:
        raise ValueError(f"--tables-only: no config.json in {out}")
    if point is None:
        curve = calibration_curve(read_parts(out / "parts"))
        point = calibrate(
            curve, replace(config, rungs=[r for r in config.rungs if r in set(curve["rung"])])
        )
    chosen = study_files(out / "parts", config, point)
    if not any(f.name.startswith("study__") for f in chosen):
        raise ValueError(
            f"--tables-only: no study parts of {out}/config.json's study in {out}/parts"
        )
    rows = pd.concat([pd.read_parquet(f) for f in chosen], ignore_index=True)
    if given and (out / "config.json").exists():
        record_calibration(out, config, point)
    return write_tables(rows, out, config)


def run_study(
    config: StudyConfig,
    out: str | Path,
    *,
    progress: bool = True,
    force: bool = False,
    workers: int | None = None,
) -> pd.DataFrame:
    """Calibrate, run and analyse (resuming what ``out`` holds); returns the tidy rows."""
    config.validate()
    config = with_folder(config, out, force)
    config.validate()
    folder = RunFolder(
        out,
        config.fields_of_parts(),
        contents=asdict(config),
        force=force,
        compare=lambda previous, now: changed_settings(part_fields(previous), now),
        device=config.device,
    )
    calib = calibration_jobs(config)
    kw = {"progress": progress, "workers": workers}
    _run(folder, config, calib, "calibration", **kw)
    point = calibrate(calibration_curve(read_parts(folder.parts)), config)
    record_calibration(folder.out, config, point)
    _run(folder, config, study_jobs(config, point), "claims", **kw)
    files = study_files(folder.parts, config, point)
    rows = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    write_tables(rows, folder.out, config)
    return rows


# -- calibration ------------------------------------------------------------------------------


def calibration_curve(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (rung, epochs, lr): the reference rule's clip share (mean over steps and seeds) and
    the mean pass rate. No SE over seeds: the toy trainers pool the objective's metrics over the
    seeds of a run (one value per step, repeated on every seed's row)."""
    calib = canonical_rows(rows[rows["phase"] == "calib"])
    calib["clip_share"] = calib["clip_low_frac"] + calib["clip_high_frac"]
    per_seed = calib.groupby(["rung", "epochs", "lr", "seed"], as_index=False)[
        ["clip_share", "pass_rate"]
    ].mean()
    g = per_seed.groupby(["rung", "epochs", "lr"], as_index=False)
    curve = g.agg(
        clip_share=("clip_share", "mean"),
        pass_rate=("pass_rate", "mean"),
        seeds=("seed", "nunique"),
    )
    return ladder_order(curve, ["rung", "epochs", "lr"])


def pick_step_size(curve: pd.DataFrame, low: float, high: float) -> tuple[float, int]:
    """The (step size, epochs) of ``curve`` (columns ``lr``, ``epochs``, ``clip_share``) whose
    clip share lies in ``[low, high]`` closest to the band's middle; with none inside, the one
    closest to the band; at equal distance the fewer epochs (cheaper), then the smaller step."""
    if curve.empty:
        raise ValueError("curve: no calibration points")
    curve = curve.sort_values(["epochs", "lr"], kind="stable")
    share = curve["clip_share"].to_numpy(float)
    inside = (share >= low) & (share <= high)
    distance = np.where(
        inside, np.abs(share - (low + high) / 2), np.maximum(low - share, share - high) + 1
    )
    best = int(np.nanargmin(distance))
    return float(curve["lr"].to_numpy(float)[best]), int(curve["epochs"].to_numpy()[best])


def calibrate(rows: pd.DataFrame, config: StudyConfig) -> dict[str, tuple[float, int]]:
    """The calibrated (step size, epochs) of each rung of ``config`` from the tidy ``rows`` (or
    their :func:`calibration_curve`)."""
    curve = rows if "clip_share" in rows.columns else calibration_curve(rows)
    out = {}
    for rung in config.rungs:
        r = RUNGS[rung]
        keep = curve["lr"].isin(r.grid(config)) & curve["epochs"].isin(r.epochs(config))
        out[rung] = pick_step_size(
            curve[(curve["rung"] == rung) & keep], config.target_low, config.target_high
        )
    return out


# -- analysis ---------------------------------------------------------------------------------


#: The columns that identify a row of the study (:func:`canonical_rows` sorts by them).
ROW_KEYS = ["phase", "rung", "rule", "lr", "epochs", "seed", "step"]


def ladder_order(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``frame`` sorted by ``keys`` (stable), a ``rung`` column in ladder order (:data:`RUNGS`,
    then unknown rungs by name), every other key by value; the index renumbered."""
    ladder = {rung: i for i, rung in enumerate(RUNGS)}

    def key(column: pd.Series) -> pd.Series:
        if column.name != "rung":
            return column
        return column.map(lambda r: f"{ladder.get(r, len(ladder)):06d} {r}")

    by = [k for k in keys if k in frame.columns]
    if frame.empty or not by:
        return frame.reset_index(drop=True)
    return frame.sort_values(by, key=key, kind="stable").reset_index(drop=True)


def canonical_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The study's rows in one order whatever order the parts were read in
    (:func:`~.results.sorted_rows` by :data:`ROW_KEYS`): every table derived from them is then
    the same to the last bit."""
    return sorted_rows(rows, ROW_KEYS)


def run_scores(rows: pd.DataFrame) -> pd.DataFrame:
    """Per study run (rung, rule, seed): the claims' metrics and the mechanism columns; rows in
    ladder order, then by rule and seed."""
    study = canonical_rows(rows[rows["phase"] == "study"])
    study = study.assign(clip_frac=study["clip_low_frac"] + study["clip_high_frac"])
    trained = study[study["step"] > 0]  # the llm's step 0 only evaluates
    g = trained.groupby(["rung", "rule", "seed"], sort=False)
    scores = g.agg(
        lr=("lr", "first"),
        epochs=("epochs", "first"),
        reward_auc=("train_reward", "mean"),
        final_entropy=("entropy", "last"),
        **{m: (m, "mean") for m in MECHANISM},
    ).reset_index()
    final = study.dropna(subset=["pass_rate"]).groupby(["rung", "rule", "seed"])["pass_rate"].last()
    held_out = (
        study.dropna(subset=["eval_pass"]).groupby(["rung", "rule", "seed"])["eval_pass"].last()
    )
    final = held_out.combine_first(final).rename("final_pass")
    scores = scores.merge(final.reset_index(), on=["rung", "rule", "seed"], how="left")
    return ladder_order(scores, ["rung", "rule", "seed"])


def study_ledger(
    scores: pd.DataFrame,
    claims: Sequence[Claim] = CLAIMS,
    bounds: Mapping[str, Bounds] | None = None,
    reading: str = "primary",
) -> pd.DataFrame:
    """:func:`.claims.ledger` with the study's margins, then:

    - on a deterministic rung (one exact run) the difference is exact (a zero-width interval):
      two rules that follow one expected coefficient there (:func:`same_on_exact_flow`: NSR and
      its decay) are :data:`.evidence.IDENTICAL`, not a verdict; a gap within +- the margin is
      equivalent; a larger one is supported or reversed by its sign (``p`` is NaN: no test);
    - the headroom rule (:func:`.claims.headroom`) with ``bounds`` (:func:`study_bounds`;
      None: no headroom check);
    - Holm's adjustment over each rung's primary family (:func:`.claims.holm_by_rung`);
    - ``below_margin``: every effect the interval allows (the exact gap) is within +- the margin.
    """
    table = ledger(scores, claims, margins=MARGINS, reading=reading)
    if not len(table):
        return table
    for i, row in table.iterrows():
        if not (row["rung"] in RUNGS and RUNGS[row["rung"]].deterministic and row["seeds"] == 1):
            continue
        d, m = float(row["estimate"]), float(row["margin"])
        if same_on_exact_flow(row["rule_a"], row["rule_b"]):
            verdict, reason = evidence.IDENTICAL, "one expected coefficient on the exact flow"
        elif abs(d) < m:
            verdict, reason = evidence.EQUIVALENT, f"exact difference within +-{m:g}"
        else:
            exact = evidence.PairedDifference(d, d, d, 0.0, 1)
            verdict, reason = evidence.verdict(exact, row["direction"], m)[0], "exact difference"
        table.loc[i, ["verdict", "reason", "p"]] = verdict, reason, np.nan
    if bounds is not None:
        keep = table["verdict"] == evidence.IDENTICAL  # not a comparison: no headroom to check
        checked = headroom(table[~keep], scores, bounds, REFERENCE)
        table = pd.concat([checked, table[keep]]).sort_index()
    table = holm_by_rung(table)
    lo = table["lo"].fillna(table["estimate"].where(table["seeds"] == 1))
    hi = table["hi"].fillna(table["estimate"].where(table["seeds"] == 1))
    table["below_margin"] = (hi < table["margin"]) & (lo > -table["margin"])
    return table


def same_on_exact_flow(rule_a: str, rule_b: str) -> bool:
    """Whether two rules take the same step on an exact expected-gradient flow, which uses each
    rule's expected coefficient: a stochastic rule acts there as its deterministic counterpart
    (:meth:`~sandbox.objectives.base.Objective.expectation`)."""

    def acts_as(rule: str) -> tuple[type, dict]:
        objective = objective_of(rule)
        objective = objective.expectation() or objective
        return type(objective), dict(objective.params)

    return acts_as(rule_a) == acts_as(rule_b)


def study_bounds(config: StudyConfig) -> dict[str, Bounds]:
    """Each of the study's rungs with :attr:`Rung.bounds`: its pass metrics' bounds."""
    return {r: RUNGS[r].bounds(config) for r in config.rungs if RUNGS[r].bounds is not None}


def rung_bounds(bounds: Mapping[str, Bounds]) -> pd.DataFrame:
    """The baselines table of :func:`study_bounds`: per rung, its pass metrics' ceiling, floor
    (the answer baseline) and where they come from."""
    rows = [
        {"rung": r, "ceiling": b.ceiling, "floor": b.floor, "source": b.note}
        for r, b in bounds.items()
    ]
    return pd.DataFrame(rows, columns=["rung", "ceiling", "floor", "source"])


def auc_claims(claims: Sequence[Claim] = CLAIMS) -> list[Claim]:
    """The ``final_pass`` claims restated on ``reward_auc`` (the area under the training-reward
    curve: it separates rules that all end near a saturated optimum by how fast they got there)."""
    return [replace(c, metric="reward_auc") for c in claims if c.metric == "final_pass"]


def rung_power(scores: pd.DataFrame) -> pd.DataFrame:
    """The power line of every rung with paired seeds, for every metric with a margin."""
    sampled = scores[scores.groupby("rung")["seed"].transform("nunique") > 1]
    frames = [power_lines(sampled, m, MARGINS[m]) for m in MARGINS if sampled[m].notna().any()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def rank_agreement(
    scores: pd.DataFrame, metric: str = "final_pass", draws: int = 1000
) -> pd.DataFrame:
    """Tau-b (near-ties within the paired 95% interval count as ties) between the rule orders
    of every pair of rungs, with a bootstrap interval over seeds, with and without
    :data:`STEP_SIZE_RULE`."""
    tables = {
        r: s.pivot_table(index="seed", columns="rule", values=metric)
        for r, s in scores.groupby("rung", sort=False)
    }
    ladder = list(RUNGS)
    rungs = sorted(tables, key=lambda r: ladder.index(r) if r in ladder else len(ladder))
    rows = []
    for i, a in enumerate(rungs):
        for b in rungs[i + 1 :]:
            common = sorted(set(tables[a].columns) & set(tables[b].columns))
            for without in (False, True):
                rules = [r for r in common if not (without and r == STEP_SIZE_RULE)]
                if len(rules) < 3:
                    continue
                tau, lo, hi = evidence.tau_b_interval(
                    tables[a][rules].to_numpy(), tables[b][rules].to_numpy(), tol=1e-6, draws=draws
                )
                rows.append(
                    {
                        "metric": metric,
                        "rung_a": a,
                        "rung_b": b,
                        "without": STEP_SIZE_RULE if without else "",
                        "rules": len(rules),
                        "tau_b": tau,
                        "lo": lo,
                        "hi": hi,
                    }
                )
    columns = ["metric", "rung_a", "rung_b", "without", "rules", "tau_b", "lo", "hi"]
    return pd.DataFrame(rows, columns=columns)


def rule_summary(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (rung, rule): seeds, the metrics' means, the mechanism columns, and ``never_binds``:
    a rule that reports clip shares whose bounds (almost) never bound (below
    :data:`NEVER_BINDS`); NaN ``clip_frac``: the rule reports none (no bounds, e.g. unclipped,
    KL-Cov's penalty); ``like_unclipped``: its realised effect cannot be told from the unclipped
    rule's (:func:`like_unclipped`)."""
    cols = ["final_pass", "reward_auc", "final_entropy", *MECHANISM]
    scores = ladder_order(scores, ["rung", "rule", "seed"])
    out = scores.groupby(["rung", "rule"], sort=False)[cols].mean().reset_index()
    out.insert(
        2, "seeds", scores.groupby(["rung", "rule"], sort=False)["seed"].nunique().to_numpy()
    )
    first = scores.groupby(["rung", "rule"], sort=False)[["lr", "epochs"]].first()
    out["lr"], out["epochs"] = first["lr"].to_numpy(), first["epochs"].to_numpy()
    out["never_binds"] = out["clip_frac"] < NEVER_BINDS  # NaN (no bounds reported): False
    pairs = zip(out["rung"], out["rule"], strict=True)
    out["like_unclipped"] = [like_unclipped(scores, rung, rule) for rung, rule in pairs]
    return out


#: The rule without a trust region that :func:`like_unclipped` compares with.
UNCLIPPED = "unclipped"


def like_unclipped(scores: pd.DataFrame, rung: str, rule: str, metric: str = "reward_auc") -> bool:
    """Whether ``rule`` is indistinguishable from :data:`UNCLIPPED` on ``rung`` by its realised
    effect, whatever clip share it reports: the paired interval of its ``metric`` minus the
    unclipped rule's lies within +- the metric's margin (:data:`.evidence.EQUIVALENT`), with
    paired seeds. A rule that reports no clip share (KL-Cov's penalty) can be inert too; its
    claims then test the absence of a clip, not its own mechanism. False without the pair."""
    on = scores[(scores["rung"] == rung) & scores["rule"].isin([rule, UNCLIPPED])]
    table = on.pivot_table(index="seed", columns="rule", values=metric)
    if rule == UNCLIPPED or UNCLIPPED not in table or rule not in table or len(table) < 2:
        return False
    diff = evidence.paired_difference(table[rule].to_numpy(), table[UNCLIPPED].to_numpy())
    return evidence.verdict(diff, "greater", MARGINS[metric])[0] == evidence.EQUIVALENT


def entropy_law(rows: pd.DataFrame) -> pd.DataFrame:
    """Mechanism check (a), per (rung, rule) where logged: the observed per-step entropy change
    against the entropy-covariance law's first-order prediction from the same step's logit
    change, over every step and seed: means, correlation, least-squares slope (1 where the law
    holds) and the RMS of observed - predicted."""
    study = canonical_rows(rows[(rows["phase"] == "study")]).dropna(
        subset=["entropy_change", "entropy_change_pred"]
    )
    out = []
    for (rung, rule), g in study.groupby(["rung", "rule"], sort=False):
        obs, pred = g["entropy_change"].to_numpy(), g["entropy_change_pred"].to_numpy()
        out.append(
            {
                "rung": rung,
                "rule": rule,
                "points": len(g),
                "observed_mean": obs.mean(),
                "predicted_mean": pred.mean(),
                "corr": float(np.corrcoef(obs, pred)[0, 1]),
                "slope": float(np.dot(pred, obs) / np.dot(pred, pred)),
                "rms_error": float(np.sqrt(np.mean((obs - pred) ** 2))),
            }
        )
    columns = [
        "rung",
        "rule",
        "points",
        "observed_mean",
        "predicted_mean",
        "corr",
        "slope",
        "rms_error",
    ]
    return ladder_order(pd.DataFrame(out, columns=columns), ["rung", "rule"])


def gradient_noise(rows: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Mechanism check (c), per (rung, rule) where logged (:mod:`sandbox.grad_noise`): per seed,
    the step-means of ``rescue_var`` (the rule's own noise, ``||g_rule - g_det||^2``),
    ``sampling_var`` (the batch's, ``tr Cov[g_det]``) and ``signal`` (``||g_det||^2``); then over
    seeds the means of ``rescue_var / signal`` and ``sampling_var / signal`` and of the variance
    ratio ``Var(rule) / Var(det) ~ 1 + rescue_var / sampling_var``, with its Student-t
    ``level`` interval over seeds (:func:`.evidence.paired_difference` against 0; a seed whose
    sampling variance is 0 gives no ratio). ``points``: the (step, seed) rows used."""
    columns = ["rung", "rule", "seeds", "points", "rescue_to_signal", "sampling_to_signal"]
    columns += ["variance_ratio", "lo", "hi"]
    if not set(GRAD_NOISE_COLUMNS) <= set(rows.columns):  # parts written before (c) was logged
        return pd.DataFrame(columns=columns)
    study = canonical_rows(rows[rows["phase"] == "study"]).dropna(subset=list(GRAD_NOISE_COLUMNS))
    out = []
    for (rung, rule), g in study.groupby(["rung", "rule"], sort=False):
        per_seed = g.groupby("seed")[list(GRAD_NOISE_COLUMNS)].mean()
        rescue, sampling, signal = (per_seed[c].to_numpy(float) for c in GRAD_NOISE_COLUMNS)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = 1.0 + rescue / sampling
            to_signal = rescue / signal, sampling / signal
        interval = evidence.paired_difference(ratio, np.zeros_like(ratio), level)
        out.append(
            {
                "rung": rung,
                "rule": rule,
                "seeds": interval.n,
                "points": len(g),
                "rescue_to_signal": _finite_mean(to_signal[0]),
                "sampling_to_signal": _finite_mean(to_signal[1]),
                "variance_ratio": interval.estimate,
                "lo": interval.lo,
                "hi": interval.hi,
            }
        )
    return ladder_order(pd.DataFrame(out, columns=columns), ["rung", "rule"])


def _finite_mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def write_tables(
    rows: pd.DataFrame, out: Path, config: StudyConfig | None = None
) -> dict[str, pd.DataFrame]:
    """``results.parquet`` and the CSVs (calibration, scores, summary, ledger, power,
    agreement, entropy_law, grad_noise) and the figures; returns the tables.

    The same rows, in any order, give the same bytes (:func:`canonical_rows`, stable sorts,
    :func:`~.results.write_csv`'s float format, PNGs without a version stamp), and a file whose
    bytes would not change is not rewritten; the folder's ``tables`` provenance records this
    command only if something changed (:func:`~.results.recording_tables`)."""
    out = Path(out)
    with recording_tables(out):
        return _write_tables(canonical_rows(rows), out, config)


def _write_tables(
    rows: pd.DataFrame, out: Path, config: StudyConfig | None
) -> dict[str, pd.DataFrame]:
    write_parquet_if_changed(rows, out / "results.parquet")
    scores = run_scores(rows)
    bounds = study_bounds(config) if config is not None else None  # once: tiny_tf samples sets
    claims = study_claims(config)
    tables = {
        "calibration": calibration_curve(rows),
        "scores": scores,
        "summary": rule_summary(scores),
        "ledger": study_ledger(scores, claims, bounds),
        "ledger_auc": study_ledger(scores, auc_claims(claims), bounds, "secondary"),
        "entropy_law": entropy_law(rows),
        "grad_noise": gradient_noise(rows),
        "power": rung_power(scores),
        "bounds": rung_bounds(bounds) if bounds is not None else pd.DataFrame(),
        "agreement": pd.concat(
            [rank_agreement(scores, m) for m in ("final_pass", "reward_auc")], ignore_index=True
        ),
    }
    for name, table in tables.items():
        write_csv(table, out / f"{name}.csv")
    tables["transfer"], tables["transfer_agreement"] = write_transfer(out)  # from the ledgers
    plot_calibration(tables["calibration"], tables["summary"], out / "calibration.png", config)
    plot_mechanism(tables["summary"], out / "mechanism.png")
    return tables


def plot_calibration(
    curve: pd.DataFrame, summary: pd.DataFrame, path: Path, config: StudyConfig | None
) -> None:
    """dapo's clip share against the step size per rung, the target band shaded, the chosen
    step size marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = ladder_order(curve, ["rung", "epochs", "lr"])
    rungs = list(dict.fromkeys(curve["rung"]))
    fig, axes = plt.subplots(
        1, max(len(rungs), 1), figsize=(4 * max(len(rungs), 1), 3.2), squeeze=False
    )
    low, high = (config.target_low, config.target_high) if config else (0.05, 0.10)
    for ax, rung in zip(axes[0], rungs, strict=False):
        c = curve[curve["rung"] == rung].sort_values("lr", kind="stable")
        for mu, m in c.groupby("epochs"):
            ax.plot(m["lr"], m["clip_share"], marker="o", label=f"{mu} epochs")
        ax.axhspan(low, high, color="tab:green", alpha=0.15)
        chosen = summary.loc[summary["rung"] == rung, ["lr", "epochs"]]
        if len(chosen):
            lr, mu = chosen.iloc[0]
            pick = c[(c["lr"] == lr) & (c["epochs"] == mu)]
            ax.plot(pick["lr"], pick["clip_share"], "k*", ms=12, label="chosen")
        ax.set(title=rung, xlabel="step size", ylabel="dapo clip share")
        ax.legend(fontsize=7)
        if c["lr"].nunique() > 1:
            ax.set_xscale("log")
    fig.tight_layout()
    write_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_mechanism(summary: pd.DataFrame, path: Path) -> None:
    """Per rung and rule: the shares of the unclipped gradient mass discarded (Z_lo, Z_hi) and
    rescued, stacked bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summary.dropna(subset=["grad_mass_zero_lo"])  # the flow has none
    summary = ladder_order(summary, ["rung", "rule"])
    rungs = list(dict.fromkeys(summary["rung"]))
    fig, axes = plt.subplots(
        1, max(len(rungs), 1), figsize=(4.5 * max(len(rungs), 1), 3.6), squeeze=False
    )
    for ax, rung in zip(axes[0], rungs, strict=False):
        s = summary[summary["rung"] == rung]
        x = np.arange(len(s))
        bottom = np.zeros(len(s))
        for col, label in (
            ("grad_mass_zero_lo", "discarded Z_lo"),
            ("grad_mass_zero_hi", "discarded Z_hi"),
            ("grad_mass_rescued", "rescued"),
        ):
            v = s[col].fillna(0).to_numpy()
            ax.bar(x, v, bottom=bottom, label=label)
            bottom += v
        ax.set_xticks(x, s["rule"], rotation=60, ha="right", fontsize=7)
        ax.set(title=rung, ylabel="share of |r A| mass")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    write_figure(fig, path, dpi=110)
    plt.close(fig)


def fmt_interval(estimate: float, lo: float, hi: float) -> str:
    """``+0.012 [-0.003, +0.027]`` (the estimate alone without an interval)."""
    if not math.isfinite(lo):
        return f"{estimate:+.4f}"
    return f"{estimate:+.4f} [{lo:+.4f}, {hi:+.4f}]"
