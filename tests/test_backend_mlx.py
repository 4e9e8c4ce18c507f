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


# Ties everywhere: along every axis and over several axes at once (dyadic values: exact in float32)
TIES = np.array([[[1.0, 2.0, 2.0], [2.0, 0.5, 2.0]], [[-1.0, -1.0, 3.0], [3.0, -1.0, 0.25]]])


def _reductions_at_ties(x):
    xp = unigrad.namespace(x)
    parts = [xp.max(x, axis=(0, 2), keepdims=True) * x, xp.min(x, axis=1) ** 2, xp.max(x * x),
             xp.min(x, axis=(-2, -1)), xp.max(x, axis=0), xp.linalg.vector_norm(x, axis=-1, ord=float("inf")),
             xp.linalg.vector_norm(x, axis=1, ord=-float("inf")), xp.linalg.matrix_norm(x, ord=1),
             xp.linalg.matrix_norm(x, ord=-float("inf"))]
    return xp.concat([xp.reshape(p, (-1,)) for p in parts])


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_max_and_min_split_a_tie_in_forward_mode_as_in_reverse(compile):
    # docs/conventions.md: max([1, 1, 0]) has derivative [.5, .5, 0] in both modes; MLX's own JVP of a
    # max / min reduction gave all of it to one element ([1, 0, 0]) while its VJP split
    def f(x):
        return unigrad.namespace(x).max(x)

    x = np.array([2.0, 2.0, 0.5], np.float32)
    for transform in (unigrad.jacfwd, unigrad.jacrev, unigrad.grad):
        assert _np(transform(f, backend="mlx", compile=compile)(x)).tolist() == [0.5, 0.5, 0.0]
    _, t = unigrad.jvp(f, (x,), (np.array([1.0, 3.0, 5.0], np.float32),), backend="mlx")
    assert float(_np(t)) == 2.0  # (1 + 3) / 2
    for transform in (unigrad.jacfwd, unigrad.jacrev):
        want = np.asarray(transform(_reductions_at_ties, backend="numpy")(TIES))
        got = _np(transform(_reductions_at_ties, backend="mlx", compile=compile)(TIES.astype(np.float32)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=transform.__name__)


def test_max_and_min_ties_to_second_order_and_batched():
    def g(x):
        xp = unigrad.namespace(x)
        y = _reductions_at_ties(x)
        return xp.sum(y * xp.sin(y))

    x32 = TIES.astype(np.float32)
    want = np.asarray(unigrad.hessian(g, backend="numpy")(TIES))
    for outer, inner in ((unigrad.jacfwd, unigrad.jacfwd), (unigrad.jacfwd, unigrad.jacrev),
                         (unigrad.jacrev, unigrad.jacfwd)):
        got = _np(outer(inner(g), backend="mlx")(x32))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{outer.__name__}({inner.__name__})")

    def rows(x):  # row-wise: per-example blocks, ties in rows 0, 2 and 3
        return unigrad.namespace(x).max(x, axis=-1) * x[..., 0]

    b = TIES.reshape(4, 3)
    for mode in ("fwd", "rev"):
        np.testing.assert_array_equal(_np(unigrad.batched_jacobian(rows, mode=mode, backend="mlx")(b.astype(np.float32))),
                                      unigrad.batched_jacobian(rows, mode=mode, backend="numpy")(b))


def test_max_and_min_values_are_mlxs_own_bit_for_bit():
    # the tie rule adds a term that is +0 in value: -0.0, infinities and NaN come out as MLX's reduction has them
    xp = unigrad.namespace(mx.array(0.0))
    for a in ([-0.0, -0.0], [np.inf, 1.0, np.inf], [-np.inf, -np.inf], [np.nan, 1.0], [1 / 3, 1 / 3, 1 / 3, 0.1],
              [3e38, 3e38, -3e38]):
        a = mx.array(np.array(a, np.float32))
        for ours, theirs in ((xp.max, mx.max), (xp.min, mx.min)):
            got, want = np.asarray(ours(a)), np.asarray(theirs(a))
            assert np.array_equal(got, want, equal_nan=True) and np.signbit(got) == np.signbit(want), (a, got, want)
    grad = unigrad.grad(lambda x: unigrad.namespace(x).max(x), backend="mlx")
    fwd = unigrad.jacfwd(lambda x: unigrad.namespace(x).max(x), backend="mlx")
    for transform in (grad, fwd):  # a tie at infinity splits too (no NaN), and a zero derivative is +0
        got = _np(transform(np.array([np.inf, np.inf, 0.5], np.float32)))
        assert got.tolist() == [0.5, 0.5, 0.0] and not np.signbit(got).any()


def _indexed_by_own_order(x):
    xp = unigrad.namespace(x)
    first = xp.take(x[0], xp.argsort(x[0])) * x[0]
    rows = xp.take_along_axis(x, xp.argsort(x, axis=1, descending=True), axis=1) * x
    item = x[1][xp.argmax(x[1])] * x[1] + x[2][xp.argmin(x[2])]
    by_value = xp.take(x[2], xp.astype(xp.where(x[2] > 0, 1, 0), xp.int32)) * x[2]  # an astype, a where of ints
    counted = x[0][xp.sum(x[1] > 0)] * x[2]  # a sum of comparisons
    return xp.concat([first, xp.reshape(rows, (-1,)), item, by_value, counted])


def test_indices_computed_from_x_carry_no_derivative():
    # MLX's gather refused to differentiate through indices computed from x in either mode ("[gather]
    # Cannot calculate VJP with respect to indices"); every other backend returns the Jacobian
    x = np.array([[0.3, -1.0, 2.0, 0.5], [1.5, -0.25, 0.75, 1.0], [-2.0, 0.5, 1.25, -0.5]])
    for transform in (unigrad.jacfwd, unigrad.jacrev):
        want = np.asarray(transform(_indexed_by_own_order, backend="numpy")(x))
        for compile in (False, True):
            got = _np(transform(_indexed_by_own_order, backend="mlx", compile=compile)(x.astype(np.float32)))
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{transform.__name__} {compile}")
    np.testing.assert_allclose(_np(_indexed_by_own_order(mx.array(x.astype(np.float32)))),
                               _indexed_by_own_order(x), rtol=1e-6)

    def native_index(x):  # indices from MLX's own operators, handed to the namespace's take
        return unigrad.namespace(x).take(x, (x > 0).astype(mx.int32)) * x

    v = np.array([0.3, -1.0, 2.0], np.float32)  # indices [1, 0, 1]: sum = 2 x0 x1 + x1 x2
    for transform in (unigrad.grad, unigrad.jacfwd):
        got = _np(transform(lambda x: unigrad.namespace(x).sum(native_index(x)), backend="mlx")(v))
        np.testing.assert_allclose(got, [2 * v[1], 2 * v[0] + v[2], v[1]], rtol=1e-6)


def test_indices_made_by_mlxs_own_operators_get_an_error_that_says_what_to_write():
    # x[i] with i from MLX's own operators is MLX's gather, out of the namespace's reach: a clear error
    def f(x):
        return x[mx.argsort(x)] * x

    x = np.array([0.3, -1.0, 2.0], np.float32)
    for transform in (unigrad.jacrev, unigrad.jacfwd):
        with pytest.raises(ValueError, match=r"indexes with an integer array computed from a differentiated value.*"
                                             r"xp\.take.*mx\.stop_gradient"):
            transform(f, backend="mlx")(x)
    # what it says to write works
    got = _np(unigrad.jacrev(lambda x: x[mx.stop_gradient(mx.argsort(x))] * x, backend="mlx")(x))
    np.testing.assert_allclose(got, unigrad.jacrev(lambda x: x[unigrad.namespace(x).argsort(x)] * x,
                                                   backend="numpy")(x.astype(np.float64)), rtol=1e-6)


def test_an_operation_without_a_jvp_rule_gets_an_error_that_names_reverse_mode():
    # forward over reverse of an indexing meets MLX's scatter, which has no JVP rule: a NotImplementedError (a
    # RuntimeError, as MLX's was) naming the operation and reverse mode; mode="auto" falls back to it by itself
    def f(v):
        xp = unigrad.namespace(v)
        return xp.sum(xp.stack([xp.sin(v[0]) * v[1], xp.cos(v[1]), v[0] + v[1]]))

    x = np.array([0.7, 1.1], np.float32)
    with pytest.raises(NotImplementedError, match=r"forward mode cannot differentiate f on MLX .*: MLX has no JVP rule "
                                                  r"for scatter.*hessian\(mode='rev-rev'\), or mode='auto'"):
        unigrad.hessian(f, backend="mlx")(x)
    want = unigrad.hessian(f, backend="numpy")(x.astype(np.float64))
    for mode in ("auto", "rev-rev"):
        np.testing.assert_allclose(_np(unigrad.hessian(f, backend="mlx", mode=mode)(x)), want, rtol=1e-5, atol=1e-6)


def _cube_by_jvp():
    @unigrad.custom_jvp
    def cube(x):
        return x * x * x

    @cube.defjvp
    def cube_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return cube(x), 3.0 * x * x * t
    return cube


def _cube_by_vjp():
    @unigrad.custom_vjp
    def cube(x):
        return x * x * x

    cube.defvjp(lambda x: (x * x * x, (x,)), lambda res, g: (3.0 * res[0] * res[0] * g,))
    return cube


@pytest.mark.parametrize("rule", ["custom_jvp", "custom_vjp"])
def test_custom_rules_third_derivatives(rule):
    # Every nesting of three modes over a custom rule, against the tape. The plugin transposes a rule's missing
    # mode with a nested mx.vjp; while that vjp closed over the rule's primals (or residuals), reverse over
    # reverse over a custom_jvp rule gave 0 at third order, silently (_rules._transposed)
    cube = _cube_by_jvp() if rule == "custom_jvp" else _cube_by_vjp()

    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(cube(x) * xp.cos(x))

    x = np.array([0.7, -1.3], np.float32)
    want = unigrad.jacfwd(unigrad.jacfwd(unigrad.jacfwd(f, backend="numpy"), backend="numpy"),
                          backend="numpy")(x.astype(np.float64))
    for modes in [(a, b, c) for a in ("fwd", "rev") for b in ("fwd", "rev") for c in ("fwd", "rev")]:
        g = f
        for m in reversed(modes):
            g = (unigrad.jacfwd if m == "fwd" else unigrad.jacrev)(g, backend="mlx")
        np.testing.assert_allclose(_np(g(x)), want, rtol=1e-5, atol=1e-5, err_msg=str(modes))
    grad3 = unigrad.grad(lambda x: unigrad.grad(lambda x: unigrad.grad(f, backend="mlx")(x)[0], backend="mlx")(x)[1],
                         backend="mlx")(x)
    np.testing.assert_allclose(_np(grad3), want[1, 0], rtol=1e-5, atol=1e-5)


def test_a_cast_to_integers_carries_no_derivative():
    # MLX's astype passes the derivative through a cast to int32 and back: grad of int(3 x) * x was
    # int(3 x) + 3 x ([7, 12] at [1.5, 2]); the tape and JAX give int(3 x) ([4, 6])
    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.astype(xp.astype(x * 3, "int32"), "float32") * x)

    x = np.array([1.5, 2.0], np.float32)
    want = unigrad.grad(f, backend="numpy")(x.astype(np.float64))
    np.testing.assert_array_equal(want, [4.0, 6.0])
    for transform in (unigrad.grad, unigrad.jacfwd):
        np.testing.assert_array_equal(_np(transform(f, backend="mlx")(x)), want)
