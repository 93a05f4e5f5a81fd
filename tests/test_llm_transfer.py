"""The transfer study (llm.transfer): scores, rank agreement, resumable parts, the quick mode."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from llm import transfer
from sandbox.experiments.agreement import kendall_tau


def test_kendall_tau_matches_scipy_with_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.integers(0, 4, 7).astype(float), rng.integers(0, 4, 7).astype(float)
        expected = scipy.stats.kendalltau(x, y).statistic
        got = kendall_tau(x, y)
        assert (np.isnan(got) and np.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)
    # 4 rules, one adjacent swap: 5 concordant pairs, 1 discordant -> (5 - 1) / 6
    assert kendall_tau(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == 4 / 6


def _results() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):
        for rule, base in (("a", 0.1), ("b", 0.2), ("c", 0.3)):
            for step, value in ((0, 0.0), (1, base), (2, base + 0.2)):
                rows.append(
                    {
                        "rung": "llm",
                        "rule": rule,
                        "seed": seed,
                        "step": step,
                        "pass_rate": value + 0.01 * seed,
                        "clip_low_frac": np.nan,
                        "clip_high_frac": np.nan,
                        "rescue_frac": np.nan,
                    }
                )
                rows.append(
                    {
                        "rung": "tiny_tf",
                        "rule": rule,
                        "seed": seed,
                        "step": step,
                        "pass_rate": 1 - value,
                        "clip_low_frac": 0.1,
                        "clip_high_frac": 0.05 * step,
                        "rescue_frac": np.nan,
                    }
                )
    return pd.DataFrame(rows)


def test_scores_and_agreement_by_hand() -> None:
    scores = transfer.run_scores(_results())
    llm_a0 = scores.query("rung == 'llm' and rule == 'a' and seed == 0").iloc[0]
    # llm: step 0 is the baseline, excluded; mean of 0.1 and 0.3 = 0.2; final 0.3; start 0.0
    assert llm_a0["score"] == pytest.approx(0.2) and llm_a0["final"] == pytest.approx(0.3)
    assert llm_a0["start"] == 0.0
    tf_a0 = scores.query("rung == 'tiny_tf' and rule == 'a' and seed == 0").iloc[0]
    # toy rungs: every step counts for the clip fraction: mean of 0.1 + (0, 0.05, 0.1)
    assert tf_a0["clip_frac"] == pytest.approx(0.15)
    summary = transfer.summarise(scores)
    row = summary.query("rung == 'llm' and rule == 'c'").iloc[0]
    assert row["score"] == pytest.approx(0.405) and row["score_se"] == pytest.approx(0.005)
    assert row["rank"] == 1.0 and row["seeds"] == 2
    agreement = transfer.rank_agreement(scores, draws=50)
    (pair,) = agreement.itertuples()
    # tiny_tf's pass rates are 1 - llm's: every pair of rules is discordant
    assert (pair.rung_a, pair.rung_b, pair.rules) == ("tiny_tf", "llm", 3)
    assert pair.tau == -1.0 and pair.tau_lo == -1.0 and pair.tau_hi == -1.0


def test_bad_settings_name_the_flag() -> None:
    with pytest.raises(ValueError, match="unknown rung 'gpt'"):
        transfer.TransferConfig(rungs=["gpt"]).validate()
    with pytest.raises(ValueError, match="--epochs x --minibatches must be >= 2"):
        transfer.TransferConfig(epochs=1, minibatches=1).validate()
    with pytest.raises(ValueError, match="--llm-steps must be > 0"):
        transfer.TransferConfig(llm_steps=0).validate()
    with pytest.raises(ValueError, match="unknown objective"):
        transfer.TransferConfig(rules=["nope"]).validate()
    assert transfer.main(["--rungs", "gpt", "--out", "/nonexistent"]) == 2


def test_cpu_profile_keeps_the_required_llm_rules() -> None:
    config, _ = transfer.parse_args([])
    assert config.llm_rules == ["dapo", "gspo", "nsr_dapo", "dgpo"] and config.seeds == 2
    assert config.epochs * config.minibatches == 4
    config, _ = transfer.parse_args(["--rules", "dapo", "grpo", "gspo"])
    assert config.llm_rules == ["dapo", "gspo"]
    jobs = transfer.jobs(config)
    assert ("bandit_exact", "grpo", 0) in jobs and ("bandit_exact", "grpo", 1) not in jobs
    assert ("llm", "grpo", 0) not in jobs and ("llm", "gspo", 1) in jobs


@pytest.mark.slow
def test_quick_study_writes_everything_and_resumes(tmp_path) -> None:
    config, _ = transfer.parse_args(
        ["--quick", "--rungs", "bandit_exact", "bandit_sampled", "llm", "--seeds", "1"]
    )
    results = transfer.run_study(config, tmp_path, progress=False)
    parts = sorted(p.name for p in (tmp_path / "parts").iterdir())
    assert len(parts) == 3 * 3 and "llm__nsr_dapo__s0.parquet" in parts
    assert set(results["rung"]) == {"bandit_exact", "bandit_sampled", "llm"}
    for name in ("results.parquet", "scores.csv", "summary.csv", "agreement.csv", "transfer.png"):
        assert (tmp_path / name).stat().st_size > 0
    llm = results[results["rung"] == "llm"]
    assert sorted(llm["step"].unique()) == [0, 1]  # the step-0 baseline and one step
    assert llm["pass_rate"].between(0, 1).all()
    sampled = results[results["rung"] == "bandit_sampled"]
    assert (sampled["clip_low_frac"] + sampled["clip_high_frac"]).max() > 0  # the rules acted
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "parts").iterdir()}
    transfer.run_study(config, tmp_path, progress=False)  # resumes: nothing recomputed
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "parts").iterdir()}
    before = pd.read_csv(tmp_path / "summary.csv")
    (tmp_path / "summary.csv").unlink()
    assert transfer.main(["--tables-only", "--out", str(tmp_path)]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "summary.csv"), before)
