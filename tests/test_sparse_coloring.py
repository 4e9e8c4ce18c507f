"""Colouring (unigrad.sparse._coloring) and its check (recovery): valid colourings, known optima,
and a checker that rejects a bad colouring."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

sparse = pytest.importorskip("scipy.sparse")

from unigrad.sparse import (InvalidColoring, column_coloring, recovery, row_coloring,  # noqa: E402
                            star_coloring, structurally_orthogonal)
from unigrad.sparse import _coloring  # noqa: E402


def tridiagonal(n):
    return sparse.csr_array(sparse.diags_array([1, 1, 1], offsets=[-1, 0, 1], shape=(n, n), dtype=bool))


def laplacian_2d(side):
    one = sparse.diags_array([1, 1, 1], offsets=[-1, 0, 1], shape=(side, side), dtype=bool)
    eye = sparse.eye_array(side, dtype=bool)
    return sparse.csr_array((sparse.kron(one, eye) + sparse.kron(eye, one)).astype(bool))


def canonical(a):
    a = sparse.csr_array(a, dtype=bool)
    a.sum_duplicates()
    a.sort_indices()
    return a


@pytest.mark.parametrize("n", [3, 10, 1000])
def test_tridiagonal_takes_three_colours(n):
    p = tridiagonal(n)
    for coloring in (column_coloring(p), row_coloring(p), star_coloring(p)):
        # a path of 3 vertices has no path of 4 to two-colour: a star colouring needs only 2
        assert coloring.n_colors == (2 if n == 3 and coloring.kind == "star" else 3), coloring
        assert structurally_orthogonal(p, coloring)


def test_diagonal_takes_one_colour_and_dense_takes_n():
    assert column_coloring(sparse.eye_array(7)).n_colors == 1
    assert star_coloring(sparse.eye_array(7)).n_colors == 1
    dense = np.ones((4, 6), dtype=bool)
    assert column_coloring(dense).n_colors == 6
    assert row_coloring(dense).n_colors == 4


def test_arrow_matrix_row_and_column_colourings_differ():
    # a dense first row: every column shares it (n column colours), while rows need 2 colours
    n = 8
    a = np.eye(n, dtype=bool)
    a[0] = True
    assert column_coloring(a).n_colors == n
    assert row_coloring(a).n_colors == 2


def test_laplacian_star_colouring_is_valid_and_small():
    p = laplacian_2d(12)
    star = star_coloring(p)
    assert structurally_orthogonal(p, star)
    assert 5 <= star.n_colors <= 7  # the 5-point stencil: 5 is the lower bound (a vertex and its 4 neighbours)
    assert structurally_orthogonal(p, column_coloring(p))


def test_best_order_is_kept():
    p = laplacian_2d(6)
    counts = {order: column_coloring(p, orders=(order,), iterations=0).n_colors for order in _coloring.ORDERS}
    best = column_coloring(p, iterations=0)
    assert best.n_colors == min(counts.values()) and best.passes == 0
    assert counts[best.order] == best.n_colors


def brusselator_pattern(n):
    """The 2-D Brusselator's Jacobian pattern, from the example that solves it."""
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "brusselator_newton.py"
    spec = importlib.util.spec_from_file_location("brusselator_newton", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return canonical(module.brusselator_pattern(n))


@pytest.mark.parametrize("kind", ["column", "row"])
def test_iterated_greedy_takes_the_brusselator_from_12_to_10_colours(kind):
    p = brusselator_pattern(32)
    colour = column_coloring if kind == "column" else row_coloring
    plain, iterated = colour(p, iterations=0), colour(p)
    assert plain.n_colors == 12  # the best of the three greedy orders (asdex's count too)
    assert iterated.n_colors == 10 and iterated.passes > 0, iterated
    assert structurally_orthogonal(p, iterated)
    assert np.array_equal(colour(p).colors, iterated.colors)  # one pattern, one colouring (a fixed seed)


def test_iterated_greedy_stops_at_the_densest_row():
    assert column_coloring(tridiagonal(50)).passes == 0  # 3 colours is the bound: nothing to try
    assert row_coloring(sparse.eye_array(5)).passes == 0


def test_smallest_last_order_is_a_permutation():
    from unigrad.sparse._coloring import _adjacency, _order

    indptr, indices = _adjacency(laplacian_2d(5))
    for order in _coloring.ORDERS:
        assert sorted(_order(indptr, indices, order).tolist()) == list(range(25))
    with pytest.raises(ValueError, match="unknown colouring order"):
        _order(indptr, indices, "random")


def test_groups_partition_the_columns():
    coloring = column_coloring(tridiagonal(9))
    groups = coloring.groups()
    assert len(groups) == coloring.n_colors
    assert sorted(np.concatenate(groups).tolist()) == list(range(9))
    for k, g in enumerate(groups):
        assert (coloring.colors[g] == k).all()


def test_a_bad_colouring_is_rejected():
    p = canonical(tridiagonal(5))
    one_colour = _coloring.Coloring(np.zeros(5, dtype=np.int64), 1, "column", "natural")
    assert not structurally_orthogonal(p, one_colour)
    with pytest.raises(InvalidColoring, match="cannot recover"):
        recovery(p, one_colour)
    with pytest.raises(InvalidColoring):
        recovery(p, _coloring.Coloring(np.zeros(5, dtype=np.int64), 1, "star", "natural"))
    with pytest.raises(InvalidColoring, match="colours for"):
        recovery(p, _coloring.Coloring(np.zeros(4, dtype=np.int64), 1, "row", "natural"))
    # distance-1 alone is not enough for a star colouring: a path 0-1-2-3 coloured a b a b
    path = canonical(tridiagonal(4))
    alternating = _coloring.Coloring(np.array([0, 1, 0, 1]), 2, "star", "natural")
    assert not structurally_orthogonal(path, alternating)


@st.composite
def patterns(draw, square=False):
    m = draw(st.integers(1, 30))
    n = m if square else draw(st.integers(1, 30))
    density = draw(st.floats(0.02, 0.5))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    a = sparse.random_array((m, n), density=density, rng=np.random.default_rng(seed), format="csr") != 0
    return canonical(a + a.T) if square else canonical(a)


@given(patterns())
def test_column_and_row_colourings_are_valid(p):
    col, row = column_coloring(p), row_coloring(p)
    assert structurally_orthogonal(p, col) and structurally_orthogonal(p, row)
    max_row = int(np.diff(p.indptr).max()) if p.nnz else 0
    max_col = int(np.bincount(p.indices, minlength=1).max()) if p.nnz else 0
    assert col.n_colors >= max(max_row, 1) and row.n_colors >= max(max_col, 1)  # the lower bounds
    assert col.n_colors <= p.shape[1] and row.n_colors <= p.shape[0]
    # iterated greedy never adds a colour to the best order's colouring
    assert col.n_colors <= column_coloring(p, iterations=0).n_colors
    assert row.n_colors <= row_coloring(p, iterations=0).n_colors


@given(patterns(square=True))
def test_star_colourings_are_valid(p):
    star = star_coloring(p)
    assert structurally_orthogonal(p, star)
    off_diagonal = bool(sparse.triu(p, k=1).nnz)  # an edge's two ends differ
    assert (2 if off_diagonal else 1) <= star.n_colors <= p.shape[0]
