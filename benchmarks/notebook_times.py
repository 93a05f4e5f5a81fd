"""The notebooks' wall time, cell by cell, in the mode and with the threads the caller's
environment sets.

What it measures
----------------
Each notebook is executed top to bottom in a fresh ``python3`` kernel (nbclient, the kernel
``jupyter execute`` uses; the kernel inherits this process's environment, so ``SANDBOX_SMALL=1``
gives the small mode CI runs and ``OMP_NUM_THREADS=1`` one torch thread per kernel), nothing is
saved. It prints each code cell's wall seconds, the notebook's total with the kernel's start, the
machine (CPU model, CPU threads, torch version, ``OMP_NUM_THREADS``), the load average before and
after, and the date. Wall times on a shared machine move with its load: the load lines say how
busy it was.

How to run (from the repository root)::

    MPLBACKEND=Agg python benchmarks/notebook_times.py notebooks/05_bandit_dynamics.ipynb
    MPLBACKEND=Agg OMP_NUM_THREADS=1 python benchmarks/notebook_times.py notebooks/*.ipynb
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

from sandbox.experiments.results import cpu_model


def load() -> str:
    """The 1-, 5- and 15-minute load averages ("n/a" where the OS has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def time_notebook(path: Path, timeout: int) -> tuple[list[tuple[int, float]], float]:
    """``([(cell index, seconds), ...], total seconds)`` of executing ``path``'s code cells in a
    fresh kernel (the total includes the kernel's start and stop)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.resolve().parent)}},
    )
    cells, start = [], time.perf_counter()
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            begun = time.perf_counter()
            client.execute_cell(cell, index)  # raises CellExecutionError on a failing cell
            cells.append((index, time.perf_counter() - begun))
    return cells, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebook files (.ipynb)")
    parser.add_argument(
        "--timeout", type=int, default=900, help="seconds one cell may run (default: 900)"
    )
    args = parser.parse_args(argv)
    import torch

    print(
        f"{datetime.date.today()}, {cpu_model()}, {os.cpu_count()} CPU threads, torch "
        f"{torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"SANDBOX_SMALL={os.environ.get('SANDBOX_SMALL', 'unset')}",
        flush=True,
    )
    for path in args.notebooks:
        before = load()
        cells, total = time_notebook(path, args.timeout)
        slowest = max(cells, key=lambda c: c[1])
        times = ", ".join(f"cell {i} {s:.1f} s" for i, s in cells)
        print(
            f"{path.stem}: {total:.1f} s in all, the slowest cell {slowest[0]} "
            f"({slowest[1]:.1f} s); {times}; load {before} -> {load()}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
