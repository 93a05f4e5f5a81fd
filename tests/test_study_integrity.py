"""Results are never overwritten or mixed silently, and bad study arguments are one line.

Each test runs the real command (``python -m llm.claims``, ``clip-sandbox``) with real files and
folders, and checks the exit status, stderr and what is left on disk: in a subprocess for each
kind of error of each command (the one line a user sees, no traceback), through the command's
``main`` in this process (the ``in_process`` fixture) where the finding is the folder or the
output of several runs, which saves a fresh interpreter's imports per run.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_main

from llm.claims import main as claims
from sandbox.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
#: The claims study at its quick sizes on the exact flow alone: the folder logic, in seconds; its
#: runs in the command's own process (``--workers 1``: no pool to start, whose forkserver alone
#: imports torch; the pool is tested in tests/test_claims_time_budget.py).
FAST = ["--quick", "--rungs", "bandit_exact", "--no-progress", "--workers", "1"]


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
    )
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_default_study_folder_is_never_the_committed_evidence():
    from llm.claims import parse_args

    assert parse_args([])[1].out == "runs/claims-cpu"
    assert parse_args(["--quick"])[1].out == "runs/claims-quick"
    assert parse_args(["--profile", "gpu"])[1].out == "runs/claims-gpu"


@pytest.fixture(scope="module")
def fast_study(tmp_path_factory) -> Path:
    """The FAST study, made once for the tests that start from it (each works on its own copy:
    :func:`_copy_of`); ``llm.claims.main`` in this process, its output kept out of the log."""
    out = tmp_path_factory.mktemp("fast") / "study"
    done = run_main(claims, *FAST, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


def _copy_of(study: Path, tmp_path: Path) -> Path:
    """A copy of ``study`` in ``tmp_path`` (files' mtimes kept)."""
    return Path(shutil.copytree(study, tmp_path / "study"))


def _parts(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in ``out/parts``: its bytes and mtime (ns)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (out / "parts").iterdir()}


def test_a_study_of_other_settings_computes_its_own_parts_and_never_mixes_them(
    tmp_path, in_process, fast_study
):
    """Other settings name other parts (each part's name ends in its spec's hash): the study
    computes them beside the old ones, its tables hold only its own runs, and the old command
    finds its parts again and rebuilds its tables, recomputing nothing."""
    out = _copy_of(fast_study, tmp_path)
    before = pd.read_csv(out / "scores.csv")
    old = _parts(out)
    steps = pd.read_parquet(out / "results.parquet")["step"].max()
    five = ["--bandit-steps", "5", "--bandit-exact-steps", "5"]  # both bandit rungs
    changed = in_process(claims, *FAST, *five, "--out", str(out))
    assert changed.returncode == 0, changed.stderr
    new = {n: v for n, v in _parts(out).items() if n not in old}
    assert all(_parts(out)[n] == v for n, v in old.items())  # the old parts untouched
    study = {n.rsplit("__", 1)[0] for n in old if n.startswith("study__")}
    assert len(study) == 4 and len(old) > len(study)  # a part per rule, and calibration parts
    # the study's runs again; calibration's are reused (--quick calibrates over its own steps)
    assert {n.rsplit("__", 1)[0] for n in new} == study
    results = pd.read_parquet(out / "results.parquet")
    assert results["step"].max() == 5 and steps != 5  # none of the old runs mixed in
    same = in_process(claims, *FAST, "--out", str(out))  # the old command: its parts, reused
    assert same.returncode == 0 and "running the other 0" in same.stderr, same.stderr
    pd.testing.assert_frame_equal(pd.read_csv(out / "scores.csv"), before)
    # forced: the plan's parts recomputed, to the same bytes' worth of rows
    forced = in_process(claims, *FAST, "--force", "--out", str(out))
    assert forced.returncode == 0, forced.stderr
    for name, (_, stamp) in old.items():
        assert _parts(out)[name][1] > stamp, name
    pd.testing.assert_frame_equal(pd.read_csv(out / "scores.csv"), before)


def test_prune_deletes_only_the_parts_the_recorded_study_does_not_read(
    tmp_path, in_process, fast_study
):
    """After a study of other settings, ``--tables-only --prune`` deletes the old settings' parts
    and nothing the recorded study reads: its tables rebuild to the same bytes, its provenance
    accounts for every part on disk (``runs`` less ``pruned``), a second prune removes nothing,
    and ``--prune`` without ``--tables-only`` is one line."""
    out = _copy_of(fast_study, tmp_path)
    old_study = {n for n in _parts(out) if n.startswith("study__")}
    five = ["--bandit-steps", "5", "--bandit-exact-steps", "5"]
    assert in_process(claims, *FAST, *five, "--out", str(out)).returncode == 0
    tables = {p.name: p.read_bytes() for p in out.glob("*.csv")}
    read = set(_parts(out)) - old_study  # the shared calibration and the 5-step study
    pruned = in_process(claims, "--tables-only", "--prune", "--out", str(out))
    assert pruned.returncode == 0, pruned.stderr
    assert f"pruned {len(old_study)} parts" in pruned.stderr and len(old_study) == 4
    assert set(_parts(out)) == read
    assert {p.name: p.read_bytes() for p in out.glob("*.csv")} == tables
    record = json.loads((out / "provenance.json").read_text())
    computed = sum(run["parts"] for run in record["runs"])
    assert computed - sum(entry["parts"] for entry in record["pruned"]) == len(read)
    again = in_process(claims, "--tables-only", "--prune", "--out", str(out))
    assert again.returncode == 0 and "pruned 0 parts" in again.stderr, again.stderr
    assert len(json.loads((out / "provenance.json").read_text())["pruned"]) == 1
    alone = in_process(claims, *FAST, "--prune", "--out", str(out))
    _one_line_error(alone, "--prune: only with --tables-only")


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "llm.claims", *FAST, "--out"],
        ["-m", "sandbox.cli", "compare", "--objectives", "grpo", "--settings", "easy", "--out"],
        ["-m", "sandbox.cli", "sweep", str(ROOT / "sweeps" / "clip_higher.toml"), "--out"],
    ],
    ids=["claims", "compare", "sweep"],
)
def test_an_out_path_that_is_a_file_is_one_line(tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    target = blocker if command[1] == "llm.claims" else blocker / "sub"
    proc = _run(*command, str(target))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "file" in proc.stderr.strip().splitlines()[-1]
    assert blocker.read_text() == "not a folder"


def test_a_compare_run_of_a_subset_reports_its_runs_and_says_what_was_done(tmp_path, in_process):
    base = ["compare", "--out", str(tmp_path), "--name", "x", "--settings", "easy", "--seeds", "2"]
    base += ["--steps", "3", "--workers", "1", "--no-progress"]
    assert in_process(cli, *base, "--objectives", "grpo", "dapo", "sapo").returncode == 0
    subset = in_process(cli, *base, "--objectives", "grpo", "dapo")
    assert subset.returncode == 0, subset.stderr
    assert "4 of 4 runs already done" in subset.stderr  # sampled + exact per rule
    summary = pd.read_csv(tmp_path / "x" / "summary.csv")
    assert set(summary["objective"]) == {"grpo", "dapo"}  # this command's runs, reused
    assert len(list((tmp_path / "x" / "parts").glob("*.parquet"))) == 6  # sapo's stay on disk


def test_sweep_with_the_ray_backend_but_no_ray_fails_before_writing(tmp_path, monkeypatch):
    import importlib.util

    from sandbox.experiments import sweep

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n, *a)
    )
    plan = sweep.with_overrides(
        sweep.load_sweep(ROOT / "sweeps" / "clip_higher.toml"), seeds=1, steps=2
    )
    with pytest.raises(ValueError, match="--backend ray needs Ray"):
        sweep.run_sweep(plan, tmp_path / "s", backend="ray", progress=False)
    assert not (tmp_path / "s").exists()


def _read_only_place() -> Path | None:
    """A folder no one may create (sysfs refuses mkdir, even to root), or None."""
    probe = Path("/sys/clip-sandbox-probe")
    try:
        probe.mkdir()
    except OSError:
        return probe
    probe.rmdir()  # pragma: no cover - a writable /sys
    return None


@pytest.mark.skipif(_read_only_place() is None, reason="no read-only filesystem at /sys here")
@pytest.mark.parametrize(
    "command",
    [
        ["-m", "llm.claims", *FAST, "--out", "{ro}"],
        [
            "-m",
            "sandbox.cli",
            "compare",
            "--objectives",
            "grpo",
            "--settings",
            "easy",
            "--out",
            "{ro}",
        ],
        ["-m", "sandbox.cli", "sweep", str(ROOT / "sweeps" / "clip_higher.toml"), "--out", "{ro}"],
        ["-m", "llm.train", "--steps", "1", "--out", "{ro}"],
    ],
    ids=["claims", "compare", "sweep", "llm.train"],
)
def test_an_out_folder_that_cannot_be_written_is_one_line(command):
    ro = str(_read_only_place())
    proc = _run(*[c.format(ro=ro) for c in command])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot be written" in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_force_on_a_part_that_cannot_be_replaced_is_one_line(tmp_path, in_process, fast_study):
    out = _copy_of(fast_study, tmp_path)
    stuck = sorted((out / "parts").glob("*.parquet"))[0]
    lock = subprocess.run(["chattr", "+i", str(stuck)], capture_output=True)
    if lock.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {lock.stderr.decode().strip()}")
    try:
        proc = _run("-m", "llm.claims", *FAST, "--force", "--out", str(out))
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    _one_line_error(proc, "cannot write the part")
    assert stuck.name in proc.stderr
    # the part is whole: the same command without --force reuses it
    again = in_process(claims, *FAST, "--out", str(out))
    assert again.returncode == 0, again.stderr


def test_a_sweep_resume_says_what_was_already_done(tmp_path, in_process):
    # two runs on one setting: the fewest panels and lines for the figures each run draws
    plan = tmp_path / "two.toml"
    plan.write_text('name = "two"\nsettings = ["easy"]\n[[grid]]\nobjective = ["dapo", "grpo"]\n')
    base = ["sweep", str(plan), "--seeds", "2", "--steps", "2"]
    base += ["--workers", "1", "--no-progress", "--out", str(tmp_path)]
    assert in_process(cli, *base).returncode == 0
    again = in_process(cli, *base)
    assert again.returncode == 0, again.stderr
    # two runs, each a sampled part and an exact flow's
    assert "4 of 4 runs already done" in again.stderr and "running the other 0" in again.stderr
