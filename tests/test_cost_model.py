"""Roofline cost model against hand-computed numbers (constants:
docs/trainium-reference.md §R2)."""

from __future__ import annotations

import pytest
import torch

from neuron_compile.targets import get_target
from neuron_compile.trainium.cost_model import (
    MATMUL_OPS,
    contraction_size,
    estimate_for_record,
    estimate_module,
)

TRN2, TRN3 = get_target("trn2"), get_target("trn3")


# ---- StableHLO modules (estimate_module) ------------------------------------------------------
# Constants by hand (docs/trainium-reference.md §R2): trn2 TensorE 79e12 FLOP/s bf16, 20e12 f32;
# HBM 0.36e12 B/s (trn3 0.53e12); Vector 512 x 0.96e9 elem/s for 16-bit data, 256 x 0.96e9 else.
BF16_PEAK, F32_PEAK, HBM2, HBM3 = 79e12, 20e12, 0.36e12, 0.53e12
VEC16, VEC32 = 512 * 0.96e9, 256 * 0.96e9


def _module(args: str, result: str, body: str) -> str:
    """``@main`` returning ``%0``."""
    return f"func.func @main({args}) -> {result} {{\n{body}\n  return %0 : {result}\n}}"


def _dot(dtype: str, m: int, k: int, n: int) -> str:
    return _module(
        f"%a: tensor<{m}x{k}x{dtype}>, %b: tensor<{k}x{n}x{dtype}>",
        f"tensor<{m}x{n}x{dtype}>",
        f"  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : "
        f"(tensor<{m}x{k}x{dtype}>, tensor<{k}x{n}x{dtype}>) -> tensor<{m}x{n}x{dtype}>",
    )


def test_hlo_bf16_dot_general_is_compute_bound_at_79_tflops():
    cost = estimate_module(_dot("bf16", 1024, 1024, 1024), "trn2")
    (op,) = cost.ops
    flops = 2.0 * 1024 * 1024 * 1024  # 2 x result elements x contracting size
    assert op.op_name == "stablehlo.dot_general" and op.bound == "compute"
    assert op.flops == flops and op.bytes == 3 * 1024 * 1024 * 2
    assert cost.seconds == pytest.approx(flops / BF16_PEAK, rel=1e-9)  # 27.2 us
    assert estimate_module(_dot("bf16", 1024, 1024, 1024), "trn2", lnc=2).seconds == (
        pytest.approx(cost.seconds / 2, rel=1e-9)
    )


def test_hlo_f32_dot_uses_the_20_tflops_peak_and_bf16_is_faster():
    f32 = estimate_module(_dot("f32", 512, 256, 512), TRN2)
    assert f32.seconds == pytest.approx(2.0 * 512 * 512 * 256 / F32_PEAK, rel=1e-9)  # 6.7 us
    bf16 = estimate_module(_dot("bf16", 512, 256, 512), TRN2)
    memory = 2 * (512 * 256 * 2 + 512 * 512) / HBM2  # bf16 at this size is memory-bound
    assert bf16.seconds == pytest.approx(max(2.0 * 512 * 512 * 256 / BF16_PEAK, memory), rel=1e-9)
    assert bf16.seconds < f32.seconds


def test_hlo_elementwise_is_memory_bound_and_trn3_is_faster():
    t = "tensor<1048576xbf16>"
    text = _module(f"%x: {t}, %y: {t}", t, f"  %0 = stablehlo.add %x, %y : {t}")
    moved = 3 * (1 << 20) * 2
    trn2 = estimate_module(text, "trn2")
    assert trn2.seconds == pytest.approx(max(moved / HBM2, (1 << 20) / VEC16), rel=1e-9)
    assert trn2.ops[0].bound == "memory" and trn2.flops == 1 << 20
    assert estimate_module(text, "trn3").seconds == pytest.approx(moved / HBM3, rel=1e-9)
    assert estimate_module(text, "trn3").seconds < trn2.seconds


def test_hlo_a_repeated_operand_is_read_once():
    t = "tensor<1024xf32>"
    cost = estimate_module(_module(f"%x: {t}", t, f"  %0 = stablehlo.multiply %x, %x : {t}"))
    assert cost.bytes == 2 * 1024 * 4


REDUCE = _module(
    "%x: tensor<4096x4096xf32>",
    "tensor<4096xf32>",
    """  %c = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %c) applies stablehlo.add across dimensions = [1] :
    (tensor<4096x4096xf32>, tensor<f32>) -> tensor<4096xf32>
  %1 = stablehlo.reshape %0 : (tensor<4096xf32>) -> tensor<64x64xf32>""",
)


def test_hlo_reduction_is_one_pass_and_its_body_is_not_counted():
    cost = estimate_module(REDUCE, "trn2")
    # constant and reshape are free; the reduce's scalar add is part of the reduce
    assert [c.op_name for c in cost.ops] == [
        "stablehlo.constant",
        "stablehlo.reduce",
        "stablehlo.reshape",
    ]
    assert cost.op_count == 3 and [c.bound for c in cost.ops] == ["free", "memory", "free"]
    moved = 4 * (4096 * 4096 + 1 + 4096)  # operand, init scalar, result
    assert cost.seconds == pytest.approx(max(moved / HBM2, 4096 * 4096 / VEC32), rel=1e-9)


def test_hlo_reduce_in_generic_form_with_region_counts_the_same():
    generic = _module(
        "%x: tensor<8x16xf32>",
        "tensor<8xf32>",
        """  %c = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
  %0 = "stablehlo.reduce"(%x, %c) ({
  ^bb0(%p: tensor<f32>, %q: tensor<f32>):
    %s = "stablehlo.add"(%p, %q) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    "stablehlo.return"(%s) : (tensor<f32>) -> ()
  }) {dimensions = array<i64: 1>} : (tensor<8x16xf32>, tensor<f32>) -> tensor<8xf32>""",
    )
    cost = estimate_module(generic)
    assert cost.op_count == 2 and cost.ops[1].flops == 8 * 16
    assert cost.bytes == 4 * (8 * 16 + 1 + 8)


def test_hlo_transpose_costs_bytes_only():
    text = _module(
        "%x: tensor<1024x512xf32>",
        "tensor<512x1024xf32>",
        "  %0 = stablehlo.transpose %x, dims = [1, 0] : "
        "(tensor<1024x512xf32>) -> tensor<512x1024xf32>",
    )
    (op,) = estimate_module(text, "trn2").ops
    assert op.flops == 0 and op.bound == "memory"
    assert op.seconds == pytest.approx(2 * 4 * 1024 * 512 / HBM2, rel=1e-9)  # 11.7 us


def _custom_call(target: str, dtype: str = "f32") -> str:
    t = f"tensor<128x4096x{dtype}>"
    return _module(
        f"%x: {t}",
        t,
        f'  %0 = stablehlo.custom_call @{target}(%x) {{backend_config = ""}} : ({t}) -> {t}',
    )


def test_hlo_softmax_custom_call_is_one_fused_kernel_of_three_passes():
    (op,) = estimate_module(_custom_call("AwsNeuronSoftmax"), "trn2").ops
    elems = 128 * 4096
    assert op.op_name == "stablehlo.custom_call@AwsNeuronSoftmax"
    assert op.flops == 3 * elems and op.bytes == 2 * 4 * elems
    assert op.seconds == pytest.approx(max(3 * elems / VEC32, 2 * 4 * elems / HBM2), rel=1e-9)
    (bf16,) = estimate_module(_custom_call("AwsNeuronRmsNorm", "bf16"), "trn2", lnc=2).ops
    compute, memory = 2 * elems / (2 * VEC16), 2 * 2 * elems / (2 * HBM2)
    assert bf16.seconds == pytest.approx(max(compute, memory), rel=1e-9)


def test_hlo_user_kernels_and_unknown_custom_calls_cost_bytes_only():
    for target in ("AwsNeuronCustomNativeKernel", "SomethingElse"):
        (op,) = estimate_module(_custom_call(target), "trn3").ops
        assert op.flops == 0 and op.seconds == pytest.approx(2 * 4 * 128 * 4096 / HBM3)


def test_hlo_calls_are_inlined_and_costs_are_deterministic():
    t = "tensor<256xf32>"
    text = f"""
func.func private @twice(%x: {t}) -> {t} {{
  %0 = stablehlo.add %x, %x : {t}
  return %0 : {t}
}}
func.func @main(%x: {t}) -> {t} {{
  %0 = func.call @twice(%x) : ({t}) -> {t}
  %1 = func.call @twice(%0) : ({t}) -> {t}
  return %1 : {t}
}}"""
    cost = estimate_module(text)
    assert cost.op_count == 2 and {c.op_name for c in cost.ops} == {"stablehlo.add"}
    assert estimate_module(text) == cost
    with pytest.raises(ValueError, match="trn2 or trn3"):
        estimate_module(text, "cpu")


def test_hlo_estimate_for_record_never_raises():
    assert estimate_for_record("not mlir", "trn2") is None
    assert estimate_for_record(REDUCE, "trn2", 1) == estimate_module(REDUCE).seconds
    # lnc=None: the target's default logical core (2 on trn2) unless NEURON_LOGICAL_NC_CONFIG
    assert estimate_for_record(REDUCE, "trn2") in (
        pytest.approx(estimate_module(REDUCE).seconds / 2),
        pytest.approx(estimate_module(REDUCE).seconds),
    )


def test_estimate_option_defaults_to_the_trn_target_else_off():
    from neuron_compile.config import load_config
    from neuron_compile.errors import OptionsError

    assert load_config(env={"NEURON_COMPILE_TARGET": "cpu"}).estimate == "off"
    assert load_config(env={"NEURON_COMPILE_TARGET": "trn3"}).estimate == "trn3"
    env = {"NEURON_COMPILE_TARGET": "cpu", "NEURON_COMPILE_ESTIMATE": "trn2"}
    assert load_config(env=env).estimate == "trn2"
    assert load_config({"estimate": "off"}, env=env).estimate == "off"  # options win
    with pytest.raises(OptionsError, match="estimate"):
        load_config({"estimate": "h100"}, env={})


def test_fx_dot_general_counts_as_a_matmul():
    """The one FX matmul op set: a ``dot_general`` that ``sink_transposes`` made of ``t`` + ``mm``
    is a matmul with the same K (legality's instruction count tiles it on TensorE)."""
    from neuron_compile.passes import run_pipeline
    from neuron_compile.passes.sink_transposes import sink_transposes
    from tests.helpers import trace_aten

    gm = trace_aten(lambda a, b: a.t() @ b, torch.randn(64, 32), torch.randn(64, 16))
    (mm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert contraction_size(mm) == 64
    run_pipeline(gm, [sink_transposes])
    (dot,) = [n for n in gm.graph.nodes if "dot_general" in str(n.target)]
    assert dot.target in MATMUL_OPS and contraction_size(dot) == 64  # K = the contracted lhs dim
