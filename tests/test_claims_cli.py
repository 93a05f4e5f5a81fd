"""The claims study's llm-rung settings on the command line, and the task pilot (llm.pilot)."""

from __future__ import annotations

import pandas as pd
import pytest

from llm.claims import llm_spec, main, parse_args
from sandbox.study import RUNGS, StudyJob, calibration_jobs


def test_llm_flag_sets_the_rungs_grids_and_calibration_crosses_them():
    grids = ["--llm-lrs", "1e-3", "2e-3", "--llm-epochs", "2", "4", "--llm-ensemble", "2"]
    config, _ = parse_args(["--quick", "--rungs", "llm", *grids])
    assert config.section("llm").ensemble == 2 and RUNGS["llm"].epochs(config) == [2, 4]
    jobs = calibration_jobs(config)
    assert sorted((j.lr, j.epochs) for j in jobs) == [(1e-3, 2), (1e-3, 4), (2e-3, 2), (2e-3, 4)]
    assert RUNGS["llm"].lrs(config) == [1e-3, 2e-3]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--llm", "lrs=[1e-5]"], "error: --llm KEY=VALUE is gone: one flag per setting: "),
        (["--llm-extra=--lr 1e-5"], "error: --llm-extra is gone: one flag per setting: "),
        (["--llm-lr", "1e-5"], "error: --llm-lr is gone: the step-size grid is --llm-lrs\n"),
        (["--seeds", "3"], "error: --seeds is gone: paired seeds are set per rung (--bandit-seeds"),
        (["--llm-bogus", "1"], "error: unrecognized arguments: --llm-bogus 1\n"),
    ],
)
def test_a_removed_or_unknown_flag_is_one_line_naming_it(capsys, flags, message):
    if "unrecognized" in message:  # argparse's own error, as one line
        with pytest.raises(SystemExit, match="2"):
            main(["--quick", *flags])
    else:
        assert main(["--quick", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_the_one_way_to_set_the_llm_step_size_grid_reaches_the_trainer():
    """``--llm-lrs`` is the llm rung's grid; calibration runs each point, and a job's spec
    gives ``llm.train`` that step size (TrainConfig.lr)."""
    import llm.runs
    from sandbox.study.plan import job_spec

    config, _ = parse_args(["--quick", "--rungs", "llm", "--llm-lrs", "3e-5", "7e-5"])
    jobs = calibration_jobs(config)
    assert [j.lr for j in jobs] == [3e-5, 7e-5]
    assert [llm.runs.train_config(job_spec(config, j)).lr for j in jobs] == [3e-5, 7e-5]


@pytest.mark.parametrize("flags", [[], ["--paper-aggregation"]], ids=["token-mean", "paper"])
def test_every_sampled_rung_runs_with_the_studys_aggregation_and_probes(flags):
    """One place (``probe_settings``) decides the aggregation and the mechanism probes of the
    toy and llm rungs alike; the exact bandit flow takes neither."""
    from sandbox.study import probe_settings
    from sandbox.study.plan import job_spec

    config, _ = parse_args(["--quick", *flags])
    for rule in ("dapo", "nsr_dapo"):  # nsr_dapo has an expectation: probe (c) on
        probes = probe_settings(config, rule)
        assert probes["aggregation"] == (None if flags else "token-mean")
        assert probes.get("grad_noise", False) == (rule == "nsr_dapo")
        for rung in ("bandit_sampled", "tiny_tf", "llm"):
            train = dict(job_spec(config, StudyJob("study", rung, rule, 1.0, 2, 0)).train)
            assert {k: train.get(k) for k in probes} == probes, rung
        exact = job_spec(config, StudyJob("study", "bandit_exact", rule, 1.0, 2, 0))
        assert dict(exact.train) == {}


def test_the_llm_rungs_default_task_is_the_pilots_balanced_mod_arith():
    config, _ = parse_args(["--profile", "gpu"])
    spec = llm_spec(config, StudyJob("study", "llm", "dapo", 1e-5, 2, 0), seeds=1, steps=100)
    llm = config.section("llm")
    assert (llm.task, llm.task_knobs) == ("mod_arith", {"steps": 2, "ops": ["+", "-"]})
    assert spec.setting == "mod_arith-ops+--steps2"
    assert dict(spec.definition) == {"task": "mod_arith", "steps": 2, "ops": ("+", "-")}


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


#: The papers' claims (sandbox.study.claims.CLAIMS) and the rules each needs besides dapo.
EVERY_CLAIM = (
    "nsr_beats_dapo, nsr_beats_its_decay, dgpo_beats_hard_clip, atr_beats_grpo, "
    "clip_cov_keeps_entropy, kl_cov_keeps_entropy, clip_beats_unclipped"
)
THEIR_RULES = (
    "nsr_dapo, nsr_decay_dapo, dgpo_1p5b, grpo, atr_grpo, clip_cov_verl, kl_cov_verl, unclipped"
)


@pytest.mark.parametrize("rules", [["dapo"], ["gppo", "dapo"]], ids=["dapo", "gppo-dapo"])
def test_a_study_whose_rules_make_no_claim_ends_with_an_empty_ledger(tmp_path, capsys, rules):
    """Issue 39: ``--rules gppo dapo`` dropped every claim silently; a note says which and why
    before anything runs (the study still calibrates and runs the rules)."""
    argv = ["--quick", "--rungs", "bandit_exact", "--rules", *rules, "--no-progress"]
    # --workers 1: the runs in this process (a pool's start costs more than these tiny runs)
    assert main([*argv, "--workers", "1", "--out", str(tmp_path / "c")]) == 0
    out, err = capsys.readouterr()
    assert "empty ledger" in out
    assert err.splitlines()[0] == (
        f"note: --rules leaves out every claim ({EVERY_CLAIM}: they need the rules "
        f"{THEIR_RULES}); the ledger will be empty (--claim NAME:A>B tests a claim of your own)"
    )


def test_rules_that_leave_out_some_claims_are_named_with_the_claims_kept():
    from sandbox.study.rungs import rules_note

    config, _ = parse_args(["--quick", "--rules", "dapo", "nsr_dapo"])
    # nsr_beats_dapo (nsr_dapo vs dapo) is kept; the other six need a rule not given
    assert rules_note(config) == (
        "note: --rules leaves out the claims nsr_beats_its_decay, dgpo_beats_hard_clip, "
        "atr_beats_grpo, clip_cov_keeps_entropy, kl_cov_keeps_entropy, clip_beats_unclipped "
        "(they need the rules nsr_decay_dapo, dgpo_1p5b, grpo, atr_grpo, clip_cov_verl, "
        "kl_cov_verl, unclipped); the ledger tests the other 1"
    )
    every, _ = parse_args(["--claim", "mine:grpo>gspo"])  # the default rules: every claim's
    assert rules_note(every) is None


@pytest.mark.parametrize("rung", ["tiny_tf", "llm"])
def test_the_split_flag_reaches_the_trainer_and_the_answer_floor(rung):
    """``--tf-split`` / ``--llm-split``: the rung's runs train on the task's train partition and
    score its test partition, and the answer floor is computed on those test problems; off, a
    spec carries no ``split`` (the specs of the committed study are unchanged)."""
    from envs.reasoning import make_task, problem_split
    from sandbox.study.plan import job_spec

    section = "tf" if rung == "tiny_tf" else "llm"
    job = StudyJob("study", rung, "dapo", 1e-3, 2, 0)
    plain, _ = parse_args(["--quick", "--rungs", rung])
    split, _ = parse_args(["--quick", "--rungs", rung, f"--{section}-split"])
    assert "split" not in dict(job_spec(plain, job).train)
    assert dict(job_spec(split, job).train)["split"] is True
    assert split.section(section).split and not plain.section(section).split
    if rung == "llm":
        import llm.runs

        assert llm.runs.train_config(job_spec(split, job)).split is True
        return
    from sandbox.study.rungs import _tiny_tf_bounds
    from sandbox.train.sequence import held_out_problems

    tf = split.section("tf")
    task = make_task(tf.task, **tf.knobs)
    held = held_out_problems(task, 0, 64, 0, True)[0]
    assert {problem_split(p) for p in held} == {"test"}
    assert _tiny_tf_bounds(split).floor >= 0 and _tiny_tf_bounds(split) != _tiny_tf_bounds(plain)
