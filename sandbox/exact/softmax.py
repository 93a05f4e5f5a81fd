"""Softmax-policy quantities used by the exact theory: entropy and the entropy–covariance law.

Notation: logits ``z [..., K]``, ``pi = softmax(z)``, expectations over the last axis under ``pi``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy", "entropy_covariance_prediction", "expected_value", "log_softmax"]


def log_softmax(logits: Tensor) -> Tensor:
    """``log softmax(z)`` over the last axis: ``z - max z - log sum exp(z - max z)``.

    Same values as ``torch.log_softmax``; written with elementwise ops and plain reductions because
    ATen's softmax kernel parallelises over rows even for tiny ``[P, K]`` inputs, and on a busy
    machine waking the thread pool then costs milliseconds per call (a flow makes thousands).
    """
    shifted = logits - logits.amax(-1, keepdim=True)
    return shifted - shifted.exp().sum(-1, keepdim=True).log()


def _pi_logpi(logits: Tensor) -> tuple[Tensor, Tensor]:
    logp = log_softmax(logits)
    return logp.exp(), logp


def _xlogp(pi: Tensor, x: Tensor) -> Tensor:
    """``pi * x`` with 0 where ``pi == 0`` (so ``-inf`` log-probs of masked arms contribute 0)."""
    return torch.where(pi > 0, pi * x, torch.zeros_like(pi))


def entropy(logits: Tensor) -> Tensor:
    """Shannon entropy in nats of ``softmax(logits)``.

    ``H(z) = -sum_a pi(a) log pi(a)``.

    Args:
        logits: ``[..., K]``.

    Returns:
        ``[...]``.
    """
    pi, logp = _pi_logpi(logits)
    return -_xlogp(pi, logp).sum(-1)


def expected_value(logits: Tensor, values: Tensor) -> Tensor:
    """``E_{a ~ softmax(z)}[v(a)] = sum_a pi(a) v(a)``: ``logits [..., K]``, ``values`` broadcastable
    to it; returns ``[...]`` (e.g. the pass rate when ``values`` are success probabilities)."""
    return (log_softmax(logits).exp() * values).sum(-1)


def entropy_covariance_prediction(logits: Tensor, dz: Tensor) -> Tensor:
    """First-order entropy change of a softmax policy under a logit step (arXiv 2505.22617).

    ``H(z + dz) - H(z) ≈ -Cov_{a~pi}(log pi(a), dz_a)
                       = -sum_a pi(a) (log pi(a) - E_pi[log pi]) (dz_a - E_pi[dz])``

    (from ``dH/dz_b = -pi(b) (log pi(b) - E_pi[log pi])``; docs/objectives.md §10.8). Vanilla
    policy gradient has ``dz = eta * pi ⊙ A``, natural policy gradient ``dz = eta * A``; the error
    is O(|dz|^2).

    Args:
        logits: ``[..., K]`` the current logits z.
        dz: ``[..., K]`` the logit change of the step (broadcastable to ``logits``).

    Returns:
        ``[...]`` the predicted entropy change in nats.
    """
    pi, logp = _pi_logpi(logits)
    dz = torch.broadcast_to(dz, pi.shape)
    mean_logp = _xlogp(pi, logp).sum(-1, keepdim=True)
    mean_dz = (pi * dz).sum(-1, keepdim=True)
    return -_xlogp(pi, (logp - mean_logp) * (dz - mean_dz)).sum(-1)
