"""bf16 autocast on the CPU (``--cpu-bf16``) against float32 at one step, on one fixed batch.

One rollout is sampled in float32 (prompts, completions, rewards); then, from the same initial
weights, each mode computes the old log-probs of that batch and runs the step's update
(mu = epochs x minibatches optimizer steps) with llm.train's own phases (:func:`llm.train.setup`,
:func:`llm.train.score`, :func:`llm.train.update_each`; the loss is sandbox's). Printed: the
largest and mean |log-prob(bf16) - log-prob(float32)| over the completion tokens at the initial
weights, and each mode's clip shares (``clip_low_frac + clip_high_frac``: the share of loss tokens
the objective clips, over the step's updates), loss and gradient norm.

Run (CPU with avx512_bf16 or amx_bf16; the rung's CPU shapes)::

    python benchmarks/llm_cpu_bf16_check.py --model smollm2-135m --json results/llm_cpu_speed/bf16_check.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time


def compare(cfg, out: str) -> dict:
    """The figures above for ``cfg`` (a float32 :class:`llm.config.TrainConfig`)."""
    import torch

    from llm.train import logprobs, rollout_each, score, setup, update_each

    modes = {"float32": False, "bf16": True}
    closers: list = []
    runs = {
        name: setup(dataclasses.replace(cfg, cpu_bf16=flag, out=f"{out}/{name}"), closers)
        for name, flag in modes.items()
    }
    host = rollout_each([runs["float32"]], 0)[0]  # the fixed batch, sampled in float32
    chunks = cfg.minibatches
    record: dict = {"model": cfg.model}
    logps = {}
    for name, run in runs.items():
        mine = dict(host)
        logps[name] = logprobs(run, run.model, mine, chunks)  # pi_old under the mode's autocast
        mine["logp_old"] = logps[name]
        batch, keep = score(run, mine)
        m = update_each([run], [batch], [mine], [keep], 0)[0].reduce()
        record[name] = {
            k: m[k] for k in ("clip_low_frac", "clip_high_frac", "loss", "grad_norm") if k in m
        }
        record[name]["clip_frac"] = m["clip_low_frac"] + m["clip_high_frac"]
    mask = host["completion_mask"].bool()
    delta = (logps["bf16"] - logps["float32"]).abs()[mask]
    record["tokens"] = int(mask.sum())
    record["max_abs_dlogp"] = float(delta.max())
    record["mean_abs_dlogp"] = float(delta.mean())
    record["reward_mean"] = float(host["rewards"].mean())
    record["torch"] = torch.__version__
    return record


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--digits", type=int, default=1)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    from llm.config import TrainConfig

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            model=args.model,
            task="addition",
            task_knobs={"digits": args.digits},
            prompts_per_step=args.prompts,
            group_size=args.group_size,
            max_new_tokens=args.max_new_tokens,
            epochs=2,
            minibatches=2,
            lr=args.lr,
            steps=1,
            device="cpu",
            progress=False,
            save_model=False,
            offline=True,
        )
        record = compare(cfg, out)
    record["command"] = " ".join(
        ["python benchmarks/llm_cpu_bf16_check.py", *(argv or sys.argv[1:])]
    )
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(record, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return record


if __name__ == "__main__":
    main()
