r"""The one loss assembly: objective -> importance weights -> aggregate -> + KL -> - entropy.

Every trainer in the project (the bandit and sequence trainers in :mod:`sandbox.train`, the LLM
driver :mod:`llm.train`) and both framework adapters (:mod:`llm.adapters.trl`,
:mod:`llm.adapters.verl`) turn per-token log-probs into the scalar they call ``backward`` on
here, and nowhere else::

    out       = objective(logp, logp_old, adv, mask)                  # sandbox.objectives
    w         = sg(rho)  [* caller's extra weights]                   # sandbox.correction (opt.)
                [* M_off-policy * M_entropy]                          # sandbox.masks (opt.)
    per_token = w * out.loss
              + kl_coef * kl_weight * KL_k3(pi || pi_ref)            # sandbox.kl (optional)
              - entropy_coef * H(pi)                                  # (optional)
    loss      = aggregate(per_token, mask, mode, num_tokens, num_seqs, max_len, groups)

``aggregate`` is linear in the per-token loss for a fixed mask and fixed counts, so adding the
terms before one ``aggregate`` equals aggregating each term with the same counts and adding the
scalars (what verl and TRL write as ``pg_loss + beta * kl_loss - entropy_coef * entropy_loss``),
in one reduction instead of three. The importance weight multiplies the objective's loss only:
the KL and entropy terms are not policy-gradient surrogates of the rollout's samples.

Micro-batching: pass the *global* counts of the whole minibatch (``num_tokens``, ``num_seqs``),
and the sum over micro-batches of ``loss`` equals the full-minibatch loss exactly (see
:mod:`sandbox.aggregate`). ``groups=S`` aggregates ``S`` equal consecutive blocks of rows (e.g.
independent seeds) each with its own counts and sums them; an objective whose output depends on
batch statistics (``objective.batch_statistic``: Clip-Cov, KL-Cov) then gets ``groups=S`` too and
ranks each block on its own, in one call: a block's selection never sees another block's tokens.

The two modifiers of :mod:`sandbox.masks` compose with any objective: ``off_policy_mask=delta``
drops the negative-advantage sequences whose mean KL(pi_sampler || pi) exceeds delta (DeepSeek-V3.2;
TRL ``off_policy_mask_threshold``; the sampler is ``rollout_logp`` when given, else ``logp_old``)
and ``top_entropy_quantile=q`` keeps only the top-q share of valid tokens by entropy (arXiv
2506.01939; TRL ``top_entropy_quantile``; needs ``entropy``; per block with ``groups``). Both
multiply the objective's loss only, like the IS weight, and leave the aggregation's counts as
they are (TRL's convention); the entropy bonus and the KL term are not masked (TRL's entropy
bonus is: it averages over the kept tokens only).

Metrics (0-d tensors, or ``[groups]`` for a per-block objective's own metrics; detached, no host
sync): the objective's, the correction's (``rollout_is_*``, ``rollout_kl_k3``), ``kl_ref_k3``
(mean over valid tokens of the KL term, times ``kl_weight`` when given), ``entropy`` (mean
over valid tokens) when given, ``off_policy_masked_frac`` (share of non-empty sequences dropped)
and ``entropy_masked_frac`` (share of valid tokens masked) when those options are on.
With ``grad_mass=True`` also the advantage-weighted gradient mass shares of
:func:`grad_mass_shares` (``grad_mass_zero_lo``, ``grad_mass_zero_hi``, ``grad_mass_rescued``):
read off the objective's ``coef``, they change nothing in the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregate import AGGREGATION_MODES, aggregate
from .correction import IS_LEVELS, IS_MODES, rollout_is_weights
from .kl import KL_ESTIMATORS, kl_divergence
from .masks import check_off_policy_mask, check_top_entropy_quantile, high_entropy_mask
from .masks import off_policy_mask as off_policy_sequence_mask
from .objectives import LOG_RATIO_CLAMP, Objective

ROLLOUT_IS_CHOICES = ("none", *IS_MODES)


@dataclass(frozen=True)
class LossOutput:
    """The scalar to call ``backward`` on, and the step's metrics (0-d tensors, detached)."""

    loss: Tensor
    metrics: dict[str, Tensor]


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask != 0`` (detached; 0 for an empty mask)."""
    valid = mask != 0
    return torch.where(valid, x.detach(), 0.0).sum() / valid.sum().clamp(min=1)


#: The hard-clip bounds a rule without its own is measured against (DAPO's, arXiv 2503.14476).
REFERENCE_BOUNDS = (0.2, 0.28)


def grad_mass_shares(
    coef: Tensor,
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    eps_low: float | None = None,
    eps_high: float | None = None,
) -> dict[str, Tensor]:
    """Where a rule's gradient goes, as shares of the unclipped gradient's advantage-weighted mass.

    The unclipped surrogate ``r * A`` has coefficient ``r * A`` (``r = exp(logp - logp_old)``);
    its mass on the valid tokens is ``M = sum |r * A|``. With ``coef`` the rule's realised
    coefficient (``out.coef``):

    - ``grad_mass_zero_lo``: ``sum |r A| [coef = 0, r < 1] / M`` (the Z_lo side discarded),
    - ``grad_mass_zero_hi``: ``sum |r A| [coef = 0, r > 1] / M`` (the Z_hi side discarded),
    - ``grad_mass_rescued``: ``sum |r A| [hard clip binds, coef != 0] / M``, the hard clip
      binding where ``A > 0, r > 1 + eps_high`` or ``A < 0, r < 1 - eps_low`` (the rule's own
      bounds; :data:`REFERENCE_BOUNDS` for a rule without them): mass a hard clip would drop
      that this rule keeps (NSR's rescue, the soft clips' tails).

    All detached 0-d tensors (0 where ``M = 0``); tokens are pooled over the batch.
    """
    valid = mask != 0
    adv = (adv if adv.dim() == 2 else adv[:, None]).detach().expand_as(logp)
    r = torch.exp((logp.detach() - logp_old.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    mass = torch.where(valid, (r * adv).abs(), 0.0)
    total = mass.sum().clamp(min=torch.finfo(mass.dtype).tiny)
    zero = coef.detach() == 0
    lo, hi = REFERENCE_BOUNDS if eps_low is None or eps_high is None else (eps_low, eps_high)
    binds = ((adv > 0) & (r > 1 + hi)) | ((adv < 0) & (r < 1 - lo))
    return {
        "grad_mass_zero_lo": (mass * (zero & (r < 1))).sum() / total,
        "grad_mass_zero_hi": (mass * (zero & (r > 1))).sum() / total,
        "grad_mass_rescued": (mass * (binds & ~zero)).sum() / total,
    }


@dataclass(frozen=True)
class PolicyLoss:
    """The per-micro-batch loss of a policy-gradient step, configured once per run.

    Args:
        objective: from :func:`sandbox.objectives.get_objective`.
        aggregation: a mode of :func:`sandbox.aggregate.aggregate` (default: the objective's).
        kl_coef: coefficient of the KL to the reference policy (0: no KL term).
        kl_estimator: ``"k3"`` (default; verl's ``low_var_kl``, TRL's ``per_token_kl``), ``"k1"``,
            ``"k2"`` (:func:`sandbox.kl.kl_divergence`).
        entropy_coef: coefficient of the entropy bonus (0: none); needs ``entropy`` with gradient.
        rollout_is: ``"none"``, ``"truncate"`` (TIS) or ``"mask"`` (MIS): weight the objective's
            loss by ``pi_old / pi_rollout`` (:func:`sandbox.correction.rollout_is_weights`);
            needs ``rollout_logp``.
        rollout_is_level, rollout_is_min, rollout_is_max: that weight's level and bounds.
        off_policy_mask: ``None`` (off) or delta > 0: drop the sequences with A < 0 whose mean
            k1 KL(pi_sampler || pi) exceeds delta (:func:`sandbox.masks.off_policy_mask`).
        top_entropy_quantile: q in (0, 1] (1: off): keep the top-q share of valid tokens by
            entropy (:func:`sandbox.masks.high_entropy_mask`); needs ``entropy``.
        grad_mass: also report :func:`grad_mass_shares` of the objective's coefficients
            (metrics only; the loss is unchanged).
    """

    objective: Objective
    aggregation: str | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    rollout_is: str = "none"
    rollout_is_level: str = "token"
    rollout_is_min: float = 0.0
    rollout_is_max: float = 2.0
    off_policy_mask: float | None = None
    top_entropy_quantile: float = 1.0
    grad_mass: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.objective, Objective):
            raise ValueError(
                f"objective must be a sandbox Objective (get_objective), got {self.objective!r}"
            )
        if self.aggregation is not None and self.aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"aggregation must be one of {list(AGGREGATION_MODES)}, got {self.aggregation!r}"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"kl_estimator must be one of {list(KL_ESTIMATORS)}, got {self.kl_estimator!r}"
            )
        for name in ("kl_coef", "entropy_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.rollout_is not in ROLLOUT_IS_CHOICES:
            raise ValueError(
                f"rollout_is must be one of {list(ROLLOUT_IS_CHOICES)}, got {self.rollout_is!r}"
            )
        if self.rollout_is_level not in IS_LEVELS:
            raise ValueError(
                f"rollout_is_level must be one of {list(IS_LEVELS)}, got {self.rollout_is_level!r}"
            )
        check_off_policy_mask(self.off_policy_mask)
        check_top_entropy_quantile(self.top_entropy_quantile)

    @property
    def mode(self) -> str:
        """The aggregation mode in use."""
        return self.aggregation or self.objective.aggregation

    def __call__(
        self,
        logp: Tensor,
        logp_old: Tensor,
        adv: Tensor,
        mask: Tensor,
        *,
        logp_ref: Tensor | None = None,
        rollout_logp: Tensor | None = None,
        entropy: Tensor | None = None,
        weights: Sequence[Tensor] = (),
        kl_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
        validate: bool = True,
        num_tokens: Tensor | float | None = None,
        num_seqs: Tensor | float | None = None,
        max_len: float | None = None,
        groups: int | None = None,
        entropy_pool: tuple[Tensor, Tensor] | None = None,
    ) -> LossOutput:
        """The loss of one (micro-)batch.

        Args:
            logp, logp_old, adv, mask: the objective's inputs (``[B, T]``; ``adv`` ``[B, 1]`` or ``[B]``).
            logp_ref: ``[B, T]`` reference log-probs; required when ``kl_coef > 0``.
            rollout_logp: ``[B, T]`` the sampler's log-probs; required with ``rollout_is``; the
                off-policy mask's sampler when given (else ``logp_old``).
            entropy: ``[B, T]`` per-token entropy (with gradient for the bonus); reported as the
                ``entropy`` metric when given, required when ``entropy_coef > 0`` or
                ``top_entropy_quantile < 1``.
            weights: extra detached ``[B, T]`` factors of the objective's loss, applied after
                the rollout weight (e.g. TRL's off-policy and entropy masks).
            kl_weight: ``[B, T]`` factor of the KL term (TRL's ``use_bias_correction_kl``).
            generator: the objective's randomness.
            validate: let the objective check its inputs (one host sync); trainers validate
                their first step only.
            num_tokens, num_seqs, max_len, groups: :func:`sandbox.aggregate.aggregate`'s counts.
            entropy_pool: ``(entropies, mask)`` the entropy quantile is taken over instead of
                this call's tokens (TRL's adapter: every process's micro-batch, as TRL gathers).
        """
        if self.kl_coef > 0 and logp_ref is None:
            raise ValueError("logp_ref is required when kl_coef > 0")
        if self.entropy_coef > 0 and entropy is None:
            raise ValueError("entropy is required when entropy_coef > 0")
        if self.rollout_is != "none" and rollout_logp is None:
            raise ValueError(f"rollout_logp is required with rollout_is={self.rollout_is!r}")
        if self.top_entropy_quantile < 1 and entropy is None:
            raise ValueError("entropy is required when top_entropy_quantile < 1")
        per_token, metrics = self._objective(logp, logp_old, adv, mask, generator, validate, groups)
        if self.rollout_is != "none":  # sg(rho), rho = pi_old / pi_rollout
            w, is_metrics = rollout_is_weights(
                logp_old,
                rollout_logp,
                mask,
                mode=self.rollout_is,
                level=self.rollout_is_level,
                cmin=self.rollout_is_min,
                cmax=self.rollout_is_max,
            )
            per_token = per_token * w
            metrics.update(is_metrics)
        for w in weights:
            per_token = per_token * w
        if self.off_policy_mask is not None:
            sampler = logp_old if rollout_logp is None else rollout_logp
            keep, metrics["off_policy_masked_frac"] = off_policy_sequence_mask(
                logp, sampler, adv, mask, self.off_policy_mask
            )
            per_token = per_token * keep
        if self.top_entropy_quantile < 1:
            keep, metrics["entropy_masked_frac"] = high_entropy_mask(
                entropy, mask, self.top_entropy_quantile, groups=groups, pool=entropy_pool
            )
            per_token = per_token * keep
        if logp_ref is not None:
            kl = kl_divergence(logp, logp_ref, self.kl_estimator)
            kl = kl if kl_weight is None else kl * kl_weight
            metrics[f"kl_ref_{self.kl_estimator}"] = masked_mean(kl, mask)
            if self.kl_coef > 0:
                per_token = per_token + self.kl_coef * kl
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy, mask)
            if self.entropy_coef > 0:
                per_token = per_token - self.entropy_coef * entropy
        loss = aggregate(
            per_token,
            mask,
            self.mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_len=max_len,
            groups=groups,
            validate=validate,
        )
        return LossOutput(loss, metrics)

    def _objective(
        self,
        logp: Tensor,
        logp_old: Tensor,
        adv: Tensor,
        mask: Tensor,
        generator: torch.Generator | None,
        validate: bool,
        groups: int | None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The objective's per-token loss and metrics. A batch-statistic objective with
        ``groups > 1`` ranks each block of rows on its own, in one call (``groups=`` of
        :class:`sandbox.objectives.Objective`; its metrics then ``[groups]``)."""
        grouped = self.objective.batch_statistic and groups is not None and groups > 1
        out = self.objective(
            logp,
            logp_old,
            adv,
            mask,
            generator=generator,
            validate=validate,
            groups=groups if grouped else None,
        )
        metrics = dict(out.metrics)
        if self.grad_mass:
            bounds = (
                getattr(self.objective, "eps_low", None),
                getattr(self.objective, "eps_high", None),
            )
            metrics.update(grad_mass_shares(out.coef, logp, logp_old, adv, mask, *bounds))
        return out.loss, metrics
