"""A double Ctrl-C on ``python -m llm.claims``, as a user meets it (issue 39): real SIGINTs to the
study's process group at several moments of a quick study (a toy unit, the llm unit in
calibration, the llm unit's checkpoint write, the claims step; the pool and the in-process path),
each followed by a second one, as the on-screen hint "(again to abort now)" invites.

Before the fix, a first Ctrl-C landing in the llm unit reached the pool worker too (``llm.train``
replaced the worker's ignored SIGINT with its own stop request), the second raised
``KeyboardInterrupt`` there and cut the driver's stop of its pool short: the driver's exit then
waited on a live worker for good (3 of 3 times in the llm calibration unit). Each case asserts an
exit within seconds with status 130 and no traceback, no process of the session left, no part or
temp file half-written, and a resume whose tables equal an uninterrupted study's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: every unit kind, the llm unit long enough (6 steps, a checkpoint each) to be cut mid-way
ARGV = [
    *["-m", "llm.claims", "--quick", "--rules", "dapo", "nsr_dapo", "--no-progress"],
    *["--llm-steps", "6", "--llm-checkpoint-every", "1"],
]
#: (first Ctrl-C once this glob matches under the study folder, seconds to the second, workers)
MOMENTS = {
    "toy unit": ("parts/calib__bandit_exact__*", 0.3, "2"),
    "llm unit": ("llm_scratch/*", 0.5, "2"),
    "llm checkpoint": ("llm_scratch/*/checkpoint.pt*", 0.02, "2"),
    "claims step": ("parts/study__*", 0.3, "2"),
    "llm unit, in process": ("llm_scratch/*", 0.5, "1"),
    "llm unit, one Ctrl-C": ("llm_scratch/*", None, "2"),
}
#: seconds from the last Ctrl-C to the exit (measured: 1-3 s on 2 idle cores); one Ctrl-C in the
#: llm unit took 21 s before (the stopped worker waited out the pool's 20 s grace)
EXIT_S = 12


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _study(out: Path, workers: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *ARGV, "--out", str(out), "--workers", workers],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same study, uninterrupted."""
    out = tmp_path_factory.mktemp("reference")
    done = _study(out, "2")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _start(out: Path, workers: str) -> subprocess.Popen:
    """The study in its own session (a terminal's process group), stderr piped."""
    return subprocess.Popen(
        [sys.executable, *ARGV, "--out", str(out), "--workers", workers],
        cwd=ROOT,
        env=_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _session_left(sid: int) -> list[psutil.Process]:
    left = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and os.getsid(process.pid) == sid:
                left.append(process)
        except (OSError, psutil.Error):
            continue
    return left


def _double_ctrl_c(out: Path, trigger: str, gap: float | None, workers: str) -> tuple[int, str]:
    """Start the study, Ctrl-C once ``trigger`` matches, again ``gap`` s later (None: once); the
    exit status and stderr, once it exited within :data:`EXIT_S` of the last Ctrl-C."""
    proc = _start(out, workers)
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob(trigger)):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{trigger} never appeared (exit {proc.returncode})")
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGINT)  # the whole process group, as a terminal's Ctrl-C
        if gap is not None:
            time.sleep(gap)  # two at once would be one: the kernel does not queue them
            os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {EXIT_S} s after the last Ctrl-C")
        time.sleep(0.5)
        left = _session_left(proc.pid)
        assert not left, f"left behind: {[(p.pid, p.cmdline()) for p in left]}"
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_exits_at_once_and_the_study_resumes_exactly(tmp_path, reference, moment):
    trigger, gap, workers = MOMENTS[moment]
    out = tmp_path / "study"
    status, err = _double_ctrl_c(out, trigger, gap, workers)
    assert status == 130, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGINT)"), err[-3000:]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp") and "parts" in p.parts]
    for part in (out / "parts").glob("*.parquet"):
        pd.read_parquet(part)  # whole

    resumed = _study(out, workers)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not list(out.rglob("*.tmp"))
    for table in ("ledger.csv", "scores.csv", "calibration.csv"):
        pd.testing.assert_frame_equal(
            pd.read_csv(out / table), pd.read_csv(reference / table), obj=table
        )


@pytest.mark.parametrize("delay", [0.3, 1.0, 2.0])
def test_ctrl_c_twice_during_start_up_is_one_line(tmp_path, delay):
    """Ctrl-C twice while the command imports torch and the study (before: an import's
    KeyboardInterrupt traceback and status -2): one line, status 130, nothing left running."""
    proc = _start(tmp_path / "s", "2")
    try:
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=EXIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # 130, or -2 (killed by SIGINT: what a shell also reports as 130) after the one line: seen
    # once in a quiet fresh-clone CI at delay 1.0 with the line printed and no traceback; the
    # race that turns the answered Ctrl-C into a SIGINT exit is not found yet (issue 40's note)
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGINT)"), err[-3000:]
    time.sleep(0.5)
    assert not _session_left(proc.pid)
