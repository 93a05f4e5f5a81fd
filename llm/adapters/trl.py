"""Any sandbox objective inside TRL: ``SandboxGRPOTrainer``, a ``trl.GRPOTrainer`` subclass.

    from llm.adapters.trl import SandboxGRPOTrainer

    trainer = SandboxGRPOTrainer(
        model=model, reward_funcs=reward, args=GRPOConfig(...), train_dataset=dataset,
        objective="nsr_dapo",                      # registry name or preset
        objective_params={"noise": "band", "sigma": 0.1},
    )
    trainer.train()

Everything TRL does around the loss stays TRL's (generation, rewards, advantages, the old and
reference log-probs, vLLM, accelerate/DeepSpeed/FSDP); only the loss is replaced. Per
micro-batch, ``_compute_loss``:

1. computes the completion log-probs and entropies with TRL's own
   ``_get_per_token_logps_and_entropies``;
2. calls the sandbox objective ``obj(logp, old_logp, advantages, mask)`` (``old_logp`` is TRL's
   ``old_per_token_logps``, or the detached current log-probs when TRL skipped them on-policy);
3. multiplies the per-token loss by TRL's vLLM importance-sampling correction
   (``vllm_importance_sampling_correction``: TRL's truncated or masked, token or sequence ratio;
   for ``vespo``, as TRL's own vespo does, the token ratios go into the sequence ratio instead:
   :data:`TRL_IS_IN_RATIO`) and, when their options are on, by the sandbox's own masks (:mod:`sandbox.masks`, options of
   :class:`sandbox.loss.PolicyLoss`, equal to TRL's): the off-policy sequence mask
   (``off_policy_mask_threshold``, against TRL's ``sampling_per_token_logps`` when vLLM gave them,
   else the old log-probs) and the high-entropy token mask (``top_entropy_quantile``, its quantile
   over the micro-batches of every process, as TRL gathers them);
4. adds ``beta * k3`` to the reference model (:func:`sandbox.kl.k3`, TRL's estimator; times the
   importance ratio with ``use_bias_correction_kl``);
5. reduces with :func:`sandbox.aggregate.aggregate` and TRL's normaliser for that mode
   (steps 2-5 are one call of :class:`sandbox.loss.PolicyLoss`, the project's one loss assembly)
   (:func:`trl_normalisers`), including the gradient-accumulation scaling, so a sandbox run and a
   TRL run with the matching ``loss_type`` take the same optimiser steps;
6. logs TRL's ``entropy``, ``kl`` and ``clip_ratio/{low,high,region}_mean`` and every sandbox metric
   as ``sandbox/<name>`` into ``self._metrics``, in one gather and one device->host read per
   micro-batch (TRL reads each of its metrics separately).

Which objective runs: ``objective=None`` (default) runs the sandbox equivalent of the
``GRPOConfig`` (:func:`trl_equivalent`: ``loss_type``, ``epsilon``, ``epsilon_high``, ``delta``,
``importance_sampling_level``, ``sapo_temperature_*``, ``vespo_*``), i.e. TRL's own loss computed by the sandbox.
With ``objective=`` a registry name or preset, ``objective_params`` are its keyword arguments and
those ``GRPOConfig`` loss fields are not read (the trainer logs this once); ``aggregation`` defaults
to the objective's (or preset's) own mode.

Aggregation <-> TRL normaliser (:data:`TRL_AGGREGATION`):

=========================== ============== ===================================================
sandbox mode                TRL loss_type  normaliser (train; eval drops the accumulation terms)
=========================== ============== ===================================================
token-mean                  dapo, cispo,   global tokens of the generation batch * ga / steps_per_generation / processes
                            vespo
token-mean (loss_type=bnpo) bnpo           local tokens of the micro-batch * ga
seq-mean-token-mean         grpo, sapo     local sequences * ga (all-padding sequences count)
seq-mean-token-sum          luspo          local sequences * ga
seq-mean-token-sum-norm     dr_grpo        local sequences * max_completion_length * ga
=========================== ============== ===================================================

Not supported (a ``ValueError`` at construction, never a silent bypass): TRL's entropy bonus
(``entropy_coef``, ``use_adaptive_entropy``), ``top_entropy_quantile=0`` (TRL: keep only the
highest-entropy token; the sandbox's quantile is in (0, 1]), ``vespo`` with a sequence-level vLLM
importance ratio (TRL refuses it too), a token-level objective under ``importance_sampling_level="sequence"``, and any Liger fused-loss path
that would compute the loss without calling ``_compute_loss`` (``use_liger_loss``). In TRL 1.16
``use_liger_kernel`` only patches the model's layers and the loss still comes through here.

Supported TRL: :data:`SUPPORTED_TRL`.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from torch import Tensor

try:
    import trl
    from trl import GRPOTrainer
except ImportError as exc:  # a clear hint instead of a bare ModuleNotFoundError
    raise ImportError(
        f"llm.adapters.trl needs TRL ({exc}): pip install 'clip-sandbox[trl]' "
        "(or pip install 'trl>=1.16,<1.17')"
    ) from exc

from sandbox.loss import PolicyLoss
from sandbox.objectives import LOG_RATIO_CLAMP, Objective, get_objective, log_ratio
from sandbox.objectives.reinforce import VESPO_LOG_W_MIN

__all__ = [
    "SUPPORTED_TRL",
    "TRL_AGGREGATION",
    "TRL_IS_IN_RATIO",
    "ObjectiveSpec",
    "SandboxGRPOTrainer",
    "fold_vllm_ratio",
    "trl_equivalent",
    "trl_normalisers",
]

SUPPORTED_TRL = ">=1.16,<1.17"

if trl.__version__ not in SpecifierSet(SUPPORTED_TRL):
    warnings.warn(
        f"llm.adapters.trl is tested with trl {SUPPORTED_TRL}; found trl {trl.__version__}",
        stacklevel=2,
    )

logger = logging.getLogger(__name__)

#: TRL ``loss_type`` -> the sandbox aggregation mode whose normaliser TRL uses.
TRL_AGGREGATION: dict[str, str] = {
    "grpo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "cispo": "token-mean",
    "luspo": "seq-mean-token-sum",
    "dr_grpo": "seq-mean-token-sum-norm",
    "vespo": "token-mean",
}

#: Objectives into whose sequence ratio TRL folds its vLLM importance ratio (token modes) instead
#: of multiplying the loss by it: TRL's vespo, ``log w = sum_t log r_t + sum_t clamp(log rho_t,
#: log 1e-8, 20)``. The adapter passes ``old_logp - clamp(log rho, log 1e-8, 20)`` as the rule's
#: ``logp_old``, so that its own sum gives that ``w`` (the ±20 clamp then applies per token to
#: the sum of the two log-ratios, TRL's to each: they differ only where a token's combined
#: log-ratio passes ±20, e.g. a token_mask-dropped token, log rho = log 1e-8, whose own log-ratio
#: is below -1.58; TRL also sums log rho over padding, where its rho is 1).
TRL_IS_IN_RATIO: frozenset[str] = frozenset({"vespo"})

#: GRPOConfig fields that define TRL's loss; read only when ``objective=None``.
TRL_LOSS_FIELDS = (
    "loss_type",
    "epsilon",
    "epsilon_high",
    "delta",
    "importance_sampling_level",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)


@dataclass(frozen=True)
class ObjectiveSpec:
    """A sandbox objective (registry name or preset), its parameters and its aggregation."""

    objective: str
    params: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "token-mean"

    def build(self) -> Objective:
        return get_objective(self.objective, **self.params)


def _eps(args: Any) -> tuple[float, float]:
    high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    return float(args.epsilon), float(high)


def _clip_rule(args: Any) -> tuple[str, dict[str, Any]]:
    eps_low, eps_high = _eps(args)
    params: dict[str, Any] = {"eps_low": eps_low, "eps_high": eps_high}
    if args.importance_sampling_level == "sequence":
        if args.delta is not None:
            raise ValueError(
                "TRL's delta with importance_sampling_level='sequence' has no sandbox rule"
            )
        return "gspo", params
    if args.delta is not None:
        # TRL: -min(min(r, delta) A, clip(r, 1 - eps_low, 1 + eps_high) A). For A > 0 the upper
        # bound is min(delta, 1 + eps_high); for A < 0 the gradient flows up to
        # max(delta, 1 + eps_high), a dual clip. Exact for every delta >= 1.
        delta = float(args.delta)
        params["eps_high"] = min(eps_high, delta - 1.0)
        params["clip_c"] = max(delta, 1.0 + eps_high)
    return "ppo_clip", params


def _token_only(name: str, make: Callable[[Any], dict[str, Any]]):
    def rule(args: Any) -> tuple[str, dict[str, Any]]:
        if args.importance_sampling_level != "token":
            raise ValueError(
                f"TRL's loss_type={args.loss_type!r} at importance_sampling_level="
                f"{args.importance_sampling_level!r} has no sandbox equivalent ({name} is token-level)"
            )
        return name, make(args)

    return rule


_TRL_RULES: dict[str, Callable[[Any], tuple[str, dict[str, Any]]]] = {
    **dict.fromkeys(("grpo", "bnpo", "dapo", "luspo", "dr_grpo"), _clip_rule),
    # TRL caps the ratio at the absolute epsilon_high, with no lower bound (preset cispo_trl).
    "cispo": _token_only("cispo", lambda a: {"lower": 0.0, "upper": _eps(a)[1]}),
    "sapo": _token_only(
        "sapo",
        lambda a: {
            "tau_pos": float(a.sapo_temperature_pos),
            "tau_neg": float(a.sapo_temperature_neg),
        },
    ),
    # TRL's vespo reads only the token log-ratios (its weight is of their product), whatever
    # importance_sampling_level (which then sets only the KL term's importance weight)
    "vespo": lambda a: (
        "vespo",
        {
            key: float(getattr(a, f"vespo_{key}"))
            for key in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")
        },
    ),
}


def trl_equivalent(args: Any) -> ObjectiveSpec:
    """The sandbox objective, parameters and aggregation that reproduce a ``GRPOConfig``'s loss.

    ``loss_type`` in grpo/bnpo/dapo/luspo/dr_grpo -> ``ppo_clip`` (``eps_low=epsilon``,
    ``eps_high=epsilon_high``), or ``gspo`` at ``importance_sampling_level="sequence"``;
    ``cispo`` -> ``cispo(lower=0, upper=epsilon_high)``; ``sapo`` -> ``sapo(tau_pos, tau_neg)``;
    ``vespo`` -> ``vespo(k_pos, lambda_pos, k_neg, lambda_neg)`` from ``vespo_*``. Raises
    ``ValueError`` for loss types without an equivalent.

    TRL's ``delta`` (any value >= 1) caps the unclipped term at ``min(r, delta)`` for both signs
    of A. The exact equivalent is ``ppo_clip(eps_low, eps_high=min(eps_high, delta - 1),
    clip_c=max(delta, 1 + eps_high))``: for A > 0 the gradient stops at ``min(delta, 1 +
    eps_high)``; for A < 0 it flows up to ``max(delta, 1 + eps_high)`` (a dual clip at delta
    when ``delta > 1 + eps_high``, as in TRL's docs; for smaller delta TRL's two-sided clip is
    not a dual clip, and ``clip_c = 1 + eps_high`` reproduces it).
    """
    rule = _TRL_RULES.get(args.loss_type)
    if rule is None:
        raise ValueError(
            f"TRL loss_type={args.loss_type!r} has no sandbox equivalent; pass objective= "
            f"explicitly, or use one of {sorted(_TRL_RULES)}"
        )
    name, params = rule(args)
    return ObjectiveSpec(name, params, TRL_AGGREGATION[args.loss_type])


def trl_normalisers(
    aggregation: str,
    *,
    loss_type: str,
    mask: Tensor,
    training: bool,
    grad_accum: int,
    num_items_in_batch: Tensor | None,
    num_processes: int,
    steps_per_generation: int,
    max_completion_length: int | None,
) -> dict[str, Any]:
    """Keyword arguments of :func:`sandbox.aggregate.aggregate` that reproduce TRL's normaliser.

    TRL divides the local loss by the gradient-accumulation steps ``ga`` (train mode), except for
    its global token mean (dapo, cispo), whose count already spans the generation batch; see the
    table in the module docstring.
    """
    ga = grad_accum if training else 1
    if aggregation == "token-mean":
        if loss_type == "bnpo" or num_items_in_batch is None:
            return {"num_tokens": torch.count_nonzero(mask).clamp(min=1) * ga}
        num_tokens = num_items_in_batch.clamp(min=1.0) / num_processes
        if training:
            num_tokens = num_tokens * grad_accum / steps_per_generation
        return {"num_tokens": num_tokens}
    kwargs: dict[str, Any] = {"num_seqs": mask.shape[0] * ga}  # TRL's .mean() counts every row
    if aggregation == "seq-mean-token-sum-norm":
        kwargs["max_len"] = max_completion_length
    return kwargs


def fold_vllm_ratio(old_logps: Tensor, importance_sampling_ratio: Tensor) -> Tensor:
    """``old_logps - clamp(log rho, log 1e-8, 20)``: the ``logp_old`` under which a rule's
    log-ratio is TRL's vespo one, ``log r + clamp(log rho)`` per token, with ``rho`` TRL's
    per-token vLLM ratio ``pi_old / pi_sampler`` (0 where token_mask dropped a token)."""
    log_rho = torch.log(importance_sampling_ratio).clamp(VESPO_LOG_W_MIN, LOG_RATIO_CLAMP)
    return old_logps - log_rho


class SandboxGRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose loss is a sandbox objective (see the module docstring).

    Args (in addition to ``GRPOTrainer``'s):
        objective: registry name or preset of :mod:`sandbox.objectives`; ``None`` runs the sandbox
            equivalent of the GRPOConfig's ``loss_type`` (:func:`trl_equivalent`).
        objective_params: keyword arguments of the objective (override a preset's values).
        aggregation: one of :data:`sandbox.aggregate.AGGREGATION_MODES`; default: the objective's.
        seed: seed of the generator that stochastic objectives draw from (offset by the process
            index); default ``args.seed``.
    """

    def __init__(
        self,
        *args: Any,
        objective: str | None = None,
        objective_params: Mapping[str, Any] | None = None,
        aggregation: str | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        _check_supported(self.args)
        if objective is None:
            if objective_params:
                raise ValueError("objective_params needs objective= (a registry name or preset)")
            spec = trl_equivalent(self.args)
            if aggregation is not None:
                spec = ObjectiveSpec(spec.objective, spec.params, aggregation)
        else:
            spec = ObjectiveSpec(objective, dict(objective_params or {}), aggregation or "")
        self.objective = spec.build()
        # the one loss assembly: objective x TRL's weights + beta * k3, aggregated as TRL does
        self.loss_fn = PolicyLoss(
            self.objective,
            spec.aggregation or None,
            kl_coef=self.beta,
            off_policy_mask=self.off_policy_mask_threshold,
            top_entropy_quantile=self.top_entropy_quantile,
        )
        self.aggregation = self.loss_fn.mode
        if self.args.importance_sampling_level == "sequence" and self.objective.level == "token":
            raise ValueError(
                f"importance_sampling_level='sequence' but objective {spec.objective!r} is "
                "token-level; use a sequence-level objective (gspo, nsr with level='sequence')"
            )
        if (
            self.objective.name in TRL_IS_IN_RATIO
            and self._vllm_is()
            and self.vllm_importance_sampling_mode not in ("token_truncate", "token_mask")
        ):
            raise ValueError(
                f"objective {spec.objective!r} folds TRL's vLLM importance ratio into its sequence "
                "ratio per token; set vllm_importance_sampling_mode to 'token_truncate' or "
                f"'token_mask' (got {self.vllm_importance_sampling_mode!r}), as TRL's vespo requires"
            )
        self.objective_spec = ObjectiveSpec(spec.objective, spec.params, self.aggregation)
        self._objective_seed = (self.args.seed if seed is None else seed) + (
            self.accelerator.process_index
        )
        self._objective_generator: torch.Generator | None = None
        ignored = "" if objective is None else f"; GRPOConfig's {', '.join(TRL_LOSS_FIELDS)} unused"
        logger.info(
            "SandboxGRPOTrainer: loss = %r aggregated with %s%s",
            self.objective,
            self.aggregation,
            ignored,
        )

    # -- the loss -----------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # Overridden as well as _compute_loss so that no fused-loss branch of the parent can route
        # around the sandbox objective.
        if return_outputs:
            raise ValueError("SandboxGRPOTrainer does not support returning outputs")
        return self._compute_loss(model, inputs)

    def _objective_rng(self, device: torch.device) -> torch.Generator | None:
        if not self.objective.stochastic:
            return None
        gen = self._objective_generator
        if gen is None or gen.device.type != device.type:
            gen = torch.Generator(device=device).manual_seed(self._objective_seed)
            self._objective_generator = gen
        return gen

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = (
            completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        )
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=getattr(self, "aux_loss_enabled", False),
            **{key: inputs.get(key) for key in _MODEL_INPUT_KEYS},
        )
        advantages = inputs["advantages"]
        if advantages.dim() == 1:  # [B, 1], as TRL's own mask helpers expect
            advantages = advantages.unsqueeze(1)
        old_logps = inputs.get("old_per_token_logps")
        old_logps = per_token_logps.detach() if old_logps is None else old_logps

        training = self.model.training
        mode = "train" if training else "eval"
        kl_on = self.beta != 0.0
        # TRL reads these attributes at every step; so do we
        options = {
            "kl_coef": self.beta,
            "off_policy_mask": self.off_policy_mask_threshold,
            "top_entropy_quantile": self.top_entropy_quantile,
        }
        if any(getattr(self.loss_fn, k) != v for k, v in options.items()):
            self.loss_fn = dataclasses.replace(self.loss_fn, **options)
        entropy_on = self.loss_fn.top_entropy_quantile < 1
        # validate=False: no host sync, and an all-padding micro-batch gives 0 as in TRL.
        out = self.loss_fn(
            per_token_logps,
            self._objective_old_logps(old_logps, inputs),
            advantages,
            mask,
            logp_ref=inputs["ref_per_token_logps"] if kl_on else None,
            rollout_logp=inputs.get("sampling_per_token_logps"),  # the off-policy mask's sampler
            entropy=entropies if entropy_on else None,
            entropy_pool=self._entropy_pool(entropies, mask) if entropy_on else None,
            weights=self._loss_weights(inputs),
            kl_weight=self._importance_weight(per_token_logps, old_logps, mask)
            if kl_on and self.args.use_bias_correction_kl
            else None,
            generator=self._objective_rng(per_token_logps.device),
            validate=False,
            **trl_normalisers(
                self.aggregation,
                loss_type=self.args.loss_type,
                mask=mask,
                training=training,
                grad_accum=self.current_gradient_accumulation_steps,
                num_items_in_batch=inputs.get("num_items_in_batch"),
                num_processes=self.accelerator.num_processes,
                steps_per_generation=self.args.steps_per_generation,
                max_completion_length=self.max_completion_length,
            ),
        )
        loss = out.loss
        if getattr(self, "aux_loss_enabled", False):
            ga = self.current_gradient_accumulation_steps if training else 1
            loss = loss + self.router_aux_loss_coef * aux_loss / ga
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss).mean().item()
            )
        self._log_objective_metrics(mode, out.metrics, mask, entropies)
        return loss

    def _loss_weights(self, inputs) -> list[Tensor]:
        """TRL's vLLM importance-sampling correction of the per-token policy loss (TRL's masks
        are the loss assembly's options: ``self.loss_fn``); none for a :data:`TRL_IS_IN_RATIO`
        rule, whose ratio takes it (:meth:`_objective_old_logps`)."""
        if self._vllm_is() and self.objective.name not in TRL_IS_IN_RATIO:
            return [inputs["importance_sampling_ratio"]]
        return []

    def _vllm_is(self) -> bool:
        return bool(self.use_vllm and self.vllm_importance_sampling_correction)

    def _objective_old_logps(self, old_logps: Tensor, inputs) -> Tensor:
        """The objective's ``logp_old``: TRL's old log-probs, less TRL's clamped log vLLM ratio
        ``log(pi_old / pi_sampler)`` for a :data:`TRL_IS_IN_RATIO` rule (its ratio is then to the
        sampler, as in TRL, whose vespo reads the ratio whenever the batch carries one)."""
        rho = inputs.get("importance_sampling_ratio")
        if rho is None or self.objective.name not in TRL_IS_IN_RATIO:
            return old_logps
        if rho.shape != old_logps.shape:
            raise ValueError(
                f"objective {self.objective.name!r} needs TRL's per-token vLLM importance ratio "
                f"(token_truncate / token_mask), got shape {tuple(rho.shape)}"
            )
        return fold_vllm_ratio(old_logps, rho)

    def _entropy_pool(self, entropies: Tensor, mask: Tensor) -> tuple[Tensor, Tensor] | None:
        """Every process's micro-batch entropies and mask (TRL's ``get_high_entropy_mask``
        quantile spans them all); ``None`` in one process (the call's own tokens)."""
        if self.accelerator.num_processes == 1:
            return None
        pool = []
        for x in (entropies.detach().float(), mask.float()):
            for dim in (1, 0):  # pad with mask 0 to the largest micro-batch of any process
                x = self.accelerator.pad_across_processes(x, dim=dim, pad_index=0)
            pool.append(self.accelerator.gather(x))
        return pool[0], pool[1]

    def _importance_weight(self, logps: Tensor, old_logps: Tensor, mask: Tensor) -> Tensor:
        """TRL's importance weight of the KL term (``use_bias_correction_kl``): the token ratio, or
        the sequence ratio ``exp(mean_t log r)`` at ``importance_sampling_level="sequence"``, as
        TRL sets it whatever the loss (under TRL's vespo, token level by default, it is the token
        ratio although the loss weighs the sequence ratio); with gradient."""
        lr = log_ratio(logps, old_logps)
        if self.args.importance_sampling_level == "sequence":
            maskf = mask.to(lr.dtype)
            lr = (lr * maskf).sum(-1, keepdim=True) / maskf.sum(-1, keepdim=True).clamp(min=1.0)
        return lr.exp()

    # -- metrics ------------------------------------------------------------------------------------
    def _log_objective_metrics(
        self,
        mode: str,
        metrics: dict[str, Tensor],
        mask: Tensor,
        entropies: Tensor,
    ) -> None:
        """Append TRL's and the sandbox's metrics to ``self._metrics[mode]``.

        Token shares and means are averaged over processes weighted by their valid-token counts
        (exact for shares of valid tokens; ``rescue_*_frac``, whose denominator is the dead zone,
        is approximate across processes); ``*_max`` / ``*_min`` are the extremes over processes."""
        with torch.no_grad():
            maskf = mask.to(torch.float32)
            n = maskf.sum()
            names = ["entropy"]
            sums = [(entropies.float() * maskf).sum()]
            metrics = dict(metrics)
            metrics.pop("entropy", None)  # TRL's own "entropy" below
            if "kl_ref_k3" in metrics:  # TRL's "kl": k3 (x the ratio with use_bias_correction_kl)
                names.append("kl")
                sums.append(metrics.pop("kl_ref_k3").float() * n)
            if "clip_low_frac" in metrics and "clip_high_frac" in metrics:
                low, high = metrics["clip_low_frac"].float(), metrics["clip_high_frac"].float()
                names += ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
                sums += [low * n, high * n, (low + high) * n]
            extremes = {k: v for k, v in metrics.items() if k.endswith(("_max", "_min"))}
            means = {k: v for k, v in metrics.items() if k not in extremes}
            names += [f"sandbox/{k}" for k in means]
            sums += [v.float() * n for v in means.values()]
            local = torch.stack([n, *sums, *(v.float() for v in extremes.values())])
            rows = self.accelerator.gather(local[None].to(maskf.device)).tolist()  # one host read
        total = max(sum(row[0] for row in rows), 1.0)
        for i, name in enumerate(names, start=1):
            self._metrics[mode][name].append(sum(row[i] for row in rows) / total)
        for i, name in enumerate(extremes, start=1 + len(names)):
            pick = max if name.endswith("_max") else min
            self._metrics[mode][f"sandbox/{name}"].append(pick(row[i] for row in rows))


#: Multimodal and model inputs TRL forwards to ``_get_per_token_logps_and_entropies``.
_MODEL_INPUT_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def _check_supported(args: Any) -> None:
    """Refuse the GRPOConfig options whose loss would not come from the sandbox objective."""
    if getattr(args, "use_liger_loss", False):
        raise ValueError(
            "use_liger_loss=True: TRL's Liger fused GRPO loss computes the loss inside the fused "
            "LM head and bypasses SandboxGRPOTrainer's objective; set use_liger_loss=False "
            "(use_liger_kernel, which only patches the model's layers, is fine)"
        )
    if getattr(args, "entropy_coef", 0.0) != 0.0 or getattr(args, "use_adaptive_entropy", False):
        raise ValueError(
            "entropy_coef / use_adaptive_entropy: TRL's entropy bonus is not a sandbox objective and "
            "SandboxGRPOTrainer does not add it; set entropy_coef=0.0, use_adaptive_entropy=False"
        )
