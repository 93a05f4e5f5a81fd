"""The default comparison, end to end in a small setting."""

import json

import numpy as np
import pandas as pd
import pytest

from sandbox.cli import main
from sandbox.exact import exact_flow
from sandbox.experiments import CompareConfig, load_results, run_compare
from sandbox.experiments.compare import parse_objective_params, run_spec
from sandbox.experiments.plots import mean_ci
from sandbox.experiments.sweep import RUN_COLUMNS, compare_plan, run_id
from sandbox.objectives import get_objective

SMALL = dict(
    objectives=["grpo", "nsr_dapo", "clip_cov"],
    settings=["easy", "mixed"],
    seeds=4,
    steps=6,
    prompts_per_step=2,
    minibatches=2,
)


def test_compare_writes_results_summary_figures_and_resumes(tmp_path):
    out = tmp_path / "small"
    results, scores = run_compare(CompareConfig(**SMALL), out, workers=1, progress=False)
    assert (out / "results.parquet").exists() and (out / "summary.csv").exists()
    for name in (
        "reward_vs_step",
        "entropy_vs_step",
        "clip_fractions",
        "exact_vs_sampled",
        "final_scores",
    ):
        assert (out / f"{name}.png").stat().st_size > 5_000, name
    loaded = load_results(out)
    pd.testing.assert_frame_equal(loaded, results)
    # tidy: one row per (setting, objective, kind, seed, step)
    keys = ["setting", "objective", "kind", "seed", "step"]
    assert not results.duplicated(keys).any()
    sampled = results[results["kind"] == "sampled"]
    assert len(sampled) == 2 * 3 * 4 * 6
    # the exact flow exists exactly for the rules with a closed form (not clip_cov)
    exact = results[results["kind"] == "exact"]
    assert set(exact["objective"]) == {"grpo", "nsr_dapo"}
    assert (exact["seed"] == -1).all() and len(exact) == 2 * 2 * 6
    # steps are 1-based; step 1 is sampled by the initial policy: sampled and exact agree there
    assert results["step"].min() == 1 and results["step"].max() == 6
    first = results[results["step"] == 1].groupby(["setting", "kind"])["expected_reward"]
    assert len(first.max()) == 4 and (first.max() - first.min()).max() < 1e-6
    assert set(scores["objective"]) == set(SMALL["objectives"]) and len(scores) == 6
    assert scores["final_reward"].between(0, 1).all()

    # resume: finished parts are not recomputed
    parts = sorted((out / "parts").glob("*.parquet"))
    assert len(parts) == 6 + 4  # sampled per (setting, objective), exact where a closed form
    stamps = {p: p.stat().st_mtime_ns for p in parts}
    run_compare(CompareConfig(**SMALL), out, workers=1, progress=False, figures=False)
    assert all(p.stat().st_mtime_ns == stamps[p] for p in parts)


def test_a_comparison_is_a_grid_planned_and_stored_as_any_sweep():
    """The sweep engine's plan of a comparison: a part per (run, flow), in plan order, named as a
    sweep's (run id, flow, hash); per setting the exact flows in one job, then the sampled runs in
    two near-equal jobs (one per run with rules_per_job=1); only the parts asked for are
    planned."""
    plan = compare_plan(CompareConfig(**SMALL))
    assert plan.rules_per_job is None and plan.seeds == [0] and not plan.describe
    parts = plan.parts()
    assert all(name == specs[0].part_of(stem(name)) for name, specs in parts)  # name, then hash
    assert all(stem(name).startswith(run_id(specs[0])) for name, specs in parts)
    assert [stem(name) for name, _ in parts[:5]] == [
        "easy__grpo__seed0__sampled",
        "easy__grpo__seed0__exact",
        "easy__nsr_dapo__seed0__sampled",
        "easy__nsr_dapo__seed0__exact",
        "easy__clip_cov__seed0__sampled",  # no exact flow: no closed form
    ]
    assert len(parts) == 10 and all(len(specs) == 1 for _, specs in parts)
    jobs = [(job.key, tuple(map(stem, job.parts))) for job in plan.jobs(parts)]
    assert jobs[:3] == [
        ("easy/exact", ("easy__grpo__seed0__exact", "easy__nsr_dapo__seed0__exact")),
        ("easy/sampled", ("easy__grpo__seed0__sampled", "easy__nsr_dapo__seed0__sampled")),
        ("easy__clip_cov__seed0", ("easy__clip_cov__seed0__sampled",)),  # one run: its id
    ]
    assert [key for key, _ in jobs[3:]] == [
        "mixed/exact",
        "mixed/sampled",
        "mixed__clip_cov__seed0",
    ]
    alone = compare_plan(CompareConfig(**SMALL), rules_per_job=1).jobs(parts)
    assert [len(job.parts) for job in alone] == [2, 1, 1, 1] * 2
    todo = [part for part in parts if stem(part[0]) != "easy__grpo__seed0__exact"]
    assert tuple(map(stem, plan.jobs(todo)[0].parts)) == ("easy__nsr_dapo__seed0__exact",)
    with pytest.raises(ValueError, match="rules_per_job must be an integer >= 1"):
        compare_plan(CompareConfig(**SMALL), rules_per_job=0)


def test_compare_cli_prints_the_table(tmp_path, capsys):
    argv = [
        "compare",
        "--out",
        str(tmp_path),
        "--name",
        "cli",
        "--objectives",
        "dapo",
        "gspo",
        "--settings",
        "needle",
        "--seeds",
        "3",
        "--steps",
        "4",
        "--workers",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[needle]" in out and "dapo" in out and "gspo" in out and "final reward" in out
    assert (tmp_path / "cli" / "results.parquet").exists()


def test_compare_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown setting 'hard'"):
        CompareConfig(settings=["hard"])
    with pytest.raises(ValueError, match="unknown objective 'ppo'"):
        CompareConfig(objectives=["ppo"])


def test_mean_ci_matches_student_t():
    # values 1, 2, 3: mean 2, sd 1, t_{0.975, 2} = 4.302653 -> half-width 4.302653 / sqrt(3)
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0) and half == pytest.approx(4.302653 / 3**0.5, rel=1e-6)


def test_reasoning_suite_runs_end_to_end(tmp_path):
    config = CompareConfig(
        suite="reasoning", objectives=["dapo", "gspo"], settings=["bits-parity-2"], seeds=2, steps=2
    )
    assert config.lr == 1e-3 and config.optimizer == "adam"  # the suite's defaults
    results, scores = run_compare(config, tmp_path / "r", workers=1, progress=False)
    assert set(results["kind"]) == {"sampled"} and set(results["suite"]) == {"reasoning"}
    assert len(results) == 2 * 2 * 2 and set(scores["objective"]) == {"dapo", "gspo"}
    assert (tmp_path / "r" / "final_scores.png").exists()
    # stored as any sweep: its record, the run columns, the variants' table in the summary
    assert (tmp_path / "r" / "plan.json").exists() and set(RUN_COLUMNS) <= set(results.columns)
    assert set(scores["base_objective"]) == {"dapo", "gspo"}
    with pytest.raises(ValueError, match="unknown setting 'easy'"):
        CompareConfig(suite="reasoning", settings=["easy"])


def stem(name: str) -> str:
    """A part's readable name: its file name less the hash of its spec and the suffix."""
    return name.rsplit("__", 1)[0]


TINY = dict(
    objectives=["dapo"], settings=["needle"], seeds=2, steps=3, prompts_per_step=2, minibatches=2
)


@pytest.mark.parametrize(
    "change",
    [{"steps": 2}, {"lr": 0.1}, {"seeds": 3}, {"optimizer": "adam"}, {"seed": 1}, {"epochs": 1}],
)
def test_compare_never_mixes_parts_made_with_other_settings(tmp_path, change):
    """Other settings name other parts: computed beside the old ones, the tables (and
    ``plan.json``) this command's alone; the old settings again reuse their parts."""
    out = tmp_path / "r"
    first, _ = run_compare(CompareConfig(**TINY), out, workers=1, progress=False, figures=False)
    old = {p.name for p in (out / "parts").glob("*.parquet")}
    key = next(iter(change))
    again, _ = run_compare(
        CompareConfig(**{**TINY, **change}), out, workers=1, progress=False, figures=False
    )
    recorded = json.loads((out / "plan.json").read_text())
    assert (recorded["seed"] if key == "seed" else recorded["shared"][key]) == (
        [change[key]] if key == "seed" else change[key]
    )
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), again)
    if key == "steps":
        assert again["step"].max() == 2
    if key == "seeds":
        assert set(again.loc[again["kind"] == "sampled", "seed"]) == {0, 1, 2}
    new = {p.name for p in (out / "parts").glob("*.parquet")} - old
    assert len(old) == len(new) == 2  # the sampled run and the exact flow, of each settings
    stamps = {n: (out / "parts" / n).stat().st_mtime_ns for n in old}
    back, _ = run_compare(CompareConfig(**TINY), out, workers=1, progress=False, figures=False)
    pd.testing.assert_frame_equal(back, first)
    assert all((out / "parts" / n).stat().st_mtime_ns == t for n, t in stamps.items())


def test_prune_deletes_the_parts_of_other_settings_and_records_it(tmp_path):
    """``--prune``: after a run of other settings, the folder holds only the parts that run
    reads, its tables are unchanged by the deletion, and provenance's runs less pruned account
    for the parts on disk; the old settings then compute their parts again."""
    out = tmp_path / "r"
    run_compare(CompareConfig(**TINY), out, workers=1, progress=False, figures=False)
    old = {p.name for p in (out / "parts").glob("*.parquet")}
    other = CompareConfig(**{**TINY, "steps": 2})
    kept, _ = run_compare(other, out, workers=1, progress=False, figures=False, prune=True)
    left = {p.name for p in (out / "parts").glob("*.parquet")}
    assert len(left) == 2 and not left & old
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), kept)
    record = json.loads((out / "provenance.json").read_text())
    assert [entry["parts"] for entry in record["pruned"]] == [2]
    assert sum(r["parts"] for r in record["runs"]) - 2 == len(left)
    again, _ = run_compare(other, out, workers=1, progress=False, figures=False, prune=True)
    pd.testing.assert_frame_equal(again, kept)  # nothing else to prune: no new entry
    assert len(json.loads((out / "provenance.json").read_text())["pruned"]) == 1


def test_compare_cli_reports_only_its_own_runs_and_refuses_bad_flags(tmp_path, capsys):
    base = [
        "compare",
        "--out",
        str(tmp_path),
        "--name",
        "r",
        "--objectives",
        "dapo",
        "--settings",
        "needle",
        "--seeds",
        "2",
        "--prompts-per-step",
        "2",
        "--minibatches",
        "2",
        "--workers",
        "1",
        "--no-progress",
    ]
    assert main([*base, "--steps", "3"]) == 0
    capsys.readouterr()
    assert main([*base, "--steps", "2"]) == 0  # other settings: its own runs, its own tables
    capsys.readouterr()
    assert pd.read_parquet(tmp_path / "r" / "results.parquet")["step"].max() == 2
    assert len(list((tmp_path / "r" / "parts").glob("*.parquet"))) == 4  # both settings' parts
    assert main([*base, "--steps", "2", "--prune"]) == 0  # the first settings' parts go
    assert "pruned 2 parts" in capsys.readouterr().err
    assert len(list((tmp_path / "r" / "parts").glob("*.parquet"))) == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exit_info:
            main([*base[:-3], "--workers", bad])
        assert exit_info.value.code == 2
        assert "--workers: must be an integer >= 1" in capsys.readouterr().err
    for name in ("../../x", "..", "a/b"):
        assert main([*base[:3], "--name", name, *base[5:], "--steps", "3"]) == 2
        assert "name: use letters, digits and _.=- only" in capsys.readouterr().err
    assert not (tmp_path.parent / "x").exists()


def test_duplicate_objectives_run_once_and_the_banner_counts_them_once(tmp_path, capsys):
    argv = [
        "compare",
        "--out",
        str(tmp_path),
        "--name",
        "d",
        "--objectives",
        "dapo",
        "dapo",
        "gspo",
        "--settings",
        "needle",
        "needle",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--minibatches",
        "2",
        "--workers",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    assert "2 objectives x 1 settings" in capsys.readouterr().out
    results = load_results(tmp_path / "d")
    assert sorted(results["objective"].unique()) == ["dapo", "gspo"]
    assert not results.duplicated(["setting", "objective", "kind", "seed", "step"]).any()


def test_objective_params_reach_the_runs_and_label_them(tmp_path, capsys):
    assert parse_objective_params(["eps_high=0.3", "nsr:noise=band", "nsr:sigma=5e-2"]) == {
        "*": {"eps_high": 0.3},
        "nsr": {"noise": "band", "sigma": 0.05},
    }
    config = CompareConfig(
        **{**TINY, "objectives": ["dapo", "gspo"]}, objective_params={"dapo": {"eps_high": 0.3}}
    )
    labels = [run_spec(config, "needle", rule).label for rule in ("dapo", "gspo")]
    assert labels == ["dapo[eps_high=0.3]", "gspo"]
    results, scores = run_compare(config, tmp_path / "p", workers=1, progress=False, figures=False)
    assert set(scores["objective"]) == {"dapo[eps_high=0.3]", "gspo"}
    exact = results[(results["kind"] == "exact") & (results["objective"] == "dapo[eps_high=0.3]")]
    expected = exact_flow(
        get_objective("dapo", eps_high=0.3),
        "needle",
        steps=3,
        lr=1.0,
        advantage="grpo",
        group_size=8,
        epochs=4,
    )
    np.testing.assert_array_equal(exact["expected_reward"], expected["expected_reward"])
    np.testing.assert_array_equal(exact["step"], expected["step"] + 1)
    with pytest.raises(ValueError, match="objective_params: dapo with"):
        CompareConfig(**TINY, objective_params={"*": {"sigma": 0.1}})
    with pytest.raises(
        ValueError, match=r"objective_params: unknown compared objective\(s\) \['nsr'\]"
    ):
        CompareConfig(**TINY, objective_params={"nsr": {"sigma": 0.1}})
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_objective_params(["dapo:eps_high"])
    argv = [
        "compare",
        "--out",
        str(tmp_path),
        "--name",
        "c",
        "--objectives",
        "dapo",
        "--settings",
        "needle",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--minibatches",
        "2",
        "--workers",
        "1",
        "--no-progress",
        "--objective-params",
        "dapo:eps_high=0.3",
    ]
    assert main(argv) == 0
    assert "dapo[eps_high=0.3]" in capsys.readouterr().out


def test_exact_flows_of_a_comparison_equal_each_rule_alone(tmp_path):
    config = CompareConfig(
        objectives=["grpo", "gspo", "sapo", "clip_cov"],
        settings=["mixed"],
        seeds=2,
        steps=4,
        prompts_per_step=2,
        minibatches=2,
    )
    results, _ = run_compare(config, tmp_path / "e", workers=1, progress=False, figures=False)
    for name in ("grpo", "gspo", "sapo"):
        alone = exact_flow(
            get_objective(name), "mixed", steps=4, lr=1.0, advantage="grpo", group_size=8, epochs=4
        )
        mine = results[(results["kind"] == "exact") & (results["objective"] == name)]
        for column in ("expected_reward", "entropy", "grad_norm", "clip_high_frac"):
            np.testing.assert_array_equal(mine[column].to_numpy(), alone[column].to_numpy())


@pytest.mark.parametrize(
    ("suite", "setting"), [("bandit", "needle"), ("reasoning", "bits-parity-2")]
)
def test_gmpo_and_vespo_run_in_both_suites(tmp_path, suite, setting):
    """The sequence-level peer rules (GMPO, VESPO) end to end: sampled runs on either suite, and on
    the bandit the exact flow too (both have a closed form on one-token sequences)."""
    config = CompareConfig(
        suite=suite,
        objectives=["gmpo", "vespo"],
        settings=[setting],
        seeds=2,
        steps=2,
        prompts_per_step=2,
    )
    results, scores = run_compare(
        config, tmp_path / suite, workers=1, progress=False, figures=False
    )
    sampled = results[results["kind"] == "sampled"]
    assert len(sampled) == 2 * 2 * 2 and set(scores["objective"]) == {"gmpo", "vespo"}
    assert np.isfinite(sampled["expected_reward"]).all()
    exact = set(results.loc[results["kind"] == "exact", "objective"])
    assert exact == ({"gmpo", "vespo"} if suite == "bandit" else set())
