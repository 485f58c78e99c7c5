"""The executor evaluates a module as written: XLA's algebraic simplifier, which rewrites floating
point as real numbers (``(x + C) - C`` to ``x``, ``log(exp(x))`` to ``x``), never runs
(``runtime/xla_cpu.py:DISABLED_PASSES``). Each expression below gave another answer than eager
with it: finite where eager overflows, unrounded where eager rounds. Without it, XLA CPU's
emitter rejects a negative (cropping) edge padding, so none is ever emitted."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

ROUND_TO_INTEGER = 1.5 * 2**23  # (x + c) - c rounds x to an integer (ties to even)

EXPRESSIONS = {
    "round_to_integer_trick": lambda x: (x + ROUND_TO_INTEGER) - ROUND_TO_INTEGER,
    "constants_in_a_row": lambda x: x * 1e30 * 1e-30,
    "log_of_exp": lambda x: torch.log(torch.exp(x)),
    "sqrt_of_square": lambda x: torch.sqrt(x * x),
    "exp_times_exp": lambda x: torch.exp(x) * torch.exp(-x),
    "power_of_power": lambda x: torch.pow(torch.pow(x, 2.0), 0.5),
}


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    assert bool(same.all()), (actual, expected)


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_floating_point_expressions_are_evaluated_as_eager_does(name: str) -> None:
    x = torch.tensor([2.7, -1.5, 0.5, 3.0, 1000.0, -1000.0, 1e20, -1e20])
    fn = EXPRESSIONS[name]
    torch._dynamo.reset()
    _same(torch.compile(fn, backend="neuron")(x), fn(x))


def test_a_cropping_pad_compiles_without_the_simplifier() -> None:
    """This grouped strided convolution's gradient crops with a negative edge padding, which
    XLA CPU's emitter rejected ("should have been eliminated" by the simplifier): NC301."""
    torch.manual_seed(0)

    def conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv1d(x, w, stride=3, padding=1, dilation=2, groups=2)

    x, w = torch.randn(2, 5), torch.randn(2, 1, 3)
    grads = []
    for fn in (torch.compile(conv, backend="neuron"), conv):
        torch._dynamo.reset()
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        fn(*leaves).sum().backward()
        grads.append([leaf.grad for leaf in leaves])
    for compiled, eager in zip(*grads, strict=True):
        torch.testing.assert_close(compiled, eager)
