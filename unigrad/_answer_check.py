"""Answers that check themselves: a result computed on the strength of an analysis, checked by one more
product computed another way.

A per-example Jacobian is exact only where the analysis behind its fast path is right: the rows of ``f``
independent (a probe's verdict, a proof over another engine's program, a custom rule whose derivative no
program shows), one example computable alone (a separable shortcut, JAX's row program). One JVP of the
whole batch, with a random tangent on EVERY row, checks all of it: row ``b`` of ``jvp(f, x, t)`` must be
``sum_j J_bj @ t_j[b]`` from the blocks. A flow between rows puts another row's tangent in it, and an
example evaluated at the wrong batch size gives another ``J_b``; either fails the check with probability
one (for a random tangent, the difference is zero only on a set of measure zero). That is the check of
blocks computed in forward mode. Blocks computed in reverse mode are checked the same way by one VJP with a random cotangent on every row:
``vjp(u)[b]`` against ``sum_i J_ib[b]^T @ u_i[b]``: the check runs in the blocks' mode, by the derivative
rules the user gave (a ``custom_vjp`` has no forward mode of its own; its transpose would be no check of
its bwd). The check is skipped where the VJP is not linear in ``u`` (doubling ``u`` does not double it: a
custom rule that clips its cotangent, whose blocks are what unit cotangents give; the probe still runs
there).

The check runs in the transform's own kernel, so a compiled transform checks itself inside the same
compiled program; what comes out is two numbers a row (the difference over its tolerance, and the
relative difference), read on the host in one transfer. The threshold: ``4 sqrt(eps)`` of the row's scale (the largest term that enters
the row's product, ``|J| @ |t|``, or the product itself), plus ``eps`` of the batch's largest scale for
rows whose derivative is zero. Rounding in the two products stays orders of magnitude under it; a
coupling of relative size under about ``4 sqrt(eps)`` (1e-3 in float32, 1e-7 in float64) is not seen.
Complex inputs or outputs are not checked (the blocks follow the house convention for non-holomorphic
functions, which no single JVP reproduces), nor non-finite entries.
"""

from __future__ import annotations

import numpy as np

from ._dtypes import COMPLEX

#: seed of the check's random tangents (a fixed seed: the same tangent for every call of a signature, which
#: ``f`` cannot know, and the same verdict on a rerun)
SEED = 20261207


def checked_kernel(kernel, has_aux: bool, forward: bool = True):
    """``kernel`` (of :func:`unigrad._program.execute`'s form, returning per-example blocks in the order
    output i, input j) whose blocks end with two more arrays: each row's largest difference between the
    blocks and one random JVP (or VJP) of the batch, and the scale it is held to (see the module
    docstring). Where nothing can be checked (complex values), the two arrays are empty. ``forward``:
    the check is a JVP (blocks computed in forward mode), else a VJP: the check runs in the blocks' own
    mode, so it differentiates ``f`` by the rules the user gave (a ``custom_vjp``'s in reverse mode)."""
    def kernel_checked(b, flat_f, leaves):
        outs, blocks, aux = kernel(b, flat_f, leaves)
        dtype = b.dtype(blocks[0]) if blocks else "float64"

        def checked(*_):  # (inside evaluate: the backend's scope for the arrays, JAX's 64-bit mode)
            err, scale = _row_residuals(b, flat_f, tuple(leaves), tuple(outs), tuple(blocks), has_aux, forward)
            return verdicts(b, err, scale, dtype)
        return outs, tuple(blocks) + (b.evaluate(checked, (*leaves, *outs, *blocks)),), aux
    return kernel_checked


def probed_kernel(method, kernel, forward: bool):
    """The check of a shortcut that computes one example alone (``per_example_jacobian``), on a backend
    that can hand back, with the blocks, the product of its one-example function with a given vector on
    each example (``per_example_probe``; ``method(b, flat_f, leaves, probe)`` returns ``(outputs, blocks,
    aux, products)``, products None where it could not): a tangent in forward mode, a cotangent in
    reverse mode, where it is one more pullback of the same forward pass. Row b of those products must
    be row b of one JVP (VJP) of the whole batch: that checks the analysis itself (one example computed
    alone is a row of ``f``), and the blocks come from the same function by the engine's own Jacobian of
    it; the comparison reads arrays the size of the inputs or outputs, never the blocks. ``kernel``: the
    plain kernel, checked by :func:`checked_kernel` where the products are None (complex values, a
    fallback inside the backend)."""
    def kernel_probed(b, flat_f, leaves):
        leaves = tuple(leaves)
        plain = checked_kernel(kernel, False, forward)
        if any(b.dtype(x) in COMPLEX for x in leaves):
            return plain(b, flat_f, leaves)
        if forward:
            vectors = random_vectors(b, leaves)
        else:
            shapes = b.output_shapes(flat_f, leaves)
            dtype = b.dtype(leaves[0])
            vectors = random_vectors(b, [b.zeros(s, dtype, device=b.device(leaves[0])) for s in shapes])
        outs, blocks, aux, products = method(b, flat_f, leaves, vectors)
        if products is None or any(b.dtype(o) in COMPLEX for o in outs):
            return plain(b, flat_f, leaves)
        checked = b.evaluate(lambda *_: _product_verdicts(b, flat_f, leaves, vectors, tuple(outs), tuple(products),
                                                          forward), (*leaves, *outs))
        return outs, blocks + (checked,), aux
    return kernel_probed


def random_directions(b, arrays):
    """The norms check's random direction per parameter (a fixed seed): ``(u, w)`` for a matrix (``V = u
    w^T``: O(d + k) to make and to contract with a dense layer's factors, and any ``<D, u w^T>`` of a
    non-zero D is non-zero with probability one), else an array of its shape."""
    rng = np.random.default_rng(SEED + 2)

    def made(shape, like):
        return b.asarray(rng.standard_normal(shape), dtype=b.dtype(like), device=b.device(like))
    return tuple((made(b.shape(x)[:1], x), made(b.shape(x)[1:], x)) if len(b.shape(x)) == 2 else made(b.shape(x), x)
                 for x in arrays)


def random_vectors(b, arrays):
    """The check's random vectors, shaped like ``arrays`` (a fixed seed)."""
    rng = np.random.default_rng(SEED)
    return tuple(b.asarray(rng.standard_normal(b.shape(x)), dtype=b.dtype(x), device=b.device(x)) for x in arrays)


def _product_verdicts(b, flat_f, leaves, vectors, outs, products, forward):
    """:func:`verdicts` of the one-example ``products`` against one JVP (VJP) of the whole batch."""
    xp = b.namespace()
    batch = b.shape(leaves[0])[0]
    if forward:
        _, full, _ = b.jvp(flat_f, leaves, vectors, has_aux=False)
    else:
        _, vjp_fn, _ = b.vjp(flat_f, leaves, has_aux=False)
        full = vjp_fn(tuple(xp.astype(v, o.dtype) if b.dtype(v) != b.dtype(o) else v for v, o in zip(vectors, outs)))
    errs, scales = [], []
    for got, want in zip(full, products):
        size = int(np.prod(b.shape(got)[1:], dtype=np.int64))
        if size == 0:
            continue
        got, want = xp.reshape(got, (batch, size)), xp.reshape(want, (batch, size))
        want = xp.astype(want, got.dtype) if b.dtype(want) != b.dtype(got) else want
        errs.append(_finite_row_max(xp, xp.abs(got - want)))
        scales.append(_finite_row_max(xp, xp.maximum(xp.abs(got), xp.abs(want))))
    if not errs:
        return b.asarray(np.zeros((2, 0), np.float32))
    return verdicts(b, _largest(xp, errs), _largest(xp, scales), b.dtype(outs[0]))


def rows_verdicts(b, flat_f, leaves, outs, rows, batch: int):
    """The check of per-example gradient rows read from ``f``'s program (dense layers by their rules): with a
    random weight ``r_b`` per example, ``sum_b r_b rows[b]`` must be the VJP of the losses with cotangent
    ``r`` (one backward pass of the batch). A row given to the wrong example, a layer's formula that does
    not hold for ``f``, show with probability one. :func:`verdicts`' array of one row."""
    xp = b.namespace()
    losses = outs[0]
    rng = np.random.default_rng(SEED)
    weights = b.asarray(rng.standard_normal((batch,)), dtype=b.dtype(losses), device=b.device(losses))
    _, vjp_fn, _ = b.vjp(flat_f, leaves, has_aux=False)
    full = vjp_fn((weights,) + tuple(xp.zeros_like(o) for o in outs[1:]))
    errs, scales = [], []
    for g, row in zip(full, rows):
        size = int(np.prod(b.shape(g), dtype=np.int64))
        if size == 0:
            continue
        row = xp.reshape(row, (batch, size))
        w = xp.reshape(weights, (batch, 1))
        w = xp.astype(w, row.dtype) if b.dtype(w) != b.dtype(row) else w
        g = xp.reshape(g, (size,))
        g = xp.astype(g, row.dtype) if b.dtype(g) != b.dtype(row) else g
        predicted = xp.sum(row * w, axis=0)
        errs.append(xp.max(xp.abs(g - predicted)))
        scales.append(xp.maximum(xp.max(xp.abs(g)), xp.max(xp.sum(xp.abs(row) * xp.abs(w), axis=0))))
    if not errs:
        return b.asarray(np.zeros((2, 0), np.float32))
    err = xp.reshape(xp.max(xp.stack(errs)), (1,))
    scale = xp.reshape(xp.max(xp.stack(scales)), (1,))
    return verdicts(b, err, scale, b.dtype(rows[0]))


def norm_weights(b, batch: int, like):
    """The norms check's random weight per example (a fixed seed), in ``like``'s dtype and device."""
    rng = np.random.default_rng(SEED + 1)
    return b.asarray(rng.standard_normal((batch,)), dtype=b.dtype(like), device=b.device(like))


def norms_verdicts(b, flat_f, leaves, outs, norms, dots, directions, weights, engine=None):
    """The check of per-example gradient norms read from factors (a dense layer's ``|x_i|^2 |g_i|^2``, a
    ghost norm): the formula that gives each norm gives, from the same factors, each example's ``<g_i, V>``
    for a random ``V`` per parameter (``dots``). With a random weight ``r_i`` per example (``weights``),
    ``sum_i r_i <g_i, V>`` must be ``<VJP(r), V>``, the gradient of ``sum_i r_i loss_i`` by the engine's
    own backward pass -- the same derivative rules the rows check reads (torch's ``padding_idx`` gives its
    row no gradient, which a JVP would not know). ``engine``: that number where the reader computed it on
    the recording it already had (``layers.direction_dot``: no second forward pass), else one VJP here.
    A factor read for the wrong example, a layer whose formula does not hold for ``f``, show with
    probability one. The scale: ``sum_i |r_i| |g_i| |V|`` (from the norms: it bounds the products'
    magnitudes). :func:`verdicts`' array of one row."""
    xp = b.namespace()
    dtype = b.dtype(dots)

    def same(a):
        return xp.astype(a, dots.dtype) if b.dtype(a) != dtype else a

    size = None
    for v in directions:
        sq = xp.sum(same(v[0]) ** 2) * xp.sum(same(v[1]) ** 2) if isinstance(v, tuple) else \
            xp.sum(xp.reshape(same(v) * same(v), (-1,)))
        size = sq if size is None else size + sq
    if engine is None:
        _, vjp_fn, _ = b.vjp(flat_f, leaves, has_aux=False)
        full = vjp_fn((xp.astype(weights, outs[0].dtype),) + tuple(xp.zeros_like(o) for o in outs[1:]))
        for g, v in zip(full, directions):
            if isinstance(v, tuple):  # V = u w^T (random_directions)
                u, w = (same(a) for a in v)
                term = xp.sum(xp.matmul(same(g), w) * u)
            else:
                term = xp.sum(xp.reshape(same(g) * same(v), (-1,)))
            engine = term if engine is None else engine + term
    engine = xp.reshape(same(engine), (-1,))[:1]
    w = same(weights)
    err = xp.reshape(xp.abs(engine - xp.sum(w * dots)), (1,))
    scale = xp.reshape(xp.sum(xp.abs(w) * same(norms)) * xp.sqrt(size) + xp.abs(engine), (1,))
    return verdicts(b, err, scale, dtype)


def _eps(dtype: str) -> float:
    if dtype == "bfloat16":
        return 2.0 ** -7
    return float(np.finfo(np.float64 if dtype in ("float64", "complex128") else
                          np.float16 if dtype == "float16" else np.float32).eps)


def verdicts(b, err, scale, dtype: str):
    """One array of shape ``(2, B)`` (one read on the host): each row's difference over its tolerance
    (positive: the check failed), and its relative difference. Empty where nothing was checked."""
    xp = b.namespace()
    if b.shape(err)[0] == 0:
        return b.asarray(np.zeros((2, 0), np.float32))
    eps = _eps(dtype)
    tolerance = float(4.0 * np.sqrt(eps)) * scale + eps * xp.max(scale)
    tiny = float(np.finfo(np.float32).tiny)
    relative = err / (scale + tiny)
    return xp.stack([err - tolerance, relative])


def row_residuals(b, flat_f, leaves, outs, blocks, has_aux, forward=True):
    """``(err, scale)``, arrays of the batch size: row b's largest difference between the per-example
    ``blocks`` (``blocks[i * len(leaves) + j]`` of shape ``(B, *out_i[1:], *in_j[1:])``) and one product
    of ``f`` with random vectors on every row, and the scale that difference is held to. Computed through
    ``b.evaluate``, which sets up what the arrays need (JAX's scoped 64-bit mode for float64 arrays)."""
    return b.evaluate(lambda *_: _row_residuals(b, flat_f, leaves, outs, blocks, has_aux, forward),
                      (*leaves, *outs, *blocks))


def _row_residuals(b, flat_f, leaves, outs, blocks, has_aux, forward):
    xp = b.namespace()
    batch = b.shape(leaves[0])[0]
    if any(b.dtype(a) in COMPLEX for a in (*leaves, *outs)) or not outs:
        empty = b.asarray(np.zeros((0,), np.float32))
        return empty, empty
    rng = np.random.default_rng(SEED)
    n_in = [int(np.prod(b.shape(x)[1:], dtype=np.int64)) for x in leaves]
    n_out = [int(np.prod(b.shape(o)[1:], dtype=np.int64)) for o in outs]
    n = len(leaves)
    tangents = tuple(b.asarray(rng.standard_normal(b.shape(x)), dtype=b.dtype(x), device=b.device(x)) for x in leaves)
    if forward:
        _, products, _ = b.jvp(flat_f, leaves, tangents, has_aux=has_aux)
        vectors, along, others, sizes, others_sizes = tangents, range(len(outs)), range(n), n_in, n_out
        nonlinear = []
    else:
        cotangents = tuple(b.asarray(rng.standard_normal(b.shape(o)), dtype=b.dtype(o), device=b.device(o))
                           for o in outs)
        _, vjp_fn, _ = b.vjp(flat_f, leaves, has_aux=has_aux)
        products = vjp_fn(cotangents)
        # A custom VJP whose bwd is not linear in its cotangent (gradient clipping) has no Jacobian that one
        # VJP could check: the check is skipped where doubling the cotangent does not double the VJP.
        doubled = vjp_fn(tuple(c + c for c in cotangents))
        nonlinear = [_nonlinearity(xp, b, p, d) for p, d in zip(products, doubled) if _size(b, p)]
        vectors, along, others, sizes, others_sizes = cotangents, range(n), range(len(outs)), n_out, n_in
    errs, scales = [], []
    for p in along:  # an output (forward) or an input (reverse) of the product
        if others_sizes[p] == 0:
            continue
        got = xp.reshape(products[p], (batch, others_sizes[p]))
        want = abs_want = None
        for q in others:
            if sizes[q] == 0:
                continue
            block = blocks[p * n + q] if forward else blocks[q * n + p]
            # forward: J (out_p, in_q) @ t_q; reverse: J (out_q, in_p) transposed @ u_q (a sum over out_q)
            shape, axis = ((batch, others_sizes[p], sizes[q]), 2) if forward else ((batch, sizes[q], others_sizes[p]), 1)
            block = xp.reshape(block, shape)
            v = xp.reshape(vectors[q], (batch, 1, sizes[q]) if forward else (batch, sizes[q], 1))
            v = xp.astype(v, block.dtype) if b.dtype(vectors[q]) != b.dtype(block) else v
            term = xp.sum(block * v, axis=axis)
            abs_term = xp.sum(xp.abs(block) * xp.abs(v), axis=axis)
            want = term if want is None else want + term
            abs_want = abs_term if abs_want is None else abs_want + abs_term
        got = xp.astype(got, want.dtype) if want is not None and b.dtype(got) != b.dtype(want) else got
        if want is None:  # every input of this output is empty: the product must be zero
            want = abs_want = xp.zeros_like(got)
        errs.append(_finite_row_max(xp, xp.abs(got - want)))
        scales.append(_finite_row_max(xp, xp.maximum(xp.abs(got), abs_want)))
    if not errs:
        empty = b.asarray(np.zeros((0,), np.float32))
        return empty, empty
    err, scale = _largest(xp, errs), _largest(xp, scales)
    for flag in nonlinear:  # (zero differences: nothing checked)
        err = xp.where(flag, xp.zeros_like(err), err)
    return err, scale


def _finite_row_max(xp, values):
    """Each row's largest finite entry of ``values`` (shape ``(B, n)``; non-finite entries count as 0: not
    compared)."""
    return xp.max(xp.where(xp.isfinite(values), values, xp.zeros_like(values)), axis=1)


def _largest(xp, arrays):
    """The elementwise largest of arrays of one shape."""
    return arrays[0] if len(arrays) == 1 else xp.max(xp.stack(arrays), axis=0)


def _size(b, x):
    return int(np.prod(b.shape(x), dtype=np.int64))


def _nonlinearity(xp, b, once, doubled):
    """A 0-d boolean: does ``doubled`` (the VJP of twice the cotangent) differ from twice ``once`` by more
    than rounding?"""
    eps = float(np.finfo(np.float64 if b.dtype(once) == "float64" else np.float32).eps)
    diff = xp.abs(doubled - (once + once))
    size = xp.abs(doubled) + xp.abs(once + once)
    finite = xp.isfinite(diff) & xp.isfinite(size)
    zero = xp.zeros_like(diff)
    return xp.max(xp.where(finite, diff, zero)) > float(4.0 * np.sqrt(eps)) * xp.max(xp.where(finite, size, zero))


def failed_rows(b, checked):
    """The rows whose check failed (a list of ints, empty where every row agrees) and the worst relative
    difference among them, from :func:`verdicts`' array."""
    if 0 in tuple(b.shape(checked)):  # nothing was checked: no read (a transfer that waits for the program)
        return [], 0.0
    checked = np.asarray(b.to_numpy(checked), dtype=np.float64)
    bad = np.flatnonzero(checked[0] > 0)
    return [int(r) for r in bad], (float(checked[1][bad].max()) if bad.size else 0.0)


def describe_rows(rows) -> str:
    """``rows`` as a short phrase: "rows 0, 2 and 5" (the first ten, then how many more)."""
    shown = ", ".join(str(r) for r in rows[:10])
    more = f" and {len(rows) - 10} more" if len(rows) > 10 else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"
