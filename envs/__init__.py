"""Gymnasium environments for the clip sandbox, registered in the ``sandbox/`` namespace.

Importing ``envs`` registers every id in ``ENV_IDS`` (idempotently): the bandits listed here,
and one ``sandbox/Reasoning-<Task>-v0`` per reasoning task, registered by the task's own
``@register_task`` decorator (:mod:`envs.reasoning.tasks`). Each has a ``vector_entry_point``
so that::

    import gymnasium as gym
    import envs

    env = gym.make("sandbox/SoftmaxBandit-v0", reward="needle", num_arms=100)
    vec = gym.make_vec("sandbox/ContextualBandit-v0", num_envs=4096,
                       vectorization_mode="vector_entry_point")

``envs`` knows tasks and rewards only; it imports neither ``sandbox`` nor ``llm``.
"""

from __future__ import annotations

import gymnasium

from envs.bandit import (
    BanditModel,
    BanditSetting,
    ContextualBandit,
    ContextualBanditModel,
    ContextualBanditVectorEnv,
    SoftmaxBandit,
    SoftmaxBanditVectorEnv,
    make_bandit_suite,
)
from envs.reasoning.tasks import available_tasks, task_env_id  # registers the reasoning ids

__all__ = [
    "BANDIT_ENV_IDS",
    "ENV_IDS",
    "REASONING_ENV_IDS",
    "BanditModel",
    "BanditSetting",
    "ContextualBandit",
    "ContextualBanditModel",
    "ContextualBanditVectorEnv",
    "SoftmaxBandit",
    "SoftmaxBanditVectorEnv",
    "make_bandit_suite",
]

# id -> (entry_point, vector_entry_point) of the bandits. The reasoning ids are not listed here:
# ``@register_task`` (envs.reasoning.tasks) registers each task's id, imported below.
_REGISTRATIONS: dict[str, tuple[str, str]] = {
    "sandbox/SoftmaxBandit-v0": (
        "envs.bandit:SoftmaxBandit",
        "envs.bandit:SoftmaxBanditVectorEnv",
    ),
    "sandbox/ContextualBandit-v0": (
        "envs.bandit:ContextualBandit",
        "envs.bandit:ContextualBanditVectorEnv",
    ),
}

#: The one-step bandit ids.
BANDIT_ENV_IDS: tuple[str, ...] = tuple(_REGISTRATIONS)


def __getattr__(name: str) -> tuple[str, ...]:
    """``REASONING_ENV_IDS`` (one token-env id per registered task, by task name) and
    ``ENV_IDS`` (every id this package registers; tests parametrise over it), read from the task
    registry on each access, so a task registered after ``import envs`` is included."""
    if name == "REASONING_ENV_IDS":
        return tuple(task_env_id(task) for task in available_tasks())
    if name == "ENV_IDS":
        return BANDIT_ENV_IDS + tuple(task_env_id(task) for task in available_tasks())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_all() -> None:
    for env_id, (entry_point, vector_entry_point) in _REGISTRATIONS.items():
        if env_id in gymnasium.registry:  # importing twice (or reloading) must not re-register
            continue
        gymnasium.register(
            id=env_id, entry_point=entry_point, vector_entry_point=vector_entry_point
        )


_register_all()
