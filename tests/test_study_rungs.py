"""What the study's rungs log (sandbox.study.rungs): the gradient-mass shares and the
entropy-covariance law, on every rung that turns them on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sandbox.experiments.runs import sequence_config
from sandbox.loss import grad_mass_shares
from sandbox.study import StudyConfig

ROOT = Path(__file__).resolve().parents[1]


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
    from sandbox.study.plan import StudyJob, run_job

    config = StudyConfig(
        rungs=["tiny_tf"],
        seeds=2,
        tf_steps=2,
        tf_task="bits",
        tf_knobs={"op": "reverse", "length": 3},
        tf_eval_prompts=4,
    )
    job = StudyJob("study", "tiny_tf", "dapo", 0.01, 4, 0)
    assert sequence_config(RUNGS["tiny_tf"].spec(config, job, seeds=2, steps=2)).entropy_law
    rows = run_job(config, job)[0]
    law = rows[["entropy_change", "entropy_change_pred"]]
    assert len(rows) == 2 * 2 and law.notna().all().all() and (law != 0).any().all()
    table = entropy_law(rows)
    assert table[["rung", "rule", "points"]].values.tolist() == [["tiny_tf", "dapo", 4]]
