"""Adapters that run sandbox objectives inside TRL and verl.

Each adapter maps the framework's configuration, tensor shapes, normalisers, weights and metric
names onto :mod:`sandbox.objectives` and :mod:`sandbox.aggregate`; neither defines a loss of its own.

* :mod:`llm.adapters.trl`: ``SandboxGRPOTrainer``, a ``trl.GRPOTrainer`` subclass (extra ``trl``).
* :mod:`llm.adapters.verl`: importing it registers ``sandbox_<name>`` policy losses in verl
  (extra ``verl``).

The submodules import their framework on import; this package does not, so ``import llm.adapters``
works without either installed. See ``docs/adapters.md`` for activation and the semantic
differences between TRL, verl and the sandbox.
"""

__all__ = ["trl", "verl"]
