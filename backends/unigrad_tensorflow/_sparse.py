"""The sparse transforms' results on TensorFlow (``Backend.sparse_matrix``, ``dense_matrix``,
``sparse_to_numpy``): ``tf.sparse.SparseTensor`` (``"auto"``, ``"coo"``), and a dense matrix by ``tf.scatter_nd``."""

from __future__ import annotations

import tensorflow as tf


def _pairs(s):
    """The ``(nnz, 2)`` indices as a tensor, made once per plan (tensors are immutable: one serves every call)."""
    return s.converted(("tensorflow", "pairs"), lambda: tf.constant(s.pairs))


def sparse_matrix(values, s, format, fname):
    if format in ("auto", "coo"):
        return tf.sparse.SparseTensor(_pairs(s), values, s.shape)
    raise ValueError(f"{fname}: format={format!r} is not available on TensorFlow; use 'coo' "
                     f"(tf.sparse.SparseTensor), 'dense' or 'scipy'")


def dense_matrix(values, s):
    return tf.scatter_nd(_pairs(s), values, s.shape)


def sparse_to_numpy(matrix):
    if isinstance(matrix, tf.sparse.SparseTensor):
        matrix = tf.sparse.to_dense(matrix)
    return matrix.numpy()
