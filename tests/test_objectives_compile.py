"""Every objective and preset under ``torch.compile(fullgraph=True)``: same values as eager.

The parametrised tests use ``backend="aot_eager"``: Dynamo still has to capture each call's
tensor computation as one graph (``fullgraph=True`` turns any graph break into an error) and
AOTAutograd still traces the backward, without inductor's code generation (minutes on a small
CPU). One test runs inductor itself (marked slow).
"""

import math
import pickle

import pytest
import torch

from sandbox.aggregate import aggregate
from sandbox.objectives import available_objectives, available_presets, get_objective

# torch's own TorchScript helpers warn when Dynamo first imports them; not this project's code
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

ALL_NAMES = available_objectives() + available_presets()
AOT = {"backend": "aot_eager"}
F64 = torch.float64


def batch(B=6, T=9, seed=0, dtype=F64):
    """Ratios in every region (log-ratios of sd 0.8, so r from ~0.1 to ~10, plus ±25 beyond the
    clamp), advantages of both signs per sequence, a ragged mask with NaN on its padding."""
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    delta = 0.8 * torch.randn(B, T, generator=g, dtype=F64)
    delta[0, 1], delta[1, 2] = 25.0, -25.0
    adv = torch.randn(B, 1, generator=g, dtype=F64)
    adv[0], adv[1] = 1.3, -0.9
    mask = torch.arange(T)[None, :] < torch.randint(T // 2, T + 1, (B, 1), generator=g)
    mask[:2] = True
    logp_old = torch.where(mask, logp_old, math.nan)
    return (logp_old + delta).to(dtype), logp_old.to(dtype), adv.to(dtype), mask


def run(obj, data, seed=3):
    """(loss, coef, metrics, gradient of the token-mean loss, generator state after the call)."""
    logp, logp_old, adv, mask = data
    logp = logp.clone().requires_grad_(True)
    gen = torch.Generator().manual_seed(seed)
    out = obj(logp, logp_old, adv, mask, generator=gen, validate=False)
    aggregate(out.loss, mask, "token-mean").backward()
    return out.loss.detach(), out.coef, out.metrics, logp.grad, gen.get_state()


def assert_same(eager, compiled, rtol, atol):
    (l1, c1, m1, g1, s1), (l2, c2, m2, g2, s2) = eager, compiled
    torch.testing.assert_close(l2, l1, rtol=rtol, atol=atol)
    torch.testing.assert_close(c2, c1, rtol=rtol, atol=atol)
    torch.testing.assert_close(g2, g1, rtol=rtol, atol=atol)
    assert m2.keys() == m1.keys()
    for key in m1:
        torch.testing.assert_close(m2[key], m1[key], rtol=rtol, atol=atol, msg=key)
    assert torch.equal(s1, s2)  # the same draws were taken from the generator


@pytest.mark.parametrize("name", ALL_NAMES)
def test_compiled_equals_eager(name):
    data = batch()
    eager = run(get_objective(name), data)
    compiled_obj = get_objective(name, compile=AOT)
    compiled = run(compiled_obj, data)
    assert_same(eager, compiled, rtol=1e-12, atol=1e-12)
    assert torch.any(eager[3] != 0)  # the gradient is not trivially zero
    assert "compiled" in repr(compiled_obj)


def test_compiled_objective_follows_changing_shapes():
    """Micro-batches of different lengths recompile once, then run as dynamic shapes; Clip-Cov's
    top-k bound ``floor(ratio * B * T)`` then becomes symbolic."""
    obj = get_objective("clip_cov", clip_cov_ratio=0.2, clip_cov_lb=0.0, compile=AOT)
    eager = get_objective("clip_cov", clip_cov_ratio=0.2, clip_cov_lb=0.0)
    for B, T in ((6, 9), (5, 11)):
        data = batch(B, T, seed=B)
        ref = run(eager, data)
        assert_same(ref, run(obj, data), rtol=1e-12, atol=1e-12)
        assert ref[2]["clip_cov_frac"] > 0  # tokens were picked


def test_stochastic_draws_come_from_the_generator_in_both_modes():
    """Compiled NSR draws eagerly from ``generator`` before its kernel runs: the same generator
    state gives the same rescue decisions as the eager object, another state other decisions."""
    data = batch(B=40, T=30)
    eager, compiled = get_objective("nsr_dapo"), get_objective("nsr_dapo", compile=AOT)
    coefs = [run(obj, data, seed=s)[1] for obj in (eager, compiled) for s in (3, 4)]
    torch.testing.assert_close(coefs[2], coefs[0], rtol=0, atol=0)
    torch.testing.assert_close(coefs[3], coefs[1], rtol=0, atol=0)
    assert not torch.equal(coefs[0], coefs[1])


def test_compiled_objective_still_validates_and_checks():
    obj = get_objective("ppo_clip", compile=AOT)
    logp, logp_old, adv, mask = batch()
    with pytest.raises(ValueError, match=r"^logp contains NaN"):
        obj(torch.full_like(logp, math.nan), logp_old, adv, mask)
    with pytest.raises(ValueError, match="adv must have shape"):
        obj(logp, logp_old, adv[:, :0], mask)
    with pytest.raises(ValueError, match="compile must be True, False or a mapping"):
        get_objective("ppo_clip", compile="yes")


def test_compiled_objective_pickles():
    """Sweep workers receive objectives by pickle: the compiled kernels are rebuilt there."""
    obj = pickle.loads(pickle.dumps(get_objective("dapo", compile=AOT)))
    data = batch()
    assert_same(run(get_objective("dapo"), data), run(obj, data), rtol=1e-12, atol=1e-12)


def test_whole_loss_step_compiles_for_a_deterministic_objective():
    """The pattern documented in sandbox.objectives: objective + aggregation in one graph."""
    obj = get_objective("dr_grpo")

    def loss_fn(logp, logp_old, adv, mask):
        out = obj(logp, logp_old, adv, mask, validate=False)
        return aggregate(out.loss, mask, obj.aggregation, max_len=12, validate=False)

    compiled = torch.compile(loss_fn, fullgraph=True, **AOT)
    logp, logp_old, adv, mask = batch()
    grads = []
    for fn in (loss_fn, compiled):
        lp = logp.clone().requires_grad_(True)
        loss = fn(lp, logp_old, adv, mask)
        loss.backward()
        grads.append((loss.detach(), lp.grad))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_inductor_compiled_dapo_equals_eager():
    """The default backend (inductor: generated, fused C++ kernels), float32 as on a GPU."""
    data = batch(B=8, T=16, dtype=torch.float32)
    eager = run(get_objective("dapo"), data)
    compiled = run(get_objective("dapo", compile=True), data)
    assert_same(eager, compiled, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dapo", "gspo", "nsr_dapo", "clip_cov"])
def test_inductor_on_cuda_equals_eager(name):
    """On a GPU, as the hot loop runs it: float32, the default backend, draws from a CUDA
    generator (the same draws in both modes)."""
    logp, logp_old, adv, mask = (x.cuda() for x in batch(B=16, T=64, dtype=torch.float32))

    def run_cuda(obj):
        lp = logp.clone().requires_grad_(True)
        gen = torch.Generator("cuda").manual_seed(3)
        out = obj(lp, logp_old, adv, mask, generator=gen, validate=False)
        aggregate(out.loss, mask, "token-mean", validate=False).backward()
        return out.loss.detach(), out.coef, out.metrics, lp.grad, gen.get_state()

    eager = run_cuda(get_objective(name))
    compiled = run_cuda(get_objective(name, compile=True))
    assert_same(eager, compiled, rtol=1e-5, atol=1e-6)
