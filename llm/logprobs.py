"""Per-token log-probs (and entropy) of completions without materialising the ``[B, T, V]`` logits.

For a completion token ``y_t`` after hidden state ``h_t`` (the last layer's output at the position
before it), with LM head ``W`` ``[V, H]`` (and bias ``b``) and temperature ``tau``::

    z_t = (W h_t + b) / tau                      # [V], float32
    logp_t = z_t[y_t] - logsumexp(z_t)
    entropy_t = logsumexp(z_t) - sum_j softmax(z_t)_j z_tj

The head is applied to ``chunk_size`` token rows at a time inside :class:`ChunkedLogProb`, a custom
``torch.autograd.Function`` that saves only ``h``, ``W``, ``b``, the targets and per-token
statistics, and recomputes each chunk's logits in the backward:

    d logp_t / d z_tj    = 1[j = y_t] - p_tj
    d entropy_t / d z_tj = -p_tj (log p_tj + entropy_t)
    d/dW = sum_t (dz_t / tau) h_t^T,   d/dh_t = W^T dz_t / tau,   d/db = sum_t dz_t / tau

so at most one ``[chunk_size, V]`` block of logits (and two temporaries of that size) exists at a
time, in the forward and in the backward. This is the technique of Liger-Kernel's fused linear
losses and Apple's Cut Cross-Entropy (arXiv:2411.09009), in plain torch; TRL 1.16 does the same with
``trl.trainer.utils.add_fused_lm_head`` (tiles of 4096 tokens x 32768 vocabulary columns).

With a leading member dimension (K heads at once, an ensemble's members: :mod:`llm.ensemble`)
the same loop runs on ``[K, chunk_size, V]`` blocks, one batched matmul over the members per
chunk, so the head's operators do not grow with K.

The model's forward still runs through the caller's module (DDP sets up its gradient reducer in its
forward; FSDP2 unshards the root's parameters, including a tied head/embedding, only inside the
root's forward): :func:`completion_logp` swaps the model's output-embedding module for a
:class:`LogProbHead` that holds the targets and returns ``[B, Tc, 2]`` (log-prob, entropy) in
place of the logits, and restores the original head in a ``finally``.

Models that transform the logits after the head (Gemma-2's ``final_logit_softcapping``,
Cohere's ``logit_scale``, Granite's ``logits_scaling``, ...) are refused with a ``ValueError``: the
model would apply that transform to the log-probs. A head that is not a plain
``torch.nn.Linear`` (a LoRA- or quantisation-wrapped head) is refused too, since its ``weight`` is
not the map it computes.

``head="trl"`` (``--lm-head trl``) computes the same statistics with TRL 1.16's fused kernel,
``trl.kernels.ChunkedLogProbFunction``: ``[4096, 32768]`` tiles of logits folded into online
log-sum-exp statistics by a Triton kernel on CUDA (torch ops elsewhere, which is how CI checks it
against the chunked path on CPU), the backward recomputing each tile. ``chunk_size`` is then its
vocabulary width (default :data:`TRL_VOCAB_CHUNK`, TRL's own); its statistics are float32 whatever
the model's dtype.

Under CUDA autocast the head's matmul runs in the autocast dtype (bf16), like the full path, and
everything after it in float32; the weight gradient is accumulated in float32 across chunks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

# Logits per chunk (elements of one [chunk_size, V] block): 2**25 is 128 MiB in float32, ~220 token
# rows for Qwen's 151,936-token vocabulary, ~1,000 for Llama-2's 32,000. Small enough that the chunk
# is a minor part of activation memory, large enough that each chunk is one big GEMM (on a GPU a
# [220, 896] x [896, 151936] matmul is compute-bound) and the per-chunk Python overhead is noise.
CHUNK_ELEMENTS = 2**25

# Config fields of models whose forward transforms the logits after the head (TRL 1.16's list).
POST_HEAD_FIELDS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)

ENTROPY_MODES = (None, "metric", "grad")
HEADS = ("chunked", "trl")
TRL_VOCAB_CHUNK = 32768  # vocabulary columns per tile of trl.kernels.ChunkedLogProbFunction
# torch.addmm(..., out_dtype=torch.float32) from bf16/fp16 inputs: CUDA, torch >= 2.8 (TRL's check)
MM_OUT_DTYPE = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 8)


def default_chunk_size(vocab_size: int) -> int:
    """Token rows per chunk: ``CHUNK_ELEMENTS // vocab_size`` (at least 1)."""
    return max(1, CHUNK_ELEMENTS // vocab_size)


def _addmm_fp32(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """``acc += a @ b`` into a float32 ``acc`` (``[K, ...]``: one product per member) without
    rounding each chunk's product to bf16 (on CUDA with bf16/fp16 inputs the matmul writes float32
    directly; elsewhere the inputs are cast to ``acc``'s dtype)."""
    mm = torch.baddbmm if acc.dim() == 3 else torch.addmm
    if MM_OUT_DTYPE and acc.device.type == "cuda" and a.dtype in (torch.bfloat16, torch.float16):
        mm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        (acc.baddbmm_ if acc.dim() == 3 else acc.addmm_)(a.to(acc.dtype), b.to(acc.dtype))


class ChunkedLogProb(torch.autograd.Function):
    """``(logp [N], entropy [N] or None)`` of ``targets`` under
    ``softmax((hidden @ W.T + b) / tau)``, ``chunk_size`` rows at a time; the backward recomputes
    each chunk's logits (see the module docstring for the gradients). ``hidden`` ``[N, H]``,
    ``weight`` ``[V, H]``, ``bias`` ``[V]`` or None, ``targets`` ``[N]`` int64. Statistics are
    float32 (float64 for float64 inputs).

    With a leading member dimension (K heads, e.g. an ensemble's: ``hidden`` ``[K, N, H]``,
    ``weight`` ``[K, V, H]``, ``bias`` ``[K, V]``, ``targets`` ``[K, N]``) member k's rows go
    through head k and the outputs are ``[K, N]``: the K heads' statistics, each as a call with
    member k's tensors alone computes it, with one batched matmul per chunk over the members;
    ``chunk_size`` rows of every member are a chunk (``[K, chunk_size, V]`` logits at a time)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        if not (hidden.dim() == weight.dim() == targets.dim() + 1 in (2, 3)):
            raise ValueError(
                f"hidden, weight, targets must be [N, H], [V, H], [N] or [K, N, H], [K, V, H], "
                f"[K, N]; got {list(hidden.shape)}, {list(weight.shape)}, {list(targets.shape)}"
            )
        ctx.set_materialize_grads(False)  # an unused entropy output gets no zero gradient
        device = hidden.device
        compute = (
            torch.get_autocast_dtype(device.type)
            if torch.is_autocast_enabled(device.type)
            else hidden.dtype
        )
        acc = torch.promote_types(compute, torch.float32)  # float32 (float64 for float64 models)
        w = weight.to(compute)  # one cast for all chunks (a no-op without autocast)
        b = None if bias is None else bias.to(compute)
        rows = targets.shape  # [N] or [K, N]
        logz = torch.empty(rows, device=device, dtype=acc)
        target_z = torch.empty(rows, device=device, dtype=acc)
        ent = torch.empty(rows, device=device, dtype=acc) if with_entropy else None
        for lo in range(0, rows[-1], chunk_size):
            sl = slice(lo, min(lo + chunk_size, rows[-1]))
            z = _chunk_logits(hidden[..., sl, :], w, b, compute, temperature)
            lz = torch.logsumexp(z, -1)
            logz[..., sl] = lz
            target_z[..., sl] = z.gather(-1, targets[..., sl, None])[..., 0]
            if ent is not None:  # entropy = logz - sum_j p_j z_j
                p = (z - lz[..., None]).exp_()
                ent[..., sl] = lz - p.mul_(z).sum(-1)
        logp = target_z - logz
        ctx.save_for_backward(hidden, weight, bias, targets, logz, ent)
        ctx.compute, ctx.temperature, ctx.chunk_size = compute, temperature, chunk_size
        return logp, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logp: Tensor | None, grad_ent: Tensor | None
    ) -> tuple:
        hidden, weight, bias, targets, logz, ent = ctx.saved_tensors
        if grad_logp is None and grad_ent is None:
            return (None,) * 7
        compute, temperature, chunk_size = ctx.compute, ctx.temperature, ctx.chunk_size
        w = weight.to(compute)
        b = None if bias is None else bias.to(compute)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        acc = logz.dtype
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=acc) if need_w else None
        grad_b = torch.zeros(weight.shape[:-1], device=weight.device, dtype=acc) if need_b else None
        N = targets.shape[-1]
        for lo in range(0, N, chunk_size):
            sl = slice(lo, min(lo + chunk_size, N))
            h = hidden[..., sl, :]
            logp = _chunk_logits(h, w, b, compute, temperature).sub_(logz[..., sl, None])
            p = logp.exp()
            # dz = -p * (g_logp + g_ent * (log p + entropy)) + g_logp * onehot(y), in place on logp
            if grad_ent is not None:
                dz = logp.add_(ent[..., sl, None]).mul_(grad_ent[..., sl, None])
                if grad_logp is not None:
                    dz.add_(grad_logp[..., sl, None])
                dz.mul_(p).neg_()
            else:
                dz = p.mul_(grad_logp[..., sl, None]).neg_()
            if grad_logp is not None:
                dz.scatter_add_(-1, targets[..., sl, None], grad_logp[..., sl, None])
            dz = dz.div_(temperature).to(compute)
            if grad_h is not None:
                grad_h[..., sl, :] = (dz @ w).to(hidden.dtype)
            if grad_w is not None:
                _addmm_fp32(grad_w, dz.mT, h.to(compute))
            if grad_b is not None:
                grad_b += dz.to(acc).sum(-2)
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def _chunk_logits(
    h: Tensor, w: Tensor, b: Tensor | None, compute: torch.dtype, tau: float
) -> Tensor:
    """``(h @ w.T + b) / tau`` in float32 (float64 for float64 inputs) for one chunk, the matmul
    in ``compute`` (``[n, V]``; ``[K, n, V]``, one batched matmul, for K members' heads)."""
    z = torch.matmul(h.to(compute), w.mT)
    if b is not None:
        z = z.add_(b.unsqueeze(-2))
    z = z.to(torch.promote_types(compute, torch.float32))
    return z.div_(tau) if tau != 1.0 else z


class LogProbHead(torch.nn.Module):
    """Stands in for the model's output embeddings during one forward: given the last hidden
    states ``[B, Tc + 1, H]`` (``logits_to_keep=Tc + 1``) it returns ``[B, Tc, 2]`` float32,
    the completion tokens' log-probs and the next-token entropies (0 where the mask is 0), from the
    real head's weight. The head is held outside the module tree (not a submodule).

    K members' heads at once (an ensemble's): ``head.weight`` ``[K, V, H]`` (``bias`` ``[K, V]``),
    ``targets`` and ``mask`` ``[K, B, Tc]``, hidden states ``[K, B, Tc + 1, H]``: the output is
    ``[K, B, Tc, 2]``, member k's rows scored by head k (:class:`ChunkedLogProb`'s member
    dimension), each member's kept tokens packed to the front of its rows so that only
    ``max_k`` (member k's kept tokens) rows per member are computed. The chunked kernel only."""

    def __init__(
        self,
        head: torch.nn.Linear,
        targets: Tensor,
        mask: Tensor,
        *,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
        kernel: str = "chunked",
    ) -> None:
        super().__init__()
        object.__setattr__(self, "head", head)
        self.kernel = kernel
        self.targets, self.mask = targets, mask
        self.temperature, self.chunk_size, self.with_entropy = temperature, chunk_size, with_entropy

    def forward(self, hidden: Tensor) -> Tensor:
        hidden = hidden[..., :-1, :]  # position t-1 predicts completion token t
        weight, bias = self.head.weight, self.head.bias
        if hasattr(weight, "full_tensor"):  # a head sharded on its own (DTensor): gather it
            weight = weight.full_tensor()
            bias = None if bias is None else bias.full_tensor()
        if weight.dim() == 3:
            return self._members(hidden, weight, bias)
        keep = self.mask.bool()
        if self.kernel == "trl":
            from trl.kernels import ChunkedLogProbFunction

            outputs = ("entropy",) if self.with_entropy else ()
            args = (self.temperature, self.chunk_size, None, 1.0, outputs)
            logp, ent = ChunkedLogProbFunction.apply(
                hidden[keep], weight, bias, self.targets[keep], *args
            )[:2]
        else:
            logp, ent = ChunkedLogProb.apply(
                hidden[keep],
                weight,
                bias,
                self.targets[keep],
                self.temperature,
                self.chunk_size,
                self.with_entropy,
            )
        stats = [logp] if ent is None else [logp, ent]
        # masked_scatter keeps the output attached to the graph even when no token is kept
        return torch.stack([x.new_zeros(keep.shape).masked_scatter(keep, x) for x in stats], -1)

    def _members(self, hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """``[K, B, Tc, 2]`` from K heads: each member's kept tokens packed to the front of its
        ``n = max_k kept_k`` rows (one host read, for ``n``; the rows past a member's own count
        are zeroed and their outputs dropped, so they add nothing to a gradient), one
        :class:`ChunkedLogProb` over the member dimension, scattered back."""
        if self.kernel != "chunked":
            raise ValueError(f"kernel {self.kernel!r} has no batched form over K heads (chunked)")
        K, H = hidden.shape[0], hidden.shape[-1]
        keep = self.mask.bool().flatten(1)  # [K, B * Tc]
        counts = keep.sum(1)
        # compiled (llm.ensemble's --compile-update): every row, no host read in the graph
        n = keep.shape[1] if torch.compiler.is_compiling() else int(counts.max())
        order = torch.argsort((~keep).to(torch.uint8), dim=1, stable=True)[:, :n]
        valid = torch.arange(n, device=keep.device) < counts[:, None]  # [K, n]
        rows = hidden.flatten(1, 2).gather(1, order[..., None].expand(K, n, H))
        stats = ChunkedLogProb.apply(
            rows.where(valid[..., None], 0),
            weight,
            bias,
            self.targets.flatten(1).gather(1, order).where(valid, 0),
            self.temperature,
            self.chunk_size,
            self.with_entropy,
        )
        out = [
            x.new_zeros(keep.shape).scatter(1, order, x.where(valid, 0)).view(self.mask.shape)
            for x in stats
            if x is not None
        ]
        return torch.stack(out, -1)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside DDP (``.module``) and peft (``get_base_model()``) wrappers;
    FSDP2's ``fully_shard`` keeps the model's own class, so it is returned as is."""
    while True:
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
        else:
            return model


def check_no_post_head_transform(model: torch.nn.Module) -> None:
    """``ValueError`` for a model whose forward transforms the logits after its head."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for field in POST_HEAD_FIELDS:
        value = getattr(config, field, None)
        if value is not None and value != 1.0:
            raise ValueError(
                f"model: its config sets {field}={value!r}, a transform of the logits after the LM "
                f"head, which chunked log-probs do not apply; this model is not supported"
            )


@contextlib.contextmanager
def _swapped_head(model: torch.nn.Module, make: Any) -> Iterator[None]:
    """Replace ``model``'s output-embedding module by ``make(head)`` for the duration."""
    base = unwrap_model(model)
    check_no_post_head_transform(base)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"model: {type(base).__name__} has no output embeddings (LM head)")
    if type(head) is not torch.nn.Linear:
        raise ValueError(
            f"model: the LM head is a {type(head).__name__}, not a plain torch.nn.Linear (a LoRA "
            f"or quantised head?); chunked log-probs need its weight to be the map it computes"
        )
    owner, name = next((m, n) for m in base.modules() for n, c in m.named_children() if c is head)
    setattr(owner, name, make(head))
    try:
        yield
    finally:
        setattr(owner, name, head)


def completion_logp(
    model: Any,
    prompt: Tensor,
    prompt_mask: Tensor,
    completion: Tensor,
    completion_mask: Tensor,
    temperature: float,
    *,
    entropy: str | None = None,
    chunk_size: int | None = None,
    head: str = "chunked",
) -> tuple[Tensor, Tensor | None]:
    """``(logp, entropy)``, each ``[B, Tc]`` float32 (float64 for a float64 model): the
    completion tokens' log-probs under ``softmax(logits / temperature)`` and the next-token
    entropies, without the ``[B, Tc, V]`` logits (see the module docstring).

    ``model`` is called as given (DDP, FSDP2, peft wrappers included) with ``prompt`` /
    ``completion`` ``[B, Tp]`` / ``[B, Tc]`` token ids and their 0/1 masks (left-padded prompts,
    right-padded completions). Both outputs are 0 where ``completion_mask`` is 0 (those positions
    are not computed). ``entropy``: None (not computed), ``"metric"`` (no gradient) or ``"grad"``
    (with gradient when grad mode is on). ``chunk_size``: token rows per chunk of logits, default
    :func:`default_chunk_size` of the vocabulary (``2**25`` logits, 128 MiB in float32).
    ``head``: ``"chunked"`` (this module's :class:`ChunkedLogProb`) or ``"trl"`` (TRL's fused
    kernel; ``chunk_size`` is then vocabulary columns per tile, default :data:`TRL_VOCAB_CHUNK`)."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {list(HEADS)}, got {head!r}")
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy must be one of {ENTROPY_MODES}, got {entropy!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if completion.shape != completion_mask.shape or prompt.shape != prompt_mask.shape:
        raise ValueError("completion/prompt and their masks must have the same shapes")
    input_ids = torch.cat([prompt, completion], 1)
    attention = torch.cat([prompt_mask, completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    Tc = completion.shape[1]

    def make(linear: torch.nn.Linear) -> LogProbHead:
        default = TRL_VOCAB_CHUNK if head == "trl" else default_chunk_size(linear.out_features)
        return LogProbHead(
            linear,
            completion,
            completion_mask,
            temperature=float(temperature),
            chunk_size=chunk_size or default,
            with_entropy=entropy is not None,
            kernel=head,
        )

    with _swapped_head(model, make):
        stats = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            logits_to_keep=Tc + 1,
            use_cache=False,
        ).logits
    logp = stats[..., 0]
    if entropy is None:
        return logp, None
    ent = stats[..., 1]
    return logp, ent if entropy == "grad" else ent.detach()


@torch.no_grad()
def completion_logits(
    model: Any,
    prompt: Tensor,
    prompt_mask: Tensor,
    completion: Tensor,
    completion_mask: Tensor,
    temperature: float,
) -> Tensor:
    """``[N, V]`` the full next-token logits ``z_t = (W h_t + b) / temperature`` (float32, float64
    for a float64 model; no graph) at the ``N`` completion tokens under ``completion_mask``, in row
    order: ``log_softmax`` of a row is the distribution :func:`completion_logp` scores that token
    under. Only for a bounded probe (mechanism check (a), :mod:`llm.train`): it holds ``N x V``
    logits. The model runs on as many rows at a time as keep one forward's logits within
    :data:`CHUNK_ELEMENTS` (at least one row), with the model's own head (any wrapper)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if completion.shape != completion_mask.shape or prompt.shape != prompt_mask.shape:
        raise ValueError("completion/prompt and their masks must have the same shapes")
    head = unwrap_model(model).get_output_embeddings()
    Tc = completion.shape[1]
    rows = max(1, CHUNK_ELEMENTS // max(Tc * head.out_features, 1))
    pieces = []
    for lo in range(0, completion.shape[0], rows):
        sl = slice(lo, lo + rows)
        input_ids = torch.cat([prompt[sl], completion[sl]], 1)
        attention = torch.cat([prompt_mask[sl], completion_mask[sl]], 1)
        logits = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
            logits_to_keep=Tc + 1,
            use_cache=False,
        ).logits[:, :-1]  # position t-1 predicts completion token t
        z = logits[completion_mask[sl].bool()]
        pieces.append(z.to(torch.promote_types(z.dtype, torch.float32)) / temperature)
    return torch.cat(pieces)
