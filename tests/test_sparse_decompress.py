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


# ------------------------------------------------------------------ the backend hooks that build a result

class Triplets:
    """A plugin's own sparse type: (row, column, value) triplets."""

    def __init__(self, rows, cols, values, shape):
        self.rows, self.cols, self.values, self.shape = rows, cols, values, shape


def _tape_plugin(**methods):
    from unigrad.tape import NumpyBackend

    return type("TapePlugin", (NumpyBackend,), {"array_modules": (), **methods})


def _triplets(self, values, structure, format, fname):
    if format not in ("auto", "coo"):
        raise ValueError(f"{fname}: format={format!r} is not available on this plugin; use 'coo'")
    return Triplets(structure.rows, structure.indices, self.to_numpy(values), structure.shape)


def _triplets_dense(self, matrix):
    if not isinstance(matrix, Triplets):
        return self.to_numpy(matrix)
    out = np.zeros(matrix.shape, matrix.values.dtype)
    out[matrix.rows, matrix.cols] = matrix.values
    return out


def _bidiagonal(x):
    return x[1:] ** 2 - x[:-1]


_BIDIAGONAL = np.eye(3, 4) + np.eye(3, 4, k=1)
_BIDIAGONAL_AT_0123 = np.array([[-1.0, 2, 0, 0], [0, -1, 4, 0], [0, 0, -1, 6]])


def test_a_plugin_sparse_type_is_the_auto_format(register_backend):
    import unigrad
    from unigrad.testing import check_sparse_jacobian

    name = register_backend("triplet_plugin", _tape_plugin(sparse_matrix=_triplets, sparse_to_numpy=_triplets_dense))
    x = np.arange(4.0)
    for compile in (False, True):
        got = unigrad.sparse_jacobian(_bidiagonal, sparsity=_BIDIAGONAL, backend=name, compile=compile)(x)
        assert isinstance(got, Triplets)
        np.testing.assert_array_equal(_triplets_dense(None, got), _BIDIAGONAL_AT_0123)
    with pytest.raises(ValueError, match="sparse_jacobian: format='csc' is not available on this plugin"):
        unigrad.sparse_jacobian(_bidiagonal, sparsity=_BIDIAGONAL, backend=name, format="csc")(x)
    scipy_result = unigrad.sparse_jacobian(_bidiagonal, sparsity=_BIDIAGONAL, backend=name, format="scipy")(x)
    assert scipy_result.format == "csr"  # "scipy" and "dense" stay the core's
    np.testing.assert_array_equal(scipy_result.toarray(), _BIDIAGONAL_AT_0123)
    dense = unigrad.sparse_jacobian(_bidiagonal, sparsity=_BIDIAGONAL, backend=name, format="dense")(x)
    assert type(dense) is np.ndarray
    np.testing.assert_array_equal(dense, _BIDIAGONAL_AT_0123)
    # unigrad.testing reads the plugin's type through its sparse_to_numpy
    np.testing.assert_array_equal(check_sparse_jacobian(_bidiagonal, (x,), sparsity=_BIDIAGONAL, backend=name),
                                  _BIDIAGONAL_AT_0123)


def test_a_plugin_without_a_sparse_type_gets_scipy(register_backend):
    """The generic defaults: scipy.sparse for "auto" (CSR) and each layout, a NumPy scatter for "dense"."""
    import unigrad

    name = register_backend("no_sparse_type", _tape_plugin())
    x = np.arange(4.0)
    for format, layout in (("auto", "csr"), ("csr", "csr"), ("csc", "csc"), ("coo", "coo")):
        got = unigrad.sparse_jacobian(_bidiagonal, sparsity=_BIDIAGONAL, backend=name, format=format)(x)
        assert sparse.issparse(got) and got.format == layout
        np.testing.assert_array_equal(got.toarray(), _BIDIAGONAL_AT_0123)
