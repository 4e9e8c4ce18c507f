"""The conformance suite every backend must pass: the tape, the adapters, and any plugin.

Run it against a backend (its name as registered) with::

    pytest --pyargs unigrad.testing.conformance --unigrad-backends=mybackend

or import its tests into a test module of your own (``from unigrad.testing.conformance import *``);
they take the ``backend`` fixture of unigrad's pytest plugin. Each test is one rule of the
cross-engine contract (docs/conventions.md) or one identity between transforms; the
NumPy tape and finite differences are the references.
"""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from unigrad.finite_differences import jacobian as fd_jacobian
from unigrad.testing import check_grads
from unigrad.testing._threads import assert_threads_exact

__all__ = [name for name in dir() if name.startswith("test_")]  # filled at the end


def _np(x):
    return unigrad.to_numpy(x)


def _close(a, b, rtol=1e-10, atol=1e-12):
    np.testing.assert_allclose(_np(a), _np(b), rtol=rtol, atol=atol)


def _caps(backend):
    return unigrad.get_backend(backend).capabilities


# Portable functions: the Array API namespace makes each run on every backend.

def mlp(w, b, x):
    xp = unigrad.namespace(w, b, x)
    return xp.tanh(x @ w + b)


def mlp_loss(w, b, x):
    xp = unigrad.namespace(w, b, x)
    return xp.sum(mlp(w, b, x) ** 2) / 2.0


def smooth(x, y):
    xp = unigrad.namespace(x, y)
    return xp.sin(x) * xp.exp(y[:1]) + xp.log(1.0 + x * x) * xp.sum(y)


@pytest.fixture
def data(backend):
    """Float64 test arrays, as arrays of the backend under test (closures over them must not mix
    NumPy arrays into another framework's computation)."""
    rng = np.random.default_rng(1234)
    raw = {
        "w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4), "x": rng.standard_normal((5, 3)),
        "u": rng.standard_normal(3), "v": rng.standard_normal(2),
    }
    return {k: unigrad.asarray(v, backend=backend) for k, v in raw.items()}


# ------------------------------------------------------------------ the contract

def test_unused_input_gets_zeros(backend):
    g = unigrad.grad(lambda x, y: unigrad.namespace(x).sum(x ** 2), argnums=(0, 1), backend=backend)(
        np.ones(3), np.ones((2, 2)))
    assert g[1] is not None
    _close(g[1], np.zeros((2, 2)))
    _, vjp_fn = unigrad.vjp(lambda x, y: x * 2.0, np.ones(3), np.ones(4), backend=backend)
    grads = vjp_fn(unigrad.asarray(np.ones(3), backend=backend))
    _close(grads[1], np.zeros(4))
    _, t = unigrad.jvp(lambda x: unigrad.namespace(x).ones_like(x) * 2.0, (np.ones(3),), (np.ones(3),),
                       backend=backend)
    _close(t, np.zeros(3))


def test_integer_and_bool_inputs_and_outputs_raise_type_error(backend):
    with pytest.raises(TypeError, match="int64"):
        unigrad.grad(lambda x: x.sum() * 1.0, backend=backend)(np.arange(3))
    with pytest.raises(TypeError, match="bool"):
        unigrad.vjp(lambda x: x > 0, np.ones(3), backend=backend)


def test_wrong_cotangent_shape_raises_value_error(backend):
    _, vjp_fn = unigrad.vjp(lambda x: x * 2.0, np.ones((2, 3)), backend=backend)
    with pytest.raises(ValueError, match="never broadcast"):
        vjp_fn(np.ones(3))
    with pytest.raises(ValueError, match="never broadcast"):
        vjp_fn(np.ones((1, 3)))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_gradient_dtype_equals_input_dtype(backend, dtype):
    b = unigrad.get_backend(backend)
    if dtype == "float64" and not b.capabilities.float64:
        pytest.skip("backend has no float64")
    try:
        x = unigrad.asarray(np.linspace(0.1, 1.0, 4), backend=backend, dtype=dtype)
    except (TypeError, ValueError) as exc:
        if dtype == "bfloat16":
            pytest.skip(f"no bfloat16 arrays on {backend}: {exc}")
        raise
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x * x * 3.0), backend=backend)(x)
    assert b.dtype(g) == dtype
    tol = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-6, "float64": 1e-12}[dtype]
    _close(np.asarray(_np(g), dtype=np.float64), 6 * np.asarray(_np(x), dtype=np.float64), rtol=tol, atol=tol)


def test_numpy_float64_and_python_scalars_keep_their_dtype(backend):
    b = unigrad.get_backend(backend)
    if not b.capabilities.float64:
        pytest.skip("backend has no float64")
    g = unigrad.grad(lambda x: x * x, backend=backend)(3.0)
    assert b.dtype(g) == "float64"
    _close(g, 6.0)
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 3), backend=backend)(np.array([1.0, 2.0]))
    assert b.dtype(g) == "float64" and b.is_array(g)


def test_complex_convention(backend):
    if not _caps(backend).complex:
        pytest.skip("backend declares no complex support")
    z = np.array([3 + 4j, 1 - 2j])
    # real-valued f of complex z: the JAX convention, grad |z|^2 = 2 conj(z)
    def abs2(z):
        xp = unigrad.namespace(z)
        return xp.sum(xp.real(z) ** 2 + xp.imag(z) ** 2)

    g = unigrad.grad(abs2, backend=backend)(z)
    _close(g, 2 * np.conj(z))
    # holomorphic: the VJP is the unconjugated transpose, ct * f'(z)
    ct = np.array([1 - 1j, 2 + 0.5j])
    _, vjp_fn = unigrad.vjp(lambda z: z * z, z, backend=backend)
    _close(vjp_fn(ct)[0], ct * 2 * z)
    _, t = unigrad.jvp(lambda z: z * z, (z,), (ct,), backend=backend)
    _close(t, 2 * z * ct)


@pytest.mark.parametrize("layout", ["transposed", "fortran", "negative_stride", "strided"])
def test_non_contiguous_inputs(backend, layout):
    base = np.arange(1.0, 13.0).reshape(3, 4)
    x = {"transposed": base.T, "fortran": np.asfortranarray(base), "negative_stride": base[::-1, ::-1],
         "strided": base[::2, ::3]}[layout]
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend=backend)(x)
    _close(g, 2 * x)


def test_zero_size_and_zero_dim(backend):
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend=backend)(np.zeros((0, 3)))
    assert unigrad.get_backend(backend).shape(g) == (0, 3)
    _close(unigrad.grad(lambda x: x ** 3, backend=backend)(np.array(2.0)), 12.0)
    j = unigrad.jacobian(lambda x: x * 2.0, backend=backend)(np.zeros(0))
    assert unigrad.get_backend(backend).shape(j) == (0, 0)
    bj = unigrad.batched_jacobian(lambda x: x * 2.0, backend=backend)(np.zeros((0, 3)))
    assert unigrad.get_backend(backend).shape(bj) == (0, 3, 3)


def test_exception_inside_f_leaves_no_state(backend):
    def bad(x):
        _ = x * 2.0
        raise KeyError("inside f")

    for make in (lambda: unigrad.grad(bad, backend=backend)(np.ones(2)),
                 lambda: unigrad.jvp(bad, (np.ones(2),), (np.ones(2),), backend=backend),
                 lambda: unigrad.jacobian(bad, mode="fwd", backend=backend)(np.ones(2)),
                 lambda: unigrad.hessian(bad, backend=backend)(np.ones(2))):
        with pytest.raises(KeyError):
            make()
    # everything still works afterwards, in both modes and nested
    _close(unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend=backend)(np.ones(2)), 2.0)
    _close(unigrad.jvp(lambda x: x ** 2, (np.ones(2),), (np.ones(2),), backend=backend)[1], 2.0)
    _close(unigrad.hessian(lambda x: unigrad.namespace(x).sum(x ** 3), backend=backend)(np.ones(2)), 6 * np.eye(2))


def test_threads_give_exact_results(backend, data):
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((4, 3)) for _ in range(8)]
    w, b = data["w"], data["b"]

    def work(x):
        return (unigrad.grad(mlp_loss, backend=backend)(w, b, x),
                unigrad.jacobian(lambda x: mlp(w, b, x), mode="fwd", backend=backend)(x[:2]),
                unigrad.hvp(lambda x: mlp_loss(w, b, x), (x,), (x,), backend=backend)[0])

    assert_threads_exact(work, xs)


def test_transforms_work_under_framework_no_grad(backend):
    """Where the framework has a no-grad mode (torch), transforms still work under it."""
    if backend != "torch":
        pytest.skip("only torch has a global no-grad mode")
    import torch

    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend=backend)(np.ones(2))
            _close(g, 2.0)
        assert torch.is_grad_enabled()


# ------------------------------------------------------------------ transforms against each other

def test_jacrev_jacfwd_stacked_vjps_and_jvps_agree(backend, data):
    w, b, x = data["w"], data["b"], data["x"][:2]
    f = lambda x: mlp(w, b, x)  # noqa: E731
    j_rev = _np(unigrad.jacrev(f, backend=backend)(x))
    j_fwd = _np(unigrad.jacfwd(f, backend=backend)(x))
    j_chunked = _np(unigrad.jacobian(f, mode="rev", chunk_size=3, backend=backend)(x))
    _close(j_rev, j_fwd)
    _close(j_rev, j_chunked)
    out, vjp_fn = unigrad.vjp(f, x, backend=backend)
    n_out, n_in = 2 * 4, 2 * 3
    rows = [_np(vjp_fn(np.eye(n_out)[k].reshape(2, 4))[0]).ravel() for k in range(n_out)]
    cols = [_np(unigrad.jvp(f, (x,), (np.eye(n_in)[k].reshape(2, 3),), backend=backend)[1]).ravel()
            for k in range(n_in)]
    _close(j_rev.reshape(n_out, n_in), np.stack(rows))
    _close(j_rev.reshape(n_out, n_in), np.stack(cols, axis=1))


def test_hessian_is_jacfwd_of_jacrev_and_hvp(backend, data):
    if not _caps(backend).higher_order:
        pytest.skip("backend does not nest transforms")
    w, b, x = data["w"], data["b"], data["x"][:2]
    f = lambda w: mlp_loss(w, b, x)  # noqa: E731
    h = _np(unigrad.hessian(f, backend=backend)(w))
    nested = _np(unigrad.jacfwd(unigrad.jacrev(f, backend=backend), backend=backend)(w))
    _close(h, nested)
    v = np.random.default_rng(3).standard_normal(w.shape)
    (hv,) = unigrad.hvp(f, (w,), (v,), backend=backend)
    _close(_np(hv).ravel(), h.reshape(12, 12) @ v.ravel(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("mode", ["rev", "fwd"])
def test_batched_jacobian_is_per_example_jacobians(backend, data, mode):
    w, b, x = data["w"], data["b"], data["x"]
    per = _np(unigrad.batched_jacobian(lambda x: mlp(w, b, x), mode=mode, backend=backend)(x))
    full = _np(unigrad.jacobian(lambda x: mlp(w, b, x), backend=backend)(x))
    assert per.shape == (5, 4, 3)
    for k in range(5):
        _close(per[k], full[k, :, k, :])


def test_batched_jacobian_detects_dependent_rows(backend, data):
    x = data["x"]
    with pytest.raises(ValueError, match="not independent"):
        unigrad.batched_jacobian(lambda x: x - unigrad.namespace(x).mean(x, axis=0), backend=backend)(x)


def test_vmap_with_chunks(backend, data):
    x = data["x"]
    out = unigrad.vmap(lambda r: unigrad.namespace(r).sum(r ** 2), chunk_size=2, backend=backend)(x)
    _close(out, (_np(x) ** 2).sum(1))
    out = unigrad.vmap(lambda r, s: r * s, in_axes=(1, None), backend=backend)(x, 2.0)
    _close(out, (_np(x) * 2).T)


def test_pytrees_argnums_has_aux(backend, data):
    params = {"w": data["w"], "b": data["b"]}

    def loss(p, x):
        value = mlp_loss(p["w"], p["b"], x)
        return value, {"value": value}

    (g_params, g_x), aux = unigrad.grad(loss, argnums=(0, 1), has_aux=True, backend=backend)(params, data["x"])
    (r_params, r_x), r_aux = unigrad.grad(loss, argnums=(0, 1), has_aux=True, backend="numpy")(params, data["x"])
    _close(g_params["w"], r_params["w"])
    _close(g_params["b"], r_params["b"])
    _close(g_x, r_x)
    _close(aux["value"], r_aux["value"])


def test_compile_gives_the_same_answers(backend, data):
    if not _caps(backend).compile:
        pytest.skip("backend compiles nothing")
    w, b, x = (_np(data[k]) for k in ("w", "b", "x"))
    for transform in ("grad", "batched_jacobian"):
        f = mlp_loss if transform == "grad" else (lambda w, b, x: mlp(w, b, x))
        argnums = 0 if transform == "grad" else 2
        plain = getattr(unigrad, transform)(f, argnums=argnums, backend=backend)
        compiled = getattr(unigrad, transform)(f, argnums=argnums, backend=backend, compile=True)
        for scale in (1.0, 2.0):  # a second call reuses the program with new array arguments
            _close(compiled(w * scale, b, x), plain(w * scale, b, x), rtol=1e-9, atol=1e-11)


# ------------------------------------------------------------------ against the tape and finite differences

def test_agrees_with_the_tape(backend, data):
    args = (data["u"], data["v"])
    for mode in ("rev", "fwd"):
        got = unigrad.jacobian(smooth, argnums=(0, 1), mode=mode, backend=backend)(*args)
        want = unigrad.jacobian(smooth, argnums=(0, 1), mode=mode, backend="numpy")(*args)
        _close(got[0], want[0])
        _close(got[1], want[1])


def test_agrees_with_finite_differences(backend, data):
    u, v = data["u"], data["v"]
    got = unigrad.jacobian(smooth, argnums=(0, 1), backend=backend)(u, v)
    fd = fd_jacobian(lambda a, b: [smooth(a, b)], [u, v])
    _close(got[0], fd[0][0], rtol=1e-7, atol=1e-8)
    _close(got[1], fd[0][1], rtol=1e-7, atol=1e-8)


def test_check_grads_second_order(backend, data):
    order = 2 if _caps(backend).higher_order else 1
    modes = ("fwd", "rev") if _caps(backend).forward_mode else ("rev",)
    check_grads(smooth, (data["u"], data["v"]), order=order, modes=modes, backend=backend)
    check_grads(mlp_loss, (data["w"], data["b"], data["x"][:2]), order=order, modes=modes, backend=backend)


__all__ = sorted(name for name in dict(globals()) if name.startswith("test_")) + ["data"]
