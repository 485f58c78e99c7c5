"""Helpers for model-level parity tests: compiled vs eager forward, gradients, graph kinds."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

import neuron_compile


def graph_kinds() -> list[str]:
    """Kinds of the graphs compiled since the last reset, oldest first."""
    return [r.kind for r in neuron_compile.metrics()]


def forward_backward(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    backend: str | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward + backward on a deep copy of ``model``: (output, {param name: grad})."""
    model = copy.deepcopy(model)
    run = torch.compile(model, backend=backend) if backend else model
    out = run(*inputs)
    loss_fn(out).backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None for g in grads.values()), "every parameter must get a gradient"
    return out.detach(), grads


def assert_grads_close(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], **tol: Any
) -> None:
    assert actual.keys() == expected.keys()
    for name, want in expected.items():
        torch.testing.assert_close(
            actual[name], want, msg=lambda m, n=name: f"grad of {n}: {m}", **tol
        )


def normwise_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float32 (robust for low-precision tensors,
    where elementwise checks trip over values that cancel to near zero)."""
    a, e = actual.float(), expected.float()
    return ((a - e).norm() / e.norm().clamp_min(1e-12)).item()


def assert_low_precision_grads(
    compiled: dict[str, torch.Tensor],
    eager: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    *,
    rel: float = 2e-2,
) -> None:
    """bf16 gradients: close to eager bf16 normwise, and no further from the float32 reference
    than eager's own bf16 error (plus bf16 rounding slack)."""
    for name, want in eager.items():
        got = compiled[name]
        assert got.dtype == want.dtype, f"grad of {name}: dtype {got.dtype} != {want.dtype}"
        err = normwise_error(got, want)
        assert err < rel, f"grad of {name}: normwise error vs eager {err:.2e} >= {rel}"
        ours, theirs = normwise_error(got, reference[name]), normwise_error(want, reference[name])
        assert ours <= 2 * theirs + 8e-3, (
            f"grad of {name}: error vs float32 {ours:.2e}, eager bf16's {theirs:.2e}"
        )


def assert_compiled_gradients_match(
    fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], **tol: Any
) -> None:
    """``fn`` through ``torch.compile(backend="neuron")``: output and every input gradient match
    eager for a random cotangent, nothing fell back to the CPU, and exactly one forward and one
    backward graph were compiled."""
    ours = [x.clone().requires_grad_() for x in inputs]
    theirs = [x.clone().requires_grad_() for x in inputs]
    neuron_compile.clear_fallback_ops()
    out = torch.compile(fn, backend="neuron")(*ours)
    ref = fn(*theirs)
    torch.testing.assert_close(out, ref, **tol)
    cotangent = torch.randn_like(ref)
    out.backward(cotangent)
    ref.backward(cotangent)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(
            a.grad, b.grad, msg=lambda m, i=i: f"grad of input {i}: {m}", **tol
        )
    assert not neuron_compile.get_fallback_ops(), neuron_compile.get_fallback_ops()
    assert graph_kinds() == ["forward", "backward"]
