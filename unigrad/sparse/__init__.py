"""Sparse Jacobians and Hessians, in four small steps (the split of SparseMatrixColorings.jl):

1. detect -- the pattern (``unigrad.jacobian_sparsity`` / ``hessian_sparsity``), or given (``_pattern.py``);
2. colour -- column, row or star colouring of the pattern (``_coloring.py``);
3. compress -- one JVP, VJP or HVP per colour, vectorised on the backend (``_compress.py``);
4. decompress -- each non-zero read out of the compressed passes, returned as the backend's
   sparse matrix (``_decompress.py``; the backend builds it from the values and the plan's
   :class:`Structure`: ``Backend.sparse_matrix``).

scipy is needed (the optional extra ``unigrad[sparse]``); it is imported only when a pattern is used.
"""

from ._coloring import Coloring, column_coloring, row_coloring, star_coloring
from ._decompress import InvalidColoring, Structure, recovery, structurally_orthogonal
from ._transforms import SparsePlan, sparse_hessian, sparse_jacobian

__all__ = ["sparse_jacobian", "sparse_hessian", "SparsePlan", "Coloring", "column_coloring", "row_coloring",
           "star_coloring", "recovery", "structurally_orthogonal", "InvalidColoring", "Structure"]
