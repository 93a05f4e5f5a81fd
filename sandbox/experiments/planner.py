"""The one planner of compare, sweep and the claims study: a results folder that resumes.

:class:`RunFolder` owns what every orchestrator needs around its runs: the folder checked before
any work, the record of the command's settings, the "N of M runs already done" line, the progress
bar and the pool (here, :mod:`.pool`, or Ray). Each job writes its own parts where it runs
(:func:`compute_parts`) and returns only their names: the driver never writes a result. A part is
named by what made it (:attr:`.runs.RunSpec.part`), so a changed setting names other parts: a
command computes what is missing and never reads a run of other settings. An orchestrator plans
:class:`Job` s and analyses the parts; its worker function runs :func:`~.runs.run_specs`, never a
trainer.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.configs import check_int

from .pool import DeadlineReached, answer_interrupt
from .results import (
    git_commit,
    prepare_out_dir,
    record_run,
    remove_temp_files,
    write_parquet_atomic,
    write_text,
)
from .signals import signals_deferred, sigterm_held

BACKENDS = ("local", "ray")
RAY_HINT = "pip install 'clip-sandbox[ray]' (or pip install ray)"
#: A Ray task writes its parts where the driver reads them: a multi-node cluster needs the folder on
#: a filesystem every node mounts at one path (as Ray Train asks of its ``storage_path``).
SHARED_DISK = (
    "--backend ray: run {key} wrote its parts on another node; --out must be a folder every node "
    "of the cluster mounts at the same path ({folder}: NFS or another shared filesystem)"
)


@dataclass(frozen=True)
class Job:
    """One unit of work: ``fn(*args)`` returns one frame per name in ``parts``."""

    key: str
    parts: tuple[str, ...]
    args: tuple[Any, ...]
    #: jobs of one ``cost`` class take about as long; :meth:`RunFolder.run`'s ``deadline``
    #: expects the longest one of its class seen so far, else ``estimate`` seconds
    cost: str = ""
    estimate: float = 0.0

    def __str__(self) -> str:
        return self.key


#: How to resume after an interruption, for every command that resumes by being run again.
RESUME = "run the same command again to resume"


def interrupted_line(signum: int, kept: str, resume: str = RESUME) -> str:
    """The line a command prints when a signal stops it: what it kept and how to go on
    (``resume``: ``llm.train`` resumes with ``--resume``)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"interrupted ({name}): {kept}; {resume}"


def answer_signal(stop: int | KeyboardInterrupt, kept: str) -> int:
    """A command's answer to the signal that stopped it (``stop``: its number, or the
    ``KeyboardInterrupt`` it raised: Ctrl-C's, or :class:`~.signals.Terminated` for SIGTERM): its
    :func:`interrupted_line` printed once (:func:`~.pool.answer_interrupt`), and the exit status
    128 + the signal's number."""
    if isinstance(stop, KeyboardInterrupt):
        stop = getattr(stop, "signum", signal.SIGINT)
    signum = int(stop)
    answer_interrupt("\n" + interrupted_line(signum, kept))
    return 128 + signum


def check_workers(workers: Any) -> None:
    """``workers``: None (the default) or an integer >= 1."""
    if workers is not None:
        check_int("workers", workers)


def check_backend(backend: str, workers: Any = None, deadline: float | None = None) -> None:
    """Before any work: ``backend`` is one of :data:`BACKENDS`, and Ray is installed for
    ``ray``; ``workers`` as :func:`check_workers` wants; a ``deadline`` (a time budget) only on
    the local backend. Else a one-line ``ValueError``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_workers(workers)
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError(f"--backend ray needs Ray: {RAY_HINT}")
    if deadline is not None and backend != "local":
        raise ValueError(
            f"deadline (a time budget): only with backend='local' (a {backend} task is not "
            "stopped at a deadline with its checkpoint)"
        )


class RunFolder:
    """A results folder ``out`` with ``parts/``, checked writable on construction
    (:func:`~.results.prepare_out_dir`); ``record`` (a JSON file in it) is then written with
    ``contents``, the settings of this command (the folder's tables are this command's).
    ``force``: every part is computed again. ``device``: where the runs compute, for the
    folder's provenance (:func:`~.results.record_run`)."""

    def __init__(
        self,
        out: str | Path,
        contents: Mapping[str, Any],
        *,
        record: str = "config.json",
        force: bool = False,
        device: str = "cpu",
    ) -> None:
        self.out = prepare_out_dir(out)
        self.parts = self.out / "parts"
        remove_temp_files(self.parts)
        write_text(json.dumps(contents, indent=2, default=str), self.out / record)
        self.force = force
        self.device = device
        self._fresh = not any(self.parts.glob("*.parquet"))  # earlier runs' entries are stale
        self.code = git_commit()  # the code that computes: a commit made while it runs is not
        self.longest: dict[str, float] = {}  # seconds of the longest job of each cost class
        self.stopped: list[Job] = []  # jobs a deadline stopped while they ran

    def expected(self, job: Job) -> float:
        """Seconds ``job`` is expected to take: the longest job of its cost class run by this
        folder's :meth:`run` calls so far; before one has, its own ``estimate`` or the longest
        job of any class, whichever is longer (0 before any: the first job starts)."""
        if job.cost in self.longest:
            return self.longest[job.cost]
        return max([job.estimate, *self.longest.values()])

    def done(self, part: str) -> bool:
        """A finished part that this run keeps (``force`` recomputes every part)."""
        return not self.force and (self.parts / part).exists()

    def run(
        self,
        fn: Callable[..., Sequence[Any]],
        jobs: Sequence[Job],
        *,
        total: int,
        workers: int | None = 1,
        progress: bool = True,
        desc: str = "runs",
        backend: str = "local",
        address: str | None = None,
        error: type[Exception] = RuntimeError,
        written: Callable[..., None] | None = None,
        threads: int | None = 1,
        deadline: float | None = None,
        gpus: float = 0.0,
    ) -> list[Job]:
        """Run ``jobs`` (``total`` parts wanted in all), each writing its parts as it finishes
        (:func:`compute_parts`); ``written(*job.args)`` (a module-level function) runs where the
        job ran once all its parts are on disk (e.g. removing the checkpoint a resumed run would
        read). ``backend``: one of :data:`BACKENDS` (:func:`check_backend`,
        before any run). ``threads``: torch's intra-op threads while jobs run in this process
        (:func:`_torch_threads`); pool workers always use 1. ``gpus``: the GPUs a Ray task asks
        for (Ray hides the GPUs from a task that asks for none).

        ``deadline`` (a :func:`time.monotonic` time; a time budget): jobs start in order while
        each is expected (:meth:`expected`) to end by it; the first that is not starts nothing
        more. Jobs still running at the deadline are stopped as on SIGTERM (the pool's clean
        path, :func:`.pool.imap_unordered`: an ``llm.train`` run checkpoints in its scratch
        folder and resumes from there), so with a deadline jobs always run in the pool (one
        worker for ``workers=1``). Returns the jobs left: not started or stopped (empty: all
        done); their parts are missing and a later call runs them."""
        from tqdm import tqdm

        check_backend(backend, workers, deadline)  # workers=0 would be the default pool size

        todo = sum(len(job.parts) for job in jobs)
        if todo < total:
            print(
                f"{total - todo} of {total} runs already done in {self.out}; running the "
                f"other {todo}",
                file=sys.stderr,
                flush=True,
            )
        bar = tqdm(total=total, initial=total - todo, disable=not progress, desc=desc, unit="run")
        before = self._stamps(jobs)
        started: dict[int, float] = {}  # id(job) -> time.monotonic() it was submitted
        left = {id(job): job for job in jobs}

        def admit(job: Job) -> bool:
            if time.monotonic() + self.expected(job) > deadline:
                return False
            started[id(job)] = time.monotonic()
            return True

        try:
            admit_now = None if deadline is None else admit
            stream = _stream(
                (fn, written), jobs, str(self.parts), workers, backend, address, error, threads,
                admit_now, deadline, gpus,
            )  # fmt: skip
            with contextlib.closing(stream):
                for job in stream:
                    bar.update(len(job.parts))
                    del left[id(job)]
                    if id(job) in started:
                        took = time.monotonic() - started[id(job)]
                        self.longest[job.cost] = max(self.longest.get(job.cost, 0.0), took)
                    bar.set_postfix_str(job.key, refresh=False)
        except DeadlineReached as exc:  # the running jobs were stopped (SIGTERM): left too
            self.stopped += exc.keys
        except error as exc:  # a part a job could not write: its own one-line error
            if isinstance(exc.__cause__, PartNotWritten):
                raise exc.__cause__ from None
            raise
        finally:
            bar.close()
            # the pool is stopped: a worker killed amid a write (a second Ctrl-C ends the stop's
            # grace at once) left its temp file, never a part
            remove_temp_files(self.parts)
            # also when interrupted: the parts its jobs wrote are the folder's now (a worker
            # stopped once its parts were on disk wrote them, though it returned nothing)
            count = sum(self._stamps(jobs)[p] != stamp for p, stamp in before.items())
            if count:
                record_run(
                    self.out,
                    device=self.device,
                    fresh=self._fresh,
                    code=self.code,
                    parts=count,
                    workers=workers,
                )
                self._fresh = False
        return list(left.values())

    def _stamps(self, jobs: Iterable[Job]) -> dict[str, tuple[int, int] | None]:
        """Each part of ``jobs``: its (size, mtime) on disk, None where it is missing."""
        out: dict[str, tuple[int, int] | None] = {}
        for part in (p for job in jobs for p in job.parts):
            try:
                stat = (self.parts / part).stat()
                out[part] = (stat.st_size, stat.st_mtime_ns)
            except OSError:
                out[part] = None
        return out


class PartNotWritten(ValueError):
    """A job's part could not be written (e.g. a file the system will not replace)."""


def compute_parts(
    fns: tuple[Callable[..., Sequence[Any]], Callable[..., None] | None],
    folder: str,
    parts: tuple[str, ...],
    *args: Any,
) -> tuple[str, ...]:
    """A job, where it runs (a pool worker, a Ray task, or this process): with ``fns`` =
    ``(fn, written)``, ``fn(*args)``'s frames written as ``parts`` in ``folder``, each atomically
    (:func:`~.results.write_parquet_atomic`), then ``written(*args)`` (None: nothing), all before
    a stop acts (SIGINT and SIGTERM deferred in this process; in a worker, whose stop is SIGTERM,
    held for the milliseconds the writes take); returns ``parts``. A part that cannot be written
    is a :class:`PartNotWritten` naming it."""
    fn, written = fns
    frames = fn(*args)
    with signals_deferred(), sigterm_held():
        for part, frame in zip(parts, frames, strict=True):
            try:
                write_parquet_atomic(frame, Path(folder) / part)
            except OSError as exc:
                why = exc.strerror or exc
                raise PartNotWritten(
                    f"cannot write the part {Path(folder) / part}: {why}"
                ) from None
        if written is not None:
            written(*args)
    return parts


def _stream(fns, jobs, folder, workers, backend, address, error, threads, admit, deadline, gpus):
    """Each job as it finishes (:func:`compute_parts` with ``fns``), its parts on disk: here, in
    the forkserver pool (always with a ``deadline``; ``admit`` goes with it), or on Ray (each
    task with ``gpus``)."""
    if not jobs:
        return _here(fns, jobs, folder, error, None)
    if backend == "ray":
        return _ray(fns, jobs, folder, workers, address, error, gpus)
    workers = max(1, min(workers or min(os.cpu_count() or 1, 4), len(jobs)))
    if workers == 1 and deadline is None:
        return _here(fns, jobs, folder, error, threads)
    from .pool import imap_unordered

    pairs = [(job, (fns, folder, job.parts, *job.args)) for job in jobs]
    runs = imap_unordered(compute_parts, pairs, workers, error, admit=admit, deadline=deadline)
    return _jobs_of(runs)


def _jobs_of(runs: Iterator[tuple[Job, Any]]) -> Iterator[Job]:
    """The jobs of the pool's ``(job, names)`` pairs; closing this closes the pool's stream (its
    stop) at once, not when the garbage collector finds it."""
    with contextlib.closing(runs):
        for job, _ in runs:
            yield job


def _here(fns, jobs, folder, error, threads) -> Iterator[Job]:
    with _torch_threads(threads):
        for job in jobs:
            try:
                compute_parts(fns, folder, job.parts, *job.args)
            except PartNotWritten:
                raise
            except Exception as exc:
                raise error(f"run {job.key} failed: {exc!r}") from exc
            yield job


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch on ``threads`` intra-op threads (1: as in a pool worker, :mod:`.pool`) while the jobs
    run here, and the caller's count back afterwards; ``None`` changes nothing. The toy runs are
    many tiny ops: on a busy machine, intra-op threads only wait for each other (a bandit
    setting of ``compare`` ran 4x slower on 2 threads than on 1 at a load of 2 on 2 cores).
    Results do not depend on it: tensors this small never reach torch's parallel grain size."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _ray_task(cwd: str, main: str | None, *args: Any) -> tuple[str, ...]:
    """:func:`compute_parts` in a Ray task, from the driver's working directory ``cwd`` where
    this node has it (the checkout at the same path on every node): a relative path in a job
    (a warm start, the llm rung's scratch) means there what it means to the driver. ``main``:
    the module the driver runs as ``__main__`` (``llm.claims``), imported first, as a
    multiprocessing worker imports it: what it registers (the llm rung and its run kind) is
    registered here too."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    if main is not None:
        importlib.import_module(main)
    return compute_parts(*args)


def _main_module() -> str | None:
    """The module name this process runs as ``__main__`` (``python -m NAME``), None for a
    script or a package's ``__main__`` (whose import would run it again)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    return None if name is None or name.endswith("__main__") else name


def _ray(fns, jobs, folder, workers, address, error, gpus=0.0) -> Iterator[Job]:
    """The jobs as Ray tasks of one CPU and ``gpus`` GPUs each; each writes its parts into
    ``folder``, which every node must see at that path (one machine, or a filesystem the
    cluster's nodes share)."""
    import ray  # there: check_backend

    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=workers, include_dashboard=False)
        started = True
    try:
        task = ray.remote(num_cpus=1, num_gpus=gpus)(_ray_task)
        here, main, folder = os.getcwd(), _main_module(), str(Path(folder).resolve())
        pending = {task.remote(here, main, fns, folder, job.parts, *job.args): job for job in jobs}
        while pending:
            ref = ray.wait(list(pending), num_returns=1)[0][0]
            job = pending.pop(ref)
            try:
                ray.get(ref)
            except Exception as exc:
                for other in pending:
                    ray.cancel(other)
                raise error(f"run {job.key} failed: {exc}") from exc
            if not all((Path(folder) / part).exists() for part in job.parts):
                raise ValueError(SHARED_DISK.format(key=job.key, folder=folder))
            yield job
    finally:
        if started:
            ray.shutdown()
