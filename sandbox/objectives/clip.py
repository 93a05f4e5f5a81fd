"""Hard-clip family: unclipped IS, PPO/GRPO clip (with dual clip and DAPO clip-higher), GSPO, GMPO,
ATR."""

from __future__ import annotations

import math

import torch
from scipy.special import lambertw
from torch import Tensor

from .base import (
    LOG_RATIO_CLAMP,
    Batch,
    CoefFn,
    RatioObjective,
    Zone,
    check_range,
    clip_metrics,
    ratio_metrics,
    register_objective,
    valid_share,
)


@register_objective("unclipped")
class Unclipped(RatioObjective):
    r"""Importance-weighted REINFORCE, no trust region.

    Equation: ``loss_t = -A_t * r_t``.

    Gradient weight: ``g = r`` for A > 0 and A < 0 alike (never zero). On-policy this is REINFORCE.

    Paper: the off-policy policy-gradient estimator (e.g. Degris et al. 2012, arXiv 1205.4839).

    Deviations: the log-ratio is clamped to ±20 (docs/objectives.md §1); beyond it the gradient is
    0.
    """

    paper = "1205.4839"

    def __init__(self) -> None:
        pass

    def surrogate(self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None) -> Tensor:
        return b.neg_adv * r

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        return ratio


@register_objective("ppo_clip")
class PPOClip(RatioObjective):
    r"""PPO / GRPO ratio clipping, with DAPO's decoupled bounds and optional dual clip.

    Equation (``l = 1 - eps_low``, ``u = 1 + eps_high``)::

        loss_t = max(-A r, -A clip(r, l, u))              # PPO min-form, as a loss
        loss_t = min(loss_t, -c A)       if A < 0 and clip_c = c is set   (dual clip)

    Gradient weight g (coef = g * A):

        A > 0:  g = 0 if r > u (Z_hi, dead zone),          else g = r   (also for r < l)
        A < 0:  g = 0 if r < l (Z_lo, dead zone),          else g = r   (also for r > u)
                g = 0 if r > c (dual clip, only when clip_c is set)

    Papers: PPO arXiv 1707.06347; GRPO arXiv 2402.03300 (eps 0.2); DAPO clip-higher arXiv
    2503.14476 §3.1 (eps_low 0.2, eps_high 0.28); dual clip arXiv 1912.09729 (c = 3 in verl).

    Args:
        eps_low: ``l = 1 - eps_low``, in [0, 1] (1 switches the lower clip off).
        eps_high: ``u = 1 + eps_high``, >= 0.
        clip_c: dual-clip constant c > 1 for A < 0, or ``None`` (off).

    Deviations: the log-ratio is clamped to ±20 as in verl (zero gradient beyond). Equals verl
    ``loss_mode=vanilla`` (with ``clip_ratio_c`` when ``clip_c`` is set) and TRL ``loss_type=grpo``
    (TRL's ``delta`` caps r at delta for both signs of A; when delta > 1 + eps_high it only binds
    on the A < 0 side and equals dual clip with c = delta: tested in tests/test_adapter_trl.py).
    """

    paper = "1707.06347"

    def __init__(
        self, eps_low: float = 0.2, eps_high: float = 0.2, clip_c: float | None = None
    ) -> None:
        self.eps_low = check_range("eps_low", eps_low, 0.0, 1.0)
        self.eps_high = check_range("eps_high", eps_high, 0.0)
        self.clip_c = None if clip_c is None else check_range("clip_c", clip_c, 1.0, low_open=True)

    def bounds(self) -> tuple[float, float]:
        return 1.0 - self.eps_low, 1.0 + self.eps_high

    def _dead(self, ratio: Tensor, adv: Tensor, z: Zone | None) -> tuple[Tensor, Tensor | None]:
        """Where the gradient is zero (Z, plus the dual-clip region) and the dual-clip mask."""
        z_lo, z_hi = self.zone(ratio, adv, z)
        dead = z_lo | z_hi
        if self.clip_c is None:
            return dead, None
        dual = (adv < 0) & (ratio > self.clip_c)
        return dead | dual, dual

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        dead, _ = self._dead(ratio, adv, z)
        return torch.where(dead, 0.0, ratio)

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        # The PPO min-form max(-A r, -A clip(r, l, u)) (then min with -c A for A < 0) equals -A r
        # off the dead region and a constant on it: -A u on Z_hi, -A l on Z_lo, -A c on dual.
        dead, dual = self._dead(rd, b.adv, z)
        frozen = rd.clamp(*self.bounds())
        extra = {}
        if dual is not None:
            frozen = torch.where(dual, self.clip_c, frozen)
            extra["dual_clip_frac"] = valid_share(dual, b)
        loss = b.neg_adv * torch.where(dead, frozen, r)
        return loss, lambda: torch.where(dead, 0.0, b.adv * rd), extra


@register_objective("gspo")
class GSPO(PPOClip):
    r"""GSPO: PPO clipping on the length-normalised sequence ratio (GSPO-token form).

    Equation: ``s_i = exp(mean_t log r_{i,t})`` over the valid tokens of sequence i, and with
    ``log s_{i,t} = sg(log s_i) + logp_t - sg(logp_t)``::

        loss_{i,t} = max(-A s_{i,t}, -A clip(s_{i,t}, l, u))

    aggregated with ``seq-mean-token-mean``, the gradient equals that of the per-sequence loss
    ``-min(s_i A_i, clip(s_i, l, u) A_i)``: each token gets ``s_i A_i / |o_i|``.

    Gradient weight (per token, as a function of the sequence ratio s):

        A > 0:  g = 0 if s > u, else g = s
        A < 0:  g = 0 if s < l, else g = s

    ``expected_coef(ratio, adv)`` takes the sequence ratio s. Paper: arXiv 2507.18071 (eps_low 3e-4,
    eps_high 4e-4).

    Deviations: the mean log-ratio is clamped to ±20 (verl clamps it at +10 only); the clamp acts on
    the detached value, so the gradient keeps flowing. Matches verl ``loss_mode=gspo`` and TRL
    ``importance_sampling_level="sequence"``.
    """

    level = "sequence"
    aggregation = "seq-mean-token-mean"
    paper = "2507.18071"

    def __init__(self, eps_low: float = 3e-4, eps_high: float = 4e-4) -> None:
        super().__init__(eps_low=eps_low, eps_high=eps_high, clip_c=None)


@register_objective("gmpo")
class GMPO(PPOClip):
    r"""GMPO: the geometric mean of the token ratios, each clipped in log space (GSPO-token form).

    Equation (``l_t = log r_t``; the clip range on the ratio is ``(e^-eps_low, e^eps_high)``)::

        c_t = min(l_t, eps_high) if A_t > 0,   max(l_t, -eps_low) if A_t < 0,   0 if A_t = 0
        s_i = exp(mean_t c_t)                  (geometric mean of the clipped token ratios)
        loss_i = -Abar_i * s_i                 (Abar_i = mean_t A_t, the sequence advantage)

    written per token as ``loss_{i,t} = -Abar_i s_{i,t}`` with ``log s_{i,t} = sg(log s_i) + c_t -
    sg(c_t)``: every token's value is the sequence's, and with ``seq-mean-token-mean`` the gradient
    is GMPO's per-sequence one, ``-d loss_i / d logp_t = Abar_i s_i / |o_i|`` on a token whose
    log-ratio was not clipped and 0 on a clipped one.

    Gradient weight (per token, coef = g * A with A the sequence's advantage — with token-level
    advantages, coef = g * Abar_i, as verl's mean advantage has it; s the clipped geometric mean
    of its sequence):

        A > 0:  g = 0 if r_t > e^eps_high (this token clipped), else g = s
        A < 0:  g = 0 if r_t < e^-eps_low,                      else g = s

    A clipped token stops only its own gradient (GSPO stops the whole sequence); s stays below
    e^eps_high for A > 0 and above e^-eps_low for A < 0. ``expected_coef(s, A)`` is the
    coefficient of a sequence whose tokens share one ratio s (a one-token sequence, the bandit,
    included): ppo_clip with bounds ``(e^-eps_low, e^eps_high)``. With unequal token ratios the
    coefficient depends on which tokens were clipped, which s does not tell, so
    :mod:`sandbox.exact.sequences` calls the objective itself (it is deterministic).

    Paper: GMPO, arXiv 2507.20673 §4 (token-level clipping in log space, range (e^-0.4, e^0.4),
    the defaults here). verl ``loss_mode=geo_mean`` reads ``clip_ratio_low/high`` as eps_low /
    eps_high in log space (verl's defaults 0.2 / 0.2: preset ``gmpo_verl``).

    Deviations: the mean clipped log-ratio is clamped to ±20 on its detached value (verl does not
    clamp); verl divides by ``|o_i| + 1e-8`` (relative difference <= 1e-8 / |o_i|; none for a
    bool mask, whose integer count + 1e-8 rounds in float32). verl's ``geo_mean``
    reduces with a plain mean over the micro-batch's rows whatever ``loss_agg_mode`` (fully padded
    rows included, no global batch counts) and applies rollout IS weights as their per-sequence
    geometric mean: ``llm.adapters.verl`` does the latter, and the former under
    ``seq-mean-token-mean`` when the global batch is the micro-batch (docs/adapters.md).
    Metrics: ``clip_low_frac`` / ``clip_high_frac`` are the shares of valid tokens clipped with
    A < 0 / A > 0 (verl's ``pg_clipfrac`` also counts A > 0 tokens below e^-eps_low, which it does
    not clip); ``ratio_*`` are of s.
    """

    level = "sequence"
    aggregation = "seq-mean-token-mean"
    paper = "2507.20673"

    def __init__(self, eps_low: float = 0.4, eps_high: float = 0.4) -> None:
        self.eps_low = check_range("eps_low", eps_low, 0.0, low_open=True)
        self.eps_high = check_range("eps_high", eps_high, 0.0, low_open=True)
        self.clip_c = None

    def bounds(self) -> tuple[float, float]:
        return math.exp(-self.eps_low), math.exp(self.eps_high)

    def compute(self, b: Batch, noise: Tensor | None) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        lr = b.raw_lr  # 0 on padding, carries the graph
        lrd = lr.detach()
        z_lo, z_hi = b.adv_neg & (lrd < -self.eps_low), b.adv_pos & (lrd > self.eps_high)
        free = b.mask & (b.adv != 0) & ~(z_lo | z_hi)  # tokens whose c_t follows l_t
        with torch.no_grad():
            c = torch.where(z_hi, self.eps_high, torch.where(z_lo, -self.eps_low, lrd))
            c = torch.where(free | z_lo | z_hi, c, 0.0)  # A = 0 (and padding): c = 0, as verl
            lengths = b.mask.sum(-1, keepdim=True).to(lrd.dtype).clamp(min=1)
            seq = (c.sum(-1, keepdim=True) / lengths).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            abar = b.adv.sum(-1, keepdim=True) / lengths
        log_s = seq + torch.where(free, lr - lrd, 0.0)  # value log s_i, gradient 1 where free
        s = log_s.exp()
        sd = s.detach()
        loss = torch.where(b.mask, -abar * s, 0.0)
        metrics = ratio_metrics(log_s, sd, b, lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        metrics.update(clip_metrics(z_lo, z_hi, b))
        return loss, lambda: torch.where(free, abar * sd, 0.0), metrics


def atr_bounds(delta: float) -> tuple[float, float]:
    """The ratio interval where KL3 ``k3(w) = w - 1 - log w`` stays <= delta (ATR-GRPO, arXiv
    2602.05494; docs/objectives.md §5).

    ``l = -W_0(-exp(-(1+delta)))`` and ``u = -W_{-1}(-exp(-(1+delta)))``: solving ``w - log w = 1 +
    delta`` gives ``w = -W(-e^{-(1+delta)})`` on the two real branches of Lambert W.
    """
    delta = check_range("delta", delta, 0.0, low_open=True)
    x = -math.exp(-(1.0 + delta))
    return float(-lambertw(x, 0).real), float(-lambertw(x, -1).real)


@register_objective("atr")
class ATR(PPOClip):
    r"""ATR-GRPO: the KL3 trust region ``k3(r) <= delta`` as an asymmetric ratio clip.

    ``k3(r) = r - 1 - log r <= delta``  iff  ``l_delta <= r <= u_delta`` with the Lambert-W bounds
    of :func:`atr_bounds` (delta 0.02314 -> (0.8000, 1.2308); 0.1 -> (0.6168, 1.5162)): more room
    upward than downward. With ``two_sided=False`` (default) it is ppo_clip on ``[l_delta,
    u_delta]`` (min-form); with ``two_sided=True`` every token outside the region is clipped::

        two_sided:  loss_t = -A clip(r, l_delta, u_delta)

    Gradient weight:

        min-form:   A > 0: g = 0 if r > u_delta else r;   A < 0: g = 0 if r < l_delta else r
        two_sided:  g = r if l_delta <= r <= u_delta else 0   (either sign of A)

    Paper: arXiv 2602.05494. [open] The paper's default delta and whether (A < 0, r > u) is clipped
    are not known; ``delta=0.03`` and the min-form are this library's defaults (sweep 0.02-0.1).

    Metrics: ``clip_low_frac`` / ``clip_high_frac`` count the sign-aware dead zone Z only; with
    ``two_sided=True`` the tokens (A > 0, r < l) and (A < 0, r > u) are clipped too but not counted.
    """

    paper = "2602.05494"

    def __init__(self, delta: float = 0.03, two_sided: bool = False) -> None:
        low, high = atr_bounds(delta)
        super().__init__(eps_low=1.0 - low, eps_high=high - 1.0)
        self.delta = float(delta)
        if not isinstance(two_sided, bool):
            raise ValueError(f"two_sided must be True or False, got {two_sided!r}")
        self.two_sided = two_sided

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        if self.two_sided:
            low, high = self.bounds()
            return torch.where((ratio >= low) & (ratio <= high), ratio, 0.0)
        return super().weight(ratio, adv, z)

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        if self.two_sided:
            loss = b.neg_adv * r.clamp(*self.bounds())
            return loss, lambda: b.adv * self.weight(rd, b.adv), {}
        return super().realise(r, rd, b, z, noise)
