"""Soft-clip family: gradient-preserving clipping (GPPO, CE-GPPO), CISPO, SAPO and DGPO."""

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


@register_objective("ce_gppo")
class CEGPPO(RatioObjective):
    r"""CE-GPPO: gradient-preserving clipping with scaled gradients on the dead zone.

    Equation (``l = 1 - eps_low``, ``u = 1 + eps_high``; values equal ppo_clip's)::

        loss_t = -A * u * (1 + beta2 (log r - sg(log r)))   on Z_hi = {A > 0, r > u}
        loss_t = -A * l * (1 + beta1 (log r - sg(log r)))   on Z_lo = {A < 0, r < l}
        loss_t = -A * c                                     if A < 0, r > c   (dual clip, optional)
        loss_t = -A * r                                     elsewhere

    Gradient weight g (coef = g * A):

        A > 0:  g = beta2 * u on Z_hi (r > u),   else r
        A < 0:  g = beta1 * l on Z_lo (r < l),   0 if r > c (dual clip),   else r

    Paper: arXiv 2509.20712 (beta1 in 0.25-0.75, beta2 = 1). [open] The paper's single default beta1
    is not known here; 0.5 is this library's default. eps 0.2/0.28 as in the Klear recipes.

    Deviations: the reference writes the bound as ``(1 ± eps) r / sg(r)``; ``1 + beta (log r -
    sg(log r))`` has the same value and gradient and stays finite at extreme ratios.
    """

    paper = "2509.20712"

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        beta1: float = 0.5,
        beta2: float = 1.0,
        clip_c: float | None = 10.0,
    ) -> None:
        self.eps_low = check_range("eps_low", eps_low, 0.0, 1.0, high_open=True)
        self.eps_high = check_range("eps_high", eps_high, 0.0)
        self.beta1 = check_range("beta1", beta1, 0.0)
        self.beta2 = check_range("beta2", beta2, 0.0)
        self.clip_c = None if clip_c is None else check_range("clip_c", clip_c, 1.0, low_open=True)

    def bounds(self) -> tuple[float, float]:
        return 1.0 - self.eps_low, 1.0 + self.eps_high

    def _dual(self, ratio: Tensor, adv: Tensor) -> Tensor | None:
        return None if self.clip_c is None else (adv < 0) & (ratio > self.clip_c)

    def surrogate(self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None) -> Tensor:
        low, high = self.bounds()
        z_lo, z_hi = self.zone(rd, b.adv, z)
        delta = torch.log(r) - torch.log(rd)  # value 0, gradient 1 w.r.t. logp
        # Value of the (dual-)clipped ppo loss everywhere; on Z the gradient is beta * bound.
        bound = torch.where(z_hi, high * (1 + self.beta2 * delta), r)
        bound = torch.where(z_lo, low * (1 + self.beta1 * delta), bound)
        if (dual := self._dual(rd, b.adv)) is not None:
            bound = torch.where(dual, self.clip_c, bound)
        return b.neg_adv * bound

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        low, high = self.bounds()
        z_lo, z_hi = self.zone(ratio, adv, z)
        g = torch.where(z_hi, self.beta2 * high, ratio)
        g = torch.where(z_lo, self.beta1 * low, g)
        if (dual := self._dual(ratio, adv)) is not None:
            g = torch.where(dual, 0.0, g)
        return g

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        loss, coef, extra = super().realise(r, rd, b, z, noise)
        if (dual := self._dual(rd, b.adv)) is not None:
            extra["dual_clip_frac"] = valid_share(dual, b)
        return loss, coef, extra


@register_objective("gppo")
class GPPO(CEGPPO):
    r"""GPPO (Klear-Reasoner): ppo_clip's value, but the dead zone keeps a bounded gradient.

    Equation: on Z the clip bound is written ``(1 ± eps) r / sg(r)``, so the loss value is ppo_clip's
    and the gradient flows::

        loss_t = -A u r/sg(r) on Z_hi,   -A l r/sg(r) on Z_lo,   -A c if A < 0, r > c,   -A r else

    Gradient weight g (coef = g * A):

        A > 0:  g = u on Z_hi (r > u),   else r
        A < 0:  g = l on Z_lo (r < l),   0 if r > c (dual clip),   else r

    Probability-gradient weight on Z_lo: W = l / pi, which diverges as pi -> 0 (DGPO's point).

    Paper: arXiv 2508.07629 (eps 0.2 / 0.28, dual clip c = 10). It is :class:`CEGPPO` with
    beta1 = beta2 = 1. [open] The released code's dual-clip branch changed after release; here the
    dual clip is PPO's (zero gradient for A < 0, r > c).
    """

    paper = "2508.07629"

    def __init__(
        self, eps_low: float = 0.2, eps_high: float = 0.28, clip_c: float | None = 10.0
    ) -> None:
        super().__init__(eps_low=eps_low, eps_high=eps_high, beta1=1.0, beta2=1.0, clip_c=clip_c)


@register_objective("cispo")
class CISPO(RatioObjective):
    r"""CISPO (MiniMax-M1): REINFORCE with a clipped, stop-gradient importance weight.

    Equation: ``loss_t = -sg(clip(r, lower, upper)) * A * logp_t`` (bounds are absolute ratios).

    Gradient weight: ``g = clip(r, lower, upper)`` for A > 0 and A < 0 alike; never zero, so no
    token is dropped. Probability-gradient weight ``W pi_old = clip(r, lower, upper) / r``: with a
    lower bound > 0 (verl's convention) it diverges as r -> 0 (DGPO's argument); with lower = 0
    (TRL's convention, the default here) it stays 1 below the upper bound.

    Paper: arXiv 2506.13585 §3.1 (no lower bound; only the upper bound is tuned). Conventions: verl
    clamps r to ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (preset ``cispo_verl``); TRL caps at
    an absolute ``epsilon_high`` (5.0 recommended; preset ``cispo_trl``). Defaults: lower 0 (no
    lower bound), upper 5.0.

    Clip fractions count the sign-aware truncations (A > 0, r > upper) and (A < 0, r < lower).

    Deviations: the ratio inside the weight is the ±20-clamped one; the loss value is
    ``-w A logp`` as in TRL and verl (it is not a surrogate of J, only its gradient is).
    """

    through_ratio = False
    paper = "2506.13585"

    def __init__(self, lower: float = 0.0, upper: float = 5.0) -> None:
        self.lower = check_range("lower", lower, 0.0, 1.0)
        self.upper = check_range("upper", upper, 1.0)

    def bounds(self) -> tuple[float, float]:
        return self.lower, self.upper

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        return ratio.clamp(self.lower, self.upper)

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        coef = b.adv * self.weight(rd, b.adv)
        return -coef * b.logp, lambda: coef, {}


@register_objective("sapo")
class SAPO(RatioObjective):
    r"""SAPO: a smooth sigmoid gate instead of a hard clip.

    Equation: ``loss_t = -(4 / tau) * sigmoid(tau (r - 1)) * A`` with ``tau = tau_pos`` if A > 0 else
    ``tau_neg``.

    Gradient weight: ``g = 4 r sigmoid(x)(1 - sigmoid(x)) = r sech^2(tau (r - 1) / 2)``, ``x = tau
    (r - 1)``, for both signs (with the sign's tau); g(1) = 1 (REINFORCE on-policy), smooth, and it
    decays to 0 far from r = 1 on both sides.

    Paper: arXiv 2511.20347 (tau_pos 1.0, tau_neg 1.05). Matches verl ``sapo`` and TRL
    ``loss_type=sapo``.
    """

    paper = "2511.20347"
    aggregation = "seq-mean-token-mean"  # what verl's sapo always uses (it ignores loss_agg_mode)

    def __init__(self, tau_pos: float = 1.0, tau_neg: float = 1.05) -> None:
        self.tau_pos = check_range("tau_pos", tau_pos, 0.0, low_open=True)
        self.tau_neg = check_range("tau_neg", tau_neg, 0.0, low_open=True)

    def _tau(self, adv: Tensor) -> Tensor:
        return torch.where(adv > 0, adv.new_tensor(self.tau_pos), adv.new_tensor(self.tau_neg))

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        s = torch.sigmoid(self._tau(adv) * (ratio - 1.0))
        return 4.0 * ratio * s * (1.0 - s)

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        pos = b.adv_pos
        tau = torch.where(pos, b.adv.new_tensor(self.tau_pos), b.adv.new_tensor(self.tau_neg))
        gate = torch.sigmoid(tau * (r - 1.0))
        scale = torch.where(pos, -4.0 / self.tau_pos * b.adv, -4.0 / self.tau_neg * b.adv)
        loss = gate * scale  # -(4 / tau) sigmoid(tau (r - 1)) A
        s = gate.detach()
        return loss, lambda: (4.0 * rd) * s * (1.0 - s) * b.adv, {}


@register_objective("dgpo")
class DGPO(RatioObjective):
    r"""DGPO: decoupled decay of the probability-gradient weight on the boundary tokens.

    In probability space (W = g / pi, so grad = -W A grad pi)::

        W = l^-n pi_old^-(n+1) pi^n          on Z_lo = {A < 0, r < l}   (decays as pi -> 0)
        W = u^(1/m) pi_old^(1/m - 1) pi^(-1/m)  on Z_hi = {A > 0, r > u}
        W = 1 / pi_old                       elsewhere

    Equation (log-prob form, stop-gradient exponents as in the reference code)::

        loss_t = -A r sg(r)^n / l^n               on Z_lo
        loss_t = -A r u^(1/m) sg(r)^(-1/m)        on Z_hi
        loss_t = -A r                             elsewhere

    Gradient weight g (coef = g * A):

        A > 0:  g = u^(1/m) r^((m-1)/m) on Z_hi (r > u),  else r
        A < 0:  g = r^(n+1) / l^n        on Z_lo (r < l),  else r

    g and W are continuous at l and u, W <= 1/pi_old everywhere, and W decays monotonically away
    from both boundaries (contrast GPPO: W = l/pi on Z_lo diverges as pi -> 0).

    Paper: arXiv 2603.14389 (code FlyTune/DGPO-RL): n = 1, m = 2 (n = 2 suggested for 1.5B models),
    eps 0.2 / 0.2. Reported Avg@32 on six math benchmarks: 1.5B 48.4 -> 52.7, 7B 58.9 -> 62.0.

    Deviations: computed in log space (``log r + n (sg(log r) - log l)``) so no power overflows.
    The ±20 log-ratio clamp (docs/objectives.md §1) zeroes the gradient of a token whose raw
    ``|log r|`` exceeds 20 (its coef is 0), as for every token-level rule; the authors' code
    clamps nothing there and keeps ``g = u^(1/m) r^((m-1)/m)`` on such a Z_hi token (and
    ``r^(n+1) / l^n``, vanishingly small, on Z_lo).
    """

    paper = "2603.14389"

    def __init__(
        self, eps_low: float = 0.2, eps_high: float = 0.2, n: float = 1.0, m: float = 2.0
    ) -> None:
        self.eps_low = check_range("eps_low", eps_low, 0.0, 1.0, low_open=True, high_open=True)
        self.eps_high = check_range("eps_high", eps_high, 0.0, low_open=True)
        self.n = check_range("n", n, 1.0)
        self.m = check_range("m", m, 1.0)

    def bounds(self) -> tuple[float, float]:
        return 1.0 - self.eps_low, 1.0 + self.eps_high

    def surrogate(self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None) -> Tensor:
        low, high = self.bounds()
        z_lo, z_hi = self.zone(rd, b.adv, z)
        lr, lrd = torch.log(r), torch.log(rd)
        eff = torch.where(z_lo, lr + self.n * (lrd - math.log(low)), lr)
        eff = torch.where(z_hi, lr + (math.log(high) - lrd) / self.m, eff)
        return b.neg_adv * torch.exp(eff)

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        low, high = self.bounds()
        z_lo, z_hi = self.zone(ratio, adv, z)
        lr = torch.log(ratio)
        log_g = torch.where(z_lo, (self.n + 1) * lr - self.n * math.log(low), lr)
        log_g = torch.where(z_hi, math.log(high) / self.m + (self.m - 1) / self.m * lr, log_g)
        return torch.exp(log_g)
