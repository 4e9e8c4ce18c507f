"""Colour a sparsity pattern: the second of the four steps (detect, colour, compress, decompress).

Three problems, each a greedy colouring of a graph built from the pattern (an ``m x n`` boolean
``scipy.sparse`` matrix):

* **column** colouring (forward mode): two columns that share a row get different colours, so the
  columns of one colour are structurally orthogonal and one JVP along their sum recovers them all
  (distance-2 colouring of the bipartite graph = distance-1 colouring of ``A^T A``);
* **row** colouring (reverse mode): the same on ``A^T`` (one VJP per colour);
* **star** colouring (symmetric Hessians, one HVP per colour): a distance-1 colouring of the
  adjacency graph in which every path on four vertices has at least three colours; each non-zero
  is then read directly from one compressed column or, by symmetry, from the other
  (Gebremedhin, Manne and Pothen, "What color is your Jacobian?", SIAM Review 2005).

Greedy colouring depends on the vertex order; each problem tries the natural, largest-first and
smallest-last orders and keeps the one with fewest colours. Column and row colourings are then
improved by *iterated greedy* (Culberson 1992): greedy again, in an order that lists the vertices
colour class by colour class. Each class is independent, so no vertex needs a colour above its
class's rank: a pass never adds a colour, and reordering the classes (reversed, largest first,
shuffled with a fixed seed) often removes one. On the 2-D Brusselator this takes 12 colours to 10.
The passes stop at the densest row's count (a lower bound: its columns pairwise share that row), after
``patience`` passes without a gain, or at ``iterations``; all of it is deterministic. Every colouring
is checked by :func:`unigrad.sparse._decompress.recovery` before it is used: an invalid one is never
returned.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

__all__ = ["Coloring", "column_coloring", "row_coloring", "star_coloring", "ORDERS"]

ORDERS = ("natural", "largest_first", "smallest_last")
#: Iterated greedy: at most this many passes after the best order (``iterations=`` overrides it) ...
ITERATIONS = 60
#: ... stopping after this many passes in a row that removed no colour.
PATIENCE = 10


@dataclass(frozen=True, eq=False)
class Coloring:
    """A colouring of a pattern's columns (``kind="column"``), rows (``"row"``) or of a symmetric
    pattern's vertices (``"star"``).

    Attributes:
      colors: ``int`` array, one colour in ``0..n_colors-1`` per column (row, vertex).
      n_colors: the number of colours: the number of JVPs, VJPs or HVPs a compressed pass costs.
      kind: ``"column"``, ``"row"`` or ``"star"``.
      order: the vertex order whose greedy colouring was the best start.
      passes: the iterated greedy passes run from it (0: the order's colouring as it was).
    """

    colors: np.ndarray
    n_colors: int
    kind: str
    order: str
    passes: int = 0

    def groups(self):
        """The columns (rows, vertices) of each colour: a list of ``n_colors`` index arrays."""
        order = np.argsort(self.colors, kind="stable")
        bounds = np.searchsorted(self.colors[order], np.arange(self.n_colors + 1))
        return [order[bounds[k]:bounds[k + 1]] for k in range(self.n_colors)]

    def __repr__(self):
        return (f"Coloring(kind={self.kind!r}, n_colors={self.n_colors}, order={self.order!r}, passes={self.passes}, "
                f"size={self.colors.size})")


def _csr(pattern):
    from scipy import sparse

    a = sparse.csr_array(pattern, dtype=bool)
    a.sum_duplicates()
    a.eliminate_zeros()
    return a


def _adjacency(graph):
    """``(indptr, indices)`` of a square boolean CSR graph without its diagonal."""
    from scipy import sparse

    g = sparse.csr_array(graph, dtype=bool)
    g.setdiag(False)
    g.eliminate_zeros()
    g.sort_indices()
    return g.indptr, g.indices


def _order(indptr, indices, order):
    n = len(indptr) - 1
    degree = np.diff(indptr)
    if order == "natural":
        return np.arange(n)
    if order == "largest_first":
        return np.argsort(-degree, kind="stable")
    if order == "smallest_last":  # repeatedly remove a vertex of least remaining degree; colour in reverse
        remaining = degree.astype(np.int64).copy()
        removed = np.zeros(n, dtype=bool)
        heap = [(int(d), v) for v, d in enumerate(remaining)]
        heapq.heapify(heap)
        out = []
        while heap:
            d, v = heapq.heappop(heap)
            if removed[v] or d != remaining[v]:
                continue  # a stale entry
            removed[v] = True
            out.append(v)
            for w in indices[indptr[v]:indptr[v + 1]]:
                if not removed[w]:
                    remaining[w] -= 1
                    heapq.heappush(heap, (int(remaining[w]), int(w)))
        return np.array(out[::-1], dtype=np.int64)
    raise ValueError(f"unknown colouring order {order!r}; expected one of {ORDERS}")


def _greedy(indptr, indices, order):
    """Distance-1 greedy colouring of the graph in the given vertex order."""
    n = len(indptr) - 1
    mark = [-1] * (n + 1)  # mark[c] == v: colour c is forbidden for v (a list: NumPy scalars are slow here)
    ip, ix = indptr.tolist(), indices.tolist()
    col = [-1] * n
    for v in order.tolist():
        for w in ix[ip[v]:ip[v + 1]]:
            c = col[w]
            if c >= 0:
                mark[c] = v
        c = 0
        while mark[c] == v:
            c += 1
        col[v] = c
    return np.array(col, dtype=np.int64)


def _best(indptr, indices, kind, orders, color_fn):
    best = None
    for order in orders:
        colors = color_fn(indptr, indices, _order(indptr, indices, order))
        k = int(colors.max()) + 1 if colors.size else 0
        if best is None or k < best.n_colors:
            best = Coloring(colors, k, kind, order)
    return best


def _iterated(indptr, indices, best, bound, iterations, patience=PATIENCE):
    """Iterated greedy from ``best`` (distance-1 colourings only): greedy in an order that takes the
    vertices colour class by colour class, the classes reversed, largest first, or shuffled in turn.
    A pass never uses more colours than the last (Culberson 1992), so the result is never worse."""
    colors, k = best.colors, best.n_colors
    rng = np.random.default_rng(0)  # a fixed seed: one pattern, one colouring
    passes = idle = 0
    while k > bound and passes < iterations and idle < patience:
        if passes % 3 == 0:
            classes = np.arange(k)[::-1]
        elif passes % 3 == 1:
            classes = np.argsort(-np.bincount(colors, minlength=k), kind="stable")
        else:
            classes = rng.permutation(k)
        rank = np.empty(k, dtype=np.int64)
        rank[classes] = np.arange(k)
        colors = _greedy(indptr, indices, np.argsort(rank[colors], kind="stable"))
        passes += 1
        fewer = int(colors.max()) + 1
        idle = 0 if fewer < k else idle + 1
        k = fewer
    return Coloring(colors, k, best.kind, best.order, passes)


def column_coloring(pattern, orders=ORDERS, iterations=None) -> Coloring:
    """Colour the columns of ``pattern`` so that no two columns of one colour share a row.

    Args:
      pattern: an ``m x n`` boolean matrix (``scipy.sparse`` or dense).
      orders: the greedy orders to try (the colouring with fewest colours wins).
      iterations: the most iterated greedy passes from that colouring (default ``ITERATIONS``; 0: none).

    Returns:
      A :class:`Coloring` of the ``n`` columns (``kind="column"``).

    Example:
      >>> import scipy.sparse
      >>> column_coloring(scipy.sparse.diags_array([1, 1, 1], offsets=[-1, 0, 1], shape=(6, 6), dtype=bool)).n_colors
      3
    """
    a = _csr(pattern)
    indptr, indices = _adjacency(a.T @ a)
    best = _best(indptr, indices, "column", orders, _greedy)
    bound = int(np.diff(a.indptr).max(initial=0))  # the densest row's columns pairwise conflict
    return _iterated(indptr, indices, best, bound, ITERATIONS if iterations is None else iterations)


def row_coloring(pattern, orders=ORDERS, iterations=None) -> Coloring:
    """Colour the rows of ``pattern`` so that no two rows of one colour share a column (reverse mode).
    Arguments as :func:`column_coloring`'s.

    Example:
      >>> row_coloring(np.eye(4)).n_colors
      1
    """
    a = _csr(pattern)
    indptr, indices = _adjacency(a @ a.T)
    best = _best(indptr, indices, "row", orders, _greedy)
    bound = int(np.diff(a.T.tocsr().indptr).max(initial=0))  # the densest column's rows
    return _iterated(indptr, indices, best, bound, ITERATIONS if iterations is None else iterations)


def _star(indptr, indices, order):
    """Greedy star colouring (Gebremedhin, Manne and Pothen 2005, algorithm 4.1): v may not take
    the colour of a neighbour, nor a colour that would make a two-coloured path on four vertices."""
    n = len(indptr) - 1
    ip, ix = indptr.tolist(), indices.tolist()
    col = [-1] * n
    mark = [-1] * (n + 1)
    for v in order.tolist():
        for w in ix[ip[v]:ip[v + 1]]:
            cw = col[w]
            if cw >= 0:
                mark[cw] = v
            for x in ix[ip[w]:ip[w + 1]]:
                if x == v:
                    continue
                cx = col[x]
                if cx < 0:
                    continue
                if cw < 0:
                    mark[cx] = v  # v-w-x with w uncoloured: v must differ from x (distance 2)
                else:
                    for y in ix[ip[x]:ip[x + 1]]:
                        if y != w and col[y] == cw:  # v-w-x-y would be two-coloured
                            mark[cx] = v
                            break
        c = 0
        while mark[c] == v:
            c += 1
        col[v] = c
    return np.array(col, dtype=np.int64)


def star_coloring(pattern, orders=ORDERS) -> Coloring:
    """Star colouring of a symmetric pattern (a Hessian's), for compressed HVPs.

    Args:
      pattern: an ``n x n`` boolean matrix; it is symmetrised (``A | A^T``).
      orders: the greedy orders to try.

    Returns:
      A :class:`Coloring` of the ``n`` vertices (``kind="star"``).

    Example:
      >>> import scipy.sparse
      >>> star_coloring(scipy.sparse.diags_array([1, 1, 1], offsets=[-1, 0, 1], shape=(6, 6), dtype=bool)).n_colors
      3
    """
    a = _csr(pattern)
    if a.shape[0] != a.shape[1]:
        raise ValueError(f"star_coloring: the pattern must be square; got shape {a.shape}")
    indptr, indices = _adjacency(a + a.T)
    return _best(indptr, indices, "star", orders, _star)
