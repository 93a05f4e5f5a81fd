"""The ensemble's update on persistent stacked leaves (llm.ensemble, issue 28 item 2): the
members' parameters are rows of ``[K, ...]`` leaves, clipped by per-member norms
(:func:`clip_members`) and stepped by one :class:`StackedAdamW` in a few batched operators. Each
member must still get exactly its own run's update (its rule, learning rate, weight decay and
clipping threshold), and its checkpoint must be a single run's (its own weights, not the stack)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from test_llm_ensemble import RUN, rollout_of  # the rollout and run settings of the main test

import sandbox.objectives as registry
from llm.ensemble import Ensemble, StackedAdamW, clip_members, member_losses, stack_batches
from llm.logprobs import completion_logp
from llm.model import tiny_model, tiny_tokenizer
from sandbox.loss import PolicyLoss

# per member: its rule, lr, weight decay and max_grad_norm (all different)
RULES = ("dapo", "gspo", "cispo")
LRS, DECAYS, LIMITS = (1e-2, 3e-3, 2e-2), (0.01, 0.0, 0.1), (0.05, 0.02, 0.1)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_clipping_and_adamw_on_stacked_leaves_equal_separate_runs(tok):
    """Three members with three rules, learning rates, weight decays and clipping thresholds,
    float64, 3 updates on 2 steps' rollouts (the second update of a step off-policy); member 1
    sits out the second update (its run makes no step there). Every member's gradient norm is
    above its threshold (the clipping binds), and after each update its parameters, AdamW moments
    and step count are its separate run's."""
    loss_fns = [PolicyLoss(registry.get_objective(r), None) for r in RULES]
    alone = [tiny_model(len(tok), s).double() for s in range(3)]
    members = [copy.deepcopy(m) for m in alone]
    ens = Ensemble(members)
    opt_alone = [
        torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd)
        for m, lr, wd in zip(alone, LRS, DECAYS, strict=True)
    ]
    opt_runs = [  # the runs' own optimizers, as llm.train builds them; StackedAdamW steps them
        torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd)
        for m, lr, wd in zip(members, LRS, DECAYS, strict=True)
    ]
    stacked_adamw = StackedAdamW(ens, opt_runs)
    plan = [(0, [True] * 3), (0, [True, False, True]), (1, [True] * 3)]  # (rollout step, active)
    for step, active in plan:
        batches = [rollout_of(m.eval(), tok, k % 2, step) for k, m in enumerate(alone)]
        olds = []
        with torch.no_grad():
            for m, b in zip(alone, batches, strict=True):
                keys = ("prompt", "prompt_mask", "completion", "completion_mask")
                olds.append(completion_logp(m, *(b[key] for key in keys), 1.0)[0] - 0.1)
        stacked = stack_batches(batches, tok.pad_token_id)
        sizes = [tuple(b["completion"].shape) for b in batches]
        Tc = stacked["completion"].shape[-1]
        stacked["logp_old"] = torch.stack(
            [torch.nn.functional.pad(o, (0, Tc - o.shape[1])) for o in olds]
        )
        norms_alone = []
        for k, (m, opt, b, old) in enumerate(zip(alone, opt_alone, batches, olds, strict=True)):
            if not active[k]:
                continue
            logp, ent = completion_logp(
                m.train(),
                *(b[key] for key in ("prompt", "prompt_mask", "completion", "completion_mask")),
                1.0,
                entropy="metric",
            )
            out = loss_fns[k](logp, old, b["adv"], b["completion_mask"], entropy=ent)
            out.loss.backward()
            norms_alone.append(torch.nn.utils.clip_grad_norm_(list(m.parameters()), LIMITS[k]))
            opt.step()
            opt.zero_grad(set_to_none=True)
        stacked["loss_mask"] = stacked["completion_mask"] * torch.tensor(active)[:, None, None]
        # a member sitting out: a masked loss of 0 (llm.ensemble.ensemble_update's stand-in)
        counts = [{} if a else {"num_tokens": 1.0, "num_seqs": 1.0, "max_len": Tc} for a in active]
        outs = member_losses(ens, stacked, loss_fns, temperature=1.0, sizes=sizes, counts=counts)
        torch.stack([o.loss for o in outs]).sum().backward()
        norms = clip_members(ens, LIMITS)
        stacked_adamw.step(active)
        stacked_adamw.zero_grad()
        on = [k for k in range(3) if active[k]]
        for k, norm in zip(on, norms_alone, strict=True):
            assert norm > LIMITS[k]  # clipping binds
            torch.testing.assert_close(norms[k], norm, atol=0, rtol=1e-12)
        for k, (m_alone, m_ens) in enumerate(zip(alone, members, strict=True)):
            for (name, p), q in zip(m_alone.named_parameters(), m_ens.parameters(), strict=True):
                torch.testing.assert_close(q, p, atol=1e-12, rtol=1e-10, msg=name)
                mine, theirs = opt_runs[k].state[q], opt_alone[k].state.get(p, {})
                assert float(mine["step"]) == float(theirs.get("step", 0.0))
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in theirs:
                        torch.testing.assert_close(mine[key], theirs[key], atol=1e-14, rtol=1e-10)
    # member 1 made 2 steps, the others 3; each member moved
    assert [int(opt.state[next(iter(opt.state))]["step"]) for opt in opt_runs] == [3, 2, 3]


def test_stacked_adamw_float32_is_adamws_arithmetic(tok):
    """float32: the batched factors reproduce ``torch.optim.AdamW``'s single-tensor steps to the
    bit (the same operations in the same order), given the same gradients."""
    alone = [tiny_model(len(tok), s) for s in (0, 1)]
    ens = Ensemble([copy.deepcopy(m) for m in alone])
    opts = [
        torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd, foreach=False)
        for m, lr, wd in zip(alone, LRS[:2], DECAYS[:2], strict=True)
    ]
    runs = [
        torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd)
        for m, lr, wd in zip(ens.members, LRS[:2], DECAYS[:2], strict=True)
    ]
    stacked_adamw = StackedAdamW(ens, runs)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for name, leaf in ens.leaves.items():
            leaf.grad = torch.randn(leaf.shape, generator=gen) * 1e-2
            for k, m in enumerate(alone):
                m.get_parameter(name).grad = leaf.grad[k].clone()
        for opt in opts:
            opt.step()
        stacked_adamw.step([True, True])
    for m_alone, m_ens in zip(alone, ens.members, strict=True):
        for (name, p), q in zip(m_alone.named_parameters(), m_ens.parameters(), strict=True):
            assert torch.equal(q, p), name


def test_member_checkpoint_is_a_single_runs(tmp_path):
    """A member's checkpoint and saved model, written by the ensemble, are a single run's: the
    same keys and shapes, files no larger than the run alone's x 1.1 (not the K members' stack),
    and they load into a fresh single run (model and AdamW) with the member's own values."""
    from llm import checkpoint
    from llm.config import TrainConfig
    from llm.ensemble import train_ensemble
    from llm.train import train

    settings = {**RUN, "seed": 0}
    train(TrainConfig(**settings, out=str(tmp_path / "alone")))
    members = [dataclasses.replace(TrainConfig(**settings), seed=s) for s in range(2)]
    train_ensemble([dataclasses.replace(c, out=str(tmp_path / f"m{c.seed}")) for c in members])
    alone = torch.load(tmp_path / "alone" / "checkpoint.pt", weights_only=True)
    for s in range(2):
        path = tmp_path / f"m{s}" / "checkpoint.pt"
        state = torch.load(path, weights_only=True)
        assert set(state) == set(alone)
        assert {k: v.shape for k, v in state["model"].items()} == {
            k: v.shape for k, v in alone["model"].items()
        }
        opt_state, opt_alone = state["optimizer"]["state"], alone["optimizer"]["state"]
        assert set(opt_state) == set(opt_alone)
        for key, values in opt_state.items():
            assert {k: v.shape for k, v in values.items()} == {
                k: v.shape for k, v in opt_alone[key].items()
            }
            assert float(values["step"]) == float(opt_alone[key]["step"])
        assert path.stat().st_size <= 1.1 * (tmp_path / "alone" / "checkpoint.pt").stat().st_size
        model_dir = tmp_path / f"m{s}" / "model"
        size = sum(f.stat().st_size for f in model_dir.iterdir())
        assert size <= 1.1 * sum(f.stat().st_size for f in (tmp_path / "alone" / "model").iterdir())
        # a single run loads it: its model and AdamW hold the member's values
        model = tiny_model(len(tiny_tokenizer()), 123)
        opt = torch.optim.AdamW(model.parameters(), lr=RUN["lr"])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        assert checkpoint.load(str(tmp_path / f"m{s}"), model, opt, sched, np.random.default_rng())
        for name, p in model.named_parameters():
            assert torch.equal(p, state["model"][name])
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(opt.state[p][key], opt_state[name][key])
        assert max(v["exp_avg"].abs().max().item() for v in opt_state.values()) > 0
    first = torch.load(tmp_path / "m0" / "checkpoint.pt", weights_only=True)["model"]
    second = torch.load(tmp_path / "m1" / "checkpoint.pt", weights_only=True)["model"]
    for name, p in alone["model"].items():  # member 0 is the run alone (seed 0), to rounding
        torch.testing.assert_close(first[name], p, atol=1e-5, rtol=1e-5)
    # the members trained on their own seeds: neither checkpoint holds the other's weights
    assert any(not torch.equal(first[n], second[n]) for n in first)


def test_old_logp_batched_equals_each_run_alone(tmp_path):
    """The ensemble's rollout computes every member's old log-probs in one batched forward per
    row chunk (:func:`llm.ensemble.old_logp`): each member's are its run's
    (:func:`llm.train.logprobs`, the model alone, the same row chunks), to float32 rounding, on
    completions of unequal widths."""
    from llm.config import TrainConfig
    from llm.ensemble import old_logp
    from llm.train import draw_prompts, logprobs, sample, setup

    closers: list = []
    runs = [
        setup(
            TrainConfig(**{**RUN, "seed": s, "minibatches": 2, "out": str(tmp_path / str(s))}),
            closers,
        )
        for s in range(3)
    ]
    outs = [sample(run, *draw_prompts(run, 0)[:4])[0] for run in runs]
    for key in ("completion", "completion_mask"):  # member 1's completions cut to 5 tokens
        outs[1][key] = outs[1][key][:, :5]
    assert len({o["completion"].shape[1] for o in outs}) > 1  # the members' widths differ
    ens = Ensemble([run.model for run in runs])
    batched = old_logp(ens, runs, outs)
    chunks = runs[0].cfg.minibatches * runs[0].cfg.grad_accum  # 2 row chunks
    for run, out, mine in zip(runs, outs, batched, strict=True):
        alone = logprobs(run, run.model, out, chunks)
        assert mine.shape == alone.shape and mine.device == alone.device
        mask = out["completion_mask"].bool()
        torch.testing.assert_close(mine[mask], alone[mask], atol=2e-6, rtol=1e-5)
        assert (mine[~mask] == 0).all() and (alone[~mask] == 0).all()


def test_a_compact_ensemble_with_old_logp_sampler_takes_pi_old_from_the_decoder(tmp_path):
    """``--old-logp sampler`` in an ensemble: each member's pi_old is its own sampling log-probs
    (as its run alone takes them, ``tests/test_llm_train_loop.py``), and the batched old-logp
    forward is skipped."""
    from llm import ensemble as ensemble_mod
    from llm.config import TrainConfig
    from llm.train import setup

    closers: list = []
    settings = {**RUN, "rollout_backend": "compact", "old_logp": "sampler"}
    runs = [
        setup(TrainConfig(**{**settings, "seed": s, "out": str(tmp_path / str(s))}), closers)
        for s in range(2)
    ]
    ens = Ensemble([run.model for run in runs])
    calls = []
    real = ens.completion_logp
    ens.completion_logp = lambda *a, **k: calls.append(1) or real(*a, **k)
    hosts = ensemble_mod.batched_rollout(runs, 0, ens)
    assert calls == []  # no forward over the rollout for pi_old
    for host in hosts:
        mask = host["completion_mask"].bool()
        assert mask.sum() > 0 and torch.equal(host["logp_old"], host["rollout_logp"])
        assert (host["logp_old"][mask] <= 0).all() and (host["logp_old"][mask] < 0).any()
