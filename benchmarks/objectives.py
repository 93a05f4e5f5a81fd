"""CPU benchmark of the policy objectives, with a check against verl's own policy losses.

What it measures
----------------
One batch of float32 tensors ``[B, T]`` (default 256 x 2048) on the CPU: ``logp_old`` realistic
log-probs (most tokens confident, a tail of unlikely ones), ``logp = logp_old + noise`` (a leaf
with ``requires_grad``), one advantage per sequence ``adv [B, 1]`` of both signs, and a ragged
``mask`` (sequence lengths drawn in ``[T/8, T]``). For every objective of
``sandbox.objectives.available_objectives()`` (or ``--objectives``):

* **time** of one forward + backward, ``obj(logp, logp_old, adv, mask)`` then
  ``aggregate(out.loss, mask, mode)`` then ``.backward()``: ``--warmup`` calls, then the median of
  ``--repeats`` calls (torch's default number of threads);
* **bandwidth**: (bytes of the inputs read, logp + logp_old + adv + mask, plus the bytes of the
  gradient written) / time, as a fraction of the bandwidth of a plain ``dst.copy_(src)`` of one
  ``[B, T]`` float32 tensor (read + write) timed in the same run. 1.0 would mean the objective costs
  no more than a single fused pass over its inputs; at the default size the tensors are 2 MiB
  each, so on most CPUs this is cache, not DRAM, bandwidth;
* **verl** (when ``verl`` is importable): verl's own ``vanilla``, ``gspo``, ``cispo``, ``sapo``,
  ``clip_cov`` and ``kl_cov`` losses from ``verl.trainer.ppo.core_algos``, timed on the same
  tensors with the same protocol and aggregation (sandbox and verl calls interleaved, so that
  load drift cancels in the ratio), the time ratio sandbox/verl, and whether the aggregated loss
  and the gradient on ``logp`` agree (relative tolerance 1e-4). Both sides get the same bool mask,
  as verl's trainer does (``response_mask.to(bool)`` in ``verl.workers.utils.losses.ppo_loss``).

The pairs and the parameters both sides use:

==========  ==========  =====================================================================
sandbox     verl        parameters (sandbox -> verl ActorConfig)
==========  ==========  =====================================================================
ppo_clip    vanilla     eps_low=eps_high=0.2, clip_c=3.0 -> clip_ratio(_low/_high)=0.2,
                        clip_ratio_c=3.0 (verl always applies its dual clip)
gspo        gspo        eps 3e-4 / 4e-4 -> clip_ratio_low=3e-4, clip_ratio_high=4e-4
cispo       cispo       absolute ratio bounds [lower, upper] = [0.8, 1.2] ->
                        clip_ratio_low = 1 - lower, clip_ratio_high = upper - 1
sapo        sapo        tau_pos=1.0, tau_neg=1.05 (verl hard-wires seq-mean-token-mean, so this
                        pair is aggregated with that mode whatever ``--agg`` says)
clip_cov    clip_cov    eps 0.2/0.2, no dual clip, clip_cov_ratio=2e-4, lb=1, ub=5. verl draws
                        the clipped tokens with ``torch.randperm`` on the global RNG: the values
                        are compared with both sides seeded alike and, when that draw cannot
                        be aligned, in a deterministic setting (clip_cov_ratio=1, every
                        candidate clipped); otherwise the pair is "timing only"
kl_cov      kl_cov      kl_cov_ratio=2e-3, ppo_kl_coef=1.0 (the top-k pick is deterministic)
==========  ==========  =====================================================================

How to run (from the repository root)::

    python benchmarks/objectives.py                          # 256 x 2048, every objective
    python benchmarks/objectives.py --B 8 --T 64 --repeats 3 # quick smoke run
    python benchmarks/objectives.py --objectives ppo_clip gspo --agg seq-mean-token-mean
    python benchmarks/objectives.py --csv results/objectives.csv --no-verl
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

try:  # `python benchmarks/objectives.py` puts benchmarks/, not the repository root, on sys.path
    import sandbox.objectives  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.aggregate import aggregate
from sandbox.objectives import available_objectives, get_objective

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOSS_RTOL = 1e-4  # on the aggregated scalar (float32 sums over ~4e5 tokens)
GRAD_RTOL = 1e-4  # max |g_sandbox - g_verl| / max |g_verl|


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


@dataclass
class Data:
    logp: torch.Tensor  # [B, T] leaf, requires_grad
    logp_old: torch.Tensor  # [B, T]
    adv: torch.Tensor  # [B, 1], both signs
    mask: torch.Tensor  # [B, T] bool, ragged

    @property
    def bytes_moved(self) -> int:
        """Inputs read (logp, logp_old, adv, mask) plus the gradient on logp written."""
        inputs = sum(t.nelement() * t.element_size() for t in (self.logp, self.logp_old))
        inputs += self.adv.nelement() * self.adv.element_size()
        inputs += self.mask.nelement() * self.mask.element_size()
        return inputs + self.logp.nelement() * self.logp.element_size()


def make_data(B: int, T: int, seed: int, noise: float) -> Data:
    g = torch.Generator().manual_seed(seed)
    # log sigmoid of N(2.5, 2^2) logits: median p ~ 0.92, a tail of tokens with p << 0.1.
    logp_old = F.logsigmoid(2.0 * torch.randn(B, T, generator=g) + 2.5)
    logp = (logp_old + noise * torch.randn(B, T, generator=g)).clamp(max=0.0)
    adv = torch.randn(B, 1, generator=g).abs() + 0.05
    adv[1::2] *= -1.0  # alternate signs: both signs always present
    lengths = torch.randint(max(1, T // 8), T + 1, (B,), generator=g)
    lengths[0] = T  # at least one full-length sequence
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return Data(logp.requires_grad_(), logp_old, adv, mask)


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def median_times(fns: list[Callable[[], Any]], warmup: int, repeats: int) -> list[float]:
    """Median wall time (s) of each ``fn()``, after ``warmup`` untimed rounds.

    The calls are interleaved (f0, f1, f0, f1, ...) so that drift in the machine's load affects
    every function alike and their ratio stays meaningful on a shared or throttled CPU.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def median_time(fn: Callable[[], Any], warmup: int, repeats: int) -> float:
    return median_times([fn], warmup, repeats)[0]


def copy_bandwidth(data: Data, warmup: int, repeats: int) -> tuple[float, float]:
    """(seconds, bytes/s) of ``dst.copy_(src)`` for one ``[B, T]`` float32 tensor."""
    src = data.logp_old.clone()
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), warmup, max(repeats, 50))
    return t, 2 * src.nelement() * src.element_size() / t


# --------------------------------------------------------------------------------------------------
# Sandbox and verl steps (forward + aggregation + backward)
# --------------------------------------------------------------------------------------------------


def sandbox_step(obj, data: Data, agg: str, gen: torch.Generator, validate: bool):
    kwargs = {"generator": gen} if validate else {"generator": gen, "validate": False}

    def step() -> torch.Tensor:
        data.logp.grad = None
        out = obj(data.logp, data.logp_old, data.adv, data.mask, **kwargs)
        loss = aggregate(out.loss, data.mask, mode=agg)
        loss.backward()
        return loss.detach()

    return step


def verl_step(fn, cfg, data: Data, agg: str):
    adv = data.adv.expand_as(data.logp_old)  # verl indexes advantages as [B, T]

    def step() -> torch.Tensor:
        data.logp.grad = None
        loss, _metrics = fn(
            old_log_prob=data.logp_old,
            log_prob=data.logp,
            advantages=adv,
            response_mask=data.mask,
            loss_agg_mode=agg,
            config=cfg,
            rollout_is_weights=None,
        )
        loss.backward()
        return loss.detach()

    return step


def run_once(step, data: Data, seed: int, gen: torch.Generator) -> tuple[float, torch.Tensor]:
    """Loss and gradient of one call, with the global RNG and ``gen`` seeded alike first."""
    torch.manual_seed(seed)
    gen.manual_seed(seed)
    loss = step()
    return float(loss), data.logp.grad.detach().clone()


# --------------------------------------------------------------------------------------------------
# verl pairs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    sandbox: str  # sandbox objective name
    verl: str  # verl policy-loss name
    params: dict[str, Any]  # sandbox keyword arguments
    actor: dict[str, Any]  # verl ActorConfig fields
    policy_loss: dict[str, Any] = field(default_factory=dict)  # verl PolicyLossConfig fields
    agg: str | None = None  # aggregation forced by verl for this loss
    stochastic: bool = False  # verl draws with the global RNG
    deterministic_params: dict[str, Any] | None = None  # sandbox params making the draw moot
    deterministic_policy_loss: dict[str, Any] | None = None


CISPO_LOWER, CISPO_UPPER = 0.8, 1.2

PAIRS = (
    Pair(
        "ppo_clip",
        "vanilla",
        {"eps_low": 0.2, "eps_high": 0.2, "clip_c": 3.0},
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0},
    ),
    Pair(
        "gspo",
        "gspo",
        {"eps_low": 3e-4, "eps_high": 4e-4},
        {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    ),
    Pair(
        "cispo",
        "cispo",
        {"lower": CISPO_LOWER, "upper": CISPO_UPPER},
        {"clip_ratio_low": 1.0 - CISPO_LOWER, "clip_ratio_high": CISPO_UPPER - 1.0},
    ),
    Pair(
        "sapo",
        "sapo",
        {"tau_pos": 1.0, "tau_neg": 1.05},
        {"tau_pos": 1.0, "tau_neg": 1.05},
        agg="seq-mean-token-mean",
    ),
    Pair(
        "clip_cov",
        "clip_cov",
        {
            "eps_low": 0.2,
            "eps_high": 0.2,
            "clip_c": None,
            "clip_cov_ratio": 2e-4,
            "clip_cov_lb": 1.0,
            "clip_cov_ub": 5.0,
        },
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2},
        {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
        stochastic=True,
        deterministic_params={"clip_cov_ratio": 1.0},
        deterministic_policy_loss={"clip_cov_ratio": 1.0},
    ),
    Pair(
        "kl_cov",
        "kl_cov",
        {"kl_cov_ratio": 2e-3, "ppo_kl_coef": 1.0},
        {},
        {"kl_cov_ratio": 2e-3, "ppo_kl_coef": 1.0},
    ),
)


def load_verl():
    """``(version, get_policy_loss_fn, make_config)`` or ``None`` if verl cannot be imported."""
    try:
        import verl
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from verl.workers.config import ActorConfig, PolicyLossConfig
    except Exception as exc:  # verl pulls in many optional dependencies
        print(f"verl not importable ({type(exc).__name__}: {exc}); sandbox timings only.")
        return None

    def make_config(actor: dict[str, Any], policy_loss: dict[str, Any]) -> ActorConfig:
        # strategy and rollout_n are MISSING by default, and __post_init__ wants a micro batch
        # size; global_batch_info stays {} so agg_loss runs with dp_size = 1 (local batch).
        return ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            policy_loss=PolicyLossConfig(**policy_loss),
            **actor,
        )

    return verl.__version__, get_policy_loss_fn, make_config


def compare(sb, vl) -> tuple[bool, float, bool, float]:
    """(loss agrees, loss rel. error, grad agrees, grad rel. error) of two (loss, grad) results."""
    (ls, gs), (lv, gv) = sb, vl
    loss_err = abs(ls - lv) / max(abs(lv), 1e-12)
    grad_err = float((gs - gv).abs().max() / gv.abs().max().clamp(min=1e-30))
    return loss_err <= LOSS_RTOL, loss_err, grad_err <= GRAD_RTOL, grad_err


def verdict(ok_loss: bool, ok_grad: bool) -> str:
    return {(True, True): "match", (True, False): "loss only", (False, True): "grad only"}.get(
        (ok_loss, ok_grad), "MISMATCH"
    )


def check_pair(pair: Pair, data, agg, gen, validate, seed, get_fn, make_config) -> dict[str, Any]:
    """Value and gradient agreement of one pair, at the timing parameters or a deterministic set."""
    fn = get_fn(pair.verl)

    def both(params: dict[str, Any], policy_loss: dict[str, Any]):
        sb = sandbox_step(get_objective(pair.sandbox, **params), data, agg, gen, validate)
        vl = verl_step(fn, make_config(pair.actor, policy_loss), data, agg)
        return compare(run_once(sb, data, seed, gen), run_once(vl, data, seed, gen))

    ok_l, err_l, ok_g, err_g = both(pair.params, pair.policy_loss)
    note = (
        "matched at these params (the random pick had no effect or coincided)"
        if pair.stochastic and ok_l and ok_g
        else ""
    )
    if pair.stochastic and not (ok_l and ok_g):
        if pair.deterministic_params is None:
            return {"check": "timing only", "loss_relerr": err_l, "grad_relerr": err_g}
        ok_l, err_l, ok_g, err_g = both(
            pair.params | pair.deterministic_params,
            pair.policy_loss | (pair.deterministic_policy_loss or {}),
        )
        setting = ", ".join(f"{k}={v}" for k, v in pair.deterministic_params.items())
        note = f"timing only at these params (random pick); values checked at {setting}"
    return {
        "check": verdict(ok_l, ok_g),
        "loss_relerr": err_l,
        "grad_relerr": err_g,
        "note": note,
    }


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def fmt_params(params: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--B", type=int, default=256, help="sequences (default 256)")
    p.add_argument("--T", type=int, default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls, median reported")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first")
    p.add_argument("--objectives", nargs="+", default=None, help="default: every registered one")
    p.add_argument("--agg", default="token-mean", choices=AGG_MODES, help="aggregation mode")
    p.add_argument("--noise", type=float, default=0.1, help="std of logp - logp_old")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--validate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let the sandbox validate its inputs (its default; --no-validate skips the check)",
    )
    p.add_argument("--no-verl", action="store_true", help="skip the verl comparison")
    p.add_argument("--csv", type=Path, default=None, help="also write the table to this CSV")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_args(argv)
    names = args.objectives or available_objectives()
    if not names:
        raise SystemExit("sandbox.objectives.available_objectives() is empty")
    unknown = sorted(set(names) - set(available_objectives()))
    if unknown:
        raise SystemExit(f"unknown objectives {unknown}; available: {available_objectives()}")

    data = make_data(args.B, args.T, args.seed, args.noise)
    gen = torch.Generator().manual_seed(args.seed)
    verl = None if args.no_verl else load_verl()
    pairs = {p.sandbox: p for p in PAIRS} if verl else {}

    t_copy, bw_copy = copy_bandwidth(data, args.warmup, args.repeats)
    fill = data.mask.float().mean().item()
    print(
        f"B={args.B} T={args.T} float32 on CPU, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, mask fill {fill:.2f}, agg {args.agg}, "
        f"median of {args.repeats} after {args.warmup} warm-up calls"
    )
    print(f"copy [B,T] float32: {t_copy * 1e3:.3f} ms = {bw_copy / 1e9:.1f} GB/s (read + write)")
    if verl:
        print(f"verl {verl[0]}: pairs {', '.join(f'{p.sandbox}~{p.verl}' for p in PAIRS)}")
    print()

    rows = []
    for name in names:
        pair = pairs.get(name)
        params = pair.params if pair else {}
        agg = pair.agg if pair and pair.agg else args.agg
        row: dict[str, Any] = {"objective": name, "agg": agg}
        try:
            obj = get_objective(name, **params)
            row["params"] = fmt_params(getattr(obj, "params", params))
            step = sandbox_step(obj, data, agg, gen, args.validate)
        except Exception as exc:
            row["note"] = f"sandbox error: {type(exc).__name__}: {exc}"
            rows.append(row)
            print(f"{name}: {row['note']}")
            continue
        vstep = None
        if pair:
            _, get_fn, make_config = verl
            row["verl"] = pair.verl
            try:
                cfg = make_config(pair.actor, pair.policy_loss)
                vstep = verl_step(get_fn(pair.verl), cfg, data, agg)
                row |= check_pair(
                    pair, data, agg, gen, args.validate, args.seed, get_fn, make_config
                )
            except Exception as exc:
                row["note"] = f"verl error: {type(exc).__name__}: {exc}"
                vstep = None
        if vstep is None:
            t = median_time(step, args.warmup, args.repeats)
        else:  # interleaved with verl, so that the ratio survives load drift
            t, tv = median_times([step, vstep], args.warmup, args.repeats)
            row |= {"verl_ms": tv * 1e3, "sandbox/verl": t / tv}
        bw = data.bytes_moved / t
        row |= {"sandbox_ms": t * 1e3, "GB/s": bw / 1e9, "frac_of_copy": bw / bw_copy}
        if agg != args.agg:
            row["note"] = "; ".join(s for s in (row.get("note", ""), f"verl forces {agg}") if s)
        rows.append(row)

    columns = [
        "objective",
        "params",
        "agg",
        "sandbox_ms",
        "GB/s",
        "frac_of_copy",
        "verl",
        "verl_ms",
        "sandbox/verl",
        "check",
        "loss_relerr",
        "grad_relerr",
        "note",
    ]
    table = pd.DataFrame(rows).reindex(columns=columns)
    table = table.dropna(axis=1, how="all")
    shown = table.drop(columns=["params"], errors="ignore")  # listed below the table instead
    with pd.option_context("display.width", 250, "display.max_colwidth", 90):
        print(
            shown.to_string(
                index=False,
                na_rep="",
                formatters={
                    "sandbox_ms": "{:.2f}".format,
                    "verl_ms": "{:.2f}".format,
                    "GB/s": "{:.2f}".format,
                    "frac_of_copy": "{:.3f}".format,
                    "sandbox/verl": "{:.2f}".format,
                    "loss_relerr": "{:.1e}".format,
                    "grad_relerr": "{:.1e}".format,
                },
            )
        )
    if "params" in table:
        print("\nparameters:")
        for row in table.to_dict("records"):
            print(
                f"  {row['objective']:>9s}: {row['params'] if isinstance(row['params'], str) else ''}"
            )
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")

    if "sandbox/verl" in table:
        print()
        for row in table.dropna(subset=["sandbox/verl"]).to_dict("records"):
            print(
                f"{row['objective']:>9s} vs verl {row['verl']:<8s}: "
                f"sandbox/verl time ratio = {row['sandbox/verl']:.2f} (target <= 1)"
            )
    return table


if __name__ == "__main__":
    main()
