"""Result storage: one tidy parquet part per finished run, written atomically.

A long comparison or sweep writes each finished run as ``parts/<key>.parquet`` (temp file, then
``os.replace``), so an interrupted run loses nothing and a restart skips finished parts. The
parts are then concatenated into ``results.parquet`` (also written atomically).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

_SAFE = re.compile(r"[^A-Za-z0-9_.=-]+")
TMP_SUFFIX = ".tmp"


def part_name(*fields: object) -> str:
    """A filesystem-safe part name from the fields that identify a run."""
    return "__".join(_SAFE.sub("-", str(f)) for f in fields) + ".parquet"


def write_parquet_atomic(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write ``frame`` to ``path`` so that readers only ever see a complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:  # from here on an exception (Ctrl-C, SIGTERM in the driver) removes the temp file
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary shared files
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def remove_temp_files(folder: str | Path) -> int:
    """Delete temp files a killed writer (SIGKILL, power loss) left in ``folder``; returns how
    many. Only the writer of a run folder calls it, before writing."""
    stale = list(Path(folder).glob(f".*{TMP_SUFFIX}"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def prepare_out_dir(out_dir: str | Path, flag: str = "--out", sub: str = "parts") -> Path:
    """``out_dir/sub`` created (with its parents) and known to be writable, or a one-line
    ``ValueError`` naming ``flag``: a path that is a file, lies under a file, or cannot be
    written (read-only filesystem, no permission). Called before any work, so that a bad folder
    costs nothing."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{flag} {out_dir} is a file, not a folder")
    try:
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir / sub):
            pass
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"{flag} {out_dir} lies under a file, not a folder") from None
    except OSError as exc:
        raise ValueError(f"{flag} {out_dir} cannot be written: {exc.strerror or exc}") from None
    return out_dir


def changed_settings(previous: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for every key of ``now`` whose JSON value differs from the one in the
    ``previous`` record (a key the record lacks counts as ``None``; keys only the record has, such
    as which rules ran, are not settings of the parts)."""
    now = json.loads(json.dumps(now, default=str))
    return [f"{k}: {previous.get(k)!r} -> {v!r}" for k, v in now.items() if previous.get(k) != v]


def check_settings(
    out_dir: str | Path,
    settings: Mapping[str, Any],
    *,
    record: str = "config.json",
    force: bool = False,
    hint: str = "run the same command as before to resume, or use another --out, or --force to recompute",
    compare: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]] = changed_settings,
) -> None:
    """Refuse a results folder whose finished parts were made with other ``settings``.

    ``settings`` are what every part depends on besides what its file name records; the folder's
    ``record`` (JSON) holds the settings it was made with. Parts without a readable record cannot
    be checked and are refused too. ``force`` deletes the parts instead (everything is then
    recomputed): results made with other settings are never reported as a run's own.
    ``compare(previous, settings)`` lists the changes (default :func:`changed_settings`)."""
    out_dir = Path(out_dir)
    parts = out_dir / "parts"
    if not any(parts.glob("*.parquet")):
        return
    try:
        previous = json.loads((out_dir / record).read_text())
        changed = compare(previous, settings)
    except (OSError, ValueError):
        changed = [f"no readable {record}"]
    if not changed:
        return
    if force:
        remove_parts(parts)
        return
    raise ValueError(
        f"{out_dir} holds runs made with other settings ({'; '.join(changed)}); {hint}"
    )


def remove_parts(parts: str | Path) -> None:
    """Delete a folder of parts made with other settings (``--force``), or a one-line
    ``ValueError`` saying which file could not be deleted and why."""
    try:
        shutil.rmtree(parts)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise ValueError(
            f"--force cannot delete the old parts in {parts}: {exc.strerror or exc}{where}"
        ) from None


def read_parts(parts_dir: str | Path) -> pd.DataFrame:
    """Concatenate every finished part (temp files are ignored)."""
    files = sorted(Path(parts_dir).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no result parts in {parts_dir}")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


#: Columns a tidy results frame needs (figures and tables group by them).
RESULT_COLUMNS = ("setting", "objective", "kind", "step", "expected_reward")
#: Columns of a final-score table (``summary.csv``).
SCORE_COLUMNS = ("setting", "objective", "final_reward")


def is_score_table(frame: pd.DataFrame) -> bool:
    """True for a final-score table (``summary.csv``) rather than per-step results."""
    return set(SCORE_COLUMNS) <= set(frame.columns) and "step" not in frame.columns


def load_results(path: str | Path) -> pd.DataFrame:
    """A results folder (``results.parquet`` or its ``parts/``) or a parquet/CSV file: tidy
    per-step results, or a final-score table (``summary.csv``, see :func:`is_score_table`).
    Anything else is a ``ValueError`` naming the file and what to pass."""
    path = Path(path)
    if path.is_dir():
        if (path / "results.parquet").exists():
            return pd.read_parquet(path / "results.parquet")
        return read_parts(path / "parts")
    try:
        frame = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"results: cannot read {path} as CSV or parquet: {exc}") from exc
    missing = [c for c in RESULT_COLUMNS if c not in frame.columns]
    if missing and not is_score_table(frame):
        raise ValueError(
            f"results: {path} has no column(s) {missing}; pass a run folder, its "
            "results.parquet, or its summary.csv"
        )
    return frame
