"""verl's own gpg, dro, dppo_tv, dppo_kl and geo_mean against sandbox_<name> under the same verl
config: loss and gradient in float64, every aggregation mode verl honours (geo_mean honours none:
it is a plain mean over the micro-batch's rows), with and without rollout IS weights."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("verl")

from test_adapter_verl import actor_config, assert_same, make_data, run
from verl.workers.config import PolicyLossConfig

from sandbox.objectives import get_objective

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
PEERS = [("gpg", {}), ("dro", {"dro_beta": 0.3}), ("dppo_tv", {}), ("dppo_kl", {})]


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "rollout-is"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "policy_loss"), PEERS, ids=[p[0] for p in PEERS])
def test_sandbox_peer_rule_equals_verls_own(name, policy_loss, mode, weights):
    # DPPO: bounds 0.05 / 0.08 in probability (TV) or nats (KL), cap 1.5, so that the masks and
    # the truncation both act on this data
    cfg = actor_config(
        policy_loss=PolicyLossConfig(**policy_loss),
        clip_ratio=0.2,
        clip_ratio_low=0.05,
        clip_ratio_high=0.08,
        clip_ratio_c=1.5,
    )
    data = make_data(noise=0.5)
    if name.startswith("dppo"):
        out = get_objective(name, delta_low=0.05, delta_high=0.08, tis_cap=1.5)(*data[:4])
        assert 0 < out.metrics["clip_low_frac"] + out.metrics["clip_high_frac"] < 1
        assert out.metrics["tis_frac"] > 0
    assert_same(
        run(f"sandbox_{name}", cfg, data, mode, weights), run(name, cfg, data, mode, weights)
    )


def test_dppo_by_hand():
    # p_old 0.5 -> p 0.7 (r = 1.4): TV moved +0.2; with delta_high 0.15 and A > 0 the token is
    # masked (coef 0); with A < 0 it moved against the advantage's direction and keeps
    # coef = A min(r, cap) = -1 * 1.4. Binary KL: 0.5 log(0.5/0.7) + 0.5 log(0.5/0.3) = 0.087177
    # > 0.08 masks it for A > 0, < 0.1 keeps it.
    logp = torch.tensor([[0.7], [0.7]], dtype=torch.float64).log().requires_grad_()
    old = torch.tensor([[0.5], [0.5]], dtype=torch.float64).log()
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    tv = get_objective("dppo_tv", delta_low=0.15, delta_high=0.15, tis_cap=20.0)(logp, old, adv)
    torch.testing.assert_close(tv.coef, torch.tensor([[0.0], [-1.4]], dtype=torch.float64))
    assert tv.metrics["clip_high_frac"].item() == 0.5 and tv.metrics["clip_low_frac"].item() == 0.0
    capped = get_objective("dppo_tv", delta_low=0.15, delta_high=0.15, tis_cap=1.2)(logp, old, adv)
    assert capped.coef[1, 0].item() == pytest.approx(-1.2, abs=1e-12)  # the weight is truncated
    d = 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)
    assert d == pytest.approx(0.087177, abs=1e-6)
    masked = get_objective("dppo_kl", delta_low=0.08, delta_high=0.08)(logp, old, adv)
    assert masked.coef[0, 0].item() == 0.0
    kept = get_objective("dppo_kl", delta_low=0.1, delta_high=0.1)(logp, old, adv)
    assert kept.coef[0, 0].item() == pytest.approx(1.4, abs=1e-12)
    (grad,) = torch.autograd.grad(kept.loss.sum(), logp)
    torch.testing.assert_close(grad, -kept.coef)


def test_dppo_has_no_closed_form_in_the_ratio_and_says_why():
    with pytest.raises(NotImplementedError, match="probability change"):
        get_objective("dppo_tv").expected_coef(1.2, 1.0)
    assert not get_objective("dppo_kl").has_expected_coef()


def test_dro_beta_comes_from_verls_policy_loss_config():
    from llm.adapters.verl import resolve_params

    cfg = actor_config(policy_loss=PolicyLossConfig(dro_beta=0.7))
    assert resolve_params("dro", cfg) == {"beta": 0.7}
    assert resolve_params("gpg", cfg) == {}


def test_gpg_and_dro_by_hand():
    # one token: logp_old = log 0.5, logp = log 0.6, A = 2.
    logp = torch.tensor([[0.6]], dtype=torch.float64).log().requires_grad_()
    old = torch.tensor([[0.5]], dtype=torch.float64).log()
    adv = torch.tensor([[2.0]], dtype=torch.float64)
    gpg = get_objective("gpg")(logp, old, adv)
    # GPG: loss = -A log p = -2 log 0.6 = 1.021651; coef = A = 2 whatever the ratio
    assert gpg.loss.item() == pytest.approx(-2 * torch.log(torch.tensor(0.6)).item(), abs=1e-6)
    assert gpg.coef.item() == pytest.approx(2.0, abs=1e-12)
    dro = get_objective("dro", beta=0.5)(logp, old, adv)
    # DRO: log r = log 1.2 = 0.182322; loss = -(2 log 0.6 - 0.25 * 0.182322^2) = 1.029961;
    # coef = A - beta log r = 2 - 0.5 * 0.182322 = 1.908839
    lr = torch.log(torch.tensor(1.2, dtype=torch.float64)).item()
    assert dro.loss.item() == pytest.approx(
        -(2 * torch.log(torch.tensor(0.6)).item() - 0.25 * lr**2), abs=1e-6
    )
    assert dro.coef.item() == pytest.approx(2.0 - 0.5 * lr, abs=1e-12)
    (grad,) = torch.autograd.grad(dro.loss.sum(), logp)
    assert grad.item() == pytest.approx(-(2.0 - 0.5 * lr), abs=1e-12)
    # A = 0 still moves the token back toward the old policy (the penalty acts alone)
    zero = get_objective("dro", beta=0.5)(logp, old, torch.zeros_like(adv))
    assert zero.coef.item() == pytest.approx(-0.5 * lr, abs=1e-12)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("dro", {"beta": 0.0}),
        ("dro", {"beta": -1.0}),
        ("dppo_tv", {"delta_low": 0.0}),
        ("dppo_kl", {"delta_high": -0.1}),
        ("dppo_tv", {"tis_cap": 0.0}),
    ],
)
def test_bad_peer_parameters_name_themselves(name, bad):
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must lie in"):
        get_objective(name, **bad)


# --------------------------------------------------------------------------------------------------
# GMPO: verl's geo_mean
# --------------------------------------------------------------------------------------------------

#: verl's geo_mean takes the geometric mean of the IS weights as exp(mean log(w + 1e-10)): relative
#: 1e-10 / w <= 2e-10 here (w >= 0.5); measured 2.8e-10 (identical, 1e-16, without weights). Its
#: |o_i| + 1e-8 denominators vanish for a bool mask (an integer count + 1e-8 is float32: 12.0); a
#: float64 mask would leave a relative 1e-8 / |o_i|.
GMPO_RTOL = 1e-9


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "rollout-is"])
@pytest.mark.parametrize(("low", "high"), [(0.2, 0.2), (0.1, 0.3)])
def test_sandbox_gmpo_equals_verls_geo_mean(low, high, weights):
    # geo_mean reduces with a plain mean over the micro-batch's 8 rows (the empty one included)
    # whatever loss_agg_mode: agg_loss's seq-mean-token-mean with global_batch_size = 8 is that.
    cfg = actor_config(
        clip_ratio_low=low, clip_ratio_high=high, batch_info={"dp_size": 1, "global_batch_size": 8}
    )
    data = make_data(noise=0.5)
    out = get_objective("gmpo", eps_low=low, eps_high=high)(*data[:4])
    assert out.metrics["clip_low_frac"] > 0 and out.metrics["clip_high_frac"] > 0  # both clip
    mode = "seq-mean-token-mean"
    ours = run("sandbox_gmpo", cfg, data, mode, weights)
    assert_same(ours, run("geo_mean", cfg, data, mode, weights), rtol=GMPO_RTOL)
    # the preset is verl's defaults (clip_ratio_low = clip_ratio_high = 0.2, in log space)
    counted = actor_config(batch_info={"global_batch_size": 8})
    preset = run("sandbox_gmpo_verl", counted, data, mode, weights)
    assert_same(preset, run("geo_mean", actor_config(), data, mode, weights), rtol=GMPO_RTOL)


def test_verl_geo_mean_ignores_loss_agg_mode_and_batch_counts():
    """verl's geo_mean is the same in every mode and for any global batch counts (a plain mean
    over the micro-batch's rows); sandbox_gmpo honours both, as every sandbox loss does."""
    data = make_data(seed=3, noise=0.5)
    plain = actor_config()
    counted = actor_config(
        batch_info={"dp_size": 2, "global_batch_size": 32, "batch_num_tokens": 200}
    )
    theirs = [
        run("geo_mean", cfg, data, mode)[0].item() for mode in MODES for cfg in (plain, counted)
    ]
    assert max(theirs) == pytest.approx(min(theirs), rel=1e-15)
    ours_tm = run("sandbox_gmpo", plain, data, "token-mean")[0]
    assert ours_tm.item() != pytest.approx(theirs[0], rel=1e-3)


def test_gmpo_rollout_weights_enter_as_their_geometric_mean():
    # One sequence of two tokens with weights 0.5 and 2: verl multiplies its sequence loss by
    # exp((log 0.5 + log 2) / 2) = 1, not by their arithmetic mean 1.25.
    from llm.adapters.verl import _rollout_weights

    w = torch.tensor([[0.5, 2.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    got = _rollout_weights(get_objective("gmpo"), w, mask)
    assert got.shape == (1, 1) and got.item() == pytest.approx(1.0, abs=1e-9)
    assert _rollout_weights(get_objective("ppo_clip"), w, mask) is w  # per token elsewhere
