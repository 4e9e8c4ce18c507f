"""The MLX plugin (plugins/unigrad_mlx) beyond the conformance suite: the dependence hook it implements
(MLX-native code gets row proofs and sparsity patterns from its own program), and the MLX defects it
works around, each of which gave a wrong number or killed the process before."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import skip_module_unless

mx = skip_module_unless("mlx.core")
import unigrad  # noqa: E402
from unigrad.dependence import prove_rows  # noqa: E402

try:
    MLX = unigrad.get_backend("mlx")
except (ValueError, ImportError):  # mlx installed, the plugin not
    pytest.skip("the unigrad_mlx plugin is not installed (pip install -e plugins/unigrad_mlx)",
                allow_module_level=True)

RNG = np.random.default_rng(7)
X = mx.array(RNG.normal(size=(5, 3)).astype(np.float32))
W = mx.array(RNG.normal(size=(3, 4)).astype(np.float32))

# MLX-native functions (mlx.core, not the portable namespace): only MLX's own program can be read
ROWWISE = {
    "mlp": lambda x: mx.tanh(x @ W) * 2.0,
    "softmax": lambda x: mx.softmax(x, axis=-1),
    "row sums": lambda x: mx.sum(x ** 2, axis=1),
    "columns at known indices": lambda x: x[:, mx.array([2, 0])] + mx.logsumexp(x, axis=1, keepdims=True),
    "scan along the row": lambda x: mx.cumsum(x, axis=1) * x,
    "concat, reshape, transpose": lambda x: mx.concatenate([x, x * x], axis=1).reshape(5, 2, 3).transpose(0, 2, 1),
    "addmm": lambda x: mx.addmm(mx.ones((5, 4)), x, W),
    "pad": lambda x: mx.pad(x, [(0, 0), (1, 2)]),
}
MIXING = {
    "centring": lambda x: x - mx.mean(x, axis=0),
    "rows at known indices": lambda x: mx.take(x, mx.array([1, 0, 2, 4, 3]), axis=0),
    "scan over the batch": lambda x: mx.cumsum(x, axis=0),
    "flip of the batch": lambda x: x[::-1],
}


def _np(a):
    return MLX.to_numpy(a)


@pytest.mark.parametrize("name", sorted(ROWWISE))
def test_the_program_proves_rows_of_mlx_native_code(name):
    program = MLX.dependence_program(lambda x: (ROWWISE[name](x),), (X,))
    assert program is not None and program.nodes and all(n.name.startswith("mlx.") for n in program.nodes)
    assert prove_rows(program, 5)[0] == "row"


@pytest.mark.parametrize("name", sorted(MIXING))
def test_the_program_finds_rows_that_mix(name):
    verdict, detail = prove_rows(MLX.dependence_program(lambda x: (MIXING[name](x),), (X,)), 5)
    assert verdict == "mixed", (verdict, detail)


def test_batched_jacobian_reads_the_program_and_is_right():
    calls = []
    original = type(MLX).dependence_program

    def spy(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    type(MLX).dependence_program = spy
    try:
        f = ROWWISE["mlp"]
        got = _np(unigrad.batched_jacobian(f, backend="mlx")(X))
        with pytest.raises(ValueError, match="row"):  # proved mixed: refused, never per-example blocks
            unigrad.batched_jacobian(MIXING["centring"], backend="mlx")(X)
    finally:
        type(MLX).dependence_program = original
    assert calls, "batched_jacobian of MLX-native f did not read MLX's program"
    full = _np(unigrad.jacobian(f, backend="mlx")(X))  # (5, 4, 5, 3)
    expected = np.stack([full[i, :, i, :] for i in range(5)])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ROWWISE) + sorted(MIXING))
def test_sparsity_of_mlx_native_code_from_its_program(name):
    f = {**ROWWISE, **MIXING}[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every primitive here has a rule: nothing widened
        pattern = unigrad.jacobian_sparsity(f, X, backend="mlx").toarray()
    dense = _np(unigrad.jacobian(f, backend="mlx")(X)).reshape(pattern.shape)
    truth = dense != 0
    assert np.all(pattern[truth]), "a pattern smaller than the Jacobian: a wrong sparse Jacobian"
    assert pattern.sum() == truth.sum(), "exact for these programs (no value is zero by chance here)"
    sparse = unigrad.sparse_jacobian(f, backend="mlx")(X)
    np.testing.assert_allclose(MLX.sparse_to_numpy(sparse), dense, rtol=1e-6, atol=1e-7)


def test_an_array_argument_is_an_unknown_value_in_the_program():
    # the index array is the call's argument (not differentiated): the proof, kept per signature, must
    # hold for every value of it, so a permutation on a later call is refused, never answered wrongly
    def f(x, index):
        return x[index] * 2.0

    bj = unigrad.batched_jacobian(f, argnums=0, backend="mlx")
    identity, swap = mx.array([0, 1, 2, 3, 4]), mx.array([1, 0, 2, 3, 4])
    for index in (identity, swap):
        try:
            got = _np(bj(X, index))
        except ValueError:
            continue
        full = _np(unigrad.jacobian(f, argnums=0, backend="mlx")(X, index))
        np.testing.assert_allclose(got, np.stack([full[i, :, i, :] for i in range(5)]), rtol=1e-6)
    program = MLX.dependence_program(lambda x: (f(x, swap),), (X,), unknown=(swap,))
    assert prove_rows(program, 5)[0] != "row"
    program = MLX.dependence_program(lambda x: (f(x, identity),), (X,), unknown=(identity,))
    assert prove_rows(program, 5)[0] != "row"  # the identity's values are not read either


def test_two_outputs_that_are_one_array_get_both_cotangents():
    # mx.sum of a 0-d array is that array: MLX 0.32.4's vjp kept one of the two cotangents (1 instead of 11)
    def f(x):
        xp = unigrad.namespace(x)
        s = xp.sum(x)
        return s, xp.sum(s)

    _, vjp_fn = unigrad.vjp(f, mx.array([1.0, 2.0]), backend="mlx")
    np.testing.assert_allclose(_np(vjp_fn((mx.array(1.0), mx.array(10.0)))[0]), [11.0, 11.0])
    _, vjp_fn = unigrad.vjp(lambda x: (x, x), mx.array([1.0, 2.0]), backend="mlx")
    np.testing.assert_allclose(_np(vjp_fn((mx.array([1.0, 1.0]), mx.array([10.0, 10.0])))[0]), [11.0, 11.0])


def test_second_derivatives_of_prod_and_cumulative_prod_with_a_zero():
    x = np.array([0.5, 0.0, -2.0, 1.5], dtype=np.float32)
    for fn in (lambda x: unigrad.namespace(x).prod(x),
               lambda x: unigrad.namespace(x).sum(unigrad.namespace(x).cumulative_prod(x) ** 2)):
        got = _np(unigrad.hessian(fn, backend="mlx")(mx.array(x)))
        expected = np.asarray(unigrad.hessian(fn)(x.astype(np.float64)))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_zero_size_result_is_read_without_evaluating_it():
    empty = mx.zeros((1, 0)) + mx.array(0.5)
    out = MLX.to_numpy(empty)
    assert out.shape == (1, 0) and out.dtype == np.float32


def test_complex_inputs_are_refused_not_answered():
    # MLX's complex VJPs follow no one convention (mx.power's is the conjugate of mx.multiply's), so the
    # plugin declares complex=False, and the core refuses complex inputs for a backend that does (before:
    # jacrev(lambda z: z ** 2) on mlx gave conj(2 z))
    assert not MLX.capabilities.complex
    z = np.array([1 + 1j, 2 - 0.5j], dtype=np.complex64)
    for transform in (unigrad.jacrev, unigrad.jacfwd, unigrad.grad):
        with pytest.raises(TypeError, match=r"argument 0 has dtype complex64.*mlx backend does not differentiate "
                                            r"complex"):
            transform(lambda z: z ** 2 if transform is not unigrad.grad else unigrad.namespace(z).real(z * z)[0],
                      backend="mlx")(z)


def _complex_inside(power):
    def f(x):  # real in, real out, complex in between
        xp = unigrad.namespace(x)
        z = x * (1 + 2j)
        return xp.sum(xp.real(power(xp, z, 2.0)) + xp.imag(power(xp, z, 3.0)) + xp.real(power(xp, 1.5 + 0.5j, z)))
    return f


def test_a_complex_power_inside_f_has_the_right_gradient_to_second_order():
    # MLX 0.32's VJP of a complex power is the conjugate of its other primitives': the namespace's pow
    # has its own rules (before: grad of real((x (1 + 2j)) ** 2) was 10 x, not -6 x)
    f = _complex_inside(lambda xp, a, b: xp.pow(a, b))
    x = np.array([1.0, 2.0], dtype=np.float32)
    for transform in (unigrad.grad, unigrad.hessian, unigrad.jacfwd):
        np.testing.assert_allclose(_np(transform(f, backend="mlx")(mx.array(x))),
                                   np.asarray(transform(f)(x.astype(np.float64))), rtol=2e-5, atol=1e-5)


@pytest.mark.xfail(strict=True, reason="MLX 0.32's own ** operator on complex mx.array: its VJP is the conjugate "
                                       "of the other primitives' (an MLX defect unigrad cannot reach: use xp.pow)")
def test_the_complex_power_operator_inside_f():
    f = _complex_inside(lambda xp, a, b: a ** b)
    x = np.array([1.0, 2.0], dtype=np.float32)
    np.testing.assert_allclose(_np(unigrad.grad(f, backend="mlx")(mx.array(x))),
                               np.asarray(unigrad.grad(f)(x.astype(np.float64))), rtol=2e-5, atol=1e-5)
