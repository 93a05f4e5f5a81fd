"""The claims study's llm runs survive a command's time limit: a run of the ``llm`` kind with a
resumable scratch folder (``scratch`` in its spec's ``train``; the study CLI sets
``<out>/llm_scratch``) checkpoints periodically and on SIGTERM, resumes mid-way when run again
(also as an ensemble: ``llm.ensemble.train_ensemble`` resumes every member), and returns the rows
of an uninterrupted run; without it the kind trains in a temporary folder, removed after.

Equality is bit for bit on CPU (as ``test_llm_checkpoint.test_resume_equals_uninterrupted``), the
wall-clock columns aside. The tiny Llama on CPU; the SIGTERM tests run the real CLI in a
subprocess (one torch thread, as this test session)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from conftest import offline_env, signal_when
from test_llm_train_loop import config, strip_timing

import llm.runs
from llm import train as train_mod
from llm.checkpoint import model_state
from llm.claims import main
from llm.ensemble import check_members, train_ensemble
from llm.train import train
from sandbox.experiments.runs import RunSpec, run_specs

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("tokens_per_s", "step_time")


@pytest.fixture
def trained_steps(monkeypatch):
    """The 0-based steps trained in this process (every rollout of llm.train and the ensemble)."""
    steps: list[int] = []
    real = train_mod.rollout_phase

    def counted(run, step):
        steps.append(step)
        return real(run, step)

    monkeypatch.setattr(train_mod, "rollout_phase", counted)
    return steps


def spec(seed: int = 0, steps: int = 4, **train) -> RunSpec:
    return RunSpec.make(
        "llm",
        "parity-2",
        "dapo",
        seed=seed,
        steps=steps,
        group_size=4,
        prompts_per_step=4,
        epochs=2,
        minibatches=2,
        lr=1e-2,
        definition={"task": "parity", "length": 2},
        train={
            "model": "tiny",
            "max_new_tokens": 8,
            "eval_every": 2,
            "eval_prompts": 4,
            "offline": True,
            "save_model": False,
            "progress": False,
            **train,
        },
    )


def assert_same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(
        a.drop(columns=[c for c in TIMING if c in a]).reset_index(drop=True),
        b.drop(columns=[c for c in TIMING if c in b]).reset_index(drop=True),
        check_exact=True,
    )


# ------------------------------------------------------------------------------------------
# llm.ensemble: resume
# ------------------------------------------------------------------------------------------


def test_ensemble_resume_equals_uninterrupted(tmp_path):
    kw = dict(epochs=2, steps=4, eval_every=2, eval_prompts=4, lr_schedule="cosine")
    full = train_ensemble([config(tmp_path, f"full{s}", seed=s, **kw) for s in (0, 1)])
    part = [config(tmp_path, f"part{s}", seed=s, **kw) for s in (0, 1)]
    first = train_ensemble(part, stop_after=2)
    assert [torch.load(Path(c.out) / "checkpoint.pt")["step"] for c in part] == [2, 2]
    rest = train_ensemble([config(tmp_path, f"part{s}", seed=s, resume=True, **kw) for s in (0, 1)])
    for k in (0, 1):
        # step 0 (evaluation before training) only in the fresh call; 2 and 4 also evaluate
        assert [r["step"] for r in first[k]] == [0, 1, 2] and [r["step"] for r in rest[k]] == [3, 4]
        assert strip_timing(first[k] + rest[k]) == strip_timing(full[k])
        a, b = model_state(str(tmp_path / f"full{k}")), model_state(str(tmp_path / f"part{k}"))
        assert all(torch.equal(a[n], b[n]) for n in a)
        logged = (tmp_path / f"part{k}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in logged] == [0, 1, 2, 3, 4]


def test_ensemble_members_must_resume_from_one_step(tmp_path):
    train(config(tmp_path, "a", steps=1))  # a checkpoint at step 1
    train(config(tmp_path, "b", seed=1, steps=2))  # at step 2
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(ValueError, match=rf"one step, got {a}: step 1, {b}: step 2$"):
        check_members(
            [
                config(tmp_path, "a", steps=3, resume=True),
                config(tmp_path, "b", seed=1, steps=3, resume=True),
            ]
        )
    with pytest.raises(ValueError, match=rf"{a}: step 1, {tmp_path / 'c'}: step 0$"):
        check_members(
            [config(tmp_path, "a", steps=3, resume=True), config(tmp_path, "c", seed=1, steps=3)]
        )


# ------------------------------------------------------------------------------------------
# the llm run kind: a resumable scratch folder, or a temporary one
# ------------------------------------------------------------------------------------------


def test_without_scratch_the_run_trains_in_a_temporary_folder_removed_after(
    monkeypatch, trained_steps
):
    outs = []
    real = llm.runs.train_config
    monkeypatch.setattr(llm.runs, "train_config", lambda s: outs.append(real(s)) or outs[-1])
    frame = run_specs([spec(steps=2)])[0]
    assert frame["step"].tolist() == [0, 1, 2] and trained_steps == [0, 1]
    assert len(outs) == 1 and "llm-run-" in outs[0].out and not Path(outs[0].out).exists()
    assert outs[0].checkpoint_every == 0 and not outs[0].resume


def test_scratch_run_resumes_from_its_checkpoint_and_is_kept_until_removed(tmp_path, trained_steps):
    reference = run_specs([spec()])[0]
    resumable = spec(scratch=str(tmp_path / "scratch"), checkpoint_every=1)
    folder = tmp_path / "scratch" / llm.runs.scratch_name(resumable)
    assert folder.name.startswith("parity-2__dapo__llm__seed0__")
    cfg = llm.runs.train_config(resumable)
    assert cfg.out == str(folder) and cfg.checkpoint_every == 1
    train(cfg, stop_after=3)  # a run cut after 3 of its 4 steps (as by a time limit)
    (folder / "metrics.jsonl").open("a").write('{"step": 4, "reward": 9.0}\n')  # past the cut
    assert torch.load(folder / "checkpoint.pt")["step"] == 3
    del trained_steps[:]
    frame = run_specs([resumable])[0]
    assert trained_steps == [3]  # the last step only
    assert_same_frame(frame, reference)
    # kept, finished, until the caller has stored the frame (a signal before that loses nothing)
    assert torch.load(folder / "checkpoint.pt")["step"] == 4
    llm.runs.remove_scratch(resumable)
    assert not folder.exists()


def test_scratch_name_ignores_where_and_how_often_it_saves_not_what_it_computes(tmp_path):
    name = llm.runs.scratch_name(spec(scratch="a", checkpoint_every=1))
    assert name == llm.runs.scratch_name(spec(scratch="b", checkpoint_every=5))
    assert name == llm.runs.scratch_name(spec())
    # a calibration's runs at two step sizes share their readable stem, not their part or scratch
    other = RunSpec.make(**{**json.loads(spec().to_json()), "lr": 2e-2})
    assert other.stem() == spec().stem() and other.part != spec().part
    assert llm.runs.scratch_name(other) != name


def test_a_finished_scratch_run_is_read_not_trained(tmp_path, trained_steps):
    reference = run_specs([spec(steps=2)])[0]
    resumable = spec(steps=2, scratch=str(tmp_path))
    train(llm.runs.train_config(resumable))  # done, but cut before its part was written
    del trained_steps[:]
    assert_same_frame(run_specs([resumable])[0], reference)
    assert trained_steps == []
    llm.runs.remove_scratch(resumable)
    assert not any(tmp_path.iterdir())


def test_scratch_ensemble_members_at_other_steps_resume_one_by_one(tmp_path, trained_steps):
    references = [run_specs([spec(seed=s, steps=3)])[0] for s in (0, 1)]
    specs = [spec(seed=s, steps=3, scratch=str(tmp_path)) for s in (0, 1)]
    train(llm.runs.train_config(specs[0]), stop_after=1)  # seed 0 at step 1, seed 1 not begun
    del trained_steps[:]
    frames = run_specs(specs)  # one batch key: one job; not one ensemble (steps 1 and 0)
    assert trained_steps == [1, 2, 0, 1, 2]
    for frame, reference in zip(frames, references, strict=True):
        assert_same_frame(frame, reference)


# ------------------------------------------------------------------------------------------
# the study CLI, cut by a real SIGTERM, then run again
# ------------------------------------------------------------------------------------------

QUICK = ["--quick", "--rungs", "llm", "--rules", "dapo", "nsr_dapo", "--no-progress"]


def _cut(argv: list[str], scratch: Path, after: int) -> list[Path]:
    """Run ``python -m llm.claims argv`` until a scratch run logged step ``after``, SIGTERM it;
    return the scratch folders."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm.claims", *argv],
        cwd=ROOT,
        env=offline_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def logged() -> int:
        steps = [0]
        for path in scratch.glob("*/metrics.jsonl"):
            lines = path.read_text().splitlines(keepends=True)
            steps += [json.loads(line)["step"] for line in lines if line.endswith("\n")]
        return max(steps)

    err = signal_when(proc, lambda: logged() >= after, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "SIGTERM: checkpoint" in err and "run the same command again to resume" in err
    return sorted(p for p in scratch.iterdir() if p.is_dir())


def _parts(out: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_parquet(p) for p in sorted((out / "parts").glob("*.parquet"))}


def test_a_study_llm_run_cut_by_sigterm_resumes_mid_way(tmp_path, trained_steps):
    # the calibration run (8 steps) is cut after step 3 or so: 4 steps of margin for a SIGTERM
    # that lands late; no periodic checkpoint: SIGTERM writes the one
    calib = 8
    argv = [*QUICK, "--calib-steps", str(calib), "--llm-steps", "2", "--llm-seeds", "1"]
    argv += ["--llm-checkpoint-every", "0"]
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    folders = _cut([*argv, "--out", str(cut), "--workers", "1"], cut / "llm_scratch", after=3)
    assert len(folders) == 1 and not _parts(cut)
    done = torch.load(folders[0] / "checkpoint.pt", weights_only=True)["step"]
    logged = [
        json.loads(x)["step"] for x in (folders[0] / "metrics.jsonl").read_text().splitlines()
    ]
    assert 3 <= done < calib and logged == list(range(done + 1))  # step 0 evaluates only
    assert main([*argv, "--out", str(cut), "--workers", "1"]) == 0
    assert trained_steps[: calib - done] == list(range(done, calib))  # the calibration resumed
    assert len(trained_steps) == calib - done + 2 * 2  # then the study's 2 rules x 2 steps
    assert not (cut / "llm_scratch").exists()
    del trained_steps[:]
    assert main([*argv, "--out", str(whole), "--workers", "1"]) == 0  # uninterrupted
    assert len(trained_steps) == calib + 2 * 2
    a, b = _parts(cut), _parts(whole)
    assert sorted(a) == sorted(b) and len(a) == 3
    for name in a:
        assert_same_frame(a[name], b[name])


def test_a_study_llm_ensemble_cut_by_sigterm_resumes_mid_way(tmp_path, trained_steps):
    # the study's 2 seeds of dapo as one ensemble of 12 steps, cut after step 3 or so (8 steps of
    # margin for a SIGTERM that lands late: with 6 steps the leading ensemble sometimes finished
    # before its worker's stop, 2026-11-29), then nsr_dapo's 2 seeds, one ensemble; calibration:
    # 1 step
    length = 12
    argv = [*QUICK, "--calib-steps", "1", "--llm-ensemble", "2", "--llm-steps", str(length)]
    argv += ["--llm-seeds", "2", "--llm-checkpoint-every", "100"]
    cut, whole = tmp_path / "cut", tmp_path / "whole"
    # in the pool (the default on a GPU machine): the driver's SIGTERM reaches the workers,
    # which run the two rules' ensembles side by side
    folders = _cut([*argv, "--out", str(cut), "--workers", "2"], cut / "llm_scratch", after=3)
    assert len(folders) == 4 and len(_parts(cut)) == 1  # the calibration part
    done = {}
    for rule in ("dapo", "nsr_dapo"):
        pair = [f for f in folders if f.name.startswith(f"addition-digits1__{rule}__llm__seed")]
        steps = {torch.load(f / "checkpoint.pt", weights_only=True)["step"] for f in pair}
        assert len(pair) == 2 and len(steps) == 1  # both members, at one step
        done[rule] = steps.pop()
    assert min(done.values()) >= 1 and 3 <= max(done.values()) < length
    assert main([*argv, "--out", str(cut), "--workers", "1"]) == 0
    # each rule's members resumed together, from their checkpoint
    expected = [*range(done["dapo"], length), *range(done["nsr_dapo"], length)]
    assert trained_steps == [s for s in expected for _ in (0, 1)]
    del trained_steps[:]
    assert main([*argv, "--out", str(whole), "--workers", "1"]) == 0
    assert len(trained_steps) == 1 + 2 * 2 * length
    a, b = _parts(cut), _parts(whole)
    assert sorted(a) == sorted(b) and len(a) == 5
    for name in a:
        assert_same_frame(a[name], b[name])
