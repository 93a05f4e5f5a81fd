"""The claims study's plan: calibrate each rung, then run every claim rule paired by seed.

Both phases are run specs (:mod:`sandbox.experiments.runs`) through the one planner
(:class:`~sandbox.experiments.planner.RunFolder`: resumable parts, progress); a part is named by
its job and the hash of its run spec (:func:`job_part`), so a study of other settings computes
its own parts beside those of earlier ones and reads only its own.

1. **Calibration**: the reference rule ``dapo`` on each rung's step-size grid times its mu grid,
   ``calib_seeds`` seeds, ``calib_steps`` steps (default: the rung's run length). Its clip share
   (``clip_low_frac + clip_high_frac``, averaged over steps and seeds) against the step size is
   the curve; :func:`pick_step_size` picks the point in the target band (default 5-10%).
2. **Study**: every rule at the rung's calibrated point, the rung's paired seeds, one aggregation
   for every rule (``token-mean``; the papers' own with ``paper_aggregation``).

Pairing: a seed fixes the prompts, the held-out set and the initial model for every rule on a
rung. On the toy rungs the paired seeds are the replicates of one vectorised run (replicate ``s``
of every rule starts from the same weights and sees the same prompts and first rollout, later
ones from the same fixed noise, :mod:`sandbox.streams`; the study records the scheme as ``rng``);
the exact flow is one deterministic "seed"; a kind that trains one seed per spec (``llm``) runs
one spec per seed, up to :attr:`.rungs.Rung.members` of them per job, each seed its own part, so
a resumed study reruns no finished seed (where the kind batches across step sizes, as ``llm``
does, a calibration's step sizes at one mu are one such job too).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sandbox.configs import check_number
from sandbox.experiments.planner import Job, RunFolder, check_backend
from sandbox.experiments.results import prune_parts
from sandbox.experiments.runs import RunSpec, run_specs
from sandbox.grad_noise import GRAD_NOISE_COLUMNS

from .analysis import calibration_curve, step_size_choice
from .claims import Claim
from .rungs import (
    REFERENCE,
    RUNGS,
    StudyConfig,
    StudyJob,
    joined_claims,
    members_per_job,
    read_record,
    record_calibration,
    rules_note,
    rung_rules,
    study_claims,
    with_folder,
)
from .tables import write_tables

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


def calibration_jobs(config: StudyConfig) -> list[StudyJob]:
    """Every calibration run: the reference rule on each rung's step-size grid x mu grid."""
    return [
        StudyJob("calib", rung, REFERENCE, lr, epochs, 0)
        for rung in config.rungs
        for epochs in RUNGS[rung].epochs(config)
        for lr in RUNGS[rung].lrs(config)
    ]


def claim_order(rules: Sequence[str], claims: Sequence[Claim]) -> list[str]:
    """``rules`` in the order that completes ``claims`` soonest: the reference rule first, then
    repeatedly the rule that completes the most claims (both its rules placed), then the one in
    the most claims still open, then ``rules``' own order."""
    placed = [REFERENCE] if REFERENCE in rules else []
    left = [r for r in rules if r not in placed]
    while left:

        def rank(rule: str) -> tuple[int, int]:
            mine = [c for c in claims if rule in c.rules and not set(c.rules) <= set(placed)]
            done = sum(set(c.rules) <= {*placed, rule} for c in mine)
            return done, len(mine)

        best = max(left, key=rank)  # max keeps the first of equals: rules' order
        placed.append(best)
        left.remove(best)
    return placed


def study_jobs(config: StudyConfig, settings: Mapping[str, tuple[float, int]]) -> list[StudyJob]:
    """Every study run at each rung's calibrated (step size, epochs). On a kind of one seed per
    spec (``llm``), rule by rule in :func:`claim_order`, a rule's paired seeds before the next
    rule's: a study cut by ``--time-budget`` holds whole rules, and as many whole claims as they
    allow."""
    out = []
    for rung in config.rungs:
        r = RUNGS[rung]
        seeds = [0] if r.traits.replicates else range(config.seeds(rung))
        lr, epochs = settings[rung]
        rules = rung_rules(config, rung)
        if not r.traits.replicates:
            rules = claim_order(rules, study_claims(config))
        out += [StudyJob("study", rung, rule, lr, epochs, s) for rule in rules for s in seeds]
    return out


#: The base seed of the step-size control's tuning runs: their replicates (``TUNE_SEED + s``)
#: never meet the study's paired seeds (``0 .. seeds - 1``), so the choice is made on seeds the
#: verdicts are not read on.
TUNE_SEED = 1_000_000


def controlled_rungs(config: StudyConfig) -> list[str]:
    """The rungs the step-size control covers (``control_seeds`` > 0): the sampled ones whose
    spec trains every paired seed at once (the toy rungs; the llm rung's cost rules it out)."""
    if not config.control_seeds:
        return []
    traits = {r: RUNGS[r].traits for r in config.rungs}
    return [r for r, t in traits.items() if t.replicates and not t.deterministic]


def tune_jobs(config: StudyConfig, point: Mapping[str, tuple[float, int]]) -> list[StudyJob]:
    """The control's tuning runs: every rule of a controlled rung at each step size of its grid,
    at the rung's calibrated mu, on ``control_seeds`` seeds from :data:`TUNE_SEED`."""
    return [
        StudyJob("tune", rung, rule, lr, point[rung][1], TUNE_SEED)
        for rung in controlled_rungs(config)
        if rung in point
        for rule in rung_rules(config, rung)
        for lr in RUNGS[rung].lrs(config)
    ]


def own_step_sizes(
    choice: pd.DataFrame, point: Mapping[str, tuple[float, int]], moved: bool
) -> pd.DataFrame:
    """The rules' own step sizes (``choice``'s rows marked ``chosen``,
    :func:`~.analysis.step_size_choice`) on rungs with a calibrated ``point``: those that differ
    from the calibrated step size (``moved``), or those that are it."""
    own = choice[choice["chosen"] & choice["rung"].isin(list(point))]
    return own[(own["lr"] != own["rung"].map(lambda r: point[r][0])) == moved]


def control_jobs(
    config: StudyConfig, point: Mapping[str, tuple[float, int]], choice: pd.DataFrame
) -> list[StudyJob]:
    """The control's runs: each rule of a controlled rung at its own step size on the study's
    paired seeds, where that is not the calibrated one (there the study's own run is the
    control's: :func:`own_step_size_rows`)."""
    moved = own_step_sizes(choice, point, moved=True)
    return [
        StudyJob("control", r.rung, r.rule, float(r.lr), point[r.rung][1], 0)
        for r in moved.itertuples()
        if r.rung in controlled_rungs(config)
    ]


def own_step_size_rows(
    rows: pd.DataFrame, point: Mapping[str, tuple[float, int]], choice: pd.DataFrame
) -> pd.DataFrame:
    """``rows`` with the control's reading complete: a rule whose own step size is the calibrated
    one has no control run (:func:`control_jobs`); its study run's rows join as phase
    ``control``, so the control reads it as the study does (the same run, not a rerun that a
    float32 trajectory on another CPU would make differ)."""
    kept = own_step_sizes(choice, point, moved=False)
    keys = pd.MultiIndex.from_frame(rows[["rung", "rule"]])
    take = (rows["phase"] == "study") & keys.isin(
        list(zip(kept["rung"], kept["rule"], strict=True))
    )
    return pd.concat([rows, rows[take].assign(phase="control")], ignore_index=True)


def job_groups(config: StudyConfig, jobs: Sequence[StudyJob]) -> list[tuple[StudyJob, ...]]:
    """``jobs`` in groups run as one: the jobs of one :meth:`StudyJob.group_key` (a rule's seeds;
    a calibration's step sizes on a kind that batches across them), in order, at most
    :func:`members_per_job` per group. Pass the unfinished jobs only."""
    groups: dict[Any, list[StudyJob]] = {}
    for job in jobs:
        varies = RUNGS[job.rung].traits.batch_varies
        key = job.group_key(varies) if members_per_job(config, job.rung) > 1 else job
        groups.setdefault(key, []).append(job)
    out = []
    for members in groups.values():
        size = members_per_job(config, members[0].rung)
        out += [tuple(members[i : i + size]) for i in range(0, len(members), size)]
    return out


def job_spec(config: StudyConfig, job: StudyJob) -> RunSpec:
    """The run spec of ``job``: a calibration run trains ``calib_seeds`` seeds for
    ``calib_steps`` steps (0: the rung's run length), a tuning run ``control_seeds`` seeds, a
    study or control run the rung's paired seeds."""
    r = RUNGS[job.rung]
    if job.phase == "calib":
        seeds, steps = config.calib_seeds, config.calib_steps or r.steps(config)
    elif job.phase == "tune":
        seeds, steps = config.control_seeds, r.steps(config)
    else:
        seeds, steps = (config.seeds(job.rung) if r.traits.replicates else 1), r.steps(config)
    return replace(r.spec(config, job, seeds=seeds, steps=steps), epochs=job.epochs)


def job_part(config: StudyConfig, job: StudyJob) -> str:
    """The part file of ``job``: its readable :attr:`~.rungs.StudyJob.stem`, then the digest of
    its run spec (:meth:`~sandbox.experiments.runs.RunSpec.digest`: what made the run)."""
    return job_spec(config, job).part_of(job.stem)


def run_jobs(config: StudyConfig, jobs: Sequence[StudyJob]) -> list[pd.DataFrame]:
    """The runs of a group of :func:`job_groups` in one :func:`~.runs.run_specs` call, as
    :func:`job_rows`."""
    frames = run_specs([job_spec(config, job) for job in jobs])
    return [job_rows(job, frame) for job, frame in zip(jobs, frames, strict=True)]


def jobs_written(config: StudyConfig, jobs: Sequence[StudyJob]) -> None:
    """The parts of a group of :func:`job_groups` are on disk: each rung's clean-up runs
    (:attr:`.rungs.Rung.written`: ``llm`` removes the run's scratch checkpoint)."""
    for job in jobs:
        hook = RUNGS[job.rung].written
        if hook is not None:
            hook(job_spec(config, job))


def job_rows(job: StudyJob, frame: pd.DataFrame) -> pd.DataFrame:
    """A run kind's frame of ``job`` as the study's tidy rows: phase, rung, rule, lr, epochs,
    seed (paired id), step and :data:`ROW_COLUMNS` (NaN where the kind does not log one)."""
    kind = RUNGS[job.rung].traits
    if kind.replicates and not kind.deterministic:  # replicate s -> base + s
        seed = frame["seed"] + job.seed
    else:  # one trajectory (the flow's seed -1) or the spec's own seed: the base seed
        seed = pd.Series(job.seed, index=frame.index)
    ids = {"phase": job.phase, "rung": job.rung, "rule": job.rule, "lr": job.lr}
    rows = pd.DataFrame({**ids, "epochs": job.epochs, "seed": seed})
    rows["step"] = frame["step"]
    for name in ROW_COLUMNS:
        column = kind.column(name)
        rows[name] = frame[column].astype(float) if column in frame else np.nan
    return rows


def _unit(config: StudyConfig, group: tuple[StudyJob, ...]) -> Job:
    """The planner's job (a unit) of one group; its cost class is the phase and rung."""
    first = group[0]
    guess = RUNGS[first.rung].unit_seconds
    lrs, seeds = (
        ",".join(dict.fromkeys(str(getattr(j, k)) for j in group)) for k in ("lr", "seed")
    )
    return Job(
        f"{first.rung}/{first.rule}/{lrs}/{first.epochs}/{seeds}",
        tuple(job_part(config, j) for j in group),
        (config, group),
        cost=f"{first.phase}/{first.rung}",
        estimate=float(guess(config, group)) if guess is not None else 0.0,
    )


def _run(
    folder: RunFolder,
    config: StudyConfig,
    jobs: list[StudyJob],
    desc: str,
    done: int,
    budget: float | None,
    **kw: Any,
) -> int:
    """Run the unfinished ``jobs`` in groups; the count of units done so far (``done`` and this
    call's), or :class:`BudgetSpent` if the time budget left some."""
    left = [j for j in jobs if not folder.done(job_part(config, j))]
    todo = [_unit(config, group) for group in job_groups(config, left)]
    unrun = folder.run(run_jobs, todo, total=len(jobs), desc=desc, written=jobs_written, **kw)
    done += len(todo) - len(unrun)
    if unrun:  # only a deadline leaves units without an error
        in_calib, in_study, bound = _units_left(folder, config)
        assert budget is not None
        raise BudgetSpent(budget, in_calib + in_study, in_calib, done, len(folder.stopped), bound)
    return done


def read_jobs(parts: Path, config: StudyConfig, jobs: Sequence[StudyJob]) -> pd.DataFrame:
    """The rows of the finished parts of ``jobs`` in ``parts`` (never a part of another study's
    settings), in the order of their file names; no rows where none is finished."""
    names = sorted({job_part(config, j) for j in jobs})
    found = [pd.read_parquet(Path(parts) / n) for n in names if (Path(parts) / n).exists()]
    return pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=["phase"])


def calibration_rows(parts: Path, config: StudyConfig) -> pd.DataFrame:
    """The rows of the calibration parts of ``config`` in ``parts`` that are finished."""
    rows = read_jobs(parts, config, calibration_jobs(config))
    if rows.empty:
        raise ValueError(f"no calibration parts of this study's settings in {parts}")
    return rows


def study_rows(
    parts: Path, config: StudyConfig, point: Mapping[str, tuple[float, int]]
) -> tuple[list[StudyJob], pd.DataFrame]:
    """The jobs whose parts the study ``config`` reads, and their rows in ``parts``: its
    calibration grid and its rules at each rung's calibrated ``point`` (never a run at another
    step size or mu), and with the step-size control its tuning runs and each rule's run at its
    own step size (chosen from the tuning rows, :func:`~.analysis.step_size_choice`), the
    control's reading completed (:func:`own_step_size_rows`). Each part is read once."""
    at = replace(config, rungs=[r for r in config.rungs if r in point])
    jobs = calibration_jobs(config) + study_jobs(at, dict(point)) + tune_jobs(at, point)
    rows = read_jobs(parts, config, jobs)
    if not (rows["phase"] == "tune").any():
        return jobs, rows
    choice = step_size_choice(rows)
    control = control_jobs(at, point, choice)
    if len(moved := read_jobs(parts, config, control)):
        rows = pd.concat([rows, moved], ignore_index=True)
    return jobs + control, own_step_size_rows(rows, point, choice)


class BudgetSpent(Exception):
    """:func:`run_study`'s time budget ended the call with units (one rule x one group of seeds)
    left: ``left`` in all, ``calibration`` of them in the calibration phase; ``done`` this call;
    ``stopped``: those the budget's end stopped while they ran; ``bound``: ``left`` is an upper
    bound (the step-size control's runs, before its tuning has chosen the rules' step sizes)."""

    def __init__(
        self, budget: float, left: int, calibration: int, done: int, stopped: int, bound=False
    ):
        self.budget, self.left, self.calibration = budget, left, calibration
        self.done, self.stopped = done, stopped
        where = f"{calibration} of them calibration" if calibration else "all in the study"
        cut = (
            f"; stopped {stopped} running (llm runs go on from their checkpoints)"
            if stopped
            else ""
        )
        super().__init__(
            f"time budget of {budget:g} s spent: {done} units run, {'at most ' * bound}{left} "
            f"left ({where}){cut}"
        )


def check_time_budget(value: Any) -> float:
    """A time budget in seconds: a finite number > 0 (a ``ValueError`` saying so)."""
    return check_number("time_budget", value, what="a number of seconds")


def _units_left(folder: RunFolder, config: StudyConfig) -> tuple[int, int, bool]:
    """Units still to run in the calibration and in the study (the step-size control's
    included: its tuning runs, then a run per rule and controlled rung whose own step size is
    not the calibrated one), and whether that is an upper bound: before the tuning has run, one
    control run per rule is counted."""
    calib = [j for j in calibration_jobs(config) if not folder.done(job_part(config, j))]
    open_rungs = {j.rung for j in calib}
    done_rungs = replace(config, rungs=[r for r in config.rungs if r not in open_rungs])
    point = {}
    if done_rungs.rungs:
        point = calibrate(calibration_curve(calibration_rows(folder.parts, config)), done_rungs)
    for rung in open_rungs:  # any grid point: the count of units is the same at every one
        point[rung] = (RUNGS[rung].lrs(config)[0], RUNGS[rung].epochs(config)[0])
    study = [j for j in study_jobs(config, point) if not folder.done(job_part(config, j))]
    tune = [j for j in tune_jobs(config, point) if not folder.done(job_part(config, j))]
    controlled = controlled_rungs(config)
    control, bound = [], bool(controlled) and bool(tune or open_rungs)
    if bound:  # each rule's own step size is not known yet: one run each, at most
        control = [(r, rule) for r in controlled for rule in rung_rules(config, r)]
    elif controlled:
        chosen = step_size_choice(read_jobs(folder.parts, config, tune_jobs(config, point)))
        control = control_jobs(config, point, chosen)
        control = [j for j in control if not folder.done(job_part(config, j))]
    rest = len(job_groups(config, study)) + len(job_groups(config, tune)) + len(control)
    return len(job_groups(config, calib)), rest, bound


def run_study(
    config: StudyConfig,
    out: str | Path,
    *,
    progress: bool = True,
    force: bool = False,
    workers: int | None = None,
    time_budget: float | None = None,
    note_rules: bool = False,
    backend: str = "local",
    address: str | None = None,
) -> dict[str, pd.DataFrame]:
    """Calibrate, run and analyse (resuming what ``out`` holds); returns the tables
    (:func:`.tables.write_tables`: by name, ``results`` the tidy rows).

    ``time_budget`` (seconds from this call's start): a unit starts only while it is expected to
    end in time (:meth:`RunFolder.expected`), units still running at the end are stopped as on
    SIGTERM, and :class:`BudgetSpent` says what is left; the same call again goes on.
    ``note_rules`` (``--rules`` given): once the folder accepts the study, one line on stderr
    names the claims its rules (the folder's too) leave out of the ledger (:func:`rules_note`).
    ``backend``, ``address``: the executor's (:meth:`RunFolder.run`; ``ray``: each unit a Ray
    task, with a GPU on ``device`` cuda; ``out`` on a filesystem every node mounts, and the llm
    rung's scratch too, so a cut run resumes on any node), without a time budget."""
    deadline = None if time_budget is None else time.monotonic() + check_time_budget(time_budget)
    check_backend(backend, workers, deadline)  # before config.json is written
    config.validate()
    config = with_folder(config, out, force)
    config.validate()
    folder = RunFolder(out, config.record(), force=force, device=config.device)
    if note_rules and (note := rules_note(config)) is not None:
        print(note, file=sys.stderr, flush=True)
    kw = {"progress": progress, "workers": workers, "deadline": deadline, "backend": backend}
    kw |= {"address": address, "gpus": 1.0 if config.device == "cuda" else 0.0}  # on Ray
    done = _run(folder, config, calibration_jobs(config), "calibration", 0, time_budget, **kw)
    point = calibrate(calibration_curve(calibration_rows(folder.parts, config)), config)
    record_calibration(folder.out, config, point)
    done = _run(folder, config, study_jobs(config, point), "claims", done, time_budget, **kw)
    if controlled_rungs(config):  # the step-size control: tune on other seeds, then rerun
        tune = tune_jobs(config, point)
        done = _run(folder, config, tune, "step-size control", done, time_budget, **kw)
        chosen = step_size_choice(read_jobs(folder.parts, config, tune))
        control = control_jobs(config, point, chosen)
        _run(folder, config, control, "own step sizes", done, time_budget, **kw)
    return write_tables(study_rows(folder.parts, config, point)[1], folder.out, config)


def rebuild_tables(
    out: str | Path, config: StudyConfig | None = None, prune: bool = False
) -> dict[str, pd.DataFrame]:
    """``--tables-only``: the tables of the study recorded in ``out/config.json`` (else
    ``config``; claims in ``config`` join the record's) from :func:`study_rows` at the recorded
    calibrated point (without one: calibrated again from the parts). ``prune`` (``--prune``):
    then the parts it does not read go (:func:`~sandbox.experiments.results.prune_parts`):
    those of superseded settings, which a part's name keeps apart but never removes."""
    out = Path(out)
    files = sorted((out / "parts").glob("*.parquet"))
    if not files:
        raise ValueError(f"--tables-only: no result parts in {out}/parts")
    point, given = None, config.claims if config is not None else []
    if (out / "config.json").exists():
        config, point = read_record(out)
        if given:  # claims given now join the recorded ones (and the record)
            config = replace(config, claims=joined_claims(config.claims, given, out))
            config.check_claims()
    elif config is None:
        raise ValueError(f"--tables-only: no config.json in {out}")
    if point is None:
        curve = calibration_curve(calibration_rows(out / "parts", config))
        point = calibrate(
            curve, replace(config, rungs=[r for r in config.rungs if r in set(curve["rung"])])
        )
    jobs, rows = study_rows(out / "parts", config, point)
    if not (rows["phase"] == "study").any():
        raise ValueError(
            f"--tables-only: no study parts of {out}/config.json's study in {out}/parts"
        )
    if prune:  # once the folder holds the study: what it does not read goes
        prune_parts(out, {job_part(config, job) for job in jobs})
    if given and (out / "config.json").exists():
        record_calibration(out, config, point)
    return write_tables(rows, out, config)


# -- calibration ------------------------------------------------------------------------------


def pick_step_size(curve: pd.DataFrame, low: float, high: float) -> tuple[float, int]:
    """The (step size, epochs) of ``curve`` (columns ``lr``, ``epochs``, ``clip_share``) whose
    clip share lies in ``[low, high]`` closest to its middle, else closest to the band; at equal
    distance the fewer epochs, then the smaller step."""
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
        keep = curve["lr"].isin(r.lrs(config)) & curve["epochs"].isin(r.epochs(config))
        out[rung] = pick_step_size(
            curve[(curve["rung"] == rung) & keep], config.target_low, config.target_high
        )
    return out
