"""llm.train under torchrun: 2 CPU processes on gloo equal 1 process with the same global batch.

The 1-process run accumulates 2 micro-batches per optimizer step; the 2-process runs (DDP, and
FSDP2 with ``--fsdp``) give each rank one of those micro-batches. Prompts are drawn from one
generator on every rank, each prompt's completions are seeded by its global index, the rollout is
all-gathered and every micro-batch loss uses the minibatch's global token count, so the final
parameters agree (observed: bitwise; asserted to 1e-5 relative). The 1-process run, shared by
the tests, runs through ``llm.train``'s ``main`` in the test process; every process group is real.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from llm.checkpoint import model_state
from llm.model import tiny_model, tiny_tokenizer
from llm.train import main

pytest.importorskip("transformers")

ARGS = [
    "--model",
    "tiny",
    "--task",
    "parity",
    "--task-knobs",
    "length=2",
    "--steps",
    "2",
    "--lr",
    "1e-2",
    "--prompts-per-step",
    "4",
    "--group-size",
    "4",
    "--epochs",
    "2",
    "--minibatches",
    "2",
    "--max-new-tokens",
    "16",
    "--no-progress",
    "--device",
    "cpu",  # the model saved: the final
    # checkpoint, which the tests compare, keeps its weights
    "--prompts-per-call",
    "1",  # a prompt's samples independent of the world size
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(
    args: list[str], nproc: int | None = None, backend: str = "gloo", launcher: bool = True
) -> None:
    """``python -m llm.train`` alone (``nproc`` None: no process group; tests/test_llm_vllm.py),
    or in a real process group of ``nproc`` processes on ``backend``: started by torchrun, or
    (``launcher=False``, one process) with the environment torchrun gives its one rank (the
    launcher's own ~3 s of imports saved)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    if nproc is None:
        cmd = [sys.executable, "-m", "llm.train", *args]
    elif not launcher:
        assert nproc == 1
        rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
        env |= {**rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        cmd = [sys.executable, "-m", "llm.train", *args, "--backend", backend]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
            "llm.train",
            *args,
            "--backend",
            backend,
        ]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.skip("distributed run timed out (no usable port / gloo here?)")
    if proc.returncode != 0:
        if nproc and (
            "Address already in use" in proc.stderr
            or ("gloo" in proc.stderr.lower() and "connect" in proc.stderr.lower())
        ):
            pytest.skip(f"cannot initialise torch.distributed here: {proc.stderr[-500:]}")
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        scale = a[k].abs().max().clamp(min=1e-12)
        assert ((a[k] - b[k]).abs().max() / scale).item() <= 1e-5, k


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The plain run (no process group), through ``llm.train``'s ``main`` in this process."""
    out = tmp_path_factory.mktemp("one")
    main([*ARGS, "--grad-accum", "2", "--out", str(out)])  # exits (SystemExit) on an error
    return out


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_two_processes_equal_one(one_process, tmp_path, fsdp):
    out = tmp_path / "two"
    run([*ARGS, "--out", str(out), *(["--fsdp"] if fsdp else [])], nproc=2)
    single, double = model_state(str(one_process)), model_state(str(out))
    assert_same_params(single, double)
    init = tiny_model(len(tiny_tokenizer()), 0).state_dict()
    assert max((double[k] - init[k]).abs().max().item() for k in init) > 0
    # the same rollouts: identical reward curves
    lines = [(one_process / "metrics.jsonl").read_text(), (out / "metrics.jsonl").read_text()]
    rewards = [
        [line.split('"reward": ')[1].split(",")[0] for line in t.splitlines()] for t in lines
    ]
    assert rewards[0] == rewards[1] and len(rewards[0]) == 2


def test_fsdp_in_a_one_process_group_equals_one_process(one_process, tmp_path):
    """--fsdp in a group of one (the environment torchrun --nproc_per_node 1 gives its rank)
    shards over it (FSDP2's code path on one device, as on a single GPU) and matches the plain
    run; the CPU run builds its mesh on the CPU (FSDP2's default mesh is on the accelerator
    whenever one exists)."""
    out = tmp_path / "fsdp1"
    run([*ARGS, "--grad-accum", "2", "--fsdp", "--out", str(out)], nproc=1, launcher=False)
    assert_same_params(model_state(str(one_process)), model_state(str(out)))
