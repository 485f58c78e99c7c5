"""Per-op numerics: every OP_CASES entry through lowering + XLA CPU vs eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

from tests.helpers import assert_close_tree, run_lowered
from tests.lowering.cases import OP_CASES, TOLERANCE

# torch warns once that index_reduce is a beta API; the index-reduce case calls it on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")

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
    expected = pytree.tree_leaves(expected)  # tuple / list / nested outputs, flattened
    outputs = pytree.tree_leaves(run_lowered(case.fn, *inputs))
    assert len(outputs) == len(expected)
    for i, (actual, want) in enumerate(zip(outputs, expected, strict=True)):
        assert actual.dtype == want.dtype, f"output {i}"
        assert actual.shape == want.shape, f"output {i}"
        if want.dtype.is_floating_point:
            rtol, atol = (case.tol or {}).get(dtype) or TOLERANCE.get(want.dtype, (0, 0))
            assert_close_tree(actual, want, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert torch.equal(actual, want), f"output {i}: {actual} != {want}"
