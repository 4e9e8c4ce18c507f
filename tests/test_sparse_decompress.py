"""Compression and decompression without any AD: a random matrix with a pattern, compressed by its
seed matrix in NumPy, read back through ``recovery``'s index, equals the matrix; the formats."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

sparse = pytest.importorskip("scipy.sparse")

from unigrad.sparse import column_coloring, recovery, row_coloring, star_coloring  # noqa: E402
from unigrad.sparse._compress import groups_of  # noqa: E402
from unigrad.sparse._decompress import Structure, assemble  # noqa: E402


@st.composite
def matrices(draw, symmetric=False):
    m = draw(st.integers(1, 25))
    n = m if symmetric else draw(st.integers(1, 25))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    a = sparse.random_array((m, n), density=draw(st.floats(0.05, 0.4)), rng=rng, format="csr")
    if symmetric:
        a = sparse.csr_array(a + a.T)
    a.sum_duplicates()
    a.sort_indices()
    return a


def seed_matrix(colors, k):
    s = np.zeros((colors.size, max(k, 1)))
    s[np.arange(colors.size), colors] = 1.0
    return s


@given(matrices())
def test_forward_compression_recovers_every_non_zero(a):
    pattern = a != 0
    coloring = column_coloring(pattern)
    compressed = (a.toarray() @ seed_matrix(coloring.colors, coloring.n_colors)).T  # (c, m): one JVP a row
    values = compressed.reshape(-1)[recovery(sparse.csr_array(pattern), coloring)]
    np.testing.assert_array_equal(values, a.data)


@given(matrices())
def test_reverse_compression_recovers_every_non_zero(a):
    pattern = a != 0
    coloring = row_coloring(pattern)
    compressed = seed_matrix(coloring.colors, coloring.n_colors).T @ a.toarray()  # (c, n), as the reverse pass
    np.testing.assert_array_equal(compressed.reshape(-1)[recovery(sparse.csr_array(pattern), coloring)], a.data)
    # the reverse pass's gather of each colour's outputs (padded) sums the same rows as the seed matrix
    groups = groups_of(coloring.colors, coloring.n_colors, a.shape[0])
    y = np.arange(1.0, a.shape[0] + 1)
    np.testing.assert_array_equal(np.append(y, 0.0)[groups].sum(axis=1),
                                  seed_matrix(coloring.colors, coloring.n_colors).T @ y)


@given(matrices(symmetric=True))
def test_star_compression_recovers_every_non_zero(h):
    pattern = sparse.csr_array(h != 0)
    coloring = star_coloring(pattern)
    compressed = (h.toarray() @ seed_matrix(coloring.colors, coloring.n_colors)).T  # (c, n): one HVP a row
    np.testing.assert_allclose(compressed.reshape(-1)[recovery(pattern, coloring)], h.data, rtol=1e-14)


def test_formats_on_numpy_agree():
    import unigrad

    a = sparse.csr_array(np.array([[1.0, 0, 2], [0, 3, 0], [4, 0, 5], [0, 0, 0]]))
    s = Structure(sparse.csr_array(a != 0))
    b = unigrad.get_backend("numpy")
    for format in ("auto", "csr", "csc", "coo", "scipy", "dense"):
        out = assemble(b, a.data, s, format, "test")
        dense = out if isinstance(out, np.ndarray) else out.toarray()
        np.testing.assert_array_equal(dense, a.toarray())
    assert assemble(b, a.data, s, "csc", "test").format == "csc"
    assert assemble(b, a.data, s, "auto", "test").format == "csr"
