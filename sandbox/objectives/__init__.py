"""Every clipping objective, in one registry.

    >>> from sandbox.objectives import get_objective, available_objectives
    >>> obj = get_objective("nsr", eps_low=0.2, eps_high=0.28, noise="band", sigma=0.1)
    >>> out = obj(logp, logp_old, adv, mask, generator=gen)  # doctest: +SKIP
    >>> out.loss, out.coef, out.metrics                       # doctest: +SKIP

Names resolve through :func:`get_objective`: a registered objective (its defaults are its paper's
settings) or a named preset from :mod:`sandbox.objectives.presets`. docs/objectives.md gives each
rule's loss, gradient weight by cases, defaults, source and deviations.

Compiled objectives, for GPU hot loops: ``get_objective("dapo", compile=True)`` (or
``compile={"mode": "max-autotune"}``, options for :func:`torch.compile`) runs the tensor
computation of every call through ``torch.compile(fullgraph=True)``: one fused kernel for the
loss and metrics, one for ``out.coef`` (run only when read); the same values as the eager object.
Input checks and the random draws of stochastic rules stay eager (see
:meth:`Objective.compile`). Pass ``validate=False`` after the first step, as the trainers do,
so that no call reads the device. To compile a whole loss step instead (objective + aggregation,
deterministic objectives; a ``torch.Generator`` cannot be traced)::

    obj = get_objective("dapo")

    @torch.compile(fullgraph=True)
    def loss_fn(logp, logp_old, adv, mask):
        out = obj(logp, logp_old, adv, mask, validate=False)
        return aggregate(out.loss, mask, obj.aggregation, validate=False), out.metrics
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import clip, entropy, reinforce, rescue, soft  # noqa: F401  (registration side effects)
from .base import (
    LOG_RATIO_CLAMP,
    Batch,
    Objective,
    ObjectiveOutput,
    RatioObjective,
    available_objectives,
    build_objective,
    dead_zone,
    log_ratio,
    objective_class,
    register_objective,
)
from .clip import atr_bounds
from .presets import PRESETS, Preset

__all__ = [
    "LOG_RATIO_CLAMP",
    "PRESETS",
    "Batch",
    "Objective",
    "ObjectiveOutput",
    "Preset",
    "RatioObjective",
    "atr_bounds",
    "available_objectives",
    "available_presets",
    "dead_zone",
    "describe",
    "get_objective",
    "log_ratio",
    "objective_class",
    "register_objective",
]


def available_presets() -> list[str]:
    """Every preset name, sorted."""
    return sorted(PRESETS)


def get_objective(
    name: str, *, compile: bool | Mapping[str, Any] = False, **params: Any
) -> Objective:
    """Build an objective by registry name or preset name.

    ``params`` override the defaults (for a preset: the preset's settings). Unknown names and
    unknown or out-of-range parameters raise ``ValueError`` naming them and the valid choices.
    ``compile=True`` returns the objective compiled with ``torch.compile(fullgraph=True)``
    (:meth:`Objective.compile`); a mapping gives further :func:`torch.compile` options, e.g.
    ``compile={"backend": "aot_eager"}`` or ``{"mode": "max-autotune"}``.
    """
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    if not isinstance(compile, bool | Mapping):
        raise ValueError(f"compile must be True, False or a mapping of options, got {compile!r}")
    if name in available_objectives():
        obj = build_objective(name, params)
    elif name in PRESETS:
        preset = PRESETS[name]
        obj = build_objective(preset.objective, {**preset.params, **params})
        obj.aggregation = preset.aggregation
        obj.preset = name
    else:
        raise ValueError(
            f"unknown objective {name!r}; valid objectives: {', '.join(available_objectives())}; "
            f"valid presets: {', '.join(available_presets())}"
        )
    if compile is not False:
        obj.compile(**({} if compile is True else dict(compile)))
    return obj


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
