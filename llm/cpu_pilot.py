"""The llm rung's CPU pilot (issue 40): on which task, and after how many steps, does dapo on
SmolLM2-135M-Instruct leave headroom, at shapes two CPU cores can train?

For each candidate task, dapo trains from 2 paired seeds (``--seeds``) at the CPU rung's shapes,
scored on held-out problems every ``--eval-every`` steps (each evaluation is a candidate horizon).
The rule, written before the pilot ran:

1. a (task, horizon) qualifies where dapo's held-out pass@1, the mean over the seeds, clears the
   task's answer floor by at least :data:`CLEAR` (the floor: :func:`sandbox.study.task_bounds` of
   the seeds' held-out sets, the larger of the constant-answer and answer-prior baselines) and stays
   :data:`~sandbox.study.claims.ROOM` margins below 1 (:func:`~sandbox.study.claims.near_ceiling`);
2. among those, the shortest horizon (the cheapest rung), then the task whose pass sits nearest the
   middle of its room (most headroom both ways), then the candidates' order.

The runs are ``llm`` run specs in one :class:`~sandbox.experiments.planner.RunFolder` (a part per
run, resumable, each run's checkpoints in ``OUT/llm_scratch`` so a cut run continues mid-way), so
``--time-budget`` stops it cleanly and the same command goes on from there::

    python -m llm.cpu_pilot --out results/llm_cpu_pilot --time-budget 2400

writes ``OUT/pilot.csv`` (per task, horizon and seed: pass@1, the floor, dapo's clip share and
median seconds per step over the run), ``OUT/choice.csv``
(per task and horizon: the rule's figures and the choice) and ``OUT/provenance.json``.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

import llm.runs  # registers the llm run kind, in the pool's worker too
from sandbox.configs import CommandParser, positive_int
from sandbox.experiments.planner import Job, RunFolder, answer_signal
from sandbox.experiments.results import write_csv
from sandbox.experiments.runs import RunSpec, run_specs
from sandbox.study import task_bounds
from sandbox.study.claims import near_ceiling
from sandbox.study.rungs import MARGINS, REFERENCE, task_setting

#: how far above the answer floor dapo's held-out pass must end (issue 40)
CLEAR = 0.10
#: the candidates, cheapest answers first: 2-digit sums (floor ~0.05, the base model 0.0 at step
#: 0) and one + / - mod 7 (floor ~0.22; results/llm_pilot: 0.03 at step 0)
CANDIDATES = ("addition:digits=2", "mod_arith:steps=1,ops=['+','-']")


def parse_args(argv: list[str] | None):
    p = CommandParser(prog="python -m llm.cpu_pilot", description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="+", default=list(CANDIDATES), help="task[:knob=value,...]")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--seeds", type=int, default=2, help="paired seeds per task")
    p.add_argument("--steps", type=int, default=20, help="the longest horizon")
    p.add_argument("--eval-every", type=int, default=10, help="horizons: every N steps")
    p.add_argument("--eval-prompts", type=int, default=64, help="held-out problems per seed")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-5, help="README's SmolLM2 CPU example's")
    p.add_argument(
        "--train-args", default="", help="further llm.train flags: --train-args=--cpu-bf16"
    )
    p.add_argument("--time-budget", type=float, default=None, help="seconds; then stop cleanly")
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="processes of one thread each (2 on 2 cores: 2 one-thread runs beat one of two, "
        "results/llm_cpu_speed; a run's numbers are the same at any count)",
    )
    p.add_argument("--out", default="runs/llm_cpu_pilot")
    return p.parse_args(argv)


def specs(args: Any, out: Path) -> list[RunSpec]:
    """dapo's runs: one per candidate task and seed."""
    from llm.pilot import parse_task

    found = []
    for text in args.tasks:
        task, knobs = parse_task(text)
        for seed in range(args.seeds):
            train = {
                "model": args.model,
                "max_new_tokens": args.max_new_tokens,
                "eval_every": args.eval_every,
                "eval_prompts": args.eval_prompts,
                "offline": True,
                "save_model": False,
                "progress": False,
                "scratch": str(out / "llm_scratch"),
                "checkpoint_every": 5,
                "argv": shlex.split(args.train_args),
            }
            found.append(
                RunSpec.make(
                    "llm",
                    task_setting(task, knobs),
                    REFERENCE,
                    seed=seed,
                    steps=args.steps,
                    lr=args.lr,
                    epochs=2,
                    minibatches=2,
                    group_size=args.group_size,
                    prompts_per_step=args.prompts_per_step,
                    device="cpu",
                    definition={"task": task, **knobs},
                    train=train,
                )
            )
    return found


def floor(spec: RunSpec, eval_prompts: int) -> float:
    """The answer floor of ``spec``'s task on its seed's held-out set."""
    from envs.reasoning import make_task
    from llm.data import task_source

    knobs = dict(spec.definition)
    task = knobs.pop("task")
    answers = task_source(task, knobs, "auto", spec.seed, eval_prompts).eval_answers
    return task_bounds(make_task(task, **knobs), [answers]).floor


def tables(folder: RunFolder, found: list[RunSpec], eval_prompts: int) -> pd.DataFrame:
    """pilot.csv (per run and horizon) and choice.csv (per task and horizon, the rule); the
    choice table, from the runs whose parts exist."""
    rows = []
    for spec in found:
        if not folder.done(spec.part):
            continue
        frame = pd.read_parquet(folder.parts / spec.part)
        trained = frame[frame["step"] > 0]  # the share of tokens dapo clipped, s per step
        clip = (trained["clip_high_frac"] + trained["clip_low_frac"]).mean()
        seconds, below = trained["step_time"].median(), floor(spec, eval_prompts)
        for _, row in frame.dropna(subset=["pass_rate"]).iterrows():
            rows.append(
                {"task": spec.setting, "horizon": int(row["step"]), "seed": spec.seed,
                 "pass": row["pass_rate"], "floor": below, "clip_frac": clip,
                 "step_seconds": seconds}
            )  # fmt: skip
    pilot = pd.DataFrame(rows)
    write_csv(pilot, folder.out / "pilot.csv")
    if pilot.empty:
        return pilot
    choice = choose(pilot)
    write_csv(choice, folder.out / "choice.csv")
    return choice


def choose(pilot: pd.DataFrame) -> pd.DataFrame:
    """The rule (module docstring) on pilot.csv's rows: per task and horizon, the seeds' mean
    pass@1 against the floor and the ceiling, and the one ``chosen`` (none if none qualifies)."""
    choice = pilot.groupby(["task", "horizon"], sort=False).agg(
        seeds=("seed", "nunique"), pass_mean=("pass", "mean"), floor=("floor", "mean"),
        clip_frac=("clip_frac", "mean"), step_seconds=("step_seconds", "median"))  # fmt: skip
    choice = choice.reset_index()
    margin = MARGINS["final_pass"]
    choice["clears_floor"] = choice["pass_mean"] >= choice["floor"] + CLEAR
    choice["below_ceiling"] = ~choice["pass_mean"].apply(near_ceiling, args=(1.0, margin))
    able = choice[choice["clears_floor"] & choice["below_ceiling"] & (choice["horizon"] > 0)]
    middle = (able["pass_mean"] - (able["floor"] + 1.0) / 2).abs()
    best = able.assign(middle=middle).sort_values(["horizon", "middle"], kind="stable")
    choice["chosen"] = choice.index == (best.index[0] if len(best) else -1)
    return choice


def pilot_runs(found: list[RunSpec]) -> list[pd.DataFrame]:
    """The runs of one job (module-level, so a pool worker that unpickles it imports this module
    and with it the llm run kind)."""
    return run_specs(found)


def pilot_written(found: list[RunSpec]) -> None:
    """A job's parts are on disk: its runs' scratch checkpoints go (where the job ran)."""
    for spec in found:
        llm.runs.remove_scratch(spec)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    found = specs(args, out)
    settings = {"specs": [spec.to_json() for spec in found]}
    try:
        folder = RunFolder(out, settings)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    budget = args.time_budget
    deadline = None if budget is None else time.monotonic() + budget
    jobs = [
        Job(spec.part.removesuffix(".parquet"), (spec.part,), ([spec],), cost="llm")
        for spec in found
        if not folder.done(spec.part)
    ]
    try:
        left = folder.run(
            pilot_runs, jobs, total=len(found), workers=args.workers, desc="pilot",
            deadline=deadline, written=pilot_written,
        )  # fmt: skip
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (Terminated): one line, no traceback
        kept = f"finished runs are parts of {out}, cut ones resume from their checkpoint"
        return answer_signal(err, kept)
    choice = tables(folder, found, args.eval_prompts)
    if len(choice):
        print(choice.round(3).to_string(index=False))
    if left:
        print(f"{len(left)} of {len(found)} runs left; run the same command again", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
