"""benchmarks/notebook_times.py on one notebook in small mode: it executes it and prints its lines."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("nbclient")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import notebook_times as bench  # noqa: E402  (benchmarks/ is not a package)


@pytest.mark.slow
def test_notebook_benchmark_times_every_code_cell(monkeypatch, capsys):
    for key, value in {"SANDBOX_SMALL": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)  # the kernel inherits them
    path = ROOT / "notebooks" / "03_dgpo_bounds.ipynb"
    assert bench.main([str(path)]) == 0
    header, line = capsys.readouterr().out.strip().splitlines()
    assert "torch" in header and "OMP_NUM_THREADS=1" in header and "SANDBOX_SMALL=1" in header
    assert line.startswith("03_dgpo_bounds: ") and " s in all, the slowest cell " in line
    code_cells = [1, 3, 5, 7, 9, 11]  # the notebook's code cells, each timed
    assert [int(i) for i in re.findall(r"cell (\d+) \d+\.\d s", line)] == code_cells
    assert re.search(r"load (\d+\.\d\d ){2}\d+\.\d\d -> ", line)
