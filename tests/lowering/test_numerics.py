"""Per-op numerics: every OP_CASES entry through lowering + XLA CPU vs eager PyTorch."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_close_tree, run_lowered
from tests.lowering.cases import OP_CASES, TOLERANCE

PARAMS = [
    pytest.param(
        case, dtype, id=case_id, marks=[pytest.mark.xfail(reason=case.xfail)] if case.xfail else []
    )
    for case in OP_CASES
    for dtype, case_id in zip(case.dtypes, case.ids(), strict=True)
]


@pytest.mark.parametrize(("case", "dtype"), PARAMS)
def test_op_matches_eager(case, dtype):
    torch.manual_seed(0)
    inputs = case.inputs(dtype)
    expected = case.fn(*inputs)
    (actual,) = run_lowered(case.fn, *inputs)
    rtol, atol = TOLERANCE.get(expected.dtype, (0, 0))
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if expected.dtype.is_floating_point:
        assert_close_tree(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert torch.equal(actual, expected)
