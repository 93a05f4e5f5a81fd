"""llm.checkpoint and llm.train's resume: resume equals an uninterrupted run bit for bit; a run
refuses to overwrite a checkpoint or to resume with other settings; SIGTERM and Ctrl-C write a
checkpoint first (a second Ctrl-C aborts at once). CPU, the tiny Llama built in code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("transformers")

from test_llm_train_loop import config, strip_timing

from llm.checkpoint import model_state
from llm.train import TrainConfig, main, train

# ------------------------------------------------------------------------------------------
# resume
# ------------------------------------------------------------------------------------------


def test_resume_equals_uninterrupted(tmp_path):
    kw = dict(objective="dapo", epochs=2, lr_schedule="cosine")
    full = train(config(tmp_path, "full", steps=4, **kw))
    first = train(config(tmp_path, "part", steps=4, checkpoint_every=2, **kw), stop_after=2)
    rest = train(config(tmp_path, "part", steps=4, resume=True, **kw))
    assert [r["step"] for r in first + rest] == [1, 2, 3, 4]
    assert strip_timing(first + rest) == strip_timing(full)
    a, b = model_state(str(tmp_path / "full")), model_state(str(tmp_path / "part"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    logged = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in logged] == [1, 2, 3, 4]


def test_resume_says_the_step_it_resumes_from(tmp_path, capsys):
    """Issue 39: ``--resume`` went on silently; one line on stderr says from where."""
    train(config(tmp_path, steps=3), stop_after=1)
    capsys.readouterr()
    rows = train(config(tmp_path, steps=3, resume=True))
    assert [r["step"] for r in rows] == [2, 3]
    out = tmp_path / "run"
    assert capsys.readouterr().err == f"resuming from step 1 of 3 in {out}\n"


def test_existing_checkpoint_needs_resume(tmp_path):
    train(config(tmp_path, steps=1))
    with pytest.raises(ValueError, match="--resume"):
        train(config(tmp_path, steps=1))


def test_resume_checks_the_config(tmp_path):
    train(config(tmp_path, steps=1, objective="dapo"))
    with pytest.raises(ValueError, match=r"--lr 0\.01 -> 0\.5; --objective 'dapo' -> 'cispo'"):
        train(config(tmp_path, steps=2, resume=True, objective="cispo", lr=0.5))
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1  # nothing ran
    # more steps, other reporting: the same experiment, accepted
    rows = train(config(tmp_path, steps=2, resume=True, objective="dapo", eval_every=2))
    assert [r["step"] for r in rows] == [2]
    rows = train(
        config(tmp_path, steps=3, resume=True, objective="cispo", allow_config_change=True)
    )
    assert [r["step"] for r in rows] == [3]
    # with --data, turning eval on holds rows out of training: that is a different run
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i} 1", "answer": "1"}) + "\n" for i in range(8))
    )
    kw = dict(task=None, data=str(data), eval_prompts=2)
    train(config(tmp_path, "file", steps=1, **kw))
    with pytest.raises(ValueError, match="held out for eval 0 -> 2"):
        train(config(tmp_path, "file", steps=2, resume=True, eval_every=1, **kw))


def test_resume_without_a_checkpoint_or_with_nothing_left_fails(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--resume: no checkpoint at .*typo.*check --out"):
        train(config(tmp_path, "typo", steps=1, resume=True))
    assert not (tmp_path / "typo" / "metrics.jsonl").exists()
    train(config(tmp_path, steps=2))
    with pytest.raises(ValueError, match=r"is at step 2, not before --steps 1: nothing to do"):
        train(config(tmp_path, steps=1, resume=True))
    with pytest.raises(SystemExit) as exc:  # and from the command line: exit status 2
        main(
            [
                "--model",
                "tiny",
                "--task",
                "parity",
                "--task-knobs",
                "length=2",
                "--steps",
                "2",
                "--prompts-per-step",
                "4",
                "--group-size",
                "4",
                "--max-new-tokens",
                "8",
                "--prompts-per-call",
                "1",
                "--lr",
                "1e-2",
                "--no-save-model",
                "--no-progress",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "run"),
                "--resume",
            ]
        )
    assert exc.value.code == 2 and "nothing to do" in capsys.readouterr().err


def test_resume_accepts_a_task_knob_given_at_its_default(tmp_path):
    train(config(tmp_path, steps=1, task="mod_arith", task_knobs={}))
    rows = train(
        config(tmp_path, steps=2, resume=True, task="mod_arith", task_knobs={"modulus": 7})
    )
    assert [r["step"] for r in rows] == [2]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["task_knobs"]["modulus"] == 7 and saved["steps"] == 2


# ------------------------------------------------------------------------------------------
# signals
# ------------------------------------------------------------------------------------------


def test_sigterm_writes_a_checkpoint(tmp_path):
    out = tmp_path / "sig"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "llm.train",
        "--model",
        "tiny",
        "--steps",
        "10000",
        "--lr",
        "1e-3",
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "4",
        "--no-progress",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics, deadline = out / "metrics.jsonl", time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()[-2000:]
    steps = len(metrics.read_text().splitlines())
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == steps >= 1


def _start_and_wait_for_a_step(out, extra=()):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "llm.train",
        "--model",
        "tiny",
        "--steps",
        "10000",
        "--lr",
        "1e-3",
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "4",
        "--no-progress",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics, deadline = out / "metrics.jsonl", time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n")):
        time.sleep(0.2)
    return proc, metrics


def _resume_one_more_step(out, done):
    """``--resume`` of the interrupted command's run for one more step: it continues from the
    checkpoint's step ``done``."""
    rows = train(
        TrainConfig(
            model="tiny",
            steps=done + 1,
            lr=1e-3,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            progress=False,
            device="cpu",
            save_model=False,
            out=str(out),
            resume=True,
        )
    )
    assert [r["step"] for r in rows] == [done + 1]


def test_ctrl_c_writes_a_checkpoint_and_resume_continues(tmp_path):
    """SIGINT (Ctrl-C) is treated like SIGTERM: the step finishes, a checkpoint is written, exit
    130; --resume then continues from the checkpoint's step."""
    out = tmp_path / "int"
    proc, metrics = _start_and_wait_for_a_step(out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "SIGINT: checkpoint written" in err.decode() and "Traceback" not in err.decode()
    assert "run the same command again with --resume to resume" in err.decode()
    steps = len(metrics.read_text().splitlines())
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == steps >= 1
    _resume_one_more_step(out, steps)


def test_second_ctrl_c_aborts_at_once(tmp_path):
    """Two Ctrl-C: the second aborts in the middle of the step (no waiting), with the command's
    one line and exit 130, not a KeyboardInterrupt traceback (issue 39: 35 lines)."""
    out = tmp_path / "int2"
    proc, _ = _start_and_wait_for_a_step(
        out, ["--prompts-per-step", "64", "--group-size", "8", "--max-new-tokens", "32"]
    )
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    err = err.decode()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGINT): aborted;"), err


def test_a_second_ctrl_c_amid_the_checkpoint_write_keeps_the_last_one(tmp_path):
    """The second Ctrl-C while a checkpoint is written (``--checkpoint-every 1``: each step's
    write is where the user's Ctrl-C most often lands): one line, exit 130, no temp file, and the
    checkpoint left (the step before, or the new one whole) resumes."""
    out = tmp_path / "int3"
    proc, _ = _start_and_wait_for_a_step(out, ["--checkpoint-every", "1"])
    tmp, deadline = out / "checkpoint.pt.tmp", time.time() + 60
    while not tmp.exists() and time.time() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)  # two signals at once would be one: the kernel does not queue them
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    err = err.decode()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert not tmp.exists()
    step = torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    _resume_one_more_step(out, step)
