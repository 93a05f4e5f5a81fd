"""Advantage estimators for group-sampled rollouts (docs/objectives.md §7).

Rewards come as ``[num_groups, G]`` (G completions per prompt) or flat ``[num_groups * G]`` with
``group_size=G`` (groups contiguous); the result has the input's shape.

========== ==============================================================================
method     advantage of completion i in its group
========== ==============================================================================
grpo       (R_i - mean_G R) / (std_G R + eps), std Bessel-corrected as in TRL and verl
dr_grpo    R_i - mean_G R                                            (Dr. GRPO, no std)
rloo       R_i - mean_{j != i} R_j = G/(G-1) (R_i - mean_G R)        (leave-one-out)
batch_std  (R_i - mean_G R) / (std of the batch's rewards + eps)   (TRL scale_rewards="batch")
none       R_i
========== ==============================================================================

Groups whose rewards are all equal get advantage exactly 0 for every method but ``none``
(DAPO's dynamic sampling drops them; :func:`zero_variance_groups` finds them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

ADVANTAGE_METHODS: dict[str, Callable[[Tensor, float], Tensor]] = {}

#: Methods that normalise over the whole batch rather than within a group.
BATCH_ADVANTAGE_METHODS: frozenset[str] = frozenset({"batch_std"})


def _register(name: str):
    def wrap(fn: Callable[[Tensor, float], Tensor]) -> Callable[[Tensor, float], Tensor]:
        ADVANTAGE_METHODS[name] = fn
        return fn

    return wrap


def _centred(r: Tensor) -> Tensor:
    return r - r.mean(-1, keepdim=True)


@_register("grpo")
def _grpo(r: Tensor, eps: float) -> Tensor:
    return _centred(r) / (r.std(-1, keepdim=True, correction=1) + eps)


@_register("dr_grpo")
def _dr_grpo(r: Tensor, eps: float) -> Tensor:
    return _centred(r)


@_register("rloo")
def _rloo(r: Tensor, eps: float) -> Tensor:
    g = r.shape[-1]
    return _centred(r) * (g / (g - 1))


@_register("batch_std")
def _batch_std(r: Tensor, eps: float) -> Tensor:
    return _centred(r) / (r.std(correction=1) + eps)


@_register("none")
def _none(r: Tensor, eps: float) -> Tensor:
    return r.clone()


def _grouped(rewards: Tensor, group_size: int | None) -> Tensor:
    if not isinstance(rewards, Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if rewards.dim() == 2 and group_size in (None, rewards.shape[1]):
        grouped = rewards
    elif rewards.dim() == 1:
        if group_size is None or group_size < 1 or rewards.numel() % group_size:
            raise ValueError(
                f"group_size must divide the number of rewards {rewards.numel()}, got {group_size}"
            )
        grouped = rewards.view(-1, group_size)
    else:
        raise ValueError(
            f"rewards must be [num_groups, G] or flat with group_size, got {tuple(rewards.shape)}"
        )
    if not bool(torch.isfinite(grouped).all()):
        raise ValueError("rewards contain NaN or Inf")
    return grouped


def compute_advantages(
    rewards: Tensor, group_size: int | None = None, *, method: str = "grpo", eps: float = 1e-6
) -> Tensor:
    """Advantages per completion (detached, the shape of ``rewards``)."""
    if method not in ADVANTAGE_METHODS:
        raise ValueError(f"method must be one of {sorted(ADVANTAGE_METHODS)}, got {method!r}")
    grouped = _grouped(rewards, group_size)
    if method in ("grpo", "rloo") and grouped.shape[-1] < 2:
        raise ValueError(f"group_size must be >= 2 for method {method!r}")
    adv = ADVANTAGE_METHODS[method](grouped.detach(), eps)
    return adv.reshape(rewards.shape)


def seed_advantages(rewards: Tensor, group_size: int, method: str = "grpo") -> Tensor:
    """Advantages of ``[S, N]`` rewards of S independent seeds (groups of ``group_size``
    consecutive rows within each seed): one call for all groups of all seeds, or one per seed for
    a method of :data:`BATCH_ADVANTAGE_METHODS`, so no seed's advantages see another's rewards."""
    if method in BATCH_ADVANTAGE_METHODS:
        return torch.stack([compute_advantages(r, group_size, method=method) for r in rewards])
    grouped = rewards.reshape(-1, group_size)
    return compute_advantages(grouped, group_size, method=method).view(rewards.shape)


def zero_variance_groups(rewards: Tensor, group_size: int | None = None) -> Tensor:
    """Boolean ``[num_groups]``: groups whose rewards are all equal (no learning signal)."""
    grouped = _grouped(rewards, group_size)
    return (grouped == grouped[..., :1]).all(-1)
