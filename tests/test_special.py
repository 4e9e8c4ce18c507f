"""unigrad.special on every backend: values as SciPy's, derivatives against finite differences (second
order on the tape and torch) and against the tape; SciPy's special ufuncs on the tape's traced values;
a clear error for the rest of SciPy and for a backend without a function."""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
import unigrad.special as us
from unigrad.testing import check_grads

sc = pytest.importorskip("scipy.special")

X = np.array([0.3, 1.7, 2.5])
P = np.array([0.1, 0.5, 0.8])
S = np.array([-1.5, 0.25, 2.0])
CASES = {
    "gammaln": (us.gammaln, (X,), sc.gammaln),
    "digamma": (us.digamma, (X,), sc.digamma),
    "polygamma": (lambda a: us.polygamma(2, a), (X,), lambda a: sc.polygamma(2, a)),
    "erf": (us.erf, (S,), sc.erf),
    "erfc": (us.erfc, (S,), sc.erfc),
    "erfinv": (us.erfinv, (P - 0.3,), sc.erfinv),
    "ndtr": (us.ndtr, (S,), sc.ndtr),
    "log_ndtr": (us.log_ndtr, (np.array([-30.0, -3.0, 2.0]),), sc.log_ndtr),  # the far tail included
    "ndtri": (us.ndtri, (P,), sc.ndtri),
    "expit": (us.expit, (S,), sc.expit),
    "logit": (us.logit, (P,), sc.logit),
    "xlogy": (us.xlogy, (X, P), sc.xlogy),
    "xlog1py": (us.xlog1py, (X, P), sc.xlog1py),
    "i0e": (us.i0e, (S,), sc.i0e),
    "i1e": (us.i1e, (S,), sc.i1e),
    "betaln": (us.betaln, (X, P), sc.betaln),
    "multigammaln": (lambda a: us.multigammaln(a, 3), (X + 2,), lambda a: sc.multigammaln(a, 3)),
}
BACKENDS = ["numpy", "torch", "jax", "tensorflow"]
# Eager JAX compiles each operation of a function for its shapes (seconds for the longer formulas of
# jax.scipy.special): these JAX cases of the first-derivative matrix run in the thorough job (marker slow).
# Each of these functions stays in the default run on the tape (against finite differences), torch and
# TensorFlow; JAX keeps a function of each family there (gammaln, digamma, polygamma, betaln; erf, erfc,
# erfinv, log_ndtr with its far tail; expit, logit; xlogy; i1e).
JAX_SLOW = {"ndtri", "multigammaln", "ndtr", "i0e", "xlog1py"}
FIRST_ORDER = [pytest.param(engine, name, id=f"{engine}-{name}",
                            marks=[pytest.mark.slow] if engine == "jax" and name in JAX_SLOW else [])
               for engine in BACKENDS for name in sorted(CASES)]


def _np(x):
    return np.asarray(unigrad.to_numpy(x))


def _need(name):
    if name not in unigrad.backends():
        pytest.skip(f"{name} not installed")


def _loss(fn):
    def loss(*a):
        xp = unigrad.namespace(*a)
        y = fn(*a)
        return xp.sum(y * xp.arange(1.0, 4.0, dtype=y.dtype))
    return loss


@pytest.mark.parametrize("engine, name", FIRST_ORDER)
def test_values_and_first_derivatives(engine, name):
    backend = engine
    _need(backend)
    fn, args, ref = CASES[name]
    value = _np(unigrad.evaluate(fn, *args, backend=backend))
    np.testing.assert_allclose(value, ref(*args), rtol=1e-9, atol=1e-12)
    if backend == "numpy":  # the tape against finite differences, both modes...
        check_grads(_loss(fn), args, order=1)
        return
    # ... and every other backend against the tape, both modes
    argnums = tuple(range(len(args)))
    got = unigrad.grad(_loss(fn), argnums=argnums, backend=backend)(*args)
    want = unigrad.grad(_loss(fn), argnums=argnums)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(_np(g), w, rtol=1e-6, atol=1e-12)
    tangents = tuple(np.linspace(0.5, 1.5, a.size).reshape(a.shape) for a in args)
    _, pushed = unigrad.jvp(fn, args, tangents, backend=backend)
    np.testing.assert_allclose(_np(pushed), unigrad.jvp(fn, args, tangents)[1], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_second_derivatives(engine, name):
    backend = engine
    _need(backend)
    fn, args, _ = CASES[name]
    check_grads(_loss(fn), args, order=2, backend=backend)


def test_a_wrong_rule_is_caught(monkeypatch):
    """The checks above can fail: a gammaln whose derivative is 1.001 digamma does not pass."""
    from unigrad.tape import _special

    rule = lambda g, ans, x: g * 1.001 * _special.digamma(x)  # noqa: E731
    monkeypatch.setattr(_special.gammaln, "vjps", (rule,))
    with pytest.raises(AssertionError):
        check_grads(_loss(us.gammaln), (X,), order=1, modes=("rev",))


def test_scipy_special_ufuncs_on_traced_values_are_differentiated():
    g = unigrad.grad(lambda x: sc.gammaln(x).sum() + sc.erf(x).sum())(X)
    np.testing.assert_allclose(g, sc.digamma(X) + 2 / np.sqrt(np.pi) * np.exp(-X ** 2), rtol=1e-12)


@pytest.mark.parametrize("engine", BACKENDS)
def test_scipy_code_on_a_traced_value_names_the_function(engine):
    backend = engine
    _need(backend)
    from scipy.integrate import odeint

    def f(y0):
        return odeint(lambda y, t: -y, y0, np.linspace(0.0, 1.0, 3)).sum()

    with pytest.raises(TypeError, match=r"scipy\.integrate\.odeint .*custom_vjp.*bridge"):
        unigrad.grad(f, backend=backend)(np.array([1.0, 2.0]))


def test_a_backend_without_a_function_says_so():
    _need("autograd")
    with pytest.raises(TypeError, match="autograd backend has no gammaln"):
        unigrad.grad(_loss(us.gammaln), backend="autograd")(X)
    # a formula built on the namespace alone works there
    np.testing.assert_allclose(_np(unigrad.evaluate(us.expit, S, backend="autograd")), sc.expit(S), rtol=1e-12)


def test_order_arguments_are_checked():
    with pytest.raises(TypeError, match="polygamma: n must be a non-negative int"):
        us.polygamma(1.5, X)
    with pytest.raises(TypeError, match="multigammaln: d must be a positive int"):
        us.multigammaln(X, 0)
