"""sandbox.correction: truncated / masked rollout importance weights.

Hand values at both levels and in both modes, padding, extreme log-prob gaps, no gradient,
validation messages, and agreement with TRL 1.16's inline ``vllm_importance_sampling_*`` code
(transcribed: TRL exposes no function) and with verl's ``compute_rollout_correction_weights``.
"""

from __future__ import annotations

import math

import pytest
import torch

from sandbox.correction import rollout_is_weights

L15, L3 = math.log(1.5), math.log(3.0)


def tensors():
    # row 0: ratios 1.5, 3, 0.5 (all valid); row 1: ratio 1 then padding (ratio 1/3 there)
    old = torch.tensor([[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    roll = torch.tensor([[-L15, -L3, math.log(2.0)], [-1.0, -1.0 + L3, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    return old, roll, mask


def test_token_truncate_hand_values():
    w, m = rollout_is_weights(*tensors(), mode="truncate", level="token", cmin=0.0, cmax=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 2.0, 0.5], [1.0, 0.0, 0.0]]))
    assert set(m) == {"rollout_is_mean", "rollout_is_clip_frac", "rollout_kl_k3"}
    assert m["rollout_is_mean"].item() == pytest.approx((1.5 + 2 + 0.5 + 1) / 4)
    assert m["rollout_is_clip_frac"].item() == pytest.approx(1 / 4)
    k3 = [r - 1 - math.log(r) for r in (1.5, 3.0, 0.5, 1.0)]
    assert m["rollout_kl_k3"].item() == pytest.approx(sum(k3) / 4)
    # a lower bound clips from below
    w, m = rollout_is_weights(*tensors(), mode="truncate", cmin=0.8, cmax=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 2.0, 0.8], [1.0, 0.0, 0.0]]))
    assert m["rollout_is_clip_frac"].item() == pytest.approx(2 / 4)


def test_token_mask_keeps_the_ratio_inside_the_bounds():
    w, m = rollout_is_weights(*tensors(), mode="mask", cmin=0.8, cmax=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert set(m) == {"rollout_is_mean", "rollout_is_masked_frac", "rollout_kl_k3"}
    assert m["rollout_is_masked_frac"].item() == pytest.approx(2 / 4)
    assert m["rollout_is_mean"].item() == pytest.approx(2.5 / 4)
    # bounds are inclusive
    w, _ = rollout_is_weights(*tensors(), mode="mask", cmin=0.5, cmax=3.0)
    torch.testing.assert_close(w, torch.tensor([[1.5, 3.0, 0.5], [1.0, 0.0, 0.0]]))


def test_sequence_level_is_the_product_over_valid_tokens():
    old, roll, mask = tensors()
    # row 0: 1.5 * 3 * 0.5 = 2.25; row 1: 1 (the padded tokens do not count)
    w, m = rollout_is_weights(old, roll, mask, mode="truncate", level="sequence", cmax=5.0)
    torch.testing.assert_close(w, torch.tensor([[2.25] * 3, [1.0, 0.0, 0.0]]))
    assert m["rollout_is_mean"].item() == pytest.approx((2.25 + 1) / 2)  # per sequence
    assert m["rollout_is_clip_frac"].item() == 0.0
    w, m = rollout_is_weights(old, roll, mask, mode="truncate", level="sequence", cmax=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0] * 3, [1.0, 0.0, 0.0]]))
    assert m["rollout_is_clip_frac"].item() == pytest.approx(1 / 2)
    w, m = rollout_is_weights(old, roll, mask, mode="mask", level="sequence", cmax=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0] * 3, [1.0, 0.0, 0.0]]))
    assert m["rollout_is_masked_frac"].item() == pytest.approx(1 / 2)
    assert m["rollout_is_mean"].item() == pytest.approx(1 / 2)
    # the KL metric is per token at both levels
    _, mt = rollout_is_weights(old, roll, mask, level="token")
    assert m["rollout_kl_k3"].item() == pytest.approx(mt["rollout_kl_k3"].item())


def test_on_policy_weights_are_one_and_metrics_zero():
    lp = torch.randn(4, 6)
    mask = (torch.arange(6) < torch.tensor([[6], [3], [1], [0]])).long()
    for mode in ("truncate", "mask"):
        for level in ("token", "sequence"):
            w, m = rollout_is_weights(lp, lp.clone(), mask, mode=mode, level=level)
            torch.testing.assert_close(w, mask.float())
            assert m["rollout_is_mean"].item() == pytest.approx(1.0)
            assert m["rollout_kl_k3"].item() == 0.0
            assert all(v.dim() == 0 for v in m.values())


def test_extreme_gaps_are_finite_and_padding_is_ignored():
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    roll = torch.tensor([[-1e4, 1e4, 0.0], [-80.0, -80.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    for mode in ("truncate", "mask"):
        for level in ("token", "sequence"):
            w, m = rollout_is_weights(old, roll, mask, mode=mode, level=level, cmax=1e12)
            assert torch.isfinite(w).all() and (w >= 0).all()
            assert all(math.isfinite(v.item()) for v in m.values())
            assert (w[mask == 0] == 0).all()
    w, _ = rollout_is_weights(old, roll, mask, level="token", cmax=1e12)
    assert w[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)  # the ±20 log clamp
    assert w[0, 1].item() == pytest.approx(math.exp(-20.0), rel=1e-5)
    # a NaN sampler log-prob on a valid token means no correction there (TRL)
    w, _ = rollout_is_weights(old, torch.tensor([[float("nan"), 0.0, 0.0]] * 2), mask)
    torch.testing.assert_close(w, mask.float())


def test_weights_carry_no_gradient():
    old = torch.randn(3, 4, requires_grad=True)
    roll = torch.randn(3, 4, requires_grad=True)
    w, m = rollout_is_weights(old, roll, torch.ones(3, 4))
    assert not w.requires_grad and w.grad_fn is None
    assert not any(v.requires_grad for v in m.values())
    loss = (old * w).sum()  # the gradient flows through the loss only, scaled by w
    loss.backward()
    torch.testing.assert_close(old.grad, w)
    assert roll.grad is None


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"mode": "clip"}, "mode must be one of"),
        ({"level": "batch"}, "level must be one of"),
        ({"cmin": -0.1}, "cmin must be"),
        ({"cmin": float("nan")}, "cmin must be"),
        ({"cmax": 0.0}, "cmax must be > 0"),
        ({"cmin": 3.0, "cmax": 2.0}, "cmax must be >= cmin"),
    ],
)
def test_validation_names_the_argument(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        rollout_is_weights(*tensors(), **kwargs)


def test_shapes_are_checked():
    old, roll, mask = tensors()
    with pytest.raises(ValueError, match="logp_rollout must have the shape"):
        rollout_is_weights(old, roll[:, :2], mask)
    with pytest.raises(ValueError, match="mask must have the shape"):
        rollout_is_weights(old, roll, mask[:1])
    with pytest.raises(ValueError, match="logp_old must have shape"):
        rollout_is_weights(old[0], roll[0], mask[0])


def trl_ratio(old, sampling, mask, trl_mode, clip_min, clip_max):
    """TRL 1.16 ``GRPOTrainer._generate_and_score_completions``, vLLM IS block, verbatim logic."""
    per_token_logps_diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if trl_mode in ("sequence_mask", "sequence_truncate"):
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if trl_mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize(("cmin", "cmax"), [(0.0, 3.0), (0.5, 2.0)])
def test_matches_trl(level, mode, cmin, cmax):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 5, generator=g) * 3
    roll = old + 0.4 * torch.randn(6, 5, generator=g)
    mask = (torch.arange(5) < torch.tensor([[5], [4], [2], [1], [5], [3]])).float()
    ours, _ = rollout_is_weights(old, roll, mask, mode=mode, level=level, cmin=cmin, cmax=cmax)
    theirs = trl_ratio(old, roll, mask, f"{level}_{mode}", cmin or None, cmax)
    # TRL multiplies the ratio into a per-token loss that is 0 on padding: compare valid tokens
    torch.testing.assert_close(ours, (theirs * mask).expand_as(ours))


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(
    ("mode", "cmin", "threshold"), [("truncate", 0.0, 2.0), ("mask", 0.5, "0.5_2.0")]
)
def test_matches_verl(level, mode, cmin, threshold):
    helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(6, 5, generator=g) * 3
    roll = old + 0.4 * torch.randn(6, 5, generator=g)
    mask = (torch.arange(5) < torch.tensor([[5], [4], [2], [1], [5], [3]])).float()
    ours, _ = rollout_is_weights(old, roll, mask, mode=mode, level=level, cmin=cmin, cmax=2.0)
    theirs, _ = helper.compute_rollout_correction_weights(
        old - roll, mask, rollout_is=level, rollout_is_threshold=threshold
    )
    torch.testing.assert_close(ours, theirs)
