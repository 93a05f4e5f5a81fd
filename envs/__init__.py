"""Gymnasium environments for the clip sandbox, registered in the ``sandbox/`` namespace.

Importing ``envs`` registers every id in :data:`ENV_IDS` (idempotently), each with a
``vector_entry_point`` so that::

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

__all__ = [
    "ENV_IDS",
    "BanditModel",
    "BanditSetting",
    "ContextualBandit",
    "ContextualBanditModel",
    "ContextualBanditVectorEnv",
    "SoftmaxBandit",
    "SoftmaxBanditVectorEnv",
    "make_bandit_suite",
]

# id -> (entry_point, vector_entry_point); the only place an id is spelled out.
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

#: Every id this package registers; tests parametrise over it.
ENV_IDS: tuple[str, ...] = tuple(_REGISTRATIONS)


def _register_all() -> None:
    for env_id, (entry_point, vector_entry_point) in _REGISTRATIONS.items():
        if env_id in gymnasium.registry:  # importing twice (or reloading) must not re-register
            continue
        gymnasium.register(
            id=env_id, entry_point=entry_point, vector_entry_point=vector_entry_point
        )


_register_all()
