"""The fast path of llm.train equals the reference path on CPU, with the tiny Llama (issue 20).

- Decoding: a static KV cache (and transformers' compiled decoding forward) samples the same tokens
  under the same seed as the dynamic cache, with the same sampler log-probs, greedy or sampled, and
  stops when every row has ended.
- The LM head: TRL 1.16's fused kernel (``--lm-head trl``; its torch fallback on CPU, its Triton
  kernel in the gpu-marked test) gives the chunked path's log-probs, entropies and gradients.
- A training run with the fast flags logs the reference run's rows.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from llm import rollout
from llm.config import TrainConfig, decode_settings
from llm.logprobs import completion_logp
from llm.model import tiny_model, tiny_tokenizer
from llm.train import train

PROMPTS = ["12+3=", "7*8=", "1+1=", "99-4="]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def prompt_ids(tok):
    return rollout.encode_prompts(tok, PROMPTS, True, None)


def sample(model, tok, **kw):
    args = dict(
        group_size=2,
        max_new_tokens=12,
        temperature=1.0,
        prompts_per_call=2,
        seed_keys=(0, 1),
        first_index=0,
        device=torch.device("cpu"),
        return_logp=True,
    )
    return rollout.generate(model, tok, prompt_ids(tok), **{**args, **kw})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_static_cache_samples_the_same_tokens_and_logp(tok, dtype):
    model = tiny_model(len(tok), 0).to(dtype).eval()
    ref = sample(model, tok)
    fast = sample(model, tok, cache="static")
    assert ref["completion"].shape == (8, 12)
    for key in ("prompt", "prompt_mask", "completion", "completion_mask", "truncated"):
        assert torch.equal(ref[key], fast[key]), key
    # the static cache attends over a longer (masked) key axis: the same logits to rounding
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(fast["rollout_logp"], ref["rollout_logp"], atol=tol, rtol=0)
    assert ref["rollout_logp"].lt(0).all()  # log-probs of real samples (no EOS reached here)


def test_static_cache_under_bf16_autocast_keeps_one_dtype_and_samples_the_dynamic_tokens(
    tok, monkeypatch
):
    """Under bf16 autocast (CUDA's by default; the CPU's here) the rotary embedding leaves keys
    float32 and values bf16; transformers 5.17's static layer took the keys' dtype for both and
    failed on the values (an H200, 2026-11-26; 5.17 on this CPU too). The static cache passed to
    ``generate`` stores the values in the keys' dtype, and samples the dynamic path's tokens."""
    caches = []
    real = rollout.autocast_static_cache
    monkeypatch.setattr(
        rollout, "autocast_static_cache", lambda *a: caches.append(real(*a)) or caches[-1]
    )
    model = tiny_model(len(tok), 0).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = sample(model, tok)
        assert caches == []  # the dynamic path keeps transformers' own cache
        fast = sample(model, tok, cache="static")
    assert len(caches) == 2  # one per generate call (2 prompts per call)
    for cache in caches:
        layer = cache.layers[0]
        assert layer.keys.dtype == layer.values.dtype == torch.float32
    assert torch.equal(ref["completion"], fast["completion"])
    torch.testing.assert_close(fast["rollout_logp"], ref["rollout_logp"], atol=2e-2, rtol=0)


def test_static_cache_greedy_equals_dynamic(tok):
    model = tiny_model(len(tok), 3).eval()
    ids, mask = rollout.stack_left_padded(prompt_ids(tok), tok.pad_token_id)
    outs = []
    for cache in ("dynamic", "static"):
        config = rollout.generation_config(tok, 1.0, 10, False, cache)
        config.do_sample = False
        outs.append(model.generate(input_ids=ids, attention_mask=mask, generation_config=config))
    assert outs[0].shape == (4, ids.shape[1] + 10)
    assert torch.equal(outs[0], outs[1])


def test_generation_stops_when_every_row_has_ended(tok):
    """A head with zero weights and a bias of log((V - 1) / 9) on EOS samples EOS with probability
    0.1 and every other token with 0.9 / (V - 1), so every row ends long before 100 tokens (a row
    runs to 100 with probability 0.9^100 < 3e-5); both caches stop at the last row's EOS."""
    model = tiny_model(len(tok), 0).eval()
    V = len(tok)
    model.lm_head = torch.nn.Linear(32, V, bias=True)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.zero_()
        model.lm_head.bias[tok.eos_token_id] = math.log((V - 1) / 9)
    outs = [sample(model, tok, max_new_tokens=100, cache=c) for c in ("dynamic", "static")]
    for key in ("completion", "completion_mask", "rollout_logp"):
        assert torch.equal(outs[0][key], outs[1][key]), key
    lengths = outs[0]["completion_mask"].sum(-1)
    assert not outs[0]["truncated"].any()
    assert outs[0]["completion"].shape[1] == lengths.max() < 100
    valid = outs[0]["completion_mask"].bool()
    is_eos = outs[0]["completion"] == tok.eos_token_id
    expected = torch.where(is_eos, math.log(0.1), math.log(0.9 / (V - 1)))
    torch.testing.assert_close(outs[0]["rollout_logp"][valid], expected[valid], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_compiled_decoding_samples_the_same_tokens(tok):
    """transformers' compiled decoding forward (torch.compile, ~30 s on 2 CPU cores)."""
    model = tiny_model(len(tok), 0).eval()
    ref = sample(model, tok)
    fast = sample(model, tok, cache="static", compile_decode=True)
    assert torch.equal(ref["completion"], fast["completion"])
    assert torch.allclose(ref["rollout_logp"], fast["rollout_logp"], atol=1e-5, rtol=0)


def test_generation_config_checks():
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="cache must be one of"):
        rollout.generation_config(tok, 1.0, 4, False, "paged")
    with pytest.raises(ValueError, match="compile_decode needs cache='static'"):
        rollout.generation_config(tok, 1.0, 4, False, "dynamic", compile_decode=True)
    fast = rollout.generation_config(tok, 1.0, 4, False, "static", compile_decode=True)
    assert fast.cache_implementation == "static" and not fast.disable_compile
    assert fast.compile_config._compile_all_devices
    ref = rollout.generation_config(tok, 1.0, 4, False)
    assert ref.cache_implementation is None and ref.disable_compile


def test_decode_settings_default_is_the_reference_path_until_measured():
    assert decode_settings(TrainConfig()) == ("dynamic", False)
    assert decode_settings(TrainConfig(generate_cache="static")) == ("static", False)
    assert decode_settings(TrainConfig(generate_compile="off")) == ("dynamic", False)
    fast = TrainConfig(generate_cache="static", generate_compile="on")
    assert decode_settings(fast) == ("static", True)
    with pytest.raises(ValueError, match="--generate-compile on needs a static cache"):
        decode_settings(TrainConfig(generate_compile="on"))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(generate_cache="paged"), "--generate-cache must be one of"),
        (dict(generate_compile="yes"), "--generate-compile must be one of"),
        (dict(lm_head="liger"), "--lm-head must be one of"),
        (dict(generate_cache="dynamic", generate_compile="on"), "--generate-compile on needs"),
        (dict(rollout_backend="vllm", generate_cache="static"), "not vLLM's"),
    ],
)
def test_bad_fast_flags(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw).validate()


# --------------------------------------------------------------------------------------------------
# The LM head: TRL's fused kernel against the chunked path
# --------------------------------------------------------------------------------------------------


def head_inputs(tok, dtype, device="cpu", seed=0):
    model = tiny_model(len(tok), seed).to(dtype).to(device)
    ids = prompt_ids(tok)
    prompt, prompt_mask = rollout.stack_left_padded(ids, tok.pad_token_id)
    gen = torch.Generator().manual_seed(seed)
    completion = torch.randint(3, len(tok), (len(ids), 7), generator=gen)
    mask = torch.ones_like(completion)
    mask[0, 4:] = 0  # a completion that ended early
    mask[2, 1:] = 0
    return model, [x.to(device) for x in (prompt, prompt_mask, completion, mask)]


def logp_and_grads(model, inputs, head, temperature, chunk_size=None):
    model.zero_grad()
    logp, ent = completion_logp(
        model, *inputs, temperature, entropy="grad", chunk_size=chunk_size, head=head
    )
    ((logp * torch.linspace(-1, 1, logp.shape[1], device=logp.device)).sum() + ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logp.detach(), ent.detach(), grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trl_head_equals_chunked_path_on_cpu(tok, temperature):
    pytest.importorskip("trl")
    model, inputs = head_inputs(tok, torch.float64)
    ref = logp_and_grads(model, inputs, "chunked", temperature)
    # a vocabulary tile narrower than the vocabulary: the online log-sum-exp over several tiles
    fused = logp_and_grads(model, inputs, "trl", temperature, chunk_size=16)
    mask = inputs[3].bool()
    assert (ref[0][~mask] == 0).all() and (fused[0][~mask] == 0).all()
    # TRL accumulates its statistics in float32 (and returns float32): float32 tolerances
    assert fused[0].dtype == torch.float32
    torch.testing.assert_close(fused[0].double(), ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused[1].double(), ref[1], atol=1e-5, rtol=1e-5)
    assert ref[1][mask].gt(0).all()
    for name, g in ref[2].items():
        torch.testing.assert_close(fused[2][name].to(g.dtype), g, atol=1e-5, rtol=1e-4)


def test_bad_head_name(tok):
    model, inputs = head_inputs(tok, torch.float32)
    with pytest.raises(ValueError, match="head must be one of"):
        completion_logp(model, *inputs, 1.0, head="liger")


@pytest.mark.gpu
def test_trl_triton_head_equals_chunked_path_on_cuda(tok):
    """bf16 autocast on CUDA: TRL's Triton kernel against the chunked path (both with the head's
    matmul in bf16 and the statistics in float32)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("trl")
    model, inputs = head_inputs(tok, torch.float32, "cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = logp_and_grads(model, inputs, "chunked", 1.0)
        fused = logp_and_grads(model, inputs, "trl", 1.0)
    torch.testing.assert_close(fused[0], ref[0], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(fused[1], ref[1], atol=2e-2, rtol=2e-2)
    for name, g in ref[2].items():
        torch.testing.assert_close(fused[2][name], g, atol=2e-2, rtol=5e-2)


# --------------------------------------------------------------------------------------------------
# A run with the fast flags
# --------------------------------------------------------------------------------------------------


def test_run_with_fast_flags_logs_the_reference_rows(tmp_path):
    pytest.importorskip("trl")
    base = dict(
        model="tiny",
        task="parity",
        task_knobs={"length": 2},
        lr=1e-2,
        steps=2,
        prompts_per_step=4,
        group_size=4,
        max_new_tokens=8,
        epochs=2,
        progress=False,
        save_model=False,
        device="cpu",
    )
    ref = train(TrainConfig(**base, out=str(tmp_path / "ref")))
    fast = train(
        TrainConfig(**base, out=str(tmp_path / "fast"), generate_cache="static", lm_head="trl")
    )
    assert len(ref) == len(fast) == 2
    for r, f in zip(ref, fast, strict=True):
        # the same completions: identical rollout statistics
        for key in ("reward", "pass_rate", "completion_len", "truncated_frac", "zero_var_frac"):
            assert f[key] == r[key], key
        for key in ("loss", "entropy", "grad_norm", "ratio_mean", "clip_high_frac"):
            assert f[key] == pytest.approx(r[key], rel=1e-4, abs=1e-6), key
