"""The sparse transforms' results on JAX (``Backend.sparse_matrix``, ``sparse_finisher``, ``dense_matrix``,
``sparse_to_numpy``): ``jax.experimental.sparse`` ``BCOO`` (``"auto"``, ``"coo"``) and ``BCSR`` (``"csr"``),
and a dense matrix by one compiled scatter per plan."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def sparse_matrix(values, s, format, fname):
    from jax.experimental import sparse as jsparse

    # The matrix is built once per plan by its constructor (which validates the index arrays), then
    # from its parts by the pytree protocol (as jax.jit builds one it returns): the constructor's
    # conversions and checks took 140 us a call, more than the compressed passes of a small problem.
    # The values are checked here instead: one per non-zero, a 1-d array.
    if tuple(values.shape) != (s.nnz,):
        raise ValueError(f"internal: {s.nnz} values expected, got an array of shape {tuple(values.shape)}")
    if format in ("auto", "coo"):
        pairs = s.converted(("jax", "pairs"), lambda: jnp.asarray(s.pairs32))
        if s.converted(("jax", "bcoo checked", values.dtype), lambda: jsparse.BCOO(
                (values, pairs), shape=s.shape, indices_sorted=True, unique_indices=True)) is not None:
            return jsparse.BCOO.tree_unflatten({"shape": s.shape, "indices_sorted": True, "unique_indices": True},
                                               (values, pairs))
    if format == "csr":
        indices = s.converted(("jax", "indices"), lambda: jnp.asarray(s.indices32))
        indptr = s.converted(("jax", "indptr"), lambda: jnp.asarray(s.indptr32))
        return jsparse.BCSR((values, indices, indptr), shape=s.shape)
    raise ValueError(f"{fname}: format={format!r} is not available on JAX; use 'coo' (BCOO), 'csr' (BCSR), "
                     f"'dense' or 'scipy'")


def sparse_finisher(values, s, format, fname):
    """For values like ``values`` (``"auto"``/``"coo"``): a ``BCOO`` built from its parts, with no check (the
    values' shape and dtype were checked on these, and the key holds them); elsewhere ``sparse_matrix``."""
    if format not in ("auto", "coo"):
        return lambda v: sparse_matrix(v, s, format, fname)

    def make():
        from jax.experimental import sparse as jsparse

        sparse_matrix(values, s, format, fname)  # checks the values, builds and validates one BCOO
        pairs = s.converted(("jax", "pairs"), None)
        params = {"shape": s.shape, "indices_sorted": True, "unique_indices": True}
        unflatten = jsparse.BCOO.tree_unflatten
        return lambda v: unflatten(params, (v, pairs))

    return s.converted(("jax", "finisher", values.dtype, tuple(values.shape)), make)


def dense_matrix(values, s):
    def scatter():  # one compiled scatter per plan (eagerly, .at[].set took 4 ms on 30 non-zeros)
        flat = s.flat.astype(np.int32) if s.shape[0] * s.shape[1] < 2 ** 31 else s.flat
        return jax.jit(lambda v: jnp.zeros(s.shape[0] * s.shape[1], dtype=v.dtype).at[flat].set(v).reshape(s.shape))

    with jax.enable_x64(values.dtype.itemsize == 8 or jax.config.jax_enable_x64):  # keep float64 float64
        return s.converted(("jax", "dense"), scatter)(values)


def sparse_to_numpy(matrix):
    """A ``BCOO`` or ``BCSR`` densified under x64 where its values are 64-bit (``todense`` keeps float64 only
    there); a dense array as it is."""
    if hasattr(matrix, "todense"):
        with jax.enable_x64(matrix.dtype.itemsize == 8):
            return np.asarray(matrix.todense())
    return np.asarray(matrix)
