"""The claims study (sandbox.experiments.study, python -m llm.claims): calibration, pairing by
seed, the ledger of the study, the gradient-mass shares, the tiny_tf evaluation, and resumption
after a real SIGINT."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from sandbox.experiments import evidence
from sandbox.experiments.runs import bandit_config, sequence_config, setting_model
from sandbox.experiments.study import (
    StudyConfig,
    calibrate,
    pick_step_size,
    run_scores,
    study_ledger,
)
from sandbox.loss import grad_mass_shares
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
    config = StudyConfig(epochs=3, tf_epochs=["4", 8])  # an old config.json; the CLI's strings
    assert (config.epochs, config.tf_epochs) == ([3], [4, 8])
    for bad in ([], [0], [2.5], ["x"]):
        with pytest.raises(ValueError, match="tf_epochs"):
            StudyConfig(tf_epochs=bad)


def test_calibration_jobs_cross_each_rungs_step_sizes_with_its_mu_grid():
    from sandbox.experiments.study import calibration_jobs, job_part, job_spec

    config = StudyConfig(
        rungs=["bandit_sampled", "tiny_tf"],
        bandit_lrs=[1.0],
        epochs=[2],
        tf_lrs=[1e-3, 3e-3],
        tf_epochs=[4, 8],
    )
    jobs = calibration_jobs(config)
    assert [(j[1], j[3], j[4]) for j in jobs] == [
        ("bandit_sampled", 1.0, 2),
        ("tiny_tf", 1e-3, 4),
        ("tiny_tf", 3e-3, 4),
        ("tiny_tf", 1e-3, 8),
        ("tiny_tf", 3e-3, 8),
    ]
    assert [job_spec(config, j).epochs for j in jobs] == [2, 4, 4, 8, 8]
    assert len({job_part(j) for j in jobs}) == 5  # mu is in the part name


def test_calibration_on_a_real_bandit_picks_the_step_size_whose_dapo_clip_share_is_in_band():
    # SGD on a bandit: a larger step moves the ratio further, so dapo clips more; with the grid
    # 0.25 / 2 / 16 only the middle one lands in a band around its own measured share
    from sandbox.experiments.study import calibration_curve, calibration_jobs, run_job

    config = StudyConfig(
        rungs=["bandit_sampled"],
        calib_seeds=8,
        calib_steps=6,
        bandit_lrs=[0.25, 2.0, 16.0],
        bandit_setting="mixed",
    )
    rows = pd.concat([run_job(config, j)[0] for j in calibration_jobs(config)])
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
    from sandbox.experiments.study import RUNGS

    config = StudyConfig(tf_task="bits", tf_knobs={"op": "reverse", "length": 3}, tf_eval_prompts=4)
    specs = [RUNGS[kind].spec(config, rule, 0.01, 3, 2, 5) for rule in ("dapo", "nsr_dapo")]
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


# -- gradient-mass shares ---------------------------------------------------------------------


def test_grad_mass_shares_by_hand():
    # four tokens, eps 0.2 / 0.28:
    # t0 A=+1, r=e^0.5=1.6487 > 1.28: hard clip binds, coef 0  -> Z_hi mass 1.6487
    # t1 A=-1, r=e^-0.5=0.6065 < 0.8: binds, coef 0             -> Z_lo mass 0.6065
    # t2 A=+2, r=1: inside, coef 2                               -> kept, mass 2
    # t3 A=-1, r=e^-0.5: binds, but coef -0.3 (a rescue)         -> rescued mass 0.6065
    logp_old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.tensor([[0.5, -0.5, 0.0, -0.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0]], dtype=torch.float64)
    coef = torch.tensor([[0.0, 0.0, 2.0, -0.3]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    out = grad_mass_shares(coef, logp, logp_old, adv, mask, 0.2, 0.28)
    e, m = np.exp(0.5), np.exp(-0.5)
    total = e + m + 2 + m
    assert out["grad_mass_zero_hi"].item() == pytest.approx(e / total, abs=1e-12)
    assert out["grad_mass_zero_lo"].item() == pytest.approx(m / total, abs=1e-12)
    assert out["grad_mass_rescued"].item() == pytest.approx(m / total, abs=1e-12)
    # a masked token counts nowhere
    mask[0, 0] = 0
    out = grad_mass_shares(coef, logp, logp_old, adv, mask, 0.2, 0.28)
    assert out["grad_mass_zero_hi"].item() == 0.0
    assert out["grad_mass_zero_lo"].item() == pytest.approx(m / (total - e), abs=1e-12)


def test_grad_mass_metrics_leave_the_loss_unchanged():
    from sandbox.loss import PolicyLoss
    from sandbox.objectives import get_objective

    g = torch.Generator().manual_seed(0)
    logp_old = torch.randn(4, 5, generator=g, dtype=torch.float64)
    logp = logp_old + 0.4 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    adv, mask = torch.randn(4, 1, generator=g, dtype=torch.float64), torch.ones(4, 5)
    obj = get_objective("dapo")
    plain = PolicyLoss(obj)(logp, logp_old, adv, mask)
    measured = PolicyLoss(obj, grad_mass=True)(logp, logp_old, adv, mask)
    assert torch.equal(plain.loss, measured.loss)
    assert set(measured.metrics) - set(plain.metrics) == {
        "grad_mass_zero_lo",
        "grad_mass_zero_hi",
        "grad_mass_rescued",
    }
    # dapo never rescues: a token where the hard clip binds has coef 0
    assert measured.metrics["grad_mass_rescued"].item() == 0.0


# -- the study's analysis ---------------------------------------------------------------------


def _rows(values: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    """Study rows of one step per (rung, rule, seed) with the given final pass."""
    out = []
    for (rung, rule), finals in values.items():
        for seed, v in enumerate(finals):
            out.append(
                {
                    "phase": "study",
                    "rung": rung,
                    "rule": rule,
                    "lr": 1.0,
                    "epochs": 2,
                    "seed": seed,
                    "step": 1,
                    "pass_rate": v,
                    "train_reward": v,
                    "eval_pass": np.nan,
                    "entropy": 1.0,
                    "clip_low_frac": 0.01,
                    "clip_high_frac": 0.02,
                    "rescue_frac": np.nan,
                    "grad_mass_zero_lo": 0.0,
                    "grad_mass_zero_hi": 0.0,
                    "grad_mass_rescued": 0.0,
                }
            )
    return pd.DataFrame(out)


def test_study_ledger_by_hand_and_exact_rung_by_sign():
    from sandbox.experiments.claims import CLAIMS

    claim = [c for c in CLAIMS if c.name == "nsr_beats_dapo"]
    # sampled: differences 0.1, 0.2, 0.3 -> mean 0.2, sd 0.1, t(0.975, 2) = 4.302653:
    # half-width 4.302653 * 0.1 / sqrt(3) = 0.248414
    rows = _rows(
        {
            ("bandit_sampled", "nsr_dapo"): [0.6, 0.7, 0.8],
            ("bandit_sampled", "dapo"): [0.5, 0.5, 0.5],
            ("bandit_exact", "nsr_dapo"): [0.4],
            ("bandit_exact", "dapo"): [0.45],
        }
    )
    table = study_ledger(run_scores(rows), claim).set_index("rung")
    s = table.loc["bandit_sampled"]
    assert s["estimate"] == pytest.approx(0.2, abs=1e-12)
    assert s["lo"] == pytest.approx(0.2 - 0.248414, abs=1e-6)
    assert s["hi"] == pytest.approx(0.2 + 0.248414, abs=1e-6)
    assert s["verdict"] == evidence.UNRESOLVED
    e = table.loc["bandit_exact"]
    assert e["estimate"] == pytest.approx(-0.05, abs=1e-12)
    assert e["verdict"] == evidence.REVERSED and e["reason"] == "exact difference"
    assert np.isnan(e["p"])  # an exact difference is not a test
    # an exact gap of +0.01 is within the 0.02 margin: equivalent, not "supported"
    rows = _rows({("bandit_exact", "nsr_dapo"): [0.46], ("bandit_exact", "dapo"): [0.45]})
    e = study_ledger(run_scores(rows), claim).iloc[0]
    assert e["estimate"] == pytest.approx(0.01, abs=1e-12)
    assert e["verdict"] == evidence.EQUIVALENT
    assert e["reason"] == "exact difference within +-0.02"


def test_nsr_and_its_decay_are_identical_by_construction_on_the_exact_flow_only():
    from sandbox.experiments.claims import CLAIMS
    from sandbox.experiments.study import same_on_exact_flow

    assert same_on_exact_flow("nsr_dapo", "nsr_decay_dapo")  # NSR acts as its expectation there
    assert not same_on_exact_flow("dapo", "grpo") and not same_on_exact_flow("nsr_dapo", "dapo")
    claim = [c for c in CLAIMS if c.name == "nsr_beats_its_decay"]
    rows = _rows(
        {
            ("bandit_exact", "nsr_dapo"): [0.5],
            ("bandit_exact", "nsr_decay_dapo"): [0.5],
            ("bandit_sampled", "nsr_dapo"): [0.6, 0.7, 0.8],
            ("bandit_sampled", "nsr_decay_dapo"): [0.5, 0.5, 0.5],
        }
    )
    table = study_ledger(run_scores(rows), claim).set_index("rung")
    assert table.loc["bandit_exact", "verdict"] == evidence.IDENTICAL
    assert table.loc["bandit_sampled", "verdict"] == evidence.UNRESOLVED  # sampled: a comparison


def test_like_unclipped_reads_the_realised_effect():
    from sandbox.experiments.study import like_unclipped

    base = [0.5, 0.6, 0.7, 0.8]
    rows = []
    for rule, shift in (("unclipped", 0.0), ("kl_cov_verl", 0.001), ("dapo", -0.1)):
        for seed, b in enumerate(base):
            wobble = 0.002 * (-1) ** seed if rule == "kl_cov_verl" else 0.0
            rows.append({"rung": "r", "rule": rule, "seed": seed, "reward_auc": b + shift + wobble})
    scores = pd.DataFrame(rows)
    # kl_cov - unclipped: 0.003, -0.001, 0.003, -0.001 -> mean 0.001, interval within +-0.02
    assert like_unclipped(scores, "r", "kl_cov_verl")
    assert not like_unclipped(scores, "r", "dapo")  # 0.1 below: reversed, not equivalent
    assert not like_unclipped(scores, "r", "unclipped")  # not compared with itself
    assert not like_unclipped(scores[scores["seed"] == 0], "r", "kl_cov_verl")  # one pair: no


def test_rank_agreement_with_and_without_the_step_size_rule():
    from sandbox.experiments.study import rank_agreement

    # rung a orders dapo > grpo > nsr_dapo > gspo on every seed; rung b agrees on gspo last but
    # reverses the other three: with gspo, 3 concordant (pairs with gspo) and 3 discordant of 6
    # untied pairs -> tau-b 0; without gspo, all 3 discordant -> -1
    base = np.array([0.0, 0.01, -0.01])
    a = {
        ("a", r): list(v + base)
        for r, v in zip(["dapo", "grpo", "nsr_dapo", "gspo"], [0.9, 0.6, 0.3, 0.0], strict=True)
    }
    b = {
        ("b", r): list(v + base)
        for r, v in zip(["dapo", "grpo", "nsr_dapo", "gspo"], [0.3, 0.6, 0.9, 0.0], strict=True)
    }
    table = rank_agreement(run_scores(_rows({**a, **b})), draws=50).set_index("without")
    assert table.loc["", "tau_b"] == pytest.approx(0.0, abs=1e-12)
    assert table.loc["gspo", "tau_b"] == pytest.approx(-1.0, abs=1e-12)


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
    "--seeds",
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


def test_entropy_law_logging_is_exact_and_its_error_is_second_order_in_the_step():
    """``entropy_change`` is the next step's entropy minus this one's, exactly; the law's
    prediction is first order, so halving one SGD step (same seed: the same first rollout,
    dz exactly proportional to lr) cuts its error by about 4."""
    import envs
    from sandbox.train import BanditTrainConfig, run_bandit

    model = envs.make_bandit_suite()["mixed"].make().unwrapped
    errors = []
    for lr in (0.4, 0.2):
        cfg = BanditTrainConfig(
            objective="dapo",
            seeds=8,
            steps=3,
            lr=lr,
            epochs=1,
            minibatches=1,
            entropy_law=True,
            dtype="float64",
        )
        frame = run_bandit(model, cfg).to_frame()
        h = frame.pivot(index="step", columns="seed", values="entropy").to_numpy()
        change = frame.pivot(index="step", columns="seed", values="entropy_change").to_numpy()
        np.testing.assert_allclose(change[:-1], h[1:] - h[:-1], rtol=0, atol=1e-12)
        first = frame[frame["step"] == 0]
        errors.append(np.abs(first["entropy_change"] - first["entropy_change_pred"]).to_numpy())
    ratio = errors[0].sum() / errors[1].sum()
    assert 3.0 < ratio < 5.0, ratio


def test_the_tiny_tf_rung_logs_the_entropy_law_and_its_table_has_a_row():
    """The study turns ``entropy_law`` on for tiny_tf as for bandit_sampled: a study job's rows
    carry both columns at every (step, seed), and :func:`entropy_law` tabulates the rung."""
    from sandbox.experiments.study import RUNGS, entropy_law, run_job

    config = StudyConfig(
        rungs=["tiny_tf"],
        seeds=2,
        tf_steps=2,
        tf_task="bits",
        tf_knobs={"op": "reverse", "length": 3},
        tf_eval_prompts=4,
    )
    assert sequence_config(RUNGS["tiny_tf"].spec(config, "dapo", 0.01, 2, 2, 0)).entropy_law
    rows = run_job(config, ("study", "tiny_tf", "dapo", 0.01, 4, 0))[0]
    law = rows[["entropy_change", "entropy_change_pred"]]
    assert len(rows) == 2 * 2 and law.notna().all().all() and (law != 0).any().all()
    table = entropy_law(rows)
    assert table[["rung", "rule", "points"]].values.tolist() == [["tiny_tf", "dapo", 4]]
