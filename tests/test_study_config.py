"""The study's record (sandbox.study.rungs): typed sections, and the
settings a folder's parts depend on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sandbox.configs import check_number
from sandbox.study import StudyConfig, read_record
from sandbox.study.claims import Claim
from sandbox.study.plan import calibration_jobs, check_time_budget, job_part
from sandbox.study.rungs import TfSettings

pytest.importorskip("transformers")
import llm.claims  # noqa: F401  (registers the llm rung and its section)

ROOT = Path(__file__).resolve().parents[1]


def parts(config: StudyConfig) -> list[str]:
    """The part names of ``config``'s calibration runs (each names its run spec's hash)."""
    return [job_part(config, job) for job in calibration_jobs(config)]


def test_the_llm_sections_execution_settings_name_the_same_parts():
    """``ensemble``, ``scratch`` and ``checkpoint_every`` choose how llm runs execute: a run that
    differs only in them finds the same parts; a setting that changes what a run computes
    (``max_new_tokens``) names other parts."""

    def study(**llm: object) -> StudyConfig:
        return StudyConfig(rungs=["llm"], sections={"llm": {"lrs": [1e-3], "seeds": 3, **llm}})

    first = parts(study(ensemble=2, scratch="/tmp/x"))
    assert parts(study(ensemble=4, checkpoint_every=5)) == first
    assert set(parts(study(max_new_tokens=9))).isdisjoint(first)


def test_a_section_no_rung_uses_changes_no_part():
    """The tf settings leave a bandit-only study's parts as they are; a changed bandit setting
    names other parts."""
    bandit = parts(StudyConfig(rungs=["bandit_sampled"]))
    assert parts(StudyConfig(rungs=["bandit_sampled"], sections={"tf": {"steps": 7}})) == bandit
    other = parts(StudyConfig(rungs=["bandit_sampled"], sections={"bandit": {"steps": 5}}))
    assert set(other).isdisjoint(bandit)


def test_a_new_record_holds_the_sections_and_reads_back(tmp_path):
    from sandbox.study.rungs import record_calibration

    config = StudyConfig(sections={"tf": TfSettings(knobs={"op": "reverse", "length": 2})})
    record_calibration(tmp_path, config, {"tiny_tf": (1e-3, 4)})
    values = json.loads((tmp_path / "config.json").read_text())
    assert values["sections"]["tf"]["knobs"] == {"op": "reverse", "length": 2}
    assert not {"seeds", "extra", "tf_knobs"} & set(values)
    again, point = read_record(tmp_path)
    assert again == config and point == {"tiny_tf": (1e-3, 4)}


def test_a_record_holds_only_the_sections_of_its_rungs(tmp_path):
    """A bandit-only study records the bandit section alone: another section's values are no
    setting it used, and read back as that section's defaults."""
    from sandbox.study.rungs import record_calibration

    config = StudyConfig(rungs=["bandit_exact"], sections={"tf": {"steps": 7}})
    record_calibration(tmp_path, config, {"bandit_exact": (1.0, 2)})
    assert list(json.loads((tmp_path / "config.json").read_text())["sections"]) == ["bandit"]
    again, _ = read_record(tmp_path)
    assert again.section("bandit") == config.section("bandit")
    assert again.section("tf") == TfSettings()


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


def test_the_committed_folders_tables_rebuild_from_their_records(tmp_path):
    """--tables-only on a copy of results/claims_exact_mu gives the same bytes."""
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
    from sandbox.study.rungs import joined_claims, with_folder

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
