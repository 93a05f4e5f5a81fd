"""envs.reasoning.token_env: the token-level envs of every registered task (rewards only at the
end, length limit, seeding, reset options, the vector env's autoreset), the ids and classes
derived from the task registry (a throwaway task registered here), and the ``bits`` env's
observations against the enumerated prompts. ``check_env`` runs over every registered id, these
included, in ``test_envs_bandit.py``."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from test_envs_reasoning_tasks import TASKS, wrong_completions

import envs
from envs.reasoning import (
    ReasoningTask,
    ReasoningTokenEnv,
    ReasoningTokenVectorEnv,
    available_tasks,
    register_task,
    task_env_id,
    token_env,
    unregister_task,
)


def _play(env: gym.Env, tokens: list[int]) -> tuple[float, dict, int]:
    """Steps ``tokens`` until the episode ends; (final reward, final info, steps taken)."""
    for step, token in enumerate(tokens, start=1):
        _, reward, terminated, truncated, info = env.step(token)
        assert truncated is False
        if terminated:
            return reward, info, step
        assert reward == 0.0 and info == {}
    raise AssertionError("the episode did not end")


def _make_vec(env_id: str, num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    return gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
    )


# ------------------------------------------------------------------------------------------
# every registered id
# ------------------------------------------------------------------------------------------


def test_reasoning_ids_are_registered_once_per_task():
    tasks = {gym.make(env_id).unwrapped.task.name for env_id in envs.REASONING_ENV_IDS}
    assert tasks == set(TASKS) and len(envs.REASONING_ENV_IDS) == len(TASKS)
    assert set(envs.REASONING_ENV_IDS) | set(envs.BANDIT_ENV_IDS) == set(envs.ENV_IDS)
    for env_id in envs.REASONING_ENV_IDS:
        assert gym.spec(env_id).namespace == "sandbox"


# ------------------------------------------------------------------------------------------
# ids and classes derived from the task registry
# ------------------------------------------------------------------------------------------


class _RepeatDigitTask(ReasoningTask):
    """A throwaway task: ``Repeat 7. Answer:`` -> ``"7"``."""

    answer_kind = "integer"
    answer_chars = "0123456789"
    max_prompt_len = len("Repeat 7. Answer:")
    max_answer_len = 1

    def _sample(self, rng):
        digit = str(int(rng.integers(10)))
        return f"Repeat {digit}. Answer:", digit


def test_registering_a_task_is_all_it_takes_for_its_env_ids():
    env_id = "sandbox/Reasoning-RepeatDigit-v0"
    assert env_id not in gym.registry
    register_task("repeat_digit")(_RepeatDigitTask)
    try:
        assert task_env_id("repeat_digit") == env_id
        assert env_id in envs.REASONING_ENV_IDS and env_id in envs.ENV_IDS
        env = gym.make(env_id)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            check_env(env.unwrapped)
        assert type(env.unwrapped) is token_env.RepeatDigitTokenEnv
        assert type(env.unwrapped).__name__ == "RepeatDigitTokenEnv"
        _, info = env.reset(seed=0)
        digit = info["answer"]
        assert info["prompt"] == f"Repeat {digit}. Answer:"
        assert _play(env, env.unwrapped.tokenizer.encode(digit, add_eos=True))[0] == 1.0
        vec = _make_vec(env_id, 3)
        assert type(vec.unwrapped) is token_env.task_env_class("repeat_digit", vector=True)
        _, info = vec.reset(seed=1)
        digits = vec.unwrapped.tokenizer.encode("".join(info["answer"]))
        _, rewards, terminations, _, _ = vec.step(np.array(digits))
        np.testing.assert_array_equal(terminations, False)  # room for "<digit><eos>"
        _, rewards, terminations, _, _ = vec.step(np.full(3, vec.unwrapped.tokenizer.eos_id))
        np.testing.assert_array_equal(rewards, 1.0)
        np.testing.assert_array_equal(terminations, True)
    finally:
        unregister_task("repeat_digit")
    assert "repeat_digit" not in available_tasks() and env_id not in gym.registry
    assert env_id not in envs.ENV_IDS
    with pytest.raises(AttributeError, match="RepeatDigitTokenEnv"):
        token_env.RepeatDigitTokenEnv  # noqa: B018 - the lookup is what is tested
    with pytest.raises(ValueError, match="unknown task 'repeat_digit'"):
        token_env.task_env_class("repeat_digit")


def test_per_task_env_classes_keep_their_names_and_pickle():
    from envs.reasoning.token_env import BitsTokenVectorEnv, ModArithTokenEnv

    env = gym.make("sandbox/Reasoning-ModArith-v0", steps=3).unwrapped
    assert type(env) is ModArithTokenEnv and env.task.knobs["steps"] == 3
    assert (
        issubclass(ModArithTokenEnv, ReasoningTokenEnv)
        and ModArithTokenEnv.task_name == "mod_arith"
    )
    assert BitsTokenVectorEnv.task_name == "bits"
    assert issubclass(BitsTokenVectorEnv, ReasoningTokenVectorEnv)
    assert {"ModArithTokenEnv", "BitsTokenVectorEnv"} <= set(dir(token_env))
    env.reset(seed=4)
    copy = pickle.loads(pickle.dumps(env))
    assert type(copy) is ModArithTokenEnv and copy.prompt == env.prompt


# ------------------------------------------------------------------------------------------
# single and vector envs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", envs.REASONING_ENV_IDS)
def test_token_env_rewards_the_answer_and_only_at_the_end(env_id):
    env = gym.make(env_id)
    task, tok = env.unwrapped.task, env.unwrapped.tokenizer
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        assert obs in env.observation_space
        prompt_ids = task.encode_prompt(info["prompt"])
        assert obs["prompt_length"] == obs["length"] == len(prompt_ids)
        np.testing.assert_array_equal(obs["tokens"][: len(prompt_ids)], prompt_ids)
        assert np.all(obs["tokens"][len(prompt_ids) :] == tok.pad_id)
        target = [*tok.encode(task.format_completion(info["answer"])), tok.eos_id]
        reward, final, steps = _play(env, target)
        assert (reward, steps, final["eos"]) == (1.0, len(target), True)
        assert final["completion"] == task.format_completion(info["answer"])

        env.reset(seed=seed)
        wrong = wrong_completions(task, info["answer"])[0]
        reward, final, _ = _play(env, [*tok.encode(wrong), tok.eos_id])
        assert reward == 0.0


@pytest.mark.parametrize("env_id", envs.REASONING_ENV_IDS)
def test_token_env_ends_at_the_length_limit_and_is_seeded(env_id):
    env = gym.make(env_id, max_completion_len=3)
    zero = env.unwrapped.tokenizer.token_to_id["0"]
    env.reset(seed=0)
    _, final, steps = _play(env, [zero] * 3)
    assert steps == 3 and final["eos"] is False and final["completion"] == "000"
    with pytest.raises(RuntimeError, match="reset"):
        env.step(zero)

    prompts = [env.reset(seed=s)[1]["prompt"] for s in (11, 11, 12, 13, 14, 15)]
    assert prompts[0] == prompts[1] and len(set(prompts[1:])) > 1
    first, _ = env.reset(seed=21)
    again, _ = env.reset(seed=21)
    np.testing.assert_array_equal(first["tokens"], again["tokens"])


def test_token_env_reset_options_and_argument_errors():
    env = ReasoningTokenEnv("addition", digits=2)
    _, info = env.reset(options={"prompt": "Compute 12 + 30. Answer:", "answer": "42"})
    assert info["answer"] == "42" and env.prompt == "Compute 12 + 30. Answer:"
    assert _play(env, env.tokenizer.encode("42", add_eos=True))[0] == 1.0
    with pytest.raises(ValueError, match="options"):
        env.reset(options={"prompt": "Compute 1 + 2. Answer:"})
    with pytest.raises(ValueError, match="options"):
        env.reset(options={"seed": 1})
    with pytest.raises(ValueError, match="options"):
        env.reset(options={"prompt": "x" * 100, "answer": "1"})
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(env.tokenizer.vocab_size)
    with pytest.raises(ValueError, match="max_completion_len"):
        ReasoningTokenEnv("addition", max_completion_len=0)
    with pytest.raises(ValueError, match="render_mode"):
        ReasoningTokenEnv("addition", render_mode="human")
    with pytest.raises(ValueError, match="digit"):
        gym.make("sandbox/Reasoning-Addition-v0", digit=3)
    with pytest.raises(ValueError, match="task"):
        gym.make("sandbox/Reasoning-Addition-v0", task="parity")
    with pytest.raises(ValueError, match="available tasks"):
        ReasoningTokenEnv("nope")
    with pytest.raises(RuntimeError, match="reset"):
        ReasoningTokenEnv("addition").step(3)
    knobbed = gym.make("sandbox/Reasoning-Sequence-v0", op="sort", length=7, max_completion_len=20)
    assert knobbed.unwrapped.task.knobs == {"op": "sort", "length": 7, "alphabet": "digits"}
    assert knobbed.observation_space["tokens"].shape == (knobbed.unwrapped.max_prompt_tokens + 20,)


@pytest.mark.parametrize("env_id", envs.REASONING_ENV_IDS)
def test_vector_env_plays_correct_answers_and_autoresets(env_id):
    num_envs = 16
    vec = _make_vec(env_id, num_envs)
    task, tok = vec.unwrapped.task, vec.unwrapped.tokenizer
    obs, info = vec.reset(seed=0)
    assert obs in vec.observation_space and obs["tokens"].shape == (
        num_envs,
        vec.unwrapped.max_length,
    )
    # env 0 draws the same first problem as the single env with the same seed
    assert info["prompt"][0] == gym.make(env_id).reset(seed=0)[1]["prompt"]
    targets = [
        [*tok.encode(task.format_completion(answer)), tok.eos_id] for answer in info["answer"]
    ]
    ended_at = np.full(num_envs, -1)
    for t in range(max(len(target) for target in targets)):
        actions = np.array([target[min(t, len(target) - 1)] for target in targets])
        obs, rewards, terminations, truncations, step_info = vec.step(actions)
        assert obs in vec.observation_space and not truncations.any()
        finishing = np.array([len(target) - 1 == t for target in targets])
        np.testing.assert_array_equal(terminations[finishing], True)
        np.testing.assert_array_equal(rewards[finishing], 1.0)
        np.testing.assert_array_equal(rewards[~terminations], 0.0)
        for i in np.flatnonzero(finishing):
            ended_at[i] = t
            assert step_info["final_info"]["answer"][i] == info["answer"][i]
            final_obs = step_info["final_obs"][i]
            assert final_obs["length"] == final_obs["prompt_length"] + len(targets[i])
            assert obs["length"][i] == obs["prompt_length"][i]  # a fresh problem
            assert step_info["_prompt"][i]
    assert (ended_at >= 0).all()


@pytest.mark.parametrize("env_id", envs.REASONING_ENV_IDS)
def test_vector_env_is_seeded_deterministic(env_id):
    def run(seed: int) -> tuple[list, np.ndarray]:
        vec = _make_vec(env_id, 8, max_completion_len=2)
        vec.action_space.seed(seed)
        obs, info = vec.reset(seed=seed)
        tokens = [obs["tokens"]]
        for _ in range(4):
            obs, *_ = vec.step(vec.action_space.sample())
            tokens.append(obs["tokens"])
        return list(info["prompt"]), np.stack(tokens)

    prompts_a, tokens_a = run(3)
    prompts_b, tokens_b = run(3)
    _, tokens_c = run(4)
    assert prompts_a == prompts_b
    np.testing.assert_array_equal(tokens_a, tokens_b)
    assert not np.array_equal(tokens_a, tokens_c)


# ------------------------------------------------------------------------------------------
# the enumerable task's env
# ------------------------------------------------------------------------------------------


def test_bits_env_observations_are_enumerated_prompts():
    env = gym.make("sandbox/Reasoning-Bits-v0", op="parity", length=3)
    task = env.unwrapped.task
    assert env.action_space == gym.spaces.Discrete(5)
    assert env.unwrapped.max_completion_len == 2  # answer + <eos>
    prompts = set(task.enumerate_prompts())
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        prompt = tuple(obs["tokens"][: obs["prompt_length"]].tolist())
        assert prompt in prompts
        target = [*task.answer_ids(prompt), task.tokenizer.eos_id]
        assert _play(env, target)[0] == task.reward_ids(prompt, target) == 1.0


@pytest.mark.parametrize("name", TASKS)
def test_token_envs_draw_from_one_partition_when_asked(name):
    """``split=`` on every task's env and vector env (a new task's too): episodes come from that
    partition only; a bad split names the argument."""
    from envs.reasoning import problem_split

    env = gym.make(task_env_id(name), split="test").unwrapped
    prompts = set()
    for seed in range(12):
        env.reset(seed=seed)
        prompts.add(env.prompt)
    assert {problem_split(p) for p in prompts} == {"test"}
    vec = ReasoningTokenVectorEnv(num_envs=8, task=name, split="train")
    _, info = vec.reset(seed=0)
    assert {problem_split(p) for p in info["prompt"]} == {"train"}
    with pytest.raises(ValueError, match="split must be one of"):
        gym.make(task_env_id(name), split="heldout")
