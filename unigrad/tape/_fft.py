"""``fft`` of the tape's namespace: the Array API FFT extension (also what ``np.fft`` does on traced
values). Every transform is a sequence of one-dimensional transforms in NumPy's own order, each a
linear primitive (``_primitives.fft_c2c``, ``rfft``, ``irfft``) whose VJP is its transpose."""

from __future__ import annotations

import numpy as np

from . import _functions as xp
from . import _primitives as P
from ..backend import fft_norm
from ._tracer import _ndim, _shape

_norm = fft_norm


def _complex(x):
    x = xp._arr(x)
    kind = np.result_type(x.dtype if hasattr(x, "dtype") else x).kind
    if kind == "c":
        return x
    want = np.complex64 if np.result_type(x.dtype) == np.float32 else np.complex128
    return xp.astype(x, want)


def _fit(x, axis, n):
    """x cropped or zero-padded along ``axis`` to length n (NumPy's rule for the ``n`` argument)."""
    size = _shape(x)[axis]
    if n == size:
        return x
    if n < 1:
        raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
    if n < size:
        return xp.getitem(x, (slice(None),) * (_ndim(x) + axis) + (slice(0, n),))
    return P._zero_pad(x, axis, n)


def _c2c(x, n, axis, norm, inverse, fname):
    x = _complex(x)
    a = xp._axis1(axis, _ndim(x))
    x = _fit(x, a, _shape(x)[a] if n is None else n)
    return P.fft_c2c(x, axis=a, inverse=inverse, norm=_norm(norm, fname))


def fft(x, /, *, n=None, axis=-1, norm="backward"):
    return _c2c(x, n, axis, norm, False, "fft")


def ifft(x, /, *, n=None, axis=-1, norm="backward"):
    return _c2c(x, n, axis, norm, True, "ifft")


def rfft(x, /, *, n=None, axis=-1, norm="backward"):
    x = xp._arr(x)
    if np.result_type(x.dtype).kind == "c":
        raise TypeError("fft.rfft: the input must be real")
    a = xp._axis1(axis, _ndim(x))
    x = _fit(x, a, _shape(x)[a] if n is None else n)
    return P.rfft(x, axis=a, norm=_norm(norm, "rfft"))


def irfft(x, /, *, n=None, axis=-1, norm="backward"):
    x = _complex(x)
    a = xp._axis1(axis, _ndim(x))
    n = 2 * (_shape(x)[a] - 1) if n is None else n
    if n < 1:
        raise ValueError(f"Invalid number of FFT data points ({n}) specified.")
    x = _fit(x, a, n // 2 + 1)
    return P.irfft(x, axis=a, n=n, norm=_norm(norm, "irfft"))


def hfft(x, /, *, n=None, axis=-1, norm="backward"):
    x = xp._arr(x)
    a = xp._axis1(axis, _ndim(x))
    n = 2 * (_shape(x)[a] - 1) if n is None else n
    return irfft(xp.conj(_complex(x)), n=n, axis=axis, norm=_norm(norm, "hfft", swap=True))


def ihfft(x, /, *, n=None, axis=-1, norm="backward"):
    return xp.conj(rfft(x, n=n, axis=axis, norm=_norm(norm, "ihfft", swap=True)))


def _nd(x, s, axes, invreal=False):
    x = xp._arr(x)
    if axes is None:
        axes = tuple(range(-len(s), 0)) if s is not None else tuple(range(_ndim(x)))
    axes = [xp._axis1(a, _ndim(x)) for a in axes]
    if s is None:
        s = [_shape(x)[a] for a in axes]
        if invreal:
            s[-1] = 2 * (_shape(x)[axes[-1]] - 1)
    s = [_shape(x)[a] if k == -1 else k for k, a in zip(s, axes)]
    if len(s) != len(axes):
        raise ValueError("Shape and axes have different lengths.")
    return x, list(s), axes


def fftn(x, /, *, s=None, axes=None, norm="backward"):
    x, s, axes = _nd(x, s, axes)
    for k in reversed(range(len(axes))):
        x = fft(x, n=s[k], axis=axes[k], norm=norm)
    return x


def ifftn(x, /, *, s=None, axes=None, norm="backward"):
    x, s, axes = _nd(x, s, axes)
    for k in reversed(range(len(axes))):
        x = ifft(x, n=s[k], axis=axes[k], norm=norm)
    return x


def rfftn(x, /, *, s=None, axes=None, norm="backward"):
    x, s, axes = _nd(x, s, axes)
    x = rfft(x, n=s[-1], axis=axes[-1], norm=norm)
    for k in range(len(axes) - 2, -1, -1):
        x = fft(x, n=s[k], axis=axes[k], norm=norm)
    return x


def irfftn(x, /, *, s=None, axes=None, norm="backward"):
    x, s, axes = _nd(x, s, axes, invreal=True)
    for k in range(len(axes) - 1):
        x = ifft(x, n=s[k], axis=axes[k], norm=norm)
    return irfft(x, n=s[-1], axis=axes[-1], norm=norm)


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    xp._device(device, "fft.fftfreq")
    out = np.fft.fftfreq(n, d)
    return out if dtype is None else out.astype(dtype)


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    xp._device(device, "fft.rfftfreq")
    out = np.fft.rfftfreq(n, d)
    return out if dtype is None else out.astype(dtype)


def _shift(x, axes, sign):
    x = xp._arr(x)
    axes = tuple(range(_ndim(x))) if axes is None else ((axes,) if isinstance(axes, (int, np.integer)) else axes)
    shifts = tuple(sign * (_shape(x)[a] // 2) for a in axes)
    return xp.roll(x, shifts, axis=axes) if axes else x


def fftshift(x, /, *, axes=None):
    return _shift(x, axes, 1)


def ifftshift(x, /, *, axes=None):
    return _shift(x, axes, -1)
