"""GRPO step throughput on CPU: our tiny-transformer trainer vs TRL's ``GRPOTrainer``.

What it measures
----------------
Steps per second of one GRPO *generation round* (sample prompts, generate G completions per
prompt, score them with the task's verifier, compute group advantages and old log-probs, then
take every optimizer step on that batch) for

* **TRL**: ``trl.GRPOTrainer`` on a Hugging Face causal LM of our model's size, inside
  ``trainer.train()``. A ``TrainerCallback`` stamps every ``on_step_end``; a round's time runs
  from the end of the previous round to the end of its last optimizer step, so it includes TRL's
  dataloader, generation, rewards, advantages, old log-probs, updates and per-step bookkeeping;
* **ours**: :class:`sandbox.train.SequenceTrainer` (``sandbox/train/sequence.py``) with
  ``seeds=1``, one model, timed per ``trainer.step()``;
* **ours, seeds=8** (second "ours" row): the same trainer with ``seeds=8``, eight independent
  models per step; its ``models/s`` column is models trained per second (model-steps per second).

The three run interleaved in one process: at the end of each TRL round the callback runs one
step of each of our trainers, outside TRL's timed intervals, so load from other processes and
CPU clock drift hit all three alike (``--sequential`` runs them one after another instead).
The first ``--warmup`` rounds of each are not timed. Reported: median and mean seconds per step,
steps/s (1 / median), the rollout share, seconds per optimizer step, models/s, the mean pass rate
over the timed rounds (a sanity check that both train on the same problem), and the ratio
ours/TRL (target >= 2x, printed as met or not met).

Matched on both sides (printed as a mapping table): the task (``bits``, ``op="parity"``,
``length=2``; ``--length``), prompts per step P' and group size G (the ``SequenceTrainConfig``
defaults 8 x 8), the completion budget (answer length + 1 = 2 tokens), optimizer steps per round
and rows per optimizer step (our ``epochs x minibatches`` = TRL's ``num_iterations x
steps_per_generation`` with ``gradient_accumulation_steps=1``), the model shape (d_model, layers,
heads, 4x MLP, vocabulary of 5, context = prompt + budget), prompts tokenized to the same ids,
the reward (the task's verifier on the decoded completion), Adam at lr 1e-3 with a constant
schedule (TRL: ``adamw_torch`` with weight decay 0) and gradient clipping at 1.0, the DAPO loss
(clip 0.2 / 0.28, token-mean), no KL and no reference model, fp32, and the torch thread count.

Remaining differences:

* Architecture: the HF model is a ``LlamaForCausalLM`` (RMSNorm, rotary positions, SwiGLU MLP
  with three ``d x 4d`` matrices, no biases), ~1.3x our parameters; ours is GPT-style
  (LayerNorm, learned positions, GELU MLP with two matrices and biases). ``--hf-arch gpt2`` uses a
  ``GPT2LMHeadModel``: our architecture plus attention biases (25,952 vs 25,696 parameters).
* Generation: TRL calls HF ``generate`` (logits processors, stopping criteria, a ``DynamicCache``)
  on the P' x G rows; ours samples with its own KV-cached loop.
* Restriction to the answer tokens + EOS: ours masks the other logits when sampling and in the
  training log-probs. TRL samples with ``suppress_tokens=[<pad>, <bos>]`` (the same support;
  checked), but its training log-probs are a softmax over all 5 tokens.
* Minibatch order: ours reshuffles the batch every epoch; TRL shuffles once per round and reuses
  the same ``steps_per_generation`` micro-batches in every iteration.
* Old log-probs: both take one extra no-grad forward pass per round (TRL because
  ``num_iterations > 1``); ours also gets the rollout's entropies from it.
* TRL runs inside ``transformers.Trainer`` (accelerate, a dataloader with ``RepeatSampler``,
  per-step metric gathering with ``.item()`` calls). Logging is effectively off
  (``logging_steps=10**9``), no checkpoints, and no activation checkpointing (on by default in
  TRL; it would add a forward pass per update).

How to run (from the repository root; needs ``trl``; no network access: ``HF_HUB_OFFLINE=1``)::

    python benchmarks/reasoning_step.py                  # ~25 s on 2 CPU cores
    python benchmarks/reasoning_step.py --steps 50 --warmup 5 --threads 2
    python benchmarks/reasoning_step.py --hf-arch gpt2   # architecture-matched HF model
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from envs.reasoning import make_task
from sandbox.train import SequenceTrainConfig, SequenceTrainer

# Before transformers / huggingface_hub are imported (they are imported lazily below).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TARGET_RATIO = 2.0
SEEDS_ROW = 8


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="timed rounds per system")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first (>= 1)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (0: keep torch's default)"
    )
    parser.add_argument("--length", type=int, default=2, help="bits of the parity task (1-8)")
    parser.add_argument(
        "--hf-arch", choices=("llama", "gpt2"), default="llama", help="TRL's model class"
    )
    parser.add_argument(
        "--sequential", action="store_true", help="run the systems one after another"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every run")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    return args


@dataclass
class Timing:
    name: str
    models: int  # models trained per step
    params: int  # parameters per model
    seconds: list[float]  # per timed step
    rollout: float  # median seconds of a step's rollout part
    pass_rate: float  # mean share of verified completions over the timed steps

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.seconds)

    @property
    def steps_per_s(self) -> float:
        return 1.0 / self.median

    @property
    def models_per_s(self) -> float:
        return self.models * self.steps_per_s


def make_config(args: argparse.Namespace, seeds: int) -> SequenceTrainConfig:
    return SequenceTrainConfig(
        task="bits",
        task_knobs={"op": "parity", "length": args.length},
        objective="dapo",
        seeds=seeds,
        steps=args.warmup + args.steps,
        seed=args.seed,
    )


# -- ours ---------------------------------------------------------------------------------------
class OursRunner:
    """One ``SequenceTrainer``, stepped on demand; records each step's time and rollout time."""

    def __init__(self, args: argparse.Namespace, seeds: int) -> None:
        self.seeds, self.warmup = seeds, args.warmup
        self.trainer = SequenceTrainer(make_config(args, seeds))
        self.seconds: list[float] = []
        self.rollouts: list[float] = []
        self.rewards: list[float] = []
        rollout = self.trainer.rollout

        def timed_rollout() -> Any:  # step() calls self.rollout(): time that part too
            start = time.perf_counter()
            batch = rollout()
            self.rollouts.append(time.perf_counter() - start)
            return batch

        self.trainer.rollout = timed_rollout  # type: ignore[method-assign]

    def step(self) -> None:
        start = time.perf_counter()
        out = self.trainer.step()
        self.seconds.append(time.perf_counter() - start)
        self.rewards.append(float(out["reward"].mean()))

    def timing(self) -> Timing:
        w = self.warmup
        params = sum(p.numel() for p in self.trainer.model.parameters()) // self.seeds
        name = f"ours, seeds={self.seeds}" + (
            f" ({self.seeds} models/step)" if self.seeds > 1 else ""
        )
        return Timing(
            name,
            self.seeds,
            params,
            self.seconds[w:],
            statistics.median(self.rollouts[w:]),
            statistics.fmean(self.rewards[w:]),
        )


# -- TRL ----------------------------------------------------------------------------------------
def hf_tokenizer(task: Any) -> Any:
    """A fast tokenizer with exactly the task's ids: one token per character, ``<bos>`` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ct = task.tokenizer
    pad, bos, eos = ct.vocab[ct.pad_id], ct.vocab[ct.bos_id], ct.vocab[ct.eos_id]
    tok = Tokenizer(models.WordLevel(dict(ct.token_to_id), unk_token=pad))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, ct.bos_id)]
    )
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=pad,
        bos_token=bos,
        eos_token=eos,
        unk_token=pad,
        padding_side="left",
    )


def hf_model(config: SequenceTrainConfig, task: Any, arch: str, seed: int) -> Any:
    """A randomly initialised HF causal LM with our model's shape (fp32, no dropout)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    shape, tok = config.model_config(), task.tokenizer
    ids = {"pad_token_id": tok.pad_id, "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id}
    torch.manual_seed(seed)
    if arch == "llama":
        hf_config = LlamaConfig(
            vocab_size=shape.vocab_size,
            hidden_size=shape.d_model,
            intermediate_size=shape.mlp_ratio * shape.d_model,
            num_hidden_layers=shape.n_layers,
            num_attention_heads=shape.n_heads,
            num_key_value_heads=shape.n_heads,
            max_position_embeddings=shape.max_len,
            tie_word_embeddings=False,
            **ids,
        )
        return LlamaForCausalLM(hf_config).train()
    hf_config = GPT2Config(
        vocab_size=shape.vocab_size,
        n_embd=shape.d_model,
        n_inner=shape.mlp_ratio * shape.d_model,
        n_layer=shape.n_layers,
        n_head=shape.n_heads,
        n_positions=shape.max_len,
        tie_word_embeddings=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **ids,
    )
    return GPT2LMHeadModel(hf_config).train()


def trl_mapping(config: SequenceTrainConfig) -> dict[str, Any]:
    """GRPOConfig fields that reproduce the batch shape of one ``SequenceTrainer.step``."""
    rows = config.prompts_per_step * config.group_size
    return {
        "num_generations": config.group_size,
        "per_device_train_batch_size": rows // config.minibatches,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": config.minibatches,
        "num_iterations": config.epochs,
        "max_completion_length": config.completion_budget(),
    }


def make_clock(updates: int, between: Callable[[], None]) -> Any:
    """A ``TrainerCallback`` stamping every optimizer step's end; after each round's last step it
    runs ``between()`` (our trainers' steps) and stamps when TRL resumes."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []  # end of each optimizer step
            self.resumes: list[float] = []  # TRL's restart after each round (index: round)

        def on_train_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())
            if state.global_step % updates == 0:
                between()
                self.resumes.append(time.perf_counter())

        def step_seconds(self) -> list[float]:
            """Seconds of every optimizer step, without the time spent in ``between``."""
            starts = [self.begin]
            for i in range(1, len(self.ends)):
                starts.append(
                    self.resumes[i // updates - 1] if i % updates == 0 else self.ends[i - 1]
                )
            return [end - start for start, end in zip(starts, self.ends, strict=True)]

    return Clock()


def run_trl(
    args: argparse.Namespace, between: Callable[[], None]
) -> tuple[Timing, dict[str, Any], dict[str, Any]]:
    import datasets
    import transformers
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    config = make_config(args, seeds=1)
    task = make_task(config.task, **config.task_knobs)
    tokenizer = hf_tokenizer(task)
    ct = task.tokenizer

    rounds = args.warmup + args.steps
    rng = np.random.default_rng(args.seed)
    prompts, answers = task.sample_batch(rng, config.prompts_per_step * (rounds + 1))
    bits = [ct.decode(task.encode_prompt(p)) for p in prompts]  # "01": the prompt's bits only
    for prompt, ids in zip(prompts, tokenizer(text=bits)["input_ids"], strict=True):
        if ids != task.encode_prompt(prompt):
            raise AssertionError(f"HF tokenizer gives {ids}, ours {task.encode_prompt(prompt)}")
    dataset = datasets.Dataset.from_dict({"prompt": bits, "answer": answers})

    allowed = set(task.completion_token_ids)
    seen: set[int] = set()
    rewards: list[float] = []

    def parity_reward(completions, completion_ids, answer, **kwargs):
        for ids in completion_ids:
            seen.update(ids)
        out = [
            task.verify(a, task.decode_completion(ids))
            for a, ids in zip(answer, completion_ids, strict=True)
        ]
        rewards.append(statistics.fmean(out))
        return out

    mapping = trl_mapping(config)
    objective = config.build_objective()
    suppress = [i for i in range(ct.vocab_size) if i not in allowed]
    updates = mapping["steps_per_generation"] * mapping["num_iterations"]
    out_dir = tempfile.TemporaryDirectory(prefix="reasoning_step_trl_")  # nothing is saved
    grpo_args = GRPOConfig(
        output_dir=out_dir.name,
        use_cpu=True,
        report_to=[],
        bf16=False,
        fp16=False,
        seed=args.seed,
        max_steps=rounds * updates,
        logging_steps=10**9,
        save_strategy="no",
        disable_tqdm=True,
        activation_checkpointing=False,
        loss_type="dapo",
        beta=0.0,
        epsilon=objective.params["eps_low"],
        epsilon_high=objective.params["eps_high"],
        scale_rewards="group",
        temperature=config.temperature,
        learning_rate=config.lr,
        lr_scheduler_type="constant",
        optim="adamw_torch",  # weight_decay=0: Adam, as ours
        weight_decay=0.0,
        max_grad_norm=config.max_grad_norm,
        generation_kwargs={"suppress_tokens": suppress},
        **mapping,
    )
    model = hf_model(config, task, args.hf_arch, args.seed)
    clock = make_clock(updates, between)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=parity_reward,
        args=grpo_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics line
    try:
        trainer.train()
    finally:
        out_dir.cleanup()

    if len(clock.ends) != rounds * updates or len(rewards) != rounds:
        raise RuntimeError(
            f"TRL ran {len(clock.ends)} optimizer steps, expected {rounds * updates}"
        )
    if not seen <= allowed:
        raise AssertionError(f"TRL sampled ids {sorted(seen - allowed)} outside {sorted(allowed)}")
    steps = clock.step_seconds()[args.warmup * updates :]
    seconds = [sum(steps[k : k + updates]) for k in range(0, len(steps), updates)]
    # Rollout part: a round's first optimizer step (dataloader, generation, rewards, advantages,
    # old log-probs, one update) minus the median of its other, update-only, steps.
    others = [t for i, t in enumerate(steps) if i % updates]
    rollout = statistics.median(steps[::updates]) - statistics.median(others)
    params = sum(p.numel() for p in model.parameters())
    timing = Timing(
        f"TRL GRPOTrainer ({args.hf_arch})",
        1,
        params,
        seconds,
        rollout,
        statistics.fmean(rewards[args.warmup :]),
    )
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    info = {
        "optimizer": type(optimizer).__name__,
        "generation_batch_size": grpo_args.generation_batch_size,
        "updates": updates,
        "suppress": suppress,
        "sampled_ids": sorted(seen),
    }
    return timing, mapping, info


# -- report -------------------------------------------------------------------------------------
def print_mapping(config: SequenceTrainConfig, mapping: dict[str, Any], info: dict[str, Any]):
    rows = config.prompts_per_step * config.group_size
    print("Mapping (one generation round):")
    table = [
        ("prompts x group size", f"P'={config.prompts_per_step} x G={config.group_size}",
         f"generation_batch_size={info['generation_batch_size']} "
         f"(num_generations={mapping['num_generations']})"),
        ("optimizer steps/round", f"epochs={config.epochs} x minibatches={config.minibatches}",
         f"num_iterations={mapping['num_iterations']} x steps_per_generation="
         f"{mapping['steps_per_generation']} (gradient_accumulation_steps=1)"),
        ("rows per optimizer step", f"{rows} / {config.minibatches} = {rows // config.minibatches}",
         f"per_device_train_batch_size={mapping['per_device_train_batch_size']}"),
        ("completion budget", f"max_new_tokens={config.completion_budget()}",
         f"max_completion_length={mapping['max_completion_length']}"),
        ("sampling support", "answer tokens + EOS (logit mask)",
         f"suppress_tokens={info['suppress']} (sampled ids {info['sampled_ids']})"),
        ("optimizer", f"torch.optim.Adam, lr {config.lr:g}",
         f"{info['optimizer']}, lr {config.lr:g}, weight decay 0, constant schedule"),
    ]  # fmt: skip
    w0, w1 = max(len(r[0]) for r in table), max(len(r[1]) for r in table)
    print(f"  {'':{w0}}  {'ours':{w1}}  TRL")
    for a, b, c in table:
        print(f"  {a:{w0}}  {b:{w1}}  {c}")


def print_results(results: list[Timing], trl: Timing, updates: int) -> None:
    header = (
        f"{'system':30} {'params':>7} {'steps/s':>8} {'s/step med':>11} {'s/step mean':>12} "
        f"{'rollout s':>10} {'s/update':>9} {'models/s':>9} {'pass':>5} {'vs TRL':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.name:30} {r.params:>7} {r.steps_per_s:>8.2f} {r.median:>11.4f} {r.mean:>12.4f} "
            f"{r.rollout:>10.4f} {(r.median - r.rollout) / updates:>9.4f} "
            f"{r.models_per_s:>9.2f} {r.pass_rate:>5.2f} {r.models_per_s / trl.models_per_s:>6.2f}x"
        )
    print(
        f"  steps/s = 1 / median s/step; a step = one generation round and its {updates} "
        "optimizer steps; models/s = models per step x steps/s; vs TRL = models/s ratio.\n"
        "  rollout s = median of generation + rewards + advantages + old log-probs (TRL: a round's "
        "first optimizer step minus\n  the median update-only step); s/update = (s/step med - "
        "rollout s) / optimizer steps; pass = mean pass rate over the timed rounds."
    )


def main() -> None:
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    import transformers
    import trl

    config = make_config(args, seeds=1)
    print(
        f"GRPO step throughput on CPU: task bits/parity length={args.length}, d_model="
        f"{config.d_model}, layers={config.n_layers}, heads={config.n_heads}, objective=dapo; "
        f"{args.warmup} warm-up + {args.steps} timed rounds per system, "
        + ("run one after another" if args.sequential else "interleaved round by round")
    )
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), transformers "
        f"{transformers.__version__}, trl {trl.__version__}, python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    start = time.perf_counter()
    ours = [OursRunner(args, seeds=1), OursRunner(args, seeds=SEEDS_ROW)]
    rounds = args.warmup + args.steps

    def between() -> None:
        if not args.sequential:
            for runner in ours:
                runner.step()

    if args.sequential:
        for _ in range(rounds):
            ours[0].step()
    trl_timing, mapping, info = run_trl(args, between)
    if args.sequential:
        for _ in range(rounds):
            ours[1].step()
    ours1, ours8 = (runner.timing() for runner in ours)

    print()
    print_mapping(config, mapping, info)
    print()
    print_results([trl_timing, ours1, ours8], trl_timing, info["updates"])
    ratio = ours1.steps_per_s / trl_timing.steps_per_s
    print()
    print(
        f"ours (seeds=1) / TRL steps per second: {ratio:.2f}x from the medians "
        f"({trl_timing.mean / ours1.mean:.2f}x from the means); target >= {TARGET_RATIO:g}x: "
        + ("met" if ratio >= TARGET_RATIO else "NOT met")
    )
    print(
        f"ours (seeds={SEEDS_ROW}) / TRL models trained per second: "
        f"{ours8.models_per_s / trl_timing.models_per_s:.2f}x ({SEEDS_ROW} independent models "
        "per step vs TRL's one)"
    )
    arch = {"llama": "Llama (RMSNorm, rotary, SwiGLU, no biases)", "gpt2": "GPT-2 (ours)"}
    print(
        f"Differences left: HF architecture {arch[args.hf_arch]}; TRL samples with HF generate "
        "and trains on a 5-token softmax (ours: the 3 allowed tokens); TRL reuses one minibatch "
        "split per round (ours reshuffles each epoch); TRL runs inside transformers.Trainer. "
        "See the module docstring."
    )
    print(f"total wall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
