"""Exact expected gradient vs Monte Carlo on a 100,000-armed softmax bandit.

What it measures
----------------
A K-armed bandit (default K = 100,000) with needle-like binary rewards: a random 1% of the arms
are correct (reward 1), the others wrong (reward 0). The sampling policy has random logits
``z_old ~ sigma * N(0, 1)`` and the optimised policy ``z = z_old + shift * N(0, 1)``, so the ratios
leave the clip range on many arms. For one objective (default ``dapo``: ppo_clip with eps 0.2/0.28)
and the population advantage ``A = R - E_{pi_old}[R]``:

* **exact**: :func:`sandbox.exact.bandit_gradient` (one call, float64), after one warm-up call,
  the median of ``--repeats`` calls;
* **Monte Carlo**: the sampled gradient ``mean_i coef_i (e_{a_i} - pi)`` of the same objective,
  ``a_i ~ pi_old`` by inverse CDF on a seeded generator, ``R_i ~ Bernoulli(p_{a_i})``, coef from
  ``obj(logp, logp_old, adv)`` in batches of ``--chunk`` samples (float64, the per-arm sum by
  ``bincount``). N doubles (the samples accumulate) until the relative error
  ``|g_mc - g_exact| / |g_exact|`` (L2 over the K components) is at most ``--target`` (1%); the
  time reported is the sampling time up to that N, i.e. the cost of one Monte Carlo run of N
  samples (checking the error at each doubling is not counted).

It prints both times and their ratio (the target is exact >= 100x faster). Both sides run with one
intra-op thread by default (``--threads``), so that the ratio does not depend on how busy the
machine is (oversubscribed OpenMP threads slow small kernels down by orders of magnitude). Run
from the repository root (CPU; well under a minute at the defaults)::

    python benchmarks/exact.py
    python benchmarks/exact.py --objective nsr --sigma 2 --arms 20000   # a smaller, peakier case
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sandbox.exact import bandit_gradient
from sandbox.objectives import get_objective

F64 = torch.float64


def make_problem(arms: int, sigma: float, shift: float, correct: float, seed: int):
    gen = torch.Generator().manual_seed(seed)
    old = sigma * torch.randn(arms, generator=gen, dtype=F64)
    logits = old + shift * torch.randn(arms, generator=gen, dtype=F64)
    probs = torch.zeros(arms, dtype=F64)
    n_correct = max(1, round(correct * arms))
    probs[torch.randperm(arms, generator=gen)[:n_correct]] = 1.0
    return logits, old, probs


def time_exact(obj, logits, old, probs, repeats: int) -> tuple[torch.Tensor, float]:
    exact = bandit_gradient(obj, logits, old, probs, binary=True)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        exact = bandit_gradient(obj, logits, old, probs, binary=True)
        times.append(time.perf_counter() - start)
    return exact, statistics.median(times)


def monte_carlo(obj, logits, old, probs, exact, *, target, chunk, max_samples, seed):
    """Double N until the relative L2 error is <= target; (N, error, seconds, trajectory)."""
    gen = torch.Generator().manual_seed(seed + 1)
    logp, logp_old = torch.log_softmax(logits, -1), torch.log_softmax(old, -1)
    pi, pi_old = logp.exp(), logp_old.exp()
    cdf = torch.cumsum(pi_old, 0)
    mu = (pi_old * probs).sum()
    arms = logits.shape[0]
    sum_w = torch.zeros(arms, dtype=F64)
    sum_c = torch.zeros((), dtype=F64)
    n, seconds, trajectory = 0, 0.0, []
    next_check = chunk
    while True:
        start = time.perf_counter()
        u = torch.rand(chunk, generator=gen, dtype=F64) * cdf[-1]
        a = torch.searchsorted(cdf, u).clamp_(max=arms - 1)
        reward = (torch.rand(chunk, generator=gen, dtype=F64) < probs[a]).to(F64)
        out = obj(logp[a][:, None], logp_old[a][:, None], (reward - mu)[:, None], generator=gen)
        coef = out.coef[:, 0]
        sum_w += torch.bincount(a, weights=coef, minlength=arms)
        sum_c += coef.sum()
        n += chunk
        seconds += time.perf_counter() - start
        if n == next_check:
            estimate = (sum_w - pi * sum_c) / n  # mean of coef_i (e_{a_i} - pi)
            error = ((estimate - exact).norm() / exact.norm()).item()
            trajectory.append((n, error, seconds))
            if error <= target or n >= max_samples:
                return n, error, seconds, trajectory
            next_check *= 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", type=int, default=100_000, help="number of arms K")
    parser.add_argument("--objective", default="dapo", help="objective or preset name")
    parser.add_argument("--sigma", type=float, default=1.0, help="std of the old logits")
    parser.add_argument("--shift", type=float, default=0.3, help="std of logits - old logits")
    parser.add_argument("--correct", type=float, default=0.01, help="share of correct arms")
    parser.add_argument("--target", type=float, default=0.01, help="relative L2 error to reach")
    parser.add_argument("--chunk", type=int, default=1 << 20, help="MC samples per batch")
    parser.add_argument("--max-samples", type=int, default=1 << 29, help="MC sample cap")
    parser.add_argument("--repeats", type=int, default=20, help="timed exact calls (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)"
    )
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    obj = get_objective(args.objective)
    logits, old, probs = make_problem(args.arms, args.sigma, args.shift, args.correct, args.seed)
    ratio = torch.softmax(logits, -1) / torch.softmax(old, -1)
    print(
        f"K = {args.arms} arms, {int(probs.sum())} correct; objective {obj!r}; population "
        f"advantage; ratios in [{ratio.min():.3f}, {ratio.max():.3f}]; "
        f"{torch.get_num_threads()} threads"
    )
    exact, t_exact = time_exact(obj, logits, old, probs, args.repeats)
    print(f"exact:       {t_exact * 1e3:9.2f} ms  (median of {args.repeats} calls)")
    n, error, t_mc, trajectory = monte_carlo(
        obj,
        logits,
        old,
        probs,
        exact,
        target=args.target,
        chunk=args.chunk,
        max_samples=args.max_samples,
        seed=args.seed,
    )
    for n_i, err_i, t_i in trajectory:
        print(f"  MC N = {n_i:>11,d}  relative error {err_i:7.4f}  {t_i:8.2f} s")
    reached = "reached" if error <= args.target else "NOT reached (cap)"
    print(
        f"Monte Carlo: {t_mc * 1e3:9.2f} ms  for N = {n:,d} samples, error {error:.4f} ({reached})"
    )
    print(f"speed ratio (Monte Carlo / exact): {t_mc / t_exact:,.0f}x  (target >= 100x)")


if __name__ == "__main__":
    main()
