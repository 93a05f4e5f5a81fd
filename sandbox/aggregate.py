"""Reduce a per-token loss ``[B, T]`` to a scalar, in verl's four modes (docs/objectives.md §7).

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

from collections.abc import Callable

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
    validate: bool = True,
) -> Tensor:
    """Aggregate a per-token loss.

    Args:
        loss: ``[B, T]`` per-token loss (e.g. ``ObjectiveOutput.loss``).
        mask: ``[B, T]`` 1 for valid tokens, 0 for padding (bool, or a number dtype holding only
            0 and 1).
        mode: one of :data:`AGGREGATION_MODES`.
        num_tokens: global number of valid tokens (token-mean), for micro-batching; ``> 0``.
        num_seqs: global number of non-empty sequences (seq-mean-*), for micro-batching; ``> 0``.
        max_len: the constant L of ``seq-mean-token-sum-norm`` (default: T, as verl): the
            longest a sequence may be, so no sequence may hold more than L valid tokens (checked
            under ``validate``; all-padding columns beyond L are harmless).
        groups: split the rows into this many equal consecutive blocks (e.g. independent seeds
            trained in one batch), aggregate each block with its own counts and return the sum,
            so each block's gradient is that of its own aggregate. ``num_tokens`` / ``num_seqs``
            then count per block (a number, or a ``[groups]`` tensor).
        validate: check the values of ``mask`` (only 0/1, not empty), of tensor counts (> 0)
            and ``max_len`` against the longest sequence, as the objectives check their inputs:
            one device->host read. With ``validate=False`` nothing reads the device (a nonzero
            mask entry counts as valid; an empty mask gives 0), for hot loops whose inputs are
            known to be clean. Python-number arguments are always checked.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"mode must be one of {list(AGGREGATION_MODES)}, got {mode!r}")
    for name, x in (("loss", loss), ("mask", mask)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if loss.dim() != 2:
        raise ValueError(f"loss must have shape [B, T], got {tuple(loss.shape)}")
    if mask.shape != loss.shape:
        raise ValueError(
            f"mask must have the shape of loss {tuple(loss.shape)}, got {tuple(mask.shape)}"
        )
    G = 1 if groups is None else groups
    if isinstance(G, bool) or not isinstance(G, int) or G < 1 or loss.shape[0] % G:
        raise ValueError(f"groups must be a positive divisor of B={loss.shape[0]}, got {groups!r}")
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, int | float):
            raise ValueError(f"max_len must be a number, got {max_len!r}")
        if not max_len > 0:  # also refuses NaN
            raise ValueError(f"max_len must be positive, got {max_len}")
    counts = {"num_tokens": num_tokens, "num_seqs": num_seqs}
    tensors = {k: v for k, v in counts.items() if _check_count(k, v, G) is not None}
    if validate:
        _check_mask_and_counts(mask, tensors, max_len)
    mask = mask if mask.dtype == torch.bool else mask != 0
    masked = torch.where(mask, loss, 0.0)  # also keeps NaN/inf on padding out of the gradient
    masked, mask = masked.view(G, -1, loss.shape[1]), mask.view(G, -1, loss.shape[1])

    def count(given: Tensor | float | None, default: Callable[[], Tensor]) -> Tensor:
        """The denominator ``max(count, 1)`` of each block, ``[G]``: ``default()`` counts it."""
        if given is None:
            return default().to(loss.dtype).clamp(min=1)
        if isinstance(given, Tensor):
            n = torch.as_tensor(given, dtype=loss.dtype, device=loss.device)
            return n.expand(G).clamp(min=1)
        # a number: max(given, 1) then rounded equals rounded then clamped (rounding is monotone
        # and keeps 1), one tensor op fewer
        return torch.as_tensor(max(given, 1), dtype=loss.dtype, device=loss.device).expand(G)

    if mode == "token-mean":
        n = count(num_tokens, lambda: torch.count_nonzero(mask, dim=(1, 2)))
        return (masked.sum((1, 2)) / n).sum()
    lengths = torch.count_nonzero(mask, dim=-1).to(loss.dtype)  # [G, B / G]
    per_seq = masked.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / lengths.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / (loss.shape[-1] if max_len is None else max_len)
    n = count(num_seqs, lambda: torch.count_nonzero(lengths, dim=-1))
    return (per_seq.sum(-1) / n).sum()


def _check_count(name: str, value: Tensor | float | None, groups: int) -> Tensor | None:
    """Check a global count: a number > 0 (checked here), or a tensor of one value or ``groups``
    values (returned, for the value check under ``validate``)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        if value.numel() not in (1, groups) or value.dim() > 1:
            raise ValueError(
                f"{name} must be a number or a tensor of 1 or groups={groups} values, "
                f"got shape {tuple(value.shape)}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number or a tensor, got {value!r}")
    if not value > 0:  # also refuses NaN
        raise ValueError(f"{name} must be positive, got {value}")
    return None


def _check_mask_and_counts(mask: Tensor, counts: dict[str, Tensor], max_len: float | None) -> None:
    """One device->host read: the mask holds only 0/1 and is not empty, every count is > 0, no
    sequence is longer than ``max_len``."""
    with torch.no_grad():
        ok = mask.any()
        if mask.dtype != torch.bool:
            ok = ok & ((mask == 0) | (mask == 1)).all()
        for c in counts.values():
            ok = ok & (c.to(device=mask.device) > 0).all()
        if max_len is not None:
            longest = torch.count_nonzero(mask, dim=-1).max()
            ok = ok & (longest <= max_len)
        if bool(ok):
            return
        if mask.dtype != torch.bool:
            bad = mask[(mask != 0) & (mask != 1)]
            if bad.numel():
                raise ValueError(
                    "mask must hold only 0 and 1 (or be bool), got values "
                    f"{bad.unique()[:5].tolist()}"
                )
        if not bool(mask.any()):
            raise ValueError("mask is empty: no valid token to aggregate over")
        for name, c in counts.items():
            if not bool((c > 0).all()):
                raise ValueError(f"{name} must be positive, got {c.tolist()}")
        raise ValueError(
            f"max_len must be at least the longest sequence ({int(longest)} valid tokens), "
            f"got {max_len}"
        )
