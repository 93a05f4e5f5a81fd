"""Rollouts with Hugging Face ``generate`` and per-token log-probs of completions.

Sampling is plain softmax sampling at ``temperature`` (``top_k=0``, ``top_p=1``, no repetition
penalty: a fresh ``GenerationConfig`` overrides the model's shipped one), so the sampler is the
policy whose log-probs :func:`llm.logprobs.completion_logp` computes and no importance
correction is needed in exact arithmetic. With ``return_logp=True`` :func:`generate` also
returns the sampler's own per-token log-probs (``rollout_logp``: ``log_softmax`` of the processed
scores ``generate`` sampled from, gathered at the sampled ids), i.e. the rollout policy as the
sampler computed it (KV cache, bf16 autocast on a GPU); :mod:`sandbox.correction` weights the
loss by their ratio to the trainer's log-probs (``--rollout-is``).

Determinism across world sizes: prompts are generated in chunks of ``prompts_per_call`` prompts
(x G completions); each chunk's sampling is seeded from ``seed_keys`` (the caller's
``(seed, stream, step)``, :class:`llm.streams.Stream`) and the global index of its first prompt,
inside ``torch.random.fork_rng``. With one prompt per call (the default) a prompt gets
the same completions whatever the number of processes, which is what makes a 2-process run equal
a 1-process run; larger chunks are faster on a GPU.

The fast decoding path (``cache="static"``, ``compile_decode=True``; ``--generate-cache`` and
``--generate-compile`` in :mod:`llm.config`, on by default on CUDA) changes how the same
distribution is computed, not what is sampled: a static KV cache (``cache_implementation=
"static"``, preallocated to prompt + ``max_new_tokens``) lets transformers compile the one-token
decoding forward (``torch.compile``, ``mode="reduce-overhead"``: CUDA graphs), bf16 autocast is the
caller's (``--bf16``), and ``generate`` stops as soon as every row has emitted EOS (with either
cache). The sampling draws stay outside the compiled forward, so under the same seed the fast path
samples the same tokens unless a rounding difference in the logits moves a draw across a
boundary of the inverse CDF (the tiny Llama on CPU: the same tokens, log-probs within 1e-6 in
float32, ``tests/test_llm_fast.py``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import Tensor

from llm.streams import derive_seed

CACHES = ("dynamic", "static")


def encode_prompts(
    tokenizer: Any, prompts: list[str], chat: bool, system: str | None
) -> list[list[int]]:
    """Token ids per prompt: the chat template (``add_generation_prompt``) or plain encoding."""
    if chat:
        out = []
        for p in prompts:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": p}
            ]
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        return out
    return [tokenizer(p)["input_ids"] for p in prompts]


def stack_left_padded(
    rows: list[list[int]] | list[Tensor], pad_id: int, length: int | None = None
) -> tuple[Tensor, Tensor]:
    """``[n, L]`` left-padded ids and their attention mask."""
    rows = [torch.as_tensor(r, dtype=torch.long) for r in rows]
    L = length or max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, L - len(r) :] = r
            mask[i, L - len(r) :] = 1
    return ids, mask


def pad_right(x: Tensor, length: int, value: float | int = 0) -> Tensor:
    return torch.nn.functional.pad(x, (0, length - x.shape[-1]), value=value)


def pad_left(x: Tensor, length: int, value: float | int = 0) -> Tensor:
    return torch.nn.functional.pad(x, (length - x.shape[-1], 0), value=value)


# per-token tensors of a rollout, [n, Tc]: right-padded when rollouts are joined
COMPLETION_KEYS = (
    "completion",
    "completion_mask",
    "loss_mask",
    "rollout_logp",
    "logp_old",
    "logp_ref",
)


def pad_to_common(parts: list[dict[str, Tensor]], pad_id: int) -> dict[str, list[Tensor]]:
    """Each key's tensors of several rollouts (ranks, or ensemble members), padded to common
    widths: prompts and their masks on the left, :data:`COMPLETION_KEYS` on the right (pad ids
    for prompts and completions, 0 elsewhere); other tensors as they are."""
    Tp = max(p["prompt"].shape[1] for p in parts)
    Tc = max(p["completion"].shape[1] for p in parts)
    out = {}
    for key in parts[0]:
        value = pad_id if key in ("prompt", "completion") else 0
        rows = [p[key] for p in parts]
        if key in ("prompt", "prompt_mask"):
            rows = [pad_left(r, Tp, value) for r in rows]
        elif key in COMPLETION_KEYS:
            rows = [pad_right(r, Tc, value) for r in rows]
        out[key] = rows
    return out


def completion_masks(completion: Tensor, eos_id: int) -> tuple[Tensor, Tensor]:
    """``(mask, truncated)``: tokens up to and including the first EOS; rows with no EOS."""
    is_eos = completion == eos_id
    before = (is_eos.cumsum(-1) - is_eos.long()) == 0  # no EOS strictly before this position
    return before.long(), ~is_eos.any(-1)


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    prompts_per_call: int,
    seed_keys: tuple[int, ...],
    first_index: int,
    device: torch.device,
    synced_gpus: bool = False,
    return_logp: bool = False,
    cache: str = "dynamic",
    compile_decode: bool = False,
) -> dict[str, Tensor]:
    """G completions per prompt, prompt-major (row ``i * G + g``), left-padded prompts and
    right-padded completions (``pad_token_id`` after EOS). ``return_logp``: also
    ``rollout_logp`` ``[B, Tc]`` float32, the sampler's log-probs of the sampled tokens (0 after
    EOS). ``cache``: ``"dynamic"`` (the reference path) or ``"static"``; ``compile_decode``:
    compile the decoding forward (static cache only; see the module docstring)."""
    gen_config = generation_config(
        tokenizer, temperature, max_new_tokens, return_logp, cache, compile_decode
    )
    casting = cache == "static" and torch.is_autocast_enabled(device.type)
    if casting:  # the static cache is passed per call (autocast_static_cache)
        gen_config.cache_implementation = None
    pad = tokenizer.pad_token_id
    prompts, masks, completions, logps = [], [], [], []
    for start in range(0, len(prompt_ids), prompts_per_call):
        chunk = prompt_ids[start : start + prompts_per_call]
        ids, mask = stack_left_padded([r for r in chunk for _ in range(group_size)], pad)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(derive_seed(*seed_keys, first_index + start))
            cached = (
                {cache_kwarg(model): autocast_static_cache(model, ids.shape[1] + max_new_tokens)}
                if casting
                else {}
            )
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=gen_config,
                synced_gpus=synced_gpus,
                **cached,
            )
        seqs = out.sequences if return_logp else out
        new = seqs[:, ids.shape[1] :]
        if return_logp:  # scores: one [n, V] per new token, after the temperature warper
            lp = [
                x.float().gather(-1, new[:, t, None])[:, 0] - x.float().logsumexp(-1)
                for t, x in enumerate(out.scores)
            ]
            logps.append(torch.stack(lp, 1).cpu())
        prompts.append(ids)
        masks.append(mask)
        completions.append(new.cpu())
    Tp = max(p.shape[1] for p in prompts)
    Tc = max(max(c.shape[1] for c in completions), 1)
    return rollout_batch(
        torch.cat([pad_left(p, Tp, pad) for p in prompts]),
        torch.cat([pad_left(m, Tp, 0) for m in masks]),
        torch.cat([pad_right(c, Tc, pad) for c in completions]),
        tokenizer,
        torch.cat([pad_right(x, Tc, 0.0) for x in logps]) if return_logp else None,
    )


@functools.cache
def _casting_static_cache() -> type:
    """transformers' ``StaticCache`` whose values take the keys' dtype (one class, so a compiled
    decoding forward guards on one type)."""
    from transformers import StaticCache

    class CastingStaticCache(StaticCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            value_states = value_states.to(key_states.dtype)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return CastingStaticCache


def cache_kwarg(model: Any) -> str:
    """The name ``generate`` takes a KV cache by: ``cache`` where the model's forward has it
    (transformers 5.24: ``past_key_values`` is deprecated), else ``past_key_values`` (5.17)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def autocast_static_cache(model: Any, length: int) -> Any:
    """A static KV cache of ``length`` positions for ``generate`` under autocast. There the rotary
    embedding's float32 cos/sin leave the keys float32 while the values are bf16, and transformers
    5.17's static layer, which takes one dtype (the keys'), refused the values (``index_copy_``:
    an H200, 2026-11-26; transformers 5.24 keeps two). Here the values take the keys' dtype;
    SDPA's autocast casts both to bf16 as it does on the dynamic path."""
    return _casting_static_cache()(config=model.config, max_cache_len=length)


def generation_config(
    tokenizer: Any,
    temperature: float,
    max_new_tokens: int,
    return_logp: bool,
    cache: str = "dynamic",
    compile_decode: bool = False,
) -> Any:
    """The ``GenerationConfig`` of :func:`generate`: plain sampling at ``temperature``, the KV
    cache ``cache`` and, with ``compile_decode``, transformers' compiled decoding forward (on any
    device; without it compilation is disabled, also on CUDA)."""
    from transformers import CompileConfig, GenerationConfig

    if cache not in CACHES:
        raise ValueError(f"cache must be one of {list(CACHES)}, got {cache!r}")
    if compile_decode and cache != "static":
        raise ValueError("compile_decode needs cache='static' (a dynamic cache is not compiled)")
    compile_config = None
    if compile_decode:
        compile_config = CompileConfig()
        compile_config._compile_all_devices = True  # transformers compiles on CUDA only otherwise
    return GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        output_scores=return_logp,
        return_dict_in_generate=return_logp,
        cache_implementation="static" if cache == "static" else None,
        compile_config=compile_config,
        disable_compile=not compile_decode,
    )


def rollout_batch(
    prompt: Tensor,
    prompt_mask: Tensor,
    completion: Tensor,
    tokenizer: Any,
    rollout_logp: Tensor | None = None,
) -> dict[str, Tensor]:
    """The rollout dict every sampler returns: completions cut after their first EOS (pad ids,
    mask 0 and log-prob 0 there) and the rows that never reached EOS (``truncated``)."""
    completion_mask, truncated = completion_masks(completion, tokenizer.eos_token_id)
    valid = completion_mask.bool()
    result = {
        "prompt": prompt,
        "prompt_mask": prompt_mask,
        "completion": torch.where(valid, completion, tokenizer.pad_token_id),
        "completion_mask": completion_mask,
        "truncated": truncated,
    }
    if rollout_logp is not None:
        result["rollout_logp"] = torch.where(valid, rollout_logp, 0.0)
    return result
