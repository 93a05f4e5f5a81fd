"""sandbox.study.tables, the page: docs/claims.md from page.md and a study folder's tables.

- the committed folder gives the committed page byte for byte, twice, without rewriting it, and
  from the folder alone (nothing beside it is read);
- every profile and rung subset of ``python -m llm.claims --quick`` (its ``main`` in this
  process, from another working directory) writes its page with every placeholder filled;
- a cell of the page follows its table; a table the folder lacks says so; a column a table lacks
  and a placeholder without a value are errors naming them.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

import llm.claims  # registers the llm rung (whose baseline the page cites); runs the tiny study
from sandbox.study.tables import TABLE, TEMPLATE, VALUE, cell, page_values, render, write_doc

ROOT = Path(__file__).resolve().parents[1]
LEFT = re.compile(r"\{\{")  # a placeholder left unfilled


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the committed study's tables (no parts) and of the folders the page cites beside
    it (the exact flow's mu grid, the regime pilot, the llm task pilot)."""
    for name in ("claims", "claims_exact_mu", "regimes", "llm_pilot"):
        if not (ROOT / "results" / name).exists():
            continue
        shutil.copytree(
            ROOT / "results" / name,
            tmp_path / "results" / name,
            ignore=shutil.ignore_patterns("parts"),
        )
    (tmp_path / "docs").mkdir()
    return tmp_path / "results" / "claims"


def page(out: Path) -> str:
    path = out.parents[1] / "docs" / "claims.md"
    write_doc(out, path)
    return path.read_text()


def section(text: str, start: str) -> str:
    return text.split(start, 1)[1].split("\n- **", 1)[0].split("\n## ", 1)[0]


def edit(out: Path, name: str, where: dict[str, str], **values: object) -> None:
    """Set ``values`` in the rows of ``out/name`` that match ``where``."""
    table = pd.read_csv(out / name)
    rows = pd.Series(True, index=table.index)
    for column, value in where.items():
        rows &= table[column].astype(str) == value
    assert rows.sum() >= 1, (name, where)
    for column, value in values.items():
        table.loc[rows, column] = value
    table.to_csv(out / name, index=False)


def test_the_committed_folder_gives_the_committed_page_byte_for_byte(folder, monkeypatch):
    monkeypatch.chdir(folder.parents[2])  # nothing is read relative to the working directory
    path = folder.parents[1] / "docs" / "claims.md"
    write_doc(folder, path)
    assert path.read_bytes() == (ROOT / "docs" / "claims.md").read_bytes()
    stamp = path.stat().st_mtime_ns
    write_doc(folder, path)  # twice: no byte changes, and the file is not rewritten
    assert path.read_bytes() == (ROOT / "docs" / "claims.md").read_bytes()
    assert path.stat().st_mtime_ns == stamp


def test_the_page_is_written_from_the_study_folder_alone(folder, tmp_path):
    """The folders beside the study's (the exact flow's mu grid, the regime pilot, the llm task
    pilot) are cited by name, never read: without them the page is the same."""
    alone = tmp_path / "alone" / "results" / "claims"
    shutil.copytree(folder, alone)
    (alone.parents[1] / "docs").mkdir()
    assert page(alone) == (ROOT / "docs" / "claims.md").read_text()


@pytest.mark.parametrize(
    "rungs",
    [
        ["bandit_exact", "bandit_sampled", "tiny_tf"],  # toy only
        ["bandit_exact", "bandit_sampled", "tiny_tf", "llm"],  # --quick as it comes
        ["bandit_exact"],  # exact only: no paired seeds, an empty power table
        ["bandit_sampled"],
    ],
    ids=["toy-only", "quick", "exact-only", "sampled-only"],
)
def test_every_rung_subset_of_a_quick_study_writes_its_page(
    tmp_path, in_process, monkeypatch, rungs
):
    """``llm.claims --quick --doc`` on each rung subset writes a page with every placeholder
    filled, its own tables' cells (not the committed run's) and nothing from the working
    directory."""
    if "llm" in rungs:
        pytest.importorskip("transformers")
    out, doc = tmp_path / "study", tmp_path / "claims.md"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    argv = ["--quick", "--rungs", *rungs, "--no-progress", "--workers", "1", "--out", str(out)]
    proc = in_process(llm.claims.main, *argv, "--doc", str(doc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = doc.read_text()
    assert not LEFT.search(text), LEFT.search(text)
    assert re.search(r"\bnan\b", text, re.IGNORECASE) is None
    assert "![calibration](study/calibration.png)" in text
    summary = pd.read_csv(out / "summary.csv")
    for row in summary.itertuples():
        assert f"| {row.rung} | {row.rule} | {row.seeds} | {cell(row.lr)} |" in text
    assert ("| llm |" in text) == ("llm" in rungs)


def test_a_cell_of_the_page_follows_its_table(folder):
    before = page(folder)
    row = "| kl_cov_keeps_entropy | bandit_sampled | final_entropy |"
    assert f"{row} " in before and "| reversed |" in before.split(row)[1].split("\n")[0]
    edit(
        folder,
        "ledger.csv",
        {"claim": "kl_cov_keeps_entropy", "rung": "bandit_sampled"},
        verdict="supported",
    )
    after = page(folder)
    assert "| supported |" in after.split(row)[1].split("\n")[0]


def test_a_table_the_folder_lacks_says_so_and_a_column_it_lacks_is_an_error(folder):
    (folder / "grad_noise.csv").unlink()  # as in a folder written before mechanism check (c)
    assert "(no `grad_noise.csv` in this folder)" in page(folder)
    power = pd.read_csv(folder / "power.csv").drop(columns=["seeds_needed"])
    power.to_csv(folder / "power.csv", index=False)
    assert "| rung | metric | seeds | rules | residual_sd | diff_sd | margin |\n" in page(folder)
    with pytest.raises(ValueError, match=r"page.md: ledger.csv has no column\(s\) \['nope'\]"):
        render("{{ledger.csv: claim nope}}", folder, folder / "x.md")


def test_a_placeholder_without_a_value_is_an_error_naming_it(folder):
    with pytest.raises(ValueError, match=r"page.md: \{\{nope\}\} has no value"):
        render("a {{nope}} b", folder, folder / "x.md")
    names = set(VALUE.findall(TEMPLATE.read_text()))
    assert names == set(page_values(folder, folder / "x.md"))  # every value is used
    tables = {name for name, _ in TABLE.findall(TEMPLATE.read_text())}
    assert {f.name for f in folder.glob("*.csv")} - tables <= {"scores.csv", "calibration_mu.csv"}


def test_a_cell_is_printed_one_way():
    assert [cell(x) for x in (0.0734512, 880.0, 1e-05, float("nan"), None, True, False)] == [
        "0.07345",
        "880",
        "1e-05",
        "—",
        "—",
        "yes",
        "no",
    ]
    assert cell("a|b") == "a\\|b" and cell(float("inf")) == "∞"


def test_the_provenance_list_says_what_each_entry_did_not_record(tmp_path):
    """A run with a GPU, uncommitted changes, parts and a note; a run that recorded only its date
    (an empty or null field reads "not recorded" too); the tables entry, whose parts and note
    are not listed; then no record, and a record that lists no command."""
    from sandbox.study.tables import provenance_text

    machine = {"device": "cuda", "gpu": "H100", "cpu_model": "", "torch": "2.13.0"}
    machine |= {"python": "3.11.7", "torch_threads": 2, "os": None, "git_commit": "abc"}
    run = {"command": "python -m llm.claims --quick", "date": "2026-01-02", **machine}
    run |= {"git_dirty": True, "parts": 3, "note": "resumed"}
    tables = {"command": "python -m llm.claims --tables-only", "date": "2026-01-04"}
    tables |= {"device": "cpu", "parts": 9, "note": "not listed", "git_dirty": False}
    moved = {"date": "2026-01-05", "git_commit": "abc", "git_dirty": False, "parts": 1}
    moved |= {"git_at_end": {"git_commit": "def", "git_dirty": True}}  # committed as it ran
    record = {"runs": [run, {"date": "2026-01-03"}, moved], "tables": tables}
    (tmp_path / "provenance.json").write_text(json.dumps(record))
    unknown = "CPU not recorded, torch not recorded, Python not recorded, torch threads not "
    unknown += "recorded, OS not recorded, code not recorded"
    assert provenance_text(tmp_path).split("\n") == [
        "- runs: `python -m llm.claims --quick` — 2026-01-02, 3 parts; device cuda (H100), "
        "CPU not recorded, torch 2.13.0, Python 3.11.7, torch threads 2, OS not recorded, "
        "code abc with uncommitted changes (resumed)",
        f"- runs: `not recorded` — 2026-01-03; device not recorded, {unknown}",
        f"- runs: `not recorded` — 2026-01-05, 1 parts; device not recorded, "
        f"{unknown.replace('code not recorded', 'code abc')} (the checkout was at def with "
        "uncommitted changes when it ended)",
        f"- tables and figures: `python -m llm.claims --tables-only` — 2026-01-04; device cpu, "
        f"{unknown}",
    ]
    (tmp_path / "provenance.json").unlink()
    no_file = "- not recorded (the folder has no readable `provenance.json`)"
    assert provenance_text(tmp_path) == no_file
    (tmp_path / "provenance.json").write_text('{"runs": []}')
    assert provenance_text(tmp_path) == "- not recorded (`provenance.json` lists no command)"


def test_one_interval_format_serves_every_table():
    """analysis.fmt_interval: the ledger's, the transfer table's, the noise table's and the
    mechanism text's "estimate [lo, hi]", each at its precision; the estimate alone without both
    ends."""
    from sandbox.study.analysis import fmt_ci, fmt_interval

    assert fmt_interval(0.0123, -0.003, 0.027) == "+0.0123 [-0.0030, +0.0270]"
    assert fmt_interval(1.234, 0.5, 2.0, ".2f") == "1.23 [0.50, 2.00]"
    nan = float("nan")
    assert fmt_interval(1.234, nan, nan, ".2f", alone=" (no interval)") == "1.23 (no interval)"
    assert fmt_interval(0.5, 0.1, nan) == "+0.5000"
    assert fmt_ci(0.25, 0.75, ".2f") == "[0.25, 0.75]"
