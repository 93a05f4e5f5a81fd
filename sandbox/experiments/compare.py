"""The default comparison: every objective and preset on a bandit suite, sampled and exact.

For each (setting, objective) pair it runs

* the sampled trainer (:func:`sandbox.train.run_bandit`): S seeds in one vectorised run, groups of
  G samples, mu epochs x minibatches per batch (so the ratio leaves 1 and clipping acts);
* the exact expected-gradient flow (:func:`sandbox.exact.exact_flow`) with the exact finite-group
  GRPO advantage and ``epochs * minibatches`` inner updates per step: the deterministic dynamics the
  sampled runs follow in expectation (rules without a closed form, clip_cov and kl_cov, have none).

The exact flows of all rules of a setting run as one batched program
(:func:`sandbox.exact.exact_flows`). Each finished run is written atomically as
``<out>/parts/<setting>__<label>__<kind>.parquet`` (``kind`` sampled or exact), so an interrupted
comparison resumes where it stopped; ``config.json`` records the training fields, and a rerun with
other ones is refused rather than mixed with the old parts. Then ``results.parquet`` (tidy: one
row per setting, objective, kind, seed, step), ``summary.csv`` and the figures are written.

Steps are 1-based, as in ``llm.train``'s ``metrics.jsonl``: the row of step s is logged after the
s-th rollout + update round, and its ``reward``, ``expected_reward`` and ``entropy`` describe the
policy that sampled that round (step 1: the initial policy), its clip fractions the round's
updates.

    clip-sandbox compare                       # the default (make demo), ~1 min on 2 cores
    clip-sandbox compare --suite reasoning     # tiny transformers on reasoning tasks, a few min
    clip-sandbox compare --objectives grpo dapo nsr_dapo --settings needle --seeds 64
    clip-sandbox compare --objectives dapo nsr --objective-params dapo:eps_high=0.3 nsr:sigma=0.05
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from envs import make_bandit_suite
from sandbox.exact.flow import exact_flows
from sandbox.objectives import available_objectives, available_presets, get_objective
from sandbox.train import BanditTrainConfig, SequenceTrainConfig, run_bandit, train_sequence

from .plots import HIGHLIGHT, final_scores, format_scores, render_all
from .pool import imap_unordered
from .results import (
    check_settings,
    part_name,
    prepare_out_dir,
    remove_temp_files,
    write_parquet_atomic,
)


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


#: A run name: letters, digits and ``_.=-`` (no path separators), not only dots.
NAME_PATTERN = re.compile(r"(?!\.+$)[A-Za-z0-9_.=-]+")


def check_name(name: str, what: str = "name") -> str:
    """A run name that stays inside its output folder, else ``ValueError`` naming ``what``."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{what}: use letters, digits and _.=- only (results go to OUT/NAME), got {name!r}"
        )
    return name


def _fmt(value: Any) -> str:
    """A parameter value as written in labels: shortest round-trip form for floats."""
    return repr(value) if isinstance(value, float) else str(value)


def variant_label(objective: str, params: Mapping[str, Any] | None = None) -> str:
    """``dapo[eps_high=0.3]`` (parameters sorted by name); the bare name without parameters."""
    if not params:
        return objective
    return f"{objective}[{','.join(f'{k}={_fmt(v)}' for k, v in sorted(params.items()))}]"


def _parse_value(text: str) -> Any:
    """A parameter value from the command line: int, float, true/false, none, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_objective_params(specs: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``["eps_high=0.3", "nsr:sigma=0.05"]`` -> ``{"*": {"eps_high": 0.3}, "nsr": {"sigma":
    0.05}}``: ``KEY=VALUE`` applies to every compared objective, ``NAME:KEY=VALUE`` to one."""
    parsed: dict[str, dict[str, Any]] = {}
    for spec in specs:
        named = ":" in spec.partition("=")[0]
        target, _, assignment = spec.partition(":") if named else ("*", "", spec)
        key, eq, value = assignment.partition("=")
        if not eq or not key.strip() or not target.strip():
            raise ValueError(
                f"objective_params: expected KEY=VALUE or NAME:KEY=VALUE, got {spec!r}"
            )
        parsed.setdefault(target.strip(), {})[key.strip()] = _parse_value(value)
    return parsed


@dataclass
class CompareConfig:
    """Settings of a comparison. Every field is a CLI flag of ``clip-sandbox compare``; fields
    left as None take the suite's default (:data:`SUITE_DEFAULTS`)."""

    suite: str = field(default="bandit", metadata={"help": "bandit or reasoning"})
    objectives: list[str] | None = field(
        default=None, metadata={"help": "objectives and presets (duplicates are dropped)"}
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
    objective_params: dict[str, dict[str, Any]] | None = field(
        default=None,
        metadata={
            "help": "objective parameters: KEY=VALUE for every objective or NAME:KEY=VALUE for "
            "one (e.g. dapo:eps_high=0.3); results are labelled dapo[eps_high=0.3]"
        },
    )

    def __post_init__(self) -> None:
        if self.suite not in SUITE_DEFAULTS:
            raise ValueError(f"suite must be one of {sorted(SUITE_DEFAULTS)}, got {self.suite!r}")
        for key, value in SUITE_DEFAULTS[self.suite].items():
            if getattr(self, key) is None:
                setattr(self, key, list(value) if isinstance(value, list) else value)
        if self.objectives is None:
            self.objectives = default_objectives()
        self.objectives = list(dict.fromkeys(self.objectives))  # dapo dapo -> one run
        self.settings = list(dict.fromkeys(self.settings))
        valid = sorted(make_bandit_suite() if self.suite == "bandit" else REASONING_SUITE)
        for name in self.settings:
            if name not in valid:
                raise ValueError(f"settings: unknown setting {name!r}; valid: {valid}")
        if not self.objectives:
            raise ValueError("objectives must not be empty")
        for name in self.objectives:
            get_objective(name)  # ValueError naming the valid names
        self.objective_params = self._resolve_params(self.objective_params or {})
        if self.suite == "bandit":
            self.train_config("grpo")  # validates the shared training fields
        else:
            self.sequence_config(self.settings[0], "grpo")

    def _resolve_params(self, given: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
        """Expand ``"*"`` to every objective and check each set through ``get_objective``."""
        unknown = sorted(set(given) - {"*", *self.objectives})
        if unknown:
            raise ValueError(
                f"objective_params: {unknown} not among the compared objectives {self.objectives}"
            )
        resolved = {}
        for name in self.objectives:
            params = {**given.get("*", {}), **given.get(name, {})}
            if not params:
                continue
            try:
                get_objective(name, **params)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"objective_params: {name} with {params}: {exc}") from exc
            resolved[name] = dict(sorted(params.items()))
        return resolved

    def params(self, objective: str) -> dict[str, Any]:
        """The keyword arguments given to ``objective`` (empty: the preset or paper defaults)."""
        return dict((self.objective_params or {}).get(objective, {}))

    def label(self, objective: str) -> str:
        """The name of ``objective`` in results and figures: ``dapo`` or ``dapo[eps_high=0.3]``."""
        return variant_label(objective, self.params(objective))

    def train_config(self, objective: str) -> BanditTrainConfig:
        return BanditTrainConfig(
            objective=objective, objective_params=self.params(objective), seeds=self.seeds,
            steps=self.steps, group_size=self.group_size, prompts_per_batch=self.prompts_per_batch,
            epochs=self.epochs, minibatches=self.minibatches, optimizer=self.optimizer, lr=self.lr,
            seed=self.seed,
        )  # fmt: skip

    def sequence_config(self, setting: str, objective: str) -> SequenceTrainConfig:
        task, knobs = REASONING_SUITE[setting]
        return SequenceTrainConfig(
            task=task, task_knobs=dict(knobs), objective=objective,
            objective_params=self.params(objective), seeds=self.seeds, steps=self.steps,
            prompts_per_batch=self.prompts_per_batch, group_size=self.group_size,
            epochs=self.epochs, minibatches=self.minibatches, lr=self.lr, seed=self.seed,
        )  # fmt: skip

    def training_fields(self) -> dict[str, Any]:
        """What every finished part depends on besides its (setting, objective, parameters),
        which its file name records: a part is reused only while these are unchanged."""
        skip = ("objectives", "settings", "objective_params")
        return json.loads(json.dumps({k: v for k, v in asdict(self).items() if k not in skip}))

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}


def optimum(model: Any) -> float:
    """Best achievable expected reward of a bandit model (prompt-weighted for contextual)."""
    best = np.asarray(model.mean_rewards).max(-1)
    return float(np.dot(model.prompt_probs, best)) if np.ndim(best) else float(best)


def _label_frame(frame: pd.DataFrame, config: CompareConfig, setting: str, objective: str,
                 best: float) -> pd.DataFrame:  # fmt: skip
    """Add the key columns; steps become 1-based (step s: the s-th rollout + update round)."""
    frame.insert(0, "suite", config.suite)
    frame.insert(1, "setting", setting)
    frame.insert(2, "objective", config.label(objective))
    frame["step"] = frame["step"] + 1
    frame["optimum"] = best
    return frame


def run_sampled(config: CompareConfig, setting: str, objective: str) -> pd.DataFrame:
    """The sampled runs (``config.seeds`` seeds, vectorised) of one objective on one setting."""
    if config.suite == "reasoning":
        frame = train_sequence(config.sequence_config(setting, objective))
        frame.insert(0, "kind", "sampled")
        return _label_frame(frame, config, setting, objective, 1.0)
    model = make_bandit_suite()[setting].make().unwrapped
    frame = run_bandit(model, config.train_config(objective)).to_frame()
    frame.insert(0, "kind", "sampled")
    return _label_frame(frame, config, setting, objective, optimum(model))


def _flow_kwargs(config: CompareConfig) -> dict[str, Any]:
    return dict(
        steps=config.steps, lr=config.lr, advantage="grpo", group_size=config.group_size,
        epochs=config.epochs * config.minibatches, optimizer=config.optimizer,
    )  # fmt: skip


def run_exact(config: CompareConfig, setting: str, objectives: list[str]) -> list[pd.DataFrame]:
    """The exact expected-gradient flows of ``objectives`` (all with a closed form) on one bandit
    setting, as one batched program (:func:`sandbox.exact.exact_flows`)."""
    model = make_bandit_suite()[setting].make().unwrapped
    objs = [get_objective(o, **config.params(o)) for o in objectives]
    frames = exact_flows(objs, model, **_flow_kwargs(config))
    out = []
    for objective, frame in zip(objectives, frames, strict=True):
        frame.insert(0, "kind", "exact")
        frame.insert(2, "seed", -1)
        out.append(_label_frame(frame, config, setting, objective, optimum(model)))
    return out


def has_exact(config: CompareConfig, objective: str) -> bool:
    """Bandit suite and a closed-form ``expected_coef`` (not clip_cov, kl_cov)."""
    return (
        config.suite == "bandit"
        and get_objective(objective, **config.params(objective)).has_expected_coef()
    )


def run_pair(config: CompareConfig, setting: str, objective: str) -> pd.DataFrame:
    """Sampled runs and (where defined) the exact flow of one objective on one setting."""
    frames = [run_sampled(config, setting, objective)]
    if has_exact(config, objective):
        frames += run_exact(config, setting, [objective])
    return pd.concat(frames, ignore_index=True)


def _part(config: CompareConfig, setting: str, objective: str, kind: str) -> str:
    return part_name(setting, config.label(objective), kind)


def _job(config: CompareConfig, kind: str, setting: str, objectives: list[str]) -> list:
    """Worker entry: one sampled run, or the batched exact flows of a setting."""
    if kind == "sampled":
        return [run_sampled(config, setting, objectives[0])]
    return run_exact(config, setting, objectives)


def check_resume(config: CompareConfig, out_dir: Path, force: bool) -> None:
    """Refuse to mix finished parts trained with other settings (``force``: delete them).

    A part's file name records its setting, objective and parameters; everything else it
    depends on (steps, seeds, lr, optimizer, ...) is in ``config.json``
    (:func:`~.results.check_settings`)."""
    check_settings(
        out_dir, config.training_fields(), force=force,
        hint="run the same command as before to resume, or use another --name, or --force to "
        "recompute",
    )  # fmt: skip


def plan_jobs(config: CompareConfig, parts: Path, force: bool) -> tuple[list[str], list[tuple]]:
    """The part files of the comparison and the jobs for those not finished."""
    wanted, todo = [], []
    for setting in config.settings:
        exact_todo = []
        for objective in config.objectives:
            name = _part(config, setting, objective, "sampled")
            wanted.append(name)
            if force or not (parts / name).exists():
                todo.append(("sampled", setting, [objective]))
            if has_exact(config, objective):
                name = _part(config, setting, objective, "exact")
                wanted.append(name)
                if force or not (parts / name).exists():
                    exact_todo.append(objective)
        if exact_todo:  # first: the batched flows are the longest job of a setting
            todo.insert(0, ("exact", setting, exact_todo))
    return wanted, todo


def run_compare(
    config: CompareConfig,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
    figures: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run (or resume) a comparison into ``out_dir``; returns ``(results, scores)``.

    Finished parts are reused only if ``config.json`` shows the same training fields; otherwise
    a ``ValueError`` (``force``: recompute everything). ``workers`` processes (default
    ``min(cpus, 4)``; 1 runs here) from a forkserver pool (:mod:`.pool`). Ctrl-C or SIGTERM stop
    at once with ``KeyboardInterrupt`` (:class:`~.pool.Terminated` for SIGTERM); every finished
    run is on disk, and the same call resumes with the missing ones.
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):  # fmt: skip
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    out_dir = prepare_out_dir(out_dir)
    parts = out_dir / "parts"
    check_resume(config, out_dir, force)
    parts.mkdir(parents=True, exist_ok=True)
    remove_temp_files(parts)
    (out_dir / "config.json").write_text(json.dumps(asdict(config), indent=2))
    wanted, todo = plan_jobs(config, parts, force)
    done = sum((parts / name).exists() for name in wanted) if not force else 0
    if done:
        print(f"{done} of {len(wanted)} runs already done in {out_dir}; running the other "
              f"{len(wanted) - done}", file=sys.stderr, flush=True)  # fmt: skip
    workers = workers or min(os.cpu_count() or 1, 4)
    bar = tqdm(total=len(wanted), initial=done, disable=not progress, desc="compare", unit="run")
    jobs = [((kind, s, objs), (config, kind, s, objs)) for kind, s, objs in todo]
    try:
        if workers <= 1 or len(todo) <= 1:
            stream = ((key, _job(*args)) for key, args in jobs)
        else:
            stream = imap_unordered(_job, jobs, min(workers, len(todo)))
        with contextlib.closing(stream):
            for (kind, setting, objectives), frames in stream:
                for objective, frame in zip(objectives, frames, strict=True):
                    write_parquet_atomic(frame, parts / _part(config, setting, objective, kind))
                    bar.update()
                bar.set_postfix_str(f"{setting}/{kind}", refresh=False)
    finally:
        bar.close()

    # Every part in the folder was made with these training settings (check_resume), so the
    # tables cover them all: a later run of a subset of rules adds to the tables, never shrinks them.
    known = set(wanted)
    others = sorted(p.name for p in parts.glob("*.parquet") if p.name not in known)
    results = pd.concat([pd.read_parquet(parts / n) for n in [*wanted, *others]], ignore_index=True)
    write_parquet_atomic(results, out_dir / "results.parquet")
    scores = final_scores(results)
    scores.to_csv(out_dir / "summary.csv", index=False)
    if figures:
        labels = [config.label(o) for o in config.objectives]
        highlight = [config.label(o) for o in HIGHLIGHT if o in config.objectives]
        highlight += [label for label in labels if label not in highlight]
        render_all(results, out_dir, highlight[:12])
    return results, scores


def progress_line(config: CompareConfig, out_dir: str | Path) -> str:
    """``N of M runs finished in OUT`` (for the resume hint after an interruption)."""
    parts = Path(out_dir) / "parts"
    wanted, _ = plan_jobs(config, parts, force=False)
    done = sum((parts / name).exists() for name in wanted)
    return f"{done} of {len(wanted)} runs finished in {out_dir}"


def main(config: CompareConfig, out_dir: str | Path, **kwargs: Any) -> pd.DataFrame:
    """Run, then print the summary table and the wall time (the CLI entry)."""
    start = time.perf_counter()
    _, scores = run_compare(config, out_dir, **kwargs)
    print(format_scores(scores))
    print(
        f"\n{len(config.objectives)} objectives x {len(config.settings)} settings, "
        f"{config.seeds} seeds x {config.steps} steps: {time.perf_counter() - start:.1f} s. "
        f"Wrote {Path(out_dir) / 'results.parquet'}, summary.csv and figures."
    )
    return scores
