"""CPU fallback at run time: the runner for partitioned graphs and the fallback-op report.

A partitioned graph is an FX GraphModule whose supported regions call compiled executables and
whose other nodes run as eager ATen ops on the CPU. ``get_fallback_ops()`` counts, per op, how
often each fell back since ``clear_fallback_ops()``: a model that "runs" but is slow shows up here.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from .partition import SplitReason
from .warn_once import NeuronCompileWarning

_lock = threading.Lock()
_COUNTS: Counter[str] = Counter()


class FallbackWarning(NeuronCompileWarning):
    """Some ops of a graph run eagerly on the CPU instead of in a compiled region."""


def get_fallback_ops() -> dict[str, int]:
    """``{aten op: executions}`` of every op that ran as a CPU fallback since the last clear."""
    with _lock:
        return dict(_COUNTS)


def clear_fallback_ops() -> None:
    with _lock:
        _COUNTS.clear()


class RegionCall:
    """Adapts a boxed compiled region to the positional call a ``call_module`` node makes."""

    def __init__(self, compiled: Any, single_output: bool) -> None:
        self.compiled = compiled
        self.single_output = single_output

    def __call__(self, *args: Any) -> Any:
        outs = self.compiled(list(args))
        return outs[0] if self.single_output else tuple(outs)


class FallbackRunner:
    """Boxed callable for a partitioned graph: compiled regions plus eager CPU ops."""

    def __init__(self, gm: fx.GraphModule, reasons: Sequence[SplitReason], record: Any) -> None:
        self._boxed_call = True  # instance attribute: see CompiledGraph
        self.gm = gm
        self.reasons = list(reasons)
        self.record = record
        self._per_call = Counter(r.op for r in reasons)
        self._saved_args: tuple[int, ...] = ()
        self._saved_dtypes: dict[int, torch.dtype] = {}

    def read_saved_from(self, link: Any) -> None:
        """Backward graph after a compiled forward that kept saved activations on the device
        (neuron_compile/saved.py): eager ops need them as tensors, so convert them here, in
        eager's dtypes (the forward computed 64-bit ones narrowed: an eager ``lu_solve`` of a
        float32 LU and a float64 gradient raised)."""
        self._saved_args = tuple(link.resident)
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for i in self._saved_args:
            val = placeholders[i].meta.get("val")
            if isinstance(val, torch.Tensor):
                self._saved_dtypes[i] = val.dtype

    def __call__(self, args: list[Any]) -> list[Any]:
        self.record.calls += 1
        with _lock:
            _COUNTS.update(self._per_call)
        call_args = list(args)
        args.clear()
        if self._saved_args:
            from .runtime.xla_cpu import to_torch
            from .saved import token_arrays

            arrays = token_arrays(call_args[self._saved_args[0]])
            if arrays is not None:
                for i in self._saved_args:
                    t = to_torch(arrays[i])
                    want = self._saved_dtypes.get(i, t.dtype)
                    call_args[i] = t if t.dtype == want else t.to(want)
        out = self.gm(*call_args)
        return list(out) if isinstance(out, (tuple, list)) else [out]
