"""Golden StableHLO for integer matmul/conv/pooling and the quantization ops."""

from __future__ import annotations

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text

qd = torch.ops.quantized_decomposed


def _ints(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.randint(0 if dtype == torch.uint8 else -5, 5, shape, dtype=dtype)


def test_int_mm_accumulates_in_the_integer_type():
    text = lower_to_text(torch.mm, _ints(4, 16), _ints(16, 8))
    FileCheck().check("stablehlo.dot_general").check_same("-> tensor<4x8xi32>").check_not(
        "f32"
    ).run(text)


def test_int64_addmm_runs_as_int32_with_integer_scalars():
    text = lower_to_text(
        lambda b, x, y: torch.addmm(b, x, y, beta=3, alpha=-2),
        _ints(4, 8, dtype=torch.int64),
        _ints(4, 5, dtype=torch.int64),
        _ints(5, 8, dtype=torch.int64),
    )
    FileCheck().check("stablehlo.dot_general").check_same("-> tensor<4x8xi32>").check(
        "dense<-2> : tensor<4x8xi32>"
    ).check("stablehlo.add").check_not("i64").check_not("f32").run(text)


def test_uint8_alpha_wraps_like_eager():
    text = lower_to_text(
        lambda b, x, y: torch.addmm(b, x, y, alpha=-2),
        _ints(2, 3, dtype=torch.uint8),
        _ints(2, 4, dtype=torch.uint8),
        _ints(4, 3, dtype=torch.uint8),
    )
    FileCheck().check("dense<254> : tensor<2x3xui8>").run(text)


def test_aten_int_mm_is_int8_dot_into_int32():
    text = lower_to_text(
        torch._int_mm, _ints(32, 16, dtype=torch.int8), _ints(16, 8, dtype=torch.int8)
    )
    FileCheck().check("stablehlo.dot_general").check_same("tensor<32x16xi8>").check_same(
        "-> tensor<32x8xi32>"
    ).run(text)


def test_int_conv_is_an_integer_convolution():
    text = lower_to_text(
        lambda x, w: F.conv2d(x, w, padding=1),
        _ints(1, 2, 5, 5, dtype=torch.int64),
        _ints(3, 2, 3, 3, dtype=torch.int64),
    )
    FileCheck().check("stablehlo.convolution").check_same("-> tensor<1x3x5x5xi32>").check_not(
        "f32"
    ).run(text)


def test_int_max_pool_pads_with_the_integer_minimum():
    text = lower_to_text(lambda x: F.max_pool2d(x, 3, 2, 1), _ints(1, 1, 5, 5, dtype=torch.int32))
    FileCheck().check("dense<-2147483648> : tensor<i32>").check("stablehlo.reduce_window").run(text)


def test_quantize_per_tensor_rounds_half_even_clamps_and_casts():
    text = lower_to_text(
        lambda x: qd.quantize_per_tensor(x, 0.1, 3, -128, 127, torch.int8), torch.randn(4, 8)
    )
    # 1 / 0.1 rounds to float32 10.0, which is also eager's float32 multiplier
    FileCheck().check("dense<1.000000e+01>").check("stablehlo.multiply").check(
        "stablehlo.round_nearest_even"
    ).check("stablehlo.add").check("stablehlo.maximum").check("stablehlo.minimum").check(
        "stablehlo.convert"
    ).check("-> tensor<4x8xi8>").run(text)


def test_dequantize_per_channel_broadcasts_scales_along_the_axis():
    text = lower_to_text(
        lambda q, s, z: qd.dequantize_per_channel(q, s, z, 1, -128, 127, torch.int8),
        _ints(4, 3, dtype=torch.int8),
        torch.rand(3) + 0.1,
        _ints(3, dtype=torch.int32),
    )
    FileCheck().check("stablehlo.subtract").check("stablehlo.broadcast_in_dim").check_same(
        "(tensor<3x1xf32>)"
    ).check("stablehlo.multiply").check("-> tensor<4x3xf32>").check_not("custom_call").run(text)


def test_fake_quantize_returns_value_and_mask():
    text = lower_to_text(
        lambda x: torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 3, 0, 255),
        torch.randn(4, 8),
    )
    FileCheck().check("stablehlo.round_nearest_even").check("stablehlo.clamp").check(
        "stablehlo.and"
    ).check_same("tensor<4x8xi1>").run(text)
