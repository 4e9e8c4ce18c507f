"""Decompress: where each non-zero of the pattern is read in the compressed result, and the result
built as the backend's sparse matrix. The last of the four steps (detect, colour, compress, decompress).

The compressed passes (``_compress.py``) return one flat array per call:

* forward (column colouring): ``B = (J S)^T`` laid out ``(c, m)``, one row per colour (per JVP);
  ``J[i, j] = B[color[j], i]``;
* reverse (row colouring): ``C = W J`` laid out ``(c, n)``; ``J[i, j] = C[color[i], j]``;
* star (symmetric Hessian): ``B = (H S)^T`` laid out ``(c, n)``; ``H[i, j] = B[color[j], i]`` when
  ``j`` is the only column of its colour in row ``i``, else ``B[color[i], j]``.

(Colour-major for all three: each pass's result is a row, and a gather from a transposed layout was
measured 9x slower under ``jax.jit`` on the Brusselator, N = 32: XLA fuses the transpose into it.)

:func:`recovery` turns a pattern and a colouring into one flat index per non-zero (in CSR order),
and raises if any non-zero cannot be recovered exactly: the colouring is checked, never trusted.
The values of a call are then a single gather, ``take(compressed, index)``, on the backend.
"""

from __future__ import annotations

import numpy as np

__all__ = ["recovery", "structurally_orthogonal", "FORMATS", "Structure", "assemble", "finisher"]

FORMATS = ("auto", "dense", "scipy", "csr", "csc", "coo")


class InvalidColoring(ValueError):
    """A colouring that would make a compressed pass add two non-zeros together."""


def _unique_in_group(group, color, n_colors):
    """For entries ``(group[e], color[e])``: True where no other entry has the same pair."""
    keys = group.astype(np.int64) * n_colors + color
    counts = np.bincount(keys, minlength=1)
    return counts[keys] == 1


def structurally_orthogonal(pattern, coloring) -> bool:
    """True when ``coloring`` lets every non-zero of ``pattern`` be recovered (see :func:`recovery`)."""
    try:
        recovery(pattern, coloring)
    except InvalidColoring:
        return False
    return True


def recovery(pattern, coloring):
    """One flat index into the compressed result per non-zero of ``pattern`` (CSR order).

    Args:
      pattern: a ``scipy.sparse`` CSR array with sorted indices (``m x n``; square and symmetric for
        a star colouring).
      coloring: a :class:`~unigrad.sparse.Coloring` of its columns, rows or vertices.

    Returns:
      An ``int64`` array of ``pattern.nnz`` indices.

    Raises:
      InvalidColoring: a non-zero could not be recovered (two of one colour meet in a row or column).
    """
    m, n = pattern.shape
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(pattern.indptr))
    cols = pattern.indices.astype(np.int64)
    color, c = coloring.colors, max(coloring.n_colors, 1)
    if coloring.kind == "column":
        _check_size(color, n, "columns")
        ok = _unique_in_group(rows, color[cols], c)
        index = color[cols] * m + rows
    elif coloring.kind == "row":
        _check_size(color, m, "rows")
        ok = _unique_in_group(cols, color[rows], c)
        index = color[rows] * n + cols
    elif coloring.kind == "star":
        _check_size(color, n, "vertices")
        counts = np.bincount(rows * c + color[cols], minlength=1)  # entries of each (row, colour)
        direct = counts[rows * c + color[cols]] == 1  # j alone in its colour in row i
        mirrored = counts[cols * c + color[rows]] == 1  # i alone in its colour in row j (H symmetric)
        ok = direct | mirrored
        index = np.where(direct, color[cols] * n + rows, color[rows] * n + cols)
    else:
        raise ValueError(f"unknown colouring kind {coloring.kind!r}")
    if not ok.all():
        e = int(np.flatnonzero(~ok)[0])
        raise InvalidColoring(f"the {coloring.kind} colouring cannot recover the non-zero ({rows[e]}, {cols[e]}): "
                              f"{int((~ok).sum())} non-zeros share a colour with another in their "
                              f"{'row' if coloring.kind != 'row' else 'column'}")
    return index


def _check_size(color, size, what):
    if color.shape != (size,):
        raise InvalidColoring(f"the colouring has {color.size} colours for {size} {what}")


# ---------------------------------------------------------------------------------------------
# Building the result: the backend's hooks (``Backend.sparse_matrix``, ``sparse_finisher``,
# ``dense_matrix``); NumPy and SciPy here, for ``format="scipy"`` and the hooks' generic defaults
# ---------------------------------------------------------------------------------------------

def assemble(b, values, structure, format, fname):
    """The matrix of ``values`` (one per non-zero of ``structure``, CSR order) in ``format``.

    ``structure`` is the plan's :class:`Structure`. Formats: ``"auto"``, ``"csr"``, ``"csc"``,
    ``"coo"`` -- the backend's own sparse type (:meth:`~unigrad.Backend.sparse_matrix`; without one,
    ``scipy.sparse``: CSR for ``"auto"``); ``"dense"`` -- the backend's dense array
    (:meth:`~unigrad.Backend.dense_matrix`); ``"scipy"`` -- a ``scipy.sparse.csr_array`` whatever the
    backend (a host copy).
    """
    return finisher(b, values, structure, format, fname)(values)


def finisher(b, values, structure, format, fname):
    """``values -> matrix``: :func:`assemble` for every later call whose values are like ``values`` (the
    same type, dtype and shape: the output of one compiled program), with what it would check or
    convert on each call done once here (:meth:`~unigrad.Backend.sparse_finisher`: on JAX a ``BCOO``
    built from its parts)."""
    if format == "scipy":
        return lambda v: structure.to_scipy(b.to_numpy(v))
    if format == "dense":
        return lambda v: b.dense_matrix(v, structure)
    return b.sparse_finisher(values, structure, format, fname)


class Structure:
    """The non-zeros of an ``m x n`` sparsity pattern as the index arrays each sparse format needs,
    computed once per plan (``SparsePlan.structure``). The backend hooks that build a result
    (:meth:`unigrad.Backend.sparse_matrix`, ``sparse_finisher``, ``dense_matrix``) receive it with the
    values: one per non-zero, in CSR order (row by row, columns ascending within a row).

    Every index array is a NumPy array (``int64`` unless named ``...32``); do not modify them.

    Attributes:
      shape: ``(m, n)``.
      nnz: the number of non-zeros.
      indptr, indices: CSR: the non-zeros of row ``i`` are ``indptr[i]:indptr[i + 1]``, in columns ``indices``.
      rows: the row of each non-zero (``indices`` is its column).
      pairs: ``(nnz, 2)``: ``(row, column)`` of each non-zero (COO).
      pairs_t: ``pairs`` transposed, ``(2, nnz)``, contiguous.
      flat: ``row * n + column`` of each non-zero: its index in the flattened dense matrix.
      pairs32, indices32, indptr32: ``pairs``, ``indices``, ``indptr`` as ``int32``.
      csc_order, csc_indices, csc_indptr: CSC: ``values[csc_order]`` are the values column by column,
        in rows ``csc_indices``; column ``j``'s are ``csc_indptr[j]:csc_indptr[j + 1]``.

    Example:
      >>> import scipy.sparse
      >>> from unigrad.sparse import Structure
      >>> s = Structure(scipy.sparse.csr_array(np.array([[1, 0, 1], [0, 1, 0]])))
      >>> s.shape, s.nnz, s.pairs.tolist(), s.flat.tolist()
      ((2, 3), 3, [[0, 0], [0, 2], [1, 1]], [0, 2, 4])
      >>> s.to_dense(np.array([1.0, 2.0, 3.0]))
      array([[1., 0., 2.],
             [0., 3., 0.]])
    """

    def __init__(self, pattern):
        """``pattern``: a ``scipy.sparse`` CSR array with sorted indices and no duplicates (the plan's)."""
        m, n = pattern.shape
        self.shape = (int(m), int(n))
        self.indptr = pattern.indptr.astype(np.int64)
        self.indices = pattern.indices.astype(np.int64)
        self.rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(pattern.indptr))
        self.pairs = np.stack([self.rows, self.indices], axis=1)
        self.flat = self.rows * n + self.indices
        self.pairs32 = self.pairs.astype(np.int32)
        self.indices32, self.indptr32 = self.indices.astype(np.int32), self.indptr.astype(np.int32)
        self.csc_order = np.lexsort((self.rows, self.indices))
        self.csc_indices = self.rows[self.csc_order]
        self.csc_indptr = np.concatenate([[0], np.cumsum(np.bincount(self.indices, minlength=n))]).astype(np.int64)
        self.pairs_t = np.ascontiguousarray(self.pairs.T)
        self._converted = {}

    def converted(self, key, make):
        """``make()``, made once for this plan and kept under ``key`` (a hashable a backend chooses, starting
        with its name: ``("jax", "pairs")``): an index array in a framework's type, moved to a device, a
        compiled scatter. Keep only what nothing can modify: a mutable array handed to the user each call
        must be a copy of the kept one (torch's sparse tensors share their index tensors)."""
        value = self._converted.get(key)
        if value is None:
            value = self._converted[key] = make()
        return value

    @property
    def nnz(self):
        return int(self.indices.size)

    def to_scipy(self, values, layout="csr"):
        """``values`` (NumPy, one per non-zero, CSR order) as a ``scipy.sparse`` array in ``layout``:
        ``"csr"``, ``"csc"`` or ``"coo"``."""
        from scipy import sparse

        values = np.asarray(values)
        if layout == "csr":
            return sparse.csr_array((values, self.indices, self.indptr), shape=self.shape)
        if layout == "csc":
            return sparse.csc_array((values[self.csc_order], self.csc_indices, self.csc_indptr), shape=self.shape)
        if layout == "coo":
            return sparse.coo_array((values, (self.rows, self.indices)), shape=self.shape)
        raise ValueError(f"layout must be 'csr', 'csc' or 'coo'; got {layout!r}")

    def to_dense(self, values):
        """``values`` (NumPy, one per non-zero, CSR order) as the dense ``m x n`` NumPy array, zeros elsewhere."""
        values = np.asarray(values)
        out = np.zeros(self.shape[0] * self.shape[1], dtype=values.dtype)
        out[self.flat] = values
        return out.reshape(self.shape)
