"""The claims study's llm rung runs a rule's paired seeds as one ensemble (issue 20): the
``ensemble`` setting (``--llm-ensemble K``) groups up to K seeds of one rule per job, the ``llm``
run kind trains a group as one :func:`llm.ensemble.train_ensemble`, and every seed is still its
own part with the rows its separate run gives (to float rounding), so separate-run and ensemble
folders are interchangeable: same part names, same ledger, either resumes the other.

The tiny Llama on CPU (the quick profile's llm rung: 1 calibration run, then rules x 3 seeds)."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

pytest.importorskip("transformers")

import llm.ensemble
from llm.claims import PROFILES, main, parse_args
from llm.claims import llm_spec as claims_llm_spec
from sandbox.experiments.runs import RunSpec, run_specs
from sandbox.study import StudyConfig
from sandbox.study.plan import StudyJob, job_groups, job_part

RULES = ["dapo", "nsr_dapo"]
ARGV = ["--quick", "--rules", *RULES, "--rungs", "llm", "--workers", "1", "--no-progress"]
# float32 training: the members' batched matmuls round differently from one model's
REL, ABS = 1e-4, 1e-6
TIMING = ("tokens_per_s", "step_time")  # wall-clock columns of the run kind's frame


@pytest.fixture
def ensembles(monkeypatch):
    """The sizes of the ensembles trained (train_ensemble is looked up at call time)."""
    sizes: list[int] = []
    real = llm.ensemble.train_ensemble

    def counted(cfgs):
        sizes.append(len(cfgs))
        return real(cfgs)

    monkeypatch.setattr(llm.ensemble, "train_ensemble", counted)
    return sizes


def assert_frames_close(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal keys and steps, every metric to float tolerance (NaN where the other is NaN)."""
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    for column in (c for c in a.columns if c not in TIMING):
        x, y = a[column].reset_index(drop=True), b[column].reset_index(drop=True)
        if pd.api.types.is_numeric_dtype(x):
            assert x.isna().tolist() == y.isna().tolist(), column
            assert x.dropna().tolist() == pytest.approx(y.dropna().tolist(), rel=REL, abs=ABS), (
                column
            )
        else:
            assert x.tolist() == y.tolist(), column


def llm_spec(seed: int) -> RunSpec:
    return RunSpec.make(
        "llm",
        "parity-2",
        "dapo",
        seed=seed,
        steps=2,
        group_size=4,
        prompts_per_step=4,
        epochs=2,
        minibatches=2,
        lr=1e-2,
        definition={"task": "parity", "length": 2},  # rewards ~1/2: the runs learn
        train={
            "model": "tiny",
            "max_new_tokens": 8,
            "eval_every": 1,
            "eval_prompts": 4,
            "eval_k": 1,
            "offline": True,
            "save_model": False,
            "progress": False,
        },
    )


def test_one_call_of_the_llm_kind_with_two_seeds_equals_two_separate_runs(ensembles):
    specs = [llm_spec(0), llm_spec(1)]
    alone = [run_specs([spec])[0] for spec in specs]
    assert ensembles == []  # a single spec is an ordinary llm.train run
    together = run_specs(specs)
    assert ensembles == [2]  # one batch key: one ensemble of both seeds
    for a, t, seed in zip(alone, together, (0, 1), strict=True):
        # steps 0 (evaluation only), 1, 2 (the second rollout comes from the updated model)
        assert a["step"].tolist() == [0, 1, 2] and set(a["seed"]) == {seed}
        assert a["loss"].notna().sum() == 2  # the updates' metrics are compared too
        assert_frames_close(t, a)
    # the seeds differ (the pairing is by seed, not a copy of one run)
    assert alone[0]["reward"].tolist() != alone[1]["reward"].tolist() or (
        alone[0]["entropy"].tolist() != alone[1]["entropy"].tolist()
    )


def quick_config(ensemble: int) -> StudyConfig:
    config, _ = parse_args([*ARGV, "--llm-ensemble", str(ensemble)])
    return config


def test_jobs_group_one_rules_seeds_at_most_k_at_a_time():
    config = quick_config(2)
    jobs = [
        StudyJob("study", "llm", r, 1e-3, 2, s) for s in range(3) for r in RULES
    ]  # study_jobs' order
    # by hand: rule after rule, seeds (0, 1) then (2,); a resumed study groups what is left
    groups = job_groups(config, jobs)
    assert [[j.seed for j in g] for g in groups] == [[0, 1], [2], [0, 1], [2]]
    assert [{j.rule for j in g} for g in groups] == [{"dapo"}] * 2 + [{"nsr_dapo"}] * 2
    left = [j for j in jobs if j.seed != 1 or j.rule != "dapo"]
    assert [[j.seed for j in g] for g in job_groups(config, left)] == [[0, 2], [0, 1], [2]]
    # a calibration's step sizes at one mu group too (each member has its own AdamW lr), at
    # most K; another mu is another group; K = 1 runs every job alone
    calib = [StudyJob("calib", "llm", "dapo", lr, mu, 0) for mu in (2, 4) for lr in (1, 2, 3)]
    assert [[(j.lr, j.epochs) for j in g] for g in job_groups(config, calib)] == [
        [(1, 2), (2, 2)],
        [(3, 2)],
        [(1, 4), (2, 4)],
        [(3, 4)],
    ]
    assert job_groups(quick_config(1), jobs + calib) == [(j,) for j in jobs + calib]
    # the setting is an execution choice: parts made with any K are the same parts
    assert [job_part(config, j) for j in jobs + calib] == [
        job_part(quick_config(1), j) for j in jobs + calib
    ]


@pytest.mark.parametrize("bad", ["0", "-1"])
def test_a_bad_ensemble_size_is_named(bad, capsys):
    assert main([*ARGV, "--llm-ensemble", bad, "--out", "unused"]) == 2
    assert "llm_ensemble must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"llm_ensemble must be an integer >= 1, got 2.5"):
        StudyConfig(rules=RULES, sections={"llm": {**PROFILES["quick"]["llm"], "ensemble": 2.5}})


def parts_of(out) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_parquet(p) for p in sorted((out / "parts").glob("*.parquet"))}


def test_the_study_with_ensembles_writes_the_separate_runs_parts_and_ledger(
    tmp_path, ensembles, capsys, monkeypatch
):
    separate, together = tmp_path / "separate", tmp_path / "together"
    assert main([*ARGV, "--out", str(separate)]) == 0
    assert ensembles == []
    assert main([*ARGV, "--llm-ensemble", "2", "--out", str(together)]) == 0
    assert ensembles == [2, 2]  # per rule seeds (0, 1) as one ensemble, seed 2 alone
    a, b = parts_of(separate), parts_of(together)
    assert sorted(a) == sorted(b) and len(a) == 1 + 2 * 3  # one part per seed, same names
    for name in a:
        assert_frames_close(b[name], a[name])
    # the scores of each (rule, seed); final_entropy comes from the (batched) training forward
    scores = pd.read_csv(separate / "scores.csv").sort_values(["rule", "seed"])
    assert scores["final_entropy"].nunique() == 3  # one value per seed (no update: reward 0)
    assert_frames_close(pd.read_csv(together / "scores.csv").sort_values(["rule", "seed"]), scores)
    ledger_a = pd.read_csv(separate / "ledger.csv")
    ledger_b = pd.read_csv(together / "ledger.csv")
    assert ledger_a[["claim", "rung", "seeds"]].values.tolist() == [["nsr_beats_dapo", "llm", 3]]
    assert_frames_close(ledger_b, ledger_a)

    # a second run recomputes nothing
    stamps = {p.name: p.stat().st_mtime_ns for p in (together / "parts").glob("*.parquet")}
    capsys.readouterr()
    assert main([*ARGV, "--llm-ensemble", "2", "--out", str(together)]) == 0
    err = capsys.readouterr().err
    assert "1 of 1 runs already done" in err and "6 of 6 runs already done" in err
    assert ensembles == [2, 2]
    assert {p.name: p.stat().st_mtime_ns for p in (together / "parts").glob("*.parquet")} == stamps

    # a folder of separate-run parts resumes with ensembles: only the missing seeds run, as one
    mixed = tmp_path / "mixed"
    shutil.copytree(separate, mixed)
    config, _ = parse_args([*ARGV, "--out", str(mixed)])
    jobs = [StudyJob("study", "llm", "nsr_dapo", 1e-3, 2, s) for s in (0, 2)]
    missing = [job_part(config, job) for job in jobs]
    for name in missing:
        (mixed / "parts" / name).unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (mixed / "parts").glob("*.parquet")}
    counted = llm.ensemble.train_ensemble

    def interrupted(cfgs):
        raise RuntimeError("the job dies mid-ensemble")

    monkeypatch.setattr(llm.ensemble, "train_ensemble", interrupted)
    with pytest.raises(RuntimeError, match="mid-ensemble"):
        main([*ARGV, "--llm-ensemble", "3", "--out", str(mixed)])
    # the failed job wrote none of its seeds and touched no finished part
    assert {p.name: p.stat().st_mtime_ns for p in (mixed / "parts").glob("*.parquet")} == kept
    monkeypatch.setattr(llm.ensemble, "train_ensemble", counted)
    assert main([*ARGV, "--llm-ensemble", "3", "--out", str(mixed)]) == 0
    assert ensembles == [2, 2, 2]  # nsr_dapo's seeds 0 and 2
    c = parts_of(mixed)
    assert sorted(c) == sorted(a)
    assert all((mixed / "parts" / n).stat().st_mtime_ns == t for n, t in kept.items())
    for name in missing:
        assert_frames_close(c[name], a[name])
    assert_frames_close(pd.read_csv(mixed / "ledger.csv"), ledger_a)


def test_the_calibrations_step_sizes_train_as_one_ensemble_with_the_same_parts(tmp_path, ensembles):
    """The llm rung's calibration, two step sizes of seed 0, is one ensemble (each member with
    its own step size) and writes the parts and curve of its separate runs."""
    argv = [*ARGV, "--rules", "dapo", "--llm-lrs", "1e-3", "3e-2", "--llm-seeds", "1"]
    # parity-2 with 8 tokens and G = 4: rewards, so the step sizes give other runs (checked)
    argv += ["--llm-task", "parity", "--llm-task-knobs", "length=2", "--llm-max-new-tokens", "8"]
    argv += ["--llm-group-size", "4", "--llm-prompts-per-step", "4"]
    separate, together = tmp_path / "separate", tmp_path / "together"
    assert main([*argv, "--out", str(separate)]) == 0
    assert ensembles == []
    assert main([*argv, "--llm-ensemble", "2", "--out", str(together)]) == 0
    assert ensembles == [2]  # the calibration; the study is one run of one seed
    a, b = parts_of(separate), parts_of(together)
    calib = [a[n] for n in sorted(a) if n.startswith("calib")]
    assert sorted(a) == sorted(b) and len(calib) == 2
    assert calib[0]["clip_low_frac"].tolist() != calib[1]["clip_low_frac"].tolist()
    for name in a:
        assert_frames_close(b[name], a[name])
    calibration = [pd.read_csv(out / "calibration.csv") for out in (separate, together)]
    assert_frames_close(calibration[1], calibration[0])


def test_the_compact_sampler_writes_the_same_parts_alone_and_as_one_ensemble(
    tmp_path, ensembles, capsys
):
    """``--llm-rollout-backend compact`` (the gpu profile's llm sampler): its separate runs and its
    ensemble write the same parts (the decoder's draws are fixed per seed, step, row and position,
    whatever else shares the loop); in a folder of the hf sampler's runs it writes its own
    parts, each named apart from the hf sampler's."""
    compact = [*ARGV, "--llm-rollout-backend", "compact"]
    separate, together = tmp_path / "separate", tmp_path / "together"
    assert main([*compact, "--out", str(separate)]) == 0
    assert main([*compact, "--llm-ensemble", "3", "--out", str(together)]) == 0
    assert ensembles == [3, 3]  # per rule, its 3 seeds as one ensemble
    a, b = parts_of(separate), parts_of(together)
    assert sorted(a) == sorted(b) and len(a) == 1 + 2 * 3
    for name in a:
        assert_frames_close(b[name], a[name])
    hf = tmp_path / "hf"
    assert main([*ARGV, "--out", str(hf)]) == 0
    capsys.readouterr()
    first = set(parts_of(hf))
    assert main([*compact, "--out", str(hf)]) == 0
    assert first.isdisjoint(a) and set(parts_of(hf)) == first | set(a)


def test_the_gpu_profile_trains_the_llm_rung_as_compact_ensembles():
    config, _ = parse_args(["--profile", "gpu"])
    settings = config.section("llm")
    assert (settings.rollout_backend, settings.ensemble, settings.seeds) == ("compact", 8, 8)
    jobs = [StudyJob("study", "llm", "dapo", 1e-5, 2, s) for s in range(8)]
    assert [len(g) for g in job_groups(config, jobs)] == [8]
    spec = claims_llm_spec(config, jobs[0], seeds=1, steps=100)
    assert dict(spec.train)["rollout_backend"] == "compact"
    with pytest.raises(
        ValueError, match="llm_rollout_backend must be one of hf, compact, got 'vllm'"
    ):
        parse_args(["--profile", "gpu", "--llm-rollout-backend", "vllm"])
