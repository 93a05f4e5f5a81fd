"""Transformer training with the sandbox's objectives.

* :mod:`llm.train`: ``python -m llm.train`` (or ``torchrun ... -m llm.train``), GRPO-style RL on a
  Hugging Face causal LM with any objective of :mod:`sandbox.objectives`; see ``docs/llm.md``.
* :mod:`llm.data`, :mod:`llm.model`, :mod:`llm.rollout`, :mod:`llm.logprobs`,
  :mod:`llm.checkpoint`, :mod:`llm.dist`: its prompts and verifiers, model loading, generation,
  completion log-probs (chunked LM head, no ``[B, T, V]`` logits), checkpoints, distribution.
* :mod:`llm.ensemble`: ``python -m llm.ensemble --seeds 0,1,...``, K runs of :mod:`llm.train`
  in one process with their training forward batched over the runs (``torch.func.vmap``).
* :mod:`llm.adapters`: the same objectives inside TRL and verl.

Nothing here defines a loss: losses come from :mod:`sandbox.objectives`, reductions from
:mod:`sandbox.aggregate`, KL from :mod:`sandbox.kl`. Importing ``llm`` imports nothing heavy.
"""
