"""The Student-t interval's pieces shared by the figures (:mod:`sandbox.experiments.plots`) and the
claims study's evidence (:mod:`sandbox.study.evidence`), below both (``sandbox.experiments`` never
imports ``sandbox.study``)."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_level(level: float) -> float:
    """``level`` as a float in (0, 1), else a ``ValueError`` naming it."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return float(level)


def t_half_width(sd: Any, n: int, level: float = 0.95) -> Any:
    """Half-width of the Student-t ``level`` interval of a mean of ``n`` values with SD ``sd``
    (a number or an array of them): ``t_{(1+level)/2, n-1} * sd / sqrt(n)``."""
    level = check_level(level)
    from scipy import stats  # here, not at import: experiment workers never need it

    return stats.t.ppf(0.5 + level / 2, n - 1) * sd / np.sqrt(n)
