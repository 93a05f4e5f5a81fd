"""Every ``python -m llm.<module>`` command prints its help and exits 0 on ``--help`` (the
ensemble's exited 2: its ``--seeds`` was required before ``--help`` was read). The modules are
found by their ``if __name__ == "__main__":`` line, so a new command is covered without an edit.
Each runs through its ``main`` in-process (as ``python -m`` would call it); every command also runs
as a real ``python -m`` subprocess in its own tests."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def commands() -> list[str]:
    """``llm.<module>`` for every module of the ``llm`` package that runs as a command."""
    found = []
    for path in sorted((ROOT / "llm").rglob("*.py")):
        if 'if __name__ == "__main__":' in path.read_text():
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def test_the_commands_are_found():
    assert {"llm.train", "llm.ensemble", "llm.pilot", "llm.claims", "llm.cpu_pilot"} <= set(
        commands()
    )


@pytest.mark.parametrize("module", commands())
def test_help_prints_the_usage_and_exits_0(module, in_process):
    proc = in_process(importlib.import_module(module).main, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: python -m {module}"), proc.stdout[:500]
    assert "--help" in proc.stdout and "Traceback" not in proc.stderr
    if module == "llm.ensemble":  # its own flag, then every flag of the run it repeats
        assert "--seeds SEEDS" in proc.stdout and "usage: python -m llm.train" in proc.stdout
        assert "--objective" in proc.stdout


#: A real run's flags (the tiny model) of each command, so that a prefix taken for its flag runs
#: into OUT and the test sees it.
TINY = {
    "llm.train": ["--model", "tiny", "--steps", "1", "--out", "{tmp}/out"],
    "llm.ensemble": ["--seeds", "0,1", "--model", "tiny", "--steps", "1", "--out", "{tmp}/out"],
    "llm.pilot": ["--model", "tiny", "--tasks", "parity", "--out", "{tmp}/out.csv"],
    "llm.claims": ["--quick", "--rungs", "bandit_exact", "--out", "{tmp}/out"],
}


@pytest.mark.parametrize(
    ("module", "prefix"),
    [  # issue 39: argparse took a prefix for the flag it starts (--seed for the ensemble's --seeds)
        ("llm.train", ["--step", "1"]),
        ("llm.ensemble", ["--step", "1"]),
        ("llm.pilot", ["--prompt", "2"]),
        ("llm.claims", ["--work", "1"]),
    ],
)
def test_a_prefix_of_a_flag_is_not_taken_for_it(module, prefix, tmp_path, in_process):
    argv = [a.format(tmp=tmp_path) for a in TINY[module]]
    proc = in_process(importlib.import_module(module).main, *argv, *prefix)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith(f"error: unrecognized arguments: {' '.join(prefix)}"), last
    assert not list(tmp_path.iterdir())  # nothing ran
