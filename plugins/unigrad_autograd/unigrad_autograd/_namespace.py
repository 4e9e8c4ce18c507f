"""The Array API namespace of the ``autograd`` backend, over ``autograd.numpy``.

Portable functions call ``xp = unigrad.namespace(x)`` and then ``xp.sin``, ``xp.sum``,
``xp.permute_dims``...; inside this backend's transforms ``x`` is an autograd ``ArrayBox`` and
``xp`` is this module. Most names are ``autograd.numpy``'s own (NumPy and the Array API share
them); the rest are spelt differently in NumPy and are mapped below. unigrad's generic
defaults (Jacobians, batched Jacobians, hessian, vmap) call ``eye``, ``zeros``, ``reshape``,
``permute_dims``, ``concat``, ``stack``, ``broadcast_to``, ``astype``, ``zeros_like`` and
``ones_like``, with ``device=`` where the standard has it.
"""

from __future__ import annotations

import math

import autograd.numpy as anp
import numpy as np
from autograd.extend import defjvp, defvjp, primitive
from autograd.numpy.numpy_boxes import ArrayBox
from autograd.tracer import getval

# Same name, same meaning in NumPy and the Array API standard (autograd differentiates each).
_SHARED = [
    "abs", "sin", "cos", "tan", "sinh", "cosh", "tanh", "exp", "expm1", "log", "log1p", "log2", "log10",
    "sqrt", "square", "sign", "negative", "floor", "ceil", "round", "real", "imag", "conj",
    "isnan", "isinf", "isfinite", "all", "any", "add", "subtract", "multiply", "divide", "maximum", "minimum", "logaddexp", "remainder",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    "sum", "prod", "mean", "max", "min", "reshape", "stack", "expand_dims", "squeeze", "matmul", "tensordot", "zeros_like", "ones_like", "full_like",
]
globals().update({name: getattr(anp, name) for name in _SHARED})

# Spelt differently in NumPy.
acos, asin, atan, acosh, asinh, atanh = anp.arccos, anp.arcsin, anp.arctan, anp.arccosh, anp.arcsinh, anp.arctanh
atan2, pow, concat, permute_dims = anp.arctan2, anp.power, anp.concatenate, anp.transpose

# The dtypes, as NumPy's scalar types (what ``x.dtype`` compares equal to).
bool = np.bool_  # noqa: A001 (the standard's name)
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float32, float64, complex64, complex128 = np.float32, np.float64, np.complex64, np.complex128
e, pi, inf, nan = np.e, np.pi, np.inf, np.nan


def _cpu(device):
    """autograd computes on NumPy arrays: the CPU is its only device."""
    if device not in (None, "cpu"):
        raise ValueError(f"device: the autograd backend has only 'cpu'; got {device!r}")


# Primitives of this plugin: autograd's own rule is missing (no JVP for astype or flip) or wrong at
# zero size (broadcast_to). Each derivative calls a primitive again, so every order is defined.
@primitive
def _cast(x, dtype):
    x = np.asarray(x)
    if np.iscomplexobj(x) and not np.issubdtype(np.dtype(dtype), np.complexfloating):
        x = x.real  # complex -> real keeps the real part (without NumPy's ComplexWarning)
    return x.astype(dtype)


defvjp(_cast, lambda ans, x, dtype: lambda g: _cast(g, np.result_type(x)))
defjvp(_cast, lambda g, ans, x, dtype: _cast(g, dtype))


def astype(x, dtype, /, *, copy=True, device=None):
    _cpu(device)
    return _cast(x, dtype)


@primitive
def _flip(x, axis):
    return np.flip(x, axis)


defvjp(_flip, lambda ans, x, axis: lambda g: _flip(g, axis))
defjvp(_flip, lambda g, ans, x, axis: _flip(g, axis))


def flip(x, /, *, axis=None):
    return _flip(x, axis)


@primitive
def _broadcast_to(x, shape):
    return np.broadcast_to(x, shape)


def _unbroadcast(g, x_shape):
    """The cotangent of ``broadcast_to(x, g.shape)``: sums over the axes broadcasting added or stretched
    (a size-1 axis stretched to 0 included, where autograd's own rule keeps g's empty axis)."""
    lead = anp.ndim(g) - len(x_shape)
    g_shape = anp.shape(g)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(x_shape) if n == 1 and g_shape[lead + i] != 1)
    return anp.reshape(anp.sum(g, axis=axes), x_shape)


defvjp(_broadcast_to, lambda ans, x, shape: lambda g: _unbroadcast(g, anp.shape(x)))
defjvp(_broadcast_to, lambda g, ans, x, shape: _broadcast_to(g, shape))


def broadcast_to(x, /, shape):
    return _broadcast_to(x, tuple(shape))


def where(condition, x1, x2, /):
    # autograd's rule for where does not undo broadcasting (a (1,) branch beside a (2,) one gets a
    # (2,) cotangent); broadcasting both branches first lets broadcast_to's rule undo it.
    shape = np.broadcast_shapes(anp.shape(condition), anp.shape(x1), anp.shape(x2))
    return anp.where(condition, broadcast_to(x1, shape), broadcast_to(x2, shape))


def clip(x, /, min=None, max=None):  # noqa: A002 (the standard's names)
    if min is None and max is None:
        return x * 1  # a new array, as the standard asks
    if not isinstance(min, ArrayBox) and not isinstance(max, ArrayBox):
        return anp.clip(x, min, max)  # derivative: 1 inside [min, max], 0 where clipped
    # bounds that are themselves differentiated: each element's derivative goes to whichever it took
    out = x
    if min is not None:
        out = where(out < min, min, out)
    if max is not None:
        out = where(out > max, max, out)
    return out


def _along(x, indices, axis):
    """``x`` gathered along ``axis`` at ``indices`` (an integer array of ``x``'s rank), by indexing,
    which autograd differentiates both ways."""
    shape = anp.shape(x)
    axis = axis % len(shape)
    index = tuple(indices if i == axis else np.arange(n).reshape((1,) * i + (n,) + (1,) * (len(shape) - i - 1))
                  for i, n in enumerate(shape))
    return x[index]


def take_along_axis(x, indices, /, *, axis=-1):
    return _along(x, np.asarray(getval(indices)), axis)


def take(x, indices, /, *, axis=None):
    if axis is None:
        if anp.ndim(x) != 1:
            raise ValueError(f"take: axis is required for an x of {anp.ndim(x)} dimensions (shape {anp.shape(x)})")
        axis = 0
    return x[(slice(None),) * (axis % anp.ndim(x)) + (np.asarray(getval(indices)),)]


def sort(x, /, *, axis=-1, descending=False, stable=True):
    values = np.asarray(getval(x))
    if descending:
        # a stable descending order keeps equal elements in their order: sort the reversed array
        # ascending and read it backwards
        n = values.shape[axis]
        order = n - 1 - np.flip(np.argsort(np.flip(values, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(values, axis=axis, kind="stable")
    return _along(x, order, axis)


def result_type(*arrays_and_dtypes):
    return np.result_type(*(getval(a) for a in arrays_and_dtypes))


def matrix_transpose(x, /):
    return anp.swapaxes(x, -1, -2)


def vecdot(x1, x2, /, *, axis=-1):
    return anp.sum(anp.conj(x1) * x2, axis=axis)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    # autograd's own JVP of var fails for a tuple axis (its rule names an undefined ``np``)
    shape = anp.shape(x)
    axes = range(len(shape)) if axis is None else (axis,) if isinstance(axis, int) else axis
    n = math.prod(shape[a] for a in axes)
    d = x - anp.mean(x, axis=axis, keepdims=True)
    return anp.sum(anp.real(d * anp.conj(d)), axis=axis, keepdims=keepdims) / (n - correction)


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    return anp.std(x, axis=axis, ddof=correction, keepdims=keepdims)


def asarray(obj, /, *, dtype=None, device=None, copy=None):
    _cpu(device)
    return anp.array(obj, dtype=dtype) if copy else anp.asarray(obj, dtype=dtype)


def zeros(shape, *, dtype=None, device=None):
    _cpu(device)
    return np.zeros(shape, dtype=dtype or np.float64)


def ones(shape, *, dtype=None, device=None):
    _cpu(device)
    return np.ones(shape, dtype=dtype or np.float64)


def full(shape, fill_value, *, dtype=None, device=None):
    _cpu(device)
    return np.full(shape, fill_value, dtype=dtype)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    _cpu(device)
    return np.eye(n_rows, n_cols, k=k, dtype=dtype or np.float64)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    _cpu(device)
    return np.arange(start, stop, step, dtype=dtype)


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    _cpu(device)
    return np.linspace(start, stop, num, dtype=dtype, endpoint=endpoint)


from . import _linalg as linalg  # noqa: E402 (xp.linalg: built from the functions above)
