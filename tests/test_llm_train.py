"""llm.train on CPU with the tiny Llama built in code (no download; HF_HUB_OFFLINE=1 is fine).

What is checked: a few steps for every registered objective move the parameters and log finite
metrics; a seed fixes a run bit for bit; resume equals an uninterrupted run bit for bit; SIGTERM
writes a checkpoint first; gradient accumulation does not change the update; the options (LoRA,
reference KL, entropy bonus, dynamic sampling, truncation mask, schedules, checkpointing, eval
pass@k, JSONL/parquet data, local model dirs); every bad input of the issue fails with a clear
error before any compute; and ``llm`` has no second copy of a loss.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("transformers")

import sandbox.objectives as registry
from llm import train as train_mod
from llm.checkpoint import model_state
from llm.data import exact_match, numeric_match, read_rows
from llm.model import tiny_model, tiny_tokenizer
from llm.train import TrainConfig, main, objective_choices, parse_args, train

TIMING = ("tokens_per_s", "step_time")
# parity of 2 bits: answer "0" or "1", so a random tiny model earns reward ~20% of the time and
# groups have non-zero advantages.
# prompts_per_call=1: a prompt's samples do not depend on how prompts are batched, so the seeds
# these tests pick (and the 1-vs-2-process comparisons) keep their meaning
BASE = dict(model="tiny", task="parity", task_knobs={"length": 2}, lr=1e-2, prompts_per_step=4,
            group_size=4, prompts_per_call=1,
            max_new_tokens=8, progress=False, save_model=False, device="cpu")  # fmt: skip


def config(tmp_path: pathlib.Path, name: str = "run", **kw) -> TrainConfig:
    return TrainConfig(**{**BASE, "steps": 2, "out": str(tmp_path / name), **kw})


def initial_params(seed: int = 0) -> dict[str, torch.Tensor]:
    return tiny_model(len(tiny_tokenizer()), seed).state_dict()


def strip_timing(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def max_change(state: dict[str, torch.Tensor], seed: int = 0) -> float:
    init = initial_params(seed)
    return max((state[k] - init[k]).abs().max().item() for k in init)


# -- every objective -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", registry.available_objectives())
def test_every_objective_trains(tmp_path, name):
    # epochs x minibatches = 2 updates per step, so the second one is off-policy (r != 1)
    rows = train(config(tmp_path, objective=name, epochs=2, minibatches=2))
    assert [r["step"] for r in rows] == [1, 2]
    assert min(r["zero_var_frac"] for r in rows) < 1  # some advantage was non-zero
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
        for key in ("reward", "pass_rate", "entropy", "grad_norm", "ratio_mean", "kl_k3"):
            assert key in row
    assert max_change(model_state(str(tmp_path / "run"))) > 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows


# -- determinism, resume, SIGTERM, micro-batching -----------------------------------------------


def test_seed_fixes_the_run(tmp_path):
    kw = dict(objective="nsr_dapo", epochs=2, steps=2)  # stochastic objective: its draws too
    a, b = train(config(tmp_path, "a", **kw)), train(config(tmp_path, "b", **kw))
    c = train(config(tmp_path, "c", seed=1, **kw))
    assert strip_timing(a) == strip_timing(b) != strip_timing(c)
    sa, sb = model_state(str(tmp_path / "a")), model_state(str(tmp_path / "b"))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_resume_equals_uninterrupted(tmp_path):
    kw = dict(objective="dapo", epochs=2, lr_schedule="cosine")
    full = train(config(tmp_path, "full", steps=4, **kw))
    first = train(config(tmp_path, "part", steps=4, checkpoint_every=2, **kw), stop_after=2)
    rest = train(config(tmp_path, "part", steps=4, resume=True, **kw))
    assert [r["step"] for r in first + rest] == [1, 2, 3, 4]
    assert strip_timing(first + rest) == strip_timing(full)
    a, b = model_state(str(tmp_path / "full")), model_state(str(tmp_path / "part"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    logged = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in logged] == [1, 2, 3, 4]


def test_existing_checkpoint_needs_resume(tmp_path):
    train(config(tmp_path, steps=1))
    with pytest.raises(ValueError, match="--resume"):
        train(config(tmp_path, steps=1))


def test_resume_checks_the_config(tmp_path):
    train(config(tmp_path, steps=1, objective="dapo"))
    with pytest.raises(ValueError, match=r"--lr 0\.01 -> 0\.5; --objective 'dapo' -> 'cispo'"):
        train(config(tmp_path, steps=2, resume=True, objective="cispo", lr=0.5))
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1  # nothing ran
    # more steps, other reporting: the same experiment, accepted
    rows = train(config(tmp_path, steps=2, resume=True, objective="dapo", eval_every=2))
    assert [r["step"] for r in rows] == [2]
    rows = train(config(tmp_path, steps=3, resume=True, objective="cispo",
                        allow_config_change=True))  # fmt: skip
    assert [r["step"] for r in rows] == [3]
    # with --data, turning eval on holds rows out of training: that is a different run
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i} 1", "answer": "1"}) + "\n" for i in range(8))
    )
    kw = dict(task=None, data=str(data), eval_prompts=2)
    train(config(tmp_path, "file", steps=1, **kw))
    with pytest.raises(ValueError, match="held out for eval 0 -> 2"):
        train(config(tmp_path, "file", steps=2, resume=True, eval_every=1, **kw))


def test_sigterm_writes_a_checkpoint(tmp_path):
    out = tmp_path / "sig"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "llm.train", "--model", "tiny", "--steps", "10000", "--lr", "1e-3",
           "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4",
           "--no-progress", "--device", "cpu", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics, deadline = out / "metrics.jsonl", time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err.decode()[-2000:]
    steps = len(metrics.read_text().splitlines())
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == steps >= 1


def _start_and_wait_for_a_step(out, extra=()):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "llm.train", "--model", "tiny", "--steps", "10000", "--lr", "1e-3",
           "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4",
           "--no-progress", "--device", "cpu", "--out", str(out), *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics, deadline = out / "metrics.jsonl", time.time() + 60
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n")):
        time.sleep(0.2)
    return proc, metrics


def test_ctrl_c_writes_a_checkpoint_and_resume_continues(tmp_path):
    """SIGINT (Ctrl-C) is treated like SIGTERM: the step finishes, a checkpoint is written, exit
    130; --resume then continues from the checkpoint's step."""
    out = tmp_path / "int"
    proc, metrics = _start_and_wait_for_a_step(out)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "SIGINT: checkpoint written" in err.decode() and "Traceback" not in err.decode()
    steps = len(metrics.read_text().splitlines())
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == steps >= 1
    rows = train(TrainConfig(model="tiny", steps=steps + 1, lr=1e-3, prompts_per_step=2,
                             group_size=2, max_new_tokens=4, progress=False, device="cpu",
                             save_model=False, out=str(out), resume=True))  # fmt: skip
    assert [r["step"] for r in rows] == [steps + 1]


def test_second_ctrl_c_aborts_at_once(tmp_path):
    """Two Ctrl-C: the second raises KeyboardInterrupt in the middle of the step (no waiting)."""
    out = tmp_path / "int2"
    proc, _ = _start_and_wait_for_a_step(out, ["--prompts-per-step", "64", "--group-size", "8",
                                               "--max-new-tokens", "32"])  # fmt: skip
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err.decode()


def test_resume_without_a_checkpoint_or_with_nothing_left_fails(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"--resume: no checkpoint at .*typo.*check --out"):
        train(config(tmp_path, "typo", steps=1, resume=True))
    assert not (tmp_path / "typo" / "metrics.jsonl").exists()
    train(config(tmp_path, steps=2))
    with pytest.raises(ValueError, match=r"is at step 2, not before --steps 1: nothing to do"):
        train(config(tmp_path, steps=1, resume=True))
    with pytest.raises(SystemExit) as exc:  # and from the command line: exit status 2
        main(["--model", "tiny", "--task", "parity", "--task-knobs", "length=2", "--steps", "2",
              "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "8",
              "--prompts-per-call", "1", "--lr", "1e-2", "--no-save-model", "--no-progress",
              "--device", "cpu", "--out", str(tmp_path / "run"), "--resume"])  # fmt: skip
    assert exc.value.code == 2 and "nothing to do" in capsys.readouterr().err


def test_resume_accepts_a_task_knob_given_at_its_default(tmp_path):
    train(config(tmp_path, steps=1, task="mod_arith", task_knobs={}))
    rows = train(config(tmp_path, steps=2, resume=True, task="mod_arith",
                        task_knobs={"modulus": 7}))  # fmt: skip
    assert [r["step"] for r in rows] == [2]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["task_knobs"]["modulus"] == 7 and saved["steps"] == 2


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
    for text, match in [("stepz: 3\n", "unknown setting 'stepz'"),
                        ("steps: three\n", "steps must be int"), ("- 1\n", "mapping")]:  # fmt: skip
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


def test_default_rollout_is_one_batched_generate(tmp_path, monkeypatch):
    from llm import rollout

    calls = []
    real = rollout.generate

    def spy(*args, **kw):
        calls.append(kw["prompts_per_call"])
        return real(*args, **kw)

    monkeypatch.setattr(rollout, "generate", spy)
    train(TrainConfig(**{**BASE, "prompts_per_call": None, "steps": 1, "out": str(tmp_path / "b")}))
    assert calls == [BASE["prompts_per_step"]]  # all the rank's prompts in one call
    assert TrainConfig().prompts_per_call is None and TrainConfig().gradient_checkpointing


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--fsdp"], "--fsdp shards over several processes: launch with torchrun"),
        (["--eval-data", "x.jsonl"], "--eval-data is only read with --eval-every"),
        (["--prompts-per-step", "2", "--group-size", "2", "--minibatches", "3"],
         "--minibatches 3 must divide the step's 4 completions"),
        (["--report-to", "wandb"], None),
    ],
)  # fmt: skip
def test_flags_that_would_be_ignored_are_refused(tmp_path, capsys, monkeypatch, args, match):
    if match is None:  # a missing tracker names the extra that installs it
        monkeypatch.setitem(sys.modules, "wandb", None)
        match = r"wandb is not installed: pip install 'clip-sandbox\[tracking\]'"
    _bad(tmp_path, capsys, args, match)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line(tmp_path, capsys):
    _bad(tmp_path, capsys, ["--device", "cuda"], r"--device cuda: CUDA is not available")


def test_gradient_accumulation_keeps_the_update(tmp_path):
    """1 vs 4 micro-batches per optimizer step: the same minibatch gradient up to float32
    summation order. Adam divides by each coordinate's RMS, which amplifies that rounding in
    near-zero-gradient coordinates, so compare with how far the parameters moved (observed 4e-5)."""
    kw = dict(objective="dapo", epochs=2, minibatches=2, steps=2)
    a = train(config(tmp_path, "a", grad_accum=1, **kw))
    b = train(config(tmp_path, "b", grad_accum=4, **kw))
    assert [r["reward"] for r in a] == [r["reward"] for r in b]
    sa, sb = model_state(str(tmp_path / "a")), model_state(str(tmp_path / "b"))
    init = initial_params()
    for k in sa:
        moved = (sa[k] - init[k]).abs().max()
        assert moved > 0 and (sa[k] - sb[k]).abs().max() <= 1e-3 * moved, k


# -- options ----------------------------------------------------------------------------------------


def test_reference_kl_entropy_and_filters(tmp_path):
    rows = train(config(tmp_path, objective="grpo", kl_coef=0.1, entropy_coef=0.01, epochs=2,
                        drop_zero_variance=True, mask_truncated=True, warmup_steps=1,
                        lr_schedule="linear", gradient_checkpointing=True, chat_template="off",
                        eval_every=1, eval_prompts=2, eval_k=3, steps=2))  # fmt: skip
    assert rows[0]["step"] == 0 and set(rows[0]) == {"step", "eval_pass@1", "eval_pass@3"}
    rows = rows[1:]  # the evaluation before training, then one row per step
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
        assert 0 <= row["eval_pass@1"] <= row["eval_pass@3"] <= 1
    assert "kl_ref_k3" in rows[-1] or rows[-1]["zero_var_frac"] == 1.0
    assert rows[0]["lr"] == pytest.approx(1e-2) and rows[1]["lr"] == pytest.approx(1e-2)


def test_lora_trains_only_the_adapter(tmp_path):
    pytest.importorskip("peft")
    rows = train(config(tmp_path, objective="dapo", lora_r=4, kl_coef=0.1, epochs=2, steps=2,
                        save_model=True))  # fmt: skip
    assert all(math.isfinite(v) for r in rows for v in r.values())
    state = model_state(str(tmp_path / "run"))
    lora = [k for k in state if "lora_" in k]
    assert lora and "kl_ref_k3" in rows[-1]
    init = initial_params()
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in state.items() if "lora_" not in k}  # fmt: skip
    assert all(torch.equal(base[k], init[k]) for k in init)
    assert any(state[k].abs().sum() > 0 for k in lora if "lora_B" in k)
    assert (tmp_path / "run" / "model" / "adapter_config.json").exists()


def test_jsonl_parquet_and_local_model(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": a + b} for a in range(4) for b in range(3)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    out = train(config(tmp_path, "j", task=None, data=str(jsonl), eval_every=1, eval_prompts=2,
                       save_model=True, steps=1))  # fmt: skip
    assert "eval_pass@4" in out[0]
    pd = pytest.importorskip("pandas")
    parquet = tmp_path / "d.parquet"
    pd.DataFrame(rows).to_parquet(parquet)
    assert read_rows(str(parquet)) == read_rows(str(jsonl))
    # the saved model loads back as a local directory
    local = train(config(tmp_path, "local", model=str(tmp_path / "j" / "model"), task=None,
                         data=str(parquet), steps=1))  # fmt: skip
    assert math.isfinite(local[0]["grad_norm"])


def test_verifiers():
    assert read_rows  # imported
    assert exact_match("Paris", "The answer is\n\\boxed{paris}") == 1.0
    assert exact_match("Paris", "Answer: Lyon") == 0.0
    assert numeric_match("1234", "so the total is 1,234.") == 1.0
    assert numeric_match("3.5", "Answer: 7/2") == 1.0
    assert numeric_match("72", "72 apples\nthen 71") == 0.0


def test_gsm8k_answers(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"prompt": "q", "answer": "3 + 4 = 7\n#### 7"}) + "\n")
    assert read_rows(str(path)) == (["q"], ["7"])


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_flags_and_one_line_per_step(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = capsys.readouterr().out
    for flag in ("--model", "--task", "--data", "--verifier", "--objective", "--objective-params",
                 "--steps", "--out", "--resume", "--fsdp", "--lora-r", "--kl-coef"):  # fmt: skip
        assert flag in help_text
    cfg = parse_args(["--objective", "nsr", "--objective-params", "noise=band", "sigma=0.1",
                      "--task-knobs", "steps=1", "--report-to"])  # fmt: skip
    assert cfg.objective_params == {"noise": "band", "sigma": 0.1}
    assert cfg.task_knobs == {"steps": 1} and cfg.report_to == []
    out = tmp_path / "cli"
    main(["--model", "tiny", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
          "--max-new-tokens", "4", "--no-progress", "--no-save-model", "--out", str(out)])  # fmt: skip
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


# -- bad input: a clear error before any compute ---------------------------------------------------


def _bad(tmp_path, capsys, args, pattern):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exc:
        main(["--model", "tiny", "--steps", "1", "--no-progress", "--out", str(out), *args])
    assert exc.value.code == 2
    assert re.search(pattern, capsys.readouterr().err), pattern
    assert not (out / "metrics.jsonl").exists()


def test_bad_inputs(tmp_path, capsys, monkeypatch):
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
    _bad(tmp_path, capsys, ["--data", str(long), "--chat-template", "off"],
         r"a prompt has 60\d tokens, more than the \d+ allowed")  # fmt: skip
    _bad(tmp_path, capsys, ["--model", "no-such-org/no-such-model-xyz"],
         r"--model 'no-such-org/no-such-model-xyz' is not in the local Hugging Face cache and this "
         r"run is offline")  # fmt: skip
    nopad = tmp_path / "nopad"
    tok = tiny_tokenizer()
    tiny_model(len(tok), 0).save_pretrained(nopad)
    tok.pad_token = None
    tok.save_pretrained(nopad)
    _bad(tmp_path, capsys, ["--model", str(nopad)], r"has no pad token; pass --pad-token")
    _bad(tmp_path, capsys, ["--prompts-per-step", "0"], r"--prompts-per-step must be")


# -- no second copy ---------------------------------------------------------------------------------


def test_objectives_resolve_through_the_sandbox_registry(tmp_path, monkeypatch):
    calls = []
    real = registry.get_objective

    def spy(name, **params):
        calls.append(name)
        return real(name, **params)

    monkeypatch.setattr(registry, "get_objective", spy)
    train(config(tmp_path, objective="cispo", steps=1))
    assert calls and set(calls) == {"cispo"}
    assert objective_choices() == registry.available_objectives() + registry.available_presets()
    for name in objective_choices():
        config(tmp_path, objective=name).validate()
    with pytest.raises(ValueError, match="unknown --objective"):
        config(tmp_path, objective="ppo_loss").validate()


def test_llm_defines_no_loss():
    """No ratio clipping and no loss function anywhere in llm/ (adapters included); the loss of
    llm.train and of the TRL adapter is sandbox.loss.PolicyLoss, assembled nowhere else."""
    root = pathlib.Path(train_mod.__file__).parent
    sources = list(root.rglob("*.py"))
    assert len(sources) >= 10 and any("adapters" in p.parts for p in sources)
    clipping = re.compile(
        r"torch\.clamp\(\s*ratio|ratio\.clamp\(|torch\.min\(\s*\w*ratio|torch\.where\(\s*\w*ratio"
    )
    loss_defs = (
        re.compile(  # verl's plugin interface names its functions *policy_loss: allowed there
            r"\bdef\s+\w*(ppo|pg|grpo|clip)_loss|\bdef\s+\w*surrogate|\bdef\s+compute_loss_\w+"
        )
    )
    for path in sources:
        text = path.read_text()
        assert not clipping.search(text), path
        assert not loss_defs.search(text), path
        if path.name in ("train.py", "trl.py"):  # the loss is PolicyLoss: no term combined here
            assert "PolicyLoss(" in text, path
            for name in ("aggregate(", "kl_divergence(", "rollout_is_weights(", "k3("):
                assert name not in text, (path, name)


# -- rollout/trainer mismatch correction (--rollout-is) --------------------------------------------


def test_generate_returns_the_samplers_logp():
    from llm import logprobs, rollout

    tok, model = tiny_tokenizer(), tiny_model(len(tiny_tokenizer()), 0).eval()
    ids = rollout.encode_prompts(tok, ["1 0", "0 1 1 0"], chat=False, system=None)
    out = rollout.generate(model, tok, ids, group_size=3, max_new_tokens=6, temperature=0.7,
                           prompts_per_call=2, seed_keys=(0,), first_index=0,
                           device=torch.device("cpu"), return_logp=True)  # fmt: skip
    with torch.no_grad():
        lp, _ = logprobs.completion_logp(model, out["prompt"], out["prompt_mask"],
                                        out["completion"], out["completion_mask"], 0.7)  # fmt: skip
    valid = out["completion_mask"].bool()
    assert (out["rollout_logp"][~valid] == 0).all()
    torch.testing.assert_close(out["rollout_logp"][valid], lp[valid], atol=1e-4, rtol=0)


def test_rollout_is_on_policy_weights_are_one(tmp_path):
    rows = train(config(tmp_path, rollout_is="truncate", epochs=2))
    for row in rows:
        for k in ("rollout_is_mean", "rollout_is_clip_frac", "rollout_kl_k3"):
            assert math.isfinite(row[k]), k
        assert abs(row["rollout_is_mean"] - 1) < 1e-3  # CPU fp32: sampler == trainer to ~1e-6
        assert row["rollout_is_clip_frac"] == 0.0 and 0 <= row["rollout_kl_k3"] < 1e-6
    seq = train(config(tmp_path, "seq", rollout_is="mask", rollout_is_level="sequence"))
    assert all(abs(r["rollout_is_mean"] - 1) < 1e-3 and r["rollout_is_masked_frac"] == 0
               for r in seq)  # fmt: skip


def test_rollout_is_forced_mismatch_scales_the_loss(tmp_path, monkeypatch):
    from llm import rollout

    real = rollout.generate

    def shifted(*args, **kw):  # the sampler reports pi_rollout = pi / 1.5: rho = 1.5 per token
        out = real(*args, **kw)
        if "rollout_logp" in out:
            out["rollout_logp"] = out["rollout_logp"] - math.log(1.5) * out["completion_mask"]
        return out

    # seed 2: step 1 has groups with non-zero advantage, on-policy (logp_old = logp)
    base = train(config(tmp_path, "base", steps=1, seed=2))[0]
    assert abs(base["loss"]) > 1e-3
    monkeypatch.setattr(rollout, "generate", shifted)
    cases = [  # (flags, expected weight, fraction name, expected fraction)
        ({"rollout_is": "truncate"}, 1.5, "rollout_is_clip_frac", 0.0),
        ({"rollout_is": "truncate", "rollout_is_max": 1.2}, 1.2, "rollout_is_clip_frac", 1.0),
        ({"rollout_is": "mask", "rollout_is_max": 1.2}, 0.0, "rollout_is_masked_frac", 1.0),
    ]
    for i, (flags, weight, frac, value) in enumerate(cases):
        row = train(config(tmp_path, f"is{i}", steps=1, seed=2, **flags))[0]
        assert row["loss"] == pytest.approx(weight * base["loss"], rel=1e-5, abs=1e-9), flags
        assert row["grad_norm"] == pytest.approx(weight * base["grad_norm"], rel=1e-4), flags
        assert row["rollout_is_mean"] == pytest.approx(weight, rel=1e-5), flags
        assert row[frac] == value
        k3 = 1.5 - 1 - math.log(1.5)
        assert row["rollout_kl_k3"] == pytest.approx(k3, rel=1e-4)
    # sequence level: the product over a completion's tokens, truncated at 2 for any length >= 2
    row = train(config(tmp_path, "seq", steps=1, seed=2, rollout_is="truncate",
                       rollout_is_level="sequence"))[0]  # fmt: skip
    assert row["rollout_is_mean"] > 1.5 and row["rollout_is_clip_frac"] > 0


def test_rollout_is_flags_and_errors(tmp_path, capsys):
    cfg = parse_args(["--rollout-is", "mask", "--rollout-is-level", "sequence",
                      "--rollout-is-min", "0.5", "--rollout-is-max", "3"])  # fmt: skip
    assert (cfg.rollout_is, cfg.rollout_is_level, cfg.rollout_is_min, cfg.rollout_is_max) == (
        "mask", "sequence", 0.5, 3.0)  # fmt: skip
    assert parse_args([]).rollout_is == "none"
    with pytest.raises(ValueError, match=r"--rollout-is-min 3\.0 and --rollout-is-max 2\.0"):
        config(tmp_path, rollout_is="truncate", rollout_is_min=3.0).validate()
    with pytest.raises(ValueError, match="--rollout-is must be one of"):
        config(tmp_path, rollout_is="clip").validate()


def test_vllm_backend_flags_and_errors(tmp_path, monkeypatch):
    # the engine itself is tested in test_llm_vllm.py where vLLM is installed
    cfg = parse_args(["--rollout-backend", "vllm", "--vllm-gpu-memory-utilization", "0.5",
                      "--vllm-sleep", "--vllm-enforce-eager"])  # fmt: skip
    assert (cfg.rollout_backend, cfg.vllm_gpu_memory_utilization, cfg.vllm_sleep,
            cfg.vllm_enforce_eager) == ("vllm", 0.5, True, True)  # fmt: skip
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


def test_vllm_sleep_cycle_pushes_weights_after_every_sleep():
    # --vllm-sleep is CUDA-only, so its state machine is checked with a recording stand-in for
    # vllm.LLM: level-2 sleep discards the weights, so every rollout after a sleep must push them
    # (even with no optimizer step in between) and wake the KV cache before sampling.
    from types import SimpleNamespace

    from llm.vllm_rollout import VLLMRollout

    calls = []
    tok = tiny_tokenizer()
    completion = SimpleNamespace(index=0, token_ids=[5, tok.eos_token_id], logprobs=None)
    worker = SimpleNamespace(reload_weights=lambda **kw: calls.append(("push", len(list(
        kw["weights_iterator"])))))  # fmt: skip
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker)),
        reset_prefix_cache=lambda: calls.append("reset"),
        wake_up=lambda tags: calls.append(("wake", *tags)),
        sleep=lambda level: calls.append(("sleep", level)),
        generate=lambda reqs, sampling_params, use_tqdm: (calls.append("generate"),
                  [SimpleNamespace(outputs=[completion]) for _ in reqs])[1],
    )  # fmt: skip
    engine = object.__new__(VLLMRollout)
    engine.llm, engine.tokenizer, engine.sleep = llm, tok, True
    engine.vllm = SimpleNamespace(SamplingParams=lambda **kw: kw)
    engine.stale = True  # as after __init__ (which, with sleep on, leaves it asleep)
    model = tiny_model(len(tok), 0)
    n_params = len(list(model.parameters()))
    for _ in range(2):  # no optimizer step between the two rollouts
        out = engine.generate(model, [[1, 5]], group_size=1, max_new_tokens=4, temperature=1.0,
                              seed_keys=(0,), first_index=0)  # fmt: skip
        assert out["completion"].tolist() == [[5, tok.eos_token_id]]
    cycle = [("wake", "weights"), ("push", n_params), "reset", ("wake", "kv_cache"), "generate",
             ("sleep", 2)]  # fmt: skip
    assert calls == cycle + cycle


def test_rollout_benchmark_runs():
    # benchmarks/rollout.py at its smallest: the HF rows always, vLLM where installed
    script = pathlib.Path(train_mod.__file__).parents[1] / "benchmarks" / "rollout.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--device", "cpu", "--prompts", "2", "--group-size", "2",
         "--max-new-tokens", "4", "--repeats", "1"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("  ")[0].strip() for line in proc.stdout.splitlines()}
    assert {"hf", "hf, per prompt"} <= rows
    assert "vllm / hf tokens per second" in proc.stdout or "vllm not timed" in proc.stdout
