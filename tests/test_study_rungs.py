"""The study's rungs (sandbox.study.rungs): every registered rung read through its kind's traits
(``test_every_registered_rung_reads_its_kind``, generic over :data:`RUNGS`), a throwaway rung
on a throwaway kind run end to end with no other edit, and what the rungs log: the
gradient-mass shares and the entropy-covariance law, on every rung that turns them on."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from sandbox.configs import arg
from sandbox.experiments.runs import (
    RunSpec,
    has_exact_flow,
    register_run,
    run_kind,
    run_specs,
    sequence_config,
    tidy,
    trainer_config,
    unregister_run,
)
from sandbox.loss import grad_mass_shares
from sandbox.study import RUNGS, Rung, StudyConfig, register_rung, run_study
from sandbox.study.cli import parse_study_args
from sandbox.study.plan import StudyJob, job_rows, job_spec, study_jobs
from sandbox.study.rungs import (
    SECTIONS,
    register_section,
    rung_rules,
    unregister_rung,
    unregister_section,
)

pytest.importorskip("transformers")
import llm.claims  # noqa: F401  (registers the llm rung)

ROOT = Path(__file__).resolve().parents[1]
ALL_RULES = ["dapo", "grpo", "nsr_dapo", "clip_cov_verl", "kl_cov_verl", "gspo"]


# -- every registered rung, read through its kind's traits --------------------------------------


@pytest.mark.parametrize("name", list(RUNGS))
def test_every_registered_rung_reads_its_kind(name):
    """A rung's kind is registered and its spec is of that kind; a deterministic kind runs only
    the rules whose flow it admits (``has_exact_flow`` on the rung's own spec), a sampled one
    every rule; the study's jobs follow the kind's ``replicates``; a kind with a trainer config
    validates the rung's spec; a job's rows read the kind's score columns."""
    rung = RUNGS[name]
    kind = run_kind(rung.kind)
    config = StudyConfig(rules=ALL_RULES, rungs=[name])
    lr, mu = rung.lrs(config)[0], rung.epochs(config)[0]
    rules = rung_rules(config, name)
    assert "dapo" in rules
    for rule in ALL_RULES:
        spec = job_spec(config, StudyJob("study", name, rule, lr, mu, 0))
        assert spec.kind == kind.name and spec.rule == rule and spec.epochs == mu
        if kind.deterministic:
            assert (rule in rules) == has_exact_flow(spec)
        else:
            assert rule in rules
        if kind.config is not None and rule in rules:
            assert trainer_config(spec) is not None
    jobs = study_jobs(config, {name: (lr, mu)})
    seeds = sorted({j.seed for j in jobs})
    paired = config.section(rung.section).seeds
    assert config.seeds(name) == paired
    assert seeds == ([0] if kind.replicates else list(range(paired)))
    assert len(jobs) == len(seeds) * len(rules)
    if not kind.deterministic:  # a flow's spec trains no replicates
        spec = job_spec(config, jobs[0])
        assert spec.seeds == (paired if kind.replicates else 1)


def test_a_rung_of_an_exact_kind_leaves_out_what_it_has_no_flow_of():
    """``--rules dapo clip_cov --rungs bandit_exact``: clip_cov has no closed-form expected
    coefficient, so the flow runs dapo only (no error, no traceback)."""
    config = StudyConfig(rules=["dapo", "clip_cov"], rungs=["bandit_exact"])
    assert rung_rules(config, "bandit_exact") == ["dapo"]
    assert rung_rules(config, "bandit_sampled") == ["dapo", "clip_cov"]


def test_the_cli_gives_a_clean_result_for_a_rule_without_an_exact_flow(tmp_path):
    """The command of the issue: a clean error (the reference rule is missing) and, with it, a
    study whose exact rung holds no clip_cov row; never a traceback."""
    cmd = [sys.executable, "-m", "llm.claims", "--quick", "--no-progress", "--workers", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = subprocess.run(
        [*cmd, "--rules", "clip_cov", "--rungs", "bandit_exact", "--out", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == "error: rules must include the reference rule 'dapo'"
    out = tmp_path / "b"
    ok = subprocess.run(
        [*cmd, "--rules", "dapo", "clip_cov", "--rungs", "bandit_exact", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert ok.returncode == 0, ok.stderr
    scores = pd.read_csv(out / "scores.csv")
    assert scores[["rung", "rule"]].drop_duplicates().values.tolist() == [["bandit_exact", "dapo"]]


# -- a new rung needs no other edit -------------------------------------------------------------

#: The throwaway kind's pass rate per rule; its clip share is lr / 100 (calibration's band is
#: 5-10%: of the grid 1, 7, 20 only 7 lies inside).
BASE = {"dapo": 0.5, "nsr_dapo": 0.6}


def _throwaway_run(spec: RunSpec) -> pd.DataFrame:
    """A kind without a trainer: replicate s of rule r passes BASE[r] + slope(r) * s at every
    step (paired by seed), and clips lr / 100 of its tokens."""
    slope = 0.02 if spec.rule == "nsr_dapo" else 0.01
    rows = [
        {
            "seed": s,
            "step": t,
            "pass_rate": BASE[spec.rule] + slope * s,
            "reward": BASE[spec.rule] + slope * s,
            "entropy": 1.0,
            "clip_low_frac": spec.lr / 200,
            "clip_high_frac": spec.lr / 200,
        }
        for s in range(spec.seeds)
        for t in range(spec.steps)
    ]
    return tidy(spec, pd.DataFrame(rows))


@dataclass(frozen=True)
class ThrowawaySettings:
    """The throwaway rung's own settings: its grid, run length and paired seeds."""

    lrs: list[float] = arg([1.0, 7.0, 20.0], "step sizes")
    steps: int = arg(3, "steps")
    seeds: int = arg(2, "paired seeds")


def _throwaway_spec(config: StudyConfig, job: StudyJob, *, seeds: int, steps: int) -> RunSpec:
    return RunSpec.make(
        "throwaway_kind", "synthetic", job.rule, seed=job.seed, seeds=seeds, steps=steps, lr=job.lr
    )


def test_a_new_rung_needs_no_other_edit(tmp_path):
    """A throwaway kind and a rung on it, registered here and nowhere else: it joins the default
    study (and its flags apply there), the study calibrates it, runs every rule paired by seed and gives it ledger rows with the values worked out by
    hand; then both go again."""
    tiny = RunSpec.make("throwaway_kind", "synthetic", "dapo", seeds=2, steps=2, lr=7.0)
    register_run("throwaway_kind", tiny_spec=tiny)(_throwaway_run)
    register_section("throwaway", ThrowawaySettings)
    rung = Rung("throwaway", _throwaway_spec, kind="throwaway_kind")
    register_rung(rung)
    try:
        assert rung.traits is run_kind("throwaway_kind")
        assert StudyConfig().rungs[-1] == "throwaway"  # it joins the default study
        given, _ = parse_study_args(
            ["--throwaway-seeds", "3"], prog="p", description="", profiles={"cpu": {}}
        )
        assert given.rungs[-1] == "throwaway" and given.section("throwaway").seeds == 3
        sections = {"throwaway": ThrowawaySettings(seeds=4)}
        config = StudyConfig(rules=["dapo", "nsr_dapo"], rungs=["throwaway"], sections=sections)
        rows = run_study(config, tmp_path, progress=False, workers=1)["results"]
        assert set(rows["rung"]) == {"throwaway"}
        calib = pd.read_csv(tmp_path / "calibration.csv")
        assert calib["lr"].tolist() == [1.0, 7.0, 20.0]
        np.testing.assert_allclose(calib["clip_share"], [0.01, 0.07, 0.2], rtol=1e-12)
        study = rows[rows["phase"] == "study"]
        assert set(study["lr"]) == {7.0} and sorted(set(study["seed"])) == [0, 1, 2, 3]
        ledger = pd.read_csv(tmp_path / "ledger.csv")
        [row] = ledger[ledger["claim"] == "nsr_beats_dapo"].itertuples()
        # paired differences 0.1 + 0.01 s over s = 0..3: mean 0.115, SD 0.0129
        assert (row.rung, row.seeds) == ("throwaway", 4)
        assert row.estimate == pytest.approx(0.115, abs=1e-12)
        assert row.diff_sd == pytest.approx(np.std([0.1, 0.11, 0.12, 0.13], ddof=1), abs=1e-9)
        [frame] = run_specs([tiny])  # and the kind's own tiny spec runs
        assert job_rows(StudyJob("study", "throwaway", "dapo", 7.0, 1, 0), frame)[
            "seed"
        ].tolist() == [0, 0, 1, 1]
    finally:
        unregister_rung("throwaway")
        unregister_section("throwaway")
        unregister_run("throwaway_kind")
    assert "throwaway" not in RUNGS and "throwaway" not in SECTIONS
    assert "throwaway" not in StudyConfig().rungs


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
    from sandbox.study import RUNGS
    from sandbox.study.analysis import entropy_law
    from sandbox.study.plan import StudyJob, run_jobs

    tf = {"seeds": 2, "steps": 2, "task": "bits", "knobs": {"op": "reverse", "length": 3}}
    config = StudyConfig(
        rungs=["tiny_tf"], sections={"tf": {**tf, "eval_prompts": 4, "init": None}}
    )
    job = StudyJob("study", "tiny_tf", "dapo", 0.01, 4, 0)
    assert sequence_config(RUNGS["tiny_tf"].spec(config, job, seeds=2, steps=2)).entropy_law
    rows = run_jobs(config, [job])[0]
    law = rows[["entropy_change", "entropy_change_pred"]]
    assert len(rows) == 2 * 2 and law.notna().all().all() and (law != 0).any().all()
    table = entropy_law(rows)
    assert table[["rung", "rule", "points"]].values.tolist() == [["tiny_tf", "dapo", 4]]
