r"""Mechanism check (c): a stochastic rule's own gradient noise against the batch's sampling noise.

A stochastic rule (NSR) and its deterministic counterpart :meth:`Objective.expectation` (NSR-decay:
the same ``expected_coef``) see the same minibatch. The loss assembly (:class:`sandbox.loss.PolicyLoss`)
is linear in the per-token coefficients, so given the batch the counterpart's gradient is the
expectation of the rule's over the rule's draws, ``g_det = E_xi[g_rule | batch]``, and

    g_rule - g_det = sum_t A_t r_t (keep_t - q_t) grad log pi_t / n        (NSR, token-mean)

is the rule's noise alone. Per optimizer update and per seed (model) ``s``, :func:`grad_noise`
measures, on the update's own rows and at the parameters the update's gradient was taken at:

- ``rescue_var   = ||g_rule - g_det||^2``: one draw of the rule's noise, an unbiased estimate of
  ``tr Cov_xi[g_rule | batch]``;
- ``sampling_var = ||h_1 - h_2||^2``, ``h_i`` the contribution of half ``i`` of the seed's rows to
  ``g_det = h_1 + h_2`` (the half's rows with the whole minibatch's counts): with halves of equal
  counts ``h_i = g_det(half i) / 2``, so this is ``||g_det(half 1) - g_det(half 2)||^2 / 4``, an
  estimate of ``tr Cov[g_det]``, the batch-sampling variance of the minibatch mean gradient
  (exact for i.i.d. rows; GRPO's group-centred advantages make rows of one group dependent);
- ``signal       = ||g_det||^2``.

The rule's total gradient variance is ``tr Cov[g_det] + E tr Cov_xi[g_rule | batch]``, so
``Var(rule) / Var(det) ~ 1 + rescue_var / sampling_var`` (both averaged over updates first).

``g_rule`` is the gradient the update just computed (read, not recomputed: the probe draws no
random numbers, so training with the probe on is bit-identical to training with it off); ``g_det``
and ``h_1`` come from one extra forward pass of the counterpart's loss through the same
:class:`~sandbox.loss.PolicyLoss` (:func:`counterpart_loss`) and two backward passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from .loss import PolicyLoss

#: The columns the trainers log (per step and seed, mean over the step's updates).
GRAD_NOISE_COLUMNS = ("grad_rescue_var", "grad_sampling_var", "grad_signal")


def counterpart_loss(loss_fn: PolicyLoss) -> PolicyLoss | None:
    """``loss_fn`` with its objective replaced by the objective's deterministic counterpart
    (:meth:`sandbox.objectives.Objective.expectation`), the same aggregation mode and the
    metrics-only options off; ``None`` when the objective has none."""
    det = loss_fn.objective.expectation()
    if det is None:
        return None
    return replace(loss_fn, objective=det, aggregation=loss_fn.mode, grad_mass=False)


def check_halves(rows: int, name: str) -> None:
    """``ValueError`` naming ``name`` (the flag or field that asked for the probe) unless a
    minibatch of ``rows`` rows per seed splits in two halves (the sampling-variance estimate)."""
    if rows < 2:
        raise ValueError(
            f"{name} splits each minibatch in halves: it needs >= 2 rows per minibatch and seed, "
            f"got {rows}"
        )


def first_half(seeds: int, rows: int, device: torch.device | str | None = None) -> Tensor:
    """``[seeds * rows, 1]`` bool: the first ``rows // 2`` rows of each seed's consecutive block
    of ``rows`` (half 1 of :func:`grad_noise`). ``ValueError`` unless ``rows >= 2``."""
    check_halves(rows, "grad_noise")
    half = torch.arange(rows, device=device) < rows // 2
    return half.repeat(seeds)[:, None]


def seed_sq_norms(grads: Sequence[Tensor | None], seeds: int) -> Tensor:
    """``[seeds]`` squared L2 norm of each seed's slice (the leading dimension) of ``grads``;
    ``None`` entries (unused parameters) count 0."""
    total: Tensor | None = None
    for g in grads:
        if g is None:
            continue
        sq = g.detach().reshape(seeds, -1).pow(2).sum(-1)
        total = sq if total is None else total + sq
    if total is None:
        raise ValueError("grads must hold at least one gradient")
    return total


def grad_noise(
    forward: Callable[[], tuple[Tensor, Sequence[Tensor]]],
    params: Sequence[Tensor],
    g_rule: Sequence[Tensor | None],
    half: Tensor,
    seeds: int,
) -> Tensor:
    """``[3, seeds]``: ``rescue_var``, ``sampling_var``, ``signal`` of one update (module
    docstring).

    Args:
        forward: runs the policy on the update's rows and returns ``(loss, outputs)``: the
            counterpart's scalar loss (:func:`counterpart_loss`, the same call as the update's)
            and the per-row tensors it was built from that carry the graph to ``params``
            (``logp``, and ``entropy`` when the loss has an entropy term); rows first, as
            ``half``. Called once, here, at the parameters ``g_rule`` was taken at.
        params: the parameters, each with the seeds as its leading dimension.
        g_rule: the rule's gradient of ``params`` (``p.grad`` after the update's backward,
            before clipping or the optimizer step); ``None`` counts as 0.
        half: bool, broadcastable to every output: the rows of half 1 (:func:`first_half`).
        seeds: S.
    """
    loss, outputs = forward()
    g_det, h1 = counterpart_grads(loss, outputs, params, half)
    return noise_stats(g_rule, g_det, h1, seeds)


def counterpart_grads(
    loss: Tensor, outputs: Sequence[Tensor], params: Sequence[Tensor], half: Tensor
) -> tuple[list[Tensor], list[Tensor]]:
    """``(g_det, h_1)`` of one counterpart forward: ``g_det = d loss / d params`` and ``h_1`` the
    part of it that flows through the rows of half 1 (``half``, broadcastable to every output),
    each a list over ``params`` (zeros for an unused parameter). Both are linear in the rows, so
    a minibatch split into micro-batches (each aggregated with the whole minibatch's counts)
    gives the minibatch's ``g_det`` and ``h_1`` as the sums of its micro-batches' (the
    accumulation :func:`grad_noise` skips when one forward holds the whole minibatch)."""
    outputs = list(outputs)
    g_det = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    cot = torch.autograd.grad(loss, outputs, retain_graph=True, allow_unused=True)
    used = [(o, c) for o, c in zip(outputs, cot, strict=True) if c is not None]
    if not used:
        raise ValueError("forward: none of its outputs carries the loss's graph")
    h1 = torch.autograd.grad(
        [o for o, _ in used],
        params,
        grad_outputs=[torch.where(half, c, 0.0) for _, c in used],
        allow_unused=True,
    )
    with torch.no_grad():
        zero = [torch.zeros_like(p) for p in params]
        g_det = [z if g is None else g for g, z in zip(g_det, zero, strict=True)]
        h1 = [z if h is None else h for h, z in zip(h1, zero, strict=True)]
    return g_det, h1


@torch.no_grad()
def noise_stats(
    g_rule: Sequence[Tensor | None],
    g_det: Sequence[Tensor],
    h1: Sequence[Tensor],
    seeds: int,
) -> Tensor:
    """``[3, seeds]``: ``rescue_var = ||g_rule - g_det||^2``, ``sampling_var = ||2 h_1 -
    g_det||^2`` (= ``||h_1 - h_2||^2``) and ``signal = ||g_det||^2`` per seed (module docstring);
    ``g_rule`` entries ``None`` count as 0."""
    rule = [torch.zeros_like(d) if g is None else g for g, d in zip(g_rule, g_det, strict=True)]
    rescue = seed_sq_norms([a - b for a, b in zip(rule, g_det, strict=True)], seeds)
    sampling = seed_sq_norms([2 * h - g for h, g in zip(h1, g_det, strict=True)], seeds)
    return torch.stack([rescue, sampling, seed_sq_norms(g_det, seeds)])
