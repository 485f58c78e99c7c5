"""Small helpers shared by the pass tests: hand-built ATen graphs and target lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx


def targets(gm: fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def count(gm: fx.GraphModule, target: Any) -> int:
    return targets(gm).count(target)


def build(
    n_inputs: int, body: Callable[..., Any], buffers: dict[str, torch.Tensor] | None = None
) -> fx.GraphModule:
    """A GraphModule from ``body(graph, *placeholders)``, which returns the output value(s).

    Lets tests write graphs make_fx would never produce (a read of ``x`` after an in-place write
    to ``x``, kwargs that differ only in type, effectful higher-order ops). ``buffers`` become
    module buffers the body can read with ``graph.get_attr(name)``.
    """
    graph = fx.Graph()
    inputs = [graph.placeholder(f"x{i}") for i in range(n_inputs)]
    graph.output(body(graph, *inputs))
    root = torch.nn.Module()
    for name, value in (buffers or {}).items():
        root.register_buffer(name, value)
    return fx.GraphModule(root, graph)
