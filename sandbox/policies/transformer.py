"""A tiny causal transformer in pure torch, with an ensemble dimension for independent seeds.

``TinyTransformer(vocab_size, num_models=S)`` holds S independent GPT-style models whose weights
carry a leading model dimension ``[S, ...]``; one batched pass evaluates all of them on inputs
``[S, B, T]`` (``bmm`` over the model dimension), so S seeds train in one process without a Python
loop over seeds. Seeds stay independent: no parameter is shared, Adam acts elementwise and
:func:`clip_grad_norm_per_model` clips each model's gradient by its own norm.

Prompts are left-padded (``mask`` is 1 on real tokens); positions count real tokens only, so a
prompt gets the same positions whatever its padding. :meth:`TinyTransformer.generate` samples
with a KV cache; :meth:`TinyTransformer.completion_logp` scores completions in one full pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sandbox.streams import gumbel_max


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of the model (the defaults are a ~100k-parameter model per seed)."""

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_len: int = 64
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )


class TinyTransformer(nn.Module):
    """S independent pre-LayerNorm causal transformers evaluated together.

    Args:
        config: the shape of each model.
        num_models: S, the ensemble (seed) dimension.
        seed: initial weights come from ``torch.Generator().manual_seed(seed)``; model s of a
            run with S models gets a different draw from model s of another S.
        dtype: of the parameters, drawn in it (float64 weights are float64 draws, not float32
            draws cast: CPUs' vectorised float32 normal samplers differ in the last bit).
    """

    def __init__(
        self,
        config: TransformerConfig,
        num_models: int = 1,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if isinstance(num_models, bool) or not isinstance(num_models, int) or num_models < 1:
            raise ValueError(f"num_models must be a positive integer, got {num_models!r}")
        self.config, self.num_models = config, num_models
        S, D, V, L = num_models, config.d_model, config.vocab_size, config.max_len
        H = config.mlp_ratio * D
        g = torch.Generator().manual_seed(seed)

        def normal(*shape: int, std: float = 0.02) -> nn.Parameter:
            return nn.Parameter(torch.randn(S, *shape, generator=g, dtype=dtype) * std)

        def ones(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.ones(S, *shape, dtype=dtype))

        def zeros(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(S, *shape, dtype=dtype))

        proj_std = 0.02 / math.sqrt(2 * config.n_layers)  # GPT-2's scaled residual init
        self.tok_emb = normal(V, D)
        self.pos_emb = normal(L, D)
        self.layers = nn.ModuleList()
        for _ in range(config.n_layers):
            layer = nn.ParameterDict(
                {
                    "ln1_w": ones(D),
                    "ln1_b": zeros(D),
                    "qkv": normal(D, 3 * D),
                    "proj": normal(D, D, std=proj_std),
                    "ln2_w": ones(D),
                    "ln2_b": zeros(D),
                    "fc": normal(D, H),
                    "fc_b": zeros(H),
                    "out": normal(H, D, std=proj_std),
                    "out_b": zeros(D),
                }
            )
            self.layers.append(layer)
        self.lnf_w, self.lnf_b = ones(D), zeros(D)
        self.head = normal(D, V)

    # -- building blocks ------------------------------------------------------------------------
    @staticmethod
    def _ln(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        x = F.layer_norm(x, x.shape[-1:])
        return x * w[:, None, None, :] + b[:, None, None, :]

    @staticmethod
    def _linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        S, B, T, D = x.shape
        y = torch.bmm(x.reshape(S, B * T, D), w).view(S, B, T, -1)
        return y if b is None else y + b[:, None, None, :]

    def _embed(self, ids: Tensor, positions: Tensor) -> Tensor:
        # Gather per model without a Python loop: index the flattened [S * V, D] table.
        S, V, L = self.num_models, self.config.vocab_size, self.config.max_len
        offsets = torch.arange(S, device=ids.device)[:, None, None] * V
        tok = self.tok_emb.reshape(S * V, -1)[ids + offsets]
        offsets = offsets // V * L
        pos = self.pos_emb.reshape(S * L, -1)[positions + offsets]
        return tok + pos

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])

    def _heads(self, x: Tensor) -> Tensor:
        S, B, T, D = x.shape
        h = self.config.n_heads
        return x.reshape(S * B, T, h, D // h).transpose(1, 2)

    # -- forward ---------------------------------------------------------------------------------
    def forward(
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        cache: list[tuple[Tensor, Tensor]] | None = None,
        key_mask: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Logits ``[S, B, T, V]`` and the per-layer key/value cache.

        Args:
            ids: ``[S, B, T]`` token ids.
            mask: ``[S, B, T]`` bool, True on real tokens (default all).
            cache: keys/values of earlier tokens (from a previous call), or None.
            key_mask: ``[S, B, T_cache + T]`` bool, which keys are real (default from ``mask``).
            positions: ``[S, B, T]`` position ids (default: running count of real tokens).
        """
        S, B, T = ids.shape
        if self.num_models != S:
            raise ValueError(f"ids must have {self.num_models} models in dim 0, got {S}")
        if mask is None:
            mask = torch.ones_like(ids, dtype=torch.bool)
        if positions is None:
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        if positions.max() >= self.config.max_len:
            raise ValueError(
                f"sequence longer than max_len={self.config.max_len} (position {positions.max()})"
            )
        past = 0 if cache is None else cache[0][0].shape[2]
        if key_mask is None:
            key_mask = mask if cache is None else None
        if key_mask is None:
            raise ValueError("key_mask is required with a cache")
        # allowed[b, i, j]: query i may attend key j: causal, key real; pads attend themselves
        q_idx = torch.arange(past, past + T, device=ids.device)[:, None]
        k_idx = torch.arange(past + T, device=ids.device)[None, :]
        causal = k_idx <= q_idx
        allowed = causal & key_mask.reshape(S * B, 1, past + T)
        allowed = allowed | (k_idx == q_idx)  # never an empty row (padded queries)

        x = self._embed(ids, positions)
        new_cache = []
        for i, layer in enumerate(self.layers):
            h = self._ln(x, layer["ln1_w"], layer["ln1_b"])
            q, k, v = self._linear(h, layer["qkv"]).chunk(3, dim=-1)
            q, k, v = self._heads(q), self._heads(k), self._heads(v)
            if cache is not None:
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            new_cache.append((k, v))
            a = self._attend(q, k, v, allowed)  # [S*B, h, T, hd]
            a = a.transpose(1, 2).reshape(S, B, T, -1)
            x = x + self._linear(a, layer["proj"])
            h = self._ln(x, layer["ln2_w"], layer["ln2_b"])
            x = x + self._linear(
                F.gelu(self._linear(h, layer["fc"], layer["fc_b"])), layer["out"], layer["out_b"]
            )
        x = self._ln(x, self.lnf_w, self.lnf_b)
        return self._linear(x, self.head), new_cache

    # -- scoring and sampling ---------------------------------------------------------------------
    @staticmethod
    def _restrict(logits: Tensor, allowed: Tensor | None) -> Tensor:
        """The policy is the softmax over the ``allowed`` tokens only (e.g. a task's answer
        characters and EOS); the others get probability 0."""
        return logits if allowed is None else logits.masked_fill(~allowed, -math.inf)

    def completion_logits(
        self, prompt: Tensor, prompt_mask: Tensor, completion: Tensor, completion_mask: Tensor
    ) -> Tensor:
        """Next-token logits ``[S, B, Tc, V]`` (at least float32, unrestricted) at every completion
        position: entry ``t`` is the output at the position before completion token ``t`` (the
        prefix prompt + completion[:t]), from one full pass over prompt + completion. The
        log-prob path (:meth:`completion_logp`) scores these logits."""
        ids = torch.cat([prompt, completion], dim=-1)
        mask = torch.cat([prompt_mask, completion_mask], dim=-1)
        logits, _ = self(ids, mask)
        Tp = prompt.shape[-1]
        logits = logits[:, :, Tp - 1 : -1]  # the position before each completion token
        return logits.to(torch.promote_types(logits.dtype, torch.float32))  # >= fp32 scores

    def completion_logp(
        self,
        prompt: Tensor,
        prompt_mask: Tensor,
        completion: Tensor,
        completion_mask: Tensor,
        allowed: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Log-probs ``[S, B, Tc]`` of the completion tokens (0 where ``completion_mask`` is 0) and
        the entropies ``[S, B, Tc]`` of the next-token distributions, in one full pass.
        ``allowed`` (bool ``[V]``) restricts the policy to those tokens."""
        logits = self.completion_logits(prompt, prompt_mask, completion, completion_mask)
        logp_all = torch.log_softmax(self._restrict(logits, allowed), -1)
        # padding may hold ids outside `allowed` (log-prob -inf): score a finite id there instead
        safe = torch.where(completion_mask, completion, logp_all.detach().argmax(-1))
        logp = logp_all.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        p_all = logp_all.exp()
        entropy = -(p_all * torch.where(p_all > 0, logp_all, 0.0)).sum(-1)
        zero = logp.new_zeros(())
        return torch.where(completion_mask, logp, zero), torch.where(completion_mask, entropy, zero)

    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        eos_id: int,
        pad_id: int,
        generator: torch.Generator,
        temperature: float = 1.0,
        allowed: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Sample completions with a KV cache, by the exponential race from fixed noise.

        ``generator`` draws one uniform per (model, row, position, token) up front, ``[S, B,
        max_new_tokens, V]`` whatever the policy, and position t's token wins the race of the
        next-token distribution on the row's uniforms at t (Gumbel-max,
        :func:`sandbox.streams.gumbel_max`): two models given one generator state draw the same
        completions where their distributions agree (common random numbers), and a sequence's
        tokens never depend on how long the other rows run.

        Returns ``(completion [S, B, Tc], completion_mask [S, B, Tc])``: the mask is 1 up to and
        including the first EOS; after it the ids are ``pad_id``. ``Tc <= max_new_tokens`` (the
        loop stops once every sequence has ended; it checks every 8 tokens to limit host syncs).
        ``allowed`` (bool ``[V]``) restricts sampling to those tokens, as in
        :meth:`completion_logp`.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        S, B = prompt.shape[:2]
        longest = int(prompt_mask.sum(-1).max())
        if longest + max_new_tokens > self.config.max_len:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"model's max_len={self.config.max_len}"
            )
        logits, cache = self(prompt, prompt_mask)
        dtype = torch.promote_types(logits.dtype, torch.float32)  # >= fp32, as the scores
        V = self.config.vocab_size
        noise = torch.rand(
            (S, B, max_new_tokens, V), generator=generator, device=prompt.device, dtype=dtype
        )
        key_mask = prompt_mask
        position = prompt_mask.long().sum(-1, keepdim=True)  # next position per sequence
        done = torch.zeros(S, B, dtype=torch.bool, device=prompt.device)
        tokens, masks = [], []
        next_logits = logits[:, :, -1]
        for t in range(max_new_tokens):
            scaled = self._restrict(next_logits.to(dtype) / temperature, allowed)
            probs = torch.softmax(scaled, -1)  # [S, B, V]
            tok = gumbel_max(probs, noise[:, :, t, None])[..., 0]
            alive = ~done
            tok = torch.where(alive, tok, pad_id)
            tokens.append(tok)
            masks.append(alive)
            done = done | (tok == eos_id)
            if t + 1 == max_new_tokens or ((t + 1) % 8 == 0 and bool(done.all())):
                break
            key_mask = torch.cat([key_mask, alive[..., None]], dim=-1)
            logits, cache = self(
                tok[..., None],
                alive[..., None],
                cache=cache,
                key_mask=key_mask,
                positions=position,
            )
            position = position + alive[..., None].long()
            next_logits = logits[:, :, -1]
        return torch.stack(tokens, -1), torch.stack(masks, -1)


def clip_grad_norm_per_model(model: TinyTransformer, max_norm: float) -> Tensor:
    """Clip each model's gradient (its slice of every parameter) to ``max_norm``; returns ``[S]``
    norms before clipping. Seeds stay independent, unlike ``torch.nn.utils.clip_grad_norm_``."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    S = model.num_models
    norms = torch.cat([g.reshape(S, -1) for g in grads], dim=1).norm(dim=1)  # [S]
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, [scale.view(S, *([1] * (g.dim() - 1))) for g in grads])
    return norms
