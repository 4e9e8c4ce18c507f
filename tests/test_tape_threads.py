"""The tape's small matrix products run on one BLAS thread, and the user's thread count is restored."""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from unigrad.tape import _blas

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads():
    return [lib.get_num_threads() for lib in _blas._blas_libraries()]


@pytest.mark.parametrize("shape_a, shape_b", [((256, 32), (32, 64)), ((3, 40, 50), (50, 60)), ((2, 3), (3,)),
                                              ((700, 700), (700, 700))])
def test_products_are_numpys_and_the_thread_count_is_restored(shape_a, shape_b):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
    before = _blas_threads()
    np.testing.assert_allclose(_blas.matmul(a, b), np.matmul(a, b), rtol=1e-12, atol=1e-12)
    assert _blas_threads() == before


def test_a_small_product_runs_on_one_thread_and_restores_the_users_setting():
    if not _blas._blas_libraries():
        pytest.skip("no BLAS library threadpoolctl can control")
    seen = []
    real = np.matmul

    class Spy:  # records the BLAS thread count while the product runs
        def __call__(self, a, b):
            seen.append(_blas_threads())
            return real(a, b)

    a, b = np.ones((256, 32)), np.ones((32, 64))
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        _blas.np = type("np", (), {"matmul": Spy(), "shape": staticmethod(np.shape), "prod": staticmethod(np.prod),
                                   "int64": np.int64})
        try:
            _blas.matmul(a, b)
        finally:
            _blas.np = np
        assert _blas_threads() == before
    assert all(n == 1 for n in seen[0])


def test_the_tapes_jacobian_uses_it():
    w = np.random.default_rng(1).standard_normal((32, 64))
    x = np.random.default_rng(2).standard_normal((256, 32))
    before = _blas_threads()
    jac = unigrad.batched_jacobian(lambda w, x: unigrad.namespace(x).tanh(x @ w), argnums=1)(w, x)
    h = np.tanh(x @ w)
    np.testing.assert_allclose(jac, (1 - h * h)[:, :, None] * w.T[None], rtol=1e-12, atol=1e-12)
    assert _blas_threads() == before
