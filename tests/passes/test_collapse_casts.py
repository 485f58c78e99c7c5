"""collapse_casts: exact-widening middle casts disappear; rounding casts stay."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_function, make_boxed_func
from torch._functorch.partitioners import default_partition

from neuron_compile.capture import decomposition_table
from neuron_compile.passes import PIPELINE, collapse_casts, run_pipeline
from neuron_compile.passes.collapse_casts import is_exact
from tests.helpers import trace_aten
from tests.passes.graphs import count, targets

aten = torch.ops.aten
prims = torch.ops.prims
bf16, f16, f32, f64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


def _chain(src, mid, dst):
    return lambda x: (x.to(mid).to(dst) * 2,)


def _special_values(dtype):
    x = torch.tensor([0.0, -0.0, 1.0, -2.5, 1e-3, 3.0e4, float("inf"), float("nan")])
    return torch.cat([x, torch.randn(24) * 100]).to(dtype)


@pytest.mark.parametrize(
    ("src", "mid", "dst"),
    [(bf16, f32, f16), (f16, f32, bf16), (bf16, f32, f64), (f16, f64, f32), (f32, f64, bf16)],
)
def test_exact_widening_in_the_middle_is_collapsed(src, mid, dst):
    fn = _chain(src, mid, dst)
    x = _special_values(src)
    gm = trace_aten(fn, x)
    assert count(gm, aten._to_copy.default) == 2
    assert collapse_casts(gm) is True
    gm.recompile()
    assert count(gm, aten._to_copy.default) == 1
    torch.testing.assert_close(gm(x), fn(x), equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("src", "mid"), [(f32, bf16), (f32, f16), (bf16, f16), (f16, bf16), (f64, f32)]
)
def test_rounding_in_the_middle_stays(src, mid):
    fn = _chain(src, mid, src)  # e.g. f32 -> bf16 -> f32 rounds to bf16 on purpose
    gm = trace_aten(fn, _special_values(src))
    before = targets(gm)
    assert collapse_casts(gm) is False
    assert targets(gm) == before


def test_round_trip_through_a_wider_dtype_disappears():
    fn = _chain(bf16, f32, bf16)
    x = _special_values(bf16)
    gm = trace_aten(fn, x)
    assert collapse_casts(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.mul.Tensor]
    torch.testing.assert_close(gm(x), fn(x), equal_nan=True, atol=0, rtol=0)


def test_round_trip_returning_the_input_keeps_one_copy():
    gm = trace_aten(lambda x: x.to(f32).to(bf16), torch.randn(4).to(bf16))
    assert collapse_casts(gm) is True
    gm.recompile()
    x = torch.randn(4).to(bf16)
    assert gm(x) is not x and torch.equal(gm(x), x)
    assert count(gm, aten._to_copy.default) == 1


def test_integer_chains_and_convert_element_type():
    def fn(x):
        w = torch.ops.prims.convert_element_type(x, torch.int32)
        return (torch.ops.prims.convert_element_type(w, f32) + 1,)

    x = torch.randint(-128, 127, (6,), dtype=torch.int8)
    gm = trace_aten(fn, x)
    assert collapse_casts(gm) is True
    gm.recompile()
    assert count(gm, prims.convert_element_type.default) == 1
    torch.testing.assert_close(gm(x), fn(x))
    assert is_exact(torch.int8, torch.int32) and not is_exact(torch.int32, f32)
    assert is_exact(torch.uint8, bf16) and not is_exact(torch.int16, f16)


def test_inner_cast_with_other_users_stays():
    def fn(x):
        w = x.to(f32)
        return w.to(f16), w * 2

    gm = trace_aten(fn, torch.randn(4).to(bf16))
    assert collapse_casts(gm) is False


def test_second_run_changes_nothing():
    gm = trace_aten(_chain(bf16, f32, f16), torch.randn(4).to(bf16))
    assert collapse_casts(gm) is True
    nodes = [(n.op, n.target, n.args) for n in gm.graph.nodes]
    assert collapse_casts(gm) is False
    assert [(n.op, n.target, n.args) for n in gm.graph.nodes] == nodes


def test_logs_what_it_changed(caplog):
    gm = trace_aten(_chain(bf16, f32, f16), torch.randn(4).to(bf16))
    with caplog.at_level(logging.DEBUG, logger="neuron_compile.passes"):
        collapse_casts(gm)
    assert any("collapse_casts: collapsed 1 cast pairs" in r.getMessage() for r in caplog.records)


def _autocast_mlp(x, w1, b1, w2):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = F.gelu(F.linear(x, w1, b1))
        return F.linear(h.float().to(torch.bfloat16), w2).float().square().mean()


def test_autocast_linear_gelu_forward_backward_numerics_unchanged():
    torch.manual_seed(0)
    args = [torch.randn(4, 8), torch.randn(16, 8) / 3, torch.randn(16), torch.randn(4, 16) / 4]
    ref_args = [a.clone().requires_grad_() for a in args]
    ref = _autocast_mlp(*ref_args)
    ref.backward()

    changed: list[list[str]] = []

    def compiler(gm, _inputs):
        changed.append(run_pipeline(gm, PIPELINE))
        return make_boxed_func(gm)

    got_args = [a.clone().requires_grad_() for a in args]
    compiled = aot_function(
        _autocast_mlp,
        compiler,
        compiler,
        partition_fn=default_partition,
        decompositions=decomposition_table(),
    )
    got = compiled(*got_args)
    got.backward()
    torch.testing.assert_close(got, ref, atol=0, rtol=0)
    for g, r in zip(got_args, ref_args, strict=True):
        torch.testing.assert_close(g.grad, r.grad, atol=0, rtol=0)
    assert any("collapse_casts" in c for c in changed)  # bf16 -> f32 -> bf16 of h


def test_torch_compile_numerics_unchanged():
    torch.manual_seed(0)
    args = [torch.randn(4, 8), torch.randn(16, 8) / 3, torch.randn(16), torch.randn(4, 16) / 4]
    got = torch.compile(_autocast_mlp, backend="neuron_compile")(*args)
    torch.testing.assert_close(got, _autocast_mlp(*args), atol=1e-2, rtol=1e-2)
