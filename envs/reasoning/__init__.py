"""Synthetic reasoning tasks with binary verifiers: text view, tokenizer and token-level envs.

- :mod:`envs.reasoning.tasks`: ``make_task(name, **knobs)``, ``available_tasks()``; tasks have
  ``sample(rng) -> (prompt, answer)``, ``sample_batch(rng, n)``, ``verify(answer, completion)``;
  the ``bits`` task enumerates its outcome space for exact sequence-level expectations.
- :mod:`envs.reasoning.verify`: the final-answer rule and the eval-free arithmetic parser.
- :mod:`envs.reasoning.tokenizer`: :class:`CharTokenizer`.
- :mod:`envs.reasoning.token_env`: :class:`ReasoningTokenEnv` / :class:`ReasoningTokenVectorEnv`
  and one subclass of each per task (registered as ``sandbox/Reasoning-<Task>-v0``).

Only numpy, gymnasium and the standard library are used.
"""

from __future__ import annotations

from envs.reasoning.tasks import (
    DEFAULT_TOKENIZER,
    MAX_ENUMERATION_LEN,
    AdditionTask,
    BitsTask,
    BooleanTask,
    CountdownTask,
    ModArithTask,
    ParityTask,
    ReasoningTask,
    SequenceTask,
    available_tasks,
    make_task,
    register_task,
)
from envs.reasoning.token_env import ReasoningTokenEnv, ReasoningTokenVectorEnv
from envs.reasoning.tokenizer import DEFAULT_CHARS, CharTokenizer
from envs.reasoning.verify import ExpressionError, parse_arithmetic

__all__ = [
    "DEFAULT_CHARS",
    "DEFAULT_TOKENIZER",
    "MAX_ENUMERATION_LEN",
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
    "available_tasks",
    "make_task",
    "parse_arithmetic",
    "register_task",
]
