"""An Array API namespace over TensorFlow tensors (array-api-compat has none for TensorFlow).

``unigrad.namespace(x)`` returns this module for ``tf.Tensor`` / ``tf.Variable``
inputs, so a portable function runs unchanged on TensorFlow. Where TensorFlow
has the function it is a one-line mapping; the rest is written with TensorFlow
ops, so everything here is differentiable by ``tf.GradientTape`` and
``tf.autodiff.ForwardAccumulator`` and runs inside ``tf.function``.

Array API semantics that TensorFlow does not have natively:
  * type promotion: ``add(float32, float64)`` is float64, and Python scalars are
    weak (``multiply(x32, 2.0)`` stays float32); TensorFlow itself raises on
    mixed dtypes;
  * ``axis=None`` reduces everything, ``keepdims``, ``std(correction=)``;
  * ``matmul`` with 1-D operands, integer-array and boolean-mask indexing
    (``getitem``), negative indices in ``take``;
  * creation functions default to float64 (like NumPy and the tape) and take
    ``device=`` as ``"cpu"``, ``"cuda:N"``/``"gpu:N"`` or a TensorFlow device name.

  * integer and unsigned dtypes TensorFlow has no kernel for (``floor`` of an integer,
    ``abs``/``negative``/``sign``/``pow`` of unsigned, integer ``matmul``), and sums of
    small integers accumulated in int64 / uint64 as the standard says;
  * derivatives at the hard points follow the tape, torch and JAX where TensorFlow's differ
    (``maximum``/``minimum`` ties, ``x ** 0``, ``sqrt`` in the untaken branch of a ``where``).

This module is the implementation (plain tensors in, plain tensors out), one floor above
``_tensors`` (conversion, promotion, axes, devices), ``_shapes``, ``_linalg`` and ``_fft``, whose names
it re-exports. The public namespace, ``unigrad_tensorflow.namespace``, is the same functions behind a
boundary (``_array.py``, above this module) that takes :class:`unigrad_tensorflow.Array` s or plain
tensors and returns :class:`unigrad_tensorflow.Array` s wherever it is called. Operators on the user's
own ``tf.Tensor`` s stay TensorFlow's.
"""

from __future__ import annotations

import builtins
import ctypes
import math
from typing import NamedTuple


import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from . import _fft as fft  # noqa: E402
from . import _recorded  # noqa: E402
from . import _linalg as linalg  # noqa: E402
from ._linalg import (SlogdetResult, EighResult, QRResult, SVDResult, diagonal, matmul, outer,  # noqa: E402,F401
                      tensordot, trace, vecdot)
from ._shapes import (broadcast_arrays, broadcast_to, concat, expand_dims, flip, matrix_transpose,  # noqa: E402,F401
                      moveaxis, permute_dims, repeat, reshape, roll, squeeze, stack, tile, unstack)
from ._tensors import (_SCALARS, TensorHolder, _accumulator, _axes, _count, _dt,  # noqa: E402,F401
                       _gpu_count, _on, _promote, _scalar, _shape_arg, _tensor, _weak, result_type, tf_device_name)

__array_api_version__ = "2024.12"

# -------------------------------------------------------------------- dtypes and constants
bool = tf.bool  # noqa: A001 -- Array API names
int8, int16, int32, int64 = tf.int8, tf.int16, tf.int32, tf.int64
uint8, uint16, uint32, uint64 = tf.uint8, tf.uint16, tf.uint32, tf.uint64
float16, bfloat16, float32, float64 = tf.float16, tf.bfloat16, tf.float32, tf.float64
complex64, complex128 = tf.complex64, tf.complex128
e, pi, inf, nan, newaxis = math.e, math.pi, math.inf, math.nan, None



# -------------------------------------------------------------------- creation

def asarray(obj, /, *, dtype=None, device=None, copy=None):
    dtype = _dt(dtype)
    with _on(device):
        if isinstance(obj, (list, tuple)) and builtins.any(isinstance(o, (tf.Tensor, tf.Variable)) for o in obj):
            out = stack([_tensor(o, dtype) for o in obj])
        else:
            out = _tensor(obj, dtype)
        return tf.identity(out) if device is not None else out  # identity places it on the device


def from_dlpack(x, /, *, device=None, copy=None):
    """A tensor with the values of another framework's array, copied on its device (no trip through the host).

    DLPack shares the other framework's memory, which may be written later, and TensorFlow assumes
    tensors never change: the shared buffer is copied at once (so ``copy=False`` cannot be honoured
    and raises). Buffers TensorFlow cannot take as they are (not 64-byte aligned, strided) go through
    NumPy's DLPack import instead. ``device=`` places the copy.
    """
    if isinstance(x, (TensorHolder, tf.Tensor)):  # a tensor: immutable, so sharing it is a copy's equal
        return asarray(x, device=device)
    if copy is False:
        raise ValueError("from_dlpack(copy=False): a TensorFlow tensor never shares another framework's memory "
                         "(that memory may change; tensors may not)")
    if device is not None:
        return asarray(from_dlpack(x), device=device)
    capsule = x.__dlpack__()
    if _dlpack_address(capsule) % _ALIGNMENT == 0:
        try:
            return tf.raw_ops.DeepCopy(x=tf.experimental.dlpack.from_dlpack(capsule))
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):  # strides, dtypes
            pass
    return tf.convert_to_tensor(np.from_dlpack(x))


# TensorFlow's kernels CHECK-fail -- abort the process -- on a buffer aligned to less than this, and
# tf.experimental.dlpack.from_dlpack accepts one (a NumPy array, a sliced view) without complaint.
_ALIGNMENT = 64
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _dlpack_address(capsule):
    """The address of the first element of a (legacy, unconsumed) DLPack capsule's tensor.

    DLManagedTensor begins with DLTensor: data (pointer, offset 0) ... byte_offset (uint64, offset 40).
    """
    managed = _capsule_pointer(capsule, b"dltensor")
    data = ctypes.c_void_p.from_address(managed).value or 0
    return data + ctypes.c_uint64.from_address(managed + 40).value


def zeros(shape, *, dtype=None, device=None):
    with _on(device):
        return tf.zeros(_shape_arg(shape), _dt(dtype) or tf.float64)


def ones(shape, *, dtype=None, device=None):
    with _on(device):
        return tf.ones(_shape_arg(shape), _dt(dtype) or tf.float64)


empty = zeros


def full(shape, fill_value, *, dtype=None, device=None):
    if isinstance(fill_value, (tf.Tensor, tf.Variable)):
        value = _tensor(fill_value)
        dtype = _dt(dtype) or value.dtype
        value = tf.cast(value, dtype)
    else:
        # a Python scalar becomes a constant of the target dtype directly: tf.cast(0.1, float64) would
        # round it through float32 first (0.10000000149...), and 1e300 would not even fit
        dtype = _dt(dtype) or tf.as_dtype(np.asarray(fill_value).dtype)
        value = _scalar(fill_value, dtype) if isinstance(fill_value, _SCALARS) else tf.constant(
            np.asarray(fill_value, dtype.as_numpy_dtype))
    with _on(device):
        return tf.fill(_shape_arg(shape), value)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None):
    n_cols = n_rows if n_cols is None else n_cols
    with _on(device):
        if isinstance(k, int):  # any diagonal outside the matrix is all zeros (and k may not fit in int64)
            k = builtins.max(-n_rows, builtins.min(n_cols, k))
        mask = tf.range(n_cols)[None, :] - tf.range(n_rows)[:, None] == k
        return tf.cast(mask, _dt(dtype) or tf.float64)


def arange(start, /, stop=None, step=1, *, dtype=None, device=None):
    if stop is None:
        start, stop = 0, start
    dtype = _dt(dtype) or (tf.int64 if builtins.all(isinstance(v, int) for v in (start, stop, step)) else tf.float64)
    with _on(device):
        if builtins.all(isinstance(v, (int, float)) for v in (start, stop, step)) and step and \
                math.ceil((stop - start) / step) <= 0:  # empty: TensorFlow's Range refuses start > stop
            return tf.zeros([0], dtype)
        if dtype.is_integer and dtype not in (tf.int32, tf.int64):  # no Range kernel: in int64, then cast
            return tf.cast(tf.range(start, stop, step, dtype=tf.int64), dtype)
        return tf.range(start, stop, step, dtype=dtype)


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True):
    work = tf.complex128 if isinstance(start, complex) or isinstance(stop, complex) else tf.float64
    start, stop = _tensor(start, work), _tensor(stop, work)
    div = num - 1 if endpoint else num
    with _on(device):
        out = start + (stop - start) * tf.range(num, dtype=work) / tf.cast(builtins.max(div, 1), work)
        if endpoint and num > 1:  # exactly ``stop`` at the end, as NumPy does
            out = tf.concat([out[:-1], stop[None]], 0)
        return tf.cast(out, _dt(dtype) or work)


def zeros_like(x, /, *, dtype=None, device=None):
    with _on(device):
        return tf.zeros_like(_tensor(x), dtype=_dt(dtype))


def ones_like(x, /, *, dtype=None, device=None):
    with _on(device):
        return tf.ones_like(_tensor(x), dtype=_dt(dtype))


empty_like = zeros_like


def full_like(x, /, fill_value, *, dtype=None, device=None):
    x = _tensor(x)
    return full(tf.shape(x), fill_value, dtype=_dt(dtype) or x.dtype, device=device)


def _band(x, k, lower):
    x = _tensor(x)
    n, m = x.shape[-2], x.shape[-1]
    offset = tf.range(m)[None, :] - tf.range(n)[:, None]
    return tf.where(offset <= k if lower else offset >= k, x, tf.zeros_like(x))


def tril(x, /, *, k=0):
    return _band(x, k, lower=True)


def triu(x, /, *, k=0):
    return _band(x, k, lower=False)


def meshgrid(*arrays, indexing="xy"):
    return list(tf.meshgrid(*_promote(*arrays), indexing=indexing))  # a list since the 2024.12 standard


# -------------------------------------------------------------------- elementwise

def _unary(fn, name):
    def op(x, /):
        return fn(_tensor(x))
    op.__name__ = op.__qualname__ = name
    return op


def _binary(fn, name):
    def op(x1, x2, /):
        return fn(*_promote(x1, x2))
    op.__name__ = op.__qualname__ = name
    return op


_LN2, _LN10 = math.log(2.0), math.log(10.0)



def _complex_special(kernel, formula, special):
    """TensorFlow's complex expm1/log1p kernels give NaN where C99 (and the standard) define a value
    (expm1(-inf+inf j) = -1, log1p(-1) = -inf, log1p(x + inf j) = inf + pi/2 j...); there ``formula``
    (exp(z) - 1, log(1 + z), whose kernels follow C99) is exact. Real inputs: the kernel alone."""
    def fn(x):
        if not x.dtype.is_complex:
            return kernel(x)
        re, im = tf.math.real(x), tf.math.imag(x)
        odd = ~tf.math.is_finite(re) | ~tf.math.is_finite(im) | special(x, re, im)
        return tf.where(odd, formula(x), kernel(x))
    return fn


_expm1 = _complex_special(tf.math.expm1, lambda z: tf.exp(z) - 1, lambda z, re, im: (re == 0) & (im == 0))
_log1p = _complex_special(tf.math.log1p, lambda z: tf.math.log(1 + z), lambda z, re, im: (re == -1) & (im == 0))


def _log(x):
    """TensorFlow's complex log squares |z| in the input's precision: NaN for |z| above sqrt(max)
    (1.8e19 in complex64). There: log|z| + i arg z, with |z| by hypot. Elsewhere the kernel."""
    if not x.dtype.is_complex:
        return tf.math.log(x)
    big = tf.abs(x) > tf.constant(math.sqrt(x.dtype.real_dtype.max) / 4, x.dtype.real_dtype)
    one = tf.ones_like(x)
    large, small = tf.where(big, x, one), tf.where(big, one, x)  # each branch sees safe values only
    return tf.where(big, tf.complex(tf.math.log(tf.abs(large)), tf.math.angle(large)), tf.math.log(small))


exp, expm1, log, log1p = (_unary(f, n) for f, n in ((tf.exp, "exp"), (_expm1, "expm1"),
                                                    (_log, "log"), (_log1p, "log1p")))
log2 = _unary(lambda x: _log(x) / tf.constant(_LN2, x.dtype), "log2")
log10 = _unary(lambda x: _log(x) / tf.constant(_LN10, x.dtype), "log10")
sin, cos, tan = (_unary(f, n) for f, n in ((tf.sin, "sin"), (tf.cos, "cos"),
                                                 (tf.tan, "tan")))
sinh, cosh, tanh = (_unary(f, n) for f, n in ((tf.sinh, "sinh"), (tf.cosh, "cosh"), (tf.tanh, "tanh")))
asin, acos, atan = (_unary(f, n) for f, n in ((tf.asin, "asin"), (tf.acos, "acos"), (tf.atan, "atan")))
asinh, acosh, atanh = (_unary(f, n) for f, n in ((tf.asinh, "asinh"), (tf.acosh, "acosh"), (tf.atanh, "atanh")))
abs = _unary(lambda x: x if x.dtype.is_unsigned else tf.abs(x), "abs")  # noqa: A001
# unsigned integers: TensorFlow has no kernels; 0 - x wraps around as NumPy's does
negative = _unary(lambda x: tf.zeros_like(x) - x if x.dtype.is_unsigned else tf.negative(x), "negative")
positive = _unary(lambda x: x, "positive")
square = _unary(tf.square, "square")
sign = _unary(lambda x: tf.cast(x > 0, x.dtype) if x.dtype.is_unsigned else tf.sign(x),
              "sign")  # complex: x / |x|, as the Array API says
def _rounding(fn):
    return lambda x: x if x.dtype.is_integer or x.dtype.is_bool else fn(x)  # integers: the identity


floor = _unary(_rounding(tf.floor), "floor")
ceil = _unary(_rounding(tf.math.ceil), "ceil")
trunc = _unary(_rounding(lambda x: tf.where(x < 0, tf.math.ceil(x), tf.floor(x))), "trunc")
round = _unary(_rounding(tf.round), "round")  # noqa: A001 -- half to even, like NumPy
real = _unary(tf.math.real, "real")
imag = _unary(tf.math.imag, "imag")
conj = _unary(tf.math.conj, "conj")
reciprocal = _unary(tf.math.reciprocal, "reciprocal")
isnan = _unary(lambda x: tf.math.is_nan(x) if x.dtype.is_floating else
               (tf.math.is_nan(tf.math.real(x)) | tf.math.is_nan(tf.math.imag(x)) if x.dtype.is_complex
                else tf.zeros_like(x, tf.bool)), "isnan")
isinf = _unary(lambda x: tf.math.is_inf(x) if x.dtype.is_floating else
               (tf.math.is_inf(tf.math.real(x)) | tf.math.is_inf(tf.math.imag(x)) if x.dtype.is_complex
                else tf.zeros_like(x, tf.bool)), "isinf")
isfinite = _unary(lambda x: tf.math.is_finite(x) if x.dtype.is_floating else
                  (tf.math.is_finite(tf.math.real(x)) & tf.math.is_finite(tf.math.imag(x)) if x.dtype.is_complex
                   else tf.ones_like(x, tf.bool)), "isfinite")
logical_not = _unary(tf.logical_not, "logical_not")

_SAME_WIDTH_INT = {tf.float16: tf.int16, tf.bfloat16: tf.int16, tf.float32: tf.int32, tf.float64: tf.int64}


def signbit(x, /):
    """The sign bit (True for -0.0 and negative NaN too), read from the bits."""
    x = _tensor(x)
    return tf.bitcast(x, _SAME_WIDTH_INT[x.dtype]) < 0


add, subtract, multiply = _binary(tf.add, "add"), _binary(tf.subtract, "subtract"), _binary(tf.multiply, "multiply")
divide = _binary(tf.math.truediv, "divide")
# ---- derivatives at the hard points: the rule of the other backends (docs/conventions.md) where
# TensorFlow's own gradient differs. The gradient functions keep TensorFlow's (conjugate) convention
# for complex values, which the adapter converts like any other. Cotangents are selected (tf.where),
# never multiplied by a zero weight, where the rule gives a point no derivative.

def _unbroadcast(g, x):
    """``g`` summed over the axes ``x`` was broadcast along."""
    if g.shape.is_fully_defined() and g.shape == x.shape:
        return g
    gx, _ = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(x), s1=tf.shape(g))
    return tf.reshape(tf.reduce_sum(g, gx), tf.shape(x))


@tf.custom_gradient
def _sqrt_ad(x):
    y = tf.sqrt(x)

    def grad(g):
        # g / (2 sqrt(x)), multiplied out: a zero cotangent at x < 0 (the untaken branch of a where) gives
        # NaN, as on NumPy, torch and JAX; TensorFlow's SqrtGrad kernel gives 0 there
        return g * tf.math.conj(tf.constant(0.5, y.dtype) / y)
    return y, grad


def _sqrt(x):
    return _sqrt_ad(x) if x.dtype.is_floating or x.dtype.is_complex else tf.sqrt(x)


sqrt = _unary(_sqrt, "sqrt")


def _extremum(fn, first_wins, name):
    """maximum / minimum whose derivative at a tie is 1/2 for each argument (torch, JAX and the tape), in
    reverse and forward mode; TensorFlow's gives all of it to the first argument, so ``maximum(x, 0)`` and
    ``maximum(0, x)`` differed. At a NaN the derivative is 0 (the value is NaN)."""
    def weights(x1, x2):
        wins, tie = first_wins(x1, x2), tf.equal(x1, x2)
        return wins, tie, tf.math.is_nan(x1) | tf.math.is_nan(x2)

    def vjp(g, y, x1, x2):
        wins, tie, nan = weights(x1, x2)
        zero, half = tf.zeros_like(g), g * tf.constant(0.5, g.dtype)
        g1 = tf.where(wins, g, tf.where(tie, half, zero))
        g2 = tf.where(wins | tie, tf.where(tie, half, zero), g)
        g2 = tf.where(nan, zero, g2)
        return _unbroadcast(g1, x1), _unbroadcast(g2, x2)

    def jvp(tangents, y, x1, x2):
        wins, tie, nan = weights(x1, x2)
        zero = tf.zeros_like(y)
        t1, t2 = (zero if t is None else tf.broadcast_to(t, tf.shape(y)) for t in tangents)
        half = (t1 + t2) * tf.constant(0.5, y.dtype)
        return tf.where(nan, zero, tf.where(wins, t1, tf.where(tie, half, t2)))

    ad = _recorded.recorded(name, fn, vjp, jvp)

    def op(x1, x2):
        return ad(x1, x2) if x1.dtype.is_floating else fn(x1, x2)
    return op


def _pow_derivatives(z, x1, x2):
    """d/dx1 = x2 x1^(x2 - 1), and 0 where x2 == 0 (x ** 0 is constant; 0 * inf would be NaN at x1 = 0);
    d/dx2 = x1^x2 log(x1), NaN for x1 < 0 (as on torch and JAX; TensorFlow gives 0), 0 at x1 = 0, x2 >= 0."""
    zero = tf.zeros_like(z)
    d1 = tf.where(tf.equal(x2, tf.zeros_like(x2)), zero, x2 * tf.pow(x1, x2 - tf.ones_like(x2)))
    x2_real = tf.math.real(x2) if x2.dtype.is_complex else x2
    at_zero = tf.equal(x1, tf.zeros_like(x1)) & (x2_real >= 0)
    d2 = tf.where(at_zero, zero, z * tf.math.log(x1))
    return d1, d2


def _pow_vjp(g, z, x1, x2):
    d1, d2 = _pow_derivatives(z, x1, x2)
    return _unbroadcast(g * tf.math.conj(d1), x1), _unbroadcast(g * tf.math.conj(d2), x2)


def _pow_jvp(tangents, z, x1, x2):
    """Each input's term selected where its tangent is zero, never multiplied out: the other input's
    derivative (NaN at a negative base, inf at 0 ** 0.5) must not leak into a column it is not in, as in
    reverse mode, where each input gets its own cotangent."""
    out = tf.zeros_like(z)
    for t, d in zip(tangents, _pow_derivatives(z, x1, x2)):
        if t is not None:
            t = tf.broadcast_to(t, tf.shape(z))
            out = out + tf.where(tf.equal(t, tf.zeros_like(t)), tf.zeros_like(z), d * t)
    return out


_pow_ad = _recorded.recorded("pow", tf.pow, _pow_vjp, _pow_jvp)


def _pow(x1, x2):
    if x1.dtype.is_floating or x1.dtype.is_complex:
        return _pow_ad(x1, x2)
    if not x1.dtype.is_unsigned:
        return tf.pow(x1, x2)
    # no unsigned Pow kernel: square and multiply, wrapping around as NumPy's does
    result, base, exponent = tf.ones_like(x1), x1, x2
    one = tf.ones((), x1.dtype)
    for _ in range(x1.dtype.size * 8):
        result = tf.where(tf.bitwise.bitwise_and(exponent, one) == one, result * base, result)
        base, exponent = base * base, tf.bitwise.right_shift(exponent, one)
    return result


def pow(x1, x2, /):  # noqa: A001
    if isinstance(x2, _SCALARS) and not isinstance(x1, _SCALARS):  # x ** 2, x ** 0.5: a constant exponent
        x1 = _tensor(x1)
        x1 = _tensor(x1, _weak(x2, x1.dtype))
        if x2 == 0:  # x ** 0 is 1 for every x, NaN included, with derivative 0 (TensorFlow's: NaN at x = 0)
            return tf.ones_like(x1)
        if x1.dtype.is_unsigned:
            return _pow(x1, _scalar(x2, x1.dtype))
        return tf.pow(x1, _scalar(x2, x1.dtype))
    return _pow(*_promote(x1, x2))


maximum = _binary(_extremum(tf.maximum, tf.greater, "maximum"), "maximum")
minimum = _binary(_extremum(tf.minimum, tf.less, "minimum"), "minimum")
atan2 = _binary(tf.math.atan2, "atan2")
floor_divide = _binary(tf.math.floordiv, "floor_divide")


def _remainder_value(x1, x2):
    """``floormod`` with a zero result signed as the divisor (``remainder(0., -1.)`` is -0.0, as the standard
    and NumPy say; TensorFlow's gives +0.0)."""
    r = tf.math.floormod(x1, x2)
    zero = tf.zeros_like(r)
    return tf.where(tf.equal(r, zero), tf.where(signbit(x2) & tf.ones_like(r, tf.bool), -zero, zero), r)


def _remainder_jvp(tangents, r, x1, x2):
    t1, t2 = tangents
    out = tf.zeros_like(r) if t1 is None else tf.broadcast_to(t1, tf.shape(r))
    return out if t2 is None else out - t2 * tf.math.floordiv(x1, x2)


# The zero's sign is chosen by a select no tape sees: the derivative stays TensorFlow's (and the tape's)
# at exact multiples too: 1 for x1, -floor(x1 / x2) for x2, in both modes.
_remainder_ad = _recorded.recorded(
    "remainder", _remainder_value,
    lambda g, r, x1, x2: (_unbroadcast(g, x1), _unbroadcast(-g * tf.math.floordiv(x1, x2), x2)), _remainder_jvp)
remainder = _binary(lambda x1, x2: _remainder_ad(x1, x2) if x1.dtype.is_floating else tf.math.floormod(x1, x2),
                    "remainder")
equal, not_equal = _binary(tf.equal, "equal"), _binary(tf.not_equal, "not_equal")
less, less_equal = _binary(tf.less, "less"), _binary(tf.less_equal, "less_equal")
greater, greater_equal = _binary(tf.greater, "greater"), _binary(tf.greater_equal, "greater_equal")
logical_and, logical_or = _binary(tf.logical_and, "logical_and"), _binary(tf.logical_or, "logical_or")
logical_xor = _binary(tf.math.logical_xor, "logical_xor")
def _hypot(x1, x2):
    """sqrt(x1^2 + x2^2) without overflow (1e308 stays 1e308): both scaled by the larger magnitude, held
    constant for the derivative (any constant scale gives the same value, so every mode's derivative is
    x / hypot, ties included); +inf where either is infinite even beside a NaN, NaN where either is NaN."""
    if not x1.dtype.is_floating:
        return tf.sqrt(x1 * x1 + x2 * x2)
    a, b = tf.abs(x1), tf.abs(x2)
    scale = tf.stop_gradient(tf.maximum(a, b))
    scale = tf.where(tf.equal(scale, 0) | ~tf.math.is_finite(scale), tf.ones_like(scale), scale)
    y = scale * tf.sqrt((x1 / scale) ** 2 + (x2 / scale) ** 2)
    y = tf.where(tf.math.is_nan(a) | tf.math.is_nan(b), tf.constant(math.nan, y.dtype), y)
    return tf.where(tf.math.is_inf(a) | tf.math.is_inf(b), tf.constant(math.inf, y.dtype), y)


hypot = _binary(_hypot, "hypot")
copysign = _binary(lambda a, b: tf.where(signbit(b), -tf.abs(a), tf.abs(a)), "copysign")


def _bitwise(fn, logical, name):
    def op(x1, x2, /):
        x1, x2 = _promote(x1, x2)
        if x1.dtype.is_bool and logical is not None:
            return logical(x1, x2)
        if not x1.dtype.is_integer:
            raise TypeError(f"{name} takes integer or boolean arrays; got dtype {x1.dtype.name}")
        return fn(x1, x2)
    op.__name__ = op.__qualname__ = name
    return op


bitwise_and = _bitwise(tf.bitwise.bitwise_and, tf.logical_and, "bitwise_and")
bitwise_or = _bitwise(tf.bitwise.bitwise_or, tf.logical_or, "bitwise_or")
bitwise_xor = _bitwise(tf.bitwise.bitwise_xor, tf.math.logical_xor, "bitwise_xor")


def _left_shift(x1, x2):
    """x1 << x2 with the standard's (Python's) value for shifts of the bit width or more: 0 (TensorFlow's
    kernel leaves those implementation-defined; it clamps the shift)."""
    wide = x2 >= x1.dtype.size * 8
    return tf.where(wide, tf.zeros_like(x1), tf.bitwise.left_shift(x1, tf.where(wide, tf.zeros_like(x2), x2)))


def _right_shift(x1, x2):
    """x1 >> x2 with Python's value for shifts of the bit width or more: -1 for negative x1, else 0."""
    wide = x2 >= x1.dtype.size * 8
    fill = tf.where(x1 < 0, -tf.ones_like(x1), tf.zeros_like(x1)) if x1.dtype.is_unsigned is False else \
        tf.zeros_like(x1)
    return tf.where(wide, fill, tf.bitwise.right_shift(x1, tf.where(wide, tf.zeros_like(x2), x2)))


bitwise_left_shift = _bitwise(_left_shift, None, "bitwise_left_shift")
bitwise_right_shift = _bitwise(_right_shift, None, "bitwise_right_shift")


def bitwise_invert(x, /):
    x = _tensor(x)
    if x.dtype.is_bool:
        return tf.logical_not(x)
    if not x.dtype.is_integer:
        raise TypeError(f"bitwise_invert takes integer or boolean arrays; got dtype {x.dtype.name}")
    return tf.bitwise.invert(x)


def nextafter(x1, x2, /):
    """The next representable value after ``x1`` towards ``x2`` (read and written as bits)."""
    x1, x2 = _promote(x1, x2)
    if x1.dtype not in (tf.float32, tf.float64):
        raise TypeError(f"nextafter takes float32 or float64 arrays; got dtype {x1.dtype.name}")
    x1, x2 = tf.broadcast_to(x1, tf.broadcast_static_shape(x1.shape, x2.shape)), \
        tf.broadcast_to(x2, tf.broadcast_static_shape(x1.shape, x2.shape))
    ints = _SAME_WIDTH_INT[x1.dtype]
    bits = tf.bitcast(x1, ints)
    one = tf.ones((), ints)
    away_from_zero = (x2 > x1) == (x1 > 0)
    stepped = tf.bitcast(tf.where(away_from_zero, bits + one, bits - one), x1.dtype)
    tiny = tf.bitcast(one, x1.dtype)  # the smallest subnormal
    from_zero = tf.where(x2 > x1, tiny, -tiny)
    out = tf.where(x1 == 0, from_zero, stepped)
    out = tf.where(x1 == x2, x2, out)
    return tf.where(tf.math.is_nan(x1) | tf.math.is_nan(x2), tf.constant(math.nan, x1.dtype), out)


def logaddexp(x1, x2, /):
    """``log(exp(x1) + exp(x2))`` as ``m + log1p(expm1(hi - m) + exp(lo - m))`` with the shift ``m`` the larger
    value held constant: the value is ``hi + log1p(exp(lo - hi))`` (``expm1(0)`` is exactly 0), and every
    derivative, in both modes and to any order, is that of ``log(exp(x1) + exp(x2))``: 1/2 each at a tie
    (``max + log1p(exp(-|x1 - x2|))`` differentiated gave 1 and 0 there: TensorFlow's maximum and abs).
    Infinities: the shift is 0, so ``(inf, inf)`` is inf and ``(-inf, -inf)`` is -inf."""
    x1, x2 = _promote(x1, x2)
    first = x1 >= x2
    hi, lo = tf.where(first, x1, x2), tf.where(first, x2, x1)
    m = tf.stop_gradient(hi)
    m = tf.where(tf.math.is_inf(m), tf.zeros_like(m), m)
    return m + tf.math.log1p(tf.math.expm1(hi - m) + tf.exp(lo - m))


def where(condition, x1, x2, /):
    x1, x2 = _promote(x1, x2)
    return tf.where(_tensor(condition, tf.bool), x1, x2)


def clip(x, /, min=None, max=None):  # noqa: A002
    x = _tensor(x)
    if min is not None:  # the bounds take x's dtype: clip never changes it
        x = tf.maximum(x, _scalar(min, x.dtype) if isinstance(min, _SCALARS) else _tensor(min, x.dtype))
    if max is not None:
        x = tf.minimum(x, _scalar(max, x.dtype) if isinstance(max, _SCALARS) else _tensor(max, x.dtype))
    return x


def astype(x, dtype, /, *, copy=True, device=None):
    x, dtype = _tensor(x), tf.as_dtype(dtype)
    with _on(device):
        return x if x.dtype == dtype and not copy and device is None else tf.cast(x, dtype)


# -------------------------------------------------------------------- reductions

def _reduction(fn, name, accumulate=False, empty=None):
    def op(x, /, *, axis=None, keepdims=False, dtype=None):
        x = _tensor(x)
        x = _tensor(x, _dt(dtype) or (_accumulator(x.dtype) if accumulate else None))
        axes = _axes(axis, x.shape.rank)
        if empty is not None and builtins.any(x.shape[a] == 0 for a in axes):
            raise ValueError(f"{name} of an empty array (shape {tuple(x.shape)}, axis={axis}): {empty}")
        return fn(x, axis=axes, keepdims=keepdims)
    op.__name__ = op.__qualname__ = name
    return op


sum = _reduction(tf.reduce_sum, "sum", accumulate=True)  # noqa: A001
prod = _reduction(tf.reduce_prod, "prod", accumulate=True)
# an empty max/min has no value (TensorFlow says -inf / +inf): ValueError, as NumPy and JAX raise
max = _reduction(tf.reduce_max, "max", empty="it has no maximum")  # noqa: A001
min = _reduction(tf.reduce_min, "min", empty="it has no minimum")  # noqa: A001
logsumexp = _reduction(tf.reduce_logsumexp, "logsumexp")


def mean(x, /, *, axis=None, keepdims=False):
    x = _tensor(x)
    return tf.reduce_mean(x, axis=_axes(axis, x.shape.rank), keepdims=keepdims)


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    x = _tensor(x)
    axes = _axes(axis, x.shape.rank)
    centred = x - tf.reduce_mean(x, axis=axes, keepdims=True)
    squares = tf.math.real(centred * tf.math.conj(centred)) if x.dtype.is_complex else centred * centred
    dof = tf.cast(_count(x, axes), squares.dtype) - tf.constant(correction, squares.dtype)
    return tf.reduce_sum(squares, axis=axes, keepdims=keepdims) / dof


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    return tf.sqrt(var(x, axis=axis, correction=correction, keepdims=keepdims))


def _cumulative(fn, x, axis, dtype, include_initial, initial):
    x = _tensor(x)
    x = _tensor(x, _dt(dtype) or _accumulator(x.dtype))
    if axis is None:
        if x.shape.rank != 1:
            raise ValueError("cumulative functions need axis= for arrays that are not 1-D")
        axis = 0
    a = _axes(axis, x.shape.rank)[0]
    out = fn(x, axis=a)
    if include_initial:
        first = tf.fill(tf.tensor_scatter_nd_update(tf.shape(x), [[a]], [1]), tf.constant(initial, x.dtype))
        out = tf.concat([first, out], axis=a)
    return out


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    return _cumulative(tf.cumsum, x, axis, dtype, include_initial, 0)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    return _cumulative(tf.math.cumprod, x, axis, dtype, include_initial, 1)


cumsum = cumulative_sum


def all(x, /, *, axis=None, keepdims=False):  # noqa: A001
    x = _tensor(x)
    return tf.reduce_all(tf.cast(x, tf.bool), axis=_axes(axis, x.shape.rank), keepdims=keepdims)


def any(x, /, *, axis=None, keepdims=False):  # noqa: A001
    x = _tensor(x)
    return tf.reduce_any(tf.cast(x, tf.bool), axis=_axes(axis, x.shape.rank), keepdims=keepdims)


def count_nonzero(x, /, *, axis=None, keepdims=False):
    x = _tensor(x)
    return tf.math.count_nonzero(x, axis=_axes(axis, x.shape.rank), keepdims=keepdims, dtype=tf.int64)


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None):
    x = _tensor(x)
    a = _axes(axis, x.shape.rank)[0]
    if prepend is not None or append is not None:
        def edge(v):
            v = _tensor(v, x.dtype)
            if v.shape.rank == 0:  # a scalar: one slice of x's shape along the axis
                v = tf.broadcast_to(v, tf.tensor_scatter_nd_update(tf.shape(x), [[a]], [1]))
            return v
        x = tf.concat(([edge(prepend)] if prepend is not None else []) + [x] +
                      ([edge(append)] if append is not None else []), axis=a)
    for _ in range(n):
        x = tf.gather(x, tf.range(1, tf.shape(x)[a]), axis=a) - tf.gather(x, tf.range(tf.shape(x)[a] - 1), axis=a)
    return x



# -------------------------------------------------------------------- indexing

def _is_advanced(i):
    if isinstance(i, (builtins.bool, np.bool_)):  # a boolean scalar: a new axis, indexed (NumPy's rule)
        return True
    if isinstance(i, (list, np.ndarray)):
        return not (isinstance(i, np.ndarray) and i.ndim == 0 and i.dtype.kind in "iu")
    if isinstance(i, (tf.Tensor, tf.Variable)):
        return i.shape.rank != 0 or i.dtype == tf.bool
    return False


_STRIDED_SLICE_RANK = 8  # TensorFlow's slicing handles up to 8 dimensions (the standard allows 64)


def _basic_by_gather(x, items):
    """Basic indexing (integers, slices, ``...``, ``None``) one axis at a time with tf.gather: for arrays of
    more dimensions than TensorFlow's slicing takes."""
    items = list(items)
    consumed = builtins.sum(1 for i in items if i is not None and i is not Ellipsis)
    if consumed > x.shape.rank:
        raise IndexError(f"too many indices for an array of dimension {x.shape.rank}")
    ellipsis = [k for k, i in enumerate(items) if i is Ellipsis]
    if len(ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if ellipsis:
        items[ellipsis[0]:ellipsis[0] + 1] = [slice(None)] * (x.shape.rank - consumed)
    items += [slice(None)] * (x.shape.rank - builtins.sum(1 for i in items if i is not None))
    axis = 0
    for i in items:
        if i is None:
            x = tf.expand_dims(x, axis)
            axis += 1
        elif isinstance(i, slice):
            if i != slice(None):
                x = tf.gather(x, tf.range(*i.indices(x.shape[axis]), dtype=tf.int64), axis=axis)
            axis += 1
        else:
            size = x.shape[axis]
            k = int(i) if not isinstance(i, (tf.Tensor, tf.Variable)) else i
            if isinstance(k, int) and not -size <= k < size:
                raise IndexError(f"index {k} is out of bounds for axis {axis} with size {size}")
            x = tf.gather(x, k % size if isinstance(k, int) else tf.where(k < 0, k + size, k), axis=axis)
    return x


def _int64(i):
    """A basic index TensorFlow's slicing takes: 0-d integer tensors (Arrays too, and the bounds of a
    slice: ``x[a:b]`` with 0-d int8 arrays) in int64."""
    if isinstance(i, slice):
        return slice(_int64(i.start), _int64(i.stop), _int64(i.step))
    if isinstance(i, TensorHolder):
        i = i._t
    return tf.cast(i, tf.int64) if isinstance(i, (tf.Tensor, tf.Variable)) and i.dtype != tf.int64 else i


def getitem(x, index, /):
    """``x[index]`` with NumPy semantics: basic slicing plus integer-array and boolean-mask indexing."""
    x = _tensor(x)
    items = index if isinstance(index, tuple) else (index,)
    if not builtins.any(_is_advanced(i) for i in items):
        # 0-d integer tensors: TensorFlow's slicing takes int32/int64 only, and one dtype (it stacks them)
        if isinstance(index, tuple):
            index = tuple(_int64(i) for i in index)
        else:
            index = _int64(index)
        if x.shape.rank is not None and x.shape.rank > _STRIDED_SLICE_RANK:
            return _basic_by_gather(x, index if isinstance(index, tuple) else (index,))
        return x[index]
    return _advanced_getitem(x, items)


class _BooleanScalar:
    """A 0-d boolean index: a new axis of length 1, indexed by the integer array ``[0]`` where it is True
    and ``[]`` where False -- NumPy's rule (``x[True]`` has shape ``(1, *x.shape)``, ``x[False]``
    ``(0, *x.shape)``), an advanced index that broadcasts with the others."""

    __slots__ = ("indices",)

    def __init__(self, value):
        if isinstance(value, (builtins.bool, np.bool_)):
            self.indices = tf.zeros([1 if value else 0], tf.int64)
        else:  # a boolean tensor (its value may be unknown inside tf.function): 1 or 0 positions
            self.indices = tf.where(tf.reshape(value, [1]))[:, 0]


def _new_axis(i):
    return i is None or type(i) is _BooleanScalar


def _advanced_getitem(x, items):
    out = []
    for i in items:  # boolean masks become one integer index per masked dimension
        if isinstance(i, (builtins.bool, np.bool_)):
            out.append(_BooleanScalar(i))
            continue
        if isinstance(i, (list, np.ndarray, tf.Variable)):
            i = _tensor(i)
        if isinstance(i, tf.Tensor) and i.dtype == tf.bool:
            if i.shape.rank == 0:
                out.append(_BooleanScalar(i))
            else:
                out.extend(tf.unstack(tf.where(i), axis=1, num=i.shape.rank))
        else:
            out.append(i)
    if builtins.sum(1 for i in out if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = builtins.sum(1 for i in out if not _new_axis(i) and i is not Ellipsis)
    if consumed > x.shape.rank:
        raise IndexError(f"too many indices for an array of dimension {x.shape.rank}")
    if builtins.any(i is Ellipsis for i in out):
        k = next(j for j, i in enumerate(out) if i is Ellipsis)
        out[k:k + 1] = [slice(None)] * (x.shape.rank - consumed)
    if builtins.any(_new_axis(i) for i in out):  # new axes first, then index them with ':' (or [0] / [])
        x = x[tuple(None if _new_axis(i) else slice(None) for i in out)]
        out = [slice(None) if i is None else i.indices if type(i) is _BooleanScalar else i for i in out]
    out += [slice(None)] * (x.shape.rank - len(out))
    y = x[tuple(i if isinstance(i, slice) else slice(None) for i in out)]
    advanced = [k for k, i in enumerate(out) if not isinstance(i, slice)]
    indices = []
    for k in advanced:
        i = tf.cast(_tensor(out[k]), tf.int64)
        size = tf.cast(tf.shape(y)[k], tf.int64)
        indices.append(tf.where(i < 0, i + size, i))
    if len(advanced) == 1:  # one index array: tf.gather puts its dimensions where the axis was, as NumPy does
        return tf.gather(y, indices[0], axis=advanced[0])
    indices = broadcast_arrays(*indices)
    rest = [k for k in range(y.shape.rank) if k not in advanced]
    moved = tf.transpose(y, advanced + rest)
    # one linear index into the advanced dimensions, then tf.gather (gather_nd's derivative comes back
    # as IndexedSlices that ForwardAccumulator inside pfor cannot take)
    dims = tf.shape(moved, out_type=tf.int64)
    linear = indices[0]
    for k in range(1, len(advanced)):
        linear = linear * dims[k] + indices[k]
    flat = tf.reshape(moved, tf.concat([[-1], dims[len(advanced):]], 0))
    result = tf.gather(flat, linear, axis=0)
    if advanced == list(range(advanced[0], advanced[-1] + 1)) and advanced[0] > 0:
        # adjacent advanced indices: NumPy puts the indexed dimensions where they were
        nb, before = indices[0].shape.rank, advanced[0]
        order = list(range(nb, nb + before)) + list(range(nb)) + list(range(nb + before, result.shape.rank))
        result = tf.transpose(result, order)
    return result


def _index(indices, size):
    i = _tensor(indices)
    if not i.dtype.is_integer:
        raise IndexError(f"indices must be integers; got dtype {i.dtype.name}")
    return tf.where(i < 0, i + tf.cast(size, i.dtype), i)


def take(x, indices, /, *, axis=None):
    x = _tensor(x)
    if axis is None:
        if x.shape.rank != 1:
            raise ValueError("take: axis is required for arrays with more than one dimension")
        axis = 0
    a = _axes(axis, x.shape.rank)[0]
    return tf.gather(x, _index(indices, tf.shape(x)[a]), axis=a)


def take_along_axis(x, indices, /, *, axis=-1):
    x, idx = _tensor(x), _tensor(indices)
    a = _axes(axis, x.shape.rank)[0]
    xm, im = moveaxis(x, a, -1), moveaxis(idx, a, -1)
    batch = tf.broadcast_static_shape(xm.shape[:-1], im.shape[:-1])
    xm = tf.broadcast_to(xm, batch.concatenate(xm.shape[-1:]))
    im = tf.broadcast_to(_index(im, tf.shape(xm)[-1]), batch.concatenate(im.shape[-1:]))
    return moveaxis(tf.gather(xm, im, axis=-1, batch_dims=batch.rank), -1, a)


# -------------------------------------------------------------------- sorting and searching

def sort(x, /, *, axis=-1, descending=False, stable=True):
    return tf.sort(_tensor(x), axis=axis, direction="DESCENDING" if descending else "ASCENDING")


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    # TensorFlow sorts through top_k, which keeps equal elements in index order in both directions
    return tf.cast(tf.argsort(_tensor(x), axis=axis, direction="DESCENDING" if descending else "ASCENDING",
                              stable=True), tf.int64)


def _arg(fn, x, axis, keepdims):
    x = _tensor(x)
    if axis is None:
        out = fn(tf.reshape(x, [-1]), axis=0, output_type=tf.int64)
        return tf.reshape(out, [1] * x.shape.rank) if keepdims else out
    out = fn(x, axis=axis, output_type=tf.int64)
    return tf.expand_dims(out, axis) if keepdims else out


def argmax(x, /, *, axis=None, keepdims=False):
    return _arg(tf.argmax, x, axis, keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    return _arg(tf.argmin, x, axis, keepdims)


def nonzero(x, /):
    x = _tensor(x)
    return tuple(tf.unstack(tf.where(tf.cast(x, tf.bool)), axis=1, num=x.shape.rank))


def searchsorted(x1, x2, /, *, side="left", sorter=None):
    x1, x2 = _promote(x1, x2)
    if sorter is not None:
        x1 = tf.gather(x1, sorter)
    flat = tf.reshape(x2, [1, -1])
    return tf.reshape(tf.searchsorted(x1[None, :], flat, side=side, out_type=tf.int64), tf.shape(x2))


# -------------------------------------------------------------------- sets

class UniqueAllResult(NamedTuple):
    values: tf.Tensor
    indices: tf.Tensor
    inverse_indices: tf.Tensor
    counts: tf.Tensor


class UniqueCountsResult(NamedTuple):
    values: tf.Tensor
    counts: tf.Tensor


class UniqueInverseResult(NamedTuple):
    values: tf.Tensor
    inverse_indices: tf.Tensor


def _unique(x):
    """Sorted unique values of the flattened ``x`` (every NaN its own value, as the standard says), the
    index of each one's first occurrence, each element's group, and the counts."""
    x = _tensor(x)
    flat = tf.reshape(x, [-1])
    if x.dtype.is_complex:  # TensorFlow sorts no complex values: by real part, then imaginary part
        by_imag = tf.argsort(tf.math.imag(flat), stable=True)
        order = tf.gather(by_imag, tf.argsort(tf.gather(tf.math.real(flat), by_imag), stable=True))
    else:
        order = tf.argsort(flat, stable=True) if not flat.dtype.is_bool else tf.argsort(tf.cast(flat, tf.int8),
                                                                                     stable=True)
    ordered = tf.gather(flat, order)
    new = tf.concat([tf.ones([1], tf.bool)[:tf.size(flat)], ordered[1:] != ordered[:-1]], 0)
    group = tf.cumsum(tf.cast(new, tf.int64)) - 1
    n = tf.reduce_sum(tf.cast(new, tf.int64))
    values = tf.boolean_mask(ordered, new)
    first = tf.math.unsorted_segment_min(tf.cast(order, tf.int64), group, n)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(group), group, n)
    inverse = tf.reshape(tf.scatter_nd(tf.cast(order, tf.int64)[:, None], group, tf.shape(flat, tf.int64)),
                         tf.shape(x))
    return values, first, inverse, counts


def unique_all(x, /):
    return UniqueAllResult(*_unique(x))


def unique_counts(x, /):
    values, _, _, counts = _unique(x)
    return UniqueCountsResult(values, counts)


def unique_inverse(x, /):
    values, _, inverse, _ = _unique(x)
    return UniqueInverseResult(values, inverse)


def unique_values(x, /):
    return _unique(x)[0]


# -------------------------------------------------------------------- data types

_KINDS = {
    "bool": lambda d: d.is_bool,
    "signed integer": lambda d: d.is_integer and not d.is_unsigned,
    "unsigned integer": lambda d: d.is_integer and d.is_unsigned,
    "integral": lambda d: d.is_integer,
    "real floating": lambda d: d.is_floating,
    "complex floating": lambda d: d.is_complex,
    "numeric": lambda d: (d.is_integer or d.is_floating or d.is_complex) and not d.is_bool,
}


def isdtype(dtype, kind):
    dtype = tf.as_dtype(dtype)
    if isinstance(kind, tuple):
        return builtins.any(isdtype(dtype, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"unknown dtype kind {kind!r}; expected one of {sorted(_KINDS)}")
        return _KINDS[kind](dtype)
    return dtype == tf.as_dtype(kind)


def can_cast(from_, to, /):
    from_ = from_.dtype if isinstance(from_, (tf.Tensor, tf.Variable)) else tf.as_dtype(from_)
    return builtins.bool(np.can_cast(from_.as_numpy_dtype, tf.as_dtype(to).as_numpy_dtype))


class finfo_object(NamedTuple):
    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: tf.DType


class iinfo_object(NamedTuple):
    bits: int
    max: int
    min: int
    dtype: tf.DType


def _dtype_of(x):
    return x.dtype if isinstance(x, (tf.Tensor, tf.Variable)) else tf.as_dtype(x)


def finfo(type, /):  # noqa: A002
    """The standard's finfo (an array or a dtype; Python floats; complex dtypes give their real part's)."""
    dtype = _dtype_of(type)
    real = tf.as_dtype(dtype).real_dtype
    try:
        info = np.finfo(real.as_numpy_dtype)
    except ValueError:  # bfloat16
        import ml_dtypes
        info = ml_dtypes.finfo(real.as_numpy_dtype)
    return finfo_object(int(info.bits), float(info.eps), float(info.max), float(info.min),
                        float(info.smallest_normal), real)  # the standard: a complex dtype's real dtype


def iinfo(type, /):  # noqa: A002
    dtype = _dtype_of(type)
    info = np.iinfo(dtype.as_numpy_dtype)
    return iinfo_object(int(info.bits), int(info.max), int(info.min), dtype)


class _Info:
    """What ``__array_namespace_info__()`` returns: the namespace's capabilities, devices and dtypes."""

    def capabilities(self):
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self):
        return "cpu"

    def devices(self):
        return ["cpu"] + [f"cuda:{i}" for i in range(_gpu_count())]

    def default_dtypes(self, *, device=None):
        return {"real floating": tf.float64, "complex floating": tf.complex128, "integral": tf.int64,
                "indexing": tf.int64}

    def dtypes(self, *, device=None, kind=None):
        every = {"bool": tf.bool, "int8": tf.int8, "int16": tf.int16, "int32": tf.int32, "int64": tf.int64,
                 "uint8": tf.uint8, "uint16": tf.uint16, "uint32": tf.uint32, "uint64": tf.uint64,
                 "float32": tf.float32, "float64": tf.float64, "complex64": tf.complex64,
                 "complex128": tf.complex128}
        if kind is None:
            return every
        return {k: d for k, d in every.items() if isdtype(d, kind)}


def __array_namespace_info__():
    return _Info()


def size(x, /):
    """Number of elements (tf.Tensor has no ``.size``)."""
    return x.shape.num_elements()


# -------------------------------------------------------------------- linear algebra beyond the standard

def dot(x1, x2, /):
    """NumPy's dot: matmul for 1-D and 2-D operands, a sum over the last/second-to-last axes otherwise."""
    x1, x2 = _promote(x1, x2)
    if x1.shape.rank == 0 or x2.shape.rank == 0:
        return x1 * x2
    if x2.shape.rank <= 2:
        return matmul(x1, x2)
    return tensordot(x1, x2, axes=([x1.shape.rank - 1], [x2.shape.rank - 2]))


def einsum(subscripts, /, *operands):
    return tf.einsum(subscripts, *_promote(*operands))


def diag(x, /, k=0):
    """NumPy's diag: the k-th diagonal of a matrix, or a square matrix with a vector on its k-th diagonal."""
    x = _tensor(x)
    return tf.linalg.diag_part(x, k=k) if x.shape.rank == 2 else tf.linalg.diag(x, k=k)
