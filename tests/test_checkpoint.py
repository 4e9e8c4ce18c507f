"""``unigrad.checkpoint``: the derivatives of the plain function on every backend, in every transform,
with the block really recomputed (the tape keeps only its inputs), and closures refused where a
backend would lose their derivative."""

from __future__ import annotations

import importlib.util

import numpy as np
import optree
import pytest

import unigrad
from unigrad import _memory

HAVE = {name: importlib.util.find_spec(mod) is not None
        for name, mod in (("torch", "torch"), ("jax", "jax"), ("tensorflow", "tensorflow"))}
BACKENDS = ["numpy"] + [name for name, ok in HAVE.items() if ok]
if importlib.util.find_spec("autograd") is not None:  # a plugin: the contract's generic default (a rule)
    BACKENDS.append("autograd")


def block(x, w):
    xp = unigrad.namespace(x, w)
    return {"a": xp.sin(xp.tanh(x @ w)), "b": [xp.cos(x) * 0.5]}


def make_loss(wrap):
    def loss(x, w):
        xp = unigrad.namespace(x, w)
        for _ in range(3):
            out = wrap(block)(x, w)
            x = out["a"] + out["b"][0]
        return xp.sum(x ** 2)
    return loss


def make_vector(wrap):
    def vector(x, w):
        return make_loss(wrap)(x, w) * x
    return vector


L, V = make_loss, make_vector
TRANSFORMS = {  # each: (wrap, backend, x, w) -> derivatives of the loss built with wrap
    "grad": lambda F, be, x, w: unigrad.grad(L(F), argnums=(0, 1), backend=be)(x, w),
    "grad_compiled": lambda F, be, x, w: unigrad.grad(L(F), argnums=(0, 1), backend=be, compile=True)(x, w),
    "vjp": lambda F, be, x, w: unigrad.vjp(L(F), x, w, backend=be)[1](np.asarray(1.5)),
    "jvp": lambda F, be, x, w: unigrad.jvp(L(F), (x, w), (np.cos(x), np.sin(w)), backend=be)[1],
    "jacrev": lambda F, be, x, w: unigrad.jacrev(V(F), argnums=(0, 1), backend=be)(x, w),
    "jacfwd": lambda F, be, x, w: unigrad.jacfwd(V(F), argnums=(0, 1), backend=be)(x, w),
    "hessian": lambda F, be, x, w: unigrad.hessian(L(F), argnums=(0, 1), backend=be)(x, w),
    "hvp": lambda F, be, x, w: unigrad.hvp(L(F), (x, w), (np.cos(x), np.sin(w)), backend=be),
    "vmap_grad": lambda F, be, x, w: unigrad.vmap(unigrad.grad(L(F), argnums=1, backend=be), in_axes=(0, None),
                                                  backend=be)(np.stack([x, x + 1]), w),
}


@pytest.fixture
def point():
    rng = np.random.default_rng(0)
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 4)) / 2


# On JAX and TensorFlow (seconds a case) the default run keeps a transform of each kind -- reverse (grad, vjp),
# compiled (grad_compiled), forward (jvp), second order (hessian), vmap (vmap_grad) -- and the thorough job
# (marker slow) adds the other spellings of those modes there (jacrev, jacfwd, hvp); the tape, torch and
# autograd run every transform by default.
SLOW_ON = {"jax": ("jacrev", "jacfwd", "hvp"), "tensorflow": ("jacrev", "jacfwd", "hvp")}
CASES = [pytest.param(be, transform, id=f"{be}-{transform}",
                      marks=[pytest.mark.slow] if transform in SLOW_ON.get(be, ()) else [])
         for be in BACKENDS for transform in TRANSFORMS]


@pytest.mark.parametrize("be, transform", CASES)
def test_same_derivatives_as_the_plain_function(be, transform, point):
    x, w = point
    run = TRANSFORMS[transform]
    got = optree.tree_leaves(unigrad.to_numpy(run(unigrad.checkpoint, be, x, w)))
    want = optree.tree_leaves(unigrad.to_numpy(run(lambda f: f, be, x, w)))
    assert len(got) == len(want) > 0
    for g, e in zip(got, want):
        assert np.all(np.isfinite(e)) and np.any(e != 0)
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("be", BACKENDS)
def test_batched_jacobian_of_a_checkpointed_block(be, point):
    x, w = point
    got = unigrad.batched_jacobian(lambda x, w: unigrad.checkpoint(block)(x, w)["a"], backend=be)(x, w)
    want = unigrad.batched_jacobian(lambda x, w: block(x, w)["a"], backend=be)(x, w)
    np.testing.assert_allclose(unigrad.to_numpy(got), unigrad.to_numpy(want), rtol=1e-12)


def _counting_block(calls):
    def counted(x, w):
        calls.append(1)
        xp = unigrad.namespace(x, w)
        return xp.tanh(x @ w)
    return counted


@pytest.mark.parametrize("be", [b for b in BACKENDS if b != "jax"])  # jax.checkpoint traces: no count
def test_the_block_runs_again_in_the_backward_pass(be, point):
    x, w = point
    calls = []
    counted = _counting_block(calls)
    unigrad.grad(lambda x, w: unigrad.namespace(x).sum(unigrad.checkpoint(counted)(x, w)), backend=be)(x, w)
    assert len(calls) == 2  # forward, and once more in the backward pass
    calls.clear()
    unigrad.grad(lambda x, w: unigrad.namespace(x).sum(counted(x, w)), backend=be)(x, w)
    assert len(calls) == 1


def test_jax_marks_the_block_for_rematerialisation(point):
    jax = pytest.importorskip("jax")
    seen = []

    def loss(x, w):
        return unigrad.checkpoint(lambda x, w: block(x, w)["a"])(x, w).sum()

    def spy(x, w):
        seen.append(str(jax.make_jaxpr(loss)(x, w)))
        return loss(x, w)

    unigrad.grad(spy, backend="jax")(*point)
    assert "checkpoint" in seen[0] or "remat" in seen[0]


def test_tape_keeps_only_the_blocks_inputs():
    """Peak memory of a gradient through 16 blocks of 8 operations: the checkpointed chain holds about one
    block's intermediates at a time (measured 0.1x the plain chain; asserted with a wide margin)."""
    x = np.random.default_rng(1).standard_normal(20_000)

    def inner(x):
        xp = unigrad.namespace(x)
        for _ in range(8):
            x = xp.sin(x) * 1.01
        return x

    def chain(wrap):
        def f(x):
            for _ in range(16):
                x = wrap(inner)(x)
            return unigrad.namespace(x).sum(x)
        return f

    b = unigrad.get_backend("numpy")
    plain = unigrad.grad(chain(lambda f: f))
    remat = unigrad.grad(chain(unigrad.checkpoint))
    np.testing.assert_allclose(remat(x), plain(x), rtol=1e-13)
    peak_plain = _memory.peak_bytes(b, lambda: plain(x))
    peak_remat = _memory.peak_bytes(b, lambda: remat(x))
    assert peak_remat < 0.4 * peak_plain, (peak_remat, peak_plain)


@pytest.mark.parametrize("be", BACKENDS)
def test_pytrees_keywords_and_static_leaves(be, point):
    x, w = point

    def blockish(pair, *, scale, name):
        assert name == "static" and isinstance(scale, float)
        xp = unigrad.namespace(pair[0])
        return {"y": xp.sin(pair[0]) * scale, "z": (pair[0] @ pair[1],)}

    def loss(x, w, wrap):
        out = wrap(blockish)((x, w), scale=3.0, name="static")
        xp = unigrad.namespace(x)
        return xp.sum(out["y"]) + xp.sum(out["z"][0] ** 2)

    got = unigrad.grad(loss, argnums=(0, 1), backend=be)(x, w, unigrad.checkpoint)
    want = unigrad.grad(loss, argnums=(0, 1), backend=be)(x, w, lambda f: f)
    for g, e in zip(unigrad.to_numpy(got), unigrad.to_numpy(want)):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_outside_any_transform_it_is_the_function(point):
    out = unigrad.checkpoint(block)(*point)
    np.testing.assert_array_equal(out["a"], block(*point)["a"])


@pytest.mark.parametrize("be", [b for b in BACKENDS if b != "jax"])
def test_a_closed_over_traced_value_is_refused(be, point):
    """The tape, torch and TensorFlow recompute from the arguments: a differentiated value the block
    closes over would lose its derivative, so it raises instead."""
    x, w = point

    def loss(x, w):
        return unigrad.namespace(x).sum(unigrad.checkpoint(lambda x: x @ w)(x))

    with pytest.raises(TypeError, match="closes over"):
        if be == "torch":  # (grad runs on plain autograd there, which differentiates closures: the next test)
            unigrad.vjp(loss, x, w, backend=be)
        else:
            unigrad.grad(loss, argnums=(0, 1), backend=be)(x, w)
    # nothing left behind: the same transform works afterwards
    g = unigrad.grad(lambda x, w: unigrad.namespace(x).sum(unigrad.checkpoint(lambda x, w: x @ w)(x, w)),
                     argnums=1, backend=be)(x, w)
    np.testing.assert_allclose(unigrad.to_numpy(g), np.broadcast_to(x.sum(0)[:, None], (4, 4)), rtol=1e-12)


def test_torch_grad_differentiates_closures_on_plain_autograd(point):
    """grad on torch runs on plain autograd where no torch.func transform is around it: the block is
    torch.utils.checkpoint's, which recomputes closures with their derivatives."""
    pytest.importorskip("torch")
    x, w = point

    def loss(x, w):
        xp = unigrad.namespace(x)
        return xp.sum(xp.tanh(unigrad.checkpoint(lambda x: x @ w)(x)))

    got = unigrad.grad(loss, argnums=(0, 1), backend="torch")(x, w)
    want = unigrad.grad(lambda x, w: unigrad.namespace(x).sum(unigrad.namespace(x).tanh(x @ w)), argnums=(0, 1))(x, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(unigrad.to_numpy(g), r, rtol=1e-12)


def test_jax_differentiates_closures(point):
    pytest.importorskip("jax")
    x, w = point

    def loss(x, w):
        return unigrad.namespace(x).sum(unigrad.checkpoint(lambda x: x @ w)(x))

    g = unigrad.grad(loss, argnums=1, backend="jax")(x, w)
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(x.sum(0)[:, None], (4, 4)), rtol=1e-12)


def test_errors_name_the_function():
    with pytest.raises(TypeError, match="callable"):
        unigrad.checkpoint(3)

    def returns_text(x):
        return "text"

    with pytest.raises(TypeError, match="returns_text must return arrays"):
        unigrad.grad(lambda x: unigrad.checkpoint(returns_text)(x))(np.ones(2))


def test_an_exception_inside_the_block_leaves_no_state(point):
    def failing(x):
        raise ValueError("inside the block")

    with pytest.raises(ValueError, match="inside the block"):
        unigrad.grad(lambda x: unigrad.checkpoint(failing)(x))(point[0])
    g = unigrad.grad(lambda x: (unigrad.checkpoint(lambda x: x * x)(x)).sum())(point[0])
    np.testing.assert_allclose(g, 2 * point[0])


def test_torch_outside_torch_func_uses_torch_checkpoint():
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    calls = []
    counted = _counting_block(calls)
    unigrad.checkpoint(counted)(x, w).sum().backward()
    assert len(calls) == 2
    expected = torch.autograd.grad(counted(x, w).sum(), (x, w))
    torch.testing.assert_close(w.grad, expected[1])
    torch.testing.assert_close(x.grad, expected[0])
