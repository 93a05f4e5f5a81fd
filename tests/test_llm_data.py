"""llm.data: the verifiers, GSM8K-style answers, and JSONL / parquet rows (training on them, and
on a saved model loaded back from its directory)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("transformers")

from test_llm_train_loop import config

from llm.data import exact_match, numeric_match, read_rows
from llm.train import train


def test_exact_and_numeric_match_read_the_final_answer():
    assert read_rows  # imported
    assert exact_match("Paris", "The answer is\n\\boxed{paris}") == 1.0
    assert exact_match("Paris", "Answer: Lyon") == 0.0
    assert numeric_match("1234", "so the total is 1,234.") == 1.0
    assert numeric_match("3.5", "Answer: 7/2") == 1.0
    assert numeric_match("72", "72 apples\nthen 71") == 0.0


def test_a_gsm8k_answer_keeps_the_part_after_the_last_hashes(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"prompt": "q", "answer": "3 + 4 = 7\n#### 7"}) + "\n")
    assert read_rows(str(path)) == (["q"], ["7"])


def test_jsonl_parquet_and_local_model(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(4) for b in range(3)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    out = train(
        config(
            tmp_path,
            "j",
            task=None,
            data=str(jsonl),
            eval_every=1,
            eval_prompts=2,
            save_model=True,
            steps=1,
        )
    )
    assert "eval_pass@4" in out[0]
    pd = pytest.importorskip("pandas")
    parquet = tmp_path / "d.parquet"
    pd.DataFrame(rows).to_parquet(parquet)
    assert read_rows(str(parquet)) == read_rows(str(jsonl))
    # the saved model loads back as a local directory
    local = train(
        config(
            tmp_path,
            "local",
            model=str(tmp_path / "j" / "model"),
            task=None,
            data=str(parquet),
            steps=1,
        )
    )
    assert math.isfinite(local[0]["grad_norm"])


def test_split_draws_training_prompts_and_held_out_problems_from_disjoint_partitions():
    """llm.train's --split: the held-out problems lie in the task's test partition, every
    training draw in its train partition; without it, 1-digit addition's 100 problems let the
    held-out set repeat training problems (the llm rung's CPU profile before it)."""
    import numpy as np

    from envs.reasoning import problem_split
    from llm.data import make_source

    knobs = {"digits": 1}
    split = make_source("addition", knobs, None, "auto", 0, 128, split=True)
    train, _ = split.draw(np.random.default_rng(0), 256)
    assert {problem_split(p) for p in split.eval_prompts} == {"test"}
    assert {problem_split(p) for p in train} == {"train"}
    assert not set(train) & set(split.eval_prompts)
    plain = make_source("addition", knobs, None, "auto", 0, 128)
    train, _ = plain.draw(np.random.default_rng(0), 256)
    assert set(train) & set(plain.eval_prompts)  # repeats without the partition


def test_split_is_for_tasks_not_files(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    with pytest.raises(ValueError, match="--split"):
        config(tmp_path, data=str(path), split=True).validate()


def test_llm_train_loads_its_prompts_with_the_split(tmp_path):
    from llm.train import load

    cfg = config(tmp_path, task="addition", task_knobs={"digits": 1}, split=True, eval_every=1)
    source = load(cfg)[0]
    assert source.name == "task:addition (train/test partitions)"
    assert load(config(tmp_path, task="addition", task_knobs={"digits": 1}))[0].name == (
        "task:addition"
    )
