"""Reduce a per-token loss ``[B, T]`` to a scalar, in the four modes of spec §5 (verl's names).

=========================== ===================================================================
mode                        scalar
=========================== ===================================================================
``token-mean``              sum_{i,t} m l / N_tokens                       (DAPO; verl default)
``seq-mean-token-mean``     1/N_seqs sum_i (sum_t m l / |o_i|)             (GRPO, GSPO)
``seq-mean-token-sum``      1/N_seqs sum_i sum_t m l
``seq-mean-token-sum-norm`` 1/N_seqs sum_i sum_t m l / L                   (Dr. GRPO; L constant)
=========================== ===================================================================

Micro-batching: pass the *global* ``num_tokens`` (token-mean) or ``num_seqs`` (seq-mean-*) of the
whole batch, and the sum of the micro-batch results equals the full-batch result exactly, so
gradient accumulation does not change the gradient. Without them, the counts of ``mask`` are used.
Sequences with no valid token are not counted in ``N_seqs``.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATION_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def aggregate(
    loss: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    max_len: float | None = None,
) -> Tensor:
    """Aggregate a per-token loss.

    Args:
        loss: ``[B, T]`` per-token loss (e.g. ``ObjectiveOutput.loss``).
        mask: ``[B, T]`` 1 for valid tokens.
        mode: one of :data:`AGGREGATION_MODES`.
        num_tokens: global number of valid tokens (token-mean), for micro-batching.
        num_seqs: global number of non-empty sequences (seq-mean-*), for micro-batching.
        max_len: the constant L of ``seq-mean-token-sum-norm`` (default: T, as verl).
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {list(AGGREGATION_MODES)}, got {mode!r}")
    if loss.dim() != 2:
        raise ValueError(f"loss must have shape [B, T], got {tuple(loss.shape)}")
    if mask.shape != loss.shape:
        raise ValueError(
            f"mask must have the shape of loss {tuple(loss.shape)}, got {tuple(mask.shape)}"
        )
    mask = mask if mask.dtype == torch.bool else mask != 0
    masked = torch.where(mask, loss, 0.0)  # also keeps NaN/inf on padding out of the gradient
    if mode == "token-mean":
        if num_tokens is None:
            n = torch.count_nonzero(mask).to(loss.dtype)
        else:
            n = torch.as_tensor(num_tokens, dtype=loss.dtype, device=loss.device)
        return masked.sum() / n.clamp(min=1)
    lengths = torch.count_nonzero(mask, dim=-1).to(loss.dtype)
    per_seq = masked.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / lengths.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        length = loss.shape[-1] if max_len is None else max_len
        if length <= 0:
            raise ValueError(f"max_len must be positive, got {length}")
        per_seq = per_seq / length
    if num_seqs is None:
        n = (lengths > 0).to(loss.dtype).sum()
    else:
        n = torch.as_tensor(num_seqs, dtype=loss.dtype, device=loss.device)
    return per_seq.sum() / n.clamp(min=1)
