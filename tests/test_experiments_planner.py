"""sandbox.experiments.planner: the one results folder every orchestrator runs its jobs through."""

from __future__ import annotations

import pandas as pd
import pytest

from sandbox.experiments.planner import Job, RunFolder


def _frame(value: int) -> list[pd.DataFrame]:
    return [pd.DataFrame({"value": [value]})]


def test_jobs_run_here_write_one_part_each_and_a_rerun_skips_them(tmp_path):
    folder = RunFolder(tmp_path / "out", {"steps": 3})
    jobs = [Job(f"j{i}", (f"p{i}.parquet",), (i,)) for i in range(3)]
    folder.run(_frame, jobs, total=3, workers=1, progress=False)
    values = [pd.read_parquet(folder.parts / f"p{i}.parquet")["value"][0] for i in range(3)]
    assert values == [0, 1, 2]
    again = RunFolder(tmp_path / "out", {"steps": 3})
    assert all(again.done(f"p{i}.parquet") for i in range(3))


def test_an_unknown_backend_is_named_before_any_run(tmp_path):
    folder = RunFolder(tmp_path / "out", {"steps": 3})
    jobs = [Job("j0", ("p0.parquet",), (0,))]
    with pytest.raises(ValueError, match=r"backend must be one of \('local', 'ray'\), got 'rya'"):
        folder.run(_frame, jobs, total=1, workers=1, progress=False, backend="rya")
    assert not (folder.parts / "p0.parquet").exists()


def _threads() -> list[pd.DataFrame]:
    import torch

    return [pd.DataFrame({"threads": [torch.get_num_threads()]})]


def test_jobs_run_here_on_one_torch_thread_and_the_count_comes_back(tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        folder = RunFolder(tmp_path / "out", {"steps": 3})
        jobs = [Job(f"j{i}", (f"p{i}.parquet",), ()) for i in range(2)]
        folder.run(_threads, jobs, total=2, workers=1, progress=False)
        seen = [pd.read_parquet(folder.parts / f"p{i}.parquet")["threads"][0] for i in range(2)]
        assert seen == [1, 1]
        assert torch.get_num_threads() == 2
        kept = RunFolder(tmp_path / "kept", {"steps": 3})
        kept.run(_threads, jobs, total=2, workers=1, progress=False, threads=None)
        assert pd.read_parquet(kept.parts / "p0.parquet")["threads"][0] == 2
    finally:
        torch.set_num_threads(before)


def test_pool_workers_write_their_jobs_parts_and_run_their_clean_up(tmp_path, monkeypatch):
    """The driver never writes a part: each pool worker writes its job's parts and then runs
    ``written`` (here, as the llm rung's clean-up does, it removes a scratch folder); provenance
    counts every part."""
    import functools
    import json
    import shutil

    from sandbox.experiments import planner
    from sandbox.experiments.runs import run_kind, run_specs

    def driver_wrote(*args, **kwargs):
        raise AssertionError("the driver wrote a part")

    monkeypatch.setattr(planner, "write_parquet_atomic", driver_wrote)  # the driver's own
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    clean_up = functools.partial(shutil.rmtree, str(scratch))  # rmtree(scratch, ignore_errors)
    specs = [run_kind("bandit_exact").tiny_spec, run_kind("bandit_sampled").tiny_spec]
    folder = RunFolder(tmp_path / "out", {"specs": 2})
    jobs = [Job(s.kind, (s.part,), ([s],)) for s in specs]
    left = folder.run(run_specs, jobs, total=2, workers=2, progress=False, written=clean_up)
    assert left == [] and all(folder.done(s.part) for s in specs) and not scratch.exists()
    record = json.loads((folder.out / "provenance.json").read_text())
    assert [run["parts"] for run in record["runs"]] == [2]


def test_a_ray_task_whose_parts_the_driver_cannot_see_stops_with_a_line_saying_so(tmp_path):
    """On a cluster, a task writes its parts into ``--out`` on its own node: where the driver
    cannot see them (no shared filesystem), the run stops with the line that says what ``--out``
    must be. Simulated on one machine: the task's clean-up removes the folder it wrote into."""
    import functools
    import shutil

    pytest.importorskip("ray")
    from sandbox.experiments.runs import run_kind, run_specs

    spec = run_kind("bandit_exact").tiny_spec
    folder = RunFolder(tmp_path / "out", {"spec": 1})
    vanish = functools.partial(shutil.rmtree, str(folder.parts))  # rmtree(parts, ignore_errors)
    with pytest.raises(ValueError, match="every node of the cluster mounts at the same path"):
        folder.run(
            run_specs, [Job("j", (spec.part,), ([spec],))], total=1, workers=1, progress=False,
            backend="ray", written=vanish,
        )  # fmt: skip
