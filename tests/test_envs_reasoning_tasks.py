"""envs.reasoning.tasks: the task registry and knobs, every task's generator and verifier (true
answers verify, wrong and nasty ones do not, bounds, seeding), the countdown and mod_arith tasks by
hand, the enumerable ``bits`` task, and what the package imports."""

from __future__ import annotations

import itertools
import string
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.reasoning import (
    SPLITS,
    BitsTask,
    available_tasks,
    make_task,
    parse_arithmetic,
    problem_split,
    register_task,
)
from envs.reasoning.verify import MAX_COMPLETION_CHARS

TASKS = available_tasks()


#: The hardest setting of every knob that has a range (bounds and sampling must hold there too).
HARD_KNOBS = {
    "mod_arith": {"steps": 32, "modulus": 10**6, "max_operand": 10**6},
    "addition": {"digits": 50, "num_terms": 10},
    "parity": {"length": 64, "mode": "count"},
    "sequence": {"op": "sort", "length": 32, "alphabet": "letters"},
    "countdown": {"num_numbers": 6, "max_number": 1000},
    "boolean": {"depth": 6, "ops": ["xor"]},
    "bits": {"op": "copy", "length": 16},
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


def wrong_completions(task, answer: str) -> list[str]:
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


# ------------------------------------------------------------------------------------------
# registry and knobs
# ------------------------------------------------------------------------------------------


def test_the_seven_documented_tasks_are_registered():
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
        ("bits", {"length": 17}, "length"),
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


@pytest.mark.parametrize("name", ["ModArith", "mod-arith", "mod__arith", "x_1", "", 3])
def test_task_names_that_would_not_make_a_unique_env_id_are_refused(name):
    with pytest.raises(ValueError, match="name must be lower-case words"):
        register_task(name)


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
        for completion in wrong_completions(task, answer):
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


# ------------------------------------------------------------------------------------------
# every task: train and test partitions
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TASKS)
def test_train_and_test_partitions_are_disjoint_and_each_draw_lies_in_its_own(name):
    """Every registered task (a new one included, with no edit here): draws of one split lie in
    it, the two splits share no problem, both are populated, and a split's answers verify."""
    task = make_task(name)
    drawn = {}
    for split in SPLITS:
        prompts, answers = task.sample_batch(np.random.default_rng(11), 200, split=split)
        assert {problem_split(p) for p in prompts} == {split}
        assert all(task.verify(a, task.format_completion(a)) == 1.0 for a in answers)
        drawn[split] = set(prompts)
        assert problem_split(task.sample(np.random.default_rng(2), split=split)[0]) == split
    assert drawn["train"] and drawn["test"] and not drawn["train"] & drawn["test"]


@pytest.mark.parametrize("name", TASKS)
def test_a_split_is_the_tasks_distribution_restricted_to_it(name):
    """Unsplit draws fall in both partitions (neither is empty nor all), and a split's draws are
    the unsplit stream's draws of that split, in order (rejection sampling)."""
    task = make_task(name)
    prompts, _ = task.sample_batch(np.random.default_rng(5), 400)
    share = np.mean([problem_split(p) == "test" for p in prompts])
    assert 0.2 < share < 0.8, share
    test, _ = task.sample_batch(np.random.default_rng(5), 20, split="test")
    assert test == [p for p in prompts if problem_split(p) == "test"][:20]
    again = task.sample_batch(np.random.default_rng(5), 400, split=None)[0]
    assert again == prompts  # split=None is the stream of the old signature


#: Partitions computed once (BLAKE2b of the prompt text): the same on every machine and Python.
PINNED_SPLITS = {"What is 3 + 4? Answer:": "test", "x": "test", "": "train"}


def test_problem_split_is_a_fixed_function_of_the_prompt_text():
    assert {p: problem_split(p) for p in PINNED_SPLITS} == PINNED_SPLITS
    bits = make_task("bits", op="reverse", length=3)
    assert [len(bits.split_bits(s)) for s in SPLITS] == [4, 4]
    digits = make_task("addition", digits=1)  # 100 problems
    prompts = {f"Compute {a} + {b}. Answer:" for a in range(10) for b in range(10)}
    drawn, _ = digits.sample_batch(np.random.default_rng(0), 2000)
    assert set(drawn) == prompts
    assert sum(problem_split(p) == "test" for p in prompts) == 45


def test_bad_splits_and_too_small_problem_spaces_are_refused_by_name():
    task = make_task("bits", op="reverse", length=1)  # 2 problems, both in the test partition
    with pytest.raises(ValueError, match="split must be one of"):
        task.sample(np.random.default_rng(0), split="eval")
    with pytest.raises(ValueError, match="split must be one of"):
        task.sample_ids_batch(np.random.default_rng(0), 3, split="validation")
    empty = [s for s in SPLITS if not len(task.split_bits(s))]
    assert empty == ["train"]
    for split in empty:  # a partition with no problem: a clear error, not a hang
        with pytest.raises(ValueError, match="split"):
            task.sample(np.random.default_rng(0), split=split)
        with pytest.raises(ValueError, match="split"):
            task.sample_ids_batch(np.random.default_rng(0), 3, split=split)


@pytest.mark.parametrize("length", [2, 5, 8])
def test_bits_token_view_splits_as_its_text_view(length):
    task = make_task("bits", op="reverse", length=length)
    members = {split: task.split_bits(split) for split in SPLITS}
    assert sum(len(m) for m in members.values()) == 2**length
    for split in SPLITS:
        prompts, answers = task.sample_ids_batch(np.random.default_rng(3), 300, split=split)
        for p, a in zip(prompts[:60], answers[:60], strict=True):
            text = task.tokenizer.decode(p[1:])
            assert problem_split(task._TEMPLATES["reverse"].format(text)) == split
            assert tuple(a) == task.answer_ids(p)
        if len(members[split]) <= 32:  # uniform over the partition: every member is drawn
            assert len({tuple(p) for p in prompts}) == len(members[split])


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
# countdown and mod_arith by hand
# ------------------------------------------------------------------------------------------


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


def test_enumeration_order_is_the_documented_one():
    task = make_task("bits", length=2)
    assert task.enumerate_completions(2) == [
        (2,),
        (3, 2),
        (4, 2),
        *itertools.product((3, 4), repeat=2),
    ]


# ------------------------------------------------------------------------------------------
# the package's imports
# ------------------------------------------------------------------------------------------


def test_envs_reasoning_imports_only_numpy_gymnasium_and_stdlib():
    code = (
        "import sys, envs.reasoning, gymnasium; "
        "print(sorted({'torch', 'sandbox', 'llm'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_answer_baselines_by_hand():
    from envs.reasoning import answer_baselines

    task = make_task("mod_arith", steps=2)
    # answers 0, 0, 1, 2: always "0" solves 2 of 4; drawing from the frequencies solves
    # 0.5 * 0.5 + 0.25 * 0.25 + 0.25 * 0.25 = 0.375
    got = answer_baselines(task, ["0", "0", "1", "2"])
    assert got == {"constant": 0.5, "constant_answer": "0", "prior": 0.375}
    # ties go to the first answer in sorted order
    assert answer_baselines(task, ["3", "1"])["constant_answer"] == "1"
    with pytest.raises(ValueError, match="answers"):
        answer_baselines(task, [])


def test_answer_baselines_use_the_verifier():
    from envs.reasoning import answer_baselines

    # countdown accepts any expression that reaches the target: a reference answer written as a
    # constant completion solves its own problem, and a constant is never right for all
    task = make_task("countdown", num_numbers=3, max_number=5)
    _, answers = task.sample_batch(np.random.default_rng(0), 64)
    got = answer_baselines(task, answers)
    assert 0 < got["prior"] <= got["constant"] < 1


def test_long_bit_strings_sample_with_thousands_of_test_problems_but_do_not_enumerate():
    """Up to 16 bits for sampled training (a test partition of thousands of problems, what a
    rung's held-out set needs); exact enumeration stops at 8 bits, by name."""
    task = make_task("bits", op="reverse", length=12)
    test = task.split_bits("test")
    assert 1800 < len(test) < 2300 and len(test) + len(task.split_bits("train")) == 4096
    prompts, answers = task.sample_ids_batch(np.random.default_rng(0), 500, split="test")
    assert len({tuple(p) for p in prompts}) > 400  # distinct problems, not a handful
    assert np.array_equal(answers, prompts[:, :0:-1])  # reversed bits (ids 3/4 both sides)
    with pytest.raises(ValueError, match="length 12: exact enumeration"):
        task.enumerate_prompts()
    assert len(make_task("bits", length=8).enumerate_prompts()) == 256
