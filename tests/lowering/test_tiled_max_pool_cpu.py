"""The cpu target's max-pool backward for windows that tile the input (``cpu/pooling.py``):
gradients equal eager's bit for bit (ties, NaN, -inf, -0.0 gradients, bfloat16, 2-D, 3-D,
unbatched; values and indices too), windows that do not tile keep the reference form; the form
is taken only for indices known to be the matching forward pool's, so indices from anywhere
else still scatter-add as eager does; the trn2 target never gets the form; and the FX index key
tells graphs with and without known indices apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.compiler import fx_index_key
from neuron_compile.config import NeuronConfig
from neuron_compile.saved import POOL_INDICES

aten = torch.ops.aten


def _input(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    if dtype.is_floating_point:
        flat = x.view(-1)
        flat[:4] = 1.0  # a window of ties: the first position wins
        flat[9] = float("nan")  # NaN wins its window
        flat[16:20] = float("-inf")  # a window of -inf
    return x


def _pool_and_grads(fn, x: torch.Tensor, compiled: bool):
    torch._dynamo.reset()
    run = torch.compile(fn, backend="neuron") if compiled else fn
    leaf = x.clone().requires_grad_()
    values, indices = run(leaf)
    g = torch.linspace(-1, 1, values.numel()).view_as(values).to(values.dtype)
    g.view(-1)[0] = -0.0  # eager's 0 + g gives +0.0 where g is -0.0
    values.backward(g)
    return values.detach(), indices, leaf.grad


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    assert bool(same.all()), (actual, expected)
    assert torch.equal(torch.signbit(actual), torch.signbit(expected))


CASES = {
    "2d_k2": (lambda x: F.max_pool2d(x, 2, return_indices=True), (2, 3, 8, 6)),
    "2d_k2x3_stride_given": (
        lambda x: F.max_pool2d(x, (2, 3), stride=(2, 3), return_indices=True),
        (2, 2, 6, 9),
    ),
    "2d_ceil_mode_exact": (
        lambda x: F.max_pool2d(x, 2, ceil_mode=True, return_indices=True),
        (1, 2, 4, 4),
    ),  # fmt: skip
    "3d_k2": (lambda x: F.max_pool3d(x, 2, return_indices=True), (1, 2, 4, 4, 6)),
    "unbatched": (lambda x: F.max_pool2d(x, 2, return_indices=True), (3, 4, 4)),
    # the reference form: windows overlap, pad, or leave a partial window
    "overlapping": (lambda x: F.max_pool2d(x, 3, stride=2, return_indices=True), (2, 3, 9, 9)),
    "padded": (lambda x: F.max_pool2d(x, 2, padding=1, return_indices=True), (2, 3, 6, 6)),
    "partial": (lambda x: F.max_pool2d(x, 2, return_indices=True), (2, 3, 7, 6)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_indices_and_gradients_are_eagers(name: str, dtype: torch.dtype) -> None:
    fn, shape = CASES[name]
    x = _input(shape, dtype)
    actual, expected = _pool_and_grads(fn, x, True), _pool_and_grads(fn, x, False)
    _same(actual[0], expected[0])
    _same(actual[1], expected[1])
    if name == "overlapping" and dtype == torch.bfloat16:
        # overlapping windows add several gradients into one element: the reference form sums
        # them in float32 and rounds once (docs/semantics.md), eager in bfloat16
        torch.testing.assert_close(actual[2], expected[2], rtol=1e-2, atol=1e-2)
    else:
        _same(actual[2], expected[2])


def _ops(dump: Path) -> dict[str, str]:
    return {
        m.parent.name.rsplit("_", 2)[-2]: m.read_text()
        for m in sorted(dump.rglob("module.stablehlo.mlir"))
    }


@pytest.mark.parametrize("target", ["cpu", "trn2"])
def test_only_the_cpu_target_gets_the_tiled_form(tmp_path: Path, target: str) -> None:
    torch._dynamo.reset()
    run = torch.compile(lambda x: F.max_pool2d(x, 2).sum(), backend="neuron",
                        options={"target": target, "dump_dir": str(tmp_path)})  # fmt: skip
    run(torch.randn(2, 3, 8, 8, requires_grad=True)).backward()
    # a select where the index matches instead of a scatter-add
    assert ("stablehlo.scatter" in _ops(tmp_path)["backward"]) is (target == "trn2")


@pytest.mark.parametrize("name", ["overlapping", "padded", "partial"])
def test_windows_that_do_not_tile_scatter_add(tmp_path: Path, name: str) -> None:
    fn, shape = CASES[name]
    torch._dynamo.reset()
    run = torch.compile(lambda x: fn(x)[0].sum(), backend="neuron",
                        options={"dump_dir": str(tmp_path)})  # fmt: skip
    run(torch.randn(shape, requires_grad=True)).backward()
    assert "stablehlo.scatter" in _ops(tmp_path)["backward"]


@pytest.mark.filterwarnings("ignore::neuron_compile.compiler.DowncastWarning")  # the indices
def test_indices_from_elsewhere_scatter_add_like_eager(tmp_path: Path) -> None:
    """Indices that point outside their windows (here: every window's gradient sent to position
    0 of its plane, where they add up) are not the pool's: the reference form takes them."""

    def backward(g: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                     indices)  # fmt: skip

    x, g = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 2, 2)
    indices = torch.zeros(2, 3, 2, 2, dtype=torch.int64)
    torch._dynamo.reset()
    run = torch.compile(backward, backend="neuron", options={"dump_dir": str(tmp_path)})
    actual, expected = run(g, x, indices), backward(g, x, indices)
    torch.testing.assert_close(actual, expected)
    assert "stablehlo.scatter" in next(iter(_ops(tmp_path).values()))


def test_fx_index_key_tells_known_indices_apart() -> None:
    """The same backward graph lowers to another module when its indices are known to be a
    pool's, so the FX index must not hand one's module to the other."""

    def backward(g: torch.Tensor, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                     indices)  # fmt: skip

    args = (torch.randn(1, 1, 2, 2), torch.randn(1, 1, 4, 4), torch.zeros(1, 1, 2, 2).long())
    gm = make_fx(backward)(*args)
    cfg = NeuronConfig()
    unknown = fx_index_key(gm, cfg)
    indices = [p.name for p in gm.graph.find_nodes(op="placeholder")][2]
    window = (str(aten.max_pool2d_with_indices.default), (1, 1, 4, 4), (2, 2), (2, 2), (0, 0),
              (1, 1), False)  # fmt: skip
    gm.meta[POOL_INDICES] = {indices: window}
    assert fx_index_key(gm, cfg) != unknown
