"""The functional ``_foreach_*`` ops (what an optimizer with ``foreach=True`` and
``clip_grad_norm_(foreach=True)`` run) as the per-tensor op on each element of their lists, as
eager's CPU kernels compute them (``foreach_tensor_*_slow``: a loop calling that op). Without
them every list op ran on the CPU, splitting the optimizer step into one fallback per op.

An argument of list type (``Tensor[]``, ``Scalar[]``) is taken element by element; any other
(``Scalar``, a ``Tensor`` that broadcasts, ``alpha``) is passed to every call. The per-tensor op is
the one of the same name, except where ATen's foreach kernel calls another: ``maximum``/
``minimum`` with scalars are ``clamp_min``/``clamp_max``, ``norm`` is ``linalg_vector_norm``,
``max`` the whole-tensor ``max``, ``zero`` ``zeros_like``. Left to the CPU: ``powsum`` (no
per-tensor op), and ``addcmul``/``addcdiv`` with a tensor of scalars (eager reads its values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

#: The per-tensor op a foreach op's elements run, where it is not the op of the same name,
#: keyed by (name, overload).
_OTHER_OP: dict[tuple[str, str], Callable[..., Any]] = {
    ("maximum", "Scalar"): aten.clamp_min,
    ("maximum", "ScalarList"): aten.clamp_min,
    ("minimum", "Scalar"): aten.clamp_max,
    ("minimum", "ScalarList"): aten.clamp_max,
    ("norm", "Scalar"): lambda x, ord=2, dtype=None: aten.linalg_vector_norm(x, ord, dtype=dtype),
    ("max", "default"): aten.max,
    # the value is positional in the foreach op, keyword-only in the per-tensor one
    **{
        (op.__name__, overload): lambda s, a, b, value=1, op=op: op(s, a, b, value=value)
        for op in (aten.addcmul, aten.addcdiv)
        for overload in ("Scalar", "ScalarList")
    },
    ("zero", "default"): aten.zeros_like,
}
_LEFT_TO_THE_CPU = {("powsum", "Scalar"), ("addcmul", "Tensor"), ("addcdiv", "Tensor")}


def _per_element(op: Any, per_tensor: Callable[..., Any]) -> Callable[..., list[torch.Tensor]]:
    schema = op._schema
    listed = [str(a.type) in ("List[Tensor]", "List[number]") for a in schema.arguments]
    names = [a.name for a in schema.arguments]

    def decomposition(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        n = next(len(v) for v, is_list in zip(args, listed, strict=False) if is_list)
        keyword = {k: v for k, v in kwargs.items() if not listed[names.index(k)]}
        return [
            per_tensor(
                *(v[i] if is_list else v for v, is_list in zip(args, listed, strict=False)),
                **keyword,
            )
            for i in range(n)
        ]

    decomposition.__name__ = f"foreach_{schema.name.split('::_foreach_')[1]}"
    return decomposition


def decompositions() -> dict[Any, Any]:
    """Every functional ``_foreach_*`` overload this torch registers, minus the CPU's."""
    table = {}
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name
        if not name.startswith("aten::_foreach_") or name.endswith("_"):
            continue
        if schema.overload_name.endswith("out"):
            continue
        base = name[len("aten::_foreach_") :]
        overload = schema.overload_name or "default"
        if (base, overload) in _LEFT_TO_THE_CPU:
            continue
        op = getattr(getattr(aten, f"_foreach_{base}"), overload)
        per_tensor = _OTHER_OP.get((base, overload)) or getattr(aten, base)
        table[op] = _per_element(op, per_tensor)
    return table
