"""hessian_vector_product (the reusable, compilable Hessian-vector product) and hvp (the evaluating form).

Every backend, eager and ``compile=True``: the product against the dense Hessian and against finite
differences of the gradient; pytrees and argnums; the complex convention (``jvp`` of ``grad``, which is
also the pullback of ``grad``: one product); repeated compiled calls with new Python floats build no new
program; wrong tangents are a ValueError naming the argument.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import unigrad
from conftest import Counted

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax", "tensorflow")}
BACKENDS = ["numpy"] + [name for name, ok in HAVE.items() if ok]
if importlib.util.find_spec("autograd") is not None:  # a plugin: the contract's generic default
    BACKENDS.append("autograd")
COMPILERS = [name for name in ("jax", "tensorflow") if HAVE[name]]
RNG = np.random.default_rng(7)


def _np(tree):
    return unigrad.to_numpy(tree)


def energy(x, w, c):
    xp = unigrad.namespace(x, w)
    return xp.sum(xp.sin(x * w) * c + x ** 3 * w ** 2) + c * xp.sum(xp.tanh(x) ** 2)


def _fd_hvp(f, x, v, h=1e-5):
    """The central difference of the tape's gradient along v (float64)."""
    g = unigrad.grad(f)
    return (g(x + h * v) - g(x - h * v)) / (2 * h)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("bk", BACKENDS)
def test_matches_the_dense_hessian_and_finite_differences(bk, compile):
    x, w, v = RNG.standard_normal(5), RNG.standard_normal(5), RNG.standard_normal(5)
    hvp_f = unigrad.hessian_vector_product(energy, backend=bk, compile=compile)
    for c in (0.7, -1.3):  # a Python float: a dynamic input of the compiled program
        got = _np(hvp_f(x, w, c, v))
        dense = _np(unigrad.hessian(energy, backend=bk)(x, w, c)) @ v
        np.testing.assert_allclose(got, dense, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, _fd_hvp(lambda x: energy(x, w, c), x, v), rtol=1e-6, atol=1e-8)
    # the evaluating form gives the same product (zero tangents for the other arguments)
    evaluated = unigrad.hvp(energy, (x, w, c), (v, np.zeros(5), 0.0), backend=bk)[0]
    np.testing.assert_allclose(_np(evaluated), got, rtol=1e-12, atol=1e-12)


def params_loss(params, data, scale):
    xp = unigrad.namespace(params["w"])
    h = xp.tanh(data @ params["w"] + params["b"])
    return scale * xp.sum(h ** 2) + xp.sum(params["b"] ** 4)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("bk", BACKENDS)
def test_pytrees_and_argnums(bk, compile):
    params = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}
    data = RNG.standard_normal((4, 3))
    tangent = {"b": RNG.standard_normal(2), "w": RNG.standard_normal((3, 2))}  # key order is not structure
    hvp_f = unigrad.hessian_vector_product(params_loss, backend=bk, compile=compile)
    got = hvp_f(params, data, 0.5, tangent)
    assert set(got) == {"w", "b"} and tuple(_np(got["w"]).shape) == (3, 2)
    # against the dense Hessian of the flat vector (w, b)
    def flat_loss(z):
        xp = unigrad.namespace(z)
        return params_loss({"w": xp.reshape(z[:6], (3, 2)), "b": z[6:]}, data, 0.5)

    z = np.concatenate([params["w"].ravel(), params["b"]])
    dense = unigrad.hessian(flat_loss)(z) @ np.concatenate([tangent["w"].ravel(), tangent["b"]])
    np.testing.assert_allclose(_np(got["w"]).ravel(), dense[:6], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(got["b"]), dense[6:], rtol=1e-10, atol=1e-12)
    # argnums a tuple: tangents a tuple of the arguments' trees, the result a tuple too
    two = unigrad.hessian_vector_product(lambda p, d, s: params_loss(p, d, s), argnums=(0, 1), backend=bk,
                                         compile=compile)
    data_tangent = RNG.standard_normal((4, 3))
    hp, hd = two(params, data, 0.5, (tangent, data_tangent))
    def both_flat(zz):
        xp = unigrad.namespace(zz)
        return params_loss({"w": xp.reshape(zz[:6], (3, 2)), "b": zz[6:8]}, xp.reshape(zz[8:], (4, 3)), 0.5)

    zz = np.concatenate([z, data.ravel()])
    vv = np.concatenate([tangent["w"].ravel(), tangent["b"], data_tangent.ravel()])
    dense = unigrad.hessian(both_flat)(zz) @ vv
    np.testing.assert_allclose(_np(hp["w"]).ravel(), dense[:6], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(hd).ravel(), dense[8:], rtol=1e-10, atol=1e-12)
    # argnums counted from the end, an int: the result is that argument's structure
    only_data = unigrad.hessian_vector_product(params_loss, argnums=-2, backend=bk, compile=compile)
    np.testing.assert_allclose(_np(only_data(params, data, 0.5, data_tangent)).ravel(),
                               unigrad.hessian(both_flat)(zz)[8:, 8:] @ data_tangent.ravel(), rtol=1e-10, atol=1e-12)


def complex_energy(z, w):
    xp = unigrad.namespace(z, w)
    return xp.sum(xp.abs(z) ** 4 * w ** 2 + xp.real(z * z * w) + xp.imag(z) ** 3 * w)


@pytest.mark.parametrize("bk", BACKENDS)  # every one declares complex (capabilities.complex)
def test_complex_inputs_follow_jvp_of_grad_which_is_also_the_pullback(bk):
    """For a real f of complex z = a + ib, the product is jvp of grad in unigrad's convention (grad of
    abs(z)**2 is 2 conj(z)): conj(H_R v) in complex form, H_R the Hessian of f(a + ib) in the real
    coordinates (a, b). The pullback of grad along v (v^T H) is the same vector: one product."""
    z = RNG.standard_normal(3) + 1j * RNG.standard_normal(3)
    w = RNG.standard_normal(3)
    v = RNG.standard_normal(3) + 1j * RNG.standard_normal(3)
    u = RNG.standard_normal(3)
    hz, hw = unigrad.hvp(complex_energy, (z, w), (v, u), backend=bk)
    compiled = unigrad.hessian_vector_product(complex_energy, argnums=(0, 1), backend=bk, compile=True)(z, w, (v, u))

    def real_coordinates(r):  # f(a + ib, w) of the real vector (a, b, w)
        return complex_energy(r[:3] + 1j * r[3:6], r[6:])

    r = np.concatenate([z.real, z.imag, w])
    hr = _np(unigrad.hessian(real_coordinates)(r)) @ np.concatenate([v.real, v.imag, u])
    want_z = hr[:3] - 1j * hr[3:6]  # conj of (H_R v) in complex form
    np.testing.assert_allclose(_np(hz), want_z, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(hw), hr[6:], rtol=1e-10, atol=1e-12)
    for got, want in zip(compiled, (want_z, hr[6:])):
        np.testing.assert_allclose(_np(got), want, rtol=1e-10, atol=1e-12)
    # the pullback of grad along the tangents: the same vector
    _, pullback = unigrad.vjp(unigrad.grad(complex_energy, argnums=(0, 1), backend=bk), z, w, backend=bk)
    vz, vw = pullback((v, u))
    np.testing.assert_allclose(_np(vz), want_z, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(vw), hr[6:], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bk", COMPILERS)
def test_new_floats_reuse_the_compiled_program(bk, repeat_hits):
    f = Counted(energy)
    x = unigrad.asarray(np.linspace(0.1, 1.0, 4).astype(np.float32), backend=bk)
    w = unigrad.asarray(np.linspace(-1.0, 1.0, 4).astype(np.float32), backend=bk)
    v = unigrad.asarray(np.ones(4, np.float32), backend=bk)
    hvp_f = unigrad.hessian_vector_product(f, backend=bk, compile=True)
    for c in (0.5, -1.25, 3.0, 0.1):
        got = _np(hvp_f(x, w, c, v))
        assert got.dtype == np.float32  # x32 * c stays float32
        want = _np(unigrad.hessian_vector_product(energy, backend=bk)(x, w, c, v))  # eager
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)
    assert f.calls <= 2, f"{f.calls} traces for 4 floats: a new float built a new program"
    assert repeat_hits.count(True) == 3  # the first call builds; every later one goes straight to the program
    # a tangent of another dtype is cast to the primal's (its own signature), never a wrong program
    got = _np(hvp_f(x, w, 0.5, np.ones(4)))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _np(hvp_f(x, w, 0.5, v)), rtol=1e-6)


@pytest.mark.parametrize("bk", COMPILERS)
def test_static_argnums_count_in_fs_arguments(bk):
    def branchy(x, c):
        xp = unigrad.namespace(x)
        return xp.sum(x ** 3) * (2.0 if c > 0 else -1.0)  # uses c as a Python value

    x, v = np.array([1.0, 2.0]), np.ones(2)
    for static in ({"static_argnums": 1}, {"static_argnums": -1}, {"static_argnames": "c"}):
        hvp_f = unigrad.hessian_vector_product(branchy, backend=bk, compile=True, **static)
        np.testing.assert_allclose(_np(hvp_f(x, 0.5, v)), 2.0 * 6 * x)
        np.testing.assert_allclose(_np(hvp_f(x, -0.5, v)), -1.0 * 6 * x)
    with pytest.raises(TypeError, match="static_argnums"):  # dynamic: f's branch on it says what to do
        unigrad.hessian_vector_product(branchy, backend=bk, compile=True)(x, 0.5, v)


@pytest.mark.parametrize("bk", ["numpy", "torch"] if HAVE["torch"] else ["numpy"])
def test_wrong_tangents_name_the_argument(bk):
    hvp_f = unigrad.hessian_vector_product(energy, backend=bk)
    x = np.linspace(0.1, 1.0, 4)
    with pytest.raises(ValueError, match=r"tangent for argument 0 has shape \(3,\); expected \(4,\)"):
        hvp_f(x, x, 0.5, np.ones(3))
    with pytest.raises(ValueError, match="tangent for argument 0 has dtype int64; expected float64"):
        hvp_f(x, x, 0.5, np.ones(4, dtype=np.int64))
    with pytest.raises(ValueError, match="tangent for argument 0 has dtype complex128"):
        hvp_f(x, x, 0.5, np.ones(4) * 1j)
    pairs = unigrad.hessian_vector_product(energy, argnums=(0, 1), backend=bk)
    with pytest.raises(ValueError, match="must have the structure of the arguments"):
        pairs(x, x, 0.5, np.ones(4))  # one array for two arguments
    with pytest.raises(ValueError, match="tangent for argument 1 has shape"):
        pairs(x, x, 0.5, (np.ones(4), np.ones(5)))
    tree = unigrad.hessian_vector_product(params_loss, backend=bk)
    params = {"w": np.ones((3, 2)), "b": np.ones(2)}
    with pytest.raises(ValueError, match=r"tangent for argument 0\['b'\] has shape"):
        tree(params, np.ones((4, 3)), 0.5, {"w": np.ones((3, 2)), "b": np.ones(3)})
    with pytest.raises(ValueError, match="must have the structure of argument 0"):
        tree(params, np.ones((4, 3)), 0.5, {"w": np.ones((3, 2))})
    # a float32 tangent for a float64 primal and a Python int are cast, as for jvp
    np.testing.assert_allclose(_np(hvp_f(x, x, 0.5, np.ones(4, np.float32))), _np(hvp_f(x, x, 0.5, np.ones(4))))
    np.testing.assert_allclose(_np(unigrad.hessian_vector_product(lambda s: s ** 3, backend=bk)(2.0, 1)), 12.0)


def test_other_misuse_is_refused_with_a_pointer():
    with pytest.raises(TypeError, match="one scalar"):
        unigrad.hessian_vector_product(lambda x: x ** 2)(np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="f's arguments and then the tangents"):
        unigrad.hessian_vector_product(lambda x: x ** 2)()
    with pytest.raises(ValueError, match="out of range"):  # argnums counts f's arguments, not the tangents
        unigrad.hessian_vector_product(lambda x: (x ** 2).sum(), argnums=1)(np.ones(2), np.ones(2))
    with pytest.raises(TypeError, match="hessian_vector_product"):
        unigrad.hvp(lambda x: (x ** 2).sum(), (np.ones(2),), (np.ones(2),), compile=True)
    # nothing to differentiate: an empty result, f checked
    assert unigrad.hessian_vector_product(lambda p, x: (x ** 2).sum())({}, np.ones(2), {}) == {}
    with pytest.raises(TypeError, match="one scalar"):
        unigrad.hessian_vector_product(lambda p, x: x ** 2)({}, np.ones(2), {})


def test_device_places_the_inputs():
    hvp_f = unigrad.hessian_vector_product(lambda x: unigrad.namespace(x).sum(x ** 3), device="cpu")
    np.testing.assert_allclose(_np(hvp_f(np.array([1.0, 2.0]), np.ones(2))), [6.0, 12.0])
