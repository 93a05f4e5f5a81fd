"""Smoke tests of benchmarks/llm_memory.py in its tiny mode (a 2,048-token vocabulary, 4 rows).

``main`` runs every measurement (both baselines, llm.train through its CLI, TRL's GRPOTrainer) in
this process instead of fresh subprocesses, which keeps the test to seconds; the script as a user
runs it (fresh subprocesses) is tested for llm.train in a ``slow`` test. No memory figure is
asserted beyond its bookkeeping: the figures are the benchmark's output, not a test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "llm_memory.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import llm_memory  # noqa: E402


def test_main_tiny_in_process(monkeypatch, capsys):
    pytest.importorskip("trl")

    def in_process(args, what):
        child = llm_memory.parse_args(["--tiny", "--threads", "1"])
        child.child, child.model_dir = what, args.model_dir
        return llm_memory.child(child)["rss_mb"]

    monkeypatch.setattr(llm_memory, "measure", in_process)
    results = llm_memory.main(["--tiny", "--threads", "1"])
    out = capsys.readouterr().out
    for name in ("llm", "trl"):
        r = results[name]
        assert r["baseline"] > 100 and r["activations"] == r["peak"] - r["state"] > -r["state"]
    assert "ratio llm.train / TRL: peak" in out and "TRL GRPOTrainer" in out


@pytest.mark.slow
def test_script_runs_tiny_for_llm_train():
    path = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--tiny", "--trainers", "llm", "--threads", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("llm.train"))
    baseline, peak, state, activations, _ = map(float, row.split()[1:])
    assert baseline > 100 and peak > 0 and state > 0
    assert activations == pytest.approx(peak - state, abs=1)
    assert "vocab 2048" in proc.stdout and "2-row micro-batches" in proc.stdout


def test_bad_arguments():
    with pytest.raises(ValueError, match="--micro-batch"):
        llm_memory.parse_args(["--prompts", "2", "--group-size", "3", "--micro-batch", "2"])
    with pytest.raises(ValueError, match="--trainers"):
        llm_memory.parse_args(["--trainers", "llm,verl"])
