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

Non-differentiable points, one rule each (docs/conventions.md): ``abs``/``sign``
at 0 -> 0; ``maximum``/``minimum`` ties -> half to each side; ``max``/``min``
reductions -> split evenly among tied elements; ``clip`` at a bound -> 1 (the
bound is inclusive); ``sqrt`` at 0 -> inf (the true one-sided limit);
``x ** 0`` -> 0 for the base; ``floor``/``ceil``/``round``/``trunc``/``sign`` -> 0.
"""

from __future__ import annotations

import math

import numpy as np

from ._core import Primitive, Tracer, _ndim, _shape

LINEAR = "linear"
PRIMITIVES: dict[str, Primitive] = {}


def defprim(name, impl, vjp=(), jvp=(), *, jvp_joint=None, broadcasts=False):
    """Create and register a primitive; ``jvp=LINEAR`` (or a LINEAR entry) reuses the primitive itself."""
    vjps = vjp if vjp is None else tuple(vjp)
    prim = Primitive(name, impl, vjps, (), jvp_joint=jvp_joint, broadcasts=broadcasts)
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


def defnondiff(name, impl):
    """A primitive whose outputs carry no derivative (comparisons, argmax, integer results)."""
    return defprim(name, impl, vjp=None)


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

def _unary(name, impl, dfdx):
    """An elementwise primitive with derivative ``dfdx(ans, x)`` (holomorphic for complex input)."""
    return defprim(name, impl,
                   vjp=(lambda g, ans, x: g * dfdx(ans, x),),
                   jvp=(lambda t, ans, x: t * dfdx(ans, x),))


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
tanh = _unary("tanh", np.tanh, lambda ans, x: 1 - ans * ans)
arcsinh = _unary("asinh", np.arcsinh, lambda ans, x: 1 / sqrt(x * x + 1))
arccosh = _unary("acosh", np.arccosh, lambda ans, x: 1 / sqrt(x * x - 1))
arctanh = _unary("atanh", np.arctanh, lambda ans, x: 1 / (1 - x * x))
square = _unary("square", np.square, lambda ans, x: 2 * x)
reciprocal = _unary("reciprocal", np.reciprocal, lambda ans, x: -(ans * ans))


def _sign_impl(x):
    if np.iscomplexobj(x):  # Array API: x / |x|, 0 at 0
        a = np.abs(x)
        return np.where(a == 0, 0, x / np.where(a == 0, 1, a)).astype(x.dtype)
    return np.sign(x)


sign = defprim("sign", _sign_impl, vjp=(None,), jvp=(None,))
floor = defprim("floor", np.floor, vjp=(None,), jvp=(None,))
ceil = defprim("ceil", np.ceil, vjp=(None,), jvp=(None,))
trunc = defprim("trunc", np.trunc, vjp=(None,), jvp=(None,))
round_ = defprim("round", np.round, vjp=(None,), jvp=(None,))


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
real = defprim("real", np.real, vjp=(lambda g, ans, x: _complexify(g, x),), jvp=LINEAR)
imag = defprim("imag", np.imag, vjp=(lambda g, ans, x: _complexify(-1j * g, x) if _is_complex(x) else g * 0,),
               jvp=LINEAR)
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
            return g * (2 * x)
        return g * (y * x ** (y - 1))
    return g * where(y == 0, 0, y * x ** where(y == 0, 1, y - 1))


def _pow_vjp_y(g, ans, x, y):
    # d/dy x**y = log(x) * x**y; 0 at x == 0 (JAX's choice)
    return g * (ans * log(where(x == 0, 1, x)))


power = defprim("pow", np.power,
                vjp=(_pow_vjp_x, _pow_vjp_y),
                jvp=(lambda t, ans, x, y: _pow_vjp_x(t, ans, x, y), lambda t, ans, x, y: _pow_vjp_y(t, ans, x, y)),
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


def _mm_rules(op):
    wins = (lambda x, y: x > y) if op == "max" else (lambda x, y: x < y)

    def wx(x, y):
        w = np.where(_val(x) == _val(y), 0.5, np.where(wins(_val(x), _val(y)), 1.0, 0.0))
        return w.astype(np.result_type(_val(x), _val(y)), copy=False)

    return ((lambda g, ans, x, y: g * wx(x, y), lambda g, ans, x, y: g * (1 - wx(x, y))),
            (lambda t, ans, x, y: t * wx(x, y), lambda t, ans, x, y: t * (1 - wx(x, y))))


def _val(x):
    while isinstance(x, Tracer):
        x = x.value
    return x


_rules = _mm_rules("max")
maximum = defprim("maximum", np.maximum, vjp=_rules[0], jvp=_rules[1], broadcasts=True)
_rules = _mm_rules("min")
minimum = defprim("minimum", np.minimum, vjp=_rules[0], jvp=_rules[1], broadcasts=True)

arctan2 = defprim("atan2", np.arctan2,
                  vjp=(lambda g, ans, y, x: g * x / (x * x + y * y), lambda g, ans, y, x: -g * y / (x * x + y * y)),
                  jvp=(lambda t, ans, y, x: t * x / (x * x + y * y), lambda t, ans, y, x: -t * y / (x * x + y * y)),
                  broadcasts=True)
hypot = defprim("hypot", np.hypot,
                vjp=(lambda g, ans, x, y: g * x / ans, lambda g, ans, x, y: g * y / ans),
                jvp=(lambda t, ans, x, y: t * x / ans, lambda t, ans, x, y: t * y / ans), broadcasts=True)
logaddexp = defprim("logaddexp", np.logaddexp,
                    vjp=(lambda g, ans, x, y: g * exp(x - ans), lambda g, ans, x, y: g * exp(y - ans)),
                    jvp=(lambda t, ans, x, y: t * exp(x - ans), lambda t, ans, x, y: t * exp(y - ans)),
                    broadcasts=True)
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
    xv = _val(x)
    m = np.ones(np.shape(xv), dtype=bool)
    if lo is not None:
        m &= xv >= _val(lo)
    if hi is not None:
        m &= xv <= _val(hi)
    return m


clip = defprim("clip", _clip_impl,
               vjp=(lambda g, ans, x, lo, hi: where(_inside(x, lo, hi), g, 0),
                    lambda g, ans, x, lo, hi: where(_val(x) < _val(lo), g, 0),
                    lambda g, ans, x, lo, hi: where(_val(x) > _val(hi), g, 0)),
               jvp=(lambda t, ans, x, lo, hi: where(_inside(x, lo, hi), t, 0),
                    lambda t, ans, x, lo, hi: where(_val(x) < _val(lo), t, 0),
                    lambda t, ans, x, lo, hi: where(_val(x) > _val(hi), t, 0)),
               broadcasts=True)

# ------------------------------------------------------------------------- comparisons and friends
for _name, _fn in [("equal", np.equal), ("not_equal", np.not_equal), ("less", np.less),
                   ("less_equal", np.less_equal), ("greater", np.greater), ("greater_equal", np.greater_equal),
                   ("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite),
                   ("signbit", np.signbit), ("logical_and", np.logical_and), ("logical_or", np.logical_or),
                   ("logical_xor", np.logical_xor), ("logical_not", np.logical_not)]:
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
    nb = _nb(g, ans)
    gs = _shape(g)
    xs = _shape(x)
    if not keepdims:
        g = reshape(g, gs[:nb] + _keep_shape(xs, axis))
    return broadcast_to(g, gs[:nb] + xs)


def _sum_impl(x, axis, keepdims):
    return np.asarray(np.sum(x, axis=axis, keepdims=keepdims))


reduce_sum = defprim("sum", _sum_impl,
                     vjp=(lambda g, ans, x, axis, keepdims: _expand_reduced(g, ans, x, axis, keepdims),),
                     jvp=LINEAR)


def _max_impl(x, axis, keepdims):
    return np.asarray(np.max(x, axis=axis, keepdims=keepdims))


def _min_impl(x, axis, keepdims):
    return np.asarray(np.min(x, axis=axis, keepdims=keepdims))


def _extremum_weights(ans, x, axis, keepdims):
    """Indicator of the extremal elements, divided by how many tie (the evenly-split convention)."""
    xv, av = _val(x), _val(ans)
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
    from ._core import unbroadcast
    return unbroadcast(g, _shape(x), _nb(g, ans))


def _broadcast_jvp(t, ans, x, shape):
    nb = _ndim(t) - _ndim(x)
    ts = _shape(t)
    t = reshape(t, ts[:nb] + (1,) * (len(shape) - _ndim(x)) + ts[nb:])
    return broadcast_to(t, ts[:nb] + tuple(shape))


def _broadcast_impl(x, shape):
    # np.broadcast_to costs microseconds of argument handling; small results are cheaper to materialise.
    if math.prod(shape) <= 4096:
        out = np.empty(shape, dtype=np.result_type(x))
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


def concat(*xs, axis):
    """Concatenate along a negative ``axis``; built per arity so the rule table stays one row."""
    prim = _concat_prims.get(len(xs))
    if prim is None:
        n = len(xs)
        prim = defprim(f"concat{n}", _concat_impl, vjp=tuple(_concat_vjp(i) for i in range(n)),
                       jvp=tuple(_concat_jvp(i) for i in range(n)))
        _concat_prims[n] = prim
    return prim(*xs, axis=axis)


def _concat_jvp(i):
    def rule(t, ans, *xs, axis):
        nb = _ndim(t) - _ndim(xs[i])
        ts = _shape(t)
        pieces = [t if k == i else np.zeros(ts[:nb] + _shape(x), dtype=t.dtype) for k, x in enumerate(xs)]
        return concat(*pieces, axis=axis)
    return rule


_concat_prims: dict[int, Primitive] = {}


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


# Operands are at least 2-D here; the namespace turns vectors into matrices and back.
matmul = defprim("matmul", np.matmul, vjp=(_matmul_vjp_a, _matmul_vjp_b),
                 jvp=(lambda t, ans, a, b: matmul(t, b), lambda t, ans, a, b: matmul(a, t)), broadcasts=True)

