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
