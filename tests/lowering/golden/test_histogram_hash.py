"""Golden StableHLO for the histogram, hash_tensor and gcd/lcm rules."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from tests.helpers import lower_to_text

aten = torch.ops.aten


def test_histc_rounds_each_bf16_step_and_scatter_adds_counts():
    text = lower_to_text(lambda x: torch.histc(x, 4, 0, 1), torch.randn(6).bfloat16())
    # (x - min) * bins / (max - min), each step rounded to bf16 as c10's operators do (a convert
    # pair behind a barrier), the divisor hidden from XLA's reciprocal rewrite
    rounding = ["stablehlo.convert", "bf16>", "stablehlo.optimization_barrier", "stablehlo.convert"]
    check = FileCheck().check("stablehlo.subtract")
    for step in ("multiply", "divide"):
        for pattern in rounding:
            check = check.check(pattern)
        check = check.check(f"stablehlo.{step}")
    check.check("stablehlo.scatter").check("stablehlo.add").check(" return %").check_same(
        "tensor<4xbf16>"
    ).run(text)
    assert "reduce_precision" not in text  # it would flush float16 subnormals


def test_histc_without_a_range_reduces_the_data_in_graph():
    text = lower_to_text(lambda x: torch.histc(x, 5), torch.randn(8))
    FileCheck().check("applies stablehlo.minimum").check("applies stablehlo.maximum").check(
        "stablehlo.scatter"
    ).run(text)
    assert "bf16" not in text and "f16" not in text  # float32 rounds each step itself


def test_histogram_with_a_range_embeds_eagers_edges():
    text = lower_to_text(lambda x: torch.histogram(x, 4, range=(0.0, 1.0)), torch.rand(8))
    FileCheck().check(
        "dense<[0.000000e+00, 2.500000e-01, 5.000000e-01, 7.500000e-01, 1.000000e+00]>"
    ).check("stablehlo.gather").check("stablehlo.scatter").check_not(
        "applies stablehlo.minimum"
    ).run(text)


def test_histogram_without_a_range_replays_linspace_with_exact_fma():
    text = lower_to_text(lambda x: torch.histogram(x, 3), torch.randn(8))
    # extrema, then linspace's fused multiply-adds: Veltkamp split constant, round-to-odd bits
    FileCheck().check("applies stablehlo.minimum").check("applies stablehlo.maximum").check(
        "4.097000e+03"
    ).check("stablehlo.bitcast_convert").check("stablehlo.gather").check("stablehlo.scatter").run(
        text
    )


def test_histogram_with_bin_edges_runs_a_binary_search():
    text = lower_to_text(
        lambda x, b: torch.histogram(x, b), torch.randn(8), torch.tensor([-1.0, 0.0, 2.0])
    )
    # 3 edges: two halving steps of std::upper_bound, one gather each
    gather = '"stablehlo.gather"('
    FileCheck().check(gather).check(gather).check_not(gather).check("stablehlo.scatter").run(text)


def test_histogramdd_density_divides_by_total_then_widths():
    text = lower_to_text(
        lambda x: torch.histogramdd(x, [2, 3], density=True).hist, torch.randn(5, 2)
    )
    FileCheck().check("stablehlo.scatter").check("tensor<6xf32>").check(
        "applies stablehlo.add"
    ).check("stablehlo.divide").check("stablehlo.divide").check("stablehlo.divide").check(
        "return"
    ).check_same("tensor<2x3xf32>").run(text)


def test_hash_tensor_xors_float64_bits_as_uint64():
    text = lower_to_text(lambda x: aten.hash_tensor(x, [1]), torch.randn(3, 4))
    FileCheck().check("stablehlo.bitcast_convert").check("stablehlo.count_leading_zeros").check(
        "applies stablehlo.xor"
    ).check("-> tensor<3xui64>").check_not("f64").run(text)


def test_gcd_is_a_euclid_while_loop():
    a = torch.tensor([12, -18], dtype=torch.int32)
    text = lower_to_text(torch.gcd, a, a)
    FileCheck().check("stablehlo.abs").check("stablehlo.while").check("applies stablehlo.or").check(
        "stablehlo.remainder"
    ).run(text)


def test_int64_gcd_takes_unsigned_magnitudes():
    a = torch.tensor([12, -18])
    text = lower_to_text(torch.gcd, a, a)
    FileCheck().check("stablehlo.abs").check("stablehlo.bitcast_convert").check_same(
        "xui32>"
    ).check("stablehlo.while").check("stablehlo.remainder").check_same("xui32>").run(text)


def test_int8_lcm_multiplies_in_int32_like_cpp_promotion():
    a = torch.tensor([100, -3], dtype=torch.int8)
    text = lower_to_text(torch.lcm, a, a)
    FileCheck().check("stablehlo.while").check("stablehlo.multiply").check_same("xi32>").check(
        "stablehlo.abs"
    ).check_same("xi32>").check("-> tensor<2xi8>").run(text)
