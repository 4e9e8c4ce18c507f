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

import builtins
import math

import autograd.numpy as anp
import numpy as np
from autograd.extend import defjvp, defvjp, primitive
from autograd.numpy.numpy_boxes import ArrayBox
from autograd.tracer import getval

# Same name, same meaning in NumPy and the Array API standard (autograd differentiates each).
_SHARED = [
    "abs", "sin", "cos", "tan", "sinh", "cosh", "tanh", "exp", "expm1", "log", "log1p", "log2", "log10",
    "sqrt", "square", "sign", "negative", "floor", "ceil", "round", "trunc", "real", "imag", "conj",
    "isnan", "isinf", "isfinite", "all", "any", "add", "subtract", "multiply", "divide", "maximum", "minimum", "logaddexp", "remainder",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    "sum", "prod", "mean", "max", "min", "reshape", "stack", "expand_dims", "squeeze", "matmul", "tensordot", "moveaxis", "tril", "triu", "zeros_like", "ones_like", "full_like",
]
globals().update({name: getattr(anp, name) for name in _SHARED})
# (so in this module ``sum``, ``max``, ``min``, ``abs``, ``round``, ``all``, ``any`` and ``bool`` are the
# standard's, not Python's builtins: the code below says ``builtins.max`` where it means Python's)

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


defvjp(_cast, lambda ans, x, dtype: lambda g: _cast(g, np.result_type(getval(x))))
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


@primitive
def _clip(x, lo, hi):
    return np.clip(x, lo, hi)


def _inside(x, lo, hi):
    """1 where min <= x <= max (the bounds included: unigrad's rule, docs/conventions.md), else 0."""
    x, lo, hi = (None if v is None else np.asarray(getval(v)) for v in (x, lo, hi))  # a constant mask
    keep = np.ones(x.shape, dtype=np.bool_)
    if lo is not None:
        keep &= x >= lo
    if hi is not None:
        keep &= x <= hi
    return keep.astype(np.result_type(x))


defvjp(_clip, lambda ans, x, lo, hi: lambda g: g * _inside(x, lo, hi))
defjvp(_clip, lambda g, ans, x, lo, hi: g * _inside(x, lo, hi))


def clip(x, /, min=None, max=None):  # noqa: A002 (the standard's names)
    if min is None and max is None:
        return x * 1  # a new array, as the standard asks
    if not isinstance(min, ArrayBox) and not isinstance(max, ArrayBox):
        return _clip(x, min, max)
    # bounds that are themselves differentiated: each element's derivative goes to whichever value it
    # took (x at a tie)
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


def broadcast_arrays(*arrays):
    shape = np.broadcast_shapes(*(anp.shape(a) for a in arrays))
    return [broadcast_to(a, shape) for a in arrays]


def positive(x, /):
    return x * 1


@primitive
def _hypot(x1, x2):
    return np.hypot(x1, x2)


defvjp(_hypot, lambda ans, x1, x2: lambda g: g * x1 / ans, lambda ans, x1, x2: lambda g: g * x2 / ans)
defjvp(_hypot, lambda g, ans, x1, x2: g * x1 / ans, lambda g, ans, x1, x2: g * x2 / ans)


def hypot(x1, x2, /):
    x1, x2 = broadcast_arrays(x1, x2)  # the rules above assume equal shapes; broadcast_to's undoes it
    return _hypot(x1, x2)


def copysign(x1, x2, /):
    # |x1| with x2's sign: x1 times +-1, a constant (no derivative with respect to x2)
    a, b = np.asarray(getval(x1)), np.asarray(getval(x2))
    flip_sign = np.where(np.signbit(a) == np.signbit(b), 1, -1).astype(np.result_type(a, b))
    return x1 * flip_sign


def _moved_last(x, axis):
    """``x`` with ``axis`` last, and the function that puts it back."""
    axis = axis % anp.ndim(x)
    return anp.moveaxis(x, axis, -1), lambda y: anp.moveaxis(y, -1, axis)


def _cumulative_input(name, x, axis, dtype):
    """The standard's rules for a cumulative function's ``axis`` (required beyond 1-D) and ``dtype``."""
    if axis is None:
        if anp.ndim(x) != 1:
            raise ValueError(f"{name}: axis is required for an x of {anp.ndim(x)} dimensions")
        axis = 0
    return (x if dtype is None else astype(x, dtype)), axis


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    x, axis = _cumulative_input("cumulative_sum", x, axis, dtype)
    out = anp.cumsum(x, axis=axis)
    if include_initial:
        shape = list(anp.shape(x))
        shape[axis] = 1
        out = anp.concatenate([np.zeros(shape, dtype=result_type(out)), out], axis=axis)
    return out


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    # a running product, step by step: exact derivatives where x has zeros (unlike a division by x)
    x, axis = _cumulative_input("cumulative_prod", x, axis, dtype)
    moved, back = _moved_last(x, axis)
    steps = [anp.ones(anp.shape(moved)[:-1], dtype=result_type(x))] if include_initial else []
    for i in range(anp.shape(moved)[-1]):
        steps.append(moved[..., i] if not steps else steps[-1] * moved[..., i])
    if not steps:
        return x * 1  # an empty axis
    return back(anp.stack(steps, axis=-1))


def repeat(x, repeats, /, *, axis=None):
    if axis is None:
        x, axis = anp.reshape(x, (-1,)), 0
    n = anp.shape(x)[axis]
    return take(x, np.repeat(np.arange(n), np.asarray(getval(repeats))), axis=axis)


def roll(x, /, shift, *, axis=None):
    if axis is None:
        total = builtins.sum(shift) if isinstance(shift, (tuple, list)) else shift
        return anp.reshape(anp.roll(anp.reshape(x, (-1,)), total), anp.shape(x))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    shifts = tuple(shift) if isinstance(shift, (tuple, list)) else (shift,) * len(axes)
    for s, a in zip(shifts, axes):
        x = anp.roll(x, s, axis=a)
    return x


def tile(x, repetitions, /):
    # by broadcasting: autograd's rule for tile aligns repetitions with x's leading axes, NumPy's
    # with its trailing ones
    reps = tuple(repetitions)
    d = builtins.max(anp.ndim(x), len(reps))
    shape = (1,) * (d - anp.ndim(x)) + anp.shape(x)
    reps = (1,) * (d - len(reps)) + reps
    spread = anp.reshape(x, tuple(v for n in shape for v in (1, n)))
    spread = broadcast_to(spread, tuple(v for r, n in zip(reps, shape) for v in (r, n)))
    return anp.reshape(spread, tuple(r * n for r, n in zip(reps, shape)))


def unstack(x, /, *, axis=0):
    axis = axis % anp.ndim(x)
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(anp.shape(x)[axis]))


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None):
    if prepend is not None or append is not None:
        x = concat([a for a in (prepend, x, append) if a is not None], axis=axis)
    axis = axis % anp.ndim(x)
    head = (slice(None),) * axis
    for _ in range(n):
        x = x[head + (slice(1, None),)] - x[head + (slice(None, -1),)]
    return x


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

