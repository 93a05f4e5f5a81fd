"""``clip-sandbox``: the command line.

clip-sandbox objectives [--kind]   # the registry: objectives and presets with their parameters
clip-sandbox weights [--ratios]    # gradient weight g(r) of objectives at chosen ratios
clip-sandbox tour [--out DIR]      # the objectives tour: tables, an autograd check and a figure
clip-sandbox compare               # every rule on the bandit suite, sampled and exact (make demo)
clip-sandbox sweep FILE            # a grid of objectives x parameters x settings x seeds
clip-sandbox plot RESULTS          # the standard figures and the score table from any results
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from sandbox.configs import CommandParser, positive_int

#: Width of the text tables (``objectives``).
WIDTH = 100


def format_registry(entries: list[dict], width: int = WIDTH) -> str:
    """The registry as text no wider than ``width``: one line per entry with its short fields,
    then its parameters and [paper], indented and wrapped."""
    columns = ("name", "kind", "objective", "level", "stochastic", "aggregation")
    rows = [[str(e[c]) for c in columns] for e in entries]
    sizes = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(n) for c, n in zip(columns, sizes, strict=True)).rstrip()]
    for entry, row in zip(entries, rows, strict=True):
        lines.append("  ".join(v.ljust(n) for v, n in zip(row, sizes, strict=True)).rstrip())
        params = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry["params"].items()
        )
        text = f"{params or '(no parameters)'}  [{entry.get('paper') or '-'}]"
        lines += textwrap.wrap(text, width, initial_indent="    ", subsequent_indent="      ")
    return "\n".join(lines)


def _objectives(args: argparse.Namespace) -> int:
    from sandbox.objectives import describe

    entries = [e for e in describe() if args.kind in ("all", e["kind"])]
    print(format_registry(entries))
    return 0


def _weights(args: argparse.Namespace) -> int:
    import torch

    from sandbox.tour import DEFAULT_TOUR, weight_table

    ratios = torch.tensor(args.ratios, dtype=torch.float64)
    table = weight_table(args.objectives or DEFAULT_TOUR, ratios)
    wide = table.pivot_table(
        index=["objective", "adv_sign"], columns="ratio", values="g", sort=False
    )
    wide.columns = [f"r={c:g}" for c in wide.columns]
    print(wide.round(4).to_string())
    return 0


def _interrupted(err: KeyboardInterrupt, where: str) -> int:
    """The resume hint after Ctrl-C or SIGTERM; exit status 128 + signal number."""
    from sandbox.experiments.planner import answer_signal

    return answer_signal(err, where)


PRUNE_HELP = (
    "after the run, delete the parts in the folder this command does not read (runs of other "
    "settings, kept apart by their names); provenance.json records it"
)


def _compare(args: argparse.Namespace) -> int:
    if args.workers != 1:  # the pool's forkserver imports torch while this process does too
        from sandbox.experiments.pool import start_forkserver

        start_forkserver()
    from sandbox.configs import field_help
    from sandbox.experiments.compare import CompareConfig, check_name, parse_objective_params
    from sandbox.experiments.sweep import compare_plan, compare_progress, main

    overrides = {
        name: getattr(args, name)
        for name in field_help(CompareConfig)
        if getattr(args, name, None) is not None
    }
    if "objective_params" in overrides:
        overrides["objective_params"] = parse_objective_params(overrides["objective_params"])
    config = CompareConfig(**overrides)
    name = args.name or ("default" if config.suite == "bandit" else config.suite)
    out = Path(args.out) / check_name(name)
    try:
        main(
            compare_plan(config),
            out,
            workers=args.workers,
            force=args.force,
            progress=not args.no_progress,
            prune=args.prune,
        )
    except KeyboardInterrupt as err:
        return _interrupted(err, compare_progress(config, out))
    return 0


def _tour(args: argparse.Namespace) -> int:
    import torch

    from sandbox.objectives import available_objectives, available_presets
    from sandbox.tour import autograd_check, plot_weights, weight_table

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"objectives ({len(available_objectives())}): {', '.join(available_objectives())}")
    print(f"presets ({len(available_presets())}): {', '.join(available_presets())}\n")
    ratios = torch.tensor([0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 3.0], dtype=torch.float64)
    table = weight_table(ratios=ratios)
    wide = table.pivot_table(
        index=["objective", "adv_sign"], columns="ratio", values="g", sort=False
    )
    wide.columns = [f"r={c:g}" for c in wide.columns]
    print("Gradient weight g(r) (coef = g A; expectation for stochastic rules):")
    print(wide.round(4).to_string(), "\n")
    check = autograd_check()
    print("Autograd of each loss against its closed-form coefficient (float64):")
    print(check.to_string(index=False, float_format=lambda x: f"{x:.1e}"), "\n")
    full = weight_table()
    full.to_csv(out / "gradient_weights.csv", index=False)
    check.to_csv(out / "autograd_check.csv", index=False)
    png = plot_weights(full, out / "gradient_weights.png")
    print(f"wrote {out / 'gradient_weights.csv'}, {out / 'autograd_check.csv'}, {png}")
    worst = check["max_autograd_error"].max()
    if worst > 1e-10:
        print(f"autograd check FAILED: max error {worst:.2e}", file=sys.stderr)
        return 1
    return 0


def _sweep(args: argparse.Namespace) -> int:
    if args.workers != 1 and args.backend == "local" and not args.dry_run:
        from sandbox.experiments.pool import start_forkserver

        start_forkserver()
    from sandbox.experiments.compare import check_name
    from sandbox.experiments.sweep import describe_plan, load_sweep, main, with_overrides

    plan = with_overrides(load_sweep(args.file), seeds=args.seeds, steps=args.steps)
    out = Path(args.out) / check_name(args.name or plan.name)
    if args.dry_run:
        print(describe_plan(plan, out))
        return 0
    try:
        main(
            plan,
            out,
            backend=args.backend,
            workers=args.workers,
            address=args.address,
            force=args.force,
            progress=not args.no_progress,
            prune=args.prune,
        )
    except ImportError as err:  # --backend ray without Ray installed
        print(f"clip-sandbox: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        return _interrupted(err, describe_plan(plan, out).splitlines()[-1].strip())
    return 0


def _plot(args: argparse.Namespace) -> int:
    from sandbox.experiments import final_scores, format_scores, load_results, render_all
    from sandbox.experiments.results import is_score_table

    source = Path(args.results)
    if not source.exists():
        raise ValueError(f"results: {source} does not exist")
    try:
        results = load_results(source)
    except FileNotFoundError as err:
        raise ValueError(f"results: {err} (expected results.parquet or parts/)") from err
    out = Path(args.out) if args.out else (source if source.is_dir() else source.parent)
    if is_score_table(results):  # summary.csv: the final scores only
        from sandbox.experiments.plots import plot_final_scores

        path = plot_final_scores(results, out / "final_scores.png")
        print(format_scores(results))
        print(
            f"\n{source} holds final scores only: wrote {path}; pass results.parquet (or its "
            "folder) for the curves"
        )
        return 0
    highlight = args.highlight
    if highlight == ["all"]:  # every objective, in the results' order
        highlight = list(dict.fromkeys(results["objective"]))
    elif highlight:
        unknown = sorted(set(highlight) - set(results["objective"]))
        if unknown:
            raise ValueError(
                f"highlight: unknown objective(s) {unknown}; in these results: "
                f"{sorted(results['objective'].unique())}"
            )
    paths = render_all(results, out, highlight)
    print(format_scores(final_scores(results)))
    print(f"\nwrote {', '.join(str(p) for p in paths)}")
    return 0


def _shown(value: object) -> str:
    if value is None:
        return "all objectives and presets"
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


#: Metavars and choices of compare's flags (the rest use the field's type).
_METAVARS = {"objectives": "NAME", "settings": "SETTING", "objective_params": "[NAME:]KEY=VALUE"}
_CHOICES = {"suite": ("bandit", "reasoning"), "optimizer": ("sgd", "adam")}


def _add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """Flags generated from :class:`CompareConfig`'s fields by :func:`sandbox.configs.add_arguments`
    (the helper ``llm.train`` uses too); a field left unset takes its suite's default, shown once
    when the suites agree."""
    from dataclasses import MISSING, fields

    from sandbox.configs import add_arguments
    from sandbox.experiments.compare import SUITE_DEFAULTS, CompareConfig

    p.add_argument(
        "--name", default=None, help="run name: results go to OUT/NAME (default: the suite's)"
    )
    p.add_argument("--out", default="runs", help="output root folder (default: runs)")
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="processes (default: min(cpus, 4); 1 runs in this process)",
    )
    p.add_argument("--force", action="store_true", help="recompute finished runs")
    p.add_argument("--prune", action="store_true", help=PRUNE_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    shown = {}
    for f in fields(CompareConfig):
        default = f.default_factory() if f.default is MISSING else f.default
        if f.name == "objective_params" or (
            default is None and f.name not in SUITE_DEFAULTS["bandit"]
        ):
            continue  # None is the field's own default (dtype): its help text says what happens
        if default is None:  # per-suite default
            per_suite = {s: d.get(f.name) for s, d in SUITE_DEFAULTS.items()}
            values = list(per_suite.values())
            if all(v == values[0] for v in values):
                shown[f.name] = _shown(values[0])
            else:
                shown[f.name] = "; ".join(f"{s}: {_shown(v)}" for s, v in per_suite.items())
        else:
            shown[f.name] = _shown(default)
    add_arguments(
        p,
        CompareConfig,
        unset=True,
        shown=shown,
        metavars=_METAVARS,
        choices=_CHOICES,
        skip=("objective_params",),
    )
    f = next(f for f in fields(CompareConfig) if f.name == "objective_params")
    p.add_argument(
        "--objective-params",
        nargs="+",
        default=None,
        help=f.metadata["help"],
        metavar=_METAVARS["objective_params"],
    )


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="clip-sandbox", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("objectives", help="list objectives and presets with their parameters")
    p.add_argument(
        "--kind",
        choices=("all", "objective", "preset"),
        default="all",
        help="registered objectives (paper defaults), named presets, or all (default)",
    )
    p.set_defaults(func=_objectives)
    p = sub.add_parser("weights", help="gradient weight g(r) of objectives at given ratios")
    p.add_argument(
        "--ratios",
        type=float,
        nargs="+",
        default=[0.5, 0.8, 1.0, 1.2, 1.5, 3.0],
        metavar="R",
        help="ratios r = pi / pi_old to evaluate g(r) at (default: 0.5 0.8 1.0 1.2 1.5 3.0)",
    )
    p.add_argument(
        "--objectives",
        nargs="+",
        default=None,
        metavar="NAME",
        help="names or presets (default: the tour's selection)",
    )
    p.set_defaults(func=_weights)
    p = sub.add_parser(
        "compare",
        help="compare objectives on the bandit (or reasoning) suite (make demo)",
        description="Every objective on a suite of settings: sampled runs over seeds and, on "
        "bandits, the exact expected-gradient flow. Steps are 1-based (step s: the s-th rollout "
        "+ update round), as in llm.train. A rerun with the same --name resumes; other settings "
        "compute their own runs beside the folder's (a part's name hashes its settings), and the "
        "tables hold this command's runs only (--force recomputes them).",
    )
    _add_compare_arguments(p)
    p.set_defaults(func=_compare)
    p = sub.add_parser(
        "sweep", help="a grid of objectives x parameters x settings x seeds from a TOML/YAML file"
    )
    p.add_argument("file", help="sweep file (.toml, .yaml); examples in sweeps/")
    p.add_argument("--out", default="runs", help="output root folder (results go to OUT/NAME)")
    p.add_argument("--name", default=None, help="run name (default: the sweep's name)")
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local process pool, or Ray tasks (pip install 'clip-sandbox[ray]')",
    )
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (e.g. auto or ray://host:10001); default: start a "
        "local Ray instance with --workers CPUs",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="processes (local: default min(cpus, 4)) or CPUs of a local Ray instance",
    )
    p.add_argument(
        "--seeds",
        type=positive_int,
        default=None,
        metavar="N",
        help="override the file's seeds per run (a smoke run: --seeds 2 --steps 5)",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        metavar="N",
        help="override the file's training steps",
    )
    p.add_argument("--force", action="store_true", help="recompute finished runs")
    p.add_argument("--prune", action="store_true", help=PRUNE_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs, run nothing")
    p.set_defaults(func=_sweep)
    p = sub.add_parser("plot", help="standard figures and the score table from any results")
    p.add_argument("results", help="results folder (results.parquet or parts/) or a parquet/CSV")
    p.add_argument("--out", default=None, help="figure folder (default: the results folder)")
    p.add_argument(
        "--highlight",
        nargs="+",
        default=None,
        metavar="NAME",
        help="objectives (variant labels) drawn in the line plots, or 'all' for every one "
        "(default: every one when there are at most 12; else 12: compare's selection (grpo, "
        "dapo, gspo, nsr_dapo, ...: sandbox.experiments.plots.HIGHLIGHT) where present, then the best by final "
        "reward; the figure's title says '12 of N objectives')",
    )
    p.set_defaults(func=_plot)
    p = sub.add_parser("tour", help="the objectives tour (tables, autograd check, figure)")
    p.add_argument(
        "--out",
        default="runs/tour",
        help="folder for gradient_weights.csv/.png and autograd_check.csv (default: runs/tour)",
    )
    p.set_defaults(func=_tour)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line's exit status (``argv``: the process's own when None)."""
    from sandbox.experiments.pool import own_command

    with own_command(argv is None):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    from sandbox.experiments.pool import answer_interrupt
    from sandbox.experiments.signals import signals_deferred

    try:
        with signals_deferred():  # imports torch and sympy: a Ctrl-C acts once they are done
            args = build_parser().parse_args(argv)
            if args.func in (_compare, _sweep):  # the driver's lazy imports, done while deferred
                import scipy.stats  # noqa: F401
                import torch.fx.experimental.symbolic_shapes  # noqa: F401
        return args.func(args)
    except ValueError as err:  # bad names or parameters: a clear message, not a traceback
        print(f"clip-sandbox: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler (e.g. during imports)
        answer_interrupt("\ninterrupted (SIGINT) before any run finished")
        return 130


if __name__ == "__main__":
    sys.exit(main())
