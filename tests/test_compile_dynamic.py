"""compile=True and Python numbers: floats are dynamic, weakly typed inputs of the compiled program.

A new step size must reuse the program (no trace, no compile), give exactly what the eager call and a
fresh transform give for that value, and keep the eager call's dtype (``x32 * c`` stays float32) on
every backend. Ints, bools and floats named in ``static_argnums`` stay static (one program per value);
an argument that forces many programs is named in one warning.
"""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

import unigrad
from conftest import Counted  # noqa: E402

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax", "tensorflow")}
BACKENDS = ["numpy"] + [name for name, ok in HAVE.items() if ok]
COMPILERS = [name for name in ("jax", "tensorflow") if HAVE[name]]


def _np(tree):
    return unigrad.to_numpy(tree)


def scaled_loss(x, c):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x * c) * c + c * c * x)


VALUES = [0.5, -1.25, 3.0, -0.0]


@pytest.mark.parametrize("bk", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_new_float_reuses_the_program_and_gives_the_eager_result(bk, dtype):
    x = unigrad.asarray(np.linspace(0.1, 1.0, 5).astype(dtype), backend=bk)
    f = Counted(scaled_loss)
    compiled = unigrad.grad(f, backend=bk, compile=True)
    for k, c in enumerate(VALUES):
        got = compiled(x, c)
        want = unigrad.grad(scaled_loss, backend=bk)(x, c)  # eager
        assert _np(got).dtype == np.dtype(dtype) == _np(want).dtype  # x32 * c stays float32
        if k in (1, 3):  # a new transform builds its program for this value: the cached one must agree
            fresh = unigrad.grad(scaled_loss, backend=bk, compile=True)(x, c)
            np.testing.assert_array_equal(_np(got), _np(fresh))
        tol = 2e-6 if dtype == "float32" else 1e-15
        np.testing.assert_allclose(_np(got), _np(want), rtol=tol, atol=tol)
    if bk in COMPILERS:
        assert f.calls <= 2, f"{f.calls} traces for {len(VALUES)} values: a new float built a new program"
    else:  # eager backends run f on every call
        assert f.calls == len(VALUES)


@pytest.mark.parametrize("bk", COMPILERS)
def test_negative_zero_is_not_positive_zero(bk):
    def signed(x, s):
        xp = unigrad.namespace(x)
        return xp.sum(x * xp.copysign(xp.ones_like(x), s * xp.ones_like(x)))

    g = unigrad.grad(signed, backend=bk, compile=True)
    np.testing.assert_array_equal(_np(g(np.ones(2), 0.0)), [1, 1])
    np.testing.assert_array_equal(_np(g(np.ones(2), -0.0)), [-1, -1])
    np.testing.assert_array_equal(_np(g(np.ones(2), 0.0)), [1, 1])


@pytest.mark.parametrize("bk", BACKENDS)
def test_weak_scalars_keep_the_arrays_dtype_through_arithmetic(bk):
    def f(x, c):
        xp = unigrad.namespace(x)
        k = (2.0 * c - 1.0) / (c + 3.0) ** 2  # numbers with numbers: still a weak number
        return xp.sum(x * k + xp.multiply(c, x) - x / c), k * x[0]

    x = np.linspace(0.5, 1.5, 4).astype(np.float32)
    for compile in (False, True):
        g = unigrad.value_and_grad(f, backend=bk, compile=compile, has_aux=True)
        for c in (0.75, 2.5):
            (value, aux), grad = g(x, c)
            assert _np(value).dtype == _np(grad).dtype == _np(aux).dtype == np.float32, (compile, c)
            k = (2.0 * c - 1.0) / (c + 3.0) ** 2
            np.testing.assert_allclose(_np(grad), k + c - 1.0 / c, rtol=1e-5)


@pytest.mark.parametrize("bk", COMPILERS)
def test_complex_numbers_are_dynamic_too(bk):
    f = Counted(lambda z, c: unigrad.namespace(z).sum(unigrad.namespace(z).real(z * c)))
    g = unigrad.grad(f, backend=bk, compile=True)
    z = np.array([1.0 + 1.0j, 2.0 - 0.5j], np.complex64)
    for c in (1.0 + 2.0j, -0.5 + 0.25j, 3.0 - 1.0j):
        got = g(z, c)
        assert _np(got).dtype == np.complex64
        want = unigrad.grad(f.fn, backend=bk)(z, c)
        np.testing.assert_allclose(_np(got), _np(want), rtol=1e-6)
    assert f.calls <= 2


@pytest.mark.parametrize("bk", COMPILERS)
def test_floats_inside_pytrees_are_dynamic(bk):
    def f(x, config):
        xp = unigrad.namespace(x)
        return xp.sum(x * config["scale"]) + config["shift"] * xp.sum(x * x)

    counted = Counted(f)
    g = unigrad.grad(counted, backend=bk, compile=True)
    x = np.arange(3.0)
    for scale, shift in ((1.0, 0.5), (2.0, -1.0), (0.25, 4.0)):
        cfg = {"scale": scale, "shift": shift, "name": "run"}
        np.testing.assert_allclose(_np(g(x, cfg)), scale + 2 * shift * x, rtol=1e-12)
    assert counted.calls <= 2


@pytest.mark.parametrize("bk", COMPILERS)
def test_ints_and_bools_stay_static(bk):
    def pick(x, k, flip):
        xp = unigrad.namespace(x)
        row = x[k]  # an int that indexes: a constant of the program
        return xp.sum(row ** 2) * (-1.0 if flip else 1.0)  # a bool used in Python

    g = unigrad.grad(pick, backend=bk, compile=True)
    x = np.arange(6.0).reshape(3, 2)
    for k in range(3):
        for flip in (False, True):
            want = np.zeros((3, 2))
            want[k] = 2 * x[k] * (-1.0 if flip else 1.0)
            np.testing.assert_array_equal(_np(g(x, k, flip)), want)


@pytest.mark.parametrize("bk", COMPILERS)
def test_static_argnums_and_argnames_keep_a_float_static(bk):
    def branchy(x, c):
        xp = unigrad.namespace(x)
        return xp.sum(x ** 2) * c if c > 0 else xp.sum(x ** 3)  # the float's value used in Python

    x = np.array([1.0, 2.0])
    for kwargs in ({"static_argnums": 1}, {"static_argnums": (-1,)}, {"static_argnames": "c"}):
        counted = Counted(branchy)
        g = unigrad.grad(counted, backend=bk, compile=True, **kwargs)
        np.testing.assert_allclose(_np(g(x, 2.0)), 4 * x)
        np.testing.assert_allclose(_np(g(x, -1.0)), 3 * x ** 2)
        np.testing.assert_allclose(_np(g(x, 2.0)), 4 * x)
        assert counted.calls == 2, kwargs  # one program per value, reused for a value seen before
    with pytest.raises(TypeError, match="static_argnums"):  # dynamic by default: its value is traced
        unigrad.grad(branchy, backend=bk, compile=True)(x, 2.0)


def test_static_argument_errors():
    with pytest.raises(ValueError, match="both differentiated"):
        unigrad.grad(scaled_loss, argnums=(0, 1), compile=True, static_argnums=1)
    with pytest.raises(ValueError, match="static_argnames"):
        unigrad.jacobian(scaled_loss, compile=True, static_argnames="temperature")
    with pytest.raises(TypeError, match="static_argnums"):
        unigrad.hessian(scaled_loss, compile=True, static_argnums="c")


@pytest.mark.parametrize("bk", COMPILERS)
def test_one_warning_names_an_argument_that_forces_many_programs(bk, monkeypatch):
    monkeypatch.setattr(unigrad._program, "MANY_PROGRAMS", 3)  # 8 by default: fewer compilations here

    def f(x, n):
        return unigrad.namespace(x).sum(x * n)

    g = unigrad.grad(f, backend=bk, compile=True)
    x = np.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(3):
            g(x, n)
            g(x, n)
    assert not [w for w in caught if "compiled programs" in str(w.message)]
    with pytest.warns(UserWarning, match=r"argument 1 \('n'\), an int, has forced 4 compiled programs") as record:
        g(x, 3)
    assert "np.asarray" in str(record[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(4, 9):
            np.testing.assert_allclose(_np(g(x, n)), [n, n])
    assert not [w for w in caught if "compiled programs" in str(w.message)]  # once per transform


@pytest.mark.parametrize("bk", COMPILERS)
def test_many_floats_do_not_warn(bk):
    g = unigrad.grad(scaled_loss, backend=bk, compile=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(12):
            g(np.ones(2), 0.1 * k)


@pytest.mark.parametrize("bk", COMPILERS)
def test_the_independence_verdict_is_not_shared_between_float_values(bk):
    def coupled_unless_zero(x, c):  # rows independent only for c == 0
        xp = unigrad.namespace(x)
        return x - c * xp.mean(x, axis=0, keepdims=True)

    # The rows are proved from the program, which mixes them whatever c is: refused at every value (the
    # proof is structural), and a refusal at one value is never traded for a verdict made at another.
    jac = unigrad.batched_jacobian(coupled_unless_zero, backend=bk, compile=True)
    x = np.random.default_rng(0).standard_normal((4, 3))
    for c in (0.0, 1.0, 0.0):
        with pytest.raises(ValueError, match="not independent"):
            jac(x, c)
    trusted = unigrad.batched_jacobian(coupled_unless_zero, backend=bk, compile=True, check_independence="never")
    np.testing.assert_allclose(_np(trusted(x, 0.0)), np.broadcast_to(np.eye(3), (4, 3, 3)))


@pytest.mark.parametrize("bk", COMPILERS)
def test_jacobian_and_hessian_with_a_dynamic_float(bk):
    def f(x, c):
        xp = unigrad.namespace(x)
        return xp.sum(xp.exp(c * x))

    counted = Counted(f)
    h = unigrad.hessian(counted, backend=bk, compile=True)
    j = unigrad.jacobian(lambda x, c: x * c, backend=bk, compile=True)
    x = np.array([0.5, -0.25])
    for c in (0.5, 1.5, -2.0):
        np.testing.assert_allclose(_np(h(x, c)), np.diag(c * c * np.exp(c * x)), rtol=1e-12)
        np.testing.assert_allclose(_np(j(x, c)), c * np.eye(2), rtol=1e-12)
    assert counted.calls <= 3  # the output shapes, once; the trace, once


# ------------------------------------------------------------------------------ TensorFlow's eager pfor

@pytest.mark.skipif(not HAVE["tensorflow"], reason="tensorflow not installed")
def test_tensorflow_eager_batched_jacobian_traces_once_per_signature():
    def mlp(w, x):
        xp = unigrad.namespace(w, x)
        return xp.tanh(x @ w)

    counted = Counted(mlp)
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((3, 2)), rng.standard_normal((5, 3))
    want = unigrad.batched_jacobian(mlp, argnums=1)(w, x)  # the tape
    jac = unigrad.batched_jacobian(counted, argnums=1, backend="tensorflow", check_independence="never", mode="rev")
    np.testing.assert_allclose(_np(jac(w, x)), want, rtol=1e-12)
    after_first = counted.calls
    for _ in range(3):
        np.testing.assert_allclose(_np(jac(w, x)), want, rtol=1e-12)
    assert counted.calls == after_first  # one trace for the signature, not one per call
    x2 = rng.standard_normal((5, 3))
    np.testing.assert_allclose(_np(jac(w, x2)), unigrad.batched_jacobian(mlp, argnums=1)(w, x2), rtol=1e-12)

    def reads_a_value(w, x):  # cannot be traced: runs eagerly, as before
        xp = unigrad.namespace(w, x)
        return xp.tanh(x @ w) * float(unigrad.to_numpy(xp.sum(w * 0.0)) + 1.0)

    np.testing.assert_allclose(_np(unigrad.batched_jacobian(reads_a_value, argnums=1, backend="tensorflow")(w, x)),
                               want, rtol=1e-12)
