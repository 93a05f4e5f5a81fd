"""``python -m llm.claims --time-budget SECONDS`` (issue 28 item 5): the study runs the next units
that fit, writes each as a part, stops between units with one line (units left, the command that
goes on) and exit status 75; the same command without a budget finishes, and its tables equal an
uninterrupted study's byte for byte. A unit still running when the budget ends is stopped through
the pool's SIGTERM path (nothing half-written). The budgeted command runs in a real subprocess
(its units in a worker it stops); the uninterrupted reference and the run that goes on run
``llm.claims.main`` in the test process (their finding is their files and stderr). The
``--quick`` profile on the toy rungs and two rules (12 units: 6 calibration, 6 study)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from llm.claims import main
from sandbox.study.cli import BUDGET_EXIT

ROOT = Path(__file__).resolve().parents[1]
STUDY = [
    "--quick",
    "--rungs",
    "bandit_exact",
    "bandit_sampled",
    "tiny_tf",
    "--rules",
    "dapo",
    "nsr_dapo",
    "--no-progress",
]
UNITS, CALIBRATION = 12, 6  # calibration: 2 + 2 step sizes, tiny_tf 1 x mu in {4, 8}; study 2 x 3
TABLES = ("calibration.csv", "scores.csv", "summary.csv", "ledger.csv", "power.csv", "bounds.csv")
LINE = re.compile(
    r"time budget of (?P<budget>\S+) s spent: (?P<done>\d+) units run, (?P<left>\d+) left "
    r"\((?P<where>[^)]*)\)(?P<cut>; stopped (?P<stopped>\d+) running[^;]*)?; continue with: "
    r"(?P<command>.+)$"
)


def claims(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "llm.claims", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def budget_line(stderr: str) -> re.Match:
    lines = [line for line in stderr.splitlines() if line.startswith("time budget")]
    assert len(lines) == 1, stderr
    found = LINE.match(lines[0])
    assert found, lines[0]
    return found


@pytest.mark.parametrize("value", ["0", "-5", "abc", "nan", "inf", ""])
def test_a_bad_time_budget_is_one_line_naming_the_flag(tmp_path, capsys, value):
    out = tmp_path / "study"
    assert main([*STUDY, "--out", str(out), "--time-budget", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --time-budget must be a number of seconds > 0, got {value!r}"]
    assert not out.exists()  # checked before anything is written


def test_a_time_budget_on_ray_is_one_line_naming_both_flags(tmp_path, capsys):
    out = tmp_path / "study"
    assert main([*STUDY, "--out", str(out), "--backend", "ray", "--time-budget", "60"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --time-budget: only with --backend local (a Ray task is not stopped at a "
        "deadline with its checkpoint)"
    ]
    assert not out.exists()


@pytest.mark.slow
def test_a_budget_stops_between_units_and_the_rerun_equals_an_uninterrupted_study(
    tmp_path, in_process
):
    whole = tmp_path / "whole"
    start = time.monotonic()
    once = in_process(main, *STUDY, "--workers", "1", "--out", str(whole))
    took = time.monotonic() - start
    assert once.returncode == 0, once.stderr
    # a budget that stops the same study part-way on this machine: a fraction of its own time
    # (a fixed number of seconds finishes on a fast machine and stops nothing)
    for fraction in (0.5, 0.3, 0.15):
        out, budget = tmp_path / f"budget{fraction}", f"{max(took * fraction, 1.0):.1f}"
        cut = claims(*STUDY, "--workers", "1", "--out", str(out), "--time-budget", budget)
        if cut.returncode == BUDGET_EXIT:
            break
        assert cut.returncode == 0, cut.stderr
    assert cut.returncode == BUDGET_EXIT, cut.stderr
    line = budget_line(cut.stderr)
    done, left = int(line["done"]), int(line["left"])
    assert done + left == UNITS, line[0]  # a unit stopped mid-run counts as left
    parts = sorted(p.name for p in (out / "parts").iterdir())
    assert len(parts) == done and all(p.endswith(".parquet") for p in parts)  # one part a unit
    in_calib = max(CALIBRATION - done, 0)
    assert line["where"] == (f"{in_calib} of them calibration" if in_calib else "all in the study")
    assert not (out / "ledger.csv").exists()  # tables come with the last unit
    # the exact command to go on is this one
    assert shlex.split(line["command"]) == [
        "python",
        "-m",
        "llm.claims",
        *STUDY,
        "--workers",
        "1",
        "--out",
        str(out),
        "--time-budget",
        budget,
    ]

    rest = in_process(main, *STUDY, "--workers", "1", "--out", str(out))  # no budget: finishes
    assert rest.returncode == 0, rest.stderr
    if 0 < done < CALIBRATION:  # the planner's line, one for each phase (calibration first)
        assert f"{done} of {CALIBRATION} runs already done" in rest.stderr, rest.stderr
    elif done > CALIBRATION:
        study = UNITS - CALIBRATION
        assert f"{done - CALIBRATION} of {study} runs already done" in rest.stderr, rest.stderr
    for name in TABLES:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "results.parquet"), pd.read_parquet(whole / "results.parquet")
    )


def test_a_unit_running_when_the_budget_ends_is_stopped_cleanly(tmp_path):
    out = tmp_path / "cut"
    start = time.monotonic()
    cut = claims(*STUDY, "--workers", "1", "--out", str(out), "--time-budget", "0.5")
    took = time.monotonic() - start
    assert cut.returncode == BUDGET_EXIT, cut.stderr
    line = budget_line(cut.stderr)
    # the first unit always starts (nothing seen, no estimate for a toy rung) and the budget
    # ends while its worker still starts: it is stopped (SIGTERM) and counts as left
    assert (line["done"], line["left"], line["stopped"]) == ("0", str(UNITS), "1"), line[0]
    assert list((out / "parts").iterdir()) == []  # nothing half-written
    assert "Traceback" not in cut.stderr
    assert took < 60, took  # stopped, not run to the end


def test_an_llm_units_first_guess_takes_the_measured_step_time(monkeypatch):
    """Before an llm unit has run, a budget expects steps x seconds per run-step per run: the
    llm.claims default (2.3 s), else CLIP_SANDBOX_LLM_STEP_SECONDS (the step time
    benchmarks/gpu_lend.sh has just measured on the machine at hand); a bad value is an error
    that names the variable."""
    from llm.claims import LLM_STEP_SECONDS, STEP_SECONDS_ENV, llm_unit_seconds, parse_args
    from sandbox.study.plan import calibration_jobs

    config, _ = parse_args(["--quick", "--rungs", "llm", "--calib-steps", "10"])
    group = [j for j in calibration_jobs(config) if j.rung == "llm"][:1]
    monkeypatch.delenv(STEP_SECONDS_ENV, raising=False)
    assert llm_unit_seconds(config, group) == pytest.approx(10 * LLM_STEP_SECONDS)
    monkeypatch.setenv(STEP_SECONDS_ENV, "0.5")
    assert llm_unit_seconds(config, group) == pytest.approx(10 * 0.5)
    for bad in ("fast", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(STEP_SECONDS_ENV, bad)
        with pytest.raises(ValueError, match=f"{STEP_SECONDS_ENV} must be a number of seconds > 0"):
            llm_unit_seconds(config, group)
