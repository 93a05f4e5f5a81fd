"""Sampled softmax-bandit trainer, vectorised over S seeds in one process.

What it does
------------
A tabular softmax policy (logits ``[S, K]``, or ``[S, P, K]`` for a contextual bandit with P
prompts) is trained with GRPO-style group sampling, for S independent seeds at once (the seed is a
batch dimension; no Python loop over seeds). One step, for every seed::

    snapshot pi_old = softmax(logits)                     (the sampling policy)
    rollout   P' prompts ~ prompt_probs, G arms per prompt ~ pi_old, rewards from the exact model
    advantage A = compute_advantages(rewards, G, method)  (sandbox.advantages, per group)
    update    mu epochs x minibatches: logp = log_softmax(logits)[a]
              out = objective(logp, logp_old, A)          (sandbox.objectives; a one-token sequence
                                                           per sample, tensors [S * n, 1])
              loss = sum over seeds of each seed's aggregate(out.loss)  -> backward -> optimizer step
    log       sampled reward, exact expected reward and entropy of pi_old, gradient norm, the
              objective's metrics

The loss comes from :func:`sandbox.objectives.get_objective` only; this module defines none.

The loss modifiers of :mod:`sandbox.masks`: the off-policy mask (``off_policy_mask=delta``) is
meaningful here, a sample being a one-token sequence: with mu > 1 epochs or several minibatches
it drops a negative-advantage arm whose probability fell by more than a factor ``e^delta`` since
sampling (``log pi_old(a) - log pi(a) > delta``). The high-entropy token mask is not offered: the
entropy is a property of the state, not of the sampled arm, so in a plain bandit every sample has
the same entropy (all ties: the mask keeps everything) and in a contextual one it would select
prompts, not the "forking tokens" inside a sequence that arXiv 2506.01939 studies; use the
sequence trainer for it.

How to run (CPU; ``device="cuda"`` runs the same code on one GPU)::

    import envs
    from sandbox.train import BanditTrainConfig, train_bandit

    model = envs.make_bandit_suite()["easy"].make().unwrapped
    df = train_bandit(model, BanditTrainConfig(objective="dapo", seeds=256, steps=500), progress=True)
    df.groupby("step")["expected_reward"].mean().plot()

Seeds and randomness
--------------------
Every draw comes from a named stream of :mod:`sandbox.streams` (common random numbers), keyed by
``config.seed`` and the draw's position, stateless: the step's rollout (prompts, arms, rewards)
from ``(seed, ROLLOUT, step)``, each epoch's minibatch permutation from ``(seed, MINIBATCH,
step, epoch)``, the objective's own draws (NSR's rescue noise, Clip-Cov's pick) from ``(seed,
OBJECTIVE, step, epoch, minibatch)``. A run is a deterministic function of its config, and a
rule that draws extra numbers shifts no other stream: two rules with one base seed sample step
t from the same uniforms, fixed per (seed index, prompt slot, sample, arm), the arms by the
exponential race (Gumbel-max, :func:`sandbox.streams.gumbel_max`), so where their policies
agree they draw the same arms and rewards (a paired seed stays paired after the first update). The column ``seed`` is the
index ``s`` in ``[0, S)``: replicate ``s`` takes row ``s`` of each draw, so seed 2 of a 4-seed
run is *not* the same trajectory as a 1-seed run with ``config.seed + 2``. What holds exactly is
independence: the update of seed ``s`` depends only on seed ``s``'s logits and batch (see
:func:`bandit_update`; tested by perturbing one seed and checking the others' updates are
bit-identical), so the S seeds are i.i.d. replicates.

How seeds stay independent: each seed's loss is aggregated on its own (the per-seed counts are
passed to :func:`sandbox.aggregate.aggregate` as the global counts, so the sum over seeds of the
per-seed aggregates is one call), SGD and Adam act elementwise, and

* objectives that depend on batch statistics (``clip_cov``, ``kl_cov``: covariance ranking over the
  batch, ``objective.batch_statistic``) get ``groups=S``: one call in which each seed's rows are
  ranked on their own, so each sees only its own seed's batch;
* the ``batch_std`` advantage (std over the whole batch) is computed per seed in a Python loop;
  the other advantage methods normalise within a group, so one call covers all seeds.

Several rules at once (:func:`run_bandits`): configs that differ only in objective, its
parameters and seed train as R blocks of one ``[R * S, P, K]`` logits tensor (one softmax, one
backward, one optimizer step; each rule's objective called on its own block), and each block's
histories equal that config's own :func:`run_bandit` bit for bit. The configs of one base seed
share its streams: one rollout's uniforms broadcast over their blocks, one permutation per
epoch, and each rule's objective draws from the objective stream reseeded at its key, as it
would alone; prompt-weighted means are taken per block (a matrix-vector product may round
differently with more rows). ``clip-sandbox compare`` trains a setting's rules this way.

Logged metrics (one row per ``(step, seed)``; :meth:`BanditRun.to_frame`)
------------------------------------------------------------------------
=================== ========================================================================
column              meaning
=================== ========================================================================
step, seed          step index t (0-based); seed index s in [0, S)
reward              mean sampled reward of the seed's batch at step t (drawn from pi_old)
expected_reward     exact sum_a pi_old(a) E[r | a], prompt-weighted (sum_p w_p ...) for
                    contextual bandits; for binary rewards this is the pass rate. Noise-free.
entropy             exact entropy of pi_old in nats (prompt-weighted mean for contextual)
grad_norm           L2 norm of the seed's logits gradient of its aggregated loss, mean over
                    the mu x minibatches updates of the step
zero_var_frac       share of the seed's groups whose G rewards are all equal (zero GRPO
                    advantage; the groups DAPO's dynamic sampling would drop)
<objective metrics> every key of ``out.metrics`` (clip_low_frac, clip_high_frac, ratio_mean,
                    ratio_max, ratio_min, kl_k3, and dual_clip_frac, rescue_frac, ... where the
                    objective reports them), mean over the mu x minibatches updates of the
                    step. Vectorised calls see all seeds' samples at once, so these are pooled
                    over seeds (equal sizes, so fractions and ratio_mean/kl_k3 are the mean of
                    the per-seed values; ratio_max/min are over all seeds) and repeated on every
                    seed's row. For objectives called per seed (clip_cov, kl_cov) they are
                    per seed.
off_policy_masked_frac  with ``off_policy_mask``: share of samples dropped (pooled over seeds)
entropy_change      with ``entropy_law``: exact entropy after the step's update minus before
entropy_change_pred with ``entropy_law``: the entropy-covariance law's first-order prediction of
                    it from the update's logit change (:func:`sandbox.exact.softmax.entropy_covariance_prediction`)
grad_rescue_var     with ``grad_noise``: ``||g_rule - g_det||^2`` of the seed's logits gradient,
                    g_det that of the rule's deterministic counterpart (NSR -> NSR-decay) on
                    the same rows; mean over the step's updates (:mod:`sandbox.grad_noise`).
                    NaN for a rule without a counterpart
grad_sampling_var   with ``grad_noise``: the half-split estimate of the batch-sampling variance
                    ``tr Cov[g_det]`` of the minibatch gradient (:mod:`sandbox.grad_noise`)
grad_signal         with ``grad_noise``: ``||g_det||^2``
=================== ========================================================================

The row of step t describes the policy *before* the step's update (the one that sampled the
batch), so ``reward`` is an unbiased sample of ``expected_reward``. The final policy is
:attr:`BanditRun.logits`. On-policy (mu = 1, one minibatch) the ratio is exactly 1 and every clip
fraction is exactly 0; off-policy epochs or minibatches make them positive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm import tqdm

from envs.bandit import BanditModel, ContextualBanditModel
from sandbox.advantages import ADVANTAGE_METHODS, seed_advantages
from sandbox.aggregate import AGGREGATION_MODES
from sandbox.configs import arg, built_objective, check_group_size, check_int
from sandbox.exact.softmax import entropy_covariance_prediction
from sandbox.grad_noise import (
    GRAD_NOISE_COLUMNS,
    check_halves,
    counterpart_loss,
    first_half,
    grad_noise,
)
from sandbox.loss import LossOutput, PolicyLoss
from sandbox.masks import check_off_policy_mask
from sandbox.objectives import Objective
from sandbox.streams import Stream, StreamGenerators, gumbel_max, inverse_cdf

__all__ = [
    "BanditRun",
    "BanditStep",
    "BanditTask",
    "BanditTrainConfig",
    "Rollout",
    "UpdateStats",
    "bandit_update",
    "make_optimizer",
    "run_bandit",
    "run_bandits",
    "sample_rollout",
    "train_bandit",
]

#: Optimizers acting elementwise on the logits (so seeds stay independent), by config name.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
}
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}

#: Per-seed columns the trainer computes itself (the objective's metrics follow them).
SEED_COLUMNS: tuple[str, ...] = (
    "reward",
    "expected_reward",
    "entropy",
    "grad_norm",
    "zero_var_frac",
)


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclass
class BanditTrainConfig:
    """Settings of one bandit training run (S seeds). Validated on construction."""

    objective: str = arg(
        "grpo", "objective registry name or preset (sandbox.objectives.get_objective)"
    )
    objective_params: dict[str, Any] = arg(
        {}, "keyword overrides for the objective's hyperparameters"
    )
    seeds: int = arg(64, "number of independent seeds S (batched)")
    steps: int = arg(300, "number of sampling + update steps")
    group_size: int = arg(8, "G: samples per prompt (one group)")
    prompts_per_step: int = arg(
        1,
        "P': prompts (groups) sampled per step and seed; for a plain bandit every "
        "group comes from its single state",
    )
    epochs: int = arg(1, "mu: passes over each batch")
    minibatches: int = arg(1, "optimizer steps per epoch; must divide P' * G")
    optimizer: str = arg("sgd", f"one of {list(OPTIMIZERS)}")
    lr: float = arg(0.5, "learning rate on the logits")
    advantage: str = arg("grpo", f"advantage method, one of {sorted(ADVANTAGE_METHODS)}")
    aggregation: str | None = arg(
        None,
        f"loss aggregation, one of {list(AGGREGATION_MODES)}; None uses the "
        "objective's recommendation (obj.aggregation)",
    )
    off_policy_mask: float | None = arg(
        None, "drop A < 0 samples with log pi_old - log pi > this (None: off)"
    )
    grad_mass: bool = arg(False, "log the advantage-weighted gradient mass shares (sandbox.loss)")
    entropy_law: bool = arg(
        False,
        "log each step's entropy change (entropy_change) and the entropy-covariance law's "
        "first-order prediction from the step's logit change (entropy_change_pred)",
    )
    grad_noise: bool = arg(
        False,
        "log NSR's gradient noise against its deterministic counterpart's and the batch's "
        "sampling noise (grad_rescue_var, grad_sampling_var, grad_signal; sandbox.grad_noise)",
    )
    seed: int = arg(0, "base seed of the run's torch.Generator")
    device: str = arg("cpu", "torch device")
    dtype: str = arg("float32", f"one of {list(DTYPES)}")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        for name in ("seeds", "steps", "prompts_per_step", "epochs", "minibatches"):
            check_int(name, getattr(self, name))
        check_int("group_size", self.group_size)
        if self.advantage not in ADVANTAGE_METHODS:
            raise ValueError(
                f"advantage must be one of {sorted(ADVANTAGE_METHODS)}, got {self.advantage!r}"
            )
        check_group_size(self.advantage, self.group_size)
        batch = self.prompts_per_step * self.group_size
        if batch % self.minibatches:
            raise ValueError(
                f"minibatches must divide prompts_per_step * group_size = {batch}, "
                f"got {self.minibatches}"
            )
        if self.grad_noise:  # prompts_per_step * group_size / minibatches samples per minibatch
            check_halves(batch // self.minibatches, "grad_noise")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, int | float):
            raise ValueError(f"lr must be a number, got {self.lr!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if self.aggregation is not None and self.aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"aggregation must be None or one of {list(AGGREGATION_MODES)}, "
                f"got {self.aggregation!r}"
            )
        check_off_policy_mask(self.off_policy_mask)
        check_int("seed", self.seed, 0)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device must be a torch device string, got {self.device!r}") from exc
        if not isinstance(self.objective_params, dict):
            raise ValueError(f"objective_params must be a dict, got {self.objective_params!r}")
        self.build_objective()

    def build_objective(self) -> Objective:
        """The objective, through the registry; errors name ``objective`` / ``objective_params``."""
        try:
            return built_objective(self)
        except ValueError as exc:
            raise ValueError(
                f"objective={self.objective!r} with objective_params={self.objective_params!r} "
                f"is invalid: {exc}"
            ) from exc


# --------------------------------------------------------------------------------------------------
# The task as tensors
# --------------------------------------------------------------------------------------------------


@dataclass
class BanditTask:
    """A bandit's exact model as tensors; a plain bandit is the contextual case with P = 1.

    Attributes:
        mean_rewards: ``[P, K]`` E[r | prompt, arm].
        success_probs: ``[P, K]`` P(r = 1 | prompt, arm), or ``None`` for Gaussian rewards.
        noise_std: reward noise (Gaussian rewards only; 0 otherwise).
        prompt_probs: ``[P]`` prompt distribution (``[1.]`` for a plain bandit).
        initial_logits: ``[P, K]`` the model's suggested initial logits.
        contextual: whether the model is a :class:`~envs.bandit.ContextualBanditModel`.
    """

    mean_rewards: Tensor
    success_probs: Tensor | None
    noise_std: float
    prompt_probs: Tensor
    initial_logits: Tensor
    contextual: bool

    @classmethod
    def from_model(
        cls,
        model: BanditModel | ContextualBanditModel | Any,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> BanditTask:
        """Convert an exact model (or an env whose ``.unwrapped`` is one) to tensors."""
        model = getattr(model, "unwrapped", model)
        if not isinstance(model, BanditModel | ContextualBanditModel):
            raise ValueError(
                "model must be an envs.BanditModel or envs.ContextualBanditModel (or an env "
                f"wrapping one), got {type(model).__name__}"
            )
        contextual = isinstance(model, ContextualBanditModel)

        def table(x: np.ndarray) -> Tensor:
            t = torch.as_tensor(np.array(x), dtype=dtype, device=device)
            return t if contextual else t[None]

        success = None if model.success_probs is None else table(model.success_probs)
        prompts = model.prompt_probs if contextual else np.ones(1)
        return cls(
            mean_rewards=table(model.mean_rewards),
            success_probs=success,
            noise_std=float(model.noise_std or 0.0) if not contextual else 0.0,
            prompt_probs=torch.as_tensor(np.array(prompts), dtype=dtype, device=device),
            initial_logits=table(model.initial_logits),
            contextual=contextual,
        )

    @property
    def num_prompts(self) -> int:
        return self.mean_rewards.shape[0]

    @property
    def num_arms(self) -> int:
        return self.mean_rewards.shape[1]


# --------------------------------------------------------------------------------------------------
# Rollout
# --------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One step's batch for S seeds, N = P' * G samples each (groups contiguous).

    Attributes:
        index: ``[S, N]`` long, flat table index ``prompt * K + arm`` of each sample.
        rewards: ``[S, N]`` sampled rewards.
        logp_old: ``[S, N]`` log pi_old of each sample.
        adv: ``[S, N]`` advantages.
    """

    index: Tensor
    rewards: Tensor
    logp_old: Tensor
    adv: Tensor

    @property
    def num_seeds(self) -> int:
        return self.index.shape[0]

    @property
    def size(self) -> int:
        return self.index.shape[1]


def _sample_categorical(
    probs: Tensor,
    num_samples: int,
    generator: torch.Generator,
    replicas: int = 1,
    race: bool = False,
) -> Tensor:
    """``num_samples`` i.i.d. draws per row of ``probs [..., K]`` from uniforms of a fixed shape,
    whatever the probabilities: by inverse CDF, one uniform per draw
    (:func:`sandbox.streams.inverse_cdf`), or with ``race`` by the exponential race, one per
    draw and category (:func:`sandbox.streams.gumbel_max`: the tighter coupling of two close
    policies, for the policy's own samples).

    ``replicas``: the rows are that many equal blocks that share one block's uniforms (each block
    gets the draws a call with its rows alone would make)."""
    rows = probs.shape[0] // replicas
    shape = (rows, *probs.shape[1:-1], num_samples)
    if race:  # the blocks broadcast against one block's uniforms (no copy of them)
        u = torch.rand(
            (*shape, probs.shape[-1]), generator=generator, device=probs.device, dtype=probs.dtype
        )
        blocks = probs.view(replicas, rows, *probs.shape[1:])
        return gumbel_max(blocks, u).view(probs.shape[0], *shape[1:])
    u = torch.rand(shape, generator=generator, device=probs.device, dtype=probs.dtype)
    return inverse_cdf(probs, _replicate(u, replicas))


def _replicate(x: Tensor, replicas: int) -> Tensor:
    """``x`` repeated ``replicas`` times along its first dimension (``x`` itself for 1)."""
    return x if replicas == 1 else x.repeat(replicas, *(1,) * (x.dim() - 1))


def sample_rollout(
    log_pi: Tensor,
    task: BanditTask,
    *,
    prompts_per_step: int,
    group_size: int,
    advantage: str,
    generator: torch.Generator,
    replicas: int = 1,
) -> Rollout:
    """Sample P' prompts and G arms per prompt from ``pi_old = exp(log_pi)`` for every seed.

    Args:
        log_pi: ``[S, P, K]`` log-probabilities of the sampling policy (detached).
        task: the exact model as tensors.
        prompts_per_step: P'; prompts are drawn with replacement from ``task.prompt_probs``
            (a plain bandit has one prompt, drawn without randomness).
        group_size: G.
        advantage: a method of :func:`sandbox.advantages.compute_advantages`.
        generator: the only source of randomness.
        replicas: R: ``log_pi`` is ``[R * S, P, K]``, R blocks of S seeds (R rules trained
            together) that share this generator's draws: each block's batch is the one a call
            with that block alone would sample, so R rules see common random numbers.
    """
    S, P, K = log_pi.shape
    seeds = S // replicas  # the seeds of one block, which draw
    G = group_size
    pi = log_pi.exp()
    if P == 1:
        prompts = torch.zeros(S, prompts_per_step, dtype=torch.long, device=log_pi.device)
    else:
        prompt_probs = task.prompt_probs.expand(seeds, P)
        prompts = _replicate(
            _sample_categorical(prompt_probs, prompts_per_step, generator), replicas
        )
    pi_prompt = pi.gather(1, prompts[:, :, None].expand(-1, -1, K))  # [S, P', K]
    arms = _sample_categorical(pi_prompt, G, generator, replicas, race=True)  # [S, P', G]
    index = (prompts[:, :, None] * K + arms).view(S, -1)  # [S, N]

    shape = (seeds, index.shape[1])
    if task.success_probs is not None:
        p = task.success_probs.view(-1)[index]
        u = torch.rand(shape, generator=generator, device=p.device, dtype=p.dtype)
        rewards = (_replicate(u, replicas) < p).to(log_pi.dtype)
    else:
        noise = torch.randn(shape, generator=generator, device=index.device, dtype=log_pi.dtype)
        rewards = task.mean_rewards.view(-1)[index] + task.noise_std * _replicate(noise, replicas)

    adv = seed_advantages(rewards, G, advantage)
    logp_old = log_pi.view(S, P * K).gather(1, index)
    return Rollout(index=index, rewards=rewards, logp_old=logp_old, adv=adv)


# --------------------------------------------------------------------------------------------------
# Update
# --------------------------------------------------------------------------------------------------


@dataclass
class UpdateStats:
    """What one step's updates report.

    Attributes:
        metric_names: the objective's metric keys, in order.
        metrics: ``[M, 1]`` (pooled over seeds) or ``[M, S]`` (objectives called per seed; pooled
            values repeated per seed when such a rule is trained together with this one): mean
            over the step's mu x minibatches updates.
        grad_norm: ``[S]`` per-seed L2 norm of the logits gradient, mean over the updates.
        grad_noise: ``[3, S]`` with ``grad_noise``: :data:`sandbox.grad_noise.GRAD_NOISE_COLUMNS`,
            mean over the updates (NaN for a rule without a deterministic counterpart).
    """

    metric_names: tuple[str, ...]
    metrics: Tensor
    grad_norm: Tensor
    grad_noise: Tensor | None = None

    def as_dict(self) -> dict[str, Tensor]:
        return dict(zip(self.metric_names, self.metrics, strict=True))


def make_optimizer(name: str, params: list[Tensor], lr: float) -> torch.optim.Optimizer:
    """Plain SGD or Adam (elementwise, so each seed's logits are optimised independently)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {name!r}")
    return OPTIMIZERS[name](params, lr=lr)


def _objective_loss(
    loss_fn: PolicyLoss,
    logp: Tensor,
    rollout_mb: tuple[Tensor, Tensor],
    mask: Tensor,
    generator: torch.Generator,
    validate: bool,
) -> LossOutput:
    """Sum over seeds of each seed's aggregated loss (:class:`sandbox.loss.PolicyLoss` with
    ``groups=S`` and the per-seed count n; T = 1), and the metrics (``[S]`` for a
    batch-statistic objective, which sees one seed's samples per call)."""
    logp_old, adv = rollout_mb
    S, n = logp.shape
    return loss_fn(
        logp.reshape(S * n, 1),
        logp_old.reshape(S * n, 1),
        adv.reshape(S * n, 1),
        mask,
        generator=generator,
        validate=validate,
        num_tokens=n,
        num_seqs=n,
        groups=S,
    )


def _grad_noise(
    det_fn: PolicyLoss | None,
    logits: Tensor,
    index: Tensor,
    rollout_mb: tuple[Tensor, Tensor],
    mask: Tensor,
) -> Tensor:
    """``[3, S]`` :func:`sandbox.grad_noise.grad_noise` of the update whose gradient
    ``logits.grad`` holds (its rows ``index``), NaN without a counterpart ``det_fn``."""
    S, P, K = logits.shape
    n = index.shape[1]
    if det_fn is None:
        return torch.full((3, S), math.nan, dtype=logits.dtype, device=logits.device)

    def forward() -> tuple[Tensor, list[Tensor]]:
        logp = torch.log_softmax(logits, -1).view(S, P * K).gather(1, index)
        return _objective_loss(det_fn, logp, rollout_mb, mask, None, False).loss, [logp]

    half = first_half(S, n, logits.device).view(S, n)
    return grad_noise(forward, [logits], [logits.grad], half, S)


#: The generators of one base seed at one step: ``draw(Stream.X, *position)`` is stream X's
#: generator seeded at ``(seed, X, step, *position)`` (:func:`_at_step`), or one generator for
#: every purpose (:func:`bandit_update` given a generator).
Draw = Callable[..., torch.Generator]


def _at_step(streams: StreamGenerators, step: int) -> Draw:
    """``streams`` with the step bound: ``draw(stream, *position)``."""
    return lambda stream, *position: streams(stream, step, *position)


@dataclass(frozen=True)
class _Rule:
    """One rule of a batched update: its loss, which base seed's streams it draws from (an
    index into the update's ``streams``) and whether its objective draws at all (one that does
    not is handed no generator: nothing to reseed)."""

    loss_fn: PolicyLoss
    stream: int = 0
    draws: bool = True


def bandit_update(
    logits: Tensor,
    optimizer: torch.optim.Optimizer,
    objective: Objective,
    rollout: Rollout,
    *,
    aggregation: str,
    epochs: int = 1,
    minibatches: int = 1,
    generator: torch.Generator,
    validate: bool = True,
    off_policy_mask: float | None = None,
    grad_mass: bool = False,
    grad_noise: bool = False,
) -> UpdateStats:
    """mu epochs x minibatches optimizer steps of ``objective`` on one rollout, for all seeds.

    Each sample is a one-token sequence: the objective is called on ``[S * n, 1]`` tensors
    (``n = N / minibatches``), each seed's loss is aggregated with its own count ``n`` and the
    seeds' losses are summed, so the gradient on seed ``s``'s logits depends only on seed ``s``'s
    logits and samples. Minibatches (when more than one) use a fresh permutation of the N samples
    per epoch, shared by all seeds.

    Args:
        logits: ``[S, P, K]`` leaf tensor with ``requires_grad``; ``optimizer`` updates it.
        optimizer: a torch optimizer over ``[logits]`` (elementwise: SGD, Adam).
        objective: from :func:`sandbox.objectives.get_objective`.
        rollout: the batch, sampled from the policy at the start of the step.
        aggregation: a mode of :func:`sandbox.aggregate.aggregate`.
        epochs: mu.
        minibatches: optimizer steps per epoch (must divide N).
        generator: for shuffles and the objective's own randomness (one generator, drawn in
            turn; :func:`run_bandit` keeps them apart, each from its own stream).
        validate: let the objective check its inputs (finite values; one device->host read per
            call). :func:`run_bandit` validates the first step only.
        off_policy_mask: ``None`` or delta > 0: :class:`sandbox.loss.PolicyLoss`'s off-policy
            mask (a sample is a one-token sequence: dropped when A < 0 and
            ``log pi_old(a) - log pi(a) > delta``).
        grad_mass: also log :func:`sandbox.loss.grad_mass_shares` (metrics only).
        grad_noise: also measure :func:`sandbox.grad_noise.grad_noise` on every update (extra
            passes of the rule's deterministic counterpart; no random draws).
    """
    loss_fn = PolicyLoss(
        objective, aggregation, off_policy_mask=off_policy_mask, grad_mass=grad_mass
    )

    def draw(stream: Stream, *position: int) -> torch.Generator:
        return generator

    return _update_rules(
        logits,
        optimizer,
        [_Rule(loss_fn)],
        rollout,
        [(draw, 1)],
        epochs=epochs,
        minibatches=minibatches,
        validate=validate,
        grad_noise=grad_noise,
    )[0]


def _minibatch_rows(
    perms: list[Tensor | None],
    streams: list[tuple[Draw, int]],
    seeds: int,
    mb: int,
    n: int,
) -> Tensor | None:
    """``[R * S, n]`` the sample columns of minibatch ``mb`` for every row (each stream's rules
    take that stream's permutation), or ``None`` without minibatches."""
    if perms[0] is None:
        return None
    rows = [
        p[mb * n : (mb + 1) * n].expand(count * seeds, n)
        for p, (_, count) in zip(perms, streams, strict=True)
    ]
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def _update_rules(
    logits: Tensor,
    optimizer: torch.optim.Optimizer,
    rules: list[_Rule],
    rollout: Rollout,
    streams: list[tuple[Draw, int]],
    *,
    epochs: int,
    minibatches: int,
    validate: bool,
    grad_noise: bool = False,
) -> list[UpdateStats]:
    """:func:`bandit_update` of R rules trained together: ``logits`` ``[R * S, P, K]`` holds R
    blocks of S seeds (rule r's block is rows ``r * S`` to ``(r + 1) * S``), each rule's loss is
    its own call on its own block, and one backward and one optimizer step serve all of them.
    ``streams`` lists ``(draw, number of rules)`` per base seed, in block order: a base seed's
    rules share its minibatch permutation of each epoch (``draw(MINIBATCH, epoch)``); each
    rule's objective draws from its seed's ``draw(OBJECTIVE, epoch, minibatch)``, reseeded for
    it, as it is alone. The optimizer acts elementwise, so each block's update equals what
    :func:`bandit_update` gives that rule alone."""
    RS, P, K = logits.shape
    R = len(rules)
    S = RS // R
    N = rollout.size
    if N % minibatches:
        raise ValueError(f"minibatches must divide the batch size {N}, got {minibatches}")
    if grad_noise and R > 1:
        raise ValueError("grad_noise: measured for one rule per run, got rules trained together")
    n = N // minibatches
    mask = torch.ones(S * n, 1, dtype=torch.bool, device=logits.device)
    metric_sum: Tensor | None = None
    names: list[tuple[str, ...]] = []
    grad_norm = torch.zeros(RS, dtype=logits.dtype, device=logits.device)
    det_fn = counterpart_loss(rules[0].loss_fn) if grad_noise else None
    noise = torch.zeros(3, S, dtype=logits.dtype, device=logits.device) if grad_noise else None
    for epoch in range(epochs):
        perms: list[Tensor | None] = [None] * len(streams)
        if minibatches > 1:
            perms = [
                torch.randperm(N, generator=draw(Stream.MINIBATCH, epoch), device=logits.device)
                for draw, _ in streams
            ]
        for mb in range(minibatches):
            index, logp_old, adv = rollout.index, rollout.logp_old, rollout.adv
            rows = _minibatch_rows(perms, streams, S, mb, n)
            if rows is not None:
                index, logp_old, adv = (x.gather(1, rows) for x in (index, logp_old, adv))
            logp = torch.log_softmax(logits, -1).view(RS, P * K).gather(1, index)
            blocks = zip(
                logp.view(R, S, n).unbind(0),
                logp_old.view(R, S, n),
                adv.view(R, S, n),
                rules,
                strict=True,
            )
            outs = [
                _objective_loss(
                    rule.loss_fn,
                    lp,
                    (lpo, a),
                    mask,
                    streams[rule.stream][0](Stream.OBJECTIVE, epoch, mb) if rule.draws else None,
                    validate,
                )
                for lp, lpo, a, rule in blocks
            ]
            optimizer.zero_grad(set_to_none=False)
            torch.autograd.backward([out.loss for out in outs])
            grad_norm += logits.grad.detach().view(RS, -1).norm(dim=1)
            if noise is not None:  # before the step: g_rule and g_det at the same logits
                noise += _grad_noise(det_fn, logits, index, (logp_old, adv), mask)
            optimizer.step()
            if metric_sum is None:
                names = [tuple(out.metrics) for out in outs]
            # every rule's metrics in one stack: a batch-statistic objective's are [S], the
            # others' 0-d (pooled over seeds); broadcast together to [sum of M] or [sum of M, S]
            pairs = zip(outs, names, strict=True)
            metrics = (out.metrics[k].detach() for out, keys in pairs for k in keys)
            values = torch.stack(torch.broadcast_tensors(*metrics))
            metric_sum = values if metric_sum is None else metric_sum + values
    updates = epochs * minibatches
    noise = None if noise is None else noise / updates
    norms = (grad_norm / updates).view(R, S)
    assert metric_sum is not None
    means = metric_sum / updates
    means = means if means.dim() == 2 else means[:, None]  # [sum of M, S or 1]
    bounds = np.cumsum([0] + [len(keys) for keys in names])
    return [
        UpdateStats(names[r], means[bounds[r] : bounds[r + 1]], norms[r], noise) for r in range(R)
    ]


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


@dataclass
class BanditStep:
    """What the ``callback`` of :func:`train_bandit` receives after each step (tensors, no sync)."""

    step: int
    logits: Tensor  # [S, K] or [S, P, K] after the update (detached)
    rollout: Rollout
    update: UpdateStats


@dataclass
class BanditRun:
    """Result of :func:`run_bandit`: per-step, per-seed histories as arrays ``[steps, S]``."""

    config: BanditTrainConfig
    objective: str  # registry name of the objective actually run
    aggregation: str
    logits: Tensor  # final logits, [S, K] or [S, P, K]
    history: dict[str, np.ndarray] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """One row per ``(step, seed)``; columns as in the module docstring's table.

        ``df.attrs`` holds the config (as a dict), the objective's registry name and the
        aggregation mode.
        """
        steps, S = next(iter(self.history.values())).shape
        data: dict[str, np.ndarray] = {
            "step": np.repeat(np.arange(steps), S),
            "seed": np.tile(np.arange(S), steps),
        }
        data.update({k: v.reshape(-1) for k, v in self.history.items()})
        df = pd.DataFrame(data, copy=False)
        df.attrs.update(
            config=asdict(self.config), objective=self.objective, aggregation=self.aggregation
        )
        return df


#: Config fields in which the runs that :func:`run_bandits` trains together may differ.
PER_RULE_FIELDS: tuple[str, ...] = ("objective", "objective_params", "seed")


def _check_together(configs: list[BanditTrainConfig]) -> None:
    """``ValueError`` unless ``configs`` is non-empty and differs only in :data:`PER_RULE_FIELDS`."""
    if not configs:
        raise ValueError("configs must hold at least one BanditTrainConfig")
    first = asdict(configs[0])
    for config in configs[1:]:
        other = asdict(config)
        differ = sorted(k for k in first if k not in PER_RULE_FIELDS and first[k] != other[k])
        if differ:
            raise ValueError(
                f"configs: runs trained together may differ only in {list(PER_RULE_FIELDS)}, "
                f"these differ: {differ}"
            )
    if len(configs) > 1 and configs[0].grad_noise:
        raise ValueError("configs: grad_noise is measured one config per call, got several")


def _seed_groups(configs: list[BanditTrainConfig]) -> list[list[int]]:
    """The configs of each base seed, in the order their blocks are laid out: they share that
    seed's streams (one rollout, one permutation per epoch; :mod:`sandbox.streams`)."""
    groups: dict[int, list[int]] = {}
    for i, config in enumerate(configs):
        groups.setdefault(config.seed, []).append(i)
    return list(groups.values())


def _sample_streams(
    log_pi: Tensor,
    task: BanditTask,
    config: BanditTrainConfig,
    streams: list[tuple[Draw, int]],
) -> Rollout:
    """One step's rollout of every block: each base seed's rollout stream samples its blocks
    (``streams``: ``(draw, number of blocks)`` per base seed, in block order)."""
    seeds = log_pi.shape[0] // sum(count for _, count in streams)
    parts, start = [], 0
    for draw, count in streams:
        parts.append(
            sample_rollout(
                log_pi[start * seeds : (start + count) * seeds],
                task,
                prompts_per_step=config.prompts_per_step,
                group_size=config.group_size,
                advantage=config.advantage,
                generator=draw(Stream.ROLLOUT),
                replicas=count,
            )
        )
        start += count
    if len(parts) == 1:
        return parts[0]
    fields = ("index", "rewards", "logp_old", "adv")
    return Rollout(**{f: torch.cat([getattr(p, f) for p in parts]) for f in fields})


def _prompt_mean(values: Tensor, task: BanditTask, blocks: int) -> Tensor:
    """``[R * S, P] @ prompt_probs``, one product per block of S rows: a matrix-vector product's
    rounding can depend on the number of rows, and each block must get its run's own numbers."""
    if task.num_prompts == 1 or blocks == 1:
        return values @ task.prompt_probs  # a single prompt: one product per row, exact
    return torch.cat([block @ task.prompt_probs for block in values.chunk(blocks)])


@dataclass
class _Log:
    """Per-step histories on device: ``seed`` ``[steps, 5, R * S]`` (:data:`SEED_COLUMNS`),
    ``law`` ``[steps, 2, R * S]`` (entropy law: observed, predicted), ``noise`` ``[steps, 3, S]``
    (grad noise, one rule), and per rule its metric names and ``[steps, M, 1 or S]`` values."""

    seed: Tensor
    law: Tensor
    noise: Tensor
    names: list[tuple[str, ...]]
    metrics: list[Tensor | None]

    @classmethod
    def empty(cls, steps: int, rules: int, seeds: int, dtype: torch.dtype, device: Any) -> _Log:
        def new(*shape: int) -> Tensor:
            return torch.empty(steps, *shape, dtype=dtype, device=device)

        rows = rules * seeds
        return cls(
            new(len(SEED_COLUMNS), rows), new(2, rows), new(3, seeds), [()] * rules, [None] * rules
        )

    def record(self, step: int, seed_values: list[Tensor], stats: list[UpdateStats]) -> None:
        self.seed[step] = torch.stack(seed_values)
        for r, st in enumerate(stats):
            if self.metrics[r] is None:
                self.names[r] = st.metric_names
                shape = (self.seed.shape[0], len(st.metric_names), st.metrics.shape[1])
                self.metrics[r] = torch.empty(
                    shape, dtype=st.metrics.dtype, device=st.metrics.device
                )
            self.metrics[r][step] = st.metrics
        if stats[0].grad_noise is not None:
            self.noise[step] = stats[0].grad_noise

    def history(self, block: int, config: BanditTrainConfig) -> dict[str, np.ndarray]:
        """The histories ``[steps, S]`` of the rule in block ``block``."""
        S = config.seeds
        cols = slice(block * S, (block + 1) * S)
        seed_np = self.seed[:, :, cols].cpu().numpy()
        history = {name: seed_np[:, j] for j, name in enumerate(SEED_COLUMNS)}
        metrics = self.metrics[block]
        assert metrics is not None
        metrics_np = metrics.cpu().numpy()
        for j, name in enumerate(self.names[block]):
            history[name] = np.broadcast_to(metrics_np[:, j], (config.steps, S))
        if config.entropy_law:
            law = self.law[:, :, cols].cpu().numpy()
            history["entropy_change"], history["entropy_change_pred"] = law[:, 0], law[:, 1]
        if config.grad_noise:
            noise_np = self.noise.cpu().numpy()
            history.update({name: noise_np[:, j] for j, name in enumerate(GRAD_NOISE_COLUMNS)})
        return history


def run_bandit(
    model: BanditModel | ContextualBanditModel | Any,
    config: BanditTrainConfig,
    *,
    progress: bool = False,
    callback: Callable[[BanditStep], None] | None = None,
) -> BanditRun:
    """Train S seeds and return the histories as arrays (see :func:`train_bandit`)."""
    return _train(model, [config], progress=progress, callback=callback)[0]


def run_bandits(
    model: BanditModel | ContextualBanditModel | Any,
    configs: Sequence[BanditTrainConfig],
    *,
    progress: bool = False,
) -> list[BanditRun]:
    """:func:`run_bandit` of several configs that differ only in ``objective``,
    ``objective_params`` and ``seed``, trained as one program; each result equals what
    :func:`run_bandit` gives that config alone.

    The R runs' logits are R blocks of one ``[R * S, P, K]`` tensor: the softmax, the sampling
    arithmetic, the backward, the optimizer step and the logging act on all blocks at once; each
    rule's objective is called on its own block. The runs of one base seed share its streams
    (:func:`_seed_groups`); each draw is keyed by its position, so a rule's objective noise is
    what it draws alone. Not with ``grad_noise`` (one config per call).
    """
    return _train(model, list(configs), progress=progress, callback=None)


def _train(
    model: BanditModel | ContextualBanditModel | Any,
    configs: list[BanditTrainConfig],
    *,
    progress: bool,
    callback: Callable[[BanditStep], None] | None,
) -> list[BanditRun]:
    """The training loop of :func:`run_bandits` (R = 1: :func:`run_bandit`)."""
    for config in configs:
        config.validate()
    _check_together(configs)
    config = configs[0]
    device, dtype = torch.device(config.device), DTYPES[config.dtype]
    task = BanditTask.from_model(model, device, dtype)
    objectives = [c.build_objective() for c in configs]
    groups = _seed_groups(configs)
    order = [i for group in groups for i in group]  # block -> config index
    seeds = [StreamGenerators(configs[g[0]].seed, device) for g in groups]
    aggregations = [
        c.aggregation or o.aggregation for c, o in zip(configs, objectives, strict=True)
    ]
    rules = [
        _Rule(
            PolicyLoss(
                objectives[i],
                aggregations[i],
                off_policy_mask=config.off_policy_mask,
                grad_mass=config.grad_mass,
            ),
            g,
            type(objectives[i]).draw is not Objective.draw,  # NSR's noise, Clip-Cov's pick
        )
        for g, group in enumerate(groups)
        for i in group
    ]
    R, S, P, K = len(configs), config.seeds, task.num_prompts, task.num_arms
    logits = task.initial_logits.expand(R * S, P, K).clone().requires_grad_(True)
    optimizer = make_optimizer(config.optimizer, [logits], config.lr)
    log = _Log.empty(config.steps, R, S, dtype, device)
    label = config.objective if R == 1 else f"{R} rules"
    bar = tqdm(range(config.steps), disable=not progress, desc=f"bandit {label}")
    for step in bar:
        # 1. snapshot the sampling policy and its exact statistics; 2. rollout and advantages
        with torch.no_grad():
            log_pi = torch.log_softmax(logits.detach(), -1)  # [R * S, P, K]
            pi = log_pi.exp()
            expected_reward = _prompt_mean((pi * task.mean_rewards).sum(-1), task, R)  # [R * S]
            entropy = _prompt_mean(-(pi * log_pi).sum(-1), task, R)  # [R * S]
            streams = [
                (_at_step(gens, step), len(g)) for gens, g in zip(seeds, groups, strict=True)
            ]
            rollout = _sample_streams(log_pi, task, config, streams)

        # 3. mu epochs x minibatches of objective -> aggregate -> optimizer step
        stats = _update_rules(
            logits,
            optimizer,
            rules,
            rollout,
            streams,
            epochs=config.epochs,
            minibatches=config.minibatches,
            validate=step == 0,
            grad_noise=config.grad_noise,
        )

        # 4. log on device (no host sync inside the loop)
        with torch.no_grad():
            groups_r = rollout.rewards.view(R * S, -1, config.group_size)
            zero_var = (groups_r == groups_r[..., :1]).all(-1).to(dtype).mean(-1)
            grad_norm = torch.cat([st.grad_norm for st in stats])
            log.record(
                step,
                [rollout.rewards.mean(-1), expected_reward, entropy, grad_norm, zero_var],
                stats,
            )
            if config.entropy_law:  # arXiv 2505.22617: dH ~ -Cov(log pi, dz), per prompt
                after = torch.log_softmax(logits.detach(), -1)
                h_after = _prompt_mean(-(after.exp() * after).sum(-1), task, R)
                dz = logits.detach() - log_pi  # log_pi differs from the logits by a constant
                pred = _prompt_mean(entropy_covariance_prediction(log_pi, dz), task, R)
                log.law[step] = torch.stack([h_after - entropy, pred])
        if progress and (step % max(1, config.steps // 20) == 0 or step == config.steps - 1):
            bar.set_postfix(expected_reward=f"{expected_reward.mean().item():.3f}")
        if callback is not None:
            final = logits.detach() if task.contextual else logits.detach()[:, 0]
            callback(BanditStep(step, final, rollout, stats[0]))

    final_logits = logits.detach() if task.contextual else logits.detach()[:, 0]
    runs: list[BanditRun | None] = [None] * R
    for block, i in enumerate(order):
        runs[i] = BanditRun(
            configs[i],
            objectives[i].name,
            aggregations[i],
            final_logits[block * S : (block + 1) * S].clone(),
            log.history(block, configs[i]),
        )
    return runs  # type: ignore[return-value]


def train_bandit(
    model: BanditModel | ContextualBanditModel | Any,
    config: BanditTrainConfig,
    *,
    progress: bool = False,
    callback: Callable[[BanditStep], None] | None = None,
) -> pd.DataFrame:
    """Train a tabular softmax policy on ``model`` for ``config.seeds`` seeds at once.

    Args:
        model: an :class:`envs.BanditModel` or :class:`envs.ContextualBanditModel` (or an env
            whose ``.unwrapped`` is one, e.g. ``make_bandit_suite()["easy"].make()``). Rewards are
            drawn from its exact arrays with torch, not with its numpy sampler.
        config: the run's settings.
        progress: show a tqdm bar (with the seed-mean expected reward, read every steps/20).
        callback: called after every step with a :class:`BanditStep` (tensors on device).

    Returns:
        A DataFrame with one row per ``(step, seed)``: ``step, seed, reward, expected_reward,
        entropy, grad_norm, zero_var_frac`` and the objective's metrics (module docstring).
        ``df.attrs`` holds the config, objective name and aggregation.
    """
    return run_bandit(model, config, progress=progress, callback=callback).to_frame()
