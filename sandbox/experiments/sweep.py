"""Sweeps: a grid over objectives x hyperparameters x settings x seeds, and the one engine that
runs every grid (a sweep file's, and the default comparison's: :func:`compare_plan`).

A sweep file (TOML or YAML; its keys and examples in docs/sweeps.md) names the suite, the shared
training fields of :class:`~.compare.CompareConfig`, a ``[[grid]]`` of objectives whose
``params`` lists are expanded as a cartesian product, and optionally ``[train]`` (further trainer
fields), ``[envs.NAME]`` (bandit suite: a custom setting, ``env`` plus the env's kwargs) and
``[tasks.NAME]`` (reasoning suite: ``task`` plus its knobs). Everything is validated before any
run starts; a bad name or value raises ``ValueError`` naming the field (``grid[1].params.sigma``).

One run is one (setting, variant, base seed): the sampled trainer over ``seeds`` seeds and, where
the objective has one (:func:`with_exact_flow`), the exact expected-gradient flow.
:func:`run_sweep` writes each finished part atomically in ``<out>/parts/``, named as the plan's
one storage layout of every plan says (a part per sampled run or exact flow: its run id, the flow
and a hash of what made the run, :meth:`~.runs.RunSpec.digest`). A restart skips finished parts, so an interrupted sweep
loses nothing and recomputes nothing; a changed setting names other parts, which it computes, and
its tables hold its own runs only. Runs go to a local process pool or to Ray
tasks (each run writes its own parts: on a multi-node Ray cluster ``--out`` lies on a filesystem
every node mounts). At the end: ``results.parquet``
(tidy; ``objective`` holds the variant label such as ``nsr[noise=band,sigma=0.1]``),
``summary.csv`` (final scores) and the standard figures.

    clip-sandbox sweep sweeps/atr_delta.toml                      # local process pool
    clip-sandbox sweep sweeps/atr_delta.toml --dry-run            # validate and list the runs
    clip-sandbox sweep sweeps/nsr_noise.toml --backend ray --address auto
"""

from __future__ import annotations

import copy
import itertools
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from envs.bandit import BanditSetting
from sandbox.configs import check_int, check_keys, read_mapping
from sandbox.objectives import get_objective
from sandbox.train import BanditTrainConfig, SequenceTrainConfig

from .compare import (
    SUITE_DEFAULTS,
    CompareConfig,
    check_name,
    check_params,
    check_setting_names,
    check_task,
    run_spec,
    standard_settings,
)
from .planner import Job, RunFolder, check_backend
from .plots import HIGHLIGHT, final_scores, format_scores, render_all
from .results import (
    prune_parts,
    recording_tables,
    write_csv,
    write_parquet_if_changed,
)
from .runs import (
    EXACT,
    SAMPLED,
    RunSpec,
    format_value,
    freeze,
    has_exact_flow,
    run_kind,
    run_specs,
    trainer_config,
    variant_label,
)

#: Shared training fields a sweep file may set at top level (CompareConfig's, less the ones the
#: grid owns).
SHARED_FIELDS = tuple(
    f.name for f in fields(CompareConfig) if f.name not in ("objectives", "objective_params")
)
TOP_LEVEL_KEYS = ("name", "description", "grid", "train", "envs", "tasks", *SHARED_FIELDS)
GRID_KEYS = ("objective", "params")
#: Trainer fields the sweep sets itself; ``[train]`` may not override them.
MANAGED_TRAIN_FIELDS = ("objective", "objective_params", "seed", "task", "task_knobs")
#: The first columns of every part (``optimum`` is its last).
HEAD_COLUMNS = ("suite", "setting", "objective", "kind", "step", "seed")
#: Columns a sweep's run adds to the trainer's frame.
RUN_COLUMNS = ("base_objective", "variant", "run_id", "run_seed")
#: A swept parameter with one of these names (``seed`` of nsr, say) is stored as ``param_<name>``.
RESERVED_COLUMNS = (*HEAD_COLUMNS, "optimum", *RUN_COLUMNS)
#: Compare's sampled runs of a setting go to this many jobs of near-equal size (fewer when there
#: are fewer runs): the rules of a job train as one program (:func:`~.runs.bandit_sampled`; the
#: more rules, the less each costs), and two per setting keep a pool's two workers busy.
SAMPLED_JOBS_PER_SETTING = 2

Variant = tuple[str, tuple[tuple[str, Any], ...]]  # (rule, params sorted by name)
Parts = list[tuple[str, list[RunSpec]]]  # (part file name, the specs whose frames it holds)


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------


@dataclass
class SweepPlan:
    """A validated grid: shared training fields, settings, base seeds and variants. Its runs are
    stored one way (a sweep's and a comparison's alike): a part per sampled run or exact flow
    (:meth:`parts`), ``plan.json``, tables with :data:`RUN_COLUMNS` and the variants' parameters.
    ``rules_per_job``: at most this many sampled runs per job (None: :func:`chunks`' default);
    ``title``: the progress bar's (default ``sweep NAME``); ``describe``: the plan is printed
    before the runs; ``highlight``: the line plots show :data:`~.plots.HIGHLIGHT`'s rules first
    (:func:`highlighted`; else :func:`~.plots.pick_lines` picks them)."""

    name: str
    config: CompareConfig  # the shared training fields (and the suite)
    settings: list[str]
    seeds: list[int]
    variants: list[Variant]
    setting_defs: dict[str, dict[str, Any]]  # setting -> RunSpec.definition (env or task + knobs)
    train: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    source: str | None = field(default=None, compare=False)
    rules_per_job: int | None = 1
    title: str = ""
    describe: bool = True
    highlight: bool = False

    @property
    def suite(self) -> str:
        return self.config.suite

    def runs(self) -> list[RunSpec]:
        """Every run's sampled spec, in a fixed order: setting, then variant, then base seed."""
        return [
            run_spec(
                self.config,
                setting,
                rule,
                params=params,
                seed=seed,
                definition=self.setting_defs[setting],
                train=self.train,
            )
            for setting, (rule, params), seed in itertools.product(
                self.settings, self.variants, self.seeds
            )
        ]

    def parts(self) -> Parts:
        """Every part file the plan wants, in plan order, with the specs whose frames it holds."""
        return [
            (spec.part_of(f"{run_id(run)}__{run_kind(spec.kind).flow}"), [spec])
            for run in self.runs()
            for spec in with_exact_flow(run)
        ]

    def jobs(self, todo: Parts) -> list[Job]:
        """The jobs of the parts ``todo``: per setting, the parts that are exact flows in one
        batched job, then the others in chunks of :attr:`rules_per_job`, each job's
        specs run as one :func:`~.runs.run_specs` call."""
        jobs = []
        for setting in self.settings:
            here = [part for part in todo if part[1][0].setting == setting]
            exact = [p for p in here if all(run_kind(s.kind).deterministic for s in p[1])]
            groups = [(EXACT, exact)] if exact else []
            sampled = [p for p in here if p not in exact]
            groups += [(SAMPLED, c) for c in chunks(sampled, self.rules_per_job)]
            for flow, group in groups:
                names, specs = zip(*group, strict=True)
                first = run_id(specs[0][0])  # the readable name of its first run
                key = first if len(group) == 1 else f"{setting}/{flow}"
                jobs.append(Job(key, names, (self.suite, list(specs))))
        return jobs

    def finished(self, out_dir: str | Path) -> tuple[int, int]:
        """(parts on disk, parts wanted) in ``out_dir``."""
        names = [name for name, _ in self.parts()]
        return sum((Path(out_dir) / "parts" / name).exists() for name in names), len(names)

    def training_fields(self) -> dict[str, Any]:
        """What every run shares (a finished part is only reused if these are unchanged):
        compare's, less the base seed, which each run's id records."""
        shared = {k: v for k, v in self.config.training_fields().items() if k != "seed"}
        defs = {s: self.setting_defs[s] for s in self.settings}
        return _jsonable({"shared": shared, "train": self.train, "setting_defs": defs})

    def labels(self) -> list[str]:
        """Each variant's label (:func:`~.runs.variant_label`): ``nsr[noise=band,sigma=0.1]``."""
        return [variant_label(rule, dict(params)) for rule, params in self.variants]

    def to_dict(self) -> dict[str, Any]:
        """The resolved plan, JSON-friendly (written to ``<out>/plan.json``)."""
        variants = [
            {"label": label, "objective": rule, "params": dict(params)}
            for label, (rule, params) in zip(self.labels(), self.variants, strict=True)
        ]
        plan = dict(name=self.name, suite=self.suite, description=self.description)
        plan |= dict(settings=self.settings, seed=self.seeds, **self.training_fields())
        return _jsonable(plan | dict(variants=variants, runs=len(self.runs())))

    def variant_table(self) -> pd.DataFrame:
        """One row per variant: label, base objective and one column per swept parameter."""
        return pd.DataFrame(
            [
                {"objective": label, "base_objective": rule}
                | {_param_column(k): value for k, value in params}
                for label, (rule, params) in zip(self.labels(), self.variants, strict=True)
            ]
        )


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _param_column(name: str, taken: Iterable[str] = ()) -> str:
    return f"param_{name}" if name in RESERVED_COLUMNS or name in set(taken) else name


def run_id(spec: RunSpec) -> str:
    """Stable across processes and restarts: the run's readable name (setting, rule slug, base
    seed; :meth:`~.runs.RunSpec.stem` without the kind), the start of its part's name."""
    return spec.stem(kind=False)


def with_exact_flow(spec: RunSpec) -> list[RunSpec]:
    """A sampled run and, where its kind has an exact counterpart (:attr:`~.runs.RunKind.exact`)
    with this rule's flow (:func:`~.runs.has_exact_flow`), that flow."""
    kind = run_kind(spec.kind)
    if kind.deterministic or kind.exact is None:
        return [spec]
    exact = replace(spec, kind=kind.exact)
    return [spec, exact] if has_exact_flow(exact) else [spec]


def chunks(items: list, size: int | None) -> list[list]:
    """``items`` in consecutive chunks: of at most ``size`` each, or (``size`` None)
    :data:`SAMPLED_JOBS_PER_SETTING` chunks of near-equal size."""
    count = len(items)
    parts = -(-count // size) if size else min(SAMPLED_JOBS_PER_SETTING, count)
    bounds = [round(i * count / parts) for i in range(parts + 1)] if parts else [0]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


# ------------------------------------------------------------------------------------------------
# parsing and validation
# ------------------------------------------------------------------------------------------------


def load_sweep(path: str | Path) -> SweepPlan:
    """Read and validate a ``.toml``, ``.yaml`` or ``.yml`` sweep file (read by
    :func:`sandbox.configs.read_mapping`, the reader of ``--config`` files too)."""
    plan = parse_sweep(read_mapping(path, "sweep file"))
    plan.source = str(path)
    return plan


def _as_list(key: str, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"{key}: needs at least one value")
    return values


def _parse_grid(grid: Any) -> list[Variant]:
    if not isinstance(grid, list) or not grid:
        raise ValueError("grid: needs at least one [[grid]] entry (objective = ..., params = ...)")
    variants = []
    for i, entry in enumerate(grid):
        where = f"grid[{i}]"
        entry = {"objective": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a table with objective and params, got {entry!r}")
        check_keys(where, entry, GRID_KEYS)
        if "objective" not in entry:
            raise ValueError(f"{where}.objective: missing (a registry name or preset)")
        names = _as_list(f"{where}.objective", entry["objective"])
        params = entry.get("params", {})
        if not isinstance(params, dict):
            raise ValueError(f"{where}.params: expected a table of name -> values, got {params!r}")
        axes = {k: _as_list(f"{where}.params.{k}", v) for k, v in params.items()}
        for name in names:
            if not isinstance(name, str):
                raise ValueError(f"{where}.objective: expected a name, got {name!r}")
            try:
                get_objective(name)
            except ValueError as exc:
                raise ValueError(f"{where}.objective: {exc}") from exc
            for combo in itertools.product(*axes.values()):
                combo_params = dict(zip(axes, combo, strict=True))
                check_params(f"{where}.params", name, combo_params, name_key=True)
                variants.append((name, freeze(combo_params)))
    check_unique(
        "grid", [variant_label(rule, dict(params)) for rule, params in variants], "variant"
    )
    return variants


def check_unique(where: str, values: Iterable[Any], what: str, hint: str = "") -> None:
    """``ValueError`` ``WHERE: WHAT x appears twice`` (then ``hint``) for the first value of
    ``values`` seen before."""
    seen = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{where}: {what} {value} appears twice{hint}")
        seen.add(value)


def _check_env(where: str, env_id: str, kwargs: dict[str, Any]) -> None:
    try:
        model = BanditSetting(env_id, kwargs).make().unwrapped
    except Exception as exc:  # gymnasium raises its own error types
        raise ValueError(f"{where}: cannot make {env_id} with {kwargs}: {exc}") from exc
    if not hasattr(model, "mean_rewards"):
        raise ValueError(f"{where}.env: {env_id} is not a bandit with an exact model")


#: A custom setting of each suite: its table, its key, what that key names, and its check.
CUSTOM_SETTINGS = {
    "bandit": ("envs", "env", "a registered id such as sandbox/SoftmaxBandit-v0", _check_env),
    "reasoning": ("tasks", "task", "one of envs.reasoning.available_tasks()", check_task),
}


def _parse_settings(suite: str, spec: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The sweep's settings and each one's definition (standard or from [envs] / [tasks]), as
    :attr:`RunSpec.definition` holds it: ``env`` or ``task``, then the kwargs or knobs."""
    own_key, key, what, check = CUSTOM_SETTINGS[suite]
    other_key = "tasks" if own_key == "envs" else "envs"
    if other_key in spec:
        raise ValueError(f"{other_key}: not used by the {suite} suite (use [{own_key}.NAME])")
    defs = standard_settings(suite)
    custom = spec.get(own_key, {})
    if not isinstance(custom, dict):
        raise ValueError(f"{own_key}: expected tables [{own_key}.NAME], got {custom!r}")
    for name, table in custom.items():
        where = f"{own_key}.{name}"
        if name in defs:
            raise ValueError(f"{where}: shadows the standard setting {name!r}; pick another name")
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected a table, got {table!r}")
        kwargs = dict(table)
        made_from = kwargs.pop(key, None)
        if not isinstance(made_from, str):
            raise ValueError(f"{where}.{key}: missing ({what})")
        check(where, made_from, kwargs)
        defs[name] = {key: made_from, **kwargs}
    settings = _as_list("settings", spec.get("settings", SUITE_DEFAULTS[suite]["settings"]))
    check_setting_names(settings, defs)
    check_unique("settings", settings, "setting")
    return list(settings), {s: defs[s] for s in settings}


def parse_sweep(spec: Mapping[str, Any]) -> SweepPlan:
    """Validate a sweep mapping (as read from TOML or YAML) into a :class:`SweepPlan`."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"a sweep is a mapping of keys, got {type(spec).__name__}")
    spec = dict(spec)
    check_keys("", spec, TOP_LEVEL_KEYS)
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("name: missing (the sweep's name; results go to OUT/NAME)")
    check_name(name)
    suite = spec.get("suite", "bandit")
    if suite not in ("bandit", "reasoning"):
        raise ValueError(f"suite must be 'bandit' or 'reasoning', got {suite!r}")
    seeds = _as_list("seed", spec.get("seed", 0))
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed: base seeds are integers >= 0, got {seed!r}")
    check_unique("seed", seeds, "base seed")

    variants = _parse_grid(spec.get("grid"))
    settings, setting_defs = _parse_settings(suite, spec)
    owned = ("suite", "settings", "seed")
    shared = {k: spec[k] for k in SHARED_FIELDS if k in spec and k not in owned}
    objectives = list(dict.fromkeys(rule for rule, _ in variants))
    try:
        # the suite's default settings here: CompareConfig only knows the standard ones
        config = CompareConfig(suite=suite, objectives=objectives, seed=seeds[0], **shared)
    except TypeError as exc:
        raise ValueError(f"shared training fields: {exc}") from exc
    config.settings = list(settings)  # a record from here on (custom settings included)

    train = spec.get("train", {})
    if not isinstance(train, dict):
        raise ValueError(f"train: expected a table of trainer fields, got {train!r}")
    trainer_cls = BanditTrainConfig if suite == "bandit" else SequenceTrainConfig
    valid = [f.name for f in fields(trainer_cls) if f.name not in MANAGED_TRAIN_FIELDS]
    for key in train:
        if key not in valid:
            raise ValueError(f"train.{key}: not a field of {trainer_cls.__name__}; valid: {valid}")
        if key in SHARED_FIELDS:
            raise ValueError(f"train.{key}: a shared field, set it at top level")

    plan = SweepPlan(
        name=name,
        config=config,
        settings=settings,
        seeds=list(seeds),
        variants=variants,
        setting_defs=setting_defs,
        train=dict(train),
        description=str(spec.get("description", "")),
    )
    # every (setting, variant) builds its trainer config: the shared fields, [train], the task
    # and the objective's parameters are checked together, before anything runs
    for run in plan.runs()[:: len(seeds)]:  # the first base seed of each: seeds vary fastest
        try:
            trainer_config(run)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{run.label} on {run.setting}: {exc}") from exc
    check_unique(
        "grid", map(run_id, plan.runs()), "run id", " (two runs map to it; rename a value)"
    )
    return plan


def with_overrides(
    plan: SweepPlan, *, seeds: int | None = None, steps: int | None = None
) -> SweepPlan:
    """The plan with the shared ``seeds`` and/or ``steps`` replaced (``clip-sandbox sweep FILE
    --seeds 2 --steps 5`` for a smoke run), validated like the file's own values."""
    if seeds is None and steps is None:
        return plan
    config = copy.copy(plan.config)  # not replace(): custom settings are not CompareConfig's
    for key, value in (("seeds", seeds), ("steps", steps)):
        if value is not None:
            setattr(config, key, check_int(key, value))
    new = replace(plan, config=config)  # the source too
    trainer_config(new.runs()[0])  # the trainer's checks
    return new


# ------------------------------------------------------------------------------------------------
# the engine
# ------------------------------------------------------------------------------------------------


def label_frame(frame: pd.DataFrame, suite: str) -> pd.DataFrame:
    """A run kind's frame in the results' columns: ``suite``, ``setting``, ``objective`` (the
    variant label) and ``kind`` (the run kind's :attr:`~.runs.RunKind.flow`: sampled or exact)
    first."""
    frame = frame.rename(columns={"rule": "objective"})
    frame["kind"] = frame["kind"].map(lambda name: run_kind(name).flow)
    frame.insert(0, "suite", suite)
    return frame[[*HEAD_COLUMNS, *[c for c in frame.columns if c not in HEAD_COLUMNS]]]


def add_run_columns(frame: pd.DataFrame, spec: RunSpec) -> pd.DataFrame:
    """A sweep run's columns: ``base_objective``, ``variant``, ``run_id``, ``run_seed`` (the base
    seed) and one per parameter (``param_<name>`` where the name is taken)."""
    taken = list(frame.columns)
    frame["base_objective"] = spec.rule
    frame["variant"] = spec.label
    frame["run_id"] = run_id(spec)
    frame["run_seed"] = spec.seed
    for key, value in spec.params:
        frame[_param_column(key, taken)] = value
    return frame


def run_parts(suite: str, parts: list[list[RunSpec]]) -> list[pd.DataFrame]:
    """Worker entry (process pool or Ray task), one thread: a tidy frame per part, from all the
    parts' specs run as one :func:`~.runs.run_specs` call (batched where a kind allows): each
    spec's frame labelled (:func:`label_frame`), ``optimum`` last, with the run's columns
    (:func:`add_run_columns`)."""
    torch.set_num_threads(1)  # small tensors: threads only contend with the other workers
    frames = iter(run_specs([spec for specs in parts for spec in specs]))
    out = []
    for specs in parts:
        frame = pd.concat([label_frame(next(frames), suite) for _ in specs], ignore_index=True)
        frame = frame[[c for c in frame.columns if c != "optimum"] + ["optimum"]]
        out.append(add_run_columns(frame, specs[0]))
    return out


class SweepRunError(RuntimeError):
    """A run failed; the runs finished before it are saved, a rerun resumes after them."""


def summarize(plan: SweepPlan, scores: pd.DataFrame) -> pd.DataFrame:
    """The final scores with each variant's base objective and parameters."""
    table = plan.variant_table()
    scores = scores.merge(table, on="objective", how="left")
    front = ["setting", "objective", *[c for c in table.columns if c != "objective"]]
    return scores[front + [c for c in scores.columns if c not in front]]


def highlighted(plan: SweepPlan) -> list[str]:
    """The labels of :data:`~.plots.HIGHLIGHT`'s rules first, then the others, at most 12."""
    labels = dict(zip([rule for rule, _ in plan.variants], plan.labels(), strict=True))
    first = [labels[rule] for rule in HIGHLIGHT if rule in labels]
    return [*first, *[label for label in labels.values() if label not in first]][:12]


def collect_results(plan: SweepPlan, parts_dir: str | Path) -> pd.DataFrame:
    """The plan's parts (never another run in the folder), as one tidy frame: the runs' columns
    first, then ``optimum``, :data:`RUN_COLUMNS` and the variants' parameters."""
    names = [name for name, _ in plan.parts()]
    results = pd.concat([pd.read_parquet(Path(parts_dir) / n) for n in names], ignore_index=True)
    params = [c for c in plan.variant_table().columns if c not in ("objective", "base_objective")]
    tail = [c for c in ("optimum", *RUN_COLUMNS, *params) if c in results.columns]
    results = results[[c for c in results.columns if c not in tail] + tail]
    # a parameter that is a string for one objective and a number for another: store as text
    for column in [c for c in results.columns if pd.api.types.is_object_dtype(results[c])]:
        if len({type(v) for v in results[column].dropna()}) > 1:
            results[column] = results[column].map(lambda v: v if pd.isna(v) else format_value(v))
    return results


def run_sweep(
    plan: SweepPlan,
    out_dir: str | Path,
    *,
    backend: str = "local",
    workers: int | None = None,
    address: str | None = None,
    progress: bool = True,
    force: bool = False,
    figures: bool = True,
    prune: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run (or resume) ``plan`` into ``out_dir``; returns ``(results, scores)``.

    ``backend="local"``: a process pool of ``workers`` processes (default ``min(cpus, 4)``; 1 runs
    in this process), which draws the figures too. ``backend="ray"``: one Ray task per job on the
    cluster at ``address``, or on a local Ray instance with ``workers`` CPUs (all CPUs if None);
    an already initialised Ray is used as it is. The plan's finished parts are reused (their
    names say what made them; ``force``: recompute them), the others computed. Ctrl-C or SIGTERM stop at once with ``KeyboardInterrupt``
    (:class:`~.signals.Terminated` for SIGTERM), a failing run with :class:`SweepRunError`; every
    finished part is on disk, and the same call resumes with the missing ones. ``prune``: once
    every part of the plan is on disk, the folder's other parts (runs of other settings, which
    their names keep apart) are deleted (:func:`~.results.prune_parts`).
    """
    check_backend(backend, workers)  # before anything is written
    folder = RunFolder(out_dir, plan.to_dict(), record="plan.json", force=force)
    parts = plan.parts()
    folder.run(
        run_parts,
        plan.jobs([part for part in parts if not folder.done(part[0])]),
        total=len(parts),
        workers=workers,
        progress=progress,
        desc=plan.title or f"sweep {plan.name}",
        backend=backend,
        address=address,
        error=SweepRunError,
    )

    results = collect_results(plan, folder.parts)
    if prune:
        prune_parts(folder.out, {name for name, _ in parts})
    with recording_tables(folder.out):  # files rewritten only when their bytes change
        write_parquet_if_changed(results, folder.out / "results.parquet")
        scores = summarize(plan, final_scores(results))
        write_csv(scores, folder.out / "summary.csv")
        if figures:
            lines = highlighted(plan) if plan.highlight else None
            render_all(results, folder.out, lines, scores)
    return results, scores


def describe_plan(plan: SweepPlan, out_dir: str | Path | None = None) -> str:
    """A short text description of the runs (``clip-sandbox sweep --dry-run``)."""
    shared = ", ".join(f"{k}={v}" for k, v in plan.training_fields()["shared"].items())
    lines = [
        f"sweep {plan.name} ({plan.suite}): {len(plan.variants)} variants x "
        f"{len(plan.settings)} settings x {len(plan.seeds)} base seeds = {len(plan.runs())} runs",
        f"  settings: {', '.join(plan.settings)};  base seeds: {plan.seeds}",
        f"  shared: {shared}" + (f";  train: {plan.train}" if plan.train else ""),
        f"  variants: {', '.join(plan.labels())}",
    ]
    if out_dir is not None:
        done, total = plan.finished(out_dir)
        lines.append(
            f"  {out_dir}: {done} of {total} parts finished (a sampled run or exact flow each)"
        )
    return "\n".join(lines)


def compare_plan(config: CompareConfig, rules_per_job: int | None = None) -> SweepPlan:
    """The comparison as a grid for the sweep engine: one entry per objective with its
    parameters, the standard settings, one base seed; :data:`~.plots.HIGHLIGHT` rules first in
    its line plots (at most 12).
    ``rules_per_job``: at most this many sampled runs per job (None: a setting's runs in
    :data:`SAMPLED_JOBS_PER_SETTING` jobs; 1: one job per run)."""
    if rules_per_job is not None:
        check_int("rules_per_job", rules_per_job)
    standard = standard_settings(config.suite)
    return SweepPlan(
        name="compare",
        config=config,
        settings=list(config.settings),
        seeds=[config.seed],
        variants=[(rule, freeze(config.params(rule))) for rule in config.objectives],
        setting_defs={setting: standard[setting] for setting in config.settings},
        rules_per_job=rules_per_job,
        title="compare",
        describe=False,
        highlight=True,
    )


def run_compare(
    config: CompareConfig, out_dir: str | Path, *, rules_per_job: int | None = None, **kwargs: Any
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run (or resume) a comparison into ``out_dir``: its plan (:func:`compare_plan`; results do
    not depend on ``rules_per_job``) in :func:`run_sweep`, with its keyword arguments
    (``workers``, ``progress``, ``force``, ``figures``)."""
    return run_sweep(compare_plan(config, rules_per_job), out_dir, **kwargs)


def compare_progress(config: CompareConfig, out_dir: str | Path) -> str:
    """``N of M runs finished in OUT`` (for the resume hint after an interruption)."""
    done, total = compare_plan(config).finished(out_dir)
    return f"{done} of {total} runs finished in {out_dir}"


def main(plan: SweepPlan, out_dir: str | Path, **kwargs: Any) -> pd.DataFrame:
    """Run, then print the final-score table and the wall time (the CLI entry of ``sweep`` and,
    with :func:`compare_plan`, of ``compare``)."""
    start = time.perf_counter()
    if plan.describe:
        print(describe_plan(plan))
    _, scores = run_sweep(plan, out_dir, **kwargs)
    print(format_scores(scores))
    size = (
        f"{len(plan.runs())} runs ({len(plan.variants)} objectives x {len(plan.settings)} settings "
        f"x {len(plan.seeds)} base seeds; {plan.config.seeds} seeds x {plan.config.steps} steps "
        "each)"
    )
    print(
        f"\n{size}: {time.perf_counter() - start:.1f} s. Wrote "
        f"{Path(out_dir) / 'results.parquet'}, summary.csv and figures."
    )
    return scores
