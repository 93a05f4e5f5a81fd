"""NSR: near-boundary stochastic rescue, and its deterministic expected-weight arm (NSR-decay)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import (
    Batch,
    CoefFn,
    RatioObjective,
    Zone,
    check_choice,
    check_range,
    register_objective,
)

NOISE_LAWS = ("uniform", "band")
LEVELS = ("token", "sequence")
# eps_low, eps_high of the base rule at each level: DAPO (token) and GSPO (sequence).
BASE_EPS = {"token": (0.2, 0.28), "sequence": (3e-4, 4e-4)}


class _NSRBase(RatioObjective):
    """Shared parameters and the rescue probability p(r) (docs/objectives.md §4)."""

    def __init__(
        self,
        eps_low: float | None = None,
        eps_high: float | None = None,
        level: str = "token",
        noise: str = "uniform",
        sigma: float = 0.1,
    ) -> None:
        self.level = check_choice("level", level, LEVELS)
        self.noise = check_choice("noise", noise, NOISE_LAWS)
        default_low, default_high = BASE_EPS[self.level]
        eps_low = default_low if eps_low is None else eps_low
        eps_high = default_high if eps_high is None else eps_high
        self.eps_low = check_range("eps_low", eps_low, 0.0, 1.0, low_open=True, high_open=True)
        self.eps_high = check_range("eps_high", eps_high, 0.0, low_open=True)
        self.sigma = check_range("sigma", sigma, 0.0, 1.0, low_open=True, high_open=True)
        self.aggregation = "seq-mean-token-mean" if self.level == "sequence" else "token-mean"

    def bounds(self) -> tuple[float, float]:
        return 1.0 - self.eps_low, 1.0 + self.eps_high

    def rescue_prob(self, ratio: Tensor) -> tuple[Tensor, Tensor]:
        """``(p_lo, p_hi)``: probability that a token of Z_lo / Z_hi at this ratio is rescued."""
        low, high = self.bounds()
        if self.noise == "uniform":
            # Z_hi: r xi <= u with xi ~ U(0, 1) -> u / r;  Z_lo: r / xi >= l -> r / l.
            return (ratio / low).clamp(max=1.0), (high / ratio).clamp(max=1.0)
        s = self.sigma
        # Z_hi: xi ~ U(1 - s, 1), r xi <= u;  Z_lo: xi ~ U(1, 1 + s), r xi >= l.
        p_hi = ((high / ratio - (1.0 - s)) / s).clamp(0.0, 1.0)
        p_lo = (((1.0 + s) - low / ratio) / s).clamp(0.0, 1.0)
        return p_lo, p_hi

    def keep_prob(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        """P(the token keeps its gradient r A): 1 off the dead zone, the rescue probability on it."""
        z_lo, z_hi = self.zone(ratio, adv, z)
        p_lo, p_hi = self.rescue_prob(ratio)
        one = torch.ones_like(ratio)
        return torch.where(z_hi, p_hi, torch.where(z_lo, p_lo, one))

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        """Expected gradient weight ``E[g] = r p(r)`` on Z, ``r`` elsewhere."""
        return ratio * self.keep_prob(ratio, adv, z)


@register_objective("nsr")
class NSR(_NSRBase):
    r"""NSR: near-boundary stochastic rescue of hard-clipped tokens.

    Equation (``l = 1 - eps_low``, ``u = 1 + eps_high``; Z = Z_hi ∪ Z_lo, the ppo_clip dead zone)::

        keep = 1                       off Z
        keep = 1[r xi crosses back]    on Z, xi drawn fresh per token (per sequence at level
                                       "sequence", where r is the GSPO sequence ratio s_i)
        loss_t = keep (-A r) + (1 - keep) (-A sg(clip(r, l, u)))

    The rescue test checks only the violated boundary ("the perturbed ratio crosses back"): the
    probabilities this library works from (p = u/r and r/l for uniform noise, docs/objectives.md
    §4) are those of this one-sided reading; the literal two-sided test ``r xi in [l, u]`` would give (u - l)/r on Z_hi instead.

    Noise laws (``noise``):
      * ``"uniform"`` (parameter-free): Z_hi rescued iff ``r xi <= u``, xi ~ U(0, 1), so p = u / r;
        Z_lo rescued iff ``r / xi >= l``, so p = r / l.
      * ``"band"`` (width ``sigma``): Z_hi: xi ~ U(1 - sigma, 1), rescued iff ``r xi <= u``,
        p = clip((u/r - (1 - sigma)) / sigma, 0, 1); Z_lo: xi ~ U(1, 1 + sigma), rescued iff
        ``r xi >= l``, p = clip(((1 + sigma) - l/r) / sigma, 0, 1). Deep violations stay clipped.

    Gradient weight (realised, then expected):

        A > 0:  g = r keep on Z_hi (r > u), else r;   E[g] = u (uniform) on Z_hi
        A < 0:  g = r keep on Z_lo (r < l), else r;   E[g] = r^2 / l (uniform) on Z_lo

    In expectation NSR is the implicit gradient decay of :class:`NSRDecay` (same ``expected_coef``).

    Paper: arXiv 2605.22703 (plug-in on DAPO at token level, on GSPO at sequence level). [open] The
    exact noise law is not known; both readings are offered (docs/objectives.md §4). Defaults: eps from the base
    rule of the level (token: DAPO 0.2 / 0.28; sequence: GSPO 3e-4 / 4e-4), ``noise="uniform"``.

    Metrics: ``rescue_frac`` (rescued share of Z), ``rescue_low_frac`` / ``rescue_high_frac`` (of
    Z_lo / Z_hi), plus the clip fractions of Z before rescue.
    """

    stochastic = True
    paper = "2605.22703"

    def __init__(
        self,
        eps_low: float | None = None,
        eps_high: float | None = None,
        level: str = "token",
        noise: str = "uniform",
        sigma: float = 0.1,
        seed: int = 0,
    ) -> None:
        super().__init__(eps_low, eps_high, level, noise, sigma)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed

    def expectation(self) -> NSRDecay:
        """:class:`NSRDecay` with this rule's parameters (and aggregation, which a preset may
        set): the same ``expected_coef``, no draws."""
        det = NSRDecay(self.eps_low, self.eps_high, self.level, self.noise, self.sigma)
        det.aggregation = self.aggregation
        return det

    def draw(self, logp: Tensor, generator: torch.Generator | None) -> Tensor:
        """xi's uniform source: one U(0, 1) per token (per sequence at level "sequence")."""
        shape = (logp.shape[0], 1) if self.level == "sequence" else tuple(logp.shape)
        return self._uniform(shape, logp, generator)

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        u01 = noise
        low, high = self.bounds()
        if self.noise == "uniform":
            rescued_hi = rd * u01 <= high
            rescued_lo = rd >= low * u01  # r / xi >= l
        else:
            rescued_hi = rd * (1.0 - self.sigma + self.sigma * u01) <= high
            rescued_lo = rd * (1.0 + self.sigma * u01) >= low
        z_lo, z_hi = z
        res_lo, res_hi = z_lo & rescued_lo, z_hi & rescued_hi
        keep = ~(z_lo | z_hi) | res_lo | res_hi
        loss = b.neg_adv * torch.where(keep, r, rd.clamp(low, high))
        coef = lambda: torch.where(keep, b.adv * rd, 0.0)  # noqa: E731
        # padding has adv = 0, so it is never in Z: plain counts are counts over valid tokens
        n_lo, n_hi = torch.count_nonzero(z_lo), torch.count_nonzero(z_hi)
        k_lo, k_hi = torch.count_nonzero(res_lo), torch.count_nonzero(res_hi)
        metrics = {
            "rescue_frac": (k_lo + k_hi) / (n_lo + n_hi).clamp(min=1),
            "rescue_low_frac": k_lo / n_lo.clamp(min=1),
            "rescue_high_frac": k_hi / n_hi.clamp(min=1),
        }
        return loss, coef, {k: v.to(rd.dtype) for k, v in metrics.items()}


@register_objective("nsr_decay")
class NSRDecay(_NSRBase):
    r"""NSR-decay: NSR's expected gradient weight applied deterministically (the paper's ablation).

    Equation, with q = P(keep) of :class:`NSR` (1 off Z, p(r) on Z; detached)::

        loss_t = q (-A r) + (1 - q) (-A sg(clip(r, l, u)))        (= E[NSR loss])

    Gradient weight: ``g = r q(r)``, i.e. by cases

        A > 0:  g = r p_hi(r) on Z_hi (uniform: u), else r
        A < 0:  g = r p_lo(r) on Z_lo (uniform: r^2 / l), else r

    Same parameters (no seed) and the same ``expected_coef`` as ``nsr``. Paper: arXiv 2605.22703.
    """

    paper = "2605.22703"

    def surrogate(self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None) -> Tensor:
        q = self.keep_prob(rd, b.adv, z)
        return b.neg_adv * (q * r + (1.0 - q) * rd.clamp(*self.bounds()))
