"""``xp.linalg`` of the ``mlx`` backend: the standard's linear-algebra extension, as far as MLX
differentiates it.

MLX's decompositions run on the CPU only (``stream=mx.cpu``). Functions built from differentiable
pieces are written here; what MLX cannot differentiate is left out, so the conformance suite skips it
naming the function.
"""

from __future__ import annotations

import mlx.core as mx

from . import _namespace as _xp

matmul, tensordot, vecdot, matrix_transpose = _xp.matmul, _xp.tensordot, _xp.vecdot, _xp.matrix_transpose


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002 (the standard's name)
    axes = _xp._axes(axis, x.ndim)
    a = mx.abs(x)
    if ord == 2:
        # derivative 0 where the norm is 0 (unigrad's rule, docs/conventions.md), not sqrt's NaN
        squares = mx.sum(a * a, axis=axes, keepdims=keepdims)
        zero = mx.stop_gradient(squares == 0)
        return mx.where(zero, mx.zeros_like(squares), mx.sqrt(mx.where(zero, mx.ones_like(squares), squares)))
    if ord == 1:
        return mx.sum(a, axis=axes, keepdims=keepdims)
    if ord == float("inf"):
        return mx.max(a, axis=axes, keepdims=keepdims)
    if ord == -float("inf"):
        return mx.min(a, axis=axes, keepdims=keepdims)
    if ord == 0:
        return mx.sum(x != 0, axis=axes, keepdims=keepdims).astype(a.dtype)
    return mx.sum(a ** ord, axis=axes, keepdims=keepdims) ** (1.0 / ord)


def diagonal(x, /, *, offset=0):
    n, m = x.shape[-2:]
    size = max(0, min(n + min(offset, 0), m - max(offset, 0)))
    if size == 0 or x.size == 0:
        # MLX 0.32's VJP of diagonal dies of a floating-point exception at zero size (the process, not an
        # error): an empty result by reshaping, whose derivatives are empty too
        return mx.reshape(mx.reshape(x, (-1,))[:0], (*x.shape[:-2], size))
    return mx.diagonal(x, offset, -2, -1)


def trace(x, /, *, offset=0, dtype=None):
    out = mx.sum(diagonal(x, offset=offset), axis=-1)
    return out if dtype is None else _xp.astype(out, dtype)


def outer(x1, x2, /):
    return mx.reshape(x1, (-1, 1)) * mx.reshape(x2, (1, -1))


def cross(x1, x2, /, *, axis=-1):
    x1, x2 = mx.broadcast_arrays(x1, x2)
    return mx.linalg.cross(x1, x2, axis=axis, stream=mx.cpu)


def matrix_power(x, n, /):
    if n < 0:
        return matrix_power(inv(x), -n)
    if n == 0:
        return mx.broadcast_to(mx.eye(x.shape[-1], dtype=x.dtype), x.shape)
    out = x
    for _ in range(n - 1):
        out = mx.matmul(out, x)
    return out


def inv(x, /):
    return mx.linalg.inv(x, stream=mx.cpu)


def det(x, /):
    return mx.linalg.det(x, stream=mx.cpu)


def slogdet(x, /):
    return mx.linalg.slogdet(x, stream=mx.cpu)


def solve(x1, x2, /):
    return mx.linalg.solve(x1, x2, stream=mx.cpu)


def cholesky(x, /, *, upper=False):
    return mx.linalg.cholesky(x, upper=upper, stream=mx.cpu)


def eigh(x, /):
    return mx.linalg.eigh(x, stream=mx.cpu)


def eigvalsh(x, /):
    return mx.linalg.eigvalsh(x, stream=mx.cpu)


def svd(x, /, *, full_matrices=True):
    return mx.linalg.svd(x, stream=mx.cpu)


def svdvals(x, /):
    return mx.linalg.svd(x, compute_uv=False, stream=mx.cpu)


def qr(x, /, *, mode="reduced"):
    return mx.linalg.qr(x, stream=mx.cpu)


def pinv(x, /, *, rtol=None):
    return mx.linalg.pinv(x, stream=mx.cpu)


def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002 (the standard's name)
    return mx.linalg.norm(x, ord=ord, axis=(-2, -1), keepdims=keepdims, stream=mx.cpu)
