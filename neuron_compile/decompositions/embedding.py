"""``embedding_bag``: the forward ops and the backward ops eager's autograd formula calls.

Decompositions apply below autograd, so ``_embedding_bag``'s backward reaches the graph as
``_embedding_bag_backward`` (and ``_embedding_bag_per_sample_weights_backward``); those and
``_embedding_bag_dense_backward`` are decomposed here too, after eager's CPU kernels
(``aten/src/ATen/native/EmbeddingBag.cpp``).

Bag membership is computed in-graph the way eager's ``make_offset2bag`` does it (a scatter of
ones at the offsets, then a cumsum), so no shape depends on the offsets' values. The four outputs
keep eager's shapes and values, including its path-dependent ones:

- ``offset2bag`` is empty on eager's "fast path" (sum mode, float/half/bfloat16 weight with unit
  row stride, no ``padding_idx``), otherwise one bag id per index;
- ``bag_size`` counts the non-padding indices of each bag for mean/max (the last bag runs to the
  end of ``indices``), is zero for sum, and has ``offsets.numel()`` entries for the
  forward-only sum;
- ``max_indices`` holds, for max, the first index in bag order reaching the maximum (a NaN
  first element wins, later NaNs are skipped, as eager's ``>`` comparison does) and 0 for empty
  bags; otherwise it copies ``bag_size``.

Sums accumulate in float32 and round once, as eager's CPU kernels do for half/bfloat16; mean
divides that rounded sum by the bag size converted to the weight dtype. Eager's fast path sums
through FBGEMM in its own order, so a sum can differ from it at float32 rounding level (for
bfloat16, rarely, by one bfloat16 ulp). On the fast path with
``include_last_offset`` eager sums only up to ``offsets[-1]``; elsewhere the last bag runs to the
end of ``indices``: both are kept. What stays on the CPU (the decomposition declines): 2-D
``indices`` and ``sparse`` gradients. ``scale_grad_by_freq`` follows eager's kernel, which divides
by the count of the g-th smallest index, g being the index's rank among the distinct values.
"""

from __future__ import annotations

from typing import Any

import torch

from .counting import scatter_count, scatter_min_position

aten = torch.ops.aten

_SUM, _MEAN, _MAX = 0, 1, 2
_FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _offset2bag(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """Bag id of each of ``n`` positions: the number of offsets at or before it, minus one
    (eager's ``make_offset2bag``; an offset equal to ``n`` lands in the dropped last slot)."""
    marks = scatter_count((n + 1,), 0, offsets.to(torch.int64), None)
    return (marks.cumsum(0) - 1)[:n].to(offsets.dtype)


def _bag_lengths(offsets: torch.Tensor, num_bags: int, n: int) -> torch.Tensor:
    """``offsets[b+1] - offsets[b]``, the last bag running to ``n`` (eager's
    ``make_bag_size_out``, which ignores a trailing ``include_last_offset`` offset)."""
    starts = offsets[:num_bags]
    ends = torch.cat([offsets[1:num_bags], torch.full_like(offsets[:1], n)])
    return ends - starts


def _per_element(column: torch.Tensor, width: int) -> torch.Tensor:
    """``column[:, None]`` spread to ``width`` columns through a gather, not a broadcast: XLA
    rewrites ``x / broadcast(y)`` as ``x * broadcast(1 / y)``, which is not eager's quotient."""
    rows = torch.arange(column.shape[0], device=column.device).unsqueeze(1).expand(-1, width)
    return column.unsqueeze(1).expand(-1, width).gather(0, rows)


def _is_fast_path(weight: torch.Tensor, psw: torch.Tensor | None, padding_idx: int) -> bool:
    """Eager's ``is_fast_path``: the branch that skips ``offset2bag`` and padding handling."""
    return (
        weight.dtype in _FAST_DTYPES
        and weight.stride(1) == 1
        and (psw is None or psw.stride(0) == 1)
        and padding_idx < 0
    )


def _bag_max(
    weight: torch.Tensor,
    indices: torch.Tensor,
    bag: torch.Tensor,
    valid: torch.Tensor,
    nonempty: torch.Tensor,
    num_bags: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Max mode: (output, max_indices). Eager keeps a bag's first element and replaces it only
    with a strictly greater one, so the winner is the first position reaching the max of the
    non-NaN elements, unless the first element is NaN."""
    n, dim = indices.shape[0], weight.shape[1]
    rows = weight.index_select(0, indices)
    # Padding positions go to a spare bag ``num_bags``, sliced off at the end.
    key = torch.where(valid, bag, num_bags).to(torch.int64)
    key2 = key.unsqueeze(1).expand(n, dim)
    pos = torch.arange(n, device=indices.device)
    first = scatter_min_position((num_bags + 1,), 0, key, pos, n)
    first_rows = rows.index_select(0, first.clamp(max=n - 1))  # (num_bags + 1, dim)

    finite = torch.where(rows.isnan(), float("-inf"), rows)
    top = torch.full((num_bags + 1, dim), float("-inf"), dtype=rows.dtype, device=rows.device)
    top = top.scatter_reduce(0, key2, finite, "amax")
    hit = rows == top.gather(0, key2)
    pos2 = pos.unsqueeze(1).expand(n, dim)
    winner = scatter_min_position((num_bags + 1, dim), 0, key2, torch.where(hit, pos2, n), n)
    winner = torch.where(first_rows.isnan(), first.unsqueeze(1), winner)[:num_bags]

    picked = indices.index_select(0, winner.clamp(max=n - 1).flatten()).view(num_bags, dim)
    max_indices = torch.where(nonempty.unsqueeze(1), picked, 0)
    output = torch.where(nonempty.unsqueeze(1), weight.gather(0, max_indices.long()), 0)
    return output, max_indices


def _embedding_bag_impl(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    mode: int,
    per_sample_weights: torch.Tensor | None,
    include_last_offset: bool,
    padding_idx: int,
    requires_grad: bool,
) -> Any:
    if indices.dim() != 1 or offsets.dim() != 1 or weight.dim() != 2:
        return NotImplemented
    index_dtype = torch.promote_types(indices.dtype, offsets.dtype)
    indices, offsets = indices.to(index_dtype), offsets.to(index_dtype)
    n, dim = indices.shape[0], weight.shape[1]
    num_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    fast = _is_fast_path(weight, per_sample_weights, padding_idx)
    new = {"dtype": index_dtype, "device": indices.device}

    bag = _offset2bag(offsets[:num_bags], n)
    valid = indices != padding_idx
    if mode == _SUM and not requires_grad:
        bag_size = torch.zeros(offsets.shape[0], **new)
    elif mode == _SUM:
        bag_size = torch.zeros(num_bags, **new)
    else:
        # Padding indices do not count (eager decrements the size once per padding index).
        padded = scatter_count((num_bags + 1,), 0, bag.clamp(min=0).long(), ~valid)
        padded = padded.to(index_dtype)
        bag_size = _bag_lengths(offsets, num_bags, n) - padded[:num_bags]
    offset2bag = torch.zeros(0, **new) if (mode == _SUM and fast) else bag

    if n == 0 or num_bags == 0:
        # Nothing to gather (with no bags, eager's offset2bag is all -1 and fits no bag).
        output = torch.zeros(num_bags, dim, dtype=weight.dtype, device=weight.device)
        max_indices = torch.zeros(num_bags, dim, **new) if mode == _MAX else bag_size.clone()
        return output, offset2bag, bag_size, max_indices
    if mode == _MAX:
        output, max_indices = _bag_max(weight, indices, bag, valid, bag_size > 0, num_bags)
        return output, offset2bag, bag_size, max_indices

    acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    rows = weight.index_select(0, indices).to(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(acc).unsqueeze(1)
    keep = valid
    if fast and include_last_offset:
        # Eager's fast path sums [offsets[b], offsets[b+1]) only, even for the last bag.
        keep = keep & (torch.arange(n, device=indices.device) < offsets[-1])
    rows = torch.where(keep.unsqueeze(1), rows, 0)
    total = torch.zeros(num_bags + 1, dim, dtype=acc, device=weight.device)
    output = total.index_add(0, bag, rows)[:num_bags].to(weight.dtype)
    if mode == _MEAN:
        output = output / _per_element(bag_size.clamp(min=1).to(weight.dtype), dim)
    return output, offset2bag, bag_size, bag_size.clone()


def _embedding_bag(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> Any:
    """``aten._embedding_bag``: eager's ``requires_grad=True`` path."""
    return _embedding_bag_impl(
        weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, True
    )


def _embedding_bag_forward_only(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> Any:
    """``aten._embedding_bag_forward_only``: as ``_embedding_bag`` but a sum's ``bag_size``
    keeps ``offsets``' length."""
    return _embedding_bag_impl(
        weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx, False
    )


def _embedding_bag_dense_backward(
    grad: torch.Tensor,
    indices: torch.Tensor,
    offset2bag: torch.Tensor,
    bag_size: torch.Tensor,
    maximum_indices: torch.Tensor,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    per_sample_weights: torch.Tensor | None,
    padding_idx: int = -1,
) -> Any:
    """Weight gradient. Max: each nonempty bag's gradient goes to the row that won. Sum/mean:
    each index adds its bag's gradient times its scale (sample weight, over the frequency with
    ``scale_grad_by_freq``, over the size of a nonempty mean bag), cast to the gradient dtype as
    eager's ``axpy`` scale is."""
    if indices.dim() != 1 or grad.dim() != 2:
        return NotImplemented
    dim = grad.shape[1]
    out = torch.zeros(num_weights, dim, dtype=grad.dtype, device=grad.device)
    if mode == _MAX:
        live = (bag_size != 0).unsqueeze(1)
        return out.scatter_add(0, maximum_indices.to(torch.int64), torch.where(live, grad, 0))
    rows = grad.index_select(0, offset2bag)
    # Eager computes the scale in double, then casts it to the gradient dtype.
    wide = torch.promote_types(grad.dtype, torch.float32)
    scale = torch.ones(indices.shape[0], dtype=wide, device=grad.device)
    if per_sample_weights is not None:
        scale = per_sample_weights.to(wide)
    if scale_grad_by_freq:
        scale = scale / _eager_frequency(indices, num_weights).to(wide)
    if mode == _MEAN:
        size = bag_size.index_select(0, offset2bag)
        scale = scale / torch.where(size != 0, size, 1).to(wide)
    if per_sample_weights is not None or scale_grad_by_freq or mode == _MEAN:
        rows = rows * scale.to(grad.dtype).unsqueeze(1)
    rows = torch.where((indices != padding_idx).unsqueeze(1), rows, 0)
    return out.index_add(0, indices, rows)


def _eager_frequency(indices: torch.Tensor, num_weights: int) -> torch.Tensor:
    """The divisor eager's ``scale_grad_by_freq`` applies to each index: not the index's own
    count but ``counts[sorted[g]]``, where ``g`` numbers the index among the distinct values
    and ``sorted`` is the sorted index list (``counts[indices_data[i]]`` in
    ``_embedding_bag_dense_backward_cpu_sum_mean``). Built from counts and cumsums, no sort."""
    n = indices.shape[0]
    idx = indices.to(torch.int64)
    counts = scatter_count((num_weights,), 0, idx, None)
    # sorted[k] = the number of values whose run ends at or before position k.
    marks = scatter_count((n + 1,), 0, counts.cumsum(0), None)
    sorted_values = marks.cumsum(0)[:n]
    group = ((counts > 0).to(torch.int64).cumsum(0) - 1).index_select(0, idx)
    return counts.index_select(0, sorted_values.index_select(0, group))


def _embedding_bag_backward(
    grad: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    offset2bag: torch.Tensor,
    bag_size: torch.Tensor,
    maximum_indices: torch.Tensor,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: torch.Tensor | None,
    padding_idx: int = -1,
) -> Any:
    """``_embedding_bag``'s weight gradient: rebuilds an empty ``offset2bag`` from all of
    ``offsets`` (as eager does) and takes the dense backward; sparse gradients decline."""
    if sparse or indices.dim() != 1:
        return NotImplemented
    index_dtype = torch.promote_types(indices.dtype, offsets.dtype)
    indices, offsets = indices.to(index_dtype), offsets.to(index_dtype)
    n = indices.shape[0]
    if n != 0 and offset2bag.numel() == 0:
        offset2bag = _offset2bag(offsets, n)
    return _embedding_bag_dense_backward(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


def _embedding_bag_per_sample_weights_backward(
    grad: torch.Tensor,
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    offset2bag: torch.Tensor,
    mode: int,
    padding_idx: int = -1,
) -> Any:
    """Per-sample-weight gradient: ``grad[bag(i)] . weight[indices[i]]``, 0 for padding.
    An empty ``offset2bag`` (eager's fast path) is rebuilt from all of ``offsets``, as eager
    does."""
    if mode != _SUM or indices.dim() != 1:
        return NotImplemented
    n = indices.shape[0]
    if n != 0 and offset2bag.numel() == 0:
        offset2bag = _offset2bag(offsets.to(torch.promote_types(indices.dtype, offsets.dtype)), n)
    acc = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    g = grad.index_select(0, offset2bag).to(acc)
    w = weight.index_select(0, indices).to(acc)
    dot = (g * w).sum(1).to(grad.dtype)
    return torch.where(indices != padding_idx, dot, 0)


DECOMPOSITIONS: dict[Any, Any] = {
    aten._embedding_bag.default: _embedding_bag,
    aten._embedding_bag_forward_only.default: _embedding_bag_forward_only,
    aten._embedding_bag_backward.default: _embedding_bag_backward,
    aten._embedding_bag_dense_backward.default: _embedding_bag_dense_backward,
    aten._embedding_bag_per_sample_weights_backward.default: (
        _embedding_bag_per_sample_weights_backward
    ),
}
