"""SPECIAL_CASES: special functions (lgamma, digamma, polygamma, zeta, Bessel I0/I1, erfcx, ndtri,
log_ndtr, incomplete gamma) against eager PyTorch's Cephes / libm kernels; part of ``cases.OP_CASES``.

Tolerances: our lowerings use XLA's float32 formulas (Lanczos for lgamma/digamma, Euler-Maclaurin
for zeta), which are accurate to a few float32 ulps in relative terms except next to the zeros of
lgamma (x = 1, 2) and digamma (x ~ 1.4616), where only the absolute error (~1e-6) is small: the
``atol`` terms cover those points. bf16 uses the shared bf16 tolerance (one rounding at the end).
"""

from __future__ import annotations

import math

import torch

from tests.lowering.opcase import OpCase

_N = 48


def _fixed(values: list[float]):
    """A maker returning ``values`` (cycled to the case shape) whatever the shape."""

    def make(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        t = torch.tensor(values * (n // len(values) + 1), dtype=torch.float64)[:n]
        return t.reshape(shape).to(dtype)

    return make


def _spread(lo: float, hi: float, extra: tuple[float, ...] | list[float] = ()):
    def make(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        base = torch.linspace(lo, hi, n - len(extra), dtype=torch.float64).tolist()
        return torch.tensor(base + list(extra), dtype=torch.float64).reshape(shape).to(dtype)

    return make


_INF, _NAN = math.inf, math.nan
# negative non-integers, poles, large and small magnitudes, signed zeros and non-finite values
_GAMMA_EXTRA = [0.0, -0.0, -1.0, -2.0, -2.5, -3.75, 1e-6, -1e-6, 1.0, 2.0, 1e4, 3e30, _INF, -_INF]
_GAMMA_EXTRA += [_NAN, -7.3, 0.5, 1.4616321]
_WIDE = _spread(-9.7, 12.3, _GAMMA_EXTRA)
_REAL = _spread(-12.0, 12.0, [0.0, -0.0, 40.0, -40.0, 95.0, 1e-7, _INF, -_INF, _NAN])
_PROB = _fixed(
    [0.0, 1.0, 0.5, 1e-30, 1e-20, 1e-12, 1e-8, 2e-7, 1e-6, 1e-3, 0.02, 0.1, 0.25, 0.3]
    + [0.4999, 0.7, 0.9, 0.975, 0.999, 0.9999, 1 - 1e-7, -0.5, 1.5, _NAN]
)
_POS = _spread(0.05, 30.0, [1e-6, 1e3, 1e9])

# eager has no bf16 kernel for zeta, erfcx, log_ndtr, ndtri: those cases are float32 only.
F32 = (torch.float32,)
F32_TOL = {torch.float32: (2e-5, 2e-6)}
# digamma near its root x0 = 1.4616: eager's float32 kernel itself is off by ~2e-4 relative there
# (measured against float64), and so is the Lanczos formula; elsewhere both agree to ~1e-6.
DIGAMMA_TOL = {torch.float32: (1e-4, 1e-5)}
SHAPE = ((_N,),)

SPECIAL_CASES: list[OpCase] = [
    OpCase("lgamma", torch.lgamma, SHAPE, make=_WIDE, tol=F32_TOL),
    OpCase("lgamma-positive", torch.special.gammaln, ((4, 8),), make=_POS, tol=F32_TOL),
    OpCase("digamma", torch.digamma, SHAPE, make=_WIDE, tol=DIGAMMA_TOL),
    OpCase(
        "mvlgamma",
        lambda a: torch.mvlgamma(a, 3),
        ((4, 8),),
        make=lambda s, d: (torch.rand(s) * 8 + 1.2).to(d),
        tol=F32_TOL,
    ),
    *[
        OpCase(
            f"polygamma-{n}",
            lambda a, n=n: torch.polygamma(n, a),
            SHAPE,
            make=_spread(-9.63, 9.71, [0.25, 1e-3, 7.5, -4.5, 1e3, -1e-3]),
            tol=DIGAMMA_TOL if n == 0 else F32_TOL,
        )
        for n in (0, 1, 2, 3, 4, 5)
    ],
    OpCase(
        "zeta",
        lambda s, q: torch.special.zeta(s, q),
        ((6, 8), (6, 8)),
        dtypes=F32,
        make=(_spread(1.1, 9.0, [1.0, 0.5, 3.0, 2.0]), _spread(0.1, 40.0, [1.0, -2.0, -2.5, 2e8])),
        tol={torch.float32: (2e-5, 1e-6)},
    ),
    OpCase(
        "zeta-scalar-q",
        lambda s: torch.special.zeta(s, 2.0),
        ((4, 8),),
        dtypes=F32,
        make=_spread(1.05, 30.0, [3.0, 1e9]),
        tol=F32_TOL,
    ),
    OpCase("i0", torch.i0, SHAPE, make=_REAL, tol=F32_TOL),
    OpCase("i0e", torch.special.i0e, SHAPE, make=_REAL, tol=F32_TOL),
    OpCase("i1", torch.special.i1, SHAPE, make=_REAL, tol=F32_TOL),
    OpCase("i1e", torch.special.i1e, SHAPE, make=_REAL, tol=F32_TOL),
    OpCase("erfcx", torch.special.erfcx, SHAPE, dtypes=F32, make=_REAL, tol=F32_TOL),
    OpCase("log-ndtr", torch.special.log_ndtr, SHAPE, dtypes=F32, make=_REAL, tol=F32_TOL),
    OpCase("ndtri", torch.special.ndtri, SHAPE, dtypes=F32, make=_PROB, tol=F32_TOL),
    OpCase(
        "igamma-igammac",
        lambda a, x: (torch.special.gammainc(a, x), torch.special.gammaincc(a, x)),
        ((6, 8), (6, 8)),
        dtypes=F32,
        make=(
            _spread(0.05, 40.0, [0.0, 0.0, 1.0, _INF, _INF, -1.0, 0.5, 150.0, 250.0]),
            _spread(0.01, 45.0, [1.0, 0.0, 0.0, 1.0, _INF, 1.0, 1e-3, 160.0, 300.0]),
        ),
        tol={torch.float32: (1e-4, 1e-6)},
    ),
]
