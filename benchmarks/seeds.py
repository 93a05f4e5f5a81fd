"""Seed vectorisation benchmark of the bandit trainer (sandbox.train.bandit).

What it measures
----------------
One objective (default the ``dapo`` preset) on a K = 100 armed Bernoulli bandit, G = 8 samples per
step, mu = 1, one minibatch, SGD, for S = 1000 seeds x 1000 steps:

* **vectorised**: one ``train_bandit`` call with ``seeds=S`` (the seed is a batch dimension),
  timed end to end, DataFrame included;
* **per-seed loop**: the same trainer called with ``seeds=1`` once per seed, the way one would run
  seeds without a batch dimension. Running all S of them would take minutes, so it is timed on
  ``--loop-seeds`` seeds (default 20) and extrapolated linearly to S; the output says so.

It prints both times, the speedup (target >= 30x) and whether the vectorised run stays under the
10 s budget (target on 2 CPU cores). Both sides get one short warm-up run first, and both run
with the same number of torch threads (``--threads``, default 1: the trainer's tensors have
~1e5 elements, too small for intra-op threads to pay off, and OpenMP threads spin badly when
other processes share the cores; pass ``--threads 0`` to keep torch's default).

How to run (from the repository root)::

    python benchmarks/seeds.py                          # 1000 seeds x 1000 steps, K = 100
    python benchmarks/seeds.py --seeds 100 --steps 200  # quick run
    python benchmarks/seeds.py --objective nsr_dapo --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from envs.bandit import BanditModel
from sandbox.train import BanditTrainConfig, train_bandit

TARGET_SPEEDUP = 30.0
TARGET_SECONDS = 10.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1000, help="S, seeds of the vectorised run")
    parser.add_argument("--steps", type=int, default=1000, help="training steps")
    parser.add_argument("--arms", type=int, default=100, help="K, arms of the Bernoulli bandit")
    parser.add_argument("--group-size", type=int, default=8, help="G, samples per step")
    parser.add_argument("--objective", default="dapo", help="objective or preset name")
    parser.add_argument(
        "--loop-seeds", type=int, default=20, help="seeds timed in the per-seed loop"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: keep torch's default)"
    )
    return parser.parse_args()


def timed(model: BanditModel, config: BanditTrainConfig) -> tuple[float, float]:
    """Seconds of one ``train_bandit`` call and the final seed-mean expected reward."""
    start = time.perf_counter()
    df = train_bandit(model, config)
    seconds = time.perf_counter() - start
    return seconds, float(df[df.step == df.step.max()].expected_reward.mean())


def main() -> None:
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model = BanditModel(num_arms=args.arms, reward="bernoulli", model_seed=0)
    config = BanditTrainConfig(
        objective=args.objective,
        seeds=args.seeds,
        steps=args.steps,
        group_size=args.group_size,
        epochs=1,
        minibatches=1,
        optimizer="sgd",
        lr=0.5,
    )
    loop_seeds = min(args.loop_seeds, args.seeds)
    print(
        f"bandit: K={args.arms} Bernoulli arms (best p={model.mean_rewards.max():.3f}), "
        f"objective={args.objective}, G={args.group_size}, mu=1, 1 minibatch, "
        f"{args.steps} steps; torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )

    # Warm-up (first-call allocations, lazy imports), not timed.
    train_bandit(model, dataclasses.replace(config, steps=5))
    train_bandit(model, dataclasses.replace(config, seeds=1, steps=5))

    vec_seconds, vec_reward = timed(model, config)

    loop_seconds, loop_rewards = 0.0, []
    for s in range(loop_seeds):
        seconds, reward = timed(model, dataclasses.replace(config, seeds=1, seed=config.seed + s))
        loop_seconds += seconds
        loop_rewards.append(reward)
    loop_extrapolated = loop_seconds / loop_seeds * args.seeds

    speedup = loop_extrapolated / vec_seconds
    print(
        f"vectorised      : {args.seeds} seeds in one call       {vec_seconds:8.2f} s  "
        f"(final mean expected reward {vec_reward:.3f})"
    )
    print(
        f"per-seed loop   : {loop_seeds} seeds timed, {loop_seconds:.2f} s, extrapolated x"
        f"{args.seeds / loop_seeds:g} to {args.seeds} seeds  {loop_extrapolated:8.2f} s  "
        f"(final mean expected reward {sum(loop_rewards) / len(loop_rewards):.3f})"
    )
    print(
        f"speedup         : {speedup:.1f}x  (target >= {TARGET_SPEEDUP:g}x: "
        f"{'met' if speedup >= TARGET_SPEEDUP else 'NOT met'})"
    )
    print(
        f"vectorised time : {vec_seconds:.2f} s  (target < {TARGET_SECONDS:g} s: "
        f"{'met' if vec_seconds < TARGET_SECONDS else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
