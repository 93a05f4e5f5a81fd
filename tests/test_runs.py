"""The run-kind registry: every registered kind, on its own tiny spec, passes the checks its
traits imply.

A new kind is covered by ``test_every_kind_passes_the_generic_checks`` once it registers with a
``tiny_spec`` (the test fails for a kind without one); nothing here names a kind but the tests of
the sandbox kinds' own behaviour below it. ``test_a_new_kind_needs_no_other_edit`` registers two
throwaway kinds to show it."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sandbox.experiments.runs import (
    SHARED_COLUMNS,
    RunKind,
    RunSpec,
    available_runs,
    freeze,
    has_exact_flow,
    register_run,
    run_kind,
    run_kinds,
    run_specs,
    tidy,
    trainer_config,
    unregister_run,
)

pytest.importorskip("transformers")
import llm.runs  # noqa: F401  (registers the llm kind)


def check_kind(kind: RunKind) -> None:
    """What every kind's tiny spec must give, read from the kind's traits."""
    spec = kind.tiny_spec
    assert spec is not None, f"run kind {kind.name!r} registers no tiny_spec"
    assert spec.kind == kind.name
    assert RunSpec.from_json(spec.to_json()) == spec  # JSON round trip, hashable
    assert hash(spec) == hash(RunSpec.from_json(spec.to_json()))
    if kind.config is not None:
        assert trainer_config(spec) is not None  # the spec passes the trainer's checks
    if kind.exact is not None:  # the counterpart is a registered deterministic kind
        assert run_kind(kind.exact).deterministic
    else:
        assert not has_exact_flow(spec)
    if kind.deterministic:  # its own tiny spec is a flow it computes
        assert kind.exact == kind.name and has_exact_flow(spec)

    [frame] = run_specs([spec])
    assert list(frame.columns[: len(SHARED_COLUMNS)]) == list(SHARED_COLUMNS)
    assert set(frame["kind"]) == {kind.name} and set(frame["rule"]) == {spec.label}
    assert set(frame["setting"]) == {spec.setting}
    assert sorted(frame["step"].unique()) == list(range(kind.first_step(), spec.steps + 1))
    assert set(frame["seed"]) == kind.seeds_of(spec)
    passed = frame[kind.column("pass_rate")].dropna()
    assert len(passed) > 0 and passed.between(0, 1).all()
    trained = frame.loc[frame["step"] >= 1, kind.column("train_reward")]
    assert len(trained) > 0 and np.isfinite(trained.astype(float)).all()
    if kind.batched:  # specs that differ in what its batch varies in: their separate frames
        other = {"rule": "dapo", "seed": spec.seed + 1, "lr": 2 * spec.lr}
        specs = [spec, replace(spec, **{k: v for k, v in other.items() if k in kind.batch_varies})]
        for together, alone in zip(run_specs(specs), [frame, run_specs(specs[1:])[0]], strict=True):
            timing = [c for c in ("tokens_per_s", "step_time") if c in alone]
            pd.testing.assert_frame_equal(
                together.drop(columns=timing), alone.drop(columns=timing), rtol=1e-4, atol=1e-6
            )


@pytest.mark.parametrize("name", available_runs())
def test_every_kind_passes_the_generic_checks(name):
    check_kind(run_kind(name))


def coin(spec: RunSpec) -> pd.DataFrame:
    """A throwaway sampled kind: per replicate, a coin whose heads probability rises 0.5 -> 1."""
    steps = np.arange(spec.steps)
    chance = np.tile(1 - 0.5 ** (steps + 1), spec.seeds)
    rng = np.random.default_rng(spec.seed)
    frame = pd.DataFrame(
        {"seed": np.repeat(np.arange(spec.seeds), spec.steps), "step": np.tile(steps, spec.seeds)}
    )
    return tidy(spec, frame, reward=(rng.random(len(frame)) < chance) * 1.0, pass_rate=chance)


def coin_flow(spec: RunSpec) -> pd.DataFrame:
    """A throwaway deterministic kind: the coin's expected reward, no seed column."""
    steps = np.arange(spec.steps)
    frame = pd.DataFrame({"step": steps, "expected_reward": 1 - 0.5 ** (steps + 1)})
    return tidy(spec, frame)


@pytest.mark.parametrize(
    "name, fn, traits",
    [
        ("coin", coin, {}),
        (
            "coin_flow",
            coin_flow,
            {
                "deterministic": True,
                "score_columns": (
                    ("pass_rate", "expected_reward"),
                    ("train_reward", "expected_reward"),
                ),
            },
        ),
    ],
)
def test_a_new_kind_needs_no_other_edit(name, fn, traits):
    tiny = RunSpec.make(name, "fair", "grpo", seeds=3, steps=4, seed=7)
    register_run(name, tiny_spec=tiny, **traits)(fn)
    try:
        assert name in available_runs() and run_kind(name).fn is fn
        check_kind(run_kind(name))
    finally:
        unregister_run(name)
    assert name not in available_runs()


def test_traits_of_the_registered_kinds():
    sampled, exact, tiny_tf, llm_kind = (
        run_kind(n) for n in ("bandit_sampled", "bandit_exact", "tiny_tf", "llm")
    )
    assert [k.name for k in run_kinds()] == available_runs()
    assert (sampled.flow, exact.flow, tiny_tf.flow, llm_kind.flow) == (
        "sampled",
        "exact",
        "sampled",
        "sampled",
    )
    assert (
        sampled.exact == exact.exact == "bandit_exact" and tiny_tf.exact is llm_kind.exact is None
    )
    assert (sampled.column("pass_rate"), sampled.column("train_reward")) == (
        "expected_reward",
        "reward",
    )
    assert exact.column("train_reward") == "expected_reward"
    assert (llm_kind.column("pass_rate"), llm_kind.column("entropy")) == ("pass_rate", "entropy")
    spec = RunSpec.make("llm", "addition-1", "grpo", seed=3, seeds=2)
    assert llm_kind.seeds_of(spec) == {3} and llm_kind.first_step() == 0
    assert sampled.seeds_of(spec) == {0, 1} and exact.seeds_of(spec) == {-1}
    assert [k.name for k in run_kinds() if k.batched] == ["bandit_exact", "bandit_sampled", "llm"]
    # an ensemble's members step with their own optimizers: a calibration's step sizes batch too
    assert sampled.batch_varies == ("rule", "params", "seed")
    assert llm_kind.batch_varies == ("rule", "params", "seed", "lr")


def test_spec_label_and_part_name():
    spec = RunSpec.make("bandit_sampled", "needle", "nsr", params={"sigma": 0.1, "noise": "band"})
    assert spec.label == "nsr[noise=band,sigma=0.1]"  # parameters sorted by name
    stem = "needle__nsr__noise=band__sigma=0.1__bandit_sampled__seed0"
    assert spec.part == f"{stem}__{spec.digest()}.parquet" and len(spec.digest()) == 12
    other = RunSpec.make("bandit_sampled", "needle", "nsr", params={"sigma": 0.1}, seed=1)
    assert other.part.startswith("needle__nsr__sigma=0.1__bandit_sampled__seed1__")


def test_a_part_is_named_by_every_setting_that_changes_its_result_and_no_other():
    """The digest in a part's name changes with any field of the spec and any ``train`` key that
    changes what the run computes, and not with where or how the run executes
    (:data:`~sandbox.experiments.runs.EXECUTION`: its scratch folder, checkpoints, progress)."""
    spec = RunSpec.make("tiny_tf", "bits", "dapo", train={"eval_k": 2, "progress": False})
    changed = [
        replace(spec, lr=0.25),
        replace(spec, steps=101),
        replace(spec, seeds=2),
        replace(spec, epochs=2),
        replace(spec, group_size=4),
        replace(spec, device="cuda"),
        replace(spec, definition=freeze({"task": "bits", "length": 3})),
        replace(spec, params=freeze({"eps_high": 0.3})),
        RunSpec.make("tiny_tf", "bits", "dapo", train={"eval_k": 3, "progress": False}),
        RunSpec.make("tiny_tf", "bits", "dapo", train={"eval_k": 2, "dtype": "float64"}),
    ]
    names = {spec.part, *(other.part for other in changed)}
    assert len(names) == len(changed) + 1  # every one its own part
    for execution in ({"scratch": "x"}, {"checkpoint_every": 5}, {"progress": True}):
        same = RunSpec.make("tiny_tf", "bits", "dapo", train={"eval_k": 2, **execution})
        assert same.part == spec.part, execution


def test_batched_exact_flows_equal_one_at_a_time():
    tiny = run_kind("bandit_exact").tiny_spec
    specs = [replace(tiny, rule=rule) for rule in ("grpo", "dapo", "gspo")]
    together = run_specs(specs)
    for spec, frame in zip(specs, together, strict=True):
        pd.testing.assert_frame_equal(frame, run_specs([spec])[0], check_exact=True)


def test_exact_flow_is_decided_once():
    spec = run_kind("bandit_exact").tiny_spec
    assert has_exact_flow(spec)  # closed-form expected_coef, grpo advantage, binary needle
    # a sampled kind has the flow of its exact counterpart (bandit_exact) on the same spec
    assert has_exact_flow(RunSpec.make("bandit_sampled", "needle", "dapo"))
    assert not has_exact_flow(RunSpec.make("bandit_sampled", "gaussian", "dapo"))
    assert not has_exact_flow(RunSpec.make("bandit_exact", "needle", "clip_cov"))  # no closed form
    assert not has_exact_flow(RunSpec.make("bandit_exact", "gaussian", "grpo"))  # not binary
    assert not has_exact_flow(
        RunSpec.make("bandit_exact", "needle", "grpo", train={"advantage": "batch_std"})
    )
    assert not has_exact_flow(run_kind("tiny_tf").tiny_spec)  # no exact counterpart


def test_registry_errors_name_the_kind():
    with pytest.raises(ValueError, match=r"unknown run kind 'nope'; registered: \['bandit_exact'"):
        run_kind("nope")
    with pytest.raises(ValueError, match="'tiny_tf' is already registered"):
        register_run("tiny_tf")(lambda spec: spec)
    with pytest.raises(ValueError, match=r"traits: unknown run-kind trait\(s\) \['exakt'\]"):
        register_run("x", exakt="bandit_exact")
    with pytest.raises(ValueError, match=r"batch_varies: unknown RunSpec field\(s\) \['steep'\]"):
        register_run("x", batched=True, batch_varies=("rule", "steep"))(lambda specs: specs)
    assert "x" not in available_runs()
    with pytest.raises(ValueError, match="unknown run kind 'nope'"):
        unregister_run("nope")
    with pytest.raises(ValueError, match="kind: run kind 'llm' has no trainer config"):
        trainer_config(run_kind("llm").tiny_spec)


@pytest.mark.parametrize("name", [k.name for k in run_kinds() if k.config is not None])
def test_a_run_builds_its_objective_once(name, monkeypatch):
    import sandbox.objectives

    real, built = sandbox.objectives.get_objective, []

    def counting(name, **params):
        built.append(name)
        return real(name, **params)

    monkeypatch.setattr(sandbox.objectives, "get_objective", counting)
    spec = run_kind(name).tiny_spec
    run_specs([spec])
    assert built == [spec.rule]  # the config's check and the trainer share it


# -- which columns of results.parquet are per seed, which pooled over a run's seeds ------------

ROOT = Path(__file__).resolve().parents[1]
#: Rules and options whose runs log every metric of the README's table between them.
PROBE_TRAIN = {"grad_mass": True, "entropy_law": True, "off_policy_mask": 0.05}
PROBE_RULES = ("dapo", "nsr_dapo", "dual_clip", "dppo_tv", "vespo_trl", "clip_cov", "kl_cov")


def readme_metric_rows() -> dict[str, tuple[str, str]]:
    """README § Metrics: each metric name -> (meaning, across seeds) of its table row."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([a-z0-9_]+)`", cells[0]):
            rows[name] = (cells[1], cells[2])
    return rows


def test_the_readme_metric_table_says_which_columns_are_pooled_over_seeds():
    """Issue 39: the objective's metrics (clip fractions, ratios, kl, ...) of a sampled toy run
    are computed once over all of its seeds' samples and repeated on every seed's row of
    results.parquet; only a docstring said so. The README's metric table now says, per column,
    whether it is per seed or pooled. A column counts as pooled here when every step's rows hold
    one value across four seeds (a per-seed column differs at some step; kl_cov's picked share is
    one value by construction on the bandit, a fixed share of equal batches)."""
    rows = readme_metric_rows()
    assert {"clip_low_frac", "reward", "kl_k3"} <= set(rows)
    common = dict(seeds=4, steps=3, group_size=4, prompts_per_step=4, epochs=2, minibatches=2)
    specs = [
        RunSpec.make("bandit_sampled", "mixed", rule, lr=4.0, train=PROBE_TRAIN, **common)
        for rule in PROBE_RULES
    ]
    task = {"task": "bits", "op": "parity", "length": 2}
    tf_train = {**PROBE_TRAIN, "top_entropy_quantile": 0.5}
    specs += [
        RunSpec.make(
            "tiny_tf", "bits-parity-2", r, lr=3e-3, definition=task, train=tf_train, **common
        )
        for r in ("dapo", "nsr_dapo", "clip_cov")
    ]
    pooled: dict[str, set[str]] = {}  # column -> the rules that log it pooled
    per_seed: dict[str, set[str]] = {}
    for spec, frame in zip(specs, run_specs(specs), strict=True):
        for column in frame.columns:
            values = frame[column]
            if column not in rows or values.isna().all():
                continue
            one_value = frame.groupby("step")[column].nunique(dropna=False).max() == 1
            (pooled if one_value else per_seed).setdefault(column, set()).add(spec.rule)
    assert {"clip_low_frac", "clip_high_frac", "ratio_mean", "kl_k3", "rescue_frac"} <= set(pooled)
    assert {"reward", "expected_reward", "entropy", "grad_norm"} <= set(per_seed)
    for column, rules in pooled.items():
        assert rows[column][1].startswith("pooled"), (column, rules, rows[column])
    for column in set(per_seed) - set(pooled):
        assert rows[column][1] == "per seed", (column, rows[column])
    # a rule that ranks tokens per seed (clip_cov, kl_cov) logs its own metrics per seed on the
    # bandit: the README names the exception where a column is pooled for the other rules
    for column in set(pooled) & set(per_seed):
        assert "per seed" in rows[column][1], (column, per_seed[column], rows[column])
