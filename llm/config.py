"""Every setting of an :mod:`llm.train` run, one line each, and the checks made before any compute.

``python -m llm.train --help`` is generated from :class:`TrainConfig` (:mod:`sandbox.configs`);
``--config run.yaml`` (or ``.toml``) sets the same fields by name and flags override the file.
Every run writes the settings it ran with to ``OUT/config.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

import sandbox.objectives as registry
from envs.reasoning import make_task
from llm import checkpoint
from llm.data import VERIFIERS
from sandbox.advantages import ADVANTAGE_METHODS
from sandbox.aggregate import AGGREGATION_MODES
from sandbox.configs import arg, built_objective, check_group_size, flag
from sandbox.correction import IS_LEVELS
from sandbox.grad_noise import check_halves
from sandbox.loss import ROLLOUT_IS_CHOICES
from sandbox.masks import check_off_policy_mask, check_top_entropy_quantile

CACHES = ("auto", "dynamic", "static")
AUTO_ON_OFF = ("auto", "on", "off")
HEADS = ("chunked", "trl")


def objective_choices() -> list[str]:
    """Every name ``--objective`` accepts: the registry's objectives, then its presets."""
    return registry.available_objectives() + registry.available_presets()


@dataclass
class TrainConfig:
    """Every setting of a run; ``python -m llm.train --help`` is generated from these fields."""

    # -- what to train on ---------------------------------------------------------------------------
    model: str = arg("tiny", "a Hugging Face model id, a local directory, or a built-in name")
    task: str | None = arg(None, "envs.reasoning task (default: mod_arith unless --data)")
    task_knobs: dict[str, Any] = arg({}, "task knobs, key=value ...")
    data: str | None = arg(None, "JSONL/parquet file with 'prompt' and 'answer' columns")
    eval_data: str | None = arg(None, "held-out file (default: rows held out of --data)")
    split: bool = arg(
        False,
        "with --task: train on its train partition and evaluate on its test partition "
        "(envs.reasoning.problem_split: disjoint by construction); off: held-out problems are an "
        "independent draw from every problem, so a small task repeats training problems",
    )
    verifier: str = arg("auto", "reward rule", choices=VERIFIERS)
    # -- the loss (sandbox.loss.PolicyLoss) -------------------------------------------------------
    objective: str = arg("dapo", "sandbox objective or preset")
    objective_params: dict[str, Any] = arg({}, "objective hyperparameters, key=value ...")
    aggregation: str | None = arg(None, "override the objective's own", choices=AGGREGATION_MODES)
    advantage: str = arg("grpo", "sandbox.advantages method", choices=tuple(ADVANTAGE_METHODS))
    kl_coef: float = arg(0.0, "k3 KL to the initial model (0: no reference model)")
    entropy_coef: float = arg(0.0, "entropy bonus (0: off)")
    drop_zero_variance: bool = arg(False, "drop groups with equal rewards (DAPO dynamic sampling)")
    mask_truncated: bool = arg(False, "no loss on completions without EOS (DAPO overlong filter)")
    rollout_is: str = arg("none", "weight pi_old/pi_rollout", choices=ROLLOUT_IS_CHOICES)
    rollout_is_level: str = arg("token", "that ratio per token or per sequence", choices=IS_LEVELS)
    rollout_is_min: float = arg(0.0, "lower bound C_min of the ratio (0: none)")
    rollout_is_max: float = arg(2.0, "upper bound C_max of the ratio")
    off_policy_mask: float | None = arg(None, "drop A < 0 sequences with mean KL > THRESHOLD")
    top_entropy_quantile: float = arg(1.0, "keep the top-q share of tokens by entropy (1: off)")
    # -- mechanism checks (opt-in, one process; training is bit-identical with them on) ----------
    entropy_law: bool = arg(
        False,
        "log the entropy change of each step over its first --entropy-law-rows completions "
        "(entropy_change) and the entropy-covariance law's prediction (entropy_change_pred)",
    )
    entropy_law_rows: int = arg(8, "completions the entropy-law probe holds full logits of")
    grad_mass: bool = arg(
        False,
        "log the shares of the advantage-weighted gradient mass the rule zeroes and rescues "
        "(grad_mass_zero_lo, grad_mass_zero_hi, grad_mass_rescued; sandbox.loss.grad_mass_shares)",
    )
    grad_noise: bool = arg(
        False,
        "log the rule's gradient noise against its deterministic counterpart's (NSR -> "
        "NSR-decay) per update: grad_rescue_var, grad_sampling_var, grad_signal",
    )
    # -- batch shape ------------------------------------------------------------------------------
    steps: int = arg(100, "rollout + update steps")
    prompts_per_step: int = arg(8, "prompts per step, all ranks together")
    group_size: int = arg(8, "G: completions per prompt")
    epochs: int = arg(1, "mu: passes over each rollout")
    minibatches: int = arg(1, "optimizer steps per epoch (must divide the step's completions)")
    grad_accum: int = arg(1, "micro-batches per rank per optimizer step")
    max_new_tokens: int = arg(32, "completion budget (also Dr. GRPO's L)")
    max_prompt_len: int | None = arg(None, "longest prompt (default: context - max_new_tokens)")
    temperature: float = arg(1.0, "sampling temperature (log-probs use the same)")
    prompts_per_call: int | None = arg(None, "prompts per generate (default: all; 1: see README)")
    logp_chunk: int | None = arg(None, "tokens per LM-head chunk (default: 2^25 logits' worth)")
    rollout_backend: str = arg(
        "hf",
        "HF generate, colocated vLLM, or llm.decode's compact decoder (K ensemble members in one "
        "loop; Gumbel-max from noise fixed per seed, step, row and position)",
        choices=("hf", "vllm", "compact"),
    )
    old_logp: str = arg(
        "recompute",
        "pi_old when mu > 1: a no-grad forward after sampling (recompute), or the sampler's own "
        "log-probs (sampler: hf and compact backends; one forward less per step)",
        choices=("recompute", "sampler"),
    )
    vllm_gpu_memory_utilization: float = arg(0.3, "vLLM: GPU memory share (weights + KV cache)")
    vllm_sleep: bool = arg(False, "vLLM: release its memory between rollouts (CUDA)")
    vllm_enforce_eager: bool = arg(False, "vLLM: no CUDA graphs (faster start, slower decode)")
    generate_cache: str = arg(
        "auto", "generate's KV cache (auto: dynamic until a GPU measures static)", choices=CACHES
    )
    generate_compile: str = arg(
        "auto", "compile decoding (auto: off; on needs a static cache)", choices=AUTO_ON_OFF
    )
    compile_update: str = arg(
        "off",
        "compile the ensemble's training forward + loss per micro-batch (llm.ensemble only)",
        choices=("off", "on"),
    )
    lm_head: str = arg(
        "chunked", "log-prob head: torch chunks or TRL's fused kernel", choices=HEADS
    )
    chat_template: str = arg("auto", "the tokenizer's chat template", choices=("auto", "on", "off"))
    system_prompt: str | None = arg(None, "system message with the chat template")
    # -- optimisation -----------------------------------------------------------------------------
    lr: float = arg(1e-6, "AdamW learning rate")
    lr_schedule: str = arg("constant", "after warmup", choices=("constant", "linear", "cosine"))
    warmup_steps: int = arg(0, "linear warmup steps")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    max_grad_norm: float = arg(1.0, "gradient-norm clipping")
    lora_r: int = arg(0, "LoRA rank through peft (0: full fine-tuning)")
    lora_alpha: float = arg(32.0, "LoRA alpha")
    lora_target: str = arg("all-linear", "peft target_modules")
    gradient_checkpointing: bool = arg(True, "recompute activations in backward (TRL's default)")
    bf16: bool = arg(True, "bf16 autocast on CUDA (on CPU see --cpu-bf16)")
    cpu_bf16: bool = arg(
        False, "bf16 autocast on CPU (needs avx512_bf16 or amx_bf16; off: float32, bit-identical)"
    )
    dtype: str = arg("float32", "parameter dtype", choices=("float32", "bfloat16"))
    # -- model loading ----------------------------------------------------------------------------
    pad_token: str | None = arg(None, "pad token for tokenizers without one")
    offline: bool = arg(False, "local_files_only (also with HF_HUB_OFFLINE=1)")
    trust_remote_code: bool = arg(False, "allow model code from the Hub")
    # -- evaluation, logging, checkpoints ---------------------------------------------------------
    eval_every: int = arg(0, "evaluate at step 0 and every N steps (0: never)")
    eval_prompts: int = arg(16, "held-out prompts per evaluation")
    eval_k: int = arg(4, "samples per eval prompt (pass@1 and pass@k)")
    out: str = arg("runs/llm", "output directory")
    checkpoint_every: int = arg(0, "checkpoint every N steps (and at the end, see --save-model)")
    resume: bool = arg(False, "continue from OUT/checkpoint.pt (which must exist)")
    allow_config_change: bool = arg(False, "with --resume: accept changed settings")
    save_model: bool = arg(
        True,
        "save_pretrained the final model to OUT/model and keep the final checkpoint's weights "
        "(to train further with --resume); --no-save-model: a finished run keeps no weights",
    )
    report_to: list[str] = arg([], "tensorboard and/or wandb")
    wandb_project: str = arg("clip-sandbox", "W&B project")
    progress: bool = arg(True, "progress bars and the closing 'done:' line")
    # -- where and how it runs --------------------------------------------------------------------
    seed: int = arg(0, "seed of the model (tiny), prompts, sampling")
    device: str = arg("auto", "auto (cuda if available), cpu or cuda")
    backend: str = arg("auto", "torch.distributed backend (auto: nccl on CUDA, else gloo)")
    fsdp: bool = arg(False, "FSDP2 instead of DDP (under torchrun)")

    def validate(self, world: int = 1, launched: bool | None = None) -> None:
        """Cheap checks, before anything is loaded; ``ValueError`` naming the field. ``world``:
        the number of processes; ``launched``: started by torchrun (default: ``world > 1``)."""
        self._check_objective()
        for name in (
            "steps",
            "prompts_per_step",
            "group_size",
            "epochs",
            "minibatches",
            "grad_accum",
            "max_new_tokens",
            "eval_k",
            "entropy_law_rows",
        ):
            _check(name, getattr(self, name), "an integer >= 1", _is_int, 1)
        _check("seed", self.seed, "an integer >= 0", _is_int, 0)  # numpy's seeds are >= 0
        for name in ("prompts_per_call", "logp_chunk"):  # None: the default
            if getattr(self, name) is not None:
                _check(name, getattr(self, name), "an integer >= 1", _is_int, 1)
        for name in ("lr", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{flag(name)} must be > 0, got {getattr(self, name)}")
        for name in (
            "kl_coef",
            "entropy_coef",
            "weight_decay",
            "lora_r",
            "warmup_steps",
            "eval_every",
            "checkpoint_every",
            "eval_prompts",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.rollout_is_min <= self.rollout_is_max or not self.rollout_is_max > 0:
            raise ValueError(
                f"--rollout-is-min {self.rollout_is_min} and --rollout-is-max "
                f"{self.rollout_is_max} need 0 <= min <= max and max > 0"
            )
        check_off_policy_mask(self.off_policy_mask, flag("off_policy_mask"))
        check_top_entropy_quantile(self.top_entropy_quantile, flag("top_entropy_quantile"))
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(
                "--vllm-gpu-memory-utilization must be in (0, 1], got "
                f"{self.vllm_gpu_memory_utilization}"
            )
        self._check_combinations(world, world > 1 if launched is None else launched)
        if self.cpu_bf16:
            check_cpu_bf16(self.device)
        for f in fields(self):
            choices, value = f.metadata.get("choices"), getattr(self, f.name)
            if choices and value is not None and value not in choices:
                raise ValueError(f"{flag(f.name)} must be one of {list(choices)}, got {value!r}")

    def _check_objective(self) -> None:
        if self.objective not in objective_choices():
            raise ValueError(
                f"unknown --objective {self.objective!r}; objectives: "
                f"{', '.join(registry.available_objectives())}; presets: "
                f"{', '.join(registry.available_presets())}"
            )
        try:
            self.build_objective()
        except ValueError as exc:
            raise ValueError(f"--objective {self.objective} --objective-params: {exc}") from None

    def build_objective(self) -> Any:
        """The objective, built once per config: the check in :meth:`validate` and the trainer
        share it (:func:`sandbox.configs.built_objective`)."""
        return built_objective(self)

    def _check_combinations(self, world: int, launched: bool) -> None:
        """Settings that are valid alone but not together (nothing is silently ignored)."""
        if self.rollout_backend == "vllm" and self.fsdp and self.lora_r > 0:
            raise ValueError("--rollout-backend vllm does not support --fsdp with --lora-r > 0")
        check_group_size(self.advantage, self.group_size, ("--group-size", "--advantage"))
        if self.prompts_per_step % world:
            raise ValueError(
                f"--prompts-per-step {self.prompts_per_step} must be divisible by "
                f"the {world} processes"
            )
        rows = self.prompts_per_step * self.group_size
        if rows % self.minibatches:
            raise ValueError(
                f"--minibatches {self.minibatches} must divide the step's "
                f"{rows} completions (--prompts-per-step x --group-size)"
            )
        for name in ("entropy_law", "grad_noise"):
            if getattr(self, name) and launched:
                raise ValueError(
                    f"{flag(name)} runs in one process: it is not supported under torchrun "
                    "(DDP/FSDP); run it single-process"
                )
        if self.grad_noise:
            check_halves(rows // self.minibatches, flag("grad_noise"))
        if self.fsdp and not launched:
            raise ValueError(
                "--fsdp shards over several processes: launch with torchrun "
                "--nproc_per_node N (one process has nothing to shard)"
            )
        if self.generate_compile == "on" and self.generate_cache == "dynamic":
            raise ValueError("--generate-compile on needs --generate-cache static (or auto)")
        explicit = self.generate_cache != "auto" or self.generate_compile != "auto"
        if self.rollout_backend == "vllm" and explicit:
            raise ValueError("--generate-cache/--generate-compile set generate's path, not vLLM's")
        if self.rollout_backend == "compact" and (
            self.generate_cache != "auto" or self.fsdp or self.lora_r > 0
        ):
            raise ValueError(
                "--rollout-backend compact decodes with its own static cache (no --generate-cache; "
                "--generate-compile on compiles its step), without --fsdp and --lora-r"
            )
        if self.old_logp == "sampler" and (
            self.rollout_backend == "vllm" or self.rollout_is != "none"
        ):
            raise ValueError(
                "--old-logp sampler takes pi_old from generate's or the compact decoder's own "
                "log-probs: not with --rollout-backend vllm (another engine's numbers) nor "
                "--rollout-is (pi_old/pi_rollout would be 1 by construction)"
            )
        if self.split and self.data is not None:
            raise ValueError(
                "--split partitions a --task's problems; --data holds out rows of its file "
                "(--eval-prompts) or reads --eval-data"
            )
        if self.eval_data is not None and not self.eval_every:
            raise ValueError("--eval-data is only read with --eval-every N > 0")
        if self.eval_every and not self.eval_prompts:  # a cadence with nothing to evaluate
            raise ValueError(
                f"--eval-every {self.eval_every} evaluates on --eval-prompts 0 held-out problems: "
                "give --eval-prompts >= 1, or --eval-every 0 for no evaluation"
            )
        for name in self.report_to:
            if name not in ("tensorboard", "wandb"):
                raise ValueError(f"--report-to accepts tensorboard and wandb, got {name!r}")


def check_cpu_bf16(device: str) -> None:
    """``--cpu-bf16`` needs a CPU run (``device`` ``cpu``, or ``auto`` resolved to the CPU) on a
    CPU with native bf16 (:func:`llm.model.cpu_native_bf16`); else a one-line ``ValueError``."""
    from llm.model import cpu_native_bf16

    if device not in ("cpu", "auto"):
        raise ValueError(f"--cpu-bf16 is for CPU runs, got --device {device} (CUDA: --bf16)")
    if not cpu_native_bf16():
        raise ValueError(
            "--cpu-bf16 needs a CPU with native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo); "
            "this one has neither: drop --cpu-bf16"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(name: str, value: Any, what: str, kind: Any, low: int) -> None:
    if not kind(value) or value < low:
        raise ValueError(f"{flag(name)} must be {what}, got {value!r}")


# Settings a resumed run may change: how long it runs and how it reports, not what it computes.
RESUMABLE_CHANGES = frozenset(
    {
        "steps",
        "resume",
        "allow_config_change",
        "out",
        "checkpoint_every",
        "eval_every",
        "eval_prompts",
        "eval_k",
        "save_model",
        "report_to",
        "wandb_project",
        "progress",
        "device",
        "backend",
        "offline",
        "logp_chunk",
        "generate_cache",
        "generate_compile",
        "compile_update",
        "lm_head",
    }
)


def decode_settings(cfg: TrainConfig) -> tuple[str, bool]:
    """``(cache, compile_decode)`` for :func:`llm.rollout.generate`. ``auto`` is the reference
    path (dynamic cache, eager decoding) on every device: the fast path (static cache, compiled
    decoding) is proven equal on CPU, but what it buys on a GPU is unmeasured (a static cache is
    sized per call, so a batch of a new prompt length recompiles), so it is opt-in until
    ``benchmarks/llm_throughput.py`` measures it on a GPU."""
    cache = "dynamic" if cfg.generate_cache == "auto" else cfg.generate_cache
    if cfg.generate_compile == "on" and cache != "static":
        raise ValueError("--generate-compile on needs a static cache (--generate-cache static)")
    return cache, cfg.generate_compile == "on"


def as_json(cfg: TrainConfig) -> dict[str, Any]:
    """The settings as JSON values, with the task's knobs resolved (defaults filled in), so that
    ``--task-knobs modulus=7`` and the default ``modulus`` are the same setting."""
    values = asdict(cfg)
    if cfg.data is None:
        with contextlib.suppress(ValueError):  # a bad task or knob is reported by llm.data
            values["task_knobs"] = make_task(cfg.task or "mod_arith", **cfg.task_knobs).knobs
    return json.loads(json.dumps(values, sort_keys=True, default=str))


def check_resume(cfg: TrainConfig, now: dict[str, Any]) -> None:
    """Before a ``--resume``: the checkpoint must exist, be behind ``--steps``, and have the same
    settings (``now``, from :func:`as_json`) except :data:`RESUMABLE_CHANGES`."""
    path = checkpoint.path_in(cfg.out)
    if not os.path.exists(path):
        raise ValueError(
            f"--resume: no checkpoint at {path} (check --out; drop --resume to start a new run)"
        )
    done, saved = checkpoint.saved_step_and_config(cfg.out)
    if done >= cfg.steps:
        raise ValueError(
            f"--resume: {path} is at step {done}, not before --steps {cfg.steps}: "
            "nothing to do (raise --steps to train further)"
        )
    if cfg.allow_config_change:
        return
    changed = [
        f"{flag(k)} {saved.get(k)!r} -> {now[k]!r}"
        for k in sorted(now)
        if k not in RESUMABLE_CHANGES and k in saved and saved[k] != now[k]
    ]
    if _held_out(saved) != _held_out(now):
        changed.append(
            f"rows of --data held out for eval {_held_out(saved)} -> {_held_out(now)} "
            "(--eval-every/--eval-prompts without --eval-data)"
        )
    if changed:
        raise ValueError(
            f"--resume: these settings differ from {path}'s: {'; '.join(changed)}. Resume with "
            "the same settings, pass --allow-config-change to continue anyway, or a new --out"
        )


def _held_out(c: dict[str, Any]) -> int:
    """Rows of ``--data`` held out of training for evaluation."""
    held = c.get("eval_data") is None and c.get("data") is not None and c.get("eval_every")
    return c.get("eval_prompts", 0) if held else 0


def check_optional(cfg: TrainConfig) -> None:
    """The optional packages the settings need, with the extra that installs each."""
    needs = {
        "tensorboard": ("tensorboard" in cfg.report_to, "tracking"),
        "wandb": ("wandb" in cfg.report_to, "tracking"),
        "peft": (cfg.lora_r > 0, "llm"),
        "trl": (cfg.lm_head == "trl", "trl"),
    }
    for module, (needed, extra) in needs.items():
        if needed:
            try:
                __import__(module)
            except ImportError:
                raise ValueError(
                    f"{module} is not installed: pip install 'clip-sandbox[{extra}]'"
                ) from None
