"""sandbox.exact on softmax bandits: hand values, Monte Carlo agreement, theory checks, flows.

Monte Carlo checks use a tolerance derived from the samples themselves (CLT): every component must
satisfy ``|mean - exact| <= 5 se`` with ``se`` the standard error of the sample mean, and each
check also asserts that it has power (``se`` small compared with the exact value, or with the gap
to a wrong answer), so the tolerance could fail.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from envs import BanditModel, ContextualBanditModel, make_bandit_suite
from sandbox.advantages import compute_advantages
from sandbox.exact import (
    ADVANTAGE_OPTIONS,
    FLOW_COLUMNS,
    bandit_gradient,
    contextual_bandit_gradient,
    entropy,
    entropy_covariance_prediction,
    exact_flow,
    expected_clip_fractions,
    group_advantage_table,
    nsr_gradient_variance,
)
from sandbox.objectives import Objective, available_objectives, available_presets, get_objective

F64 = torch.float64
Z_MAX = 5.0  # allowed deviation in standard errors (two-sided p ~ 6e-7 per component)
EPS = 1e-6


ALL_NAMES = available_objectives() + available_presets()
EXACT_NAMES = [n for n in ALL_NAMES if get_objective(n).has_expected_coef()]
EXACT_OBJECTIVES = [n for n in available_objectives() if n in EXACT_NAMES]


def softmax(z):
    return torch.softmax(z, -1)


def off_policy_setup(seed: int, k: int = 6, shift: float = 0.6):
    """Random old logits, logits = old + shift * N(0, 1) (ratios well outside [0.8, 1.28] on
    several arms), Bernoulli success probabilities in (0.05, 0.95)."""
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(k, generator=gen, dtype=F64)
    logits = old + shift * torch.randn(k, generator=gen, dtype=F64)
    probs = 0.05 + 0.9 * torch.rand(k, generator=gen, dtype=F64)
    return logits, old, probs


def assert_mc_matches(per_sample: torch.Tensor, exact: torch.Tensor, min_power: float = 20.0):
    """``per_sample [N, K]`` i.i.d. draws whose mean should be ``exact [K]``."""
    n = per_sample.shape[0]
    mean = per_sample.mean(0)
    se = per_sample.std(0) / math.sqrt(n)
    dev = (mean - exact).abs()
    assert bool((dev <= Z_MAX * se + 1e-15).all()), (
        f"MC mean deviates: |mean - exact| / se = {(dev / se).tolist()}"
    )
    # power: the check resolves the exact gradient to a few percent of its size
    assert exact.norm() > min_power * se.max(), f"underpowered: |exact| {exact.norm()}, se {se}"
    return mean, se


def sampled_gradients(obj, logits, old, probs, n, gen, advantage, noise_std=None):
    """Per-sample ascent directions ``coef_i (e_{a_i} - pi)`` ``[N, K]``, the objective's output and
    the autograd ascent direction ``-d(loss.sum() / N)/dz``."""
    pi_old = softmax(old)
    a = torch.multinomial(pi_old, n, replacement=True, generator=gen)
    if noise_std is None:  # Bernoulli rewards
        r = (torch.rand(n, generator=gen, dtype=F64) < probs[a]).to(F64)
        mu = (pi_old * probs).sum()
        var = (pi_old * probs).sum() - mu**2  # R in {0, 1}: E[R^2] = E[R]
    else:  # Gaussian rewards with means `probs`
        r = probs[a] + noise_std * torch.randn(n, generator=gen, dtype=F64)
        mu = (pi_old * probs).sum()
        var = (pi_old * (probs - mu) ** 2).sum() + noise_std**2
    adv = r - mu
    if advantage == "std":
        adv = adv / (var.sqrt() + EPS)
    z = logits.clone().requires_grad_(True)
    logp_all = torch.log_softmax(z, -1)
    logp = logp_all[a][:, None]
    logp_old = torch.log_softmax(old, -1)[a][:, None]
    out = obj(logp, logp_old, adv[:, None], None, generator=gen)
    (grad,) = torch.autograd.grad(out.loss.sum() / n, z)
    onehot = torch.nn.functional.one_hot(a, logits.shape[-1]).to(F64)
    per = out.coef[:, :1] * (onehot - softmax(logits))
    return per, out, -grad


# ---------------------------------------------------------------------------------------------
# Hand-derived values
# ---------------------------------------------------------------------------------------------


def test_hand_values_two_arms():
    rewards = torch.tensor([1.0, 0.0], dtype=F64)
    zero = torch.zeros(2, dtype=F64)
    # On-policy, pi = (0.5, 0.5), population advantage: mu = 0.5, A = (0.5, -0.5);
    # dJ/dz = 0.5*0.5*(0.5, -0.5) + 0.5*(-0.5)*(-0.5, 0.5) = (0.25, -0.25).
    g = bandit_gradient(get_objective("ppo_clip"), zero, zero, rewards)
    torch.testing.assert_close(g, torch.tensor([0.25, -0.25], dtype=F64), rtol=0, atol=1e-15)

    # Off-policy: pi_old = (0.5, 0.5), pi = (0.7, 0.3), so r = (1.4, 0.6), A = (0.5, -0.5).
    logits = torch.log(torch.tensor([0.7, 0.3], dtype=F64))
    # unclipped: w = pi_old r A = (0.35, -0.15), sum w = 0.2, dJ/dz = w - pi sum w = (0.21, -0.21).
    g = bandit_gradient(get_objective("unclipped"), logits, zero, rewards)
    torch.testing.assert_close(g, torch.tensor([0.21, -0.21], dtype=F64), rtol=0, atol=1e-15)
    # ppo_clip (l = 0.8, u = 1.2): arm 0 is in Z_hi (A > 0, r = 1.4 > u), arm 1 in Z_lo
    # (A < 0, r = 0.6 < l): both gradients are cut, dJ/dz = 0.
    g = bandit_gradient(get_objective("ppo_clip"), logits, zero, rewards)
    torch.testing.assert_close(g, torch.zeros(2, dtype=F64), rtol=0, atol=0)
    # gppo (l = 0.8, u = 1.28): g = u = 1.28 on Z_hi, l = 0.8 on Z_lo: w = (0.5*1.28*0.5,
    # 0.5*0.8*(-0.5)) = (0.32, -0.2), sum 0.12, dJ/dz = (0.32 - 0.084, -0.2 - 0.036) = (0.236, -0.236).
    g = bandit_gradient(get_objective("gppo"), logits, zero, rewards)
    torch.testing.assert_close(g, torch.tensor([0.236, -0.236], dtype=F64), rtol=0, atol=1e-15)


def test_hand_value_grpo_group_of_two():
    # G = 2, pi_old = pi = (0.5, 0.5), deterministic rewards (1, 0), eps = 0: p_bar = 0.5 and the
    # other member succeeds with probability 0.5. Arm 0 (R = 1): k = 1 w.p. 1/2, where
    # s_1 = sqrt(1*1/(2*1)) = 1/sqrt(2) and A = (1 - 1/2) sqrt(2) = 1/sqrt(2); k = 2 gives A = 0.
    # So E[A | 0] = 1/(2 sqrt(2)), and E[A | 1] = -1/(2 sqrt(2)) by symmetry.
    # dJ/dz = 0.5 * E[A|0] * (0.5, -0.5) + 0.5 * E[A|1] * (-0.5, 0.5) = (sqrt(2)/8, -sqrt(2)/8).
    zero = torch.zeros(2, dtype=F64)
    g = bandit_gradient(
        get_objective("ppo_clip"),
        zero,
        zero,
        torch.tensor([1.0, 0.0], dtype=F64),
        advantage="grpo",
        group_size=2,
        eps=0.0,
    )
    expect = math.sqrt(2) / 8
    torch.testing.assert_close(g, torch.tensor([expect, -expect], dtype=F64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("group_size", [2, 3, 4, 8])
def test_group_advantage_table_matches_compute_advantages(method, group_size):
    table = group_advantage_table(method, group_size, eps=EPS)
    for k in range(group_size + 1):  # a group with k successes (successes first)
        rewards = torch.tensor([1.0] * k + [0.0] * (group_size - k), dtype=F64)
        adv = compute_advantages(rewards[None], method=method, eps=EPS)[0]
        if k > 0:  # a success sees J = k - 1 other successes
            assert table[1, k - 1].item() == pytest.approx(adv[0].item(), abs=1e-12)
        if k < group_size:  # a failure sees J = k
            assert table[0, k].item() == pytest.approx(adv[-1].item(), abs=1e-12)


# ---------------------------------------------------------------------------------------------
# On-policy reduction to REINFORCE (docs/objectives.md §10.1)
# ---------------------------------------------------------------------------------------------


def reinforce_mean_advantage(pi, probs, advantage, group_size=None):
    """E[A | a] for binary rewards, enumerated independently of sandbox.exact."""
    mu = (pi * probs).sum()
    if advantage == "population":
        return probs - mu
    if advantage == "std":
        return (probs - mu) / (math.sqrt(mu * (1 - mu)) + EPS)
    g, p_bar = group_size, mu.item()
    out = torch.zeros_like(probs)
    for j in range(g):  # successes among the other G - 1 members
        pj = math.comb(g - 1, j) * p_bar**j * (1 - p_bar) ** (g - 1 - j)
        for r, p_r in ((1, probs), (0, 1 - probs)):
            k = r + j
            if 0 < k < g:
                s = math.sqrt(k * (g - k) / (g * (g - 1)))
                out = out + pj * p_r * (r - k / g) / (s + EPS)
    return out


@pytest.mark.parametrize("advantage", ["population", "std", "grpo"])
@pytest.mark.parametrize("name", EXACT_NAMES)
def test_on_policy_equals_reinforce(name, advantage):
    _, old, probs = off_policy_setup(1, k=7)
    group = 4 if advantage == "grpo" else None
    g = bandit_gradient(
        get_objective(name), old, old, probs, binary=True, advantage=advantage, group_size=group
    )
    pi = softmax(old)
    mean_adv = reinforce_mean_advantage(pi, probs, advantage, group)
    expect = pi * mean_adv - pi * (pi * mean_adv).sum()  # sum_a pi(a) E[A|a] (e_a - pi)
    torch.testing.assert_close(g, expect, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in EXACT_NAMES if not get_objective(n).stochastic])
def test_deterministic_objectives_called_on_every_arm(name):
    """With deterministic rewards and a deterministic rule, the exact gradient is the objective
    itself called once on the whole outcome space (all K arms), weighted by pi_old. Arm 5 has
    log r ~ +25 and arm 6 ~ -25, beyond the objectives' ±20 clamp: the realised coefficient is cut
    there (except for rules whose loss does not go through r, like CISPO), and so is the exact one.
    """
    obj = get_objective(name)
    logits, old, _ = off_policy_setup(10, k=7)
    old[5], logits[6] = -25.0, -25.0
    rewards = torch.tensor([1.0, 0.0, 0.3, 2.0, -1.0, 1.5, -0.5], dtype=F64)
    exact = bandit_gradient(obj, logits, old, rewards)
    pi, pi_old = softmax(logits), softmax(old)
    adv = rewards - (pi_old * rewards).sum()
    z = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(z, -1)[:, None]  # [K, 1]: one token per arm
    out = obj(logp, torch.log_softmax(old, -1)[:, None], adv[:, None])
    (grad,) = torch.autograd.grad((pi_old[:, None] * out.loss).sum(), z)
    torch.testing.assert_close(exact, -grad, rtol=0, atol=1e-13)
    w = pi_old * out.coef[:, 0]
    torch.testing.assert_close(exact, w - pi * w.sum(), rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# Monte Carlo: the exact gradient is the mean of the sampled one, for every objective
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("advantage", ["population", "std"])
@pytest.mark.parametrize("name", EXACT_NAMES)
def test_monte_carlo_matches_exact(name, advantage):
    obj = get_objective(name)
    logits, old, probs = off_policy_setup(2)
    exact = bandit_gradient(obj, logits, old, probs, binary=True, advantage=advantage)
    gen = torch.Generator().manual_seed(123)
    n = 100_000
    per, out, autograd = sampled_gradients(obj, logits, old, probs, n, gen, advantage)
    # autograd of the realised loss is the mean of coef (e_a - pi): ties coef to the loss
    torch.testing.assert_close(autograd, per.mean(0), rtol=1e-10, atol=1e-13)
    assert_mc_matches(per, exact)
    ratio = softmax(logits) / softmax(old)
    assert ratio.min() < 0.5 and ratio.max() > 1.3  # outside DAPO's [0.8, 1.28] on both sides
    if obj.bounds() is not None:  # the realised clip fractions, in expectation
        low, high = expected_clip_fractions(obj, logits, old, probs, binary=True)
        for key, p in (("clip_low_frac", low), ("clip_high_frac", high)):
            se = math.sqrt(max(p.item() * (1 - p.item()), 1e-12) / n)
            assert abs(out.metrics[key].item() - p.item()) <= Z_MAX * se


def test_monte_carlo_tells_clip_rules_apart():
    """Power: the MC noise is far below the gap between ppo_clip and the unclipped gradient."""
    logits, old, probs = off_policy_setup(2)
    clip = bandit_gradient(get_objective("ppo_clip"), logits, old, probs, binary=True)
    free = bandit_gradient(get_objective("unclipped"), logits, old, probs, binary=True)
    gen = torch.Generator().manual_seed(5)
    per, _, _ = sampled_gradients(
        get_objective("ppo_clip"), logits, old, probs, 200_000, gen, "population"
    )
    _, se = assert_mc_matches(per, clip)
    assert ((clip - free).abs() / se).max() > 50


def test_gaussian_rewards_refuse_a_coefficient_not_proportional_to_the_advantage():
    # DRO's coef = A - beta log r: E[coef] over Gaussian rewards does not split by the sign of A
    logits, old, _ = off_policy_setup(3)
    means = torch.randn(6, generator=torch.Generator().manual_seed(9), dtype=F64)
    with pytest.raises(ValueError, match="not proportional to"):
        bandit_gradient(get_objective("dro"), logits, old, means, noise_std=0.7)


@pytest.mark.parametrize("advantage", ["population", "std"])
@pytest.mark.parametrize("name", [n for n in EXACT_OBJECTIVES if get_objective(n).coef_homogeneous])
def test_monte_carlo_gaussian_rewards(name, advantage):
    obj = get_objective(name)
    logits, old, _ = off_policy_setup(3)
    means = torch.randn(6, generator=torch.Generator().manual_seed(9), dtype=F64)
    exact = bandit_gradient(obj, logits, old, means, noise_std=0.7, advantage=advantage)
    gen = torch.Generator().manual_seed(11)
    per, _, _ = sampled_gradients(obj, logits, old, means, 100_000, gen, advantage, noise_std=0.7)
    assert_mc_matches(per, exact)


def sampled_group_gradients(obj, logits, old, probs, groups, group_size, gen, method):
    """Per-group ascent directions ``(1/G) sum_i coef_i (e_{a_i} - pi)`` ``[groups, K]``."""
    pi_old = softmax(old)
    a = torch.multinomial(pi_old, groups * group_size, replacement=True, generator=gen)
    r = (torch.rand(a.shape, generator=gen, dtype=F64) < probs[a]).to(F64)
    adv = compute_advantages(r.view(groups, group_size), method=method, eps=EPS).reshape(-1)
    logp = torch.log_softmax(logits, -1)[a][:, None]
    logp_old = torch.log_softmax(old, -1)[a][:, None]
    out = obj(logp, logp_old, adv[:, None], None, generator=gen)
    onehot = torch.nn.functional.one_hot(a, logits.shape[-1]).to(F64)
    per = out.coef[:, :1] * (onehot - softmax(logits))
    return per.view(groups, group_size, -1).mean(1)


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("ppo_clip", "grpo"),
        ("dapo", "grpo"),
        ("nsr", "grpo"),
        ("nsr_decay", "grpo"),
        ("sapo", "grpo"),
        ("ppo_clip", "dr_grpo"),
        ("ppo_clip", "rloo"),
    ],
)
def test_monte_carlo_finite_group(name, method, group_size):
    obj = get_objective(name)
    logits, old, probs = off_policy_setup(4)
    exact = bandit_gradient(
        obj, logits, old, probs, binary=True, advantage=method, group_size=group_size
    )
    gen = torch.Generator().manual_seed(7)
    per = sampled_group_gradients(obj, logits, old, probs, 50_000, group_size, gen, method)
    assert_mc_matches(per, exact)
    # the finite group matters: the population-advantage gradient is a different answer here
    if method == "grpo":
        pop = bandit_gradient(obj, logits, old, probs, binary=True, advantage="std")
        se = per.std(0) / math.sqrt(per.shape[0])
        assert ((exact - pop).abs() / se).max() > 10


# ---------------------------------------------------------------------------------------------
# NSR: stochastic rescue and deterministic decay (docs/objectives.md §10.5)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "advantage"),
    [({}, "population"), ({"noise": "band", "sigma": 0.2}, "population"), ({}, "grpo")],
)
def test_nsr_exact_mean_and_variance(params, advantage):
    stochastic = get_objective("nsr", **params)
    decay = get_objective("nsr_decay", **params)
    logits, old, probs = off_policy_setup(9)  # ratios in and beyond both rescue bands
    group = 4 if advantage == "grpo" else None
    kw = {"binary": True, "advantage": advantage, "group_size": group}
    g_s = bandit_gradient(stochastic, logits, old, probs, **kw)
    g_d = bandit_gradient(decay, logits, old, probs, **kw)
    torch.testing.assert_close(g_s, g_d, rtol=0, atol=1e-15)  # the same expected gradient
    moments = nsr_gradient_variance(stochastic, decay, logits, old, probs, **kw)
    torch.testing.assert_close(moments.mean, g_s, rtol=0, atol=1e-15)
    extra = moments.var_stochastic - moments.var_decay  # the rescue's Bernoulli variance
    assert bool((extra >= 0).all()) and extra.max() > 0
    print(
        f"\nNSR {params or 'uniform'} {advantage}: per-component variance of one sample's "
        f"gradient\n  stochastic {moments.var_stochastic.numpy().round(5)}"
        f"\n  decay      {moments.var_decay.numpy().round(5)}"
    )

    # Monte Carlo with common random numbers: both arms see the same arms and rewards (the decay
    # arm draws nothing else), so they differ only by NSR's keep draws.
    n = 200_000
    per_sample = {}
    for obj, var in ((stochastic, moments.var_stochastic), (decay, moments.var_decay)):
        gen = torch.Generator().manual_seed(17)
        if advantage == "grpo":  # members of a group are dependent: keep one member per group
            pi_old = softmax(old)
            a = torch.multinomial(pi_old, n * group, replacement=True, generator=gen)
            r = (torch.rand(a.shape, generator=gen, dtype=F64) < probs[a]).to(F64)
            adv = compute_advantages(r.view(n, group), method="grpo", eps=EPS)[:, 0]
            a = a.view(n, group)[:, 0]
            lp = torch.log_softmax(logits, -1)[a][:, None]
            lpo = torch.log_softmax(old, -1)[a][:, None]
            coef = obj(lp, lpo, adv[:, None], None, generator=gen).coef[:, 0]
            onehot = torch.nn.functional.one_hot(a, 6).to(F64)
            per = coef[:, None] * (onehot - softmax(logits))
        else:
            per, _, _ = sampled_gradients(obj, logits, old, probs, n, gen, advantage)
        assert_mc_matches(per, g_s)
        # variance: the mean of (x - E x)^2, with its own standard error
        sq = (per - g_s).pow(2)
        var_hat, se_var = sq.mean(0), sq.std(0) / math.sqrt(n)
        assert bool(((var_hat - var).abs() <= Z_MAX * se_var).all()), (
            f"{obj.name}: |var_mc - var| / se = {((var_hat - var).abs() / se_var).tolist()}"
        )
        assert var.max() > 20 * se_var.max()  # power
        per_sample[obj.name] = sq
    # the extra variance of the stochastic rescue, resolved by the paired samples
    diff = per_sample["nsr"] - per_sample["nsr_decay"]
    se_diff = diff.std(0) / math.sqrt(n)
    assert bool(((diff.mean(0) - extra).abs() <= Z_MAX * se_diff + 1e-15).all())
    assert (extra / se_diff).max() > 20


# ---------------------------------------------------------------------------------------------
# Entropy–covariance law (docs/objectives.md §10.8)
# ---------------------------------------------------------------------------------------------


def test_entropy_helpers():
    assert entropy(torch.zeros(7, dtype=F64)).item() == pytest.approx(math.log(7), abs=1e-14)
    # two arms with pi = (0.25, 0.75): H = -(0.25 log 0.25 + 0.75 log 0.75) = 0.5623351446
    z = torch.log(torch.tensor([[0.25, 0.75]], dtype=F64))
    assert entropy(z).item() == pytest.approx(0.5623351446188083, abs=1e-14)
    # a masked arm (logit -inf) contributes 0
    z = torch.tensor([0.0, 0.0, -math.inf], dtype=F64)
    assert entropy(z).item() == pytest.approx(math.log(2), abs=1e-14)
    # a constant logit shift changes nothing: predicted change 0
    dz = torch.full((2,), 0.3, dtype=F64)
    assert entropy_covariance_prediction(torch.zeros(2, dtype=F64), dz).item() == 0.0


@pytest.mark.parametrize("kind", ["vanilla", "natural"])
def test_entropy_covariance_law(kind):
    gen = torch.Generator().manual_seed(8)
    z = 1.5 * torch.randn(20, generator=gen, dtype=F64)
    pi = softmax(z)
    rewards = torch.rand(20, generator=gen, dtype=F64)
    adv = rewards - (pi * rewards).sum()
    eta = 1e-4
    dz = eta * pi * adv if kind == "vanilla" else eta * adv
    actual = entropy(z + dz) - entropy(z)
    predicted = entropy_covariance_prediction(z, dz)
    assert abs(predicted.item()) > 1e-7  # a real first-order change
    assert abs((predicted - actual).item() / actual.item()) < 1e-3  # well under 1%
    # with the exact vanilla PG step, the flow's prediction column is this law
    cov = (pi * (torch.log(pi) - (pi * torch.log(pi)).sum()) * (dz - (pi * dz).sum())).sum()
    assert predicted.item() == pytest.approx(-cov.item(), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Batches and prompts
# ---------------------------------------------------------------------------------------------


def test_contextual_gradient_is_prompt_weighted_per_prompt_gradient():
    model = ContextualBanditModel(num_arms=6, pass_rates=[0.0, 0.2, 0.5, 0.9], model_seed=1)
    gen = torch.Generator().manual_seed(3)
    old = torch.tensor(model.initial_logits) + 0.3 * torch.randn(4, 6, generator=gen, dtype=F64)
    logits = old + 0.5 * torch.randn(4, 6, generator=gen, dtype=F64)
    succ, rho = torch.tensor(model.success_probs), torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    for advantage, group in (("population", None), ("std", None), ("grpo", 8)):
        obj = get_objective("dapo")
        g = contextual_bandit_gradient(
            obj, logits, old, succ, rho, advantage=advantage, group_size=group
        )
        assert g.shape == (4, 6)
        for p in range(4):  # each prompt with its own mu, sigma, p_bar
            gp = bandit_gradient(
                obj, logits[p], old[p], succ[p], binary=True, advantage=advantage, group_size=group
            )
            torch.testing.assert_close(g[p], rho[p] * gp, rtol=0, atol=1e-15)
        assert g[0].abs().max() == 0  # the unsolvable prompt gives no signal


# ---------------------------------------------------------------------------------------------
# Expected-gradient flow
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epochs", [1, 4])
def test_flow_reward_increases_monotonically(epochs):
    frame = exact_flow(get_objective("ppo_clip"), "easy", steps=200, lr=2.0, epochs=epochs)
    assert list(frame.columns) == list(FLOW_COLUMNS) and len(frame) == 200
    assert frame["step"].tolist() == list(range(200))
    diffs = np.diff(frame["expected_reward"].to_numpy())
    assert (diffs > 0).all()
    assert frame["expected_reward"].iloc[-1] > 0.7  # converging to the best arm (0.8)
    if epochs > 1:  # the inner updates leave r = 1, so the clip acts
        assert frame["clip_low_frac"].max() + frame["clip_high_frac"].max() > 0
    else:
        assert (frame[["clip_low_frac", "clip_high_frac"]] == 0).all().all()


def test_flow_is_the_iterated_exact_gradient_and_deterministic():
    obj = get_objective("nsr")
    model = BanditModel(probs=[0.2, 0.5, 0.9, 0.4], model_seed=0)
    kw = {"steps": 3, "lr": 5.0, "epochs": 3, "advantage": "grpo", "group_size": 4}
    frame, z = exact_flow(obj, model, return_logits=True, **kw)
    again, z_again = exact_flow(obj, model, return_logits=True, **kw)
    pd.testing.assert_frame_equal(frame, again)
    assert torch.equal(z, z_again)
    manual = torch.zeros(4, dtype=F64)
    probs = torch.tensor(model.success_probs)
    for _ in range(3):
        old = manual
        for _ in range(3):
            manual = manual + 5.0 * bandit_gradient(
                obj, manual, old, probs, binary=True, advantage="grpo", group_size=4
            )
    torch.testing.assert_close(z, manual, rtol=0, atol=1e-14)


def test_flow_entropy_prediction_small_steps():
    frame = exact_flow(get_objective("ppo_clip"), "needle", steps=20, lr=0.05)
    actual, predicted = frame["delta_entropy"], frame["predicted_delta_entropy"]
    assert ((actual - predicted).abs() <= 1e-2 * actual.abs()).all()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_flow_contextual_and_gaussian(optimizer):
    lr = 0.5 if optimizer == "sgd" else 0.05
    frame = exact_flow(
        get_objective("dapo"),
        "mixed",
        steps=40,
        lr=lr,
        advantage="grpo",
        group_size=8,
        optimizer=optimizer,
    )
    assert len(frame) == 40 and frame.notna().all().all()
    assert frame["expected_reward"].iloc[0] == pytest.approx(0.44, abs=1e-12)  # mean pass rate
    assert frame["expected_reward"].iloc[-1] > frame["expected_reward"].iloc[0]
    frame = exact_flow(get_objective("sapo"), "gaussian", steps=40, lr=lr, optimizer=optimizer)
    assert frame["clip_low_frac"].isna().all()  # sapo has no dead zone
    assert frame["expected_reward"].iloc[-1] > frame["expected_reward"].iloc[0]


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_bad_input_names_the_argument():
    obj = get_objective("ppo_clip")
    z, p = torch.zeros(4, dtype=F64), torch.full((4,), 0.5, dtype=F64)
    with pytest.raises(ValueError, match="old_logits"):
        bandit_gradient(obj, z, torch.zeros(5, dtype=F64), p)
    with pytest.raises(ValueError, match="rewards"):
        bandit_gradient(obj, z, z, torch.zeros(3, dtype=F64))
    with pytest.raises(ValueError, match="logits contains NaN"):
        bandit_gradient(obj, torch.full((4,), math.nan), z, p)
    with pytest.raises(ValueError, match="population") as info:
        bandit_gradient(obj, z, z, p, advantage="gae")
    assert all(option in str(info.value) for option in ADVANTAGE_OPTIONS)
    with pytest.raises(ValueError, match="group_size"):
        bandit_gradient(obj, z, z, p, binary=True, advantage="grpo")
    with pytest.raises(ValueError, match="group_size"):
        bandit_gradient(obj, z, z, p, advantage="population", group_size=4)
    with pytest.raises(ValueError, match="binary"):
        bandit_gradient(obj, z, z, p, advantage="grpo", group_size=4)  # 0.5 is not a 0/1 reward
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        bandit_gradient(obj, z, z, p + 1, binary=True)
    with pytest.raises(ValueError, match="noise_std"):
        bandit_gradient(obj, z, z, p, binary=True, noise_std=1.0)
    with pytest.raises(ValueError, match="prompt_probs"):
        contextual_bandit_gradient(obj, z[None], z[None], p[None], torch.ones(2, dtype=F64))
    with pytest.raises(ValueError, match="optimizer"):
        exact_flow(obj, "easy", steps=2, lr=0.1, optimizer="rmsprop")
    with pytest.raises(ValueError, match="model"):
        exact_flow(obj, "no-such-setting", steps=2, lr=0.1)
    with pytest.raises(ValueError, match="steps"):
        exact_flow(obj, make_bandit_suite()["easy"], steps=0, lr=0.1)


@pytest.mark.parametrize("name", [n for n in available_objectives() if n not in EXACT_NAMES])
def test_objective_without_expected_coef_is_a_clear_error(name):
    z = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="expected_coef"):
        bandit_gradient(get_objective(name), z, z, torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="expected_coef"):
        bandit_gradient(lambda *a: None, z, z, torch.ones(3, dtype=F64))


def test_gaussian_rewards_need_a_homogeneous_coefficient():
    class NotHomogeneous(Objective):
        name = "not_homogeneous"

        def expected_coef(self, ratio, adv):
            return ratio * adv * adv.abs()  # coef(r, 2A) = 4 coef(r, A)

    z = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="proportional"):
        bandit_gradient(NotHomogeneous(), z, z, torch.arange(3.0), noise_std=1.0)
