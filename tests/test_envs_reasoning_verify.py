"""envs.reasoning.verify: the final-answer rule (``extract_integer``, ``extract_word``,
``extract_expression``) and the eval-free arithmetic parser of the countdown task, with its
safety against malicious input."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import envs
from envs.reasoning import ExpressionError, make_task, parse_arithmetic
from envs.reasoning.verify import extract_expression, extract_integer, extract_word

# ------------------------------------------------------------------------------------------
# the final-answer rule
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("42", "42"),
        ("The answer is 42.", "42"),
        ("Answer: -007", "-7"),
        ("-0", "0"),
        ("5-3", "3"),  # a '-' after a digit is an operator
        ("x = -3", "-3"),
        ("4.5", "5"),
        ("\\boxed{12} and then Answer: 5", "12"),  # \boxed{} wins
        ("Answer: 5\nanswer : 6", "6"),  # the last marker
        ("Answer:\n\n  17\n18", "17"),  # the first line after it
        ("steps 1 2 3\nso 9", "9"),  # no marker: the last line
        ("42\nHope this helps", None),
        ("٣ ３", None),  # non-ASCII digits are not digits here
        ("", None),
        ("9" * 5000, "9" * 5000),  # compared as strings: no int() of a huge number
    ],
)
def test_extract_integer(completion, expected):
    assert extract_integer(completion) == expected


def test_extract_word_and_expression():
    assert extract_word("The reversed string is 'abc'.") == "abc"
    assert extract_word("Answer: **0110**") == "0110"
    assert extract_word("...") is None
    assert extract_expression("Answer: (3 + 5) * 2 = 16.") == "(3 + 5) * 2"
    assert extract_expression("\\boxed{2*8}") == "2*8"
    assert extract_expression("= 16") is None


# ------------------------------------------------------------------------------------------
# countdown: the parser and its safety
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "numbers"),
    [
        ("2 + 3 * 4", 14, [2, 3, 4]),  # * binds tighter
        ("(2 + 3) * 4", 20, [2, 3, 4]),
        ("10 - 3 - 2", 5, [10, 3, 2]),  # left-associative
        ("2 * (3 - 5)", -4, [2, 3, 5]),
        (" 7 ", 7, [7]),
        ("(" * 16 + "1" + ")" * 16, 1, [1]),  # the deepest nesting accepted
    ],
)
def test_parse_arithmetic_values(text, value, numbers):
    assert parse_arithmetic(text) == (value, numbers)


MALICIOUS = [
    "__import__('os').system('echo pwned')",
    "eval('1+1')",
    "().__class__.__bases__[0].__subclasses__()",
    "open('/etc/passwd').read()",
    "lambda: 1",
    "2 ** 100000",
    "9 ** 9 ** 9",
    "1 / 0",
    "7 // 2",
    "1e300",
    "0x10",
    "-3 + 5",  # no unary minus
    "+3",
    "2 3",
    "2 +",
    "(2",
    "2)",
    "()",
    "1_000",
    "٣ + 1",
    "1" * 10,  # a number longer than 9 digits
    "(" * 17 + "1" + ")" * 17,  # nested too deep
    "(" * 5000 + "1" + ")" * 5000,
    "1+" * 200 + "1",  # longer than 256 characters
    "1" * 10**6,
]


@pytest.mark.parametrize("text", MALICIOUS)
def test_parse_arithmetic_rejects_malicious_input(text):
    with pytest.raises(ExpressionError):
        parse_arithmetic(text)


def test_countdown_verifier_rejects_malicious_input_without_calling_eval(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the verifier called a forbidden builtin")

    for builtin_name in ("eval", "exec", "compile", "__import__"):
        monkeypatch.setattr(builtins, builtin_name, forbidden)
    task = make_task("countdown")
    answer = "(3 + 5) * 2"  # numbers 3, 5, 2; target 16
    for text in MALICIOUS + [f"{m} = 16" for m in MALICIOUS[:5]]:
        assert task.verify(answer, text) == 0.0
        assert task.verify(answer, f"Answer: {text}") == 0.0
    assert task.verify(answer, "2 * (5 + 3)") == 1.0  # found while eval is unavailable


def test_no_module_of_envs_reasoning_calls_eval_exec_or_compile():
    forbidden = {"eval", "exec", "compile", "__import__", "literal_eval"}
    package = Path(envs.__file__).parent / "reasoning"
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if isinstance(func, ast.Attribute) and name == "compile":
                    assert isinstance(func.value, ast.Name) and func.value.id == "re", path
                    continue
                assert name not in forbidden, (path, ast.unparse(node))
