"""``python -m llm.transfer`` is retired: one line naming its replacement, exit 2, nothing run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "llm.transfer", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_retired_command_names_its_replacement_and_writes_nothing(tmp_path):
    for argv in ([], ["--quick", "--out", "x"], ["--tables-only", "--out", "results/transfer"]):
        proc = _run(*argv, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stdout == ""
        [line] = proc.stderr.strip().splitlines()
        assert "retired" in line and "python -m llm.claims (--profile gpu" in line
    assert list(tmp_path.iterdir()) == []  # no folder made, nothing run


def test_its_help_says_where_transfer_is_measured_now(tmp_path):
    proc = _run("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "python -m llm.claims" in proc.stdout and "transfer.csv" in proc.stdout
