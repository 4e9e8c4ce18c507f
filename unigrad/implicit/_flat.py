"""Pytrees of solutions as one vector: ``linear_solve``'s ``b`` and ``x``, ``custom_root``'s solution.

A :class:`Flat` keeps a pytree's structure and its leaves' shapes; ``ravel`` concatenates the leaves,
flattened, into one vector and ``unravel`` cuts a vector back into the pytree. Both are ordinary
(differentiable) array operations of the backend's namespace, so the rules, solvers and checks, written
for one array, run unchanged on the vector, and derivatives pass through the ravelling on either side.

The leaves must share one real floating dtype: a pytree that mixes float32 and float64 (or holds
integers, or complex numbers) raises a TypeError naming the leaves, rather than being promoted (a solve in
the wider dtype would hand the narrower leaves a dtype they were not given).
"""

from __future__ import annotations

import math

import optree

from .._api import asarray, namespace

__all__ = ["Flat", "is_single"]


def is_single(tree) -> bool:
    """Is ``tree`` one leaf (an array, a number), not a container of leaves?"""
    return optree.tree_structure(tree).is_leaf()


def _path(path) -> str:
    return "".join(f"[{k!r}]" for k in path) or "(the root)"


class Flat:
    """The structure and leaf shapes of the pytree ``tree`` (of ``backend``'s arrays, or values it converts);
    ``who`` names it in errors (``"linear_solve: b"``)."""

    def __init__(self, tree, backend, who):
        self.backend, self.who = backend, who
        paths, leaves, self.treedef = optree.tree_flatten_with_path(tree)
        if not leaves:
            raise TypeError(f"{who}: a pytree with no arrays ({self.treedef}); expected at least one floating-point "
                            f"array")
        leaves = [self._array(v) for v in leaves]
        self.names = [_path(p) for p in paths]
        dtypes = [str(backend.dtype(v)) for v in leaves]
        for name, dtype in zip(self.names, dtypes):
            if "float" not in dtype:
                raise TypeError(f"{who}: leaf {name} has dtype {dtype}; the leaves of a pytree solution must be real "
                                f"floating-point arrays")
        if len(set(dtypes)) > 1:
            listed = ", ".join(f"{n}: {d}" for n, d in zip(self.names, dtypes))
            raise TypeError(f"{who}: the leaves of a pytree solution must share one floating dtype (they are solved "
                            f"as one vector); got {listed}. Cast them to one dtype")
        self.dtype = dtypes[0]
        self.shapes = [tuple(int(s) for s in backend.shape(v)) for v in leaves]
        self.sizes = [math.prod(s) for s in self.shapes]

    def _array(self, v):
        return v if self.backend.is_array(v) else asarray(v, backend=self.backend)

    def leaves_of(self, tree, what):
        """``tree``'s leaves, checked against this structure (and shapes): ``what`` names ``tree`` in errors."""
        try:
            leaves = self.treedef.flatten_up_to(tree)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"{self.who}: {what} has structure {optree.tree_structure(tree)}; it must have the "
                            f"solution's structure {self.treedef} ({exc})") from None
        out = []
        for name, shape, v in zip(self.names, self.shapes, leaves):
            v = self._array(v)
            got = tuple(int(s) for s in self.backend.shape(v))
            if got != shape:
                raise ValueError(f"{self.who}: {what} has shape {got} at leaf {name}; it must have the solution's "
                                 f"shape {shape} there")
            out.append(v)
        return out

    def ravel(self, tree, what="the value"):
        """One vector: the leaves of ``tree`` (this structure), flattened and concatenated."""
        leaves = self.leaves_of(tree, what)
        xp = namespace(leaves[0])
        parts = [xp.reshape(v, (-1,)) for v in leaves]
        return parts[0] if len(parts) == 1 else xp.concat(parts)

    def unravel(self, vector):
        """The pytree whose ravelling is ``vector``."""
        xp = namespace(vector)
        leaves, start = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            leaves.append(xp.reshape(vector[start:start + size], shape))
            start += size
        return optree.tree_unflatten(self.treedef, leaves)
