"""``--no-save-model`` leaves no model or optimizer weights behind once a run has finished
(README's SmolLM2 example left a 1.6 GB ``checkpoint.pt``: model + AdamW state): the finished
run's checkpoint is its step and settings only, a few KB. While a run is under way, or after
SIGTERM cut it, the checkpoint holds everything, and ``--resume`` continues from it. The real
commands (``python -m llm.train`` cut by SIGTERM, ``python -m llm.ensemble``; the finished
``llm.train`` run through its ``main`` in-process) on the tiny Llama, CPU; the tiny model's full
checkpoint is ~400 KB, so the size bound below separates the two."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from llm.checkpoint import has_weights, model_state
from llm.train import main, parse_args, train

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = (".safetensors", ".pt", ".bin", ".pth")
FEW_KB = 16_000  # the weights-free record: ~3 KB (its settings as JSON); full: ~400 KB
RUN = [
    "--model",
    "tiny",
    "--task",
    "parity",
    "--task-knobs",
    "length=2",
    "--lr",
    "1e-2",
    "--prompts-per-step",
    "2",
    "--group-size",
    "2",
    "--max-new-tokens",
    "4",
    "--no-progress",
    "--device",
    "cpu",
]


def command(module: str, *argv: str) -> list[str]:
    return [sys.executable, "-m", module, *RUN, *argv]


def env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def weight_files(out: Path) -> dict[str, int]:
    """Every weight-like file under ``out`` with its size in bytes."""
    return {
        str(p.relative_to(out)): p.stat().st_size
        for p in out.rglob("*")
        if p.is_file() and p.name.endswith(WEIGHTS)
    }


def assert_no_weights(out: Path, step: int) -> None:
    files = weight_files(out)
    assert files == {"checkpoint.pt": files["checkpoint.pt"]} and files["checkpoint.pt"] < FEW_KB
    record = torch.load(out / "checkpoint.pt", weights_only=True)
    assert set(record) == {"step", "config"} and record["step"] == step
    assert not (out / "model").exists() and not has_weights(str(out))


def test_a_finished_run_keeps_no_weights_and_cannot_be_resumed_past_its_end(
    tmp_path, monkeypatch, in_process
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as env() gives the subprocesses
    out = tmp_path / "run"
    # --checkpoint-every 1: a full checkpoint at step 1, replaced by the record at step 2
    argv = ["--steps", "2", "--checkpoint-every", "1", "--no-save-model", "--out", str(out)]
    # --progress: the closing line says what was kept (--no-progress silences it, issue 39)
    proc = in_process(main, *RUN, *argv, "--progress")
    assert proc.returncode in (0, None), proc.stderr[-2000:]  # main returns None: exit 0
    assert "no weights (--no-save-model)" in proc.stderr
    assert_no_weights(out, step=2)
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()] == [1, 2]
    with pytest.raises(ValueError, match=r"checkpoint.pt holds no weights: .*--no-save-model"):
        model_state(str(out))
    # raising --steps cannot continue a run whose weights are gone: one line, exit 2
    proc = in_process(main, *RUN, "--steps", "3", "--no-save-model", "--resume", "--out", str(out))
    err = proc.stderr
    assert proc.returncode == 2 and err.count("\n") == 1
    assert "finished with --no-save-model, which keeps no weights: it cannot train further" in err
    # the same run into a new --out with the model saved keeps both (to extend with --resume)
    train(parse_args([*RUN, "--steps", "2", "--out", str(tmp_path / "saved")]))
    sizes = weight_files(tmp_path / "saved")
    assert sizes["checkpoint.pt"] > FEW_KB and sizes["model/model.safetensors"] > FEW_KB


def test_sigterm_leaves_a_resume_checkpoint_and_the_resumed_run_leaves_no_weights(tmp_path):
    out = tmp_path / "cut"
    proc = subprocess.Popen(
        command("llm.train", "--steps", "10000", "--no-save-model", "--out", str(out)),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no step logged (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "SIGTERM: checkpoint written" in err, err[-2000:]
    done = len(metrics.read_text().splitlines())
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == done >= 1 and {"model", "optimizer"} <= set(state)
    assert weight_files(out)["checkpoint.pt"] > FEW_KB
    # resume to the end: the run continues from the checkpoint, then keeps no weights
    rows = train(
        parse_args(
            [*RUN, "--steps", str(done + 1), "--no-save-model", "--resume", "--out", str(out)]
        )
    )
    assert [r["step"] for r in rows] == [done + 1]
    assert_no_weights(out, step=done + 1)


def test_a_finished_ensemble_keeps_no_weights(tmp_path):
    out = tmp_path / "ens"
    proc = subprocess.run(
        command(
            "llm.ensemble", "--seeds", "0,1", "--steps", "1", "--no-save-model", "--out", str(out)
        ),
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for seed in (0, 1):
        assert_no_weights(out / f"seed{seed}", step=1)
