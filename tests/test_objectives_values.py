"""Hand-derived values (derivations in the comments) and per-objective theory checks."""

import math

import pytest
import torch

from sandbox.aggregate import aggregate
from sandbox.objectives import atr_bounds, get_objective

F64 = torch.float64


def one_token(obj, log_ratio, adv, logp_old=-1.0):
    """loss, coef and metrics of a single token with the given log-ratio and advantage."""
    lo = torch.tensor([[logp_old]], dtype=F64)
    lp = (lo + log_ratio).requires_grad_(True)
    out = obj(lp, lo, torch.tensor([[adv]], dtype=F64), generator=torch.Generator().manual_seed(0))
    return out.loss.item(), out.coef.item(), out.metrics


# ---------------------------------------------------------------------------------------------
# Hand-derived values
# ---------------------------------------------------------------------------------------------


def test_ppo_clip_values():
    obj = get_objective("ppo_clip")  # l = 0.8, u = 1.2
    # r = e^0.1 = 1.105171 inside, A = 2: loss = -2 r = -2.210342, coef = A r = 2.210342.
    loss, coef, _ = one_token(obj, 0.1, 2.0)
    assert loss == pytest.approx(-2 * math.exp(0.1), abs=1e-12)
    assert coef == pytest.approx(2 * math.exp(0.1), abs=1e-12)
    # r = e^0.5 = 1.6487 > u, A = 1 (Z_hi): loss = max(-1.6487, -1.2) = -1.2, coef 0.
    loss, coef, m = one_token(obj, 0.5, 1.0)
    assert (loss, coef) == (pytest.approx(-1.2, abs=1e-12), 0.0)
    assert m["clip_high_frac"].item() == 1.0 and m["clip_low_frac"].item() == 0.0
    # r = e^-0.5 = 0.6065 < l, A = -1 (Z_lo): loss = max(0.6065, 0.8) = 0.8, coef 0.
    loss, coef, m = one_token(obj, -0.5, -1.0)
    assert (loss, coef) == (pytest.approx(0.8, abs=1e-12), 0.0)
    assert m["clip_low_frac"].item() == 1.0
    # r = e^-0.5 < l but A = +1: the min-form keeps the full gradient, coef = r = 0.606531.
    assert one_token(obj, -0.5, 1.0)[1] == pytest.approx(math.exp(-0.5), abs=1e-12)


def test_dual_clip_values():
    obj = get_objective("dual_clip")  # c = 3
    # r = e^1.5 = 4.4817 > c, A = -1: loss = min(max(4.4817, 1.2), 3) = 3, coef 0.
    loss, coef, m = one_token(obj, 1.5, -1.0)
    assert (loss, coef) == (pytest.approx(3.0, abs=1e-12), 0.0)
    assert m["dual_clip_frac"].item() == 1.0
    # r = e^1 = 2.718 < c, A = -1: loss = r = 2.718, coef = A r = -2.718.
    assert one_token(obj, 1.0, -1.0)[1] == pytest.approx(-math.e, abs=1e-12)


def test_dgpo_values():
    obj = get_objective("dgpo")  # n = 1, m = 2, l = 0.8, u = 1.2
    # Z_lo: r = 0.5, A = -1: g = r^(n+1)/l^n = 0.25/0.8 = 0.3125; loss = -A g = 0.3125.
    loss, coef, _ = one_token(obj, math.log(0.5), -1.0)
    assert loss == pytest.approx(0.3125, abs=1e-12) and coef == pytest.approx(-0.3125, abs=1e-12)
    # Z_hi: r = 2, A = 1: g = u^(1/2) r^(1/2) = sqrt(2.4) = 1.5491933; loss = -1.5491933.
    loss, coef, _ = one_token(obj, math.log(2.0), 1.0)
    assert loss == pytest.approx(-math.sqrt(2.4), abs=1e-12)
    assert coef == pytest.approx(math.sqrt(2.4), abs=1e-12)


def test_gppo_and_ce_gppo_values():
    gppo = get_objective("gppo")  # l = 0.8, u = 1.28
    # Z_hi: r = 2, A = 1: value of ppo_clip -u = -1.28, gradient kept at g = u = 1.28.
    assert one_token(gppo, math.log(2.0), 1.0)[:2] == (pytest.approx(-1.28), pytest.approx(1.28))
    # Z_lo: r = 0.5, A = -1: value l = 0.8, coef = A l = -0.8.
    assert one_token(gppo, math.log(0.5), -1.0)[:2] == (pytest.approx(0.8), pytest.approx(-0.8))
    ce = get_objective("ce_gppo", beta1=0.25, beta2=0.5)
    # Same values; coef scaled: Z_hi 0.5 * 1.28 = 0.64, Z_lo -(0.25 * 0.8) = -0.2.
    assert one_token(ce, math.log(2.0), 1.0)[:2] == (pytest.approx(-1.28), pytest.approx(0.64))
    assert one_token(ce, math.log(0.5), -1.0)[:2] == (pytest.approx(0.8), pytest.approx(-0.2))


def test_cispo_values():
    obj = get_objective("cispo_verl")  # clamp(r, 0.8, 1.2)
    # r = 2, A = 1, logp = -1: w = 1.2, loss = -w A logp = 1.2, coef = w A = 1.2 (never 0).
    loss, coef, m = one_token(obj, math.log(2.0), 1.0, logp_old=-1.0 - math.log(2.0))
    assert loss == pytest.approx(1.2, abs=1e-12) and coef == pytest.approx(1.2, abs=1e-12)
    assert m["clip_high_frac"].item() == 1.0
    # TRL convention: cap at 5, no lower bound: r = 0.1, A = -1 -> coef = -0.1.
    assert one_token(get_objective("cispo_trl"), math.log(0.1), -1.0)[1] == pytest.approx(-0.1)


def test_sapo_values():
    obj = get_objective("sapo")  # tau_pos 1, tau_neg 1.05
    # r = 1, A = 1: loss = -(4/1) sigmoid(0) = -2, coef = 4 * 0.5 * 0.5 = 1 (REINFORCE).
    assert one_token(obj, 0.0, 1.0)[:2] == (pytest.approx(-2.0), pytest.approx(1.0))
    # r = 2, A = 1: s = sigmoid(1) = 0.7310586; g = 4 * 2 * s (1 - s) = 1.5728954.
    s = 1 / (1 + math.exp(-1))
    assert one_token(obj, math.log(2.0), 1.0)[1] == pytest.approx(8 * s * (1 - s), abs=1e-12)
    # A < 0 uses tau_neg: r = 2, A = -1, x = 1.05: g = 8 sigmoid(x)(1 - sigmoid(x)).
    s = 1 / (1 + math.exp(-1.05))
    assert one_token(obj, math.log(2.0), -1.0)[1] == pytest.approx(-8 * s * (1 - s), abs=1e-12)


def test_nsr_expected_weights():
    nsr = get_objective("nsr_dapo")  # l = 0.8, u = 1.28, uniform noise
    # Z_hi, uniform: p = u/r, E[g] = r p = u = 1.28 for any r > u.
    for r in (1.5, 3.0, 100.0):
        assert nsr.expected_coef(r, 1.0).item() == pytest.approx(1.28, abs=1e-12)
    # Z_lo, uniform: p = r/l, E[g] = r^2/l: r = 0.5 -> 0.3125; coef = A E[g] = -0.3125.
    assert nsr.expected_coef(0.5, -1.0).item() == pytest.approx(-0.3125, abs=1e-12)
    band = get_objective("nsr", noise="band", sigma=0.1)  # token level, DAPO bounds
    # Z_hi, band: p = (u/r - 0.9)/0.1; r = 1.3 -> E[g] = r p = (u - 0.9 r)/0.1 = (1.28-1.17)/0.1 = 1.1.
    assert band.expected_coef(1.3, 1.0).item() == pytest.approx(1.1, abs=1e-12)
    # Deep violation r >= u/(1 - sigma) = 1.4222: p = 0, stays clipped.
    assert band.expected_coef(1.43, 1.0).item() == 0.0
    # Z_lo, band: p = (1.1 - l/r)/0.1; r = 0.75 -> p = (1.1 - 1.0667)/0.1 = 0.3333, E[g] = 0.25.
    assert band.expected_coef(0.75, -1.0).item() == pytest.approx(-0.25, abs=1e-12)
    # Outside Z NSR is ppo_clip: r = 0.5, A = +1 -> g = r.
    assert nsr.expected_coef(0.5, 1.0).item() == pytest.approx(0.5)


def test_nsr_rescue_metrics_and_sequence_level_draws():
    nsr = get_objective("nsr_gspo")
    g = torch.Generator().manual_seed(0)
    B, T = 400, 5
    logp_old = -torch.rand(B, T, generator=g, dtype=F64)
    # Every sequence has sequence ratio s = e^0.001 > u = 1 + 4e-4 (Z_hi for A > 0).
    logp = logp_old + 0.001
    out = nsr(logp, logp_old, torch.ones(B, 1, dtype=F64), generator=g)
    keep = out.coef != 0
    # One draw per sequence: every token of a sequence shares the decision.
    assert torch.all(keep == keep[:, :1])
    # Uniform: p = u/s = 1.0004/1.0010005 = 0.9994; rescue_frac is the kept share of Z.
    assert out.metrics["clip_high_frac"].item() == 1.0
    assert out.metrics["rescue_frac"].item() == pytest.approx(keep.double().mean().item())
    assert out.metrics["rescue_high_frac"].item() == out.metrics["rescue_frac"].item()
    assert out.metrics["rescue_low_frac"].item() == 0.0


def test_kl_cov_values():
    obj = get_objective("kl_cov", kl_cov_ratio=0.3, ppo_kl_coef=0.5)
    # adv [1, 0, -1], logp [-1, -2, -4]: mean A = 0, mean logp = -7/3.
    # Cov = [1 * 4/3, 0, -1 * -5/3] = [1.333, 0, 1.667]; k = max(1, floor(0.3 * 3)) = 1 -> token 3.
    logp = torch.tensor([[-1.0, -2.0, -4.0]], dtype=F64, requires_grad=True)
    logp_old = logp.detach() - 0.5  # log r = 0.5 everywhere
    out = obj(logp, logp_old, torch.tensor([[1.0, 0.0, -1.0]], dtype=F64))
    r = math.exp(0.5)
    # token 3: loss = -A r + beta |log r| = r + 0.25; coef = A r - beta sign(log r) = -r - 0.5.
    torch.testing.assert_close(out.loss, torch.tensor([[-r, 0.0, r + 0.25]], dtype=F64))
    torch.testing.assert_close(out.coef, torch.tensor([[r, 0.0, -r - 0.5]], dtype=F64))
    assert out.metrics["kl_cov_frac"].item() == pytest.approx(1 / 3)


def test_clip_cov_picks_only_eligible_tokens():
    obj = get_objective("clip_cov_verl", clip_cov_ratio=0.5, clip_cov_lb=0.5, clip_cov_ub=5.0)
    # Same Cov as above: [1.333, 0, 1.667]; eligible (0.5 < Cov < 5): tokens 1 and 3.
    # k = max(1, floor(0.5 * 3)) = 1: exactly one of tokens 1, 3 has its loss zeroed.
    logp = torch.tensor([[-1.0, -2.0, -4.0]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, 0.0, -1.0]], dtype=F64)
    seen = set()
    for seed in range(40):
        out = obj(logp, logp.detach(), adv, generator=torch.Generator().manual_seed(seed))
        zeroed = {i for i in (0, 2) if out.coef[0, i].item() == 0.0}
        assert len(zeroed) == 1
        seen |= zeroed
    assert seen == {0, 2}  # both candidates get picked across seeds


def test_clip_cov_has_no_dual_clip_by_default():
    """The authors' compute_policy_loss_clip_cov (and verl's clip_cov) never apply clip_ratio_c:
    A = -1, r = e^3 = 20.09 > u = 2 keeps the min-form gradient coef = A r = -20.09 (a dual clip
    at c = 10 would give 0). One token: Cov = 0 < lb = 1, so it is never picked."""
    for name in ("clip_cov", "clip_cov_verl"):
        obj = get_objective(name)
        assert obj.clip_c is None
        loss, coef, m = one_token(obj, 3.0, -1.0)
        assert loss == pytest.approx(math.exp(3.0), abs=1e-12)
        assert coef == pytest.approx(-math.exp(3.0), abs=1e-12)
        assert "dual_clip_frac" not in m
    # the dual clip stays available: c = 10 < r zeroes the gradient, the loss is -c A = 10
    loss, coef, m = one_token(get_objective("clip_cov", clip_c=10.0), 3.0, -1.0)
    assert (loss, coef) == (pytest.approx(10.0, abs=1e-12), 0.0)
    assert m["dual_clip_frac"].item() == 1.0


def test_dgpo_clamp_zeroes_the_gradient_beyond_twenty():
    """DGPO's docstring: beyond |log r| = 20 the clamp cuts the gradient (the authors' code, which
    does not clamp, would keep g = u^(1/m) r^((m-1)/m) on Z_hi)."""
    obj = get_objective("dgpo")  # u = 1.2, m = 2
    assert one_token(obj, 19.0, 1.0)[1] == pytest.approx(math.sqrt(1.2 * math.exp(19.0)))
    assert one_token(obj, 21.0, 1.0)[1] == 0.0


# ---------------------------------------------------------------------------------------------
# DGPO (docs/objectives.md §6, §10.6)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,m", [(1, 2), (2, 2), (1, 1), (3, 4)])
def test_dgpo_bounded_continuous_monotone(n, m):
    obj = get_objective("dgpo", n=n, m=m)
    low, high = obj.bounds()
    r = torch.logspace(-4, 3, 20001, dtype=F64)
    for sign in (1.0, -1.0):
        g = obj.weight(r, torch.full_like(r, sign))
        w_times_pi_old = g / r  # W = g / pi = g / (r pi_old)
        assert torch.all(w_times_pi_old <= 1 + 1e-12)  # W <= 1/pi_old
        if sign < 0:  # Z_lo: W decays monotonically as r falls below l
            zone = r < low
            assert torch.all(torch.diff(w_times_pi_old[zone]) >= 0)
        else:  # Z_hi: W decays monotonically as r rises above u
            zone = r > high
            assert torch.all(torch.diff(w_times_pi_old[zone]) <= 0)
        assert zone.any()
    # continuity of g at both boundaries
    eps = 1e-9
    for b, sign in ((low, -1.0), (high, 1.0)):
        left = obj.weight(torch.tensor(b - eps, dtype=F64), torch.tensor(sign, dtype=F64))
        right = obj.weight(torch.tensor(b + eps, dtype=F64), torch.tensor(sign, dtype=F64))
        assert abs(left.item() - right.item()) < 1e-8


def test_gppo_and_cispo_weights_diverge_as_pi_old_vanishes():
    """GPPO keeps g = l on Z_lo, so W pi_old = l / r -> inf as r -> 0; CISPO's g = clip(r) / r too."""
    r = torch.tensor([1e-2, 1e-4, 1e-6], dtype=F64)
    a = -torch.ones_like(r)
    gppo = get_objective("gppo").weight(r, a) / r
    cispo = get_objective("cispo_verl").weight(r, a) / r
    dgpo = get_objective("dgpo").weight(r, a) / r
    assert torch.all(torch.diff(gppo) > 0) and gppo[-1] > 1e5
    assert torch.all(torch.diff(cispo) > 0) and cispo[-1] > 1e5
    assert torch.all(dgpo <= 1.0)


# ---------------------------------------------------------------------------------------------
# ATR (docs/objectives.md §5, §10.7)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "delta,low,high", [(0.02314, 0.8000, 1.2308), (0.03314, 0.7642, 1.2800), (0.1, 0.6168, 1.5162)]
)
def test_atr_bounds_table(delta, low, high):
    l_d, u_d = atr_bounds(delta)
    assert l_d == pytest.approx(low, abs=5e-5) and u_d == pytest.approx(high, abs=5e-5)
    for w in (l_d, u_d):  # k3(w) = w - 1 - log w = delta exactly on both bounds
        assert w - 1 - math.log(w) == pytest.approx(delta, abs=1e-12)


def test_atr_is_ppo_clip_with_lambert_bounds():
    atr = get_objective("atr", delta=0.05)
    low, high = atr_bounds(0.05)
    ppo = get_objective("ppo_clip", eps_low=1 - low, eps_high=high - 1)
    g = torch.Generator().manual_seed(0)
    lo = -torch.rand(32, 8, generator=g, dtype=F64) * 3
    lp = lo + 0.5 * torch.randn(32, 8, generator=g, dtype=F64)
    adv = torch.randn(32, 1, generator=g, dtype=F64)
    a, p = atr(lp, lo, adv), ppo(lp, lo, adv)
    torch.testing.assert_close(a.loss, p.loss, rtol=0, atol=0)
    torch.testing.assert_close(a.coef, p.coef, rtol=0, atol=0)


def test_atr_two_sided_also_clips_the_other_side():
    atr = get_objective("atr", delta=0.1, two_sided=True)  # (0.6168, 1.5162)
    # A < 0, r = 2 > u: min-form keeps g = r; two-sided clips it (coef 0).
    assert one_token(get_objective("atr", delta=0.1), math.log(2.0), -1.0)[1] == pytest.approx(-2.0)
    assert one_token(atr, math.log(2.0), -1.0)[1] == 0.0
    assert one_token(atr, math.log(0.5), 1.0)[1] == 0.0  # A > 0, r < l
    assert one_token(atr, 0.0, 1.0)[1] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# GSPO: the GSPO-token form has the per-sequence gradient (docs/objectives.md §3)
# ---------------------------------------------------------------------------------------------


def ragged_sequences(seed: int, spread: float, B: int = 12, T: int = 9):
    """float64 (logp with grad, logp_old, adv [B, 1], ragged mask) with log-ratios N(0, spread)."""
    g = torch.Generator().manual_seed(seed)
    lo = -torch.rand(B, T, generator=g, dtype=F64) * 3
    lp = (lo + spread * torch.randn(B, T, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g, dtype=F64)
    mask = torch.arange(T)[None, :] < torch.randint(2, T + 1, (B, 1), generator=g)
    return lp, lo, adv, mask


def token_form_loss_and_grad(obj, lp, lo, adv, mask):
    """The objective's per-token loss aggregated with seq-mean-token-mean, and its gradient."""
    loss = aggregate(obj(lp, lo, adv, mask).loss, mask, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, lp)
    return loss, grad


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_token_equals_per_sequence_gspo(eps):
    lp, lo, adv, mask = ragged_sequences(0, 0.05)
    obj = get_objective("gspo", eps_low=eps[0], eps_high=eps[1])
    ours, g_ours = token_form_loss_and_grad(obj, lp, lo, adv, mask)
    # Per-sequence GSPO: s_i = exp(mean_t log r), L = mean_i -min(s_i A_i, clip(s_i) A_i).
    lp2 = lp.detach().clone().requires_grad_(True)
    maskf = mask.to(F64)
    s = torch.exp(((lp2 - lo) * maskf).sum(-1) / maskf.sum(-1))
    a = adv[:, 0]
    ref = (-torch.minimum(s * a, s.clamp(1 - eps[0], 1 + eps[1]) * a)).mean()
    (g_ref,) = torch.autograd.grad(ref, lp2)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-12)
    assert torch.any(g_ref == 0) and torch.any(g_ref != 0)  # some sequences clipped, some not


# ---------------------------------------------------------------------------------------------
# GMPO and VESPO (sequence-level, GSPO-token form)
# ---------------------------------------------------------------------------------------------


def test_gmpo_values():
    obj = get_objective("gmpo")  # log-space clip: eps_low = eps_high = 0.4
    lo = torch.full((2, 2), -1.0, dtype=F64)
    lp = (lo + torch.tensor([[0.6, -0.2], [0.6, -0.5]], dtype=F64)).requires_grad_(True)
    adv = torch.tensor([[1.0], [-2.0]], dtype=F64)
    out = obj(lp, lo, adv)
    # Row 0, A = 1 > 0: log r = 0.6 > 0.4 is clipped to 0.4 (no gradient), -0.2 stays:
    # s = exp((0.4 - 0.2) / 2) = e^0.1 = 1.105171; each token's loss is -A s = -1.105171;
    # coef = (0, A s) = (0, 1.105171).
    # Row 1, A = -2 < 0: log r = -0.5 < -0.4 is clipped to -0.4, 0.6 stays (A < 0 clips below
    # only): s = exp((0.6 - 0.4) / 2) = e^0.1; loss = 2 s = 2.210342; coef = (-2 s, 0).
    s = math.exp(0.1)
    torch.testing.assert_close(
        out.loss, torch.tensor([[-s, -s], [2 * s, 2 * s]], dtype=F64), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        out.coef, torch.tensor([[0.0, s], [-2 * s, 0.0]], dtype=F64), rtol=0, atol=1e-12
    )
    # one clipped token of four on each side; the ratio statistics are of s (both rows e^0.1)
    assert out.metrics["clip_high_frac"].item() == 0.25
    assert out.metrics["clip_low_frac"].item() == 0.25
    assert out.metrics["ratio_mean"].item() == pytest.approx(s, abs=1e-12)
    # seq-mean-token-mean: d/d logp of (1/2)(-s_0 + 2 s_1) is -coef / (2 rows * 2 tokens)
    full = torch.ones(2, 2, dtype=torch.bool)
    (grad,) = torch.autograd.grad(aggregate(out.loss, full, obj.aggregation), lp)
    torch.testing.assert_close(grad, -out.coef / 4, rtol=0, atol=1e-12)
    # one token: ppo_clip with bounds (e^-0.4, e^0.4) = (0.670320, 1.491825)
    assert obj.bounds() == pytest.approx((0.670320, 1.491825), abs=1e-6)
    torch.testing.assert_close(
        obj.expected_coef(torch.tensor([1.4, 1.5, 0.68, 0.66], dtype=F64), 1.0),
        torch.tensor([1.4, 0.0, 0.68, 0.66], dtype=F64),
    )


@pytest.mark.parametrize("eps", [(0.4, 0.4), (0.2, 0.3)])
def test_gmpo_token_form_equals_per_sequence_gmpo(eps):
    """The GSPO-token form aggregated with seq-mean-token-mean has GMPO's per-sequence loss and
    gradient, written here independently (verl's geo_mean without its 1e-8 guards)."""
    lp, lo, adv, mask = ragged_sequences(1, 0.4)
    obj = get_objective("gmpo", eps_low=eps[0], eps_high=eps[1])
    ours, g_ours = token_form_loss_and_grad(obj, lp, lo, adv, mask)
    lp2 = lp.detach().clone().requires_grad_(True)
    lr = lp2 - lo
    clipped = torch.where(adv > 0, lr.clamp(max=eps[1]), lr.clamp(min=-eps[0]))
    maskf = mask.to(F64)
    s = torch.exp((clipped * maskf).sum(-1) / maskf.sum(-1))
    ref = (-adv[:, 0] * s).mean()
    (g_ref,) = torch.autograd.grad(ref, lp2)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-12)
    some_clipped = (g_ref == 0) & mask
    assert bool(some_clipped.any()) and bool(((g_ref != 0) & mask).any())


def test_vespo_values():
    obj = get_objective("vespo")  # (k, lambda) = (2, 3) for A >= 0, (3, 2) for A < 0
    lo = torch.full((3, 2), -1.0, dtype=F64)
    lr = torch.tensor([[0.1, 0.2], [0.1, 0.2], [-15.0, -15.0]], dtype=F64)
    lp = (lo + lr).requires_grad_(True)
    adv = torch.tensor([[1.0], [-1.0], [1.0]], dtype=F64)
    out = obj(lp, lo, adv)
    # Rows 0, 1: w = e^(0.1 + 0.2) = 1.349859 (the product of the token ratios, no length
    # normalisation). A = 1: log phi = 3 + 2 (0.3) - 3 w = -0.449576, phi = 0.637898.
    # A = -1: log phi = 2 + 3 (0.3) - 2 w = 0.200282, phi = 1.221748.
    # Row 2: log w = -30 is clamped to log 1e-8 (TRL's bound): phi = e^3 1e-16 e^(-3e-8)
    # = 2.008554e-15.
    phi = torch.tensor([0.637898293623749, 1.2217477124950182, 2.008553632062145e-15], dtype=F64)
    expected = (adv[:, 0] * phi)[:, None].expand(3, 2)
    torch.testing.assert_close(out.coef, expected, rtol=1e-12, atol=0.0)
    # loss_t = -phi A logp_t (its value is not a surrogate of J, only its gradient is)
    torch.testing.assert_close(out.loss, -expected * lp.detach(), rtol=1e-12, atol=0.0)
    (grad,) = torch.autograd.grad(out.loss.sum(), lp)
    torch.testing.assert_close(grad, -expected, rtol=1e-12, atol=0.0)
    # phi(1) = 1 (on-policy REINFORCE); the peak is at w = k / lambda: for A > 0 at 2/3,
    # phi = e^3 (4/9) e^-2 = 4e/9 = 1.208125; for A < 0 at 3/2, phi = e^2 (27/8) e^-3 = 1.241593
    assert obj.expected_coef(1.0, 1.0).item() == 1.0
    assert obj.expected_coef(2 / 3, 1.0).item() == pytest.approx(4 * math.e / 9, abs=1e-12)
    assert obj.expected_coef(1.5, -1.0).item() == pytest.approx(-27 / 8 / math.e, abs=1e-12)
    # the sequence ratio its closed form takes is the product: e^0.3, e^0.3, 1e-8
    w = obj.sequence_ratio(lp.detach() - lo, torch.ones(3, 2, dtype=torch.bool))
    torch.testing.assert_close(w, torch.tensor([math.exp(0.3), math.exp(0.3), 1e-8], dtype=F64))
