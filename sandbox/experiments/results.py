"""Result storage: one tidy parquet part per finished run, written atomically.

A long comparison or sweep writes each finished run as ``parts/<key>.parquet`` (temp file, then
``os.replace``), so an interrupted run loses nothing and a restart skips finished parts. The
parts are then concatenated into ``results.parquet`` (also written atomically).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pandas as pd

_SAFE = re.compile(r"[^A-Za-z0-9_.=-]+")


def part_name(*fields: object) -> str:
    """A filesystem-safe part name from the fields that identify a run."""
    return "__".join(_SAFE.sub("-", str(f)) for f in fields) + ".parquet"


def write_parquet_atomic(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write ``frame`` to ``path`` so that readers only ever see a complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary shared files
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_parts(parts_dir: str | Path) -> pd.DataFrame:
    """Concatenate every finished part (temp files are ignored)."""
    files = sorted(Path(parts_dir).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no result parts in {parts_dir}")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def load_results(path: str | Path) -> pd.DataFrame:
    """A results folder (``results.parquet`` or its ``parts/``) or a parquet/CSV file."""
    path = Path(path)
    if path.is_dir():
        if (path / "results.parquet").exists():
            return pd.read_parquet(path / "results.parquet")
        return read_parts(path / "parts")
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return pd.read_parquet(path)
