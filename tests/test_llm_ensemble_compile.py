"""``--compile-update on`` (issue 28): an ensemble's micro-step (the batched forward, the LM head
and the vmapped loss, :class:`llm.ensemble.CompiledLosses`) compiled as one graph trains the
members as the eager ensemble does (and so as K separate runs, ``tests/test_llm_ensemble.py``):
the same logged rows and final parameters, with no graph break and one compiled graph over 3 steps
(each micro-batch padded to fixed widths, so no step recompiles). The backend is ``aot_eager``
(Dynamo and AOTAutograd trace what inductor would compile; inductor's C++ build takes minutes on
2 CPU cores)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from test_llm_ensemble import RUN as ENSEMBLE_RUN
from test_llm_ensemble import TIMING
from test_llm_train_loop import strip_timing
from torch._dynamo.utils import counters

from llm.checkpoint import model_state
from llm.config import TrainConfig
from llm.ensemble import train_ensemble
from llm.train import main as train_main

#: the ensemble tests' runs (test_llm_ensemble), 3 steps of 2 x 2 micro-batches each
RUN = {**ENSEMBLE_RUN, "steps": 3, "minibatches": 2, "grad_accum": 2}


@pytest.mark.parametrize(
    "members",
    [
        # two seeds of one rule: 3 steps x 2 epochs x 2 minibatches x 2 micro-batches
        [dict(seed=0), dict(seed=1)],
        # three seeds, entropy bonus (the head's entropy in the graph's backward), dynamic
        # sampling: members keep unequal numbers of rows (stand-in rows, padded micro-batches)
        [dict(seed=s, drop_zero_variance=True, entropy_coef=0.01) for s in (0, 4, 5)],
    ],
)
def test_compiled_update_equals_the_eager_ensemble(tmp_path, monkeypatch, members):
    """float64 parameters (the runs' models loaded in float64: ``--dtype`` offers float32 and
    bfloat16 only), so the padded graph's other rounding stays far below the tolerance."""
    from llm import model as models

    load = models.load_model
    monkeypatch.setattr(models, "load_model", lambda *a, **kw: load(*a, **kw).double())

    def cfgs(tag, compile_update):
        return [
            TrainConfig(**RUN, **m, compile_update=compile_update, out=str(tmp_path / f"{tag}{k}"))
            for k, m in enumerate(members)
        ]

    eager = train_ensemble(cfgs("eager", "off"))
    torch._dynamo.reset()
    counters.clear()
    compiled = train_ensemble(cfgs("comp", "on"), _compile_backend="aot_eager")
    # fullgraph=True would raise at a break; one graph for the 24 micro-steps: no recompile
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["stats"]["calls_captured"] > 100  # the whole forward and loss were traced
    for k in range(len(members)):
        rows_e, rows_c = eager[k], compiled[k]
        assert [r["step"] for r in rows_c] == [1, 2, 3]
        for re_, rc in zip(rows_e, rows_c, strict=True):
            assert list(re_) == list(rc)
            for key in re_:
                if key not in TIMING:
                    assert rc[key] == pytest.approx(re_[key], rel=1e-6, abs=1e-9), (k, key)
        logged = (tmp_path / f"comp{k}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in logged] == rows_c
        state_e = model_state(str(tmp_path / f"eager{k}"))
        state_c = model_state(str(tmp_path / f"comp{k}"))
        for name, p in state_e.items():
            # the padded micro-batches (more rows per LM-head chunk, wider attention) round
            # differently, and Adam's division by sqrt(v) carries that into a step
            torch.testing.assert_close(
                state_c[name], p, atol=1e-9, rtol=1e-9, msg=lambda m, name=name: f"{name}: {m}"
            )


def test_a_run_alone_refuses_compile_update(tmp_path, in_process):
    """``python -m llm.train`` (its ``main``; its one-line errors also run as a real subprocess
    in ``test_llm_train_errors``)."""
    proc = in_process(train_main, "--compile-update", "on", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --compile-update on compiles an ensemble's update (python -m llm.ensemble)"
    ]


def test_stochastic_rule_stays_eager(tmp_path):
    """A rule that draws random numbers (NSR's band noise, from each member's generator) is not
    compiled: the micro-steps run the eager path, so the run is the eager ensemble's exactly."""

    def cfgs(tag, compile_update):
        nsr = dict(objective="nsr", objective_params={"noise": "band", "sigma": 0.1})
        return [
            TrainConfig(
                **{**RUN, "steps": 1},
                **nsr,
                seed=s,
                compile_update=compile_update,
                out=str(tmp_path / f"{tag}{s}"),
            )
            for s in (0, 1)
        ]

    eager = train_ensemble(cfgs("eager", "off"))
    torch._dynamo.reset()
    counters.clear()
    compiled = train_ensemble(cfgs("comp", "on"), _compile_backend="aot_eager")
    assert counters["stats"]["unique_graphs"] == 0
    for rows_e, rows_c in zip(eager, compiled, strict=True):
        assert [r["step"] for r in rows_c] == [1] and rows_c[0]["loss"] != 0
        assert strip_timing(rows_c) == strip_timing(rows_e)


def test_micro_batches_of_other_widths_share_one_graph():
    """Micro-batches of other prompt widths, completion widths and row counts (ragged masks)
    padded to one shape: one graph for both, and each gives the eager :func:`member_losses`'
    losses, metrics and gradients (float64)."""
    import sandbox.objectives as registry
    from llm.ensemble import CompiledLosses, Ensemble, member_losses
    from llm.model import tiny_model, tiny_tokenizer
    from sandbox.loss import PolicyLoss

    tok = tiny_tokenizer()
    ens = Ensemble([tiny_model(len(tok), s).double() for s in (0, 1)])
    cfg = TrainConfig(prompts_per_step=2, group_size=2, max_new_tokens=8)
    compiled = CompiledLosses(ens, cfg, tok.pad_token_id, "aot_eager")
    loss_fns = [PolicyLoss(registry.get_objective("dapo"), None)] * 2
    leaves = ens.parameters()
    gen = torch.Generator().manual_seed(0)
    torch._dynamo.reset()
    counters.clear()
    for Tp, Tc, rows in ((3, 5, 4), (5, 7, 3)):
        K = 2
        prompt_len = torch.randint(1, Tp + 1, (K, rows, 1), generator=gen)
        completion_len = torch.randint(1, Tc + 1, (K, rows, 1), generator=gen)
        completion_mask = (torch.arange(Tc) < completion_len).long()
        batch = {
            "prompt": torch.randint(3, len(tok), (K, rows, Tp), generator=gen),
            "prompt_mask": (torch.arange(Tp) >= Tp - prompt_len).long(),
            "completion": torch.randint(3, len(tok), (K, rows, Tc), generator=gen),
            "completion_mask": completion_mask,
            "loss_mask": completion_mask,
            "adv": torch.randn(K, rows, 1, generator=gen, dtype=torch.float64),
            "logp_old": -torch.rand(K, rows, Tc, generator=gen, dtype=torch.float64) * 5,
        }
        counts = [
            {"num_tokens": m.sum().double(), "num_seqs": float(rows), "max_len": 8}
            for m in completion_mask
        ]
        kwargs = dict(temperature=1.0, counts=counts, sizes=[(rows, Tc)] * K)
        eager = member_losses(ens, batch, loss_fns, **kwargs)
        outs = compiled(ens, batch, loss_fns, **kwargs)
        for e, c in zip(eager, outs, strict=True):
            torch.testing.assert_close(c.loss, e.loss, atol=1e-12, rtol=1e-10)
            assert set(c.metrics) == set(e.metrics)
            for key, value in e.metrics.items():
                torch.testing.assert_close(c.metrics[key], value, atol=1e-12, rtol=1e-10)
        grads_e = torch.autograd.grad(sum(o.loss for o in eager), leaves)
        grads_c = torch.autograd.grad(sum(o.loss for o in outs), leaves)
        assert max(g.abs().max().item() for g in grads_e) > 1e-3
        for ge, gc in zip(grads_e, grads_c, strict=True):
            torch.testing.assert_close(gc, ge, atol=1e-12, rtol=1e-10)
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.gpu
def test_compiled_update_on_cuda_with_inductor_runs_without_recompiles(tmp_path):
    """``--compile-update on`` as a lend would run it: CUDA, bf16 autocast, inductor (never run
    before a lend): 3 steps with no graph break and one graph, every loss finite (its equality
    with the eager ensemble is the float64 CPU test's above; bf16 rounds both differently)."""
    run = {**RUN, "device": "cuda", "save_model": False}

    def cfgs(tag, compile_update):
        return [
            TrainConfig(
                **run, seed=s, compile_update=compile_update, out=str(tmp_path / f"{tag}{s}")
            )
            for s in (0, 1)
        ]

    torch._dynamo.reset()
    counters.clear()
    compiled = train_ensemble(cfgs("comp", "on"))
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1
    for rows in compiled:
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows), rows
