"""``python -m llm.train`` refuses a bad --out, --model or --device with one line and exit 2,
before the model is built (real files; the offline case as a real subprocess, whose environment
makes it offline, the others through ``main`` in-process)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm.train import main

ROOT = Path(__file__).resolve().parents[1]


def _train(*argv: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
    )
    return subprocess.run(
        [sys.executable, "-m", "llm.train", "--steps", "1", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--out", "{file}"], "is a file, not a folder"),
        (["--out", "{file}/run"], "lies under a file"),
        (["--model", "nonexistent", "--out", "{tmp}/a"], "not in the local Hugging Face cache"),
        (["--device", "gpu0", "--out", "{tmp}/b"], "--device must be cpu, cuda or cuda:N"),
    ],
    ids=["out-is-a-file", "out-under-a-file", "uncached-model-offline", "bad-device"],
)
def test_bad_llm_train_arguments_are_one_line_before_any_work(
    tmp_path, monkeypatch, in_process, flags, needle
):
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    argv = [f.format(file=blocker, tmp=tmp_path) for f in flags]
    if "nonexistent" in argv:  # offline from the command's environment: the real command
        proc = _train(*argv)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as the subprocess; restored after
        proc = in_process(main, "--steps", "1", *argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert blocker.read_text() == "keep"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_model_help_names_every_built_in_model(in_process):
    from llm.model import available_models

    proc = in_process(main, "--help")
    assert proc.returncode == 0, proc.stderr
    flat = " ".join(proc.stdout.split())
    assert all(name in flat for name in available_models())
    assert "smollm2-135m" in flat
