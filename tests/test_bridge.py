"""``unigrad.bridge``: a function of one backend inside another backend's transforms, for every pair,
both modes, compiled and second order where the pair reaches it, and a wrong inner derivative caught."""

from __future__ import annotations

import importlib.util

import numpy as np
import optree
import pytest

import unigrad
from unigrad.testing import check_grads

HAVE = {name: importlib.util.find_spec(mod) is not None
        for name, mod in (("torch", "torch"), ("jax", "jax"), ("tensorflow", "tensorflow"), ("autograd", "autograd"))}
BACKENDS = ["numpy"] + [name for name, ok in HAVE.items() if ok]  # autograd: a plugin, through the contract
PAIRS = [(outer, inner) for outer in BACKENDS for inner in BACKENDS if outer != inner]


def portable(x, w):
    xp = unigrad.namespace(x, w)
    return {"a": xp.sin(x @ w), "b": xp.tanh(x) * 2.0}


def make_loss(fn):
    def loss(x, w):
        out = fn(x, w)
        xp = unigrad.namespace(x)
        return xp.sum(out["a"] ** 2) + xp.sum(out["b"] * x)
    return loss


@pytest.fixture
def point():
    rng = np.random.default_rng(0)
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 2)) / 2


def _close(got, want):
    got, want = optree.tree_leaves(unigrad.to_numpy(got)), optree.tree_leaves(unigrad.to_numpy(want))
    assert len(got) == len(want) > 0
    for g, e in zip(got, want):
        assert np.any(e != 0)
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("outer,inner", PAIRS, ids=[f"{o}-calls-{i}" for o, i in PAIRS])
def test_every_pair_both_modes(outer, inner, point):
    x, w = point
    bridged = make_loss(unigrad.bridge(portable, backend=inner))
    native = make_loss(portable)
    _close(unigrad.grad(bridged, argnums=(0, 1), backend=outer)(x, w),
           unigrad.grad(native, argnums=(0, 1), backend=outer)(x, w))
    _close(unigrad.jvp(bridged, (x, w), (np.cos(x), np.sin(w)), backend=outer)[1],
           unigrad.jvp(native, (x, w), (np.cos(x), np.sin(w)), backend=outer)[1])
    out = unigrad.evaluate(lambda x, w: unigrad.bridge(portable, backend=inner)(x, w), x, w, backend=outer)
    assert unigrad.get_backend(outer).is_array(out["a"])  # results come back as the caller's arrays


SECOND = [(o, i) for o, i in PAIRS if o in ("numpy", "jax", "tensorflow") and i in ("numpy", "torch", "jax", "tensorflow")]


@pytest.mark.parametrize("outer,inner", SECOND, ids=[f"{o}-calls-{i}" for o, i in SECOND])
def test_second_order_and_compiled(outer, inner, point):
    x, w = point
    bridged = make_loss(unigrad.bridge(portable, backend=inner))
    native = make_loss(portable)
    _close(unigrad.hessian(bridged, argnums=1, backend=outer)(x, w),
           unigrad.hessian(native, argnums=1, backend=outer)(x, w))
    if outer != "numpy":  # jax.pure_callback / tf.py_function inside the compiled program
        _close(unigrad.grad(bridged, argnums=(0, 1), backend=outer, compile=True)(x, w),
               unigrad.grad(native, argnums=(0, 1), backend=outer)(x, w))


def test_torch_code_inside_a_jax_gradient(point):
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    x, w = point

    def torch_layer(x, w):
        assert isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
        return torch.nn.functional.softplus(x @ w)

    g = unigrad.grad(lambda w: unigrad.bridge(torch_layer, "torch")(x, w).sum(), backend="jax")(w)
    expected = x.T @ (1 / (1 + np.exp(-(x @ w))))
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-12)
    assert type(g).__module__.startswith("jax")


def test_jax_code_inside_a_torch_gradient(point):
    pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    x, w = point

    def jax_layer(x, w):
        assert isinstance(x, jax.Array)
        return jax.numpy.cos(x @ w)

    g = unigrad.grad(lambda w: unigrad.bridge(jax_layer, "jax")(x, w).sum(), backend="torch")(w)
    np.testing.assert_allclose(g.numpy(), x.T @ -np.sin(x @ w), rtol=1e-12)


def test_jax_arrays_reach_torch_as_copies_that_torch_may_write():
    """JAX's arrays are immutable, and PyTorch may write into what it is given (an in-place f, docs/conventions.md):
    the torch block gets a copy of the DLPack view (same values, its own memory), so a write there never changes
    the caller's JAX array."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    x = unigrad.asarray(np.arange(1.0, 7.0).reshape(2, 3), backend="jax")
    seen = {}

    def torch_fn(t):
        seen["pointer"] = t.data_ptr()
        t.mul_(10.0)  # a write into its argument
        return t * 2

    got = unigrad.evaluate(lambda x: unigrad.bridge(torch_fn, "torch")(x), x, backend="jax")
    assert seen["pointer"] != x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(x), np.arange(1.0, 7.0).reshape(2, 3))  # the caller's array kept
    np.testing.assert_array_equal(np.asarray(got), 20.0 * np.arange(1.0, 7.0).reshape(2, 3))
    assert isinstance(torch.zeros(1), torch.Tensor) and jax.numpy is not None


def test_a_wrong_inner_derivative_is_caught(point):
    """The inner backend's sin has a derivative off by 1e-3: check_grads on the calling backend sees it,
    in both modes, through the bridge."""
    from conftest import make_broken_backend

    outer = "jax" if HAVE["jax"] else "torch" if HAVE["torch"] else "autograd"
    broken = make_broken_backend("sin_scale")
    unigrad.register_backend("broken_for_bridge", broken, replace=True)
    try:
        x, w = point
        f = unigrad.bridge(portable, backend="broken_for_bridge")
        for mode in ("fwd", "rev"):
            with pytest.raises(AssertionError):
                check_grads(lambda x, w: f(x, w)["a"], (x, w), order=1, modes=(mode,), backend=outer)
        check_grads(lambda x, w: unigrad.bridge(portable, backend="numpy")(x, w)["a"], (x, w), order=1,
                    backend=outer)  # the right one passes
    finally:
        unigrad.unregister_backend("broken_for_bridge")


def test_torch_vmap_of_a_bridged_call_says_why():
    pytest.importorskip("torch")
    x = np.ones((2, 3))
    with pytest.raises(TypeError, match="no host callback"):
        unigrad.jacrev(lambda x: unigrad.bridge(lambda y: y * 2.0, "numpy")(x), backend="torch")(x)


def test_same_backend_and_errors(point):
    x, w = point
    out = unigrad.bridge(portable, backend="numpy")(x, w)
    np.testing.assert_array_equal(out["a"], portable(x, w)["a"])
    with pytest.raises(TypeError, match="callable"):
        unigrad.bridge(None, backend="numpy")
    with pytest.raises(Exception, match="nonexistent"):
        unigrad.bridge(portable, backend="nonexistent")

    def text(x):
        return "text"

    if HAVE["torch"]:
        with pytest.raises(TypeError, match="text must return arrays"):
            unigrad.grad(lambda x: unigrad.bridge(text, "torch")(x))(x)


# ------------------------------------------------------------------ the backend hooks the bridge calls

def _jax_without_host_callback(returns_none):
    """JAX with no host callback: the base class's (not overridden), or one that returns None."""
    pytest.importorskip("jax")
    from unigrad_jax import JaxBackend

    class Base(JaxBackend):
        array_modules = ()  # the real JAX backend keeps its arrays' ownership

    if returns_none:
        class NoHost(Base):
            def host_callback(self, fn, arrays, out_specs, *, jvp=None):
                return None
    else:
        class NoHost(Base):
            host_callback = unigrad.Backend.host_callback

    return NoHost


@pytest.mark.parametrize("returns_none", [False, True], ids=["not-overridden", "returns-None"])
def test_a_compiled_bridge_without_a_host_callback_says_why(register_backend, point, returns_none):
    name = register_backend(f"jax_no_host_{returns_none}", _jax_without_host_callback(returns_none))
    x, w = point
    bridged = make_loss(unigrad.bridge(portable, backend="numpy"))
    eager = unigrad.grad(bridged, argnums=1, backend=name)(x, w)  # eager values hold data: no callback needed
    _close(eager, unigrad.grad(make_loss(portable), argnums=1, backend="jax")(x, w))
    with pytest.raises(TypeError, match=f"the {name} backend has no host callback to run the numpy function"):
        unigrad.grad(bridged, argnums=1, backend=name, compile=True)(x, w)


def test_jax_primal_outputs_of_a_bridged_jvp_rule_stay_unbatched(point, monkeypatch):
    """JAX takes a custom_jvp's primal outputs from its rule (primals_from_jvp_rule): jacfwd maps the rule
    over tangents, and primal outputs taken from the tangents' call would come out batched."""
    pytest.importorskip("jax")
    x, w = point
    f = unigrad.bridge(lambda x, w: portable(x, w)["a"], backend="numpy")
    want = unigrad.jacfwd(lambda w: portable(x, w)["a"], backend="jax")(w)
    _close(unigrad.jacfwd(lambda w: f(x, w), backend="jax")(w), want)
    b = unigrad.get_backend("jax")
    monkeypatch.setattr(b, "primals_from_jvp_rule", False)
    with pytest.raises(ValueError, match="batched"):  # the flag is what keeps them unbatched
        unigrad.jacfwd(lambda w: f(x, w), backend="jax")(w)


def test_a_value_carrying_a_derivative_is_not_handed_over(register_backend):
    """carries_derivative: a backend saying its value carries a derivative stops the bridge from handing it
    over as data (here the tape's own values, claimed by a subclass)."""
    from unigrad.tape import NumpyBackend

    class Claims(NumpyBackend):
        array_modules = ()

        def carries_derivative(self, x):
            return True

    name = register_backend("claims_derivative", Claims)
    with pytest.raises(TypeError, match=f"a {name} value being differentiated cannot be handed over as data"):
        unigrad.evaluate(lambda x: unigrad.bridge(lambda y: y * 2.0, "numpy")(x), np.ones(3), backend=name)
