"""The regime rule (sandbox.study.regimes): headroom, the answer baselines, power, the cap."""

from pathlib import Path

import pandas as pd
import pytest

from sandbox.study import regimes
from sandbox.study.evidence import seeds_needed

ROOT = Path(__file__).resolve().parents[1]


def _found(comparator=0.5, ceiling=1.0, floor=0.2, reference=0.6, sd=0.05, metric="final_pass"):
    ledger = pd.DataFrame(
        {
            "claim": ["a_beats_b", "c_keeps_entropy"],
            "rung": ["tiny_tf", "tiny_tf"],
            "metric": [metric, "final_entropy"],
            "comparator_mean": [comparator, float("nan")],
            "diff_sd": [sd, 0.1],
        }
    )
    bounds = pd.DataFrame({"rung": ["tiny_tf"], "ceiling": [ceiling], "floor": [floor]})
    summary = pd.DataFrame({"rung": ["tiny_tf"], "rule": ["dapo"], "final_pass": [reference]})
    tables = {"ledger": ledger, "bounds": bounds.set_index("rung"), "summary": summary}
    return {**tables, "problems": 512.0}


def test_assess_applies_headroom_baselines_and_bonferroni_power():
    rows = regimes.assess("tiny_tf", _found()).set_index("claim")
    assert bool(rows.loc["a_beats_b", "headroom"])  # 1.0 - 0.5 >= 2 x 0.02
    assert bool(rows.loc["c_keeps_entropy", "headroom"])  # entropy has no ceiling
    assert rows["beats_baselines"].all()  # 0.6 >= 0.2 + 5 x 0.02
    # two primary claims on the rung: each at alpha 0.05 / 2
    assert rows.loc["a_beats_b", "seeds_needed"] == seeds_needed(0.05, 0.02, alpha=0.025)
    assert rows.loc["c_keeps_entropy", "seeds_needed"] == seeds_needed(0.1, 0.05, alpha=0.025)


@pytest.mark.parametrize(
    ("comparator", "room"), [(0.96, True), (0.961, False), (0.99, False), (0.2, True)]
)
def test_headroom_is_two_margins_below_the_ceiling(comparator, room):
    rows = regimes.assess("tiny_tf", _found(comparator=comparator)).set_index("claim")
    assert bool(rows.loc["a_beats_b", "headroom"]) is room


@pytest.mark.parametrize(("reference", "beats"), [(0.30, True), (0.299, False), (0.21, False)])
def test_the_reference_must_clear_the_baseline_by_five_margins(reference, beats):
    rows = regimes.assess("tiny_tf", _found(reference=reference, floor=0.2))
    assert bool(rows["beats_baselines"].all()) is beats


def _pilots(rows):
    return pd.DataFrame(
        [
            {
                "rung": "bandit_sampled",
                "candidate": c,
                "metric": "final_pass",
                "headroom": h,
                "floor": 0.0,
                "beats_baselines": True,
                "diff_sd": sd,
                "seeds_needed": seeds_needed(sd, 0.02, alpha=0.05),
                "steps": s,
                "study_seconds_per_seed": sec,
                "problems": float("nan"),  # a bandit: no task
                "exact": False,
            }
            for c, h, sd, s, sec in rows
        ]
    )


def test_choose_takes_the_most_power_within_the_cap_among_those_passing():
    cap = regimes.CAP_SECONDS
    pilots = _pilots(
        [
            ("cheap", True, 0.20, 40, cap / 100),  # needs ~790 seeds, gets 100
            ("dear", True, 0.15, 80, cap / 30),  # less noisy, but only 30 seeds fit
            ("ceiling", False, 0.01, 60, 1.0),  # the most power, but no headroom
        ]
    )
    table = regimes.candidates(pilots).set_index("candidate")
    assert (table.loc["cheap", "seeds"], table.loc["dear", "seeds"]) == (100, 30)
    assert table.loc["cheap", "power"] == pytest.approx(
        regimes.mean_power(pilots[pilots.candidate == "cheap"], 100)
    )
    choice = regimes.choose(pilots).iloc[0]
    assert choice["candidate"] == "cheap" and choice["seeds"] == 100
    assert "2 of 3 candidates keep headroom" in choice["why"]
    assert f"capped by {cap} s" in choice["why"]


def test_choose_breaks_power_ties_by_fewer_seeds_then_the_longer_horizon():
    pilots = _pilots([("short", True, 0.001, 15, 1.0), ("long", True, 0.001, 30, 1.0)])
    assert regimes.choose(pilots).iloc[0]["candidate"] == "long"  # same seeds, same power


def test_choose_says_when_no_candidate_passes():
    choice = regimes.choose(_pilots([("a", False, 0.1, 15, 1.0)])).iloc[0]
    assert choice["candidate"] is None and choice["why"] == "no candidate passes the rule"


def test_the_committed_pilot_gives_the_committed_choice_and_the_revision_note_is_true():
    """results/regimes: the rule picks 4-digit reversal from its warm start at 26 seeds, the
    exact flow's 5 steps and the bandit's mixed setting at 15; the 4- and 8-problem bits tasks
    fail the 256-problem floor. On the three candidates the rule was revised on, the first rule
    (fewest seeds needed) would have picked the 80-step task, capped at 39 (the page says so)."""
    pilots = pd.read_csv(ROOT / "results" / "regimes" / "pilot.csv")
    choice = regimes.choose(pilots).set_index("rung")
    committed = pd.read_csv(ROOT / "results" / "regimes" / "choice.csv").set_index("rung")
    assert choice["candidate"].to_dict() == committed["candidate"].to_dict()
    assert choice.loc["tiny_tf", "candidate"].startswith("task=sequence,alphabet=digits,length=4")
    assert choice.loc["tiny_tf", "seeds"] == 26
    assert choice.loc["bandit_exact", "candidate"] == "exact_steps=5"
    table = regimes.candidates(pilots).set_index("candidate")
    small = [c for c in table.index if c.startswith("task=bits,length=") and "split" not in c]
    assert len(small) == 3 and not table.loc[small, "ok"].any()
    assert (pilots.set_index("candidate").loc[small, "problems"] < regimes.MIN_PROBLEMS).all()
    tf = table.loc[small].reset_index()
    first_rule = tf.sort_values(["needed", "steps"], ascending=[True, False]).iloc[0]
    assert first_rule["candidate"] == "task=bits,length=3,op=reverse,steps=80"
    assert first_rule["seeds"] == 39 and tf["needed"].min() > 1000


def test_tables_only_rebuilds_the_committed_candidates_and_choice_from_the_pilot(tmp_path, capsys):
    """--tables-only runs no pilot: candidates.csv and choice.csv come from pilot.csv, the
    committed bytes (no pilots/ folder in the copy: nothing could have run)."""
    out = tmp_path / "regimes"
    out.mkdir()
    for name in ("pilot.csv", "candidates.csv", "choice.csv", "provenance.json"):
        (out / name).write_bytes((ROOT / "results" / "regimes" / name).read_bytes())
    assert regimes.main(["--tables-only", "--out", str(out)]) == 0
    for name in ("candidates.csv", "choice.csv", "provenance.json"):  # nothing to rewrite
        assert (out / name).read_bytes() == (ROOT / "results" / "regimes" / name).read_bytes()
    assert "setting=mixed,steps=15" in capsys.readouterr().out
    # the five candidates whose power scipy's NaN far tail took to 0.53-0.83 (issue 38 item 6)
    power = pd.read_csv(out / "candidates.csv").set_index("candidate")["power"]
    large = ["gaussian,steps=15", "gaussian,steps=30", "needle,steps=15", "needle,steps=30"]
    large += ["needle,steps=60"]
    assert power[[f"setting={c}" for c in large]].min() > 0.86
    (out / "pilot.csv").unlink()
    with pytest.raises(SystemExit) as stop:
        regimes.main(["--tables-only", "--out", str(out)])
    assert stop.value.code == 2 and "no pilot.csv in" in capsys.readouterr().err


def test_labels_name_the_settings():
    assert regimes.label({"setting": "mixed", "steps": 30}) == "setting=mixed,steps=30"
    got = regimes.label({"task": "bits", "knobs": {"op": "reverse", "length": 2}})
    assert got == "task=bits,length=2,op=reverse"
    warm = regimes.label({"task": "bits", "steps": 40, "warm_start": {"steps": 400}})
    assert warm == "task=bits,steps=40,warm_start.steps=400"  # a nested key keeps its owner


def test_the_llm_task_rule_picks_the_committed_llm_task():
    """results/llm_pilot/pilot.csv: among the tasks with a group signal >= 0.2, the lowest target
    is two chained + / - mod 7, the llm rung's default task."""
    llm_claims = pytest.importorskip("llm.claims")
    pilot = pd.read_csv(ROOT / "results" / "llm_pilot" / "pilot.csv")
    chosen = regimes.llm_task_choice(pilot)
    assert (chosen["task"], chosen["knobs"]) == ("mod_arith", "ops=['+', '-'],steps=2")
    settings = llm_claims.LlmSettings()
    assert (settings.task, settings.task_knobs) == ("mod_arith", {"steps": 2, "ops": ["+", "-"]})
    with pytest.raises(ValueError, match="group signal"):
        regimes.llm_task_choice(pilot.assign(group_signal=0.0))


def test_warm_started_candidates_resolve_to_a_warm_start_file_their_rung_accepts(tmp_path):
    """A candidate's ``warm_start`` becomes the ``init`` file its tiny_tf settings name (made
    once in the cache); every warm-started candidate splits train from test, and its task has
    at least 256 test problems."""
    import numpy as np

    from envs.reasoning import make_task, problem_split
    from sandbox.study.regimes import CANDIDATES, resolved
    from sandbox.study.rungs import TfSettings

    warm = [c for c in CANDIDATES["tiny_tf"] if "warm_start" in c]
    assert len(warm) >= 3 and all(c["split"] for c in warm)
    for c in warm:
        task = make_task(c["task"], **c["knobs"])
        drawn, _ = task.sample_batch(np.random.default_rng(0), 4000, split="test")
        assert len(set(drawn)) >= 256 and {problem_split(p) for p in drawn} == {"test"}
    small = {**warm[0], "knobs": {"op": "reverse", "length": 4}, "warm_start": {"steps": 2}}
    small["warm_start"].update(eval_every=1, eval_prompts=4, batch=4)
    settings = resolved(small, tmp_path)
    assert "warm_start" not in settings and settings["init"].startswith(str(tmp_path))
    TfSettings(**settings).check()  # the file fits the candidate's task and the rung's model
    assert resolved(small, tmp_path) == settings  # found again, not remade


def _exact_pilots(rows):
    """A deterministic rung's pilot rows (diff_sd NaN: one seed, exact differences)."""
    table = _pilots([(c, h, 0.1, s, 0.5) for c, h, s in rows])
    return table.assign(rung="bandit_exact", diff_sd=float("nan"), seeds_needed=1, exact=True)


def test_an_exact_rung_takes_the_longest_horizon_that_keeps_headroom():
    """bandit_exact (issue 38 item 5): a difference without sampling noise has power 1 at its one
    seed, so the rule's tie-break (the longer horizon) decides among the candidates with room."""
    pilots = _exact_pilots([("s2", True, 2), ("s5", True, 5), ("s8", False, 8)])
    table = regimes.candidates(pilots).set_index("candidate")
    assert table["power"].eq(1.0).all() and table["seeds"].eq(1).all()
    choice = regimes.choose(pilots).iloc[0]
    assert choice["candidate"] == "s5" and choice["seeds"] == 1
    assert "2 of 3 candidates keep headroom" in choice["why"] and "longest horizon" in choice["why"]


def test_a_candidate_with_too_few_held_out_problems_fails_the_rule():
    """Rule 2 (issue 38 item 1): a replicate's held-out set holds >= MIN_PROBLEMS distinct
    problems; a 4-problem task scores how many of its 4 a run learned."""
    pilots = _pilots([("few", True, 0.01, 40, 1.0), ("many", True, 0.2, 40, 1.0)])
    pilots = pilots.assign(rung="tiny_tf", floor=0.1, problems=[3.0, 330.0])
    table = regimes.candidates(pilots).set_index("candidate")
    assert not table.loc["few", "ok"] and table.loc["many", "ok"]
    choice = regimes.choose(pilots).iloc[0]
    assert choice["candidate"] == "many"
    assert f"with at least {regimes.MIN_PROBLEMS} held-out problems" in choice["why"]


def test_held_out_size_counts_a_replicates_distinct_problems():
    from sandbox.study.rungs import BanditSettings, TfSettings

    cold = {"seeds": 2, "task": "bits", "split": False, "init": None}
    two_bits = TfSettings(**cold, knobs={"op": "reverse", "length": 2})  # 4 problems in all
    assert regimes.held_out_size(two_bits) <= 4
    ten_bits = TfSettings(**{**cold, "split": True}, knobs={"op": "reverse", "length": 10})
    assert regimes.held_out_size(ten_bits) >= regimes.MIN_PROBLEMS
    assert pd.isna(regimes.held_out_size(BanditSettings()))


def test_the_exact_flow_has_its_own_horizon():
    """bandit_exact reads the bandit section's exact_steps, bandit_sampled its steps."""
    from sandbox.study.rungs import RUNGS, StudyConfig

    config = StudyConfig(sections={"bandit": {"steps": 15, "exact_steps": 3}})
    assert RUNGS["bandit_exact"].steps(config) == 3
    assert RUNGS["bandit_sampled"].steps(config) == 15
    with pytest.raises(ValueError, match="bandit_exact_steps"):
        StudyConfig(sections={"bandit": {"exact_steps": 0}})
