"""The ``llm`` run kind: :func:`llm.train.train` behind :mod:`sandbox.experiments.runs`' registry.

``sandbox`` never imports ``llm``, so the kind registers here: importing ``llm.runs`` (which
``llm.claims`` does at the top, so its worker processes see the kind too) adds ``llm`` to
:func:`sandbox.experiments.runs.available_runs`.

A spec's shared knobs map onto :class:`llm.train.TrainConfig` by name (``prompts_per_step``,
``group_size``, ``epochs``, ``minibatches``, ``lr``, ``steps``, ``seed``, ``device``); its
``definition`` is the task (``{"task": "addition", "digits": 1}``); its ``train`` holds further
TrainConfig fields (``model``, ``max_new_tokens``, ``eval_every``, ...) and ``argv``: llm.train
flags parsed first, as the base the other values replace. The run's ``out`` folder is scratch:
by default a temporary folder, removed before and after (the checkpoint holds the optimizer
state, ~1.6 GB for SmolLM2-135M); the returned frame is the result: one row per step (step 0: the
evaluation before training), ``pass_rate`` = held-out pass@1 (``eval_pass@1``) where evaluated.

Resumable scratch: a spec whose ``train`` holds ``scratch`` (a folder; the claims study sets it to
``<out>/llm_scratch``) trains in ``<scratch>/<scratch_name(spec)>``, a folder named by everything
the run computes, and kept until the run has finished (with its ``checkpoint_every``, also in
``train``, the run checkpoints periodically, and ``llm.train`` checkpoints on SIGTERM / Ctrl-C).
A call that finds a checkpoint there resumes from it (``resume=True``; an ensemble's members
resume together when their checkpoints are at one step, else each trains alone), and the frame
is built from the run's whole ``metrics.jsonl`` (which a resumed run trims to its checkpoint's
step), so a run cut by a command's time limit continues where it stopped and returns the rows
of an uninterrupted run. The folder outlives the call: the caller removes it
(:func:`remove_scratch`) once it has stored the frame, so a signal between the end of training
and that store loses nothing (the next call finds the checkpoint at the last step and reads the
frame back without training).

Its traits (:class:`sandbox.experiments.runs.RunKind`): sampled, without replicates (one run per
spec, logged under the spec's ``seed``), logging step 0 (the evaluation before training), scored
by ``pass_rate`` and ``reward``, no exact counterpart, and batched: the specs of one
:func:`~sandbox.experiments.runs.run_specs` call that share a
:meth:`~sandbox.experiments.runs.RunSpec.batch_key` (they differ only in ``rule``, ``params``,
``seed`` or ``lr``, e.g. a study's paired seeds of one rule, or its calibration's step sizes) train
as one :func:`llm.ensemble.train_ensemble`
(the training forward and backward batched over the runs), each spec still returning the frame its
own :func:`llm.train.train` run gives (to float rounding: ``tests/test_llm_ensemble.py``,
``tests/test_claims_ensemble.py``) until that rounding changes a sampled token, after which the
two runs differ (measured at the README's tiny settings: docs/llm.md). A single spec is one
ordinary ``llm.train`` run. The caller
bounds the ensemble by how many specs it passes at once (the claims study: its llm rung's
``ensemble`` setting, ``llm/claims.py``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from sandbox.experiments.runs import BATCH_VARIES, RunSpec, register_run, thaw, tidy


def scratch_name(spec: RunSpec) -> str:
    """The resumable scratch folder's name of ``spec``: its part's name (its stem and the hash of
    what it computes, :meth:`~sandbox.experiments.runs.RunSpec.digest`; so changing where or how
    often it saves keeps a run's checkpoint)."""
    return spec.part.removesuffix(".parquet")


def train_config(spec: RunSpec) -> object:
    """The :class:`llm.train.TrainConfig` of an ``llm`` spec."""
    from llm.train import TrainConfig, parse_args

    extra = thaw(spec.train)
    argv = [str(word) for word in extra.pop("argv", [])]
    base = parse_args(argv) if argv else TrainConfig()
    task = thaw(spec.definition)
    scratch = extra.pop("scratch", None)
    if scratch is not None:
        extra["out"] = str(Path(scratch) / scratch_name(spec))
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


def saved_step(out: str) -> int | None:
    """The step of ``out``'s checkpoint, None without one."""
    from llm import checkpoint

    path = Path(checkpoint.path_in(out))
    return checkpoint.saved_step_and_config(out)[0] if path.exists() else None


def logged_rows(out: str, last: int) -> list[dict[str, float]]:
    """The rows of ``out/metrics.jsonl`` up to step ``last`` (the whole run, resumed or not)."""
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["step"] <= last]


def train_runs(configs: list[Any], starts: list[int]) -> None:
    """Train ``configs`` to their ``steps`` from ``starts`` (their checkpoints' steps, 0 for a
    fresh run): one run alone, several as one ensemble when they start from one step, else one
    after another; a run whose checkpoint is already at ``steps`` is done."""
    from llm.ensemble import train_ensemble
    from llm.train import train

    todo = [(c, s) for c, s in zip(configs, starts, strict=True) if s < c.steps]
    if len(todo) > 1 and len({s for _, s in todo}) == 1:
        train_ensemble([c for c, _ in todo])
        return
    for config, _ in todo:
        train(config)


#: The kind's tiny spec (tests/test_runs.py): the tiny model, one step of two prompts.
TINY_SPEC = RunSpec.make(
    "llm",
    "addition-1",
    "grpo",
    steps=1,
    group_size=2,
    prompts_per_step=2,
    lr=1e-3,
    definition={"task": "addition", "digits": 1},
    train={
        "model": "tiny",
        "max_new_tokens": 3,
        "eval_every": 1,
        "eval_prompts": 2,
        "offline": True,
        "save_model": False,
        "progress": False,
    },
)


@register_run(
    "llm",
    batched=True,
    batch_varies=(*BATCH_VARIES, "lr"),  # each member steps with its own AdamW
    replicates=False,
    logs_step0=True,
    tiny_spec=TINY_SPEC,
)
def llm_runs(specs: Sequence[RunSpec]) -> list[pd.DataFrame]:
    """One ``llm.train`` run per spec: one spec alone, several (one batch key) as one ensemble
    (:func:`llm.ensemble.train_ensemble`, whose ``check_members`` they satisfy: they differ only
    in rule, parameters, seed, step size and ``out``). A temporary ``out`` is removed before (an
    interrupted run restarts from step 0) and after; a resumable scratch ``out`` (``scratch``
    in the spec's ``train``) resumes from its checkpoint and is kept, finished, for the caller to
    remove once it has stored the frame (:func:`remove_scratch`)."""
    from llm import checkpoint
    from llm.ensemble import train_ensemble
    from llm.train import train

    configs = [train_config(spec) for spec in specs]
    kept = ["scratch" in dict(spec.train) for spec in specs]
    outs = [Path(config.out) for config in configs]
    try:
        # each checkpoint read once: the step a kept run resumes from, None to start afresh
        steps = [saved_step(str(o)) if keep else None for o, keep in zip(outs, kept, strict=True)]
        for out, step in zip(outs, steps, strict=True):
            if step is None:
                shutil.rmtree(out, ignore_errors=True)  # nothing to resume from
            else:  # a write cut by SIGKILL (a second Ctrl-C to a study) left its temp file
                checkpoint.discard_partial(str(out))
        if any(kept):
            configs = [
                replace(c, resume=s is not None) for c, s in zip(configs, steps, strict=True)
            ]
            train_runs(configs, [s or 0 for s in steps])
            logs = [logged_rows(c.out, c.steps) for c in configs]
        else:
            logs = [train(configs[0])] if len(configs) == 1 else train_ensemble(configs)
        frames = [run_frame(spec, rows) for spec, rows in zip(specs, logs, strict=True)]
    finally:
        for out, keep in zip(outs, kept, strict=True):
            if not keep:
                shutil.rmtree(out, ignore_errors=True)
    return frames


def remove_scratch(spec: RunSpec) -> None:
    """Remove ``spec``'s resumable scratch folder (a spec without ``scratch``: nothing), once
    its frame is stored (the claims study: after its part is written)."""
    scratch = dict(spec.train).get("scratch")
    if scratch is not None:
        shutil.rmtree(Path(scratch) / scratch_name(spec), ignore_errors=True)
