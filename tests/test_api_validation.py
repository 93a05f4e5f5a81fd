"""Nonsense given to the Python API is a ValueError naming the argument (issue 13, item 8), and the
value checks stay out of the hot path: with ``validate=False`` nothing reads the device."""

import math

import pytest
import torch

from sandbox.aggregate import AGGREGATION_MODES, aggregate
from sandbox.objectives import (
    available_objectives,
    available_presets,
    get_objective,
    objective_class,
)

F64 = torch.float64
ALL_NAMES = available_objectives() + available_presets()
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]], dtype=F64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def inputs(B=2, T=3):
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(B, T, generator=g, dtype=F64)
    return logp_old + 0.1, logp_old, torch.randn(B, 1, generator=g, dtype=F64)


# --------------------------------------------------------------------------------------------------
# aggregate
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("argument", ["num_tokens", "num_seqs"])
@pytest.mark.parametrize("value", [0, -5, 0.0, math.nan])
def test_aggregate_refuses_non_positive_counts(mode, argument, value):
    with pytest.raises(ValueError, match=rf"^{argument} must be positive"):
        aggregate(LOSS, MASK, mode, **{argument: value})
    # a tensor count is a device value: checked under validate (the default) only
    with pytest.raises(ValueError, match=rf"^{argument} must be positive"):
        aggregate(LOSS, MASK, mode, **{argument: torch.tensor(float(value))})
    aggregate(LOSS, MASK, mode, validate=False, **{argument: torch.tensor(float(value))})


def test_aggregate_refuses_count_tensors_of_the_wrong_size():
    with pytest.raises(ValueError, match=r"^num_tokens must be a number or a tensor of 1 or"):
        aggregate(LOSS, MASK, num_tokens=torch.tensor([3.0, 2.0]))
    with pytest.raises(ValueError, match=r"^num_seqs must be a number or a tensor"):
        aggregate(LOSS, MASK, "seq-mean-token-mean", num_seqs="2")
    # a [groups] tensor is fine: one count per block
    per_block = aggregate(LOSS, MASK, groups=2, num_tokens=torch.tensor([3.0, 2.0]))
    assert per_block.item() == pytest.approx(6 / 3 + 9 / 2, abs=1e-12)


def test_aggregate_max_len_must_cover_the_longest_sequence():
    # The longest sequence holds 3 valid tokens: L = 2 is nonsense, L = 3 is T (the default).
    with pytest.raises(ValueError, match=r"^max_len must be at least the longest sequence \(3"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=2)
    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError, match=r"^max_len must be positive"):
            aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=bad)
    with pytest.raises(ValueError, match=r"^max_len must be a number"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len="3")
    # (6/3 + 9/3) / 2 = 2.5; all-padding columns beyond L are harmless (sequences of <= 3 tokens)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", max_len=3).item() == 2.5
    padded = torch.nn.functional.pad(MASK, (0, 4))
    wide = torch.nn.functional.pad(LOSS, (0, 4), value=7.0)
    assert aggregate(wide, padded, "seq-mean-token-sum-norm", max_len=3).item() == 2.5


@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0])
def test_aggregate_refuses_masks_other_than_zero_one(bad):
    mask = MASK.to(F64)
    mask[0, 1] = bad
    with pytest.raises(ValueError, match=rf"^mask must hold only 0 and 1.*{bad}"):
        aggregate(LOSS, mask)
    # a 0/1 float or int mask is the bool mask
    assert aggregate(LOSS, MASK.to(F64)).item() == aggregate(LOSS, MASK).item() == 3.0
    assert aggregate(LOSS, MASK.long()).item() == 3.0


def test_aggregate_on_an_empty_mask_raises_as_the_objectives_do():
    empty = torch.zeros_like(MASK)
    for mode in AGGREGATION_MODES:
        with pytest.raises(ValueError, match=r"^mask is empty"):
            aggregate(LOSS, empty, mode)
        # validate=False (hot loops, all-padding micro-batches under DDP) gives 0
        assert aggregate(LOSS, empty, mode, validate=False).item() == 0.0
    obj = get_objective("ppo_clip")
    with pytest.raises(ValueError, match=r"^mask is empty"):
        obj(*inputs(), empty)


def test_aggregate_refuses_non_tensors():
    with pytest.raises(ValueError, match=r"^loss must be a torch\.Tensor"):
        aggregate(LOSS.tolist(), MASK)
    with pytest.raises(ValueError, match=r"^mask must be a torch\.Tensor"):
        aggregate(LOSS, MASK.tolist())


# --------------------------------------------------------------------------------------------------
# objectives
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", available_objectives())
@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0])
def test_objectives_refuse_masks_other_than_zero_one(name, bad):
    logp, logp_old, adv = inputs()
    mask = torch.ones(2, 3, dtype=F64)
    mask[1, 2] = bad
    with pytest.raises(ValueError, match=rf"^mask must hold only 0 and 1.*{bad}"):
        get_objective(name)(logp, logp_old, adv, mask)


@pytest.mark.parametrize("name", available_objectives())
@pytest.mark.parametrize("generator", [123, "seed", torch.tensor(1)])
def test_generator_must_be_a_torch_generator(name, generator):
    with pytest.raises(ValueError, match=r"^generator must be a torch\.Generator or None"):
        get_objective(name)(*inputs(), generator=generator)


@pytest.mark.parametrize(
    "name", [n for n in available_objectives() if get_objective(n).has_expected_coef()]
)
def test_expected_coef_shapes_must_broadcast(name):
    obj = get_objective(name)
    with pytest.raises(ValueError, match=r"ratio \(3,\) and adv \(2,\) must have broadcastable"):
        obj.expected_coef(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match=r"^adv must be a number or a torch\.Tensor"):
        obj.expected_coef(1.0, [1.0])
    # broadcastable shapes are fine: [3, 1] x [2] -> [3, 2]
    assert obj.expected_coef(torch.ones(3, 1), torch.ones(2)).shape == (3, 2)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((), ()),
        ((3,), ()),
        ((3, 1), (2,)),
        ((1, 4), (5, 1)),
        ((2, 0), (1,)),
        ((0,), (1, 1)),
        ((2, 3), (4, 3)),
        ((0,), (3,)),
        ((2, 1, 3), (4, 1)),
    ],
)
def test_expected_coef_broadcasts_as_torch_does(a, b):
    """The closed forms' own shape broadcast (plain Python, for the exact flows' loops) agrees
    with ``torch.broadcast_shapes``: the same shape, or the same refusal."""
    try:
        want = tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        want = None
    obj = get_objective("ppo_clip")
    ratio, adv = torch.full(a, 1.1, dtype=torch.float64), torch.ones(b, dtype=torch.float64)
    if want is None:
        with pytest.raises(ValueError, match="must have broadcastable shapes"):
            obj.expected_coef(ratio, adv)
    else:
        assert obj.expected_coef(ratio, adv).shape == want


@pytest.mark.parametrize("name", ALL_NAMES)
def test_adv_of_shape_b_is_adv_of_shape_b_1(name):
    """One advantage per sequence may be given as ``[B]``; it is read as ``[B, 1]``."""
    logp, logp_old, adv = inputs(B=4, T=5)
    a = get_objective(name)(logp, logp_old, adv[:, 0], generator=torch.Generator().manual_seed(1))
    b = get_objective(name)(logp, logp_old, adv, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=0)
    torch.testing.assert_close(a.coef, b.coef, rtol=0, atol=0)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_validate_false_never_reads_the_device(name):
    """With ``validate=False`` a call and its aggregation read no tensor value on the host: on the
    ``meta`` device (shapes without data) any such read raises. Stochastic rules get their draws
    as a meta tensor too (a generator draws on a real device)."""
    obj = get_objective(name)
    shape = obj.draw(torch.zeros(4, 6), torch.Generator()) if obj.stochastic else None
    if shape is not None:
        obj.draw = lambda logp, generator: torch.empty(shape.shape, device="meta", dtype=F64)
    meta = {"device": "meta", "dtype": F64}
    logp = torch.empty(4, 6, requires_grad=True, **meta)
    mask = torch.empty(4, 6, device="meta", dtype=torch.bool)
    out = obj(logp, torch.empty(4, 6, **meta), torch.empty(4, 1, **meta), mask, validate=False)
    counts = {"num_tokens": torch.empty((), **meta), "num_seqs": torch.empty((), **meta)}
    for mode in AGGREGATION_MODES:
        loss = aggregate(out.loss, mask, mode, max_len=6, validate=False, **counts)
    loss.backward()
    assert out.coef.shape == (4, 6) and all(v.dim() == 0 for v in out.metrics.values())


# --------------------------------------------------------------------------------------------------
# batch-statistic objectives (issue 11): declared on the class, and only where true
# --------------------------------------------------------------------------------------------------


def test_batch_statistic_objectives_are_declared():
    declared = {n for n in available_objectives() if objective_class(n).batch_statistic}
    assert declared == {"clip_cov", "kl_cov"}


@pytest.mark.parametrize("name", available_objectives())
def test_batch_statistic_matches_behaviour(name):
    """A rule without ``batch_statistic`` gives each row the same loss whether it is called on the
    whole batch or on a part (draws aside: deterministic rules only); a batch-statistic rule
    does not (KL-Cov's top-k and Clip-Cov's candidates depend on the batch's covariance)."""
    obj = get_objective(name)
    if obj.stochastic and not obj.batch_statistic:
        pytest.skip("draws are laid out by shape")
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(8, 6, generator=g, dtype=F64) * 3
    logp = logp_old + 0.3 * torch.randn(8, 6, generator=g, dtype=F64)
    adv = torch.randn(8, 1, generator=g, dtype=F64) + torch.arange(8, dtype=F64)[:, None] - 4
    kw = {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.0} if name == "clip_cov" else {}
    kw |= {"kl_cov_ratio": 0.2} if name == "kl_cov" else {}
    obj = get_objective(name, **kw)

    def loss(rows):
        gen = torch.Generator().manual_seed(0)
        return obj(logp[rows], logp_old[rows], adv[rows], generator=gen).loss

    whole = loss(slice(0, 8))
    splits = (slice(0, 2), slice(0, 4), slice(2, 8), slice(5, 8))
    changed = [not torch.equal(whole[rows], loss(rows)) for rows in splits]
    assert any(changed) == obj.batch_statistic
