"""The study's record (sandbox.study.config, sandbox.study.settings): typed sections, an old flat
config.json migrated on read, and the settings a folder's parts depend on."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from sandbox.configs import check_number
from sandbox.experiments.results import changed_settings
from sandbox.study import StudyConfig, part_fields, read_record
from sandbox.study.claims import Claim
from sandbox.study.plan import check_time_budget
from sandbox.study.settings import BanditSettings, TfSettings

pytest.importorskip("transformers")
from llm.claims import LlmSettings

ROOT = Path(__file__).resolve().parents[1]
FLAT = ROOT / "tests/golden/flat_study_config.json"


def test_an_old_record_reads_as_the_same_settings_given_the_new_way(tmp_path):
    """A flat record (bandit_*, tf_*, a global seeds, extra: the committed claims study's of
    2026-11-25, kept as tests/golden/flat_study_config.json) reads as sections, its global seeds
    the toy sections' seeds, and its part fields equal those of the same settings given as
    sections (else the folder would be refused)."""
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_bytes(FLAT.read_bytes())
    record = json.loads(FLAT.read_text())
    assert record["seeds"] == 16 and record["extra"] == {}
    config, point = read_record(tmp_path / "g")
    assert point is None and config.rng is None
    old_bandit = BanditSettings(setting="mixed", steps=60, seeds=16)
    old_tf = TfSettings(task="mod_arith", knobs={"steps": 2}, seeds=16)
    assert config.section("bandit") == old_bandit and config.section("tf") == old_tf
    assert config.section("tf").lrs == [3e-4, 1e-3, 3e-3, 1e-2] and config.seeds("tiny_tf") == 16
    assert config.section("llm").seeds == 8  # its own seeds: the old llm rung's
    new = StudyConfig(
        rules=record["rules"],
        rungs=record["rungs"],
        rng=None,
        sections={"bandit": old_bandit, "tf": old_tf},
    )
    # the planner's check (a key the old record lacks, rng and dtype, counts as None)
    assert changed_settings(part_fields(record), new.fields_of_parts()) == []
    assert new.fields_of_parts() == config.fields_of_parts()
    assert part_fields(record)["bandit_steps"] == 60 and "seeds" not in part_fields(record)
    fewer = StudyConfig(
        rng=None,
        sections={"tf": replace(old_tf, seeds=8), "bandit": old_bandit},
    )
    assert changed_settings(part_fields(record), fewer.fields_of_parts()) == ["tf_seeds: 16 -> 8"]


def test_an_old_llm_record_keeps_its_llm_settings_and_drops_execution_ones():
    """``extra: {"llm": {...}}`` becomes the llm section; ``ensemble``, ``scratch`` and
    ``checkpoint_every`` choose how runs execute and are no part fields."""
    old = {
        **{k: v for k, v in asdict(StudyConfig()).items() if k != "sections"},
        "rungs": ["bandit_sampled", "llm"],
        "seeds": 3,
        "bandit_steps": 4,
        "extra": {"llm": {"lrs": [1e-3], "seeds": 3, "ensemble": 2, "scratch": "/tmp/x"}},
    }
    fields = part_fields(old)
    assert (fields["llm_lrs"], fields["llm_seeds"], fields["bandit_seeds"]) == ([1e-3], 3, 3)
    assert not {"llm_ensemble", "llm_scratch", "llm_checkpoint_every"} & set(fields)
    new = StudyConfig(
        rungs=["bandit_sampled", "llm"],
        sections={
            "bandit": {"steps": 4, "seeds": 3},
            "tf": {"seeds": 3},
            "llm": LlmSettings(lrs=[1e-3], seeds=3, ensemble=4),
        },
    )
    assert changed_settings(fields, new.fields_of_parts()) == []


def test_a_section_no_rung_uses_makes_no_part_and_may_join_later():
    """The tf section's settings are no part fields of a bandit-only study; a run that adds
    tiny_tf to the folder (its own tf settings) is not refused for them, while a changed bandit
    setting still is."""
    from sandbox.study.config import changed_parts

    bandit = StudyConfig(rungs=["bandit_sampled"], sections={"tf": {"steps": 7}})
    assert not any(k.startswith("tf_") for k in bandit.fields_of_parts())
    record = asdict(bandit)
    grown = StudyConfig(rungs=["bandit_sampled", "tiny_tf"], sections={"tf": {"steps": 9}})
    assert changed_parts(record, grown.fields_of_parts()) == []
    other = StudyConfig(rungs=["bandit_sampled", "tiny_tf"], sections={"bandit": {"steps": 5}})
    steps = bandit.section("bandit").steps
    assert changed_parts(record, other.fields_of_parts()) == [f"bandit_steps: {steps} -> 5"]


def test_a_new_record_holds_the_sections_and_reads_back(tmp_path):
    from sandbox.study.config import record_calibration

    config = StudyConfig(sections={"tf": TfSettings(knobs={"op": "reverse", "length": 2})})
    record_calibration(tmp_path, config, {"tiny_tf": (1e-3, 4)})
    values = json.loads((tmp_path / "config.json").read_text())
    assert values["sections"]["tf"]["knobs"] == {"op": "reverse", "length": 2}
    assert not {"seeds", "extra", "tf_knobs"} & set(values)
    again, point = read_record(tmp_path)
    assert again == config and point == {"tiny_tf": (1e-3, 4)}


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"nope": {}}, "sections: unknown section 'nope'"),
        ({"tf": {"lr": [1e-3]}}, r"tf: unknown setting\(s\) \['lr'\]"),
        ({"bandit": {"steps": 0}}, "bandit_steps must be an integer >= 1, got 0"),
        ({"tf": {"lrs": [0]}}, "tf_lrs must be finite numbers > 0"),
        ({"tf": {"epochs": [0]}}, "tf_epochs must be integers >= 1"),
        ({"llm": {"seeds": 1.5}}, "llm_seeds must be an integer >= 1, got 1.5"),
    ],
)
def test_a_bad_section_setting_is_named(sections, message):
    with pytest.raises(ValueError, match=message):
        StudyConfig(sections=sections)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: StudyConfig(target_low=True).validate(), "target_low must be a number, got True"),
        (
            lambda: StudyConfig(target_high=float("inf")).validate(),
            "target_high must be a number, got inf",
        ),
        (lambda: StudyConfig(sections={"tf": {"lrs": ["x"]}}), "tf_lrs must be finite numbers > 0"),
        (lambda: StudyConfig(sections={"tf": {"lrs": []}}), r"tf_lrs must be finite .* got \[\]"),
        (lambda: check_time_budget(float("nan")), "time_budget must be a number of seconds > 0"),
        (
            lambda: Claim("c", "grpo", "dapo", "greater", "final_pass", margin=-0.1),
            r"claim c: margin must be a number > 0, got -0\.1",
        ),
        (lambda: check_number("x", "2", text=False), "x must be a number > 0, got '2'"),
        (lambda: check_number("x", "0", text=True), "x must be a number > 0, got '0'"),
        (lambda: check_number("x", 1, above=1, what="big"), "x must be big > 1, got 1"),
    ],
)
def test_a_number_setting_out_of_range_is_named(call, message):
    """One check (``sandbox.configs.check_number``) behind every finite-number setting."""
    with pytest.raises(ValueError, match=f"^{message}"):
        call()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dtype": "float16"}, "dtype must be one of float32, float64, got 'float16'"),
        ({"minibatches": 0}, "minibatches must be an integer >= 1, got 0"),
        ({"group_size": 1}, "group_size must be an integer >= 2, got 1"),
        ({"calib_steps": -1}, "calib_steps must be an integer >= 0, got -1"),
        ({"calib_seeds": 2.0}, r"calib_seeds must be an integer >= 1, got 2\.0"),
    ],
)
def test_the_study_checks_its_fields_as_a_section_does(changes, message):
    """StudyConfig's int fields and dtype's choices go through settle's check (check_fields)."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        StudyConfig(**changes).validate()


def test_a_study_without_a_dtype_or_with_one_of_its_choices_is_valid():
    for dtype in (None, "float32", "float64"):
        StudyConfig(dtype=dtype, calib_steps=0).validate()


def test_a_number_setting_in_range_reads_as_a_float():
    assert check_number("x", "0.25", text=True) == 0.25
    assert check_number("x", -3, above=None) == -3.0
    assert StudyConfig(sections={"tf": {"lrs": ["1e-3", 2]}}).sections["tf"].lrs == [1e-3, 2.0]


def test_the_committed_folders_tables_rebuild_from_their_old_records(tmp_path):
    """--tables-only on a copy of results/claims_exact_mu (an old flat record) gives the same
    ledger bytes."""
    from sandbox.study import rebuild_tables

    out = tmp_path / "exact_mu"
    shutil.copytree(ROOT / "results/claims_exact_mu", out)
    rebuild_tables(out)
    for name in ("ledger.csv", "summary.csv", "calibration.csv", "config.json"):
        assert (out / name).read_bytes() == (ROOT / "results/claims_exact_mu" / name).read_bytes()


def test_a_claim_of_a_recorded_name_that_says_otherwise_is_refused_on_both_paths(tmp_path):
    """A run into a folder (with_folder) and --tables-only (rebuild_tables) join the claims given
    with the folder's by one rule: a recorded claim is never replaced by another of its name."""
    from sandbox.study import rebuild_tables
    from sandbox.study.claims import claim_record, parse_claim
    from sandbox.study.config import joined_claims, with_folder

    out = tmp_path / "exact_mu"
    shutil.copytree(ROOT / "results/claims_exact_mu", out)
    values = json.loads((out / "config.json").read_text())
    recorded = claim_record(parse_claim("mine:grpo>gspo"))
    (out / "config.json").write_text(json.dumps({**values, "claims": [recorded]}))
    other = StudyConfig(claims=[claim_record(parse_claim("mine:grpo<gspo"))])
    message = f"^claim mine: {out} records another claim of that name; rename it, or use"
    with pytest.raises(ValueError, match=message):
        with_folder(other, out)
    with pytest.raises(ValueError, match=message):
        rebuild_tables(out, other)
    # the same claim again, or a new name, joins: the folder's first, nothing replaced
    again = claim_record(parse_claim("mine:grpo>gspo"))
    new = claim_record(parse_claim("yours:dapo>grpo"))
    assert joined_claims([recorded], [new, again], out) == [recorded, new]
    grown = with_folder(StudyConfig(rules=["dapo"], claims=[again, new]), out)
    assert [c["name"] for c in grown.claims] == ["mine", "yours"]
