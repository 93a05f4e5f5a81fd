"""Every notebook runs end to end in small mode, and is committed with its outputs stripped.

Each notebook reads ``SANDBOX_SMALL=1`` (small sizes, well under a minute) and ends with an
assertion cell of the claim it shows, so executing it is a test of that claim. The list is globbed,
so a new notebook is covered as soon as it is added.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the dev extra installs them; a machine without them (e.g. a bare GPU host) skips the notebooks
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# Small sizes; a non-interactive matplotlib backend; one intra-op thread per kernel (the kernels
# run beside the other pytest-xdist workers, and their tensors are small).
SMALL_ENV = {"SANDBOX_SMALL": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}


#: The notebooks with a cell that runs for minutes in full mode, and the description of the tqdm
#: bar that cell shows (issue 39: notebook 05's convergence cell ran 280 s without one).
PROGRESS_BARS = {"05_bandit_dynamics": "sampled runs"}


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.fixture
def small_env():
    """Set the small-mode environment for the kernel (inherited at start), then restore it."""
    saved = {key: os.environ.get(key) for key in SMALL_ENV}
    os.environ.update(SMALL_ENV)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_runs_in_small_mode(path: Path, small_env):
    """Execute every cell in a fresh python3 kernel (this venv's interpreter); the notebook's own
    final cell asserts its claim, so any failing assertion fails here with the cell's traceback."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()  # raises CellExecutionError naming the cell and its traceback
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors, errors
    if path.stem in PROGRESS_BARS:  # the long cell's bar ran to its end
        stderr = "".join(
            out.get("text", "")
            for cell in nb.cells
            if cell.cell_type == "code"
            for out in cell.get("outputs", [])
            if out.get("output_type") == "stream" and out.get("name") == "stderr"
        )
        assert f"{PROGRESS_BARS[path.stem]}: 100%" in stderr, stderr[-2000:]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_committed_stripped(path: Path):
    """Outputs stay out of git: no outputs, no execution counts (strip before committing)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; strip them"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_reads_small_mode_and_ends_with_an_assertion(path: Path):
    """The conventions that make the execution test meaningful (see notebooks/README.md)."""
    nb = nbformat.read(path, as_version=4)
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    assert any("SANDBOX_SMALL" in src for src in code), f"{path.name} must read SANDBOX_SMALL"
    assert "assert " in code[-1], f"{path.name} must end with an assertion cell of its claim"
