"""``--cpu-bf16``: bf16 autocast for llm.train's forward passes on a CPU with native bf16.

The detection (:func:`llm.model.cpu_native_bf16`) reads ``/proc/cpuinfo``'s flags; the refusal is
one ``ValueError`` naming the flag; off (the default) the run's autocast is none, so every float32
result stays bit-identical. Where the CPU has native bf16: one tiny step trains with a finite loss,
and the completion log-probs under bf16 autocast are within bf16's tolerance of float32's.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from llm.config import TrainConfig
from llm.model import cpu_native_bf16

NATIVE = cpu_native_bf16()
needs_native = pytest.mark.skipif(not NATIVE, reason="this CPU has no native bf16")

ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n"
ZEN3 = "processor\t: 0\nflags\t\t: fpu avx2 fma\nvmx flags\t: avx512_bf16\n"


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [(ZEN4, True), (SAPPHIRE, True), (ZEN3, False), ("", False)],
    ids=["avx512_bf16", "amx_bf16", "neither (a bf16 word outside 'flags')", "empty"],
)
def test_cpu_native_bf16_reads_the_flags_line(cpuinfo, native):
    assert cpu_native_bf16(cpuinfo) is native


def test_cpu_bf16_is_refused_without_native_bf16(monkeypatch):
    import llm.model

    monkeypatch.setattr(llm.model, "cpu_native_bf16", lambda cpuinfo=None: False)
    with pytest.raises(ValueError, match=r"^--cpu-bf16 needs a CPU with native bf16"):
        TrainConfig(cpu_bf16=True, device="cpu").validate()


def test_cpu_bf16_is_refused_on_cuda():
    with pytest.raises(ValueError, match=r"^--cpu-bf16 is for CPU runs, got --device cuda"):
        TrainConfig(cpu_bf16=True, device="cuda").validate()


def test_cpu_bf16_is_off_by_default_and_the_cpu_autocast_is_then_none():
    """Off, a CPU run enters no autocast at all (the float32 path, bit-identical)."""
    from llm.train import Run

    assert TrainConfig().cpu_bf16 is False
    run = Run.__new__(Run)
    run.cfg, run.device = TrainConfig(), torch.device("cpu")
    assert isinstance(run.autocast, contextlib.nullcontext)


TINY = dict(
    model="tiny",
    task="parity",
    task_knobs={"length": 2},
    lr=1e-2,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=8,
    steps=1,
    epochs=2,
    minibatches=2,
    device="cpu",
    progress=False,
    save_model=False,
)


@needs_native
def test_cpu_bf16_trains_one_tiny_step_with_finite_loss(tmp_path):
    from llm.train import train

    rows = train(TrainConfig(**TINY, cpu_bf16=True, out=str(tmp_path)))
    assert rows[-1]["step"] == 1
    assert math.isfinite(rows[-1]["loss"]) and math.isfinite(rows[-1]["grad_norm"])


@needs_native
def test_cpu_bf16_logprobs_are_within_bf16_tolerance_of_float32(tmp_path):
    """One fixed batch, the same weights: the completion tokens' log-probs under CPU bf16 autocast
    differ from float32's by at most 0.02 nats (bf16 keeps 8 bits of mantissa, a relative step
    of 2^-8 = 0.0039 on the logits; the tiny Llama's measured gap is about 1e-3), and not by 0 (the
    autocast really runs in bf16)."""
    from llm.train import logprobs, rollout_each, setup

    runs = [
        setup(TrainConfig(**TINY, cpu_bf16=flag, out=str(tmp_path / str(flag))), [])
        for flag in (False, True)
    ]
    host = rollout_each(runs[:1], 0)[0]
    f32, bf16 = (logprobs(run, run.model, host, 2) for run in runs)
    mask = host["completion_mask"].bool()
    gap = (bf16 - f32).abs()[mask].max().item()
    assert 0 < gap < 0.02, gap


@needs_native
def test_the_bf16_check_script_compares_both_modes_on_one_batch():
    """benchmarks/llm_cpu_bf16_check.py on the tiny Llama: both modes' clip shares are shares,
    each the sum of its low and high parts, and the log-prob gap is that of the test above."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import llm_cpu_bf16_check

    threads = str(torch.get_num_threads())  # the script sets it: leave this process's as it is
    record = llm_cpu_bf16_check.main(["--model", "tiny", "--lr", "1e-2", "--threads", threads])
    for mode in ("float32", "bf16"):
        m = record[mode]
        assert 0 <= m["clip_frac"] <= 1
        assert m["clip_frac"] == m["clip_low_frac"] + m["clip_high_frac"]
    assert record["tokens"] > 0
    assert 0 < record["mean_abs_dlogp"] <= record["max_abs_dlogp"] < 0.02
