"""``xp.linalg`` of the ``autograd`` backend: the standard's linear-algebra extension, as far as
autograd differentiates it both ways.

autograd defines only VJPs (no JVPs) for its decompositions and solvers (``det``, ``inv``,
``solve``, ``eigh``, ``cholesky``...), and this backend declares forward mode, so each of those
is a primitive of this module with both rules, written from the standard perturbation results;
every rule calls differentiable functions (these primitives included), so every order is
defined. What is not here fails with an ``AttributeError`` naming it, and the conformance
suite skips it with that reason.
"""

from __future__ import annotations

import builtins

import autograd.numpy as anp
import numpy as np

from autograd.builtins import tuple as _boxed_tuple
from autograd.core import make_vjp
from autograd.extend import defjvp, defvjp, primitive

from . import _namespace as _xp

matmul, tensordot, vecdot, matrix_transpose = _xp.matmul, _xp.tensordot, _xp.vecdot, _xp.matrix_transpose


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002 (the standard's name)
    shape = anp.shape(x)
    axes = tuple(range(len(shape))) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % len(shape) for a in axes) if shape else ()
    if ord == 2:
        # derivative 0 where the norm is 0 (unigrad's rule, docs/conventions.md), not sqrt's NaN
        squares = anp.sum(anp.real(x * anp.conj(x)), axis=axes)
        zero = np.asarray(_xp.getval(squares) == 0)
        norm = anp.sqrt(squares + zero.astype(_xp.result_type(squares))) * (~zero).astype(_xp.result_type(squares))
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


# ------------------------------------------------------------------ solvers and decompositions


def _T(x):
    return anp.swapaxes(x, -1, -2)


def _sym(x):
    return (x + _T(x)) / 2.0


def _scalar_to_matrix(v):
    return anp.expand_dims(anp.expand_dims(v, -1), -1)


@primitive
def inv(x, /):
    return np.linalg.inv(x)


defvjp(inv, lambda ans, x: lambda g: -anp.matmul(_T(ans), anp.matmul(g, _T(ans))))
defjvp(inv, lambda g, ans, x: -anp.matmul(ans, anp.matmul(g, ans)))


@primitive
def det(x, /):
    return np.linalg.det(x)


# d det(x) = det(x) tr(x^-1 dx)
defvjp(det, lambda ans, x: lambda g: _scalar_to_matrix(g * ans) * _T(inv(x)))
defjvp(det, lambda g, ans, x: ans * anp.sum(_T(inv(x)) * g, axis=(-2, -1)))


@primitive
def _logabsdet(x):
    return np.linalg.slogdet(x)[1]


defvjp(_logabsdet, lambda ans, x: lambda g: _scalar_to_matrix(g) * _T(inv(x)))
defjvp(_logabsdet, lambda g, ans, x: anp.sum(_T(inv(x)) * g, axis=(-2, -1)))


def slogdet(x, /):
    """(sign, log|det|); the sign is piecewise constant (no derivative)."""
    return np.linalg.slogdet(_xp.getval(x))[0], _logabsdet(x)


@primitive
def _solve(a, b):
    return np.linalg.solve(a, b)


defvjp(_solve, lambda ans, a, b: lambda g: -anp.matmul(_solve(_T(a), g), _T(ans)),
       lambda ans, a, b: lambda g: _solve(_T(a), g))
defjvp(_solve, lambda g, ans, a, b: -_solve(a, anp.matmul(g, ans)), lambda g, ans, a, b: _solve(a, g))


def solve(x1, x2, /):
    vector = anp.ndim(x2) == 1
    if vector:
        x2 = anp.reshape(x2, (-1, 1))
    # broadcast the stacks first: the rules above assume equal batch shapes
    batch = np.broadcast_shapes(anp.shape(x1)[:-2], anp.shape(x2)[:-2])
    out = _solve(_xp.broadcast_to(x1, batch + anp.shape(x1)[-2:]), _xp.broadcast_to(x2, batch + anp.shape(x2)[-2:]))
    return out[..., 0] if vector else out


def _phi(x):
    """The lower triangle of x with its diagonal halved."""
    n = anp.shape(x)[-1]
    return x * (np.tril(np.ones((n, n))) - 0.5 * np.eye(n))


@primitive
def _cholesky(x):
    return np.linalg.cholesky(x)


# dL = L phi(L^-1 sym(dA) L^-T), and its adjoint
defvjp(_cholesky, lambda L, x: lambda g: _sym(anp.matmul(_T(inv(L)), anp.matmul(_phi(anp.matmul(_T(L), g)), inv(L)))))
defjvp(_cholesky, lambda g, L, x: anp.matmul(L, _phi(anp.matmul(inv(L), anp.matmul(_sym(g), _T(inv(L)))))))


def cholesky(x, /, *, upper=False):
    L = _cholesky(x)
    return _T(L) if upper else L


def _gaps(w):
    """F[i, j] = 1 / (w[j] - w[i]) off the diagonal, 0 on it."""
    diff = anp.expand_dims(w, -2) - anp.expand_dims(w, -1)
    off = 1.0 - np.eye(anp.shape(w)[-1])
    return off / (diff + (1.0 - off))


@primitive
def _eigh(x):
    return tuple(np.linalg.eigh(x))


def _eigh_vjp(ans, x):
    w, v = ans

    def pullback(g):
        gw, gv = g
        inner = anp.expand_dims(gw, -1) * np.eye(anp.shape(w)[-1]) + _gaps(w) * anp.matmul(_T(v), gv)
        return _sym(anp.matmul(v, anp.matmul(inner, _T(v))))

    return pullback


def _eigh_jvp(g, ans, x):
    # dw = diag(V^T dA V), dV = V (F * V^T dA V), for the symmetric part of dA
    w, v = ans
    m = anp.matmul(_T(v), anp.matmul(_sym(g), v))
    return _boxed_tuple((diagonal(m), anp.matmul(v, _gaps(w) * m)))


defvjp(_eigh, _eigh_vjp)
defjvp(_eigh, _eigh_jvp)


def eigh(x, /):
    w, v = _eigh(x)
    return w, v


def eigvalsh(x, /):
    return _eigh(x)[0]


def _vjp_by_transposing(jvp_rule):
    """A primitive's VJP from its JVP (linear in the tangent): reverse mode through the JVP."""
    def vjp_maker(ans, x):
        def pullback(g):
            back, _ = make_vjp(lambda t: jvp_rule(t, ans, x), np.zeros(anp.shape(x), dtype=_xp.result_type(x)))
            return back(g)
        return pullback
    return vjp_maker


@primitive
def _svd(x):
    return tuple(np.linalg.svd(x, full_matrices=False))


def _svd_jvp(g, ans, x):
    # A = U S V^T (thin), dP = U^T dA V, F[i, j] = 1 / (s_j^2 - s_i^2) off the diagonal:
    # ds = diag(dP), dU = U (F * (dP S + S dP^T)) + (I - U U^T) dA V S^-1,
    # dV = V (F * (S dP + dP^T S)) + (I - V V^T) dA^T U S^-1
    u, s, vh = ans
    v = _T(vh)
    dp = anp.matmul(_T(u), anp.matmul(g, v))
    f = _gaps(s * s)
    row, col = anp.expand_dims(s, -1), anp.expand_dims(s, -2)
    du = anp.matmul(u, f * (dp * col + row * _T(dp)))
    dv = anp.matmul(v, f * (row * dp + _T(dp) * col))
    m, n = anp.shape(x)[-2:]
    if m > n:
        dav = anp.matmul(g, v)
        du = du + (dav - anp.matmul(u, anp.matmul(_T(u), dav))) / col
    if n > m:
        dau = anp.matmul(_T(g), u)
        dv = dv + (dau - anp.matmul(v, anp.matmul(vh, dau))) / col
    return _boxed_tuple((du, diagonal(dp), _T(dv)))


defjvp(_svd, _svd_jvp)
defvjp(_svd, _vjp_by_transposing(_svd_jvp))


def svd(x, /, *, full_matrices=True):
    if full_matrices and anp.shape(x)[-1] != anp.shape(x)[-2]:
        raise ValueError(f"linalg.svd: the autograd backend differentiates the thin SVD only; pass "
                         f"full_matrices=False for a non-square x (shape {anp.shape(x)})")
    u, s, vh = _svd(x)
    return u, s, vh


def svdvals(x, /):
    return _svd(x)[1]


def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002 (the standard's name)
    a = anp.abs(x)
    if ord == "fro":
        norm = anp.sqrt(anp.sum(anp.real(x * anp.conj(x)), axis=(-2, -1)))
    elif ord in (1, -1):
        sums = anp.sum(a, axis=-2)
        norm = anp.max(sums, axis=-1) if ord == 1 else anp.min(sums, axis=-1)
    elif ord in (float("inf"), -float("inf")):
        sums = anp.sum(a, axis=-1)
        norm = anp.max(sums, axis=-1) if ord > 0 else anp.min(sums, axis=-1)
    elif ord in (2, -2):
        s = svdvals(x)
        norm = anp.max(s, axis=-1) if ord == 2 else anp.min(s, axis=-1)
    elif ord == "nuc":
        norm = anp.sum(svdvals(x), axis=-1)
    else:
        raise ValueError(f"linalg.matrix_norm: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf; got {ord!r}")
    return _scalar_to_matrix(norm) if keepdims else norm


def pinv(x, /, *, rtol=None):
    u, s, vh = _svd(x)
    m, n = anp.shape(x)[-2:]
    values = _xp.getval(s)
    cutoff = (builtins.max(m, n) * np.finfo(values.dtype).eps if rtol is None else rtol) * np.max(
        values, axis=-1, keepdims=True, initial=0.0)
    kept = values > cutoff
    s_inv = anp.where(kept, 1.0 / anp.where(kept, s, 1.0), 0.0)
    return anp.matmul(_T(vh) * anp.expand_dims(s_inv, -2), _T(u))


@primitive
def _qr(x):
    return tuple(np.linalg.qr(x))


def _qr_jvp(g, ans, x):
    # A = Q R (m >= n), X = Q^T dA R^-1, Q^T dQ = W = tril(X, -1) - tril(X, -1)^T (antisymmetric):
    # dR = (X - W) R, dQ = Q W + (I - Q Q^T) dA R^-1
    q, r = ans
    r_inv = inv(r)
    da_r_inv = anp.matmul(g, r_inv)
    x_ = anp.matmul(_T(q), da_r_inv)
    low = anp.tril(x_, -1)
    w = low - _T(low)
    dq = anp.matmul(q, w) + da_r_inv - anp.matmul(q, x_)
    return _boxed_tuple((dq, anp.matmul(x_ - w, r)))


defjvp(_qr, _qr_jvp)
defvjp(_qr, _vjp_by_transposing(_qr_jvp))


def qr(x, /, *, mode="reduced"):
    m, n = anp.shape(x)[-2:]
    if m < n or (mode != "reduced" and m != n):
        raise ValueError(f"linalg.qr: the autograd backend differentiates the reduced QR of an x with at least "
                         f"as many rows as columns; got shape {anp.shape(x)}, mode={mode!r}")
    q, r = _qr(x)
    return q, r
