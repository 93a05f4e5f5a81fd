"""REINFORCE family without a ratio surrogate: GPG (plain -A log pi) and DRO's quadratic penalty."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import (
    LOG_RATIO_CLAMP,
    Batch,
    CoefFn,
    RatioObjective,
    Zone,
    as_tensor_pair,
    check_range,
    register_objective,
)


@register_objective("gpg")
class GPG(RatioObjective):
    r"""GPG: group policy gradient, plain REINFORCE on the group advantage (no ratio, no clip).

    Equation: ``loss_t = -A_t * logp_t``.

    Gradient weight: ``coef = A`` for every token, whatever the ratio (``g = 1``): off-policy
    updates (mu > 1) are not importance-weighted and nothing is clipped. On-policy it equals every
    ratio rule, whose ``g(1) = 1``.

    Paper: GPG, arXiv 2504.02546 §3 (the loss ``-A log pi``; the paper's advantage correction and
    threshold filtering live in the advantage, not here). verl ``loss_mode=gpg``.

    Deviations: none in the loss (verl's is the same expression); no importance weight, so no
    ±20 clamp is involved.
    """

    through_ratio = False
    paper = "2504.02546"

    def __init__(self) -> None:
        pass

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        return torch.ones_like(ratio)

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        return b.neg_adv * b.logp, lambda: b.adv, {}


@register_objective("dro")
class DRO(RatioObjective):
    r"""DRO: REINFORCE with a quadratic log-ratio penalty instead of a clip.

    Equation (``l_t = log r_t = logp_t - logp_old_t``)::

        loss_t = -(A_t * logp_t - beta / 2 * l_t^2)

    Gradient weight: ``coef = A - beta * log r`` — not of the form ``g * A``: the penalty pulls
    ``log r`` back to 0 with strength ``beta`` whatever the sign of A (and on tokens with A = 0).
    A > 0: the push up fades as log r approaches A / beta and reverses beyond; A < 0 likewise below
    A / beta. Nothing is ever clipped.

    Paper: Direct Reward Optimization's regularised objective (Richemond et al., arXiv 2405.19107
    §3) in the per-token form verl ships as ``loss_mode=dro`` with ``policy_loss.dro_beta``; verl
    requires beta > 0 and has no default, 0.1 here.

    Deviations: the log-ratio's value is clamped to ±20 (docs/objectives.md §1) with the gradient
    passing (as for the sequence ratio), so beyond ±20 the penalty's pull is beta * (±20); verl
    does not clamp (the same below ±20). The coefficient is affine, not proportional, in A:
    ``sandbox.exact`` handles it for discrete rewards and refuses Gaussian ones (``noise_std``),
    whose sign split needs ``coef(r, c A) = c coef(r, A)``.
    """

    through_ratio = False
    coef_homogeneous = False
    paper = "2405.19107"

    def __init__(self, beta: float = 0.1) -> None:
        self.beta = check_range("beta", beta, 0.0, low_open=True)

    def expected_coef(self, ratio: Tensor | float, adv: Tensor | float) -> Tensor:
        ratio, adv = as_tensor_pair(ratio, adv)
        return adv - self.beta * ratio.log()

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        # the clamp acts on the value only (as for the sequence ratio): gradient 1 everywhere
        excess = b.raw_lr.detach() - b.raw_lr.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        lr = b.raw_lr - excess  # 0 at masked positions
        loss = b.neg_adv * b.logp + 0.5 * self.beta * lr.square()
        return loss, lambda: b.adv - self.beta * lr.detach(), {}
