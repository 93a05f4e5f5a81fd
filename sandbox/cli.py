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
