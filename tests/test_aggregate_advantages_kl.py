import math

import pytest
import torch

from sandbox.advantages import ADVANTAGE_METHODS, compute_advantages, zero_variance_groups
from sandbox.aggregate import AGGREGATION_MODES, aggregate
from sandbox.kl import kl_divergence

F64 = torch.float64

# loss rows [1, 2, 3] (3 valid) and [4, 5, x] (2 valid).
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", (1 + 2 + 3 + 4 + 5) / 5),  # 15 / 5 tokens = 3
        ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),  # (2 + 4.5) / 2 = 3.25
        ("seq-mean-token-sum", (6 + 9) / 2),  # 7.5
        ("seq-mean-token-sum-norm", (6 / 3 + 9 / 3) / 2),  # L = T = 3: 2.5
    ],
)
def test_aggregate_values(mode, expected):
    assert aggregate(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-12)


def test_aggregate_norm_constant_and_empty_sequences():
    # Dr. GRPO with L = 10: (6/10 + 9/10) / 2 = 0.75
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=10).item() == pytest.approx(
        0.75
    )
    mask = MASK.clone()
    mask[1] = False  # an empty sequence is not counted
    assert aggregate(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregate_micro_batches_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(7, 5, generator=g, dtype=F64)
    mask = torch.rand(7, 5, generator=g) > 0.4
    full = aggregate(loss, mask, mode)
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum()
    parts = sum(
        aggregate(loss[s], mask[s], mode, num_tokens=n_tok, num_seqs=n_seq)
        for s in (slice(0, 2), slice(2, 3), slice(3, 7))
    )
    assert parts.item() == pytest.approx(full.item(), abs=1e-12)


def test_aggregate_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        aggregate(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="mask must have the shape"):
        aggregate(LOSS, MASK[:1], "token-mean")


def test_grpo_advantages_hand_values():
    # Group [1, 0, 0, 1]: mean 0.5, Bessel std sqrt(4 * 0.25 / 3) = 0.57735 -> ±0.866025.
    # Group [1, 1, 1, 1]: zero variance -> 0.
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=F64)
    adv = compute_advantages(r, method="grpo", eps=0.0 + 1e-12)
    expected = torch.tensor([[1, -1, -1, 1], [0, 0, 0, 0]], dtype=F64) * 0.5 / math.sqrt(1 / 3)
    torch.testing.assert_close(adv, expected, rtol=1e-9, atol=1e-9)
    assert zero_variance_groups(r).tolist() == [False, True]


def test_other_advantage_methods():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], dtype=F64)  # two groups of 4
    dr = compute_advantages(r, 4, method="dr_grpo")
    torch.testing.assert_close(dr[:4], torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=F64))
    loo = compute_advantages(r, 4, method="rloo")
    # R_1 - mean(R_2..R_4) = 1 - 1/3 = 0.6667
    assert loo[0].item() == pytest.approx(2 / 3) and loo[1].item() == pytest.approx(-2 / 3)
    bs = compute_advantages(r, 4, method="batch_std", eps=0.0)
    torch.testing.assert_close(
        bs, (r.view(2, 4) - r.view(2, 4).mean(-1, keepdim=True)).view(-1) / r.std()
    )
    torch.testing.assert_close(compute_advantages(r, 4, method="none"), r)
    assert set(ADVANTAGE_METHODS) == {"grpo", "dr_grpo", "rloo", "batch_std", "none"}


def test_advantage_errors():
    with pytest.raises(ValueError, match="method must be one of"):
        compute_advantages(torch.ones(4), 2, method="gae")
    with pytest.raises(ValueError, match="group_size must divide"):
        compute_advantages(torch.ones(5), 2)
    with pytest.raises(ValueError, match="rewards contain NaN"):
        compute_advantages(torch.tensor([1.0, float("nan")]), 2)


def test_kl_estimators_hand_values():
    # logp = -1, logp_ref = -2: d = -1; k1 = 1, k2 = 0.5, k3 = e^-1 - 1 + 1 = 0.367879
    logp, ref = torch.tensor([-1.0], dtype=F64), torch.tensor([-2.0], dtype=F64)
    assert kl_divergence(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_divergence(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_divergence(logp, ref, "k3").item() == pytest.approx(math.exp(-1), abs=1e-12)
    # k3 >= 0 and finite at extreme log-ratios
    x = torch.tensor([-100.0, 0.0, 100.0])
    assert torch.all(torch.isfinite(kl_divergence(x, -x, "k3")))
    with pytest.raises(ValueError, match="kind must be one of"):
        kl_divergence(logp, ref, "k4")


def test_k3_is_unbiased_for_kl():
    # KL(pi || ref) over 3 outcomes, estimated by the mean of k3 over samples from pi (exactly,
    # by weighting each outcome by pi): sum_a pi (exp(d) - 1 - d) = sum_a pi log(pi / ref).
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=F64)
    k3 = kl_divergence(pi.log(), ref.log(), "k3")
    assert (pi * k3).sum().item() == pytest.approx((pi * (pi / ref).log()).sum().item(), abs=1e-12)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_groups_sum_each_blocks_own_aggregate(mode):
    g = torch.Generator().manual_seed(1)
    loss = torch.randn(6, 4, generator=g, dtype=F64)
    mask = torch.rand(6, 4, generator=g) > 0.3
    mask[:, 0] = True
    blocks = sum(aggregate(loss[i : i + 2], mask[i : i + 2], mode) for i in (0, 2, 4))
    assert aggregate(loss, mask, mode, groups=3).item() == pytest.approx(blocks.item(), abs=1e-12)
    with pytest.raises(ValueError, match="groups must be a positive divisor"):
        aggregate(loss, mask, mode, groups=4)
