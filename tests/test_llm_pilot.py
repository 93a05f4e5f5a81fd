"""``python -m llm.pilot`` as a user runs it: bad arguments are one ``error:`` line naming the
argument (exit 2, no traceback) before any model loads, an ``--out`` that is a folder is refused
before the run, and no command but the one in ``results/llm_pilot/README.md`` writes the
committed ``results/llm_pilot/pilot.csv``. The tiny Llama on CPU (``tests/test_claims_cli.py``
checks the rows the pilot writes)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("transformers")

import llm.pilot
from llm.pilot import DEFAULT_OUT, main, parse_args

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = Path("results/llm_pilot/pilot.csv")
QUICK = ["--model", "tiny", "--device", "cpu", "--prompts", "2", "--max-new-tokens", "2"]


def run_pilot(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "llm.pilot", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def bad_arguments(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, the start of its one error line)."""
    (tmp / "a_file").write_text("")
    return [
        (["--tasks", "nosuch"], "error: --tasks 'nosuch': unknown task 'nosuch'"),
        (["--tasks", "addition:digits=0"], "error: --tasks 'addition:digits=0': digits must be"),
        (["--tasks", "addition:foo=1"], "error: --tasks 'addition:foo=1': unknown knob(s) ['foo']"),
        (["--tasks", ":digits=1"], "error: --tasks: empty task name in ':digits=1'"),
        (["--tasks", "addition:digits"], "error: --tasks 'addition:digits' takes key=value"),
        (["--tasks", "addition", "--model", "nosuch"], "error: --model 'nosuch' is not in"),
        (["--tasks", "addition", "--device", "cux"], "error: --device must be cpu, cuda or"),
        (["--tasks", "addition", "--max-new-tokens", "0"], "error: --max-new-tokens must be an"),
        (["--tasks", "addition", "--group-size", "0"], "error: --group-size must be an integer"),
        (["--tasks", "addition", "--prompts", "0"], "error: --prompts must be >= 1, got 0"),
        (["--tasks", "addition", "--seed", "-1"], "error: --seed must be >= 0, got -1"),
        (["--tasks", "addition", "--out", str(tmp)], f"error: --out {tmp} is a folder"),
        (
            ["--tasks", "addition", "--out", str(tmp / "a_file" / "p.csv")],
            f"error: --out {tmp / 'a_file' / 'p.csv'}: its folder {tmp / 'a_file'} is a file",
        ),
    ]


def test_every_bad_argument_is_one_error_line_before_any_work(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(llm.pilot, "pilot_task", lambda cfg: started.append(cfg) or {})
    for argv, error in bad_arguments(tmp_path):
        # the model and --out last: each case has exactly one bad argument
        assert main([*argv[:2], *QUICK, *argv[2:]]) == 2, argv
        err = capsys.readouterr().err
        assert err.splitlines() == [err.strip()] and err.startswith(error), (argv, err)
    assert started == []  # every check ran before the first task
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize("case", [0, 11], ids=["task", "out-dir"])  # each once a traceback
def test_the_command_exits_2_with_one_line_and_no_traceback(tmp_path, in_process, case):
    """The out-dir case as the real command (a subprocess), the task case through ``main``."""
    argv, error = bad_arguments(tmp_path)[case]
    argv = [*argv[:2], *QUICK, *argv[2:]]
    proc = run_pilot(argv, tmp_path) if case == 11 else in_process(main, *argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(error) and "Traceback" not in proc.stderr
    assert "pilot:" not in proc.stderr  # refused before the first task (no progress bar)


def test_without_out_the_command_writes_under_runs_not_the_committed_results(tmp_path):
    (tmp_path / COMMITTED).parent.mkdir(parents=True)
    (tmp_path / COMMITTED).write_text("committed\n")
    proc = run_pilot(["--tasks", "parity:length=2", *QUICK], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / COMMITTED).read_text() == "committed\n"
    frame = pd.read_csv(tmp_path / DEFAULT_OUT)
    assert frame["task"].tolist() == ["parity"] and frame["prompts"].tolist() == [2]
    assert f"wrote {DEFAULT_OUT}" in proc.stderr
    assert not list((tmp_path / DEFAULT_OUT).parent.glob("*.tmp"))
    # the answer baselines of the same held-out problems, and the regime rule's target
    row = frame.iloc[0]
    assert 0 < row["prior"] <= row["constant"] <= 1
    assert row["target"] == pytest.approx(max(row["constant"], row["prior"]) + 0.10)


def test_a_list_knob_keeps_its_commas():
    assert llm.pilot.parse_task("mod_arith:steps=2,ops=['+','-'],modulus=7") == (
        "mod_arith",
        {"steps": 2, "ops": ["+", "-"], "modulus": 7},
    )


def example_commands(text: str) -> list[list[str]]:
    """The argv of every ``python -m llm.pilot ...`` command in ``text`` (backslash-continued
    lines joined; a command ends at the end of its line or at a backquote)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(m) for m in re.findall(r"python -m llm\.pilot ([^`\n]*)", joined)]


def test_the_examples_do_not_overwrite_the_committed_results_and_readme_reproduces_them():
    assert DEFAULT_OUT.startswith("runs/")  # git-ignored
    docs = llm.pilot.__doc__ + (ROOT / "README.md").read_text()
    examples = example_commands(docs)
    assert len(examples) >= 2
    for argv in examples:
        assert Path(parse_args(argv).out) != COMMITTED, argv
    readme = example_commands((ROOT / "results/llm_pilot/README.md").read_text())
    assert len(readme) == 1 and Path(parse_args(readme[0]).out) == COMMITTED
    committed = pd.read_csv(ROOT / COMMITTED)["command"].unique().tolist()
    assert committed == ["python -m llm.pilot " + shlex.join(readme[0])]
