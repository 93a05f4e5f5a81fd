"""The random streams of a run, named once for the whole project (common random numbers).

One generator per purpose (see the style guide): a run's rollout sampling, minibatch order,
objective noise and evaluation draw from separate streams, each seeded from the run's base seed,
the stream and the position of the draw (step, epoch, minibatch, ...), never from a shared
running state. So a rule that draws extra numbers (NSR's rescue noise, Clip-Cov's pick) shifts
no other stream: two rules run with one base seed sample their step-t rollouts from the same
uniforms, and where their policies agree they draw the same completions (the samplers turn
uniforms fixed per (seed, step, row, position, token) into a token by the exponential race,
:func:`gumbel_max`; draws from a fixed distribution, such as a contextual bandit's prompts, use
:func:`inverse_cdf`).

The toy trainers (:mod:`sandbox.train`) and the llm runs (:mod:`llm.streams`, which re-exports
:class:`Stream` and :func:`derive_seed`) use the same names. The numbers are part of every
committed result: a stream's value never changes (a new stream takes a new number).

:data:`RNG` names this scheme in the settings that orchestrators record (compare, sweep, the
claims study) and in every part's name (:meth:`sandbox.experiments.runs.RunSpec.digest`): a run
made with another scheme is another part, never read as this scheme's.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "HELD_OUT",
    "RNG",
    "Stream",
    "StreamGenerators",
    "derive_seed",
    "inverse_cdf",
    "with_rng",
]

#: The random-number scheme of the toy trainers, recorded in the orchestrators' settings.
RNG = "streams-v1"

#: The numpy stream of a reasoning task's held-out problems in the tiny-transformer trainer:
#: replicate s of a run with base seed ``seed`` scores ``default_rng([seed, HELD_OUT, s])``'s
#: problems (:func:`sandbox.train.sequence.held_out_problems`).
HELD_OUT = 7919


class Stream(IntEnum):
    """The draws of a step, keyed ``(seed, stream, *position)`` (:func:`derive_seed`).

    Positions: the llm trainer's are documented on each member; the toy trainers key rollouts
    ``(seed, ROLLOUT, step)``, minibatch order ``(seed, MINIBATCH, step, epoch)``, objective
    noise ``(seed, OBJECTIVE, step, epoch, minibatch)`` and the tiny transformers' held-out
    sampling ``(seed, EVAL, step)``."""

    #: completions of the step's prompts: ``(seed, ROLLOUT, step, first prompt index)`` per
    #: ``generate`` call or vLLM request (:mod:`llm.rollout`, :mod:`llm.vllm_rollout`)
    ROLLOUT = 0
    #: minibatch order: ``(seed, MINIBATCH, step, epoch)`` permutes the step's kept rows
    MINIBATCH = 1
    #: a stochastic objective's noise: ``(seed, OBJECTIVE, step, epoch, minibatch, micro-batch)``
    OBJECTIVE = 2
    #: completions of the held-out prompts: ``(seed, EVAL, step, first prompt index)``
    #: (``llm.train``'s evaluation, and ``llm.pilot``'s as step 0)
    EVAL = 3


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (``numpy.random.SeedSequence``; stateless)."""
    return int(
        np.random.SeedSequence([int(k) & (2**63 - 1) for k in keys]).generate_state(1, np.uint64)[0]
        >> 1
    )


class StreamGenerators:
    """One ``torch.Generator`` per :class:`Stream` of a run with base seed ``seed``; calling
    ``streams(Stream.X, *position)`` reseeds stream X's generator with
    ``derive_seed(seed, X, *position)`` and returns it, so a draw depends on its key only, never
    on what was drawn before (from this stream or another)."""

    def __init__(self, seed: int, device: Any = "cpu") -> None:
        self.seed = int(seed)
        self._generators = {s: torch.Generator(device=device) for s in Stream}
        self._last: dict[Stream, tuple[tuple[int, ...], int]] = {}

    def __call__(self, stream: Stream, *position: int) -> torch.Generator:
        key = tuple(int(p) for p in position)
        last = self._last.get(stream)
        if last is None or last[0] != key:  # one SeedSequence per key, reused by several rules
            last = self._last[stream] = (key, derive_seed(self.seed, stream, *key))
        return self._generators[stream].manual_seed(last[1])


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Categorical draws by inverse CDF: for rows ``probs [..., K]`` (unnormalised, >= 0) and
    uniforms ``u [..., n]`` in [0, 1), the index of the first category whose cumulative
    probability exceeds ``u * total``, i.e. the number of cumulative probabilities at or below
    it. ``[..., n]`` long. A category of probability 0 is never drawn: rounding that puts
    ``u * total`` at the total gives the last category of positive probability.

    The same ``u`` under two close policies gives the same draw unless a category boundary moved
    past it, so runs that share their uniforms (common random numbers) draw the same samples
    while their policies agree."""
    cdf = probs.cumsum(-1)
    draws = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)
    # argmax: the first index where the cumulative sum reaches its total (float cumsum of
    # non-negative terms never decreases), the last category of positive probability
    return torch.minimum(draws, cdf.argmax(-1, keepdim=True))


def gumbel_max(probs: Tensor, u: Tensor) -> Tensor:
    """Categorical draws by the exponential race (Gumbel-max): for rows ``probs [..., K]``
    (unnormalised, >= 0) and uniforms ``u [..., n, K]`` in [0, 1), one per category and draw,
    ``argmax_k probs_k / E_k`` with ``E_k = -log u_k`` i.i.d. Exp(1) (the smallest of independent
    Exp(probs_k) arrival times ``E_k / probs_k``, which is category k with probability
    ``probs_k / sum probs``). ``[..., n]`` long. A category of probability 0 is never drawn: it
    ranks below every positive one (its ratio is negative; ``u`` is floored at the smallest
    normal number, so every ``E`` is finite and a positive category's ratio is >= 0).

    The same ``u`` under two close policies gives the same draw unless the race's winner
    changes: the two draws differ with probability at most about twice the total-variation
    distance of the policies, whatever K (inverse CDF: up to K - 1 times it), so runs that
    share their uniforms (common random numbers) draw the same samples while their policies
    agree. This is the coupling ``torch.multinomial`` makes for one sample per row."""
    p = torch.where(probs > 0, probs, -1.0).unsqueeze(-2)
    return (p / -torch.log(u.clamp_min(torch.finfo(u.dtype).tiny))).argmax(-1)


def with_rng(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with the random-number scheme :data:`RNG` recorded under ``rng``."""
    return {**settings, "rng": RNG}
