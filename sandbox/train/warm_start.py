"""A warm start for the tiny transformers: one model, taught the task's answers by supervised
steps on the train partition to partial competence, that every replicate of a run starts from.

Trained from scratch, the replicates of the tiny-transformer rung differ in their initial weights
as much as in what they sample, so a paired difference between two rules mixes "which problems
this initialisation happened to learn" with the rules' effect. Started from one pretrained model,
as the llm rung's SmolLM2 runs are, replicates differ only in what they sample.

    python -m sandbox.train.warm_start --task bits --task-knobs op=reverse length=8 \\
        --steps 300 --out results/warm_start/bits-reverse-8.pt

The command is deterministic (one seed fixes the weights and every batch); it prints the held-out
pass@1 on the task's test partition (:func:`envs.reasoning.problem_split`) every ``--eval-every``
steps and, with ``--target``, stops at the first evaluation at or above it. The file holds the
weights of one model and the settings that made them; ``SequenceTrainConfig(init=FILE)`` loads it
(``torch.load(..., weights_only=True)``) into every replicate, refused by name where the task or
the model's shape differ.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sandbox.configs import arg, check_int, check_number

from .sequence import FORMAT, SequenceTrainConfig, SequenceTrainer


@dataclass
class WarmStartConfig:
    """The supervised warm start's settings; the model shape matches :class:`SequenceTrainConfig`'s
    fields of the same names (a run that loads the file must use the same)."""

    task: str = arg("bits", "task name from envs.reasoning")
    task_knobs: dict[str, Any] = arg({"op": "reverse", "length": 8}, "difficulty knobs")
    steps: int = arg(300, "supervised steps (at most: --target may stop sooner)")
    batch: int = arg(64, "problems of the train partition per step")
    lr: float = arg(1e-3, "Adam learning rate")
    target: float | None = arg(None, "stop at the first evaluation whose pass@1 reaches this")
    eval_every: int = arg(25, "evaluate held-out pass@1 every N steps")
    eval_prompts: int = arg(256, "held-out problems of the test partition")
    d_model: int = arg(32, "transformer width")
    n_layers: int = arg(2, "transformer layers")
    n_heads: int = arg(4, "attention heads")
    seed: int = arg(0, "seed of the weights, the batches and the evaluation")

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "eval_every", "eval_prompts"):
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, 0)
        check_number("lr", self.lr)
        if self.target is not None and not 0 < self.target <= 1:
            raise ValueError(f"target must be in (0, 1], got {self.target!r}")
        self.trainer_config()  # the task, its knobs and the model shape, checked by the trainer

    def trainer_config(self) -> SequenceTrainConfig:
        """The one-replicate run whose model, prompts and evaluation the warm start uses."""
        return SequenceTrainConfig(
            task=self.task, task_knobs=dict(self.task_knobs), seeds=1, split=True,
            eval_prompts=self.eval_prompts, eval_k=1, d_model=self.d_model,
            n_layers=self.n_layers, n_heads=self.n_heads, seed=self.seed,
        )  # fmt: skip


def _answer_ids(trainer: SequenceTrainer, answers: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The correct completions (answer tokens, then ``<eos>``) ``[1, B, Tc]``, right-padded."""
    tok = trainer.task.tokenizer
    rows = [[*tok.encode(trainer.task.format_completion(a)), tok.eos_id] for a in answers]
    width = trainer.max_new_tokens
    ids = torch.full((len(rows), width), tok.pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : min(len(row), width)] = torch.tensor(row[:width])
    return ids[None].to(trainer.device), (ids != tok.pad_id)[None].to(trainer.device)


def warm_start(config: WarmStartConfig, log=print) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Teach one model the task's answers: each step, ``batch`` train-partition problems, the
    mean token log-likelihood of their correct completions (restricted to the task's answer
    tokens and ``<eos>``, as the policy is), one Adam step. Returns the weights (model dimension
    1) and the evaluations ``[{"step", "pass"}]`` (held-out pass@1 on the test partition)."""
    trainer = SequenceTrainer(config.trainer_config())
    model = trainer.model
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    rng = np.random.default_rng([config.seed, 1])  # the batches: apart from the trainer's streams
    history = []
    for step in range(1, config.steps + 1):
        prompts, answers = trainer.task.sample_batch(rng, config.batch, split="train")
        prompt, prompt_mask = trainer._encode(prompts, 1)
        completion, completion_mask = _answer_ids(trainer, answers)
        logp, _ = model.completion_logp(
            prompt, prompt_mask, completion, completion_mask, trainer.allowed
        )
        loss = -logp.sum() / completion_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % config.eval_every == 0 or step == config.steps:
            passed, nll = float(trainer.evaluate()[0]), loss.item()
            history.append({"step": step, "loss": nll, "pass": passed})
            log(f"step {step}: loss {nll:.4f}, held-out pass@1 {passed:.3f}")
            if config.target is not None and passed >= config.target:
                break
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, history


def save_warm_start(
    state: dict[str, torch.Tensor], config: WarmStartConfig, history: list[dict], path: str | Path
) -> Path:
    """The weights and the settings and evaluations that made them, to ``path`` (atomically, by
    the results' own writer)."""
    import io

    from sandbox.experiments.results import write_if_changed

    record = {
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "model": dataclasses.asdict(config.trainer_config().model_config()),
        "history": history,
        "state": state,
    }
    buffer = io.BytesIO()
    torch.save(record, buffer)
    write_if_changed(buffer.getvalue(), path)
    return Path(path)


def ensure_warm_start(config: WarmStartConfig, folder: str | Path, log=print) -> Path:
    """The warm-start file of ``config`` in the cache ``folder``: named by the task and a hash of
    every setting (``bits-lengthN-opreverse-<hash>.pt``), made by :func:`warm_start` only when
    the folder does not hold it yet (deterministic: the same settings make the same file, so a
    committed cache is the command's output)."""
    import hashlib
    import json

    from envs.reasoning import make_task

    settings = dataclasses.asdict(config)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    knobs = make_task(config.task, **config.task_knobs).knobs
    stem = "-".join([config.task, *(f"{k}{v}" for k, v in sorted(knobs.items()))])
    path = Path(folder) / f"{stem}-{digest}.pt"
    if path.exists():
        record = torch.load(path, map_location="cpu", weights_only=True)
        if record.get("config") == json.loads(json.dumps(settings)):
            return path
    state, history = warm_start(config, log=log)
    return save_warm_start(state, config, history, path)


def main(argv: list[str] | None = None) -> int:
    """The command: train, write ``--out``, print each evaluation and the file written."""
    from sandbox.configs import CommandParser, add_arguments, flag_values

    parser = CommandParser(
        prog="python -m sandbox.train.warm_start", description=__doc__.split("\n")[0]
    )
    add_arguments(parser, WarmStartConfig)
    parser.add_argument("--out", required=True, help="the warm-start file to write (.pt)")
    args = parser.parse_args(argv)
    try:
        config = WarmStartConfig(**flag_values(args, WarmStartConfig))
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    state, history = warm_start(config)
    path = save_warm_start(state, config, history, args.out)
    last = history[-1]
    print(f"wrote {path} (held-out pass@1 {last['pass']:.3f} at step {last['step']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
