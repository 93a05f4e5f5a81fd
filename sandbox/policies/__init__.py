"""Policies for the toy rungs: a tiny causal transformer with an ensemble (seed) dimension, and
the tabular and masked-transformer policies over an enumerable task's completions."""

from .sequences import MaskedTransformerPolicy, TabularSequencePolicy
from .transformer import TinyTransformer, TransformerConfig, clip_grad_norm_per_model

__all__ = [
    "MaskedTransformerPolicy",
    "TabularSequencePolicy",
    "TinyTransformer",
    "TransformerConfig",
    "clip_grad_norm_per_model",
]
