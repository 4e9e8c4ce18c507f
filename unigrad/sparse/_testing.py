"""Checks of sparse results (exported by :mod:`unigrad.testing`): a sparse Jacobian or Hessian against
the dense one on the same input, and a pattern against the dense Jacobian's non-zeros at random points."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import optree

__all__ = ["check_sparse_jacobian", "check_sparse_hessian", "check_sparsity_covers", "flat_problem"]

_RTOL = {"float64": 1e-10, "complex128": 1e-10, "float32": 2e-5, "complex64": 2e-5, "float16": 5e-3,
         "bfloat16": 3e-2}


def flat_problem(f, args, argnums=0):
    """``(F, v, rest)``: ``f`` as ``F(v, *rest)`` of one flat vector ``v`` (the differentiated
    arguments' elements, flattened and concatenated: the column order of the sparse transforms) and
    the other arguments ``rest``, returning one flat vector (the outputs' elements: the row order).
    ``F`` is portable: it runs on any backend (pass ``rest`` to it, so they are converted)."""
    import unigrad

    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    others = tuple(k for k in range(len(args)) if k not in nums)
    leaves, treedef = optree.tree_flatten(tuple(args[a] for a in nums))
    arrays = [np.asarray(unigrad.to_numpy(x)) for x in leaves]
    shapes = [a.shape for a in arrays]
    dtypes = [a.dtype for a in arrays]
    v = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.result_type(*dtypes)) if arrays else np.zeros(0)

    def F(v, *rest):
        xp = unigrad.namespace(v)
        parts, start = [], 0
        for shape, dtype in zip(shapes, dtypes):
            size = int(np.prod(shape, dtype=np.int64))
            piece = xp.reshape(v[start:start + size], shape)
            parts.append(piece if piece.dtype == getattr(xp, dtype.name) else xp.astype(piece, getattr(xp, dtype.name)))
            start += size
        chosen = optree.tree_unflatten(treedef, parts)
        call = list(args)
        for a, value in zip(nums, chosen):
            call[a] = value
        for a, value in zip(others, rest):
            call[a] = value
        outs = optree.tree_leaves(f(*call))
        flat = [xp.reshape(o, (-1,)) for o in outs]
        return flat[0] if len(flat) == 1 else xp.concat(flat)

    return F, v, tuple(args[k] for k in others)


def _dense(matrix, backend, args):
    """A sparse result as a dense NumPy array, read by the backend that built it (``Backend.sparse_to_numpy``):
    ``backend``, else the one ``args`` select, as the transform chose it."""
    from .. import _registry

    return np.asarray(_registry.resolve(backend, optree.tree_leaves(args)).sparse_to_numpy(matrix))


def _compare(name, got, want, dtype, rtol):
    rtol = _RTOL.get(str(dtype), 1e-6) if rtol is None else rtol
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {got.shape}; the dense result has shape {want.shape}")
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    err = np.abs(got - want)
    if err.size and not np.all(err <= rtol * scale) or not np.array_equal(np.isnan(got), np.isnan(want)):
        i, j = np.unravel_index(int(np.nanargmax(np.where(np.isnan(err), np.inf, err))), err.shape)
        raise AssertionError(f"{name} differs from the dense one at ({i}, {j}): {got[i, j]!r} vs {want[i, j]!r} "
                             f"(tolerance {rtol:g} x {scale:g})")


def check_sparse_jacobian(f: Callable, args: Sequence, *, argnums=0, sparsity=None, mode="auto", backend=None,
                          compile=False, rtol=None) -> np.ndarray:
    """Assert that ``sparse_jacobian(f, ...)(*args)`` equals the dense ``jacobian`` at ``args``.

    Args:
      f: the function.
      args: its positional arguments (a tuple).
      argnums: as for :func:`unigrad.sparse_jacobian`.
      sparsity: as for :func:`unigrad.sparse_jacobian` (None: detected).
      mode: as for :func:`unigrad.sparse_jacobian`.
      backend: where both Jacobians are computed.
      compile: compile the sparse transform.
      rtol: tolerance relative to the largest entry (default by dtype).

    Returns:
      The dense matrix both agree on (``m x n`` NumPy).

    Raises:
      AssertionError: naming the first entry that differs.

    Example:
      >>> def f(x):
      ...     return x[1:] ** 2 - x[:-1]
      >>> pattern = np.eye(3, 4) + np.eye(3, 4, k=1)
      >>> check_sparse_jacobian(f, (np.arange(4.0),), sparsity=pattern).shape
      (3, 4)
    """
    import unigrad

    sparse_jac = unigrad.sparse_jacobian(f, argnums, sparsity=sparsity, mode=mode, backend=backend, compile=compile)
    got = _dense(sparse_jac(*args), backend, args)
    F, v, rest = flat_problem(f, args, argnums)
    want = np.asarray(unigrad.to_numpy(unigrad.jacobian(F, backend=backend)(v, *rest)))
    want = want.reshape(want.shape[0] if want.ndim == 2 else -1, v.size)
    _compare("the sparse Jacobian", got, want, want.dtype, rtol)
    return want


def check_sparse_hessian(f: Callable, args: Sequence, *, argnums=0, sparsity=None, backend=None, compile=False,
                         rtol=None) -> np.ndarray:
    """Assert that ``sparse_hessian(f, ...)(*args)`` equals the dense ``hessian`` at ``args`` and is
    symmetric. Arguments as for :func:`check_sparse_jacobian`; returns the dense Hessian.

    Example:
      >>> def f(x):
      ...     xp = unigrad.namespace(x)
      ...     return xp.sum(x[1:] * x[:-1] ** 2)
      >>> tridiagonal = np.eye(5) + np.eye(5, k=1) + np.eye(5, k=-1)
      >>> check_sparse_hessian(f, (np.arange(5.0),), sparsity=tridiagonal)[1]
      array([0., 4., 2., 0., 0.])
    """
    import unigrad

    sparse_hess = unigrad.sparse_hessian(f, argnums, sparsity=sparsity, backend=backend, compile=compile)
    got = _dense(sparse_hess(*args), backend, args)
    F, v, rest = flat_problem(f, args, argnums)
    want = np.asarray(unigrad.to_numpy(unigrad.hessian(lambda u, *r: F(u, *r)[0], backend=backend)(v, *rest)))
    _compare("the sparse Hessian", got, want, want.dtype, rtol)
    _compare("the sparse Hessian's transpose", got.T, got, want.dtype, rtol)
    return want


def check_sparsity_covers(f: Callable, args: Sequence, pattern, *, argnums=0, kind="jacobian", points=3, spread=0.5,
                          seed=0, backend=None) -> None:
    """Assert that ``pattern`` covers every non-zero of the dense Jacobian (or Hessian) of ``f`` at
    ``args`` and at ``points`` random points around them (each element moved by up to ``spread``
    times its magnitude, plus ``spread``).

    Args:
      f: the function.
      args: its positional arguments (a tuple).
      argnums: the differentiated arguments.
      pattern: ``m x n`` (``n x n`` for a Hessian) ``scipy.sparse`` or array-like; non-zeros count.
      kind: ``"jacobian"`` or ``"hessian"``.
      points: how many random points besides ``args``.
      spread: how far the random points move from ``args`` (relative, see above).
      seed: the random generator's seed.
      backend: where the dense Jacobians are computed.

    Raises:
      AssertionError: naming a non-zero outside the pattern, its value and the point.

    Example:
      >>> def f(x):
      ...     return x[1:] ** 2 - x[:-1]
      >>> check_sparsity_covers(f, (np.arange(4.0),), np.eye(3, 4) + np.eye(3, 4, k=1))
      >>> check_sparsity_covers(f, (np.arange(4.0),), np.eye(3, 4))
      Traceback (most recent call last):
      AssertionError: check_sparsity_covers: the jacobian has 3 non-zeros outside the pattern at args; the first at (0, 1) = ...
    """
    import unigrad

    from scipy import sparse

    if kind not in ("jacobian", "hessian"):
        raise ValueError(f"check_sparsity_covers: kind must be 'jacobian' or 'hessian'; got {kind!r}")
    F, v, rest = flat_problem(f, args, argnums)
    covered = (sparse.csr_array(pattern).toarray() != 0) if sparse.issparse(pattern) else (np.asarray(pattern) != 0)
    rng = np.random.default_rng(seed)
    transform = unigrad.jacobian(F, backend=backend) if kind == "jacobian" else unigrad.hessian(
        lambda u, *r: F(u, *r)[0], backend=backend)
    for k in range(points + 1):
        point = v if k == 0 else (v + spread * (np.abs(v) + 1) * rng.uniform(-1, 1, v.shape)).astype(v.dtype)
        dense = np.asarray(unigrad.to_numpy(transform(point, *rest)))
        dense = dense.reshape(-1, v.size)
        if covered.shape != dense.shape:
            raise AssertionError(f"check_sparsity_covers: the pattern has shape {covered.shape}; the dense "
                                 f"{kind} has shape {dense.shape}")
        missing = (dense != 0) & ~covered
        if missing.any():
            i, j = (int(a[0]) for a in np.nonzero(missing))
            where = "at args" if k == 0 else f"at random point {k} (seed {seed})"
            raise AssertionError(f"check_sparsity_covers: the {kind} has {int(missing.sum())} non-zeros outside the "
                                 f"pattern {where}; the first at ({i}, {j}) = {dense[i, j]!r}")
