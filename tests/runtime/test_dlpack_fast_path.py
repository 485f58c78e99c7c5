"""The executor's fast dlpack paths: chosen even when first built under FakeTensorMode."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import neuron_compile
from neuron_compile.runtime import xla_cpu


@pytest.fixture
def fresh_probes():
    xla_cpu._importer.cache_clear()
    xla_cpu._exporters.cache_clear()
    yield
    xla_cpu._importer.cache_clear()
    xla_cpu._exporters.cache_clear()


def test_first_probe_under_fake_mode_still_picks_fast_paths(fresh_probes):
    # Regression: the first executable is built inside AOTAutograd's compiler, under
    # FakeTensorMode; the import probe used to fail there and pin the ~8x slower public path.
    with FakeTensorMode():
        imp, (exp, many) = xla_cpu._importer(), xla_cpu._exporters()
    assert (imp.__name__, exp.__name__, many.__name__) == ("fast", "one", "many")


def test_compiled_model_uses_fast_paths_and_round_trips(fresh_probes):
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    out = torch.compile(model, backend="neuron")(x)
    out.sum().backward()
    assert [r.kind for r in neuron_compile.metrics()] == ["forward", "backward"]
    assert (xla_cpu._importer().__name__, xla_cpu._exporters()[0].__name__) == ("fast", "one")
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(model.bias.grad, torch.full((3,), 2.0))


def test_requires_grad_and_bf16_tensors_cross_without_detach(fresh_probes):
    imp, (exp, many) = xla_cpu._importer(), xla_cpu._exporters()
    p = torch.nn.Parameter(torch.randn(3, 5))
    back = exp(imp(p))
    assert not back.requires_grad and back.data_ptr() == p.data_ptr()  # zero-copy alias
    torch.testing.assert_close(back, p.detach())
    b = torch.randn(7).bfloat16()
    assert torch.equal(exp(imp(b)), b)
    both = many([imp(p), imp(b)])
    assert both[0].data_ptr() == p.data_ptr() and torch.equal(both[1], b)
