"""SDPA through eager's CPU flash op (lowering/stablehlo/attention.py): values, grads and grad
layouts as eager's, with masks (fully masked rows included), grouped-query attention, a scale and
bf16, on the real XLA CPU executor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

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
