"""llm.config: :class:`TrainConfig` and the ``python -m llm.train`` command line generated from it
(flags, ``--config`` files, ``--help``), and every bad input failing with one line on stderr and
exit 2 before any compute (flags that would be ignored, unknown names, broken data files,
missing models, the rollout-IS and vLLM options)."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

pytest.importorskip("transformers")

from test_llm_train_loop import config

from llm.model import tiny_model, tiny_tokenizer
from llm.train import main, parse_args, train

# ------------------------------------------------------------------------------------------
# flags and config files
# ------------------------------------------------------------------------------------------


def test_config_file_and_flags(tmp_path, capsys):
    """--config sets the same fields; flags override it; OUT/config.json records the run."""
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("objective: gspo\nlr: 1e-3\ntask_knobs: {length: 2}\nreport_to: []\n")
    cfg = parse_args(["--config", str(yaml_file), "--lr", "0.5"])
    assert (cfg.objective, cfg.lr, cfg.task_knobs) == ("gspo", 0.5, {"length": 2})
    toml_file = tmp_path / "run.toml"
    toml_file.write_text('objective = "nsr_dapo"\nsteps = 3\nobjective_params = {sigma = 0.2}\n')
    cfg = parse_args(["--config", str(toml_file)])
    assert (cfg.objective, cfg.steps, cfg.objective_params) == ("nsr_dapo", 3, {"sigma": 0.2})
    for text, match in [
        ("stepz: 3\n", "unknown setting 'stepz'"),
        ("steps: three\n", "steps must be int"),
        ("- 1\n", "mapping"),
    ]:
        yaml_file.write_text(text)
        with pytest.raises(ValueError, match=match):
            parse_args(["--config", str(yaml_file)])
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(ValueError, match=r"expected a \.toml, \.yaml or \.yml"):
        parse_args(["--config", str(tmp_path / "run.json")])
    with pytest.raises(ValueError, match="config file not found"):
        parse_args(["--config", str(tmp_path / "missing.yaml")])
    out = tmp_path / "cfg"
    train(config(tmp_path, "cfg", steps=1, objective="gspo"))
    saved = json.loads((out / "config.json").read_text())
    assert saved["objective"] == "gspo" and saved["steps"] == 1
    assert saved["task_knobs"] == {"length": 2, "mode": "parity"}  # resolved: the defaults too


def test_help_shows_each_default_once(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("(default: 100)") == 1  # --steps
    for flag in ("--task", "--eval-data", "--prompts-per-call"):
        entry = text.split(flag, 1)[1].split(" --", 1)[0]
        assert entry.count("default") <= 1, entry


def test_cli_flags_and_one_line_per_step(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = capsys.readouterr().out
    for flag in (
        "--model",
        "--task",
        "--data",
        "--verifier",
        "--objective",
        "--objective-params",
        "--steps",
        "--out",
        "--resume",
        "--fsdp",
        "--lora-r",
        "--kl-coef",
    ):
        assert flag in help_text
    cfg = parse_args(
        [
            "--objective",
            "nsr",
            "--objective-params",
            "noise=band",
            "sigma=0.1",
            "--task-knobs",
            "steps=1",
            "--report-to",
        ]
    )
    assert cfg.objective_params == {"noise": "band", "sigma": 0.1}
    assert cfg.task_knobs == {"steps": 1} and cfg.report_to == []
    out = tmp_path / "cli"
    main(
        [
            "--model",
            "tiny",
            "--steps",
            "2",
            "--prompts-per-step",
            "2",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--no-progress",
            "--no-save-model",
            "--out",
            str(out),
        ]
    )
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_rollout_is_flags_and_errors(tmp_path, capsys):
    cfg = parse_args(
        [
            "--rollout-is",
            "mask",
            "--rollout-is-level",
            "sequence",
            "--rollout-is-min",
            "0.5",
            "--rollout-is-max",
            "3",
        ]
    )
    assert (cfg.rollout_is, cfg.rollout_is_level, cfg.rollout_is_min, cfg.rollout_is_max) == (
        "mask",
        "sequence",
        0.5,
        3.0,
    )
    assert parse_args([]).rollout_is == "none"
    with pytest.raises(ValueError, match=r"--rollout-is-min 3\.0 and --rollout-is-max 2\.0"):
        config(tmp_path, rollout_is="truncate", rollout_is_min=3.0).validate()
    with pytest.raises(ValueError, match="--rollout-is must be one of"):
        config(tmp_path, rollout_is="clip").validate()


# ------------------------------------------------------------------------------------------
# bad input: a clear error before any compute
# ------------------------------------------------------------------------------------------


def _bad(tmp_path, capsys, args, pattern):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exc:
        main(["--model", "tiny", "--steps", "1", "--no-progress", "--out", str(out), *args])
    assert exc.value.code == 2
    assert re.search(pattern, capsys.readouterr().err), pattern
    assert not (out / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--fsdp"], "--fsdp shards over several processes: launch with torchrun"),
        (["--eval-data", "x.jsonl"], "--eval-data is only read with --eval-every"),
        (
            ["--prompts-per-step", "2", "--group-size", "2", "--minibatches", "3"],
            "--minibatches 3 must divide the step's 4 completions",
        ),
        (["--report-to", "wandb"], None),
    ],
)
def test_flags_that_would_be_ignored_are_refused(tmp_path, capsys, monkeypatch, args, match):
    if match is None:  # a missing tracker names the extra that installs it
        monkeypatch.setitem(sys.modules, "wandb", None)
        match = r"wandb is not installed: pip install 'clip-sandbox\[tracking\]'"
    _bad(tmp_path, capsys, args, match)


@pytest.mark.parametrize(
    ("args", "message"),
    [  # issue 39: each was accepted silently, or refused without naming its flag
        (
            ["--eval-every", "1", "--eval-prompts", "0"],
            "--eval-every 1 evaluates on --eval-prompts 0 held-out problems: give --eval-prompts "
            ">= 1, or --eval-every 0 for no evaluation",
        ),
        (["--seed", "-5"], "--seed must be an integer >= 0, got -5"),
        # argparse took -1e-3 for a flag ("expected one argument" under 62 lines of usage)
        (["--lr", "-1e-3"], "--lr must be > 0, got -0.001"),
        (["--kl-coef", "-2.5E-2"], "--kl-coef must be >= 0, got -0.025"),
    ],
    ids=["eval-without-prompts", "negative-seed", "negative-lr", "negative-kl-coef"],
)
def test_a_bad_value_is_one_line_naming_its_flag(tmp_path, in_process, args, message):
    out = tmp_path / "bad"
    argv = ["--model", "tiny", "--steps", "1", "--no-progress", "--out", str(out), *args]
    proc = in_process(main, *argv)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {message}\n"
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--device", "cuda"], r"--device cuda: CUDA is not available")


def test_bad_input_is_one_line_on_stderr_before_any_compute(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _bad(tmp_path, capsys, ["--objective", "nope"], r"unknown --objective 'nope'.*dapo")
    _bad(
        tmp_path, capsys, ["--objective", "ppo_clip", "--objective-params", "eps_low=-1"], "eps_low"
    )
    _bad(tmp_path, capsys, ["--task", "nope"], r"unknown --task 'nope'.*mod_arith")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _bad(tmp_path, capsys, ["--data", str(empty)], "has no rows")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": oops}\n')
    _bad(tmp_path, capsys, ["--data", str(broken)], r"broken.jsonl:2: malformed JSON")
    keys = tmp_path / "keys.jsonl"
    keys.write_text('{"question": "1+1=", "answer": "2"}\n')
    _bad(tmp_path, capsys, ["--data", str(keys)], "row 1 lacks 'prompt'")
    _bad(tmp_path, capsys, ["--data", str(tmp_path / "missing.jsonl")], "does not exist")
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "1" * 600, "answer": "1"}) + "\n")
    _bad(
        tmp_path,
        capsys,
        ["--data", str(long), "--chat-template", "off"],
        r"a prompt has 60\d tokens, more than the \d+ allowed",
    )
    _bad(
        tmp_path,
        capsys,
        ["--model", "no-such-org/no-such-model-xyz"],
        r"--model 'no-such-org/no-such-model-xyz' is not in the local Hugging Face cache and this "
        r"run is offline",
    )
    nopad = tmp_path / "nopad"
    tok = tiny_tokenizer()
    tiny_model(len(tok), 0).save_pretrained(nopad)
    tok.pad_token = None
    tok.save_pretrained(nopad)
    _bad(tmp_path, capsys, ["--model", str(nopad)], r"has no pad token; pass --pad-token")
    _bad(tmp_path, capsys, ["--prompts-per-step", "0"], r"--prompts-per-step must be")


def test_vllm_backend_flags_and_errors(tmp_path, monkeypatch):
    # the engine itself is tested in test_llm_vllm.py where vLLM is installed
    cfg = parse_args(
        [
            "--rollout-backend",
            "vllm",
            "--vllm-gpu-memory-utilization",
            "0.5",
            "--vllm-sleep",
            "--vllm-enforce-eager",
        ]
    )
    assert (
        cfg.rollout_backend,
        cfg.vllm_gpu_memory_utilization,
        cfg.vllm_sleep,
        cfg.vllm_enforce_eager,
    ) == ("vllm", 0.5, True, True)
    assert parse_args([]).rollout_backend == "hf"
    with pytest.raises(ValueError, match="--rollout-backend must be one of"):
        config(tmp_path, rollout_backend="sglang").validate()
    with pytest.raises(ValueError, match=r"--vllm-gpu-memory-utilization must be in \(0, 1\]"):
        config(tmp_path, rollout_backend="vllm", vllm_gpu_memory_utilization=0).validate()
    with pytest.raises(ValueError, match="--fsdp with --lora-r"):
        config(tmp_path, rollout_backend="vllm", fsdp=True, lora_r=4).validate()
    with pytest.raises(ValueError, match="--vllm-sleep needs CUDA"):
        train(config(tmp_path, "sleep", rollout_backend="vllm", vllm_sleep=True))
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    with pytest.raises(ValueError, match=r"needs vLLM: pip install 'clip-sandbox\[vllm\]'"):
        train(config(tmp_path, "missing", rollout_backend="vllm"))
    assert not (tmp_path / "missing" / "metrics.jsonl").exists()  # nothing ran
