"""Experiments: the run kinds, the default comparison, sweeps, result storage and the figures.

The names below are imported on first use, so that ``sandbox.experiments.pool`` (and the CLI
that starts the pool's forkserver before anything else) does not pull in torch and pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CompareConfig": "compare",
    "run_compare": "sweep",
    "RunKind": "runs",
    "RunSpec": "runs",
    "available_runs": "runs",
    "register_run": "runs",
    "run_kind": "runs",
    "run_kinds": "runs",
    "run_specs": "runs",
    "final_scores": "plots",
    "format_scores": "plots",
    "render_all": "plots",
    "load_results": "results",
    "write_parquet_atomic": "results",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
