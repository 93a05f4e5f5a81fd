"""Token-level Gymnasium envs for the reasoning tasks: one token per step, reward at the end.

One generic env (:class:`ReasoningTokenEnv`, task chosen by name) and its numpy-batched vector
form (:class:`ReasoningTokenVectorEnv`), plus one fixed-task subclass of each per registered task
(``ModArithTokenEnv``, ``ModArithTokenVectorEnv``, ...; :func:`task_env_class`), derived from
the task registry: ``@register_task("mod_arith")`` registers ``sandbox/Reasoning-ModArith-v0``
with these classes as entry points, and this module makes them on first use::

    env = gym.make("sandbox/Reasoning-Addition-v0", digits=4)   # knobs pass through
    test = gym.make("sandbox/Reasoning-Addition-v0", digits=4, split="test")  # one partition
    vec = gym.make_vec("sandbox/Reasoning-Bits-v0", num_envs=512,
                       vectorization_mode="vector_entry_point", op="reverse", length=4)

The exact model lives on ``env.unwrapped.task`` (a :class:`~envs.reasoning.tasks.ReasoningTask`;
for ``sandbox/Reasoning-Bits-v0`` a :class:`~envs.reasoning.tasks.BitsTask` with
``enumerate_completions`` and ``reward_ids``).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import numpy.typing as npt
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envs.reasoning.tasks import (
    ReasoningTask,
    _check_split,
    available_tasks,
    make_task,
    task_env_id,
    task_env_stem,
)

__all__ = ["ReasoningTokenEnv", "ReasoningTokenVectorEnv", "task_env_class"]

IntArray = npt.NDArray[np.int64]

#: Longest completion a token env accepts (``max_completion_len``).
MAX_COMPLETION_LEN = 4096


def _check_render_mode(render_mode: str | None) -> None:
    if render_mode is not None:
        raise ValueError(
            f"render_mode must be None (these envs do not render); got {render_mode!r}"
        )


class _TokenLayout:
    """Task, tokenizer, buffer sizes and spaces shared by the single and vector envs."""

    task_name: ClassVar[str | None] = None

    def _setup(
        self,
        task: str | ReasoningTask | None,
        max_completion_len: int | None,
        knobs: dict[str, Any],
        split: str | None = None,
    ) -> None:
        #: the partition episodes draw their problems from (None: every problem)
        self.split = _check_split(split)
        if self.task_name is not None and task is not None:
            raise ValueError(
                f"task: {type(self).__name__} always runs task {self.task_name!r}; got {task!r} "
                "(use ReasoningTokenEnv(task=...) to choose a task)"
            )
        task = self.task_name if task is None else task
        if isinstance(task, ReasoningTask):
            if knobs:
                raise ValueError(f"knobs {sorted(knobs)} given with a ready-made task {task!r}")
            self.task = task
        elif isinstance(task, str):
            self.task = make_task(task, **knobs)
        else:
            raise ValueError(f"task must be a task name or a ReasoningTask; got {task!r}")
        self.tokenizer = self.task.tokenizer
        if max_completion_len is None:
            max_completion_len = self.task.max_answer_len + 1
        if (
            isinstance(max_completion_len, bool)
            or not isinstance(max_completion_len, int | np.integer)
            or not 1 <= max_completion_len <= MAX_COMPLETION_LEN
        ):
            raise ValueError(
                f"max_completion_len must be an integer in [1, {MAX_COMPLETION_LEN}]; "
                f"got {max_completion_len!r}"
            )
        self.max_completion_len = int(max_completion_len)
        self.max_prompt_tokens = self.task.max_prompt_tokens
        self.max_length = self.max_prompt_tokens + self.max_completion_len
        vocab_size = self.tokenizer.vocab_size
        self._token_action_space = spaces.Discrete(vocab_size)
        self._token_observation_space = spaces.Dict(
            {
                "tokens": spaces.MultiDiscrete(np.full(self.max_length, vocab_size, np.int64)),
                "length": spaces.Discrete(self.max_length + 1),
                "prompt_length": spaces.Discrete(self.max_length + 1),
            }
        )

    def _problem(
        self, rng: np.random.Generator, options: dict[str, Any] | None
    ) -> tuple[str, str, list[int]]:
        """A (prompt, answer, prompt ids) drawn from ``rng`` or given in ``options``."""
        options = dict(options or {})
        prompt, answer = options.pop("prompt", None), options.pop("answer", None)
        if options:
            raise ValueError(
                f"options: unknown reset options {sorted(options)}; valid: ['answer', 'prompt']"
            )
        if (prompt is None) != (answer is None):
            raise ValueError("options: give both 'prompt' and 'answer', or neither")
        if prompt is None:
            prompt, answer = self.task.sample(rng, split=self.split)
            ids = self.task.encode_prompt(prompt)
            if len(ids) > self.max_prompt_tokens:  # a bug in the task's bound, not user error
                raise RuntimeError(f"prompt of {len(ids)} tokens exceeds max_prompt_tokens")
            return prompt, answer, ids
        if not isinstance(prompt, str) or not isinstance(answer, str) or not answer:
            raise ValueError("options['prompt'] and options['answer'] must be (non-empty) str")
        ids = self.task.encode_prompt(prompt)
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(
                f"options['prompt'] encodes to {len(ids)} tokens; at most "
                f"{self.max_prompt_tokens} fit this env"
            )
        return prompt, answer, ids


class ReasoningTokenEnv(_TokenLayout, gym.Env[dict[str, Any], int]):
    """A reasoning task played one token at a time, with the verifier's reward at the end.

    ## Description

    ``reset`` draws a problem ``(prompt, answer)`` from the task (see
    :mod:`envs.reasoning.tasks`) and writes the prompt's tokens ``[<bos>] + prompt ids`` into a
    fixed-length buffer. Each ``step`` appends the action token. The episode ends when the agent
    emits ``<eos>`` or the completion reaches ``max_completion_len`` tokens; the completion is then
    decoded (up to ``<eos>``, with ``<pad>``/``<bos>`` dropped) and scored by
    ``task.verify(answer, completion)``.

    ## Action Space

    ``Discrete(tokenizer.vocab_size)``: the next token id (``tokenizer.eos_id`` ends the answer).
    99 ids for every task with the default :class:`~envs.reasoning.tokenizer.CharTokenizer`;
    5 for ``bits`` (``<pad>, <bos>, <eos>, 0, 1``). ``task.completion_token_ids`` lists the ids
    answers use, for policies that mask the others.

    ## Observation Space

    ``Dict``:

    - ``"tokens"``: ``MultiDiscrete([vocab_size] * max_length)`` int64, the prompt ids then the
      completion ids so far, right-padded with ``<pad>``;
    - ``"length"``: ``Discrete(max_length + 1)``, the number of valid entries of ``"tokens"``;
    - ``"prompt_length"``: ``Discrete(max_length + 1)``, where the completion starts.

    with ``max_length = task.max_prompt_tokens + max_completion_len``.

    ## Reward

    0 on every step but the last; on the last, ``task.verify(answer, completion)`` (1.0 or 0.0).

    ## Starting State

    A problem drawn with ``self.np_random`` (so ``reset(seed=s)`` fixes the problem sequence), or
    the one in ``options={"prompt": ..., "answer": ...}``. ``info`` holds ``"prompt"`` and
    ``"answer"``.

    ## Episode End

    ``terminated=True`` at ``<eos>`` and also when the completion reaches
    ``max_completion_len`` tokens (the position is part of the observation, so the length limit
    is part of the MDP); ``truncated`` is always False. The last ``info`` holds
    ``"completion"`` (text), ``"answer"`` and ``"eos"`` (whether ``<eos>`` ended it).

    ## Arguments

    - ``task``: a task name from ``envs.reasoning.available_tasks()`` or a
      :class:`~envs.reasoning.tasks.ReasoningTask` (fixed in the per-task subclasses).
    - ``max_completion_len``: completion tokens allowed, counting ``<eos>``; 1-4096. Default
      ``task.max_answer_len + 1`` (room for the longest answer and ``<eos>``).
    - ``**knobs``: the task's difficulty knobs (e.g. ``digits=5``).
    - ``render_mode``: must be ``None``.

    ## Version History

    - v0: initial version.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        task: str | ReasoningTask | None = None,
        *,
        max_completion_len: int | None = None,
        render_mode: str | None = None,
        split: str | None = None,
        **knobs: Any,
    ) -> None:
        _check_render_mode(render_mode)
        self._setup(task, max_completion_len, knobs, split)
        self.render_mode = render_mode
        self.action_space = self._token_action_space
        self.observation_space = self._token_observation_space
        self._tokens = np.full(self.max_length, self.tokenizer.pad_id, dtype=np.int64)
        self._length = 0
        self._prompt_length = 0
        self._prompt: str | None = None
        self._answer: str | None = None
        self._done = True

    @property
    def prompt(self) -> str | None:
        """The current episode's prompt text."""
        return self._prompt

    @property
    def answer(self) -> str | None:
        """The current episode's reference answer."""
        return self._answer

    def _obs(self) -> dict[str, Any]:
        return {
            "tokens": self._tokens.copy(),
            "length": np.int64(self._length),
            "prompt_length": np.int64(self._prompt_length),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        prompt, answer, ids = self._problem(self.np_random, options)
        self._tokens.fill(self.tokenizer.pad_id)
        self._tokens[: len(ids)] = ids
        self._length = self._prompt_length = len(ids)
        self._prompt, self._answer, self._done = prompt, answer, False
        return self._obs(), {"prompt": prompt, "answer": answer}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("call reset() before step() (the episode has ended)")
        if not self.action_space.contains(action):
            raise ValueError(
                f"action must be a token id in [0, {self.tokenizer.vocab_size}); got {action!r}"
            )
        token = int(action)
        self._tokens[self._length] = token
        self._length += 1
        eos = token == self.tokenizer.eos_id
        if not eos and self._length - self._prompt_length < self.max_completion_len:
            return self._obs(), 0.0, False, False, {}
        assert self._answer is not None
        self._done = True
        completion = self.task.decode_completion(self._tokens[self._prompt_length : self._length])
        reward = self.task.verify(self._answer, completion)
        info = {"completion": completion, "answer": self._answer, "eos": eos}
        return self._obs(), reward, True, False, info


class ReasoningTokenVectorEnv(_TokenLayout, VectorEnv):
    """``num_envs`` copies of :class:`ReasoningTokenEnv` in one set of numpy buffers.

    Same arguments as :class:`ReasoningTokenEnv` plus ``num_envs``. Observations are the single
    env's dict batched (``"tokens"`` [num_envs, max_length], ``"length"`` and
    ``"prompt_length"`` [num_envs], int64); ``step(actions)`` takes token ids [num_envs].

    Autoreset is ``AutoresetMode.SAME_STEP``, with ``SyncVectorEnv``'s info layout: an env whose
    episode ends in a step gets its reward, ``terminations[i] = True``, a fresh problem in the
    returned observation, ``info["final_obs"][i]`` (object array) the observation it ended in,
    ``info["final_info"]`` its ``"completion"``/``"answer"``/``"eos"`` and
    ``info["prompt"]``/``info["answer"]`` the new problem (each key with its ``_key`` mask).
    Problems are drawn from one generator in env order, at reset and then in each step for the
    envs that ended.
    """

    metadata: ClassVar[dict[str, Any]] = {
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": [],
    }

    def __init__(
        self,
        num_envs: int = 1,
        task: str | ReasoningTask | None = None,
        *,
        max_completion_len: int | None = None,
        render_mode: str | None = None,
        split: str | None = None,
        **knobs: Any,
    ) -> None:
        _check_render_mode(render_mode)
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1; got {num_envs!r}")
        self._setup(task, max_completion_len, knobs, split)
        self.num_envs = int(num_envs)
        self.render_mode = render_mode
        self.single_action_space = self._token_action_space
        self.single_observation_space = self._token_observation_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        shape = (self.num_envs, self.max_length)
        self._tokens = np.full(shape, self.tokenizer.pad_id, dtype=np.int64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._prompt_lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._answers: list[str] = [""] * self.num_envs
        self._has_reset = False

    def _obs(self) -> dict[str, Any]:
        return {
            "tokens": self._tokens.copy(),
            "length": self._lengths.copy(),
            "prompt_length": self._prompt_lengths.copy(),
        }

    def _single_obs(self, i: int) -> dict[str, Any]:
        return {
            "tokens": self._tokens[i].copy(),
            "length": np.int64(self._lengths[i]),
            "prompt_length": np.int64(self._prompt_lengths[i]),
        }

    def _new_problem(self, i: int, options: dict[str, Any] | None) -> dict[str, Any]:
        prompt, answer, ids = self._problem(self.np_random, options)
        self._tokens[i].fill(self.tokenizer.pad_id)
        self._tokens[i, : len(ids)] = ids
        self._lengths[i] = self._prompt_lengths[i] = len(ids)
        self._answers[i] = answer
        return {"prompt": prompt, "answer": answer}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        if options:
            raise ValueError(
                f"options: {type(self).__name__} takes no reset options; got {options!r}"
            )
        info: dict[str, Any] = {}
        for i in range(self.num_envs):
            info = self._add_info(info, self._new_problem(i, None), i)
        self._has_reset = True
        return self._obs(), info

    def step(
        self, actions: Any
    ) -> tuple[
        dict[str, Any],
        npt.NDArray[np.float64],
        npt.NDArray[np.bool_],
        npt.NDArray[np.bool_],
        dict[str, Any],
    ]:
        if not self._has_reset:
            raise RuntimeError("call reset() before step()")
        actions = np.asarray(actions)
        vocab_size = self.tokenizer.vocab_size
        if (
            actions.shape != (self.num_envs,)
            or not np.issubdtype(actions.dtype, np.integer)
            or actions.min() < 0
            or actions.max() >= vocab_size
        ):
            raise ValueError(
                f"actions must be token ids in [0, {vocab_size}) of shape ({self.num_envs},); "
                f"got {actions!r}"
            )
        rows = np.arange(self.num_envs)
        self._tokens[rows, self._lengths] = actions
        self._lengths += 1
        eos = actions == self.tokenizer.eos_id
        done = eos | (self._lengths - self._prompt_lengths >= self.max_completion_len)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        info: dict[str, Any] = {}
        for i in np.flatnonzero(done).tolist():
            completion_ids = self._tokens[i, self._prompt_lengths[i] : self._lengths[i]]
            completion = self.task.decode_completion(completion_ids)
            rewards[i] = self.task.verify(self._answers[i], completion)
            final_info = {"completion": completion, "answer": self._answers[i], "eos": bool(eos[i])}
            info = self._add_info(
                info, {"final_obs": self._single_obs(i), "final_info": final_info}, i
            )
            info = self._add_info(info, self._new_problem(i, None), i)
        return self._obs(), rewards, done, np.zeros(self.num_envs, dtype=np.bool_), info


# --------------------------------------------------------------------------------------------
# one class of each per task, derived from the task registry
# --------------------------------------------------------------------------------------------

TokenEnvClass = type[ReasoningTokenEnv] | type[ReasoningTokenVectorEnv]

#: class-name suffix -> base class of the per-task classes
_TASK_ENV_KINDS: dict[str, TokenEnvClass] = {
    "TokenEnv": ReasoningTokenEnv,
    "TokenVectorEnv": ReasoningTokenVectorEnv,
}


@functools.cache
def _derived_class(task_name: str, suffix: str) -> TokenEnvClass:
    base = _TASK_ENV_KINDS[suffix]
    class_name = task_env_stem(task_name) + suffix
    doc = (
        f":class:`{base.__name__}` for the ``{task_name}`` task "
        f"(``{task_env_id(task_name)}``), derived from the task registry."
    )
    namespace = {"task_name": task_name, "__doc__": doc, "__module__": __name__}
    derived: TokenEnvClass = type(class_name, (base,), namespace)
    derived.__qualname__ = class_name  # pickle finds it through the module's __getattr__
    return derived


def task_env_class(task_name: str, *, vector: bool = False) -> TokenEnvClass:
    """The fixed-task subclass of :class:`ReasoningTokenEnv` (``vector=True``:
    :class:`ReasoningTokenVectorEnv`) for the registered task ``task_name``; one class per task,
    made on first use, named ``<Stem>TokenEnv`` / ``<Stem>TokenVectorEnv``
    (``"mod_arith"`` -> ``ModArithTokenEnv``) and importable from this module under that name.
    """
    if task_name not in available_tasks():
        raise ValueError(f"unknown task {task_name!r}; available tasks: {available_tasks()}")
    return _derived_class(task_name, "TokenVectorEnv" if vector else "TokenEnv")


def __getattr__(name: str) -> TokenEnvClass:
    """``ModArithTokenEnv``, ``BitsTokenVectorEnv``, ...: the per-task classes, by name."""
    for task_name in available_tasks():
        stem = task_env_stem(task_name)
        for suffix in _TASK_ENV_KINDS:
            if name == stem + suffix:
                return _derived_class(task_name, suffix)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    derived = [task_env_stem(t) + suffix for t in available_tasks() for suffix in _TASK_ENV_KINDS]
    return sorted([*globals(), *derived])
