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
