"""The pattern a sparse transform uses: given by the user, or detected (the first of the four steps,
detect, colour, compress, decompress; detection itself is ``unigrad.jacobian_sparsity`` /
``unigrad.hessian_sparsity``)."""

from __future__ import annotations

import numpy as np

__all__ = ["as_pattern", "detect", "proved"]


def as_pattern(matrix, shape, fname, symmetric=False):
    """A user's pattern (``scipy.sparse``, a NumPy or any array-like; non-zero entries count) as a
    canonical boolean CSR array of ``shape`` with sorted indices; symmetrised for a Hessian."""
    from scipy import sparse

    if isinstance(matrix, str) or matrix is None:
        raise TypeError(f"{fname}: sparsity must be None, 'detect' or a matrix; got {matrix!r}")
    if sparse.issparse(matrix):
        a = sparse.csr_array(matrix)
    else:
        dense = np.asarray(matrix)
        if dense.ndim != 2:
            raise ValueError(f"{fname}: sparsity must be a 2-D matrix of shape {shape}; got an array of shape "
                             f"{dense.shape}")
        a = sparse.csr_array(dense)
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{fname}: sparsity has shape {tuple(a.shape)}; expected {tuple(shape)} "
                         f"(outputs x inputs, each flattened and concatenated)")
    a = sparse.csr_array((a.data != 0, a.indices, a.indptr), shape=a.shape) if a.nnz else a.astype(bool)
    a.eliminate_zeros()
    if symmetric:
        a = sparse.csr_array(a + a.T, dtype=bool)
    a.sum_duplicates()
    a.sort_indices()
    return sparse.csr_array(a, dtype=bool)


def detect(kind, f, args, argnums, backend, fname):
    """The pattern found by the detector (``kind``: ``"jacobian"`` or ``"hessian"``)."""
    from .. import dependence  # (the analysis of traced programs: imported when a pattern is detected)

    detector = dependence.hessian_sparsity if kind == "hessian" else dependence.jacobian_sparsity
    return detector(f, *args, argnums=argnums, backend=backend)


def proved(kind, f, args, argnums, backend, pattern) -> bool:
    """Is the detected ``pattern`` proved over the program the backend runs (``unigrad.dependence.
    proved_on_backend``)?"""
    from .. import dependence

    return dependence.proved_on_backend(f, args, pattern, argnums=argnums, backend=backend,
                                        hessian=kind == "hessian")
