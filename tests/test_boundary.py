"""Arrays at the boundary (issue 22): nothing the caller holds can change a result, and the odd index
and the empty tree behave alike on every backend.

The conformance suite holds every backend to ``vjp_fn`` computing at the call's point
(``test_nothing_the_caller_holds_changes_a_vjp_fn``); these tests cover the rest per backend.
"""

from __future__ import annotations

import numpy as np
import pytest

import unigrad

BACKENDS = ["numpy", "torch", "jax", "tensorflow", "autograd"]


def _np(x):
    return np.asarray(unigrad.to_numpy(x))


def _shares(b, a, c):
    if b.name == "torch":
        return a.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()
    return np.shares_memory(_np(a), _np(c)) if b.mutable_arrays else False


@pytest.mark.parametrize("name", BACKENDS)
def test_results_of_an_identity_are_not_the_callers_arrays(name):
    """torch and autograd return their input itself for an identity; unigrad's results are the caller's own."""
    if name not in unigrad.backends():
        pytest.skip(f"{name} not installed")
    b = unigrad.get_backend(name)
    x, t, ct = (b.asarray(np.arange(3.0) + k) for k in range(3))
    out, tan = unigrad.jvp(lambda x: x, (x,), (t,), backend=name)
    (g,) = unigrad.vjp(lambda x: x, x, backend=name)[1](ct)
    for result in (out, tan):
        assert not _shares(b, result, x) and not _shares(b, result, t)
    assert not _shares(b, g, ct)
    assert not _shares(b, out, tan)
    if b.mutable_arrays:
        g[...] = 9.0
        out[...] = 9.0
        np.testing.assert_array_equal(_np(ct), np.arange(3.0) + 2)
        np.testing.assert_array_equal(_np(x), np.arange(3.0))


@pytest.mark.parametrize("name", ["numpy", "torch", "autograd"])
def test_vjp_fn_after_writes_into_a_list_leaf_and_into_the_point_of_a_hvp(name):
    if name not in unigrad.backends():
        pytest.skip(f"{name} not installed")
    xs = [np.array([0.5, 1.0]), np.array([2.0])]

    def f(a, b):
        xp = unigrad.namespace(a, b)
        return xp.sum(a ** 3) * xp.sum(b ** 2)

    _, vjp_fn = unigrad.vjp(f, *xs, backend=name)
    want = (3 * xs[0] ** 2 * 4.0, 2 * xs[1] * np.sum(xs[0] ** 3))
    for x in xs:
        x *= -3.0
    got = vjp_fn(np.array(1.0))
    for g, w in zip(got, want):
        np.testing.assert_allclose(_np(g), w, rtol=1e-12)


@pytest.mark.parametrize("name", ["numpy", "torch", "jax", "tensorflow"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_closed_over_array_rebound_between_calls(name, compile):
    """What holds for arrays ``f`` closes over (docs/conventions.md): an eager transform reads the name
    when it runs; a compiled program on a backend that compiles (JAX, TensorFlow) keeps the value it was
    traced with, as ``jax.jit`` does -- pass such arrays as arguments instead."""
    if name not in unigrad.backends():
        pytest.skip(f"{name} not installed")
    w = np.array([1.0, 2.0])

    def f(x):
        return unigrad.namespace(x).sum(x * unigrad.asarray(w, backend=name))

    g = unigrad.grad(f, backend=name, compile=compile)
    np.testing.assert_array_equal(_np(g(np.ones(2))), [1.0, 2.0])
    w = np.array([3.0, 4.0])  # noqa: F841 (read by f through its closure)
    traced_once = compile and unigrad.get_backend(name).capabilities.compile
    np.testing.assert_array_equal(_np(g(np.ones(2))), [1.0, 2.0] if traced_once else [3.0, 4.0])
    # passed as an argument, the new value is always seen
    h = unigrad.grad(lambda x, w: unigrad.namespace(x).sum(x * w), backend=name, compile=compile)
    np.testing.assert_array_equal(_np(h(np.ones(2), np.array([5.0, 6.0]))), [5.0, 6.0])
    np.testing.assert_array_equal(_np(h(np.ones(2), np.array([7.0, 8.0]))), [7.0, 8.0])


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("args", [({},), (), ([],), (None,)], ids=["dict", "no-arguments", "list", "none"])
def test_empty_trees_give_empty_results_everywhere(name, args):
    """hvp of a function of an empty pytree (or of no arguments) is empty, as grad's is (JAX raised
    "max() arg is an empty sequence")."""
    if name not in unigrad.backends():
        pytest.skip(f"{name} not installed")

    def f(*a):
        return np.float64(2.0)

    assert unigrad.hvp(f, args, args, backend=name) == args
    out, tangent_out = unigrad.jvp(f, args, args, backend=name)
    assert float(_np(out)) == 2.0 and float(_np(tangent_out)) == 0.0
    assert unigrad.vjp(f, *args, backend=name)[1](np.float64(1.0)) == args
    if args:
        assert unigrad.grad(f, backend=name)(*args) == args[0]
        assert unigrad.hessian(f, backend=name)(*args) == args[0]


def test_tensorflow_forward_over_forward_is_right_and_leaves_nothing_wrong_behind():
    """TensorFlow's nested ForwardAccumulator gives wrong second derivatives when an intermediate is an
    operand twice (tensorflow/tensorflow#127753), and the wrong value stayed cached for later nested
    passes: here jvp of jvp of cube(where(x < -20, x, 1)) gave -49 for -150 and a later plain polynomial
    was off by 4 orders of magnitude. The adapter computes a forward pass nested in its own by two VJPs."""
    if "tensorflow" not in unigrad.backends():
        pytest.skip("tensorflow not installed")
    x, t = np.array([-25.0]), np.array([1.0])
    xp = unigrad.namespace

    def second(f, backend):
        inner = lambda a: unigrad.jvp(f, (a,), (t,), backend=backend)[1]  # noqa: E731
        return _np(unigrad.jvp(inner, (x,), (t,), backend=backend)[1])

    def series(z):
        w = 1 / (z * z)
        return 1 + w * (-1 + w * (3 + w * (-15 + w * (105 - 945 * w))))

    for f in (lambda a: xp(a).where(a < -20.0, a, xp(a).zeros_like(a) + 1.0) ** 3,
              lambda a: series(xp(a).where(a < -20.0, a, a)), series):
        np.testing.assert_allclose(second(f, "tensorflow"), second(f, "numpy"), rtol=1e-10)
    # jacfwd of jacfwd (a forward pass inside a vectorised forward pass) too
    h = unigrad.jacfwd(unigrad.jacfwd(lambda a: xp(a).sum(a * a * a), backend="tensorflow"), backend="tensorflow")
    np.testing.assert_allclose(_np(h(np.array([2.0, 3.0]))), np.diag([12.0, 18.0]), rtol=1e-12)


@pytest.mark.parametrize("fn", [
    lambda a: np.tril(a, -1) ** 2, lambda a: np.triu(a) ** 3, lambda a: np.radians(a) * a, lambda a: np.degrees(a) ** 2,
    lambda a: np.rollaxis(a[None] * a[:, :, None], 2, 1), lambda a: np.rollaxis(a[None] * a[:, :, None], 0, 3),
    lambda a: np.real_if_close(a * (1 + 0j)) ** 2, lambda a: np.real_if_close(a * (1 + 1j)) * a],
    ids=["tril", "triu", "radians", "degrees", "rollaxis-forward", "rollaxis-back", "real_if_close-real",
         "real_if_close-complex"])
def test_numpy_functions_on_traced_values(fn):
    """NumPy's own functions the tape now takes (autograd has them): NumPy's values, and derivatives."""
    from unigrad.testing import check_grads

    x = np.arange(1.0, 10.0).reshape(3, 3) / 4
    np.testing.assert_allclose(_np(unigrad.evaluate(fn, x)), fn(x))
    real = lambda a: np.sum(np.real(fn(a)) + np.imag(fn(a)))  # noqa: E731
    check_grads(real, (x,), order=2)


def test_the_library_leaves_tensorflows_log_level_to_the_user():
    """docs/getting-started.md: the TensorFlow backend sets no TF_CPP_MIN_LOG_LEVEL (only the CLI does): the
    variable after loading the backend is what TensorFlow's own import leaves."""
    import subprocess
    import sys

    if "tensorflow" not in unigrad.backends():
        pytest.skip("tensorflow not installed")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    probe = "import os, {}; print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"
    # the two fresh processes (each imports TensorFlow, seconds) run side by side
    plain, ours = [subprocess.Popen([sys.executable, "-c", probe.format(imports)], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
                   for imports in ("tensorflow", "unigrad; unigrad.get_backend('tensorflow')")]
    (plain_out, plain_err), (ours_out, ours_err) = plain.communicate(timeout=600), ours.communicate(timeout=600)
    assert plain.returncode == 0, plain_err[-2000:]
    assert ours.returncode == 0, ours_err[-2000:]
    assert ours_out.split()[-1] == plain_out.split()[-1]
