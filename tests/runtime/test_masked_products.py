"""Products with a 0/1 mask: XLA's algebraic simplifier rewrites ``multiply(x, convert(pred))``
into ``select(pred, x, 0)``, which gave 0.0 where eager's ``inf * False`` is NaN and
``-2.0 * False`` is -0.0; the executor does not run it (``runtime/xla_cpu.py:DISABLED_PASSES``).
The products equal eager's bit for bit, in every spelling of the mask and every floating dtype,
forward and backward."""

from __future__ import annotations

import pytest
import torch

SPECIALS = [float("-inf"), float("inf"), float("nan"), -2.0, 3.0, -0.0, 0.0, -1.5]

PRODUCTS = {
    "x_times_bool": lambda x, m: x * m,
    "bool_times_x": lambda x, m: m * x,
    "x_times_float_mask": lambda x, m: x * m.float(),
    "mask_to_dtype_times_x": lambda x, m: m.to(x.dtype) * x,
    "viewed_mask": lambda x, m: x.view(2, 4) * m.view(2, 4).float(),
    "broadcast_row_mask": lambda x, m: x.view(2, 4) * m[:4].unsqueeze(0),
    "mask_computed_in_graph": lambda x, m: x * (x.nan_to_num() > 0),
}


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    assert bool(same.all()), (actual, expected)
    numbers = ~expected.isnan()  # a NaN's sign is not specified (x86 makes -NaN of inf * 0)
    assert torch.equal(actual[numbers].signbit(), expected[numbers].signbit()), (actual, expected)


@pytest.mark.parametrize("name", list(PRODUCTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_products_with_a_mask_are_eagers(name: str, dtype: torch.dtype) -> None:
    x = torch.tensor(SPECIALS, dtype=dtype)
    mask = torch.tensor([False, False, False, False, True, True, False, True])
    torch._dynamo.reset()
    fn = PRODUCTS[name]
    _same(torch.compile(fn, backend="neuron")(x, mask), fn(x, mask))


def test_the_gradient_through_a_mask_is_eagers() -> None:
    """The backward's ``grad * mask`` where the mask is computed in the backward graph itself
    (``where``'s and ``x * (x > 0)``'s gradients), with infinite incoming gradients."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * (x > 0)

    def grads(compiled: bool) -> torch.Tensor:
        torch._dynamo.reset()
        leaf = torch.tensor([-2.0, 3.0, 0.5, -0.5]).requires_grad_()
        out = (torch.compile(fn, backend="neuron") if compiled else fn)(leaf)
        out.backward(torch.tensor([float("inf"), -float("inf"), 1.0, -1.0]))
        return leaf.grad

    _same(grads(True), grads(False))


def test_a_bernoulli_mask_keeps_ieee_products() -> None:
    """Where a Bernoulli draw is 0, ``inf * 0`` is NaN, never 0 (its draws are ours, not eager's,
    so the check is on what each element must be)."""
    torch._dynamo.reset()
    run = torch.compile(lambda x, p: x * torch.bernoulli(p), backend="neuron")
    out = run(torch.full((256,), float("inf")), torch.full((256,), 0.5))
    assert bool((out.isnan() | (out == float("inf"))).all()), out
    assert 0 < int(out.isnan().sum()) < 256
