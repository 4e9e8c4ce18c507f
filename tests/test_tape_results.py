"""The tape's results belong to the caller (issue 8 §1).

Every array the tape hands out (outputs, aux, gradients, tangents, Jacobian blocks) is one the
caller may mutate in place without changing another result, an array it passed in, or what a
later ``vjp_fn`` call computes; and a gradient (or cotangent) has its input's dtype, as torch and
JAX give it, also when a float32 input meets float64 data.
"""

from __future__ import annotations

import numpy as np
import pytest

import unigrad


def xp(*arrays):
    return unigrad.namespace(*arrays)


def _disjoint(*arrays):
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)


U, V = np.array([0.1, 0.2]), np.array([0.3, 0.4])


def test_gradients_of_two_inputs_are_two_arrays():
    gu, gv = unigrad.grad(lambda a, b: xp(a).sum(xp(a).exp(a + b)), argnums=(0, 1))(U, V)
    _disjoint(gu, gv)
    gu *= 0.5
    np.testing.assert_allclose(gv, np.exp(U + V))


@pytest.mark.parametrize("f", [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: (a + b).reshape(2, 1)],
                          ids=["add", "subtract", "reshape"])
def test_vjp_fn_never_returns_the_callers_cotangent(f):
    out, vjp_fn = unigrad.vjp(f, U, V)
    ct = np.ones_like(out)
    ga, gb = vjp_fn(ct)
    _disjoint(ga, gb, ct)
    ga += 10.0
    np.testing.assert_array_equal(ct, 1.0)
    np.testing.assert_allclose(vjp_fn(ct)[0], 1.0)


def test_vjp_fn_results_are_views_of_nothing_the_caller_holds():
    """A reshape's cotangent is a view of the incoming one: the caller's array must not leak out."""
    ct = np.ones((2, 2))
    _, vjp_fn = unigrad.vjp(lambda a: xp(a).reshape(a, (2, 2)), np.arange(4.0))
    (g,) = vjp_fn(ct)
    _disjoint(g, ct)
    g[0] = 5.0
    np.testing.assert_array_equal(ct, 1.0)


@pytest.mark.parametrize("fname", ["exp", "tanh", "sqrt"])
def test_mutating_out_does_not_change_later_vjp_fn_calls(fname):
    fn = lambda a: getattr(xp(a), fname)(a)  # noqa: E731  (rules that read their own output)
    out, vjp_fn = unigrad.vjp(fn, U)
    want = vjp_fn(np.ones(2))[0].copy()
    out -= 1.0
    out *= 3.0
    np.testing.assert_allclose(vjp_fn(np.ones(2))[0], want)


def test_mutating_aux_or_an_output_that_is_the_input_is_harmless():
    x = np.array([0.5, 1.5])
    (y, same), vjp_fn, aux = unigrad.vjp(lambda a: ((xp(a).sin(a), a), {"s": xp(a).sin(a) * 2}), x, has_aux=True)
    _disjoint(same, x)
    same += 1.0
    aux["s"] -= 7.0
    np.testing.assert_array_equal(x, [0.5, 1.5])
    g = vjp_fn((np.ones(2), np.ones(2)))[0]
    np.testing.assert_allclose(g, np.cos(x) + 1)


def test_repeated_vjp_fn_calls_give_fresh_arrays():
    _, vjp_fn = unigrad.vjp(lambda a: xp(a).sin(a) * 2, U)
    first = vjp_fn(np.ones(2))[0]
    first[:] = 0
    np.testing.assert_allclose(vjp_fn(np.ones(2))[0], 2 * np.cos(U))


def test_value_and_grad_value_is_not_a_view_of_the_input():
    x = np.array([3.0])
    value, g = unigrad.value_and_grad(lambda a: xp(a).reshape(a, ()))(x)
    _disjoint(value, x)
    value[...] = 0
    assert x[0] == 3.0 and g[0] == 1.0


def test_jvp_results_are_not_the_callers_primals_or_tangents():
    x, t = np.array([1.0, 2.0]), np.array([0.5, -1.0])
    out, tan = unigrad.jvp(lambda a: a, (x,), (t,))
    _disjoint(out, tan, x, t)
    (o1, o2), (t1, t2) = unigrad.jvp(lambda a: (a * 2, a * 2), (x,), (t,))
    _disjoint(o1, o2, t1, t2)
    np.testing.assert_allclose(t1, 2 * t)


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd"])
def test_jacobian_blocks_are_disjoint(transform):
    jac = getattr(unigrad, transform)(lambda a, b: a + b, argnums=(0, 1))(U, V)
    _disjoint(*jac)
    jac[0][0, 0] = 9.0
    np.testing.assert_array_equal(jac[1], np.eye(2))


# ------------------------------------------------------------------------------------------ dtypes

W32 = np.ones(3, np.float32)
DATA64 = np.arange(3.0)


def test_float32_input_with_float64_data_gets_a_float32_gradient():
    g = unigrad.grad(lambda w, x: xp(w, x).sum(w * x))(W32, DATA64)
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, DATA64.astype(np.float32))


@pytest.mark.parametrize("f", [
    lambda w, x: xp(w).sum(xp(w).sin(w * x) + w @ x),  # broadcasting ops and matmul
    lambda w, x: xp(w).sum(xp(w).concat([w, x]) ** 2),  # concat: no broadcasting rule
    lambda w, x: xp(w).sum(xp(w).einsum("i,i->i", w, x)),
    lambda w, x: xp(w).real(xp(w).sum(w * (x + 1j))),  # a complex128 cotangent for a float32 input
], ids=["broadcasting", "concat", "einsum", "complex"])
def test_mixed_dtype_gradients_keep_the_inputs_dtype(f):
    g = unigrad.grad(f)(W32, DATA64)
    want = unigrad.grad(f)(W32.astype(np.float64), DATA64)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, want, rtol=1e-6)
    (gv,) = unigrad.vjp(lambda w: f(w, DATA64), W32)[1](np.ones(()))
    assert gv.dtype == np.float32


def test_mixed_dtype_hessian_keeps_the_inputs_dtype():
    h = unigrad.hessian(lambda w: xp(w).sum(xp(w).sin(w * DATA64)))(W32)
    assert h.dtype == np.float32
    np.testing.assert_allclose(h, np.diag(-np.sin(DATA64) * DATA64 ** 2), atol=1e-6)


def test_jvp_tangent_has_the_outputs_dtype():
    out, tan = unigrad.jvp(lambda w: w * DATA64, (W32,), (np.ones(3, np.float32),))
    assert out.dtype == tan.dtype == np.float64


@pytest.mark.parametrize("power", [2, 3.0, 0.5])
def test_a_jvp_of_a_power_is_linear_in_its_tangent_at_zero(power):
    """The JVP of x ** y is linear in the tangent, so its derivative in the tangent at t = 0 is the derivative
    of the power (the transpose of a linear map: a custom_jvp's VJP, a linear solve's reverse rule): the rule
    read 0 there (a where on the tangent's value around the whole term)."""
    x = np.array([1.5, 2.0, 3.0])

    def along(v):
        return unigrad.jvp(lambda x: x ** power, (x,), (v,))[1]

    want = np.diag(power * x ** (power - 1))
    for mode in ("rev", "fwd"):
        np.testing.assert_allclose(unigrad.jacobian(along, mode=mode)(np.zeros(3)), want, rtol=1e-12)
