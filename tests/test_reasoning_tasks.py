"""Tests for envs.reasoning: tasks and verifiers, tokenizer, token envs, the enumerable task."""

from __future__ import annotations

import ast
import builtins
import itertools
import pickle
import string
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.reasoning import (
    BitsTask,
    CharTokenizer,
    ExpressionError,
    ReasoningTask,
    ReasoningTokenEnv,
    ReasoningTokenVectorEnv,
    available_tasks,
    make_task,
    parse_arithmetic,
    register_task,
    task_env_id,
    token_env,
    unregister_task,
)
from envs.reasoning.verify import (
    MAX_COMPLETION_CHARS,
    extract_expression,
    extract_integer,
    extract_word,
)

TASKS = available_tasks()

#: The hardest setting of every knob that has a range (bounds and sampling must hold there too).
HARD_KNOBS = {
    "mod_arith": {"steps": 32, "modulus": 10**6, "max_operand": 10**6},
    "addition": {"digits": 50, "num_terms": 10},
    "parity": {"length": 64, "mode": "count"},
    "sequence": {"op": "sort", "length": 32, "alphabet": "letters"},
    "countdown": {"num_numbers": 6, "max_number": 1000},
    "boolean": {"depth": 6, "ops": ["xor"]},
    "bits": {"op": "copy", "length": 8},
}


def _completions(task, answer: str) -> list[str]:
    """Ways an LLM might state ``answer``; every one must verify to 1."""
    c = task.format_completion(answer)
    out = [c, f" {c}", f"Answer: {c}", f"Let me think.\n\nANSWER : {c}\n", f"so \\boxed{{{c}}}"]
    if task.answer_kind == "expression":
        out.append(f"{c} = {parse_arithmetic(answer)[0]}.")
    else:
        out.append(f"Some reasoning 12 abc.\nThe answer is {c}.")
    return out


def _wrong_completions(task, answer: str) -> list[str]:
    """Completions that state a wrong answer; every one must verify to 0."""
    if task.answer_kind == "integer":
        return [str(int(answer) + 1), f"Answer: {int(answer) - 1}", f"{answer}\nno wait, {answer}1"]
    if task.answer_kind == "string":
        chars = task.answer_chars
        flipped = answer[:-1] + chars[(chars.index(answer[-1]) + 1) % len(chars)]
        return [
            flipped,
            answer + answer[-1],
            f"\\boxed{{{flipped}}}",
            f"Answer: {answer}\nAnswer: {flipped}",
        ]
    # expression: reusing a number (the reference uses every number) or a wrong value
    _, numbers = parse_arithmetic(answer)
    out = [f"{answer} + {numbers[0]}", f"({answer}) * 2 = 0"]
    if sum(numbers) != parse_arithmetic(answer)[0]:
        out.append(" + ".join(map(str, numbers)))
    return out


NASTY = [
    None,
    42,
    4.2,
    b"42",
    ["42"],
    object(),
    "",
    " ",
    "\n\n\t",
    "\x00",
    "Answer:",
    "answer :   \n",
    "\\boxed{}",
    "\\boxed{",
    "\\boxed{\\boxed{}}",
    "}{",
    "((((((",
    "))))",
    "-",
    "--+*",
    "٣",
    "３２",
    "①②",
    "Ⅻ",
    "¹²³",
    "𝟙𝟚",
    "\u202e\u200b\ufeff",
    "\ud800",
    "🙂" * 1000,
    "(" * 9000,
    "\\boxed{" * 1400,
    "Answer:" * 1400,
    "9" * (MAX_COMPLETION_CHARS + 1),
    "1" * 10**6,
    " " * 10**6,
]


def _play(env: gym.Env, tokens: list[int]) -> tuple[float, dict, int]:
    """Steps ``tokens`` until the episode ends; (final reward, final info, steps taken)."""
    for step, token in enumerate(tokens, start=1):
        _, reward, terminated, truncated, info = env.step(token)
        assert truncated is False
        if terminated:
            return reward, info, step
        assert reward == 0.0 and info == {}
    raise AssertionError("the episode did not end")


# ------------------------------------------------------------------------------------------
# registry and knobs
# ------------------------------------------------------------------------------------------


def test_available_tasks_cover_the_issue():
    assert set(TASKS) >= {
        "mod_arith",
        "addition",
        "parity",
        "sequence",
        "countdown",
        "boolean",
        "bits",
    }


@pytest.mark.parametrize(
    ("name", "knobs", "match"),
    [
        ("nope", {}, r"unknown task 'nope'; available tasks: \['addition'"),
        ("addition", {"digit": 3}, r"unknown knob\(s\) \['digit'\].*\['digits', 'num_terms'\]"),
        ("addition", {"digits": 0}, r"digits must be an integer in \[1, 50\]"),
        ("addition", {"digits": True}, "digits"),
        ("addition", {"digits": 2.0}, "digits"),
        ("addition", {"num_terms": 11}, "num_terms"),
        ("mod_arith", {"modulus": 1}, "modulus"),
        ("mod_arith", {"steps": 0}, "steps"),
        ("mod_arith", {"ops": ["/"]}, "ops"),
        ("mod_arith", {"ops": []}, "ops"),
        ("mod_arith", {"ops": ["+", "+"]}, "ops"),
        ("parity", {"mode": "xor"}, r"mode must be one of \['parity', 'count'\]"),
        ("parity", {"length": 65}, "length"),
        ("sequence", {"alphabet": "emoji"}, "alphabet"),
        ("sequence", {"op": "shuffle"}, "op"),
        ("countdown", {"num_numbers": 7}, "num_numbers"),
        ("countdown", {"max_number": 1}, "max_number"),
        ("boolean", {"depth": 7}, "depth"),
        ("boolean", {"ops": ["nand"]}, "ops"),
        ("bits", {"length": 9}, "length"),
        ("bits", {"op": "sum"}, "op"),
    ],
)
def test_invalid_names_and_knobs_raise_value_errors_naming_them(name, knobs, match):
    with pytest.raises(ValueError, match=match):
        make_task(name, **knobs)


@pytest.mark.parametrize("name", TASKS)
def test_knobs_round_trip_through_make_task(name):
    task = make_task(name, **HARD_KNOBS[name])
    assert task.name == name
    assert make_task(name, **task.knobs).knobs == task.knobs
    assert repr(task).startswith(f"make_task({name!r}")


# ------------------------------------------------------------------------------------------
# every task: generator, verifier, bounds, determinism
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hard", [False, True], ids=["default", "hard"])
@pytest.mark.parametrize("name", TASKS)
def test_true_answers_verify_and_wrong_ones_do_not(name, hard):
    task = make_task(name, **(HARD_KNOBS[name] if hard else {}))
    prompts, answers = task.sample_batch(np.random.default_rng(0), 100 if hard else 300)
    for prompt, answer in zip(prompts, answers, strict=True):
        assert prompt.endswith("Answer:")
        for completion in _completions(task, answer):
            assert task.verify(answer, completion) == 1.0, (prompt, answer, completion)
        for completion in _wrong_completions(task, answer):
            assert task.verify(answer, completion) == 0.0, (prompt, answer, completion)


@pytest.mark.parametrize("hard", [False, True], ids=["default", "hard"])
@pytest.mark.parametrize("name", TASKS)
def test_samples_respect_the_declared_bounds_and_tokenizer(name, hard):
    task = make_task(name, **(HARD_KNOBS[name] if hard else {}))
    rng = np.random.default_rng(1)
    for _ in range(100):
        prompt, answer = task.sample(rng)
        assert len(prompt) <= task.max_prompt_len
        assert 1 <= len(answer) <= task.max_answer_len
        assert set(answer) <= set(task.answer_chars)
        ids = task.encode_prompt(prompt)
        assert ids[0] == task.tokenizer.bos_id and len(ids) <= task.max_prompt_tokens
        answer_ids = task.tokenizer.encode(task.format_completion(answer))
        assert set(answer_ids) <= set(task.completion_token_ids)
        assert task.decode_completion([*answer_ids, task.tokenizer.eos_id, 3, 4]) == answer
    assert task.tokenizer.eos_id in task.completion_token_ids


@pytest.mark.parametrize("name", TASKS)
def test_sampling_is_determined_by_the_seed(name):
    task = make_task(name)
    a = task.sample_batch(np.random.default_rng(7), 30)
    b = task.sample_batch(np.random.default_rng(7), 30)
    c = task.sample_batch(np.random.default_rng(8), 30)
    assert a == b and a != c
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    assert [task.sample(rng_a) for _ in range(5)] == [task.sample(rng_b) for _ in range(5)]
    with pytest.raises(TypeError, match="rng"):
        task.sample(3)


@pytest.mark.parametrize("name", TASKS)
def test_nasty_completions_score_zero(name):
    task = make_task(name)
    _, answer = task.sample(np.random.default_rng(0))
    for completion in NASTY:
        assert task.verify(answer, completion) == 0.0, completion


_NO_ASCII_ALNUM = st.text(
    alphabet=st.characters(exclude_characters=string.ascii_letters + string.digits), max_size=300
)


@pytest.mark.parametrize("name", TASKS)
@settings(max_examples=60, deadline=None)
@given(garbage=_NO_ASCII_ALNUM, any_text=st.text(max_size=300), seed=st.integers(0, 2**32 - 1))
def test_fuzzed_completions_never_crash(name, garbage, any_text, seed):
    task = make_task(name)
    _, answer = task.sample(np.random.default_rng(seed))
    # without an ASCII letter or digit no answer can be stated
    assert task.verify(answer, garbage) == 0.0
    score = task.verify(answer, any_text)
    assert isinstance(score, float) and score in (0.0, 1.0)
    assert task.verify(answer, any_text + "\n" + garbage) in (0.0, 1.0)


@pytest.mark.parametrize("name", TASKS)
def test_a_malformed_answer_argument_raises(name):
    task = make_task(name)
    with pytest.raises(ValueError, match="answer"):
        task.verify(None, "1")
    with pytest.raises(ValueError, match="answer"):
        task.verify("", "1")


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


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("(3 + 5) * 2", 1.0),
        ("2 * (5 + 3)", 1.0),  # another solution
        ("Answer: 2*(3+5) = 16", 1.0),
        ("3 + 3 + 5 * 2", 0.0),  # value 16, but 3 used twice
        ("2 * 8", 0.0),  # 8 is not given
        ("5 * 3 + 1", 0.0),  # 1 is not given
        ("3 * 5 + 2", 0.0),  # 17
        ("16", 0.0),
        ("(3 + 5) * 2 + 0", 0.0),  # 0 is not given
    ],
)
def test_countdown_accepts_any_valid_solution_and_only_those(completion, expected):
    assert make_task("countdown").verify("(3 + 5) * 2", completion) == expected


def test_countdown_reference_uses_every_prompt_number_and_reaches_the_target():
    task = make_task("countdown", num_numbers=5, max_number=20)
    rng = np.random.default_rng(4)
    for _ in range(200):
        prompt, answer = task.sample(rng)
        value, numbers = parse_arithmetic(answer)
        listed = prompt.split("numbers ")[1].split(", each")[0]
        assert sorted(numbers) == sorted(int(x) for x in listed.split(", "))
        assert prompt.endswith(f"make {value}. Answer:") and value >= 1
    with pytest.raises(ValueError, match="answer"):
        task.verify("not an expression", "1")


def test_mod_arith_value_by_hand():
    task = make_task("mod_arith", steps=3, modulus=7)
    prompt, answer = task.sample(np.random.default_rng(0))
    # the prompt spells out the operations; evaluate it independently
    expression = prompt.removeprefix("Compute ").removesuffix(" mod 7. Answer:")
    assert int(answer) == parse_arithmetic(expression)[0] % 7
    assert make_task("mod_arith").verify("3", "((2 + 5) * 3) mod 7 = 3") == 1.0


# ------------------------------------------------------------------------------------------
# tokenizer
# ------------------------------------------------------------------------------------------


def test_char_tokenizer_layout_and_round_trip():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab[:3] == ("<pad>", "<bos>", "<eos>") and tok.vocab_size == 99
    assert tok.encode("0") == [3] and tok.vocab[tok.token_to_id["+"]] == "+"
    text = "Compute (3 + 5) * 2 mod 7. Answer: \\boxed{42}\n"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("12", add_bos=True, add_eos=True)
    assert ids == [1, 4, 5, 2]
    assert tok.decode(ids) == "12" and tok.decode(ids, skip_special=False) == "<bos>12<eos>"
    assert tok.decode(np.array(ids)) == "12" and tok.decode([]) == ""
    batch, lengths = tok.encode_batch(["1", "123"], add_eos=True)
    np.testing.assert_array_equal(batch, [[4, 2, 0, 0], [4, 5, 6, 2]])
    np.testing.assert_array_equal(lengths, [2, 4])
    bits = CharTokenizer("01")
    assert bits.vocab == ("<pad>", "<bos>", "<eos>", "0", "1") and bits != tok


def test_char_tokenizer_errors():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'é'"):
        tok.encode("café")
    with pytest.raises(ValueError, match="ids"):
        tok.decode([99])
    with pytest.raises(ValueError, match="ids"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="ids"):
        tok.decode("12")
    with pytest.raises(ValueError, match="repeat"):
        CharTokenizer("001")
    with pytest.raises(ValueError, match="length"):
        tok.encode_batch(["123"], length=2)


# ------------------------------------------------------------------------------------------
# token envs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", envs.ENV_IDS)
def test_every_registered_id_passes_check_env(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


def test_reasoning_ids_are_registered_once_per_task():
    tasks = {gym.make(env_id).unwrapped.task.name for env_id in envs.REASONING_ENV_IDS}
    assert tasks == set(TASKS) and len(envs.REASONING_ENV_IDS) == len(TASKS)
    assert set(envs.REASONING_ENV_IDS) | set(envs.BANDIT_ENV_IDS) == set(envs.ENV_IDS)
    for env_id in envs.REASONING_ENV_IDS:
        assert gym.spec(env_id).namespace == "sandbox"


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


@pytest.mark.parametrize("name", ["ModArith", "mod-arith", "mod__arith", "x_1", "", 3])
def test_task_names_that_would_not_make_a_unique_env_id_are_refused(name):
    with pytest.raises(ValueError, match="name must be lower-case words"):
        register_task(name)


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
        wrong = _wrong_completions(task, info["answer"])[0]
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


def _make_vec(env_id: str, num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    return gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
    )


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
# the enumerable task
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["copy", "reverse", "sort", "parity"])
@pytest.mark.parametrize("length", [1, 3])
def test_enumeration_matches_the_closed_form_and_the_rewards(op, length):
    task = make_task("bits", op=op, length=length)
    assert isinstance(task, BitsTask)
    eos, answer_len = task.tokenizer.eos_id, task.answer_len
    assert answer_len == (1 if op == "parity" else length)
    prompts = task.enumerate_prompts()
    assert len(set(prompts)) == len(prompts) == 2**length
    for max_len in range(1, answer_len + 3):
        sequences = task.enumerate_completions(max_len)
        # k bits + <eos> for k < T, plus the T-bit strings: sum_k 2^k + 2^T = 2^(T+1) - 1
        assert len(sequences) == len(set(sequences)) == 2 ** (max_len + 1) - 1
        assert task.num_completions(max_len) == len(sequences)
        for sequence in sequences:
            assert set(sequence) <= set(task.completion_token_ids) == {2, 3, 4}
            assert eos not in sequence[:-1]
            assert sequence[-1] == eos or len(sequence) == max_len
            assert len(sequence) <= max_len
        ids, lengths = task.enumerate_completions_array(max_len)
        np.testing.assert_array_equal(lengths, [len(s) for s in sequences])
        expected_correct = task.num_correct_completions(max_len)
        assert expected_correct == int(answer_len <= max_len)
        for prompt in prompts:
            rewards = np.array([task.reward_ids(prompt, s) for s in sequences])
            assert rewards.sum() == expected_correct
            if expected_correct:
                (winner,) = np.flatnonzero(rewards)
                assert tuple(t for t in sequences[winner] if t != eos) == task.answer_ids(prompt)
            np.testing.assert_array_equal(task.reward_ids_batch(prompt, ids), rewards)
            # the text verifier agrees with the id-level reward on every sequence
            text_answer = task.tokenizer.decode(task.answer_ids(prompt))
            text_rewards = [task.verify(text_answer, task.decode_completion(s)) for s in sequences]
            np.testing.assert_array_equal(text_rewards, rewards)


def test_enumeration_is_the_whole_outcome_space_of_an_autoregressive_policy():
    # any per-position distribution over (<eos>, 0, 1) gives the enumerated sequences total
    # probability 1: sum_k P(k bits, then <eos>) + P(T bits) telescopes to 1
    task = make_task("bits", op="reverse", length=4)
    max_len = 6
    probs = np.random.default_rng(0).dirichlet(np.ones(3), size=max_len)  # [T, 3]
    column = {2: 0, 3: 1, 4: 2}
    total = 0.0
    for sequence in task.enumerate_completions(max_len):
        total += np.prod([probs[t, column[token]] for t, token in enumerate(sequence)])
    assert total == pytest.approx(1.0, abs=1e-12)
    assert task.num_completions(16) == 131071
    assert len(task.enumerate_completions(12)) == 8191
    with pytest.raises(ValueError, match="max_len"):
        task.enumerate_completions(17)


def test_reward_ids_batch_matches_reward_ids_on_random_token_arrays():
    task = make_task("bits", op="sort", length=4)
    rng = np.random.default_rng(5)
    prompts, answers = task.sample_ids_batch(rng, 2000)
    assert prompts.shape == (2000, 5) and answers.shape == (2000, 4)
    completions = rng.integers(0, task.tokenizer.vocab_size, size=(2000, 7))  # pad/bos included
    # plant the answer (with pad/bos noise and a tail after <eos>) in a third of the rows
    planted = completions[::3]
    planted[:, :4] = answers[::3]
    planted[:, 4] = task.tokenizer.eos_id
    completions[1::6, 2] = task.tokenizer.pad_id
    batch = task.reward_ids_batch(prompts, completions)
    scalar = [task.reward_ids(p, c) for p, c in zip(prompts, completions, strict=True)]
    np.testing.assert_array_equal(batch, scalar)
    assert batch[::3].mean() > 0.3 and batch.dtype == np.float64
    for p, a in zip(prompts[:50], answers[:50], strict=True):
        assert task.answer_ids(p) == tuple(a)
    with pytest.raises(ValueError, match="prompt_ids"):
        task.reward_ids_batch(prompts[:, :3], completions)
    with pytest.raises(ValueError, match="completion_ids"):
        task.reward_ids_batch(prompts, completions + 10)


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


def test_envs_reasoning_imports_only_numpy_gymnasium_and_stdlib():
    code = (
        "import sys, envs.reasoning, gymnasium; "
        "print(sorted({'torch', 'sandbox', 'llm'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_enumeration_order_is_the_documented_one():
    task = make_task("bits", length=2)
    assert task.enumerate_completions(2) == [
        (2,),
        (3, 2),
        (4, 2),
        *itertools.product((3, 4), repeat=2),
    ]
