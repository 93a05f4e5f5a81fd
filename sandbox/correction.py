r"""Rollout/trainer-mismatch importance correction: truncated (TIS) or masked (MIS) weights.

The sampler (vLLM, SGLang, or Hugging Face ``generate`` in bf16 with a KV cache) and the trainer
compute slightly different probabilities for the same tokens, so the completions are samples of
:math:`\pi_\text{rollout}`, not of :math:`\pi_\text{old}`, the trainer's policy the objective's
ratio is taken against. The correction multiplies the per-token loss of any objective by a
detached weight before aggregation (what verl's ``rollout_is_weights`` argument and TRL's
``per_token_loss * importance_sampling_ratio`` do)::

    loss_t  <-  sg(w_t) * loss_t

with, for a completion i and its valid tokens t (``mask == 1``),

.. math::

    \delta_{i,t} = \log\pi_\text{old}(y_t) - \log\pi_\text{rollout}(y_t)

    \text{token level:}\quad \rho_{i,t} = \exp(\mathrm{clamp}(\delta_{i,t}, -20, 20))

    \text{sequence level:}\quad \rho_{i,t} = \rho_i
        = \exp\Big(\mathrm{clamp}\big(\textstyle\sum_{t'} \delta_{i,t'}, -20, 20\big)\Big)

    \text{truncate (TIS):}\quad w = \mathrm{clamp}(\rho, c_\min, c_\max)

    \text{mask (MIS):}\quad w = \rho \cdot \mathbb{1}[c_\min \le \rho \le c_\max]

and ``w = 0`` on padding. Conventions, matched to the frameworks:

- **Sequence level is the product of the token ratios** (the *sum* of the log differences over
  valid tokens, not their mean): TRL 1.16 ``GRPOTrainer`` (``vllm_importance_sampling_mode=
  "sequence_truncate" | "sequence_mask"``: ``(old - sampling) * mask`` summed over tokens, then
  ``exp``) and verl 0.9 ``compute_rollout_correction_weights(rollout_is="sequence")``
  (``masked_sum`` of the log ratio). A length-normalised (geometric-mean) ratio is a different
  estimator and not offered here.
- **Mask mode keeps the ratio** on the kept tokens/sequences and zeroes the others (TRL's
  ``masked_fill(ratio < C_min | ratio > C_max, 0)``, verl's IcePop ``"lower_upper"`` threshold);
  it is not the 0/1 indicator. Bounds are inclusive in both.
- The ``±20`` clamp of the log ratio before ``exp`` (:data:`sandbox.objectives.LOG_RATIO_CLAMP`,
  the objectives' clamp) is verl's ``SAFETY_BOUND``; TRL applies no such
  clamp (``exp`` may overflow to ``inf``, which truncation then clips and masking drops). The two
  agree whenever ``|log rho| <= 20`` or ``c_max < e^20``.
- ``c_min = 0`` (the default) is "no lower bound": TRL's ``vllm_importance_sampling_clip_min=None``
  and verl's single-float threshold (``clamp(max=C)``). TRL's default bound is ``C_max = 3``,
  verl's ``2``; the default here is verl's.
- A NaN rollout log-prob (a token the sampler could not score) gives ``delta = 0``, i.e. no
  correction, as in TRL.

Metrics (0-d, detached; over valid tokens at token level, over non-empty sequences at
sequence level):

- ``rollout_is_mean``: mean weight after truncation/masking;
- ``rollout_is_clip_frac`` (truncate) or ``rollout_is_masked_frac`` (mask): share of units with
  :math:`\rho \notin [c_\min, c_\max]`;
- ``rollout_kl_k3``: the k3 estimate :math:`\rho - 1 - \log\rho` with token ratios
  :math:`\rho_t = \pi_\text{old}/\pi_\text{rollout}`, averaged over valid tokens: an unbiased
  estimate of :math:`\mathrm{KL}(\pi_\text{rollout}\,\|\,\pi_\text{old})` per token, since the
  tokens are samples of :math:`\pi_\text{rollout}`.

References: F. Yao, L. Liu, D. Zhang, C. Dong, J. Shang, J. Gao, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (2025 blog post: truncated importance sampling,
TIS); the masked variant (MIS, "IcePop" in verl) and the token/sequence levels follow TRL's
``vllm_importance_sampling_mode`` (``token_truncate``, ``token_mask``, ``sequence_truncate``,
``sequence_mask``) and verl's ``algorithm.rollout_correction`` (``rollout_is: token|sequence``,
``rollout_is_threshold``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .objectives import LOG_RATIO_CLAMP

__all__ = ["IS_LEVELS", "IS_MODES", "rollout_is_weights"]

IS_MODES = ("truncate", "mask")
IS_LEVELS = ("token", "sequence")


def rollout_is_weights(
    logp_old: Tensor,
    logp_rollout: Tensor,
    mask: Tensor,
    *,
    mode: str = "truncate",
    level: str = "token",
    cmin: float = 0.0,
    cmax: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Detached importance weights ``[B, T]`` (0 on padding) and their metrics; see the module
    docstring for the equations and conventions.

    Args:
        logp_old: ``[B, T]`` trainer log-probs of the sampled tokens (pi_old).
        logp_rollout: ``[B, T]`` the sampler's log-probs of the same tokens (pi_rollout).
        mask: ``[B, T]`` 1 on valid tokens, 0 on padding.
        mode: ``"truncate"`` (TIS, clamp to ``[cmin, cmax]``) or ``"mask"`` (MIS, zero outside).
        level: ``"token"`` (one ratio per token) or ``"sequence"`` (product over the sequence).
        cmin: lower bound, ``>= 0`` (0: none).
        cmax: upper bound, ``> 0`` and ``>= cmin`` (``math.inf``: none).
    """
    if mode not in IS_MODES:
        raise ValueError(f"mode must be one of {list(IS_MODES)}, got {mode!r}")
    if level not in IS_LEVELS:
        raise ValueError(f"level must be one of {list(IS_LEVELS)}, got {level!r}")
    cmin, cmax = float(cmin), float(cmax)
    if math.isnan(cmin) or not 0.0 <= cmin < math.inf:
        raise ValueError(f"cmin must be a finite number >= 0, got {cmin}")
    if math.isnan(cmax) or not cmax > 0.0:
        raise ValueError(f"cmax must be > 0, got {cmax}")
    if cmax < cmin:
        raise ValueError(f"cmax must be >= cmin ({cmin}), got {cmax}")
    if logp_old.dim() != 2:
        raise ValueError(f"logp_old must have shape [B, T], got {tuple(logp_old.shape)}")
    for name, t in (("logp_rollout", logp_rollout), ("mask", mask)):
        if t.shape != logp_old.shape:
            raise ValueError(
                f"{name} must have the shape of logp_old {tuple(logp_old.shape)}, "
                f"got {tuple(t.shape)}"
            )

    with torch.no_grad():
        valid = mask.bool()
        delta = (logp_old.detach().float() - logp_rollout.detach().float()).nan_to_num(0.0)
        delta = torch.where(valid, delta, 0.0)
        log_rho_tok = delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        if level == "token":
            log_rho = log_rho_tok
            units = valid  # one unit per valid token
        else:
            log_rho = delta.sum(-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            log_rho = log_rho.expand_as(delta)
            units = valid.any(-1, keepdim=True)  # one unit per non-empty sequence
        rho = torch.exp(log_rho)
        outside = (rho < cmin) | (rho > cmax)
        w = rho.clamp(cmin, cmax) if mode == "truncate" else torch.where(outside, 0.0, rho)
        w = torch.where(valid, w, 0.0)

        if level == "token":
            unit_w, unit_out = w, outside
        else:
            # every valid token of a sequence carries its weight (>= 0), padding carries 0
            unit_w, unit_out = w.amax(-1, keepdim=True), outside[:, :1]
        n_units = units.sum().clamp(min=1).float()
        n_tok = valid.sum().clamp(min=1).float()
        k3 = torch.exp(log_rho_tok) - 1.0 - log_rho_tok
        frac = torch.where(units, unit_out, False).sum().float() / n_units
        metrics = {
            "rollout_is_mean": torch.where(units, unit_w, 0.0).sum() / n_units,
            ("rollout_is_clip_frac" if mode == "truncate" else "rollout_is_masked_frac"): frac,
            "rollout_kl_k3": torch.where(valid, k3, 0.0).sum() / n_tok,
        }
    return w, metrics
