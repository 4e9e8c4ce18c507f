"""The modes an engine has: ``mode="auto"`` never keeps a mode ``f`` cannot do, and the second-order modes.

- ``jacobian`` / ``sparse_jacobian`` / ``hessian`` with ``mode="auto"`` fall back to reverse mode where
  forward mode raises -- a JAX ``custom_vjp``, HIPS autograd's ``inv`` on the autograd plugin, MLX's
  scatter under forward over reverse; TensorFlow's ``tf.scan`` / ``tf.cond`` (slow tests: its vmap now maps
  what pfor cannot) -- with the right numbers (closed forms), remembered per signature; a fixed ``mode``
  keeps the framework's error; an error of ``f``'s own (reverse mode raises too) is not hidden.
- ``hessian(mode="fwd-rev" | "rev-rev" | "auto", has_aux=...)`` and ``value_jacobian_and_hessian`` on
  every backend against closed forms and the existing transforms.
- docs/transforms.md's pattern for a batch of scalar values with ``value_and_grad``.
"""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from conftest import skip_unless

RNG = np.random.default_rng(36)


def _np(x):
    return unigrad.to_numpy(x)


def _tol(backend):
    return 1e-10 if unigrad.get_backend(backend).capabilities.float64 else 2e-4


# ---------------------------------------------------------------------------------------------
# closed forms
# ---------------------------------------------------------------------------------------------

def energy(x, w):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x * w) * x ** 2)


def energy_grad(x, w):
    return w * np.cos(x * w) * x ** 2 + 2 * x * np.sin(x * w)


def energy_hessian(x, w):
    s, c = np.sin(x * w), np.cos(x * w)
    return np.diag(-w * w * s * x ** 2 + 4 * w * c * x + 2 * s)


def cubic(x, w):  # R^3 -> R^2: a non-scalar output
    xp = unigrad.namespace(x)
    return xp.stack([xp.sum(x ** 3) * w, x[0] * x[1] * x[2]])


def cubic_jacobian(x, w):
    return np.stack([3 * w * x ** 2, np.array([x[1] * x[2], x[0] * x[2], x[0] * x[1]])])


def cubic_hessian(x, w):
    second = np.array([[0.0, x[2], x[1]], [x[2], 0.0, x[0]], [x[1], x[0], 0.0]])
    return np.stack([np.diag(6 * w * x), second])


X, W = np.array([0.3, -0.7, 1.1]), 1.7

#: The heavy cases of the default run's parametrised tests, run by the thorough job (see tests/conftest.py).
SLOW_CASES = {f"test_hessian_modes_give_the_closed_form[{b}-fwd-rev]" for b in ("torch", "jax", "tensorflow", "mlx")}
SLOW_CASES |= {f"test_value_jacobian_and_hessian_of_a_vector_and_two_arguments[{b}-{m}]"
               for b in ("jax", "tensorflow") for m in ("auto", "rev-rev")}


# ---------------------------------------------------------------------------------------------
# hessian modes and value_jacobian_and_hessian, every backend
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["fwd-rev", "rev-rev", "auto"])
def test_hessian_modes_give_the_closed_form(backend, mode):
    tol = _tol(backend)
    h = unigrad.hessian(energy, mode=mode, backend=backend)(X, W)
    np.testing.assert_allclose(_np(h), energy_hessian(X, W), rtol=tol, atol=tol)
    h, aux = unigrad.hessian(lambda x, w: (energy(x, w), {"twice": 2 * x}), mode=mode, has_aux=True,
                             backend=backend)(X, W)
    np.testing.assert_allclose(_np(h), energy_hessian(X, W), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(aux["twice"]), 2 * X, rtol=tol)


def test_value_jacobian_and_hessian_of_a_scalar(backend):
    tol = _tol(backend)
    value, g, h, aux = unigrad.value_jacobian_and_hessian(lambda x, w: (energy(x, w), x[0] * w), has_aux=True,
                                                          mode="auto", backend=backend)(X, W)
    np.testing.assert_allclose(_np(value), np.sum(np.sin(X * W) * X ** 2), rtol=tol)
    np.testing.assert_allclose(_np(g), energy_grad(X, W), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(h), energy_hessian(X, W), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(aux), X[0] * W, rtol=tol)
    assert unigrad.get_backend(backend).is_array(g) and tuple(unigrad.get_backend(backend).shape(g)) == (3,)


@pytest.mark.parametrize("mode", ["auto", "rev-rev"])
def test_value_jacobian_and_hessian_of_a_vector_and_two_arguments(backend, mode):
    """A non-scalar output, argnums=(0, 1): the blocks of jacobian and hessian, in their structure. (On MLX
    forward over reverse raises here -- "[scatter] JVP not yet implemented" -- and "auto" falls back.)"""
    tol = _tol(backend)
    w = np.asarray(W)
    value, jac, hess = unigrad.value_jacobian_and_hessian(cubic, argnums=(0, 1), mode=mode, backend=backend)(X, w)
    np.testing.assert_allclose(_np(value), _np(cubic(X, W)), rtol=tol)
    np.testing.assert_allclose(_np(jac[0]), cubic_jacobian(X, W), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(jac[1]), [np.sum(X ** 3), 0.0], rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(hess[0][0]), cubic_hessian(X, W), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(hess[0][1]), np.stack([3 * X ** 2, np.zeros(3)]), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(hess[1][1]), np.zeros(2), atol=tol)
    want = unigrad.hessian(cubic, argnums=(0, 1), mode=mode, backend=backend)(X, w)
    for j in range(2):
        for k in range(2):
            np.testing.assert_allclose(_np(hess[j][k]), _np(want[j][k]), rtol=tol, atol=tol)


COMPILED = ["jax", "tensorflow", "mlx"]


@pytest.mark.slow
@pytest.mark.parametrize("bk", COMPILED)
@pytest.mark.parametrize("mode", ["fwd-rev", "rev-rev", "auto"])
def test_compiled_second_order(bk, mode):
    skip_unless(bk)
    tol = _tol(bk)
    vjh = unigrad.value_jacobian_and_hessian(cubic, mode=mode, backend=bk, compile=True)
    hess = unigrad.hessian(lambda x, w: (energy(x, w), x * w), has_aux=True, mode=mode, backend=bk, compile=True)
    for w in (W, -0.4):  # a Python float: a dynamic input of the program
        if bk == "mlx" and mode == "fwd-rev":  # MLX has no JVP of the scatter in cubic's reverse pass
            with pytest.raises(RuntimeError, match="JVP not yet implemented"):
                vjh(X, w)
        else:
            value, jac, h = vjh(X, w)
            np.testing.assert_allclose(_np(jac), cubic_jacobian(X, w), rtol=tol, atol=tol)
            np.testing.assert_allclose(_np(h), cubic_hessian(X, w), rtol=tol, atol=tol)
        if bk == "mlx":  # known: mx.compile of an aux array computed from x under a nested derivative
            with pytest.raises(IndexError):
                hess(X, w)
            continue
        h, aux = hess(X, w)
        np.testing.assert_allclose(_np(h), energy_hessian(X, w), rtol=tol, atol=tol)
        np.testing.assert_allclose(_np(aux), X * w, rtol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fwd-rev", "rev-rev", "auto"])
def test_vector_hessian_every_mode(backend, mode):
    tol = _tol(backend)
    if backend == "mlx" and mode == "fwd-rev":  # MLX has no JVP of the scatter in cubic's reverse pass
        with pytest.raises(RuntimeError, match="JVP not yet implemented"):
            unigrad.hessian(cubic, mode=mode, backend=backend)(X, W)
        return
    np.testing.assert_allclose(_np(unigrad.hessian(cubic, mode=mode, backend=backend)(X, W)), cubic_hessian(X, W),
                               rtol=tol, atol=tol)


def test_mlx_forward_over_reverse_through_a_scatter_falls_back():
    skip_unless("mlx")
    with pytest.raises(RuntimeError, match="JVP not yet implemented"):  # the engine has no such forward rule
        unigrad.hessian(cubic, mode="fwd-rev", backend="mlx")(X, W)
    got = unigrad.hessian(cubic, mode="auto", backend="mlx")(X, W)
    np.testing.assert_allclose(_np(got), cubic_hessian(X, W), rtol=2e-4, atol=2e-4)


def test_an_unknown_mode_names_the_choices():
    for transform in (unigrad.hessian, unigrad.value_jacobian_and_hessian):
        with pytest.raises(ValueError, match="'fwd-rev'.*'rev-rev'.*'auto'.*got 'fwd'"):
            transform(energy, mode="fwd")


# ---------------------------------------------------------------------------------------------
# mode="auto" falls back where forward mode raises
# ---------------------------------------------------------------------------------------------

def _inv_jacobian(a):
    """d(A^-1)[k, l] / dA[i, j] = -inv[k, i] inv[j, l]."""
    inv = np.linalg.inv(a)
    return -np.einsum("ki,jl->klij", inv, inv)


A = np.array([[2.0, 0.3], [0.1, 1.5]])


def test_autograd_inv_falls_back_to_reverse_mode():
    anp = skip_unless("autograd").numpy
    calls = []

    def f(a):  # R^4 -> R^8: "auto" picks forward mode, for which autograd has no rule of inv
        calls.append(1)
        return anp.concatenate([anp.linalg.inv(a).ravel(), a.ravel() ** 2])

    with pytest.raises(NotImplementedError):  # a fixed mode keeps the engine's error
        unigrad.jacobian(f, mode="fwd", backend="autograd")(A)
    jac = unigrad.jacobian(f, backend="autograd")
    want = np.concatenate([_inv_jacobian(A).reshape(4, 2, 2),
                           (2 * A.ravel())[:, None, None] * np.eye(4).reshape(4, 2, 2)])
    del calls[:]
    np.testing.assert_allclose(jac(A), want, rtol=1e-12, atol=1e-15)
    first = len(calls)
    del calls[:]
    np.testing.assert_allclose(jac(A + 0.1), np.concatenate([_inv_jacobian(A + 0.1).reshape(4, 2, 2),
                                                             (2 * (A + 0.1).ravel())[:, None, None]
                                                             * np.eye(4).reshape(4, 2, 2)]), rtol=1e-12, atol=1e-15)
    assert len(calls) < first, "the fallback was not remembered: forward mode was tried again"


def _inv_sum_gradient(a):
    """d sum(A^-1) / dA = -A^-T 1 1^T A^-T."""
    inv_t = np.linalg.inv(a).T
    return -inv_t @ np.ones((2, 2)) @ inv_t


def test_autograd_inv_hessian_modes():
    anp = skip_unless("autograd").numpy

    def f(a):
        return anp.sum(anp.linalg.inv(a))

    with pytest.raises(NotImplementedError):  # forward over reverse: autograd has no forward rule of inv
        unigrad.hessian(f, backend="autograd")(A)
    eps, fd = 1e-6, np.zeros((2, 2, 2, 2))  # central differences of the closed-form gradient
    for i in range(2):
        for j in range(2):
            e = np.zeros((2, 2))
            e[i, j] = eps
            fd[:, :, i, j] = (_inv_sum_gradient(A + e) - _inv_sum_gradient(A - e)) / (2 * eps)
    for mode in ("rev-rev", "auto"):
        np.testing.assert_allclose(unigrad.hessian(f, mode=mode, backend="autograd")(A), fd, rtol=1e-6, atol=1e-8)
    value, g, h = unigrad.value_jacobian_and_hessian(f, mode="auto", backend="autograd")(A)
    np.testing.assert_allclose(value, np.linalg.inv(A).sum(), rtol=1e-12)
    np.testing.assert_allclose(g, _inv_sum_gradient(A), rtol=1e-12)
    np.testing.assert_allclose(h, fd, rtol=1e-6, atol=1e-8)


def _jax_custom_vjp():
    jax = skip_unless("jax")

    @jax.custom_vjp
    def cv(u):
        return jax.numpy.sin(u)

    cv.defvjp(lambda u: (jax.numpy.sin(u), u), lambda u, g: (jax.numpy.cos(u) * g,))
    return jax, cv


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_jax_custom_vjp_falls_back_to_reverse_mode(compile):
    jax, cv = _jax_custom_vjp()
    jnp = jax.numpy
    x = np.linspace(0.2, 0.8, 4)

    def f(x):  # R^4 -> R^8: "auto" picks forward mode, which a custom_vjp refuses
        return jnp.concatenate([cv(x), x ** 2])

    with pytest.raises(TypeError, match="custom_vjp"):
        unigrad.jacobian(f, mode="fwd", backend="jax", compile=compile)(x)
    jac = unigrad.jacobian(f, backend="jax", compile=compile)
    want = np.concatenate([np.diag(np.cos(x)), np.diag(2 * x)])
    for _ in range(2):
        np.testing.assert_allclose(_np(jac(x)), want, rtol=1e-12, atol=1e-15)
    # (JAX differentiates forward over a custom_vjp's reverse rule: its Hessian needs no fallback)
    h = unigrad.hessian(lambda x: jnp.sum(cv(x) * x), mode="auto", backend="jax", compile=compile)(x)
    np.testing.assert_allclose(_np(h), np.diag(-np.sin(x) * x + 2 * np.cos(x)), rtol=1e-12, atol=1e-15)


def test_jax_custom_vjp_sparse_jacobian_falls_back():
    skip_unless("scipy")
    jax, cv = _jax_custom_vjp()
    x = np.linspace(0.2, 0.8, 4)

    def f(x):
        return cv(x) + x[::-1]

    sj = unigrad.sparse_jacobian(f, format="dense", backend="jax")
    with pytest.warns(unigrad.SparsityWarning):
        assert sj.plan(x).mode == "fwd"  # a tie of colours keeps forward
    want = np.diag(np.cos(x)) + np.eye(4)[::-1]
    np.testing.assert_allclose(_np(sj(x)), want, rtol=1e-12, atol=1e-15)
    assert sj.plan(x).mode == "rev"  # kept in the signature's plan
    np.testing.assert_allclose(_np(sj(x)), want, rtol=1e-12, atol=1e-15)


def _scan(tf, x):
    return tf.scan(lambda c, xi: 0.5 * c + tf.sin(xi) * xi, x, initializer=tf.constant(0.0, tf.float64))


def _scan_jacobian(x):
    """c_k = 0.5 c_(k-1) + sin(x_k) x_k: dc_k/dx_i = 0.5^(k-i) (cos(x_i) x_i + sin(x_i)), i <= k."""
    k, i = np.indices((len(x), len(x)))
    return np.where(i <= k, 0.5 ** (k - i), 0.0) * (np.cos(x) * x + np.sin(x))[None, :]


@pytest.mark.slow
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_tensorflow_scan_and_cond_under_auto(compile):
    """r19: pfor has no conversion for a tf.scan's loop or a tf.cond under vectorised forward mode. TensorFlow's
    backend now maps what pfor cannot one element at a time (a SlowMapWarning), so forward mode gives the
    values too, slowly; "auto" must be right whichever mode ends up running (the fallback itself is shown
    on JAX, autograd and MLX above, where forward mode raises)."""
    tf = skip_unless("tensorflow")
    x = np.linspace(0.1, 0.6, 3)

    def scans(x):  # R^3 -> R^6: "auto" picks forward mode
        return tf.concat([_scan(tf, x), x ** 2], 0)

    def conds(x):
        return tf.concat([tf.cond(tf.reduce_sum(x) > 0, lambda: tf.sin(x) * x[0], lambda: x), x], 0)

    got = unigrad.jacobian(scans, backend="tensorflow", compile=compile)(x)
    np.testing.assert_allclose(_np(got), np.concatenate([_scan_jacobian(x), np.diag(2 * x)]), rtol=1e-12, atol=1e-15)
    got = unigrad.jacobian(conds, backend="tensorflow", compile=compile)(x)
    # the branch taken (sum(x) > 0): sin(x) * x[0]
    want = np.concatenate([np.diag(np.cos(x) * x[0]) + np.outer(np.sin(x), np.eye(3)[0]), np.eye(3)])
    np.testing.assert_allclose(_np(got), want, rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_tensorflow_scan_sparse_jacobian_falls_back():
    skip_unless("scipy")
    tf = skip_unless("tensorflow")
    x = np.linspace(0.1, 0.6, 6)
    sj = unigrad.sparse_jacobian(lambda x: _scan(tf, x), format="dense", backend="tensorflow")
    with pytest.warns(unigrad.SparsityWarning):
        np.testing.assert_allclose(_np(sj(x)), _scan_jacobian(x), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(_np(sj(x)), _scan_jacobian(x), rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# a fallback does not hide an error of f's own
# ---------------------------------------------------------------------------------------------

def test_an_error_of_f_in_both_modes_is_raised_as_it_is():
    calls = []

    def f(x):
        calls.append(1)
        if x.shape[0] == 2:
            raise ValueError("f: two inputs are not allowed")
        return x

    for transform in (unigrad.jacobian(lambda x: unigrad.namespace(x).concatenate([f(x), f(x)])),
                      unigrad.hessian(lambda x: unigrad.namespace(x).sum(f(x)), mode="auto")):
        with pytest.raises(ValueError, match="two inputs are not allowed"):
            transform(np.ones(2))


def test_reverse_mode_failing_too_raises_the_forward_error_naming_both():
    jax = skip_unless("jax")

    @jax.custom_vjp
    def broken(u):
        return jax.numpy.sin(u)

    def bwd(u, g):
        raise RuntimeError("the bwd rule is broken")

    broken.defvjp(lambda u: (jax.numpy.sin(u), u), bwd)
    with pytest.raises(TypeError, match="custom_vjp") as info:
        unigrad.jacobian(lambda x: jax.numpy.concatenate([broken(x), x]), backend="jax")(np.ones(3))
    notes = " ".join(getattr(info.value, "__notes__", ()))
    assert "mode='auto' tried 'rev'" in notes and "the bwd rule is broken" in notes


# ---------------------------------------------------------------------------------------------
# docs/transforms.md: a batch of scalar values with value_and_grad
# ---------------------------------------------------------------------------------------------

def test_a_batch_of_scalar_values_with_value_and_grad():
    """The sum inside f, the per-point values as aux: one gradient gives every point's gradient."""
    def total(points):
        xp = unigrad.namespace(points)
        values = xp.sum(xp.sin(points) * points, axis=1)   # one value per point: shape (B,)
        return xp.sum(values), values

    points = RNG.standard_normal((5, 3))
    (_, values), grads = unigrad.value_and_grad(total, has_aux=True)(points)
    np.testing.assert_allclose(values, np.sum(np.sin(points) * points, axis=1), rtol=1e-12)
    np.testing.assert_allclose(grads, np.cos(points) * points + np.sin(points), rtol=1e-12)
    with pytest.raises((TypeError, ValueError)):  # a (B,) output is not a scalar: refused, as JAX does
        unigrad.value_and_grad(lambda p: total(p)[1])(points)


def test_a_complex_output_of_a_real_input_is_refused_not_truncated():
    """The inner derivative is reverse mode, whose VJPs for a real input are real: the Hessian of 1j x^2
    would read 0 (its real part). A ValueError says so instead."""
    for transform in (unigrad.hessian, unigrad.value_jacobian_and_hessian):
        with pytest.raises(ValueError, match="complex output of a real input"):
            transform(lambda x: 1j * x ** 2)(np.array([1.0, 2.0]))
    h = unigrad.hessian(lambda z: unigrad.namespace(z).sum(z * z).real)(np.array([1.0, 2.0], dtype=complex))
    np.testing.assert_allclose(h, 2 * np.eye(2))
