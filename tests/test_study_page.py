"""sandbox.study.page: docs/claims.md from page.md and a study folder's tables.

- the committed folder gives the committed page byte for byte, twice, without rewriting it;
- a tiny study folder (``python -m llm.claims --quick``, its ``main`` in this process, from another
  working directory) gives a page with every placeholder filled and says its transfer table is
  absent;
- a result sentence follows the tables: a copy of the tables with a flipped verdict or headroom
  flips the sentence that states it;
- a placeholder without a value, a table that lacks a value and a NaN in the prose are errors
  naming the placeholder.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

import llm.claims  # registers the llm rung (whose baseline the page cites); runs the tiny study
from sandbox.study.page import TEMPLATE, page_values, placeholders, render, write_doc

ROOT = Path(__file__).resolve().parents[1]
LEFT = re.compile(r"\$\{?[A-Za-z_]")  # a placeholder string.Template would fill


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


def test_a_tiny_study_folder_gives_a_page_with_every_placeholder_filled(
    tmp_path, in_process, monkeypatch
):
    out, doc = tmp_path / "study", tmp_path / "claims.md"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # the page cites folders beside the study's, never the cwd's
    # --workers 1: the runs in this process (a pool's start costs more than these tiny runs)
    argv = ["--quick", "--rungs", "bandit_exact", "bandit_sampled", "tiny_tf", "--no-progress"]
    argv += ["--workers", "1"]
    proc = in_process(llm.claims.main, *argv, "--out", str(out), "--doc", str(doc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = doc.read_text()
    assert not LEFT.search(text), LEFT.search(text)
    assert re.search(r"\bnan\b", text, re.IGNORECASE) is None
    assert "![calibration](study/calibration.png)" in text
    assert "Agreement of signs between rungs:" in text  # every study writes transfer.csv
    # the tiny folder's own numbers, not the committed run's
    bounds = pd.read_csv(out / "bounds.csv").set_index("rung")
    assert f"its answer baseline {bounds.loc['tiny_tf', 'floor']:.3f}" in text
    seeds = pd.read_csv(out / "summary.csv")["seeds"].max()
    assert f"The toy rungs' {seeds} paired seeds" in text


@pytest.mark.parametrize(
    "rungs",
    [
        ["bandit_exact", "bandit_sampled", "tiny_tf", "llm"],  # --quick as it comes
        ["bandit_exact"],  # exact only: no paired seeds, an empty power table
        ["bandit_sampled"],
    ],
    ids=["quick", "exact-only", "sampled-only"],
)
def test_every_rung_subset_of_a_quick_study_writes_its_page(tmp_path, in_process, rungs):
    """``llm.claims --quick --doc`` on each rung subset writes a page with every placeholder
    filled and no nan (it refused on the llm rung's tied seeds, ``$grad_noise``, and on an
    exact-only study's empty ``power.csv``)."""
    pytest.importorskip("transformers")
    out, doc = tmp_path / "study", tmp_path / "claims.md"
    argv = ["--quick", "--rungs", *rungs, "--no-progress", "--workers", "1", "--out", str(out)]
    proc = in_process(llm.claims.main, *argv, "--doc", str(doc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = doc.read_text()
    assert not LEFT.search(text), LEFT.search(text)
    assert re.search(r"\bnan\b", text, re.IGNORECASE) is None
    ran = text.split("## The llm rung")[1].split("\n\n")[1]  # what ran, from the folder alone
    if "llm" in rungs:
        assert "`tiny` on `addition` (digits=1)" in ran and "dapo 3, grpo 3, gspo 3" in ran
        assert "dapo's final held-out pass@1 is" in ran and "answer floor" in ran
    else:
        assert ran.startswith("No SmolLM2 run is in this folder")


def test_a_flipped_verdict_flips_the_summary_and_the_mechanism_sentence(folder):
    before = page(folder)
    line = section(before, "- **bandit_sampled** — supported:")
    assert "reversed: kl_cov_keeps_entropy (survives Holm), clip_beats_unclipped" in line
    nsr = 'The paper\'s "consistently more effective" has no support on the toys'
    assert nsr in section(before, "- **Mechanism (c)**")
    edit(
        folder,
        "ledger.csv",
        {"claim": "kl_cov_keeps_entropy", "rung": "bandit_sampled"},
        verdict="supported",
    )
    edit(
        folder,
        "ledger_auc.csv",
        {"claim": "nsr_beats_its_decay", "rung": "bandit_sampled"},
        verdict="supported",
    )
    after = page(folder)
    line = section(after, "- **bandit_sampled** — supported:")
    assert "reversed: clip_beats_unclipped (survives Holm)" in line
    assert "clip_cov_keeps_entropy (survives Holm), kl_cov_keeps_entropy (survives Holm)" in line
    mechanism = section(after, "- **Mechanism (c)**")
    assert nsr not in mechanism
    assert (
        "A gain of nsr_dapo over nsr_decay_dapo is supported on bandit_sampled `reward_auc`"
        in mechanism
    )
    assert "bandit_sampled `reward_auc` (secondary): supported" in mechanism


def test_headroom_sentences_follow_their_tables(folder):
    before = page(folder)
    closed = "bandit_exact, as run, cannot answer the pass-rate claims"
    assert closed in before and "**Headroom decides 4 of 20 pass-rate rows.**" in before
    assert "On tiny_tf, 10 of 10 rules' mean `final_pass` beat its answer baseline 0.272" in before
    # the exact rung's pass-rate rows get verdicts and grpo falls below the baseline
    edit(
        folder, "ledger.csv", {"rung": "bandit_exact", "metric": "final_pass"}, verdict="equivalent"
    )
    edit(folder, "summary.csv", {"rung": "tiny_tf", "rule": "grpo"}, final_pass=0.25)
    after = page(folder)
    assert "as run, cannot answer the pass-rate claims" not in after
    assert "**Headroom decides 0 of 20 pass-rate rows.**" in after
    assert "On tiny_tf, 9 of 10 rules' mean `final_pass` beat its answer baseline 0.272" in after


def test_the_template_has_a_value_for_every_placeholder_and_nothing_else(folder):
    values = page_values(folder, folder.parents[1] / "docs" / "claims.md")
    assert placeholders(TEMPLATE.read_text()) == set(values)


def test_a_placeholder_without_a_value_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"placeholder \$nope has no value"):
        render("a ${nope} b", {})
    with pytest.raises(ValueError, match=r"placeholder \$empty has no value in the tables"):
        render("a $empty b", {"empty": lambda: ""})
    with pytest.raises(ValueError, match=r"page.md line 2: a '\$' that is no placeholder"):
        render("ok\ncosts 5$", {})
    assert render("costs 5$$, $x", {"x": lambda: "y"}) == "costs 5$, y"


def test_a_value_the_tables_lack_is_an_error_naming_the_placeholder(folder):
    power = pd.read_csv(folder / "power.csv").drop(columns=["seeds_needed"])
    power.to_csv(folder / "power.csv", index=False)
    with pytest.raises(ValueError, match=r"placeholder \$power: KeyError: 'seeds_needed'"):
        page(folder)


def test_nan_in_a_result_sentence_is_an_error_naming_the_placeholder(folder):
    edit(folder, "grad_noise.csv", {"rung": "tiny_tf"}, rescue_to_signal=float("nan"))
    with pytest.raises(ValueError, match=r"placeholder \$mechanism_c has no value in the tables"):
        page(folder)


def test_the_transfer_table_is_printed_from_the_folder_when_present(folder):
    rows = [
        (
            "nsr_beats_dapo",
            "final_pass",
            "bandit_sampled",
            0.01,
            -0.002,
            0.022,
            "not resolved at this power",
        ),
        ("nsr_beats_dapo", "final_pass", "tiny_tf", -0.03, -0.05, -0.01, "reversed"),
    ]
    columns = ["claim", "metric", "rung", "estimate", "lo", "hi", "verdict"]
    rows = [(*r, False) for r in rows]  # at_margin: neither decides the claim at the margin
    columns += ["at_margin"]
    pd.DataFrame(rows, columns=columns).to_csv(folder / "transfer.csv", index=False)
    text = section(page(folder), "## Transfer measured on claim effects")
    assert "| claim | metric | bandit_sampled | tiny_tf |" in text
    assert (
        "| nsr_beats_dapo | final_pass | +0.0100 [-0.0020, +0.0220] (not resolved at this power) "
        "| -0.0300 [-0.0500, -0.0100] (reversed) |"
    ) in text
    pd.DataFrame(rows, columns=columns).drop(columns=["verdict"]).to_csv(
        folder / "transfer.csv", index=False
    )
    with pytest.raises(
        ValueError, match=r"placeholder \$transfer: .*lacks the columns \['verdict'\]"
    ):
        page(folder)


def test_the_same_reading_on_every_rung_lists_only_claims_decided_at_the_margin():
    from sandbox.study.page import summary_text

    # (claim, rung, verdict, estimate, lo, hi, holm, margin): "keeps" is reversed on both
    # rungs, but on y its interval [-0.034, -0.007] lies inside +-0.05 (an effect under half
    # its margin, as kl_cov_keeps_entropy on tiny_tf); "past" is supported on both, but Holm takes
    # it back on y; "both" is supported past the margin and Holm on both rungs; "exact" is an
    # exact difference (one run, no test) of +0.03 beyond the margin 0.02 on x and supported on y
    rows = [
        ("keeps", "x", "reversed", -0.33, -0.36, -0.30, "survives", 0.05, 99),
        ("keeps", "y", "reversed", -0.021, -0.034, -0.007, "survives", 0.05, 119),
        ("past", "x", "supported", 0.08, 0.07, 0.09, "survives", 0.02, 99),
        ("past", "y", "supported", 0.04, 0.025, 0.055, "does not survive", 0.02, 119),
        ("both", "x", "supported", 0.09, 0.08, 0.10, "survives", 0.02, 99),
        ("both", "y", "supported", 0.12, 0.07, 0.16, "survives", 0.02, 119),
        ("exact", "x", "supported", 0.03, None, None, "no decision", 0.02, 1),
        ("exact", "y", "supported", 0.05, 0.03, 0.07, "survives", 0.02, 119),
        ("flips", "x", "supported", 0.05, 0.04, 0.06, "survives", 0.02, 99),
        ("flips", "y", "reversed", -0.05, -0.06, -0.04, "survives", 0.02, 119),
    ]
    columns = ["claim", "rung", "verdict", "estimate", "lo", "hi", "holm", "margin", "seeds"]
    text = summary_text(pd.DataFrame(rows, columns=columns))
    assert (
        "decided at the margin on each (supported or reversed, surviving Holm, the whole "
        "interval beyond ±m): both (supported), exact (supported)."
    ) in " ".join(text.split())
    assert (
        "The same verdict on every rung, not decided at the margin on each: keeps (reversed), "
        "past (supported)."
    ) in " ".join(text.split())
    assert "Readings that change between rungs: flips." in " ".join(text.split())


def test_the_page_prints_the_gradient_noise_table_or_says_it_was_not_logged(folder):
    (folder / "grad_noise.csv").unlink()  # as in a folder written before mechanism check (c)
    text = page(folder)
    assert "(not logged)" in text.split("## Mechanism check (c)")[1].split("\n## ")[0]
    assert "- **Mechanism (c)**: NSR's gradient noise was not logged in this folder." in text
    row = {"rung": "tiny_tf", "rule": "nsr_dapo", "seeds": 3, "points": 120}
    row |= {"rescue_to_signal": 0.01, "sampling_to_signal": 0.5, "variance_ratio": 1.75}
    row |= {"lo": 0.106903, "hi": 3.393097}
    pd.DataFrame([row]).to_csv(folder / "grad_noise.csv", index=False)
    table = page(folder).split("## Mechanism check (c)")[1].split("\n## ")[0]
    assert "| tiny_tf | nsr_dapo | 3 | 120 | 0.0100 | 0.5000 | 1.7500 [0.1069, 3.3931] |" in table


def test_every_sentence_of_the_template_is_said_and_every_said_one_exists():
    """``page.md``'s sentence list against ``page.py``: each ``- name:`` item is said (by name,
    or by a name page.py builds from a prefix: ``rung_<rung>``, ``pairing_<scheme>``), each name
    said is in the list, and every line of the list is an item, an indented continuation of one
    or a group heading ending in ``:`` (an unindented continuation would be dropped silently)."""
    from sandbox.study import page as page_module
    from sandbox.study.page import SENTENCES, sentences

    code = Path(page_module.__file__).read_text()
    said = set(re.findall(r"say\(\s*[\"'](\w+)[\"']", code))
    prefixes = tuple(re.findall(r'f"(\w+_)\{', code))
    assert {"rung_", "pairing_", "held_out_"} <= set(prefixes)
    named = set(sentences())
    assert said <= named, sorted(said - named)
    unsaid = [n for n in named - said if not n.startswith(prefixes)]
    assert unsaid == [], unsaid
    body = TEMPLATE.read_text().partition(SENTENCES)[2].split("-->", 1)[1]
    stray = [
        line
        for line in body.splitlines()
        if line.strip() and not line.startswith(("- ", "  ")) and not line.endswith(":")
    ]
    assert stray == [], stray


def test_the_provenance_list_says_what_each_entry_did_not_record(tmp_path):
    """A run with a GPU, uncommitted changes, parts and a note; a run that recorded only its date
    (an empty or null field reads "not recorded" too); the tables entry, whose parts and note
    are not listed; then no record, and a record that lists no command."""
    from sandbox.study.page import provenance_text

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


def test_a_rung_whose_seeds_had_no_sampling_variance_reads_n_a_not_nan(folder):
    """A rung where every group's rewards tied on every step (the tiny Llama of a quick study)
    has no variance ratio: its table row says n/a and the mechanism sentence leaves it out, where
    the page used to refuse to build (``$grad_noise has no value``)."""
    row = {"rung": "tiny_tf", "rule": "nsr_dapo", "seeds": 3, "points": 120}
    row |= {"rescue_to_signal": 0.01, "sampling_to_signal": 0.5, "variance_ratio": 1.75}
    row |= {"lo": 0.106903, "hi": 3.393097}
    tied = {**row, "rung": "llm", "seeds": 0, "points": 3, "variance_ratio": float("nan")}
    tied |= {"rescue_to_signal": float("nan"), "lo": float("nan"), "hi": float("nan")}
    pd.DataFrame([row, tied]).to_csv(folder / "grad_noise.csv", index=False)
    text = page(folder)
    table = text.split("## Mechanism check (c)")[1].split("\n## ")[0]
    assert "| llm | nsr_dapo | 0 | 3 | n/a | 0.5000 | n/a |" in table
    assert "(llm)" not in text.split("- **Mechanism (c)**")[1].split("\n")[0]


def test_the_page_says_where_each_rungs_held_out_problems_come_from():
    """With the partition on, the rung's bullet says its held-out problems are the task's test
    partition; off (every committed run so far), that they may repeat training problems."""
    from sandbox.study.page import rungs_design

    config = {"rungs": ["tiny_tf"]}
    on = rungs_design(config, {"tf": {"split": True}})
    off = rungs_design(config, {})
    assert "test partition, disjoint from every training problem" in on
    assert "may repeat training problems" in off and "disjoint" not in off
