"""The claims study CLI: the seed papers' claims (:mod:`sandbox.experiments.claims`) tested on
every rung, calibrated and paired by seed (:mod:`sandbox.experiments.study`), with the ``llm``
rung added here (``sandbox`` never imports ``llm``).

Profiles: ``quick`` (CI-sized smoke: 23 s on the project's 2-core CPU, 2026-11-26; the tiny Llama on the llm rung), ``cpu`` (the toy
rungs at full power: 16 paired seeds per rule), ``gpu`` (adds the llm rung on SmolLM2-135M,
8 paired seeds per rule). Flags override a profile's values.

The llm rung trains one ``llm.train`` run per (rule, paired seed). Its ``ensemble`` setting
(``--llm-ensemble K``, default 1: separate runs) runs up to K seeds of one rule as one job, one
:func:`llm.ensemble.train_ensemble` (the training forward and backward batched over the K
models; rollouts still one model after another). Each seed is still its own part with the rows
its separate run gives (to float rounding), so K changes neither the tables nor resumption: a
folder's parts are reused whatever K made them, and an interrupted job loses only its own K
seeds. What K buys on a GPU is unmeasured; the K models' training activations share one device
(no gradient checkpointing inside the ensemble).

Outputs in ``--out`` (default ``runs/claims-<profile>``; the committed study is
``results/claims``): ``parts/`` (one parquet per finished run, written atomically: an interrupted
study resumes and recomputes nothing finished), ``config.json`` (the settings, grids included,
and each rung's calibrated point: a folder made with other settings is refused, ``--force``
recomputes; ``--tables-only`` builds from the recorded calibrated point only; other or fewer
rules or rungs *add to* the folder's study, whose tables cover the union), ``results.parquet``,
``calibration.csv``,
``scores.csv``, ``summary.csv``, ``ledger.csv``, ``power.csv``, ``agreement.csv``,
``calibration.png``, ``mechanism.png``; with ``--doc PATH`` the write-up (docs/claims.md).
While it runs, ``llm_scratch/`` holds the llm runs in progress (checkpoints every
``checkpoint_every`` steps and on SIGTERM; a run goes once its part is written): a command cut
by a time limit, e.g. ``timeout 570 python -m llm.claims --profile gpu ...`` on a machine with
10-minute commands, continues each cut run mid-way when run again::

    python -m llm.claims --quick                                   # smoke, ~25 s on 2 cores
    python -m llm.claims --profile cpu --out results/claims        # the toy rungs, CPU
    python -m llm.claims --profile gpu --device cuda --out results/claims   # + the llm rung
    python -m llm.claims --tables-only --out results/claims --doc docs/claims.md
    python -m llm.claims --quick --claim mine:grpo>gspo:reward_auc   # a claim of your own

Claims of your own: ``--claim NAME:A>B[:metric[:margin]]`` (repeatable) or ``--claims FILE``
(TOML/YAML records; CONTRIBUTING.md, "Adding a claim"): their rules join ``--rules`` and they get
ledger rows like the papers'. Every setting, the llm rung's ``--llm KEY=VALUE`` ones included, is
checked before anything runs or ``config.json`` is written (one line, exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

import llm.runs  # registers the llm run kind, in workers too
from sandbox.configs import add_arguments, add_study_arguments, key_values, profile_settings
from sandbox.experiments.claims import claim_record, parse_claim, read_claims
from sandbox.experiments.planner import interrupted_line
from sandbox.experiments.pool import terminate_raises
from sandbox.experiments.runs import RunSpec, objective_of
from sandbox.experiments.study import (
    Rung,
    StudyConfig,
    rebuild_tables,
    register_rung,
    run_study,
    task_bounds,
)

#: The llm rung's settings (``StudyConfig.extra`` overrides them).
LLM_DEFAULTS: dict[str, Any] = {
    "model": "smollm2-135m",
    # the tiny_tf rung's task, through the chat template; chosen by `python -m llm.pilot`
    # (results/llm_pilot/pilot.csv): SmolLM2-135M solves 4.7% of it at step 0 (a group of 8 has a
    # success 32% of the time), against 0 of 64 on 3-digit addition and on 3-term 2-digit addition
    "task": "mod_arith",
    "task_knobs": {"steps": 2},
    "steps": 100,
    "lrs": [2e-6, 5e-6, 1e-5, 2e-5],
    "prompts_per_step": 32,
    "group_size": 8,
    "max_new_tokens": 16,
    "eval_every": 50,
    "eval_prompts": 512,
    "eval_k": 1,
    "seeds": 8,
    "ensemble": 1,  # paired seeds of one rule per job (one llm.ensemble); 1: separate runs
    # resumable runs: each run trains in <scratch>/<llm.runs.scratch_name(spec)>, checkpoints
    # every checkpoint_every steps (and on SIGTERM) and resumes from there when rerun; the CLI
    # sets scratch to <out>/llm_scratch (None: a temporary folder, a cut run restarts)
    "scratch": None,
    "checkpoint_every": 10,
}

#: llm rung settings that choose how its runs execute, not what they compute (parts made with
#: any value of them are the same parts: ``Rung.execution``).
LLM_EXECUTION = ("ensemble", "scratch", "checkpoint_every")


def llm_settings(config: StudyConfig) -> dict[str, Any]:
    return {**LLM_DEFAULTS, **config.extra.get("llm", {})}


def _int(low: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"must be an integer >= {low}")
        return value

    return check


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("must be a non-empty string")
    return value


def _lrs(value: Any) -> list[float]:
    values = value if isinstance(value, list | tuple) else [value]
    ok = values and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        for v in values
    )
    if not ok:
        raise ValueError("must be a non-empty list of numbers > 0, e.g. lrs=[1e-5,2e-5]")
    return [float(v) for v in values]


def _epochs(value: Any) -> list[int]:
    values = value if isinstance(value, list | tuple) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError("must be a non-empty list of integers >= 1, e.g. epochs=[2,4]")
    if min(values) < 1:
        raise ValueError("must be a non-empty list of integers >= 1, e.g. epochs=[2,4]")
    return list(values)


def _knobs(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be a mapping, e.g. task_knobs={'digits':2}")
    return value


def _scratch(value: Any) -> str | None:
    return None if value is None else _text(value)


#: Each llm rung setting's check: its typed value, or a ``ValueError`` saying what it must be.
LLM_CHECKS: dict[str, Any] = {
    "model": _text,
    "task": _text,
    "task_knobs": _knobs,
    "steps": _int(1),
    "lrs": _lrs,
    "prompts_per_step": _int(1),
    "group_size": _int(2),
    "max_new_tokens": _int(1),
    "eval_every": _int(0),
    "eval_prompts": _int(1),
    "eval_k": _int(1),
    "seeds": _int(1),
    "ensemble": _int(1),
    "scratch": _scratch,
    "checkpoint_every": _int(0),
    "epochs": _epochs,
}


def typed_llm_settings(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values`` (llm rung settings) checked and typed; a one-line ``ValueError`` naming
    ``where`` and the first unknown key or bad value."""
    unknown = sorted(set(values) - set(LLM_CHECKS))
    if unknown:
        raise ValueError(f"{where}: unknown settings {unknown}; known: {', '.join(LLM_CHECKS)}")
    out = {}
    for key, value in values.items():
        try:
            out[key] = LLM_CHECKS[key](value)
        except ValueError as exc:
            raise ValueError(f"{where} {key} {exc}, got {value!r}") from None
    return out


def check_llm(config: StudyConfig) -> None:
    """The llm rung's settings (:data:`LLM_CHECKS`), its task and its model, before anything
    runs (the model offline: a Hub id must be in the local cache)."""
    from envs.reasoning import make_task
    from llm.model import check_model

    s = typed_llm_settings(llm_settings(config), "--llm")
    try:
        make_task(s["task"], **s["task_knobs"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--llm task, task_knobs: {exc}") from None
    try:
        check_model(s["model"], offline=True)
    except ValueError as exc:  # its message names llm.train's flag
        raise ValueError(str(exc).replace("--model ", "--llm model=", 1)) from None


def llm_epochs(config: StudyConfig) -> list[int]:
    """The llm rung's mu grid: ``extra["llm"]["epochs"]``, else the study's ``epochs``."""
    return [int(e) for e in llm_settings(config).get("epochs", config.epochs)]


def llm_members(config: StudyConfig) -> int:
    """The llm rung's ``ensemble`` setting: paired seeds of one rule per job (>= 1)."""
    k = llm_settings(config)["ensemble"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"ensemble (--llm-ensemble) must be an integer >= 1, got {k!r}")
    return k


def llm_spec(
    config: StudyConfig, rule: str, lr: float, seeds: int, steps: int, seed: int
) -> RunSpec:
    """One llm.train run (one seed: the seed fixes prompts, eval set and first rollouts), with the
    mechanism probes on as on the toy rungs (``study._shared``): ``entropy_law`` always,
    ``grad_noise`` for a rule with a deterministic counterpart."""
    s = llm_settings(config)
    train = {
        "model": s["model"],
        "max_new_tokens": s["max_new_tokens"],
        "eval_every": s["eval_every"],
        "eval_prompts": s["eval_prompts"],
        "eval_k": s["eval_k"],
        "offline": True,
        "save_model": False,
        "progress": False,
        "entropy_law": True,  # mechanism check (a): the step's first 8 completions
    }
    if objective_of(rule).expectation() is not None:  # mechanism check (c): NSR vs its decay
        train["grad_noise"] = True
    if not config.paper_aggregation:
        train["aggregation"] = "token-mean"
    if s["scratch"] is not None:  # resumable (llm.runs); the spec's execution keys
        train["scratch"] = str(s["scratch"])
        train["checkpoint_every"] = int(s["checkpoint_every"])
    return RunSpec.make(
        "llm",
        "-".join([s["task"], *(f"{k}{v}" for k, v in sorted(s["task_knobs"].items()))]),
        rule,
        seed=seed,
        steps=steps,
        lr=lr,
        epochs=llm_epochs(config)[0],  # the job's own mu replaces it (study.job_spec)
        minibatches=config.minibatches,
        group_size=s["group_size"],
        prompts_per_step=s["prompts_per_step"],
        device=config.device,
        definition={"task": s["task"], **s["task_knobs"]},
        train=train,
    )


def llm_bounds(config: StudyConfig) -> Any:
    """The llm rung's ceiling (1) and answer baseline on the held-out sets its paired seeds
    score (``llm.data.task_source``'s, one per seed), for the headroom rule."""
    from envs.reasoning import make_task
    from llm.data import task_source

    s = llm_settings(config)
    sets = [
        task_source(s["task"], s["task_knobs"], "auto", seed, s["eval_prompts"]).eval_answers
        for seed in range(s["seeds"])
    ]
    return task_bounds(make_task(s["task"], **s["task_knobs"]), sets)


register_rung(
    Rung(
        "llm",
        llm_spec,
        lambda c: llm_settings(c)["lrs"],
        lambda c: llm_settings(c)["steps"],
        replicates=False,
        seeds=lambda c: llm_settings(c)["seeds"],
        epochs=llm_epochs,
        columns=(("pass_rate", "pass_rate"), ("train_reward", "reward")),
        members=llm_members,
        execution=LLM_EXECUTION,
        check=check_llm,
        written=llm.runs.remove_scratch,  # kept until the run's part is written
        bounds=llm_bounds,
    )
)

PROFILES: dict[str, dict[str, Any]] = {
    "cpu": {},
    "gpu": {"rungs": ["bandit_exact", "bandit_sampled", "tiny_tf", "llm"], "device": "cuda"},
    "quick": {
        "rules": ["dapo", "nsr_dapo", "grpo", "gspo"],
        "rungs": ["bandit_exact", "bandit_sampled", "tiny_tf", "llm"],
        "seeds": 3,
        "calib_seeds": 2,
        "calib_steps": 2,
        "bandit_steps": 4,
        "bandit_lrs": [1.0, 4.0],
        "tf_task": "bits",
        "tf_knobs": {"op": "reverse", "length": 3},
        "tf_steps": 2,
        "tf_prompts_per_step": 2,
        "tf_lrs": [1e-2],
        "tf_eval_prompts": 8,
        "tf_eval_k": 1,
        "group_size": 4,
        "extra": {
            "llm": {
                "model": "tiny",
                "task": "addition",
                "task_knobs": {"digits": 1},
                "steps": 1,
                "lrs": [1e-3],
                "prompts_per_step": 2,
                "group_size": 2,
                "max_new_tokens": 3,
                "eval_every": 1,
                "eval_prompts": 2,
                "seeds": 3,
            }
        },
    },
}


def parse_args(argv: list[str] | None = None) -> tuple[StudyConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m llm.claims", description=__doc__.split("\n\n")[0]
    )
    add_study_arguments(parser, PROFILES, "claims", "results/claims")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: up to 4)")
    parser.add_argument("--doc", default=None, help="also write the markdown write-up to this path")
    parser.add_argument(
        "--llm-ensemble",
        type=int,
        default=None,
        metavar="K",
        help="llm rung: up to K paired seeds of one rule per job, trained as one llm.ensemble "
        "(default: the profile's, else 1 = separate runs; the parts are the same either way)",
    )
    parser.add_argument(
        "--llm",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help=f"llm rung settings over the profile's ({', '.join([*LLM_DEFAULTS, 'epochs'])}), "
        "e.g. --llm lrs=[1e-5,2e-5,5e-5] epochs=[2,4]",
    )
    parser.add_argument(
        "--claim",
        action="append",
        default=[],
        metavar="NAME:A>B[:METRIC[:MARGIN]]",
        help="a claim of your own (repeatable): rule A beats rule B (A<B: A is lower) on METRIC "
        "(final_pass, reward_auc or final_entropy; default final_pass) by MARGIN (default: the "
        "study's for the metric); its rules join --rules",
    )
    parser.add_argument(
        "--claims",
        metavar="FILE",
        default=None,
        help="claims of your own from a .toml/.yaml file: a list 'claims' of records (name, "
        "rule_a, rule_b, direction, metric; margin, source, where, statement optional)",
    )
    add_arguments(parser, StudyConfig, unset=True, skip=("tf_knobs", "extra", "claims", "rng"))
    args = parser.parse_args(argv)
    settings = profile_settings(args, StudyConfig, PROFILES, "claims")
    given = typed_llm_settings(key_values(args.llm, "--llm"), "--llm")  # over the profile's
    if args.llm_ensemble is not None:  # shorthand for --llm ensemble=K
        if args.llm_ensemble < 1:
            raise ValueError(f"--llm-ensemble must be >= 1, got {args.llm_ensemble}")
        given["ensemble"] = args.llm_ensemble
    rungs = settings.get("rungs", StudyConfig().rungs)
    if given and "llm" not in rungs and not args.tables_only:
        flag = "--llm " + " ".join(sorted(given)) if args.llm else "--llm-ensemble"
        raise ValueError(f"{flag}: does not apply without the llm rung (--rungs ... llm)")
    if given:
        extra = dict(settings.get("extra", {}))
        extra["llm"] = {**extra.get("llm", {}), **given}
        settings["extra"] = extra
    claims = [parse_claim(text) for text in args.claim]
    claims += read_claims(args.claims) if args.claims else []
    if claims:  # their rules join the study's
        settings["claims"] = [claim_record(c) for c in claims]
        rules = settings.get("rules", StudyConfig().rules)
        settings["rules"] = list(dict.fromkeys([*rules, *(r for c in claims for r in c.rules)]))
    return StudyConfig(**settings), args


#: The llm rung's resumable scratch folder in the study's ``--out`` (unless ``--llm scratch=DIR``).
SCRATCH = "llm_scratch"


def with_scratch(config: StudyConfig, out: Path) -> tuple[StudyConfig, Path | None]:
    """``config`` with the llm rung's ``scratch`` set (``out/llm_scratch`` unless given), so an
    llm run cut by a command's time limit (``timeout 570 python -m llm.claims ...``) resumes
    from its checkpoint when the command is run again; the folder (None without the llm rung)."""
    if "llm" not in config.rungs:
        return config, None
    settings = {**config.extra.get("llm", {})}
    if settings.get("scratch") is None:
        settings["scratch"] = str(out / SCRATCH)
    extra = {**config.extra, "llm": settings}
    return dataclasses.replace(config, extra=extra), Path(settings["scratch"])


def interrupted(signum: int, out: Path) -> int:
    """The resume hint after a signal; the exit status 128 + ``signum``."""
    kept = f"finished runs are parts in {out / 'parts'}"
    if (out / SCRATCH).is_dir():
        kept += f", cut llm runs checkpoints in {out / SCRATCH}"
    print("\n" + interrupted_line(signum, kept), file=sys.stderr)
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    try:
        config, args = parse_args(argv)
        if not args.tables_only:
            config.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    out = Path(args.out)
    try:
        if args.tables_only:  # the recorded study at its recorded calibration, and any --claim
            rebuild_tables(out, config)
        else:
            config, scratch = with_scratch(config, out)
            with terminate_raises():  # SIGTERM between runs: the resume line, as Ctrl-C
                run_study(
                    config,
                    out,
                    progress=not args.no_progress,
                    force=args.force,
                    workers=args.workers,
                )
            if scratch == out / SCRATCH:  # every run is a part now: what is left is stale
                shutil.rmtree(scratch, ignore_errors=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in the pool (its Terminated)
        return interrupted(getattr(exc, "signum", signal.SIGINT), out)
    except SystemExit as exc:  # llm.train in this process: checkpointed on a signal, exits 128+sig
        if isinstance(exc.code, int) and 128 < exc.code < 128 + signal.NSIG:
            return interrupted(exc.code - 128, out)
        raise
    try:
        ledger = pd.read_csv(out / "ledger.csv")
    except pd.errors.EmptyDataError:  # rules that make no claim (e.g. --rules dapo)
        ledger = pd.DataFrame()
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        cols = ["claim", "rung", "estimate", "lo", "hi", "seeds", "verdict"]
        print(ledger[cols].round(4).to_string(index=False) if len(ledger) else "empty ledger")
    if args.doc:
        from sandbox.study.page import write_doc

        try:
            write_doc(out, Path(args.doc))
        except ValueError as exc:  # a placeholder the tables cannot fill
            print(f"error: --doc: {exc}", file=sys.stderr)
            return 2
    print(f"{time.perf_counter() - start:.0f} s; wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
