"""Effectful ops that run on the CPU: a print inside the graph (the ``print`` higher-order op,
traced with an effect token) and asserts (a Python ``assert`` on a tensor becomes
``_assert_async``; ``torch._assert`` on a tensor breaks the graph). Their graphs have CPU-fallback
regions, so AOTAutogradCache never stores them; the effects must still happen in every process:
each print once per call, each assert failing on bad input."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import torch


def checked(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    assert x.abs().sum() < 1e6, "x too large"
    y = torch.tanh(x @ w)
    torch._higher_order_ops.print("y sum {}", y.sum())
    return y * 3


def guarded(x: torch.Tensor) -> torch.Tensor:
    torch._assert(x.min() > -100, "x too small")
    return x.exp()


def _printing(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn()`` and how many times it printed (stdout is also kept whole by the harness)."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        result = fn()
    print(text.getvalue(), end="")
    return result, torch.tensor(text.getvalue().count("y sum"))


def run(out) -> None:
    x, w = torch.randn(4, 3), torch.randn(3, 3)
    compiled = torch.compile(checked, backend="neuron")
    once = torch.tensor(1)
    with torch.no_grad():
        got, prints = _printing(lambda: compiled(x, w))
        out.check("checked", got, checked(x, w))
        out.check("checked.prints", prints, once)
    wg, we = w.clone().requires_grad_(), w.clone().requires_grad_()
    loss, prints = _printing(lambda: compiled(x, wg).sum())
    loss.backward()
    checked(x, we).sum().backward()
    out.check("checked.grad", wg.grad, we.grad)
    out.check("checked.grad.prints", prints, once)
    out.raises("checked.bad", lambda: compiled(x * 1e7, w))

    compiled_guarded = torch.compile(guarded, backend="neuron")
    out.check("guarded", compiled_guarded(x), guarded(x))
    out.raises("guarded.bad", lambda: compiled_guarded(x - 1000))
