"""``prims.*`` called directly, and two ATen entry points that reinterpret or expand data:
``aten.view.dtype`` and ``aten.repeat_interleave.Tensor`` with a static ``output_size``.

**prims.** PyTorch's primitives reach the backend undecomposed when user code (or a reference
such as ``renorm``'s, for ``prims.convert_element_type``) calls them. Each one lowers through its
PyTorch reference implementation (``lower_reference``): the ATen function ``torch._prims``
registers as the prim's own eager kernel (``impl_aten``), or a short ATen spelling of the prim's
definition where that kernel is written with in-place copies (``convert_element_type``,
``collapse``: the same values without the mutation) or takes a ``requires_grad`` flag the ATen
factory needs no more (``full``, ``full_like``, ``scalar_tensor``). The traced reference lowers
through the same rules as ATen, so the results are eager's. The support predicate rejects, with
the reason, a prim whose reference uses an op without a lowering, and one whose eager kernel
disagrees with the prim's own meta (the graph's types): ``prims.signbit`` (meta: the input dtype,
kernel: bool), ``prims.sum`` of an integer tensor (meta: its dtype, kernel ``torch.sum``: int64)
or over ``dims=[]`` (meta: no reduction, kernel: all dims); no answer could match both.
The prims whose results alias their input (``broadcast_in_dim``, ``squeeze``, ``transpose``,
``view_of``, ``collapse_view``, ``split_dim``) never arrive: AOTAutograd's functionalization
rejects non-ATen view ops before the backend sees the graph.

**view.dtype** (``x.view(torch.int32)``) is ``stablehlo.bitcast_convert``. Between itemsizes
the last dimension scales as in eager: a wide element becomes a trailing dimension of
narrow ones (little-endian order, as eager's CPU storage) that is folded into the last dimension,
and the reverse. 64-bit dtypes are rejected (the 64-bit policy holds float64/int64 as 32-bit
values, whose bits are not the 64-bit ones), as are views *to* bool from other dtypes (a byte
other than 0/1 is not a valid bool in eager); bool to int8/uint8 is a convert (bools are 0/1
bytes).

**repeat_interleave.Tensor** with ``output_size``: output ``j`` is the number of cumulative
repeat counts ``<= j`` (the index of the run ``j`` falls in). Without ``output_size`` the length is
data-dependent and the op stays eager. The comparison costs ``len(repeats) * output_size``
elements (a compare and a sum); the ``cumsum`` before it is
a whole-dim ``reduce_window`` (``scan.py``). ``output_size`` is trusted as PyTorch documents it (it
must equal ``repeats.sum()``; eager raises when it does not, and the compiled graph cannot check
data, so a wrong ``output_size`` gives ``len(repeats)`` past the end instead of an error; negative
repeats likewise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._prims as _prims
import torch.fx as fx

from ..context import LoweringContext, canonical_dtype
from ..emit import TensorType, Value
from ..reference import lower_reference, trace_reference
from ..registry import lookup, lowering
from ..rules import ALL_DTYPES

aten = torch.ops.aten
prims = torch.ops.prims


# ---- prims through their references ------------------------------------------------------------
def _convert_element_type(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # The prim's kernel is empty_like + copy_; _to_copy is the same cast without the mutation.
    return aten._to_copy.default(a, dtype=dtype)


def _collapse(a: torch.Tensor, start: int, end: int) -> torch.Tensor:
    # Dims start..end (inclusive, as the prim's meta defines it) become one.
    return a.reshape(*a.shape[:start], -1, *a.shape[end + 1 :]) if a.dim() else a.clone()


def _full(
    shape: Sequence[int], fill_value: Any, *, dtype: torch.dtype, device: Any, requires_grad: bool
) -> torch.Tensor:
    return torch.full(shape, fill_value, dtype=dtype, device=device)


def _full_like(
    a: torch.Tensor, fill_value: Any, *, dtype: torch.dtype, device: Any, requires_grad: bool
) -> torch.Tensor:
    return torch.full_like(a, fill_value, dtype=dtype, device=device)


def _scalar_tensor(s: Any, *, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
    return torch.scalar_tensor(s, dtype=dtype, device=device)


#: prim -> its reference. Elementwise prims take operands of one dtype and shape, so the ATen
#: function (the prim's registered eager kernel) computes exactly the prim.
_REFERENCES: dict[str, Callable[..., Any]] = {
    # unary elementwise
    "abs": torch.abs, "acos": torch.acos, "acosh": torch.acosh, "asin": torch.asin,
    "asinh": torch.asinh, "atan": torch.atan, "atanh": torch.atanh, "cos": torch.cos,
    "cosh": torch.cosh, "bessel_j0": torch.special.bessel_j0,
    "bessel_j1": torch.special.bessel_j1, "bessel_i0": torch.i0, "bessel_i0e": torch.special.i0e,
    "bessel_i1": torch.special.i1, "bessel_i1e": torch.special.i1e,
    "bitwise_not": torch.bitwise_not, "cbrt": _prims._cbrt_aten, "ceil": torch.ceil,
    "clone": torch.clone, "digamma": torch.digamma, "erf": torch.erf,
    "erf_inv": torch.special.erfinv, "erfc": torch.special.erfc, "erfcx": torch.special.erfcx,
    "exp": torch.exp, "expm1": torch.special.expm1, "exp2": torch.special.exp2,
    "fill": torch.fill, "floor": torch.floor, "isfinite": torch.isfinite, "lgamma": torch.lgamma,
    "log": torch.log, "log1p": torch.log1p, "log2": torch.log2, "log10": torch.log10,
    "reciprocal": torch.reciprocal, "ndtri": torch.special.ndtri, "neg": torch.neg,
    "round": torch.round, "rsqrt": torch.rsqrt, "sign": torch.sign, "signbit": torch.signbit,
    "sin": torch.sin, "sinh": torch.sinh, "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "sqrt": torch.sqrt, "tan": torch.tan, "tanh": torch.tanh, "trunc": torch.trunc,
    # binary elementwise
    "add": torch.add, "atan2": torch.atan2, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor, "div": _prims._div_aten,
    "eq": torch.eq, "fmax": torch.fmax, "fmin": torch.fmin, "fmod": torch.fmod, "gcd": torch.gcd,
    "ge": torch.ge, "gt": torch.gt, "hypot": torch.hypot, "igamma": torch.special.gammainc,
    "igammac": torch.special.gammaincc, "le": torch.le, "lt": torch.lt,
    "maximum": _prims._maximum_aten, "minimum": _prims._minimum_aten, "mul": torch.mul,
    "ne": torch.ne, "nextafter": torch.nextafter, "pow": torch.pow, "remainder": torch.remainder,
    "shift_left": torch.bitwise_left_shift, "shift_right_arithmetic": torch.bitwise_right_shift,
    "sub": torch.sub, "zeta": torch.special.zeta,
    # shapes, selection, casts, reductions, factories
    "collapse": _collapse, "cat": _prims._cat_aten, "reshape": _prims._reshape_aten,
    "rev": torch.flip, "where": torch.where, "convert_element_type": _convert_element_type,
    "sum": torch.sum, "prod": _prims._prod_aten, "amax": torch.amax, "amin": torch.amin,
    "var": _prims.torch_var, "iota": _prims._iota_aten, "full": _full,
    "full_like": _full_like, "scalar_tensor": _scalar_tensor,
}  # fmt: skip


def _reference_of(node: fx.Node) -> Callable[..., Any]:
    return _REFERENCES[node.target._schema.name.split("::")[1]]


def supports_reference(node: fx.Node) -> str | None:
    """Lowerable when the prim's reference traces and every op of the trace has a lowering."""
    if any(canonical_dtype(t.dtype) not in ALL_DTYPES for t in _tensors(node)):
        return "complex or other dtypes the lowering does not cover"
    try:
        sub = trace_reference(node, _reference_of(node))
    except Exception as e:  # the reference rejects these arguments (eager's prim would too)
        return f"the reference of {node.target} does not trace: {type(e).__name__}: {e}"
    for sub_node in sub.graph.nodes:
        if sub_node.op == "call_function":
            why = lookup(sub_node)
            if isinstance(why, str):
                return f"its reference uses {sub_node.target}: {why}"
        elif sub_node.op == "get_attr":
            return "its reference creates a tensor constant"
        elif sub_node.op == "output":
            # A prim whose meta disagrees with its own kernel (prims.signbit's meta says the input
            # dtype, its kernel returns bool) has no eager answer the graph's types could hold.
            out = sub_node.args[0]
            got = out.meta.get("val") if isinstance(out, fx.Node) else None
            want = node.meta.get("val")
            if not _same_type(got, want):
                return f"its reference returns {_describe(got)}, the prim's meta {_describe(want)}"
    return None


def _same_type(a: Any, b: Any) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.shape == b.shape
    )


def _describe(v: Any) -> str:
    return f"{v.dtype}{list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__


def _tensors(node: fx.Node) -> list[torch.Tensor]:
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    return [v for v in vals if isinstance(v, torch.Tensor)]


def _register_prims() -> None:
    for name in _REFERENCES:
        packet = getattr(prims, name)

        @lowering(packet.default, supports=supports_reference)
        def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
            return lower_reference(ctx, _reference_of(ctx.node), *args, **kwargs)

        rule.__name__ = rule.__qualname__ = f"_lower_prims_{name}"


_register_prims()


# ---- view.dtype ------------------------------------------------------------------------------
_WIDE = (torch.int64, torch.float64, torch.complex64, torch.complex128, torch.uint64)


def supports_view_dtype(node: fx.Node) -> str | None:
    src, dst = node.args[0].meta["val"].dtype, node.meta["val"].dtype
    if src in _WIDE or dst in _WIDE:
        return (
            f"view of {src} as {dst}: the 64-bit policy holds 64-bit values as 32-bit ones, "
            "whose bits are not eager's"
        )
    if dst == torch.bool and src != torch.bool:
        return f"view of {src} as bool: bytes other than 0/1 are not valid bools"
    bad = {d for d in (src, dst) if d not in ALL_DTYPES}
    if bad:
        return f"view as dtype of {', '.join(sorted(map(str, bad)))} is not supported"
    return None


@lowering(aten.view.dtype, supports=supports_view_dtype)
def _lower_view_dtype(ctx: LoweringContext, x: Value, dtype: torch.dtype) -> Value:
    e = ctx.emit
    out = ctx.out_type()
    if x.dtype == out.dtype:
        return x
    if x.dtype == torch.bool:  # bools are 0/1 bytes: as uint8, then viewed like any byte
        x = e.convert(x, torch.uint8)
        if x.dtype == out.dtype:
            return x
    src_size, dst_size = x.dtype.itemsize, out.dtype.itemsize
    if src_size == dst_size:
        return e.bitcast_convert(x, out.dtype)
    if src_size > dst_size:
        # Each wide element becomes a trailing dim of narrow ones, folded into the last dim.
        ratio = src_size // dst_size
        split = e.op1("bitcast_convert", [x], TensorType((*x.shape, ratio), out.dtype))
        return e.reshape(split, out.shape)
    # Narrow to wide: group the last dim's elements, then bitcast each group to one element.
    ratio = dst_size // src_size
    grouped = e.reshape(x, (*out.shape, ratio))
    return e.op1("bitcast_convert", [grouped], out)


# ---- repeat_interleave with a static output_size ---------------------------------------------
def supports_repeat_interleave(node: fx.Node) -> str | None:
    if node.kwargs.get("output_size") is None:
        return "repeat_interleave without output_size has a data-dependent length"
    if node.args[0].meta["val"].dim() != 1:
        return "repeats must be a 1-D tensor"
    return None


def _repeat_interleave_reference(repeats: torch.Tensor, output_size: int) -> torch.Tensor:
    ends = torch.cumsum(repeats, 0)
    j = torch.arange(output_size, dtype=ends.dtype, device=repeats.device)
    # Output j is the run j falls in: the number of runs that end at or before it.
    return (ends.unsqueeze(0) <= j.unsqueeze(1)).sum(1).to(repeats.dtype)


@lowering(aten.repeat_interleave.Tensor, supports=supports_repeat_interleave)
def _lower_repeat_interleave(
    ctx: LoweringContext, repeats: Value, *, output_size: int | None = None
) -> Value:
    return lower_reference(ctx, _repeat_interleave_reference, repeats, output_size=output_size)
