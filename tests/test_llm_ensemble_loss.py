"""The ensemble's member losses as one batched computation (llm.ensemble.stacked_losses, issue 28
item 2): where the members share one deterministic rule, their K ``PolicyLoss`` calls are one
``vmap`` over the member dimension. Each member must still get its own call's loss, metrics and
gradient, on its own rows and width (``sizes``) and with its own minibatch counts; a stochastic
rule and a rule that ``vmap`` refuses keep one call per member."""

from __future__ import annotations

import copy

import pytest
import torch

import sandbox.objectives as registry
from llm.ensemble import UNBATCHED, batchable, rule_key, stacked_losses
from sandbox.loss import LossOutput, PolicyLoss
from sandbox.objectives.clip import PPOClip

# per member: its own (rows, Tc) before padding to the common [B, T] = [5, 7]
SIZES = [(5, 7), (3, 4), (5, 6)]
B, T = 5, 7
# a rule with every option of the loss on: KL and entropy terms, rollout IS weight, both masks
FULL = dict(
    kl_coef=0.05,
    entropy_coef=0.01,
    rollout_is="truncate",
    off_policy_mask=0.3,
    top_entropy_quantile=0.6,
    grad_mass=True,
)
DETERMINISTIC = [
    n for n in registry.available_objectives() if not registry.get_objective(n).stochastic
]


def members(seed: int = 0) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Three members' batches (float64), each its own ``[rows, Tc]``, and their stack ``[3, B, T]``
    padded as the driver pads (``llm.ensemble.stack_batches``, ``pad_rows``), except that the
    padding holds values (and mask ones) the members' own losses never see."""
    gen = torch.Generator().manual_seed(seed)
    full = {
        "logp": -torch.rand(3, B, T, generator=gen, dtype=torch.float64) * 3,
        "entropy": torch.rand(3, B, T, generator=gen, dtype=torch.float64) * 2,
        "adv": torch.randn(3, B, 1, generator=gen, dtype=torch.float64),
        "loss_mask": (torch.rand(3, B, T, generator=gen) < 0.8).long(),
    }
    for key in ("logp_old", "logp_ref", "rollout_logp"):
        full[key] = full["logp"] + 0.4 * torch.randn(3, B, T, generator=gen, dtype=torch.float64)
    own = []
    for k, (rows, tc) in enumerate(SIZES):
        mine = {key: value[k, :rows, :tc].clone() for key, value in full.items()}
        mine["adv"] = full["adv"][k, :rows].clone()
        mine["loss_mask"][:, 0] = 1  # no empty row
        own.append(mine)
        full["loss_mask"][k] = 1  # beyond the member's own region: ones no loss may count
        full["loss_mask"][k, :rows, :tc] = mine["loss_mask"]
    full["adv"][1, 3:] = 1e3  # another member's padding rows: huge advantages, masked
    return full, own


def counts_of(own: list[dict[str, torch.Tensor]]) -> list[dict]:
    """Each member's global minibatch counts (this micro-batch is part of a larger minibatch):
    float32 tensors, as ``llm.train.minibatch_counts`` gives them, but Python numbers for the last
    member (the driver's stand-in counts)."""
    counts = []
    for k, mine in enumerate(own):
        tokens, seqs = mine["loss_mask"].sum() + 5 * k + 3, mine["loss_mask"].shape[0] + 2
        if k == 2:
            counts.append({"num_tokens": float(tokens), "num_seqs": float(seqs), "max_len": T})
        else:
            counts.append(
                {"num_tokens": tokens.float(), "num_seqs": torch.tensor(float(seqs)), "max_len": T}
            )
    return counts


def alone(loss_fn: PolicyLoss, mine: dict, counts: dict, logp, entropy, generator=None):
    return loss_fn(
        logp,
        mine["logp_old"],
        mine["adv"],
        mine["loss_mask"],
        logp_ref=mine["logp_ref"],
        rollout_logp=mine.get("rollout_logp"),
        entropy=entropy,
        generator=generator,
        validate=False,
        **counts,
    )


def assert_same(out: LossOutput, ref: LossOutput, rtol: float) -> None:
    """``out`` is ``ref``, a member's own call, in loss (a real one, not a masked 0) and metrics:
    float64 to ``rtol``; the float32 metrics (sandbox.correction's) to float32 rounding, as their
    sums run in another order over the padded width."""
    assert ref.loss.abs() > 1e-3
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-13, rtol=rtol)
    assert sorted(out.metrics) == sorted(ref.metrics)
    for name, value in ref.metrics.items():
        tight = value.dtype != torch.float32
        tol = dict(atol=1e-12, rtol=1e-10) if tight else dict(atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out.metrics[name], value, **tol, msg=name)


def compare(loss_fns: list[PolicyLoss], calls: int, monkeypatch, generators=(None,) * 3) -> None:
    """The stacked losses equal each member's call alone in loss, metrics and the gradients of
    the summed losses w.r.t. the members' log-probs and entropies (float64), and ``PolicyLoss``
    was called ``calls`` times for the three members."""
    full, own = members()
    counts = counts_of(own)
    logp = full["logp"].clone().requires_grad_()
    entropy = full["entropy"].clone().requires_grad_()
    seen = []
    real = PolicyLoss.__call__

    def spy(self, *args, **kwargs):
        seen.append(args[0].shape)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PolicyLoss, "__call__", spy)
    gens = [None if g is None else torch.Generator().manual_seed(g) for g in generators]
    outs = stacked_losses(
        loss_fns, full, logp, entropy, counts=counts, generators=gens, sizes=SIZES
    )
    monkeypatch.setattr(PolicyLoss, "__call__", real)
    assert len(seen) == calls
    torch.stack([o.loss for o in outs]).sum().backward()
    for k, (mine, (rows, tc)) in enumerate(zip(own, SIZES, strict=True)):
        lp = mine["logp"].clone().requires_grad_()
        ent = mine["entropy"].clone().requires_grad_()
        gen = None if generators[k] is None else torch.Generator().manual_seed(generators[k])
        ref = alone(loss_fns[k], mine, counts[k], lp, ent, gen)
        ref.loss.backward()
        assert_same(outs[k], ref, rtol=1e-12)
        torch.testing.assert_close(logp.grad[k, :rows, :tc], lp.grad, atol=1e-14, rtol=1e-12)
        assert (logp.grad[k, rows:] == 0).all() and (logp.grad[k, :, tc:] == 0).all()
        if loss_fns[k].entropy_coef == 0:  # the entropy is a metric only
            assert entropy.grad is None and ent.grad is None
            continue
        torch.testing.assert_close(entropy.grad[k, :rows, :tc], ent.grad, atol=1e-14, rtol=1e-12)
        assert (entropy.grad[k, rows:] == 0).all() and (entropy.grad[k, :, tc:] == 0).all()


@pytest.mark.parametrize(
    "rule, settings",
    [
        ("dapo", {}),
        ("gspo", {}),
        ("cispo", {}),
        ("grpo", {"kl_coef": 0.1, "entropy_coef": 0.02}),
        ("dr_grpo", {"aggregation": "seq-mean-token-sum-norm"}),
        ("dapo", FULL),
    ],
)
def test_one_rule_is_one_batched_call_equal_to_each_members_own(rule, settings, monkeypatch):
    """Three members of one deterministic rule with different rows, widths, masks and counts:
    one ``PolicyLoss`` call (the vmap) gives each member its own call's loss, metrics and
    gradient; the rows and columns beyond a member's size (mask ones, huge advantages there)
    change nothing."""
    loss_fns = [PolicyLoss(registry.get_objective(rule), **settings) for _ in range(3)]
    assert batchable(loss_fns, counts_of(members()[1]), [False] * 3, SIZES, T)
    compare(loss_fns, 1, monkeypatch)


@pytest.mark.parametrize("rule", DETERMINISTIC)
def test_every_deterministic_rule_batches_equal_to_its_calls_alone(rule, monkeypatch):
    """Every registered rule without random draws, with every option of the loss on, batches
    (vmap accepts it) and equals its members' calls alone."""
    loss_fns = [PolicyLoss(registry.get_objective(rule), **FULL) for _ in range(3)]
    compare(loss_fns, 1, monkeypatch)
    assert rule_key(loss_fns[0]) not in UNBATCHED


def test_stochastic_rule_loops_each_member_drawing_its_own(monkeypatch):
    """NSR draws random numbers: one call per member on its own slice, each with its own
    generator, equal to its run alone with the same generator state (the draws are the run's)."""
    loss_fns = [
        PolicyLoss(registry.get_objective("nsr", noise="band", sigma=0.1)) for _ in range(3)
    ]
    assert not batchable(loss_fns, None, [False] * 3, SIZES, T)
    compare(loss_fns, 3, monkeypatch, generators=(11, 12, 13))


class HostReadClip(PPOClip):
    """ppo_clip whose loss reads a value on the host (a Python branch on a tensor): a rule
    ``vmap`` cannot batch, which must then take the per-member calls."""

    def realise(self, r, rd, b, z, noise):
        loss, coef, metrics = super().realise(r, rd, b, z, noise)
        return (loss if bool(b.n_valid > 0) else 0 * loss), coef, metrics


def test_rule_vmap_refuses_falls_back_to_each_members_call(monkeypatch):
    """A deterministic rule whose loss vmap refuses: the batched attempt fails, the members' own
    calls give the losses (equal to each alone), and the rule is remembered so later steps do
    not try again."""
    loss_fns = [PolicyLoss(HostReadClip()) for _ in range(3)]
    UNBATCHED.discard(rule_key(loss_fns[0]))
    assert batchable(loss_fns, None, [False] * 3, SIZES, T)
    compare(loss_fns, 1 + 3, monkeypatch)  # the refused vmap, then one call per member
    assert rule_key(loss_fns[0]) in UNBATCHED
    assert not batchable(loss_fns, None, [False] * 3, SIZES, T)
    compare(loss_fns, 3, monkeypatch)
    UNBATCHED.discard(rule_key(loss_fns[0]))


def test_batchable_only_where_one_call_equals_the_members_own():
    """One rule, two members or more, one on-policy flag and counts that differ in values only;
    otherwise the per-member calls."""
    dapo = [PolicyLoss(registry.get_objective("dapo")) for _ in range(3)]
    counts = [{"num_tokens": 4.0, "num_seqs": 2.0, "max_len": 8}] * 3
    assert batchable(dapo, counts, [False] * 3, SIZES, T)
    assert batchable(dapo, None, [True] * 3, None, T)
    assert not batchable(dapo[:1], counts[:1], [False], SIZES[:1], T)  # one member: one call
    other = PolicyLoss(registry.get_objective("dapo", eps_high=0.3))
    assert not batchable([*dapo[:2], other], counts, [False] * 3, SIZES, T)
    kl = PolicyLoss(registry.get_objective("dapo"), kl_coef=0.1)
    assert not batchable([*dapo[:2], kl], counts, [False] * 3, SIZES, T)
    gspo = PolicyLoss(registry.get_objective("gspo"))
    assert not batchable([*dapo[:2], gspo], counts, [False] * 3, SIZES, T)
    assert not batchable(dapo, counts, [False, True, False], SIZES, T)
    assert not batchable(dapo, [*counts[:2], {"num_tokens": 4.0}], [False] * 3, SIZES, T)
    assert not batchable(dapo, [*counts[:2], {**counts[0], "max_len": 9}], [False] * 3, SIZES, T)
    assert not batchable(dapo, [*counts[:2], {**counts[0], "groups": 1}], [False] * 3, SIZES, T)
    # Dr. GRPO's L is each member's own width without max_len: one call only at equal widths
    norm = [PolicyLoss(registry.get_objective("grpo"), "seq-mean-token-sum-norm")] * 3
    assert not batchable(norm, None, [False] * 3, SIZES, T)
    assert batchable(norm, None, [False] * 3, [(5, T)] * 3, T)
    assert batchable(norm, counts, [False] * 3, SIZES, T)


def test_member_losses_through_the_models_equal_each_runs_own():
    """The real path (float64 tiny Llamas): three members of one rule with KL and entropy terms,
    each on its own prompts, member 2 with a narrower completion, member 1 with 5 of its 8 rows (masked stand-ins pad
    it, as ``ensemble_update`` pads a run with fewer rows) and each with its own minibatch counts;
    member_losses gives each member its run's loss and metrics, and the stacked leaves' gradient
    rows are each run's own gradient."""
    pytest.importorskip("transformers")
    from test_llm_ensemble import rollout_of

    from llm.ensemble import Ensemble, member_losses, pad_rows, stack_batches
    from llm.logprobs import completion_logp
    from llm.model import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    keys = ("prompt", "prompt_mask", "completion", "completion_mask")
    rule = PolicyLoss(registry.get_objective("grpo"), kl_coef=0.1, entropy_coef=0.01)
    loss_fns = [copy.deepcopy(rule) for _ in range(3)]  # each run builds its own
    models = [tiny_model(len(tok), s).double() for s in range(3)]
    ens = Ensemble([copy.deepcopy(m) for m in models])
    subs, counts = [], []
    for k, m in enumerate(models):
        sub = rollout_of(m.eval(), tok, k % 2, 0)
        sub = {key: v[:5] for key, v in sub.items()} if k == 1 else sub
        if k == 2:  # a shorter completion width (as llm.train.trim cuts a padding tail)
            sub["completion"], sub["completion_mask"] = (
                sub[key][:, :4] for key in ("completion", "completion_mask")
            )
        with torch.no_grad():
            logp = completion_logp(m, *(sub[key] for key in keys), 1.0)[0]
        gen = torch.Generator().manual_seed(k)
        sub["logp_old"] = logp + 0.2 * torch.randn(logp.shape, generator=gen, dtype=logp.dtype)
        sub["logp_ref"] = logp - 0.3 * torch.rand(logp.shape, generator=gen, dtype=logp.dtype)
        sub["loss_mask"] = sub["completion_mask"]
        subs.append(sub)
        tokens = sub["loss_mask"].sum().double() + 4 * k
        counts.append({"num_tokens": tokens, "num_seqs": torch.tensor(9.0 + k), "max_len": 6})
    sizes = [tuple(s["completion"].shape) for s in subs]
    assert len({tc for _, tc in sizes}) > 1 and sizes[1][0] == 5
    stacked = stack_batches([pad_rows(s, 8) for s in subs], tok.pad_token_id)
    assert batchable(loss_fns, counts, [False] * 3, sizes, stacked["completion"].shape[-1])
    outs = member_losses(ens, stacked, loss_fns, temperature=1.0, counts=counts, sizes=sizes)
    torch.stack([o.loss for o in outs]).sum().backward()
    for k, (m, sub) in enumerate(zip(models, subs, strict=True)):
        logp, ent = completion_logp(m.train(), *(sub[key] for key in keys), 1.0, entropy="grad")
        ref = alone(loss_fns[k], sub, counts[k], logp, ent)
        ref.loss.backward()
        assert_same(outs[k], ref, rtol=1e-10)
        for name, p in m.named_parameters():
            grad = ens.leaves[name].grad[k]
            torch.testing.assert_close(grad, p.grad, atol=1e-12, rtol=1e-9, msg=name)
            assert p.grad.abs().max() > 0, name
