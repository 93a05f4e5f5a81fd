"""The claims study's plan (sandbox.study.plan, python -m llm.claims): calibration, the jobs,
pairing by seed, the tiny_tf evaluation, the llm rung's one spec per seed, and resumption after
a real SIGINT."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from sandbox.experiments.runs import bandit_config, sequence_config, setting_model
from sandbox.study import StudyConfig, calibrate
from sandbox.study.plan import pick_step_size
from sandbox.train import SequenceTrainConfig
from sandbox.train.sequence import SequenceTrainer

ROOT = Path(__file__).resolve().parents[1]


# -- calibration ------------------------------------------------------------------------------


def test_pick_step_size_takes_the_point_nearest_the_band_middle_on_a_monotone_curve():
    # clip share rises with lr: 0.01, 0.04, 0.07, 0.095, 0.2; band [0.05, 0.10], middle 0.075:
    # 0.07 (|0.005|) beats 0.095 (|0.02|)
    curve = pd.DataFrame(
        {
            "lr": [0.5, 1.0, 2.0, 4.0, 8.0],
            "epochs": 2,
            "clip_share": [0.01, 0.04, 0.07, 0.095, 0.2],
        }
    )
    assert pick_step_size(curve, 0.05, 0.10) == (2.0, 2)
    # nothing inside [0.3, 0.4]: the nearest to the band is 0.2 (distance 0.1), at lr 8
    assert pick_step_size(curve, 0.3, 0.4) == (8.0, 2)
    # nothing inside [0.001, 0.005]: 0.01 at lr 0.5 is nearest (distance 0.005)
    assert pick_step_size(curve, 0.001, 0.005) == (0.5, 2)
    with pytest.raises(ValueError, match="curve"):
        pick_step_size(curve.iloc[:0], 0.05, 0.1)


def test_pick_step_size_searches_the_mu_grid_and_prefers_fewer_epochs_at_equal_distance():
    # 2 epochs never reach the band [0.05, 0.10] (best 0.045); 4 epochs reach 0.062 at lr 1
    # and 0.09 at lr 2: 0.062 is nearer the middle 0.075 (0.013 against 0.015)
    curve = pd.DataFrame(
        {
            "lr": [1.0, 2.0, 1.0, 2.0],
            "epochs": [2, 2, 4, 4],
            "clip_share": [0.03, 0.045, 0.062, 0.09],
        }
    )
    assert pick_step_size(curve, 0.05, 0.10) == (1.0, 4)
    # the same share at 2 and at 8 epochs: the cheaper mu wins, whatever the row order
    tie = pd.DataFrame({"lr": [1.0, 1.0], "epochs": [8, 2], "clip_share": [0.07, 0.07]})
    assert pick_step_size(tie, 0.05, 0.10) == (1.0, 2)


def test_mu_grids_read_an_int_as_a_grid_of_one_and_name_a_bad_value():
    config = StudyConfig(epochs=3, sections={"tf": {"epochs": ["4", 8]}})  # an old config.json
    assert (config.epochs, config.section("tf").epochs) == ([3], [4, 8])
    for bad in ([], [0], [2.5], ["x"]):
        with pytest.raises(ValueError, match="tf_epochs"):
            StudyConfig(sections={"tf": {"epochs": bad}})


def test_calibration_jobs_cross_each_rungs_step_sizes_with_its_mu_grid():
    from sandbox.study import calibration_jobs
    from sandbox.study.plan import job_part, job_spec

    config = StudyConfig(
        rungs=["bandit_sampled", "tiny_tf"],
        epochs=[2],
        sections={"bandit": {"lrs": [1.0]}, "tf": {"lrs": [1e-3, 3e-3], "epochs": [4, 8]}},
    )
    jobs = calibration_jobs(config)
    assert [(j.rung, j.lr, j.epochs) for j in jobs] == [
        ("bandit_sampled", 1.0, 2),
        ("tiny_tf", 1e-3, 4),
        ("tiny_tf", 3e-3, 4),
        ("tiny_tf", 1e-3, 8),
        ("tiny_tf", 3e-3, 8),
    ]
    assert [job_spec(config, j).epochs for j in jobs] == [2, 4, 4, 8, 8]
    assert len({j.stem for j in jobs}) == 5  # mu is in the part's readable name
    assert len({job_part(config, j) for j in jobs}) == 5


def test_calibration_on_a_real_bandit_picks_the_step_size_whose_dapo_clip_share_is_in_band():
    # SGD on a bandit: a larger step moves the ratio further, so dapo clips more; with the grid
    # 0.25 / 2 / 16 only the middle one lands in a band around its own measured share
    from sandbox.study import calibration_curve, calibration_jobs
    from sandbox.study.plan import run_jobs

    config = StudyConfig(
        rungs=["bandit_sampled"],
        calib_seeds=8,
        calib_steps=6,
        sections={"bandit": {"lrs": [0.25, 2.0, 16.0], "setting": "mixed"}},
    )
    rows = pd.concat([run_jobs(config, [j])[0] for j in calibration_jobs(config)])
    curve = calibration_curve(rows).sort_values("lr")
    share = curve["clip_share"].to_numpy()
    assert share[0] < share[1]  # a tiny step barely leaves the trust region
    band = (share[1] * 0.9, share[1] * 1.1)
    config.target_low, config.target_high = band
    assert calibrate(rows, config) == {"bandit_sampled": (2.0, 2)}


# -- pairing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bandit_sampled", "tiny_tf"])
def test_a_seed_fixes_initial_state_and_first_rollout_for_every_rule(kind):
    """Same seed, two rules (one with its own randomness, NSR): identical initial parameters
    and an identical first rollout (prompts, samples, rewards), replicate by replicate."""
    from sandbox.study import RUNGS, StudyJob

    tf = {"task": "bits", "knobs": {"op": "reverse", "length": 3}, "eval_prompts": 4, "init": None}
    config = StudyConfig(sections={"tf": tf})
    jobs = [StudyJob("study", kind, rule, 0.01, 2, 5) for rule in ("dapo", "nsr_dapo")]
    specs = [RUNGS[kind].spec(config, job, seeds=3, steps=2) for job in jobs]
    if kind == "tiny_tf":
        trainers = [SequenceTrainer(sequence_config(s)) for s in specs]
        a, b = (t.model.state_dict() for t in trainers)
        assert all(torch.equal(a[k], b[k]) for k in a)
        ra, rb = (t.rollout() for t in trainers)
        for name in ("prompt", "completion", "rewards", "adv", "logp_old"):
            assert torch.equal(getattr(ra, name), getattr(rb, name)), name
        assert trainers[0].held_out() == trainers[1].held_out()
    else:  # the initial logits are the model's own; the first rollout through the callback
        from sandbox.train import run_bandit

        model = setting_model(specs[0])
        first = []
        for s in specs:
            steps = []
            run_bandit(model, bandit_config(s), callback=steps.append)
            first.append(steps[0].rollout)
        for field in ("index", "rewards", "logp_old", "adv"):
            assert torch.equal(getattr(first[0], field), getattr(first[1], field)), field
        assert first[0].rewards.shape[0] == 3  # three replicates, each its own pair
        assert not torch.equal(first[0].index[0], first[0].index[1])  # replicates differ


def test_held_out_sets_are_per_replicate_the_same_for_every_rule_and_evaluation_is_per_seed():
    """Replicate s scores its own held-out set, fixed by (base seed, s): every rule the same one
    (pairs stay pairs), the replicates distinct ones; seed s's model is scored on set s."""
    cfg = SequenceTrainConfig(
        task="bits",
        task_knobs={"op": "reverse", "length": 3},
        seeds=2,
        steps=1,
        eval_prompts=16,
        eval_k=2,
        seed=3,
    )
    t = SequenceTrainer(cfg)
    sets = t.held_out()
    assert len(sets) == 2 and all(len(prompts) == 16 for prompts, _ in sets)
    assert sets[0] != sets[1]  # the replicates score distinct sets
    assert SequenceTrainer(dataclasses.replace(cfg, objective="nsr_dapo")).held_out() == sets
    assert SequenceTrainer(dataclasses.replace(cfg, seed=4)).held_out() != sets
    # fixed by (base seed, s), not by how many replicates run
    assert SequenceTrainer(dataclasses.replace(cfg, seeds=3)).held_out()[:2] == sets
    scored, rewards = [], t._rewards

    def recording(completion, completion_mask, answers):  # the real scoring, its answers kept
        scored.append(answers)
        return rewards(completion, completion_mask, answers)

    t._rewards = recording
    score = t.evaluate()
    assert score.shape == (2,)
    assert scored == [[a for _, answers in sets for a in answers for _ in range(2)]]
    # each value is a share of 16 x 2 verifier calls
    assert torch.all((score * 32).round() == score * 32) and torch.all((score >= 0) & (score <= 1))
    assert torch.equal(score, t.evaluate())  # its own stream: the same draw every time
    # evaluating leaves the training streams untouched: the next step is the one without it
    fresh = SequenceTrainer(cfg)
    after, plain = t.step(), fresh.step()
    assert all(torch.equal(after[k], plain[k]) for k in plain)


def test_quick_profile_runs_the_llm_rung_one_spec_per_paired_seed(tmp_path, capsys):
    from llm.claims import main

    out = tmp_path / "quick"
    argv = ["--quick", "--rules", "dapo", "nsr_dapo", "--rungs", "llm", "--workers", "1"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    parts = sorted(p.name for p in (out / "parts").glob("*.parquet"))
    # one calibration run (lr 1e-3), then 2 rules x 3 seeds, one part per seed
    assert len(parts) == 1 + 2 * 3 and sum(p.startswith("study__llm") for p in parts) == 6
    scores = pd.read_csv(out / "scores.csv")
    assert sorted(scores.groupby("rule")["seed"].apply(sorted).tolist()) == [[0, 1, 2]] * 2
    ledger = pd.read_csv(out / "ledger.csv")
    assert ledger[["claim", "rung", "seeds"]].values.tolist() == [["nsr_beats_dapo", "llm", 3]]


# -- resumption after a real SIGINT -----------------------------------------------------------

ARGV = [
    "-m",
    "llm.claims",
    "--rules",
    "dapo",
    "grpo",
    "nsr_dapo",
    "--rungs",
    "bandit_sampled",
    "--bandit-seeds",
    "4",
    "--calib-seeds",
    "2",
    "--calib-steps",
    "120",
    "--bandit-steps",
    "120",
    "--bandit-lrs",
    "1.0",
    "2.0",
    "4.0",
    "8.0",
    "--control-seeds",  # the cpu profile's control off: calibration and study parts only
    "0",
    "--workers",
    "2",
    "--no-progress",
]


def test_sigint_mid_study_then_resume_loses_and_duplicates_no_part(tmp_path):
    out = tmp_path / "claims"
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path}
    argv = [sys.executable, *ARGV, "--out", str(out)]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    parts = out / "parts"
    deadline = time.monotonic() + 120
    while not any(parts.glob("*.parquet")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no part written (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole process group
    try:
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    before = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.parquet")}
    assert 1 <= len(before) < 4 + 3  # interrupted mid-run: 4 calibration + 3 study parts in all
    assert not list(parts.glob(".*.tmp"))
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    calib = sum(name.startswith("calib") for name in before)
    assert f"{calib} of 4 runs already done" in done.stderr  # the calibration resumed
    if len(before) > calib:  # interrupted in the study phase: it resumed too
        assert f"{len(before) - calib} of 3 runs already done" in done.stderr
    after = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.parquet")}
    assert len(after) == 4 + 3
    assert all(after[name] == stamp for name, stamp in before.items())  # none recomputed
    rows = pd.read_parquet(out / "results.parquet")
    counts = rows.groupby(["phase", "rule", "lr"]).size()
    assert set(counts[("calib", "dapo")].to_numpy()) == {2 * 120}  # no run twice, none lost
    assert set(counts["study"].to_numpy()) == {4 * 120}


def test_the_claim_order_completes_the_papers_claims_soonest():
    """The reference first; then the rule completing the most claims, then the one in the most
    open claims, then the given order: the issue-40 minimum set (dapo, nsr_dapo, nsr_decay_dapo,
    unclipped, grpo, dgpo_1p5b) is the first six, completing 4 of the 7 claims."""
    from sandbox.study.claims import CLAIMS
    from sandbox.study.plan import claim_order
    from sandbox.study.rungs import StudyConfig

    rules = StudyConfig().rules
    order = claim_order(rules, CLAIMS)
    assert sorted(order) == sorted(rules)
    assert order[:6] == ["dapo", "nsr_dapo", "nsr_decay_dapo", "unclipped", "grpo", "dgpo_1p5b"]
    assert sum(set(c.rules) <= set(order[:6]) for c in CLAIMS) == 4
    assert claim_order(["grpo", "gspo"], CLAIMS) == ["grpo", "gspo"]  # no reference: as given


TOY_RUNGS = ("bandit_exact", "bandit_sampled", "tiny_tf")


@pytest.mark.slow
def test_a_study_on_ray_writes_the_local_pools_parts_and_tables(tmp_path):
    """``python -m llm.claims --backend ray``: each unit a Ray task that imports what the command
    registers (the llm rung), runs from the driver's working directory (a relative --out means
    the same folder) and writes its parts where the driver reads them; every rung's parts and
    the tables equal the local pool's, byte for byte."""
    pytest.importorskip("ray")
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path}
    study = ["-m", "llm.claims", "--quick", "--rules", "dapo", "nsr_dapo", "--no-progress"]
    for out, backend in (("ray", "ray"), ("local", "local")):
        argv = [sys.executable, *study, "--workers", "2", "--backend", backend, "--out", out]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "local" / "parts").glob("*.parquet"))
    assert {name.split("__")[1] for name in names} == {*TOY_RUNGS, "llm"}  # the llm rung's too
    assert sorted(p.name for p in (tmp_path / "ray" / "parts").glob("*.parquet")) == names
    for table in ("calibration.csv", "scores.csv", "ledger.csv", "transfer.csv"):
        assert (tmp_path / "ray" / table).read_bytes() == (tmp_path / "local" / table).read_bytes()
