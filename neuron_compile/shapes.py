"""Static shapes: detect symbolic inputs, reject requested dynamism, specialize automatic dynamism."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .config import NeuronConfig

log = logging.getLogger(__name__)


class RecompileWarning(UserWarning):
    """A compiled frame met a new input shape and compiled another static graph."""


def _names(gm: fx.GraphModule | None, n: int) -> list[str]:
    if gm is None:
        return [f"input {i}" for i in range(n)]
    names = [node.name for node in gm.graph.nodes if node.op == "placeholder"]
    return names + [f"input {i}" for i in range(len(names), n)]


def symbolic_inputs(example_inputs: Sequence[Any], gm: fx.GraphModule | None = None) -> list[str]:
    """Describe every symbolic size among ``example_inputs`` ("input L_x_ dim 0 (s77)")."""
    found = []
    names = _names(gm, len(example_inputs))
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.SymInt):
            found.append(f"input {names[i]} is the symbolic integer {x}")
        elif isinstance(x, torch.Tensor):
            for d, size in enumerate(x.shape):
                if isinstance(size, torch.SymInt):
                    found.append(f"input {names[i]} dim {d} ({size})")
    return found


def requested_dynamic(example_inputs: Sequence[Any], symbolic: list[str]) -> str | None:
    """Why the graph is symbolic if the *user* asked for it, else None (automatic dynamic)."""
    import torch._dynamo.config as dynamo_config

    # torch.compile(dynamic=True) patches assume_static_by_default=False around the whole frame
    # compilation, including this backend call; dynamic=None leaves it True.
    if not dynamo_config.assume_static_by_default:
        return "torch.compile(dynamic=True) made " + "; ".join(symbolic[:4])
    marked = []
    for i, x in enumerate(example_inputs):
        dims = getattr(x, "_dynamo_dynamic_indices", None) if isinstance(x, torch.Tensor) else None
        if dims:
            marked.append(f"input {i} dims {sorted(dims)}")
    if marked:
        return "torch._dynamo.mark_dynamic marked " + "; ".join(marked)
    return None


def _signature(args: Sequence[Any]) -> tuple:
    sig: list[Any] = [torch.is_grad_enabled()]
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.dtype, a.requires_grad))
        else:
            sig.append(a)
    return tuple(sig)


class ShapeSpecializer:
    """Stands in for a symbolic Dynamo graph: compiles one static graph per concrete signature.

    Dynamo's automatic dynamic shapes (``dynamic=None``) hand us a symbolic graph after a frame met
    its second shape. Trainium needs static shapes, so each new signature is a new static compile,
    counted as a recompile and announced with the dims that changed.
    """

    def __init__(self, gm: fx.GraphModule, cfg: NeuronConfig, compile_frame: Callable[..., Any]) -> None:
        self.gm = gm
        self.cfg = cfg
        self._compile_frame = compile_frame
        self._compiled: dict[tuple, Any] = {}
        self._symbolic_dims = self._find_symbolic_dims(gm)

    @staticmethod
    def _find_symbolic_dims(gm: fx.GraphModule) -> list[tuple[int, str, int | None]]:
        dims = []
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            val = node.meta.get("example_value", node.meta.get("val"))
            if isinstance(val, torch.SymInt):
                dims.append((i, node.name, None))
            elif isinstance(val, torch.Tensor):
                dims.extend((i, node.name, d) for d, s in enumerate(val.shape) if isinstance(s, torch.SymInt))
        return dims

    def describe(self, args: Sequence[Any]) -> str:
        parts = []
        for i, name, d in self._symbolic_dims:
            if i >= len(args):
                continue
            if d is None:
                parts.append(f"{name}={args[i]}")
            elif isinstance(args[i], torch.Tensor):
                parts.append(f"{name} dim {d}={args[i].shape[d]}")
        return ", ".join(parts) or "new input shapes"

    @property
    def num_specializations(self) -> int:
        return len(self._compiled)

    def __call__(self, *args: Any) -> Any:
        key = _signature(args)
        fn = self._compiled.get(key)
        if fn is None:
            warnings.warn(
                f"neuron-compile: recompiling for {self.describe(args)} (specialization "
                f"{len(self._compiled) + 1} of this graph). Every new shape is a separate "
                "Trainium compilation: pad variable dimensions to fixed buckets, or pass "
                "dynamic=False to make each shape an explicit recompile.",
                RecompileWarning,
                stacklevel=2,
            )
            fn = self._compile_frame(self.gm, list(args), self.cfg, recompile=True)
            self._compiled[key] = fn
        return fn(*args)
