"""Gaps found running HIPS autograd's own test suite on the tape (issue 22 §4), each pinned here: lists of
traced values as arrays, NumPy's ``r_``/``c_``, ``eig``'s derivative on gauge-invariant functions of the
eigenvectors (real, complex, batched, as autograd's tests check it), and the integer-input dtype rule."""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from unigrad.testing import check_grads
from unigrad.tape import _namespace as xp

RNG = np.random.default_rng(11)


def test_nested_lists_of_traced_values_are_arrays():
    """asarray([[x, 1.0], [2.0, x]]) stacked only one level before (the nested list went to np.array, which
    refused the traced values); statistics of a list of traced values (autograd's np.mean([x, x + 2]))."""
    g = unigrad.grad(lambda x: xp.sum(xp.asarray([[x, 1.0], [2.0, 3.0 * x]]) ** 2), backend="numpy")(1.0)
    assert float(g) == pytest.approx(2 * 1.0 + 2 * 9.0)
    g = unigrad.grad(lambda x: xp.mean([x, x + 2]) + xp.std((x, x + 2)), backend="numpy")(0.0)
    assert float(g) == pytest.approx(1.0)
    check_grads(lambda x: xp.asarray([[x[0], x[1] * x[0]], [1.0, xp.sin(x[1])]]), (RNG.standard_normal(2),))


@pytest.mark.parametrize("case", ["r_one", "r_mixed", "r_slices", "r_scalar", "c_vectors", "c_matrices"])
def test_r_and_c_follow_numpy_with_derivatives(case):
    x, c = RNG.standard_normal((3, 2)), RNG.standard_normal((3, 2))
    v, w = RNG.standard_normal(10), RNG.standard_normal(10)
    arg, fn = {
        "r_one": (x, lambda ns, a: ns.r_[a]),
        "r_mixed": (x, lambda ns, a: ns.r_[a, c, a]),
        "r_slices": (v, lambda ns, a: ns.r_[a, w, 1:10, 0:1:4j]),
        "r_scalar": (v, lambda ns, a: ns.r_[3.0, a]),
        "c_vectors": (v, lambda ns, a: ns.c_[a, w, 1:11]),
        "c_matrices": (x, lambda ns, a: ns.c_[a, c]),
    }[case]
    traced = unigrad.jvp(lambda a: fn(xp, a), (arg,), (np.zeros_like(arg),), backend="numpy")[0]
    np.testing.assert_allclose(traced, fn(np, arg))
    check_grads(lambda a: fn(xp, a), (arg,))


def test_r_refuses_string_directives():
    with pytest.raises(TypeError, match="r_.*directives"):
        unigrad.grad(lambda a: xp.sum(xp.r_["0,2", a, a]), backend="numpy")(np.ones((2, 2)))


# autograd's own eig tests (tests/test_linalg.py there): eigenvectors carry an arbitrary phase, so only
# gauge-invariant functions of them are checked: |w| and |v| (real input), w and |v| (complex, batched).
@pytest.mark.parametrize("case", ["real", "complex", "batched"])
def test_eig_derivatives_on_gauge_invariant_functions(case):
    if case == "real":
        a = RNG.standard_normal((6, 6))
        f = lambda m: tuple((np.abs(np.linalg.eig(m)[0]), np.abs(np.linalg.eig(m)[1])))  # noqa: E731
    else:
        shape = (6, 6) if case == "complex" else (3, 5, 5)
        a = RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)
        f = lambda m: tuple((np.linalg.eig(m)[0], np.abs(np.linalg.eig(m)[1])))  # noqa: E731
    check_grads(f, (a,), order=1)
    w, v = unigrad.jvp(lambda m: tuple(np.linalg.eig(m)), (a,), (np.zeros_like(a),), backend="numpy")[0]
    np.testing.assert_allclose(np.abs(w), np.abs(np.linalg.eigvals(a)))  # same eigenvalues, NumPy's order


def _nonhermitian(shape, complex_):
    a = RNG.standard_normal(shape) + (1j * RNG.standard_normal(shape) if complex_ else 0)
    return a + 4 * np.eye(shape[-1])


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("shape", [(6, 6), (2, 3, 5, 5)])
def test_numpys_upper_triangle_gives_numpys_values(complex_, shape):
    """np.linalg.eigh(a, "U") on a traced a: its eigenvectors were another LAPACK reduction's (signs
    flipped: autograd's test_eigvalh_upper failed its finite-difference check), and for complex a the
    upper triangle was read unconjugated (conj(A): eigenvectors and cholesky(upper=True) wrong)."""
    a = _nonhermitian(shape, complex_)

    def traced(f):
        return unigrad.jvp(f, (a,), (np.zeros_like(a),), backend="numpy")[0]

    for f in (lambda m: np.linalg.eigh(m, "U")[1], lambda m: np.linalg.eigh(m, UPLO="L")[1],
              lambda m: np.linalg.eigvalsh(m, "U")):
        np.testing.assert_allclose(traced(f), f(a), atol=1e-12)
    spd = np.einsum("...ij,...kj->...ik", a, a.conj()) + shape[-1] * np.eye(shape[-1])
    spd = spd + np.tril(RNG.standard_normal(shape), -1)  # the lower triangle (unread) is not the upper's mirror
    up = lambda m: np.linalg.cholesky(m, upper=True)  # noqa: E731
    np.testing.assert_allclose(unigrad.jvp(up, (spd,), (np.zeros_like(spd),), backend="numpy")[0], up(spd),
                               atol=1e-12)
    if not complex_:  # real eigenvectors: NumPy's signs, so the derivative matches finite differences
        check_grads(lambda m: np.linalg.eigh(m, "U")[1], (a,), order=1)
    check_grads(up, (spd,), order=1)


@pytest.mark.parametrize("x", [np.array([1, 2]), np.array([1, 2], dtype=np.int8), 3, np.array([True, False]),
                               np.array([1.0, 2.0], dtype=np.longdouble)])
def test_integer_and_platform_dtype_inputs_are_refused_where_autograd_differs(x):
    """HIPS autograd differentiates an integer ndarray (grad of sum(2.5 * x) at array([1, 2]) is a float64
    array [2.5, 2.5]; only a Python int is refused) and NumPy's longdouble (its test_dtypes). unigrad's
    rule (DESIGN): a gradient has its input's dtype, and an integer, bool or platform-dependent input
    cannot hold one, so differentiating it is a TypeError naming the argument and the dtype; cast
    first (the gradient at the cast input is autograd's value)."""
    f = lambda v: xp.sum(v * 2.5)  # noqa: E731
    with pytest.raises(TypeError, match=r"argument 0 has dtype .*(int|bool|float128|longdouble)"):
        unigrad.grad(f, backend="numpy")(x)
    g = unigrad.grad(f, backend="numpy")(np.asarray(x, dtype=np.float64))
    assert g.dtype == np.float64
    np.testing.assert_array_equal(g, np.full(np.shape(x), 2.5))
