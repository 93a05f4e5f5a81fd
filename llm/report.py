"""What a step reports: metric sums over micro-batches and ranks, and where the rows go.

:class:`StepMetrics` adds up the metrics of every micro-batch of a step on the device (no host
sync), of one run or of an ensemble's K members as ``[K]`` rows, and reduces them across ranks
with one all-reduce for the token-weighted sums and one for the extremes. :class:`Reporter` writes
one JSON line per step to ``OUT/metrics.jsonl`` (rank 0), and to TensorBoard / W&B when asked.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from llm import dist

#: a micro-batch's metrics: one run's, or (``StepMetrics(members=K)``) each member's
Metrics = dict[str, torch.Tensor] | Sequence[dict[str, torch.Tensor]]


def keep(new: torch.Tensor, old: torch.Tensor, present: torch.Tensor | None) -> torch.Tensor:
    """``new`` where ``present`` (everywhere where None), else ``old``."""
    return new if present is None else torch.where(present, new, old)


def mask(flags: Sequence[bool], device: torch.device) -> torch.Tensor | None:
    """``flags`` as a bool tensor on ``device``; None where all are set (nothing to mask)."""
    return None if all(flags) else torch.tensor(flags, device=device)


class StepMetrics:
    """Token-weighted sums and extremes of a step's metrics, reduced across ranks once.

    ``*_max`` / ``*_min`` metrics are extremes over micro-batches and ranks; every other metric is
    averaged with the micro-batch's valid-token count as its weight. ``loss`` is the sum of the
    micro-batch losses divided by the number of optimizer steps, ``grad_norm`` the mean of the
    optimizer steps' norms.

    ``members=K`` (:mod:`llm.ensemble`): the K runs' sums, extremes and losses as ``[K]`` rows,
    added by the same float32 operations each run's own ``StepMetrics`` makes on its values, so
    :meth:`split_into` hands every run the rows it gets alone, bit for bit."""

    def __init__(self, device: torch.device, members: int | None = None) -> None:
        self.device, self.members = device, members
        self.sums: dict[str, torch.Tensor] = {}
        self.extremes: dict[str, torch.Tensor] = {}  # *_max, and -(*_min)
        self.seen: dict[str, list[bool]] = {}  # per key: which members added it
        self.loss = torch.zeros(() if members is None else members, device=device)
        self.grad_norms: list[torch.Tensor] = []
        self.means: dict[str, list[torch.Tensor]] = {}  # per update (or step): plain means

    def add(
        self,
        loss: torch.Tensor,
        metrics: Metrics,
        tokens: torch.Tensor,
        empty: bool | Sequence[bool],
        active: Sequence[bool] | None = None,
    ) -> None:
        """One micro-batch: its loss, metrics and valid-token count (``empty``: a stand-in
        micro-batch run only so every rank calls backward; neutral for the extremes).

        With ``members``: ``loss`` and ``tokens`` are ``[K]``, ``metrics`` and ``empty`` one per
        member, and ``active`` the members that take part (all where None). A member keeps its
        rows where it is not active or does not log a metric, and gets no row of a metric it
        never logs, as alone."""
        active = list(active or [True] * (self.members or 1))
        present = mask(active, self.device)
        self.loss = keep((self.loss + loss.detach()).to(self.loss.dtype), self.loss, present)
        weight = tokens.float()
        self.accumulate("_tokens", weight, active, present)
        empties = [empty] if isinstance(empty, bool) else list(empty)
        some = any(empties) and not all(empties)  # members: the empty ones' extremes neutral
        neutral = torch.tensor(empties, device=self.device) if some else None
        for key, (v, has) in self.by_key(metrics, active).items():
            at = present if has == active else mask(has, self.device)
            v = v.float()
            if not key.endswith(("_max", "_min")):
                self.accumulate(key, v * weight, has, at)
                continue
            v = v if key.endswith("_max") else -v
            if all(empties):  # no token: keys stay the same on every rank, the value is neutral
                v = torch.full_like(v, -math.inf)
            elif neutral is not None:
                v = torch.where(neutral, -math.inf, v)
            self.accumulate(key, v, has, at, extreme=True)

    def by_key(
        self, metrics: Metrics, active: list[bool]
    ) -> dict[str, tuple[torch.Tensor, list[bool]]]:
        """Each metric's value, detached (stacked over the members, 0 for one that does not log
        it) and which members log it and take part."""
        if self.members is None:
            return {k: (v.detach(), active) for k, v in metrics.items()}
        out = {}
        with torch.no_grad():  # stacked without a graph: no detach op per key
            for key in dict.fromkeys(k for m in metrics for k in m):
                has = [a and key in m for a, m in zip(active, metrics, strict=True)]
                if any(has):
                    rows = [m.get(key) for m in metrics]
                    if any(r is None for r in rows):  # a member that does not log it: 0
                        zero = torch.zeros((), device=self.device)
                        rows = [zero if r is None else r for r in rows]
                    out[key] = torch.stack(rows), has
        return out

    def accumulate(
        self,
        key: str,
        value: torch.Tensor,
        has: list[bool],
        present: torch.Tensor | None,
        extreme: bool = False,
    ) -> None:
        """``value`` added to the sum ``key`` (or its extreme: the maximum) of the members that
        ``has`` (``present`` on the device) names."""
        table = self.extremes if extreme else self.sums
        if key in table:
            old = table[key]
            table[key] = keep(torch.maximum(old, value) if extreme else old + value, old, present)
        else:  # a run alone's first value as it always was: v, or 0.0 + v (-0.0 -> 0.0)
            fill = -math.inf if extreme else 0.0
            first = value if extreme else fill + value
            table[key] = first if present is None else torch.where(present, first, fill)
        seen = self.seen.get(key, [False] * len(has))
        self.seen[key] = [s or h for s, h in zip(seen, has, strict=True)]

    def split_into(self, runs: Sequence[StepMetrics]) -> None:
        """Each member's rows (its loss, the sums and extremes it added) into its run's own
        ``StepMetrics`` ``runs[k]`` (``members=K``; once per step)."""
        if len(runs) != (self.members or 0):
            raise ValueError(f"runs: {len(runs)} given for the rows of {self.members or 0} members")
        for m, loss in zip(runs, self.loss.unbind(), strict=True):
            m.loss = loss
        for mine, table in ((self.sums, "sums"), (self.extremes, "extremes")):
            for key, value in mine.items():  # one unbind per key, not K indexing ops
                for m, row, seen in zip(runs, value.unbind(), self.seen[key], strict=True):
                    if seen:
                        getattr(m, table)[key] = row

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
