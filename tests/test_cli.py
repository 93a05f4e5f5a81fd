import pandas as pd
import pytest

from sandbox.cli import main
from sandbox.objectives import available_objectives, available_presets


def test_objectives_command_lists_everything(capsys):
    assert main(["objectives"]) == 0
    out = capsys.readouterr().out
    for name in available_objectives() + available_presets():
        assert name in out


def test_tour_writes_tables_and_figure(tmp_path, capsys):
    assert main(["tour", "--out", str(tmp_path)]) == 0
    weights = pd.read_csv(tmp_path / "gradient_weights.csv")
    check = pd.read_csv(tmp_path / "autograd_check.csv")
    assert (tmp_path / "gradient_weights.png").stat().st_size > 10_000
    # On-policy every rule is REINFORCE: g(1) = 1 for both signs.
    at_one = weights[(weights["ratio"] - 1.0).abs() < 1e-12]
    assert len(at_one) == 2 * check.shape[0]
    assert (at_one["g"] - 1.0).abs().max() < 1e-12
    assert check["max_autograd_error"].max() < 1e-12


def test_bad_name_is_a_clear_error(capsys):
    assert main(["weights", "--objectives", "nope"]) == 2
    assert "unknown objective 'nope'" in capsys.readouterr().err


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_every_flag_has_help_and_compare_shows_each_default_once(capsys):
    text = " ".join(_help(capsys, "compare").split())  # argparse wraps lines
    assert text.count("(default:") == text.count("(default: ") >= 13
    assert "(default: 2)" in text  # epochs: the same in both suites, shown once
    assert "bandit: 2; reasoning: 2" not in text and "default) (default" not in text
    assert "--objective-params [NAME:]KEY=VALUE" in text
    for command, flag, words in [
        ("weights", "--ratios", "ratios r = pi / pi_old"),
        ("objectives", "--kind", "named presets"),
        ("tour", "--out", "gradient_weights.csv"),
        ("sweep", "--seeds", "smoke run"),
        ("sweep", "--steps", "training steps"),
    ]:
        text = " ".join(_help(capsys, command).split())
        assert flag in text and words in text, (command, flag)


def test_objectives_table_fits_100_columns(capsys):
    assert main(["objectives"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100
    assert any("eps_high=0.28" in line for line in lines)  # dapo's preset value is listed
    assert main(["objectives", "--kind", "preset"]) == 0
    out = capsys.readouterr().out
    assert "dapo" in out and "\ncispo " not in out  # objectives are not listed as presets


def test_a_prefix_of_a_flag_is_not_taken_for_it(capsys):
    """Issue 39: argparse's abbreviations took ``--ki`` for ``--kind`` (and ``llm.ensemble``'s
    ``--seed`` for ``--seeds``); every project parser refuses them."""
    with pytest.raises(SystemExit) as exc:
        main(["objectives", "--ki", "preset"])
    assert exc.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("error: unrecognized arguments: --ki preset")
    )


def test_a_negative_number_in_scientific_notation_is_a_value(capsys):
    """Issue 39: argparse read ``-1e-3`` as a flag (its negative numbers are ``-1`` and
    ``-.5``); it now reaches the command's own check, as ``-1`` does."""
    assert main(["weights", "--ratios", "0.5", "-1"]) == 2
    plain = capsys.readouterr().err
    assert main(["weights", "--ratios", "0.5", "-1e-3"]) == 2
    assert capsys.readouterr().err == plain == "clip-sandbox: error: ratio must be positive\n"


def test_every_command_line_parser_is_the_projects_one():
    """One parser class (``sandbox.configs.CommandParser``: no abbreviations, negative numbers in
    scientific notation as values) builds every command line of ``sandbox`` and ``llm``."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sources = [*(root / "sandbox").rglob("*.py"), *(root / "llm").rglob("*.py")]
    built = re.compile(r"argparse\.ArgumentParser\(|\(argparse\.ArgumentParser\)")
    own = [
        str(path.relative_to(root))
        for path in sources
        if built.search(path.read_text()) and path != root / "sandbox" / "configs.py"
    ]
    assert own == []


def test_plot_help_says_which_rules_the_line_plots_draw_by_default(capsys):
    """Issue 39: the help said ``--highlight`` defaults to all rules, while the line plots draw
    12 of compare's 37. It now says which ones are drawn, and how to draw every one."""
    from sandbox.experiments.plots import HIGHLIGHT, MAX_LINES

    text = " ".join(_help(capsys, "plot").split())
    assert "(default: all)" not in text
    assert f"at most {MAX_LINES}; else {MAX_LINES}:" in text and "or 'all' for every one" in text
    assert ", ".join(HIGHLIGHT[:4]) in text and "sandbox.experiments.plots.HIGHLIGHT" in text


def test_plot_highlight_all_draws_every_objective(tmp_path, monkeypatch, capsys):
    """``--highlight all``: every objective of the results in the line plots (13 here, one more
    than the default's 12, which the title then counts)."""
    from sandbox.experiments import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    rows = [
        dict(setting="easy", objective=f"rule{i:02d}", kind="sampled", seed=seed, step=step)
        | dict(expected_reward=i / 13 * step / 3, entropy=1 - step / 10, clip_low_frac=0.01)
        for i in range(13)
        for seed in (0, 1)
        for step in (1, 2, 3)
    ]
    path = tmp_path / "results.parquet"
    pd.DataFrame(rows).to_parquet(path)

    def reward_lines(argv: list[str]) -> tuple[int, str]:
        import matplotlib.pyplot as plt

        figures.clear()
        assert main(["plot", str(path), "--out", str(tmp_path), *argv]) == 0
        (ax,) = figures[0].axes  # reward_vs_step: one setting
        drawn = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        title = figures[0].get_suptitle()
        for fig in figures:
            plt.close(fig)
        return len(drawn), title

    lines, title = reward_lines([])
    assert lines == 12 and "12 of 13 objectives" in title
    lines, title = reward_lines(["--highlight", "all"])
    assert lines == 13 and "of 13" not in title
    capsys.readouterr()
