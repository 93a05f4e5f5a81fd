"""Toy trainers, vectorised over seeds: they call the registry's objectives and define no loss.

>>> import envs
>>> from sandbox.train import BanditTrainConfig, train_bandit
>>> model = envs.make_bandit_suite()["easy"].make().unwrapped
>>> df = train_bandit(model, BanditTrainConfig(objective="dapo", seeds=8, steps=5))
>>> {"step", "seed", "expected_reward", "clip_high_frac"} <= set(df.columns)
True
>>> len(df)  # one row per (step, seed)
40
"""

from __future__ import annotations

from .bandit import (
    BanditRun,
    BanditStep,
    BanditTask,
    BanditTrainConfig,
    Rollout,
    UpdateStats,
    bandit_update,
    make_optimizer,
    run_bandit,
    sample_rollout,
    train_bandit,
)
from .sequence import SequenceBatch, SequenceTrainConfig, SequenceTrainer, train_sequence

__all__ = [
    "BanditRun",
    "BanditStep",
    "BanditTask",
    "BanditTrainConfig",
    "Rollout",
    "SequenceBatch",
    "SequenceTrainConfig",
    "SequenceTrainer",
    "UpdateStats",
    "bandit_update",
    "make_optimizer",
    "run_bandit",
    "sample_rollout",
    "train_bandit",
    "train_sequence",
]
