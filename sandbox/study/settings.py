"""Typed per-rung settings: one frozen dataclass per *section*, one way to set each setting.

A section holds the settings of one or more rungs (``bandit``: ``bandit_exact`` and
``bandit_sampled``; ``tf``: ``tiny_tf``; ``llm``: registered by ``llm.claims``), the paired
``seeds`` of its rungs among them. :class:`~.config.StudyConfig` holds one instance per section
(``config.section("bandit")``), the CLI (:mod:`.cli`) gives each field one flag,
``--<section>-<field>`` (``--tf-knobs op=reverse length=2``), and a folder's ``config.json``
records them under ``sections``. A setting's error names it ``<section>_<field>``
(``bandit_steps``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.configs import arg, check_int, check_keys, check_number
from sandbox.experiments.compare import check_setting_names, check_task

#: The registered sections: name -> settings dataclass.
SECTIONS: dict[str, type] = {}


def unknown(kind: str, name: str, names: Iterable[str]) -> ValueError:
    """The error for an unregistered name: ``rungs: unknown rung 'x'; rungs: a, b``."""
    return ValueError(f"{kind}s: unknown {kind} {name!r}; {kind}s: {', '.join(names)}")


def register_section(name: str, settings: type) -> type:
    """Add the section ``name`` (``llm.claims`` adds ``llm``); ``settings`` is a frozen dataclass
    with a ``seeds`` field, its fields declared with :func:`~sandbox.configs.arg`."""
    names = [f.name for f in dataclasses.fields(settings)]
    if "seeds" not in names:
        raise ValueError(f"section {name!r}: its settings need a 'seeds' field (paired seeds)")
    SECTIONS[name] = settings
    return settings


def unregister_section(name: str) -> None:
    """Remove the section ``name`` (a test's throwaway section)."""
    if SECTIONS.pop(name, None) is None:
        raise unknown("section", name, SECTIONS)


def section_settings(name: str, value: Any = None) -> Any:
    """The settings of section ``name`` from an instance, a mapping of its fields (a
    ``config.json``, a profile) or None (its defaults); ``ValueError`` naming an unknown section
    or setting."""
    if name not in SECTIONS:
        raise unknown("section", name, SECTIONS)
    cls = SECTIONS[name]
    if value is None or isinstance(value, cls):
        return cls() if value is None else value
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: settings must be a mapping of its fields, got {value!r}")
    check_keys(name, value, [f.name for f in dataclasses.fields(cls)], "setting")
    try:
        return cls(**value)
    except TypeError as exc:
        raise ValueError(f"{name}: {exc}") from None


# -- value checks, each naming its setting ------------------------------------------------------


def step_sizes(name: str, value: Any) -> list[float]:
    """A step-size grid: finite numbers > 0 (strings of numbers too: an old record)."""
    values = value if isinstance(value, list | tuple) else [value]
    try:
        out = [check_number(name, v, text=True) for v in values]
    except ValueError:
        out = []
    if not out:
        raise ValueError(f"{name} must be finite numbers > 0, got {value!r}")
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


def knobs(name: str, value: Any) -> dict[str, Any]:
    """A task's knobs: a mapping (checked by the task itself)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be key=value pairs, got {value!r}")
    return dict(value)


def optional_path(name: str, value: Any) -> str | None:
    """A file path, or None where ``value`` is None or ``none`` (the command line's word for it:
    ``--tf-init none`` trains from scratch)."""
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return None
    return text(name, value)


def text(name: str, value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def settle(
    settings: Any, section: str, low: Mapping[str, int] | None = None, **checks: Callable
) -> None:
    """Check a section's settings in ``__post_init__``: each field of ``checks`` replaced by
    ``check("<section>_<field>", value)`` (in order), then :func:`check_fields`."""
    for field, check in checks.items():
        value = check(f"{section}_{field}", getattr(settings, field))
        object.__setattr__(settings, field, value)
    check_fields(settings, f"{section}_", low)


def check_fields(settings: Any, prefix: str = "", low: Mapping[str, int] | None = None) -> None:
    """Every field of dataclass ``settings`` with ``choices`` (its :func:`sandbox.configs.arg`)
    one of them (or None where its type allows None), and every ``int`` field an integer >= its
    bound in ``low`` (default 1); a ``ValueError`` naming ``<prefix><field>``."""
    for f in dataclasses.fields(settings):
        value, choices = getattr(settings, f.name), f.metadata.get("choices")
        optional = value is None and "None" in str(f.type)
        if choices is not None and value not in choices and not optional:
            raise ValueError(
                f"{prefix}{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}"
            )
        if f.type in (int, "int"):
            check_int(f"{prefix}{f.name}", value, (low or {}).get(f.name, 1))


def knob_text(value: Any) -> str:
    """A knob's value in a setting name or on the page: a list as its items joined
    (``ops=['+','-']`` -> ``+-``), anything else as ``str``."""
    return "".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def task_setting(task: str, task_knobs: Mapping[str, Any]) -> str:
    """A task's setting name: the task and its sorted knobs (``bits-length2-opreverse``)."""
    return "-".join([task, *(f"{k}{knob_text(v)}" for k, v in sorted(task_knobs.items()))])


# -- the sandbox sections -----------------------------------------------------------------------


@dataclass(frozen=True)
class BanditSettings:
    """The bandit rungs' settings (``bandit_exact``, ``bandit_sampled``)."""

    setting: str = arg("mixed", "envs.make_bandit_suite name")
    # the regime (setting, steps, seeds): chosen by `python -m sandbox.study.regimes`
    # (results/regimes): `mixed` at 60 steps left every comparator within 2 margins of the optimum
    steps: int = arg(15, "bandit_sampled steps")
    # the exact flow's horizon, chosen by the same rule (results/regimes): at 15 steps every
    # comparator of the exact flow sat within 2 margins of the optimum (no headroom)
    exact_steps: int = arg(5, "bandit_exact steps (the expected-gradient flow's horizon)")
    prompts_per_step: int = arg(4, "groups per bandit step")
    lrs: list[float] = arg(
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], "bandit step-size grid (SGD)"
    )
    seeds: int = arg(99, "paired seeds per rule on bandit_sampled (the exact flow: 1)")

    def __post_init__(self) -> None:
        settle(self, "bandit", lrs=step_sizes)

    def check(self) -> None:
        """The bandit setting exists."""
        from envs import make_bandit_suite

        check_setting_names([self.setting], make_bandit_suite(), where="bandit_setting")


#: The tiny_tf rung's warm start: made by ``python -m sandbox.study.regimes`` (the chosen
#: candidate's ``warm_start``: held-out pass@1 0.3 on the test partition, at most 400 supervised
#: steps) and committed.
WARM_START = "results/regimes/warm_start/sequence-alphabetdigits-length4-opreverse-e87869c26c.pt"


@dataclass(frozen=True)
class TfSettings:
    """The tiny_tf rung's settings."""

    # the regime (task, knobs, steps, step-size grid, warm start, seeds): chosen by
    # `python -m sandbox.study.regimes` (results/regimes): 4-digit reversal from one warm start,
    # on held-out problems of its test partition (the 2-bit reversal it replaced had 4 problems;
    # on `mod_arith` (steps 2) no rule beat always answering "0")
    task: str = arg("sequence", "tiny_tf task (envs.reasoning)")
    knobs: dict[str, Any] = arg(
        {"op": "reverse", "length": 4, "alphabet": "digits"},
        "tiny_tf task knobs, key=value (the task checks them)",
    )
    steps: int = arg(40, "tiny_tf steps")
    prompts_per_step: int = arg(4, "tiny_tf prompts per step")
    lrs: list[float] = arg(
        [1e-5, 3e-5, 1e-4],
        "tiny_tf step-size grid (Adam; from 1e-3 up Adam destroyed a warm-started model: "
        "results/warm_start_pilot)",
    )
    epochs: list[int] = arg(
        [4, 8],
        "mu grid on tiny_tf: epochs (x minibatches); 2 x 2 left dapo's clip share below 4%% at "
        "every step size tried, 4 x 2 below 5%%, so this rung calibrates over more passes",
    )
    eval_prompts: int = arg(512, "tiny_tf held-out problems (fixed by the seed)")
    eval_k: int = arg(2, "tiny_tf samples per held-out problem")
    split: bool = arg(
        True,
        "tiny_tf trains on the task's train partition and scores held-out problems from its test "
        "partition (disjoint by construction; envs.reasoning.problem_split)",
    )
    init: str | None = arg(
        WARM_START,
        "tiny_tf warm start: a file of python -m sandbox.train.warm_start every replicate starts "
        "from (none: from scratch; a relative path not found from the working directory is read "
        "from the checkout)",
    )
    seeds: int = arg(26, "paired seeds per rule on tiny_tf")

    def __post_init__(self) -> None:
        settle(self, "tf", lrs=step_sizes, epochs=mu_grid, knobs=knobs, init=optional_path)

    def check(self) -> None:
        """The task exists with these knobs, and a warm start fits them."""
        check_task("tf_task, tf_knobs", self.task, self.knobs)
        if self.init is not None:
            from sandbox.train import SequenceTrainConfig

            try:
                SequenceTrainConfig(task=self.task, task_knobs=dict(self.knobs), init=self.init)
            except ValueError as exc:
                hint = "; give --tf-init a warm start of this task, or none (from scratch)"
                raise ValueError(f"tf_{exc}{hint}") from None


register_section("bandit", BanditSettings)
register_section("tf", TfSettings)
