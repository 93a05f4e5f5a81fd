"""Per-token KL estimators to a reference policy (Schulman 2020, "Approximating KL divergence").

With samples from pi (the current policy) and ``d = logp_ref - logp``:

====  ======================  =========================================================
k1    ``-d = logp - logp_ref``  unbiased for KL(pi || ref), high variance, can be < 0
k2    ``d^2 / 2``               biased, low variance
k3    ``exp(d) - 1 - d``        unbiased for KL(pi || ref), >= 0, low variance
====  ======================  =========================================================

This is the convention of verl (``kl_penalty="low_var_kl"`` is k3, clamped there to [-10, 10]) and of
TRL's ``per_token_kl``. ``d`` is clamped to ±20 here (as the objectives' log-ratio), so k3 stays
finite. The objectives' own metric ``kl_k3`` is k3 of the old->current ratio (KL(pi_old || pi)).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .objectives import LOG_RATIO_CLAMP

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_divergence(logp: Tensor, logp_ref: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL estimate (differentiable in ``logp``; ``logp_ref`` is detached)."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {list(KL_ESTIMATORS)}, got {kind!r}")
    if logp.shape != logp_ref.shape:
        raise ValueError(
            f"logp_ref must have the shape of logp {tuple(logp.shape)}, got {tuple(logp_ref.shape)}"
        )
    d = (logp_ref.detach() - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d.square()
    return torch.expm1(d) - d


def k1(logp: Tensor, logp_ref: Tensor) -> Tensor:
    return kl_divergence(logp, logp_ref, "k1")


def k2(logp: Tensor, logp_ref: Tensor) -> Tensor:
    return kl_divergence(logp, logp_ref, "k2")


def k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    return kl_divergence(logp, logp_ref, "k3")
