"""The public API on the NumPy tape: argnums, has_aux, pytrees, shapes of results, second order."""

from __future__ import annotations

import collections
import gc
import weakref

import numpy as np
import optree
import pytest

from conftest import skip_unless

import unigrad

Pair = collections.namedtuple("Pair", "w b")


def xp_of(*arrays):
    return unigrad.namespace(*arrays)


def loss(params, x):
    xp = xp_of(params["w"], x)
    return xp.sum(xp.tanh(x @ params["w"] + params["b"]) ** 2)


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    x = rng.standard_normal((4, 3))
    return params, x


def manual_grad(params, x):
    z = x @ params["w"] + params["b"]
    t = np.tanh(z)
    dz = 2 * t * (1 - t ** 2)
    return {"w": x.T @ dz, "b": dz.sum(0)}, dz @ params["w"].T


def test_grad_pytree_dict(problem):
    params, x = problem
    g = unigrad.grad(loss)(params, x)
    expected, _ = manual_grad(params, x)
    assert set(g) == {"w", "b"}
    np.testing.assert_allclose(g["w"], expected["w"], rtol=1e-12)
    np.testing.assert_allclose(g["b"], expected["b"], rtol=1e-12)


def test_grad_argnums_tuple_and_negative(problem):
    params, x = problem
    g_params, g_x = unigrad.grad(loss, argnums=(0, 1))(params, x)
    expected, expected_x = manual_grad(params, x)
    np.testing.assert_allclose(g_x, expected_x, rtol=1e-12)
    np.testing.assert_allclose(g_params["w"], expected["w"], rtol=1e-12)
    np.testing.assert_allclose(unigrad.grad(loss, argnums=-1)(params, x), expected_x, rtol=1e-12)


def test_value_and_grad_has_aux(problem):
    params, x = problem

    def with_aux(p, x):
        value = loss(p, x)
        return value, {"twice": value * 2, "label": "ok"}

    (value, aux), g = unigrad.value_and_grad(with_aux, has_aux=True)(params, x)
    assert aux["label"] == "ok"
    np.testing.assert_allclose(aux["twice"], 2 * value)
    assert isinstance(aux["twice"], np.ndarray)  # not a traced value
    g2, aux2 = unigrad.grad(with_aux, has_aux=True)(params, x)
    np.testing.assert_allclose(g2["b"], g["b"])


def test_namedtuple_list_and_none_leaves():
    def f(p, extra):
        return (p.w ** 2).sum() + (p.b[0] * p.b[1]).sum()

    p = Pair(np.arange(3.0), [np.array(2.0), np.array(3.0)])
    g = unigrad.grad(f)(p, None)
    assert isinstance(g, Pair) and isinstance(g.b, list)
    np.testing.assert_allclose(g.w, 2 * np.arange(3.0))
    np.testing.assert_allclose(g.b[0], 3.0)
    np.testing.assert_allclose(g.b[1], 2.0)


def test_non_array_static_arguments_are_passed_through():
    def f(x, power, name):
        assert isinstance(power, int) and name == "label"
        return (x ** power).sum()

    np.testing.assert_allclose(unigrad.grad(f)(np.arange(3.0), 3, "label"), 3 * np.arange(3.0) ** 2)


def test_vjp_and_jvp_pytrees():
    def f(a, b):
        return {"s": a * b["k"], "t": (a ** 2).sum()}

    a, b = np.arange(1.0, 4.0), {"k": np.array(2.0)}
    out, vjp_fn = unigrad.vjp(f, a, b)
    ga, gb = vjp_fn({"s": np.ones(3), "t": np.array(1.0)})
    np.testing.assert_allclose(ga, 2.0 + 2 * a)
    np.testing.assert_allclose(gb["k"], a.sum())
    out2, tan = unigrad.jvp(f, (a, b), (np.ones(3), {"k": np.array(0.5)}))
    np.testing.assert_allclose(tan["s"], 2.0 + 0.5 * a)
    np.testing.assert_allclose(tan["t"], 2 * a.sum())
    np.testing.assert_allclose(out2["s"], out["s"])


def test_vjp_has_aux():
    out, vjp_fn, aux = unigrad.vjp(lambda x: (x * 2, x.sum()), np.arange(3.0), has_aux=True)
    np.testing.assert_allclose(aux, 3.0)
    np.testing.assert_allclose(vjp_fn(np.ones(3))[0], 2.0)


def test_unused_input_gets_zeros_of_its_dtype():
    g = unigrad.grad(lambda x, y: (x ** 2).sum(), argnums=(0, 1))(np.ones(2), np.ones(3, np.float32))
    assert g[1].dtype == np.float32 and g[1].shape == (3,) and not g[1].any()
    _, vjp_fn = unigrad.vjp(lambda x, y: x * 2, np.ones(2), np.ones(4))
    assert vjp_fn(np.ones(2))[1].shape == (4,)


def test_gradient_dtype_follows_input():
    for dtype in (np.float32, np.float64, np.float16):
        x = np.linspace(0.1, 1, 4).astype(dtype)
        g = unigrad.grad(lambda x: (unigrad.namespace(x).sin(x) * 2.0).sum())(x)
        assert g.dtype == dtype


def test_python_scalars_are_float64():
    g = unigrad.grad(lambda x: x * x)(3.0)
    assert isinstance(g, np.ndarray) and g.dtype == np.float64 and g == 6.0


def test_zero_size_and_zero_dim():
    g = unigrad.grad(lambda x: (x ** 2).sum())(np.zeros((0, 3)))
    assert g.shape == (0, 3)
    j = unigrad.jacobian(lambda x: x * 2)(np.zeros((0,)))
    assert j.shape == (0, 0)
    j = unigrad.jacobian(lambda x: x * 2, mode="fwd")(np.zeros((2, 0)))
    assert j.shape == (2, 0, 2, 0)
    np.testing.assert_allclose(unigrad.grad(lambda x: x ** 3)(np.array(2.0)), 12.0)


def test_noncontiguous_and_negative_stride_inputs():
    base = np.arange(12.0).reshape(3, 4)
    for x in (base.T, base[:, ::-1], base[::2, 1::2], np.asfortranarray(base)):
        g = unigrad.grad(lambda x: (x ** 2).sum())(x)
        np.testing.assert_allclose(g, 2 * x)


@pytest.mark.parametrize("mode", ["rev", "fwd", "auto"])
def test_jacobian_modes_agree_pytrees(mode):
    def f(x, y):
        xp = unigrad.namespace(x, y)
        return {"a": xp.sin(x) * y[0], "b": xp.stack([x.sum() * y[1], y[0] ** 2])}

    x, y = np.array([0.3, 0.5, 0.7]), np.array([1.5, -0.5])
    jac = unigrad.jacobian(f, argnums=(0, 1), mode=mode)(x, y)
    assert jac["a"][0].shape == (3, 3) and jac["a"][1].shape == (3, 2)
    assert jac["b"][0].shape == (2, 3) and jac["b"][1].shape == (2, 2)
    np.testing.assert_allclose(jac["a"][0], np.diag(np.cos(x) * y[0]))
    np.testing.assert_allclose(jac["a"][1][:, 0], np.sin(x))
    np.testing.assert_allclose(jac["b"][0][0], np.full(3, y[1]))
    np.testing.assert_allclose(jac["b"][1], [[0.0, x.sum()], [2 * y[0], 0.0]])


@pytest.mark.parametrize("chunk_size", [1, 2, 5, None])
def test_jacobian_chunks(chunk_size):
    x = np.linspace(0.1, 1, 5)
    for mode in ("rev", "fwd"):
        jac = unigrad.jacobian(lambda x: unigrad.namespace(x).cumulative_sum(x ** 2), mode=mode,
                               chunk_size=chunk_size)(x)
        np.testing.assert_allclose(jac, np.tril(np.ones((5, 5))) * 2 * x)


def test_jacobian_auto_picks_by_shape(monkeypatch):
    backend = unigrad.get_backend("numpy")
    calls = []
    for name in ("jacrev", "jacfwd"):
        original = getattr(backend, name)
        monkeypatch.setattr(backend, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    unigrad.jacobian(lambda x: x.sum() * 2)(np.ones(5))  # 5 inputs, 1 output: reverse
    unigrad.jacobian(lambda x: unigrad.namespace(x).concat([x, x, x]))(np.ones(2))  # 2 in, 6 out: forward
    assert calls == ["jacrev", "jacfwd"]


def test_batched_jacobian_matches_per_example_jacobians():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 4))

    def f(x, scale):
        xp = unigrad.namespace(x)
        return xp.tanh(x @ w) * scale

    x = rng.standard_normal((5, 3))
    full = unigrad.jacobian(f)(x, 2.0)  # (5, 4, 5, 3)
    for mode in ("rev", "fwd", "auto"):
        per = unigrad.batched_jacobian(f, mode=mode)(x, 2.0)
        assert per.shape == (5, 4, 3)
        for b in range(5):
            np.testing.assert_allclose(per[b], full[b, :, b, :], rtol=1e-12, atol=1e-14)


def test_batched_jacobian_detects_dependent_rows():
    x = np.random.default_rng(2).standard_normal((6, 3))
    with pytest.raises(ValueError, match="not independent"):
        unigrad.batched_jacobian(lambda x: x - x.mean(0))(x)
    with pytest.raises(ValueError, match="not independent"):
        unigrad.check_batch_independence(lambda x: x / unigrad.namespace(x).sum(x ** 2), x)
    unigrad.check_batch_independence(lambda x: x * 2, x)  # independent: no error
    per = unigrad.batched_jacobian(lambda x: x - x.mean(0), check_independence="never")(x)
    assert per.shape == (6, 3, 3)


def test_batched_jacobian_batch_zero_and_errors():
    out = unigrad.batched_jacobian(lambda x: x ** 2)(np.zeros((0, 3)))
    assert out.shape == (0, 3, 3)
    with pytest.raises(ValueError, match="0-d"):
        unigrad.batched_jacobian(lambda x: x ** 2)(np.array(1.0))
    with pytest.raises(ValueError, match="batch"):
        unigrad.batched_jacobian(lambda x: x.sum(0))(np.ones((3, 2)))


def test_hessian_and_hvp():
    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x) * x[::-1] ** 2)

    x = np.array([0.2, -0.4, 0.9])
    h = unigrad.hessian(f)(x)
    np.testing.assert_allclose(h, h.T, atol=1e-12)
    v = np.array([1.0, 2.0, -1.0])
    (hv,) = unigrad.hvp(f, (x,), (v,))
    np.testing.assert_allclose(hv, h @ v, rtol=1e-12)
    import autograd
    import autograd.numpy as anp
    np.testing.assert_allclose(h, autograd.hessian(lambda x: anp.sum(anp.sin(x) * x[::-1] ** 2))(x), rtol=1e-12)


def test_third_derivative_by_nesting():
    d3 = unigrad.grad(unigrad.grad(unigrad.grad(lambda x: unigrad.namespace(x).sin(x) * x)))(0.3)
    # d3/dx3 (x sin x) = -3 sin x - x cos x
    np.testing.assert_allclose(d3, -3 * np.sin(0.3) - 0.3 * np.cos(0.3), rtol=1e-12)


def test_vmap_loops_and_matches():
    x = np.arange(12.0).reshape(4, 3)
    out = unigrad.vmap(lambda r: (r ** 2).sum())(x)
    np.testing.assert_allclose(out, (x ** 2).sum(1))
    out = unigrad.vmap(lambda r, s: r * s, in_axes=(1, None), chunk_size=2)(x, 2.0)
    np.testing.assert_allclose(out, (x * 2).T)


@pytest.mark.parametrize("transform", ["grad", "jacobian", "batched_jacobian", "hessian"])
def test_compile_true_on_numpy_gives_the_same(transform):
    x = np.linspace(0.1, 0.9, 4).reshape(2, 2)
    f = (lambda x, y: (unigrad.namespace(x).sin(x) * y).sum()) if transform in ("grad", "hessian") else (
        lambda x, y: unigrad.namespace(x).sin(x) * y)
    make = getattr(unigrad, transform)
    plain, compiled = make(f), make(f, compile=True)
    for y in (2.0, np.array(3.0)):
        np.testing.assert_allclose(compiled(x, y), plain(x, y))


@pytest.mark.parametrize("transform", ["grad", "batched_jacobian"])
def test_a_compiled_program_keeps_no_array_of_the_call_that_built_it(transform):
    """The program cache lives as long as the transform: it must not pin the first call's inputs
    (on a GPU that is memory nobody can free)."""
    f = (lambda x, y: (unigrad.namespace(x).sin(x) * y).sum()) if transform == "grad" else (
        lambda x, y: unigrad.namespace(x).sin(x) * y)
    compiled = getattr(unigrad, transform)(f, compile=True)
    x, y = np.linspace(0.1, 0.9, 4).reshape(2, 2), np.full((2, 2), 3.0)
    refs = [weakref.ref(x), weakref.ref(y)]
    first = compiled(x, y)
    del x, y
    gc.collect()
    assert [r() for r in refs] == [None, None]
    np.testing.assert_allclose(compiled(np.linspace(0.1, 0.9, 4).reshape(2, 2), np.full((2, 2), 3.0)), first)


def test_repeated_signatures_take_the_fast_path_with_the_same_answers_and_checks():
    """A second call with the same argument types, shapes and dtypes reuses what the first derived
    (structures, dtype checks, cache key); values, argument order, the selection and the checks of
    anything else must still come from the call itself."""
    f = lambda a, b, c: (unigrad.namespace(a).sin(a) * b ** 2 + c).sum()  # noqa: E731
    g = unigrad.grad(f, argnums=(2, 0))
    a, b, c = np.linspace(0.1, 0.5, 3), np.linspace(1.0, 2.0, 3), np.ones(3)
    for scale in (1.0, 2.0, 3.0):  # the second and third calls start from the first one's prototype
        gc_, ga = g(a * scale, b, c)
        np.testing.assert_allclose(gc_, np.ones(3))
        np.testing.assert_allclose(ga, np.cos(a * scale) * b ** 2)
    with pytest.raises(TypeError, match="argument 0 has dtype int64"):  # same shapes, another dtype
        g(np.arange(3), b, c)
    with pytest.raises(TypeError, match="argument 2 has dtype int64"):
        g(a, b, np.arange(3))
    out, vjp_fn = unigrad.vjp(lambda x: x ** 2, a)
    out2, vjp_fn2 = unigrad.vjp(lambda x: x ** 3, 2 * a)  # same signature, another function and point
    np.testing.assert_allclose(vjp_fn2(np.ones(3))[0], 3 * (2 * a) ** 2)
    np.testing.assert_allclose(vjp_fn(np.ones(3))[0], 2 * a)


@pytest.mark.parametrize("compile", [False, True])
def test_repeated_pytree_signatures_map_their_leaves_back_in_order(compile):
    """Pytree arguments (dicts, lists) with all-array leaves take the fast paths too: the leaves of
    each call must reach the right argument, in optree's order, whatever the argnums."""
    def loss(data, params, scale):
        xp = unigrad.namespace(params["w"])
        h = xp.tanh(data["x"] @ params["w"] + params["b"][0])
        return scale * (h ** 2).sum() + (params["b"][1] ** 2).sum()

    g = unigrad.grad(loss, argnums=(1, 2), compile=compile)
    rng = np.random.default_rng(0)
    for k in range(3):
        data = {"x": rng.standard_normal((4, 3))}
        params = {"w": rng.standard_normal((3, 2)), "b": [rng.standard_normal(2), rng.standard_normal(2)]}
        scale = np.asarray(1.0 + k)
        (gp, gs) = g(data, params, scale)
        h = np.tanh(data["x"] @ params["w"] + params["b"][0])
        d = scale * 2 * h * (1 - h ** 2)
        np.testing.assert_allclose(gp["w"], data["x"].T @ d)
        np.testing.assert_allclose(gp["b"][0], d.sum(0))
        np.testing.assert_allclose(gp["b"][1], 2 * params["b"][1])
        np.testing.assert_allclose(gs, (h ** 2).sum())


def test_vjp_and_jvp_of_a_function_of_no_arguments():
    """As in JAX: nothing to differentiate, so the vjp returns no cotangents and the jvp a zero tangent."""
    for _ in range(2):  # the second call starts from the first one's prototype
        out, vjp_fn = unigrad.vjp(lambda: np.ones(2))
        np.testing.assert_allclose(out, 1.0)
        assert vjp_fn(np.ones(2)) == ()
        out, tangent = unigrad.jvp(lambda: np.ones(2), (), ())
        np.testing.assert_allclose(tangent, 0.0)


def test_the_fast_path_follows_the_selection_of_each_call():
    torch = skip_unless("torch")
    g = unigrad.grad(lambda x: (x ** 2).sum())
    x = np.linspace(0.1, 0.5, 3)
    g(x), g(x)  # the signature of NumPy arrays on the numpy backend is known now
    with unigrad.use_backend("torch"):
        got = g(x)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), 2 * x)
    assert isinstance(g(x), np.ndarray)


@pytest.mark.parametrize("transform", ["value_and_grad", "jacobian", "batched_jacobian"])
def test_compiled_repeat_calls_go_straight_to_the_program_with_fresh_values(transform):
    """From the second call of a signature on, a compiled transform calls its program directly:
    the values, the argument order, aux and the selection must still be those of each call."""
    def f(a, b, c):
        xp = unigrad.namespace(a)
        y = xp.sin(a) * b + c ** 2
        return (y.sum() if transform == "value_and_grad" else y), {"y": y}

    make = getattr(unigrad, transform)
    plain = make(f, argnums=(2, 0), has_aux=True)
    compiled = make(f, argnums=(2, 0), has_aux=True, compile=True)
    a, b, c = np.linspace(0.1, 0.6, 6).reshape(3, 2), np.full((3, 2), 2.0), np.ones((3, 2))
    for scale in (1.0, 2.0, 3.0):
        got, want = compiled(a * scale, b, c * scale), plain(a * scale, b, c * scale)
        for g, w in zip(optree.tree_leaves(got), optree.tree_leaves(want)):
            np.testing.assert_allclose(g, w)
    torch = skip_unless("torch")
    with unigrad.use_backend("torch"):  # another selection: not the numpy program
        assert all(isinstance(v, torch.Tensor) for v in optree.tree_leaves(compiled(a, b, c)))


def test_the_tapes_gradient_sweep_frees_each_entry_once_pulled_back():
    """grad's single sweep drops the forward's intermediates as it goes (less memory at its peak);
    a released trace refuses a second sweep instead of answering with zeros."""
    from unigrad.tape._core import backward, record

    x = np.linspace(0.1, 0.5, 3)
    trace, outs, idx, _ = record(lambda x: (unigrad.namespace(x).sin(x * 2).sum(),), (x,), False)
    (g,) = backward(trace, idx, (np.ones(()),), 1, (x,), release=True)
    np.testing.assert_allclose(g, 2 * np.cos(2 * x))
    assert all(entry is None for entry in trace.tape)
    with pytest.raises(RuntimeError, match="release=True"):
        backward(trace, idx, (np.ones(()),), 1, (x,))
    np.testing.assert_allclose(unigrad.grad(lambda x: unigrad.namespace(x).sin(x * 2).sum())(x), g)


def test_device_cpu_accepted_and_unknown_rejected():
    g = unigrad.grad(lambda x: (x ** 2).sum(), device="cpu")(np.ones(2))
    np.testing.assert_allclose(g, 2.0)
    with pytest.raises(ValueError, match="device"):
        unigrad.grad(lambda x: (x ** 2).sum(), device="cuda")(np.ones(2))


def test_namespace_and_array_helpers():
    x = np.ones(3)
    xp = unigrad.namespace(x)
    assert xp.__array_api_version__ == "2024.12"
    assert unigrad.asarray([1.0, 2.0]).dtype == np.float64
    assert unigrad.asarray(np.ones(2, np.float32)).dtype == np.float32
    assert unigrad.asarray([1, 2], dtype="float32").dtype == np.float32
    np.testing.assert_array_equal(unigrad.to_numpy({"a": x}), {"a": x})


def test_wrapped_function_keeps_its_name_and_docs():
    def my_loss(x):
        """Docs."""
        return (x ** 2).sum()

    g = unigrad.grad(my_loss)
    assert g.__name__ == "grad(my_loss)" and g.__doc__ == "Docs." and g.__wrapped__ is my_loss


def test_results_are_writable_arrays():
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x))(np.ones(10000))
    _, t = unigrad.jvp(lambda x: unigrad.namespace(x).broadcast_to(x, (5000, 3)), (np.ones(3),), (np.ones(3),))
    for a in (g, t):
        assert isinstance(a, np.ndarray) and a.flags.writeable
        a[0] = 7.0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_vjp_fn_of_a_python_float_cotangent_for_a_scalar_output(dtype):
    """A Python float cotangent of a real scalar output (vjp_fn(1.0), as autograd's is called) takes a
    shortcut on the tape: the same result, dtype and memory rules as a 0-d array of the output's dtype."""
    x = np.array([0.1, 0.2, 0.3], dtype=dtype)
    out, vjp_fn = unigrad.vjp(lambda x: unigrad.namespace(x).sum(unigrad.namespace(x).sin(x) ** 2), x)
    got, = vjp_fn(2.5)
    want, = vjp_fn(np.asarray(2.5, dtype=dtype))
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, 2.5 * 2 * np.sin(x) * np.cos(x), rtol=1e-6)
    with pytest.raises(ValueError):  # a float for a vector output still fails the shape check
        unigrad.vjp(lambda x: x * 2, x)[1](1.0)
