"""The ensemble's batched metric accumulator (llm.report.StepMetrics with ``members=K``, issues 28
item 4 and 26): the K members' metrics of a step summed as ``[K]`` tensors must give each member
exactly the row its own :class:`llm.report.StepMetrics` gives alone: token-weighted means,
extremes with empty micro-batches neutral, the loss, for members that sit out a micro-batch
(dynamic sampling dropped their rows) and members whose rule logs other metrics."""

from __future__ import annotations

import math

import pytest
import torch

from llm.report import StepMetrics

CPU = torch.device("cpu")


def micro_batches(K: int, seed: int) -> list[dict]:
    """Four micro-batches of K members: random losses, metrics (with NaN, *_max / *_min) and
    token counts; member 1 is empty in the second, member 2 sits out the third, member 3 logs
    no ``kl`` and never takes part before the last."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        metrics = []
        for k in range(K):
            m = {
                "clip_frac": torch.rand((), generator=gen),
                "kl": torch.randn((), generator=gen, dtype=torch.float64),
                "ratio_max": torch.randn((), generator=gen) * 3,
                "ratio_min": torch.randn((), generator=gen) * 3,
            }
            if k == 3:
                del m["kl"]
            if (i, k) == (0, 0):
                m["clip_frac"] = torch.tensor(math.nan)  # NaN times its 0 weight stays NaN
            metrics.append(m)
        empty = [(i, k) == (1, 1) for k in range(K)]
        active = [not ((i, k) == (2, 2) or (k == 3 and i < 3)) for k in range(K)]
        tokens = torch.randint(1, 20, (K,), generator=gen) * torch.tensor([not e for e in empty])
        if i == 0:
            tokens[0] = 0
        out.append(
            {
                "losses": torch.randn(K, generator=gen),
                "metrics": metrics,
                "tokens": tokens,
                "empty": empty,
                "active": active,
            }
        )
    return out


def test_stacked_metrics_equal_each_members_step_metrics():
    K = 5
    alone = [StepMetrics(CPU) for _ in range(K)]
    together = [StepMetrics(CPU) for _ in range(K)]
    stacked = StepMetrics(CPU, members=K)
    for mb in micro_batches(K, seed=0):
        stacked.add(mb["losses"], mb["metrics"], mb["tokens"], mb["empty"], mb["active"])
        for k in range(K):
            if mb["active"][k]:
                alone[k].add(mb["losses"][k], mb["metrics"][k], mb["tokens"][k], mb["empty"][k])
    stacked.split_into(together)
    for k in range(K):
        alone[k].add_grad_norm(torch.tensor(0.5 + k))
        together[k].add_grad_norm(torch.tensor(0.5 + k))
        want, got = alone[k].reduce(), together[k].reduce()
        assert sorted(got) == sorted(want), k
        for key, value in want.items():
            assert (math.isnan(value) and math.isnan(got[key])) or got[key] == value, (k, key)
    # the cases the batches set up are the ones the test means to check
    rows = [StepMetrics(CPU).reduce()]  # a member that never adds logs no metric
    assert sorted(rows[0]) == ["grad_norm", "loss"]
    assert math.isnan(alone[0].reduce()["clip_frac"])
    assert "kl" not in alone[3].reduce() and "kl" in alone[0].reduce()
    assert alone[1].reduce()["ratio_max"] != -math.inf


def test_a_member_that_never_takes_part_gets_no_metric():
    K = 3
    together = [StepMetrics(CPU) for _ in range(K)]
    stacked = StepMetrics(CPU, members=K)
    for mb in micro_batches(K, seed=1)[:2]:
        stacked.add(mb["losses"], mb["metrics"], mb["tokens"], mb["empty"], [True, True, False])
    stacked.split_into(together)
    assert sorted(together[2].reduce()) == ["grad_norm", "loss"]
    assert together[2].reduce()["loss"] == 0.0
    assert "ratio_min" in together[1].reduce() and "ratio_min" in together[0].reduce()


# one run's micro-batches: loss, clip_frac, ratio_max, ratio_min, valid tokens, empty
MICRO = [
    (0.25, 0.5, 1.5, 0.5, 3, False),
    (0.5, 0.25, 2.0, 0.75, 1, False),
    (0.0, 7.0, 9.0, -9.0, 0, True),  # the stand-in: no token, and its extremes neutral
]
# loss (0.25 + 0.5 + 0) / 2 updates; clip_frac (0.5 * 3 + 0.25 * 1 + 7 * 0) / 4 tokens; the
# extremes of the first two (the stand-in's 9 and -9 ignored); grad_norm the mean of 1 and 3
BY_HAND = {"loss": 0.375, "grad_norm": 2.0, "clip_frac": 0.4375, "ratio_max": 2.0, "ratio_min": 0.5}


@pytest.mark.parametrize("members", [None, 3])
def test_a_runs_row_by_hand(members):
    """The accumulation rules on values worked out by hand, for a run alone and for the same run
    as member 1 of 3 (member 0 sits out every micro-batch, member 2 logs other values): the
    same row. The losses are float64 and the row's loss the float32 sum, as alone."""
    metrics = StepMetrics(CPU, members)
    for loss, clip, high, low, tokens, empty in MICRO:
        mine = {"clip_frac": clip, "ratio_max": high, "ratio_min": low}
        mine = {k: torch.tensor(v) for k, v in mine.items()}
        if members is None:
            metrics.add(torch.tensor(loss, dtype=torch.float64), mine, torch.tensor(tokens), empty)
            continue
        other = {k: v * 10 for k, v in mine.items()}
        metrics.add(
            torch.tensor([1.0, loss, 5.0], dtype=torch.float64),
            [other, mine, other],
            torch.tensor([4, tokens, 2]),
            [False, empty, False],
            [False, True, True],
        )
    row = metrics
    if members is None:
        with pytest.raises(ValueError, match="runs: 1 given for the rows of 0 members"):
            metrics.split_into([StepMetrics(CPU)])
    else:
        rows = [StepMetrics(CPU) for _ in range(members)]
        with pytest.raises(ValueError, match="runs: 2 given for the rows of 3 members"):
            metrics.split_into(rows[:2])
        metrics.split_into(rows)
        assert sorted(rows[0].reduce()) == ["grad_norm", "loss"]
        row = rows[1]
    assert row.loss.dtype == torch.float32
    row.add_grad_norm(torch.tensor(1.0))
    row.add_grad_norm(torch.tensor(3.0))
    assert row.reduce() == BY_HAND


def test_adding_reads_nothing_back_to_the_host(monkeypatch):
    """A micro-batch's metrics stay on the device (a read back would sync a GPU per micro-step):
    every way a tensor reaches Python raises while a run alone and K members add theirs."""

    def read_back(*args, **kwargs):
        raise AssertionError("a tensor read back to the host")

    K, stacked, alone = 5, StepMetrics(CPU, members=5), StepMetrics(CPU)
    batches = micro_batches(K, seed=2)
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, read_back)
    for mb in batches:
        stacked.add(mb["losses"], mb["metrics"], mb["tokens"], mb["empty"], mb["active"])
        alone.add(mb["losses"][0], mb["metrics"][0], mb["tokens"][0], mb["empty"][0])
    monkeypatch.undo()
    assert sorted(alone.sums) == ["_tokens", "clip_frac", "kl"]
    assert sorted(stacked.extremes) == ["ratio_max", "ratio_min"]


def step_batch(gen: torch.Generator, rows: int, prompt: int, completion: int, pad: int) -> dict:
    """A member's step batch: left-padded prompts whose first column is padding in every row,
    completions of random lengths with non-pad tokens and log-probs beyond their masks (what a
    gather must not carry into the trimmed micro-batch)."""
    lengths = torch.randint(1, prompt, (rows,), generator=gen)
    prompt_mask = (torch.arange(prompt) >= prompt - lengths[:, None]).long()
    done = torch.randint(0, completion + 1, (rows,), generator=gen)
    completion_mask = (torch.arange(completion) < done[:, None]).long()
    return {
        "prompt": torch.where(
            prompt_mask.bool(), torch.randint(3, 50, (rows, prompt), generator=gen), pad
        ),
        "prompt_mask": prompt_mask,
        "completion": torch.randint(3, 50, (rows, completion), generator=gen),
        "completion_mask": completion_mask,
        "loss_mask": completion_mask * (torch.rand(rows, generator=gen) > 0.3)[:, None],
        "logp_old": torch.randn(rows, completion, generator=gen),
        "adv": torch.randn(rows, generator=gen),
    }


def test_gathered_micro_batches_equal_trimmed_padded_stacked_ones():
    from types import SimpleNamespace

    from llm.ensemble import StepRows, micro_batch
    from llm.train import minibatch_counts

    gen, pad = torch.Generator().manual_seed(0), 1
    shapes = [(5, 7), (9, 4), (6, 10)]  # per member: prompt and completion widths
    batches = [step_batch(gen, 8, p, c, pad) for p, c in shapes]
    hosts = [{k: v.clone() for k, v in b.items()} for b in batches]
    cfg = SimpleNamespace(max_new_tokens=10)
    runs = [SimpleNamespace(device=CPU, tokenizer=SimpleNamespace(pad_token_id=pad), cfg=cfg)] * 3
    step_rows = StepRows.of(batches, hosts, pad)
    assert step_rows is not None
    for trial in range(6):
        pieces = [torch.randperm(8, generator=gen)[: 1 + trial % 4] for _ in shapes]
        got, got_sizes, _ = micro_batch(runs, batches, hosts, pieces, step_rows)
        want, want_sizes, _ = micro_batch(runs, batches, hosts, pieces, None)
        assert got_sizes == want_sizes
        assert sorted(got) == sorted(want)
        for key in want:
            assert got[key].dtype == want[key].dtype, key
            assert torch.equal(got[key], want[key]), (trial, key)
        counts = step_rows.counts(runs, pieces)  # the minibatch's counts, gathered alike
        for run, batch, rows, count in zip(runs, batches, pieces, counts, strict=True):
            alone = minibatch_counts(run, batch, rows)
            assert count["max_len"] == alone["max_len"] == 10
            for key in ("num_tokens", "num_seqs"):
                assert count[key].dtype == alone[key].dtype and count[key] == alone[key], key
    # rows that differ in number between members take the trimming path
    assert StepRows.of([*batches[:1], step_batch(gen, 6, 5, 5, pad)], hosts[:2], pad) is None
