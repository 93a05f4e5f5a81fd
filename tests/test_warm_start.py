"""The tiny transformers' warm start (sandbox.train.warm_start): deterministic, written and read
back safely, refused by name where it does not fit, and the one model every replicate starts
from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from sandbox.train import SequenceTrainConfig, SequenceTrainer
from sandbox.train.sequence import load_warm_start
from sandbox.train.warm_start import (
    WarmStartConfig,
    main,
    save_warm_start,
    warm_start,
)

SMALL = dict(
    task="bits", task_knobs={"op": "reverse", "length": 4}, steps=12, batch=16, eval_every=4,
    eval_prompts=8, d_model=16, n_heads=2,
)  # fmt: skip
RUN = dict(task="bits", task_knobs={"op": "reverse", "length": 4}, d_model=16, n_heads=2, seeds=3)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    config = WarmStartConfig(**SMALL)
    state, history = warm_start(config, log=lambda line: None)
    path = save_warm_start(state, config, history, tmp_path_factory.mktemp("w") / "w.pt")
    return config, state, history, path


def test_the_warm_start_is_deterministic_and_learns_from_its_loss(made):
    config, state, history, _ = made
    again, history_again = warm_start(config, log=lambda line: None)
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert history == history_again
    assert [h["step"] for h in history] == [4, 8, 12]
    assert history[-1]["loss"] < history[0]["loss"]
    assert all(0 <= h["pass"] <= 1 for h in history)


def test_every_replicate_starts_from_the_one_warm_started_model(made):
    _, state, _, path = made
    warm = SequenceTrainer(SequenceTrainConfig(**RUN, init=str(path))).model.state_dict()
    for key, value in state.items():
        assert all(torch.equal(warm[key][s], value[0]) for s in range(3)), key
    scratch = SequenceTrainer(SequenceTrainConfig(**RUN)).model.state_dict()
    assert not torch.equal(scratch["head"][0], scratch["head"][1])  # from scratch: its own draws


@pytest.mark.parametrize(
    "change, message",
    [
        ({"task_knobs": {"op": "copy", "length": 4}}, "was made for"),
        ({"d_model": 32, "n_heads": 4}, "was made for"),
    ],
)
def test_a_warm_start_for_another_task_or_shape_is_refused_by_name(made, change, message):
    with pytest.raises(ValueError, match=rf"^init: .*{message}"):
        SequenceTrainConfig(**{**RUN, **change}, init=str(made[3]))


def test_a_missing_or_foreign_file_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"^init: cannot read"):
        SequenceTrainConfig(**RUN, init=str(tmp_path / "none.pt"))
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"^init: .* is not a warm start"):
        SequenceTrainConfig(**RUN, init=str(tmp_path / "other.pt"))


def test_a_target_stops_at_the_first_evaluation_that_reaches_it():
    config = WarmStartConfig(**{**SMALL, "steps": 40, "target": 0.25})
    _, history = warm_start(config, log=lambda line: None)
    reached = [h["pass"] >= 0.25 for h in history]
    assert not any(reached[:-1])
    assert reached[-1] or history[-1]["step"] == 40


def test_the_command_writes_the_file_and_refuses_a_bad_value_by_name(tmp_path, capsys):
    flags = ["--task", "bits", "--task-knobs", "op=reverse", "length=3", "--steps", "4"]
    flags += ["--eval-every", "2", "--eval-prompts", "4", "--batch", "8"]
    assert main([*flags, "--out", str(tmp_path / "w.pt")]) == 0
    assert "wrote" in capsys.readouterr().out
    run = SequenceTrainConfig(task="bits", task_knobs={"op": "reverse", "length": 3})
    assert set(load_warm_start(tmp_path / "w.pt", run)) == set(
        SequenceTrainer(dataclasses.replace(run, seeds=1)).model.state_dict()
    )
    with pytest.raises(SystemExit) as exit_:
        main([*flags, "--lr", "-1", "--out", str(tmp_path / "x.pt")])
    assert exit_.value.code == 2 and "lr" in capsys.readouterr().err


def test_the_tiny_tf_rung_starts_from_the_warm_start_it_is_given(made, tmp_path):
    """``--tf-init FILE``: the rung's specs carry it (none without: the committed study's specs),
    and a file that does not fit the rung's task is refused before any run."""
    from llm.claims import parse_args
    from sandbox.study import StudyJob
    from sandbox.study.plan import job_spec

    job = StudyJob("study", "tiny_tf", "dapo", 1e-3, 2, 0)
    plain, _ = parse_args(["--quick", "--rungs", "tiny_tf"])
    assert "init" not in dict(job_spec(plain, job).train)
    knobs = ["--tf-task", "bits", "--tf-knobs", "op=reverse", "length=4"]
    warm, _ = parse_args(["--quick", "--rungs", "tiny_tf", *knobs, "--tf-init", str(made[3])])
    assert dict(job_spec(warm, job).train)["init"] == str(made[3])
    with pytest.raises(
        ValueError,
        match=r"^tf_init: .*was made for .*give --tf-init a warm start of this task, or none",
    ):
        warm.section("tf").__class__(
            task="bits", knobs={"op": "copy", "length": 4}, init=str(made[3])
        ).check()
    # training from scratch stays a setting: --tf-init none
    cold, _ = parse_args(["--quick", "--rungs", "tiny_tf", *knobs, "--tf-init", "none"])
    assert cold.section("tf").init is None and "init" not in dict(job_spec(cold, job).train)
    with pytest.raises(ValueError, match="tf_init must be a non-empty string"):
        parse_args(["--quick", "--rungs", "tiny_tf", "--tf-init", ""])


def test_ensure_warm_start_makes_a_file_once_per_setting(tmp_path):
    from sandbox.train.warm_start import ensure_warm_start

    config = WarmStartConfig(**{**SMALL, "steps": 4, "eval_every": 2})
    first = ensure_warm_start(config, tmp_path, log=lambda line: None)
    assert first.name.startswith("bits-length4-opreverse-") and first.exists()
    stamp = first.stat().st_mtime_ns
    assert ensure_warm_start(config, tmp_path, log=lambda line: None) == first
    assert first.stat().st_mtime_ns == stamp  # found, not made again
    other = ensure_warm_start(dataclasses.replace(config, lr=2e-3), tmp_path, log=lambda x: None)
    assert other != first and len(list(tmp_path.glob("*.pt"))) == 2


def test_a_relative_warm_start_is_found_in_the_checkout_from_any_directory(
    made, tmp_path, monkeypatch
):
    """The study's default init names a committed file relative to the checkout: a command run
    elsewhere reads that file, under the same name (its runs' settings do not change)."""
    from sandbox.train import sequence as W  # the trainer reads warm starts

    monkeypatch.setattr(W, "CHECKOUT", tmp_path / "checkout")
    relative = "results/w.pt"
    (tmp_path / "checkout" / "results").mkdir(parents=True)
    (tmp_path / "checkout" / relative).write_bytes(made[3].read_bytes())
    monkeypatch.chdir(tmp_path)
    assert W.warm_start_path(relative) == tmp_path / "checkout" / relative
    run = SequenceTrainConfig(**RUN, init=relative)  # checks the file: found in the checkout
    state = load_warm_start(relative, run)
    assert all(torch.equal(state[k], made[1][k]) for k in state)
    (tmp_path / relative).parent.mkdir()
    (tmp_path / relative).write_bytes(b"x")  # the working directory's own file comes first
    assert W.warm_start_path(relative) == Path(relative)
    with pytest.raises(ValueError, match=r"^init: cannot read"):
        load_warm_start("results/missing.pt", run)
