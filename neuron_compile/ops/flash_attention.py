"""Scaled dot-product attention as one flash-attention op (forward and backward) for trn targets.

On the CPU target SDPA is traced through its math path (``bmm`` + ``_softmax``). For trn targets,
calls whose shapes qualify (TorchNeuron's rule: query and key lengths multiples of 128, head dim
<= 128, no mask, no dropout, no GQA; torchneuron.md §2 item 10) are routed, before AOTAutograd,
to ``neuron_compile::flash_attention``: one node in the forward graph and one
``flash_attention_backward`` node in the backward graph. On a device those lower to the NKI flash
kernels; wherever XLA CPU runs the graph they lower to the references below, written the way the
kernels compute (scores in float32, the row log-sum-exp saved for the backward).
"""

from __future__ import annotations

import logging
import math
import operator
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor

log = logging.getLogger(__name__)

#: Kernels neuronx-cc bundles (NKI samples ``flash_fwd`` / ``flash_attn_bwd``); see nki.py.
FLASH_KERNELS = (
    "neuronxcc.nki.kernels.attention:flash_fwd",
    "neuronxcc.nki.kernels.attention:flash_attn_bwd",
)
SEQ_MULTIPLE = 128
MAX_HEAD_DIM = 128


def _scores(q: Tensor, k: Tensor, is_causal: bool, scale: float) -> Tensor:
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:  # top-left aligned, as F.scaled_dot_product_attention's is_causal
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: attention output in ``q``'s dtype and the float32 row log-sum-exp."""
    s = _scores(q, k, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.exp(s - lse.unsqueeze(-1)) @ v.float()
    return out.to(q.dtype), lse


def attention_backward_reference(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` from the saved ``out`` and ``lse`` (FlashAttention-2's backward)."""
    p = torch.exp(_scores(q, k, is_causal, scale) - lse.unsqueeze(-1))
    do = dout.float()
    dv = p.transpose(-2, -1) @ do
    dp = do @ v.float().transpose(-2, -1)
    delta = (do * out.float()).sum(-1, keepdim=True)
    ds = p * (dp - delta)
    dq = (ds @ k.float()) * scale
    dk = (ds.transpose(-2, -1) @ q.float()) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@torch.library.custom_op("neuron_compile::flash_attention", mutates_args=())
def flash_attention(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    return attention_reference(q, k, v, is_causal, scale)


@flash_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("neuron_compile::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    return attention_backward_reference(dout, q, k, v, out, lse, is_causal, scale)


@flash_attention_backward.register_fake
def _(dout, q, k, v, out, lse, is_causal, scale):  # noqa: ANN001, ANN202 - mirrors the op
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, ctx.is_causal, ctx.scale = inputs
    ctx.save_for_backward(q, k, v, *output)


def _backward(ctx: Any, dout: Tensor, _dlse: Tensor) -> tuple[Any, ...]:
    # lse is an internal output (route_sdpa only hands ``out`` to the model): no gradient flows in.
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None


flash_attention.register_autograd(_backward, setup_context=_setup_context)


# ---- routing SDPA calls in Dynamo graphs -----------------------------------------------------
def _sdpa_arguments(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> dict[str, Any]:
    return dict(locals())


def flash_unqualified(args: dict[str, Any]) -> str | None:
    """Why this SDPA call cannot use the flash kernel, or None if it can."""
    vals = [getattr(args[n], "meta", {}).get("example_value") for n in ("query", "key", "value")]
    if not all(isinstance(t, Tensor) for t in vals):
        return "query/key/value shapes unknown"
    q, k, v = vals
    if args["attn_mask"] is not None:
        return "an explicit attn_mask"
    if args["dropout_p"] != 0.0:
        return "dropout"
    if args["enable_gqa"] or q.dim() != 4 or not (q.shape[1] == k.shape[1] == v.shape[1]):
        return "not [batch, heads, seq, dim] with equal heads"
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}"
    if q.shape[-2] % SEQ_MULTIPLE or k.shape[-2] % SEQ_MULTIPLE:
        return f"sequence lengths {q.shape[-2]}/{k.shape[-2]} not multiples of {SEQ_MULTIPLE}"
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return f"head dim > {MAX_HEAD_DIM}"
    return None


def route_sdpa(gm: fx.GraphModule) -> int:
    """Replace qualifying SDPA calls in a Dynamo graph by ``flash_attention``; return how many."""
    sdpa_targets = {torch._C._nn.scaled_dot_product_attention}
    routed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in sdpa_targets:
            continue
        args = _sdpa_arguments(*node.args, **node.kwargs)
        why = flash_unqualified(args)
        if why is not None:
            log.debug("SDPA %s stays on the math path: %s", node.name, why)
            continue
        q = args["query"].meta["example_value"]
        scale = args["scale"] if args["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
        with gm.graph.inserting_after(node):
            call = gm.graph.call_function(
                torch.ops.neuron_compile.flash_attention.default,
                (args["query"], args["key"], args["value"], bool(args["is_causal"]), float(scale)),
            )
        with gm.graph.inserting_after(call):
            out = gm.graph.call_function(operator.getitem, (call, 0))
        out.meta.update(node.meta)
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        routed += 1
    if routed:
        gm.recompile()
        log.info("routed %d SDPA call(s) to the flash-attention kernel", routed)
    return routed
