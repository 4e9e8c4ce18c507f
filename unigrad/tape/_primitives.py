"""The rule table: every primitive of the tape with its VJP and JVP rules side by side.

Reading a row: ``defprim(name, impl, vjp=(rule per argument), jvp=(rule per argument))``.
``vjp`` rules take ``(g, ans, *args, **params)`` and return the cotangent of
one argument; ``jvp`` rules take ``(t, ans, *args, **params)`` and return the
tangent contribution of one argument. ``None`` is a zero derivative, ``LINEAR``
says "apply the primitive itself to the tangent" (the argument enters
linearly). Rules use the traced operations (operators and the functions of
this module), so derivatives of derivatives work.

Batch conventions (see ``_core``): ``g`` and ``t`` may carry extra leading
axes; every axis parameter is negative (counted from the end) so a rule never
needs to know how many; rules that must (reshape, indexing) compute it as
``g.ndim - ans.ndim`` / ``t.ndim - x.ndim``. Primitives created with
``broadcasts=True`` get their cotangents summed back to the argument's shape
(and their tangents aligned) by the engine.

Joint rules: a primitive with several results (``eigh``, ``svd``, ``qr``,
``slogdet``) returns them *packed* into one array (each result flattened over
its core axes, concatenated on the last axis); the namespace unpacks them with
traced ``getitem``/``reshape``, so the engine only ever sees one output. The
decompositions give their JVP as one formula (``jvp_joint``) and get their VJP
by transposing it: :func:`_transposed_jvp` runs reverse mode over the linear
map ``dx -> jvp(dx)`` (traced ops all the way, so it differentiates again).

Non-differentiable points, one rule each (the full list is in docs/tape.md):
``abs``/``sign`` at 0 -> 0; ``maximum``/``minimum`` ties -> half to each side
(``relu`` at 0 -> 0: its own rule); ``max``/``min`` reductions -> split evenly among tied
elements; ``clip`` at a bound -> 1 (the bound is inclusive); ``sqrt`` at 0 ->
inf (the true one-sided limit); ``x ** 0`` -> 0 for the base;
``floor``/``ceil``/``round``/``trunc``/``sign``/``floor_divide`` -> 0; ``sort``
ties -> the stable order's permutation; ``eigh``/``svd`` terms coupling equal
eigen/singular values (to rounding) -> 0; ``svd`` singular vectors of a zero
singular value -> the ``1/s`` terms are 0.
"""

from __future__ import annotations

import cmath
import math

import numpy as np

from . import _blas
from ._core import backward, record, unbroadcast
from ._tracer import PRIMITIVES, Primitive, Tracer, _ndim, _shape, concrete, reads

LINEAR = "linear"


def defprim(name, impl, vjp=(), jvp=(), *, jvp_joint=None, broadcasts=False, elementwise=None, ufunc=None,
            keeps=None, slope=None):
    """Create and register a primitive; ``jvp=LINEAR`` (or a LINEAR entry) reuses the primitive itself.

    ``keeps``: which of (ans, arg0, ...) the VJP rules read the values of, where the rules' bytecode
    cannot tell (they pass them to a helper); default: read from the rules (``_tracer.vjp_reads``).

    A primitive whose ``impl`` is a NumPy ufunc is elementwise: the namespace exports it under ``name``
    and NumPy's ufunc dispatches to it on traced values (``ufunc=`` names the ufunc when ``impl`` is
    a wrapper; ``elementwise=False`` opts out). ``slope``: see :class:`Primitive` (the VJP must be
    ``g * slope(ans, x)``)."""
    vjps = vjp if vjp is None else tuple(vjp)
    if ufunc is None and isinstance(impl, np.ufunc):
        ufunc = impl
    ufunc = ufunc or None  # ufunc=False: no dispatch (matmul: the namespace's own handles vectors)
    if elementwise is None:
        elementwise = ufunc is not None
    prim = Primitive(name, impl, vjps, (), jvp_joint=jvp_joint, broadcasts=broadcasts, elementwise=elementwise,
                     ufunc=ufunc, keeps=keeps, slope=slope)
    if vjps is not None:
        n = len(vjps)
        jvps = (LINEAR,) * n if jvp == LINEAR else tuple(jvp)
        prim.jvps = tuple(_linear_in(prim, i) if r == LINEAR else r for i, r in enumerate(jvps))
    PRIMITIVES[name] = prim
    return prim


def _linear_in(prim, i):
    def rule(t, ans, *args, **params):
        args = list(args)
        args[i] = t
        return prim(*args, **params)
    return rule


def defnondiff(name, impl, **flags):
    """A primitive whose outputs carry no derivative (comparisons, argmax, integer results)."""
    return defprim(name, impl, vjp=None, **flags)


def _nb(g, ans):
    return _ndim(g) - _ndim(ans)


def _is_complex(x):
    return np.dtype(x.dtype).kind == "c"


def _real_like(c, x):
    """The cotangent of a real argument is real, even when the primitive's output is complex."""
    if _is_complex(c) and not _is_complex(x):
        return real(c)
    return c


# ------------------------------------------------------------------------- elementwise, unary

def _unary(name, impl, dfdx, from_x=None, **flags):
    """An elementwise primitive with derivative ``dfdx(ans, x)`` (holomorphic for complex input).
    ``from_x``: the same derivative read from ``x`` alone, for the primitive's twin (see ``Primitive``)."""
    prim = defprim(name, impl,
                   vjp=(lambda g, ans, x: g * dfdx(ans, x),),
                   jvp=(lambda t, ans, x: t * dfdx(ans, x),), elementwise=True, keeps=reads(dfdx), slope=dfdx,
                   **flags)
    if from_x is not None:  # (not registered: the tape alone records with it)
        twin = Primitive(name, impl, (lambda g, ans, x: g * from_x(ans, x),), keeps=reads(from_x), slope=from_x)
        twin.jvps = prim.jvps
        prim.twin = twin
    return prim


negative = defprim("negative", np.negative, vjp=(lambda g, ans, x: -g,), jvp=LINEAR)
positive = defprim("positive", np.positive, vjp=(lambda g, ans, x: g,), jvp=LINEAR)
exp = _unary("exp", np.exp, lambda ans, x: ans)
expm1 = _unary("expm1", np.expm1, lambda ans, x: ans + 1)
log = _unary("log", np.log, lambda ans, x: 1 / x)
log1p = _unary("log1p", np.log1p, lambda ans, x: 1 / (x + 1))
log2 = _unary("log2", np.log2, lambda ans, x: 1 / (x * float(np.log(2))))
log10 = _unary("log10", np.log10, lambda ans, x: 1 / (x * float(np.log(10))))
sqrt = _unary("sqrt", np.sqrt, lambda ans, x: 0.5 / ans)
sin = _unary("sin", np.sin, lambda ans, x: cos(x))
cos = _unary("cos", np.cos, lambda ans, x: -sin(x))
tan = _unary("tan", np.tan, lambda ans, x: 1 + ans * ans)
arcsin = _unary("asin", np.arcsin, lambda ans, x: 1 / sqrt(1 - x * x))
arccos = _unary("acos", np.arccos, lambda ans, x: -1 / sqrt(1 - x * x))
arctan = _unary("atan", np.arctan, lambda ans, x: 1 / (1 + x * x))
sinh = _unary("sinh", np.sinh, lambda ans, x: cosh(x))
cosh = _unary("cosh", np.cosh, lambda ans, x: sinh(x))
def _sech2(ans, x):
    """tanh's derivative from x: 1 / cosh(x)^2 (0 where cosh overflows), in the memory of one array."""
    if type(x) is np.ndarray:
        c = np.cosh(x)
        if type(c) is np.ndarray:  # (a 0-d input gives a NumPy scalar: no memory to reuse)
            np.multiply(c, c, out=c)
            return np.reciprocal(c, out=c)
        return 1 / (c * c)
    c = cosh(x)
    return 1 / (c * c)


tanh = _unary("tanh", np.tanh, lambda ans, x: 1 - ans * ans, from_x=_sech2)
arcsinh = _unary("asinh", np.arcsinh, lambda ans, x: 1 / sqrt(x * x + 1))
arccosh = _unary("acosh", np.arccosh, lambda ans, x: 1 / sqrt(x * x - 1))
arctanh = _unary("atanh", np.arctanh, lambda ans, x: 1 / (1 - x * x))
square = _unary("square", np.square, lambda ans, x: 2 * x)
exp2 = _unary("exp2", np.exp2, lambda ans, x: ans * math.log(2))
fabs = _unary("fabs", np.fabs, lambda ans, x: sign(x))  # real only, as NumPy's
deg2rad = defprim("deg2rad", np.deg2rad, vjp=(lambda g, ans, x: g * (math.pi / 180),), jvp=LINEAR)
rad2deg = defprim("rad2deg", np.rad2deg, vjp=(lambda g, ans, x: g * (180 / math.pi),), jvp=LINEAR)


def _sinc_slope(ans, x):
    """d/dx sin(pi x) / (pi x) = (cos(pi x) - sinc(x)) / x, and its Taylor series near 0 (exact there to
    every order; the closed form would cancel)."""
    small = np.abs(concrete(x)) < 1e-2
    if not np.any(small):
        return (cos(x * math.pi) - ans) / x
    p2 = math.pi ** 2
    xs = where(small, x, 0)
    x2 = xs * xs
    series = xs * (-p2 / 3 + x2 * (p2 * p2 / 30 - x2 * (p2 ** 3 / 840)))
    xb = where(small, 1, x)
    return where(small, series, (cos(xb * math.pi) - where(small, 1, ans)) / xb)


sinc = _unary("sinc", np.sinc, _sinc_slope)
reciprocal = _unary("reciprocal", np.reciprocal, lambda ans, x: -(ans * ans))


def _sigmoid_impl(x):
    if np.iscomplexobj(x):
        return 1 / (1 + np.exp(-x))
    e = np.exp(-np.abs(x))  # never overflows: exp of a non-positive number
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


sigmoid = _unary("sigmoid", _sigmoid_impl, lambda ans, x: ans * (1 - ans))  # no NumPy ufunc


def _sign_impl(x):
    if np.iscomplexobj(x):  # Array API: x / |x|, 0 at 0
        a = np.abs(x)
        return np.where(a == 0, 0, x / np.where(a == 0, 1, a)).astype(x.dtype)
    return np.sign(x)


sign = defprim("sign", _sign_impl, vjp=(None,), jvp=(None,), ufunc=np.sign)
floor = defprim("floor", np.floor, vjp=(None,), jvp=(None,))
ceil = defprim("ceil", np.ceil, vjp=(None,), jvp=(None,))
trunc = defprim("trunc", np.trunc, vjp=(None,), jvp=(None,))
round_ = defprim("round", np.round, vjp=(None,), jvp=(None,), ufunc=np.rint, elementwise=False)  # decimals=


def _abs_vjp(g, ans, x):
    if _is_complex(x):  # d|z| = real(conj(z) dz) / |z|; unconjugated transpose: g * conj(z) / |z|
        safe = where(ans == 0, 1, ans)
        return where(ans == 0, 0, g * conj(x) / safe)
    return g * sign(x)


def _abs_jvp(t, ans, x):
    if _is_complex(x):
        safe = where(ans == 0, 1, ans)
        return where(ans == 0, 0, real(conj(x) * t) / safe)
    return t * sign(x)


absolute = defprim("abs", np.abs, vjp=(_abs_vjp,), jvp=(_abs_jvp,))

# complex parts: real-linear maps; the VJP is the transpose with JAX's (unconjugated) convention
real = defprim("real", np.real, vjp=(lambda g, ans, x: _complexify(g, x),), jvp=LINEAR, elementwise=True)
imag = defprim("imag", np.imag, vjp=(lambda g, ans, x: _complexify(g * -1j, x) if _is_complex(x) else g * 0,),
               jvp=LINEAR, elementwise=True)
conj = defprim("conj", np.conj, vjp=(lambda g, ans, x: conj(g),), jvp=LINEAR)


def _complexify(c, x):
    return astype(c, x.dtype) if _is_complex(x) and not _is_complex(c) else c


def _astype_impl(x, dtype):
    return np.asarray(x).astype(dtype, copy=False)


def _astype_vjp(g, ans, x, dtype):
    c = _real_like(g, x)
    return astype(c, x.dtype) if np.dtype(c.dtype) != np.dtype(x.dtype) else c


astype = defprim("astype", _astype_impl, vjp=(_astype_vjp,), jvp=LINEAR)

# ------------------------------------------------------------------------- elementwise, binary

def _pow_vjp_x(g, ans, x, y):
    # d/dx x**y = y * x**(y-1); 0 where y == 0 (so x**0 has derivative 0 even at x = 0)
    if not isinstance(y, (Tracer, np.ndarray)):
        if y == 0:
            return g * 0
        if y == 2:
            return g * (x + x)  # (2 * x exactly, without a Python int's promotion: half the time on small arrays)
        return g * (y * x ** (y - 1))
    return g * where(y == 0, 0, y * x ** where(y == 0, 1, y - 1))


def _pow_vjp_y(g, ans, x, y):
    # d/dy x**y = log(x) * x**y; 0 at x == 0 (JAX's choice)
    if isinstance(x, (int, float, complex)) and not isinstance(x, np.generic):  # keep a Python scalar weak
        if x == 0:
            return g * 0
        log_x = cmath.log(x) if isinstance(x, complex) else (math.log(x) if x > 0 else math.nan)
        return g * (ans * log_x)
    return g * (ans * log(where(x == 0, 1, x)))


def _pow_jvp(vjp):
    """A tangent's term ``t * c`` (``c`` the input's derivative: the VJP of a unit cotangent), with ``c`` taken
    as 0 where it is not finite and the tangent is 0: the other input's derivative (NaN at a negative base,
    inf at 0 ** 0.5) stays out of a Jacobian column it is not in, as in reverse mode (docs/conventions.md).
    Linear in the tangent, with derivative ``c`` in it at every tangent (a ``where`` on the tangent's value
    around the whole term made that derivative 0 at t = 0: a VJP of this JVP, its transpose, read 0)."""
    def jvp(t, ans, x, y):
        c = vjp(1.0, ans, x, y)
        keep = np.isfinite(concrete(c)) | (concrete(t) != 0)
        return t * (c if keep.all() else where(keep, c, 0))
    return jvp


def _pow_impl(x, y):
    if type(y) is int and y == 2 and type(x) is np.ndarray and x.dtype.kind in "fc":
        return np.square(x)  # NumPy's own x ** 2: the same for reals, the exact square for complex, and faster
    return np.power(x, y)


power = defprim("pow", _pow_impl, ufunc=np.power,
                vjp=(_pow_vjp_x, _pow_vjp_y),
                jvp=(_pow_jvp(_pow_vjp_x), _pow_jvp(_pow_vjp_y)),
                broadcasts=True)

add = defprim("add", np.add, vjp=(lambda g, ans, x, y: g, lambda g, ans, x, y: g),
              jvp=(lambda t, ans, x, y: t, lambda t, ans, x, y: t), broadcasts=True)
subtract = defprim("subtract", np.subtract, vjp=(lambda g, ans, x, y: g, lambda g, ans, x, y: -g),
                   jvp=(lambda t, ans, x, y: t, lambda t, ans, x, y: -t), broadcasts=True)
multiply = defprim("multiply", np.multiply, vjp=(lambda g, ans, x, y: g * y, lambda g, ans, x, y: g * x),
                   jvp=(lambda t, ans, x, y: t * y, lambda t, ans, x, y: x * t), broadcasts=True)
divide = defprim("divide", np.true_divide,
                 vjp=(lambda g, ans, x, y: g / y, lambda g, ans, x, y: -g * ans / y),
                 jvp=(lambda t, ans, x, y: t / y, lambda t, ans, x, y: -t * ans / y), broadcasts=True)


def _mm_rules(op, skip_nan=False):
    """Weights of x in maximum/minimum: 1 where x wins, 1/2 at a tie; ``skip_nan`` (fmax, fmin): a NaN
    loses to a number."""
    wins = (lambda x, y: x > y) if op == "max" else (lambda x, y: x < y)

    def wx(x, y):
        xv, yv = concrete(x), concrete(y)
        w = np.where(xv == yv, 0.5, np.where(wins(xv, yv), 1.0, 0.0))
        if skip_nan:
            w = np.where(np.isnan(yv), 1.0, np.where(np.isnan(xv), 0.0, w))
        return w.astype(np.result_type(xv, yv), copy=False)

    return ((lambda g, ans, x, y: g * wx(x, y), lambda g, ans, x, y: g * (1 - wx(x, y))),
            (lambda t, ans, x, y: t * wx(x, y), lambda t, ans, x, y: t * (1 - wx(x, y))))


_rules = _mm_rules("max")
maximum = defprim("maximum", np.maximum, vjp=_rules[0], jvp=_rules[1], broadcasts=True)
_rules = _mm_rules("min")
minimum = defprim("minimum", np.minimum, vjp=_rules[0], jvp=_rules[1], broadcasts=True)
_rules = _mm_rules("max", skip_nan=True)
fmax = defprim("fmax", np.fmax, vjp=_rules[0], jvp=_rules[1], broadcasts=True)
_rules = _mm_rules("min", skip_nan=True)
fmin = defprim("fmin", np.fmin, vjp=_rules[0], jvp=_rules[1], broadcasts=True)

def _over(num, den):
    """num / den, and 0 where den == 0 (at the origin of atan2 and hypot: the documented rule)."""
    zero = concrete(den) == 0
    if not np.any(zero):
        return num / den
    return where(zero, 0, num / where(zero, 1, den))


def _atan2_dy(y, x):
    return _over(x, x * x + y * y)


def _atan2_dx(y, x):
    return -_over(y, x * x + y * y)


arctan2 = defprim("atan2", np.arctan2,
                  vjp=(lambda g, ans, y, x: g * _atan2_dy(y, x), lambda g, ans, y, x: g * _atan2_dx(y, x)),
                  jvp=(lambda t, ans, y, x: t * _atan2_dy(y, x), lambda t, ans, y, x: t * _atan2_dx(y, x)),
                  broadcasts=True)
hypot = defprim("hypot", np.hypot,
                vjp=(lambda g, ans, x, y: g * _over(x, ans), lambda g, ans, x, y: g * _over(y, ans)),
                jvp=(lambda t, ans, x, y: t * _over(x, ans), lambda t, ans, x, y: t * _over(y, ans)), broadcasts=True)
logaddexp2 = defprim("logaddexp2", np.logaddexp2,
                     vjp=(lambda g, ans, x, y: g * exp2(x - ans), lambda g, ans, x, y: g * exp2(y - ans)),
                     jvp=(lambda t, ans, x, y: t * exp2(x - ans), lambda t, ans, x, y: t * exp2(y - ans)),
                     broadcasts=True)
logaddexp = defprim("logaddexp", np.logaddexp,
                    vjp=(lambda g, ans, x, y: g * exp(x - ans), lambda g, ans, x, y: g * exp(y - ans)),
                    jvp=(lambda t, ans, x, y: t * exp(x - ans), lambda t, ans, x, y: t * exp(y - ans)),
                    broadcasts=True)
remainder = defprim("remainder", np.remainder,
                    vjp=(lambda g, ans, x, y: g, lambda g, ans, x, y: -g * _floor_quotient(x, y)),
                    jvp=(lambda t, ans, x, y: t, lambda t, ans, x, y: -t * _floor_quotient(x, y)), broadcasts=True)


def _floor_quotient(x, y):
    """floor(x / y) as a constant: piecewise constant, so it carries no derivative."""
    return np.floor_divide(concrete(x), concrete(y))


copysign = defprim("copysign", np.copysign,
                   vjp=(lambda g, ans, x, y: g * sign(x) * sign(ans), None),
                   jvp=(lambda t, ans, x, y: t * sign(x) * sign(ans), None), broadcasts=True)


def _where_impl(cond, x, y):
    return np.where(cond, x, y)


where = defprim("where", _where_impl,
                vjp=(None, lambda g, ans, c, x, y: where(c, g, 0), lambda g, ans, c, x, y: where(c, 0, g)),
                jvp=(None, lambda t, ans, c, x, y: where(c, t, 0), lambda t, ans, c, x, y: where(c, 0, t)),
                broadcasts=True)


def _clip_impl(x, lo, hi):
    return np.clip(x, lo, hi)


def _inside(x, lo, hi):
    """1 where x is inside [lo, hi] (bounds inclusive), else 0; lo/hi may be None."""
    xv = concrete(x)
    m = np.ones(np.shape(xv), dtype=bool)
    if lo is not None:
        m &= xv >= concrete(lo)
    if hi is not None:
        m &= xv <= concrete(hi)
    return m


clip = defprim("clip", _clip_impl,
               vjp=(lambda g, ans, x, lo, hi: where(_inside(x, lo, hi), g, 0),
                    lambda g, ans, x, lo, hi: where(concrete(x) < concrete(lo), g, 0),
                    lambda g, ans, x, lo, hi: where(concrete(x) > concrete(hi), g, 0)),
               jvp=(lambda t, ans, x, lo, hi: where(_inside(x, lo, hi), t, 0),
                    lambda t, ans, x, lo, hi: where(concrete(x) < concrete(lo), t, 0),
                    lambda t, ans, x, lo, hi: where(concrete(x) > concrete(hi), t, 0)),
               broadcasts=True)

# ------------------------------------------------------------------------- comparisons and friends
for _name, _fn in [("equal", np.equal), ("not_equal", np.not_equal), ("less", np.less),
                   ("less_equal", np.less_equal), ("greater", np.greater), ("greater_equal", np.greater_equal),
                   ("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite),
                   ("signbit", np.signbit), ("logical_and", np.logical_and), ("logical_or", np.logical_or),
                   ("logical_xor", np.logical_xor), ("logical_not", np.logical_not),
                   ("floor_divide", np.floor_divide), ("nextafter", np.nextafter),
                   ("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or), ("bitwise_xor", np.bitwise_xor),
                   ("bitwise_invert", np.invert), ("bitwise_left_shift", np.left_shift),
                   ("bitwise_right_shift", np.right_shift)]:
    defnondiff(_name, _fn)
equal, not_equal = PRIMITIVES["equal"], PRIMITIVES["not_equal"]
less, less_equal = PRIMITIVES["less"], PRIMITIVES["less_equal"]
greater, greater_equal = PRIMITIVES["greater"], PRIMITIVES["greater_equal"]


# ------------------------------------------------------------------------- reductions

def _keep_shape(shape, axis):
    nd = len(shape)
    return tuple(1 if (k - nd) in axis else s for k, s in enumerate(shape))


def _expand_reduced(g, ans, x, axis, keepdims):
    """Cotangent of a reduction's output, reshaped and broadcast to ``(*batch, *x.shape)``."""
    gs = tuple(g.shape)
    xs = tuple(x.shape)
    nb = len(gs) - len(ans.shape)
    if not keepdims and (nb or len(axis) != len(xs)):  # a full reduction's scalar broadcasts as it is
        g = reshape(g, gs[:nb] + _keep_shape(xs, axis))
    if type(g) is np.ndarray:  # what the primitive runs on an untraced value, without its dispatch
        return _broadcast_impl(g, gs[:nb] + xs)
    return broadcast_to(g, gs[:nb] + xs)


def _sum_impl(x, axis, keepdims):
    out = np.add.reduce(x, axis=axis, keepdims=keepdims)  # np.sum's Python wrapper costs microseconds
    return out if isinstance(out, np.ndarray) else np.asarray(out)


reduce_sum = defprim("sum", _sum_impl,
                     vjp=(_expand_reduced,),
                     jvp=LINEAR, keeps=(False, False))  # _expand_reduced reads shapes only


def _max_impl(x, axis, keepdims):
    return np.asarray(np.max(x, axis=axis, keepdims=keepdims))


def _min_impl(x, axis, keepdims):
    return np.asarray(np.min(x, axis=axis, keepdims=keepdims))


def _extremum_weights(ans, x, axis, keepdims):
    """Indicator of the extremal elements, divided by how many tie (the evenly-split convention)."""
    xv, av = concrete(x), concrete(ans)
    if not keepdims:
        av = av.reshape(_keep_shape(np.shape(xv), axis))
    hit = (xv == av)
    count = hit.sum(axis=axis, keepdims=True)
    return (hit / count).astype(xv.dtype, copy=False)


def _extremum_vjp(g, ans, x, axis, keepdims):
    return _expand_reduced(g, ans, x, axis, keepdims) * _extremum_weights(ans, x, axis, keepdims)


def _extremum_jvp(t, ans, x, axis, keepdims):
    return reduce_sum(t * _extremum_weights(ans, x, axis, keepdims), axis=axis, keepdims=keepdims)


reduce_max = defprim("max", _max_impl, vjp=(_extremum_vjp,), jvp=(_extremum_jvp,))
reduce_min = defprim("min", _min_impl, vjp=(_extremum_vjp,), jvp=(_extremum_jvp,))


def _prod_impl(x, axis, keepdims):
    return np.asarray(np.prod(x, axis=axis, keepdims=keepdims))


def _prod_vjp(g, ans, x, axis, keepdims):
    return _expand_reduced(g, ans, x, axis, keepdims) * _prod_others(x, axis)


def _prod_jvp(t, ans, x, axis, keepdims):
    return reduce_sum(t * _prod_others(x, axis), axis=axis, keepdims=keepdims)


# d prod / d x_i = the product of the other elements: computed without dividing by x_i, so it is exact
# at zeros (one zero: only that element's derivative survives; two: all vanish) and to every order.
reduce_prod = defprim("prod", _prod_impl, vjp=(_prod_vjp,), jvp=(_prod_jvp,))


def _prod_others(x, axis):
    """For each element of ``x``, the product of the other elements of its slice along ``axis``."""
    nd, shape = _ndim(x), _shape(x)
    keep = [k for k in range(-nd, 0) if k not in axis]
    perm = tuple(k + nd for k in keep) + tuple(a + nd for a in axis)
    identity = perm == tuple(range(nd))
    lead, red = tuple(shape[k] for k in keep), tuple(shape[a] for a in axis)
    flat = x if identity else permute_dims(x, axes=perm)
    if len(red) != 1:
        flat = reshape(flat, shape=lead + (math.prod(red),))
    others = _exclusive_products(flat)
    if len(red) != 1:
        others = reshape(others, shape=lead + red)
    return others if identity else permute_dims(others, axes=tuple(int(i) for i in np.argsort(perm)))


def _exclusive_products(x):
    """Along the last axis: (product of the elements before) * (product of the elements after)."""
    n = _shape(x)[-1]
    if n == 0:
        return x
    lead = _shape(x)[:-1]
    ones = np.ones(lead + (1,), dtype=x.dtype)
    if not isinstance(x, Tracer):  # first order on NumPy values: NumPy's own cumprod
        left = np.cumprod(np.concatenate([ones, x[..., :-1]], axis=-1), axis=-1)
        right = np.cumprod(np.concatenate([ones, x[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
        return left * right
    head = (slice(None),) * len(lead)
    left = cumprod_scan(concat(ones, getitem(x, index=head + (slice(0, n - 1),)), axis=-1), -1)
    after = getitem(x, index=head + (slice(n - 1, 0, -1),))  # x reversed, without its first element
    right = getitem(cumprod_scan(concat(ones, after, axis=-1), -1), index=head + (slice(None, None, -1),))
    return left * right


def cumprod_scan(x, axis):
    """Cumulative product along a negative ``axis`` from traced ops only (a Hillis-Steele scan:
    log2(n) rounds of shifted multiplies), so every derivative of it is exact, zeros included."""
    n = _shape(x)[axis]
    pre = (slice(None),) * (_ndim(x) + axis)
    step = 1
    while step < n:
        head = getitem(x, index=pre + (slice(0, step),))
        tail = getitem(x, index=pre + (slice(step, n),)) * getitem(x, index=pre + (slice(0, n - step),))
        x = concat(head, tail, axis=axis)
        step *= 2
    return x


def _cumsum_impl(x, axis, reverse=False):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis)
    return np.cumsum(x, axis=axis)


cumsum = defprim("cumsum", _cumsum_impl,
                 vjp=(lambda g, ans, x, axis, reverse=False: cumsum(g, axis=axis, reverse=not reverse),),
                 jvp=LINEAR)


# ------------------------------------------------------------------------- shapes

def _reshape_vjp(g, ans, x, shape):
    return reshape(g, _shape(g)[:_nb(g, ans)] + _shape(x))


def _reshape_jvp(t, ans, x, shape):
    return reshape(t, _shape(t)[:_ndim(t) - _ndim(x)] + tuple(shape))


reshape = defprim("reshape", lambda x, shape: np.reshape(x, shape), vjp=(_reshape_vjp,), jvp=(_reshape_jvp,))


def _broadcast_vjp(g, ans, x, shape):
    return unbroadcast(g, _shape(x), _nb(g, ans))


def _broadcast_jvp(t, ans, x, shape):
    nb = _ndim(t) - _ndim(x)
    ts = _shape(t)
    t = reshape(t, ts[:nb] + (1,) * (len(shape) - _ndim(x)) + ts[nb:])
    return broadcast_to(t, ts[:nb] + tuple(shape))


def _broadcast_impl(x, shape):
    # np.broadcast_to costs microseconds of argument handling; small results are cheaper to materialise.
    if math.prod(shape) <= 4096:
        out = np.empty(shape, dtype=x.dtype if isinstance(x, np.ndarray) else np.result_type(x))
        out[...] = x
        return out
    return np.broadcast_to(x, shape)


broadcast_to = defprim("broadcast_to", _broadcast_impl,
                       vjp=(_broadcast_vjp,), jvp=(_broadcast_jvp,))


def _permute_impl(x, axes):
    return np.transpose(x, axes)


def _batched_perm(axes, nb):
    return tuple(range(nb)) + tuple(nb + a for a in axes)


permute_dims = defprim(
    "permute_dims", _permute_impl,
    vjp=(lambda g, ans, x, axes: permute_dims(g, axes=_batched_perm(tuple(np.argsort(axes)), _nb(g, ans))),),
    jvp=(lambda t, ans, x, axes: permute_dims(t, axes=_batched_perm(axes, _ndim(t) - _ndim(x))),))

matrix_transpose = defprim("matrix_transpose", lambda x: np.swapaxes(x, -1, -2),
                           vjp=(lambda g, ans, x: matrix_transpose(g),), jvp=LINEAR)


def _flip_impl(x, axis):
    return np.flip(x, axis)


flip = defprim("flip", _flip_impl, vjp=(lambda g, ans, x, axis: flip(g, axis=axis),), jvp=LINEAR)


def _roll_impl(x, shift, axis):
    return np.roll(x, shift, axis)


roll = defprim("roll", _roll_impl,
               vjp=(lambda g, ans, x, shift, axis: roll(g, shift=tuple(-s for s in shift), axis=axis),),
               jvp=LINEAR)


def _concat_impl(*xs, axis):
    return np.concatenate(xs, axis=axis)


def _concat_vjp(i):
    def rule(g, ans, *xs, axis):
        start = sum(_shape(x)[axis] for x in xs[:i])
        stop = start + _shape(xs[i])[axis]
        index = (slice(None),) * (_ndim(ans) + axis) + (slice(start, stop),)
        return getitem(g, index=index, nb=_nb(g, ans))
    return rule


def _of_arity(name, n, impl, vjp_rule, jvp_rule):
    """The primitive ``name`` for ``n`` operands, made on first use: variadic operations (concat,
    einsum) keep one row in the rule table, with rules built per operand position."""
    prim = PRIMITIVES.get(f"{name}{n}")
    if prim is None:
        prim = defprim(f"{name}{n}", impl, vjp=tuple(vjp_rule(i) for i in range(n)),
                       jvp=tuple(jvp_rule(i) for i in range(n)))
    return prim


def concat(*xs, axis):
    """Concatenate along a negative ``axis``."""
    return _of_arity("concat", len(xs), _concat_impl, _concat_vjp, _concat_jvp)(*xs, axis=axis)


def _concat_jvp(i):
    def rule(t, ans, *xs, axis):
        nb = _ndim(t) - _ndim(xs[i])
        ts = _shape(t)
        pieces = [t if k == i else np.zeros(ts[:nb] + _shape(x), dtype=t.dtype) for k, x in enumerate(xs)]
        return concat(*pieces, axis=axis)
    return rule




# ------------------------------------------------------------------------- indexing

def _moveaxes_back(x, nb):
    return np.moveaxis(x, tuple(range(nb)), tuple(range(-nb, 0))) if nb else x


def _moveaxes_front(x, nb):
    return np.moveaxis(x, tuple(range(-nb, 0)), tuple(range(nb))) if nb else x


def _getitem_impl(x, index, nb=0):
    if nb == 0:
        return x[index]
    return _moveaxes_front(_moveaxes_back(x, nb)[index], nb)


def _scatter_impl(g, index, shape, nb=0, advanced=True):
    batch = np.shape(g)[:nb]
    out = np.zeros(tuple(shape) + batch, dtype=np.result_type(g))
    gb = _moveaxes_back(g, nb)
    if advanced:
        np.add.at(out, index, gb)
    else:
        out[index] = gb
    return _moveaxes_front(out, nb)


def _getitem_vjp(g, ans, x, index, nb=0):
    total = _nb(g, ans) + nb
    return scatter_add(g, index=index, shape=_shape(x)[nb:], nb=total, advanced=_has_advanced(index))


def _getitem_jvp(t, ans, x, index, nb=0):
    return getitem(t, index=index, nb=_ndim(t) - _ndim(x) + nb)


def _has_advanced(index):
    return any(isinstance(i, (np.ndarray, list)) for i in index)


getitem = defprim("getitem", _getitem_impl, vjp=(_getitem_vjp,), jvp=(_getitem_jvp,))
scatter_add = defprim(
    "scatter_add", _scatter_impl,
    vjp=(lambda g, ans, c, index, shape, nb=0, advanced=True: getitem(g, index=index, nb=_nb(g, ans) + nb),),
    jvp=(lambda t, ans, c, index, shape, nb=0, advanced=True:
         scatter_add(t, index=index, shape=shape, nb=_ndim(t) - _ndim(c) + nb, advanced=advanced),))


def _take_along_impl(x, indices, axis):
    return np.take_along_axis(x, indices, axis)


def _take_along_vjp(g, ans, x, indices, axis):
    return put_along_add(g, indices, axis=axis, shape=_shape(x))


def _put_along_impl(g, indices, axis, shape):
    nb = np.ndim(g) - np.ndim(indices)
    out = np.zeros(np.shape(g)[:nb] + tuple(shape), dtype=np.result_type(g))
    idx = np.broadcast_to(indices, np.shape(g))
    grids = list(np.indices(np.shape(g), sparse=True))
    grids[axis] = idx
    np.add.at(out, tuple(grids), g)
    return out


take_along_axis = defprim("take_along_axis", _take_along_impl,
                          vjp=(_take_along_vjp, None),
                          jvp=(lambda t, ans, x, indices, axis: take_along_axis(
                              t, np.broadcast_to(indices, _shape(t)[:_ndim(t) - _ndim(x)] + np.shape(indices)),
                              axis=axis), None))
put_along_add = defprim("put_along_add", _put_along_impl,
                        vjp=(lambda g, ans, c, indices, axis, shape:
                             take_along_axis(g, np.broadcast_to(indices, _shape(g)[:_nb(g, ans)] + _shape(indices)),
                                             axis=axis), None),
                        jvp=(lambda t, ans, c, indices, axis, shape: put_along_add(t, indices, axis=axis, shape=shape),
                             None))


# ------------------------------------------------------------------------- products

def _matmul_vjp_a(g, ans, a, b):
    return _real_like(matmul(g, matrix_transpose(b)), a)


def _matmul_vjp_b(g, ans, a, b):
    return _real_like(matmul(matrix_transpose(a), g), b)


# Operands are at least 2-D here; the namespace turns vectors into matrices and back. Small products run
# on one BLAS thread (_blas.py: a busy machine stalls a multithreaded BLAS's many small calls).
matmul = defprim("matmul", _blas.matmul, elementwise=False, ufunc=False, vjp=(_matmul_vjp_a, _matmul_vjp_b),
                 jvp=(lambda t, ans, a, b: matmul(t, b), lambda t, ans, a, b: matmul(a, t)), broadcasts=True)



# ------------------------------------------------------------------------- einsum

def _einsum_impl(*xs, labels, out):
    args = []
    for x, lab in zip(xs, labels):
        args += [x, list(lab)]
    big = len(xs) > 2 or max(np.size(x) for x in xs) > 4096  # BLAS-backed contraction paths pay off
    return np.asarray(np.einsum(*args, list(out), optimize=big))


def _fresh_labels(labels, out):
    """Labels unused by the spec (np.einsum allows integer labels below 52)."""
    used = set(out).union(*labels)
    for a in range(52):
        if a not in used:
            yield a
    raise ValueError("einsum: more than 52 distinct indices (including batch axes) are not supported")


def _einsum_vjp(i):
    """The cotangent of operand i: an einsum of the output cotangent with the other operands. Indices of
    operand i found nowhere else are broadcast (a ones vector); a repeated index (a diagonal) is
    scattered back with an identity matrix."""
    def rule(g, ans, *xs, labels, out):
        fresh = _fresh_labels(labels, out)
        batch = tuple(next(fresh) for _ in range(_nb(g, ans)))
        ops, labs = [g], [batch + tuple(out)]
        for k, (x, lab) in enumerate(zip(xs, labels)):
            if k != i:
                ops.append(x)
                labs.append(tuple(lab))
        present = set(out).union(*(labels[k] for k in range(len(xs)) if k != i))
        shape, dtype = _shape(xs[i]), np.finfo(g.dtype).dtype
        target, seen = [], set()
        for pos, a in enumerate(labels[i]):
            if a in seen:
                b = next(fresh)
                ops.append(np.eye(shape[pos], dtype=dtype))
                labs.append((a, b))
                target.append(b)
                continue
            seen.add(a)
            if a not in present:
                ops.append(np.ones(shape[pos], dtype=dtype))
                labs.append((a,))
            target.append(a)
        return _real_like(einsum(*ops, labels=tuple(labs), out=batch + tuple(target)), xs[i])
    return rule


def _einsum_jvp(i):
    def rule(t, ans, *xs, labels, out):
        fresh = _fresh_labels(labels, out)
        batch = tuple(next(fresh) for _ in range(_ndim(t) - _ndim(xs[i])))
        ops, labs = list(xs), list(labels)
        ops[i], labs[i] = t, batch + tuple(labels[i])
        return einsum(*ops, labels=tuple(labs), out=batch + tuple(out))
    return rule


def einsum(*xs, labels, out):
    """Einstein summation with integer ``labels`` per operand and ``out`` labels (no ellipsis, no
    size-1 broadcasting: the namespace expands those). One primitive per arity, like ``concat``."""
    return _of_arity("einsum", len(xs), _einsum_impl, _einsum_vjp, _einsum_jvp)(*xs, labels=labels, out=out)




# ------------------------------------------------------------------------- discrete Fourier transforms
# One transform along one negative ``axis`` of an array whose length there is the transform's length
# (the namespace crops or zero-pads first). All are linear; the VJP is the unconjugated transpose.

def _fft_impl(x, axis, inverse, norm):
    return (np.fft.ifft if inverse else np.fft.fft)(x, axis=axis, norm=norm)


# The DFT matrix is symmetric, so each complex transform is its own transpose.
fft_c2c = defprim("fft", _fft_impl, vjp=(lambda g, ans, x, axis, inverse, norm: fft_c2c(
    g, axis=axis, inverse=inverse, norm=norm),), jvp=LINEAR)


def _along(x, axis, index):
    return getitem(x, index=(slice(None),) * (_ndim(x) + axis) + (index,))


def _zero_pad(x, axis, n):
    """x with zeros appended along ``axis`` up to length n."""
    shape = list(_shape(x))
    extra = n - shape[axis]
    if extra <= 0:
        return x
    shape[axis] = extra
    return concat(x, np.zeros(tuple(shape), dtype=x.dtype), axis=axis)


def _rfft_impl(x, axis, norm):
    return np.fft.rfft(x, axis=axis, norm=norm)


def _rfft_vjp(g, ans, x, axis, norm):
    """rfft keeps the first n//2 + 1 rows of the DFT: its transpose pads g with zeros to n and applies
    the (symmetric) DFT; a real input takes the real part."""
    return real(fft_c2c(_zero_pad(g, axis, _shape(x)[axis]), axis=axis, inverse=False, norm=norm))


rfft = defprim("rfft", _rfft_impl, vjp=(_rfft_vjp,), jvp=LINEAR)


def _irfft_impl(x, axis, n, norm):
    return np.fft.irfft(x, n=n, axis=axis, norm=norm)


def _irfft_vjp(g, ans, x, axis, n, norm):
    """irfft(X)_j = scale * sum_k c_k Re(X_k w^jk) with c = 1 for the zero (and, n even, the Nyquist)
    frequency and 2 for the others; with JAX's convention (d/da - i d/db for X = a + ib) the cotangent
    of X_k is c_k * ifft(g)_k."""
    m = _shape(x)[axis]
    c = np.full(m, 2.0)
    c[0] = 1.0
    if n % 2 == 0:
        c[-1] = 1.0
    c = c.reshape((m,) + (1,) * (-axis - 1)).astype(np.finfo(x.dtype).dtype)
    full = fft_c2c(astype(g, dtype=np.dtype(x.dtype)), axis=axis, inverse=True, norm=norm)
    return _along(full, axis, slice(0, m)) * c


irfft = defprim("irfft", _irfft_impl, vjp=(_irfft_vjp,), jvp=LINEAR)


# ------------------------------------------------------------------------- linear algebra
# Matrices live on the last two axes; every rule broadcasts over the leading ones (batch axes of
# cotangents and tangents included). Helpers first, then one row per primitive.

def _mT(x):
    return matrix_transpose(x)


def _mH(x):
    return conj(matrix_transpose(x)) if _is_complex(x) else matrix_transpose(x)


def _index_last(x, *index):
    """``x[..., *index]`` for a traced x (the index covers the last ``len(index)`` axes)."""
    return getitem(x, index=(slice(None),) * (_ndim(x) - len(index)) + tuple(index))


def _diag_part(x):
    """The diagonal of the last two axes, (..., n, n) -> (..., n)."""
    r = np.arange(_shape(x)[-1])
    return _index_last(x, r, r)


def _diag_embed(d):
    """(..., n) -> (..., n, n) with d on the diagonal."""
    n = _shape(d)[-1]
    return reshape(d, _shape(d) + (1,)) * np.eye(n, dtype=np.finfo(d.dtype).dtype)


def _row(v):
    """(..., k) -> (..., 1, k): multiplies the columns of a matrix."""
    return reshape(v, _shape(v)[:-1] + (1, _shape(v)[-1]))


def _col(v):
    """(..., k) -> (..., k, 1): multiplies the rows of a matrix."""
    return reshape(v, _shape(v) + (1,))


def _tril_strict(x):
    n, m = _shape(x)[-2:]
    return where(np.tri(n, m, -1, dtype=bool), x, 0)


def _safe_reciprocal(s):
    """1 / s, and 0 where s == 0 (the value, not its derivative, decides)."""
    zero = concrete(s) == 0
    return where(zero, 0, 1 / where(zero, 1, s))


def _inverse_gaps(w):
    """F[..., i, j] = 1 / (w_j - w_i) off the diagonal; 0 on the diagonal and for equal values.

    Values are "equal" when they differ by no more than n * eps * max|w| (the rounding of a
    symmetric eigen- or singular-value solver): the terms that couple them are dropped (documented
    rule), where the exact derivative of the singular vectors does not exist.
    """
    wv = concrete(w)
    n = wv.shape[-1]
    gaps_v = wv[..., None, :] - wv[..., :, None]
    scale = np.max(np.abs(wv), axis=-1, keepdims=True)[..., None] if n else 0.0
    tie = np.abs(gaps_v) <= n * np.finfo(wv.dtype).eps * scale
    gaps = _row(w) - _col(w)
    return where(tie, 0, 1 / where(tie, 1, gaps))


def _split(packed, cores):
    """Unpack the results of a joint primitive: the last axis holds each result flattened."""
    lead = _shape(packed)[:-1]
    parts, start = [], 0
    for core in cores:
        size = math.prod(core)
        part = _index_last(packed, slice(start, start + size))
        parts.append(reshape(part, lead + tuple(core)))
        start += size
    return parts


def _join(parts, cores, dtype):
    """Pack results (each ``(..., *core)``, any leading axes) into one array of ``dtype``."""
    flat = []
    for part, core in zip(parts, cores):
        if np.dtype(part.dtype) != dtype:
            part = astype(part, dtype=dtype)
        lead = _shape(part)[:_ndim(part) - len(core)]
        flat.append(reshape(part, lead + (math.prod(core),)))
    return concat(*flat, axis=-1)


def _pack_np(arrays, lead):
    """NumPy side of :func:`_join`, for the impls: each result flattened over the axes after ``lead``."""
    dtype = np.result_type(*arrays)
    flat = [np.reshape(a, lead + (math.prod(np.shape(a)[len(lead):]),)).astype(dtype, copy=False) for a in arrays]
    return np.concatenate(flat, axis=-1)


def _transposed_jvp(jvp_joint, i):
    """The VJP rule of argument ``i`` of a primitive with a (linear in the tangent) joint JVP rule:
    reverse mode over ``dx -> jvp_joint(dx)``, recorded with the tape's own traced ops. The result
    is the exact transpose of the JVP (the transpose test holds to rounding) and differentiates again."""
    def rule(g, ans, *args, **params):
        x = args[i]
        zero = np.zeros(_shape(x), dtype=x.dtype)

        def linear(dx):
            tangents = [None] * len(args)
            tangents[i] = dx
            return (jvp_joint(tangents, ans, *args, **params),)

        trace, _, out_indices, _ = record(linear, (zero,), False)
        (ct,) = backward(trace, out_indices, (g,), 1, (zero,), batch_shape=_shape(g)[:_nb(g, ans)])
        return _real_like(ct, x)

    return rule


def _defjoint(name, impl, jvp_joint):
    """A one-argument primitive defined by its joint JVP rule; the VJP is its transpose."""
    return defprim(name, impl, vjp=(_transposed_jvp(jvp_joint, 0),), jvp_joint=jvp_joint)


def _hermitian_part(x):
    return (x + _mH(x)) * 0.5


# -- inv and solve: hand-written (hot enough to skip the transposition machinery)
inv = defprim("inv", np.linalg.inv,
              vjp=(lambda g, ans, x: -matmul(_mT(ans), matmul(g, _mT(ans))),),
              jvp=(lambda t, ans, x: -matmul(ans, matmul(t, ans)),))


def _solve_impl(a, b):
    return np.linalg.solve(a, b)


def _solve_vjp_b(g, ans, a, b):
    return solve(_mT(a), g)


def _solve_vjp_a(g, ans, a, b):
    return -matmul(solve(_mT(a), g), _mT(ans))


# b is a stack of matrices (..., n, k) here; the namespace turns a vector right-hand side into one.
solve = defprim("solve", _solve_impl, vjp=(_solve_vjp_a, _solve_vjp_b),
                jvp=(lambda t, ans, a, b: -solve(a, matmul(t, ans)), lambda t, ans, a, b: solve(a, t)),
                broadcasts=True)


# -- det: Jacobi's formula d det = sum(cofactor(A) * dA), with the cofactor matrix exact at singular A
def _cofactor(x, ans):
    """cof(A) = adj(A)^T, as traced ops of A: det(A) A^-T when A is well conditioned; else, for
    n <= 16, the Faddeev-LeVerrier (Cayley-Hamilton) polynomial, exact at every rank and to every
    order; beyond that the SVD (A = U S Vh: det(U) det(Vh) conj(U) diag(prod of the other s) conj(Vh)),
    whose first derivative is exact at rank n-1."""
    xv = concrete(x)
    n = xv.shape[-1]
    if n == 0:
        return np.zeros(xv.shape, dtype=xv.dtype)
    s = np.linalg.svd(xv, compute_uv=False)
    if np.all(s[..., -1] > n * np.finfo(xv.dtype).eps * s[..., 0]):
        return reshape(ans, _shape(ans) + (1, 1)) * _mT(inv(x))
    if n <= 16:
        return _cofactor_polynomial(x)
    u, sv, vh = _split(svd(x, full_matrices=False), _svd_cores(n, n, False))
    if _is_complex(x):
        phase = det(u) * det(vh)  # unit modulus, a smooth function of A
        sv, u, vh = real(sv), conj(u), conj(vh)
    else:
        phase = np.linalg.det(concrete(u)) * np.linalg.det(concrete(vh))  # +-1: locally constant
    adj_s = _prod_others(sv, (-1,))
    return matmul(u * _row(adj_s), vh) * reshape(phase, _shape(phase) + (1, 1))


def _cofactor_polynomial(x):
    """adj(A) = (-1)^(n+1) M_n with M_1 = I, M_k = A M_(k-1) + c_(n-k+1) I, c_(n-k) = -tr(A M_k) / k
    (Faddeev-LeVerrier), on A scaled to unit max-norm (cof is homogeneous of degree n-1)."""
    n = _shape(x)[-1]
    scale = float(np.max(np.abs(concrete(x)))) or 1.0
    a = x * (1.0 / scale)
    eye = np.eye(n, dtype=np.finfo(x.dtype).dtype)
    m = eye
    for k in range(2, n + 1):
        am = matmul(a, m) if k > 2 else a
        c = reduce_sum(_diag_part(am), axis=(-1,), keepdims=False) * (-1.0 / (k - 1))
        m = am + reshape(c, _shape(c) + (1, 1)) * eye
    adj = m if n % 2 else -m
    return _mT(adj) * scale ** (n - 1)


det = defprim("det", np.linalg.det,
              vjp=(lambda g, ans, x: reshape(g, _shape(g) + (1, 1)) * _cofactor(x, ans),),
              jvp=(lambda t, ans, x: reduce_sum(t * _cofactor(x, ans), axis=(-2, -1), keepdims=False),))


# -- slogdet: packed (sign, logabsdet) on the last axis
def _slogdet_impl(x):
    sign, logabs = np.linalg.slogdet(x)
    return np.stack([sign, logabs.astype(sign.dtype)], axis=-1)


def _slogdet_jvp(tangents, ans, x):
    (t,) = tangents
    c = reduce_sum(_mT(inv(x)) * t, axis=(-2, -1), keepdims=False)  # tr(A^-1 dA)
    if _is_complex(x):
        sign = _index_last(ans, 0)
        parts = [sign * (imag(c) * 1j), real(c)]
    else:
        parts = [c * 0, c]
    return _join(parts, [(), ()], np.dtype(x.dtype))


slogdet = _defjoint("slogdet", _slogdet_impl, _slogdet_jvp)


# -- cholesky (lower): the input is symmetrised, (A + A^H) / 2, as JAX does
def _cholesky_impl(x):
    return np.linalg.cholesky((x + np.conj(np.swapaxes(x, -1, -2))) / 2)


def _cholesky_jvp(tangents, ans, x):
    (t,) = tangents
    n = _shape(x)[-1]
    lower = ans
    # dL = L phi(L^-1 dA_s L^-H), phi: the strictly lower part plus half the (real) diagonal
    y = _mH(solve(lower, _mH(solve(lower, _hermitian_part(t)))))
    diag = real(y) if _is_complex(y) else y
    phi = _tril_strict(y) + where(np.eye(n, dtype=bool), diag, 0) * 0.5
    return matmul(lower, phi)


cholesky = _defjoint("cholesky", _cholesky_impl, _cholesky_jvp)


# -- eigh: packed (eigenvalues (n,), eigenvectors (n, n)); the input is symmetrised like cholesky
def _eigh_impl(x, uplo="L"):
    """``uplo``: the triangle LAPACK reads of the (already Hermitian) matrix: NumPy's ``eigh(a, UPLO="U")``
    gets exactly NumPy's eigenvectors, signs included (the other triangle runs another reduction)."""
    w, v = np.linalg.eigh((x + np.conj(np.swapaxes(x, -1, -2))) / 2, UPLO=uplo)
    return _pack_np([w, v], np.shape(x)[:-2])


def _eigh_jvp(tangents, ans, x, uplo="L"):
    (t,) = tangents
    n = _shape(x)[-1]
    w, v = _split(ans, [(n,), (n, n)])
    c = matmul(_mH(v), matmul(_hermitian_part(t), v))
    dw = _diag_part(c)
    if _is_complex(x):
        w, dw = real(w), real(dw)
    dv = matmul(v, _inverse_gaps(w) * c)
    return _join([dw, dv], [(n,), (n, n)], np.dtype(ans.dtype))


eigh = _defjoint("eigh", _eigh_impl, _eigh_jvp)


# -- eig (general square matrices): packed (eigenvalues (n,), eigenvectors (n, n)), always complex
def _eig_impl(x):
    w, v = np.linalg.eig(x)
    dtype = np.result_type(w.dtype, np.complex64)
    return _pack_np([w.astype(dtype, copy=False), v.astype(dtype, copy=False)], np.shape(x)[:-2])


def _eig_jvp(tangents, ans, x):
    """With C = V^-1 dA V: dw = diag(C); dV = V (F o C), F_ij = 1 / (w_j - w_i) off the diagonal, minus
    the part along each column that would change its norm (NumPy's eigenvectors have unit norm; their
    phase is LAPACK's choice, so only phase-invariant functions of them are comparable)."""
    (t,) = tangents
    n = _shape(x)[-1]
    w, v = _split(ans, [(n,), (n, n)])
    if not _is_complex(t):
        t = astype(t, dtype=np.dtype(ans.dtype))
    c = matmul(solve(v, t), v)
    dw = _diag_part(c)
    dv = matmul(v, _inverse_gaps(w) * c)
    dv = dv - v * _row(real(reduce_sum(conj(v) * dv, axis=(-2,), keepdims=False)))
    return _join([dw, dv], [(n,), (n, n)], np.dtype(ans.dtype))


eig = _defjoint("eig", _eig_impl, _eig_jvp)


# -- svd: packed (U, S, Vh)
def _svd_cores(m, n, full_matrices):
    k = min(m, n)
    return [(m, m if full_matrices else k), (k,), (n if full_matrices else k, n)]


def _svd_impl(x, full_matrices):
    u, s, vh = np.linalg.svd(x, full_matrices=full_matrices)
    return _pack_np([u, s, vh], np.shape(x)[:-2])


def _svd_jvp(tangents, ans, x, full_matrices):
    """With P = U^H dA V: dS = Re diag(P); U^H dU = F o (P S + S P^H) (+ i Im diag(P) / s, complex);
    V^H dV = F o (S P + P^H S); plus the parts outside span(U) / span(V) for non-square A,
    F_ij = 1 / (s_j^2 - s_i^2). Extra columns of a full U / V turn with the minimal rotation."""
    (t,) = tangents
    m, n = _shape(x)[-2:]
    k = min(m, n)
    cores = _svd_cores(m, n, full_matrices)
    u_all, s, vh_all = _split(ans, cores)
    cplx = _is_complex(x)
    if cplx:
        s = real(s)
    u = _index_last(u_all, slice(None), slice(0, k)) if cores[0][1] != k else u_all
    vh = _index_last(vh_all, slice(0, k), slice(None)) if cores[2][0] != k else vh_all
    v = _mH(vh)
    tv = matmul(t, v)
    p = matmul(_mH(u), tv)
    ph = _mH(p)
    ds = _diag_part(p)
    if cplx:
        ds = real(ds)
    f = _inverse_gaps(s * s)
    s_row, s_col = _row(s), _col(s)
    inv_s = _safe_reciprocal(s)
    omega_u = f * (p * s_row + s_col * ph)
    omega_v = f * (s_col * p + ph * s_row)
    if cplx:
        omega_u = omega_u + _diag_embed(imag(_diag_part(p)) * inv_s) * 1j
    du = matmul(u, omega_u)
    dv = matmul(v, omega_v)
    if m > k:
        du = du + (tv - matmul(u, p)) * _row(inv_s)
    if n > k:
        dv = dv + (matmul(_mH(t), u) - matmul(v, ph)) * _row(inv_s)
    if cores[0][1] != k:  # full U: the extra columns follow U (minimal rotation, no spin among themselves)
        u_perp = _index_last(u_all, slice(None), slice(k, None))
        du = concat(du, -matmul(u, matmul(_mH(du), u_perp)), axis=-1)
    if cores[2][0] != k:
        v_perp = _mH(_index_last(vh_all, slice(k, None), slice(None)))
        dv = concat(dv, -matmul(v, matmul(_mH(dv), v_perp)), axis=-1)
    return _join([du, ds, _mH(dv)], cores, np.dtype(ans.dtype))


svd = _defjoint("svd", _svd_impl, _svd_jvp)


# -- qr: packed (Q, R); mode "reduced" or "complete"
def _qr_cores(m, n, mode):
    k = min(m, n)
    return [(m, k), (k, n)] if mode == "reduced" else [(m, m), (m, n)]


def _qr_impl(x, mode):
    q, r = np.linalg.qr(x, mode=mode)
    return _pack_np([q, r], np.shape(x)[:-2])


def _qr_square_rule(t, q, r):
    """Tangents of A = QR, R square and invertible (m >= n): with C = Q^H dA R^-1,
    Q^H dQ = Omega (skew-Hermitian: strictly lower part of C, mirrored; i Im diag C), dR = (C - Omega) R."""
    t_rinv = _mT(solve(_mT(r), _mT(t)))
    c = matmul(_mH(q), t_rinv)
    low = _tril_strict(c)
    omega = low - _mH(low)
    if _is_complex(c):
        omega = omega + _diag_embed(imag(_diag_part(c))) * 1j
    upper = c - omega
    return t_rinv - matmul(q, upper), matmul(upper, r)


def _qr_jvp(tangents, ans, x, mode):
    (t,) = tangents
    m, n = _shape(x)[-2:]
    k = min(m, n)
    cores = _qr_cores(m, n, mode)
    q_all, r_all = _split(ans, cores)
    q = _index_last(q_all, slice(None), slice(0, k)) if cores[0][1] != k else q_all
    r = _index_last(r_all, slice(0, k), slice(None)) if cores[1][0] != k else r_all
    if m >= n:
        dq, dr = _qr_square_rule(t, q, r)
    else:  # A = [X Y] with X square: Q R_X = X, R = [R_X, Q^H Y]
        dq, dr_x = _qr_square_rule(_index_last(t, slice(None), slice(0, m)), q,
                                   _index_last(r, slice(None), slice(0, m)))
        y = _index_last(x, slice(None), slice(m, None))
        dr_y = matmul(_mH(dq), y) + matmul(_mH(q), _index_last(t, slice(None), slice(m, None)))
        dr = concat(dr_x, dr_y, axis=-1)
    if cores[0][1] != k:  # complete Q of a tall A: extra columns follow (minimal rotation); R's zero rows stay
        q_perp = _index_last(q_all, slice(None), slice(k, None))
        dq = concat(dq, -matmul(q, matmul(_mH(dq), q_perp)), axis=-1)
        dr = concat(dr, np.zeros(_shape(dr)[:-2] + (m - k, n), dtype=dr.dtype), axis=-2)
    return _join([dq, dr], cores, np.dtype(ans.dtype))


qr = _defjoint("qr", _qr_impl, _qr_jvp)


# -- pinv: the derivative for a locally constant rank (Golub and Pereyra)
def _pinv_impl(x, rtol):
    return np.linalg.pinv(x) if rtol is None else np.linalg.pinv(x, rtol=rtol)


def _pinv_jvp(tangents, ans, x, rtol):
    """dA+ = -A+ dA A+ + A+ A+^H dA^H (I - A A+) + (I - A+ A) dA^H A+^H A+."""
    (t,) = tangents
    m, n = _shape(x)[-2:]
    xp, th = ans, _mH(t)
    dtype = np.dtype(x.dtype)
    left = np.eye(m, dtype=dtype) - matmul(x, xp)
    right = np.eye(n, dtype=dtype) - matmul(xp, x)
    return (-matmul(xp, matmul(t, xp)) + matmul(matmul(xp, _mH(xp)), matmul(th, left))
            + matmul(right, matmul(th, matmul(_mH(xp), xp))))


pinv = _defjoint("pinv", _pinv_impl, _pinv_jvp)
