"""sandbox.loss.PolicyLoss: the one loss assembly equals the formula the trainers used to write
out inline (objective -> IS weight -> aggregate -> + beta * KL -> - entropy bonus), for every
combination of the optional terms, in value and in gradient."""

from __future__ import annotations

import itertools

import pytest
import torch

from sandbox.aggregate import AGGREGATION_MODES, aggregate
from sandbox.correction import rollout_is_weights
from sandbox.kl import kl_divergence
from sandbox.loss import PolicyLoss, masked_mean
from sandbox.masks import high_entropy_mask, masked_quantile, off_policy_mask
from sandbox.objectives import available_objectives, get_objective

B, T = 6, 5


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    return {
        "logp": (logp_old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)),
        "logp_old": logp_old,
        "adv": torch.randn(B, 1, generator=g, dtype=torch.float64),
        "mask": mask,
        "logp_ref": logp_old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "rollout_logp": logp_old + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "entropy": torch.rand(B, T, generator=g, dtype=torch.float64) * 2,
    }


def inline_formula(objective, mode, kl_coef, entropy_coef, rollout_is, x, counts):
    """llm.train's loop before the assembly existed, term by term."""
    out = objective(x["logp"], x["logp_old"], x["adv"], x["mask"])
    per_token = out.loss
    if rollout_is != "none":
        w, _ = rollout_is_weights(x["logp_old"], x["rollout_logp"], x["mask"], mode=rollout_is)
        per_token = per_token * w
    loss = aggregate(per_token, x["mask"], mode, **counts)
    if kl_coef > 0:
        kl = kl_divergence(x["logp"], x["logp_ref"], "k3")
        loss = loss + kl_coef * aggregate(kl, x["mask"], mode, **counts)
    if entropy_coef > 0:
        loss = loss - entropy_coef * aggregate(x["entropy"], x["mask"], mode, **counts)
    return loss


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize(
    ("kl_coef", "entropy_coef", "rollout_is"),
    list(itertools.product((0.0, 0.1), (0.0, 0.01), ("none", "truncate", "mask"))),
)
def test_assembly_equals_inline_formula(mode, kl_coef, entropy_coef, rollout_is):
    objective = get_objective("dapo")
    counts = {"num_tokens": 40.0, "num_seqs": 9.0, "max_len": 8}  # a larger minibatch's counts
    grads = []
    for assembled in (False, True):
        x = batch()
        x["logp"].requires_grad_(True)
        x["entropy"].requires_grad_(True)
        if assembled:
            fn = PolicyLoss(
                objective, mode, kl_coef=kl_coef, entropy_coef=entropy_coef, rollout_is=rollout_is
            )
            loss = fn(
                x["logp"],
                x["logp_old"],
                x["adv"],
                x["mask"],
                logp_ref=x["logp_ref"],
                rollout_logp=x["rollout_logp"],
                entropy=x["entropy"],
                **counts,
            ).loss
        else:
            loss = inline_formula(objective, mode, kl_coef, entropy_coef, rollout_is, x, counts)
        loss.backward()
        grads.append((loss.detach(), x["logp"].grad, x["entropy"].grad))
    (l0, g0, e0), (l1, g1, e1) = grads
    torch.testing.assert_close(l1, l0, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g1, g0, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(e1, e0, rtol=1e-12, atol=1e-14)


def test_metrics_collect_every_term():
    x = batch()
    fn = PolicyLoss(
        get_objective("ppo_clip"), kl_coef=0.1, entropy_coef=0.01, rollout_is="truncate"
    )
    out = fn(
        x["logp"],
        x["logp_old"],
        x["adv"],
        x["mask"],
        logp_ref=x["logp_ref"],
        rollout_logp=x["rollout_logp"],
        entropy=x["entropy"],
    )
    kl = kl_divergence(x["logp"], x["logp_ref"], "k3")
    valid = x["mask"].bool()
    assert out.metrics["kl_ref_k3"].item() == pytest.approx(kl[valid].mean().item(), rel=1e-12)
    assert out.metrics["entropy"].item() == pytest.approx(
        x["entropy"][valid].mean().item(), rel=1e-12
    )
    assert {"clip_low_frac", "clip_high_frac", "rollout_is_mean", "rollout_kl_k3"} <= set(
        out.metrics
    )
    assert all(v.dim() == 0 and not v.requires_grad for v in out.metrics.values())


def test_kl_weight_multiplies_the_kl_term_and_its_metric():
    x = batch()
    w = torch.full((B, T), 2.0, dtype=torch.float64)
    fn = PolicyLoss(get_objective("ppo_clip"), kl_coef=0.5)
    args = (x["logp"], x["logp_old"], x["adv"], x["mask"])
    plain = fn(*args, logp_ref=x["logp_ref"])
    weighted = fn(*args, logp_ref=x["logp_ref"], kl_weight=w)
    policy_only = PolicyLoss(get_objective("ppo_clip"))(*args).loss
    # loss = pg + 0.5 * KL: doubling the KL term adds the KL term once more
    torch.testing.assert_close(weighted.loss - plain.loss, plain.loss - policy_only)
    torch.testing.assert_close(weighted.metrics["kl_ref_k3"], 2 * plain.metrics["kl_ref_k3"])


def test_extra_weights_scale_the_objective_only():
    x = batch()
    half = torch.full((B, T), 0.5, dtype=torch.float64)
    fn = PolicyLoss(get_objective("ppo_clip"), kl_coef=0.3)
    args = (x["logp"], x["logp_old"], x["adv"], x["mask"])
    full = fn(*args, logp_ref=x["logp_ref"]).loss
    halved = fn(*args, logp_ref=x["logp_ref"], weights=[half]).loss
    pg = PolicyLoss(get_objective("ppo_clip"))(*args).loss
    torch.testing.assert_close(full - halved, 0.5 * pg)


@pytest.mark.parametrize("name", [n for n in available_objectives() if n in ("clip_cov", "kl_cov")])
def test_batch_statistic_objective_is_called_once_per_group(name):
    """groups=S with a batch-statistic objective equals S separate calls, each aggregated alone."""
    objective = get_objective(name)
    assert objective.batch_statistic
    x = batch()
    S = 2
    fn = PolicyLoss(objective, "token-mean")
    gen = torch.Generator().manual_seed(3)
    out = fn(x["logp"], x["logp_old"], x["adv"], x["mask"], groups=S, generator=gen)
    gen = torch.Generator().manual_seed(3)
    expected, n = 0.0, B // S
    for s in range(S):
        rows = slice(s * n, (s + 1) * n)
        o = objective(
            x["logp"][rows], x["logp_old"][rows], x["adv"][rows], x["mask"][rows], generator=gen
        )
        expected = expected + aggregate(o.loss, x["mask"][rows], "token-mean")
    torch.testing.assert_close(out.loss, expected)
    assert all(v.shape == (S,) for v in out.metrics.values())


def test_only_clip_cov_and_kl_cov_are_batch_statistic():
    flagged = {n for n in available_objectives() if get_objective(n).batch_statistic}
    assert flagged == {"clip_cov", "kl_cov"}


def test_masked_mean_ignores_padding_and_empty_masks():
    x = torch.tensor([[1.0, 100.0], [3.0, 5.0]])
    m = torch.tensor([[1, 0], [1, 1]])
    assert masked_mean(x, m).item() == pytest.approx(3.0)
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


@pytest.mark.parametrize(
    ("kwargs", "call", "match"),
    [
        ({"kl_coef": 0.1}, {}, "logp_ref"),
        ({"entropy_coef": 0.1}, {}, "entropy"),
        ({"rollout_is": "truncate"}, {}, "rollout_logp"),
        ({"kl_coef": -1.0}, None, "kl_coef"),
        ({"entropy_coef": float("nan")}, None, "entropy_coef"),
        ({"rollout_is": "clip"}, None, "rollout_is"),
        ({"rollout_is_level": "batch"}, None, "rollout_is_level"),
        ({"aggregation": "mean"}, None, "aggregation"),
        ({"kl_estimator": "k4"}, None, "kl_estimator"),
    ],
)
def test_bad_input_names_the_argument(kwargs, call, match):
    x = batch()
    with pytest.raises(ValueError, match=match):
        fn = PolicyLoss(get_objective("dapo"), **kwargs)
        fn(x["logp"], x["logp_old"], x["adv"], x["mask"], **(call or {}))


def test_objective_must_be_an_objective():
    with pytest.raises(ValueError, match="objective"):
        PolicyLoss("dapo")  # type: ignore[arg-type]


def test_an_all_padding_micro_batch_gives_zero_without_validation():
    """llm.train runs a stand-in micro-batch with an all-zero mask on a rank that has no rows
    (every rank must call backward): with validate=False the loss is 0 and backward works."""
    x = batch()
    x["logp"].requires_grad_(True)
    fn = PolicyLoss(get_objective("dapo"), kl_coef=0.1, entropy_coef=0.01)
    zero = torch.zeros_like(x["mask"])
    out = fn(
        x["logp"],
        x["logp_old"],
        x["adv"],
        zero,
        logp_ref=x["logp_ref"],
        entropy=x["entropy"],
        validate=False,
        num_tokens=10.0,
        num_seqs=3.0,
    )
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.count_nonzero(x["logp"].grad) == 0
    with pytest.raises(ValueError, match="mask"):
        fn(x["logp"], x["logp_old"], x["adv"], zero, logp_ref=x["logp_ref"], entropy=x["entropy"])


# --------------------------------------------------------------------------------------------------
# The two modifiers (sandbox.masks): off-policy sequence mask, high-entropy token mask
# --------------------------------------------------------------------------------------------------


class _OneProcess:
    """The ``accelerator`` TRL's get_high_entropy_mask reads: one process, nothing to gather."""

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x

    def gather(self, x):
        return x


def _trl_entropy_mask(entropy, mask, q):
    from trl import GRPOTrainer

    holder = type("Holder", (), {"accelerator": _OneProcess()})()
    return GRPOTrainer.get_high_entropy_mask(holder, entropy, mask, 1 - q)


@pytest.mark.parametrize("threshold", [0.005, 0.05, 0.2])
@pytest.mark.parametrize("adv_shape", ["B1", "B", "BT"])
def test_off_policy_mask_equals_trls(threshold, adv_shape):
    """TRL's own get_off_policy_mask on the same float64 tensors, NaN sampler tokens included."""
    trl = pytest.importorskip("trl.trainer.grpo_trainer")
    g = torch.Generator().manual_seed(11)
    for _ in range(20):
        x = batch(int(torch.randint(1000, (1,), generator=g)))
        sampler = x["rollout_logp"].clone()
        sampler[0, 2] = float("nan")
        adv = {"B1": x["adv"], "B": x["adv"][:, 0], "BT": torch.randn(B, T, dtype=torch.float64)}
        adv = adv[adv_shape]
        theirs = trl.GRPOTrainer.get_off_policy_mask(
            adv if adv.dim() == 2 else adv[:, None], x["logp"], sampler, x["mask"], threshold
        )
        keep, frac = off_policy_mask(x["logp"], sampler, adv, x["mask"], threshold)
        assert keep.shape == theirs.shape and torch.equal(keep, theirs.to(keep.dtype))
        assert frac.dim() == 0
        if adv_shape != "BT":  # share of the non-empty sequences dropped (all 6 are non-empty)
            assert frac.item() == pytest.approx((1 - keep).sum().item() / B, abs=1e-15)


def test_off_policy_mask_hand_cases():
    """Mean k1 KL of sequence 0 is (0.25 + 0.75) / 2 = 0.5 exactly (the padded 9.0 is ignored)."""
    logp = torch.zeros(4, 3, dtype=torch.float64)
    sampler = torch.tensor([[0.25, 0.75, 9.0]] * 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]] * 4)
    adv = torch.tensor([[-1.0], [-1.0], [1.0], [0.0]], dtype=torch.float64)
    keep, frac = off_policy_mask(logp, sampler, adv, mask, 0.5)  # at the threshold: kept
    assert keep.flatten().tolist() == [1.0, 1.0, 1.0, 1.0] and frac.item() == 0.0
    keep, frac = off_policy_mask(logp, sampler, adv, mask, 0.4999)  # A < 0 above it: dropped
    assert keep.flatten().tolist() == [0.0, 0.0, 1.0, 1.0]  # A > 0 and A = 0 are never dropped
    assert frac.item() == 0.5


def test_off_policy_mask_is_detached_and_uses_rollout_logp_when_given():
    """The mask weights the objective's loss only: the loss equals extra weights of sg(M)."""
    x = batch()
    x["logp_old"] = x["logp"] + 0.3  # mean KL 0.3 against pi_old, 0.01 against the sampler
    x["rollout_logp"] = x["logp"] + 0.01
    keep_old, _ = off_policy_mask(x["logp"], x["logp_old"], x["adv"], x["mask"], 0.1)
    keep_roll, _ = off_policy_mask(x["logp"], x["rollout_logp"], x["adv"], x["mask"], 0.1)
    assert keep_old.flatten().tolist() == (x["adv"] >= 0).double().flatten().tolist()
    assert 0 < keep_old.sum() < B and keep_roll.sum() == B
    for rollout_logp, keep in ((None, keep_old), (x["rollout_logp"], keep_roll)):
        grads = []
        for masked in (True, False):
            lp = x["logp"].clone().requires_grad_(True)
            fn = PolicyLoss(
                get_objective("dapo"), kl_coef=0.1, off_policy_mask=0.1 if masked else None
            )
            out = fn(
                lp,
                x["logp_old"],
                x["adv"],
                x["mask"],
                logp_ref=x["logp_ref"],
                rollout_logp=rollout_logp,
                weights=() if masked else (keep,),
            )
            out.loss.backward()
            grads.append((out.loss.detach(), lp.grad))
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("q", [0.01, 0.2, 0.5, 0.8, 0.95, 1.0])
def test_high_entropy_mask_equals_trls(q):
    """TRL's own get_high_entropy_mask on the same float64 tensors, with and without ties (both
    take the threshold in float32; q = 0.95 at n = 21 valid tokens puts the rank at exactly 1)."""
    pytest.importorskip("trl")
    g = torch.Generator().manual_seed(5)
    for trial in range(30):
        entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 3
        if trial % 2:
            entropy = (entropy * 2).round() / 2  # many ties
        mask = (torch.rand(B, T, generator=g) > 0.3).long()
        keep, frac = high_entropy_mask(entropy, mask, q)
        theirs = _trl_entropy_mask(entropy, mask, q)
        assert torch.equal(keep.bool(), theirs)
        assert frac.item() == pytest.approx(1 - theirs.sum().item() / mask.sum().item(), abs=1e-15)


def test_masked_quantile_equals_torch_quantile_in_float64():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 40, generator=g, dtype=torch.float64)
    valid = torch.rand(3, 40, generator=g) > 0.4
    for p in (0.0, 0.13, 0.5, 0.8, 1.0):
        got = masked_quantile(x, valid, p)
        for r in range(3):
            assert got[r, 0] == torch.quantile(x[r][valid[r]], p)  # bit-identical


def test_high_entropy_mask_hand_cases():
    h = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 99.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])  # 99 is padding: never kept, not in the pool
    # q = 0.5: rank (1 - 0.5) * 4 = 2 -> tau = 2, kept {2, 3, 4}
    keep, frac = high_entropy_mask(h, mask, 0.5)
    assert keep.tolist() == [[0, 0, 1, 1, 1, 0]] and frac.item() == pytest.approx(0.4)
    # q = 0.3: rank 0.7 * 4 = 2.8 -> tau = 2 + 0.8 * (3 - 2) = 2.8, kept {3, 4}
    keep, _ = high_entropy_mask(h, mask, 0.3)
    assert keep.tolist() == [[0, 0, 0, 1, 1, 0]]
    # ties: sorted [1, 2, 2, 2, 3], q = 0.4: rank 0.6 * 4 = 2.4 between two 2s -> tau = 2;
    # every tied token is kept, so 4 of 5 (80 %) survive a 40 % quantile
    tied = torch.tensor([[2.0, 1.0, 2.0, 3.0, 2.0]], dtype=torch.float64)
    keep, frac = high_entropy_mask(tied, torch.ones(1, 5), 0.4)
    assert keep.tolist() == [[1, 0, 1, 1, 1]] and frac.item() == pytest.approx(0.2)
    # equal entropies everywhere: the threshold is that value, nothing is masked
    keep, frac = high_entropy_mask(torch.ones(2, 3), torch.ones(2, 3), 0.2)
    assert keep.sum().item() == 6 and frac.item() == 0.0


def test_high_entropy_mask_per_group_and_pool():
    """groups=S: each block its own threshold (= separate calls); pool: the threshold of the
    pool's tokens (here the call's own, so the same)."""
    x = batch()
    keep, frac = high_entropy_mask(x["entropy"], x["mask"], 0.3, groups=2)
    n = B // 2
    parts = [
        high_entropy_mask(x["entropy"][s * n : (s + 1) * n], x["mask"][s * n : (s + 1) * n], 0.3)[0]
        for s in range(2)
    ]
    assert torch.equal(keep, torch.cat(parts))
    valid = x["mask"].sum()
    assert frac.item() == pytest.approx(((valid - keep.sum()) / valid).item(), abs=1e-15)
    assert not torch.equal(keep, high_entropy_mask(x["entropy"], x["mask"], 0.3)[0])
    own = high_entropy_mask(x["entropy"], x["mask"], 0.3, pool=(x["entropy"], x["mask"]))
    assert torch.equal(own[0], high_entropy_mask(x["entropy"], x["mask"], 0.3)[0])
    low = (torch.zeros(2, 2), torch.ones(2, 2))  # a pool of zeros: threshold 0, all kept
    assert high_entropy_mask(x["entropy"], x["mask"], 0.3, pool=low)[1].item() == 0.0
    with pytest.raises(ValueError, match="pool"):
        high_entropy_mask(x["entropy"], x["mask"], 0.3, groups=2, pool=low)


def test_entropy_mask_in_the_assembly_weights_the_objective_only():
    x = batch()
    keep, _ = high_entropy_mask(x["entropy"], x["mask"], 0.4)
    grads = []
    for masked in (True, False):
        lp = x["logp"].clone().requires_grad_(True)
        ent = x["entropy"].clone().requires_grad_(True)
        fn = PolicyLoss(
            get_objective("ppo_clip"),
            kl_coef=0.1,
            entropy_coef=0.01,
            top_entropy_quantile=0.4 if masked else 1.0,
        )
        out = fn(
            lp,
            x["logp_old"],
            x["adv"],
            x["mask"],
            logp_ref=x["logp_ref"],
            entropy=ent,
            weights=() if masked else (keep,),
        )
        out.loss.backward()
        grads.append((out.loss.detach(), lp.grad, ent.grad))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-13, atol=1e-15)
    fn = PolicyLoss(get_objective("ppo_clip"), top_entropy_quantile=0.4)
    metrics = fn(x["logp"], x["logp_old"], x["adv"], x["mask"], entropy=x["entropy"]).metrics
    valid = x["mask"].sum().item()
    assert metrics["entropy_masked_frac"].item() == pytest.approx(
        (valid - keep.sum().item()) / valid, abs=1e-15
    )


def test_quantile_one_is_a_no_op():
    """q = 1 keeps every token: the same loss without entropies, and no metric."""
    x = batch()
    args = (x["logp"], x["logp_old"], x["adv"], x["mask"])
    plain = PolicyLoss(get_objective("dapo"))(*args)
    one = PolicyLoss(get_objective("dapo"), top_entropy_quantile=1.0)(*args)
    assert torch.equal(one.loss, plain.loss) and "entropy_masked_frac" not in one.metrics
    h = x["entropy"].float()  # the function itself at q = 1: tau = the float32 minimum
    keep, frac = high_entropy_mask(h, x["mask"], 1.0)
    assert torch.equal(keep, x["mask"].float()) and frac.item() == 0.0


def test_all_masked_micro_batch_is_a_finite_zero_without_a_host_sync():
    """Every sequence dropped by the off-policy mask, or every token padding: loss 0, zero
    gradient; the whole call traces as one graph (fullgraph: a .item() or a boolean index, i.e.
    a host sync, would break it)."""
    x = batch()
    fn = PolicyLoss(get_objective("dapo"), off_policy_mask=1e-3, top_entropy_quantile=0.2)
    adv = -x["adv"].abs() - 0.1  # all negative
    far = x["logp"] + 1.0  # sampler 1 nat above the current policy: mean KL 1 > 1e-3
    counts = {"num_tokens": 40.0, "num_seqs": 9.0}

    def call(logp, mask):
        return fn(
            logp,
            x["logp_old"],
            adv,
            mask,
            rollout_logp=far,
            entropy=x["entropy"],
            validate=False,
            **counts,
        )

    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    for mask, dropped in ((x["mask"], 1.0), (torch.zeros_like(x["mask"]), 0.0)):
        for f in (call, compiled):
            lp = x["logp"].clone().requires_grad_(True)
            out = f(lp, mask)
            out.loss.backward()
            assert out.loss.item() == 0.0 and torch.count_nonzero(lp.grad) == 0
            assert out.metrics["off_policy_masked_frac"].item() == dropped


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"off_policy_mask": 0.0}, "off_policy_mask"),
        ({"off_policy_mask": -0.5}, "off_policy_mask"),
        ({"off_policy_mask": float("inf")}, "off_policy_mask"),
        ({"off_policy_mask": float("nan")}, "off_policy_mask"),
        ({"off_policy_mask": True}, "off_policy_mask"),
        ({"top_entropy_quantile": 0.0}, "top_entropy_quantile"),
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
        ({"top_entropy_quantile": -0.2}, "top_entropy_quantile"),
        ({"top_entropy_quantile": float("nan")}, "top_entropy_quantile"),
        ({"top_entropy_quantile": "0.2"}, "top_entropy_quantile"),
    ],
)
def test_bad_mask_options_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        PolicyLoss(get_objective("dapo"), **kwargs)
    assert "\n" not in str(info.value)


def test_entropy_quantile_needs_entropy():
    x = batch()
    with pytest.raises(ValueError, match="entropy is required when top_entropy_quantile"):
        PolicyLoss(get_objective("dapo"), top_entropy_quantile=0.2)(
            x["logp"], x["logp_old"], x["adv"], x["mask"]
        )
