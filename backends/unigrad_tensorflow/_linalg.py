"""``linalg`` of the TensorFlow Array API namespace: mostly one-line mappings onto ``tf.linalg``."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from . import _namespace as xp

matmul, matrix_transpose, tensordot, vecdot, outer = xp.matmul, xp.matrix_transpose, xp.tensordot, xp.vecdot, xp.outer
diagonal, trace = xp.diagonal, xp.trace
SlogdetResult, EighResult, QRResult, SVDResult = xp.SlogdetResult, xp.EighResult, xp.QRResult, xp.SVDResult


def _square(x, fname):
    x = xp._tensor(x)
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
    x1, x2 = xp._promote(_square(x1, "solve"), x2)
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
    return QRResult(*tf.linalg.qr(xp._tensor(x), full_matrices=mode == "complete"))


def eigh(x, /):
    return EighResult(*tf.linalg.eigh(_hermitian_part(_square(x, "eigh"))))


def eigvalsh(x, /):
    return tf.linalg.eigvalsh(_hermitian_part(_square(x, "eigvalsh")))


def svd(x, /, *, full_matrices=True):
    s, u, v = tf.linalg.svd(xp._tensor(x), full_matrices=full_matrices, compute_uv=True)
    return SVDResult(u, s, tf.linalg.adjoint(v))


def svdvals(x, /):
    return tf.linalg.svd(xp._tensor(x), compute_uv=False)


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """Vector p-norm. At 0 the 2-norm's derivative is 0 (a subgradient, as on the tape), not NaN."""
    a = tf.abs(xp._tensor(x))
    axes = xp._axes(axis, a.shape.rank)
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
    x = xp._tensor(x)
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
    x = xp._tensor(x)
    if rtol is None:  # the Array API default, max(M, N) * eps (TensorFlow's own is 10x larger)
        rtol = max(x.shape[-2:]) * np.finfo(x.dtype.real_dtype.as_numpy_dtype).eps
    return tf.linalg.pinv(x, rcond=rtol)


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
    x = xp._tensor(x)
    if rtol is None:
        rtol = max(x.shape[-2:]) * np.finfo(x.dtype.real_dtype.as_numpy_dtype).eps
    return tf.math.count_nonzero(s > rtol * tf.reduce_max(s, axis=-1, keepdims=True), axis=-1, dtype=tf.int64)


def cross(x1, x2, /, *, axis=-1):
    x1, x2 = xp._promote(x1, x2)
    x1, x2 = xp.broadcast_arrays(x1, x2)
    return xp.moveaxis(tf.linalg.cross(xp.moveaxis(x1, axis, -1), xp.moveaxis(x2, axis, -1)), -1, axis)
