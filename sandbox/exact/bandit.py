r"""Exact expected gradients of clipped policy-gradient objectives on softmax bandits.

Setting (docs/objectives.md §10.3): a K-armed bandit, a softmax policy ``pi = softmax(z)`` and
data sampled from ``pi_old = softmax(z_old)``. For a token-level objective with gradient coefficient
``coef = -dloss/dlogp`` (the contract of :mod:`sandbox.objectives`), one sampled arm ``a`` with
advantage ``A`` contributes ``coef(r_a, A) * grad_z log pi(a) = coef(r_a, A) (e_a - pi)``, with
``r_a = pi(a) / pi_old(a)``. Its expectation over the arm, the reward and the objective's own
randomness is

    dJ/dz = sum_a pi_old(a) E[coef(r_a, A) | a] (e_a - pi)                       [K]

where ``E[coef | r, A]`` is the objective's own :meth:`~sandbox.objectives.Objective.expected_coef`
(no clip rule is re-implemented here) and the remaining expectation over the reward, and hence the
advantage, is a finite sum:

=============  ===================================================================================
advantage      A of one sample with arm a and reward R
=============  ===================================================================================
population     ``R - mu``,  ``mu = E_{a~pi_old}[R]``
std            ``(R - mu) / (sigma + eps)``,  ``sigma^2 = Var_{a~pi_old, R}[R]`` (arm and noise)
grpo           ``(R - k/G) / (s_k + eps)``, k = successes in the group of G (the sample included),
               ``s_k = sqrt(k (G - k) / (G (G - 1)))`` (Bessel, as TRL and verl); 0 if k in {0, G}
dr_grpo        ``R - k/G``                                        (Dr. GRPO, no std)
rloo           ``G/(G-1) (R - k/G)``                              (leave-one-out baseline)
=============  ===================================================================================

The group options need binary rewards. Given the member's own reward R, the other G - 1 members'
rewards are i.i.d. Bernoulli(p_bar) with ``p_bar = sum_a pi_old(a) p_a`` (their arms integrated
out), so ``k = R + J`` with ``J ~ Binomial(G - 1, p_bar)`` and the expectation is a sum over J
(docs/objectives.md §10.4; no Monte Carlo). By exchangeability of the G members, this
single-member expectation is also the expectation of the per-group estimator
``(1/G) sum_i coef_i (e_{a_i} - pi)`` (and of a token-mean over many groups). Groups with zero
variance (k = 0 or G) contribute nothing.

Rewards (argument ``rewards [..., K]``):

* default: deterministic, ``R = rewards[a]``;
* ``binary=True``: ``rewards[a] = p_a = P(R = 1 | a)`` and R in {0, 1} (Bernoulli; pass
  ``BanditModel.success_probs``);
* ``noise_std=s``: Gaussian ``R ~ N(rewards[a], s^2)`` (population and std advantages). The
  expectation is exact because every token-level objective here has ``coef(r, c A) = c coef(r, A)``
  for c > 0 (``coef = g(r, sign A) A``): ``E[coef | a] = coef(r, +1) E[D^+] + coef(r, -1) E[D^-]``
  with ``D = (R - mu) / scale``, a normal whose positive and negative parts have closed-form means.
  The homogeneity is checked at the ratios in use (a clear error otherwise).

Leading batch dimensions ``[..., K]`` are supported throughout (several policies, or prompts:
each row has its own mu, sigma and p_bar); everything is computed in float64 on the device of
``logits``, with no Python loop over arms.

Deviations: the ratio is the objectives' own ``exp(clamp(log pi - log pi_old, ±20))``
(:func:`sandbox.objectives.log_ratio`) and, exactly as :class:`~sandbox.objectives.RatioObjective`
does for token-level objectives whose loss goes through the ratio (``obj.clamp_passes``), arms with ``|log r| > 20`` get
coefficient 0 (``expected_coef`` itself does not apply that cut).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from sandbox.objectives import Objective, dead_zone, log_ratio

from .softmax import log_softmax

__all__ = [
    "ADVANTAGE_OPTIONS",
    "GROUP_ADVANTAGES",
    "NSRGradientVariance",
    "bandit_gradient",
    "contextual_bandit_gradient",
    "expected_clip_fractions",
    "group_advantage_table",
    "nsr_gradient_variance",
]

F64 = torch.float64

#: Advantage options of :func:`bandit_gradient`.
ADVANTAGE_OPTIONS: tuple[str, ...] = ("population", "std", "grpo", "dr_grpo", "rloo")
#: The finite-group options (binary rewards and ``group_size`` required).
GROUP_ADVANTAGES: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")


# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------


def _as_f64(name: str, x: Any, device: torch.device | None = None) -> Tensor:
    """``x`` as a detached, finite float64 tensor (on ``device``), else a ValueError naming it."""
    if isinstance(x, Tensor):
        t = x.detach()
        if device is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but logits is on {device}")
    else:
        try:
            t = torch.as_tensor(np.array(x, dtype=np.float64), device=device)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} must be a tensor or an array of numbers, got {x!r}") from exc
    t = t.to(F64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    return t


def _check_objective(obj: Any) -> None:
    if not isinstance(obj, Objective):
        raise ValueError(
            f"obj must be an objective with an expected_coef method (a sandbox.objectives "
            f"Objective, e.g. get_objective(name)), got {type(obj).__name__}"
        )


def _check_advantage(advantage: str, group_size: int | None, eps: float) -> None:
    if advantage not in ADVANTAGE_OPTIONS:
        raise ValueError(f"advantage must be one of {list(ADVANTAGE_OPTIONS)}, got {advantage!r}")
    if advantage in GROUP_ADVANTAGES:
        if (
            isinstance(group_size, bool)
            or not isinstance(group_size, int | np.integer)
            or group_size < 2
        ):
            raise ValueError(
                f"group_size must be an integer >= 2 for advantage={advantage!r}, got {group_size!r}"
            )
    elif group_size is not None:
        raise ValueError(
            f"group_size applies to the group advantages {list(GROUP_ADVANTAGES)} only; "
            f"got group_size={group_size!r} with advantage={advantage!r}"
        )
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0.0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")


class _Inputs(NamedTuple):
    logits: Tensor  # [..., K]
    old_logits: Tensor  # [..., K]
    rewards: Tensor  # [..., K] (broadcast)
    noise_std: Tensor | None  # [..., K] (broadcast), all > 0; None when deterministic or binary


def _prepare(
    logits: Any,
    old_logits: Any,
    rewards: Any,
    binary: bool,
    noise_std: float | Tensor | None,
    advantage: str,
    group_size: int | None,
    eps: float,
) -> _Inputs:
    _check_advantage(advantage, group_size, eps)
    if not isinstance(binary, bool):
        raise ValueError(f"binary must be True or False, got {binary!r}")
    device = logits.device if isinstance(logits, Tensor) else None
    z = _as_f64("logits", logits, device)
    if z.dim() < 1 or z.shape[-1] < 1:
        raise ValueError(f"logits must have shape [..., K] with K >= 1, got {tuple(z.shape)}")
    z_old = _as_f64("old_logits", old_logits, z.device)
    if z_old.shape != z.shape:
        raise ValueError(
            f"old_logits must have the shape of logits {tuple(z.shape)}, got {tuple(z_old.shape)}"
        )
    rew = _as_f64("rewards", rewards, z.device)
    if rew.dim() < 1 or rew.shape[-1] != z.shape[-1] or _broadcast(rew.shape, z.shape) != z.shape:
        raise ValueError(
            f"rewards must have shape [..., K] broadcastable to logits {tuple(z.shape)}, "
            f"got {tuple(rew.shape)}"
        )
    rew = rew.expand(z.shape)
    if binary and bool(((rew < 0) | (rew > 1)).any()):
        raise ValueError("rewards must be success probabilities in [0, 1] when binary=True")
    if advantage in GROUP_ADVANTAGES and not binary:
        if bool(((rew != 0) & (rew != 1)).any()):
            raise ValueError(
                f"advantage={advantage!r} needs binary rewards: pass success probabilities with "
                "binary=True (deterministic rewards must be 0 or 1)"
            )
        binary = True  # deterministic 0/1 rewards are Bernoulli with p in {0, 1}
    noise = None
    if noise_std is not None:
        if binary:
            raise ValueError("noise_std applies to real-valued rewards; binary rewards have none")
        noise = _as_f64("noise_std", noise_std, z.device)
        if _broadcast(noise.shape, z.shape) != z.shape:
            raise ValueError(
                f"noise_std must be a number or broadcastable to logits {tuple(z.shape)}, "
                f"got shape {tuple(noise.shape)}"
            )
        if bool((noise < 0).any()):
            raise ValueError("noise_std must be >= 0")
        if bool((noise == 0).all()):
            noise = None
        elif bool((noise == 0).any()):
            raise ValueError("noise_std must be all zero (deterministic) or all positive")
        else:
            noise = noise.expand(z.shape)
    return _Inputs(z, z_old, rew, noise)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(torch.Size(a), torch.Size(b)))
    except RuntimeError:
        return None


# --------------------------------------------------------------------------------------------------
# The outcome table: advantages of each arm's reward outcomes and their weights
# --------------------------------------------------------------------------------------------------


class _Outcomes(NamedTuple):
    """Per arm, M outcome classes with ``E[coef | a] = sum_m weight[..., a, m] coef(r_a, adv[m])``.

    ``prob`` is P(class m | a). For discrete rewards ``weight == prob``; for Gaussian rewards the
    classes are the two signs of A (``adv = ±1``) and ``weight`` carries E[|A|; sign].
    """

    adv: Tensor  # broadcastable to [..., K, M]
    weight: Tensor  # [..., K, M]
    prob: Tensor  # [..., K, M]
    discrete: bool


def _binomial_pmf(n: int, p: Tensor) -> Tensor:
    """``P(J = j)``, ``J ~ Binomial(n, p)``, j = 0..n: ``p [...]`` -> ``[..., n + 1]`` (exact at
    p = 0 and 1, where ``0^0 = 1``)."""
    j = torch.arange(n + 1, dtype=F64, device=p.device)
    comb = torch.tensor([math.comb(n, i) for i in range(n + 1)], dtype=F64, device=p.device)
    p = p[..., None]
    return comb * p.pow(j) * (1.0 - p).pow(n - j)


def group_advantage_table(
    advantage: str, group_size: int, eps: float = 1e-6, device: torch.device | None = None
) -> Tensor:
    """Group advantage of a member with reward R in {0, 1} when the other G - 1 have J successes.

    ``k = R + J``, ``m = k / G``; ``grpo``: ``(R - m) / (s_k + eps)`` with
    ``s_k = sqrt(k (G - k) / (G (G - 1)))`` and 0 when ``s_k = 0``; ``dr_grpo``: ``R - m``;
    ``rloo``: ``G / (G - 1) (R - m)`` (the values of :func:`sandbox.advantages.compute_advantages`).

    Returns:
        ``[2, G]``: row R, column J = 0..G-1.
    """
    _check_advantage(advantage, group_size, eps)
    if advantage not in GROUP_ADVANTAGES:
        raise ValueError(f"advantage must be one of {list(GROUP_ADVANTAGES)}, got {advantage!r}")
    g = group_size
    r = torch.tensor([[0.0], [1.0]], dtype=F64, device=device)  # [2, 1]
    k = r + torch.arange(g, dtype=F64, device=device)  # [2, G]
    centred = r - k / g
    if advantage == "dr_grpo":
        return centred
    if advantage == "rloo":
        return centred * (g / (g - 1))
    std = torch.sqrt(k * (g - k) / (g * (g - 1)))
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def _normal_parts(d: Tensor, s: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For ``D ~ N(d, s^2)``: ``(P(D > 0), E[max(D, 0)], E[max(-D, 0)])``."""
    x = d / s
    cdf = torch.special.ndtr(x)
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return cdf, d * cdf + s * pdf, s * pdf - d * (1.0 - cdf)


def _outcomes(
    inp: _Inputs,
    pi_old: Tensor,
    binary: bool,
    advantage: str,
    group_size: int | None,
    eps: float,
) -> _Outcomes:
    rew = inp.rewards
    if advantage in GROUP_ADVANTAGES:
        assert group_size is not None
        table = group_advantage_table(advantage, group_size, eps, rew.device)  # [2, G]
        p_bar = (pi_old * rew).sum(-1)  # [...]
        pmf = _binomial_pmf(group_size - 1, p_bar)  # [..., G]
        p_r = torch.stack([1.0 - rew, rew], dim=-1)  # [..., K, 2]
        prob = p_r[..., :, :, None] * pmf[..., None, None, :]  # [..., K, 2, G]
        prob = prob.flatten(-2)
        return _Outcomes(table.flatten(), prob, prob, True)
    if inp.noise_std is not None:  # Gaussian rewards: two sign classes
        mu = (pi_old * rew).sum(-1, keepdim=True)
        var = (pi_old * ((rew - mu) ** 2 + inp.noise_std**2)).sum(-1, keepdim=True)
        scale = torch.sqrt(var) + eps if advantage == "std" else torch.ones_like(mu)
        p_pos, e_pos, e_neg = _normal_parts(rew - mu, inp.noise_std)
        adv = torch.tensor([1.0, -1.0], dtype=F64, device=rew.device)
        weight = torch.stack([e_pos, e_neg], dim=-1) / scale[..., None]
        prob = torch.stack([p_pos, 1.0 - p_pos], dim=-1)
        return _Outcomes(adv, weight, prob, False)
    if binary:
        values = torch.tensor([0.0, 1.0], dtype=F64, device=rew.device)
        prob = torch.stack([1.0 - rew, rew], dim=-1)  # [..., K, 2]
    else:
        values = rew[..., None]
        prob = torch.ones_like(values)
    mu = (pi_old[..., None] * prob * values).sum((-1, -2), keepdim=True)
    adv = values - mu
    if advantage == "std":
        sigma = torch.sqrt((pi_old[..., None] * prob * adv**2).sum((-1, -2), keepdim=True))
        adv = adv / (sigma + eps)
    return _Outcomes(adv, prob, prob, True)


# --------------------------------------------------------------------------------------------------
# Expected coefficients
# --------------------------------------------------------------------------------------------------


class _Terms(NamedTuple):
    pi: Tensor  # [..., K]
    pi_old: Tensor  # [..., K]
    ratio: Tensor  # [..., K]
    passes: Tensor  # [..., K] 1 where the ±20 clamp lets the gradient through
    coef: Tensor  # [..., K] E[coef | a] (including the clamp's cut)
    outcomes: _Outcomes


def _expected_coef(obj: Objective, ratio: Tensor, adv: Tensor) -> Tensor:
    try:
        return obj.expected_coef(ratio, adv)
    except NotImplementedError as exc:
        name = getattr(obj, "name", type(obj).__name__)
        raise ValueError(
            f"objective {name!r} has no closed-form expected_coef ({exc}); the exact gradient "
            "needs E[coef | r, A], which rules that depend on batch statistics (clip_cov, kl_cov) "
            "do not have"
        ) from exc


def _ratio(obj: Objective, logp: Tensor, logp_old: Tensor) -> tuple[Tensor, Tensor]:
    """The ratio the objective acts on and where its ±20 log-ratio clamp passes the gradient
    (as in ``RatioObjective.compute``: token-level objectives whose loss goes through r)."""
    raw = logp - logp_old
    lr = log_ratio(logp, logp_old)
    passes = obj.clamp_passes(raw)
    return lr.exp(), passes.to(lr.dtype)


def _expected_terms(
    obj: Objective,
    inp: _Inputs,
    binary: bool,
    advantage: str,
    group_size: int | None,
    eps: float,
) -> _Terms:
    logp = log_softmax(inp.logits)
    logp_old = log_softmax(inp.old_logits)
    pi, pi_old = logp.exp(), logp_old.exp()
    binary = binary or advantage in GROUP_ADVANTAGES
    out = _outcomes(inp, pi_old, binary, advantage, group_size, eps)
    ratio, passes = _ratio(obj, logp, logp_old)
    ec = _expected_coef(obj, ratio[..., None], out.adv)  # [..., K, M]
    if not out.discrete:  # Gaussian: E[coef] splits by sign only if coef is homogeneous in |A|
        ec2 = _expected_coef(obj, ratio[..., None], 2.0 * out.adv)
        if not torch.allclose(ec2, 2.0 * ec, rtol=1e-9, atol=1e-300):
            name = getattr(obj, "name", type(obj).__name__)
            raise ValueError(
                f"objective {name!r} has a coefficient that is not proportional to |A| within "
                "each sign of A; Gaussian rewards (noise_std) need coef(r, c A) = c coef(r, A)"
            )
    coef = (out.weight * ec).sum(-1) * passes
    return _Terms(pi, pi_old, ratio, passes, coef, out)


def _gradient(terms: _Terms) -> Tensor:
    """``sum_a pi_old(a) c_a (e_a - pi) = w - pi sum_a w_a`` with ``w = pi_old * c``."""
    w = terms.pi_old * terms.coef
    return w - terms.pi * w.sum(-1, keepdim=True)


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------


def bandit_gradient(
    obj: Objective,
    logits: Tensor,
    old_logits: Tensor,
    rewards: Tensor,
    *,
    binary: bool = False,
    noise_std: float | Tensor | None = None,
    advantage: str = "population",
    group_size: int | None = None,
    eps: float = 1e-6,
) -> Tensor:
    r"""Exact expected ascent direction dJ/dz of an objective on a softmax bandit
    (docs/objectives.md §10.3–10.4).

    ``dJ/dz = sum_a pi_old(a) E[coef(r_a, A) | a] (e_a - pi)``, ``pi = softmax(logits)``,
    ``pi_old = softmax(old_logits)``, ``r_a = pi(a) / pi_old(a)``, ``E[coef | r, A]`` from
    ``obj.expected_coef`` and the expectation over the reward (and, for the group advantages, over
    the other G - 1 members' successes ``J ~ Binomial(G - 1, p_bar)``) summed exactly. It is the
    expectation of the sampled gradient ``-d loss / dz`` of one sample drawn from ``pi_old`` (and
    of a token-mean over many); on-policy (``logits == old_logits``) every objective reduces to
    REINFORCE, ``sum_a pi(a) E[A | a] (e_a - pi)``. See the module docstring for the advantages.

    Example (K = 2, by hand): pi = pi_old = (0.5, 0.5), rewards (1, 0), population advantage:
    mu = 0.5, A = (0.5, -0.5), dJ/dz = 0.5·0.5·(0.5, -0.5) + 0.5·(-0.5)·(-0.5, 0.5) = (0.25, -0.25).

    Args:
        obj: an objective with ``expected_coef`` (every token-level one; not clip_cov/kl_cov).
            Sequence-level objectives (gspo, gmpo, vespo, nsr at level "sequence") act on the
            one-token sequence ratio, which equals the token ratio.
        logits: ``[..., K]`` logits z of the policy being optimised.
        old_logits: ``[..., K]`` logits of the sampling policy (same shape).
        rewards: ``[..., K]`` (broadcastable to ``logits``): per-arm deterministic reward, or the
            success probabilities ``P(R = 1 | a)`` with ``binary=True``, or Gaussian means with
            ``noise_std``.
        binary: rewards are Bernoulli(``rewards[a]``) in {0, 1}.
        noise_std: Gaussian reward noise (number or broadcastable tensor, all > 0).
        advantage: one of :data:`ADVANTAGE_OPTIONS` (``"population"``, ``"std"``, ``"grpo"``,
            ``"dr_grpo"``, ``"rloo"``); statistics per leading index (each row its own).
        group_size: G >= 2 for the group advantages (required there, rejected elsewhere).
        eps: the std regulariser of ``"std"`` and ``"grpo"`` (default 1e-6, as TRL/verl).

    Returns:
        ``[..., K]`` float64 on the device of ``logits``.
    """
    _check_objective(obj)
    inp = _prepare(logits, old_logits, rewards, binary, noise_std, advantage, group_size, eps)
    return _gradient(_expected_terms(obj, inp, binary, advantage, group_size, eps))


def contextual_bandit_gradient(
    obj: Objective,
    logits: Tensor,
    old_logits: Tensor,
    success_probs: Tensor,
    prompt_probs: Tensor,
    *,
    advantage: str = "population",
    group_size: int | None = None,
    eps: float = 1e-6,
) -> Tensor:
    r"""Exact gradient of the prompt-averaged objective w.r.t. each prompt's logits.

    ``J = sum_p rho_p J_p(z_p)``, so ``dJ/dz_p = rho_p * bandit_gradient(z_p, z_old_p, p_p)``,
    each prompt with its own group statistics (mu_p, sigma_p, p_bar_p): the exact expectation of
    a trainer that draws prompts from ``rho`` and a group of samples per prompt.

    Args:
        obj: an objective with ``expected_coef``.
        logits: ``[..., P, K]`` per-prompt logits.
        old_logits: ``[..., P, K]`` per-prompt logits of the sampling policy.
        success_probs: ``[P, K]`` (broadcastable): P(R = 1 | prompt, arm); rewards are binary.
        prompt_probs: ``[P]`` prompt weights rho (>= 0; ``ContextualBanditModel.prompt_probs``).
        advantage, group_size, eps: as in :func:`bandit_gradient`.

    Returns:
        ``[..., P, K]`` float64.
    """
    _check_objective(obj)
    inp = _prepare(logits, old_logits, success_probs, True, None, advantage, group_size, eps)
    if inp.logits.dim() < 2:
        raise ValueError(f"logits must have shape [..., P, K], got {tuple(inp.logits.shape)}")
    rho = _check_prompt_probs(prompt_probs, inp.logits)
    grad = _gradient(_expected_terms(obj, inp, True, advantage, group_size, eps))
    return grad * rho[:, None]


def _check_prompt_probs(prompt_probs: Any, logits: Tensor) -> Tensor:
    rho = _as_f64("prompt_probs", prompt_probs, logits.device)
    num_prompts = logits.shape[-2]
    if rho.shape != (num_prompts,):
        raise ValueError(
            f"prompt_probs must have shape [P] = ({num_prompts},) to match logits "
            f"{tuple(logits.shape)}, got {tuple(rho.shape)}"
        )
    if bool((rho < 0).any()):
        raise ValueError("prompt_probs must be >= 0")
    return rho


def expected_clip_fractions(
    obj: Objective,
    logits: Tensor,
    old_logits: Tensor,
    rewards: Tensor,
    *,
    binary: bool = False,
    noise_std: float | Tensor | None = None,
    advantage: str = "population",
    group_size: int | None = None,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Expected dead-zone shares ``(clip_low_frac, clip_high_frac)`` of sampled tokens.

    ``E[clip_low_frac] = sum_a pi_old(a) P(A < 0 | a) 1[r_a < l]`` and
    ``E[clip_high_frac] = sum_a pi_old(a) P(A > 0 | a) 1[r_a > u]`` with ``(l, u) = obj.bounds()``
    (docs/objectives.md §1; the metrics the objectives report, in expectation). Identically 0
    on-policy.
    Arguments as :func:`bandit_gradient`; raises ``ValueError`` if ``obj`` has no ``bounds()``.

    Returns:
        two ``[...]`` tensors.
    """
    _check_objective(obj)
    inp = _prepare(logits, old_logits, rewards, binary, noise_std, advantage, group_size, eps)
    terms = _expected_terms(obj, inp, binary, advantage, group_size, eps)
    shares = _dead_zone_shares(obj, terms)
    if shares is None:
        raise ValueError(f"objective {getattr(obj, 'name', obj)!r} has no bounds() (no dead zone)")
    return shares


def _dead_zone_shares(obj: Objective, terms: _Terms) -> tuple[Tensor, Tensor] | None:
    bounds_fn = getattr(obj, "bounds", None)
    bounds = bounds_fn() if callable(bounds_fn) else None
    if bounds is None:
        return None
    out = terms.outcomes
    adv = torch.broadcast_to(out.adv, out.prob.shape)
    z_lo, z_hi = dead_zone(terms.ratio[..., None].expand_as(adv), adv, *bounds)
    weight = terms.pi_old[..., None] * out.prob
    return (weight * z_lo).sum((-1, -2)), (weight * z_hi).sum((-1, -2))


class NSRGradientVariance(NamedTuple):
    """Exact moments of the single-sample gradient ``x = coef (e_a - pi)`` (all ``[..., K]``)."""

    mean: Tensor  # E[x], the same for both arms
    var_stochastic: Tensor  # Var[x_b] under NSR (keep ~ Bernoulli(q))
    var_decay: Tensor  # Var[x_b] under NSR-decay (weight q, deterministic)


def nsr_gradient_variance(
    obj_stochastic: Objective,
    obj_decay: Objective,
    logits: Tensor,
    old_logits: Tensor,
    rewards: Tensor,
    *,
    binary: bool = False,
    advantage: str = "population",
    group_size: int | None = None,
    eps: float = 1e-6,
) -> NSRGradientVariance:
    r"""Exact per-component variance of one sample's gradient under NSR and under NSR-decay.

    One sample: arm ``a ~ pi_old``, reward R (and the group's other successes J for the group
    advantages), gradient ``x = coef (e_a - pi)``. With ``c = E[coef | r, A]`` (equal for both
    arms, docs/objectives.md §10.5) and ``(δ_ab - pi_b)^2 = δ_ab (1 - 2 pi_b) + pi_b^2``::

        E[x_b]   = pi_old(b) c_b - pi_b sum_a pi_old(a) c_a
        E[x_b^2] = pi_old(b) M_b (1 - 2 pi_b) + pi_b^2 sum_a pi_old(a) M_a,  M_a = E[coef^2 | a]

    NSR's coefficient is ``A r keep`` with ``keep ~ Bernoulli(q)`` (keep = 1 off the dead zone), so
    ``E[coef^2 | r, A] = A r E[coef | r, A]`` (= (A r)^2 q); NSR-decay's is deterministic,
    ``E[coef^2 | r, A] = E[coef | r, A]^2`` (= (A r q)^2). The difference of the two variances is
    the rescue's Bernoulli variance, ``sum over outcomes of pi_old (A r)^2 q (1 - q) (δ_ab - pi_b)^2``.

    Args:
        obj_stochastic: the stochastic rule (``nsr``); its coefficient must be 0 or ``A r``.
        obj_decay: the deterministic rule with the same ``expected_coef`` (``nsr_decay``).
        logits, old_logits, rewards, binary, advantage, group_size, eps: as in
            :func:`bandit_gradient` (discrete rewards; no ``noise_std``).

    Returns:
        :class:`NSRGradientVariance` of ``[..., K]`` tensors.
    """
    _check_objective(obj_stochastic)
    _check_objective(obj_decay)
    inp = _prepare(logits, old_logits, rewards, binary, None, advantage, group_size, eps)
    terms = _expected_terms(obj_stochastic, inp, binary, advantage, group_size, eps)
    decay = _expected_terms(obj_decay, inp, binary, advantage, group_size, eps)
    if not torch.allclose(terms.coef, decay.coef, rtol=1e-12, atol=1e-15):
        raise ValueError("obj_decay must have the same expected_coef as obj_stochastic")
    out = terms.outcomes
    r = terms.ratio[..., None]
    ec = _expected_coef(obj_stochastic, r, out.adv) * terms.passes[..., None]  # [..., K, M]
    full = out.adv * r * terms.passes[..., None]  # the coefficient when kept
    kept = torch.where(full != 0, ec / torch.where(full != 0, full, 1.0), 1.0)
    if bool(((kept < -1e-12) | (kept > 1 + 1e-12)).any()):
        raise ValueError(
            "obj_stochastic's expected coefficient is not A r P(keep) with P in [0, 1]"
        )
    m2_stochastic = (out.prob * full * ec).sum(-1)
    m2_decay = (out.prob * ec**2).sum(-1)
    mean = _gradient(terms)

    def variance(m2: Tensor) -> Tensor:
        pi, pi_old = terms.pi, terms.pi_old
        second = pi_old * m2 * (1.0 - 2.0 * pi) + pi**2 * (pi_old * m2).sum(-1, keepdim=True)
        return (second - mean**2).clamp(min=0.0)

    return NSRGradientVariance(mean, variance(m2_stochastic), variance(m2_decay))
