import pytest
import torch

from sandbox.policies import TinyTransformer, TransformerConfig, clip_grad_norm_per_model

CFG = TransformerConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=4, max_len=32)


def batch(S=3, B=4, Tp=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, 16, (S, B, Tp), generator=g)
    mask = torch.ones(S, B, Tp, dtype=torch.bool)
    mask[:, 1, :2] = False  # left padding
    prompt[:, 1, :2] = 0
    return prompt, mask, g


def test_kv_cache_sampling_matches_a_full_pass():
    model = TinyTransformer(CFG, num_models=3)
    prompt, mask, g = batch()
    comp, cmask = model.generate(prompt, mask, max_new_tokens=12, eos_id=1, pad_id=0, generator=g)
    assert comp.shape[:2] == (3, 4) and comp.shape[-1] <= 12
    # mask is 1 up to and including the first EOS, pad after it
    for s in range(3):
        for b in range(4):
            n = int(cmask[s, b].sum())
            assert torch.all(cmask[s, b, :n]) and not torch.any(cmask[s, b, n:])
            assert torch.all(comp[s, b, n:] == 0)
            if n < comp.shape[-1]:
                assert comp[s, b, n - 1] == 1
    # incremental decoding with the cache gives the full-pass log-probs
    logp, entropy = model.completion_logp(prompt, mask, comp, cmask)
    logits, cache = model(prompt, mask)
    key_mask, pos, steps = mask, mask.long().sum(-1, keepdim=True), []
    nxt = logits[:, :, -1]
    for t in range(comp.shape[-1]):
        lp = torch.log_softmax(nxt, -1).gather(-1, comp[..., t : t + 1]).squeeze(-1)
        steps.append(torch.where(cmask[..., t], lp, 0.0))
        key_mask = torch.cat([key_mask, cmask[..., t : t + 1]], -1)
        logits, cache = model(
            comp[..., t : t + 1],
            cmask[..., t : t + 1],
            cache=cache,
            key_mask=key_mask,
            positions=pos,
        )
        pos = pos + cmask[..., t : t + 1].long()
        nxt = logits[:, :, -1]
    torch.testing.assert_close(torch.stack(steps, -1), logp, rtol=0, atol=1e-5)
    assert torch.all(entropy[cmask] > 0) and torch.all(entropy[~cmask] == 0)


def test_left_padding_does_not_change_the_output():
    model = TinyTransformer(CFG, num_models=2)
    prompt, mask, _ = batch(S=2)
    unpadded, _ = model(prompt[:, 1:2, 2:])
    padded, _ = model(prompt[:, 1:2], mask[:, 1:2])
    torch.testing.assert_close(padded[:, :, 2:], unpadded, rtol=0, atol=1e-5)


def test_models_are_independent():
    """Model s's loss gradient depends only on model s's inputs; clipping is per model."""
    model = TinyTransformer(CFG, num_models=3)
    prompt, mask, _ = batch()
    comp = torch.randint(3, 16, (3, 4, 5))
    cmask = torch.ones_like(comp, dtype=torch.bool)
    grads = []
    for perturb in (False, True):
        model.zero_grad()
        c = comp.clone()
        if perturb:
            c[0] = torch.randint(3, 16, (4, 5))  # change model 0's data only
        logp, _ = model.completion_logp(prompt, mask, c, cmask)
        logp.sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for g0, g1 in zip(*grads, strict=True):
        assert not torch.equal(g0[0], g1[0]) or g0[0].abs().sum() == 0
        torch.testing.assert_close(g0[1:], g1[1:], rtol=0, atol=0)
    norms = clip_grad_norm_per_model(model, max_norm=1e-3)
    assert norms.shape == (3,)
    after = torch.stack(
        [sum(p.grad[s].pow(2).sum() for p in model.parameters()) for s in range(3)]
    ).sqrt()
    torch.testing.assert_close(after, torch.full((3,), 1e-3), rtol=1e-4, atol=0)


def test_bad_config_and_lengths_are_named():
    with pytest.raises(ValueError, match="d_model"):
        TransformerConfig(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        TransformerConfig(vocab_size=0)
    model = TinyTransformer(CFG, num_models=1)
    prompt = torch.randint(3, 16, (1, 1, 30))
    with pytest.raises(ValueError, match="max_len=32"):
        model.generate(
            prompt,
            torch.ones_like(prompt, dtype=torch.bool),
            max_new_tokens=8,
            eos_id=1,
            pad_id=0,
            generator=torch.Generator(),
        )
