"""Batch-statistic objectives (Clip-Cov, KL-Cov) with ``groups=G``: one call over G stacked
independent batches gives what G separate calls give, block by block.

The trainers stack their S seeds into one batch and pass ``groups=S``; each seed's covariance
means, top-k count ``max(1, floor(ratio * n_valid))`` and random pick must use only that seed's
rows. The blocks below have different valid counts (20, 9 and 1 token), so their counts differ,
and a call on the whole batch would pick another number of tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from sandbox.objectives import get_objective

# torch's own TorchScript helpers warn when Dynamo first imports them; not this project's code
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

F64 = torch.float64
G, ROWS, T = 3, 4, 6
B = G * ROWS
LENGTHS = [6, 6, 5, 3, 4, 3, 2, 0, 1, 0, 0, 0]  # valid tokens per block: 20, 9, 1
RATIO = 0.25  # per-block counts max(1, floor(0.25 * n)): 5, 2, 1 (whole batch: 7)
CLIP_COV = {"clip_cov_ratio": RATIO, "clip_cov_lb": -0.3, "clip_cov_ub": 0.6}


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ragged float64 batch, NaN on padding, token-level advantages (no zero, no ties)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    logp_old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    logp = logp_old + 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.where(adv.abs() < 0.05, 0.5, adv)
    return logp, torch.where(mask, logp_old, math.nan), adv, mask


def blocks(g: int) -> slice:
    return slice(g * ROWS, (g + 1) * ROWS)


def call(obj, data, weight, *, groups=None, rows=slice(None), noise=None, seed=3):
    """(loss, coef, metrics, d(sum weight * loss)/dlogp) of one call on ``rows``; with ``noise``
    the draws are given to :meth:`Objective.forward` instead of drawn from a generator."""
    logp, logp_old, adv, mask = (x[rows] for x in data)
    logp = logp.clone().requires_grad_(True)
    if noise is None:
        gen = torch.Generator().manual_seed(seed)
        out = obj(logp, logp_old, adv, mask, generator=gen, groups=groups)
        loss, coef, metrics = out.loss, out.coef, out.metrics
    else:
        loss, coef_fn, metrics = obj.forward(logp, logp_old, adv, mask, noise[rows], groups)
        coef = coef_fn()
    (loss * weight[rows]).sum().backward()
    return loss.detach(), coef, metrics, logp.grad


def assert_grouped_equals_blocks(grouped, per_block):
    """The grouped call's rows of block g equal the g-th separate call, metrics ``[G]``."""
    loss, coef, metrics, grad = grouped
    for g, (l_g, c_g, _, d_g) in enumerate(per_block):
        rows = blocks(g)
        torch.testing.assert_close(loss[rows], l_g, rtol=0, atol=1e-12)
        torch.testing.assert_close(coef[rows], c_g, rtol=0, atol=1e-12)
        torch.testing.assert_close(grad[rows], d_g, rtol=0, atol=1e-12)
    assert metrics.keys() == per_block[0][2].keys()
    for key, value in metrics.items():
        assert value.shape == (G,), key
        expected = torch.stack([m[key] for _, _, m, _ in per_block])
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-12, msg=key)


def weights() -> torch.Tensor:
    return torch.rand(B, T, generator=torch.Generator().manual_seed(9), dtype=F64) + 0.5


def test_kl_cov_grouped_equals_one_call_per_block():
    obj = get_objective("kl_cov", kl_cov_ratio=RATIO, ppo_kl_coef=0.7)
    data, w = batch(), weights()
    grouped = call(obj, data, w, groups=G)
    per_block = [call(obj, data, w, rows=blocks(g)) for g in range(G)]
    assert_grouped_equals_blocks(grouped, per_block)
    # each block penalised its own count, 5, 2 and 1 of its 20, 9 and 1 valid tokens
    counts = grouped[2]["kl_cov_frac"] * torch.tensor([20.0, 9.0, 1.0], dtype=F64)
    torch.testing.assert_close(counts, torch.tensor([5.0, 2.0, 1.0], dtype=F64))
    # the grouping matters: one call on the whole batch penalises floor(0.25 * 30) = 7 tokens
    whole = call(obj, data, w)[2]["kl_cov_frac"]
    assert whole.shape == () and whole.item() == pytest.approx(7 / 30)
    assert not torch.allclose(call(obj, data, w)[0], grouped[0])


def test_clip_cov_grouped_equals_one_call_per_block_for_the_same_draws():
    """With the uniforms given (``forward``'s ``noise``), grouped and per-block picks coincide."""
    obj = get_objective("clip_cov", **CLIP_COV)
    data, w = batch(), weights()
    noise = torch.rand(B, T, generator=torch.Generator().manual_seed(5), dtype=F64)
    grouped = call(obj, data, w, groups=G, noise=noise)
    per_block = [call(obj, data, w, rows=blocks(g), noise=noise) for g in range(G)]
    assert_grouped_equals_blocks(grouped, per_block)


def eligible_by_block(data: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Clip-Cov's eligible tokens, worked out block by block from the paper's definition: valid,
    outside the dead zone (eps 1: A > 0 and r > 2), lb < Cov_t < ub with the block's own means."""
    logp, logp_old, adv, mask = data
    out = torch.zeros(B, T, dtype=torch.bool)
    for g in range(G):
        rows = blocks(g)
        m, a = mask[rows], adv[rows]
        lp = torch.where(m, logp[rows], 0.0)
        n = max(int(m.sum()), 1)
        cov = (a - a[m].sum() / n) * (lp - lp[m].sum() / n)
        r = torch.where(m, logp[rows] - logp_old[rows], 0.0).exp()
        dead = (a > 0) & (r > 2.0)
        out[rows] = m & ~dead & (cov > CLIP_COV["clip_cov_lb"]) & (cov < CLIP_COV["clip_cov_ub"])
    return out


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_clip_cov_grouped_picks_each_blocks_own_count_among_its_own_eligible(seed):
    obj = get_objective("clip_cov", **CLIP_COV)
    data = batch()
    gen = torch.Generator().manual_seed(seed)
    out = obj(*data, generator=gen, groups=G)
    mask = data[3]
    picked = mask & (out.loss == 0)  # A != 0 everywhere: only a picked token has loss 0
    eligible = eligible_by_block(data)
    assert not (picked & ~eligible).any()
    n_eligible = [int(eligible[blocks(g)].sum()) for g in range(G)]
    assert n_eligible[0] > 5 and n_eligible[1] > 2 and n_eligible[2] == 1  # counts bind
    assert [int(picked[blocks(g)].sum()) for g in range(G)] == [5, 2, 1]
    frac = torch.tensor([5 / 20, 2 / 9, 1.0], dtype=F64)
    torch.testing.assert_close(out.metrics["clip_cov_frac"], frac)


def test_clip_cov_grouped_picks_are_uniform_within_each_block():
    """Over many draws every eligible token of block 1 (9 valid tokens, 2 picked) is picked with
    the same frequency, 2 / n_eligible: the distribution of separate per-block calls."""
    obj = get_objective("clip_cov", **CLIP_COV)
    data = batch()
    gen = torch.Generator().manual_seed(0)
    hits = torch.zeros(B, T, dtype=F64)
    draws = 1000
    for _ in range(draws):
        out = obj(*data, generator=gen, groups=G, validate=False)
        hits += (data[3] & (out.loss == 0)).to(F64)
    eligible = eligible_by_block(data)[blocks(1)]
    freq = (hits[blocks(1)] / draws)[eligible]
    expected = 2 / int(eligible.sum())
    # binomial sd sqrt(p(1-p)/1000) < 0.016: 4.4 sd
    assert (freq - expected).abs().max() < 0.07


@pytest.mark.parametrize("name", ["kl_cov", "clip_cov"])
def test_a_blocks_loss_does_not_depend_on_other_blocks(name):
    """Perturb block 2 (values and mask): blocks 0 and 1 keep their loss and gradient exactly."""
    params = CLIP_COV if name == "clip_cov" else {"kl_cov_ratio": RATIO}
    obj = get_objective(name, **params)
    data, w = batch(), weights()
    other = batch(seed=1)
    changed = [x.clone() for x in data]
    rows = blocks(2)
    for x, y in zip(changed, other, strict=True):
        x[rows] = y[rows]
    changed[3][rows] = True  # block 2 now has 24 valid tokens instead of 1
    changed[1][rows] = other[1][rows].nan_to_num(-1.0)
    base = call(obj, data, w, groups=G)
    moved = call(obj, tuple(changed), w, groups=G)
    keep = slice(0, 2 * ROWS)
    for a, b in ((base[0], moved[0]), (base[1], moved[1]), (base[3], moved[3])):
        torch.testing.assert_close(b[keep], a[keep], rtol=0, atol=0)
        assert not torch.equal(b[rows], a[rows])
    for key, value in base[2].items():
        torch.testing.assert_close(moved[2][key][:2], value[:2], rtol=0, atol=0, msg=key)


def test_groups_is_checked_and_ignored_by_other_objectives():
    data = batch()
    for bad in (5, 0, True, 2.0):
        with pytest.raises(ValueError, match="groups must be a positive divisor of B=12"):
            get_objective("kl_cov")(*data, groups=bad)
    mask = data[3].clone()
    mask[blocks(2)] = False
    with pytest.raises(ValueError, match=r"mask is empty in block\(s\) \[2\] of groups=3"):
        get_objective("kl_cov")(data[0], data[1], data[2], mask, groups=G)
    dapo = get_objective("dapo")
    plain, grouped = dapo(*data), dapo(*data, groups=G)
    torch.testing.assert_close(grouped.loss, plain.loss, rtol=0, atol=0)
    assert all(v.shape == () for v in grouped.metrics.values())
    with pytest.raises(ValueError, match="groups must be a positive divisor"):
        dapo(*data, groups=5)


def test_grouped_call_compiles_whole():
    """``fullgraph=True`` captures the grouped path (per-block covariance, static per-block top-k
    bound, no sync); Clip-Cov runs both shared helpers and the grouped ratio metrics."""
    data, w = batch(), weights()
    eager = call(get_objective("clip_cov", **CLIP_COV), data, w, groups=G)
    compiled_obj = get_objective("clip_cov", compile={"backend": "aot_eager"}, **CLIP_COV)
    compiled = call(compiled_obj, data, w, groups=G)
    for a, b in zip(eager[:2] + eager[3:], compiled[:2] + compiled[3:], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    for key, value in eager[2].items():
        torch.testing.assert_close(compiled[2][key], value, rtol=1e-12, atol=1e-12, msg=key)
