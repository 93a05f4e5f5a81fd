"""sandbox.experiments.pool: a failing run stops new ones, in both of imap_unordered's modes;
signals_deferred acts on a signal once, at the end of the outermost block, and leaves an ignored
signal ignored."""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.experiments.pool import imap_unordered
from sandbox.experiments.signals import Terminated, signals_deferred

ROOT = Path(__file__).resolve().parents[1]
JOBS = [("a", (6, 2)), ("b", (1, 0)), ("c", (8, 2))]  # b divides by zero


def test_all_at_once_a_failing_run_is_raised_naming_it_and_the_others_are_right():
    seen = []
    with pytest.raises(RuntimeError, match=r"run b failed: ZeroDivisionError") as info:
        for key, result in imap_unordered(operator.truediv, JOBS, 2):
            seen.append((key, result))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert set(seen) <= {("a", 3.0), ("c", 4.0)}  # c ran only if it had started before b failed


def test_one_at_a_time_nothing_starts_after_a_failure_or_after_admit_says_no():
    seen = []
    with pytest.raises(RuntimeError, match=r"run b failed"):
        for key, result in imap_unordered(operator.truediv, JOBS, 1, admit=lambda key: True):
            seen.append((key, result))
    assert seen == [("a", 3.0)]  # c was never submitted
    ok = [("a", (6, 2)), ("c", (8, 2)), ("b", (1, 0))]
    admitted = list(imap_unordered(operator.truediv, ok, 1, admit=lambda key: key != "b"))
    assert admitted == [("a", 3.0), ("c", 4.0)]  # b, refused, never ran


def test_a_signal_in_nested_deferred_blocks_acts_once_at_the_outermost_end():
    steps = []
    with pytest.raises(KeyboardInterrupt), signals_deferred():
        with signals_deferred():  # an atomic write inside a job's deferred writes
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("inner")
        steps.append("outer")  # the inner block's end did not act on it
    assert steps == ["inner", "outer"]
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated, match="SIGTERM"), signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before  # restored


def test_an_ignored_signal_stays_ignored_through_a_deferred_block():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a pool worker
    try:
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_pool_worker_amid_a_deferred_block_dies_of_sigterm_at_once(tmp_path):
    """A worker's write (a figure, through the atomic write's deferred block) must not hold off
    _stop's SIGTERM: deferred, the worker turned it into an exception its pool loop survived,
    and the driver waited out the 20 s grace before SIGKILL."""
    marker = tmp_path / "in_block"
    code = (
        "import sys, time; from pathlib import Path; from sandbox.experiments import pool\n"
        "pool._worker_init()\n"
        "with pool.signals_deferred():\n"
        "    Path(sys.argv[1]).touch(); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(marker)], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    try:
        assert proc.wait(timeout=30) == -signal.SIGTERM  # killed by it, not at the block's end
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
