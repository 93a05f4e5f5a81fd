"""Every sandbox objective as a verl policy loss: ``loss_mode=sandbox_<name>``.

Importing this module registers, in verl's policy-loss registry
(``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``), one function per sandbox objective and per
preset, named ``sandbox_<name>`` (``sandbox_ppo_clip``, ``sandbox_nsr``, ``sandbox_nsr_gspo``, ...),
with verl's policy-loss signature::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)
        -> (pg_loss, metrics)

Each call: the per-token loss comes from the sandbox objective (``obj(log_prob, old_log_prob,
advantages, response_mask)``), is multiplied by ``rollout_is_weights`` when verl passes them
(rollout/trainer mismatch correction; for ``gmpo``, as verl's ``geo_mean`` does, by their
per-sequence geometric mean, :data:`VERL_GEOMETRIC_IS`), and is reduced with verl's own ``agg_loss`` under
``loss_agg_mode`` and ``config.global_batch_info`` (dp size, global token and sequence counts,
``loss_scale_factor``), exactly as verl's built-in losses do. Nothing here defines a loss.

Hyperparameters, highest precedence first:

1. ``config.policy_loss.objective_params``: any parameter of the sandbox objective (a dict; use
   :class:`SandboxPolicyLossConfig` as the ``policy_loss`` target so that Hydra accepts it);
2. the preset's parameters, when ``<name>`` is a preset (``sandbox_dapo``, ``sandbox_nsr_gspo``);
3. verl's actor config, with verl's meaning, for the parameters the objective accepts
   (:data:`VERL_SOURCES`): ``clip_ratio_low/high`` (or ``clip_ratio``) -> ``eps_low/eps_high``
   (CISPO: ``lower = max(0, 1 - clip_ratio_low)``, ``upper = 1 + clip_ratio_high``),
   ``clip_ratio_c`` -> ``clip_c`` (dual clip), ``tau_pos/tau_neg``, and ``policy_loss.clip_cov_*``,
   ``kl_cov_ratio``, ``ppo_kl_coef``, ``policy_loss.dro_beta`` -> ``beta`` (dro), and for DPPO
   ``clip_ratio_low/high`` -> ``delta_low/delta_high``, ``clip_ratio_c`` -> ``tis_cap``;
4. the objective's own defaults (its paper's settings).

verl's ``geo_mean`` (GMPO) ignores ``loss_agg_mode`` and ``global_batch_info``: it is a plain mean
over the micro-batch's rows, fully padded ones included. ``sandbox_gmpo`` reduces with ``agg_loss``
like every sandbox loss; it equals ``geo_mean`` under ``seq-mean-token-mean`` when the global batch
is the micro-batch (``global_batch_size`` = its rows, ``dp_size`` 1).

Stochastic objectives (``nsr``, ``clip_cov``) draw from their own generator, seeded with
``seed + rank`` (the torch.distributed rank), so data-parallel ranks draw independent noise and a
rerun draws the same. One objective object is kept per (name, parameters) in each process.

Metrics: verl's keys ``actor/pg_clipfrac`` (share of valid tokens in the dead zone Z = Z_lo ∪ Z_hi,
i.e. ``clip_low_frac + clip_high_frac``), ``actor/pg_clipfrac_lower`` (``dual_clip_frac``) and
``actor/ppo_kl`` (mean of ``old_log_prob - log_prob``, verl's k1), plus every sandbox metric as
``actor/sandbox/<name>``. They are returned as Python floats read back in one device->host
transfer (verl's own losses read each one with ``.item()``); verl averages them over micro-batches.

Activation in a verl run: see ``docs/adapters.md`` (``loss_mode=sandbox_nsr``, importing this
module in every Ray worker through ``actor_rollout_ref.model.external_lib``, a command line).

Supported verl: :data:`SUPPORTED_VERL` (tested with 0.9.1).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from torch import Tensor

try:
    import verl
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, agg_loss, register_policy_loss
    from verl.workers.config import PolicyLossConfig
except ImportError as exc:  # a clear hint instead of a bare ModuleNotFoundError
    raise ImportError(
        f"llm.adapters.verl needs verl ({exc}): pip install 'clip-sandbox[verl]' "
        "(or the minimal CPU install in docs/adapters.md)"
    ) from exc

from sandbox.kl import kl_divergence
from sandbox.objectives import (
    PRESETS,
    Objective,
    available_objectives,
    available_presets,
    get_objective,
    objective_class,
)

__all__ = [
    "PREFIX",
    "SUPPORTED_VERL",
    "VERL_GEOMETRIC_IS",
    "VERL_SOURCES",
    "SandboxPolicyLossConfig",
    "make_policy_loss",
    "objective_for",
    "register_all",
    "resolve_params",
]

PREFIX = "sandbox_"
SUPPORTED_VERL = ">=0.9.1,<0.10"

if verl.__version__ not in SpecifierSet(SUPPORTED_VERL):
    warnings.warn(
        f"llm.adapters.verl is tested with verl {SUPPORTED_VERL}; found verl {verl.__version__}",
        stacklevel=2,
    )


@dataclass
class SandboxPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus ``objective_params``: sandbox hyperparameters by name.

    Hydra instantiates ``policy_loss`` from its ``_target_``; point it here so the extra key is
    accepted (and, as a side effect, this module is imported wherever the actor config is built)::

        actor_rollout_ref.actor.policy_loss._target_=llm.adapters.verl.SandboxPolicyLossConfig
        +actor_rollout_ref.actor.policy_loss.objective_params.noise=band
        +actor_rollout_ref.actor.policy_loss.objective_params.sigma=0.1
    """

    objective_params: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# verl actor config -> sandbox parameters
# --------------------------------------------------------------------------------------------------


def _get(config: Any, key: str) -> Any:
    """``config.key`` for verl dataclass configs, ``DictConfig`` and plain dicts (None if absent)."""
    if config is None:
        return None
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _clip_ratios(config: Any) -> tuple[float | None, float | None]:
    """verl's ``(clip_ratio_low, clip_ratio_high)``, each falling back to ``clip_ratio``."""
    clip = _get(config, "clip_ratio")
    low, high = _get(config, "clip_ratio_low"), _get(config, "clip_ratio_high")
    return (clip if low is None else low), (clip if high is None else high)


def _shifted(value: float | None, sign: float) -> float | None:
    return None if value is None else 1.0 + sign * float(value)


#: Sandbox parameter -> how verl's actor config spells it (verl's meaning). Applied to the
#: parameters the objective accepts; a source giving ``None`` leaves the objective's default.
VERL_SOURCES: dict[str, Callable[[Any], Any]] = {
    "eps_low": lambda c: _clip_ratios(c)[0],
    "eps_high": lambda c: _clip_ratios(c)[1],
    "clip_c": lambda c: _get(c, "clip_ratio_c"),
    # CISPO's absolute bounds, as verl's cispo clamps: [1 - clip_ratio_low, 1 + clip_ratio_high];
    # a negative lower bound (clip_ratio_low > 1) is no lower bound, which is lower = 0.
    "lower": lambda c: None if (s := _shifted(_clip_ratios(c)[0], -1.0)) is None else max(0.0, s),
    "upper": lambda c: _shifted(_clip_ratios(c)[1], 1.0),
    "tau_pos": lambda c: _get(c, "tau_pos"),
    "tau_neg": lambda c: _get(c, "tau_neg"),
    "clip_cov_ratio": lambda c: _get(_get(c, "policy_loss"), "clip_cov_ratio"),
    "clip_cov_lb": lambda c: _get(_get(c, "policy_loss"), "clip_cov_lb"),
    "clip_cov_ub": lambda c: _get(_get(c, "policy_loss"), "clip_cov_ub"),
    "kl_cov_ratio": lambda c: _get(_get(c, "policy_loss"), "kl_cov_ratio"),
    "ppo_kl_coef": lambda c: _get(_get(c, "policy_loss"), "ppo_kl_coef"),
    "beta": lambda c: _get(_get(c, "policy_loss"), "dro_beta"),  # dro
    # DPPO: verl reads clip_ratio_low/high as the divergence bounds, clip_ratio_c as the TIS cap
    "delta_low": lambda c: _clip_ratios(c)[0],
    "delta_high": lambda c: _clip_ratios(c)[1],
    "tis_cap": lambda c: _get(c, "clip_ratio_c"),
}


def _plain(value: Any) -> Any:
    """OmegaConf containers -> Python containers (objective parameters are plain values)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


#: verl fields that verl's own loss of the same name never reads: clip_cov's verl loss has no dual
#: clip (``clip_ratio_c`` unused), so sandbox_clip_cov does not take it from the config either.
VERL_UNUSED: dict[str, frozenset[str]] = {"clip_cov": frozenset({"clip_c"})}


def resolve_params(name: str, config: Any) -> dict[str, Any]:
    """The keyword arguments for ``get_objective(name, ...)`` under verl actor config ``config``.

    Precedence (highest first): ``config.policy_loss.objective_params``, the preset's parameters,
    verl's fields (:data:`VERL_SOURCES`), the objective's defaults. A ``seed`` parameter (stochastic
    objectives) is offset by the distributed rank.
    """
    preset = PRESETS.get(name)
    base = preset.objective if preset else name
    accepted = set(objective_class(base).param_names()) - VERL_UNUSED.get(base, frozenset())
    params: dict[str, Any] = {}
    for key, source in VERL_SOURCES.items():
        if key in accepted and (value := source(config)) is not None:
            params[key] = float(value)
    if preset is not None:
        params.update(preset.params)
    extra = _plain(_get(_get(config, "policy_loss"), "objective_params")) or {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"policy_loss.objective_params must be a mapping, got {extra!r}")
    params.update(extra)
    if "seed" in accepted:
        params["seed"] = int(params.get("seed", 0)) + _rank()
    return params


#: Sandbox objectives whose verl loss applies the rollout IS weights as their per-sequence
#: geometric mean ``exp(mean_t log w_t)`` (verl ``geo_mean``, with its 1e-10 and 1e-8 guards),
#: which keeps GMPO's sequence value a geometric mean; every other loss multiplies per token.
VERL_GEOMETRIC_IS: frozenset[str] = frozenset({"gmpo"})


def _rollout_weights(obj: Objective, weights: Tensor, mask: Tensor) -> Tensor:
    if obj.name not in VERL_GEOMETRIC_IS:
        return weights
    maskf = mask.to(weights.dtype)
    log_w = (torch.log(weights + 1e-10) * maskf).sum(-1, keepdim=True)
    return torch.exp(log_w / (maskf.sum(-1, keepdim=True) + 1e-8))


_OBJECTIVES: dict[tuple[str, str], Objective] = {}


def objective_for(name: str, config: Any) -> Objective:
    """The (cached) sandbox objective that ``sandbox_<name>`` runs under ``config``.

    Cached per process and parameter set, so a stochastic objective's generator advances from one
    call to the next instead of replaying the same draws."""
    params = resolve_params(name, config)
    key = (name, repr(sorted(params.items())))
    obj = _OBJECTIVES.get(key)
    if obj is None:
        obj = _OBJECTIVES[key] = get_objective(name, **params)
    return obj


# --------------------------------------------------------------------------------------------------
# The registered functions
# --------------------------------------------------------------------------------------------------


def _metrics(
    metrics: dict[str, Tensor], log_prob: Tensor, old_log_prob: Tensor, mask: Tensor
) -> dict[str, float]:
    """verl's metric keys plus ``actor/sandbox/<name>``, read back in one transfer."""
    with torch.no_grad():
        dtype = torch.promote_types(log_prob.dtype, torch.float32)
        maskf = mask.to(dtype)
        k1 = kl_divergence(old_log_prob.detach().to(dtype), log_prob.detach().to(dtype), "k1")
        zero = maskf.new_zeros(())
        clip = metrics.get("clip_low_frac", zero) + metrics.get("clip_high_frac", zero)
        values = {
            "actor/pg_clipfrac": clip,
            "actor/ppo_kl": (k1 * maskf).sum() / maskf.sum().clamp(min=1),
            "actor/pg_clipfrac_lower": metrics.get("dual_clip_frac", zero),
        }
        values.update({f"actor/sandbox/{k}": v for k, v in metrics.items()})
        stacked = torch.stack([v.to(device=maskf.device, dtype=dtype) for v in values.values()])
        return dict(zip(values, stacked.tolist(), strict=True))


def make_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, float]]]:
    """verl policy-loss function running sandbox objective or preset ``name``."""
    get_objective(name)  # unknown names fail here, with the list of valid ones

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        if config is None:
            raise ValueError(f"{PREFIX}{name} needs verl's actor config (config=None was passed)")
        obj = objective_for(name, config)
        # validate=False: no host sync, and an all-padding micro-batch gives 0 as in verl.
        out = obj(log_prob, old_log_prob, advantages, response_mask, validate=False)
        pg_losses = out.loss
        if rollout_is_weights is not None:
            pg_losses = pg_losses * _rollout_weights(obj, rollout_is_weights, response_mask)
        batch_info = _get(config, "global_batch_info") or {}
        pg_loss = agg_loss(
            loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info
        )
        return pg_loss, _metrics(out.metrics, log_prob, old_log_prob, response_mask)

    policy_loss.__name__ = policy_loss.__qualname__ = f"compute_policy_loss_{PREFIX}{name}"
    policy_loss.__doc__ = (
        f"verl policy loss running the sandbox objective {name!r} (llm.adapters.verl)."
    )
    return policy_loss


def register_all() -> list[str]:
    """Register ``sandbox_<name>`` for every sandbox objective and preset; returns the names.

    Runs on import; call it again after registering a new sandbox objective."""
    names = []
    for name in [*available_objectives(), *available_presets()]:
        key = PREFIX + name
        if key not in POLICY_LOSS_REGISTRY:
            register_policy_loss(key)(make_policy_loss(name))
        names.append(key)
    return names


REGISTERED: list[str] = register_all()
