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
            fn = PolicyLoss(objective, mode, kl_coef=kl_coef, entropy_coef=entropy_coef,
                            rollout_is=rollout_is)  # fmt: skip
            loss = fn(x["logp"], x["logp_old"], x["adv"], x["mask"], logp_ref=x["logp_ref"],
                      rollout_logp=x["rollout_logp"], entropy=x["entropy"], **counts).loss  # fmt: skip
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
    out = fn(x["logp"], x["logp_old"], x["adv"], x["mask"], logp_ref=x["logp_ref"],
             rollout_logp=x["rollout_logp"], entropy=x["entropy"])  # fmt: skip
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
        o = objective(x["logp"][rows], x["logp_old"][rows], x["adv"][rows], x["mask"][rows],
                      generator=gen)  # fmt: skip
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
    out = fn(x["logp"], x["logp_old"], x["adv"], zero, logp_ref=x["logp_ref"],
             entropy=x["entropy"], validate=False, num_tokens=10.0, num_seqs=3.0)  # fmt: skip
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.count_nonzero(x["logp"].grad) == 0
    with pytest.raises(ValueError, match="mask"):
        fn(x["logp"], x["logp_old"], x["adv"], zero, logp_ref=x["logp_ref"], entropy=x["entropy"])
