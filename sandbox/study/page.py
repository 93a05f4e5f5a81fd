"""docs/claims.md from a claims-study folder (``python -m llm.claims --tables-only --out
results/claims --doc docs/claims.md``).

The words are ``page.md`` beside this module; its placeholders are filled from the study folder
alone (nothing beside it, nothing relative to the working directory):

- ``{{FILE.csv}}`` or ``{{FILE.csv: col col ...}}``: the folder's table (those columns, in that
  order) as a Markdown table, every cell printed the one way :func:`cell` prints it; a table the
  folder lacks says so, a column it lacks is a ``ValueError`` naming both;
- ``{{name}}``: one of :func:`page_values` (the folder's path, provenance, settings, claims).

The page states no result in words: it prints the tables, and its prose says how to read their
columns, so every profile and rung subset (quick, exact only, toy only, with the llm rung) writes
its page from the same template.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from sandbox.experiments.results import NOT_RECORDED, PROVENANCE, read_provenance, write_text

from .claims import CLAIMS, claim_from_record

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
