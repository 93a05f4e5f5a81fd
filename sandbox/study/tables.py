"""A study folder's outputs: its tables and figures from its rows (:func:`write_tables`: after a
run, and from a folder's parts by :func:`.plan.rebuild_tables`), byte for byte the same from the
same rows; and its page (:func:`write_doc`: docs/claims.md from ``page.md`` and the folder's
tables, below)."""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from sandbox.experiments.results import (
    NOT_RECORDED,
    PROVENANCE,
    read_provenance,
    recording_tables,
    write_csv,
    write_figure,
    write_parquet_if_changed,
    write_text,
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
    write_transfer,
)
from .claims import CLAIMS, Bounds, claim_from_record
from .rungs import StudyConfig, study_bounds, study_claims

#: The tables of the step-size control, written only where it ran (phase ``tune`` rows).
CONTROL_TABLES = {"step_size_choice", "ledger_control"}


def write_tables(
    rows: pd.DataFrame, out: Path, config: StudyConfig | None = None
) -> dict[str, pd.DataFrame]:
    """``results.parquet`` and the CSVs (calibration, scores, summary, ledger, power,
    entropy_law, grad_noise, bounds, axis; with the step-size control, step_size_choice and
    ledger_control, and without it neither is left in ``out``; transfer, transfer_agreement) and
    the figures; returns the tables by name, ``results`` the tidy rows.

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
        for name in CONTROL_TABLES.difference(tables):  # an earlier command's, not this study's
            (out / f"{name}.csv").unlink(missing_ok=True)
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
            for epochs, m in c.groupby("epochs"):
                ax.plot(m["lr"], m["clip_share"], marker="o", label=f"{epochs} epochs")
            ax.axhspan(low, high, color="tab:green", alpha=0.15)
            if rung in chosen:
                lr, epochs = chosen[rung]
                pick = c[(c["lr"] == lr) & (c["epochs"] == epochs)]
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


# -- the page: docs/claims.md from page.md and the folder's tables ---------------------------------
# docs/claims.md from a claims-study folder (``python -m llm.claims --tables-only --out
# results/claims --doc docs/claims.md``).
#
# The words are ``page.md`` beside this module; its placeholders are filled from the study folder
# alone (nothing beside it, nothing relative to the working directory):
#
# - ``{{FILE.csv}}`` or ``{{FILE.csv: col col ...}}``: the folder's table (those columns, in that
#   order) as a Markdown table, every cell printed the one way :func:`cell` prints it; a table the
#   folder lacks says so, a column it lacks is a ``ValueError`` naming both;
# - ``{{name}}``: one of :func:`page_values` (the folder's path, provenance, settings, claims).
#
# The page states no result in words: it prints the tables, and its prose says how to read their
# columns, so every profile and rung subset (quick, exact only, toy only, with the llm rung) writes
# its page from the same template.

TEMPLATE = Path(__file__).with_name("page.md")
#: ``{{FILE.csv}}`` / ``{{FILE.csv: col col}}``: a table of the folder.
TABLE = re.compile(r"\{\{([\w.-]+\.csv)(?::([^}]*))?\}\}")
#: ``{{name}}``: a value of :func:`page_values`.
VALUE = re.compile(r"\{\{(\w+)\}\}")
#: The claims table's columns (a :class:`.claims.Claim`'s fields, as named there).
CLAIM_COLUMNS = ["name", "rule_a", "rule_b", "metric", "direction", "margin", "source", "where"]


def cell(value: object) -> str:
    """A table cell as printed: up to 4 significant digits for a float (a whole number as an
    integer), ``yes``/``no`` for a flag, ``—`` where there is no value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown(frame: pd.DataFrame) -> str:
    """``frame`` as a Markdown table (:func:`cell` per value); ``(no rows)`` without rows."""
    if frame.empty:
        return "(no rows)"
    rows = [[cell(v.item() if hasattr(v, "item") else v) for v in row] for row in frame.values]
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    body = ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([head, "|" + "---|" * frame.shape[1], *body])


def table(out: Path, name: str, columns: list[str]) -> str:
    """The folder's table ``name`` (``columns`` of it; all where none are given) as printed."""
    path = out / name
    if not path.exists():
        return f"(no `{name}` in this folder)"
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return "(no rows)"
    if missing := [c for c in columns if c not in frame.columns]:
        raise ValueError(f"page.md: {name} has no column(s) {missing}")
    return markdown(frame[columns] if columns else frame)


#: One provenance entry as the page lists it (a field not recorded says so).
PROVENANCE_LINE = (
    "- {what}: `{command}` — {date}{parts}; device {device}{gpu}, CPU {cpu_model}, "
    "torch {torch}, Python {python}, torch threads {torch_threads}, OS {os}, "
    "code {git_commit}{dirty}{note}"
)


def provenance_text(out: Path) -> str:
    """The folder's ``provenance.json`` as a list: each command that computed parts (date,
    parts, machine), then the command that last rebuilt the tables."""
    record = read_provenance(out)
    if not record:
        return f"- {NOT_RECORDED} (the folder has no readable `{PROVENANCE}`)"
    entries = [("runs", run) for run in record.get("runs", [])]
    entries += [("tables and figures", record["tables"])] if record.get("tables") else []
    lines = []
    for what, entry in entries:
        run = what == "runs"
        words = defaultdict(lambda: NOT_RECORDED)
        words |= {k: v for k, v in entry.items() if v is not None and v != ""}
        words |= {
            "what": what,
            "gpu": f" ({entry['gpu']})" if entry.get("gpu") else "",
            "dirty": " with uncommitted changes" if entry.get("git_dirty") is True else "",
            "parts": f", {entry['parts']} parts" if run and "parts" in entry else "",
            "note": f" ({entry['note']})" if run and entry.get("note") else "",
        }
        if run and isinstance(entry.get("git_at_end"), dict):  # committed or edited as it ran
            end = entry["git_at_end"]
            changed = " with uncommitted changes" if end.get("git_dirty") is True else ""
            words["note"] += (
                f" (the checkout was at {end.get('git_commit')}{changed} when it ended)"
            )
        lines.append(PROVENANCE_LINE.format_map(words))
    return "\n".join(lines) or f"- {NOT_RECORDED} (`{PROVENANCE}` lists no command)"


def run_dates(out: Path) -> str:
    """The dates of the runs that computed the folder's parts (``provenance.json``)."""
    dates = sorted(
        {str(r.get("date", NOT_RECORDED))[:10] for r in read_provenance(out).get("runs", [])}
    )
    words = ", ".join(dates[:-1]) + " and " + dates[-1] if len(dates) > 1 else "".join(dates)
    return words or NOT_RECORDED


def claims_table(config: dict) -> str:
    """The study's claims: the papers' and the folder's own (``config.json``'s ``claims``)."""
    claims = [*CLAIMS, *(claim_from_record(c) for c in config.get("claims", []))]
    return markdown(pd.DataFrame(claims)[CLAIM_COLUMNS])


def page_values(out: Path, path: Path) -> dict[str, Callable[[], str]]:
    """The text of each ``{{name}}`` of ``page.md`` from the folder ``out`` (the page is
    written to ``path``; its links are relative to it)."""
    config = json.loads((out / "config.json").read_text())
    return {
        "rel": lambda: os.path.relpath(out, path.parent),
        "provenance": lambda: provenance_text(out),
        "config": lambda: "\n".join(f"    {k}: {v}" for k, v in config.items()),
        "claims": lambda: claims_table(config),
        "run_dates": lambda: run_dates(out),
    }


def render(template: str, out: Path, path: Path) -> str:
    """``template`` with its tables and values filled from the folder ``out``; a ``{{name}}``
    without a value is a ``ValueError`` naming it."""
    values = page_values(out, path)
    text = TABLE.sub(lambda m: table(out, m.group(1), (m.group(2) or "").split()), template)

    def value(match: re.Match) -> str:
        if match.group(1) not in values:
            raise ValueError(f"page.md: {match.group(0)} has no value")
        return values[match.group(1)]()

    return VALUE.sub(value, text)


def write_doc(out: Path, path: Path) -> None:
    """Write the page ``path`` from the tables in ``out`` (rewritten only when it changes)."""
    out, path = Path(out), Path(path)
    if not (out / "config.json").exists():
        raise ValueError(f"--out: {out} has no config.json (not a claims-study folder)")
    if not (out / "ledger.csv").read_text().strip():
        raise ValueError("the study's rules make no claim (empty ledger.csv): no page")
    write_text(render(TEMPLATE.read_text(), out, path), path)
