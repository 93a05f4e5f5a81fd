"""The llm rung's CPU pilot (``python -m llm.cpu_pilot``, issue 40): the written rule on
constructed rows, and the command end to end on the tiny Llama (resumable parts, a time budget,
the tables and provenance)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pandas as pd
from conftest import ROOT, offline_env, signal_when

from llm.cpu_pilot import CLEAR, choose, main


def rows(task: str, horizon: int, passes: list[float], floor: float) -> list[dict]:
    return [
        {"task": task, "horizon": horizon, "seed": s, "pass": p, "floor": floor,
         "clip_frac": 0.05, "step_seconds": 20.0}
        for s, p in enumerate(passes)
    ]  # fmt: skip


def test_the_rule_takes_the_shortest_horizon_that_clears_the_floor_below_the_ceiling():
    pilot = pd.DataFrame(
        rows("sums", 0, [0.0, 0.0], 0.05)
        + rows("sums", 10, [0.10, 0.12], 0.05)  # mean 0.11: below the floor + 0.10
        + rows("sums", 20, [0.50, 0.60], 0.05)  # clears, room below 1
        + rows("mod7", 10, [0.99, 0.98], 0.22)  # clears the floor, but within 2 margins of 1
        + rows("mod7", 20, [0.99, 1.00], 0.22)
    )
    choice = choose(pilot).set_index(["task", "horizon"])
    assert not choice.loc[("sums", 10), "clears_floor"]  # 0.11 against 0.05 + 0.10
    assert not choice.loc[("mod7", 10), "below_ceiling"]  # 0.985 > 1 - 2 x 0.02
    assert choice["chosen"].sum() == 1 and choice.loc[("sums", 20), "chosen"]


def test_among_equal_horizons_the_pass_nearest_the_middle_of_its_room_wins():
    pilot = pd.DataFrame(
        rows("a", 10, [0.90, 0.90], 0.0)  # room [0, 1]: 0.40 from its middle
        + rows("b", 10, [0.40, 0.40], 0.20)  # room [0.2, 1]: 0.20 from its middle
    )
    choice = choose(pilot).set_index("task")
    assert choice.loc["b", "chosen"] and not choice.loc["a", "chosen"]
    assert CLEAR == 0.10


def test_no_candidate_qualifies_chooses_none():
    assert not choose(pd.DataFrame(rows("a", 10, [0.0, 0.01], 0.2)))["chosen"].any()


TINY = [
    *["--model", "tiny", "--tasks", "addition:digits=1", "--steps", "2", "--eval-every", "1"],
    *["--eval-prompts", "4", "--prompts-per-step", "2", "--group-size", "2"],
    *["--max-new-tokens", "3", "--lr", "1e-3"],
]


def test_the_pilot_writes_its_tables_and_resumes_without_rerunning(tmp_path, capsys):
    out = tmp_path / "pilot"
    assert main([*TINY, "--out", str(out), "--time-budget", "600"]) == 0
    pilot = pd.read_csv(out / "pilot.csv")
    assert sorted(pilot["horizon"].unique()) == [0, 1, 2] and sorted(pilot["seed"].unique()) == [
        0,
        1,
    ]
    assert (pilot["floor"] > 0).all() and pilot["pass"].between(0, 1).all()
    choice = pd.read_csv(out / "choice.csv")
    assert set(choice.columns) >= {"clears_floor", "below_ceiling", "chosen", "clip_frac"}
    runs = json.loads((out / "provenance.json").read_text())["runs"]
    assert runs[0]["parts"] == 2 and runs[0]["device"] == "cpu"
    assert not list((out / "llm_scratch").glob("*"))  # every run's scratch removed once stored
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet")}
    capsys.readouterr()
    assert main([*TINY, "--out", str(out)]) == 0
    assert "2 of 2 runs already done" in capsys.readouterr().err
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet")}
    # other settings: their own parts beside the first ones, which stay as they are
    assert main([*TINY, "--lr", "2e-3", "--out", str(out)]) == 0
    now = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet")}
    assert len(now) == 4 and all(now[name] == stamp for name, stamp in stamps.items())


def test_a_sigterm_to_the_pilot_is_one_line_and_the_same_command_resumes(tmp_path):
    """A real SIGTERM to ``python -m llm.cpu_pilot`` mid-run (2 workers): exit 143, one
    ``interrupted (SIGTERM)`` line and no traceback, the cut runs' checkpoints kept, and the same
    command then finishes from them with the parts an uninterrupted pilot writes."""
    out, whole = tmp_path / "cut", tmp_path / "whole"
    argv = [*TINY, "--steps", "30", "--eval-every", "15", "--workers", "2"]
    command = [sys.executable, "-m", "llm.cpu_pilot", *argv, "--out", str(out)]
    proc = subprocess.Popen(command, cwd=ROOT, env=offline_env(), stderr=subprocess.PIPE, text=True)

    def two_steps_logged() -> bool:
        logs = (out / "llm_scratch").glob("*/metrics.jsonl")
        return any(len(p.read_text().splitlines()) >= 3 for p in logs)

    err = signal_when(proc, two_steps_logged, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "interrupted (SIGTERM)" in err and "Traceback" not in err, err[-3000:]
    assert list((out / "llm_scratch").glob("*/checkpoint.pt"))  # what the cut runs keep
    assert main([*argv, "--out", str(out)]) == 0
    assert main([*argv, "--out", str(whole)]) == 0
    for part in sorted((whole / "parts").glob("*.parquet")):
        cut, ref = pd.read_parquet(out / "parts" / part.name), pd.read_parquet(part)
        keep = [c for c in ref.columns if c not in ("step_time", "tokens_per_s")]
        pd.testing.assert_frame_equal(cut[keep], ref[keep])
