"""Contract tests, parametrised over the whole registry and every preset.

A new objective is covered by these tests as soon as it is registered.
"""

import math

import pytest
import torch

from sandbox.aggregate import AGGREGATION_MODES, aggregate
from sandbox.objectives import (
    RatioObjective,
    available_objectives,
    available_presets,
    get_objective,
    objective_class,
)

ALL_NAMES = available_objectives() + available_presets()
# rules that choose tokens from batch-wide statistics (covariance ranks): no closed form
BATCH_DEPENDENT = {n for n in available_objectives() if objective_class(n).batch_statistic}


def _base(name):
    return get_objective(name)


# Subsets of the registry, derived from the objects (so new entries land in the right ones).
STOCHASTIC = [n for n in ALL_NAMES if _base(n).stochastic and _base(n).name not in BATCH_DEPENDENT]
DETERMINISTIC = [n for n in ALL_NAMES if not _base(n).stochastic]
#: Rules whose coefficient is no function of (r, A) alone: batch statistics, and DPPO's masks on
#: the probability change p - p_old. Named, so that a rule losing its closed form by accident fails.
NO_CLOSED_FORM = {"clip_cov", "kl_cov", "dppo_tv", "dppo_kl"}
CLOSED_FORM = [n for n in DETERMINISTIC if _base(n).name not in NO_CLOSED_FORM]


def test_exactly_the_named_rules_lack_a_closed_form():
    lacking = {n for n in available_objectives() if not get_objective(n).has_expected_coef()}
    assert lacking == NO_CLOSED_FORM
    assert BATCH_DEPENDENT <= NO_CLOSED_FORM


def grid_ratios(obj):
    """Ratios that visit every region of the rule: deep/near below l, inside, near/deep above u,
    beyond the dual-clip constant, and the ±20 clamp edge."""
    low, high = (0.8, 1.2)
    if isinstance(obj, RatioObjective) and obj.bounds() is not None:
        low, high = obj.bounds()
    rs = [0.05, 0.3 * max(low, 0.1), 0.97 * low if low > 0 else 0.5, (low + 1) / 2, 1.0]
    rs += [(1 + high) / 2, 1.03 * high, 3.0 * high, 1e3]
    clip_c = getattr(obj, "clip_c", None)
    if clip_c is not None:
        rs += [0.9 * clip_c, 1.5 * clip_c]
    return torch.tensor(sorted(set(rs)), dtype=torch.float64)


def region_batch(obj, T=3, seed=0):
    """One sequence per (ratio, sign of A) with the same log-ratio on its T tokens (so the sequence
    ratio of GSPO-type rules equals the token ratio), float64."""
    g = torch.Generator().manual_seed(seed)
    rs = grid_ratios(obj)
    ratios = torch.cat([rs, rs])
    adv = torch.cat([torch.full_like(rs, 1.5), torch.full_like(rs, -0.7)])[:, None]
    logp_old = -torch.rand(len(ratios), T, generator=g, dtype=torch.float64) * 3 - 0.1
    logp = (logp_old + ratios.log()[:, None]).clone().requires_grad_(True)
    mask = torch.ones_like(logp_old, dtype=torch.bool)
    return logp, logp_old, adv, mask, ratios


def test_registry_lists_every_required_name():
    required = {
        "unclipped",
        "ppo_clip",
        "gspo",
        "nsr",
        "nsr_decay",
        "dgpo",
        "atr",
        "gppo",
        "ce_gppo",
        "cispo",
        "sapo",
        "clip_cov",
        "kl_cov",
    }
    assert required <= set(available_objectives())
    # the derived subsets are not empty (a parametrised test over an empty list would vanish)
    assert {"nsr", "nsr_dapo", "nsr_gspo"} <= set(STOCHASTIC)
    assert {"ppo_clip", "gspo", "nsr_decay", "dgpo"} <= set(CLOSED_FORM)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_autograd_equals_coef_in_every_region(name):
    obj = get_objective(name)
    logp, logp_old, adv, mask, _ = region_batch(obj)
    gen = torch.Generator().manual_seed(1)
    out = obj(logp, logp_old, adv, mask, generator=gen)
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    torch.testing.assert_close(grad, -out.coef, rtol=1e-12, atol=1e-12)
    assert not out.coef.requires_grad
    assert out.loss.shape == logp.shape and out.coef.shape == logp.shape


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_deterministic_coef_equals_closed_form(name):
    """The realised coef of a deterministic rule is its closed-form expected_coef(r, A)."""
    obj = get_objective(name)
    logp, logp_old, adv, mask, ratios = region_batch(obj)
    out = obj(logp, logp_old, adv, mask)
    if obj.level == "sequence":  # the ratio its closed form takes (VESPO: the product, r^T)
        ratios = obj.sequence_ratio(logp - logp_old, mask)
    expected = obj.expected_coef(ratios[:, None], adv).expand_as(out.coef)
    torch.testing.assert_close(out.coef, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_stochastic_mean_coef_converges_to_expected(name):
    obj = get_objective(name)
    rs = grid_ratios(obj)
    n = 20_000  # draws per (ratio, sign)
    ratios = torch.cat([rs, rs]).repeat_interleave(n)
    adv = torch.cat([torch.full_like(rs, 1.0), torch.full_like(rs, -1.0)]).repeat_interleave(n)
    if obj.level == "sequence":  # one draw per sequence: one token per sequence
        logp_old = torch.full((len(ratios), 1), -1.0, dtype=torch.float64)
        logp = logp_old + ratios.log()[:, None]
        coef = obj(logp, logp_old, adv[:, None], generator=torch.Generator().manual_seed(3)).coef
        coef = coef.view(-1, n)
    else:
        logp_old = torch.full((len(ratios) // n, n), -1.0, dtype=torch.float64)
        logp = logp_old + ratios.view(-1, n).log()
        coef = obj(
            logp, logp_old, adv.view(-1, n)[:, :1], generator=torch.Generator().manual_seed(3)
        ).coef
    mean = coef.mean(-1)
    expected = obj.expected_coef(ratios.view(-1, n)[:, 0], adv.view(-1, n)[:, 0])
    # coef = A r keep with keep ~ Bernoulli(p): sd of the mean = |A| r sqrt(p (1 - p) / n).
    p = (expected / (adv.view(-1, n)[:, 0] * ratios.view(-1, n)[:, 0])).clamp(0, 1)
    sd = ratios.view(-1, n)[:, 0] * (p * (1 - p) / n).sqrt()
    assert torch.all((mean - expected).abs() <= 5 * sd + 1e-12), (mean, expected, sd)
    assert torch.any((p > 0.05) & (p < 0.95)), "the grid must hit the stochastic region"


@pytest.mark.parametrize("name", ALL_NAMES)
def test_on_policy_is_reinforce(name):
    """At r = 1 every rule's coefficient is A (docs/objectives.md §10.1); clip fractions are 0."""
    obj = get_objective(name)
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(6, 5, generator=g, dtype=torch.float64) * 4).requires_grad_(True)
    adv = torch.randn(6, 1, generator=g, dtype=torch.float64)
    out = obj(logp, logp.detach().clone(), adv)
    expected = adv.expand_as(out.coef).clone()
    if obj.name == "clip_cov":
        # Clip-Cov also cuts a few random high-covariance tokens on-policy (its entropy control);
        # every token it does not pick is REINFORCE.
        kept = out.coef != 0
        assert kept.sum() >= out.coef.numel() - 1
        expected = torch.where(kept, expected, 0.0)
    torch.testing.assert_close(out.coef, expected, rtol=1e-12, atol=1e-12)
    for key in ("clip_low_frac", "clip_high_frac"):
        if key in out.metrics:
            assert out.metrics[key].item() == 0.0
    torch.testing.assert_close(out.metrics["ratio_mean"], torch.tensor(1.0, dtype=torch.float64))
    assert out.metrics["kl_k3"].item() == 0.0


@pytest.mark.parametrize("name", ALL_NAMES)
def test_masked_positions_have_no_effect(name):
    """Garbage (NaN, ±inf, huge) at masked positions changes neither loss nor gradient."""
    obj = get_objective(name)
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    delta = 0.4 * torch.randn(5, 7, generator=g, dtype=torch.float64)
    adv = torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 7, generator=g) > 0.3
    mask[:, 0] = True
    outs, grads = [], []
    for garbage in (0.0, math.nan, math.inf, -1e30):
        lo = torch.where(mask, logp_old, garbage)
        lp = torch.where(mask, logp_old + delta, -garbage).requires_grad_(True)
        a = torch.where(mask, adv, garbage)
        out = obj(lp, lo, a, mask, generator=torch.Generator().manual_seed(5))
        (grad,) = torch.autograd.grad(out.loss.sum(), lp)
        outs.append(out)
        grads.append(grad)
        assert torch.all(out.loss[~mask] == 0) and torch.all(grad[~mask] == 0)
    for out, grad in zip(outs[1:], grads[1:], strict=True):
        torch.testing.assert_close(out.loss, outs[0].loss, rtol=0, atol=0)
        torch.testing.assert_close(grad, grads[0], rtol=0, atol=0)
        for key, value in out.metrics.items():
            torch.testing.assert_close(value, outs[0].metrics[key], rtol=0, atol=0)


@pytest.mark.parametrize("name", DETERMINISTIC)  # random draws are laid out by shape
def test_padding_rows_and_columns_do_not_change_the_result(name):
    obj = get_objective(name)
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    logp = logp_old + 0.4 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64)
    pad_lo = torch.nn.functional.pad(logp_old, (0, 3), value=-5.0)
    pad_lo = torch.cat([pad_lo, torch.full((2, 9), -1.0, dtype=torch.float64)])
    pad_lp = torch.nn.functional.pad(logp, (0, 3), value=-1.0)
    pad_lp = torch.cat([pad_lp, torch.full((2, 9), -3.0, dtype=torch.float64)])
    pad_adv = torch.cat([adv, torch.ones(2, 1, dtype=torch.float64)])
    pad_mask = torch.zeros(6, 9, dtype=torch.bool)
    pad_mask[:4, :6] = True
    for mode in AGGREGATION_MODES:
        lp = logp.clone().requires_grad_(True)
        plp = pad_lp.clone().requires_grad_(True)
        full = aggregate(
            obj(lp, logp_old, adv).loss, torch.ones_like(lp, dtype=torch.bool), mode, max_len=6
        )
        padded = aggregate(obj(plp, pad_lo, pad_adv, pad_mask).loss, pad_mask, mode, max_len=6)
        torch.testing.assert_close(padded, full, rtol=1e-12, atol=1e-12)
        (g1,) = torch.autograd.grad(full, lp)
        (g2,) = torch.autograd.grad(padded, plp)
        torch.testing.assert_close(g2[:4, :6], g1, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", CLOSED_FORM)  # draws and batch statistics depend on the split
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batching_does_not_change_the_gradient(name, mode):
    obj = get_objective(name)
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(8, 5, generator=g, dtype=torch.float64) * 3
    logp = (logp_old + 0.4 * torch.randn(8, 5, generator=g, dtype=torch.float64)).requires_grad_(
        True
    )
    adv = torch.randn(8, 1, generator=g, dtype=torch.float64)
    mask = torch.rand(8, 5, generator=g) > 0.3
    mask[:, 0] = True
    full = aggregate(obj(logp, logp_old, adv, mask).loss, mask, mode)
    (g_full,) = torch.autograd.grad(full, logp)
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum()
    total = 0.0
    for rows in (slice(0, 3), slice(3, 8)):
        out = obj(logp[rows], logp_old[rows], adv[rows], mask[rows])
        total = total + aggregate(out.loss, mask[rows], mode, num_tokens=n_tok, num_seqs=n_seq)
    (g_micro,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_micro, g_full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_log_ratios_stay_finite(name, dtype):
    obj = get_objective(name)
    lr = torch.tensor([[-100.0, -30.0, 0.0, 30.0, 100.0]] * 2)
    logp_old = torch.full_like(lr, -1.0).to(dtype)
    logp = (logp_old.float() + lr).to(dtype).requires_grad_(True)
    adv = torch.tensor([[1.0], [-1.0]], dtype=dtype)
    out = obj(logp, logp_old, adv)
    loss = aggregate(out.loss, torch.ones_like(lr, dtype=torch.bool), obj.aggregation)
    loss.backward()
    assert torch.isfinite(loss) and torch.all(torch.isfinite(logp.grad))
    assert torch.all(torch.isfinite(out.coef))
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", ALL_NAMES)
def test_no_gradient_reaches_logp_old_or_adv(name):
    obj = get_objective(name)
    g = torch.Generator().manual_seed(0)
    logp_old = (-torch.rand(3, 4, generator=g) * 3).requires_grad_(True)
    logp = (logp_old.detach() + 0.5 * torch.randn(3, 4, generator=g)).requires_grad_(True)
    adv = torch.randn(3, 4, generator=g).requires_grad_(True)
    out = obj(logp, logp_old, adv)
    aggregate(out.loss, torch.ones(3, 4, dtype=torch.bool)).backward()
    assert logp.grad is not None
    assert logp_old.grad is None and adv.grad is None


@pytest.mark.parametrize("name", ALL_NAMES)
def test_metrics_are_zero_dim_tensors(name):
    obj = get_objective(name)
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(3, 4, generator=g) * 3
    out = obj(
        logp_old + 0.5 * torch.randn(3, 4, generator=g), logp_old, torch.randn(3, 1, generator=g)
    )
    for key in ("ratio_mean", "ratio_max", "ratio_min", "kl_k3"):
        assert key in out.metrics
    for key, value in out.metrics.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, key


@pytest.mark.parametrize("name", ALL_NAMES)
def test_stochastic_objectives_use_only_the_generator(name):
    obj = get_objective(name)
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(16, 32, generator=g, dtype=torch.float64) * 3
    logp = logp_old + torch.randn(16, 32, generator=g, dtype=torch.float64)
    adv = torch.randn(16, 1, generator=g, dtype=torch.float64)
    torch.manual_seed(123)
    a = obj(logp, logp_old, adv, generator=torch.Generator().manual_seed(9)).coef
    torch.manual_seed(456)  # the global RNG must not matter
    b = obj(logp, logp_old, adv, generator=torch.Generator().manual_seed(9)).coef
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Without a generator, a fresh object draws from its own seeded generator.
    c = get_objective(name)(logp, logp_old, adv).coef
    d = get_objective(name)(logp, logp_old, adv).coef
    torch.testing.assert_close(c, d, rtol=0, atol=0)
