"""``linalg`` of the tape's Array API namespace."""

from __future__ import annotations

import numpy as np

from . import _namespace as xp
from ._core import _ndim, _shape

matmul = xp.matmul
matrix_transpose = xp.matrix_transpose
tensordot = xp.tensordot
vecdot = xp.vecdot
outer = xp.outer


def diagonal(x, /, *, offset=0):
    """The ``offset`` diagonal of the last two axes."""
    x = xp._arr(x)
    n, m = _shape(x)[-2:]
    rows = np.arange(max(0, -offset), min(n, m - offset))
    index = (slice(None),) * (_ndim(x) - 2) + (rows, rows + offset)
    return xp.P.getitem(x, index=index)


def trace(x, /, *, offset=0, dtype=None):
    return xp.sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """Vector p-norm. At 0 the 2-norm's derivative is 0 (a subgradient), not NaN."""
    x = xp._arr(x)
    a = xp.abs(x)
    if ord == 2:
        sq = xp.sum(a * a, axis=axis, keepdims=keepdims)
        zero = xp._value(sq) == 0
        safe = xp.where(zero, 1, sq)
        return xp.where(zero, 0, xp.sqrt(safe))
    if ord == float("inf"):
        return xp.max(a, axis=axis, keepdims=keepdims)
    if ord == -float("inf"):
        return xp.min(a, axis=axis, keepdims=keepdims)
    if ord == 1:
        return xp.sum(a, axis=axis, keepdims=keepdims)
    if ord == 0:
        return xp.sum(xp.astype(xp._value(a) != 0, xp._value(a).dtype), axis=axis, keepdims=keepdims)
    return xp.sum(a ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)
