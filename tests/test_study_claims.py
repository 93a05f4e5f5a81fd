"""sandbox.study.claims: the claim records and the ledger, on a score table whose paired
differences are worked by hand."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sandbox.objectives import get_objective
from sandbox.study import claims as cl
from sandbox.study import evidence as ev


def test_every_claim_names_rules_the_registry_resolves():
    names = [c.name for c in cl.CLAIMS]
    assert len(names) == len(set(names))
    for rule in cl.claim_rules():
        get_objective(rule)  # raises on an unknown name
    assert {
        "nsr_beats_dapo",
        "nsr_beats_its_decay",
        "dgpo_beats_hard_clip",
        "atr_beats_grpo",
        "clip_cov_keeps_entropy",
        "kl_cov_keeps_entropy",
        "clip_beats_unclipped",
    } <= set(names)


def test_the_hard_clip_dgpo_is_compared_with_has_dgpos_bounds():
    claim = next(c for c in cl.CLAIMS if c.name == "dgpo_beats_hard_clip")
    dgpo, clip = get_objective(claim.rule_a), get_objective(claim.rule_b)
    assert (dgpo.eps_low, dgpo.eps_high) == (clip.eps_low, clip.eps_high)


def test_a_malformed_claim_names_the_field():
    with pytest.raises(ValueError, match="direction"):
        cl.Claim("x", "dapo", "grpo", "better", "final_pass", "s", "w", "t")
    with pytest.raises(ValueError, match="metric"):
        cl.Claim("x", "dapo", "grpo", "greater", "pass", "s", "w", "t")
    with pytest.raises(ValueError, match="rule_a and rule_b"):
        cl.Claim("x", "dapo", "dapo", "greater", "final_pass", "s", "w", "t")


def _scores() -> pd.DataFrame:
    # rung "toy", 4 seeds: nsr_dapo - dapo = [0.1, 0.2, 0.1, 0.2] (mean 0.15, sd 0.057735,
    # half = 3.182446 * 0.057735 / 2 = 0.091869 -> [0.0581, 0.2419]: supported);
    # nsr_dapo - nsr_decay_dapo = [0.1, -0.1, 0.1, -0.1] (mean 0, unresolved).
    seeds = [0, 1, 2, 3]
    base = np.array([0.3, 0.5, 0.4, 0.6])
    rows = []
    for rule, shift in (
        ("dapo", [0, 0, 0, 0]),
        ("nsr_dapo", [0.1, 0.2, 0.1, 0.2]),
        ("nsr_decay_dapo", [0.0, 0.3, 0.0, 0.3]),
    ):
        for s, b, d in zip(seeds, base, shift, strict=True):
            rows.append(
                {
                    "rung": "toy",
                    "rule": rule,
                    "seed": s,
                    "final_pass": b + d,
                    "clip_frac": 0.05 if rule == "dapo" else 0.02,
                }
            )
    return pd.DataFrame(rows)


def test_ledger_rows_are_the_paired_differences_by_hand():
    # the claims' pre-registered margin (0.02) wins over the study's margin for the metric
    table = cl.ledger(_scores(), margins={"final_pass": 0.05})
    assert set(table["claim"]) == {"nsr_beats_dapo", "nsr_beats_its_decay"}  # others lack rules
    row = table.set_index("claim").loc["nsr_beats_dapo"]
    sd = np.sqrt(4 * 0.05**2 / 3)
    assert row["estimate"] == pytest.approx(0.15, abs=1e-12)
    assert row["diff_sd"] == pytest.approx(sd, abs=1e-12)
    assert row["lo"] == pytest.approx(0.15 - 3.1824463052837078 * sd / 2, abs=1e-9)
    assert row["verdict"] == ev.SUPPORTED and row["seeds"] == 4
    assert (row["clip_frac_a"], row["clip_frac_b"]) == (0.02, 0.05)
    assert row["margin"] == 0.02 and row["seeds_needed"] == ev.seeds_needed(sd, 0.02)
    # the paired t-test: t = 0.15 / (sd / 2) with 3 df
    t = 0.15 / (sd / 2)
    assert row["p"] == pytest.approx(2 * stats.t.sf(t, 3), rel=1e-12)
    assert row["reading"] == "primary"
    decay = table.set_index("claim").loc["nsr_beats_its_decay"]
    assert decay["estimate"] == pytest.approx(0.0, abs=1e-12)
    assert decay["verdict"] == ev.UNRESOLVED


def test_power_lines_report_the_residual_sd_and_the_seeds_it_needs():
    lines = cl.power_lines(_scores(), "final_pass", 0.05)
    assert lines["seeds"].tolist() == [4] and lines["rules"].tolist() == [3]
    table = _scores().pivot_table(index="seed", columns="rule", values="final_pass").to_numpy()
    res = ev.residual_sd(table)
    assert lines["residual_sd"].iloc[0] == pytest.approx(res, abs=1e-12)
    assert lines["seeds_needed"].iloc[0] == ev.seeds_needed(np.sqrt(2) * res, 0.05)


def test_headroom_rule_by_hand():
    # comparator b near the ceiling; a rung whose reference rule sits on the answer baseline
    rows = []
    for rung, means in {
        "top": {"a": 0.99, "b": 0.97, "dapo": 0.6},  # b within 2 x 0.02 of the ceiling 1.0
        "floor": {"a": 0.3, "b": 0.25, "dapo": 0.21},  # dapo within 2 x 0.02 of the floor 0.2
        "ok": {"a": 0.6, "b": 0.5, "dapo": 0.5},
    }.items():
        for rule, m in means.items():
            for seed, d in enumerate([-0.01, 0.0, 0.01]):
                rows.append({"rung": rung, "rule": rule, "seed": seed, "final_pass": m + d})
    scores = pd.DataFrame(rows)
    claim = cl.Claim("a_beats_b", "a", "b", "greater", "final_pass", margin=0.02)
    table = cl.ledger(scores, [claim])
    bounds = {r: cl.Bounds(1.0, 0.2) for r in ("top", "floor", "ok")}
    out = cl.headroom(table, scores, bounds, reference="dapo").set_index("rung")
    assert out.loc["top", "verdict"] == ev.NO_HEADROOM
    assert "within 2 margins of the ceiling 1.000" in out.loc["top", "reason"]
    assert out.loc["floor", "verdict"] == ev.NO_HEADROOM
    assert "does not clear the answer baseline 0.200" in out.loc["floor", "reason"]
    assert out.loc["ok", "verdict"] == ev.SUPPORTED  # room on both sides: the verdict stands
    assert out.loc["top", "comparator_mean"] == pytest.approx(0.97)
    # the interval is kept where the verdict is withheld
    assert out.loc["top", "estimate"] == pytest.approx(0.02)
    # a "less" claim needs room above the floor; entropy has no bounds
    less = cl.Claim("a_below_b", "a", "b", "less", "final_pass", margin=0.02)
    low = scores.assign(final_pass=scores["final_pass"] - 0.03)  # floor rung: b at 0.22
    lower = cl.headroom(cl.ledger(low, [less]), low, {"floor": cl.Bounds(1.0, 0.2)})
    row = lower.set_index("rung").loc["floor"]
    assert row["verdict"] == ev.NO_HEADROOM and "of the floor 0.200" in row["reason"]
    assert lower.set_index("rung").loc["ok", "verdict"] != ev.NO_HEADROOM  # no bounds given


def test_holm_runs_per_rung_and_reading():
    table = pd.DataFrame(
        {
            "rung": ["x", "x", "x", "y", "x"],
            "reading": ["primary", "primary", "primary", "primary", "secondary"],
            "verdict": [ev.SUPPORTED, ev.REVERSED, ev.NO_HEADROOM, ev.SUPPORTED, ev.SUPPORTED],
            "p": [0.01, 0.04, 0.001, 0.03, 0.02],
        }
    )
    out = cl.holm_by_rung(table)
    # rung x primary: {0.01, 0.04} (no headroom is no test): 0.02, 0.04; y alone: 0.03;
    # x secondary alone: 0.02
    np.testing.assert_allclose(out["p_holm"], [0.02, 0.04, np.nan, 0.03, 0.02])
    assert out["holm"].tolist() == ["survives", "survives", "no decision", "survives", "survives"]
    out = cl.holm_by_rung(table.assign(p=[0.03, 0.04, 0.001, 0.03, 0.02]))
    # x primary {0.03, 0.04}: 2 x 0.03 = 0.06, then max(0.06, 0.04) = 0.06: neither survives
    np.testing.assert_allclose(out["p_holm"][:2], [0.06, 0.06])
    assert out["holm"].tolist()[:2] == ["does not survive", "does not survive"]


def test_the_power_line_leaves_out_a_rule_short_of_seeds():
    """A study cut in units (``--time-budget``) can hold a rule with 1 of 8 seeds: the power line
    is read over the rules with every seed (it was NaN: the short rule's empty seeds dropped
    every row)."""
    import numpy as np
    import pandas as pd

    from sandbox.study.claims import power_lines

    rng = np.random.default_rng(0)
    rows = [
        {"rung": "r", "rule": rule, "seed": s, "final_pass": 0.5 + 0.1 * rng.standard_normal()}
        for rule in ("a", "b", "c")
        for s in range(8)
    ]
    full = power_lines(pd.DataFrame(rows), "final_pass", 0.02)
    cut = power_lines(
        pd.DataFrame([*rows, {"rung": "r", "rule": "d", "seed": 0, "final_pass": 0.4}]),
        "final_pass",
        0.02,
    )
    assert np.isfinite(cut["residual_sd"]).all() and cut.equals(full)
