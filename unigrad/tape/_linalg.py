"""``linalg`` of the tape's Array API namespace (the 2024.12 extension, plus NumPy's ``norm``).

Matrices live on the last two axes and every function broadcasts over the leading ones.
Decompositions (``eigh``, ``svd``, ``qr``, ``slogdet``) are joint primitives whose results come
packed in one array; they are unpacked here into the standard's named tuples. On NumPy inputs
the functions call NumPy directly.

Conventions (docs/tape.md): ``cholesky``, ``eigh`` and ``eigvalsh`` read the Hermitian part
(A + A^H) / 2 of their input, as JAX does, so the derivative is the derivative of what is
computed; eigen- and singular vectors are defined up to sign (real) or phase (complex): their
derivatives are those of the gauge described in ``_primitives``, so only gauge-invariant
functions of them (projectors, reconstructions, |v|^2...) match finite differences in general.
"""

from __future__ import annotations

import builtins
import math
from collections import namedtuple

import numpy as np

from . import _functions as xp
from . import _primitives as P
from ._tracer import _ndim, _shape, concrete

EighResult = namedtuple("EighResult", ["eigenvalues", "eigenvectors"])
SVDResult = namedtuple("SVDResult", ["U", "S", "Vh"])
QRResult = namedtuple("QRResult", ["Q", "R"])
SlogdetResult = namedtuple("SlogdetResult", ["sign", "logabsdet"])

matmul = xp.matmul
matrix_transpose = xp.matrix_transpose
tensordot = xp.tensordot
vecdot = xp.vecdot


def _square(x, fname):
    x = xp._arr(x)
    shape = _shape(x)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"linalg.{fname}: x must be a (stack of) square matrices; got shape {shape}")
    return x


def _matrix(x, fname):
    x = xp._arr(x)
    if _ndim(x) < 2:
        raise ValueError(f"linalg.{fname}: x must be at least 2-D; got shape {_shape(x)}")
    return x


def _unpack(packed, cores, real_parts, complex_input):
    """The results of a joint primitive, with the real ones (eigenvalues, singular values) made real."""
    parts = P._split(packed, cores)
    if complex_input:
        parts = [xp.real(p) if r else p for p, r in zip(parts, real_parts)]
    return parts


def outer(x1, x2, /):
    if _ndim(x1) != 1 or _ndim(x2) != 1:
        raise ValueError(f"linalg.outer: both inputs must be 1-D; got shapes {_shape(x1)} and {_shape(x2)}")
    return xp.reshape(x1, (-1, 1)) * xp.reshape(x2, (1, -1))


def diagonal(x, /, *, offset=0):
    """The ``offset`` diagonal of the last two axes."""
    x = _matrix(x, "diagonal")
    n, m = _shape(x)[-2:]
    rows = np.arange(builtins.max(0, -offset), builtins.min(n, m - offset))
    index = (slice(None),) * (_ndim(x) - 2) + (rows, rows + offset)
    return P.getitem(x, index=index)


def trace(x, /, *, offset=0, dtype=None):
    return xp.sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def cross(x1, x2, /, *, axis=-1):
    """Cross product of 3-vectors along ``axis`` (broadcasting the other axes)."""
    x1, x2 = xp.broadcast_arrays(xp._arr(x1), xp._arr(x2))
    if _shape(x1)[axis] != 3:
        raise ValueError(f"linalg.cross: axis {axis} must have size 3; got shapes {_shape(x1)}, {_shape(x2)}")
    a0, a1, a2 = xp.unstack(x1, axis=axis)
    b0, b1, b2 = xp.unstack(x2, axis=axis)
    return xp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=axis)


# -------------------------------------------------------------------- inverses and determinants

def inv(x, /):
    x = _square(x, "inv")
    return P.inv(x) if xp._is_traced(x) else np.linalg.inv(x)


def solve(x1, x2, /):
    """Solve x1 @ out = x2; a 1-D x2 is one right-hand side (NumPy 2's rule)."""
    x1, x2 = _square(x1, "solve"), xp._arr(x2)
    if not (xp._is_traced(x1) or xp._is_traced(x2)):
        return np.linalg.solve(x1, x2)
    if _ndim(x2) == 1:  # (..., M, 1) solved, then the last axis dropped: shape x1.shape[:-2] + (M,)
        out = P.solve(x1, xp.reshape(x2, (-1, 1)))
        return xp.reshape(out, tuple(out.shape[:-1]))
    return P.solve(x1, x2)


def det(x, /):
    """Determinant; its derivative is the cofactor matrix, exact at singular matrices of rank n-1."""
    x = _square(x, "det")
    return P.det(x) if xp._is_traced(x) else np.linalg.det(x)


def slogdet(x, /):
    """(sign, log|det|). At a singular matrix log|det| = -inf and its derivative does not exist:
    differentiating there raises numpy.linalg.LinAlgError."""
    x = _square(x, "slogdet")
    if not xp._is_traced(x):
        return SlogdetResult(*np.linalg.slogdet(x))
    sign, logabs = _unpack(P.slogdet(x), [(), ()], [False, True], xp._is_complex(x))
    return SlogdetResult(sign, logabs)


def matrix_power(x, n, /):
    """x @ x @ ... (n times); n < 0 inverts first; n == 0 gives the identity (a constant)."""
    x = _square(x, "matrix_power")
    n = int(n)
    if n == 0:
        return np.broadcast_to(np.eye(_shape(x)[-1], dtype=concrete(x).dtype), _shape(x)).copy()
    if n < 0:
        x, n = inv(x), -n
    result, base = None, x
    while n:  # binary exponentiation: O(log n) products
        if n & 1:
            result = base if result is None else xp.matmul(result, base)
        n >>= 1
        if n:
            base = xp.matmul(base, base)
    return result


def pinv(x, /, *, rtol=None):
    """Pseudo-inverse; the derivative assumes the rank is locally constant (it jumps where it changes)."""
    x = _matrix(x, "pinv")
    if not xp._is_traced(x):
        return P._pinv_impl(x, rtol)
    return P.pinv(x, rtol=rtol)


def matrix_rank(x, /, *, rtol=None):
    """Rank (an integer: no derivative)."""
    return np.linalg.matrix_rank(concrete(x), rtol=rtol)


# -------------------------------------------------------------------- decompositions

def cholesky(x, /, *, upper=False):
    """Cholesky factor of the Hermitian part of x (lower, or upper = its conjugate transpose)."""
    x = _square(x, "cholesky")
    lower = P.cholesky(x) if xp._is_traced(x) else P._cholesky_impl(x)
    if not upper:
        return lower
    lt = xp.matrix_transpose(lower)
    return xp.conj(lt) if xp._is_complex(x) else lt


def eigh(x, /):
    """Eigenvalues (ascending) and eigenvectors of the Hermitian part of x.

    Derivatives: dw = diag(V^H dA V); dV = V (F o V^H dA V) with F_ij = 1 / (w_j - w_i), and F_ij = 0
    for equal eigenvalues (there the eigenvectors are not unique and their derivative is not defined).
    """
    return _eigh(x, "L")


def _eigh(x, uplo):
    """eigh with LAPACK reading triangle ``uplo`` of the Hermitian part (NumPy's ``eigh(a, UPLO=)`` of a
    Hermitian ``a``: the same eigenvector signs as NumPy)."""
    x = _square(x, "eigh")
    n = _shape(x)[-1]
    if not xp._is_traced(x):
        w, v = np.linalg.eigh((x + np.conj(np.swapaxes(x, -1, -2))) / 2, UPLO=uplo)
        return EighResult(w, v)
    w, v = _unpack(P.eigh(x, uplo=uplo) if uplo != "L" else P.eigh(x), [(n,), (n, n)], [True, False],
                   xp._is_complex(x))
    return EighResult(w, v)


def eigvalsh(x, /):
    x = _square(x, "eigvalsh")
    if not xp._is_traced(x):
        return np.linalg.eigvalsh((x + np.conj(np.swapaxes(x, -1, -2))) / 2)
    return eigh(x).eigenvalues


EigResult = namedtuple("EigResult", ["eigenvalues", "eigenvectors"])


def eig(x, /):
    """Eigenvalues and unit-norm eigenvectors of a general square matrix (NumPy's ``linalg.eig``):
    complex, or real when x is real and every eigenvalue is (NumPy's rule). Derivatives need distinct
    eigenvalues; eigenvectors carry LAPACK's phase, so only phase-invariant functions of them (the
    reconstruction V diag(w) V^-1, |v|...) match finite differences."""
    x = _square(x, "eig")
    if not xp._is_traced(x):
        return EigResult(*np.linalg.eig(x))
    n = _shape(x)[-1]
    w, v = P._split(P.eig(x), [(n,), (n, n)])
    if not xp._is_complex(x) and np.all(np.imag(concrete(w)) == 0):
        w, v = xp.real(w), xp.real(v)
    return EigResult(w, v)


def eigvals(x, /):
    return eig(x).eigenvalues if xp._is_traced(x) else np.linalg.eigvals(_square(x, "eigvals"))


def svd(x, /, *, full_matrices=True):
    """U, S, Vh with x = U diag(S) Vh.

    Derivatives (P = U^H dA V, F_ij = 1 / (s_j^2 - s_i^2)): dS = Re diag(P); U^H dU = F o (P S + S P^H);
    V^H dV = F o (S P + P^H S); for complex x, U^H dU also gets i Im diag(P) / s on its diagonal.
    Equal singular values: F_ij = 0. The parts of dU (dV) outside span(U) (span(V)) of a non-square x
    carry 1 / s: 0 for s == 0. The extra columns of full_matrices=True for a non-square x are not
    unique; they follow U (V) with the minimal rotation.
    """
    x = _matrix(x, "svd")
    if not xp._is_traced(x):
        return SVDResult(*np.linalg.svd(x, full_matrices=full_matrices))
    m, n = _shape(x)[-2:]
    u, s, vh = _unpack(P.svd(x, full_matrices=builtins.bool(full_matrices)), P._svd_cores(m, n, full_matrices),
                       [False, True, False], xp._is_complex(x))
    return SVDResult(u, s, vh)


def svdvals(x, /):
    x = _matrix(x, "svdvals")
    if not xp._is_traced(x):
        return np.linalg.svd(x, compute_uv=False)
    return svd(x, full_matrices=False).S


def qr(x, /, *, mode="reduced"):
    """Q, R with x = Q R (R's diagonal as LAPACK leaves it). Needs R's leading square block invertible to
    differentiate; mode="complete" for a tall x gives extra columns of Q that follow the first ones with
    the minimal rotation (they are not unique)."""
    if mode not in ("reduced", "complete"):
        raise ValueError(f"linalg.qr: mode must be 'reduced' or 'complete'; got {mode!r}")
    x = _matrix(x, "qr")
    if not xp._is_traced(x):
        return QRResult(*np.linalg.qr(x, mode=mode))
    m, n = _shape(x)[-2:]
    q, r = P._split(P.qr(x, mode=mode), P._qr_cores(m, n, mode))
    return QRResult(q, r)


# -------------------------------------------------------------------- norms

def _safe_sqrt(s):
    """sqrt with derivative 0 (a subgradient) where s == 0 instead of inf * 0 = NaN."""
    zero = concrete(s) == 0
    if not np.any(zero):
        return xp.sqrt(s)
    return xp.where(zero, 0, xp.sqrt(xp.where(zero, 1, s)))


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002
    """Vector p-norm over ``axis`` (None: all axes). At 0 the derivative is 0 (a subgradient), not NaN."""
    x = xp._arr(x)
    if ord == 2:
        sq = xp.real(x * xp.conj(x)) if xp._is_complex(x) else x * x
        return _safe_sqrt(xp.sum(sq, axis=axis, keepdims=keepdims))
    a = xp.abs(x)
    if ord == math.inf:
        return xp.max(a, axis=axis, keepdims=keepdims)
    if ord == -math.inf:
        return xp.min(a, axis=axis, keepdims=keepdims)
    if ord == 1:
        return xp.sum(a, axis=axis, keepdims=keepdims)
    if ord == 0:  # the number of non-zeros: piecewise constant
        return xp.sum(xp.astype(concrete(a) != 0, concrete(a).dtype), axis=axis, keepdims=keepdims)
    total = xp.sum(a ** ord, axis=axis, keepdims=keepdims)
    zero = concrete(total) == 0
    if ord < 0 or not np.any(zero):
        return total ** (1.0 / ord)
    return xp.where(zero, 0, xp.where(zero, 1, total) ** (1.0 / ord))


def matrix_norm(x, /, *, keepdims=False, ord="fro"):  # noqa: A002
    """Matrix norms over the last two axes: 'fro', 'nuc', 1, -1, 2, -2, inf, -inf."""
    x = _matrix(x, "matrix_norm")
    if ord == "fro":
        return vector_norm(x, axis=(-2, -1), keepdims=keepdims)
    if ord in ("nuc", 2, -2):
        s = svdvals(x)
        out = xp.sum(s, axis=-1) if ord == "nuc" else (xp.max(s, axis=-1) if ord == 2 else xp.min(s, axis=-1))
    elif ord in (1, -1):
        col = xp.sum(xp.abs(x), axis=-2)
        out = xp.max(col, axis=-1) if ord == 1 else xp.min(col, axis=-1)
    elif ord in (math.inf, -math.inf):
        row = xp.sum(xp.abs(x), axis=-1)
        out = xp.max(row, axis=-1) if ord == math.inf else xp.min(row, axis=-1)
    else:
        raise ValueError(f"linalg.matrix_norm: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf; got {ord!r}")
    return xp.reshape(out, _shape(out) + (1, 1)) if keepdims else out


def norm(x, /, ord=None, axis=None, keepdims=False):  # noqa: A002
    """NumPy's linalg.norm: a vector norm for 1-D x or an int axis, a matrix norm for 2-D x or two axes."""
    x = xp._arr(x)
    if axis is None and ord is None:
        return vector_norm(x, keepdims=keepdims)
    if axis is None:
        axis = tuple(range(_ndim(x)))
    if isinstance(axis, (int, np.integer)) or len(axis) == 1:
        return vector_norm(x, axis=axis, keepdims=keepdims, ord=2 if ord is None else ord)
    if len(axis) != 2:
        raise ValueError(f"linalg.norm: axis must be an int or a pair; got {axis!r}")
    a1, a2 = (a % _ndim(x) for a in axis)
    rest = [k for k in range(_ndim(x)) if k not in (a1, a2)]
    moved = xp.permute_dims(x, (*rest, a1, a2))
    out = matrix_norm(moved, ord="fro" if ord is None else ord)
    if not keepdims:
        return out
    shape = list(_shape(x))
    shape[a1] = shape[a2] = 1
    return xp.reshape(out, tuple(shape))
