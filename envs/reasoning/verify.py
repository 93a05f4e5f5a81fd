"""Answer extraction and a safe arithmetic parser: the pieces every task's verifier is made of.

The final-answer rule (one for all tasks, documented once here)
---------------------------------------------------------------

A completion is reduced to its *answer segment*, then to a candidate by the task's answer kind.

1. Anything that is not a ``str``, or is longer than :data:`MAX_COMPLETION_CHARS` characters, has
   no answer (the verifier returns 0).
2. Segment: the content of the last ``\\boxed{...}`` (no nested braces) if there is one; else the
   first non-empty line after the last ``Answer:`` (case-insensitive, spaces allowed before the
   colon); else the last non-empty line of the completion.
3. Candidate, by kind:

   - ``"integer"``: the last integer in the segment, ASCII digits only with an optional ``-``
     sign (a ``-`` right after a digit, letter or ``)`` is an operator, not a sign), compared
     as an integer (``"042"`` matches ``42``, ``"-0"`` matches ``0``). ``"1,234"`` reads as
     ``234`` and ``"4.5"`` as ``5``: answers are plain integers.
   - ``"string"``: the last whitespace-separated word of the segment with the punctuation
     :data:`STRIP_CHARS` stripped from both ends, compared exactly (case-sensitive).
   - ``"expression"`` (countdown): the segment up to its first ``=``, stripped of spaces and a
     trailing ``.``, parsed by :func:`parse_arithmetic` (never ``eval``).

So ``"42"``, ``" 42"``, ``"The answer is 42."``, ``"Answer: 42"`` and ``"... \\boxed{42}"`` all
read as 42, while ``"42\\nHope that helps"`` reads nothing (no integer on the last line).

Safety: the rules use only linear-time regular expressions, string methods and a
recursive-descent parser with limits on length (:data:`MAX_EXPRESSION_CHARS`), nesting
(:data:`MAX_NESTING`) and number size (:data:`MAX_NUMBER_DIGITS`); integers are compared as
strings, so a 9,000-digit "answer" costs no big-integer conversion.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "MAX_COMPLETION_CHARS",
    "MAX_EXPRESSION_CHARS",
    "MAX_NESTING",
    "MAX_NUMBER_DIGITS",
    "STRIP_CHARS",
    "ExpressionError",
    "answer_segment",
    "canonical_integer",
    "extract_expression",
    "extract_integer",
    "extract_word",
    "parse_arithmetic",
]

#: Completions longer than this have no answer.
MAX_COMPLETION_CHARS = 10_000
#: Countdown expressions longer than this (after extraction) are rejected.
MAX_EXPRESSION_CHARS = 256
#: Maximum parenthesis nesting depth accepted by :func:`parse_arithmetic`.
MAX_NESTING = 16
#: Maximum digits of one number accepted by :func:`parse_arithmetic`.
MAX_NUMBER_DIGITS = 9
#: Punctuation stripped from both ends of a ``"string"`` candidate.
STRIP_CHARS = ".,;:!?\"'`()[]{}<>*_"

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER_MARK = re.compile(r"answer[ \t]*:", re.IGNORECASE)
_INTEGER = re.compile(r"(?:(?<![0-9A-Za-z)])-)?[0-9]+")
_CANONICAL_INTEGER = re.compile(r"-?[0-9]+")


def answer_segment(completion: Any) -> str | None:
    """The part of ``completion`` that holds the final answer (rule 1-2 above), or None."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    boxed = _BOXED.findall(completion)
    if boxed:
        return boxed[-1].strip()
    marks = list(_ANSWER_MARK.finditer(completion))
    text = completion[marks[-1].end() :] if marks else completion
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    return lines[0] if marks else lines[-1]


def canonical_integer(text: str) -> str:
    """``text`` (an optional ``-`` and ASCII digits) without leading zeros; ``-0`` is ``0``."""
    if not isinstance(text, str) or not _CANONICAL_INTEGER.fullmatch(text):
        raise ValueError(f"not an integer: {text!r}")
    negative = text.startswith("-")
    digits = text.lstrip("-").lstrip("0") or "0"
    return "-" + digits if negative and digits != "0" else digits


def extract_integer(completion: Any) -> str | None:
    """The canonical last integer of the answer segment (kind ``"integer"``), or None."""
    segment = answer_segment(completion)
    if segment is None:
        return None
    last = None
    for last in _INTEGER.finditer(segment):  # noqa: B007 - we want the final match
        pass
    return canonical_integer(last.group()) if last is not None else None


def extract_word(completion: Any) -> str | None:
    """The last word of the answer segment, end punctuation stripped (kind ``"string"``)."""
    segment = answer_segment(completion)
    if segment is None:
        return None
    words = segment.split()
    if not words:
        return None
    word = words[-1].strip(STRIP_CHARS)
    return word or None


def extract_expression(completion: Any) -> str | None:
    """The expression of the answer segment: up to the first ``=``, trailing ``.`` dropped."""
    segment = answer_segment(completion)
    if segment is None:
        return None
    expression = segment.split("=", 1)[0].strip().rstrip(".").strip()
    return expression or None


# --------------------------------------------------------------------------------------------
# arithmetic parser (countdown): integers, + - *, parentheses; no eval anywhere
# --------------------------------------------------------------------------------------------


class ExpressionError(ValueError):
    """Raised by :func:`parse_arithmetic` for anything that is not a valid, small expression."""


_TOKEN = re.compile(r"\s*(?:([0-9]+)|([-+*()]))")


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise ExpressionError(f"unexpected character {text[position]!r} at {position}")
        number, operator = match.groups()
        if number is not None and len(number) > MAX_NUMBER_DIGITS:
            raise ExpressionError(f"number longer than {MAX_NUMBER_DIGITS} digits")
        tokens.append(number if number is not None else operator)
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent over ``expr := term (('+'|'-') term)*``, ``term := factor ('*' factor)*``,
    ``factor := NUMBER | '(' expr ')'``; records the numbers it reads."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self.position += 1
        return token

    def expr(self, depth: int) -> int:
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            operator = self._take()
            right = self.term(depth)
            value = value + right if operator == "+" else value - right
        return value

    def term(self, depth: int) -> int:
        value = self.factor(depth)
        while self._peek() == "*":
            self._take()
            value *= self.factor(depth)
        return value

    def factor(self, depth: int) -> int:
        token = self._take()
        if token == "(":
            if depth >= MAX_NESTING:
                raise ExpressionError(f"parentheses nested deeper than {MAX_NESTING}")
            value = self.expr(depth + 1)
            if self._take() != ")":
                raise ExpressionError("expected ')'")
            return value
        if token.isdigit():
            number = int(token)
            self.numbers.append(number)
            return number
        raise ExpressionError(f"expected a number or '('; got {token!r}")


def parse_arithmetic(text: Any) -> tuple[int, list[int]]:
    """Value of an integer expression with ``+ - *`` and parentheses, and the numbers it uses.

    No unary operators, no other characters, at most :data:`MAX_EXPRESSION_CHARS` characters,
    :data:`MAX_NESTING` levels of parentheses and :data:`MAX_NUMBER_DIGITS` digits per number
    (so the value has at most a few thousand digits). Raises :class:`ExpressionError` otherwise.

    Example: ``parse_arithmetic("(3 + 5) * 2 - 4")`` is ``(12, [3, 5, 2, 4])``.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"expression must be a str; got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr(0)
    if parser.position != len(tokens):
        raise ExpressionError(f"unexpected {tokens[parser.position]!r} after the expression")
    return value, parser.numbers
