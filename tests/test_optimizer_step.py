"""Compiled optimizer steps: Dynamo writes the single-tensor optimizers' ``addcmul_``/``addcdiv_``
with ``value=`` as Inductor's ``prims.fma`` (``decompositions/fma.py``), and ``foreach=True``
optimizers run ``_foreach_*`` list ops (``decompositions/foreach.py``). Each step compiles whole
(they ran one CPU fallback per parameter, or per list op, per step) and the parameters and
optimizer state follow eager's."""

from __future__ import annotations

import warnings

import pytest
import torch

import neuron_compile
from neuron_compile.fallback import FallbackWarning
from neuron_compile.shapes import RecompileWarning

OPTIMIZERS = {
    "adam": lambda ps, fe: torch.optim.Adam(ps, lr=1e-2, foreach=fe),
    "adamw_amsgrad": lambda ps, fe: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, foreach=fe),
    "rmsprop": lambda ps, fe: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.9, foreach=fe),
    "adagrad": lambda ps, fe: torch.optim.Adagrad(ps, lr=1e-1, foreach=fe),
    "sgd_nesterov": lambda ps, fe: torch.optim.SGD(
        ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-2, foreach=fe
    ),
    "nadam": lambda ps, fe: torch.optim.NAdam(ps, lr=1e-2, foreach=fe),
}


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)) for _ in range(3)]


def _run(name: str, compiled: bool, foreach: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = _params()
    opt = OPTIMIZERS[name](params, foreach)
    step = torch.compile(opt.step, backend="neuron") if compiled else opt.step
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        step()
    state = [t for p in params for t in opt.state[p].values() if isinstance(t, torch.Tensor)]
    return [p.detach().clone() for p in params], state


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_compile_whole_and_match_eager(name: str, foreach: bool) -> None:
    torch._dynamo.reset()
    neuron_compile.clear_fallback_ops()
    expected = _run(name, compiled=False, foreach=foreach)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        warnings.simplefilter("ignore", RecompileWarning)  # SGD's first step makes its buffers
        actual = _run(name, compiled=True, foreach=foreach)
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


def _foreach_ops(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every overload family the optimizers use, and the ones with another per-tensor op."""
    t = torch.tensor(0.5)
    out = [
        *torch._foreach_add(xs, 2.0),
        *torch._foreach_add(xs, ys, alpha=-0.5),
        *torch._foreach_add(xs, [1.0, 2.0, 3.0]),
        *torch._foreach_mul(xs, t),
        *torch._foreach_div(xs, ys),
        *torch._foreach_pow(2.0, xs),
        *torch._foreach_maximum(xs, 0.1),
        *torch._foreach_minimum(xs, [0.0, 0.5, -0.5]),
        *torch._foreach_maximum(xs, ys),
        *torch._foreach_norm(xs, 3),
        *torch._foreach_max(xs),
        *torch._foreach_lerp(xs, ys, 0.3),
        *torch._foreach_addcmul(xs, ys, ys, [0.1, 0.2, 0.3]),
        *torch._foreach_addcdiv(xs, ys, xs, 0.25),
        *torch._foreach_sqrt(torch._foreach_abs(xs)),
        *torch._foreach_reciprocal(ys),
    ]
    zs = [x.clone() for x in xs]
    torch._foreach_zero_(zs)
    torch._foreach_add_(zs, ys)
    return [*out, *zs]


def test_foreach_ops_compile_and_match_eager() -> None:
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(4, 3, generator=g) for _ in range(3)]
    ys = [torch.rand(4, 3, generator=g) + 0.5 for _ in range(3)]
    torch._dynamo.reset()
    neuron_compile.clear_fallback_ops()
    actual = torch.compile(_foreach_ops, backend="neuron")(xs, ys)
    assert neuron_compile.get_fallback_ops() == {}
    for a, e in zip(actual, _foreach_ops(xs, ys), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_clip_grad_norm_with_foreach_compiles_and_matches_eager() -> None:
    def clip(params: list[torch.nn.Parameter]) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm=0.5, foreach=True)

    results = []
    for compiled in (False, True):
        params = _params()
        g = torch.Generator().manual_seed(4)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        torch._dynamo.reset()
        neuron_compile.clear_fallback_ops()
        norm = (torch.compile(clip, backend="neuron") if compiled else clip)(params)
        results.append([norm, *(p.grad for p in params)])
    assert neuron_compile.get_fallback_ops() == {}
    for a, e in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
