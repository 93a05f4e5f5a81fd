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

The kind is batched (``register_run("llm", batched=True)``): the specs of one
:func:`~sandbox.experiments.runs.run_specs` call that share a
:meth:`~sandbox.experiments.runs.RunSpec.batch_key` (they differ only in ``rule``, ``params`` or
``seed``, e.g. a study's paired seeds of one rule) train as one :func:`llm.ensemble.train_ensemble`
(the training forward and backward batched over the runs), each spec still returning the frame its
own :func:`llm.train.train` run gives (to float rounding: ``tests/test_llm_ensemble.py``,
``tests/test_claims_ensemble.py``). A single spec is one ordinary ``llm.train`` run. The caller
bounds the ensemble by how many specs it passes at once (the claims study: its llm rung's
``ensemble`` setting, ``llm/claims.py``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
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


def run_frame(spec: RunSpec, rows: list[dict[str, float]]) -> pd.DataFrame:
    """The kind's frame of one run's logged rows (1-based steps, step 0 evaluates only)."""
    frame = pd.DataFrame(rows)
    frame["pass_rate"] = frame.get("eval_pass@1")
    frame["seed"] = spec.seed
    # a step that also evaluated is one row; step 0 (before training) only evaluates
    return tidy(spec, frame.groupby("step", as_index=False).first(), shift=0)


@register_run("llm", batched=True)
def llm_runs(specs: Sequence[RunSpec]) -> list[pd.DataFrame]:
    """One ``llm.train`` run per spec: one spec alone, several (one batch key) as one ensemble
    (:func:`llm.ensemble.train_ensemble`, whose ``check_members`` they satisfy: they differ only
    in rule, parameters, seed and scratch ``out``). Each run's ``out`` is scratch, removed before
    (an interrupted run restarts from step 0) and after."""
    from llm.ensemble import train_ensemble
    from llm.train import train

    configs = [train_config(spec) for spec in specs]
    outs = [Path(config.out) for config in configs]
    try:
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
        logs = [train(configs[0])] if len(configs) == 1 else train_ensemble(configs)
    finally:
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
    return [run_frame(spec, rows) for spec, rows in zip(specs, logs, strict=True)]
