"""Sparsity patterns and row proofs from the traced program (unigrad.dependence).

Each pattern is checked against the non-zeros of the dense Jacobian (or Hessian) at random points:
sound (every non-zero covered) and, for the exact rule classes, equal. Widening (control flow on
values, value-dependent indices, unknown operations) is checked to say so and to stay sound.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import unigrad
from unigrad import dependence
from unigrad.dependence import _rules

xp = unigrad.namespace


def _dense_pattern(f, x):
    jac = np.asarray(unigrad.jacobian(f)(x))
    return jac.reshape(-1, x.size) != 0


def _pattern(f, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", unigrad.SparsityWarning)  # an exact class must not widen
        p = unigrad.jacobian_sparsity(f, x, **kw)
    assert p.reasons == ()
    return p.toarray()


EXACT = {  # (f, shape): the pattern equals the Jacobian's non-zeros at generic points
    "elementwise": (lambda x: xp(x).sin(x) * x + xp(x).exp(x[::-1]), (5,)),
    "broadcast": (lambda x: x * x[:, :1] + xp(x).broadcast_to(x[0], (3, 2)), (3, 2)),
    "getitem": (lambda x: x[np.array([2, 0, 2])] * 2.0 + x[1:4], (5,)),
    "slices": (lambda x: x[::2, 1:] * x[1::2, :2], (4, 3)),
    "reshape_T": (lambda x: xp(x).reshape(x, (3, 2)).T * 1.0, (2, 3)),
    "concat_stack": (lambda x: xp(x).concat([x, xp(x).stack([x[0], x[2]])], axis=0), (3, 2)),
    "flip_roll": (lambda x: xp(x).flip(x, axis=1) + xp(x).roll(x, 1, axis=0), (3, 3)),
    "tile_repeat": (lambda x: xp(x).tile(x, (2,)) * xp(x).repeat(x, 2), (3,)),
    "take_along": (lambda x: xp(x).take_along_axis(x, np.array([[1, 0], [2, 2]]), axis=1), (2, 3)),
    "sum_prod": (lambda x: xp(x).sum(x, axis=0) * xp(x).prod(x, axis=0), (3, 2)),
    "cumsum": (lambda x: xp(x).cumulative_sum(x, axis=1), (2, 4)),
    "diff": (lambda x: xp(x).diff(x), (6,)),
    "matmul_traced": (lambda x: x @ x, (3, 3)),
    "matmul_batched": (lambda x: xp(x).matmul(x, x[0]), (2, 3, 3)),
    "tensordot": (lambda x: xp(x).tensordot(x, x, axes=1), (3, 3)),
    "vecdot": (lambda x: xp(x).vecdot(x, x), (2, 3)),
    "softmax_rows": (lambda x: xp(x).exp(x) / xp(x).sum(xp(x).exp(x), axis=1, keepdims=True), (2, 3)),
    "linalg_batched": (lambda x: xp(x).linalg.inv(x + 3 * np.eye(2)), (3, 2, 2)),
    "det_batched": (lambda x: xp(x).linalg.det(x + 3 * np.eye(2)), (3, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_pattern_is_exact_for_each_class(name):
    f, shape = EXACT[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.standard_normal(shape)
    np.testing.assert_array_equal(_pattern(f, x), _dense_pattern(f, x))


def test_matmul_with_a_constant_uses_its_zeros():
    n = 6
    a = np.diag(np.full(n, 2.0)) + np.diag(np.ones(n - 1), 1) + np.diag(np.ones(n - 1), -1)
    p = _pattern(lambda u: a @ u, np.ones(n))
    np.testing.assert_array_equal(p, a != 0)
    p = _pattern(lambda u: u @ a, np.ones((2, n)))  # and on the right
    np.testing.assert_array_equal(p, np.kron(np.eye(2), a.T) != 0)


def test_code_level_superset_where_the_point_hides_entries():
    """max, clip, where and abs count every element they may pick, not only those picked here."""
    x = np.array([[3.0, 1.0, 2.0], [0.0, 5.0, -1.0]])
    np.testing.assert_array_equal(_pattern(lambda x: xp(x).max(x, axis=1), x),
                                  [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(_pattern(lambda x: xp(x).clip(x, 0.5, 2.5), x), np.eye(6, dtype=bool))
    # where counts both branches: the Jacobian at positive x has no coupling, the pattern does
    f = lambda x: xp(x).where(xp(x).min(x) > 0, x * x, x - xp(x).mean(x, axis=0))  # noqa: E731
    p = _pattern(f, np.abs(x) + 1)
    assert p.sum() == 6 * 2 and p[0, 3] and not _dense_pattern(f, np.abs(x) + 1)[0, 3]


def test_several_outputs_and_argnums():
    f = lambda x, y, c: (x * y[0], xp(x).sum(y) + c)  # noqa: E731
    p = unigrad.jacobian_sparsity(f, np.ones(2), np.ones(3), 1.0, argnums=(0, 1)).toarray()
    np.testing.assert_array_equal(p, [[1, 0, 1, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    p = unigrad.jacobian_sparsity(f, np.ones(2), np.ones(3), 1.0, argnums=1).toarray()
    assert p.shape == (3, 3)


def test_control_flow_on_values_widens_to_dense_and_says_where():
    def f(x):
        if xp(x).sum(x) > 0:  # a branch on a traced value: another input may take the other path
            return x * 2.0
        return x[::-1]

    with pytest.warns(unigrad.SparsityWarning, match="control flow"):
        p = unigrad.jacobian_sparsity(f, np.ones(3))
    assert p.toarray().all() and "test_dependence.py" in p.reasons[0]


@pytest.mark.parametrize("f", [lambda x: xp(x).sort(x) * 1.0, lambda x: x[xp(x).argmax(x)] * x,
                               lambda x: xp(x).take(x, xp(x).argsort(x)[:1]) + x], ids=["sort", "argmax", "argsort"])
def test_value_dependent_indices_widen(f):
    """sort, argmax, argsort read the values to choose indices: another input would pick others."""
    with pytest.warns(unigrad.SparsityWarning, match="computed from the input"):
        p = unigrad.jacobian_sparsity(f, np.array([3.0, 1.0, 2.0]))
    assert p.toarray().all()


def test_a_program_that_changes_at_another_point_widens():
    """Values read outside the namespace (unigrad.to_numpy) are caught by tracing again at a random
    point nearby: the recorded program differs there."""
    def f(x):
        k = 0 if unigrad.to_numpy(x)[0] == 3.0 else 1  # (a perturbed point takes the other index)
        return x[k] * x

    with pytest.warns(unigrad.SparsityWarning, match="changes with the input"):
        p = unigrad.jacobian_sparsity(f, np.array([3.0, 1.0, 2.0]))
    assert p.toarray().all()


def test_unknown_primitive_widens_its_outputs_only(monkeypatch):
    """An operation without a rule: its outputs depend on everything its inputs depend on; the rest of
    the program stays exact, and the reason names it."""
    monkeypatch.delitem(_rules.TABLE, "sin")
    with pytest.warns(unigrad.SparsityWarning, match="'sin'"):
        p = unigrad.jacobian_sparsity(lambda x: xp(x).concat([xp(x).sin(x[:2]), x[2:] * 2.0]), np.ones(4))
    np.testing.assert_array_equal(p.toarray(), [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])


def test_pattern_for_torch_arguments_is_traced_on_the_tape():
    torch = pytest.importorskip("torch")
    p = unigrad.jacobian_sparsity(lambda x: x[1:] - x[:-1], torch.ones(4, dtype=torch.float64))
    np.testing.assert_array_equal(p.toarray(), np.eye(4)[1:] - np.eye(4)[:-1] != 0)


# ------------------------------------------------------------------------------------- Hessians

def _dense_hessian_pattern(f, x, points=3):
    rng = np.random.default_rng(0)
    pat = np.zeros((x.size, x.size), bool)
    for _ in range(points):
        h = np.asarray(unigrad.hessian(f)(rng.standard_normal(x.shape)))
        pat |= h.reshape(x.size, x.size) != 0
    return pat


HESSIAN = {
    "rosenbrock": lambda x: xp(x).sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2),
    "bilinear": lambda x: xp(x).sum(x[:3] * x[3:]),
    "linear_then_sin": lambda x: xp(x).sum(xp(x).sin(x[::2] + x[1::2])),
    "divide": lambda x: xp(x).sum(x[:2] / x[2:]),
    "quadratic_form": lambda x: x @ (np.diag(np.arange(1.0, 5.0)) @ x),
    "exp_sum": lambda x: xp(x).exp(xp(x).sum(x[:2])) + x[3] * 2.0,
}


@pytest.mark.parametrize("name", sorted(HESSIAN))
def test_hessian_pattern(name):
    f = HESSIAN[name]
    x = np.random.default_rng(1).standard_normal(4 if name != "rosenbrock" else 5) + 2.0
    p = unigrad.hessian_sparsity(f, x).toarray()
    assert (p == p.T).all()
    np.testing.assert_array_equal(p, _dense_hessian_pattern(f, x))


def test_hessian_of_a_linear_function_is_empty():
    p = unigrad.hessian_sparsity(lambda x: xp(x).sum(x * 3.0) + x[0], np.ones(3))
    assert p.nnz == 0 and p.shape == (3, 3)


# ------------------------------------------------------------------------------------- jaxprs

def test_jax_native_function_is_read_from_its_jaxpr():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = np.random.default_rng(2).standard_normal(5)
    f = lambda x: jnp.roll(x, 1) * jnp.sin(x) + jnp.pad(x[1:], (0, 1))  # noqa: E731
    p = unigrad.jacobian_sparsity(f, jnp.asarray(x)).toarray()
    np.testing.assert_array_equal(p, np.asarray(jax.jacobian(f)(jnp.asarray(x))) != 0)
    # lax.cond: every branch counts
    g = lambda x: jax.lax.cond(x[0] > 0, lambda y: y * 2.0, lambda y: jnp.roll(y, 1), x)  # noqa: E731
    p = unigrad.jacobian_sparsity(g, jnp.asarray(np.ones(3))).toarray()
    np.testing.assert_array_equal(p, (np.eye(3) + np.roll(np.eye(3), 1, axis=0)) != 0)
    # dot_general with a constant matrix: its zeros count (a stencil matrix gives its band)
    a = np.diag(np.full(5, 2.0)) + np.diag(np.ones(4), 1)
    for stencil, u in ((lambda u: jnp.asarray(a) @ u, np.ones(5)),
                       (lambda u: jnp.einsum("ij,bj->bi", jnp.asarray(a), u), np.ones((2, 5)))):
        p = unigrad.jacobian_sparsity(stencil, jnp.asarray(u)).toarray()
        np.testing.assert_array_equal(p, np.asarray(jax.jacobian(stencil)(jnp.asarray(u))).reshape(p.shape) != 0)
    h = unigrad.hessian_sparsity(lambda x: jnp.sum(x[1:] * x[:-1]), jnp.asarray(np.ones(3))).toarray()
    np.testing.assert_array_equal(h, [[0, 1, 0], [1, 0, 1], [0, 1, 0]])


# ------------------------------------------------------------------------------------- batch rows

def _rows(f, *args):
    program, _ = dependence.trace_tape(lambda *a: (f(*a),), [np.asarray(a) for a in args], sites=True)
    return dependence.prove_rows(program, args[0].shape[0])


W = np.random.default_rng(3).standard_normal((3, 2))
ROW = {  # rows proved independent
    "elementwise": lambda x: xp(x).tanh(x) * 2.0,
    "matmul_free_weight": lambda x: xp(x).tanh(x @ W),
    "reduce_other_axis": lambda x: x - xp(x).mean(x, axis=1, keepdims=True),
    "reshape_keeps_batch": lambda x: xp(x).sum(xp(x).reshape(x, (x.shape[0], 3, 1)), axis=2),
    "index_other_axis": lambda x: x[:, ::-1] * x[:, :1],
    "where_both_row": lambda x: xp(x).where(x > 0, x, x * x),
    "transpose_twice": lambda x: (x.T * 2.0).T,
    "batch_size_constant": lambda x: x / x.shape[0],
}
MIXED = {  # rows mixed, with the operation named
    "mean_over_batch": (lambda x: x - xp(x).mean(x, axis=0), "sum over the batch axis"),
    "matmul_contracts_batch": (lambda x: x.T @ x @ W, "matmul contracts the batch axis"),
    "cumsum_along_batch": (lambda x: xp(x).cumulative_sum(x, axis=0), "cumsum along the batch axis"),
    "flip_batch": (lambda x: xp(x).flip(x, axis=0), "flip moves or combines rows"),
    # (the merged batch is followed, rows in blocks: the slice is what combines them)
    "reshape_merges_batch": (lambda x: xp(x).reshape(x, (-1,))[:x.shape[0]] * 1.0, "getitem moves or combines"),
    "where_one_branch_mixed": (lambda x: xp(x).where(x > 0, x, x - xp(x).sum(x, axis=0)), "sum over the batch"),
}


@pytest.mark.parametrize("name", sorted(ROW))
def test_row_rules_prove_independent_rows(name):
    assert _rows(ROW[name], np.random.default_rng(4).standard_normal((4, 3))) == ("row", None)


@pytest.mark.parametrize("name", sorted(MIXED))
def test_row_rules_find_mixed_rows(name):
    f, why = MIXED[name]
    verdict, detail = _rows(f, np.random.default_rng(5).standard_normal((4, 3)))
    assert verdict == "mixed" and why in detail.describe() and "test_dependence.py" in detail.describe()


def test_free_values_do_not_depend_on_the_batch():
    """A value computed from constants only (FREE) may meet a batch-shaped value anywhere."""
    f = lambda x, c: xp(x).tanh(x) * xp(x).sum(c, axis=0)  # noqa: E731
    program, _ = dependence.trace_tape(lambda x: (f(x, np.ones((4, 3))),), [np.ones((4, 3))])
    assert dependence.prove_rows(program, 4) == ("row", None)


def test_unknown_primitive_gives_up_the_proof(monkeypatch):
    monkeypatch.delitem(_rules.TABLE, "tanh")
    verdict, why = _rows(lambda x: xp(x).tanh(x), np.ones((4, 3)))
    assert verdict == "unknown" and "tanh" in why
