"""What the 64-bit policy narrows, in the user's words (the ``DowncastWarning`` and NC104).

Each graph input that runs narrowed (float64 as float32, int64 as int32) becomes one entry of
``LoweredGraph.downcasts``: ``"<name>: <dtype> -> <dtype>"``, where the name is the user's
(``x``, ``d1.1.weight`` as ``named_parameters()`` says it). Inputs whose narrowing is exact by
construction end with ``EXEMPT`` and a reason; they are logged at INFO, never warned about, and
are not report findings:

- int64 values used only as indices into a dimension below 2**31 (token ids into an embedding,
  gather/scatter/index_select indices, nll_loss targets), through views and ignore-index masks:
  a valid index fits int32, and an invalid one is an error either way;
- BatchNorm's ``num_batches_tracked`` when the graph only increments it by 1 and hands it back:
  exact for fewer than 2**31 steps (a counter restored from a checkpoint at or above that wraps);
- activations a backward graph reads from its forward: the forward computed them narrowed.

64-bit values an op makes inside a graph (``widens``) are one entry per dtype: any float64, and
int64 sums and products of narrower integers unless every result fits int32 (a mask's count).
"""

from __future__ import annotations

import operator
import re
from collections import defaultdict

import torch
import torch.fx as fx

#: Marks an entry that is narrowed exactly and not warned about; the reason follows.
EXEMPT = " [exact: "

#: How backend._label_user_inputs labels a backward input the forward saved.
SAVED = "(saved by the forward)"
_INDEX_LIMIT = 2**31
_aten = torch.ops.aten


def _overloads(*packets: object) -> frozenset:
    return frozenset(getattr(p, o) for p in packets for o in p.overloads())  # type: ignore[attr-defined]


#: op -> (position of the index argument, position of the tensor it indexes)
_INDEX_SINKS: dict = {
    **dict.fromkeys(_overloads(_aten.embedding), (1, 0)),
    **dict.fromkeys(_overloads(_aten.embedding_dense_backward), (1, 0)),
    **dict.fromkeys(
        _overloads(
            _aten.gather,
            _aten.scatter,
            _aten.scatter_add,
            _aten.scatter_reduce,
            _aten.index_select,
            _aten.index_add,
            _aten.index_copy,
            _aten.index_fill,
            _aten.take_along_dim,
        ),
        (2, 0),
    ),
    **dict.fromkeys(
        _overloads(_aten.index, _aten.index_put, _aten._unsafe_index, _aten._unsafe_index_put),
        (1, 0),
    ),
    **dict.fromkeys(_overloads(_aten.nll_loss_forward, _aten.nll_loss2d_forward), (1, 0)),
    **dict.fromkeys(_overloads(_aten.nll_loss_backward, _aten.nll_loss2d_backward), (2, 1)),
}
#: ops whose result carries the same index values (or a subset of them)
_CARRIERS = _overloads(
    _aten.view,
    _aten._unsafe_view,
    _aten.reshape,
    _aten.unsqueeze,
    _aten.squeeze,
    _aten.expand,
    _aten.clone,
    _aten.slice,
    _aten.select,
    _aten.permute,
    _aten.transpose,
    _aten.t,
    _aten.alias,
    _aten.detach,
    _aten.lift_fresh_copy,
    _aten.clamp,
    _aten.clamp_min,
    _aten.clamp_max,
    _aten.where,
    _aten.cat,
    _aten.repeat,
)
_WHERE = _overloads(_aten.where)
#: comparisons (an ignore-index mask, a bounds check): their bool result holds no index value
_COMPARISONS = _overloads(_aten.eq, _aten.ne, _aten.lt, _aten.le, _aten.gt, _aten.ge)


def _target_argument(op: object) -> tuple[int, int] | None:
    """A loss op's class-index argument, by its schema name ``target`` (the linear cross-entropy
    ops of torch.nn.functional, registered when first used), as ``(its position, 0)``."""
    schema = getattr(op, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    return (names.index("target"), 0) if "target" in names else None


def _fits(value: object) -> bool:
    shape = getattr(value, "shape", None)
    return shape is not None and all(int(s) < _INDEX_LIMIT for s in shape)


def index_only(node: fx.Node) -> bool:
    """Whether every use of ``node``'s values is as an index into a dimension below 2**31
    (through views, clamps, ``where`` and comparisons), with at least one such index."""
    pending, seen, indexes = [node], set(), False
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        for user in value.users:
            if user.op == "output":  # handed back (saved for the backward, or returned)
                continue
            if user.op != "call_function":
                return False
            sink = _INDEX_SINKS.get(user.target) or _target_argument(user.target)
            if sink is not None:
                index_pos, base_pos = sink
                args = list(user.args)
                index = args[index_pos] if index_pos < len(args) else None
                indices = index if isinstance(index, (list, tuple)) else [index]
                base = args[base_pos] if base_pos < len(args) else None
                base_val = base.meta.get("val") if isinstance(base, fx.Node) else None
                if value not in indices or not _fits(base_val):
                    return False
                indexes = True
            elif user.target in _COMPARISONS:
                continue
            elif user.target in _CARRIERS:
                if user.target in _WHERE and user.args[0] is value:
                    return False
                pending.append(user)
            else:
                return False
    return indexes


_PART = re.compile(
    r"\._(?:modules|parameters|buffers)\['([^']+)'\]|\.(\w+)|\['([^']+)'\]|\[(\d+)\]"
)
_INDEXED = re.compile(r"\[\d+\]$")
_ROOT = re.compile(r"^[LG]\['([^']+)'\]")


def user_name(source: str) -> str:
    """A Dynamo source name as the user writes it: ``L['x']`` -> ``x``,
    ``L['self']._modules['d1']._modules['1']._buffers['num_batches_tracked']`` ->
    ``d1.1.num_batches_tracked`` (as ``named_buffers()`` says), ``L['args'][1]`` -> ``args[1]``;
    anything else unchanged."""
    root = _ROOT.match(source)
    if root is None:
        return source
    rest, pos, parts = source[root.end() :], 0, []
    while pos < len(rest):
        m = _PART.match(rest, pos)
        if m is None:
            return source
        parts.append(m)
        pos = m.end()
    if parts and parts[0].group(1) is not None:  # a module's member: named from the module
        name = ""
    else:
        name = root.group(1)
    for m in parts:
        member, attr, key, index = m.groups()
        if index is not None:
            name += f"[{index}]"
        elif key is not None and member is None:
            name += f"[{key!r}]"
        else:
            name += ("." if name else "") + (member or attr)
    return name


def _counted_only(node: fx.Node) -> bool:
    """Whether ``node`` is only ever incremented by 1 and handed back, as BatchNorm's training
    step does with its counter; read any other way (a cumulative-average momentum divides by
    it, user code may multiply by it) its narrowing is not exact by construction."""
    increments = (_aten.add.Tensor, _aten.add.Scalar)
    return bool(node.users) and all(
        user.op == "call_function"
        and user.target in increments
        and list(user.args) == [node, 1]
        and all(out.op == "output" for out in user.users)
        for user in node.users
    )


def describe(node: fx.Node, label: str | None, position: int, old: object, new: object) -> str:
    """The ``downcasts`` entry of graph input ``node`` (the ``position``-th) narrowed from dtype
    ``old`` to ``new``; ``label``: its ``meta["user_input"]`` (``backend._label_user_inputs``),
    the user's name or a note that the forward saved it."""
    change = f"{old} -> {new}"
    if label is not None and label.endswith(SAVED):
        return f"a saved activation: {change}{EXEMPT}computed narrowed by the forward]"
    # No source: a graph compiled directly, or a region's input made by the eager part of a
    # partitioned graph. Its FX name means nothing to the user; its position may.
    name = f"input {position}" if label is None else user_name(label)
    if old == torch.int64 and name.rsplit(".", 1)[-1] == "num_batches_tracked":
        if _counted_only(node):
            return f"{name}: {change}{EXEMPT}BatchNorm step counter]"
    if old == torch.int64 and index_only(node):
        return f"{name}: {change}{EXEMPT}used only as an index]"
    return f"{name}: {change}"


def _has_dtype(val: object, dtype: torch.dtype) -> bool:
    vals = val if isinstance(val, (tuple, list)) else (val,)
    return any(isinstance(v, torch.Tensor) and v.dtype == dtype for v in vals)


#: Integer reductions and scans eager widens to int64 (``int32.sum()`` is int64): narrowed, their
#: results wrap past 2**31 where eager's do not.
_SUMS = _overloads(_aten.sum, _aten.nansum, _aten.cumsum)
_PRODUCTS = _overloads(_aten.prod, _aten.cumprod)
#: the largest magnitude of each narrow integer dtype: a sum of fewer than 2**31 / bound of them
#: fits int32, so counting a mask (``mask.sum()``, cross-entropy's non-ignored targets) is exact
_BOUND = {torch.bool: 1, torch.uint8: 255, torch.int8: 128, torch.int16: 2**15}


def _exact_in_int32(node: fx.Node) -> bool:
    """An integer accumulation whose every possible result fits int32."""
    x = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], fx.Node) else None
    if not isinstance(x, torch.Tensor) or x.dtype not in _BOUND:
        return False
    if node.target in _PRODUCTS:
        return x.dtype == torch.bool
    return _BOUND[x.dtype] * x.numel() < _INDEX_LIMIT


def widens(node: fx.Node) -> torch.dtype | None:
    """The 64-bit dtype an op makes from no input of that dtype, where narrowing it may change
    values: float64 from any op (``.double()``, ``arange(dtype=float64)``), int64 from an integer
    accumulation that can leave int32. Ops merely carrying 64-bit inputs along are covered by the
    inputs' entries."""
    if node.target is operator.getitem:
        return None
    accumulates = node.target in _SUMS or node.target in _PRODUCTS
    wide = torch.float64, *((torch.int64,) if accumulates and not _exact_in_int32(node) else ())
    for dtype in wide:
        if _has_dtype(node.meta.get("val"), dtype) and not any(
            _has_dtype(arg.meta.get("val"), dtype) for arg in node.all_input_nodes
        ):
            return dtype
    return None


def warned(downcasts: list[str]) -> list[str]:
    """The entries of ``downcasts`` that are the user's business (warned, NC104, findings).
    Entries of older cache entries that name saved activations are exempt too."""
    return [d for d in downcasts if EXEMPT not in d and SAVED not in d]


def summarize(entries: list[str], limit: int = 150) -> str:
    """``entries`` (``"name: a -> b"``) grouped by dtype change and, when several share a
    leaf name, by it (``10 num_batches_tracked buffers``), in at most about ``limit`` chars."""
    by_change: dict[str, list[str]] = defaultdict(list)
    for entry in entries:
        name, _, change = entry.rpartition(": ")
        by_change[change.replace("torch.", "")].append(name or entry)
    groups = []
    for change, names in by_change.items():
        # d1.0.weight, d2.0.weight, ... share "weight"; a[0], a[1], ... share "a[]"
        kinds: dict[str, list[str]] = defaultdict(list)
        for name in names:
            kinds[_INDEXED.sub("[]", name.rsplit(".", 1)[-1])].append(name)
        shown = [
            ", ".join(group)
            if len(group) < 3
            else f"{len(group)} inputs {kind.replace('[]', '[i]')} ({group[0]}, ...)"
            if kind.endswith("[]")
            else f"{len(group)} inputs named {kind} ({group[0]}, ...)"
            for kind, group in kinds.items()
        ]
        groups.append(f"{', '.join(shown)} ({change})")
    text = "; ".join(groups)
    return text if len(text) <= limit else text[: limit - 12].rsplit(",", 1)[0] + ", and more"
