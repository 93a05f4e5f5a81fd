"""GRPO-style training of a tiny transformer on a synthetic reasoning task, S seeds at once.

The middle rung between the bandit and the LLM: token- and sequence-level rules (PPO clip vs
GSPO, NSR at token vs sequence level) differ here. One step, for every seed::

    prompts   P' problems from the task (``envs.reasoning``), each repeated G times
    rollout   G completions per prompt from pi_old, KV-cached sampling restricted to the task's
              answer tokens and EOS (``task.completion_token_ids``)
    reward    the task's verifier on the decoded completion (1 or 0)
    advantage sandbox.advantages per group
    update    mu epochs x minibatches: logp = policy(completion | prompt)
              loss = PolicyLoss(objective)(logp, logp_old, A, mask, groups=S)  (sandbox.loss:
              the objective [x the off-policy / high-entropy masks], aggregated per seed,
              + kl_coef * k3 to the initial model - entropy_coef * entropy)
              -> backward -> per-seed grad clip -> Adam step
    log       pass rate, entropy, completion length, gradient norm, the objective's metrics

The S seeds are S independent models (:class:`~sandbox.policies.TinyTransformer`'s ensemble
dimension), trained in one batched pass: each seed's loss is aggregated over its own rows
(``groups=S``), gradients are clipped per seed and Adam acts elementwise, so a seed's update depends
on its own model and data only. Objectives that rank tokens over the batch (clip_cov, kl_cov) rank
each seed's rows on their own, in one call (``groups=S``), and so does the entropy mask
(``top_entropy_quantile``: each seed's threshold from its own minibatch's tokens). The off-policy
mask (``off_policy_mask``) compares pi_old, which sampled, with the current policy: it binds from
the second minibatch or epoch of a step. This module defines no loss.

How to run (CPU)::

    from sandbox.train import SequenceTrainConfig, train_sequence
    df = train_sequence(SequenceTrainConfig(task="bits", task_knobs={"op": "parity"},
                                            objective="dapo", seeds=4, steps=100), progress=True)

Logged columns (one row per step and seed): ``step, seed, reward`` (= ``pass_rate``, the share of
the step's G x P' completions the verifier accepts, sampled from the pre-update policy),
``expected_reward`` (the same value, under the name the bandit figures use), ``entropy`` (mean
next-token entropy over the sampled completion tokens), ``completion_len``, ``grad_norm`` (per
seed, before clipping, mean over the step's updates), ``zero_var_frac`` and the objective's metrics
(pooled over seeds, mean over updates), with ``off_policy_masked_frac`` (share of sequences
dropped) and ``entropy_masked_frac`` (share of tokens masked) when those masks are on.

Randomness (common random numbers, :mod:`sandbox.streams`): the prompts come from a numpy
generator of their own (``config.seed``; no policy changes its draws), every torch draw from a
named stream keyed by the base seed and the draw's position, stateless: the step's completions
from ``(seed, ROLLOUT, step)``, each epoch's minibatch order from ``(seed, MINIBATCH, step,
epoch)``, the objective's noise from ``(seed, OBJECTIVE, step, epoch, minibatch)``, the held-out
completions from ``(seed, EVAL, steps done)``. Tokens are sampled by the exponential race from
uniforms fixed per (seed index, row, position, token) (:meth:`TinyTransformer.generate`), so two
rules with one base seed draw the same completions while their models agree, whatever extra
numbers one objective draws. Replicate s scores its own held-out set
(:func:`held_out_problems` of the base seed and s), the same for every rule.

With ``entropy_law`` (mechanism check (a), arXiv 2505.22617), per step and seed, over the visited
prefixes of the step's own rollout (every completion position under the completion mask, the
same token mean as ``entropy``), with z the next-token logits over the allowed tokens (the
policy ``completion_logp`` scores) before the step's update and z' after all of its updates::

    entropy_change      = mean_t [ H(softmax z'_t) - H(softmax z_t) ]
    entropy_change_pred = mean_t [ -Cov_{a ~ softmax z_t}(log pi_t(a), z'_t(a) - z_t(a)) ]

(:func:`sandbox.exact.softmax.entropy_covariance_prediction`; the error is O(|z' - z|^2)). It
costs two no-grad forwards of the rollout's rows and draws no random numbers, so training is
bit-identical with it on or off.

With ``grad_noise``: ``grad_rescue_var``, ``grad_sampling_var``, ``grad_signal`` per seed (each
model's own parameters, the gradient before clipping; mean over the step's updates), the rule's
gradient noise against its deterministic counterpart's (NSR -> NSR-decay) and the half-split
batch-sampling variance (:mod:`sandbox.grad_noise`); NaN for a rule without a counterpart.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm import tqdm

from envs.reasoning import SPLITS, ReasoningTask, available_tasks, make_task
from sandbox.advantages import ADVANTAGE_METHODS, seed_advantages
from sandbox.aggregate import AGGREGATION_MODES
from sandbox.configs import arg, built_objective, check_group_size, check_int
from sandbox.exact.softmax import entropy as softmax_entropy
from sandbox.exact.softmax import entropy_covariance_prediction
from sandbox.grad_noise import (
    GRAD_NOISE_COLUMNS,
    check_halves,
    counterpart_loss,
    first_half,
    grad_noise,
)
from sandbox.loss import LossOutput, PolicyLoss
from sandbox.masks import check_off_policy_mask, check_top_entropy_quantile
from sandbox.objectives import Objective
from sandbox.policies import TinyTransformer, TransformerConfig, clip_grad_norm_per_model
from sandbox.streams import HELD_OUT, Stream, StreamGenerators

from .bandit import DTYPES

SEED_COLUMNS = ("reward", "entropy", "completion_len", "grad_norm", "zero_var_frac")


@dataclass
class SequenceTrainConfig:
    """Settings of one reasoning-task training run (S seeds). Validated on construction."""

    task: str = arg("bits", "task name from envs.reasoning")
    task_knobs: dict[str, Any] = arg({"op": "parity", "length": 3}, "difficulty knobs of the task")
    objective: str = arg("dapo", "objective name or preset")
    objective_params: dict[str, Any] = arg({}, "overrides of the objective's hyperparameters")
    seeds: int = arg(4, "independent models trained in one batch")
    steps: int = arg(100, "sampling + update steps")
    prompts_per_step: int = arg(8, "P': prompts per step and seed")
    group_size: int = arg(8, "G: completions per prompt")
    epochs: int = arg(2, "mu: passes over each batch")
    minibatches: int = arg(2, "optimizer steps per epoch")
    lr: float = arg(1e-3, "Adam learning rate")
    max_grad_norm: float = arg(1.0, "per-seed gradient clipping")
    advantage: str = arg("grpo", "sandbox.advantages method")
    aggregation: str | None = arg(None, "aggregation mode; None uses the objective's own")
    kl_coef: float = arg(0.0, "k3 KL to the initial model (0: off)")
    entropy_coef: float = arg(0.0, "entropy bonus (0: off)")
    off_policy_mask: float | None = arg(
        None, "drop A < 0 sequences with mean KL(pi_old || pi) > this"
    )
    top_entropy_quantile: float = arg(1.0, "keep the top-q share of tokens by entropy (1: off)")
    max_new_tokens: int | None = arg(None, "completion budget (None: the task's answer length + 1)")
    eval_prompts: int = arg(0, "held-out prompts evaluated after the last step (0: none)")
    eval_k: int = arg(1, "samples per held-out prompt (pass@1 = mean over the k samples)")
    split: bool = arg(
        False,
        "train on the task's train partition and draw held-out problems from its test partition "
        "(envs.reasoning.problem_split: disjoint by construction); False: both from every problem",
    )
    grad_mass: bool = arg(False, "log the advantage-weighted gradient mass shares (sandbox.loss)")
    entropy_law: bool = arg(
        False,
        "log each step's entropy change over the rollout's visited prefixes (entropy_change) and "
        "the entropy-covariance law's first-order prediction from the step's logit change "
        "(entropy_change_pred)",
    )
    grad_noise: bool = arg(
        False, "log the rule's gradient noise against its deterministic counterpart's (NSR)"
    )
    temperature: float = arg(1.0, "sampling temperature")
    init: str | None = arg(
        None,
        "warm start: a file of python -m sandbox.train.warm_start whose one model every replicate "
        "starts from (None: from scratch, each replicate its own random weights)",
    )
    d_model: int = arg(32, "transformer width")
    n_layers: int = arg(2, "transformer layers")
    n_heads: int = arg(4, "attention heads")
    seed: int = arg(0, "base seed (weights, prompts, sampling)")
    device: str = arg("cpu", "torch device")
    dtype: str = arg("float32", f"one of {list(DTYPES)}: the models' and the logged values'")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        if self.task not in available_tasks():
            raise ValueError(f"task must be one of {available_tasks()}, got {self.task!r}")
        task = make_task(self.task, **self.task_knobs)
        if not isinstance(self.split, bool):
            raise ValueError(f"split must be True or False, got {self.split!r}")
        for part in SPLITS if self.split else ():  # both partitions hold a problem
            task.sample(np.random.default_rng(0), split=part)
        for name in ("seeds", "steps", "prompts_per_step", "epochs", "minibatches", "eval_k"):
            check_int(name, getattr(self, name))
        check_int("group_size", self.group_size)
        check_int("eval_prompts", self.eval_prompts, 0)
        if self.init is not None:  # the file exists and fits this task and model shape
            load_warm_start(self.init, self)
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
        if self.grad_noise:  # prompts_per_step * group_size / minibatches rows per minibatch
            check_halves(batch // self.minibatches, "grad_noise")
        for name in ("lr", "max_grad_norm", "temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        for name in ("kl_coef", "entropy_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if self.aggregation is not None and self.aggregation not in AGGREGATION_MODES:
            raise ValueError(
                f"aggregation must be None or one of {list(AGGREGATION_MODES)}, "
                f"got {self.aggregation!r}"
            )
        check_off_policy_mask(self.off_policy_mask)
        check_top_entropy_quantile(self.top_entropy_quantile)
        if self.max_new_tokens is not None:
            check_int("max_new_tokens", self.max_new_tokens)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        self.model_config()
        self.build_objective()

    def build_objective(self) -> Objective:
        try:
            return built_objective(self)
        except ValueError as exc:
            raise ValueError(f"objective={self.objective!r}: {exc}") from exc

    def completion_budget(self) -> int:
        task = make_task(self.task, **self.task_knobs)
        return self.max_new_tokens or task.max_answer_len + 1

    def model_config(self) -> TransformerConfig:
        task = make_task(self.task, **self.task_knobs)
        return TransformerConfig(
            vocab_size=task.tokenizer.vocab_size,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            max_len=task.max_prompt_tokens + self.completion_budget(),
        )


@dataclass
class SequenceBatch:
    """One step's rollout for all seeds: ``[S, N, ...]`` with N = P' * G rows per seed."""

    prompt: Tensor  # [S, N, Tp] left-padded ids
    prompt_mask: Tensor  # [S, N, Tp]
    completion: Tensor  # [S, N, Tc]
    completion_mask: Tensor  # [S, N, Tc]
    rewards: Tensor  # [S, N]
    adv: Tensor  # [S, N]
    logp_old: Tensor  # [S, N, Tc]
    logp_ref: Tensor | None  # [S, N, Tc]
    entropy: Tensor  # [S, N, Tc]


def held_out_problems(
    task: ReasoningTask, seed: int, n: int, replicate: int, split: bool = False
) -> tuple[list[str], list[str]]:
    """The ``n`` held-out (prompt, answer) pairs of replicate ``replicate`` (seed index s in
    ``[0, S)``) of a run with base seed ``seed``: their own random stream
    (:data:`sandbox.streams.HELD_OUT`), fixed by ``(seed, replicate)`` alone, so every rule and
    every step count sees the same set for a replicate (pairs stay pairs) while the replicates
    score distinct sets (the study's answer baselines are computed on them too). ``split``: from
    the task's test partition (training then draws from its train partition)."""
    rng = np.random.default_rng([seed, HELD_OUT, replicate])
    return task.sample_batch(rng, n, split="test" if split else None)


class SequenceTrainer:
    """The state of a run: the models, the optimizer, the random streams; :meth:`step` is one
    step."""

    def __init__(self, config: SequenceTrainConfig) -> None:
        config.validate()
        self.config = config
        self.device, self.dtype = torch.device(config.device), DTYPES[config.dtype]
        self.task = make_task(config.task, **config.task_knobs)
        self.objective = config.build_objective()
        self.loss_fn = PolicyLoss(
            self.objective,
            config.aggregation,
            kl_coef=config.kl_coef,
            entropy_coef=config.entropy_coef,
            off_policy_mask=config.off_policy_mask,
            top_entropy_quantile=config.top_entropy_quantile,
            grad_mass=config.grad_mass,
        )
        self.aggregation = self.loss_fn.mode
        self.det_loss_fn = counterpart_loss(self.loss_fn) if config.grad_noise else None
        S = config.seeds
        model_config, dtype = config.model_config(), self.dtype
        self.model = TinyTransformer(model_config, num_models=S, seed=config.seed, dtype=dtype)
        if config.init is not None:  # every replicate from the one warm-started model
            state = load_warm_start(config.init, config)
            self.model.load_state_dict(
                {k: v.to(dtype).expand(S, *v.shape[1:]).clone() for k, v in state.items()}
            )
        self.model.to(self.device)
        self.reference = None
        if config.kl_coef > 0:
            self.reference = TinyTransformer(model_config, S, seed=config.seed, dtype=dtype)
            self.reference.load_state_dict(self.model.state_dict())
            self.reference.to(self.device).requires_grad_(False)
        # fused: one kernel for every parameter (elementwise, so seeds stay independent)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, fused=True)
        # torch draws from named streams keyed (seed, stream, step, ...) (sandbox.streams);
        # the prompts from a numpy generator of their own, whose draws no policy changes
        self.streams = StreamGenerators(config.seed, self.device)
        self.rng = np.random.default_rng(config.seed)
        tok = self.task.tokenizer
        # the allowed ids as an index and as a mask, both built on the host (no nonzero() sync)
        ids = torch.tensor(sorted(set(self.task.completion_token_ids)), dtype=torch.long)
        allowed = torch.zeros(tok.vocab_size, dtype=torch.bool)
        allowed[ids] = True
        self.allowed, self.allowed_ids = allowed.to(self.device), ids.to(self.device)
        self.max_new_tokens = config.completion_budget()
        self.steps_done = 0

    # -- rollout ----------------------------------------------------------------------------------
    def _encode(self, prompts: list[str], rows: int) -> tuple[Tensor, Tensor]:
        """``S * B`` prompt strings -> left-padded ids and mask ``[S, B * rows, Tp]``, each
        prompt repeated ``rows`` times in a row (a group, or the k samples of an evaluation)."""
        tok, S = self.task.tokenizer, self.config.seeds
        encoded = [self.task.encode_prompt(p) for p in prompts]
        Tp = max(len(e) for e in encoded)
        ids = np.full((len(encoded), Tp), tok.pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), Tp), dtype=bool)
        for i, e in enumerate(encoded):  # left padding
            ids[i, Tp - len(e) :] = e
            mask[i, Tp - len(e) :] = True
        B = len(encoded) // S
        ids_t = torch.from_numpy(ids).view(S, B, 1, Tp).expand(S, B, rows, Tp).reshape(S, -1, Tp)
        mask_t = torch.from_numpy(mask).view(S, B, 1, Tp).expand(S, B, rows, Tp).reshape(S, -1, Tp)
        return ids_t.to(self.device), mask_t.to(self.device)

    def _prompts(self) -> tuple[Tensor, Tensor, list[str]]:
        cfg = self.config
        G = cfg.group_size
        split = "train" if cfg.split else None
        prompts, answers = self.task.sample_batch(self.rng, cfg.seeds * cfg.prompts_per_step, split)
        ids, mask = self._encode(prompts, G)
        return ids, mask, [a for a in answers for _ in range(G)]

    def held_out(self) -> list[tuple[list[str], list[str]]]:
        """The held-out problems of each replicate s (:func:`held_out_problems` of the run's
        base seed and s)."""
        cfg = self.config
        return [
            held_out_problems(self.task, cfg.seed, cfg.eval_prompts, s, cfg.split)
            for s in range(cfg.seeds)
        ]

    @torch.no_grad()
    def evaluate(self) -> Tensor:
        """Held-out pass@1 per seed ``[S]``: seed s's model samples ``eval_k`` completions
        (the training sampler) for each of replicate s's held-out problems, all seeds in one
        batched call; the share the verifier accepts. Sampling draws from the evaluation stream
        ``(seed, EVAL, steps done)``, so evaluating leaves the training streams untouched and
        draws the same every time."""
        cfg, tok = self.config, self.task.tokenizer
        sets = self.held_out()
        prompts = [p for ps, _ in sets for p in ps]
        ids, mask = self._encode(prompts, cfg.eval_k)
        generator = self.streams(Stream.EVAL, self.steps_done)
        completion, completion_mask = self.model.generate(
            ids,
            mask,
            max_new_tokens=self.max_new_tokens,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            generator=generator,
            temperature=cfg.temperature,
            allowed=self.allowed,
        )
        rows = [a for _, answers in sets for a in answers for _ in range(cfg.eval_k)]
        return self._rewards(completion, completion_mask, rows).mean(-1)

    def _rewards(self, completion: Tensor, completion_mask: Tensor, answers: list[str]) -> Tensor:
        S, N, _ = completion.shape
        ids = torch.where(completion_mask, completion, self.task.tokenizer.pad_id).cpu().numpy()
        flat = ids.reshape(S * N, -1)
        rewards = [
            self.task.verify(answer, self.task.decode_completion(row))
            for answer, row in zip(answers, flat, strict=True)
        ]
        return torch.tensor(rewards, dtype=self.dtype, device=self.device).view(S, N)

    @torch.no_grad()
    def rollout(self) -> SequenceBatch:
        """Sample prompts and completions for every seed, score and advantage them."""
        cfg = self.config
        G = cfg.group_size
        prompt, prompt_mask, answers = self._prompts()  # answers: one per row, [S * N]
        completion, completion_mask = self.model.generate(
            prompt,
            prompt_mask,
            max_new_tokens=self.max_new_tokens,
            eos_id=self.task.tokenizer.eos_id,
            pad_id=self.task.tokenizer.pad_id,
            generator=self.streams(Stream.ROLLOUT, self.steps_done),
            temperature=cfg.temperature,
            allowed=self.allowed,
        )
        rewards = self._rewards(completion, completion_mask, answers)
        adv = seed_advantages(rewards, G, cfg.advantage)
        logp_old, entropy = self.model.completion_logp(
            prompt, prompt_mask, completion, completion_mask, self.allowed
        )
        logp_ref = None
        if self.reference is not None:
            logp_ref, _ = self.reference.completion_logp(
                prompt, prompt_mask, completion, completion_mask, self.allowed
            )
        return SequenceBatch(
            prompt,
            prompt_mask,
            completion,
            completion_mask,
            rewards,
            adv,
            logp_old,
            logp_ref,
            entropy,
        )

    # -- update -----------------------------------------------------------------------------------
    @property
    def needs_entropy(self) -> bool:
        """The loss reads the update's entropies: the bonus, or the entropy mask."""
        return self.config.entropy_coef > 0 or self.config.top_entropy_quantile < 1

    def _loss(
        self, batch: SequenceBatch, rows: Tensor, validate: bool, generator: torch.Generator
    ) -> LossOutput:
        """The loss of minibatch ``rows`` for all seeds: :class:`sandbox.loss.PolicyLoss` with
        ``groups=S`` (each seed aggregated over its own rows; a batch-statistic objective
        ranks each seed's rows on their own, its metrics then averaged over seeds); the
        objective draws from ``generator``."""
        out, _ = self._assemble(self.loss_fn, batch, rows, validate, generator)
        return LossOutput(out.loss, {k: v.mean() for k, v in out.metrics.items()})

    def _assemble(
        self,
        loss_fn: PolicyLoss,
        batch: SequenceBatch,
        rows: Tensor,
        validate: bool,
        generator: torch.Generator | None,
    ) -> tuple[LossOutput, list[Tensor]]:
        """``loss_fn`` on minibatch ``rows`` (the policy's forward pass, then the one loss
        assembly), and the per-row tensors ``[S * n, T]`` the loss was built from: ``logp``, and
        ``entropy`` when the loss reads it."""
        S, n = self.config.seeds, rows.numel()
        prompt, pmask = batch.prompt[:, rows], batch.prompt_mask[:, rows]
        comp, cmask = batch.completion[:, rows], batch.completion_mask[:, rows]
        logp, entropy = self.model.completion_logp(prompt, pmask, comp, cmask, self.allowed)

        def flat(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.reshape(S * n, -1)

        logp, entropy = flat(logp), flat(entropy) if self.needs_entropy else None
        out = loss_fn(
            logp,
            flat(batch.logp_old[:, rows]),
            flat(batch.adv[:, rows]),
            flat(cmask),
            logp_ref=None if batch.logp_ref is None else flat(batch.logp_ref[:, rows]),
            entropy=entropy,
            generator=generator,
            validate=validate,
            groups=S,
            max_len=self.max_new_tokens,  # Dr. GRPO's L: the budget, not this batch's width
        )
        return out, [logp, *([] if entropy is None else [entropy])]

    def _grad_noise(self, batch: SequenceBatch, rows: Tensor) -> dict[str, Tensor]:
        """:func:`sandbox.grad_noise.grad_noise` of the update whose (unclipped) gradient the
        parameters hold, on its rows ``rows``: ``[S]`` per column, NaN without a counterpart."""
        S = self.config.seeds
        if self.det_loss_fn is None:
            nan = torch.full((S,), math.nan, dtype=self.dtype, device=self.device)
            return dict.fromkeys(GRAD_NOISE_COLUMNS, nan)
        params = list(self.model.parameters())

        def forward() -> tuple[Tensor, list[Tensor]]:
            out, outputs = self._assemble(self.det_loss_fn, batch, rows, False, None)
            return out.loss, outputs

        half = first_half(S, rows.numel(), self.device)
        values = grad_noise(forward, params, [p.grad for p in params], half, S)
        return dict(zip(GRAD_NOISE_COLUMNS, values.to(self.dtype), strict=True))

    def update(self, batch: SequenceBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """mu epochs x minibatches of optimizer steps on one rollout; returns the per-seed
        gradient norm and the objective's metrics, both averaged over the updates."""
        cfg = self.config
        N = batch.rewards.shape[1]
        n = N // cfg.minibatches
        grad_norm = torch.zeros(cfg.seeds, dtype=self.dtype, device=self.device)
        sums: dict[str, Tensor] = {}
        step = self.steps_done
        for epoch in range(cfg.epochs):
            order = self.streams(Stream.MINIBATCH, step, epoch)
            perm = torch.randperm(N, generator=order, device=self.device)
            for mb in range(cfg.minibatches):
                rows = perm[mb * n : (mb + 1) * n]
                noise = self.streams(Stream.OBJECTIVE, step, epoch, mb)
                out = self._loss(batch, rows, step == 0, noise)
                self.optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                if cfg.grad_noise:  # before clipping and the step: g_rule as the loss gave it
                    for k, v in self._grad_noise(batch, rows).items():
                        sums[k] = sums.get(k, 0.0) + v
                grad_norm += clip_grad_norm_per_model(self.model, cfg.max_grad_norm)
                self.optimizer.step()
                for k, v in out.metrics.items():
                    sums[k] = sums.get(k, 0.0) + v.detach().to(self.dtype)
        updates = cfg.epochs * cfg.minibatches
        return grad_norm / updates, {k: v / updates for k, v in sums.items()}

    # -- mechanism check (a) -------------------------------------------------------------------
    @torch.no_grad()
    def policy_logits(self, batch: SequenceBatch) -> Tensor:
        """The current model's next-token logits over the allowed tokens, ``[S, N, Tc, K]`` (K =
        the task's completion tokens, in ``allowed_ids`` order), at every prefix of ``batch``'s
        rows: ``softmax`` of them is the policy :meth:`TinyTransformer.completion_logp` scores
        (its restriction to ``allowed`` gives the other tokens probability 0)."""
        logits = self.model.completion_logits(
            batch.prompt, batch.prompt_mask, batch.completion, batch.completion_mask
        )
        return logits.index_select(-1, self.allowed_ids)

    @torch.no_grad()
    def entropy_law_columns(
        self, batch: SequenceBatch, before: Tensor, after: Tensor
    ) -> dict[str, Tensor]:
        """Per-seed ``[S]`` token means over the visited prefixes (``completion_mask``) of the
        observed entropy change ``H(softmax after) - H(softmax before)`` and of the law's
        first-order prediction ``-Cov_pi(log pi, after - before)`` (arXiv 2505.22617), with
        ``before``/``after`` from :meth:`policy_logits` around the step's updates."""
        mask = batch.completion_mask
        count = mask.sum((1, 2)).to(before.dtype)
        change = softmax_entropy(after) - softmax_entropy(before)
        pred = entropy_covariance_prediction(before, after - before)
        zero = before.new_zeros(())
        return {
            "entropy_change": torch.where(mask, change, zero).sum((1, 2)) / count,
            "entropy_change_pred": torch.where(mask, pred, zero).sum((1, 2)) / count,
        }

    def step(self) -> dict[str, Tensor]:
        """One rollout and its updates; per-seed ``[S]`` tensors and pooled 0-d metrics."""
        batch = self.rollout()
        before = self.policy_logits(batch) if self.config.entropy_law else None
        grad_norm, metrics = self.update(batch)
        self.steps_done += 1
        S, G = self.config.seeds, self.config.group_size
        cmask = batch.completion_mask.to(self.dtype)
        groups = batch.rewards.view(S, -1, G)
        out = {
            **metrics,  # the rollout's entropy below, not the update's, is the entropy column
            "reward": batch.rewards.mean(-1),
            "entropy": (batch.entropy * cmask).sum((1, 2)) / cmask.sum((1, 2)),
            "completion_len": cmask.sum(-1).mean(-1),
            "grad_norm": grad_norm,
            "zero_var_frac": (groups == groups[..., :1]).all(-1).to(self.dtype).mean(-1),
        }
        if before is not None:  # the logits after every one of the step's updates
            out.update(self.entropy_law_columns(batch, before, self.policy_logits(batch)))
        return out


def train_sequence(
    config: SequenceTrainConfig, *, progress: bool = False, trainer: SequenceTrainer | None = None
) -> pd.DataFrame:
    """Train ``config.seeds`` tiny transformers on the task; one row per (step, seed)."""
    trainer = trainer or SequenceTrainer(config)
    history: dict[str, list[Tensor]] = {}
    bar = tqdm(range(config.steps), disable=not progress, desc=f"{config.task} {config.objective}")
    for _ in bar:
        for k, v in trainer.step().items():
            history.setdefault(k, []).append(v.detach())
    S, steps = config.seeds, config.steps
    data: dict[str, Any] = {
        "step": np.repeat(np.arange(steps), S),
        "seed": np.tile(np.arange(S), steps),
    }
    for k, values in history.items():
        arr = torch.stack(values).cpu().numpy()
        data[k] = (arr if arr.ndim == 2 else np.repeat(arr[:, None], S, 1)).reshape(-1)
    frame = pd.DataFrame(data)
    if config.eval_prompts:  # the final policy (after the last update), on the last step's rows
        frame["eval_pass"] = np.nan
        frame.loc[frame["step"] == steps - 1, "eval_pass"] = trainer.evaluate().cpu().numpy()
    frame["pass_rate"] = frame["reward"]
    frame["expected_reward"] = frame["reward"]
    frame.attrs.update(
        config=asdict(config), objective=trainer.objective.name, aggregation=trainer.aggregation
    )
    if not math.isfinite(float(frame["grad_norm"].max())):
        raise FloatingPointError("non-finite gradient norm during training")
    return frame


#: The record a warm-start file holds besides the weights (what :func:`load_warm_start` checks).
FORMAT = "clip-sandbox warm start v1"

#: The checkout this package runs from: a relative warm-start path is also looked up here.
CHECKOUT = Path(__file__).resolve().parents[2]


def warm_start_path(path: str | Path) -> Path:
    """``path``, or, where it is relative and not found from the working directory, the same
    path in the checkout (a committed warm start, as the claims study's default ``init``), so a
    run's setting names the file the same way wherever the command runs."""
    path = Path(path)
    if path.is_absolute() or path.exists() or not (CHECKOUT / path).exists():
        return path
    return CHECKOUT / path


def load_warm_start(path: str | Path, run: SequenceTrainConfig) -> dict[str, torch.Tensor]:
    """The weights of a warm-start file for the run ``run`` (:func:`warm_start_path`): a
    ``ValueError`` naming ``init`` where the file is missing, not a warm start, or made for
    another task or model shape."""
    try:
        record = torch.load(warm_start_path(path), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ValueError(f"init: cannot read {path} as a warm start: {exc}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"init: {path} is not a warm start of python -m sandbox.train.warm_start")
    made = record["config"]
    mine = {"task": run.task, "task_knobs": make_task(run.task, **run.task_knobs).knobs}
    theirs = {
        "task": made["task"],
        "task_knobs": make_task(made["task"], **made["task_knobs"]).knobs,
    }
    if mine != theirs or record["model"] != asdict(run.model_config()):
        raise ValueError(
            f"init: {path} was made for {theirs} with model {record['model']}; this run is "
            f"{mine} with model {asdict(run.model_config())}"
        )
    return record["state"]
