"""Policies over the completions of an enumerable reasoning task, for exact expectations.

:class:`TabularSequencePolicy` (a softmax per (prompt, completion-prefix) node) and
:class:`MaskedTransformerPolicy` (a :class:`~sandbox.policies.TinyTransformer` restricted to the
completion tokens) implement the :class:`sandbox.exact.sequences.SequencePolicy` protocol that
:func:`sandbox.exact.sequence_gradient` sums over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from envs.reasoning.tasks import MAX_ENUMERATION_LEN
from sandbox.configs import check_int

from .transformer import TinyTransformer

__all__ = ["MaskedTransformerPolicy", "TabularSequencePolicy", "check_enumerable_task", "check_int"]

F64 = torch.float64


TASK_API = (
    "enumerate_prompts",
    "enumerate_completions_array",
    "reward_ids_batch",
    "tokenizer",
    "completion_token_ids",
)


def check_enumerable_task(task: Any) -> None:
    missing = [m for m in TASK_API if not hasattr(task, m)]
    if missing:
        raise ValueError(
            f"task must be an enumerable task (e.g. make_task('bits', ...)); "
            f"{type(task).__name__} lacks {missing}"
        )


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
        check_enumerable_task(task)
        self.task = task
        self.max_len = check_int("max_len", max_len, 1)
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
            self.task,
            self.max_len,
            logits,
            prompt_ids=self.prompts.cpu().numpy(),
            requires_grad=requires_grad,
        )

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
        length = self.max_len if max_len is None else check_int("max_len", max_len, 1)
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
            model,
            task.completion_token_ids,
            eos_id=task.tokenizer.eos_id,
            pad_id=task.tokenizer.pad_id,
        )

    def parameters(self) -> list[Tensor]:
        return list(self.model.parameters())

    def completion_logp(
        self, prompt: Tensor, prompt_mask: Tensor, completion: Tensor, completion_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(logp [B, T], entropy [B, T])``, one full pass, 0 where ``completion_mask`` is 0."""
        logp, entropy = self.model.completion_logp(
            prompt[None],
            prompt_mask.bool()[None],
            completion[None],
            completion_mask.bool()[None],
            self._allowed.to(prompt.device),
        )
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
        T = check_int("max_new_tokens", max_new_tokens, 1)
        completion, mask = self.model.generate(
            prompt[None],
            prompt_mask.bool()[None],
            max_new_tokens=T,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            generator=generator,
            allowed=self._allowed.to(prompt.device),
        )
        pad = T - completion.shape[-1]  # generation stops early once every row has ended
        completion = torch.nn.functional.pad(completion[0], (0, pad), value=self.pad_id)
        return completion, torch.nn.functional.pad(mask[0], (0, pad), value=False)
