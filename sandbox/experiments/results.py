"""Result storage: one tidy parquet part per finished run, written atomically; tables, figures
and pages that change only when their content does; the provenance of a results folder.

Each finished run is written as ``parts/<name>.parquet`` (temp file, then ``os.replace``), so an
interrupted run loses nothing and a restart skips finished parts. Every table, figure and page
derived from them goes through :func:`write_if_changed`: replaced atomically, and only when its
bytes (a parquet file: its frame) differ, so rebuilding an unchanged folder rewrites nothing.

A part's name says what made it (:attr:`.runs.RunSpec.part`: a readable stem and a hash of the
run's settings), so a folder holds runs of any settings side by side, and a command reads only
the parts its own runs name. ``provenance.json`` records where a folder's results were made
(:func:`provenance`): one entry in ``runs`` per command that computed parts (:func:`record_run`),
and ``tables`` for the last command that changed the derived files (:func:`recording_tables`).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .signals import signals_deferred

_SAFE = re.compile(r"[^A-Za-z0-9_.=-]+")
TMP_SUFFIX = ".tmp"


def part_stem(*fields: object) -> str:
    """The readable start of a part's file name, filesystem-safe, from the fields that identify
    a run (the part adds the hash of its spec and ``.parquet``:
    :meth:`.runs.RunSpec.part_of`)."""
    return "__".join(_SAFE.sub("-", str(f)) for f in fields)


def _write_atomic(path: Path, write: Callable[[str], None]) -> Path:
    """``write(tmp)`` to a temp file beside ``path``, then ``os.replace``: readers see only
    complete files; an exception leaves no temp file, and a signal (Ctrl-C, SIGTERM in the
    driver) acts once the file is in place (:func:`.signals.signals_deferred`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with signals_deferred():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
        try:
            os.close(fd)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are ordinary shared files
            write(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def write_parquet_atomic(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write ``frame`` to ``path`` so that readers only ever see a complete file."""
    return _write_atomic(Path(path), lambda tmp: frame.to_parquet(tmp, index=False))


def write_if_changed(data: bytes, path: str | Path) -> bool:
    """Write ``data`` to ``path`` atomically unless the file already holds exactly these bytes
    (then the file, its mtime included, is left alone); True when it was written."""
    path = Path(path)
    with contextlib.suppress(OSError):
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    _write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))
    return True


def write_text(text: str, path: str | Path) -> bool:
    """A page or record (UTF-8, ``\\n`` line ends) through :func:`write_if_changed`."""
    return write_if_changed(text.encode("utf-8"), path)


#: The float format of every CSV table: 10 significant digits, so that a table rebuilt from the
#: same parts is byte-identical even where a reduction's last bit differs; parquet keeps every bit.
FLOAT_FORMAT = "%.10g"


def csv_text(frame: pd.DataFrame) -> str:
    """``frame`` as the CSV text every table is written with (no index, :data:`FLOAT_FORMAT`)."""
    return frame.to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n")


def write_csv(frame: pd.DataFrame, path: str | Path) -> bool:
    """A table as CSV (:func:`csv_text`) through :func:`write_if_changed`."""
    return write_text(csv_text(frame), path)


def write_parquet_if_changed(frame: pd.DataFrame, path: str | Path) -> bool:
    """``frame`` as parquet through :func:`write_if_changed`, unless ``path`` already holds
    the same frame (same columns, dtypes and values, NaN where NaN): a parquet file embeds the
    versions of the libraries that wrote it, so its bytes may differ for the same content."""
    path = Path(path)
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    data = buffer.getvalue()
    with contextlib.suppress(OSError, ValueError):  # unreadable: rewrite it
        if path.read_bytes() == data:
            return False
        if pd.read_parquet(path).equals(pd.read_parquet(io.BytesIO(data))):  # dtypes too
            return False
    return write_if_changed(data, path)


#: PNG metadata of every figure: no software version (PNGs carry no date), so a figure redrawn
#: by another matplotlib release differs only if its pixels do.
PNG_METADATA: dict[str, Any] = {"Software": None}


def write_figure(fig: Any, path: str | Path, *, dpi: int = 110, **savefig: Any) -> bool:
    """A matplotlib figure as PNG (fixed ``dpi``, :data:`PNG_METADATA`) through
    :func:`write_if_changed`; ``savefig`` are further ``Figure.savefig`` arguments."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata=PNG_METADATA, **savefig)
    return write_if_changed(buffer.getvalue(), path)


def remove_temp_files(folder: str | Path) -> int:
    """Delete the temp files a killed writer left in ``folder``; returns how many. Only the
    writer of a run folder calls it, before writing."""
    stale = list(Path(folder).glob(f".*{TMP_SUFFIX}"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def prepare_out_dir(out_dir: str | Path, flag: str = "--out", sub: str = "parts") -> Path:
    """``out_dir/sub`` created and known to be writable, before any work, or a one-line
    ``ValueError`` naming ``flag``: a file, under a file, or not writable."""
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


def read_parts(parts_dir: str | Path) -> pd.DataFrame:
    """Concatenate every finished part (temp files are ignored), in order of file name."""
    files = sorted(Path(parts_dir).glob("*.parquet"), key=lambda f: f.name)
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


def sorted_rows(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``frame`` in one order that does not depend on the order its rows were read in: by
    ``keys`` (those present), then by every other column as a tie-break (stable sorts; a column
    whose values cannot be ordered against each other is left out of the tie-break)."""
    first = [k for k in keys if k in frame.columns]
    rest = [c for c in frame.columns if c not in first]
    for by in (first + rest, first):
        try:
            out = frame.sort_values(by, kind="stable", na_position="last") if by else frame
            return out.reset_index(drop=True)
        except TypeError:  # e.g. a parameter column holding both strings and numbers
            continue
    return frame.reset_index(drop=True)


# -- provenance -------------------------------------------------------------------------------

PROVENANCE = "provenance.json"
NOT_RECORDED = "not recorded"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or NOT_RECORDED


def git_commit(where: str | Path | None = None) -> dict[str, Any]:
    """The commit of the code checkout ``where`` (default: this package's) and whether its
    tracked code (``*.py``, ``pyproject.toml``; not the results a run writes) differs from it;
    :data:`NOT_RECORDED` outside a git checkout (no network)."""
    where = Path(where or Path(__file__).resolve().parent)

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10
        )
        if done.returncode:
            raise OSError(done.stderr.strip())
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        code = (":(top)*.py", ":(top)pyproject.toml")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", *code))
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": NOT_RECORDED, "git_dirty": NOT_RECORDED}
    return {"git_commit": commit, "git_dirty": dirty}


def command_line() -> str:
    """The command this process runs, as typed (``python -m llm.claims --out ...``)."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    argv[0] = Path(argv[0]).name
    return shlex.join(argv)


def provenance(
    device: str = "cpu", code: Mapping[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """Where and how this process computes (the command, UTC date, device and its model,
    versions, threads, OS, git commit: ``code``, :func:`git_commit`'s record taken when the work
    began, else now); ``extra`` fields after them."""
    import torch

    gpu = None
    if str(device).startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.device(device))
    return {
        "command": command_line(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": str(device),
        "cpu_model": cpu_model(),
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "os": platform.platform(),
        **(code or git_commit()),
        **extra,
    }


def read_provenance(out_dir: str | Path) -> dict[str, Any]:
    """The folder's ``provenance.json`` (``{}`` if it has none or it cannot be read)."""
    try:
        record = json.loads((Path(out_dir) / PROVENANCE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_provenance(out_dir: str | Path, record: Mapping[str, Any]) -> None:
    write_text(json.dumps(record, indent=2, default=str) + "\n", Path(out_dir) / PROVENANCE)


def record_run(
    out_dir: str | Path,
    *,
    device: str = "cpu",
    fresh: bool = False,
    code: Mapping[str, Any] | None = None,
    **extra: Any,
) -> None:
    """Add this command to the folder's ``runs`` provenance (it computed parts; ``extra``, e.g.
    ``parts=3``, goes into its entry). ``fresh``: the folder's earlier parts are gone (a new
    folder, or ``--force`` deleted them), so their entries go too. ``code``: the checkout's
    :func:`git_commit` when the command began (the code that computed); where the checkout
    differs now, the entry adds ``git_at_end`` (a commit or edit made while it ran)."""
    record = read_provenance(out_dir)
    runs = [] if fresh else list(record.get("runs", []))
    now = git_commit()
    if code is not None and dict(code) != now:
        extra = {**extra, "git_at_end": now}
    record["runs"] = [*runs, provenance(device, code=code or now, **extra)]
    _write_provenance(out_dir, record)


def prune_parts(out_dir: str | Path, keep: set[str]) -> int:
    """Delete the parts in ``out_dir/parts`` not named in ``keep`` (a command's whole read set:
    a part of other settings keeps its name and is never read again); returns how many went, and
    where any did, the folder's provenance gains a ``pruned`` entry (this command, ``parts``: the
    count), so its ``runs`` less its ``pruned`` account for every part on disk."""
    gone = [p for p in Path(out_dir, "parts").glob("*.parquet") if p.name not in keep]
    for path in gone:
        path.unlink()
    if gone:
        record = read_provenance(out_dir)
        record["pruned"] = [*record.get("pruned", []), provenance(parts=len(gone))]
        _write_provenance(out_dir, record)
    print(f"pruned {len(gone)} parts this command does not read from {out_dir}", file=sys.stderr)
    return len(gone)


def _stamps(out_dir: Path) -> dict[str, tuple[int, int]]:
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns)
        for p in out_dir.iterdir()
        if p.is_file() and p.name != PROVENANCE and not p.name.endswith(TMP_SUFFIX)
    }


@contextlib.contextmanager
def recording_tables(out_dir: str | Path) -> Iterator[None]:
    """Around the writing of a folder's tables and figures: if any file directly in ``out_dir``
    changed (the writers leave unchanged files alone), the folder's ``tables`` provenance
    becomes this command's; a rebuild that changes nothing records nothing."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    before = _stamps(out_dir)
    yield
    if _stamps(out_dir) != before:
        record = read_provenance(out_dir)
        record["tables"] = provenance("cpu")
        _write_provenance(out_dir, record)
