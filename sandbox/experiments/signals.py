"""Signals as the commands take them: SIGTERM raised like Ctrl-C, and blocks of work (an atomic
write, a pool submit, an import) that a signal must not cut, acting once they end.

The storage (:mod:`.results`), the pool (:mod:`.pool`) and the commands use these; none of them
needs the others for it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) received by the driver; handled like Ctrl-C, exit status 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread (as
    SIGINT raises KeyboardInterrupt), so ``finally`` blocks and the pool's clean-up run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


#: Whether a :func:`signals_deferred` block is open (an inner one then adds nothing: it must not
#: act on a signal amid the outer block's work), and whether this process is a pool worker (its
#: pool sets it, :mod:`.pool`).
_deferring = in_worker = False


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP that arrive within the block act when it ends (as
    ``KeyboardInterrupt`` or :class:`Terminated`), for work an interrupt would break: an import
    of sympy (broken for the process if interrupted halfway), a file's atomic write (a temp file
    left behind), or a submit to the pool, which starts a worker: interrupted, it would leave a
    worker the pool does not know yet (a FileNotFoundError traceback in it); deferred, the pool's
    stop finds and ends every worker. Blocks nest (the outermost acts); a signal the process
    ignores stays ignored; a pool worker defers nothing (the pool's stop, SIGTERM, must end it at
    once; its part writes hold SIGTERM back instead, :func:`sigterm_held`)."""
    global _deferring
    if _deferring or in_worker or threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    signals = [
        sig
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(sig) not in (signal.SIG_IGN, None)
    ]
    previous = {
        sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in signals
    }
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
        for sig, old in previous.items():
            signal.signal(sig, old)
    if pending:
        signum = pending[0]
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def sigterm_held() -> Iterator[None]:
    """SIGTERM held back by the operating system within the block (main thread only; it acts,
    as its handler says, when the block ends): a pool worker's writes of its job's parts, which
    take milliseconds, are then all on disk or none when a stop ends it (:func:`signals_deferred`
    defers nothing in a worker, so a stop ends a worker's long work at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
