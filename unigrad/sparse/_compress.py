"""Compress: the compressed passes, the third of the four steps (detect, colour, compress, decompress).

One JVP, VJP or HVP per colour, vectorised over the colours by the backend's own machinery:

* forward, on a backend with a vectorising ``vmap`` (JAX, torch, TensorFlow): ``backend.map_chunks``
  maps ``backend.jvp`` over the seed tangents (tangent ``k`` is one on the inputs of colour ``k``,
  built on the device from the colours), ``chunk_size`` colours at a time;
* forward, elsewhere (the tape, whose ``jacfwd`` pushes a batch of tangents in one sweep): the
  Jacobian of a function of one entry per colour, ``J S = -d/dz f(x - S z)`` at ``z = 0``, where
  ``S z`` is the gather ``z[color]``. ``x - 0`` is ``x`` exactly for every float, ``-0.0`` included
  (``x + 0`` would turn ``-0.0`` into ``0.0``), hence the minus sign;
* reverse: ``W J = d/dx W f(x)`` by ``backend.jacrev``, ``W f(x)`` the sum of the outputs of each
  colour (a gather of the outputs, padded per colour, then a sum: ``W`` is never built);
* Hessian: the forward pass applied to the gradient (forward over reverse: one HVP per colour).

``compile=True`` compiles the whole kernel. It ends with the gather of ``_decompress.recovery``:
it returns the values of the non-zeros alone.
"""

from __future__ import annotations

import numpy as np

__all__ = ["kernel"]


def _ravel_concat(b, xp, arrays, dtype):
    parts = [xp.reshape(a if b.dtype(a) == dtype else b.cast(a, dtype), (-1,)) for a in arrays]
    return parts[0] if len(parts) == 1 else xp.concat(parts, axis=0)


def _shifted(b, xp, leaves, z, seeds):
    """``x - S z`` for each leaf: ``z[color]`` of the leaf's entries, in the leaf's dtype and shape."""
    out = []
    for x, seed in zip(leaves, seeds):
        shift = xp.take(z, seed)
        if b.dtype(shift) != b.dtype(x):
            shift = b.cast(shift, b.dtype(x))
        out.append(x - xp.reshape(shift, b.shape(x)))
    return tuple(out)


def _ints(a):
    """Index arrays as int32 where they fit: JAX without x64 would truncate int64 anyway (and warn)."""
    return a.astype(np.int32) if a.size == 0 or int(a.max()) < 2 ** 31 - 1 else a


def kernel(plan, chunk_size=None):
    """The kernel ``(backend, flat_f, leaves) -> ((), (values,), ())`` of a :class:`SparsePlan`."""
    mode, c, dtype = plan.mode, plan.coloring.n_colors, plan.dtype

    def run(b, flat_f, leaves):
        xp = b.namespace()
        device = b.device(leaves[0])
        index = b.asarray(_ints(plan.index), device=device)
        if mode == "rev":
            groups = b.asarray(_ints(plan.groups), device=device)  # (c, g): the outputs of each colour, padded

            def weighted(*xs):
                y = _ravel_concat(b, xp, flat_f(*xs), dtype)
                y = xp.concat([y, xp.zeros((1,), dtype=y.dtype, device=device)], axis=0)  # the pad reads 0
                return (xp.sum(xp.reshape(xp.take(y, xp.reshape(groups, (-1,))), b.shape(groups)), axis=1),)

            _, jac, _ = b.jacrev(weighted, tuple(leaves), chunk_size=chunk_size)
            compressed = xp.concat([xp.reshape(blk if b.dtype(blk) == dtype else b.cast(blk, dtype), (c, -1))
                                    for blk in jac[0]], axis=1)  # (c, n)
            return (), (xp.take(xp.reshape(compressed, (-1,)), index),), ()
        function = flat_f if mode == "fwd" else _gradient(b, flat_f)
        seeds = [b.asarray(_ints(s), device=device) for s in plan.seeds]
        if b.capabilities.vmap:  # one JVP per colour, vectorised: each result a row of (c, m)
            colours = b.asarray(_ints(np.arange(c).reshape(c, 1)), device=device)

            def rows(start, stop):  # the seed tangents of colours start:stop, one array per leaf
                return tuple(xp.reshape(b.cast(xp.equal(colours[start:stop], xp.reshape(s, (1, -1))), b.dtype(x)),
                                        (stop - start, *b.shape(x))) for s, x in zip(seeds, leaves))

            def push(*tangents):
                return (_ravel_concat(b, xp, b.jvp(function, tuple(leaves), tangents)[1], dtype),)

            (compressed,) = b.map_chunks(push, rows, c, chunk_size, [((plan.shape[0],), dtype, device)])
            return (), (xp.take(xp.reshape(compressed, (-1,)), index),), ()

        def pushed(z):  # no vectorising map (the tape): its jacfwd pushes a batch of tangents in one sweep
            return (_ravel_concat(b, xp, function(*_shifted(b, xp, leaves, z, seeds)), dtype),)

        _, jac, _ = b.jacfwd(pushed, (b.zeros((c,), dtype, device=device),), chunk_size=chunk_size)
        compressed = xp.permute_dims(jac[0][0], (1, 0))  # (m, c) -> (c, m); minus: see above
        return (), (-xp.take(xp.reshape(compressed, (-1,)), index),), ()

    return run


def _gradient(b, flat_f):
    """The gradient of a flat scalar ``f`` as a flat function (its JVP is an HVP: forward over reverse)."""
    def gradient(*xs):
        outputs, vjp_fn, _ = b.vjp(flat_f, xs, has_aux=False)
        return tuple(vjp_fn((b.ones_like(outputs[0]),)))

    gradient.closure_arrays = getattr(flat_f, "closure_arrays", ())
    return gradient


def seeds_of(colors, shapes):
    """The colours of each leaf's entries (the forward seed ``S`` as a gather index per leaf)."""
    out, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        out.append(colors[start:start + size].astype(np.int64))
        start += size
    return tuple(out)


def groups_of(colors, n_colors, pad):
    """``(n_colors, g)``: the rows of each colour, padded with ``pad`` (an index that reads 0)."""
    counts = np.bincount(colors, minlength=n_colors)
    width = int(counts.max()) if counts.size else 0
    groups = np.full((n_colors, max(width, 1)), pad, dtype=np.int64)
    order = np.argsort(colors, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    for k in range(n_colors):
        members = order[starts[k]:starts[k + 1]]
        groups[k, :members.size] = members
    return groups
