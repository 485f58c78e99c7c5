"""``embedding_bag`` and ``segment_reduce`` through ``torch.compile(backend="neuron")`` vs eager:
forward and backward in float32 and bfloat16, with no CPU fallback (both ops and their backward
ops are decomposed in ``neuron_compile/decompositions/``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neuron_compile
from neuron_compile.compiler import DowncastWarning
from tests.parity import assert_compiled_gradients_match

aten = torch.ops.aten

INDICES = torch.tensor([1, 2, 2, 5, 0, 3, 4, 1, 2, 7])
# Bag 1 is empty; the last bag runs to the end of the indices.
OFFSETS = torch.tensor([0, 3, 3, 6])
DTYPES = [torch.float32, torch.bfloat16]

BAG_CASES = {
    "sum": dict(mode="sum"),
    "mean": dict(mode="mean"),
    "max": dict(mode="max"),
    "sum-padding": dict(mode="sum", padding_idx=2),
    "mean-padding": dict(mode="mean", padding_idx=2),
    "max-padding": dict(mode="max", padding_idx=2),
    "sum-last-offset": dict(mode="sum", include_last_offset=True),
    "max-last-offset": dict(mode="max", include_last_offset=True),
    # Index 2 appears 3 times, but eager divides its gradient by counts[sorted[2]] = 2.
    "sum-freq": dict(mode="sum", scale_grad_by_freq=True),
    "mean-freq-padding": dict(mode="mean", scale_grad_by_freq=True, padding_idx=5),
}


def _weight(dtype: torch.dtype) -> torch.Tensor:
    # Distinct values, so max picks the same row as eager and its gradient lands alike.
    return (torch.randperm(8 * 6).float() / 48 - 0.5).reshape(8, 6).to(dtype)


def _all_bags(w: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Every case of ``BAG_CASES`` and a per-sample-weighted sum, in one graph (one compile)."""
    outs = [F.embedding_bag(INDICES, w, OFFSETS, mode="sum", per_sample_weights=p)]
    for kw in BAG_CASES.values():
        last = kw.get("include_last_offset", False)
        offsets = torch.cat([OFFSETS, torch.tensor([10])]) if last else OFFSETS
        outs.append(F.embedding_bag(INDICES, w, offsets, **kw))
    return torch.cat([o.flatten() for o in outs])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_embedding_bag_forward_and_backward(dtype: torch.dtype) -> None:
    # The bag offsets are int64 arithmetic (not only indices): the 64-bit policy says so.
    with pytest.warns(DowncastWarning, match=r"INDICES, OFFSETS \(int64 -> int32\)"):
        assert_compiled_gradients_match(_all_bags, [_weight(dtype), torch.randn(10).to(dtype)])


FOUR_OUTPUT_CASES = [(0, -1, False), (0, 2, False), (1, 2, False), (2, -1, True), (2, 2, False)]


def test_embedding_bag_all_four_outputs_equal_eager() -> None:
    """offset2bag, bag_size and max_indices too, with eager's shapes (empty offset2bag on the
    fast sum path, offsets-length bag_size for the forward-only sum), for both overloads."""

    def every_output(w: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for op in (aten._embedding_bag.default, aten._embedding_bag_forward_only.default):
            for mode, padding_idx, last in FOUR_OUTPUT_CASES:
                offsets = torch.tensor([0, 3, 3, 6, 10]) if last else OFFSETS
                outs += op(w, INDICES, offsets, False, mode, False, None, last, padding_idx)
        return outs

    weight = _weight(torch.float32)
    neuron_compile.clear_fallback_ops()
    with pytest.warns(DowncastWarning, match="OFFSETS"):
        got = torch.compile(every_output, backend="neuron")(weight)
    want = every_output(weight)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert not neuron_compile.get_fallback_ops()


def test_embedding_bag_max_first_nan_wins_later_nan_is_skipped() -> None:
    weight = _weight(torch.float32)
    weight[1, 0] = float("nan")  # first in bag 0: eager keeps it
    weight[4, 1] = float("nan")  # not first in its bag: eager's ">" skips it
    fn = lambda w: F.embedding_bag(INDICES, w, OFFSETS, mode="max")  # noqa: E731
    with pytest.warns(DowncastWarning, match="OFFSETS"):
        got = torch.compile(fn, backend="neuron")(weight)
    torch.testing.assert_close(got, fn(weight), equal_nan=True, rtol=0, atol=0)


# name -> (data shape, axis, lengths, initial); each runs every reduction.
SEGMENT_CASES = {
    "1d-empty-segments-initial": ((6,), 0, [2, 0, 3, 1], 2.0),
    "3d-axis1-batched-lengths": ((2, 5, 3), 1, [[2, 0, 3], [1, 4, 0]], None),
}


def _segment_data(shape: tuple[int, ...]) -> torch.Tensor:
    """Distinct nonzero values of both signs (no ties, no zeros: the quirks test covers those)."""
    numel = torch.Size(shape).numel()
    data = (torch.randperm(numel * 10)[:numel].float() / 10 + 0.5).reshape(shape)
    return data * torch.where(torch.rand(shape) < 0.5, -1.0, 1.0)


def _all_segment_reductions(*xs: torch.Tensor) -> torch.Tensor:
    outs = []
    for x, (_, axis, lengths, initial) in zip(xs, SEGMENT_CASES.values(), strict=True):
        lengths = torch.tensor(lengths)
        for reduce in ("sum", "mean", "max", "min", "prod"):
            out = torch.segment_reduce(x, reduce, lengths=lengths, axis=axis, initial=initial)
            # A mean's empty segment is NaN (eager's gradient there is 0): compare it as 0.
            outs.append(out.nan_to_num().flatten())
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_segment_reduce_forward_and_backward(dtype: torch.dtype) -> None:
    """Every reduction, with and without ``initial``, over 1-D and batched-lengths 3-D data with
    empty segments, in one graph."""
    inputs = [_segment_data(shape).to(dtype) for shape, *_ in SEGMENT_CASES.values()]
    assert_compiled_gradients_match(_all_segment_reductions, inputs)


def test_segment_reduce_backward_quirks() -> None:
    """Ties (max/min: a positive gradient is shared, a negative one is not) and zeros (prod:
    exclusive products), with offsets instead of lengths."""
    data = torch.tensor([3.0, 3.0, 1.0, 0.0, 2.0, 0.0, 5.0, 0.0, -1.0])
    offsets = torch.tensor([0, 2, 5, 6, 9])

    def fn(x: torch.Tensor) -> torch.Tensor:
        parts = [torch.segment_reduce(x, r, offsets=offsets) for r in ("max", "min", "prod")]
        return torch.cat(parts)

    ours, theirs = data.clone().requires_grad_(), data.clone().requires_grad_()
    with pytest.warns(DowncastWarning, match="offsets"):
        got = torch.compile(fn, backend="neuron")(ours)
    want = fn(theirs)
    cotangent = torch.tensor([2.0, -3.0, 4.0, -5.0] * 3)
    got.backward(cotangent)
    want.backward(cotangent)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=0, atol=0)
