"""``xp.linalg`` of the ``autograd`` backend: the standard's linear-algebra extension, as far as
autograd differentiates it both ways.

autograd defines only VJPs (no JVPs) for its decompositions and solvers (``det``, ``inv``,
``solve``, ``eigh``, ``svd``, ``qr``, ``cholesky``...), and this backend declares forward mode, so
those are left out: a portable function that needs them fails with an ``AttributeError`` naming
them, and the conformance suite skips them with that reason. What is here is built from
functions autograd differentiates in both modes.
"""

from __future__ import annotations

import autograd.numpy as anp
import numpy as np

from . import _namespace as _xp

matmul, tensordot, vecdot, matrix_transpose = _xp.matmul, _xp.tensordot, _xp.vecdot, _xp.matrix_transpose


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002 (the standard's name)
    shape = anp.shape(x)
    axes = tuple(range(len(shape))) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % len(shape) for a in axes) if shape else ()
    if ord == 2:
        norm = anp.sqrt(anp.sum(anp.real(x * anp.conj(x)), axis=axes))
    elif ord == 1:
        norm = anp.sum(anp.abs(x), axis=axes)
    elif ord == float("inf"):
        norm = anp.max(anp.abs(x), axis=axes)
    elif ord == -float("inf"):
        norm = anp.min(anp.abs(x), axis=axes)
    elif ord == 0:
        norm = anp.sum(x != 0, axis=axes).astype(_xp.result_type(anp.real(x)))
    else:
        norm = anp.sum(anp.abs(x) ** ord, axis=axes) ** (1.0 / ord)
    if keepdims:
        norm = anp.reshape(norm, tuple(1 if i in axes else n for i, n in enumerate(shape)))
    return norm


def diagonal(x, /, *, offset=0):
    # by indexing: autograd's rule for diagonal handles only its default axes
    n, m = anp.shape(x)[-2:]
    rows = np.arange(max(0, -offset), max(0, min(n, m - offset)))
    return x[..., rows, rows + offset]


def trace(x, /, *, offset=0, dtype=None):
    out = anp.sum(diagonal(x, offset=offset), axis=-1)
    return out if dtype is None else _xp.astype(out, dtype)


def outer(x1, x2, /):
    return anp.reshape(x1, (-1, 1)) * anp.reshape(x2, (1, -1))


def cross(x1, x2, /, *, axis=-1):
    # broadcast first: autograd's rule for cross does not undo broadcasting
    shape = np.broadcast_shapes(anp.shape(x1), anp.shape(x2))
    return anp.cross(_xp.broadcast_to(x1, shape), _xp.broadcast_to(x2, shape), axis=axis)


def matrix_power(x, n, /):
    if n < 0:
        raise ValueError(f"linalg.matrix_power: n must be >= 0 on the autograd backend (a negative power needs "
                         f"linalg.inv, which it does not differentiate in forward mode); got n={n}")
    if n == 0:
        return anp.ones(anp.shape(x)[:-2] + (1, 1), dtype=_xp.result_type(x)) * anp.eye(anp.shape(x)[-1])
    out = x
    for _ in range(n - 1):
        out = anp.matmul(out, x)
    return out
