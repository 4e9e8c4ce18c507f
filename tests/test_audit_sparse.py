"""Audit: a sparse transform's pattern depends on the values of the arrays f is given but not
differentiated with respect to (index arrays, constant matrices, a branch on them). A pattern kept per
signature (shapes and dtypes) was reused for new values: the wrong Jacobian, silently, on every
backend, eager and compiled."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import unigrad


def gather(x, idx):
    return x[idx] ** 2


def matvec(x, a):
    return a @ x


def branch_on_constant(x, w):
    xp = unigrad.namespace(x)
    return x * w if float(w[0]) > 0 else xp.roll(x, 1) * w


def energy(x, a):
    xp = unigrad.namespace(x)
    return xp.sum((a @ x) ** 2)


X = np.arange(1.0, 5.0)
CASES = {
    "gather": (gather, (np.array([0, 1, 2, 3]), np.array([3, 2, 1, 0]), np.array([1, 1, 0, 2]))),
    "matvec": (matvec, (np.diag([1.0, 2.0, 3.0, 4.0]), np.ones((4, 4)))),
    "branch": (branch_on_constant, (np.ones(4), -np.ones(4))),
}


def _check(transform, dense, f, consts, backend, compile):
    sparse = transform(f, backend=backend, compile=compile, format="dense")
    for c in consts:  # one transform, called with new values of the constant argument
        x, cb = unigrad.asarray(X, backend=backend), unigrad.asarray(c, backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = unigrad.to_numpy(sparse(x, cb))
        want = unigrad.to_numpy(dense(f, backend=backend)(x, cb))
        np.testing.assert_allclose(got, want, err_msg=f"constant argument {c.tolist()}")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("compile", [False, True])
def test_sparse_jacobian_pattern_follows_the_values_of_constant_arrays(backend, case, compile):
    name = backend
    f, consts = CASES[case]
    if case == "branch" and compile and name in ("jax", "tensorflow", "mlx"):
        pytest.skip("a Python branch on an array's value cannot be compiled there")
    if name == "tensorflow" and (case != "gather" or compile):
        pytest.skip("TensorFlow's sparse passes are slow to trace; one case covers it")
    _check(unigrad.sparse_jacobian, unigrad.jacobian, f, consts, backend, compile)


@pytest.mark.parametrize("name", ["numpy", "jax"])
@pytest.mark.parametrize("compile", [False, True])
def test_sparse_hessian_pattern_follows_the_values_of_a_constant_matrix(name, compile):
    pytest.importorskip(name)
    _check(unigrad.sparse_hessian, unigrad.hessian, energy, (np.diag([1.0, 2.0, 3.0, 4.0]), np.ones((4, 4))),
           name, compile)


def test_sparse_jacobian_given_pattern_keeps_one_plan():
    """With sparsity=<matrix> nothing depends on the constant's values: one plan for both calls."""
    pattern = np.ones((4, 4), dtype=bool)
    sj = unigrad.sparse_jacobian(matvec, sparsity=pattern)
    plan1 = sj.plan(X, np.eye(4))
    plan2 = sj.plan(X, np.ones((4, 4)))
    assert plan1 is plan2
    np.testing.assert_allclose(sj(X, np.ones((4, 4))).toarray(), np.ones((4, 4)))
