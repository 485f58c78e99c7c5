"""An index from FX graphs to cache entries, so a warm start skips lowering too.

The cache key of a graph is built from its StableHLO (see key.py), which costs a lowering (~45 ms
for a GPT block) before any lookup. This index maps a digest of everything lowering reads — every
node's op, target, arguments and static type, the options and the same toolchain components as the key
(including the hash of this package's sources, so any change to a lowering rule misses) — to
that key, plus the specs needed to run the artifact (never pickle: JSON). The graph key stays the
authority: an index entry only says which graph entry to read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from ..lowering.context import CollectiveInfo, ModuleContext
from ..lowering.lower_graph import InputSpec, LoweredGraph, OutputSpec, is_inline_constant
from .key import CacheKey, environment_components, graph_key

_JSON_SCALARS = (bool, int, float, str, type(None))


def _type_of(value: Any) -> Any:
    """A static node type as JSON; raises TypeError for what cannot be indexed (symbolic).

    A tensor's layout is part of it: lowering reads strides, storage offset and storage size
    (``as_strided`` addresses the storage; outputs keep eager's strides), so a graph traced on
    ``x`` and one on ``x.t()`` with the same shape are different entries. Without them a warm
    cache served ``x.as_strided(...)`` compiled for a contiguous ``x`` to a transposed one."""
    if isinstance(value, torch.Tensor):
        shape, stride, offset = list(value.shape), list(value.stride()), value.storage_offset()
        if any(not isinstance(d, int) for d in (*shape, *stride, offset)):
            raise TypeError("symbolic shape")
        try:
            storage = value.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError) as e:  # sparse and other storage-less layouts
            raise TypeError("no storage") from e
        return [str(value.dtype), shape, stride, offset, storage]
    if isinstance(value, (list, tuple)):
        return [_type_of(v) for v in value]
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("symbolic value")
    return type(value).__name__


def _inline_digest(value: Any) -> str | None:
    """Digest of a constant's values when lowering inlines them into the module text (passes
    fold small constants too): two graphs that differ only there must not share an entry."""
    if not isinstance(value, torch.Tensor) or not is_inline_constant(value):
        return None
    with _disable_current_modes():
        raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()


def _ref(node: fx.Node) -> str:
    return "%" + node.name


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__qualname__', None) or target}"


def index_key(gm: fx.GraphModule, artifact_form: str, options: dict[str, Any]) -> str | None:
    """Digest of what lowering ``gm`` depends on, or None if the graph cannot be indexed."""
    try:
        # Nodes spelled out instead of ``gm.code``: on a lazy GraphModule that property runs a
        # full Python codegen (~20 ms for a GPT block), most of what the index saves.
        nodes = [
            [
                n.op,
                n.name,
                _target_name(n.target),
                repr(fx.node.map_arg(n.args, _ref)),
                repr(fx.node.map_arg(n.kwargs, _ref)),
                _type_of(n.meta.get("val")) if n.op != "output" else None,
            ]
            for n in gm.graph.nodes
        ]
        attrs = [
            [n.target, _type_of(getattr(gm, n.target)), _inline_digest(getattr(gm, n.target))]
            for n in gm.graph.nodes
            if n.op == "get_attr"
        ]
    except TypeError:
        return None
    toolchain = environment_components(artifact_form)
    payload = json.dumps(
        {"nodes": nodes, "attrs": attrs, "options": options, **toolchain},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(b"fx-index\0" + payload.encode()).hexdigest()


def _dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else getattr(torch, name.removeprefix("torch."))


def dump_index(key: CacheKey, lowered: LoweredGraph) -> bytes | None:
    """The index entry's payload, or None when an output constant is not JSON."""
    outputs = []
    for o in lowered.outputs:
        value = o.value
        if o.kind.endswith("_view"):
            value = [list(o.value[0]), o.value[1]]
        elif o.kind == "empty":
            value = list(o.value)
        elif not isinstance(value, _JSON_SCALARS):
            return None
        stride = list(o.stride) if o.stride is not None else None
        outputs.append([o.kind, o.index, str(o.dtype) if o.dtype else None, value, stride])
    payload = {
        "graph_key": [list(p) for p in key.parts],
        "text": lowered.text,
        "inputs": [
            [s.index, s.name, list(s.shape), str(s.dtype), str(s.arg_dtype), s.attr]
            for s in lowered.inputs
        ],
        "outputs": outputs,
        "num_results": lowered.num_results,
        "downcasts": lowered.downcasts,
        "collectives": [
            [c.op, c.group_name, [list(g) for g in c.replica_groups], c.channel]
            for c in lowered.collectives
        ],
    }
    return json.dumps(payload).encode()


def _spec_value(kind: str, value: Any) -> Any:
    """An output spec's value from JSON: a view's (size, offset), an empty output's shape."""
    if kind.endswith("_view"):
        return tuple(value[0]), int(value[1])
    return tuple(value) if kind == "empty" else value


def load_index(data: bytes) -> tuple[CacheKey, LoweredGraph]:
    """Inverse of ``dump_index`` (raises ValueError/KeyError/TypeError on a malformed entry).

    The graph key is re-derived from the payload's own text and specs (and this process's
    toolchain): an entry that names another graph's key, or a stale toolchain, raises
    ValueError instead of sending the graph to an entry compiled from something else."""
    d = json.loads(data)
    key = CacheKey(tuple((str(k), str(v)) for k, v in d["graph_key"]))
    inputs = [
        InputSpec(int(i), str(n), tuple(shape), _dtype(dt), _dtype(adt), attr)
        for i, n, shape, dt, adt, attr in d["inputs"]
    ]
    outputs = [
        OutputSpec(
            k,
            int(i),
            _dtype(dt),
            _spec_value(k, v),
            tuple(st) if st is not None else None,
        )
        for k, i, dt, v, st in d["outputs"]
    ]
    # The collectives decide where the module runs (the distributed client, one replica per
    # rank) and enter the key; they are part of what the entry describes.
    module = ModuleContext(
        collectives=[
            CollectiveInfo(str(op), str(group), tuple(tuple(map(int, g)) for g in groups), int(ch))
            for op, group, groups, ch in d.get("collectives", [])
        ]
    )
    lowered = LoweredGraph(
        d["text"], inputs, outputs, int(d["num_results"]), list(d["downcasts"]), module=module
    )
    derived = graph_key(
        lowered.text,
        io_specs=[[vars(s) for s in inputs], [vars(o) for o in outputs]],
        artifact_form=key.components().get("artifact_form", ""),
        replica_groups=[c.replica_groups for c in lowered.collectives],
    )
    if derived.digest() != key.digest():
        raise ValueError(
            f"the entry's text and specs derive graph key {derived.digest()[:12]}, "
            f"not the {key.digest()[:12]} it names ({', '.join(derived.explain(key))} differ)"
        )
    return key, lowered


#: A graph input as a calling convention sees it: ``(dtype, shape)`` of a tensor, or a type name.
ArgSpec = tuple[str, tuple[int, ...]] | str


def arg_spec(value: Any) -> ArgSpec:
    """``(dtype, shape)`` of a (fake or real) tensor, without touching its storage."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), tuple(d if isinstance(d, int) else -1 for d in value.shape)
    return type(value).__name__


def graph_signature(gm: fx.GraphModule) -> tuple[tuple[ArgSpec, ...], int]:
    """``arg_spec`` of each placeholder of ``gm``, and how many values it returns."""
    inputs = tuple(arg_spec(n.meta.get("val")) for n in gm.graph.find_nodes(op="placeholder"))
    results = next(iter(gm.graph.find_nodes(op="output"))).args[0]
    return inputs, len(results) if isinstance(results, (tuple, list)) else 1


def signature_mismatch(
    inputs: tuple[ArgSpec, ...], outputs: int, lowered: LoweredGraph
) -> str | None:
    """Why a runner built from an index entry's ``lowered`` specs cannot be called with the
    arguments of a graph of this signature and return its values, or None if it can. Cheap:
    run on every warm start, so a damaged or misplaced entry is recompiled, never called."""
    for spec in lowered.inputs:
        if spec.attr is not None or spec.index < 0:
            continue  # a constant or the per-call RNG seed: not an argument
        want = (str(spec.dtype), tuple(spec.shape))
        if spec.index >= len(inputs) or inputs[spec.index] != want:
            return f"the index entry's input {spec.name} {want} is not the graph's"
    if len(lowered.outputs) != outputs:
        return f"the index entry returns {len(lowered.outputs)} values, the graph {outputs}"
    return None
