"""The claims study's command-line frame, generic over the registered rungs and settings
sections: the study's own flags from :class:`~.config.StudyConfig`, one flag per section setting
(``--<section>-<field>``, from the section's dataclass: :mod:`.settings`), named profiles,
``--claim``/``--claims``, ``--tables-only``, ``--doc``, and the resume line after a signal.
``python -m llm.claims`` is this frame with the ``llm`` rung registered (:func:`main`).

A removed flag (the global ``--seeds``; ``--<section> KEY=VALUE``, ``--<section>-extra``,
``--<section>-lr``) and an unknown one are each a one-line error naming it (exit 2), as is a
section's flag given without a rung of that section.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import shutil
import signal
import sys
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from sandbox.configs import add_arguments, add_study_arguments, key_values
from sandbox.experiments.planner import interrupted_line
from sandbox.experiments.pool import terminate_raises

from .claims import claim_record, parse_claim, read_claims
from .config import StudyConfig
from .plan import BudgetSpent, rebuild_tables, run_study
from .rungs import RUNGS
from .settings import SECTIONS, section_fields, section_hints

#: A hook run before the study: ``prepare(config, out) -> (config, folder or None)``; the folder
#: (e.g. the llm rung's resumable checkpoints) is named by the resume line and removed once
#: every run is a part.
Prepare = Callable[[StudyConfig, Path], tuple[StudyConfig, Path | None]]


class StudyParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``error: ...``, exit 2)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def section_flag(section: str, field: str) -> str:
    """``--<section>-<field>`` (``--tf-eval-prompts``)."""
    return f"--{section}-{field}".replace("_", "-")


def removed_flags() -> dict[str, str]:
    """Flags of earlier versions and what replaced each (one line)."""
    seeds = ", ".join(section_flag(name, "seeds") for name in SECTIONS)
    out = {"--seeds": f"--seeds is gone: paired seeds are set per rung ({seeds})"}
    for name in SECTIONS:
        names = [f.name for f in section_fields(name)]
        one = f"one flag per setting: {', '.join(section_flag(name, n) for n in names)}"
        out[f"--{name}"] = f"--{name} KEY=VALUE is gone: {one}"
        out[f"--{name}-extra"] = f"--{name}-extra is gone: {one}"
        if "lrs" in names:
            out[f"--{name}-lr"] = f"--{name}-lr is gone: the step-size grid is " + section_flag(
                name, "lrs"
            )
    return out


def _add_section_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """One flag per field of section ``name`` (default None: only what is given is set)."""
    hints = section_hints(name)
    group = parser.add_argument_group(f"{name} settings", f"rungs: {_rungs_of(name)}")
    for f in section_fields(name):
        base, kind = _field_type(hints[f.name])
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kw: dict[str, Any] = {"dest": f"{name}__{f.name}", "default": None}
        kw["help"] = f"{f.metadata.get('help', '')} (default: {default})".replace("%", "%%")
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif base is list:
            kw.update(nargs="+", type=typing.get_args(kind)[0], metavar="X")
        elif base is dict:
            kw.update(nargs="+", metavar="KEY=VALUE")
        else:
            kw["type"] = base
        group.add_argument(section_flag(name, f.name), **kw)


def _field_type(hint: Any) -> tuple[type, Any]:
    """``list[float] | None`` -> ``(list, list[float])``; ``int`` -> ``(int, int)``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_origin(hint) or hint, hint


def _rungs_of(section: str) -> str:
    return ", ".join(r.name for r in RUNGS.values() if r.section == section) or "none"


def build_parser(prog: str, description: str, profiles: Mapping[str, Any]) -> StudyParser:
    """The study's parser: the shared study flags, the study's own settings, every section's."""
    parser = StudyParser(prog=prog, description=description, allow_abbrev=False)
    add_study_arguments(parser, dict(profiles), "claims", "results/claims")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: up to 4)")
    parser.add_argument("--doc", default=None, help="also write the markdown write-up to this path")
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
    add_time_budget(parser)
    add_arguments(parser, StudyConfig, unset=True, skip=("sections", "claims", "rng"))
    for name in SECTIONS:
        _add_section_arguments(parser, name)
    return parser


def parse_study_args(
    argv: Sequence[str] | None, *, prog: str, description: str, profiles: Mapping[str, Any]
) -> tuple[StudyConfig, argparse.Namespace]:
    """The :class:`StudyConfig` of a command line: the profile's settings (``--quick``:
    ``quick``; a section's under its name), then every flag given; ``ValueError`` for a removed
    flag, a section's flag without a rung of that section, or a bad value."""
    argv = list(sys.argv[1:] if argv is None else argv)
    removed = removed_flags()
    for word in argv:
        if word.split("=", 1)[0] in removed:
            raise ValueError(removed[word.split("=", 1)[0]])
    args = build_parser(prog, description, profiles).parse_args(argv)
    args.time_budget = time_budget(args.time_budget)
    profile = "quick" if args.quick else args.profile
    args.out = args.out or f"runs/claims-{profile}"
    chosen = dict(profiles[profile])
    sections = {name: dict(chosen.pop(name, {})) for name in SECTIONS}
    settings = {**chosen}
    for f in dataclasses.fields(StudyConfig):
        if getattr(args, f.name, None) is not None:
            settings[f.name] = getattr(args, f.name)
    rungs = settings.get("rungs", StudyConfig().rungs)
    for name in SECTIONS:
        for f in section_fields(name):
            value = getattr(args, f"{name}__{f.name}")
            if value is None:
                continue
            flag = section_flag(name, f.name)
            used = any(RUNGS[r].section == name for r in rungs if r in RUNGS)
            if not args.tables_only and not used:
                raise ValueError(
                    f"{flag}: does not apply without a rung of its section "
                    f"(--rungs ... {_rungs_of(name).split(', ')[0]})"
                )
            if _field_type(section_hints(name)[f.name])[0] is dict:  # typed key=value pairs
                value = key_values(value, flag)
            sections[name][f.name] = value
    claims = [parse_claim(text) for text in args.claim]
    claims += read_claims(args.claims) if args.claims else []
    if claims:  # their rules join the study's
        settings["claims"] = [claim_record(c) for c in claims]
        rules = settings.get("rules", StudyConfig().rules)
        settings["rules"] = list(dict.fromkeys([*rules, *(r for c in claims for r in c.rules)]))
    return StudyConfig(**settings, sections=sections), args


# -- --time-budget (issue 28 item 5): the flag, its check and its closing line -----------------

#: Exit status of a study that its time budget stopped with units left (sysexits' EX_TEMPFAIL:
#: "try again later"; the same command goes on).
BUDGET_EXIT = 75


def add_time_budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--time-budget",
        default=None,
        metavar="SECONDS",
        help="run only the next units (one rule x one group of seeds) that fit in SECONDS: no "
        "unit starts that would not end in time (the longest of its kind so far), units still "
        "running at the end are stopped as on SIGTERM (llm runs keep their checkpoint), every "
        f"finished unit is a part; exit {BUDGET_EXIT} with the count left and the command to go on",
    )


def time_budget(text: str | None) -> float | None:
    """``--time-budget``'s seconds (None: no budget); a ``ValueError`` naming the flag."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"--time-budget must be a number of seconds > 0, got {text!r}")
    return seconds


def budget_spent(exc: BudgetSpent, argv: Sequence[str] | None, prog: str) -> int:
    """The closing line of a study stopped by its budget (units left, the command that goes on:
    this one without ``--force``); the exit status :data:`BUDGET_EXIT`."""
    given = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--force"]
    again = shlex.join([*prog.split(), *given])
    print(f"{exc}; continue with: {again}", file=sys.stderr)
    return BUDGET_EXIT


def interrupted(signum: int, out: Path, folder: Path | None = None) -> int:
    """The resume hint after a signal; the exit status 128 + ``signum``."""
    kept = f"finished runs are parts in {out / 'parts'}"
    if folder is not None and folder.is_dir():
        kept += f", cut runs' checkpoints in {folder}"
    print("\n" + interrupted_line(signum, kept), file=sys.stderr)
    return 128 + signum


def main(
    argv: Sequence[str] | None,
    *,
    prog: str,
    description: str,
    profiles: Mapping[str, Any],
    prepare: Prepare | None = None,
) -> int:
    """Run (or with ``--tables-only`` rebuild) the study of a command line; the exit status."""
    try:
        config, args = parse_study_args(argv, prog=prog, description=description, profiles=profiles)
        if not args.tables_only:
            config.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start, out, folder = time.perf_counter(), Path(args.out), None
    try:
        if args.tables_only:  # the recorded study at its recorded calibration, and any --claim
            rebuild_tables(out, config)
        else:
            if prepare is not None:
                config, folder = prepare(config, out)
            with terminate_raises():  # SIGTERM between runs: the resume line, as Ctrl-C
                run_study(
                    config,
                    out,
                    progress=not args.no_progress,
                    force=args.force,
                    workers=args.workers,
                    time_budget=args.time_budget,
                )
            if folder is not None and folder.parent == out:  # every run is a part now
                shutil.rmtree(folder, ignore_errors=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BudgetSpent as exc:  # --time-budget: units left, their command
        return budget_spent(exc, argv, prog)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in the pool (its Terminated)
        return interrupted(getattr(exc, "signum", signal.SIGINT), out, folder)
    except SystemExit as exc:  # a trainer in this process: checkpointed on a signal, 128+sig
        if isinstance(exc.code, int) and 128 < exc.code < 128 + signal.NSIG:
            return interrupted(exc.code - 128, out, folder)
        raise
    return _report(out, args.doc, start)


def _report(out: Path, doc: str | None, start: float) -> int:
    """Print the ledger, write the page with ``--doc``; the exit status."""
    try:
        ledger = pd.read_csv(out / "ledger.csv")
    except pd.errors.EmptyDataError:  # rules that make no claim (e.g. --rules dapo)
        ledger = pd.DataFrame()
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        cols = ["claim", "rung", "estimate", "lo", "hi", "seeds", "verdict"]
        print(ledger[cols].round(4).to_string(index=False) if len(ledger) else "empty ledger")
    if doc:
        from .page import write_doc

        try:
            write_doc(out, Path(doc))
        except ValueError as exc:  # a placeholder the tables cannot fill
            print(f"error: --doc: {exc}", file=sys.stderr)
            return 2
    print(f"{time.perf_counter() - start:.0f} s; wrote {out}", file=sys.stderr)
    return 0
