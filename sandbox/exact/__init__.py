"""Exact theory on softmax bandits: expected gradients, their variance, and expected-gradient flows.

    >>> from sandbox.exact import bandit_gradient
    >>> g = bandit_gradient(obj, logits, old_logits, rewards)  # doctest: +SKIP
    >>> from sandbox.exact import sequence_gradient, TabularSequencePolicy
    >>> (g,) = sequence_gradient(obj, policy, task, max_len=3)  # doctest: +SKIP

Everything here calls the objectives of :mod:`sandbox.objectives` through their
``expected_coef``; no clip rule is written twice. See :mod:`sandbox.exact.bandit` for the
equations (docs/objectives.md §10.3–10.5), :mod:`sandbox.exact.sequences` for the same sums over
every completion of an enumerable reasoning task (tabular and tiny-transformer policies),
:mod:`sandbox.exact.flow` for the deterministic dynamics and
:mod:`sandbox.exact.softmax` for the entropy–covariance law (§6.8).
"""

from __future__ import annotations

from .bandit import (
    ADVANTAGE_OPTIONS,
    GROUP_ADVANTAGES,
    NSRGradientVariance,
    bandit_gradient,
    contextual_bandit_gradient,
    expected_clip_fractions,
    group_advantage_table,
    nsr_gradient_variance,
)
from .flow import FLOW_COLUMNS, OPTIMIZERS, exact_flow
from .sequences import (
    MaskedTransformerPolicy,
    SequenceSpace,
    SequenceTerms,
    TabularSequencePolicy,
    enumerate_sequences,
    sequence_gradient,
    sequence_log_probs,
    sequence_terms,
    surrogate_gradient,
)
from .softmax import entropy, entropy_covariance_prediction, expected_value

__all__ = [
    "ADVANTAGE_OPTIONS",
    "FLOW_COLUMNS",
    "GROUP_ADVANTAGES",
    "OPTIMIZERS",
    "MaskedTransformerPolicy",
    "NSRGradientVariance",
    "SequenceSpace",
    "SequenceTerms",
    "TabularSequencePolicy",
    "bandit_gradient",
    "contextual_bandit_gradient",
    "entropy",
    "entropy_covariance_prediction",
    "enumerate_sequences",
    "exact_flow",
    "expected_clip_fractions",
    "expected_value",
    "group_advantage_table",
    "nsr_gradient_variance",
    "sequence_gradient",
    "sequence_log_probs",
    "sequence_terms",
    "surrogate_gradient",
]
