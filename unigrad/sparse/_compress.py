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

from .._answer_check import SEED, verdicts

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


def kernel(plan, chunk_size=None, has_aux=False):
    """The kernel ``(backend, flat_f, leaves) -> ((), (values, checked), aux)`` of a :class:`SparsePlan`:
    ``checked`` the check of the values against one more product of ``f`` (:func:`check_values`,
    :func:`verdict_of`; in the vectorised forward passes the check's tangent is one more row of their map).

    With ``has_aux``, ``flat_f`` returns ``(outputs, aux)``: the aux leaves come from a pass the
    kernel runs anyway where one returns them (the reverse passes, the tape's forward sweep), else from
    one plain evaluation of ``f`` (the vectorised JVPs would return one copy per colour).
    """
    mode, c, dtype = plan.mode, plan.coloring.n_colors, plan.dtype

    def run(b, flat_f, leaves):
        xp = b.namespace()
        device = b.device(leaves[0])
        leaves = tuple(leaves)
        index = b.asarray(_ints(plan.index), device=device)
        main = outputs_only(flat_f) if has_aux else flat_f
        if mode == "rev":
            groups = b.asarray(_ints(plan.groups), device=device)  # (c, g): the outputs of each colour, padded

            def weighted(*xs):
                outputs, aux = flat_f(*xs) if has_aux else (flat_f(*xs), None)
                y = _ravel_concat(b, xp, outputs, dtype)
                y = xp.concat([y, xp.zeros((1,), dtype=y.dtype, device=device)], axis=0)  # the pad reads 0
                sums = (xp.sum(xp.reshape(xp.take(y, xp.reshape(groups, (-1,))), b.shape(groups)), axis=1),)
                return (sums, aux) if has_aux else sums

            weighted.closure_arrays = getattr(flat_f, "closure_arrays", ())
            _, jac, aux = b.jacrev(weighted, leaves, chunk_size=chunk_size, has_aux=has_aux)
            compressed = xp.concat([xp.reshape(blk if b.dtype(blk) == dtype else b.cast(blk, dtype), (c, -1))
                                    for blk in jac[0]], axis=1)  # (c, n)
            values = xp.take(xp.reshape(compressed, (-1,)), index)
            return (), (values, check_values(plan, b, flat_f, leaves, values, has_aux)), aux or ()
        function = main if mode == "fwd" else _gradient(b, main)
        seeds = [b.asarray(_ints(s), device=device) for s in plan.seeds]
        if b.capabilities.vmap:  # one JVP per colour, vectorised: each result a row of (c, m)
            # The seed tangents, made once per plan on the host (constants of a compiled program). Built
            # in the program instead (``colour == k``), XLA fused that comparison into every consumer of
            # the tangent: 2x slower than asdex on the Brusselator, N = 32, against 0.7x with constants.
            host = tangents_of(plan, b, leaves)
            # the check's tangent v rides as one more row of the same vectorised map (its J v checks the
            # values: verdict_of); where the seeds are bool (a dtype NumPy lacks) or complex, check_values
            host, n_rows = _with_check_row(plan, host)
            tangents = tuple(b.asarray(t, device=device) for t in host)

            def rows(start, stop):  # the seed tangents of colours start:stop, one array per leaf
                return tuple(t[start:stop] if b.dtype(t) == b.dtype(x) else b.cast(t[start:stop], b.dtype(x))
                             for t, x in zip(tangents, leaves))

            linear, aux = _by_reverse(b, mode, flat_f, leaves, dtype, has_aux)
            if linear is not None:
                def push(*tangents):
                    return (_ravel_concat(b, xp, linear(tangents), dtype),)
            else:
                aux = plain_aux(b, flat_f, leaves) if has_aux else ()

                def push(*tangents):
                    return (_ravel_concat(b, xp, b.jvp(function, leaves, tangents)[1], dtype),)

            (compressed,) = b.map_chunks(push, rows, n_rows, chunk_size, [((plan.shape[0],), dtype, device)])
            if n_rows == c:
                values = xp.take(xp.reshape(compressed, (-1,)), index)
                return (), (values, check_values(plan, b, flat_f, leaves, values, has_aux)), aux
            values = xp.take(xp.reshape(compressed[:c], (-1,)), index)
            u = b.asarray(check_vectors(plan)[0], dtype=dtype, device=device)
            return (), (values, verdict_of(b, xp, plan, values, compressed[c], u, dtype)), aux

        def pushed(z):  # no vectorising map (the tape): its jacfwd pushes a batch of tangents in one sweep
            shifted = _shifted(b, xp, leaves, z, seeds)
            if has_aux and mode == "fwd":
                outputs, aux = flat_f(*shifted)
                return (_ravel_concat(b, xp, outputs, dtype),), aux
            values = (_ravel_concat(b, xp, function(*shifted), dtype),)
            return (values, plain_aux(b, flat_f, shifted)) if has_aux else values

        _, jac, aux = b.jacfwd(pushed, (b.zeros((c,), dtype, device=device),), chunk_size=chunk_size,
                               has_aux=has_aux)
        compressed = xp.permute_dims(jac[0][0], (1, 0))  # (m, c) -> (c, m); minus: see above
        values = -xp.take(xp.reshape(compressed, (-1,)), index)
        return (), (values, check_values(plan, b, flat_f, leaves, values, has_aux)), aux or ()

    return run


def outputs_only(flat_f):
    """A flat ``f`` with ``has_aux`` as one without: its outputs alone."""
    def main(*xs):
        return flat_f(*xs)[0]

    main.closure_arrays = getattr(flat_f, "closure_arrays", ())
    return main


def plain_aux(b, flat_f, leaves):
    """The aux leaves of one plain evaluation of ``f`` (arrays detached from any transform)."""
    _, aux = b.evaluate(flat_f, tuple(leaves))
    return tuple(b.stop_gradient(a) if b.is_array(a) else a for a in aux)




def _by_reverse(b, mode, flat_f, leaves, dtype, has_aux):
    """``(tangents -> J tangents, aux)`` from reverse passes alone, or ``(None, ())`` where the backend's
    own JVP is used.

    Forward (``J t``): the VJP ``u -> J^T u`` is linear in ``u``, so its own VJP at any ``u`` (zero
    here) with cotangent ``t`` is ``J t``: one forward pass and the graph of its VJP once per call,
    then one reverse pass of that graph per colour (vectorised). Star (``H t``): ``H`` is symmetric,
    so ``H t`` is the VJP of the gradient with cotangent ``t`` (reverse over reverse). Real dtypes
    only (a complex ``J^T u`` is conjugate-linear in ``u``); elsewhere the backend's JVP.
    """
    if not b.forward_by_reverse or "complex" in str(dtype) or not b.capabilities.higher_order:
        return None, ()
    if mode == "star":
        _, pullback, aux = b.vjp(_gradient(b, flat_f, has_aux), leaves, has_aux=has_aux)
        return pullback, aux or ()
    outputs, vjp_fn, aux = b.vjp(flat_f, leaves, has_aux=has_aux)

    def transpose_me(*cotangents):
        return tuple(vjp_fn(cotangents))

    _, transposed, _ = b.vjp(transpose_me, tuple(b.zeros_like(o) for o in outputs), has_aux=False)
    return transposed, aux or ()


def _gradient(b, flat_f, has_aux=False):
    """The gradient of a flat scalar ``f`` as a flat function (its JVP is an HVP: forward over reverse);
    with ``has_aux`` it returns ``(gradient, aux)``."""
    def gradient(*xs):
        outputs, vjp_fn, aux = b.vjp(flat_f, xs, has_aux=has_aux)
        grads = tuple(vjp_fn((b.ones_like(outputs[0]),)))
        return (grads, aux) if has_aux else grads

    gradient.closure_arrays = getattr(flat_f, "closure_arrays", ())
    return gradient


def _with_check_row(plan, host):
    """``(tangents, rows)``: the seed tangents with the check's ``v`` as one more row (``rows = c + 1``), or as
    they are (``rows = c``) where their dtype cannot hold it (bool seeds, complex)."""
    c = plan.coloring.n_colors
    if any(t.dtype.kind not in "f" for t in host) or not plan.checked:
        return host, c
    key = ("check rows", tuple((t.dtype.str, t.shape) for t in host))
    cached = plan.cache.get(key)
    if cached is None:
        v, out, offset = check_vectors(plan)[1], [], 0
        for t in host:
            size = int(np.prod(t.shape[1:], dtype=np.int64))
            row = v[offset:offset + size].astype(t.dtype).reshape(1, *t.shape[1:])
            out.append(np.ascontiguousarray(np.concatenate([t, row])))
            offset += size
        cached = plan.cache[key] = tuple(out)
    return cached, c + 1


def tangents_of(plan, b, leaves):
    """The seed tangents of the forward passes, one NumPy array ``(c, *leaf.shape)`` per leaf (one-hot in
    the colour: ``S[k]`` is one on the inputs of colour ``k``), in the leaf's dtype where NumPy has it
    (else bool, cast on the backend), made once per plan and dtype."""
    key = tuple((b.dtype(x), tuple(b.shape(x))) for x in leaves)
    cached = plan.cache.get(("tangents", key))
    if cached is None:
        c, out = plan.coloring.n_colors, []
        for seed, (dtype, shape) in zip(plan.seeds, key):
            try:
                np_dtype = np.dtype(dtype)
            except TypeError:
                np_dtype = np.dtype(bool)
            onehot = np.arange(c, dtype=np.int64).reshape(c, 1) == seed.reshape(1, -1)
            out.append(np.ascontiguousarray(onehot.astype(np_dtype).reshape(c, *shape)))
        cached = plan.cache[("tangents", key)] = tuple(out)
    return cached


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


def check_vectors(plan):
    """``(u, v, w)``, NumPy float64, made once per plan: the check's random ``u`` (outputs) and ``v``
    (inputs), and ``w = u[row] * v[column]`` for each non-zero (CSR order), so that ``u^T J v`` from the
    sparse values is ``values @ w``."""
    cached = plan.cache.get("check")
    if cached is None:
        m, n = plan.shape
        rng = np.random.default_rng(SEED)
        u, v = rng.standard_normal(m), rng.standard_normal(n)
        cached = plan.cache["check"] = (u, v, u[plan.structure.rows] * v[plan.structure.indices])
    return cached


def verdict_of(b, xp, plan, values, product, against, dtype):
    """:func:`~unigrad._answer_check.verdicts` of ``u^T J v`` from the sparse ``values`` against
    ``product . against`` (``J v . u``, or ``u^T J . v``)."""
    device = b.device(values)
    w = b.asarray(check_vectors(plan)[2], dtype=dtype, device=device)

    def verdict(*_):  # (inside evaluate: the backend's scope for the arrays, JAX's 64-bit mode)
        terms = values * w
        engine = product * against
        err = xp.reshape(xp.abs(xp.sum(engine) - xp.sum(terms)), (1,))
        scale = xp.reshape(xp.sum(xp.abs(terms)) + xp.sum(xp.abs(engine)), (1,))
        return verdicts(b, err, scale, dtype)
    return b.evaluate(verdict, (values, product, against, w))


def check_values(plan, b, flat_f, leaves, values, has_aux):
    """The sparse result checks itself (:mod:`unigrad._answer_check`): with random ``u`` (outputs) and ``v``
    (inputs), ``u^T J v`` from the decompressed ``values`` (a sum over the pattern's non-zeros: gathers
    only) against the same number from one JVP (``J v``; an HVP for a Hessian) or, in reverse mode, one
    VJP (``u^T J``) of ``f``. A non-zero the pattern misses (a detected pattern that an analysis got
    wrong, a given one that is too small) makes them differ with probability one. Returns
    :func:`~unigrad._answer_check.verdicts`' array of one row (empty for complex values)."""
    xp = b.namespace()
    dtype = plan.dtype
    if "complex" in str(dtype) or plan.nnz == 0 or not plan.checked:  # (not checked: proved, SparsePlan)
        return b.asarray(np.zeros((2, 0), np.float32))
    device = b.device(leaves[0])
    u_host, v_host, _ = check_vectors(plan)
    u, v = b.asarray(u_host, dtype=dtype, device=device), b.asarray(v_host, dtype=dtype, device=device)
    main = outputs_only(flat_f) if has_aux else flat_f
    tangents, offset = [], 0
    for x in leaves:
        size = int(np.prod(b.shape(x), dtype=np.int64))
        tangents.append(b.asarray(v_host[offset:offset + size].reshape(b.shape(x)), dtype=b.dtype(x), device=device))
        offset += size
    if plan.mode == "rev":
        outputs, vjp_fn, _ = b.vjp(main, leaves)
        cotangents, offset = [], 0
        for o in outputs:
            size = int(np.prod(b.shape(o), dtype=np.int64))
            cotangents.append(b.asarray(u_host[offset:offset + size].reshape(b.shape(o)), dtype=b.dtype(o),
                                        device=device))
            offset += size
        return verdict_of(b, xp, plan, values, _ravel_concat(b, xp, vjp_fn(tuple(cotangents)), dtype), v, dtype)
    pushed = b.hvp(main, leaves, tuple(tangents)) if plan.mode == "star" else b.jvp(main, leaves, tuple(tangents))[1]
    return verdict_of(b, xp, plan, values, _ravel_concat(b, xp, pushed, dtype), u, dtype)
