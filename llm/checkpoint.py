"""One-file checkpoints, written atomically and read with ``torch.load(weights_only=True)``.

``DIR/checkpoint.pt`` holds the full (unsharded, CPU) model and optimizer state dicts
(``torch.distributed.checkpoint.state_dict``, so plain, DDP and FSDP2 models save the same keys),
the LR scheduler, the step, the prompt generator's state and the global torch RNG state. All other
randomness in :mod:`llm.train` is derived from ``(seed, step, ...)``, so on CPU a resumed run
continues bit for bit. Rank 0 writes ``checkpoint.pt.tmp`` and renames it over the old file: a
crash mid-write leaves the previous checkpoint intact.

A run that finished with ``--no-save-model`` keeps no weights: its last checkpoint is written
with ``weights=False``, the step and the settings only (a few KB, over any periodic or
interrupted-run checkpoint, atomically as always), so a later call still sees that the run is
done (:mod:`llm.runs`, ``--resume``'s "nothing to do") and nothing of SmolLM2's 1.6 GB of model
and optimizer state stays behind. Until then (``--checkpoint-every``, SIGTERM / Ctrl-C, a paused
run) a checkpoint holds everything needed to resume.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import numpy as np
import torch

# torch.distributed.checkpoint is imported where a checkpoint is saved or loaded: it is ~0.8 s of
# the ~3.5 s `import llm.train` takes on a 2-core CPU, paid by every command and pool worker
FILENAME = "checkpoint.pt"


def path_in(out: str) -> str:
    return os.path.join(out, FILENAME)


def save(
    out: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    *,
    step: int,
    rng: np.random.Generator,
    config: dict[str, Any],
    main: bool,
    weights: bool = True,
) -> None:
    """Collective under FSDP (every rank calls it, with the same ``weights``); only ``main``
    writes. ``weights=False``: the step and the settings only, the record of a finished run that
    keeps no weights (module docstring)."""
    state: dict[str, Any] = {
        "step": step,
        "config": json.dumps(config, sort_keys=True, default=str),
    }
    if weights:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=full)
        state |= {
            "model": own_storage(model_sd),
            "optimizer": own_storage(optim_sd),
            "scheduler": scheduler.state_dict(),
            "np_rng": json.dumps(rng.bit_generator.state),
            "torch_rng": torch.get_rng_state(),
        }
    if not main:
        return
    os.makedirs(out, exist_ok=True)
    path = path_in(out)
    try:
        torch.save(state, path + ".tmp")
    except BaseException:  # a second Ctrl-C amid the write: the previous checkpoint stands
        discard_partial(out)
        raise
    os.replace(path + ".tmp", path)


def discard_partial(out: str) -> None:
    """Remove a checkpoint write's temp file that an interruption left in ``out`` (a SIGKILL
    cannot remove its own); the checkpoint it would have replaced is untouched."""
    with contextlib.suppress(OSError):
        os.unlink(path_in(out) + ".tmp")


def own_storage(tree: Any) -> Any:
    """``tree`` (dicts and lists of tensors) with every tensor that views a larger storage cloned:
    ``torch.save`` writes a view's whole storage, and an ensemble member's weights and AdamW
    moments are rows of ``[K, ...]`` tensors (:mod:`llm.ensemble`), so its checkpoint would hold
    all K members'."""
    if isinstance(tree, dict):
        return {k: own_storage(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(own_storage(v) for v in tree)
    if isinstance(tree, torch.Tensor) and tree.untyped_storage().nbytes() > tree.nbytes:
        return tree.clone()
    return tree


def load(
    out: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    rng: np.random.Generator,
) -> int:
    """Restore everything :func:`save` wrote; returns the number of steps done."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = torch.load(path_in(out), map_location="cpu", weights_only=True)
    _check_weights(out, state)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False),
    )
    scheduler.load_state_dict(state["scheduler"])
    rng.bit_generator.state = json.loads(state["np_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


def saved_step_and_config(out: str) -> tuple[int, dict[str, Any]]:
    """The step and the settings (as JSON values) a checkpoint was written with."""
    state = torch.load(path_in(out), map_location="cpu", weights_only=True, mmap=True)
    return int(state["step"]), json.loads(state["config"])


def has_weights(out: str) -> bool:
    """Whether ``DIR/checkpoint.pt`` holds the model and optimizer state (not the weights-free
    record of a run that finished with ``--no-save-model``)."""
    return "model" in torch.load(path_in(out), map_location="cpu", weights_only=True, mmap=True)


def _check_weights(out: str, state: dict[str, Any]) -> None:
    if "model" not in state:
        raise ValueError(
            f"{path_in(out)} holds no weights: its run finished with --no-save-model "
            f"at step {state['step']} (start a new --out to train again)"
        )


def model_state(out: str) -> dict[str, torch.Tensor]:
    """The model weights of ``DIR/checkpoint.pt`` (for tests and evaluation)."""
    state = torch.load(path_in(out), map_location="cpu", weights_only=True)
    _check_weights(out, state)
    return state["model"]
