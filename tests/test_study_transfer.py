"""sandbox.study.analysis, transfer: transfer read off the claims ledgers, with hand-computed values."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sandbox.study.analysis import (
    AGREEMENT_COLUMNS,
    LEDGERS,
    TRANSFER_COLUMNS,
    clopper_pearson,
    transfer_agreement,
    transfer_table,
    transfer_wide,
    write_transfer,
)

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


def _ledger(rows: list[tuple], margin: float = 0.05) -> pd.DataFrame:
    """Ledger rows (claim, rung, metric, estimate, lo, hi, seeds, verdict) with the extra
    columns a real ledger has, which the transfer table drops: every sampled supported or
    reversed row survives Holm (``holm``), at ``margin`` (below every interval here)."""
    names = ["claim", "rung", "metric", "estimate", "lo", "hi", "seeds", "verdict"]
    frame = pd.DataFrame(rows, columns=names)
    strong = frame["verdict"].isin(["supported", "reversed"]) & (frame["seeds"] > 1)
    holm = np.where(strong, "survives", "no decision")
    return frame.assign(
        rule_a="a", rule_b="b", direction="greater", p=NAN, margin=margin, holm=holm
    )


# -- Clopper-Pearson --------------------------------------------------------------------------


def test_clopper_pearson_matches_the_closed_forms():
    # k = n: lo solves x^n = 0.025, so lo = 0.025 ** (1/n); hi = 1
    assert clopper_pearson(4, 4) == pytest.approx((0.025**0.25, 1.0), abs=1e-12)
    assert clopper_pearson(4, 4)[0] == pytest.approx(0.397635364, abs=1e-9)
    # k = 0: the mirror image
    assert clopper_pearson(0, 4) == pytest.approx((0.0, 1 - 0.025**0.25), abs=1e-12)
    # k = 1, n = 2: Beta(1, 2)'s cdf is 1 - (1 - x)^2 = 0.025 -> x = 1 - sqrt(0.975);
    # hi by symmetry sqrt(0.975)
    assert clopper_pearson(1, 2) == pytest.approx((1 - 0.975**0.5, 0.975**0.5), abs=1e-12)
    # one of one: [0.025, 1]; a 90% interval is narrower: [0.05, 1]
    assert clopper_pearson(1, 1) == pytest.approx((0.025, 1.0), abs=1e-12)
    assert clopper_pearson(1, 1, level=0.9) == pytest.approx((0.05, 1.0), abs=1e-12)
    assert all(math.isnan(v) for v in clopper_pearson(0, 0))


@pytest.mark.parametrize(
    ("k", "n", "level", "needle"),
    [
        (3, 2, 0.95, "k and n"),
        (-1, 2, 0.95, "k and n"),
        (1.5, 2, 0.95, "k and n"),
        (1, 2, 1.0, "level"),
    ],
)
def test_clopper_pearson_rejects_bad_input(k, n, level, needle):
    with pytest.raises(ValueError, match=needle):
        clopper_pearson(k, n, level)


# -- the tidy and wide tables -----------------------------------------------------------------

PRIMARY = [
    ("c1", "x", "m", 0.5, NAN, NAN, 1, "supported"),  # one exact run: a zero-width interval
    ("c1", "y", "m", 0.2, 0.1, 0.3, 8, "supported"),
    ("c2", "x", "m", 0.0, NAN, NAN, 1, "identical by construction"),
    ("c2", "y", "m", -0.2, -0.3, -0.1, 8, "reversed"),
]
SECONDARY = [
    ("c1", "y", "auc", 0.05, -0.01, 0.11, 8, "not resolved at this power"),
    ("c1", "x", "auc", -0.1, NAN, NAN, 8, "not resolved at this power"),  # sampled, no interval
]


def test_the_table_keeps_the_ledgers_order_and_reads_an_exact_run_as_a_zero_width_interval():
    table = transfer_table(_ledger(PRIMARY), _ledger(SECONDARY))
    assert list(table.columns) == TRANSFER_COLUMNS
    # claims, then metrics, then rungs in the order they first appear: c1's auc rows after its
    # m rows (metric m seen first), and rung x before y though c1/auc lists y first
    keys = list(zip(table["claim"], table["metric"], table["rung"], strict=True))
    assert keys == [
        ("c1", "m", "x"),
        ("c1", "m", "y"),
        ("c1", "auc", "x"),
        ("c1", "auc", "y"),
        ("c2", "m", "x"),
        ("c2", "m", "y"),
    ]
    exact = table.iloc[0]
    assert (exact["estimate"], exact["lo"], exact["hi"]) == (0.5, 0.5, 0.5)
    assert (table.iloc[4]["lo"], table.iloc[4]["hi"]) == (0.0, 0.0)
    # eight seeds without an interval stay without one: no interval is made up
    assert np.isnan(table.iloc[2]["lo"]) and np.isnan(table.iloc[2]["hi"])
    assert table.iloc[1][["lo", "hi", "verdict"]].tolist() == [0.1, 0.3, "supported"]


def test_the_table_refuses_a_row_twice_and_a_ledger_without_its_columns():
    with pytest.raises(ValueError, match=r"\('c1', 'm', 'x'\) appears more than once"):
        transfer_table(_ledger(PRIMARY), _ledger(PRIMARY[:1]))
    with pytest.raises(ValueError, match=r"ledgers\[1\] lacks the columns \['seeds'\]"):
        transfer_table(_ledger(PRIMARY), _ledger(SECONDARY).drop(columns="seeds"))
    with pytest.raises(ValueError, match="at least one ledger"):
        transfer_table()


def test_the_wide_view_puts_the_rungs_side_by_side():
    wide = transfer_wide(transfer_table(_ledger(PRIMARY), _ledger(SECONDARY)))
    assert list(wide.columns) == ["claim", "metric", "x", "y"]
    assert wide.iloc[0].tolist() == [
        "c1",
        "m",
        "+0.5000 (exact) supported",
        "+0.2000 [+0.1000, +0.3000] supported",
    ]
    assert wide.iloc[1]["x"] == "-0.1000 (no interval) not resolved at this power"
    assert wide.iloc[2]["x"] == "+0.0000 (exact) identical by construction"
    one_rung = transfer_wide(transfer_table(_ledger(PRIMARY[1:2])))
    assert one_rung.to_dict("records") == [
        {"claim": "c1", "metric": "m", "y": "+0.2000 [+0.1000, +0.3000] supported"}
    ]


# -- the agreement ----------------------------------------------------------------------------


def _agreement_rows() -> pd.DataFrame:
    """Five claims on three rungs x, y, z (metric m), as intervals:

    claim  x              y              z
    c1     [+0.1, +0.3]   [+0.2, +0.4]   [-0.1, +0.1]
    c2     [-0.3, -0.1]   [+0.1, +0.2]   [-0.2, -0.1]
    c3     [+0.1, +0.2]   [+0.3, +0.5]   [+0.1, +0.2]  no headroom on y
    c4     [-0.1, +0.1]   [-0.5, -0.1]   (absent)
    c5     exact +0.2     [+0.1, +0.3]   (absent)      exact run, seeds 1
    """
    rows = [
        ("c1", "x", "m", 0.2, 0.1, 0.3, 8, "supported"),
        ("c1", "y", "m", 0.3, 0.2, 0.4, 8, "supported"),
        ("c1", "z", "m", 0.0, -0.1, 0.1, 8, "not resolved at this power"),
        ("c2", "x", "m", -0.2, -0.3, -0.1, 8, "reversed"),
        ("c2", "y", "m", 0.15, 0.1, 0.2, 8, "supported"),
        ("c2", "z", "m", -0.15, -0.2, -0.1, 8, "reversed"),
        ("c3", "x", "m", 0.15, 0.1, 0.2, 8, "supported"),
        ("c3", "y", "m", 0.4, 0.3, 0.5, 8, "no headroom"),
        ("c3", "z", "m", 0.15, 0.1, 0.2, 8, "supported"),
        ("c4", "x", "m", 0.0, -0.1, 0.1, 8, "not resolved at this power"),
        ("c4", "y", "m", -0.3, -0.5, -0.1, 8, "reversed"),
        ("c5", "x", "m", 0.2, NAN, NAN, 1, "supported"),
        ("c5", "y", "m", 0.2, 0.1, 0.3, 8, "supported"),
    ]
    return transfer_table(_ledger(rows))


def test_the_agreement_counts_claims_resolved_on_both_rungs_by_hand():
    got = transfer_agreement(_agreement_rows())
    assert list(got.columns) == AGREEMENT_COLUMNS
    row = {(r.rung_a, r.rung_b, r.counted): r for r in got.itertuples()}
    assert list(row) == [
        ("x", "y", "margin"),
        ("x", "z", "margin"),
        ("y", "z", "margin"),
        ("x", "y", "verdicts"),
        ("x", "z", "verdicts"),
        ("y", "z", "verdicts"),
        ("x", "y", "all"),
        ("x", "z", "all"),
        ("y", "z", "all"),
    ]
    # x~y, all rows: c1 (+,+) same, c2 (-,+) differs, c3 (+,+) same, c4 unresolved on x,
    # c5 (+ exact, +) same: 3 of 4, one unresolved; Clopper-Pearson for 3 of 4
    xy = row["x", "y", "all"]
    assert (xy.claims, xy.resolved, xy.same_sign, xy.unresolved) == (5, 4, 3, 1)
    assert xy.share == 0.75 and xy.result == "3 of 4 same sign"
    assert (xy.lo, xy.hi) == pytest.approx(clopper_pearson(3, 4), abs=1e-15)
    assert (xy.lo, xy.hi) == pytest.approx((0.194120, 0.993690), abs=1e-6)
    # counting verdicts only, c3 drops out on x~y (no headroom on y): 2 of 3
    xy = row["x", "y", "verdicts"]
    assert (xy.claims, xy.resolved, xy.same_sign, xy.unresolved) == (4, 3, 2, 1)
    # x~z: c1 unresolved on z, c2 (-,-) same, c3 (+,+) same; c4, c5 not on z: 2 of 2
    xz = row["x", "z", "all"]
    assert (xz.claims, xz.resolved, xz.same_sign, xz.unresolved) == (3, 2, 2, 1)
    assert (xz.lo, xz.hi) == pytest.approx((0.025**0.5, 1.0), abs=1e-12)
    # y~z: c1 unresolved on z, c2 (+,-) differs, c3 (+,+) same: 1 of 2; without c3 (no
    # headroom on y) 0 of 1
    yz = row["y", "z", "all"]
    assert (yz.resolved, yz.same_sign, yz.share) == (2, 1, 0.5)
    yz = row["y", "z", "verdicts"]
    assert (yz.claims, yz.resolved, yz.same_sign, yz.share) == (2, 1, 0, 0.0)
    assert (yz.lo, yz.hi) == pytest.approx((0.0, 0.975), abs=1e-12)


def test_the_margin_counting_signs_only_rows_decided_at_the_margin_past_holm():
    # three claims, each resolved (interval excluding 0) on both rungs x and y, margin 0.05:
    # c1 supported on both, but on y its interval [+0.01, +0.03] lies under the margin;
    # c2 reversed on both and past the margin, but Holm takes y back;
    # c3 supported past the margin and Holm on both, as is c4 the other way (exact on x: no test)
    rows = [
        ("c1", "x", "m", 0.2, 0.1, 0.3, 8, "supported"),
        ("c1", "y", "m", 0.02, 0.01, 0.03, 8, "supported"),
        ("c2", "x", "m", -0.2, -0.3, -0.1, 8, "reversed"),
        ("c2", "y", "m", -0.2, -0.3, -0.1, 8, "reversed"),
        ("c3", "x", "m", 0.2, 0.1, 0.3, 8, "supported"),
        ("c3", "y", "m", 0.2, 0.1, 0.3, 8, "supported"),
        ("c4", "x", "m", 0.2, NAN, NAN, 1, "supported"),
        ("c4", "y", "m", -0.2, -0.3, -0.1, 8, "reversed"),
    ]
    ledger = _ledger(rows)
    ledger.loc[(ledger["claim"] == "c2") & (ledger["rung"] == "y"), "holm"] = "does not survive"
    table = transfer_table(ledger)
    assert table["at_margin"].tolist() == [True, False, True, False, True, True, True, True]
    row = {r.counted: r for r in transfer_agreement(table).itertuples()}
    # by the intervals alone: 4 resolved on both, c1 c2 c3 the same sign, c4 not: 3 of 4
    assert (row["verdicts"].claims, row["verdicts"].resolved, row["verdicts"].same_sign) == (
        4,
        4,
        3,
    )
    # at the margin past Holm: c3 (same sign) and c4 (not): 1 of 2; c1 and c2 unresolved
    margin = row["margin"]
    assert (margin.claims, margin.resolved, margin.same_sign, margin.unresolved) == (4, 2, 1, 2)
    assert margin.result == "1 of 2 same sign"
    assert (margin.lo, margin.hi) == pytest.approx(clopper_pearson(1, 2), abs=1e-12)


def test_no_claim_resolved_on_both_rungs_is_not_resolved_and_has_no_interval():
    rows = [
        ("c1", "x", "m", 0.2, 0.1, 0.3, 8, "supported"),
        ("c1", "y", "m", 0.0, -0.1, 0.1, 8, "not resolved at this power"),
        ("c2", "x", "m", 0.0, NAN, NAN, 1, "identical by construction"),  # exact 0: no sign
        ("c2", "y", "m", 0.2, 0.1, 0.3, 8, "supported"),
    ]
    [*_, row] = transfer_agreement(transfer_table(_ledger(rows))).itertuples()
    assert (row.counted, row.claims, row.resolved, row.unresolved) == ("all", 2, 0, 2)
    assert row.result == "not resolved"
    assert np.isnan(row.share) and np.isnan(row.lo) and np.isnan(row.hi)


def test_each_metric_is_its_own_family_and_the_rung_order_can_be_given():
    table = transfer_table(_ledger(PRIMARY), _ledger(SECONDARY))
    got = transfer_agreement(table, rungs=["y", "x"])
    assert got[["metric", "rung_a", "rung_b"]].drop_duplicates().values.tolist() == [
        ["m", "y", "x"],
        ["auc", "y", "x"],
    ]
    with pytest.raises(ValueError, match=r"table lacks the columns \['verdict'\]"):
        transfer_agreement(table.drop(columns="verdict"))


# -- the files --------------------------------------------------------------------------------


def _committed(tmp_path: Path) -> Path:
    copy = tmp_path / "claims"
    copy.mkdir()
    for name in ("ledger.csv", "ledger_auc.csv"):
        shutil.copy2(ROOT / "results" / "claims" / name, copy / name)
    return copy


def _ledgers(out: Path) -> list[pd.DataFrame]:
    """A folder's ledgers as written; an empty one (a study whose rules make no claim) as no
    rows."""

    def read(path: Path) -> pd.DataFrame:
        try:
            return pd.read_csv(path)
        except pd.errors.EmptyDataError:
            return pd.DataFrame()

    return [read(out / name) for name in LEDGERS if (out / name).exists()]


def test_write_transfer_on_the_committed_ledgers_recounts_by_hand_and_keeps_its_bytes(tmp_path):
    out = _committed(tmp_path)
    write_transfer(out, _ledgers(out))
    with open(out / "transfer.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert list(written[0]) == TRANSFER_COLUMNS
    ledger = []
    for name in ("ledger.csv", "ledger_auc.csv"):
        with open(out / name, newline="") as f:
            ledger += list(csv.DictReader(f))
    assert len(written) == len(ledger)
    # every row as in the ledger; an exact run (seeds 1, no interval): lo = hi = estimate
    key = {(r["claim"], r["metric"], r["rung"]): r for r in written}
    for r in ledger:
        w = key[r["claim"], r["metric"], r["rung"]]
        assert (w["estimate"], w["verdict"]) == (r["estimate"], r["verdict"])
        exact = r["seeds"] == "1" and r["lo"] == ""
        assert (w["lo"], w["hi"]) == ((r["estimate"],) * 2 if exact else (r["lo"], r["hi"]))
    # the agreement recounted from the ledger's text with plain loops
    with open(out / "transfer_agreement.csv", newline="") as f:
        agreement = list(csv.DictReader(f))
    assert list(agreement[0]) == AGREEMENT_COLUMNS
    for a in agreement:
        signs = {}
        for r in ledger:
            if r["metric"] != a["metric"]:
                continue
            if a["counted"] != "all" and r["verdict"] in (
                "no headroom",
                "identical by construction",
            ):
                continue
            lo = float(r["lo"] or r["estimate"])
            hi = float(r["hi"] or r["estimate"])
            signs[r["claim"], r["rung"]] = 1 if lo > 0 else -1 if hi < 0 else 0
            # margin: supported/reversed, past Holm (an exact run has no test), beyond +-m
            m, passed = float(r["margin"]), r["holm"] == "survives" or r["seeds"] == "1"
            strong = r["verdict"] in ("supported", "reversed") and passed
            if a["counted"] == "margin" and not (strong and (lo >= m or hi <= -m)):
                signs[r["claim"], r["rung"]] = 0
        both = [c for (c, rung) in signs if rung == a["rung_a"] and (c, a["rung_b"]) in signs]
        resolved = [c for c in both if signs[c, a["rung_a"]] and signs[c, a["rung_b"]]]
        same = [c for c in resolved if signs[c, a["rung_a"]] == signs[c, a["rung_b"]]]
        assert (int(a["claims"]), int(a["resolved"]), int(a["same_sign"])) == (
            len(both),
            len(resolved),
            len(same),
        )
        assert int(a["unresolved"]) == len(both) - len(resolved)
    # written only when its bytes change: a second write keeps both files as they were
    before = {
        n: ((out / n).read_bytes(), (out / n).stat().st_mtime_ns)
        for n in ("transfer.csv", "transfer_agreement.csv")
    }
    write_transfer(out, _ledgers(out))
    after = {n: ((out / n).read_bytes(), (out / n).stat().st_mtime_ns) for n in before}
    assert after == before


def test_write_transfer_reads_the_primary_ledger_alone_and_refuses_no_ledger(tmp_path):
    out = _committed(tmp_path)
    (out / "ledger_auc.csv").unlink()
    table, _ = write_transfer(out, _ledgers(out))
    assert set(table["metric"]) == {"final_pass", "final_entropy"}
    with pytest.raises(ValueError, match=r"^ledgers: none given for .*empty"):
        write_transfer(tmp_path / "empty", [])


def test_write_transfer_reads_an_empty_ledger_as_no_rows(tmp_path):
    # a study whose rules make no claim writes an empty ledger.csv (no header)
    (tmp_path / "ledger.csv").write_text("")
    table, agreement = write_transfer(tmp_path, _ledgers(tmp_path))
    assert table.equals(write_transfer(tmp_path, [pd.DataFrame()])[0])  # in memory: no columns
    assert list(table.columns) == TRANSFER_COLUMNS and table.empty and agreement.empty
