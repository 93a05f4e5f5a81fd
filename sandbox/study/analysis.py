"""The study's analysis: per run (rung, rule, seed) the scores are the metrics of :mod:`.claims`
(``final_pass``: bandits, the exact expected reward of the last logged policy; ``tiny_tf``,
held-out pass@1 of the final model on ``tf_eval_prompts`` problems fixed by the seed,
``tf_eval_k`` samples each) and the mechanism columns (``clip_frac``, ``rescue_frac``, the
gradient mass shares of :func:`sandbox.loss.grad_mass_shares`), averaged over steps. Mechanism
checks (a) and (c), where logged per step: :func:`entropy_law`, :func:`gradient_noise`.

Transfer (below): does a claim's paired effect keep its sign from rung to rung, read off the
ledgers (:func:`transfer_table`, :func:`transfer_agreement`, :func:`write_transfer`).

Every table here is a function of the study's tidy rows (or of :func:`run_scores`), in one row
order whatever order the parts were read in (:func:`canonical_rows`, :func:`ladder_order`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import betaincinv

from sandbox.experiments.results import sorted_rows, write_csv
from sandbox.experiments.runs import objective_of
from sandbox.grad_noise import GRAD_NOISE_COLUMNS

from . import evidence
from .claims import (
    AT_MARGIN_COLUMNS,
    CLAIMS,
    POWER_COLUMNS,
    Bounds,
    Claim,
    claim_level,
    decided_at_margin,
    headroom,
    holm_by_rung,
    ledger,
    power_lines,
    seeds_for,
)
from .evidence import NOT_VERDICTS
from .rungs import (
    MARGINS,
    MECHANISM,
    NEVER_BINDS,
    ONE_AXIS,
    REFERENCE,
    RUNGS,
    STEP_SIZE_RULE,
    evaluation_only,
)

#: The columns that identify a row of the study (:func:`canonical_rows` sorts by them).
ROW_KEYS = ["phase", "rung", "rule", "lr", "epochs", "seed", "step"]


def ladder_order(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``frame`` sorted by ``keys`` (stable), a ``rung`` column in ladder order (:data:`RUNGS`,
    then unknown rungs by name), every other key by value; the index renumbered."""
    ladder = {rung: i for i, rung in enumerate(RUNGS)}

    def key(column: pd.Series) -> pd.Series:
        if column.name != "rung":
            return column
        return column.map(lambda r: f"{ladder.get(r, len(ladder)):06d} {r}")

    by = [k for k in keys if k in frame.columns]
    if frame.empty or not by:
        return frame.reset_index(drop=True)
    return frame.sort_values(by, key=key, kind="stable").reset_index(drop=True)


def canonical_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The study's rows in one order whatever order the parts were read in
    (:func:`~.results.sorted_rows` by :data:`ROW_KEYS`): every table derived from them is then
    the same to the last bit."""
    return sorted_rows(rows, ROW_KEYS)


def calibration_curve(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (rung, epochs, lr): the reference rule's clip share (mean over steps and seeds) and
    the mean pass rate. No SE over seeds: the toy trainers pool the objective's metrics over the
    seeds of a run (one value per step, repeated on every seed's row)."""
    calib = canonical_rows(rows[rows["phase"] == "calib"])
    calib["clip_share"] = calib["clip_low_frac"] + calib["clip_high_frac"]
    keys = ["rung", "epochs", "lr"]
    per_seed = calib.groupby([*keys, "seed"], as_index=False)[["clip_share", "pass_rate"]].mean()
    curve = per_seed.groupby(keys, as_index=False).agg(
        clip_share=("clip_share", "mean"),
        pass_rate=("pass_rate", "mean"),
        seeds=("seed", "nunique"),
    )
    return ladder_order(curve, keys)


def run_scores(rows: pd.DataFrame, phase: str = "study") -> pd.DataFrame:
    """Per run of ``phase`` (rung, rule, seed; and step size for ``tune``, whose rules run at
    several): the claims' metrics and the mechanism columns; rows in ladder order, then by rule
    and seed."""
    study = canonical_rows(rows[rows["phase"] == phase])
    study = study.assign(clip_frac=study["clip_low_frac"] + study["clip_high_frac"])
    keys = ["rung", "rule", "lr", "seed"] if phase == "tune" else ["rung", "rule", "seed"]
    g = study[~evaluation_only(study)].groupby(keys, sort=False)
    scores = g.agg(
        **({} if "lr" in keys else {"lr": ("lr", "first")}),
        epochs=("epochs", "first"),
        reward_auc=("train_reward", "mean"),
        final_entropy=("entropy", "last"),
        **{m: (m, "mean") for m in MECHANISM},
    ).reset_index()

    def last(column: str) -> pd.Series:  # held-out pass@1 where evaluated, else the pass rate
        return study.dropna(subset=[column]).groupby(keys)[column].last()

    final = last("eval_pass").combine_first(last("pass_rate")).rename("final_pass")
    return ladder_order(scores.merge(final.reset_index(), on=keys, how="left"), keys)


def study_ledger(
    scores: pd.DataFrame,
    claims: Sequence[Claim] = CLAIMS,
    bounds: Mapping[str, Bounds] | None = None,
    reading: str = "primary",
) -> pd.DataFrame:
    """:func:`.claims.ledger` with the study's margins, then:

    - on a deterministic rung (one exact run) the difference is exact (a zero-width interval):
      two rules that follow one expected coefficient there (:func:`same_on_exact_flow`: NSR and
      its decay) are :data:`.evidence.IDENTICAL`, not a verdict; a gap within +- the margin is
      equivalent; a larger one is supported or reversed by its sign (``p`` is NaN: no test);
    - the headroom rule (:func:`.claims.headroom`) with ``bounds`` (:func:`study_bounds`;
      None: no headroom check);
    - Holm's adjustment over each rung's primary family (:func:`.claims.holm_by_rung`);
    - ``below_margin``: every effect the interval allows (the exact gap) is within +- the margin;
    - the power at the Holm level (:func:`holm_power`).
    """
    table = ledger(scores, claims, margins=MARGINS, reading=reading)
    if not len(table):
        return table
    for i, row in table.iterrows():
        if not (
            row["rung"] in RUNGS and RUNGS[row["rung"]].traits.deterministic and row["seeds"] == 1
        ):
            continue
        d, m = float(row["estimate"]), float(row["margin"])
        if same_on_exact_flow(row["rule_a"], row["rule_b"]):
            verdict, reason = evidence.IDENTICAL, "one expected coefficient on the exact flow"
        elif abs(d) < m:
            verdict, reason = evidence.EQUIVALENT, f"exact difference within +-{m:g}"
        else:
            exact = evidence.PairedDifference(d, d, d, 0.0, 1)
            verdict, reason = evidence.verdict(exact, row["direction"], m)[0], "exact difference"
        table.loc[i, ["verdict", "reason", "p"]] = verdict, reason, np.nan
    if bounds is not None:
        keep = table["verdict"] == evidence.IDENTICAL  # not a comparison: no headroom to check
        checked = headroom(table[~keep], scores, bounds, REFERENCE)
        table = pd.concat([checked, table[keep]]).sort_index()
    table = holm_by_rung(table)
    exact = table["estimate"].where(table["seeds"] == 1)
    lo, hi = table["lo"].fillna(exact), table["hi"].fillna(exact)
    table["below_margin"] = (hi < table["margin"]) & (lo > -table["margin"])
    return holm_power(table)


def holm_power(table: pd.DataFrame, power: float = 0.8) -> pd.DataFrame:
    """``table`` with the power line at the level Holm's first step tests a rung's family at,
    0.05 / k over its k tested rows on one reading (a lower bound on Holm's power, as the regime
    rule plans, :func:`.claims.claim_level`): ``power_holm``, the paired t-test's power to find an
    effect of the margin at the row's seeds and SD of differences, and ``seeds_needed_holm`` for
    ``power`` there; NaN on a row without a test (an exact difference, too few seeds)."""
    out = table.assign(power_holm=np.nan, seeds_needed_holm=np.nan)
    tested = np.isfinite(out["diff_sd"].astype(float)) & (out["seeds"] > 1)
    tested &= (out["diff_sd"] > 0) & np.isfinite(out["margin"].astype(float))
    for _, part in out[tested].groupby(["reading", "rung"], sort=False):
        alpha = claim_level(len(part))
        for i, row in part.iterrows():
            sd, m, n = float(row["diff_sd"]), float(row["margin"]), int(row["seeds"])
            out.loc[i, "power_holm"] = evidence.paired_power(n, sd, m, alpha)
            out.loc[i, "seeds_needed_holm"] = seeds_for(sd, m, power, alpha)
    return out


def step_size_choice(rows: pd.DataFrame) -> pd.DataFrame:
    """The step-size control's choice, by its pre-registered rule: per rung, rule and step size of
    the tuning runs (phase ``tune``, on seeds disjoint from the study's), the mean ``final_pass``
    over their seeds; ``chosen``: the rule's highest (the smaller step size at a tie)."""
    scores = run_scores(rows, "tune")
    keys = ["rung", "rule", "lr"]
    table = scores.groupby(keys, as_index=False, sort=False).agg(
        epochs=("epochs", "first"), seeds=("seed", "nunique"), final_pass=("final_pass", "mean")
    )
    table = ladder_order(table.sort_values(keys, kind="stable"), ["rung"])
    best = table.sort_values(["final_pass", "lr"], ascending=[False, True], kind="stable")
    chosen = best.dropna(subset=["final_pass"]).groupby(["rung", "rule"]).head(1).index
    return table.assign(chosen=table.index.isin(chosen)).reset_index(drop=True)


def controlled_ledger(
    scores: pd.DataFrame,
    claims: Sequence[Claim],
    bounds: Mapping[str, Bounds] | None,
    calibrated: pd.DataFrame,
) -> pd.DataFrame:
    """The claims read with each rule at its own step size (the control's runs, ``scores`` of
    phase ``control``), beside the verdict at the calibrated step size (``calibrated``: the
    study's ledger): ``verdict_calibrated`` and whether the verdict survives (``same``)."""
    table = study_ledger(scores, claims, bounds, "control")
    if not len(table):
        return table
    keys = ["claim", "rung", "metric"]
    before = calibrated[[*keys, "verdict"]].rename(columns={"verdict": "verdict_calibrated"})
    table = table.merge(before, on=keys, how="left")
    return table.assign(same=table["verdict"] == table["verdict_calibrated"])


def same_on_exact_flow(rule_a: str, rule_b: str) -> bool:
    """Whether two rules take the same step on an exact expected-gradient flow, which uses each
    rule's expected coefficient: a stochastic rule acts there as its deterministic counterpart
    (:meth:`~sandbox.objectives.base.Objective.expectation`)."""
    a, b = (o.expectation() or o for o in map(objective_of, (rule_a, rule_b)))
    return (type(a), dict(a.params)) == (type(b), dict(b.params))


def auc_claims(claims: Sequence[Claim] = CLAIMS) -> list[Claim]:
    """The ``final_pass`` claims restated on ``reward_auc`` (the area under the training-reward
    curve: it separates rules that all end near a saturated optimum by how fast they got there)."""
    return [replace(c, metric="reward_auc") for c in claims if c.metric == "final_pass"]


def rung_power(scores: pd.DataFrame) -> pd.DataFrame:
    """The power line of every rung with paired seeds, for every metric with a margin."""
    sampled = scores[scores.groupby("rung")["seed"].transform("nunique") > 1]
    frames = [power_lines(sampled, m, MARGINS[m]) for m in MARGINS if sampled[m].notna().any()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=POWER_COLUMNS)


def rule_summary(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (rung, rule): seeds, the metrics' means, the mechanism columns, and ``never_binds``:
    a rule that reports clip shares whose bounds (almost) never bound (below
    :data:`NEVER_BINDS`); NaN ``clip_frac``: the rule reports none (no bounds, e.g. unclipped,
    KL-Cov's penalty); ``like_unclipped``: its realised effect lies within the margin of the
    unclipped rule's, whatever its sign (:func:`like_unclipped`)."""
    cols = ["final_pass", "reward_auc", "final_entropy", *MECHANISM]
    scores = ladder_order(scores, ["rung", "rule", "seed"])
    g = scores.groupby(["rung", "rule"], sort=False)
    out = g[cols].mean().reset_index()
    out.insert(2, "seeds", g["seed"].nunique().to_numpy())
    first = g[["lr", "epochs"]].first()
    out["lr"], out["epochs"] = first["lr"].to_numpy(), first["epochs"].to_numpy()
    out["never_binds"] = out["clip_frac"] < NEVER_BINDS  # NaN (no bounds reported): False
    pairs = zip(out["rung"], out["rule"], strict=True)
    out["like_unclipped"] = [like_unclipped(scores, rung, rule) for rung, rule in pairs]
    return out


#: The rule without a trust region that :func:`like_unclipped` compares with.
UNCLIPPED = "unclipped"


def like_unclipped(scores: pd.DataFrame, rung: str, rule: str, metric: str = "reward_auc") -> bool:
    """Whether ``rule`` is indistinguishable from :data:`UNCLIPPED` on ``rung`` by its realised
    effect, whatever clip share it reports (or none, as KL-Cov's penalty): the paired interval of
    its ``metric`` minus the unclipped rule's lies within +- the metric's margin
    (:func:`.evidence.within_margin`, the verdict's equivalence test), whatever its sign: under
    common random numbers a tiny gap has an interval that excludes 0, which the verdict calls
    supported or reversed before it asks about equivalence. False without paired seeds of both."""
    on = scores[(scores["rung"] == rung) & scores["rule"].isin([rule, UNCLIPPED])]
    table = on.pivot_table(index="seed", columns="rule", values=metric)
    if rule == UNCLIPPED or UNCLIPPED not in table or rule not in table or len(table) < 2:
        return False
    diff = evidence.paired_difference(table[rule].to_numpy(), table[UNCLIPPED].to_numpy())
    return evidence.within_margin(diff, MARGINS[metric])


#: The readings of :func:`one_axis`.
AXIS_READINGS = ("one axis", "other axes too", "not resolved at this power", "too few rules")


def one_axis(summary: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per (rung, metric): Pearson's r, over the rules, between a rule's mean and the share of the
    advantage-weighted gradient mass it zeroes (``grad_mass_zero_lo + grad_mass_zero_hi``), with
    its Fisher-z interval (:func:`.evidence.correlation`); the same r as for the rules' effects
    against any one of them. Rules: those with the shares logged (not an exact flow, not llm.train
    runs), less :data:`STEP_SIZE_RULE` (its bounds are 1e3 x narrower, so its one point would
    set r). ``reading``: ``one axis`` where the interval lies beyond +-:data:`ONE_AXIS` (the rung
    ranks rules by the gradient they discard), ``other axes too`` where it lies within, else
    not resolved at this power; ``too few rules`` below 4."""
    s = summary.dropna(subset=["grad_mass_zero_lo", "grad_mass_zero_hi"])
    s = s[s["rule"] != STEP_SIZE_RULE].assign(
        zeroed=lambda f: f["grad_mass_zero_lo"] + f["grad_mass_zero_hi"]
    )
    out = []
    for rung, g in s.groupby("rung", sort=False):
        for metric in MARGINS:
            r, lo, hi = evidence.correlation(g[metric].to_numpy(), g["zeroed"].to_numpy(), level)
            if math.isnan(lo):
                reading = AXIS_READINGS[3]
            elif lo > ONE_AXIS or hi < -ONE_AXIS:
                reading = AXIS_READINGS[0]
            elif lo > -ONE_AXIS and hi < ONE_AXIS:
                reading = AXIS_READINGS[1]
            else:
                reading = AXIS_READINGS[2]
            out.append((rung, metric, len(g), r, lo, hi, reading))
    columns = ["rung", "metric", "rules", "r", "lo", "hi", "reading"]
    return pd.DataFrame(out, columns=columns)


def entropy_law(rows: pd.DataFrame) -> pd.DataFrame:
    """Mechanism check (a), per (rung, rule) where logged: the observed per-step entropy change
    against the entropy-covariance law's first-order prediction from the same step's logit
    change, over every step and seed: means, correlation, least-squares slope (1 where the law
    holds) and the RMS of observed - predicted."""
    study = canonical_rows(rows[(rows["phase"] == "study")]).dropna(
        subset=["entropy_change", "entropy_change_pred"]
    )
    out = []
    for (rung, rule), g in study.groupby(["rung", "rule"], sort=False):
        obs, pred = g["entropy_change"].to_numpy(), g["entropy_change_pred"].to_numpy()
        # one point or a constant series: NaN (numpy would warn on the real command's stderr)
        varies = len(g) > 1 and obs.std() > 0 and pred.std() > 0
        corr = float(np.corrcoef(obs, pred)[0, 1]) if varies else float("nan")
        slope = float(np.dot(pred, obs) / np.dot(pred, pred)) if pred.any() else float("nan")
        rms = float(np.sqrt(np.mean((obs - pred) ** 2)))
        out.append((rung, rule, len(g), obs.mean(), pred.mean(), corr, slope, rms))
    columns = ["rung", "rule", "points", "observed_mean", "predicted_mean"]
    columns += ["corr", "slope", "rms_error"]
    return ladder_order(pd.DataFrame(out, columns=columns), ["rung", "rule"])


def gradient_noise(rows: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Mechanism check (c), per (rung, rule) where logged (:mod:`sandbox.grad_noise`): per seed,
    the step-means of ``rescue_var`` (the rule's own noise, ``||g_rule - g_det||^2``),
    ``sampling_var`` (the batch's, ``tr Cov[g_det]``) and ``signal`` (``||g_det||^2``); then over
    seeds the means of ``rescue_var / signal`` and ``sampling_var / signal`` and of the variance
    ratio ``Var(rule) / Var(det) ~ 1 + rescue_var / sampling_var``, with its Student-t
    ``level`` interval over seeds (:func:`.evidence.paired_difference` against 0; a seed whose
    sampling variance is 0 gives no ratio). ``points``: the (step, seed) rows used."""
    columns = ["rung", "rule", "seeds", "points", "rescue_to_signal", "sampling_to_signal"]
    columns += ["variance_ratio", "lo", "hi"]
    if not set(GRAD_NOISE_COLUMNS) <= set(rows.columns):  # parts written before (c) was logged
        return pd.DataFrame(columns=columns)
    study = canonical_rows(rows[rows["phase"] == "study"]).dropna(subset=list(GRAD_NOISE_COLUMNS))
    out = []
    for (rung, rule), g in study.groupby(["rung", "rule"], sort=False):
        per_seed = g.groupby("seed")[list(GRAD_NOISE_COLUMNS)].mean()
        rescue, sampling, signal = (per_seed[c].to_numpy(float) for c in GRAD_NOISE_COLUMNS)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = 1.0 + rescue / sampling
            shares = [_finite_mean(x / signal) for x in (rescue, sampling)]
        ci = evidence.paired_difference(ratio, np.zeros_like(ratio), level)
        out.append((rung, rule, ci.n, len(g), *shares, ci.estimate, ci.lo, ci.hi))
    return ladder_order(pd.DataFrame(out, columns=columns), ["rung", "rule"])


def _finite_mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def calibrated_points(summary: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """Each rung's calibrated (step size, epochs) in a :func:`rule_summary`, as every rule ran
    it."""
    first = summary.groupby("rung", sort=False)[["lr", "epochs"]].first()
    return {r: (row.lr, row.epochs) for r, row in first.iterrows()}


def fmt_ci(lo: float, hi: float, spec: str = "+.4f") -> str:
    """``[-0.003, +0.027]``: an interval, each end formatted with ``spec``."""
    return f"[{lo:{spec}}, {hi:{spec}}]"


def fmt_interval(estimate: float, lo: float, hi: float, spec: str = "+.4f", alone: str = "") -> str:
    """``+0.012 [-0.003, +0.027]`` (each number formatted with ``spec``); without an interval
    (an end not finite), the estimate alone followed by ``alone``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{estimate:{spec}}{alone}"
    return f"{estimate:{spec}} {fmt_ci(lo, hi, spec)}"


# -- transfer: does a claim's paired effect keep its sign from rung to rung? -----------------------
# Transfer measured on claim effects: does a claim's paired effect keep its sign from rung to rung?
#
# Read off the claims study's ledgers (``ledger.csv``: each claim's primary reading,
# ``ledger_auc.csv``: the ``reward_auc`` reading), claim by claim, with nothing re-estimated:
# :func:`transfer_table` (tidy rows), :func:`transfer_wide` (the rungs side by side) and
# :func:`transfer_agreement` (per pair of rungs, the share of claims resolved on both with the same
# sign, with an exact interval); :func:`write_transfer` writes them into a results folder. Claims
# unresolved on either rung are counted, not guessed, and nothing is resampled, so the statistic
# never resolves more than the ledgers' intervals do (the seed bootstrap of the rule orders' tau-b
# did: it resolved 1.3-2.5x more pairs than the data).
#
# Three countings are written, one row each (column ``counted``): ``margin`` (the page's) signs only
# rows that decide their claim at the margin (``at_margin``, :func:`.claims.decided_at_margin`:
# supported or reversed, surviving Holm, the whole interval beyond +-m), among the rows that carry a
# verdict; ``verdicts`` counts every row that carries a verdict (a row with no headroom or identical
# by construction compares nothing: a rung at its ceiling cannot tell rules apart, so its sign says
# nothing about transfer) and signs it by its interval alone; ``all`` counts every row with an
# interval.

#: The columns of :func:`transfer_table` (and of ``transfer.csv``), in order.
TRANSFER_COLUMNS = ["claim", "metric", "rung", "estimate", "lo", "hi", "verdict", "at_margin"]

#: The columns of :func:`transfer_agreement` (and of ``transfer_agreement.csv``), in order.
AGREEMENT_COLUMNS = ["metric", "rung_a", "rung_b", "counted", "claims", "resolved", "same_sign"]
AGREEMENT_COLUMNS += ["share", "lo", "hi", "unresolved", "result"]

#: A study folder's ledger tables, in the order :func:`transfer_table` takes them (notebook 08).
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


def _no_rows() -> pd.DataFrame:
    """A ledger without rows, with the columns :func:`transfer_table` reads."""
    read = dict.fromkeys([*TRANSFER_COLUMNS, *AT_MARGIN_COLUMNS])  # once each
    return pd.DataFrame(columns=[c for c in read if c != "at_margin"])  # at_margin is computed


def transfer_table(*ledgers: pd.DataFrame) -> pd.DataFrame:
    """Tidy rows (:data:`TRANSFER_COLUMNS`) from one or more ledger tables (the claims study's
    ``ledger.csv`` and ``ledger_auc.csv`` as read): one row per (claim, metric, rung), claims,
    metrics and rungs in the order they first appear in the ledgers (the ledgers' own order:
    pre-registration, then the ladder). A row with ``seeds == 1`` and no interval is an exact
    difference: ``lo = hi = estimate``. ``at_margin``: the row decides its claim at the margin
    (:func:`.claims.decided_at_margin`, from the ledger's ``holm`` and ``margin``). A (claim,
    metric, rung) twice is an error."""
    if not ledgers:
        raise ValueError("ledgers: give at least one ledger table")
    for i, frame in enumerate(ledgers):
        missing = {*TRANSFER_COLUMNS, *AT_MARGIN_COLUMNS} - {"at_margin"} - set(frame.columns)
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
    return table.loc[order, TRANSFER_COLUMNS].reset_index(drop=True)


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
    missing = set(TRANSFER_COLUMNS) - set(table.columns)
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
