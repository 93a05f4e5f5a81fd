"""Run kinds: one registry of "train this rule on this setting", the way objectives have one.

A run kind is a function from a :class:`RunSpec` to a tidy ``pandas.DataFrame``: the shared
columns (:data:`SHARED_COLUMNS`) first, then its metrics under the shared names (``reward``,
``expected_reward``, ``pass_rate``, ``entropy``, ``clip_low_frac``, ...). Steps are 1-based: the
row of step s is logged after the s-th rollout + update round. A kind registers with its traits
(:class:`RunKind`); orchestrators, studies and tests read the traits (:func:`run_kind`), never
the kind's name, and build specs that they run through :func:`run_specs` (in a pool:
:class:`.planner.RunFolder`); none calls a trainer. The kinds here are ``bandit_sampled``,
``bandit_exact`` and ``tiny_tf`` (below); ``llm`` is registered by ``llm/runs.py``, as
``sandbox`` never imports ``llm``. How to add one: CONTRIBUTING.md, "Run kinds and rungs".
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import pandas as pd

from sandbox.configs import check_keys

from .results import part_stem

#: Columns every run kind's frame starts with.
SHARED_COLUMNS = ("kind", "setting", "rule", "seed", "step")
#: Parameter slugs longer than this are replaced by a hash in part names (file names stay short).
MAX_SLUG = 80
#: A kind's :attr:`RunKind.flow` (compare's ``kind`` column): sampled runs or the exact flow.
SAMPLED, EXACT = "sampled", "exact"
#: The :class:`RunSpec` fields the specs of one batched call may differ in, unless the kind says
#: otherwise (:attr:`RunKind.batch_varies`).
BATCH_VARIES = ("rule", "params", "seed")
#: A study's score names and the kind's columns they read, unless the kind says otherwise.
SCORE_COLUMNS = (("pass_rate", "pass_rate"), ("train_reward", "reward"))
#: Keys of a spec's ``train`` that choose where and how a run executes (saves, shows progress),
#: not what it computes: left out of :meth:`RunSpec.digest`.
EXECUTION = ("scratch", "checkpoint_every", "progress")
#: Hex digits of :meth:`RunSpec.digest` in a part's name.
DIGEST = 12


@dataclass(frozen=True)
class RunKind:
    """A registered run kind: its function and its traits (as Gymnasium's ``EnvSpec``).

    ``fn(spec) -> DataFrame``, or (``batched``) ``fn(specs) -> list[DataFrame]`` for the specs
    sharing a :meth:`RunSpec.batch_key`, run as one program; ``batch_varies``: the
    :class:`RunSpec` fields those specs may differ in (default rule, parameters and base seed;
    ``llm`` adds ``lr``: each member has its own optimizer). ``deterministic``: an exact flow,
    one trajectory per spec logged as seed -1. ``replicates``: the spec's ``seeds`` replicates
    train at once, logged as seeds 0..seeds-1; False: one run logged under the spec's ``seed``.
    ``logs_step0``: a step-0 row (the evaluation before training, no training metrics);
    otherwise steps run 1..steps. ``score_columns``: (score, column) pairs, the columns a study
    reads as ``pass_rate`` and ``train_reward`` (:meth:`column`). ``exact``: the deterministic
    kind holding this kind's expected-gradient flow (itself for a deterministic kind; None: no
    exact counterpart); ``admits(spec, model)`` on it: whether it has ``spec``'s flow
    (:func:`has_exact_flow`). ``config(spec)``: the validated trainer config
    (:func:`trainer_config`; None: none). ``tiny_spec``: a spec that runs in about a second,
    for ``tests/test_runs.py``."""

    name: str
    fn: Callable[..., Any]
    batched: bool = False
    batch_varies: tuple[str, ...] = BATCH_VARIES
    deterministic: bool = False
    replicates: bool = True
    logs_step0: bool = False
    score_columns: tuple[tuple[str, str], ...] = SCORE_COLUMNS
    exact: str | None = None
    admits: Callable[[RunSpec, Any], bool] | None = None
    config: Callable[[RunSpec], Any] | None = None
    tiny_spec: RunSpec | None = None

    def __post_init__(self) -> None:
        check_keys(
            "batch_varies", self.batch_varies, [f.name for f in fields(RunSpec)], "RunSpec field"
        )
        if self.deterministic and self.exact is None:  # an exact flow is its own counterpart
            object.__setattr__(self, "exact", self.name)

    @property
    def flow(self) -> str:
        """:data:`EXACT` for a deterministic kind, else :data:`SAMPLED`."""
        return EXACT if self.deterministic else SAMPLED

    def column(self, score: str) -> str:
        """The kind's column a study reads as ``score`` (any other name is its own column)."""
        return dict(self.score_columns).get(score, score)

    def seeds_of(self, spec: RunSpec) -> set[int]:
        """The ``seed`` values of ``spec``'s frame (see the class docstring)."""
        if self.deterministic:
            return {-1}
        return set(range(spec.seeds)) if self.replicates else {spec.seed}

    def first_step(self) -> int:
        """0 where the kind logs step 0, else 1."""
        return 0 if self.logs_step0 else 1


TRAITS = tuple(f.name for f in fields(RunKind) if f.name not in ("name", "fn", "batched"))

_RUNS: dict[str, RunKind] = {}


def register_run(
    name: str, *, batched: bool = False, **traits: Any
) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the run kind ``name`` with ``traits`` (:class:`RunKind`'s fields;
    unknown ones: ``ValueError``)."""
    check_keys("traits", traits, TRAITS, "run-kind trait")

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

    ``params``, ``definition`` and ``train`` are frozen mappings (:func:`freeze`). ``definition``
    says what ``setting`` is (bandit: ``env`` and its kwargs; task: ``task`` and its knobs;
    empty: the standard setting of that name); ``train``: further trainer-config fields."""

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
        frozen = {k: freeze(v) for k, v in values.items() if k in ("params", "definition", "train")}
        return cls(kind, setting, rule, **{**values, **frozen})

    @property
    def label(self) -> str:
        """The rule as results name it: ``dapo`` or ``dapo[eps_high=0.3]``."""
        return variant_label(self.rule, dict(self.params))

    @property
    def part(self) -> str:
        """The part file of this run: :meth:`stem`, then :meth:`digest`. A run of other settings
        is another part, so a results folder holds the runs of any settings side by side and a
        command computes those it lacks."""
        return self.part_of(self.stem())

    def stem(self, kind: bool = True) -> str:
        """The readable start of the part name: setting, rule slug, kind, base seed; ``kind``
        False: without the kind (a sweep's run id, whose part holds the sampled run and its exact
        flow)."""
        fields = (*variant_slug(self.rule, dict(self.params)), *([self.kind] if kind else []))
        return part_stem(self.setting, *fields, f"seed{self.seed}")

    def part_of(self, stem: str) -> str:
        """``<stem>__<digest>.parquet``: a part named by ``stem`` and what made it."""
        return f"{stem}__{self.digest()}.parquet"

    def digest(self) -> str:
        """A hash of every field that changes the run's result: the whole spec but the ``train``
        keys of :data:`EXECUTION`, with the trainers' random-number scheme
        (:data:`sandbox.streams.RNG`); a warm start (``train.init``) by its bytes
        (:func:`file_identity`), not by where it lies."""
        from sandbox.streams import RNG

        train = {k: v for k, v in thaw(self.train).items() if k not in EXECUTION}
        if train.get("init") is not None:
            train["init"] = file_identity(train["init"])
        text = replace(self, train=freeze(train)).to_json() + RNG
        return hashlib.sha1(text.encode()).hexdigest()[:DIGEST]

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.make(**json.loads(text))

    def batch_key(self, varies: Iterable[str] = BATCH_VARIES) -> RunSpec:
        """What specs that may run as one batched program share: the spec less the fields
        ``varies`` (its kind's :attr:`RunKind.batch_varies`)."""
        return replace(self, **dict.fromkeys(varies))


def file_identity(path: str) -> str:
    """A warm-start file as a run's setting: ``sha256:`` and the hash of its bytes, so a part
    made from it keeps its name when the folder moves and changes it when the weights change (a
    warm start made again on another CPU rounds differently); the path itself where it cannot
    be read (the run then stops on it by name)."""
    from sandbox.train.sequence import warm_start_path

    found = warm_start_path(path)
    try:
        stat = found.stat()
    except OSError:
        return str(path)
    return _bytes_hash(str(found.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _bytes_hash(path: str, mtime_ns: int, size: int) -> str:
    """:func:`file_identity` of a file as it is now (a plan names its parts many times)."""
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@functools.cache
def objective_of(rule: str, params: tuple[tuple[str, Any], ...] = ()) -> Any:
    """The objective of ``rule`` with ``params``, built once per process (objectives are
    stateless)."""
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
    """The one place that decides whether a run has an exact expected-gradient flow: its kind's
    :attr:`RunKind.exact` admits it. ``model``: the spec's setting model, if already built."""
    exact = run_kind(spec.kind).exact
    if exact is None:
        return False
    flow = run_kind(exact)
    return flow.admits is None or flow.admits(replace(spec, kind=exact), model)


def bandit_flow_admits(spec: RunSpec, model: Any = None) -> bool:
    """Whether :func:`sandbox.exact.exact_flows` has ``spec``'s flow: a closed-form
    ``expected_coef`` (not clip_cov, kl_cov), an exact finite-group advantage, binary rewards."""
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
    return out.assign(**columns)


def trainer_fields(spec: RunSpec, config: type, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The spec's fields under the names of ``config``'s fields (a trainer config's, but
    ``skip``), then ``spec.train``."""
    shared = {**asdict(spec), "objective": spec.rule, "objective_params": thaw(spec.params)}
    names = {f.name for f in fields(config)} - set(skip)
    return {**{k: v for k, v in shared.items() if k in names}, **thaw(spec.train)}


def trainer_config(spec: RunSpec) -> Any:
    """``spec``'s validated trainer config (:attr:`RunKind.config`; ``ValueError`` if none)."""
    build = run_kind(spec.kind).config
    if build is None:
        raise ValueError(f"kind: run kind {spec.kind!r} has no trainer config to check")
    return build(spec)


def bandit_config(spec: RunSpec) -> Any:
    from sandbox.train import BanditTrainConfig

    return BanditTrainConfig(**trainer_fields(spec, BanditTrainConfig))


def sequence_config(spec: RunSpec) -> Any:
    from sandbox.train import SequenceTrainConfig

    task = thaw(spec.definition)
    values = trainer_fields(spec, SequenceTrainConfig, skip=["optimizer"])
    return SequenceTrainConfig(**{**values, "task": task.pop("task"), "task_knobs": task})


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
    """Each spec's ``seeds`` sampled softmax bandits; the specs of one call train as one program
    (:func:`sandbox.train.bandit.run_bandits`; each frame equals its spec's own run)."""
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
    """The exact expected-gradient flows of ``specs`` as one program; ``epochs * minibatches``
    inner updates per step."""
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
    """One frame per spec, in order (a batched kind gets the specs of one
    :meth:`RunSpec.batch_key` of its :attr:`~RunKind.batch_varies` in one call)."""
    out: dict[int, pd.DataFrame] = {}
    groups: dict[tuple[str, RunSpec], list[int]] = {}
    for i, spec in enumerate(specs):
        kind = run_kind(spec.kind)  # the ValueError listing the kinds
        if kind.batched:
            groups.setdefault((spec.kind, spec.batch_key(kind.batch_varies)), []).append(i)
        else:
            out[i] = kind.fn(spec)
    for (name, _), index in groups.items():
        frames = _RUNS[name].fn([specs[i] for i in index])
        out.update(zip(index, frames, strict=True))
    return [out[i] for i in range(len(specs))]
