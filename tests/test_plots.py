"""The standard figures: how many lines, their colours, bands within bounds, robust limits."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest

from sandbox.experiments import plots

matplotlib.use("Agg")


def _results(n_objectives: int, steps: int = 4, seeds: int = 3) -> pd.DataFrame:
    """Fake tidy results: objective i ends at reward i / n; seeds spread around it."""
    rows = []
    for i in range(n_objectives):
        for seed in range(seeds):
            for step in range(1, steps + 1):
                reward = min(1.0, (i / n_objectives) * step / steps + 0.3 * seed)
                rows.append(
                    {
                        "setting": "easy",
                        "objective": f"rule{i:02d}",
                        "kind": "sampled",
                        "seed": seed,
                        "step": step,
                        "expected_reward": reward,
                        "entropy": 0.02 * seed,
                        "optimum": 1.0,
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture
def captured(monkeypatch):
    """The figures the plotting functions would save, kept open for the test (closed after)."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    yield figures
    for fig in figures:
        plt.close(fig)


def test_line_plots_cap_the_lines_with_distinct_colours_and_say_so(tmp_path, captured):
    results = _results(29)
    picked = plots.pick_lines(results)
    assert len(picked) == plots.MAX_LINES
    assert picked[:3] == ["rule28", "rule27", "rule26"]  # no HIGHLIGHT name: best final reward
    plots.plot_curves(results, "expected_reward", tmp_path / "r.png")
    (ax,) = captured[0].axes
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert len(lines) == 12
    looks = {
        (tuple(np.round(matplotlib.colors.to_rgb(line.get_color()), 6)), line.get_linestyle())
        for line in lines
    }
    assert len(looks) == 12  # colour and line style together tell every line apart
    hues = {tuple(np.round(matplotlib.colors.to_rgb(line.get_color()), 6)) for line in lines}
    assert len(hues) == 10  # tab10's hues, the 11th and 12th dashed: no near-identical shades
    assert len(ax.get_legend().get_texts()) == 12
    assert "12 of 29 objectives (clip-sandbox plot --highlight" in captured[0]._suptitle.get_text()
    # a named selection wins; a few objectives are all drawn
    assert plots.pick_lines(results, ["rule03", "rule01"]) == ["rule03", "rule01"]
    assert plots.pick_lines(_results(5)) == [f"rule{i:02d}" for i in range(5)]


def test_bands_of_bounded_metrics_stay_within_their_bounds():
    results = _results(3)
    band = plots.seed_band(results, "expected_reward")
    assert band["lo"].min() >= 0.0 and band["hi"].max() <= 1.0
    assert (band["hi"] == 1.0).any()  # it would have gone above 1 (seeds at 0.6 and 1.0)
    entropy = plots.seed_band(results, "entropy")
    assert entropy["lo"].min() == 0.0 and entropy["hi"].max() > 0.04
    unbounded = results.assign(expected_reward=results["expected_reward"] * 5 - 2)
    assert plots.seed_band(unbounded, "expected_reward")["lo"].min() < -2


def test_the_fraction_figure_has_one_x_label_clear_of_the_tick_labels(tmp_path, captured):
    """Issue 39: each of the three fraction columns carried the long x label, and the three ran
    into each other. The figure now has one x label, below every panel's tick labels."""
    one = _results(2).assign(clip_low_frac=0.01, clip_high_frac=0.02, rescue_frac=0.7)
    results = pd.concat([one, one.assign(setting="needle")], ignore_index=True)
    plots.plot_fractions(results, tmp_path / "f.png")
    fig = captured[0]
    assert len(fig.axes) == 6  # 2 settings x 3 fractions
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    labels = [ax.xaxis.label for ax in fig.axes if ax.get_xlabel()]
    assert labels == []  # no panel has an x label of its own
    assert fig.get_supxlabel() == "share of tokens (mean over steps and seeds)"
    box = fig._supxlabel.get_window_extent(renderer)
    ticks = [t for ax in fig.axes for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and not any(box.overlaps(t.get_window_extent(renderer)) for t in ticks)
    assert all(box.y1 < t.get_window_extent(renderer).y0 for t in ticks)  # below them all


def test_small_clip_shares_get_their_own_axis_beside_large_rescue_shares(tmp_path, captured):
    results = _results(2).assign(clip_low_frac=0.01, clip_high_frac=0.02, rescue_frac=0.7)
    plots.plot_fractions(results, tmp_path / "f.png")
    limits = {ax.get_title(): ax.get_xlim()[1] for ax in captured[0].axes}
    clip = [x for title, x in limits.items() if title.endswith("clip_low_frac")]
    rescue = [x for title, x in limits.items() if title.endswith("rescue_frac")]
    assert clip and rescue and max(clip) < 0.05 < 0.7 <= min(rescue)


@pytest.mark.parametrize(
    ("suite", "name"), [("bandit", "expected reward"), ("reasoning", "pass rate")]
)
def test_each_figures_title_names_the_quantity_on_its_axis(tmp_path, captured, suite, name):
    """Issue 39: the reasoning figures were titled "pass rate" over a y axis labelled
    ``expected_reward``. Every standard figure's title now names what its value axis shows: the
    pass rate on the reasoning suite, the expected reward on bandits."""
    results = _results(2).assign(suite=suite, clip_low_frac=0.1)
    plots.render_all(results, tmp_path)
    reward, entropy, _fractions, exact, final = captured
    for fig in (reward, exact):
        (ax,) = fig.axes
        assert ax.get_ylabel() == name
        assert fig.get_suptitle().startswith(name)
    (ax,) = entropy.axes
    assert ax.get_ylabel() == "entropy" and entropy.get_suptitle().startswith("entropy")
    (ax,) = final.axes
    assert ax.get_xlabel() == f"final {name}"
    assert final.get_suptitle().startswith(f"Final {name}")


def test_the_reasoning_suite_reports_pass_rates():
    results = _results(2).assign(suite="reasoning")
    assert plots.reward_name(results) == "pass rate"
    assert "final pass rate (95% CI)" in plots.format_scores(plots.final_scores(results))
    assert "final reward (95% CI)" in plots.format_scores(plots.final_scores(_results(2)))


def test_an_exact_flow_outlier_does_not_squeeze_the_final_score_panel(tmp_path, captured):
    scores = pd.DataFrame(
        {
            "setting": "easy",
            "objective": ["a", "b", "c"],
            "final_reward": [0.90, 0.95, 0.97],
            "final_reward_ci": [0.02, 0.03, 0.04],
            "exact_final_reward": [0.91, 0.05, 0.96],
        }
    )
    plots.plot_final_scores(scores, tmp_path / "s.png")
    (ax,) = captured[0].axes
    x0, x1 = ax.get_xlim()
    assert 0.8 < x0 < 0.88 and x1 <= 1.0 + 1e-9 + 0.06  # the sampled range, not 0.05..1
    assert any("exact 0.05" in t.get_text() for t in ax.texts)  # the outlier, at the edge


def test_a_figures_style_is_its_own_and_does_not_outlive_it(tmp_path, monkeypatch):
    """seaborn's theme sets matplotlib's settings and one-letter colour codes for the whole
    process: a study figure drawn after a compare figure came out with other bytes. Each figure
    now takes the theme for itself only."""
    import matplotlib.colors

    before = {key: str(value) for key, value in matplotlib.rcParams.items()}
    codes = {code: matplotlib.colors.to_rgba(code) for code in "bgrmyck"}
    seen, save = {}, plots._save

    def seen_then_saved(fig, path):
        seen["grid"] = matplotlib.rcParams["axes.grid"]  # whitegrid, while drawn and saved
        seen["k"] = matplotlib.colors.to_rgba("k")
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", seen_then_saved)
    results = _results(2).assign(clip_low_frac=0.1, clip_high_frac=0.2)
    plots.plot_fractions(results, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
    assert seen["grid"] and seen["k"] != codes["k"]  # seaborn's theme, during the figure
    assert {key: str(value) for key, value in matplotlib.rcParams.items()} == before
    assert {code: matplotlib.colors.to_rgba(code) for code in "bgrmyck"} == codes
