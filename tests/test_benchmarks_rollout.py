"""benchmarks/rollout.py at its smallest: it runs and prints the HF rows (vLLM's where installed)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

from llm import train as train_mod


def test_rollout_benchmark_runs():
    # benchmarks/rollout.py at its smallest: the HF rows always, vLLM where installed
    script = pathlib.Path(train_mod.__file__).parents[1] / "benchmarks" / "rollout.py"
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "--device",
            "cpu",
            "--prompts",
            "2",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("  ")[0].strip() for line in proc.stdout.splitlines()}
    assert {"hf", "hf, per prompt"} <= rows
    assert "vllm / hf tokens per second" in proc.stdout or "vllm not timed" in proc.stdout
