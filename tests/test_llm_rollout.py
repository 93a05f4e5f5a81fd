"""llm.rollout and llm.vllm_rollout without an engine: ``generate`` returns the sampler's own
log-probs, and the ``--vllm-sleep`` cycle (a recording stand-in for ``vllm.LLM``) pushes the
weights after every sleep. The real engine is tested in ``test_llm_vllm.py``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from llm.model import tiny_model, tiny_tokenizer


def test_generate_returns_the_samplers_logp():
    from llm import logprobs, rollout

    tok, model = tiny_tokenizer(), tiny_model(len(tiny_tokenizer()), 0).eval()
    ids = rollout.encode_prompts(tok, ["1 0", "0 1 1 0"], chat=False, system=None)
    out = rollout.generate(
        model,
        tok,
        ids,
        group_size=3,
        max_new_tokens=6,
        temperature=0.7,
        prompts_per_call=2,
        seed_keys=(0,),
        first_index=0,
        device=torch.device("cpu"),
        return_logp=True,
    )
    with torch.no_grad():
        lp, _ = logprobs.completion_logp(
            model, out["prompt"], out["prompt_mask"], out["completion"], out["completion_mask"], 0.7
        )
    valid = out["completion_mask"].bool()
    assert (out["rollout_logp"][~valid] == 0).all()
    torch.testing.assert_close(out["rollout_logp"][valid], lp[valid], atol=1e-4, rtol=0)


def test_vllm_sleep_cycle_pushes_weights_after_every_sleep():
    # --vllm-sleep is CUDA-only, so its state machine is checked with a recording stand-in for
    # vllm.LLM: level-2 sleep discards the weights, so every rollout after a sleep must push them
    # (even with no optimizer step in between) and wake the KV cache before sampling.
    from types import SimpleNamespace

    from llm.vllm_rollout import VLLMRollout

    calls = []
    tok = tiny_tokenizer()
    completion = SimpleNamespace(index=0, token_ids=[5, tok.eos_token_id], logprobs=None)
    worker = SimpleNamespace(
        reload_weights=lambda **kw: calls.append(("push", len(list(kw["weights_iterator"]))))
    )
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker)),
        reset_prefix_cache=lambda: calls.append("reset"),
        wake_up=lambda tags: calls.append(("wake", *tags)),
        sleep=lambda level: calls.append(("sleep", level)),
        generate=lambda reqs, sampling_params, use_tqdm: (
            calls.append("generate"),
            [SimpleNamespace(outputs=[completion]) for _ in reqs],
        )[1],
    )
    engine = object.__new__(VLLMRollout)
    engine.llm, engine.tokenizer, engine.sleep = llm, tok, True
    engine.vllm = SimpleNamespace(SamplingParams=lambda **kw: kw)
    engine.stale = True  # as after __init__ (which, with sleep on, leaves it asleep)
    model = tiny_model(len(tok), 0)
    n_params = len(list(model.parameters()))
    for _ in range(2):  # no optimizer step between the two rollouts
        out = engine.generate(
            model,
            [[1, 5]],
            group_size=1,
            max_new_tokens=4,
            temperature=1.0,
            seed_keys=(0,),
            first_index=0,
        )
        assert out["completion"].tolist() == [[5, tok.eos_token_id]]
    cycle = [
        ("wake", "weights"),
        ("push", n_params),
        "reset",
        ("wake", "kv_cache"),
        "generate",
        ("sleep", 2),
    ]
    assert calls == cycle + cycle
