"""How a model starts on a task, before any training: the pilot that picks an LLM rung's task.

A task for a study's LLM rung must start low *and* give a learning signal: a GRPO group of G
completions only carries a gradient when some completion succeeds. Per task, on held-out
problems drawn from the seed (the same streams ``llm.train``'s evaluation uses, :mod:`llm.streams`):

- ``pass_at_1``: the task's own verifier on one completion per problem, sampled as training
  samples them (temperature, ``--max-new-tokens``, the chat template when the tokenizer has one);
- ``answer_anywhere``: the correct answer appears as a number anywhere in that completion (the
  model computes it but does not state it as the verifier wants: a format-limited start);
- ``forced_greedy``: the format forced: the assistant turn prefilled with ``"The answer is"`` and
  8 greedy tokens; the first number must be the answer (an arithmetic-limited start shows 0 here);
- ``group_signal``: ``1 - (1 - pass_at_1) ** G``, the chance a group of G has a success;
- ``constant``, ``prior``: the answer baselines of the same held-out problems (always writing the
  most frequent answer; an answer drawn from the answers' own frequencies:
  :func:`envs.reasoning.answer_baselines`), and ``target``: the larger plus 5 margins (0.10), the
  held-out pass@1 the trained reference rule must reach for the study's regime rule
  (:mod:`sandbox.study.regimes`); a task whose baselines sit high (``mod_arith`` with ``*``: the
  answer 0 for a fifth of the problems) asks the rung to beat the answer prior, not to learn.

::

    python -m llm.pilot --model smollm2-135m --tasks addition:digits=3 mod_arith:steps=2 \\
        --prompts 64

Writes one tidy row per task (with model, device, date and the command) to ``--out``
(default :data:`DEFAULT_OUT`, under the git-ignored ``runs/``; the committed
``results/llm_pilot/pilot.csv`` is rewritten only by the command in that folder's README, which
names it). Bad arguments, including an ``--out`` that is a folder or cannot be written, are one
``error:`` line and exit status 2, before any model is loaded.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm import tqdm

from llm.config import TrainConfig
from llm.streams import Stream
from sandbox.configs import CommandParser, check_device, key_values
from sandbox.experiments.results import prepare_out_dir
from sandbox.study.regimes import WIDE
from sandbox.study.rungs import MARGINS

PREFILL = "The answer is"
#: ``--out`` when none is given: under ``runs/`` (git-ignored), never the committed results.
DEFAULT_OUT = "runs/llm_pilot/pilot.csv"
_NUMBER = re.compile(r"-?\d+")


def numbers(text: str) -> list[str]:
    """The integers in ``text`` (thousands separators removed), in order."""
    return _NUMBER.findall(text.replace(",", ""))


def parse_task(spec: str) -> tuple[str, dict[str, Any]]:
    """``"addition:digits=3,num_terms=2"`` -> ``("addition", {"digits": 3, "num_terms": 2})``; a
    list value in brackets keeps its commas (``"mod_arith:ops=['+','-']"``)."""
    name, _, knobs = spec.partition(":")
    if not name:
        raise ValueError(f"--tasks: empty task name in {spec!r}")
    items = re.split(r",(?![^\[]*\])", knobs)  # commas outside brackets
    return name, key_values(list(filter(None, items)), f"--tasks {spec!r}")


def forced_greedy(run: Any, prompts: list[str], answers: list[str]) -> float:
    """Share of ``prompts`` whose first number after the prefilled :data:`PREFILL` (8 greedy
    tokens) is the answer."""
    tok, model = run.tokenizer, run.model
    prefix = tok.encode(PREFILL, add_special_tokens=False)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    hits = 0
    model.eval()
    with torch.no_grad():
        for ids, answer in zip(run.encode(prompts), answers, strict=True):
            x = torch.tensor([ids + prefix], device=run.device)
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=8,
                do_sample=False,
                pad_token_id=pad,
            )
            found = numbers(tok.decode(out[0, x.shape[1] :], skip_special_tokens=True))
            hits += bool(found) and found[0] == answer
    return hits / max(len(prompts), 1)


def pilot_task(task_cfg: TrainConfig) -> dict[str, Any]:
    """The pilot's row for one task, ``task_cfg.task`` with its knobs (module docstring)."""
    from envs.reasoning import answer_baselines, make_task
    from llm.train import sample, setup

    scratch = tempfile.TemporaryDirectory(prefix="llm-pilot-")  # setup's --out: nothing kept
    cfg = replace(task_cfg, out=scratch.name)
    task, knobs = cfg.task, cfg.task_knobs
    closers: list[Any] = [scratch.cleanup]
    start = time.perf_counter()
    try:
        run = setup(cfg, closers)
        device = run.device
        src = run.source
        prompts, answers = list(src.eval_prompts), list(src.eval_answers)
        _, texts = sample(run, run.encode(prompts), 1, (cfg.seed, Stream.EVAL, 0), 0)
        passed = [src.verify(a, t) >= 1.0 for a, t in zip(answers, texts, strict=True)]
        anywhere = [a in numbers(t) for a, t in zip(answers, texts, strict=True)]
        forced = forced_greedy(run, prompts, answers)
    finally:
        for close in reversed(closers):
            close()
    p1 = sum(passed) / len(texts)
    base = answer_baselines(make_task(task, **knobs), answers)
    return {
        "task": task,
        "knobs": ",".join(f"{k}={v}" for k, v in sorted(knobs.items())),
        "prompts": len(texts),
        "pass_at_1": p1,
        "answer_anywhere": sum(anywhere) / len(texts),
        "forced_greedy": forced,
        "group_signal": 1 - (1 - p1) ** cfg.group_size,
        "constant": base["constant"],
        "prior": base["prior"],
        "target": max(base["constant"], base["prior"]) + WIDE * MARGINS["final_pass"],
        "example": f"{prompts[0]!r} -> {texts[0][:60]!r} (answer {answers[0]})",
        "seconds": time.perf_counter() - start,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
    }


def check_out(out: str) -> Path:
    """``--out`` before any work: a file path (not a folder) in a folder that exists or can be
    created, and that can be written; else a ``ValueError`` naming ``--out``."""
    path = Path(out)
    if path.is_dir():
        raise ValueError(
            f"--out {out} is a folder; give the CSV file's path (e.g. {out}/pilot.csv)"
        )
    prepare_out_dir(path.parent, f"--out {out}: its folder", sub=".")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"--out {out} cannot be written (no permission)")
    return path


def task_configs(base: TrainConfig, specs: list[str]) -> list[TrainConfig]:
    """One :class:`TrainConfig` per ``--tasks`` entry, checked as far as is cheap (task, knobs,
    settings, device, model) before any model is loaded; a ``ValueError`` names the argument."""
    from envs.reasoning import make_task
    from llm.model import check_model

    configs = []
    for spec in specs:
        name, knobs = parse_task(spec)
        try:
            make_task(name, **knobs)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--tasks {spec!r}: {exc}") from None
        cfg = replace(base, task=name, task_knobs=knobs)
        cfg.validate()
        configs.append(cfg)
    if base.device != "auto":
        check_device(base.device)
    check_model(base.model, offline=True)
    return configs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(prog="python -m llm.pilot", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="tiny, smollm2-135m, a folder, ...")
    parser.add_argument("--tasks", nargs="+", required=True, help="task[:knob=value,...] ...")
    parser.add_argument("--prompts", type=int, default=64, help="held-out problems per task")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8, help="G of group_signal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--out", default=DEFAULT_OUT, help="CSV path (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.prompts < 1:
            raise ValueError(f"--prompts must be >= 1, got {args.prompts}")
        if args.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {args.seed}")
        base = TrainConfig(
            model=args.model,
            offline=True,
            eval_prompts=args.prompts,
            eval_every=1,
            steps=1,
            max_new_tokens=args.max_new_tokens,
            group_size=args.group_size,
            seed=args.seed,
            device=args.device,
            progress=False,
            save_model=False,
        )
        configs = task_configs(base, args.tasks)
        out = check_out(args.out)  # last of the checks: it creates the folder
        rows = [pilot_task(cfg) for cfg in tqdm(configs, desc="pilot")]
    except ValueError as exc:  # bad input: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    frame = pd.DataFrame(rows).assign(
        model=args.model,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        date=datetime.date.today().isoformat(),
        command="python -m llm.pilot " + shlex.join(sys.argv[1:] if argv is None else argv),
    )
    tmp = out.with_name(out.name + ".tmp")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, out)  # atomic: an interrupted write leaves the previous file
    cols = ["task", "knobs", "pass_at_1", "group_signal", "constant", "prior", "target"]
    print(frame[cols].round(3).to_string(index=False))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
