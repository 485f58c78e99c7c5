"""The cpu target's product with a 0/1 mask (``cpu/masks.py``): XLA CPU rewrites
``multiply(x, convert(pred))`` into ``select(pred, x, 0)``, which gave 0.0 where eager's
``inf * False`` is NaN and ``-2.0 * False`` is -0.0. The products equal eager's bit for bit, in
every spelling of the mask and every floating dtype, forward and backward; trn targets keep the
plain multiplication."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("target", ["cpu", "trn2"])
def test_only_the_cpu_target_selects(tmp_path: Path, target: str) -> None:
    torch._dynamo.reset()
    run = torch.compile(lambda x, m: x * m, backend="neuron",
                        options={"target": target, "dump_dir": str(tmp_path)})  # fmt: skip
    run(torch.randn(8), torch.rand(8) > 0.5)
    text = next(tmp_path.rglob("module.stablehlo.mlir")).read_text()
    assert ("stablehlo.select" in text) is (target == "cpu")
    assert "stablehlo.multiply" in text


def test_products_without_a_mask_keep_the_multiplication(tmp_path: Path) -> None:
    torch._dynamo.reset()
    run = torch.compile(lambda x, y: x * y, backend="neuron", options={"dump_dir": str(tmp_path)})
    x, y = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(run(x, y), x * y, rtol=0, atol=0)
    assert "stablehlo.select" not in next(tmp_path.rglob("module.stablehlo.mlir")).read_text()
