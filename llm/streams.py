"""The random streams of an llm run, named once: every draw a run makes comes from one of them.

One generator per purpose (common random numbers, see the style guide): a run's sampling,
minibatch order, objective noise and evaluation draw from separate streams, each derived from
``--seed`` and the position of the draw (step, epoch, minibatch, ...), never from a shared
global state. So two rules run with one seed see the same prompts and held-out problems, a
K-member :mod:`llm.ensemble` makes each member's draws exactly as its run alone makes them, and a
resumed run continues the draws it would have made. The numbers are part of every committed
result: a stream's value never changes (a new stream takes a new number).

Two families, both ``numpy.random.SeedSequence`` entropy, told apart by their lengths:

- :class:`Stream`: the torch draws of the loop, stateless, ``derive_seed(seed, Stream.X,
  *position)`` seeds a generator (or ``torch.manual_seed`` inside ``fork_rng``) for that one
  draw. Defined with :func:`derive_seed` in :mod:`sandbox.streams` (the toy trainers use the
  same names) and re-exported here;
- :class:`PromptStream`: the numpy generators of the prompts, ``prompt_rng(seed, PromptStream.X)``
  (the training prompts' generator is stateful, saved in the checkpoint).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from sandbox.streams import Stream, derive_seed

__all__ = ["PromptStream", "Stream", "derive_seed", "prompt_rng"]


class PromptStream(IntEnum):
    """The numpy generators of a run's prompts, seeded ``[seed, stream]`` (:func:`prompt_rng`)."""

    #: the training prompts, drawn step after step (``Run.rng``, saved in the checkpoint)
    TRAIN = 0
    #: the held-out prompts: a task's evaluation problems, or a data file's held-out rows
    EVAL = 1
    #: the probe prompts whose lengths are checked against the context before training
    PROBE = 2


def prompt_rng(seed: int, stream: PromptStream) -> np.random.Generator:
    """The numpy generator of one prompt stream: ``np.random.default_rng([seed, stream])``."""
    return np.random.default_rng([seed, int(stream)])
