"""Every clipping objective, in one registry.

    >>> from sandbox.objectives import get_objective, available_objectives
    >>> obj = get_objective("nsr", eps_low=0.2, eps_high=0.28, noise="band", sigma=0.1)
    >>> out = obj(logp, logp_old, adv, mask, generator=gen)  # doctest: +SKIP
    >>> out.loss, out.coef, out.metrics                       # doctest: +SKIP

Names resolve through :func:`get_objective`: a registered objective (its defaults are its paper's
settings) or a named preset from :mod:`sandbox.objectives.presets`.
"""

from __future__ import annotations

from typing import Any

from . import clip, entropy, rescue, soft  # noqa: F401  (registration side effects)
from .base import (
    Batch,
    Objective,
    ObjectiveOutput,
    RatioObjective,
    available_objectives,
    build_objective,
    log_ratio,
    objective_class,
    register_objective,
)
from .clip import atr_bounds
from .presets import PRESETS, Preset

__all__ = [
    "PRESETS",
    "Batch",
    "Objective",
    "ObjectiveOutput",
    "Preset",
    "RatioObjective",
    "atr_bounds",
    "available_objectives",
    "available_presets",
    "describe",
    "get_objective",
    "log_ratio",
    "objective_class",
    "register_objective",
]


def available_presets() -> list[str]:
    """Every preset name, sorted."""
    return sorted(PRESETS)


def get_objective(name: str, **params: Any) -> Objective:
    """Build an objective by registry name or preset name.

    ``params`` override the defaults (for a preset: the preset's settings). Unknown names and
    unknown or out-of-range parameters raise ``ValueError`` naming them and the valid choices.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    if name in available_objectives():
        return build_objective(name, params)
    if name in PRESETS:
        preset = PRESETS[name]
        obj = build_objective(preset.objective, {**preset.params, **params})
        obj.aggregation = preset.aggregation
        obj.preset = name
        return obj
    raise ValueError(
        f"unknown objective {name!r}; valid objectives: {', '.join(available_objectives())}; "
        f"valid presets: {', '.join(available_presets())}"
    )


def describe() -> list[dict[str, Any]]:
    """One row per objective and per preset: name, kind, base objective, parameters, aggregation."""
    rows = []
    for name in available_objectives():
        cls = objective_class(name)
        rows.append(
            {
                "name": name,
                "kind": "objective",
                "objective": name,
                "level": cls.level,
                "stochastic": cls.stochastic,
                "params": cls.defaults(),
                "aggregation": cls.aggregation,
                "paper": f"arXiv {cls.paper}" if cls.paper else "",
            }
        )
    for name in available_presets():
        preset = PRESETS[name]
        obj = get_objective(name)
        rows.append(
            {
                "name": name,
                "kind": "preset",
                "objective": preset.objective,
                "level": obj.level,
                "stochastic": obj.stochastic,
                "params": obj.params,
                "aggregation": preset.aggregation,
                "paper": preset.source,
            }
        )
    return rows
