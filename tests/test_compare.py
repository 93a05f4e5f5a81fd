"""The default comparison, end to end in a small setting."""

import pandas as pd
import pytest

from sandbox.cli import main
from sandbox.experiments import CompareConfig, load_results, run_compare
from sandbox.experiments.plots import mean_ci

SMALL = dict(
    objectives=["grpo", "nsr_dapo", "clip_cov"], settings=["easy", "mixed"], seeds=4, steps=6,
    prompts_per_batch=2, minibatches=2,
)  # fmt: skip


def test_compare_writes_results_summary_figures_and_resumes(tmp_path):
    out = tmp_path / "small"
    results, scores = run_compare(CompareConfig(**SMALL), out, workers=1, progress=False)
    assert (out / "results.parquet").exists() and (out / "summary.csv").exists()
    for name in ("reward_vs_step", "entropy_vs_step", "clip_fractions", "exact_vs_sampled",
                 "final_scores"):  # fmt: skip
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
    # step 0 is the initial policy: sampled and exact agree exactly there
    first = results[results["step"] == 0].groupby(["setting", "kind"])["expected_reward"]
    assert (first.max() - first.min()).max() < 1e-6
    assert set(scores["objective"]) == set(SMALL["objectives"]) and len(scores) == 6
    assert scores["final_reward"].between(0, 1).all()

    # resume: finished parts are not recomputed
    parts = sorted((out / "parts").glob("*.parquet"))
    assert len(parts) == 6
    stamps = {p: p.stat().st_mtime_ns for p in parts}
    run_compare(CompareConfig(**SMALL), out, workers=1, progress=False, figures=False)
    assert all(p.stat().st_mtime_ns == stamps[p] for p in parts)


def test_compare_cli_prints_the_table(tmp_path, capsys):
    argv = ["compare", "--out", str(tmp_path), "--name", "cli", "--objectives", "dapo", "gspo",
            "--settings", "needle", "--seeds", "3", "--steps", "4", "--workers", "1",
            "--no-progress"]  # fmt: skip
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
    config = CompareConfig(suite="reasoning", objectives=["dapo", "gspo"],
                           settings=["bits-parity-2"], seeds=2, steps=2)  # fmt: skip
    assert config.lr == 1e-3 and config.optimizer == "adam"  # the suite's defaults
    results, scores = run_compare(config, tmp_path / "r", workers=1, progress=False)
    assert set(results["kind"]) == {"sampled"} and set(results["suite"]) == {"reasoning"}
    assert len(results) == 2 * 2 * 2 and set(scores["objective"]) == {"dapo", "gspo"}
    assert (tmp_path / "r" / "final_scores.png").exists()
    with pytest.raises(ValueError, match="unknown setting 'easy'"):
        CompareConfig(suite="reasoning", settings=["easy"])
