"""The process pool of ``compare`` and ``sweep``: safe after autograd, interruptible, no orphans.

* **Start method.** Workers come from a ``forkserver`` (a clean process that imported the
  experiment modules once), never from ``fork`` of a driver that may have run autograd already:
  that fails with "Unable to handle autograd's threading in combination with fork-based
  multiprocessing". Workers import only the experiment modules, not plotting or the CLI.
* **Interruption.** Workers ignore SIGINT (Ctrl-C reaches the whole process group; a worker
  would report it as its run's result and go on). The driver takes it (SIGTERM becomes
  :class:`~.signals.Terminated`, a ``KeyboardInterrupt``), cancels what has not started,
  terminates the running workers (:func:`_stop`) and re-raises, so the caller can print a resume
  hint. A run that takes SIGTERM to finish its step (``llm.train``: a checkpoint first) ends its
  worker once it has; a second Ctrl-C during that grace kills every worker at once. A worker
  writes its run's results itself (:func:`.planner.compute_parts`): nothing finished is lost,
  nothing half-written.
* **No orphans.** On Linux each worker asks the kernel for SIGKILL when its parent dies
  (``PR_SET_PDEATHSIG``), so even a SIGKILL of the driver leaves no worker behind.
* **No hang on stop.** A worker's result (or exception) goes back through a file, the pool's
  pipe carries only its name (:func:`_through_file`): a worker stopped amid sending a large result
  down the pipe left the pool's reader waiting forever for the rest, so the driver hung in its
  shutdown after a SIGTERM (reproduced with a 300 MB result).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from . import signals
from .signals import signals_deferred, terminate_raises

#: Modules the forkserver imports once, so each worker starts with them loaded: torch imports
#: torch._dynamo and sympy lazily, 2-5 s on a busy 2-core machine, once here, not per worker.
PRELOAD = (
    "sandbox.experiments.compare",
    "sandbox.experiments.sweep",
    "torch._dynamo",
    "torch.fx.experimental.symbolic_shapes",
)

#: A ``-W`` option for the resource tracker: its clean-up after interrupted workers is not news.
QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def _worker_init() -> None:
    signals.in_worker = True  # no signals_deferred here: _stop's SIGTERM must end a worker at once
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):  # SIGKILL this worker when its parent dies
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # pragma: no cover - exotic libc
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    import torch

    torch.set_num_threads(1)  # small tensors: threads only contend with the other workers


class WorkerTraceback(Exception):
    """The traceback, in the worker, of an exception a run raised (its ``__cause__``)."""

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


def _through_file(folder: str, fn: Callable[..., Any], *args: Any) -> str:
    """In a worker: ``fn(*args)``'s result, or its exception and traceback, pickled to a file in
    ``folder``; its path is what goes down the pool's pipe. A message that short is written
    whole or not at all, so a worker stopped amid it (:func:`_stop`) cannot leave the pool's
    reader waiting for the rest of a large result: that hung the driver's shutdown."""
    stopped = None  # the exit status of a run that ended on _stop's SIGTERM
    try:
        outcome = (True, fn(*args))
    except SystemExit as exc:  # llm.train: SIGTERM finished its step and wrote a checkpoint
        if exc.code == 128 + signal.SIGTERM:
            stopped = exc.code
        outcome = (False, (RuntimeError(f"the run exited: {exc.code}"), traceback.format_exc()))
    except Exception as exc:
        outcome = (False, (exc, traceback.format_exc()))
    if stopped is not None:  # asked to end: end now, not back to the pool's queue for more work
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stopped)
    fd, path = tempfile.mkstemp(dir=folder, suffix=".pickle")
    with os.fdopen(fd, "wb") as f:
        try:
            pickle.dump(outcome, f, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # a result or exception that cannot be pickled
            f.seek(0)
            f.truncate()
            unpicklable = RuntimeError(f"its outcome cannot be pickled: {exc!r}")
            pickle.dump((False, (unpicklable, traceback.format_exc())), f)
    return path


def _outcome(path: str) -> Any:
    """In the driver: the result :func:`_through_file` wrote (the file removed), or its
    exception raised, with the worker's traceback as ``__cause__``."""
    with open(path, "rb") as f:
        ok, value = pickle.load(f)  # our own worker's file, in our own temp folder
    os.unlink(path)
    if ok:
        return value
    exc, text = value
    exc.__cause__ = WorkerTraceback(text)
    raise exc


def _context() -> mp.context.BaseContext:
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        return ctx
    return mp.get_context("spawn")  # pragma: no cover - macOS / Windows


def start_forkserver() -> None:
    """Start the forkserver now (it imports :data:`PRELOAD`), overlapping the caller's imports
    (the CLI calls it first thing when it will use a pool). It starts with SIGINT ignored, which
    it and every worker it forks inherit: a Ctrl-C during its imports, or in a worker before
    ``_worker_init`` ran, reaches only the driver (no worker traceback, no leaked semaphore)."""
    if _context().get_start_method() != "forkserver":
        return  # pragma: no cover - macOS / Windows
    from multiprocessing import forkserver

    # Workers ended mid-run leave the queues' semaphores to the resource tracker, which unlinks
    # them at exit, then warns "leaked semaphore objects"; it takes this process's -W options.
    if QUIET_TRACKER not in sys.warnoptions:
        sys.warnoptions.append(QUIET_TRACKER)

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


#: True while a command runs on its process's own command line (:func:`own_command`)
_own_command = False


@contextlib.contextmanager
def own_command(own: bool) -> Iterator[None]:
    """Within the block the command is the process's own (``own``; False where ``main(argv)`` is
    called in-process, e.g. by the tests): :func:`answer_interrupt` may change its signals."""
    global _own_command
    before, _own_command = _own_command, own
    try:
        yield
    finally:
        _own_command = before


def answer_interrupt(line: str) -> None:
    """Print the driver's one line about an interrupt, having first set SIGINT to ignored where
    the command is its process's own (:func:`own_command`): the interrupt is answered and the
    process exits, so a second Ctrl-C changes nothing. Else it would land in the line's print or
    the exit's clean-up (a ``KeyboardInterrupt`` traceback) or, once finalization has reset the
    handler to the default, kill the process (-2 for the 130 it reports). Any pool worker still
    alive is ended first (:func:`end_live_workers`), so the line is the last one printed."""
    if _own_command and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_live_workers()
    print(line, file=sys.stderr, flush=True)


#: Pools of :func:`imap_unordered` not yet shut down or stopped: a second Ctrl-C that lands
#: before or amid :func:`_stop` (its SIGTERM sent, the wait cut) leaves workers that finish their
#: step and print after the driver's last line (a fresh-clone CI run, 2026-11-29).
_LIVE_POOLS: set[ProcessPoolExecutor] = set()


def end_live_workers() -> None:
    """SIGKILL every worker of a pool whose stop an interrupt cut short, and wait for each (at
    most 5 s): a worker's checkpoint writes are atomic, so a cut one keeps the checkpoint before."""
    with signals_deferred():
        for pool in list(_LIVE_POOLS):
            _kill(list((getattr(pool, "_processes", None) or {}).values()))
            pool.shutdown(wait=False, cancel_futures=True)
            _LIVE_POOLS.discard(pool)


@contextlib.contextmanager
def command_imports(name: str) -> Iterator[None]:
    """Around a command module's own imports (torch and the study: seconds on a busy 2-core
    machine): where the module runs as the process's command (``name`` is ``"__main__"``), a
    Ctrl-C amid them ends it with the one line and status 130, not an import's traceback."""
    try:
        yield
    except KeyboardInterrupt:
        if name != "__main__":
            raise
        with own_command(True):
            answer_interrupt("\ninterrupted (SIGINT) before any run started")
        raise SystemExit(128 + signal.SIGINT) from None


#: Seconds the running workers get after SIGTERM before SIGKILL: time for a run that handles
#: SIGTERM (``llm.train`` finishes its step and writes a checkpoint, atomically) to end.
STOP_GRACE_S = 20.0


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel pending work and end the running workers (SIGTERM; SIGKILL after
    :data:`STOP_GRACE_S`)."""
    # Workers first, then the executor, whose shutdown releases the queues' semaphores: the other
    # order can unlink a semaphore a starting worker still unpickles, or leak it to the tracker.
    processes = list(getattr(pool, "_processes", {}).values())
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        for process in processes:
            process.join(timeout=max(deadline - time.monotonic(), 0.1))
    finally:
        # after the grace, or at once on a second Ctrl-C / SIGTERM amid it ("again to abort
        # now"), which propagates once this is done: a stop abandoned here left the pool's
        # shutdown, at the driver's exit, waiting on a live worker for good (issue 39)
        with signals_deferred():
            _kill(processes)
            pool.shutdown(wait=True, cancel_futures=True)


def _kill(processes: list[Any]) -> None:
    """SIGKILL each of ``processes`` still alive and wait for it (at most 5 s each)."""
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


class DeadlineReached(Exception):
    """:func:`imap_unordered`'s ``deadline`` passed; ``keys``: the runs it stopped (:func:`_stop`)."""

    def __init__(self, keys: list[Any]) -> None:
        super().__init__(f"deadline reached; stopped {len(keys)} running runs")
        self.keys = keys


def imap_unordered(
    fn: Callable[..., Any],
    jobs: Iterable[tuple[Any, tuple[Any, ...]]],
    workers: int,
    error: type[Exception] = RuntimeError,
    *,
    admit: Callable[[Any], bool] | None = None,
    deadline: float | None = None,
) -> Iterator[tuple[Any, Any]]:
    """Run ``fn(*args)`` (a module-level function) for each ``(key, args)`` in ``workers``
    processes; yield ``(key, result)`` as runs finish.

    The first failing run stops new runs from starting; the runs going finish and are yielded,
    then the failure is raised as ``error`` naming the key (``__cause__``: the worker's
    exception). Ctrl-C, SIGTERM or an exception in the caller's loop cancel everything at once.
    ``admit(key)``: a run is submitted only when a worker is free and ``admit`` says yes then
    (after the caller took the previous result); the first no starts nothing more. ``deadline``
    (a :func:`time.monotonic` time): runs still going then are stopped as on SIGTERM
    (:func:`_stop`) and :class:`DeadlineReached` is raised."""
    start_forkserver()  # a no-op once running; started here with SIGINT ignored if not yet
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=_worker_init)
    _LIVE_POOLS.add(pool)
    folder, finished = tempfile.mkdtemp(prefix="clip-sandbox-pool-"), False
    try:
        with terminate_raises():
            window = None if admit is None and deadline is None else workers
            yield from _submitted(pool, fn, jobs, window, error, admit, deadline, folder)
            finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            _stop(pool)
        _LIVE_POOLS.discard(pool)  # not reached if an interrupt cut the stop: end_live_workers
        shutil.rmtree(folder, ignore_errors=True)


#: Seconds the driver waits for a finished run with signals deferred: the longest a Ctrl-C or
#: SIGTERM waits to act.
POLL_S = 0.2


def _first_done(running: dict[Future, Any], deadline: float | None) -> set[Future]:
    """The runs finished once one is, or none once ``deadline`` passed. Each wait lasts at most
    :data:`POLL_S` with signals deferred: a signal inside ``concurrent.futures.wait`` while it
    takes the futures' locks could leave one held, and the pool's shutdown waiting on it."""
    while True:
        timeout = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        with signals_deferred():
            done, _ = wait(running, timeout=max(timeout, 0.0), return_when=FIRST_COMPLETED)
        if done or (deadline is not None and time.monotonic() >= deadline):
            return done


def _submitted(pool, fn, jobs, window, error, admit, deadline, folder) -> Iterator[tuple[Any, Any]]:
    """:func:`imap_unordered`'s loop: at most ``window`` runs submitted at a time, each once
    ``admit`` allows it; ``None``: every run at once (the workers never wait for the caller)."""
    waiting = iter(jobs)
    running: dict[Future, Any] = {}
    closed = False  # admit said no, a run failed, or every job was submitted
    failure: tuple[Any, BaseException] | None = None
    while True:
        with signals_deferred():  # the workers registered before an interrupt acts
            while not closed and (window is None or len(running) < window):
                nxt = next(waiting, None)
                if nxt is None or (admit is not None and not admit(nxt[0])):
                    closed = True
                    break
                running[pool.submit(_through_file, folder, fn, *nxt[1])] = nxt[0]
        if not running:
            break
        done = _first_done(running, deadline)
        if not done:  # the deadline: stop what is going (the caller's finally calls _stop)
            raise DeadlineReached(list(running.values()))
        for future in done:
            key = running.pop(future)
            if future.cancelled():
                continue
            try:
                result = _outcome(future.result())
            except Exception as exc:
                if failure is None:  # stop starting new runs; the ones running finish
                    failure, closed = (key, exc), True
                    for other in running:
                        other.cancel()
                continue
            yield key, result
    if failure is not None:
        key, exc = failure
        raise error(f"run {key} failed: {exc!r}") from exc
