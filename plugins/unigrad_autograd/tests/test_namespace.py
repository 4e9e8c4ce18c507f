"""The plugin's own namespace functions, where autograd's rules were missing or wrong: each is
checked against unigrad's NumPy tape, both modes, at the shapes that broke (zero size, 0-d).

Run: ``pytest plugins/unigrad_autograd/tests`` (the conformance suite checks the rest)."""

from __future__ import annotations

import numpy as np
import pytest

import unigrad

pytest.importorskip("autograd")


def _both_modes_agree_with_the_tape(f, *primals):
    outs = {}
    for backend in ("numpy", "autograd"):
        out, pullback = unigrad.vjp(f, *primals, backend=backend)
        cot = np.linspace(0.5, 1.5, np.size(out)).reshape(np.shape(out))
        tangents = tuple(np.linspace(-1.0, 2.0, np.size(p)).reshape(np.shape(p)) for p in primals)
        _, tangent_out = unigrad.jvp(f, primals, tangents, backend=backend)
        outs[backend] = (np.asarray(out), [np.asarray(g) for g in pullback(cot)], np.asarray(tangent_out))
    ref, got = outs["numpy"], outs["autograd"]
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-13)
    assert got[0].shape == ref[0].shape and got[2].shape == ref[2].shape
    for g, r, p in zip(got[1], ref[1], primals):
        assert g.shape == np.shape(p) == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-13, atol=1e-15)


def test_where_and_broadcast_to_undo_broadcasting_to_zero_size():
    # autograd's broadcast_to rule kept the empty axis: "cannot reshape array of size 0 into shape ()"
    xp = unigrad.namespace
    _both_modes_agree_with_the_tape(lambda c, a, b: xp(a).where(c > 0.0, a, b),
                                    np.ones((0, 2)), np.array(2.0), np.ones((1, 2)))
    _both_modes_agree_with_the_tape(lambda a: xp(a).broadcast_to(a, (0, 3)) * 2.0, np.ones((1, 3)))


def test_astype_flip_clip_var_sort_have_both_modes():
    xp = unigrad.namespace
    x = np.array([[0.3, -1.2, 0.7], [2.0, 0.1, -0.4]])
    _both_modes_agree_with_the_tape(lambda a: xp(a).astype(a * a, xp(a).float32) * 2.0, x)
    _both_modes_agree_with_the_tape(lambda a: xp(a).flip(a, axis=1) * x, x)
    _both_modes_agree_with_the_tape(lambda a: xp(a).clip(a, min=-0.9, max=0.9), x)
    _both_modes_agree_with_the_tape(lambda a: xp(a).var(a[None], axis=(0, 2), correction=1.0), x)
    _both_modes_agree_with_the_tape(lambda a: xp(a).sort(a, axis=0, descending=True) * x, x)


def test_clip_with_array_bounds_sends_each_derivative_where_its_value_came_from():
    xp = unigrad.namespace
    x, lo = np.array([0.5, -2.0, 3.0]), np.array([0.0, -1.0, 0.0])
    g = unigrad.grad(lambda a, m: xp(a).sum(xp(a).clip(a, min=m, max=2.0) * np.array([1.0, 2.0, 3.0])),
                     argnums=(0, 1), backend="autograd")(x, lo)
    np.testing.assert_array_equal(g[0], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(g[1], [0.0, 2.0, 0.0])


def test_sort_descending_is_stable():
    xp = unigrad.get_backend("autograd").namespace()
    x = np.array([1.0, 2.0, 2.0, 0.0, 2.0])
    np.testing.assert_array_equal(xp.sort(x, descending=True), [2.0, 2.0, 2.0, 1.0, 0.0])
    # the gradient of the first output goes to the first of the tied maxima
    g = unigrad.grad(lambda a: xp.sort(a, descending=True)[0], backend="autograd")(x)
    np.testing.assert_array_equal(g, [0.0, 1.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("offset", [-3, -1, 0, 1, 2, 4, 5])
def test_linalg_diagonal_matches_numpy_at_every_offset(offset):
    linalg = unigrad.get_backend("autograd").namespace().linalg
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(linalg.diagonal(x, offset=offset), np.diagonal(x, offset, -2, -1))


@pytest.mark.parametrize("ord_, axis, keepdims", [(2, None, False), (1, 1, False), (np.inf, (0, 2), True),
                                                   (-np.inf, 0, False), (3, -1, True), (0, None, False)])
def test_linalg_vector_norm_matches_numpy(ord_, axis, keepdims):
    linalg = unigrad.get_backend("autograd").namespace().linalg
    x = np.array([[[3.0, -4.0, 0.0], [1.0, 2.0, -2.0]]])
    a = np.abs(x)
    want = {2: lambda: np.sqrt(np.sum(a * a, axis=axis, keepdims=keepdims)),
            1: lambda: np.sum(a, axis=axis, keepdims=keepdims),
            np.inf: lambda: np.max(a, axis=axis, keepdims=keepdims),
            -np.inf: lambda: np.min(a, axis=axis, keepdims=keepdims),
            3: lambda: np.sum(a ** 3, axis=axis, keepdims=keepdims) ** (1 / 3),
            0: lambda: np.sum(x != 0, axis=axis, keepdims=keepdims).astype(float)}[ord_]()
    got = linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord_)
    assert np.shape(got) == np.shape(want) and np.result_type(got) == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-14)


def test_linalg_matrix_power():
    linalg = unigrad.get_backend("autograd").namespace().linalg
    x = np.array([[[1.0, 2.0], [0.5, -1.0]]] * 2)
    np.testing.assert_allclose(linalg.matrix_power(x, 3), np.linalg.matrix_power(x, 3), rtol=1e-14)
    np.testing.assert_array_equal(linalg.matrix_power(x, 0), np.broadcast_to(np.eye(2), x.shape))
    with pytest.raises(ValueError, match="n must be >= 0"):
        linalg.matrix_power(x, -1)


@pytest.mark.parametrize("name, f", [
    # autograd's rule for tile aligns repetitions with the leading axes; NumPy's tile the trailing ones
    ("tile_short_reps", lambda xp, a: xp.tile(a, (2,)) * 1.0),
    ("tile_long_reps", lambda xp, a: xp.tile(a, (2, 1, 2)) * 1.0),
    ("roll_tuple", lambda xp, a: xp.roll(a, (1, -2), axis=(0, 1)) * 1.0),
    ("roll_flat", lambda xp, a: xp.roll(a, 4) * 1.0),
    ("repeat_array", lambda xp, a: xp.repeat(a, xp.asarray([2, 0, 1]), axis=1) * 1.0),
    ("repeat_flat", lambda xp, a: xp.repeat(a, 2) * 1.0),
    ("cumulative_prod_zero", lambda xp, a: xp.cumulative_prod(a * xp.asarray([1.0, 0.0, 1.0]), axis=1,
                                                             include_initial=True)),
    ("cumulative_sum_initial", lambda xp, a: xp.cumulative_sum(a, axis=0, include_initial=True)),
    ("diff_prepend", lambda xp, a: xp.diff(a, axis=1, n=2, prepend=a[:, :1] * 3.0)),
    ("copysign", lambda xp, a: xp.copysign(a, xp.asarray([-1.0, 2.0, -0.0]))),
    ("hypot_broadcast", lambda xp, a: xp.hypot(a, a[:1] * 0.5)),
    ("unstack", lambda xp, a: xp.unstack(a, axis=1)[2] * 1.0),
    ("moveaxis_tril", lambda xp, a: xp.tril(xp.moveaxis(a[None], 0, -1)[..., 0], k=1) * 1.0),
])
def test_manipulation_and_statistics_match_the_tape(name, f):
    x = np.array([[0.3, -1.2, 0.7], [2.0, 0.1, -0.4]])
    _both_modes_agree_with_the_tape(lambda a: f(unigrad.namespace(a), a), x)


_A = np.array([[2.0, 0.3, -0.4], [0.1, 1.5, 0.2], [-0.3, 0.4, 1.8]])


@pytest.mark.parametrize("name, f", [
    ("inv", lambda xp, a: xp.linalg.inv(a)),
    ("det", lambda xp, a: xp.linalg.det(a)),
    ("slogdet", lambda xp, a: xp.linalg.slogdet(-a)[1]),
    ("solve_vector", lambda xp, a: xp.linalg.solve(a, a[0] * 2.0)),
    ("solve_broadcast", lambda xp, a: xp.linalg.solve(a, xp.stack([a, a * 2.0]))),
    ("cholesky_upper", lambda xp, a: xp.linalg.cholesky(xp.matmul(a, xp.matrix_transpose(a)), upper=True)),
    ("eigh", lambda xp, a: xp.linalg.eigh(a + xp.matrix_transpose(a))[1] ** 2),
    ("eigvalsh", lambda xp, a: xp.linalg.eigvalsh(a + xp.matrix_transpose(a))),
    ("svd_tall", lambda xp, a: xp.linalg.svd(xp.concat([a, a[:1] * 0.5]), full_matrices=False)[0] ** 2),
    ("svd_wide", lambda xp, a: xp.linalg.svd(a[:2], full_matrices=False)[2] ** 2),
    ("svdvals", lambda xp, a: xp.linalg.svdvals(a[:, :2])),
    ("pinv", lambda xp, a: xp.linalg.pinv(a[:, :2])),
    ("matrix_norm_nuc", lambda xp, a: xp.linalg.matrix_norm(a, ord="nuc", keepdims=True)),
    ("qr_tall", lambda xp, a: xp.linalg.qr(xp.concat([a, a[:1] * 0.5]))[0] ** 2),
    ("qr_square", lambda xp, a: xp.linalg.qr(a)[1] ** 2),
    ("matrix_norm_-inf", lambda xp, a: xp.linalg.matrix_norm(a, ord=-np.inf)),
])
def test_linalg_matches_the_tape_in_both_modes(name, f):
    _both_modes_agree_with_the_tape(lambda a: f(unigrad.namespace(a), a), _A)


def test_linalg_second_order_matches_the_tape():
    def f(a):
        xp = unigrad.namespace(a)
        return xp.sum(xp.linalg.eigvalsh(a + xp.matrix_transpose(a)) ** 3) + xp.linalg.det(a) * xp.sum(
            xp.linalg.inv(a)) + xp.sum(xp.linalg.cholesky(xp.matmul(a, xp.matrix_transpose(a))) ** 2) + xp.sum(
            xp.linalg.svd(a[:2], full_matrices=False)[2] ** 2 * 0.5) + xp.sum(xp.linalg.qr(a)[0] ** 3)
    want = np.asarray(unigrad.hessian(f, backend="numpy")(_A))
    forward_over_reverse = unigrad.hessian(f, backend="autograd")(_A)
    reverse_over_reverse = unigrad.jacrev(unigrad.grad(f, backend="autograd"), backend="autograd")(_A)
    for got in (forward_over_reverse, reverse_over_reverse):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


def test_unigrad_rules_at_non_differentiable_points():
    # docs/conventions.md, "The rules chosen": clip passes the derivative at its bounds, the 2-norm has
    # derivative 0 at 0 (autograd's own clip gives 0 at the bounds; sqrt gives NaN at 0)
    xp = unigrad.get_backend("autograd").namespace()
    for bound in (0.0, 1.0):
        assert unigrad.grad(lambda x: xp.clip(x, min=0.0, max=1.0), backend="autograd")(np.float64(bound)) == 1.0
    assert unigrad.grad(lambda x: xp.clip(x, min=0.0, max=1.0), backend="autograd")(np.float64(1.5)) == 0.0
    np.testing.assert_array_equal(unigrad.grad(xp.linalg.vector_norm, backend="autograd")(np.zeros(2)), [0.0, 0.0])
    np.testing.assert_allclose(unigrad.grad(xp.linalg.vector_norm, backend="autograd")(np.array([3.0, -4.0])),
                               [0.6, -0.8], rtol=1e-15)
    assert xp.clip(np.ones(2, dtype=np.float32), min=0.0, max=0.5).dtype == np.float32


def test_second_order_through_the_plugins_primitives_matches_the_tape():
    # forward over reverse: each rule also runs on the outer trace's boxes
    def f(a):
        xp = unigrad.namespace(a)
        b = xp.astype(a, xp.float32) * 1.0
        return xp.sum(xp.clip(a * a, min=0.1, max=2.0) * xp.flip(a, axis=0) + xp.hypot(a, 1.0) * b
                      + xp.broadcast_to(a[:1], (2, 3)) ** 3)
    want = np.asarray(unigrad.hessian(f, backend="numpy")(_A[:2]))  # through float32: rtol 1e-6
    np.testing.assert_allclose(np.asarray(unigrad.hessian(f, backend="autograd")(_A[:2])), want, rtol=1e-6)
