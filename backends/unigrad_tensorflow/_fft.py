"""``fft`` of TensorFlow's Array API namespace: the standard's FFT extension on ``tf.signal``.

``tf.signal`` transforms the innermost axis only and knows one normalisation (none forward, ``1/n``
inverse): the axis is moved last and back, ``n`` crops or zero-pads it first (NumPy's rule), and
``norm`` rescales after. Multi-axis transforms are one-axis transforms in NumPy's order, as on the
tape (``unigrad/tape/_fft.py``), so both compute the same sums. Derivatives are TensorFlow's own
(every step is linear).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from unigrad.backend import fft_norm

from . import _shapes
from ._tensors import _COMPLEX_OF, _dt, _on, _tensor

__all__ = ["fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft", "ihfft", "fftfreq",
           "rfftfreq", "fftshift", "ifftshift"]

_norm = fft_norm


def _axis(axis, ndim, fname):
    if ndim == 0:
        raise ValueError(f"fft.{fname}: the input must have at least one dimension")
    if not -ndim <= axis < ndim:
        raise ValueError(f"fft.{fname}: axis {axis} is out of bounds for an array of dimension {ndim}")
    return axis % ndim


def _complex(x):
    x = _tensor(x)
    if x.dtype.is_complex:
        return x
    return tf.cast(x, _COMPLEX_OF.get(x.dtype, tf.complex128))


def _real(x, fname):
    x = _tensor(x)
    if x.dtype.is_complex:
        raise TypeError(f"fft.{fname}: the input must be real; got dtype {x.dtype.name}")
    return x if x.dtype in (tf.float32, tf.float64) else tf.cast(x, tf.float64)


def _fit(x, axis, n):
    """``x`` cropped or zero-padded along ``axis`` to length ``n`` (NumPy's rule for the ``n`` argument)."""
    if n < 1:
        raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
    size = x.shape[axis]
    if n == size:
        return x
    if n < size:
        return x[(slice(None),) * axis + (slice(0, n),)]
    pad = [[0, 0]] * x.shape.rank
    pad[axis] = [0, n - size]
    return tf.pad(x, pad)


def _on_last(fn, x, axis):
    """``fn`` on axis ``axis`` of ``x``: tf.signal transforms the innermost axis only."""
    last = x.shape.rank - 1
    if axis == last:
        return fn(x)
    return _shapes.moveaxis(fn(_shapes.moveaxis(x, axis, last)), last, axis)


def _scale(y, n, norm, inverse):
    """tf.signal's result (unscaled forward, ``1/n`` inverse: NumPy's "backward") rescaled for ``norm``."""
    if norm == "backward":
        return y
    if norm == "ortho":
        factor = math.sqrt(n) if inverse else 1 / math.sqrt(n)
    else:  # "forward"
        factor = n if inverse else 1 / n
    return y * tf.constant(factor, y.dtype)  # tf.cast of a Python float would round it through float32


def _c2c(x, n, axis, norm, inverse, fname):
    x = _complex(x)
    a = _axis(axis, x.shape.rank, fname)
    n = x.shape[a] if n is None else n
    x = _fit(x, a, n)
    y = _on_last(tf.signal.ifft if inverse else tf.signal.fft, x, a)
    return _scale(y, n, _norm(norm, fname), inverse)


def fft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional discrete Fourier transform along ``axis`` (complex in, complex out)."""
    return _c2c(x, n, axis, norm, False, "fft")


def ifft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of :func:`fft`."""
    return _c2c(x, n, axis, norm, True, "ifft")


def rfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The transform of a real ``x``: the ``n // 2 + 1`` non-negative frequencies."""
    x = _real(x, "rfft")
    a = _axis(axis, x.shape.rank, "rfft")
    n = x.shape[a] if n is None else n
    x = _fit(x, a, n)
    y = _on_last(lambda v: tf.signal.rfft(v, fft_length=[n]), x, a)
    return _scale(y, n, _norm(norm, "rfft"), False)


def irfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of :func:`rfft`: ``n`` real values (default ``2 * (m - 1)``) from ``m`` frequencies."""
    x = _complex(x)
    a = _axis(axis, x.shape.rank, "irfft")
    n = 2 * (x.shape[a] - 1) if n is None else n
    if n < 1:
        raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
    x = _fit(x, a, n // 2 + 1)
    y = _on_last(lambda v: tf.signal.irfft(v, fft_length=[n]), x, a)
    return _scale(y, n, _norm(norm, "irfft"), True)


def hfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The transform of a Hermitian-symmetric signal given by its first half: real output."""
    x = _complex(x)
    a = _axis(axis, x.shape.rank, "hfft")
    n = 2 * (x.shape[a] - 1) if n is None else n
    return irfft(tf.math.conj(x), n=n, axis=axis, norm=_norm(norm, "hfft", swap=True))


def ihfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of :func:`hfft`."""
    return tf.math.conj(rfft(x, n=n, axis=axis, norm=_norm(norm, "ihfft", swap=True)))


def _nd(x, s, axes, fname, invreal=False):
    x = _tensor(x)
    nd = x.shape.rank
    if axes is None:
        axes = tuple(range(-len(s), 0)) if s is not None else tuple(range(nd))
    axes = [_axis(int(a), nd, fname) for a in axes]
    if s is None:
        s = [x.shape[a] for a in axes]
        if invreal and axes:
            s[-1] = 2 * (x.shape[axes[-1]] - 1)
    if len(s) != len(axes):
        raise ValueError(f"fft.{fname}: s and axes have different lengths ({len(s)} and {len(axes)})")
    s = [x.shape[a] if k == -1 else int(k) for k, a in zip(s, axes)]
    return x, s, axes


def _c2cn(x, s, axes, norm, inverse, fname):
    """:func:`_c2c` over several axes, the last axis first (NumPy's order)."""
    x, s, axes = _nd(x, s, axes, fname)
    x = _complex(x)
    for k in reversed(range(len(axes))):
        x = _c2c(x, s[k], axes[k], norm, inverse, fname)
    return x


def fftn(x, /, *, s=None, axes=None, norm="backward"):
    """:func:`fft` over several axes."""
    return _c2cn(x, s, axes, norm, False, "fftn")


def ifftn(x, /, *, s=None, axes=None, norm="backward"):
    """:func:`ifft` over several axes."""
    return _c2cn(x, s, axes, norm, True, "ifftn")


def rfftn(x, /, *, s=None, axes=None, norm="backward"):
    """:func:`rfft` over the last of ``axes``, then :func:`fft` over the others."""
    x, s, axes = _nd(x, s, axes, "rfftn")
    if not axes:
        raise ValueError("fft.rfftn: at least one axis is needed")
    x = rfft(x, n=s[-1], axis=axes[-1], norm=norm)
    for k in range(len(axes) - 2, -1, -1):
        x = fft(x, n=s[k], axis=axes[k], norm=norm)
    return x


def irfftn(x, /, *, s=None, axes=None, norm="backward"):
    """The inverse of :func:`rfftn`."""
    x, s, axes = _nd(x, s, axes, "irfftn", invreal=True)
    if not axes:
        raise ValueError("fft.irfftn: at least one axis is needed")
    for k in range(len(axes) - 1):
        x = ifft(x, n=s[k], axis=axes[k], norm=norm)
    return irfft(x, n=s[-1], axis=axes[-1], norm=norm)


def _frequencies(values, dtype, device, fname):
    dtype = _dt(dtype) or tf.float64
    if not dtype.is_floating:
        raise TypeError(f"fft.{fname}: dtype must be a real floating-point dtype; got {dtype.name}")
    with _on(device):
        return tf.constant(values.astype(dtype.as_numpy_dtype))


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of :func:`fft` for ``n`` points ``d`` apart (float64 unless ``dtype``)."""
    return _frequencies(np.fft.fftfreq(n, d), dtype, device, "fftfreq")


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of :func:`rfft` for ``n`` points ``d`` apart."""
    return _frequencies(np.fft.rfftfreq(n, d), dtype, device, "rfftfreq")


def _shift(x, axes, sign):
    x = _tensor(x)
    if axes is None:
        axes = tuple(range(x.shape.rank))
    elif isinstance(axes, (int, np.integer)):
        axes = (int(axes),)
    axes = tuple(int(a) for a in axes)
    if not axes:
        return x
    return tf.roll(x, [sign * (x.shape[a] // 2) for a in axes], list(axes))


def fftshift(x, /, *, axes=None):
    """The zero frequency moved to the centre of ``axes`` (all by default)."""
    return _shift(x, axes, 1)


def ifftshift(x, /, *, axes=None):
    """The inverse of :func:`fftshift`."""
    return _shift(x, axes, -1)
