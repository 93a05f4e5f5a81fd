"""GRPO-style RL on a causal LM with any sandbox objective: one driver from one CPU to many GPUs.

Read top to bottom: config -> setup -> for each step: prompts -> G completions each (Hugging Face
``generate``, or a colocated vLLM engine with ``--rollout-backend vllm``: :mod:`llm.vllm_rollout`)
-> verifier rewards -> :mod:`sandbox.advantages` -> old (and reference) log-probs ->
mu epochs x minibatches x gradient accumulation -> objective from :mod:`sandbox.objectives` ->
:func:`sandbox.aggregate.aggregate` with the minibatch's *global* token / sequence counts ->
backward -> grad-norm clipping -> optimizer step -> one JSON line in ``OUT/metrics.jsonl``.
This module defines no loss: the per-token loss is the objective's, the reduction is
``aggregate``'s and the KL is :func:`sandbox.kl.kl_divergence`'s. With ``--rollout-is`` each
micro-batch's per-token loss is multiplied by :func:`sandbox.correction.rollout_is_weights`
(pi_old over the sampler's own log-probs, from ``generate`` or vLLM, truncated or masked) before
``aggregate``, as verl's ``rollout_is_weights`` and TRL's vLLM importance sampling do.

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
loss                sum of the minibatch losses, mean over optimizer steps
grad_norm           gradient norm before clipping, mean over optimizer steps
lr                  learning rate of the step
tokens_per_s        completion tokens generated (all ranks) per second of the step
step_time           seconds for the step (rollout + update + logging)
eval_pass@1, @k     on held-out prompts every --eval-every steps and before the first step
                    (a row with step 0; k samples per prompt)
=================== ===========================================================================

Token-weighted metrics are averaged over micro-batches and ranks with their valid-token counts.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import json
import math
import os
import signal
import sys
import time
import types
import typing
import warnings
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch

import sandbox.objectives as registry
from llm import checkpoint, dist, rollout
from llm import model as models
from llm.data import VERIFIERS, make_source
from llm.vllm_rollout import VLLMRollout
from sandbox.advantages import ADVANTAGE_METHODS, compute_advantages, zero_variance_groups
from sandbox.aggregate import AGGREGATION_MODES, aggregate
from sandbox.correction import IS_LEVELS, IS_MODES, rollout_is_weights
from sandbox.kl import kl_divergence


def objective_choices() -> list[str]:
    """Every name ``--objective`` accepts: the registry's objectives, then its presets."""
    return registry.available_objectives() + registry.available_presets()


@dataclass
class TrainConfig:
    """Every setting of a run; ``python -m llm.train --help`` is generated from these fields."""

    # -- what to train on -----------------------------------------------------------------------
    model: str = field(
        default="tiny", metadata={"help": "HF model id, local dir, or 'tiny' (built in code)"}
    )
    task: str | None = field(
        default=None, metadata={"help": "envs.reasoning task (default mod_arith)"}
    )
    task_knobs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "task knobs, key=value ..."}
    )
    data: str | None = field(
        default=None, metadata={"help": "JSONL/parquet file with 'prompt' and 'answer'"}
    )
    eval_data: str | None = field(
        default=None, metadata={"help": "held-out file (default: held out of --data)"}
    )
    verifier: str = field(default="auto", metadata={"help": "reward rule", "choices": VERIFIERS})
    # -- objective --------------------------------------------------------------------------------
    objective: str = field(default="dapo", metadata={"help": "sandbox objective or preset name"})
    objective_params: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "objective hyperparameters, key=value ..."}
    )
    aggregation: str | None = field(
        default=None,
        metadata={"help": "override the objective's aggregation", "choices": AGGREGATION_MODES},
    )
    advantage: str = field(
        default="grpo",
        metadata={"help": "sandbox.advantages method", "choices": tuple(ADVANTAGE_METHODS)},
    )
    kl_coef: float = field(
        default=0.0, metadata={"help": "k3 KL to the initial model (0: no reference model)"}
    )
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus (0: off)"})
    drop_zero_variance: bool = field(
        default=False, metadata={"help": "drop groups with equal rewards (DAPO dynamic sampling)"}
    )
    mask_truncated: bool = field(
        default=False,
        metadata={"help": "no loss on completions without EOS (DAPO overlong filter)"},
    )
    rollout_is: str = field(
        default="none",
        metadata={
            "help": "rollout/trainer mismatch weight pi_old/pi_rollout (the sampler's log-probs)",
            "choices": ("none", *IS_MODES),
        },
    )
    rollout_is_level: str = field(
        default="token",
        metadata={"help": "ratio per token or per sequence (product)", "choices": IS_LEVELS},
    )
    rollout_is_min: float = field(
        default=0.0, metadata={"help": "lower bound C_min of the ratio (0: none)"}
    )
    rollout_is_max: float = field(default=2.0, metadata={"help": "upper bound C_max of the ratio"})
    # -- batch shape ------------------------------------------------------------------------------
    steps: int = field(default=100, metadata={"help": "rollout + update steps"})
    prompts_per_step: int = field(
        default=8, metadata={"help": "prompts per step, all ranks together"}
    )
    group_size: int = field(default=8, metadata={"help": "G: completions per prompt"})
    epochs: int = field(default=1, metadata={"help": "mu: passes over each rollout"})
    minibatches: int = field(default=1, metadata={"help": "optimizer steps per epoch"})
    grad_accum: int = field(
        default=1, metadata={"help": "micro-batches per rank per optimizer step"}
    )
    max_new_tokens: int = field(
        default=32, metadata={"help": "completion budget (also Dr. GRPO's L)"}
    )
    max_prompt_len: int | None = field(
        default=None,
        metadata={"help": "longest prompt allowed (default: context - max_new_tokens)"},
    )
    temperature: float = field(
        default=1.0, metadata={"help": "sampling temperature (log-probs use the same)"}
    )
    prompts_per_call: int = field(
        default=1,
        metadata={"help": "prompts per generate call (1: same samples at any world size)"},
    )
    rollout_backend: str = field(
        default="hf",
        metadata={
            "help": "who samples: Hugging Face generate, or a colocated vLLM engine",
            "choices": ("hf", "vllm"),
        },
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "vLLM: share of GPU memory for its weights and KV cache"}
    )
    vllm_sleep: bool = field(
        default=False, metadata={"help": "vLLM: release its memory between rollouts (CUDA)"}
    )
    vllm_enforce_eager: bool = field(
        default=False, metadata={"help": "vLLM: no CUDA graphs (faster start, slower decode)"}
    )
    chat_template: str = field(
        default="auto",
        metadata={"help": "use the tokenizer's chat template", "choices": ("auto", "on", "off")},
    )
    system_prompt: str | None = field(
        default=None, metadata={"help": "system message with the chat template"}
    )
    # -- optimisation -----------------------------------------------------------------------------
    lr: float = field(default=1e-6, metadata={"help": "AdamW learning rate"})
    lr_schedule: str = field(
        default="constant",
        metadata={
            "help": "per-step LR schedule after warmup",
            "choices": ("constant", "linear", "cosine"),
        },
    )
    warmup_steps: int = field(default=0, metadata={"help": "linear warmup steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clipping"})
    lora_r: int = field(
        default=0, metadata={"help": "LoRA rank through peft (0: full fine-tuning)"}
    )
    lora_alpha: float = field(default=32.0, metadata={"help": "LoRA alpha"})
    lora_target: str = field(default="all-linear", metadata={"help": "peft target_modules"})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward"}
    )
    bf16: bool = field(default=True, metadata={"help": "bf16 autocast on CUDA (ignored on CPU)"})
    dtype: str = field(
        default="float32", metadata={"help": "parameter dtype", "choices": ("float32", "bfloat16")}
    )
    # -- model loading ----------------------------------------------------------------------------
    pad_token: str | None = field(
        default=None, metadata={"help": "pad token for tokenizers without one"}
    )
    offline: bool = field(
        default=False, metadata={"help": "local_files_only (also with HF_HUB_OFFLINE=1)"}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "allow model code from the Hub"}
    )
    # -- evaluation, logging, checkpoints ---------------------------------------------------------
    eval_every: int = field(default=0, metadata={"help": "evaluate every N steps (0: never)"})
    eval_prompts: int = field(default=16, metadata={"help": "held-out prompts per evaluation"})
    eval_k: int = field(default=4, metadata={"help": "samples per eval prompt (pass@1 and pass@k)"})
    out: str = field(default="runs/llm", metadata={"help": "output directory"})
    checkpoint_every: int = field(
        default=0, metadata={"help": "checkpoint every N steps (always at the end)"}
    )
    resume: bool = field(default=False, metadata={"help": "continue from OUT/checkpoint.pt"})
    allow_config_change: bool = field(
        default=False,
        metadata={"help": "with --resume: accept settings that differ from the checkpoint's"},
    )
    save_model: bool = field(
        default=True, metadata={"help": "save_pretrained the final model to OUT/model"}
    )
    report_to: list[str] = field(
        default_factory=list, metadata={"help": "tensorboard and/or wandb"}
    )
    wandb_project: str = field(default="clip-sandbox", metadata={"help": "W&B project"})
    progress: bool = field(default=True, metadata={"help": "progress bar"})
    # -- where and how it runs --------------------------------------------------------------------
    seed: int = field(default=0, metadata={"help": "seed of the model (tiny), prompts, sampling"})
    device: str = field(default="auto", metadata={"help": "auto (cuda if available) | cpu | cuda"})
    backend: str = field(
        default="auto", metadata={"help": "torch.distributed backend (auto: nccl/gloo)"}
    )
    fsdp: bool = field(default=False, metadata={"help": "FSDP2 instead of DDP under torchrun"})

    def validate(self, world: int = 1) -> None:
        """Cheap checks, before anything is loaded; ``ValueError`` naming the field."""
        if self.objective not in objective_choices():
            raise ValueError(
                f"unknown --objective {self.objective!r}; objectives: "
                f"{', '.join(registry.available_objectives())}; presets: "
                f"{', '.join(registry.available_presets())}"
            )
        try:
            registry.get_objective(self.objective, **self.objective_params)
        except ValueError as exc:
            raise ValueError(f"--objective {self.objective} --objective-params: {exc}") from None
        for name in ("steps", "prompts_per_step", "group_size", "epochs", "minibatches",
                     "grad_accum", "max_new_tokens", "prompts_per_call", "eval_k"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}"
                )
        for name in ("lr", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}"
                )
        for name in ("kl_coef", "entropy_coef", "weight_decay", "lora_r", "warmup_steps",
                     "eval_every", "checkpoint_every", "eval_prompts"):  # fmt: skip
            if not getattr(self, name) >= 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if not 0 <= self.rollout_is_min <= self.rollout_is_max or not self.rollout_is_max > 0:
            raise ValueError(
                f"--rollout-is-min {self.rollout_is_min} and --rollout-is-max "
                f"{self.rollout_is_max} need 0 <= min <= max and max > 0"
            )
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(
                "--vllm-gpu-memory-utilization must be in (0, 1], got "
                f"{self.vllm_gpu_memory_utilization}"
            )
        if self.rollout_backend == "vllm" and self.fsdp and self.lora_r > 0:
            raise ValueError("--rollout-backend vllm does not support --fsdp with --lora-r > 0")
        if self.advantage in ("grpo", "rloo") and self.group_size < 2:
            raise ValueError(f"--group-size must be >= 2 for --advantage {self.advantage}")
        if self.prompts_per_step % world:
            raise ValueError(
                f"--prompts-per-step {self.prompts_per_step} must be divisible by the {world} processes"
            )
        for name in self.report_to:
            if name not in ("tensorboard", "wandb"):
                raise ValueError(f"--report-to accepts tensorboard and wandb, got {name!r}")
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value is not None and value not in choices:
                raise ValueError(
                    f"--{f.name.replace('_', '-')} must be one of {list(choices)}, got {value!r}"
                )


# --------------------------------------------------------------------------------------------------
# The CLI, generated from the dataclass
# --------------------------------------------------------------------------------------------------


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def _key_values(items: list[str], flag: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} takes key=value pairs, got {item!r}")
        out[key.replace("-", "_")] = _literal(value)
    return out


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(
        prog="python -m llm.train", description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        flag, kind = "--" + f.name.replace("_", "-"), hints[f.name]
        help_ = f.metadata.get("help", "")
        if f.name == "objective":
            help_ += f" ({', '.join(objective_choices())})"
        default = f.default_factory() if callable(f.default_factory) else f.default
        if kind is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=help_
            )
        elif typing.get_origin(kind) in (dict, list):
            parser.add_argument(flag, nargs="*", default=default, help=help_)
        else:
            base = (
                next(a for a in typing.get_args(kind) if a is not type(None))
                if isinstance(kind, types.UnionType)
                else kind
            )
            choices = f.metadata.get("choices")
            parser.add_argument(flag, type=base, default=default, choices=choices, help=help_)
    ns = vars(parser.parse_args(argv))
    for name in ("task_knobs", "objective_params"):
        if isinstance(ns[name], list):
            ns[name] = _key_values(ns[name], "--" + name.replace("_", "-"))
    return TrainConfig(**ns)


# --------------------------------------------------------------------------------------------------
# Small pieces of the loop
# --------------------------------------------------------------------------------------------------


def lr_factor(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    if cfg.lr_schedule == "linear":
        return max(0.0, 1.0 - progress)
    if cfg.lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return 1.0


def gather_rollout(local: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """Concatenate every rank's rollout in rank order (prompts left-, completions right-padded)."""
    parts = dist.all_gather_object({k: v.cpu() for k, v in local.items()})
    Tp = max(p["prompt"].shape[1] for p in parts)
    Tc = max(p["completion"].shape[1] for p in parts)
    out = {}
    for key in parts[0]:
        rows = [p[key] for p in parts]
        if key in ("prompt", "prompt_mask"):
            value = pad_id if key == "prompt" else 0
            rows = [rollout.pad_left(r, Tp, value) for r in rows]
        elif rows[0].dim() == 2:
            value = pad_id if key == "completion" else 0
            rows = [rollout.pad_right(r, Tc, value) for r in rows]
        out[key] = torch.cat(rows)
    return out


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over valid tokens, for metrics (detached)."""
    x = torch.where(mask.bool(), x.detach(), 0.0)
    return x.sum() / mask.sum().clamp(min=1)


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


class Reporter:
    """metrics.jsonl (rank 0), optional TensorBoard and W&B."""

    def __init__(self, cfg: TrainConfig, main: bool, resumed_step: int) -> None:
        self.main, self.writers = main, []
        self.path = os.path.join(cfg.out, "metrics.jsonl")
        if not main:
            return
        os.makedirs(cfg.out, exist_ok=True)
        kept = []
        if resumed_step and os.path.exists(self.path):  # drop lines written after the checkpoint
            with open(self.path) as f:
                kept = [line for line in f if json.loads(line)["step"] <= resumed_step]
        with open(self.path, "w") as f:
            f.writelines(kept)
        if "tensorboard" in cfg.report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.writers.append(SummaryWriter(os.path.join(cfg.out, "tensorboard")))
        if "wandb" in cfg.report_to:
            import wandb

            self.wandb = wandb.init(project=cfg.wandb_project, config=asdict(cfg), dir=cfg.out)

    def log(self, row: dict[str, float]) -> None:
        if not self.main:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for w in self.writers:
            for k, v in row.items():
                if k != "step":
                    w.add_scalar(k, v, row["step"])
        if hasattr(self, "wandb"):
            self.wandb.log(row, step=row["step"])

    def close(self) -> None:
        for w in self.writers:
            w.close()
        if hasattr(self, "wandb"):
            self.wandb.finish()


# Settings a resumed run may change: how long it runs and how it reports, not what it computes.
RESUMABLE_CHANGES = frozenset({
    "steps", "resume", "allow_config_change", "out", "checkpoint_every", "eval_every",
    "eval_prompts", "eval_k", "save_model", "report_to", "wandb_project", "progress", "device",
    "backend", "offline",
})  # fmt: skip


def check_resume_config(cfg: TrainConfig, saved: dict[str, Any]) -> None:
    """``ValueError`` naming every setting that differs from the checkpoint's (other than
    :data:`RESUMABLE_CHANGES`): a resumed run must continue the same experiment."""
    now = json.loads(json.dumps(asdict(cfg), sort_keys=True, default=str))
    changed = [
        f"--{k.replace('_', '-')} {saved.get(k)!r} -> {now[k]!r}"
        for k in sorted(now)
        if k not in RESUMABLE_CHANGES and k in saved and saved[k] != now[k]
    ]

    def held_out(c: dict[str, Any]) -> int:  # rows of --data held out of training for eval
        held = c.get("eval_data") is None and c.get("data") is not None and c.get("eval_every")
        return c.get("eval_prompts", 0) if held else 0

    if held_out(saved) != held_out(now):
        changed.append(f"rows of --data held out for eval {held_out(saved)} -> {held_out(now)} "
                       "(--eval-every/--eval-prompts without --eval-data)")  # fmt: skip
    if changed:
        raise ValueError(
            f"--resume: these settings differ from {checkpoint.path_in(cfg.out)}'s: "
            f"{'; '.join(changed)}. Resume with the same settings, pass "
            "--allow-config-change to continue anyway, or start a new --out"
        )


def check_optional(cfg: TrainConfig) -> None:
    needs = {"tensorboard": "tensorboard" in cfg.report_to, "wandb": "wandb" in cfg.report_to,
             "peft": cfg.lora_r > 0}  # fmt: skip
    for module, needed in needs.items():
        if needed:
            try:
                __import__(module)
            except ImportError:
                raise ValueError(
                    f"{module} is not installed: pip install 'clip-sandbox[llm]'"
                ) from None


# --------------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------------


def train(cfg: TrainConfig, *, stop_after: int | None = None) -> list[dict[str, float]]:
    """Run ``cfg``; returns the logged rows (rank 0; other ranks get an empty list). SIGTERM
    finishes the current step, writes a checkpoint and exits with status 143; ``stop_after``
    returns after that many steps of this call, with a checkpoint (a time-sliced job)."""
    stop = {"sigterm": False}
    try:
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(sigterm=True))
    except ValueError:  # not the main thread
        previous = None
    closers: list[Any] = []  # run last: a vLLM engine's shutdown ends the process group
    try:
        return _train(cfg, stop, stop_after, closers)
    finally:
        for close in reversed(closers):
            close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _train(
    cfg: TrainConfig, stop: dict[str, bool], stop_after: int | None, closers: list[Any]
) -> list[dict[str, float]]:
    # ---- 1. checks and setup, before any compute ----------------------------------------------
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg.validate(world)
    check_optional(cfg)
    ckpt_exists = os.path.exists(checkpoint.path_in(cfg.out))
    if ckpt_exists and not cfg.resume:
        raise ValueError(f"{checkpoint.path_in(cfg.out)} exists: pass --resume, or a new --out")
    if ckpt_exists and not cfg.allow_config_change:
        check_resume_config(cfg, checkpoint.saved_config(cfg.out))
    objective = registry.get_objective(cfg.objective, **cfg.objective_params)
    mode = cfg.aggregation or objective.aggregation
    source = make_source(cfg.task, cfg.task_knobs, cfg.data, cfg.verifier, cfg.seed,
                         cfg.eval_prompts if cfg.eval_every else 0, cfg.eval_data)  # fmt: skip
    offline = models.is_offline(cfg.offline)
    tokenizer = models.load_tokenizer(cfg.model, offline=offline, pad_token=cfg.pad_token,
                                      trust_remote_code=cfg.trust_remote_code)  # fmt: skip
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if cfg.chat_template == "on" and not has_template:
        raise ValueError(f"--chat-template on, but the tokenizer of {cfg.model!r} has none")
    chat = cfg.chat_template == "on" or (cfg.chat_template == "auto" and has_template)
    model = models.load_model(cfg.model, vocab_size=len(tokenizer), seed=cfg.seed, offline=offline,
                              dtype=getattr(torch, cfg.dtype),
                              trust_remote_code=cfg.trust_remote_code)  # fmt: skip
    context = models.context_length(model)
    max_prompt = cfg.max_prompt_len or ((context - cfg.max_new_tokens) if context else None)
    if context is not None and max_prompt + cfg.max_new_tokens > context:
        raise ValueError(f"--max-prompt-len {max_prompt} + --max-new-tokens {cfg.max_new_tokens} "
                         f"exceeds the model's context of {context} tokens")  # fmt: skip

    def encode(prompts: list[str]) -> list[list[int]]:
        ids = rollout.encode_prompts(tokenizer, prompts, chat, cfg.system_prompt)
        for p, row in zip(prompts, ids, strict=True):
            if max_prompt is not None and len(row) > max_prompt:
                raise ValueError(
                    f"a prompt has {len(row)} tokens, more than the {max_prompt} allowed "
                    f"(context {context} - --max-new-tokens {cfg.max_new_tokens}, or "
                    f"--max-prompt-len): {p[:80]!r}..."
                )
        return ids

    encode(source.probe + source.eval_prompts)
    info, device = dist.init(cfg.device, cfg.backend)
    model.to(device)
    engine = None
    if cfg.rollout_backend == "vllm":  # built from the untouched base model, before LoRA/wrapping
        if offline:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        engine = VLLMRollout(
            model, tokenizer, model_name=cfg.model, device=device,
            dtype="bfloat16" if cfg.dtype == "bfloat16" or (device.type == "cuda" and cfg.bf16)
            else "float32",
            max_model_len=max_prompt + cfg.max_new_tokens if max_prompt is not None else None,
            seed=cfg.seed, gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            sleep=cfg.vllm_sleep, enforce_eager=cfg.vllm_enforce_eager,
            trust_remote_code=cfg.trust_remote_code,
        )  # fmt: skip
        closers.append(engine.close)
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=cfg.lora_target, task_type="CAUSAL_LM")  # fmt: skip
        model = get_peft_model(model, lora)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    reference = None
    if cfg.kl_coef > 0 and cfg.lora_r == 0:  # with LoRA the reference is the adapter-free model
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    policy = dist.wrap(model, info, device, cfg.fsdp)  # the module that runs forward/backward
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(cfg, s))
    rng = np.random.default_rng([cfg.seed, 0])  # the prompt stream, the same on every rank
    start = 0
    if cfg.resume and ckpt_exists:
        start = checkpoint.load(cfg.out, policy, optimizer, scheduler, rng)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" and cfg.bf16
                else contextlib.nullcontext())  # fmt: skip
    need_old = cfg.epochs * cfg.minibatches > 1  # else on-policy: logp_old = logp.detach()
    P_local = cfg.prompts_per_step // info.world
    G, A = cfg.group_size, cfg.grad_accum
    pad_id = tokenizer.pad_token_id
    reporter = Reporter(cfg, info.main, start)
    rows_logged: list[dict[str, float]] = []

    def sample(prompt_ids: list[list[int]], k: int, keys: tuple[int, ...], first: int,
               return_logp: bool = False):  # fmt: skip
        if engine is not None:
            out = engine.generate(
                model, prompt_ids, group_size=k, max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature, seed_keys=keys, first_index=first,
                return_logp=return_logp,
            )  # fmt: skip
        else:
            model.eval()
            with autocast:
                out = rollout.generate(
                    model, tokenizer, prompt_ids, group_size=k, max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature, prompts_per_call=cfg.prompts_per_call,
                    seed_keys=keys, first_index=first, device=device,
                    synced_gpus=cfg.fsdp and info.enabled, return_logp=return_logp,
                )  # fmt: skip
        texts = tokenizer.batch_decode(out["completion"], skip_special_tokens=True)
        return out, texts

    @torch.no_grad()
    def logps(net: torch.nn.Module, batch: dict[str, torch.Tensor], chunks: int) -> torch.Tensor:
        net.eval()
        pieces = []
        for rows in torch.arange(batch["prompt"].shape[0]).tensor_split(chunks):
            sub = {
                k: v[rows].to(device)
                for k, v in batch.items()
                if k.startswith(("prompt", "completion"))
            }
            with autocast:
                lp, _ = rollout.completion_logp(net, sub["prompt"], sub["prompt_mask"], sub["completion"],
                                                sub["completion_mask"], cfg.temperature)  # fmt: skip
            pieces.append(lp.cpu())
        return torch.cat(pieces)

    def evaluate(step: int) -> dict[str, float]:
        E = len(source.eval_prompts) // info.world * info.world
        lo, hi = info.rank * E // info.world, (info.rank + 1) * E // info.world
        _, texts = sample(encode(source.eval_prompts[lo:hi]), cfg.eval_k, (cfg.seed, 3, step), lo)
        answers = [a for a in source.eval_answers[lo:hi] for _ in range(cfg.eval_k)]
        ok = torch.tensor([source.verify(a, t) >= 1.0 for a, t in zip(answers, texts, strict=True)])
        ok = ok.view(-1, cfg.eval_k).float()
        sums = dist.all_reduce(torch.stack([ok.mean(1).sum(), ok.max(1).values.sum()]).to(device))
        return {
            "eval_pass@1": sums[0].item() / max(E, 1),
            f"eval_pass@{cfg.eval_k}": sums[1].item() / max(E, 1),
        }

    # ---- 2. the loop ----------------------------------------------------------------------------
    from tqdm import tqdm

    if cfg.eval_every and start == 0 and source.eval_prompts:  # the baseline: step 0
        row0 = {"step": 0, **evaluate(0)}
        reporter.log(row0)
        if info.main:
            rows_logged.append(row0)
    bar = tqdm(range(start, cfg.steps), disable=not (cfg.progress and info.main), initial=start,
               total=cfg.steps, desc=f"{cfg.objective}")  # fmt: skip
    for step in bar:
        t0 = time.perf_counter()
        # rollout: the same prompts on every rank, each rank generates for its share
        prompts, answers = source.draw(rng, cfg.prompts_per_step)
        lo = info.rank * P_local
        local, texts = sample(encode(prompts[lo : lo + P_local]), G, (cfg.seed, 0, step), lo,
                              return_logp=cfg.rollout_is != "none")  # fmt: skip
        local_answers = [a for a in answers[lo : lo + P_local] for _ in range(G)]
        local["rewards"] = torch.tensor([float(source.verify(a, t)) for a, t in
                                         zip(local_answers, texts, strict=True)])  # fmt: skip
        chunks = min(cfg.minibatches * A, local["prompt"].shape[0])
        if need_old:
            local["logp_old"] = logps(model, local, chunks)
        if cfg.kl_coef > 0:
            if reference is None:
                with dist.unwrap(model).disable_adapter():
                    local["logp_ref"] = logps(model, local, chunks)
            else:
                local["logp_ref"] = logps(reference, local, chunks)
        host = gather_rollout(local, pad_id)  # CPU copy: shapes and row choices need no sync
        batch = {k: v.to(device) for k, v in host.items()}

        # rewards -> advantages (sandbox.advantages), optional dynamic-sampling filter
        rewards = batch["rewards"]
        batch["adv"] = compute_advantages(rewards, G, method=cfg.advantage)
        zero_var = zero_variance_groups(host["rewards"], G)
        batch["loss_mask"] = batch["completion_mask"].clone()
        if cfg.mask_truncated:
            batch["loss_mask"][batch["truncated"]] = 0
        keep = torch.arange(host["rewards"].numel())
        if cfg.drop_zero_variance:
            keep = keep[~zero_var.repeat_interleave(G)]

        # update: mu epochs x minibatches x (world x grad_accum) micro-batches
        policy.train()
        sums: dict[str, torch.Tensor] = {}  # token-weighted metric sums ("_tokens": the weights)
        extremes: dict[str, torch.Tensor] = {}  # *_max and -(*_min)
        loss_sum = torch.zeros((), device=device)
        grad_norms = []
        for epoch in range(cfg.epochs if keep.numel() else 0):
            perm_gen = torch.Generator().manual_seed(rollout.derive_seed(cfg.seed, 1, step, epoch))
            perm = keep[torch.randperm(keep.numel(), generator=perm_gen)]
            for mb, mb_rows in enumerate(perm.tensor_split(cfg.minibatches)):
                if mb_rows.numel() == 0:
                    continue
                mb_mask = batch["loss_mask"][mb_rows.to(device)]
                counts = {  # global counts of the whole minibatch: micro-batching keeps the gradient
                    "num_tokens": mb_mask.sum().float(),
                    "num_seqs": (mb_mask.sum(-1) > 0).sum().float(),
                    "max_len": cfg.max_new_tokens,
                }
                pieces = mb_rows.tensor_split(info.world * A)
                for a in range(A):
                    piece = a * info.world + info.rank
                    empty = pieces[piece].numel() == 0  # still run: every rank must backward
                    sub = trim(batch, host, mb_rows[:1] if empty else pieces[piece], device)
                    mask = sub["loss_mask"] * (0 if empty else 1)
                    sync = a == A - 1
                    no_sync = info.enabled and not cfg.fsdp and not sync
                    if info.enabled and cfg.fsdp:
                        policy.set_requires_gradient_sync(sync)
                    with policy.no_sync() if no_sync else contextlib.nullcontext():
                        with autocast:
                            logp, ent = rollout.completion_logp(
                                policy, sub["prompt"], sub["prompt_mask"], sub["completion"],
                                sub["completion_mask"], cfg.temperature,
                                entropy="grad" if cfg.entropy_coef > 0 else "metric",
                            )  # fmt: skip
                        logp_old = sub["logp_old"] if need_old else logp.detach()
                        gen = None
                        if objective.stochastic:  # stateless: the same draws at any world size
                            gen = torch.Generator(device).manual_seed(
                                rollout.derive_seed(cfg.seed, 2, step, epoch, mb, piece)
                            )
                        out = objective(logp, logp_old, sub["adv"][:, None], mask, generator=gen,
                                        validate=False)  # fmt: skip
                        metrics = dict(out.metrics)
                        per_token = out.loss
                        if cfg.rollout_is != "none":  # sg(rho), rho = pi_old / pi_rollout
                            w, is_metrics = rollout_is_weights(
                                logp_old, sub["rollout_logp"], mask, mode=cfg.rollout_is,
                                level=cfg.rollout_is_level, cmin=cfg.rollout_is_min,
                                cmax=cfg.rollout_is_max,
                            )  # fmt: skip
                            per_token = per_token * w
                            metrics.update(is_metrics)
                        loss = aggregate(per_token, mask, mode, **counts)
                        if "logp_ref" in sub:
                            kl = kl_divergence(logp, sub["logp_ref"], "k3")
                            loss = loss + cfg.kl_coef * aggregate(kl, mask, mode, **counts)
                            metrics["kl_ref_k3"] = masked_mean(kl, mask)
                        if cfg.entropy_coef > 0:
                            loss = loss - cfg.entropy_coef * aggregate(ent, mask, mode, **counts)
                        metrics["entropy"] = masked_mean(ent, mask)
                        (loss * info.world).backward()  # DDP/FSDP average over ranks; we sum
                    loss_sum += loss.detach()
                    weight = mask.sum().float()
                    sums["_tokens"] = sums.get("_tokens", 0.0) + weight
                    for k, v in metrics.items():
                        v = v.detach().float()
                        if k.endswith(("_max", "_min")):
                            v = v if k.endswith("_max") else -v
                            if empty:  # no token: neutral for the max (keys stay rank-uniform)
                                v = torch.full_like(v, -math.inf)
                            extremes[k] = torch.maximum(extremes[k], v) if k in extremes else v
                        else:
                            sums[k] = sums.get(k, 0.0) + v * weight
                norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                grad_norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if engine is not None:
                    engine.mark_stale()
        lr = scheduler.get_last_lr()[0]
        with warnings.catch_warnings():  # a step whose groups were all dropped has no update
            warnings.simplefilter("ignore", UserWarning)
            scheduler.step()

        # log: one all-reduce of the sums, one of the extremes, one host read each
        sums["_loss"] = loss_sum
        keys, ext_keys = sorted(sums), sorted(extremes)
        totals = dist.all_reduce(
            torch.stack([torch.as_tensor(sums[k], device=device) for k in keys])
        )
        totals = dict(zip(keys, totals.tolist(), strict=True))
        n_tokens = max(totals.pop("_tokens", 0.0), 1.0)
        updates = max(len(grad_norms), 1)
        cmask = batch["completion_mask"].float()
        stats = torch.stack([
            rewards.mean(), (rewards >= 1).float().mean(),
            rewards.std() if rewards.numel() > 1 else torch.zeros((), device=device),
            cmask.sum(-1).mean(), batch["truncated"].float().mean(),
            torch.stack(grad_norms).mean() if grad_norms else torch.zeros((), device=device),
        ]).tolist()  # fmt: skip
        names = (
            "reward",
            "pass_rate",
            "reward_std",
            "completion_len",
            "truncated_frac",
            "grad_norm",
        )
        values = dict(zip(names, stats, strict=True))
        values["zero_var_frac"] = zero_var.float().mean().item()
        values["loss"] = totals.pop("_loss") / updates
        values.update({k: t / n_tokens for k, t in totals.items()})
        if ext_keys:
            ext = dist.all_reduce(torch.stack([extremes[k] for k in ext_keys]), "max").tolist()
            values.update(
                {k: v if k.endswith("_max") else -v for k, v in zip(ext_keys, ext, strict=True)}
            )
        row = {"step": step + 1, **values, "lr": lr}
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and source.eval_prompts:
            row.update(evaluate(step + 1))
        dt = time.perf_counter() - t0
        row["tokens_per_s"] = float(cmask.sum().item()) / dt
        row["step_time"] = dt
        if not math.isfinite(row["grad_norm"]) or not math.isfinite(row["loss"]):
            raise FloatingPointError(f"non-finite loss or gradient norm at step {step + 1}: {row}")
        reporter.log(row)
        if info.main:
            rows_logged.append(row)
        bar.set_postfix(
            reward=f"{row['reward']:.3f}", clip_hi=f"{row.get('clip_high_frac', 0):.3f}"
        )

        # checkpoints: every N steps, at the end, and on SIGTERM (agreed by all ranks)
        done = step + 1
        flag = (
            dist.all_reduce(torch.tensor(float(stop["sigterm"]), device=device), "max").item() > 0
        )
        paused = stop_after is not None and done - start >= stop_after and done < cfg.steps
        periodic = cfg.checkpoint_every and done % cfg.checkpoint_every == 0
        if flag or paused or done == cfg.steps or periodic:
            checkpoint.save(cfg.out, policy, optimizer, scheduler, step=done, rng=rng,
                            config=asdict(cfg), main=info.main)  # fmt: skip
        if flag:
            reporter.close()
            print(f"SIGTERM: checkpoint written at step {done} to {cfg.out}", file=sys.stderr)
            if engine is not None:
                engine.close()
            dist.shutdown()
            raise SystemExit(143)
        if paused:
            reporter.close()
            return rows_logged

    # ---- 3. the trained model in Hugging Face format --------------------------------------------
    if cfg.save_model:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(
            policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if info.main:
            dist.unwrap(model).save_pretrained(os.path.join(cfg.out, "model"), state_dict=state)
            tokenizer.save_pretrained(os.path.join(cfg.out, "model"))
    reporter.close()
    dist.barrier()
    return rows_logged


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = parse_args(argv)
        train(cfg)
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        dist.shutdown()


if __name__ == "__main__":
    main()
