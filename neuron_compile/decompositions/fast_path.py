"""Decompositions of the fused inference ops ``torch.nn`` calls on its "fast path".

In eval mode under ``torch.no_grad()``/``inference_mode()``, ``nn.TransformerEncoderLayer`` and
``nn.MultiheadAttention`` call one fused ATen op each (``_transformer_encoder_layer_fwd``,
``_native_multi_head_attention``) instead of their Python code. Core ATen keeps both whole and
PyTorch ships no decomposition, so without these a served transformer encoder would run every
layer eagerly on the CPU. Each function below computes what the native CPU kernel computes
(``aten/src/ATen/native/transformers/{transformer,attention}.cpp``), in ops the lowering covers:

- the mask (any dtype) means "masked out" where it is nonzero, as the kernel converts it to
  bool; ``mask_type`` 0 is a (L, S) attention mask, 1 a (B, S) key-padding mask, 2 a mask of the
  scores' own shape (B, H, L, S);
- a row whose keys are all masked is NaN, as in the kernel's ``_masked_softmax`` (and the
  Python path's SDPA);
- the query is scaled by 1/sqrt(head dim) before ``q @ k^T``; the FFN's GELU is the exact one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

aten = torch.ops.aten


def _masked_softmax(scores: Tensor, mask: Tensor | None, mask_type: int | None) -> Tensor:
    if mask is None:
        return torch.softmax(scores, dim=-1)
    masked = mask.bool() if mask.dtype != torch.bool else mask
    if mask_type == 1:  # key padding (B, S)
        masked = masked.view(masked.shape[0], 1, 1, masked.shape[-1])
    return torch.softmax(scores.masked_fill(masked.expand(scores.shape), float("-inf")), dim=-1)


def native_multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor,
    mask: Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``aten._native_multi_head_attention``: batch-first (B, L, E) query, (B, S, E) key/value."""
    w_q, w_k, w_v = qkv_weight.chunk(3)
    b_q, b_k, b_v = qkv_bias.chunk(3)
    head_dim = embed_dim // num_head

    def heads(x: Tensor, w: Tensor, b: Tensor) -> Tensor:  # (B, T, E) -> (B, H, T, D)
        return F.linear(x, w, b).view(x.shape[0], x.shape[1], num_head, head_dim).transpose(1, 2)

    q = heads(query, w_q, b_q) / math.sqrt(head_dim)
    k, v = heads(key, w_k, b_k), heads(value, w_v, b_v)
    probs = _masked_softmax(q @ k.transpose(-2, -1), mask, mask_type)
    attn = (probs @ v).transpose(1, 2).reshape(query.shape[0], query.shape[1], embed_dim)
    out = F.linear(attn, proj_weight, proj_bias)
    if not need_weights:
        return out, out.new_empty(0)
    return out, probs.mean(dim=1) if average_attn_weights else probs


def transformer_encoder_layer_fwd(
    src: Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: Tensor,
    qkv_bias: Tensor,
    proj_weight: Tensor,
    proj_bias: Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: Tensor,
    norm_bias_1: Tensor,
    norm_weight_2: Tensor,
    norm_bias_2: Tensor,
    ffn_weight_1: Tensor,
    ffn_bias_1: Tensor,
    ffn_weight_2: Tensor,
    ffn_bias_2: Tensor,
    mask: Tensor | None = None,
    mask_type: int | None = None,
) -> Tensor:
    """``aten._transformer_encoder_layer_fwd``: one ``nn.TransformerEncoderLayer`` (ReLU or
    exact GELU, pre- or post-norm), batch first."""

    def norm(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x, _ = native_multi_head_attention(
        x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
        mask, False, True, mask_type,
    )  # fmt: skip
    x = x + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


#: Added to the decomposition table of every target (capture.decomposition_table).
FAST_PATH_DECOMPOSITIONS = {
    aten._native_multi_head_attention.default: native_multi_head_attention,
    aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
}
