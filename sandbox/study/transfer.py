"""Transfer measured on claim effects: does a claim's paired effect keep its sign from rung to rung?

Read off the claims study's ledgers (``ledger.csv``: each claim's primary reading,
``ledger_auc.csv``: the ``reward_auc`` reading), claim by claim, with nothing re-estimated:
:func:`transfer_table` (tidy rows), :func:`transfer_wide` (the rungs side by side) and
:func:`transfer_agreement` (per pair of rungs, the share of claims resolved on both with the same
sign, with an exact interval); :func:`write_transfer` writes them into a results folder. Claims
unresolved on either rung are counted, not guessed, and nothing is resampled, so the statistic
never resolves more than the ledgers' intervals do (the seed bootstrap of the rule orders' tau-b
did: it resolved 1.3-2.5x more pairs than the data).

Three countings are written, one row each (column ``counted``): ``margin`` (the page's) signs only
rows that decide their claim at the margin (``at_margin``, :func:`.claims.decided_at_margin`:
supported or reversed, surviving Holm, the whole interval beyond +-m), among the rows that carry a
verdict; ``verdicts`` counts every row that carries a verdict (a row with no headroom or identical
by construction compares nothing: a rung at its ceiling cannot tell rules apart, so its sign says
nothing about transfer) and signs it by its interval alone; ``all`` counts every row with an
interval.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import betaincinv

from sandbox.experiments.results import write_csv

from .analysis import fmt_interval
from .claims import AT_MARGIN_COLUMNS, decided_at_margin
from .evidence import NOT_VERDICTS

#: The columns of :func:`transfer_table` (and of ``transfer.csv``), in order.
COLUMNS = ["claim", "metric", "rung", "estimate", "lo", "hi", "verdict", "at_margin"]

#: The columns of :func:`transfer_agreement` (and of ``transfer_agreement.csv``), in order.
AGREEMENT_COLUMNS = ["metric", "rung_a", "rung_b", "counted", "claims", "resolved", "same_sign"]
AGREEMENT_COLUMNS += ["share", "lo", "hi", "unresolved", "result"]

#: The ledger tables of a results folder that :func:`write_transfer` reads, in this order.
LEDGERS = ("ledger.csv", "ledger_auc.csv")

#: The two countings of :func:`transfer_agreement` (see the module docstring).
COUNTINGS = ("margin", "verdicts", "all")


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``level`` interval of a binomial share from ``k`` of ``n``:
    ``lo = Beta(k, n - k + 1).ppf(a / 2)``, ``hi = Beta(k + 1, n - k).ppf(1 - a / 2)`` with
    ``a = 1 - level`` (``betaincinv``, what ``scipy.stats.beta.ppf`` computes, without importing
    ``scipy.stats``: a second per process); ``lo = 0`` at ``k = 0`` and ``hi = 1`` at ``k = n``.
    At least ``level`` coverage for every true share (Clopper & Pearson 1934). ``n = 0``: (NaN,
    NaN)."""
    if not (0 <= k <= n) or int(k) != k or int(n) != n:
        raise ValueError(f"k and n must be integers with 0 <= k <= n, got k={k!r}, n={n!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    if n == 0:
        return float("nan"), float("nan")
    a = 1.0 - level
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, a / 2))
    hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - a / 2))
    return lo, hi


def read_ledger(path: Path) -> pd.DataFrame:
    """A ledger as written; an empty one (a study whose rules make no claim) as no rows."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return _no_rows()


def _no_rows() -> pd.DataFrame:
    """A ledger without rows, with the columns :func:`transfer_table` reads."""
    read = dict.fromkeys([*COLUMNS, *AT_MARGIN_COLUMNS])  # once each; at_margin is computed
    return pd.DataFrame(columns=[c for c in read if c != "at_margin"])


def transfer_table(*ledgers: pd.DataFrame) -> pd.DataFrame:
    """Tidy rows (:data:`COLUMNS`) from one or more ledger tables (the claims study's
    ``ledger.csv`` and ``ledger_auc.csv`` as read): one row per (claim, metric, rung), claims,
    metrics and rungs in the order they first appear in the ledgers (the ledgers' own order:
    pre-registration, then the ladder). A row with ``seeds == 1`` and no interval is an exact
    difference: ``lo = hi = estimate``. ``at_margin``: the row decides its claim at the margin
    (:func:`.claims.decided_at_margin`, from the ledger's ``holm`` and ``margin``). A (claim,
    metric, rung) twice is an error."""
    if not ledgers:
        raise ValueError("ledgers: give at least one ledger table")
    for i, ledger in enumerate(ledgers):
        missing = {*COLUMNS, *AT_MARGIN_COLUMNS} - {"at_margin"} - set(ledger.columns)
        if missing:
            raise ValueError(f"ledgers[{i}] lacks the columns {sorted(missing)}")
    table = pd.concat(list(ledgers), ignore_index=True)
    keys = ["claim", "metric", "rung"]
    twice = table[table.duplicated(keys, keep=False)]
    if len(twice):
        raise ValueError(f"ledgers: {tuple(twice.iloc[0][keys])} appears more than once")
    table["at_margin"] = decided_at_margin(table)
    exact = (table["seeds"] == 1) & table["lo"].isna() & table["hi"].isna()
    table["lo"] = table["lo"].astype(float).where(~exact, table["estimate"])
    table["hi"] = table["hi"].astype(float).where(~exact, table["estimate"])
    first_seen = {k: table[k].map({v: i for i, v in enumerate(table[k].unique())}) for k in keys}
    order = pd.DataFrame(first_seen).sort_values(keys, kind="stable").index
    return table.loc[order, COLUMNS].reset_index(drop=True)


def _cell(row: pd.Series) -> str:
    estimate, lo, hi = row["estimate"], row["lo"], row["hi"]
    if lo == hi == estimate:
        return f"{estimate:+.4f} (exact) {row['verdict']}"
    return f"{fmt_interval(estimate, lo, hi, alone=' (no interval)')} {row['verdict']}"


def transfer_wide(
    table: pd.DataFrame, cell: Callable[[pd.Series], str] = _cell, missing: str = ""
) -> pd.DataFrame:
    """:func:`transfer_table`'s rows side by side: one row per (claim, metric), one column per
    rung (in the table's order) holding ``cell(row)`` (by default
    ``"+0.0217 [+0.0017, +0.0417] supported"``, ``(exact)`` for a zero-width interval),
    ``missing`` where the claim has no row on that rung (the page: its own cell and ``—``)."""
    rungs = list(dict.fromkeys(table["rung"]))
    cells = table.assign(cell=table.apply(cell, axis=1) if len(table) else "")
    rows = []
    for (claim, metric), part in cells.groupby(["claim", "metric"], sort=False):
        by_rung = dict(zip(part["rung"], part["cell"], strict=True))
        rows.append(
            {"claim": claim, "metric": metric, **{r: by_rung.get(r, missing) for r in rungs}}
        )
    return pd.DataFrame(rows, columns=["claim", "metric", *rungs])


def _pair(a: pd.DataFrame, b: pd.DataFrame, level: float) -> tuple:
    """:data:`AGREEMENT_COLUMNS` from ``claims`` on, from two rungs' signs indexed by claim."""
    both = a.merge(b, left_index=True, right_index=True, suffixes=("_a", "_b"))
    resolved = (both["sign_a"] != 0) & (both["sign_b"] != 0)
    n = int(resolved.sum())
    k = int((both["sign_a"] == both["sign_b"])[resolved].sum())
    result = f"{k} of {n} same sign" if n else "not resolved"
    share = k / n if n else float("nan")
    return len(both), n, k, share, *clopper_pearson(k, n, level), len(both) - n, result


def transfer_agreement(
    table: pd.DataFrame, *, level: float = 0.95, rungs: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per metric, pair of rungs (``rung_a`` before ``rung_b`` in ``rungs``, default the
    table's order) and counting (:data:`COUNTINGS`): ``claims`` on both rungs; ``resolved``:
    those whose interval excludes 0 on both; ``same_sign`` of those, its ``share`` and exact
    ``level`` Clopper-Pearson interval (``lo``, ``hi``; NaN with none resolved); ``unresolved``:
    claims on both rungs unresolved on either; ``result`` in words ("3 of 4 same sign" or
    "not resolved"). Under ``verdicts`` a claim counts on a pair only where both its rows carry a
    verdict (not "no headroom", not "identical by construction"); under ``margin`` likewise, and
    it is resolved only where both rows decide it at the margin (``at_margin``)."""
    missing = set(COLUMNS) - set(table.columns)
    if missing:
        raise ValueError(f"table lacks the columns {sorted(missing)}")
    order = list(rungs) if rungs is not None else list(dict.fromkeys(table["rung"]))
    # +1 where the interval lies above 0, -1 below, 0 where it contains 0 or is missing
    signed = table.assign(sign=np.where(table["lo"] > 0, 1, np.where(table["hi"] < 0, -1, 0)))
    rows = []
    for metric, part in signed.groupby("metric", sort=False):
        present = [r for r in order if r in set(part["rung"])]
        for counted in COUNTINGS:
            keep = part if counted == "all" else part[~part["verdict"].isin(NOT_VERDICTS)]
            if counted == "margin":
                keep = keep.assign(sign=keep["sign"].where(keep["at_margin"].astype(bool), 0))
            by_rung = {r: keep[keep["rung"] == r].set_index("claim")[["sign"]] for r in present}
            for a, b in combinations(present, 2):
                rows.append((metric, a, b, counted, *_pair(by_rung[a], by_rung[b], level)))
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)


def write_transfer(
    out: str | Path, ledgers: Sequence[pd.DataFrame]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From a study's ``ledgers`` (the tables of :data:`LEDGERS`, as the study just computed
    them), write ``transfer.csv`` (:func:`transfer_table`) and ``transfer_agreement.csv``
    (:func:`transfer_agreement`) into the results folder ``out``, each only when its bytes
    change; returns both tables."""
    out = Path(out)
    if not ledgers:
        raise ValueError(f"ledgers: none given for {out}")
    table = transfer_table(*(ledger if len(ledger.columns) else _no_rows() for ledger in ledgers))
    agreement = transfer_agreement(table)
    write_csv(table, out / "transfer.csv")
    write_csv(agreement, out / "transfer_agreement.csv")
    return table, agreement
