"""SDPA through eager's CPU flash op (lowering/stablehlo/attention.py): values, grads and grad
layouts as eager's, with masks (fully masked rows included), grouped-query attention, a scale and
bf16, on the real XLA CPU executor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.compiler import DowncastWarning
from tests.helpers import assert_close_tree

B, H, L, S, D = 2, 4, 6, 5, 8


def _mask(kind: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    keep = torch.rand(L, S, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[2] = False  # a fully masked row: eager's kernel gives zeros and a log-sum-exp of 0
    if kind == "bool":
        return keep
    return torch.zeros(L, S).masked_fill(~keep, float("-inf"))


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "float mask": dict(attn_mask="float"),
    "bool mask": dict(attn_mask="bool"),
    "scale": dict(scale=0.3),
    "gqa": dict(enable_gqa=True, kv_heads=2),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_matches_eager_with_eagers_grad_layout(case, dtype):
    kw = dict(CASES[case])
    kv_heads = kw.pop("kv_heads", H)
    if "attn_mask" in kw:
        kw["attn_mask"] = _mask(kw["attn_mask"])
    g = torch.Generator().manual_seed(0)
    # q as a transposed (B, L, H, D) projection, as attention layers produce it
    q = torch.randn(B, L, H, D, generator=g).transpose(1, 2).to(dtype)
    k, v = (torch.randn(B, kv_heads, S, D, generator=g).to(dtype) for _ in range(2))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kw)

    def run(fn):
        ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = fn(*ins)
        grads = torch.autograd.grad(out, ins, torch.ones_like(out))
        return out, grads

    torch._dynamo.reset()
    compiled = torch.compile(attend, backend="neuron", options={"fallback": "error"})
    (out, grads), (e_out, e_grads) = run(compiled), run(attend)
    tol = {} if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert_close_tree((out, grads), (e_out, e_grads), **tol)
    assert out.stride() == e_out.stride()
    assert [t.stride() for t in grads] == [t.stride() for t in e_grads]
    if kw.get("attn_mask") is not None:
        assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))


@pytest.mark.parametrize("case", ["plain", "causal", "gqa"])
def test_float64_sdpa_backward_runs_in_float32_as_the_64_bit_policy_says(case):
    """Eager's flash op saves a float64 log-sum-exp for float64 inputs; the backward's reference
    mixed it into float32 products and failed to trace (NC102)."""
    kw = dict(CASES[case])
    kv_heads = kw.pop("kv_heads", H)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, kv_heads, S, D, generator=g, dtype=torch.float64) for _ in range(2))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kw)

    def run(fn):
        ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = fn(*ins)
        return out, torch.autograd.grad(out, ins, torch.ones_like(out))

    torch._dynamo.reset()
    with pytest.warns(DowncastWarning):
        out, grads = run(torch.compile(attend, backend="neuron"))
    e_out, e_grads = run(attend)
    assert out.dtype == torch.float64 and all(t.dtype == torch.float64 for t in grads)
    assert_close_tree((out, grads), (e_out, e_grads), atol=1e-5, rtol=1e-5)
