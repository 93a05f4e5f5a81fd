"""sandbox.experiments.claims: the claim records and the ledger, on a score table whose paired
differences are worked by hand."""

import numpy as np
import pandas as pd
import pytest

from sandbox.experiments import claims as cl
from sandbox.experiments import evidence as ev
from sandbox.objectives import get_objective


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
    for rule, shift in (("dapo", [0, 0, 0, 0]), ("nsr_dapo", [0.1, 0.2, 0.1, 0.2]),
                        ("nsr_decay_dapo", [0.0, 0.3, 0.0, 0.3])):  # fmt: skip
        for s, b, d in zip(seeds, base, shift, strict=True):
            rows.append({"rung": "toy", "rule": rule, "seed": s, "final_pass": b + d,
                         "clip_frac": 0.05 if rule == "dapo" else 0.02})  # fmt: skip
    return pd.DataFrame(rows)


def test_ledger_rows_are_the_paired_differences_by_hand():
    table = cl.ledger(_scores(), margins={"final_pass": 0.05})
    assert set(table["claim"]) == {"nsr_beats_dapo", "nsr_beats_its_decay"}  # others lack rules
    row = table.set_index("claim").loc["nsr_beats_dapo"]
    sd = np.sqrt(4 * 0.05**2 / 3)
    assert row["estimate"] == pytest.approx(0.15, abs=1e-12)
    assert row["diff_sd"] == pytest.approx(sd, abs=1e-12)
    assert row["lo"] == pytest.approx(0.15 - 3.1824463052837078 * sd / 2, abs=1e-9)
    assert row["verdict"] == ev.SUPPORTED and row["seeds"] == 4
    assert (row["clip_frac_a"], row["clip_frac_b"]) == (0.02, 0.05)
    assert row["seeds_needed"] == ev.seeds_needed(sd, 0.05)
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
