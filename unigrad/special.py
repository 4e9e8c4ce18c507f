"""Special functions on every backend, differentiable to any order: ``unigrad.special.gammaln(x)``.

Each function runs on the backend of its arguments (inside a transform, the transform's backend): the
framework's own function where it has one (``torch.special``, ``jax.scipy.special``, ``tf.math``), on the
NumPy tape SciPy's values with derivative rules of their own, and elsewhere a formula in the backend's
Array API namespace and other special functions (``betaln`` from ``gammaln``, ``ndtr`` from ``erfc``).
A plugin backend supplies its own through ``Backend.special(name)``.

The tape needs SciPy (``pip install unigrad[special]``). SciPy's special ufuncs called on the tape's traced
values (``scipy.special.gammaln(x)`` inside ``f``) are these functions too; SciPy's other code
(``scipy.integrate.odeint``) cannot see a traced value: wrap it in a custom rule
(``unigrad.custom_vjp``) or run it on another backend with ``unigrad.bridge``.

Example:
  >>> import unigrad.special as us
  >>> unigrad.grad(lambda x: us.gammaln(x).sum())(np.array([1.0, 2.0]))  # digamma
  array([-0.57721566,  0.42278434])
"""

from __future__ import annotations

import math

import numpy as np

from . import _registry
from ._arrays import namespace
from ._safe import safe_where

__all__ = ["gammaln", "digamma", "polygamma", "erf", "erfc", "erfinv", "ndtr", "log_ndtr", "ndtri", "expit",
           "logit", "xlogy", "xlog1py", "i0e", "i1e", "betaln", "multigammaln"]


def _backend(args):
    active = _registry.active_backend.get()
    if active is not None:
        return active
    return _registry.resolve(None, [a for a in args if not isinstance(a, (bool, int, float, complex))])


def _arrays(b, args):
    """The arguments as the backend's arrays (Python scalars and NumPy arrays converted, dtype kept)."""
    out = []
    for a in args:
        if not b.is_array(a):
            a = b.asarray(np.asarray(a, dtype=np.float64) if isinstance(a, (bool, int)) else np.asarray(a))
        out.append(a)
    return out


def _dispatch(name, *args, generic=None):
    b = _backend(args)
    args = _arrays(b, args)
    native = b.special(name)
    if native is not None:
        return native(*args)
    if generic is not None:
        return generic(*args)
    raise TypeError(f"unigrad.special.{name}: the {b.name} backend has no {name} (its Backend.special({name!r}) "
                    f"is None) and there is no formula for it in the other functions")


def _xp(*args):
    return namespace(*args)


# ------------------------------------------------------------------ the functions a backend supplies


def gammaln(x):
    """``log |Gamma(x)|``; its derivative is ``digamma``."""
    return _dispatch("gammaln", x)


def digamma(x):
    """``d/dx log Gamma(x)``; its derivative is ``polygamma(1, x)``."""
    return _dispatch("digamma", x)


def polygamma(n, x):
    """The ``n``-th derivative of ``digamma`` (``n`` a non-negative Python int, not differentiated)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise TypeError(f"unigrad.special.polygamma: n must be a non-negative int; got {n!r}")
    b = _backend((x,))
    (x,) = _arrays(b, (x,))
    native = b.special("polygamma")
    if native is None:
        if n == 0:
            return digamma(x)
        raise TypeError(f"unigrad.special.polygamma: the {b.name} backend has no polygamma")
    return native(int(n), x)


def erf(x):
    """The error function."""
    return _dispatch("erf", x)


def erfc(x):
    """``1 - erf(x)``, accurate where ``erf(x)`` is near 1."""
    return _dispatch("erfc", x, generic=lambda x: 1 - erf(x))


def erfinv(x):
    """The inverse of ``erf`` on (-1, 1)."""
    return _dispatch("erfinv", x)


def i0e(x):
    """The exponentially scaled modified Bessel function of order 0, ``exp(-|x|) I0(x)``."""
    return _dispatch("i0e", x)


def i1e(x):
    """The exponentially scaled modified Bessel function of order 1, ``exp(-|x|) I1(x)``."""
    return _dispatch("i1e", x)


# ------------------------------------------------------------------ formulas where a backend has none

_SQRT_HALF = math.sqrt(0.5)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def ndtr(x):
    """The standard normal CDF."""
    return _dispatch("ndtr", x, generic=lambda x: 0.5 * erfc(-_SQRT_HALF * x))


def _log_ndtr(x):
    """``log(ndtr(x))``, accurate in the far left tail: below -20 the asymptotic series of the Mills
    ratio, ``-x^2/2 - log(-x) - log(sqrt(2 pi)) + log(1 - 1/x^2 + 3/x^4 - 15/x^6 + 105/x^8 - 945/x^10)``
    (its error there is below float64's rounding), elsewhere ``log(ndtr(x))``; each branch sees only
    inputs where it is finite, so derivatives are too."""
    xp = _xp(x)

    def tail(z):
        w = 1 / (z * z)
        series = 1 + w * (-1 + w * (3 + w * (-15 + w * (105 - 945 * w))))
        return -0.5 * z * z - xp.log(-z) - _LOG_SQRT_2PI + xp.log(series)

    return safe_where(x < -20.0, x, tail, lambda z: xp.log(ndtr(z)), fill_true=-30.0, fill_false=0.0)


def log_ndtr(x):
    """``log`` of the standard normal CDF, accurate for very negative ``x``."""
    return _dispatch("log_ndtr", x, generic=_log_ndtr)


def ndtri(x):
    """The inverse of ``ndtr`` on (0, 1)."""
    return _dispatch("ndtri", x, generic=lambda x: math.sqrt(2.0) * erfinv(2 * x - 1))


def expit(x):
    """The logistic sigmoid ``1 / (1 + exp(-x))``, computed as ``(1 + tanh(x / 2)) / 2`` (no overflow)."""
    return _dispatch("expit", x, generic=lambda x: 0.5 * (1 + _xp(x).tanh(0.5 * x)))


def logit(p):
    """The inverse of ``expit``: ``log(p / (1 - p))``."""
    return _dispatch("logit", p, generic=lambda p: _xp(p).log(p) - _xp(p).log1p(-p))


def xlogy(x, y):
    """``x * log(y)``, 0 where ``x == 0`` (also at ``y == 0``), with finite derivatives there."""
    def generic(x, y):
        xp = _xp(x, y)
        x, y = xp.broadcast_arrays(x, y)
        return x * safe_where(x == 0, y, lambda v: xp.zeros_like(v), xp.log, fill_false=1.0)
    return _dispatch("xlogy", x, y, generic=generic)


def xlog1py(x, y):
    """``x * log1p(y)``, 0 where ``x == 0`` (also at ``y == -1``), with finite derivatives there."""
    def generic(x, y):
        xp = _xp(x, y)
        x, y = xp.broadcast_arrays(x, y)
        return x * safe_where(x == 0, y, lambda v: xp.zeros_like(v), xp.log1p, fill_false=0.0)
    return _dispatch("xlog1py", x, y, generic=generic)


def betaln(a, b):
    """``log |B(a, b)| = gammaln(a) + gammaln(b) - gammaln(a + b)``."""
    return _dispatch("betaln", a, b, generic=lambda a, b: gammaln(a) + gammaln(b) - gammaln(a + b))


def multigammaln(a, d):
    """The log of the multivariate gamma function of dimension ``d`` (a positive Python int):
    ``d (d - 1) / 4 log(pi) + sum_j gammaln(a - j / 2)``, ``j = 0 .. d - 1``."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise TypeError(f"unigrad.special.multigammaln: d must be a positive int; got {d!r}")
    b = _backend((a,))
    (a,) = _arrays(b, (a,))
    native = b.special("multigammaln")
    if native is not None:
        return native(a, int(d))
    total = d * (d - 1) / 4 * math.log(math.pi)
    for j in range(int(d)):
        total = total + gammaln(a - 0.5 * j)
    return total
