import contextlib
import io
import os
import signal
import subprocess
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# A suite started in the background of a non-interactive shell (`nohup ... &`) inherits SIGINT
# ignored, and so would every command a test starts: the real-Ctrl-C tests would send signals the
# commands never see (each then runs into its timeout). Commands started from here get SIGINT's
# default again (a Python-level handler becomes SIG_DFL across exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One intra-op thread for the whole test session: the tests use small tensors, and under
    pytest-xdist the workers already use every core (oversubscribed OpenMP threads made some
    modules 5-10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@dataclass(frozen=True)
class Finished:
    """A command run in-process: what ``subprocess.run`` would give (``returncode``, ``stdout``,
    ``stderr``), so the same assertions read both."""

    returncode: int
    stdout: str
    stderr: str


#: Warnings a ``python -m`` command does not print (Python's default filters); any other warning
#: would be on the real command's stderr, so an in-process call that raises one fails.
UNSHOWN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def run_main(main: Callable[[Sequence[str]], int], *argv: str) -> Finished:
    """A command's ``main(argv)`` run in this process as its ``python -m`` runs it (exit status
    from the return value or ``SystemExit``, stdout and stderr captured); it fails on a warning the
    real command would print. For tests whose finding is the command's output, exit status or
    files, not the process (signals, interpreter start): each call saves the ~3 s of a fresh
    interpreter's imports. Module fixtures call it; tests take :func:`in_process`."""
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's errors and --help
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    shown = [
        f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, UNSHOWN)
    ]
    assert not shown, shown  # the real command would print them
    return Finished(code, out.getvalue(), err.getvalue())


@pytest.fixture
def in_process() -> Callable[..., Finished]:
    """``in_process(main, *argv)``: :func:`run_main`."""
    return run_main


ROOT = Path(__file__).resolve().parents[1]


def offline_env() -> dict[str, str]:
    """The environment of a command a test starts: this checkout importable, one torch thread,
    the Hugging Face hub offline."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}


def signal_when(
    proc: subprocess.Popen, ready: Callable[[], bool], signum: int, wait: float = 180
) -> str:
    """Send ``signum`` to ``proc`` once ``ready()`` (polled every 0.1 s; the test fails if the
    command exits first or ``wait`` seconds pass), then wait for it to exit; its stderr."""
    deadline = time.monotonic() + wait
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"not ready (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.1)
    proc.send_signal(signum)
    return proc.communicate(timeout=120)[1]


@pytest.fixture
def local_ray():
    """A local Ray instance of 2 CPUs for the test (skipped without Ray, or where one does not
    start within 120 s: a sandbox without /dev/shm, say), shut down after it."""
    ray = pytest.importorskip("ray")
    import signal as signals

    def give_up(signum, frame):
        raise TimeoutError("no local Ray instance within 120 s")

    previous = signals.signal(signals.SIGALRM, give_up)
    signals.alarm(120)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as exc:  # Ray installed but unable to start here
        pytest.skip(f"a local Ray instance did not start: {exc!r}")
    finally:
        signals.alarm(0)
        signals.signal(signals.SIGALRM, previous)
    try:
        yield ray
    finally:
        ray.shutdown()
