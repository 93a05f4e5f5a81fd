"""The study's tables and figures from its rows (:func:`write_tables`: after a run, and from a
folder's parts by :func:`.plan.rebuild_tables`), byte for byte the same from the same rows."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from sandbox.experiments.results import (
    recording_tables,
    write_csv,
    write_figure,
    write_parquet_if_changed,
)

from .analysis import (
    auc_claims,
    calibrated_points,
    calibration_curve,
    canonical_rows,
    controlled_ledger,
    entropy_law,
    gradient_noise,
    ladder_order,
    one_axis,
    rule_summary,
    run_scores,
    rung_power,
    step_size_choice,
    study_ledger,
)
from .claims import Bounds
from .config import StudyConfig, study_claims
from .rungs import study_bounds
from .transfer import write_transfer


def write_tables(
    rows: pd.DataFrame, out: Path, config: StudyConfig | None = None
) -> dict[str, pd.DataFrame]:
    """``results.parquet`` and the CSVs (calibration, scores, summary, ledger, power,
    entropy_law, grad_noise, bounds, axis; with the step-size control, step_size_choice and
    ledger_control; transfer, transfer_agreement) and the figures; returns the tables by name,
    ``results`` the tidy rows.

    The same rows, in any order, give the same bytes (:func:`canonical_rows`, stable sorts,
    :func:`~.results.write_csv`'s float format, PNGs without a version stamp), and a file whose
    bytes would not change is not rewritten; the folder's ``tables`` provenance records this
    command only if something changed (:func:`~.results.recording_tables`)."""
    out, rows = Path(out), canonical_rows(rows)
    with recording_tables(out):
        write_parquet_if_changed(rows, out / "results.parquet")
        scores = run_scores(rows)
        bounds = study_bounds(config) if config is not None else None  # once: tiny_tf samples sets
        claims = study_claims(config)
        tables = {
            "calibration": calibration_curve(rows),
            "scores": scores,
            "summary": rule_summary(scores),
            "ledger": study_ledger(scores, claims, bounds),
            "ledger_auc": study_ledger(scores, auc_claims(claims), bounds, "secondary"),
            "entropy_law": entropy_law(rows),
            "grad_noise": gradient_noise(rows),
            "power": rung_power(scores),
            "bounds": rung_bounds(bounds) if bounds is not None else pd.DataFrame(),
        }
        tables["axis"] = one_axis(tables["summary"])
        if (rows["phase"] == "tune").any():  # the step-size control ran
            tables["step_size_choice"] = step_size_choice(rows)
            control = run_scores(rows, "control")
            tables["ledger_control"] = controlled_ledger(control, claims, bounds, tables["ledger"])
        for name, table in tables.items():
            write_csv(table, out / f"{name}.csv")
        ledgers = [tables["ledger"], tables["ledger_auc"]]
        tables["transfer"], tables["transfer_agreement"] = write_transfer(out, ledgers)
        plot_calibration(tables["calibration"], tables["summary"], out / "calibration.png", config)
        plot_mechanism(tables["summary"], out / "mechanism.png")
        return {"results": rows, **tables}


@contextmanager
def _panels(rungs: list[str], size: tuple[float, float], path: Path) -> Iterator[np.ndarray]:
    """One row of axes (one per rung, at least one), each ``size`` inches, written to ``path``
    (:func:`~.results.write_figure`) on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(rungs), 1)
    fig, axes = plt.subplots(1, n, figsize=(size[0] * n, size[1]), squeeze=False)
    yield axes[0]
    fig.tight_layout()
    write_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_calibration(
    curve: pd.DataFrame, summary: pd.DataFrame, path: Path, config: StudyConfig | None
) -> None:
    """dapo's clip share against the step size per rung, the target band shaded, the chosen
    step size marked."""
    curve = ladder_order(curve, ["rung", "epochs", "lr"])
    rungs = list(dict.fromkeys(curve["rung"]))
    low, high = (config.target_low, config.target_high) if config else (0.05, 0.10)
    chosen = calibrated_points(summary)
    with _panels(rungs, (4, 3.2), path) as axes:
        for ax, rung in zip(axes, rungs, strict=False):
            c = curve[curve["rung"] == rung].sort_values("lr", kind="stable")
            for mu, m in c.groupby("epochs"):
                ax.plot(m["lr"], m["clip_share"], marker="o", label=f"{mu} epochs")
            ax.axhspan(low, high, color="tab:green", alpha=0.15)
            if rung in chosen:
                lr, mu = chosen[rung]
                pick = c[(c["lr"] == lr) & (c["epochs"] == mu)]
                ax.plot(pick["lr"], pick["clip_share"], "k*", ms=12, label="chosen")
            ax.set(title=rung, xlabel="step size", ylabel="dapo clip share")
            ax.legend(fontsize=7)
            if c["lr"].nunique() > 1:
                ax.set_xscale("log")


#: The stacked bars of :func:`plot_mechanism`: summary column and label.
MASS_BARS = {
    "grad_mass_zero_lo": "discarded Z_lo",
    "grad_mass_zero_hi": "discarded Z_hi",
    "grad_mass_rescued": "rescued",
}


def plot_mechanism(summary: pd.DataFrame, path: Path) -> None:
    """Per rung and rule: the shares of the unclipped gradient mass discarded (Z_lo, Z_hi) and
    rescued, stacked bars."""
    summary = summary.dropna(subset=["grad_mass_zero_lo"])  # the flow has none
    summary = ladder_order(summary, ["rung", "rule"])
    rungs = list(dict.fromkeys(summary["rung"]))
    with _panels(rungs, (4.5, 3.6), path) as axes:
        for ax, rung in zip(axes, rungs, strict=False):
            s = summary[summary["rung"] == rung]
            x, bottom = np.arange(len(s)), np.zeros(len(s))
            for col, label in MASS_BARS.items():
                v = s[col].fillna(0).to_numpy()
                ax.bar(x, v, bottom=bottom, label=label)
                bottom += v
            ax.set_xticks(x, s["rule"], rotation=60, ha="right", fontsize=7)
            ax.set(title=rung, ylabel="share of |r A| mass")
        if axes[0].get_legend_handles_labels()[0]:
            axes[0].legend(fontsize=7)


def rung_bounds(bounds: Mapping[str, Bounds]) -> pd.DataFrame:
    """The baselines table of :func:`study_bounds`: per rung, its pass metrics' ceiling, floor
    (the answer baseline) and where they come from."""
    rows = [(r, b.ceiling, b.floor, b.note) for r, b in bounds.items()]
    return pd.DataFrame(rows, columns=["rung", "ceiling", "floor", "source"])
