"""Mechanism check (a) on the tiny transformer: ``SequenceTrainConfig(entropy_law=True)`` logs the
entropy change over the visited prefixes of each step's rollout and the entropy-covariance law's
first-order prediction of it (arXiv 2505.22617)."""

import copy

import numpy as np
import pandas as pd
import torch

from sandbox.train import SequenceTrainConfig, SequenceTrainer, train_sequence

SMALL = dict(
    task="bits",
    task_knobs={"op": "parity", "length": 2},
    seeds=3,
    prompts_per_step=4,
    group_size=4,
    d_model=16,
    n_heads=2,
    entropy_law=True,
)
LAW = ["entropy_change", "entropy_change_pred"]


def _record_rollouts(trainer: SequenceTrainer) -> list:
    """Keep every batch ``trainer.step`` samples (the rollout itself is unchanged)."""
    batches, rollout = [], trainer.rollout

    def recording():
        batches.append(rollout())
        return batches[-1]

    trainer.rollout = recording
    return batches


def _restricted_logp(model, batch, allowed: torch.Tensor) -> torch.Tensor:
    """By hand: the full-vocabulary logits at the position before every completion token, the
    tokens outside ``allowed`` set to -inf, log-softmax over the vocabulary ``[S, N, Tc, V]``."""
    ids = torch.cat([batch.prompt, batch.completion], -1)
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], -1)
    with torch.no_grad():
        logits, _ = model(ids, mask)
    logits = logits[:, :, batch.prompt.shape[-1] - 1 : -1].double()
    return torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), -1)


def test_entropy_change_is_the_entropy_difference_over_the_visited_prefixes():
    """``entropy_change`` = token mean over the rollout's completion positions of
    H(pi_after) - H(pi_before), H = -sum_a p(a) log p(a) over the allowed tokens; the prediction
    = token mean of -sum_a p(a) (log p(a) - E_p log p)(dz_a - E_p dz), dz = z_after - z_before;
    both recomputed here from the models before and after the step (float64 arithmetic)."""
    trainer = SequenceTrainer(SequenceTrainConfig(**SMALL, steps=2, lr=1e-2))
    batches = _record_rollouts(trainer)
    trainer.step()  # step 0 leaves the near-uniform initial policy
    before = copy.deepcopy(trainer.model)
    logged = trainer.step()
    batch, allowed = batches[-1], trainer.allowed
    lp0 = _restricted_logp(before, batch, allowed)
    lp1 = _restricted_logp(trainer.model, batch, allowed)
    p0, p1 = lp0.exp(), lp1.exp()
    h0 = -(p0 * torch.where(p0 > 0, lp0, 0.0)).sum(-1)  # [S, N, Tc]
    h1 = -(p1 * torch.where(p1 > 0, lp1, 0.0)).sum(-1)
    # log pi differs from the logits by a per-prefix constant, which Cov ignores
    dz = torch.where(allowed, lp1 - lp0, 0.0)
    centred = torch.where(allowed, lp0 - (p0 * torch.where(allowed, lp0, 0.0)).sum(-1, True), 0.0)
    pred = -(p0 * centred * (dz - (p0 * dz).sum(-1, keepdim=True))).sum(-1)
    m = batch.completion_mask.double()

    def token_mean(x):
        return ((x * m).sum((1, 2)) / m.sum((1, 2))).numpy()

    assert m.sum() > 0 and (token_mean(h1 - h0) != 0).any()
    np.testing.assert_allclose(logged["entropy"].double(), token_mean(h0), rtol=0, atol=1e-6)
    np.testing.assert_allclose(logged["entropy_change"], token_mean(h1 - h0), rtol=0, atol=1e-6)
    np.testing.assert_allclose(logged["entropy_change_pred"], token_mean(pred), rtol=0, atol=1e-6)


def test_the_law_is_first_order_in_the_step_size():
    """From one trained state (model, Adam moments, prompt generator, step), the same step at lr and lr/4:
    Adam's update is lr * m_hat / (sqrt(v_hat) + eps), exactly proportional to lr on the same
    rollout, so dz = O(lr), the prediction scales by ~4 and its error (second order) by ~16."""
    trainer = SequenceTrainer(SequenceTrainConfig(**SMALL, steps=1, lr=1e-2))
    trainer.model.double()  # float64 so rounding stays far below the second-order error
    for _ in range(4):  # leave the near-uniform start, where the first-order term vanishes
        trainer.step()
    model, adam = copy.deepcopy(trainer.model.state_dict()), trainer.optimizer.state_dict()
    adam, step, prompts = copy.deepcopy(adam), trainer.steps_done, trainer.rng
    law = {}
    for lr in (1e-4, 2.5e-5):
        trainer.model.load_state_dict(model)
        trainer.optimizer.load_state_dict(copy.deepcopy(adam))  # it adopts, then steps, these
        trainer.optimizer.param_groups[0]["lr"] = lr
        trainer.steps_done = step  # the same rollout and minibatch streams
        trainer.rng = copy.deepcopy(prompts)  # the same prompts
        out = trainer.step()
        law[lr] = (out["entropy_change"].numpy(), out["entropy_change_pred"].numpy())
    (obs, pred), (obs4, pred4) = law[1e-4], law[2.5e-5]
    np.testing.assert_allclose(pred / pred4, 4.0, rtol=0.05)  # first order in lr
    assert (np.abs(pred) > 10 * np.abs(obs - pred)).all()  # the law holds at this step size
    ratio = np.abs(obs - pred) / np.abs(obs4 - pred4)
    np.testing.assert_allclose(ratio, 16.0, rtol=0.1)


def test_training_is_bit_identical_with_the_law_on_or_off():
    """The law's two extra forwards draw no random numbers and touch no gradient: the logged
    frame, the final weights, Adam's state and the prompt generator are identical."""
    cfg = dict(SMALL, steps=3, lr=1e-2, epochs=2, minibatches=2)
    runs = []
    for flag in (False, True):
        trainer = SequenceTrainer(SequenceTrainConfig(**{**cfg, "entropy_law": flag}))
        frame = train_sequence(trainer.config, trainer=trainer)
        runs.append((frame, trainer))
    (off, t_off), (on, t_on) = runs
    assert not any(c in off for c in LAW) and on[LAW].notna().all().all()
    pd.testing.assert_frame_equal(on.drop(columns=LAW), off, check_exact=True)
    for key, value in t_off.model.state_dict().items():
        assert torch.equal(value, t_on.model.state_dict()[key]), key
    for a, b in zip(t_off.optimizer.state.values(), t_on.optimizer.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert t_off.rng.bit_generator.state == t_on.rng.bit_generator.state
    assert t_off.steps_done == t_on.steps_done == 3
