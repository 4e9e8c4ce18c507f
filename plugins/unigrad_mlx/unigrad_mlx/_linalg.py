"""``xp.linalg`` of the ``mlx`` backend: the standard's linear-algebra extension, differentiable to
any order.

MLX's decompositions run on the CPU only (``stream=mx.cpu``). MLX 0.32 has no VJP or JVP for
``inv``, ``cholesky``, ``eigh``, ``svd`` and ``qr`` and a failing one for ``solve``; those functions
(and ``eigvalsh``, ``svdvals`` and ``pinv``) are ``mx.custom_function``s with unigrad's rules, in
:mod:`._linalg_rules`; ``matrix_norm`` is built on ``svdvals`` and ordinary operations. The rest are
written from differentiable pieces (``det`` and ``slogdet`` are MLX's own). Real inputs only: MLX's
linear algebra has no complex dtype.

Conventions are the tape's (docs/tape.md): ``cholesky``, ``eigh`` and ``eigvalsh`` read the symmetric
part (x + x^T) / 2; eigen- and singular vectors are defined up to sign. Limitation: ``qr`` supports
``mode="reduced"`` only (MLX computes no complete factorisation): ``mode="complete"`` of a tall
matrix raises NotImplementedError.
"""

from __future__ import annotations

from collections import namedtuple

import mlx.core as mx

from . import _linalg_rules as _rules
from . import _namespace as _xp

EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])
QRResult = namedtuple("QRResult", ["Q", "R"])

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
    # (the namespace's max / min: a tie splits the derivative in both modes, docs/conventions.md)
    if ord == float("inf"):
        return _xp.max(a, axis=axes, keepdims=keepdims)
    if ord == -float("inf"):
        return _xp.min(a, axis=axes, keepdims=keepdims)
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


def _square(x, fname):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"linalg.{fname}: x must be a (stack of) square matrices; got shape {tuple(x.shape)}")
    return x


def _matrix(x, fname):
    if x.ndim < 2:
        raise ValueError(f"linalg.{fname}: x must be at least 2-D; got shape {tuple(x.shape)}")
    return x


def inv(x, /):
    return _rules.inv(_square(x, "inv"))


def det(x, /):
    return mx.linalg.det(x, stream=mx.cpu)


def slogdet(x, /):
    return mx.linalg.slogdet(x, stream=mx.cpu)


def solve(x1, x2, /):
    """Solve x1 @ out = x2; a 1-D x2 is one right-hand side (NumPy 2's rule), else x2 is (..., n, k)."""
    _square(x1, "solve")
    vector = x2.ndim == 1
    b = x2[:, None] if vector else x2
    if b.ndim < 2 or b.shape[-2] != x1.shape[-1]:
        raise ValueError(f"linalg.solve: x2 must be (n,) or (..., n, k) with n = {x1.shape[-1]}; "
                         f"got shape {tuple(x2.shape)}")
    batch = mx.broadcast_shapes(x1.shape[:-2], b.shape[:-2])
    out = _rules.solve(mx.broadcast_to(x1, (*batch, *x1.shape[-2:])), mx.broadcast_to(b, (*batch, *b.shape[-2:])))
    return out[..., 0] if vector else out


def cholesky(x, /, *, upper=False):
    """Cholesky factor of the symmetric part of x (lower, or upper = its transpose)."""
    low = _rules.cholesky(_square(x, "cholesky"))
    return mx.swapaxes(low, -1, -2) if upper else low


def eigh(x, /):
    """Eigenvalues (ascending) and eigenvectors of the symmetric part of x."""
    w, v = _rules.eigh(_square(x, "eigh"))
    return EighResult(w, v)


def eigvalsh(x, /):
    return _rules.eigvalsh(_square(x, "eigvalsh"))


def svd(x, /, *, full_matrices=True):
    """U, S, Vh with x = U diag(S) Vh (derivatives: ``_linalg_rules``)."""
    fn = _rules.svd_full if full_matrices else _rules.svd_reduced
    return SVDResult(*fn(_matrix(x, "svd")))


def svdvals(x, /):
    return _rules.svdvals(_matrix(x, "svdvals"))


def qr(x, /, *, mode="reduced"):
    """Q, R with x = Q R; needs R's leading square block invertible to differentiate."""
    if mode not in ("reduced", "complete"):
        raise ValueError(f"linalg.qr: mode must be 'reduced' or 'complete'; got {mode!r}")
    _matrix(x, "qr")
    if mode == "complete" and x.shape[-2] > x.shape[-1]:
        # MLX's qr computes the reduced factorisation only (the same as the complete one when m <= n)
        raise NotImplementedError("linalg.qr: the mlx backend has no mode='complete' for a tall x "
                                  f"(m > n); got shape {tuple(x.shape)}")
    return QRResult(*_rules.qr(x))


def pinv(x, /, *, rtol=None):
    """Pseudo-inverse; the derivative assumes the rank is locally constant (it jumps where it changes)."""
    return _rules.make_pinv(rtol)(_matrix(x, "pinv"))


def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002 (the standard's name)
    """Matrix norms over the last two axes: 'fro', 'nuc', 1, -1, 2, -2, inf, -inf."""
    _matrix(x, "matrix_norm")
    if ord == "fro":
        return vector_norm(x, axis=(-2, -1), keepdims=keepdims)
    if ord in ("nuc", 2, -2):
        s = svdvals(x)
        out = mx.sum(s, axis=-1) if ord == "nuc" else (_xp.max(s, axis=-1) if ord == 2 else _xp.min(s, axis=-1))
    elif ord in (1, -1):
        col = mx.sum(mx.abs(x), axis=-2)
        out = _xp.max(col, axis=-1) if ord == 1 else _xp.min(col, axis=-1)
    elif ord in (float("inf"), -float("inf")):
        row = mx.sum(mx.abs(x), axis=-1)
        out = _xp.max(row, axis=-1) if ord == float("inf") else _xp.min(row, axis=-1)
    else:
        raise ValueError(f"linalg.matrix_norm: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf; got {ord!r}")
    return out[..., None, None] if keepdims else out
