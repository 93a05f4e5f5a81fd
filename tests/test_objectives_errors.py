"""Bad input gets a ValueError that names the argument."""

import pytest
import torch

from sandbox.objectives import available_objectives, available_presets, get_objective


def inputs(B=2, T=3):
    logp_old = -torch.rand(B, T)
    return logp_old + 0.1, logp_old, torch.randn(B, 1), torch.ones(B, T, dtype=torch.bool)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown objective 'ppo'") as err:
        get_objective("ppo")
    for name in available_objectives() + available_presets():
        assert name in str(err.value)


def test_unknown_parameter_lists_valid_parameters():
    with pytest.raises(
        ValueError, match=r"unknown parameter.*'epsilon'.*eps_low, eps_high, clip_c"
    ):
        get_objective("ppo_clip", epsilon=0.2)
    with pytest.raises(ValueError, match="epsilon"):
        get_objective("dapo", epsilon=0.2)  # presets too


@pytest.mark.parametrize(
    "name,params,argument",
    [
        ("ppo_clip", {"eps_low": -0.1}, "eps_low"),
        ("ppo_clip", {"eps_high": -1.0}, "eps_high"),
        ("ppo_clip", {"clip_c": 0.5}, "clip_c"),
        ("atr", {"delta": 0.0}, "delta"),
        ("atr", {"delta": -1.0}, "delta"),
        ("nsr", {"sigma": 1.5}, "sigma"),
        ("nsr", {"sigma": 0.0}, "sigma"),
        ("nsr", {"noise": "gauss"}, "noise"),
        ("nsr", {"level": "batch"}, "level"),
        ("nsr_decay", {"eps_high": 0.0}, "eps_high"),
        ("dgpo", {"n": 0.5}, "n"),
        ("dgpo", {"m": 0}, "m"),
        ("cispo", {"upper": 0.5}, "upper"),
        ("cispo", {"lower": 2.0}, "lower"),
        ("sapo", {"tau_pos": 0.0}, "tau_pos"),
        ("clip_cov", {"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        ("clip_cov", {"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "clip_cov_ub"),
        ("kl_cov", {"kl_cov_ratio": 2.0}, "kl_cov_ratio"),
        ("ce_gppo", {"beta1": -1}, "beta1"),
        ("gmpo", {"eps_low": 0.0}, "eps_low"),
        ("gmpo", {"eps_high": -0.4}, "eps_high"),
        ("vespo", {"k_pos": 0.0}, "k_pos"),
        ("vespo", {"lambda_pos": -3.0}, "lambda_pos"),
        ("vespo", {"k_neg": -1.0}, "k_neg"),
        ("vespo", {"lambda_neg": 0.0}, "lambda_neg"),
        ("ppo_clip", {"eps_low": float("nan")}, "eps_low"),
        ("ppo_clip", {"eps_low": "0.2"}, "eps_low"),
    ],
)
def test_out_of_range_parameter_is_named(name, params, argument):
    with pytest.raises(ValueError, match=rf"\b{argument}\b"):
        get_objective(name, **params)


@pytest.mark.parametrize("name", available_objectives())
def test_bad_tensors_are_named(name):
    obj = get_objective(name)
    logp, logp_old, adv, mask = inputs()
    with pytest.raises(ValueError, match="logp_old must have the shape"):
        obj(logp, logp_old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="adv must have shape"):
        obj(logp, logp_old, torch.randn(2, 2), mask)
    with pytest.raises(ValueError, match="mask must have the shape"):
        obj(logp, logp_old, adv, mask[:1])
    with pytest.raises(ValueError, match="logp must have shape"):
        obj(logp[0], logp_old[0], adv, mask[0])
    with pytest.raises(ValueError, match="logp_old is on meta"):
        obj(logp, logp_old.to("meta"), adv, mask)
    with pytest.raises(ValueError, match="mask is empty"):
        obj(logp, logp_old, adv, torch.zeros_like(mask))
    for bad in (float("nan"), float("inf")):
        lp = logp.clone()
        lp[1, 2] = bad
        with pytest.raises(ValueError, match=r"^logp contains NaN or Inf"):
            obj(lp, logp_old, adv, mask)
        lo = logp_old.clone()
        lo[0, 0] = bad
        with pytest.raises(ValueError, match=r"^logp_old contains NaN or Inf"):
            obj(logp, lo, adv, mask)
        a = adv.clone()
        a[1, 0] = bad
        with pytest.raises(ValueError, match=r"^adv contains NaN or Inf"):
            obj(logp, logp_old, a, mask)
    with pytest.raises(ValueError, match=r"logp must be a torch\.Tensor"):
        obj(logp.tolist(), logp_old, adv, mask)
