"""sandbox.exact.sequences: exact expected gradients over every completion of the bits task.

Checks: a hand-derived value; the exact gradient of every deterministic rule equals autograd of the
objective itself called on the whole enumerated space (extreme ratios included); Monte Carlo with
completions sampled token by token from pi_old, the objective called on the sampled batch,
:func:`sandbox.aggregate.aggregate` and autograd, converges to it (tabular and transformer
policies, population and GRPO advantages, seq-mean-token-mean and the large-batch token-mean);
on-policy every rule is REINFORCE; GSPO and ppo_clip differ exactly where the theory says.

Monte Carlo tolerance (CLT): ``|mean - exact| <= 5 se`` per component, ``se`` from independent
replicates (each replicate is one aggregated batch, so its gradient is what a trainer computes),
plus power checks: ``se`` is small next to ``|exact|`` and next to the gap to a wrong rule.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from envs.reasoning import make_task
from sandbox.advantages import compute_advantages
from sandbox.aggregate import aggregate
from sandbox.exact import (
    MaskedTransformerPolicy,
    TabularSequencePolicy,
    enumerate_sequences,
    sequence_gradient,
    sequence_terms,
)
from sandbox.objectives import available_objectives, available_presets, get_objective
from sandbox.policies import TinyTransformer, TransformerConfig

F64 = torch.float64
Z_MAX = 5.0
EPS = 1e-6
AGGREGATIONS = (
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "token-mean",
)


ALL_NAMES = available_objectives() + available_presets()
EXACT_NAMES = [n for n in ALL_NAMES if get_objective(n).has_expected_coef()]
DETERMINISTIC_NAMES = [n for n in EXACT_NAMES if not get_objective(n).stochastic]


# ---------------------------------------------------------------------------------------------
# Helpers (written independently of the library's enumeration and advantage code)
# ---------------------------------------------------------------------------------------------


def tabular_pair(task, max_len: int, seed: int, shift: float = 0.5, boost: float = 1.5):
    """Old logits ``N(0, 1)`` plus ``boost`` on each correct token along each prompt's answer path
    (pass rates ~0.2-0.5, so GRPO groups often have mixed rewards), current = old + ``shift *
    N(0, 1)`` (ratios far outside [0.8, 1.28] at many nodes)."""
    gen = torch.Generator().manual_seed(seed)
    old = TabularSequencePolicy.random(task, max_len, generator=gen, requires_grad=False)
    z = old.logits.clone()
    for p, prompt in enumerate(old.prompts.tolist()):
        answer = [*task.answer_ids(prompt), task.tokenizer.eos_id][:max_len]
        nodes = old.node_index(torch.tensor([answer]))[0]
        z[p, nodes, torch.tensor(answer) - task.tokenizer.eos_id] += boost
    noise = shift * torch.randn(z.shape, generator=gen, dtype=F64)
    return old.with_logits(z + noise), old.with_logits(z, requires_grad=False)


def flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def enumerated(task, max_len: int, prompts: np.ndarray):
    """The outcome space built by hand: prompt rows, completions, mask, lengths, rewards."""
    ids, lengths = task.enumerate_completions_array(max_len)
    P, M = len(prompts), len(ids)
    pidx = torch.arange(P).repeat_interleave(M)
    comp = torch.as_tensor(np.tile(ids, (P, 1)))
    lens = torch.as_tensor(np.tile(lengths, P)).to(F64)
    mask = torch.arange(max_len)[None] < lens[:, None]
    reward = torch.as_tensor(task.reward_ids_batch(prompts[pidx.numpy()], comp.numpy()))
    return pidx, comp, mask, lens, reward


def success_prob(policy: TabularSequencePolicy, task, max_len: int) -> torch.Tensor:
    """``mu_p = pi(answer (+ <eos>) | p)``: the bits task has exactly one correct completion."""
    rows = []
    for prompt in policy.prompts.tolist():
        answer = list(task.answer_ids(prompt))
        if len(answer) < max_len:
            answer.append(task.tokenizer.eos_id)
        rows.append(answer + [task.tokenizer.pad_id] * (max_len - len(answer)))
    comp = torch.tensor(rows)
    mask = comp != task.tokenizer.pad_id
    with torch.no_grad():
        logp = policy.log_probs(torch.arange(len(rows)), comp, mask)
    return logp.sum(-1).exp()


def mc_advantages(reward, pidx, mu, advantage, group_size):
    if advantage == "population":
        return reward - mu[pidx]
    return compute_advantages(reward.view(-1, group_size), method=advantage, eps=EPS).view(-1)


def assert_mc_matches(per_rep: torch.Tensor, exact: torch.Tensor, max_rel_se: float = 0.05):
    """``per_rep [K, D]`` i.i.d. replicates whose mean should be ``exact [D]``; returns se."""
    k = per_rep.shape[0]
    mean = per_rep.mean(0)
    se = per_rep.std(0) / math.sqrt(k)
    dev = (mean - exact).abs()
    z = dev / se.clamp(min=1e-300)
    assert bool((dev <= Z_MAX * se + 1e-13).all()), (
        f"MC deviates: max |mean - exact| / se = {z.max()}"
    )
    # power: the Monte Carlo resolves the exact gradient to a few percent of its norm
    assert se.norm() < max_rel_se * exact.norm(), (
        f"underpowered: |se| {se.norm()}, |g| {exact.norm()}"
    )
    return se


def tabular_mc(
    obj,
    policy,
    old,
    task,
    max_len,
    *,
    advantage,
    aggregation,
    group_size=None,
    per_prompt=100,
    replicates=200,
    seed=0,
):
    """Per-replicate ascent directions ``[K, P * nodes * C]``: each replicate samples
    ``per_prompt`` completions for every prompt token by token from ``old``, computes advantages,
    calls ``obj`` and aggregates; one backward gives every replicate's gradient (each replicate
    reads its own copy of the logits)."""
    gen = torch.Generator().manual_seed(seed)
    P = policy.prompts.shape[0]
    pidx = torch.arange(P).repeat_interleave(per_prompt).repeat(replicates)
    comp, mask = old.sample(pidx, generator=gen, max_len=max_len)
    reward = torch.as_tensor(task.reward_ids_batch(old.prompts[pidx].numpy(), comp.numpy()))
    adv = mc_advantages(reward, pidx, success_prob(old, task, max_len), advantage, group_size)
    z = policy.logits.detach().repeat(replicates, 1, 1).requires_grad_(True)
    rep = torch.arange(replicates).repeat_interleave(P * per_prompt)
    logp = policy.log_probs(rep * P + pidx, comp, mask, logits=z)
    with torch.no_grad():
        logp_old = old.log_probs(pidx, comp, mask)
    out = obj(logp, logp_old, adv[:, None], mask, generator=gen)
    loss = aggregate(out.loss, mask, aggregation, groups=replicates)
    (grad,) = torch.autograd.grad(loss, z)
    return -grad.view(replicates, -1)


# ---------------------------------------------------------------------------------------------
# Hand-derived value
# ---------------------------------------------------------------------------------------------


def test_hand_derived_tiny_case():
    # bits copy, length 1, prompt "1" (answer "1"), T = 2, uniform policy (pi = 1/3 per node),
    # on-policy, population advantage. Completions: "<eos>" (pi 1/3, |y| = 1), "0<eos>", "00",
    # "01", "1<eos>", "10", "11" (pi 1/9 each, |y| = 2). Only "1<eos>" is correct: mu = 1/9,
    # A = 8/9 for it and -1/9 for the rest. With grad_z log pi(c | v) = e_c - u at node v
    # (u = (1/3, 1/3, 1/3); columns <eos>, '0', '1'), seq-mean-token-mean gives weights
    # pi(y) A(y) / |y| per token:
    #   root: <eos> -1/27, '0' 3 x (-1/162) = -1/54, '1' 8/162 - 2/162 = 1/27; sum -1/54, so
    #         g_root = (-1/27, -1/54, 1/27) + (1/54)(1/3) (1, 1, 1) = (-5, -2, 7) / 162;
    #   node "0": three tokens of weight -1/162 each: g = -(1/162)(1, 1, 1) + (3/162) u = 0;
    #   node "1": <eos> 8/162, '0' -1/162, '1' -1/162; sum 6/162: g = (6, -3, -3) / 162.
    # token-mean (large-batch limit): E|y| = 1/3 + 2 (2/3) = 5/3, weights pi A (3/5):
    #   root: (-1/45, -1/45, 2/45), sum 0 -> (-1, -1, 2) / 45; node "1": (8, -1, -1)/135
    #   - (2/45)/3 -> (2, -1, -1) / 45; node "0": 0.
    task = make_task("bits", op="copy", length=1)
    policy = TabularSequencePolicy(task, 2, prompt_ids=[task.enumerate_prompts()[1]])
    seq_mean = torch.tensor([[-5, -2, 7], [0, 0, 0], [6, -3, -3]], dtype=F64) / 162
    token_mean = torch.tensor([[-1, -1, 2], [0, 0, 0], [2, -1, -1]], dtype=F64) / 45
    for name in ("dapo", "gspo", "nsr_gspo", "cispo_trl"):  # on-policy: every rule is REINFORCE
        obj = get_objective(name)
        (g,) = sequence_gradient(obj, policy, task, max_len=2)
        torch.testing.assert_close(g[0], seq_mean, rtol=0, atol=1e-15)
        (g,) = sequence_gradient(obj, policy, task, max_len=2, aggregation="token-mean")
        torch.testing.assert_close(g[0], token_mean, rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# Enumeration and the tabular policy
# ---------------------------------------------------------------------------------------------


def test_enumeration_and_tabular_probabilities():
    task = make_task("bits", op="reverse", length=2)
    policy, _ = tabular_pair(task, 3, seed=1)
    space = enumerate_sequences(task, 3)
    assert space.completion.shape == (4 * 15, 3)
    assert torch.equal(space.reward.view(4, 15).sum(-1), torch.ones(4, dtype=F64))
    terms = sequence_terms(get_objective("dapo"), policy, task, max_len=3)
    mass = terms.seq_prob_old.view(4, 15).sum(-1)
    torch.testing.assert_close(mass, torch.ones(4, dtype=F64), rtol=0, atol=1e-14)
    # pi("1 0 <eos>" | prompt 2) by hand: nodes root (0), "1" (2), columns <eos>=0, '0'=1, '1'=2
    sm = torch.softmax(policy.logits.detach(), -1)
    row = (space.prompt_index == 2) & (space.completion == torch.tensor([4, 3, 2])).all(-1)
    expected = sm[2, 0, 2] * sm[2, 2, 1] * sm[2, 5, 0]  # node "10" = 3 + 0b10 = 5
    torch.testing.assert_close(terms.seq_prob_old[row], expected[None], rtol=1e-14, atol=0)
    # one gradient over all prompts = the mean of single-prompt gradients (seq-mean is linear)
    obj = get_objective("gspo", eps_low=0.1, eps_high=0.1)
    _, old = tabular_pair(task, 3, seed=1)
    (g_all,) = sequence_gradient(obj, policy, task, old_policy=old, max_len=3, chunk_size=7)
    parts = [
        sequence_gradient(obj, policy, task, old_policy=old, max_len=3, prompt_ids=[p])[0]
        for p in task.enumerate_prompts()
    ]
    torch.testing.assert_close(g_all, sum(parts) / 4, rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# Exact = autograd of the objective itself over the enumerated space (deterministic rules)
# ---------------------------------------------------------------------------------------------


def group_table_by_hand(group_size: int) -> torch.Tensor:
    """``[2, G]`` GRPO advantage of a member with reward R and J successes among the others,
    from :func:`compute_advantages` on an explicit group."""
    table = torch.zeros(2, group_size, dtype=F64)
    for r in (0, 1):
        for j in range(group_size):
            group = torch.tensor([r] + [1] * j + [0] * (group_size - 1 - j), dtype=F64)
            table[r, j] = compute_advantages(group[None], method="grpo", eps=EPS)[0, 0]
    return table


@pytest.mark.parametrize("name", DETERMINISTIC_NAMES)
def test_exact_equals_objective_autograd_on_the_enumeration(name):
    """For deterministic rules ``sum_y w pi_old(y) norm(y) sum_t loss_t(y)`` differentiated by
    autograd (the objective called on the whole outcome space, the advantage law summed outside)
    is the exact gradient; two nodes carry |log r| > 20 so the ±20 clamp's cut is checked too."""
    obj = get_objective(name)
    task = make_task("bits", op="sort", length=2)
    T, G = 3, 3
    policy, old = tabular_pair(task, T, seed=2, shift=0.6)
    z, z_old = policy.logits.detach().clone(), old.logits.clone()
    z_old[1, 0, 2], z[1, 0, 2] = -26.0, 0.0  # token '1' at the root of prompt 1: log r ~ +25
    z_old[3, 2, 0], z[3, 2, 0] = 0.0, -26.0  # <eos> after "1" for prompt 3: log r ~ -25
    policy, old = policy.with_logits(z), old.with_logits(z_old, requires_grad=False)
    prompts = policy.prompts.numpy()
    P = len(prompts)
    pidx, comp, mask, lens, reward = enumerated(task, T, prompts)
    logp = policy.log_probs(pidx, comp, mask)
    logp_old = old.log_probs(pidx, comp, mask)
    pi_old = logp_old.sum(-1).exp()
    mu = torch.zeros(P, dtype=F64).index_add_(0, pidx, pi_old * reward)
    raw = (logp - logp_old).detach()
    assert bool((raw.abs() > 20).any()) and bool((raw.abs() < 0.2).any())
    law = {  # advantage -> list of (probability [N], advantage [N])
        "population": [(torch.ones_like(reward), reward - mu[pidx])],
        "std": [(torch.ones_like(reward), None)],
        "grpo": [],
    }
    sigma = torch.zeros(P, dtype=F64).index_add_(0, pidx, pi_old * (reward - mu[pidx]) ** 2).sqrt()
    law["std"] = [(torch.ones_like(reward), (reward - mu[pidx]) / (sigma[pidx] + EPS))]
    table = group_table_by_hand(G)
    for j in range(G):
        pmf = math.comb(G - 1, j) * mu**j * (1 - mu) ** (G - 1 - j)
        law["grpo"].append((pmf[pidx], table[reward.long(), j]))
    mean_len = (pi_old * lens).sum() / P
    norms = {
        "seq-mean-token-mean": 1.0 / lens,
        "seq-mean-token-sum": torch.ones_like(pi_old),
        "seq-mean-token-sum-norm": torch.full_like(pi_old, 1.0 / T),
        "token-mean": torch.full_like(pi_old, 1.0 / float(mean_len)),
    }
    for advantage, outcomes in law.items():
        for aggregation, norm in norms.items():
            surrogate = 0.0
            for prob, adv in outcomes:
                out = obj(logp, logp_old, adv[:, None], mask)
                surrogate = surrogate + ((prob * pi_old * norm / P)[:, None] * out.loss).sum()
            (by_autograd,) = torch.autograd.grad(-surrogate, policy.logits, retain_graph=True)
            (exact,) = sequence_gradient(
                obj,
                policy,
                task,
                old_policy=old,
                max_len=T,
                advantage=advantage,
                group_size=G if advantage == "grpo" else None,
                aggregation=aggregation,
            )
            torch.testing.assert_close(exact, by_autograd, rtol=1e-9, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# Monte Carlo on the tabular policy
# ---------------------------------------------------------------------------------------------

MC_RULES = {  # name -> (objective, a wrong rule whose gradient the MC must tell apart)
    "dapo": (lambda: get_objective("dapo"), lambda: get_objective("unclipped")),
    "gspo": (
        lambda: get_objective("gspo", eps_low=0.1, eps_high=0.1),
        lambda: get_objective("ppo_clip", eps_low=0.1, eps_high=0.1),
    ),
    "nsr": (
        lambda: get_objective("nsr", eps_low=0.2, eps_high=0.28, noise="uniform"),
        lambda: get_objective("dapo"),
    ),
    "nsr_sequence": (
        lambda: get_objective("nsr", level="sequence", eps_low=0.1, eps_high=0.1),
        lambda: get_objective("gspo", eps_low=0.1, eps_high=0.1),
    ),
    "gmpo": (  # token clips against GSPO's whole-sequence clip at the same ratio bounds
        lambda: get_objective("gmpo", eps_low=0.2, eps_high=0.2),
        lambda: get_objective("gspo", eps_low=1 - math.exp(-0.2), eps_high=math.exp(0.2) - 1),
    ),
    "vespo": (  # the gamma weight of the product ratio against CISPO's clipped token ratio
        lambda: get_objective("vespo"),
        lambda: get_objective("cispo", lower=0.8, upper=1.2),
    ),
}
#: Completions per prompt in each replicate (default 100). VESPO weights every token by the whole
#: sequence's ratio, so at rarely visited nodes a replicate's gradient is mostly 0 with a rare
#: large value, and 200 such replicates underestimate the standard error (the check then fails
#: at 7-15 "se" with the exact value right: 2000 replicates, or 400 completions, agree with it).
MC_PER_PROMPT = {"vespo": 400}
MC_SETTINGS = [  # (advantage, group size, aggregation)
    ("population", None, "seq-mean-token-mean"),
    ("grpo", 4, "seq-mean-token-mean"),
    ("population", None, "token-mean"),
    ("grpo", 4, "token-mean"),
]


@pytest.mark.parametrize(
    "setting", range(len(MC_SETTINGS)), ids=[f"{a}-{g}" for a, _, g in MC_SETTINGS]
)
@pytest.mark.parametrize("rule", sorted(MC_RULES))
def test_monte_carlo_converges_to_exact_tabular(rule, setting):
    """80k sampled completions in 200 replicates. token-mean: each replicate aggregates 400
    sequences, so its O(1/N) ratio bias (~1e-4 relative) is far below the Monte Carlo resolution
    (~2% of |g|); the check is of the large-batch limit."""
    seed = 10 * setting + list(MC_RULES).index(rule)  # new rules go last
    advantage, group_size, aggregation = MC_SETTINGS[setting]
    make, make_wrong = MC_RULES[rule]
    per_prompt = MC_PER_PROMPT.get(rule, 100)
    task = make_task("bits", op="reverse", length=2)
    T = 3
    policy, old = tabular_pair(task, T, seed=3, shift=0.4)
    kw = dict(
        old_policy=old,
        max_len=T,
        advantage=advantage,
        group_size=group_size,
        aggregation=aggregation,
    )
    terms = sequence_terms(make(), policy, task, **kw)
    ratio = terms.ratio[terms.space.mask]
    assert bool((ratio > 1.3).any()) and bool((ratio < 0.75).any())  # the clip acts
    (exact,) = sequence_gradient(make(), policy, task, **kw)
    (wrong,) = sequence_gradient(make_wrong(), policy, task, **kw)
    per = tabular_mc(
        make(),
        policy,
        old,
        task,
        T,
        advantage=advantage,
        aggregation=aggregation,
        group_size=group_size,
        seed=seed,
        per_prompt=per_prompt,
    )
    se = assert_mc_matches(per, exact.reshape(-1))
    gap = (exact - wrong).reshape(-1).abs() / se.clamp(min=1e-300)
    assert float(gap.max()) > 2 * Z_MAX, "the Monte Carlo cannot tell the rule from a wrong one"


# ---------------------------------------------------------------------------------------------
# GSPO versus ppo_clip
# ---------------------------------------------------------------------------------------------


def two_node_case(root_old, root_new, one_old, one_new):
    """bits copy, length 1, prompt "1", T = 2: probabilities (<eos>, '0', '1') at the root and at
    node "1" (node "0" uniform in both) -> (policy, old, task)."""
    task = make_task("bits", op="copy", length=1)
    prompt = [task.enumerate_prompts()[1]]

    def logits(root, one):
        rows = [root, [1 / 3] * 3, one]
        return torch.tensor(rows, dtype=F64).log()[None]

    policy = TabularSequencePolicy(task, 2, logits(root_new, one_new), prompt_ids=prompt)
    old = policy.with_logits(logits(root_old, one_old), requires_grad=False)
    return policy, old, task


def grads(policy, old, task, *objs):
    return [sequence_gradient(o, policy, task, old_policy=old, max_len=2)[0][0] for o in objs]


PPO = dict(eps_low=0.2, eps_high=0.28)
NO_CLIP = dict(eps_low=1.0, eps_high=1e9)


def test_token_ratios_straddle_the_bounds_but_the_sequence_ratio_is_inside():
    # The correct completion y* = "1<eos>": r_1 = 0.15/0.10 = 1.5 > u = 1.28, r_2 = (0.8/1.5)/0.8
    # = 2/3 < l = 0.8, s = sqrt(1.5 * 2/3) = 1. A* = 1 - pi_old(y*) = 1 - 0.1 * 0.8 = 0.92 > 0.
    # Wrong completions (A < 0) have token ratios 0.944 (root <eos>, '0'), 1.5 and 7/3 (>= l) and
    # sequence ratios 0.944, 0.972, 1.87 (>= l): neither rule touches them. So ppo_clip zeroes
    # exactly token 1 of y* (A > 0, r > u) and keeps token 2 (A > 0, r < l keeps r A); GSPO clips
    # nothing and equals unclipped GSPO. The cut token's contribution, in closed form:
    #   pi_old(y*) / |y*| A* r_1 (e_'1' - pi(root)) = 0.08 / 2 * 0.92 * 1.5 * (-.425, -.425, .85)
    policy, old, task = two_node_case(
        root_old=[0.45, 0.45, 0.10],
        root_new=[0.425, 0.425, 0.15],
        one_old=[0.8, 0.1, 0.1],
        one_new=[0.8 / 1.5, (1 - 0.8 / 1.5) / 2, (1 - 0.8 / 1.5) / 2],
    )
    ppo, unclipped, gspo, gspo_free = grads(
        policy,
        old,
        task,
        get_objective("ppo_clip", **PPO),
        get_objective("unclipped"),
        get_objective("gspo", **PPO),
        get_objective("gspo", **NO_CLIP),
    )
    cut = torch.zeros(3, 3, dtype=F64)
    cut[0] = 0.08 / 2 * 0.92 * 1.5 * torch.tensor([-0.425, -0.425, 0.85], dtype=F64)
    torch.testing.assert_close(unclipped - ppo, cut, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(gspo, gspo_free, rtol=1e-12, atol=1e-15)
    assert float((gspo - ppo).abs().max()) > 0.01


def test_sequence_ratio_outside_zeroes_the_whole_sequence_under_gspo_only():
    # y* = "1<eos>": r_1 = 1 (inside), r_2 = 0.2/0.1 = 2 > u, s = sqrt(2) > u, A* = 1 - 0.1 * 0.1
    # = 0.99 > 0. Wrong completions: token ratios 1 and 0.4/0.45 = 0.889 >= l, sequence ratios 1
    # and 0.943 >= l: untouched. GSPO zeroes both tokens of y*; ppo_clip zeroes token 2 only and
    # keeps token 1 (r = 1). Closed forms, with w = pi_old(y*) / |y*| A* = 0.01 / 2 * 0.99:
    #   gspo_free - gspo        = w s   [(e_'1' - pi(root)) at the root, (e_<eos> - pi("1")) at "1"]
    #   unclipped - ppo_clip    = w r_2 (e_<eos> - pi("1")) at node "1"
    policy, old, task = two_node_case(
        root_old=[0.45, 0.45, 0.10],
        root_new=[0.45, 0.45, 0.10],
        one_old=[0.1, 0.45, 0.45],
        one_new=[0.2, 0.4, 0.4],
    )
    ppo, unclipped, gspo, gspo_free = grads(
        policy,
        old,
        task,
        get_objective("ppo_clip", **PPO),
        get_objective("unclipped"),
        get_objective("gspo", **PPO),
        get_objective("gspo", **NO_CLIP),
    )
    w = 0.01 / 2 * 0.99
    grad_root = torch.tensor([-0.45, -0.45, 0.9], dtype=F64)  # e_'1' - pi(root)
    grad_one = torch.tensor([0.8, -0.4, -0.4], dtype=F64)  # e_<eos> - pi("1")
    seq_cut = torch.zeros(3, 3, dtype=F64)
    seq_cut[0], seq_cut[2] = w * math.sqrt(2) * grad_root, w * math.sqrt(2) * grad_one
    tok_cut = torch.zeros(3, 3, dtype=F64)
    tok_cut[2] = w * 2.0 * grad_one
    torch.testing.assert_close(gspo_free - gspo, seq_cut, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(unclipped - ppo, tok_cut, rtol=1e-12, atol=1e-15)
    # so y*'s first token keeps w r_1 (e_'1' - pi(root)) under ppo_clip and nothing under GSPO
    assert float((gspo - ppo).abs().max()) > 1e-3


# ---------------------------------------------------------------------------------------------
# The tiny transformer
# ---------------------------------------------------------------------------------------------


def transformer_pair(seed: int = 0, head_std: float = 0.7, shift: float = 0.15):
    cfg = TransformerConfig(vocab_size=5, d_model=8, n_layers=1, n_heads=2, max_len=8, mlp_ratio=2)
    model = TinyTransformer(cfg, num_models=1, seed=seed).double()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.head.copy_(head_std * torch.randn(model.head.shape, generator=gen, dtype=F64))
        model.tok_emb.copy_(torch.randn(model.tok_emb.shape, generator=gen, dtype=F64))
    old_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in old_model.parameters():
            p.add_(shift * torch.randn(p.shape, generator=gen, dtype=F64))
    task = make_task("bits", op="reverse", length=2)
    return (
        MaskedTransformerPolicy.from_task(model, task),
        MaskedTransformerPolicy.from_task(old_model, task),
        task,
    )


def test_transformer_monte_carlo_converges_to_exact():
    policy, old, task = transformer_pair()
    T, K, per_prompt = 3, 100, 64
    obj = get_objective("dapo")
    terms = sequence_terms(obj, policy, task, old_policy=old, max_len=T)
    ratio = terms.ratio[terms.space.mask]
    assert bool((ratio > 1.28).any()) and bool((ratio < 0.8).any())  # the clip acts
    exact = flat(sequence_gradient(obj, policy, task, old_policy=old, max_len=T))
    free = flat(
        sequence_gradient(get_objective("unclipped"), policy, task, old_policy=old, max_len=T)
    )

    gen = torch.Generator().manual_seed(7)
    prompts = torch.tensor(task.enumerate_prompts())
    P = len(prompts)
    pidx = torch.arange(P).repeat_interleave(per_prompt).repeat(K)
    ones = torch.ones_like(prompts[pidx], dtype=torch.bool)
    comp, mask = old.sample(prompts[pidx], ones, max_new_tokens=T, generator=gen)
    reward = torch.as_tensor(task.reward_ids_batch(prompts[pidx].numpy(), comp.numpy()))
    answers = torch.tensor([[*task.answer_ids(p), task.tokenizer.eos_id] for p in prompts.tolist()])
    with torch.no_grad():
        ones_p, ones_a = (torch.ones_like(x, dtype=torch.bool) for x in (prompts, answers))
        mu = old.completion_logp(prompts, ones_p, answers, ones_a)[0].sum(-1).exp()  # pass rate
        logp_old, _ = old.completion_logp(prompts[pidx], ones, comp, mask)
    adv = reward - mu[pidx]
    # Score each distinct (prompt, completion) once with autograd; every replicate reads its own
    # copy of those log-probs, so one backward gives the per-replicate loss gradients, and the
    # chain rule through the network (one batched vector-Jacobian product) gives theirs.
    Tp = prompts.shape[1]
    unique, inverse = torch.unique(torch.cat([prompts[pidx], comp], -1), dim=0, return_inverse=True)
    uprompt, ucomp = unique[:, :Tp], unique[:, Tp:]
    logp_u, _ = policy.completion_logp(
        uprompt, torch.ones_like(uprompt, dtype=torch.bool), ucomp, ucomp != task.tokenizer.pad_id
    )
    copies = logp_u.detach().repeat(K, 1, 1).requires_grad_(True)
    rep = torch.arange(K).repeat_interleave(P * per_prompt)
    out = obj(copies[rep, inverse], logp_old, adv[:, None], mask, generator=gen)
    loss = aggregate(out.loss, mask, "seq-mean-token-mean", groups=K)
    (dloss,) = torch.autograd.grad(loss, copies)  # [K, U, T]
    per = torch.autograd.grad(
        logp_u, policy.parameters(), grad_outputs=-dloss, is_grads_batched=True
    )
    per = torch.cat([g.reshape(K, -1) for g in per], -1)
    # 25,600 samples resolve |g| to ~11% in norm, and the unclipped rule's gradient lies more
    # than 100 se away on some component
    se = assert_mc_matches(per, exact, max_rel_se=0.15)
    gap = (exact - free).abs() / se.clamp(min=1e-300)
    assert float(gap.max()) > 2 * Z_MAX


@pytest.mark.parametrize("name", EXACT_NAMES)
def test_transformer_on_policy_is_reinforce(name):
    """Old = current: every rule's exact gradient is ``sum_p w_p sum_y pi(y) A(y) norm(y) sum_t
    grad log pi(y_t)`` (docs/objectives.md §10.1), here built by hand from the enumeration, in
    float64."""
    policy, _, task = transformer_pair(seed=1)
    obj = get_objective(name)
    T = 3
    prompts = np.array(task.enumerate_prompts())
    pidx, comp, mask, lens, reward = enumerated(task, T, prompts)
    prompt = torch.as_tensor(prompts)[pidx]
    logp, _ = policy.completion_logp(prompt, torch.ones_like(prompt, dtype=torch.bool), comp, mask)
    pi = logp.detach().sum(-1).exp()
    P = len(prompts)
    mu = torch.zeros(P, dtype=F64).index_add_(0, pidx, pi * reward)
    adv = reward - mu[pidx]
    for aggregation, norm in (
        ("seq-mean-token-mean", 1.0 / lens),
        ("token-mean", torch.full_like(pi, P / float((pi * lens).sum()))),
    ):
        surrogate = ((pi * adv * norm / P)[:, None] * logp).sum()
        reinforce = flat(torch.autograd.grad(surrogate, policy.parameters(), retain_graph=True))
        exact = flat(sequence_gradient(obj, policy, task, max_len=T, aggregation=aggregation))
        assert float(reinforce.norm()) > 1e-3
        torch.testing.assert_close(exact, reinforce, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_bad_input_names_the_argument():
    task = make_task("bits", op="reverse", length=2)
    policy, old = tabular_pair(task, 3, seed=0)
    obj = get_objective("dapo")

    def call(**kw):
        args = dict(obj=obj, policy=policy, task=task, max_len=3, old_policy=old)
        args.update(kw)
        return sequence_gradient(args.pop("obj"), args.pop("policy"), args.pop("task"), **args)

    with pytest.raises(ValueError, match="advantage"):
        call(advantage="gae")
    with pytest.raises(ValueError, match="group_size"):
        call(advantage="grpo")
    with pytest.raises(ValueError, match="group_size"):
        call(group_size=4)
    with pytest.raises(ValueError, match="expected_coef"):
        call(obj=get_objective("clip_cov"))
    with pytest.raises(ValueError, match="expected_coef"):
        call(obj="dapo")
    with pytest.raises(ValueError, match="aggregation"):
        call(aggregation="sum")
    with pytest.raises(ValueError, match="max_len"):
        call(max_len=0)
    with pytest.raises(ValueError, match="max_len"):
        call(max_len=1)  # shorter than the answer (2 bits): nothing can be correct
    with pytest.raises(ValueError, match="max_len"):
        call(max_len=4)  # longer than the tabular policies' horizon
    with pytest.raises(ValueError, match="max_len"):
        enumerate_sequences(task, 17)
    with pytest.raises(ValueError, match="max_len"):
        TabularSequencePolicy(task, 17)
    with pytest.raises(ValueError, match="logits"):
        TabularSequencePolicy(task, 3, torch.zeros(4, 6, 3, dtype=F64))
    with pytest.raises(ValueError, match="task"):
        call(task=make_task("parity", length=3))
    with pytest.raises(ValueError, match="old_policy"):
        call(old_policy=object())
    with pytest.raises(ValueError, match="prompt"):
        call(prompt_ids=[[1, 3, 4, 4]])
    net, _, _ = transformer_pair()
    with pytest.raises(ValueError, match="model"):
        MaskedTransformerPolicy(
            TinyTransformer(net.model.config, num_models=2), (2, 3, 4), eos_id=2
        )
    leaky = MaskedTransformerPolicy(net.model, (0, 2, 3, 4), eos_id=2)  # <pad> gets mass
    with pytest.raises(ValueError, match="old_policy"):
        sequence_gradient(obj, net, task, old_policy=leaky, max_len=3)
