"""Synthetic reasoning tasks with binary verifiers: text view, tokenizer and token-level envs.

- :mod:`envs.reasoning.tasks`: ``make_task(name, **knobs)``, ``available_tasks()``,
  ``@register_task(name)`` (all a new task needs: it also registers the task's Gymnasium id
  ``task_env_id(name)``, ``sandbox/Reasoning-<Stem>-v0``); tasks have
  ``sample(rng) -> (prompt, answer)``, ``sample_batch(rng, n)``, ``verify(answer, completion)``,
  both samplers with ``split="train"`` / ``"test"`` for disjoint partitions (``problem_split``);
  the ``bits`` task enumerates its outcome space for exact sequence-level expectations.
- :mod:`envs.reasoning.verify`: the final-answer rule and the eval-free arithmetic parser.
- :mod:`envs.reasoning.tokenizer`: :class:`CharTokenizer`.
- :mod:`envs.reasoning.token_env`: :class:`ReasoningTokenEnv` / :class:`ReasoningTokenVectorEnv`
  and one subclass of each per registered task (``ModArithTokenEnv``, ...;
  ``task_env_class(name)``), derived from the task registry on first use: the entry points of
  ``sandbox/Reasoning-<Stem>-v0``.

Only numpy, gymnasium and the standard library are used.
"""

from __future__ import annotations

from envs.reasoning.tasks import (
    DEFAULT_TOKENIZER,
    MAX_ENUMERATION_LEN,
    SPLITS,
    AdditionTask,
    BitsTask,
    BooleanTask,
    CountdownTask,
    ModArithTask,
    ParityTask,
    ReasoningTask,
    SequenceTask,
    answer_baselines,
    available_tasks,
    make_task,
    problem_split,
    register_task,
    task_env_id,
    task_env_stem,
    unregister_task,
)
from envs.reasoning.token_env import ReasoningTokenEnv, ReasoningTokenVectorEnv, task_env_class
from envs.reasoning.tokenizer import DEFAULT_CHARS, CharTokenizer
from envs.reasoning.verify import ExpressionError, parse_arithmetic

__all__ = [
    "DEFAULT_CHARS",
    "DEFAULT_TOKENIZER",
    "MAX_ENUMERATION_LEN",
    "SPLITS",
    "AdditionTask",
    "BitsTask",
    "BooleanTask",
    "CharTokenizer",
    "CountdownTask",
    "ExpressionError",
    "ModArithTask",
    "ParityTask",
    "ReasoningTask",
    "ReasoningTokenEnv",
    "ReasoningTokenVectorEnv",
    "SequenceTask",
    "answer_baselines",
    "available_tasks",
    "make_task",
    "parse_arithmetic",
    "problem_split",
    "register_task",
    "task_env_class",
    "task_env_id",
    "task_env_stem",
    "unregister_task",
]
