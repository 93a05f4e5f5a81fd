"""Mechanism check (c): Objective.expectation, the gradient-noise probe (sandbox.grad_noise) and
its columns in the toy trainers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import envs
from sandbox.grad_noise import GRAD_NOISE_COLUMNS, counterpart_loss, first_half, grad_noise
from sandbox.loss import PolicyLoss
from sandbox.objectives import available_objectives, get_objective
from sandbox.objectives.rescue import NSRDecay
from sandbox.train import (
    BanditTrainConfig,
    Rollout,
    SequenceTrainConfig,
    SequenceTrainer,
    bandit_update,
    run_bandit,
)

# A grid of ratios through every zone of the DAPO bounds (l = 0.8, u = 1.28) and of the band
# noise's edges, and advantages of both signs and 0.
RATIOS = torch.tensor([0.05, 0.5, 0.7, 0.75, 0.8, 0.9, 1.0, 1.2, 1.28, 1.35, 1.5, 3.0, 40.0])
ADVS = torch.tensor([-2.0, -0.3, 0.0, 0.4, 1.5])


# --------------------------------------------------------------------------------------------------
# Objective.expectation
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, params",
    [
        ("nsr_dapo", {}),
        ("nsr_band_dapo", {}),
        ("nsr_gspo", {}),
        ("nsr", {"noise": "band", "sigma": 0.3, "eps_low": 0.1, "eps_high": 0.5}),
    ],
)
def test_nsr_counterpart_is_its_decay_with_the_same_expected_coef(name, params):
    rule = get_objective(name, **params)
    det = rule.expectation()
    assert isinstance(det, NSRDecay) and not det.stochastic
    assert det.params == {k: v for k, v in rule.params.items() if k != "seed"}
    assert det.aggregation == rule.aggregation
    r, a = torch.meshgrid(RATIOS.double(), ADVS.double(), indexing="ij")
    assert torch.equal(det.expected_coef(r, a), rule.expected_coef(r, a))
    # and the decay's realised coefficient is that expectation (uniform, A > 0, r = 1.5 in
    # Z_hi: u / r * r * A = 1.28 * 1.5 = 1.92 for nsr_dapo)
    if name == "nsr_dapo":
        assert rule.expected_coef(1.5, 1.5).item() == pytest.approx(1.28 * 1.5, abs=1e-12)


@pytest.mark.parametrize("name", available_objectives())
def test_only_stochastic_rules_with_a_closed_form_have_a_counterpart(name):
    rule = get_objective(name)
    det = rule.expectation()
    if not rule.stochastic or not rule.has_expected_coef():
        assert det is None
        return
    assert det is not None and not det.stochastic
    r, a = torch.meshgrid(RATIOS.double(), ADVS.double(), indexing="ij")
    torch.testing.assert_close(det.expected_coef(r, a), rule.expected_coef(r, a), atol=0, rtol=0)


def test_counterpart_loss_keeps_the_assembly_and_drops_metrics_only_options():
    loss_fn = PolicyLoss(get_objective("nsr_gspo"), kl_coef=0.1, grad_mass=True)
    det = counterpart_loss(loss_fn)
    assert isinstance(det.objective, NSRDecay) and det.objective.level == "sequence"
    assert (det.kl_coef, det.mode, det.grad_mass) == (0.1, "seq-mean-token-mean", False)
    assert counterpart_loss(PolicyLoss(get_objective("dapo"))) is None


# --------------------------------------------------------------------------------------------------
# The probe against hand-computed values (softmax bandit, one-token samples)
# --------------------------------------------------------------------------------------------------

# pi = softmax(0) = 1/3 per arm; pi_old = (0.2, 0.5, 0.3), so r = (5/3, 2/3, 10/9).
PI_OLD = np.array([0.2, 0.5, 0.3])
# Four samples: arm 0, A = +1: r = 5/3 > u = 1.28 (Z_hi); arm 1, A = -1: r = 2/3 < l = 0.8
# (Z_lo); arm 2, A = +0.5 (inside); arm 0, A = -0.7 (r > 1 with A < 0: not in Z). Halves: rows
# {0, 1} and {2, 3}.
ARMS = np.array([0, 1, 2, 0])
ADV = np.array([1.0, -1.0, 0.5, -0.7])


def bandit_batch(seeds: int) -> tuple[torch.Tensor, Rollout]:
    logits = torch.zeros(seeds, 1, 3, dtype=torch.float64, requires_grad=True)
    index = torch.as_tensor(ARMS).repeat(seeds, 1)
    logp_old = torch.as_tensor(np.log(PI_OLD[ARMS])).repeat(seeds, 1)
    adv = torch.as_tensor(ADV).repeat(seeds, 1)
    return logits, Rollout(index, torch.zeros_like(adv), logp_old, adv)


def probe(objective: str, seeds: int) -> torch.Tensor:
    """``[3, S]`` from one update of ``bandit_update`` on S copies of the hand batch."""
    logits, rollout = bandit_batch(seeds)
    stats = bandit_update(
        logits,
        torch.optim.SGD([logits], lr=1.0),
        get_objective(objective),
        rollout,
        aggregation="token-mean",
        generator=torch.Generator().manual_seed(1),
        grad_noise=True,
    )
    return stats.grad_noise


def hand_terms(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: the keep probability's variance weight (A r)^2 q (1 - q) ||e_a - pi||^2 and
    the decay's per-sample logit gradient -A r q (e_a - pi) / n (ascent sign irrelevant here)."""
    pi = np.full(3, 1 / 3)
    r = pi[ARMS] / PI_OLD[ARMS]
    e = np.eye(3)[ARMS] - pi  # d log pi(a) / dz = e_a - pi
    var_terms = (ADV * r) ** 2 * q * (1 - q) * (e**2).sum(1)
    grads = (ADV * r * q)[:, None] * e / len(ARMS)
    return var_terms, grads


def test_probe_matches_the_closed_form_variance_and_split():
    # uniform noise: q = u / r = 1.28 * 0.6 = 0.768 on Z_hi, q = r / l = (2/3) / 0.8 on Z_lo
    q = np.array([1.28 * 0.6, (2 / 3) / 0.8, 1.0, 1.0])
    var_terms, grads = hand_terms(q)
    n = len(ARMS)
    rescue_expected = var_terms.sum() / n**2  # sum_t (A r)^2 q (1 - q) ||e_a - pi||^2 / n^2
    h1, h2 = grads[:2].sum(0), grads[2:].sum(0)
    S = 20000
    values = probe("nsr_dapo", S).numpy()
    rescue, sampling, signal = values
    # sampling_var and signal are deterministic given the batch: exact
    np.testing.assert_allclose(sampling, ((h1 - h2) ** 2).sum(), rtol=1e-12)
    np.testing.assert_allclose(signal, ((h1 + h2) ** 2).sum(), rtol=1e-12)
    # rescue_var: one draw per seed; its mean over S draws converges to the closed form
    se = rescue.std() / math.sqrt(S)
    assert abs(rescue.mean() - rescue_expected) < 4 * se
    assert se < 0.02 * rescue_expected  # the test has the power to see a 10% error
    assert len(np.unique(rescue)) > 3  # each seed draws its own noise


def test_rescue_var_is_zero_where_the_rule_keeps_with_probability_0_or_1():
    # band noise (sigma 0.1): q_hi = clip((u / r - 0.9) / 0.1) = 0 at r = 5/3; q_lo = clip((1.1 -
    # l / r) / 0.1) = 0 at r = 2/3: every keep probability is 0 or 1, the rule is deterministic here
    rescue, sampling, signal = probe("nsr_band_dapo", 7)
    assert torch.equal(rescue, torch.zeros(7, dtype=torch.float64))
    _, grads = hand_terms(np.array([0.0, 0.0, 1.0, 1.0]))
    h1, h2 = grads[:2].sum(0), grads[2:].sum(0)
    np.testing.assert_allclose(sampling, ((h1 - h2) ** 2).sum(), rtol=1e-12)
    np.testing.assert_allclose(signal, ((h1 + h2) ** 2).sum(), rtol=1e-12)


def test_rescue_var_is_exactly_zero_for_a_deterministic_rule_against_itself():
    logits, rollout = bandit_batch(3)
    loss_fn = PolicyLoss(get_objective("nsr_decay_dapo"))

    mask = torch.ones(12, 1, dtype=torch.bool)
    old, adv = rollout.logp_old.reshape(-1, 1), rollout.adv.reshape(-1, 1)

    def forward():
        logp = torch.log_softmax(logits, -1)[:, 0].gather(1, rollout.index)
        out = loss_fn(logp.reshape(-1, 1), old, adv, mask, num_tokens=4, groups=3)
        return out.loss, [logp]

    forward()[0].backward()
    rescue, _, signal = grad_noise(forward, [logits], [logits.grad], first_half(3, 4).view(3, 4), 3)
    assert torch.equal(rescue, torch.zeros(3, dtype=torch.float64))
    np.testing.assert_allclose(signal, (logits.grad[:, 0] ** 2).sum(-1), rtol=0, atol=0)


def test_first_half_and_bad_inputs():
    assert first_half(2, 5).flatten().tolist() == [1, 1, 0, 0, 0] * 2
    with pytest.raises(ValueError, match="rows"):
        first_half(2, 1)
    with pytest.raises(ValueError, match="grad_noise"):
        BanditTrainConfig(objective="nsr_dapo", group_size=2, minibatches=2, grad_noise=True)
    with pytest.raises(ValueError, match="grad_noise"):
        SequenceTrainConfig(prompts_per_step=1, group_size=2, minibatches=2, grad_noise=True)


# --------------------------------------------------------------------------------------------------
# The trainers: the probe changes nothing, logs per seed
# --------------------------------------------------------------------------------------------------


def test_bandit_training_is_bit_identical_with_the_probe_on():
    model = envs.make_bandit_suite()["mixed"].make().unwrapped
    cfg = {"objective": "nsr_dapo", "seeds": 4, "steps": 6, "lr": 8.0, "prompts_per_step": 4}
    cfg |= {"epochs": 2, "minibatches": 2}
    off = run_bandit(model, BanditTrainConfig(**cfg))
    on = run_bandit(model, BanditTrainConfig(**cfg, grad_noise=True))
    assert torch.equal(off.logits, on.logits)
    a, b = off.to_frame(), on.to_frame()
    pd.testing.assert_frame_equal(a, b[a.columns], check_exact=True)
    assert set(GRAD_NOISE_COLUMNS) <= set(b.columns) and not set(GRAD_NOISE_COLUMNS) & set(a)
    assert (b[list(GRAD_NOISE_COLUMNS)] >= 0).all().all()
    assert b["grad_rescue_var"].gt(0).any()  # something was rescued off-policy
    assert b.groupby("step")["grad_signal"].nunique().gt(1).all()  # per seed, not pooled
    dapo = run_bandit(model, BanditTrainConfig(**{**cfg, "objective": "dapo"}, grad_noise=True))
    assert dapo.to_frame()[list(GRAD_NOISE_COLUMNS)].isna().all().all()  # no counterpart


def test_tiny_tf_training_is_bit_identical_with_the_probe_on():
    cfg = {"objective": "nsr_dapo", "seeds": 2, "steps": 2, "prompts_per_step": 4}
    cfg |= {"group_size": 4, "lr": 3e-3, "epochs": 2}
    trainers = [SequenceTrainer(SequenceTrainConfig(**cfg, grad_noise=g)) for g in (False, True)]
    logs = [[t.step() for _ in range(cfg["steps"])] for t in trainers]
    for p, q in zip(trainers[0].model.parameters(), trainers[1].model.parameters(), strict=True):
        assert torch.equal(p, q)
    for off, on in zip(*logs, strict=True):
        assert all(torch.equal(off[k], on[k]) for k in off)
        values = torch.stack([on[k] for k in GRAD_NOISE_COLUMNS])
        assert values.shape == (3, 2) and bool((values >= 0).all())
        assert bool((values[2] > 0).all())  # a signal per model


# --------------------------------------------------------------------------------------------------
# The claims study: the flag on the toy rungs, the table by hand
# --------------------------------------------------------------------------------------------------


def test_the_study_turns_the_probe_on_for_rules_with_a_counterpart_on_the_toy_trainers():
    from sandbox.study import RUNGS, StudyConfig, StudyJob

    config = StudyConfig()
    for rung in ("bandit_sampled", "tiny_tf"):
        jobs = {r: StudyJob("study", rung, r, 1.0, 2, 0) for r in config.rules}
        flags = {
            r: dict(RUNGS[rung].spec(config, j, seeds=2, steps=3).train) for r, j in jobs.items()
        }
        assert {r for r, t in flags.items() if t.get("grad_noise")} == {"nsr_dapo"}
    assert "grad_noise" not in dict(
        RUNGS["bandit_exact"]
        .spec(config, StudyJob("study", "bandit_exact", "nsr_dapo", 1.0, 2, 0), seeds=1, steps=3)
        .train
    )


def test_gradient_noise_table_by_hand():
    from sandbox.study.analysis import gradient_noise

    # nsr_dapo on one rung, 3 seeds x 2 steps: (rescue_var, sampling_var, signal) per step
    values = {
        0: [(1, 4, 10), (3, 4, 6)],  # step-means 2, 4, 8: ratio 1 + 2/4 = 1.5; 0.25, 0.5
        1: [(0, 2, 4), (2, 6, 4)],  # 1, 4, 4: ratio 1.25 (mean of per-step ratios: 1.1667); 0.25, 1
        2: [(3, 3, 8), (3, 1, 8)],  # 3, 2, 8: ratio 2.5; 0.375, 0.25
    }

    def row(phase, rule, seed, step, v):
        keys = ("phase", "rung", "rule", "seed", "step", *GRAD_NOISE_COLUMNS)
        return dict(zip(keys, (phase, "bandit_sampled", rule, seed, step, *v), strict=True))

    rows = [row("study", "nsr_dapo", s, t + 1, v) for s in values for t, v in enumerate(values[s])]
    rows.append(row("study", "dapo", 0, 1, (math.nan,) * 3))  # no counterpart: not logged
    rows.append(row("calib", "nsr_dapo", 0, 1, (100, 1, 1)))  # calibration rows do not count
    table = gradient_noise(pd.DataFrame(rows))
    assert len(table) == 1
    row = table.iloc[0]
    assert (row["rung"], row["rule"], row["seeds"], row["points"]) == (
        "bandit_sampled",
        "nsr_dapo",
        3,
        6,
    )
    assert row["rescue_to_signal"] == pytest.approx((0.25 + 0.25 + 0.375) / 3, abs=1e-12)
    assert row["sampling_to_signal"] == pytest.approx((0.5 + 1.0 + 0.25) / 3, abs=1e-12)
    # ratios 1.5, 1.25, 2.5: mean 1.75, SD sqrt((0.0625 + 0.25 + 0.5625) / 2) = 0.661438;
    # t_{0.975, 2} = 4.302653: half-width 4.302653 * 0.661438 / sqrt(3) = 1.643097
    assert row["variance_ratio"] == pytest.approx(1.75, abs=1e-12)
    half = 4.302652729911275 * math.sqrt(0.875 / 2) / math.sqrt(3)
    assert (row["lo"], row["hi"]) == pytest.approx((1.75 - half, 1.75 + half), abs=1e-9)
    # parts written before the columns existed: an empty table, not an error
    old = pd.DataFrame(rows).drop(columns=list(GRAD_NOISE_COLUMNS))
    assert gradient_noise(old).empty
