"""``linalg`` of TensorFlow's Array API namespace: mostly one-line mappings onto ``tf.linalg``.

Above ``_tensors`` and ``_shapes``; the namespace takes ``matmul``, ``matrix_transpose``, ``tensordot``
and ``vecdot`` from here (the standard has them in both).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from . import _shapes
from ._shapes import matrix_transpose
from ._tensors import _accumulator, _axes, _dt, _promote, _tensor


def matmul(x1, x2, /):
    x1, x2 = _promote(x1, x2)
    n1, n2 = x1.shape.rank, x2.shape.rank
    if n1 == 0 or n2 == 0:
        raise ValueError("matmul: operands must be at least 1-D (use multiply for scalars)")
    k1, k2 = x1.shape[-1], x2.shape[0 if n2 == 1 else -2]
    if k1 is not None and k2 is not None and k1 != k2:
        raise ValueError(f"matmul: the contracted dimensions differ: shapes {tuple(x1.shape)} and "
                         f"{tuple(x2.shape)}")
    if n1 == 1 and n2 == 1:
        return tf.reduce_sum(x1 * x2)
    if n1 == 1:
        return tf.squeeze(_matmul2(x1[None, :], x2), -2)
    if n2 == 1:
        return tf.squeeze(_matmul2(x1, x2[:, None]), -1)
    return _matmul2(x1, x2)


_MATMUL_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.complex64, tf.complex128, tf.int32, tf.int64)


def _matmul2(x1, x2):
    if x1.dtype in _MATMUL_DTYPES:
        return tf.linalg.matmul(x1, x2)
    return _in_int64(tf.linalg.matmul, x1, x2)


def _in_int64(fn, x1, x2, *args):
    """``fn`` for integer dtypes TensorFlow has no MatMul kernel for (uint8..uint64, int8, int16): computed in
    int64, whose wrap-around keeps the low bits, then brought back -- NumPy's modular result. Bool: in int64,
    then nonzero."""
    dtype = x1.dtype
    if dtype.is_bool:
        return fn(tf.cast(x1, tf.int64), tf.cast(x2, tf.int64), *args) != 0
    if not dtype.is_integer:
        raise TypeError(f"no TensorFlow kernel for dtype {dtype.name}")
    if dtype == tf.uint64:
        return tf.bitcast(fn(tf.bitcast(x1, tf.int64), tf.bitcast(x2, tf.int64), *args), tf.uint64)
    return tf.cast(fn(tf.cast(x1, tf.int64), tf.cast(x2, tf.int64), *args), dtype)


def vecdot(x1, x2, /, *, axis=-1):
    x1, x2 = _promote(x1, x2)
    n1, n2 = x1.shape[axis] if x1.shape.rank else None, x2.shape[axis] if x2.shape.rank else None
    if n1 is None or n2 is None or n1 != n2:
        raise ValueError(f"vecdot: x1 and x2 must have one size along axis {axis} (it is contracted, never "
                         f"broadcast); got shapes {tuple(x1.shape)} and {tuple(x2.shape)}")
    return tf.reduce_sum(tf.math.conj(x1) * x2, axis=axis)


def tensordot(x1, x2, /, *, axes=2):
    x1, x2 = _promote(x1, x2)
    if not isinstance(axes, int):
        a1, a2 = ([a] if isinstance(a, int) else list(a) for a in axes)
        axes = [[a % x1.shape.rank for a in a1], [a % x2.shape.rank for a in a2]]
    if x1.dtype not in _MATMUL_DTYPES:
        return _in_int64(tf.tensordot, x1, x2, axes)
    return tf.tensordot(x1, x2, axes)


def outer(x1, x2, /):
    x1, x2 = _promote(x1, x2)
    return tf.reshape(x1, [-1, 1]) * tf.reshape(x2, [1, -1])


def diagonal(x, /, *, offset=0):
    x = _tensor(x)
    rows, cols = x.shape[-2], x.shape[-1]
    if rows is not None and cols is not None and not -rows < offset < cols:  # outside the matrix: empty
        return tf.zeros(tf.concat([tf.shape(x)[:-2], [0]], 0), x.dtype)  # (TensorFlow's kernel raises)
    return tf.linalg.diag_part(x, k=offset)


def trace(x, /, *, offset=0, dtype=None):
    d = diagonal(x, offset=offset)
    return tf.reduce_sum(_tensor(d, _dt(dtype) or _accumulator(d.dtype)), axis=-1)


class SlogdetResult(NamedTuple):
    sign: tf.Tensor
    logabsdet: tf.Tensor


class EighResult(NamedTuple):
    eigenvalues: tf.Tensor
    eigenvectors: tf.Tensor


class QRResult(NamedTuple):
    Q: tf.Tensor
    R: tf.Tensor


class SVDResult(NamedTuple):
    U: tf.Tensor
    S: tf.Tensor
    Vh: tf.Tensor


def _square(x, fname):
    x = _tensor(x)
    if x.shape.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"linalg.{fname}: expected a (stack of) square matrices; got shape {tuple(x.shape)}")
    return x


def inv(x, /):
    return tf.linalg.inv(_square(x, "inv"))


def det(x, /):
    return tf.linalg.det(_square(x, "det"))


def slogdet(x, /):
    sign, logabsdet = tf.linalg.slogdet(_square(x, "slogdet"))
    # TensorFlow gives a complex matrix a complex log|det| (zero imaginary part); the standard a real one
    return SlogdetResult(sign, tf.math.real(logabsdet) if logabsdet.dtype.is_complex else logabsdet)


def _hermitian_part(x):
    """(x + x^H) / 2: the decompositions of Hermitian matrices read it, as the tape and JAX do, so that
    their derivatives are symmetric (TensorFlow's own read only the lower triangle)."""
    return (x + tf.linalg.adjoint(x)) / tf.constant(2, x.dtype)


def cholesky(x, /, *, upper=False):
    lower = tf.linalg.cholesky(_hermitian_part(_square(x, "cholesky")))
    return tf.linalg.adjoint(lower) if upper else lower


def solve(x1, x2, /):
    """Solve ``x1 @ out = x2``; a 1-D ``x2`` is one vector, otherwise a (broadcast) stack of matrices."""
    x1, x2 = _promote(_square(x1, "solve"), x2)
    vector = x2.shape.rank == 1
    if vector:
        x2 = x2[:, None]
    batch = tf.broadcast_static_shape(x1.shape[:-2], x2.shape[:-2])
    x1 = tf.broadcast_to(x1, batch.concatenate(x1.shape[-2:]))
    x2 = tf.broadcast_to(x2, batch.concatenate(x2.shape[-2:]))
    out = tf.linalg.solve(x1, x2)
    return out[..., 0] if vector else out


def qr(x, /, *, mode="reduced"):
    if mode not in ("reduced", "complete"):
        raise ValueError(f"linalg.qr: mode must be 'reduced' or 'complete'; got {mode!r}")
    return QRResult(*tf.linalg.qr(_tensor(x), full_matrices=mode == "complete"))


def eigh(x, /):
    return EighResult(*tf.linalg.eigh(_hermitian_part(_square(x, "eigh"))))


def eigvalsh(x, /):
    return tf.linalg.eigvalsh(_hermitian_part(_square(x, "eigvalsh")))


def svd(x, /, *, full_matrices=True):
    s, u, v = tf.linalg.svd(_tensor(x), full_matrices=full_matrices, compute_uv=True)
    return SVDResult(u, s, tf.linalg.adjoint(v))


def svdvals(x, /):
    return tf.linalg.svd(_tensor(x), compute_uv=False)


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """Vector p-norm. At 0 the 2-norm's derivative is 0 (a subgradient, as on the tape), not NaN."""
    a = tf.abs(_tensor(x))
    axes = _axes(axis, a.shape.rank)
    if ord == 2:
        squares = tf.reduce_sum(a * a, axis=axes, keepdims=keepdims)
        zero = tf.equal(squares, 0)
        return tf.where(zero, tf.zeros_like(squares), tf.sqrt(tf.where(zero, tf.ones_like(squares), squares)))
    if ord == math.inf:
        return tf.reduce_max(a, axis=axes, keepdims=keepdims)
    if ord == -math.inf:
        return tf.reduce_min(a, axis=axes, keepdims=keepdims)
    if ord == 1:
        return tf.reduce_sum(a, axis=axes, keepdims=keepdims)
    if ord == 0:
        return tf.reduce_sum(tf.cast(a != 0, a.dtype), axis=axes, keepdims=keepdims)
    return tf.reduce_sum(a ** ord, axis=axes, keepdims=keepdims) ** (1.0 / ord)


def matrix_norm(x, /, *, keepdims=False, ord="fro"):
    x = _tensor(x)
    if ord == "fro":
        out = vector_norm(x, axis=(-2, -1))
    elif ord == "nuc":
        out = tf.reduce_sum(svdvals(x), axis=-1)
    elif ord in (2, -2):
        out = (tf.reduce_max if ord == 2 else tf.reduce_min)(svdvals(x), axis=-1)
    elif ord in (1, -1, math.inf, -math.inf):
        sums = tf.reduce_sum(tf.abs(x), axis=-2 if ord in (1, -1) else -1)
        out = (tf.reduce_max if ord > 0 else tf.reduce_min)(sums, axis=-1)
    else:
        raise ValueError(f"linalg.matrix_norm: unsupported ord {ord!r}")
    return out[..., None, None] if keepdims else out


def pinv(x, /, *, rtol=None):
    """V diag(1/s) U^H with singular values at or below ``rtol * max(s)`` dropped (the standard's
    default rtol: max(M, N) * eps; TensorFlow's own is 10x larger). Through the SVD for every dtype:
    tf.linalg.pinv takes real matrices only, no zero-size ones, and rtol as a scalar of x's dtype."""
    x = _tensor(x)
    rows, cols = x.shape[-2], x.shape[-1]
    real = x.dtype.real_dtype
    if rows == 0 or cols == 0:
        return tf.zeros(tf.concat([tf.shape(x)[:-2], [cols, rows]], 0), x.dtype)
    if rtol is None:
        rtol = max(rows, cols) * np.finfo(real.as_numpy_dtype).eps
    rtol = tf.cast(_tensor(rtol), real)
    s, u, v = tf.linalg.svd(x, full_matrices=False)
    cutoff = rtol[..., None] * tf.reduce_max(s, axis=-1, keepdims=True)
    keep = s > cutoff
    s_inv = tf.where(keep, 1 / tf.where(keep, s, tf.ones_like(s)), tf.zeros_like(s))
    if x.dtype.is_complex:
        s_inv = tf.complex(s_inv, tf.zeros_like(s_inv))  # (a cast would warn in the backward pass)
    return tf.linalg.matmul(v * s_inv[..., None, :], u, adjoint_b=True)


def matrix_power(x, n, /):
    x = _square(x, "matrix_power")
    if n < 0:
        x, n = tf.linalg.inv(x), -n
    result = None
    while n:  # binary exponentiation
        if n & 1:
            result = x if result is None else tf.linalg.matmul(result, x)
        n >>= 1
        if n:
            x = tf.linalg.matmul(x, x)
    if result is None:
        return tf.broadcast_to(tf.eye(x.shape[-1], dtype=x.dtype), tf.shape(x))
    return result


def matrix_rank(x, /, *, rtol=None):
    s = svdvals(x)
    x = _tensor(x)
    if rtol is None:
        rtol = max(x.shape[-2:]) * np.finfo(x.dtype.real_dtype.as_numpy_dtype).eps
    return tf.math.count_nonzero(s > rtol * tf.reduce_max(s, axis=-1, keepdims=True), axis=-1, dtype=tf.int64)


def cross(x1, x2, /, *, axis=-1):
    x1, x2 = _promote(x1, x2)
    x1, x2 = _shapes.broadcast_arrays(x1, x2)
    return _shapes.moveaxis(tf.linalg.cross(_shapes.moveaxis(x1, axis, -1), _shapes.moveaxis(x2, axis, -1)), -1, axis)
