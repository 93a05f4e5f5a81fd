"""Experiments: the run kinds, the default comparison, sweeps, result storage and the figures.

The names below are imported on first use, so that ``sandbox.experiments.pool`` (and the CLI
that starts the pool's forkserver before anything else) does not pull in torch and pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The module of each exported name.
_EXPORTS = {
    name: module
    for module, names in {
        "compare": "CompareConfig",
        "sweep": "run_compare",
        "runs": "RunKind RunSpec available_runs register_run run_kind run_kinds run_specs",
        "plots": "final_scores format_scores render_all",
        "results": "load_results write_parquet_atomic",
    }.items()
    for name in names.split()
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
