"""Scaled dot-product attention as eager's CPU flash kernel computes it, forward and backward.

``F.scaled_dot_product_attention`` on CPU dispatches to ``_scaled_dot_product_flash_attention_for_cpu``
whenever the flash kernel applies (no dropout, 4-D inputs): we lower that op and its backward
whole, so the graph carries eager's own results (the output and the float32 row log-sum-exp it
saves) and eager's layouts (its grads come back (B, L, H, D)-contiguous when the inputs are). The
math path, which eager takes otherwise (dropout), decomposes into ops lowered elsewhere.

Numerics follow the kernel: scores ``q @ k^T * scale + mask`` in float32, softmax normalized at
the end (``exp(s - max) @ v / sum``), one rounding to the input dtype. A fully masked row gives
eager's zeros and a log-sum-exp of 0, which keeps its backward at 0 instead of NaN.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..context import LoweringContext
from ..reference import lower_reference
from ..registry import lowering
from ..rules import all_of, arg, floats

aten = torch.ops.aten


def _expand_heads(t: Tensor, heads: int) -> Tensor:
    """Grouped-query attention: each k/v head serves ``heads // t.shape[1]`` query heads."""
    groups = heads // t.shape[1]
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def attention_scores(
    q: Tensor,
    k: Tensor,
    is_causal: bool,
    scale: float | None = None,
    attn_mask: Tensor | None = None,
) -> Tensor:
    """``q @ k^T * scale`` (default ``1 / sqrt(head dim)``) in float32, then the causal mask
    (top-left aligned, as ``is_causal``) and the additive or boolean ``attn_mask``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = _expand_heads(k, q.shape[1]) if q.dim() == 4 else k
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = s + attn_mask.float()
    return s


def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool,
    scale: float | None = None,
    attn_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: the attention output in ``q``'s dtype and the float32 row log-sum-exp."""
    s = attention_scores(q, k, is_causal, scale, attn_mask)
    row_max = s.amax(dim=-1, keepdim=True)
    masked_row = row_max == float("-inf")
    row_max = torch.where(masked_row, torch.zeros_like(row_max), row_max)
    e = torch.exp(s - row_max)
    total = e.sum(dim=-1, keepdim=True)
    v = _expand_heads(v, q.shape[1]) if q.dim() == 4 else v
    out = torch.where(masked_row, torch.zeros_like(total), (e @ v.float()) / total)
    lse = torch.where(masked_row, torch.zeros_like(total), row_max + torch.log(total))
    return out.to(q.dtype), lse.squeeze(-1)


def _sum_groups(grad: Tensor, like: Tensor) -> Tensor:
    """The transpose of ``_expand_heads``: a k/v head's grad sums over the heads it served."""
    b, heads, *rest = grad.shape
    groups = heads // like.shape[1]
    return grad if groups == 1 else grad.reshape(b, like.shape[1], groups, *rest).sum(dim=2)


def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool,
    scale: float | None = None,
    attn_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` from the saved ``out`` and ``lse`` (FlashAttention-2's backward)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    p = torch.exp(attention_scores(q, k, is_causal, scale, attn_mask) - lse.float().unsqueeze(-1))
    do = dout.float()
    grouped = q.dim() == 4
    kf = (_expand_heads(k, q.shape[1]) if grouped else k).float()
    vf = (_expand_heads(v, q.shape[1]) if grouped else v).float()
    dv = p.transpose(-2, -1) @ do
    dp = do @ vf.transpose(-2, -1)
    delta = (do * out.float()).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    dq = (ds @ kf) * scale
    dk = (ds.transpose(-2, -1) @ q.float()) * scale
    if grouped:
        dk, dv = _sum_groups(dk, k), _sum_groups(dv, v)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _no_dropout(node: Any) -> str | None:
    """Eager's CPU flash kernel runs only without dropout; so do we (a dropout draws from eager's
    generator, which no compiled graph reproduces)."""
    backward = node.target is aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    dropout_p = arg(node, 6 if backward else 3, "dropout_p", 0.0)
    return None if dropout_p == 0.0 else f"dropout_p={dropout_p} (eager's kernel requires 0)"


def flash_attention_for_cpu(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The reference of ``aten._scaled_dot_product_flash_attention_for_cpu`` (its signature)."""
    return attention_forward(q, k, v, is_causal, scale, attn_mask)


def flash_attention_for_cpu_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The reference of ``aten._scaled_dot_product_flash_attention_for_cpu_backward``."""
    return attention_backward(dout, q, k, v, out, lse, is_causal, scale, attn_mask)


_SUPPORTED = all_of(floats, _no_dropout)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default, supports=_SUPPORTED)
def _lower_flash_attention_for_cpu(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    return lower_reference(ctx, flash_attention_for_cpu, *args, **kwargs)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, supports=_SUPPORTED)
def _lower_flash_attention_for_cpu_backward(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    return lower_reference(ctx, flash_attention_for_cpu_backward, *args, **kwargs)
