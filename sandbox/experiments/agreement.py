"""Do the rules rank the same on every rung? Scores, summaries, rank agreement and its figure.

A *rung* is one run kind on the ladder from a bandit to an LLM (:mod:`.runs`); the transfer study
(``llm.transfer``) and any later study that runs the same rules on several kinds analyse their
tidy rows (``rung``, ``rule``, ``seed``, ``step``, ``pass_rate``, clip and rescue fractions)
with these functions:

* :func:`run_scores`: per run, the mean ``pass_rate`` after step 0 (an area under the learning
  curve), the final and starting values, the clip and rescue fractions;
* :func:`summarise`: per (rung, rule), mean and standard error over seeds, and the rank;
* :func:`rank_agreement`: Kendall's tau-b between the rule means of every pair of rungs, with a
  95% percentile bootstrap interval over seeds (resampled within each rung);
* :func:`plot`: rules x rungs, the standardised score and the clip fraction, the taus above.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .results import sorted_rows, write_figure

#: The columns that identify a row of the tidy results (:func:`run_scores` sorts by them).
ROW_KEYS = ["rung", "rule", "seed", "step"]


def run_scores(results: pd.DataFrame) -> pd.DataFrame:
    """Per (rung, rule, seed): ``score`` (mean pass_rate after step 0), ``final``, ``start``,
    ``clip_frac`` (mean clip_low + clip_high over the training steps) and ``rescue_frac``; one
    order (by rung, rule and seed) and the same values whatever the order of ``results``."""
    rows = []
    results = sorted_rows(results, ROW_KEYS)
    for (rung, rule, seed), run in results.groupby(["rung", "rule", "seed"], sort=False):
        passed = run.dropna(subset=["pass_rate"])
        after = passed[passed["step"] > 0]
        train = run[run["step"] > 0] if rung == "llm" else run
        rows.append(
            {
                "rung": rung,
                "rule": rule,
                "seed": seed,
                "score": after["pass_rate"].mean(),
                "final": after["pass_rate"].iloc[-1],
                "start": passed["pass_rate"].iloc[0],
                "clip_frac": (train["clip_low_frac"] + train["clip_high_frac"]).mean(),
                "rescue_frac": train["rescue_frac"].mean(),
            }
        )
    return pd.DataFrame(rows)


def summarise(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (rung, rule): mean and standard error of the score over seeds, clip/rescue means."""
    g = scores.groupby(["rung", "rule"], sort=False)
    out = g.agg(
        score=("score", "mean"),
        score_se=("score", "sem"),
        final=("final", "mean"),
        clip_frac=("clip_frac", "mean"),
        rescue_frac=("rescue_frac", "mean"),
        seeds=("seed", "nunique"),
    ).reset_index()
    out["rank"] = out.groupby("rung")["score"].rank(ascending=False, method="average")
    return out


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b of two score vectors (ties counted as in scipy.stats.kendalltau)."""
    i, j = np.triu_indices(len(x), 1)
    dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    denom = np.sqrt(np.sum(dx != 0) * np.sum(dy != 0))
    return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")


def rank_agreement(
    scores: pd.DataFrame,
    *,
    order: Sequence[str] | None = None,
    draws: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Kendall's tau between the rule means of every pair of rungs, over their common rules,
    with a 95% bootstrap interval over seeds (resampled within each rung)."""
    rng = np.random.default_rng(seed)
    tables = {
        r: s.pivot_table(index="seed", columns="rule", values="score")
        for r, s in scores.groupby("rung", sort=False)
    }
    rungs = [r for r in order if r in tables] if order else list(tables)
    rows = []
    for a_i, a in enumerate(rungs):
        for b in rungs[a_i + 1 :]:
            common = [r for r in tables[a].columns if r in tables[b].columns]
            if len(common) < 3:
                continue
            ta, tb = tables[a][common].to_numpy(), tables[b][common].to_numpy()
            tau = kendall_tau(np.nanmean(ta, 0), np.nanmean(tb, 0))
            boot = [
                kendall_tau(
                    np.nanmean(ta[rng.integers(len(ta), size=len(ta))], 0),
                    np.nanmean(tb[rng.integers(len(tb), size=len(tb))], 0),
                )
                for _ in range(draws)
            ]
            with warnings.catch_warnings():  # all-NaN when every draw ties every rule
                warnings.simplefilter("ignore", RuntimeWarning)
                lo, hi = np.nanpercentile(boot, [2.5, 97.5])
            rows.append(
                {
                    "rung_a": a,
                    "rung_b": b,
                    "rules": len(common),
                    "tau": tau,
                    "tau_lo": lo,
                    "tau_hi": hi,
                    "seeds_a": len(ta),
                    "seeds_b": len(tb),
                }
            )
    columns = ["rung_a", "rung_b", "rules", "tau", "tau_lo", "tau_hi", "seeds_a", "seeds_b"]
    return pd.DataFrame(rows, columns=columns)  # the header even with fewer than two rungs


def plot(
    summary: pd.DataFrame,
    agreement: pd.DataFrame,
    path: Path,
    *,
    order: Sequence[str] | None = None,
) -> None:
    """Rules x rungs: the score standardised within each rung (colour) with the mean +- se
    written in each cell, and the clip fraction beside it; the taus (one line per pair of rungs)
    above. A cell without a run reads "n/a"; a tau that no resample defines says why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = list(dict.fromkeys(summary["rung"]))
    rungs = [r for r in order if r in present] if order else present
    rules = list(dict.fromkeys(summary["rule"]))
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, 2, figsize=(5 + 2.2 * len(rungs), 2.2 + 0.45 * len(rules)))
    for ax, value, title in (
        (axes[0], "score", "score (mean pass rate), z within rung"),
        (axes[1], "clip_frac", "clip fraction (low + high)"),
    ):
        grid = summary.pivot_table(index="rule", columns="rung", values=value).reindex(
            index=rules, columns=rungs
        )
        shown = (grid - grid.mean()) / grid.std().replace(0, 1) if value == "score" else grid
        shown = shown.to_numpy(dtype=float)
        ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, aspect="auto")
        finite = shown[np.isfinite(shown)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)  # imshow's range
        se = summary.pivot_table(index="rule", columns="rung", values="score_se").reindex(
            index=rules, columns=rungs
        )
        for i, rule in enumerate(rules):
            for j, rung in enumerate(rungs):
                v = grid.loc[rule, rung]
                if pd.isna(v):
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=7, color="0.4")
                    continue
                text = f"{v:.3f}"
                if value == "score" and not pd.isna(se.loc[rule, rung]):
                    text += f"\n±{se.loc[rule, rung]:.3f}"
                shade = cmap((shown[i, j] - lo) / (hi - lo) if hi > lo else 0.5)
                light = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] > 0.5
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if light else "white",
                )
        ax.set_xticks(range(len(rungs)), rungs, rotation=20)
        ax.set_yticks(range(len(rules)), rules)
        ax.set_title(title, fontsize=9)
    lines = []
    for r in agreement.itertuples():
        if np.isfinite(r.tau):
            lines.append(
                f"{r.rung_a} ~ {r.rung_b}: {r.tau:+.2f} [{r.tau_lo:+.2f}, {r.tau_hi:+.2f}]"
            )
        else:
            lines.append(f"{r.rung_a} ~ {r.rung_b}: n/a (the rules tie on a rung)")
    head = "Kendall's tau-b between rungs, 95% bootstrap interval over seeds"
    fig.suptitle("\n".join([head, *lines]) if lines else "one rung: no rank agreement", fontsize=8)
    if summary[["score", "clip_frac"]].isna().to_numpy().any() or len(summary) < len(rules) * len(
        rungs
    ):
        fig.text(
            0.01,
            0.01,
            "n/a: no value: no run of the rule on the rung, or a rule without "
            "that metric (SAPO's soft gate clips nothing, so it has no clip fraction)",
            fontsize=7,
            color="0.4",
        )
    fig.tight_layout()
    write_figure(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
