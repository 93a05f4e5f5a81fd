"""Prompts and verifiers: an ``envs.reasoning`` task, or a JSONL / parquet file of rows.

A file holds one row per problem with a string ``prompt`` and an ``answer`` (string or number; a
GSM8K-style ``"reasoning #### 72"`` answer keeps the part after the last ``####``). Verifiers
(``--verifier``), each returning 1.0 or 0.0 and never raising on a completion:

============ ==============================================================================
task         the task's own verifier (``envs.reasoning``; default for ``--task``)
exact        final-answer segment (last ``\\boxed{}``, else the line after ``Answer:``, else the
             last line; :func:`envs.reasoning.verify.answer_segment`), normalised (case,
             whitespace, ``$``, surrounding punctuation), equal to the normalised answer
numeric      the last number of that segment (``1,234``, ``-3.5``, ``7/2``) equals the answer's
             number to 1e-6 relative
auto         ``task`` for a task; for a file ``numeric`` if every answer is a number, else
             ``exact``
math_verify  the ``math-verify`` package (``parse`` + ``verify``; extra ``llm``)
============ ==============================================================================

Prompt order: one ``numpy.random.Generator`` draws the step's prompts (tasks: ``sample_batch``;
files: row indices with replacement), the same on every rank, so its state is the only data state
a checkpoint needs.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.reasoning import available_tasks, make_task
from envs.reasoning.verify import answer_segment
from llm.streams import PromptStream, prompt_rng

VERIFIERS = ("auto", "task", "exact", "numeric", "math_verify")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def normalise(text: str) -> str:
    text = " ".join(str(text).replace("$", "").split()).lower()
    return text.strip(" .,;:!?\"'`()[]{}*")


def parse_number(text: str) -> float | None:
    """The value of a number written like ``1,234``, ``-3.5``, ``7/2`` (else None)."""
    text = text.replace(",", "").strip()
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


def exact_match(answer: str, completion: Any) -> float:
    segment = answer_segment(completion)
    return float(segment is not None and normalise(segment) == normalise(answer))


def numeric_match(answer: str, completion: Any) -> float:
    target = parse_number(answer)
    segment = answer_segment(completion)
    if target is None or segment is None:
        return 0.0
    found = _NUMBER.findall(segment)
    value = parse_number(found[-1]) if found else None
    return float(value is not None and math.isclose(value, target, rel_tol=1e-6, abs_tol=1e-9))


def math_verify_match(answer: str, completion: Any) -> float:
    from math_verify import parse, verify

    try:
        return float(bool(verify(parse(answer), parse(str(completion)))))
    except Exception:  # a verifier never raises on a completion
        return 0.0


@dataclass
class PromptSource:
    """Where prompts come from and how completions are scored."""

    name: str
    draw: Callable[[np.random.Generator, int], tuple[list[str], list[str]]]
    verify: Callable[[str, Any], float]
    eval_prompts: list[str]
    eval_answers: list[str]
    probe: list[str]  # prompts whose lengths are checked against the context before training


def _require_math_verify() -> None:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        raise ValueError(
            "--verifier math_verify needs the math-verify package: pip install 'clip-sandbox[llm]'"
        ) from None


def task_source(
    name: str, knobs: dict[str, Any], verifier: str, seed: int, n_eval: int, split: bool = False
) -> PromptSource:
    """A task's prompts: training draws ``task.sample_batch`` from the caller's generator, the
    ``n_eval`` held-out problems from their own stream of ``seed``. ``split``: training from the
    task's train partition, held-out from its test partition (disjoint by construction,
    :func:`envs.reasoning.problem_split`); else both from every problem."""
    if name not in available_tasks():
        raise ValueError(
            f"unknown --task {name!r}; available tasks: {', '.join(available_tasks())}"
        )
    task = make_task(name, **knobs)
    if verifier == "math_verify":
        _require_math_verify()
    verify = {
        "auto": task.verify,
        "task": task.verify,
        "exact": exact_match,
        "numeric": numeric_match,
        "math_verify": math_verify_match,
    }[verifier]
    # Held out = an independent stream; without ``split`` a small task may repeat a training
    # problem in it (1-digit addition has 100)
    train, test = ("train", "test") if split else (None, None)
    eval_rng = prompt_rng(seed, PromptStream.EVAL)
    eval_prompts, eval_answers = task.sample_batch(eval_rng, n_eval, split=test)
    probe, _ = task.sample_batch(prompt_rng(seed, PromptStream.PROBE), 256)

    def draw(rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]:
        return task.sample_batch(rng, n, split=train)

    return PromptSource(
        f"task:{name}" + (" (train/test partitions)" if split else ""),
        draw,
        verify,
        list(eval_prompts),
        list(eval_answers),
        list(probe),
    )


def read_rows(path: str) -> tuple[list[str], list[str]]:
    """``(prompts, answers)`` of a JSONL or parquet file; ``ValueError`` naming the bad row."""
    if not os.path.isfile(path):
        raise ValueError(f"--data file {path!r} does not exist")
    rows: list[dict[str, Any]] = []
    if path.endswith(".parquet"):
        import pandas as pd

        try:
            rows = pd.read_parquet(path).to_dict("records")
        except Exception as exc:
            raise ValueError(f"cannot read parquet file {path!r}: {exc}") from exc
    else:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{i}: malformed JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{i}: each line must be a JSON object")
                rows.append(row)
    if not rows:
        raise ValueError(f"data file {path!r} has no rows")
    prompts, answers = [], []
    for i, row in enumerate(rows, 1):
        if "prompt" not in row or "answer" not in row:
            raise ValueError(f"{path}: row {i} lacks 'prompt' or 'answer' (keys: {sorted(row)})")
        prompt, answer = row["prompt"], row["answer"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{path}: row {i}: 'prompt' must be a non-empty string")
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise ValueError(f"{path}: row {i}: 'answer' must be a string or a number")
        answer = str(answer)
        if "####" in answer:
            answer = answer.rsplit("####", 1)[1]
        prompts.append(prompt)
        answers.append(answer.strip())
    return prompts, answers


def file_source(path: str, verifier: str, seed: int, n_eval: int, eval_path: str | None):
    prompts, answers = read_rows(path)
    if verifier == "task":
        raise ValueError("--verifier task needs --task; for --data use exact, numeric or auto")
    if verifier == "auto":
        numeric = all(parse_number(a) is not None for a in answers)
        verifier = "numeric" if numeric else "exact"
    if verifier == "math_verify":
        _require_math_verify()
    verify = {"exact": exact_match, "numeric": numeric_match, "math_verify": math_verify_match}[
        verifier
    ]
    if eval_path is not None:
        eval_prompts, eval_answers = read_rows(eval_path)
        eval_prompts, eval_answers = eval_prompts[:n_eval], eval_answers[:n_eval]
    elif n_eval > 0:  # hold out a seeded subset of the file
        if n_eval >= len(prompts):
            raise ValueError(
                f"--eval-prompts {n_eval} leaves no training rows in {path!r} ({len(prompts)} rows)"
            )
        order = prompt_rng(seed, PromptStream.EVAL).permutation(len(prompts))
        held = set(order[:n_eval].tolist())
        eval_prompts = [p for i, p in enumerate(prompts) if i in held]
        eval_answers = [a for i, a in enumerate(answers) if i in held]
        prompts = [p for i, p in enumerate(prompts) if i not in held]
        answers = [a for i, a in enumerate(answers) if i not in held]
    else:
        eval_prompts, eval_answers = [], []

    def draw(rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]:
        idx = rng.integers(len(prompts), size=n)
        return [prompts[i] for i in idx], [answers[i] for i in idx]

    return PromptSource(
        f"file:{path}", draw, verify, eval_prompts, eval_answers, prompts + eval_prompts
    )


def make_source(
    task: str | None,
    knobs: dict[str, Any],
    data: str | None,
    verifier: str,
    seed: int,
    n_eval: int,
    eval_data: str | None = None,
    split: bool = False,
) -> PromptSource:
    if verifier not in VERIFIERS:
        raise ValueError(f"--verifier must be one of {list(VERIFIERS)}, got {verifier!r}")
    if data is not None:
        if task is not None:
            raise ValueError("pass either --task or --data, not both")
        return file_source(data, verifier, seed, n_eval, eval_data)
    return task_source(task or "mod_arith", knobs, verifier, seed, n_eval, split)
