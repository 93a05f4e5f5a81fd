"""Policies for the toy rungs: a tiny causal transformer with an ensemble (seed) dimension."""

from .transformer import TinyTransformer, TransformerConfig, clip_grad_norm_per_model

__all__ = ["TinyTransformer", "TransformerConfig", "clip_grad_norm_per_model"]
