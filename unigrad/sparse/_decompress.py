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

import sys
import warnings

import numpy as np

__all__ = ["recovery", "structurally_orthogonal", "FORMATS", "assemble", "finisher"]

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
# Building the result
# ---------------------------------------------------------------------------------------------

def _kind(values):
    module = type(values).__module__.partition(".")[0]
    if module in ("torch", "jax", "jaxlib", "tensorflow"):
        return "jax" if module == "jaxlib" else module
    if module == "numpy" or isinstance(values, np.ndarray):
        return "numpy"
    return None


def assemble(b, values, structure, format, fname):
    """The matrix of ``values`` (one per non-zero of ``structure``, CSR order) in ``format``.

    ``structure`` is the plan's :class:`Structure`. Formats: ``"auto"`` -- the backend's own sparse
    type (NumPy: ``scipy.sparse.csr_array``; torch: a sparse CSR tensor; JAX: ``BCOO``;
    TensorFlow: ``tf.sparse.SparseTensor``); ``"dense"`` -- the backend's dense array; ``"scipy"``
    -- a ``scipy.sparse.csr_array`` whatever the backend (a host copy); ``"csr"``, ``"csc"``,
    ``"coo"`` -- that layout in the backend's type, where it has one.
    """
    values = b.to_native(values)  # (TensorFlow's namespace hands back its Array: the framework's tensor here)
    kind = _kind(values)
    if kind is None and format not in ("scipy", "dense"):
        kind = "numpy"
    if format == "scipy" or (kind == "numpy" and format != "dense"):
        return _scipy(b.to_numpy(values), structure, "csr" if format in ("auto", "scipy") else format)
    if format == "dense":
        return _dense(b, kind, values, structure)
    return _BUILDERS[kind](values, structure, format, fname)


def finisher(b, values, structure, format, fname):
    """``values -> matrix``: :func:`assemble` for every later call whose values are like ``values`` (the
    same framework, dtype and shape: the output of one compiled program), with what it would check or
    convert on each call done once here. On JAX (``"auto"``/``"coo"``) that is a ``BCOO`` built from its
    parts, with no check (the values' shape and dtype were checked on these); elsewhere ``assemble``."""
    native = b.to_native(values)
    if _kind(native) == "jax" and format in ("auto", "coo"):
        key = ("jax", "finisher", native.dtype, tuple(native.shape))
        done = structure._converted.get(key)
        if done is not None:
            return done
        _jax(native, structure, format, fname)  # checks the values, builds and validates one BCOO

        def make():
            from jax.experimental import sparse as jsparse

            pairs = structure.converted(("jax", "pairs"), None)
            params = {"shape": structure.shape, "indices_sorted": True, "unique_indices": True}
            unflatten = jsparse.BCOO.tree_unflatten
            return lambda v: unflatten(params, (v, pairs))

        return structure.converted(key, make)
    return lambda v: assemble(b, v, structure, format, fname)


def _scipy(values, s, layout):
    from scipy import sparse

    values = np.asarray(values)
    if layout == "csr":
        return sparse.csr_array((values, s.indices, s.indptr), shape=s.shape)
    if layout == "csc":
        return sparse.csc_array((values[s.csc_order], s.csc_indices, s.csc_indptr), shape=s.shape)
    return sparse.coo_array((values, (s.rows, s.indices)), shape=s.shape)


def _dense(b, kind, values, s):
    if kind == "torch":
        torch = sys.modules["torch"]
        out = torch.zeros(s.shape[0] * s.shape[1], dtype=values.dtype, device=values.device)
        out = out.index_put((torch.as_tensor(s.flat, device=values.device),), values)
        return out.reshape(s.shape)
    if kind == "jax":
        jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]

        def scatter():  # one compiled scatter per plan (eagerly, .at[].set took 4 ms on 30 non-zeros)
            flat = s.flat.astype(np.int32) if s.shape[0] * s.shape[1] < 2 ** 31 else s.flat
            return jax.jit(lambda v: jnp.zeros(s.shape[0] * s.shape[1], dtype=v.dtype).at[flat].set(v).reshape(s.shape))

        with jax.enable_x64(values.dtype.itemsize == 8 or jax.config.jax_enable_x64):  # keep float64 float64
            return s.converted(("jax", "dense"), scatter)(values)
    if kind == "tensorflow":
        tf = sys.modules["tensorflow"]
        return tf.scatter_nd(s.converted(("tensorflow", "pairs"), lambda: tf.constant(s.pairs)), values, s.shape)
    out = np.zeros(s.shape[0] * s.shape[1], dtype=b.to_numpy(values).dtype)
    out[s.flat] = b.to_numpy(values)
    return out.reshape(s.shape)


def _torch(values, s, format, fname):
    with warnings.catch_warnings():  # torch warns that sparse CSR/CSC support is "in beta" on every construction
        warnings.filterwarnings("ignore", message="Sparse (CSR|CSC) tensor support is in beta", category=UserWarning)
        return _torch_layout(values, s, format)


def _torch_layout(values, s, format):
    torch = sys.modules["torch"]
    device = values.device

    def on_device(name):  # the index arrays, moved to the device once per plan (a new tensor each call:
        # torch's sparse tensors share their index tensors, and a user may modify one in place)
        return s.converted(("torch", name, str(device)),
                           lambda: torch.as_tensor(getattr(s, name), device=device)).clone()

    if format in ("auto", "csr"):
        return torch.sparse_csr_tensor(on_device("indptr"), on_device("indices"), values, s.shape)
    if format == "csc":
        return torch.sparse_csc_tensor(on_device("csc_indptr"), on_device("csc_indices"),
                                       values[on_device("csc_order")], s.shape)
    return torch.sparse_coo_tensor(on_device("pairs_t"), values, s.shape, is_coalesced=True)


def _jax(values, s, format, fname):
    from jax.experimental import sparse as jsparse

    import jax.numpy as jnp

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


def _tensorflow(values, s, format, fname):
    tf = sys.modules["tensorflow"]
    if format in ("auto", "coo"):
        return tf.sparse.SparseTensor(s.converted(("tensorflow", "pairs"), lambda: tf.constant(s.pairs)), values,
                                      s.shape)
    raise ValueError(f"{fname}: format={format!r} is not available on TensorFlow; use 'coo' "
                     f"(tf.sparse.SparseTensor), 'dense' or 'scipy'")


_BUILDERS = {"torch": _torch, "jax": _jax, "tensorflow": _tensorflow}


class Structure:
    """The non-zeros of a pattern in the index arrays each format needs (computed once per plan)."""

    def __init__(self, pattern):
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
        """An index array in a framework's type, made once (immutable arrays: JAX, TensorFlow)."""
        value = self._converted.get(key)
        if value is None:
            value = self._converted[key] = make()
        return value

    @property
    def nnz(self):
        return int(self.indices.size)
