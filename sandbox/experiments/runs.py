"""Run kinds: one registry of "train this rule on this setting", the way objectives have one.

A run kind is a function from a :class:`RunSpec` to a tidy ``pandas.DataFrame`` with the shared
columns (:data:`SHARED_COLUMNS`: ``kind``, ``setting``, ``rule``, ``seed``, ``step``) followed by
its metrics under the shared names (``reward``, ``expected_reward``, ``pass_rate``, ``entropy``,
``clip_low_frac``, ``clip_high_frac``, ``rescue_frac``, ...; a kind logs what it can measure).
Steps are 1-based: the row of step s is logged after the s-th rollout + update round.

===================== ==========================================================================
kind                  what runs
===================== ==========================================================================
``bandit_sampled``    :func:`sandbox.train.run_bandit`: ``seeds`` sampled softmax bandits at once;
                      batched: the specs of one setting that differ only in rule or seed train
                      as one program (:func:`sandbox.train.bandit.run_bandits`)
``bandit_exact``      :func:`sandbox.exact.exact_flows`: the expected-gradient flow (``seed`` -1);
                      batched: the specs of one setting that differ only in rule run as one program
``tiny_tf``           :func:`sandbox.train.train_sequence`: ``seeds`` tiny transformers on a task
``llm``               :func:`llm.train.train`, registered by ``llm/runs.py`` (``sandbox`` never
                      imports ``llm``; importing ``llm.runs`` registers it); batched: the specs
                      of one call that differ only in rule or seed train as one ensemble
===================== ==========================================================================

Orchestrators (``compare``, ``sweep``, ``llm.transfer``) build specs, run them through
:func:`run_specs` (in a pool: :class:`.planner.RunFolder`) and analyse the frames; none calls a
trainer. Whether a rule has an exact flow is decided here only (:func:`has_exact_flow`).

Adding a run kind
-----------------
1. Write the function in the module that owns the trainer (this file for a sandbox trainer; a
   kind that needs ``llm`` goes in ``llm/runs.py``, as ``sandbox`` never imports ``llm``)::

       @register_run("my_kind")
       def my_kind(spec: RunSpec) -> pd.DataFrame:
           frame = my_trainer(...)  # from spec's fields; spec.train holds the trainer's extras
           return tidy(spec, frame)  # shared columns first; 0-based trainer steps made 1-based

   ``register_run("name", batched=True)`` instead takes the list of specs that share a
   :meth:`RunSpec.batch_key` (they differ only in ``rule``, ``params`` or ``seed``) and returns
   one frame per spec, for a kind that runs them as one program (``bandit_exact``).
2. Add a tiny spec of it to ``TINY_SPECS`` in ``tests/test_runs.py``. The tests there then cover
   the kind without further edits: ``test_every_kind_has_a_tiny_spec`` fails for a registered kind
   without one; ``test_every_kind_returns_the_shared_columns`` runs it and checks the shared
   columns, the 1-based steps, the seeds, a metric in [0, 1] and the JSON round trip of the spec.

Worker processes see a kind when the module of the job function they run imports the module
that registers it (``llm.transfer`` imports ``llm.runs``); the sandbox kinds are always there.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import pandas as pd

from .results import part_name

#: Columns every run kind's frame starts with.
SHARED_COLUMNS = ("kind", "setting", "rule", "seed", "step")
#: Parameter slugs longer than this are replaced by a hash in part names (file names stay short).
MAX_SLUG = 80

_RUNS: dict[str, tuple[Callable[..., Any], bool]] = {}


def register_run(name: str, *, batched: bool = False) -> Callable[[Callable], Callable]:
    """Register ``fn(spec) -> DataFrame`` (``batched``: ``fn(specs) -> list[DataFrame]``)."""

    def decorate(fn: Callable) -> Callable:
        if name in _RUNS and _RUNS[name][0] is not fn:
            raise ValueError(f"run kind {name!r} is already registered")
        _RUNS[name] = (fn, batched)
        return fn

    return decorate


def available_runs() -> list[str]:
    """Every registered run kind (``llm`` once ``llm.runs`` is imported)."""
    return sorted(_RUNS)


def get_run(name: str) -> Callable[..., Any]:
    """The function of a run kind, or a ``ValueError`` listing the registered kinds."""
    if name not in _RUNS:
        hint = " (import llm.runs to register the llm kind)" if name == "llm" else ""
        raise ValueError(f"kind: unknown run kind {name!r}; registered: {available_runs()}{hint}")
    return _RUNS[name][0]


def freeze(value: Any) -> Any:
    """Mappings -> sorted ``(key, value)`` tuples, lists -> tuples (hashable, JSON-able)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The dict of a frozen mapping (tuple values back to lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in pairs}


def format_value(value: Any) -> str:
    """A parameter value as written in labels: shortest round-trip form for floats."""
    return repr(value) if isinstance(value, float) else str(value)


def variant_label(rule: str, params: Mapping[str, Any] | None = None) -> str:
    """``dapo[eps_high=0.3]`` (parameters sorted by name); the bare name without parameters."""
    if not params:
        return rule
    return f"{rule}[{','.join(f'{k}={format_value(v)}' for k, v in sorted(params.items()))}]"


def variant_slug(rule: str, params: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """File-name fields: the name, then ``k=v`` per parameter (hashed if long)."""
    pairs = [f"{k}={format_value(v)}" for k, v in sorted((params or {}).items())]
    if len(",".join(pairs)) > MAX_SLUG:
        text = json.dumps(dict(params or {}), sort_keys=True, default=str)
        pairs = [f"p{hashlib.sha1(text.encode()).hexdigest()[:12]}"]
    return (rule, *pairs)


@dataclass(frozen=True)
class RunSpec:
    """One run: a rule on a setting with a base seed, ``seeds`` replicates vectorised.

    ``params``, ``definition`` and ``train`` are frozen mappings (:func:`freeze`):
    ``definition`` says what ``setting`` is (bandit: ``env`` and the env's kwargs; task: ``task``
    and its knobs; empty: the standard setting of that name), ``train`` holds further fields of
    the kind's trainer config (``advantage``, ``d_model``, llm.train flags, ...)."""

    kind: str
    setting: str
    rule: str
    params: tuple[tuple[str, Any], ...] = ()
    seed: int = 0
    seeds: int = 1
    steps: int = 100
    group_size: int = 8
    prompts_per_step: int = 4
    epochs: int = 1
    minibatches: int = 1
    lr: float = 0.5
    optimizer: str = "sgd"
    definition: tuple[tuple[str, Any], ...] = ()
    train: tuple[tuple[str, Any], ...] = ()
    device: str = "cpu"

    @classmethod
    def make(cls, kind: str, setting: str, rule: str, **values: Any) -> RunSpec:
        """A spec from plain values (dicts and lists are frozen)."""
        frozen = {
            k: freeze(v) if k in ("params", "definition", "train") else v for k, v in values.items()
        }
        return cls(kind, setting, rule, **frozen)

    @property
    def label(self) -> str:
        """The rule as results name it: ``dapo`` or ``dapo[eps_high=0.3]``."""
        return variant_label(self.rule, dict(self.params))

    @property
    def part(self) -> str:
        """A stable part file name: setting, rule slug, kind, base seed."""
        return part_name(
            self.setting, *variant_slug(self.rule, dict(self.params)), self.kind, f"seed{self.seed}"
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.make(**json.loads(text))

    def batch_key(self) -> RunSpec:
        """What specs that may run as one batched program share."""
        return replace(self, rule="", params=(), seed=0)


@functools.cache
def objective_of(rule: str, params: tuple[tuple[str, Any], ...] = ()) -> Any:
    """The objective of ``rule`` with ``params``, built once per process and (rule, params)
    (objectives are stateless: randomness comes from the caller's generator)."""
    from sandbox.objectives import get_objective

    return get_objective(rule, **thaw(params))


def setting_model(spec: RunSpec) -> Any:
    """The bandit model (env.unwrapped) of a bandit spec."""
    from envs import make_bandit_suite
    from envs.bandit import BanditSetting

    if not spec.definition:
        return make_bandit_suite()[spec.setting].make().unwrapped
    kwargs = thaw(spec.definition)
    return BanditSetting(kwargs.pop("env"), kwargs).make().unwrapped


def optimum(model: Any) -> float:
    """Best achievable expected reward of a bandit model (prompt-weighted for contextual)."""
    import numpy as np

    best = np.asarray(model.mean_rewards).max(-1)
    return float(np.dot(model.prompt_probs, best)) if np.ndim(best) else float(best)


def has_exact_flow(spec: RunSpec, model: Any = None) -> bool:
    """The one place that decides whether a run has an exact expected-gradient flow: a bandit,
    a closed-form ``expected_coef`` (not clip_cov, kl_cov), a group advantage with an exact
    finite-group form, and binary rewards."""
    from sandbox.exact.bandit import GROUP_ADVANTAGES

    advantage = dict(spec.train).get("advantage", "grpo")
    if not spec.kind.startswith("bandit_") or advantage not in GROUP_ADVANTAGES:
        return False
    if not objective_of(spec.rule, spec.params).has_expected_coef():
        return False
    model = setting_model(spec) if model is None else model
    return getattr(model, "success_probs", None) is not None


def tidy(spec: RunSpec, frame: pd.DataFrame, *, shift: int = 1, **columns: Any) -> pd.DataFrame:
    """The shared columns first (``rule`` holds the label), then ``columns``; ``shift`` turns a
    trainer's 0-based steps into 1-based ones (0 for a trainer that logs 1-based steps)."""
    frame = frame.copy()
    frame["step"] = frame["step"] + shift
    if "seed" not in frame:
        frame["seed"] = -1
    head = pd.DataFrame(
        {"kind": spec.kind, "setting": spec.setting, "rule": spec.label}, index=frame.index
    )
    out = pd.concat([head, frame[["seed", "step"]], frame.drop(columns=["seed", "step"])], axis=1)
    for name, value in columns.items():
        out[name] = value
    return out


def trainer_fields(spec: RunSpec, names: Sequence[str]) -> dict[str, Any]:
    """The spec's shared knobs under a trainer config's field names, then ``spec.train``."""
    shared = {
        "objective": spec.rule,
        "objective_params": thaw(spec.params),
        "seed": spec.seed,
        "seeds": spec.seeds,
        "steps": spec.steps,
        "group_size": spec.group_size,
        "prompts_per_step": spec.prompts_per_step,
        "epochs": spec.epochs,
        "minibatches": spec.minibatches,
        "lr": spec.lr,
        "optimizer": spec.optimizer,
        "device": spec.device,
    }
    values = {k: v for k, v in shared.items() if k in names}
    values.update(thaw(spec.train))
    return values


def trainer_config(spec: RunSpec) -> Any:
    """The validated trainer config of a toy spec (``tiny_tf``: a sequence trainer's)."""
    return sequence_config(spec) if spec.kind == "tiny_tf" else bandit_config(spec)


def bandit_config(spec: RunSpec) -> Any:
    from sandbox.train import BanditTrainConfig

    return BanditTrainConfig(**trainer_fields(spec, [f.name for f in fields(BanditTrainConfig)]))


def sequence_config(spec: RunSpec) -> Any:
    from sandbox.train import SequenceTrainConfig

    names = [f.name for f in fields(SequenceTrainConfig) if f.name != "optimizer"]
    values = trainer_fields(spec, names)
    task = thaw(spec.definition)
    values.update(task=task.pop("task"), task_knobs=task)
    return SequenceTrainConfig(**values)


@register_run("bandit_sampled", batched=True)
def bandit_sampled(specs: Sequence[RunSpec]) -> list[pd.DataFrame]:
    """The sampled trainer: each spec's ``seeds`` softmax bandits in one vectorised run; the
    specs of one call (one setting, differing only in rule, parameters or seed) train as one
    program (:func:`sandbox.train.bandit.run_bandits`; each frame equals its spec's own run)."""
    from sandbox.train.bandit import run_bandit, run_bandits

    model = setting_model(specs[0])
    configs = [bandit_config(s) for s in specs]
    if configs[0].grad_noise:  # measured one rule per run
        runs = [run_bandit(model, config) for config in configs]
    else:
        runs = run_bandits(model, configs)
    best = optimum(model)
    return [tidy(s, run.to_frame(), optimum=best) for s, run in zip(specs, runs, strict=True)]


@register_run("bandit_exact", batched=True)
def bandit_exact(specs: Sequence[RunSpec]) -> list[pd.DataFrame]:
    """The exact expected-gradient flows of ``specs`` (one setting, rules with an exact flow)
    as one batched program; ``epochs * minibatches`` inner updates per step."""
    from sandbox.exact.flow import exact_flows

    spec = specs[0]
    model = setting_model(spec)
    configs = [bandit_config(s) for s in specs]  # each validates and builds its objective once
    config, objectives = configs[0], [c.build_objective() for c in configs]
    frames = exact_flows(
        objectives,
        model,
        steps=spec.steps,
        lr=config.lr,
        advantage=config.advantage,
        group_size=spec.group_size,
        epochs=spec.epochs * spec.minibatches,
        optimizer=config.optimizer,
    )
    return [tidy(s, f, optimum=optimum(model)) for s, f in zip(specs, frames, strict=True)]


@register_run("tiny_tf")
def tiny_tf(spec: RunSpec) -> pd.DataFrame:
    """Tiny transformers trained from scratch on a reasoning task, ``spec.seeds`` at once."""
    from sandbox.train import train_sequence

    return tidy(spec, train_sequence(sequence_config(spec)), optimum=1.0)


def run_specs(specs: Sequence[RunSpec]) -> list[pd.DataFrame]:
    """Run ``specs`` (in order; a batched kind gets its specs with one :meth:`RunSpec.batch_key`
    as one call) and return one frame per spec."""
    out: dict[int, pd.DataFrame] = {}
    groups: dict[tuple[str, RunSpec], list[int]] = {}
    for i, spec in enumerate(specs):
        fn, batched = _RUNS.get(spec.kind, (None, False))
        if fn is None:
            get_run(spec.kind)  # the ValueError listing the kinds
        if batched:
            groups.setdefault((spec.kind, spec.batch_key()), []).append(i)
        else:
            out[i] = fn(spec)
    for (kind, _), index in groups.items():
        frames = _RUNS[kind][0]([specs[i] for i in index])
        out.update(zip(index, frames, strict=True))
    return [out[i] for i in range(len(specs))]
