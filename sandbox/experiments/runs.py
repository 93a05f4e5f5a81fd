"""Run kinds: one registry of "train this rule on this setting", the way objectives have one.

A run kind is a function from a :class:`RunSpec` to a tidy ``pandas.DataFrame`` with the shared
columns (:data:`SHARED_COLUMNS`: ``kind``, ``setting``, ``rule``, ``seed``, ``step``) followed by
its metrics under the shared names (``reward``, ``expected_reward``, ``pass_rate``, ``entropy``,
``clip_low_frac``, ``clip_high_frac``, ``rescue_frac``, ...; a kind logs what it can measure).
Steps are 1-based: the row of step s is logged after the s-th rollout + update round.

A kind is registered with its traits (:class:`RunKind`, as Gymnasium's ``EnvSpec`` holds an
environment's): orchestrators, studies and tests read the traits (:func:`run_kind`), never the
kind's name.

================== ========================================================================
kind               what runs; its traits
================== ========================================================================
``bandit_sampled`` :func:`sandbox.train.run_bandit`: ``seeds`` sampled softmax bandits at once;
                   batched: the specs of one setting that differ only in rule or seed train
                   as one program (:func:`sandbox.train.bandit.run_bandits`); scores
                   ``expected_reward`` / ``reward``; exact counterpart ``bandit_exact``
``bandit_exact``   :func:`sandbox.exact.exact_flows`: the expected-gradient flow; deterministic
                   (``seed`` -1); batched: the specs of one setting that differ only in rule
                   run as one program; scores ``expected_reward`` for both; admits a spec
                   by :func:`bandit_flow_admits`
``tiny_tf``        :func:`sandbox.train.train_sequence`: ``seeds`` tiny transformers on a task;
                   scores ``pass_rate`` / ``reward``
``llm``            :func:`llm.train.train`, registered by ``llm/runs.py`` (``sandbox`` never
                   imports ``llm``; importing ``llm.runs`` registers it); batched: the specs
                   of one call that differ only in rule or seed train as one ensemble; no
                   replicates (one run per seed); logs step 0 (the evaluation before training)
================== ========================================================================

Orchestrators (``compare``, ``sweep``, ``llm.transfer``) build specs, run them through
:func:`run_specs` (in a pool: :class:`.planner.RunFolder`) and analyse the frames; none calls a
trainer. Whether a rule has an exact flow is decided here only (:func:`has_exact_flow`, from the
kinds' ``exact`` and ``admits`` traits).

Adding a run kind
-----------------
1. Write the function in the module that owns the trainer (this file for a sandbox trainer; a
   kind that needs ``llm`` goes in ``llm/runs.py``, as ``sandbox`` never imports ``llm``), and
   register it with its traits and a tiny spec::

       @register_run("my_kind", tiny_spec=RunSpec.make("my_kind", "my_setting", "grpo", steps=2))
       def my_kind(spec: RunSpec) -> pd.DataFrame:
           frame = my_trainer(...)  # from spec's fields; spec.train holds the trainer's extras
           return tidy(spec, frame)  # shared columns first; 0-based trainer steps made 1-based

   The traits (:class:`RunKind`) default to a sampled kind whose ``seeds`` replicates are
   logged as seeds 0..seeds-1, steps 1..steps, scored by its ``pass_rate`` and ``reward``
   columns, without an exact counterpart or a trainer config; pass the ones that differ
   (``deterministic=True``, ``replicates=False``, ``logs_step0=True``, ``score_columns=...``,
   ``exact=...``, ``admits=...``, ``config=...``). ``register_run("name", batched=True)``
   instead takes the list of specs that share a :meth:`RunSpec.batch_key` (they differ only in
   ``rule``, ``params`` or ``seed``) and returns one frame per spec, for a kind that runs them
   as one program (``bandit_exact``).
2. Nothing else: ``test_every_kind_passes_the_generic_checks`` in ``tests/test_runs.py`` runs
   every registered kind's ``tiny_spec`` (it fails for a kind without one) and checks the frame
   against the kind's traits: the shared columns, the steps, the seeds, the score columns
   (``pass_rate`` in [0, 1]), the trainer config and the exact counterpart where the kind has
   them, and the JSON round trip of the spec. ``test_a_new_kind_needs_no_other_edit`` shows it
   for a kind registered inside the test.

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
#: A kind's :attr:`RunKind.flow` (compare's ``kind`` column): sampled runs or the exact flow.
SAMPLED, EXACT = "sampled", "exact"
#: A study's score names and the kind's columns they read, unless the kind says otherwise.
SCORE_COLUMNS = (("pass_rate", "pass_rate"), ("train_reward", "reward"))


@dataclass(frozen=True)
class RunKind:
    """A registered run kind: its function and its traits (as Gymnasium's ``EnvSpec`` holds an
    environment's), read by orchestrators, studies and tests instead of the kind's name.

    ``fn``: ``fn(spec) -> DataFrame``, or (``batched``) ``fn(specs) -> list[DataFrame]`` for the
    specs sharing a :meth:`RunSpec.batch_key`, run as one program.
    ``deterministic``: an exact flow, no sampling: one trajectory per spec, logged as seed -1
    (the spec's ``seeds`` do not apply). ``replicates``: a sampled spec's ``seeds`` replicates
    train at once, logged as seeds 0..seeds-1; False: one run per spec, logged under the spec's
    own ``seed`` (``llm``). ``logs_step0``: the frame has a step-0 row (the evaluation before
    training; it holds no training metrics); otherwise steps run 1..steps.
    ``score_columns``: (score, column) pairs: which of the kind's columns a study reads as its
    ``pass_rate`` (the held-out or expected success) and ``train_reward`` (:meth:`column`).
    ``exact``: the deterministic kind that computes this kind's expected-gradient flow (a
    deterministic kind: itself, the default; None: no exact counterpart). ``admits(spec,
    model)`` (on that deterministic kind): whether it has the flow of ``spec`` (rule, advantage,
    setting), read through :func:`has_exact_flow`. ``config(spec)``: the validated trainer
    config of a spec (:func:`trainer_config`; None: the kind has none to check before running).
    ``tiny_spec``: a spec that runs in about a second, for ``tests/test_runs.py``."""

    name: str
    fn: Callable[..., Any]
    batched: bool = False
    deterministic: bool = False
    replicates: bool = True
    logs_step0: bool = False
    score_columns: tuple[tuple[str, str], ...] = SCORE_COLUMNS
    exact: str | None = None
    admits: Callable[[RunSpec, Any], bool] | None = None
    config: Callable[[RunSpec], Any] | None = None
    tiny_spec: RunSpec | None = None

    def __post_init__(self) -> None:
        if self.deterministic and self.exact is None:  # an exact flow is its own counterpart
            object.__setattr__(self, "exact", self.name)

    @property
    def flow(self) -> str:
        """:data:`EXACT` for a deterministic kind, else :data:`SAMPLED`."""
        return EXACT if self.deterministic else SAMPLED

    def column(self, score: str) -> str:
        """The kind's column a study reads as ``score`` (``pass_rate``, ``train_reward``; any
        other name is its own column)."""
        return dict(self.score_columns).get(score, score)

    def seeds_of(self, spec: RunSpec) -> set[int]:
        """The ``seed`` values of ``spec``'s frame: {-1} for a deterministic kind, the
        replicates 0..seeds-1, or the spec's own seed for a kind without replicates."""
        if self.deterministic:
            return {-1}
        return set(range(spec.seeds)) if self.replicates else {spec.seed}

    def first_step(self) -> int:
        """The first logged step: 0 where the kind logs its evaluation before training, else 1."""
        return 0 if self.logs_step0 else 1


TRAITS = tuple(f.name for f in fields(RunKind) if f.name not in ("name", "fn", "batched"))

_RUNS: dict[str, RunKind] = {}


def register_run(
    name: str, *, batched: bool = False, **traits: Any
) -> Callable[[Callable], Callable]:
    """Register ``fn(spec) -> DataFrame`` (``batched``: ``fn(specs) -> list[DataFrame]``) as the
    run kind ``name`` with ``traits`` (:class:`RunKind`'s fields; unknown ones: ``ValueError``)."""
    unknown = sorted(set(traits) - set(TRAITS))
    if unknown:
        raise ValueError(f"traits: unknown run-kind trait(s) {unknown}; valid: {list(TRAITS)}")

    def decorate(fn: Callable) -> Callable:
        if name in _RUNS and _RUNS[name].fn is not fn:
            raise ValueError(f"run kind {name!r} is already registered")
        _RUNS[name] = RunKind(name, fn, batched, **traits)
        return fn

    return decorate


def unregister_run(name: str) -> None:
    """Remove the run kind ``name`` (a test's throwaway kind); ``ValueError`` if unknown."""
    run_kind(name)
    del _RUNS[name]


def available_runs() -> list[str]:
    """Every registered run kind (``llm`` once ``llm.runs`` is imported)."""
    return sorted(_RUNS)


def run_kinds() -> list[RunKind]:
    """Every registered :class:`RunKind`, by name."""
    return [_RUNS[name] for name in available_runs()]


def run_kind(name: str) -> RunKind:
    """The :class:`RunKind` ``name``, or a ``ValueError`` listing the registered kinds."""
    if name not in _RUNS:
        raise ValueError(
            f"kind: unknown run kind {name!r}; registered: {available_runs()} (a kind registered "
            "outside sandbox exists once its module is imported: llm.runs for llm)"
        )
    return _RUNS[name]


def get_run(name: str) -> Callable[..., Any]:
    """The function of a run kind, or a ``ValueError`` listing the registered kinds."""
    return run_kind(name).fn


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
    """The one place that decides whether a run has an exact expected-gradient flow: its kind
    has an exact counterpart (:attr:`RunKind.exact`) and that counterpart admits the spec
    (:func:`bandit_flow_admits` for ``bandit_exact``). ``model``: the spec's setting model, if
    already built."""
    exact = run_kind(spec.kind).exact
    if exact is None:
        return False
    flow = run_kind(exact)
    return flow.admits is None or flow.admits(replace(spec, kind=exact), model)


def bandit_flow_admits(spec: RunSpec, model: Any = None) -> bool:
    """Whether the bandit flow (:func:`sandbox.exact.exact_flows`) has ``spec``'s: a
    closed-form ``expected_coef`` (not clip_cov, kl_cov), a group advantage with an exact
    finite-group form, and binary rewards."""
    from sandbox.exact.bandit import GROUP_ADVANTAGES

    if dict(spec.train).get("advantage", "grpo") not in GROUP_ADVANTAGES:
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
    """The validated trainer config of ``spec`` (its kind's :attr:`RunKind.config`); a
    ``ValueError`` for a kind without one."""
    build = run_kind(spec.kind).config
    if build is None:
        raise ValueError(f"kind: run kind {spec.kind!r} has no trainer config to check")
    return build(spec)


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


#: The tiny specs' shared knobs (the sampled kinds' replicates, mu = epochs x minibatches).
TINY = dict(seeds=2, steps=2, group_size=4, prompts_per_step=2, epochs=2, minibatches=2)


@register_run(
    "bandit_sampled",
    batched=True,
    score_columns=(("pass_rate", "expected_reward"), ("train_reward", "reward")),
    exact="bandit_exact",
    config=bandit_config,
    tiny_spec=RunSpec.make("bandit_sampled", "mixed", "dapo", **TINY),
)
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


@register_run(
    "bandit_exact",
    batched=True,
    deterministic=True,
    score_columns=(("pass_rate", "expected_reward"), ("train_reward", "expected_reward")),
    admits=bandit_flow_admits,
    config=bandit_config,
    tiny_spec=RunSpec.make("bandit_exact", "needle", "nsr_dapo", **TINY),
)
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


@register_run(
    "tiny_tf",
    config=sequence_config,
    tiny_spec=RunSpec.make(
        "tiny_tf",
        "bits-parity-2",
        "grpo",
        **{**TINY, "lr": 1e-3},
        definition={"task": "bits", "op": "parity", "length": 2},
    ),
)
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
        kind = run_kind(spec.kind)  # the ValueError listing the kinds
        if kind.batched:
            groups.setdefault((spec.kind, spec.batch_key()), []).append(i)
        else:
            out[i] = kind.fn(spec)
    for (name, _), index in groups.items():
        frames = _RUNS[name].fn([specs[i] for i in index])
        out.update(zip(index, frames, strict=True))
    return [out[i] for i in range(len(specs))]
