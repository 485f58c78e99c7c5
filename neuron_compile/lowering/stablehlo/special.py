"""Special functions: lgamma, digamma, polygamma, Hurwitz zeta, modified Bessel I0/I1, erfcx, ndtri.

The formulas are XLA's (xla/hlo/builder/lib/math.cc: ``Lgamma``/``Digamma`` via Lanczos,
``Zeta`` via Euler-Maclaurin, ``Polygamma`` with its reflection for negative arguments,
``BesselI0e``/``BesselI1e`` via Cephes' Chebyshev series) with the edge cases (poles, infinities,
domain errors) made to agree with PyTorch's CPU kernels (aten/src/ATen/native/Math.h). Every rule
computes in float32 for bf16/f16 and rounds once, like the rest of the transcendental rules.
"""

from __future__ import annotations

import math

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import (
    Ops,
    any_dtype,
    binary_formula,
    chbevl,
    float_unary,
    polynomial,
    unary_formula,
)
from .elementwise import ERFC_P, ERFC_R, erf
from .transcendental import ERFINV_LARGE, ERFINV_SMALL

aten = torch.ops.aten
_PI = math.pi

# Lanczos approximation, g = 7, n = 9 (XLA's kLanczosGamma / kLanczosCoefficients).
_LANCZOS_G = 7.0
_LANCZOS_BASE = 0.99999999999980993227684700473478
_LANCZOS = (
    676.520368121885098567009190444019, -1259.13921672240287047156078755283,
    771.3234287776530788486528258894, -176.61502916214059906584551354,
    12.507343278686904814458936853, -0.13857109526572011689554707,
    9.984369578019570859563e-6, 1.50563273514931155834e-7,
)  # fmt: skip


def _lanczos_z(o: Ops, x: Value) -> tuple[Value, Value]:
    """Reflect below 1/2: z = -x there, x - 1 otherwise (lgamma(z + 1) is what Lanczos gives)."""
    reflect = o.lt(x, 0.5)
    return reflect, o.e.select(reflect, o.negate(x), o.sub(x, 1.0))


def _log_t(o: Ops, z: Value) -> Value:
    # log(g + 1/2 + z) = log(g + 1/2) + log1p(z / (g + 1/2)): accurate on imprecise logs.
    gh = _LANCZOS_G + 0.5
    return o.add(o.log_plus_one(o.mul(z, 1.0 / gh)), math.log(gh))


def lgamma(o: Ops, x: Value) -> Value:
    """log|Gamma(x)| by Lanczos with the reflection below 1/2 (also the igamma prefactor)."""
    e = o.e
    reflect, z = _lanczos_z(o, x)
    acc = o.c(_LANCZOS_BASE)
    for i, coeff in enumerate(_LANCZOS):
        acc = o.add(acc, o.div(coeff, o.add(z, i + 1.0)))
    t = o.add(z, _LANCZOS_G + 0.5)
    log_y = o.add(o.sub(o.mul(o.add(z, 0.5), _log_t(o, z)), t), o.log(acc))
    log_y = o.add(log_y, 0.5 * math.log(2.0 * _PI))
    # lgamma(x) = log(pi) - lgamma(1 - x) - log|sin(pi x)|, with sin(pi * frac|x|) exactly 0 at
    # the poles so that they come out +inf (and not inf - inf).
    a = o.abs(x)
    denom = o.log(o.sine(o.mul(o.sub(a, o.floor(a)), _PI)))
    reflection = e.select(
        o.isfinite(denom), o.sub(o.sub(o.c(math.log(_PI)), denom), log_y), o.negate(denom)
    )
    y = e.select(reflect, reflection, log_y)
    return e.select(o.eq(a, math.inf), o.c(math.inf), y)  # lgamma(+-inf) = +inf


def _digamma(o: Ops, x: Value) -> Value:
    e = o.e
    reflect, z = _lanczos_z(o, x)
    num, den = o.c(0.0), o.c(_LANCZOS_BASE)
    for i, coeff in enumerate(_LANCZOS):
        zi = o.add(z, i + 1.0)
        term = o.div(coeff, zi)
        num = o.sub(num, o.div(term, zi))
        den = o.add(den, term)
    t = o.add(z, _LANCZOS_G + 0.5)
    y = o.sub(o.add(_log_t(o, z), o.div(num, den)), o.div(_LANCZOS_G, t))
    # digamma(x) = digamma(1 - x) - pi cot(pi x), with cot evaluated at the fractional part of x
    # (as eager does) so large |x| keeps its accuracy.
    frac = o.sub(x, _trunc(o, x))
    pr = o.mul(frac, _PI)
    reflected = o.sub(y, o.div(o.mul(o.cosine(pr), _PI), o.sine(pr)))
    y = e.select(reflect, reflected, y)
    # eager: digamma(+-0) = -+inf, NaN at the negative integers (and -inf).
    zero = o.eq(x, 0.0)
    neg_int = o.and_(o.lt(x, 0.0), o.eq(x, o.floor(x)))
    y = e.select(neg_int, o.c(math.nan), y)
    signed_inf = o.negate(e.select(o.lt(o.div(1.0, x), 0.0), o.c(-math.inf), o.c(math.inf)))
    return e.select(zero, signed_inf, y)


def _trunc(o: Ops, x: Value) -> Value:
    return o.e.select(o.lt(x, 0.0), o.ceil(x), o.floor(x))


# (2k)! / B_2k, reversed for Horner (XLA's kZetaCoeffs): the Euler-Maclaurin tail of zeta.
_ZETA_COEFFS = (
    -7.1661652561756670113e18, 1.8152105401943546773e17, -4.5979787224074726105e15,
    1.1646782814350067249e14, -2.950130727918164224e12, 7.47242496e10,
    -1.8924375803183791606e9, 47900160.0, -1209600.0, 30240.0, -720.0, 12.0,
)  # fmt: skip
_ZETA_N = 9


def _zeta(o: Ops, s: Value, q: Value, shift: int = 0) -> Value:
    """Hurwitz zeta(s, q) = sum_k (q + k)^-s (Johansson 2015, formula 5, as XLA's Zeta).
    ``shift`` sums that many leading terms first, so the expansion starts from q + shift."""
    e = o.e
    neg_s = o.negate(s)
    # Negative q (integer s only, as Cephes allows): (-b)^-s = (-1)^s b^-s; XLA's power of a
    # negative base is not exact for integer exponents.
    odd = o.eq(o.sub(s, o.mul(o.floor(o.mul(s, 0.5)), 2.0)), 1.0)

    def power(b: Value) -> Value:
        p = e.binary("power", o.abs(b), neg_s)
        return e.select(o.and_(o.lt(b, 0.0), odd), o.negate(p), p)

    if shift:  # zeta(s, q) = sum_{k < shift} (q + k)^-s + zeta(s, q + shift)
        head = power(q)
        for k in range(1, shift):
            head = o.add(head, power(o.add(q, float(k))))
        return o.add(head, _zeta(o, s, o.add(q, float(shift))))
    acc = q
    total = power(q)
    for _ in range(_ZETA_N):
        acc = o.add(acc, 1.0)
        total = o.add(total, power(acc))
    acc = o.add(acc, 1.0)
    neg_power = power(acc)
    integral = o.div(o.mul(neg_power, acc), o.sub(s, 1.0))
    inv_sq = o.div(1.0, o.mul(acc, acc))
    horner = o.c(0.0)
    m = len(_ZETA_COEFFS)
    for i in range(m - 1):
        k = 2 * m - 1
        factor = o.mul(o.add(s, float(k - 1 - 2 * i)), o.add(s, float(k - 2 - 2 * i)))
        horner = o.mul(o.mul(factor, inv_sq), o.add(horner, 1.0 / _ZETA_COEFFS[i]))
    tail = o.mul(o.div(s, acc), o.add(horner, 1.0 / _ZETA_COEFFS[-1]))
    accurate = o.add(o.add(total, integral), o.mul(neg_power, o.add(tail, 0.5)))
    eps = float(torch.finfo(torch.float32).eps)
    out = e.select(e.compare(o.abs(neg_power), o.mul(o.abs(total), eps), "LE"), total, accurate)
    # Cephes: beyond q = 1e8 the sum's q + k no longer moves in f32; use the asymptotic form.
    far = o.mul(
        o.add(o.div(1.0, o.sub(s, 1.0)), o.div(0.5, q)), e.binary("power", q, o.sub(1.0, s))
    )
    out = e.select(e.compare(q, o.c(1e8), "GT"), far, out)
    # Cephes (eager), first match wins: s == 1 -> inf, s < 1 -> NaN, then for q <= 0 a pole (inf)
    # at integer q and NaN for a non-integer s. Applied here from the last rule to the first.
    q_nonpos = e.compare(q, o.c(0.0), "LE")
    out = e.select(o.and_(q_nonpos, e.compare(s, o.floor(s), "NE")), o.c(math.nan), out)
    out = e.select(o.and_(q_nonpos, o.eq(q, o.floor(q))), o.c(math.inf), out)
    out = e.select(o.lt(s, 1.0), o.c(math.nan), out)
    return e.select(o.eq(s, 1.0), o.c(math.inf), out)


def _polygamma(o: Ops, n: int, x: Value) -> Value:
    """n >= 1: (-1)^(n+1) n! zeta(n + 1, x); for negative non-integer x and n <= 4, XLA's
    reflection psi^(n)(x) = -n! zeta(n + 1, 1 - x) - pi d^n/dx^n cot(pi x)."""
    e = o.e
    fact = float(math.factorial(n))
    direct = o.mul(_zeta(o, o.c(n + 1.0), x), fact if n % 2 else -fact)
    if n > 4:  # no reflection table: sum ten more terms first (exact for x >= -10)
        shifted = o.mul(_zeta(o, o.c(n + 1.0), x, shift=10), fact if n % 2 else -fact)
        return e.select(o.lt(x, 0.0), shifted, direct)
    reduced = o.add(x, o.abs(o.floor(o.add(x, 0.5))))  # period 1: shift next to zero
    pix = o.mul(reduced, _PI)
    # cos(pi r) = sin(pi (1/2 - |r|)): exactly 0 at the half-integers (f32 cos(pi/2) is not).
    s, c = o.sine(pix), o.sine(o.mul(o.sub(0.5, o.abs(reduced)), _PI))
    s2 = o.mul(s, s)
    if n == 1:
        g = o.div(-(_PI**2), s2)
    elif n == 2:
        g = o.div(o.mul(c, 2.0 * _PI**3), o.mul(s2, s))
    elif n == 3:
        cos2 = o.sub(1.0, o.mul(s2, 2.0))  # cos(2 pi r)
        g = o.div(o.mul(o.add(cos2, 2.0), -2.0 * _PI**4), o.mul(s2, s2))
    else:
        g = o.div(o.mul(o.mul(c, o.add(o.mul(c, c), 2.0)), 8.0 * _PI**5), o.mul(o.mul(s2, s2), s))
    reflected = o.sub(o.mul(_zeta(o, o.c(n + 1.0), o.sub(1.0, x)), -fact), g)
    use = o.and_(o.lt(x, 0.0), e.compare(x, o.floor(x), "NE"))
    return e.select(use, reflected, direct)


@lowering(aten.polygamma.default, supports=any_dtype)
def _lower_polygamma(ctx: LoweringContext, n: int, x: Value) -> Value:
    def body(v: Value) -> Value:
        o = Ops(ctx, v)
        return _digamma(o, v) if n == 0 else _polygamma(o, int(n), v)

    return float_unary(ctx, x, body)


binary_formula(
    (aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar),
    _zeta,
    name="zeta",
)


# ---- modified Bessel functions of the first kind (Cephes chbevl coefficients) ---------------
_I0E_A = (
    -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
    1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
    -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
    9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-9,
    -1.30002500998624804212e-8, 6.04699502254191894932e-8, -2.67079385394061173391e-7,
    1.11738753912010371815e-6, -4.41673835845875056359e-6, 1.64484480707288970893e-5,
    -5.75419501008210370398e-5, 1.88502885095841655729e-4, -5.76375574538582365885e-4,
    1.63947561694133579842e-3, -4.32430999505057594430e-3, 1.05464603945949983183e-2,
    -2.37374148058994688156e-2, 4.93052842396707084878e-2, -9.49010970480476444210e-2,
    1.71620901522208775349e-1, -3.04682672343198398683e-1, 6.76795274409476084995e-1,
)  # fmt: skip
_I0E_B = (
    -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
    3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
    1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
    -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
    7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
    -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
    3.39623202570838634515e-9, 2.26666899049817806459e-8, 2.04891858946906374183e-7,
    2.89137052083475648297e-6, 6.88975834691682398426e-5, 3.36911647825569408990e-3,
    8.04490411014108831608e-1,
)  # fmt: skip
_I1E_A = (
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
    -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
    3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
    -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-9,
    9.38153738649577178388e-9, -4.44505912879632808065e-8, 2.00329475355213526229e-7,
    -8.56872026469545474066e-7, 3.47025130813767847674e-6, -1.32731636560394358279e-5,
    4.78156510755005422638e-5, -1.61760815825896745588e-4, 5.12285956168575772895e-4,
    -1.51357245063125314899e-3, 4.15642294431288815669e-3, -1.05640848946261981558e-2,
    2.47264490306265168283e-2, -5.29459812080949914269e-2, 1.02643658689847095384e-1,
    -1.76416518357834055153e-1, 2.52587186443633654823e-1,
)  # fmt: skip
_I1E_B = (
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
    -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
    -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
    4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
    3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
    -3.83538038596423702205e-9, -2.63146884688951950684e-8, -2.51223623787020892529e-7,
    -3.88256480887769039346e-6, -1.10588938762623716291e-4, -9.76109749136146840777e-3,
    7.78576235018280120474e-1,
)  # fmt: skip


def bessel_i(o: Ops, x: Value, order: int, scaled: bool) -> Value:
    """I0/I1 (``scaled``: times exp(-|x|)). Below 8 a series in x/2 - 2, beyond one in 32/x - 2
    over sqrt(x); unscaled large values use exp(|x| - log(x)/2) so they overflow only when the
    function does."""
    e = o.e
    a = o.abs(x)
    ca, cb = (_I0E_A, _I0E_B) if order == 0 else (_I1E_A, _I1E_B)
    small = chbevl(o, o.sub(o.mul(a, 0.5), 2.0), ca)
    if order == 1:
        small = o.mul(small, a)
    large = chbevl(o, o.sub(o.div(32.0, a), 2.0), cb)
    if scaled:
        large = o.div(large, o.sqrt(a))
    else:
        small = o.mul(small, o.exponential(a))
        large = o.mul(large, o.exponential(o.sub(a, o.mul(o.log(a), 0.5))))
    y = e.select(e.compare(a, o.c(8.0), "LE"), small, large)
    if order == 1:
        y = e.select(o.lt(x, 0.0), o.negate(y), y)
    return y


unary_formula(aten.i0.default, lambda o, x: bessel_i(o, x, 0, scaled=False))
unary_formula(aten.special_i0e.default, lambda o, x: bessel_i(o, x, 0, scaled=True))
unary_formula(aten.special_i1.default, lambda o, x: bessel_i(o, x, 1, scaled=False))
unary_formula(aten.special_i1e.default, lambda o, x: bessel_i(o, x, 1, scaled=True))


# ---- erfcx, ndtri ----------------------------------------------------------------------------
# Cephes' f32 erfc tail (as elementwise.erfc): erfc(x) = exp(-x^2) / x * P(1 / x^2) for x > 1, so
# erfcx(x) = P(1 / x^2) / x with no exp at all; 2 exp(x^2) - P / |x| below -1.
def _erfcx(o: Ops, x: Value) -> Value:
    e, ctx = o.e, o.ctx
    a = o.abs(x)
    q = o.div(1.0, a)
    y = o.mul(q, q)
    p = e.select(o.lt(a, 2.0), polynomial(ctx, y, ERFC_P), polynomial(ctx, y, ERFC_R))
    tail = o.mul(q, p)
    exp_x2 = o.exponential(o.mul(x, x))
    negative = o.sub(o.mul(exp_x2, 2.0), tail)
    middle = o.mul(exp_x2, o.sub(1.0, erf(ctx, x)))
    out = e.select(e.compare(x, o.c(1.0), "GT"), tail, middle)
    out = e.select(o.lt(x, -1.0), negative, out)
    return e.select(o.eq(x, math.inf), o.c(0.0), out)


def _ndtri_tail(o: Ops, p: Value) -> Value:
    """ndtri for tiny p, where Giles' f32 polynomial (fit for w <= 16) no longer holds: with
    t = -ndtri(p) and ndtr(-t) = exp(-t^2 / 2) erfcx(t / sqrt 2) / 2, iterate
    t = sqrt(-2 log p + 2 log(erfcx(t / sqrt 2) / 2)), which contracts by about 1/t^2 per step."""
    a = o.mul(o.log(p), -2.0)
    t = o.sqrt(a)
    for _ in range(_NDTRI_TAIL_STEPS):
        lg = o.log(o.mul(_erfcx(o, o.mul(t, 1.0 / math.sqrt(2.0))), 0.5))
        t = o.sqrt(o.add(a, o.mul(lg, 2.0)))
    return o.negate(t)


_NDTRI_TAIL_STEPS = 5
_NDTRI_TAIL_BELOW = 1e-7  # w = -log(4p) > 14.7 from here on


def _ndtri(o: Ops, p: Value) -> Value:
    """ndtri(p) = sqrt(2) erfinv(2p - 1) with Giles' erfinv, whose argument w = -log(1 - x^2) is
    taken as -log(4 p (1 - p)) so that small p keeps full relative precision."""
    e = o.e
    x = o.sub(o.mul(p, 2.0), 1.0)
    w = o.negate(o.add(o.log(o.mul(p, 4.0)), o.log_plus_one(o.negate(p))))
    # transcendental._erfinv forms w from x itself; its polynomial here takes the accurate w.
    small = o.lt(w, 5.0)
    w = e.select(small, o.sub(w, 2.5), o.sub(o.sqrt(w), 3.0))
    poly = e.select(small, o.c(ERFINV_SMALL[0]), o.c(ERFINV_LARGE[0]))
    for lo, hi in zip(ERFINV_SMALL[1:], ERFINV_LARGE[1:], strict=True):
        poly = o.add(o.mul(poly, w), e.select(small, o.c(lo), o.c(hi)))
    y = o.mul(o.mul(poly, x), math.sqrt(2.0))
    tiny = o.lt(p, _NDTRI_TAIL_BELOW)
    y = e.select(tiny, _ndtri_tail(o, e.select(tiny, p, o.c(_NDTRI_TAIL_BELOW))), y)
    y = e.select(o.eq(p, 0.0), o.c(-math.inf), y)
    y = e.select(o.eq(p, 1.0), o.c(math.inf), y)
    out_of_domain = o.or_(o.lt(p, 0.0), e.compare(p, o.c(1.0), "GT"))
    return e.select(out_of_domain, o.c(math.nan), y)


unary_formula(aten.lgamma.default, lgamma)
unary_formula(aten.digamma.default, _digamma)
unary_formula(aten.special_erfcx.default, _erfcx)
unary_formula(aten.special_ndtri.default, _ndtri)
