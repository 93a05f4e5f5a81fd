"""Standard figures and the final-score table, from any tidy results frame.

The frame has one row per (setting, objective, kind, seed, step) with at least
``expected_reward`` and ``entropy``; ``kind`` is ``"sampled"`` (seeds) or ``"exact"`` (the
expected-gradient flow, ``seed = -1``). Optional columns: ``clip_low_frac``, ``clip_high_frac``,
``rescue_frac``, ``optimum`` (best achievable expected reward of the setting).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

FRACTIONS = ("clip_low_frac", "clip_high_frac", "rescue_frac")


def _mpl():
    import matplotlib.pyplot as plt  # the backend is the user's (headless machines get Agg)
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def mean_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval over seeds."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    if len(values) < 2:
        return float(values.mean()), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return float(values.mean()), float(half)


def final_scores(results: pd.DataFrame, threshold_frac: float = 0.9) -> pd.DataFrame:
    """One row per (setting, objective): final expected reward ± 95% CI over seeds, final
    entropy, steps until the seed-mean reward first reaches ``threshold_frac * optimum``, the
    exact flow's final reward, and the run-mean clip/rescue fractions."""
    rows = []
    for (setting, objective), run in results.groupby(["setting", "objective"], sort=False):
        sampled = run[run["kind"] == "sampled"]
        exact = run[run["kind"] == "exact"]
        row: dict[str, object] = {"setting": setting, "objective": objective}
        if len(sampled):
            last = sampled[sampled["step"] == sampled["step"].max()]
            row["final_reward"], row["final_reward_ci"] = mean_ci(last["expected_reward"])
            row["final_entropy"] = float(last["entropy"].mean())
            curve = sampled.groupby("step")["expected_reward"].mean()
            optimum = float(sampled["optimum"].iloc[0]) if "optimum" in sampled else 1.0
            reached = curve.index[curve.to_numpy() >= threshold_frac * optimum]
            row["steps_to_threshold"] = float(reached[0]) if len(reached) else float("nan")
            for key in FRACTIONS:
                if key in sampled:
                    row[key] = float(sampled[key].mean())
        if len(exact):
            row["exact_final_reward"] = float(
                exact.loc[exact["step"] == exact["step"].max(), "expected_reward"].iloc[0]
            )
        rows.append(row)
    return pd.DataFrame(rows)


def format_scores(scores: pd.DataFrame) -> str:
    """The final-score table as text (one block per setting)."""
    blocks = []
    for setting, block in scores.groupby("setting", sort=False):
        table = pd.DataFrame(
            {
                "objective": block["objective"],
                "final reward (95% CI)": [
                    f"{m:.3f} ± {h:.3f}"
                    for m, h in zip(block["final_reward"], block["final_reward_ci"], strict=True)
                ],
                "exact flow": block.get("exact_final_reward", pd.Series(np.nan, block.index)).map(
                    lambda v: "—" if not np.isfinite(v) else f"{v:.3f}"
                ),
                "entropy": block["final_entropy"].map("{:.3f}".format),
                "steps to 90%": block["steps_to_threshold"].map(
                    lambda s: "never" if not np.isfinite(s) else f"{int(s)}"
                ),
            }
        )
        if (table["exact flow"] == "—").all():  # no closed form in this suite (reasoning)
            table = table.drop(columns="exact flow")
        for key in FRACTIONS:
            if key in block:
                table[key] = block[key].map(lambda v: "" if not np.isfinite(v) else f"{v:.3f}")
        table = table.iloc[np.argsort(-block["final_reward"].to_numpy(), kind="stable")]
        blocks.append(f"[{setting}]\n{table.to_string(index=False)}")
    return "\n\n".join(blocks)


def seed_band(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean over seeds of ``metric`` per (setting, objective, kind, step) with a 95% normal band
    (``lo``, ``hi``); one pass of groupby instead of a bootstrap per point."""
    grouped = results.groupby(["setting", "objective", "kind", "step"], sort=False)[metric]
    band = grouped.agg(["mean", "std", "count"]).reset_index()
    half = 1.96 * band["std"].fillna(0.0) / np.sqrt(band["count"].clip(lower=1))
    band["lo"], band["hi"] = band["mean"] - half, band["mean"] + half
    return band


def _line_panels(band: pd.DataFrame, metric: str, title: str, styles: dict[str, str]):
    """One panel per setting; a line (and band) per objective and kind."""
    plt, sns = _mpl()
    settings = list(dict.fromkeys(band["setting"]))
    objectives = list(dict.fromkeys(band["objective"]))
    colors = dict(zip(objectives, sns.color_palette("tab20", len(objectives)), strict=True))
    fig, axes = plt.subplots(
        1, len(settings), figsize=(4.6 * len(settings), 3.8), squeeze=False, sharex=True
    )
    for ax, setting in zip(axes[0], settings, strict=True):
        for (objective, kind), line in band[band["setting"] == setting].groupby(
            ["objective", "kind"], sort=False
        ):
            ax.plot(line["step"], line["mean"], styles.get(kind, "-"), color=colors[objective],
                    label=objective if kind == "sampled" else None, lw=1.6)  # fmt: skip
            if kind == "sampled":
                ax.fill_between(line["step"], line["lo"], line["hi"], color=colors[objective],
                                alpha=0.12, lw=0)  # fmt: skip
        ax.set_title(setting)
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_curves(
    results: pd.DataFrame, metric: str, path: str | Path, objectives=None, title: str = ""
) -> Path:
    """Seed-mean ``metric`` against step (95% band), one panel per setting, sampled runs."""
    plt, _ = _mpl()
    data = results[results["kind"] == "sampled"]
    if objectives is not None:
        data = data[data["objective"].isin(objectives)]
    fig = _line_panels(
        seed_band(data, metric), metric, title or f"{metric} (mean over seeds, 95% band)",
        {"sampled": "-"},
    )  # fmt: skip
    out = _save(fig, Path(path))
    plt.close(fig)
    return out


def plot_fractions(results: pd.DataFrame, path: str | Path) -> Path:
    """Run-mean clip_low / clip_high / rescue fractions per objective and setting."""
    plt, sns = _mpl()
    keys = [k for k in FRACTIONS if k in results]
    data = results[results["kind"] == "sampled"]
    data = data.groupby(["setting", "objective"], sort=False)[keys].mean().reset_index()
    long = data.melt(["setting", "objective"], keys, var_name="fraction", value_name="value")
    height = max(3.0, 0.22 * data["objective"].nunique() + 1.5)
    grid = sns.catplot(
        data=long.dropna(), x="value", y="objective", hue="fraction", col="setting", kind="bar",
        height=height, aspect=4.5 / height, sharex=False,
    )  # fmt: skip
    grid.figure.suptitle("Clip and rescue fractions (mean over steps and seeds)", y=1.02)
    out = _save(grid.figure, Path(path))
    plt.close(grid.figure)
    return out


def plot_exact_vs_sampled(results: pd.DataFrame, path: str | Path, objectives=None) -> Path:
    """Expected reward of the exact flow (dashed) against the sampled seed mean (solid, band)."""
    plt, _ = _mpl()
    data = results if objectives is None else results[results["objective"].isin(objectives)]
    fig = _line_panels(
        seed_band(data, "expected_reward"), "expected_reward",
        "Exact expected-gradient flow (dashed) vs sampled runs (solid, 95% band)",
        {"sampled": "-", "exact": "--"},
    )  # fmt: skip
    out = _save(fig, Path(path))
    plt.close(fig)
    return out


def plot_final_scores(scores: pd.DataFrame, path: str | Path) -> Path:
    """Final expected reward with its 95% CI, per objective, one panel per setting."""
    plt, _ = _mpl()
    settings = list(dict.fromkeys(scores["setting"]))
    n_obj = scores["objective"].nunique()
    label = max(len(str(o)) for o in scores["objective"])  # long sweep labels need room
    width = 3.2 + 0.075 * label
    fig, axes = plt.subplots(
        1, len(settings), figsize=(width * len(settings), 0.28 * n_obj + 1.5), squeeze=False
    )
    for ax, setting in zip(axes[0], settings, strict=True):
        block = scores[scores["setting"] == setting].sort_values("final_reward")
        y = np.arange(len(block))
        ax.errorbar(block["final_reward"], y, xerr=block["final_reward_ci"], fmt="o", capsize=3)
        if "exact_final_reward" in block and block["exact_final_reward"].notna().any():
            ax.scatter(block["exact_final_reward"], y, marker="x", color="k", label="exact flow")
        ax.set_yticks(y, block["objective"])
        ax.set_title(setting)
        ax.set_xlabel("final expected reward")
    if "exact_final_reward" in scores and scores["exact_final_reward"].notna().any():
        axes[0][0].legend(loc="lower right")
    fig.suptitle("Final score (mean over seeds, 95% CI; x = exact flow)")
    fig.tight_layout()
    out = _save(fig, Path(path))
    plt.close(fig)
    return out


def render_all(results: pd.DataFrame, out_dir: str | Path, highlight=None) -> list[Path]:
    """Every standard figure into ``out_dir``; ``highlight`` limits the line plots' objectives."""
    out_dir = Path(out_dir)
    scores = final_scores(results)
    return [
        plot_curves(results, "expected_reward", out_dir / "reward_vs_step.png", highlight),
        plot_curves(results, "entropy", out_dir / "entropy_vs_step.png", highlight),
        plot_fractions(results, out_dir / "clip_fractions.png"),
        plot_exact_vs_sampled(results, out_dir / "exact_vs_sampled.png", highlight),
        plot_final_scores(scores, out_dir / "final_scores.png"),
    ]
