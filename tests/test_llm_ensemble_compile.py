"""``--compile-update on`` (issue 28): an ensemble's micro-step (the batched forward, the LM head
and the vmapped loss, :class:`llm.ensemble.CompiledLosses`) compiled as one graph trains the
members as the eager ensemble does (and so as K separate runs, ``tests/test_llm_ensemble.py``):
the same logged rows and final parameters, with no graph break and one compiled graph over 3 steps
(each micro-batch padded to fixed widths, so no step recompiles). The backend is ``aot_eager``
(Dynamo and AOTAutograd trace what inductor would compile; inductor's C++ build takes minutes on
2 CPU cores)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from torch._dynamo.utils import counters  # noqa: E402

from llm.checkpoint import model_state  # noqa: E402
from llm.config import TrainConfig  # noqa: E402
from llm.ensemble import train_ensemble  # noqa: E402

TIMING = ("tokens_per_s", "step_time")
RUN = dict(
    model="tiny",
    task="parity",
    task_knobs={"length": 2},
    lr=1e-2,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=8,
    steps=3,
    epochs=2,
    minibatches=2,
    grad_accum=2,
    progress=False,
    save_model=True,
    device="cpu",
)


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


def test_a_run_alone_refuses_compile_update(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "llm.train", "--compile-update", "on", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --compile-update on compiles an ensemble's update (python -m llm.ensemble)"
    ]
