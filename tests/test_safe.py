"""unigrad.safe_where and unigrad.safe_norm: finite derivatives where the plain forms give NaN, the
exact derivative elsewhere, on every installed backend and to second order."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import unigrad
from unigrad.testing import check_grads

# held to float64 (rtol 1e-15): skipped on a backend that computes no float64 (conftest)
FLOAT64_TESTS = ("test_safe_where_gradient_is_finite_where_the_single_where_is_nan",
                 "test_safe_where_passes_the_derivative_checks_on_both_branches",
                 "test_safe_norm_has_a_zero_derivative_at_zero_and_the_exact_one_elsewhere")



def _np(x):
    return np.asarray(unigrad.to_numpy(x))


def value(f, x, backend):
    """f(x) through a transform (on JAX, float64 is computed in float64 only inside unigrad's calls)."""
    return _np(unigrad.vjp(f, x, backend=backend)[0])


def safe_log(x):
    xp = unigrad.namespace(x)
    return unigrad.safe_where(x > 0, x, xp.log, 0.0)


def trap_log(x):  # the classic trap: the same value, a NaN gradient at 0
    xp = unigrad.namespace(x)
    return xp.where(x > 0, xp.log(x), 0.0 * x)


def test_safe_where_gradient_is_finite_where_the_single_where_is_nan(backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the tape's log(0) in the trap
        assert np.isnan(_np(unigrad.grad(trap_log, backend=backend)(0.0)))
    assert _np(unigrad.grad(safe_log, backend=backend)(0.0)) == 0.0
    assert _np(unigrad.grad(safe_log, backend=backend)(2.0)) == 0.5
    assert _np(unigrad.hessian(safe_log, backend=backend)(0.0)) == 0.0
    assert _np(unigrad.hessian(safe_log, backend=backend)(2.0)) == -0.25
    x = np.array([-1.0, 0.0, 2.0, 4.0])
    total = lambda x: unigrad.namespace(x).sum(safe_log(x))  # noqa: E731
    np.testing.assert_allclose(_np(unigrad.jacobian(safe_log, backend=backend)(x)),
                               np.diag([0.0, 0.0, 0.5, 0.25]), rtol=1e-15)
    np.testing.assert_allclose(value(safe_log, x, backend), [0, 0, np.log(2), np.log(4)],
                               rtol=1e-15)
    np.testing.assert_allclose(_np(unigrad.hvp(total, (x,), (np.ones(4),), backend=backend)[0]),
                               [0.0, 0.0, -0.25, -1 / 16], rtol=1e-15)


def test_safe_where_passes_the_derivative_checks_on_both_branches(backend):
    def f(x):
        xp = unigrad.namespace(x)
        # log(1 - x) is infinite at the fill 1.0: it needs fill_true; sqrt(-x) on the other side
        return unigrad.safe_where(x < 1, x, lambda v: xp.log(1 - v), lambda v: xp.sqrt(v - 0.5),
                                  fill_true=0.0, fill_false=2.0)

    x = np.array([-0.7, 0.3, 1.6, 2.5])
    check_grads(f, (x,), backend=backend, order=2)
    g = _np(unigrad.grad(lambda x: unigrad.namespace(x).sum(f(x)), backend=backend)(np.array([1.0, 0.5])))
    np.testing.assert_allclose(g, [1 / (2 * np.sqrt(0.5)), -2.0], rtol=1e-15)  # at 1.0: the sqrt branch
    np.testing.assert_allclose(value(f, x, backend),
                               [np.log(1.7), np.log(0.7), np.sqrt(1.1), np.sqrt(2.0)], rtol=1e-15)


def test_safe_norm_has_a_zero_derivative_at_zero_and_the_exact_one_elsewhere(backend):
    norm = lambda x: unigrad.safe_norm(x)  # noqa: E731
    np.testing.assert_array_equal(_np(unigrad.grad(norm, backend=backend)(np.zeros(3))), np.zeros(3))
    np.testing.assert_array_equal(_np(unigrad.hessian(norm, backend=backend)(np.zeros(2))), np.zeros((2, 2)))
    np.testing.assert_allclose(_np(unigrad.grad(norm, backend=backend)(np.array([3.0, 4.0]))), [0.6, 0.8],
                               rtol=1e-15)
    check_grads(norm, (np.array([0.3, -1.2, 2.0]),), backend=backend, order=2)
    # per-row norms, a zero row among them
    rows = np.array([[0.0, 0.0], [3.0, 4.0], [1e-3, 0.0]])
    row_norms = lambda x: unigrad.safe_norm(x, axis=1)  # noqa: E731
    np.testing.assert_allclose(value(row_norms, rows, backend), [0.0, 5.0, 1e-3], rtol=1e-15)
    total = lambda x: unigrad.namespace(x).sum(row_norms(x))  # noqa: E731
    np.testing.assert_allclose(_np(unigrad.grad(total, backend=backend)(rows)),
                               [[0.0, 0.0], [0.6, 0.8], [1.0, 0.0]], rtol=1e-15)
    kept = value(lambda x: unigrad.safe_norm(x, axis=(0, 1), keepdims=True), rows, backend)
    assert kept.shape == (1, 1)
    np.testing.assert_allclose(kept, [[np.sqrt(25 + 1e-6)]], rtol=1e-15)
    assert value(lambda x: unigrad.safe_norm(x, ord=1), np.array([3.0, -4.0]), backend) == 7.0
