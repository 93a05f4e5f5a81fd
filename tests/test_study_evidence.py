"""sandbox.study.evidence: paired intervals, verdicts, power and tau-b, against values
worked by hand (and scipy where it computes the same thing)."""

import numpy as np
import pytest
from scipy import stats

from sandbox.study import evidence as ev


def test_paired_difference_is_the_t_interval_of_the_seed_differences():
    # d = a - b = [1, 0, 2, 2]: mean 1.25; deviations -0.25, -1.25, 0.75, 0.75 -> SS 2.75,
    # sd = sqrt(2.75 / 3) = 0.957427; half = t(0.975, 3) 3.182446 * sd / 2 = 1.523480
    d = ev.paired_difference([1, 2, 3, 4], [0, 2, 1, 2])
    assert d.n == 4
    assert d.estimate == pytest.approx(1.25, abs=1e-12)
    assert d.sd == pytest.approx(np.sqrt(2.75 / 3), abs=1e-12)
    assert d.lo == pytest.approx(1.25 - 1.5234801808288123, abs=1e-9)
    assert d.hi == pytest.approx(1.25 + 1.5234801808288123, abs=1e-9)


def test_paired_difference_drops_a_seed_missing_for_either_rule():
    d = ev.paired_difference([1.0, np.nan, 3.0], [0.0, 5.0, 1.0])  # pairs (1, 0), (3, 1)
    assert d.n == 2 and d.estimate == pytest.approx(1.5)
    one = ev.paired_difference([1.0, np.nan], [0.0, 1.0])
    assert one.n == 1 and np.isnan(one.lo) and np.isnan(one.hi)


def test_pairing_removes_the_seed_effect_that_an_unpaired_interval_keeps():
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 1.0, 16)  # large, shared by both rules under one seed
    a = seed_effect + 0.1 + rng.normal(0, 0.01, 16)
    b = seed_effect + rng.normal(0, 0.01, 16)
    d = ev.paired_difference(a, b)
    assert d.lo > 0  # resolved paired
    unpaired_half = 2.131 * np.sqrt(a.var(ddof=1) / 16 + b.var(ddof=1) / 16)
    assert unpaired_half > 0.1  # the unpaired interval (t with 15 df) would contain 0


@pytest.mark.parametrize(
    ("lo", "hi", "direction", "margin", "expected"),
    [
        (0.01, 0.05, "greater", 0.0, ev.SUPPORTED),
        (0.001, 0.002, "greater", 0.02, ev.SUPPORTED),  # above 0: supported, however small
        (-0.05, -0.01, "greater", 0.0, ev.REVERSED),
        (-0.002, -0.001, "greater", 0.02, ev.REVERSED),  # below 0: reversed, however small
        (-0.05, -0.01, "less", 0.0, ev.SUPPORTED),
        (-0.01, 0.05, "greater", 0.0, ev.UNRESOLVED),
        # contains 0, every effect within +-0.02: equivalent
        (-0.0005, 0.0008, "greater", 0.02, ev.EQUIVALENT),
        # contains 0, a gain of 0.02 excluded, a loss of 0.03 not: no gain of the margin
        (-0.03, 0.005, "greater", 0.02, ev.NO_GAIN),
        (-0.01, 0.03, "greater", 0.02, ev.UNRESOLVED),  # allows a gain of 0.02
        # claimed side of "less": -hi..-lo = -0.01..0.005, within +-0.02: equivalent
        (-0.005, 0.01, "less", 0.02, ev.EQUIVALENT),
        # claimed side: -0.001..0.03 allows a gain of 0.02
        (-0.03, 0.001, "less", 0.02, ev.UNRESOLVED),
        (0.0, 0.0, "greater", 0.02, ev.EQUIVALENT),  # an exact tie
    ],
)
def test_verdict_reads_the_interval_against_zero_and_the_margin(
    lo, hi, direction, margin, expected
):
    diff = ev.PairedDifference((lo + hi) / 2, lo, hi, 0.1, 8)
    assert ev.verdict(diff, direction, margin)[0] == expected


def test_verdict_classes_are_symmetric_in_the_claimed_direction():
    # mirroring the interval and the direction together never changes the class
    for lo, hi in [(0.01, 0.05), (-0.05, -0.01), (-0.0005, 0.0008), (-0.03, 0.005), (-0.01, 0.03)]:
        a = ev.PairedDifference((lo + hi) / 2, lo, hi, 0.1, 8)
        b = ev.PairedDifference(-(lo + hi) / 2, -hi, -lo, 0.1, 8)
        assert ev.verdict(a, "greater", 0.02)[0] == ev.verdict(b, "less", 0.02)[0]
    # and a supported claim read the other way round is a reversal of the same size
    up = ev.PairedDifference(0.03, 0.01, 0.05, 0.1, 8)
    assert (ev.verdict(up, "greater")[0], ev.verdict(up, "less")[0]) == (ev.SUPPORTED, ev.REVERSED)
    assert set(ev.VERDICTS).isdisjoint(ev.NOT_VERDICTS)


def test_paired_p_is_the_paired_t_test():
    from scipy import stats

    a = np.array([0.31, 0.42, 0.28, 0.35, 0.40, 0.37])
    b = np.array([0.30, 0.36, 0.29, 0.30, 0.33, 0.36])
    want = stats.ttest_rel(a, b).pvalue
    assert ev.paired_p(ev.paired_difference(a, b)) == pytest.approx(want, rel=1e-12)
    # hand: d = .01 .06 -.01 .05 .07 .01, mean .03167, sd .03251, t = 2.386 (5 df), p = 0.0627
    assert ev.paired_p(ev.paired_difference(a, b)) == pytest.approx(0.0627, abs=5e-4)
    exact = ev.PairedDifference(0.01, 0.01, 0.01, 0.0, 2)
    assert ev.paired_p(exact) == 0.0
    assert ev.paired_p(ev.PairedDifference(0.0, 0.0, 0.0, 0.0, 2)) == 1.0
    assert np.isnan(ev.paired_p(ev.paired_difference([1.0], [0.0])))


def test_holm_adjusts_by_hand():
    # sorted: .005 (x4 = .02), .01 (x3 = .03), .03 (x2 = .06), .04 (x1 = .04 -> running max .06)
    got = ev.holm([0.01, 0.04, 0.03, np.nan, 0.005])
    np.testing.assert_allclose(got, [0.03, 0.06, 0.06, np.nan, 0.02])
    np.testing.assert_allclose(ev.holm([0.5, 0.6]), [1.0, 1.0])  # capped at 1
    assert ev.holm([0.2]).tolist() == [0.2]  # a family of one is not adjusted
    assert np.isnan(ev.holm([np.nan])).all()
    with pytest.raises(ValueError, match="pvalues"):
        ev.holm([1.5])


def test_verdict_without_an_interval_is_unresolved_and_bad_arguments_name_themselves():
    assert ev.verdict(ev.paired_difference([1.0], [0.0]), "greater")[0] == ev.UNRESOLVED
    diff = ev.PairedDifference(0.0, -1.0, 1.0, 1.0, 4)
    with pytest.raises(ValueError, match="direction"):
        ev.verdict(diff, "better")
    with pytest.raises(ValueError, match="margin"):
        ev.verdict(diff, "greater", -0.1)
    with pytest.raises(ValueError, match="level"):
        ev.paired_difference([1, 2], [0, 1], level=95)


def test_residual_sd_removes_seed_and_rule_means():
    # [[1, 2], [3, 5]]: row means 1.5, 4; column means 2, 3.5; grand 2.75 -> residuals +-0.25,
    # SS 0.25 over (2 - 1)(2 - 1) = 1 df -> 0.5. An additive table has residual 0.
    assert ev.residual_sd(np.array([[1.0, 2.0], [3.0, 5.0]])) == pytest.approx(0.5, abs=1e-12)
    assert ev.residual_sd(np.array([[1.0, 2.0], [3.0, 4.0]])) == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(ev.residual_sd(np.array([[1.0, 2.0]])))


def test_seeds_needed_matches_the_paired_t_test_tables():
    # dz = 0.5, two-sided alpha 0.05, power 0.8: 34 pairs (Cohen's table; G*Power gives 34)
    assert ev.seeds_needed(1.0, 0.5) == 34
    assert ev.paired_power(34, 1.0, 0.5) >= 0.8 > ev.paired_power(33, 1.0, 0.5)
    # the transfer study's LLM rung: residual SD 0.018 -> difference SD 0.018 * sqrt(2); a 0.02
    # difference needs 15 paired seeds (the "about 16")
    assert ev.seeds_needed(0.018 * np.sqrt(2), 0.02) == 15
    with pytest.raises(ValueError, match="sd"):
        ev.seeds_needed(0.0, 0.02)


@pytest.mark.parametrize(("n", "sd"), [(2, 0.001), (8, 0.005), (3, 0.0005)])
def test_paired_power_stays_finite_at_large_effects(n, sd):
    # scipy's noncentral t gives NaN at these noncentralities (28, 11, 69); the power must not be
    # NaN (seeds_needed used to read NaN as "enough"). Checked against a simulated paired t-test.
    from scipy import stats

    power = ev.paired_power(n, sd, 0.02)
    rng = np.random.default_rng(1)
    d = rng.normal(0.02, sd, (100_000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
    simulated = np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1))
    assert np.isfinite(power) and power == pytest.approx(simulated, abs=0.005)
    assert ev.paired_power(n, 0.0, 0.02) == 1.0  # noiseless differences
    needed = ev.seeds_needed(sd, 0.02)  # the first n at 80%, never a NaN read as enough
    assert ev.paired_power(needed, sd, 0.02) >= 0.8
    assert needed == 2 or ev.paired_power(needed - 1, sd, 0.02) < 0.8


def _simulated_power(n: int, sd: float, effect: float, alpha: float, studies: int) -> float:
    """The share of ``studies`` simulated paired studies (``n`` normal differences each, numpy)
    whose two-sided paired t-test at ``alpha`` rejects a mean of 0; drawn in chunks of studies
    so that 20,000 studies of 3,000 seeds never hold more than 2.4e7 numbers at once."""
    rng = np.random.default_rng(20261129)
    crit, rejected = stats.t.ppf(1 - alpha / 2, n - 1), 0
    for size in np.diff(np.r_[0:studies:1000, studies]):
        d = rng.normal(effect, sd, (size, n))
        t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
        rejected += int(np.count_nonzero(np.abs(t) > crit))
    return rejected / studies


@pytest.mark.parametrize(
    ("effect", "sd", "n", "alpha"),
    [
        (0.8, 1.0, 10, 0.05),  # small n: nc 2.53, power ~0.62
        (0.08, 0.5, 200, 0.01),  # nc 2.26, power ~0.37
        (0.07, 1.0, 2000, 0.05 / 6),  # a Bonferroni level (claims.claim_level): nc 3.13, ~0.69
        (0.02, 0.25, 3000, 0.05 / 7),  # nc 4.38 at 3,000 seeds: power ~0.95
        (0.03, 0.2, 3000, 0.05 / 7),  # nc 8.22, power 1 - 2e-8: nct.cdf NaN, the old code gave 0
    ],
)
def test_paired_power_matches_a_simulated_paired_t_test(effect, sd, n, alpha):
    # 20,000 simulated studies: the simulated share has SE sqrt(p (1 - p) / 20,000) <= 0.0036;
    # 4 SEs (floored at 1 / 20,000 where p is ~1) bound the simulation's own error
    studies = 20_000
    power = ev.paired_power(n, sd, effect, alpha)
    simulated = _simulated_power(n, sd, effect, alpha, studies)
    se = max(np.sqrt(power * (1 - power) / studies), 1 / studies)
    assert abs(power - simulated) <= 4 * se, (power, simulated, se)


def test_paired_power_is_not_zero_where_scipy_loses_the_far_tail():
    # a regime candidate's claim (results/regimes/pilot.csv, setting=needle, steps=15): SD of
    # differences 0.2073 at 16,457 seeds, margin 0.02, level 0.05 / 7: nc = 0.02 / 0.2073 *
    # sqrt(16457) = 12.38, the critical t ~2.69, so the power is Phi(12.38 - 2.69) ~ 1 - 2e-22;
    # scipy's nct.cdf(-c, df, nc) is NaN there and the old code returned 0.0
    assert np.isnan(stats.nct.cdf(-stats.t.ppf(1 - 0.05 / 14, 16456), 16456, 12.3786))
    power = ev.paired_power(16457, 0.2072685497, 0.02, alpha=0.05 / 7)
    assert power == pytest.approx(1.0, abs=1e-12)
    # 1,999 pairs, dz 0.2 (nc 8.94) at 0.05: 1 - Phi(8.94 - 1.96) ~ 1 - 1.5e-12
    assert ev.paired_power(2000, 1.0, 0.2) == pytest.approx(1.0, abs=1e-11)
    # the far tail where scipy keeps it: the two tails sum as before (dz 0.5 at 34 pairs)
    crit = stats.t.ppf(0.975, 33)
    both = stats.nct.sf(crit, 33, 0.5 * np.sqrt(34)) + stats.nct.cdf(-crit, 33, 0.5 * np.sqrt(34))
    assert ev.paired_power(34, 1.0, 0.5) == pytest.approx(both, abs=1e-12)


def test_seeds_needed_agrees_with_a_simulated_paired_t_test():
    n = ev.seeds_needed(1.0, 0.8)  # 15
    rng = np.random.default_rng(1)
    d = rng.normal(0.8, 1.0, size=(20_000, n))
    p = stats.ttest_1samp(d, 0.0, axis=1).pvalue
    assert np.mean(p < 0.05) == pytest.approx(ev.paired_power(n, 1.0, 0.8), abs=0.01)


@pytest.mark.parametrize("n", [4, 9, 40])
def test_correlation_and_its_interval_match_scipys_fisher_z(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=n)
    y = 0.7 * x + rng.normal(size=n)
    r, lo, hi = ev.correlation(x, y)
    ref = stats.pearsonr(x, y)
    ci = ref.confidence_interval(0.95)
    assert r == pytest.approx(ref.statistic, abs=1e-12)
    assert (lo, hi) == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9))


def test_correlation_is_nan_where_undefined_and_finite_at_r_1():
    assert all(np.isnan(ev.correlation([1.0, 2.0], [3.0, 4.0])[1:]))  # 2 points: r, no interval
    assert all(np.isnan(ev.correlation([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])))
    r, lo, hi = ev.correlation([1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0, 8.0, 10.0])
    assert r == pytest.approx(1.0) and np.isfinite(lo) and lo <= hi <= 1.0
