"""OP_CASES: one table of per-op numerics cases, compared with eager PyTorch on CPU.

Each case builds its inputs for a dtype and names itself like ``exp-f32``. Expected failures
would live on the case itself (``xfail=...``), never in a global table. The op-coverage entries
(issue 3) live in ``coverage_cases.py`` and are part of this table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.lowering.bessel_poly_cases import BESSEL_POLY_CASES
from tests.lowering.coverage_cases import COVERAGE_CASES
from tests.lowering.linalg_cases import LINALG_CASES
from tests.lowering.opcase import (
    F32,
    INT,
    M,
    OpCase,
    idx,
    integers,
    nonzero,
    positive,
    randn,
)
from tests.lowering.special_cases import SPECIAL_CASES

OP_CASES: list[OpCase] = [
    # elementwise
    OpCase("add", torch.add, (M, M)),
    OpCase("add-broadcast-alpha", lambda a, b: torch.add(a, b, alpha=2), (M, (8,))),
    OpCase("sub-scalar", lambda a: a - 1.5, (M,)),
    OpCase("rsub", lambda a: 2.0 - a, (M,)),
    OpCase("mul-broadcast", torch.mul, ((4, 1), (1, 8))),
    OpCase("div", torch.div, (M, M), make=positive),
    OpCase(
        "div-int-true",
        torch.div,
        (M, M),
        dtypes=INT,
        make=lambda s, d: torch.randint(1, 9, s).to(d),
    ),
    OpCase(
        "div-floor",
        lambda a, b: torch.div(a, b, rounding_mode="floor"),
        (M, M),
        dtypes=F32,
        make=positive,
    ),
    OpCase("div-trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc"), (M, M), dtypes=F32),
    OpCase(
        "div-rounding-modes",
        lambda a, b: (
            torch.div(a, b, rounding_mode="floor"),
            torch.div(a, b, rounding_mode="trunc"),
        ),
        (M, M),
        dtypes=(torch.float32, torch.bfloat16, torch.int32, torch.int64),
        # large quotients: bf16 must round the quotient before truncating, as eager does
        make=(lambda s, d: (torch.randn(s) * 50).to(d), nonzero),
    ),
    OpCase("pow-scalar", lambda a: a**3, (M,)),
    OpCase("pow-tensor", torch.pow, (M, M), make=positive),
    OpCase("square", lambda a: a**2, (M,)),
    OpCase("exp", torch.exp, (M,)),
    OpCase("log", torch.log, (M,), make=positive),
    OpCase("tanh", torch.tanh, (M,)),
    OpCase("sigmoid", torch.sigmoid, (M,)),
    OpCase("sqrt", torch.sqrt, (M,), make=positive),
    OpCase("rsqrt", torch.rsqrt, (M,), make=positive),
    OpCase("sin-cos", lambda a: torch.sin(a) + torch.cos(a), (M,)),
    OpCase("erf", torch.erf, ((64,),), make=lambda s, d: torch.linspace(-5, 5, 64).to(d)),
    OpCase("neg-abs", lambda a: -a.abs(), (M,)),
    OpCase("reciprocal", torch.reciprocal, (M,), make=positive),
    OpCase("relu", torch.relu, (M,)),
    OpCase("gelu", F.gelu, (M,)),
    OpCase("gelu-tanh", lambda a: F.gelu(a, approximate="tanh"), (M,)),
    OpCase("silu", F.silu, (M,)),
    OpCase("clamp", lambda a: a.clamp(-0.5, 0.5), (M,)),
    OpCase("clamp-min", lambda a: a.clamp(min=0.1), (M,)),
    OpCase("maximum", torch.maximum, (M, M)),
    OpCase("where", lambda a, b: torch.where(a > 0, a, b), (M, M)),
    OpCase("where-scalar", lambda a: torch.where(a > 0, a, 0.0), (M,)),
    OpCase("compare", lambda a, b: (a < b) | (a >= 1.0), (M, M)),
    OpCase("eq-ne", lambda a: (a == 1) ^ (a != 2), (M,), dtypes=INT, make=integers),
    OpCase("logical-not", lambda a: ~(a > 0), (M,)),
    OpCase("int-arith", lambda a, b: a * b + a - 3, (M, M), dtypes=INT, make=integers),
    OpCase("bitwise", lambda a, b: (a & b) | (a ^ 3), (M, M), dtypes=INT, make=integers),
    OpCase("cast-to-int", lambda a: (a * 10).to(torch.int32), (M,), dtypes=F32),
    OpCase(
        "cast-to-bool",
        lambda a: a.to(torch.bool),
        (M,),
        dtypes=(torch.float32, torch.int32),
        make=integers,
    ),
    OpCase("cast-f32-to-bf16", lambda a: a.to(torch.bfloat16) * 2, (M,), dtypes=F32),
    OpCase("int-to-float", lambda a: a.float() / 3, (M,), dtypes=INT, make=integers),
    # shape
    OpCase("view-permute", lambda a: a.view(2, 2, 8).permute(2, 0, 1), (M,)),
    OpCase("transpose-contiguous", lambda a: a.t().contiguous() + 1, (M,)),
    OpCase("expand", lambda a: a.expand(3, 4, 8) * 2, ((4, 1),)),
    OpCase(
        "unsqueeze-squeeze", lambda a: a.unsqueeze(1).squeeze(1) + a.unsqueeze(-1).sum(-1), (M,)
    ),
    OpCase("slice", lambda a: a[1:3, ::2] + a[-2:, 1:5], (M,)),
    OpCase("select", lambda a: a[2] * a[:, -1].sum(), (M,)),
    OpCase("split", lambda a: torch.stack([t.sum(1) for t in a.split(3, dim=1)], 0), (M,)),
    OpCase("cat", lambda a, b: torch.cat([a, b * 2], dim=1), (M, (4, 3))),
    OpCase("pad", lambda a: F.pad(a, (1, 2, 0, 1), value=0.5), (M,)),
    OpCase(
        "arange-full", lambda a: a + torch.arange(8) + torch.full((4, 8), 2.0), (M,), dtypes=F32
    ),
    OpCase(
        "tril-mask",
        lambda a: a.masked_fill(torch.ones(4, 8).triu(1).bool(), float("-inf")).softmax(-1),
        (M,),
    ),
    # matmul
    OpCase("mm", torch.mm, ((4, 16), (16, 8))),
    OpCase("bmm", torch.bmm, ((2, 4, 16), (2, 16, 8))),
    OpCase(
        "addmm", lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2), ((8,), (4, 16), (16, 8))
    ),
    OpCase("linear-3d", F.linear, ((2, 3, 16), (8, 16), (8,))),
    OpCase("matmul-broadcast", torch.matmul, ((2, 3, 4, 16), (16, 5))),
    OpCase(
        "addmv",
        lambda b, m, v: torch.addmv(b, m, v, beta=0.5, alpha=2),
        ((4,), (4, 16), (16,)),
    ),
    OpCase(
        "addbmm",
        lambda b, x, y: torch.addbmm(b, x, y, beta=0.5, alpha=2),
        ((4, 5), (3, 4, 6), (3, 6, 5)),
    ),
    # reductions
    OpCase("sum", lambda a: a.sum(), ((6, 8),)),
    OpCase("sum-dim-keepdim", lambda a: a.sum(dim=(0, 2), keepdim=True), ((3, 4, 5),)),
    OpCase("mean", lambda a: a.mean(-1), ((3, 4, 5),)),
    OpCase("amax-amin", lambda a: a.amax(1) - a.amin(0).sum(), (M,)),
    OpCase("any-all", lambda a: (a > 0).any(1) & (a > -3).all(1), (M,), dtypes=F32),
    OpCase("var-std", lambda a: a.var(1) + a.std(0).sum(), (M,), dtypes=F32),
    OpCase("int-sum", lambda a: a.sum(1), (M,), dtypes=INT, make=integers),
    # normalization
    OpCase("softmax", lambda a: a.softmax(-1), ((4, 16),)),
    OpCase("log-softmax", lambda a: F.log_softmax(a, 0), ((4, 16),)),
    OpCase("layer-norm", lambda x, w, b: F.layer_norm(x, (16,), w, b), ((2, 4, 16), (16,), (16,))),
    OpCase("layer-norm-no-affine", lambda x: F.layer_norm(x, (4, 16)), ((2, 4, 16),)),
    # indexing
    OpCase("embedding", lambda w, i: F.embedding(i, w), ((10, 8), (3, 5)), make=(randn, idx(10))),
    OpCase("gather", lambda a, i: torch.gather(a, 1, i), (M, (4, 3)), make=(randn, idx(8))),
    OpCase(
        "index-select", lambda a, i: torch.index_select(a, 1, i), (M, (5,)), make=(randn, idx(8))
    ),
    OpCase("index-negative", lambda a, i: a[i], (M, (6,)), make=(randn, idx(4, -4))),
    OpCase("index-2d", lambda a, i, j: a[i, j], (M, (6,), (6,)), make=(randn, idx(4), idx(8))),
    OpCase(
        "index-put-accumulate",
        lambda a, i, v: a.index_put((i,), v, accumulate=True),
        (M, (6,), (6, 8)),
        dtypes=F32,
        make=(randn, idx(4), randn),
    ),
    OpCase(
        "index-put",
        lambda a, i, v: a.index_put((i,), v),
        (M, (2,), (8,)),
        dtypes=F32,
        make=(randn, lambda s, d: torch.tensor([3, 0]), randn),
    ),
    OpCase(
        "scatter",
        lambda a, i: a.scatter(1, i, 1.5),
        (M, (4, 2)),
        dtypes=F32,
        make=(randn, lambda s, d: torch.stack([torch.randperm(8)[:2] for _ in range(4)])),
    ),
    OpCase(
        "scatter-add",
        lambda a, i, u: a.scatter_add(0, i, u),
        (M, (3, 8), (3, 8)),
        dtypes=F32,
        make=(randn, idx(4), randn),
    ),
    OpCase(
        "cross-entropy",
        lambda x, t: F.cross_entropy(x, t),
        ((6, 10), (6,)),
        dtypes=F32,
        make=(randn, idx(10)),
    ),
    *COVERAGE_CASES,
    *SPECIAL_CASES,
    *BESSEL_POLY_CASES,
    *LINALG_CASES,
]

TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
}
