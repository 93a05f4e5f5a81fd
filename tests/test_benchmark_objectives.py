"""benchmarks/objectives.py at its smallest: the table it prints, and its verl-style reference."""

import importlib.util
import pathlib
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).parents[1] / "benchmarks" / "objectives.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_objectives", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_smoke_run_prints_every_ratio(bench, capsys):
    args = "--B 4 --T 16 --repeats 1 --warmup 1 --no-verl --objectives ppo_clip nsr sapo"
    table = bench.main(args.split())
    rows = table.set_index("objective")
    assert list(rows.index) == ["copy", "verl_style", "ppo_clip", "nsr", "sapo"]
    assert rows.loc["verl_style", "check"] == "match"  # = ppo_clip(0.2, 0.2, clip_c=3)
    assert (rows["ms"] > 0).all() and rows.loc["verl_style", "x_verl"] == 1.0
    assert rows.loc["sapo", "agg"] == "seq-mean-token-mean"  # verl forces it for sapo
    out = capsys.readouterr().out
    assert "time ratio to the verl-style rule" in out and "x a copy" in out


def test_verl_style_rule_is_verls_vanilla_by_hand(bench):
    """A = -1 on both tokens. r = e^0.5 = 1.6487 > u = 1.2: the min-form keeps -A r = 1.6487;
    r = e^1.5 = 4.48 > c = 3: the dual clip caps the loss at 3. Mean 2.3244. pg_clipfrac counts
    -A clip(r) > -A r (neither token); the lower fraction the dual-clipped token (1 of 2)."""
    logp = torch.tensor([[0.5, 1.5]], dtype=torch.float64) - 1.0
    adv = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = bench.verl_style_ppo_clip(logp, logp.new_full((1, 2), -1.0), adv, mask)
    assert loss.item() == pytest.approx((1.6487212707001282 + 3.0) / 2, abs=1e-12)
    assert m["pg_clipfrac"].item() == 0.0
    assert m["lower"].item() == 0.5


def test_cuda_without_cuda_is_a_one_line_error(bench):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as err:
        bench.parse_args(["--device", "cuda"])
    assert err.value.code == 2
