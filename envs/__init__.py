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
    # token-level reasoning tasks (envs.reasoning); knobs pass through gym.make(id, **knobs)
    "sandbox/Reasoning-ModArith-v0": (
        "envs.reasoning.token_env:ModArithTokenEnv",
        "envs.reasoning.token_env:ModArithTokenVectorEnv",
    ),
    "sandbox/Reasoning-Addition-v0": (
        "envs.reasoning.token_env:AdditionTokenEnv",
        "envs.reasoning.token_env:AdditionTokenVectorEnv",
    ),
    "sandbox/Reasoning-Parity-v0": (
        "envs.reasoning.token_env:ParityTokenEnv",
        "envs.reasoning.token_env:ParityTokenVectorEnv",
    ),
    "sandbox/Reasoning-Sequence-v0": (
        "envs.reasoning.token_env:SequenceTokenEnv",
        "envs.reasoning.token_env:SequenceTokenVectorEnv",
    ),
    "sandbox/Reasoning-Countdown-v0": (
        "envs.reasoning.token_env:CountdownTokenEnv",
        "envs.reasoning.token_env:CountdownTokenVectorEnv",
    ),
    "sandbox/Reasoning-Boolean-v0": (
        "envs.reasoning.token_env:BooleanTokenEnv",
        "envs.reasoning.token_env:BooleanTokenVectorEnv",
    ),
    "sandbox/Reasoning-Bits-v0": (
        "envs.reasoning.token_env:BitsTokenEnv",
        "envs.reasoning.token_env:BitsTokenVectorEnv",
    ),
}

#: Every id this package registers; tests parametrise over it.
ENV_IDS: tuple[str, ...] = tuple(_REGISTRATIONS)
#: The token-level reasoning ids (multi-step episodes) and the one-step bandit ids.
REASONING_ENV_IDS: tuple[str, ...] = tuple(i for i in ENV_IDS if i.startswith("sandbox/Reasoning-"))
BANDIT_ENV_IDS: tuple[str, ...] = tuple(i for i in ENV_IDS if i not in REASONING_ENV_IDS)


def _register_all() -> None:
    for env_id, (entry_point, vector_entry_point) in _REGISTRATIONS.items():
        if env_id in gymnasium.registry:  # importing twice (or reloading) must not re-register
            continue
        gymnasium.register(
            id=env_id, entry_point=entry_point, vector_entry_point=vector_entry_point
        )


_register_all()
