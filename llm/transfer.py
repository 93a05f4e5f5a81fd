"""The transfer study: do the clipping rules rank the same on a bandit, a tiny transformer and a real LLM?

The sandbox's promise is that a finding on a softmax bandit or a tiny transformer transfers to LLM
training, because the objective code is identical. This module runs one rule set on four rungs,
with the same off-policy structure everywhere (mu = epochs x minibatches > 1, so the importance
ratio leaves 1 and the rules act) and the same metric names:

============== =================================================================================
rung           what trains, and what its ``pass_rate`` is
============== =================================================================================
bandit_exact   the expected-gradient flow (:func:`sandbox.exact.exact_flow`) on the contextual
               bandit ``mixed`` (8 prompts from unsolvable to always solved), exact finite-group
               GRPO advantage, epochs x minibatches inner updates; ``pass_rate`` = exact expected
               reward. Deterministic: one seed.
bandit_sampled the sampled trainer (:func:`sandbox.train.run_bandit`) on the same bandit, groups of
               G, ``inner_seeds`` i.i.d. replicates per seed; ``pass_rate`` = exact expected
               reward of pi_old, mean over the replicates
tiny_tf        tiny transformers (:func:`sandbox.train.train_sequence`) trained from scratch on
               ``bits`` reverse-3; ``pass_rate`` = the step's sampled pass rate, mean over
               replicates
llm            :func:`llm.train.train` on SmolLM2-135M-Instruct (``--model smollm2-135m``),
               addition through the chat template (1-digit operands on CPU: held-out pass@1
               starts near 0.16, so groups carry signal from step 1; 2-digit on GPU, where it
               starts near 0.02); ``pass_rate`` = held-out pass@1
               (``eval_pass@1``) at every evaluation. ``--quick`` uses the 2-layer ``tiny`` Llama.
============== =================================================================================

Every rung also logs ``train_reward`` (the step's batch: sampled, or exact for the flow),
``clip_low_frac``, ``clip_high_frac`` (the objective's own Z_lo/Z_hi shares), ``rescue_frac``
(NSR: share of clipped tokens rescued) and ``entropy``.

Per (rung, rule, seed) the *score* is the mean ``pass_rate`` over the run's logged points after
step 0 (an area under the learning curve: it rewards speed and does not saturate as fast as the
final value; ``final`` is kept too). The rank agreement of two rungs is Kendall's tau-b between
their rule means, with a 95% percentile bootstrap interval over seeds (seeds resampled with
replacement within each rung, the same draw for every rule, so within-seed pairing is kept).

Outputs in ``--out`` (default ``runs/transfer-<profile>``: a default run never writes into the
committed evidence in ``results/transfer``): ``parts/<rung>__<rule>__s<seed>.parquet``,
one per finished run, written atomically (an interrupted study resumes and recomputes nothing
finished; an interrupted LLM run restarts from its step 0). A folder whose ``config.json`` records
other settings (anything but which rules, rungs and seeds run) is refused, naming the change:
its parts were made with those settings and are never reported as this run's (``--force``
deletes them and recomputes). ``--tables-only`` rebuilds the tables from every part present, e.g.
LLM parts copied back from a GPU machine, or the committed study:
``python -m llm.transfer --tables-only --out results/transfer``. ``results.parquet`` (tidy: one row
per rung, rule, seed, step), ``scores.csv`` (per run), ``summary.csv`` (per rung and rule: mean,
standard error, seeds), ``agreement.csv`` (tau and interval per pair of rungs) and
``transfer.png`` (rules x rungs), each rewritten only when its bytes change (the same parts give
the same bytes); ``provenance.json`` (the command, date, device and its model, torch, threads and
git commit of each run that computed parts, and of the last command that changed the tables).

Run (from a checkout: ``PYTHONPATH=. python -m llm.transfer ...``)::

    python -m llm.transfer --quick                      # a smoke test, ~10 s on 2 cores, tiny models
    python -m llm.transfer                              # CPU: <= 90 min on 2 cores (see PROFILES)
    python -m llm.transfer --profile gpu --device cuda  # all rules x 3 seeds on one GPU
    python -m llm.transfer --tables-only --out results/transfer   # the committed tables

It lives in ``llm`` (not ``sandbox``) because it drives ``llm.train``; ``sandbox`` never imports
``llm``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from llm.runs import RunSpec
from sandbox.configs import (
    add_arguments,
    add_study_arguments,
    arg,
    check_device,
    profile_settings,
)
from sandbox.experiments import agreement
from sandbox.experiments.agreement import run_scores, summarise
from sandbox.experiments.planner import Job, RunFolder
from sandbox.experiments.results import (
    part_name,
    read_parts,
    recording_tables,
    sorted_rows,
    write_csv,
    write_parquet_if_changed,
)
from sandbox.experiments.runs import objective_of, run_specs
from sandbox.streams import with_rng

RULES = ("grpo", "dapo", "gspo", "nsr_dapo", "dgpo", "cispo_trl", "sapo")
RUNGS = ("bandit_exact", "bandit_sampled", "tiny_tf", "llm")
METRICS = ("pass_rate", "train_reward", "clip_low_frac", "clip_high_frac", "rescue_frac", "entropy")


@dataclass
class TransferConfig:
    """Settings of the study; every field is a flag of ``python -m llm.transfer``."""

    rules: list[str] = arg(list(RULES), "rules")
    rungs: list[str] = arg(list(RUNGS), "rungs")
    seeds: int = arg(2, "seeds per (rung, rule); exact flow: 1")
    llm_rules: list[str] | None = arg(
        None,
        "rules on the llm rung (the cpu profile's four; --rules narrows them; the gpu and quick "
        "profiles: all --rules)",
    )
    epochs: int = arg(2, "mu: passes over each batch (all rungs)")
    minibatches: int = arg(2, "optimizer steps per epoch (all)")
    group_size: int = arg(8, "G on the toy rungs")
    # bandit rungs
    bandit_setting: str = arg("mixed", "envs.make_bandit_suite name")
    bandit_steps: int = arg(40, "bandit steps")
    bandit_lr: float = arg(4.0, "SGD learning rate on the logits")
    bandit_prompts_per_step: int = arg(4, "groups per bandit step")
    inner_seeds: int = arg(16, "replicates per seed (bandit)")
    # tiny transformer rung
    tf_steps: int = arg(40, "tiny-transformer steps")
    tf_seeds: int = arg(4, "replicates per seed (tiny transformer)")
    tf_lr: float = arg(1e-3, "Adam learning rate (tiny transformer)")
    tf_prompts_per_step: int = arg(8, "prompts per tiny-transformer step")
    # llm rung
    model: str = arg("smollm2-135m", "llm.train --model")
    llm_digits: int = arg(1, "llm task: addition of N-digit numbers")
    llm_steps: int = arg(12, "llm steps")
    llm_prompts_per_step: int = arg(8, "llm prompts per step")
    llm_group_size: int = arg(4, "llm completions per prompt")
    llm_max_new_tokens: int = arg(16, "llm max new tokens")
    llm_lr: float = arg(2e-5, "llm learning rate")
    llm_eval_every: int = arg(4, "llm eval interval (steps)")
    llm_eval_prompts: int = arg(64, "llm held-out prompts")
    llm_eval_k: int = arg(1, "llm samples per held-out prompt")
    llm_extra: list[str] = arg(
        [], 'more llm.train flags, quoted after "=": --llm-extra="--kl-coef 0.01 --lr 1e-5"'
    )
    device: str = arg("cpu", "cpu | cuda (toy rungs and llm)")

    def validate(self) -> None:
        """``ValueError`` naming the first bad field."""
        for name in self.rules + (self.llm_rules or []):
            objective_of(name)  # ValueError listing the valid names
        for rung in self.rungs:
            if rung not in RUNGS:
                raise ValueError(f"--rungs: unknown rung {rung!r}; rungs: {', '.join(RUNGS)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
                raise ValueError(f"--{f.name.replace('_', '-')} must be > 0, got {value}")
        if self.epochs * self.minibatches < 2:
            raise ValueError("--epochs x --minibatches must be >= 2: on-policy no rule acts")
        check_device(self.device)
        if "llm" in self.rungs:  # before any rung runs: the llm rung is offline
            from llm.model import check_model

            check_model(self.model, offline=True)
            if self.llm_extra:
                from llm.train import parse_args

                said = io.StringIO()
                try:
                    with contextlib.redirect_stderr(said):
                        parse_args(llm_extra_flags(self))
                except SystemExit:  # argparse's usage text, then "prog: error: ..."
                    why = said.getvalue().strip().splitlines()[-1].split("error: ")[-1]
                    raise ValueError(
                        f"--llm-extra {self.llm_extra}: not llm.train flags ({why})"
                    ) from None

    def training_fields(self) -> dict[str, Any]:
        """What every finished part depends on besides its (rung, rule, seed), which its file
        name records: a folder's parts are reused only while these are unchanged. With them
        the toy trainers' random-number scheme (``rng``, :data:`sandbox.streams.RNG`): a folder
        made with another is refused."""
        skip = ("rules", "rungs", "seeds", "llm_rules")
        return with_rng({k: v for k, v in asdict(self).items() if k not in skip})


#: Named settings. ``cpu``: the real model fits 90 min on 2 cores (4 rules x 2 seeds on the llm
#: rung); ``gpu``: every rule x 3 seeds, bigger batches; ``quick``: a smoke test (~10 s on 2 cores).
PROFILES: dict[str, dict[str, Any]] = {
    "cpu": {"llm_rules": ["dapo", "gspo", "nsr_dapo", "dgpo"]},
    "gpu": {
        "seeds": 3,
        "device": "cuda",
        "llm_digits": 2,
        "llm_steps": 15,
        "llm_prompts_per_step": 32,
        "llm_group_size": 8,
        "llm_max_new_tokens": 32,
        "llm_lr": 5e-6,
        "llm_eval_every": 5,
        "llm_eval_prompts": 128,
        "llm_eval_k": 2,
    },
    "quick": {
        "rules": ["grpo", "nsr_dapo", "gspo"],
        "seeds": 2,
        "bandit_steps": 3,
        "inner_seeds": 4,
        "tf_steps": 2,
        "tf_seeds": 1,
        "tf_prompts_per_step": 2,
        "group_size": 4,
        "model": "tiny",
        "llm_steps": 1,
        "llm_prompts_per_step": 2,
        "llm_group_size": 2,
        "llm_max_new_tokens": 3,
        "llm_lr": 1e-3,
        "llm_eval_every": 1,
        "llm_eval_prompts": 2,
    },
}


def llm_extra_flags(config: TransferConfig) -> list[str]:
    """``--llm-extra`` as llm.train's argv: each value split like a shell line, so that
    ``--llm-extra="--kl-coef 0.01 --lr 1e-5"`` passes four words."""
    return [word for item in config.llm_extra for word in shlex.split(item)]


def run_spec(config: TransferConfig, rung: str, rule: str, seed: int, out: Path) -> RunSpec:
    """The run spec of one (rung, rule, seed): the rung is the run kind."""
    shared = dict(
        seed=seed,
        epochs=config.epochs,
        minibatches=config.minibatches,
        group_size=config.group_size,
        device=config.device,
    )
    if rung.startswith("bandit_"):  # the sampled rung: inner_seeds replicates per seed
        seeds, seed = (1, 0) if rung == "bandit_exact" else (config.inner_seeds, 1000 * seed)
        return RunSpec.make(
            rung,
            config.bandit_setting,
            rule,
            **{**shared, "seed": seed},
            seeds=seeds,
            steps=config.bandit_steps,
            prompts_per_step=config.bandit_prompts_per_step,
            optimizer="sgd",
            lr=config.bandit_lr,
        )
    if rung == "tiny_tf":
        return RunSpec.make(
            rung,
            "bits-reverse-3",
            rule,
            **{**shared, "seed": 1000 * seed},
            seeds=config.tf_seeds,
            steps=config.tf_steps,
            prompts_per_step=config.tf_prompts_per_step,
            lr=config.tf_lr,
            definition={"task": "bits", "op": "reverse", "length": 3},
        )
    train = dict(
        model=config.model,
        max_new_tokens=config.llm_max_new_tokens,
        eval_every=config.llm_eval_every,
        eval_prompts=config.llm_eval_prompts,
        eval_k=config.llm_eval_k,
        offline=True,
        save_model=False,
        progress=False,
        out=str(out / "llm_runs" / f"{rule}__s{seed}"),
        argv=llm_extra_flags(config),
    )
    return RunSpec.make(
        rung,
        f"addition-{config.llm_digits}",
        rule,
        **{**shared, "group_size": config.llm_group_size},
        steps=config.llm_steps,
        prompts_per_step=config.llm_prompts_per_step,
        lr=config.llm_lr,
        definition={"task": "addition", "digits": config.llm_digits},
        train=train,
    )


def jobs(config: TransferConfig) -> list[tuple[str, str, int]]:
    """Every (rung, rule, seed) the study runs, cheapest rungs first."""
    out = []
    for rung in [r for r in RUNGS if r in config.rungs]:
        rules = (config.llm_rules or config.rules) if rung == "llm" else config.rules
        seeds = 1 if rung == "bandit_exact" else config.seeds
        out += [(rung, rule, seed) for seed in range(seeds) for rule in rules]
    return out


#: Per rung, which of the run kind's columns the study's ``pass_rate`` and ``train_reward`` are.
RUNG_METRICS = {
    "bandit_exact": {"pass_rate": "expected_reward", "train_reward": "expected_reward"},
    "bandit_sampled": {"pass_rate": "expected_reward", "train_reward": "reward"},
    "tiny_tf": {"pass_rate": "pass_rate", "train_reward": "reward"},
    "llm": {"pass_rate": "pass_rate", "train_reward": "reward"},
}


def run_job(config: TransferConfig, rung: str, rule: str, seed: int, out: Path) -> pd.DataFrame:
    """One run as tidy rows: rung, rule, seed, step and :data:`METRICS` (NaN where undefined).

    Steps count updates: step 0 is the initial policy (the llm's evaluation before training),
    so the toy kinds' 1-based steps move down by one; replicates are averaged per step."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    [frame] = run_specs([run_spec(config, rung, rule, seed, out)])
    for name, column in RUNG_METRICS[rung].items():
        frame[name] = frame.get(column)
    if rung != "llm":
        frame["step"] -= 1
        frame = frame.groupby("step", as_index=False).mean(numeric_only=True)
    tidy = pd.DataFrame({"rung": rung, "rule": rule, "seed": seed, "step": frame["step"]})
    for name in (*METRICS, "ratio_max", "ratio_min"):
        tidy[name] = frame[name].astype(float) if name in frame else np.nan
    tidy["seconds"] = time.perf_counter() - start  # wall time of the whole run
    return tidy


def _job(config: TransferConfig, rung: str, rule: str, seed: int, out: Path) -> list:
    return [run_job(config, rung, rule, seed, out)]


def run_study(
    config: TransferConfig, out: str | Path, *, progress: bool = True, force: bool = False
) -> pd.DataFrame:
    """Run (or resume) the study into ``out``; writes every table and the figure. A folder whose
    parts were made with other settings is refused (``force``: its parts are deleted first)."""
    config.validate()
    folder = RunFolder(
        out,
        config.training_fields(),
        contents=with_rng(asdict(config)),
        force=force,
        device=config.device,
    )
    parts = {job: part_name(job[0], job[1], f"s{job[2]}") for job in jobs(config)}
    todo = [
        Job("/".join(map(str, j)), (p,), (config, *j, folder.out))
        for j, p in parts.items()
        if not folder.done(p)
    ]
    folder.run(_job, todo, total=len(parts), progress=progress, desc="transfer")
    wanted = set(parts.values())
    results = read_parts(folder.parts)
    keep = [
        part_name(r, u, f"s{s}") in wanted
        for r, u, s in zip(results["rung"], results["rule"], results["seed"], strict=True)
    ]
    results = results[keep].reset_index(drop=True)
    write_tables(results, folder.out)
    return results


def write_tables(results: pd.DataFrame, out: Path) -> None:
    """``results.parquet``, ``scores.csv``, ``summary.csv``, ``agreement.csv``, the figure: the
    same bytes from the same rows in any order, a file rewritten only when its bytes change, the
    ``tables`` provenance recorded only then (:mod:`sandbox.experiments.results`)."""
    with recording_tables(out):
        results = sorted_rows(results, agreement.ROW_KEYS)
        write_parquet_if_changed(results, out / "results.parquet")
        scores = run_scores(results)
        write_csv(scores, out / "scores.csv")
        summary = summarise(scores)
        write_csv(summary, out / "summary.csv")
        table = rank_agreement(scores)
        write_csv(table, out / "agreement.csv")
        plot(summary, table, out / "transfer.png")


def rank_agreement(scores: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
    """:func:`sandbox.experiments.agreement.rank_agreement` with the rungs in ladder order."""
    return agreement.rank_agreement(scores, order=RUNGS, **kwargs)


def plot(summary: pd.DataFrame, agreement_table: pd.DataFrame, path: Path) -> None:
    """:func:`sandbox.experiments.agreement.plot` with the rungs in ladder order."""
    agreement.plot(summary, agreement_table, path, order=RUNGS)


def parse_args(argv: list[str] | None = None) -> tuple[TransferConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m llm.transfer", description=__doc__.split("\n\n")[0]
    )
    add_study_arguments(parser, PROFILES, "transfer", "results/transfer")
    cpu = TransferConfig(**PROFILES["cpu"])  # the help shows the cpu profile's values
    shown = {f.name: str(getattr(cpu, f.name)) for f in fields(TransferConfig)}
    add_arguments(parser, TransferConfig, unset=True, shown=shown)  # unset: the profile decides
    args = parser.parse_args(argv)
    settings = profile_settings(args, TransferConfig, PROFILES, "transfer")
    if settings.get("llm_rules") is not None and args.rules is not None and not args.llm_rules:
        settings["llm_rules"] = [r for r in settings["llm_rules"] if r in args.rules]
    return TransferConfig(**settings), args


def main(argv: list[str] | None = None) -> int:
    try:
        config, args = parse_args(argv)
        if not args.tables_only:  # rebuilding tables needs neither the model nor the device
            config.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        if args.tables_only:
            if not any((Path(args.out) / "parts").glob("*.parquet")):
                raise ValueError(f"--tables-only: no result parts in {args.out}/parts")
            write_tables(read_parts(Path(args.out) / "parts"), Path(args.out))
        else:
            run_study(config, args.out, progress=not args.no_progress, force=args.force)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = pd.read_csv(os.path.join(args.out, "summary.csv"))
    agreement = pd.read_csv(os.path.join(args.out, "agreement.csv"))
    with pd.option_context("display.width", 200):
        print(summary.round(4).to_string(index=False))
        if agreement.empty:
            print("no rank agreement: it needs two rungs with at least 3 rules in common")
        else:
            print(agreement.round(3).to_string(index=False))
    print(
        f"{time.perf_counter() - start:.0f} s; wrote {args.out}/results.parquet, scores.csv, "
        f"summary.csv, agreement.csv, transfer.png"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
