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
    groups: int | None = None,
) -> Tensor:
    """Aggregate a per-token loss.

    Args:
        loss: ``[B, T]`` per-token loss (e.g. ``ObjectiveOutput.loss``).
        mask: ``[B, T]`` 1 for valid tokens.
        mode: one of :data:`AGGREGATION_MODES`.
        num_tokens: global number of valid tokens (token-mean), for micro-batching.
        num_seqs: global number of non-empty sequences (seq-mean-*), for micro-batching.
        max_len: the constant L of ``seq-mean-token-sum-norm`` (default: T, as verl).
        groups: split the rows into this many equal consecutive blocks (e.g. independent seeds
            trained in one batch), aggregate each block with its own counts and return the sum,
            so each block's gradient is that of its own aggregate. ``num_tokens`` / ``num_seqs``
            then count per block (a number, or a ``[groups]`` tensor).
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {list(AGGREGATION_MODES)}, got {mode!r}")
    if loss.dim() != 2:
        raise ValueError(f"loss must have shape [B, T], got {tuple(loss.shape)}")
    if mask.shape != loss.shape:
        raise ValueError(
            f"mask must have the shape of loss {tuple(loss.shape)}, got {tuple(mask.shape)}"
        )
    G = 1 if groups is None else groups
    if isinstance(G, bool) or not isinstance(G, int) or G < 1 or loss.shape[0] % G:
        raise ValueError(f"groups must be a positive divisor of B={loss.shape[0]}, got {groups!r}")
    mask = mask if mask.dtype == torch.bool else mask != 0
    masked = torch.where(mask, loss, 0.0)  # also keeps NaN/inf on padding out of the gradient
    masked, mask = masked.view(G, -1, loss.shape[1]), mask.view(G, -1, loss.shape[1])

    def count(given: Tensor | float | None, default: Tensor) -> Tensor:
        if given is None:
            return default.to(loss.dtype)
        return torch.as_tensor(given, dtype=loss.dtype, device=loss.device).expand(G)

    if mode == "token-mean":
        n = count(num_tokens, torch.count_nonzero(mask, dim=(1, 2)))
        return (masked.sum((1, 2)) / n.clamp(min=1)).sum()
    lengths = torch.count_nonzero(mask, dim=-1).to(loss.dtype)  # [G, B / G]
    per_seq = masked.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / lengths.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        length = loss.shape[-1] if max_len is None else max_len
        if length <= 0:
            raise ValueError(f"max_len must be positive, got {length}")
        per_seq = per_seq / length
    n = count(num_seqs, torch.count_nonzero(lengths, dim=-1))
    return (per_seq.sum(-1) / n.clamp(min=1)).sum()
