"""COVERAGE_CASES: the op-coverage part of the OP_CASES table (issue 3), kept in its own file so
neither file outgrows the line budget; ``cases.OP_CASES`` includes every entry. Each entry runs
through our lowering only (``run_lowered`` uses ``fallback="error"``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tests.lowering.opcase import (
    CAST_DTYPES,
    F32,
    F32_BF16_INT,
    INT,
    M,
    OpCase,
    cast_source,
    distinct,
    idx,
    integers,
    positive,
    randn,
    special,
    ties,
    unit,
    with_nan,
)

COVERAGE_CASES: list[OpCase] = [
    # reductions
    OpCase("prod-dim", lambda a: a.prod(1), (M,)),
    OpCase("prod-all", lambda a: a.prod(), ((3, 4),), dtypes=(*F32, *INT), make=integers),
    OpCase("prod-keepdim", lambda a: a.prod(0, keepdim=True), (M,), dtypes=INT, make=integers),
    OpCase("argmax-dim", lambda a: a.argmax(1), (M,), dtypes=F32_BF16_INT, make=ties),
    OpCase(
        "argmin-keepdim", lambda a: a.argmin(0, keepdim=True), (M,), dtypes=F32_BF16_INT, make=ties
    ),
    OpCase("argmax-flat", lambda a: a.argmax(), (M,)),
    OpCase(
        "argmax-argmin-nan", lambda a: (a.argmax(1), a.argmin(1)), (M,), dtypes=F32, make=with_nan
    ),
    OpCase("max-dim", lambda a: a.max(1), (M,), dtypes=F32_BF16_INT, make=ties),
    OpCase(
        "min-dim-keepdim", lambda a: a.min(0, keepdim=True), (M,), dtypes=F32_BF16_INT, make=ties
    ),
    OpCase("max-dim-nan", lambda a: a.max(1), (M,), dtypes=F32, make=with_nan),
    OpCase("logsumexp", lambda a: a.logsumexp(1), (M,)),
    OpCase("var-mean", lambda a: torch.var_mean(a, 1), (M,)),
    OpCase("std-mean-all", lambda a: torch.std_mean(a, correction=0), (M,), dtypes=F32),
    OpCase(
        "vector-norm-ords",
        lambda a: [
            torch.linalg.vector_norm(a, o, 1) for o in (2, 1, 3, 0.5, 0, math.inf, -math.inf)
        ],
        (M,),
    ),
    OpCase("normalize", F.normalize, (M,)),
    # scans
    OpCase("cumsum", lambda a: a.cumsum(1), (M,), dtypes=F32_BF16_INT, make=integers),
    OpCase("cumsum-randn", lambda a: a.cumsum(0), (M,)),
    OpCase(
        "cumsum-dtype", lambda a: a.cumsum(1, dtype=torch.float32), (M,), dtypes=(torch.bfloat16,)
    ),
    OpCase("cumprod", lambda a: a.cumprod(1), (M,)),
    OpCase("cummax", lambda a: a.cummax(1), (M,), dtypes=F32_BF16_INT, make=ties),
    OpCase("cummin", lambda a: a.cummin(0), (M,), dtypes=F32_BF16_INT, make=ties),
    OpCase("cummax-nan", lambda a: a.cummax(1), (M,), dtypes=F32, make=with_nan),
    OpCase("logcumsumexp", lambda a: a.logcumsumexp(1), (M,)),
    # sorting
    OpCase("sort", lambda a: a.sort(1), (M,), dtypes=F32_BF16_INT, make=distinct),
    OpCase("sort-descending", lambda a: a.sort(0, descending=True), (M,), make=distinct),
    OpCase(
        "sort-stable-ties",
        lambda a: a.sort(dim=1, stable=True),
        (M,),
        dtypes=F32_BF16_INT,
        make=ties,
    ),
    OpCase(
        "sort-stable-ties-desc",
        lambda a: a.sort(dim=1, stable=True, descending=True),
        (M,),
        dtypes=F32,
        make=ties,
    ),
    OpCase(
        "sort-nan",
        lambda a: (*a.sort(dim=1, stable=True), *a.sort(dim=1, stable=True, descending=True)),
        (M,),
        dtypes=F32,
        make=with_nan,
    ),
    OpCase("argsort", lambda a: a.argsort(1), (M,), dtypes=F32_BF16_INT, make=distinct),
    OpCase("topk", lambda a: a.topk(3, 1), (M,), dtypes=F32_BF16_INT, make=distinct),
    OpCase("topk-smallest", lambda a: a.topk(2, 0, largest=False), (M,), make=distinct),
    OpCase("kthvalue", lambda a: a.kthvalue(3, 1), (M,), dtypes=F32_BF16_INT, make=distinct),
    OpCase("median-dim", lambda a: a.median(1), (M,), dtypes=F32_BF16_INT, make=distinct),
    OpCase("median-all", lambda a: a.median(), (M,), make=distinct),
    OpCase(
        "median-nanmedian-nan",
        lambda a: (*a.median(1), *a.nanmedian(1), a.nanmedian()),
        (M,),
        dtypes=F32,
        make=with_nan,
    ),
    OpCase(
        "bucketize",
        lambda a, b: (torch.bucketize(a, b), torch.bucketize(a, b, right=True, out_int32=True)),
        (M, (4,)),
        dtypes=(*F32, torch.int32),
        make=(integers, lambda s, d: torch.tensor([-2, 0, 1, 3]).to(d)),
    ),
    OpCase(
        "searchsorted",
        lambda b, a: (torch.searchsorted(b, a), torch.searchsorted(b, a, side="right")),
        ((4, 5), (4, 3)),
        dtypes=F32,
        make=(lambda s, d: torch.randn(s).sort(-1).values, special),
    ),
    # elementwise math
    OpCase("atan2", torch.atan2, (M, M)),
    OpCase("atan2-int", torch.atan2, (M, M), dtypes=(torch.int32,), make=integers),
    OpCase("fmod", lambda a, b: torch.fmod(a * 4, b), (M, M)),
    OpCase("fmod-scalar", lambda a: torch.fmod(a * 4, -1.5), (M,)),
    OpCase("fmod-int", lambda a: torch.fmod(a, 3), (M,), dtypes=INT, make=integers),
    OpCase("remainder", lambda a, b: torch.remainder(a * 4, b), (M, M)),
    OpCase("remainder-scalar", lambda a: torch.remainder(a * 4, -1.5), (M,)),
    OpCase(
        "remainder-int", lambda a: (a % 3, a % -3), (M,), dtypes=(*INT, torch.int8), make=integers
    ),
    OpCase("remainder-rscalar", lambda a: torch.remainder(7, a), (M,), dtypes=INT, make=idx(6, 1)),
    OpCase("trunc", lambda a: torch.trunc(a * 3), (M,)),
    OpCase("frac", lambda a: torch.frac(a * 3), (M,)),
    OpCase("sign", torch.sign, (M,), make=special),
    OpCase("sign-int", torch.sign, (M,), dtypes=(*INT, torch.int8), make=integers),
    OpCase("signbit", torch.signbit, (M,), dtypes=(*F32, torch.bfloat16), make=special),
    OpCase(
        "isinf-isnan-isfinite",
        lambda a: (a.isinf(), a.isnan(), a.isfinite()),
        (M,),
        dtypes=(*F32, torch.bfloat16),
        make=special,
    ),
    OpCase("copysign", lambda a, b: torch.copysign(a, b), (M, M), make=(randn, special)),
    OpCase(
        "fmax-fmin",
        lambda a, b: (torch.fmax(a, b), torch.fmin(a, b)),
        (M, M),
        make=(special, with_nan),
    ),
    OpCase("hypot", torch.hypot, (M, M)),
    OpCase("lerp-scalar", lambda a, b: torch.lerp(a, b, 0.3), (M, M)),
    OpCase("lerp-tensor", lambda a, b, w: torch.lerp(a, b, w), (M, M, M), dtypes=F32),
    OpCase(
        "logical-or-xor",
        lambda a, b: (a.logical_or(b), a.logical_xor(b)),
        (M, M),
        dtypes=(*F32, torch.int32),
        make=integers,
    ),
    OpCase(
        "shifts",
        lambda a: (a << 3, a >> 1),
        (M,),
        dtypes=(torch.int32, torch.int64, torch.int8, torch.uint8),
        make=integers,
    ),
    OpCase(
        "shifts-tensor",
        lambda a, b: (a << b, a >> b),
        (M, M),
        dtypes=(torch.int32,),
        # int32 amounts up to 39: shifting by >= the bit width gives 0 / the sign, as in eager
        make=(integers, lambda s, d: torch.randint(0, 40, s, dtype=d)),
    ),
    OpCase(
        "bitwise-shift-functions",
        lambda a, b: (torch.bitwise_left_shift(a, b), torch.bitwise_right_shift(a, 2)),
        (M, M),
        dtypes=(torch.int32, torch.int16, torch.uint8),
        make=(integers, lambda s, d: torch.randint(0, 8, s).to(d)),
    ),
    OpCase("copysign-scalar", lambda a: torch.copysign(a, -1.0), (M,)),
    OpCase("tan", torch.tan, (M,)),
    OpCase("atan", torch.atan, (M,), make=special),
    OpCase("asin-acos", lambda a: (torch.asin(a), torch.acos(a)), (M,), make=unit),
    OpCase("sinh-cosh", lambda a: (torch.sinh(a * 3), torch.cosh(a * 3)), (M,)),
    OpCase(
        "sinh-cosh-special",
        lambda a: (torch.sinh(a), torch.cosh(a)),
        (M,),
        dtypes=F32,
        make=special,
    ),
    OpCase("asinh", lambda a: torch.asinh(a * 10), (M,)),
    OpCase("acosh", lambda a: torch.acosh(a * 10 + 1), (M,), make=positive),
    OpCase("atanh", torch.atanh, (M,), make=unit),
    OpCase("log2-log10", lambda a: (torch.log2(a * 10), torch.log10(a * 10)), (M,), make=positive),
    OpCase("exp2", torch.exp2, (M,)),
    OpCase("erfinv", torch.erfinv, (M,), make=unit),
    OpCase("erfc", torch.erfc, ((64,),), make=lambda s, d: torch.linspace(-6, 6, 64).to(d)),
    OpCase(
        "round-decimals",
        lambda a: (torch.round(a * 100, decimals=2), torch.round(a * 1000, decimals=-2)),
        (M,),
        dtypes=F32,
    ),
    OpCase("angle", torch.angle, (M,), dtypes=(*F32, torch.int32), make=special),
    OpCase("ldexp", torch.ldexp, (M, M), dtypes=F32, make=(randn, integers)),
    # activations (elu/leaky_relu/hardtanh lowered; the others reach us decomposed)
    OpCase("elu", F.elu, (M,)),
    OpCase("selu-celu", lambda a: (F.selu(a), F.celu(a, 0.5)), (M,)),
    OpCase("leaky-relu", lambda a: F.leaky_relu(a, 0.2), (M,)),
    OpCase("hardtanh-relu6", lambda a: (F.hardtanh(a), F.relu6(a * 4)), (M,)),
    OpCase("hardswish-hardsigmoid", lambda a: (F.hardswish(a * 3), F.hardsigmoid(a * 3)), (M,)),
    OpCase("mish", F.mish, (M,)),
    OpCase("softplus", lambda a: (F.softplus(a), F.softplus(a * 10, beta=2, threshold=5)), (M,)),
    OpCase("softsign-logsigmoid", lambda a: (F.softsign(a), F.logsigmoid(a)), (M,)),
    OpCase("glu", lambda a: F.glu(a, 1), (M,)),
    # casts: every supported dtype to every other one
    OpCase(
        "cast-all-pairs",
        lambda a: [a.to(d) for d in CAST_DTYPES if d != a.dtype],
        ((64,),),
        dtypes=CAST_DTYPES,
        make=cast_source,
    ),
    # shape
    OpCase("flip", lambda a: a.flip(0, 1), (M,), dtypes=F32_BF16_INT, make=integers),
    OpCase("roll", lambda a: a.roll((1, -3), (0, 1)), (M,)),
    OpCase("rot90", lambda a: a.rot90(), (M,)),
    OpCase("repeat", lambda a: a.repeat(2, 1, 3), (M,), dtypes=(*F32, torch.int32), make=integers),
    OpCase("unfold", lambda a: a.unfold(1, 3, 2), (M,)),
    OpCase("diagonal", lambda a: [a.diagonal(o) for o in (0, 2, -1, -3)], (M,)),
    OpCase("diagonal-3d", lambda a: a.diagonal(1, 2, 0), ((3, 4, 5),)),
    OpCase("diag-embed", torch.diag_embed, ((2, 3),)),
    OpCase(
        "tril-triu",
        lambda a: (a.tril(), a.triu(2), a.tril(-1)),
        (M,),
        dtypes=F32_BF16_INT,
        make=integers,
    ),
    OpCase("stack", lambda a, b: torch.stack([a, b], 1), (M, M)),
    OpCase("slice-scatter", lambda a, b: torch.slice_scatter(a, b, 1, 1, 8, 3), (M, (4, 3))),
    OpCase("select-scatter", lambda a, b: torch.select_scatter(a, b, 0, -1), (M, (8,))),
    OpCase("diagonal-scatter", lambda a, b: torch.diagonal_scatter(a, b, 1), (M, (4,))),
    OpCase(
        "tril-triu-indices",
        lambda a: (
            a[torch.tril_indices(4, 4, -1).unbind()],
            a[torch.triu_indices(4, 8, 2).unbind()],
        ),
        (M,),
    ),
    OpCase(
        "replication-pad2d-backward",
        lambda g, x: torch.ops.aten.replication_pad2d_backward(g, x, [1, 2, 0, 3]),
        ((2, 3, 7, 8), (2, 3, 4, 5)),
    ),
    OpCase(
        "replication-pad2d-backward-cropping",
        lambda g, x: torch.ops.aten.replication_pad2d_backward(g, x, [-1, 2, 1, -2]),
        ((2, 3, 3, 6), (2, 3, 4, 5)),
        dtypes=F32,
    ),
    OpCase(
        "replication-pad3d-backward",
        lambda g, x: torch.ops.aten.replication_pad3d_backward(g, x, [1, 0, 2, 1, 1, 1]),
        ((1, 2, 5, 6, 6), (1, 2, 3, 3, 5)),
        dtypes=F32,
    ),
    # indexing
    OpCase("index-inner-dim", lambda a, i: a[:, i], (M, (3, 2)), make=(randn, idx(8, -8))),
    OpCase(
        "index-non-adjacent",
        lambda a, i, j: a[:, i, :, j],
        ((2, 3, 4, 5), (4, 1), (3,)),
        make=(randn, idx(3), idx(5)),
    ),
    OpCase(
        "index-put-inner-accumulate",
        lambda a, i, v: torch.ops.aten.index_put(a, [None, i], v, True),
        (M, (5,), (4, 5)),
        dtypes=F32,
        make=(randn, idx(8), randn),
    ),
    OpCase(
        "index-put-bool-mask",
        lambda a, m, v: (
            torch.ops.aten.index_put(a, [a > 0], torch.tensor(0.5)),
            torch.ops.aten.index_put(a, [m > 0], v),
            torch.ops.aten.index_put(a, [None, m.sum(0) > 0], v.expand(4, 4) * 2, True),
        ),
        (M, (4, 8), (4,)),
        make=(randn, lambda s, d: torch.eye(*s).to(d), randn),
    ),
    OpCase(
        "masked-scatter",
        lambda a, m, s: a.masked_scatter(m > 0, s),
        (M, (8,), (5, 8)),
        dtypes=(*F32, torch.bfloat16, torch.int32),
        make=(integers, randn, integers),
    ),
    OpCase(
        "scatter-reduce",
        lambda a, i, s: [
            a.scatter_reduce(1, i, s, r, include_self=inc)
            for r in ("sum", "prod", "mean", "amax", "amin")
            for inc in (True, False)
        ],
        (M, (4, 5), (4, 6)),
        dtypes=(*F32, torch.int32),
        make=(integers, idx(8), integers),
    ),
    OpCase(
        "scatter-reduce-amax-bf16",
        lambda a, i, s: a.scatter_reduce(0, i, s, "amax", include_self=False),
        (M, (3, 8), (3, 8)),
        dtypes=(torch.bfloat16,),
        make=(randn, idx(4), randn),
    ),
    OpCase(
        "index-reduce",
        lambda a, s: [
            a.index_reduce(0, torch.tensor([0, 0, 3, 1, 3]), s, r, include_self=inc)
            for r in ("prod", "mean", "amax", "amin")
            for inc in (True, False)
        ],
        (M, (5, 8)),
        dtypes=(*F32, torch.int32),
        make=integers,
    ),
    OpCase(
        "put-take",
        lambda a, s: (
            a.put(torch.tensor([1, -5, 30]), s),
            a.put(torch.tensor([1, 1, -1]), s, accumulate=True),
            a.take(torch.tensor([[1, 5], [-1, 0]])),
        ),
        (M, (3,)),
    ),
    OpCase(
        "narrow-copy-as-strided",
        lambda a: (a.narrow_copy(1, -5, 3), a.as_strided((3, 3), (1, 2), 2)),
        (M,),
    ),
    OpCase(
        "take-along-dim",
        lambda a, i: torch.take_along_dim(a, i, 1),
        (M, (4, 3)),
        make=(randn, idx(8)),
    ),
    OpCase("reflection-pad", lambda a: F.pad(a, (1, 2, 2, 1), mode="reflect"), ((2, 3, 5, 6),)),
    OpCase("replication-pad", lambda a: F.pad(a, (1, 2, 2, 1), mode="replicate"), ((2, 3, 5, 6),)),
    OpCase("im2col", lambda a: F.unfold(a, 2, stride=2), ((2, 3, 4, 6),)),
    OpCase(
        "upsample-nearest", lambda a: F.interpolate(a, size=(7, 9), mode="nearest"), ((2, 3, 4, 5),)
    ),
    OpCase("pixel-shuffle", lambda a: F.pixel_shuffle(a, 2), ((1, 8, 3, 3),)),
    # pooling beyond 2-D max/avg
    OpCase(
        "max-pool3d",
        lambda a: F.max_pool3d(
            a, (2, 3, 2), (2, 2, 1), (1, 1, 0), ceil_mode=True, return_indices=True
        ),
        ((2, 3, 6, 7, 5),),
    ),
    OpCase(
        "avg-pool3d",
        lambda a: F.avg_pool3d(a, (2, 3, 2), (2, 2, 1), (1, 1, 0), True, count_include_pad=False),
        ((2, 3, 6, 7, 5),),
        dtypes=F32,  # eager has no bf16 avg_pool3d on CPU
    ),
    OpCase("pool1d", lambda a: (F.avg_pool1d(a, 3, 2, 1), F.max_pool1d(a, 2)), ((2, 3, 8),)),
    OpCase(
        "adaptive-max-pool2d",
        lambda a: F.adaptive_max_pool2d(a, (3, 4), return_indices=True),
        ((2, 3, 7, 9),),
    ),
    OpCase(
        "adaptive-max-pool2d-ties",
        lambda a: F.adaptive_max_pool2d(a, (2, 3), return_indices=True),
        ((2, 3, 5, 7),),
        dtypes=F32,
        make=ties,
    ),
    # distances (eager has float32/float64 kernels only)
    OpCase(
        "cdist",
        lambda a, b: [torch.cdist(a, b, p) for p in (2.0, 1.0, 0.5, math.inf)],
        ((2, 5, 3), (2, 4, 3)),
        dtypes=F32,
    ),
    OpCase(
        "pdist", lambda a: (F.pdist(a), F.pdist(a, 1.0), F.pdist(a, 3.0)), ((5, 3),), dtypes=F32
    ),
    # normalization
    OpCase("group-norm", lambda x, w, b: F.group_norm(x, 3, w, b), ((2, 6, 5, 4), (6,), (6,))),
    OpCase("group-norm-no-affine", lambda x: F.group_norm(x, 2), ((2, 6, 7),)),
    OpCase("instance-norm", F.instance_norm, ((2, 3, 4, 5),), dtypes=F32),
]

# Float bit patterns, copies, dist, 3-D adaptive pooling, batch norm with running-stat updates.
_BITS = [0.0, -0.0, 1.0, 0.75, -5.0, 3e38, 1e-38, 1.17549435e-38, 1e-40, -3e-45]
_BITS += [math.inf, -math.inf, math.nan]
COVERAGE_CASES += [
    OpCase(
        "frexp-subnormal-special",
        torch.frexp,
        ((4, 4),),
        dtypes=F32,
        make=lambda s, d: torch.tensor((_BITS + [2.5, -0.1, 7.0])[:16], dtype=d).reshape(s),
    ),
    OpCase(
        "nextafter",
        torch.nextafter,
        ((2, 6), (2, 6)),
        dtypes=F32,
        make=(
            lambda s, d: torch.tensor(
                [[0.0, -0.0, 1.0, 1.0, math.nan, math.inf], [-1e-45, 1e-40, 2.0, -3.0, 5.0, -2.0]],
                dtype=d,
            ),
            lambda s, d: torch.tensor(
                [[-1.0, 1.0, 2.0, 0.0, 1.0, 0.0], [1.0, 0.0, 2.0, -4.0, -math.inf, math.nan]],
                dtype=d,
            ),
        ),
    ),  # fmt: skip
    OpCase(
        "dist-p",
        lambda a, b: [torch.dist(a, b, p) for p in (2, 1, 3.5, 0, math.inf, -math.inf)],
        ((3, 4, 5), (4, 1)),
        dtypes=F32,
    ),
    OpCase("permute-copy", lambda a: torch.permute_copy(a, (2, 0, 1)), ((2, 3, 4),)),
    OpCase("unbind-copy", lambda a: torch.unbind_copy(a, -2), ((2, 3, 4),)),
    OpCase(
        "adaptive-avg-pool3d",
        lambda a: (F.adaptive_avg_pool3d(a, (2, 3, 4)), F.adaptive_avg_pool3d(a, 1)),
        ((2, 3, 5, 7, 6),),
        dtypes=F32,
    ),
    OpCase(
        "adaptive-max-pool3d",
        lambda a: F.adaptive_max_pool3d(a, (2, 3, 4), return_indices=True),
        ((3, 5, 7, 6),),
        dtypes=F32,
    ),
    OpCase(
        "batch-norm-with-update",
        lambda x, w, b, rm, rv: torch.ops.aten._batch_norm_with_update_functional(
            x, w, b, rm, rv, 0.3, 1e-5
        ),
        ((4, 3, 5), (3,), (3,), (3,), (3,)),
        dtypes=F32,
        make=(randn, randn, randn, randn, positive),
    ),
]

COVERAGE_CASES += [
    OpCase(
        "as-strided-scatter",
        lambda a, b: torch.as_strided_scatter(a, b, (3, 2), (4, 1), 2),
        ((4, 4), (3, 2)),
    ),
    OpCase(
        "nonzero-static",
        lambda a: (
            torch.nonzero_static(a, size=20),
            torch.nonzero_static(a, size=3, fill_value=9),
        ),
        ((3, 4, 2),),
        dtypes=(*F32, torch.int32, torch.bool),
        make=lambda s, d: torch.randint(0, 2, s).to(d),
    ),
    OpCase(
        "bilinear",
        F.bilinear,
        ((5, 3), (5, 4), (6, 3, 4), (6,)),
        dtypes=F32,
    ),
    OpCase(
        "mode",
        lambda a: (torch.mode(a, 1).values, torch.mode(a, 0, keepdim=True).values),
        ((4, 9),),
        dtypes=(torch.int32, torch.int16),  # floats run eagerly (NaN: eager's sort decides)
        make=ties,
    ),
]

# Regression: a tensor bound larger than x (clamp broadcasts all three operands).
COVERAGE_CASES.append(
    OpCase("clamp-max-broadcast-bound", torch.clamp_max, ((10, 1, 5), (10, 10, 5)), dtypes=F32)
)
