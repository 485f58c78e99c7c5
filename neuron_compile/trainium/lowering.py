"""The trn lowering forms: ops standing for neuronx-cc kernels become their custom calls.

Each op has two rules. Its reference rule (the default registry key) is what XLA CPU runs: the
cpu target, and the CPU stand-in of a trn graph. Its kernel form (registry key ``trn``, looked
up first for trn targets) is what neuronx-cc receives. See ``kernels/fused.py`` for the ops and
the operand convention, ``kernels/flash_attention.py`` for the flash kernels.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import numpy as np
import torch

from ..lowering.context import LoweringContext
from ..lowering.emit import TensorType, Value
from ..lowering.reference import lower_reference
from ..lowering.registry import lowering
from ..lowering.rules import FLOATS, dtypes_in
from ..lowering.stablehlo.decomposed import lower_decomposed
from ..warn_once import first_time, once_set
from . import TRN_KEY
from . import lowering_conv as _conv  # noqa: F401 - registers the trn forms of convolution
from . import lowering_shifts as _shifts  # noqa: F401 - registers the trn forms of shifts
from . import lowering_windows as _windows  # noqa: F401 - registers the trn forms of windows
from .kernels.flash_attention import (
    FLASH_DTYPES,
    FLASH_KERNELS,
    attention_backward_reference,
    attention_reference,
)
from .kernels.fused import NEURON_CALLS, NeuronCall
from .kernels.nki import KernelSpecialisationError, emit_kernel_call, load_nki, warn_fallback

log = logging.getLogger(__name__)


def _bind(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


def _reference_rule(op: Any, call: NeuronCall):
    def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
        return lower_reference(ctx, call.reference, *args, **kwargs)

    rule.__name__ = rule.__qualname__ = f"lower_{op.name().split('::')[-1]}_reference"
    return rule


def _kernel_rule(op: Any, call: NeuronCall):
    def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
        bound = _bind(op, args, kwargs)
        out = ctx.out_type()
        operands: list[Value] = []
        for name, value in bound.items():
            if isinstance(value, Value):
                operands.append(value)
            elif name == "weight" and value is None:  # RMSNorm without a scale: a ones weight
                operands.append(ctx.emit.full(1, out.shape[-1:], out.dtype))
        for name in call.scalars:
            if name == "dim":
                dim = bound.get("dim", -1)
                operands.append(ctx.emit.scalar(dim % out.rank, torch.int32))
            else:
                operands.append(ctx.emit.scalar(float(bound[name]), torch.float32))
        target = call.target(**{k: v for k, v in bound.items() if not isinstance(v, Value)})
        return ctx.custom_call(target, operands, [out])[0]

    rule.__name__ = rule.__qualname__ = f"lower_{op.name().split('::')[-1]}"
    return rule


#: ATen ops kept whole for trn targets (``TrainiumTarget.kept_ops``): the trn pattern pass turns
#: them into neuronx-cc's kernel calls (``kernels/fused.py``); where it does not, their reference
#: rules lower PyTorch's own decomposition (silu has a direct rule of its own).
KEPT_OPS = (
    torch.ops.aten.silu.default,
    torch.ops.aten.silu_backward.default,
    torch.ops.aten.gelu_backward.default,
    torch.ops.aten._softmax_backward_data.default,
)
for _op in KEPT_OPS[1:]:
    lower_decomposed(_op)

for _op, _call in NEURON_CALLS.items():
    lowering(_op, supports=dtypes_in(*FLOATS))(_reference_rule(_op, _call))
    lowering(_op, key=TRN_KEY, supports=dtypes_in(*FLOATS))(_kernel_rule(_op, _call))


# ---- flash attention ----------------------------------------------------------------------
# XLA CPU (the cpu target, and the stand-in of a trn graph) always runs the references. In the
# module for neuronx-cc the ops become the NKI flash kernels (kernels/flash_attention.py has the
# documented interface and its sources), with the layout changes as plain StableHLO around each
# call; without the NKI toolchain, or for shapes outside the kernels' documented limits, the
# references again.
_FLASH_OP = "neuron_compile::flash_attention"
_FLASH_BWD_OP = "neuron_compile::flash_attention_backward"
#: kv tile sizes ``flash_fwd`` accepts (``FlashConfig.seq_tile_size``: default 2048, at least
#: 512, and seq_k must be a multiple of it), largest first
_SEQ_TILE_SIZES = (2048, 1024, 512)
_PMAX = 128  # nl.tile_size.pmax: the partition count the lse layout is tiled by
_SKIPPED: set[tuple[str, str]] = once_set()  # (op, reason) already logged


def _flash_kernel(op_name: str, spec: str) -> Any:
    """The kernel ``spec`` ("module:attr"), or None after one ``NkiFallbackWarning``."""
    if load_nki() is None:
        warn_fallback(op_name, "the nki package is not installed")
        return None
    module_name, attr = spec.split(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # ImportError, or a toolchain without this kernel
        warn_fallback(op_name, f"{spec} cannot be loaded ({type(e).__name__}: {e})")
        return None


def _skip(op_name: str, why: str) -> None:
    if first_time(_SKIPPED, (op_name, why)):
        log.info("%s keeps its reference decomposition on trn: %s", op_name, why)


def _launch_grid(batch: int, heads: int, lnc: int | None) -> tuple[Any, ...]:
    """``[batch, heads]``; with LNC 2 the head axis is sharded over both physical cores as
    ``nl.nc(2) * (heads // 2)`` when it splits evenly (neuronx-distributed
    ``kernels/flash_attn.py``, axlearn ``flash_attention/neuron_attention.py``)."""
    if lnc and lnc > 1 and heads % lnc == 0:
        language = importlib.import_module("neuronxcc.nki.language")
        return (batch, language.nc(lnc) * (heads // lnc))
    return (batch, heads)


def _flash_unsupported(q: Value, k: Value, v: Value) -> str | None:
    """Why the kernels' documented limits exclude these shapes (None: they do not)."""
    if q.dtype not in FLASH_DTYPES:  # routing already keeps others on the math path
        return f"dtype {q.dtype} (the binding covers float32 and bfloat16)"
    if not (q.dtype == k.dtype == v.dtype):
        return "q, k and v differ in dtype (the kernels assume one IO dtype)"
    if q.shape[-1] != v.shape[-1] or q.shape[-1] > _PMAX:
        return f"head dims {q.shape[-1]}/{v.shape[-1]} (need equal and <= {_PMAX})"
    if q.shape[-2] % _PMAX or k.shape[-2] % _PMAX:
        return f"sequence lengths {q.shape[-2]}/{k.shape[-2]} not multiples of {_PMAX}"
    return None


def _seed(ctx: LoweringContext) -> Value:
    # The kernels take a (1,) int32 dropout seed; with dropout_p == 0 it is never read.
    return ctx.emit.constant(np.array([1], dtype=np.int32), TensorType((1,), torch.int32))


def _to_kernel_lse(ctx: LoweringContext, lse: Value) -> Value:
    # (b, h, s) -> (b, h, 128, s // 128): row t * 128 + p of the sequence sits at [p, t].
    b, h, s = lse.shape
    tiles = ctx.emit.reshape(lse, (b, h, s // _PMAX, _PMAX))
    return ctx.emit.transpose(tiles, (0, 1, 3, 2))


def _from_kernel_lse(ctx: LoweringContext, lse: Value) -> Value:
    b, h, p, t = lse.shape
    return ctx.emit.reshape(ctx.emit.transpose(lse, (0, 1, 3, 2)), (b, h, p * t))


def _lower_flash_attention_reference(
    ctx: LoweringContext, q: Value, k: Value, v: Value, is_causal: bool, scale: float
) -> Any:
    return lower_reference(ctx, attention_reference, q, k, v, is_causal, scale)


def _lower_flash_attention_backward_reference(ctx: LoweringContext, *args: Any) -> Any:
    return lower_reference(ctx, attention_backward_reference, *args)


def _lower_flash_attention(
    ctx: LoweringContext, q: Value, k: Value, v: Value, is_causal: bool, scale: float
) -> Any:
    why = _flash_unsupported(q, k, v)
    tile = next((t for t in _SEQ_TILE_SIZES if k.shape[-2] % t == 0), None)
    if why is None and tile is None:
        why = f"seq_k {k.shape[-2]} is not a multiple of a kv tile size {_SEQ_TILE_SIZES}"
    kernel = _flash_kernel(_FLASH_OP, FLASH_KERNELS[0]) if why is None else None
    if kernel is None:
        if why is not None:
            _skip(_FLASH_OP, why)
        return lower_reference(ctx, attention_reference, q, k, v, is_causal, scale)
    b, h, sq, d = q.shape
    bound: dict[str, Any] = {
        "q": ctx.emit.transpose(q, (0, 1, 3, 2)),  # (b, h, d, seq_q)
        "k": ctx.emit.transpose(k, (0, 1, 3, 2)),  # (b, h, d, seq_k)
        "v": v,  # (b, h, seq_k, d): should_transpose_v=False
        "seed": _seed(ctx),
        "softmax_scale": float(scale),
        "use_causal_mask": bool(is_causal),
        # float32 inputs keep float32 matmuls; bfloat16 ones accumulate in float32. Either
        # way the lse comes back in float32, as the op's contract says.
        "mixed_precision": q.dtype != torch.float32,
        "dropout_p": 0.0,
    }
    out_type = TensorType((b, h, sq, d), q.dtype)
    lse_type = TensorType((b, h, _PMAX, sq // _PMAX), torch.float32)
    # NOTE: on a fallback here the adapters emitted above are dead code; XLA drops them.
    try:
        flash_config = importlib.import_module(FLASH_KERNELS[0].split(":")[0]).FlashConfig
        bound["config"] = flash_config(seq_tile_size=tile, training=True)
        grid = _launch_grid(b, h, ctx.module.lnc)
        out, lse = emit_kernel_call(ctx, _FLASH_OP, kernel, bound, [out_type, lse_type], grid=grid)
    except (ImportError, AttributeError, KernelSpecialisationError) as e:
        why = f"{FLASH_KERNELS[0]} could not be specialised ({getattr(e, 'reason', e)})"
        warn_fallback(_FLASH_OP, why)
        return lower_reference(ctx, attention_reference, q, k, v, is_causal, scale)
    return [out, _from_kernel_lse(ctx, lse)]


def _lower_flash_attention_backward(
    ctx: LoweringContext,
    dout: Value,
    q: Value,
    k: Value,
    v: Value,
    out: Value,
    lse: Value,
    is_causal: bool,
    scale: float,
) -> Any:
    args = (dout, q, k, v, out, lse, is_causal, scale)
    why = _flash_unsupported(q, k, v)
    if why is None and k.shape[-2] > 512 and k.shape[-2] % 512:
        # flash_attn_bwd tiles seq_k by 512 from 512 on (nki-samples attention.py)
        why = f"seq_k {k.shape[-2]} is above 512 but not a multiple of 512"
    kernel = _flash_kernel(_FLASH_BWD_OP, FLASH_KERNELS[1]) if why is None else None
    if kernel is None:
        if why is not None:
            _skip(_FLASH_BWD_OP, why)
        return lower_reference(ctx, attention_backward_reference, *args)

    def heads_dim_seq(x: Value) -> Value:  # (b, h, s, d) -> (b, h, d, s)
        return ctx.emit.transpose(x, (0, 1, 3, 2))

    b, h = q.shape[:2]
    bound = {
        "q_ref": heads_dim_seq(q),
        "k_ref": heads_dim_seq(k),
        "v_ref": heads_dim_seq(v),
        "o_ref": heads_dim_seq(out),
        "dy_ref": heads_dim_seq(dout),
        "lse_ref": _to_kernel_lse(ctx, lse),
        "seed_ref": _seed(ctx),
        "use_causal_mask": bool(is_causal),
        "mixed_precision": q.dtype != torch.float32,
        "dropout_p": 0.0,
        "softmax_scale": float(scale),
    }
    types = [bound[n].type for n in ("q_ref", "k_ref", "v_ref")]
    types = [t.with_dtype(q.dtype) for t in types]  # the kernel writes every grad in q's dtype
    try:
        grid = _launch_grid(b, h, ctx.module.lnc)
        grads = emit_kernel_call(ctx, _FLASH_BWD_OP, kernel, bound, types, grid=grid)
    except (ImportError, AttributeError, KernelSpecialisationError) as e:
        why = f"{FLASH_KERNELS[1]} could not be specialised ({getattr(e, 'reason', e)})"
        warn_fallback(_FLASH_BWD_OP, why)
        return lower_reference(ctx, attention_backward_reference, *args)
    return [heads_dim_seq(g) for g in grads]


_FLASH_FORMS = {
    torch.ops.neuron_compile.flash_attention.default: (
        _lower_flash_attention_reference,
        _lower_flash_attention,
    ),
    torch.ops.neuron_compile.flash_attention_backward.default: (
        _lower_flash_attention_backward_reference,
        _lower_flash_attention_backward,
    ),
}
for _op, (_reference, _kernel) in _FLASH_FORMS.items():
    lowering(_op, supports=dtypes_in(*FLOATS))(_reference)
    lowering(_op, key=TRN_KEY, supports=dtypes_in(*FLOATS))(_kernel)
