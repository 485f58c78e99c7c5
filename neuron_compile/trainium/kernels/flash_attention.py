"""Scaled dot-product attention as one flash-attention op (forward and backward) for trn targets.

On the CPU target SDPA is traced through its math path (``bmm`` + ``_softmax``). For trn targets,
calls whose shapes qualify (TorchNeuron's rule: query and key lengths multiples of 128, head dim
<= 128, no mask, no dropout, no GQA; docs/trainium-reference.md §R10) and whose dtype the kernels'
binding covers (float32, bfloat16) are routed, before AOTAutograd, to
``neuron_compile::flash_attention``: one node in the forward graph and one
``flash_attention_backward`` node in the backward graph. Wherever XLA CPU runs the graph they
lower to the references below, written the way the kernels compute (scores in float32, the row
log-sum-exp saved for the backward). In the module for neuronx-cc they lower to the NKI flash
kernels of :data:`FLASH_KERNELS` (``trainium/lowering.py``, through
``nki.emit_kernel_call``), with the layout changes as plain StableHLO around each call; without
the NKI toolchain (one ``NkiFallbackWarning`` per op) or outside the kernels' limits (logged),
the references again.

The kernels' interface, as documented (SDK API pages ``nki.kernels.flash_fwd`` /
``nki.kernels.flash_attn_bwd``, https://awsdocs-neuron.readthedocs-hosted.com/en/v2.21.0.beta/
general/nki/api/generated/nki.kernels.flash_fwd.html and .../en/latest/general/nki/api/generated/
nki.kernels.flash_attn_bwd.html; source ``aws-neuron/nki-samples``
``src/nki_samples/reference/attention.py`` @2844505b):

- ``flash_fwd[b, h](q, k, v, seed, logit_bias=None, softmax_scale=None, use_causal_mask=True,
  mixed_precision=True, dropout_p=0.0, config=None)``: q (b, h, d, seq_q), k (b, h, d, seq_k),
  v (b, h, seq_k, d) (``FlashConfig.should_transpose_v=False``), seed (1,) int32, d <= 128.
  With ``FlashConfig.training`` it returns o (b, h, seq_q, d) and the log-sum-exp of the scaled
  scores as lse (b, h, 128, seq_q // 128), row ``t * 128 + p`` at ``[p, t]``, float32 when
  ``mixed_precision`` (else the input dtype). ``FlashConfig``: ``seq_tile_size`` (default 2048;
  the source asserts >= 512 and seq_k a multiple of it), ``attn_core_tile_size``, ``training``,
  ``should_transpose_v``, ``lse_dtype``.
- ``flash_attn_bwd[b, h](q_ref, k_ref, v_ref, o_ref, dy_ref, lse_ref, seed_ref,
  logit_bias_ref=None, use_causal_mask=False, mixed_precision=False, dropout_p=0.0,
  softmax_scale=None)``: q, k, v, o, dy all (b, h, d, seq), lse as the forward returns it;
  returns dq, dk, dv as (b, h, d, seq) in q's dtype; sequences multiples of 128.
- Callers launch both on the grid ``[b, h]``, or ``[b, nl.nc(lnc) * (h // lnc)]`` to shard
  heads over an LNC-2 core, with ``seed = [1]`` (aws-neuron/neuronx-distributed
  ``src/neuronx_distributed/kernels/flash_attn.py`` @e8349455; apple/axlearn
  ``axlearn/common/flash_attention/neuron_attention.py`` @65e979f7).

Older SDK pages document an out-parameter form (``flash_fwd(q, k, v, seed, o, lse=None, ...)``,
``flash_attn_bwd(..., seed_ref, out_dq_ref, out_dk_ref, out_dv_ref, ...)``; aws-neuron-sdk
``general/nki/api/nki/kernels/__init__.py`` @907af9f8); the binding targets the returning form,
which is what functional kernels under the beta-3 toolchain need.
"""

from __future__ import annotations

import logging
import math
import operator
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ...lowering.stablehlo.attention import attention_backward, attention_forward

log = logging.getLogger(__name__)

#: Kernels neuronx-cc bundles (NKI samples ``flash_fwd`` / ``flash_attn_bwd``), bound on trn
#: targets by ``trainium/lowering.py``.
FLASH_KERNELS = (
    "neuronxcc.nki.kernels.attention:flash_fwd",
    "neuronxcc.nki.kernels.attention:flash_attn_bwd",
)
SEQ_MULTIPLE = 128
MAX_HEAD_DIM = 128
#: What the kernels' binding covers; SDPA in another dtype (float16) stays on the math path.
FLASH_DTYPES = (torch.float32, torch.bfloat16)


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: attention output in ``q``'s dtype and the float32 row log-sum-exp, as the
    core lowers eager's CPU flash op (``lowering/stablehlo/attention.py``)."""
    return attention_forward(q, k, v, is_causal, scale)


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
    return attention_backward(dout, q, k, v, out, lse, is_causal, scale)


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


def _example(value: Any) -> Any:
    """A tensor argument as a tensor: itself when tracing runs on tensors, its example value when
    it is a Dynamo graph node."""
    return value if isinstance(value, Tensor) else getattr(value, "meta", {}).get("example_value")


def flash_unqualified(args: dict[str, Any]) -> str | None:
    """Why this SDPA call cannot use the flash kernel, or None if it can. ``args``: the call's
    arguments by name (``_sdpa_arguments``), tensors or Dynamo graph nodes."""
    vals = [_example(args[n]) for n in ("query", "key", "value")]
    if not all(isinstance(t, Tensor) for t in vals):
        return "query/key/value shapes unknown"
    q, k, v = vals
    if args["attn_mask"] is not None:
        return "an explicit attn_mask"
    if args["dropout_p"] != 0.0:
        return "dropout"
    if args["enable_gqa"] or q.dim() != 4 or not (q.shape[1] == k.shape[1] == v.shape[1]):
        return "not [batch, heads, seq, dim] with equal heads"
    if q.dtype not in FLASH_DTYPES:
        return f"dtype {q.dtype} (the flash kernels' binding covers float32 and bfloat16)"
    if q.shape[-2] % SEQ_MULTIPLE or k.shape[-2] % SEQ_MULTIPLE:
        return f"sequence lengths {q.shape[-2]}/{k.shape[-2]} not multiples of {SEQ_MULTIPLE}"
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        return f"head dim > {MAX_HEAD_DIM}"
    return None


def _flash_arguments(name: str, args: Any, kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """``flash_attention``'s arguments for an SDPA call, or None if the call stays on the math
    path (logged with the reason)."""
    sdpa = _sdpa_arguments(*args, **kwargs)
    why = flash_unqualified(sdpa)
    if why is not None:
        log.debug("SDPA %s stays on the math path: %s", name, why)
        return None
    scale = sdpa["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(_example(sdpa["query"]).shape[-1])
    return sdpa["query"], sdpa["key"], sdpa["value"], bool(sdpa["is_causal"]), float(scale)


class RoutingSdpa(TorchFunctionMode):
    """``route_sdpa`` while tracing Python code rather than on a Dynamo graph (``make_fx`` in
    ``bucket_planner``): qualifying ``F.scaled_dot_product_attention`` calls run as
    ``flash_attention``, so a trace for a trn target has the ops the backend would compile."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch._C._nn.scaled_dot_product_attention:
            call = _flash_arguments("call", args, kwargs)
            if call is not None:
                return torch.ops.neuron_compile.flash_attention.default(*call)[0]
        return func(*args, **kwargs)


def route_sdpa(gm: fx.GraphModule) -> int:
    """Replace qualifying SDPA calls in a Dynamo graph by ``flash_attention``; return how many."""
    sdpa_targets = {torch._C._nn.scaled_dot_product_attention}
    routed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in sdpa_targets:
            continue
        call_args = _flash_arguments(node.name, node.args, node.kwargs)
        if call_args is None:
            continue
        with gm.graph.inserting_after(node):
            call = gm.graph.call_function(
                torch.ops.neuron_compile.flash_attention.default, call_args
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
