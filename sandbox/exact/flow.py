r"""Expected-gradient flow: the deterministic dynamics a sampled trainer follows in expectation.

Each outer step plays one rollout/update round of a PPO-style trainer with infinitely many
samples::

    z_old <- z
    repeat mu (= epochs) times:   z <- z + lr * dJ/dz(z; z_old)          ("sgd")
                                  or an Adam step on the ascent direction ("adam")

with ``dJ/dz`` the exact expected gradient of :func:`~sandbox.exact.bandit_gradient` (single bandit)
or :func:`~sandbox.exact.contextual_bandit_gradient` (prompts, each weighted by its probability).
With ``epochs > 1`` the ratio leaves 1 after the first inner update, so clipping acts exactly as
in the sampled trainer.

Logged per outer step (one row of a tidy DataFrame):

=========================  =====================================================================
column                     meaning
=========================  =====================================================================
step                       outer step t = 0, 1, ... (the row describes the update from z_t)
expected_reward            pass rate ``sum_a pi_t(a) E[R | a]`` (contextual: prompt-weighted mean)
entropy                    ``H(pi_t)`` in nats (contextual: prompt-weighted mean)
grad_norm                  L2 norm of the first (on-policy) exact gradient of the step
delta_entropy              ``H(pi_{t+1}) - H(pi_t)`` (actual)
predicted_delta_entropy    ``-Cov_{a~pi_t}(log pi_t(a), dz_a)``, ``dz = z_{t+1} - z_t`` (§6.8)
clip_low_frac              expected Z_lo share of sampled tokens, mean over the mu inner updates
clip_high_frac             expected Z_hi share, likewise (both NaN for objectives without bounds)
=========================  =====================================================================
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from envs.bandit import BanditSetting, make_bandit_suite
from sandbox.objectives import Objective

from .bandit import (
    _check_objective,
    _check_prompt_probs,
    _dead_zone_shares,
    _expected_terms,
    _gradient,
    _Inputs,
    _prepare,
)
from .softmax import entropy, entropy_covariance_prediction, expected_value

__all__ = ["FLOW_COLUMNS", "OPTIMIZERS", "exact_flow"]

F64 = torch.float64
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")
FLOW_COLUMNS: tuple[str, ...] = (
    "step",
    "expected_reward",
    "entropy",
    "grad_norm",
    "delta_entropy",
    "predicted_delta_entropy",
    "clip_low_frac",
    "clip_high_frac",
)


def _resolve_model(model: Any) -> Any:
    """A suite name, a :class:`BanditSetting`, an env (wrapped or not) or a model -> the model."""
    if isinstance(model, str):
        suite = make_bandit_suite()
        if model not in suite:
            raise ValueError(f"model: unknown suite setting {model!r}; valid: {sorted(suite)}")
        model = suite[model]
    if isinstance(model, BanditSetting):
        model = model.make()
    model = getattr(model, "unwrapped", model)
    if not hasattr(model, "mean_rewards") or not hasattr(model, "initial_logits"):
        raise ValueError(
            "model must be a BanditModel, ContextualBanditModel, one of their envs, a "
            f"BanditSetting or a suite name; got {type(model).__name__}"
        )
    return model


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def exact_flow(
    obj: Objective,
    model: Any,
    *,
    steps: int,
    lr: float,
    advantage: str = "population",
    group_size: int | None = None,
    eps: float = 1e-6,
    epochs: int = 1,
    optimizer: str = "sgd",
    betas: tuple[float, float] = (0.9, 0.999),
    adam_eps: float = 1e-8,
    logits: Tensor | None = None,
    return_logits: bool = False,
) -> pd.DataFrame | tuple[pd.DataFrame, Tensor]:
    """Run the expected-gradient flow of ``obj`` on a bandit and log one row per outer step.

    Args:
        obj: an objective with ``expected_coef``.
        model: a :class:`~envs.bandit.BanditModel` (binary, deterministic-needle or Gaussian
            rewards) or :class:`~envs.bandit.ContextualBanditModel`, one of their envs, a
            :class:`~envs.bandit.BanditSetting`, or a name of :func:`envs.make_bandit_suite`.
        steps: number of outer steps (rollout rounds), >= 1.
        lr: learning rate, > 0.
        advantage, group_size, eps: as in :func:`~sandbox.exact.bandit_gradient`.
        epochs: mu, inner updates per outer step on the same (infinite) batch, >= 1.
        optimizer: ``"sgd"`` (``z += lr g``) or ``"adam"`` (Adam on the ascent direction, state
            kept across all updates; ``betas``, ``adam_eps``).
        logits: initial logits ``[K]`` or ``[P, K]``; default ``model.initial_logits``.
        return_logits: also return the final logits.

    Returns:
        DataFrame with the columns of :data:`FLOW_COLUMNS` (see the module docstring), and the
        final logits (float64) if ``return_logits``.
    """
    _check_objective(obj)
    steps = _check_int("steps", steps, 1)
    epochs = _check_int("epochs", epochs, 1)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0.0 < lr < math.inf:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    model = _resolve_model(model)

    contextual = hasattr(model, "prompt_probs")
    success = getattr(model, "success_probs", None)
    binary = success is not None
    rewards = torch.tensor(success if binary else model.mean_rewards, dtype=F64)
    noise = None if binary else float(getattr(model, "noise_std", 0.0) or 0.0)
    z0 = model.initial_logits if logits is None else logits
    z = _prepare(z0, z0, rewards, binary, noise, advantage, group_size, eps).logits.clone()
    if z.shape != rewards.shape:
        raise ValueError(
            f"logits must have the model's shape {tuple(rewards.shape)}, got {tuple(z.shape)}"
        )
    if contextual:
        rho = _check_prompt_probs(model.prompt_probs, z)
        rho_col = rho[:, None]

        def average(x: Tensor) -> Tensor:  # prompt-weighted mean over [P]
            return (rho * x).sum() / rho.sum()
    else:
        rho_col = None

        def average(x: Tensor) -> Tensor:
            return x

    bounds_fn = getattr(obj, "bounds", None)
    has_bounds = callable(bounds_fn) and bounds_fn() is not None
    nan = torch.tensor(math.nan, dtype=F64)
    m = torch.zeros_like(z)
    v = torch.zeros_like(z)
    n_updates = 0
    rows: list[Tensor] = []
    h = entropy(z)
    for t in range(steps):
        z_old = z
        reward = average(expected_value(z, rewards))
        low_sum = high_sum = torch.zeros((), dtype=F64)
        grad_norm = nan
        for i in range(epochs):
            inp = _prepare_fast(z, z_old, rewards, noise)
            terms = _expected_terms(obj, inp, binary, advantage, group_size, eps)
            g = _gradient(terms)
            if rho_col is not None:
                g = g * rho_col
            if i == 0:
                grad_norm = torch.linalg.vector_norm(g)
            if has_bounds and i > 0:  # the first update is on-policy: shares are 0
                shares = _dead_zone_shares(obj, terms)
                assert shares is not None
                low_sum = low_sum + average(shares[0])
                high_sum = high_sum + average(shares[1])
            if optimizer == "sgd":
                z = z + lr * g
            else:
                n_updates += 1
                m = betas[0] * m + (1.0 - betas[0]) * g
                v = betas[1] * v + (1.0 - betas[1]) * g * g
                m_hat = m / (1.0 - betas[0] ** n_updates)
                v_hat = v / (1.0 - betas[1] ** n_updates)
                z = z + lr * m_hat / (v_hat.sqrt() + adam_eps)
        h_next = entropy(z)
        predicted = entropy_covariance_prediction(z_old, z - z_old)
        low = low_sum / epochs if has_bounds else nan
        high = high_sum / epochs if has_bounds else nan
        rows.append(
            torch.stack(
                [
                    torch.tensor(float(t), dtype=F64),
                    reward,
                    average(h),
                    grad_norm,
                    average(h_next) - average(h),
                    average(predicted),
                    low,
                    high,
                ]
            )
        )
        h = h_next
    frame = pd.DataFrame(torch.stack(rows).numpy(), columns=list(FLOW_COLUMNS))
    frame["step"] = frame["step"].astype("int64")
    frame.attrs.update(
        objective=repr(obj), advantage=advantage, lr=float(lr), epochs=epochs, optimizer=optimizer
    )
    return (frame, z) if return_logits else frame


def _prepare_fast(z: Tensor, z_old: Tensor, rewards: Tensor, noise: float | None) -> _Inputs:
    """The validated-input record without re-validating (the flow's tensors are already clean)."""
    noise_t = None if not noise else torch.full_like(z, noise)
    return _Inputs(z, z_old, rewards, noise_t)
