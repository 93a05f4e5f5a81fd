"""The random streams of an llm run are named once (:mod:`llm.streams`, which re-exports the
project's :mod:`sandbox.streams`): no module of the ``llm`` package passes a bare stream
number, and the names keep the numbers every committed result was drawn with (so a run, a
resumed run and an ensemble member stay bit-identical to before)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from llm.streams import PromptStream, Stream, derive_seed, prompt_rng

LLM = Path(__file__).resolve().parents[1] / "llm"


def sources() -> list[tuple[str, ast.Module]]:
    files = sorted(LLM.rglob("*.py"))
    assert len(files) > 10 and LLM / "train.py" in files
    return [(str(f.relative_to(LLM.parent)), ast.parse(f.read_text())) for f in files]


def is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def called(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def bare_stream_ids(path: str, tree: ast.Module) -> list[str]:
    """Where ``tree`` passes a stream as a number: ``derive_seed(seed, 2, ...)``, a seed-key
    tuple ``(cfg.seed, 0, step)``, ``default_rng([seed, 1])``."""
    found = []
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        named = isinstance(node, ast.Call) and called(node) == "derive_seed"
        if named and len(node.args) > 1 and is_int(node.args[1]):
            found.append(f"{where}: derive_seed with stream {node.args[1].value}")
        if (
            isinstance(node, ast.Call)
            and called(node) == "default_rng"
            and path != "llm/streams.py"
        ):
            found.append(f"{where}: default_rng outside llm.streams (use prompt_rng)")
        if isinstance(node, ast.Tuple | ast.List) and len(node.elts) >= 2:
            first, second = node.elts[0], node.elts[1]
            if "seed" in ast.unparse(first).lower() and is_int(second):
                found.append(f"{where}: seed keys {ast.unparse(node)}")
    return found


def test_the_scan_finds_a_bare_stream_id():
    """The scan below is not vacuous: each form it forbids is found in a snippet."""
    snippet = ast.parse(
        "derive_seed(cfg.seed, 2, step)\n"
        "sample(run, ids, k, (cfg.seed, 0, step), lo)\n"
        "np.random.default_rng([cfg.seed, 1])\n"
        "derive_seed(cfg.seed, Stream.OBJECTIVE, step)\n"  # named: fine
        "sample(run, ids, k, (cfg.seed, Stream.EVAL, step), lo)\n"
    )
    found = bare_stream_ids("llm/example.py", snippet)
    # line 3 twice: default_rng outside llm.streams, and its [seed, 1] list
    assert sorted(int(f.split(":")[1]) for f in found) == [1, 2, 3, 3]


def test_no_bare_stream_id_in_the_llm_package():
    found = [f for path, tree in sources() for f in bare_stream_ids(path, tree)]
    assert found == []


def test_derive_seed_and_the_streams_are_defined_once():
    """Stream and derive_seed are the project's (sandbox.streams, the toy trainers' names too),
    re-exported by llm.streams; the prompt streams are llm's own."""
    import sandbox.streams

    trees = sources() + [
        (str(f.relative_to(LLM.parent)), ast.parse(f.read_text()))
        for f in sorted((LLM.parent / "sandbox").rglob("*.py"))
    ]
    defined = [
        (path, node.name)
        for path, tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
        and node.name in ("derive_seed", "prompt_rng", "Stream", "PromptStream")
    ]
    assert sorted(defined) == [
        ("llm/streams.py", "PromptStream"),
        ("llm/streams.py", "prompt_rng"),
        ("sandbox/streams.py", "Stream"),
        ("sandbox/streams.py", "derive_seed"),
    ]
    assert Stream is sandbox.streams.Stream and derive_seed is sandbox.streams.derive_seed


def test_the_numbers_stay_those_of_the_committed_results():
    # the values the runs were drawn with before the streams had names (issue 26 item 6)
    assert {s.name: int(s) for s in Stream} == {
        "ROLLOUT": 0,
        "MINIBATCH": 1,
        "OBJECTIVE": 2,
        "EVAL": 3,
    }
    assert {s.name: int(s) for s in PromptStream} == {"TRAIN": 0, "EVAL": 1, "PROBE": 2}


@pytest.mark.parametrize("stream", list(Stream))
def test_a_named_stream_draws_what_its_number_drew(stream):
    keys = (7, 3, 1, 0, 2)
    assert derive_seed(5, stream, *keys) == derive_seed(5, int(stream), *keys)
    # distinct streams (and positions) give distinct seeds
    others = {derive_seed(5, s, *keys) for s in Stream if s != stream}
    assert derive_seed(5, stream, *keys) not in others


@pytest.mark.parametrize("stream", list(PromptStream))
def test_a_prompt_stream_draws_what_default_rng_drew(stream):
    named = prompt_rng(11, stream).integers(0, 2**31, size=8)
    plain = np.random.default_rng([11, int(stream)]).integers(0, 2**31, size=8)
    np.testing.assert_array_equal(named, plain)
