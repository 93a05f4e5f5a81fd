"""Covariance-based entropy control (arXiv 2505.22617): Clip-Cov and KL-Cov.

Both rank tokens by ``Cov_t = (A_t - mean A)(logp_t - mean logp)`` (means over the valid tokens of
the batch), so they depend on batch statistics and have no closed-form ``expected_coef``. The token
choice is made without a device->host sync: the number of tokens to pick,
``max(1, floor(ratio * n_valid))``, stays a tensor, and ``topk`` runs with the static upper bound
``max(1, floor(ratio * B * T))``.

With ``groups=G`` (independent batches stacked into one call, e.g. the seeds of a trainer) the
means, the count and the choice are per block of ``B / G`` rows: ``topk`` runs on the
``[G, B/G * T]`` view with the bound ``max(1, floor(ratio * B/G * T))`` per block, so one call gives
what ``G`` calls on the blocks give (the random keys of Clip-Cov are drawn for all blocks at once).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import (
    Batch,
    CoefFn,
    RatioObjective,
    Zone,
    check_range,
    register_objective,
    valid_share,
)
from .clip import PPOClip


def token_covariance(b: Batch) -> Tensor:
    """``Cov_t = (A_t - mean A)(logp_t - mean logp)``, means over valid tokens (of the token's own
    block of rows with ``b.groups``; detached).

    Meaningless on padding: callers restrict their choice to ``b.mask``."""
    logp = b.logp.detach()  # 0 on padding, as adv: plain sums are masked sums
    n = b.n
    return (b.adv - b.spread(b.total(b.adv) / n)) * (logp - b.spread(b.total(logp) / n))


def pick_top(
    scores: Tensor, eligible: Tensor, ratio: float, n_valid: Tensor, groups: int | None = None
) -> Tensor:
    """Boolean mask of the ``max(1, floor(ratio * n_valid))`` eligible entries with the largest score
    (fewer if fewer are eligible). Sync-free: ``topk`` uses a static bound on the count.

    With ``groups=G``, ``n_valid`` is ``[G]`` and each block of ``B / G`` consecutive rows picks its
    own count among its own entries."""
    G = 1 if groups is None else groups
    flat = torch.where(eligible, scores, -math.inf).reshape(G, -1)
    size = flat.shape[1]
    k_static = min(size, max(1, math.floor(ratio * size)))
    values, index = torch.topk(flat, k_static, dim=-1, largest=True, sorted=True)
    k = torch.floor(ratio * n_valid).clamp(min=1).reshape(-1, 1)  # [G, 1] (or [1, 1])
    rank = torch.arange(k_static, device=flat.device)
    chosen = (rank < k) & (values > -math.inf)
    picked = torch.zeros_like(flat, dtype=torch.bool).scatter(1, index, chosen)
    return picked.view_as(scores)


@register_objective("clip_cov")
class ClipCov(PPOClip):
    r"""Clip-Cov: ppo_clip, plus the gradient of a few random high-covariance tokens is cut.

    Equation: among valid tokens not already in the dead zone with ``clip_cov_lb < Cov_t <
    clip_cov_ub``, pick ``max(1, floor(clip_cov_ratio * n_valid))`` uniformly at random (from
    ``generator``) and zero their loss::

        loss_t = 0 if picked else ppo_clip loss_t

    Gradient weight (coef = g * A):

        A > 0:  g = 0 on Z_hi or if picked, else r
        A < 0:  g = 0 on Z_lo or if picked, else r   (and 0 if r > c, only when clip_c is set)

    Paper: arXiv 2505.22617 (ratio 2e-4, lb 1, ub 5; the authors' recipe sets eps_low =
    eps_high = 1 — the lower clip off, the upper bound at r = 2 — the defaults here). No dual clip
    by default: the authors' ``compute_policy_loss_clip_cov`` (PRIME-RL/Entropy-Mechanism-of-RL)
    never applies ``clip_ratio_c``, nor does verl's ``clip_cov``, so a token with A < 0 and a large
    r keeps its gradient ``-A r`` there and here; ``clip_c`` adds PPO's dual clip on request.
    verl ``clip_cov`` uses eps 0.2 (preset ``clip_cov_verl``). No ``expected_coef``: the pick
    depends on the whole batch (``batch_statistic``).

    Deviations: the random subset is drawn by ranking i.i.d. uniforms from ``generator``
    (verl: ``torch.randperm`` on the global RNG), the same distribution over subsets.
    """

    stochastic = True
    batch_statistic = True
    paper = "2505.22617"

    def __init__(
        self,
        eps_low: float = 1.0,
        eps_high: float = 1.0,
        clip_c: float | None = None,
        clip_cov_ratio: float = 2e-4,
        clip_cov_lb: float = 1.0,
        clip_cov_ub: float = 5.0,
        seed: int = 0,
    ) -> None:
        super().__init__(eps_low=eps_low, eps_high=eps_high, clip_c=clip_c)
        self.clip_cov_ratio = check_range("clip_cov_ratio", clip_cov_ratio, 0.0, 1.0, low_open=True)
        self.clip_cov_lb = check_range("clip_cov_lb", clip_cov_lb)
        self.clip_cov_ub = check_range("clip_cov_ub", clip_cov_ub)
        if self.clip_cov_ub <= self.clip_cov_lb:
            raise ValueError(
                f"clip_cov_ub must be greater than clip_cov_lb={self.clip_cov_lb}, "
                f"got {self.clip_cov_ub}"
            )
        self.seed = int(seed)

    def expected_coef(self, ratio: Tensor | float, adv: Tensor | float) -> Tensor:
        raise NotImplementedError("clip_cov depends on batch statistics: no closed form")

    def draw(self, logp: Tensor, generator: torch.Generator | None) -> Tensor:
        """One uniform key per token; the picked tokens are the eligible ones with the top keys."""
        return self._uniform(tuple(logp.shape), logp, generator)

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        loss, coef, extra = super().realise(r, rd, b, z, noise)
        cov = token_covariance(b)
        z_lo, z_hi = z
        eligible = b.mask & ~(z_lo | z_hi) & (cov > self.clip_cov_lb) & (cov < self.clip_cov_ub)
        picked = pick_top(noise, eligible, self.clip_cov_ratio, b.n_valid, b.groups)
        extra["clip_cov_frac"] = valid_share(picked, b)
        return torch.where(picked, 0.0, loss), lambda: torch.where(picked, 0.0, coef()), extra


@register_objective("kl_cov")
class KLCov(RatioObjective):
    r"""KL-Cov: no ratio clip; the top-k tokens by covariance get a |log r| penalty.

    Equation (``k = max(1, floor(kl_cov_ratio * n_valid))`` tokens with the largest ``Cov_t``)::

        loss_t = -A r + ppo_kl_coef * |log r|    on the top-k
        loss_t = -A r                            elsewhere

    Gradient coefficient (not of the form g * A on the top-k):

        coef = A r - ppo_kl_coef * sign(log r)   on the top-k (pulls r back to 1)
        coef = A r                               elsewhere (g = r for both signs of A)

    Paper: arXiv 2505.22617 (authors: k ratio 2e-3, coef 1, the defaults here; verl: 2e-4 and 0.1,
    preset ``kl_cov_verl``). No ``expected_coef``: the top-k depends on the whole batch.

    Deviations: the log-ratio is clamped to ±20 (verl does not clamp it for kl_cov).
    """

    batch_statistic = True
    paper = "2505.22617"

    def __init__(self, kl_cov_ratio: float = 2e-3, ppo_kl_coef: float = 1.0) -> None:
        self.kl_cov_ratio = check_range("kl_cov_ratio", kl_cov_ratio, 0.0, 1.0, low_open=True)
        self.ppo_kl_coef = check_range("ppo_kl_coef", ppo_kl_coef, 0.0)

    def expected_coef(self, ratio: Tensor | float, adv: Tensor | float) -> Tensor:
        raise NotImplementedError("kl_cov depends on batch statistics: no closed form")

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        picked = pick_top(token_covariance(b), b.mask, self.kl_cov_ratio, b.n_valid, b.groups)
        lr = torch.log(r)
        loss = b.neg_adv * r + torch.where(picked, self.ppo_kl_coef * lr.abs(), 0.0)
        penalty = self.ppo_kl_coef * torch.sign(lr.detach())
        return (
            loss,
            lambda: b.adv * rd - torch.where(picked, penalty, 0.0),
            {"kl_cov_frac": valid_share(picked, b)},
        )
