"""The call path and its caches: no signature, warm-up or cached decision changes a result.

Each case here returned a silently wrong number (or crashed) before the call plan was rebuilt
(issue "No silent wrong result", ../shared/repros/r01-r14): a repeat call must give exactly what a
fresh transform gives for the same arguments.
"""

from __future__ import annotations

import collections
import importlib.util
import os
import subprocess
import sys

import numpy as np
import optree
import pytest

import unigrad
from unigrad.tape import NumpyBackend

from conftest import key_orders, uncached

HAVE = {name: importlib.util.find_spec(mod) is not None
        for name, mod in (("torch", "torch"), ("jax", "jax"), ("tensorflow", "tensorflow"))}
BACKENDS = ["numpy"] + [name for name, ok in HAVE.items() if ok]
COMPILERS = [name for name in ("jax", "tensorflow") if HAVE[name]]


def _np(tree):
    return unigrad.to_numpy(tree)


# ------------------------------------------------------------------------------ batched_jacobian

def per_example_loss(w, x):  # row b: (x_b . w)^2 / B -- rows independent, but the batch size is used
    return (x @ w) ** 2 / x.shape[0]


def _want_per_example_loss(w, x):
    B = x.shape[0]
    return np.stack([2 * (x[b] @ w)[:, None] * w.T / B for b in range(B)])


@pytest.mark.parametrize("bk", BACKENDS)
@pytest.mark.parametrize("compile", [False, True])
def test_batched_jacobian_after_a_zero_warm_up_uses_the_batch_size(bk, compile):
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((3, 1)), rng.standard_normal((8, 3))
    jac = unigrad.batched_jacobian(per_example_loss, argnums=1, backend=bk, compile=compile)
    jac(w, np.zeros((8, 3)))
    np.testing.assert_allclose(_np(jac(w, x)), _want_per_example_loss(w, x), rtol=1e-10)


@pytest.mark.skipif(not HAVE["jax"], reason="jax not installed")
def test_batched_jacobian_float32_first_call_and_position_dependence():
    rng = np.random.default_rng(1)
    w32 = rng.standard_normal((3, 1)).astype(np.float32)
    x32 = (0.01 * rng.standard_normal((64, 3))).astype(np.float32)
    got = _np(unigrad.batched_jacobian(per_example_loss, argnums=1, backend="jax")(w32, x32))
    np.testing.assert_allclose(got, _want_per_example_loss(w32.astype(np.float64), x32.astype(np.float64)),
                               rtol=1e-4, atol=1e-12)

    def scaled_by_position(x):
        xp = unigrad.namespace(x)
        return xp.sin(x) * (1.0 + xp.arange(x.shape[0], dtype=x.dtype))[:, None]

    for B in (26, 27):
        x = rng.standard_normal((B, 3))
        got = _np(unigrad.batched_jacobian(scaled_by_position, backend="jax")(x))
        want = np.stack([np.diag(np.cos(x[b]) * (1 + b)) for b in range(B)])
        np.testing.assert_allclose(got, want, rtol=1e-10)


def colnorm(x):  # normalises each feature over the batch: rows coupled
    xp = unigrad.namespace(x)
    return x / xp.sqrt(xp.sum(x * x, axis=0))


def couples_through_the_mean(x):  # coupled, but the coupling vanishes where x is 0
    xp = unigrad.namespace(x)
    return x + x * xp.mean(x, axis=0)


@pytest.mark.parametrize("bk", BACKENDS)
def test_independence_probe_not_settled_at_a_degenerate_point(bk):
    x = np.random.default_rng(0).standard_normal((4, 3)) + 1
    bj = unigrad.batched_jacobian(colnorm, backend=bk)
    with np.errstate(all="ignore"), pytest.raises(ValueError, match="cannot tell|not independent"):
        bj(np.zeros((4, 3)))  # NaN tangents: the probe cannot decide, and says so
    with pytest.raises(ValueError, match="not independent"):
        bj(x)
    bj = unigrad.batched_jacobian(couples_through_the_mean, backend=bk)
    with pytest.raises(ValueError, match="not independent"):
        bj(np.zeros((4, 3)))  # the coupling vanishes here, not at the probe's random nearby point
    with pytest.raises(ValueError, match="not independent"):
        bj(x)


def test_check_batch_independence_finds_a_coupling_that_vanishes_at_the_point():
    with pytest.raises(ValueError, match="not independent"):
        unigrad.check_batch_independence(couples_through_the_mean, np.zeros((4, 3)))
    unigrad.check_batch_independence(lambda x: np.float64(2.0) * x ** 2, np.zeros((4, 3)))


def test_batched_jacobian_separable_must_be_a_bool():
    with pytest.raises(TypeError, match="separable"):
        unigrad.batched_jacobian(colnorm, separable="yes")


# ------------------------------------------------------------------------------ static arguments

def pick(x, k):
    return unigrad.namespace(x).sum(x[k] ** 2)


@pytest.mark.parametrize("bk", COMPILERS)
def test_static_arguments_are_keyed_by_type_and_exact_value(bk):
    x = np.arange(6.0).reshape(2, 3)
    g = unigrad.grad(pick, backend=bk, compile=True)
    np.testing.assert_array_equal(_np(g(x, 1)), [[0, 0, 0], [6, 8, 10]])
    fresh = unigrad.grad(pick, backend=bk)
    try:
        want = _np(fresh(x, True))
    except Exception as exc:  # tensorflow does not index with a bool: the compiled call must raise too
        with pytest.raises(type(exc)):
            g(x, True)
    else:
        np.testing.assert_array_equal(_np(g(x, True)), want)

    def signed(x, s):
        xp = unigrad.namespace(x)
        return xp.sum(x * xp.copysign(xp.ones_like(x), s * xp.ones_like(x)))

    gs = unigrad.grad(signed, backend=bk, compile=True)
    np.testing.assert_array_equal(_np(gs(np.ones(2), 0.0)), [1, 1])
    np.testing.assert_array_equal(_np(gs(np.ones(2), -0.0)), [-1, -1])

    def scaled(x, s):
        return unigrad.namespace(x).sum(x * s)

    gf = unigrad.grad(scaled, backend=bk, compile=True)
    a = _np(gf(np.ones(2), 0.5))
    b = _np(gf(np.ones(2), np.float32(0.25)))
    np.testing.assert_allclose(a, [0.5, 0.5])
    np.testing.assert_allclose(b, [0.25, 0.25])


@pytest.mark.skipif(not HAVE["jax"], reason="jax not installed")
@pytest.mark.skipif(os.environ.get("UNIGRAD_NO_CACHE") is not None, reason="counts a cached program's traces")
def test_numpy_floating_scalars_are_program_inputs():
    traces = []

    def f(x, lr):
        traces.append(1)
        return unigrad.namespace(x).sum(x * x) * lr

    g = unigrad.grad(f, backend="jax", compile=True)
    x = unigrad.asarray(np.ones(3), backend="jax")
    for i in range(10):
        np.testing.assert_allclose(_np(g(x, np.float32(0.1 * (i + 1)))), 2 * np.float32(0.1 * (i + 1)),
                                   rtol=1e-6)
    assert len(traces) == 1


# ------------------------------------------------------------------------------ structures

def dict_loss(p):
    xp = unigrad.namespace(p["w1"])
    return xp.sum(p["w1"] * 1.0 + p["w2"] * 10.0)


@pytest.mark.parametrize("bk", BACKENDS)
@pytest.mark.parametrize("compile", [False, True])
def test_gradient_dicts_keep_this_calls_key_order(bk, compile):
    g = unigrad.grad(dict_loss, backend=bk, compile=compile)
    g({"w1": np.ones(2), "w2": np.ones(2)})
    params = {"w2": np.ones(2), "w1": np.ones(2)}
    grads = g(params)
    assert list(grads) == ["w2", "w1"]
    for p, gg, want in zip(params, grads.values(), (10.0, 1.0)):
        np.testing.assert_allclose(_np(gg), [want, want], err_msg=p)


def aux_by_value(x):
    xp = unigrad.namespace(x)
    loss = xp.sum(x * x)
    aux = {"loss": loss}
    if bool(xp.max(x) > 1.0):
        aux["big"] = xp.max(x)
    return loss, aux


@pytest.mark.parametrize("bk", [b for b in BACKENDS if b in ("numpy", "torch")])
def test_compile_on_a_backend_that_compiles_nothing_runs_f_each_call(bk):
    for compile in (False, True):
        g = unigrad.value_and_grad(aux_by_value, has_aux=True, backend=bk, compile=compile)
        g(np.array([0.5, 0.2]))
        (_, aux), _ = g(np.array([2.0, 0.2]))
        assert sorted(aux) == ["big", "loss"]


@pytest.mark.parametrize("bk", BACKENDS)
@pytest.mark.parametrize("compile", [False, True])
def test_non_array_aux_comes_back_as_f_returned_it(bk, compile):
    def f(x):
        return unigrad.namespace(x).sum(x * x), {"name": "mse", "lr": 0.1234567891234, "n": 3, "none": None}

    (value, aux), grads = unigrad.value_and_grad(f, has_aux=True, backend=bk, compile=compile)(
        np.array([1.0, 2.0]))
    assert aux == {"name": "mse", "lr": 0.1234567891234, "n": 3, "none": None}
    assert type(aux["lr"]) is float and type(aux["n"]) is int
    np.testing.assert_allclose(_np(grads), [2.0, 4.0])
    np.testing.assert_allclose(float(_np(value)), 5.0)


@pytest.mark.parametrize("empty", [{}, (), [], None], ids=repr)
@pytest.mark.parametrize("bk", BACKENDS)
def test_argnum_on_an_empty_pytree_returns_it(empty, bk):
    f = lambda p, x: unigrad.namespace(x).sum(x * x)  # noqa: E731
    assert unigrad.grad(f, backend=bk)(empty, np.arange(3.0)) == empty
    value, g = unigrad.value_and_grad(f, backend=bk)(empty, np.arange(3.0))
    assert g == empty
    np.testing.assert_allclose(float(_np(value)), 5.0)
    assert unigrad.jacobian(f, backend=bk)(empty, np.arange(3.0)) == empty


# ------------------------------------------------------------------------------ backends

def _scaled_backend(k):
    class Scaled(NumpyBackend):
        name = "scaled"

        def value_and_grad(self, f, primals, *, has_aux=False, check=None):
            o, g, a = NumpyBackend.value_and_grad(self, f, primals, has_aux=has_aux, check=check)
            return o, tuple(x * k for x in g), a
    return Scaled


def test_a_replaced_backend_is_used_by_existing_transforms():
    unigrad.register_backend("scaled_test", _scaled_backend(2))
    try:
        for compile in (False, True):
            unigrad.register_backend("scaled_test", _scaled_backend(2), replace=True)
            g = unigrad.grad(lambda v: unigrad.namespace(v).sum(v), backend="scaled_test", compile=compile)
            np.testing.assert_array_equal(g(np.ones(2)), [2, 2])
            unigrad.register_backend("scaled_test", _scaled_backend(3), replace=True)
            np.testing.assert_array_equal(g(np.ones(2)), [3, 3])
    finally:
        unigrad.unregister_backend("scaled_test")


# ------------------------------------------------------------------------------ call orders

def _program(seed):
    """A random sequence of calls: signatures, dtypes, pytree kinds, key orders, static values."""
    rng = np.random.default_rng(seed)
    Pair = collections.namedtuple("Pair", "a b")
    calls = []
    for _ in range(12):
        n = int(rng.integers(1, 4))
        dtype = [np.float64, np.float32][int(rng.integers(2))]
        a = rng.standard_normal(n).astype(dtype)
        b = rng.standard_normal(n).astype(dtype)
        kind = int(rng.integers(5))
        if kind == 0:
            params = a
        elif kind == 1:
            params = {"a": a, "b": b} if rng.integers(2) else {"b": b, "a": a}
        elif kind == 2:
            params = Pair(a, b)
        elif kind == 3:
            params = [a, (b,)]
        else:
            params = {"a": a, "rest": {"b": b}} if rng.integers(2) else {"rest": {"b": b}, "a": a}
        scale = [1, 2.0, -0.0, 0.0, True, np.float64(0.5)][int(rng.integers(6))]
        calls.append((params, scale))
    return calls


def _scaled_loss(params, scale):
    xs = optree.tree_leaves(params)
    xp = unigrad.namespace(*xs)
    total = 0.0
    for k, x in enumerate(xs):
        total = total + xp.sum(xp.sin(x) * (k + 1))
    return total * (scale + 1.5)


def _first_sin(params, scale):
    xs = optree.tree_leaves(params)
    return unigrad.namespace(*xs).sin(xs[0]) * scale


def _same(a, b):
    la, ta = optree.tree_flatten(a)
    lb, tb = optree.tree_flatten(b)
    assert ta == tb and str(ta) == str(tb)
    assert key_orders(a) == key_orders(b)
    for x, y in zip(la, lb):
        x, y = _np(x), _np(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


# Each seed is 12 calls, eager and compiled, each against an uncached reference: seconds per call on JAX and
# TensorFlow (a program per signature). The default run keeps every backend, eager and compiled, with seed 0
# (and all three seeds where calls are cheap: the tape and torch); the other seeds on JAX and TensorFlow run in
# the thorough job (marker slow).
CALL_ORDER_CASES = [pytest.param(bk, seed, id=f"{bk}-{seed}",
                                 marks=[pytest.mark.slow] if bk in COMPILERS and seed > 0 else [])
                    for bk in BACKENDS for seed in range(3)]


@pytest.mark.parametrize("bk, seed", CALL_ORDER_CASES)
def test_random_call_orders_match_a_fresh_transform(seed, bk):
    compile_choices = (False, True) if bk in COMPILERS else (False,)
    for compile in compile_choices:
        vg = unigrad.value_and_grad(_scaled_loss, backend=bk, compile=compile)
        jac = unigrad.jacobian(_first_sin, backend=bk, compile=compile)
        for params, scale in _program(seed):
            primal_scale = scale if isinstance(scale, float) else 1.0
            got_vg, got_jac = vg(params, scale), jac(params, scale)
            out, vjp_fn = unigrad.vjp(_scaled_loss, params, primal_scale, backend=bk)
            got_vjp = vjp_fn(np.float64(1.0) if _np(out).dtype == np.float64 else np.float32(1.0))[0]
            with uncached():  # the reference shares no cache (vjp's plans are module-level)
                want_vg = unigrad.value_and_grad(_scaled_loss, backend=bk)(params, scale)
                want_jac = unigrad.jacobian(_first_sin, backend=bk)(params, scale)
                fresh_out, fresh_vjp = unigrad.vjp(_scaled_loss, params, primal_scale, backend=bk)
                want_vjp = fresh_vjp(np.float64(1.0) if _np(fresh_out).dtype == np.float64 else np.float32(1.0))[0]
            _same(got_vg, want_vg)
            _same(got_jac, want_jac)
            _same(got_vjp, want_vjp)


# ------------------------------------------------------------------------------ caches off

def test_caches_off_switch_stores_nothing(monkeypatch):
    from unigrad._caches import BoundedCache
    from unigrad._repeats import REPEATS

    monkeypatch.setenv("UNIGRAD_NO_CACHE", "1")
    cache = BoundedCache(REPEATS)
    cache.put("k", 1)
    assert cache.get("k") is None
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 3))
    np.testing.assert_allclose(g(np.arange(3.0)), [0.0, 3.0, 12.0])
    np.testing.assert_allclose(g(np.arange(3.0)), [0.0, 3.0, 12.0])
    monkeypatch.delenv("UNIGRAD_NO_CACHE")
    cache = BoundedCache(REPEATS)
    cache.put("k", 1)
    assert cache.get("k") == 1


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("UNIGRAD_NO_CACHE") is not None, reason="already the uncached run")
def test_transform_suites_pass_with_every_cache_off():
    """The tests that exercise the transforms, run again in a process with every cache off: a cache that
    returns what the uncached path would not is caught here, not by luck.

    The thorough job's (marker slow: a second process importing every framework, minutes on 2 cores). The
    default run compares cached calls with uncached ones directly: every signature component in
    tests/test_call_keys.py, random call orders and the fresh references here, each against a transform made
    and run under ``conftest.uncached()``."""
    here = os.path.dirname(__file__)
    modules = ["test_calls.py", "test_api.py", "test_errors.py", "test_selection.py", "test_generic_defaults.py"]
    env = dict(os.environ, UNIGRAD_NO_CACHE="1", TF_CPP_MIN_LOG_LEVEL="2")
    # (test_random_call_orders_match_a_fresh_transform compares cached calls with uncached ones: with every cache
    # off both sides are the uncached path, so it would check nothing here, for minutes on JAX and TensorFlow)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "-k", "not test_random_call_orders_match_a_fresh_transform",
                           *[os.path.join(here, m) for m in modules]],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


# ------------------------------------------------------------------------------ evaluate

@pytest.mark.skipif(not HAVE["jax"], reason="jax not installed")
def test_evaluate_runs_f_as_the_transforms_do():
    x = np.array([1.0 + 1e-12, 2.0])  # float64: JAX alone would compute it in float32

    def f(x, k):
        xp = unigrad.namespace(x)
        return xp.sum(x * k) - 3.0

    out = unigrad.evaluate(f, x, 1, backend="jax")
    assert str(out.dtype) == "float64"
    assert float(out) == pytest.approx(1e-12, abs=1e-15)
    value, _ = unigrad.value_and_grad(f, backend="jax")(x, 1)
    assert float(out) == float(value)
    np.testing.assert_array_equal(unigrad.evaluate(lambda x: x * 2, np.arange(3.0)), [0.0, 2.0, 4.0])


def test_hessian_rechecks_a_decision_made_from_output_shapes():
    def f(x):  # the output's shape depends on the values, not on the signature
        xp = unigrad.namespace(x)
        y = x ** 3
        return xp.sum(y) if float(unigrad.to_numpy(x)[0]) > 0 else y

    h = unigrad.hessian(f)
    np.testing.assert_allclose(h(np.array([1.0, 2.0])), np.diag([6.0, 12.0]))
    got = h(np.array([-1.0, 2.0]))
    want = np.zeros((2, 2, 2))
    want[0, 0, 0], want[1, 1, 1] = -6.0, 12.0
    np.testing.assert_allclose(got, want)


def test_independent_rows_with_infinite_derivatives_are_not_refused():
    x = np.array([[0.0, 1.0], [4.0, 0.0], [1.0, 9.0]])  # sqrt's derivative is infinite at 0: NaN tangents
    with np.errstate(all="ignore"):
        jac = unigrad.batched_jacobian(lambda x: unigrad.namespace(x).sqrt(x))(x)
        want = 0.5 / np.sqrt(x)
    np.testing.assert_array_equal(np.diagonal(jac, axis1=1, axis2=2), want)  # (off the diagonal: 0 * inf)


@pytest.mark.parametrize("bk", BACKENDS)
def test_jacobian_dtype_does_not_depend_on_the_mode(bk):
    x32 = np.array([0.5, 1.5], dtype=np.float32)
    data = np.array([1.0, 2.0, 3.0])  # float64: the outputs are float64

    def f(x, d):
        xp = unigrad.namespace(x)
        return xp.sin(xp.sum(x) * d)

    blocks = [_np(unigrad.jacobian(f, mode=m, backend=bk)(x32, data)) for m in ("rev", "fwd", "auto")]
    assert {str(b.dtype) for b in blocks} == {"float64"}, [b.dtype for b in blocks]
    np.testing.assert_allclose(blocks[0], blocks[1], rtol=1e-6)
