"""What a step reports: metric sums over micro-batches and ranks, and where the rows go.

:class:`StepMetrics` adds up the metrics of every micro-batch of a step on the device (no host
sync) and reduces them across ranks with one all-reduce for the token-weighted sums and one for
the extremes. :class:`Reporter` writes one JSON line per step to ``OUT/metrics.jsonl`` (rank 0),
and to TensorBoard / W&B when asked.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import torch

from llm import dist


class StepMetrics:
    """Token-weighted sums and extremes of a step's metrics, reduced across ranks once.

    ``*_max`` / ``*_min`` metrics are extremes over micro-batches and ranks; every other metric is
    averaged with the micro-batch's valid-token count as its weight. ``loss`` is the sum of the
    micro-batch losses divided by the number of optimizer steps, ``grad_norm`` the mean of the
    optimizer steps' norms."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.extremes: dict[str, torch.Tensor] = {}  # *_max, and -(*_min)
        self.loss = torch.zeros((), device=device)
        self.grad_norms: list[torch.Tensor] = []
        self.means: dict[str, list[torch.Tensor]] = {}  # per update (or step): plain means

    def add(
        self,
        loss: torch.Tensor,
        metrics: dict[str, torch.Tensor],
        tokens: torch.Tensor,
        empty: bool,
    ) -> None:
        """One micro-batch: its loss, metrics and valid-token count (``empty``: a stand-in
        micro-batch run only so every rank calls backward; neutral for the extremes)."""
        self.loss += loss.detach()
        weight = tokens.float()
        self.sums["_tokens"] = self.sums.get("_tokens", 0.0) + weight
        for k, v in metrics.items():
            v = v.detach().float()
            if k.endswith(("_max", "_min")):
                v = v if k.endswith("_max") else -v
                if empty:  # no token: keys stay the same on every rank, the value is neutral
                    v = torch.full_like(v, -math.inf)
                self.extremes[k] = torch.maximum(self.extremes[k], v) if k in self.extremes else v
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * weight

    def add_means(self, values: dict[str, torch.Tensor]) -> None:
        """Values logged as their plain mean over the calls of the step (one call per optimizer
        update, or one per step), not token-weighted and not reduced across ranks (the mechanism
        probes that use it run in one process)."""
        for k, v in values.items():
            self.means.setdefault(k, []).append(torch.as_tensor(v).detach().double())

    def add_grad_norm(self, norm: torch.Tensor) -> None:
        self.grad_norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def reduce(self) -> dict[str, float]:
        """Every rank's sums and extremes combined (collective: all ranks call it)."""
        self.sums["_loss"] = self.loss
        keys = sorted(self.sums)
        stacked = torch.stack([torch.as_tensor(self.sums[k], device=self.device) for k in keys])
        totals = dict(zip(keys, dist.all_reduce(stacked).tolist(), strict=True))
        n_tokens = max(totals.pop("_tokens", 0.0), 1.0)
        updates = max(len(self.grad_norms), 1)
        values = {"loss": totals.pop("_loss") / updates}
        values["grad_norm"] = torch.stack(self.grad_norms).mean().item() if self.grad_norms else 0.0
        values.update({k: t / n_tokens for k, t in totals.items()})
        values.update({k: torch.stack(v).mean().item() for k, v in self.means.items()})
        if self.extremes:
            ext_keys = sorted(self.extremes)
            ext = dist.all_reduce(torch.stack([self.extremes[k] for k in ext_keys]), "max")
            values.update(
                {
                    k: v if k.endswith("_max") else -v
                    for k, v in zip(ext_keys, ext.tolist(), strict=True)
                }
            )
        return values


class Reporter:
    """``metrics.jsonl`` (rank 0), optional TensorBoard and W&B."""

    def __init__(
        self,
        out: str,
        report_to: list[str],
        config: dict[str, Any],
        *,
        main: bool,
        resumed_step: int,
        wandb_project: str,
    ) -> None:
        self.main, self.writers, self.wandb = main, [], None
        self.path = os.path.join(out, "metrics.jsonl")
        if not main:
            return
        os.makedirs(out, exist_ok=True)
        kept = []
        if resumed_step and os.path.exists(self.path):  # drop lines written after the checkpoint
            with open(self.path) as f:
                kept = [line for line in f if json.loads(line)["step"] <= resumed_step]
        with open(self.path, "w") as f:
            f.writelines(kept)
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.writers.append(SummaryWriter(os.path.join(out, "tensorboard")))
        if "wandb" in report_to:
            import wandb

            self.wandb = wandb.init(project=wandb_project, config=config, dir=out)

    def log(self, row: dict[str, float]) -> None:
        if not self.main:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for w in self.writers:
            for k, v in row.items():
                if k != "step":
                    w.add_scalar(k, v, row["step"])
        if self.wandb is not None:
            self.wandb.log(row, step=row["step"])

    def close(self) -> None:
        for w in self.writers:
            w.close()
        self.writers = []
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
