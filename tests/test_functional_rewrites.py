"""``torch.nn.functional`` calls AOTAutograd could not trace as eager computes them, rewritten in
Dynamo's graph (``decompositions/functional.py``): values and gradients match eager.

- ``multi_margin_loss``: no gradient at the hinge (``z == 0``); before, ``[0.33, -0.67, 0.33]``
  where eager gives ``[0, -0.33, 0.33]``.
- ``multilabel_margin_loss``: targets end at the first ``-1``; before, later ones counted.
- ``affine_grid`` with a spatial size of 1: before, compiling raised (with or without grad).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.filterwarnings("ignore::neuron_compile.compiler.DowncastWarning"),  # targets
    # eager's own: a unit-size grid with align_corners=True changed meaning in PyTorch 1.3
    pytest.mark.filterwarnings("ignore:Since version 1.3.0, affine_grid"),
]


def _value_and_grad(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_()
    out = fn(x)
    (out.float() * torch.linspace(1, 2, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad


def _check(fn, x: torch.Tensor, atol: float = 1e-6) -> None:
    expected = _value_and_grad(fn, x)
    torch._dynamo.reset()
    actual = _value_and_grad(torch.compile(fn, backend="neuron"), x)
    for a, e in zip(actual, expected, strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=1e-5, atol=atol)


def test_multi_margin_loss_has_no_gradient_at_the_hinge() -> None:
    target = torch.tensor([1])
    _check(lambda x: F.multi_margin_loss(x, target, reduction="sum"), torch.tensor([[1.0, 2, 3]]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin_loss(p: int, reduction: str) -> None:
    g = torch.Generator().manual_seed(p)
    x = torch.randint(-3, 4, (5, 4), generator=g).float()  # integer scores: ties at the hinge
    target, weight = torch.randint(0, 4, (5,), generator=g), torch.rand(4, generator=g)
    _check(lambda x: F.multi_margin_loss(x, target, p, 1.0, weight, reduction=reduction), x)
    _check(lambda x: F.multi_margin_loss(x, torch.tensor(2), p, reduction=reduction), x[0])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss_stops_at_the_first_minus_one(reduction: str) -> None:
    x = torch.randint(-3, 4, (3, 4), generator=torch.Generator().manual_seed(0)).float()
    y = torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [1, -1, 2, 0]])
    _check(lambda x: F.multilabel_margin_loss(x, y, reduction=reduction), x)
    _check(lambda x: torch.nn.MultiLabelMarginLoss(reduction=reduction)(x, y), x)
    _check(
        lambda x: F.multilabel_margin_loss(x, torch.tensor([2, 1, -1, 0]), reduction=reduction),
        x[0],
    )


def test_invalid_arguments_fail_as_in_eager() -> None:
    x, target = torch.randn(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="only p == 1 and p == 2"):
        F.multi_margin_loss(x, target, p=3)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="only p == 1 and p == 2"):
        torch.compile(lambda x: F.multi_margin_loss(x, target, p=3), backend="neuron")(x)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(1, 1, 1, 3), (2, 1, 4, 1), (1, 1, 1, 1), (1, 2, 1, 3, 4),
                                  (2, 3, 4, 5), (2, 1, 3, 4, 5)])  # fmt: skip
def test_affine_grid(size: tuple[int, ...], align_corners: bool) -> None:
    k = len(size) - 2
    theta = torch.randn(size[0], k, k + 1, generator=torch.Generator().manual_seed(0))
    _check(lambda t: F.affine_grid(t, size, align_corners=align_corners), theta, atol=1e-5)


def test_affine_grid_generator_called_directly_with_a_unit_axis() -> None:
    """The op itself (no ``F.affine_grid`` call to rewrite): PyTorch's decomposition traces a
    ``detach_`` for the unit axis, which ``decompositions/legacy.py`` decomposes."""
    theta = torch.randn(1, 2, 3, generator=torch.Generator().manual_seed(0))
    fn = lambda t: torch.affine_grid_generator(t, (1, 1, 1, 3), False)  # noqa: E731
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="neuron")(theta), fn(theta))
