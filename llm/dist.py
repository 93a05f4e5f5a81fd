"""torch.distributed from torchrun's environment: init, DDP / FSDP2 wrapping, collectives.

Without ``WORLD_SIZE`` in the environment (plain ``python -m llm.train``) every helper is a no-op
for one process. ``torchrun --nproc_per_node N -m llm.train ...`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; the backend is NCCL on CUDA and gloo on CPU
unless ``--backend`` says otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    launched: bool = False  # started by torchrun (a process group exists, even of one process)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def init(device: str, backend: str) -> tuple[DistInfo, torch.device]:
    """Join the process group if launched by torchrun; pick this process's device."""
    launched = "WORLD_SIZE" in os.environ
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device must be auto, cpu or cuda[:N], got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no visible GPU"
        raise ValueError(
            f"--device {device}: CUDA is not available (torch {torch.__version__}, "
            f"{build}); use --device cpu or auto"
        )
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    if launched and not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
    return DistInfo(rank, world, local, launched), dev


def wrap(
    model: torch.nn.Module, info: DistInfo, device: torch.device, fsdp: bool
) -> torch.nn.Module:
    """DDP (default) or FSDP2 (``fully_shard`` per decoder layer, then the root); FSDP2 also in a
    one-process torchrun group, DDP only with several processes."""
    if fsdp and info.launched:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # an explicit mesh on this process's device: FSDP2's default mesh is on the accelerator
        # whenever one exists, which breaks a CPU (gloo) run on a GPU host
        mesh = init_device_mesh(device.type, (info.world,))
        for module in model.modules():
            if type(module).__name__.endswith("DecoderLayer"):
                fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def all_reduce(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(x, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return x


def all_gather_object(obj: Any) -> list[Any]:
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
