"""The executor evaluates a module as written: XLA's algebraic simplifier, which rewrites floating
point as real numbers (``(x + C) - C`` to ``x``, ``log(exp(x))`` to ``x``), never runs
(``runtime/xla_cpu.py:DISABLED_PASSES``). Each expression below gave another answer than eager
with it: finite where eager overflows, unrounded where eager rounds."""

from __future__ import annotations

import pytest
import torch

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
