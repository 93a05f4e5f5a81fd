"""K runs' training forward and update as one batched computation: the members of an ensemble
(seeds, or rules, of one model architecture) share every kernel launch of the training forward.

A study of many paired seeds runs the same small model K times. On a GPU each run alone is
launch-bound; here the members' decoder bodies run as one ``torch.func.vmap`` over the stacked
parameters (``functional_call`` on a parameter-free template of the architecture), so every linear
layer is one batched matmul over the K members:

    hidden[k] = body(theta_k; prompt_k ++ completion_k)          # vmap over k, [K, B, T, H]
    logp[k], entropy[k] = LM head_k(hidden[k])                    # llm.logprobs, batched over k
    loss      = sum_k PolicyLoss_k(logp[k], ...)                   # sandbox.loss: one vmapped
                                                                   # call where the members share
                                                                   # a deterministic rule
    grad      -> per-member gradient-norm clipping -> one batched AdamW of every member

The parameters live stacked: every parameter name is one leaf ``[K, ...]`` (:func:`stack_leaves`)
and each member's own parameter is rebound to its row (a view of the leaf's storage), so the
members stay ordinary modules that ``generate``, save and checkpoint as before, while the batched
forward differentiates the leaves directly (no ``torch.stack`` per forward) and the update is a
few batched operators whatever K: :func:`clip_members` (each member's norm ``[K]`` and its
coefficient in one pass over the leaves' gradients) and :class:`StackedAdamW` (``torch._foreach_*``
over the leaves, each member's learning rate, weight decay and step count as ``[K, 1, ...]``
factors; its moments held stacked, each run's own optimizer state views of its rows).
A checkpoint clones those views (:func:`llm.checkpoint.own_storage`), so a member's file is a
single run's.

Why this equals K separate runs: the members share no parameter, so ``d loss / d theta_k`` is
member k's own gradient (the sum only routes each loss to its member); clipping uses each member's
own norm (``torch.nn.utils.clip_grad_norm_``'s formula per member); AdamW is elementwise and its
per-member factors are computed on the host as its run's AdamW computes them, so the batched step
is the K runs' steps (``tests/test_llm_ensemble.py``: 2 members after 2 steps equal 2 separate
runs, float64; ``tests/test_llm_ensemble_update.py``: three rules, learning rates and clipping
thresholds, clipping binding, float64, and float32 AdamW to the bit).

The members' batches are padded to common widths (prompts on the left, completions on the right:
masked positions, so the result is the member's own to float rounding). Stochastic objectives get
one generator per member, as a run's micro-step seeds it.

The driver: :func:`train_ensemble` (``python -m llm.ensemble --seeds 0,1,2 [llm.train flags]``)
trains K runs of :func:`llm.train.train` in one process, each with its own rollouts, scores, logs,
checkpoint and ``--out``, through :func:`llm.train.loop` (the one loop: phases, evaluation,
logging, checkpoints, signals, resume) with :func:`ensemble_update` as its update phase;
:func:`ensemble_step` / :func:`ensemble_update` are the batched core. Each member's minibatch
order and objective noise are its run's (:func:`llm.train.minibatch_order`,
:func:`llm.train.objective_generator`, the streams of :mod:`llm.streams`).
The mechanism probes (``--entropy-law``, ``--grad-noise``) run per member on its own model, as in
its run alone (:func:`llm.train.entropy_law_probe`, :func:`llm.train.grad_noise_update`): the
grad-noise probe reads the member's batched gradient as ``g_rule`` and takes ``g_det`` from the
member's own forward, so for a rule with certain keeps ``grad_rescue_var`` is float rounding, not 0.
Like a run, an ensemble resumes (``--resume``: every member from its own checkpoint, all at one
step) and checkpoints every member on SIGTERM / Ctrl-C and every ``--checkpoint-every`` steps.
Rollouts: with ``--rollout-backend compact`` every member's prompts are decoded in one loop
(:func:`batched_rollout`, :mod:`llm.decode`: one batched matmul per layer over the stacked
weights, a static KV cache, noise fixed per (seed, step, row, position)), each member's
completions the ones its run samples alone; with the default ``hf`` backend the members'
rollouts are generated one member after another with :func:`llm.rollout.generate` (each run's
own rollout phase); with compact the members' old log-probs are one batched forward per row chunk
(:func:`old_logp`). No
torchrun, LoRA or vLLM. The members run without gradient
checkpointing (the template, rebuilt from the members' config, is called inside ``vmap``), so the
activation memory is K runs' without checkpointing. What it buys on a GPU is unmeasured
(``benchmarks/llm_throughput.py`` measures it). ``--compile-update on`` compiles each
micro-step's forward and loss (:class:`CompiledLosses`: one ``fullgraph`` graph, micro-batches
padded to fixed widths so that a run compiles once; ``tests/test_llm_ensemble_compile.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from llm import checkpoint
from llm.config import TrainConfig
from llm.decode import bucket
from llm.logprobs import (
    TRL_VOCAB_CHUNK,
    LogProbHead,
    check_no_post_head_transform,
    default_chunk_size,
    unwrap_model,
)
from llm.report import StepMetrics
from llm.rollout import COMPLETION_KEYS, pad_to_common
from llm.train import (
    Run,
    UpdateFn,
    aborted_exit,
    draw_prompts,
    grad_noise_update,
    mask_counts,
    minibatch_counts,
    minibatch_order,
    needs_sampler_logp,
    objective_generator,
    parse_args,
    rollout_each,
    sample_compact,
    score_rollout,
    signalled_exit,
    train_together,
    trim,
)
from sandbox.configs import CommandParser
from sandbox.loss import LossOutput, PolicyLoss


class HeadWeights(NamedTuple):
    """The members' LM head as :class:`llm.logprobs.LogProbHead` reads it (a tuple, which
    ``torch.compile`` traces)."""

    weight: Tensor
    bias: Tensor | None


#: the name the template's attention is registered under (:func:`autocast_sdpa_name`)
AUTOCAST_SDPA = "clip_sandbox_autocast_sdpa"


def autocast_sdpa(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, *args, **kw):
    """transformers' ``sdpa`` attention with query, key and value cast to the autocast dtype
    where autocast is on (else unchanged), as CUDA's autocast casts a plain call of SDPA. Inside
    ``vmap`` it does not: there the rotary embedding's float32 cos/sin leave query and key float32
    while value is bf16, and SDPA refuses the mix (seen on an H200, torch 2.11, 2026-11-26; CPU
    autocast never casts SDPA, so the CPU tests reproduce it). Outside autocast: the same call."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kind = query.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, *args, **kw)


def autocast_sdpa_name() -> str:
    """:data:`AUTOCAST_SDPA`, registered with transformers' ``AttentionInterface`` (once)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if AUTOCAST_SDPA not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(AUTOCAST_SDPA, autocast_sdpa)
    return AUTOCAST_SDPA


class Ensemble:
    """K members of one architecture (Hugging Face causal LMs, e.g. ``llm.model.tiny_model`` with
    K seeds); :meth:`completion_logp` runs their decoder bodies as one ``vmap``."""

    def __init__(self, members: Sequence[torch.nn.Module]) -> None:
        if len(members) < 1:
            raise ValueError("members must hold at least one model")
        bases = [unwrap_model(m) for m in members]
        names = [[n for n, _ in b.base_model.named_parameters()] for b in bases]
        if any(n != names[0] for n in names):
            raise ValueError("members must share one architecture (the same parameter names)")
        if len({id(b) for b in bases}) < len(bases):
            raise ValueError("members must be distinct models (one model twice would update twice)")
        for base in bases:
            check_no_post_head_transform(base)
        self.members = list(members)
        self.bases = bases
        # a parameter-free copy of the decoder body: functional_call supplies every tensor
        # the architecture rebuilt from its config on the meta device (no copy of the members'
        # hooks or gradient-checkpointing state, which do not run inside vmap)
        with torch.device("meta"):
            self.template = type(bases[0])(copy.deepcopy(bases[0].config)).base_model
        if getattr(self.template.config, "_attn_implementation", "sdpa") == "sdpa":
            self.template.config._attn_implementation = autocast_sdpa_name()
        first = bases[0]
        full = {id(p): name for name, p in first.named_parameters()}
        embedding = first.get_input_embeddings()
        head = first.get_output_embeddings()
        self.embed_name = full[id(embedding.weight)]
        self.head_names = (
            full[id(head.weight)],
            None if head.bias is None else full[id(head.bias)],
        )
        self.body_names = {  # the body's own names -> the model's, but the token embedding's
            name: full[id(p)]
            for name, p in first.base_model.named_parameters()
            if p is not embedding.weight  # looked up outside vmap (see completion_logp)
        }
        self.buffers = {  # constant (rotary frequencies): stacked once
            name: torch.stack([dict(b.base_model.named_buffers())[name] for b in bases])
            for name, _ in first.base_model.named_buffers()
        }
        self.leaves = stack_leaves(bases)

    def __len__(self) -> int:
        return len(self.members)

    def parameters(self) -> list[Tensor]:
        """The trainable stacked leaves ``[K, ...]`` (for one optimizer, or :class:`StackedAdamW`),
        in the members' parameter order."""
        return [leaf for leaf in self.leaves.values() if leaf.requires_grad]

    def member_params(self, k: int) -> dict[str, torch.nn.Parameter]:
        """Member k's own parameters by name (views of :attr:`leaves`, row k)."""
        return dict(self.bases[k].named_parameters())

    def stacked_body_state(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The body's parameters (but the token embedding) as the stacked leaves and its buffers
        stacked, by the body's own names (for ``functional_call`` on the template)."""
        return {name: self.leaves[full] for name, full in self.body_names.items()}, self.buffers

    def embed(self, ids: Tensor) -> Tensor:
        """``[K, B, T, H]`` token embeddings of ``ids`` ``[K, B, T]`` from the stacked embedding
        (outside vmap: vmap's rule for a batched embedding weight honours ``padding_idx`` for the
        first member only). A plain ``nn.Embedding``: one gather, the padding token's rows cut
        from the graph as ``padding_idx`` does; any other module: one call per member."""
        weight = self.leaves[self.embed_name]
        module = self.bases[0].get_input_embeddings()
        if type(module) is not torch.nn.Embedding:
            return torch.stack(
                [
                    torch.func.functional_call(module, {"weight": weight[k]}, (ids[k],))
                    for k in range(len(self))
                ]
            )
        members = torch.arange(len(self), device=ids.device)[:, None, None]
        embeds = weight[members, ids]
        if module.padding_idx is None:
            return embeds
        return torch.where((ids == module.padding_idx)[..., None], embeds.detach(), embeds)

    def _attention_4d(self, attention: Tensor) -> Tensor:
        """``[K, B, 1, T, T]`` causal + key-padding masks, built outside ``vmap`` (transformers'
        own mask builder branches on the mask's values, which ``vmap`` cannot trace). A padding
        query attends to itself only (its output is unused; this keeps it finite). Boolean (keep)
        for SDPA, additive for eager attention."""
        T = attention.shape[-1]
        causal = torch.ones(T, T, dtype=torch.bool, device=attention.device).tril()
        keys = attention.bool()[..., None, None, :] | torch.eye(
            T, dtype=torch.bool, device=attention.device
        )
        mask = causal & keys
        impl = getattr(self.bases[0].config, "_attn_implementation", "sdpa")
        if impl == "sdpa":
            return mask
        if impl != "eager":
            raise ValueError(f"members: attention {impl!r} is not supported (sdpa or eager)")
        dtype = next(self.bases[0].parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min
        )

    def completion_logp(
        self,
        batch: dict[str, Tensor],
        temperature: float,
        *,
        entropy: str | None = None,
        chunk_size: int | None = None,
        head: str = "chunked",
    ) -> tuple[Tensor, Tensor | None]:
        """``(logp, entropy)`` ``[K, B, Tc]`` of ``batch`` (``[K, B, ...]`` tensors, see
        :func:`stack_batches`), as :func:`llm.logprobs.completion_logp` computes them for each
        member alone (``entropy``: None, ``"metric"`` or ``"grad"``)."""
        prompt, completion = batch["prompt"], batch["completion"]
        if prompt.shape[0] != len(self) or completion.shape[0] != len(self):
            raise ValueError(f"batch must hold {len(self)} members' rows on dim 0")
        ids = torch.cat([prompt, completion], -1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], -1)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        masks = self._attention_4d(attention)
        params, buffers = self.stacked_body_state()
        embeds = self.embed(ids)

        def body(p: dict, b: dict, e: Tensor, m: Tensor, pos: Tensor) -> Tensor:
            kwargs = dict(inputs_embeds=e, attention_mask=m, position_ids=pos, use_cache=False)
            out = torch.func.functional_call(self.template, (p, b), (), kwargs)
            return out.last_hidden_state

        hidden = torch.func.vmap(body)(params, buffers, embeds, masks, positions)
        Tc = completion.shape[-1]
        weight, bias = (None if n is None else self.leaves[n] for n in self.head_names)
        K, V = weight.shape[:2]

        def lm_head(k: slice | int, size: int) -> Tensor:
            """The stats of members ``k`` (an index, or all of them as one batched head)."""
            linear = HeadWeights(weight[k], None if bias is None else bias[k])
            return LogProbHead(
                linear,  # type: ignore[arg-type]  # the members' head weight and bias
                completion[k],
                batch["completion_mask"][k],
                temperature=float(temperature),
                chunk_size=chunk_size or size,
                with_entropy=entropy is not None,
                kernel=head,
            )(hidden[k, ..., -(Tc + 1) :, :])

        if head == "chunked":  # one head over the members: 2^25 logits per chunk in all
            stats = lm_head(slice(None), default_chunk_size(K * V))
        else:  # TRL's kernel has no member dimension
            stats = torch.stack([lm_head(k, TRL_VOCAB_CHUNK) for k in range(K)])
        logp = stats[..., 0]
        if entropy is None:
            return logp, None
        ent = stats[..., 1]
        return logp, ent if entropy == "grad" else ent.detach()


def stack_leaves(bases: Sequence[torch.nn.Module]) -> dict[str, Tensor]:
    """Every parameter of the members (``named_parameters`` names) as one leaf ``[K, ...]``
    (``requires_grad`` as the members'), each member's parameter rebound to its row (a view of
    the leaf's storage): the members' modules see every update of the leaves (``generate``,
    saving, a checkpoint) and the leaves are what the batched forward differentiates and the
    optimizer steps. Moving or casting a member afterwards (``.to``, ``.double()``) would give
    it its own storage again, so it is done before."""
    named = [dict(b.named_parameters()) for b in bases]
    leaves = {}
    for name, p in named[0].items():
        leaf = torch.stack([params[name].detach() for params in named])
        for k, params in enumerate(named):
            params[name].data = leaf[k]
        leaves[name] = leaf.requires_grad_(p.requires_grad)
    return leaves


def stack_batches(batches: Sequence[dict[str, Tensor]], pad_id: int) -> dict[str, Tensor]:
    """K members' batches as ``[K, B, ...]`` tensors, padded to common widths
    (:func:`llm.rollout.pad_to_common`: prompts on the left, per-token tensors on the right)."""
    return {k: torch.stack(rows) for k, rows in pad_to_common(list(batches), pad_id).items()}


def member_losses(
    ensemble: Ensemble,
    batch: dict[str, Tensor],
    loss_fns: Sequence[PolicyLoss],
    *,
    temperature: float,
    counts: Sequence[dict[str, Any]] | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
    on_policy: bool | Sequence[bool] = False,
    head: str = "chunked",
    chunk_size: int | None = None,
    sizes: Sequence[tuple[int, int]] | None = None,
) -> list[LossOutput]:
    """The batched forward and member k's loss with ``loss_fns[k]`` on its rows of ``batch``
    (``[K, B, ...]``, :func:`stack_batches`): ``batch["logp_old"][k]`` as pi_old, or
    ``logp.detach()`` where ``on_policy`` (one flag, or one per member); ``loss_mask`` (else
    ``completion_mask``), ``logp_ref``, ``rollout_logp`` when present; ``counts[k]``: the global
    counts of member k's minibatch; ``generators[k]``: its objective's randomness; ``sizes[k]``:
    ``(rows, Tc)`` of member k's own batch before padding (its loss sees exactly those, so a
    stochastic objective draws what it draws alone). The losses: :func:`stacked_losses`."""
    K = len(ensemble)
    if len(loss_fns) != K:
        raise ValueError(f"loss_fns must hold one PolicyLoss per member ({K}), got {len(loss_fns)}")
    grad_entropy = any(f.entropy_coef > 0 for f in loss_fns)
    logp, ent = ensemble.completion_logp(
        batch,
        temperature,
        entropy="grad" if grad_entropy else "metric",
        head=head,
        chunk_size=chunk_size,
    )
    return stacked_losses(
        loss_fns,
        batch,
        logp,
        ent,
        counts=counts,
        generators=generators,
        on_policy=on_policy,
        sizes=sizes,
    )


#: The counts :func:`stacked_losses` passes per member in its batched call.
COUNT_KEYS = ("num_tokens", "num_seqs", "max_len")
#: The rules (:func:`rule_key`) whose loss ``vmap`` refused: :func:`stacked_losses` loops for them.
UNBATCHED: set[tuple] = set()


def stacked_losses(
    loss_fns: Sequence[PolicyLoss],
    batch: dict[str, Tensor],
    logp: Tensor,
    entropy: Tensor | None,
    *,
    counts: Sequence[dict[str, Any]] | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
    on_policy: bool | Sequence[bool] = False,
    sizes: Sequence[tuple[int, int]] | None = None,
) -> list[LossOutput]:
    """Member k's :class:`sandbox.loss.PolicyLoss` ``loss_fns[k]`` on its rows of the ``[K, B, T]``
    log-probs ``logp`` and ``entropy`` and of ``batch`` (:func:`member_losses` says which).

    Where the members' losses are one rule's (:func:`batchable`: the same objective and settings,
    no random draws, counts that differ in values only), the K losses are one call of that
    ``PolicyLoss`` under ``torch.func.vmap`` over the member dimension, each member's counts a
    row of a ``[K]`` tensor and the rows and columns beyond ``sizes[k]`` masked out: every
    operator of the loss runs once for the K members. The loss is a masked, per-member function
    of its inputs, so this gives each member the loss, metrics and gradient of its own call, to
    float rounding (``tests/test_llm_ensemble_loss.py``: every deterministic rule). Otherwise,
    and for a rule whose loss ``vmap`` refuses (remembered in :data:`UNBATCHED`), one call per
    member on its own ``[rows, Tc]`` slice: a stochastic rule draws from ``generators[k]``
    exactly what its run alone draws."""
    K = logp.shape[0]
    if len(loss_fns) != K:
        raise ValueError(f"loss_fns must hold one PolicyLoss per member ({K}), got {len(loss_fns)}")
    on_policy = [on_policy] * K if isinstance(on_policy, bool) else list(on_policy)
    mask = batch["loss_mask"] if "loss_mask" in batch else batch["completion_mask"]
    if batchable(loss_fns, counts, on_policy, sizes, mask.shape[-1]):
        try:
            return batched_losses(
                loss_fns[0], batch, logp, entropy, mask, counts, on_policy[0], sizes
            )
        except RuntimeError as exc:  # vmap's refusals (a host read, a branch on a value, ...)
            if "vmap" not in str(exc):
                raise
            UNBATCHED.add(rule_key(loss_fns[0]))
    outs = []
    for k, loss_fn in enumerate(loss_fns):
        b, tc = sizes[k] if sizes is not None else mask.shape[1:]

        def own(x: Tensor | None, k: int = k, b: int = b, tc: int = tc) -> Tensor | None:
            return None if x is None else x[k, :b, :tc]

        out = loss_fn(
            own(logp),
            own(logp).detach() if on_policy[k] else own(batch["logp_old"]),
            batch["adv"][k, :b],
            own(mask),
            logp_ref=own(batch.get("logp_ref")),
            rollout_logp=own(batch.get("rollout_logp")),
            entropy=own(entropy),
            generator=None if generators is None else generators[k],
            validate=False,
            **({} if counts is None else counts[k]),
        )
        outs.append(out)
    return outs


def rule_key(loss_fn: PolicyLoss) -> tuple:
    """What makes two :class:`sandbox.loss.PolicyLoss` one rule: the objective's class,
    parameters and compilation, and every other setting of the loss."""
    obj = loss_fn.objective
    settings = tuple(
        getattr(loss_fn, f.name) for f in dataclasses.fields(loss_fn) if f.name != "objective"
    )
    params = tuple(sorted((k, repr(v)) for k, v in obj.params.items()))
    return (type(obj), params, repr(obj._compile_options), settings)


def batchable(
    loss_fns: Sequence[PolicyLoss],
    counts: Sequence[dict[str, Any]] | None,
    on_policy: Sequence[bool],
    sizes: Sequence[tuple[int, int]] | None,
    width: int,
) -> bool:
    """Whether :func:`stacked_losses` computes the members' losses in one batched call: two or
    more members, one rule (:func:`rule_key`) whose objective draws no random numbers and that
    ``vmap`` has not refused, one ``on_policy`` flag, and counts that differ in values only: the
    same keys of :data:`COUNT_KEYS` in every member's, one ``max_len`` (a Python number of
    :func:`sandbox.aggregate.aggregate`), and none missing where the aggregation would take it
    from the member's own width (``seq-mean-token-sum-norm`` divides by ``Tc`` without it)."""
    if len(loss_fns) < 2 or loss_fns[0].objective.stochastic or len(set(on_policy)) > 1:
        return False
    key = rule_key(loss_fns[0])
    if key in UNBATCHED or any(rule_key(f) != key for f in loss_fns[1:]):
        return False
    if counts is None:
        counts = [{}] * len(loss_fns)
    keys = set(counts[0])
    if not keys <= set(COUNT_KEYS) or any(set(c) != keys for c in counts):
        return False
    if len({repr(c.get("max_len")) for c in counts}) > 1:
        return False
    own_width = "max_len" not in keys and loss_fns[0].mode == "seq-mean-token-sum-norm"
    return not (own_width and sizes is not None and any(tc != width for _, tc in sizes))


def batched_losses(
    loss_fn: PolicyLoss,
    batch: dict[str, Tensor],
    logp: Tensor,
    entropy: Tensor | None,
    mask: Tensor,
    counts: Sequence[dict[str, Any]] | None,
    on_policy: bool,
    sizes: Sequence[tuple[int, int]] | None,
) -> list[LossOutput]:
    """The K members' losses with one rule ``loss_fn`` as one ``torch.func.vmap`` of its call over
    the member dimension (:func:`stacked_losses`; the members' counts stacked to ``[K]``)."""
    mask = own_region(mask, sizes)
    tensors = {
        "logp_old": logp.detach() if on_policy else batch["logp_old"],
        "adv": batch["adv"],
        "mask": mask,
        "logp_ref": batch.get("logp_ref"),
        "rollout_logp": batch.get("rollout_logp"),
        "entropy": entropy,
    }
    tensors = {k: v for k, v in tensors.items() if v is not None}
    fixed: dict[str, Any] = {}
    for key in COUNT_KEYS if counts is not None else ():
        values = [c[key] for c in counts if key in c]
        if key == "max_len" and values:
            fixed[key] = values[0]
        elif values:
            tensors[key] = stacked_count(values, logp.device)

    def loss(lp: Tensor, named: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        named = dict(named)
        logp_old, adv, m = named.pop("logp_old"), named.pop("adv"), named.pop("mask")
        out = loss_fn(lp, logp_old, adv, m, validate=False, **named, **fixed)
        return out.loss, out.metrics

    losses, metrics = torch.func.vmap(loss)(logp, tensors)
    split = {name: value.unbind() for name, value in metrics.items()}
    return [
        LossOutput(value, {name: row[k] for name, row in split.items()})
        for k, value in enumerate(losses.unbind())
    ]


def own_region(mask: Tensor, sizes: Sequence[tuple[int, int]] | None) -> Tensor:
    """``mask`` ``[K, B, T]`` zeroed beyond each member's own ``sizes[k]`` = ``(rows, Tc)``."""
    B, T = mask.shape[1:]
    if sizes is None or all(tuple(s) == (B, T) for s in sizes):
        return mask
    bounds = torch.tensor(sizes, device=mask.device)[:, :, None, None]  # [K, 2, 1, 1]
    rows = torch.arange(B, device=mask.device)[:, None] < bounds[:, 0]
    return torch.where(rows & (torch.arange(T, device=mask.device) < bounds[:, 1]), mask, 0)


def stacked_count(values: Sequence[Tensor | float], device: torch.device) -> Tensor:
    """The members' counts (numbers or one-value tensors) as one ``[K]`` tensor whose rows
    :func:`sandbox.aggregate.aggregate` rounds to the loss's dtype as it rounds each count alone:
    the tensors stacked where they share a dtype, else every count in float64 (exact for
    float32 and for a Python number)."""
    first = values[0]
    if all(
        isinstance(v, Tensor) and (v.dtype, v.shape) == (first.dtype, first.shape) for v in values
    ):
        return torch.stack(values).to(device)
    return torch.stack(
        [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in values]
    )


def stacked_loss(
    ensemble: Ensemble,
    batch: dict[str, Tensor],
    loss_fns: Sequence[PolicyLoss],
    counts: Sequence[dict[str, Any]] | None,
    on_policy: Sequence[bool],
    temperature: float,
    head: str,
    chunk_size: int | None,
) -> tuple[Tensor, list[dict[str, Tensor]]]:
    """:func:`member_losses` of one rule (no sizes: ``batch``'s masks already cut each member's
    region) as the losses ``[K]`` and each member's metrics: what :class:`CompiledLosses`
    compiles."""
    outs = member_losses(
        ensemble,
        batch,
        loss_fns,
        temperature=temperature,
        counts=counts,
        on_policy=on_policy,
        head=head,
        chunk_size=chunk_size,
    )
    return torch.stack([o.loss for o in outs]), [o.metrics for o in outs]


class CompiledLosses:
    """``--compile-update on``: :func:`member_losses` of a micro-batch (the batched forward, the
    LM head, the vmapped loss) as one ``torch.compile(fullgraph=True, dynamic=False)`` graph of
    :func:`stacked_loss`, for the ensemble's micro-steps whose members share a deterministic rule
    (:func:`batchable`); the others, and stochastic rules (whose draws come from each member's
    generator), run eagerly. Each micro-batch is padded to fixed widths first, so every
    micro-batch of a run has one shape and the step compiles once: rows to the nominal
    micro-batch's (``ceil(ceil(N / minibatches) / grad_accum)``, stand-in rows masked out as
    :func:`pad_rows` adds them), prompts on the left to their :func:`llm.decode.bucket` width,
    completions on the right to ``max_new_tokens``. Every added position is masked (no loss, no
    attention to it), so the losses and gradients are the unpadded ones to float rounding.
    ``backend``: a ``torch.compile`` backend (default inductor; the CPU tests trace with
    ``"aot_eager"``)."""

    def __init__(self, ensemble: Ensemble, cfg: TrainConfig, pad_id: int, backend: str | None):
        self.ensemble, self.pad_id = ensemble, pad_id
        rows = -(-cfg.prompts_per_step * cfg.group_size // cfg.minibatches)
        self.rows, self.width = -(-rows // cfg.grad_accum), cfg.max_new_tokens
        options: dict[str, Any] = dict(fullgraph=True, dynamic=False)
        if backend is not None:
            options["backend"] = backend
        self.step = torch.compile(stacked_loss, **options)

    def __call__(
        self,
        ensemble: Ensemble,
        batch: dict[str, Tensor],
        loss_fns: Sequence[PolicyLoss],
        **kwargs: Any,
    ) -> list[LossOutput]:
        """:func:`member_losses`' call and result, compiled where the members share a rule."""
        counts, sizes = kwargs.get("counts"), kwargs.get("sizes")
        on_policy = kwargs.get("on_policy", False)
        on_policy = [on_policy] * len(ensemble) if isinstance(on_policy, bool) else on_policy
        mask = batch["loss_mask"] if "loss_mask" in batch else batch["completion_mask"]
        if ensemble is not self.ensemble or not batchable(
            loss_fns, counts, on_policy, sizes, mask.shape[-1]
        ):
            return member_losses(ensemble, batch, loss_fns, **kwargs)
        batch = self.fixed_widths({**batch, "loss_mask": own_region(mask, sizes)})
        losses, metrics = self.step(
            ensemble,
            batch,
            list(loss_fns),
            None if counts is None else self.float64_counts(counts, mask.device),
            list(on_policy),
            float(kwargs["temperature"]),
            kwargs.get("head", "chunked"),
            kwargs.get("chunk_size"),
        )
        return [LossOutput(loss, m) for loss, m in zip(losses.unbind(), metrics, strict=True)]

    @staticmethod
    def float64_counts(counts: Sequence[dict[str, Any]], device: torch.device) -> list[dict]:
        """The members' counts with every number (a Python float for a member without rows, a
        tensor otherwise) a float64 0-d tensor, so the graph sees one type whatever the step
        (the counts are whole numbers: exact in float64, rounded to the loss's dtype as
        :func:`stacked_count` rounds them)."""
        return [
            {
                key: torch.as_tensor(v, dtype=torch.float64, device=device).reshape(())
                if key != "max_len"
                else v
                for key, v in c.items()
            }
            for c in counts
        ]

    def fixed_widths(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``batch`` ``[K, B, ...]`` padded to :attr:`rows` rows, its prompts to their bucket
        width and its completions to :attr:`width` columns, every added position masked."""
        pad = torch.nn.functional.pad
        Tp = bucket(batch["prompt"].shape[-1])
        out = {}
        for key, v in batch.items():
            fill = self.pad_id if key in ("prompt", "completion") else 0
            if key in ("prompt", "prompt_mask"):
                v = pad(v, (Tp - v.shape[-1], 0), value=fill)
            elif key in COMPLETION_KEYS:
                v = pad(v, (0, max(self.width - v.shape[-1], 0)), value=fill)
            n = v.shape[1]
            if n < self.rows:  # stand-in rows: copies of the first, masked out
                extra = v[:, :1].expand(v.shape[0], self.rows - n, *v.shape[2:])
                if key in ("completion_mask", "loss_mask"):
                    extra = torch.zeros_like(extra)
                v = torch.cat([v, extra], 1)
            out[key] = v
        return out


def ensemble_step(
    ensemble: Ensemble,
    batch: dict[str, Tensor],
    loss_fns: Sequence[PolicyLoss],
    optimizer: torch.optim.Optimizer,
    *,
    max_grad_norm: float,
    **kwargs: Any,
) -> tuple[list[LossOutput], Tensor]:
    """One optimizer step of every member on its own (micro-)batch, as K runs would make it:
    :func:`member_losses` (``kwargs``: its options), one backward, each member's gradient
    clipped to ``max_grad_norm`` by its own norm (:func:`clip_members`), one
    ``optimizer.step()`` (an elementwise optimizer over :meth:`Ensemble.parameters`, the stacked
    leaves: every member steps, with one learning rate). Returns the members' loss outputs and
    their gradient norms ``[K]`` (before clipping)."""
    outs = member_losses(ensemble, batch, loss_fns, **kwargs)
    torch.stack([o.loss for o in outs]).sum().backward()
    norms = clip_members(ensemble, [max_grad_norm] * len(ensemble))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return outs, norms


def member_view(x: Tensor, dim: int) -> Tensor:
    """``x`` ``[K]`` shaped ``[K, 1, ...]`` to broadcast over a ``dim``-dimensional leaf."""
    return x.view(-1, *[1] * (dim - 1))


def clip_members(ensemble: Ensemble, max_grad_norms: Sequence[float]) -> Tensor:
    """Each member's gradient (rows of the leaves' ``.grad``) clipped to ``max_grad_norms[k]``
    by its own norm, in a few batched operators: ``torch.nn.utils.clip_grad_norm_``'s formula
    (the norm of the parameters' norms; coefficient ``max / (norm + 1e-6)`` clamped at 1, every
    gradient multiplied by it). Returns the norms ``[K]`` before clipping."""
    grads = [leaf.grad for leaf in ensemble.parameters() if leaf.grad is not None]
    if not grads:
        return torch.zeros(len(ensemble))
    per_leaf = torch.stack(
        [torch.linalg.vector_norm(g, dim=tuple(range(1, g.dim()))) for g in grads]
    )
    norms = torch.linalg.vector_norm(per_leaf, dim=0)
    limit = torch.tensor(max_grad_norms, dtype=norms.dtype, device=norms.device)
    coef = (limit / (norms + 1e-6)).clamp(max=1.0)
    shaped = {d: member_view(coef, d) for d in {g.dim() for g in grads}}
    torch._foreach_mul_(grads, [shaped[g.dim()] for g in grads])
    return norms


class StackedAdamW:
    """The K runs' own ``torch.optim.AdamW`` steps (``optimizers[k]``: run k's, over member k's
    parameters; its learning rate as its scheduler sets it, its weight decay, betas and eps) as
    a few batched ``torch._foreach_*`` operators over the stacked leaves of ``ensemble``: the
    arithmetic of ``torch.optim.adamw``'s single-tensor path, the per-member factors as
    ``[K, 1, ...]`` tensors. A member marked inactive (:meth:`step`'s ``active``) does not move,
    and its step count stays, as its run alone makes no step.

    The moments are held stacked (``[K, ...]``, beside the leaves) and each run's optimizer
    state holds views of member k's rows and its own ``step`` tensors, so a run's
    ``optimizer.state_dict()`` (its checkpoint) is its own; a resumed run's loaded state is
    copied in at construction."""

    def __init__(self, ensemble: Ensemble, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        K = len(ensemble)
        for opt in optimizers:
            group = opt.param_groups[0]
            if not isinstance(opt, torch.optim.AdamW) or len(opt.param_groups) != 1:
                raise ValueError("optimizers must be one AdamW of one parameter group per member")
            if group["amsgrad"] or group["maximize"] or group.get("capturable"):
                raise ValueError("optimizers: amsgrad, maximize and capturable are not supported")
        names = [n for n, leaf in ensemble.leaves.items() if leaf.requires_grad]
        self.ensemble, self.optimizers, self.names = ensemble, list(optimizers), names
        self.leaves = [ensemble.leaves[n] for n in names]
        self.exp_avg = [torch.zeros_like(leaf) for leaf in self.leaves]
        self.exp_avg_sq = [torch.zeros_like(leaf) for leaf in self.leaves]
        self.step_tensors: list[list[Tensor]] = []
        self.steps: list[int] = []
        scalar_dtype = (
            torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        )
        for k, opt in enumerate(self.optimizers):
            params, ts = ensemble.member_params(k), []
            for i, name in enumerate(names):
                state = opt.state[params[name]]
                for key, stacked in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                    if key in state:  # a resumed run's moments
                        stacked[i][k].copy_(state[key])
                    state[key] = stacked[i][k]
                state.setdefault("step", torch.tensor(0.0, dtype=scalar_dtype))
                ts.append(state["step"])
            self.step_tensors.append(ts)
            self.steps.append(int(ts[0].item()) if ts else 0)
        assert len(self.steps) == K

    def factors(self, active: Sequence[bool]) -> Tensor:
        """``[7, K]`` per-member factors of this step (the host's arithmetic, as AdamW's own):
        decay, 1 - beta1, beta2, 1 - beta2, -step size, sqrt of bias correction 2, eps; an
        inactive member's leave its tensors unchanged."""
        rows = []
        for k, opt in enumerate(self.optimizers):
            g = opt.param_groups[0]
            lr, (b1, b2), step = g["lr"], g["betas"], float(self.steps[k])
            if not active[k]:
                rows.append((1.0, 0.0, 1.0, 0.0, 0.0, 1.0, g["eps"]))
                continue
            bias1, bias2 = 1 - b1**step, 1 - b2**step
            rows.append(
                (1 - lr * g["weight_decay"], 1 - b1, b2, 1 - b2, -lr / bias1, bias2**0.5, g["eps"])
            )
        return torch.tensor(rows, dtype=torch.float64).T

    @torch.no_grad()
    def step(self, active: Sequence[bool]) -> None:
        """One AdamW step of every ``active`` member on the leaves' gradients."""
        if not any(active):
            return
        for k, on in enumerate(active):
            self.steps[k] += bool(on)
        counted = [t for k, on in enumerate(active) if on for t in self.step_tensors[k]]
        torch._foreach_add_(counted, 1.0)
        live = [i for i, leaf in enumerate(self.leaves) if leaf.grad is not None]
        params = [self.leaves[i] for i in live]
        grads = [self.leaves[i].grad for i in live]
        m, v = [self.exp_avg[i] for i in live], [self.exp_avg_sq[i] for i in live]
        table = self.factors(active).to(params[0].device, params[0].dtype)
        shaped = {d: [member_view(row, d) for row in table] for d in {p.dim() for p in params}}
        decay, w1, b2, w2, neg_step, bias2, eps = (
            [shaped[p.dim()][j] for p in params] for j in range(7)
        )
        torch._foreach_mul_(params, decay)  # param *= 1 - lr * wd
        torch._foreach_lerp_(m, grads, w1)  # m = lerp(m, g, 1 - beta1)
        torch._foreach_mul_(v, b2)  # v = v * beta2 + ((1 - beta2) * g) * g
        torch._foreach_addcmul_(v, torch._foreach_mul(grads, w2), grads)
        denom = torch._foreach_sqrt(v)  # sqrt(v) / sqrt(bias2) + eps
        torch._foreach_div_(denom, bias2)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, torch._foreach_mul(m, neg_step), denom)

    def zero_grad(self) -> None:
        for leaf in self.leaves:
            leaf.grad = None


# --------------------------------------------------------------------------------------------------
# K runs of llm.train in one process
# --------------------------------------------------------------------------------------------------

# Settings the members must share: one batched forward, one loop of updates.
SHARED = (
    "model",
    "dtype",
    "bf16",
    "cpu_bf16",
    "temperature",
    "prompts_per_step",
    "group_size",
    "epochs",
    "minibatches",
    "grad_accum",
    "max_new_tokens",
    "steps",
    "lm_head",
    "logp_chunk",
    "device",
    "rollout_backend",
    "compile_update",
)


def check_members(cfgs: Sequence[TrainConfig]) -> None:
    """``ValueError`` unless the runs can be one ensemble: two or more, the :data:`SHARED`
    settings equal, one process, full fine-tuning, ``generate`` rollouts, distinct outputs, and
    (with ``--resume``) every member's checkpoint at one step (a member without ``--resume``
    counts as step 0)."""
    if len(cfgs) < 2:
        raise ValueError("an ensemble needs at least two runs")
    for name in SHARED:
        values = {repr(getattr(c, name)) for c in cfgs}
        if len(values) > 1:
            raise ValueError(
                f"ensemble runs must share --{name.replace('_', '-')}: {sorted(values)}"
            )
    for c in cfgs:
        if c.lora_r > 0 or c.rollout_backend == "vllm" or c.fsdp:
            raise ValueError(
                "ensemble runs train without --lora-r and --fsdp, on the hf or compact backend"
            )
    if len({c.out for c in cfgs}) < len(cfgs):
        raise ValueError("ensemble runs need one --out each")
    starts = [resume_step(c) for c in cfgs]
    if len(set(starts)) > 1:
        each = ", ".join(f"{c.out}: step {s}" for c, s in zip(cfgs, starts, strict=True))
        raise ValueError(f"--resume: ensemble runs must resume from one step, got {each}")


def resume_step(cfg: TrainConfig) -> int:
    """The step a run starts from: its checkpoint's with ``--resume`` (checked later by
    :func:`llm.config.check_resume`), else 0."""
    if not cfg.resume or not os.path.exists(checkpoint.path_in(cfg.out)):
        return 0
    return checkpoint.saved_step_and_config(cfg.out)[0]


def train_ensemble(
    cfgs: Sequence[TrainConfig],
    *,
    stop_after: int | None = None,
    _compile_backend: str | None = None,
) -> list[list[dict[str, float]]]:
    """K runs of :func:`llm.train.train` (``cfgs``: their :class:`llm.config.TrainConfig`) in one
    process: each run's own rollouts, scores, logs, checkpoint and model in its own ``--out``, the
    training forward and backward batched over the runs (:func:`ensemble_update`). Returns each
    run's logged rows (of this call: a resumed run's start after its checkpoint), as
    :func:`llm.train.train` would.

    The loop is :func:`llm.train.loop`, the one every run goes through (phases, logging,
    evaluation, checkpoints, signals, resume), with :class:`Phases`' rollout and update phases.
    Resume (``--resume`` on every member): each member loads its own checkpoint; all must be at
    one step (:func:`check_members`). Checkpoints (every member's, in its ``--out``): every
    member's ``--checkpoint-every`` steps, at the end, after ``stop_after`` steps of this call
    (then it returns), and on SIGTERM or Ctrl-C, which finish the step, write every member's
    checkpoint and exit with status 143 / 130 (:func:`llm.train.stop_on_signals`).
    ``_compile_backend``: the ``torch.compile`` backend of ``--compile-update on`` (default
    inductor; the CPU tests trace with ``"aot_eager"``)."""
    check_members(cfgs)
    if "WORLD_SIZE" in os.environ:
        raise ValueError("an ensemble runs in one process (not under torchrun)")
    phases = Phases(_compile_backend)
    with warnings.catch_warnings():  # restores the filters after the run
        quiet_sdpa_fallback()
        return train_together(cfgs, phases.update, stop_after=stop_after, rollout_fn=phases.rollout)


def quiet_sdpa_fallback() -> None:
    """Ignore torch's "There is a performance drop because we have not yet implemented the
    batching rule for aten::_scaled_dot_product_..." (a ``UserWarning``), and only it: ``vmap``
    has no batching rule for the CPU kernel of SDPA, so :meth:`Ensemble.completion_logp` runs
    it once per member (the same numbers; what the ensemble buys is measured in
    ``benchmarks/``). It came once per step (``llm.train.log_step``'s ``catch_warnings`` resets
    Python's once-per-place record): some 20 lines a run for nothing a user can act on."""
    warnings.filterwarnings(
        "ignore",
        message="There is a performance drop because we have not yet implemented the batching "
        "rule for aten::_scaled_dot_product_",
        category=UserWarning,
    )


class Phases:
    """The ensemble's rollout and update phases for :func:`llm.train.loop`, over one
    :class:`Ensemble` of the runs' models, built by :meth:`update` (called once the runs are set
    up, and resumed, before the loop's first step)."""

    def __init__(self, compile_backend: str | None = None) -> None:
        self.ensemble: Ensemble | None = None
        self.compile_backend = compile_backend

    def update(self, runs: Sequence[Run]) -> UpdateFn:
        """:func:`ensemble_update` on the runs' :class:`Ensemble`, stepped by one
        :class:`StackedAdamW` of the runs' own optimizers; with ``--compile-update on`` its
        micro-steps through :class:`CompiledLosses` (``compile_backend``: its backend)."""
        self.ensemble = Ensemble([r.model for r in runs])
        optimizer = StackedAdamW(self.ensemble, [r.optimizer for r in runs])
        cfg = runs[0].cfg
        compiled = (
            CompiledLosses(self.ensemble, cfg, runs[0].tokenizer.pad_token_id, self.compile_backend)
            if cfg.compile_update == "on"
            else None
        )
        return functools.partial(
            ensemble_update, ensemble=self.ensemble, optimizer=optimizer, compiled=compiled
        )

    def rollout(self, runs: Sequence[Run], step: int) -> list[dict[str, Tensor]]:
        """With ``--rollout-backend compact``: :func:`batched_rollout` with the runs'
        :class:`Ensemble`; with ``hf``: each run's own rollout (:func:`llm.train.rollout_each`)."""
        if runs[0].cfg.rollout_backend != "compact":
            return rollout_each(runs, step)
        if self.ensemble is None:
            raise RuntimeError("Phases.update builds the ensemble before the first rollout")
        return batched_rollout(runs, step, self.ensemble)


def batched_rollout(runs: Sequence[Run], step: int, ensemble: Ensemble) -> list[dict[str, Tensor]]:
    """The ensemble's rollout phase with ``--rollout-backend compact``: every member's prompts
    decoded in one loop (:func:`llm.train.sample_compact`, :mod:`llm.decode`), each member's
    completions the ones its run samples alone; the old log-probs of every member in one batched
    forward per row chunk (:func:`old_logp`); then each run's own rewards (and reference
    log-probs)."""
    requests = [draw_prompts(run, step) for run in runs]
    needs = [needs_sampler_logp(run.cfg) for run in runs]
    sampled = sample_compact(
        runs,
        [ids for ids, *_ in requests],
        runs[0].cfg.group_size,
        [keys for _, _, keys, _, _ in requests],
        [first for _, _, _, first, _ in requests],
        return_logp=any(needs),
    )
    olds = old_logp(ensemble, runs, [out for out, _ in sampled])
    hosts = []
    for run, request, (out, texts), need, old in zip(
        runs, requests, sampled, needs, olds, strict=True
    ):
        if not need:  # the run alone keeps no sampler log-probs
            out.pop("rollout_logp", None)
        hosts.append(score_rollout(run, request[4], out, texts, old))
    return hosts


@torch.no_grad()
def old_logp(
    ensemble: Ensemble, runs: Sequence[Run], outs: Sequence[dict[str, Tensor]]
) -> list[Tensor | None]:
    """Each member's old log-probs of its completions ``outs[k]`` (on the CPU, ``[B, Tc]``), as
    :func:`llm.train.logprobs` computes them for its run alone (in ``minibatches x grad_accum``
    row chunks, no graph), every member's chunk in one batched forward
    (:meth:`Ensemble.completion_logp`); None for every member where the runs need none (one
    update per rollout)."""
    run, keys = runs[0], ("prompt", "prompt_mask", "completion", "completion_mask")
    if not run.need_old or all(r.cfg.old_logp == "sampler" for r in runs):
        return [None] * len(runs)  # (--old-logp sampler: the sampler's own)
    rows = outs[0]["prompt"].shape[0]  # every member samples the same number of rows
    chunks = min(run.cfg.minibatches * run.cfg.grad_accum, rows)
    pieces = []
    ensemble.template.eval()
    try:
        for part in torch.arange(rows).tensor_split(chunks):  # rows of the CPU completions
            subs = [{key: o[key][part].to(run.device) for key in keys} for o in outs]
            with run.autocast:
                logp, _ = ensemble.completion_logp(
                    stack_batches(subs, run.tokenizer.pad_token_id),
                    run.cfg.temperature,
                    chunk_size=run.cfg.logp_chunk,
                    head=run.cfg.lm_head,
                )
            pieces.append(logp.cpu())
    finally:
        ensemble.template.train()
    widths = [o["completion"].shape[1] for o in outs]
    return [torch.cat([p[k, :, : widths[k]] for p in pieces]) for k in range(len(outs))]


def pad_rows(sub: dict[str, Tensor], rows: int) -> dict[str, Tensor]:
    """``sub`` with copies of its first row appended up to ``rows`` rows, their completion and
    loss masks 0 (stand-ins that the batched forward computes and no loss sees)."""
    n = sub["completion"].shape[0]
    if n == rows:
        return sub
    out = {}
    for key, v in sub.items():
        extra = v[:1].expand(rows - n, *v.shape[1:])
        if key in ("completion_mask", "loss_mask"):
            extra = torch.zeros_like(extra)
        out[key] = torch.cat([v, extra])
    return out


class StepRows:
    """The K members' step batches stacked once per step (``[K, N, ...]``, padded to common
    widths as :func:`stack_batches` pads), and their CPU copies' masks, from which
    :meth:`micro_batch` gathers every member's micro-batch with one index per key. None from
    :meth:`of` where the members' batches differ in rows, keys or dtypes, or hold a 2-D tensor
    that the trim would cut but :func:`stack_batches` would not pad."""

    def __init__(
        self, batches: Sequence[dict[str, Tensor]], hosts: Sequence[dict[str, Tensor]], pad_id: int
    ) -> None:
        self.pad_id = pad_id
        self.full = stack_batches(batches, pad_id)
        self.prompt_widths = [b["prompt"].shape[1] for b in batches]
        masks = pad_to_common(
            [{"prompt": h["prompt_mask"], "completion": h["completion_mask"]} for h in hosts], 0
        )
        self.host_prompt = torch.stack(masks["prompt"])
        self.host_completion = torch.stack(masks["completion"])
        self.members = torch.arange(len(batches))[:, None]
        self.at = self.members.to(self.full["prompt"].device)

    def counts(self, runs: Sequence[Run], rows: Sequence[Tensor]) -> list[dict[str, Any]]:
        """:func:`llm.train.minibatch_counts` of every member's minibatch ``rows[k]`` (the same
        number for every member) from one gather of the stacked loss masks."""
        mask = self.full["loss_mask"][self.at, torch.stack(list(rows)).to(self.at.device)]
        both = mask_counts(mask, runs[0].cfg.max_new_tokens)  # [K] each (max_len is shared)
        tokens, seqs = both["num_tokens"].unbind(), both["num_seqs"].unbind()
        return [{**both, "num_tokens": t, "num_seqs": s} for t, s in zip(tokens, seqs, strict=True)]

    @classmethod
    def of(
        cls, batches: Sequence[dict[str, Tensor]], hosts: Sequence[dict[str, Tensor]], pad_id: int
    ) -> StepRows | None:
        first = batches[0]
        same = all(
            set(b) == set(first)
            and all(
                b[k].dtype == first[k].dtype and b[k].shape[0] == first[k].shape[0] for k in first
            )
            for b in batches
        )
        padded = all(
            v.dim() != 2 or k in ("prompt", "prompt_mask") or k in COMPLETION_KEYS
            for k, v in first.items()
        )
        return cls(batches, hosts, pad_id) if same and padded else None

    def micro_batch(self, pieces: Sequence[Tensor]) -> tuple[dict[str, Tensor], list[tuple]]:
        """Member k's rows ``pieces[k]`` (the same number for every member, none empty) as
        :func:`llm.train.trim` cuts them and :func:`stack_batches` stacks them, and each member's
        ``(rows, Tc)``: the bounds from the CPU masks, one read for all K."""
        rows = torch.stack(list(pieces))  # [K, b]
        members = self.members
        seen = self.host_prompt[members, rows].any(1)  # [K, Wp]: a column some row uses
        width = self.host_prompt.shape[-1]
        prompts = torch.where(
            seen.any(-1), width - seen.long().argmax(-1), torch.tensor(self.prompt_widths)
        )
        rights = self.host_completion[members, rows].sum(-1).amax(-1).clamp(min=1)
        prompts_l, rights_l = prompts.tolist(), rights.tolist()
        Tp, Tc = max(prompts_l), max(rights_l)
        device = self.full["prompt"].device
        at = rows.to(device)
        kept = (
            torch.arange(Tp, device=device) >= Tp - prompts.to(device)[:, None, None],
            torch.arange(Tc, device=device) < rights.to(device)[:, None, None],
        )
        out = {}
        for key, value in self.full.items():
            v = value[self.at, at]
            fill = self.pad_id if key in ("prompt", "completion") else 0
            if key in ("prompt", "prompt_mask"):
                v = torch.where(kept[0], v[..., v.shape[-1] - Tp :], fill)
            elif key in COMPLETION_KEYS:
                v = torch.where(kept[1], v[..., :Tc], fill)
            out[key] = v
        return out, [(rows.shape[1], r) for r in rights_l]


def micro_batch(
    runs: Sequence[Run],
    batches: Sequence[dict[str, Tensor]],
    hosts: Sequence[dict[str, Tensor]],
    pieces: Sequence[Tensor],
    step_rows: StepRows | None,
) -> tuple[dict[str, Tensor], list[tuple], list[bool]]:
    """The members' micro-batch ``[K, B, ...]`` (member k's rows ``pieces[k]`` of its batch,
    trimmed as :func:`llm.train.trim` trims them), each member's ``(rows, Tc)`` before padding,
    and which members have no row (a masked stand-in row of theirs rides along). Where every
    member has the same number of rows, one gather per key over the stacked step batches
    (:class:`StepRows`); else each member's rows trimmed, padded and stacked."""
    empty = [p.numel() == 0 for p in pieces]
    if step_rows is not None and not any(empty) and len({p.numel() for p in pieces}) == 1:
        return (*step_rows.micro_batch(pieces), empty)
    subs = []
    for k, run in enumerate(runs):
        rows = pieces[k] if not empty[k] else torch.zeros(1, dtype=torch.long)
        sub = trim(batches[k], hosts[k], rows, run.device)
        sub["loss_mask"] = sub["loss_mask"] * (0 if empty[k] else 1)
        subs.append(sub)
    sizes = [tuple(sub["completion"].shape) for sub in subs]
    subs = [pad_rows(sub, max(b for b, _ in sizes)) for sub in subs]
    return stack_batches(subs, runs[0].tokenizer.pad_token_id), sizes, empty


def ensemble_update(
    runs: Sequence[Run],
    batches: Sequence[dict[str, Tensor]],
    hosts: Sequence[dict[str, Tensor]],
    keeps: Sequence[Tensor],
    step: int,
    *,
    ensemble: Ensemble,
    optimizer: StackedAdamW,
    compiled: CompiledLosses | None = None,
) -> list[StepMetrics]:
    """:func:`llm.train.update` for every run at once: the same permutations, minibatches,
    micro-batches, counts and objective seeds as each run alone, one batched forward and
    backward per micro-batch, then each run's own clipping and optimizer step. A run with no row
    in a minibatch (dynamic sampling dropped them) rides along with a masked stand-in row and
    makes no optimizer step, as alone it makes none. An :data:`llm.train.UpdateFn` once
    ``ensemble`` is given (:func:`batched_update`); ``compiled`` (``--compile-update on``):
    the micro-steps' forward and loss through :class:`CompiledLosses`."""
    cfg, K = runs[0].cfg, len(runs)
    metrics = [StepMetrics(r.device) for r in runs]
    stacked = StepMetrics(runs[0].device, members=K)
    step_rows = StepRows.of(batches, hosts, runs[0].tokenizer.pad_token_id)
    for run in runs:
        run.policy.train()
    for epoch in range(cfg.epochs):
        perms = [minibatch_order(r, keep, step, epoch) for r, keep in zip(runs, keeps, strict=True)]
        splits = [p.tensor_split(cfg.minibatches) for p in perms]  # once per epoch, not per mb
        for mb in range(cfg.minibatches):
            mb_rows = [s[mb] for s in splits]
            active = [r.numel() > 0 for r in mb_rows]
            if not any(active):
                continue
            counts = (
                step_rows.counts(runs, mb_rows)
                if step_rows is not None and len({r.numel() for r in mb_rows}) == 1
                else [
                    minibatch_counts(run, b, r)
                    if a
                    else {"num_tokens": 1.0, "num_seqs": 1.0, "max_len": cfg.max_new_tokens}
                    for run, b, r, a in zip(runs, batches, mb_rows, active, strict=True)
                ]
            )
            for a in range(cfg.grad_accum):
                pieces = (
                    mb_rows
                    if cfg.grad_accum == 1
                    else [r.tensor_split(cfg.grad_accum)[a] for r in mb_rows]
                )
                batch, sizes, empty = micro_batch(runs, batches, hosts, pieces, step_rows)
                generators = [objective_generator(r, step, epoch, mb, a) for r in runs]
                with runs[0].autocast:
                    outs = (compiled or member_losses)(
                        ensemble,
                        batch,
                        [r.loss_fn for r in runs],
                        sizes=sizes,
                        temperature=cfg.temperature,
                        counts=counts,
                        generators=generators,
                        on_policy=[not r.need_old for r in runs],
                        head=cfg.lm_head,
                        chunk_size=cfg.logp_chunk,
                    )
                losses = torch.stack([o.loss for o in outs])
                losses.sum().backward()
                tokens = batch["loss_mask"].sum((1, 2))  # 0 where empty: its mask is zeroed
                stacked.add(losses, [o.metrics for o in outs], tokens, empty, active)
            for k, run in enumerate(runs):
                if active[k] and run.cfg.grad_noise:  # the member's own counterpart forwards
                    share_grads(ensemble, k)
                    probe = grad_noise_update(run, batches[k], hosts[k], mb_rows[k], counts[k])
                    metrics[k].add_means(probe)
                    run.optimizer.zero_grad(set_to_none=True)
            norms = clip_members(ensemble, [r.cfg.max_grad_norm for r in runs]).unbind()
            for k in range(K):
                if active[k]:
                    metrics[k].add_grad_norm(norms[k])
            optimizer.step(active)
            optimizer.zero_grad()
    stacked.split_into(metrics)
    return metrics


def share_grads(ensemble: Ensemble, k: int) -> None:
    """Member k's parameters' ``.grad`` as views of row k of the leaves' gradients (where
    :func:`llm.train.grad_noise_update` reads a run's accumulated gradient)."""
    for name, p in ensemble.member_params(k).items():
        grad = ensemble.leaves[name].grad
        p.grad = None if grad is None else grad[k]


def parse_seeds(text: str) -> list[int]:
    """``--seeds``' ``"0,1,2"`` -> ``[0, 1, 2]``: distinct integers >= 0 (a seed of
    :class:`llm.config.TrainConfig`); anything else (an empty item, as in ``0,1,``, or ``-1``) is
    a one-line ``ValueError`` naming the flag."""
    words = [w.strip() for w in text.split(",")]
    seeds = [int(w) for w in words if w.isascii() and w.isdigit()]
    if len(seeds) < len(words) or len(set(seeds)) < len(seeds):
        raise ValueError(f"--seeds must be distinct comma-separated integers >= 0, got {text!r}")
    return seeds


def main(argv: list[str] | None = None) -> None:
    """``python -m llm.ensemble --seeds 0,1,2 [llm.train flags]``: one run per seed, in
    ``OUT/seed<S>``, trained as one ensemble."""
    parser = CommandParser(
        prog="python -m llm.ensemble",
        usage="%(prog)s --seeds SEEDS [llm.train flags]",
        description="K runs of llm.train, one per seed, trained as one ensemble in one process "
        "(each in OUT/seed<S>, as its own run would be).",
        add_help=False,  # --help also lists llm.train's flags, which the rest of argv is parsed by
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    parser.add_argument(
        "--seeds",
        help="distinct comma-separated seeds >= 0, one run each (required; each member's --seed)",
    )
    known, rest = parser.parse_known_args(argv)
    if known.help:
        parser.print_help()
        print("\nEvery other flag is llm.train's, given to every member:\n", flush=True)
        parse_args(["--help"])  # prints llm.train's help and exits 0
    if known.seeds is None:
        parser.error("the following arguments are required: --seeds")
    try:
        seeds = parse_seeds(known.seeds)
        if any(word.split("=", 1)[0] == "--seed" for word in rest):  # llm.train's, replaced
            raise ValueError(
                "--seed does not apply to an ensemble: each member's seed is one of --seeds"
            )
        base = parse_args(rest)
        cfgs = [
            dataclasses.replace(base, seed=s, out=os.path.join(base.out, f"seed{s}")) for s in seeds
        ]
        try:
            train_ensemble(cfgs)
        except SystemExit as exc:
            signalled_exit(exc, base.out)
            raise
        except KeyboardInterrupt:  # a second Ctrl-C: abort now
            aborted_exit(base.out, own=argv is None)
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
