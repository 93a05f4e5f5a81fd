"""``clip-sandbox``: the command line.

clip-sandbox objectives          # the registry: objectives and presets with their parameters
clip-sandbox weights [--ratios]  # gradient weight g(r) of objectives at chosen ratios
clip-sandbox demo [--out DIR]    # the objectives tour: tables, an autograd check and a figure
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def _objectives(args: argparse.Namespace) -> int:
    from sandbox.objectives import describe

    table = pd.DataFrame(describe())
    table["params"] = table["params"].map(
        lambda p: ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items()
        )
    )
    if args.kind != "all":
        table = table[table["kind"] == args.kind]
    with pd.option_context("display.max_colwidth", 90, "display.width", 250):
        print(table.to_string(index=False))
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


def _compare(args: argparse.Namespace) -> int:
    from sandbox.experiments.compare import CompareConfig, main

    overrides = {
        name: getattr(args, name)
        for name in CompareConfig.help()
        if getattr(args, name, None) is not None
    }
    config = CompareConfig(**overrides)
    name = args.name or ("default" if config.suite == "bandit" else config.suite)
    out = Path(args.out) / name
    main(config, out, workers=args.workers, force=args.force, progress=not args.no_progress)
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
    from sandbox.experiments.sweep import describe_plan, load_sweep, main

    plan = load_sweep(args.file)
    out = Path(args.out) / (args.name or plan.name)
    if args.dry_run:
        print(describe_plan(plan, out))
        return 0
    try:
        main(
            plan, out, backend=args.backend, workers=args.workers, address=args.address,
            force=args.force, progress=not args.no_progress,
        )  # fmt: skip
    except ImportError as err:  # --backend ray without Ray installed
        print(f"clip-sandbox: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted: {describe_plan(plan, out).splitlines()[-1].strip()}; run the same "
              "command again to resume", file=sys.stderr)  # fmt: skip
        return 130
    return 0


def _plot(args: argparse.Namespace) -> int:
    from sandbox.experiments import final_scores, format_scores, load_results, render_all

    source = Path(args.results)
    if not source.exists():
        raise ValueError(f"results: {source} does not exist")
    try:
        results = load_results(source)
    except FileNotFoundError as err:
        raise ValueError(f"results: {err} (expected results.parquet or parts/)") from err
    if args.highlight:
        unknown = sorted(set(args.highlight) - set(results["objective"]))
        if unknown:
            raise ValueError(
                f"highlight: unknown objective(s) {unknown}; in these results: "
                f"{sorted(results['objective'].unique())}"
            )
    out = Path(args.out) if args.out else (source if source.is_dir() else source.parent)
    paths = render_all(results, out, args.highlight)
    print(format_scores(final_scores(results)))
    print(f"\nwrote {', '.join(str(p) for p in paths)}")
    return 0


def _add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """Flags generated from :class:`CompareConfig`'s fields (defaults stay in the dataclass)."""
    from dataclasses import MISSING, fields

    from sandbox.experiments.compare import CompareConfig

    p.add_argument(
        "--name", default=None, help="run name: results go to OUT/NAME (default: the suite's)"
    )
    p.add_argument("--out", default="runs", help="output root folder")
    p.add_argument("--workers", type=int, default=None, help="processes (default: min(cpus, 4))")
    p.add_argument("--force", action="store_true", help="recompute finished runs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    from sandbox.experiments.compare import SUITE_DEFAULTS

    for f in fields(CompareConfig):
        default = f.default_factory() if f.default is MISSING else f.default
        flag = "--" + f.name.replace("_", "-")
        if default is None:  # per-suite default
            per_suite = {s: d.get(f.name) for s, d in SUITE_DEFAULTS.items()}
            shown = "; ".join(f"{s}: {'all' if v is None else v}" for s, v in per_suite.items())
            sample = next((v for v in per_suite.values() if v is not None), "")
        else:
            shown, sample = default, default
        help_text = f"{f.metadata.get('help', '')} (default: {shown})"
        if isinstance(sample, list) or f.name == "objectives":
            p.add_argument(flag, dest=f.name, nargs="+", default=None, help=help_text)
        else:
            p.add_argument(flag, dest=f.name, type=type(sample), default=None, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clip-sandbox", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("objectives", help="list objectives and presets with their parameters")
    p.add_argument("--kind", choices=("all", "objective", "preset"), default="all")
    p.set_defaults(func=_objectives)
    p = sub.add_parser("weights", help="gradient weight g(r) of objectives at given ratios")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.8, 1.0, 1.2, 1.5, 3.0])
    p.add_argument("--objectives", nargs="+", default=None, help="names or presets")
    p.set_defaults(func=_weights)
    p = sub.add_parser("compare", help="compare objectives on the bandit suite (make demo)")
    _add_compare_arguments(p)
    p.set_defaults(func=_compare)
    p = sub.add_parser(
        "sweep", help="a grid of objectives x parameters x settings x seeds from a TOML/YAML file"
    )
    p.add_argument("file", help="sweep file (.toml, .yaml); examples in sweeps/")
    p.add_argument("--out", default="runs", help="output root folder (results go to OUT/NAME)")
    p.add_argument("--name", default=None, help="run name (default: the sweep's name)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local process pool, or Ray tasks (pip install 'clip-sandbox[ray]')")  # fmt: skip
    p.add_argument("--address", default=None,
                   help="Ray cluster address (e.g. auto or ray://host:10001); default: start a "
                   "local Ray instance with --workers CPUs")  # fmt: skip
    p.add_argument("--workers", type=int, default=None,
                   help="processes (local: default min(cpus, 4)) or CPUs of a local Ray instance")  # fmt: skip
    p.add_argument("--force", action="store_true", help="recompute finished runs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true", help="validate and list the runs, run nothing")
    p.set_defaults(func=_sweep)
    p = sub.add_parser("plot", help="standard figures and the score table from any results")
    p.add_argument("results", help="results folder (results.parquet or parts/) or a parquet/CSV")
    p.add_argument("--out", default=None, help="figure folder (default: the results folder)")
    p.add_argument("--highlight", nargs="+", default=None,
                   help="objectives (variant labels) drawn in the line plots (default: all)")  # fmt: skip
    p.set_defaults(func=_plot)
    p = sub.add_parser("tour", help="the objectives tour (tables, autograd check, figure)")
    p.add_argument("--out", default="runs/tour", help="output folder")
    p.set_defaults(func=_tour)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:  # bad names or parameters: a clear message, not a traceback
        print(f"clip-sandbox: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
