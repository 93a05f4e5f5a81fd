"""Benchmark of the policy objectives on CPU or CUDA, against a verl-style rule and a tensor copy.

What it measures
----------------
One batch ``[B, T]`` (default 256 x 2048 on CPU, 512 x 8192 on CUDA) on ``--device``:
``logp_old`` realistic log-probs (most tokens confident, a tail of unlikely ones), ``logp =
logp_old + noise`` (a leaf with ``requires_grad``), one advantage per sequence ``adv [B, 1]`` of
both signs, and a ragged ``mask`` (sequence lengths drawn in ``[T/8, T]``), in ``--dtype``. Each
row times one forward + backward, median of ``--repeats`` calls after ``--warmup`` (interleaved,
so that load drift cancels in the ratios; on CUDA each call is timed with CUDA events after a
synchronize, so the time is the span from the first launch to the last kernel's end):

* ``copy``: ``dst.copy_(src)`` of one ``[B, T]`` tensor, the floor of any pass over the batch;
* ``verl_style``: verl's ``compute_policy_loss_vanilla`` + ``agg_loss("token-mean")`` written out
  in a few torch lines (:func:`verl_style_ppo_clip`: clamp ±20, exp, the two-sided PPO loss, dual
  clip c = 3, the clip fractions and ppo_kl metrics, masked token-mean), on ``adv [B, T]`` as verl
  receives it. It is the reference of every ratio (``x_verl``); the run checks that the sandbox's
  ``ppo_clip`` with the same parameters gives the same loss and gradient;
* every sandbox objective (``--objectives``; default all), ``obj(logp, logp_old, adv, mask,
  validate=False)`` then ``aggregate(out.loss, mask, mode, validate=False)`` then ``.backward()``,
  the trainers' hot path (``--validate`` adds the value check and its one host read). With
  ``--compile`` the objectives run compiled (``get_objective(name, compile=True)``, the default
  inductor backend; the compile happens in the warm-up) and a ``verl_style (compiled)`` row is
  added for reference; the ratios stay against the eager verl-style rule, the way verl runs.
  Objectives with verl counterparts take verl's parameters (table below), the others their
  defaults;
* **verl** (when ``verl`` is importable and ``--no-verl`` is not given): verl's own ``vanilla``,
  ``gspo``, ``cispo``, ``sapo``, ``clip_cov`` and ``kl_cov`` losses from
  ``verl.trainer.ppo.core_algos``, timed on the same tensors, the ratio sandbox/verl, and whether
  the aggregated loss and the gradient on ``logp`` agree (relative tolerance 1e-4; both sides get
  the same bool mask, as verl's trainer does).

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

    python benchmarks/objectives.py                          # CPU, 256 x 2048, every objective
    python benchmarks/objectives.py --device cuda --compile  # GPU, 512 x 8192, compiled rules
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
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOSS_RTOL = 1e-4  # on the aggregated scalar (float32 sums over ~4e5 tokens)
GRAD_RTOL = 1e-4  # max |g_sandbox - g_verl| / max |g_verl|
VERL_STYLE = {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 3.0}  # verl's defaults


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


@dataclass
class Data:
    logp: torch.Tensor  # [B, T] leaf, requires_grad
    logp_old: torch.Tensor  # [B, T]
    adv: torch.Tensor  # [B, 1], both signs
    mask: torch.Tensor  # [B, T] bool, ragged


def make_data(B: int, T: int, seed: int, noise: float, device: str, dtype: torch.dtype) -> Data:
    g = torch.Generator().manual_seed(seed)
    # log sigmoid of N(2.5, 2^2) logits: median p ~ 0.92, a tail of tokens with p << 0.1.
    logp_old = F.logsigmoid(2.0 * torch.randn(B, T, generator=g) + 2.5)
    logp = (logp_old + noise * torch.randn(B, T, generator=g)).clamp(max=0.0)
    adv = torch.randn(B, 1, generator=g).abs() + 0.05
    adv[1::2] *= -1.0  # alternate signs: both signs always present
    lengths = torch.randint(max(1, T // 8), T + 1, (B,), generator=g)
    lengths[0] = T  # at least one full-length sequence
    mask = torch.arange(T)[None, :] < lengths[:, None]
    on = {"device": device, "dtype": dtype}
    return Data(logp.to(**on).requires_grad_(), logp_old.to(**on), adv.to(**on), mask.to(device))


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def time_call(fn: Callable[[], Any], device: str) -> float:
    """Seconds of one ``fn()``: wall time on CPU; on CUDA, CUDA events around the call after a
    synchronize (the span from the first launch to the end of the last kernel)."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def median_times(
    fns: list[Callable[[], Any]], warmup: int, repeats: int, device: str = "cpu"
) -> list[float]:
    """Median time (s) of each ``fn()``, after ``warmup`` untimed rounds.

    The calls are interleaved (f0, f1, f0, f1, ...) so that drift in the machine's load affects
    every function alike and their ratio stays meaningful on a shared or throttled machine.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            ts.append(time_call(fn, device))
    return [statistics.median(ts) for ts in times]


def median_time(fn: Callable[[], Any], warmup: int, repeats: int, device: str = "cpu") -> float:
    return median_times([fn], warmup, repeats, device)[0]


# --------------------------------------------------------------------------------------------------
# The steps: a copy, the verl-style rule, sandbox and verl (forward + aggregation + backward)
# --------------------------------------------------------------------------------------------------


def verl_style_ppo_clip(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl 0.9's ``compute_policy_loss_vanilla`` with ``agg_loss(..., "token-mean")``, line for
    line in plain torch (``adv`` and ``mask`` ``[B, T]``, as verl receives them)."""

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum() / mask.sum()

    negative_approx_kl = torch.clamp(logp - logp_old, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float())
    pg_losses3 = -adv * clip_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (adv < 0).float())
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    loss = masked_mean(pg_losses)
    return loss, {"pg_clipfrac": pg_clipfrac, "ppo_kl": ppo_kl, "lower": pg_clipfrac_lower}


def copy_step(data: Data) -> Callable[[], Any]:
    src = data.logp_old.clone()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def verl_style_step(data: Data, compiled: bool = False) -> Callable[[], torch.Tensor]:
    adv = data.adv.expand_as(data.logp_old).contiguous()  # verl indexes advantages as [B, T]
    fn = torch.compile(verl_style_ppo_clip) if compiled else verl_style_ppo_clip

    def step() -> torch.Tensor:
        data.logp.grad = None
        loss, _metrics = fn(data.logp, data.logp_old, adv, data.mask, **VERL_STYLE)
        loss.backward()
        return loss.detach()

    return step


def sandbox_step(
    obj, data: Data, agg: str, gen: torch.Generator, validate: bool, whole: bool = False
) -> Callable[[], torch.Tensor]:
    """Objective -> aggregate -> backward. ``whole=True`` compiles objective + aggregation as one
    graph (the pattern documented in ``sandbox.objectives``; deterministic objectives only)."""

    def loss_fn(logp, logp_old, adv, mask):
        out = obj(logp, logp_old, adv, mask, generator=gen, validate=validate)
        return aggregate(out.loss, mask, mode=agg, validate=validate)

    fn = torch.compile(loss_fn, fullgraph=True) if whole else loss_fn

    def step() -> torch.Tensor:
        data.logp.grad = None
        loss = fn(data.logp, data.logp_old, data.adv, data.mask)
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
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--dtype", default="float32", choices=tuple(DTYPES), help="of logp, logp_old, adv"
    )
    p.add_argument("--B", type=int, default=None, help="sequences (256 on CPU, 512 on CUDA)")
    p.add_argument("--T", type=int, default=None, help="tokens per sequence (2048 CPU, 8192 CUDA)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls, median reported")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (compiles, too)")
    p.add_argument("--objectives", nargs="+", default=None, help="default: every registered one")
    p.add_argument("--agg", default="token-mean", choices=AGG_MODES, help="aggregation mode")
    p.add_argument("--noise", type=float, default=0.1, help="std of logp - logp_old")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compile",
        nargs="?",
        const="objective",
        default=None,
        choices=("objective", "step"),
        help="time compiled objectives: get_objective(name, compile=True) ('objective', the "
        "default), or objective + aggregation compiled as one graph ('step'; stochastic "
        "objectives fall back to 'objective')",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--validate",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="let the sandbox validate its inputs (one host read per call; trainers validate "
        "their first step only, so the hot path is --no-validate, the default here)",
    )
    p.add_argument("--no-verl", action="store_true", help="skip the comparison with verl itself")
    p.add_argument("--csv", type=Path, default=None, help="also write the table to this CSV")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch build sees no CUDA device")
    cuda = args.device == "cuda"
    args.B = args.B or (512 if cuda else 256)
    args.T = args.T or (8192 if cuda else 2048)
    return args


def baseline_rows(args: argparse.Namespace, data: Data, gen: torch.Generator) -> list[dict]:
    """The copy and the verl-style rule (eager, and compiled with --compile), timed together; the
    verl-style rule's values checked against the sandbox's ppo_clip with the same parameters."""
    steps = {"copy": copy_step(data), "verl_style": verl_style_step(data)}
    if args.compile:
        steps["verl_style (compiled)"] = verl_style_step(data, compiled=True)
    times = median_times(list(steps.values()), args.warmup, max(args.repeats, 50), args.device)
    ppo = get_objective("ppo_clip", eps_low=0.2, eps_high=0.2, clip_c=3.0)
    sb = run_once(sandbox_step(ppo, data, "token-mean", gen, False), data, args.seed, gen)
    vs = run_once(steps["verl_style"], data, args.seed, gen)
    ok_l, err_l, ok_g, err_g = compare(sb, vs)
    check = {"check": verdict(ok_l, ok_g), "loss_relerr": err_l, "grad_relerr": err_g}
    t_verl = times[1]
    rows = []
    for (name, _), t in zip(steps.items(), times, strict=True):
        row = {"objective": name, "ms": t * 1e3, "x_verl": t / t_verl, "x_copy": t / times[0]}
        if name == "verl_style":
            row |= check | {"note": "ppo_clip(0.2, 0.2, clip_c=3) vs this rule"}
        rows.append(row)
    return rows


def objective_row(name, args, data, gen, pair, verl) -> dict:
    """Time one sandbox objective interleaved with the verl-style rule, the copy (and verl's own
    rule, when verl is importable)."""
    params = pair.params if pair else {}
    agg = pair.agg if pair and pair.agg else args.agg
    row: dict[str, Any] = {"objective": name, "agg": agg}
    whole = args.compile == "step" and not get_objective(name).stochastic
    obj = get_objective(name, compile=args.compile == "objective", **params)
    if args.compile == "step" and not whole:
        obj.compile()
    row["params"] = fmt_params(obj.params)
    step = sandbox_step(obj, data, agg, gen, args.validate, whole=whole)
    fns = [step, verl_style_step(data), copy_step(data)]
    if pair and verl:
        _, get_fn, make_config = verl
        row["verl"] = pair.verl
        try:
            fns.append(
                verl_step(get_fn(pair.verl), make_config(pair.actor, pair.policy_loss), data, agg)
            )
            row |= check_pair(pair, data, agg, gen, args.validate, args.seed, get_fn, make_config)
        except Exception as exc:  # verl pulls in many optional dependencies
            row["note"] = f"verl error: {type(exc).__name__}: {exc}"
    times = median_times(fns, args.warmup, args.repeats, args.device)
    # the ratios to the verl-style rule and the copy timed in the same rounds
    row |= {"ms": times[0] * 1e3, "x_verl": times[0] / times[1], "x_copy": times[0] / times[2]}
    if len(times) == 4:
        row |= {"verl_ms": times[3] * 1e3, "sandbox/verl": times[0] / times[3]}
    if agg != args.agg:
        row["note"] = "; ".join(s for s in (row.get("note", ""), f"verl forces {agg}") if s)
    return row


COLUMNS = [
    "objective",
    "params",
    "agg",
    "ms",
    "x_verl",
    "x_copy",
    "verl",
    "verl_ms",
    "sandbox/verl",
    "check",
    "loss_relerr",
    "grad_relerr",
    "note",
]
FORMATS = {
    "ms": "{:.3f}".format,
    "verl_ms": "{:.3f}".format,
    "x_verl": "{:.2f}".format,
    "x_copy": "{:.1f}".format,
    "sandbox/verl": "{:.2f}".format,
    "loss_relerr": "{:.1e}".format,
    "grad_relerr": "{:.1e}".format,
}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    args = parse_args(argv)
    names = args.objectives or available_objectives()
    unknown = sorted(set(names) - set(available_objectives()))
    if unknown:
        raise SystemExit(f"unknown objectives {unknown}; available: {available_objectives()}")

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    data = make_data(args.B, args.T, args.seed, args.noise, args.device, dtype)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    verl = None if args.no_verl else load_verl()
    pairs = {p.sandbox: p for p in PAIRS}

    where = (
        torch.cuda.get_device_name()
        if args.device == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    fill = data.mask.float().mean().item()
    print(
        f"B={args.B} T={args.T} {args.dtype} on {where}, torch {torch.__version__}, "
        f"mask fill {fill:.2f}, agg {args.agg}, objectives {'compiled: ' + args.compile if args.compile else 'eager'}"
        f", validate={args.validate}, median of {args.repeats} after {args.warmup} warm-up calls"
    )
    if verl:
        print(f"verl {verl[0]}: pairs {', '.join(f'{p.sandbox}~{p.verl}' for p in PAIRS)}")
    rows = baseline_rows(args, data, gen)
    for name in names:
        try:
            rows.append(objective_row(name, args, data, gen, pairs.get(name), verl))
        except Exception as exc:
            rows.append({"objective": name, "note": f"error: {type(exc).__name__}: {exc}"})

    table = pd.DataFrame(rows).reindex(columns=COLUMNS).dropna(axis=1, how="all")
    shown = table.drop(columns=["params"], errors="ignore")  # listed below the table instead
    print()
    with pd.option_context("display.width", 250, "display.max_colwidth", 70):
        print(shown.to_string(index=False, na_rep="", formatters=FORMATS))
    print("\nparameters (objectives with a verl counterpart take verl's):")
    for row in table.dropna(subset=["params"]).to_dict("records"):
        print(f"  {row['objective']:>9s}: {row['params']}")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")
    print("\ntime ratio to the verl-style rule (eager, token-mean), each timed in the same rounds:")
    for row in table.dropna(subset=["x_verl"]).to_dict("records"):
        own = row.get("sandbox/verl")
        extra = f", vs verl's own {row['verl']}: {own:.2f}" if pd.notna(own) else ""
        print(
            f"  {row['objective']:>22s}: {row['x_verl']:.2f}  ({row['x_copy']:.0f}x a copy{extra})"
        )
    return table


if __name__ == "__main__":
    main()
