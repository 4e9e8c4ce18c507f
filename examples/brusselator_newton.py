"""A sparse Jacobian in a Newton solve: one implicit Euler step of the 2-D Brusselator.

The Brusselator is a reaction-diffusion system of two species u and v on an N x N periodic grid.
Its right-hand side F has 2 N^2 unknowns, but each equation reads only 6 of them (a 5-point
Laplacian stencil and the other species at the same point): the Jacobian is almost all zeros.
``unigrad.sparse_jacobian`` finds that pattern by tracing F once (``unigrad.jacobian_sparsity``),
colours its columns so that one JVP per colour (about ten, whatever N) gives every non-zero, and
returns a ``scipy.sparse`` matrix that ``spsolve`` takes directly.

Run it:    python examples/brusselator_newton.py [backend]
"""

import sys

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import spsolve

import unigrad

A, B, ALPHA = 3.4, 1.0, 10.0


def brusselator(x, N):
    """The right-hand side F(x) of the 2-D Brusselator; x holds u then v, each N x N, flattened."""
    xp = unigrad.namespace(x)
    a = ALPHA * (N - 1) ** 2  # alpha / dx^2 on the unit square
    u, v = xp.reshape(x[:N * N], (N, N)), xp.reshape(x[N * N:], (N, N))

    def laplacian(w):  # periodic 5-point stencil
        return (xp.roll(w, 1, axis=0) + xp.roll(w, -1, axis=0) + xp.roll(w, 1, axis=1) + xp.roll(w, -1, axis=1)
                - 4.0 * w)

    du = a * laplacian(u) + B + u * u * v - (A + 1.0) * u
    dv = a * laplacian(v) + A * u - u * u * v
    return xp.concat([xp.reshape(du, (-1,)), xp.reshape(dv, (-1,))])


def brusselator_pattern(N):
    """The Jacobian's pattern, written out from the stencil (2 N^2 x 2 N^2, 6 non-zeros a row): what
    detection finds (main checks it), and what to pass as ``sparsity=`` to skip detection."""
    shift = sparse.csr_array(np.roll(np.eye(N, dtype=bool), 1, axis=1))
    ring = sparse.eye_array(N, dtype=bool) + shift + shift.T  # a point and its two periodic neighbours
    eye = sparse.eye_array(N, dtype=bool)
    stencil = sparse.kron(ring, eye) + sparse.kron(eye, ring)  # the 5-point stencil
    same = sparse.eye_array(N * N, dtype=bool)  # each species reads the other at the same point
    return sparse.csr_array(sparse.block_array([[stencil, same], [same, stencil]]), dtype=bool)


def initial_state(N):
    grid = np.linspace(0.0, 1.0, N)
    x, y = np.meshgrid(grid, grid, indexing="ij")
    return np.concatenate([(22.0 * (y * (1 - y)) ** 1.5).ravel(), (27.0 * (x * (1 - x)) ** 1.5).ravel()])


def implicit_euler_step(state, N, dt, backend=None, tol=1e-10, max_steps=20):
    """Solve G(x) = x - state - dt F(x) = 0 by Newton's method with the sparse Jacobian I - dt J_F."""
    jacobian = unigrad.sparse_jacobian(brusselator, backend=backend,  # the pattern detected once, then reused
                                       format="scipy",  # scipy.sparse on any backend, for spsolve
                                       compile=True)  # one program (jax.jit, tf.function) for every step
    rhs = unigrad.vmap(lambda x: brusselator(x, N), backend=backend)  # F on the backend (batch of one)
    eye = sparse.eye_array(2 * N * N, format="csr")
    x, history = state.copy(), []
    for _ in range(max_steps):
        residual = x - state - dt * np.asarray(unigrad.to_numpy(rhs(x[None])))[0]
        history.append(float(np.max(np.abs(residual))))
        if history[-1] < tol:
            break
        x = x + spsolve(sparse.csc_array(eye - dt * jacobian(x, N)), -residual)
    return x, history, jacobian.plan(x, N)


def main(backend=None):
    N, dt = 16, 1e-3
    state = initial_state(N)
    # detection finds exactly the stencil's pattern ...
    assert (unigrad.jacobian_sparsity(brusselator, state, N) != brusselator_pattern(N)).nnz == 0
    # ... and the sparse Jacobian is the dense one, which takes 2 N^2 = 512 JVPs instead of a handful
    jac = unigrad.sparse_jacobian(brusselator, backend=backend, format="scipy")
    dense = np.asarray(unigrad.to_numpy(unigrad.jacobian(brusselator, backend=backend)(state, N)))
    np.testing.assert_allclose(jac(state, N).toarray(), dense, rtol=1e-12, atol=1e-9)

    x, history, plan = implicit_euler_step(state, N, dt, backend)
    print(f"{backend or 'numpy'}: {len(history) - 1} Newton steps, residuals "
          f"{' '.join(f'{r:.1e}' for r in history)}; {plan.n_colors} colours ({plan.mode}) for "
          f"{2 * N * N} unknowns, {plan.nnz} non-zeros")
    assert history[-1] < 1e-10 and len(history) <= 6, history  # Newton converges quadratically
    assert plan.n_colors <= 12, plan


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
