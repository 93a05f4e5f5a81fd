"""``make demo``'s comparison, timed two ways in one run: one job per sampled run against batched jobs.

What it measures
----------------
The default comparison (:func:`sandbox.experiments.sweep.run_compare`: every preset and
objective on the bandit suite, 32 seeds x 100 steps, sampled runs and exact flows, summary and
figures), end to end, twice, each into a fresh folder and with the same pool of workers, after a
tiny warm-up comparison that starts the pool's forkserver and loads the imports (not timed):

* **per run**: ``rules_per_job=1``, one job and one trainer call per (setting, rule), the way the
  comparison ran before rules were batched;
* **batched**: the default, each setting's sampled runs in a few jobs, each job's rules trained as
  one program (:func:`sandbox.train.bandit.run_bandits`).

It prints the wall seconds of each, their ratio, the machine (CPU model, CPU threads, torch version)
and the date, and whether the two ``summary.csv`` files are identical (they must be: batching
keeps each (rule, seed)'s random stream). Wall times on a shared machine move with its load; the
ratio, measured minutes apart in one run, is the fairer figure.

How to run (from the repository root)::

    python benchmarks/demo.py                                     # the full default comparison
    python benchmarks/demo.py --objectives dapo nsr_dapo --settings needle --seeds 4 --steps 10
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from sandbox.experiments.compare import CompareConfig
from sandbox.experiments.sweep import run_compare


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objectives", nargs="+", default=None, help="default: all")
    parser.add_argument("--settings", nargs="+", default=None, help="default: the bandit suite")
    parser.add_argument("--seeds", type=int, default=None, help="default: the comparison's (32)")
    parser.add_argument("--steps", type=int, default=None, help="default: the comparison's (100)")
    parser.add_argument(
        "--workers", type=int, default=None, help="pool workers (default: as the CLI, min(cpus, 4))"
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the five figures")
    return parser.parse_args()


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(config: CompareConfig, out: Path, **kwargs: Any) -> tuple[float, str]:
    """Wall seconds of one comparison into ``out`` and its ``summary.csv`` text."""
    start = time.perf_counter()
    run_compare(config, out, progress=False, **kwargs)
    seconds = time.perf_counter() - start
    return seconds, (out / "summary.csv").read_text()


def main() -> None:
    args = parse_args()
    given = {k: getattr(args, k) for k in ("objectives", "settings", "seeds", "steps")}
    config = CompareConfig(**{k: v for k, v in given.items() if v is not None})
    kwargs = dict(workers=args.workers, figures=not args.no_figures)
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPU threads, torch {torch.__version__}, "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )
    print(
        f"comparison: {len(config.objectives)} objectives x {len(config.settings)} settings, "
        f"{config.seeds} seeds x {config.steps} steps, workers={args.workers or 'default'}"
    )
    with tempfile.TemporaryDirectory(prefix="bench_demo_") as tmp:
        # warm-up (not timed): the pool's forkserver and its imports, plotting's imports
        tiny = CompareConfig(objectives=["grpo"], settings=config.settings[:1], seeds=2, steps=2)
        run_compare(tiny, Path(tmp) / "warm_up", progress=False, **kwargs)
        per_run, per_run_summary = timed(config, Path(tmp) / "per_run", rules_per_job=1, **kwargs)
        print(f"per run (rules_per_job=1): {per_run:.1f} s wall")
        batched, batched_summary = timed(config, Path(tmp) / "batched", **kwargs)
        print(f"batched (default):         {batched:.1f} s wall")
    print(f"speedup (per run / batched): {per_run / batched:.2f}x")
    same = per_run_summary == batched_summary
    print(f"summary.csv identical: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit("the two comparisons' summaries differ")


if __name__ == "__main__":
    main()
