"""Compiled optimizer steps: Dynamo writes the single-tensor optimizers' ``addcmul_``/``addcdiv_``
with ``value=`` as Inductor's ``prims.fma``, which ``decompositions/fma.py`` turns into ops the
lowering covers. Each step compiles whole (it ran one CPU fallback per parameter per step) and
the parameters and optimizer state follow eager's."""

from __future__ import annotations

import warnings

import pytest
import torch

import neuron_compile
from neuron_compile.fallback import FallbackWarning

OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, foreach=False),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.9, foreach=False),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=1e-1, foreach=False),
}


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)) for _ in range(3)]


def _run(name: str, compiled: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = _params()
    opt = OPTIMIZERS[name](params)
    step = torch.compile(opt.step, backend="neuron") if compiled else opt.step
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        step()
    state = [t for p in params for t in opt.state[p].values() if isinstance(t, torch.Tensor)]
    return [p.detach().clone() for p in params], state


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_single_tensor_optimizer_steps_compile_whole_and_match_eager(name: str) -> None:
    torch._dynamo.reset()
    neuron_compile.clear_fallback_ops()
    expected = _run(name, compiled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        actual = _run(name, compiled=True)
    assert neuron_compile.get_fallback_ops() == {}
    for a, e in zip([*actual[0], *actual[1]], [*expected[0], *expected[1]], strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_bfloat16_addcmul_with_value_rounds_once() -> None:
    """``x.addcmul_(a, b, value=v)`` in bfloat16, as Dynamo writes it (``torch.mul`` of the two
    tensors, then ``prims.fma`` of that product, ``v`` and ``x``): the fma computes in float32
    and rounds once, as Inductor's does, not after its product too (the prim's eager kernel)."""
    g = torch.Generator().manual_seed(2)
    x, a, b = (torch.randn(4096, generator=g).to(torch.bfloat16) for _ in range(3))

    def f(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x.clone().addcmul_(a * 1, b, value=0.37)

    torch._dynamo.reset()
    neuron_compile.clear_fallback_ops()
    actual = torch.compile(f, backend="neuron")(x, a, b)
    assert neuron_compile.get_fallback_ops() == {}
    product = (a.float() * b.float()).to(torch.bfloat16)  # Dynamo's separate torch.mul
    once = (product.float() * 0.37 + x.float()).to(torch.bfloat16)
    assert actual.dtype == torch.bfloat16
    assert torch.equal(actual, once)
