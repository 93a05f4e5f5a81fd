"""sandbox.experiments.pool.end_live_workers: a pool whose stop an interrupt cut short has its
workers ended before the driver's last line (answer_interrupt), so none prints after it."""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor

from sandbox.experiments import pool as P


def test_an_unstopped_pools_workers_are_ended_before_the_answer(capsys):
    executor = ProcessPoolExecutor(
        max_workers=1, mp_context=P._context(), initializer=P._worker_init
    )
    P._LIVE_POOLS.add(executor)
    executor.submit(time.sleep, 60)
    deadline = time.monotonic() + 30
    while not executor._processes and time.monotonic() < deadline:  # the worker has started
        time.sleep(0.05)
    workers = list(executor._processes.values())
    assert workers and all(w.is_alive() for w in workers)
    P.answer_interrupt("interrupted (SIGINT): test")
    assert not any(w.is_alive() for w in workers) and executor not in P._LIVE_POOLS
    assert capsys.readouterr().err == "interrupted (SIGINT): test\n"
    P.answer_interrupt("again")  # nothing left to end; a shut-down pool is not touched
