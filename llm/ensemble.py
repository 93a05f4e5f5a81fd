"""K runs' training forward and update as one batched computation: the members of an ensemble
(seeds, or rules, of one model architecture) share every kernel launch of the training forward.

A study of many paired seeds runs the same small model K times. On a GPU each run alone is
launch-bound; here the members' decoder bodies run as one ``torch.func.vmap`` over the stacked
parameters (``functional_call`` on a parameter-free template of the architecture), so every linear
layer is one batched matmul over the K members:

    hidden[k] = body(theta_k; prompt_k ++ completion_k)          # vmap over k, [K, B, T, H]
    logp[k], entropy[k] = LM head_k(hidden[k])                    # llm.logprobs, per member
    loss      = sum_k PolicyLoss_k(logp[k], ...)                   # sandbox.loss, per member
    grad      -> per-member gradient-norm clipping -> one AdamW over every member's parameters

Why this equals K separate runs: the members share no parameter, so ``d loss / d theta_k`` is
member k's own gradient (the sum only routes each loss to its member); clipping uses each member's
own norm (``torch.nn.utils.clip_grad_norm_`` per member, the same formula as a run's); AdamW is
elementwise, so one optimizer over the union of parameters keeps K independent states and makes
K independent updates (``tests/test_llm_ensemble.py``: 2 members after 2 steps equal 2 separate
runs, float64). The stacked parameters are built with ``torch.stack`` of the members' own
parameters at each forward, so the members stay ordinary modules that ``generate``, save and
checkpoint as before, and their gradients arrive in their own ``.grad``.

The members' batches are padded to common widths (prompts on the left, completions on the right:
masked positions, so the result is the member's own to float rounding). Stochastic objectives get
one generator per member, as a run's micro-step seeds it.

What this module is not (yet): a trainer. The members' rollouts are generated one member after
another with :func:`llm.rollout.generate` (batched decoding over members needs a cache that lives
inside ``vmap``), and ``llm.train`` has no ensemble flag; :func:`ensemble_step` is the tested
batched core (log-probs and update of K members given their rollouts) that such a driver calls.
The members run without gradient checkpointing (the template is called inside ``vmap``), so the
activation memory is K runs'.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from llm.logprobs import _LogProbHead, _unwrap, check_no_post_head_transform, default_chunk_size
from llm.rollout import pad_to_common
from sandbox.loss import LossOutput, PolicyLoss


class Ensemble:
    """K members of one architecture (Hugging Face causal LMs, e.g. ``llm.model.tiny_model`` with
    K seeds); :meth:`completion_logp` runs their decoder bodies as one ``vmap``."""

    def __init__(self, members: Sequence[torch.nn.Module]) -> None:
        if len(members) < 1:
            raise ValueError("members must hold at least one model")
        bases = [_unwrap(m) for m in members]
        names = [[n for n, _ in b.base_model.named_parameters()] for b in bases]
        if any(n != names[0] for n in names):
            raise ValueError("members must share one architecture (the same parameter names)")
        for base in bases:
            check_no_post_head_transform(base)
        self.members = list(members)
        self.bases = bases
        # a parameter-free copy of the decoder body: functional_call supplies every tensor
        self.template = copy.deepcopy(bases[0].base_model).to("meta")
        if getattr(self.template, "gradient_checkpointing", False):
            self.template.gradient_checkpointing = False

    def __len__(self) -> int:
        return len(self.members)

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every member's trainable parameters, member after member (for one optimizer)."""
        return [p for m in self.members for p in m.parameters() if p.requires_grad]

    def stacked_body_state(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The members' body parameters and buffers stacked on a new leading dimension
        (differentiable: gradients reach each member's own parameters)."""
        bodies = [b.base_model for b in self.bases]
        params = {
            name: torch.stack([dict(b.named_parameters())[name] for b in bodies])
            for name, _ in bodies[0].named_parameters()
        }
        buffers = {
            name: torch.stack([dict(b.named_buffers())[name] for b in bodies])
            for name, _ in bodies[0].named_buffers()
        }
        return params, buffers

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

        def body(p: dict, b: dict, x: Tensor, m: Tensor, pos: Tensor) -> Tensor:
            kwargs = dict(input_ids=x, attention_mask=m, position_ids=pos, use_cache=False)
            out = torch.func.functional_call(self.template, (p, b), (), kwargs)
            return out.last_hidden_state

        hidden = torch.func.vmap(body)(params, buffers, ids, masks, positions)
        Tc = completion.shape[-1]
        stats = []
        for k, base in enumerate(self.bases):
            linear = base.get_output_embeddings()
            size = chunk_size or default_chunk_size(linear.out_features)
            lm_head = _LogProbHead(
                linear,
                completion[k],
                batch["completion_mask"][k],
                temperature=float(temperature),
                chunk_size=size,
                with_entropy=entropy is not None,
                kernel=head,
            )
            stats.append(lm_head(hidden[k, :, -(Tc + 1) :]))
        stats = torch.stack(stats)
        logp = stats[..., 0]
        if entropy is None:
            return logp, None
        ent = stats[..., 1]
        return logp, ent if entropy == "grad" else ent.detach()


def stack_batches(batches: Sequence[dict[str, Tensor]], pad_id: int) -> dict[str, Tensor]:
    """K members' batches as ``[K, B, ...]`` tensors, padded to common widths
    (:func:`llm.rollout.pad_to_common`: prompts on the left, per-token tensors on the right)."""
    return {k: torch.stack(rows) for k, rows in pad_to_common(list(batches), pad_id).items()}


def ensemble_step(
    ensemble: Ensemble,
    batch: dict[str, Tensor],
    loss_fns: Sequence[PolicyLoss],
    optimizer: torch.optim.Optimizer,
    *,
    temperature: float,
    max_grad_norm: float,
    counts: Sequence[dict[str, Any]] | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
    on_policy: bool = False,
) -> tuple[list[LossOutput], Tensor]:
    """One optimizer step of every member on its own (micro-)batch, as K runs would make it:
    the batched forward, member k's loss with ``loss_fns[k]`` (``batch["logp_old"][k]``, or
    ``logp.detach()`` with ``on_policy``), one backward, each member's gradient clipped to
    ``max_grad_norm`` by its own norm, one ``optimizer.step()`` (an optimizer over
    :meth:`Ensemble.parameters`). Returns the members' loss outputs and their gradient norms
    ``[K]`` (before clipping)."""
    K = len(ensemble)
    if len(loss_fns) != K:
        raise ValueError(f"loss_fns must hold one PolicyLoss per member ({K}), got {len(loss_fns)}")
    needs_entropy = any(f.entropy_coef > 0 or f.top_entropy_quantile < 1 for f in loss_fns)
    logp, ent = ensemble.completion_logp(
        batch, temperature, entropy="grad" if needs_entropy else "metric"
    )
    outs = []
    for k, loss_fn in enumerate(loss_fns):
        out = loss_fn(
            logp[k],
            logp[k].detach() if on_policy else batch["logp_old"][k],
            batch["adv"][k],
            batch["loss_mask"][k] if "loss_mask" in batch else batch["completion_mask"][k],
            logp_ref=batch["logp_ref"][k] if "logp_ref" in batch else None,
            rollout_logp=batch["rollout_logp"][k] if "rollout_logp" in batch else None,
            entropy=ent[k],
            generator=None if generators is None else generators[k],
            validate=False,
            **({} if counts is None else counts[k]),
        )
        outs.append(out)
    torch.stack([o.loss for o in outs]).sum().backward()
    norms = torch.stack(
        [
            torch.nn.utils.clip_grad_norm_(
                [p for p in m.parameters() if p.requires_grad], max_grad_norm
            )
            for m in ensemble.members
        ]
    )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return outs, norms
