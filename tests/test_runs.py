"""The run-kind registry: every registered kind on a tiny spec returns the shared columns.

A new kind is covered here by adding its tiny spec to ``TINY_SPECS`` (the test fails for a
registered kind without one)."""

from __future__ import annotations

import pandas as pd
import pytest

from sandbox.experiments.runs import (
    SHARED_COLUMNS,
    RunSpec,
    available_runs,
    get_run,
    has_exact_flow,
    register_run,
    run_specs,
)

pytest.importorskip("transformers")
import llm.runs  # noqa: F401  (registers the llm kind)

BANDIT = dict(seeds=2, steps=2, group_size=4, prompts_per_step=2, epochs=2, minibatches=2)
TINY_SPECS = {
    "bandit_sampled": RunSpec.make("bandit_sampled", "mixed", "dapo", **BANDIT),
    "bandit_exact": RunSpec.make("bandit_exact", "needle", "nsr_dapo", **BANDIT),
    "tiny_tf": RunSpec.make(
        "tiny_tf",
        "bits-parity-2",
        "grpo",
        **{**BANDIT, "lr": 1e-3},
        definition={"task": "bits", "op": "parity", "length": 2},
    ),
    "llm": RunSpec.make(
        "llm",
        "addition-1",
        "grpo",
        steps=1,
        group_size=2,
        prompts_per_step=2,
        lr=1e-3,
        definition={"task": "addition", "digits": 1},
        train={
            "model": "tiny",
            "max_new_tokens": 3,
            "eval_every": 1,
            "eval_prompts": 2,
            "offline": True,
            "save_model": False,
            "progress": False,
        },
    ),
}


def test_every_kind_has_a_tiny_spec():
    assert sorted(TINY_SPECS) == available_runs()


@pytest.mark.parametrize("kind", sorted(TINY_SPECS))
def test_every_kind_returns_the_shared_columns(kind):
    spec = TINY_SPECS[kind]
    [frame] = run_specs([spec])
    assert list(frame.columns[: len(SHARED_COLUMNS)]) == list(SHARED_COLUMNS)
    assert set(frame["kind"]) == {kind} and set(frame["rule"]) == {spec.rule}
    assert set(frame["setting"]) == {spec.setting}
    # 1-based steps; the llm logs its evaluation before training as step 0
    assert sorted(frame["step"].unique()) == list(range(0 if kind == "llm" else 1, spec.steps + 1))
    expected_seeds = {-1} if kind == "bandit_exact" else set(range(spec.seeds))
    assert set(frame["seed"]) == ({spec.seed} if kind == "llm" else expected_seeds)
    metric = "pass_rate" if kind in ("tiny_tf", "llm") else "expected_reward"
    values = frame[metric].dropna()
    assert len(values) > 0 and values.between(0, 1).all()
    assert RunSpec.from_json(spec.to_json()) == spec  # JSON round trip, hashable
    assert hash(spec) == hash(RunSpec.from_json(spec.to_json()))


def test_spec_label_and_part_name():
    spec = RunSpec.make("bandit_sampled", "needle", "nsr", params={"sigma": 0.1, "noise": "band"})
    assert spec.label == "nsr[noise=band,sigma=0.1]"  # parameters sorted by name
    assert spec.part == "needle__nsr__noise=band__sigma=0.1__bandit_sampled__seed0.parquet"
    other = RunSpec.make("bandit_sampled", "needle", "nsr", params={"sigma": 0.1}, seed=1)
    assert other.part == "needle__nsr__sigma=0.1__bandit_sampled__seed1.parquet"


def test_batched_exact_flows_equal_one_at_a_time():
    specs = [
        TINY_SPECS["bandit_exact"].__class__.make("bandit_exact", "needle", rule, **BANDIT)
        for rule in ("grpo", "dapo", "gspo")
    ]
    together = run_specs(specs)
    for spec, frame in zip(specs, together, strict=True):
        pd.testing.assert_frame_equal(frame, run_specs([spec])[0], check_exact=True)


def test_exact_flow_is_decided_once():
    spec = TINY_SPECS["bandit_exact"]
    assert has_exact_flow(spec)  # closed-form expected_coef, grpo advantage, binary needle
    assert not has_exact_flow(RunSpec.make("bandit_exact", "needle", "clip_cov"))  # no closed form
    assert not has_exact_flow(RunSpec.make("bandit_exact", "gaussian", "grpo"))  # not binary
    assert not has_exact_flow(
        RunSpec.make("bandit_exact", "needle", "grpo", train={"advantage": "batch_std"})
    )
    assert not has_exact_flow(TINY_SPECS["tiny_tf"])


def test_registry_errors_name_the_kind():
    with pytest.raises(ValueError, match=r"unknown run kind 'nope'; registered: \['bandit_exact'"):
        get_run("nope")
    with pytest.raises(ValueError, match="'tiny_tf' is already registered"):
        register_run("tiny_tf")(lambda spec: spec)


@pytest.mark.parametrize("kind", ["bandit_sampled", "bandit_exact", "tiny_tf"])
def test_a_run_builds_its_objective_once(kind, monkeypatch):
    import sandbox.objectives

    real, built = sandbox.objectives.get_objective, []

    def counting(name, **params):
        built.append(name)
        return real(name, **params)

    monkeypatch.setattr(sandbox.objectives, "get_objective", counting)
    run_specs([TINY_SPECS[kind]])
    assert built == [TINY_SPECS[kind].rule]  # the config's check and the trainer share it
