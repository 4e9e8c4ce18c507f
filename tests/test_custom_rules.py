"""custom_vjp, custom_jvp and stop_gradient on every backend (the ``backend`` fixture), eager and compiled.

The rules below are deliberately *not* the true derivative (``2 * cos`` for ``sin``): what comes back
must be the rule, in every transform and mode, and second derivatives must differentiate the rule.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import unigrad
from unigrad.testing import GradientCheckError, check_grads

X = np.array([0.3, -0.5, 1.2])


def _np(x):
    return np.asarray(unigrad.to_numpy(x))


def _xp(x):
    return unigrad.namespace(x)


# sin with the rule d/dx = 2 cos(x): once as custom_vjp, once as custom_jvp
@unigrad.custom_vjp
def sin_vjp(x):
    return _xp(x).sin(x)


def _sin_fwd(x):
    return sin_vjp(x), _xp(x).cos(x)  # calling the function itself inside fwd (JAX's idiom) works


def _sin_bwd(cos_x, g):
    return (2.0 * cos_x * g,)


sin_vjp.defvjp(_sin_fwd, _sin_bwd)


@unigrad.custom_jvp
def sin_jvp(x):
    return _xp(x).sin(x)


@sin_jvp.defjvp
def _sin_jvp_rule(primals, tangents):
    (x,), (t,) = primals, tangents
    return sin_jvp(x), 2.0 * _xp(x).cos(x) * t


RULES = {"custom_vjp": sin_vjp, "custom_jvp": sin_jvp}
COMPILES = {"jax", "tensorflow"}

# Moved to the thorough job (marker slow, through conftest's SLOW_CASES). Compiled: one program per transform,
# seconds each; the default run compiles each kind of rule on one compiler (custom_vjp on JAX, custom_jvp on
# TensorFlow), both modes there (grad, hessian, the jacobian of the other mode). Every kind on every backend
# stays in the default run eager. Nestings: JAX's custom_jvp is JAX's own in every nesting; the default run
# keeps the custom_vjp one there (forward mode by transposition) and every nesting on the other backends.
SLOW_CASES = {"test_the_rule_is_what_comes_back[jax-compiled-custom_jvp]",
              "test_the_rule_is_what_comes_back[tensorflow-compiled-custom_vjp]",
              "test_second_order_in_every_nesting[jax-custom_jvp]"}


# Held to float64 (rtol 1e-12, float64 in the error messages): a backend that computes no float64 skips them
# (conftest); the conformance suite's custom-rule tests check it at float32.
FLOAT64_TESTS = ("test_the_rule_is_what_comes_back", "test_second_order_in_every_nesting",
                 "test_plain_call_gives_the_function", "test_pytrees_and_nondiff_argnums",
                 "test_bwd_errors_name_the_function_and_the_argument", "test_jvp_rule_errors",
                 "test_stop_gradient_any_order", "test_complex_rules_follow_the_house_convention")


def _total(fn):
    return lambda x: _xp(x).sum(fn(x))


@pytest.mark.parametrize("kind", RULES)
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_the_rule_is_what_comes_back(backend, kind, compile):
    if compile and backend not in COMPILES:
        pytest.skip("compile=True runs eagerly on this backend (the eager case covers it)")
    fn = RULES[kind]
    want = 2 * np.cos(X)
    np.testing.assert_allclose(_np(unigrad.grad(_total(fn), backend=backend, compile=compile)(X)), want, rtol=1e-12)
    h = _np(unigrad.hessian(_total(fn), backend=backend, compile=compile)(X))
    np.testing.assert_allclose(h, np.diag(-2 * np.sin(X)), rtol=1e-12, atol=1e-15)  # d/dx 2 cos(x): the rule
    if compile:  # (one compiled program per transform costs seconds: grad, hessian and the two modes above)
        modes = ("fwd",) if kind == "custom_vjp" else ("rev",)
        for mode in modes:
            jac = _np(unigrad.jacobian(fn, mode=mode, backend=backend, compile=True)(X))
            np.testing.assert_allclose(jac, np.diag(want), rtol=1e-12, atol=1e-15)
        return
    np.testing.assert_allclose(_np(unigrad.jvp(fn, (X,), (np.ones(3),), backend=backend)[1]), want, rtol=1e-12)
    for mode in ("fwd", "rev"):
        jac = _np(unigrad.jacobian(fn, mode=mode, backend=backend)(X))
        np.testing.assert_allclose(jac, np.diag(want), rtol=1e-12, atol=1e-15)
        per = _np(unigrad.batched_jacobian(fn, mode=mode, backend=backend)(X[:, None]))
        np.testing.assert_allclose(per.ravel(), want, rtol=1e-12)
    rows = _np(unigrad.vmap(unigrad.grad(lambda x: fn(x), backend=backend), backend=backend)(X))
    np.testing.assert_allclose(rows, want, rtol=1e-12)
    (hv,) = unigrad.hvp(_total(fn), (X,), (np.ones(3),), backend=backend)
    np.testing.assert_allclose(_np(hv), -2 * np.sin(X), rtol=1e-12)


@pytest.mark.parametrize("kind", RULES)
def test_second_order_in_every_nesting(backend, kind):
    """jacfwd(jacfwd), jacrev(jacrev) and jacfwd(jacrev) of the rule (JAX alone refuses forward mode
    on a custom_vjp; unigrad gives it as the transpose of bwd)."""
    if backend == "tensorflow":
        pytest.skip("slow on TensorFlow (20 s); its forward over reverse is in test_the_rule_is_what_comes_back")
    fn = RULES[kind]
    want = np.diag(-2 * np.sin(X))
    for outer, inner in ((unigrad.jacfwd, unigrad.jacfwd), (unigrad.jacrev, unigrad.jacrev),
                         (unigrad.jacrev, unigrad.jacfwd)):
        if True:
            if backend == "torch" and outer is inner is unigrad.jacfwd:
                # torch.func gives zeros there: the adapter refuses (docs/custom-derivatives.md)
                with pytest.raises(NotImplementedError, match="forward mode over forward mode"):
                    outer(inner(_total(fn), backend=backend), backend=backend)(X)
                continue
            got = _np(outer(inner(_total(fn), backend=backend), backend=backend)(X))
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=f"{outer.__name__}({inner.__name__})")


def test_plain_call_gives_the_function(backend):
    x = unigrad.asarray(X, backend=backend)
    for fn in RULES.values():
        np.testing.assert_allclose(_np(fn(x)), np.sin(X), rtol=1e-15)


# a pytree in, a pytree out, a non-differentiated option, a residual pytree, None for a zero cotangent
@partial(unigrad.custom_vjp, nondiff_argnums=(0,))
def scaled(scale, params, x):
    xp = _xp(x)
    return {"a": scale * params["w"] * x, "b": xp.sin(x) * params["c"]}


def _scaled_fwd(scale, params, x):
    return scaled(scale, params, x), {"w": params["w"], "x": x, "c": params["c"]}


def _scaled_bwd(scale, res, g):
    xp = _xp(g["a"])
    # the "true" rules, except for x: 3 * g["b"] * c instead of cos(x) * g["b"] * c
    return ({"w": scale * g["a"] * res["x"], "c": None},
            scale * g["a"] * res["w"] + 3.0 * g["b"] * res["c"] + 0.0 * xp.sum(g["a"]))


scaled.defvjp(_scaled_fwd, _scaled_bwd)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_pytrees_and_nondiff_argnums(backend, compile):
    if compile and backend not in COMPILES:
        pytest.skip("compile=True runs eagerly on this backend")
    params = {"w": np.array([1.0, 2.0]), "c": np.array(0.5)}
    x = np.array([0.5, -0.3])

    def loss(params, x):
        out = scaled(2.0, params, x)
        xp = _xp(x)
        return xp.sum(out["a"]) + xp.sum(out["b"])

    g_params, g_x = unigrad.grad(loss, argnums=(0, 1), backend=backend, compile=compile)(params, x)
    np.testing.assert_allclose(_np(g_params["w"]), 2 * x, rtol=1e-12)
    np.testing.assert_allclose(_np(g_params["c"]), 0.0)  # None in bwd: zeros
    np.testing.assert_allclose(_np(g_x), 2 * params["w"] + 3 * 0.5, rtol=1e-12)
    # forward mode through a pytree rule: the transpose of bwd
    params_b = {k: unigrad.asarray(v, backend=backend) for k, v in params.items()}
    jac = unigrad.jacfwd(lambda x: scaled(2.0, params_b, x), backend=backend)(x)
    np.testing.assert_allclose(_np(jac["a"]), np.diag(2 * params["w"]), rtol=1e-12)
    np.testing.assert_allclose(_np(jac["b"]), np.diag([1.5, 1.5]), rtol=1e-12)


def test_several_outputs_and_inputs_of_mixed_shapes(backend):
    """Two inputs, two outputs of different shapes: every block of the Jacobian is the rule's."""
    @unigrad.custom_jvp
    def pair(a, b):
        xp = _xp(a)
        return xp.sum(a * b), a * 2.0

    @pair.defjvp
    def _(primals, tangents):
        (a, b), (ta, tb) = primals, tangents
        xp = _xp(a)
        return pair(a, b), (xp.sum(ta * b * 10.0 + tb * a), ta * 2.0)

    a, b = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.25, -1.0])
    for mode in ("fwd", "rev"):
        (ja, jb), (ka, kb) = unigrad.jacobian(pair, argnums=(0, 1), mode=mode, backend=backend)(a, b)
        np.testing.assert_allclose(_np(ja), 10 * b, rtol=1e-12)
        np.testing.assert_allclose(_np(jb), a, rtol=1e-12)
        np.testing.assert_allclose(_np(ka), 2 * np.eye(3))
        np.testing.assert_allclose(_np(kb), np.zeros((3, 3)))


# ------------------------------------------------------------------ errors

def _checked(bwd):
    @unigrad.custom_vjp
    def double(x):
        return x * 2.0

    double.defvjp(lambda x: (x * 2.0, None), bwd)
    return double


@pytest.mark.parametrize("bwd, error, match", [
    (lambda res, g: (g, g), TypeError, r"double: bwd must return a tuple with one cotangent per differentiated "
                                       r"argument \(1"),
    (lambda res, g: g, TypeError, "double: bwd must return a tuple"),
    (lambda res, g: (g[:1],), ValueError, r"double: bwd returned a cotangent of shape \(1,\), dtype float64 for "
                                          r"argument 0; expected shape \(3,\), dtype float64"),
    (lambda res, g: (_xp(g).astype(g, _xp(g).float32),), ValueError, "dtype float32 for argument 0; expected shape "
                                                                     r"\(3,\), dtype float64"),
], ids=["count", "not-a-tuple", "shape", "dtype"])
def test_bwd_errors_name_the_function_and_the_argument(backend, bwd, error, match):
    with pytest.raises(error, match=match):
        unigrad.grad(_total(_checked(bwd)), backend=backend)(X)


def test_jvp_rule_errors(backend):
    @unigrad.custom_jvp
    def f(x):
        return x * 2.0

    @f.defjvp
    def _(primals, tangents):
        return f(primals[0]), tangents[0][:1]

    with pytest.raises(ValueError, match=r"f: the JVP rule returned a tangent of shape \(1,\), dtype float64 for "
                                         r"output 0; expected shape \(3,\)"):
        unigrad.jvp(f, (X,), (np.ones(3),), backend=backend)

    @unigrad.custom_vjp
    def g(x):
        return x

    g.defvjp(lambda x: x, lambda res, ct: (ct,))
    with pytest.raises(TypeError, match="g: fwd must return a pair"):
        unigrad.grad(_total(g), backend=backend)(X)


def test_a_function_without_its_rule_raises():
    f = unigrad.custom_vjp(lambda x: x)
    with pytest.raises(AttributeError, match="defvjp"):
        f(X)
    h = unigrad.custom_jvp(lambda x: x)
    with pytest.raises(AttributeError, match="defjvp"):
        h(X)


def test_a_backend_without_custom_rules_refuses_clearly(register_backend):
    """Never a silent zero: a backend that does not declare custom_rules raises, naming the function."""
    from unigrad.tape import NumpyBackend

    class NoRules(NumpyBackend):
        capabilities = unigrad.Capabilities(forward_mode=True, higher_order=True, complex=True)

        stop_gradient = unigrad.Backend.stop_gradient  # the base class's, which only serves aux values

    name = register_backend("norules_test", NoRules)
    with pytest.raises(NotImplementedError, match="sin_vjp: the 'norules_test' backend does not support custom"):
        unigrad.grad(_total(sin_vjp), backend=name)(X)
    with pytest.raises(NotImplementedError, match="stop_gradient"):
        unigrad.grad(lambda x: _xp(x).sum(x * unigrad.stop_gradient(x)), backend=name)(X)


# ------------------------------------------------------------------ stop_gradient

@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_stop_gradient_any_order(backend, compile):
    if compile and backend not in COMPILES:
        pytest.skip("compile=True runs eagerly on this backend")
    f = lambda x: _xp(x).sum(x * unigrad.stop_gradient(x) ** 2)  # noqa: E731
    np.testing.assert_allclose(_np(unigrad.grad(f, backend=backend, compile=compile)(X)), X ** 2, rtol=1e-12)
    np.testing.assert_allclose(_np(unigrad.hessian(f, backend=backend, compile=compile)(X)), np.zeros((3, 3)))
    g = lambda x: _xp(x).sum(x ** 2 * unigrad.stop_gradient(x))  # noqa: E731
    np.testing.assert_allclose(_np(unigrad.hessian(g, backend=backend, compile=compile)(X)), np.diag(2 * X),
                               rtol=1e-12)
    _, t = unigrad.jvp(lambda x: x * unigrad.stop_gradient(x), (X,), (np.ones(3),), backend=backend)
    np.testing.assert_allclose(_np(t), X, rtol=1e-12)
    # pytrees, and values outside any transform
    tree = unigrad.stop_gradient({"a": unigrad.asarray(X, backend=backend), "n": 3})
    assert tree["n"] == 3
    np.testing.assert_allclose(_np(tree["a"]), X)


# ------------------------------------------------------------------ validators know about rules

@pytest.mark.parametrize("kind", RULES)
@pytest.mark.parametrize("mode", ["fwd", "rev"])
def test_check_grads_catches_a_wrong_rule_in_each_mode(backend, kind, mode):
    with pytest.raises(GradientCheckError, match="JVP" if mode == "fwd" else "VJP"):
        check_grads(RULES[kind], (X,), order=1, modes=(mode,), backend=backend)


def test_check_grads_passes_a_right_rule_to_second_order(backend):
    @unigrad.custom_vjp
    def softplus(x):
        return _xp(x).logaddexp(x, 0.0)

    def fwd(x):
        xp = _xp(x)
        return softplus(x), 1.0 / (1.0 + xp.exp(-x))

    softplus.defvjp(fwd, lambda sig, g: (g * sig,))
    # order 2 where it is fast (the hessian tests above cover second order everywhere); "JVP of JVP" is
    # forward over forward, which torch refuses (see above)
    check_grads(softplus, (X,), order=2 if backend in ("numpy", "autograd") else 1, backend=backend)


def test_check_grads_catches_a_bwd_that_is_not_linear(backend):
    """Gradient clipping inside the gradient is not a linear bwd: finite differences and the linearity
    test of the VJP both see it (forward mode, the transpose of bwd, is meaningless then)."""
    @unigrad.custom_vjp
    def f(x):
        return x * 3.0

    f.defvjp(lambda x: (f(x), None), lambda res, g: (_xp(g).clip(g, -1.0, 1.0) * 3.0,))
    with pytest.raises(GradientCheckError):
        check_grads(f, (X,), order=1, modes=("rev",), backend=backend)


def test_a_rule_inside_the_framework_itself():
    """Called on tensors that require grad, outside unigrad's transforms: torch's own autograd uses the rule."""
    torch = pytest.importorskip("torch")
    x = torch.tensor(X, requires_grad=True)
    (g,) = torch.autograd.grad(sin_vjp(x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 2 * np.cos(X), rtol=1e-12)
    (h,) = torch.autograd.grad(g.sum(), x)  # double backward through the rule
    np.testing.assert_allclose(h.numpy(), -2 * np.sin(X), rtol=1e-12)


def test_complex_rules_follow_the_house_convention(backend):
    """A true rule of a holomorphic function gives what the backend's own derivative gives, in both modes
    (bwd receives and returns cotangents in JAX's convention, also where torch and TensorFlow conjugate)."""
    c = unigrad.asarray(np.array([1.0 + 2.0j, 0.5 - 1.0j]), backend=backend)

    def plain(z):
        return z * c + _xp(z).sin(z)

    vjp_rule = unigrad.custom_vjp(plain)
    vjp_rule.defvjp(lambda z: (plain(z), _xp(z).cos(z)), lambda cos_z, g: (g * (c + cos_z),))
    jvp_rule = unigrad.custom_jvp(plain)
    jvp_rule.defjvp(lambda p, t: (plain(p[0]), t[0] * (c + _xp(p[0]).cos(p[0]))))
    z, t = np.array([0.3 + 0.1j, -0.2 + 0.7j]), np.array([1.0 + 0.5j, 1.0 + 0.5j])

    def loss(fn):
        return lambda z: _xp(z).sum(_xp(z).abs(fn(z)) ** 2)

    want_grad = _np(unigrad.grad(loss(plain), backend=backend)(z))
    want_jvp = _np(unigrad.jvp(plain, (z,), (t,), backend=backend)[1])
    for fn in (vjp_rule, jvp_rule):
        np.testing.assert_allclose(_np(unigrad.grad(loss(fn), backend=backend)(z)), want_grad, rtol=1e-12)
        np.testing.assert_allclose(_np(unigrad.jvp(fn, (z,), (t,), backend=backend)[1]), want_jvp, rtol=1e-12)
