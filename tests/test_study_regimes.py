"""The regime rule (sandbox.study.regimes): headroom, the answer baselines, power, the cap."""

import math

import pandas as pd
import pytest

from sandbox.study import regimes
from sandbox.study.evidence import seeds_needed


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
    return {"ledger": ledger, "bounds": bounds.set_index("rung"), "summary": summary}


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
                "headroom": h,
                "beats_baselines": True,
                "seeds_needed": n,
                "steps": s,
                "study_seconds_per_seed": sec,
            }
            for c, h, n, s, sec in rows
        ]
    )


def test_choose_takes_the_fewest_seeds_among_those_passing_and_the_longer_on_ties():
    pilots = _pilots(
        [
            ("x15", True, 40, 15, 1.0),
            ("x15", True, 12, 15, 1.0),  # the candidate needs its claims' largest: 40
            ("x30", True, 40, 30, 1.0),  # tie at 40: the longer horizon
            ("x60", False, 3, 60, 1.0),  # fewest, but no headroom
        ]
    )
    choice = regimes.choose(pilots).iloc[0]
    assert choice["candidate"] == "x30" and choice["seeds"] == 40
    assert "2 of 3 candidates keep headroom" in choice["why"]


def test_choose_caps_the_seeds_by_the_time_budget_and_says_so():
    pilots = _pilots([("slow", True, 500, 40, regimes.CAP_SECONDS / 100)])
    choice = regimes.choose(pilots).iloc[0]
    assert choice["seeds"] == 100
    assert f"capped at 100 by {regimes.CAP_SECONDS} s" in choice["why"]


def test_choose_says_when_no_candidate_passes():
    choice = regimes.choose(_pilots([("a", False, 5, 15, 1.0)])).iloc[0]
    assert choice["candidate"] is None and choice["why"] == "no candidate passes the rule"
    assert math.isnan(choice.get("seeds", float("nan")))


def test_labels_name_the_settings():
    assert regimes.label({"setting": "mixed", "steps": 30}) == "setting=mixed,steps=30"
    got = regimes.label({"task": "bits", "knobs": {"op": "reverse", "length": 2}})
    assert got == "task=bits,length=2,op=reverse"
