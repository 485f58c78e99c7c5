"""Compiled-vs-eager comparison of nested outputs, with an optional float64 reference."""

from __future__ import annotations

import math
from typing import Any

import torch

# (rtol, atol) per dtype; integers and bools must match exactly.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (1e-3, 1e-3),
    torch.float64: (1e-7, 1e-7),
}


def leaves(obj: Any) -> list[Any]:
    """Flatten nested lists/tuples/dicts/return-types into leaves (tensors and scalars)."""
    if isinstance(obj, (list, tuple)):
        return [x for item in obj for x in leaves(item)]
    if isinstance(obj, dict):
        return [x for k in sorted(obj, key=str) for x in leaves(obj[k])]
    return [obj]


def layout(t: torch.Tensor) -> tuple[int, ...]:
    """The strides a caller can observe: those of dimensions longer than 1 (a size-1 or empty
    dimension's stride is arbitrary, and eager itself is not consistent there)."""
    if t.numel() <= 1:
        return ()
    return tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n > 1)


def dense(t: torch.Tensor) -> bool:
    """Whether eager's layout of ``t`` follows its layout rules (permutations of a dense
    tensor): expanded (stride-0) results such as ``sum``'s gradient are an implementation
    detail, which compiled code need not reproduce."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return bool(is_non_overlapping_and_dense_or_false(t))


def compare(
    actual: Any, expected: Any, dtype: torch.dtype, ref: Any = None, strides: bool = True
) -> tuple[str | None, float, float]:
    """``(None | why they differ, max abs err, max rel err)`` over all leaves. With ``ref`` (the
    eager result computed in float64), a float leaf outside tolerance of eager still passes when
    it is within tolerance of ``ref`` or no further from ``ref`` than eager is (x2). ``strides``:
    whether a dense leaf laid out otherwise than eager's differs."""
    a_leaves, e_leaves = leaves(actual), leaves(expected)
    r_leaves = leaves(ref) if ref is not None else None
    if r_leaves is not None and len(r_leaves) != len(e_leaves):
        r_leaves = None
    if len(a_leaves) != len(e_leaves):
        return f"{len(a_leaves)} outputs, eager has {len(e_leaves)}", math.nan, math.nan
    worst_abs = worst_rel = 0.0
    why = None
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"output {i}: {type(a).__name__}, eager has a tensor", math.nan, math.nan
            if a.shape != e.shape:
                return f"output {i}: shape {tuple(a.shape)} vs {tuple(e.shape)}", math.nan, math.nan
            if a.dtype != e.dtype:
                return f"output {i}: dtype {a.dtype} vs eager {e.dtype}", math.nan, math.nan
            if (
                strides and dense(e) and layout(a) != layout(e)
            ):  # values agree; a stride guard would not
                return (
                    f"output {i}: strides {a.stride()} vs eager {e.stride()}",
                    math.nan,
                    math.nan,
                )
            bad, abs_err, rel_err = _tensor_diff(a.detach(), e.detach(), dtype)
            r = r_leaves[i] if r_leaves is not None else None
            if bad and isinstance(r, torch.Tensor) and e.is_floating_point():
                bad = not _near_reference(a.detach(), e.detach(), r.detach(), _tol(e, dtype))
        elif e is None or isinstance(e, (bool, int, str, torch.dtype, torch.Size)):
            bad, abs_err, rel_err = not (type(a) is type(e) and a == e), 0.0, 0.0
        elif isinstance(e, float):
            if not isinstance(a, (int, float)):
                return f"output {i}: {type(a).__name__}, eager has a float", math.nan, math.nan
            rtol, atol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
            both_nan = math.isnan(a) and math.isnan(e)
            bad = not (both_nan or a == e or math.isclose(a, e, rel_tol=rtol, abs_tol=atol))
            abs_err, rel_err = abs(a - e), 0.0
        else:
            continue  # opaque objects (e.g. a returned torch.device) are not compared
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if bad and why is None:
            why = f"output {i} differs"
    return why, worst_abs, worst_rel


def _tol(e: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol). A float64 output of a float32 entry runs in float32 (the documented 64-bit
    policy): the looser of the entry's and the output's tolerances applies."""
    default = TOLERANCES[torch.float32]
    rtol, atol = map(max, TOLERANCES.get(e.dtype, default), TOLERANCES.get(dtype, default))
    return rtol, atol


def _near_reference(
    a: torch.Tensor, e: torch.Tensor, r: torch.Tensor, tol: tuple[float, float]
) -> bool:
    if r.shape != a.shape:
        return False
    a64, e64, r64 = (t.to(torch.float64) for t in (a, e, r))
    finite = a64.isfinite() & e64.isfinite() & r64.isfinite()
    a64, e64, r64 = a64[finite], e64[finite], r64[finite]
    err, eager_err = (a64 - r64).abs(), (e64 - r64).abs()
    rtol, atol = tol
    return bool(((err <= atol + rtol * r64.abs()) | (err <= 2 * eager_err)).all())


def to64(t: torch.Tensor, grad: bool) -> torch.Tensor:
    if not t.is_floating_point():
        return t.detach()
    return t.detach().to(torch.float64).requires_grad_(grad and t.requires_grad)


def _tensor_diff(a: torch.Tensor, e: torch.Tensor, dtype: torch.dtype) -> tuple[bool, float, float]:
    if e.numel() == 0:
        return False, 0.0, 0.0
    if not (e.is_floating_point() or e.is_complex()):
        diff = (a.to(torch.int64) - e.to(torch.int64)).abs() if e.dtype != torch.bool else a ^ e
        n_bad = int((a != e).sum())
        return n_bad > 0, float(diff.max()), 0.0
    rtol, atol = _tol(e, dtype)
    a64, e64 = a.to(torch.float64), e.to(torch.float64)
    nan_bad = bool((a64.isnan() != e64.isnan()).any())
    inf_bad = bool(((a64.isinf() | e64.isinf()) & (a64 != e64)).any())
    finite = a64.isfinite() & e64.isfinite()
    diff = (a64 - e64).abs()[finite]
    ref = e64.abs()[finite]
    if diff.numel() == 0:
        return nan_bad or inf_bad, 0.0, 0.0
    bad = nan_bad or inf_bad or bool((diff > atol + rtol * ref).any())
    rel = diff / ref.clamp_min(torch.finfo(torch.float32).tiny)
    return bad, float(diff.max()), float(rel.max())
