"""The torch backend's Array API namespace: ``array_api_compat.torch`` with the few functions whose
torch behaviour differs from the one unigrad promises on every backend (docs/conventions.md).

* ``max``, ``min``, ``argmax``, ``argmin`` of an empty reduction raise ValueError, as NumPy and JAX
  (torch raises RuntimeError or IndexError).
* ``median`` is the true median, the mean of the two middle values for an even count, as NumPy and
  JAX (``torch.median`` returns the lower of the two).
* ``linalg.cholesky``, ``linalg.eigh`` and ``linalg.eigvalsh`` read the Hermitian part
  ``(x + x^H) / 2``, as the tape, JAX and TensorFlow (see ``_linalg``).
* ``take`` and ``take_along_axis`` accept an index array that is not a tensor (a NumPy array, a
  list), converted to a tensor on ``x``'s device: NumPy indices closed over by ``f`` work as on the
  other backends (array-api-compat passes them to ``torch.where``, a TypeError).

Every other name is ``array_api_compat.torch``'s own (module ``__getattr__``).
"""

from __future__ import annotations

import math

import array_api_compat.torch as _compat
import numpy as np
import torch

from . import _linalg as linalg
from ._delegate import delegate

__all__ = ["max", "min", "argmax", "argmin", "median", "take", "take_along_axis", "linalg"]


__getattr__, __dir__ = delegate(__name__, _compat, __all__)


def _axes(x, axis):
    """The reduced axes of ``x`` as non-negative ints (all for None)."""
    if axis is None:
        return tuple(range(x.ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(a % x.ndim if x.ndim else a for a in axes)


def _check_not_empty(x, axis, fname):
    if x.numel() == 0 and (x.ndim == 0 or any(x.shape[a] == 0 for a in _axes(x, axis))):
        raise ValueError(f"{fname}: zero-size reduction over axis {axis} of an array of shape {tuple(x.shape)}: "
                         f"{fname} of an empty set has no value")


def max(x, /, *, axis=None, keepdims=False):  # noqa: A001 (the Array API name)
    _check_not_empty(x, axis, "max")
    return _compat.max(x, axis=axis, keepdims=keepdims)


def min(x, /, *, axis=None, keepdims=False):  # noqa: A001
    _check_not_empty(x, axis, "min")
    return _compat.min(x, axis=axis, keepdims=keepdims)


def argmax(x, /, *, axis=None, keepdims=False):
    _check_not_empty(x, axis, "argmax")
    return _compat.argmax(x, axis=axis, keepdims=keepdims)


def argmin(x, /, *, axis=None, keepdims=False):
    _check_not_empty(x, axis, "argmin")
    return _compat.argmin(x, axis=axis, keepdims=keepdims)


def median(x, /, axis=None, *, keepdims=False):
    """The median along ``axis`` (None: all axes; a tuple: those axes together), as ``numpy.median``:
    for an even count the mean of the two middle values. Its derivative splits evenly between them
    (JAX's rule). A NaN makes the result NaN; an empty reduction is NaN, as NumPy (without its warning).
    """
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    axes = _axes(x, axis)
    rest = [d for d in range(x.ndim) if d not in axes]
    n = math.prod(x.shape[a] for a in axes)
    moved = x.permute(*rest, *axes).reshape(*(x.shape[d] for d in rest), n)
    if n == 0:
        out = torch.full(moved.shape[:-1], float("nan"), dtype=x.dtype, device=x.device)
    else:
        ordered = torch.sort(moved, dim=-1).values
        out = (ordered[..., (n - 1) // 2] + ordered[..., n // 2]) / 2
        # a NaN sorts last in torch; NumPy's median of values with a NaN is NaN
        out = torch.where(torch.isnan(ordered[..., -1]), ordered[..., -1], out)
    if keepdims:
        shape = [1 if d in axes else x.shape[d] for d in range(x.ndim)]
        out = out.reshape(shape)
    return out


def _index_tensor(indices, x, fname):
    """``indices`` as an integer tensor on ``x``'s device (a tensor is passed through unchanged).

    NumPy integer arrays of any width become int64 unless int32 (the index dtypes torch takes);
    negative strides and read-only arrays are copied.
    """
    if isinstance(indices, torch.Tensor):
        return indices
    a = np.asarray(indices)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{fname}: indices must be an array of integers; got a {type(indices).__name__} "
                        f"of dtype {a.dtype}")
    # a copy: torch takes neither negative strides nor (without a warning) read-only memory
    a = np.array(a, dtype=np.int32 if a.dtype == np.int32 else np.int64, order="C", copy=True)
    return torch.from_numpy(a).to(x.device)


def take(x, indices, /, *, axis=None):
    return _compat.take(x, _index_tensor(indices, x, "take"), axis=axis)


def take_along_axis(x, indices, /, *, axis=-1):
    return _compat.take_along_axis(x, _index_tensor(indices, x, "take_along_axis"), axis=axis)
