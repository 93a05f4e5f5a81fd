"""benchmarks/demo.py at a miniature size: it runs both paths and prints its lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_demo_benchmark_times_both_paths_and_their_summaries_agree():
    # three rules, among them one that draws (nsr_dapo) and one that ranks the batch (clip_cov)
    argv = [
        sys.executable,
        str(ROOT / "benchmarks" / "demo.py"),
        "--objectives",
        "dapo",
        "nsr_dapo",
        "clip_cov",
        "--settings",
        "needle",
        "--seeds",
        "2",
        "--steps",
        "3",
        "--workers",
        "1",
        "--no-figures",
    ]
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 6, proc.stdout
    assert lines[0].startswith("machine: ") and f"torch {torch.__version__}" in lines[0]
    assert f"{os.cpu_count()} CPU threads" in lines[0]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", lines[0]), lines[0]
    assert lines[1].startswith("comparison: 3 objectives x 1 settings, 2 seeds x 3 steps")
    per_run = float(re.fullmatch(r"per run \(rules_per_job=1\): (\d+\.\d) s wall", lines[2])[1])
    batched = float(re.fullmatch(r"batched \(default\): +(\d+\.\d) s wall", lines[3])[1])
    ratio = float(re.fullmatch(r"speedup \(per run / batched\): (\d+\.\d\d)x", lines[4])[1])
    assert per_run > 0 and batched > 0
    # the ratio of the unrounded seconds: within the range the printed (0.1 s) ones allow
    low, high = (per_run - 0.05) / (batched + 0.05), (per_run + 0.05) / max(batched - 0.05, 1e-9)
    assert low - 0.005 <= ratio <= high + 0.005
    assert lines[5] == "summary.csv identical: yes"
