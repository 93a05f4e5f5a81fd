"""Tests for envs.bandit: the gymnasium contract (every registered id) and the exact models."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.bandit import (
    BanditModel,
    ContextualBandit,
    ContextualBanditModel,
    SoftmaxBandit,
    make_bandit_suite,
)

SUITE = make_bandit_suite()


def _rollout(env: gym.Env, seed: int, num_steps: int) -> tuple[list, list]:
    """Observations and rewards of ``num_steps`` one-step episodes with seeded random actions."""
    env.action_space.seed(seed)
    observations, rewards = [], []
    obs, _ = env.reset(seed=seed)
    for _ in range(num_steps):
        observations.append(obs)
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        rewards.append(reward)
        if terminated or truncated:
            obs, _ = env.reset()
    return observations, rewards


def _make_vec(env_id: str, num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    return gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
    )


# ------------------------------------------------------------------------------------------
# every registered id
# ------------------------------------------------------------------------------------------


def test_registration_is_idempotent_and_complete():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # re-registering would warn "Overriding environment"
        importlib.reload(envs)
    assert envs.BANDIT_ENV_IDS == ("sandbox/SoftmaxBandit-v0", "sandbox/ContextualBandit-v0")
    for env_id in envs.ENV_IDS:
        spec = gym.spec(env_id)
        assert spec.namespace == "sandbox"
        assert spec.vector_entry_point is not None


@pytest.mark.parametrize("env_id", envs.ENV_IDS)
def test_check_env_passes_without_warnings(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


@pytest.mark.parametrize("env_id", envs.BANDIT_ENV_IDS)
def test_one_step_episodes_return_python_bools(env_id):
    env = gym.make(env_id)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert terminated is True and truncated is False
    assert isinstance(reward, float)
    assert isinstance(info["expected_reward"], float)


@pytest.mark.parametrize("env_id", envs.BANDIT_ENV_IDS)
def test_same_seed_same_trajectory_and_different_seeds_differ(env_id):
    env = gym.make(env_id)
    obs_a, rewards_a = _rollout(env, seed=7, num_steps=200)
    obs_b, rewards_b = _rollout(env, seed=7, num_steps=200)
    _, rewards_c = _rollout(env, seed=8, num_steps=200)
    assert rewards_a == rewards_b and obs_a == obs_b
    assert rewards_a != rewards_c


@pytest.mark.parametrize("env_id", envs.BANDIT_ENV_IDS)
def test_vector_env_shapes_spaces_and_autoreset(env_id):
    num_envs = 64
    single = gym.make(env_id)
    vec = _make_vec(env_id, num_envs)
    assert vec.num_envs == num_envs
    assert vec.single_action_space == single.action_space
    assert vec.single_observation_space == single.observation_space
    assert vec.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP

    obs, info = vec.reset(seed=0)
    assert obs.shape == (num_envs,) and obs.dtype == np.int64
    assert obs in vec.observation_space and info == {}
    vec.action_space.seed(0)
    actions = vec.action_space.sample()
    next_obs, rewards, terminations, truncations, info = vec.step(actions)
    assert next_obs.shape == rewards.shape == terminations.shape == truncations.shape
    assert next_obs in vec.observation_space
    assert rewards.dtype == np.float64 and terminations.all() and not truncations.any()
    # SAME_STEP: the observations the actions were taken in come back as final_obs
    np.testing.assert_array_equal(info["final_obs"].astype(np.int64), obs)
    assert info["_final_obs"].all() and info["_final_info"].all()
    expected = np.atleast_2d(vec.unwrapped.mean_rewards)[obs, actions]
    np.testing.assert_array_equal(info["final_info"]["expected_reward"], expected)


@pytest.mark.parametrize("env_id", envs.BANDIT_ENV_IDS)
def test_vector_env_is_seeded_deterministic(env_id):
    def run(seed: int) -> tuple[np.ndarray, np.ndarray]:
        vec = _make_vec(env_id, 256)
        vec.action_space.seed(seed)
        observations, rewards = [vec.reset(seed=seed)[0]], []
        for _ in range(3):
            obs, reward, *_ = vec.step(vec.action_space.sample())
            observations.append(obs)
            rewards.append(reward)
        return np.stack(observations), np.stack(rewards)

    obs_a, rewards_a = run(3)
    obs_b, rewards_b = run(3)
    _, rewards_c = run(4)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rewards_a, rewards_b)
    assert not np.array_equal(rewards_a, rewards_c)


@pytest.mark.parametrize("env_id", envs.BANDIT_ENV_IDS)
def test_vector_env_matches_record_episode_statistics(env_id):
    vec = gym.wrappers.vector.RecordEpisodeStatistics(_make_vec(env_id, 8))
    vec.reset(seed=0)
    _, rewards, *_, info = vec.step(np.zeros(8, dtype=np.int64))
    # every episode is one step long and its return is the step's reward
    np.testing.assert_array_equal(info["episode"]["l"], np.ones(8))
    np.testing.assert_array_equal(info["episode"]["r"], rewards)


# ------------------------------------------------------------------------------------------
# exact models vs sampled rewards
# ------------------------------------------------------------------------------------------


def _assert_monte_carlo_matches(rewards, groups, mean, variance):
    """Per group, the sample mean lies within 5 CLT standard errors of the exact mean."""
    counts = np.bincount(groups, minlength=mean.size)
    sums = np.bincount(groups, weights=rewards, minlength=mean.size)
    seen = counts > 0
    sample_mean = sums[seen] / counts[seen]
    tolerance = 5.0 * np.sqrt(variance[seen] / counts[seen]) + 1e-12
    assert np.all(np.abs(sample_mean - mean[seen]) <= tolerance), (
        sample_mean - mean[seen],
        tolerance,
    )


@pytest.mark.parametrize("name", sorted(SUITE))
def test_vector_env_rewards_match_exact_model(name):
    setting = SUITE[name]
    vec = setting.make_vec(num_envs=20_000)
    model = vec.unwrapped
    num_arms = model.num_arms
    obs, _ = vec.reset(seed=1)
    actions = np.arange(vec.num_envs, dtype=np.int64) % num_arms
    _, rewards, *_ = vec.step(actions)
    mean = np.atleast_2d(model.mean_rewards).ravel()
    variance = np.atleast_2d(model.reward_variance).ravel()
    groups = obs * num_arms + actions
    assert np.bincount(groups, minlength=mean.size).min() > 0  # every (obs, arm) was sampled
    _assert_monte_carlo_matches(rewards, groups, mean, variance)


@pytest.mark.parametrize("env_id", envs.BANDIT_ENV_IDS)
def test_single_env_rewards_match_exact_model(env_id):
    env = gym.make(env_id)
    model = env.unwrapped
    num_arms = model.num_arms
    obs_list, rewards = _rollout(env, seed=5, num_steps=2000)
    env.action_space.seed(5)
    actions = np.array([env.action_space.sample() for _ in range(2000)])
    groups = np.array(obs_list) * num_arms + actions
    mean = np.atleast_2d(model.mean_rewards).ravel()
    variance = np.atleast_2d(model.reward_variance).ravel()
    _assert_monte_carlo_matches(np.array(rewards), groups, mean, variance)


def test_sample_rewards_any_shape_and_uses_one_uniform_per_element():
    model = BanditModel(**SUITE["easy"].kwargs)
    actions = np.random.default_rng(0).integers(10, size=(4, 3, 5))
    rewards = model.sample_rewards(actions, np.random.default_rng(123))
    uniforms = np.random.default_rng(123).random((4, 3, 5))
    assert rewards.shape == (4, 3, 5) and rewards.dtype == np.float64
    np.testing.assert_array_equal(rewards, uniforms < model.success_probs[actions])


def test_contextual_sample_rewards_broadcasts_prompts_over_samples():
    model = ContextualBanditModel(**SUITE["mixed"].kwargs)
    prompts = np.arange(8)[:, None]  # [S, 1]
    actions = np.broadcast_to(np.arange(16), (8, 16))  # [S, G]: every arm once per prompt
    rewards = model.sample_rewards(prompts, actions, np.random.default_rng(0))
    # pass_rates construction: rewards are deterministic, so the sample is the table itself
    np.testing.assert_array_equal(rewards, model.success_probs)


def test_gaussian_rewards_are_mean_plus_scaled_normal():
    model = BanditModel(reward="gaussian", means=[1.0, -2.0, 0.5], noise_std=0.3)
    actions = np.array([[0, 1], [2, 0]])
    rewards = model.sample_rewards(actions, np.random.default_rng(9))
    normals = np.random.default_rng(9).standard_normal((2, 2))
    np.testing.assert_allclose(rewards, np.array([[1.0, -2.0], [0.5, 1.0]]) + 0.3 * normals)
    assert model.success_probs is None and model.reward_table is None and not model.is_binary
    np.testing.assert_allclose(model.reward_variance, [0.09, 0.09, 0.09])


def test_bernoulli_exact_model_tables():
    env = SoftmaxBandit(probs=[0.25, 0.5, 1.0])
    np.testing.assert_array_equal(env.success_probs, [0.25, 0.5, 1.0])
    np.testing.assert_array_equal(env.mean_rewards, env.success_probs)
    np.testing.assert_array_equal(env.reward_values, [0.0, 1.0])
    np.testing.assert_array_equal(env.reward_table, [[0.75, 0.25], [0.5, 0.5], [0.0, 1.0]])
    np.testing.assert_array_equal(env.reward_variance, [0.1875, 0.25, 0.0])
    np.testing.assert_array_equal(env.initial_logits, np.zeros(3))
    # uniform initial policy: (0.25 + 0.5 + 1) / 3
    assert env.initial_expected_reward == pytest.approx(1.75 / 3, abs=1e-15)
    with pytest.raises(ValueError, match="read-only"):
        env.success_probs[0] = 0.0


def test_needle_model_and_initial_policy():
    env = SUITE["needle"].make().unwrapped
    assert env.num_arms == 100 and env.is_binary and env.correct_arms.shape == (1,)
    needle = int(env.correct_arms[0])
    expected_success = np.zeros(100)
    expected_success[needle] = 1.0
    np.testing.assert_array_equal(env.success_probs, expected_success)
    np.testing.assert_array_equal(env.initial_logits, -2.0 * expected_success)
    # pi0(needle) = e^-2 / (e^-2 + 99)
    assert env.initial_expected_reward == pytest.approx(
        np.exp(-2.0) / (np.exp(-2.0) + 99.0), rel=1e-12
    )
    env.reset(seed=0)
    assert env.step(needle)[1] == 1.0
    assert env.step((needle + 1) % 100)[1] == 0.0
    explicit = SoftmaxBandit(reward="needle", num_arms=5, correct_arms=[3, 1], needle_gap=1.0)
    np.testing.assert_array_equal(explicit.correct_arms, [1, 3])
    np.testing.assert_array_equal(explicit.initial_logits, [0.0, -1.0, 0.0, -1.0, 0.0])


def test_model_is_fixed_by_model_seed_not_reset_seed():
    a = SoftmaxBandit(num_arms=6, model_seed=3)
    b = SoftmaxBandit(num_arms=6, model_seed=3)
    c = SoftmaxBandit(num_arms=6, model_seed=4)
    a.reset(seed=0)
    b.reset(seed=99)
    np.testing.assert_array_equal(a.success_probs, b.success_probs)
    assert not np.array_equal(a.success_probs, c.success_probs)


def test_contextual_pass_rate_construction_is_exact():
    rates = [0.0, 0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]
    model = ContextualBanditModel(pass_rates=rates, num_arms=16)
    assert model.success_probs.shape == model.initial_logits.shape == (8, 16)
    np.testing.assert_allclose(model.initial_expected_reward, rates, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(model.prompt_probs, np.full(8, 1 / 8))
    # default c = clip(round(r K), 1, K - 1) correct arms: 0, 1, 2, 4, 8, 12, 14, 16
    np.testing.assert_array_equal(model.success_probs.sum(axis=1), [0, 1, 2, 4, 8, 12, 14, 16])
    # r K is an integer for r = 0.25 and 0.5, so those prompts start from the uniform policy
    np.testing.assert_array_equal(model.initial_logits[[3, 4]], np.zeros((2, 16)))
    # r = 0.02, one correct arm: g = log(0.02 * 15 / 0.98)
    correct = model.success_probs[1] == 1.0
    np.testing.assert_allclose(model.initial_logits[1, correct], np.log(0.3 / 0.98), rtol=1e-14)
    np.testing.assert_array_equal(model.initial_logits[1, ~correct], 0.0)
    # a fixed number of correct arms per prompt still gives the exact pass rates
    fixed = ContextualBanditModel(pass_rates=[0.3, 0.6], num_arms=5, num_correct=2)
    np.testing.assert_array_equal(fixed.success_probs.sum(axis=1), [2, 2])
    np.testing.assert_allclose(fixed.initial_expected_reward, [0.3, 0.6], rtol=1e-13)


def test_contextual_reset_samples_prompts_uniformly_and_accepts_a_prompt():
    env = ContextualBandit(pass_rates=[0.1, 0.5, 0.9, 0.3], num_arms=4)
    counts = np.bincount([env.reset(seed=s)[0] for s in range(4000)], minlength=4)
    # Binomial(4000, 1/4): standard deviation sqrt(4000 * 3/16) ~ 27.4
    assert np.all(np.abs(counts - 1000) <= 5 * np.sqrt(4000 * 3 / 16))
    assert env.reset(seed=0, options={"prompt": 2})[0] == 2
    obs, _, _, _, info = env.step(1)
    assert obs == 2 and info["expected_reward"] == env.success_probs[2, 1]


def test_contextual_vector_reset_accepts_prompts():
    vec = _make_vec("sandbox/ContextualBandit-v0", 3, pass_rates=[0.2, 0.8])
    obs, _ = vec.reset(seed=0, options={"prompts": np.array([1, 0, 1])})
    np.testing.assert_array_equal(obs, [1, 0, 1])


def test_explicit_success_probs_table():
    table = [[0.0, 0.5, 1.0], [0.2, 0.2, 0.2]]
    model = ContextualBanditModel(
        success_probs=table, initial_logits=np.log([[1, 1, 2], [1, 2, 1]])
    )
    np.testing.assert_array_equal(model.success_probs, table)
    # softmax weights (1/4, 1/4, 1/2) and (1/4, 1/2, 1/4)
    np.testing.assert_allclose(model.initial_expected_reward, [0.625, 0.2], rtol=1e-14)


def test_suite_settings_build():
    assert {"easy", "needle", "mixed"} <= set(SUITE)
    easy = SUITE["easy"].make().unwrapped
    assert easy.num_arms == 10 and int(np.argmax(easy.mean_rewards)) == 4
    assert easy.mean_rewards[4] - np.sort(easy.mean_rewards)[-2] == pytest.approx(0.3)


# ------------------------------------------------------------------------------------------
# invalid arguments
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"num_arms": 1}, "num_arms"),
        ({"reward": "poisson"}, "reward"),
        ({"probs": [0.5, 1.5]}, "probs"),
        ({"probs": [0.5, -0.1, 0.2]}, "probs"),
        ({"probs": [0.5, float("nan")]}, "probs"),
        ({"probs": [0.5, 0.2, 0.1], "num_arms": 4}, "probs"),
        ({"probs": [[0.5, 0.2]]}, "probs"),
        ({"probs": [0.5]}, "num_arms"),
        ({"reward": "needle", "num_arms": 5, "num_correct": 5}, "num_correct"),
        ({"reward": "needle", "num_arms": 5, "num_correct": 0}, "num_correct"),
        ({"reward": "needle", "num_arms": 5, "correct_arms": [5]}, "correct_arms"),
        ({"reward": "needle", "num_arms": 5, "correct_arms": [1, 1]}, "correct_arms"),
        ({"reward": "needle", "needle_gap": -1.0}, "needle_gap"),
        ({"reward": "needle", "needle_gap": 1.0, "initial_logits": [0.0] * 10}, "needle_gap"),
        ({"reward": "gaussian", "noise_std": -1.0}, "noise_std"),
        ({"reward": "gaussian", "means": [0.0, 1.0], "num_arms": 3}, "means"),
        ({"reward": "gaussian", "probs": [0.5, 0.5]}, "probs"),
        ({"noise_std": 1.0}, "noise_std"),
        ({"num_arms": 3, "initial_logits": [0.0, 1.0]}, "initial_logits"),
        ({"render_mode": "human"}, "render_mode"),
    ],
)
def test_softmax_bandit_invalid_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SoftmaxBandit(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"pass_rates": [0.5, 1.2]}, "pass_rates"),
        ({"pass_rates": []}, "pass_rates"),
        ({"pass_rates": [0.5], "num_prompts": 2}, "pass_rates"),
        ({"pass_rates": [0.5], "num_arms": 1}, "num_arms"),
        ({"pass_rates": [0.5], "num_arms": 4, "num_correct": 4}, "num_correct"),
        ({"pass_rates": [0.5], "success_probs": [[0.5, 0.5]]}, "success_probs"),
        ({"success_probs": [0.5, 0.5]}, "success_probs"),
        ({"success_probs": [[0.5, 2.0]]}, "success_probs"),
        ({"success_probs": [[0.5, 0.5]], "initial_logits": [[0.0]]}, "initial_logits"),
        ({"pass_rates": [0.5], "initial_logits": [[0.0, 0.0]]}, "initial_logits"),
        ({"num_prompts": 0}, "num_prompts"),
    ],
)
def test_contextual_bandit_invalid_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        ContextualBandit(**kwargs)


def test_invalid_actions_prompts_and_num_envs():
    env = SoftmaxBandit(num_arms=3)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(3)
    with pytest.raises(ValueError, match="actions"):
        env.sample_rewards(np.array([0.0, 1.0]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="actions"):
        env.sample_rewards(np.array([0, -1]), np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        env.sample_rewards(np.array([0, 1]), 0)
    model = ContextualBanditModel(pass_rates=[0.5, 0.5], num_arms=3)
    with pytest.raises(ValueError, match="prompts"):
        model.sample_rewards(np.array([2]), np.array([0]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="broadcast"):
        model.sample_rewards(np.zeros(2, int), np.zeros(3, int), np.random.default_rng(0))
    with pytest.raises(ValueError, match="prompt"):
        ContextualBandit(pass_rates=[0.5]).reset(options={"prompt": 1})
    with pytest.raises(ValueError, match="num_envs"):
        _make_vec("sandbox/SoftmaxBandit-v0", 0)
    vec = _make_vec("sandbox/SoftmaxBandit-v0", 4)
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="actions"):
        vec.step(np.zeros(5, dtype=np.int64))


def test_envs_imports_neither_sandbox_nor_llm():
    code = "import sys, envs; print(sorted({'sandbox', 'llm'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
