"""The torch backend against the NumPy tape (the oracle), and the rules torch does not give by itself.

Every function here is written with ``unigrad.namespace`` so the same code runs on both backends;
the tape's answer is the reference.
"""

from __future__ import annotations

import threading

import numpy as np
import optree
import pytest

from conftest import skip_module_unless

torch = skip_module_unless("torch")
pytestmark = pytest.mark.unigrad_backend("torch")  # run on each device --unigrad-devices names

import unigrad  # noqa: E402
import unigrad_torch  # noqa: E402

TORCH = unigrad.get_backend("torch")


def ns(*arrays):
    return unigrad.namespace(*arrays)


def both(transform, *args, **kwargs):
    """``transform`` evaluated on the tape and on torch: (numpy results, torch results), as NumPy trees."""
    ref = unigrad.to_numpy(transform("numpy")(*args, **kwargs))
    got = transform("torch")(*args, **kwargs)
    return ref, got


def assert_tree_close(got, ref, rtol=1e-10, atol=1e-12):
    got_leaves = unigrad.to_numpy(got)
    got_flat, got_tree = optree.tree_flatten(got_leaves)
    ref_flat, ref_tree = optree.tree_flatten(ref)
    assert got_tree == ref_tree
    for g, r in zip(got_flat, ref_flat):
        assert g.shape == r.shape
        assert g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


def assert_torch_leaves(tree):
    for leaf in optree.tree_leaves(tree):
        assert isinstance(leaf, torch.Tensor), type(leaf)
        assert not leaf.requires_grad
        assert not torch._C._functorch.is_functorch_wrapped_tensor(leaf)


# ------------------------------------------------------------------------------- portable functions
def tanh_loss(w, x):
    xp = ns(w, x)
    return xp.sum(xp.tanh(x @ w) ** 2)


def mixed(x, y):
    xp = ns(x, y)
    return xp.sum(xp.exp(xp.sin(x) * y[0]) + xp.log1p(y ** 2) * xp.mean(x))


def vector_fn(x):
    xp = ns(x)
    return xp.sin(x) * x[0] + xp.exp(x) * xp.sum(x ** 2)


def mlp_rows(x, w1, w2):
    """Rows independent: a batch of x through a small tanh MLP (per-example Jacobians exist)."""
    xp = ns(x, w1, w2)
    return xp.tanh(x @ w1) @ w2


RNG = np.random.default_rng(0)
W = RNG.standard_normal((3, 2))
X = RNG.standard_normal((4, 3))
V3 = RNG.standard_normal(3)
W1 = RNG.standard_normal((3, 5)) / 2
W2 = RNG.standard_normal((5, 2)) / 2


def _argument_sets():
    return [
        pytest.param(tanh_loss, (W, X), (0, 1), id="tanh_loss"),
        pytest.param(mixed, (V3, RNG.standard_normal(3)), (0, 1), id="mixed"),
        pytest.param(lambda x: ns(x).sum(vector_fn(x) ** 2), (V3,), 0, id="vector_fn"),
    ]


# ------------------------------------------------------------------------------- first order
@pytest.mark.parametrize("f, args, argnums", _argument_sets())
def test_grad_matches_tape(f, args, argnums):
    ref, got = both(lambda b: unigrad.grad(f, argnums=argnums, backend=b), *args)
    assert_tree_close(got, ref)
    assert_torch_leaves(got)


def test_vjp_and_jvp_with_pytrees_match_tape():
    def f(params, x):
        xp = ns(params["w"], x)
        h = xp.tanh(x @ params["w"])
        return {"h": h, "s": xp.sum(h * params["b"])}

    params = {"w": W, "b": RNG.standard_normal(2)}
    cotangent = {"h": RNG.standard_normal((4, 2)), "s": np.float64(0.7)}
    tangents = ({"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}, RNG.standard_normal((4, 3)))
    results = {}
    for b in ("numpy", "torch"):
        out, vjp_fn = unigrad.vjp(f, params, X, backend=b)
        out_j, tangent_out = unigrad.jvp(f, (params, X), tangents, backend=b)
        results[b] = (out, vjp_fn(cotangent), out_j, tangent_out)
    assert_tree_close(results["torch"], unigrad.to_numpy(results["numpy"]))
    assert_torch_leaves(results["torch"])


@pytest.mark.parametrize("mode", ["rev", "fwd"])
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_jacobian_matches_tape(mode, chunk_size):
    def f(x, y):
        return {"a": vector_fn(x) * y[1], "b": ns(x).sum(x * y)}

    ref, got = both(lambda b: unigrad.jacobian(f, argnums=(0, 1), mode=mode, chunk_size=chunk_size, backend=b),
                    V3, RNG.standard_normal(3))
    assert_tree_close(got, ref)


def test_jacobian_has_aux_passes_tensors_and_python_values():
    def f(x):
        return x ** 2, {"label": "sq", "n": 3, "mean": ns(x).mean(x), "none": None}

    for mode in ("rev", "fwd"):
        jac, aux = unigrad.jacobian(f, mode=mode, has_aux=True, backend="torch")(V3)
        np.testing.assert_allclose(unigrad.to_numpy(jac), np.diag(2 * V3))
        assert aux["label"] == "sq" and aux["n"] == 3 and aux["none"] is None
        assert_torch_leaves(aux["mean"])
        assert float(aux["mean"]) == pytest.approx(V3.mean())
    for fname, call in [("vjp", lambda: unigrad.vjp(f, V3, has_aux=True, backend="torch")[2]),
                        ("jvp", lambda: unigrad.jvp(f, (V3,), (V3,), has_aux=True, backend="torch")[2])]:
        aux = call()
        assert aux["label"] == "sq", fname
        assert_torch_leaves(aux["mean"])


# ------------------------------------------------------------------------------- batched Jacobians
@pytest.mark.parametrize("mode", ["rev", "fwd"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_batched_jacobian_matches_tape(mode, chunk_size):
    def f(x, z, w1, w2):  # the weights are not differentiated: the core converts them
        h = mlp_rows(x, w1, w2)
        return {"h": h, "hz": h * z[:, :1] + z[:, 1:] ** 2}

    x, z = RNG.standard_normal((6, 3)), RNG.standard_normal((6, 3))
    ref, got = both(lambda b: unigrad.batched_jacobian(f, argnums=(0, 1), mode=mode, chunk_size=chunk_size,
                                                       backend=b), x, z, W1, W2)
    assert got["h"][0].shape == (6, 2, 3)
    assert got["hz"][1].shape == (6, 2, 3)
    assert_tree_close(got, ref)


def test_batched_jacobian_has_aux_and_higher_rank():
    def f(x):
        xp = ns(x)
        return xp.sin(x) * x[:, :1, :1], xp.sum(x)

    x = RNG.standard_normal((3, 2, 2))
    for mode in ("rev", "fwd"):
        ref = unigrad.batched_jacobian(f, mode=mode, has_aux=True, backend="numpy")(x)
        got = unigrad.batched_jacobian(f, mode=mode, has_aux=True, backend="torch")(x)
        assert got[0].shape == (3, 2, 2, 2, 2)
        assert_tree_close(got, unigrad.to_numpy(ref))
        assert_torch_leaves(got)


def test_batched_jacobian_dependent_rows_raise():
    with pytest.raises(ValueError, match="not independent"):
        unigrad.batched_jacobian(lambda x: x - ns(x).mean(x, axis=0), backend="torch")(X)


# ------------------------------------------------------------------------------- second order, nesting
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_hessian_and_hvp_match_tape(chunk_size):
    y = RNG.standard_normal(3)
    ref, got = both(lambda b: unigrad.hessian(mixed, argnums=(0, 1), chunk_size=chunk_size, backend=b), V3, y)
    assert_tree_close(got, ref)
    tangents = (RNG.standard_normal(3), RNG.standard_normal(3))
    ref = unigrad.hvp(mixed, (V3, y), tangents, backend="numpy")
    got = unigrad.hvp(mixed, (V3, y), tangents, backend="torch")
    assert_tree_close(got, unigrad.to_numpy(ref))


def test_backend_hessian_and_hvp_methods_match_tape():
    """The backend's own hessian/hvp (flat contract), not only the core's composition."""
    def f(x, y):
        return (mixed(x, y),)

    y = RNG.standard_normal(3)
    tape = unigrad.get_backend("numpy")
    ref = tape.hessian(f, (V3, y), chunk_size=2)
    got = TORCH.hessian(f, (torch.from_numpy(V3), torch.from_numpy(y)), chunk_size=2)
    assert_tree_close(got, unigrad.to_numpy(ref))
    t = (np.ones(3), np.arange(3.0))
    ref = tape.hvp(f, (V3, y), t)
    got = TORCH.hvp(f, (torch.from_numpy(V3), torch.from_numpy(y)), tuple(map(torch.from_numpy, t)))
    assert_tree_close(got, unigrad.to_numpy(ref))


def test_nested_transforms_match_tape():
    def second(b):
        inner = unigrad.grad(lambda x: ns(x).sum(ns(x).sin(x) * x ** 2), backend=b)
        return unigrad.jacobian(inner, mode="fwd", backend=b)

    ref, got = both(second, V3)
    assert_tree_close(got, ref)

    def jvp_of_vjp(b):
        def g(x):
            _, vjp_fn = unigrad.vjp(vector_fn, x, backend=b)
            return vjp_fn(ns(x).ones_like(x))[0]
        return lambda x, t: unigrad.jvp(g, (x,), (t,), backend=b)

    ref, got = both(jvp_of_vjp, V3, np.ones(3))
    assert_tree_close(got, ref)


def test_results_compose_with_torch_autograd():
    """Like torch.func: a gradient of a tensor that requires grad is differentiable by torch.autograd."""
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
    g = unigrad.grad(lambda x: ns(x).sum(x ** 3))(p)
    assert torch.equal(g.detach(), 3 * p.detach() ** 2)
    g.sum().backward()
    assert torch.equal(p.grad, 6 * p.detach())


# ------------------------------------------------------------------------------- vmap
def test_vmap_matches_tape_with_axes_and_chunks():
    def f(x, w, s):
        xp = ns(x, w)
        return xp.tanh(x @ w) * s, x * xp.sum(x)

    x = RNG.standard_normal((3, 7))  # mapped over axis 1
    ref = unigrad.vmap(f, in_axes=(1, None, None), out_axes=1, backend="numpy")(x, W, 2.0)
    for chunk_size in (None, 2):
        got = unigrad.vmap(f, in_axes=(1, None, None), out_axes=1, chunk_size=chunk_size, backend="torch")(x, W, 2.0)
        assert got[0].shape == (2, 7)
        assert_tree_close(got, unigrad.to_numpy(ref))


def test_vmap_of_grad_gives_per_example_gradients():
    xs = RNG.standard_normal((5, 3))
    per_example = unigrad.vmap(unigrad.grad(tanh_loss, argnums=0), in_axes=(None, 0), chunk_size=2,
                               backend="torch")(W, xs[:, None, :])
    ref = np.stack([unigrad.grad(tanh_loss, backend="numpy")(W, xs[i:i + 1]) for i in range(5)])
    np.testing.assert_allclose(unigrad.to_numpy(per_example), ref, rtol=1e-10)


def test_vmap_over_an_empty_axis():
    out = unigrad.vmap(lambda x: (ns(x).sum(x ** 2), x * 2), out_axes=0, backend="torch")(np.zeros((0, 3)))
    assert tuple(out[0].shape) == (0,) and tuple(out[1].shape) == (0, 3)
    out = unigrad.vmap(lambda x: x * 2, out_axes=1, backend="torch")(np.zeros((0, 3)))
    assert tuple(out.shape) == (3, 0)


# ------------------------------------------------------------------------------- complex convention
def test_complex_gradient_follows_jax_convention():
    absq = lambda z: ns(z).sum(ns(z).real(z * ns(z).conj(z)))  # noqa: E731
    g = unigrad.grad(absq, backend="torch")(np.array(3 + 4j))
    assert complex(g) == 6 - 8j
    z = np.array([3 + 4j, 1 - 2j])
    ct = np.array([1 + 1j, 2 - 0.5j])
    _, vjp_fn = unigrad.vjp(lambda z: z ** 2, z, backend="torch")
    np.testing.assert_allclose(unigrad.to_numpy(vjp_fn(ct)[0]), ct * 2 * z)
    _, t_out = unigrad.jvp(lambda z: z ** 2, (z,), (ct,), backend="torch")
    np.testing.assert_allclose(unigrad.to_numpy(t_out), 2 * z * ct)
    assert unigrad.grad(absq, backend="torch")(z).numpy().dtype == np.complex128  # no lazy-conj bit left


def test_complex_transforms_match_tape():
    z = np.array([3 + 4j, 1 - 2j, 0.5j])
    x = np.array([0.5, 2.0, -1.0])
    ct = np.array([1 + 1j, 2 - 0.5j, -1j])

    def nonholomorphic(z):
        xp = ns(z)
        return xp.sum(xp.real(z) ** 2 * xp.imag(z) + xp.abs(z) ** 3)

    def real_to_complex(x):
        return x * (1 + 2j) + x ** 2 * 1j

    for mode in ("rev", "fwd"):
        ref, got = both(lambda b: unigrad.jacobian(lambda z: z ** 2 * z[0], mode=mode, backend=b), z)
        assert_tree_close(got, ref)
    ref, got = both(lambda b: unigrad.hessian(nonholomorphic, backend=b), z)
    assert_tree_close(got, ref)
    ref = unigrad.hvp(nonholomorphic, (z,), (ct,), backend="numpy")
    assert_tree_close(unigrad.hvp(nonholomorphic, (z,), (ct,), backend="torch"), unigrad.to_numpy(ref))
    ref = unigrad.vjp(real_to_complex, x, backend="numpy")[1](ct)
    got = unigrad.vjp(real_to_complex, x, backend="torch")[1](ct)
    assert_tree_close(got, unigrad.to_numpy(ref))
    ref, got = both(lambda b: unigrad.batched_jacobian(lambda z: z ** 2 * z[:, :1], mode="rev", backend=b),
                    z.reshape(3, 1) * np.ones((1, 2)))
    assert_tree_close(got, ref)


# ------------------------------------------------------------------------------- zeros, dtypes, shapes
def test_unused_inputs_get_zeros_of_their_dtype():
    def f(x, y, z):
        return ns(x).sum(x * 2.0)

    x = torch.ones(3)
    y = torch.ones(2, dtype=torch.float64)
    z = torch.ones(2, dtype=torch.complex64)
    gx, gy, gz = unigrad.grad(f, argnums=(0, 1, 2), backend="torch")(x, y, z)
    assert torch.equal(gx, torch.full((3,), 2.0))
    assert torch.equal(gy, torch.zeros(2, dtype=torch.float64))
    assert torch.equal(gz, torch.zeros(2, dtype=torch.complex64))
    # an output that depends on no input: zero tangent, zero Jacobian
    out, t_out = unigrad.jvp(lambda x: (x * 2, torch.ones(4)), (x,), (x,), backend="torch")
    assert torch.equal(t_out[1], torch.zeros(4))
    jac = unigrad.jacobian(lambda x, y: x * 2, argnums=(0, 1), mode="rev", backend="torch")(x, y)
    assert torch.equal(jac[1], torch.zeros(3, 2, dtype=torch.float32))
    bj = unigrad.batched_jacobian(lambda x, y: x * 2, argnums=(0, 1), mode="fwd", backend="torch")(
        torch.ones(2, 3), torch.ones(2, 4))
    assert torch.equal(bj[1], torch.zeros(2, 3, 4))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_gradient_dtype_equals_input_dtype(dtype):
    x = TORCH.asarray(np.array([0.5, 1.0, 2.0]), dtype=dtype)
    assert TORCH.dtype(x) == dtype
    g = unigrad.grad(lambda x: ns(x).sum(x ** 2))(x)
    assert TORCH.dtype(g) == dtype
    np.testing.assert_allclose(unigrad.to_numpy(g).astype(np.float64), [1.0, 2.0, 4.0])
    t = unigrad.jvp(lambda x: x ** 2, (x,), (x,))[1]
    assert TORCH.dtype(t) == dtype
    jac = unigrad.jacobian(lambda x: x ** 2, mode="fwd")(x)
    assert TORCH.dtype(jac) == dtype


def test_asarray_keeps_dtypes_and_converts():
    assert TORCH.dtype(TORCH.asarray(np.ones(2))) == "float64"
    assert TORCH.dtype(TORCH.asarray(np.ones(2, dtype=np.int64))) == "int64"
    assert TORCH.dtype(TORCH.asarray(3.0)) == "float64"
    assert TORCH.dtype(TORCH.asarray(np.ones(2), dtype="bfloat16")) == "bfloat16"
    assert TORCH.dtype(TORCH.asarray(np.ones(2), dtype=torch.float16)) == "float16"
    assert TORCH.dtype(unigrad.asarray(np.ones(2), backend="torch", dtype="float32")) == "float32"
    with pytest.raises(ValueError, match="dtype"):
        TORCH.asarray(np.ones(2), dtype="float128")
    with pytest.raises(TypeError, match="dtype object"):
        TORCH.asarray(np.array(["a"], dtype=object))
    # bfloat16 round trip keeps the bits
    x = torch.tensor([1.5, -2.25, 3e-3], dtype=torch.bfloat16)
    back = TORCH.to_numpy(x)
    assert torch.equal(TORCH.asarray(back), x)


def test_zero_size_and_0d_inputs():
    g = unigrad.grad(lambda x: x ** 3, backend="torch")(2.0)
    assert g.shape == () and TORCH.dtype(g) == "float64" and float(g) == 12.0
    g = unigrad.grad(lambda x: x ** 3, backend="torch")(np.float32(2.0))
    assert TORCH.dtype(g) == "float32"
    empty = np.zeros((0, 3))
    assert tuple(unigrad.grad(lambda x: ns(x).sum(x ** 2), backend="torch")(empty).shape) == (0, 3)
    for mode in ("rev", "fwd"):
        assert tuple(unigrad.jacobian(lambda x: x ** 2, mode=mode, backend="torch")(empty).shape) == (0, 3, 0, 3)
        bj = unigrad.batched_jacobian(lambda x: x[:, :0] * 1.0, mode=mode, backend="torch")(np.ones((2, 3)))
        assert tuple(bj.shape) == (2, 0, 3)
    assert tuple(unigrad.batched_jacobian(lambda x: x ** 2, backend="torch")(empty).shape) == (0, 3, 3)
    assert tuple(unigrad.hessian(lambda x: ns(x).sum(x ** 3), backend="torch")(np.zeros(0)).shape) == (0, 0)
    hv = unigrad.hvp(lambda x: ns(x).sum(x ** 3), (np.zeros(0),), (np.zeros(0),), backend="torch")
    assert tuple(hv[0].shape) == (0,)


def test_noncontiguous_and_negative_stride_inputs():
    base = np.arange(12.0).reshape(3, 4)
    f = lambda x: ns(x).sum(ns(x).sin(x) * x)  # noqa: E731
    for x in (base[::-1, ::-2], base.T, base[:, 1::2]):
        ref, got = both(lambda b: unigrad.grad(f, backend=b), x)
        assert_tree_close(got, ref)
    ref, got = both(lambda b: unigrad.jacobian(lambda x: x ** 2, mode="fwd", backend=b), base[::-1, 0])
    assert_tree_close(got, ref)
    t = torch.arange(12.0, dtype=torch.float64).reshape(3, 4).T  # a transposed torch tensor
    np.testing.assert_allclose(unigrad.to_numpy(unigrad.grad(f)(t)), unigrad.to_numpy(
        unigrad.grad(f, backend="numpy")(base.T)))
    read_only = np.arange(3.0)
    read_only.flags.writeable = False
    big_endian = np.arange(3.0).astype(">f8")
    for x in (read_only, big_endian):
        assert torch.equal(TORCH.asarray(x), torch.arange(3.0, dtype=torch.float64))


def test_backend_is_inferred_from_torch_inputs():
    g = unigrad.grad(tanh_loss, argnums=(0, 1))(torch.from_numpy(W), X)  # one torch leaf, one NumPy
    assert all(isinstance(a, torch.Tensor) for a in g)
    ref = unigrad.grad(tanh_loss, argnums=(0, 1), backend="numpy")(W, X)
    assert_tree_close(g, unigrad.to_numpy(ref))
    assert isinstance(unigrad.jacobian(vector_fn)(torch.from_numpy(V3)), torch.Tensor)
    assert unigrad.namespace(torch.ones(1)) is TORCH.namespace()


# ------------------------------------------------------------------------------- grad modes, errors
def _torch_state():
    import torch._functorch.eager_transforms as eager_transforms
    import torch.autograd.forward_ad as forward_ad

    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "fwd_grad": torch._C._is_fwd_grad_enabled(),
        "dual_level": forward_ad._current_level,
        "jvp_nesting": eager_transforms.JVP_NESTING,
        "functorch_level": torch._C._functorch.maybe_current_level(),
    }


def _every_transform(f_scalar, f_vector, backend="torch"):
    return {
        "grad": lambda x: unigrad.grad(f_scalar, backend=backend)(x),
        "value_and_grad": lambda x: unigrad.value_and_grad(f_scalar, backend=backend)(x),
        "vjp_out": lambda x: unigrad.vjp(f_vector, x, backend=backend)[0],
        "vjp_fn": lambda x: unigrad.vjp(f_vector, x, backend=backend)[1](np.ones(3)),
        "jvp": lambda x: unigrad.jvp(f_vector, (x,), (np.ones(3),), backend=backend),
        "jacrev": lambda x: unigrad.jacrev(f_vector, backend=backend)(x),
        "jacfwd": lambda x: unigrad.jacfwd(f_vector, backend=backend)(x),
        "batched_rev": lambda x: unigrad.batched_jacobian(f_vector, mode="rev", check_independence="never",
                                                          backend=backend)(x[:, None]),
        "batched_fwd": lambda x: unigrad.batched_jacobian(f_vector, mode="fwd", check_independence="never",
                                                          backend=backend)(x[:, None]),
        "hessian": lambda x: unigrad.hessian(f_scalar, backend=backend)(x),
        "hvp": lambda x: unigrad.hvp(f_scalar, (x,), (np.ones(3),), backend=backend),
        "hessian_vector_product": lambda x: unigrad.hessian_vector_product(f_scalar, backend=backend)(x, np.ones(3)),
        "vmap": lambda x: unigrad.vmap(unigrad.grad(f_scalar, backend=backend), backend=backend)(x[:, None]),
    }


MODES = {"enable_grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.mark.parametrize("mode", list(MODES))
def test_transforms_work_under_no_grad_and_inference_mode(mode):
    f_scalar = lambda x: ns(x).sum(ns(x).sin(x) * x)  # noqa: E731
    f_vector = lambda x: ns(x).sin(x) * x  # noqa: E731
    x_np = np.array([0.1, 0.7, 1.3])
    expected = {name: unigrad.to_numpy(call(x_np)) for name, call in _every_transform(
        f_scalar, f_vector, backend="numpy").items()}  # the tape is the oracle
    transforms = _every_transform(f_scalar, f_vector)
    with MODES[mode]():
        x = torch.tensor(x_np)  # an inference tensor under inference_mode
        before = _torch_state()
        for name, call in transforms.items():
            got = call(x)
            assert_tree_close(got, expected[name])
            assert_torch_leaves(got)
            assert _torch_state() == before, name
    # an inference tensor used after leaving inference mode
    for name, call in transforms.items():
        assert_tree_close(call(x), expected[name])


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_graph_under_no_grad_for_inputs_that_require_grad(mode):
    """As torch.func: under the caller's no_grad or inference mode, every result is a plain tensor
    with no graph, even for an input that requires grad, and the caller's modes are kept."""
    f_scalar = lambda x: ns(x).sum(ns(x).sin(x) * x)  # noqa: E731
    f_vector = lambda x: ns(x).sin(x) * x  # noqa: E731
    x_np = np.array([0.1, 0.7, 1.3])
    expected = {name: unigrad.to_numpy(call(x_np)) for name, call in _every_transform(
        f_scalar, f_vector, backend="numpy").items()}
    x = torch.tensor(x_np, requires_grad=True)
    with MODES[mode]():
        before = _torch_state()
        for name, call in _every_transform(f_scalar, f_vector).items():
            got = call(x)
            assert_tree_close(got, expected[name])
            for leaf in optree.tree_leaves(got):
                assert leaf.grad_fn is None and not leaf.requires_grad, name
            assert _torch_state() == before, name
        # a pullback built under no_grad and called under it again
        _, vjp_fn = unigrad.vjp(f_vector, x)
        (g,) = vjp_fn(torch.ones(3, dtype=torch.float64))
        assert g.grad_fn is None and not g.requires_grad
    assert x.grad is None


def test_pullback_called_under_no_grad_builds_no_graph():
    """A vjp taken with grad on, its pullback called under no_grad: a plain tensor (create_graph follows
    the mode at the call, as torch.func's pullback)."""
    x = torch.tensor([0.1, 0.7], dtype=torch.float64, requires_grad=True)
    _, vjp_fn = unigrad.vjp(lambda v: ns(v).sin(v) * v, x)
    with torch.no_grad():
        (g,) = vjp_fn(torch.ones(2, dtype=torch.float64))
    assert g.grad_fn is None and not g.requires_grad
    assert torch.allclose(g, torch.sin(x.detach()) + x.detach() * torch.cos(x.detach()))


@pytest.mark.parametrize("mode", list(MODES))
def test_exception_inside_f_leaves_no_state(mode):
    class Boom(Exception):
        pass

    def bad(x):
        y = ns(x).sin(x)  # some traced work first
        raise Boom(str(y.shape))

    with MODES[mode]():
        before = _torch_state()
        for name, call in _every_transform(bad, bad).items():
            with pytest.raises(Boom):
                call(np.array([0.1, 0.7, 1.3]))
            assert _torch_state() == before, name
    # and the next transforms are right
    x = np.array([0.1, 0.7, 1.3])
    _, t = unigrad.jvp(lambda x: x ** 2, (x,), (np.ones(3),), backend="torch")
    np.testing.assert_allclose(unigrad.to_numpy(t), 2 * x)
    np.testing.assert_allclose(unigrad.to_numpy(unigrad.grad(lambda x: ns(x).sum(x ** 2), backend="torch")(x)), 2 * x)


# ------------------------------------------------------------------ grad and hvp on plain autograd
def _two_paths(call, *tensors):
    """``call(*tensors)`` on the plain-autograd path (plain tensors) and on the torch.func path (inputs
    that require grad with grad mode on: the caller records a graph through the call): both results."""
    plain = call(*tensors)
    recorded = call(*[t.clone().requires_grad_() for t in tensors])
    return plain, optree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, recorded)


@pytest.mark.parametrize("kind", ["real", "complex", "unused-input", "aux"])
def test_plain_autograd_and_torch_func_give_the_same_grad_and_hvp(kind):
    """grad, value_and_grad and hvp run on plain torch.autograd where nothing needs torch.func
    (reverse over reverse for hvp), else on torch.func (forward over reverse): the two agree, complex
    convention and unused inputs (zeros) included."""
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal(4))
    w = torch.from_numpy(rng.standard_normal(4))
    v = torch.from_numpy(rng.standard_normal(4))
    if kind == "complex":
        x = x + 1j * torch.from_numpy(rng.standard_normal(4))
        v = v + 1j * torch.from_numpy(rng.standard_normal(4))

    def f(x, w):
        xp = ns(x)
        core = xp.sum(xp.abs(x) ** 4 * w ** 2 + xp.real(x * x * w)) if kind == "complex" else xp.sum(xp.sin(x * w) * x)
        if kind == "unused-input":
            core = xp.sum(x ** 3)
        return (core, {"n": 3, "x": x}) if kind == "aux" else core

    has_aux = kind == "aux"
    grads = _two_paths(unigrad.grad(f, argnums=(0, 1), has_aux=has_aux), x, w)
    values = _two_paths(unigrad.value_and_grad(f, argnums=(0, 1), has_aux=has_aux), x, w)
    ref = unigrad.grad(f, argnums=(0, 1), has_aux=has_aux, backend="numpy")(x.numpy(), w.numpy())
    for got in grads:
        assert_tree_close(got, unigrad.to_numpy(ref), rtol=1e-12)
    assert_tree_close(values[0], unigrad.to_numpy(values[1]), rtol=1e-12)
    if kind == "aux":
        return
    products = _two_paths(lambda x, w: unigrad.hvp(f, (x, w), (v, w)), x, w)
    ref = unigrad.hvp(f, (x.numpy(), w.numpy()), (v.numpy(), w.numpy()), backend="numpy")
    for got in products:
        assert_tree_close(got, unigrad.to_numpy(ref), rtol=1e-12)
    if kind == "unused-input":
        assert torch.equal(products[0][1], torch.zeros(4, dtype=torch.float64))


def test_a_custom_rule_whose_output_is_also_a_residual_keeps_its_derivative():
    """JAX's idiom ``fwd = lambda t: (y, (y, t))``: the output returned again as a residual. Marking the
    residual non-differentiable must not mark the output: plain autograd would give zeros."""
    @unigrad.custom_vjp
    def cube(t):
        return t ** 3

    def fwd(t):
        y = t ** 3
        return y, (y, t)

    cube.defvjp(fwd, lambda res, g: (3 * res[1] ** 2 * g,))
    t = np.array([0.5, -1.0, 2.0])
    for call in (lambda t: unigrad.grad(lambda t: ns(t).sum(cube(t)), backend="torch")(t),  # plain autograd
                 lambda t: unigrad.jacrev(lambda t: ns(t).sum(cube(t)), backend="torch")(t)):  # torch.func
        np.testing.assert_allclose(unigrad.to_numpy(call(t)), 3 * t ** 2)
    (h,) = unigrad.hvp(lambda t: ns(t).sum(cube(t)), (t,), (np.ones(3),), backend="torch")
    np.testing.assert_allclose(unigrad.to_numpy(h), 6 * t)


def test_a_first_grad_and_hvp_import_no_torch_dynamo():
    """torch.func's backward imports torch._dynamo on first use (about a second); grad and hvp on plain
    autograd do not: a fresh process's first calls stay cheap."""
    import subprocess
    import sys

    code = ("import sys, torch, numpy as np, unigrad\n"
            "before = 'torch._dynamo' in sys.modules\n"
            "x = torch.linspace(-1, 1, 5, dtype=torch.float64)\n"
            "f = lambda x: torch.sum(torch.sin(x) * x)\n"
            "g = unigrad.grad(f)(x)\n"
            "h = unigrad.hessian_vector_product(f)(x, torch.ones(5, dtype=torch.float64))\n"
            "assert torch.allclose(h, -torch.sin(x) * x + 2 * torch.cos(x))\n"
            "print(before, 'torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == "True" or after == "False", "the first grad and hvp calls imported torch._dynamo"


def test_a_torch_function_mode_sees_the_backward_calls():
    """The engine shortcut (torch.autograd.grad's own engine call, without its Python wrapper) applies only
    where the wrapper would do nothing: under a torch function mode the mode sees torch.autograd.grad."""
    from torch.overrides import TorchFunctionMode

    class Seen(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))

    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    f = lambda x: ns(x).sum(ns(x).sin(x) * x)  # noqa: E731
    with Seen() as mode:
        g = unigrad.grad(f)(x)
        (h,) = unigrad.hvp(f, (x,), (torch.ones(5, dtype=torch.float64),))
    assert mode.names.count("grad") >= 3  # one sweep for grad, two for hvp
    assert torch.allclose(g, torch.sin(x) + x * torch.cos(x))
    assert torch.allclose(h, -torch.sin(x) * x + 2 * torch.cos(x))
    if unigrad_torch._ENGINE is not None:  # checked once at import: it gives torch.autograd.grad's results
        assert unigrad_torch._engine_agrees(unigrad_torch._ENGINE)


def test_forward_mode_is_thread_safe():
    """torch's dual level is process-global; 8 threads of forward-mode (and reverse-mode) work give exact results."""
    def f(x):
        xp = ns(x)
        y = x
        for _ in range(6):
            y = xp.sin(y) * 1.01 + x * 0.1
        return xp.sum(y ** 2)

    x = torch.linspace(-1, 1, 12, dtype=torch.float64)
    v = torch.cos(x)
    jobs = {
        "jvp": lambda: unigrad.jvp(f, (x,), (v,))[1],
        "hvp": lambda: unigrad.hvp(f, (x,), (v,))[0],
        "hessian": lambda: unigrad.hessian(f)(x),
        "jacfwd": lambda: unigrad.jacfwd(lambda x: ns(x).sin(x) * x[0])(x),
        "batched_fwd": lambda: unigrad.batched_jacobian(lambda x: ns(x).sin(x) * x[:, :1], mode="fwd")(
            x.reshape(4, 3)),
        # reverse mode and vmap running beside the forward-mode work
        "grad": lambda: unigrad.grad(f)(x),
        "jacrev": lambda: unigrad.jacrev(lambda x: ns(x).sin(x) * x[0])(x),
        "vmap_grad": lambda: unigrad.vmap(unigrad.grad(f))(x.reshape(4, 3)),
    }
    reference = {name: job() for name, job in jobs.items()}
    failures = []
    barrier = threading.Barrier(8)

    def worker(k):
        try:
            barrier.wait()
            for _ in range(3):
                for name, job in jobs.items():
                    got = job()
                    if not torch.equal(got, reference[name]):
                        failures.append((k, name, float((got - reference[name]).abs().max())))
        except Exception as exc:  # noqa: BLE001 -- reported below with the thread that failed
            failures.append((k, repr(exc)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
    assert _torch_state()["dual_level"] == -1


# ------------------------------------------------------------------------------- devices, conversion, helpers
def test_devices_and_device_strings():
    devices = TORCH.devices()
    assert devices[0] == "cpu"
    assert list(devices[1:]) == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    assert TORCH.asarray(np.ones(2), device="cpu").device == torch.device("cpu")
    assert TORCH.device(TORCH.asarray(np.ones(2), device=torch.device("cpu"))) == torch.device("cpu")
    with pytest.raises(ValueError, match="device"):
        TORCH.asarray(np.ones(2), device="tpu:0")
    if not torch.cuda.is_available():
        for name in ("gpu", "cuda", "cuda:0"):
            with pytest.raises(ValueError, match="not available"):
                TORCH.asarray(np.ones(2), device=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_results_stay_on_the_gpu():
    x = TORCH.asarray(np.array([0.1, 0.7, 1.3]), device="gpu")
    assert x.device == torch.device("cuda:0")
    assert TORCH.asarray(np.ones(2), device="cuda").device.type == "cuda"
    f_scalar = lambda x: ns(x).sum(ns(x).sin(x) * x)  # noqa: E731
    f_vector = lambda x: ns(x).sin(x) * x  # noqa: E731
    expected = {name: unigrad.to_numpy(call(np.array([0.1, 0.7, 1.3]))) for name, call in
                _every_transform(f_scalar, f_vector, backend="numpy").items()}
    for name, call in _every_transform(f_scalar, f_vector).items():
        got = call(x)
        assert all(leaf.device == x.device for leaf in optree.tree_leaves(got)), name
        assert_tree_close(got, expected[name])


def test_asarray_takes_dlpack_producers_directly():
    assert TORCH.accepts_dlpack is True
    data = np.arange(4.0)

    class Producer:  # only the DLPack protocol: no __array__, so a NumPy fallback could not read it
        def __dlpack__(self, **kwargs):
            return data.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return data.__dlpack_device__()

    t = TORCH.asarray(Producer())
    data[0] = 7.0  # DLPack shares memory: the tensor sees the change
    assert t.tolist() == [7.0, 1.0, 2.0, 3.0] and TORCH.dtype(t) == "float64"


def test_helpers():
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    assert isinstance(TORCH, unigrad_torch.TorchBackend)
    assert TORCH.version() == torch.__version__
    assert TORCH.shape(x) == (1, 3) and all(type(d) is int for d in TORCH.shape(x))
    assert TORCH.dtype(x) == "float64"
    assert TORCH.dtype(torch.ones(1, dtype=torch.complex64)) == "complex64"
    assert TORCH.cast(x, "bfloat16").dtype == torch.bfloat16
    assert torch.equal(TORCH.zeros_like(x), torch.zeros(1, 3, dtype=torch.float64))
    assert not TORCH.stop_gradient(x * 2).requires_grad
    assert TORCH.device(x) == torch.device("cpu")
    assert TORCH.is_array(x) and not TORCH.is_array(np.ones(1))
    assert TORCH.namespace().__name__ == "unigrad_torch._namespace"
    seen = []
    unigrad.grad(lambda x: seen.append(TORCH.is_array(x)) or ns(x).sum(x ** 2), backend="torch")(np.ones(2))
    unigrad.jacfwd(lambda x: seen.append(TORCH.is_array(x)) or x * 2, backend="torch")(np.ones(2))
    unigrad.vmap(lambda x: seen.append(TORCH.is_array(x)) or x * 2, backend="torch")(np.ones(2))
    assert seen == [True, True, True]


def test_to_numpy_inside_transforms():
    values = []

    def f(x):
        values.append(TORCH.to_numpy(x))
        return ns(x).sum(x ** 2)

    unigrad.grad(f, backend="torch")(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(values[0], [1.0, 2.0])
    with pytest.raises(TypeError, match="inside vmap"):
        unigrad.vmap(f, backend="torch")(np.ones((2, 2)))


def test_compile_returns_the_function_unchanged():
    assert TORCH.capabilities.compile is False

    def fn(x):
        return (x * 2,)

    assert TORCH.compile(fn) is fn


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">c16", ">i8"])
def test_non_native_byte_order_is_accepted_with_values_kept(dtype):
    values = np.array([0.5, -1.0, 2.0]) + (1j * np.array([1.0, 0.0, -1.0]) if dtype[1] == "c" else 0)
    data = (values if dtype[1] != "i" else np.array([1, -2, 3])).astype(dtype)
    a = unigrad.asarray(data, backend="torch")
    assert unigrad.to_numpy(a).dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(unigrad.to_numpy(a), data)
    if dtype[1] == "i":
        return
    g = unigrad.grad(lambda x: ns(x).sum(ns(x).real(x * ns(x).conj(x))), backend="torch")(data)
    np.testing.assert_array_equal(unigrad.to_numpy(g), 2 * np.conj(data))
    _, t = unigrad.jvp(lambda x: x * x, (data,), (data,), backend="torch")
    np.testing.assert_array_equal(unigrad.to_numpy(t), 2 * data * data)
    _, vjp_fn = unigrad.vjp(lambda x: x * 3, data, backend="torch")
    (v,) = vjp_fn(data)
    np.testing.assert_array_equal(unigrad.to_numpy(v), 3 * data)


# ------------------------------------------------------------------------------- namespace rules
def _spd(n=4, seed=1):
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


SYMMETRIC_FUNCTIONS = {
    "cholesky": lambda s: ns(s).sum(ns(s).linalg.cholesky(s)),
    "cholesky_upper": lambda s: ns(s).sum(ns(s).linalg.cholesky(s, upper=True) ** 2),
    "eigvalsh": lambda s: ns(s).sum(ns(s).linalg.eigvalsh(s) ** 2),
    "eigh": lambda s: ns(s).sum(ns(s).linalg.eigh(s).eigenvectors ** 4 * ns(s).linalg.eigh(s).eigenvalues),
}


@pytest.mark.parametrize("name", list(SYMMETRIC_FUNCTIONS))
def test_functions_of_a_symmetric_matrix_read_its_symmetric_part(name):
    """Issue 8: torch read one triangle, with a symmetric gradient but a JVP of the whole tangent, so the
    transpose test failed (3.9e-2). Now every backend differentiates f((S + S^T) / 2)."""
    from unigrad.testing import check_grads

    f = SYMMETRIC_FUNCTIONS[name]
    s = _spd()
    # eigenvectors at order 2: torch's own reverse-over-forward rule of eigh gives NaN (a torch limitation)
    check_grads(f, (s,), backend="torch", order=1 if name == "eigh" else 2)
    tangent = np.random.default_rng(2).standard_normal(s.shape)  # not symmetric
    for transform in (lambda b: unigrad.grad(f, backend=b),
                      lambda b: lambda s: unigrad.jvp(f, (s,), (tangent,), backend=b)[1]):
        ref, got = both(transform, s)
        assert_tree_close(got, ref, rtol=1e-9, atol=1e-10)
    g = unigrad.to_numpy(unigrad.grad(f, backend="torch")(s))
    np.testing.assert_allclose(g, g.T, rtol=1e-12, atol=1e-12)


def test_cholesky_of_a_non_symmetric_matrix_is_that_of_its_symmetric_part():
    a = _spd() + np.triu(np.ones((4, 4)), 1)  # upper triangle changed: torch alone would not see it
    got = unigrad.to_numpy(TORCH.namespace().linalg.cholesky(torch.from_numpy(a)))
    np.testing.assert_allclose(got, np.linalg.cholesky((a + a.T) / 2), rtol=1e-12)
    np.testing.assert_allclose(unigrad.to_numpy(TORCH.namespace().linalg.eigvalsh(torch.from_numpy(a))),
                               np.linalg.eigvalsh((a + a.T) / 2), rtol=1e-12)
    with pytest.raises(ValueError, match=r"square.*\(2, 3\)"):
        TORCH.namespace().linalg.cholesky(torch.ones(2, 3))


@pytest.mark.parametrize("fname", ["max", "min", "argmax", "argmin"])
def test_reduction_of_an_empty_array_raises_value_error(fname):
    """As NumPy and JAX (torch raises RuntimeError or IndexError)."""
    xp = TORCH.namespace()
    reduce = getattr(xp, fname)
    with pytest.raises(ValueError, match=fname):
        reduce(torch.zeros(0))
    with pytest.raises(ValueError, match=r"\(0, 3\)"):
        reduce(torch.zeros(0, 3), axis=0)
    assert reduce(torch.zeros(0, 3), axis=1).shape == (0,)  # nothing is reduced over an empty set
    with pytest.raises(ValueError):
        unigrad.grad(lambda x: ns(x).max(x), backend="torch")(np.zeros(0))
    if fname in ("max", "min"):
        assert float(reduce(torch.tensor([3.0, 1.0, 2.0]))) == (3.0 if fname == "max" else 1.0)
        assert reduce(torch.ones(2, 3), axis=-1, keepdims=True).shape == (2, 1)


def test_median_is_the_true_median_with_the_midpoint_derivative():
    xp = TORCH.namespace()
    assert float(xp.median(torch.tensor([3.0, 1.0, 2.0, 0.0]))) == 1.5  # torch.median: 1.0
    assert float(xp.median(torch.tensor([3.0, 1.0, 2.0]))) == 2.0
    a = np.random.default_rng(0).standard_normal((3, 4, 5))
    for axis in (None, 0, -1, (0, 2)):
        for keepdims in (False, True):
            got = xp.median(torch.from_numpy(a), axis=axis, keepdims=keepdims)
            np.testing.assert_array_equal(unigrad.to_numpy(got), np.median(a, axis=axis, keepdims=keepdims))
    assert np.isnan(float(xp.median(torch.tensor([1.0, float("nan"), 0.0]))))
    g = unigrad.grad(lambda x: ns(x).median(x), backend="torch")(np.array([3.0, 1.0, 2.0, 0.0]))
    np.testing.assert_array_equal(unigrad.to_numpy(g), [0.0, 0.5, 0.5, 0.0])  # JAX's rule
    jax_g = unigrad.grad(lambda x: unigrad.namespace(x).median(x), backend="jax")(np.array([3.0, 1.0, 2.0, 0.0]))
    np.testing.assert_array_equal(unigrad.to_numpy(jax_g), [0.0, 0.5, 0.5, 0.0])


@pytest.mark.parametrize("transform", ["grad", "jvp", "jacfwd", "hessian", "vmap"])
def test_numpy_function_on_a_transformed_tensor_is_a_clear_type_error(transform):
    """np.median(x) inside f raised torch's RuntimeError about numpy() and requires_grad."""
    med = lambda v: np.median(v)  # noqa: E731
    x = np.array([3.0, 1.0, 2.0, 0.0])
    call = {"grad": lambda: unigrad.grad(med, backend="torch")(x),
            "jvp": lambda: unigrad.jvp(med, (x,), (x,), backend="torch"),
            "jacfwd": lambda: unigrad.jacfwd(med, backend="torch")(x),
            "hessian": lambda: unigrad.hessian(med, backend="torch")(x),
            "vmap": lambda: unigrad.vmap(med, backend="torch")(x[:, None])}[transform]
    with pytest.raises(TypeError, match=r"NumPy function.*unigrad\.namespace\(x\)"):
        call()


def test_tangent_of_a_0d_float32_output_is_float32():
    """torch.func.jvp returns the tangent of ``y * 2.0`` for a 0-d float32 ``y`` as float64
    (pytorch/pytorch#90065); the tangent of astype(x, float32) is float32 (conformance, astype)."""
    x64 = torch.tensor(1.5, dtype=torch.float64)
    one = torch.tensor(1.0, dtype=torch.float64)
    out, tangent = unigrad.jvp(lambda x: ns(x).astype(x * x, ns(x).float32) * 2.0, (x64,), (one,), backend="torch")
    assert out.dtype == torch.float32 and tangent.dtype == torch.float32
    assert float(tangent) == 6.0  # d/dx 2 x^2 at 1.5
    x32 = torch.tensor(1.5)
    outs, tangents, _ = TORCH.jvp(lambda x: (x * 2.0, x + 1.0), (x32,), (torch.tensor(1.0),))
    assert [t.dtype for t in tangents] == [torch.float32, torch.float32]
    # the vmapped JVPs of the backend's jacfwd
    _, jac, _ = TORCH.jacfwd(lambda x: (x * 2.0,), (x32,))
    assert jac[0][0].dtype == torch.float32 and float(jac[0][0]) == 2.0


def test_take_accepts_numpy_index_arrays():
    """Issue 13 §1: NumPy indices closed over by f went to torch.where inside array-api-compat."""
    idx = np.array([0, 2])

    def f(v):
        xp = ns(v)
        return xp.sum(xp.take(v, idx))

    g = unigrad.grad(f, backend="torch")(np.arange(5.0))
    np.testing.assert_array_equal(unigrad.to_numpy(g), [1.0, 0.0, 1.0, 0.0, 0.0])
    # negative, read-only, negative-stride, narrow unsigned indices, Python lists
    readonly = np.array([0, -3])
    readonly.flags.writeable = False
    for ix in (readonly, np.array([2, 0])[::-1], np.array([0, 2], dtype=np.uint8), [0, 2]):
        got = unigrad.grad(lambda v, ix=ix: ns(v).sum(ns(v).take(v, ix)), backend="torch")(np.arange(5.0))
        np.testing.assert_array_equal(unigrad.to_numpy(got), [1.0, 0.0, 1.0, 0.0, 0.0])
    m = np.arange(6.0).reshape(2, 3)
    rows = np.array([[2], [0]])
    ref, got = both(lambda b: unigrad.grad(lambda v: ns(v).sum(ns(v).take_along_axis(v, rows, axis=1) ** 2),
                                           backend=b), m)
    assert_tree_close(got, ref)
    mapped = unigrad.vmap(lambda v: ns(v).take(v, idx, axis=0), backend="torch")(np.arange(10.0).reshape(2, 5))
    np.testing.assert_array_equal(unigrad.to_numpy(mapped), [[0.0, 2.0], [5.0, 7.0]])
    with pytest.raises(TypeError, match=r"take: indices must be an array of integers.*float64"):
        TORCH.namespace().take(torch.ones(3), np.array([0.0]))


# ------------------------------------------------------------------ an f that writes into its argument
def _doubles_in_place(x):
    x.mul_(2.0)  # the function as written: x -> (2 x) ** 2
    return x ** 2


def _doubles_a_view_in_place(x):
    x.view(x.shape).mul_(2.0)  # a write through a view of the argument
    return x ** 2


_WRITES = {
    "grad": lambda f, x: unigrad.grad(lambda v: f(v).sum(), backend="torch")(x),
    "grad-recorded": lambda f, x: unigrad.grad(lambda v: f(v).sum(), backend="torch")(x.requires_grad_()).detach(),
    "value_and_grad": lambda f, x: unigrad.value_and_grad(lambda v: f(v).sum(), backend="torch")(x)[1],
    "vjp": lambda f, x: unigrad.vjp(f, x, backend="torch")[1](torch.ones_like(x))[0],
    "jvp": lambda f, x: unigrad.jvp(f, (x,), (torch.ones_like(x),), backend="torch")[1],
    "jacobian": lambda f, x: unigrad.jacobian(f, backend="torch")(x).sum(0),
    "jacfwd": lambda f, x: unigrad.jacobian(f, backend="torch", mode="fwd")(x).sum(0),
    "batched_jacobian": lambda f, x: unigrad.batched_jacobian(f, backend="torch")(x[:, None]).reshape(-1),
    "batched_jacobian-fwd": lambda f, x: unigrad.batched_jacobian(f, backend="torch", mode="fwd")(
        x[:, None]).reshape(-1),
    "hessian": lambda f, x: unigrad.hessian(lambda v: f(v).sum(), backend="torch")(x) @ x.clone(),
    "hvp": lambda f, x: unigrad.hvp(lambda v: f(v).sum(), (x,), (x.clone(),), backend="torch")[0],
    "vmap": lambda f, x: unigrad.vmap(f, backend="torch")(x) * 2.0 / x,
}


@pytest.mark.parametrize("transform", list(_WRITES))
@pytest.mark.parametrize("f", [_doubles_in_place, _doubles_a_view_in_place], ids=["x.mul_", "x.view.mul_"])
def test_f_that_writes_into_its_argument_is_differentiated_as_written(transform, f):
    """torch refused the write into a leaf that requires grad (grad, vjp, jacobian...: its raw RuntimeError),
    while forward mode and vmap wrote through into the caller's tensor. Every transform now differentiates
    the function as written on copies: the derivative of (2 x) ** 2 is 8 x (the Hessian 8 I), and the
    caller's tensor keeps its values and its version counter."""
    x = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64)
    kept, version = x.clone(), x._version
    got = _WRITES[transform](f, x)
    torch.testing.assert_close(got, 8.0 * kept, rtol=1e-12, atol=1e-12)
    assert torch.equal(x.detach(), kept) and x._version == version


def test_a_write_into_a_closed_over_leaf_of_the_caller_is_still_refused():
    """The copies are of f's arguments: a tensor of the caller's that requires grad, written in place inside
    f, gets torch's own error (run once on the argument, once on its copy), never a number."""
    w = torch.ones(3, dtype=torch.float64, requires_grad=True)
    calls = []

    def f(x):
        calls.append(1)
        w.mul_(2.0)
        return (w * x).sum()

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        unigrad.grad(f, backend="torch")(torch.ones(3, dtype=torch.float64))
    assert torch.equal(w.detach(), torch.ones(3, dtype=torch.float64)) and len(calls) == 2
