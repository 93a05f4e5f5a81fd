"""The claims study's command line, generic over the registered rungs and sections (``python -m
llm.claims`` is it with the ``llm`` rung registered): the study's own flags from
:class:`~.rungs.StudyConfig`, one flag per section setting (``--<section>-<field>``), named
profiles, ``--claim``/``--claims``, ``--tables-only``, ``--doc``, ``--time-budget``, and the
resume line after a signal. A bad, unknown or removed flag is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import shutil
import signal
import sys
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from sandbox.configs import (
    CommandParser,
    add_arguments,
    add_study_arguments,
    base_type,
    check_number,
    flag,
    flag_values,
    positive_int,
    profile_settings,
)
from sandbox.experiments.planner import BACKENDS, answer_signal
from sandbox.experiments.pool import own_command
from sandbox.experiments.signals import terminate_raises

from .claims import claim_record, parse_claim, read_claims
from .plan import BudgetSpent, rebuild_tables, run_study
from .rungs import RUNGS, SECTIONS, StudyConfig

#: A hook run before the study: ``prepare(config, out) -> (config, folder or None)``; the folder
#: (the llm rung's checkpoints) is named by the resume line and removed once every run is a part.
Prepare = Callable[[StudyConfig, Path], tuple[StudyConfig, Path | None]]


class StudyParser(CommandParser):
    """The project's argument parser (no abbreviations, ``-1e-3`` a value) whose errors are one
    line (``error: ...``, exit 2)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def section_flags(name: str) -> list[str]:
    """The flag ``--<section>-<field>`` of each setting of section ``name``."""
    return [flag(f"{name}_{f.name}") for f in dataclasses.fields(SECTIONS[name])]


def removed_flags() -> dict[str, str]:
    """Flags of earlier versions and what replaced each (one line)."""
    seeds = ", ".join(flag(f"{name}_seeds") for name in SECTIONS)
    out = {"--seeds": f"--seeds is gone: paired seeds are set per rung ({seeds})"}
    for name in SECTIONS:
        flags = section_flags(name)
        one = f"one flag per setting: {', '.join(flags)}"
        out[f"--{name}"] = f"--{name} KEY=VALUE is gone: {one}"
        out[f"--{name}-extra"] = f"--{name}-extra is gone: {one}"
        if flag(f"{name}_lrs") in flags:
            out[f"--{name}-lr"] = f"--{name}-lr is gone: the step-size grid is --{name}-lrs"
    return out


def _rungs_of(section: str) -> str:
    return ", ".join(r.name for r in RUNGS.values() if r.section == section) or "none"


def build_parser(prog: str, description: str, profiles: Mapping[str, Any]) -> StudyParser:
    """The study's parser: the shared study flags, the study's own settings, one flag per
    section setting (default None: only what is given is set)."""
    parser = StudyParser(prog=prog, description=description)
    add_study_arguments(parser, dict(profiles), "claims", "results/claims")
    parser.add_argument(
        "--workers",
        type=positive_int,  # 0 and -3 were taken for the default, as compare's refuses
        default=None,
        help="processes (default: up to 4)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="local process pool, or Ray tasks (one per unit; a GPU each with --device cuda): "
        "--out, and the llm rung's scratch, on a filesystem every node mounts; no --time-budget",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (e.g. auto or ray://host:10001); default: start a local Ray "
        "instance with --workers CPUs",
    )
    parser.add_argument("--doc", default=None, help="also write the markdown write-up to this path")
    parser.add_argument(
        "--prune",
        action="store_true",
        help="with --tables-only: also delete the parts of OUT the recorded study does not read "
        "(runs of superseded settings, kept apart by their names); provenance.json records it",
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
    parser.add_argument(
        "--time-budget",
        default=None,
        metavar="SECONDS",
        help="run only the next units (one rule x one group of seeds) that fit in SECONDS: no "
        "unit starts that would not end in time (the longest of its kind so far), units still "
        "running at the end are stopped as on SIGTERM (llm runs keep their checkpoint), every "
        f"finished unit is a part; exit {BUDGET_EXIT} with the count left and the command to go on",
    )
    add_arguments(parser, StudyConfig, unset=True, skip=("sections", "claims", "rng"))
    for name in SECTIONS:
        group = parser.add_argument_group(f"{name} settings", f"rungs: {_rungs_of(name)}")
        settings, shown, metavars = SECTIONS[name], {}, {}
        defaults, hints = settings(), typing.get_type_hints(settings)
        for f in dataclasses.fields(settings):
            shown[f.name] = str(getattr(defaults, f.name))  # every default, None too
            kind = base_type(hints[f.name])
            if kind in (list, dict):
                metavars[f.name] = "X" if kind is list else "KEY=VALUE"
        add_arguments(
            group,
            settings,
            unset=True,
            shown=shown,
            metavars=metavars,
            prefix=f"{name}_",
            check_choices=False,  # settle names the setting (llm_rollout_backend must be ...)
        )
    return parser


def parse_study_args(
    argv: Sequence[str] | None, *, prog: str, description: str, profiles: Mapping[str, Any]
) -> tuple[StudyConfig, argparse.Namespace]:
    """The :class:`StudyConfig` of a command line: the profile's settings (a section's under its
    name), then every flag given; ``ValueError`` naming a removed or misplaced flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    removed = removed_flags()
    for word in argv:
        if word.split("=", 1)[0] in removed:
            raise ValueError(removed[word.split("=", 1)[0]])
    args = build_parser(prog, description, profiles).parse_args(argv)
    args.time_budget = time_budget(args.time_budget)
    if args.time_budget is not None and args.backend != "local":
        raise ValueError(
            "--time-budget: only with --backend local (a Ray task is not stopped at a deadline "
            "with its checkpoint)"
        )
    settings = profile_settings(args, StudyConfig, dict(profiles), "claims")
    sections = {name: dict(settings.pop(name, {})) for name in SECTIONS}
    used = {RUNGS[r].section for r in settings.get("rungs", StudyConfig().rungs) if r in RUNGS}
    for name in SECTIONS:
        given = flag_values(args, SECTIONS[name], f"{name}_")
        for key, value in given.items():
            if value is None:
                continue
            if not args.tables_only and name not in used:
                raise ValueError(
                    f"{flag(f'{name}_{key}')}: does not apply without a rung of its section "
                    f"(--rungs ... {_rungs_of(name).split(', ')[0]})"
                )
            sections[name][key] = value
    claims = [parse_claim(text) for text in args.claim]
    claims += read_claims(args.claims) if args.claims else []
    if claims:  # their rules join the study's
        settings["claims"] = [claim_record(c) for c in claims]
        rules = settings.get("rules", StudyConfig().rules)
        settings["rules"] = list(dict.fromkeys([*rules, *(r for c in claims for r in c.rules)]))
    return StudyConfig(**settings, sections=sections), args


#: Exit status of a study that its time budget (``--time-budget``) stopped with units left
#: (sysexits' EX_TEMPFAIL: "try again later"; the same command goes on).
BUDGET_EXIT = 75


def time_budget(text: str | None) -> float | None:
    """``--time-budget``'s seconds (None: no budget); a ``ValueError`` naming the flag."""
    if text is None:
        return None
    return check_number("--time-budget", text, what="a number of seconds", text=True)


def budget_spent(exc: BudgetSpent, argv: Sequence[str] | None, prog: str) -> int:
    """The closing line of a study stopped by its budget (the command that goes on: this one
    without ``--force``); :data:`BUDGET_EXIT`."""
    given = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--force"]
    again = shlex.join([*prog.split(), *given])
    print(f"{exc}; continue with: {again}", file=sys.stderr)
    return BUDGET_EXIT


def interrupted(stop: int | KeyboardInterrupt, out: Path, folder: Path | None = None) -> int:
    """The resume hint after the signal ``stop`` (its number, or the exception it raised); the
    exit status 128 + its number."""
    kept = f"finished runs are parts in {out / 'parts'}"
    if folder is not None and folder.is_dir():
        kept += f", cut runs' checkpoints in {folder}"
    return answer_signal(stop, kept)


def main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    profiles: Mapping[str, Any],
    prepare: Prepare | None = None,
) -> int:
    """Run (or with ``--tables-only`` rebuild) the study of a command line (``argv``: the
    process's own when None); the exit status."""
    with own_command(argv is None):
        return _main(argv, prog=prog, description=description, profiles=profiles, prepare=prepare)


def _main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    profiles: Mapping[str, Any],
    prepare: Prepare | None,
) -> int:
    try:
        config, args = parse_study_args(argv, prog=prog, description=description, profiles=profiles)
        if not args.tables_only:
            config.validate()
        if args.prune and not args.tables_only:
            raise ValueError("--prune: only with --tables-only (the rebuild knows what it reads)")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start, out, folder = time.perf_counter(), Path(args.out), None
    try:
        if args.tables_only:  # the recorded study at its recorded calibration, and any --claim
            tables = rebuild_tables(out, config, prune=args.prune)
        else:
            if prepare is not None:
                config, folder = prepare(config, out)
            with terminate_raises():  # SIGTERM between runs: the resume line, as Ctrl-C
                tables = run_study(
                    config,
                    out,
                    progress=not args.no_progress,
                    force=args.force,
                    workers=args.workers,
                    time_budget=args.time_budget,
                    note_rules=args.rules is not None,  # a profile's rules are its own choice
                    backend=args.backend,
                    address=args.address,
                )
            if folder is not None and folder.parent == out:  # every run is a part now
                shutil.rmtree(folder, ignore_errors=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BudgetSpent as exc:  # --time-budget: units left, their command
        return budget_spent(exc, argv, prog)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in the pool (its Terminated)
        return interrupted(exc, out, folder)
    except SystemExit as exc:  # a trainer in this process: checkpointed on a signal, 128+sig
        if isinstance(exc.code, int) and 128 < exc.code < 128 + signal.NSIG:
            return interrupted(exc.code - 128, out, folder)
        raise
    return _report(out, tables["ledger"], args.doc, start)


def _report(out: Path, ledger: pd.DataFrame, doc: str | None, start: float) -> int:
    """Print the ledger (no rows: rules that make no claim, ``--rules dapo``), write the page
    with ``--doc``; the exit status."""
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        cols = ["claim", "rung", "estimate", "lo", "hi", "seeds", "verdict"]
        print(ledger[cols].round(4).to_string(index=False) if len(ledger) else "empty ledger")
    if doc:
        from .tables import write_doc

        try:
            write_doc(out, Path(doc))
        except ValueError as exc:  # a placeholder the tables cannot fill
            print(f"error: --doc: {exc}", file=sys.stderr)
            return 2
    print(f"{time.perf_counter() - start:.0f} s; wrote {out}", file=sys.stderr)
    return 0
