"""GRPO-style RL on a causal LM with any sandbox objective: one driver from one CPU to many GPUs.

One step, read top to bottom in :func:`loop` (each phase a function of one screen), the one loop
of a run (:func:`train`) and of K runs in step (:mod:`llm.ensemble`, which passes its batched
update phase); every random draw comes from a named stream of :mod:`llm.streams`:

1. :func:`rollout`  prompts -> G completions each (Hugging Face ``generate``, batched over a rank's
   prompts, or a colocated vLLM engine with ``--rollout-backend vllm``: :mod:`llm.vllm_rollout`)
   -> verifier rewards -> old (and reference) log-probs -> every rank's rows gathered;
2. :func:`score`    rewards -> :mod:`sandbox.advantages` -> loss mask (and dynamic-sampling filter);
3. :func:`update`   mu epochs x minibatches x gradient accumulation; each micro-batch
   (:func:`micro_step`) computes its log-probs from the LM head in chunks (:mod:`llm.logprobs`,
   no ``[B, T, V]`` logits) and its loss with :class:`sandbox.loss.PolicyLoss`, the project's one
   loss assembly (objective -> rollout IS weight -> aggregate with the minibatch's *global*
   counts -> + KL -> - entropy), then backward -> grad-norm clipping -> optimizer step;
4. :func:`log_step` one JSON line in ``OUT/metrics.jsonl`` (:mod:`llm.report`), evaluation every
   ``--eval-every`` steps (and before the first), checkpoints (:mod:`llm.checkpoint`; a finished
   run with ``--no-save-model`` keeps no weights: its checkpoint is the step and settings only).

Settings are :class:`llm.config.TrainConfig` (``--help``, or ``--config run.yaml``). This module
defines no loss. SIGTERM or Ctrl-C finishes the current step, writes a checkpoint and exits (143 /
130); a second Ctrl-C aborts at once.

How to run::

    # CPU, seconds: a tiny Llama built in code on a synthetic task
    python -m llm.train --model tiny --task mod_arith --objective dapo --steps 20 --lr 1e-3 --out runs/tiny
    # one GPU
    python -m llm.train --model Qwen/Qwen2.5-0.5B-Instruct --data gsm8k.jsonl --objective dapo \\
        --steps 200 --prompts-per-step 32 --group-size 8 --max-new-tokens 512 --out runs/q05
    # one GPU, vLLM rollouts with the truncated importance correction (pip install '.[vllm]')
    python -m llm.train --model Qwen/Qwen2.5-0.5B-Instruct --data gsm8k.jsonl --objective dapo \\
        --rollout-backend vllm --rollout-is truncate --max-new-tokens 512 --out runs/q05v
    # 8 GPUs (DDP; add --fsdp to shard parameters, gradients and optimizer state)
    torchrun --nproc_per_node 8 -m llm.train --model Qwen/Qwen2.5-1.5B-Instruct --data gsm8k.jsonl \\
        --objective nsr_dapo --prompts-per-step 128 --out runs/q15

Distributed data flow: every rank draws the same prompts from the same generator and generates
for its own share; the rollout (token ids, masks, rewards, old log-probs) is all-gathered, so
every rank holds the step's whole batch. Minibatches are global permutations of its rows, split
into ``world x grad_accum`` micro-batches; each micro-batch's loss is aggregated with the
minibatch's global counts and scaled by the world size (DDP averages gradients), so the optimizer
sees the full-minibatch gradient whatever the number of processes or micro-batches.

Logged metrics (one JSON object per step in ``metrics.jsonl``; names shared with the toy runs):

=================== ===========================================================================
step                steps done (1-based)
reward              mean verifier reward of the step's completions (before the update)
pass_rate           share of completions with reward 1
reward_std          standard deviation of the rewards
completion_len      mean completion length in tokens (EOS included)
truncated_frac      share of completions that hit --max-new-tokens without EOS
zero_var_frac       share of groups whose rewards are all equal (zero advantage)
entropy             mean next-token entropy over the loss tokens (training forward)
clip_low_frac       share of loss tokens in Z_lo = {A < 0, r < 1 - eps_low} (the objective's)
clip_high_frac      share in Z_hi = {A > 0, r > 1 + eps_high}; both are 0 on-policy (r = 1)
rescue_frac, ...    every other metric the objective returns (NSR rescue share, dual clip, ...)
ratio_mean/min/max  importance ratio statistics (min/max over all updates of the step)
kl_k3               k3 estimate of KL(pi_old || pi) from the objective
kl_ref_k3           k3 KL to the reference model (with --kl-coef > 0)
rollout_is_mean     with --rollout-is: mean rollout-correction weight (sandbox.correction)
rollout_is_clip_frac  share of tokens (sequences) whose rho = pi_old/pi_rollout was clipped
                    (truncate); rollout_is_masked_frac: share zeroed (mask)
rollout_kl_k3       k3 KL(pi_rollout || pi_old) per token, sampler vs trainer log-probs
off_policy_masked_frac  with --off-policy-mask: share of sequences dropped (A < 0 and mean k1
                    KL(pi_sampler || pi) > THRESHOLD; the sampler is vLLM's log-probs, else pi_old)
entropy_masked_frac with --top-entropy-quantile < 1: share of loss tokens outside the top-q by
                    entropy (quantile over each rank's micro-batch; sandbox.masks)
loss                sum of the minibatch losses, mean over optimizer steps
grad_norm           gradient norm before clipping, mean over optimizer steps
entropy_change      with --entropy-law (mechanism check (a), one process): token mean over the
                    step's first --entropy-law-rows completions of H(pi after the step's updates)
                    - H(pi before), full-vocabulary next-token logits / temperature;
                    entropy_change_pred: the entropy-covariance law's first-order prediction,
                    mean of -Cov_pi(log pi, z' - z) (:func:`entropy_law_columns`)
grad_rescue_var     with --grad-noise (mechanism check (c), one process; :mod:`sandbox.grad_noise`):
                    ||g_rule - g_det||^2 against the rule's deterministic counterpart (NSR ->
                    NSR-decay); grad_sampling_var = ||h_1 - h_2||^2 over the minibatch's halves,
                    grad_signal = ||g_det||^2; means over the step's updates, NaN for a rule
                    without a counterpart (:func:`grad_noise_update`)
grad_mass_zero_lo   with --grad-mass: share of the advantage-weighted gradient mass sum |r A| on
                    tokens the rule gives a zero coefficient, ratio below 1 (grad_mass_zero_hi:
                    above 1); grad_mass_rescued: on tokens where the hard clip would bind but the
                    rule keeps a gradient (sandbox.loss.grad_mass_shares; token-weighted means)
lr                  learning rate of the step
tokens_per_s        completion tokens generated (all ranks) per second of the step
step_time           seconds for the step (rollout + update + logging)
eval_pass@1, @k     on held-out prompts every --eval-every steps (k samples per prompt)
=================== ===========================================================================

Token-weighted metrics are averaged over micro-batches and ranks with their valid-token counts.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from llm import checkpoint, decode, dist, rollout
from llm import model as models
from llm.config import (
    TrainConfig,
    as_json,
    check_optional,
    check_resume,
    decode_settings,
    objective_choices,
)
from llm.data import PromptSource, make_source
from llm.logprobs import CHUNK_ELEMENTS, completion_logits, completion_logp
from llm.report import Reporter, StepMetrics
from llm.streams import PromptStream, Stream, derive_seed, prompt_rng
from llm.vllm_rollout import VLLMRollout
from sandbox.advantages import compute_advantages, zero_variance_groups
from sandbox.configs import check_device, parse_config
from sandbox.exact.softmax import entropy as softmax_entropy
from sandbox.exact.softmax import entropy_covariance_prediction
from sandbox.experiments.results import prepare_out_dir
from sandbox.grad_noise import GRAD_NOISE_COLUMNS, counterpart_grads, counterpart_loss, noise_stats
from sandbox.loss import LossOutput, PolicyLoss

__all__ = ["TrainConfig", "main", "objective_choices", "parse_args", "train"]


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The settings from ``--config FILE`` and the command line (flags override the file)."""
    return parse_config(
        TrainConfig,
        argv,
        prog="python -m llm.train",
        description=__doc__.split("\n")[0],
        extra_help={
            "objective": f" ({', '.join(objective_choices())})",
            "model": f" (built in: {', '.join(models.available_models())})",
        },
    )


# --------------------------------------------------------------------------------------------------
# Setup: everything a step needs, built once
# --------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """The state of a run, built by :func:`setup`; the phases read it and update the model."""

    cfg: TrainConfig
    info: dist.DistInfo
    device: torch.device
    source: PromptSource
    tokenizer: Any
    model: torch.nn.Module  # the unwrapped model (with LoRA adapters); samples and saves
    policy: torch.nn.Module  # the DDP/FSDP-wrapped model that runs forward/backward
    reference: torch.nn.Module | None
    engine: VLLMRollout | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss_fn: PolicyLoss
    rng: np.random.Generator  # the prompt stream, the same on every rank
    chat: bool
    max_prompt: int | None
    start: int = 0
    closers: list[Any] = field(default_factory=list)
    det_loss_fn: PolicyLoss | None = None  # --grad-noise: the rule's deterministic counterpart

    @property
    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward passes' autocast, the one place it is entered: bf16 on CUDA with ``--bf16``,
        on the CPU with ``--cpu-bf16`` (else none: float32)."""
        if self.device.type == "cuda" and self.cfg.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        if self.device.type == "cpu" and self.cfg.cpu_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def need_old(self) -> bool:
        """More than one update per rollout: the ratio leaves 1, pi_old must be computed."""
        return self.cfg.epochs * self.cfg.minibatches > 1

    def encode(self, prompts: list[str]) -> list[list[int]]:
        ids = rollout.encode_prompts(self.tokenizer, prompts, self.chat, self.cfg.system_prompt)
        for p, row in zip(prompts, ids, strict=True):
            if self.max_prompt is not None and len(row) > self.max_prompt:
                raise ValueError(
                    f"a prompt has {len(row)} tokens, more than the {self.max_prompt} allowed "
                    f"(context - --max-new-tokens {self.cfg.max_new_tokens}, or "
                    f"--max-prompt-len): {p[:80]!r}..."
                )
        return ids


def load(cfg: TrainConfig) -> tuple[PromptSource, Any, torch.nn.Module, bool, int | None]:
    """Prompts, tokenizer and model, checked against each other before any compute."""
    source = make_source(
        cfg.task,
        cfg.task_knobs,
        cfg.data,
        cfg.verifier,
        cfg.seed,
        cfg.eval_prompts if cfg.eval_every else 0,
        cfg.eval_data,
        cfg.split,
    )
    offline = models.is_offline(cfg.offline)
    tokenizer = models.load_tokenizer(
        cfg.model, offline=offline, pad_token=cfg.pad_token, trust_remote_code=cfg.trust_remote_code
    )
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if cfg.chat_template == "on" and not has_template:
        raise ValueError(f"--chat-template on, but the tokenizer of {cfg.model!r} has none")
    chat = cfg.chat_template == "on" or (cfg.chat_template == "auto" and has_template)
    model = models.load_model(
        cfg.model,
        vocab_size=len(tokenizer),
        seed=cfg.seed,
        offline=offline,
        dtype=getattr(torch, cfg.dtype),
        trust_remote_code=cfg.trust_remote_code,
    )
    context = models.context_length(model)
    max_prompt = cfg.max_prompt_len or ((context - cfg.max_new_tokens) if context else None)
    if context is not None and max_prompt + cfg.max_new_tokens > context:
        raise ValueError(
            f"--max-prompt-len {max_prompt} + --max-new-tokens {cfg.max_new_tokens} "
            f"exceeds the model's context of {context} tokens"
        )
    return source, tokenizer, model, chat, max_prompt


def setup(cfg: TrainConfig, closers: list[Any]) -> Run:
    """Checks, data, model (+ vLLM engine, LoRA, checkpointing, reference), DDP/FSDP wrapping,
    optimizer, and the checkpoint to resume from."""
    cfg.validate(int(os.environ.get("WORLD_SIZE", "1")), launched="WORLD_SIZE" in os.environ)
    check_optional(cfg)
    settings = as_json(cfg)
    ckpt_exists = os.path.exists(checkpoint.path_in(cfg.out))
    if ckpt_exists and not cfg.resume:
        raise ValueError(f"{checkpoint.path_in(cfg.out)} exists: pass --resume, or a new --out")
    if cfg.resume:
        check_resume(cfg, settings)
        if not checkpoint.has_weights(cfg.out):
            raise ValueError(
                f"--resume: {checkpoint.path_in(cfg.out)} is the record of a run that finished "
                "with --no-save-model, which keeps no weights: it cannot train further (a new "
                "--out trains again)"
            )
    if cfg.device != "auto":
        check_device(cfg.device)
    models.check_model(
        cfg.model, offline=cfg.offline
    )  # before minutes of loading (or of Hub retries)
    prepare_out_dir(cfg.out, sub=".")
    loss_fn = PolicyLoss(
        cfg.build_objective(),
        cfg.aggregation,
        kl_coef=cfg.kl_coef,
        entropy_coef=cfg.entropy_coef,
        rollout_is=cfg.rollout_is,
        rollout_is_level=cfg.rollout_is_level,
        rollout_is_min=cfg.rollout_is_min,
        rollout_is_max=cfg.rollout_is_max,
        off_policy_mask=cfg.off_policy_mask,
        top_entropy_quantile=cfg.top_entropy_quantile,
        grad_mass=cfg.grad_mass,
    )
    with models.hf_progress(cfg.progress):
        source, tokenizer, model, chat, max_prompt = load(cfg)
    info, device = dist.init(cfg.device, cfg.backend)
    if cfg.cpu_bf16 and device.type != "cpu":  # --device auto resolved to a GPU
        raise ValueError(f"--cpu-bf16 is for CPU runs, this one runs on {device} (CUDA: --bf16)")
    model.to(device)
    engine = None
    if cfg.rollout_backend == "vllm":  # built from the untouched base model, before LoRA/wrapping
        engine = make_engine(cfg, model, tokenizer, device, max_prompt)
        closers.append(engine.close)
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=0.0,
            target_modules=cfg.lora_target,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    if cfg.gradient_checkpointing:  # transformers 5 renamed it; 4.x has only the old name
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    reference = None
    if cfg.kl_coef > 0 and cfg.lora_r == 0:  # with LoRA the reference is the adapter-free model
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    policy = dist.wrap(model, info, device, cfg.fsdp)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(cfg, s))
    run = Run(
        cfg,
        info,
        device,
        source,
        tokenizer,
        model,
        policy,
        reference,
        engine,
        optimizer,
        scheduler,
        loss_fn,
        prompt_rng(cfg.seed, PromptStream.TRAIN),
        chat,
        max_prompt,
        closers=closers,
    )
    if cfg.grad_noise:
        run.det_loss_fn = counterpart_loss(loss_fn)
    run.encode(source.probe + source.eval_prompts)  # every prompt fits, before any compute
    if cfg.resume:
        run.start = checkpoint.load(cfg.out, policy, optimizer, scheduler, run.rng)
        if info.main:
            print(f"resuming from step {run.start} of {cfg.steps} in {cfg.out}", file=sys.stderr)
    if info.main:
        os.makedirs(cfg.out, exist_ok=True)
        with open(os.path.join(cfg.out, "config.json"), "w") as f:
            json.dump(settings, f, indent=1, sort_keys=True)
    return run


def make_engine(
    cfg: TrainConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    device: torch.device,
    max_prompt: int | None,
) -> VLLMRollout:
    """The colocated vLLM engine (``--rollout-backend vllm``)."""
    if models.is_offline(cfg.offline):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bf16 = cfg.dtype == "bfloat16" or (device.type == "cuda" and cfg.bf16)
    return VLLMRollout(
        model,
        tokenizer,
        model_name=cfg.model,
        device=device,
        dtype="bfloat16" if bf16 else "float32",
        max_model_len=max_prompt + cfg.max_new_tokens if max_prompt is not None else None,
        seed=cfg.seed,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        sleep=cfg.vllm_sleep,
        enforce_eager=cfg.vllm_enforce_eager,
        trust_remote_code=cfg.trust_remote_code,
    )


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """Linear warmup, then constant, linear or cosine decay to 0 at ``--steps``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    if cfg.lr_schedule == "linear":
        return max(0.0, 1.0 - progress)
    if cfg.lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return 1.0


# --------------------------------------------------------------------------------------------------
# Phase 1: rollout
# --------------------------------------------------------------------------------------------------


def sample(
    run: Run,
    prompt_ids: list[list[int]],
    k: int,
    keys: tuple[int, ...],
    first: int,
    return_logp: bool = False,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``k`` completions per prompt and their texts, from vLLM or ``generate``."""
    cfg = run.cfg
    if run.engine is not None:
        out = run.engine.generate(
            run.model,
            prompt_ids,
            group_size=k,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            seed_keys=keys,
            first_index=first,
            return_logp=return_logp,
        )
    elif cfg.rollout_backend == "compact":  # llm.decode, this run alone (K = 1)
        return sample_compact([run], [prompt_ids], k, [keys], [first], return_logp)[0]
    else:
        run.model.eval()
        cache, compile_decode = decode_settings(cfg)
        with run.autocast:
            out = rollout.generate(
                run.model,
                run.tokenizer,
                prompt_ids,
                group_size=k,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                prompts_per_call=cfg.prompts_per_call or max(len(prompt_ids), 1),
                seed_keys=keys,
                first_index=first,
                device=run.device,
                synced_gpus=cfg.fsdp and run.info.enabled,
                return_logp=return_logp,
                cache=cache,
                compile_decode=compile_decode,
            )
    texts = run.tokenizer.batch_decode(out["completion"], skip_special_tokens=True)
    return out, texts


def sample_compact(
    runs: Sequence[Run],
    prompt_ids: Sequence[list[list[int]]],
    k: int,
    keys: Sequence[tuple[int, ...]],
    first: Sequence[int],
    return_logp: bool = False,
) -> list[tuple[dict[str, torch.Tensor], list[str]]]:
    """:func:`sample` of every run in ``runs`` (one model architecture) in one decoding loop
    (:func:`llm.decode.generate`): each run's completions are the ones it samples alone."""
    cfg = runs[0].cfg
    with runs[0].autocast:
        outs = decode.generate(
            [run.model for run in runs],
            runs[0].tokenizer,
            prompt_ids,
            group_size=k,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            seed_keys=keys,
            first_index=first,
            device=runs[0].device,
            return_logp=return_logp,
            compile_step=cfg.generate_compile == "on",
            max_prompt=runs[0].max_prompt,
        )
    texts = [
        run.tokenizer.batch_decode(o["completion"], skip_special_tokens=True)
        for run, o in zip(runs, outs, strict=True)
    ]
    return list(zip(outs, texts, strict=True))


@torch.no_grad()
def logprobs(run: Run, net: torch.nn.Module, batch: dict[str, torch.Tensor], chunks: int):
    """Per-token log-probs of the completions under ``net`` (no graph), in ``chunks`` rows."""
    net.eval()
    pieces = []
    for rows in torch.arange(batch["prompt"].shape[0]).tensor_split(chunks):
        sub = {
            k: batch[k][rows].to(run.device)
            for k in ("prompt", "prompt_mask", "completion", "completion_mask")
        }
        pieces.append(forward_logp(run, net, sub)[0].cpu())
    return torch.cat(pieces)


def forward_logp(
    run: Run, net: torch.nn.Module, sub: dict[str, torch.Tensor], entropy: str | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``net``'s completion log-probs (and entropy) of a batch, under the run's autocast, from the
    LM head in chunks (:func:`llm.logprobs.completion_logp`)."""
    with run.autocast:
        return completion_logp(
            net,
            sub["prompt"],
            sub["prompt_mask"],
            sub["completion"],
            sub["completion_mask"],
            run.cfg.temperature,
            entropy=entropy,
            chunk_size=run.cfg.logp_chunk,
            head=run.cfg.lm_head,
        )


def needs_sampler_logp(cfg: TrainConfig) -> bool:
    """The sampler's own log-probs are kept for the rollout correction, for the off-policy
    mask with vLLM (TRL's ``sampling_per_token_logps``: the mask then also sees the
    trainer/sampler mismatch; with ``generate`` the trainer's pi_old is the sampler), and as
    pi_old itself with ``--old-logp sampler`` at mu > 1."""
    vllm_mask = cfg.off_policy_mask is not None and cfg.rollout_backend == "vllm"
    as_old = cfg.old_logp == "sampler" and cfg.epochs * cfg.minibatches > 1
    return cfg.rollout_is != "none" or vllm_mask or as_old


def rollout_phase(run: Run, step: int) -> dict[str, torch.Tensor]:
    """This rank's share of the step's prompts -> completions, rewards, old and reference
    log-probs; returns every rank's rows, gathered on the CPU."""
    request = draw_prompts(run, step)
    sampled = sample(run, *request[:4], return_logp=needs_sampler_logp(run.cfg))
    return score_rollout(run, request[4], *sampled)


def rollout_each(runs: Sequence[Run], step: int) -> list[dict[str, torch.Tensor]]:
    """The rollout phase of each run alone (:func:`rollout_phase`): a run's :data:`RolloutFn`."""
    return [rollout_phase(run, step) for run in runs]


def draw_prompts(
    run: Run, step: int
) -> tuple[list[list[int]], int, tuple[int, ...], int, list[str]]:
    """This rank's share of the step's prompts: ``(token ids, G, stream keys, index of the
    first, answers)``."""
    cfg, info = run.cfg, run.info
    prompts, answers = run.source.draw(run.rng, cfg.prompts_per_step)  # same on every rank
    P_local = cfg.prompts_per_step // info.world
    lo = info.rank * P_local
    keys = (cfg.seed, Stream.ROLLOUT, step)
    return (
        run.encode(prompts[lo : lo + P_local]),
        cfg.group_size,
        keys,
        lo,
        answers[lo : lo + P_local],
    )


def score_rollout(
    run: Run,
    answers: list[str],
    local: dict[str, torch.Tensor],
    texts: list[str],
    logp_old: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Rewards, old and reference log-probs of this rank's completions; every rank's rows,
    gathered on the CPU. ``logp_old``: the old log-probs where the caller computed them
    (:mod:`llm.ensemble`: every member's in one batched forward)."""
    cfg, G = run.cfg, run.cfg.group_size
    local_answers = [a for a in answers for _ in range(G)]
    local["rewards"] = torch.tensor(
        [float(run.source.verify(a, t)) for a, t in zip(local_answers, texts, strict=True)]
    )
    chunks = min(cfg.minibatches * cfg.grad_accum, local["prompt"].shape[0])
    if run.need_old:  # --old-logp sampler: the sampler's own, one forward less
        if cfg.old_logp == "sampler":
            logp_old = local["rollout_logp"]
        local["logp_old"] = (
            logp_old if logp_old is not None else logprobs(run, run.model, local, chunks)
        )
    if cfg.kl_coef > 0:
        if run.reference is None:  # LoRA: the reference is the model without its adapters
            with dist.unwrap(run.model).disable_adapter():
                local["logp_ref"] = logprobs(run, run.model, local, chunks)
        else:
            local["logp_ref"] = logprobs(run, run.reference, local, chunks)
    return gather_rollout(local, run.tokenizer.pad_token_id)


def gather_rollout(local: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """Concatenate every rank's rollout in rank order (prompts left-, completions right-padded)."""
    parts = dist.all_gather_object({k: v.cpu() for k, v in local.items()})
    return {k: torch.cat(rows) for k, rows in rollout.pad_to_common(parts, pad_id).items()}


# --------------------------------------------------------------------------------------------------
# Phase 2: score
# --------------------------------------------------------------------------------------------------


def score(run: Run, host: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Advantages (:mod:`sandbox.advantages`) and the loss mask, on the device; returns the batch
    and the rows to train on (all, or those of groups with unequal rewards)."""
    cfg, G = run.cfg, run.cfg.group_size
    batch = {k: v.to(run.device) for k, v in host.items()}
    batch["adv"] = compute_advantages(batch["rewards"], G, method=cfg.advantage)
    batch["loss_mask"] = batch["completion_mask"].clone()
    if cfg.mask_truncated:
        batch["loss_mask"][batch["truncated"]] = 0
    keep = torch.arange(host["rewards"].numel())
    if cfg.drop_zero_variance:
        keep = keep[~zero_variance_groups(host["rewards"], G).repeat_interleave(G)]
    return batch, keep


# --------------------------------------------------------------------------------------------------
# Phase 3: update
# --------------------------------------------------------------------------------------------------


def update(
    run: Run,
    batch: dict[str, torch.Tensor],
    host: dict[str, torch.Tensor],
    keep: torch.Tensor,
    step: int,
) -> StepMetrics:
    """mu epochs x minibatches optimizer steps; each minibatch in ``world x grad_accum``
    micro-batches whose losses use the minibatch's global counts, so the gradient is the
    full minibatch's at any number of processes or micro-batches."""
    cfg, info, A = run.cfg, run.info, run.cfg.grad_accum
    run.policy.train()
    metrics = StepMetrics(run.device)
    for epoch in range(cfg.epochs if keep.numel() else 0):
        perm = minibatch_order(run, keep, step, epoch)
        for mb, mb_rows in enumerate(perm.tensor_split(cfg.minibatches)):
            if mb_rows.numel() == 0:
                continue
            counts = minibatch_counts(run, batch, mb_rows)
            pieces = mb_rows.tensor_split(info.world * A)
            for a in range(A):
                piece = a * info.world + info.rank
                empty = pieces[piece].numel() == 0  # still run: every rank must call backward
                sub = trim(batch, host, mb_rows[:1] if empty else pieces[piece], run.device)
                generator = objective_generator(run, step, epoch, mb, piece)
                out = micro_step(run, sub, counts, generator, sync=a == A - 1, empty=empty)
                metrics.add(out.loss, out.metrics, sub["loss_mask"].sum() * (not empty), empty)
            if cfg.grad_noise:  # before clipping and the step: g_rule as the loss gave it
                metrics.add_means(grad_noise_update(run, batch, host, mb_rows, counts))
            params = run.optimizer.param_groups[0]["params"]  # the trainable ones, from setup
            metrics.add_grad_norm(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            if run.engine is not None:
                run.engine.mark_stale()
    return metrics


def minibatch_order(run: Run, keep: torch.Tensor, step: int, epoch: int) -> torch.Tensor:
    """The rows ``keep`` in the epoch's order (:attr:`Stream.MINIBATCH`), split into minibatches
    by the caller."""
    gen = torch.Generator().manual_seed(derive_seed(run.cfg.seed, Stream.MINIBATCH, step, epoch))
    return keep[torch.randperm(keep.numel(), generator=gen)]


def objective_generator(
    run: Run, step: int, epoch: int, mb: int, piece: int
) -> torch.Generator | None:
    """The objective's randomness for micro-batch ``piece`` of minibatch ``mb``
    (:attr:`Stream.OBJECTIVE`; stateless: the same draws at any world size), None for a
    deterministic objective."""
    if not run.loss_fn.objective.stochastic:
        return None
    seed = derive_seed(run.cfg.seed, Stream.OBJECTIVE, step, epoch, mb, piece)
    return torch.Generator(run.device).manual_seed(seed)


def minibatch_counts(
    run: Run, batch: dict[str, torch.Tensor], mb_rows: torch.Tensor
) -> dict[str, Any]:
    """The global counts every micro-batch of a minibatch aggregates with."""
    return mask_counts(batch["loss_mask"][mb_rows.to(run.device)], run.cfg.max_new_tokens)


def mask_counts(mask: torch.Tensor, max_len: int) -> dict[str, Any]:
    """Loss tokens and sequences with one of a minibatch's loss mask ``[..., rows, T]`` (the
    leading dims, e.g. an ensemble's members, kept), and ``max_len``."""
    per_row = mask.sum(-1)
    return {
        "num_tokens": per_row.sum(-1).float(),
        "num_seqs": (per_row > 0).sum(-1).float(),
        "max_len": max_len,
    }


def micro_step(
    run: Run,
    sub: dict[str, torch.Tensor],
    counts: dict[str, Any],
    generator: torch.Generator | None,
    *,
    sync: bool,
    empty: bool,
):
    """Forward, the loss (:class:`sandbox.loss.PolicyLoss`), backward, for one micro-batch.
    Gradients are synchronised across ranks on the last micro-batch of a minibatch (``sync``)."""
    cfg, info, policy = run.cfg, run.info, run.policy
    mask = sub["loss_mask"] * (0 if empty else 1)
    if info.launched and cfg.fsdp:
        policy.set_requires_gradient_sync(sync)
    no_sync = info.enabled and not cfg.fsdp and not sync
    with policy.no_sync() if no_sync else contextlib.nullcontext():
        out, _ = micro_loss(run, run.loss_fn, sub, mask, counts, generator)
        (out.loss * info.world).backward()  # DDP/FSDP average over ranks; we want the sum
    return out


def micro_loss(
    run: Run,
    loss_fn: PolicyLoss,
    sub: dict[str, torch.Tensor],
    mask: torch.Tensor,
    counts: dict[str, Any],
    generator: torch.Generator | None,
) -> tuple[LossOutput, list[torch.Tensor]]:
    """The policy's forward on a micro-batch and ``loss_fn`` (:class:`sandbox.loss.PolicyLoss`)
    with the minibatch's ``counts``; also returns the per-row tensors the loss was built from
    that carry the graph (``logp``, and ``entropy`` with ``--entropy-coef > 0``)."""
    grad_entropy = run.cfg.entropy_coef > 0
    logp, entropy = forward_logp(run, run.policy, sub, "grad" if grad_entropy else "metric")
    out = loss_fn(
        logp,
        sub["logp_old"] if run.need_old else logp.detach(),
        sub["adv"],
        mask,
        logp_ref=sub.get("logp_ref"),
        rollout_logp=sub.get("rollout_logp"),
        entropy=entropy,
        generator=generator,
        validate=False,
        **counts,
    )
    return out, [logp, entropy] if grad_entropy else [logp]


def trim(
    batch: dict[str, torch.Tensor],
    host: dict[str, torch.Tensor],
    rows: torch.Tensor,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """The rows of a micro-batch without all-padding prompt columns and completion tail (the
    bounds come from the CPU copy ``host``, so no device sync)."""
    left = int(host["prompt_mask"][rows].any(0).long().argmax())
    right = max(int(host["completion_mask"][rows].sum(-1).max()), 1)
    sub = {k: v[rows.to(device)] for k, v in batch.items()}
    for key in ("prompt", "prompt_mask"):
        sub[key] = sub[key][:, left:]
    for key, v in sub.items():
        if key not in ("prompt", "prompt_mask") and v.dim() == 2:
            sub[key] = v[:, :right]
    return sub


# --------------------------------------------------------------------------------------------------
# Mechanism checks (opt-in, one process): (a) the entropy-covariance law, (c) gradient noise
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def no_random_draws(run: Run):
    """Restore the global random state after a probe, so that a probe's forward (dropout, if a
    model had any) leaves the training draws as they were: training is bit-identical with the
    probes on or off."""
    devices = [run.device] if run.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


@torch.no_grad()
def entropy_law_probe(
    run: Run, batch: dict[str, torch.Tensor], host: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The probe of mechanism check (a): the step's first ``--entropy-law-rows`` completions and
    the policy's full next-token logits ``z / temperature`` at their ``N`` completion tokens,
    ``[N, V]`` (:func:`llm.logprobs.completion_logits`; the model in eval mode, as it samples)."""
    rows = torch.arange(min(run.cfg.entropy_law_rows, host["completion"].shape[0]))
    sub = trim(batch, host, rows, run.device)
    return sub, probe_logits(run, sub)


@torch.no_grad()
def probe_logits(run: Run, sub: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[N, V]`` the sampling policy's logits at ``sub``'s completion tokens (no graph)."""
    run.model.eval()
    with no_random_draws(run), run.autocast:
        return completion_logits(
            run.model,
            sub["prompt"],
            sub["prompt_mask"],
            sub["completion"],
            sub["completion_mask"],
            run.cfg.temperature,
        )


@torch.no_grad()
def entropy_law_columns(
    run: Run, sub: dict[str, torch.Tensor], before: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``entropy_change`` and ``entropy_change_pred`` of the step (arXiv 2505.22617), token means
    over the probe's ``N`` completion tokens, with ``z`` = ``before`` (:func:`entropy_law_probe`)
    and ``z'`` the same logits after the step's updates::

        entropy_change      = mean_t [ H(softmax z'_t) - H(softmax z_t) ]
        entropy_change_pred = mean_t [ -Cov_{a ~ softmax z_t}(log pi_t(a), z'_t(a) - z_t(a)) ]

    (:func:`sandbox.exact.softmax.entropy_covariance_prediction`), in float64, in chunks of
    ``CHUNK_ELEMENTS`` logits. NaN when the probe has no completion token."""
    after = probe_logits(run, sub)
    N, V = before.shape
    change = pred = torch.zeros((), dtype=torch.float64, device=before.device)
    step = max(1, CHUNK_ELEMENTS // V)
    for lo in range(0, N, step):
        z0, z1 = before[lo : lo + step].double(), after[lo : lo + step].double()
        change = change + (softmax_entropy(z1) - softmax_entropy(z0)).sum()
        pred = pred + entropy_covariance_prediction(z0, z1 - z0).sum()
    n = before.new_tensor(N if N else math.nan, dtype=torch.float64)
    return {"entropy_change": change / n, "entropy_change_pred": pred / n}


def grad_noise_update(
    run: Run,
    batch: dict[str, torch.Tensor],
    host: dict[str, torch.Tensor],
    mb_rows: torch.Tensor,
    counts: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """Mechanism check (c) on one optimizer update (:mod:`sandbox.grad_noise`), read after the
    minibatch's micro-steps and before clipping: ``g_rule`` = the parameters' accumulated
    gradient; ``g_det`` and ``h_1`` (half 1 = the first ``n // 2`` of the minibatch's ``n``
    rows) accumulated over the same micro-batches with the same ``counts`` from the counterpart's
    loss (:func:`sandbox.grad_noise.counterpart_loss`, :func:`~sandbox.grad_noise.counterpart_grads`);
    returns ``grad_rescue_var``, ``grad_sampling_var``, ``grad_signal``
    (:func:`~sandbox.grad_noise.noise_stats`), NaN for a rule without a counterpart, nothing for
    a minibatch of fewer than 2 rows. Costs one forward and three backward passes per
    micro-batch, and two parameter-sized accumulators."""
    if run.det_loss_fn is None:
        return dict.fromkeys(GRAD_NOISE_COLUMNS, torch.tensor(math.nan))
    n = mb_rows.numel()
    if n < 2:
        return {}
    params = run.optimizer.param_groups[0]["params"]
    first = mb_rows[: n // 2]
    g_det = h1 = None
    with no_random_draws(run):
        for piece in mb_rows.tensor_split(run.cfg.grad_accum):
            if piece.numel() == 0:
                continue
            sub = trim(batch, host, piece, run.device)
            out, outputs = micro_loss(run, run.det_loss_fn, sub, sub["loss_mask"], counts, None)
            half = torch.isin(piece, first).to(run.device)[:, None]
            g, h = counterpart_grads(out.loss, outputs, params, half)
            g_det = g if g_det is None else [a + b for a, b in zip(g_det, g, strict=True)]
            h1 = h if h1 is None else [a + b for a, b in zip(h1, h, strict=True)]
    values = noise_stats([p.grad for p in params], g_det, h1, seeds=1)[:, 0]
    return dict(zip(GRAD_NOISE_COLUMNS, values, strict=True))


# --------------------------------------------------------------------------------------------------
# Phase 4: log, evaluate, checkpoint
# --------------------------------------------------------------------------------------------------


def log_step(
    run: Run, step: int, batch: dict[str, torch.Tensor], metrics: StepMetrics, t0: float
) -> dict[str, float]:
    """The step's row: rollout statistics, the reduced update metrics, lr, evaluation, timing."""
    cfg, G = run.cfg, run.cfg.group_size
    rewards, cmask = batch["rewards"], batch["completion_mask"].float()
    zero = torch.zeros((), device=run.device)
    stats = torch.stack(
        [
            rewards.mean(),
            (rewards >= 1).float().mean(),
            rewards.std() if rewards.numel() > 1 else zero,
            cmask.sum(-1).mean(),
            batch["truncated"].float().mean(),
            zero_variance_groups(rewards, G).float().mean(),
            cmask.sum(),
        ]
    ).tolist()
    names = (
        "reward",
        "pass_rate",
        "reward_std",
        "completion_len",
        "truncated_frac",
        "zero_var_frac",
    )
    row = {"step": step + 1, **dict(zip(names, stats, strict=False)), **metrics.reduce()}
    row["lr"] = run.scheduler.get_last_lr()[0]
    with warnings.catch_warnings():  # a step whose groups were all dropped has no update
        warnings.simplefilter("ignore", UserWarning)
        run.scheduler.step()
    if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and run.source.eval_prompts:
        row.update(evaluate(run, step + 1))
    row["step_time"] = time.perf_counter() - t0
    row["tokens_per_s"] = stats[-1] / row["step_time"]
    if not math.isfinite(row["grad_norm"]) or not math.isfinite(row["loss"]):
        raise FloatingPointError(f"non-finite loss or gradient norm at step {step + 1}: {row}")
    return row


def evaluate(run: Run, step: int) -> dict[str, float]:
    """pass@1 and pass@k on the held-out prompts (split over ranks)."""
    cfg, info, source = run.cfg, run.info, run.source
    E = len(source.eval_prompts) // info.world * info.world
    lo, hi = info.rank * E // info.world, (info.rank + 1) * E // info.world
    _, texts = sample(
        run,
        run.encode(source.eval_prompts[lo:hi]),
        cfg.eval_k,
        (cfg.seed, Stream.EVAL, step),
        lo,
    )
    answers = [a for a in source.eval_answers[lo:hi] for _ in range(cfg.eval_k)]
    ok = torch.tensor([source.verify(a, t) >= 1.0 for a, t in zip(answers, texts, strict=True)])
    ok = ok.view(-1, cfg.eval_k).float()
    sums = dist.all_reduce(torch.stack([ok.mean(1).sum(), ok.max(1).values.sum()]).to(run.device))
    return {
        "eval_pass@1": sums[0].item() / max(E, 1),
        f"eval_pass@{cfg.eval_k}": sums[1].item() / max(E, 1),
    }


def save_checkpoint(run: Run, done: int) -> None:
    """``OUT/checkpoint.pt`` after ``done`` steps: everything to resume from, but for a finished
    run with ``--no-save-model``, which keeps no weights (its step and settings only)."""
    checkpoint.save(
        run.cfg.out,
        run.policy,
        run.optimizer,
        run.scheduler,
        step=done,
        rng=run.rng,
        config=as_json(run.cfg),
        main=run.info.main,
        weights=done < run.cfg.steps or run.cfg.save_model,
    )


def save_model(run: Run) -> None:
    """The trained model and tokenizer in Hugging Face format, ``OUT/model``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(run.policy, options=options)
    if run.info.main:
        with models.hf_progress(run.cfg.progress):
            dist.unwrap(run.model).save_pretrained(
                os.path.join(run.cfg.out, "model"), state_dict=state
            )
            run.tokenizer.save_pretrained(os.path.join(run.cfg.out, "model"))


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------


class StopRequest:
    """SIGTERM or the first Ctrl-C asks the loop to stop after the current step (with a
    checkpoint); a second Ctrl-C raises ``KeyboardInterrupt`` at once."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        if signum == signal.SIGINT:
            print(
                "\nCtrl-C: stopping after this step with a checkpoint (again to abort now)",
                file=sys.stderr,
            )


@contextlib.contextmanager
def stop_on_signals():
    """Install :class:`StopRequest` for SIGTERM and SIGINT (main thread only), but not for a signal
    the process ignores: a pool worker ignores SIGINT, which is its driver's to answer (it stops
    the worker with SIGTERM). Taking it there made a second Ctrl-C raise ``KeyboardInterrupt`` in
    the worker, whose pool then waited on it for good (issue 39's hung claims study)."""
    request, previous = StopRequest(), {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # not the main thread: no handler
            if signal.getsignal(sig) is not signal.SIG_IGN:
                previous[sig] = signal.signal(sig, request)
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: The update phase of one step, for the runs of one loop: ``(runs, batches, hosts, keeps, step)``
#: -> each run's :class:`StepMetrics`. :func:`update_each` updates each run alone (``llm.train``);
#: :mod:`llm.ensemble` passes its batched update (the members' forward and backward as one).
#: the rollout phase of the runs of :func:`loop` at a step: each run's gathered rollout
RolloutFn = Callable[[Sequence[Run], int], list[dict[str, torch.Tensor]]]
UpdateFn = Callable[
    [
        Sequence[Run],
        Sequence[dict[str, torch.Tensor]],
        Sequence[dict[str, torch.Tensor]],
        Sequence[torch.Tensor],
        int,
    ],
    list[StepMetrics],
]


def update_each(
    runs: Sequence[Run],
    batches: Sequence[dict[str, torch.Tensor]],
    hosts: Sequence[dict[str, torch.Tensor]],
    keeps: Sequence[torch.Tensor],
    step: int,
) -> list[StepMetrics]:
    """The update phase of each run alone (:func:`update`): the :data:`UpdateFn` of a run."""
    return [update(*phase, step) for phase in zip(runs, batches, hosts, keeps, strict=True)]


def train(cfg: TrainConfig, *, stop_after: int | None = None) -> list[dict[str, float]]:
    """Run ``cfg``; returns the logged rows (rank 0; other ranks get an empty list). SIGTERM or
    Ctrl-C finishes the current step, writes a checkpoint and exits with status 143 / 130;
    ``stop_after`` returns after that many steps of this call, with a checkpoint."""
    if cfg.compile_update != "off":
        raise ValueError(
            "--compile-update on compiles an ensemble's update (python -m llm.ensemble)"
        )
    return train_together([cfg], lambda runs: update_each, stop_after=stop_after)[0]


def train_together(
    cfgs: Sequence[TrainConfig],
    make_update: Callable[[list[Run]], UpdateFn],
    *,
    stop_after: int | None = None,
    rollout_fn: RolloutFn | None = None,
) -> list[list[dict[str, float]]]:
    """Set up the runs ``cfgs`` and train them in step through :func:`loop`, whose update phase
    is ``make_update(runs)`` (:func:`train`: one run, :func:`update_each`; :mod:`llm.ensemble`:
    K runs, batched) and rollout phase ``rollout_fn`` (default :func:`rollout_each`); closes what
    setup opened (a vLLM engine, the reporters) at the end."""
    closers: list[Any] = []  # run last: a vLLM engine's shutdown ends the process group
    try:
        with stop_on_signals() as stop:
            runs = [setup(cfg, closers) for cfg in cfgs]
            return loop(runs, make_update(runs), stop, stop_after, rollout_fn or rollout_each)
    finally:
        for close in reversed(closers):
            close()


def loop(
    runs: list[Run],
    update_fn: UpdateFn,
    stop: StopRequest,
    stop_after: int | None,
    rollout_fn: RolloutFn = rollout_each,
) -> list[list[dict[str, float]]]:
    """The steps of one run, or of K runs in step (:mod:`llm.ensemble`), from their common start:
    evaluation before the first step, then per step 1. rollout, 2. score, 3. ``update_fn`` (with
    the entropy-law probe around it), 4. log and evaluate (each run's row in its
    ``metrics.jsonl``), checkpoint or stop (:func:`end_step`); the models saved at the end.
    Returns each run's rows of this call (rank 0; other ranks get empty lists)."""
    from tqdm import tqdm

    first, info = runs[0], runs[0].info
    start, steps = first.start, first.cfg.steps
    reporters = [open_reporter(run) for run in runs]
    rows: list[list[dict[str, float]]] = [[] for _ in runs]
    for run, reporter, out in zip(runs, reporters, rows, strict=True):  # the models before training
        if run.cfg.eval_every and start == 0 and run.source.eval_prompts:
            out.append({"step": 0, **evaluate(run, 0)})
            reporter.log(out[-1])
    bar = tqdm(
        range(start, steps),
        disable=not (first.cfg.progress and info.main),
        initial=start,
        total=steps,
        desc="/".join(dict.fromkeys(run.cfg.objective for run in runs)),
    )
    for step in bar:
        t0 = time.perf_counter()
        hosts = rollout_fn(runs, step)  # 1. rollout
        scored = [score(run, host) for run, host in zip(runs, hosts, strict=True)]  # 2. advantages
        batches = [batch for batch, _ in scored]
        probes = [  # mechanism check (a): each run's logits before the step's updates
            entropy_law_probe(run, batch, host) if run.cfg.entropy_law else None
            for run, batch, host in zip(runs, batches, hosts, strict=True)
        ]
        metrics = update_fn(runs, batches, hosts, [keep for _, keep in scored], step)  # 3.
        for run, probe, m in zip(runs, probes, metrics, strict=True):
            if probe is not None:  # the logits after every one of the step's updates
                m.add_means(entropy_law_columns(run, *probe))
        for run, reporter, out, batch, m in zip(
            runs, reporters, rows, batches, metrics, strict=True
        ):
            out.append(log_step(run, step, batch, m, t0))  # 4. log, evaluate, checkpoint
            reporter.log(out[-1])
        bar.set_postfix(
            reward=f"{np.mean([out[-1]['reward'] for out in rows]):.3f}",
            clip_hi=f"{np.mean([out[-1].get('clip_high_frac', 0) for out in rows]):.3f}",
        )
        if end_step(runs, step + 1, stop, stop_after):
            return rows if info.main else [[] for _ in runs]
    finish(runs)
    return rows if info.main else [[] for _ in runs]


def open_reporter(run: Run) -> Reporter:
    """The run's :class:`llm.report.Reporter` (``metrics.jsonl``, TensorBoard / W&B), closed with
    the run's other resources."""
    cfg = run.cfg
    reporter = Reporter(
        cfg.out,
        cfg.report_to,
        as_json(cfg),
        main=run.info.main,
        resumed_step=run.start,
        wandb_project=cfg.wandb_project,
    )
    run.closers.append(reporter.close)
    return reporter


def end_step(runs: list[Run], done: int, stop: StopRequest, stop_after: int | None) -> bool:
    """After step ``done``: every run's checkpoint where one is due (``--checkpoint-every``, the
    last step, a pause after ``stop_after`` steps of this call, a signal); on a signal (on any
    rank) exit with 128 + signum. Returns whether the loop pauses here."""
    first = runs[0]
    flag = torch.tensor(float(stop.signum or 0), device=first.device)
    signalled = int(dist.all_reduce(flag, "max").item())
    steps = first.cfg.steps
    paused = stop_after is not None and done - first.start >= stop_after and done < steps
    for run in runs:
        every = run.cfg.checkpoint_every
        if signalled or paused or done == steps or (every and done % every == 0):
            save_checkpoint(run, done)
    if signalled:
        name = signal.Signals(signalled).name
        written = "checkpoint" if len(runs) == 1 else "checkpoints"
        outs = ", ".join(run.cfg.out for run in runs)
        print(f"{name}: {written} written at step {done} to {outs}", file=sys.stderr)
        raise SystemExit(128 + signalled)
    return paused


def finish(runs: list[Run]) -> None:
    """After the last step: each run's model saved (``--save-model``), and its closing line
    (not with ``--no-progress``: a study's runs, ``llm.runs``, print none)."""
    for run in runs:
        if run.cfg.save_model:
            save_model(run)
    dist.barrier()
    for run in runs:
        cfg = run.cfg
        if run.info.main and cfg.progress:
            saved = (
                ", checkpoint.pt, model/" if cfg.save_model else ", no weights (--no-save-model)"
            )
            print(
                f"done: {cfg.steps} steps; {cfg.out}/metrics.jsonl, config.json{saved}",
                file=sys.stderr,
            )


#: How ``python -m llm.train`` (and ``llm.ensemble``) resume: the same command plus ``--resume``
#: (a study that runs llm.train resumes by being run again: its own line says so).
RESUME = "run the same command again with --resume to resume"


def signalled_exit(exc: SystemExit, out: str) -> None:
    """After the loop's exit on a signal (status 128 + signum): the command's resume line."""
    from sandbox.experiments.planner import interrupted_line

    if isinstance(exc.code, int) and 128 < exc.code < 128 + signal.NSIG:
        print(interrupted_line(exc.code - 128, f"checkpoint in {out}", RESUME), file=sys.stderr)


def aborted_exit(out: str, own: bool) -> None:
    """After a second Ctrl-C (the first asked for a stop after the step; this one aborts at
    once): one line instead of a traceback, exit 130. The step in progress is lost; the last
    checkpoint written (a write cut by this Ctrl-C leaves the one before it) resumes the run.
    ``own``: the command line is the process's own, so a third Ctrl-C is ignored while it exits."""
    from sandbox.experiments.planner import interrupted_line
    from sandbox.experiments.pool import answer_interrupt, own_command

    saved = os.path.exists(checkpoint.path_in(out))
    kept = f"aborted; {'the last' if saved else 'no'} checkpoint in {out}"
    with own_command(own):
        answer_interrupt(interrupted_line(signal.SIGINT, kept, RESUME))
    raise SystemExit(128 + signal.SIGINT)


def main(argv: list[str] | None = None) -> None:
    cfg = None
    try:
        cfg = parse_args(argv)
        train(cfg)
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except SystemExit as exc:  # argparse's (no cfg yet), or the loop's on a signal
        if cfg is not None:
            signalled_exit(exc, cfg.out)
        raise
    except KeyboardInterrupt:  # a second Ctrl-C: abort now
        if cfg is None:
            raise
        aborted_exit(cfg.out, own=argv is None)
    finally:
        dist.shutdown()


if __name__ == "__main__":
    main()
