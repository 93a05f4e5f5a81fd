"""The claims study's step-size control (issue 38, item 4): each rule of a sampled toy rung at
its own step size, chosen by a rule fixed before its runs on seeds disjoint from the study's.

- the choice: per rung and rule, the step size with the highest mean ``final_pass`` over the
  tuning seeds, the smaller at a tie (worked out by hand on rows made up for it);
- which rungs it covers (sampled toy rungs only, and only with ``control_seeds`` > 0) and that
  its tuning seeds never meet the study's;
- a quick study with the control writes ``step_size_choice.csv`` and ``ledger_control.csv`` (each
  rule's control runs at its chosen step size, the calibrated verdict beside each row), rebuilds
  them byte for byte from its parts, and its page prints them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import llm.claims
from sandbox.study import StudyConfig
from sandbox.study.analysis import step_size_choice
from sandbox.study.plan import TUNE_SEED, controlled_rungs, job_spec, tune_jobs
from sandbox.study.tables import write_doc


def _tune_rows(passes: dict[tuple[str, float], list[float]]) -> pd.DataFrame:
    """Tuning rows of rung ``r``: per (rule, step size) one run per seed whose last step's pass
    rate is the given value."""
    rows = []
    for (rule, lr), values in passes.items():
        for seed, value in enumerate(values):
            for step in (1, 2):
                rows.append(
                    {"phase": "tune", "rung": "bandit_sampled", "rule": rule, "lr": lr}
                    | {"epochs": 2, "seed": TUNE_SEED + seed, "step": step}
                    | {"pass_rate": value if step == 2 else 0.0, "train_reward": 0.5}
                    | {"entropy": 1.0, "clip_low_frac": 0.0, "clip_high_frac": 0.0}
                    | {"eval_pass": np.nan}
                )
    frame = pd.DataFrame(rows)
    for column in ("rescue_frac", "grad_mass_zero_lo", "grad_mass_zero_hi", "grad_mass_rescued"):
        frame[column] = np.nan
    return frame


def test_the_choice_is_the_highest_mean_final_pass_and_the_smaller_step_at_a_tie():
    rows = _tune_rows(
        {
            ("dapo", 1.0): [0.5, 0.7],  # mean 0.6
            ("dapo", 2.0): [0.6, 0.8],  # mean 0.7: chosen
            ("dapo", 4.0): [0.9, 0.3],  # mean 0.6
            ("nsr_dapo", 1.0): [0.4, 0.6],  # mean 0.5: chosen (a tie, the smaller step)
            ("nsr_dapo", 2.0): [0.5, 0.5],  # mean 0.5
        }
    )
    table = step_size_choice(rows)
    assert table[["rule", "lr", "seeds"]].values.tolist() == [
        ["dapo", 1.0, 2],
        ["dapo", 2.0, 2],
        ["dapo", 4.0, 2],
        ["nsr_dapo", 1.0, 2],
        ["nsr_dapo", 2.0, 2],
    ]
    np.testing.assert_allclose(table["final_pass"], [0.6, 0.7, 0.6, 0.5, 0.5])
    chosen = table[table["chosen"]]
    assert chosen[["rule", "lr"]].values.tolist() == [["dapo", 2.0], ["nsr_dapo", 1.0]]


def test_the_control_covers_the_sampled_toy_rungs_on_seeds_the_study_never_uses():
    rungs = ["bandit_exact", "bandit_sampled", "tiny_tf", "llm"]
    assert controlled_rungs(StudyConfig(rungs=rungs)) == []  # off by default
    config = StudyConfig(rungs=rungs, control_seeds=4)
    assert controlled_rungs(config) == ["bandit_sampled", "tiny_tf"]
    point = {"bandit_sampled": (2.0, 2), "tiny_tf": (3e-4, 8)}
    jobs = tune_jobs(config, point)
    grid = {r: config.section(s).lrs for r, s in (("bandit_sampled", "bandit"), ("tiny_tf", "tf"))}
    assert len(jobs) == sum(len(g) for g in grid.values()) * len(config.rules)
    for job in jobs:
        spec = job_spec(config, job)
        assert spec.seed == TUNE_SEED and spec.seeds == 4 and spec.epochs == point[job.rung][1]
        assert config.seeds(job.rung) < TUNE_SEED  # replicates TUNE_SEED + s: never a study seed
    with pytest.raises(ValueError, match="control_seeds must be an integer >= 0"):
        StudyConfig(control_seeds=-1).validate()


def test_a_study_with_the_control_reads_the_claims_at_each_rules_own_step_size(
    tmp_path, in_process
):
    out, doc = tmp_path / "study", tmp_path / "claims.md"
    argv = ["--quick", "--rungs", "bandit_sampled", "--control-seeds", "2", "--no-progress"]
    proc = in_process(llm.claims.main, *argv, "--workers", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    choice = pd.read_csv(out / "step_size_choice.csv")
    chosen = choice[choice["chosen"]].set_index("rule")["lr"]
    rules = ["dapo", "nsr_dapo", "grpo", "gspo"]
    assert (
        sorted(chosen.index) == sorted(rules)
        and (choice.groupby("rule")["chosen"].sum() == 1).all()
    )
    rows = pd.read_parquet(out / "results.parquet")
    control = rows[rows["phase"] == "control"]
    assert control.groupby("rule")["lr"].first().to_dict() == chosen.to_dict()
    study = rows[rows["phase"] == "study"]
    assert set(control["seed"]) == set(study["seed"])  # the study's paired seeds
    assert set(rows.loc[rows["phase"] == "tune", "seed"]).isdisjoint(study["seed"])
    ledger, control_ledger = (pd.read_csv(out / f"{n}.csv") for n in ("ledger", "ledger_control"))
    assert control_ledger["claim"].tolist() == ledger["claim"].tolist()
    assert control_ledger["verdict_calibrated"].tolist() == ledger["verdict"].tolist()
    assert (control_ledger["same"] == (control_ledger["verdict"] == ledger["verdict"])).all()
    before = {n: (out / n).read_bytes() for n in ("step_size_choice.csv", "ledger_control.csv")}
    again = in_process(llm.claims.main, "--tables-only", "--out", str(out), "--doc", str(doc))
    assert again.returncode == 0, again.stderr[-3000:]
    assert {n: (out / n).read_bytes() for n in before} == before
    write_doc(out, doc)
    page = doc.read_text().split("## Step-size control")[1].split("\n## ")[0]
    assert "| bandit_sampled | nsr_dapo |" in page and "| verdict_calibrated | same |" in page
    # the same study without the control (its parts reused): no control table of the earlier
    # command is left in the folder as if this study had made it
    off = in_process(llm.claims.main, *argv[:-3], "--control-seeds", "0", "--no-progress",
                     "--workers", "1", "--out", str(out))  # fmt: skip
    assert off.returncode == 0, off.stderr[-3000:]
    assert not {n for n in before if (out / n).exists()}
    write_doc(out, doc)
    assert "(no `ledger_control.csv` in this folder)" in doc.read_text()


def test_the_units_left_are_an_upper_bound_until_the_tuning_has_chosen(tmp_path, in_process):
    """A time budget's count of units left: exact once the tuning runs are parts (a rule whose
    own step size is the calibrated one has no control run), and said to be at most that many
    before (one control run per rule is counted)."""
    from sandbox.experiments.planner import RunFolder
    from sandbox.study.plan import BudgetSpent, _units_left

    out = tmp_path / "study"
    argv = ["--quick", "--rungs", "bandit_sampled", "--control-seeds", "2", "--no-progress"]
    assert in_process(llm.claims.main, *argv, "--workers", "1", "--out", str(out)).returncode == 0
    config, _ = llm.claims.parse_args([*argv, "--out", str(out)])
    folder = RunFolder(out, config.record())
    assert _units_left(folder, config) == (0, 0, False)
    tuned = sorted((out / "parts").glob("tune__*"))
    tuned[0].unlink()
    assert _units_left(folder, config) == (0, 1 + len(config.rules), True)
    line = str(BudgetSpent(60, 5, 0, 2, 0, bound=True))
    assert line == "time budget of 60 s spent: 2 units run, at most 5 left (all in the study)"
