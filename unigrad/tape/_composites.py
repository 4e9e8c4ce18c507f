"""Composite functions of the tape's namespace, written with its primitives: statistics, softmax and
friends, and the NumPy spellings people reach for (``cumsum``, ``dot``, ``trace``, ``transpose``...).

They are plain functions of traced values, so their derivatives (of any order) come from the
primitives' rules; none of them needs a rule of its own.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from . import _functions as xp
from . import _linalg
from . import _primitives as P
from ._tracer import _ndim, _shape, concrete

__all__ = [
    "mean", "var", "std", "logsumexp", "softmax", "log_softmax", "relu", "cumsum", "cumprod",
    "dot", "inner", "outer", "trace", "diagonal", "diag", "swapaxes", "transpose", "ravel",
    "atleast_1d", "atleast_2d", "atleast_3d", "concatenate", "hstack", "vstack",
    "absolute", "power", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "arctan2",
    "amax", "amin", "conjugate", "true_divide", "r_", "c_",
]


# -------------------------------------------------------------------- statistics

def mean(x, /, *, axis=None, keepdims=False):
    x = xp._arr(x)
    axes = xp._axes(axis, _ndim(x))
    n = math.prod(_shape(x)[a] for a in axes)
    return P.reduce_sum(x, axis=axes, keepdims=keepdims) / n


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Variance (``correction=1`` for the unbiased estimate); |x - mean|^2 for complex x."""
    x = xp._arr(x)
    axes = xp._axes(axis, _ndim(x))
    n = math.prod(_shape(x)[a] for a in axes)
    centred = x - mean(x, axis=axes, keepdims=True)
    sq = xp.real(centred * xp.conj(centred)) if xp._is_complex(x) else centred * centred
    return P.reduce_sum(sq, axis=axes, keepdims=keepdims) / (n - correction)


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Standard deviation. Where the variance is 0 the derivative is 0 (a subgradient, like
    ``vector_norm`` at 0), not the NaN of sqrt's infinite slope times a zero."""
    v = var(x, axis=axis, correction=correction, keepdims=keepdims)
    zero = concrete(v) == 0
    if not np.any(zero):
        return xp.sqrt(v)
    return xp.where(zero, 0, xp.sqrt(xp.where(zero, 1, v)))


def logsumexp(x, /, *, axis=None, keepdims=False):
    """log(sum(exp(x))), computed stably (the shift by the maximum carries no derivative)."""
    x = xp._arr(x)
    axes = xp._axes(axis, _ndim(x))
    shift = np.max(concrete(x), axis=axes, keepdims=True) if math.prod(_shape(x)) else 0.0
    shift = np.where(np.isfinite(shift), shift, 0)
    out = xp.log(P.reduce_sum(xp.exp(x - shift), axis=axes, keepdims=True)) + shift
    if keepdims:
        return out
    return xp.reshape(out, tuple(s for k, s in enumerate(_shape(out)) if k - _ndim(out) not in axes))


def softmax(x, /, *, axis=-1):
    """exp(x) / sum(exp(x)) along ``axis``, computed stably."""
    return xp.exp(log_softmax(x, axis=axis))


def log_softmax(x, /, *, axis=-1):
    """x - logsumexp(x) along ``axis``, computed stably."""
    return x - logsumexp(x, axis=axis, keepdims=True)


def relu(x, /):
    """max(x, 0), with derivative 0 at exactly 0, as torch, JAX and TensorFlow define ``relu``
    (``maximum(x, 0)`` splits a tie in half); NaN stays NaN."""
    x = xp._arr(x)
    return xp.where(concrete(x) <= 0, 0, x)


# -------------------------------------------------------------------- NumPy spellings

def cumsum(x, /, axis=None, dtype=None):
    """NumPy's cumsum: the flattened array when ``axis`` is None."""
    x = xp._arr(x)
    if axis is None:
        x, axis = xp.reshape(x, (-1,)), 0
    return xp.cumulative_sum(x, axis=axis, dtype=dtype)


def cumprod(x, /, axis=None, dtype=None):
    """NumPy's cumprod: the flattened array when ``axis`` is None."""
    x = xp._arr(x)
    if axis is None:
        x, axis = xp.reshape(x, (-1,)), 0
    return xp.cumulative_prod(x, axis=axis, dtype=dtype)


def dot(x1, x2, /):
    """NumPy's dot: matmul for 1-D and 2-D operands, a sum product over the last/second-last axes otherwise."""
    if _ndim(x1) == 0 or _ndim(x2) == 0:
        return xp.multiply(x1, x2)
    if _ndim(x2) <= 2:
        return xp.matmul(x1, x2)
    return xp.tensordot(x1, x2, axes=((_ndim(x1) - 1,), (_ndim(x2) - 2,)))


def inner(x1, x2, /):
    """NumPy's inner: a sum product over the last axes."""
    if _ndim(x1) == 0 or _ndim(x2) == 0:
        return xp.multiply(x1, x2)
    return xp.tensordot(x1, x2, axes=((_ndim(x1) - 1,), (_ndim(x2) - 1,)))


def outer(x1, x2, /):
    """NumPy's outer: both inputs flattened."""
    return xp.reshape(x1, (-1, 1)) * xp.reshape(x2, (1, -1))


def diagonal(x, /, offset=0, axis1=0, axis2=1):
    """NumPy's diagonal (axes 0 and 1 by default; ``linalg.diagonal`` uses the last two)."""
    nd = _ndim(x)
    a1, a2 = axis1 % nd, axis2 % nd
    rest = [k for k in range(nd) if k not in (a1, a2)]
    return _linalg.diagonal(xp.permute_dims(x, (*rest, a1, a2)), offset=offset)


def trace(x, /, offset=0, axis1=0, axis2=1, dtype=None):
    """NumPy's trace (axes 0 and 1 by default; ``linalg.trace`` uses the last two)."""
    return xp.sum(diagonal(x, offset=offset, axis1=axis1, axis2=axis2), axis=-1, dtype=dtype)


def diag(x, /, k=0):
    """NumPy's diag: the k-th diagonal of a matrix, or a matrix with a vector on its k-th diagonal."""
    x = xp._arr(x)
    if _ndim(x) == 2:
        return diagonal(x, offset=k)
    if _ndim(x) != 1:
        raise ValueError(f"diag: the input must be 1-D or 2-D; got shape {_shape(x)}")
    n = _shape(x)[0] + builtins.abs(k)
    rows = np.arange(_shape(x)[0]) + builtins.max(0, -k)
    return P.scatter_add(x, index=(rows, rows + k), shape=(n, n), nb=0, advanced=True)


def swapaxes(x, axis1, axis2, /):
    nd = _ndim(x)
    perm = list(range(nd))
    perm[axis1 % nd], perm[axis2 % nd] = perm[axis2 % nd], perm[axis1 % nd]
    return xp.permute_dims(x, tuple(perm))


def transpose(x, /, axes=None):
    """NumPy's transpose: all axes reversed when ``axes`` is None."""
    return xp.permute_dims(x, tuple(range(_ndim(x)))[::-1] if axes is None else tuple(axes))


def ravel(x, /):
    return xp.reshape(x, (-1,))


def _atleast(n, arrays):
    out = []
    for a in arrays:
        a = xp._arr(a)
        shape = _shape(a)
        if len(shape) < n:
            pad = {1: lambda s: (1,) * (1 - len(s)) + s,
                   2: lambda s: (1,) * (2 - len(s)) + s,
                   3: lambda s: (1, 1, 1) if not s else ((1, s[0], 1) if len(s) == 1 else s + (1,))}[n]
            a = xp.reshape(a, pad(shape))
        out.append(a)
    return out[0] if len(out) == 1 else out


def atleast_1d(*arrays):
    return _atleast(1, arrays)


def atleast_2d(*arrays):
    return _atleast(2, arrays)


def atleast_3d(*arrays):
    return _atleast(3, arrays)


def concatenate(arrays, /, axis=0):
    return xp.concat(arrays, axis=axis)


def hstack(arrays, /):
    arrays = atleast_1d(*arrays) if len(arrays) > 1 else [atleast_1d(*arrays)]
    return xp.concat(arrays, axis=0 if _ndim(arrays[0]) == 1 else 1)


def vstack(arrays, /):
    arrays = atleast_2d(*arrays) if len(arrays) > 1 else [atleast_2d(*arrays)]
    return xp.concat(arrays, axis=0)


absolute, power, true_divide, conjugate = xp.abs, xp.pow, xp.divide, xp.conj
arcsin, arccos, arctan, arctan2 = xp.asin, xp.acos, xp.atan, xp.atan2
arcsinh, arccosh, arctanh = xp.asinh, xp.acosh, xp.atanh
amax, amin = xp.max, xp.min


# -------------------------------------------------------------------- NumPy's r_ and c_

class _Concatenator:
    """NumPy's ``r_`` (rows: ``axis=0``) and ``c_`` (columns: 1-d pieces become columns, joined on the
    last axis) for traced values: ``xp.r_[x, c, 1:10]``. Items are arrays (traced or not), Python
    numbers and slices (``start:stop:step`` as ``arange``; a complex step ``5j`` as ``linspace`` with
    that many points). NumPy's string directives (``'r'``, ``'0,2,1'``) are refused with a TypeError.
    NumPy's own ``np.r_`` cannot take traced values: it converts each item to a NumPy array."""

    def __init__(self, name, columns):
        self._name, self._columns = name, columns

    def _piece(self, item):
        if isinstance(item, str):
            raise TypeError(f"{self._name}[...]: string directives ({item!r}) are not supported on traced "
                            f"values; use concatenate/stack")
        if isinstance(item, slice):
            start = 0 if item.start is None else item.start
            step = 1 if item.step is None else item.step
            if isinstance(step, complex):
                item = np.linspace(start, item.stop, int(abs(step)))
            else:
                item = np.arange(start, item.stop, step)
        item = xp.asarray(item)
        if _ndim(item) == 0:
            item = xp.reshape(item, (1,))
        if self._columns and _ndim(item) == 1:
            item = xp.reshape(item, (_shape(item)[0], 1))
        return item

    def __getitem__(self, key):
        items = key if isinstance(key, tuple) else (key,)
        pieces = [self._piece(i) for i in items]
        return xp.concat(pieces, axis=-1 if self._columns else 0)

    def __repr__(self):
        return f"unigrad.tape {self._name}"


r_ = _Concatenator("r_", columns=False)
c_ = _Concatenator("c_", columns=True)
