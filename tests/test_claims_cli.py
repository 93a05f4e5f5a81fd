"""The claims study's llm-rung settings on the command line, and the task pilot (llm.pilot)."""

from __future__ import annotations

import pandas as pd
import pytest

from llm.claims import LLM_DEFAULTS, llm_epochs, llm_spec, main, parse_args
from sandbox.study import RUNGS, StudyJob, calibration_jobs


def test_llm_flag_sets_the_rungs_grids_and_calibration_crosses_them():
    config, _ = parse_args(
        ["--quick", "--rungs", "llm", "--llm", "lrs=[1e-3,2e-3]", "epochs=[2,4]", "ensemble=2"]
    )
    assert config.extra["llm"]["ensemble"] == 2 and llm_epochs(config) == [2, 4]
    jobs = calibration_jobs(config)
    assert sorted((j.lr, j.epochs) for j in jobs) == [(1e-3, 2), (1e-3, 4), (2e-3, 2), (2e-3, 4)]
    assert RUNGS["llm"].grid(config) == [1e-3, 2e-3]


def test_llm_flag_names_an_unknown_setting(capsys):
    assert main(["--quick", "--llm", "bogus=1"]) == 2
    assert "--llm: unknown settings ['bogus']" in capsys.readouterr().err


def test_the_llm_rungs_default_task_is_the_tiny_tf_task_through_its_knobs():
    config, _ = parse_args(["--profile", "gpu"])
    spec = llm_spec(config, StudyJob("study", "llm", "dapo", 1e-5, 2, 0), seeds=1, steps=100)
    assert LLM_DEFAULTS["task"] == config.tf_task and LLM_DEFAULTS["task_knobs"] == config.tf_knobs
    assert spec.setting == "mod_arith-steps2"
    assert dict(spec.definition) == {"task": "mod_arith", "steps": 2}


def test_pilot_parses_tasks_and_finds_numbers():
    from llm.pilot import numbers, parse_task

    assert parse_task("addition:digits=3,num_terms=2") == (
        "addition",
        {"digits": 3, "num_terms": 2},
    )
    assert parse_task("mod_arith") == ("mod_arith", {})
    with pytest.raises(ValueError, match="key=value"):
        parse_task("addition:digits")
    assert numbers("so 1,227 and -3 then 40.") == ["1227", "-3", "40"]


def test_pilot_writes_one_row_per_task_with_its_provenance(tmp_path, capsys):
    from llm.pilot import main as pilot

    out = tmp_path / "pilot.csv"
    argv = ["--model", "tiny", "--tasks", "addition:digits=1", "parity:length=4"]
    assert pilot([*argv, "--prompts", "3", "--max-new-tokens", "2", "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert frame["task"].tolist() == ["addition", "parity"] and set(frame["prompts"]) == {3}
    for col in ("pass_at_1", "answer_anywhere", "forced_greedy", "group_signal"):
        assert frame[col].between(0, 1).all()
    # a group of G = 8 has a success with probability 1 - (1 - p)^8
    assert (frame["group_signal"] == 1 - (1 - frame["pass_at_1"]) ** 8).all()
    assert frame["command"].iloc[0].startswith("python -m llm.pilot --model tiny")
    assert pilot(["--tasks", "x", "--prompts", "0", "--out", str(out)]) == 2


def test_a_study_whose_rules_make_no_claim_ends_with_an_empty_ledger(tmp_path, capsys):
    argv = ["--quick", "--rungs", "bandit_exact", "--rules", "dapo", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "c")]) == 0
    assert "empty ledger" in capsys.readouterr().out
