"""Compiled outputs carry eager's strides (OutputSpec.stride), as Inductor's do: a permuted
input's layout kept by elementwise ops, channels_last convolutions. With contiguous outputs the
values agreed, but the next compiled frame's stride guards failed and Dynamo recompiled it."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from neuron_compile.lowering.lower_graph import lower_graph
from tests.helpers import index_roundtrip, trace_aten


def _gelu2(x):
    return torch.nn.functional.gelu(x) * 2.0


def _permuted() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(2, 64, 32).permute(0, 2, 1)


def test_a_permuted_input_keeps_its_layout():
    x = _permuted()
    out = torch.compile(_gelu2, backend="neuron")(x)
    assert out.stride() == _gelu2(x).stride() == (2048, 1, 32)
    torch.testing.assert_close(out, _gelu2(x))


def test_channels_last_convolution_stays_channels_last():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        out = torch.compile(conv, backend="neuron")(x)
        eager = conv(x)
    assert out.stride() == eager.stride() and out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-5)


def test_the_next_compiled_frame_is_not_recompiled():
    """A frame compiled on eager's layout accepts our output without a stride-guard miss."""
    x = _permuted()
    consumer = torch.compile(lambda t: t.sum(dim=1) + 1.0, backend="neuron")
    consumer(_gelu2(x))  # compiled for eager's layout
    frames = counters["stats"]["unique_graphs"]
    consumer(torch.compile(_gelu2, backend="neuron")(x))
    assert counters["stats"]["unique_graphs"] == frames + 1  # only the producer's frame


def test_the_fx_index_carries_output_strides():
    gm = trace_aten(_gelu2, _permuted())
    lowered = lower_graph(gm)
    assert [o.stride for o in lowered.outputs] == [(2048, 1, 32)]
    assert index_roundtrip(lowered).outputs == lowered.outputs


def _expanded_outputs(x):
    s = x.sum(0, keepdim=True)
    return s.expand(3, 4), x.sum().expand(5), x[:, None, :].expand(3, 2, 4) * 1, s.t().expand(4, 2)


def test_expanded_outputs_keep_their_broadcast_strides():
    """Eager's expanded results share one element along each broadcast dim (stride 0): a write
    to one shows in all. They came back dense, so a write changed one row only."""
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    compiled = torch.compile(_expanded_outputs, backend="neuron")(x)
    eager = _expanded_outputs(x)
    for c, e in zip(compiled, eager, strict=True):
        torch.testing.assert_close(c, e)
        assert c.stride() == e.stride(), (c.stride(), e.stride())
    compiled[0][0, 0] = eager[0][0, 0] = 5.0
    assert compiled[0][:, 0].tolist() == eager[0][:, 0].tolist() == [5.0] * 3


def test_an_expanded_gradient_has_eagers_strides():
    grads = []
    for fn in (torch.sum, torch.compile(torch.sum, backend="neuron")):
        x = torch.randn(3, 4, requires_grad=True)
        grads.append(torch.autograd.grad(fn(x), x)[0])
    assert grads[0].stride() == grads[1].stride() == (0, 0)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize(
    "make, shifts, dims",
    [
        (lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), 1, 2),
        (lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), (1, -2), (2, 3)),
        (lambda: torch.randn(6, 7).t(), 2, 1),
        (lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), 3, ()),
        (lambda: torch.randn(2, 3, 4, 5), 1, 3),
    ],
    ids=["channels_last", "channels_last_two_dims", "transposed", "flattened", "contiguous"],
)
def test_roll_is_laid_out_as_eager_lays_it_out(make, shifts, dims):
    """Eager writes a roll along dims in its input's suggested memory format (channels_last
    stays channels_last, a transposed matrix's roll is contiguous, so is a flattened roll);
    PyTorch's decomposition made every result contiguous (decompositions/indexing.py)."""
    x = make().requires_grad_()

    def f(t):
        return torch.roll(t, shifts, dims) * 2

    torch._dynamo.reset()
    out, expected = torch.compile(f, backend="neuron")(x), f(x)
    assert torch.equal(out, expected) and out.stride() == expected.stride()
    (grad,), (expected_grad,) = (torch.autograd.grad(o.sum(), x) for o in (out, expected))
    assert torch.equal(grad, expected_grad)
