"""``linalg.ldl_factor_ex`` and ``linalg.ldl_solve``: LAPACK's Bunch-Kaufman LDLᵀ, step for step.

Eager calls LAPACK ``?sytrf`` with ``uplo='L'`` (then keeps the lower triangle) and ``?sytrs``.
For n up to LAPACK's block size (64) ``?sytrf`` runs the unblocked ``?sytf2``, which this
module follows: at column k it picks a 1x1 pivot (k itself or row ``imax``) or a 2x2 pivot
(rows k, ``imax``) from the same comparisons with ``alpha = (1 + sqrt(17)) / 8``; interchanges
rows and columns of the trailing block only (earlier columns of L keep their rows, which is
what ``?sytrs`` expects); and updates the trailing block with the same products, in the same
order (``?syr``'s ``x_i * (-d11 * x_j)``, the 2x2 block's ``wk``/``wkp1``). Pivots are 1-based,
negative for both columns of a 2x2 block; ``info`` is the first zero pivot column (1-based).

Which pivot each matrix of a batch takes is data, so each column is one unrolled step over
the whole batch that computes both kinds of pivot and selects per matrix; a matrix whose
column k was the second column of a 2x2 block leaves that step unchanged. The steps are PyTorch
functions traced to ATen (``lower_reference``); n is static, so the unrolled graph is too.
Larger matrices (LAPACK's blocked path rounds differently) fall back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import Tensor

from ..context import LoweringContext
from ..reference import lower_reference
from ..registry import lowering

aten = torch.ops.aten

#: LAPACK's block size for ``?sytrf``: up to it, the unblocked ``?sytf2`` factors the matrix.
MAX_UNBLOCKED = 64
#: ``?sytf2``'s ALPHA, computed in single precision as ``ssytf2`` does.
ALPHA = float(np.float32((np.float32(1) + np.sqrt(np.float32(17))) / np.float32(8)))


def _small_float32(node: fx.Node) -> str | None:
    floats = [a.meta["val"] for a in node.all_input_nodes if a.meta["val"].dtype != torch.int32]
    if any(t.dtype != torch.float32 for t in floats):  # the pivots are int32
        return f"float32 only, not {sorted({str(t.dtype) for t in floats})}"
    n = node.args[0].meta["val"].shape[-1]
    if n > MAX_UNBLOCKED:
        return f"n={n} > {MAX_UNBLOCKED}: LAPACK factors it blockwise, with other roundings"
    if node.kwargs.get("hermitian") or (len(node.args) > 1 and node.args[1] is True):
        return "hermitian=True is the complex variant (real matrices: use hermitian=False)"
    return None


def _swap(m: Tensor, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """``m`` with indices ``a`` and ``b`` (per matrix, shape (B,)) of ``dim`` interchanged."""
    n = m.shape[dim]
    idx = torch.arange(n).expand(a.shape[0], n)
    perm = torch.where(
        idx == a[:, None], b[:, None], torch.where(idx == b[:, None], a[:, None], idx)
    )
    shape = [perm.shape[0]] + [1] * (m.ndim - 1)
    shape[dim] = n
    return m.gather(dim, perm.view(shape).expand(m.shape))


def _mirror_lower(t: Tensor) -> Tensor:
    return t.tril() + t.tril(-1).mT


def _factor_step(m: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One ``?sytf2`` step at column k for every matrix: (new m, kstep, kp, zero pivot).
    ``m``'s trailing block m[:, k:, k:] is kept symmetric; columns < k hold L."""
    n = m.shape[-1]
    absakk = m[:, k, k].abs()
    if k < n - 1:
        below = m[:, k + 1 :, k].abs()
        colmax, imax_rel = below.max(-1)
        imax = imax_rel + (k + 1)
    else:
        colmax, imax = torch.zeros_like(absakk), torch.full_like(absakk, k, dtype=torch.long)
    zero = (torch.maximum(absakk, colmax) == 0) | absakk.isnan()
    # rowmax: the largest off-diagonal entry of row imax within the trailing block
    row = m.gather(1, imax.view(-1, 1, 1).expand(-1, 1, n)).squeeze(1)[:, k:].abs()
    cols = torch.arange(k, n)
    rowmax = torch.where(cols == imax[:, None], 0.0, row).amax(-1)
    diag_imax = m.diagonal(dim1=-2, dim2=-1).gather(1, imax[:, None]).squeeze(1).abs()
    keep_k = (absakk >= ALPHA * colmax) | (absakk >= ALPHA * colmax * (colmax / rowmax))
    one_by_one = zero | keep_k | (diag_imax >= ALPHA * rowmax)
    kp = torch.where(zero | keep_k, k, imax)
    kstep = torch.where(one_by_one, 1, 2)
    kk = k + kstep - 1
    # interchange rows and columns kk and kp of the trailing block
    swapped = _swap(_swap(m, kk, kp, 1), kk, kp, 2)
    block = (torch.arange(n)[:, None] >= k) & (torch.arange(n)[None, :] >= k)
    m = torch.where(block, swapped, m)
    one = _update_1x1(m, k) if k < n - 1 else m
    two = _update_2x2(m, k) if k < n - 2 else m
    stepped = torch.where((kstep == 1)[:, None, None], one, two)
    return torch.where(zero[:, None, None], m, stepped), kstep, kp, zero


def _update_1x1(m: Tensor, k: int) -> Tensor:
    d11 = 1.0 / m[:, k, k]
    x = m[:, k + 1 :, k]
    trailing = m[:, k + 1 :, k + 1 :] + x[:, :, None] * ((-d11)[:, None] * x)[:, None, :]
    lower = torch.cat([(x * d11[:, None])[:, :, None], _mirror_lower(trailing)], dim=2)
    return torch.cat([m[:, : k + 1], torch.cat([m[:, k + 1 :, :k], lower], dim=2)], dim=1)


def _update_2x2(m: Tensor, k: int) -> Tensor:
    d21 = m[:, k + 1, k]
    d11 = m[:, k + 1, k + 1] / d21
    d22 = m[:, k, k] / d21
    t = 1.0 / (d11 * d22 - 1.0)
    d21 = t / d21
    a, b = m[:, k + 2 :, k], m[:, k + 2 :, k + 1]
    wk = d21[:, None] * (d11[:, None] * a - b)
    wkp1 = d21[:, None] * (d22[:, None] * b - a)
    trailing = m[:, k + 2 :, k + 2 :] - a[:, :, None] * wk[:, None, :]
    trailing = trailing - b[:, :, None] * wkp1[:, None, :]
    lower = torch.cat([wk[:, :, None], wkp1[:, :, None], _mirror_lower(trailing)], dim=2)
    return torch.cat([m[:, : k + 2], torch.cat([m[:, k + 2 :, :k], lower], dim=2)], dim=1)


def ldl_factor_ex(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(LD, pivots, info) of ``?sytrf('L')`` for a batch (..., n, n) of real matrices."""
    batch, n = a.shape[:-2], a.shape[-1]
    m = _mirror_lower(a.reshape(batch.numel(), n, n))
    count = m.shape[0]
    pivots = torch.zeros(count, n, dtype=torch.int32)
    info = torch.zeros(count, dtype=torch.int32)
    second = torch.zeros(count, dtype=torch.bool)  # column k closes the previous 2x2 block
    for k in range(n):
        stepped, kstep, kp, zero = _factor_step(m, k)
        start = ~second
        m = torch.where(start[:, None, None], stepped, m)
        piv = torch.where(kstep == 1, kp + 1, -(kp + 1)).to(torch.int32)
        cols = torch.arange(n)
        mine = (cols == k) | ((cols == k + 1) & (kstep == 2)[:, None])
        pivots = torch.where(start[:, None] & mine, piv[:, None], pivots)
        info = torch.where(start & zero & (info == 0), k + 1, info).to(torch.int32)
        second = start & (kstep == 2)
    ld = m.tril().reshape(*batch, n, n)
    return ld, pivots.reshape(*batch, n), info.reshape(batch)


@lowering(aten.linalg_ldl_factor_ex.default, supports=_small_float32)
def _lower_ldl_factor_ex(ctx: LoweringContext, a: Any, hermitian: bool = False, **_: Any) -> Any:
    return lower_reference(ctx, lambda x, *_, **__: ldl_factor_ex(x), a, hermitian, **_)


def _row(t: Tensor, i: Tensor | int) -> Tensor:
    """Row ``i`` (per matrix) of a (B, n, r) batch, as (B, r)."""
    if isinstance(i, int):
        return t[:, i]
    return t.gather(1, i.view(-1, 1, 1).expand(-1, 1, t.shape[-1])).squeeze(1)


def ldl_solve(ld: Tensor, pivots: Tensor, b: Tensor) -> Tensor:
    """X with A X = B from ``ldl_factor``'s (LD, pivots), as ``?sytrs('L')``."""
    batch = torch.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    n, r = ld.shape[-1], b.shape[-1]
    count = batch.numel()
    ld = ld.expand(*batch, n, n).reshape(count, n, n)
    piv = pivots.expand(*batch, n).reshape(count, n).to(torch.long)
    x = b.expand(*batch, n, r).reshape(count, n, r)
    # which columns open a 2x2 block (the forward pass below walks k = 0, 1, ... like ?sytrs)
    opens, second = [], torch.zeros(count, dtype=torch.bool)
    for k in range(n):
        two = ~second & (piv[:, k] < 0)
        opens.append((~second, two))
        second = two
    # solve L D Y = B
    for k in range(n):
        start, two = opens[k]
        one_kp = (piv[:, k] - 1).clamp(min=0)  # a 2x2 column's is unused
        y1 = _swap(x, torch.full_like(one_kp, k), one_kp, 1)
        if k < n - 1:
            y1 = torch.cat(
                [y1[:, : k + 1], y1[:, k + 1 :] - ld[:, k + 1 :, k, None] * y1[:, k, None]], 1
            )
        y1 = torch.cat(
            [y1[:, :k], (y1[:, k] * (1.0 / ld[:, k, k, None]))[:, None], y1[:, k + 1 :]], 1
        )
        y2 = x
        if k < n - 1:
            two_kp = (-piv[:, k] - 1).clamp(min=0)  # a 1x1 column's is unused
            y2 = _swap(x, torch.full_like(two_kp, k + 1), two_kp, 1)
            if k < n - 2:
                rest = y2[:, k + 2 :] - ld[:, k + 2 :, k, None] * y2[:, k, None]
                rest = rest - ld[:, k + 2 :, k + 1, None] * y2[:, k + 1, None]
                y2 = torch.cat([y2[:, : k + 2], rest], 1)
            akm1k = ld[:, k + 1, k, None]
            akm1 = ld[:, k, k, None] / akm1k
            ak = ld[:, k + 1, k + 1, None] / akm1k
            denom = akm1 * ak - 1.0
            bkm1, bk = y2[:, k] / akm1k, y2[:, k + 1] / akm1k
            pair = torch.stack([(ak * bkm1 - bk) / denom, (akm1 * bk - bkm1) / denom], 1)
            y2 = torch.cat([y2[:, :k], pair, y2[:, k + 2 :]], 1)
        step = torch.where(two[:, None, None], y2, y1)
        x = torch.where(start[:, None, None], step, x)
    # solve Lᵀ X = Y, walking back; a 2x2 block is handled at its second column
    for k in reversed(range(n)):
        closes = opens[k - 1][1] if k > 0 else torch.zeros(count, dtype=torch.bool)
        single = opens[k][0] & ~opens[k][1]
        if k < n - 1:
            dot = (ld[:, k + 1 :, k, None] * x[:, k + 1 :]).sum(1)
            row_k = x[:, k] - dot
        else:
            row_k = x[:, k]
        z = torch.cat([x[:, :k], row_k[:, None], x[:, k + 1 :]], 1)
        if k > 0 and k < n - 1:
            dot = (ld[:, k + 1 :, k - 1, None] * x[:, k + 1 :]).sum(1)
            z2 = torch.cat([z[:, : k - 1], (z[:, k - 1] - dot)[:, None], z[:, k:]], 1)
            z = torch.where(closes[:, None, None], z2, z)
        kp = (torch.where(single, piv[:, k], -piv[:, k]) - 1).clamp(min=0)
        z = _swap(z, torch.full_like(kp, k), kp, 1)
        x = torch.where((single | closes)[:, None, None], z, x)
    return x.reshape(*batch, n, r)


@lowering(aten.linalg_ldl_solve.default, supports=_small_float32)
def _lower_ldl_solve(ctx: LoweringContext, ld: Any, pivots: Any, b: Any, **_: Any) -> Any:
    return lower_reference(ctx, lambda f, p, x, **__: ldl_solve(f, p, x), ld, pivots, b, **_)
