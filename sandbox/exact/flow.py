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

:func:`exact_flows` runs the flows of several objectives on one model as one batched program
(logits ``[R, ..., K]``): the softmax, the outcome table, the gradient, the dead-zone shares and
the optimizer act on all R rules at once, and only each rule's own ``expected_coef`` is called
per rule. Each row equals what :func:`exact_flow` gives for that rule alone (which is the R = 1
case); ``clip-sandbox compare`` computes the exact flows of all rules of a setting this way.

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
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from envs.bandit import BanditSetting, make_bandit_suite
from sandbox.configs import check_int
from sandbox.objectives import Objective

from .bandit import (
    GROUP_ADVANTAGES,
    _check_objective,
    _check_prompt_probs,
    _expected_coef,
    _gradient,
    _Inputs,
    _outcomes,
    _prepare,
    _ratio,
    _Terms,
)
from .softmax import entropy, entropy_covariance_prediction, expected_value, log_softmax

__all__ = ["FLOW_COLUMNS", "OPTIMIZERS", "exact_flow", "exact_flows"]

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
    frames, z = exact_flows(
        [obj],
        model,
        steps=steps,
        lr=lr,
        advantage=advantage,
        group_size=group_size,
        eps=eps,
        epochs=epochs,
        optimizer=optimizer,
        betas=betas,
        adam_eps=adam_eps,
        logits=logits,
        return_logits=True,
    )
    return (frames[0], z[0]) if return_logits else frames[0]


def exact_flows(
    objs: Sequence[Objective],
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
) -> list[pd.DataFrame] | tuple[list[pd.DataFrame], Tensor]:
    """The flows of several objectives on one model, batched: one frame per objective, equal to
    :func:`exact_flow` of each (arguments as there; ``objs`` a non-empty sequence). With
    ``return_logits`` also the final logits ``[R, ...model shape]``."""
    objs = list(objs)
    if not objs:
        raise ValueError("objs must name at least one objective")
    for obj in objs:
        _check_objective(obj)
    steps = check_int("steps", steps, 1)
    epochs = check_int("epochs", epochs, 1)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0.0 < lr < math.inf:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    model = _resolve_model(model)

    success = getattr(model, "success_probs", None)
    binary = success is not None
    rewards = torch.tensor(success if binary else model.mean_rewards, dtype=F64)
    noise = None if binary else float(getattr(model, "noise_std", 0.0) or 0.0)
    z0 = model.initial_logits if logits is None else logits
    z0 = _prepare(z0, z0, rewards, binary, noise, advantage, group_size, eps).logits
    if z0.shape != rewards.shape:
        raise ValueError(
            f"logits must have the model's shape {tuple(rewards.shape)}, got {tuple(z0.shape)}"
        )
    z = z0.expand(len(objs), *z0.shape).clone()  # [R, ..., K]
    rho = _check_prompt_probs(model.prompt_probs, z0) if hasattr(model, "prompt_probs") else None

    def average(x: Tensor) -> Tensor:  # [R, P] -> prompt-weighted mean [R]; [R] unchanged
        return x if rho is None else (rho * x).sum(-1) / rho.sum()

    rewards = rewards.expand_as(z)
    noise_t = torch.full_like(z, noise) if noise else None
    bounds = [obj.bounds() if callable(getattr(obj, "bounds", None)) else None for obj in objs]
    has_bounds = torch.tensor([b is not None for b in bounds])
    shape = (len(objs),) + (1,) * z.dim()  # broadcasts over [R, ..., K, M]
    low = torch.tensor([b[0] if b else math.nan for b in bounds], dtype=F64).view(shape)
    high = torch.tensor([b[1] if b else math.nan for b in bounds], dtype=F64).view(shape)
    m, v = torch.zeros_like(z), torch.zeros_like(z)
    n_updates = 0
    rows: list[Tensor] = []
    h = entropy(z)
    for t in range(steps):
        z_old = z
        reward = average(expected_value(z, rewards))
        low_sum = high_sum = torch.zeros(len(objs), dtype=F64)
        grad_norm = torch.full((len(objs),), math.nan, dtype=F64)
        for i in range(epochs):
            terms = _batched_terms(
                objs, _Inputs(z, z_old, rewards, noise_t), binary, advantage, group_size, eps
            )
            g = _gradient(terms)
            if rho is not None:
                g = g * rho[:, None]
            if i == 0:
                grad_norm = torch.linalg.vector_norm(g.flatten(1), dim=1)
            if i > 0:  # the first update is on-policy: shares are 0
                lo_share, hi_share = _batched_shares(terms, low, high)
                low_sum = low_sum + average(lo_share)
                high_sum = high_sum + average(hi_share)
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
        nan = torch.full_like(low_sum, math.nan)
        rows.append(
            torch.stack(
                [
                    torch.full_like(reward, float(t)),
                    reward,
                    average(h),
                    grad_norm,
                    average(h_next) - average(h),
                    average(predicted),
                    torch.where(has_bounds, low_sum / epochs, nan),
                    torch.where(has_bounds, high_sum / epochs, nan),
                ],
                dim=-1,
            )
        )
        h = h_next
    table = torch.stack(rows, dim=1).numpy()  # [R, steps, columns]
    frames = []
    for obj, values in zip(objs, table, strict=True):
        frame = pd.DataFrame(values, columns=list(FLOW_COLUMNS))
        frame["step"] = frame["step"].astype("int64")
        frame.attrs.update(
            objective=repr(obj),
            advantage=advantage,
            lr=float(lr),
            epochs=epochs,
            optimizer=optimizer,
        )
        frames.append(frame)
    return (frames, z) if return_logits else frames


def _batched_terms(
    objs: list[Objective],
    inp: _Inputs,
    binary: bool,
    advantage: str,
    group_size: int | None,
    eps: float,
) -> _Terms:
    """:func:`~sandbox.exact.bandit._expected_terms` for R objectives on logits ``[R, ..., K]``:
    everything but each rule's ``expected_coef`` (and its ±20 clamp) is computed once."""
    logp = log_softmax(inp.logits)
    logp_old = log_softmax(inp.old_logits)
    pi, pi_old = logp.exp(), logp_old.exp()
    binary = binary or advantage in GROUP_ADVANTAGES
    out = _outcomes(inp, pi_old, binary, advantage, group_size, eps)
    per_row = out.adv.dim() == logp.dim() + 1  # advantages that depend on the row's policy
    ratios, passes, coefs = [], [], []
    for r, obj in enumerate(objs):
        ratio, passing = _ratio(obj, logp[r], logp_old[r])
        adv = out.adv[r] if per_row else out.adv
        ec = _expected_coef(obj, ratio[..., None], adv)  # [..., K, M]
        if not out.discrete:  # Gaussian: E[coef] splits by sign only if coef is homogeneous
            ec2 = _expected_coef(obj, ratio[..., None], 2.0 * adv)
            if not torch.allclose(ec2, 2.0 * ec, rtol=1e-9, atol=1e-300):
                name = getattr(obj, "name", type(obj).__name__)
                raise ValueError(
                    f"objective {name!r} has a coefficient that is not proportional to |A| within "
                    "each sign of A; Gaussian rewards (noise_std) need coef(r, c A) = c coef(r, A)"
                )
        ratios.append(ratio)
        passes.append(passing)
        coefs.append((out.weight[r] * ec).sum(-1) * passing)
    return _Terms(pi, pi_old, torch.stack(ratios), torch.stack(passes), torch.stack(coefs), out)


def _batched_shares(terms: _Terms, low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """Expected dead-zone shares ``[R, ...]`` with per-rule bounds ``low``, ``high`` (NaN where a
    rule has none: every comparison is then false and its share 0)."""
    out = terms.outcomes
    adv = torch.broadcast_to(out.adv, out.prob.shape)
    ratio = terms.ratio[..., None]
    z_lo = (adv < 0) & (ratio < low)
    z_hi = (adv > 0) & (ratio > high)
    weight = terms.pi_old[..., None] * out.prob
    return (weight * z_lo).sum((-1, -2)), (weight * z_hi).sum((-1, -2))
