"""The JAX backend (unigrad_jax): every transform against the NumPy tape, float64 through the scoped
x64 context (never the global flag), conversions, compile, complex, edge inputs, threads, errors."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import optree
import pytest

from conftest import skip_unless, skip_module_unless

jax = skip_module_unless("jax")
pytestmark = pytest.mark.unigrad_backend("jax")  # run on each device --unigrad-devices names
import jax.numpy as jnp  # noqa: E402

import unigrad  # noqa: E402

JAX = unigrad.get_backend("jax")


def _np(x):
    return unigrad.to_numpy(x)


def _close(actual, expected, rtol=1e-10, atol=1e-12):
    """Pytrees of arrays (any backend) equal within tolerance, with the same structure."""
    a_leaves, a_tree = optree.tree_flatten(actual)
    e_leaves, e_tree = optree.tree_flatten(expected)
    assert a_tree == e_tree, (a_tree, e_tree)
    for a, e in zip(a_leaves, e_leaves):
        if isinstance(e, (str, float, int)):  # aux leaves that are not arrays come back as they were
            assert a == e and type(a) is type(e)
            continue
        assert np.shape(_np(a)) == np.shape(_np(e))
        np.testing.assert_allclose(_np(a), _np(e), rtol=rtol, atol=atol)


def _x64_on() -> bool:
    return bool(jax.config.jax_enable_x64)


# Portable functions (Array API): the same code runs on the tape and on JAX.
from unigrad.testing.conformance import mlp, mlp_loss as loss  # noqa: E402


def two_outputs(x, y):
    xp = unigrad.namespace(x, y)
    return {"s": xp.sin(x) * xp.sum(y), "p": x[:2] * y[0] ** 2}


def rows(x, z):
    """Batch -> batch, independent rows, two inputs and two outputs of different per-example sizes."""
    xp = unigrad.namespace(x, z)
    return xp.tanh(x * z[:, :1] ** 2), xp.sin(z) * xp.sum(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4), "x": rng.standard_normal((5, 3)),
            "u": rng.standard_normal(3), "v": rng.standard_normal(2), "z": rng.standard_normal((5, 2))}


# ------------------------------------------------------------------ every transform against the tape

def _with_aux(w, b, x):
    return loss(w, b, x), {"note": "kept", "scale": 2.0, "out": mlp(w, b, x)}


CASES = {
    "grad": lambda d, be: unigrad.grad(loss, argnums=(0, 1, 2), backend=be)(d["w"], d["b"], d["x"]),
    "value_and_grad_aux": lambda d, be: unigrad.value_and_grad(_with_aux, argnums=1, has_aux=True, backend=be)(
        d["w"], d["b"], d["x"]),
    "vjp": lambda d, be: unigrad.vjp(two_outputs, d["u"], d["v"], backend=be)[1](
        {"s": np.linspace(-1, 1, 3), "p": np.array([0.5, -2.0])}),
    "jvp": lambda d, be: unigrad.jvp(two_outputs, (d["u"], d["v"]), (np.ones(3), np.array([0.3, -1.0])),
                                     backend=be),
    **{f"jacobian_{mode}_chunk{chunk}": (
        lambda d, be, mode=mode, chunk=chunk: unigrad.jacobian(two_outputs, argnums=(0, 1), mode=mode,
                                                               chunk_size=chunk, backend=be)(d["u"], d["v"]))
       for mode, chunk in (("rev", None), ("rev", 2), ("fwd", None), ("fwd", 2), ("auto", None))},
    "jacobian_aux": lambda d, be: unigrad.jacobian(_with_aux, argnums=0, mode="fwd", chunk_size=5, has_aux=True,
                                                   backend=be)(d["w"], d["b"], d["x"]),
    **{f"batched_jacobian_{mode}_chunk{chunk}": (
        lambda d, be, mode=mode, chunk=chunk: unigrad.batched_jacobian(rows, argnums=(0, 1), mode=mode,
                                                                       chunk_size=chunk, backend=be)(d["x"], d["z"]))
       for mode in ("rev", "fwd") for chunk in (None, 2)},
    "batched_jacobian_aux": lambda d, be: unigrad.batched_jacobian(
        lambda x: (mlp(d["w"], d["b"], x), ("tag", mlp(d["w"], d["b"], x).sum())), mode="fwd", has_aux=True,
        backend=be)(d["x"]),
    # (chunk_size=None: test_hessian_and_hvp_methods_agree_with_the_core)
    "hessian_chunk5": lambda d, be: unigrad.hessian(loss, argnums=(0, 1), chunk_size=5, backend=be)(
        d["w"], d["b"], d["x"]),
    "hvp": lambda d, be: unigrad.hvp(loss, (d["w"], d["b"], d["x"]), (np.ones((3, 4)), np.ones(4), np.ones((5, 3))),
                                     backend=be),
    **{f"vmap_chunk{chunk}": (
        lambda d, be, chunk=chunk: unigrad.vmap(lambda x, w: {"a": mlp(w, d["b"], x), "n": x * 2.0},
                                                in_axes=(0, None), out_axes=1, chunk_size=chunk, backend=be)(
            d["x"], d["w"]))
       for chunk in (None, 2)},
}


# Chunked reverse mode compiles a program per chunk shape (the slowest cases here): eager, it runs in the thorough
# job (marker slow); the default run keeps chunked reverse mode compiled (test_compiled_transforms_match_eager:
# jacobian and batched_jacobian rev with chunk_size=2) and chunked forward mode and vmap eager here.
SLOW_CASES = {"test_transform_matches_tape[jacobian_rev_chunk2]",
              "test_transform_matches_tape[batched_jacobian_rev_chunk2]"}


@pytest.mark.parametrize("case", list(CASES))
def test_transform_matches_tape(case, data):
    expected = CASES[case](data, "numpy")
    actual = CASES[case](data, "jax")
    _close(actual, expected)
    for leaf in jax.tree_util.tree_leaves(actual):
        if isinstance(leaf, jax.Array):
            assert leaf.dtype == jnp.float64 and not isinstance(leaf, jax.core.Tracer)


def test_compiled_transforms_match_eager(data):
    d = data
    kinds = {
        "grad": lambda **kw: unigrad.grad(loss, argnums=(0, 2), backend="jax", **kw)(d["w"], d["b"], d["x"]),
        "jac_rev": lambda **kw: unigrad.jacobian(two_outputs, argnums=(0, 1), mode="rev", chunk_size=2,
                                                 backend="jax", **kw)(d["u"], d["v"]),
        "jac_fwd": lambda **kw: unigrad.jacobian(two_outputs, argnums=(0, 1), mode="fwd", chunk_size=2,
                                                 backend="jax", **kw)(d["u"], d["v"]),
        "batched_rev": lambda **kw: unigrad.batched_jacobian(rows, argnums=(0, 1), mode="rev", chunk_size=2,
                                                             backend="jax", **kw)(d["x"], d["z"]),
        "batched_fwd": lambda **kw: unigrad.batched_jacobian(rows, argnums=(0, 1), mode="fwd", backend="jax",
                                                             **kw)(d["x"], d["z"]),
        "hessian": lambda **kw: unigrad.hessian(loss, argnums=(0, 1), chunk_size=5, backend="jax", **kw)(
            d["w"], d["b"], d["x"]),
    }
    for name, run in kinds.items():
        eager, compiled = run(), run(compile=True)
        _close(compiled, eager, rtol=1e-12, atol=1e-12)
        assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(compiled)} == {jnp.dtype("float64")}, name
    # the same compiled function, called with float32: a separate (32-bit) trace, float32 results
    batched = unigrad.batched_jacobian(rows, argnums=(0, 1), mode="rev", chunk_size=2, backend="jax", compile=True)
    x32, z32 = d["x"].astype(np.float32), d["z"].astype(np.float32)
    _close(batched(x32, z32), kinds["batched_rev"](), rtol=1e-5, atol=1e-6)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(batched(x32, z32))} == {jnp.dtype("float32")}
    assert batched(d["x"], d["z"])[0][0].dtype == jnp.float64
    assert not _x64_on()


def test_compiled_hessian_of_a_vector_output(data):
    run = lambda **kw: unigrad.hessian(mlp, argnums=1, backend="jax", **kw)(  # noqa: E731
        data["w"], data["b"], data["x"][:2])
    _close(run(compile=True), run())


def test_chunked_vmap_inside_jit_is_a_traced_loop():
    """Inside jit the chunk loop is lax.map (the compiled Jacobians above take the same path)."""
    mapped = JAX.compile(lambda a, c: JAX.vmap(lambda r, c: (jnp.sum(r * c),), [1, None], 0, chunk_size=2)(a, c))
    a = jnp.asarray(np.arange(15.0, dtype=np.float32).reshape(3, 5))
    _close(mapped(a, 2.0 * jnp.ones(3, jnp.float32)), (2.0 * np.arange(15.0).reshape(3, 5).sum(0),))


# ------------------------------------------------------------------ float64 without the global flag

def test_float64_is_computed_in_float64_without_flipping_the_global_flag():
    assert not _x64_on()
    seen = {}

    def f(x):
        seen["x64"], seen["dtype"] = _x64_on(), x.dtype
        return unigrad.namespace(x).sum(x ** 2 + 1e-10 * x)  # 1e-10 vanishes in float32 arithmetic

    x = np.array([1.0, 2.0, 3.0])
    g = unigrad.grad(f, backend="jax")(x)
    assert seen == {"x64": True, "dtype": jnp.float64}
    assert g.dtype == jnp.float64
    np.testing.assert_array_equal(_np(g), 2 * x + 1e-10)
    assert not _x64_on() and jnp.zeros(2).dtype == jnp.float32  # nothing left behind
    unigrad.grad(f, backend="jax")(x.astype(np.float32))
    assert seen == {"x64": False, "dtype": jnp.float32}  # 32-bit inputs never switch x64 on


def _closing_over(data, scalar):
    """A flat function of ``w`` closing over ``data``, as the core hands it over (``closure_arrays``);
    it records whether it ran under x64. Elementwise in ``w`` (rows independent), or its sum."""
    seen = []

    def f(w):
        seen.append(_x64_on())
        out = jnp.sin(w) * jnp.real(jnp.sum(data)).astype(w.dtype)
        return (jnp.sum(out),) if scalar else (out,)

    f.closure_arrays = (data,)
    return f, seen


def _x64_cases():
    w = JAX.asarray(np.array([0.5, 1.5], np.float32))
    t = JAX.asarray(np.ones(2, np.float32))
    wb = JAX.asarray(np.array([[0.5], [1.5]], np.float32))
    return {  # case: (scalar f?, call)
        "evaluate": (False, lambda f: JAX.evaluate(f, (w,))),
        "vjp": (False, lambda f: JAX.vjp(f, (w,))[1]((t,))),
        "jvp": (False, lambda f: JAX.jvp(f, (w,), (t,))),
        "jacrev": (False, lambda f: JAX.jacrev(f, (w,))),
        "jacfwd": (False, lambda f: JAX.jacfwd(f, (w,), chunk_size=1)),
        "batched_jacobian": (False, lambda f: JAX.batched_jacobian(f, (wb,))),
        "per_example_jacobian": (False, lambda f: JAX.per_example_jacobian(f, (wb,))),
        "hessian": (True, lambda f: JAX.hessian(f, (w,))),
        "hvp": (True, lambda f: JAX.hvp(f, (w,), (t,))),
        "value_and_grad": (True, lambda f: JAX.value_and_grad(f, (w,))),
        "vmap": (False, lambda f: JAX.vmap(f, [0])(wb)),
    }


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64")
@pytest.mark.parametrize("case", list(_x64_cases()))
def test_x64_is_decided_by_the_floating_arrays_f_closes_over(case):
    """The rule: x64 iff some floating or complex array of the call is 64-bit, differentiated or
    a closure array of the flat function; integer arrays never decide."""
    scalar, call = _x64_cases()[case]
    with jax.enable_x64(True):
        data64 = jnp.asarray(np.array([1.0, 2.0]))
        complex128 = jnp.asarray(np.array([1.0, 2.0], np.complex128))
        labels64 = jnp.asarray(np.array([1, 2]))
    data32 = jnp.asarray(np.array([1.0, 2.0], np.float32))
    for data, want in ((data64, True), (complex128, True), (labels64, False), (data32, False)):
        f, seen = _closing_over(data, scalar)
        call(f)
        assert seen and all(s == want for s in seen), (case, str(data.dtype), seen)
    assert not _x64_on()


def test_compiled_calls_follow_the_floating_only_rule():
    """The compiled program takes every array of the call: int64 labels do not switch x64 on, float64 data does."""
    seen = []

    def program(w, other):
        seen.append(_x64_on())
        return (jnp.sum(w * other.astype(w.dtype)),)

    compiled = JAX.compile(program)
    w = JAX.asarray(np.array([0.5, 1.5], np.float32))
    (value,) = compiled(w, JAX.asarray(np.array([1, 2])))
    assert seen == [False] and value.dtype == jnp.float32
    (value,) = compiled(w, JAX.asarray(np.array([1.0, 2.0])))
    assert seen == [False, True]
    assert not _x64_on()


def test_eager_and_compiled_agree_with_int64_labels():
    """r08: float32 data and int64 labels compute in float32, eagerly and compiled, to the same value."""
    def loss_fn(w, x, labels):
        xp = unigrad.namespace(w, x)
        logits = x @ w
        onehot = xp.astype(labels[:, None] == xp.arange(logits.shape[1])[None, :], logits.dtype)
        scale = xp.linspace(1.0, 2.0, logits.shape[0])  # float64 under x64: it would widen the value
        return xp.sum(logits * onehot * scale[:, None])

    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # JAX's note that int64 labels compute in int32
        eager = unigrad.value_and_grad(loss_fn, backend="jax")(w, x, labels)
        compiled = unigrad.value_and_grad(loss_fn, backend="jax", compile=True)(w, x, labels)
    for e, c in zip(eager, compiled):
        assert e.dtype == c.dtype == jnp.float32
        np.testing.assert_array_equal(_np(e), _np(c))


def test_eager_and_compiled_agree_with_float64_data():
    """float32 parameters, float64 data (not differentiated): float64 eagerly and compiled."""
    def loss_fn(w, x):
        xp = unigrad.namespace(w, x)
        return xp.sum(xp.tanh(x @ xp.astype(w, x.dtype)) ** 2) + 1e-10

    rng = np.random.default_rng(0)
    w = rng.standard_normal(3).astype(np.float32)
    x = rng.standard_normal((5, 3))
    eager = unigrad.value_and_grad(loss_fn, backend="jax")(w, x)
    compiled = unigrad.value_and_grad(loss_fn, backend="jax", compile=True)(w, x)
    assert eager[0].dtype == compiled[0].dtype == jnp.float64
    assert eager[1].dtype == compiled[1].dtype == jnp.float32
    np.testing.assert_allclose(_np(eager[0]), _np(compiled[0]), rtol=1e-12)
    np.testing.assert_allclose(_np(eager[1]), _np(compiled[1]), rtol=1e-6)


def test_x64_scope_is_thread_local():
    inside, release = threading.Event(), threading.Event()
    result = {}

    def f(x):
        inside.set()
        assert release.wait(10)
        return unigrad.namespace(x).sum(x ** 3)

    def worker():
        result["g"] = unigrad.grad(f, backend="jax")(np.array([2.0, 3.0]))

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert inside.wait(10)
        # While the other thread is inside its x64 scope, this one still sees the global setting.
        assert not _x64_on()
        assert jnp.ones(2).dtype == jnp.float32 and (jnp.ones(2, jnp.float32) * 2.0).dtype == jnp.float32
        g32 = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend="jax")(np.ones(2, np.float32))
        assert g32.dtype == jnp.float32
    finally:
        release.set()
        thread.join()
    assert result["g"].dtype == jnp.float64
    np.testing.assert_array_equal(_np(result["g"]), [12.0, 27.0])


@pytest.mark.parametrize("fast", [True, False])
def test_the_compiled_calls_x64_scope_is_left_as_found(monkeypatch, fast):
    """A compiled repeat enters the thread-local x64 scope by JAX's state object itself (``in_x64``: no
    context manager on the hot path; ``fast`` False: the public ``jax.enable_x64`` where that object is not
    as expected). Either way the result is float64, and the scope is left as found: after a call, after a
    call that raised, and inside a scope the caller entered (nested, still on after the call). Copies of
    one NumPy argument or of two give the same results."""
    from unigrad_jax import _x64scope

    if not fast:
        monkeypatch.setattr(_x64scope, "_X64_STATE", None)
    elif _x64scope._X64_STATE is None:
        pytest.skip("this JAX keeps its x64 state otherwise: the public context manager is used")

    def f(x, w, c):
        return jnp.sum(jnp.sin(x * w) * c)

    g = unigrad.grad(f, argnums=(0, 1), backend="jax", compile=True)
    x, w = np.linspace(-1.0, 1.0, 7), np.linspace(0.5, 1.5, 7)
    g1 = unigrad.grad(lambda x, c: jnp.sum(jnp.sin(x) * c), backend="jax", compile=True)
    for _ in range(3):  # the first call builds the program; the others are repeats
        gx, gw = g(x, w, 0.5)
        assert gx.dtype == jnp.float64 and not _x64_on()
        np.testing.assert_allclose(np.asarray(gx), np.cos(x * w) * w * 0.5, rtol=1e-14)
        one = g1(x, 0.5)
        assert one.dtype == jnp.float64 and not _x64_on()
        np.testing.assert_allclose(np.asarray(one), np.cos(x) * 0.5, rtol=1e-14)
    with pytest.raises(Exception):
        g(x, w[:3], 0.5)  # (shapes that do not broadcast: raises inside the program's trace)
    assert not _x64_on()
    with jax.enable_x64(True):
        g(x, w, 0.5), g1(x, 0.5)
        assert _x64_on()
    assert not _x64_on()


def test_no_float64_truncation_anywhere_in_the_transforms(data):
    """JAX warns when it truncates a 64-bit value; the backend's own work never triggers that.

    (Left out: transforms where the core itself evaluates ``f`` outside the backend -- mode="auto",
    hessian, hvp, B == 0 -- and so outside the x64 scope.)
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for case in ("grad", "vjp", "jvp", "jacobian_rev_chunk2", "jacobian_fwd_chunk2", "jacobian_fwd_chunkNone",
                     "batched_jacobian_rev_chunk2", "batched_jacobian_fwd_chunkNone", "vmap_chunk2", "vmap_chunkNone"):
            CASES[case](data, "jax")
        x = JAX.asarray(np.arange(3.0))
        _close(JAX.hessian(lambda x: (jnp.sum(x ** 3),), (x,), chunk_size=2), ((np.diag(6.0 * np.arange(3.0)),),))
        _close(JAX.evaluate(lambda x: (jnp.sum(x) + 1e-10,), (x,)), (np.array(3.0 + 1e-10),), rtol=0, atol=0)
        assert JAX.cast(JAX.asarray(np.ones(2, np.float32)), "float64").dtype == jnp.float64
        assert JAX.zeros_like(x).dtype == jnp.float64 and JAX.stop_gradient(x).dtype == jnp.float64
        compiled = JAX.compile(lambda x: (jnp.sum(x * x) + 1e-10,))  # jnp.sum alone would truncate to float32
        for arg in (x, np.arange(3.0)):
            (value,) = compiled(arg)
            assert value.dtype == jnp.float64 and float(value) == 5.0 + 1e-10
    assert not _x64_on()


# ------------------------------------------------------------------ dtypes and complex

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_gradient_dtype_equals_input_dtype(dtype):
    values = np.array([0.5, -1.5, 2.0]) + (1j * np.array([1.0, 0.25, -2.0]) if dtype.startswith("complex") else 0)
    x = unigrad.asarray(values, backend="jax", dtype=dtype)
    assert JAX.dtype(x) == dtype

    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.abs(x) ** 2)

    g = unigrad.grad(f)(x)  # backend inferred from the jax array
    assert isinstance(g, jax.Array) and JAX.dtype(g) == dtype
    tol = {"float16": 1e-2, "bfloat16": 2e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(_np(g).astype(np.complex128), 2 * np.conj(_np(x).astype(np.complex128)), rtol=tol)
    _, t = unigrad.jvp(lambda x: x * 2.0, (x,), (x,))
    assert JAX.dtype(t) == dtype
    assert JAX.dtype(unigrad.jacobian(lambda x: x * x, mode="rev")(x)) == dtype


def test_complex_convention_is_jax_and_tape():
    z = np.array(3.0 + 4.0j)
    g = unigrad.grad(lambda z: unigrad.namespace(z).abs(z) ** 2, backend="jax")(z)
    assert g.dtype == jnp.complex128 and complex(_np(g)) == 6.0 - 8.0j
    # holomorphic f: the VJP is ct * f'(z), not conjugated
    w = np.array([1.0 + 2.0j, -0.5 + 0.25j])
    ct = np.array([1j, 2.0 - 1.0j])
    for backend in ("jax", "numpy"):
        (vjp_z,) = unigrad.vjp(lambda z: z ** 3, w, backend=backend)[1](ct)
        np.testing.assert_allclose(_np(vjp_z), ct * 3 * w ** 2, rtol=1e-14)
    _close(unigrad.jacobian(lambda z: z ** 3, mode="rev", backend="jax")(w),
           unigrad.jacobian(lambda z: z ** 3, mode="rev", backend="numpy")(w))

    def energy(z):  # real-valued, not holomorphic: second order follows the same convention
        xp = unigrad.namespace(z)
        return xp.sum(xp.abs(z ** 2 + z) ** 2)

    _close(unigrad.hessian(energy, backend="jax")(w), unigrad.hessian(energy, backend="numpy")(w))
    _close(unigrad.hvp(energy, (w,), (ct,), backend="jax"), unigrad.hvp(energy, (w,), (ct,), backend="numpy"))


# ------------------------------------------------------------------ the cross-engine rules

def test_unused_inputs_get_zeros_never_none_or_float0():
    x, y = np.ones(3), np.ones((2, 2))
    gx, gy = unigrad.grad(lambda x, y: unigrad.namespace(x).sum(x ** 2), argnums=(0, 1), backend="jax")(x, y)
    assert gy.dtype == jnp.float64 and gy.shape == (2, 2)
    np.testing.assert_array_equal(_np(gy), 0.0)
    _, t = unigrad.jvp(lambda x: unigrad.namespace(x).ones_like(x) * 2.0, (x,), (x,), backend="jax")
    assert t.dtype == jnp.float64
    np.testing.assert_array_equal(_np(t), 0.0)
    for mode in ("rev", "fwd"):
        jac = unigrad.jacobian(lambda x, y: x * 2.0, argnums=(0, 1), mode=mode, backend="jax")(x, y)
        assert jac[1].shape == (3, 2, 2) and jac[1].dtype == jnp.float64
        np.testing.assert_array_equal(_np(jac[1]), 0.0)
        bj = unigrad.batched_jacobian(lambda a, c: a * 3.0, argnums=(0, 1), mode=mode, backend="jax")(
            np.ones((4, 2)), np.ones((4, 5)))
        assert bj[1].shape == (4, 2, 5) and bj[1].dtype == jnp.float64
        np.testing.assert_array_equal(_np(bj[1]), 0.0)


@pytest.mark.parametrize("kind", ["zero_size", "zero_d", "python_scalar", "negative_stride", "non_contiguous",
                                  "fortran_order"])
def test_edge_inputs_match_tape(kind):
    base = np.arange(12.0).reshape(3, 4) / 7.0
    x = {"zero_size": np.ones((0, 3)), "zero_d": np.array(0.7), "python_scalar": 0.7,
         "negative_stride": base[::-1, ::-2], "non_contiguous": base[:, ::2],
         "fortran_order": np.asfortranarray(base)}[kind]

    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x) * x)

    def g(x):
        return unigrad.namespace(x).cos(x) * 2.0

    def results(backend):
        return [unigrad.grad(f, backend=backend)(x), unigrad.jacobian(g, mode="fwd", backend=backend)(x),
                unigrad.jacobian(g, mode="rev", backend=backend)(x)]

    actual = results("jax")
    _close(actual, results("numpy"))
    assert all(a.dtype == jnp.float64 for a in actual)


def test_batched_jacobian_with_zero_batch_float32():
    bj = unigrad.batched_jacobian(lambda x: x * 2.0, mode="rev", backend="jax")(np.ones((0, 3), np.float32))
    assert bj.shape == (0, 3, 3) and bj.dtype == jnp.float32


def test_batched_jacobian_with_zero_batch_float64():
    bj = unigrad.batched_jacobian(lambda x: x * 2.0, mode="rev", backend="jax")(np.ones((0, 3)))
    assert bj.shape == (0, 3, 3) and bj.dtype == jnp.float64


def test_batched_jacobian_is_exact_with_a_batched_closure():
    """The sum trick calls f on the whole batch: a batched non-differentiated argument is paired row by row."""
    rng = np.random.default_rng(3)
    x, c = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    for mode in ("rev", "fwd"):
        bj = unigrad.batched_jacobian(lambda x, c: x * c, argnums=0, mode=mode, backend="jax")(x, c)
        np.testing.assert_array_equal(_np(bj), np.stack([np.diag(row) for row in c]))


def test_batched_jacobian_rejects_an_output_without_the_batch():
    x = JAX.asarray(np.ones((4, 3)))
    for mode in ("rev", "fwd"):
        with pytest.raises(ValueError, match=r"output 0 has shape \(1, 3\).*batch axis of size 4"):
            JAX.batched_jacobian(lambda x: (jnp.sum(x, axis=0, keepdims=True),), (x,), mode=mode)


def test_hessian_and_hvp_methods_agree_with_the_core(data):
    w, b, x = (JAX.asarray(data[k]) for k in ("w", "b", "x"))
    flat = lambda w, b: (loss(w, b, x),)  # noqa: E731
    expected = unigrad.hessian(loss, argnums=(0, 1), backend="numpy")(data["w"], data["b"], data["x"])
    _close(JAX.hessian(flat, (w, b)), expected)  # chunked: the same jacfwd as the hessian_chunk5 case
    hv = JAX.hvp(flat, (w, b), (JAX.asarray(np.ones((3, 4))), JAX.asarray(np.ones(4))))
    _close(hv, unigrad.hvp(loss, (data["w"], data["b"], data["x"]), (np.ones((3, 4)), np.ones(4), np.zeros((5, 3))),
                           backend="numpy")[:2])


# ------------------------------------------------------------------ robustness

def test_an_exception_inside_f_leaves_no_state_behind():
    def bad(x):
        raise RuntimeError("boom inside f")

    x = np.arange(4.0).reshape(2, 2)
    runs = [
        lambda: unigrad.grad(lambda x: bad(x), backend="jax")(x),
        lambda: unigrad.jvp(bad, (x,), (x,), backend="jax"),
        lambda: unigrad.jacobian(bad, mode="fwd", backend="jax")(x),
        lambda: unigrad.jacobian(bad, mode="rev", chunk_size=1, backend="jax")(x),
        lambda: unigrad.batched_jacobian(bad, mode="rev", check_independence="never", backend="jax")(x),
        lambda: unigrad.grad(lambda x: bad(x), backend="jax", compile=True)(x),
        lambda: unigrad.vmap(bad, chunk_size=1, backend="jax")(x),
    ]
    with jax.checking_leaks():  # raises if a tracer escaped
        for run in runs:
            with pytest.raises(RuntimeError, match="boom inside f"):
                run()
            assert not _x64_on()
        g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend="jax")(x)
    np.testing.assert_array_equal(_np(g), 2 * x)
    assert jnp.zeros(2).dtype == jnp.float32


def test_concurrent_calls_from_8_threads_are_exact():
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((3, 4)).astype(np.float32 if k % 2 else np.float64) for k in range(8)]

    def work(w):
        x = np.linspace(-1, 1, 15).reshape(5, 3).astype(w.dtype)  # the shapes of `data`: warm op caches
        g = unigrad.grad(loss, argnums=(0, 1), backend="jax")(w, np.ones(4, w.dtype), x)
        j = unigrad.jacobian(mlp, argnums=0, mode="fwd", backend="jax")(w, np.ones(4, w.dtype), x)
        return [_np(g[0]), _np(g[1]), _np(j)]

    expected = [work(w) for w in inputs]
    results, errors = [None] * 8, []

    def worker(k):
        try:
            for _ in range(2):
                out = work(inputs[k])
                assert all(a.dtype == e.dtype and np.array_equal(a, e) for a, e in zip(out, expected[k]))
            results[k] = out
        except BaseException as exc:  # reported below, with the thread's index
            errors.append((k, exc))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(r is not None for r in results)
    assert not _x64_on()


# ------------------------------------------------------------------ arrays, conversion, devices

def test_backend_is_inferred_from_jax_arrays():
    x = jnp.asarray(np.arange(3.0, dtype=np.float32))
    assert unigrad.namespace(x) is JAX.namespace()
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2))(x)  # no backend=
    assert isinstance(g, jax.Array) and g.dtype == jnp.float32
    np.testing.assert_array_equal(_np(g), [0.0, 2.0, 4.0])


def test_asarray_keeps_dtypes_and_handles_layouts():
    assert JAX.asarray(np.ones(2)).dtype == jnp.float64
    assert JAX.asarray(np.arange(3)).dtype == jnp.int64
    assert JAX.asarray(np.array([True, False])).dtype == jnp.bool_
    assert JAX.asarray(np.asarray(1.5)).dtype == jnp.float64 and JAX.asarray(np.asarray(1.5)).shape == ()
    assert JAX.asarray([1, 2]).dtype == jnp.int64
    assert JAX.asarray(np.ones(2), dtype="bfloat16").dtype == jnp.bfloat16
    assert JAX.asarray(np.ones(2), dtype="float32").dtype == jnp.float32
    strided = np.arange(10.0)[::-3]
    np.testing.assert_array_equal(_np(JAX.asarray(strided)), strided)
    a = JAX.asarray(np.ones(3, np.float32))
    assert JAX.asarray(a) is a and JAX.asarray(a, device="cpu") is a
    assert not _x64_on()


def test_asarray_on_a_traced_value_casts_inside_the_transform():
    def f(x):
        assert JAX.is_array(x) and isinstance(x, jax.core.Tracer) and JAX.device(x) is None
        y = JAX.asarray(x, dtype="float32", device="cpu")
        assert y.dtype == jnp.float32
        return unigrad.namespace(y).sum(y ** 2)

    g = unigrad.grad(f, backend="jax")(np.array([1.0, 2.0]))
    assert g.dtype == jnp.float64
    np.testing.assert_allclose(_np(g), [2.0, 4.0])


def test_devices_and_placement():
    names = JAX.devices()
    assert names[0] == "cpu" and all(n == "cpu" or n.startswith("cuda:") for n in names)
    cpu = jax.devices("cpu")[0]
    for spec in ("cpu", "CPU", "cpu:0", cpu):
        x = JAX.asarray(np.ones(2), device=spec)
        assert JAX.device(x) == cpu
    with pytest.raises(ValueError, match="unknown device 'tpu:0'.*'cpu'"):
        JAX.asarray(np.ones(2), device="tpu:0")
    with pytest.raises(ValueError, match="not available"):
        JAX.asarray(np.ones(2), device=f"cuda:{len(names) + 3}")
    with pytest.raises(TypeError, match="device must be"):
        JAX.asarray(np.ones(2), device=3.5)


@pytest.mark.skipif("not any(n.startswith('cuda') for n in unigrad.get_backend('jax').devices())",
                    reason="no GPU visible to JAX")
def test_results_stay_on_the_gpu():
    x = JAX.asarray(np.arange(3.0, dtype=np.float32), device="cuda")
    assert JAX.device(x).platform == "gpu"
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2))(x)
    assert JAX.device(g) == JAX.device(x)
    assert JAX.device(JAX.asarray(np.ones(2), device="gpu:0")).platform == "gpu"


def test_torch_tensors_convert_through_dlpack():
    torch = skip_unless("torch")
    assert JAX.accepts_dlpack
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    for t in (base, base.t(), base[:, ::2], torch.ones(3, requires_grad=True), torch.arange(3)):
        a = JAX.asarray(t)
        assert isinstance(a, jax.Array) and str(a.dtype) == str(t.dtype).replace("torch.", "")
        np.testing.assert_array_equal(np.asarray(a), t.detach().numpy())
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend="jax")(base.float())
    assert isinstance(g, jax.Array) and g.dtype == jnp.float32
    np.testing.assert_array_equal(_np(g), 2 * base.numpy())


def test_grad_of_a_committed_float64_array():
    x = jax.device_put(JAX.asarray(np.arange(3.0)), jax.devices("cpu")[0])
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2))(x)
    assert g.dtype == jnp.float64
    np.testing.assert_array_equal(_np(g), [0.0, 2.0, 4.0])


def test_helpers():
    assert JAX.name == "jax" and JAX.version() == jax.__version__
    caps = JAX.capabilities
    assert caps.forward_mode and caps.vmap and caps.compile and caps.higher_order and caps.complex and caps.float64
    x = JAX.asarray(np.ones((2, 3), np.float32))
    assert JAX.shape(x) == (2, 3) and JAX.dtype(x) == "float32"
    assert JAX.dtype(JAX.asarray(np.ones(1), dtype="bfloat16")) == "bfloat16"
    x64 = JAX.cast(x, "float64")
    assert JAX.dtype(x64) == "float64" and JAX.dtype(JAX.zeros_like(x64)) == "float64"
    np.testing.assert_array_equal(_np(x64), np.ones((2, 3)))
    assert not JAX.is_array(np.ones(2)) and JAX.is_array(x)
    # stop_gradient: d/dx sum(stop(x) * x) = x, not 2x
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(JAX.stop_gradient(x) * x), backend="jax")(np.array([1.0, 3.0]))
    np.testing.assert_array_equal(_np(g), [1.0, 3.0])
    assert JAX.to_numpy(JAX.asarray(np.arange(3.0))).dtype == np.float64
    # a cotangent or tangent of another floating dtype is cast, never rejected by JAX or promoted
    x64 = JAX.asarray(np.array([1.0, 2.0]))
    _, vjp_fn, _ = JAX.vjp(lambda x: (x ** 2,), (x64,))
    (g,) = vjp_fn((JAX.asarray(np.ones(2, np.float32)),))
    assert g.dtype == jnp.float64
    np.testing.assert_array_equal(_np(g), [2.0, 4.0])
    _, (t,), _ = JAX.jvp(lambda x: (x ** 2,), (x64,), (JAX.asarray(np.ones(2, np.float32)),))
    assert t.dtype == jnp.float64


def test_per_example_path_only_where_declared_and_no_proof_is_exact():
    """jax vectorises one-example Jacobians (the shortcut) only with separable=True where no proof is exact
    (check_independence="never": the caller vouches); wherever the jaxpr proves the rows independent it takes
    the exact sum trick, in both modes, declared separable or not: as fast (_broadcasts), and nothing an
    analysis of one example could get wrong (f that uses its position, or reads the batch size as a number)."""
    rng = np.random.default_rng(11)
    x, w = rng.standard_normal((5, 3)), rng.standard_normal((3, 3))
    separable = lambda x, w: unigrad.namespace(x).tanh(x @ w)  # noqa: E731
    position = lambda x, w: x * unigrad.namespace(x).reshape(  # noqa: E731
        unigrad.namespace(x).astype(unigrad.namespace(x).arange(x.shape[0]), x.dtype), (-1, 1)) @ w
    batch_size = lambda x, w: (x @ w) ** 2 / x.shape[0]  # noqa: E731
    backend = unigrad.get_backend("jax")
    calls = []
    original = type(backend).per_example_jacobian

    def spy(self, *args, **kwargs):
        calls.append(True)
        return original(self, *args, **kwargs)

    type(backend).per_example_jacobian = spy
    try:
        for f, declared, check in ((separable, True, "once"), (separable, False, "once"), (position, False, "once"),
                                   (batch_size, False, "once"), (batch_size, True, "once"),
                                   (separable, True, "never")):
            for mode in ("fwd", "rev"):
                calls.clear()
                for compile in (False, True):
                    jac = unigrad.batched_jacobian(f, backend="jax", compile=compile, separable=declared, mode=mode,
                                                   check_independence=check)
                    jac(x, w)
                    jac(np.zeros_like(x), w)  # a warm-up point must not settle anything that changes results
                    _close(jac(x, w), unigrad.batched_jacobian(f, backend="numpy")(x, w))
                assert bool(calls) == (check == "never"), (mode, declared, check)
    finally:
        type(backend).per_example_jacobian = original


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">c16", ">i8", "<f8"])
def test_non_native_byte_order_is_accepted_with_values_kept(dtype):
    """Big-endian NumPy input (JAX rejects it by itself) converts to native order, dtype and values kept."""
    values = np.array([0.5, -1.0, 2.0]) + (1j * np.array([1.0, 0.0, -1.0]) if dtype[1] == "c" else 0)
    data = (values if dtype[1] != "i" else np.array([1, -2, 3])).astype(dtype)
    a = unigrad.asarray(data, backend="jax")
    assert a.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(_np(a), data)
    if dtype[1] == "i":
        return
    xp = unigrad.namespace
    square = lambda x: xp(x).sum(xp(x).real(x * xp(x).conj(x)))  # noqa: E731
    g = unigrad.grad(square, backend="jax")(data)
    np.testing.assert_array_equal(_np(g), 2 * np.conj(data))
    _, t = unigrad.jvp(lambda x: x * x, (data,), (data,), backend="jax")
    np.testing.assert_array_equal(_np(t), 2 * data * data)
    _, vjp_fn = unigrad.vjp(lambda x: x * 3, data, backend="jax")
    (v,) = vjp_fn(data)
    np.testing.assert_array_equal(_np(v), 3 * data)
    scaled = unigrad.grad(lambda x, c: xp(x).sum(xp(x).real(x * c)), backend="jax", compile=True)
    np.testing.assert_array_equal(_np(scaled(data, data)), data)


@pytest.mark.parametrize("transform", ["grad", "jvp", "jacfwd", "hessian", "vmap", "grad_compiled"])
def test_numpy_function_on_a_traced_array_is_a_clear_type_error(transform):
    med = lambda v: np.median(v)  # noqa: E731
    x = np.array([3.0, 1.0, 2.0, 0.0])
    call = {"grad": lambda: unigrad.grad(med, backend="jax")(x),
            "jvp": lambda: unigrad.jvp(med, (x,), (x,), backend="jax"),
            "jacfwd": lambda: unigrad.jacfwd(med, backend="jax")(x),
            "hessian": lambda: unigrad.hessian(med, backend="jax")(x),
            "vmap": lambda: unigrad.vmap(med, backend="jax")(x[:, None]),
            "grad_compiled": lambda: unigrad.grad(med, backend="jax", compile=True)(x)}[transform]
    with pytest.raises(TypeError, match=r"NumPy function.*unigrad\.namespace\(x\)"):
        call()


def test_median_is_the_true_median():
    g = unigrad.grad(lambda x: unigrad.namespace(x).median(x), backend="jax")(np.array([3.0, 1.0, 2.0, 0.0]))
    np.testing.assert_array_equal(_np(g), [0.0, 0.5, 0.5, 0.0])
    assert float(unigrad.namespace(jnp.ones(1)).median(jnp.asarray([3.0, 1.0, 2.0, 0.0]))) == 1.5


@pytest.mark.parametrize("fname", ["max", "min"])
def test_reduction_of_an_empty_array_raises_value_error(fname):
    with pytest.raises(ValueError):
        unigrad.grad(lambda x: getattr(unigrad.namespace(x), fname)(x), backend="jax")(np.zeros(0))


# ------------------------------------------------------------------ the namespace's rules at kinks

XP = JAX.namespace()


def test_namespace_is_jax_numpy_but_for_the_documented_functions():
    assert XP.sin is jnp.sin and XP.float32 is jnp.float32 and XP.linalg.det is jnp.linalg.det
    assert XP.__array_api_version__ == jnp.__array_api_version__
    assert {"pow", "power", "abs", "clip"} <= set(XP.__all__) and XP.linalg.vector_norm is not jnp.linalg.vector_norm


def test_pow_derivative_at_zero_base_zero_exponent_is_zero_and_elsewhere_jax_own():
    # jnp.pow's derivative at x = 0, y = 0.0 is NaN; x ** 0 is the constant 1
    assert np.isnan(float(jax.grad(lambda x: jnp.pow(x, 0.0))(0.0)))
    assert float(jax.grad(lambda x: XP.pow(x, 0.0))(0.0)) == 0.0
    assert float(jax.grad(jax.grad(lambda x: XP.pow(x, 0.0)))(0.0)) == 0.0  # no NaN in higher orders
    assert float(jax.jvp(lambda x: XP.power(x, 0.0), (0.0,), (1.0,))[1]) == 0.0
    # away from the kink, values and both derivatives (first, second, mixed) are jnp.pow's
    points = [(2.0, 0.0), (0.5, 1.5), (3.0, -2.0), (0.0, 2.0), (-2.0, 2.0), (0.0, 0.5)]
    for x, y in points:
        ours, jaxs = (lambda a, b: XP.pow(a, b)), (lambda a, b: jnp.pow(a, b))
        np.testing.assert_array_equal(ours(x, y), jaxs(x, y))
        for derivative in (jax.grad, jax.hessian):
            np.testing.assert_allclose(np.asarray(derivative(ours, (0, 1))(x, y), dtype=float),
                                       np.asarray(derivative(jaxs, (0, 1))(x, y), dtype=float),
                                       rtol=1e-6, equal_nan=True)
    # the mixed derivative at y = 0, x != 0 is 1 / x (the fix is only at x = y = 0)
    np.testing.assert_allclose(float(jax.grad(jax.grad(lambda a, b: XP.pow(a, b), 0), 1)(2.0, 0.0)), 0.5)


def test_pow_dtypes_broadcasting_and_transforms():
    x = jnp.asarray([0.0, 1.0, 2.0], jnp.float32)
    assert XP.pow(x, 0.0).dtype == jnp.float32 and XP.pow(x, 2).dtype == jnp.float32
    assert XP.pow(jnp.arange(3), 2).dtype == jnp.pow(jnp.arange(3), 2).dtype
    y = jnp.asarray([[0.0], [1.0]], jnp.float32)
    np.testing.assert_array_equal(XP.pow(x, y), jnp.pow(x, y))
    g = jax.jit(jax.grad(lambda x: jnp.sum(XP.pow(x, 0.0))))(x)
    np.testing.assert_array_equal(g, [0.0, 0.0, 0.0])
    rows = jax.vmap(jax.grad(lambda x, y: XP.pow(x, y)))(jnp.zeros(2), jnp.asarray([0.0, 2.0]))
    np.testing.assert_array_equal(rows, [0.0, 0.0])
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(unigrad.namespace(x).pow(x, 0.0)), backend="jax")(
        np.zeros(2))
    assert _np(g).tolist() == [0.0, 0.0] and g.dtype == jnp.float64


def test_abs_clip_vector_norm_follow_the_cross_backend_rules_with_jax_values():
    assert float(jax.grad(jnp.abs)(0.0)) == 1.0 and float(jax.grad(XP.abs)(0.0)) == 0.0
    assert float(jax.grad(lambda x: jnp.clip(x, 0.0, 1.0))(0.0)) == 0.5
    assert float(jax.grad(lambda x: XP.clip(x, 0.0, 1.0))(0.0)) == 1.0
    assert float(jax.grad(lambda x: XP.clip(x, 0.0, 1.0))(1.0)) == 1.0
    assert np.isnan(np.asarray(jax.grad(jnp.linalg.vector_norm)(jnp.zeros(2)))).all()
    np.testing.assert_array_equal(jax.grad(XP.linalg.vector_norm)(jnp.zeros(2)), [0.0, 0.0])
    x = jnp.asarray([[-2.0, 0.0, 0.5, 3.0, jnp.nan, -0.0], [1.0, -1.0, 0.25, 2.0, 0.0, -jnp.inf]])
    np.testing.assert_array_equal(XP.abs(x), jnp.abs(x))
    assert not jnp.signbit(XP.abs(jnp.asarray(-0.0)))
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(XP.abs(x)))(x[1, :4]), [1.0, -1.0, 1.0, 1.0])
    for lo, hi in [(0.0, 1.0), (None, 0.5), (-1.0, None), (2.0, 1.0), (None, None)]:
        np.testing.assert_array_equal(XP.clip(x, lo, hi), jnp.clip(x, lo, hi))
    g = jax.grad(lambda x: jnp.sum(XP.clip(x, 0.0, 1.0)))(jnp.asarray([-1.0, 0.0, 0.5, 1.0, 2.0]))
    np.testing.assert_array_equal(g, [0.0, 1.0, 1.0, 1.0, 0.0])
    v = jnp.asarray([[3.0, 4.0], [0.0, 0.0]])
    for kw in ({}, {"axis": 1}, {"axis": 1, "keepdims": True}, {"axis": (0, 1)}, {"ord": 1, "axis": 0}):
        np.testing.assert_array_equal(XP.linalg.vector_norm(v, **kw), jnp.linalg.vector_norm(v, **kw))
    g = jax.grad(lambda v: jnp.sum(XP.linalg.vector_norm(v, axis=1)))(v)
    np.testing.assert_allclose(g, [[0.6, 0.8], [0.0, 0.0]])
    assert XP.abs(jnp.asarray([-3 + 4j])).tolist() == [5.0] and XP.abs(jnp.asarray([-2])).dtype == jnp.int32
