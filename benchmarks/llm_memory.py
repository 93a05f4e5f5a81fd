"""Peak memory of one GRPO step: ``llm.train`` vs TRL's ``GRPOTrainer`` on the same model and batch.

The model is a 2-layer Llama with Qwen2.5-0.5B's widths (hidden 896, MLP 4864, 14 query and 2
key/value heads of 64, tied embeddings) and Qwen's 151,936-token vocabulary, random weights built
from a config in code and saved with a word-level tokenizer of that size to a temporary directory
(no download), so both trainers load the same files. The vocabulary dominates: the head holds
136M of the 166M parameters and a ``[tokens, V]`` float32 logits tensor is 0.6 MB per token.

One step, for both: one rollout of ``prompts x group_size`` completions of exactly
``max_new_tokens`` tokens (random weights rarely sample EOS), the old log-probs of all rows (no
gradient), then two optimizer steps over half the rows each, in ``micro_batch``-row micro-batches
(``llm.train --minibatches 2 --grad-accum R/2/micro_batch``; TRL ``steps_per_generation =
R/micro_batch``, ``gradient_accumulation_steps = R/2/micro_batch``, ``max_steps=2``), AdamW,
no KL reference model (``--kl-coef 0`` / ``beta=0``), gradient checkpointing on in both by
default (TRL's default; ``--no-gradient-checkpointing`` turns it off in both). ``llm.train`` is
driven through its CLI entry point ``llm.train.main(argv)``, TRL through ``GRPOTrainer.train()``.

Each measurement runs in a fresh subprocess: on CPU the resident-set high-water mark
(``ru_maxrss``), on CUDA ``torch.cuda.max_memory_allocated``; each trainer's figure is taken above
a baseline subprocess that imports the same packages and loads the model, so the parameters are in
the baseline. Printed per trainer: ``peak`` (above the baseline), ``state`` (what the trainable
parameters' gradients and AdamW's two moments hold: 12 bytes per float32 parameter) and
``activations = peak - state`` (everything else: logits, activations, temporaries, rollout); then
the ratios llm.train / TRL of both. Target (issue 12): activations <= 0.5, peak <= 1.0.
``--budget-mb`` also finds, for each trainer, the largest micro-batch (powers of two up to the
rollout's rows) whose peak fits in that many MB above the baseline.

Measured 2026-11-23 on the 2-core CPU of this project's dev machine (torch 2.13, transformers 5,
TRL 1.16), the default setting above (8 x 8 x 128, 16-row micro-batches, checkpointing on), MB
above the load-only baseline (1,615 MB): llm.train peak 2,704, activations 805; TRL peak 4,744,
activations 2,845; ratios 0.57 (peak) and 0.28 (activations). llm.train's activations are mostly
the tied head/embedding's two ``[V, H]`` float32 gradients (519 MB each: the head's and the
embedding's) that meet in the backward of a micro-batch after the first (~1 GB transient in an
in-process probe); a fused AdamW changed llm.train's peak by 3 MB. (MB here: 2**20 bytes.)

Run::

    python benchmarks/llm_memory.py                    # CPU, the issue's setting (minutes)
    python benchmarks/llm_memory.py --device cuda --prompts 32 --max-new-tokens 256 --micro-batch 32
    python benchmarks/llm_memory.py --tiny             # seconds: a small model, for the smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

MB = 2**20
TRAINERS = ("llm", "trl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=16, help="rows per micro-batch")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--budget-mb",
        type=float,
        default=None,
        help="also: the largest micro-batch whose peak fits in MB",
    )
    p.add_argument("--trainers", default="llm,trl", help="comma-separated subset of llm,trl")
    p.add_argument("--threads", type=int, default=2, help="torch threads per subprocess (CPU)")
    p.add_argument("--tiny", action="store_true", help="a small model and batch (smoke test)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.vocab, args.hidden, args.intermediate, args.heads, args.kv_heads = 2048, 64, 128, 2, 1
        args.prompts, args.group_size, args.max_new_tokens, args.micro_batch = 2, 2, 8, 2
    rows = args.prompts * args.group_size
    if rows % (2 * args.micro_batch):
        raise ValueError(
            f"--micro-batch: prompts x group size ({rows}) must be a multiple of "
            f"2 x {args.micro_batch} (two optimizer steps of whole micro-batches)"
        )
    if args.hidden % args.heads:
        raise ValueError(f"--heads must divide --hidden {args.hidden}")
    args.trainers = [t for t in args.trainers.split(",") if t]
    if not set(args.trainers) <= set(TRAINERS):
        raise ValueError(f"--trainers must be a subset of {TRAINERS}, got {args.trainers}")
    return args


# -- the model and the data, written once for every subprocess -------------------------------------


def build_model_dir(args: argparse.Namespace, out: str) -> int:
    """A random tied-head Llama and a word-level tokenizer of ``--vocab`` tokens (characters,
    specials, then filler tokens ``<t123>``) saved to ``out``; returns the parameter count."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from envs.reasoning import DEFAULT_CHARS

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(DEFAULT_CHARS)})
    vocab.update({f"<t{i}>": i for i in range(len(vocab), args.vocab)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tok.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    prompts = [f"What is {100 + 7 * i} + {200 + 3 * i}? Answer: " for i in range(args.prompts)]
    with open(os.path.join(out, "prompts.jsonl"), "w") as f:
        for i, text in enumerate(prompts):
            f.write(json.dumps({"prompt": text, "answer": str(300 + 10 * i)}) + "\n")
    return sum(p.numel() for p in model.parameters())


# -- the measured subprocesses ---------------------------------------------------------------------


def child(args: argparse.Namespace) -> dict[str, float]:
    """Run one measurement in this (fresh) process; returns its peak memory in MB."""
    import torch

    torch.set_num_threads(args.threads)
    kind, _, mb = args.child.partition(":")
    micro = int(mb) if mb else args.micro_batch
    if kind.startswith("baseline"):
        if kind == "baseline-trl":
            import trl  # noqa: F401  (the same imports as the measured run)
        else:
            import llm.train  # noqa: F401
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(args.model_dir).to(args.device)
    elif kind == "llm":
        run_llm_train(args, micro)
    else:
        run_trl(args, micro)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    cuda = 0.0
    if args.device == "cuda":
        cuda = (
            torch.cuda.memory_allocated()
            if kind.startswith("baseline")
            else torch.cuda.max_memory_allocated()
        ) / MB
    return {"rss_mb": rss, "cuda_mb": cuda}


def run_llm_train(args: argparse.Namespace, micro: int) -> None:
    """One step of ``python -m llm.train`` (its CLI entry point, in this process)."""
    from llm.train import main

    rows = args.prompts * args.group_size
    data = os.path.join(args.model_dir, "prompts.jsonl")
    gc = (
        "--gradient-checkpointing" if args.gradient_checkpointing else "--no-gradient-checkpointing"
    )
    with tempfile.TemporaryDirectory() as out:
        main(
            [
                "--model",
                args.model_dir,
                "--offline",
                "--data",
                data,
                "--chat-template",
                "off",
                "--steps",
                "1",
                "--prompts-per-step",
                str(args.prompts),
                "--group-size",
                str(args.group_size),
                "--max-new-tokens",
                str(args.max_new_tokens),
                "--prompts-per-call",
                str(args.prompts),
                "--minibatches",
                "2",
                "--grad-accum",
                str(rows // 2 // micro),
                "--eval-every",
                "0",
                "--kl-coef",
                "0",
                "--device",
                args.device,
                "--no-progress",
                "--no-save-model",
                "--out",
                out,
                gc,
            ]
        )


def run_trl(args: argparse.Namespace, micro: int) -> None:
    """The same step with TRL's ``GRPOTrainer`` (two optimizer steps over one generation)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rows = args.prompts * args.group_size
    with open(os.path.join(args.model_dir, "prompts.jsonl")) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    model = AutoModelForCausalLM.from_pretrained(args.model_dir).to(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)

    def reward(completions: list[str], **_) -> list[float]:
        return [float(len(c) % 2) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=rows // 2 // micro,
            generation_batch_size=rows,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            max_steps=2,
            learning_rate=1e-6,
            beta=0.0,
            temperature=1.0,
            gradient_checkpointing=args.gradient_checkpointing,
            use_cpu=args.device == "cpu",
            bf16=args.device == "cuda",
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
        )
        trainer.train()


def measure(args: argparse.Namespace, what: str) -> float:
    """Peak MB of ``what`` (``baseline-llm``, ``llm``, ``trl:32``, ...) in a fresh subprocess."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        what,
        "--model-dir",
        args.model_dir,
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        *args.passthrough,
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(args.threads),
        "WANDB_DISABLED": "true",
    }
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["cuda_mb" if args.device == "cuda" else "rss_mb"]


def passthrough(args: argparse.Namespace) -> list[str]:
    """The model/batch flags of the parent, for the children."""
    out = []
    for name in (
        "vocab",
        "hidden",
        "intermediate",
        "layers",
        "heads",
        "kv_heads",
        "prompts",
        "group_size",
        "max_new_tokens",
        "micro_batch",
    ):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    gc = (
        "--gradient-checkpointing" if args.gradient_checkpointing else "--no-gradient-checkpointing"
    )
    return [*out, gc]


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return {}
    with tempfile.TemporaryDirectory() as model_dir:
        n_params = build_model_dir(args, model_dir)
        args.model_dir, args.passthrough = model_dir, passthrough(args)
        state = 12 * n_params / MB  # float32 gradient + AdamW exp_avg + exp_avg_sq per parameter
        rows = args.prompts * args.group_size
        print(
            f"model: {args.layers}-layer Llama, vocab {args.vocab}, hidden {args.hidden}, tied "
            f"head, {n_params / 1e6:.1f}M parameters (float32); device {args.device}, "
            f"{args.threads} threads"
        )
        print(
            f"step: 1 rollout of {args.prompts} prompts x {args.group_size} x "
            f"{args.max_new_tokens} new tokens, old log-probs, 2 optimizer steps of "
            f"{rows // 2} rows in {args.micro_batch}-row micro-batches; gradient checkpointing "
            f"{'on' if args.gradient_checkpointing else 'off'}"
        )
        what = "max_memory_allocated" if args.device == "cuda" else "RSS high-water mark"
        print(
            f"{what}, MB above a process that imports and loads the model "
            f"(grads + AdamW state: {state:.0f} MB)"
        )
        print(
            f"{'trainer':<22}{'baseline':>10}{'peak':>10}{'state':>10}{'activations':>13}{'s':>7}"
        )
        results: dict[str, dict[str, float]] = {}
        for name in args.trainers:
            base = measure(args, f"baseline-{name}")
            t0 = time.perf_counter()
            peak = measure(args, name) - base
            dt = time.perf_counter() - t0
            results[name] = {
                "baseline": base,
                "peak": peak,
                "state": state,
                "activations": peak - state,
            }
            label = "llm.train" if name == "llm" else "TRL GRPOTrainer"
            print(
                f"{label:<22}{base:>10.0f}{peak:>10.0f}{state:>10.0f}"
                f"{peak - state:>13.0f}{dt:>7.0f}",
                flush=True,
            )
        if len(results) == 2:
            r = {k: results["llm"][k] / results["trl"][k] for k in ("peak", "activations")}
            results["ratio"] = r
            print(
                f"ratio llm.train / TRL: peak {r['peak']:.2f} (target <= 1.0), "
                f"activations {r['activations']:.2f} (target <= 0.5)"
            )
        if args.budget_mb is not None:
            results["largest_micro_batch"] = largest_micro_batches(args, results, rows)
    return results


def largest_micro_batch_for(args: argparse.Namespace, name: str, base: float, rows: int) -> int:
    best, micro = 0, 1
    while micro <= rows // 2:
        if (rows // 2) % micro == 0:
            peak = measure(args, f"{name}:{micro}") - base
            if peak > args.budget_mb:
                break
            best = micro
        micro *= 2
    return best


def largest_micro_batches(args: argparse.Namespace, results: dict, rows: int) -> dict[str, float]:
    out = {}
    for name in args.trainers:
        out[name] = largest_micro_batch_for(args, name, results[name]["baseline"], rows)
        label = "llm.train" if name == "llm" else "TRL GRPOTrainer"
        print(f"largest micro-batch within {args.budget_mb:.0f} MB: {label} {out[name]}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
