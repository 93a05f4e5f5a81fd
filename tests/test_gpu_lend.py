"""``benchmarks/gpu_lend.sh dry-run`` (issue 28 item 6): the prepared GPU lend run end to end on CPU
with the tiny model, within its 5-minute bound: prepare's split of a stand-in GGUF in 3 pieces
(each command holding only the piece it carries), command 1 (stash piece 1, the gpu-marked tests:
skipped without CUDA), the middle piece's stash, command 2 (join and sha256 check,
llm_throughput.py --smoke: today's path, then the ensemble (of 2 in the dry run), llm.claims
--quick --rungs llm under --time-budget, the study folder back as one archive), each command's
provenance. A real subprocess; the figures of the benchmark are not asserted (CPU, loaded), its
steps' exit codes are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_FILES = {"gpu_tests.txt", "provenance_1.json"}  # command 1's


@pytest.mark.slow
def test_the_dry_run_runs_both_commands_and_records_them(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_lend.sh"), "dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,  # the script's own limits add up to under 5 minutes
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tests = (out / "gpu_tests.txt").read_text()
    assert " skipped" in tests and "error" not in tests.lower(), tests  # no CUDA here
    first = json.loads((out / "provenance_1.json").read_text())
    second = json.loads((out / "provenance_2.json").read_text())
    for record in (first, second):
        assert record["device_kind"] == "cpu" and record["command"].endswith("dry-run")
        assert len(record["commit"]) == 40 and record["date"].endswith("Z")
    assert first["exit_codes"] == {"gpu_tests": "0"}
    assert set(second["exit_codes"]) == {"throughput_k8", "throughput_k16", "claims"}
    assert second["exit_codes"]["throughput_k8"] == "0", (out / "throughput_k8.txt").read_text()
    assert second["exit_codes"]["throughput_k16"] == "0", (out / "throughput_k16.txt").read_text()
    assert second["exit_codes"]["claims"] in ("0", "75"), second  # done, or the budget spent
    claims = (out / "claims.txt").read_text()
    assert "time budget of" in claims or "wrote" in claims, claims
    with tarfile.open(out / "claims.tgz") as archive:  # at most 8 files come back: one archive
        names = archive.getnames()
    assert "claims/config.json" in names, names
    assert not any("llm_scratch" in n for n in names), names  # never carried back
    second_files = [p.name for p in out.iterdir() if p.name not in FIRST_FILES]
    assert len(second_files) <= 8, second_files  # each command's $OUT starts empty
    figures = json.loads((out / "throughput_k8.json").read_text())
    assert figures["failed"] == [] and figures["results"]["today"]["runs"] == 1, figures
    today, ensemble = ((out / f"throughput_k{k}.txt").read_text() for k in (8, 16))
    assert "device cpu" in today and "device cpu" in ensemble
    rows = [line.split() for line in today.splitlines() if line.startswith("today (llm.train)")]
    assert len(rows) == 1 and rows[0][2] == "1", today  # one run of today's path
    rows = [line.split() for line in ensemble.splitlines() if line.startswith("fast, one ensemble")]
    assert len(rows) == 1 and rows[0][3] == "2", ensemble  # one process of 2 runs
