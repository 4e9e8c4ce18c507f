"""NumPy's own functions on traced values: ``np.sin(x)`` (``__array_ufunc__``) and ``np.sum(x)``,
``np.linalg.eigh(x)``... (``__array_function__``).

The rule: a NumPy function accepted on a traced value gives NumPy's own value and its derivative for
every argument NumPy accepts, or raises a TypeError naming the function and the argument; no
argument is ever ignored. Each function below therefore has NumPy's signature. Functions whose
results carry no derivative (``argsort``, ``isclose``, ``shape``...) are NumPy itself, run on the
concrete values. Anything else raises a TypeError naming the function (NumPy's own code would drop
the derivative).

The ufunc table is derived from the rule table: every primitive with a ``ufunc`` is what that ufunc
does on traced values.
"""

from __future__ import annotations

import builtins
import math
import operator
import sys

import numpy as np

from . import _composites as C
from . import _fft as F
from . import _functions as xp
from . import _linalg as L
from . import _primitives as P
from . import _special
from ._tracer import Tracer, _ndim, _shape, concrete

_NV = np._NoValue  # NumPy's "argument not given"


def _refuse(fname, **given):
    """A TypeError for each argument the tape does not implement, unless it has NumPy's default value:
    ``given`` maps a name to ``(value, default)``."""
    for name, (value, default) in given.items():
        if value is default or (default is not _NV and type(value) is type(default) and value == default):
            continue
        raise TypeError(f"np.{fname}: {name}={value!r} is not supported on traced values (only the default, "
                        f"{default if default is not _NV else 'not given'}); use the functions of "
                        f"unigrad.namespace(x)")


def _flag(value):
    return False if value is _NV else builtins.bool(value)


# -------------------------------------------------------------------- ufuncs

UFUNCS = {p.ufunc: p for p in P.PRIMITIVES.values() if p.ufunc is not None}
UFUNCS.update({np.matmul: xp.matmul, np.float_power: lambda x, y: P.power(_float64(x), _float64(y)),
               np.radians: P.deg2rad, np.degrees: P.rad2deg})  # NumPy's aliases: distinct ufunc objects
UFUNC_REDUCTIONS = {np.add: xp.sum, np.multiply: xp.prod, np.maximum: xp.max, np.minimum: xp.min}


def _float64(x):
    """NumPy's float_power computes in float64 (complex128 for complex input)."""
    kind = np.result_type(concrete(x)).kind
    want = np.complex128 if kind == "c" else np.float64
    return xp.astype(x, want) if isinstance(x, Tracer) else np.asarray(x, dtype=want)


def array_ufunc(self, ufunc, method, *inputs, **kwargs):
    name = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    if kwargs.get("out") is not None:
        raise TypeError(f"{name} with out=...: a NumPy array cannot hold a traced value (in-place updates such "
                        f"as `a += x` included); write `a = a + x` instead")
    kwargs.pop("out", None)
    if method == "__call__" and ufunc in UFUNCS and not kwargs:
        return UFUNCS[ufunc](*inputs)
    if method == "__call__" and not kwargs and "scipy.special" in sys.modules:  # SciPy's special ufuncs
        table = _special.scipy_ufuncs()
        if ufunc in table:
            return table[ufunc](*inputs)
    if method == "reduce" and ufunc in UFUNC_REDUCTIONS and len(inputs) == 1 and set(kwargs) <= {"axis",
                                                                                              "keepdims"}:
        return UFUNC_REDUCTIONS[ufunc](inputs[0], axis=kwargs.get("axis", 0), keepdims=kwargs.get("keepdims",
                                                                                                  False))
    extra = f" with {sorted(kwargs)}" if kwargs else ""
    raise TypeError(f"{name}{extra} is not supported on traced values (it has no derivative rule in the tape); "
                    f"use the functions of unigrad.namespace(x)")


# -------------------------------------------------------------------- functions

FUNCTIONS: dict = {}


def implements(*numpy_functions):
    def register(fn):
        for f in numpy_functions:
            FUNCTIONS[f] = fn
        return fn
    return register


def array_function(self, func, types, args, kwargs):
    impl = FUNCTIONS.get(func)
    if impl is None:
        raise TypeError(f"np.{func.__name__} is not supported on traced values (it has no derivative rule in the "
                        f"tape); use the functions of unigrad.namespace(x)")
    return impl(*args, **kwargs)


def _concrete(fn):
    """A NumPy function whose result carries no derivative, run on the concrete values of its arguments."""
    def on_values(*args, **kwargs):
        args = [concrete(a) if not isinstance(a, (list, tuple)) else type(a)(concrete(b) for b in a)
                for a in args]
        return fn(*args, **{k: concrete(v) for k, v in kwargs.items()})
    return on_values


for _f in (np.argsort, np.argmax, np.argmin, np.argpartition, np.argwhere, np.flatnonzero, np.nonzero,
           np.count_nonzero, np.searchsorted, np.isclose, np.allclose, np.array_equal, np.array_equiv,
           np.any, np.all, np.shape, np.ndim, np.size, np.iscomplexobj, np.isrealobj, np.result_type,
           np.linalg.matrix_rank, np.digitize, np.isreal, np.iscomplex):
    FUNCTIONS[_f] = _concrete(_f)


# -- reductions and statistics

@implements(np.sum)
def sum(a, axis=None, dtype=None, out=None, keepdims=_NV, initial=_NV, where=_NV):  # noqa: A001
    _refuse("sum", out=(out, None), initial=(initial, _NV), where=(where, _NV))
    return xp.sum(a, axis=axis, dtype=dtype, keepdims=_flag(keepdims))


@implements(np.prod)
def prod(a, axis=None, dtype=None, out=None, keepdims=_NV, initial=_NV, where=_NV):
    _refuse("prod", out=(out, None), initial=(initial, _NV), where=(where, _NV))
    return xp.prod(a, axis=axis, dtype=dtype, keepdims=_flag(keepdims))


@implements(np.max, np.amax)
def max(a, axis=None, out=None, keepdims=_NV, initial=_NV, where=_NV):  # noqa: A001
    _refuse("max", out=(out, None), initial=(initial, _NV), where=(where, _NV))
    return xp.max(a, axis=axis, keepdims=_flag(keepdims))


@implements(np.min, np.amin)
def min(a, axis=None, out=None, keepdims=_NV, initial=_NV, where=_NV):  # noqa: A001
    _refuse("min", out=(out, None), initial=(initial, _NV), where=(where, _NV))
    return xp.min(a, axis=axis, keepdims=_flag(keepdims))


@implements(np.mean)
def mean(a, axis=None, dtype=None, out=None, keepdims=_NV, *, where=_NV):
    _refuse("mean", out=(out, None), where=(where, _NV))
    return C.mean(a if dtype is None else xp.astype(a, dtype), axis=axis, keepdims=_flag(keepdims))


def _statistic(fname, fn):
    def statistic(a, axis=None, dtype=None, out=None, ddof=0, keepdims=_NV, *, where=_NV, mean=_NV,
                  correction=_NV):
        _refuse(fname, out=(out, None), where=(where, _NV), mean=(mean, _NV))
        if correction is not _NV and ddof != 0:
            raise ValueError(f"np.{fname}: ddof and correction can't be provided simultaneously.")
        a = xp._arr(a)
        return fn(a if dtype is None else xp.astype(a, dtype), axis=axis,
                  correction=ddof if correction is _NV else correction, keepdims=_flag(keepdims))
    return statistic


FUNCTIONS[np.var] = _statistic("var", C.var)
FUNCTIONS[np.std] = _statistic("std", C.std)


@implements(np.cumsum)
def cumsum(a, axis=None, dtype=None, out=None):
    _refuse("cumsum", out=(out, None))
    return C.cumsum(a, axis=axis, dtype=dtype)


@implements(np.cumprod)
def cumprod(a, axis=None, dtype=None, out=None):
    _refuse("cumprod", out=(out, None))
    return C.cumprod(a, axis=axis, dtype=dtype)


@implements(np.cumulative_sum)
def cumulative_sum(x, /, *, axis=None, dtype=None, out=None, include_initial=False):
    _refuse("cumulative_sum", out=(out, None))
    return xp.cumulative_sum(x, axis=axis, dtype=dtype, include_initial=include_initial)


@implements(np.cumulative_prod)
def cumulative_prod(x, /, *, axis=None, dtype=None, out=None, include_initial=False):
    _refuse("cumulative_prod", out=(out, None))
    return xp.cumulative_prod(x, axis=axis, dtype=dtype, include_initial=include_initial)


@implements(np.diff)
def diff(a, n=1, axis=-1, prepend=_NV, append=_NV):
    a = xp._arr(a)
    a1 = xp._axis1(axis, _ndim(a))

    def edge(v):  # NumPy broadcasts a scalar prepend/append to one slice along axis
        v = xp._arr(v)
        if _ndim(v) == 0:
            shape = list(_shape(a))
            shape[a1] = 1
            return xp.broadcast_to(v, tuple(shape)) if isinstance(v, Tracer) else np.broadcast_to(v, shape)
        return v
    return xp.diff(a, axis=axis, n=n, prepend=None if prepend is _NV else edge(prepend),
                   append=None if append is _NV else edge(append))


# -- shapes

def _order(fname, order, a):
    if order in ("C", "F"):
        return order
    if order == "A":  # Fortran order when the array is Fortran-contiguous in memory (NumPy's rule)
        v = concrete(a)
        return "F" if isinstance(v, np.ndarray) and v.flags.f_contiguous and not v.flags.c_contiguous else "C"
    if order == "K" and fname == "ravel":
        v = concrete(a)
        if not isinstance(v, np.ndarray) or v.flags.c_contiguous:
            return "C"
        if v.flags.f_contiguous:
            return "F"
    raise TypeError(f"np.{fname}: order={order!r} is not supported on traced values ('C', 'F' and 'A' are)")


def _reversed_axes(a):
    return xp.permute_dims(a, tuple(range(_ndim(a)))[::-1])


@implements(np.reshape)
def reshape(a, /, shape=None, order="C", *, newshape=None, copy=None):
    if newshape is not None:  # NumPy < 2.1 spelling
        shape = newshape
    a = xp._arr(a)
    if _order("reshape", order, a) == "C":
        return xp.reshape(a, shape)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return _reversed_axes(xp.reshape(_reversed_axes(a), shape[::-1]))


@implements(np.ravel)
def ravel(a, order="C"):
    a = xp._arr(a)
    if _order("ravel", order, a) == "C":
        return xp.reshape(a, (-1,))
    return xp.reshape(_reversed_axes(a), (-1,))


@implements(np.transpose)
def transpose(a, axes=None):
    return C.transpose(a, axes)


@implements(np.swapaxes)
def swapaxes(a, axis1, axis2):
    return C.swapaxes(a, axis1, axis2)


@implements(np.moveaxis)
def moveaxis(a, source, destination):
    return xp.moveaxis(a, source, destination)


@implements(np.rollaxis)
def rollaxis(a, axis, start=0):
    n = _ndim(a)
    if not -n <= axis < n:
        raise np.exceptions.AxisError(f"np.rollaxis: axis {axis} is out of bounds for an array of dimension {n}")
    if not -n <= start <= n:
        raise np.exceptions.AxisError(f"np.rollaxis: start {start} is out of bounds for an array of dimension {n}")
    axis, start = axis % n, start + n if start < 0 else start
    if axis < start:  # NumPy's rule: the axis lands just before the axis that was at `start`
        start -= 1
    return a if axis == start else xp.moveaxis(a, axis, start)


@implements(np.tril)
def tril(m, k=0):
    return xp.tril(m, k=k)


@implements(np.triu)
def triu(m, k=0):
    return xp.triu(m, k=k)


@implements(np.real_if_close)
def real_if_close(a, tol=100):
    """NumPy's rule, read from the values: the real part when every imaginary part is within ``tol``
    machine epsilons (``tol`` > 1) or ``tol`` (absolute, ``tol`` <= 1) of zero, else ``a`` unchanged."""
    value = np.asarray(concrete(a))
    if value.dtype.kind != "c":
        return a
    if tol > 1:
        tol = np.finfo(value.dtype).eps * tol
    return xp.real(a) if np.all(np.abs(value.imag) < tol) else a


@implements(np.squeeze)
def squeeze(a, axis=None):
    return xp.squeeze(a, axis)


@implements(np.expand_dims)
def expand_dims(a, axis):
    return xp.expand_dims(a, axis=axis)


def _cast_all(arrays, dtype, casting, fname):
    _refuse(fname, casting=(casting, "same_kind"))
    return arrays if dtype is None else [xp.astype(xp._arr(x), dtype) for x in arrays]


@implements(np.concatenate)
def concatenate(arrays, /, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _refuse("concatenate", out=(out, None))
    return xp.concat(_cast_all(list(arrays), dtype, casting, "concatenate"), axis=axis)


@implements(np.stack)
def stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _refuse("stack", out=(out, None))
    return xp.stack(_cast_all(list(arrays), dtype, casting, "stack"), axis=axis)


@implements(np.hstack)
def hstack(tup, *, dtype=None, casting="same_kind"):
    return C.hstack(_cast_all(list(tup), dtype, casting, "hstack"))


@implements(np.vstack, np.row_stack) if hasattr(np, "row_stack") else implements(np.vstack)
def vstack(tup, *, dtype=None, casting="same_kind"):
    return C.vstack(_cast_all(list(tup), dtype, casting, "vstack"))


@implements(np.dstack)
def dstack(tup):
    return xp.concat(C.atleast_3d(*tup) if len(tup) > 1 else [C.atleast_3d(*tup)], axis=2)


@implements(np.column_stack)
def column_stack(tup):
    cols = [xp.reshape(xp._arr(a), (-1, 1)) if _ndim(a) < 2 else xp._arr(a) for a in tup]
    return xp.concat(cols, axis=1)


@implements(np.append)
def append(arr, values, axis=None):
    if axis is None:
        return xp.concat([xp.reshape(xp._arr(arr), (-1,)), xp.reshape(xp._arr(values), (-1,))], axis=0)
    return xp.concat([xp._arr(arr), xp._arr(values)], axis=axis)


def _split_points(fname, n, indices_or_sections, equal):
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0:
            raise ValueError("number sections must be larger than 0.")
        if equal and n % sections:
            raise ValueError("array split does not result in an equal division")
        size, extra = divmod(n, sections)
        sizes = [size + 1] * extra + [size] * (sections - extra)
        return [0] + list(np.cumsum(sizes))
    points = [int(operator.index(i)) for i in indices_or_sections]
    return [0] + points + [n]


def _split(fname, ary, indices_or_sections, axis, equal):
    ary = xp._arr(ary)
    a = xp._axis1(axis, _ndim(ary))
    n = _shape(ary)[a]
    bounds = _split_points(fname, n, indices_or_sections, equal)
    pre = (slice(None),) * (_ndim(ary) + a)
    return [xp.getitem(ary, pre + (slice(start, stop),)) for start, stop in zip(bounds[:-1], bounds[1:])]


@implements(np.split)
def split(ary, indices_or_sections, axis=0):
    return _split("split", ary, indices_or_sections, axis, equal=True)


@implements(np.array_split)
def array_split(ary, indices_or_sections, axis=0):
    return _split("array_split", ary, indices_or_sections, axis, equal=False)


@implements(np.hsplit)
def hsplit(ary, indices_or_sections):
    if _ndim(ary) == 0:
        raise ValueError("hsplit only works on arrays of 1 or more dimensions")
    return split(ary, indices_or_sections, axis=1 if _ndim(ary) > 1 else 0)


@implements(np.vsplit)
def vsplit(ary, indices_or_sections):
    if _ndim(ary) < 2:
        raise ValueError("vsplit only works on arrays of 2 or more dimensions")
    return split(ary, indices_or_sections, axis=0)


@implements(np.dsplit)
def dsplit(ary, indices_or_sections):
    if _ndim(ary) < 3:
        raise ValueError("dsplit only works on arrays of 3 or more dimensions")
    return split(ary, indices_or_sections, axis=2)


@implements(np.flip)
def flip(m, axis=None):
    return xp.flip(m, axis=axis)


@implements(np.fliplr)
def fliplr(m):
    if _ndim(m) < 2:
        raise ValueError("Input must be >= 2-d.")
    return xp.flip(m, axis=1)


@implements(np.flipud)
def flipud(m):
    if _ndim(m) < 1:
        raise ValueError("Input must be >= 1-d.")
    return xp.flip(m, axis=0)


@implements(np.rot90)
def rot90(m, k=1, axes=(0, 1)):
    m = xp._arr(m)
    nd = _ndim(m)
    a0, a1 = (operator.index(a) % nd for a in axes)
    if len(axes) != 2 or a0 == a1:
        raise ValueError("len(axes) must be 2 and the axes must be different.")
    k %= 4
    if k == 0:
        return m
    if k == 2:
        return xp.flip(m, axis=(a0, a1))
    perm = list(range(nd))
    perm[a0], perm[a1] = perm[a1], perm[a0]
    if k == 1:
        return xp.permute_dims(xp.flip(m, axis=a1), tuple(perm))
    return xp.flip(xp.permute_dims(m, tuple(perm)), axis=a1)


@implements(np.roll)
def roll(a, shift, axis=None):
    return xp.roll(a, shift, axis=axis)


@implements(np.tile)
def tile(A, reps):
    return xp.tile(A, (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps))


@implements(np.repeat)
def repeat(a, repeats, axis=None):
    return xp.repeat(a, repeats, axis=axis)


@implements(np.broadcast_to)
def broadcast_to(array, shape, subok=False):
    return xp.broadcast_to(array, (shape,) if isinstance(shape, (int, np.integer)) else shape)


@implements(np.broadcast_arrays)
def broadcast_arrays(*args, subok=False):
    return tuple(xp.broadcast_arrays(*(xp._arr(a) for a in args)))


@implements(np.atleast_1d)
def atleast_1d(*arys):
    return C.atleast_1d(*arys)


@implements(np.atleast_2d)
def atleast_2d(*arys):
    return C.atleast_2d(*arys)


@implements(np.atleast_3d)
def atleast_3d(*arys):
    return C.atleast_3d(*arys)


@implements(np.pad)
def pad(array, pad_width, mode="constant", **kwargs):
    """Every mode that copies elements ('edge', 'reflect', 'symmetric', 'wrap') is a gather whose
    indices are np.pad of an index array; 'constant' fills the rest with (concrete) constants."""
    array = xp._arr(array)
    shape = _shape(array)
    if callable(mode) or mode not in ("constant", "edge", "reflect", "symmetric", "wrap"):
        raise TypeError(f"np.pad: mode={mode!r} is not supported on traced values ('constant', 'edge', 'reflect', "
                        f"'symmetric' and 'wrap' are)")
    allowed = {"constant": {"constant_values"}, "reflect": {"reflect_type"}, "symmetric": {"reflect_type"}}
    extra = set(kwargs) - allowed.get(mode, set())
    if extra:
        raise ValueError(f"unsupported keyword arguments for mode '{mode}': {sorted(extra)}")
    if kwargs.get("reflect_type", "even") != "even":
        raise TypeError(f"np.pad: reflect_type={kwargs['reflect_type']!r} is not supported on traced values "
                        f"('even' is)")
    flat = xp.reshape(array, (-1,))
    index = np.arange(math.prod(shape)).reshape(shape)
    if mode != "constant":
        return xp.getitem(flat, np.pad(index, pad_width, mode=mode, **kwargs))
    values = kwargs.get("constant_values", 0)
    if isinstance(values, Tracer) or (isinstance(values, (list, tuple)) and builtins.any(
            isinstance(v, Tracer) for v in np.ravel(np.asarray(values, dtype=object)))):
        raise TypeError("np.pad: traced constant_values are not supported (the tape pads with constants)")
    where = np.pad(index, pad_width, mode="constant", constant_values=-1)
    inside = where >= 0
    fill = np.pad(np.zeros(shape, dtype=concrete(array).dtype), pad_width, mode="constant",
                  constant_values=values)
    return xp.where(inside, xp.getitem(flat, np.where(inside, where, 0)), fill)


@implements(np.kron)
def kron(a, b):
    a, b = xp._arr(a), xp._arr(b)
    nd = builtins.max(_ndim(a), _ndim(b))
    sa = (1,) * (nd - _ndim(a)) + _shape(a)
    sb = (1,) * (nd - _ndim(b)) + _shape(b)
    a2 = xp.reshape(a, tuple(v for s in sa for v in (s, 1)))
    b2 = xp.reshape(b, tuple(v for s in sb for v in (1, s)))
    return xp.reshape(a2 * b2, tuple(p * q for p, q in zip(sa, sb)))


# -- elementwise functions that are not ufuncs

@implements(np.where)
def where(condition, x=None, y=None, /):
    if x is None and y is None:
        return np.nonzero(concrete(condition))
    return xp.where(condition, x, y)


@implements(np.clip)
def clip(a, a_min=_NV, a_max=_NV, out=None, *, min=_NV, max=_NV, **kwargs):  # noqa: A002
    _refuse("clip", out=(out, None))
    if kwargs:
        raise TypeError(f"np.clip: {sorted(kwargs)} are not supported on traced values")
    lo = a_min if min is _NV else min
    hi = a_max if max is _NV else max
    return xp.clip(a, None if lo is _NV else lo, None if hi is _NV else hi)


@implements(np.real)
def real(val):
    return xp.real(xp._arr(val))


@implements(np.imag)
def imag(val):
    return xp.imag(xp._arr(val))


@implements(np.round, np.around)
def round(a, decimals=0, out=None):  # noqa: A001
    _refuse("round", out=(out, None))
    return xp.round(a, decimals=decimals)


@implements(np.angle)
def angle(z, deg=False):
    z = xp._arr(z)
    a = xp.atan2(xp.imag(z), xp.real(z)) if xp._is_complex(z) else xp.atan2(xp.zeros_like(z), z)
    return a * (180 / math.pi) if deg else a


@implements(np.sinc)
def sinc(x):
    return P.sinc(xp._arr(x))


@implements(np.nan_to_num)
def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    x = xp._arr(x)
    if xp._is_complex(x):
        parts = [nan_to_num(p, nan=nan, posinf=posinf, neginf=neginf) for p in (xp.real(x), xp.imag(x))]
        return parts[0] + parts[1] * 1j
    v = concrete(x)
    if np.dtype(np.result_type(v)).kind != "f":
        return x
    big = np.finfo(np.result_type(v))
    out = xp.where(np.isnan(v), nan, x)
    out = xp.where(np.isposinf(v), big.max if posinf is None else posinf, out)
    return xp.where(np.isneginf(v), big.min if neginf is None else neginf, out)


@implements(np.select)
def select(condlist, choicelist, default=0):
    if len(condlist) != len(choicelist):
        raise ValueError("list of cases must be same length as list of conditions")
    out = xp._arr(default)
    dtype = np.result_type(*(concrete(c) for c in choicelist), concrete(default))
    for cond, choice in zip(reversed(condlist), reversed(choicelist)):
        out = xp.where(concrete(cond), choice, out)
    out = xp.astype(out, dtype) if np.result_type(concrete(out)) != dtype else out
    return xp.broadcast_to(out, np.broadcast_shapes(_shape(out), *(np.shape(concrete(c)) for c in condlist)))


@implements(np.partition)
def partition(a, kth, axis=-1, kind="introselect", order=None):
    """NumPy's arrangement, exactly: its argpartition permutation applied to the traced values."""
    _refuse("partition", order=(order, None))
    a = xp._arr(a)
    if axis is None:
        a, axis = xp.reshape(a, (-1,)), -1
    index = np.argpartition(concrete(a), kth, axis=axis, kind=kind)
    return xp.take_along_axis(a, index, axis=axis)


@implements(np.sort)
def sort(a, axis=-1, kind=None, order=None, *, stable=None):
    _refuse("sort", order=(order, None))
    a = xp._arr(a)
    if axis is None:
        a, axis = xp.reshape(a, (-1,)), -1
    return xp.sort(a, axis=axis)  # any kind gives the same sorted values


@implements(np.take)
def take(a, indices, axis=None, out=None, mode="raise"):
    _refuse("take", out=(out, None))
    a = xp._arr(a)
    if axis is None:
        a, axis = xp.reshape(a, (-1,)), 0
    n = _shape(a)[xp._axis1(axis, _ndim(a))]
    index = np.asarray(concrete(indices))
    if mode == "wrap":
        index = np.mod(index, n)
    elif mode == "clip":
        index = np.clip(index, 0, n - 1)
    elif mode != "raise":
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    return xp.take(a, index, axis=axis)


@implements(np.take_along_axis)
def take_along_axis(arr, indices, axis=-1):
    if axis is None:
        return xp.take_along_axis(xp.reshape(xp._arr(arr), (-1,)), indices, axis=0)
    return xp.take_along_axis(arr, indices, axis=axis)


@implements(np.linspace)
def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *, device=None):
    xp._device(device, "np.linspace")
    return xp._traced_linspace(start, stop, num, endpoint=endpoint, retstep=retstep, dtype=dtype, axis=axis)


@implements(np.gradient)
def gradient(f, *varargs, axis=None, edge_order=1):
    """Second-order central differences inside, first- or second-order one-sided ones at the edges,
    for uniform spacings (scalars) and coordinate arrays (``edge_order=1``)."""
    f = xp._arr(f)
    nd = _ndim(f)
    axes = tuple(range(nd)) if axis is None else tuple(a % nd for a in np.atleast_1d(axis))
    if edge_order not in (1, 2):
        raise ValueError("'edge_order' greater than 2 not supported")
    if not varargs:
        spacing = [1.0] * len(axes)
    elif len(varargs) == 1 and np.ndim(concrete(varargs[0])) == 0:
        spacing = list(varargs) * len(axes)
    elif len(varargs) == len(axes):
        spacing = list(varargs)
    else:
        raise TypeError("invalid number of arguments")
    out = []
    for a, h in zip(axes, spacing):
        if isinstance(h, Tracer):
            raise TypeError("np.gradient: traced spacings are not supported (the tape differentiates f)")
        n = _shape(f)[a]
        if n < edge_order + 1:
            raise ValueError("Shape of array too small to calculate a numerical gradient, at least "
                             "(edge_order + 1) elements are required.")
        pre = (slice(None),) * a

        def part(start, stop, f=f, pre=pre):
            return xp.getitem(f, pre + (slice(start, stop),))

        h = np.asarray(h)
        if h.ndim == 0:
            dx = float(h)
            inner = (part(2, n) - part(0, n - 2)) / (2 * dx)
            if edge_order == 1:
                first = (part(1, 2) - part(0, 1)) / dx
                last = (part(n - 1, n) - part(n - 2, n - 1)) / dx
            else:
                first = (part(0, 1) * -1.5 + part(1, 2) * 2.0 - part(2, 3) * 0.5) / dx
                last = (part(n - 3, n - 2) * 0.5 - part(n - 2, n - 1) * 2.0 + part(n - 1, n) * 1.5) / dx
        else:
            if h.shape != (n,):
                raise ValueError("when 1d, distances must match the length of the corresponding dimension")
            if edge_order != 1:
                raise TypeError("np.gradient: edge_order=2 with coordinate arrays is not supported on traced values")
            d = np.diff(h.astype(np.result_type(h, 1.0)))
            d1, d2 = d[:-1], d[1:]
            shape = [1] * nd
            shape[a] = n - 2

            def w(v):
                return v.reshape(shape)
            inner = (part(0, n - 2) * w(-d2 / (d1 * (d1 + d2))) + part(1, n - 1) * w((d2 - d1) / (d1 * d2))
                     + part(2, n) * w(d1 / (d2 * (d1 + d2))))
            first = (part(1, 2) - part(0, 1)) / d[0]
            last = (part(n - 1, n) - part(n - 2, n - 1)) / d[-1]
        out.append(xp.concat([first, inner, last], axis=a))
    return out[0] if len(out) == 1 else tuple(out)


# -- products

@implements(np.dot)
def dot(a, b, out=None):
    _refuse("dot", out=(out, None))
    return C.dot(a, b)


@implements(np.vdot)
def vdot(a, b, /):
    a, b = xp.reshape(xp._arr(a), (-1,)), xp.reshape(xp._arr(b), (-1,))
    return xp.sum((xp.conj(a) if xp._is_complex(a) else a) * b)


@implements(np.inner)
def inner(a, b, /):
    return C.inner(a, b)


@implements(np.outer)
def outer(a, b, out=None):
    _refuse("outer", out=(out, None))
    return C.outer(a, b)


@implements(np.tensordot)
def tensordot(a, b, axes=2):
    return xp.tensordot(a, b, axes=axes)


@implements(np.einsum)
def einsum(*operands, out=None, optimize=False, dtype=None, order="K", casting="safe"):
    _refuse("einsum", out=(out, None), order=(order, "K"), casting=(casting, "safe"))
    if operands and not isinstance(operands[0], str):  # the sublist form: op, [labels], op, [labels], ..., [out]
        ops, terms = [], []
        rest = list(operands)
        while len(rest) >= 2:
            ops.append(rest.pop(0))
            terms.append(list(rest.pop(0)))
        output = list(rest[0]) if rest else None
        letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

        def word(labels):
            return "".join("..." if s is Ellipsis else letters[operator.index(s)] for s in labels)
        spec = ",".join(word(t) for t in terms) + ("" if output is None else "->" + word(output))
        operands = (spec, *ops)
    spec, ops = operands[0], operands[1:]
    if dtype is not None:
        ops = [xp.astype(xp._arr(o), dtype) for o in ops]
    return xp.einsum(spec, *ops)


@implements(np.trace)
def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    _refuse("trace", out=(out, None))
    return C.trace(a, offset=offset, axis1=axis1, axis2=axis2, dtype=dtype)


@implements(np.diagonal)
def diagonal(a, offset=0, axis1=0, axis2=1):
    return C.diagonal(a, offset=offset, axis1=axis1, axis2=axis2)


@implements(np.diag)
def diag(v, k=0):
    return C.diag(v, k=k)


@implements(np.cross)
def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """NumPy's cross: vectors along axisa/axisb (2 or 3 components; a 2-vector has z = 0), the result
    along axisc (a 2-vector cross product is the scalar z component)."""
    if axis is not None:
        axisa = axisb = axisc = axis
    a = xp.moveaxis(xp._arr(a), axisa, -1) if _ndim(a) else a
    b = xp.moveaxis(xp._arr(b), axisb, -1) if _ndim(b) else b
    na, nb = _shape(a)[-1], _shape(b)[-1]
    if na not in (2, 3) or nb not in (2, 3):
        raise ValueError("incompatible dimensions for cross product\n(dimension must be 2 or 3)")
    a0, a1, *a2 = xp.unstack(a, axis=-1)
    b0, b1, *b2 = xp.unstack(b, axis=-1)
    z = a0 * b1 - a1 * b0
    if na == 2 and nb == 2:
        return z
    a2 = a2[0] if a2 else None
    b2 = b2[0] if b2 else None
    x = (a1 * b2 if b2 is not None else 0) - (a2 * b1 if a2 is not None else 0)
    y = (a2 * b0 if a2 is not None else 0) - (a0 * b2 if b2 is not None else 0)
    x, y, z = xp.broadcast_arrays(*(xp._arr(c) for c in (x, y, z)))
    return xp.moveaxis(xp.stack([x, y, z], axis=-1), -1, axisc)


# -- linalg

def _triangle(a, uplo, fname):
    """The Hermitian matrix NumPy's LAPACK call sees: one triangle of ``a``, mirrored (conjugated)."""
    if uplo not in ("L", "U"):
        raise ValueError(f"np.linalg.{fname}: UPLO argument must be 'L' or 'U'; got {uplo!r}")
    a = L._square(a, fname)
    n = _shape(a)[-1]
    lower = np.tril(np.ones((n, n), dtype=builtins.bool), -1)
    # the upper triangle read as the lower one of a^H (conjugated: a^T alone gave conj(A) for complex a)
    part = a if uplo == "L" else xp.matrix_transpose(xp.conj(a) if xp._is_complex(a) else a)
    strict = xp.where(lower, part, 0)
    mirror = xp.matrix_transpose(xp.conj(strict) if xp._is_complex(a) else strict)
    return xp.where(np.eye(n, dtype=builtins.bool), part, 0) + strict + mirror


@implements(np.linalg.eigh)
def eigh(a, UPLO="L"):  # noqa: N803
    return L._eigh(_triangle(a, UPLO, "eigh"), UPLO)  # LAPACK reads NumPy's triangle: NumPy's signs


@implements(np.linalg.eigvalsh)
def eigvalsh(a, UPLO="L"):  # noqa: N803
    return L.eigvalsh(_triangle(a, UPLO, "eigvalsh"))


@implements(np.linalg.cholesky)
def cholesky(a, /, *, upper=False):
    return L.cholesky(_triangle(a, "U" if upper else "L", "cholesky"), upper=upper)


@implements(np.linalg.qr)
def qr(a, mode="reduced"):
    if mode == "r":
        return L.qr(a, mode="reduced").R
    if mode not in ("reduced", "complete"):
        raise TypeError(f"np.linalg.qr: mode={mode!r} is not supported on traced values ('reduced', 'complete' "
                        f"and 'r' are)")
    return L.qr(a, mode=mode)


@implements(np.linalg.svd)
def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    _refuse("linalg.svd", hermitian=(hermitian, False))
    return L.svd(a, full_matrices=full_matrices) if compute_uv else L.svdvals(a)


@implements(np.linalg.pinv)
def pinv(a, rcond=None, hermitian=False, *, rtol=_NV):
    _refuse("linalg.pinv", hermitian=(hermitian, False))
    if rcond is not None and rtol is not _NV:
        raise ValueError("`rtol` and `rcond` can't be both set.")
    a = L._matrix(a, "pinv")
    if not isinstance(a, Tracer):
        return np.linalg.pinv(a, rcond=rcond) if rtol is _NV else np.linalg.pinv(a, rtol=rtol)
    tol = rcond if rcond is not None else (None if rtol is _NV else rtol)
    if tol is None and rtol is _NV:
        tol = 1e-15  # NumPy's default rcond
    return P.pinv(a, rtol=tol)


@implements(np.linalg.multi_dot)
def multi_dot(arrays, *, out=None):
    _refuse("linalg.multi_dot", out=(out, None))
    result = arrays[0]
    for a in arrays[1:]:
        result = C.dot(result, a)
    return result


for _name, _fn in [("inv", L.inv), ("det", L.det), ("slogdet", L.slogdet), ("solve", L.solve), ("eig", L.eig),
                   ("eigvals", L.eigvals),
                   ("matrix_power", L.matrix_power), ("norm", L.norm)]:
    FUNCTIONS[getattr(np.linalg, _name)] = _fn
for _name in ("matmul", "outer", "cross", "diagonal", "trace", "vector_norm", "matrix_norm", "svdvals",
              "tensordot", "vecdot", "matrix_transpose"):  # NumPy 2's Array API spellings in np.linalg
    if hasattr(np.linalg, _name):
        FUNCTIONS[getattr(np.linalg, _name)] = getattr(L, _name)


# -- fft: NumPy's signatures (norm=None is "backward"; fft2 and friends are the n-d ones on two axes)

def _fft1(fname, fn):
    def transform(a, n=None, axis=-1, norm=None, out=None):
        _refuse(f"fft.{fname}", out=(out, None))
        return fn(a, n=n, axis=axis, norm=norm)
    return transform


def _fftn(fname, fn, default_axes):
    def transform(a, s=None, axes=default_axes, norm=None, out=None):
        _refuse(f"fft.{fname}", out=(out, None))
        return fn(a, s=s, axes=axes, norm=norm)
    return transform


for _name in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"):
    FUNCTIONS[getattr(np.fft, _name)] = _fft1(_name, getattr(F, _name))
for _name, _fn, _axes in [("fftn", F.fftn, None), ("ifftn", F.ifftn, None), ("rfftn", F.rfftn, None),
                          ("irfftn", F.irfftn, None), ("fft2", F.fftn, (-2, -1)), ("ifft2", F.ifftn, (-2, -1)),
                          ("rfft2", F.rfftn, (-2, -1)), ("irfft2", F.irfftn, (-2, -1))]:
    FUNCTIONS[getattr(np.fft, _name)] = _fftn(_name, _fn, _axes)
FUNCTIONS[np.fft.fftshift] = lambda x, axes=None: F.fftshift(x, axes=axes)
FUNCTIONS[np.fft.ifftshift] = lambda x, axes=None: F.ifftshift(x, axes=axes)
