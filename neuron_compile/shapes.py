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


def symbolic_dims(
    gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> list[tuple[int, str, int | None, str]]:
    """``(input index, name, dim or None for a size symbol, symbol)`` for every symbolic size.

    Dynamo's real example inputs carry concrete sizes; the symbols live in the placeholders'
    ``example_value`` metadata, so both are consulted.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i in range(max(len(placeholders), len(example_inputs))):
        x = example_inputs[i] if i < len(example_inputs) else None
        node = placeholders[i] if i < len(placeholders) else None
        name = node.name if node is not None else f"input {i}"
        meta = node.meta.get("example_value", node.meta.get("val")) if node is not None else None
        for candidate in (meta, x):
            if isinstance(candidate, torch.SymInt):
                found.append((i, name, None, str(candidate)))
                break
            if isinstance(candidate, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in candidate.shape
            ):
                found.extend(
                    (i, name, d, str(s))
                    for d, s in enumerate(candidate.shape)
                    if isinstance(s, torch.SymInt)
                )
                break
    return found


def describe_symbolic(dims: list[tuple[int, str, int | None, str]]) -> str:
    """ "L_x_ dim 0 (s77)"; size symbols only when no tensor dim names them."""
    tensor_dims = [f"{name} dim {d} ({sym})" for _, name, d, sym in dims if d is not None]
    return ", ".join(tensor_dims or [f"{name} ({sym})" for _, name, _, sym in dims])


def requested_dynamic(
    gm: fx.GraphModule, example_inputs: Sequence[Any], symbolic: str
) -> str | None:
    """Why the graph is symbolic if the *user* asked for it, else None (automatic dynamic)."""
    import torch._dynamo.config as dynamo_config

    # torch.compile(dynamic=True) patches assume_static_by_default=False around the whole frame
    # compilation, including this backend call; dynamic=None leaves it True.
    if not dynamo_config.assume_static_by_default:
        return "torch.compile(dynamic=True) made " + symbolic
    marked = []
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    for i, x in enumerate(example_inputs):
        dims = getattr(x, "_dynamo_dynamic_indices", None) if isinstance(x, torch.Tensor) else None
        if dims:
            name = names[i] if i < len(names) else f"input {i}"
            marked.append(
                f"{name} dim{'s' if len(dims) > 1 else ''} {', '.join(map(str, sorted(dims)))}"
            )
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

    def __init__(
        self, gm: fx.GraphModule, cfg: NeuronConfig, compile_frame: Callable[..., Any]
    ) -> None:
        self.gm = gm
        self.cfg = cfg
        self._compile_frame = compile_frame
        self._compiled: dict[tuple, Any] = {}
        self._symbolic_dims = symbolic_dims(gm, [])

    def describe(self, args: Sequence[Any]) -> str:
        """The symbolic dims with their concrete values now ("L_x_ dim 0=3")."""
        dims = [
            f"{name} dim {d}={args[i].shape[d]}"
            for i, name, d, _ in self._symbolic_dims
            if d is not None and i < len(args) and isinstance(args[i], torch.Tensor)
        ]
        ints = [
            f"{name}={args[i]}"
            for i, name, d, _ in self._symbolic_dims
            if d is None and i < len(args)
        ]
        return ", ".join(dims or ints) or "new input shapes"

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
