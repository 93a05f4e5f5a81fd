"""llm.train's two loss modifiers (``--off-policy-mask``, ``--top-entropy-quantile``) and the TRL
adapter's use of them: the options of :class:`sandbox.loss.PolicyLoss` (values against TRL's own
masks are in tests/test_loss.py). CPU, the tiny Llama built in code (no download)."""

from __future__ import annotations

import json
import math
import re

import pytest

pytest.importorskip("transformers")

from llm.train import main, needs_sampler_logp, parse_args, train

BASE = [
    "--model",
    "tiny",
    "--task",
    "parity",
    "--task-knobs",
    "length=2",
    "--lr",
    "1e-2",
    "--prompts-per-step",
    "4",
    "--group-size",
    "4",
    "--prompts-per-call",
    "1",
    "--max-new-tokens",
    "8",
    "--no-progress",
    "--no-save-model",
    "--device",
    "cpu",
    "--steps",
    "2",
    "--epochs",
    "2",
]


def rows_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_both_flags_train_two_steps_and_log_the_mask_shares(tmp_path, monkeypatch):
    """epochs=2: the second pass is off-policy, so a tiny threshold drops negative-advantage
    sequences; q = 0.5 masks at most half of each micro-batch's tokens (ties are kept) and, with
    continuous entropies, about half."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "both"
    main([*BASE, "--off-policy-mask", "0.001", "--top-entropy-quantile", "0.5", "--out", str(out)])
    rows = rows_of(out)
    assert len(rows) == 2
    for row in rows:
        assert 0.45 < row["entropy_masked_frac"] <= 0.5
        assert 0.0 <= row["off_policy_masked_frac"] <= 1.0
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
    assert max(row["off_policy_masked_frac"] for row in rows) > 0
    assert json.loads((out / "config.json").read_text())["off_policy_mask"] == 0.001


def test_masks_that_keep_everything_change_nothing(tmp_path):
    """A threshold no KL reaches and q = 1 give the unmasked run's losses and gradients exactly;
    a binding threshold changes them."""
    args = parse_args([*BASE, "--out", str(tmp_path / "plain")])
    plain = train(args)
    args.out, args.off_policy_mask, args.top_entropy_quantile = str(tmp_path / "keep"), 1e9, 1.0
    kept = train(args)
    args.out, args.off_policy_mask = str(tmp_path / "drop"), 0.001
    dropped = train(args)
    for a, b in zip(plain, kept, strict=True):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"])
        assert b["off_policy_masked_frac"] == 0.0 and "entropy_masked_frac" not in b
    assert dropped[-1]["off_policy_masked_frac"] > 0
    assert dropped[-1]["loss"] != plain[-1]["loss"]


def test_flags_parse_and_bad_values_are_one_line_errors(tmp_path, capsys, monkeypatch):
    cfg = parse_args(["--off-policy-mask", "0.5", "--top-entropy-quantile", "0.2"])
    assert (cfg.off_policy_mask, cfg.top_entropy_quantile) == (0.5, 0.2)
    assert (parse_args([]).off_policy_mask, parse_args([]).top_entropy_quantile) == (None, 1.0)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for flags, pattern in [
        (["--off-policy-mask", "0"], r"--off-policy-mask must be None or a finite number > 0"),
        (["--off-policy-mask", "-1"], r"--off-policy-mask must be"),
        (["--off-policy-mask", "inf"], r"--off-policy-mask must be"),
        (["--top-entropy-quantile", "0"], r"--top-entropy-quantile must be a number in \(0, 1\]"),
        (["--top-entropy-quantile", "1.5"], r"--top-entropy-quantile must be"),
    ]:
        out = tmp_path / "bad"
        with pytest.raises(SystemExit) as exc:
            main(["--model", "tiny", "--steps", "1", "--no-progress", "--out", str(out), *flags])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and re.search(pattern, err), (flags, err)
        assert len(err.strip().splitlines()) == 1 and not (out / "metrics.jsonl").exists()


def test_help_lists_both_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--off-policy-mask" in text and "--top-entropy-quantile" in text


def test_the_sampler_logp_is_kept_for_the_mask_only_with_vllm(tmp_path):
    """TRL compares against vLLM's sampling log-probs when it has them, else pi_old."""
    cfg = parse_args(["--off-policy-mask", "0.5", "--out", str(tmp_path)])
    assert not needs_sampler_logp(cfg)
    cfg.rollout_backend = "vllm"
    assert needs_sampler_logp(cfg)
    cfg.off_policy_mask = None
    assert not needs_sampler_logp(cfg)
    cfg.rollout_is = "truncate"
    assert needs_sampler_logp(cfg)


def test_trl_adapter_masks_are_the_loss_assemblys(tmp_path, monkeypatch):
    """SandboxGRPOTrainer applies TRL's two masks through PolicyLoss's options, never TRL's own
    methods, and logs their shares (parity with TRL: tests/test_adapter_trl.py's loss cases)."""
    pytest.importorskip("trl")
    import test_adapter_trl as t
    from trl import GRPOTrainer

    def refuse(*args, **kwargs):
        raise AssertionError("TRL's own mask was called")

    tokenizer = t.tokenizer.__wrapped__()
    ours = t.make_trainer(t.SandboxGRPOTrainer, tmp_path, tokenizer, {"loss_type": "dapo"})
    ours.current_gradient_accumulation_steps = 1
    ours.off_policy_mask_threshold, ours.top_entropy_quantile = 0.02, 0.5
    monkeypatch.setattr(GRPOTrainer, "get_off_policy_mask", refuse)
    monkeypatch.setattr(GRPOTrainer, "get_high_entropy_mask", refuse)
    ours._metrics["train"].clear()
    inputs = t.make_inputs(ours)
    # a sampler 5 nats above the current policy on every token: mean KL ~ 5 > 0.02 on every
    # sequence, so exactly the A < 0 sequences drop
    inputs["sampling_per_token_logps"] = inputs["sampling_per_token_logps"] + 5.0
    ours._compute_loss(ours.model, inputs)
    assert (ours.loss_fn.off_policy_mask, ours.loss_fn.top_entropy_quantile) == (0.02, 0.5)
    logged = ours._metrics["train"]
    rows = inputs["completion_mask"].sum(-1) > 0
    negative = (inputs["advantages"][rows] < 0).float().mean().item()
    assert 0 < negative < 1  # the inputs have both signs, so the share is informative
    assert logged["sandbox/off_policy_masked_frac"][0] == pytest.approx(negative, abs=1e-6)
    assert 0.3 < logged["sandbox/entropy_masked_frac"][0] <= 0.5
    assert "sandbox/entropy" not in logged  # TRL's own "entropy" is logged once
