"""Experiments: the default comparison, result storage and the standard figures."""

from .compare import CompareConfig, run_compare, run_pair
from .plots import final_scores, format_scores, render_all
from .results import load_results, write_parquet_atomic

__all__ = [
    "CompareConfig",
    "final_scores",
    "format_scores",
    "load_results",
    "render_all",
    "run_compare",
    "run_pair",
    "write_parquet_atomic",
]
