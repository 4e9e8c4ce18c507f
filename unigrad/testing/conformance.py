"""The conformance suite every backend must pass: the tape, the adapters, and any plugin.

Run it against a backend (its name as registered) with::

    pytest --pyargs unigrad.testing.conformance --unigrad-backends=mybackend

or import its tests into a test module of your own (``from unigrad.testing.conformance import *``);
they take the ``backend`` fixture of unigrad's pytest plugin. Each test is one rule of the
cross-engine contract (docs/conventions.md) or one identity between transforms; the
NumPy tape and finite differences are the references.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pytest

import unigrad
from unigrad.finite_differences import jacobian as fd_jacobian
from unigrad.testing import FiniteDifferencesInconclusive, check_grads
from unigrad.testing._threads import assert_threads_exact

__all__ = [name for name in dir() if name.startswith("test_")]  # filled at the end


def _np(x):
    return unigrad.to_numpy(x)


# The tolerances below are float64's. A result in single precision (a backend that declares no float64
# computes float64 inputs in float32, docs/plugins.md) is held to float32's instead: what it declares, not
# what it cannot compute. A backend that declares float64 keeps float64 results (the dtype tests check it),
# so float64's tolerances hold it.
FLOAT32_TOLERANCE = (2e-5, 2e-6)  # (rtol, atol)


def _close(a, b, rtol=1e-10, atol=1e-12):
    a, b = np.asarray(_np(a)), np.asarray(_np(b))
    if _single_precision(a) or _single_precision(b):
        rtol, atol = max(rtol, FLOAT32_TOLERANCE[0]), max(atol, FLOAT32_TOLERANCE[1])
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def _single_precision(x):
    return x.dtype.kind in "fc" and x.dtype.itemsize <= (8 if x.dtype.kind == "c" else 4)


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

    nested = _caps(backend).higher_order  # (a first-order backend refuses hessian: its part is skipped below)
    for make in (lambda: unigrad.grad(bad, backend=backend)(np.ones(2)),
                 lambda: unigrad.jvp(bad, (np.ones(2),), (np.ones(2),), backend=backend),
                 lambda: unigrad.jacobian(bad, mode="fwd", backend=backend)(np.ones(2)),
                 *([lambda: unigrad.hessian(bad, backend=backend)(np.ones(2))] if nested else [])):
        with pytest.raises(KeyError):
            make()
    # everything still works afterwards, in both modes and nested
    _close(unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend=backend)(np.ones(2)), 2.0)
    _close(unigrad.jvp(lambda x: x ** 2, (np.ones(2),), (np.ones(2),), backend=backend)[1], 2.0)
    if not nested:
        pytest.skip(f"first-order parts passed; the hessian parts are skipped: {backend} does not declare "
                    f"higher_order")
    _close(unigrad.hessian(lambda x: unigrad.namespace(x).sum(x ** 3), backend=backend)(np.ones(2)), 6 * np.eye(2))


def test_threads_give_exact_results(backend, data):
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((4, 3)) for _ in range(8)]
    w, b = data["w"], data["b"]

    nested = _caps(backend).higher_order

    def work(x):
        return (unigrad.grad(mlp_loss, backend=backend)(w, b, x),
                unigrad.jacobian(lambda x: mlp(w, b, x), mode="fwd", backend=backend)(x[:2]),
                *([unigrad.hvp(lambda x: mlp_loss(w, b, x), (x,), (x,), backend=backend)[0]] if nested else []))

    assert_threads_exact(work, xs)
    if not nested:
        pytest.skip(f"first-order parts passed; the hvp part is skipped: {backend} does not declare higher_order")


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


def test_nothing_the_caller_holds_changes_a_vjp_fn(backend):
    """``vjp_fn`` computes at the call's point whatever the caller writes afterwards into a NumPy input, a
    pytree leaf, the backend's own input array, the output or aux (on a backend with mutable arrays), and
    no result shares memory with what the caller passed in."""
    b = unigrad.get_backend(backend)

    def f(p):
        xp = unigrad.namespace(p["x"])
        y = xp.exp(p["x"]) * xp.sin(p["x"])
        return y, y

    point = np.array([0.3, 0.2, 0.1])
    want = np.exp(point) * (np.sin(point) + np.cos(point))
    for native in (False, True):
        x = b.asarray(point.copy()) if native else point.copy()
        out, vjp_fn, aux = unigrad.vjp(f, {"x": x}, has_aux=True, backend=backend)
        if native and not b.mutable_arrays:
            pass  # immutable arrays: nothing to write into
        else:
            x[...] = 5.0
        if b.mutable_arrays:
            out[...] = -1.0
            aux[...] = -2.0
        ct = b.asarray(np.ones(3))
        (g,) = vjp_fn(ct)
        _close(g["x"], want)
        _close(vjp_fn(ct)[0]["x"], want)  # a second call too
        if b.mutable_arrays:  # writing into a result leaves the cotangent the caller holds as it was
            g["x"][...] = 7.0
            _close(ct, np.ones(3))


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
    if not _caps(backend).float64:
        # finite differences of a float32 function are good to about 1e-5 at best: the same function's,
        # of the float64 values on the tape, and the backend held to float32's tolerance
        u, v = (np.asarray(_np(a), dtype=np.float64) for a in (u, v))
    fd = fd_jacobian(lambda a, b: [smooth(a, b)], [u, v])
    _close(got[0], fd[0][0], rtol=1e-7, atol=1e-8)
    _close(got[1], fd[0][1], rtol=1e-7, atol=1e-8)


def test_check_grads_second_order(backend, data):
    """``check_grads`` to second order where declared; finite differences inconclusive at a point make a
    skip that says where (docs/validation.md), never a failure or a silent pass."""
    order = 2 if _caps(backend).higher_order else 1
    modes = ("fwd", "rev") if _caps(backend).forward_mode else ("rev",)
    try:
        check_grads(smooth, (data["u"], data["v"]), order=order, modes=modes, backend=backend)
        check_grads(mlp_loss, (data["w"], data["b"], data["x"][:2]), order=order, modes=modes, backend=backend)
    except FiniteDifferencesInconclusive as exc:
        pytest.skip(f"{backend}: {exc}")




# ------------------------------------------------------------------ every differentiable function of the standard
#
# One entry per function of the Array API standard with a derivative (elementwise, statistics, linear
# algebra, manipulation, indexing, searching and sorting). Each is checked on the backend at several
# shapes (broadcasting, 0-d and zero-size among them) with ``compare`` against the NumPy tape: value, JVP
# and VJP against finite differences of the backend's own function (whose error is estimated), the
# transpose test between its JVP and VJP, and every quantity against the tape's. Where the backend
# declares them (``backend.capabilities``): second order, complex inputs; and float32 everywhere.

_UNARY = (((3,),), ((2, 3),), ((),), ((0, 2),))
_BINARY = (((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2,)), ((0, 3), (3,)))
_SQUARE = (((3, 3),), ((2, 3, 3),), ((0, 3, 3),))


@dataclass(frozen=True)
class Op:
    """A differentiable function of the standard, as the conformance suite checks it.

    ``fn(xp, *xs, **kw)`` calls it (a portable function of the differentiated arrays ``xs``);
    ``cases`` are ``(shapes, kwargs)``; ``domain`` names where inputs are drawn (one per argument, or one
    for all); ``needs`` the namespace attributes it uses ("linalg.eigh"); ``complex``/``second``: also
    checked with complex inputs / to second order where the backend declares them.
    """

    name: str
    category: str
    fn: Callable
    cases: tuple
    domain: tuple = ("any",)
    needs: tuple = ()
    complex: bool = False
    second: bool = True
    complex_only: bool = False  # defined for complex inputs only (real, imag): checked where complex is declared

    def exposed(self, ns) -> str | None:
        """None when the namespace has everything the op needs, else the missing name."""
        for path in self.needs or (self.name,):
            obj = ns
            for part in path.split("."):
                obj = getattr(obj, part, None)
                if obj is None:
                    return path
        return None


def _cases(shapes_list, **kw):
    return tuple((shapes, dict(kw)) for shapes in shapes_list)


def _unary(name, domain="any", complex=False, second=True, fn=None):
    return Op(name, "elementwise", fn or (lambda xp, x, _n=name: getattr(xp, _n)(x)), _cases(_UNARY),
              (domain,), complex=complex, second=second)


def _binary(name, domains=("any", "any"), complex=False, second=True, fn=None):
    return Op(name, "elementwise", fn or (lambda xp, a, b, _n=name: getattr(xp, _n)(a, b)), _cases(_BINARY),
              domains, complex=complex, second=second)


def _reduction(name, zero_size=True, complex=False, second=True, **extra):
    cases = [((2, 3), {}), ((2, 3), {"axis": 0}), ((2, 3), {"axis": -1, "keepdims": True}), ((4,), {}),
             ((2, 3, 2), {"axis": (0, 2)})] + ([((), {})] if not extra else [])
    if zero_size:
        cases.append(((0, 3), {"axis": 1}))
    cases = tuple(((s,), dict(kw, **extra)) for s, kw in cases)
    return Op(name, "statistics", lambda xp, x, _n=name, **kw: getattr(xp, _n)(x, **kw), cases,
              complex=complex, second=second)


def _mT(xp, x):
    return xp.matrix_transpose(x)


def _eye_like(xp, x):
    return xp.eye(x.shape[-1], dtype=x.dtype)


def _spd(xp, x):
    """A symmetric positive definite matrix from any square x (differentiably)."""
    return xp.matmul(x, _mT(xp, x)) + 3.0 * _eye_like(xp, x)


def _sym(xp, x):
    return (x + _mT(xp, x)) / 2.0


def _eigh(xp, x):
    w, v = xp.linalg.eigh(_sym(xp, x))
    return w, v * v  # eigenvectors up to sign: their squares are unique


def _svd(xp, x):
    u, s, vh = xp.linalg.svd(x, full_matrices=False)
    return u * u, s, vh * vh


def _qr(xp, x):
    q, r = xp.linalg.qr(x)
    return q * q, r * r


def _slogdet(xp, x):
    return xp.linalg.slogdet(x)[1]


def _take(xp, x, axis):
    return xp.take(x, xp.asarray([2, 0, 2, 1]), axis=axis)


def _take_along(xp, x):
    idx = xp.asarray([[1, 0, 2], [2, 2, 0]])
    return xp.take_along_axis(x, idx, axis=1)


def _getitem(xp, x):
    return x[1:, :2] * 2.0 + x[0, 1:] - x[-1, 1]


def _getitem_negative_step(xp, x):  # apart from getitem: torch refuses negative steps (KNOWN_FAILURES)
    return x[::-1, 1:] * 2.0 + x[-1, ::-2]


OPS = (
    # elementwise, unary
    _unary("abs"), _unary("acos", "unit"), _unary("acosh", "gt1"), _unary("asin", "unit"),
    _unary("asinh"), _unary("atan"), _unary("atanh", "unit"), _unary("cos", complex=True),
    _unary("cosh", complex=True), _unary("exp", complex=True), _unary("expm1"), _unary("log", "pos", complex=True),
    _unary("log1p", "pos"), _unary("log2", "pos"), _unary("log10", "pos"), _unary("negative", complex=True),
    _unary("positive", complex=True), _unary("sin", complex=True), _unary("sinh", complex=True),
    _unary("sqrt", "pos", complex=True), _unary("square", complex=True), _unary("tan", "unit", complex=True),
    _unary("tanh", complex=True), _unary("ceil", "frac", second=False), _unary("floor", "frac", second=False),
    _unary("round", "frac", second=False), _unary("trunc", "frac", second=False),
    _unary("sign", second=False),
    Op("real", "elementwise", lambda xp, x: xp.real(x), _cases(_UNARY), complex=True, complex_only=True),
    Op("imag", "elementwise", lambda xp, x: xp.imag(x), _cases(_UNARY), complex=True, complex_only=True),
    _unary("conj", complex=True),
    Op("clip", "elementwise", lambda xp, x: xp.clip(x, min=-0.9, max=0.9), _cases(_UNARY), ("any",)),
    Op("astype", "elementwise", lambda xp, x: xp.astype(x * x, xp.float32) * 2.0, _cases(_UNARY), ("any",),
       needs=("astype", "float32")),
    # elementwise, binary (broadcasting)
    _binary("add", complex=True), _binary("subtract", complex=True), _binary("multiply", complex=True),
    _binary("divide", ("any", "pos"), complex=True), _binary("pow", ("pos", "any")),
    _binary("atan2"), _binary("hypot"), _binary("logaddexp"), _binary("maximum"), _binary("minimum"),
    _binary("copysign", second=False), _binary("remainder", ("mod_x", "mod_y"), second=False),
    Op("where", "searching", lambda xp, c, a, b: xp.where(c > 0.0, a, b),
       _cases((((2, 3), (3,), (2, 1)), ((3,), (3,), (3,)), ((), (2, 2), ()), ((0, 2), (2,), (1, 2)))),
       ("any", "any", "any"), second=False),
    # statistics
    _reduction("sum", complex=True), _reduction("prod"), _reduction("mean", zero_size=True),
    _reduction("max", second=False), _reduction("min", second=False), _reduction("std", correction=1.0),
    _reduction("var"),
    Op("cumulative_sum", "statistics", lambda xp, x, **kw: xp.cumulative_sum(x, **kw),
       (((((4,),), {}), (((2, 3),), {"axis": 1}), (((2, 3),), {"axis": 0, "include_initial": True}),
         (((0, 3),), {"axis": 1})))),
    Op("cumulative_prod", "statistics", lambda xp, x, **kw: xp.cumulative_prod(x, **kw),
       (((((4,),), {}), (((2, 3),), {"axis": 1}), (((0, 3),), {"axis": 1})))),
    # linear algebra
    Op("matmul", "linalg", lambda xp, a, b: xp.matmul(a, b),
       _cases((((2, 3), (3, 4)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 2, 3), (3, 2)), ((0, 3), (3, 2)))),
       ("any", "any"), complex=True),
    Op("matrix_transpose", "linalg", lambda xp, x: xp.matrix_transpose(x) * 1.0, _cases((((2, 3),), ((2, 3, 4),)))),
    Op("tensordot", "linalg", lambda xp, a, b, **kw: xp.tensordot(a, b, **kw),
       (((((2, 3), (3, 4)), {"axes": 1}), (((2, 3), (2, 3)), {"axes": 2}),
         (((2, 3, 2), (3, 2)), {"axes": ((1, 2), (0, 1))})))),
    Op("vecdot", "linalg", lambda xp, a, b: xp.vecdot(a, b), _cases((((3,), (3,)), ((2, 3), (3,)), ((0, 3), (3,))))),
    Op("linalg.cholesky", "linalg", lambda xp, x: xp.linalg.cholesky(_spd(xp, x)), _cases(_SQUARE),
       needs=("linalg.cholesky",)),
    Op("linalg.cross", "linalg", lambda xp, a, b: xp.linalg.cross(a, b), _cases((((3,), (3,)), ((2, 3), (3,)))),
       ("any", "any"), needs=("linalg.cross",)),
    Op("linalg.det", "linalg", lambda xp, x: xp.linalg.det(x), _cases(_SQUARE), ("wellcond",), needs=("linalg.det",)),
    Op("linalg.diagonal", "linalg", lambda xp, x: xp.linalg.diagonal(x) * 1.0, _cases((((3, 3),), ((2, 3, 4),))),
       needs=("linalg.diagonal",)),
    Op("linalg.eigh", "linalg", _eigh, _cases(_SQUARE), needs=("linalg.eigh",)),
    Op("linalg.eigvalsh", "linalg", lambda xp, x: xp.linalg.eigvalsh(_sym(xp, x)), _cases(_SQUARE),
       needs=("linalg.eigvalsh",)),
    Op("linalg.inv", "linalg", lambda xp, x: xp.linalg.inv(x), _cases(_SQUARE), ("wellcond",), needs=("linalg.inv",)),
    Op("linalg.matrix_norm", "linalg", lambda xp, x, **kw: xp.linalg.matrix_norm(x, **kw),
       (((((3, 3),), {}), (((2, 3, 2),), {}), (((2, 3),), {"ord": "nuc"}), (((3, 2),), {"ord": 2}))),
       needs=("linalg.matrix_norm",)),
    Op("linalg.matrix_power", "linalg", lambda xp, x: xp.linalg.matrix_power(x, 3), _cases(_SQUARE),
       needs=("linalg.matrix_power",)),
    Op("linalg.outer", "linalg", lambda xp, a, b: xp.linalg.outer(a, b), _cases((((3,), (2,)),)), ("any", "any"),
       needs=("linalg.outer",)),
    Op("linalg.pinv", "linalg", lambda xp, x: xp.linalg.pinv(x), _cases((((3, 2),), ((2, 2, 3),))),
       needs=("linalg.pinv",)),
    Op("linalg.qr", "linalg", _qr, _cases((((3, 3),), ((2, 4, 3),))), ("wellcond",), needs=("linalg.qr",)),
    Op("linalg.slogdet", "linalg", _slogdet, _cases(_SQUARE), ("wellcond",), needs=("linalg.slogdet",)),
    Op("linalg.solve", "linalg", lambda xp, a, b: xp.linalg.solve(a, b),
       _cases((((3, 3), (3, 2)), ((2, 3, 3), (2, 3, 1)))), ("wellcond", "any"), needs=("linalg.solve",)),
    Op("linalg.svd", "linalg", _svd, _cases((((3, 2),), ((2, 3, 3),))), needs=("linalg.svd",)),
    Op("linalg.svdvals", "linalg", lambda xp, x: xp.linalg.svdvals(x), _cases((((3, 2),), ((2, 3, 3),))),
       needs=("linalg.svdvals",)),
    Op("linalg.trace", "linalg", lambda xp, x: xp.linalg.trace(x), _cases((((3, 3),), ((2, 3, 4),), ((0, 2, 2),))),
       needs=("linalg.trace",)),
    Op("linalg.vector_norm", "linalg", lambda xp, x, **kw: xp.linalg.vector_norm(x, **kw),
       (((((3,),), {}), (((2, 3),), {"axis": 1}), (((2, 3),), {"ord": 1}), (((2, 3),), {"ord": float("inf")}),
         (((2, 2, 3),), {"axis": (0, 2), "keepdims": True}))), needs=("linalg.vector_norm",), second=False),
    # manipulation
    Op("broadcast_arrays", "manipulation", lambda xp, a, b: tuple(xp.broadcast_arrays(a, b)),
       _cases((((2, 1), (3,)), ((), (2,)))), ("any", "any")),
    Op("broadcast_to", "manipulation", lambda xp, x: xp.broadcast_to(x, (2, 3, 4)),
       _cases((((4,),), ((3, 1),), ((),)))),
    Op("concat", "manipulation", lambda xp, a, b: xp.concat([a, b], axis=0),
       _cases((((2, 3), (1, 3)), ((0, 3), (2, 3)))), ("any", "any")),
    Op("expand_dims", "manipulation", lambda xp, x: xp.expand_dims(x, axis=1), _cases((((2, 3),), ((3,),)))),
    Op("flip", "manipulation", lambda xp, x, **kw: xp.flip(x, **kw),
       (((((2, 3),), {}), (((2, 3),), {"axis": 1}), (((4,),), {})))),
    Op("moveaxis", "manipulation", lambda xp, x: xp.moveaxis(x, 0, -1), _cases((((2, 3, 4),),))),
    Op("permute_dims", "manipulation", lambda xp, x: xp.permute_dims(x, (2, 0, 1)), _cases((((2, 3, 4),),))),
    Op("repeat", "manipulation", lambda xp, x, **kw: xp.repeat(x, 2, **kw),
       (((((2, 3),), {"axis": 1}), (((3,),), {})))),
    Op("reshape", "manipulation", lambda xp, x: xp.reshape(x, (3, -1)), _cases((((2, 3),), ((6,),), ((0, 3),)))),
    Op("roll", "manipulation", lambda xp, x, **kw: xp.roll(x, 1, **kw),
       (((((2, 3),), {"axis": 1}), (((4,),), {})))),
    Op("squeeze", "manipulation", lambda xp, x: xp.squeeze(x, axis=1), _cases((((2, 1, 3),),))),
    Op("stack", "manipulation", lambda xp, a, b, **kw: xp.stack([a, b], **kw),
       ((((2, 3), (2, 3)), {"axis": 1}), (((), ()), {"axis": 0})), ("any", "any")),
    Op("tile", "manipulation", lambda xp, x: xp.tile(x, (2, 1)), _cases((((2, 3),), ((3,),)))),
    Op("unstack", "manipulation", lambda xp, x: tuple(xp.unstack(x, axis=0)), _cases((((3, 2),),))),
    Op("tril", "manipulation", lambda xp, x: xp.tril(x) * 1.0, _cases((((3, 3),), ((2, 3, 4),)))),
    Op("triu", "manipulation", lambda xp, x: xp.triu(x, k=1) * 1.0, _cases((((3, 3),),))),
    Op("diff", "manipulation", lambda xp, x, **kw: xp.diff(x, **kw), (((((4,),), {}), (((2, 3),), {"axis": 0})))),
    # indexing
    Op("take", "indexing", lambda xp, x, **kw: _take(xp, x, **kw),
       (((((3,),), {"axis": 0}), (((2, 3),), {"axis": 1}))), needs=("take", "asarray")),
    Op("take_along_axis", "indexing", _take_along, _cases((((2, 3),),)), needs=("take_along_axis", "asarray")),
    Op("getitem", "indexing", _getitem, _cases((((3, 3),),)), needs=("asarray",)),
    Op("getitem_negative_step", "indexing", _getitem_negative_step, _cases((((3, 3),),)), needs=("asarray",)),
    # sorting
    Op("sort", "sorting", lambda xp, x, **kw: xp.sort(x, **kw),
       (((((4,),), {}), (((2, 3),), {"axis": 0}), (((2, 3),), {"descending": True})))),
)


_BY_NAME = {op.name: op for op in OPS}


def _draw(domain, shape, rng, is_complex):
    """Inputs for one argument: values where the op is smooth and well conditioned."""
    def signs():
        return np.where(rng.random(shape) < 0.5, -1.0, 1.0)

    if domain == "pos":
        x = rng.uniform(0.3, 2.0, shape)
    elif domain == "unit":
        x = rng.uniform(0.1, 0.8, shape) * signs()
    elif domain == "gt1":
        x = rng.uniform(1.2, 3.0, shape)
    elif domain == "frac":  # away from the integers, where floor, ceil, round and trunc jump
        x = rng.integers(-2, 3, shape) + rng.uniform(0.2, 0.4, shape) * np.where(rng.random(shape) < 0.5, 1, 2.5)
    elif domain == "mod_x":
        x = rng.uniform(2.3, 2.7, shape)
    elif domain == "mod_y":
        x = rng.uniform(1.0, 1.1, shape)
    elif domain == "wellcond":
        x = 0.3 * rng.standard_normal(shape)
        if len(shape) >= 2:
            n = min(shape[-2:])
            x = x + np.eye(shape[-2], shape[-1])[: shape[-2], : shape[-1]] * (1.0 if n else 0.0)
    else:
        x = rng.uniform(0.3, 1.5, shape) * signs()
    if is_complex:
        x = x + 1j * rng.uniform(-0.5, 0.5, shape)
    return np.asarray(x)


@dataclass
class CaseResult:
    """One op at one case on one backend: the verdict of each kind of check."""

    op: str
    category: str
    case: str
    dtype: str
    order: int
    jvp: str = "-"
    vjp: str = "-"
    fd: str = "-"
    tape: str = "-"
    verdict: str = "pass"   # "pass", "fail", "error", "inconclusive", "skip"
    message: str = ""
    fd_disagrees: tuple = ()  # on a failure: the backends (the tape included) that finite differences contradict


_RANK = {"-": 0, "ok": 1, "kink": 2, "inconclusive": 3, "fail": 4}


def _worst(statuses):
    statuses = list(statuses)
    return max(statuses, key=lambda s: _RANK[s]) if statuses else "-"


def _describe(shapes, kwargs):
    text = " ".join("x".join(str(s) for s in shape) if shape else "()" for shape in shapes)
    if kwargs:
        text += " " + ",".join(f"{k}={v}" for k, v in kwargs.items())
    return text


def _portable(op, kwargs):
    def f(*xs):
        xp = unigrad.namespace(*xs)
        return op.fn(xp, *xs, **kwargs)
    f.__name__ = f.__qualname__ = op.name.replace(".", "_")
    return f


def _plans(op, caps, complex_, second, float32):
    """(case index, shapes, kwargs, dtype, order) for each check of ``op``, or a skip reason."""
    plans = []
    base = "float64" if caps.float64 else "float32"
    want_complex = caps.complex if complex_ is None else complex_
    if op.complex_only:
        if not want_complex:
            return "defined for complex inputs only, and the backend declares no complex support"
        base, float32 = ("complex128" if caps.float64 else "complex64"), False
    for k, (shapes, kwargs) in enumerate(op.cases):
        plans.append((k, shapes, kwargs, base, 1))
    shapes0, kwargs0 = op.cases[0]
    if float32 and base != "float32":
        plans.append((0, shapes0, kwargs0, "float32", 1))
    if op.complex and not op.complex_only and want_complex:
        plans.append((0, shapes0, kwargs0, "complex128" if caps.float64 else "complex64", 1))
    if op.second and (caps.higher_order if second is None else second):
        plans.append((0, shapes0, kwargs0, base, 2))
    return plans


def _plan_args(op, k, shapes, dtype):
    seed = zlib.crc32(f"{op.name}/{k}".encode())
    rng = np.random.default_rng(seed)
    domains = op.domain if len(op.domain) == len(shapes) else op.domain[:1] * len(shapes)
    is_complex = dtype.startswith("complex")
    return seed % 1000, tuple(_draw(d, s, rng, is_complex).astype(dtype) for d, s in zip(domains, shapes))


# Backends whose eager operations each compile once per shape (JAX): in the fast mode, all the checks of
# one op run as one compiled program.
COMPILE_BATCHES = ("jax",)


def run_op(backend: str, op: Op, *, complex_: bool | None = None, second: bool | None = None,
           float32: bool = True, fast: bool = False) -> list[CaseResult]:
    """Check ``op`` on ``backend`` at each of its cases (float64 where the backend has it), plus float32,
    complex and second order at its first case where declared. An op the namespace lacks gives one
    "skip" row.

    Full mode (default): each case is a :func:`compare` of the backend with the NumPy tape: value, JVP,
    VJP (and JVP of VJP) against finite differences of the backend's own function, the transpose test,
    and every quantity against the tape's. Fast mode: each case is checked against finite differences
    on the tape; the backend's value, JVP, VJP (and JVP of VJP) for all cases of the op come from ONE
    call (one compiled program for :data:`COMPILE_BATCHES`) and are compared with the tape's at the
    pairwise tolerance (rounding); any case that differs, raises, or where the tape's finite differences
    do not pass, is re-run in full mode, so a failure is always diagnosed by the full checks.
    """
    b = unigrad.get_backend(backend)
    missing = op.exposed(b.namespace())
    if missing is not None:
        return [CaseResult(op.name, op.category, "-", "-", 1, verdict="skip",
                           message=f"the namespace has no {missing}")]
    plans = _plans(op, b.capabilities, complex_, second, float32)
    if isinstance(plans, str):
        return [CaseResult(op.name, op.category, "-", "-", 1, verdict="skip", message=plans)]
    if fast and b.name != "numpy":
        return _run_fast(b, op, plans)
    return [_run_full(b, op, plan) for plan in plans]


def _run_full(b, op, plan) -> CaseResult:
    from unigrad.testing import compare
    from unigrad.testing._compare import AGREE, CONVENTION, INCONCLUSIVE

    k, shapes, kwargs, dtype, order = plan
    seed, args = _plan_args(op, k, shapes, dtype)
    row = CaseResult(op.name, op.category, _describe(shapes, kwargs), dtype, order)
    backends = ["numpy"] if b.name == "numpy" else ["numpy", b.name]
    try:
        report = compare(_portable(op, kwargs), args, backends=backends, argnums="all", order=order,
                         jacobian=False, repeats=0, seed=seed)
    except Exception as exc:  # noqa: BLE001 -- a conformance failure to report, not to propagate
        row.verdict, row.message = "error", f"{type(exc).__name__}: {exc}"
        return row
    r = report[b.name]
    if r.status != "ok":
        row.verdict, row.message = "error", r.message
        return row
    fd_checks = [c for c in r.checks if c.against in ("fd", "self")]
    tape_checks = [c for c in r.checks if c.against not in ("fd", "self")]
    row.jvp = _worst(c.status for c in r.checks if c.quantity == "jvp")
    row.vjp = _worst(c.status for c in r.checks if c.quantity in ("vjp", "transpose"))
    row.fd = _worst(c.status for c in fd_checks)
    ref = report["numpy"]
    if b.name == "numpy":
        row.tape = "ref"
    elif ref.status != "ok":
        row.tape = "-"
        row.message = f"(the tape could not run this case: {ref.message}) "
    else:
        row.tape = _worst(c.status for c in tape_checks)
    if r.verdict in (AGREE, CONVENTION):
        row.verdict = "pass"
    elif r.verdict == INCONCLUSIVE:
        row.verdict = "inconclusive"
        row.message += "; ".join(r.reasons)
    else:
        row.verdict = "fail"
        row.message += "; ".join(r.reasons)
        row.fd_disagrees = tuple(name for name in backends if report[name].status == "ok" and _worst(
            c.status for c in report[name].checks if c.against in ("fd", "self")) == "fail")
        if row.fd_disagrees:
            row.message += f" [disagrees with finite differences: {', '.join(_who(n) for n in row.fd_disagrees)}]"
    return row


def _who(name):
    return "numpy (the tape, the reference)" if name == "numpy" else name


def _run_fast(b, op, plans) -> list[CaseResult]:
    from unigrad import _api, _registry
    from unigrad.testing import compare
    from unigrad.testing._compare import AGREE, PAIRWISE_TOLERANCES, _Problem, _random_directions
    from unigrad.testing._programs import _pairwise_error

    tape = _registry.get_backend("numpy")
    prepared, rows = [], [None] * len(plans)
    for i, plan in enumerate(plans):
        k, shapes, kwargs, dtype, order = plan
        if dtype.startswith("complex") and not b.capabilities.complex:
            continue
        seed, args = _plan_args(op, k, shapes, dtype)
        f = _portable(op, kwargs)
        try:
            ref = compare(f, args, backends=["numpy"], argnums="all", order=order, jacobian=False, repeats=0,
                          seed=seed)["numpy"]
        except Exception:  # noqa: BLE001 -- the full mode reports it
            ref = None
        if ref is None or ref.status != "ok" or ref.verdict != AGREE:
            rows[i] = _run_full(b, op, plan)
            continue
        problem = _Problem(f, args, "all", None, seed)
        cts = _random_directions([(o.shape, np.iscomplexobj(o)) for o in ref.outputs], seed, 1)
        prepared.append((i, plan, f, args, problem.tangents, cts, [o.dtype.name for o in ref.outputs], ref))

    def kernel(*flat):
        results, pos = [], 0
        for _, plan, f, args, tangents, cts, out_dtypes, _ in prepared:
            n, m = len(args), len(cts)
            xs, ts, us = flat[pos:pos + n], flat[pos + n:pos + 2 * n], flat[pos + 2 * n:pos + 2 * n + m]
            pos += 2 * n + m

            def flat_f(*a, f=f):
                out = f(*a)
                return tuple(out) if isinstance(out, (tuple, list)) else (out,)
            outs, t_out = _api.jvp(flat_f, tuple(xs), tuple(ts), backend=b)
            _, vjp_fn = _api.vjp(flat_f, *xs, backend=b)
            item = [tuple(outs), tuple(t_out), tuple(vjp_fn(tuple(us)))]
            if plan[4] >= 2:
                def vjp_of(*a, flat_f=flat_f, us=us):
                    return _api.vjp(flat_f, *a, backend=b)[1](tuple(us))
                item.append(tuple(_api.jvp(vjp_of, tuple(xs), tuple(ts), backend=b)[1]))
            results.append(tuple(item))
        return tuple(results)

    measured = None
    if prepared:
        flat = []
        for _, plan, f, args, tangents, cts, out_dtypes, _ in prepared:
            flat += [b.asarray(np.asarray(x)) for x in args]
            flat += [b.asarray(t, dtype=np.asarray(x).dtype.name) for t, x in zip(tangents, args)]
            flat += [b.asarray(c if np.iscomplexobj(c) or not d.startswith("complex") else c.astype(d), dtype=d)
                     for c, d in zip(cts, out_dtypes)]
        token = _registry.active_backend.set(b)
        try:
            run = b.compile(kernel) if (b.capabilities.compile and b.name in COMPILE_BATCHES) else kernel
            measured = [[[np.asarray(b.to_numpy(a)) for a in part] for part in item] for item in run(*flat)]
        except Exception:  # noqa: BLE001 -- each case alone, in full mode, says what raised
            measured = None
        finally:
            _registry.active_backend.reset(token)
    for j, (i, plan, f, args, tangents, cts, out_dtypes, ref) in enumerate(prepared):
        tol = PAIRWISE_TOLERANCES.get(plan[3], 1e-8)
        wanted = [ref.outputs, ref.jvp, ref.vjp] + ([ref.second] if plan[4] >= 2 else [])
        want_dtypes = [ref.dtypes.get(q) for q in ("value", "jvp", "vjp", "second")][:len(wanted)]
        if measured is not None and all(_pairwise_error(got, want) <= tol
                                        for got, want in zip(measured[j], wanted)) and all(
                [a.dtype.name for a in got] == list(names) for got, names in zip(measured[j], want_dtypes)
                if names is not None):
            k, shapes, kwargs, dtype, order = plan
            fd = _worst(c.status for c in ref.checks if c.against in ("fd", "self"))
            rows[i] = CaseResult(op.name, op.category, _describe(shapes, kwargs), dtype, order, jvp="ok", vjp="ok",
                                 fd=fd, tape="ok", verdict="pass")
        else:
            rows[i] = _run_full(b, op, plan)
    return [r for r in rows if r is not None]


def coverage_table(rows: Sequence[CaseResult], title: str = "") -> str:
    """A printable per-op table of :class:`CaseResult` rows."""
    header = ["op", "category", "case", "dtype", "order", "JVP", "VJP", "FD", "tape", "verdict"]
    body = [[r.op, r.category, r.case, r.dtype, str(r.order), r.jvp, r.vjp, r.fd, r.tape, r.verdict]
            for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    lines = [title] if title else []
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    problems = [r for r in rows if r.verdict in ("fail", "error", "inconclusive")]
    if problems:
        lines.append("")
        lines += [f"{r.op} [{r.case}, {r.dtype}, order {r.order}] {r.verdict}: {r.message}" for r in problems]
    return "\n".join(lines)


def _conclude(rows: Sequence[CaseResult], op_name: str, backend: str) -> None:
    """The outcome of one ``test_op``: a failure (saying which backends finite differences contradict),
    a skip with its reason (the op is missing, or finite differences could not decide a case), or a pass."""
    if rows and rows[0].verdict == "skip":
        pytest.skip(f"{backend}: {rows[0].message}")
    bad = [r for r in rows if r.verdict in ("fail", "error")]
    if bad:
        suspects = sorted({name for r in bad for name in r.fd_disagrees})
        blame = (f"disagrees with finite differences: {', '.join(_who(n) for n in suspects)}" if suspects else
                 "finite differences contradict no backend (an error, or a difference between the backends)")
        pytest.fail(f"{op_name} on {backend}: {blame}\n" + coverage_table(rows, f"{op_name} on {backend}"),
                    pytrace=False)
    unsure = [r for r in rows if r.verdict == "inconclusive"]
    if unsure:
        pytest.skip(f"{op_name} on {backend}: finite differences inconclusive at "
                    + "; ".join(f"[{r.case}, {r.dtype}, order {r.order}] {r.message}" for r in unsure))


def coverage_report(backend_name: str) -> tuple[str, bool]:
    """Run the per-op conformance checks for one backend; return a printable coverage table (op, case,
    dtype, order and the verdicts of its JVP, VJP, finite-difference and tape checks) and whether every
    check passed. Ops the backend's namespace lacks are listed as skipped; capabilities the backend does
    not declare (complex, higher order) are not checked. An unknown or unloadable backend raises its
    error (``ValueError`` / ``ImportError``).

    ``unigrad check --conformance NAME`` prints this table.
    """
    b = unigrad.get_backend(backend_name)
    rows = []
    for op in OPS:
        rows += run_op(backend_name, op)
    counted = [r for r in rows if r.verdict != "skip"]
    passed = sum(r.verdict == "pass" for r in counted)
    bad = [r for r in counted if r.verdict in ("fail", "error")]
    caps = b.capabilities
    title = (f"unigrad conformance: backend {b.name!r} ({len(OPS)} functions of the Array API standard; "
             f"{passed}/{len(counted)} cases pass; complex {'checked' if caps.complex else 'not declared'}, "
             f"second order {'checked' if caps.higher_order else 'not declared'})")
    table = coverage_table(rows, title)
    table += f"\n\noverall: {'PASS' if not bad else 'FAIL'}"
    return table, not bad


@pytest.mark.parametrize("op_name", [op.name for op in OPS])
def test_op(backend, op_name, request):
    """One function of the standard on the backend: values, JVP and VJP against finite differences and
    the tape, at several shapes (broadcasting, 0-d, zero-size), float32, complex and second order where
    declared."""
    known = KNOWN_FAILURES.get((backend, op_name))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=known))
    fast = request.config.getoption("--unigrad-conformance", default="fast") == "fast"
    _conclude(run_op(backend, _BY_NAME[op_name], fast=fast), op_name, backend)


# (backend, op) -> why it fails today: expected failures that must flip (strict) once fixed.
KNOWN_FAILURES: dict = {
    ("torch", "getitem_negative_step"): "torch: x[::-1] raises 'step must be greater than zero' (the standard allows "
                          "negative slice steps). A documented limitation, not a unigrad bug: the operator "
                          "is torch.Tensor.__getitem__ on the raw tensor f receives, which unigrad does not "
                          "wrap; use xp.flip (docs/guide.md, Backends)",
}


# ------------------------------------------------------------------ custom rules and stop_gradient

def _sin_with_rule(kind):
    """sin whose rule says 2 cos (not the true derivative, so only the rule can produce it)."""
    if kind == "custom_vjp":
        @unigrad.custom_vjp
        def f(x):
            return unigrad.namespace(x).sin(x)

        f.defvjp(lambda x: (f(x), unigrad.namespace(x).cos(x)), lambda cos_x, g: (2.0 * cos_x * g,))
        return f

    @unigrad.custom_jvp
    def f(x):
        return unigrad.namespace(x).sin(x)

    f.defjvp(lambda p, t: (f(p[0]), 2.0 * unigrad.namespace(p[0]).cos(p[0]) * t[0]))
    return f


@pytest.mark.parametrize("kind", ["custom_vjp", "custom_jvp"])
def test_custom_rule_is_what_comes_back(backend, kind):
    """A custom rule (``unigrad.custom_vjp``/``custom_jvp``) is used in both modes and differentiated for
    second derivatives; a backend that does not declare ``custom_rules`` must refuse it, never ignore it."""
    f = _sin_with_rule(kind)
    x = np.array([0.3, -0.5, 1.2])
    loss = lambda x: unigrad.namespace(x).sum(f(x))  # noqa: E731
    if not _caps(backend).custom_rules:
        with pytest.raises(NotImplementedError, match="custom"):
            unigrad.grad(loss, backend=backend)(x)
        pytest.skip(f"{backend} does not declare custom_rules (and refuses them, as it must)")
    want = 2 * np.cos(x)
    _close(unigrad.grad(loss, backend=backend)(x), want)
    _close(unigrad.jacrev(f, backend=backend)(x), np.diag(want))
    _close(unigrad.batched_jacobian(f, backend=backend)(x[:, None]), want[:, None, None])
    if _caps(backend).forward_mode:
        _close(unigrad.jvp(f, (x,), (np.ones(3),), backend=backend)[1], want)
        _close(unigrad.jacfwd(f, backend=backend)(x), np.diag(want))
    if _caps(backend).higher_order:
        _close(unigrad.hessian(loss, backend=backend)(x), np.diag(-2 * np.sin(x)))
    if _caps(backend).compile:
        _close(unigrad.grad(loss, backend=backend, compile=True)(x), want)


_THREE_MODES = [(a, b, c) for a in ("fwd", "rev") for b in ("fwd", "rev") for c in ("fwd", "rev")]


@pytest.mark.parametrize("kind", ["custom_vjp", "custom_jvp"])
def test_custom_rules_third_derivatives_in_every_nesting(backend, kind):
    """Every nesting of three modes (``jacfwd`` / ``jacrev``) over a custom rule gives the rule's third derivative
    (``-2 cos`` on the diagonal), or raises NotImplementedError (torch: forward over forward through a custom
    rule), never another number. A backend transposes a rule's missing mode with a nested transform; on MLX that
    transform closing over the rule's primals gave wrong third derivatives in half the nestings, silently."""
    if not _caps(backend).custom_rules or not _caps(backend).higher_order:
        pytest.skip(f"{backend} declares no custom_rules or no higher_order")
    f = _sin_with_rule(kind)
    x = np.array([0.3, -0.5, 1.2])
    loss = lambda x: unigrad.namespace(x).sum(f(x))  # noqa: E731
    want = np.zeros((3, 3, 3))
    want[range(3), range(3), range(3)] = -2 * np.cos(x)
    worked = []
    for modes in _THREE_MODES:
        if "fwd" in modes and not _caps(backend).forward_mode:
            continue
        g = loss
        for m in reversed(modes):
            g = (unigrad.jacfwd if m == "fwd" else unigrad.jacrev)(g, backend=backend)
        try:
            got = g(x)
        except NotImplementedError:
            continue
        try:
            _close(got, want)
        except AssertionError as exc:
            nesting = "(".join("jacfwd" if m == "fwd" else "jacrev" for m in modes)
            raise AssertionError(f"{backend}: {nesting}(f))) of a {kind} rule: {exc}") from None
        worked.append(modes)
    assert ("rev", "rev", "rev") in worked, f"{backend}: reverse over reverse over reverse raised"


def test_stop_gradient_has_a_zero_derivative(backend):
    x = np.array([0.3, -0.5, 1.2])
    f = lambda x: unigrad.namespace(x).sum(x ** 2 * unigrad.stop_gradient(x))  # noqa: E731
    if not _caps(backend).custom_rules and type(unigrad.get_backend(backend)).stop_gradient is unigrad.Backend.stop_gradient:
        with pytest.raises(NotImplementedError, match="stop_gradient"):
            unigrad.grad(f, backend=backend)(x)
        pytest.skip(f"{backend} has neither stop_gradient nor custom_rules (and refuses, as it must)")
    _close(unigrad.grad(f, backend=backend)(x), 2 * x ** 2)
    if _caps(backend).forward_mode:
        _close(unigrad.jvp(lambda x: x * unigrad.stop_gradient(x), (x,), (np.ones(3),), backend=backend)[1], x)
    if _caps(backend).higher_order:
        _close(unigrad.hessian(f, backend=backend)(x), np.diag(2 * x))


# ------------------------------------------------------------------ derivatives of solutions (unigrad.implicit)
# linear_solve and custom_root are custom rules (docs/implicit.md): first order, on a backend that declares
# custom_rules; one that does not must refuse them, never differentiate through the solver's iterations.

_SPD = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
_RHS = np.array([1.0, -2.0, 0.5])


def _close_solution(a, b):
    """``_close`` for an iterative solver's result: its tolerance (1e-5 relative in float32) on top."""
    single = _single_precision(np.asarray(_np(a))) or _single_precision(np.asarray(_np(b)))
    _close(a, b, *((1e-4, 1e-5) if single else (1e-8, 1e-10)))


def _refuses_without_custom_rules(backend, fn, *args):
    if _caps(backend).custom_rules:
        return False
    with pytest.raises(NotImplementedError, match="custom"):
        unigrad.grad(fn, backend=backend)(*args)
    return True


def test_linear_solve_value_and_first_derivatives(backend):
    """``x = A^{-1} b`` (a small SPD system, CG, the matrix closed over by matvec): the value, the gradient in
    ``b`` (``u = A^{-1} cos x``) and in the matrix (``-u x^T``), and the JVP, against NumPy's closed forms."""
    def solution(a, b):
        return unigrad.linear_solve(lambda v: a @ v, b, solve="cg", symmetric=True)

    def loss(a, b):
        return unigrad.namespace(a, b).sum(unigrad.namespace(a, b).sin(solution(a, b)))

    if _refuses_without_custom_rules(backend, loss, _SPD, _RHS):
        pytest.skip(f"{backend} does not declare custom_rules (and refuses linear_solve's, as it must)")
    x = np.linalg.solve(_SPD, _RHS)
    u = np.linalg.solve(_SPD, np.cos(x))
    _close_solution(unigrad.evaluate(solution, _SPD, _RHS, backend=backend), x)
    ga, gb = unigrad.grad(loss, argnums=(0, 1), backend=backend)(_SPD, _RHS)
    _close_solution(gb, u)
    _close_solution(ga, -np.outer(u, x))
    if _caps(backend).forward_mode:
        da, db = np.outer([0.3, -0.1, 0.2], [0.5, 0.4, -0.6]), np.array([0.2, 0.1, -0.3])
        _, tangent = unigrad.jvp(loss, (_SPD, _RHS), (da, db), backend=backend)
        _close_solution(tangent, np.cos(x) @ np.linalg.solve(_SPD, db - da @ x))


def _newton_sqrt(init, a):
    x = init
    for _ in range(30):
        x = 0.5 * (x + a / x)
    return x


def test_custom_root_value_and_first_derivatives(backend):
    """The square root as the root of ``x**2 - a`` (Newton's method, run on values): the value and the
    derivative ``1 / (2 sqrt a)`` in reverse and forward mode (the implicit function theorem, a GMRES solve
    with the optimality Jacobian and its transpose)."""
    root = unigrad.custom_root(lambda x, a: x ** 2 - a)(_newton_sqrt)
    a = np.array([4.0, 9.0, 2.0])

    def sqrt(a):
        return root(unigrad.namespace(a).ones(a.shape, dtype=a.dtype), a)

    def total(a):
        return unigrad.namespace(a).sum(sqrt(a))

    if _refuses_without_custom_rules(backend, total, a):
        pytest.skip(f"{backend} does not declare custom_rules (and refuses custom_root's, as it must)")
    _close_solution(unigrad.evaluate(sqrt, a, backend=backend), np.sqrt(a))
    _close_solution(unigrad.grad(total, backend=backend)(a), 0.5 / np.sqrt(a))
    if _caps(backend).forward_mode:
        _close_solution(unigrad.jacfwd(sqrt, backend=backend)(a), np.diag(0.5 / np.sqrt(a)))


# ------------------------------------------------------------------ capabilities, random programs

_CAPABILITIES = ("forward_mode", "vmap", "compile", "higher_order", "complex", "float64", "custom_rules")


@pytest.mark.parametrize("capability", _CAPABILITIES)
def test_declared_capability_is_delivered(backend, capability):
    """Each capability the backend declares works and gives the tape's numbers; an undeclared one is
    skipped with its reason."""
    b = unigrad.get_backend(backend)
    if not getattr(b.capabilities, capability):
        pytest.skip(f"{backend} does not declare {capability}")
    x = np.array([0.3, -0.7, 1.1])

    def loss(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x) * xp.exp(x / 2.0))

    want_grad = np.cos(x) * np.exp(x / 2) + np.sin(x) * np.exp(x / 2) / 2
    if capability == "forward_mode":
        _, t = unigrad.jvp(lambda x: unigrad.namespace(x).sin(x) * x, (x,), (np.ones(3),), backend=backend)
        _close(t, np.cos(x) * x + np.sin(x), rtol=1e-12)
        _close(unigrad.jacfwd(lambda x: unigrad.namespace(x).sin(x), backend=backend)(x), np.diag(np.cos(x)),
               rtol=1e-12)
    elif capability == "vmap":
        rows = np.stack([x, 2 * x])
        _close(unigrad.vmap(unigrad.grad(loss, backend=backend), backend=backend)(rows),
               np.stack([want_grad, unigrad.to_numpy(unigrad.grad(loss, backend="numpy")(2 * x))]), rtol=1e-12)
    elif capability == "compile":
        g = unigrad.grad(loss, backend=backend, compile=True)
        _close(g(x), want_grad, rtol=1e-12)
        _close(g(2 * x), unigrad.grad(loss, backend="numpy")(2 * x), rtol=1e-12)
    elif capability == "higher_order":
        h = unigrad.hessian(loss, backend=backend)(x)
        _close(h, unigrad.hessian(loss, backend="numpy")(x), rtol=1e-10)
    elif capability == "complex":
        z = np.array([0.3 + 0.4j, -1.0 + 0.2j])
        _close(unigrad.grad(lambda z: unigrad.namespace(z).sum(unigrad.namespace(z).abs(z) ** 2),
                            backend=backend)(z), 2 * np.conj(z), rtol=1e-12)
    elif capability == "custom_rules":
        rule = _sin_with_rule("custom_vjp")
        _close(unigrad.grad(lambda x: unigrad.namespace(x).sum(rule(x)), backend=backend)(x), 2 * np.cos(x))
    elif capability == "float64":
        g = unigrad.grad(loss, backend=backend)(x)
        assert b.dtype(g) == "float64"
        _close(g, want_grad, rtol=1e-14, atol=1e-15)  # float64 accuracy, not float32's


def test_random_programs(backend, request):
    """A budget of random portable programs (``--unigrad-programs``, 100 by default): each checked
    against finite differences on the tape and compared with the tape on the backend."""
    hypothesis = pytest.importorskip("hypothesis", reason="random programs need hypothesis")
    from unigrad.testing import check_programs_across
    from unigrad.testing import strategies as ust

    budget = int(request.config.getoption("--unigrad-programs", default=100))
    cases = []

    @hypothesis.settings(max_examples=budget + budget // 10, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(ust.program_cases(max_ops=4, max_dims=2, max_side=3))
    def draw(case):
        cases.append(case)

    draw()
    stats = check_programs_across(cases, [backend])
    assert stats["compared"] >= budget, stats


__all__ = sorted(name for name in dict(globals()) if name.startswith("test_")) + ["data"]
