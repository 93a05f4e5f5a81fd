import pandas as pd

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
