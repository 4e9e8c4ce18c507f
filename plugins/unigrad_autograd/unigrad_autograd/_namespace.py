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

import autograd.numpy as anp
import numpy as np

# Same name, same meaning in NumPy and the Array API standard (autograd differentiates each).
_SHARED = [
    "abs", "sin", "cos", "tan", "sinh", "cosh", "tanh", "exp", "expm1", "log", "log1p", "log2", "log10",
    "sqrt", "square", "sign", "negative", "floor", "ceil", "round", "real", "imag", "conj",
    "isnan", "isinf", "isfinite", "add", "subtract", "multiply", "divide", "maximum", "minimum", "logaddexp",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    "sum", "prod", "mean", "max", "min", "reshape", "stack", "expand_dims", "squeeze", "flip", "clip", "matmul", "tensordot", "zeros_like", "ones_like", "full_like",
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


def astype(x, dtype, /, *, copy=True, device=None):
    _cpu(device)
    return x.astype(dtype)  # ArrayBox.astype is differentiable


def broadcast_to(x, /, shape):
    # autograd's rule for broadcast_to cannot add leading axes: add them with a reshape first
    shape = tuple(shape)
    x_shape = anp.shape(x)
    if len(x_shape) < len(shape):
        x = anp.reshape(x, (1,) * (len(shape) - len(x_shape)) + x_shape)
    return anp.broadcast_to(x, shape)


def where(condition, x1, x2, /):
    # autograd's rule for where does not undo broadcasting (a (1,) branch beside a (2,) one gets a
    # (2,) cotangent); broadcasting both branches first lets broadcast_to's rule undo it.
    shape = np.broadcast_shapes(anp.shape(condition), anp.shape(x1), anp.shape(x2))
    return anp.where(condition, broadcast_to(x1, shape), broadcast_to(x2, shape))


def matrix_transpose(x, /):
    return anp.swapaxes(x, -1, -2)


def vecdot(x1, x2, /, *, axis=-1):
    return anp.sum(anp.conj(x1) * x2, axis=axis)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    return anp.var(x, axis=axis, ddof=correction, keepdims=keepdims)


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
