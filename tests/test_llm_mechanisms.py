"""Mechanism checks (a) and (c) on the llm rung (issue 21 item 5): ``--entropy-law`` and
``--grad-noise`` in ``llm.train`` (tiny Llama, CPU).

(a) the logged entropy change and its entropy-covariance prediction against a recomputation from
the model's full logits before and after the step (one unpadded sequence at a time, float64), and
the prediction's error shrinking quadratically with the step; (c) the gradient-noise columns
against the counterpart's gradients taken by hand per half of the minibatch, zero rescue variance
where the rule's keeps are certain, positive where NSR's draws matter; both probes leave training
bit-identical, alone and in an ensemble."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from test_claims_ensemble import assert_frames_close, llm_spec
from test_llm_train_loop import config

from llm import rollout
from llm import train as train_mod
from llm.checkpoint import model_state
from llm.train import train
from sandbox.experiments.runs import RunSpec, run_specs
from sandbox.grad_noise import GRAD_NOISE_COLUMNS, counterpart_loss

LRS = (2.5e-4, 6.25e-5, 1.5625e-5)  # each a quarter of the one before
LAW = ("entropy_change", "entropy_change_pred")
SEED = 1  # parity-2 at this seed: the first rollout has groups with unequal rewards


def first_step(tmp_path, **kw):
    """``setup`` with the model in float64, then step 0's rollout and scores."""
    run = train_mod.setup(config(tmp_path, seed=SEED, **kw), [])
    run.model.double()
    host = train_mod.rollout_phase(run, 0)
    batch, keep = train_mod.score(run, host)
    assert batch["adv"].abs().sum() > 0  # the step updates the model
    return run, host, batch, keep


def hand_logits(model, host, rows, tau):
    """By hand: each row's unpadded prompt ++ completion through the model's plain forward, the
    logits at the positions before the completion tokens, / tau, float64 ``[N, V]``."""
    out = []
    for i in rows:
        p = host["prompt"][i][host["prompt_mask"][i].bool()]
        c = host["completion"][i][host["completion_mask"][i].bool()]
        with torch.no_grad():
            z = model(input_ids=torch.cat([p, c])[None]).logits[0].double()
        out.append(z[len(p) - 1 : len(p) - 1 + len(c)] / tau)
    return torch.cat(out)


def hand_law(z0, z1):
    """Token means of H(softmax z1) - H(softmax z0), H = -sum_a p log p, and of the prediction
    -sum_a p0 (log p0 - E_p0 log p0)(dz - E_p0 dz), dz = z1 - z0."""
    lp0, lp1 = torch.log_softmax(z0, -1), torch.log_softmax(z1, -1)
    p0, p1 = lp0.exp(), lp1.exp()
    h0, h1 = -(p0 * lp0).sum(-1), -(p1 * lp1).sum(-1)
    dz = z1 - z0
    centred = lp0 - (p0 * lp0).sum(-1, keepdim=True)
    pred = -(p0 * centred * (dz - (p0 * dz).sum(-1, keepdim=True))).sum(-1)
    return (h1 - h0).mean().item(), pred.mean().item()


def law_step(run, batch, host, keep):
    sub, before = train_mod.entropy_law_probe(run, batch, host)
    train_mod.update(run, batch, host, keep, 0)
    return {k: v.item() for k, v in train_mod.entropy_law_columns(run, sub, before).items()}


def test_entropy_change_equals_a_recomputation_from_the_logits_before_and_after(tmp_path):
    # temperature 0.7: the probe's policy is softmax(z / 0.7), the one rollouts sample from
    kw = dict(entropy_law=True, entropy_law_rows=5, temperature=0.7, epochs=2, minibatches=2)
    run, host, batch, keep = first_step(tmp_path, **kw)
    rows = range(5)
    z0 = hand_logits(run.model, host, rows, 0.7)
    # the probe's distribution is the trainer's: its log-softmax at the tokens is completion_logp
    tokens = torch.cat([host["completion"][i][host["completion_mask"][i].bool()] for i in rows])
    logp = train_mod.logprobs(run, run.model, {k: v[:5] for k, v in host.items()}, 1)
    own = torch.log_softmax(z0, -1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(own, logp[host["completion_mask"][:5].bool()], rtol=0, atol=1e-12)
    logged = law_step(run, batch, host, keep)
    change, pred = hand_law(z0, hand_logits(run.model, host, rows, 0.7))
    assert abs(change) > 1e-4  # the step moved the probe's entropies
    assert logged["entropy_change"] == pytest.approx(change, rel=0, abs=1e-12)
    assert logged["entropy_change_pred"] == pytest.approx(pred, rel=0, abs=1e-12)


def test_the_prediction_error_is_second_order_in_the_step(tmp_path):
    """From one trained state (model, Adam moments), the same step at lr, lr / 4, lr / 16: Adam's
    update is lr * m_hat / (sqrt(v_hat) + eps), exactly proportional to lr on the same rollout,
    so dz = O(lr), the prediction scales by ~4 and its error (second order) by ~16."""
    run, host, batch, keep = first_step(tmp_path, entropy_law=True, lr=1e-2)
    for step in range(1, 5):  # leave the near-uniform start, where the first-order term vanishes
        train_mod.update(run, batch, host, keep, step - 1)
        host = train_mod.rollout_phase(run, step)
        batch, keep = train_mod.score(run, host)
    assert batch["adv"].abs().sum() > 0
    model, adam = copy.deepcopy(run.model.state_dict()), copy.deepcopy(run.optimizer.state_dict())
    out = {}
    for lr in LRS:
        run.model.load_state_dict(model)
        run.optimizer.load_state_dict(copy.deepcopy(adam))  # it would adopt the tensors
        run.optimizer.param_groups[0]["lr"] = lr
        out[lr] = law_step(run, batch, host, keep)
    change = [out[lr]["entropy_change"] for lr in LRS]
    pred = [out[lr]["entropy_change_pred"] for lr in LRS]
    err = [abs(c - p) for c, p in zip(change, pred, strict=True)]
    # measured: pred ratios 3.61, 3.75 and error ratios 11.7, 13.2, both approaching 4 and 16
    assert pred[1] / pred[2] == pytest.approx(4, rel=0.1)
    assert err[2] < 0.01 * abs(change[2])  # the first order dominates at the small step
    assert 8 < err[0] / err[1] < err[1] / err[2] < 20  # second order, tending to 16


def test_grad_noise_halves_and_signal_by_hand(tmp_path):
    """One update (mu = 1, on-policy) in 2 micro-batches: sampling_var = ||h_1 - h_2||^2 and
    signal = ||h_1 + h_2||^2, h_i the counterpart's gradient from half i of the minibatch's rows
    (one forward each, with the whole minibatch's counts); rescue_var 0 (r = 1: NSR keeps)."""
    run, host, batch, keep = first_step(
        tmp_path, objective="nsr_dapo", grad_noise=True, grad_accum=2
    )
    start = copy.deepcopy(run.model)
    metrics = train_mod.update(run, batch, host, keep, 0)
    gen = torch.Generator().manual_seed(rollout.derive_seed(SEED, 1, 0, 0))
    perm = keep[torch.randperm(keep.numel(), generator=gen)]  # update's minibatch order
    n = perm.numel()
    mask = batch["loss_mask"]
    counts = {"num_tokens": mask.sum().double(), "num_seqs": float(n), "max_len": 8}
    det = counterpart_loss(run.loss_fn)
    params = [p for p in start.parameters()]
    grads = []
    for rows in (perm[: n // 2], perm[n // 2 :]):
        sub = {k: v[rows] for k, v in batch.items()}
        logp, _ = train_mod.forward_logp(run, start, sub)
        out = det(logp, logp.detach(), sub["adv"], sub["loss_mask"], validate=True, **counts)
        grads.append(torch.autograd.grad(out.loss, params, allow_unused=True))

    def sq(gs):
        return sum((g**2).sum() for g in gs if g is not None).item()

    h1, h2 = grads
    both = [(a, b) for a, b in zip(h1, h2, strict=True) if a is not None]
    logged = {k: v[0].item() for k, v in metrics.means.items()}
    assert set(logged) == set(GRAD_NOISE_COLUMNS)
    assert logged["grad_sampling_var"] == pytest.approx(sq([a - b for a, b in both]), rel=1e-9)
    assert logged["grad_signal"] == pytest.approx(sq([a + b for a, b in both]), rel=1e-9)
    assert logged["grad_signal"] > 0 and logged["grad_rescue_var"] < 1e-20


def test_both_probes_leave_training_bit_identical_and_rescue_var_shows_nsr_draws(tmp_path):
    kw = dict(objective="nsr_dapo", seed=SEED, epochs=2, minibatches=2, grad_accum=2)
    off = train(config(tmp_path, "off", **kw))
    on = train(config(tmp_path, "on", entropy_law=True, grad_noise=True, grad_mass=True, **kw))
    assert [r["loss"] for r in on] == [r["loss"] for r in off]
    assert [r["grad_norm"] for r in on] == [r["grad_norm"] for r in off]
    a, b = model_state(str(tmp_path / "off")), model_state(str(tmp_path / "on"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(k in r for r in on for k in (*LAW, *GRAD_NOISE_COLUMNS))
    # mu = 2: ratios leave 1, tokens fall outside the clip range and NSR's rescue draws add noise
    moved = [r for r in on if r["clip_high_frac"] + r["clip_low_frac"] > 0]
    assert moved and all(r["grad_rescue_var"] > 1e-6 * r["grad_signal"] for r in moved)
    # --grad-mass: the shares of the gradient mass NSR zeroes or rescues where its bounds bind
    mass = ("grad_mass_zero_lo", "grad_mass_zero_hi", "grad_mass_rescued")
    assert all(0 <= r[k] <= 1 for r in on for k in mass)
    assert all(sum(r[k] for k in mass) > 0 for r in moved)

    # band noise of width 1e-6: every keep probability is 0 or 1, the rule equals its counterpart
    band = dict(kw, objective="nsr_band_dapo", objective_params={"sigma": 1e-6})
    rows = train(config(tmp_path, "band", grad_noise=True, **band))
    moved = [r for r in rows if r["clip_high_frac"] + r["clip_low_frac"] > 0]
    assert moved and all(r["grad_signal"] > 0 for r in moved)
    assert all(r["grad_rescue_var"] <= 1e-12 * r["grad_signal"] for r in rows)

    # a rule without a counterpart logs NaN; torchrun is refused by name
    dapo = train(config(tmp_path, "dapo", seed=SEED, grad_noise=True, steps=1))
    assert all(dapo[-1][k] != dapo[-1][k] for k in GRAD_NOISE_COLUMNS)
    with pytest.raises(ValueError, match="--entropy-law runs in one process"):
        config(tmp_path, entropy_law=True).validate(world=2)
    with pytest.raises(ValueError, match="--grad-noise splits each minibatch"):
        config(
            tmp_path, grad_noise=True, prompts_per_step=1, group_size=2, minibatches=2
        ).validate()


def test_an_ensemble_logs_the_probes_its_separate_runs_log():
    """The claims study's llm rung runs paired seeds as one llm.ensemble: each member's probes
    equal its run's alone (float32; the ensemble's batched forward rounds differently, so the
    rule's gradient and its counterpart's differ by rounding there)."""

    def spec(seed):
        base = llm_spec(seed)
        train = {**dict(base.train), "entropy_law": True, "grad_noise": True}
        return RunSpec.make(**{**base.__dict__, "rule": "nsr_dapo", "train": train})

    specs = [spec(0), spec(1)]
    alone = [run_specs([s])[0] for s in specs]
    together = run_specs(specs)
    for a, t in zip(alone, together, strict=True):
        assert a[list(LAW + GRAD_NOISE_COLUMNS)].iloc[1:].notna().all().all()
        assert (a["grad_signal"].iloc[1:] > 0).any()
        assert_frames_close(t, a)
