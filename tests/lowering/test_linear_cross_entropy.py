"""Chunked ``F.linear_cross_entropy`` (custom ops lowered through PyTorch's implementation)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

from tests.helpers import lower_to_text


def _loss(reduction: str, chunk: int):
    options = LinearCrossEntropyOptions(batch_chunk_size=chunk, allow_retain_graph=True)

    def fn(x, w, b, t):
        return F.linear_cross_entropy(
            x, w, t, linear_bias=b, reduction=reduction, ignore_index=1, options=options
        )

    return fn


@pytest.mark.parametrize(
    "reduction, dtype",
    [("mean", torch.float32), ("none", torch.float32), ("sum", torch.bfloat16)],
)
def test_chunked_loss_and_grads_match_eager_without_fallback(reduction, dtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 8, dtype=dtype), torch.randn(5, 8, dtype=dtype), torch.randn(5)
    b = b.to(dtype)
    t = torch.tensor([0, 1, 4, 2, 1, 3])  # two rows ignored (ignore_index=1)
    fn = _loss(reduction, chunk=4)  # a full chunk and a partial one
    leaves = [v.clone().requires_grad_() for v in (x, w, b)]
    eager_leaves = [v.clone().requires_grad_() for v in (x, w, b)]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", fullgraph=True, options={"fallback": "error"})
    out, expected = compiled(*leaves, t), fn(*eager_leaves, t)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out, expected, **tol)
    cot = torch.randn(expected.shape).to(dtype)
    for g, e in zip(
        torch.autograd.grad(out, leaves, cot),
        torch.autograd.grad(expected, eager_leaves, cot),
        strict=True,
    ):
        torch.testing.assert_close(g, e, **tol)


def test_chunk_loop_is_unrolled_into_one_matmul_per_chunk():
    x, w, b, t = (
        torch.randn(6, 8),
        torch.randn(5, 8),
        torch.randn(5),
        torch.tensor([0, 1, 4, 2, 1, 3]),
    )
    text = lower_to_text(_loss("none", chunk=2), x, w, b, t)
    assert "custom_call" not in text
    # three chunks of two rows: one (2x8)·(8x5) logits product each
    assert text.count("-> tensor<2x5xf32>") >= 3, text
