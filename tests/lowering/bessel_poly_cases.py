"""BESSEL_POLY_CASES: Bessel functions, Airy Ai and the orthogonal polynomials against eager's
Cephes-derived CPU kernels; part of ``cases.OP_CASES``. Float32 only (eager has no bf16 kernels
for most of them).

The inputs cross every branch point of eager's kernels: the series / asymptotic switch of J and Y
at 5, of K at 2, of Ai at +-2.09 and 8.32; poles and NaN domains at 0 and below; infinities. The
polynomial degrees cover n < 0, 0, 1, the trigonometric closed forms beyond 6 / 8 and the x = +-1
(shifted: x = 0, 1) special cases, with per-element degrees broadcast against x.
"""

from __future__ import annotations

import math

import torch

from tests.lowering.opcase import F32, OpCase
from tests.lowering.special_cases import F32_TOL, _spread

_INF, _NAN = math.inf, math.nan
_BESSEL_X = _spread(
    -12.0, 12.0, [0.0, -0.0, 1e-6, 2.0, 5.0, 8.0, 2.09, -2.09, 8.33, 40.0, 104.0, _INF, -_INF, _NAN]
)
# Airy Ai oscillates with growing frequency below -2: absolute error of a few ulps of 1.
AIRY_TOL = {torch.float32: (2e-5, 5e-6)}

_BESSEL_FNS = (
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "modified_bessel_i0",
    "modified_bessel_i1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "spherical_bessel_j0",
)

_POLYS = (
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
)


def _poly_x(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """(41, 1): a grid over [-1.5, 1.5] plus the special points."""
    grid = torch.linspace(-1.5, 1.5, 31).tolist() + [1.0, -1.0, 0.0, 0.5, 2.0, -2.0, 0.25]
    grid += [0.999, -0.999, 3.0]
    return torch.tensor(grid, dtype=dtype).reshape(shape)


def _degrees(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """(16,): negative, fractional (truncated), small and trigonometric-range degrees."""
    n = [-1.0, 0.0, 1.0, 2.0, 3.0, 4.7, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 13.0, -2.5, 20.0, 200.0]
    return torch.tensor(n, dtype=dtype).reshape(shape)


# relative: the recurrences grow like 2^n x^n for |x| > 1 (large values, same operations);
# absolute: at n = 200 the closed form cos(n acos x) takes an argument up to ~630, whose float32
# rounding alone moves the O(1) result by ~4e-5 (eager's own error vs float64 is as large).
POLY_TOL = {torch.float32: (1e-4, 1e-4)}

BESSEL_POLY_CASES: list[OpCase] = [
    *[
        OpCase(
            name.replace("_", "-"),
            getattr(torch.special, name),
            ((60,),),
            dtypes=F32,
            make=_BESSEL_X,
            tol=F32_TOL,
        )
        for name in _BESSEL_FNS
    ],
    OpCase(
        "airy-ai",
        torch.special.airy_ai,
        ((80,),),
        dtypes=F32,
        make=_spread(-12.0, 12.0, [2.09, -2.09, 8.32, 8.33, 103.0, 104.0, _INF, -_INF, _NAN, 0.0]),
        tol=AIRY_TOL,
    ),
    *[
        OpCase(
            name.replace("_", "-"),
            getattr(torch.special, name),
            ((41, 1), (16,)),
            dtypes=F32,
            make=(_poly_x, _degrees),
            tol=POLY_TOL,
        )
        for name in _POLYS
    ],
    OpCase(
        "chebyshev-t-scalar-n",
        lambda x: torch.special.chebyshev_polynomial_t(x, 7),
        ((41, 1),),
        dtypes=F32,
        make=_poly_x,
        tol=POLY_TOL,
    ),
    OpCase(
        "legendre-p-scalar-x",
        lambda n: torch.special.legendre_polynomial_p(0.3, n),
        ((16,),),
        dtypes=F32,
        make=_degrees,
        tol=POLY_TOL,
    ),
]
