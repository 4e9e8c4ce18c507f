"""Derivative rules for MLX's decompositions, which MLX 0.32 cannot differentiate itself.

Each function here is one ``mx.custom_function``: the forward calls the ``mx.linalg`` primitive on the
CPU, and its ``jvp`` and ``vjp`` are written with differentiable MLX operations and with the other
functions of this module (``inv``, ``solve``, ``eigh``, ``svd``...), so an outer transform
differentiates a rule through those functions' own rules: second and higher order work.

Two MLX details shape the code:

* MLX's forward mode walks the whole graph under a custom function, including the primitive its
  forward calls, and asks that primitive for a JVP it does not have ("[Primitive::jvp] Not implemented
  for Inverse"), although the custom rule replaces it. The forward therefore calls the primitive on
  ``mx.stop_gradient`` of its inputs. ``mx.vmap`` walks that graph too and ignores a custom vmap rule,
  so ``solve`` and ``qr`` cannot be vmapped: MLX's ``LUF`` and ``QRF`` have no vmap (as before these
  rules; the other factorisations have one).
* A custom function's rules see only its inputs (what it closes over is a constant), so the rules
  recompute the factorisation from the primals by calling the function again: its outputs then carry
  the derivatives of outer transforms.

Conventions are unigrad's tape's (docs/tape.md): ``cholesky``, ``eigh`` and ``eigvalsh`` are functions
of the symmetric part (x + x^T) / 2, so their derivatives are symmetric; F_ij = 1 / (w_j - w_i) is 0
where two eigenvalues (squared singular values) are equal; a reciprocal of a zero singular value is 0;
the extra columns of a full U or V (``svd(full_matrices=True)`` of a non-square matrix) follow the
first ones with the minimal rotation. Where the rule is written as a JVP only (``svd``, ``qr``), the
VJP is its transpose, taken with ``mx.vjp`` of the (linear) JVP.
"""

from __future__ import annotations

import mlx.core as mx


def _mT(x):
    return mx.swapaxes(x, -1, -2)


def _sym(x):
    return (x + _mT(x)) / 2


def _eye(n, like):
    return mx.eye(n, dtype=like.dtype)


def _diag(x):
    """The diagonal of the last two axes (a masked sum: ``mx.diagonal``'s VJP dies at zero size)."""
    return mx.sum(x * _eye(x.shape[-1], x), axis=-1)


def _embed(d):
    """Diagonal matrices from the vectors on the last axis."""
    return d[..., :, None] * _eye(d.shape[-1], d)


def _row(v):
    return v[..., None, :]


def _col(v):
    return v[..., :, None]


def _inverse_gaps(w):
    """F_ij = 1 / (w_j - w_i), 0 on the diagonal and where w_i == w_j (no inf * 0 in its derivative)."""
    d = _row(w) - _col(w)
    same = d == 0
    return mx.where(same, mx.zeros_like(d), 1 / mx.where(same, mx.ones_like(d), d))


def _safe_reciprocal(s):
    zero = s == 0
    return mx.where(zero, mx.zeros_like(s), 1 / mx.where(zero, mx.ones_like(s), s))


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _one(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _cotangents(cotangents, outputs):
    """The cotangents as a tuple, zeros for the outputs that have none."""
    return tuple(mx.zeros_like(o) if c is None else c
                 for c, o in zip(_tuple(cotangents), _tuple(outputs), strict=True))


def _transpose(jvp_rule, primal, cotangents, outputs):
    """The VJP of a one-input function from its JVP rule (linear in the tangent): mx.vjp of the rule."""
    cts = _cotangents(cotangents, outputs)
    _, (out,) = mx.vjp(lambda t: list(_tuple(jvp_rule(primal, t))), [mx.zeros_like(primal)], list(cts))
    return out


def _cpu(fn, *arrays, **kwargs):
    """``fn`` on the CPU at constant inputs (see the module docstring)."""
    return fn(*(mx.stop_gradient(a) for a in arrays), **kwargs, stream=mx.cpu)


# -------------------------------------------------------------------- inverses

@mx.custom_function
def inv(a):
    return _cpu(mx.linalg.inv, a)


@inv.jvp
def _inv_jvp(primals, tangents):
    y = inv(_one(primals))
    return -(y @ _one(tangents) @ y)


@inv.vjp
def _inv_vjp(primals, cotangents, outputs):
    yt = _mT(inv(_one(primals)))
    return -(yt @ _one(cotangents) @ yt)


@mx.custom_function
def solve(a, b):
    """A^-1 B for square A (..., n, n) and B (..., n, k) of the same batch shape."""
    return _cpu(mx.linalg.solve, a, b)


@solve.jvp
def _solve_jvp(primals, tangents):
    a, b = primals
    da, db = tangents
    if da is None and db is None:
        return mx.zeros_like(b)
    x = solve(a, b)
    rhs = -(da @ x) if db is None else (db if da is None else db - da @ x)
    return solve(a, rhs)


@solve.vjp
def _solve_vjp(primals, cotangents, outputs):
    a, b = primals
    b_bar = solve(_mT(a), _one(cotangents))
    return -(b_bar @ _mT(solve(a, b))), b_bar



# -------------------------------------------------------------------- symmetric matrices

def _phi(m):
    """The lower triangle with the diagonal halved."""
    return mx.tril(m) - m * _eye(m.shape[-1], m) / 2


@mx.custom_function
def cholesky(a):
    """The lower Cholesky factor of the symmetric part of a."""
    return mx.linalg.cholesky(_sym(mx.stop_gradient(a)), stream=mx.cpu)


@cholesky.jvp
def _cholesky_jvp(primals, tangents):
    low = cholesky(_one(primals))
    low_inv = inv(low)
    return low @ _phi(low_inv @ _sym(_one(tangents)) @ _mT(low_inv))


@cholesky.vjp
def _cholesky_vjp(primals, cotangents, outputs):
    low = cholesky(_one(primals))
    low_inv = inv(low)
    return _sym(_mT(low_inv) @ _phi(_mT(low) @ _one(cotangents)) @ low_inv)


@mx.custom_function
def eigh(a):
    """Eigenvalues (ascending) and eigenvectors of the symmetric part of a."""
    return mx.linalg.eigh(_sym(mx.stop_gradient(a)), stream=mx.cpu)


@eigh.jvp
def _eigh_jvp(primals, tangents):
    w, v = eigh(_one(primals))
    p = _mT(v) @ _sym(_one(tangents)) @ v
    return _diag(p), v @ (_inverse_gaps(w) * p)


@eigh.vjp
def _eigh_vjp(primals, cotangents, outputs):
    w, v = eigh(_one(primals))
    w_bar, v_bar = _cotangents(cotangents, outputs)
    inner = _embed(w_bar) + _inverse_gaps(w) * (_mT(v) @ v_bar)
    return _sym(v @ inner @ _mT(v))


@mx.custom_function
def eigvalsh(a):
    """The eigenvalues alone: their rules need no eigenvalue gaps (no 1 / 0 at repeated ones)."""
    return mx.linalg.eigvalsh(_sym(mx.stop_gradient(a)), stream=mx.cpu)


@eigvalsh.jvp
def _eigvalsh_jvp(primals, tangents):
    _, v = eigh(_one(primals))
    return _diag(_mT(v) @ _sym(_one(tangents)) @ v)


@eigvalsh.vjp
def _eigvalsh_vjp(primals, cotangents, outputs):
    _, v = eigh(_one(primals))
    return _sym((v * _row(_one(cotangents))) @ _mT(v))


# -------------------------------------------------------------------- svd and qr

def _make_svd(full_matrices):
    @mx.custom_function
    def svd(a):
        u, s, vh = _cpu(mx.linalg.svd, a)  # MLX's U and V^H are always the full ones
        if full_matrices:
            return u, s, vh
        k = s.shape[-1]
        return u[..., :, :k], s, vh[..., :k, :]

    def jvp_rule(a, t):
        """With P = U^T dA V: dS = diag(P); U^T dU = F o (P S + S P^T); V^T dV = F o (S P + P^T S),
        F_ij = 1 / (s_j^2 - s_i^2); plus the parts outside span(U) / span(V) of a non-square A (JAX's
        svd_jvp_rule, unigrad's tape's _svd_jvp)."""
        m, n = a.shape[-2:]
        k = min(m, n)
        u_all, s, vh_all = svd(a)
        u, vh = u_all[..., :, :k], vh_all[..., :k, :]
        v = _mT(vh)
        tv = t @ v
        p = _mT(u) @ tv
        ph = _mT(p)
        f = _inverse_gaps(s * s)
        du = u @ (f * (p * _row(s) + _col(s) * ph))
        dv = v @ (f * (_col(s) * p + ph * _row(s)))
        inv_s = _row(_safe_reciprocal(s))
        if m > k:
            du = du + (tv - u @ p) * inv_s
        if n > k:
            dv = dv + (_mT(t) @ u - v @ ph) * inv_s
        if full_matrices and m > k:  # the extra columns follow U with the minimal rotation
            du = mx.concatenate([du, -(u @ (_mT(du) @ u_all[..., :, k:]))], axis=-1)
        if full_matrices and n > k:
            dv = mx.concatenate([dv, -(v @ (_mT(dv) @ _mT(vh_all[..., k:, :])))], axis=-1)
        return du, _diag(p), _mT(dv)

    svd.jvp(lambda primals, tangents: jvp_rule(_one(primals), _one(tangents)))
    svd.vjp(lambda primals, cotangents, outputs: _transpose(jvp_rule, _one(primals), cotangents, outputs))
    return svd


svd_reduced = _make_svd(False)
svd_full = _make_svd(True)


@mx.custom_function
def svdvals(a):
    """The singular values alone: their rules need no gaps between them."""
    return _cpu(mx.linalg.svd, a, compute_uv=False)


@svdvals.jvp
def _svdvals_jvp(primals, tangents):
    u, _, vh = svd_reduced(_one(primals))
    return _diag(_mT(u) @ _one(tangents) @ _mT(vh))


@svdvals.vjp
def _svdvals_vjp(primals, cotangents, outputs):
    u, _, vh = svd_reduced(_one(primals))
    return u @ (_col(_one(cotangents)) * vh)


@mx.custom_function
def qr(a):
    """Reduced QR (MLX's only mode): Q (..., m, k), R (..., k, n), k = min(m, n)."""
    return _cpu(mx.linalg.qr, a)


def _qr_square_rule(t, q, r):
    """Tangents of A = QR with R square and invertible: C = Q^T dA R^-1, Q^T dQ = Omega (the strictly
    lower part of C, mirrored to skew-symmetric), dR = (C - Omega) R."""
    t_rinv = _mT(solve(_mT(r), _mT(t)))
    c = _mT(q) @ t_rinv
    low = mx.tril(c, -1)
    upper = c - (low - _mT(low))
    return t_rinv - q @ upper, upper @ r


def _qr_jvp_rule(a, t):
    m, n = a.shape[-2:]
    q, r = qr(a)
    if m >= n:
        return _qr_square_rule(t, q, r)
    # A = [X Y] with X square: Q R_X = X, R = [R_X, Q^T Y]
    dq, dr_x = _qr_square_rule(t[..., :, :m], q, r[..., :, :m])
    dr_y = _mT(dq) @ a[..., :, m:] + _mT(q) @ t[..., :, m:]
    return dq, mx.concatenate([dr_x, dr_y], axis=-1)


qr.jvp(lambda primals, tangents: _qr_jvp_rule(_one(primals), _one(tangents)))
qr.vjp(lambda primals, cotangents, outputs: _transpose(_qr_jvp_rule, _one(primals), cotangents, outputs))


# -------------------------------------------------------------------- pinv

def make_pinv(rtol):
    """The pseudo-inverse cutting singular values below ``rtol`` times the largest (None: the standard's
    max(m, n) * eps); its derivative assumes the rank is locally constant (Golub and Pereyra)."""

    @mx.custom_function
    def pinv(a):
        u, s, vh = _cpu(mx.linalg.svd, a)
        m, n = a.shape[-2:]
        k = min(m, n)
        tol = max(m, n) * mx.finfo(a.dtype).eps if rtol is None else rtol
        cutoff = tol * mx.max(s, axis=-1, keepdims=True) if k else s
        s_inv = mx.where(s > cutoff, 1 / mx.where(s > cutoff, s, mx.ones_like(s)), mx.zeros_like(s))
        return _mT(vh[..., :k, :]) @ (_col(s_inv) * _mT(u[..., :, :k]))

    @pinv.jvp
    def _pinv_jvp(primals, tangents):
        """dA+ = -A+ dA A+ + A+ A+^T dA^T (I - A A+) + (I - A+ A) dA^T A+^T A+."""
        a, t = _one(primals), _one(tangents)
        y = pinv(a)
        m, n = a.shape[-2:]
        th = _mT(t)
        return (-(y @ t @ y) + (y @ _mT(y)) @ th @ (_eye(m, a) - a @ y)
                + (_eye(n, a) - y @ a) @ th @ (_mT(y) @ y))

    @pinv.vjp
    def _pinv_vjp(primals, cotangents, outputs):
        a, g = _one(primals), _one(cotangents)
        y = pinv(a)
        m, n = a.shape[-2:]
        gt = _mT(g)
        return (-(_mT(y) @ g @ _mT(y)) + (_eye(m, a) - a @ y) @ gt @ (y @ _mT(y))
                + (_mT(y) @ y) @ gt @ (_eye(n, a) - y @ a))

    return pinv
