"""A roofline estimate of how long a graph takes on one logical NeuronCore.

Without a device, the effect of a pass is measured here, not timed. Each FX node costs
``max(compute time, HBM time)``: compute is FLOPs over TensorE's peak for matmuls and
convolutions, elements over the Vector/Scalar engines' throughput for everything else; HBM time
is the bytes the node reads (each distinct operand once) and writes over the core's HBM bandwidth
share. Views cost nothing.
This is a first-order model (no fusion, no SBUF reuse, no DMA fixed costs); it ranks rewrites, it
does not predict wall time.

Constants (trainium-nki.md §1.2 and §1.4, from the Neuron SDK architecture guides), per physical
NeuronCore; one LNC=2 logical core has twice the engines and bandwidth. TensorE peaks and HBM
bandwidth come from ``targets.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.fx as fx

from .targets import Target

aten = torch.ops.aten

#: Vector/Scalar engine element throughput per physical core, elements/s (§1.4 "VectorE
#: throughput": 512 elem/cycle x 0.96 GHz for 16-bit types on NC-v3, 256 for the rest; NC-v4
#: 512/256 x 1.2 GHz).
ELEMENTWISE_RATE: dict[str, dict[str, float]] = {
    "trn2": {"16bit": 512 * 0.96e9, "other": 256 * 0.96e9},
    "trn3": {"16bit": 512 * 1.2e9, "other": 256 * 1.2e9},
}

_MATMULS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default}
_FREE = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.expand.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.slice.Tensor,
    aten.select.int,
    aten.alias.default,
    aten.detach.default,
}


@dataclass(frozen=True)
class NodeCost:
    node: str
    flops: float
    bytes: float
    seconds: float
    bound: str  # "compute" | "memory" | "free"


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def matmul_flops(node: fx.Node) -> float:
    """2 x M x N x K (x batch) for the mm family, from the output and the first operand."""
    out = node.meta["val"]
    a = node.args[1 if node.target in (aten.addmm.default, aten.baddbmm.default) else 0]
    k = a.meta["val"].shape[-1]
    return 2.0 * out.numel() * k


def _dtype_key(dtype: torch.dtype) -> str:
    if dtype in (torch.bfloat16, torch.float16):
        return str(dtype).removeprefix("torch.")
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return "float8"
    return "float32"


def node_cost(node: fx.Node, target: Target, lnc: int = 1) -> NodeCost | None:
    """The roofline cost of one ``call_function`` node (None for other node kinds)."""
    if node.op != "call_function":
        return None
    outs = _tensors(node.meta.get("val"))
    if node.target in _FREE or not outs:
        return NodeCost(node.name, 0.0, 0.0, 0.0, "free")
    ins = [t for a in node.all_input_nodes for t in _tensors(a.meta.get("val"))]
    moved = float(sum(_nbytes(t) for t in ins + outs))
    memory_s = moved / (target.hbm_bandwidth * lnc)
    out = outs[0]
    if node.target in _MATMULS:
        flops = matmul_flops(node)
        compute_s = flops / target.peak_flops_per_logical_core(_dtype_key(out.dtype), lnc)
    else:
        # Elementwise and reductions: one engine pass over the larger of inputs and outputs.
        elems = max([t.numel() for t in ins + outs])
        flops = float(elems)
        width = "16bit" if out.element_size() == 2 else "other"
        compute_s = elems / (ELEMENTWISE_RATE[target.name][width] * lnc)
    seconds = max(compute_s, memory_s)
    return NodeCost(
        node.name, flops, moved, seconds, "compute" if compute_s >= memory_s else "memory"
    )


def estimate(gm: fx.GraphModule, target: Target, lnc: int = 1) -> tuple[float, list[NodeCost]]:
    """Total estimated seconds of ``gm`` on one logical core, and the per-node costs."""
    if not target.is_neuron:
        raise ValueError(f"no cost model for target {target.name!r}; use trn2 or trn3")
    costs = [c for n in gm.graph.nodes if (c := node_cost(n, target, lnc)) is not None]
    return math.fsum(c.seconds for c in costs), costs
