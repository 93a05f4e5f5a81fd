"""Typed per-rung settings: one frozen dataclass per section, one way to set each setting.

A *section* holds the settings of one or more rungs (``bandit``: ``bandit_exact`` and
``bandit_sampled``; ``tf``: ``tiny_tf``; ``llm``: registered by ``llm.claims``), each with the
paired ``seeds`` of its rungs. :func:`register_section` adds one; :class:`~.config.StudyConfig`
holds one instance per registered section (``config.section("bandit")``); the CLI
(:mod:`.cli`) gives each field one flag, ``--<section>-<field>`` (``--bandit-steps``,
``--tf-knobs op=reverse length=2``, ``--llm-lrs 1e-5 2e-5``); a folder's ``config.json`` records
them under ``sections``. An old record (flat ``bandit_*``/``tf_*`` fields, a global ``seeds``,
``extra: {"llm": {...}}``) is read through each section's ``legacy`` function
(:func:`migrate`).

A setting's error names it as ``<section>_<field>`` (the flag without dashes: ``bandit_steps``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.configs import arg, check_int


@dataclass(frozen=True)
class Section:
    """A registered section: ``settings`` (a frozen dataclass; fields declared with
    :func:`~sandbox.configs.arg`, ``seeds`` among them), ``legacy(record)``: its values in an old
    flat ``config.json`` (:func:`migrate`), ``execution``: the fields that choose how its runs
    execute, not what they compute (left out of :func:`~.config.part_fields`)."""

    name: str
    settings: type
    legacy: Callable[[Mapping[str, Any]], dict[str, Any]]
    execution: tuple[str, ...] = ()


SECTIONS: dict[str, Section] = {}


def register_section(
    name: str,
    settings: type,
    legacy: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
    execution: tuple[str, ...] = (),
) -> type:
    """Add the settings section ``name`` (``llm.claims`` adds ``llm``). ``settings`` must have a
    ``seeds`` field (the paired seeds of the section's rungs); ``legacy`` defaults to no old
    values (the section's defaults)."""
    names = [f.name for f in dataclasses.fields(settings)]
    if "seeds" not in names:
        raise ValueError(f"section {name!r}: its settings need a 'seeds' field (paired seeds)")
    unknown = sorted(set(execution) - set(names))
    if unknown:
        raise ValueError(f"section {name!r}: execution names no field {unknown}")
    SECTIONS[name] = Section(name, settings, legacy or (lambda record: {}), execution)
    return settings


def unregister_section(name: str) -> None:
    """Remove the section ``name`` (a test's throwaway section); ``ValueError`` if unknown."""
    if name not in SECTIONS:
        raise ValueError(f"sections: unknown section {name!r}; sections: {', '.join(SECTIONS)}")
    del SECTIONS[name]


def section_settings(name: str, value: Any = None) -> Any:
    """The settings of section ``name`` from ``value``: an instance, a mapping of its fields
    (a ``config.json``, a profile) or None (its defaults); ``ValueError`` naming an unknown
    section or setting."""
    if name not in SECTIONS:
        raise ValueError(f"sections: unknown section {name!r}; sections: {', '.join(SECTIONS)}")
    cls = SECTIONS[name].settings
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: settings must be a mapping of its fields, got {value!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        known = ", ".join(f"{name}_{n}" for n in names)
        raise ValueError(f"{name}: unknown setting(s) {unknown}; settings: {known}")
    try:
        return cls(**value)
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from None


def section_fields(name: str) -> list[dataclasses.Field]:
    """The fields of section ``name``'s settings dataclass."""
    return list(dataclasses.fields(SECTIONS[name].settings))


def section_hints(name: str) -> dict[str, Any]:
    """Field -> type hint of section ``name``'s settings dataclass."""
    return typing.get_type_hints(SECTIONS[name].settings)


def migrate(values: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """An old flat ``config.json`` (``seeds``, ``bandit_*``, ``tf_*``, ``extra``) as this
    version's record: the study's own ``fields`` kept, each section's values from its ``legacy``
    function under ``sections``. A record of this version comes back as it is."""
    if "sections" in values or not ({"seeds", "extra"} & set(values)):
        return dict(values)
    out: dict[str, Any] = {k: v for k, v in values.items() if k in fields}
    out["sections"] = {name: s.legacy(values) for name, s in SECTIONS.items()}
    return out


def flat(record: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The old flat fields ``<prefix>_<field>`` of a record, without the prefix."""
    head = prefix + "_"
    return {k.removeprefix(head): v for k, v in record.items() if k.startswith(head)}


# -- value checks, each naming its setting ------------------------------------------------------


def step_sizes(name: str, value: Any) -> list[float]:
    """A step-size grid: finite numbers > 0 (strings of numbers too: an old record)."""
    values = value if isinstance(value, list | tuple) else [value]
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numbers, got {value!r}") from None
    if not out or any(isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must be finite numbers > 0, got {value!r}")
    if not all(math.isfinite(v) and v > 0 for v in out):
        raise ValueError(f"{name} must be finite numbers > 0, got {out}")
    return out


def mu_grid(name: str, value: Any) -> list[int]:
    """A mu grid: integers >= 1; one int (an old config.json) is a grid of one."""
    values = [value] if isinstance(value, int | str) else list(value)
    try:
        ints = [int(v) for v in values]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be integers, got {value!r}") from None
    if not ints or ints != [float(v) for v in values] or min(ints) < 1:
        raise ValueError(f"{name} must be integers >= 1, got {value!r}")
    return ints


def check_fields(settings: Any, section: str, low: Mapping[str, int]) -> None:
    """Integers of ``settings`` >= their ``low`` bound, each error naming ``section_field``."""
    for field, bound in low.items():
        check_int(f"{section}_{field}", getattr(settings, field), bound)


def knobs(name: str, value: Any) -> dict[str, Any]:
    """A task's knobs: a mapping (checked by the task itself)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be key=value pairs, got {value!r}")
    return dict(value)


def knob_text(value: Any) -> str:
    """A knob's value in a setting name or on the page: a list as its items joined
    (``ops=['+','-']`` -> ``+-``), anything else as ``str``."""
    return "".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def check_task(name: str, task: str, task_knobs: Mapping[str, Any]) -> None:
    """``ValueError`` naming ``name`` if ``envs.reasoning`` has no task ``task`` with these
    knobs."""
    from envs.reasoning import make_task

    try:
        make_task(task, **task_knobs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: {exc}") from None


def _set(settings: Any, **values: Any) -> None:
    for key, value in values.items():
        object.__setattr__(settings, key, value)


# -- the sandbox sections -----------------------------------------------------------------------


@dataclass(frozen=True)
class BanditSettings:
    """The bandit rungs' settings (``bandit_exact``, ``bandit_sampled``)."""

    setting: str = arg("mixed", "envs.make_bandit_suite name")
    # the regime (setting, steps, seeds): chosen by `python -m sandbox.study.regimes`
    # (results/regimes): `mixed` at 60 steps left every comparator within 2 margins of the optimum
    steps: int = arg(15, "bandit steps")
    prompts_per_step: int = arg(4, "groups per bandit step")
    lrs: list[float] = arg(
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], "bandit step-size grid (SGD)"
    )
    seeds: int = arg(99, "paired seeds per rule on bandit_sampled (the exact flow: 1)")

    def __post_init__(self) -> None:
        _set(self, lrs=step_sizes("bandit_lrs", self.lrs))
        check_fields(self, "bandit", {"steps": 1, "prompts_per_step": 1, "seeds": 1})

    def check(self) -> None:
        """The bandit setting exists."""
        from envs import make_bandit_suite

        suite = make_bandit_suite()
        if self.setting not in suite:
            raise ValueError(
                f"bandit_setting: unknown setting {self.setting!r}; settings: {', '.join(suite)}"
            )


@dataclass(frozen=True)
class TfSettings:
    """The tiny_tf rung's settings."""

    # the regime (task, knobs, steps, seeds): chosen by `python -m sandbox.study.regimes`
    # (results/regimes); on `mod_arith` (steps 2) no rule beat always answering "0"
    task: str = arg("bits", "tiny_tf task (envs.reasoning)")
    knobs: dict[str, Any] = arg(
        {"op": "reverse", "length": 2}, "tiny_tf task knobs, key=value (the task checks them)"
    )
    steps: int = arg(40, "tiny_tf steps")
    prompts_per_step: int = arg(4, "tiny_tf prompts per step")
    lrs: list[float] = arg([3e-4, 1e-3, 3e-3, 1e-2], "tiny_tf step-size grid (Adam)")
    epochs: list[int] = arg(
        [4, 8],
        "mu grid on tiny_tf: epochs (x minibatches); 2 x 2 left dapo's clip share below 4%% at "
        "every step size tried, 4 x 2 below 5%%, so this rung calibrates over more passes",
    )
    eval_prompts: int = arg(512, "tiny_tf held-out problems (fixed by the seed)")
    eval_k: int = arg(2, "tiny_tf samples per held-out problem")
    seeds: int = arg(119, "paired seeds per rule on tiny_tf")

    def __post_init__(self) -> None:
        _set(
            self,
            lrs=step_sizes("tf_lrs", self.lrs),
            epochs=mu_grid("tf_epochs", self.epochs),
            knobs=knobs("tf_knobs", self.knobs),
        )
        low = {"steps": 1, "prompts_per_step": 1, "eval_prompts": 1, "eval_k": 1, "seeds": 1}
        check_fields(self, "tf", low)

    def check(self) -> None:
        """The task exists with these knobs."""
        check_task("tf_task, tf_knobs", self.task, self.knobs)


register_section(
    "bandit", BanditSettings, lambda record: {**flat(record, "bandit"), **_seeds(record)}
)
register_section("tf", TfSettings, lambda record: {**flat(record, "tf"), **_seeds(record)})


def _seeds(record: Mapping[str, Any]) -> dict[str, Any]:
    """An old record's global ``seeds``: the toy sections' paired seeds."""
    return {"seeds": record["seeds"]} if "seeds" in record else {}
