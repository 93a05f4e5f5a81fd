"""The tiny-transformer GRPO trainer on reasoning tasks."""

import copy
import dataclasses

import pandas as pd
import pytest
import torch

from sandbox.advantages import compute_advantages
from sandbox.objectives import available_objectives
from sandbox.train import SequenceTrainConfig, SequenceTrainer, train_sequence

FAST = dict(
    task="bits",
    task_knobs={"op": "parity", "length": 2},
    seeds=3,
    steps=3,
    prompts_per_step=4,
    group_size=4,
    d_model=16,
    n_heads=2,
)


def test_frame_columns_and_determinism():
    a = train_sequence(SequenceTrainConfig(**FAST))
    b = train_sequence(SequenceTrainConfig(**FAST))
    assert len(a) == 3 * 3 and list(a["step"].unique()) == [0, 1, 2]
    for col in (
        "reward",
        "pass_rate",
        "entropy",
        "completion_len",
        "grad_norm",
        "clip_low_frac",
        "clip_high_frac",
        "ratio_mean",
        "kl_k3",
    ):
        assert col in a, col
    assert a["reward"].between(0, 1).all() and (a["completion_len"] >= 1).all()
    pd.testing.assert_frame_equal(a, b)
    c = train_sequence(SequenceTrainConfig(**{**FAST, "seed": 1}))
    assert not a["entropy"].equals(c["entropy"])


def test_on_policy_update_has_no_clipping_and_off_policy_does():
    on = train_sequence(SequenceTrainConfig(**{**FAST, "epochs": 1, "minibatches": 1}))
    assert (on["clip_low_frac"] == 0).all() and (on["clip_high_frac"] == 0).all()
    assert (on["ratio_mean"] == 1).all()
    off = train_sequence(
        SequenceTrainConfig(**{**FAST, "epochs": 4, "minibatches": 2, "lr": 1e-2, "steps": 4})
    )
    assert (off["clip_low_frac"] + off["clip_high_frac"]).max() > 0


def test_seeds_are_independent():
    """Changing seed 0's rollout changes seed 0's update and leaves the others' bit-identical."""
    trainer = SequenceTrainer(SequenceTrainConfig(**FAST))
    batch = trainer.rollout()
    model_state = copy.deepcopy(trainer.model.state_dict())
    opt_state = copy.deepcopy(trainer.optimizer.state_dict())
    results = []
    for perturb in (False, True):
        trainer.model.load_state_dict(model_state)
        trainer.optimizer.load_state_dict(opt_state)  # the streams are keyed by the step
        if perturb:
            batch.adv[0] = -batch.adv[0] + 0.5
        trainer.update(batch)
        results.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
    assert any(not torch.equal(results[0][k][0], results[1][k][0]) for k in results[0])
    for k in results[0]:
        torch.testing.assert_close(results[1][k][1:], results[0][k][1:], rtol=0, atol=0)


@pytest.mark.parametrize("objective", available_objectives())
def test_every_objective_trains_with_finite_metrics(objective):
    df = train_sequence(SequenceTrainConfig(**{**FAST, "objective": objective, "steps": 2}))
    numeric = df.select_dtypes("number")
    assert numeric.notna().all().all() and (numeric.abs() < 1e6).all().all()


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["grpo", "nsr_dapo"])
def test_short_training_improves_the_pass_rate(objective):
    cfg = SequenceTrainConfig(
        task="bits",
        task_knobs={"op": "parity", "length": 2},
        objective=objective,
        seeds=4,
        steps=40,
    )
    df = train_sequence(cfg)
    first = df[df["step"] < 5]["pass_rate"].mean()
    last = df[df["step"] >= 35]["pass_rate"].mean()
    assert first < 0.35 and last > first + 0.3, (first, last)


def test_kl_and_entropy_terms_run():
    df = train_sequence(SequenceTrainConfig(**{**FAST, "kl_coef": 0.1, "entropy_coef": 0.01}))
    assert df["grad_norm"].gt(0).all()


@pytest.mark.parametrize(
    "field,value",
    [
        ("task", "chess"),
        ("steps", 0),
        ("group_size", 1),
        ("minibatches", 3),
        ("lr", 0.0),
        ("objective", "ppo"),
        ("aggregation", "mean"),
        ("kl_coef", -1.0),
        ("advantage", "gae"),
        ("dtype", "float16"),
        ("split", "yes"),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SequenceTrainConfig(**{**FAST, field: value})


def test_float64_runs_hold_float64_from_weights_to_logged_columns():
    """dtype float64 (what the golden fixtures use): the models, the reference, the rollout's
    log-probs, rewards and advantages, and every logged float column; still deterministic."""
    cfg = SequenceTrainConfig(**{**FAST, "dtype": "float64", "kl_coef": 0.1, "grad_noise": True})
    trainer = SequenceTrainer(cfg)
    for model in (trainer.model, trainer.reference):
        assert {p.dtype for p in model.parameters()} == {torch.float64}
    batch = trainer.rollout()
    for name in ("logp_old", "logp_ref", "rewards", "adv", "entropy"):
        assert getattr(batch, name).dtype == torch.float64, name
    a, b = train_sequence(cfg), train_sequence(cfg)
    floats = a.select_dtypes("floating")
    assert {str(t) for t in floats.dtypes} == {"float64"} and "grad_rescue_var" in floats
    assert floats["grad_norm"].max() > 0 and floats["kl_k3"].notna().all()
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_batch_std_advantages_are_computed_per_seed():
    """batch_std normalises by a batch statistic: each seed must use its own rewards only."""
    trainer = SequenceTrainer(SequenceTrainConfig(**{**FAST, "advantage": "batch_std"}))
    batch = trainer.rollout()
    for s in range(FAST["seeds"]):
        expected = compute_advantages(batch.rewards[s], FAST["group_size"], method="batch_std")
        torch.testing.assert_close(batch.adv[s], expected, rtol=0, atol=0)


def test_masks_report_their_shares_and_keep_the_rollout_entropy_column():
    """Both masks on: the second minibatch/epoch is off-policy, so a small threshold drops
    sequences; q = 0.5 masks at most half of each seed's minibatch tokens (ties kept). The
    ``entropy`` column stays the rollout's (the same step-0 value as an unmasked run)."""
    cfg = {**FAST, "epochs": 2, "minibatches": 2, "lr": 1e-2}
    plain = train_sequence(SequenceTrainConfig(**cfg))
    masked = train_sequence(
        SequenceTrainConfig(**cfg, off_policy_mask=0.005, top_entropy_quantile=0.5)
    )
    assert masked["entropy_masked_frac"].between(0.2, 0.5).all()
    assert masked["off_policy_masked_frac"].max() > 0
    first = masked["step"] == 0
    pd.testing.assert_series_equal(masked["entropy"][first], plain["entropy"][first])
    assert not masked["grad_norm"].equals(plain["grad_norm"])
    keep_all = train_sequence(SequenceTrainConfig(**cfg, off_policy_mask=1e9))
    pd.testing.assert_frame_equal(
        keep_all.drop(columns="off_policy_masked_frac"), plain, check_like=True
    )
    assert (keep_all["off_policy_masked_frac"] == 0).all()


@pytest.mark.parametrize(
    "field,value",
    [
        ("off_policy_mask", 0.0),
        ("off_policy_mask", float("nan")),
        ("top_entropy_quantile", 0.0),
        ("top_entropy_quantile", 2.0),
    ],
)
def test_bad_mask_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SequenceTrainConfig(**{**FAST, field: value})


def test_split_trains_on_the_train_partition_and_scores_the_test_partition():
    """``split``: every training prompt of every step lies in the task's train partition, every
    held-out problem of every replicate in its test partition, so the two never share one."""
    from envs.reasoning import problem_split

    config = SequenceTrainConfig(
        **{**FAST, "task_knobs": {"op": "reverse", "length": 6}, "split": True, "eval_prompts": 40}
    )
    trainer = SequenceTrainer(config)
    drawn = []
    sample_batch = trainer.task.sample_batch

    def recording(rng, n, split=None):
        prompts, answers = sample_batch(rng, n, split)
        drawn.extend(prompts)
        return prompts, answers

    trainer.task.sample_batch = recording
    for _ in range(3):
        trainer.step()
    trainer.task.sample_batch = sample_batch
    assert len(drawn) == 3 * FAST["seeds"] * FAST["prompts_per_step"]
    held = [p for prompts, _ in trainer.held_out() for p in prompts]
    assert {problem_split(p) for p in drawn} == {"train"}
    assert {problem_split(p) for p in held} == {"test"} and not set(drawn) & set(held)
    unsplit = SequenceTrainer(dataclasses.replace(config, split=False))
    held = [p for prompts, _ in unsplit.held_out() for p in prompts]
    assert {problem_split(p) for p in held} == {"train", "test"}  # the old draw: both


def test_split_refuses_a_task_too_small_to_partition():
    with pytest.raises(ValueError, match="split"):
        SequenceTrainConfig(**{**FAST, "task_knobs": {"op": "reverse", "length": 1}, "split": True})
