"""CPU-measurable proxies of GPU speed for K runs (``benchmarks/llm_throughput.py --proxy``).

A small model on a GPU is launch- and sync-bound, not compute-bound (issue 28), so what a CPU
can count predicts much of its speed: operators dispatched per run-step (each is at least one
kernel launch on a GPU, unless a compiled graph fuses it), device-to-host reads per run-step
(each stalls the GPU's queue), and FLOPs per run-step (the work itself, which batching must not
grow). Counted here on the tiny Llama, with the same llm.train step at K = 1, 8, 16:

today     each run alone (``llm.train``, HF ``generate``, dynamic cache): a run-step's
          operators do not depend on K, so K = 1 stands for every K;
ensemble  ``llm.ensemble`` with the hf backend (the vmapped training forward; each member's
          rollout generated alone);
batched   ``llm.ensemble`` with ``--rollout-backend compact`` (every member decoded in one loop,
          :mod:`llm.decode`); at K = 1 the run alone with the compact decoder.

Counting: a ``TorchDispatchMode`` counts every aten operator dispatched during steps 1 and 2
(after a step of warm-up; the step boundaries are the rollout phase's start), divided by K x 2.
Host reads: ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``) plus the calls of
``Tensor.cpu``, ``.tolist`` and ``.numpy`` (on a GPU run each reads device memory; on the CPU
they are counted by call). FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over the same
steps; printed with them, the prefill's share (batched path: the FLOPs of
:func:`llm.decode.prefill`, one forward per distinct prompt, over the run-step's). Graph breaks
and recompiles: ``torch._dynamo`` counters over 3 steps of the batched path with
``--generate-compile on`` (the compiled decoding step), counted without the dispatch mode.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import math
import os
import platform
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: the step counted (the committed ``results/proxy``'s); ``llm_throughput.py --proxy`` replaces its
#: shape with the ``--prompts``, ``--group-size``, ``--max-new-tokens``, ``--epochs``,
#: ``--minibatches``, ``--lr`` and ``--digits`` given (:func:`step_settings`)
SETTINGS = dict(
    model="tiny",
    task="addition",
    task_knobs={"digits": 1},
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=8,
    epochs=2,
    minibatches=2,
    lr=1e-3,
    progress=False,
    save_model=False,
    device="cpu",
)
#: ``--smoke``: the smallest step that still has two updates (seconds instead of minutes)
SMOKE = dict(prompts_per_step=2, group_size=2, max_new_tokens=4, epochs=1, minibatches=2)
MEASURED = (1, 2)  # the steps counted (step 0 warms up)
COLUMNS = (
    "path",
    "K",
    "ops_per_run_step",
    "host_reads_per_run_step",
    "gflop_per_run_step",
    "ops_ratio_to_K1",
)
#: printed, not in the CSV: the prefill's share of the FLOPs (batched path)
PREFILL = "prefill_flop_share"


#: The phases of a step, as the per-phase breakdown names them: the rollout's ``decode`` (sampling
#: and rewards) and ``old logp`` (the old and reference log-probs of the completions), the
#: update's ``forward`` (the training forward and LM head), ``loss`` (the members'
#: :class:`sandbox.loss.PolicyLoss` calls), ``backward``, ``clip`` (gradient norms and clipping),
#: ``optimizer`` (step and zero_grad), ``update other`` (the rest of the update: minibatch order,
#: slicing and stacking of batches, metrics) and ``score, log`` (advantages, logging, evaluation:
#: everything outside the rollout and the update).
PHASES = (
    "decode",
    "old logp",
    "forward",
    "loss",
    "backward",
    "clip",
    "optimizer",
    "update other",
    "score, log",
)
#: ``(module, attribute path, phase, outer phase)``: the functions whose calls inside the outer
#: phase are counted under ``phase`` (the innermost wins); a path that a module lacks is skipped
PHASE_FUNCTIONS = (
    ("llm.train", "logprobs", "old logp", "decode"),
    ("llm.ensemble", "old_logp", "old logp", "decode"),
    ("llm.ensemble", "Ensemble.completion_logp", "forward", "update other"),
    ("llm.train", "forward_logp", "forward", "update other"),
    ("sandbox.loss", "PolicyLoss.__call__", "loss", "update other"),
    ("torch", "Tensor.backward", "backward", "update other"),
    ("torch.nn.utils", "clip_grad_norm_", "clip", "update other"),
    ("llm.ensemble", "clip_members", "clip", "update other"),
    ("torch.optim", "Optimizer.zero_grad", "optimizer", "update other"),
    ("torch.optim", "AdamW.step", "optimizer", "update other"),
    ("llm.ensemble", "StackedAdamW.step", "optimizer", "update other"),
)


class Counter(TorchDispatchMode):
    """Operators dispatched and host reads (``_local_scalar_dense``), while ``on``; operators per
    phase (:data:`PHASES`) in ``by_phase``, the phase being the top of ``phases``."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.ops = 0
        self.reads = 0
        self.phases = ["score, log"]
        self.by_phase = dict.fromkeys(PHASES, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on:
            self.ops += 1
            self.reads += func is torch.ops.aten._local_scalar_dense.default
            self.by_phase[self.phases[-1]] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def outer(self, name: str) -> Iterator[None]:
        """Count under ``name`` (``decode``, the rollout, or ``update other``) while inside."""
        self.phases = [name]
        try:
            yield
        finally:
            self.phases = ["score, log"]

    @contextlib.contextmanager
    def inner(self, name: str, outer: str) -> Iterator[None]:
        """Count under ``name`` while inside, where ``outer`` is the outer phase (so the rollout's
        own forwards are not the update's)."""
        refine = self.phases[0] == outer
        if refine:
            self.phases.append(name)
        try:
            yield
        finally:
            if refine:
                self.phases.pop()


@contextlib.contextmanager
def counted_phases(counter: Counter) -> Iterator[None]:
    """The :data:`PHASE_FUNCTIONS` wrapped to count under their phase while this is open."""
    import importlib

    patched = []
    for module, path, name, outer in PHASE_FUNCTIONS:
        *owners, attr = path.split(".")
        owner: Any = importlib.import_module(module)
        for part in owners:
            owner = getattr(owner, part, None)
        fn = getattr(owner, attr, None)
        if fn is None:
            continue

        def counted(*args: Any, _fn: Any = fn, _in: tuple = (name, outer), **kwargs: Any) -> Any:
            with counter.inner(*_in):
                return _fn(*args, **kwargs)

        patched.append((owner, attr, fn))
        setattr(owner, attr, functools.wraps(fn)(counted))
    try:
        yield
    finally:
        for owner, attr, fn in reversed(patched):
            setattr(owner, attr, fn)


@contextlib.contextmanager
def cuda_foreach() -> Iterator[None]:
    """A run alone's AdamW and gradient clipping on their multi-tensor (``foreach``) kernels, as
    torch picks them for CUDA tensors; on the CPU it loops over the parameters, so this is the
    fairer denominator for a GPU run alone's launches."""
    adamw, clip = torch.optim.AdamW, torch.nn.utils.clip_grad_norm_

    class ForeachAdamW(adamw):  # a subclass: AdamW.step stays the one the phases wrap
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "foreach": True})

    torch.optim.AdamW = ForeachAdamW
    torch.nn.utils.clip_grad_norm_ = functools.partial(clip, foreach=True)
    try:
        yield
    finally:
        torch.optim.AdamW, torch.nn.utils.clip_grad_norm_ = adamw, clip


@contextlib.contextmanager
def counted_host_calls(counter: Counter) -> Iterator[None]:
    """``Tensor.cpu``, ``.tolist`` and ``.numpy`` calls added to ``counter.reads`` while it is
    on (``.item()`` is already its ``_local_scalar_dense``)."""
    originals = {name: getattr(torch.Tensor, name) for name in ("cpu", "tolist", "numpy")}

    def wrap(name: str, fn: Any) -> Any:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counter.reads += counter.on
            return fn(self, *args, **kwargs)

        counted.__name__ = name
        return counted

    try:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, wrap(name, fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def path_settings(path: str) -> dict[str, Any]:
    if path == "batched":
        return {"rollout_backend": "compact"}
    return {"generate_cache": "dynamic", "generate_compile": "off"}


def train_steps(
    path: str,
    K: int,
    steps: int,
    rollout_hook: Any,
    extra: dict | None = None,
    counter: Counter | None = None,
):
    """``steps`` steps of K runs (seeds 0..K-1) on ``path``; ``rollout_hook(step)`` is called at
    each rollout phase's start; ``counter``: its rollout and update phases marked."""
    import llm.train
    from llm.config import TrainConfig
    from llm.ensemble import train_ensemble

    with tempfile.TemporaryDirectory() as out:
        cfgs = [
            TrainConfig(
                **{**SETTINGS, **path_settings(path), **(extra or {})},
                steps=steps,
                seed=s,
                out=os.path.join(out, str(s)),
            )
            for s in range(K)
        ]
        real = llm.train.loop

        def hooked(runs, update_fn, stop, stop_after, rollout_fn=llm.train.rollout_each):
            def timed(rs: Sequence[Any], step: int) -> Any:
                rollout_hook(step)
                with phase("decode"):
                    return rollout_fn(rs, step)

            def updated(*args: Any) -> Any:
                with phase("update other"):
                    return update_fn(*args)

            return real(runs, updated, stop, stop_after, timed)

        def phase(name: str) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext() if counter is None else counter.outer(name)

        llm.train.loop = hooked
        try:
            if K == 1:
                llm.train.train(cfgs[0])
            else:
                train_ensemble(cfgs)
        finally:
            llm.train.loop = real
        rollout_hook(steps)


@contextlib.contextmanager
def counted_prefill(counter: Counter) -> Iterator[list[int]]:
    """FLOPs of the compact decoder's prefills (:func:`llm.decode.prefill`) while ``counter`` is
    on, summed into the one-element list it yields."""
    from torch.utils.flop_counter import FlopCounterMode

    import llm.decode

    real, total = llm.decode.prefill, [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        if not counter.on:
            return real(*args, **kwargs)
        with FlopCounterMode(display=False) as flops:
            out = real(*args, **kwargs)
        total[0] += flops.get_total_flops()
        return out

    llm.decode.prefill = counted
    try:
        yield total
    finally:
        llm.decode.prefill = real


def measure(path: str, K: int, extra: dict | None = None) -> dict[str, Any]:
    """Operators, host reads and GFLOP per run-step of ``path`` with K runs (steps 1, 2), and
    the prefill's share of the FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    counter, flops = Counter(), FlopCounterMode(display=False)
    first, last = MEASURED[0], MEASURED[-1] + 1

    def hook(step: int) -> None:
        counter.on = first <= step < last
        if step == first:
            flops.__enter__()
        if step == last:
            flops.__exit__(None, None, None)

    counting = (counted_host_calls(counter), counted_prefill(counter), counted_phases(counter))
    with counting[0], counting[1] as prefill, counting[2], counter:
        train_steps(path, K, last, hook, extra, counter)
    runs_steps = K * (last - first)
    total = flops.get_total_flops()
    return {
        "path": path,
        "K": K,
        "phases": {name: n / runs_steps for name, n in counter.by_phase.items()},
        "ops_per_run_step": counter.ops / runs_steps,
        "host_reads_per_run_step": counter.reads / runs_steps,
        "gflop_per_run_step": total / runs_steps / 1e9,
        PREFILL: prefill[0] / total if path == "batched" else float("nan"),
    }


def compile_counters(K: int, extra: dict | None = None) -> dict[str, int]:
    """Graph breaks and recompiles over 3 steps of the batched path with the compiled decoding
    step (``--generate-compile on``)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    train_steps("batched", K, 3, lambda step: None, {**(extra or {}), "generate_compile": "on"})
    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs": counters["stats"]["unique_graphs"],
        "recompiles": max(counters["stats"]["unique_graphs"] - 1, 0),
    }


def share(value: float) -> str:
    """A fraction as a percentage, ``-`` where none was counted (NaN)."""
    return f"{value:.1%}" if math.isfinite(value) else "-"


def phase_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Operators per run-step of each phase (:data:`PHASES`), one line per path and K."""
    lines = ["operators per run-step by phase:"]
    lines.append(f"{'path':<10}{'K':>4}" + "".join(f"{name:>13}" for name in PHASES))
    for r in rows:
        cells = "".join(f"{r['phases'][name]:>13.1f}" for name in PHASES)
        lines.append(f"{r['path']:<10}{r['K']:>4}{cells}")
    return lines


def machine() -> str:
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"{name}, {os.cpu_count()} cores, torch {torch.__version__}"


def step_settings(smoke: bool = False, shape: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings that differ from :data:`SETTINGS`: the :data:`SMOKE` step where ``smoke``,
    then ``shape`` (TrainConfig names, e.g. ``{"group_size": 8}``) over it."""
    return {**(SMOKE if smoke else {}), **(shape or {})}


def run_proxy(
    out: str,
    ks: Sequence[int] = (1, 8, 16),
    compiled: bool = True,
    smoke: bool = False,
    command: str = "",
    shape: dict[str, Any] | None = None,
) -> list[dict]:
    """Every path at every K, printed as ratios and by phase and written to ``out/proxy.csv``,
    ``out/proxy_phases.csv`` and ``out/proxy_compile.csv``, the printed report with its provenance
    (``command``, machine, torch, threads, date, the step's settings) to ``out/proxy.txt``
    (``smoke``, ``shape``: the step, see :func:`step_settings`)."""
    extra = step_settings(smoke, shape)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"command: {command}" if command else "command: llm_proxy.run_proxy")
    say(
        f"proxy figures on {machine()}, {torch.get_num_threads()} threads, "
        f"{datetime.date.today().isoformat()}"
    )
    settings = {**SETTINGS, **extra}
    shown = (f"{k}={v}" for k, v in settings.items() if k not in ("progress", "save_model"))
    say("tiny Llama, " + ", ".join(shown))
    rows = [measure("today", 1, extra)]
    for path in ("ensemble", "batched"):
        for K in ks:
            if K == 1 and path == "ensemble":
                continue  # an ensemble holds two runs or more
            rows.append(measure(path, K, extra))
    base = {r["path"]: r["ops_per_run_step"] for r in rows if r["K"] == 1}
    base["ensemble"] = base["today"]  # the ensemble of one is the run alone on the hf path
    say(
        f"{'path':<10}{'K':>4}{'ops/run-step':>14}{'host reads':>12}{'GFLOP':>10}{'ops / K=1':>11}"
        f"{'prefill':>9}"
    )
    for r in rows:
        r["ops_ratio_to_K1"] = r["ops_per_run_step"] / base[r["path"]]
        say(
            f"{r['path']:<10}{r['K']:>4}{r['ops_per_run_step']:>14.0f}"
            f"{r['host_reads_per_run_step']:>12.1f}{r['gflop_per_run_step']:>10.4f}"
            f"{r['ops_ratio_to_K1']:>11.3f}{share(r[PREFILL]):>9}"
        )
    top = max(ks)
    best = next(r for r in rows if r["path"] == "batched" and r["K"] == top)
    say(
        f"ratio batched K={top} / today, operators per run-step: "
        f"{best['ops_per_run_step'] / base['today']:.3f} (aim <= 0.125)"
    )
    with cuda_foreach():
        foreach = measure("today", 1, extra)["ops_per_run_step"]
    say(
        f"the run alone with CUDA's foreach AdamW and clipping (cuda_foreach): {foreach:.0f} "
        f"operators per run-step; ratio batched K={top} / that: {best['ops_per_run_step'] / foreach:.3f}"
    )
    for line in phase_lines(rows):
        say(line)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "proxy.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: r[k] for k in COLUMNS} for r in rows)
    with open(os.path.join(out, "proxy_phases.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["path", "K", *PHASES], lineterminator="\n")
        writer.writeheader()
        writer.writerows({"path": r["path"], "K": r["K"], **r["phases"]} for r in rows)
    if compiled:
        c = compile_counters(min(ks[-1], 2), extra)
        say(
            f"compiled decoding step, 3 steps: {c['graph_breaks']} graph breaks, "
            f"{c['graphs']} graphs, {c['recompiles']} recompiles"
        )
        with open(os.path.join(out, "proxy_compile.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(c), lineterminator="\n")
            writer.writeheader()
            writer.writerow(c)
    with open(os.path.join(out, "proxy.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows


__all__ = ["compile_counters", "measure", "run_proxy", "step_settings"]
