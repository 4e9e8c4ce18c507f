"""sparse_jacobian and sparse_hessian on every backend, eager and compiled: results equal to the dense
transforms, Hessian symmetry, each backend's sparse type, the per-signature plan, errors, and the
unigrad.testing checks (each shown to fail on a wrong pattern)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

sparse = pytest.importorskip("scipy.sparse")

import unigrad  # noqa: E402
from unigrad.testing import check_sparse_hessian, check_sparse_jacobian, check_sparsity_covers  # noqa: E402

BACKENDS = ["numpy", "torch", "jax", "tensorflow"]
MODULES = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}


def needs(backend):
    if backend in MODULES:
        pytest.importorskip(MODULES[backend])
    return backend


def tridiagonal(n):
    return sparse.diags_array([1, 1, 1], offsets=[-1, 0, 1], shape=(n, n), dtype=bool)


def tridiagonal_map(x):
    xp = unigrad.namespace(x)
    left = xp.concat([xp.zeros_like(x[:1]), x[:-1]])
    right = xp.concat([x[1:], xp.zeros_like(x[:1])])
    return xp.sin(x) * 2.0 + left * x + right ** 2


def rosenbrock(x):
    xp = unigrad.namespace(x)
    return xp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def gathered(x, idx, w):
    """Row i depends on x[idx[i, :]] alone: a random sparse program (the pattern is idx's)."""
    xp = unigrad.namespace(x)
    y = w[:, 0] * xp.sin(xp.take(x, idx[:, 0]))
    for j in range(1, idx.shape[1]):
        y = y * (1.0 + w[:, j] * xp.tanh(xp.take(x, idx[:, j])))
    return y


def gathered_pattern(idx, n):
    rows = np.repeat(np.arange(idx.shape[0]), idx.shape[1])
    return sparse.csr_array((np.ones(rows.size, dtype=bool), (rows, idx.reshape(-1))), shape=(idx.shape[0], n))


X = np.linspace(-1.1, 1.3, 10)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", BACKENDS)
def test_jacobian_equals_dense(name, compile):
    backend = needs(name)
    for mode in ("fwd", "rev"):
        check_sparse_jacobian(tridiagonal_map, (X,), sparsity=tridiagonal(10), mode=mode, backend=backend,
                              compile=compile)
        plan = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), mode=mode, backend=backend).plan(X)
        assert (plan.mode, plan.n_colors) == (mode, 3)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", BACKENDS)
def test_hessian_equals_dense_and_is_symmetric(name, compile):
    backend = needs(name)
    dense = check_sparse_hessian(rosenbrock, (X,), sparsity=tridiagonal(10), backend=backend, compile=compile)
    assert np.count_nonzero(dense) == 28  # the check compared a real tridiagonal Hessian
    plan = unigrad.sparse_hessian(rosenbrock, sparsity=tridiagonal(10), backend=backend).plan(X)
    assert (plan.mode, plan.n_colors) == ("star", 3)


@pytest.mark.parametrize("name", BACKENDS)
def test_random_sparse_program_on_each_backend(name):
    backend = needs(name)
    rng = np.random.default_rng(3)
    idx, w = rng.integers(0, 15, (12, 3)), rng.uniform(0.5, 2.0, (12, 3))
    x = rng.uniform(-1, 1, 15)
    check_sparse_jacobian(gathered, (x, idx, w), sparsity=gathered_pattern(idx, 15), backend=backend)


def with_aux(x):
    """tridiagonal_map with aux: an array computed from the output, a string and a number."""
    y = tridiagonal_map(x)
    return y, {"total": unigrad.namespace(y).sum(y), "tag": "kept", "count": 3}


def rosenbrock_with_aux(x):
    value = rosenbrock(x)
    return value, (value * 2.0, "kept")


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", BACKENDS)
def test_has_aux(name, compile):
    backend = needs(name)
    b = unigrad.get_backend(backend)
    want = unigrad.jacobian(tridiagonal_map)(X)  # the references on the tape
    for mode in ("fwd", "rev"):  # the aux leaves come from different passes in each mode
        jac = unigrad.sparse_jacobian(with_aux, sparsity=tridiagonal(10), mode=mode, has_aux=True, backend=backend,
                                      compile=compile, format="dense")
        for _ in range(2 if compile else 1):  # the second call: the cached plan and program
            result, aux = jac(X)
            np.testing.assert_allclose(np.asarray(unigrad.to_numpy(result)), want, rtol=1e-12, atol=1e-12)
            assert b.is_array(aux["total"]) and (aux["tag"], aux["count"]) == ("kept", 3)
            np.testing.assert_allclose(float(unigrad.to_numpy(aux["total"])), np.sum(tridiagonal_map(X)), rtol=1e-12)
    hessian = unigrad.sparse_hessian(rosenbrock_with_aux, sparsity=tridiagonal(10), has_aux=True, backend=backend,
                                     compile=compile, format="dense")
    result, (doubled, tag) = hessian(X)
    np.testing.assert_allclose(np.asarray(unigrad.to_numpy(result)), unigrad.hessian(rosenbrock)(X), rtol=1e-10,
                               atol=1e-10)
    np.testing.assert_allclose(float(unigrad.to_numpy(doubled)), 2 * float(rosenbrock(X)), rtol=1e-12)
    assert tag == "kept" and b.is_array(doubled)
    with pytest.raises(TypeError, match="pair"):
        unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), has_aux=True, backend=backend)(X)


def test_has_aux_with_a_detected_pattern():
    """Detection reads the output alone, not the aux (a pair read as outputs would widen the pattern)."""
    result, aux = unigrad.sparse_jacobian(with_aux, has_aux=True)(X)
    assert (result != unigrad.sparse_jacobian(tridiagonal_map)(X)).nnz == 0 and result.nnz == 28
    assert aux["tag"] == "kept"
    hess, (doubled, _) = unigrad.sparse_hessian(rosenbrock_with_aux, has_aux=True)(X)
    assert hess.nnz == 28 and float(doubled) == 2 * float(rosenbrock(X))


def _type_name(value):
    return f"{type(value).__module__}.{type(value).__name__}"


@pytest.mark.parametrize("name, native", [
    ("numpy", "scipy.sparse._csr.csr_array"),
    ("torch", "torch.Tensor"),
    ("jax", "jax.experimental.sparse.bcoo.BCOO"),
    ("tensorflow", "tensorflow.python.framework.sparse_tensor.SparseTensor"),
])
def test_formats(name, native):
    backend = needs(name)
    want = np.asarray(unigrad.to_numpy(unigrad.jacobian(tridiagonal_map, backend=backend)(X)))
    result = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), backend=backend)(X)
    assert _type_name(result) == native
    if backend == "torch":
        import torch

        assert result.layout == torch.sparse_csr
        layouts = {"csc": torch.sparse_csc, "coo": torch.sparse_coo}
        for format, layout in layouts.items():
            other = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), backend=backend, format=format)(X)
            assert other.layout == layout
            np.testing.assert_array_equal(other.to_dense().numpy(), want)
    if backend == "jax":
        bcsr = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), backend="jax", format="csr")(X)
        assert type(bcsr).__name__ == "BCSR"
        import jax

        with jax.enable_x64(True):  # JAX's todense keeps float64 under x64 only
            np.testing.assert_array_equal(np.asarray(bcsr.todense()), want)
    dense = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), backend=backend, format="dense")(X)
    assert unigrad.get_backend(backend).is_array(dense) and unigrad.get_backend(backend).dtype(dense) == "float64"
    np.testing.assert_array_equal(np.asarray(unigrad.to_numpy(dense)), want)
    host = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), backend=backend, format="scipy")(X)
    assert sparse.issparse(host) and host.format == "csr"
    np.testing.assert_array_equal(host.toarray(), want)


@pytest.mark.parametrize("name", ["jax", "tensorflow"])
def test_formats_a_backend_lacks_are_refused(name):
    backend = needs(name)
    with pytest.raises(ValueError, match="format='csc' is not available"):
        unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), backend=backend, format="csc")(X)


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_float32_stays_float32(name):
    backend = needs(name)
    x = X.astype(np.float32)
    result = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), backend=backend, format="dense")(x)
    assert unigrad.get_backend(backend).dtype(result) == "float32"
    check_sparse_jacobian(tridiagonal_map, (x,), sparsity=tridiagonal(10), backend=backend)


@pytest.mark.parametrize("name", ["numpy", "jax"])
def test_pytrees_of_inputs_and_outputs(name):
    backend = needs(name)

    def f(params, scale):
        xp = unigrad.namespace(params["a"])
        return {"first": xp.sin(params["a"]) * scale, "second": params["a"][:2] * params["b"][0] ** 2}

    params = {"a": np.array([0.3, -0.7, 1.1]), "b": np.array([[0.5, 2.0]])}
    F_pattern = np.array([[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [1, 0, 0, 1, 0], [0, 1, 0, 0, 1]])
    got = check_sparse_jacobian(f, (params, 1.5), sparsity=F_pattern, backend=backend)
    assert got.shape == (5, 5)


CACHED = pytest.mark.skipif(os.environ.get("UNIGRAD_NO_CACHE") is not None, reason="counts what the caches keep")


@CACHED
def test_plan_is_made_once_per_signature_and_exposed():
    jac = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10))
    first = jac.plan(X)
    jac(X)
    assert jac.plan(X + 1.0) is first  # a new point, the same signature: the same plan
    assert jac.plan(X.astype(np.float32)) is not first
    assert first.pattern.shape == (10, 10) and first.pattern.nnz == 28
    assert first.coloring.colors.shape == (10,) and first.source == "given"
    assert "n_colors=3" in repr(first)


@CACHED
def test_compiled_plan_and_program_reused():
    pytest.importorskip("jax")
    calls = []

    def f(x):
        calls.append(1)
        return tridiagonal_map(x)

    jac = unigrad.sparse_jacobian(f, sparsity=tridiagonal(10), backend="jax", compile=True)
    a = jac(X)
    traced = len(calls)
    b = jac(X + 0.5)
    assert len(calls) == traced  # neither the plan nor the program is derived again
    assert not np.array_equal(np.asarray(a.data), np.asarray(b.data))


def test_auto_mode_takes_fewer_colours():
    def arrow(x):  # output 0 reads every input; output i reads x_i: 2 row colours, n column colours
        xp = unigrad.namespace(x)
        return xp.concat([xp.sum(x ** 2, keepdims=True), xp.sin(x[1:])])

    n = 8
    pattern = np.eye(n, dtype=bool)
    pattern[0] = True
    jac = unigrad.sparse_jacobian(arrow, sparsity=pattern)
    x = np.linspace(0.1, 0.8, n)
    assert (jac.plan(x).mode, jac.plan(x).n_colors) == ("rev", 2)
    check_sparse_jacobian(arrow, (x,), sparsity=pattern)
    check_sparse_jacobian(arrow, (x,), sparsity=pattern.T @ pattern, mode="fwd")  # a wider pattern is fine


def test_chunked_passes():
    check_sparse_jacobian(tridiagonal_map, (X,), sparsity=tridiagonal(10), mode="fwd")
    got = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(10), chunk_size=1, format="dense")(X)
    np.testing.assert_allclose(got, unigrad.jacobian(tridiagonal_map)(X), rtol=1e-14)


def test_empty_pattern():
    got = unigrad.sparse_jacobian(lambda x: x * 0.0, sparsity=sparse.csr_array((3, 3), dtype=bool))(np.ones(3))
    assert got.nnz == 0 and got.shape == (3, 3)


def test_errors():
    jac = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(9))
    with pytest.raises(ValueError, match=r"sparsity has shape \(9, 9\); expected \(10, 10\)"):
        jac(X)
    with pytest.raises(ValueError, match="format must be one of"):
        unigrad.sparse_jacobian(tridiagonal_map, format="lil")
    with pytest.raises(ValueError, match="mode must be one of"):
        unigrad.sparse_jacobian(tridiagonal_map, mode="both")
    with pytest.raises(TypeError, match="sparsity must be None, 'detect' or a matrix"):
        unigrad.sparse_jacobian(tridiagonal_map, sparsity="dense")(X)
    with pytest.raises(ValueError, match="2-D"):
        unigrad.sparse_jacobian(tridiagonal_map, sparsity=np.ones(10))(X)
    with pytest.raises(TypeError, match=r"one scalar \(shape \(\)\) output; got shape \(10,\)"):
        unigrad.sparse_hessian(tridiagonal_map, sparsity=tridiagonal(10))(X)


def test_a_wrong_pattern_is_caught_by_the_checks():
    diagonal = sparse.eye_array(10, dtype=bool)  # misses the off-diagonal non-zeros
    with pytest.raises(AssertionError, match="non-zeros outside the pattern"):
        check_sparsity_covers(tridiagonal_map, (X,), diagonal)
    with pytest.raises(ValueError, match="sparse result fails its check.*too small"):  # (the transform's own check)
        check_sparse_jacobian(tridiagonal_map, (X,), sparsity=diagonal, mode="fwd")
    with pytest.raises(AssertionError, match="non-zeros outside the pattern"):
        check_sparsity_covers(rosenbrock, (X,), diagonal, kind="hessian")
    check_sparsity_covers(tridiagonal_map, (X,), tridiagonal(10))
    check_sparsity_covers(rosenbrock, (X,), tridiagonal(10), kind="hessian")


def test_check_sparsity_covers_looks_beyond_the_given_point():
    def f(x):  # at x = 0 the coupling term's derivative vanishes: only other points show it
        xp = unigrad.namespace(x)
        return x + xp.concat([x[1:] ** 2, xp.zeros_like(x[:1])])

    diagonal = sparse.eye_array(4, dtype=bool)
    check_sparsity_covers(f, (np.zeros(4),), diagonal, points=0)
    with pytest.raises(AssertionError, match="at random point"):
        check_sparsity_covers(f, (np.zeros(4),), diagonal, points=2)


@st.composite
def sparse_programs(draw):
    n, m, k = draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    return n, rng.integers(0, n, (m, k)), rng.uniform(0.5, 2.0, (m, k)), rng.uniform(-1.5, 1.5, n)


@given(sparse_programs(), st.sampled_from(["fwd", "rev", "auto"]))
def test_random_sparse_programs(program, mode):
    n, idx, w, x = program
    check_sparse_jacobian(gathered, (x, idx, w), sparsity=gathered_pattern(idx, n), mode=mode)
    check_sparsity_covers(gathered, (x, idx, w), gathered_pattern(idx, n), points=1)


@given(st.data())
def test_random_portable_programs_with_their_dense_pattern(data):
    from unigrad.testing import strategies as ust

    case = data.draw(ust.program_cases(max_inputs=1, max_ops=4, multiple_outputs=False))
    program, inputs = case
    dense = np.asarray(unigrad.jacobian(program)(*inputs))
    if dense.size == 0:  # (a zero-size input or output: nothing to compress; reshape(-1, 0) is ambiguous)
        return
    dense = dense.reshape(-1, inputs[0].size)
    check_sparse_jacobian(program, tuple(inputs), sparsity=dense != 0, mode=data.draw(st.sampled_from(["fwd", "rev"])))


# ------------------------------------------------------------------ with the detected pattern (the default)

@pytest.mark.parametrize("name", BACKENDS)
def test_detected_pattern_on_each_backend(name):
    backend = needs(name)
    jac = unigrad.sparse_jacobian(tridiagonal_map, backend=backend)
    plan = jac.plan(X)
    assert (plan.source, plan.reasons, plan.n_colors, plan.nnz) == ("detected", (), 3, 28)
    check_sparse_jacobian(tridiagonal_map, (X,), backend=backend)
    hess = unigrad.sparse_hessian(rosenbrock, backend=backend)
    assert (hess.plan(X).n_colors, hess.plan(X).mode) == (3, "star")
    check_sparse_hessian(rosenbrock, (X,), backend=backend)


def test_value_dependent_control_flow_widens_and_stays_right():
    def f(x):
        xp = unigrad.namespace(x)
        return xp.sin(x) if x[0] > 0 else x ** 3  # Python control flow on a value

    with pytest.warns(unigrad.SparsityWarning):
        plan = unigrad.sparse_jacobian(f).plan(X)
    assert plan.reasons and plan.nnz == 100  # widened to dense: every entry computed
    for point in (X, -X):
        check_sparse_jacobian(f, (point,), sparsity=plan.pattern)


@given(sparse_programs())
def test_random_sparse_programs_detected(program):
    n, idx, w, x = program
    plan = check_sparse_jacobian(gathered, (x, idx, w))  # sparsity="detect"
    detected = unigrad.sparse_jacobian(gathered).plan(x, idx, w).pattern
    assert (detected != gathered_pattern(idx, n)).nnz == 0  # exact: the take's indices
    assert plan.shape == (idx.shape[0], n)


@given(st.data())
def test_random_portable_programs_detected(data):
    import warnings

    from unigrad.testing import strategies as ust

    case = data.draw(ust.program_cases(max_inputs=2, max_ops=4))
    program, inputs = case
    argnums = tuple(range(len(inputs)))
    if sum(np.size(x) for x in inputs) == 0:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unigrad.SparsityWarning)
        pattern = unigrad.jacobian_sparsity(program, *inputs, argnums=argnums)
        check_sparsity_covers(program, tuple(inputs), pattern, argnums=argnums, points=2)
        check_sparse_jacobian(program, tuple(inputs), argnums=argnums, mode=data.draw(st.sampled_from(["fwd", "rev"])))


def test_forward_passes_by_reverse_follow_the_backend_flag_not_its_name(monkeypatch):
    """Backend.forward_by_reverse (torch: its forward mode is slow on ordinary code) runs the sparse forward
    passes as transposed VJPs, whatever name the backend is registered under (it was the name 'torch')."""
    pytest.importorskip("torch")
    pytest.importorskip("scipy")
    from unigrad.sparse import _compress
    from unigrad_torch import TorchBackend

    used = []
    real = _compress._by_reverse

    def spy(b, *args):
        result = real(b, *args)
        used.append((b.name, result[0] is not None))
        return result

    monkeypatch.setattr(_compress, "_by_reverse", spy)
    unigrad.register_backend("torch_again", TorchBackend)
    try:
        def f(x):
            xp = unigrad.namespace(x)
            return xp.sin(x[1:]) * x[:-1]

        x = np.linspace(0.1, 1.0, 6)
        for name in ("torch", "torch_again"):
            got = unigrad.to_numpy(unigrad.sparse_jacobian(f, mode="fwd", backend=name, format="dense")(x))
            np.testing.assert_allclose(got, unigrad.jacobian(f)(x), rtol=1e-12)
        assert ("torch", True) in used and ("torch_again", True) in used, used
        used.clear()
        unigrad.sparse_jacobian(f, mode="fwd", backend="numpy", format="dense")(x)
        assert all(not by_reverse for _, by_reverse in used), used  # (the tape: its own forward mode)
    finally:
        unigrad.unregister_backend("torch_again")


# ------------------------------------------- the sparse result checks itself (issue 36: no analysis trusted alone)

@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("mode", ["fwd", "rev"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pattern_that_misses_non_zeros_is_refused(backend, mode, compile, monkeypatch):
    """A detected pattern an analysis got wrong (here: detection made to answer the diagonal) and a given
    pattern that is too small: one JVP (VJP) against the sparse result refuses both, every call."""
    needs(backend)
    from unigrad.sparse import _pattern

    x = np.linspace(0.1, 0.9, 6)
    diagonal = sparse.eye_array(6, dtype=bool).tocsr()
    given = unigrad.sparse_jacobian(tridiagonal_map, sparsity=diagonal, mode=mode, backend=backend, compile=compile)
    for _ in range(2):
        with pytest.raises(ValueError, match="fails its check.*too small"):
            given(x)
    monkeypatch.setattr(_pattern, "detect", lambda *a, **k: diagonal)
    detected = unigrad.sparse_jacobian(tridiagonal_map, mode=mode, backend=backend, compile=compile)
    with pytest.raises(ValueError, match="fails its check.*detected pattern is wrong"):
        detected(x)
    right = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(6), mode=mode, backend=backend,
                                    compile=compile, format="dense")
    for _ in range(2):  # no false alarm, the repeat included
        np.testing.assert_allclose(unigrad.to_numpy(right(x)),
                                   unigrad.to_numpy(unigrad.jacobian(tridiagonal_map)(x)), atol=1e-12)


@unigrad.custom_jvp
def _scaled(x):
    return 2.0 * x


@_scaled.defjvp
def _scaled_jvp(primals, tangents):
    return _scaled(primals[0]), 2.0 * tangents[0]


def test_a_pattern_proved_over_the_running_program_is_not_checked(backend):
    """A detected pattern that the backend's own program (a jaxpr, an ATen or TensorFlow graph, traced on
    shapes alone) proves needs no check of its values; the NumPy tape's (whose program follows Python
    control flow on values, call by call), a given pattern, and one met through a custom rule (whose
    derivative its program does not show) are checked on every call. The answers are right either way."""
    needs(backend)
    from unigrad.backend import Backend

    b = unigrad.get_backend(backend)
    reads_program = type(b).dependence_program is not Backend.dependence_program
    x = np.linspace(0.1, 0.9, 6)
    want = unigrad.to_numpy(unigrad.jacobian(tridiagonal_map)(x))
    detected = unigrad.sparse_jacobian(tridiagonal_map, backend=backend, format="dense")
    np.testing.assert_allclose(unigrad.to_numpy(detected(x)), want, rtol=1e-5, atol=1e-6)
    assert detected.plan(x).checked == (not reads_program or backend == "numpy")
    given = unigrad.sparse_jacobian(tridiagonal_map, sparsity=tridiagonal(6), backend=backend)
    assert given.plan(x).checked
    custom = unigrad.sparse_jacobian(lambda x: _scaled(tridiagonal_map(x)), backend=backend, format="dense")
    np.testing.assert_allclose(unigrad.to_numpy(custom(x)), 2.0 * want, rtol=1e-5, atol=1e-6)
    assert custom.plan(x).checked
    hessian = unigrad.sparse_hessian(rosenbrock, backend=backend)
    assert hessian.plan(x).checked == (not reads_program or backend == "numpy")


def test_a_hessian_pattern_that_misses_non_zeros_is_refused():
    x = np.linspace(0.1, 0.9, 6)
    with pytest.raises(ValueError, match="fails its check"):
        unigrad.sparse_hessian(rosenbrock, sparsity=sparse.eye_array(6, dtype=bool).tocsr())(x)
    np.testing.assert_allclose(unigrad.sparse_hessian(rosenbrock, sparsity=tridiagonal(6), format="dense")(x),
                               unigrad.hessian(rosenbrock)(x), atol=1e-9)
