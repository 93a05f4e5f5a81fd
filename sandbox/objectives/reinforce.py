"""REINFORCE family without a ratio surrogate: GPG (plain -A log pi), DRO's quadratic penalty,
DPPO's probability-space trust region (a truncated IS weight on the tokens it keeps) and VESPO's
gamma weight of the sequence ratio."""

from __future__ import annotations

import math

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
    ratio_metrics,
    register_objective,
    valid_share,
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


def _binary_kl(p_old: Tensor, logp_old: Tensor, logp: Tensor) -> Tensor:
    """KL(Bernoulli(p_old) || Bernoulli(p)) with verl's 1e-8 guard on the complement."""
    p = logp.exp()
    return p_old * (logp_old - logp) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))


class _DPPO(RatioObjective):
    """DPPO's shared part: REINFORCE with the truncated IS weight sg(min(r, tis_cap)) on the tokens
    whose probability stayed inside the divergence bound in the advantage's direction."""

    through_ratio = False
    paper = "2602.04879"

    def __init__(self, delta_low: float = 0.2, delta_high: float = 0.2, tis_cap: float = 20.0):
        self.delta_low = check_range("delta_low", delta_low, 0.0, low_open=True)
        self.delta_high = check_range("delta_high", delta_high, 0.0, low_open=True)
        self.tis_cap = check_range("tis_cap", tis_cap, 0.0, low_open=True)

    def _outside(self, b: Batch) -> tuple[Tensor, Tensor]:  # pragma: no cover - abstract
        """(A < 0 and moved down past delta_low, A > 0 and moved up past delta_high)."""
        raise NotImplementedError

    def expected_coef(self, ratio: Tensor | float, adv: Tensor | float) -> Tensor:
        raise NotImplementedError(
            f"{self.name}'s mask tests the probability change p - p_old, which the ratio alone "
            "does not give: its coefficient has no closed form in (r, A)"
        )

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        low, high = self._outside(b)
        keep = ~(low | high)
        coef = torch.where(keep, b.adv * rd.clamp(max=self.tis_cap), 0.0)
        metrics = {"clip_low_frac": valid_share(low, b), "clip_high_frac": valid_share(high, b)}
        metrics["tis_frac"] = valid_share(keep & b.mask & (rd > self.tis_cap), b)
        return -coef * b.logp, lambda: coef, metrics


@register_objective("dppo_tv")
class DPPOTV(_DPPO):
    r"""DPPO-Binary-TV: a trust region in probability space instead of a ratio clip.

    Equation (``p = pi(token)``, ``p_old = pi_old(token)``, ``w = sg(min(r, tis_cap))``)::

        keep_t = (p - p_old <= delta_high)  if A > 0
                 (p - p_old >= -delta_low)  if A < 0
        loss_t = -w * A * logp_t * keep_t

    Gradient weight (coef = g A): ``g = min(r, tis_cap)`` on kept tokens, 0 where the policy moved
    the token's probability past the total-variation bound in the advantage's direction (moving
    against it is never masked). A rare token can move far in ratio and little in probability, a
    common one the reverse: the bound is not a ratio interval, so ``expected_coef`` has no closed
    form in (r, A). ``clip_low_frac`` / ``clip_high_frac`` count the masked tokens with A < 0 / A > 0;
    ``tis_frac`` the kept tokens whose weight was truncated.

    Paper: DPPO, arXiv 2602.04879 (§4, binary TV divergence; §5.4, truncated IS with a large cap
    instead of dual clip). verl ``loss_mode=dppo_tv``: ``clip_ratio_low/high`` are the bounds,
    ``clip_ratio_c`` the cap (verl's ActorConfig default 3.0; 20 when absent).

    Deviations: none below the ±20 log-ratio clamp of the weight (verl clamps the same way).
    """

    def _outside(self, b: Batch) -> tuple[Tensor, Tensor]:
        moved = b.logp.detach().exp() - b.logp_old.exp()
        return b.adv_neg & (moved < -self.delta_low), b.adv_pos & (moved > self.delta_high)


@register_objective("dppo_kl")
class DPPOKL(_DPPO):
    r"""DPPO-Binary-KL: DPPO with the binary KL divergence as the trust region.

    Equation (``D = KL(Bern(p_old) || Bern(p))``, ``w = sg(min(r, tis_cap))``)::

        keep_t = (D <= delta_high) or (p <= p_old)   if A > 0
                 (D <= delta_low)  or (p >= p_old)   if A < 0
        loss_t = -w * A * logp_t * keep_t

    Gradient weight: ``g = min(r, tis_cap)`` on kept tokens, 0 where the token moved in the
    advantage's direction by more than the KL bound. No closed form in (r, A) (as ``dppo_tv``).

    Paper: DPPO, arXiv 2602.04879 (§4, binary KL). verl ``loss_mode=dppo_kl`` (bounds from
    ``clip_ratio_low/high``, cap from ``clip_ratio_c``).

    Deviations: verl's 1e-8 guard in ``log((1 - p_old + 1e-8) / (1 - p + 1e-8))`` is kept.
    """

    def _outside(self, b: Batch) -> tuple[Tensor, Tensor]:
        logp = b.logp.detach()
        d = _binary_kl(b.logp_old.exp(), b.logp_old, logp)
        up, down = logp > b.logp_old, logp < b.logp_old
        # "not inside" rather than "beyond": a NaN divergence (p > 1 from a bad log-prob) is
        # outside, as verl's (D <= delta) test has it
        return b.adv_neg & down & ~(d <= self.delta_low), b.adv_pos & up & ~(d <= self.delta_high)


#: VESPO's lower bound on the log of the sequence ratio, ``log 1e-8`` (TRL's and the reference
#: code's ``w.clamp(min=1e-8)``); the upper bound is the usual 20.
VESPO_LOG_W_MIN = math.log(1e-8)


@register_objective("vespo")
class VESPO(RatioObjective):
    r"""VESPO: REINFORCE with a detached gamma-kernel weight of the sequence ratio.

    Equation (``w_i = prod_t r_{i,t}``, the unnormalised sequence ratio; ``(k, lam) = (k_pos,
    lambda_pos)`` if A >= 0 else ``(k_neg, lambda_neg)``)::

        phi(w) = e^lam * w^k * e^(-lam w)       (phi(1) = 1, maximal at w = k / lam)
        loss_t = -sg(phi(w_i)) * A_t * logp_t

    Gradient weight (coef = g * A, the same for every token of the sequence):

        A >= 0:  g = phi(w) with (k_pos, lambda_pos)      A < 0:  g = phi(w) with (k_neg, lambda_neg)

    never exactly 0: g rises as w^k from 0 at w -> 0 to its peak at w = k / lam and then decays as
    e^(-lam w), a soft trust region on the whole sequence (no length normalisation: one token that
    moved far moves w as much as many that moved a little). ``expected_coef(w, A)`` takes the
    sequence ratio w (:meth:`sequence_ratio`), as gspo's takes its length-normalised one.

    Paper: VESPO, arXiv 2602.10693 (the variational reshaping kernel). TRL ``loss_type="vespo"``
    defaults (k, lam) = (2, 3) for A >= 0 and (3, 2) for A < 0, the defaults here (preset
    ``vespo_trl``, with TRL's token-mean normaliser); [open] the paper's own defaults are not
    checked here.

    Deviations: none from TRL 1.16's ``get_gamma_weights``: each token's log-ratio is clamped to
    ±20 and the sum to ``[log 1e-8, 20]``. TRL folds its vLLM importance ratio (token modes)
    into w; ``llm.adapters.trl`` does the same by giving the rule the sampler's log-probs as
    ``logp_old`` (docs/adapters.md). TRL clamps lambda at 1e-4 from below (here lambda > 0) and
    builds k and lambda in float32 (``torch.where`` on Python numbers), so a value not exact in
    float32 (0.7) gives TRL a phi ~1e-8 off the float64 one.
    """

    level = "sequence"
    through_ratio = False
    aggregation = "token-mean"  # TRL's normaliser for vespo (its dapo / cispo one)
    paper = "2602.10693"

    def __init__(
        self,
        k_pos: float = 2.0,
        lambda_pos: float = 3.0,
        k_neg: float = 3.0,
        lambda_neg: float = 2.0,
    ) -> None:
        self.k_pos = check_range("k_pos", k_pos, 0.0, low_open=True)
        self.lambda_pos = check_range("lambda_pos", lambda_pos, 0.0, low_open=True)
        self.k_neg = check_range("k_neg", k_neg, 0.0, low_open=True)
        self.lambda_neg = check_range("lambda_neg", lambda_neg, 0.0, low_open=True)

    def sequence_ratio(self, raw_log_ratio: Tensor, mask: Tensor) -> Tensor:
        with torch.no_grad():
            return self._log_w(raw_log_ratio, mask).squeeze(-1).exp()

    @staticmethod
    def _log_w(raw_log_ratio: Tensor, mask: Tensor) -> Tensor:
        """``[B, 1]`` ``clamp(sum_t clamp(log r_t, ±20), log 1e-8, 20)`` (detached)."""
        lr = torch.where(mask, raw_log_ratio.detach(), 0.0)
        total = lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).sum(-1, keepdim=True)
        return total.clamp(VESPO_LOG_W_MIN, LOG_RATIO_CLAMP)

    def _log_phi(self, log_w: Tensor, adv: Tensor) -> Tensor:
        nonneg = adv >= 0
        k = torch.where(nonneg, adv.new_tensor(self.k_pos), adv.new_tensor(self.k_neg))
        lam = torch.where(nonneg, adv.new_tensor(self.lambda_pos), adv.new_tensor(self.lambda_neg))
        return lam + k * log_w - lam * log_w.exp()

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        log_w = ratio.log().clamp(VESPO_LOG_W_MIN, LOG_RATIO_CLAMP)
        return self._log_phi(log_w, adv).exp()

    def compute(self, b: Batch, noise: Tensor | None) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        log_w = self._log_w(b.raw_lr, b.mask)  # [B, 1]
        phi = self._log_phi(log_w, b.adv).exp()  # [B, T] (the sign of A per token)
        coef = torch.where(b.mask, b.adv * phi, 0.0)
        token_lr = b.raw_lr.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        log_w = log_w.expand_as(token_lr)
        metrics = ratio_metrics(log_w, log_w.exp(), b, token_lr)
        metrics["phi_mean"] = b.total(phi * b.maskf) / b.n
        return -coef * b.logp, lambda: coef, metrics
