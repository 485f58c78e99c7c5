"""Gradients through ``torch.compile(fn, backend="neuron")`` vs eager, for the op-coverage rules.

Each case compiles a small function, compares its forward output, then backpropagates one random
cotangent and compares the gradient of every floating-point input. The backward graphs exercise
what AOTAutograd produces for these ops (flip + cumsum for cumsum's backward, scatters for
sort/topk/max values, index_put with inner index dims for upsampling, ...), so a missing or
wrong rule in either graph fails here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.parity import assert_compiled_gradients_match

pytestmark = pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")

F32 = {"rtol": 1e-4, "atol": 1e-5}
LOOSE = {"rtol": 1e-3, "atol": 1e-4}  # long float32 reduction chains (cumprod, norms)


def _distinct(*shape: int) -> torch.Tensor:
    """No ties, so sort/topk/max pick the same elements as eager and gradients land alike."""
    n = 1
    for d in shape:
        n *= d
    return (torch.randperm(n).float() / n - 0.5).reshape(shape)


def _unit(*shape: int) -> torch.Tensor:
    return torch.rand(shape) * 1.8 - 0.9


def _image(*shape: int) -> torch.Tensor:
    return torch.randn(shape)


X = (4, 8)
IMG = (2, 3, 4, 5)

# name -> (fn, input factories, tolerance)
CASES: dict[str, tuple[Callable[..., Any], tuple[Callable[[], torch.Tensor], ...], dict]] = {
    # reductions and scans
    "prod": (lambda a: a.prod(1), (lambda: torch.randn(X),), F32),
    "prod-all": (lambda a: a.prod(), (lambda: torch.rand(3, 4) + 0.5,), F32),
    "logsumexp": (lambda a: a.logsumexp(1), (lambda: torch.randn(X),), F32),
    "cumsum": (lambda a: a.cumsum(1), (lambda: torch.randn(X),), F32),
    "cumprod": (lambda a: a.cumprod(1), (lambda: torch.rand(X) + 0.5,), LOOSE),
    "logcumsumexp": (lambda a: a.logcumsumexp(0), (lambda: torch.randn(X),), F32),
    "cummax": (lambda a: a.cummax(1).values, (lambda: _distinct(*X),), F32),
    "max-dim": (lambda a: a.max(1).values, (lambda: _distinct(*X),), F32),
    "var-mean": (lambda a: sum(torch.var_mean(a, 1)), (lambda: torch.randn(X),), F32),
    "norms": (
        lambda a: torch.linalg.vector_norm(a, 3, 1) + a.norm(dim=1) + F.normalize(a).sum(1),
        (lambda: torch.randn(X),),
        LOOSE,
    ),
    "cosine-similarity": (F.cosine_similarity, (lambda: torch.randn(X),) * 2, F32),
    # sorting
    "sort-values": (lambda a: a.sort(1, descending=True).values * 2, (lambda: _distinct(*X),), F32),
    "topk-values": (lambda a: a.topk(3, 0).values, (lambda: _distinct(*X),), F32),
    "kthvalue": (lambda a: a.kthvalue(2, 1).values, (lambda: _distinct(*X),), F32),
    # elementwise math and activations
    "inverse-trig-hyperbolic": (
        lambda a: torch.asin(a) + torch.acos(a) + torch.atan(a) + torch.atanh(a) + torch.asinh(a),
        (lambda: _unit(*X),),
        F32,
    ),
    "hyperbolic-tan-logs": (
        lambda a: torch.sinh(a) + torch.cosh(a) + torch.tan(a) + torch.log2(a + 2) + torch.exp2(a),
        (lambda: _unit(*X),),
        F32,
    ),
    "acosh-erfinv": (
        lambda a: torch.acosh(a.abs() + 1.5) + torch.erfinv(a * 0.9),
        (lambda: _unit(*X),),
        LOOSE,
    ),
    "atan2-hypot": (
        lambda a, b: torch.atan2(a, b) + torch.hypot(a, b),
        (lambda: torch.randn(X), lambda: torch.randn(X)),
        F32,
    ),
    "fmod-remainder-lerp": (
        lambda a, b: (
            torch.fmod(a * 3, 1.3) + torch.remainder(a * 3, b.abs() + 0.5) + a.lerp(b, 0.3)
        ),
        (lambda: torch.randn(X), lambda: torch.randn(X)),
        F32,
    ),
    "erfc-ldexp-angle": (
        lambda a: torch.erfc(a) + torch.ldexp(a, torch.tensor([2])) + torch.angle(a),
        (lambda: torch.randn(X) * 2,),
        F32,
    ),
    "addmv-addbmm": (
        lambda b, m, v, x: torch.addmv(b, m, v, beta=0.5).sum() + torch.addbmm(m, x, x.mT).sum(),
        (
            lambda: torch.randn(4),
            lambda: torch.randn(4, 4),
            lambda: torch.randn(4),
            lambda: torch.randn(2, 4, 3),
        ),
        F32,
    ),
    "activations": (
        lambda a: F.elu(a) + F.selu(a) + F.celu(a, 0.7) + F.leaky_relu(a, 0.1) + F.hardtanh(a * 2),
        (lambda: torch.randn(X),),
        F32,
    ),
    "activations-decomposed": (
        lambda a: (
            F.hardswish(a * 3)
            + F.hardsigmoid(a * 3)
            + F.mish(a)
            + F.softplus(a)
            + F.glu(a, 0).repeat(2, 1)
        ),
        (lambda: torch.randn(4, 16),),
        F32,
    ),
    "softmax-log-softmax": (
        lambda a: a.softmax(1) * a.log_softmax(0),
        (lambda: torch.randn(X),),
        F32,
    ),
    # shape
    "flip-roll-repeat": (
        lambda a: a.flip(1).roll(2, 0).repeat(2, 1) * torch.arange(8.0),
        (lambda: torch.randn(X),),
        F32,
    ),
    "unfold-diagonal": (
        lambda a: a.unfold(1, 3, 2).sum(-1).sum(0) + a.diagonal(1).sum(),
        (lambda: torch.randn(X),),
        F32,
    ),
    "narrow-split-stack": (
        lambda a: torch.stack([a.narrow(1, 2, 3), a.tensor_split(3, 1)[0]], 0) ** 2,
        (lambda: torch.randn(X),),
        F32,
    ),
    "tril-triu-diag-embed": (
        lambda a: a.tril() + a.triu(1) * 2 + torch.diag_embed(a[:, :4]).sum(0)[:, :1],
        (lambda: torch.randn(4, 4),),
        F32,
    ),
    # indexing
    "index-inner-dims": (
        lambda a: a[:, torch.tensor([2, 0, 2])] * 3,
        (lambda: torch.randn(X),),
        F32,
    ),
    "scatter-reduce": (
        lambda a, s: (
            a.scatter_reduce(1, torch.tensor([[0, 1, 1]] * 4), s, "amax")
            + a.scatter_reduce(1, torch.tensor([[2, 2, 3]] * 4), s, "sum", include_self=False)
        ),
        (lambda: _distinct(*X), lambda: _distinct(4, 3)),
        F32,
    ),
    "setitem-bool-mask": (
        # Constant values: their gradient would be grad[mask], whose shape depends on the data.
        lambda a: (
            a.index_put((a > 0,), torch.tensor(3.0))
            + a.index_put((a < 0.5,), torch.tensor(2.0), accumulate=True) * a
        ),
        (lambda: torch.randn(X),),
        F32,
    ),
    "masked-scatter": (
        lambda a, s: a.masked_scatter(a > 0, s * 2),
        (lambda: torch.randn(X), lambda: torch.randn(40)),
        F32,
    ),
    "index-reduce-put": (
        lambda a, s: (
            a.index_reduce(0, torch.tensor([0, 2, 2]), s, "amax")
            + a.put(torch.tensor([3, 9]), s[0, :2] * 3, accumulate=True)
        ),
        (lambda: _distinct(*X), lambda: _distinct(3, 8)),
        F32,
    ),
    "embedding": (
        lambda w: F.embedding(torch.tensor([[1, 3, 1], [0, 9, 3]]), w, padding_idx=0),
        (lambda: torch.randn(10, 4),),
        F32,
    ),
    # upsampling and padding (decomposed into index / index_put with leading None dims)
    "upsample-nearest": (
        lambda a: F.interpolate(a, scale_factor=2, mode="nearest"),
        (lambda: _image(*IMG),),
        F32,
    ),
    "upsample-bilinear": (
        lambda a: F.interpolate(a, size=(7, 9), mode="bilinear"),
        (lambda: _image(*IMG),),
        F32,
    ),
    "upsample-bilinear-align-corners": (
        lambda a: F.interpolate(a, scale_factor=2, mode="bilinear", align_corners=True),
        (lambda: _image(*IMG),),
        F32,
    ),
    "upsample-bicubic": (
        lambda a: F.interpolate(a, scale_factor=2, mode="bicubic"),
        (lambda: _image(*IMG),),
        LOOSE,
    ),
    "upsample-linear-1d": (
        lambda a: F.interpolate(a, scale_factor=1.5, mode="linear"),
        (lambda: torch.randn(2, 3, 6),),
        F32,
    ),
    "pads": (
        lambda a: (
            F.pad(a, (1, 2, 2, 1), mode="reflect").sum((2, 3))
            + F.pad(a, (1, 2, 2, 1), mode="replicate").sum((2, 3))
            + F.pad(a, (1, 2, 2, 1), mode="circular").sum((2, 3))
        ),
        (lambda: _image(*IMG),),
        F32,
    ),
    "unfold-fold": (
        lambda a: F.fold(F.unfold(a, 2, stride=1) * 2, (4, 5), 2, stride=1),
        (lambda: _image(*IMG),),
        F32,
    ),
    # pooling
    "pool3d": (
        lambda a: (
            F.max_pool3d(a, 2, 2)
            + F.avg_pool3d(a, 2, 2, 1, count_include_pad=False)[..., :2, :2, :2]
        ),
        (lambda: torch.randn(2, 2, 4, 4, 4),),
        F32,
    ),
    "adaptive-max-pool2d": (
        lambda a: F.adaptive_max_pool2d(a, (3, 2)),
        (lambda: _image(2, 3, 7, 5),),
        F32,
    ),
    "adaptive-pool3d": (
        lambda a: F.adaptive_avg_pool3d(a, (2, 3, 2)).sum() + F.adaptive_max_pool3d(a, (3, 2, 2)),
        (lambda: _distinct(2, 2, 5, 4, 3),),
        F32,
    ),
    "local-response-norm": (lambda a: F.local_response_norm(a, 3), (lambda: _image(*IMG),), F32),
    # distances
    "dist": (
        lambda a, b: torch.dist(a, b) + torch.dist(a, b, 3.0) + torch.dist(a, b, math.inf),
        (lambda: _distinct(3, 4), lambda: torch.randn(4)),
        F32,
    ),
    "cdist": (
        lambda a, b: torch.cdist(a, b) + torch.cdist(a, b, 1.0) + torch.cdist(a, b, 3.0),
        (lambda: torch.randn(5, 3), lambda: torch.randn(4, 3)),
        F32,
    ),
    "pdist": (lambda a: F.pdist(a) + F.pdist(a, math.inf), (lambda: torch.randn(5, 3),), F32),
    # normalization
    "group-norm": (
        lambda x, w, b: F.group_norm(x, 3, w, b),
        (lambda: torch.randn(2, 6, 5, 4), lambda: torch.randn(6), lambda: torch.randn(6)),
        F32,
    ),
    "instance-norm": (F.instance_norm, (lambda: _image(*IMG),), F32),
    "batch-norm-with-update": (
        lambda x, w, b: torch.ops.aten._batch_norm_with_update(
            x, w, b, torch.zeros(3), torch.ones(3), 0.1, 1e-5
        )[0],
        (lambda: torch.randn(4, 3, 5), lambda: torch.randn(3), lambda: torch.randn(3)),
        F32,
    ),
    "bilinear": (
        F.bilinear,
        (
            lambda: torch.randn(5, 3),
            lambda: torch.randn(5, 4),
            lambda: torch.randn(6, 3, 4),
            lambda: torch.randn(6),
        ),
        F32,
    ),
    "igamma-x": (
        lambda x: (
            torch.special.gammainc(torch.full_like(x, 2.5), x)
            + torch.special.gammaincc(torch.full_like(x, 0.7), x)
        ),
        (lambda: torch.rand(X) * 5 + 0.1,),
        F32,
    ),
    # bit-level float ops: frexp's mantissa has gradient 2^-exponent
    "frexp-nextafter": (
        lambda a, b: torch.frexp(a * 5).mantissa + torch.nextafter(a, b),
        (lambda: torch.randn(X), lambda: torch.randn(X)),
        F32,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_eager(name: str) -> None:
    fn, factories, tol = CASES[name]
    torch.manual_seed(0)
    assert_compiled_gradients_match(fn, [make() for make in factories], **tol)
