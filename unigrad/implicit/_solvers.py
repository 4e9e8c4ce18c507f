"""The linear solvers behind ``unigrad.linear_solve``, written with the array namespace.

Each solver is ``solver(matvec, b, *, tol, maxiter, rmatvec, backend) -> (x, iterations)``: ``matvec``
maps an array of ``b``'s shape to one of the same shape, ``rmatvec`` is its transpose (used by
``normal_cg`` only). They run on *values* (the rule's primal computation, never differentiated: the
derivative of a solution comes from the implicit rules in ``_linear_solve``), as plain Python loops
whose convergence tests read Python floats. Where a value cannot be read (inside ``vmap``, or a compiled
program: JAX's tracers, TensorFlow's graph tensors) :func:`scalar` raises :class:`NoValue`, and
``_linear_solve`` runs ``"cg"`` / ``"normal_cg"`` as one compiled loop where the backend has one
(:func:`looped_cg`: ``jax.lax.while_loop``) and solves densely otherwise.

The stopping test of the iterative solvers is relative: ``|b - A x| <= tol * |b|`` (2-norms); the
caller checks the true residual afterwards, whatever the solver says.
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from .._api import namespace, to_numpy

__all__ = ["SOLVERS", "NoValue", "scalar", "dot", "norm", "dense_solve", "looped_cg", "no_reads", "reads_allowed"]


class NoValue(NotImplementedError):
    """A value the solvers would read is symbolic (inside ``vmap`` or a compiled program)."""


# True while values must not be read: a derivative pass an enclosing transform differentiates, on an engine
# whose evaluation would cut what it reads off from that transform (MLX). A ContextVar: per thread and task.
_NO_READS: contextvars.ContextVar = contextvars.ContextVar("unigrad_implicit_no_reads", default=False)


@contextlib.contextmanager
def no_reads():
    """Within: :func:`scalar` raises :class:`NoValue`, so the solvers take their symbolic path (the backend's
    compiled loop, else a dense solve; a residual made NaN, never read), as inside a compiled program."""
    token = _NO_READS.set(True)
    try:
        yield
    finally:
        _NO_READS.reset(token)


def reads_allowed() -> bool:
    return not _NO_READS.get()


def scalar(value) -> float:
    """A 0-d array's value as a Python float (the solvers' loop tests need one); :class:`NoValue` where
    it has none (JAX's tracers and TensorFlow's graph tensors, a value inside torch's or MLX's vmap), or
    where values must not be read (:func:`no_reads`)."""
    if _NO_READS.get():
        raise NoValue("linear_solve: no value is read in this derivative pass (no_reads)")
    try:  # float(): a tensor's own read (torch's item(); JAX's, TensorFlow's, MLX's), without a host copy
        return float(value)
    except Exception:
        pass
    try:
        return float(np.asarray(to_numpy(value)))
    except Exception as exc:
        raise NoValue("linear_solve: the iterative solvers are Python loops that read the residual's value, "
                      "which is symbolic here (inside vmap or a compiled program)") from exc


def dot(xp, a, b):
    return xp.sum(a * b)


def norm(xp, a) -> float:
    return float(np.sqrt(max(scalar(dot(xp, a, a)), 0.0)))


def cg(matvec, b, *, tol, maxiter, rmatvec=None, backend=None):
    """Conjugate gradients: ``A`` symmetric positive definite. Stops early (and leaves the residual check
    to fail) when ``p^T A p <= 0``: ``A`` is not positive definite along ``p``."""
    xp = namespace(b)
    bound = tol * norm(xp, b)
    x = xp.zeros_like(b)
    r = b
    p = r
    rs = scalar(dot(xp, r, r))
    k = 0
    while k < maxiter and np.sqrt(rs) > bound:
        ap = matvec(p)
        curvature = scalar(dot(xp, p, ap))
        if not curvature > 0.0:
            break
        alpha = rs / curvature
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = scalar(dot(xp, r, r))
        p = r + (rs_new / rs) * p
        rs = rs_new
        k += 1
    return x, k


def normal_cg(matvec, b, *, tol, maxiter, rmatvec=None, backend=None):
    """Conjugate gradients on the normal equations ``A^T A x = A^T b``: any non-singular ``A`` (slower:
    the condition number is squared)."""
    if rmatvec is None:
        raise ValueError("normal_cg needs the transposed matvec")
    return cg(lambda v: rmatvec(matvec(v)), rmatvec(b), tol=tol, maxiter=maxiter)


def bicgstab(matvec, b, *, tol, maxiter, rmatvec=None, backend=None):
    """BiCGSTAB (van der Vorst): a general square ``A``, no transpose needed."""
    xp = namespace(b)
    bound = tol * norm(xp, b)
    x = xp.zeros_like(b)
    r = b
    r_hat = r
    rho = alpha = omega = 1.0
    v = p = xp.zeros_like(b)
    k = 0
    while k < maxiter and norm(xp, r) > bound:
        rho_new = scalar(dot(xp, r_hat, r))
        if rho_new == 0.0 or omega == 0.0:
            break  # breakdown: the residual check reports it
        beta = (rho_new / rho) * (alpha / omega)
        p = r + beta * (p - omega * v)
        v = matvec(p)
        denominator = scalar(dot(xp, r_hat, v))
        if denominator == 0.0:
            break
        alpha = rho_new / denominator
        s = r - alpha * v
        k += 1
        if norm(xp, s) <= bound:
            x = x + alpha * p
            r = s
            break
        t = matvec(s)
        tt = scalar(dot(xp, t, t))
        omega = scalar(dot(xp, t, s)) / tt if tt > 0.0 else 0.0
        x = x + alpha * p + omega * s
        r = s - omega * t
        rho = rho_new
    return x, k


def gmres(matvec, b, *, tol, maxiter, rmatvec=None, backend=None, restart=30):
    """Restarted GMRES(``restart``): a general square ``A``. Arnoldi with modified Gram-Schmidt; the small
    least-squares problem of each cycle is solved in NumPy (it is a few dozen numbers)."""
    xp = namespace(b)
    bnorm = norm(xp, b)
    bound = tol * bnorm
    size = int(np.prod(_shape(b)))
    m = max(1, min(restart, size))
    x = xp.zeros_like(b)
    k = 0
    while k < maxiter:
        r = b - matvec(x) if k else b
        beta = norm(xp, r)
        if beta <= bound:
            break
        basis = [r / beta]
        h = np.zeros((m + 1, m))
        y = np.zeros(0)
        for j in range(m):
            w = matvec(basis[j])
            k += 1
            for i in range(j + 1):
                h[i, j] = scalar(dot(xp, w, basis[i]))
                w = w - h[i, j] * basis[i]
            h[j + 1, j] = norm(xp, w)
            e1 = np.zeros(j + 2)
            e1[0] = beta
            y = np.linalg.lstsq(h[:j + 2, :j + 1], e1, rcond=None)[0]
            estimate = np.linalg.norm(h[:j + 2, :j + 1] @ y - e1)
            if estimate <= bound or h[j + 1, j] <= 1e-300 or k >= maxiter:
                break
            basis.append(w / h[j + 1, j])
        for i, coefficient in enumerate(y):
            x = x + float(coefficient) * basis[i]
        if h[j + 1, j] <= 1e-300:  # an invariant subspace: x is exact up to rounding (or A is singular)
            break
    return x, k


def _dense(matvec, b, backend):
    """``A`` as a dense ``(n, n)`` matrix (``n = b.size``): ``matvec`` of the ``n`` identity columns.

    ``n`` calls rather than one vectorised Jacobian: a transform nested in a rule's primal computation
    (the Jacobian's) loses second derivatives on MLX (measured: zeros), and the dense solvers are for
    small ``n``."""
    xp = namespace(b)
    size = int(np.prod(_shape(b)))
    identity = xp.eye(size, dtype=b.dtype)
    columns = [xp.reshape(matvec(xp.reshape(identity[i], _shape(b))), (size,)) for i in range(size)]
    return xp.stack(columns, axis=1), size


def looped_cg(matvec, b, *, tol, maxiter, loop):
    """Conjugate gradients as one compiled loop (``loop(cond, body, state) -> state``: the backend's
    ``while_loop``, ``jax.lax.while_loop``), for symbolic values (a compiled program, ``vmap``), where
    :func:`cg`'s Python loop cannot read its residual. Returns ``(x, relative residual |b - A x| / |b|)``
    as arrays: the caller makes a solution that did not converge loud (it cannot raise on a symbolic
    value). Stops where ``p^T A p <= 0`` (``A`` not positive definite along ``p``), as :func:`cg`."""
    xp = namespace(b)
    bb = dot(xp, b, b)
    bound = (tol * tol) * bb
    zero = xp.zeros_like(bb)

    def cond(state):
        x, r, p, rs, k, stopped = state
        return (k < maxiter) & (rs > bound) & (stopped == 0)

    def body(state):
        x, r, p, rs, k, stopped = state
        ap = matvec(p)
        curvature = dot(xp, p, ap)
        good = curvature > zero
        alpha = xp.where(good, rs / xp.where(good, curvature, xp.ones_like(curvature)), zero)
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = dot(xp, r, r)
        beta = rs_new / xp.where(rs > zero, rs, xp.ones_like(rs))
        p = r + beta * p
        return x, r, p, rs_new, k + 1, xp.where(good, stopped, stopped + 1)

    start = (xp.zeros_like(b), b, b, bb, xp.asarray(0), xp.asarray(0))
    x, *_ = loop(cond, body, start)
    residual = xp.sqrt(dot(xp, b - matvec(x), b - matvec(x)) / xp.where(bb > zero, bb, xp.ones_like(bb)))
    return x, residual


def dense_solve(matvec, b, backend=None, symbolic=False):
    """``A`` materialised, then the namespace's ``linalg.solve`` (an LU factorisation); on ``symbolic`` values
    (``vmap``, a compiled program) of a backend whose ``linalg.solve`` does not map (``solve_under_vmap``
    False: MLX), ``linalg.inv(A) @ b``."""
    xp = namespace(b)
    matrix, size = _dense(matvec, b, backend)
    column = xp.reshape(b, (size, 1))
    if symbolic and not getattr(backend, "solve_under_vmap", True):
        x = xp.linalg.inv(matrix) @ column
    else:
        x = xp.linalg.solve(matrix, column)
    return xp.reshape(x, _shape(b))


def lu(matvec, b, *, tol, maxiter, rmatvec=None, backend=None):
    """Dense: ``A`` materialised, then the namespace's ``linalg.solve`` (an LU factorisation)."""
    return dense_solve(matvec, b, backend), 1


def cholesky(matvec, b, *, tol, maxiter, rmatvec=None, backend=None):
    """Dense, ``A`` symmetric positive definite: ``A = L L^T`` by the namespace's ``linalg.cholesky``, then
    two solves with the factors (``linalg.solve``: the Array API has no triangular solve)."""
    xp = namespace(b)
    matrix, size = _dense(matvec, b, backend)
    factor = xp.linalg.cholesky(matrix)
    y = xp.linalg.solve(factor, xp.reshape(b, (size, 1)))
    x = xp.linalg.solve(xp.matrix_transpose(factor) if hasattr(xp, "matrix_transpose") else factor.T, y)
    return xp.reshape(x, _shape(b)), 1


def _shape(a):
    return tuple(int(s) for s in a.shape)


SOLVERS = {"cg": cg, "normal_cg": normal_cg, "gmres": gmres, "bicgstab": bicgstab, "lu": lu, "cholesky": cholesky}
