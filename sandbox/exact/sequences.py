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
* sequence-level rules (``obj.level == "sequence"``: gspo, nsr / nsr_decay with
  ``level="sequence"``): the sequence ratio ``s = exp(clamp(mean_t log r_t, ±20))`` (GSPO,
  the clamp on the detached value), the same coefficient for every token of the sequence (the
  GSPO-token form of the objective contract).

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
:class:`TabularSequencePolicy` (a softmax per (prompt, completion-prefix) node) and
:class:`MaskedTransformerPolicy` (a :class:`~sandbox.policies.TinyTransformer` restricted to the
completion tokens). Completions are scored in chunks of ``chunk_size`` rows (the outcome space
has ``P (2^(T+1) - 1)`` sequences), twice: once without graph for the weights, once with it for
the gradient.

Example (bits copy, length 1, T = 2, prompt "1", uniform policy, on-policy, population advantage,
seq-mean-token-mean) is worked out by hand in ``tests/test_exact_sequences.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from envs.reasoning.tasks import MAX_ENUMERATION_LEN
from sandbox.aggregate import AGGREGATION_MODES
from sandbox.objectives import LOG_RATIO_CLAMP, Objective
from sandbox.policies import TinyTransformer

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


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


_TASK_API = (
    "enumerate_prompts",
    "enumerate_completions_array",
    "reward_ids_batch",
    "tokenizer",
    "completion_token_ids",
)


def _check_task(task: Any) -> None:
    missing = [m for m in _TASK_API if not hasattr(task, m)]
    if missing:
        raise ValueError(
            f"task must be an enumerable task (e.g. make_task('bits', ...)); "
            f"{type(task).__name__} lacks {missing}"
        )


def _check_max_len(task: Any, max_len: Any) -> int:
    max_len = _check_int("max_len", max_len, 1)
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
    _check_task(task)
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
    chunk_size = _check_int("chunk_size", chunk_size, 1)
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
    raw: Tensor,
    mask: Tensor,
    lengths: Tensor,
    adv_values: Tensor,
    adv_probs: Tensor,
) -> tuple[Tensor, Tensor]:
    """``(ratio [n, T], E[coef] [n, T])`` for rows with raw log-ratios ``raw`` (0 on padding)."""
    if level == "sequence":
        seq_lr = raw.sum(-1) / lengths.to(F64)
        s = seq_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()  # [n]
        ec = (adv_probs * _expected_coef(obj, s[:, None], adv_values)).sum(-1)  # [n]
        ratio, coef = s[:, None].expand_as(raw), ec[:, None].expand_as(raw)
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
    chunk_size = _check_int("chunk_size", chunk_size, 1)
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

    raw = torch.where(space.mask, logp - logp_old, 0.0)
    ratios, coefs = [], []
    for rows in _chunks(len(space.reward), chunk_size):
        r, c = _expected_token_coef(
            obj, level, raw[rows], space.mask[rows], space.lengths[rows],
            adv_values[rows], adv_probs[rows],
        )  # fmt: skip
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
    ratio (token-level rules, times ``obj.clamp_passes``) or at the sequence ratio ``s`` for every
    token (``obj.level == "sequence"``). On-policy every rule gives REINFORCE,
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
        obj, policy, task, prompt_ids=prompt_ids, old_policy=old_policy, max_len=max_len,
        advantage=advantage, group_size=group_size, eps=eps, aggregation=aggregation,
        chunk_size=chunk_size,
    )  # fmt: skip
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


# --------------------------------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------------------------------


def _token_columns(task: Any, device: torch.device | None) -> tuple[Tensor, Tensor, int]:
    """``(token_ids [C], column_of [vocab] (-1 elsewhere), eos column)``."""
    token_ids = torch.tensor(sorted(task.completion_token_ids), dtype=torch.long, device=device)
    vocab = int(task.tokenizer.vocab_size)
    column = torch.full((vocab,), -1, dtype=torch.long, device=device)
    column[token_ids] = torch.arange(len(token_ids), device=device)
    eos = int(task.tokenizer.eos_id)
    if eos not in task.completion_token_ids:
        raise ValueError("task.completion_token_ids must include <eos>")
    return token_ids, column, int(column[eos])


class TabularSequencePolicy:
    r"""A softmax per node of the enumeration tree: ``pi(y_t = c | p, y_<t) = softmax(z[p, v])[c]``.

    Nodes ``v`` are the prefixes ``y_<t`` that can continue: strings of k < T symbols (the
    completion tokens other than ``<eos>``, V of them), numbered ``v = (V^k - 1)/(V - 1) + value``
    with ``value`` the base-V number of the prefix (first symbol most significant); for bits
    (V = 2): root 0, "0" 1, "1" 2, "00" 3, ... ``2^T - 1`` nodes in all. Columns ``c`` are the
    completion tokens in id order (bits: ``<eos>, '0', '1'``); every other token (``<pad>``,
    ``<bos>``) has probability 0. A policy shared by several prompts is not implied: each prompt
    has its own rows.

    Args:
        task: an enumerable task (``make_task("bits", ...)``).
        max_len: T, the longest completion (1 .. 16).
        logits: ``[P, nodes, C]`` initial logits (default zeros: the uniform policy); copied.
        prompt_ids: ``[P, Tp]`` the prompts with rows (default all of ``task.enumerate_prompts()``).
        requires_grad: make :attr:`logits` a leaf that requires grad (default True).

    Attributes:
        logits: ``[P, nodes, C]`` float64 (by default), the only parameter.
        prompts: ``[P, Tp]`` long.
        token_ids: ``[C]`` long, the id of each column.
    """

    def __init__(
        self,
        task: Any,
        max_len: int,
        logits: Tensor | None = None,
        *,
        prompt_ids: Any = None,
        requires_grad: bool = True,
    ) -> None:
        _check_task(task)
        self.task = task
        self.max_len = _check_int("max_len", max_len, 1)
        if self.max_len > MAX_ENUMERATION_LEN:
            raise ValueError(
                f"max_len must be an integer in [1, {MAX_ENUMERATION_LEN}], got {max_len!r}"
            )
        prompts = np.asarray(task.enumerate_prompts() if prompt_ids is None else prompt_ids)
        if (
            prompts.ndim != 2
            or prompts.shape[0] == 0
            or not np.issubdtype(prompts.dtype, np.integer)
        ):
            raise ValueError(
                f"prompt_ids must be a non-empty integer array [P, Tp], got shape {prompts.shape}"
            )
        device = logits.device if isinstance(logits, Tensor) else None
        self.prompts = torch.as_tensor(prompts, dtype=torch.long, device=device)
        self.token_ids, self._column, self.eos_column = _token_columns(task, device)
        symbols = [c for c in range(len(self.token_ids)) if c != self.eos_column]
        self.num_symbols = len(symbols)
        digit = torch.zeros_like(self._column)  # symbol index of each token id (0 elsewhere)
        digit[self.token_ids[symbols]] = torch.arange(len(symbols), device=device)
        self._digit = digit
        V, T = self.num_symbols, self.max_len
        self.num_nodes = T if V == 1 else (V**T - 1) // (V - 1)
        shape = (self.prompts.shape[0], self.num_nodes, len(self.token_ids))
        if logits is None:
            logits = torch.zeros(shape, dtype=F64)
        if not isinstance(logits, Tensor) or tuple(logits.shape) != shape:
            got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(f"logits must be a tensor of shape [P, nodes, C] = {shape}, got {got}")
        if not logits.is_floating_point() or not bool(torch.isfinite(logits).all()):
            raise ValueError("logits must be a finite floating-point tensor")
        self.logits = logits.detach().clone().requires_grad_(requires_grad)

    @classmethod
    def random(
        cls,
        task: Any,
        max_len: int,
        *,
        generator: torch.Generator,
        scale: float = 1.0,
        prompt_ids: Any = None,
        requires_grad: bool = True,
    ) -> TabularSequencePolicy:
        """Logits ``scale * N(0, 1)`` drawn from ``generator`` (float64)."""
        shape = cls(task, max_len, prompt_ids=prompt_ids, requires_grad=False).logits.shape
        logits = scale * torch.randn(shape, generator=generator, dtype=F64)
        return cls(task, max_len, logits, prompt_ids=prompt_ids, requires_grad=requires_grad)

    def with_logits(self, logits: Tensor, *, requires_grad: bool = True) -> TabularSequencePolicy:
        """The same task, length and prompts with other logits (e.g. a perturbed old policy)."""
        return TabularSequencePolicy(
            self.task, self.max_len, logits, prompt_ids=self.prompts.cpu().numpy(),
            requires_grad=requires_grad,
        )  # fmt: skip

    def parameters(self) -> list[Tensor]:
        return [self.logits]

    # -- indexing -----------------------------------------------------------------------------
    def prompt_index(self, prompt: Tensor) -> Tensor:
        """Row of :attr:`prompts` for each prompt ``[B, Tp]`` -> ``[B]`` (ValueError if absent)."""
        prompt = torch.as_tensor(prompt, dtype=torch.long, device=self.prompts.device)
        if prompt.dim() != 2 or prompt.shape[1] != self.prompts.shape[1]:
            raise ValueError(
                f"prompt must have shape [B, {self.prompts.shape[1]}], got {tuple(prompt.shape)}"
            )
        P = self.prompts.shape[0]
        _, inverse = torch.unique(torch.cat([self.prompts, prompt]), dim=0, return_inverse=True)
        lookup = torch.full((int(inverse.max()) + 1,), -1, dtype=torch.long, device=prompt.device)
        lookup[inverse[:P]] = torch.arange(P, device=prompt.device)
        index = lookup[inverse[P:]]
        if bool((index < 0).any()):
            raise ValueError("prompt contains a prompt this policy has no rows for")
        return index

    def node_index(self, completion: Tensor) -> Tensor:
        """Node of the prefix ``y_<t`` at each position of ``completion [B, T']`` (T' <= T) ->
        ``[B, T']``. Positions after an ``<eos>`` get an arbitrary valid node."""
        if completion.dim() != 2 or completion.shape[1] > self.max_len:
            raise ValueError(
                f"completion must have shape [B, T'] with T' <= max_len={self.max_len}, "
                f"got {tuple(completion.shape)}"
            )
        V = self.num_symbols
        digit = self._digit[completion.clamp(0, len(self._digit) - 1)]  # [B, T']
        value = torch.zeros_like(digit[:, 0])
        values = [value]
        for t in range(1, completion.shape[1]):
            value = value * V + digit[:, t - 1]
            values.append(value)
        value = torch.stack(values, -1)
        k = torch.arange(completion.shape[1], device=completion.device)
        offset = k if V == 1 else (V**k - 1) // (V - 1)
        return offset + value

    # -- scoring --------------------------------------------------------------------------------
    def _log_softmax_rows(
        self, prompt_index: Tensor, completion: Tensor, logits: Tensor | None
    ) -> Tensor:
        z = self.logits if logits is None else logits
        rows = z[prompt_index[:, None], self.node_index(completion)]  # [B, T', C]
        return torch.log_softmax(rows, -1)

    def log_probs(
        self,
        prompt_index: Tensor,
        completion: Tensor,
        completion_mask: Tensor | None = None,
        *,
        logits: Tensor | None = None,
    ) -> Tensor:
        """``log pi(y_t | p, y_<t)`` ``[B, T']`` of ``completion [B, T']`` after the prompts of
        rows ``prompt_index [B]``; 0 where ``completion_mask`` is 0, ``-inf`` for a token that is
        not a completion token. ``logits`` (default :attr:`logits`) may have any number of rows
        ``[P', nodes, C]`` that ``prompt_index`` indexes (e.g. replicated copies)."""
        logp_all = self._log_softmax_rows(prompt_index, completion, logits)
        column = self._column[completion.clamp(0, len(self._column) - 1)]
        logp = logp_all.gather(-1, column.clamp(min=0)[..., None])[..., 0]
        logp = torch.where(column >= 0, logp, -torch.inf)
        if completion_mask is None:
            return logp
        return torch.where(completion_mask.bool(), logp, 0.0)

    def completion_logp(
        self, prompt: Tensor, prompt_mask: Tensor, completion: Tensor, completion_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(logp [B, T'], entropy [B, T'])`` of ``completion`` after ``prompt [B, Tp]`` (one of
        :attr:`prompts`; ``prompt_mask`` is unused: prompts are full rows), 0 on padding."""
        index = self.prompt_index(prompt)
        logp_all = self._log_softmax_rows(index, completion, None)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        mask = completion_mask.bool()
        return self.log_probs(index, completion, mask), torch.where(mask, entropy, 0.0)

    # -- sampling --------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self, prompt_index: Tensor, *, generator: torch.Generator, max_len: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Draw one completion per row, token by token: ``(completion [B, T], mask [B, T])``,
        ``<pad>`` and mask 0 after ``<eos>``; T = ``max_len`` (default the policy's)."""
        length = self.max_len if max_len is None else _check_int("max_len", max_len, 1)
        if length > self.max_len:
            raise ValueError(
                f"max_len must be <= the policy's max_len={self.max_len}, got {length}"
            )
        B = prompt_index.shape[0]
        device = self.logits.device
        pad = int(self.task.tokenizer.pad_id)
        eos = int(self.token_ids[self.eos_column])
        completion = torch.full((B, length), pad, dtype=torch.long, device=device)
        mask = torch.zeros((B, length), dtype=torch.bool, device=device)
        node = torch.zeros(B, dtype=torch.long, device=device)
        alive = torch.ones(B, dtype=torch.bool, device=device)
        V = self.num_symbols
        for t in range(length):
            probs = torch.softmax(self.logits[prompt_index, node].to(F64), -1)  # [B, C]
            u = torch.rand(B, 1, generator=generator, dtype=F64, device=device)
            column = (probs.cumsum(-1) < u).sum(-1).clamp(max=probs.shape[-1] - 1)
            token = self.token_ids[column]
            completion[:, t] = torch.where(alive, token, pad)
            mask[:, t] = alive
            alive = alive & (token != eos)
            offset = t if V == 1 else (V**t - 1) // (V - 1)
            nxt = 1 + t if V == 1 else (V ** (t + 1) - 1) // (V - 1)
            node = nxt + (node - offset) * V + self._digit[token]
            node = torch.where(alive, node, 0)
        return completion, mask


class MaskedTransformerPolicy:
    """A single :class:`~sandbox.policies.TinyTransformer` (``num_models=1``) whose next-token
    distribution is restricted to the completion tokens (other logits set to ``-inf``).

    ``pi(y_t | p, y_<t) = softmax(mask(head(h_t)))``, computed in the model's dtype (float64 after
    ``model.double()``; unlike ``TinyTransformer.completion_logp``, which casts logits to float32).
    Inputs are ``[B, ...]`` (the model dimension is added and removed here).

    Args:
        model: the network (its parameters are this policy's parameters).
        allowed_ids: the token ids with nonzero probability (``task.completion_token_ids``).
        eos_id, pad_id: end-of-sequence and padding ids (``task.tokenizer``).
    """

    def __init__(
        self, model: TinyTransformer, allowed_ids: Sequence[int], *, eos_id: int, pad_id: int = 0
    ) -> None:
        if not isinstance(model, TinyTransformer) or model.num_models != 1:
            raise ValueError("model must be a TinyTransformer with num_models=1")
        vocab = model.config.vocab_size
        ids = sorted({int(i) for i in allowed_ids})
        if not ids or ids[0] < 0 or ids[-1] >= vocab or int(eos_id) not in ids:
            raise ValueError(
                f"allowed_ids must be ids in [0, {vocab}) that include eos_id={eos_id}, got {ids}"
            )
        self.model = model
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        allowed = torch.zeros(vocab, dtype=torch.bool)
        allowed[ids] = True
        self._allowed = allowed

    @classmethod
    def from_task(cls, model: TinyTransformer, task: Any) -> MaskedTransformerPolicy:
        return cls(
            model, task.completion_token_ids, eos_id=task.tokenizer.eos_id,
            pad_id=task.tokenizer.pad_id,
        )  # fmt: skip

    def parameters(self) -> list[Tensor]:
        return list(self.model.parameters())

    def completion_logp(
        self, prompt: Tensor, prompt_mask: Tensor, completion: Tensor, completion_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(logp [B, T], entropy [B, T])``, one full pass, 0 where ``completion_mask`` is 0."""
        logp, entropy = self.model.completion_logp(
            prompt[None], prompt_mask.bool()[None], completion[None], completion_mask.bool()[None],
            self._allowed.to(prompt.device),
        )  # fmt: skip
        return logp[0], entropy[0]

    @torch.no_grad()
    def sample(
        self,
        prompt: Tensor,
        prompt_mask: Tensor,
        *,
        max_new_tokens: int,
        generator: torch.Generator,
    ) -> tuple[Tensor, Tensor]:
        """Sample completions from the masked distribution (KV-cached
        :meth:`TinyTransformer.generate`): ``(completion [B, T], mask [B, T])`` with
        ``T = max_new_tokens``, ``<pad>`` after ``<eos>``."""
        T = _check_int("max_new_tokens", max_new_tokens, 1)
        completion, mask = self.model.generate(
            prompt[None], prompt_mask.bool()[None], max_new_tokens=T, eos_id=self.eos_id,
            pad_id=self.pad_id, generator=generator, allowed=self._allowed.to(prompt.device),
        )  # fmt: skip
        pad = T - completion.shape[-1]  # generation stops early once every row has ended
        completion = torch.nn.functional.pad(completion[0], (0, pad), value=self.pad_id)
        return completion, torch.nn.functional.pad(mask[0], (0, pad), value=False)
