"""Tests of the seed-vectorised bandit trainer (sandbox.train.bandit)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import envs
from sandbox.objectives import available_objectives, get_objective
from sandbox.train import (
    BanditTask,
    BanditTrainConfig,
    bandit_update,
    make_optimizer,
    sample_rollout,
    train_bandit,
)

SUITE = envs.make_bandit_suite()
CLIP_COLUMNS = ["clip_low_frac", "clip_high_frac"]


def model(name: str):
    return SUITE[name].make().unwrapped


def small_config(**overrides) -> BanditTrainConfig:
    kwargs = {"objective": "dapo", "seeds": 8, "steps": 20}
    return BanditTrainConfig(**{**kwargs, **overrides})


# --------------------------------------------------------------------------------------------------
# Output format and reproducibility
# --------------------------------------------------------------------------------------------------


def test_frame_has_one_row_per_step_and_seed_and_documented_columns():
    df = train_bandit(model("easy"), small_config(seeds=5, steps=7))
    assert len(df) == 35
    assert list(df[["step", "seed"]].drop_duplicates().itertuples(index=False)) == [
        (t, s) for t in range(7) for s in range(5)
    ]
    expected = {"reward", "expected_reward", "entropy", "grad_norm", "zero_var_frac"}
    expected |= {"ratio_mean", "ratio_max", "ratio_min", "kl_k3", *CLIP_COLUMNS}
    assert expected <= set(df.columns)
    assert df.attrs["objective"] == "ppo_clip"
    assert df.attrs["aggregation"] == "token-mean"  # the dapo preset's recommendation
    # Step 0 is the initial (uniform) policy: exact values by hand.
    first = df[df.step == 0]
    probs = np.array(SUITE["easy"].kwargs["probs"])
    np.testing.assert_allclose(first.expected_reward, probs.mean(), rtol=1e-6)
    np.testing.assert_allclose(first.entropy, math.log(10), rtol=1e-6)


def test_same_seed_identical_and_different_seeds_differ():
    cfg = small_config(objective="nsr_dapo", epochs=2, minibatches=2)  # uses the objective's RNG
    a = train_bandit(model("easy"), cfg)
    b = train_bandit(model("easy"), cfg)
    pd.testing.assert_frame_equal(a, b)
    c = train_bandit(model("easy"), small_config(objective="nsr_dapo", epochs=2, seed=1))
    assert not np.array_equal(a.expected_reward.to_numpy(), c.expected_reward.to_numpy())
    # Within one run, the seeds are distinct replicates.
    last = a[a.step == a.step.max()]
    assert last.expected_reward.nunique() > 1


@pytest.mark.parametrize("objective", available_objectives())
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_seed_updates_are_independent(objective, optimizer):
    """Changing seed 0's logits and batch leaves the other seeds' updates bit-identical."""
    task = BanditTask.from_model(model("easy"))
    gen = torch.Generator().manual_seed(0)
    base = task.initial_logits.expand(4, 1, 10) + torch.randn(4, 1, 10, generator=gen)
    rollout = sample_rollout(
        torch.log_softmax(base, -1),
        task,
        prompts_per_step=2,
        group_size=4,
        advantage="grpo",
        generator=gen,
    )
    obj = get_objective(objective)

    def update(logits0, rollout):
        logits = logits0.clone().requires_grad_(True)
        opt = make_optimizer(optimizer, [logits], lr=0.7)
        stats = bandit_update(
            logits,
            opt,
            obj,
            rollout,
            aggregation=obj.aggregation,
            epochs=2,
            minibatches=2,
            generator=torch.Generator().manual_seed(1),
        )
        return logits.detach(), stats

    after, _ = update(base, rollout)
    perturbed = base.clone()
    perturbed[0] += torch.linspace(-3, 3, 10)
    rollout.index[0] = rollout.index[0].flip(0)
    rollout.adv[0] = -3.0 * rollout.adv[0]
    rollout.logp_old[0] = rollout.logp_old[0] - 0.5
    after_perturbed, stats = update(perturbed, rollout)

    assert not torch.equal(after[0], after_perturbed[0])
    assert torch.equal(after[1:], after_perturbed[1:])
    assert all(torch.isfinite(v).all() for v in stats.as_dict().values())


# --------------------------------------------------------------------------------------------------
# Sampling matches the exact model
# --------------------------------------------------------------------------------------------------


def test_sampled_arms_follow_the_policy():
    task = BanditTask.from_model(model("easy"), dtype=torch.float64)
    pi = torch.softmax(torch.linspace(-2.0, 2.0, 10, dtype=torch.float64), 0)
    S, G = 4000, 8
    gen = torch.Generator().manual_seed(3)
    rollout = sample_rollout(
        pi.log().expand(S, 1, 10),
        task,
        prompts_per_step=1,
        group_size=G,
        advantage="grpo",
        generator=gen,
    )
    freq = torch.bincount(rollout.index.flatten(), minlength=10).double() / (S * G)
    sd = (pi * (1 - pi) / (S * G)).sqrt()
    assert ((freq - pi).abs() < 5 * sd).all(), (freq, pi)
    # Rewards are Bernoulli(p[a]): the sample mean is within 5 sd of sum_a pi(a) p(a).
    p = task.success_probs[0]
    mean = float(pi @ p)
    assert abs(rollout.rewards.mean().item() - mean) < 5 * math.sqrt(mean * (1 - mean) / (S * G))
    # GRPO advantages are zero-mean within each group.
    assert rollout.adv.view(S, 1, G).sum(-1).abs().max() < 1e-9


def test_contextual_sampling_covers_prompts_uniformly():
    m = model("mixed")
    task = BanditTask.from_model(m, dtype=torch.float64)
    S, Pb, G = 2000, 4, 2
    log_pi = torch.log_softmax(task.initial_logits, -1).expand(S, -1, -1)
    rollout = sample_rollout(
        log_pi,
        task,
        prompts_per_step=Pb,
        group_size=G,
        advantage="dr_grpo",
        generator=torch.Generator().manual_seed(0),
    )
    prompts = rollout.index.view(S, Pb, G) // m.num_arms
    assert (prompts == prompts[..., :1]).all()  # a group shares its prompt
    share = torch.bincount(prompts[..., 0].flatten(), minlength=8).double() / (S * Pb)
    assert (share - 1 / 8).abs().max() < 5 * math.sqrt(1 / 8 * 7 / 8 / (S * Pb))
    # Prompt 0 is unsolvable and prompt 7 always solved (pass rates 0 and 1).
    rewards = rollout.rewards.view(S, Pb, G)
    assert rewards[prompts == 0].sum() == 0 and (rewards[prompts == 7] == 1).all()


# --------------------------------------------------------------------------------------------------
# Learning
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["grpo", "nsr_dapo"])
def test_learns_on_easy(objective):
    df = train_bandit(model("easy"), small_config(objective=objective, seeds=32, steps=300))
    curve = df.groupby("step").expected_reward.mean()
    assert curve.iloc[0] == pytest.approx(0.35, abs=1e-6)  # uniform policy: mean of probs
    assert curve.iloc[-1] > 0.7  # best arm is 0.8
    assert df[df.step == df.step.max()].entropy.mean() < 0.5 * math.log(10)


@pytest.mark.parametrize("objective", ["grpo", "nsr_dapo"])
def test_learns_on_contextual_mixed(objective):
    cfg = small_config(objective=objective, seeds=32, steps=300, prompts_per_step=8)
    df = train_bandit(model("mixed"), cfg)
    curve = df.groupby("step").expected_reward.mean()
    assert curve.iloc[0] == pytest.approx(0.44, abs=1e-6)  # mean of the 8 pass rates
    assert curve.iloc[-1] > curve.iloc[0] + 0.15  # ceiling 7/8 (prompt 0 is unsolvable)


def test_gaussian_rewards_learn_with_adam():
    m = model("gaussian")
    cfg = small_config(objective="grpo", seeds=16, steps=200, optimizer="adam", lr=0.05)
    df = train_bandit(m, cfg)
    curve = df.groupby("step").expected_reward.mean()
    assert curve.iloc[-1] > curve.iloc[0] + 0.5 * (m.mean_rewards.max() - curve.iloc[0])


# --------------------------------------------------------------------------------------------------
# Clip fractions: exactly 0 on-policy, positive off-policy
# --------------------------------------------------------------------------------------------------


def test_on_policy_has_exact_unit_ratio_and_no_clipping():
    df = train_bandit(model("easy"), small_config(steps=30, lr=2.0))
    assert (df[CLIP_COLUMNS].to_numpy() == 0).all()
    assert (df[["ratio_mean", "ratio_max", "ratio_min"]].to_numpy() == 1).all()
    assert (df.kl_k3 == 0).all()


@pytest.mark.parametrize("epochs, minibatches", [(4, 1), (1, 4), (2, 2)])
def test_off_policy_updates_clip(epochs, minibatches):
    cfg = small_config(steps=30, lr=2.0, epochs=epochs, minibatches=minibatches)
    df = train_bandit(model("easy"), cfg)
    assert df.clip_high_frac.max() > 0 and df.clip_low_frac.max() > 0
    assert (df.ratio_max > 1).any() and (df.ratio_min < 1).any()


# --------------------------------------------------------------------------------------------------
# Every registered objective, every advantage method and aggregation mode run
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", available_objectives())
def test_every_objective_runs_with_finite_metrics(objective):
    for name in ("easy", "mixed"):
        cfg = small_config(objective=objective, seeds=3, steps=4, epochs=2, minibatches=2)
        df = train_bandit(model(name), cfg)
        assert len(df) == 12
        numeric = df.drop(columns=["step", "seed"]).to_numpy()
        assert np.isfinite(numeric).all(), df
        assert {"ratio_mean", "kl_k3"} <= set(df.columns)


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo", "batch_std", "none"])
@pytest.mark.parametrize("aggregation", ["seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_advantage_methods_and_aggregations_run(advantage, aggregation):
    cfg = small_config(steps=5, advantage=advantage, aggregation=aggregation, dtype="float64")
    df = train_bandit(model("needle"), cfg)
    assert np.isfinite(df.drop(columns=["step", "seed"]).to_numpy()).all()
    assert df.attrs["aggregation"] == aggregation


def test_callback_sees_every_step():
    seen = []
    train_bandit(model("mixed"), small_config(steps=3, seeds=2), callback=seen.append)
    assert [s.step for s in seen] == [0, 1, 2]
    assert seen[-1].logits.shape == (2, 8, 16)
    assert seen[-1].rollout.index.shape == (2, 8)


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", 0),
        ("seeds", 0),
        ("group_size", 1),  # grpo advantage needs a group
        ("optimizer", "rmsprop"),
        ("objective", "no_such_objective"),
        ("objective_params", {"eps_low": -1.0}),
        ("lr", 0.0),
        ("minibatches", 3),  # does not divide P' * G = 8
        ("epochs", 0),
        ("advantage", "gae"),
        ("aggregation", "sum"),
        ("dtype", "float16"),
    ],
)
def test_bad_config_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        small_config(**{field: value})


def test_bad_model_raises():
    with pytest.raises(ValueError, match="model"):
        train_bandit(np.zeros(3), small_config())


def test_package_docstring_example_runs():
    import doctest

    import sandbox.train

    assert doctest.testmod(sandbox.train).failed == 0


# --------------------------------------------------------------------------------------------------
# The off-policy mask (sandbox.masks through PolicyLoss)
# --------------------------------------------------------------------------------------------------


def test_off_policy_mask_binds_only_off_policy():
    """On-policy the mean KL of every sample is 0 <= delta: the run is the unmasked run exactly.
    With 4 epochs at lr 2 negative-advantage arms fall past e^-0.05 and are dropped."""
    plain = train_bandit(model("easy"), small_config(steps=10, lr=2.0))
    on = train_bandit(model("easy"), small_config(steps=10, lr=2.0, off_policy_mask=0.05))
    pd.testing.assert_frame_equal(on.drop(columns="off_policy_masked_frac"), plain)
    assert (on["off_policy_masked_frac"] == 0).all()
    cfg = {"steps": 10, "lr": 2.0, "epochs": 4}
    off = train_bandit(model("easy"), small_config(**cfg, off_policy_mask=0.05))
    off_plain = train_bandit(model("easy"), small_config(**cfg))
    assert off["off_policy_masked_frac"].between(0, 0.5).all()  # only A < 0 can be dropped
    assert off["off_policy_masked_frac"].max() > 0
    assert not np.allclose(off["expected_reward"], off_plain["expected_reward"])


def test_off_policy_mask_with_a_per_seed_objective():
    """clip_cov's metrics are per seed ([S]), the mask's pooled (0-d): both become columns."""
    cfg = small_config(objective="clip_cov", seeds=3, steps=3, epochs=2, off_policy_mask=0.01)
    df = train_bandit(model("easy"), cfg)
    assert "off_policy_masked_frac" in df
    assert np.isfinite(df.drop(columns=["step", "seed"]).to_numpy()).all()


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), True])
def test_bad_off_policy_mask_raises_naming_it(value):
    with pytest.raises(ValueError, match="off_policy_mask"):
        small_config(off_policy_mask=value)


# --------------------------------------------------------------------------------------------------
# Rules trained together (run_bandits)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["needle", "mixed"])
def test_rules_trained_together_equal_their_own_runs_bit_for_bit(setting):
    """run_bandits keeps each run's random streams: the rules of base seed 0 share its rollout
    and minibatch streams, nsr_dapo (rescue noise) and clip_cov (ranking keys, per-seed metrics)
    draw their objective noise at their own keys, grpo with seed 1 has streams of its own;
    minibatches and epochs make the seeds' shuffles differ. Every frame and final logits equal
    the config's own run_bandit exactly."""
    from sandbox.train.bandit import run_bandit, run_bandits

    rules = [("dapo", 0), ("nsr_dapo", 0), ("clip_cov", 0), ("grpo", 1), ("gspo", 0)]
    cfg = {
        "seeds": 3,
        "steps": 6,
        "prompts_per_step": 2,
        "epochs": 2,
        "minibatches": 2,
        "entropy_law": True,
    }
    configs = [small_config(objective=o, seed=s, **cfg) for o, s in rules]
    together = run_bandits(model(setting), configs)
    for config, run in zip(configs, together, strict=True):
        alone = run_bandit(model(setting), config)
        assert run.objective == alone.objective and run.aggregation == alone.aggregation
        pd.testing.assert_frame_equal(run.to_frame(), alone.to_frame(), check_exact=True)
        assert torch.equal(run.logits, alone.logits)
    assert not together[0].to_frame().equals(together[1].to_frame())  # the rules do differ


def test_rules_trained_together_must_share_the_training_fields():
    from sandbox.train.bandit import run_bandits

    with pytest.raises(ValueError, match=r"configs: .* these differ: \['lr'\]"):
        run_bandits(model("easy"), [small_config(), small_config(objective="grpo", lr=0.1)])
    with pytest.raises(ValueError, match="configs must hold at least one"):
        run_bandits(model("easy"), [])
    with pytest.raises(ValueError, match="grad_noise"):
        run_bandits(model("easy"), [small_config(objective="nsr", grad_noise=True)] * 2)
