"""Softmax-policy bandits with exact reward models, single and batched.

Two tasks, each in three forms that share one exact model and one sampler:

- exact model, no gymnasium: :class:`BanditModel`, :class:`ContextualBanditModel`;
- ``gymnasium.Env``: :class:`SoftmaxBandit`, :class:`ContextualBandit`;
- ``gymnasium.vector.VectorEnv`` (numpy, batched): :class:`SoftmaxBanditVectorEnv`,
  :class:`ContextualBanditVectorEnv`.

The environments inherit from their model, so ``env.unwrapped.mean_rewards`` and friends are the
exact quantities ``sandbox.exact`` needs, and ``env.unwrapped.sample_rewards(actions, rng)`` draws
rewards for any-shaped integer arrays in one call (a trainer vectorised over S seeds x G samples
never loops in Python).

The reward model is fixed at construction (``model_seed`` generates whatever is not given
explicitly); the ``seed`` passed to ``reset`` only drives sampling. So runs with different seeds
face the same task, as seeds of one experiment should.

Randomness use is fixed and documented, so streams are reproducible and comparable: every sampled
binary reward consumes exactly one ``rng.random()`` (reward is ``u < p``, also when ``p`` is 0 or
1) and every Gaussian reward exactly one ``rng.standard_normal()``; every sampled prompt one
``rng.integers(num_prompts)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

__all__ = [
    "BanditModel",
    "BanditSetting",
    "ContextualBandit",
    "ContextualBanditModel",
    "ContextualBanditVectorEnv",
    "SoftmaxBandit",
    "SoftmaxBanditVectorEnv",
    "make_bandit_suite",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_BINARY_REWARD_VALUES = (0.0, 1.0)


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------


def _float_array(name: str, value: Any, ndim: int) -> FloatArray:
    """``value`` as a finite float64 array with ``ndim`` dimensions, else a ValueError naming it."""
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a {ndim}-d array of numbers; got {value!r}") from exc
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-d; got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite; got {array}")
    return array


def _check_probabilities(name: str, array: FloatArray) -> None:
    if array.size and (array.min() < 0.0 or array.max() > 1.0):
        raise ValueError(
            f"{name} must lie in [0, 1]; got min {array.min():.6g}, max {array.max():.6g}"
        )


def _check_num_arms(num_arms: Any) -> int:
    if isinstance(num_arms, bool) or not isinstance(num_arms, int | np.integer) or num_arms < 2:
        raise ValueError(f"num_arms must be an integer >= 2; got {num_arms!r}")
    return int(num_arms)


def _check_length(name: str, array: np.ndarray, axis: int, expected: int | None, what: str) -> int:
    if array.shape[axis] == 0:
        raise ValueError(f"{name} must not be empty")
    if expected is not None and array.shape[axis] != expected:
        raise ValueError(
            f"{name} has length {array.shape[axis]} along axis {axis} but {what} is {expected}"
        )
    return int(array.shape[axis])


def _index_array(name: str, value: Any, upper: int) -> np.ndarray:
    """``value`` as an integer array with entries in ``[0, upper)``, else a ValueError naming it."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array; got dtype {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= upper):
        raise ValueError(
            f"{name} must lie in [0, {upper}); got min {array.min()}, max {array.max()}"
        )
    return array


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


def _readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _softmax(logits: FloatArray) -> FloatArray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def _binary_reward_table(success_probs: FloatArray) -> FloatArray:
    return np.stack([1.0 - success_probs, success_probs], axis=-1)


def _check_render_mode(render_mode: str | None) -> None:
    if render_mode is not None:
        raise ValueError(
            f"render_mode must be None (these envs do not render); got {render_mode!r}"
        )


# --------------------------------------------------------------------------------------------
# single-state bandit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _BuiltRewardModel:
    mean_rewards: FloatArray
    initial_logits: FloatArray
    noise_std: float | None = None
    correct_arms: IntArray | None = None


def _bernoulli_model(
    num_arms: int | None, rng: np.random.Generator, probs: Any
) -> _BuiltRewardModel:
    if probs is None:
        success = rng.uniform(0.0, 1.0, size=10 if num_arms is None else num_arms)
    else:
        success = _float_array("probs", probs, ndim=1)
        _check_num_arms(_check_length("probs", success, 0, num_arms, "num_arms"))
        _check_probabilities("probs", success)
    return _BuiltRewardModel(success, np.zeros_like(success))


def _needle_model(
    num_arms: int | None,
    rng: np.random.Generator,
    num_correct: Any,
    correct_arms: Any,
    needle_gap: Any,
) -> _BuiltRewardModel:
    num_arms = 10 if num_arms is None else num_arms
    if correct_arms is None:
        num_correct = 1 if num_correct is None else num_correct
        if (
            isinstance(num_correct, bool)
            or not isinstance(num_correct, int | np.integer)
            or not 1 <= num_correct <= num_arms - 1
        ):
            raise ValueError(
                f"num_correct must be an integer in [1, num_arms - 1 = {num_arms - 1}]; "
                f"got {num_correct!r}"
            )
        arms = rng.choice(num_arms, size=int(num_correct), replace=False)
    else:
        arms = _index_array("correct_arms", correct_arms, num_arms)
        if arms.ndim != 1 or not 1 <= arms.size <= num_arms - 1:
            raise ValueError(
                f"correct_arms must be a 1-d array of 1 to num_arms - 1 = {num_arms - 1} arms; "
                f"got {correct_arms!r}"
            )
        if np.unique(arms).size != arms.size:
            raise ValueError(f"correct_arms must not repeat an arm; got {correct_arms!r}")
        if num_correct is not None and num_correct != arms.size:
            raise ValueError(
                f"num_correct={num_correct!r} does not match len(correct_arms)={arms.size}"
            )
    gap = 2.0 if needle_gap is None else needle_gap
    if not (isinstance(gap, int | float | np.number) and 0.0 <= gap < np.inf):
        raise ValueError(f"needle_gap must be a finite number >= 0; got {needle_gap!r}")
    arms = np.sort(arms).astype(np.int64)
    success = np.zeros(num_arms)
    success[arms] = 1.0
    return _BuiltRewardModel(success, -float(gap) * success, correct_arms=arms)


def _gaussian_model(
    num_arms: int | None, rng: np.random.Generator, means: Any, noise_std: Any
) -> _BuiltRewardModel:
    if means is None:
        mean = rng.standard_normal(10 if num_arms is None else num_arms)
    else:
        mean = _float_array("means", means, ndim=1)
        _check_num_arms(_check_length("means", mean, 0, num_arms, "num_arms"))
    noise_std = 1.0 if noise_std is None else noise_std
    if not (isinstance(noise_std, int | float | np.number) and 0.0 <= noise_std < np.inf):
        raise ValueError(f"noise_std must be a finite number >= 0; got {noise_std!r}")
    return _BuiltRewardModel(mean, np.zeros_like(mean), noise_std=float(noise_std))


# reward name -> builder; the arguments each builder owns (an argument of another raises).
_REWARD_MODELS: dict[str, Callable[..., _BuiltRewardModel]] = {
    "bernoulli": _bernoulli_model,
    "needle": _needle_model,
    "gaussian": _gaussian_model,
}
_REWARD_MODEL_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "bernoulli": ("probs",),
    "needle": ("num_correct", "correct_arms", "needle_gap"),
    "gaussian": ("means", "noise_std"),
}


class BanditModel:
    """Exact reward model of a K-armed bandit and its vectorised sampler (no gymnasium state).

    See :class:`SoftmaxBandit` for the arguments. Attributes (arrays are float64 and read-only):

    - ``num_arms`` (int K), ``reward`` (str), ``is_binary`` (bool), ``model_seed`` (int)
    - ``mean_rewards`` [K]: E[r | a], the exact expected reward of each arm
    - ``success_probs`` [K]: P(r = 1 | a) for binary rewards (same values as ``mean_rewards``);
      ``None`` for ``reward="gaussian"``
    - ``reward_values`` [2] = (0, 1) and ``reward_table`` [K, 2] = P(r = reward_values[j] | a): the
      whole enumerable outcome distribution for binary rewards; both ``None`` for Gaussian rewards
    - ``reward_variance`` [K]: Var[r | a], p(1 - p) or ``noise_std**2``
    - ``noise_std`` (float, Gaussian only, else ``None``)
    - ``correct_arms`` (int array, needle only, else ``None``)
    - ``initial_logits`` [K]: the suggested initial policy logits z0 (pi0 = softmax(z0))
    - ``initial_expected_reward`` (float): sum_a pi0(a) mean_rewards[a]
    """

    REWARD_MODELS: ClassVar[tuple[str, ...]] = tuple(_REWARD_MODELS)

    def __init__(
        self,
        num_arms: int | None = None,
        reward: str = "bernoulli",
        probs: Sequence[float] | np.ndarray | None = None,
        means: Sequence[float] | np.ndarray | None = None,
        noise_std: float | None = None,
        num_correct: int | None = None,
        correct_arms: Sequence[int] | np.ndarray | None = None,
        needle_gap: float | None = None,
        initial_logits: Sequence[float] | np.ndarray | None = None,
        model_seed: int = 0,
    ) -> None:
        if reward not in _REWARD_MODELS:
            raise ValueError(f"reward must be one of {tuple(_REWARD_MODELS)}; got {reward!r}")
        given = {
            "probs": probs,
            "means": means,
            "noise_std": noise_std,
            "num_correct": num_correct,
            "correct_arms": correct_arms,
            "needle_gap": needle_gap,
        }
        for name, value in given.items():
            if value is not None and name not in _REWARD_MODEL_ARGUMENTS[reward]:
                owner = next(m for m, names in _REWARD_MODEL_ARGUMENTS.items() if name in names)
                raise ValueError(
                    f"{name} applies to reward={owner!r} only; got it with reward={reward!r}"
                )
        if initial_logits is not None and needle_gap is not None:
            raise ValueError("initial_logits and needle_gap are exclusive: give one of them")
        if num_arms is not None:
            num_arms = _check_num_arms(num_arms)
        if isinstance(model_seed, bool) or not isinstance(model_seed, int | np.integer):
            raise ValueError(f"model_seed must be an int; got {model_seed!r}")

        self.reward: str = reward
        self.model_seed: int = int(model_seed)
        build = _REWARD_MODELS[reward]
        own_args = {name: given[name] for name in _REWARD_MODEL_ARGUMENTS[reward]}
        built = build(num_arms, np.random.default_rng(self.model_seed), **own_args)
        mean, num_arms = built.mean_rewards, built.mean_rewards.shape[0]
        self.noise_std: float | None = built.noise_std
        self.correct_arms: IntArray | None = (
            None if built.correct_arms is None else _readonly(built.correct_arms)
        )
        self.num_arms: int = num_arms
        self.is_binary: bool = built.noise_std is None  # Bernoulli or needle rewards
        self.mean_rewards: FloatArray = _readonly(mean)
        if self.is_binary:
            self.success_probs: FloatArray | None = self.mean_rewards
            self.reward_values: FloatArray | None = _readonly(np.array(_BINARY_REWARD_VALUES))
            self.reward_table: FloatArray | None = _readonly(_binary_reward_table(mean))
            self.reward_variance: FloatArray = _readonly(mean * (1.0 - mean))
        else:
            assert self.noise_std is not None
            self.success_probs = None
            self.reward_values = None
            self.reward_table = None
            self.reward_variance = _readonly(np.full(num_arms, self.noise_std**2))

        if initial_logits is None:
            logits = built.initial_logits
        else:
            logits = _float_array("initial_logits", initial_logits, ndim=1)
            _check_length("initial_logits", logits, 0, num_arms, "num_arms")
        self.initial_logits: FloatArray = _readonly(logits)
        self.initial_expected_reward: float = float(_softmax(logits) @ self.mean_rewards)

    def sample_rewards(self, actions: Any, rng: np.random.Generator) -> FloatArray:
        """Draw one reward per action: ``r ~ p(r | a)`` elementwise, in one vectorised call.

        Args:
            actions: integer array of any shape (e.g. [S, G] for S seeds x G samples), entries in
                ``[0, num_arms)``. A 0-d array gives a 0-d result.
            rng: the generator to draw from; binary rewards use one ``rng.random()`` per element
                (``r = 1[u < p(a)]``), Gaussian rewards one ``rng.standard_normal()`` per element
                (``r = mean(a) + noise_std * n``).

        Returns:
            float64 array with the shape of ``actions``.
        """
        actions = _index_array("actions", actions, self.num_arms)
        rng = _check_rng(rng)
        if self.is_binary:
            assert self.success_probs is not None
            return (rng.random(actions.shape) < self.success_probs[actions]).astype(np.float64)
        assert self.noise_std is not None
        return self.mean_rewards[actions] + self.noise_std * rng.standard_normal(actions.shape)


class SoftmaxBandit(BanditModel, gym.Env[int, int]):
    """A K-armed bandit for softmax policies, with its exact reward model exposed.

    ## Description

    One-step episodes with a single dummy state, the outcome space of a softmax policy over K
    arms. Stands in for "prompt -> sampled answer -> verifiable reward" with the answer space
    small enough to enumerate, so that ``sandbox.exact`` can compute expected gradients from
    ``mean_rewards`` / ``success_probs`` and compare them with sampled training.

    Three reward models (``reward=``):

    - ``"bernoulli"``: arm a pays 1 with probability ``probs[a]``, else 0.
    - ``"needle"``: ``num_correct`` correct arms pay 1, the others 0 (a deterministic verifiable
      reward). The suggested initial policy ``initial_logits`` puts logit ``-needle_gap`` on the
      correct arms and 0 elsewhere, so the needle is rare at the start:
      pi0(correct) = c e^{-gap} / (c e^{-gap} + K - c) with c = ``num_correct``.
    - ``"gaussian"``: arm a pays ``means[a] + noise_std * N(0, 1)``.

    ## Action Space

    ``Discrete(num_arms)``: the arm to pull.

    ## Observation Space

    ``Discrete(1)``: the single state; the observation is always ``0``.

    ## Reward

    Drawn from the reward model of the pulled arm (see Description); the exact expectation is
    ``mean_rewards[action]`` and is returned as ``info["expected_reward"]``. Sampling is
    :meth:`BanditModel.sample_rewards` on ``self.np_random``.

    ## Episode End

    Every episode is one step: ``step`` returns ``terminated=True, truncated=False``.

    ## Arguments

    - ``num_arms``: K >= 2. Default: the length of ``probs``/``means``, else 10.
    - ``reward``: ``"bernoulli"`` (default), ``"needle"`` or ``"gaussian"``.
    - ``probs`` (bernoulli): success probability per arm, in [0, 1]. Default: ``num_arms``
      draws of U(0, 1) from ``model_seed``.
    - ``num_correct`` (needle): number of correct arms, in [1, K - 1]. Default 1.
    - ``correct_arms`` (needle): indices of the correct arms. Default: ``num_correct`` distinct
      arms drawn from ``model_seed`` (exposed as ``correct_arms``).
    - ``needle_gap`` (needle): logit deficit of the correct arms in ``initial_logits``, >= 0.
      Default 2.0.
    - ``means`` (gaussian): mean reward per arm. Default: ``num_arms`` draws of N(0, 1) from
      ``model_seed``.
    - ``noise_std`` (gaussian): reward noise standard deviation, >= 0. Default 1.0.
    - ``initial_logits``: suggested initial policy logits [K]. Default 0 everywhere (uniform
      policy), or the needle construction above; exclusive with ``needle_gap``.
    - ``model_seed``: seeds whatever part of the model is not given. The model is fixed at
      construction; ``reset(seed=...)`` only seeds reward sampling.
    - ``render_mode``: must be ``None``.

    An argument that does not apply to the chosen ``reward`` raises a ``ValueError``.

    ## Version History

    - v0: initial version.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, render_mode: str | None = None, **model_kwargs: Any) -> None:
        _check_render_mode(render_mode)
        super().__init__(**model_kwargs)
        _set_spaces(self, render_mode, num_states=1)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        if options:
            raise ValueError(f"options: SoftmaxBandit takes no reset options; got {options!r}")
        return 0, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an integer in [0, {self.num_arms}); got {action!r}")
        arm = int(action)
        reward = float(self.sample_rewards(np.asarray(arm), self.np_random))
        return 0, reward, True, False, {"expected_reward": float(self.mean_rewards[arm])}


class SoftmaxBanditVectorEnv(BanditModel, VectorEnv):
    """``num_envs`` copies of :class:`SoftmaxBandit` stepped as one numpy batch.

    Same arguments as :class:`SoftmaxBandit` plus ``num_envs``. Observations are
    ``np.zeros(num_envs, int64)``; ``step(actions)`` takes an int array [num_envs] and returns
    rewards [num_envs] (float64), ``terminations`` all True and ``truncations`` all False.

    Autoreset is ``AutoresetMode.SAME_STEP`` (``metadata["autoreset_mode"]``): every episode
    ends at each step and is reset within that step, so every step samples every env. As with
    gymnasium's ``SyncVectorEnv`` in that mode, ``info["final_obs"]`` (object array) holds the
    observations the episodes ended in and ``info["final_info"]["expected_reward"]`` the exact
    expected reward of each pulled arm (each with its ``_key`` mask).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": [],
    }

    def __init__(
        self, num_envs: int = 1, render_mode: str | None = None, **model_kwargs: Any
    ) -> None:
        _check_vector_args(num_envs, render_mode)
        super().__init__(**model_kwargs)
        _set_vector_spaces(self, int(num_envs), render_mode, num_states=1)
        self._has_reset = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[IntArray, dict[str, Any]]:
        super().reset(seed=seed)
        if options:
            raise ValueError(
                f"options: SoftmaxBanditVectorEnv takes no reset options; got {options!r}"
            )
        self._has_reset = True
        return np.zeros(self.num_envs, dtype=np.int64), {}

    def step(
        self, actions: Any
    ) -> tuple[IntArray, FloatArray, npt.NDArray[np.bool_], npt.NDArray[np.bool_], dict[str, Any]]:
        if not self._has_reset:
            raise RuntimeError("call reset() before step()")
        actions = _vector_actions(actions, self.num_envs)
        rewards = self.sample_rewards(actions, self.np_random)
        obs = np.zeros(self.num_envs, dtype=np.int64)
        info = _same_step_info(obs, {"expected_reward": self.mean_rewards[actions]})
        return obs, rewards, *_done_flags(self.num_envs), info


def _check_vector_args(num_envs: Any, render_mode: str | None) -> None:
    _check_render_mode(render_mode)
    if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:
        raise ValueError(f"num_envs must be an integer >= 1; got {num_envs!r}")


def _set_spaces(env: Any, render_mode: str | None, num_states: int) -> None:
    """Spaces of a one-step bandit: an arm as action, a state (prompt) index as observation."""
    env.render_mode = render_mode
    env.action_space = spaces.Discrete(env.num_arms)
    env.observation_space = spaces.Discrete(num_states)


def _set_vector_spaces(env: Any, num_envs: int, render_mode: str | None, num_states: int) -> None:
    """Spaces of a batched one-step bandit: an arm per env, a state index per env."""
    env.num_envs = num_envs
    env.render_mode = render_mode
    env.single_action_space = spaces.Discrete(env.num_arms)
    env.single_observation_space = spaces.Discrete(num_states)
    env.action_space = batch_space(env.single_action_space, num_envs)
    env.observation_space = batch_space(env.single_observation_space, num_envs)


def _vector_actions(actions: Any, num_envs: int) -> np.ndarray:
    actions = np.asarray(actions)
    if actions.shape != (num_envs,):
        raise ValueError(f"actions must have shape ({num_envs},); got {actions.shape}")
    return actions


def _done_flags(num_envs: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    return np.ones(num_envs, dtype=np.bool_), np.zeros(num_envs, dtype=np.bool_)


def _same_step_info(final_obs: np.ndarray, final_info: dict[str, np.ndarray]) -> dict[str, Any]:
    """The info layout of gymnasium's SyncVectorEnv when every sub-env ends in the same step."""
    mask = np.ones(final_obs.shape[0], dtype=np.bool_)
    batched_final_info: dict[str, Any] = {}
    for key, value in final_info.items():
        batched_final_info[key] = value
        batched_final_info[f"_{key}"] = mask.copy()
    return {
        "final_obs": final_obs.astype(object),
        "_final_obs": mask.copy(),
        "final_info": batched_final_info,
        "_final_info": mask.copy(),
    }


# --------------------------------------------------------------------------------------------
# contextual bandit
# --------------------------------------------------------------------------------------------


class ContextualBanditModel:
    """Exact model of P prompts, each a K-armed bandit with binary rewards (no gymnasium state).

    See :class:`ContextualBandit` for the arguments. Attributes (arrays are float64 and
    read-only):

    - ``num_prompts`` (int P), ``num_arms`` (int K), ``is_binary`` (True), ``model_seed`` (int)
    - ``prompt_probs`` [P]: the distribution ``reset`` draws prompts from (uniform)
    - ``success_probs`` [P, K]: P(r = 1 | prompt, arm); ``mean_rewards`` is the same array
    - ``reward_values`` [2] = (0, 1) and ``reward_table`` [P, K, 2] = P(r = reward_values[j] | p, a)
    - ``reward_variance`` [P, K]: p(1 - p)
    - ``initial_logits`` [P, K]: the suggested initial policy logits per prompt
    - ``initial_expected_reward`` [P]: each prompt's pass rate under softmax(initial_logits)
    """

    is_binary: bool = True

    def __init__(
        self,
        pass_rates: Sequence[float] | np.ndarray | None = None,
        success_probs: Sequence[Sequence[float]] | np.ndarray | None = None,
        num_prompts: int | None = None,
        num_arms: int | None = None,
        num_correct: int | None = None,
        initial_logits: Sequence[Sequence[float]] | np.ndarray | None = None,
        model_seed: int = 0,
    ) -> None:
        if pass_rates is not None and success_probs is not None:
            raise ValueError("pass_rates and success_probs are exclusive: give one of them")
        if num_prompts is not None and (
            isinstance(num_prompts, bool)
            or not isinstance(num_prompts, int | np.integer)
            or num_prompts < 1
        ):
            raise ValueError(f"num_prompts must be an integer >= 1; got {num_prompts!r}")
        if num_arms is not None:
            num_arms = _check_num_arms(num_arms)
        if isinstance(model_seed, bool) or not isinstance(model_seed, int | np.integer):
            raise ValueError(f"model_seed must be an int; got {model_seed!r}")
        model_rng = np.random.default_rng(int(model_seed))
        self.model_seed: int = int(model_seed)

        if success_probs is not None:
            if num_correct is not None:
                raise ValueError(
                    "num_correct applies to pass_rates only; got it with success_probs"
                )
            success = _float_array("success_probs", success_probs, ndim=2)
            num_prompts = _check_length("success_probs", success, 0, num_prompts, "num_prompts")
            num_arms = _check_length("success_probs", success, 1, num_arms, "num_arms")
            _check_num_arms(num_arms)
            _check_probabilities("success_probs", success)
            if initial_logits is None:
                logits = np.zeros_like(success)
            else:
                logits = _float_array("initial_logits", initial_logits, ndim=2)
                if logits.shape != success.shape:
                    raise ValueError(
                        f"initial_logits must have shape {success.shape} (num_prompts, num_arms); "
                        f"got {logits.shape}"
                    )
        else:
            if initial_logits is not None:
                raise ValueError(
                    "initial_logits applies to success_probs only; with pass_rates the "
                    "construction defines the initial logits"
                )
            num_arms = 16 if num_arms is None else num_arms
            if pass_rates is None:
                num_prompts = 8 if num_prompts is None else int(num_prompts)
                rates = model_rng.uniform(0.0, 1.0, size=num_prompts)
            else:
                rates = _float_array("pass_rates", pass_rates, ndim=1)
                num_prompts = _check_length("pass_rates", rates, 0, num_prompts, "num_prompts")
                _check_probabilities("pass_rates", rates)
            if num_correct is not None and (
                isinstance(num_correct, bool)
                or not isinstance(num_correct, int | np.integer)
                or not 1 <= num_correct <= num_arms - 1
            ):
                raise ValueError(
                    f"num_correct must be an integer in [1, num_arms - 1 = {num_arms - 1}]; "
                    f"got {num_correct!r}"
                )
            success, logits = _pass_rate_construction(rates, num_arms, num_correct, model_rng)

        self.num_prompts: int = num_prompts
        self.num_arms: int = num_arms
        self.success_probs: FloatArray = _readonly(success)
        self.mean_rewards: FloatArray = self.success_probs
        self.reward_values: FloatArray = _readonly(np.array(_BINARY_REWARD_VALUES))
        self.reward_table: FloatArray = _readonly(_binary_reward_table(success))
        self.reward_variance: FloatArray = _readonly(success * (1.0 - success))
        self.prompt_probs: FloatArray = _readonly(np.full(num_prompts, 1.0 / num_prompts))
        self.initial_logits: FloatArray = _readonly(logits)
        self.initial_expected_reward: FloatArray = _readonly(
            np.einsum("pk,pk->p", _softmax(logits), success)
        )

    def sample_prompts(self, size: int | tuple[int, ...], rng: np.random.Generator) -> IntArray:
        """Draw prompt indices from ``prompt_probs`` (uniform), one ``rng.integers`` per element."""
        return _check_rng(rng).integers(self.num_prompts, size=size, dtype=np.int64)

    def sample_rewards(self, prompts: Any, actions: Any, rng: np.random.Generator) -> FloatArray:
        """Draw ``r ~ Bernoulli(success_probs[prompt, action])`` elementwise in one call.

        Args:
            prompts: integer array, entries in ``[0, num_prompts)``.
            actions: integer array, entries in ``[0, num_arms)``, broadcastable with ``prompts``
                (e.g. prompts [S, 1] and actions [S, G] for G samples of each seed's prompt).
            rng: the generator; one ``rng.random()`` per output element (``r = 1[u < p]``).

        Returns:
            float64 array of the broadcast shape.
        """
        prompts = _index_array("prompts", prompts, self.num_prompts)
        actions = _index_array("actions", actions, self.num_arms)
        try:
            shape = np.broadcast_shapes(prompts.shape, actions.shape)
        except ValueError as exc:
            raise ValueError(
                f"prompts {prompts.shape} and actions {actions.shape} must broadcast together"
            ) from exc
        probs = self.success_probs[prompts, actions]
        return (_check_rng(rng).random(shape) < probs).astype(np.float64)


def _pass_rate_construction(
    rates: FloatArray, num_arms: int, num_correct: int | None, rng: np.random.Generator
) -> tuple[FloatArray, FloatArray]:
    """Correct arms and initial logits giving each prompt exactly its pass rate at the start.

    For pass rate r in (0, 1) with c correct arms (logit g) and K - c wrong ones (logit 0),
    c e^g / (c e^g + K - c) = r gives g = log(r (K - c) / (c (1 - r))). The default
    c = clip(round(r K), 1, K - 1) keeps the initial policy close to uniform. r = 0 makes every
    arm wrong and r = 1 every arm correct (logits 0).
    """
    num_prompts = rates.shape[0]
    success = np.zeros((num_prompts, num_arms))
    logits = np.zeros((num_prompts, num_arms))
    for prompt, rate in enumerate(rates):
        if rate == 1.0:
            success[prompt] = 1.0
        if rate in (0.0, 1.0):
            continue
        c = (
            num_correct
            if num_correct is not None
            else int(np.clip(round(rate * num_arms), 1, num_arms - 1))
        )
        arms = rng.choice(num_arms, size=c, replace=False)
        success[prompt, arms] = 1.0
        logits[prompt, arms] = np.log(rate * (num_arms - c) / (c * (1.0 - rate)))
    return success, logits


class ContextualBandit(ContextualBanditModel, gym.Env[int, int]):
    """P prompts of mixed difficulty, each a K-armed bandit with a binary verifiable reward.

    ## Description

    A dataset of easy and hard problems in miniature. Each episode draws a prompt uniformly
    (``prompt_probs``), the policy picks one of K answers (arms), and the answer is right with
    probability ``success_probs[prompt, arm]`` (0 or 1 in the ``pass_rates`` construction).

    With ``pass_rates`` (default), prompt p gets c_p correct arms, and the suggested initial policy
    ``softmax(initial_logits[p])`` solves it with probability exactly ``pass_rates[p]``: the
    correct arms share logit g_p = log(r (K - c) / (c (1 - r))), the others logit 0, with
    c = ``num_correct`` or, by default, clip(round(r K), 1, K - 1) (so the initial policy is
    close to uniform). Pass rate 0 makes every arm wrong (an unsolvable prompt), 1 every arm
    right. Which arms are correct is drawn from ``model_seed``. With ``success_probs`` the table
    is given directly.

    ## Action Space

    ``Discrete(num_arms)``: the answer.

    ## Observation Space

    ``Discrete(num_prompts)``: the prompt index.

    ## Reward

    1 with probability ``success_probs[prompt, action]``, else 0; the exact expectation is
    returned as ``info["expected_reward"]``. Sampling is
    :meth:`ContextualBanditModel.sample_rewards` on ``self.np_random``.

    ## Starting State

    ``reset`` draws the prompt from ``prompt_probs`` (uniform), or takes it from
    ``options={"prompt": p}``.

    ## Episode End

    Every episode is one step: ``step`` returns ``terminated=True, truncated=False``, and the
    observation stays the episode's prompt.

    ## Arguments

    - ``pass_rates``: initial pass rate per prompt, in [0, 1] (sets P). Default: ``num_prompts``
      draws of U(0, 1) from ``model_seed``. Exclusive with ``success_probs``.
    - ``success_probs``: an explicit [P, K] table in [0, 1] instead of ``pass_rates``.
    - ``num_prompts``: P >= 1. Default: from ``pass_rates``/``success_probs``, else 8.
    - ``num_arms``: K >= 2. Default: from ``success_probs``, else 16.
    - ``num_correct``: correct arms per prompt with 0 < pass rate < 1, in [1, K - 1]
      (``pass_rates`` only). Default: clip(round(r K), 1, K - 1).
    - ``initial_logits``: [P, K] suggested initial logits (``success_probs`` only; default 0).
    - ``model_seed``: seeds whatever part of the model is not given. The model is fixed at
      construction; ``reset(seed=...)`` only seeds prompt and reward sampling.
    - ``render_mode``: must be ``None``.

    ## Version History

    - v0: initial version.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, render_mode: str | None = None, **model_kwargs: Any) -> None:
        _check_render_mode(render_mode)
        super().__init__(**model_kwargs)
        _set_spaces(self, render_mode, num_states=self.num_prompts)
        self._prompt: int | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        prompt = options.pop("prompt", None)
        if options:
            raise ValueError(f"options: unknown reset options {sorted(options)}; valid: ['prompt']")
        if prompt is None:
            self._prompt = int(self.sample_prompts((), self.np_random))
        else:
            if not self.observation_space.contains(prompt):
                raise ValueError(
                    f"options['prompt'] must be an integer in [0, {self.num_prompts}); got {prompt!r}"
                )
            self._prompt = int(prompt)
        return self._prompt, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
        if self._prompt is None:
            raise RuntimeError("call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an integer in [0, {self.num_arms}); got {action!r}")
        prompt, arm = self._prompt, int(action)
        reward = float(self.sample_rewards(np.asarray(prompt), np.asarray(arm), self.np_random))
        info = {"expected_reward": float(self.success_probs[prompt, arm])}
        return prompt, reward, True, False, info


class ContextualBanditVectorEnv(ContextualBanditModel, VectorEnv):
    """``num_envs`` copies of :class:`ContextualBandit` stepped as one numpy batch.

    Same arguments as :class:`ContextualBandit` plus ``num_envs``. Observations are prompt indices
    [num_envs] (int64). ``reset(options={"prompts": array[num_envs]})`` sets the prompts instead
    of drawing them.

    Autoreset is ``AutoresetMode.SAME_STEP``: each ``step(actions)`` ends every episode, returns
    the fresh prompts of the next episodes as observations, and puts the prompts the actions were
    taken in at ``info["final_obs"]`` (object array, like ``SyncVectorEnv``) and their exact
    expected rewards at ``info["final_info"]["expected_reward"]``. Per step, rewards are drawn
    before the next prompts.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": [],
    }

    def __init__(
        self, num_envs: int = 1, render_mode: str | None = None, **model_kwargs: Any
    ) -> None:
        _check_vector_args(num_envs, render_mode)
        super().__init__(**model_kwargs)
        _set_vector_spaces(self, int(num_envs), render_mode, num_states=self.num_prompts)
        self._prompts: IntArray | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[IntArray, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        prompts = options.pop("prompts", None)
        if options:
            raise ValueError(
                f"options: unknown reset options {sorted(options)}; valid: ['prompts']"
            )
        if prompts is None:
            self._prompts = self.sample_prompts(self.num_envs, self.np_random)
        else:
            prompts = _index_array("options['prompts']", prompts, self.num_prompts)
            if prompts.shape != (self.num_envs,):
                raise ValueError(
                    f"options['prompts'] must have shape ({self.num_envs},); got {prompts.shape}"
                )
            self._prompts = prompts.astype(np.int64)
        return self._prompts.copy(), {}

    def step(
        self, actions: Any
    ) -> tuple[IntArray, FloatArray, npt.NDArray[np.bool_], npt.NDArray[np.bool_], dict[str, Any]]:
        if self._prompts is None:
            raise RuntimeError("call reset() before step()")
        actions = _vector_actions(actions, self.num_envs)
        prompts = self._prompts
        rewards = self.sample_rewards(prompts, actions, self.np_random)
        expected = self.success_probs[prompts, actions]
        self._prompts = self.sample_prompts(self.num_envs, self.np_random)
        info = _same_step_info(prompts, {"expected_reward": expected})
        return self._prompts.copy(), rewards, *_done_flags(self.num_envs), info


# --------------------------------------------------------------------------------------------
# default suite
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BanditSetting:
    """A named bandit task: a registered env id plus its constructor kwargs (JSON-friendly)."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def make(self, **overrides: Any) -> gym.Env:
        """``gymnasium.make(env_id, **kwargs, **overrides)``."""
        return gym.make(self.env_id, **{**self.kwargs, **overrides})

    def make_vec(self, num_envs: int, **overrides: Any) -> VectorEnv:
        """The batched numpy env: ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``."""
        return gym.make_vec(
            self.env_id,
            num_envs=num_envs,
            vectorization_mode="vector_entry_point",
            **{**self.kwargs, **overrides},
        )


def make_bandit_suite() -> dict[str, BanditSetting]:
    """The default bandit tasks, by name.

    - ``"easy"``: 10 Bernoulli arms, arm 4 clearly best (0.8 vs 0.5 for the runner-up).
    - ``"needle"``: 100 arms, one correct (deterministic reward 1) with initial logit -2, so the
      initial policy finds it with probability e^-2 / (e^-2 + 99) ~ 0.14%.
    - ``"gaussian"``: 10 arms with N(0, 1) means and unit reward noise.
    - ``"mixed"``: contextual, 8 prompts x 16 arms with initial pass rates from 0 (unsolvable)
      to 1 (always solved).
    """
    return {
        "easy": BanditSetting(
            "sandbox/SoftmaxBandit-v0",
            {
                "reward": "bernoulli",
                "probs": [0.3, 0.5, 0.2, 0.4, 0.8, 0.35, 0.1, 0.45, 0.25, 0.15],
            },
            "10 Bernoulli arms, one clearly best",
        ),
        "needle": BanditSetting(
            "sandbox/SoftmaxBandit-v0",
            {"reward": "needle", "num_arms": 100, "num_correct": 1, "needle_gap": 2.0},
            "100 arms, a single correct arm with low initial probability",
        ),
        "gaussian": BanditSetting(
            "sandbox/SoftmaxBandit-v0",
            {"reward": "gaussian", "num_arms": 10, "noise_std": 1.0},
            "10 arms with Gaussian rewards",
        ),
        "mixed": BanditSetting(
            "sandbox/ContextualBandit-v0",
            {"num_arms": 16, "pass_rates": [0.0, 0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]},
            "8 prompts from unsolvable to always solved",
        ),
    }
