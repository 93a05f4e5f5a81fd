"""The default comparison: every objective and preset on a bandit suite, sampled and exact.

For each (setting, objective) pair it runs

* the sampled trainer (:func:`sandbox.train.run_bandit`): S seeds in one vectorised run, groups of
  G samples, mu epochs x minibatches per batch (so the ratio leaves 1 and clipping acts);
* the exact expected-gradient flow (:func:`sandbox.exact.exact_flow`) with the exact finite-group
  GRPO advantage and ``epochs * minibatches`` inner updates per step: the deterministic dynamics the
  sampled runs follow in expectation (rules without a closed form, clip_cov and kl_cov, have none).

Each finished pair is written atomically as ``<out>/parts/<setting>__<objective>.parquet``, so an
interrupted comparison resumes where it stopped; then ``results.parquet`` (tidy: one row per
setting, objective, kind, seed, step), ``summary.csv`` and the figures are written.

    clip-sandbox compare                       # the default (make demo), ~1-2 min on 2 cores
    clip-sandbox compare --objectives grpo dapo nsr_dapo --settings needle --seeds 64
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from envs import make_bandit_suite
from sandbox.exact import exact_flow
from sandbox.objectives import available_objectives, available_presets, get_objective
from sandbox.train import BanditTrainConfig, run_bandit

from .plots import final_scores, format_scores, render_all
from .results import part_name, read_parts, write_parquet_atomic

#: Objectives drawn in the line plots (all of them go into the tables and the score figure).
HIGHLIGHT = (
    "grpo", "dapo", "gspo", "nsr_dapo", "nsr_decay_dapo", "dgpo", "atr_dapo", "gppo",
    "cispo_trl", "sapo", "clip_cov", "kl_cov",
)  # fmt: skip


def default_objectives() -> list[str]:
    """Every preset, then every registered objective (paper defaults)."""
    return available_presets() + available_objectives()


@dataclass
class CompareConfig:
    """Settings of a comparison. Every field is a CLI flag of ``clip-sandbox compare``."""

    objectives: list[str] = field(
        default_factory=default_objectives,
        metadata={"help": "objectives and presets to compare (default: all of them)"},
    )
    settings: list[str] = field(
        default_factory=lambda: ["easy", "needle", "mixed"],
        metadata={"help": "bandit settings from envs.make_bandit_suite()"},
    )
    seeds: int = field(default=32, metadata={"help": "seeds per sampled run (vectorised)"})
    steps: int = field(default=100, metadata={"help": "training steps"})
    group_size: int = field(default=8, metadata={"help": "G, samples per prompt"})
    prompts_per_batch: int = field(default=4, metadata={"help": "groups per step"})
    epochs: int = field(default=2, metadata={"help": "mu, passes over each batch"})
    minibatches: int = field(default=4, metadata={"help": "optimizer steps per epoch"})
    optimizer: str = field(default="sgd", metadata={"help": "sgd or adam"})
    lr: float = field(default=1.0, metadata={"help": "learning rate on the logits"})
    seed: int = field(default=0, metadata={"help": "base seed"})

    def __post_init__(self) -> None:
        suite = make_bandit_suite()
        for name in self.settings:
            if name not in suite:
                raise ValueError(f"settings: unknown setting {name!r}; valid: {sorted(suite)}")
        if not self.objectives:
            raise ValueError("objectives must not be empty")
        for name in self.objectives:
            get_objective(name)  # ValueError naming the valid names
        self.train_config("grpo")  # validates the shared training fields

    def train_config(self, objective: str) -> BanditTrainConfig:
        return BanditTrainConfig(
            objective=objective, seeds=self.seeds, steps=self.steps, group_size=self.group_size,
            prompts_per_batch=self.prompts_per_batch, epochs=self.epochs,
            minibatches=self.minibatches, optimizer=self.optimizer, lr=self.lr, seed=self.seed,
        )  # fmt: skip

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}


def optimum(model: Any) -> float:
    """Best achievable expected reward of a bandit model (prompt-weighted for contextual)."""
    best = np.asarray(model.mean_rewards).max(-1)
    return float(np.dot(model.prompt_probs, best)) if np.ndim(best) else float(best)


def has_closed_form(objective: str) -> bool:
    try:
        get_objective(objective).expected_coef(1.0, 1.0)
    except NotImplementedError:
        return False
    return True


def run_pair(config: CompareConfig, setting: str, objective: str) -> pd.DataFrame:
    """Sampled runs and (where defined) the exact flow of one objective on one setting."""
    model = make_bandit_suite()[setting].make().unwrapped
    sampled = run_bandit(model, config.train_config(objective)).to_frame()
    sampled.insert(0, "kind", "sampled")
    frames = [sampled]
    if has_closed_form(objective):
        exact = exact_flow(
            get_objective(objective), model, steps=config.steps, lr=config.lr,
            advantage="grpo", group_size=config.group_size,
            epochs=config.epochs * config.minibatches, optimizer=config.optimizer,
        )  # fmt: skip
        exact.insert(0, "kind", "exact")
        exact.insert(2, "seed", -1)
        frames.append(exact)
    frame = pd.concat(frames, ignore_index=True)
    frame.insert(0, "suite", "bandit")
    frame.insert(1, "setting", setting)
    frame.insert(2, "objective", objective)
    frame["optimum"] = optimum(model)
    return frame


def _run_part(config: CompareConfig, setting: str, objective: str, path: str) -> str:
    torch.set_num_threads(1)  # small tensors: threads only contend with the other workers
    write_parquet_atomic(run_pair(config, setting, objective), path)
    return path


def run_compare(
    config: CompareConfig,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
    figures: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run (or resume) a comparison into ``out_dir``; returns ``(results, scores)``."""
    out_dir = Path(out_dir)
    parts = out_dir / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(pd.Series(asdict(config)).to_json(indent=2))
    jobs = [(s, o, parts / part_name(s, o)) for s in config.settings for o in config.objectives]
    todo = [job for job in jobs if force or not job[2].exists()]
    workers = workers or min(os.cpu_count() or 1, 4)
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), disable=not progress,
               desc="compare", unit="run")  # fmt: skip
    if workers <= 1:
        for setting, objective, path in todo:
            bar.set_postfix_str(f"{setting}/{objective}")
            _run_part(config, setting, objective, str(path))
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_run_part, config, s, o, str(p)): (s, o) for s, o, p in todo}
            for future in as_completed(futures):
                future.result()
                bar.set_postfix_str("/".join(futures[future]))
                bar.update()
    bar.close()

    wanted = {p.name for _, _, p in jobs}
    results = read_parts(parts)
    results = results[
        [
            part_name(s, o) in wanted
            for s, o in zip(results["setting"], results["objective"], strict=True)
        ]
    ].reset_index(drop=True)
    write_parquet_atomic(results, out_dir / "results.parquet")
    scores = final_scores(results)
    scores.to_csv(out_dir / "summary.csv", index=False)
    if figures:
        highlight = [o for o in HIGHLIGHT if o in config.objectives] or None
        render_all(results, out_dir, highlight)
    return results, scores


def main(config: CompareConfig, out_dir: str | Path, **kwargs: Any) -> pd.DataFrame:
    """Run, then print the summary table (the CLI entry)."""
    start = time.perf_counter()
    _, scores = run_compare(config, out_dir, **kwargs)
    print(format_scores(scores))
    print(
        f"\n{len(config.objectives)} objectives x {len(config.settings)} settings, "
        f"{config.seeds} seeds x {config.steps} steps: {time.perf_counter() - start:.1f} s. "
        f"Wrote {Path(out_dir) / 'results.parquet'}, summary.csv and figures."
    )
    return scores
