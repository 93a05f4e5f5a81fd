"""Tables, figures and pages are reproducible from their parts, and results folders carry their
provenance (sandbox.experiments.results).

- the writers: one CSV float format, PNGs without a version stamp, a file rewritten only when its
  bytes (parquet: its frame) change;
- the claims study's tables: the same bytes from the same parts read in
  any order; the committed study rebuilt by the documented command changes no file;
- provenance.json: its fields, written when parts are computed, never part of the settings check.
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

from sandbox.experiments import results as R

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("command", "date", "device", "cpu_model", "gpu", "torch", "python", "torch_threads")
FIELDS += ("cpu_count", "os", "git_commit", "git_dirty")


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
    )
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file directly in ``folder``: its bytes and mtime (ns)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()}


# -- the writers ------------------------------------------------------------------------------


def test_csv_uses_one_float_format_and_is_written_only_when_its_bytes_change(tmp_path):
    path = tmp_path / "t.csv"
    frame = pd.DataFrame({"a": [0.1 + 0.2, 1 / 3, np.nan], "b": ["x", "y", "z"]})
    assert R.write_csv(frame, path)
    # 0.1 + 0.2 = 0.30000000000000004 -> 0.3 at 10 significant digits; 1/3 -> 0.3333333333
    assert path.read_text() == "a,b\n0.3,x\n0.3333333333,y\n,z\n"
    stamp = path.stat().st_mtime_ns
    assert not R.write_csv(frame.assign(a=[0.3, 1 / 3 + 1e-17, np.nan]), path)  # same text
    assert path.stat().st_mtime_ns == stamp
    assert R.write_csv(frame.assign(a=[0.4, 1 / 3, np.nan]), path)
    assert path.read_text().splitlines()[1] == "0.4,x"
    assert not list(tmp_path.glob(f"*{R.TMP_SUFFIX}"))  # no temp file left behind


def test_parquet_is_rewritten_only_when_its_frame_changes(tmp_path):
    path = tmp_path / "r.parquet"
    frame = pd.DataFrame({"step": [1, 2], "x": [0.5, np.nan], "rule": ["dapo", "grpo"]})
    assert R.write_parquet_if_changed(frame, path)
    stamp = path.stat().st_mtime_ns
    assert not R.write_parquet_if_changed(frame.copy(), path)
    assert path.stat().st_mtime_ns == stamp
    # the same frame in a file whose bytes differ (another writer's compression): left alone
    frame.to_parquet(path, index=False, compression="gzip")
    other = path.read_bytes()
    assert not R.write_parquet_if_changed(frame, path)
    assert path.read_bytes() == other
    assert R.write_parquet_if_changed(frame.assign(x=[0.5, 0.25]), path)  # a value changed
    assert pd.read_parquet(path)["x"].tolist() == [0.5, 0.25]
    assert R.write_parquet_if_changed(frame.iloc[::-1], path)  # the order is content too
    assert pd.read_parquet(path)["rule"].tolist() == ["grpo", "dapo"]


def test_a_figure_has_no_version_stamp_and_the_same_bytes_when_redrawn(tmp_path):
    def draw(path: Path) -> bool:
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1, 2], [0.1, 0.4, 0.2], marker="o")
        changed = R.write_figure(fig, path, dpi=50)
        plt.close(fig)
        return changed

    path = tmp_path / "f.png"
    assert draw(path)
    data, stamp = path.read_bytes(), path.stat().st_mtime_ns
    assert data.startswith(b"\x89PNG") and b"Matplotlib" not in data and b"Software" not in data
    assert not draw(path)
    assert path.read_bytes() == data and path.stat().st_mtime_ns == stamp


def test_read_parts_orders_the_parts_by_file_name(tmp_path):
    for name, step in (("b", 2), ("a", 1), ("c", 3)):
        R.write_parquet_atomic(pd.DataFrame({"step": [step]}), tmp_path / f"{name}.parquet")
    assert R.read_parts(tmp_path)["step"].tolist() == [1, 2, 3]


# -- tables from parts read in any order ------------------------------------------------------

STUDY_RULES = ("dapo", "nsr_dapo")


def _study_parts() -> list[Path]:
    """Every calibration part of the committed claims study and the study parts of two rules
    (a claim, the grad-noise check, every rung)."""
    parts = sorted((ROOT / "results" / "claims" / "parts").glob("*.parquet"))
    keep = [p for p in parts if p.name.startswith("calib__")]
    keep += [p for p in parts if p.name.split("__")[2] in STUDY_RULES and "study__" in p.name]
    return keep


def test_study_tables_are_the_same_bytes_whatever_the_order_of_the_parts(tmp_path):
    from sandbox.study import StudyConfig, analysis, write_tables

    files = _study_parts()
    config = StudyConfig(rules=list(STUDY_RULES))
    in_order = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    reversed_parts = pd.concat([pd.read_parquet(f) for f in files[::-1]], ignore_index=True)
    shuffled = reversed_parts.sample(frac=1.0, random_state=3)  # every row somewhere else
    tables = write_tables(in_order, tmp_path / "a", config)
    write_tables(shuffled, tmp_path / "b", config)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    names = {"results.parquet", "calibration.png", "mechanism.png", "provenance.json"}
    names |= {f"{n}.csv" for n in tables if n != "results"}  # results: the rows, as parquet
    assert set(a) == set(b) == names
    for name in names - {"provenance.json", "results.parquet"}:
        assert a[name][0] == b[name][0], name
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / "a" / "results.parquet"),
        pd.read_parquet(tmp_path / "b" / "results.parquet"),
    )
    # the tables are in ladder order, then by rule (and seed)
    scores = tables["scores"]
    rungs = ["bandit_exact", "bandit_sampled", "tiny_tf", "llm"]
    assert list(dict.fromkeys(scores["rung"])) == rungs
    ladder = scores.sort_values(["rule", "seed"])
    ladder = ladder.sort_values("rung", kind="stable", key=lambda r: r.map(rungs.index))
    assert scores.equals(ladder)
    assert len(tables["grad_noise"]) == 3 and len(tables["ledger"]) == 4  # one claim, 4 rungs
    # each table function alone gives the same table, to the last bit, from rows in any order
    for name, table_of in (
        ("scores", analysis.run_scores),
        ("calibration", analysis.calibration_curve),
        ("entropy_law", analysis.entropy_law),
        ("grad_noise", analysis.gradient_noise),
    ):
        pd.testing.assert_frame_equal(table_of(shuffled), tables[name], check_exact=True)


def test_rebuilding_the_committed_claims_study_changes_no_file(tmp_path):
    """The documented command (python -m llm.claims --tables-only --doc) on a copy of the
    committed study reproduces every table, figure, provenance and the page byte for byte, and
    rewrites nothing (mtimes kept). A real process: in this one, a command run before may have
    changed matplotlib's global state (sandbox.experiments.plots sets seaborn's theme, which
    remaps the colour code 'k' beyond rcParams), and the figures' bytes with it."""
    copy = tmp_path / "results" / "claims"
    shutil.copytree(ROOT / "results" / "claims", copy)  # copy2: mtimes kept
    for cited in ("claims_exact_mu", "regimes", "llm_pilot"):  # the page cites them
        if (ROOT / "results" / cited).exists():
            shutil.copytree(ROOT / "results" / cited, copy.parent / cited)
    page = tmp_path / "docs" / "claims.md"
    page.parent.mkdir()
    shutil.copy2(ROOT / "docs" / "claims.md", page)
    before = _files(copy)
    page_before = (page.read_bytes(), page.stat().st_mtime_ns)
    proc = _run("-m", "llm.claims", "--tables-only", "--out", str(copy), "--doc", str(page))
    assert proc.returncode == 0, proc.stderr
    after = _files(copy)
    assert after.keys() == before.keys()
    changed = [name for name in before if after[name] != before[name]]
    assert changed == []
    assert (page.read_bytes(), page.stat().st_mtime_ns) == page_before


# -- provenance -------------------------------------------------------------------------------


def _check_entry(entry: dict, command: str) -> None:
    assert set(FIELDS) <= set(entry)
    assert command in entry["command"]
    date = datetime.datetime.fromisoformat(entry["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.UTC) - date).total_seconds()) < 600
    assert entry["device"] == "cpu" and entry["gpu"] is None
    assert entry["torch"] == torch.__version__
    assert entry["python"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(entry["torch_threads"], int) and entry["torch_threads"] >= 1
    assert entry["cpu_model"] == R.cpu_model() and entry["cpu_model"] != R.NOT_RECORDED
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert entry["git_commit"] == (commit or R.NOT_RECORDED)


def test_a_compare_run_records_its_provenance_which_is_not_a_setting(tmp_path, in_process):
    """The first run is the real command (its record names the command that process ran); the
    resumed and the forced runs go through ``sandbox.cli.main`` in this process."""
    from sandbox.cli import main as cli

    base = ["compare", "--out", str(tmp_path), "--name", "x", "--settings", "easy"]
    base += ["--objectives", "grpo", "--seeds", "2", "--workers", "1", "--no-progress"]
    out = tmp_path / "x"
    first = _run("-m", "sandbox.cli", *base, "--steps", "3")
    assert first.returncode == 0, first.stderr
    record = json.loads((out / "provenance.json").read_text())
    assert len(record["runs"]) == 1 and record["runs"][0]["parts"] == 2  # sampled + exact
    _check_entry(record["runs"][0], "-m sandbox.cli compare --out")
    _check_entry(record["tables"], "-m sandbox.cli compare --out")
    assert "provenance" not in json.loads((out / "plan.json").read_text())

    # the same command on "another machine": its provenance differs, the folder is resumed
    record["runs"][0].update(cpu_model="another CPU", torch="0.0", torch_threads=64)
    (out / "provenance.json").write_text(json.dumps(record))
    files = _files(out)
    again = in_process(cli, *base, "--steps", "3")
    assert again.returncode == 0, again.stderr
    assert "2 of 2 runs already done" in again.stderr
    assert _files(out) == files  # nothing computed, no table changed: nothing rewritten

    # other settings: their own parts, and the record gains this command's entry
    other = in_process(cli, *base, "--steps", "4")
    assert other.returncode == 0, other.stderr
    runs = json.loads((out / "provenance.json").read_text())["runs"]
    assert [r["parts"] for r in runs] == [2, 2] and runs[1]["cpu_model"] == R.cpu_model()
    assert runs[0]["cpu_model"] == "another CPU"  # the first command's entry is kept


def test_a_resumed_run_adds_its_provenance_entry_and_keeps_the_others(tmp_path):
    (tmp_path / "parts").mkdir()
    R.write_parquet_atomic(pd.DataFrame({"x": [1]}), tmp_path / "parts" / "a.parquet")
    R.record_run(tmp_path, device="cpu", parts=1)
    record = R.read_provenance(tmp_path)
    record["runs"][0].update(device="cuda", gpu="another GPU", torch="9.9", steps=99)
    (tmp_path / R.PROVENANCE).write_text(json.dumps(record))
    R.record_run(tmp_path, device="cpu", parts=2)  # a resumed run adds its entry
    runs = R.read_provenance(tmp_path)["runs"]
    assert [r["parts"] for r in runs] == [1, 2] and runs[0]["gpu"] == "another GPU"


def test_tables_provenance_is_recorded_only_when_a_table_changes(tmp_path):
    frame = pd.DataFrame({"a": [1.5]})
    with R.recording_tables(tmp_path):
        R.write_csv(frame, tmp_path / "t.csv")
    first = R.read_provenance(tmp_path)["tables"]
    # this process's own command line: pytest, or an xdist worker's under `pytest -n 2`
    _check_entry(first, R.command_line())
    stamp = (tmp_path / R.PROVENANCE).stat().st_mtime_ns
    with R.recording_tables(tmp_path):
        R.write_csv(frame, tmp_path / "t.csv")  # the same bytes
    assert (tmp_path / R.PROVENANCE).stat().st_mtime_ns == stamp


@pytest.mark.parametrize("folder", ["claims", "claims_exact_mu"])
def test_the_committed_folders_account_for_every_part_and_say_what_was_not_recorded(folder):
    record = R.read_provenance(ROOT / "results" / folder)
    parts = len(list((ROOT / "results" / folder / "parts").glob("*.parquet")))
    pruned = sum(entry["parts"] for entry in record.get("pruned", []))  # --tables-only --prune
    assert sum(run["parts"] for run in record["runs"]) - pruned == parts  # every part accounted for
    for entry in [*record["runs"], *record.get("pruned", []), record["tables"]]:
        assert set(FIELDS) <= set(entry)
        assert all(v not in ("", "unknown") for v in entry.values())
    for run in record["runs"]:  # every run since 2026-11-26 recorded everything
        assert run["device"] == "cpu" and run["torch"].startswith("2.13.0")
        assert run["date"] >= "2026-11-26" and "not recorded" not in str(run)


def test_a_run_records_the_code_it_began_with_and_a_commit_made_while_it_ran(tmp_path, monkeypatch):
    """A long study runs while its author commits: its parts were computed by the checkout as it
    was when the command began, so that is the entry's ``git_commit``/``git_dirty``, and the
    checkout at the end is ``git_at_end`` (it recorded the end's alone, naming code that computed
    nothing of it); no ``git_at_end`` when nothing changed."""
    from sandbox.experiments import planner
    from sandbox.experiments.planner import Job, RunFolder

    states = iter([{"git_commit": "a" * 40, "git_dirty": False}])
    end = {"git_commit": "b" * 40, "git_dirty": True}

    def fake() -> dict:  # the first call is the start's
        return next(states, end)

    monkeypatch.setattr(planner, "git_commit", fake)
    monkeypatch.setattr(R, "git_commit", fake)
    folder = RunFolder(tmp_path / "f", {"steps": 1})
    folder.run(lambda: [pd.DataFrame({"x": [1]})], [Job("a", ("a.parquet",), ())], total=1)
    entry = R.read_provenance(tmp_path / "f")["runs"][0]
    assert (entry["git_commit"], entry["git_dirty"]) == ("a" * 40, False)
    assert entry["git_at_end"] == end
    monkeypatch.setattr(planner, "git_commit", lambda: end)
    folder = RunFolder(tmp_path / "g", {"steps": 1})
    folder.run(lambda: [pd.DataFrame({"x": [1]})], [Job("a", ("a.parquet",), ())], total=1)
    entry = R.read_provenance(tmp_path / "g")["runs"][0]
    assert entry["git_commit"] == "b" * 40 and "git_at_end" not in entry
