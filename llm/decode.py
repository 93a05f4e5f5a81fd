"""One decoding loop for K models of one architecture: a compact forward over stacked weights.

K runs of a study (seeds, rules) sample from K models of one architecture. Decoding them one
after another with Hugging Face ``generate`` launches every kernel K times; here the K members'
weights are stacked on a leading dimension and every linear layer is one batched matmul over the
members (``torch.bmm`` over ``[K, rows, in] @ [K, in, out]``), so a decoding step costs one
launch per operation whatever K is:

    prefill:  h = body_k(prompt_k)                   one forward over the prompt bucket, K at once,
                                                     once per prompt (KV cache copied to its G rows)
    step t:   logits[k, b] = head_k(body_k(token_{t-1}; KV cache))          [K, B, V], one forward
              token[k, b]   = argmax_v (logits[k, b, v] / T + g[k, b, t, v])     Gumbel-max
              g = -log(-log u),  u = U(key_k, row_b, t, v)                   fixed per position

Why the tokens are member k's own: the members share no weight and no row, each batched matmul
is K independent matmuls, and a member's noise is a function of its own key and row, never of
K or of the other members; so member k decoded with K - 1 others draws the tokens it draws alone
(``tests/test_llm_decode.py``: token for token, float32, and equal to a reference that samples
from the Hugging Face model's full forward with the same noise).

The sampler is the exponential race of :func:`sandbox.streams.gumbel_max` written in logits
(``argmax p_v / E_v = argmax log p_v - log E_v``, ``E = -log u``): a draw from
``softmax(logits / T)``, i.e. plain sampling at temperature T as :mod:`llm.rollout` does it, but
from uniforms fixed per (key, row, position, token) by :func:`counter_uniform` (a counter-based
hash, no generator state): ``key`` is ``derive_seed(seed, Stream.ROLLOUT, step)`` of
:mod:`llm.streams` and ``row`` the completion's global index in the step (prompt index x G + g).
So two runs with one seed draw from the same uniforms at every position, whatever their rules
(common random numbers): where their policies agree they sample the same tokens. A completion
does not depend on the batch it was decoded in (chunks, ranks, members).

One prefill per prompt: GRPO samples each prompt G times, rows prompt-major (row ``p * G + g``
is prompt ``p``'s completion ``g``, the layout of :func:`llm.rollout.generate`, of the rewards and
of the group advantages). A prompt's forward depends on that prompt alone, so :func:`prefill`
runs it once and copies its KV cache and last logits to its G rows (``repeat_interleave``): the
prefill costs 1/G of a forward over every row, and every row samples what it sampled from its own
prefill (the tests: token for token against ``group_size=1`` over repeated prompts).

Fixed shapes, no host read in the loop: prompts are left-padded to a length bucket
(:func:`bucket`, multiples of :data:`BUCKET`), the static KV cache holds ``bucket +
max_new_tokens`` slots, every step runs the same shapes with its position as a device tensor,
and a row that emitted EOS keeps decoding under a mask (its later tokens are pad, log-prob 0):
the loop runs ``max_new_tokens`` steps and reads the host once, after it. With
``compile_step=True`` the step is ``torch.compile(fullgraph=True, dynamic=False)`` (on CUDA
``mode="reduce-overhead"``: CUDA graphs; the caches are marked static addresses); what it buys on a
GPU is unmeasured.

Architectures: Llama-family decoders (``model_type`` llama or qwen2: RMSNorm, rotary positions
of the default type, grouped-query attention, optional q/k/v biases, SwiGLU MLP, tied or untied
LM head); anything else is refused with one line (:func:`check_architecture`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llm.rollout import completion_masks, rollout_batch, stack_left_padded
from llm.streams import derive_seed

ARCHITECTURES = ("llama", "qwen2")
#: prompts are left-padded to a multiple of this many tokens (one compiled shape per bucket)
BUCKET = 16
M32 = 0xFFFFFFFF
#: the token counter's offset, 0x9E3779B9 - 2^32: the same words after ``& M32`` as 0x9E3779B9,
#: in int32's range (inductor adds it to an int32 index in Triton, which refused 0x9E3779B9 as an
#: int32 literal on an H200, torch 2.11, 2026-11-26)
TOKEN_OFFSET = 0x9E3779B9 - 2**32


# --------------------------------------------------------------------------------------------------
# Noise fixed per (key, row, position, token)
# --------------------------------------------------------------------------------------------------


def mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (Wellons' ``lowbias32``: xorshift-multiply rounds), applied
    elementwise to an int64 tensor of values in [0, 2^32). The multipliers are < 2^31, so no
    product leaves int64 (no overflow on any device)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & M32
    return x ^ (x >> 15)


def key_words(seed_keys: Sequence[int]) -> tuple[int, int]:
    """The two 32-bit words of ``derive_seed(*seed_keys)`` (a stream's 63-bit seed)."""
    seed = derive_seed(*seed_keys)
    return seed & M32, seed >> 32


def counter_uniform(keys: Tensor, rows: Tensor, position: Tensor, vocab: int) -> Tensor:
    """Uniforms in (0, 1) ``[K, B, V]``, a function of (``keys[k]`` ``[K, 2]`` int64 words,
    ``rows[k, b]`` ``[K, B]`` int64, ``position`` 0-d int64, token) only: 24 bits of a hash,
    ``(bits + 1/2) / 2^24`` (never 0 or 1). Stateless, so any batch of rows, on any device,
    draws the same numbers for the same (key, row, position, token)."""
    base = mix32(keys[:, 0, None] ^ mix32(keys[:, 1, None] ^ mix32(rows & M32)))
    base = mix32(base ^ mix32(position & M32))
    tokens = mix32(torch.arange(vocab, device=rows.device) + TOKEN_OFFSET & M32)
    bits = mix32(mix32(base[..., None] ^ tokens))
    return ((bits >> 8).float() + 0.5) * 2.0**-24


def gumbel_sample(logits: Tensor, u: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """``(token, logp)``: the Gumbel-max draw ``argmax(logits / T - log(-log u))`` (a draw from
    ``softmax(logits / T)``) and its log-probability under that softmax (float32)."""
    logp = torch.log_softmax(logits.float() / temperature, -1)
    token = (logp - torch.log(-torch.log(u))).argmax(-1)
    return token, logp.gather(-1, token[..., None])[..., 0]


# --------------------------------------------------------------------------------------------------
# The members' weights, stacked
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What the compact forward needs to know of the architecture."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    vocab: int


def check_architecture(model: torch.nn.Module) -> Shape:
    """The :class:`Shape` of a Llama-family causal LM, or a one-line ``ValueError`` saying what
    the compact decoder does not support."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in ARCHITECTURES:
        raise ValueError(
            f"--rollout-backend compact decodes {', '.join(ARCHITECTURES)} models, not {kind!r}"
        )
    rope = getattr(config, "rope_parameters", None) or {
        "rope_type": (getattr(config, "rope_scaling", None) or {}).get("rope_type", "default"),
        "rope_theta": getattr(config, "rope_theta", 10000.0),
    }
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"--rollout-backend compact: rope type {rope['rope_type']!r} unsupported")
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        raise ValueError("--rollout-backend compact needs a SwiGLU MLP without biases")
    if kind == "qwen2" and getattr(config, "use_sliding_window", False):
        raise ValueError("--rollout-backend compact does not support sliding-window attention")
    heads = config.num_attention_heads
    return Shape(
        layers=config.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        eps=float(config.rms_norm_eps),
        theta=float(rope["rope_theta"]),
        vocab=model.get_output_embeddings().out_features,
    )


@dataclass
class Stacked:
    """K members' weights on a leading dimension, laid out for ``torch.bmm`` (``[K, in, out]``;
    q/k/v fused into one matrix, gate/up into another)."""

    shape: Shape
    embed: Tensor  # [K, V, H]
    layers: list[dict[str, Tensor]]
    norm: Tensor  # [K, H]
    head: Tensor  # [K, H, V]

    def __len__(self) -> int:
        return self.embed.shape[0]


@torch.no_grad()
def stack_members(models: Sequence[torch.nn.Module]) -> Stacked:
    """A copy of the members' weights (detached), stacked (:class:`Stacked`); ``ValueError``
    unless they share one supported architecture."""
    from llm.logprobs import unwrap_model

    bases = [unwrap_model(m) for m in models]
    shapes = {check_architecture(b) for b in bases}
    if len(shapes) != 1:
        raise ValueError("the compact decoder needs members of one architecture")

    def stack(get: Any) -> Tensor:
        return torch.stack([get(b).detach() for b in bases])

    layers = []
    for i in range(bases[0].config.num_hidden_layers):

        def layer(b: Any, i: int = i) -> Any:
            return b.base_model.layers[i]

        attn = layer(bases[0]).self_attn
        entry = {
            "in_norm": stack(lambda b: layer(b).input_layernorm.weight),
            "qkv": stack(lambda b: qkv_weight(layer(b).self_attn).T),
            "o": stack(lambda b: layer(b).self_attn.o_proj.weight.T),
            "post_norm": stack(lambda b: layer(b).post_attention_layernorm.weight),
            "gate_up": stack(
                lambda b: torch.cat([layer(b).mlp.gate_proj.weight, layer(b).mlp.up_proj.weight]).T
            ),
            "down": stack(lambda b: layer(b).mlp.down_proj.weight.T),
        }
        if attn.q_proj.bias is not None:
            entry["qkv_bias"] = stack(lambda b: qkv_bias(layer(b).self_attn))
        layers.append(entry)
    return Stacked(
        shape=shapes.pop(),
        embed=stack(lambda b: b.get_input_embeddings().weight),
        layers=layers,
        norm=stack(lambda b: b.base_model.norm.weight),
        head=stack(lambda b: b.get_output_embeddings().weight.T),
    )


def qkv_weight(attn: torch.nn.Module) -> Tensor:
    return torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])


def qkv_bias(attn: torch.nn.Module) -> Tensor:
    return torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])


# --------------------------------------------------------------------------------------------------
# The compact forward: [K, B, T] tokens -> [K, B, V] logits of the last position
# --------------------------------------------------------------------------------------------------


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Llama's RMSNorm (in float32, scaled by ``weight [K, H]`` in the input's dtype)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight[:, None, None] * h.to(x.dtype)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x [K, B, T, in] @ weight [K, in, out] (+ bias [K, out])``: one batched matmul."""
    K, B, T, _ = x.shape
    flat = x.reshape(K, B * T, -1)
    y = torch.bmm(flat, weight) if bias is None else torch.baddbmm(bias[:, None], flat, weight)
    return y.view(K, B, T, -1)


def rotary(positions: Tensor, shape: Shape, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` ``[K, B, 1, T, D]`` of the default rotary embedding at ``positions``."""
    D = shape.head_dim
    device = positions.device
    inv_freq = 1.0 / (shape.theta ** (torch.arange(0, D, 2, device=device).float() / D))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], -1)[:, :, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def forward(
    w: Stacked,
    ids: Tensor,
    positions: Tensor,
    mask: Tensor,
    caches: Sequence[tuple[Tensor, Tensor]],
    slots: Tensor,
) -> Tensor:
    """Logits ``[K, B, V]`` (float32) of the last of ``ids [K, B, T]`` at ``positions``; writes
    their keys and values into the ``caches`` (per layer ``[K, B, kv_heads, S, D]``) at
    ``slots [T]`` and attends over every slot where ``mask [K, B, T, S]`` (bool) holds."""
    s = w.shape
    K, B, T = ids.shape
    dtype = caches[0][0].dtype
    x = torch.gather(w.embed, 1, ids.reshape(K, -1, 1).expand(-1, -1, w.embed.shape[-1]))
    x = x.view(K, B, T, -1).to(dtype)
    cos, sin = rotary(positions, s, dtype)
    attn_mask = mask.reshape(K * B, 1, T, -1)
    nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for layer, (cache_k, cache_v) in zip(w.layers, caches, strict=True):
        h = rms_norm(x, layer["in_norm"], s.eps)
        qkv = linear(h, layer["qkv"], layer.get("qkv_bias")).to(dtype)
        q, k, v = qkv.split([nq, nkv, nkv], -1)
        q = rotate(q.view(K, B, T, s.heads, -1).transpose(2, 3), cos, sin)
        k = rotate(k.view(K, B, T, s.kv_heads, -1).transpose(2, 3), cos, sin)
        cache_k.index_copy_(3, slots, k.to(dtype))
        cache_v.index_copy_(3, slots, v.view(K, B, T, s.kv_heads, -1).transpose(2, 3).to(dtype))
        out = torch.nn.functional.scaled_dot_product_attention(
            q.reshape(K * B, s.heads, T, -1),
            cache_k.view(K * B, s.kv_heads, -1, s.head_dim),
            cache_v.view(K * B, s.kv_heads, -1, s.head_dim),
            attn_mask=attn_mask,
            scale=s.head_dim**-0.5,
            enable_gqa=s.kv_heads != s.heads,
        )
        out = out.view(K, B, s.heads, T, -1).transpose(2, 3).reshape(K, B, T, -1)
        x = x + linear(out, layer["o"]).to(dtype)
        h = rms_norm(x, layer["post_norm"], s.eps)
        gate, up = linear(h, layer["gate_up"]).chunk(2, -1)
        x = x + linear(torch.nn.functional.silu(gate) * up, layer["down"]).to(dtype)
    last = rms_norm(x[:, :, -1:], w.norm, s.eps)
    return linear(last, w.head)[:, :, 0].float()


# --------------------------------------------------------------------------------------------------
# The decoding loop
# --------------------------------------------------------------------------------------------------


def bucket(length: int, limit: int | None = None) -> int:
    """The padded prompt width: ``length`` rounded up to a multiple of :data:`BUCKET` (at most
    ``limit``, the context left for the prompt, when given and >= ``length``)."""
    width = -(-max(length, 1) // BUCKET) * BUCKET
    return min(width, limit) if limit is not None and limit >= length else width


@dataclass
class DecodeState:
    """The loop's tensors, fixed in shape and address (what a CUDA graph replays over)."""

    caches: list[tuple[Tensor, Tensor]]
    prompt_keys: Tensor  # [K, B, Tp] bool: the prompt slots a query may attend to
    last_position: Tensor  # [K, B] position of the last prompt token
    keys: Tensor  # [K, 2] noise key words
    rows: Tensor  # [K, B] global row indices
    done: Tensor  # [K, B] bool: EOS emitted
    tokens: Tensor  # [K, B, N] the completions (pad after EOS)
    logp: Tensor  # [K, B, N] float32 (0 after EOS)


def decode_step(
    w: Stacked, st: DecodeState, token: Tensor, t: Tensor, temperature: float, eos: int, pad: int
) -> Tensor:
    """Step ``t`` (0-d long tensor, >= 1): feed token ``t - 1`` at slot ``Tp + t - 1``, sample
    token ``t`` into ``st.tokens`` and ``st.logp``; returns it ``[K, B]``."""
    Tp, S = st.prompt_keys.shape[-1], st.caches[0][0].shape[3]
    slot = (Tp + t - 1).reshape(1)
    completion = torch.arange(S - Tp, device=t.device) < t  # slots Tp .. slot written
    keys = torch.cat([st.prompt_keys, completion.expand(*st.prompt_keys.shape[:2], -1)], -1)
    positions = (st.last_position + t)[..., None]
    logits = forward(w, token[..., None], positions, keys[:, :, None], st.caches, slot)
    return sample_into(st, logits, t, temperature, eos, pad)


def sample_into(
    st: DecodeState, logits: Tensor, t: Tensor, temperature: float, eos: int, pad: int
) -> Tensor:
    """Sample token ``t`` from ``logits [K, B, V]`` with the fixed noise, masked after EOS."""
    u = counter_uniform(st.keys, st.rows, t, logits.shape[-1])
    token, logp = gumbel_sample(logits, u, temperature)
    token = torch.where(st.done, pad, token)
    st.logp.index_copy_(2, t.reshape(1), torch.where(st.done, 0.0, logp)[..., None])
    st.tokens.index_copy_(2, t.reshape(1), token[..., None])
    st.done |= token == eos
    return token


def prefill(
    w: Stacked, prompt: Tensor, valid: Tensor, max_new_tokens: int, group_size: int
) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """The KV caches ``[K, P x G, kv_heads, Tp + N, D]`` (per layer; slots ``Tp ..`` zero) and
    the last position's logits ``[K, P x G, V]`` of the left-padded prompts ``[K, P, Tp]``, each
    prompt's forward run once and repeated over its ``G = group_size`` rows (``repeat_interleave``
    on the row dimension: row ``p * G + g`` is prompt ``p``'s). The forward of a prompt does not
    depend on the other rows of its batch, so this is what a forward of every row computes."""
    s, device = w.shape, prompt.device
    K, P, Tp = prompt.shape
    dtype = compute_dtype(w, device)
    caches = [
        tuple(
            torch.zeros(
                K, P, s.kv_heads, Tp + max_new_tokens, s.head_dim, dtype=dtype, device=device
            )
            for _ in "kv"
        )
        for _ in range(s.layers)
    ]
    # causal over the prompt, padding keys masked (a padding query sees itself only)
    causal = torch.ones(Tp, Tp, dtype=torch.bool, device=device).tril()
    own = torch.eye(Tp, dtype=torch.bool, device=device)
    mask = (causal & valid[:, :, None, :]) | own
    mask = torch.nn.functional.pad(mask, (0, max_new_tokens))
    positions = (valid.cumsum(-1) - 1).clamp(min=0)
    logits = forward(w, prompt, positions, mask, caches, torch.arange(Tp, device=device))
    if group_size == 1:
        return caches, logits
    caches = [tuple(c.repeat_interleave(group_size, 1) for c in pair) for pair in caches]
    return caches, logits.repeat_interleave(group_size, 1)


@torch.no_grad()
def decode(
    w: Stacked,
    prompt: Tensor,
    prompt_mask: Tensor,
    *,
    keys: Tensor,
    rows: Tensor,
    max_new_tokens: int,
    temperature: float,
    eos_id: int,
    pad_id: int,
    group_size: int = 1,
    compile_step: bool | str = False,
) -> tuple[Tensor, Tensor]:
    """Completions ``[K, B, N]`` (pad after the first EOS) and their log-probs (float32, 0 after
    EOS), ``G = group_size`` per left-padded prompt ``[K, P, Tp]``, prompt-major: row ``b = p * G
    + g`` is prompt ``p``'s ``g``-th completion (``B = P x G``, the layout of
    :func:`llm.rollout.generate`, of the rewards and of the group advantages); each prompt's
    prefill runs once for its group (:func:`prefill`). ``N = max_new_tokens`` steps, noise keyed
    by ``keys [K, 2]`` and ``rows [K, B]`` (:func:`counter_uniform`). No host read.
    ``compile_step``: compile the step (:func:`compiled_step`; a string: that backend)."""
    K, P = prompt.shape[:2]
    G, N, device = group_size, max_new_tokens, prompt.device
    if G < 1:
        raise ValueError(f"group_size must be >= 1, got {G}")
    if tuple(rows.shape) != (K, P * G):
        raise ValueError(
            f"rows has shape {tuple(rows.shape)}; {P} prompts x group_size {G} for {K} members "
            f"need [{K}, {P * G}] (row p x G + g is prompt p's completion g)"
        )
    valid = prompt_mask.bool()
    caches, logits = prefill(w, prompt, valid, N, G)
    valid = valid.repeat_interleave(G, 1)
    B = P * G
    st = DecodeState(
        caches=caches,
        prompt_keys=valid,
        last_position=valid.sum(-1) - 1,
        keys=keys.to(device),
        rows=rows.to(device),
        done=torch.zeros(K, B, dtype=torch.bool, device=device),
        tokens=torch.full((K, B, N), pad_id, dtype=torch.long, device=device),
        logp=torch.zeros(K, B, N, device=device),
    )
    steps = torch.arange(N, device=device)
    token = sample_into(st, logits, steps[0], temperature, eos_id, pad_id)
    step = compiled_step(device, caches, compile_step) if compile_step else decode_step
    for t in range(1, N):
        token = step(w, st, token, steps[t], temperature, eos_id, pad_id)
    return st.tokens, st.logp


def compute_dtype(w: Stacked, device: torch.device) -> torch.dtype:
    """The activations' dtype: autocast's where it is on (bf16 on a GPU run), else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return w.embed.dtype


def compiled_step(
    device: torch.device, caches: Sequence[tuple[Tensor, Tensor]], backend: bool | str = True
) -> Any:
    """:func:`decode_step` compiled with fixed shapes, whole (``fullgraph``): inductor, with
    CUDA graphs on CUDA (the caches are static addresses, mutated in place); a string names
    another ``torch.compile`` backend (the CPU tests trace with ``"aot_eager"``)."""
    for pair in caches:
        for cache in pair:
            torch._dynamo.mark_static_address(cache)
    if isinstance(backend, str):
        return torch.compile(decode_step, fullgraph=True, dynamic=False, backend=backend)
    mode = "reduce-overhead" if device.type == "cuda" else None
    return torch.compile(decode_step, fullgraph=True, dynamic=False, mode=mode)


# --------------------------------------------------------------------------------------------------
# Rollouts of K runs
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def generate(
    models: Sequence[torch.nn.Module] | Stacked,
    tokenizer: Any,
    prompt_ids: Sequence[list[list[int]]],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    seed_keys: Sequence[tuple[int, ...]],
    first_index: Sequence[int],
    device: torch.device,
    return_logp: bool = False,
    compile_step: bool | str = False,
    max_prompt: int | None = None,
) -> list[dict[str, Tensor]]:
    """Member k's rollout of its prompts ``prompt_ids[k]`` (G completions each, row ``i * G +
    g``), as :func:`llm.rollout.generate` returns one (:func:`llm.rollout.rollout_batch`, on the
    CPU: prompts left-padded to the member's longest, completions cut after EOS and to its
    longest), all members decoded in one loop (:func:`decode`; each prompt prefilled once for its
    G rows). Row ``i * G + g`` draws its noise from ``derive_seed(*seed_keys[k])`` and global row
    ``(first_index[k] + i) * G + g``, so a member's completions do not depend on the others.
    ``max_prompt``: the widest bucket."""
    K = len(prompt_ids)
    if not (len(seed_keys) == len(first_index) == K) or K < 1:
        raise ValueError("prompt_ids, seed_keys and first_index need one entry per member")
    if len({len(p) for p in prompt_ids}) != 1:
        raise ValueError("the compact decoder needs the same number of prompts for every member")
    w = models if isinstance(models, Stacked) else stack_members(models)
    if len(w) != K:
        raise ValueError(f"{len(w)} models for {K} members' prompts")
    G, pad = group_size, tokenizer.pad_token_id
    widths = [max((len(r) for r in p), default=1) for p in prompt_ids]
    Tp = bucket(max(widths), max_prompt)
    packed = [stack_left_padded(p, pad, Tp) for p in prompt_ids]  # one row per prompt
    rows = torch.stack(
        [
            torch.arange(first * G, (first + len(p)) * G)
            for p, first in zip(prompt_ids, first_index, strict=True)
        ]
    )
    tokens, logp = decode(
        w,
        torch.stack([ids for ids, _ in packed]).to(device),
        torch.stack([m for _, m in packed]).to(device),
        keys=torch.tensor([key_words(k) for k in seed_keys]),
        rows=rows,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_id=tokenizer.eos_token_id,
        pad_id=pad,
        group_size=G,
        compile_step=compile_step,
    )
    tokens, logp = tokens.cpu(), logp.cpu()  # the one host read, after the loop
    out = []
    for k, (ids, mask) in enumerate(packed):
        ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
        Tc = max(int(completion_masks(tokens[k], tokenizer.eos_token_id)[0].sum(-1).max()), 1)
        out.append(
            rollout_batch(
                ids[:, Tp - widths[k] :],
                mask[:, Tp - widths[k] :],
                tokens[k, :, :Tc],
                tokenizer,
                logp[k, :, :Tc] if return_logp else None,
            )
        )
    return out
