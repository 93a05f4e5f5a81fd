"""Paired evidence over seeds: what a claim in the docs is built from.

When a seed fixes the prompts, the held-out set and the initial state for every rule on a rung,
two rules' runs under one seed are a pair, and their difference removes the seed's effect
(Henderson et al., arXiv 1709.06560; Agarwal et al., arXiv 2108.13264). From a seeds x rules
table of one metric: the paired difference and its Student-t interval, the paired t-test and
Holm's adjustment over a family of claims, a verdict (five symmetric classes), the power line
(residual SD, seeds needed, from the noncentral t). Every function takes plain arrays and returns numbers; nothing here runs a trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from sandbox.stats import check_level, t_half_width

Direction = Literal["greater", "less"]

SUPPORTED = "supported"
REVERSED = "reversed"
NO_GAIN = "no gain of the margin"
EQUIVALENT = "equivalent"
UNRESOLVED = "not resolved at this power"
#: The verdict classes, symmetric in the claimed direction (see :func:`verdict`).
VERDICTS = (SUPPORTED, REVERSED, NO_GAIN, EQUIVALENT, UNRESOLVED)
#: Rows that carry no verdict: the comparator leaves no room for an effect of the margin, or the
#: two rules compute the same thing on the rung (NSR and its decay on the exact flow).
NO_HEADROOM = "no headroom"
IDENTICAL = "identical by construction"
NOT_VERDICTS = (NO_HEADROOM, IDENTICAL)


@dataclass(frozen=True)
class PairedDifference:
    """The mean of ``a - b`` over the seeds both have, its ``level`` interval, the SD of the
    differences and the number of pairs. The interval is NaN with fewer than two pairs."""

    estimate: float
    lo: float
    hi: float
    sd: float
    n: int


def paired_difference(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> PairedDifference:
    """Mean difference ``a - b`` over seeds (paired by position) with a Student-t interval.

    Pairs where either value is NaN are dropped (a seed missing for one rule is no pair).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d arrays of one length, got {a.shape} and {b.shape}")
    level = check_level(level)
    d = (a - b)[np.isfinite(a) & np.isfinite(b)]
    n, nan = len(d), float("nan")
    if n < 2:
        return PairedDifference(float(d.mean()) if n else nan, nan, nan, nan, n)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    half = t_half_width(sd, n, level)
    return PairedDifference(mean, float(mean - half), float(mean + half), sd, n)


def paired_p(diff: PairedDifference) -> float:
    """Two-sided p-value of the paired t-test of ``diff`` (mean 0 under the null). An exact
    difference (SD 0, e.g. a deterministic rung) gives 0 when it is nonzero and 1 when it is 0;
    NaN with fewer than two pairs."""
    if diff.n < 2 or not np.isfinite(diff.sd):
        return float("nan")
    if diff.sd == 0:
        return 0.0 if diff.estimate != 0 else 1.0
    from scipy import stats

    t = diff.estimate / (diff.sd / np.sqrt(diff.n))
    return float(2 * stats.t.sf(abs(t), diff.n - 1))


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values (NaN entries are not members):
    the k-th smallest of m becomes ``max_{j <= k} min(1, (m - j + 1) p_(j))``. It controls the
    family-wise error rate under any dependence between the claims (several share a comparator's
    runs), where Benjamini-Hochberg needs positive dependence."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    if len(idx) == 0:
        return out
    if np.any((p[idx] < 0) | (p[idx] > 1)):
        raise ValueError(f"pvalues must lie in [0, 1], got {p[idx].tolist()}")
    order = idx[np.argsort(p[idx], kind="stable")]
    m = len(order)
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


def verdict(diff: PairedDifference, direction: Direction, margin: float = 0.0) -> tuple[str, str]:
    """The verdict on "A beats B" (``direction="greater"``: A's metric is higher; ``"less"``: lower)
    and the reason, from the paired interval of A - B read in the claimed direction, [lo, hi],
    and ``margin`` m >= 0, the smallest effect of interest (pre-registered with the claim):

    - supported: lo > 0 (the interval lies wholly on the claimed side of 0);
    - reversed: hi < 0 (wholly on the other side);
    - equivalent: -m < lo and hi < m (contains 0, and every effect it allows is smaller than m
      either way);
    - no gain of the margin: contains 0, hi < m, lo <= -m (a gain of m is excluded, a loss is not);
    - not resolved at this power: otherwise (contains 0 and allows a gain of m), and with fewer
      than two pairs.

    The classes are symmetric (a reversal needs the interval below 0 as a support needs it above);
    with ``margin`` 0 the two margin classes cannot occur; a zero-width interval (an exact
    difference) is classed the same way.
    """
    if direction not in ("greater", "less"):
        raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}")
    if not margin >= 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    if not (np.isfinite(diff.lo) and np.isfinite(diff.hi)):
        return UNRESOLVED, f"{diff.n} pair(s): no interval"
    sign = 1.0 if direction == "greater" else -1.0
    lo, hi = sorted((sign * diff.lo, sign * diff.hi))  # the interval in the claimed direction
    if lo > 0:
        return SUPPORTED, "interval on the claimed side of 0"
    if hi < 0:
        return REVERSED, "interval on the other side of 0"
    if within_margin(diff, margin):
        return EQUIVALENT, f"interval within +-{margin:g}"
    if margin > 0 and hi < margin:
        return NO_GAIN, f"interval contains 0 and excludes a gain of {margin:g}"
    return UNRESOLVED, "interval contains 0 and a gain of the margin"


def within_margin(diff: PairedDifference, margin: float) -> bool:
    """The equivalence test of :func:`verdict`, on its own: the interval lies within
    ``(-margin, +margin)`` (every effect it allows is smaller than ``margin`` either way), read
    without the verdict's order of classes, so an interval on one side of 0 counts too (under
    common random numbers a tiny gap has a tight interval that excludes 0: :func:`verdict` calls
    it supported or reversed, yet no effect of the margin is left). False with ``margin`` 0 or
    without an interval."""
    if not margin >= 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    return bool(margin > 0 and -margin < diff.lo and diff.hi < margin)


def residual_sd(table: np.ndarray) -> float:
    """SD of a seeds x rules table after removing each seed's and each rule's mean (the residual
    of the two-way additive model, df = (S - 1)(R - 1)). Rows with a NaN are dropped. The SD of a
    paired difference of two rules is ``sqrt(2)`` times this."""
    x = np.asarray(table, dtype=float)
    if x.ndim != 2:
        raise ValueError(f"table must be seeds x rules (2-d), got shape {x.shape}")
    x = x[np.all(np.isfinite(x), axis=1)]
    s, r = x.shape
    if s < 2 or r < 2:
        return float("nan")
    res = x - x.mean(1, keepdims=True) - x.mean(0, keepdims=True) + x.mean()
    return float(np.sqrt(np.sum(res**2) / ((s - 1) * (r - 1))))


def correlation(x: np.ndarray, y: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Pearson's r of ``x`` and ``y`` with its ``level`` interval by Fisher's z (``atanh r`` is
    about normal with SE ``1 / sqrt(n - 3)``): ``(r, lo, hi)``. NaN where it is undefined: fewer
    than 4 points for the interval, fewer than 2 or a constant series for r."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    if n < 2 or x.std() == 0 or y.std() == 0:
        return (float("nan"),) * 3
    r = float(np.clip(np.corrcoef(x, y)[0, 1], -1.0, 1.0))
    if n < 4:
        return r, float("nan"), float("nan")
    from scipy import stats

    half = stats.norm.ppf(0.5 + level / 2) / math.sqrt(n - 3)
    z = math.atanh(np.clip(r, -1 + 1e-15, 1 - 1e-15))
    return r, math.tanh(z - half), math.tanh(z + half)


def paired_power(n: int, sd: float, effect: float, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test with ``n`` pairs to detect a true mean difference
    ``effect`` when the differences have SD ``sd``: with ``T ~ t'(df = n - 1, nc)``, ``nc =
    |effect| sqrt(n) / sd`` and ``c`` the t quantile at ``1 - alpha / 2``,
    ``P(T > c) + P(T < -c)``.

    The far tail is taken as ``P(t'(df, -nc) > c)``, the same number by symmetry
    (``T(nc) = -T(-nc)`` in law): scipy's ``nct.cdf(-c, df, nc)`` returns NaN for large
    noncentralities (nc 8.9 at df 1999 and alpha 0.05; from nc ~3 at smaller alpha), where its ``sf``
    with ``-nc`` stays finite (it underflows to 0 where the tail is below ~1e-12). A tail that
    is still not finite falls back to its normal approximation, ``Phi(+-nc - c)``.
    """
    if n < 2:
        return float("nan")
    if not (np.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    if sd == 0:  # differences without noise: any nonzero effect is found
        return 1.0 if effect else float(alpha)
    from scipy import stats

    df, nc = n - 1, abs(effect) / sd * np.sqrt(n)
    crit = stats.t.ppf(1 - alpha / 2, df)
    tails = []
    for shift in (nc, -nc):  # the effect's side, then the far side
        tail = float(stats.nct.sf(crit, df, shift))
        tails.append(tail if np.isfinite(tail) else float(stats.norm.sf(crit - shift)))
    return float(min(1.0, sum(tails)))


def seeds_needed(
    sd: float, effect: float, *, power: float = 0.8, alpha: float = 0.05, max_n: int = 100_000
) -> int:
    """Smallest number of paired seeds whose two-sided paired t-test at ``alpha`` has at least
    ``power`` to detect a mean difference ``effect`` when the differences have SD ``sd``."""
    if not (np.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be a positive finite number, got {sd!r}")
    if not effect:
        raise ValueError("effect must be nonzero")
    check_level(power)
    check_level(alpha)
    lo, hi = 2, 2
    while not paired_power(hi, sd, effect, alpha) >= power:  # doubling, then bisection (NaN: more)
        lo, hi = hi, hi * 2
        if hi > max_n:
            raise ValueError(f"more than max_n={max_n} seeds needed (sd={sd}, effect={effect})")
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if paired_power(mid, sd, effect, alpha) >= power else (mid + 1, hi)
    return lo
