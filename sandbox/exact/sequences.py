r"""Exact expected gradients of clipped objectives over enumerable token sequences
(docs/objectives.md §10.3-10.4).

Setting: an enumerable task (:class:`envs.reasoning.BitsTask`: prompts ``p`` and, for a maximum
completion length ``T = max_len``, every complete sequence ``y`` over the completion tokens
``{<eos>, '0', '1'}``: k bits then ``<eos>`` for k < T, or T bits ended by the length limit), a
policy ``pi_theta(y_t | p, y_<t)`` that gives every other token probability 0, and data sampled
from ``pi_old``. One sampled completion contributes, through the objective's contract
(``coef_t = -dloss_t/dlogp_t``) and an aggregation, ``norm(y) sum_t coef_t grad logp_t``. Its
expectation over the prompt, the completion, the reward (and the rest of its group) and the
objective's own randomness is the *exact expected gradient* (ascent direction)

    g = sum_p w_p sum_y pi_old(y|p) norm(y) sum_{t<|y|} E[coef_t | p, y] grad log pi(y_t | p, y_<t)

computed here as the autograd gradient of the surrogate (stop-gradient ``sg`` on the weights)

    S(theta) = sum_p w_p sum_y pi_old(y|p) norm(y) sum_t sg(E[coef_t | p, y]) log pi(y_t | p, y_<t)

with ``w_p = 1 / P`` over the prompts (all of the task's, or the ``prompt_ids`` given), and
``pi_old(y | p) = exp(sum_t log pi_old(y_t | p, y_<t))``. ``E[coef_t | p, y]`` comes from the
objective's own closed form :meth:`~sandbox.objectives.Objective.expected_coef` (no clip rule is
re-implemented here), evaluated at

* token-level rules: the token ratio ``r_t = exp(clamp(log pi - log pi_old, ±20))``, times
  ``obj.clamp_passes(raw log-ratio)`` (the ±20 clamp cuts the gradient where it binds, exactly as
  :class:`~sandbox.objectives.RatioObjective` does);
* sequence-level rules (``obj.level == "sequence"``: gspo, gmpo, vespo, nsr / nsr_decay with
  ``level="sequence"``): a stochastic rule's closed form at the sequence ratio
  :meth:`~sandbox.objectives.Objective.sequence_ratio` (GSPO's ``s = exp(clamp(mean_t log r_t,
  ±20))``), the same coefficient for every token of the sequence (the GSPO-token form of the
  objective contract); a deterministic rule has no randomness to average, and its coefficient
  is the one the objective itself realises on the enumerated sequence, called once per value of
  the advantage (this covers gmpo, whose per-token clip makes the coefficient depend on more
  than the sequence ratio).

Advantages (``advantage``), per prompt, under ``pi_old``; ``R(p, y)`` the task's reward:

=============  ==================================================================================
population     ``A = R - mu_p``, ``mu_p = E_{y ~ pi_old(.|p)}[R]``
std            ``A = (R - mu_p) / (sigma_p + eps)``, ``sigma_p^2 = Var_{pi_old(.|p)}[R]``
grpo           binary rewards, group of G completions of the same prompt: ``A = (R - k/G) /
               (s_k + eps)`` with ``k = R + J`` successes (the sample included), the other G - 1
               members' successes ``J ~ Binomial(G - 1, mu_p)``, ``s_k`` the Bessel std; groups
               with zero variance (k = 0 or G) contribute nothing. The expectation is the exact
               sum over J (:func:`~sandbox.exact.group_advantage_table`), taken *outside*
               ``expected_coef`` (the coefficient is not linear in A).
dr_grpo, rloo  the same sum with ``R - k/G`` and ``G/(G-1) (R - k/G)``
=============  ==================================================================================

Group-size semantics: a trainer draws prompts, G completions per prompt, computes the group
advantages and aggregates all rows. By exchangeability of the G members, the expectation of the
batch gradient equals the single-member expectation above, for any number of groups; G enters only
through the law of the advantage.

Aggregation (``aggregation``, :func:`sandbox.aggregate.aggregate`'s names) sets ``norm(y)``:

=========================== ======================================================================
seq-mean-token-mean         ``1 / |y|``. The batch gradient ``1/N sum_i 1/|y_i| sum_t coef ∇logp``
                            is a mean of i.i.d. terms (per group, exchangeable), so its expectation
                            is exact at every batch size.
seq-mean-token-sum          ``1``; exact at every batch size, likewise.
seq-mean-token-sum-norm     ``1 / L`` with ``L = max_len`` (:func:`~sandbox.aggregate.aggregate`'s
                            default L is the batch width, which is ``max_len`` for full-length
                            batches); exact at every batch size.
token-mean                  ``1 / E[|y|]``, ``E[|y|] = sum_p w_p sum_y pi_old(y | p) |y|`` (over
                            prompts too: the batch's global token count). The batch gradient
                            ``(1/N sum_i sum_t coef ∇logp) / (1/N sum_i |y_i|)`` is a ratio of
                            means: its expectation at batch size N differs from the ratio of
                            expectations by O(1/N) (ratio-estimator bias), and it converges almost
                            surely to ``E[sum_t coef ∇logp] / E[|y|]`` as N grows. This is the
                            *large-batch limit*, the gradient that token-mean trainers follow when
                            batches are large; it is what is returned.
=========================== ======================================================================

Policies: anything with ``completion_logp(prompt [B, Tp], prompt_mask [B, Tp], completion [B, T],
completion_mask [B, T]) -> (logp [B, T], entropy [B, T])`` (0 on padding) and ``parameters()``:
:class:`~sandbox.policies.TabularSequencePolicy` (a softmax per (prompt, completion-prefix) node)
and :class:`~sandbox.policies.MaskedTransformerPolicy` (a tiny transformer restricted to the
completion tokens), defined in :mod:`sandbox.policies` and re-exported here. Completions are scored in chunks of ``chunk_size`` rows (the outcome space
has ``P (2^(T+1) - 1)`` sequences), twice: once without graph for the weights, once with it for
the gradient.

Example (bits copy, length 1, T = 2, prompt "1", uniform policy, on-policy, population advantage,
seq-mean-token-mean) is worked out by hand in ``tests/test_exact_sequences.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from sandbox.aggregate import AGGREGATION_MODES
from sandbox.objectives import LOG_RATIO_CLAMP, Objective
from sandbox.policies import MaskedTransformerPolicy, TabularSequencePolicy
from sandbox.policies.sequences import check_enumerable_task, check_int

from .bandit import (
    GROUP_ADVANTAGES,
    _binomial_pmf,
    _check_advantage,
    _check_objective,
    _expected_coef,
    group_advantage_table,
)

__all__ = [
    "MAX_SEQUENCE_PAIRS",
    "MaskedTransformerPolicy",
    "SequencePolicy",
    "SequenceSpace",
    "SequenceTerms",
    "TabularSequencePolicy",
    "enumerate_sequences",
    "sequence_gradient",
    "sequence_log_probs",
    "sequence_terms",
    "surrogate_gradient",
]

F64 = torch.float64
#: Largest number of (prompt, completion) pairs :func:`enumerate_sequences` builds (a ``[N, T]``
#: float64 table of 2^22 rows and T = 16 is 512 MiB).
MAX_SEQUENCE_PAIRS = 2**22
DEFAULT_CHUNK = 8192


class SequencePolicy(Protocol):
    """What :func:`sequence_gradient` needs from a policy."""

    def completion_logp(
        self, prompt: Tensor, prompt_mask: Tensor, completion: Tensor, completion_mask: Tensor
    ) -> tuple[Tensor, Tensor]: ...

    def parameters(self) -> Iterable[Tensor]: ...


# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------


def _check_max_len(task: Any, max_len: Any) -> int:
    max_len = check_int("max_len", max_len, 1)
    limit = getattr(task, "answer_len", None)
    if limit is not None and max_len < limit:
        raise ValueError(
            f"max_len must be >= the task's answer length {limit} (else no completion is correct "
            f"and every advantage is 0), got {max_len}"
        )
    return max_len


def _check_policy(name: str, policy: Any) -> None:
    if not callable(getattr(policy, "completion_logp", None)) or not callable(
        getattr(policy, "parameters", None)
    ):
        raise ValueError(
            f"{name} must have completion_logp(prompt, prompt_mask, completion, completion_mask) "
            f"and parameters() (TabularSequencePolicy, MaskedTransformerPolicy), "
            f"got {type(policy).__name__}"
        )


def _device(policy: Any) -> torch.device:
    for p in policy.parameters():
        return p.device
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------------
# The outcome space
# --------------------------------------------------------------------------------------------------


class SequenceSpace(NamedTuple):
    """Every (prompt, completion) pair, prompt-major: row ``n = p * M + m`` (M completions each)."""

    prompts: Tensor  # [P, Tp] long, the prompts (weights 1/P each)
    prompt_index: Tensor  # [N] long, row of ``prompts``
    completion: Tensor  # [N, T] long, padded with <pad> after <eos>
    mask: Tensor  # [N, T] bool, True on the completion's tokens (<eos> included)
    lengths: Tensor  # [N] long, |y| (<eos> included)
    reward: Tensor  # [N] float64, R(p, y)


def enumerate_sequences(
    task: Any,
    max_len: int,
    prompt_ids: Any = None,
    device: torch.device | str | None = None,
) -> SequenceSpace:
    """All ``P (2^(T+1) - 1)`` (prompt, completion) pairs of ``task`` with their rewards.

    Args:
        task: an enumerable task (``make_task("bits", ...)``).
        max_len: T, the maximum completion length (1 .. 16, and at least the answer length).
        prompt_ids: ``[P, Tp]`` prompt ids (default: ``task.enumerate_prompts()``, all of them).
        device: where the tensors go (default CPU).

    Returns:
        :class:`SequenceSpace`.
    """
    check_enumerable_task(task)
    max_len = _check_max_len(task, max_len)
    ids, lengths = task.enumerate_completions_array(max_len)  # ValueError naming max_len > 16
    prompts = np.asarray(task.enumerate_prompts() if prompt_ids is None else prompt_ids)
    if prompts.ndim == 1:
        prompts = prompts[None]
    if prompts.ndim != 2 or prompts.shape[0] == 0 or not np.issubdtype(prompts.dtype, np.integer):
        raise ValueError(
            f"prompt_ids must be a non-empty integer array [P, Tp], got shape {prompts.shape}"
        )
    num_prompts, num_completions = prompts.shape[0], ids.shape[0]
    if num_prompts * num_completions > MAX_SEQUENCE_PAIRS:
        raise ValueError(
            f"max_len={max_len} gives {num_prompts} x {num_completions} (prompt, completion) "
            "pairs, "
            f"more than MAX_SEQUENCE_PAIRS={MAX_SEQUENCE_PAIRS}; use a smaller max_len or fewer "
            "prompt_ids"
        )
    prompt_index = np.repeat(np.arange(num_prompts), num_completions)
    completion = np.tile(ids, (num_prompts, 1))
    reward = task.reward_ids_batch(prompts[prompt_index], completion)  # checks the prompt ids
    mask = np.arange(max_len)[None, :] < lengths[:, None]

    def t(x: np.ndarray, dtype: torch.dtype) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype, device=device)

    return SequenceSpace(
        prompts=t(prompts, torch.long),
        prompt_index=t(prompt_index, torch.long),
        completion=t(completion, torch.long),
        mask=t(np.tile(mask, (num_prompts, 1)), torch.bool),
        lengths=t(np.tile(lengths, num_prompts), torch.long),
        reward=t(np.asarray(reward, dtype=np.float64), F64),
    )


def _chunks(n: int, chunk_size: int) -> Iterable[slice]:
    for start in range(0, n, chunk_size):
        yield slice(start, min(start + chunk_size, n))


def _score(policy: Any, space: SequenceSpace, rows: slice) -> Tensor:
    """``log pi(y_t | p, y_<t)`` ``[n, T]`` of the rows (0 on padding; graph if grad is enabled)."""
    prompt = space.prompts[space.prompt_index[rows]]
    logp, _ = policy.completion_logp(
        prompt, torch.ones_like(prompt, dtype=torch.bool), space.completion[rows], space.mask[rows]
    )
    shape = tuple(space.completion[rows].shape)
    if tuple(logp.shape) != shape:
        raise ValueError(
            f"policy.completion_logp must return logp of shape {shape}, got {tuple(logp.shape)}"
        )
    return torch.where(
        space.mask[rows], logp, torch.zeros((), dtype=logp.dtype, device=logp.device)
    )


def sequence_log_probs(
    policy: SequencePolicy, space: SequenceSpace, *, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """``log pi(y_t | p, y_<t)`` for every pair of ``space``: ``[N, T]`` float64, detached, 0 on
    padding; ``exp(.sum(-1))`` is ``pi(y | p)``."""
    _check_policy("policy", policy)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    with torch.no_grad():
        parts = [_score(policy, space, rows) for rows in _chunks(len(space.reward), chunk_size)]
    return torch.cat(parts).to(F64)


# --------------------------------------------------------------------------------------------------
# Weights of the surrogate
# --------------------------------------------------------------------------------------------------


class SequenceTerms(NamedTuple):
    """Everything the exact gradient is made of (all detached, float64, 0 on padding)."""

    space: SequenceSpace
    logp: Tensor  # [N, T] log pi_theta
    logp_old: Tensor  # [N, T] log pi_old
    seq_prob_old: Tensor  # [N] pi_old(y | p)
    mean_reward: Tensor  # [P] mu_p = E_old[R | p] (the success probability for binary rewards)
    ratio: Tensor  # [N, T] the ratio the rule acts on (token r_t, or the sequence s broadcast)
    coef: Tensor  # [N, T] E[coef_t | p, y] (advantage law, own randomness, clamp cut included)
    norm: Tensor  # [N] the aggregation's norm(y)
    weight: Tensor  # [N, T] w_p pi_old(y | p) norm(y) E[coef_t | p, y]: S = sum weight * logp


def _advantage_law(
    space: SequenceSpace,
    seq_prob_old: Tensor,
    advantage: str,
    group_size: int | None,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(mu [P], values [N, M], probs [N, M])``: the advantage of row n is ``values[n, m]`` with
    probability ``probs[n, m]`` (M = 1 for population/std, G for the group advantages)."""
    num_prompts = space.prompts.shape[0]
    pidx, reward = space.prompt_index, space.reward

    def per_prompt(x: Tensor) -> Tensor:
        return torch.zeros(num_prompts, dtype=F64, device=x.device).index_add_(0, pidx, x)

    mu = per_prompt(seq_prob_old * reward)
    if advantage in GROUP_ADVANTAGES:
        if bool(((reward != 0) & (reward != 1)).any()):
            raise ValueError(f"advantage={advantage!r} needs binary rewards in {{0, 1}}")
        assert group_size is not None
        table = group_advantage_table(advantage, group_size, eps, reward.device)  # [2, G]
        pmf = _binomial_pmf(group_size - 1, mu.clamp(0.0, 1.0))  # [P, G]
        return mu, table[reward.long()], pmf[pidx]
    centred = reward - mu[pidx]
    if advantage == "std":
        sigma = per_prompt(seq_prob_old * centred**2).sqrt()
        centred = centred / (sigma[pidx] + eps)
    return mu, centred[:, None], torch.ones_like(centred)[:, None]


def _expected_token_coef(
    obj: Objective,
    level: str,
    logp: Tensor,
    logp_old: Tensor,
    mask: Tensor,
    adv_values: Tensor,
    adv_probs: Tensor,
) -> tuple[Tensor, Tensor]:
    """``(ratio [n, T], E[coef] [n, T])`` for rows with log-probs ``logp``, ``logp_old`` (0 on
    padding)."""
    raw = logp - logp_old
    if level == "sequence":
        s = obj.sequence_ratio(raw, mask)  # [n]
        ratio = s[:, None].expand_as(raw)
        if obj.stochastic:  # E over its own draws: the closed form at the sequence ratio
            ec = (adv_probs * _expected_coef(obj, s[:, None], adv_values)).sum(-1)  # [n]
            coef = ec[:, None].expand_as(raw)
        else:  # deterministic: the coefficient realised by the objective itself, per token
            coef = sum(
                adv_probs[:, m, None]
                * obj(logp, logp_old, adv_values[:, m, None], mask, validate=False).coef
                for m in range(adv_values.shape[1])
            )
    else:
        ratio = raw.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [n, T]
        ec = _expected_coef(obj, ratio[..., None], adv_values[:, None, :])  # [n, T, M]
        coef = (adv_probs[:, None, :] * ec).sum(-1)
    keep = mask & obj.clamp_passes(raw)
    return ratio, torch.where(keep, coef.to(F64), 0.0)


def sequence_terms(
    obj: Objective,
    policy: SequencePolicy,
    task: Any,
    *,
    prompt_ids: Any = None,
    old_policy: SequencePolicy | None = None,
    max_len: int,
    advantage: str = "population",
    group_size: int | None = None,
    eps: float = 1e-6,
    aggregation: str = "seq-mean-token-mean",
    chunk_size: int = DEFAULT_CHUNK,
) -> SequenceTerms:
    """The weights of the surrogate ``S = sum_{n,t} weight[n, t] log pi_theta(y_t | p, y_<t)``
    whose gradient is :func:`sequence_gradient` (arguments as there), and their ingredients."""
    _check_objective(obj)
    _check_advantage(advantage, group_size, eps)
    if aggregation not in AGGREGATION_MODES:
        raise ValueError(
            f"aggregation must be one of {list(AGGREGATION_MODES)}, got {aggregation!r}"
        )
    _check_policy("policy", policy)
    if old_policy is not None:
        _check_policy("old_policy", old_policy)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    level = getattr(obj, "level", "token")
    if level not in ("token", "sequence"):
        raise ValueError(f"obj.level must be 'token' or 'sequence', got {level!r}")
    one = torch.ones(1, dtype=F64)
    _expected_coef(obj, one, one)  # a clear ValueError now for clip_cov / kl_cov

    for name, pol in (("policy", policy), ("old_policy", old_policy)):
        horizon = getattr(pol, "max_len", None)
        if isinstance(horizon, int) and isinstance(max_len, int) and max_len > horizon:
            raise ValueError(f"max_len={max_len} exceeds {name}.max_len={horizon}")
    if prompt_ids is None and isinstance(getattr(policy, "prompts", None), Tensor):
        prompt_ids = policy.prompts.cpu().numpy()  # a tabular policy's own prompts
    space = enumerate_sequences(task, max_len, prompt_ids, device=_device(policy))
    logp = sequence_log_probs(policy, space, chunk_size=chunk_size)
    if old_policy is None:
        logp_old = logp
    else:
        logp_old = sequence_log_probs(old_policy, space, chunk_size=chunk_size).to(logp.device)
    seq_prob_old = logp_old.sum(-1).exp()
    _check_mass("old_policy" if old_policy is not None else "policy", space, seq_prob_old)

    num_prompts = space.prompts.shape[0]
    w = torch.full((num_prompts,), 1.0 / num_prompts, dtype=F64, device=logp.device)
    mu, adv_values, adv_probs = _advantage_law(space, seq_prob_old, advantage, group_size, eps)
    lengths = space.lengths.to(F64)
    if aggregation == "seq-mean-token-mean":
        norm = 1.0 / lengths
    elif aggregation == "seq-mean-token-sum":
        norm = torch.ones_like(lengths)
    elif aggregation == "seq-mean-token-sum-norm":
        norm = torch.full_like(lengths, 1.0 / max_len)
    else:  # token-mean, large-batch limit: 1 / E_old[|y|] over prompts and completions
        mean_len = (w[space.prompt_index] * seq_prob_old * lengths).sum()
        norm = torch.full_like(lengths, 1.0 / float(mean_len))

    ratios, coefs = [], []
    for rows in _chunks(len(space.reward), chunk_size):
        r, c = _expected_token_coef(
            obj,
            level,
            logp[rows],
            logp_old[rows],
            space.mask[rows],
            adv_values[rows],
            adv_probs[rows],
        )
        ratios.append(r)
        coefs.append(c)
    ratio, coef = torch.cat(ratios), torch.cat(coefs)
    weight = (w[space.prompt_index] * seq_prob_old * norm)[:, None] * coef
    return SequenceTerms(space, logp, logp_old, seq_prob_old, mu, ratio, coef, norm, weight)


def _check_mass(name: str, space: SequenceSpace, seq_prob: Tensor) -> None:
    """Each prompt's enumerated sequences must carry all of its probability."""
    mass = torch.zeros(space.prompts.shape[0], dtype=F64, device=seq_prob.device)
    mass.index_add_(0, space.prompt_index, seq_prob)
    worst = float((mass - 1.0).abs().max())
    if not worst <= 1e-5:
        raise ValueError(
            f"{name} gives the enumerated completions a total probability that differs from 1 by "
            f"{worst:.3g} for some prompt: it must give tokens other than the completion tokens "
            "probability 0 (use TabularSequencePolicy or MaskedTransformerPolicy)"
        )


# --------------------------------------------------------------------------------------------------
# The gradient
# --------------------------------------------------------------------------------------------------


def sequence_gradient(
    obj: Objective,
    policy: SequencePolicy,
    task: Any,
    *,
    prompt_ids: Any = None,
    old_policy: SequencePolicy | None = None,
    max_len: int,
    advantage: str = "population",
    group_size: int | None = None,
    eps: float = 1e-6,
    aggregation: str = "seq-mean-token-mean",
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[Tensor, ...]:
    r"""Exact expected ascent direction of an objective over every completion of a task.

    ``g = grad_theta S`` with (see the module docstring for each term)

        S = sum_p w_p sum_y pi_old(y|p) norm(y) sum_t sg(E[coef_t | p, y]) log pi(y_t | p, y_<t)

    the expectation, over prompts (uniform on ``prompt_ids``), completions from ``pi_old``, rewards
    and group members, and the objective's own randomness, of the sampled ascent direction
    ``-grad aggregate(obj(logp, logp_old, adv, mask).loss, mask, aggregation)`` (for
    ``token-mean``: its large-batch limit). ``E[coef_t]`` is ``obj.expected_coef`` at the token
    ratio (token-level rules, times ``obj.clamp_passes``), at the sequence ratio
    ``obj.sequence_ratio`` for every token (stochastic sequence-level rules), or the coefficient
    the objective realises on the sequence (deterministic sequence-level rules). On-policy every rule gives REINFORCE,
    ``sum_p w_p sum_y pi(y|p) E[A | p, y] norm(y) sum_t grad log pi(y_t | ...)``.

    Args:
        obj: an objective with ``expected_coef`` (every one but clip_cov / kl_cov).
        policy: the policy being optimised (:class:`TabularSequencePolicy`,
            :class:`MaskedTransformerPolicy` or anything with their ``completion_logp`` and
            ``parameters()``); gives ``log pi_theta``.
        task: the enumerable task (``make_task("bits", ...)``): prompts, completions, rewards.
        prompt_ids: ``[P, Tp]`` prompts to average over uniformly (default: the prompts of a
            :class:`TabularSequencePolicy`, else all of the task's).
        old_policy: the sampling policy ``pi_old`` (default: ``policy`` itself, on-policy).
        max_len: T, the maximum completion length (1 .. 16, >= the answer length; sequences of
            T tokens without ``<eos>`` are complete, as when generation stops at the limit).
        advantage: ``"population"``, ``"std"``, ``"grpo"``, ``"dr_grpo"`` or ``"rloo"``.
        group_size: G >= 2 for the group advantages (required there, rejected elsewhere).
        eps: std regulariser of ``"std"`` and ``"grpo"`` (1e-6, as TRL/verl).
        aggregation: ``"seq-mean-token-mean"`` (default), ``"seq-mean-token-sum"``,
            ``"seq-mean-token-sum-norm"`` (L = ``max_len``) or ``"token-mean"`` (large-batch limit).
        chunk_size: rows scored per policy call.

    Returns:
        A tuple of tensors aligned with ``list(policy.parameters())``, like
        ``torch.autograd.grad`` (zeros for parameters the log-probs do not use); for a
        :class:`TabularSequencePolicy` the single ``[P, nodes, C]`` gradient of its logits.
    """
    terms = sequence_terms(
        obj,
        policy,
        task,
        prompt_ids=prompt_ids,
        old_policy=old_policy,
        max_len=max_len,
        advantage=advantage,
        group_size=group_size,
        eps=eps,
        aggregation=aggregation,
        chunk_size=chunk_size,
    )
    return surrogate_gradient(policy, terms.space, terms.weight, chunk_size=chunk_size)


def surrogate_gradient(
    policy: SequencePolicy, space: SequenceSpace, weight: Tensor, *, chunk_size: int = DEFAULT_CHUNK
) -> tuple[Tensor, ...]:
    """``grad_theta sum_{n,t} weight[n, t] log pi_theta(y_t | p, y_<t)`` over ``space`` (chunked).

    Returns a tuple aligned with ``list(policy.parameters())`` (zeros where unused).
    """
    params = list(policy.parameters())
    if not params or not all(p.requires_grad for p in params):
        raise ValueError("policy must have parameters, all with requires_grad=True")
    grads = [torch.zeros_like(p) for p in params]
    with torch.enable_grad():
        for rows in _chunks(len(space.reward), chunk_size):
            w = weight[rows]
            if not bool((w != 0).any()):
                continue
            logp = _score(policy, space, rows)
            surrogate = (w * logp.to(F64)).sum()
            parts = torch.autograd.grad(surrogate, params, allow_unused=True)
            for g, part in zip(grads, parts, strict=True):
                if part is not None:
                    g.add_(part)
    return tuple(grads)
