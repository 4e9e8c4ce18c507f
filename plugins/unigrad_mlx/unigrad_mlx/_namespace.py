"""The Array API namespace of the ``mlx`` backend, over ``mlx.core``.

Portable functions call ``xp = unigrad.namespace(x)``; inside this backend's transforms ``x`` is an
``mlx.core.array`` and ``xp`` is this module. MLX names most functions as the standard does
(``permute_dims``, ``concat``, ``astype``, ``vecdot``, ``unstack``...) and differentiates them in
both modes, so most names below are ``mlx.core``'s own. The rest differ from the standard in a
keyword (``device=`` where MLX has ``stream=``, ``correction`` for ``ddof``, ``min``/``max`` for
``a_min``/``a_max``, ``descending``, ``include_initial``), in a default (creation functions and
``asarray`` of a NumPy float64 array give float32 in MLX; here a NumPy array keeps its dtype), or are
missing (``hypot``, ``copysign``) and are written from differentiable MLX functions. ``linalg`` is
:mod:`._linalg`.

MLX computes on the stream it is given, else the default device's; its arrays carry no device.
This namespace takes ``device=`` as the standard asks and accepts the CPU (``"cpu"``, ``mx.cpu``,
``mx.Device(mx.cpu)``), the only device of this plugin (see ``MlxBackend.devices``).
"""

from __future__ import annotations

import builtins
import math

import mlx.core as mx
import numpy as np

# Same name, same meaning in MLX and the Array API standard (for the arguments the standard gives).
_SHARED = [
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cos", "cosh", "exp", "expm1", "log",
    "log1p", "log2", "log10", "sqrt", "square", "negative", "positive", "floor", "ceil", "trunc", "sin",
    "sinh", "tan", "tanh", "real", "imag", "conj", "isnan", "isinf", "isfinite", "add", "subtract", "multiply",
    "divide", "logaddexp", "remainder", "equal", "not_equal", "less", "less_equal",
    "greater", "greater_equal", "logical_and", "logical_or", "logical_not", "logical_xor", "floor_divide",
    "all", "any", "sum", "mean", "argmax", "argmin", "reshape", "stack", "expand_dims",
    "squeeze", "matmul", "tensordot", "moveaxis", "matrix_transpose", "permute_dims", "flip",
    "broadcast_arrays", "broadcast_to", "unstack", "sigmoid", "logsumexp", "erf",
]
globals().update({name: getattr(mx, name) for name in _SHARED})
# (so in this module ``sum``, ``max``, ``min``, ``abs``, ``round``, ``all``, ``any``, ``pow`` and ``bool``
# are the standard's, not Python's builtins: the code below says ``builtins.max`` where it means Python's)

# The dtypes: MLX's own (what ``x.dtype`` compares equal to). MLX has no complex128.
bool = mx.bool_  # noqa: A001 (the standard's name)
int8, int16, int32, int64 = mx.int8, mx.int16, mx.int32, mx.int64
uint8, uint16, uint32, uint64 = mx.uint8, mx.uint16, mx.uint32, mx.uint64
float16, bfloat16, float32, float64, complex64 = mx.float16, mx.bfloat16, mx.float32, mx.float64, mx.complex64
e, pi, inf, nan = math.e, math.pi, math.inf, math.nan
newaxis = None

_FROM_NUMPY = {np.dtype(np.bool_): mx.bool_, np.dtype(np.int8): mx.int8, np.dtype(np.int16): mx.int16,
               np.dtype(np.int32): mx.int32, np.dtype(np.int64): mx.int64, np.dtype(np.uint8): mx.uint8,
               np.dtype(np.uint16): mx.uint16, np.dtype(np.uint32): mx.uint32, np.dtype(np.uint64): mx.uint64,
               np.dtype(np.float16): mx.float16, np.dtype(np.float32): mx.float32,
               np.dtype(np.float64): mx.float32, np.dtype(np.complex64): mx.complex64,
               np.dtype(np.complex128): mx.complex64}  # (MLX's rule: 64-bit floats arrive as 32-bit)
_BY_NAME = {"bool": mx.bool_, "int8": mx.int8, "int16": mx.int16, "int32": mx.int32, "int64": mx.int64,
            "uint8": mx.uint8, "uint16": mx.uint16, "uint32": mx.uint32, "uint64": mx.uint64,
            "float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32, "float64": mx.float64,
            "complex64": mx.complex64}


def numpy_dtype(dtype):
    """The NumPy dtype of an MLX dtype (bfloat16: ``ml_dtypes.bfloat16`` where installed, else float32)."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return np.dtype(np.float32)
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype("bool" if name == "bool_" else name)


def dtype_of(dtype):
    """An MLX dtype from an MLX dtype, a canonical name (``"float64"``) or a NumPy dtype; a TypeError
    naming what MLX lacks (complex128)."""
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError(f"the mlx backend has no {name} arrays (MLX's complex type is complex64 only); "
                        f"got dtype {dtype!r}") from None


def _stream(device):
    """The standard's ``device=`` as MLX's ``stream=``: the CPU, this plugin's one device."""
    if device is None:
        return None
    if device in ("cpu", mx.cpu) or (isinstance(device, mx.Device) and device.type == mx.cpu):
        return mx.cpu
    raise ValueError(f"device: the mlx backend computes on 'cpu' only; got {device!r}")


# ------------------------------------------------------------------ creation


def asarray(obj, /, *, dtype=None, device=None, copy=None):
    """An ``mx.array``. Without ``dtype``, MLX's rule: a NumPy (or other framework's) float64 array becomes
    float32 and complex128 complex64 (``mx.array`` does the same), Python floats float32; other dtypes are
    kept. An explicit ``dtype="float64"`` gives MLX's float64."""
    _stream(device)
    dtype = dtype_of(dtype)
    if isinstance(obj, mx.array):
        out = obj if dtype is None or obj.dtype == dtype else obj.astype(dtype)
        return mx.array(out) if copy and out is obj else out
    if dtype is None:
        if not isinstance(obj, (np.ndarray, np.generic)) and not hasattr(obj, "__array__"):
            return mx.array(obj)  # Python scalars and lists: MLX's defaults (float32, int32, complex64)
        data = _contiguous(obj)  # NumPy, or another framework's CPU array
        if data.dtype.name == "bfloat16":  # ml_dtypes.bfloat16 (JAX's, torch's to_numpy): MLX's bits
            return mx.array(data.view(np.uint16)).view(mx.bfloat16)
        dtype = _FROM_NUMPY.get(data.dtype)
        if dtype is None:
            raise TypeError(f"asarray: the mlx backend has no {data.dtype} arrays")
        return mx.array(data, dtype=dtype)
    if dtype == mx.bfloat16 and isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.name == "bfloat16":
        return mx.array(_contiguous(obj).view(np.uint16)).view(mx.bfloat16)
    return mx.array(_contiguous(obj) if hasattr(obj, "__array__") else obj, dtype=dtype)


def _contiguous(obj):
    """A C-contiguous NumPy array of ``obj``, 0-d kept (MLX takes no negative strides)."""
    data = np.asarray(obj)
    return data if data.flags.c_contiguous else data.copy(order="C")


def zeros(shape, *, dtype=None, device=None):
    return mx.zeros(shape, dtype=dtype_of(dtype) or mx.float32, stream=_stream(device))


def ones(shape, *, dtype=None, device=None):
    return mx.ones(shape, dtype=dtype_of(dtype) or mx.float32, stream=_stream(device))


def empty(shape, *, dtype=None, device=None):
    return zeros(shape, dtype=dtype, device=device)


def full(shape, fill_value, *, dtype=None, device=None):
    return mx.full(shape, fill_value, dtype=dtype_of(dtype), stream=_stream(device))


def zeros_like(x, /, *, dtype=None, device=None):
    return mx.zeros(x.shape, dtype=dtype_of(dtype) or x.dtype, stream=_stream(device))


def ones_like(x, /, *, dtype=None, device=None):
    return mx.ones(x.shape, dtype=dtype_of(dtype) or x.dtype, stream=_stream(device))


def empty_like(x, /, *, dtype=None, device=None):
    return zeros_like(x, dtype=dtype, device=device)


def full_like(x, /, fill_value, *, dtype=None, device=None):
    return mx.full(x.shape, fill_value, dtype=dtype_of(dtype) or x.dtype, stream=_stream(device))


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    return mx.eye(n_rows, n_cols, k, dtype=dtype_of(dtype) or mx.float32, stream=_stream(device))


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    if stop is None:
        start, stop = 0, start
    return mx.arange(start, stop, step, dtype=dtype_of(dtype), stream=_stream(device))


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    return mx.linspace(start, stop, num, dtype=dtype_of(dtype) or mx.float32, stream=_stream(device)) if endpoint \
        else mx.linspace(start, stop, num + 1, dtype=dtype_of(dtype) or mx.float32, stream=_stream(device))[:-1]


def tril(x, /, *, k=0):
    return mx.tril(x, k)


def triu(x, /, *, k=0):
    return mx.triu(x, k)


# ------------------------------------------------------------------ data types


def astype(x, dtype, /, *, copy=True, device=None):
    _stream(device)
    dtype = dtype_of(dtype)
    if x.dtype == mx.complex64 and dtype != mx.complex64:
        x = mx.real(x)  # complex -> real keeps the real part
    if x.dtype == dtype:
        return x * 1 if copy and dtype != mx.bool_ else x
    return mx.astype(x, dtype)


def result_type(*arrays_and_dtypes):
    return mx.result_type(*(a if isinstance(a, (mx.array, mx.Dtype)) else dtype_of(a) for a in arrays_and_dtypes))


def can_cast(from_, to, /):
    return np.can_cast(np.dtype(str(dtype_of(from_ if isinstance(from_, mx.Dtype) else from_.dtype)).split(".")[-1]),
                       np.dtype(str(dtype_of(to)).split(".")[-1]))


def isdtype(dtype, kind):
    return mx.isdtype(dtype, kind)


def finfo(type_, /):
    return mx.finfo(type_ if isinstance(type_, mx.Dtype) else type_.dtype)


def iinfo(type_, /):
    return mx.iinfo(type_ if isinstance(type_, mx.Dtype) else type_.dtype)


# ------------------------------------------------------------------ elementwise


def round(x, /):  # noqa: A001 (the standard's name)
    return mx.round(x)


def sign(x, /):
    if x.dtype == mx.complex64:  # the standard's x / |x| (0 at 0)
        a = mx.abs(x)
        return mx.where(a == 0, mx.zeros_like(x), x / mx.where(a == 0, mx.ones_like(a), a))
    return mx.sign(x)


def clip(x, /, min=None, max=None):  # noqa: A002 (the standard's names)
    if min is None and max is None:
        return x * 1  # a new array, as the standard asks
    out = x
    # unigrad's rule (docs/conventions.md): the derivative passes at the bounds; a bound that is itself
    # differentiated takes it where its value was taken
    if min is not None:
        out = mx.where(out < min, min, out)
    if max is not None:
        out = mx.where(out > max, max, out)
    return out.astype(x.dtype) if out.dtype != x.dtype else out


def _is_float(x):
    return isinstance(x, builtins.float) or (isinstance(x, mx.array) and mx.issubdtype(x.dtype, mx.inexact))


def _tie_rule(name, pick):
    """maximum / minimum with unigrad's rule at a tie (docs/conventions.md): half the derivative to each
    operand (MLX's own gives all of it to one). The value at a tie is x1 * 0.5 + x2 * 0.5 (no overflow)."""
    def extremum(x1, x2, /):
        if not (_is_float(x1) or _is_float(x2)):
            return pick(x1, x2)
        first = (x1 > x2) if pick is mx.maximum else (x1 < x2)
        second = (x1 < x2) if pick is mx.maximum else (x1 > x2)
        return mx.where(first, x1, mx.where(second, x2, x1 * 0.5 + x2 * 0.5))
    extremum.__name__ = name
    return extremum


maximum = _tie_rule("maximum", mx.maximum)
minimum = _tie_rule("minimum", mx.minimum)


def pow(x1, x2, /):  # noqa: A001 (the standard's name)
    """x1 ** x2; where x2 is 0 the derivative with respect to x1 is 0 (unigrad's rule; MLX's own is
    0 * x1 ** -1, NaN at x1 = 0), with respect to x2 it is log(x1) * x1 ** x2 as ever."""
    if isinstance(x2, (builtins.int, builtins.float)) and not isinstance(x2, builtins.bool):
        x1 = mx.stop_gradient(x1) if x2 == 0 else x1
    elif isinstance(x2, mx.array) and isinstance(x1, mx.array):
        x1 = mx.where(x2 == 0, mx.stop_gradient(x1), x1)
    if _is_complex(x1) or _is_complex(x2):
        x1, x2 = mx.broadcast_arrays(mx.array(x1), mx.array(x2))
        return _complex_power(x1.astype(mx.complex64), x2.astype(mx.complex64))
    return mx.power(x1, x2)


def _is_complex(x):
    return isinstance(x, builtins.complex) or (isinstance(x, mx.array) and x.dtype == mx.complex64)


# MLX 0.32's VJP of a complex power is the conjugate of what its other primitives' VJPs are (mx.multiply,
# mx.exp...), so a complex power inside f gave a wrong gradient even with real inputs and outputs
# (grad of real((x * (1 + 2j)) ** 2)). Here the power's rules follow the others' convention, to any order
# (the rules call the function itself). The ** operator on mx.array is MLX's own and keeps its defect.

@mx.custom_function
def _complex_power(x, y):
    return mx.power(x, y)


def _power_derivatives(x, y, out):
    """d out / dx and d out / dy (the latter 0 at x = 0, as MLX's real rule has it)."""
    at_zero = x == 0
    dy = mx.where(at_zero, mx.zeros_like(out), out * mx.log(mx.where(at_zero, mx.ones_like(x), x)))
    return y * _complex_power(x, y - 1), dy


@_complex_power.vjp
def _complex_power_vjp(primals, cotangent, output):
    x, y = primals
    dx, dy = _power_derivatives(x, y, _complex_power(x, y))
    return cotangent * mx.conj(dx), cotangent * mx.conj(dy)


@_complex_power.jvp
def _complex_power_jvp(primals, tangents):
    x, y = primals
    dx, dy = _power_derivatives(x, y, _complex_power(x, y))
    terms = [t * d for t, d in zip(tangents, (dx, dy)) if t is not None]  # (None: no tangent there)
    return terms[0] + terms[1] if len(terms) == 2 else terms[0] if terms else mx.zeros_like(dx)


def where(condition, x1, x2, /):
    return mx.where(condition, x1, x2)


def hypot(x1, x2, /):
    # sqrt(x1^2 + x2^2), scaled so that neither square overflows; derivative x_i / hypot
    big = mx.maximum(mx.abs(x1), mx.abs(x2))
    safe = mx.where(big == 0, mx.ones_like(big), mx.stop_gradient(big))
    return safe * mx.sqrt((x1 / safe) ** 2 + (x2 / safe) ** 2)


def copysign(x1, x2, /):
    # |x1| with x2's sign: x1 times +-1, a constant (no derivative with respect to x2)
    flip_sign = mx.where(_signbit(x1) == _signbit(x2), 1, -1)
    return x1 * mx.stop_gradient(flip_sign).astype(mx.result_type(x1, x2))


def _signbit(x):
    return mx.logical_or(x < 0, mx.logical_and(x == 0, (1 / mx.where(x == 0, x, mx.ones_like(x))) < 0))


def signbit(x, /):
    return _signbit(x)


def reciprocal(x, /):
    return 1 / x


# ------------------------------------------------------------------ statistics


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    return mx.sqrt(var(x, axis=axis, correction=correction, keepdims=keepdims))


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    axes = _axes(axis, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    d = x - mx.mean(x, axis=axes, keepdims=True)
    return mx.sum(mx.real(d * mx.conj(d)) if d.dtype == mx.complex64 else d * d, axis=axes,
                  keepdims=keepdims) / (n - correction)


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in ((axis,) if isinstance(axis, int) else axis))


def _cumulative_input(name, x, axis, dtype):
    """The standard's rules for a cumulative function's ``axis`` (required beyond 1-D) and ``dtype``."""
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"{name}: axis is required for an x of {x.ndim} dimensions")
        axis = 0
    return (x if dtype is None else astype(x, dtype)), axis % builtins.max(x.ndim, 1)


def _with_initial(out, x, axis, value):
    shape = list(x.shape)
    shape[axis] = 1
    return mx.concatenate([mx.full(shape, value, dtype=out.dtype), out], axis=axis)


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    x, axis = _cumulative_input("cumulative_sum", x, axis, dtype)
    out = mx.cumsum(x, axis=axis)
    return _with_initial(out, x, axis, 0) if include_initial else out


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    x, axis = _cumulative_input("cumulative_prod", x, axis, dtype)
    out = _scan_product(x, axis)
    return _with_initial(out, x, axis, 1) if include_initial else out


# MLX 0.32 has no JVP for its cumulative product (mx.cumprod), and its prod's VJP is made of cumulative
# products: so neither has a second derivative, nor cumprod a first in forward mode. The two are written
# here from products and slices, which MLX differentiates to any order, exactly where inputs are zero too.

def _scan_product(x, axis):
    """Inclusive cumulative product along ``axis`` in ceil(log2 n) rounds of products (Hillis-Steele):
    round k multiplies each element by the one 2**k before it."""
    n = x.shape[axis] if x.ndim else 1
    if x.ndim == 0 or n <= 1:
        return x
    out, shift = x, 1
    while shift < n:
        lead = [slice(None)] * x.ndim
        lead[axis] = slice(0, n - shift)
        ones_shape = list(x.shape)
        ones_shape[axis] = shift
        out = out * mx.concatenate([mx.ones(ones_shape, dtype=x.dtype), out[tuple(lead)]], axis=axis)
        shift *= 2
    return out


def prod(x, /, *, axis=None, dtype=None, keepdims=False):
    """The product over ``axis`` as a tree of pairwise products of halves (ceil(log2 n) rounds)."""
    if dtype is not None:
        x = astype(x, dtype)
    axes = _axes(axis, x.ndim)
    if not axes:
        return x
    kept = [d for d in range(x.ndim) if d not in axes]
    moved = mx.transpose(x, kept + list(axes)) if x.ndim else x
    lead = [x.shape[d] for d in kept]
    flat = mx.reshape(moved, (*lead, math.prod(x.shape[a] for a in axes)))
    while flat.shape[-1] > 1:
        if flat.shape[-1] % 2:
            flat = mx.concatenate([flat, mx.ones((*lead, 1), dtype=flat.dtype)], axis=-1)
        flat = flat[..., 0::2] * flat[..., 1::2]
    out = mx.reshape(flat, lead) if flat.shape[-1] == 1 else mx.ones(lead, dtype=x.dtype)
    if keepdims:
        out = mx.reshape(out, [1 if d in axes else x.shape[d] for d in range(x.ndim)])
    return out


def _extremum(name, reduce):
    def extremum(x, /, *, axis=None, keepdims=False):
        axes = _axes(axis, x.ndim)
        shape = [1 if d in axes else x.shape[d] for d in range(x.ndim)]
        if x.size == 0 and math.prod(shape) == 0 and not builtins.any(x.shape[a] == 0 for a in axes):
            # an empty result: MLX's derivative (argmax) refuses an empty input, so a sum stands in
            return mx.sum(x, axis=axes, keepdims=keepdims)
        if not (axes and mx.issubdtype(x.dtype, mx.floating)):
            return reduce(x, axis=axes, keepdims=keepdims)
        return _split_ties(x, axes, keepdims, reduce)
    extremum.__name__ = name
    return extremum


def _split_ties(x, axes, keepdims, reduce):
    """max / min over ``axes`` with unigrad's rule at a tie (docs/conventions.md): the derivative split
    equally among the elements that attain it, in both modes and to any order. MLX's own VJP splits, but
    its JVP gives all of it to one element (forward mode: [1, 0, 0] for max([1, 1, 0]), reverse [.5, .5, 0]).

    The value is MLX's extremum ``m`` (no derivative of its own) plus a term that is +0 in value and
    carries the derivative: the sum over the attaining elements of (x - m), times one over their count.
    It is added as ``m - (0 - d)``: ``m`` exactly (-0.0 too, which ``m + 0`` would make +0.0), and a zero
    derivative is +0 (two negations). An infinite ``m`` enters ``x - m`` as 0, so ``d`` is that infinity
    and the sum gives it back. Every operation is an MLX primitive, so vmap, compile and the exported
    program (the proofs and sparsity patterns) see ordinary reductions."""
    m = mx.stop_gradient(reduce(x, axis=axes, keepdims=keepdims))
    kept = m if keepdims else mx.expand_dims(m, axes)
    attains = mx.stop_gradient(x == kept)  # (none where m is NaN: no derivative there)
    share = mx.stop_gradient(1 / mx.maximum(mx.sum(attains, axis=axes, keepdims=keepdims), 1).astype(x.dtype))
    finite = mx.where(mx.isfinite(kept), kept, mx.zeros_like(kept))
    d = mx.sum(mx.where(attains, x - finite, mx.zeros_like(x)), axis=axes, keepdims=keepdims) * share
    return m - (0.0 - d)


max = _extremum("max", mx.max)  # noqa: A001 (the standard's names)
min = _extremum("min", mx.min)  # noqa: A001


# ------------------------------------------------------------------ manipulation


def concat(arrays, /, *, axis=0):
    if axis is None:
        return mx.concatenate([mx.reshape(a, (-1,)) for a in arrays], axis=0)
    return mx.concatenate(list(arrays), axis=axis)


def repeat(x, repeats, /, *, axis=None):
    if axis is None:
        x, axis = mx.reshape(x, (-1,)), 0
    if isinstance(repeats, int):
        return mx.repeat(x, repeats, axis=axis)
    counts = np.asarray(repeats).reshape(-1)  # an array of counts: a gather (a concrete value)
    index = np.repeat(np.arange(x.shape[axis]), counts if counts.size > 1 else int(counts[0]))
    return mx.take(x, mx.array(index, dtype=mx.int32), axis=axis)


def roll(x, /, shift, *, axis=None):
    return mx.roll(x, shift, axis) if axis is not None else mx.roll(x, shift)


def tile(x, repetitions, /):
    return mx.tile(x, list(repetitions))


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None):
    if prepend is not None or append is not None:
        x = concat([a for a in (prepend, x, append) if a is not None], axis=axis)
    return mx.diff(x, n, axis)


def _index(indices):
    """Indices carry no derivative. MLX's gather refuses to differentiate (either mode) through index
    arrays computed from a differentiated value ("[gather] Cannot calculate VJP with respect to indices"),
    so the namespace cuts them: here, and at every integer result of this module (``_cut``)."""
    return mx.stop_gradient(indices) if isinstance(indices, mx.array) else indices


def take(x, indices, /, *, axis=None):
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"take: axis is required for an x of {x.ndim} dimensions (shape {x.shape})")
        axis = 0
    return mx.take(x, _index(indices), axis=axis)


def take_along_axis(x, indices, /, *, axis=-1):
    return mx.take_along_axis(x, _index(indices), axis=axis)


def sort(x, /, *, axis=-1, descending=False, stable=True):
    # by the order argsort gives (a gather, differentiable both ways); descending and stable: argsort of
    # the negated values keeps equal elements in their order
    order = mx.argsort(-mx.stop_gradient(x) if descending else mx.stop_gradient(x), axis=axis)
    return mx.take_along_axis(x, order, axis=axis)


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    return mx.argsort(-x if descending else x, axis=axis)


def vecdot(x1, x2, /, *, axis=-1):
    return mx.sum(mx.conj(x1) * x2 if x1.dtype == mx.complex64 else x1 * x2, axis=axis)


def nonzero(x, /):
    return tuple(mx.array(i) for i in np.nonzero(np.asarray(x)))


def searchsorted(x1, x2, /, *, side="left", sorter=None):
    return mx.array(np.searchsorted(np.asarray(x1), np.asarray(x2), side=side, sorter=sorter))


def unique_values(x, /):
    return mx.array(np.unique(np.asarray(x)))


def count_nonzero(x, /, *, axis=None, keepdims=False):
    return mx.sum(x != 0, axis=axis, keepdims=keepdims)


# ------------------------------------------------------------------ results cut from the graph
# Zero-size results: MLX 0.32.4's CPU reduction kernel, run on a zero-size input whose result is not empty
# (as the VJP of a broadcast into an empty shape makes it), died of a floating-point exception or spun
# without end in our runs (now and then: it depends on the buffers it is handed). A zero-size array
# carries no derivative to anything, so every function here returns a zero-size result as a constant of
# its shape and dtype: MLX's transforms then never reduce an empty array.
# Integer and boolean results (argsort, argmax, astype to an integer, where of integers, a sum of
# comparisons...) carry no derivative either; MLX keeps them in the graph, and its gather and scatter
# then refuse to differentiate through them as indices, in both modes ("Cannot calculate VJP with respect
# to indices": x[xp.argsort(x)]). Every function here returns them with the gradient stopped.
# (Python operators on mx.array, ``a + b``, ``x > 0``, are MLX's own.)

def _constant_if_empty(out):
    if isinstance(out, mx.array):
        return mx.zeros(out.shape, dtype=out.dtype) if out.size == 0 else out
    if isinstance(out, tuple):
        items = [_constant_if_empty(o) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
    return out


def _cut_result(out, args):
    if isinstance(out, mx.array):
        if out.size == 0:
            return mx.zeros(out.shape, dtype=out.dtype)
        if mx.issubdtype(out.dtype, mx.inexact) or builtins.any(out is a for a in args):
            return out  # (a float carries its derivative; an argument handed back was not computed here)
        return mx.stop_gradient(out)  # an integer or boolean result
    if isinstance(out, tuple):
        items = [_cut_result(o, args) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
    return out


def _cut(fn):
    def cut(*args, **kwargs):
        return _cut_result(fn(*args, **kwargs), args)
    cut.__name__ = cut.__qualname__ = getattr(fn, "__name__", "function")
    cut.__doc__ = getattr(fn, "__doc__", None)
    cut.__wrapped__ = fn
    return cut


_NOT_CUT = frozenset({"dtype_of", "numpy_dtype", "result_type", "can_cast", "isdtype", "finfo", "iinfo"})
for _name, _value in list(globals().items()):
    if (not _name.startswith("_") and _name not in _NOT_CUT and callable(_value)
            and not isinstance(_value, (type, mx.Dtype))):
        globals()[_name] = _cut(_value)
del _name, _value
