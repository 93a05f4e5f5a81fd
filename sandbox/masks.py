r"""The two modifiers that compose with any objective: detached 0/1 weights of its per-token loss.

:class:`sandbox.loss.PolicyLoss` applies them (``off_policy_mask=``, ``top_entropy_quantile=``)
after the objective and the rollout IS weight, before the KL and entropy terms are added; they
never change the aggregation's counts (a masked token still counts in ``token-mean``'s
denominator, as in TRL). Both are pure torch, vectorised, with no host sync (no boolean indexing,
no ``.item()``), so an all-masked micro-batch gives a finite 0 and the whole loss compiles.

Off-policy sequence mask (DeepSeek-V3.2, arXiv 2512.02556, Eq. 9; TRL 1.16
``GRPOTrainer.get_off_policy_mask``, option ``off_policy_mask_threshold``)
------------------------------------------------------------------------------------------------

.. math::

    \bar d_i = \frac{\sum_t m_{i,t}\,\big(\log\pi_\text{sampler}(y_{i,t})
               - \mathrm{sg}(\log\pi_\theta(y_{i,t}))\big)}{\max(1, \sum_t m_{i,t})},
    \qquad
    M_i = \mathbb{1}[A_i \ge 0 \;\lor\; \bar d_i \le \delta]

the k1 estimate of KL(pi_sampler || pi_theta) per token, averaged over the sequence's valid
tokens: a sequence is **dropped** when its advantage is negative *and* its mean KL exceeds
``delta`` (strictly; a sequence exactly at ``delta`` is kept). ``pi_sampler`` is the sampler's
log-probs when the caller has them (vLLM: TRL's ``sampling_per_token_logps``), else ``pi_old``,
TRL's choice, so the mask sees both the drift of the updates and the trainer/sampler mismatch.
Gradient weight: the objective's coefficient times ``M_i`` (0 on a dropped sequence, unchanged
elsewhere); ``M`` is detached (it uses ``sg(logp)``). A NaN sampler log-prob (a token the
sampler could not score) contributes 0 to the mean, as in TRL. With per-token advantages
``[B, T]`` the rule applies per token (TRL broadcasts the same way).

High-entropy token mask (Wang et al., "Beyond the 80/20 Rule", arXiv 2506.01939, §4; TRL 1.16
``GRPOTrainer.get_high_entropy_mask``, option ``top_entropy_quantile``)
------------------------------------------------------------------------------------------------

.. math::

    \tau = Q_{1-q}\big(\{H_{i,t} : m_{i,t} = 1\}\big), \qquad M_{i,t} = m_{i,t}\,\mathbb{1}[H_{i,t} \ge \tau]

keep only the top-``q`` share of the valid tokens by (detached) entropy; ``q = 1`` is off (the
paper uses ``q = 0.2``, its "forking tokens"). ``Q_p`` is ``torch.quantile``'s default, linear
interpolation between order statistics: rank ``p (n - 1)`` in the ascending sort of the ``n``
valid entropies. Ties at ``tau`` are all kept (``>=``), so the kept share can exceed ``q`` (a
batch of equal entropies keeps every token). The pool of the quantile is the call's valid tokens
(per block of rows with ``groups=S``: each seed ranks its own tokens), or the ``pool`` passed
(TRL's adapter: the micro-batches of every process, which TRL gathers). Gradient weight: the
objective's coefficient on kept tokens, 0 on the others.

Implementation notes and deviations from TRL:

- none in the threshold's precision: it is computed in float32 whatever the entropies' dtype,
  as TRL does (``entropies[mask].float()``), and compared in the entropies' dtype. In float64 the
  rank ``(1 - q)(n - 1)`` then rounds as TRL's does (``q = 0.95, n = 21``: exactly 1 in float32,
  ``1 + 9e-16`` in float64, which would drop the token at the quantile); the price is that a
  float64 entropy within float32 rounding of the threshold may fall on the other side;
- no ``torch.quantile`` (its input is limited to 2^24 elements and the valid tokens would need
  a boolean index, a host sync): the same rank and ``lerp`` on a sort with padding set to NaN,
  which is ``torch.nanquantile``'s definition, hence ``torch.quantile``'s on the valid tokens;
- the off-policy mean is a ``where`` rather than a product with the mask, so an infinite
  log-prob on a padding token cannot turn the mean into NaN (TRL: NaN, and the sequence dropped
  if its advantage is negative).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "check_off_policy_mask",
    "check_top_entropy_quantile",
    "high_entropy_mask",
    "off_policy_mask",
]


def check_off_policy_mask(value: float | None, name: str = "off_policy_mask") -> None:
    """``None`` (off) or a finite number > 0, else a one-line ``ValueError`` naming ``name``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be None or a finite number > 0, got {value!r}")
    if not value > 0:
        raise ValueError(f"{name} must be None or a finite number > 0, got {value!r}")


def check_top_entropy_quantile(value: float, name: str = "top_entropy_quantile") -> None:
    """A number in (0, 1] (1: off), else a one-line ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1] (1: off), got {value!r}")


def off_policy_mask(
    logp: Tensor, sampler_logp: Tensor, adv: Tensor, mask: Tensor, threshold: float
) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3.2's off-policy sequence mask (module docstring) and the dropped share.

    Args:
        logp: ``[B, T]`` current log-probs (detached here).
        sampler_logp: ``[B, T]`` log-probs of the policy that sampled (the sampler's, or pi_old).
        adv: ``[B]``, ``[B, 1]`` or ``[B, T]`` advantages.
        mask: ``[B, T]`` valid tokens.
        threshold: delta > 0.

    Returns:
        ``keep`` (``[B, 1]``, or ``[B, T]`` with per-token advantages; 0/1 in ``logp``'s dtype)
        and ``off_policy_masked_frac``: the share of non-empty sequences dropped (0-d; with
        per-token advantages the mean over sequences of their dropped share of valid tokens).
    """
    valid = mask != 0
    kl = torch.nan_to_num(sampler_logp.detach() - logp.detach(), nan=0.0)
    lengths = valid.sum(-1, keepdim=True)
    mean_kl = torch.where(valid, kl, 0.0).sum(-1, keepdim=True) / lengths.clamp(min=1)
    adv = adv[:, None] if adv.dim() == 1 else adv
    keep = ((adv.detach() >= 0) | (mean_kl <= threshold)).to(logp.dtype)
    dropped = torch.where(valid, 1.0 - keep, 0.0).sum(-1) / lengths[:, 0].clamp(min=1)
    nonempty = (lengths[:, 0] > 0).sum().clamp(min=1)
    return keep, (dropped.sum() / nonempty).detach()


def masked_quantile(values: Tensor, mask: Tensor, p: float) -> Tensor:
    """``torch.quantile(values[mask != 0], p)`` per row of ``values [R, M]`` (linear
    interpolation), without a boolean index or a size limit; ``[R, 1]``, NaN for an empty row."""
    x = torch.where(mask != 0, values, math.nan).sort(-1).values  # NaN sorts last
    count = (mask != 0).sum(-1, keepdim=True)
    rank = (p * (count - 1).to(x.dtype)).clamp(min=0)  # nanquantile: p (n - 1), 0 if empty
    below = rank.long()
    above = rank.ceil().long()
    return x.gather(-1, below).lerp(x.gather(-1, above), rank - below)


def high_entropy_mask(
    entropy: Tensor,
    mask: Tensor,
    quantile: float,
    *,
    groups: int | None = None,
    pool: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """The top-``quantile`` tokens by entropy (module docstring) and the masked share.

    Args:
        entropy: ``[B, T]`` per-token entropy (detached here).
        mask: ``[B, T]`` valid tokens.
        quantile: q in (0, 1]; the threshold is the (1 - q) quantile of the pool's entropies.
        groups: ``S`` equal consecutive blocks of rows, each with its own threshold.
        pool: ``(entropies, mask)`` of any shape to take the threshold over instead of the
            call's own tokens (not with ``groups > 1``).

    Returns:
        ``keep`` (``[B, T]``, 0/1 in ``entropy``'s dtype, 0 on padding) and
        ``entropy_masked_frac``: the share of valid tokens masked out (0-d).
    """
    h = entropy.detach()
    work = torch.float32  # TRL's precision for the threshold (module docstring)
    B = h.shape[0]
    S = groups or 1
    if pool is not None:
        if S > 1:
            raise ValueError("pool cannot be combined with groups > 1 (one threshold per group)")
        values, pool_mask = pool
        tau = masked_quantile(
            values.detach().to(work).reshape(1, -1), pool_mask.reshape(1, -1), 1.0 - quantile
        )
    else:
        if B % S:
            raise ValueError(f"groups must divide the batch's {B} rows, got {groups}")
        tau = masked_quantile(h.to(work).reshape(S, -1), mask.reshape(S, -1), 1.0 - quantile)
    tau = tau.to(h.dtype).repeat_interleave(B // S if pool is None else B, dim=0)  # [B, 1]
    valid = mask != 0
    keep = valid & (h >= tau)
    n_valid = valid.sum()
    frac = (n_valid - keep.sum()).to(h.dtype) / n_valid.clamp(min=1).to(h.dtype)
    return keep.to(h.dtype), frac
