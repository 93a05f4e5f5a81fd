"""Procedurally generated reasoning tasks with binary verifiers and difficulty knobs.

Every task has a text view, shared by the toy token envs and by ``llm``::

    from envs.reasoning import make_task, available_tasks

    task = make_task("mod_arith", steps=3, modulus=7)
    prompt, answer = task.sample(np.random.default_rng(0))
    # prompt: "Compute (((8 + 6) + 5) + 2) mod 7. Answer:"   answer: "0"
    task.verify(answer, " 0")                 # 1.0
    task.verify(answer, "so \\boxed{21}")     # 0.0 (the rule reads 21; 21 != 0)
    task.sample_batch(rng, 64)                # (64 prompts, 64 answers)

``verify(answer, completion)`` returns 1.0 or 0.0 and never raises on a bad completion (any
object, empty, huge, unicode); the final-answer rule is documented in
:mod:`envs.reasoning.verify`. ``answer`` must come from ``sample`` (a malformed one raises a
``ValueError``).

| name        | kind       | knobs (default, range)                                                  |
|-------------|------------|-------------------------------------------------------------------------|
| mod_arith   | integer    | steps (2, 1-32), modulus (7, 2-10**6), max_operand (9, 1-10**6), ops    |
| addition    | integer    | digits (3, 1-50), num_terms (2, 2-10)                                   |
| parity      | integer    | length (8, 1-64), mode ("parity" or "count")                           |
| sequence    | string     | op ("reverse", "copy", "sort"), length (5, 1-32), alphabet              |
| countdown   | expression | num_numbers (4, 2-6), max_number (10, 2-1000)                           |
| boolean     | integer    | depth (2, 1-6), ops (("and", "or", "xor"))                              |
| bits        | string     | op ("reverse", "copy", "sort", "parity"), length (3, 1-16); enumerable  |

Token view: ``task.tokenizer`` (a :class:`~envs.reasoning.tokenizer.CharTokenizer`),
``task.encode_prompt(prompt)`` (``[<bos>] + ids``), ``task.decode_completion(ids)`` and the
bounds ``max_prompt_tokens`` / ``max_answer_len`` size the token envs' buffers.
``task.completion_token_ids`` lists the ids an answer can use (plus ``<eos>``), for trainers
that restrict their output layer. :class:`BitsTask` additionally enumerates its whole outcome
space (see its docstring).

Adding a task is one registration: subclass :class:`ReasoningTask` (``answer_kind``,
``knob_names``, ``answer_chars``, the bounds ``max_prompt_len`` / ``max_answer_len`` and
``_sample``) and decorate it with ``@register_task("my_task")``. The decorator also registers
the Gymnasium id ``sandbox/Reasoning-MyTask-v0`` (:func:`task_env_id`), whose token envs
``MyTaskTokenEnv`` / ``MyTaskTokenVectorEnv`` :mod:`envs.reasoning.token_env` derives from the
task; the registry-parametrised tests then cover it (``check_env`` included).

Randomness: ``sample`` and ``sample_batch`` draw only from the ``rng`` passed in, so a seed fixes
the problem sequence. ``sample_batch(rng, n)`` follows the same distribution as ``n`` calls of
``sample`` but not necessarily the same stream.

Train and test partitions: every problem belongs to one of :data:`SPLITS` by a stable hash of its
prompt text (:func:`problem_split`), so the two are disjoint by construction, for every task and
every seed. ``sample(rng, split="test")`` and ``sample_batch(rng, n, split="train")`` draw from one
partition (the task's distribution restricted to it); ``split=None`` (the default) draws from all
problems, the same stream as before partitions existed::

    train, _ = task.sample_batch(rng, 64, split="train")
    test, _ = task.sample_batch(rng, 64, split="test")   # no prompt of test is in any train draw
"""

from __future__ import annotations

import abc
import hashlib
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np
import numpy.typing as npt

from envs.reasoning.tokenizer import CharTokenizer
from envs.reasoning.verify import (
    ExpressionError,
    canonical_integer,
    extract_expression,
    extract_integer,
    extract_word,
    parse_arithmetic,
)

__all__ = [
    "DEFAULT_TOKENIZER",
    "MAX_ENUMERATION_LEN",
    "SPLITS",
    "AdditionTask",
    "BitsTask",
    "BooleanTask",
    "CountdownTask",
    "ModArithTask",
    "ParityTask",
    "ReasoningTask",
    "SequenceTask",
    "available_tasks",
    "make_task",
    "problem_split",
    "register_task",
    "task_env_id",
    "task_env_stem",
    "unregister_task",
]

IntArray = npt.NDArray[np.int64]

#: The tokenizer of every task but the tiny-vocabulary one.
DEFAULT_TOKENIZER = CharTokenizer()

_TASKS: dict[str, type[ReasoningTask]] = {}
#: Task names: lower-case words joined by ``_``, each word starting with a letter, so that the
#: CamelCase stem of the env id and class names (:func:`task_env_stem`) is unique per task.
_TASK_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z][a-z0-9]*)*")
_TOKEN_ENV_MODULE = "envs.reasoning.token_env"


def register_task(name: str) -> Callable[[type[ReasoningTask]], type[ReasoningTask]]:
    """Class decorator: make ``cls`` available as ``make_task(name, ...)`` and as a token env.

    This is all a new task needs: the decorator also registers the Gymnasium id
    :func:`task_env_id` (``"mod_arith"`` -> ``sandbox/Reasoning-ModArith-v0``) with the entry
    points ``envs.reasoning.token_env:<Stem>TokenEnv`` and ``...:<Stem>TokenVectorEnv``, classes
    that :mod:`envs.reasoning.token_env` derives from the task on first use. ``name`` is
    lower-case words joined by ``_`` (``[a-z][a-z0-9]*``, each word starting with a letter).
    """
    if not isinstance(name, str) or not _TASK_NAME.fullmatch(name):
        raise ValueError(
            f"name must be lower-case words joined by '_', each starting with a letter; got {name!r}"
        )

    def decorator(cls: type[ReasoningTask]) -> type[ReasoningTask]:
        if name in _TASKS:
            raise ValueError(f"task {name!r} is already registered")
        cls.name = name
        _TASKS[name] = cls
        env_id, stem = task_env_id(name), task_env_stem(name)
        if env_id not in gymnasium.registry:  # a module reload re-runs the decorators
            gymnasium.register(
                id=env_id,
                entry_point=f"{_TOKEN_ENV_MODULE}:{stem}TokenEnv",
                vector_entry_point=f"{_TOKEN_ENV_MODULE}:{stem}TokenVectorEnv",
            )
        return cls

    return decorator


def unregister_task(name: str) -> None:
    """Undo :func:`register_task`: remove task ``name`` and its Gymnasium id (tests, notebooks)."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {available_tasks()}")
    del _TASKS[name]
    gymnasium.registry.pop(task_env_id(name), None)


def task_env_stem(name: str) -> str:
    """``"mod_arith"`` -> ``"ModArith"``: the stem of the task's env id and env class names."""
    return "".join(word.capitalize() for word in name.split("_"))


def task_env_id(name: str) -> str:
    """The Gymnasium id of task ``name``'s token env: ``sandbox/Reasoning-<Stem>-v0``."""
    return f"sandbox/Reasoning-{task_env_stem(name)}-v0"


def available_tasks() -> list[str]:
    """Names of every registered task, sorted."""
    return sorted(_TASKS)


def make_task(name: str, **knobs: Any) -> ReasoningTask:
    """The task ``name`` with difficulty ``knobs``; ValueError for unknown names or knobs."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {available_tasks()}")
    cls = _TASKS[name]
    unknown = sorted(set(knobs) - set(cls.knob_names))
    if unknown:
        raise ValueError(
            f"unknown knob(s) {unknown} for task {name!r}; valid knobs: {list(cls.knob_names)}"
        )
    return cls(**knobs)


def answer_baselines(task: ReasoningTask, answers: Sequence[str]) -> dict[str, Any]:
    """What a policy that ignores the prompt scores on problems with reference ``answers``
    (checked by the task's own verifier, so tasks with several right answers count right):

    - ``constant``: always writing the one answer that is right most often (``constant_answer``);
    - ``prior``: writing an answer drawn from the answers' own frequencies f_c, sum_c f_c x
      (share of problems that answer c solves) (= sum_c f_c^2 for exact-match tasks).

    A trained policy whose pass@1 does not clear these has learned the answer distribution, not
    the task (the claims study's headroom rule). ``ValueError`` for no answers."""
    if not answers:
        raise ValueError("answers: need at least one reference answer")
    counts: dict[str, int] = {}
    for a in answers:
        counts[a] = counts.get(a, 0) + 1
    n = len(answers)
    solved = {
        c: sum(task.verify(a, task.format_completion(c)) for a in answers) / n for c in counts
    }
    best = max(sorted(solved), key=lambda c: solved[c])  # ties: the first in sorted order
    prior = sum(counts[c] / n * solved[c] for c in counts)
    return {"constant": solved[best], "constant_answer": best, "prior": prior}


# --------------------------------------------------------------------------------------------
# knob validation
# --------------------------------------------------------------------------------------------


def _int_knob(name: str, value: Any, low: int, high: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or not low <= value <= high
    ):
        raise ValueError(f"{name} must be an integer in [{low}, {high}]; got {value!r}")
    return int(value)


def _choice_knob(name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}")
    return value


def _subset_knob(name: str, value: Any, choices: Sequence[str]) -> tuple[str, ...]:
    items = tuple(value) if isinstance(value, list | tuple) else (value,)
    if not items or any(not isinstance(v, str) or v not in choices for v in items):
        raise ValueError(f"{name} must be a non-empty subset of {list(choices)}; got {value!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"{name} must not repeat an entry; got {value!r}")
    return items


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    return rng


def _check_answer(answer: Any) -> str:
    if not isinstance(answer, str) or not answer:
        raise ValueError(f"answer must be a non-empty str from task.sample; got {answer!r}")
    return answer


#: The partitions of every task's problems (:func:`problem_split`).
SPLITS = ("train", "test")
#: Draws in a row that may fall outside the wanted partition before sampling gives up: a
#: partition that rare is (nearly) empty, e.g. one of the two prompts of ``bits`` length 1.
MAX_SPLIT_REJECTS = 10_000


def problem_split(prompt: str) -> str:
    """The partition of the problem ``prompt``: ``"train"`` or ``"test"``, by the last bit of its
    text's BLAKE2b hash (the same on every machine and Python version, unlike ``hash``). About
    half the problems fall in each; the partition is a property of the problem alone, so every
    seed, rule and rung agrees on it and the two never share a problem."""
    digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
    return SPLITS[digest[-1] & 1]


def _check_split(split: Any) -> str | None:
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)} or None; got {split!r}")
    return split


def _digits_string(rng: np.random.Generator, length: int, alphabet: str) -> str:
    return "".join(alphabet[i] for i in rng.integers(len(alphabet), size=length))


# --------------------------------------------------------------------------------------------
# base class
# --------------------------------------------------------------------------------------------


class ReasoningTask(abc.ABC):
    """A problem generator with a binary verifier; see the module docstring for the contract.

    Subclasses define ``knob_names``, ``answer_kind``, ``answer_chars``, ``max_prompt_len`` and
    ``max_answer_len`` (bounds over every sample, in characters) and ``_sample``.
    """

    name: ClassVar[str] = ""
    #: "integer", "string" or "expression": selects the final-answer rule (envs.reasoning.verify).
    answer_kind: ClassVar[str]
    knob_names: ClassVar[tuple[str, ...]] = ()
    #: The tokenizer of the token view.
    tokenizer: CharTokenizer = DEFAULT_TOKENIZER
    #: Every character an answer may contain.
    answer_chars: str
    #: Upper bounds, in characters, on ``len(prompt)`` and ``len(answer)`` over all samples.
    max_prompt_len: int
    max_answer_len: int

    @property
    def knobs(self) -> dict[str, Any]:
        """The knob values of this instance (JSON-friendly)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self._knobs().items()}

    def _knobs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.knob_names}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._knobs().items())
        return f"make_task({self.name!r}, {args})" if args else f"make_task({self.name!r})"

    # -- text view ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        """One (prompt, answer) pair drawn from ``rng``."""

    def sample(self, rng: np.random.Generator, split: str | None = None) -> tuple[str, str]:
        """One problem: ``(prompt, answer)``, the prompt ending in ``"Answer:"``; from the
        partition ``split`` (:data:`SPLITS`; None: any problem)."""
        return self._draw(_check_rng(rng), _check_split(split))

    def sample_batch(
        self, rng: np.random.Generator, n: int, split: str | None = None
    ) -> tuple[list[str], list[str]]:
        """``n`` problems: ``(prompts, answers)``, two lists of length ``n``; from the partition
        ``split`` (:data:`SPLITS`; None: any problem)."""
        rng, split = _check_rng(rng), _check_split(split)
        n = _int_knob("n", n, 0, 10**9)
        pairs = [self._draw(rng, split) for _ in range(n)]
        return [p for p, _ in pairs], [a for _, a in pairs]

    def _draw(self, rng: np.random.Generator, split: str | None) -> tuple[str, str]:
        """One problem of ``split`` by rejection (the task's distribution within the partition);
        a ``ValueError`` naming the split when :data:`MAX_SPLIT_REJECTS` draws in a row miss it."""
        for _ in range(MAX_SPLIT_REJECTS if split is not None else 1):
            prompt, answer = self._sample(rng)
            if split is None or problem_split(prompt) == split:
                return prompt, answer
        raise ValueError(
            f"split: no {split!r} problem in {MAX_SPLIT_REJECTS} draws of {self!r}; its problems "
            "are too few to partition (a harder knob setting has more)"
        )

    def extract_answer(self, completion: Any) -> str | None:
        """The candidate answer of ``completion`` under this task's rule, or None."""
        if self.answer_kind == "integer":
            return extract_integer(completion)
        if self.answer_kind == "string":
            return extract_word(completion)
        return extract_expression(completion)

    def verify(self, answer: str, completion: Any) -> float:
        """1.0 if ``completion``'s final answer is correct for ``answer``, else 0.0."""
        answer = _check_answer(answer)
        candidate = self.extract_answer(completion)
        if candidate is None:
            return 0.0
        if self.answer_kind == "integer":
            return float(candidate == canonical_integer(answer))
        return float(candidate == answer)

    def format_completion(self, answer: str) -> str:
        """A completion that states ``answer`` in the tokens a token-level policy would emit."""
        return _check_answer(answer)

    # -- token view --------------------------------------------------------------------------

    @property
    def max_prompt_tokens(self) -> int:
        """Upper bound on ``len(encode_prompt(prompt))``."""
        return self.max_prompt_len + 1

    @property
    def completion_token_ids(self) -> tuple[int, ...]:
        """``<eos>`` and the ids of ``answer_chars``, sorted: the ids a correct answer uses."""
        ids = {self.tokenizer.eos_id, *self.tokenizer.encode(self.answer_chars)}
        return tuple(sorted(ids))

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of ``prompt`` for the token view: ``[<bos>] + tokenizer.encode(prompt)``."""
        return self.tokenizer.encode(prompt, add_bos=True)

    def decode_completion(self, completion_ids: Any) -> str:
        """Text of ``completion_ids`` up to (not including) the first ``<eos>``; pad/bos dropped."""
        ids = list(np.asarray(completion_ids, dtype=np.int64).reshape(-1))
        if self.tokenizer.eos_id in ids:
            ids = ids[: ids.index(self.tokenizer.eos_id)]
        return self.tokenizer.decode(ids)


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------

_DIGITS = "0123456789"
_INTEGER_CHARS = "-0123456789"


@register_task("mod_arith")
class ModArithTask(ReasoningTask):
    """Multi-step modular arithmetic: ``Compute (((a op b) op c) op d) mod m. Answer:``.

    The operations apply left to right (the parentheses say so); the answer is the value mod
    ``modulus`` in ``[0, modulus)``.

    Knobs: ``steps`` (operations, 1-32, default 2), ``modulus`` (2-10**6, default 7),
    ``max_operand`` (operands uniform in [0, max_operand], 1-10**6, default 9), ``ops``
    (subset of ``("+", "-", "*")``, default all; each step draws one uniformly).
    """

    answer_kind = "integer"
    knob_names = ("steps", "modulus", "max_operand", "ops")
    answer_chars = _DIGITS

    def __init__(
        self,
        steps: int = 2,
        modulus: int = 7,
        max_operand: int = 9,
        ops: Sequence[str] = ("+", "-", "*"),
    ) -> None:
        self.steps = _int_knob("steps", steps, 1, 32)
        self.modulus = _int_knob("modulus", modulus, 2, 10**6)
        self.max_operand = _int_knob("max_operand", max_operand, 1, 10**6)
        self.ops = _subset_knob("ops", ops, ("+", "-", "*"))
        worst = self._render([self.max_operand] * (self.steps + 1), ["+"] * self.steps)
        self.max_prompt_len = len(worst)
        self.max_answer_len = len(str(self.modulus - 1))

    def _render(self, operands: Sequence[int], ops: Sequence[str]) -> str:
        expression = str(operands[0])
        for op, operand in zip(ops, operands[1:], strict=True):
            expression = f"({expression} {op} {operand})"
        return f"Compute {expression} mod {self.modulus}. Answer:"

    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        operands = [int(x) for x in rng.integers(0, self.max_operand + 1, size=self.steps + 1)]
        ops = [self.ops[i] for i in rng.integers(len(self.ops), size=self.steps)]
        value = operands[0]
        for op, operand in zip(ops, operands[1:], strict=True):
            if op == "+":
                value += operand
            elif op == "-":
                value -= operand
            else:
                value *= operand
            value %= self.modulus  # same result as reducing at the end, smaller numbers
        return self._render(operands, ops), str(value)


@register_task("addition")
class AdditionTask(ReasoningTask):
    """Multi-digit addition: ``Compute 123 + 456. Answer:``.

    Knobs: ``digits`` (every operand has exactly this many digits, 1-50; with 1 the operands
    are 0-9; default 3), ``num_terms`` (operands, 2-10, default 2).
    """

    answer_kind = "integer"
    knob_names = ("digits", "num_terms")
    answer_chars = _DIGITS

    def __init__(self, digits: int = 3, num_terms: int = 2) -> None:
        self.digits = _int_knob("digits", digits, 1, 50)
        self.num_terms = _int_knob("num_terms", num_terms, 2, 10)
        self.max_prompt_len = len(self._render(["9" * self.digits] * self.num_terms))
        self.max_answer_len = len(str(self.num_terms * (10**self.digits - 1)))

    @staticmethod
    def _render(operands: Sequence[str]) -> str:
        return f"Compute {' + '.join(operands)}. Answer:"

    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        operands = []
        for _ in range(self.num_terms):
            if self.digits == 1:
                operands.append(str(int(rng.integers(10))))
            else:
                lead = str(int(rng.integers(1, 10)))
                operands.append(lead + _digits_string(rng, self.digits - 1, _DIGITS))
        return self._render(operands), str(sum(int(x) for x in operands))


@register_task("parity")
class ParityTask(ReasoningTask):
    """Parity or count of ones in a random bit string.

    ``mode="parity"``: ``What is the parity (number of 1s mod 2) of the bits 10110? Answer:`` ->
    ``"1"``; ``mode="count"``: ``How many 1s are in the bits 10110? Answer:`` -> ``"3"``.

    Knobs: ``length`` (bits, 1-64, default 8), ``mode`` (``"parity"`` (default) or ``"count"``).
    """

    answer_kind = "integer"
    knob_names = ("length", "mode")
    answer_chars = _DIGITS

    def __init__(self, length: int = 8, mode: str = "parity") -> None:
        self.length = _int_knob("length", length, 1, 64)
        self.mode = _choice_knob("mode", mode, ("parity", "count"))
        self.max_prompt_len = len(self._render("1" * self.length))
        self.max_answer_len = 1 if self.mode == "parity" else len(str(self.length))

    def _render(self, bits: str) -> str:
        if self.mode == "parity":
            return f"What is the parity (number of 1s mod 2) of the bits {bits}? Answer:"
        return f"How many 1s are in the bits {bits}? Answer:"

    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        bits = _digits_string(rng, self.length, "01")
        ones = bits.count("1")
        return self._render(bits), str(ones % 2 if self.mode == "parity" else ones)


_ALPHABETS = {"digits": _DIGITS, "letters": "abcdefghijklmnopqrstuvwxyz", "binary": "01"}


def _transform(op: str, text: str) -> str:
    if op == "copy":
        return text
    if op == "reverse":
        return text[::-1]
    if op == "sort":
        return "".join(sorted(text))
    return str(text.count("1") % 2)  # parity


@register_task("sequence")
class SequenceTask(ReasoningTask):
    """Copy, reverse or sort a random string: ``Reverse the sequence 31415. Answer:`` -> ``51413``.

    Answers are compared as one word (no separators). Knobs: ``op`` (``"reverse"`` (default),
    ``"copy"`` or ``"sort"``, ascending by character), ``length`` (1-32, default 5),
    ``alphabet`` (``"digits"`` (default), ``"letters"`` (a-z) or ``"binary"``).
    """

    answer_kind = "string"
    knob_names = ("op", "length", "alphabet")
    _TEMPLATES: ClassVar[dict[str, str]] = {
        "copy": "Copy the sequence {}. Answer:",
        "reverse": "Reverse the sequence {}. Answer:",
        "sort": "Sort the characters of {} in ascending order. Answer:",
    }

    def __init__(self, op: str = "reverse", length: int = 5, alphabet: str = "digits") -> None:
        self.op = _choice_knob("op", op, tuple(self._TEMPLATES))
        self.length = _int_knob("length", length, 1, 32)
        self.alphabet = _choice_knob("alphabet", alphabet, tuple(_ALPHABETS))
        self.answer_chars = _ALPHABETS[self.alphabet]
        self.max_prompt_len = len(self._TEMPLATES[self.op].format("x" * self.length))
        self.max_answer_len = self.length

    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        text = _digits_string(rng, self.length, self.answer_chars)
        return self._TEMPLATES[self.op].format(text), _transform(self.op, text)


@register_task("countdown")
class CountdownTask(ReasoningTask):
    """Reach a target from given numbers with ``+ - *`` and parentheses, each number at most once.

    ``Using the numbers 3, 5, 2, 7, each at most once, with + - * and parentheses, make 16.
    Answer:``. The generator combines all numbers in a random binary tree (a ``-`` always takes
    the larger operand first and turns into ``+`` on a tie, so every intermediate value and the
    target are >= 1) and returns that expression, parenthesised only where precedence needs it (e.g.
    ``"(3 + 5) * 2 - 7"``), as the answer. The verifier accepts any expression (see
    :func:`envs.reasoning.verify.parse_arithmetic`; ``"... = 16"`` is fine) whose numbers form a
    sub-multiset of the given ones and whose value is the target; it reads numbers and target
    from the reference answer, which uses every number.

    Knobs: ``num_numbers`` (2-6, default 4), ``max_number`` (numbers uniform in [1, max_number],
    2-1000, default 10).
    """

    answer_kind = "expression"
    knob_names = ("num_numbers", "max_number")
    answer_chars = "0123456789+-*() "

    def __init__(self, num_numbers: int = 4, max_number: int = 10) -> None:
        self.num_numbers = _int_knob("num_numbers", num_numbers, 2, 6)
        self.max_number = _int_knob("max_number", max_number, 2, 1000)
        n, width = self.num_numbers, len(str(self.max_number))
        # |value| <= prod(x + 1) - 1 by induction over the tree (for x >= 1 and + - *)
        max_target = (self.max_number + 1) ** n - 1
        self.max_prompt_len = len(self._render(["9" * width] * n, max_target))
        # n numbers, n - 1 operators " ? ", at most n - 2 pairs of parentheses
        self.max_answer_len = n * width + 3 * (n - 1) + 2 * max(n - 2, 0)

    @staticmethod
    def _render(numbers: Sequence[str], target: int) -> str:
        return (
            f"Using the numbers {', '.join(numbers)}, each at most once, with + - * and "
            f"parentheses, make {target}. Answer:"
        )

    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        numbers = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
        # nodes: (text, value, precedence); atoms 3, products 2, sums/differences 1
        nodes: list[tuple[str, int, int]] = [(str(x), x, 3) for x in numbers]
        while len(nodes) > 1:
            i, j = (int(k) for k in rng.choice(len(nodes), size=2, replace=False))
            left, right = nodes[i], nodes[j]
            nodes = [node for k, node in enumerate(nodes) if k not in (i, j)]
            op = "+-*"[int(rng.integers(3))]
            if op == "-":
                if left[1] < right[1]:
                    left, right = right, left
                if left[1] == right[1]:
                    op = "+"
            nodes.append(_combine(left, op, right))
        return self._render([str(x) for x in numbers], nodes[0][1]), nodes[0][0]

    def _reference(self, answer: str) -> tuple[int, list[int]]:
        try:
            return parse_arithmetic(answer)
        except ExpressionError as exc:
            raise ValueError(
                f"answer must be a countdown answer from sample; got {answer!r}"
            ) from exc

    def verify(self, answer: str, completion: Any) -> float:
        target, numbers = self._reference(_check_answer(answer))
        expression = self.extract_answer(completion)
        if expression is None:
            return 0.0
        try:
            value, used = parse_arithmetic(expression)
        except ExpressionError:
            return 0.0
        available = {x: numbers.count(x) for x in numbers}
        if any(used.count(x) > available.get(x, 0) for x in set(used)):
            return 0.0
        return float(value == target)


def _combine(
    left: tuple[str, int, int], op: str, right: tuple[str, int, int]
) -> tuple[str, int, int]:
    """``left op right`` with parentheses only where precedence needs them."""
    precedence = 2 if op == "*" else 1
    left_text = f"({left[0]})" if left[2] < precedence else left[0]
    needs_right = right[2] < precedence or (op == "-" and right[2] == 1)
    right_text = f"({right[0]})" if needs_right else right[0]
    value = (
        left[1] + right[1] if op == "+" else left[1] - right[1] if op == "-" else left[1] * right[1]
    )
    return f"{left_text} {op} {right_text}", value, precedence


_BOOLEAN_OPS: dict[str, Callable[[int, int], int]] = {
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
}


@register_task("boolean")
class BooleanTask(ReasoningTask):
    """Evaluate a boolean formula over constants: ``(1 and not 0) xor 1`` -> ``"0"``.

    The formula is a full binary tree of ``depth`` levels of binary operators over 0/1 leaves;
    every node (leaf or operator) is negated with ``not`` with probability 1/4. Prompt:
    ``Evaluate the boolean expression (1 and not 0) xor 1, where 1 is true and 0 is false.
    Answer:``; answer ``"1"`` or ``"0"``.

    Knobs: ``depth`` (1-6, default 2; 2**depth leaves), ``ops`` (subset of
    ``("and", "or", "xor")``, default all).
    """

    answer_kind = "integer"
    knob_names = ("depth", "ops")
    answer_chars = "01"
    not_probability: ClassVar[float] = 0.25

    def __init__(self, depth: int = 2, ops: Sequence[str] = ("and", "or", "xor")) -> None:
        self.depth = _int_knob("depth", depth, 1, 6)
        self.ops = _subset_knob("ops", ops, tuple(_BOOLEAN_OPS))
        worst_op = max(self.ops, key=len)
        self.max_prompt_len = len(self._render(self._worst_tree(self.depth, worst_op)[0]))
        self.max_answer_len = 1

    @staticmethod
    def _render(formula: str) -> str:
        return f"Evaluate the boolean expression {formula}, where 1 is true and 0 is false. Answer:"

    @staticmethod
    def _node(text: str, is_leaf: bool, negate: bool, top: bool) -> str:
        if negate:
            return f"not {text}" if is_leaf else f"not ({text})"
        return text if is_leaf or top else f"({text})"

    def _worst_tree(self, depth: int, op: str, top: bool = True) -> tuple[str, int]:
        if depth == 0:
            return self._node("1", True, True, top), 0
        left, _ = self._worst_tree(depth - 1, op, False)
        right, _ = self._worst_tree(depth - 1, op, False)
        return self._node(f"{left} {op} {right}", False, True, top), 0

    def _tree(self, rng: np.random.Generator, depth: int, top: bool) -> tuple[str, int]:
        if depth == 0:
            value = int(rng.integers(2))
            text, is_leaf = str(value), True
        else:
            left, left_value = self._tree(rng, depth - 1, False)
            right, right_value = self._tree(rng, depth - 1, False)
            op = self.ops[int(rng.integers(len(self.ops)))]
            value = _BOOLEAN_OPS[op](left_value, right_value)
            text, is_leaf = f"{left} {op} {right}", False
        negate = bool(rng.random() < self.not_probability)
        return self._node(text, is_leaf, negate, top), value ^ int(negate)

    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        formula, value = self._tree(rng, self.depth, True)
        return self._render(formula), str(value)


# --------------------------------------------------------------------------------------------
# the enumerable task
# --------------------------------------------------------------------------------------------

_BITS_TOKENIZER = CharTokenizer("01")
_BITS_PROMPT = re.compile(r"bits ([01]+)")
#: Largest ``max_len`` that :meth:`BitsTask.enumerate_completions` accepts (2**17 - 1 sequences).
MAX_ENUMERATION_LEN = 16
#: The longest bit string of the ``bits`` task, and the longest it enumerates exactly.
MAX_BITS, MAX_ENUMERABLE_BITS = 16, 8


@register_task("bits")
class BitsTask(ReasoningTask):
    """Tiny-vocabulary bit-string tasks whose whole outcome space can be enumerated.

    Text view: ``Reverse the bits 0111. Answer:`` -> ``"1110"``;
    ``op`` is ``"reverse"`` (default), ``"copy"``, ``"sort"`` (zeros then ones) or ``"parity"``
    (``"0"``/``"1"``). Answers are compared exactly as one word.

    Token view (tokenizer ``CharTokenizer("01")``: ``<pad>=0, <bos>=1, <eos>=2, "0"=3, "1"=4``):
    the prompt is ``[<bos>] + bits`` (``length + 1`` ids, the op is fixed by the task); a
    completion is a sequence over ``completion_token_ids == (2, 3, 4)``, read up to its first
    ``<eos>``; ``<pad>``/``<bos>`` before it are ignored (a policy for exact enumeration must give
    them probability 0). The reward is 1 iff the bits before ``<eos>`` equal the answer.

    Outcome space: with maximum completion length T, the complete sequences are the k-bit strings
    followed by ``<eos>`` (k < T) and the T-bit strings without ``<eos>``, so there are
    ``sum_{k<T} 2^k + 2^T = 2^(T+1) - 1`` of them (:meth:`num_completions`), and exactly one is
    correct for each prompt when the answer length A <= T (none otherwise):

    ============  ==  ==  ==  ==  ==  ===  ===  ===  ====  ====  ====  =======
    T             1   2   3   4   5   6    7    8    9     10    12    16
    sequences     3   7   15  31  63  127  255  511  1023  2047  8191  131071
    ============  ==  ==  ==  ==  ==  ===  ===  ===  ====  ====  ====  =======

    Per knob setting there are ``2^length`` prompts (uniform) and A = ``length`` (``1`` for
    parity); the token env's default T = A + 1 gives ``2^(length+2) - 1`` completions per prompt
    for copy/reverse/sort (length 1..8: 7, 15, 31, 63, 127, 255, 511, 1023) and 7 for parity,
    so the enumerable joint space has at most ``256 * 1023 = 261,888`` (prompt, completion)
    pairs: :meth:`enumerate_prompts` covers lengths up to :data:`MAX_ENUMERABLE_BITS` (8). Longer
    strings, up to 16 bits (65,536 prompts, 32,768-odd per partition), are for sampled training,
    where a held-out partition of thousands of problems is what a rung needs.

    Knobs: ``op``, ``length`` (1-16, default 3; exact enumeration up to 8).
    """

    answer_kind = "string"
    knob_names = ("op", "length")
    tokenizer = _BITS_TOKENIZER
    answer_chars = "01"
    _TEMPLATES: ClassVar[dict[str, str]] = {
        "copy": "Copy the bits {}. Answer:",
        "reverse": "Reverse the bits {}. Answer:",
        "sort": "Sort the bits {} in ascending order. Answer:",
        "parity": "What is the parity (number of 1s mod 2) of the bits {}? Answer:",
    }

    def __init__(self, op: str = "reverse", length: int = 3) -> None:
        self.op = _choice_knob("op", op, tuple(self._TEMPLATES))
        self.length = _int_knob("length", length, 1, MAX_BITS)
        self._splits: dict[str, IntArray] = {}
        self.max_prompt_len = len(self._TEMPLATES[self.op].format("0" * self.length))
        self.max_answer_len = 1 if self.op == "parity" else self.length
        self._zero = self.tokenizer.token_to_id["0"]
        self._one = self.tokenizer.token_to_id["1"]

    @property
    def answer_len(self) -> int:
        """A: the length of every answer, in tokens (without ``<eos>``)."""
        return self.max_answer_len

    @property
    def max_prompt_tokens(self) -> int:
        return self.length + 1

    # -- text view ---------------------------------------------------------------------------

    def _sample(self, rng: np.random.Generator) -> tuple[str, str]:
        bits = _digits_string(rng, self.length, "01")
        return self._TEMPLATES[self.op].format(bits), _transform(self.op, bits)

    def encode_prompt(self, prompt: str) -> list[int]:
        """``[<bos>] + ids of the bits`` read from the text prompt."""
        match = _BITS_PROMPT.search(prompt) if isinstance(prompt, str) else None
        if match is None or len(match.group(1)) != self.length:
            raise ValueError(f"prompt must be a {self.length}-bit 'bits' prompt; got {prompt!r}")
        return self.tokenizer.encode(match.group(1), add_bos=True)

    # -- token view: exact model --------------------------------------------------------------

    def _check_prompt_ids(self, prompt_ids: Any) -> IntArray:
        array = np.asarray(prompt_ids)
        if (
            array.ndim < 1
            or array.shape[-1] != self.length + 1
            or not np.issubdtype(array.dtype, np.integer)
            or np.any(array[..., 0] != self.tokenizer.bos_id)
            or np.any((array[..., 1:] != self._zero) & (array[..., 1:] != self._one))
        ):
            raise ValueError(
                f"prompt_ids must be [<bos>={self.tokenizer.bos_id}] + {self.length} bit ids "
                f"({self._zero}/{self._one}) on the last axis; got {prompt_ids!r}"
            )
        return array.astype(np.int64)

    def answer_ids(self, prompt_ids: Sequence[int]) -> tuple[int, ...]:
        """The correct completion's ids (without ``<eos>``) for one prompt."""
        bits = self.tokenizer.decode(self._check_prompt_ids(prompt_ids))
        return tuple(self.tokenizer.encode(_transform(self.op, bits)))

    def enumerate_prompts(self) -> list[tuple[int, ...]]:
        """All ``2**length`` prompts as id tuples, in binary counting order (uniformly likely);
        a ``ValueError`` naming ``length`` beyond :data:`MAX_ENUMERABLE_BITS`."""
        if self.length > MAX_ENUMERABLE_BITS:
            raise ValueError(
                f"length {self.length}: exact enumeration covers bit strings of at most "
                f"{MAX_ENUMERABLE_BITS} (2**{self.length} prompts); longer ones are for sampling"
            )
        return [
            (self.tokenizer.bos_id, *(self._one if b else self._zero for b in bits))
            for bits in itertools.product((0, 1), repeat=self.length)
        ]

    def num_completions(self, max_len: int) -> int:
        """``2**(max_len + 1) - 1``: the number of sequences :meth:`enumerate_completions` lists."""
        max_len = _int_knob("max_len", max_len, 1, MAX_ENUMERATION_LEN)
        return 2 ** (max_len + 1) - 1

    def num_correct_completions(self, max_len: int) -> int:
        """Correct sequences per prompt among :meth:`enumerate_completions`: 1 if A <= T, else 0."""
        max_len = _int_knob("max_len", max_len, 1, MAX_ENUMERATION_LEN)
        return int(self.answer_len <= max_len)

    def enumerate_completions(self, max_len: int) -> list[tuple[int, ...]]:
        """Every complete sequence over ``completion_token_ids`` of at most ``max_len`` tokens.

        That is, k bits then ``<eos>`` for k = 0 .. max_len - 1, then every max_len-bit string
        (ended by the length limit), each group in lexicographic order of the bit values.
        ``max_len`` is 1 .. :data:`MAX_ENUMERATION_LEN`.
        """
        max_len = _int_knob("max_len", max_len, 1, MAX_ENUMERATION_LEN)
        eos, symbols = self.tokenizer.eos_id, (self._zero, self._one)
        out: list[tuple[int, ...]] = []
        for k in range(max_len):
            out.extend((*bits, eos) for bits in itertools.product(symbols, repeat=k))
        out.extend(itertools.product(symbols, repeat=max_len))
        return out

    def enumerate_completions_array(self, max_len: int) -> tuple[IntArray, IntArray]:
        """:meth:`enumerate_completions` as ids ``[N, max_len]`` padded with ``<pad>``, and lengths
        ``[N]`` (counting the ``<eos>``), for vectorised log-probabilities."""
        sequences = self.enumerate_completions(max_len)
        ids = np.full((len(sequences), max_len), self.tokenizer.pad_id, dtype=np.int64)
        lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        for i, sequence in enumerate(sequences):
            ids[i, : len(sequence)] = sequence
        return ids, lengths

    def reward_ids(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        """Reward of one completion: ``verify(answer, decode_completion(completion_ids))``."""
        bits = self.tokenizer.decode(self._check_prompt_ids(prompt_ids))
        return self.verify(_transform(self.op, bits), self.decode_completion(completion_ids))

    def split_bits(self, split: str) -> IntArray:
        """The bit strings ``[M, length]`` whose prompts lie in the partition ``split``
        (:func:`problem_split` of their text prompts), in binary counting order."""
        split = _check_split(split)
        if split not in self._splits:  # 2**length hashes, once per task
            every = np.array(list(itertools.product((0, 1), repeat=self.length)), dtype=np.int64)
            template = self._TEMPLATES[self.op]
            part = [problem_split(template.format("".join(map(str, row)))) for row in every]
            for name in SPLITS:
                self._splits[name] = every[np.array([p == name for p in part], dtype=bool)]
                self._splits[name].setflags(write=False)
        return self._splits[split]

    def sample_ids_batch(
        self, rng: np.random.Generator, n: int, split: str | None = None
    ) -> tuple[IntArray, IntArray]:
        """``n`` prompts ``[n, length + 1]`` and their answers ``[n, A]`` as ids, vectorised;
        from the partition ``split`` (uniform over :meth:`split_bits`; None: any prompt)."""
        rng, split = _check_rng(rng), _check_split(split)
        n = _int_knob("n", n, 0, 10**9)
        if split is None:
            bits = rng.integers(2, size=(n, self.length))
        else:
            members = self.split_bits(split)
            if not len(members):
                raise ValueError(f"split: {self!r} has no {split!r} problem (too few to partition)")
            bits = members[rng.integers(len(members), size=n)]
        prompts = np.concatenate(
            [np.full((n, 1), self.tokenizer.bos_id), self._zero + bits], axis=1
        ).astype(np.int64)
        return prompts, self._answer_bits(bits) + self._zero

    def _answer_bits(self, bits: npt.NDArray[np.integer]) -> IntArray:
        if self.op == "copy":
            out = bits
        elif self.op == "reverse":
            out = bits[:, ::-1]
        elif self.op == "sort":
            out = np.sort(bits, axis=1)
        else:
            out = bits.sum(axis=1, keepdims=True) % 2
        return np.ascontiguousarray(out, dtype=np.int64)

    def reward_ids_batch(self, prompt_ids: Any, completion_ids: Any) -> npt.NDArray[np.float64]:
        """Vectorised :meth:`reward_ids`: prompts ``[n, length + 1]`` (or ``[length + 1]``,
        broadcast) and completions ``[n, T]`` (any T; tokens from the first ``<eos>`` on are
        ignored, so pad freely) -> rewards ``[n]`` float64."""
        prompts = self._check_prompt_ids(prompt_ids)
        completions = np.asarray(completion_ids)
        if completions.ndim != 2 or not np.issubdtype(completions.dtype, np.integer):
            raise ValueError(
                f"completion_ids must be a 2-d integer array [n, T]; got shape {completions.shape}"
            )
        vocab = self.tokenizer.vocab_size
        if completions.size and (completions.min() < 0 or completions.max() >= vocab):
            raise ValueError(f"completion_ids must lie in [0, {vocab})")
        n, width = completions.shape
        prompts = np.broadcast_to(prompts, (n, self.length + 1)) if prompts.ndim == 1 else prompts
        if prompts.shape != (n, self.length + 1):
            raise ValueError(
                f"prompt_ids must have shape ({n}, {self.length + 1}) to match completion_ids; "
                f"got {prompts.shape}"
            )
        answers = self._answer_bits(prompts[:, 1:] - self._zero) + self._zero  # [n, A]
        before_eos = np.cumsum(completions == self.tokenizer.eos_id, axis=1) == 0
        keep = before_eos & (completions != self.tokenizer.pad_id)
        keep &= completions != self.tokenizer.bos_id
        counts = keep.sum(axis=1)
        # left-align the kept tokens: row r's j-th kept token goes to compact[r, j]
        compact = np.full((n, max(width, self.answer_len)), -1, dtype=np.int64)
        rows, cols = np.nonzero(keep)
        compact[rows, (np.cumsum(keep, axis=1) - 1)[rows, cols]] = completions[rows, cols]
        match = np.all(compact[:, : self.answer_len] == answers, axis=1)
        return ((counts == self.answer_len) & match).astype(np.float64)
