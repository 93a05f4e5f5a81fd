"""Standard figures and the final-score table, from any tidy results frame.

The frame has one row per (setting, objective, kind, seed, step) with at least
``expected_reward`` and ``entropy``; ``kind`` is the run kind's flow (:attr:`.runs.RunKind.flow`):
:data:`~.runs.SAMPLED` (seeds) or :data:`~.runs.EXACT` (the expected-gradient flow of a
deterministic kind, ``seed = -1``). Optional columns: ``clip_low_frac``, ``clip_high_frac``,
``rescue_frac``, ``optimum`` (best achievable expected reward of the setting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from sandbox.stats import t_half_width

from .results import write_figure
from .runs import EXACT, SAMPLED

FRACTIONS = ("clip_low_frac", "clip_high_frac", "rescue_frac")
#: At most this many objectives are drawn in a line plot (distinct colours, a legend that fits);
#: all of them go into the tables and the final-score figure.
MAX_LINES = 12
#: Objectives drawn first in the line plots when there are more than :data:`MAX_LINES`.
HIGHLIGHT = (
    "grpo",
    "dapo",
    "gspo",
    "nsr_dapo",
    "nsr_decay_dapo",
    "dgpo",
    "atr_dapo",
    "gppo",
    "cispo_trl",
    "sapo",
    "clip_cov",
    "kl_cov",
)


@contextlib.contextmanager
def styled() -> Iterator[None]:
    """The figures' style (seaborn's whitegrid, notebook context) within the block, or the
    decorated function, only: matplotlib's settings and the one-letter colour codes seaborn sets
    globally are as before after it, so a figure drawn later in the process (a study's, a user's)
    does not depend on which figures were drawn before it."""
    import matplotlib as mpl
    import seaborn as sns

    colors = mpl.colors.get_named_colors_mapping()
    codes = {code: colors[code] for code in "bgrmyck"}
    with mpl.rc_context():
        sns.set_theme(style="whitegrid", context="notebook")
        try:
            yield
        finally:
            for code, color in codes.items():  # item by item: the mapping's cache is cleared
                colors[code] = color


def _mpl():
    import matplotlib.pyplot as plt  # the backend is the user's (headless machines get Agg)
    import seaborn as sns

    return plt, sns


def _save(fig, path: str | Path) -> Path:
    """The figure as PNG through :func:`~.results.write_figure`, then closed."""
    import matplotlib.pyplot as plt

    write_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def mean_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval over seeds."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    if len(values) < 2:
        return float(values.mean()), float("nan")
    return float(values.mean()), float(t_half_width(values.std(ddof=1), len(values), level))


def final_scores(results: pd.DataFrame, threshold_frac: float = 0.9) -> pd.DataFrame:
    """One row per (setting, objective): final expected reward ± 95% CI over seeds, final
    entropy, steps until the seed-mean reward first reaches ``threshold_frac * optimum``, the
    exact flow's final reward, and the run-mean clip/rescue fractions."""
    rows = []
    for (setting, objective), run in results.groupby(["setting", "objective"], sort=False):
        sampled = run[run["kind"] == SAMPLED]
        exact = run[run["kind"] == EXACT]
        row: dict[str, object] = {"setting": setting, "objective": objective}
        if "suite" in run:
            row["suite"] = run["suite"].iloc[0]
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


def reward_name(frame: pd.DataFrame) -> str:
    """What ``expected_reward`` measures in ``frame`` (results or scores): the sampled pass rate
    on the reasoning suite, the expected reward on bandits."""
    reasoning = "suite" in frame and len(frame) and (frame["suite"] == "reasoning").all()
    return "pass rate" if reasoning else "expected reward"


def format_scores(scores: pd.DataFrame) -> str:
    """The final-score table as text (one block per setting)."""
    name = "final pass rate" if reward_name(scores) == "pass rate" else "final reward"
    blocks = []
    for setting, block in scores.groupby("setting", sort=False):
        table = pd.DataFrame(
            {
                "objective": block["objective"],
                f"{name} (95% CI)": [
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


def metric_bounds(values: pd.Series, metric: str) -> tuple[float | None, float | None]:
    """The range a metric cannot leave: [0, 1] for rewards and fractions whose values all lie in
    it (binary rewards, pass rates), >= 0 for entropies; a band is clipped to it."""
    if metric == "entropy" or metric.endswith("entropy"):
        return 0.0, None
    finite = values[np.isfinite(values)]
    if len(finite) and finite.between(0.0, 1.0).all():
        return 0.0, 1.0
    return None, None


def seed_band(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean over seeds of ``metric`` per (setting, objective, kind, step) with a 95% normal band
    (``lo``, ``hi``, clipped to :func:`metric_bounds`)."""
    grouped = results.groupby(["setting", "objective", "kind", "step"], sort=False)[metric]
    band = grouped.agg(["mean", "std", "count"]).reset_index()
    half = 1.96 * band["std"].fillna(0.0) / np.sqrt(band["count"].clip(lower=1))
    low, high = metric_bounds(results[metric], metric)
    band["lo"] = (band["mean"] - half).clip(lower=low)
    band["hi"] = (band["mean"] + half).clip(upper=high)
    return band


def pick_lines(results: pd.DataFrame, highlight=None, max_lines: int = MAX_LINES) -> list[str]:
    """The objectives a line plot draws: ``highlight`` if given, else all of them when at most
    ``max_lines``, else the :data:`HIGHLIGHT` rules present, then the best by final mean reward
    (over settings), up to ``max_lines``."""
    present = list(dict.fromkeys(results["objective"]))
    if highlight is not None:
        return [o for o in dict.fromkeys(highlight) if o in set(present)]
    if len(present) <= max_lines:
        return present
    chosen = [o for o in HIGHLIGHT if o in set(present)]
    sampled = results[results["kind"] == SAMPLED] if "kind" in results else results
    last = sampled[sampled["step"] == sampled["step"].max()]
    ranked = last.groupby("objective")["expected_reward"].mean().sort_values(ascending=False)
    chosen += [o for o in ranked.index if o not in chosen]
    return chosen[:max_lines]


LINE_STYLES = ("-", "--", ":", "-.")


def metric_label(results: pd.DataFrame, metric: str) -> str:
    """The axis label of ``metric`` in ``results``' figures: what ``expected_reward`` measures
    (:func:`reward_name`: the pass rate on the reasoning suite), else the column's name. A
    figure's title names the same quantity, so title and axis never disagree."""
    return reward_name(results) if metric == "expected_reward" else metric


def _line_panels(results, data, metric: str, title: str, styles: dict[str, str], highlight):
    """One panel per setting; a line (and band, :func:`seed_band`) per objective and kind of
    ``data``, for the objectives :func:`pick_lines` picks there, the y axis labelled
    :func:`metric_label`; the title says when these are not all of ``results``."""
    plt, sns = _mpl()
    shown = pick_lines(data, highlight)
    band = seed_band(data[data["objective"].isin(shown)], metric)
    total = results["objective"].nunique()
    if len(shown) < total:
        title += (
            f"\n{len(shown)} of {total} objectives "
            "(clip-sandbox plot --highlight picks others, or all)"
        )
    settings = list(dict.fromkeys(band["setting"]))
    objectives = list(dict.fromkeys(band["objective"]))
    # (colour, line style) per objective: tab10's hues, solid; lines 11-20 dashed, 21-30 dotted,
    # then dash-dotted (lighter shades of one hue are too close to read on a legend)
    hues = sns.color_palette("tab10", 10)
    looks = {
        o: (hues[i % 10], LINE_STYLES[i // 10 % len(LINE_STYLES)]) for i, o in enumerate(objectives)
    }
    by_objective = set(styles) == {SAMPLED}  # one kind: the line style tells objectives apart
    fig, axes = plt.subplots(
        1, len(settings), figsize=(4.6 * len(settings), 3.8), squeeze=False, sharex=True
    )
    for ax, setting in zip(axes[0], settings, strict=True):
        for (objective, kind), line in band[band["setting"] == setting].groupby(
            ["objective", "kind"], sort=False
        ):
            color, style = looks[objective]
            style = style if by_objective else styles.get(kind, "-")
            ax.plot(
                line["step"],
                line["mean"],
                style,
                color=color,
                label=objective if kind == SAMPLED else None,
                lw=1.6,
            )
            if kind == SAMPLED:
                ax.fill_between(line["step"], line["lo"], line["hi"], color=color, alpha=0.12, lw=0)
        ax.set_title(setting)
        ax.set_xlabel("step")
        ax.set_ylabel(metric_label(results, metric))
    axes[0][-1].legend(
        loc="center left",
        bbox_to_anchor=(1.02, 0.5),
        frameon=False,
        fontsize="small",
        ncol=1 + len(objectives) // 16,
    )
    fig.suptitle(title)
    fig.tight_layout()
    return fig


@styled()
def plot_curves(
    results: pd.DataFrame, metric: str, path: str | Path, objectives=None, title: str = ""
) -> Path:
    """Seed-mean ``metric`` against step (95% band), one panel per setting, sampled runs;
    ``objectives`` (default :func:`pick_lines`) are the lines drawn. The default title names
    the quantity the y axis carries (:func:`metric_label`)."""
    title = title or f"{metric_label(results, metric)} (mean over seeds, 95% band)"
    data = results[results["kind"] == SAMPLED]
    return _save(_line_panels(results, data, metric, title, {SAMPLED: "-"}, objectives), path)


@styled()
def plot_fractions(results: pd.DataFrame, path: str | Path) -> Path:
    """Run-mean clip_low / clip_high / rescue fractions per objective and setting."""
    _, sns = _mpl()
    keys = [k for k in FRACTIONS if k in results]
    data = results[results["kind"] == SAMPLED]
    data = data.groupby(["setting", "objective"], sort=False)[keys].mean().reset_index()
    long = data.melt(["setting", "objective"], keys, var_name="fraction", value_name="value")
    height = max(3.0, 0.22 * data["objective"].nunique() + 1.5)
    # one column per fraction, each with its own x scale: clip shares of ~0.01 stay readable
    # beside rescue shares of 0.4-0.8
    grid = sns.catplot(
        data=long.dropna(),
        x="value",
        y="objective",
        hue="fraction",
        col="fraction",
        row="setting",
        kind="bar",
        height=height,
        aspect=3.2 / height,
        sharex=False,
        legend=False,
    )
    grid.set_titles("{row_name}: {col_name}")
    # one x label for the figure: the long label under each of the three narrow columns ran
    # into its neighbours
    grid.set_axis_labels("", "objective")
    grid.figure.supxlabel("share of tokens (mean over steps and seeds)")
    grid.tight_layout()
    grid.figure.suptitle("Clip and rescue fractions (mean over steps and seeds)", y=1.01)
    return _save(grid.figure, path)


@styled()
def plot_exact_vs_sampled(results: pd.DataFrame, path: str | Path, objectives=None) -> Path:
    """Expected reward of the exact flow (dashed) against the sampled seed mean (solid, band)."""
    name = metric_label(results, "expected_reward")
    title = f"{name}: exact expected-gradient flow (dashed) vs sampled runs (solid, 95% band)"
    styles = {SAMPLED: "-", EXACT: "--"}
    fig = _line_panels(results, results, "expected_reward", title, styles, objectives)
    return _save(fig, path)


@styled()
def plot_final_scores(scores: pd.DataFrame, path: str | Path) -> Path:
    """Final expected reward with its 95% CI (clipped to [0, 1] for bounded rewards), per
    objective, one panel per setting. Each panel's x range follows the sampled intervals; an
    exact-flow value far outside them (more than the panel's width away) is drawn as an arrow at
    the edge with its value, so one outlier does not squeeze the panel."""
    plt, _ = _mpl()
    settings = list(dict.fromkeys(scores["setting"]))
    n_obj = scores["objective"].nunique()
    label = max(len(str(o)) for o in scores["objective"])  # long sweep labels need room
    width = 3.2 + 0.075 * label
    fig, axes = plt.subplots(
        1, len(settings), figsize=(width * len(settings), 0.28 * n_obj + 1.5), squeeze=False
    )
    bounded = metric_bounds(scores["final_reward"], "final_reward") == (0.0, 1.0)
    for ax, setting in zip(axes[0], settings, strict=True):
        block = scores[scores["setting"] == setting].sort_values("final_reward")
        y = np.arange(len(block))
        mean = block["final_reward"].to_numpy()
        ci = block["final_reward_ci"].fillna(0.0).to_numpy()
        low, high = (np.minimum(ci, mean), np.minimum(ci, 1.0 - mean)) if bounded else (ci, ci)
        ax.errorbar(mean, y, xerr=[low, high], fmt="o", capsize=3)
        x0, x1 = float(np.nanmin(mean - low)), float(np.nanmax(mean + high))
        pad = max(0.06 * (x1 - x0), 0.01)  # a margin around the sampled intervals
        x0, x1 = x0 - pad, x1 + pad
        if "exact_final_reward" in block and block["exact_final_reward"].notna().any():
            exact = block["exact_final_reward"].to_numpy()
            near = np.isfinite(exact) & (exact > x0 - (x1 - x0)) & (exact < x1 + (x1 - x0))
            if near.any():  # exact values near the sampled ones widen the axis
                x0, x1 = min(x0, exact[near].min()), max(x1, exact[near].max())
                pad = 0.04 * (x1 - x0)
                x0, x1 = x0 - pad, x1 + pad
            ax.scatter(exact[near], y[near], marker="x", color="k", label="exact flow")
            far = np.isfinite(exact) & ~near  # outliers: an arrow at the edge with the value
            for yi, value in zip(y[far], exact[far], strict=True):
                edge, marker = (x0, "<") if value < x0 else (x1, ">")
                ax.scatter([edge], [yi], marker=marker, color="k", clip_on=False)
                ax.annotate(
                    f"exact {value:.2f}",
                    (edge, yi),
                    textcoords="offset points",
                    xytext=(6 if marker == "<" else -6, 5),
                    fontsize="x-small",
                    ha="left" if marker == "<" else "right",
                )
        ax.set_xlim(x0, x1)
        ax.set_yticks(y, block["objective"])
        ax.set_title(setting)
        ax.set_xlabel(f"final {reward_name(scores)}")
    if "exact_final_reward" in scores and scores["exact_final_reward"].notna().any():
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles[:1], labels[:1], loc="upper right", frameon=False)  # off the panels
    fig.suptitle(f"Final {reward_name(scores)} (mean over seeds, 95% CI; x = exact flow)")
    fig.tight_layout()
    return _save(fig, path)


def render_all(
    results: pd.DataFrame,
    out_dir: str | Path,
    highlight=None,
    scores: pd.DataFrame | None = None,
) -> list[Path]:
    """Every standard figure into ``out_dir``; ``highlight`` limits the line plots' objectives;
    ``scores``: :func:`final_scores` of ``results`` where the caller has them already."""
    out_dir = Path(out_dir)
    scores = final_scores(results) if scores is None else scores
    return [
        plot_curves(results, "expected_reward", out_dir / "reward_vs_step.png", highlight),
        plot_curves(results, "entropy", out_dir / "entropy_vs_step.png", highlight),
        plot_fractions(results, out_dir / "clip_fractions.png"),
        plot_exact_vs_sampled(results, out_dir / "exact_vs_sampled.png", highlight),
        plot_final_scores(scores, out_dir / "final_scores.png"),
    ]
