"""The per-example layer rules: what a backend's ``per_example_rows`` (``unigrad.Backend``) builds on.

The names of the ways a parameter's rows are computed (shown in ``.paths``), the check of the
per-example losses, and the formulas shared by every engine: a matrix product's rows ``X_i^T G_i`` and
their norms without forming them (``|x_i|^2 |g_i|^2``; ghost norms ``sum((X_i X_i^T) * (G_i G_i^T))``
over positions), a broadcast bias's or scale's rows, the norm over all parameters, and the
materialised rows (Jacobian rows of the losses) of parameters no rule covers. Each formula takes an
:class:`Ops` of the engine's array functions, so one formula serves NumPy, torch, JAX, TensorFlow and
a plugin's arrays."""

from __future__ import annotations

MATERIALISED = "materialised"
DENSE_OUTER = "dense: |x|^2 |g|^2"
DENSE_GHOST = "dense: ghost (X X^T) * (G G^T)"
DENSE = "dense: X^T G"
BIAS = "bias: G summed"
SCALE = "scale: G * Z summed"
CONV = "conv: weight gradient, the examples as groups"
CONV_GHOST = "conv: ghost (U U^T) * (G G^T)"
EMBEDDING = "embedding: G added into the looked-up rows"
EMBEDDING_GHOST = "embedding: ghost [idx = idx'] * (G G^T)"
NORM = "norm: xhat * G summed"
SHARED = "shared: uses stacked along positions"
SHARED_SUMMED = "shared: each use's rows summed"


def check_losses(b, outs, batch, fname):
    if len(outs) != 1 or b.shape(outs[0]) != (batch,):
        got = ", ".join(f"shape {b.shape(o)}" for o in outs) if len(outs) != 1 else f"shape {b.shape(outs[0])}"
        hint = (" (a loss summed or averaged over the batch cannot be split into examples by its value: "
                "return the per-example losses, without the final sum or mean)") if (
            len(outs) == 1 and b.shape(outs[0]) == ()) else ""
        raise ValueError(f"{fname}: f must return one loss per example, an array of shape ({batch},); got "
                         f"{got}{hint}")
    if b.dtype(outs[0]) not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"{fname}: f must return real floating losses; got dtype {b.dtype(outs[0])}")


# ---------------------------------------------------------------------------------------------
# The rows of dense layers, from X (the layer's input) and G (the gradient at its output), on any engine
# ---------------------------------------------------------------------------------------------

class Ops:
    """The few array operations the shared formulas need, for one engine (each engine's module makes one):
    ``reshape(a, shape)``, ``sum(a, axes, keepdims)``, ``matmul(a, b)`` (batched), ``mT(a)`` (swap the last
    two axes), ``cast(a, dtype)`` (contiguous where the engine has the notion), ``sqrt(a)``."""
    __slots__ = ("reshape", "sum", "matmul", "mT", "cast", "sqrt")

    def __init__(self, reshape, sum, matmul, mT, cast, sqrt):
        self.reshape, self.sum, self.matmul, self.mT, self.cast, self.sqrt = reshape, sum, matmul, mT, cast, sqrt


def matmul_rows(ops, x, g, batch, norms, transposed, dtype):
    """``(rows or None, squared norms or None, path)`` of the parameter W of ``Y = X @ W`` (or ``X @ W.T``
    when ``transposed``) from X and ``G = d sum(losses) / d Y``, both with the batch on axis 0 and any
    positions between it and their last axis. Norms: ``|x_i|^2 |g_i|^2`` for one position, the ghost
    ``sum((X_i X_i^T) * (G_i G_i^T))`` when ``P^2 <= d k``, else the rows ``X_i^T G_i`` themselves."""
    d, k = int(x.shape[-1]), int(g.shape[-1])
    xs = ops.reshape(x, (batch, -1, d))
    gs = ops.reshape(g, (batch, -1, k))
    positions = int(xs.shape[1])
    if norms and positions == 1:
        sq = ops.sum(xs[:, 0] ** 2, (1,), False) * ops.sum(gs[:, 0] ** 2, (1,), False)
        return None, ops.cast(sq, dtype), DENSE_OUTER
    if norms and positions * positions <= d * k:
        xx = ops.matmul(xs, ops.mT(xs))
        gg = ops.matmul(gs, ops.mT(gs))
        return None, ops.cast(ops.sum(ops.reshape(xx * gg, (batch, -1)), (1,), False), dtype), DENSE_GHOST
    rows = ops.matmul(ops.mT(xs), gs)  # (B, d, k): X_i^T G_i
    if transposed:
        rows = ops.mT(rows)
    return ops.cast(rows, dtype), None, DENSE


def matmul_dots(ops, x, g, batch, transposed, direction):
    """Each example's ``<X_i^T G_i, V>`` (``V`` in the parameter's shape: ``(d, k)``, or ``(k, d)`` when
    ``transposed``), from the same X and G as :func:`matmul_rows`' norms, without the rows: the sum over
    positions of ``(X_i V) * G_i``. ``direction``: ``V``, or a pair ``(u, w)`` for ``V = u w^T`` (then the
    sum of ``(X_i a) (G_i c)``, ``O(d + k)`` a position). The check of norms read from factors
    (:func:`unigrad._answer_check.norms_verdicts`)."""
    d, k = int(x.shape[-1]), int(g.shape[-1])
    xs, gs = ops.reshape(x, (-1, d)), ops.reshape(g, (-1, k))
    if isinstance(direction, tuple):
        u, w = direction
        a, c = (w, u) if transposed else (u, w)  # a along X's last axis, c along G's
        xa = ops.matmul(xs, ops.reshape(ops.cast(a, g.dtype), (d, 1)))
        gc = ops.matmul(gs, ops.reshape(ops.cast(c, g.dtype), (k, 1)))
        return ops.sum(ops.reshape(xa * gc, (batch, -1)), (1,), False)
    v = ops.mT(direction) if transposed else direction
    xv = ops.matmul(xs, ops.cast(v, g.dtype))  # (B * positions, k)
    return ops.sum(ops.reshape(xv * gs, (batch, -1)), (1,), False)


def rows_dots(ops, rows, direction, batch):
    """Each example's ``<rows_i, V>`` (``direction``: V, or ``(u, w)`` for ``V = u w^T``)."""
    if isinstance(direction, tuple):
        u, w = direction
        n0, n1 = int(u.shape[0]), int(w.shape[0])
        rw = ops.matmul(ops.reshape(rows, (-1, n1)), ops.reshape(ops.cast(w, rows.dtype), (n1, 1)))
        return ops.sum(ops.reshape(rw, (batch, n0)) * ops.reshape(ops.cast(u, rows.dtype), (1, n0)), (1,), False)
    return ops.sum(ops.reshape(rows * ops.cast(direction, rows.dtype), (batch, -1)), (1,), False)


def direction_dot(ops, grads, directions, dtype):
    """``sum_k <grads_k, V_k>`` as an array of shape ``(1,)`` (``directions``: V, or ``(u, w)`` for ``V = u
    w^T``): the engine's side of the norms check, from a gradient of ``sum_i r_i loss_i`` the reader
    computed on the recording it already has (:func:`unigrad._answer_check.norms_verdicts`)."""
    total = None
    for g, v in zip(grads, directions):
        g = ops.cast(g, dtype)
        if isinstance(v, tuple):
            u, w = (ops.cast(a, dtype) for a in v)
            gw = ops.matmul(g, ops.reshape(w, (int(w.shape[0]), 1)))
            term = ops.sum(ops.reshape(gw, (-1,)) * u, (0,), False)
        else:
            term = ops.sum(ops.reshape(g * ops.cast(v, dtype), (-1,)), (0,), False)
        total = term if total is None else total + term
    return ops.reshape(total, (1,))


def total_dots(ops, dots, rows, directions, batch):
    """Each example's ``sum_k <row_k, V_k>`` over the parameters: ``dots[k]`` where a factor formula gave
    it, else from ``rows[k]``; None where a parameter has neither (its norm came from a formula that gives
    no dot: the norms then go unchecked)."""
    total = None
    for dot, r, v in zip(dots, rows, directions):
        if dot is None:
            if r is None:
                return None
            dot = rows_dots(ops, r, v, batch)
        total = dot if total is None else total + ops.cast(dot, total.dtype)
    return total


def broadcast_rows(ops, kind, g, other, shape, out_shape, sign, batch):
    """``(rows, path)`` of a parameter of ``shape`` broadcast into ``Y = Z + b`` (``kind`` "bias") or
    ``Y = Z * s`` ("scale", ``other`` is Z) of ``out_shape``: G (times Z) summed over the broadcast axes,
    negated for ``Z - b``; rows of shape ``(batch, *shape)`` in G's dtype."""
    contribution = g if kind == "bias" else g * other
    nd = len(out_shape)
    padded = (1,) * (nd - len(shape)) + tuple(shape)
    axes = tuple(a for a in range(1, nd) if padded[a] == 1 and out_shape[a] != 1)
    if axes:
        contribution = ops.sum(contribution, axes, True)
    rows = ops.reshape(contribution, (batch, *shape))
    if sign != 1.0:
        rows = -rows
    return rows, BIAS if kind == "bias" else SCALE


def total_norms(ops, squares, rows, batch):
    """sqrt of the sum over parameters of each example's squared norm: ``squares[k]`` where a dense
    formula gave it, else from ``rows[k]``."""
    total = None
    for sq, r in zip(squares, rows):
        if sq is None:
            sq = ops.sum(ops.reshape(r * r, (batch, -1)), (1,), False)
        total = sq if total is None else total + sq
    return ops.sqrt(total)


def materialise(b, flat_f, leaves, slow, rows, fixed=None):
    """The parameters at positions ``slow`` materialised: their rows as the Jacobian rows of the losses
    (``jacrev``, vectorised over the examples' cotangents; about B backward passes), written into
    ``rows``. ``fixed``: the other arguments as ``f`` sees them (default ``leaves``). Returns ``f``'s
    outputs."""
    from .._transform import promoted_blocks

    fixed = leaves if fixed is None else fixed

    def of_slow(*values):
        merged = list(fixed)
        for k, v in zip(slow, values):
            merged[k] = v
        return flat_f(*merged)

    outs, jac, _ = b.jacrev(of_slow, [leaves[k] for k in slow])
    for k, r in zip(slow, promoted_blocks(b, outs, [leaves[k] for k in slow], jac)[0]):
        rows[k] = r
    return outs
