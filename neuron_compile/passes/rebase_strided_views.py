"""rebase_strided_views: make every storage-addressing op read a flat copy of eager's storage.

Why: ``as_strided(v, size, stride, offset)`` does not address ``v``'s elements; it addresses the
*storage* ``v`` shares with the tensor its view chain started from (its base), and ``offset`` is
absolute in that storage (``None`` means ``v``'s own offset). ``as_strided_scatter`` is the same
(eager clones the whole storage of ``self``, writes through the strided view and returns a tensor
with ``self``'s geometry). A compiled region, though, only carries values: a region output is a
fresh contiguous buffer, a view chain inside a region is a chain of reshapes and slices. So
``as_strided(_unsafe_view(x[1:3], [4, 4]), (2, 2), (8, 1), 0)`` read ``x[1:3]``'s 16 values where
eager reads ``x``'s 24 (``[[8, 9], [16, 17]]`` instead of ``[[0, 1], [8, 9]]``, and
"setStorage ... out of bounds" on an empty view, whose storage was not empty in eager).

Design: compute element addresses exactly, from what eager has. AOTAutograd's graph keeps the
view ops and its fake ``meta["val"]`` keeps eager's storage sharing, sizes, strides and offsets,
so this pass (run first, while the metadata is still eager's) finds the storage root of each
storage-addressing op (the node whose result owns the storage: walk inputs while they share the
fake storage) and rebuilds that storage as a flat 1-D tensor from the root's *values*:

- root is dense and covers its storage exactly (offset 0, storage size == numel, any dense
  permutation of strides): ``reshape(permute(root, stride_order), [numel])``;
- root is an in-graph result that does not cover its storage: ``as_strided_scatter`` of its
  values into its base's flat storage (``slice_scatter`` and friends clone their input's whole
  storage) or into zeros (any other op: eager's uncovered storage is uninitialized memory);
- a dtype change on the chain (``view.dtype``) is a ``view.dtype`` of the flat storage;
- root is a graph input or attribute that does not cover its storage (the caller passed a view):
  the values the region gets cannot tell what lies outside them, so the op reads the root
  itself with an absolute offset; the support predicate then keeps it out of compiled regions
  and it runs eagerly on the caller's very tensor, which is eager's own storage.

Layouts come from ``EagerLayouts`` (a fake replay of the ops, with eager's storage rule for the
``*_scatter`` ops), not from AOTAutograd's metadata, which records some results as fresh tensors
where eager returns a view into a copied storage (without such an op above the target, the replay
would reproduce the metadata, and is skipped). A self-overlapping ``self`` of
``as_strided_scatter`` is cloned contiguously by eager, so it is addressed as such.

Then ``as_strided(v, size, stride, off)`` becomes ``as_strided(flat, size, stride, abs_off)`` and
``as_strided_scatter(v, src, ...)`` becomes ``as_strided(as_strided_scatter(flat, src, ...),
v.size, v.stride, v.offset)``. A flat, contiguous, offset-0 tensor has the same layout in a
compiled region and in eager, so the result is the same whichever side of a fallback boundary
each node lands on. What cannot be rebuilt (a dtype change on a caller's view, a symbolic size)
is refused with NC101 rather than guessed.

Requires: AOTAutograd's ``meta["val"]`` (fake tensors) on every node, unchanged by other passes.
Guarantees: each ``as_strided``/``as_strided_copy``/``as_strided_scatter`` reads either a flat
1-D contiguous offset-0 tensor holding its storage, or a graph input/attribute directly. Graphs
whose storage-addressing ops already read such tensors are returned unchanged.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes

from ..errors import UnsupportedOpError
from .graph_edits import call_before

log = logging.getLogger(__name__)

aten = torch.ops.aten

_READS_STORAGE = (aten.as_strided.default, aten.as_strided_copy.default)
_SCATTERS = (aten.as_strided_scatter.default,)
# Ops whose result is a clone of ``self``'s whole storage with part of it rewritten
# (ATen's clone_preserve_strides): storage outside the result's elements is ``self``'s.
_CLONES_STORAGE = {
    aten.slice_scatter.default,
    aten.select_scatter.default,
    aten.diagonal_scatter.default,
    aten.as_strided_scatter.default,
}
_HINT = (
    "materialize the tensor first (x.contiguous() or x.clone()) so as_strided addresses a "
    "storage the compiled graph owns, or compute the view with slicing/reshape"
)


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _static(val: torch.Tensor) -> bool:
    ints = (*val.shape, *val.stride(), val.storage_offset())
    return all(type(i) is int for i in ints) and type(_storage_numel(val)) is int


def _storage_numel(val: torch.Tensor) -> int:
    return val.untyped_storage().nbytes() // val.element_size()


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())


def _overlaps(val: torch.Tensor) -> bool:
    return torch._debug_has_internal_overlap(val) == 1


def _clone_preserving_storage(val: torch.Tensor) -> torch.Tensor:
    """The result eager's ``clone_preserve_strides`` gives the ``*_scatter`` ops to write into:
    a copy of ``val``'s whole storage viewed with ``val``'s geometry, or a contiguous copy of
    ``val`` if it overlaps itself. (torch's fake kernel for ``as_strided_scatter`` checks bounds
    against ``val``'s elements and reads an omitted offset as 0, unlike eager.)"""
    if _overlaps(val):
        return torch.empty(val.shape, dtype=val.dtype, device=val.device)
    storage = torch.empty(_storage_numel(val), dtype=val.dtype, device=val.device)
    return storage.as_strided(val.shape, val.stride(), val.storage_offset())


def _run_fake(fake_mode: FakeTensorMode | None, target: Any, args: Any, kwargs: Any) -> Any:
    if fake_mode is not None:
        with fake_mode:
            return target(*args, **kwargs)
    # hand-built graphs with real tensors in meta: stay off the real data
    with _disable_current_modes(), FakeTensorMode(allow_non_fake_inputs=True):
        return target(*args, **kwargs)


class EagerLayouts:
    """Each node's result as eager lays it out when it runs the graph's ops: fake tensors from
    replaying the ancestors of ``nodes`` in a fresh fake mode. AOTAutograd's own ``meta["val"]``
    has eager's views, but not always eager's storage for other results: a ``slice_scatter`` of
    a view is recorded as a fresh contiguous tensor, while eager clones the whole storage of its
    input and returns a view into it. If the replay fails (an op without a fake kernel), the
    recorded metadata stands in."""

    def __init__(self, graph: fx.Graph, nodes: Sequence[fx.Node]) -> None:
        self.vals: dict[fx.Node, Any] = {}
        # The graph as it was: the rewrite changes arguments and erases scatters as it goes.
        self.inputs = {n: list(n.all_input_nodes) for n in graph.nodes}
        self.first_arg = {n: n.args[0] for n in nodes}
        needed: set[fx.Node] = set()
        stack = list(nodes)
        while stack:
            node = stack.pop()
            if node not in needed:
                needed.add(node)
                stack.extend(node.all_input_nodes)
        if not any(n.op == "call_function" and n.target in _CLONES_STORAGE for n in needed):
            # The replay would give the recorded layouts (same fake kernels, placeholders'
            # geometry) and costs a fake run of the whole graph above (~0.1 s for a conv net).
            return
        try:
            self._replay([n for n in graph.nodes if n in needed])
        except Exception as e:  # noqa: BLE001 - any failure: use the recorded metadata
            log.debug("rebase_strided_views: replay failed (%s: %s)", type(e).__name__, e)
            self.vals = {}

    def _replay(self, nodes: list[fx.Node]) -> None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        for node in nodes:
            meta = node.meta.get("val")
            if node.op in ("placeholder", "get_attr"):
                if isinstance(meta, torch.Tensor):  # a fresh storage with the same layout
                    with _disable_current_modes(), mode:
                        numel = _storage_numel(meta)
                        storage = torch.empty(numel, dtype=meta.dtype, device=meta.device)
                        meta = storage.as_strided(meta.shape, meta.stride(), meta.storage_offset())
                self.vals[node] = meta
                continue
            if node.op != "call_function":
                raise NotImplementedError(node.op)
            args = fx.node.map_arg(node.args, self.vals.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, self.vals.__getitem__)
            with _disable_current_modes(), mode:
                if node.target in _CLONES_STORAGE:
                    self.vals[node] = _clone_preserving_storage(args[0])
                else:
                    self.vals[node] = node.target(*args, **kwargs)

    def __call__(self, node: object) -> torch.Tensor | None:
        val = self.vals.get(node) if isinstance(node, fx.Node) else None
        return val if isinstance(val, torch.Tensor) else _val(node)


def storage_root(node: fx.Node, layout: EagerLayouts) -> fx.Node:
    """The node whose result owns ``node``'s storage in eager: follow inputs sharing it (views,
    ``_unsafe_view``, ``getitem`` of split outputs); an in-place result is a root."""
    val = layout(node)
    while val is not None and node.op == "call_function":
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            break  # an in-place result: its value is the storage after the write
        inputs = layout.inputs.get(node, [])
        if node.target is operator.getitem and inputs:
            inputs = layout.inputs.get(inputs[0], [])
        parent = next(
            (a for a in inputs if (v := layout(a)) is not None and _same_storage(v, val)), None
        )
        if parent is None:
            break
        node, val = parent, layout(parent)
    return node


def _covers_storage(val: torch.Tensor) -> bool:
    """Dense, offset 0, and as many elements as its storage: the values are the storage."""
    return (
        val.storage_offset() == 0
        and _storage_numel(val) == val.numel()
        and (val.numel() <= 1 or is_non_overlapping_and_dense_or_false(val))
    )


def _is_flat(val: torch.Tensor) -> bool:
    return val.dim() == 1 and val.is_contiguous() and _covers_storage(val)


def _stride_order(val: torch.Tensor) -> list[int]:
    """The permutation that makes a dense tensor contiguous (outermost stride first)."""
    dims = range(val.dim())
    return sorted(dims, key=lambda d: (-val.stride(d), -val.shape[d], d))


def _geometry(val: torch.Tensor) -> tuple[list[int], list[int], int]:
    return list(val.shape), list(val.stride()), val.storage_offset()


class _Rewriter:
    def __init__(self, graph: fx.Graph, layout: EagerLayouts) -> None:
        self.graph = graph
        self.layout = layout
        self.fake_mode = detect_fake_mode([n.meta.get("val") for n in graph.nodes])
        self.flat: dict[tuple[fx.Node, torch.dtype], fx.Node | None] = {}
        #: erased scatter -> the flat storage its replacement is a view of
        self.replaced: dict[fx.Node, fx.Node] = {}

    def call(
        self,
        anchor: fx.Node,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
    ) -> fx.Node:
        """A new node before ``anchor``, with the ``meta["val"]`` the graph's fake mode gives."""
        kwargs = kwargs or {}
        vals = fx.node.map_arg(args, lambda n: n.meta["val"])
        if target in _CLONES_STORAGE:
            val = _run_fake(self.fake_mode, _clone_preserving_storage, vals[:1], {})
        else:
            val = _run_fake(self.fake_mode, target, vals, kwargs)
        node = call_before(anchor, target, args, {"val": val})
        node.kwargs = kwargs
        if "stack_trace" in anchor.meta:
            node.meta["stack_trace"] = anchor.meta["stack_trace"]
        return node

    def flat_storage(self, root: fx.Node, dtype: torch.dtype, anchor: fx.Node) -> fx.Node | None:
        """A 1-D contiguous node of ``dtype`` holding ``root``'s eager storage, or None if the
        graph's values do not determine it (a caller's view)."""
        key = (root, dtype)
        if root in self.replaced:
            written = self.replaced[root]
            if dtype != written.meta["val"].dtype:
                return self.call(anchor, aten.view.dtype, (written, dtype))
            return written
        if key not in self.flat:
            self.flat[key] = self._build_flat(root, dtype, anchor)
        return self.flat[key]

    def _build_flat(self, root: fx.Node, dtype: torch.dtype, anchor: fx.Node) -> fx.Node | None:
        val = self.layout(root)
        assert val is not None
        n = _storage_numel(val)
        if _covers_storage(val):
            flat = root
            if val.dim() != 1:
                order = _stride_order(val)
                if order != list(range(val.dim())):
                    flat = self.call(anchor, aten.permute.default, (flat, order))
                flat = self.call(anchor, aten.reshape.default, (flat, [n]))
        elif root.op != "call_function":
            return None  # a caller's view: only the caller's tensor knows the rest
        else:
            src = root.args[0] if root.target in _CLONES_STORAGE else None
            if isinstance(src, fx.Node) and (sval := self.layout(src)) is not None:
                if _storage_numel(sval) != n or sval.dtype != val.dtype:
                    return None
                base = self.flat_storage(storage_root(src, self.layout), val.dtype, anchor)
                if base is None:
                    return None
            else:  # a fresh result: eager's storage around its elements is uninitialized
                kwargs = {"dtype": val.dtype, "device": val.device}
                base = self.call(anchor, aten.zeros.default, ([n],), kwargs)
            flat = self.call(anchor, aten.as_strided_scatter.default, (base, root, *_geometry(val)))
        if dtype != val.dtype:
            flat = self.call(anchor, aten.view.dtype, (flat, dtype))
        return flat


def _offset(node: fx.Node, position: int, view: torch.Tensor) -> int:
    off = node.args[position] if len(node.args) > position else node.kwargs.get("storage_offset")
    return view.storage_offset() if off is None else off


def _given(node: fx.Node, position: int) -> bool:
    off = node.args[position] if len(node.args) > position else node.kwargs.get("storage_offset")
    return off is not None


def _refuse(node: fx.Node, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"cannot compute {node.target} exactly", node=node, reason=why, hint=_HINT
    )


def _rewrite(rw: _Rewriter, node: fx.Node) -> bool:
    view_node = rw.layout.first_arg[node]  # the analysis reads the graph as it was
    view = rw.layout(view_node)
    if view is None or not isinstance(view_node, fx.Node):
        return False
    if not _static(view):
        raise _refuse(node, "the storage it addresses has a symbolic size or stride")
    if _is_flat(view):
        return False  # already reads a flat storage: its values are the whole storage
    root = storage_root(view_node, rw.layout)
    root_val = rw.layout(root)
    if not _static(root_val):
        raise _refuse(node, "the storage it addresses has a symbolic size or stride")
    scatter = node.target in _SCATTERS
    off_at = 4 if scatter else 3
    size, stride = node.args[off_at - 2], node.args[off_at - 1]
    offset = _offset(node, off_at, view)
    if scatter and _overlaps(view):
        # Eager scatters into a contiguous copy of a self-overlapping ``self`` (offset 0).
        copy = rw.call(node, aten.reshape.default, (node.args[0], [view.numel()]))
        explicit = offset if _given(node, off_at) else 0
        written = rw.call(node, node.target, (copy, node.args[1], size, stride, explicit))
        out = rw.call(node, aten.reshape.default, (written, list(view.shape)))
        rw.replaced[node] = written
        node.replace_all_uses_with(out)
        rw.graph.erase_node(node)
        return True
    flat = rw.flat_storage(root, view.dtype, node)
    if flat is None:
        if view.dtype != root_val.dtype:
            raise _refuse(node, f"a {view.dtype} view of a caller's {root_val.dtype} view")
        if not _given(node, off_at):
            # No offset means the view's own, which is the caller's at run time: the traced one
            # would be baked in, and a later call's view of another offset read the wrong place.
            if view.storage_offset() != root_val.storage_offset():
                raise _refuse(node, "no storage_offset, on a view shifted from a caller's view")
            if root is view_node:
                return False
            node.args, node.kwargs = (root, size, stride), {}
            return True
        if root is view_node and node.args[off_at:] == (offset,):
            return False
        flat = root  # a caller's tensor: the op runs eagerly on it (see the module docstring)
    if not scatter:
        node.args = (flat, size, stride, offset)
        node.kwargs = {}
        return True
    written = rw.call(node, node.target, (flat, node.args[1], size, stride, offset))
    out = rw.call(node, aten.as_strided.default, (written, *_geometry(view)))
    rw.replaced[node] = written
    node.replace_all_uses_with(out)
    rw.graph.erase_node(node)
    return True


def _needs_rewrite(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in (*_READS_STORAGE, *_SCATTERS)


def rebase_strided_views(gm: fx.GraphModule) -> bool:
    targets = [n for n in gm.graph.nodes if _needs_rewrite(n)]
    changed = 0
    if targets:
        rw = _Rewriter(gm.graph, EagerLayouts(gm.graph, targets))
        for node in targets:
            changed += _rewrite(rw, node)
    log.debug("rebase_strided_views: %d storage-addressing op(s) now read a flat storage", changed)
    return bool(changed)


__all__ = ["EagerLayouts", "rebase_strided_views", "storage_root"]
