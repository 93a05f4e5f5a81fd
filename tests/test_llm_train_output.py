"""What ``python -m llm.train --no-progress`` prints: no progress bar of its own or of
transformers (loading and writing shards), and no closing "done:" line (issue 39: a claims
study printed one per llm run)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_progress_means_no_bar_at_all(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llm.train",
            "--steps",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "model").is_dir()  # the model was written, silently
    assert "it/s" not in proc.stderr + proc.stdout and "%|" not in proc.stderr + proc.stdout
    assert "done:" not in proc.stderr
