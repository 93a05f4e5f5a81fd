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
    clip-sandbox compare --suite reasoning     # tiny transformers on reasoning tasks, a few min
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
from tqdm import tqdm

from envs import make_bandit_suite
from sandbox.exact import exact_flow
from sandbox.objectives import available_objectives, available_presets, get_objective
from sandbox.train import BanditTrainConfig, SequenceTrainConfig, run_bandit, train_sequence

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


#: The reasoning suite: setting name -> (task, knobs). Tiny vocabularies, so that a model trained
#: from scratch finds the answer format quickly and the rules differ in what they do next.
REASONING_SUITE: dict[str, tuple[str, dict[str, Any]]] = {
    "bits-reverse-3": ("bits", {"op": "reverse", "length": 3}),
    "bits-parity-2": ("bits", {"op": "parity", "length": 2}),
}

#: Rules compared by default on the reasoning suite (the token/sequence-level contrasts first).
REASONING_OBJECTIVES = (
    "grpo", "dapo", "gspo", "nsr_dapo", "nsr_gspo", "nsr_decay_dapo", "dgpo", "gppo",
    "cispo_trl", "sapo", "clip_cov", "kl_cov",
)  # fmt: skip

#: Per-suite defaults of the fields left as None.
SUITE_DEFAULTS: dict[str, dict[str, Any]] = {
    "bandit": {
        "objectives": None, "settings": ["easy", "needle", "mixed"], "seeds": 32, "steps": 100,
        "prompts_per_batch": 4, "epochs": 2, "minibatches": 4, "optimizer": "sgd", "lr": 1.0,
    },
    "reasoning": {
        "objectives": list(REASONING_OBJECTIVES), "settings": list(REASONING_SUITE), "seeds": 8,
        "steps": 80, "prompts_per_batch": 8, "epochs": 2, "minibatches": 2, "optimizer": "adam",
        "lr": 1e-3,
    },
}  # fmt: skip


@dataclass
class CompareConfig:
    """Settings of a comparison. Every field is a CLI flag of ``clip-sandbox compare``; fields
    left as None take the suite's default (:data:`SUITE_DEFAULTS`)."""

    suite: str = field(default="bandit", metadata={"help": "bandit or reasoning"})
    objectives: list[str] | None = field(
        default=None, metadata={"help": "objectives and presets (bandit default: all of them)"}
    )
    settings: list[str] | None = field(
        default=None,
        metadata={"help": "bandit settings (envs.make_bandit_suite) or reasoning settings"},
    )
    seeds: int | None = field(default=None, metadata={"help": "seeds per run (vectorised)"})
    steps: int | None = field(default=None, metadata={"help": "training steps"})
    group_size: int = field(default=8, metadata={"help": "G, samples per prompt"})
    prompts_per_batch: int | None = field(default=None, metadata={"help": "groups per step"})
    epochs: int | None = field(default=None, metadata={"help": "mu, passes over each batch"})
    minibatches: int | None = field(default=None, metadata={"help": "optimizer steps per epoch"})
    optimizer: str | None = field(default=None, metadata={"help": "sgd or adam (bandit)"})
    lr: float | None = field(default=None, metadata={"help": "learning rate"})
    seed: int = field(default=0, metadata={"help": "base seed"})

    def __post_init__(self) -> None:
        if self.suite not in SUITE_DEFAULTS:
            raise ValueError(f"suite must be one of {sorted(SUITE_DEFAULTS)}, got {self.suite!r}")
        for key, value in SUITE_DEFAULTS[self.suite].items():
            if getattr(self, key) is None:
                setattr(self, key, list(value) if isinstance(value, list) else value)
        if self.objectives is None:
            self.objectives = default_objectives()
        valid = sorted(make_bandit_suite() if self.suite == "bandit" else REASONING_SUITE)
        for name in self.settings:
            if name not in valid:
                raise ValueError(f"settings: unknown setting {name!r}; valid: {valid}")
        if not self.objectives:
            raise ValueError("objectives must not be empty")
        for name in self.objectives:
            get_objective(name)  # ValueError naming the valid names
        if self.suite == "bandit":
            self.train_config("grpo")  # validates the shared training fields
        else:
            self.sequence_config(self.settings[0], "grpo")

    def train_config(self, objective: str) -> BanditTrainConfig:
        return BanditTrainConfig(
            objective=objective, seeds=self.seeds, steps=self.steps, group_size=self.group_size,
            prompts_per_batch=self.prompts_per_batch, epochs=self.epochs,
            minibatches=self.minibatches, optimizer=self.optimizer, lr=self.lr, seed=self.seed,
        )  # fmt: skip

    def sequence_config(self, setting: str, objective: str) -> SequenceTrainConfig:
        task, knobs = REASONING_SUITE[setting]
        return SequenceTrainConfig(
            task=task, task_knobs=dict(knobs), objective=objective, seeds=self.seeds,
            steps=self.steps, prompts_per_batch=self.prompts_per_batch,
            group_size=self.group_size, epochs=self.epochs, minibatches=self.minibatches,
            lr=self.lr, seed=self.seed,
        )  # fmt: skip

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}


def optimum(model: Any) -> float:
    """Best achievable expected reward of a bandit model (prompt-weighted for contextual)."""
    best = np.asarray(model.mean_rewards).max(-1)
    return float(np.dot(model.prompt_probs, best)) if np.ndim(best) else float(best)


def run_pair(config: CompareConfig, setting: str, objective: str) -> pd.DataFrame:
    """Sampled runs and (where defined) the exact flow of one objective on one setting."""
    if config.suite == "reasoning":
        frame = train_sequence(config.sequence_config(setting, objective))
        frame.insert(0, "kind", "sampled")
        frame.insert(0, "suite", "reasoning")
        frame.insert(1, "setting", setting)
        frame.insert(2, "objective", objective)
        frame["optimum"] = 1.0
        return frame
    model = make_bandit_suite()[setting].make().unwrapped
    sampled = run_bandit(model, config.train_config(objective)).to_frame()
    sampled.insert(0, "kind", "sampled")
    frames = [sampled]
    if get_objective(objective).has_expected_coef():
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
