"""Sweeps: file parsing and validation, grid expansion, local and Ray backends, resume, plot CLI."""

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from sandbox.cli import main as cli
from sandbox.experiments import sweep
from sandbox.experiments.runs import RunSpec, trainer_config
from sandbox.experiments.sweep import (
    SweepRunError,
    load_sweep,
    parse_sweep,
    run_id,
    run_parts,
    run_sweep,
)

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
FIGURES = (
    "reward_vs_step",
    "entropy_vs_step",
    "clip_fractions",
    "exact_vs_sampled",
    "final_scores",
)

# 2 variants x 1 setting x 2 base seeds = 4 runs of 4 vectorised seeds x 3 steps
TINY_TOML = """
name = "tiny"
suite = "bandit"
settings = ["easy"]
seeds = 4
steps = 3
prompts_per_step = 2
minibatches = 2
seed = [0, 1]

[[grid]]
objective = "dapo"

[[grid]]
objective = "nsr"
params = { noise = "band", sigma = 0.1 }
"""

TINY_YAML = """
name: tiny
suite: bandit
settings: [easy]
seeds: 4
steps: 3
prompts_per_step: 2
minibatches: 2
seed: [0, 1]
grid:
  - objective: dapo
  - objective: nsr
    params: {noise: band, sigma: 0.1}
"""

BASE_GROW = {
    "name": "grow",
    "settings": ["easy", "needle"],
    "seeds": 2,
    "steps": 2,
    "train": {"aggregation": "token-mean"},
    "grid": [{"objective": "dapo"}],
}

TINY_RUN_IDS = [
    "easy__dapo__seed0",
    "easy__dapo__seed1",
    "easy__nsr__noise=band__sigma=0.1__seed0",
    "easy__nsr__noise=band__sigma=0.1__seed1",
]


def run_ids(parts: Path) -> list[str]:
    """The run ids of the parts in ``parts`` (a part per sampled run or exact flow: each file's
    name less its flow, hash and suffix), each once."""
    return sorted({p.name.rsplit("__", 2)[0] for p in parts.iterdir()})


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def tiny(tmp_path):
    return load_sweep(_write(tmp_path, "tiny.toml", TINY_TOML))


def _mtimes(parts: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in parts.iterdir()}


# ------------------------------------------------------------------------------------------------
# files, grid, validation
# ------------------------------------------------------------------------------------------------


def test_toml_and_yaml_give_the_same_plan(tmp_path):
    from_toml = load_sweep(_write(tmp_path, "s.toml", TINY_TOML))
    from_yaml = load_sweep(_write(tmp_path, "s.yaml", TINY_YAML))
    assert from_toml == from_yaml
    assert from_toml.to_dict() == from_yaml.to_dict()
    assert from_toml.config.seeds == 4 and from_toml.config.lr == 1.0  # the suite default
    # YAML 1.1 reads 3e-4 as a string; the sweep reads it as the number it means
    text = TINY_YAML.replace("{noise: band, sigma: 0.1}", "{eps_low: 3e-4, eps_high: 4.0e-4}")
    plan = load_sweep(_write(tmp_path, "e.yml", text))
    assert plan.variants[1] == ("nsr", (("eps_high", 4e-4), ("eps_low", 3e-4)))


def test_grid_expands_to_runs_with_stable_ids(tmp_path):
    spec = {
        "name": "grid",
        "settings": ["needle", "mixed"],
        "seed": [0, 3],
        "grid": [
            {"objective": "nsr", "params": {"sigma": [0.05, 0.1], "noise": ["uniform", "band"]}},
            {"objective": ["dapo", "grpo"]},
        ],
    }
    plan = parse_sweep(spec)
    labels = [s.label for s in plan.runs()[:12:2]]  # the first setting, the first base seed
    assert labels == [
        "nsr[noise=uniform,sigma=0.05]",
        "nsr[noise=band,sigma=0.05]",
        "nsr[noise=uniform,sigma=0.1]",
        "nsr[noise=band,sigma=0.1]",
        "dapo",
        "grpo",
    ]
    runs = plan.runs()
    assert len(runs) == 6 * 2 * 2  # variants x settings x base seeds
    assert run_id(runs[0]) == "needle__nsr__noise=uniform__sigma=0.05__seed0"
    assert run_id(runs[1]) == "needle__nsr__noise=uniform__sigma=0.05__seed3"
    assert run_id(runs[-1]) == "mixed__grpo__seed3"
    assert len({run_id(r) for r in runs}) == len(runs)
    # stable: the same file gives the same ids; parameter order in the file does not matter
    spec["grid"][0]["params"] = {"noise": ["uniform", "band"], "sigma": [0.05, 0.1]}
    assert {run_id(r) for r in parse_sweep(spec).runs()} == {run_id(r) for r in runs}
    # a long parameter list is hashed into a short, stable id
    params = {
        "eps_low": 0.123456789,
        "eps_high": 0.28123456789,
        "beta1": 0.55555555555,
        "beta2": 1.11111111111,
        "clip_c": 9.5,
    }
    long = run_id(RunSpec.make("bandit_sampled", "easy", "ce_gppo", params=params))
    assert long.startswith("easy__ce_gppo__p") and len(long) < 40
    reordered = dict(reversed(params.items()))
    assert long == run_id(RunSpec.make("bandit_sampled", "easy", "ce_gppo", params=reordered))


BASE = {"name": "v", "settings": ["easy"], "grid": [{"objective": "dapo"}]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stepz": 3}, r"unknown key\(s\) \['stepz'\]"),
        ({"name": ""}, r"^name: missing"),
        ({"suite": "atari"}, r"suite must be 'bandit' or 'reasoning'"),
        ({"settings": ["easy", "hard"]}, r"settings: unknown setting 'hard'"),
        ({"steps": 0}, r"steps"),
        ({"seed": [0, -1]}, r"^seed: base seeds are integers >= 0, got -1"),
        ({"seed": [0, 1, 0]}, r"^seed: base seed 0 appears twice$"),
        ({"settings": ["easy", "mixed", "easy"]}, r"^settings: setting easy appears twice$"),
        ({"grid": []}, r"^grid: needs at least one"),
        (
            {"grid": [{"objective": "dapo"}, {"objective": "ppo"}]},
            r"^grid\[1\]\.objective: unknown objective 'ppo'",
        ),
        (
            {"grid": [{"objective": "nsr", "params": {"sigmaa": [0.1]}}]},
            r"^grid\[0\]\.params\.sigmaa: .*sigmaa",
        ),
        (
            {"grid": [{"objective": "nsr", "params": {"sigma": [0.1, 2.0]}}]},
            r"^grid\[0\]\.params\.sigma: nsr with \{'sigma': 2\.0\}: .*sigma",
        ),
        ({"grid": [{"objective": "dgpo", "params": {"n": []}}]}, r"^grid\[0\]\.params\.n: needs"),
        (
            {"grid": [{"objective": "dapo", "param": {}}]},
            r"^grid\[0\]: unknown key\(s\) \['param'\]",
        ),
        ({"grid": [{"objective": "dapo"}, {"objective": ["dapo"]}]}, r"variant dapo appears twice"),
        ({"train": {"advantage": "nope"}}, r"^dapo on easy: .*advantage"),
        ({"train": {"colour": 1}}, r"^train\.colour: not a field of BanditTrainConfig"),
        ({"train": {"lr": 0.1}}, r"^train\.lr: a shared field"),
        ({"tasks": {"t": {"task": "bits"}}}, r"^tasks: not used by the bandit suite"),
        ({"envs": {"easy": {"env": "sandbox/SoftmaxBandit-v0"}}}, r"^envs\.easy: shadows"),
        ({"envs": {"e": {"reward": "needle"}}}, r"^envs\.e\.env: missing"),
    ],
)
def test_validation_errors_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        parse_sweep({**BASE, **change})


def test_reasoning_validation_and_custom_settings(tmp_path):
    spec = {
        "name": "r",
        "suite": "reasoning",
        "settings": ["bits-reverse-2"],
        "tasks": {"bits-reverse-2": {"task": "bits", "op": "reverse", "length": 2}},
        "seeds": 2,
        "steps": 2,
        "train": {"d_model": 16},
        "grid": [{"objective": "nsr", "params": {"level": ["token", "sequence"]}}],
    }
    plan = parse_sweep(spec)
    assert plan.config.optimizer == "adam" and plan.setting_defs["bits-reverse-2"]["task"] == "bits"
    assert trainer_config(plan.runs()[1]).objective_params == {"level": "sequence"}
    with pytest.raises(ValueError, match=r"^tasks\.bad: unknown knob"):
        parse_sweep({**spec, "tasks": {"bad": {"task": "bits", "colour": 1}}})
    with pytest.raises(ValueError, match=r"settings: unknown setting 'easy'"):
        parse_sweep({**spec, "settings": ["easy"]})
    with pytest.raises(ValueError, match=r"^nsr\[level=token\] on bits-reverse-2: .*d_model"):
        parse_sweep({**spec, "train": {"d_model": 0}})


@pytest.mark.parametrize("path", sorted(SWEEPS.glob("*.toml")), ids=lambda p: p.name)
def test_example_sweeps_validate_and_one_run_each_works(path):
    plan = load_sweep(path)
    assert plan.name == path.stem.replace("_", "-") and len(plan.runs()) >= 8
    assert len({run_id(r) for r in plan.runs()}) == len(plan.runs())
    # smoke: the file's last variant on its first setting, 2 seeds x 2 steps (the full sweeps
    # run in minutes)
    smoke = sweep.with_overrides(plan, seeds=2, steps=2)
    name, specs = next(
        p for p in smoke.parts() if (p[1][0].rule, p[1][0].params) == plan.variants[-1]
    )
    spec = specs[0]
    assert spec.setting == plan.settings[0] and (spec.seeds, spec.steps) == (2, 2)
    assert name == f"{run_id(spec)}__sampled__{spec.digest()}.parquet"
    [job] = smoke.jobs([(name, specs)])  # the engine's job for this one run
    [frame] = run_parts(*job.args)
    assert set(frame["objective"]) == {spec.label} and frame["expected_reward"].notna().all()


# ------------------------------------------------------------------------------------------------
# one run
# ------------------------------------------------------------------------------------------------


def test_run_columns_and_custom_env(tiny):
    spec = {
        "name": "c",
        "settings": ["needle-10"],
        "seeds": 3,
        "steps": 2,
        "envs": {
            "needle-10": {
                "env": "sandbox/SoftmaxBandit-v0",
                "reward": "needle",
                "num_arms": 10,
                "num_correct": 1,
            }
        },
        "grid": [{"objective": "nsr", "params": {"sigma": 0.2, "seed": 7}}],
    }
    plan = parse_sweep(spec)
    run = plan.runs()[0]
    exact, sampled = plan.jobs(plan.parts())  # one run: its exact flow and its sampled part
    assert (exact.key, sampled.key) == (run_id(run), run_id(run))
    assert sampled.parts == (run.part_of(f"{run_id(run)}__sampled"),)
    frame = pd.concat([*run_parts(*exact.args), *run_parts(*sampled.args)], ignore_index=True)
    label = "nsr[seed=7,sigma=0.2]"
    assert set(frame["objective"]) == set(frame["variant"]) == {label}
    assert set(frame["base_objective"]) == {"nsr"} and set(frame["run_id"]) == {run_id(run)}
    # the objective's own `seed` parameter does not clobber the trainer's seed column
    assert set(frame["param_seed"]) == {7} and set(frame["sigma"]) == {0.2}
    assert sorted(frame["seed"].unique()) == [-1, 0, 1, 2]  # -1: the exact flow
    assert (
        len(frame[frame["kind"] == "sampled"]) == 3 * 2
        and len(frame[frame["kind"] == "exact"]) == 2
    )
    assert (frame["optimum"] == 1.0).all()  # the needle arm pays 1


# ------------------------------------------------------------------------------------------------
# the local backend: end to end, resume, interruption
# ------------------------------------------------------------------------------------------------


def test_local_sweep_end_to_end_with_one_and_two_workers(tiny, tmp_path):
    results, scores = run_sweep(tiny, tmp_path / "w1", workers=1, progress=False)
    out = tmp_path / "w1"
    assert run_ids(out / "parts") == sorted(TINY_RUN_IDS)
    assert (out / "results.parquet").exists() and (out / "plan.json").exists()
    for name in FIGURES:
        assert (out / f"{name}.png").stat().st_size > 5_000, name
    # tidy: one row per (setting, objective, kind, run_seed, seed, step)
    assert not results.duplicated(
        ["setting", "objective", "kind", "run_seed", "seed", "step"]
    ).any()
    sampled = results[results["kind"] == "sampled"]
    assert len(sampled) == 2 * 2 * 4 * 3  # variants x base seeds x seeds x steps
    assert set(results["objective"]) == {"dapo", "nsr[noise=band,sigma=0.1]"}
    assert set(results["run_id"]) == set(TINY_RUN_IDS)
    nsr = results[results["base_objective"] == "nsr"]
    assert set(nsr["noise"]) == {"band"} and set(nsr["sigma"]) == {0.1}
    assert results.loc[results["base_objective"] == "dapo", "sigma"].isna().all()
    # base seeds differ: seed 1's runs are not copies of seed 0's
    by_seed = sampled[sampled["step"] == 2].groupby("run_seed")["expected_reward"].apply(list)
    assert by_seed[0] != by_seed[1]
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns[:5]) == ["setting", "objective", "base_objective", "noise", "sigma"]
    assert len(summary) == 2 and summary["final_reward"].between(0, 1).all()
    pd.testing.assert_frame_equal(summary, scores, check_dtype=False)
    assert scores.set_index("objective").loc["dapo", "exact_final_reward"] > 0

    # two processes give the same numbers (every run is seeded by its base seed only)
    again, _ = run_sweep(tiny, tmp_path / "w2", workers=2, progress=False, figures=False)
    pd.testing.assert_frame_equal(again, results)
    assert (tmp_path / "w2" / "summary.csv").exists()


def test_resume_recomputes_only_missing_runs(tiny, tmp_path):
    out = tmp_path / "resume"
    first, _ = run_sweep(tiny, out, workers=1, progress=False, figures=False)
    parts = out / "parts"
    stamps = _mtimes(parts)
    missing = [p.name for p in parts.iterdir() if p.name.startswith(f"{TINY_RUN_IDS[2]}__")]
    for name in missing:  # the run's sampled part and its exact flow's
        (parts / name).unlink()
    calls = []
    real = sweep.run_specs

    def counting(specs):
        calls.append([(s.setting, s.rule, dict(s.params), s.seed) for s in specs])
        return real(specs)

    sweep.run_specs = counting
    try:
        again, _ = run_sweep(tiny, out, workers=1, progress=False, figures=False)
    finally:
        sweep.run_specs = real
    # two calls: the missing run's exact flow, then its sampled run
    assert calls == [[("easy", "nsr", {"noise": "band", "sigma": 0.1}, 0)]] * 2
    now = _mtimes(parts)
    assert now.keys() == stamps.keys()
    assert all(now[name] == stamps[name] for name in stamps if name not in missing)
    pd.testing.assert_frame_equal(again, first)


def test_interrupted_sweep_keeps_complete_parts_and_resumes(tiny, tmp_path, monkeypatch):
    out = tmp_path / "crash"
    real = sweep.run_specs
    calls = []

    def crash_on_second(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("simulated crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "run_specs", crash_on_second)
    # the first job: the setting's exact flows, batched; the second: the first sampled run
    with pytest.raises(SweepRunError, match=r"run easy__dapo__seed0 failed: .*simulated crash"):
        run_sweep(tiny, out, workers=1, progress=False, figures=False)
    files = sorted(p.name for p in (out / "parts").iterdir())
    assert len(files) == len(TINY_RUN_IDS) and all("__exact__" in f for f in files)  # no temp
    assert not (out / "results.parquet").exists()
    stamp = (out / "parts" / files[0]).stat().st_mtime_ns

    monkeypatch.setattr(sweep, "run_specs", real)
    results, _ = run_sweep(tiny, out, workers=1, progress=False, figures=False)
    assert run_ids(out / "parts") == sorted(TINY_RUN_IDS)
    assert (out / "parts" / files[0]).stat().st_mtime_ns == stamp
    assert set(results["run_id"]) == set(TINY_RUN_IDS)


def test_changed_training_fields_compute_their_own_parts_and_report_only_them(tiny, tmp_path):
    """A changed shared field names other parts: they are computed beside the old ones, the
    tables hold only the new runs, and the old settings find theirs again (nothing recomputed);
    ``force`` recomputes the plan's parts."""
    out = tmp_path / "changed"
    first, _ = run_sweep(tiny, out, workers=1, progress=False, figures=False)
    stamps = _mtimes(out / "parts")
    longer = dataclasses.replace(tiny, config=dataclasses.replace(tiny.config, steps=4))
    results, _ = run_sweep(longer, out, workers=1, progress=False, figures=False)
    assert results["step"].max() == 4 and first["step"].max() == 3  # steps 1..4 (1-based)
    assert run_ids(out / "parts") == sorted(TINY_RUN_IDS)
    assert len(_mtimes(out / "parts")) == 2 * len(stamps)  # both settings' runs, side by side
    assert json.loads((out / "plan.json").read_text())["shared"]["steps"] == 4  # this command's
    again, _ = run_sweep(tiny, out, workers=1, progress=False, figures=False)
    pd.testing.assert_frame_equal(again, first)  # the old settings' runs, none of the new ones
    now = _mtimes(out / "parts")
    assert all(now[name] == stamp for name, stamp in stamps.items())  # reused, not recomputed
    run_sweep(tiny, out, workers=1, progress=False, figures=False, force=True)
    assert all(_mtimes(out / "parts")[name] != stamp for name, stamp in stamps.items())


def test_a_grown_sweep_reuses_its_runs_and_a_dropped_train_field_makes_new_ones(tmp_path):
    out = tmp_path / "grow"
    first = parse_sweep({**BASE_GROW, "settings": ["easy"]})
    run_sweep(first, out, workers=1, progress=False, figures=False)
    stamps = _mtimes(out / "parts")
    # another setting: the finished runs of easy are reused, only needle's are computed
    run_sweep(parse_sweep(BASE_GROW), out, workers=1, progress=False, figures=False)
    now = _mtimes(out / "parts")
    assert all(now[name] == stamp for name, stamp in stamps.items())
    assert run_ids(out / "parts") == ["easy__dapo__seed0", "needle__dapo__seed0"]
    # a [train] field removed changes every run: two new parts, the old ones untouched
    run_sweep(
        parse_sweep({**BASE_GROW, "train": {}}), out, workers=1, progress=False, figures=False
    )
    assert len(_mtimes(out / "parts")) == 2 * len(now)
    assert all(_mtimes(out / "parts")[name] == stamp for name, stamp in now.items())


def test_seeds_and_steps_overrides_for_a_smoke_run(tiny, tmp_path, capsys):
    smoke = sweep.with_overrides(tiny, seeds=2, steps=2)
    assert (smoke.config.seeds, smoke.config.steps) == (2, 2)
    assert (tiny.config.seeds, tiny.config.steps) == (4, 3)  # the loaded plan is unchanged
    assert sweep.with_overrides(tiny) is tiny
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        sweep.with_overrides(tiny, steps=0)
    path = _write(tmp_path, "tiny.toml", TINY_TOML)
    argv = [
        "sweep",
        str(path),
        "--out",
        str(tmp_path),
        "--name",
        "smoke",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--workers",
        "1",
        "--no-progress",
    ]
    assert cli(argv) == 0
    results = pd.read_parquet(tmp_path / "smoke" / "results.parquet")
    sampled = results[results["kind"] == "sampled"]
    assert set(sampled["seed"]) == {0, 1} and set(results["step"]) == {1, 2}
    assert "4 runs (2 objectives x 1 settings x 2 base seeds; 2 seeds x 2 steps each)" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("name", ["..", "../x", "a/b", "."])
def test_names_that_leave_the_output_folder_are_refused(tmp_path, capsys, name):
    with pytest.raises(ValueError, match="name: use letters"):
        parse_sweep({"name": name, "grid": [{"objective": "dapo"}]})
    path = _write(tmp_path, "tiny.toml", TINY_TOML)
    assert cli(["sweep", str(path), "--out", str(tmp_path / "runs"), "--name", name]) == 2
    assert "name: use letters" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------------
# Ray
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ray_backend_matches_the_local_one(tiny, tmp_path, local_ray):
    results, scores = run_sweep(
        tiny, tmp_path / "ray", backend="ray", progress=False, figures=False
    )
    assert local_ray.is_initialized()  # an instance the caller started is left running
    assert run_ids(tmp_path / "ray" / "parts") == sorted(TINY_RUN_IDS)
    local, _ = run_sweep(tiny, tmp_path / "local", workers=1, progress=False, figures=False)
    pd.testing.assert_frame_equal(results, local)
    assert len(scores) == 2


# ------------------------------------------------------------------------------------------------
# the CLI
# ------------------------------------------------------------------------------------------------


def test_cli_sweep_dry_run_sweep_and_plot(tmp_path, capsys):
    path = _write(tmp_path, "tiny.toml", TINY_TOML)
    runs = tmp_path / "runs"
    assert cli(["sweep", str(path), "--out", str(runs), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert (
        "2 variants x 1 settings x 2 base seeds = 4 runs" in text
        and "0 of 8 parts finished" in text
    )
    assert not (runs / "tiny" / "parts").exists()

    assert cli(["sweep", str(path), "--out", str(runs), "--workers", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "[easy]" in text and "nsr[noise=band,sigma=0.1]" in text and "final reward" in text
    assert (runs / "tiny" / "results.parquet").exists()

    # plot from the parts alone, into another folder
    (runs / "tiny" / "results.parquet").unlink()
    figs = tmp_path / "figs"
    argv = ["plot", str(runs / "tiny"), "--out", str(figs), "--highlight", "dapo"]
    assert cli(argv) == 0
    text = capsys.readouterr().out
    assert "[easy]" in text and "dapo" in text
    for name in FIGURES:
        assert (figs / f"{name}.png").stat().st_size > 5_000, name

    assert cli(["plot", str(runs / "tiny"), "--highlight", "ppo"]) == 2
    assert "highlight: unknown objective(s) ['ppo']" in capsys.readouterr().err
    assert cli(["plot", str(tmp_path / "nothing")]) == 2
    # summary.csv (the CSV every run writes): the final-score figure and table
    (figs / "final_scores.png").unlink()
    assert cli(["plot", str(runs / "tiny" / "summary.csv"), "--out", str(figs)]) == 0
    text = capsys.readouterr().out
    assert "[easy]" in text and "final scores only" in text
    assert (figs / "final_scores.png").stat().st_size > 5_000
    other = tmp_path / "other.csv"
    pd.DataFrame({"a": [1]}).to_csv(other, index=False)
    assert cli(["plot", str(other)]) == 2
    err = capsys.readouterr().err
    assert "has no column(s) ['setting', 'objective', 'kind', 'step', 'expected_reward']" in err
    assert "summary.csv" in err
    assert cli(["sweep", str(tmp_path / "missing.toml")]) == 2
    assert "sweep file not found" in capsys.readouterr().err
