"""The study's record (sandbox.study.config, sandbox.study.settings): typed sections, an old flat
config.json migrated on read, and the settings a folder's parts depend on."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from sandbox.experiments.results import changed_settings
from sandbox.study import StudyConfig, part_fields, read_record
from sandbox.study.settings import BanditSettings, TfSettings

pytest.importorskip("transformers")
from llm.claims import LlmSettings

ROOT = Path(__file__).resolve().parents[1]


def test_an_old_record_reads_as_the_same_settings_given_the_new_way(tmp_path):
    """results/claims/config.json is a flat record (bandit_*, tf_*, a global seeds, extra): it
    reads as sections, its global seeds the toy sections' seeds, and its part fields equal those
    of the same settings given as sections (else the folder would be refused)."""
    record = json.loads((ROOT / "results/claims/config.json").read_text())
    assert record["seeds"] == 16 and record["extra"] == {}
    config, point = read_record(ROOT / "results/claims")
    assert point is None and config.rng is None
    assert config.section("bandit") == BanditSettings(seeds=16)
    assert config.section("tf").lrs == [3e-4, 1e-3, 3e-3, 1e-2] and config.seeds("tiny_tf") == 16
    assert config.section("llm") == LlmSettings()  # its own seeds (8): the old llm rung's
    new = StudyConfig(
        rules=record["rules"],
        rungs=record["rungs"],
        rng=None,
        sections={"bandit": BanditSettings(seeds=16), "tf": TfSettings(seeds=16)},
    )
    # the planner's check (a key the old record lacks, rng and dtype, counts as None)
    assert changed_settings(part_fields(record), new.fields_of_parts()) == []
    assert new.fields_of_parts() == config.fields_of_parts()
    assert part_fields(record)["bandit_steps"] == 60 and "seeds" not in part_fields(record)
    fewer = StudyConfig(rng=None, sections={"tf": {"seeds": 8}, "bandit": {"seeds": 16}})
    assert changed_settings(part_fields(record), fewer.fields_of_parts()) == ["tf_seeds: 16 -> 8"]


def test_an_old_llm_record_keeps_its_llm_settings_and_drops_execution_ones():
    """``extra: {"llm": {...}}`` becomes the llm section; ``ensemble``, ``scratch`` and
    ``checkpoint_every`` choose how runs execute and are no part fields."""
    old = {
        **{k: v for k, v in asdict(StudyConfig()).items() if k != "sections"},
        "seeds": 3,
        "bandit_steps": 4,
        "extra": {"llm": {"lrs": [1e-3], "seeds": 3, "ensemble": 2, "scratch": "/tmp/x"}},
    }
    fields = part_fields(old)
    assert (fields["llm_lrs"], fields["llm_seeds"], fields["bandit_seeds"]) == ([1e-3], 3, 3)
    assert not {"llm_ensemble", "llm_scratch", "llm_checkpoint_every"} & set(fields)
    new = StudyConfig(
        sections={
            "bandit": {"steps": 4, "seeds": 3},
            "tf": {"seeds": 3},
            "llm": LlmSettings(lrs=[1e-3], seeds=3, ensemble=4),
        }
    )
    assert changed_settings(fields, new.fields_of_parts()) == []


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


def test_the_committed_folders_tables_rebuild_from_their_old_records(tmp_path):
    """--tables-only on a copy of results/claims_exact_mu (an old flat record) gives the same
    ledger bytes."""
    from sandbox.study import rebuild_tables

    out = tmp_path / "exact_mu"
    shutil.copytree(ROOT / "results/claims_exact_mu", out)
    rebuild_tables(out)
    for name in ("ledger.csv", "summary.csv", "calibration.csv", "config.json"):
        assert (out / name).read_bytes() == (ROOT / "results/claims_exact_mu" / name).read_bytes()
