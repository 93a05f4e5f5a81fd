"""TRL's ``delta`` for every value TRL accepts (>= 1): loss and gradients equal TRL's own.

For delta < 1 + epsilon_high TRL's ``min(r, delta)`` term is not a dual clip: it lowers the
A > 0 upper bound to delta and leaves the A < 0 side at 1 + epsilon_high. With epsilon = 0.2 and
log-ratio noise 0.5 many tokens fall in (delta, 1.2] for delta = 1.0 and 1.1, where a dual clip
at c = delta would differ from TRL.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from test_adapter_trl import (  # the parity helpers of the main TRL test module
    TRL_AGGREGATION,
    assert_parity,
    loss_and_grads,
    make_args,
    make_inputs,
    setup_pair,
    tokenizer,  # noqa: F401  (fixture)
)

from llm.adapters.trl import trl_equivalent


@pytest.mark.parametrize(
    ("delta", "eps_high", "clip_c"),
    [(1.0, 0.0, 1.2), (1.1, 0.1, 1.2), (1.3, 0.2, 1.3), (2.0, 0.2, 2.0)],
)
def test_delta_mapping_and_parity_with_trl(delta, eps_high, clip_c, tmp_path, tokenizer):  # noqa: F811
    spec = trl_equivalent(make_args(tmp_path, loss_type="grpo", epsilon=0.2, delta=delta))
    assert spec.objective == "ppo_clip" and spec.params["eps_low"] == 0.2
    assert spec.params["eps_high"] == pytest.approx(eps_high, abs=1e-12)
    assert spec.params["clip_c"] == pytest.approx(clip_c, abs=1e-12)
    args = {"loss_type": "grpo", "epsilon": 0.2, "delta": delta}
    stock, ours = setup_pair(tmp_path, tokenizer, args, {"aggregation": TRL_AGGREGATION["grpo"]})
    inputs = make_inputs(stock, noise=0.5)
    assert_parity(loss_and_grads(ours, inputs), loss_and_grads(stock, inputs))
