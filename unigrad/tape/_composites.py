"""Composite functions of the tape's namespace, written with its primitives (NumPy spellings included)."""

from __future__ import annotations

from . import _namespace as xp

__all__ = ["trace", "diag", "diagonal"]


def diagonal(x, /, *, offset=0):
    from ._linalg import diagonal as _diagonal
    return _diagonal(x, offset=offset)


def trace(x, /, *, offset=0):
    from ._linalg import trace as _trace
    return _trace(x, offset=offset)


def diag(x, /, k=0):
    """NumPy's diag: the k-th diagonal of a matrix, or a matrix with a vector on its k-th diagonal."""
    x = xp._arr(x)
    if xp._ndim(x) == 2:
        return diagonal(x, offset=k)
    n = xp._shape(x)[0] + abs(k)
    rows = xp.np.arange(xp._shape(x)[0]) + max(0, -k)
    cols = rows + k
    return xp.P.scatter_add(x, index=(rows, cols), shape=(n, n), nb=0, advanced=True)
