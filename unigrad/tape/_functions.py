"""The Array API main namespace of the tape: functions over NumPy arrays and traced values.

``_namespace`` assembles these with the ``linalg`` and ``fft`` extensions and the composites
(statistics, softmax, NumPy spellings); ``unigrad.namespace(x)`` returns it. Every function here
normalises its arguments (axes to negative tuples, shapes to concrete tuples, vectors to matrices
for matmul) and calls the primitives of ``_primitives``; the elementwise functions are the
primitives themselves. On plain NumPy inputs the result is what NumPy computes.

Functions whose results carry no derivative (``argsort``, ``argmax``, ``searchsorted``,
``nonzero``, ``unique_*``, ``count_nonzero``, ``all``, ``any``, comparisons, ``bitwise_*``)
return plain NumPy arrays even for traced inputs.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections import namedtuple

import numpy as np

from . import _primitives as P
from ._tracer import Tracer, _ndim, _shape, concrete

__array_api_version__ = "2024.12"

# -------------------------------------------------------------------- dtypes and constants
bool = np.bool_  # noqa: A001 -- Array API names
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
e, pi, inf, nan, newaxis = math.e, math.pi, math.inf, math.nan, None

_SCALARS = (builtins.bool, int, float, complex)


def _is_traced(x):
    return isinstance(x, Tracer)


def _arr(x):
    """A Tracer stays; anything else becomes a NumPy array (Python scalars stay weak for promotion); a
    (nested) list or tuple holding traced values is stacked, keeping their derivatives."""
    if isinstance(x, (Tracer, np.ndarray)) or isinstance(x, _SCALARS):
        return x
    if isinstance(x, (list, tuple)) and _holds_traced(x):
        return asarray(x)
    return np.asarray(x)


def _holds_traced(obj):
    """Whether a (nested) list or tuple holds a traced value anywhere."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if _is_traced(o):
            return True
        if isinstance(o, (list, tuple)):
            stack.extend(o)
    return False


class _AllAxes(dict):
    """ndim -> every axis as negative ints (``_axes(None, ndim)``), made once per ndim."""

    def __missing__(self, ndim):
        self[ndim] = axes = tuple(range(-ndim, 0))
        return axes


_ALL_AXES = _AllAxes()


def _axes(axis, ndim):
    """Normalise ``axis`` (None, int or tuple) to a tuple of negative ints."""
    if axis is None:
        return tuple(range(-ndim, 0))
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    out = []
    for a in axis:
        a = operator.index(a)
        if not -ndim <= a < builtins.max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise np.exceptions.AxisError(f"axis {a} is out of bounds for an array of dimension {ndim}")
        out.append(a - ndim if a >= 0 else a)
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis!r}")
    return tuple(out) if ndim else ()


def _axis1(axis, ndim):
    (a,) = _axes(axis, ndim)
    return a


def _is_complex(x):
    v = concrete(x)
    return (v.dtype if hasattr(v, "dtype") else np.result_type(v)).kind == "c"  # a Python scalar too


# -------------------------------------------------------------------- creation (constants)

def asarray(obj, /, *, dtype=None, device=None, copy=None):
    if _is_traced(obj):
        return obj if dtype is None else astype(obj, dtype)
    if isinstance(obj, (list, tuple)) and _holds_traced(obj):  # nested lists too: [[x, 1.0], [2.0, x]]
        return stack([asarray(o, dtype=dtype) for o in obj])
    return np.array(obj, dtype=dtype, copy=True if copy else None)


def _device(device, fname):
    if device is not None and str(device) != "cpu":
        raise ValueError(f"{fname}: the numpy backend has only the 'cpu' device; got device={device!r}")


def zeros(shape, *, dtype=None, device=None):
    _device(device, "zeros")
    return np.zeros(shape, dtype=dtype)


def ones(shape, *, dtype=None, device=None):
    _device(device, "ones")
    return np.ones(shape, dtype=dtype)


def empty(shape, *, dtype=None, device=None):
    _device(device, "empty")
    return np.empty(shape, dtype=dtype)


def full(shape, fill_value, *, dtype=None, device=None):
    _device(device, "full")
    if _is_traced(fill_value):  # a traced fill value keeps its derivative
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        return broadcast_to(fill_value if dtype is None else astype(fill_value, dtype), shape)
    return np.full(shape, fill_value, dtype=dtype)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    _device(device, "eye")
    return np.eye(n_rows, n_cols, k=k, dtype=dtype)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    _device(device, "arange")
    if stop is None:
        start, stop = 0, start
    return np.arange(start, stop, step, dtype=dtype)


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    """Evenly spaced numbers; traced endpoints stay traced (NumPy's arithmetic, step for step)."""
    _device(device, "linspace")
    if _is_traced(start) or _is_traced(stop):
        return _traced_linspace(start, stop, num, endpoint=endpoint, dtype=dtype)
    return np.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)


def _traced_linspace(start, stop, num, *, endpoint=True, dtype=None, axis=0, retstep=False):
    """NumPy's linspace, its arithmetic step for step, on traced endpoints (a 0-d or n-d start/stop)."""
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    start, stop = _arr(start), _arr(stop)
    dt = np.result_type(concrete(start), concrete(stop), 1.0)
    if dtype is not None and np.dtype(dtype).kind not in "fc":
        raise TypeError(f"linspace: dtype={dtype!r} is not supported on traced endpoints (a floating dtype is)")
    div = (num - 1) if endpoint else num
    delta = stop - start
    y = np.arange(0, num, dtype=dt).reshape((-1,) + (1,) * _ndim(delta))
    if div > 0:
        step = delta / div
        y = (y / div) * delta if np.any(concrete(step) == 0) else y * step
    else:
        step = math.nan
        y = y * delta
    y = y + start
    if endpoint and num > 1:
        shape = _shape(y)
        head = getitem(y, (slice(0, num - 1),))
        y = concat([head, reshape(broadcast_to(stop, shape[1:]), (1,) + shape[1:])], axis=0)
    if axis != 0:
        y = moveaxis(y, 0, axis)
    if dtype is not None:
        y = astype(y, dtype)
    return (y, step) if retstep else y


def from_dlpack(x, /, *, device=None, copy=None):
    _device(device, "from_dlpack")
    return np.from_dlpack(x) if copy is None else np.from_dlpack(x, copy=copy)


def zeros_like(x, /, *, dtype=None, device=None):
    _device(device, "zeros_like")
    return np.zeros_like(concrete(x), dtype=dtype)


def ones_like(x, /, *, dtype=None, device=None):
    _device(device, "ones_like")
    return np.ones_like(concrete(x), dtype=dtype)


def empty_like(x, /, *, dtype=None, device=None):
    _device(device, "empty_like")
    return np.empty_like(concrete(x), dtype=dtype)


def full_like(x, /, fill_value, *, dtype=None, device=None):
    _device(device, "full_like")
    v = concrete(x)
    if _is_traced(fill_value):
        return full(np.shape(v), fill_value, dtype=v.dtype if dtype is None else dtype)
    return np.full_like(v, fill_value, dtype=dtype)


def __array_namespace_info__():
    """Inspection API: the tape runs where NumPy runs (device ``"cpu"``), with NumPy's dtypes."""
    return np.__array_namespace_info__()


def tril(x, /, *, k=0):
    return _mask_mul(x, np.tril(np.ones(_shape(x)[-2:], dtype=builtins.bool), k))


def triu(x, /, *, k=0):
    return _mask_mul(x, np.triu(np.ones(_shape(x)[-2:], dtype=builtins.bool), k))


def _mask_mul(x, mask):
    if not _is_traced(x):
        return np.where(mask, x, np.zeros((), dtype=np.result_type(x)))
    return P.where(mask, x, 0)


def meshgrid(*arrays, indexing="xy"):
    """Coordinate matrices from 1-D arrays (traced arrays stay traced)."""
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij'; got {indexing!r}")
    arrays = [_arr(a) for a in arrays]
    if not builtins.any(_is_traced(a) for a in arrays):
        return list(np.meshgrid(*arrays, indexing=indexing))
    n = len(arrays)
    sizes = [_shape(a)[0] for a in arrays]
    if indexing == "xy" and n >= 2:
        sizes[0], sizes[1] = sizes[1], sizes[0]
    out = []
    for k, a in enumerate(arrays):
        pos = k if indexing == "ij" or n < 2 or k > 1 else 1 - k
        shape = [1] * n
        shape[pos] = _shape(a)[0]
        out.append(broadcast_to(reshape(a, tuple(shape)), tuple(sizes)))
    return out


# -------------------------------------------------------------------- elementwise

# Every elementwise row of the rule table is itself the namespace function of its name (``exp``,
# ``atan2``, ``logical_and``...): its NumPy implementation (a ufunc) takes lists and scalars as they
# are, and a wrapper would cost a Python call on the tape's hottest path. Adding an elementwise op is
# one row in ``_primitives`` (and one in the tests' op table).
ELEMENTWISE = {p.name: p for p in P.PRIMITIVES.values() if p.elementwise}
globals().update(ELEMENTWISE)


def round(x, /, decimals=0):  # noqa: A001
    return P.round_(_arr(x)) if decimals == 0 else P.round_(_arr(x), decimals=decimals)


def where(condition, x1, x2, /):
    return P.where(concrete(condition), _arr(x1), _arr(x2))


def clip(x, /, min=None, max=None):  # noqa: A002
    """Clip to [min, max]; at a bound the derivative with respect to x is 1 (bounds inclusive)."""
    if min is None and max is None:
        return x
    return P.clip(_arr(x), None if min is None else _arr(min), None if max is None else _arr(max))


def astype(x, dtype, /, *, copy=True, device=None):
    dtype = np.dtype(dtype)
    if np.dtype(concrete(x).dtype) == dtype:
        return x
    if dtype.kind not in "fc":  # integer or bool results carry no derivative
        return np.asarray(concrete(x)).astype(dtype)
    return P.astype(x, dtype=dtype)


# -------------------------------------------------------------------- reductions

def _in_dtype(out, dtype):
    """A reduction's result in the requested ``dtype``: NumPy accumulates small integers in 64 bits (as
    the standard asks when no dtype is given); an explicit integer dtype wraps around as its arithmetic
    would."""
    if dtype is None or np.dtype(concrete(out).dtype) == np.dtype(dtype):
        return out
    return astype(out, dtype)


def sum(x, /, *, axis=None, dtype=None, keepdims=False):  # noqa: A001
    """Sum; small integers accumulate in (u)int64 unless ``dtype`` says otherwise."""
    if dtype is None and axis is None and isinstance(x, Tracer):  # the common call: no cast, every axis
        # (Primitive.__call__ written out: x's trace is the only one, so it processes the call)
        return x.trace.process(P.reduce_sum, (x,), {"axis": _ALL_AXES[x.ndim], "keepdims": keepdims})
    x = _arr(x)
    if dtype is None:
        return P.reduce_sum(x, axis=_axes(axis, _ndim(x)), keepdims=keepdims)
    x = astype(x, dtype)
    return _in_dtype(P.reduce_sum(x, axis=_axes(axis, _ndim(x)), keepdims=keepdims), dtype)


def prod(x, /, *, axis=None, dtype=None, keepdims=False):
    """Product; its derivative is the product of the other elements (exact at zeros, no division)."""
    x = _arr(x)
    if dtype is not None:
        x = astype(x, dtype)
    return _in_dtype(P.reduce_prod(x, axis=_axes(axis, _ndim(x)), keepdims=keepdims), dtype)


def max(x, /, *, axis=None, keepdims=False):  # noqa: A001
    """Maximum; tied maxima share the derivative evenly."""
    x = _arr(x)
    return P.reduce_max(x, axis=_axes(axis, _ndim(x)), keepdims=keepdims)


def min(x, /, *, axis=None, keepdims=False):  # noqa: A001
    """Minimum; tied minima share the derivative evenly."""
    x = _arr(x)
    return P.reduce_min(x, axis=_axes(axis, _ndim(x)), keepdims=keepdims)


def _cumulative(x, axis, dtype, include_initial, fname):
    x = _arr(x)
    if axis is None:
        if _ndim(x) != 1:
            raise ValueError(f"{fname}: axis is required for arrays with more than one dimension")
        axis = 0
    a = _axis1(axis, _ndim(x))
    if dtype is not None:
        x = astype(x, dtype)
    return x, a


def _with_initial(out, x, a, fill):
    shape = list(_shape(x))
    shape[a] = 1
    return concat([np.full(shape, fill, dtype=concrete(out).dtype), out], axis=a)


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    x, a = _cumulative(x, axis, dtype, include_initial, "cumulative_sum")
    out = _in_dtype(P.cumsum(x, axis=a), dtype)
    return _with_initial(out, x, a, 0) if include_initial else out


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    """Cumulative product; traced values go through a log-depth scan of multiplies, so derivatives
    of every order are exact, zeros included."""
    x, a = _cumulative(x, axis, dtype, include_initial, "cumulative_prod")
    out = _in_dtype(P.cumprod_scan(x, a) if _is_traced(x) else np.cumprod(x, axis=a), dtype)
    return _with_initial(out, x, a, 1) if include_initial else out


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None):
    """n-th forward difference along ``axis``."""
    x = _arr(x)
    a = _axis1(axis, _ndim(x))
    if prepend is not None or append is not None:
        parts = [p for p in (prepend, x, append) if p is not None]
        x = concat([_arr(p) for p in parts], axis=a)
    pre = (slice(None),) * (_ndim(x) + a)
    for _ in range(n):
        size = _shape(x)[a]
        x = getitem(x, pre + (slice(1, size),)) - getitem(x, pre + (slice(0, builtins.max(size - 1, 0)),))
    return x


# -------------------------------------------------------------------- shapes

def reshape(x, /, shape, *, copy=None):
    x = _arr(x)
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        size = math.prod(_shape(x))
        if shape.count(-1) > 1 or (known == 0 or size % known):
            raise ValueError(f"cannot reshape array of shape {_shape(x)} into shape {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if math.prod(shape) != math.prod(_shape(x)):
        raise ValueError(f"cannot reshape array of shape {_shape(x)} into shape {shape}")
    if shape == _shape(x):
        return x
    return P.reshape(x, shape=shape)


def broadcast_to(x, /, shape):
    x = _arr(x)
    shape = tuple(shape)
    np.broadcast_shapes(_shape(x), shape)
    if _shape(x) == shape:
        return x
    return P.broadcast_to(x, shape=shape)


def broadcast_arrays(*arrays):
    shape = np.broadcast_shapes(*(_shape(a) for a in arrays))
    return [broadcast_to(a, shape) for a in arrays]


def permute_dims(x, /, axes):
    x = _arr(x)
    nd = _ndim(x)
    axes = tuple(operator.index(a) % nd if nd else a for a in axes)
    if sorted(axes) != list(range(nd)):
        raise ValueError(f"axes {axes} are not a permutation of the {nd} dimensions")
    if axes == tuple(range(nd)):
        return x
    return P.permute_dims(x, axes=axes)


def matrix_transpose(x, /):
    if _ndim(x) < 2:
        raise ValueError(f"matrix_transpose needs an array of at least 2 dimensions; got shape {_shape(x)}")
    return P.matrix_transpose(_arr(x))


def moveaxis(x, source, destination, /):
    nd = _ndim(x)
    source = _axes(source, nd)
    destination = _axes(destination, nd)
    if len(source) != len(destination):
        raise ValueError("moveaxis: source and destination must have the same number of axes")
    order = [k for k in range(-nd, 0) if k not in source]
    for d, s in sorted(zip((d + nd for d in destination), source)):
        order.insert(d, s)
    return permute_dims(x, tuple(k + nd for k in order))


def expand_dims(x, /, axis=0):
    """Insert size-1 axes at ``axis`` (an int or a tuple of positions in the result)."""
    x = _arr(x)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = _ndim(x) + len(axes)
    positions = set()
    for a in axes:
        p = a + nd if a < 0 else a
        if not 0 <= p < nd:
            raise np.exceptions.AxisError(f"axis {a} is out of bounds for the result of dimension {nd}")
        positions.add(p)
    if len(positions) != len(axes):
        raise ValueError(f"repeated axis in {axis!r}")
    it = iter(_shape(x))
    return reshape(x, tuple(1 if k in positions else next(it) for k in range(nd)))


def squeeze(x, /, axis=None):
    """Remove size-1 axes (all of them when ``axis`` is None, as NumPy does)."""
    x = _arr(x)
    shape = _shape(x)
    if axis is None:
        return reshape(x, tuple(s for s in shape if s != 1))
    axes = _axes(axis, _ndim(x))
    for a in axes:
        if shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of size {shape[a]}")
    return reshape(x, tuple(s for k, s in enumerate(shape) if k - len(shape) not in axes))


def flip(x, /, *, axis=None):
    x = _arr(x)
    return P.flip(x, axis=_axes(axis, _ndim(x)))


def roll(x, /, shift, *, axis=None):
    x = _arr(x)
    if axis is None:
        return reshape(roll(reshape(x, (-1,)), shift, axis=0), _shape(x))
    axes = _axes(axis, _ndim(x))
    shift = (shift,) * len(axes) if isinstance(shift, (int, np.integer)) else tuple(shift)
    return P.roll(x, shift=tuple(int(s) for s in shift), axis=axes)


def concat(arrays, /, *, axis=0):
    arrays = [_arr(a) for a in arrays]
    if axis is None:
        return concat([reshape(a, (-1,)) for a in arrays], axis=0)
    nd = _ndim(arrays[0])
    if not builtins.any(_is_traced(a) for a in arrays):
        return np.concatenate(arrays, axis=axis)
    return P.concat(*arrays, axis=_axis1(axis, nd))


def stack(arrays, /, *, axis=0):
    arrays = [_arr(a) for a in arrays]
    nd = _ndim(arrays[0]) + 1
    a = axis if axis >= 0 else axis + nd
    return concat([expand_dims(x, axis=a) for x in arrays], axis=a)


def unstack(x, /, *, axis=0):
    a = _axis1(axis, _ndim(x))
    pre = (slice(None),) * (_ndim(x) + a)
    return tuple(getitem(x, pre + (i,)) for i in range(_shape(x)[a]))


def tile(x, repetitions, /):
    x = _arr(x)
    reps = tuple(repetitions)
    nd = builtins.max(_ndim(x), len(reps))
    x = reshape(x, (1,) * (nd - _ndim(x)) + _shape(x))
    reps = (1,) * (nd - len(reps)) + reps
    inter = []
    for s, r in zip(_shape(x), reps):
        inter += [r, s]
    expanded = broadcast_to(reshape(x, tuple(v for s in _shape(x) for v in (1, s))), tuple(inter))
    return reshape(expanded, tuple(s * r for s, r in zip(_shape(x), reps)))


def repeat(x, repeats, /, *, axis=None):
    x = _arr(x)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    a = _axis1(axis, _ndim(x))
    index = np.repeat(np.arange(_shape(x)[a]), np.asarray(concrete(repeats)))
    return take(x, index, axis=a)


# -------------------------------------------------------------------- indexing

def _normalize_index(index, shape):
    """An index without Ellipsis, with arrays as NumPy integer arrays and masks turned into indices."""
    if not isinstance(index, tuple):
        index = (index,)
    out = []
    for i in index:
        if isinstance(i, Tracer):
            i = concrete(i)
            if np.dtype(i.dtype).kind not in "biu":
                raise IndexError("only integer or boolean arrays can index")
        if isinstance(i, list):
            i = np.asarray(i)
        if isinstance(i, (builtins.bool, np.bool_)) or (isinstance(i, np.ndarray) and i.dtype == np.bool_
                                                        and i.ndim == 0):
            if not i:
                raise IndexError("x[False] (an empty 0-d mask) is not supported on traced values")
            out.append(None)  # x[True] is x[None]
            continue
        if isinstance(i, np.ndarray) and i.dtype == np.bool_:
            out.extend(np.nonzero(i))
            continue
        if isinstance(i, np.ndarray) and i.ndim == 0 and i.dtype.kind in "iu":
            i = int(i)
        out.append(i)
    consumed = builtins.sum(1 for i in out if i is not None and i is not Ellipsis)
    if builtins.sum(1 for i in out if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    if consumed > len(shape):
        raise IndexError(f"too many indices for an array of dimension {len(shape)}: {consumed} were given")
    if builtins.any(i is Ellipsis for i in out):
        k = next(j for j, i in enumerate(out) if i is Ellipsis)
        out[k:k + 1] = [slice(None)] * (len(shape) - consumed)
    return tuple(out)


def getitem(x, index):
    """``x[index]``: ints, slices (any step), None, Ellipsis, integer arrays and boolean masks."""
    x = _arr(x)
    if isinstance(index, (int, slice)) and _ndim(x):
        return P.getitem(x, index=(index,))
    return P.getitem(x, index=_normalize_index(index, _shape(x)))


def take(x, indices, /, *, axis=None):
    x = _arr(x)
    if axis is None:
        if _ndim(x) != 1:
            raise ValueError("take: axis is required for arrays with more than one dimension")
        axis = 0
    a = _axis1(axis, _ndim(x))
    index = (slice(None),) * (_ndim(x) + a) + (np.asarray(concrete(indices)),)
    return P.getitem(x, index=index)


def take_along_axis(x, indices, /, *, axis=-1):
    x = _arr(x)
    return P.take_along_axis(x, np.asarray(concrete(indices)), axis=_axis1(axis, _ndim(x)))


# -------------------------------------------------------------------- sorting, searching, sets

def sort(x, /, *, axis=-1, descending=False, stable=True):
    """Sorted values; the derivative follows the (stable) sorting permutation, ties included."""
    x = _arr(x)
    a = _axis1(axis, _ndim(x))
    if not _is_traced(x):
        out = np.sort(x, axis=a, kind="stable")
        return np.flip(out, axis=a) if descending else out
    return P.take_along_axis(x, argsort(x, axis=a, descending=descending, stable=stable), axis=a)


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    v = np.asarray(concrete(x))
    if not descending:
        return np.argsort(v, axis=axis, kind="stable")
    # stable and descending: sort the reversed array ascending, then map the indices back
    last = v.shape[axis] - 1 if v.ndim else 0
    return last - np.flip(np.argsort(np.flip(v, axis), axis=axis, kind="stable"), axis)


def argmax(x, /, *, axis=None, keepdims=False):
    return np.argmax(concrete(x), axis=axis, keepdims=keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    return np.argmin(concrete(x), axis=axis, keepdims=keepdims)


def nonzero(x, /):
    return np.nonzero(concrete(x))


def count_nonzero(x, /, *, axis=None, keepdims=False):
    return np.count_nonzero(concrete(x), axis=axis, keepdims=keepdims)


def searchsorted(x1, x2, /, *, side="left", sorter=None):
    return np.searchsorted(concrete(x1), concrete(x2), side=side,
                           sorter=None if sorter is None else np.asarray(concrete(sorter)))


def all(x, /, *, axis=None, keepdims=False):  # noqa: A001
    return np.all(concrete(x), axis=axis, keepdims=keepdims)


def any(x, /, *, axis=None, keepdims=False):  # noqa: A001
    return np.any(concrete(x), axis=axis, keepdims=keepdims)


UniqueAllResult = namedtuple("UniqueAllResult", ["values", "indices", "inverse_indices", "counts"])
UniqueCountsResult = namedtuple("UniqueCountsResult", ["values", "counts"])
UniqueInverseResult = namedtuple("UniqueInverseResult", ["values", "inverse_indices"])


def unique_all(x, /):
    return UniqueAllResult(*np.unique_all(concrete(x)))


def unique_counts(x, /):
    return UniqueCountsResult(*np.unique_counts(concrete(x)))


def unique_inverse(x, /):
    return UniqueInverseResult(*np.unique_inverse(concrete(x)))


def unique_values(x, /):
    return np.unique_values(concrete(x))


def isdtype(dtype, kind):
    import array_api_compat.numpy as cnp
    return cnp.isdtype(dtype, kind)


def result_type(*arrays_and_dtypes):
    return np.result_type(*(concrete(a) for a in arrays_and_dtypes))


def can_cast(from_, to, /):
    return np.can_cast(from_, to)


finfo_object = namedtuple("finfo_object", ["bits", "eps", "max", "min", "smallest_normal", "dtype"])
iinfo_object = namedtuple("iinfo_object", ["bits", "max", "min", "dtype"])


def _dtype_of(type, fname):
    if isinstance(type, (np.ndarray, np.generic, Tracer)):
        return np.dtype(concrete(type).dtype)  # an array: its dtype (the standard accepts both)
    return np.dtype(type)


def finfo(type, /):  # noqa: A002
    """Floating-point limits as the standard gives them: Python floats (a complex dtype: its real part's)."""
    info = np.finfo(_dtype_of(type, "finfo"))
    return finfo_object(int(info.bits), float(info.eps), float(info.max), float(info.min),
                        float(info.smallest_normal), np.dtype(info.dtype))


def iinfo(type, /):  # noqa: A002
    info = np.iinfo(_dtype_of(type, "iinfo"))
    return iinfo_object(int(info.bits), int(info.max), int(info.min), np.dtype(info.dtype))


# -------------------------------------------------------------------- products (main namespace)

def matmul(x1, x2, /):
    x1, x2 = _arr(x1), _arr(x2)
    n1, n2 = _ndim(x1), _ndim(x2)
    if n1 >= 2 and n2 >= 2:
        return P.matmul(x1, x2)
    if n1 == 0 or n2 == 0:
        raise ValueError("matmul: operands must be at least 1-D (use * for scalars)")
    a = reshape(x1, (1, _shape(x1)[0])) if n1 == 1 else x1
    b = reshape(x2, (_shape(x2)[0], 1)) if n2 == 1 else x2
    out = P.matmul(a, b)
    shape = _shape(out)
    if n1 == 1:
        shape = shape[:-2] + shape[-1:]
    if n2 == 1:
        shape = shape[:-1]
    return reshape(out, shape)


def vecdot(x1, x2, /, *, axis=-1):
    """sum(conj(x1) * x2) along ``axis`` (the Array API conjugates the first argument), in the two
    inputs' promoted dtype; the contracted axes must have the same size (they are not broadcast)."""
    x1, x2 = _arr(x1), _arr(x2)
    nd = builtins.max(_ndim(x1), _ndim(x2))
    a = _axis1(axis, nd)
    s1, s2 = (1,) * (nd - _ndim(x1)) + _shape(x1), (1,) * (nd - _ndim(x2)) + _shape(x2)
    if s1[a] != s2[a]:
        raise ValueError(f"vecdot: the contracted axis {axis} has size {s1[a]} in x1 (shape {_shape(x1)}) and "
                         f"{s2[a]} in x2 (shape {_shape(x2)}); they must be equal")
    dtype = np.result_type(concrete(x1), concrete(x2))
    out = sum(P.conj(x1) * x2 if _is_complex(x1) else P.multiply(x1, x2), axis=a)
    return _in_dtype(out, dtype)


def tensordot(x1, x2, /, *, axes=2):
    x1, x2 = _arr(x1), _arr(x2)
    if isinstance(axes, (int, np.integer)):
        ax1 = tuple(range(_ndim(x1) - axes, _ndim(x1)))
        ax2 = tuple(range(axes))
    else:
        ax1, ax2 = (tuple(a) if not isinstance(a, (int, np.integer)) else (a,) for a in axes)
    ax1 = tuple(a % _ndim(x1) for a in ax1)
    ax2 = tuple(a % _ndim(x2) for a in ax2)
    free1 = [k for k in range(_ndim(x1)) if k not in ax1]
    free2 = [k for k in range(_ndim(x2)) if k not in ax2]
    s1, s2 = _shape(x1), _shape(x2)
    k = math.prod(s1[a] for a in ax1)
    a = reshape(permute_dims(x1, tuple(free1) + ax1), (math.prod(s1[f] for f in free1), k))
    b = reshape(permute_dims(x2, ax2 + tuple(free2)), (k, math.prod(s2[f] for f in free2)))
    return reshape(P.matmul(a, b), tuple(s1[f] for f in free1) + tuple(s2[f] for f in free2))


def _einsum_label(c):
    if not c.isalpha() or not c.isascii():
        raise ValueError(f"einsum: invalid subscript {c!r} (letters a-z, A-Z and '...' only)")
    return ord(c) - ord("a") if c.islower() else 26 + ord(c) - ord("A")


def _parse_einsum(subscripts, shapes):
    """Integer labels per operand and for the output, with '...' expanded into labels of their own.

    Returns ``(labels, out, keep)``: ``keep[k]`` lists the axes of operand k that stay; an
    ellipsis axis of size 1 that broadcasts against a larger one is dropped (einsum then
    broadcasts it by the label's absence).
    """
    spec = subscripts.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum: {len(terms)} operand subscripts for {len(shapes)} operands")
    n_ell = []
    for t, s in zip(terms, shapes):
        n_letters = len(t.replace("...", ""))
        if ("..." in t and n_letters > len(s)) or ("..." not in t and n_letters != len(s)):
            raise ValueError(f"einsum: subscripts {t!r} do not match an operand of dimension {len(s)}")
        n_ell.append(len(s) - n_letters if "..." in t else 0)
    n_broadcast = builtins.max(n_ell, default=0)
    ell_labels = [100 + j for j in range(n_broadcast)]  # placeholders, renumbered at the end
    ell_sizes = [1] * n_broadcast
    labels = []
    for t, s, ne in zip(terms, shapes, n_ell):
        before, _, after = t.partition("...")
        lab = [_einsum_label(c) for c in before]
        for j in range(ne):
            e = n_broadcast - ne + j
            size = s[len(lab)]
            if size != 1:
                if ell_sizes[e] not in (1, size):
                    raise ValueError(f"einsum: operands of shapes {shapes} cannot be broadcast together")
                ell_sizes[e] = size
            lab.append(ell_labels[e])
        lab += [_einsum_label(c) for c in after]
        labels.append(lab)
    keep = []
    for k, (lab, s) in enumerate(zip(labels, shapes)):
        kept = [j for j, a in enumerate(lab) if not (a >= 100 and s[j] == 1 and ell_sizes[a - 100] != 1)]
        keep.append(kept)
        labels[k] = [lab[j] for j in kept]
    if arrow:
        before, _, after = output.partition("...")
        out = [_einsum_label(c) for c in before]
        out += (ell_labels if "..." in output else []) + [_einsum_label(c) for c in after]
    else:  # implicit output: the broadcast axes, then the letters used once, in alphabetical order
        letters = inputs.replace("...", "").replace(",", "")
        out = ell_labels + [_einsum_label(c) for c in sorted(c for c in set(letters) if letters.count(c) == 1)]
    used = {a for lab in labels for a in lab if a < 100} | {a for a in out if a < 100}
    free = (a for a in range(52) if a not in used)
    renumber = {a: next(free) for a in ell_labels}
    labels = tuple(tuple(renumber.get(a, a) for a in lab) for lab in labels)
    return labels, tuple(renumber.get(a, a) for a in out), keep


def einsum(subscripts, /, *operands, optimize=None):
    """Einstein summation (NumPy's string form, '...' included) as one differentiable primitive:
    the cotangent of each operand is itself an einsum."""
    operands = [_arr(o) for o in operands]
    if not builtins.any(_is_traced(o) for o in operands):
        return np.einsum(subscripts, *operands, optimize=optimize if optimize is not None else False)
    labels, out, keep = _parse_einsum(subscripts, [_shape(o) for o in operands])
    ops = []
    for o, k in zip(operands, keep):
        if len(k) != _ndim(o):
            o = reshape(o, tuple(_shape(o)[j] for j in k))
        ops.append(o)
    return P.einsum(*ops, labels=labels, out=out)
