"""The ``llm`` run kind: :func:`llm.train.train` behind :mod:`sandbox.experiments.runs`' registry.

``sandbox`` never imports ``llm``, so the kind registers here: importing ``llm.runs`` (which
``llm.transfer`` does at the top, so its worker processes see the kind too) adds ``llm`` to
:func:`sandbox.experiments.runs.available_runs`.

A spec's shared knobs map onto :class:`llm.train.TrainConfig` by name (``prompts_per_step``,
``group_size``, ``epochs``, ``minibatches``, ``lr``, ``steps``, ``seed``, ``device``); its
``definition`` is the task (``{"task": "addition", "digits": 1}``); its ``train`` holds further
TrainConfig fields (``model``, ``max_new_tokens``, ``eval_every``, ...) and ``argv``: llm.train
flags parsed first, as the base the other values replace. The run's ``out`` folder is scratch
(removed before and after: the checkpoint holds the optimizer state, ~1.6 GB for SmolLM2-135M);
the returned frame is the result: one row per step (step 0: the evaluation before training),
``pass_rate`` = held-out pass@1 (``eval_pass@1``) where evaluated.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

from sandbox.experiments.runs import RunSpec, register_run, thaw, tidy


def train_config(spec: RunSpec) -> object:
    """The :class:`llm.train.TrainConfig` of an ``llm`` spec."""
    from llm.train import TrainConfig, parse_args

    extra = thaw(spec.train)
    argv = [str(word) for word in extra.pop("argv", [])]
    base = parse_args(argv) if argv else TrainConfig()
    task = thaw(spec.definition)
    extra.setdefault("out", tempfile.mkdtemp(prefix="llm-run-"))
    if spec.params:
        extra["objective_params"] = thaw(spec.params)
    return replace(
        base,
        task=task.pop("task"),
        task_knobs=task,
        objective=spec.rule,
        steps=spec.steps,
        prompts_per_step=spec.prompts_per_step,
        group_size=spec.group_size,
        epochs=spec.epochs,
        minibatches=spec.minibatches,
        lr=spec.lr,
        seed=spec.seed,
        device=spec.device,
        **extra,
    )


@register_run("llm")
def llm_run(spec: RunSpec) -> pd.DataFrame:
    """One ``llm.train`` run; steps as llm.train logs them (1-based, step 0 evaluates only)."""
    from llm.train import train

    config = train_config(spec)
    out = Path(config.out)
    shutil.rmtree(out, ignore_errors=True)  # an interrupted run restarts from step 0
    frame = pd.DataFrame(train(config))
    shutil.rmtree(out, ignore_errors=True)
    frame["pass_rate"] = frame.get("eval_pass@1")
    frame["seed"] = spec.seed
    # a step that also evaluated is one row; step 0 (before training) only evaluates
    return tidy(spec, frame.groupby("step", as_index=False).first(), shift=0)
