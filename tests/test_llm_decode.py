"""The compact K-member decoder (llm.decode, issue 28 item 1) on the tiny Llama, float32, CPU:
members decoded together sample exactly what each samples alone, which is what the Hugging Face
model's own full forward samples with the same noise; the noise is fixed per (key, row, position,
token); no host read in the loop; an ensemble with ``--rollout-backend compact`` logs what its runs
log alone."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("transformers")

from llm import decode
from llm.model import tiny_model, tiny_tokenizer
from sandbox.streams import gumbel_max

CPU = torch.device("cpu")
G, N = 3, 8
# the members' prompts differ in text and length (a study's seeds draw their own)
PROMPTS = [["12+3=", "7*8="], ["1+1=", "99-40="], ["5=", "0+0+0+1="]]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def models(tok):
    return [tiny_model(len(tok), seed) for seed in (0, 1, 2)]


def ids_of(tok, member):
    return [tok(p)["input_ids"] for p in PROMPTS[member]]


def run_decode(models, tok, members, *, first=0, step=3, **kw):
    return decode.generate(
        [models[k] for k in members],
        tok,
        [ids_of(tok, k) for k in members],
        group_size=G,
        max_new_tokens=N,
        temperature=kw.pop("temperature", 1.0),
        seed_keys=[(k, 0, step) for k in members],
        first_index=[first] * len(members),
        device=CPU,
        return_logp=True,
        **kw,
    )


def test_members_together_equal_each_alone(models, tok):
    together = run_decode(models, tok, [0, 1, 2])
    for k in range(3):
        alone = run_decode(models, tok, [k])[0]
        assert alone.keys() == together[k].keys()
        for key in ("prompt", "prompt_mask", "completion", "completion_mask", "truncated"):
            assert torch.equal(together[k][key], alone[key]), (k, key)
        torch.testing.assert_close(
            together[k]["rollout_logp"], alone["rollout_logp"], atol=1e-6, rtol=0
        )
    # the prompts are the members' own widths; the completions stop at EOS in some rows
    assert [o["prompt"].shape[1] for o in together] == [5, 6, 8]
    assert any(o["completion_mask"].sum() < o["completion_mask"].numel() for o in together)


def grouped_and_per_row(models, tok, members, group_size):
    """:func:`llm.decode.decode` of the members' prompts (of different lengths) with one prefill
    per prompt (``group_size``), and today's path: every prompt repeated ``group_size`` times,
    row ``p * G + g``, one prefill per row (``group_size=1``); the same keys and rows."""
    from llm.rollout import stack_left_padded

    K, w = len(members), decode.stack_members([models[k] for k in members])
    prompts = [ids_of(tok, k) for k in members]
    P, pad = len(prompts[0]), tok.pad_token_id
    Tp = decode.bucket(max(len(r) for p in prompts for r in p))
    kw = dict(
        keys=torch.tensor([decode.key_words((k, 0, 3)) for k in members]),
        rows=torch.arange(5 * group_size, (5 + P) * group_size).expand(K, -1),
        max_new_tokens=N,
        temperature=1.0,
        eos_id=tok.eos_token_id,
        pad_id=pad,
    )
    outs = []
    for copies, G in ((1, group_size), (group_size, 1)):
        packed = [
            stack_left_padded([r for r in p for _ in range(copies)], pad, Tp) for p in prompts
        ]
        ids, mask = (torch.stack([x[i] for x in packed]) for i in (0, 1))
        outs.append(decode.decode(w, ids, mask, group_size=G, **kw))
    return outs


@pytest.mark.parametrize("members", [[1], [0, 1, 2]], ids=["K1", "K3"])
@pytest.mark.parametrize("group_size", [G, 8])
def test_one_prefill_per_prompt_samples_what_a_prefill_per_row_samples(
    models, tok, members, group_size, monkeypatch
):
    """Each prompt's prefill runs once (the prefill forward sees P rows, not P x G) and its
    cache and logits reach its G rows: every row samples the tokens it samples from a prefill
    of its own, token for token (float32), log-probs to float rounding, alone and with K - 1
    other members; and the group's rows differ (the noise is per row, not per prompt)."""
    seen, real = [], decode.forward
    monkeypatch.setattr(
        decode, "forward", lambda w, ids, *a: seen.append(tuple(ids.shape)) or real(w, ids, *a)
    )
    (tokens, logp), (tokens_rows, logp_rows) = grouped_and_per_row(models, tok, members, group_size)
    K, P = len(members), len(PROMPTS[0])
    assert seen[0] == (K, P, 16) and seen[N] == (K, P * group_size, 16)  # the two prefills
    assert tokens.shape == (K, P * group_size, N)
    assert torch.equal(tokens, tokens_rows)
    torch.testing.assert_close(logp, logp_rows, atol=1e-6, rtol=0)
    groups = tokens.view(K, P, group_size, N)
    assert all(len({tuple(r.tolist()) for r in g}) > 1 for g in groups.flatten(0, 1))


def test_decode_refuses_rows_not_grouped_as_stated(models, tok):
    """Prompts repeated per row while ``group_size`` says one prompt per group: the rows do not
    match the stated layout, one line says so (and a group size below 1)."""
    w = decode.stack_members(models[:1])
    prompt = torch.full((1, 6, 16), 7)
    kw = dict(
        keys=torch.zeros(1, 2, dtype=torch.long),
        rows=torch.arange(6)[None],
        max_new_tokens=2,
        temperature=1.0,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
    )
    with pytest.raises(ValueError, match=r"rows has shape \(1, 6\); 6 prompts x group_size 3"):
        decode.decode(w, prompt, torch.ones_like(prompt), group_size=3, **kw)
    with pytest.raises(ValueError, match="group_size must be >= 1, got 0"):
        decode.decode(w, prompt, torch.ones_like(prompt), group_size=0, **kw)


def reference_sample(model, out, key, temperature):
    """Sampling from the Hugging Face model's full forward over the growing sequence (no
    cache), with the same noise: what the compact decoder must reproduce."""
    ids, mask = out["prompt"], out["prompt_mask"]
    B, eos = ids.shape[0], model.config.eos_token_id
    words, rows = torch.tensor([decode.key_words(key)]), torch.arange(B)[None]
    done = torch.zeros(B, dtype=torch.bool)
    tokens, logps = [], []
    for t in range(N):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        u = decode.counter_uniform(words, rows, torch.tensor(t), logits.shape[-1])[0]
        token, logp = decode.gumbel_sample(logits[:, -1], u, temperature)
        token = torch.where(done, model.config.pad_token_id, token)
        tokens.append(token)
        logps.append(torch.where(done, 0.0, logp))
        done |= token == eos
        ids = torch.cat([ids, token[:, None]], 1)
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], 1)
    return torch.stack(tokens, 1), torch.stack(logps, 1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equal_to_the_hf_forward_with_the_same_noise(models, tok, temperature):
    """The compact forward (stacked weights, static cache, prompt bucket) is the model's: the
    tokens of a plain full-forward sampler, token for token, log-probs to float rounding."""
    outs = run_decode(models, tok, [0, 1, 2], temperature=temperature)
    for k, out in enumerate(outs):
        tokens, logp = reference_sample(models[k], out, (k, 0, 3), temperature)
        Tc = out["completion"].shape[1]
        assert torch.equal(out["completion"], tokens[:, :Tc]), k
        assert (tokens[:, Tc:] == tok.pad_token_id).all()  # cut after every row's EOS
        torch.testing.assert_close(out["rollout_logp"], logp[:, :Tc], atol=2e-6, rtol=0)


def test_noise_is_fixed_per_row_and_key(models, tok):
    """A row's completion depends on its global index and its run's key only: the same rows
    decoded as a later chunk (``first_index``) reappear there; another step's key draws others."""
    base = run_decode(models, tok, [1])[0]
    words = torch.tensor([decode.key_words((1, 0, 3))])
    u = decode.counter_uniform(words, torch.arange(12)[None], torch.tensor(2), 50)
    again = decode.counter_uniform(words, torch.arange(6, 12)[None], torch.tensor(2), 50)
    assert torch.equal(u[:, 6:], again)  # the same (key, row, position, token), the same number
    other = run_decode(models, tok, [1], step=4)[0]
    assert not torch.equal(base["completion"], other["completion"])
    shifted = run_decode(models, tok, [1], first=2)[0]  # rows 6.. instead of 0..
    assert not torch.equal(base["completion"], shifted["completion"])


def test_gumbel_sample_is_the_streams_race_and_draws_softmax(tok):
    """``gumbel_sample`` is :func:`sandbox.streams.gumbel_max` in logits, and over 20,000 rows
    its draws follow ``softmax(logits / T)`` (chi-square, 5 categories, p > 1e-4 bound)."""
    logits = torch.tensor([0.0, 1.0, -1.0, 2.0, 0.5])
    rows = 20_000
    u = decode.counter_uniform(
        torch.tensor([[7, 11]]), torch.arange(rows)[None], torch.tensor(0), 5
    )
    token, logp = decode.gumbel_sample(logits.expand(1, rows, 5), u, 0.5)
    probs = torch.softmax(logits / 0.5, -1)
    assert torch.equal(token[0], gumbel_max(probs.expand(rows, 5), u[0][:, None])[:, 0])
    torch.testing.assert_close(logp[0], probs.log()[token[0]])
    counts = torch.bincount(token[0], minlength=5).double()
    expected = probs.double() * rows
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 23.5  # the 1e-4 upper quantile of chi-square with 4 degrees of freedom
    assert u.min() > 0 and u.max() < 1


class HostReads(TorchDispatchMode):
    """Counts the operators that read a tensor's value on the host (``.item()``, ``.tolist()``,
    ``bool(tensor)`` all dispatch ``_local_scalar_dense``; ``.cpu()`` a copy to the CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def loop_ops(models, tok, steps, **kw):
    """(host reads, operators dispatched) of :func:`llm.decode.decode` over ``steps`` tokens."""
    K = len(models)
    w = decode.stack_members(models)
    prompt = torch.full((K, 4, 16), tok.pad_token_id)
    prompt[..., -5:] = 7
    with HostReads() as mode:
        decode.decode(
            w,
            prompt,
            (prompt != tok.pad_token_id).long(),
            keys=torch.zeros(K, 2, dtype=torch.long),
            rows=torch.arange(4).expand(K, 4),
            max_new_tokens=steps,
            temperature=1.0,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
            **kw,
        )
    return mode.reads, mode.ops


def test_no_host_read_inside_the_loop(models, tok):
    """The loop reads nothing back, and a step dispatches the same operators whatever K is."""
    per_step = {}
    for K in (1, 3):
        (r4, ops4), (r8, ops8) = (loop_ops(models[:K], tok, n) for n in (4, 8))
        assert r4 == r8 == 0
        per_step[K] = (ops8 - ops4) / 4
    assert per_step[1] == per_step[3] > 0


def test_prompt_buckets():
    assert [decode.bucket(n) for n in (1, 15, 16, 17, 50)] == [16, 16, 16, 32, 64]
    assert decode.bucket(50, limit=56) == 56 and decode.bucket(60, limit=56) == 64


def test_refuses_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11))
    with pytest.raises(ValueError, match="compact decodes llama, qwen2 models, not 'gpt2'"):
        decode.stack_members([gpt2])


def test_compiled_step_is_one_graph_and_samples_the_same_tokens(models, tok):
    """``compile_step`` traces the step whole (``fullgraph``: no graph break) once for all
    steps (no recompile per position) and changes how, not what, is sampled. Traced with the
    ``aot_eager`` backend here (inductor's C++ build takes minutes on 2 cores)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = run_decode(models, tok, [0, 2])
    compiled = run_decode(models, tok, [0, 2], compile_step="aot_eager")
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a["completion"], b["completion"])
        torch.testing.assert_close(a["rollout_logp"], b["rollout_logp"], atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_compiled_step_on_cuda_samples_the_same_tokens(tok):
    """On CUDA, inductor with CUDA graphs: the same tokens as the eager step (float32)."""
    cuda = torch.device("cuda")
    members = [tiny_model(len(tok), seed).to(cuda) for seed in (0, 1)]
    kw = dict(
        group_size=G,
        max_new_tokens=N,
        temperature=1.0,
        seed_keys=[(k, 0, 3) for k in (0, 1)],
        first_index=[0, 0],
        device=cuda,
        return_logp=True,
    )
    prompts = [ids_of(tok, k) for k in (0, 1)]
    eager = decode.generate(members, tok, prompts, **kw)
    compiled = decode.generate(members, tok, prompts, compile_step=True, **kw)
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a["completion"], b["completion"])


RUN = dict(
    model="tiny",
    task="parity",
    task_knobs={"length": 2},
    lr=1e-2,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=8,
    steps=2,
    epochs=2,
    minibatches=2,
    progress=False,
    save_model=False,
    device="cpu",
    rollout_backend="compact",
    eval_every=1,
    eval_prompts=4,
)


def test_compact_ensemble_logs_what_its_runs_log_alone(tmp_path, monkeypatch):
    """Two seeds with ``--rollout-backend compact``: the ensemble decodes both in one loop per
    step (one call of the decoder with K = 2), and each run's metrics.jsonl equals its run
    alone's (rollout and evaluation columns exactly, the update's to float rounding)."""
    import llm.train
    from llm.config import TrainConfig
    from llm.ensemble import train_ensemble
    from llm.train import train

    calls, real = [], llm.train.decode.generate

    def counted(models, *args, **kwargs):
        calls.append(len(models))
        return real(models, *args, **kwargs)

    monkeypatch.setattr(llm.train.decode, "generate", counted)
    cfgs = {
        tag: [TrainConfig(**RUN, seed=s, out=str(tmp_path / f"{tag}{s}")) for s in (0, 1)]
        for tag in ("alone", "ens")
    }
    for cfg in cfgs["alone"]:
        train(cfg)
    alone_calls = list(calls)
    train_ensemble(cfgs["ens"])
    # alone: per step one rollout + one evaluation (and the step-0 evaluation), K = 1
    assert alone_calls == [1] * 2 * (1 + 2 * 2)
    assert calls[len(alone_calls) :].count(2) == 2  # the ensemble's two steps' rollouts
    exact = {"reward", "pass_rate", "reward_std", "completion_len", "truncated_frac"}
    for s in (0, 1):
        rows = [
            [json.loads(line) for line in (tmp_path / f"{tag}{s}/metrics.jsonl").open()]
            for tag in ("alone", "ens")
        ]
        assert [r["step"] for r in rows[1]] == [0, 1, 2]
        for ra, re_ in zip(*rows, strict=True):
            assert list(ra) == list(re_)
            for key, value in ra.items():
                if key in ("tokens_per_s", "step_time"):
                    continue
                if key in exact or key.startswith("eval_"):
                    assert re_[key] == value, (s, key)
                elif isinstance(value, float) and math.isfinite(value):
                    assert re_[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (s, key)


def test_compact_ensemble_trains_under_bf16_autocast(tmp_path, monkeypatch):
    """The compact ensemble's whole step (decoding, the batched old log-probs, the vmapped update)
    under bf16 autocast, the CPU's standing in for CUDA's: on an H200 it failed on SDPA's mixed
    dtypes inside vmap, which a float32 run cannot show (its other failure there, a CUDA row
    index into the CPU completions, no one-device run can show). Every row finite."""
    import llm.train
    from llm.config import TrainConfig
    from llm.ensemble import train_ensemble

    bf16 = property(lambda run: torch.autocast("cpu", dtype=torch.bfloat16))
    monkeypatch.setattr(llm.train.Run, "autocast", bf16)
    cfgs = [TrainConfig(**RUN, seed=s, out=str(tmp_path / f"ens{s}")) for s in (0, 1)]
    rows = train_ensemble(cfgs)
    for run in rows:
        assert [r["step"] for r in run] == [0, 1, 2]
        assert all(math.isfinite(r["loss"]) for r in run if r["step"] > 0), run


def test_the_token_counter_offset_is_the_golden_ratio_word_in_int32_range():
    """``TOKEN_OFFSET`` fits an int32 (Triton refused 0x9E3779B9 as an int32 literal in the
    compiled step on an H200) and gives the same 32-bit words as 0x9E3779B9 for every token id
    of a vocabulary up to 2^18: the noise, and so every sampled token, is unchanged."""
    assert -(2**31) <= decode.TOKEN_OFFSET < 2**31
    ids = torch.arange(2**18)
    assert torch.equal(ids + decode.TOKEN_OFFSET & decode.M32, ids + 0x9E3779B9 & decode.M32)


@pytest.mark.gpu
def test_compact_ensemble_trains_on_cuda_under_bf16_autocast(tmp_path):
    """The benchmark's ensemble path on CUDA with the tiny Llama (bf16 autocast, llm.train's CUDA
    default): decoding, the batched old log-probs and the vmapped update run, every loss finite.
    It failed on an H200 three times on what CPU tests missed; this runs first in a lend."""
    from llm.config import TrainConfig
    from llm.ensemble import train_ensemble

    run = {**RUN, "device": "cuda", "lm_head": "chunked"}
    cfgs = [TrainConfig(**run, seed=s, out=str(tmp_path / f"ens{s}")) for s in (0, 1)]
    rows = train_ensemble(cfgs)
    for member in rows:
        assert [r["step"] for r in member] == [0, 1, 2]
        assert all(math.isfinite(r["loss"]) for r in member if r["step"] > 0), member
