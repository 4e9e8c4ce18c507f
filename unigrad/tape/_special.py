"""Special functions on the tape: SciPy's values, with derivative rules written in traced ops.

Each rule is the derivative's own special function (``gammaln' = digamma``, ``digamma' = polygamma(1)``,
``polygamma(n)' = polygamma(n + 1)``...), so derivatives of any order work. SciPy computes the values:
it is imported the first time one of them runs (``unigrad.special`` on the tape), never with the tape.
SciPy's ufuncs called on traced values (``scipy.special.gammaln(x)`` inside ``f``) dispatch to these
primitives too (:func:`scipy_ufuncs`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from . import _functions as xp
from . import _primitives as P
from ._primitives import defprim

_SQRT_PI_2 = math.sqrt(math.pi) / 2
_TWO_SQRT_PI = 2 / math.sqrt(math.pi)
_SQRT_2PI = math.sqrt(2 * math.pi)


def _scipy():
    from scipy import special  # SciPy only where a special function runs: the extra unigrad[special]

    return special


def _value(name):
    """SciPy's ``name``, called when the primitive runs."""
    def impl(x):
        return getattr(_scipy(), name)(x)
    impl.__name__ = name
    return impl


def _unary(name, impl, dfdx):
    """An elementwise primitive with derivative ``dfdx(ans, x)``; not a namespace export (``elementwise``
    off: the namespace is the Array API's), and SciPy's ufunc dispatches to it."""
    return defprim(f"special.{name}", impl, vjp=(lambda g, ans, x: g * dfdx(ans, x),),
                   jvp=(lambda t, ans, x: t * dfdx(ans, x),), elementwise=False, ufunc=False)


def _polygamma_impl(x, *, n):
    return _scipy().polygamma(n, x).astype(np.result_type(x), copy=False)


polygamma_prim = defprim("special.polygamma", _polygamma_impl,
                         vjp=(lambda g, ans, x, *, n: g * polygamma(n + 1, x),),
                         jvp=(lambda t, ans, x, *, n: t * polygamma(n + 1, x),), elementwise=False, ufunc=False)


def polygamma(n, x):
    """The n-th derivative of digamma (``n`` a non-negative Python int: the order is not differentiated)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
        raise TypeError(f"unigrad.special.polygamma: n must be a non-negative int on the NumPy tape; got {n!r}")
    if n == 0:
        return digamma(x)
    return polygamma_prim(x, n=int(n))


gammaln = _unary("gammaln", _value("gammaln"), lambda ans, x: digamma(x))
digamma = _unary("digamma", _value("digamma"), lambda ans, x: polygamma(1, x))
erf = _unary("erf", _value("erf"), lambda ans, x: _TWO_SQRT_PI * P.exp(-x * x))
erfc = _unary("erfc", _value("erfc"), lambda ans, x: -_TWO_SQRT_PI * P.exp(-x * x))
erfinv = _unary("erfinv", _value("erfinv"), lambda ans, x: _SQRT_PI_2 * P.exp(ans * ans))
ndtr = _unary("ndtr", _value("ndtr"), lambda ans, x: P.exp(-0.5 * x * x) / _SQRT_2PI)
log_ndtr = _unary("log_ndtr", _value("log_ndtr"), lambda ans, x: P.exp(-0.5 * x * x - ans) / _SQRT_2PI)
ndtri = _unary("ndtri", _value("ndtri"), lambda ans, x: _SQRT_2PI * P.exp(0.5 * ans * ans))
i0e = _unary("i0e", _value("i0e"), lambda ans, x: i1e(x) - P.sign(x) * ans)


def _i1e_slope(ans, x):
    """d/dx i1e(x) = i0e(x) - i1e(x) (sign(x) + 1/x); at x = 0 its limit, 1/2 (I1(x)/x -> 1/2)."""
    zero = xp.equal(x, 0)
    safe = xp.where(zero, xp.ones_like(x), x)
    return xp.where(zero, 0.5 * xp.ones_like(x), i0e(x) - ans * (P.sign(x) + 1 / safe))


i1e = _unary("i1e", _value("i1e"), _i1e_slope)

@functools.cache
def scipy_ufuncs():
    """SciPy's special ufuncs -> these primitives, for NumPy's dispatch on traced values."""
    sc = _scipy()
    return {sc.gammaln: gammaln, sc.digamma: digamma, sc.psi: digamma, sc.erf: erf, sc.erfc: erfc,
            sc.erfinv: erfinv, sc.ndtr: ndtr, sc.log_ndtr: log_ndtr, sc.ndtri: ndtri, sc.i0e: i0e, sc.i1e: i1e}


FUNCTIONS = {"gammaln": gammaln, "digamma": digamma, "polygamma": polygamma, "erf": erf, "erfc": erfc,
             "erfinv": erfinv, "ndtr": ndtr, "log_ndtr": log_ndtr, "ndtri": ndtri, "i0e": i0e, "i1e": i1e}
