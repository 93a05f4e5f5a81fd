"""Models and tokenizers: ``tiny`` (built in code, no download) or a Hugging Face causal LM.

``tiny`` is a 2-layer Llama (hidden 32, 2 query heads and 1 key/value head of dimension 32, the
smallest head vLLM's CPU attention accepts, so the vLLM backend can run it too) over a character-level tokenizer whose characters are
:data:`envs.reasoning.DEFAULT_CHARS` (every prompt and answer of every ``envs.reasoning`` task),
with ``<pad>``, ``<bos>``, ``<eos>`` and a one-line chat template. Anything else is loaded with
``AutoModelForCausalLM`` / ``AutoTokenizer``; offline (``local_files_only``) it must already be in
the Hugging Face cache or be a local directory, and a failure names the model and the remedy.
"""

from __future__ import annotations

import os
from typing import Any

import torch

TINY = "tiny"
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def tiny_tokenizer() -> Any:
    """A character-level ``PreTrainedTokenizerFast`` (one token per character), built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from envs.reasoning import DEFAULT_CHARS

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(DEFAULT_CHARS)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def tiny_model(vocab_size: int, seed: int, max_positions: int = 512) -> torch.nn.Module:
    """A 2-layer Llama, hidden 32, heads 2 x 32 (1 KV head), initialised from ``seed`` (float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def load_tokenizer(
    name: str, *, offline: bool, pad_token: str | None = None, trust_remote_code: bool = False
) -> Any:
    """The tokenizer of ``name`` with a pad token, or a ``ValueError`` naming the cause."""
    if name == TINY:
        tok = tiny_tokenizer()
    else:
        from transformers import AutoTokenizer

        tok = _load(AutoTokenizer, name, offline, trust_remote_code, what="tokenizer")
    if pad_token is not None:
        if pad_token not in tok.get_vocab():
            raise ValueError(f"--pad-token {pad_token!r} is not in the vocabulary of {name!r}")
        tok.pad_token = pad_token
    if tok.pad_token_id is None:
        raise ValueError(
            f"the tokenizer of {name!r} has no pad token; pass --pad-token TOKEN "
            f"(for example its eos token {tok.eos_token!r}, or a reserved token)"
        )
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer of {name!r} has no eos token; completions cannot end")
    return tok


def load_model(
    name: str,
    *,
    vocab_size: int,
    seed: int,
    offline: bool,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
) -> torch.nn.Module:
    """``tiny`` (built from ``seed``) or a pretrained causal LM (``seed`` is then unused)."""
    if name == TINY:
        return tiny_model(vocab_size, seed).to(dtype)
    from transformers import AutoModelForCausalLM

    return _load(AutoModelForCausalLM, name, offline, trust_remote_code, what="model", dtype=dtype)


def context_length(model: torch.nn.Module) -> int | None:
    """The model's maximum number of positions (prompt + completion), if its config says."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def is_offline(flag: bool) -> bool:
    return flag or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def _load(cls: Any, name: str, offline: bool, trust_remote_code: bool, *, what: str, **kw: Any):
    local = os.path.isdir(name)
    try:
        return cls.from_pretrained(
            name, local_files_only=offline or local, trust_remote_code=trust_remote_code, **kw
        )
    except (OSError, ValueError) as exc:
        where = (
            "the local directory"
            if local
            else "the Hugging Face cache (offline: local_files_only=True)"
            if offline
            else "the Hugging Face Hub"
        )
        raise ValueError(
            f"cannot load the {what} of --model {name!r} from {where}: {exc}\n"
            f"Download it first (`hf download {name}`) on a machine with network access, or pass "
            f"a local directory, or --model tiny."
        ) from exc
