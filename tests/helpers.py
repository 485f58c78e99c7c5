"""Test helpers: lower a function to StableHLO text, compile and compare with eager."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile import artifact
from neuron_compile.lowering import lower_graph
from neuron_compile.passes import PIPELINE, run_pipeline


def trace_aten(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    """ATen graph of ``fn`` with the backend's decompositions and ``meta['val']`` on nodes."""

    def positional(*a: Any) -> Any:  # make_fx counts parameters; F.silu(x, inplace=False) has 2
        return fn(*a)

    return make_fx(positional, decomposition_table=core_aten_decompositions(), tracing_mode="fake")(
        *args
    )


def lower_to_text(fn: Callable[..., Any], *args: Any, pretty: bool = True) -> str:
    """StableHLO text of ``fn`` as the backend emits it (verified; pretty-printed by MLIR)."""
    gm = trace_aten(fn, *args)
    run_pipeline(gm, PIPELINE)
    text = lower_graph(gm).text
    return artifact.pretty(text) if pretty else text


def assert_close_tree(actual: Any, expected: Any, **tol: Any) -> None:
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_close_tree(a, e, **tol)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, **tol)
    else:
        assert actual == expected


def train_losses(
    model: torch.nn.Module,
    batches: Sequence[tuple[torch.Tensor, ...]],
    loss_fn: Callable[..., torch.Tensor],
    *,
    compile_backend: str | None,
    lr: float = 1e-2,
) -> list[float]:
    """Losses of SGD-with-momentum steps over ``batches`` on a deep copy of ``model``."""
    model = copy.deepcopy(model)
    step_model = torch.compile(model, backend=compile_backend) if compile_backend else model
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss = loss_fn(step_model, *batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_lowered(fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn`` through the backend's lowering + XLA CPU executor without Dynamo (fast).

    ``fallback="error"``: an op without a lowering raises instead of quietly running eagerly,
    so a numerics test that passes really exercised our lowering."""
    from neuron_compile.compiler import compile_graph
    from neuron_compile.config import NeuronConfig

    gm = trace_aten(fn, *args)
    cfg = NeuronConfig(fallback="error")
    compiled = compile_graph(gm, args, name="test", kind="inference", cfg=cfg)
    return compiled(list(args))
