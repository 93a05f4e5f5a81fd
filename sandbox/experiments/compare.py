"""The default comparison: every objective and preset on a bandit suite, sampled and exact.

For each (setting, objective) pair it runs

* the sampled trainer (:func:`sandbox.train.run_bandit`): S seeds in one vectorised run, groups of
  G samples, mu epochs x minibatches per batch (so the ratio leaves 1 and clipping acts);
* the exact expected-gradient flow (:func:`sandbox.exact.exact_flow`) with the exact finite-group
  GRPO advantage and ``epochs * minibatches`` inner updates per step: the deterministic dynamics the
  sampled runs follow in expectation (rules without a closed form, clip_cov and kl_cov, have none).

A comparison is a grid with one entry per objective and one base seed (:func:`~.sweep.compare_plan`)
run by the sweep engine and stored as any sweep (a part per sampled run or exact flow, named with
the hash of its run spec, ``plan.json``; an interrupted comparison resumes, a rerun with other
training fields computes its own parts and reports only them). Then ``results.parquet`` (tidy: one row per setting, objective, kind, seed,
step), ``summary.csv`` and the figures. This module also holds what every grid shares: the suites,
the training fields (:class:`CompareConfig`) and one run's spec (:func:`run_spec`).

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

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from envs import make_bandit_suite
from envs.reasoning import make_task
from sandbox.configs import arg, check_keys, literal
from sandbox.objectives import available_objectives, available_presets
from sandbox.streams import with_rng

from .runs import RunSpec, freeze, objective_of, trainer_config

#: The reasoning suite: setting name -> (task, knobs). Tiny vocabularies, so that a model trained
#: from scratch finds the answer format quickly and the rules differ in what they do next.
REASONING_SUITE: dict[str, tuple[str, dict[str, Any]]] = {
    "bits-reverse-3": ("bits", {"op": "reverse", "length": 3}),
    "bits-parity-2": ("bits", {"op": "parity", "length": 2}),
}

#: Rules compared by default on the reasoning suite (the token/sequence-level contrasts first).
REASONING_OBJECTIVES = (
    "grpo",
    "dapo",
    "gspo",
    "nsr_dapo",
    "nsr_gspo",
    "nsr_decay_dapo",
    "dgpo",
    "gppo",
    "cispo_trl",
    "sapo",
    "clip_cov",
    "kl_cov",
)

#: The run kind of each suite's runs (a rule's exact flow, where its kind has a counterpart that
#: admits it, runs beside: :func:`~.sweep.with_exact_flow`).
SUITE_KINDS = {"bandit": "bandit_sampled", "reasoning": "tiny_tf"}

#: Per-suite defaults of the fields left as None.
SUITE_DEFAULTS: dict[str, dict[str, Any]] = {
    "bandit": {
        "objectives": None,
        "settings": ["easy", "needle", "mixed"],
        "seeds": 32,
        "steps": 100,
        "prompts_per_step": 4,
        "epochs": 2,
        "minibatches": 4,
        "optimizer": "sgd",
        "lr": 1.0,
    },
    "reasoning": {
        "objectives": list(REASONING_OBJECTIVES),
        "settings": list(REASONING_SUITE),
        "seeds": 8,
        "steps": 80,
        "prompts_per_step": 8,
        "epochs": 2,
        "minibatches": 2,
        "optimizer": "adam",
        "lr": 1e-3,
    },
}


#: A run name: letters, digits and ``_.=-`` (no path separators), not only dots.
NAME_PATTERN = re.compile(r"(?!\.+$)[A-Za-z0-9_.=-]+")


def check_name(name: str, what: str = "name") -> str:
    """A run name that stays inside its output folder, else ``ValueError`` naming ``what``."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{what}: use letters, digits and _.=- only (results go to OUT/NAME), got {name!r}"
        )
    return name


def parse_objective_params(specs: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``["eps_high=0.3", "nsr:sigma=0.05"]`` -> ``{"*": {"eps_high": 0.3}, "nsr": {"sigma":
    0.05}}``: ``KEY=VALUE`` applies to every compared objective, ``NAME:KEY=VALUE`` to one;
    values are read as ``llm.train``'s ``--objective-params`` are (:func:`sandbox.configs.literal`)."""
    parsed: dict[str, dict[str, Any]] = {}
    for spec in specs:
        named = ":" in spec.partition("=")[0]
        target, _, assignment = spec.partition(":") if named else ("*", "", spec)
        key, eq, value = assignment.partition("=")
        if not eq or not key.strip() or not target.strip():
            raise ValueError(
                f"objective_params: expected KEY=VALUE or NAME:KEY=VALUE, got {spec!r}"
            )
        parsed.setdefault(target.strip(), {})[key.strip()] = literal(value)
    return parsed


@dataclass
class CompareConfig:
    """Settings of a comparison. Every field is a CLI flag of ``clip-sandbox compare``; fields
    left as None take the suite's default (:data:`SUITE_DEFAULTS`)."""

    suite: str = arg("bandit", "bandit or reasoning")
    objectives: list[str] | None = arg(None, "objectives and presets (duplicates are dropped)")
    settings: list[str] | None = arg(
        None, "bandit settings (envs.make_bandit_suite) or reasoning settings"
    )
    seeds: int | None = arg(None, "seeds per run (vectorised)")
    steps: int | None = arg(None, "training steps")
    group_size: int = arg(8, "G, samples per prompt")
    prompts_per_step: int | None = arg(None, "groups per step")
    epochs: int | None = arg(None, "mu, passes over each batch")
    minibatches: int | None = arg(None, "optimizer steps per epoch")
    optimizer: str | None = arg(None, "sgd or adam (bandit)")
    lr: float | None = arg(None, "learning rate")
    seed: int = arg(0, "base seed")
    dtype: str | None = arg(
        None,
        "float64: the sampled runs in double precision, results that agree across CPUs to "
        "float64 rounding (default: the trainers' float32; the exact flows are float64 anyway)",
        choices=("float32", "float64"),
    )
    objective_params: dict[str, dict[str, Any]] | None = arg(
        None,
        "objective parameters: KEY=VALUE for every objective or NAME:KEY=VALUE for one "
        "(e.g. dapo:eps_high=0.3); results are labelled dapo[eps_high=0.3]",
    )

    def __post_init__(self) -> None:
        if self.suite not in SUITE_DEFAULTS:
            raise ValueError(f"suite must be one of {sorted(SUITE_DEFAULTS)}, got {self.suite!r}")
        for key, value in SUITE_DEFAULTS[self.suite].items():
            if getattr(self, key) is None:
                setattr(self, key, list(value) if isinstance(value, list) else value)
        if self.objectives is None:  # every preset, then every registered objective
            self.objectives = available_presets() + available_objectives()
        self.objectives = list(dict.fromkeys(self.objectives))  # dapo dapo -> one run
        self.settings = list(dict.fromkeys(self.settings))
        check_setting_names(self.settings, standard_settings(self.suite))
        if not self.objectives:
            raise ValueError("objectives must not be empty")
        for name in self.objectives:
            objective_of(name)  # ValueError naming the valid names
        self.objective_params = self._resolve_params(self.objective_params or {})
        # the trainer config of one run validates the shared training fields
        trainer_config(run_spec(self, self.settings[0], "grpo"))

    def _resolve_params(self, given: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
        """Expand ``"*"`` to every objective and check each set through ``get_objective``."""
        check_keys("objective_params", given, ["*", *self.objectives], "compared objective")
        resolved = {}
        for name in self.objectives:
            params = {**given.get("*", {}), **given.get(name, {})}
            if params:
                check_params("objective_params", name, params)
                resolved[name] = dict(sorted(params.items()))
        return resolved

    def params(self, objective: str) -> dict[str, Any]:
        """The keyword arguments given to ``objective`` (empty: the preset or paper defaults)."""
        return dict((self.objective_params or {}).get(objective, {}))

    def training_fields(self) -> dict[str, Any]:
        """The fields every run of the comparison shares, besides its (setting, objective,
        parameters), with the trainers' random-number scheme (``rng``,
        :data:`sandbox.streams.RNG`): a sweep's ``plan.json`` records them."""
        skip = ("objectives", "settings", "objective_params")
        fields = {k: v for k, v in asdict(self).items() if k not in skip}
        return json.loads(json.dumps(with_rng(fields)))


def check_params(
    where: str, name: str, params: Mapping[str, Any], *, name_key: bool = False
) -> None:
    """``ValueError`` ``WHERE: NAME with PARAMS: why`` unless the objective ``name`` takes
    ``params`` (its own checks, :func:`~sandbox.objectives.get_objective`). ``name_key``: ``where``
    gains ``.KEY``, the first key of ``params`` that the error names (else the first key)."""
    try:
        objective_of(name, freeze(params))
    except (TypeError, ValueError) as exc:
        if name_key and params:
            where += "." + next((k for k in params if k in str(exc)), next(iter(params)))
        raise ValueError(f"{where}: {name} with {dict(params)}: {exc}") from exc


def check_setting_names(
    names: Iterable[str], valid: Iterable[str], where: str = "settings"
) -> None:
    """``ValueError`` ``WHERE: unknown setting 'x'; valid: [...]`` (sorted) for the first of
    ``names`` not among ``valid`` (a suite's :func:`standard_settings`, a sweep's own too)."""
    valid = sorted(valid)
    if unknown := [name for name in names if name not in valid]:
        raise ValueError(f"{where}: unknown setting {unknown[0]!r}; valid: {valid}")


def check_task(where: str, task: str, knobs: Mapping[str, Any]) -> None:
    """``ValueError`` ``WHERE: why`` unless ``envs.reasoning`` makes the task ``task`` with
    ``knobs`` (a reasoning setting's definition)."""
    try:
        make_task(task, **knobs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


def standard_settings(suite: str) -> dict[str, dict[str, Any]]:
    """The suite's settings, each as :attr:`RunSpec.definition` holds it: ``env`` and the env's
    kwargs (bandit), or ``task`` and its knobs (reasoning)."""
    if suite == "bandit":
        return {n: {"env": s.env_id, **s.kwargs} for n, s in make_bandit_suite().items()}
    return {n: {"task": task, **knobs} for n, (task, knobs) in REASONING_SUITE.items()}


def run_spec(config: CompareConfig, setting: str, objective: str, **given: Any) -> RunSpec:
    """The sampled run of ``objective`` on ``setting`` with the shared training fields; ``given``
    (``params``, ``seed``, ``definition``, ``train``) replaces the defaults: the comparison's
    parameters and base seed, the standard setting."""
    values = dict(params=config.params(objective), seed=config.seed)
    values["definition"] = standard_settings(config.suite).get(setting, {})
    values.update(given)
    if config.dtype is not None:  # a trainer field: into the spec's train mapping
        values["train"] = {"dtype": config.dtype, **dict(values.get("train") or {})}
    return RunSpec.make(
        SUITE_KINDS[config.suite],
        setting,
        objective,
        seeds=config.seeds,
        steps=config.steps,
        group_size=config.group_size,
        prompts_per_step=config.prompts_per_step,
        epochs=config.epochs,
        minibatches=config.minibatches,
        lr=config.lr,
        optimizer=config.optimizer,
        **values,
    )
