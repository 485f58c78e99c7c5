"""Delta debugging over StableHLO ops shrinks failing modules."""

from __future__ import annotations

import pytest

from neuron_compile.artifact import VerifyFailure, verify
from neuron_compile.report.minimize import (
    Module,
    count_ops,
    executor_fails,
    minimize,
    verifier_fails_like,
)

SOFTMAX = """\
module @neuron_graph {
  func.func public @main(%arg0: tensor<3x4xf32>) -> (tensor<4xf32>, tensor<3x4xf32>) {
    %1 = "stablehlo.constant"() {value = dense<2.0> : tensor<3x4xf32>} : () -> tensor<3x4xf32>
    %2 = "stablehlo.multiply"(%arg0, %1) : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    %3 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %7 = "stablehlo.reduce"(%2, %3) ({
^bb0(%b4: tensor<f32>, %b5: tensor<f32>):
  %6 = "stablehlo.maximum"(%b4, %b5) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  "stablehlo.return"(%6) : (tensor<f32>) -> ()
}) {dimensions = array<i64: 0>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<4xf32>
    %m8:2 = "stablehlo.sort"(%2, %arg0) ({
^bb0(%b9: tensor<f32>, %b10: tensor<f32>, %b11: tensor<f32>, %b12: tensor<f32>):
  %13 = "stablehlo.compare"(%b9, %b10) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
  "stablehlo.return"(%13) : (tensor<i1>) -> ()
}) {dimension = 0 : i64} : (tensor<3x4xf32>, tensor<3x4xf32>) -> (tensor<3x4xf32>, tensor<3x4xf32>)
    %14 = "stablehlo.add"(%m8#1, %2) : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x4xf32>
    return %7, %14 : tensor<4xf32>, tensor<3x4xf32>
  }
}
"""


def _chain(n: int, bad_at: int) -> str:
    """``n`` unary ops; op ``bad_at`` adds operands of different shapes (a verifier error)."""
    lines = [
        "module @neuron_graph {",
        "  func.func public @main(%arg0: tensor<4xf32>, %arg1: tensor<2xf32>) -> (tensor<4xf32>) {",
    ]
    prev = "%arg0"
    for i in range(1, n + 1):
        if i == bad_at:
            lines.append(
                f'    %{i} = "stablehlo.add"({prev}, %arg1) : '
                "(tensor<4xf32>, tensor<2xf32>) -> tensor<4xf32>"
            )
        else:
            op = ("exponential", "negate", "abs", "tanh", "sine")[i % 5]
            lines.append(f'    %{i} = "stablehlo.{op}"({prev}) : (tensor<4xf32>) -> tensor<4xf32>')
        prev = f"%{i}"
    return "\n".join([*lines, f"    return {prev} : tensor<4xf32>", "  }", "}"])


def test_parse_and_rebuild_keep_regions_and_multi_results():
    verify(SOFTMAX)
    module = Module.parse(SOFTMAX)
    assert [op.name for op in module.ops] == [
        "stablehlo.constant",
        "stablehlo.multiply",
        "stablehlo.constant",
        "stablehlo.reduce",
        "stablehlo.sort",
        "stablehlo.add",
    ]
    assert module.ops[4].results == ["%m8#0", "%m8#1"] and module.ops[3].uses == ["%2", "%3"]
    verify(module.build(range(6)))
    # dropping the sort makes its second result an argument named %m8_1
    small = module.build([5])
    assert "%m8_1: tensor<3x4xf32>" in small and count_ops(small) == 1
    verify(small)


def test_minimizer_shrinks_a_200_op_verifier_failure_to_the_culprit():
    text = _chain(200, bad_at=137)
    assert count_ops(text) == 200
    with pytest.raises(VerifyFailure) as err:
        verify(text)
    small = minimize(text, verifier_fails_like(err.value.message))
    assert count_ops(small) <= 10
    assert count_ops(small) == 1 and '"stablehlo.add"' in small
    with pytest.raises(VerifyFailure) as again:
        verify(small)
    assert again.value.message == err.value.message


def test_minimizer_rejects_a_module_that_does_not_fail():
    with pytest.raises(ValueError, match="does not fail"):
        minimize(SOFTMAX, verifier_fails_like())
    assert not executor_fails(SOFTMAX)
