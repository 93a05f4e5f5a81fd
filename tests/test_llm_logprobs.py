"""llm.logprobs: chunked completion log-probs equal the full-logits path, without [B, T, V] logits.

Checked in float64 on the tiny Llama (tied and untied head): log-probs, entropies and the gradients
of every parameter equal :func:`full_logits_logp` (the pre-chunking path, kept here only as the
reference) with temperature != 1, left-padded prompts, ragged completions and chunk sizes that do
not divide the token count; LoRA (peft) gradients; the entropy modes; ``ChunkedLogProb`` with a bias
against ``torch.autograd.gradcheck``; no tensor of ``B * Tc * V`` elements is ever created (a
``TorchDispatchMode`` sees every op's outputs, forward and backward; the reference does create
one, so the check can fail); refused models; DDP and FSDP2 with 2 processes (torchrun, gloo).
K heads at once (an ensemble's members, a leading member dimension): equal to K separate heads
in values and gradients, against gradcheck, without the ``[K, B, Tc, V]`` logits, and close
to float32 under CUDA bf16 autocast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("transformers")

from llm.logprobs import ChunkedLogProb, LogProbHead, completion_logp, default_chunk_size

V = 60  # vocabulary of the test models (small, so every check is fast)


def full_logits_logp(
    model, prompt, prompt_mask, completion, completion_mask, temperature, *, entropy=None
):
    """The reference: the full ``[B, Tc, V]`` logits in float32 (or the model's float64), as
    ``llm.rollout.completion_logp`` computed them before chunking."""
    input_ids = torch.cat([prompt, completion], 1)
    attention = torch.cat([prompt_mask, completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    Tc = completion.shape[1]
    logits = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        logits_to_keep=Tc + 1,
        use_cache=False,
    ).logits[:, :-1]
    logits = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    logz = torch.logsumexp(logits, -1)
    logp = logits.gather(-1, completion.unsqueeze(-1)).squeeze(-1) - logz
    ent = None
    if entropy is not None:
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = logz - (torch.softmax(logits, -1) * logits).sum(-1)
    return logp, ent


def llama(tied: bool, seed: int = 0, dtype=torch.float64) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=0,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
        for p in model.parameters():  # larger than the default init: peaked, varied softmaxes
            p.data.normal_(0, 0.3)
    return model


def batch(B: int = 3, Tp: int = 5, Tc: int = 7, seed: int = 0):
    """Left-padded prompts and right-padded completions of different lengths (one empty)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, V, (B, Tp), generator=g)
    completion = torch.randint(1, V, (B, Tc), generator=g)
    plen = torch.tensor([Tp, 2, 4, 1, 3][:B])
    clen = torch.tensor([Tc, 3, 0, 5, 1][:B])
    prompt_mask = (torch.arange(Tp) >= Tp - plen[:, None]).long()
    completion_mask = (torch.arange(Tc) < clen[:, None]).long()
    return prompt * prompt_mask, prompt_mask, completion * completion_mask, completion_mask


def loss_and_grads(fn, model, data, temperature, entropy, **kw):
    """A loss mixing log-probs and entropies with fixed weights; its value, outputs and grads."""
    model.zero_grad(set_to_none=True)
    logp, ent = fn(model, *data, temperature, entropy=entropy, **kw)
    mask = data[3].bool()
    w = torch.linspace(-1.0, 2.0, mask.sum().item(), dtype=logp.dtype, device=logp.device)
    loss = (logp[mask] * w).sum()
    if ent is not None and ent.requires_grad:
        loss = loss + (ent[mask] * w.flip(0)).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp, ent, grads


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_equal_to_full_logits(tied, chunk_size):
    model, data = llama(tied), batch()
    mask = data[3].bool()
    ref = loss_and_grads(full_logits_logp, model, data, 0.7, "grad")
    got = loss_and_grads(completion_logp, model, data, 0.7, "grad", chunk_size=chunk_size)
    assert got[0].dtype == torch.float32 or got[0].dtype == ref[0].dtype
    torch.testing.assert_close(got[0][mask], ref[0][mask], rtol=0, atol=1e-12)
    torch.testing.assert_close(got[1][mask], ref[1][mask], rtol=0, atol=1e-12)
    assert (got[0][~mask] == 0).all() and (got[1][~mask] == 0).all()  # masked: not computed
    assert sorted(got[2]) == sorted(ref[2]) and len(got[2]) == (20 if tied else 21)
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], rtol=1e-10, atol=1e-12, msg=name)
    head = model.get_output_embeddings()
    assert type(head) is torch.nn.Linear and head.weight.grad.abs().sum() > 0  # restored, trained


def test_entropy_modes_and_temperature():
    """``metric``: the same entropy, no gradient; None: no entropy; temperature changes values
    exactly as the reference (entropy at tau=0.5 is below tau=2's)."""
    model, data = llama(False), batch(seed=1)
    mask = data[3].bool()
    for tau in (0.5, 2.0):
        ref_lp, ref_ent, ref_g = loss_and_grads(full_logits_logp, model, data, tau, "metric")
        lp, ent, g = loss_and_grads(completion_logp, model, data, tau, "metric", chunk_size=3)
        assert not ent.requires_grad and lp.requires_grad
        torch.testing.assert_close(ent[mask], ref_ent[mask], rtol=0, atol=1e-12)
        torch.testing.assert_close(lp[mask], ref_lp[mask], rtol=0, atol=1e-12)
        for name in ref_g:
            torch.testing.assert_close(g[name], ref_g[name], rtol=1e-10, atol=1e-12)
    lp, ent = completion_logp(model, *data, 1.0)
    assert ent is None
    hot, _ = completion_logp(model, *data, 2.0, entropy="metric")
    cold, _ = completion_logp(model, *data, 0.5, entropy="metric")
    assert not torch.equal(hot, cold)


def test_entropy_only_gradient():
    """A loss of the entropy alone: the backward's entropy-only branch."""
    model, data = llama(True), batch(seed=2)
    mask = data[3].bool()
    grads = []
    for fn in (full_logits_logp, completion_logp):
        model.zero_grad(set_to_none=True)
        _, ent = fn(model, *data, 0.8, entropy="grad")
        ent[mask].sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-10, atol=1e-12)


def test_lora_gradients_equal():
    from peft import LoraConfig, get_peft_model

    data = batch(seed=3)
    model = get_peft_model(llama(False), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for n, p in model.named_parameters():
        if "lora_B" in n:  # non-zero B: the adapter changes the outputs and all grads
            torch.nn.init.normal_(p, std=0.2, generator=torch.Generator().manual_seed(0))
    ref = loss_and_grads(full_logits_logp, model, data, 0.9, "grad")
    got = loss_and_grads(completion_logp, model, data, 0.9, "grad", chunk_size=5)
    assert ref[2] and all("lora_" in n for n in ref[2]) and sorted(got[2]) == sorted(ref[2])
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], rtol=1e-10, atol=1e-12)


def test_chunked_function_gradcheck_with_bias():
    """Bias, chunking and both outputs against finite differences (float64)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 11, (7,), generator=g)

    def f(h, w, b):
        return ChunkedLogProb.apply(h, w, b, y, 0.6, 3, True)

    assert torch.autograd.gradcheck(f, (h, w, b))
    z = (h @ w.T + b) / 0.6  # and the values, by hand
    lp, ent = f(h, w, b)
    torch.testing.assert_close(
        lp, z.log_softmax(-1).gather(-1, y[:, None])[:, 0], rtol=0, atol=1e-12
    )
    p = z.softmax(-1)
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1), rtol=0, atol=1e-12)


class MaxNumel(TorchDispatchMode):
    """Records the largest tensor any op returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_full_logits_tensor():
    """With B * Tc = 48 tokens > hidden 16 (so no parameter-sized tensor reaches B*Tc*V), no op
    forward or backward returns B*Tc*V elements; the reference does (the check can fail)."""
    model, data = llama(True, dtype=torch.float32), batch(B=4, Tp=3, Tc=12, seed=4)
    data = (data[0], data[1], data[2], torch.ones_like(data[3]))  # every position computed
    limit = 4 * 12 * V
    for fn, kw in ((completion_logp, {"chunk_size": 8}), (full_logits_logp, {})):
        with MaxNumel() as seen:
            logp, ent = fn(model, *data, 0.7, entropy="grad", **kw)
            (logp.sum() + ent.sum()).backward()
        if fn is completion_logp:
            assert seen.largest < limit and seen.largest >= 8 * V  # one [chunk, V] block
        else:
            assert seen.largest >= limit


def test_refused_models_and_bad_arguments():
    from peft import LoraConfig, get_peft_model

    model, data = llama(False), batch()
    with pytest.raises(ValueError, match="entropy"):
        completion_logp(model, *data, 1.0, entropy="yes")
    with pytest.raises(ValueError, match="temperature"):
        completion_logp(model, *data, 0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        completion_logp(model, *data, 1.0, chunk_size=0)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        completion_logp(model, *data, 1.0)
    lora_head = get_peft_model(llama(False), LoraConfig(r=2, target_modules=["lm_head"]))
    with pytest.raises(ValueError, match="not a plain torch"):
        completion_logp(lora_head, *data, 1.0)
    assert default_chunk_size(151_936) == 220 and default_chunk_size(10**9) == 1


def test_head_restored_after_error():
    model, data = llama(False), batch()
    head = model.lm_head
    with pytest.raises(Exception):  # noqa: B017 - the model's own error for a bad position
        completion_logp(model, data[0] + 1000, *data[1:], 1.0)
    assert model.lm_head is head


DIST_WORKER = textwrap.dedent(
    """
    import gc, sys, torch, torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from test_llm_logprobs import batch, full_logits_logp, llama
    from llm import dist as ldist
    from llm.logprobs import completion_logp


    def check(info, device):
        done = []
        data = batch(B=4, seed=7)
        rows = slice(2 * info.rank, 2 * info.rank + 2)
        mask = data[3][rows].bool()
        ref = llama(True)
        lp, en = full_logits_logp(ref, *data, 0.7, entropy="grad")
        (lp[data[3].bool()].sum() + 0.5 * en[data[3].bool()].sum()).backward()
        for fsdp in (False, True):
            policy = ldist.wrap(llama(True), info, device, fsdp)
            logp, ent = completion_logp(policy, *(x[rows] for x in data), 0.7, entropy="grad",
                                        chunk_size=3)
            ((logp[mask].sum() + 0.5 * ent[mask].sum()) * info.world).backward()  # ranks averaged
            torch.testing.assert_close(logp[mask], lp[rows][mask], rtol=0, atol=1e-12)
            worst = 0.0
            for (name, p), q in zip(policy.named_parameters(), ref.parameters(), strict=True):
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                worst = max(worst, ((g - q.grad).abs().max() / q.grad.abs().max()).item())
            assert worst < 1e-10, (fsdp, worst)
            done.append("fsdp" if fsdp else "ddp")
        return done


    info, device = ldist.init("cpu", "gloo")
    done = check(info, device)
    with open(f"{{sys.argv[1]}}/rank{{info.rank}}", "w") as f:
        f.write(" ".join(done))
    # the DDP reducer and FSDP2's mesh hold the process group: free them, then wait for the other
    # rank, before destroying it; a group still referenced at interpreter exit can abort the process
    # ("terminate called without an active exception") after every check has passed
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_ddp_and_fsdp2_two_processes(tmp_path):
    """2 CPU processes (torchrun, gloo), each with half the rows: the wrapped model's gradients
    (DDP-reduced, then FSDP2-sharded; tied head included) equal the full-logits gradients of all
    rows on one unwrapped model."""
    from test_llm_dist import free_port

    script = tmp_path / "worker.py"
    script.write_text(DIST_WORKER.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(script),
        str(tmp_path),
    ]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.skip("distributed run timed out (no usable port / gloo here?)")
    if proc.returncode != 0 and "Address already in use" in proc.stderr:
        pytest.skip("port taken")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["ddp fsdp"] * 2


@pytest.mark.gpu
def test_cuda_bf16_autocast_close_to_float32():
    """On CUDA under bf16 autocast (llm.train's setting) the chunked path stays within bf16
    rounding of the exact float32 full-logits values and gradients (not run without CUDA)."""
    model, data = llama(True, dtype=torch.float32).cuda(), [x.cuda() for x in batch(seed=8)]
    mask = data[3].bool()
    ref = loss_and_grads(full_logits_logp, model, data, 0.7, "grad")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = loss_and_grads(completion_logp, model, data, 0.7, "grad", chunk_size=4)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0][mask], ref[0][mask], rtol=0, atol=5e-2)
    torch.testing.assert_close(got[1][mask], ref[1][mask], rtol=0, atol=5e-2)
    for name in ref[2]:
        scale = ref[2][name].abs().max()
        assert (got[2][name] - ref[2][name]).abs().max() <= 5e-2 * scale, name


# --------------------------------------------------------------------------------------------------
# K heads at once (an ensemble's members): ChunkedLogProb / LogProbHead with a member dimension
# --------------------------------------------------------------------------------------------------

# kept tokens per (member, row): ragged and unequal across members, one member with none at all
MEMBER_LENGTHS = {
    "ragged": ((7, 3, 0), (5, 5, 5), (1, 0, 2)),
    "empty member": ((7, 3, 0), (0, 0, 0), (2, 6, 1)),
}


def member_heads(lengths, *, with_bias: bool, Tc: int = 7, H: int = 5, Vk: int = 11, seed=0):
    """K = 3 heads' inputs (float64): hidden ``[K, B, Tc + 1, H]``, weight ``[K, Vk, H]``, bias
    ``[K, Vk]`` or None, targets and mask ``[K, B, Tc]`` (masked targets are out of range: the
    batched head must not read them)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    K, B = lengths.shape
    hidden = torch.randn(K, B, Tc + 1, H, dtype=torch.float64, generator=g)
    weight = torch.randn(K, Vk, H, dtype=torch.float64, generator=g)
    bias = torch.randn(K, Vk, dtype=torch.float64, generator=g) if with_bias else None
    mask = (torch.arange(Tc) < lengths[..., None]).long()
    targets = torch.randint(0, Vk, (K, B, Tc), generator=g).masked_fill(mask == 0, 10**6)
    return hidden, weight, bias, targets, mask


def head_stats_and_grads(inputs, entropy, batched: bool, chunk_size: int = 3):
    """``(logp, ent, grads)`` ``[K, B, Tc]`` of one batched :class:`LogProbHead` (``batched``) or
    K separate ones, temperature 0.7, under a loss of fixed weights on logp (and ent with
    ``entropy="grad"``; ``"metric"``: computed, detached)."""
    hidden, weight, bias, targets, mask = inputs
    leaves = [x.clone().requires_grad_() for x in (hidden, weight, bias) if x is not None]
    h, w, b = (*leaves, None)[:3]
    kw = dict(temperature=0.7, chunk_size=chunk_size, with_entropy=entropy is not None)

    def head(k):
        linear = SimpleNamespace(weight=w[k], bias=None if b is None else b[k])
        return LogProbHead(linear, targets[k], mask[k], **kw)(h[k])

    stats = head(slice(None)) if batched else torch.stack([head(k) for k in range(len(w))])
    logp, ent = stats[..., 0], None if entropy is None else stats[..., 1]
    ent = ent.detach() if entropy == "metric" else ent
    weights = torch.linspace(-1, 2, logp.numel(), dtype=logp.dtype, device=logp.device)
    weights = weights.view(logp.shape)
    loss = (logp * weights).sum()
    if entropy == "grad":
        loss = loss + (ent * weights.flip(-1)).sum()
    loss.backward()
    return logp, ent, [x.grad for x in leaves]


@pytest.mark.parametrize("entropy", [None, "metric", "grad"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("lengths", list(MEMBER_LENGTHS), ids=list(MEMBER_LENGTHS))
def test_member_heads_equal_separate_heads(entropy, with_bias, lengths):
    """One LogProbHead over K = 3 members' heads (temperature 0.7, chunks of 3 rows that do not
    divide any member's kept tokens) equals K separate LogProbHead calls: log-probs, entropies,
    and the gradients of hidden, weight and bias (float64); 0 where masked, in value and in the
    hidden states' gradient."""
    inputs = member_heads(MEMBER_LENGTHS[lengths], with_bias=with_bias)
    logp, ent, grads = head_stats_and_grads(inputs, entropy, batched=True)
    ref_logp, ref_ent, ref_grads = head_stats_and_grads(inputs, entropy, batched=False)
    mask = inputs[4].bool()
    assert logp.shape == mask.shape and (logp[mask] < 0).all() and (logp[~mask] == 0).all()
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-12)
    if entropy is None:
        assert ent is None and ref_ent is None
    else:
        assert (ent[mask] > 0).all() and (ent[~mask] == 0).all()
        torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)
    assert len(grads) == 3 if with_bias else 2
    for g, ref in zip(grads, ref_grads, strict=True):
        assert g.abs().max() > 0.1  # the loss reaches every leaf
        torch.testing.assert_close(g, ref, rtol=0, atol=1e-12)
    hidden_grad = grads[0][..., :-1, :]  # position t-1 predicts token t
    assert (hidden_grad[~mask] == 0).all() and (grads[0][..., -1, :] == 0).all()


def test_member_chunked_function_gradcheck_with_bias():
    """ChunkedLogProb with a member dimension (K = 2 heads, bias, chunks of 3 of 7 rows, both
    outputs) against finite differences, and its values against each member's softmax by hand."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(2, 11, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(2, 11, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 11, (2, 7), generator=g)

    def f(h, w, b):
        return ChunkedLogProb.apply(h, w, b, y, 0.6, 3, True)

    assert torch.autograd.gradcheck(f, (h, w, b))
    lp, ent = f(h, w, b)
    for k in range(2):
        z = (h[k] @ w[k].T + b[k]) / 0.6
        torch.testing.assert_close(
            lp[k], z.log_softmax(-1).gather(-1, y[k, :, None])[:, 0], rtol=0, atol=1e-12
        )
        p = z.softmax(-1)
        torch.testing.assert_close(ent[k], -(p * p.log()).sum(-1), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"hidden, weight, targets must be"):
        ChunkedLogProb.apply(h, w[0], b[0], y, 0.6, 3, True)


def test_member_heads_no_full_logits_tensor():
    """K = 3 heads, B * Tc = 48 kept tokens each, chunks of 8 rows: no op forward or backward
    returns K * B * Tc * V elements (one [K, 8, V] block at a time); with one chunk of all 48 rows
    the [K, 48, V] logits do exist (so the check can fail)."""
    inputs = member_heads(((12,) * 4,) * 3, with_bias=True, Tc=12, H=16, Vk=V)
    limit = 3 * 48 * V
    for chunk_size in (8, 48):
        with MaxNumel() as seen:
            head_stats_and_grads(inputs, "grad", batched=True, chunk_size=chunk_size)
        assert (seen.largest < limit) == (chunk_size == 8)
    hidden, weight, bias, targets, mask = inputs
    head = LogProbHead(
        SimpleNamespace(weight=weight, bias=bias),
        targets,
        mask,
        temperature=1.0,
        chunk_size=8,
        with_entropy=False,
        kernel="trl",
    )
    with pytest.raises(ValueError, match="kernel 'trl' has no batched form"):
        head(hidden)


@pytest.mark.gpu
def test_cuda_bf16_member_heads_close_to_float32():
    """On CUDA under bf16 autocast the batched head (its float32 weight gradient accumulated by
    ``baddbmm(out_dtype=float32)``) stays within bf16 rounding of K separate float32 heads (not
    run without CUDA)."""
    inputs = member_heads(MEMBER_LENGTHS["ragged"], with_bias=True, H=16, Vk=V)
    inputs = [x.float().cuda() if x.is_floating_point() else x.cuda() for x in inputs]
    ref = head_stats_and_grads(inputs, "grad", batched=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = head_stats_and_grads(inputs, "grad", batched=True)
    assert got[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in got[2])
    # bf16 rounds each logit to 2^-8 relative: a log-prob of magnitude ~25 moves by ~0.1, so an
    # absolute 5e-2 alone failed on an H200 (0.139 at 0.55% relative, 2026-11-26); 4 units of 2^-8
    bf16 = dict(rtol=4 * 2**-8, atol=5e-2)
    torch.testing.assert_close(got[0], ref[0], **bf16)
    torch.testing.assert_close(got[1], ref[1], **bf16)
    for g, r in zip(got[2], ref[2], strict=True):
        assert (g - r).abs().max() <= 5e-2 * r.abs().max()
