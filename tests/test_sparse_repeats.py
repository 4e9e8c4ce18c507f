"""Repeat calls of the sparse transforms: a compiled call that repeats a signature goes straight to its
program (``unigrad.sparse._transforms._Repeats``, a ``unigrad._repeats.Repeats``) and everything that decided
the plan or the program makes it miss -- shape, dtype, backend, and the exact value of a Python scalar
(a sparse transform keeps scalars static: the pattern of ``roll(x, 1)`` is not that of ``roll(x, 2)``);
and an eager TensorFlow call traces its compressed passes once per signature, not on every call.

Each miss is checked against a fresh, uncached transform's result, so a wrong hit would show as a wrong
number; each hit is checked to happen, so the tests cannot pass by never taking the fast path.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

sparse = pytest.importorskip("scipy.sparse")

import unigrad  # noqa: E402

from conftest import Counted, uncached  # noqa: E402

CACHED = pytest.mark.skipif(os.environ.get("UNIGRAD_NO_CACHE") is not None, reason="counts what the caches keep")
HAVE = {m: importlib.util.find_spec(m) is not None for m in ("jax", "tensorflow")}


def shifted(x, k, c):
    """Row i reads x[i] and x[i - k]: the pattern depends on the int k (detected once per value)."""
    xp = unigrad.namespace(x)
    return c * xp.sin(x) * xp.roll(x, k)


def dense(matrix):
    if type(matrix).__name__ == "SparseTensor":
        import tensorflow as tf

        matrix = tf.sparse.to_dense(matrix)
    if type(matrix).__name__ == "BCOO":  # (its todense() outside x64 would be float32)
        values, pairs = np.asarray(matrix.data), np.asarray(matrix.indices)
        out = np.zeros(matrix.shape, dtype=values.dtype)
        out[pairs[:, 0], pairs[:, 1]] = values
        return out
    if hasattr(matrix, "todense"):  # scipy
        matrix = matrix.todense()
    return unigrad.to_numpy(matrix)


def fresh(args, **options):
    with uncached():
        return dense(unigrad.sparse_jacobian(shifted, **options)(*args))


def check(got, want):
    got = dense(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)


@CACHED
@pytest.mark.skipif(not HAVE["jax"], reason="jax not installed")
def test_compiled_sparse_repeat_takes_the_fast_path_and_misses_on_any_change(repeat_hits):
    jac = unigrad.sparse_jacobian(shifted, backend="jax", compile=True)
    x = unigrad.asarray(np.linspace(-1.0, 1.2, 9), backend="jax")  # float64 (JAX's own x * 2.0 would be float32)
    first = (x, 1, 0.5)
    check(jac(*first), fresh(first, backend="jax"))
    again = (unigrad.asarray(np.linspace(-2.0, 2.4, 9), backend="jax"), 1, 0.5)  # new values, the same signature: the program, straight
    got = jac(*again)
    assert repeat_hits == [False, True]
    assert type(got).__name__ == "BCOO"
    check(got, fresh(again, backend="jax"))
    changed = {
        "int value": (x, 2, 0.5),  # another pattern: a hit would return roll(x, 1)'s non-zeros
        "float value": (x, 1, -0.0),
        "shape": (unigrad.asarray(np.linspace(-1.0, 1.2, 11), backend="jax"), 1, 0.5),
        "dtype": (unigrad.asarray(np.linspace(-1.0, 1.2, 9).astype(np.float32), backend="jax"), 1, 0.5),
    }
    for what, args in changed.items():
        del repeat_hits[:]
        got = jac(*args)
        assert repeat_hits == [False], what
        check(got, fresh(args, backend="jax"))
    del repeat_hits[:]
    jac(x, 2, 0.5)  # a changed signature is remembered in its turn
    assert repeat_hits == [True]


@CACHED
@pytest.mark.skipif(not HAVE["jax"], reason="jax not installed")
def test_compiled_sparse_repeat_follows_the_backend_chosen_now(repeat_hits):
    jac = unigrad.sparse_jacobian(shifted, compile=True)  # no backend=: chosen on every call
    x = np.linspace(-1.0, 1.2, 7)
    with unigrad.use_backend("jax"):
        jac(x, 1, 0.5)
        got = jac(x + 1.0, 1, 0.5)  # NumPy arguments: converted on the repeat path too
    assert repeat_hits == [False, True]
    check(got, fresh((x + 1.0, 1, 0.5), backend="jax"))
    got = jac(x, 1, 0.5)  # the NumPy tape now: not the JAX program
    assert repeat_hits[-1] is False and isinstance(got, sparse.csr_array)
    check(got, fresh((x, 1, 0.5), backend="numpy"))


@CACHED
@pytest.mark.skipif(not HAVE["jax"], reason="jax not installed")
def test_compiled_sparse_repeat_with_aux_and_hessian(repeat_hits):
    def with_aux(x):
        xp = unigrad.namespace(x)
        return xp.sum(x[1:] * x[:-1] ** 2), {"n": 3, "sum": xp.sum(x)}

    hess = unigrad.sparse_hessian(with_aux, has_aux=True, backend="jax", compile=True)
    x = np.linspace(-1.0, 1.2, 6)
    hess(unigrad.asarray(x, backend="jax"))
    h, aux = hess(unigrad.asarray(2.0 * x, backend="jax"))
    assert repeat_hits == [False, True]
    want = unigrad.hessian(lambda x: with_aux(x)[0])(2.0 * x)
    np.testing.assert_allclose(dense(h), want, rtol=1e-12)
    assert aux["n"] == 3 and float(unigrad.to_numpy(aux["sum"])) == pytest.approx(float(np.sum(2.0 * x)))


@CACHED
@pytest.mark.skipif(not HAVE["tensorflow"], reason="tensorflow not installed")
def test_tensorflow_eager_sparse_passes_are_traced_once_per_signature():
    counted = Counted(shifted)
    jac = unigrad.sparse_jacobian(counted, backend="tensorflow")  # eager
    rng = np.random.default_rng(0)
    x = rng.standard_normal(8)
    check(jac(x, 1, 0.5), fresh((x, 1, 0.5), backend="numpy"))
    after_first = counted.calls
    for _ in range(3):
        x = rng.standard_normal(8)
        check(jac(x, 1, 0.5), fresh((x, 1, 0.5), backend="numpy"))
    assert counted.calls == after_first  # one trace for the signature, not one per call
    check(jac(x, 2, 0.5), fresh((x, 2, 0.5), backend="numpy"))  # another signature: traced anew
    assert counted.calls > after_first

    def reads_a_value(x, k, c):  # TensorFlow's vectorised passes trace f, which cannot read values there: the
        # trace's failure is not hidden, and the eager rerun maps what pfor cannot vectorise one element at a
        # time (a SlowMapWarning): the right matrix, never a wrong one
        return shifted(x, k, c) * float(unigrad.to_numpy(unigrad.namespace(x).sum(x * 0.0)) + 1.0)

    reads = unigrad.sparse_jacobian(reads_a_value, sparsity=fresh((x, 1, 0.5), backend="numpy") != 0,
                                    backend="tensorflow")
    try:
        got = reads(x, 1, 0.5)
    except TypeError as exc:  # (or what an eager call of such f raises)
        assert "symbolic" in str(exc)
    else:
        check(got, fresh((x, 1, 0.5), backend="numpy"))
