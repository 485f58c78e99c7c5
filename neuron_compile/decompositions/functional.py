"""``torch.nn.functional`` functions AOTAutograd cannot trace as eager computes them.

``aten.multi_margin_loss`` and ``aten.multilabel_margin_loss`` carry a Python decomposition
registered at the Autograd dispatch key (``py_impl``), so AOTAutograd runs it while tracing,
ahead of ``capture.decomposition_table``, and derives the backward from it. Both differ from
eager's kernels:

- ``multi_margin_loss`` clamps the hinge with ``clamp_min(z, 0)``, whose gradient passes at
  ``z == 0``; eager's kernel adds a term only where ``z > 0`` (gradient 0 at the hinge: scores
  ``[1, 2, 3]`` with target 1 gave ``[0.33, -0.67, 0.33]``, eager ``[0, -0.33, 0.33]``);
- ``multilabel_margin_loss`` reads targets past the first ``-1`` (eager stops there;
  pytorch#185464).

``affine_grid`` with a spatial size of 1 did not trace at all: PyTorch's decomposition of
``affine_grid_generator`` builds that axis's one coordinate with ``torch.tensor(0)`` (a
``detach_`` in a graph AOTAutograd requires functional), and its backward,
``affine_grid_generator_backward``, is a composite whose kernel does the same on data a trace
does not have (``aot_eager`` fails too).

``rewrite_functions`` points Dynamo's calls of these functions at the implementations below
before AOTAutograd traces the frame: each computes what eager's CPU kernel computes
(``MultiMarginCriterion.cpp``, ``MultilabelMarginCriterion.cpp``, ``AffineGridGenerator.cpp``),
with static shapes, and its autograd gives eager's backward. Invalid arguments fail as in eager:
the implementations run the original function on meta tensors first (``_checked``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F


def _checked(fn: Any, *args: Any, **kwargs: Any) -> None:
    """Run the original ``fn`` on meta tensors of the same shapes and dtypes, outside the trace:
    its argument checks raise, and its warnings warn, as in eager."""
    from torch.utils._python_dispatch import _disable_current_modes

    def meta(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return torch.empty(a.shape, dtype=a.dtype, device="meta")
        return a

    with _disable_current_modes():
        fn(*map(meta, args), **{k: meta(v) for k, v in kwargs.items()})


def _reduction(size_average: Any, reduce: Any, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        from torch.nn import _reduction

        return _reduction.legacy_get_string(size_average, reduce)
    return reduction


def _reduced(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _hinge(z: torch.Tensor) -> torch.Tensor:
    """``max(z, 0)`` counted only where ``z > 0``, as eager's kernels test it: no gradient at
    ``z == 0``, and a NaN ``z`` adds nothing."""
    return torch.where(z > 0, z, 0)


def multi_margin_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    p: int = 1,
    margin: float = 1.0,
    weight: torch.Tensor | None = None,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.multi_margin_loss``: per sample ``sum_{i != y} w[y] * max(0, margin - x[y] + x[i])^p
    / C``."""
    reduction = _reduction(size_average, reduce, reduction)
    _checked(F.multi_margin_loss, input, target, p, margin, weight, reduction=reduction)
    x = torch.atleast_2d(input)
    y = torch.atleast_1d(target).unsqueeze(1)
    z = _hinge(margin - x.gather(1, y) + x)
    z = z if p == 1 else z * z
    if weight is not None:
        z = z * weight[y]
    classes = torch.arange(x.shape[1], device=x.device)
    loss = torch.where(classes != y, z, 0).sum(1) / x.shape[1]
    return _reduced(loss if input.dim() > 1 else loss[0], reduction)


def multilabel_margin_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.multilabel_margin_loss``: per sample, over the target classes ``j`` (``target`` up to
    its first ``-1``) and the other classes ``i``, ``sum max(0, 1 - x[j] + x[i]) / C``."""
    reduction = _reduction(size_average, reduce, reduction)
    _checked(F.multilabel_margin_loss, input, target, reduction=reduction)
    x = torch.atleast_2d(input)
    y = torch.atleast_2d(target)
    listed = torch.cumprod((y >= 0).to(torch.int32), dim=1).bool()  # before the first -1
    index = torch.where(listed, y, 0)
    is_target = torch.zeros_like(x).scatter_reduce(1, index, listed.to(x.dtype), "amax") > 0
    z = _hinge(1 - x.gather(1, index).unsqueeze(2) + x.unsqueeze(1))  # (N, target j, class i)
    counted = listed.unsqueeze(2) & ~is_target.unsqueeze(1)
    loss = torch.where(counted, z, 0).sum((1, 2)) / x.shape[1]
    return _reduced(loss if input.dim() > 1 else loss[0], reduction)


def _coordinates(n: int, align_corners: bool, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``n`` grid coordinates in [-1, 1]: pixel centers, or the corners with ``align_corners``;
    one point: 0."""
    if n <= 1:
        return torch.zeros(n, dtype=dtype, device=device)
    a = 1 if align_corners else (n - 1) / n
    return torch.linspace(-a, a, steps=n, dtype=dtype, device=device)


def affine_grid(
    theta: torch.Tensor, size: list[int], align_corners: bool | None = None
) -> torch.Tensor:
    """``F.affine_grid``: the base grid ``[x, y, (z), 1]`` of every output point (``x`` along the
    last axis) times ``theta (N, k, k + 1)``, in float32 for bfloat16/float16 ``theta``. Eager's
    kernel multiplies with ``bmm``; the sums here are elementwise, as PyTorch's decomposition's
    are: they agree to rounding."""
    _checked(F.affine_grid, theta, size, align_corners=align_corners)
    spatial, k = list(size[2:]), len(size) - 2
    dtype = torch.float32 if theta.dtype in (torch.bfloat16, torch.float16) else theta.dtype
    axes = [_coordinates(s, bool(align_corners), dtype, theta.device) for s in spatial]
    mesh = torch.meshgrid(*axes, indexing="ij")
    base = torch.stack([*mesh[::-1], torch.ones(spatial, dtype=dtype, device=theta.device)], -1)
    grid = (base.view(-1, k + 1, 1) * theta.to(dtype).mT.unsqueeze(1)).sum(-2)
    return grid.view(size[0], *spatial, k).to(theta.dtype)


#: Dynamo's call targets -> the implementations above.
REWRITTEN = {
    F.multi_margin_loss: multi_margin_loss,
    F.multilabel_margin_loss: multilabel_margin_loss,
    F.affine_grid: affine_grid,
}


def rewrite_functions(gm: fx.GraphModule) -> None:
    """Point the calls of ``REWRITTEN``'s functions in Dynamo's graph ``gm`` at ours."""
    changed = False
    for original, replacement in REWRITTEN.items():
        for node in gm.graph.find_nodes(op="call_function", target=original):
            with gm.graph.inserting_before(node):
                call = gm.graph.call_function(replacement, node.args, node.kwargs)
            call.meta = dict(node.meta)
            node.replace_all_uses_with(call)
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()
