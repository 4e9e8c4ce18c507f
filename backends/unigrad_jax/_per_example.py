"""Per-example gradients on JAX: dense layers found in the jaxpr of the per-example losses.

The same method as the tape's (``_per_example.py``), on the program JAX traces: a parameter whose
one use is ``dot_general`` with a batched left operand (``x @ W``, or ``x @ W.T`` through a
``transpose``), or ``add``/``sub``/``mul`` after a chain of ``broadcast_in_dim``/``reshape`` (a bias,
a scale), gets its rows from one backward pass -- the jaxpr is evaluated with a zero added to each
such layer's output, and the gradient with respect to those zeros is ``G`` -- wherever the jaxpr
proves that rows of the losses depend on the layer's output through their own row alone (a rule
per primitive, the one dependence analysis's (:mod:`unigrad.dependence`); nested ``jit``/``custom_jvp``
calls are read inside; anything else gives up). Other
parameters are materialised with ``jax.jacrev``. Everything is traced, so ``compile=True`` makes
one XLA program of it.
"""

from __future__ import annotations

import numpy as np

from unigrad.per_example import layers as pe

_BIAS_CHAIN = frozenset({"broadcast_in_dim", "reshape", "convert_element_type", "squeeze"})


def jax_rows(b, flat_f, leaves, batch, norms, fname, directions=None, weights=None):
    """``(outputs, blocks, paths)`` (``JaxBackend.per_example_rows``) read from ``f``'s jaxpr; with ``norms``
    and ``directions``, a second block of each example's ``<g_i, V>`` (``layers.total_dots``)."""
    import jax

    paths_seen = {}
    n = len(leaves)
    # the directions as flat arrays for evaluate (a matrix's is a pair: layers.matmul_dots)
    pairs = [isinstance(v, tuple) for v in directions or ()]
    flat = [a for v in directions or () for a in (v if isinstance(v, tuple) else (v,))]
    flat += [weights] if directions is not None and weights is not None else []

    def body(*args):
        leaves, dirs, r = args[:n], None, None
        if directions is not None:
            rest, dirs = iter(args[n:]), []
            for pair in pairs:
                dirs.append((next(rest), next(rest)) if pair else next(rest))
            r = next(rest, None)
        closed = jax.make_jaxpr(flat_f)(*leaves)
        jaxpr, consts = closed.jaxpr, closed.consts
        avals = [v.aval for v in jaxpr.outvars]
        pe.check_losses(_Avals, avals, batch, fname)
        outs, blocks, paths = _rows(jaxpr, consts, leaves, batch, norms, dirs, r)
        paths_seen["paths"] = paths
        return outs, blocks

    body.closure_arrays = getattr(flat_f, "closure_arrays", ())  # (the backend's 64-bit rule reads them)
    outs, blocks = b.evaluate(body, tuple(leaves) + tuple(flat))
    return outs, blocks, paths_seen["paths"]


class _Avals:
    @staticmethod
    def shape(a):
        return tuple(a.shape)

    @staticmethod
    def dtype(a):
        return np.dtype(a.dtype).name


def _is_var(v):
    return type(v).__name__ != "Literal"


def _rows(jaxpr, consts, leaves, batch, norms, directions=None, weights=None):
    import jax
    import jax.numpy as jnp

    eqns = jaxpr.eqns
    uses: dict = {}
    for idx, eqn in enumerate(eqns):
        for pos, v in enumerate(eqn.invars):
            if _is_var(v):
                uses.setdefault(v, []).append((idx, pos))
    for v in jaxpr.outvars:
        if _is_var(v):
            uses.setdefault(v, []).append((None, None))
    out_var = jaxpr.outvars[0]
    plans, proved, program = [], {}, {}
    for p in jaxpr.invars:
        plan = _plan(eqns, uses, p, batch)
        if plan is not None:
            consumer = plan[1]
            if consumer not in proved:
                proved[consumer] = _rows_stay_apart(jaxpr, consts, eqns[consumer].outvars[0], batch, program)
            if not proved[consumer]:
                plan = None
        plans.append(plan)
    fast = {k: plan for k, plan in enumerate(plans) if plan is not None}
    n = len(leaves)
    rows, squares, paths = [None] * n, [None] * n, [pe.MATERIALISED] * n
    dots = [None] * n
    out = weighted = None
    if fast:
        zeros = {plan[1]: jnp.zeros(eqns[plan[1]].outvars[0].aval.shape, eqns[plan[1]].outvars[0].aval.dtype)
                 for plan in fast.values()}

        def tapped(zs, ls):
            return _evaluate(jaxpr, consts, ls, zs)

        out, vjp_fn, taps = jax.vjp(tapped, zeros, tuple(leaves), has_aux=True)
        cotangents, _ = vjp_fn(jnp.ones_like(out))
        if norms and directions is not None and weights is not None:  # the norms check's gradient, same pass
            weighted = vjp_fn(weights.astype(out.dtype))[1]
        for k, (kind, idx, detail, chain) in fast.items():
            rows[k], squares[k], paths[k] = _dense_rows(kind, eqns[idx], detail, chain, cotangents[idx], taps[idx],
                                                        leaves[k], batch, norms)
            if squares[k] is not None and directions is not None:  # (norms from X and G: matmul_rows)
                dots[k] = pe.matmul_dots(_ops(), taps[idx][0], cotangents[idx], batch, detail, directions[k])
    slow = [k for k in range(n) if k not in fast]
    if slow:
        def losses_of(slow_leaves):
            merged = list(leaves)
            for k, v in zip(slow, slow_leaves):
                merged[k] = v
            return _evaluate(jaxpr, consts, merged, {})[0]

        jac = jax.jacrev(losses_of)([leaves[k] for k in slow])
        for k, r in zip(slow, jac):
            rows[k] = r
        if out is None:
            out = losses_of([leaves[k] for k in slow])
    if out is None:
        out = _evaluate(jaxpr, consts, leaves, {})[0]
    if not norms:
        return (out,), tuple(rows), paths
    total = pe.total_norms(_ops(), squares, rows, batch)
    dot = None if directions is None else pe.total_dots(_ops(), dots, rows, directions, batch)
    if dot is None:
        return (out,), (total,), paths
    if weighted is None:
        return (out,), (total, dot), paths
    return (out,), (total, dot, pe.direction_dot(_ops(), weighted, directions, dot.dtype)), paths


def _evaluate(jaxpr, consts, args, zs):
    """The jaxpr's output, with ``zs[i]`` added to the output of equation i; and the operands of
    those equations (what their per-example gradients read)."""
    env = {}

    def read(v):
        return v.val if not _is_var(v) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    taps = {}
    for idx, eqn in enumerate(jaxpr.eqns):
        invals = [read(v) for v in eqn.invars]
        ans = _bind(eqn, invals)
        outs = list(ans) if eqn.primitive.multiple_results else [ans]
        if idx in zs:
            taps[idx] = invals
            outs[0] = outs[0] + zs[idx]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return read(jaxpr.outvars[0]), taps


def _bind(eqn, invals):
    """Run one equation (as ``jax.core.eval_jaxpr`` does; older JAX returns sub-functions too)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = ()
    if isinstance(params, tuple):
        subfuns, params = params
    return eqn.primitive.bind(*subfuns, *invals, **params)


def _plan(eqns, uses, p, batch):
    """``(kind, consumer equation, detail, chain)`` for a parameter used once by a dense layer."""
    if not np.issubdtype(np.dtype(p.aval.dtype), np.floating):
        return None
    chain, v = [], p
    while True:
        mine = uses.get(v, [])
        if len(mine) != 1 or mine[0][0] is None:
            return None
        idx, pos = mine[0]
        eqn = eqns[idx]
        name = eqn.primitive.name
        if name == "transpose" and not chain and len(p.aval.shape) == 2 and tuple(eqn.params["permutation"]) == (1, 0):
            chain.append(eqn)
            v = eqn.outvars[0]
            continue
        if name in _BIAS_CHAIN:
            chain.append(eqn)
            v = eqn.outvars[0]
            continue
        break
    out_shape = tuple(eqn.outvars[0].aval.shape)
    if not out_shape or out_shape[0] != batch:
        return None
    if name == "dot_general":
        if pos != 1 or any(c.primitive.name != "transpose" for c in chain) or len(v.aval.shape) != 2:
            return None
        lhs = eqn.invars[0]
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        nd = len(lhs.aval.shape)
        if tuple(lb) or tuple(rb) or nd < 2 or tuple(lc) != (nd - 1,) or tuple(rc) not in ((0,), (1,)) \
                or len(out_shape) != nd or lhs.aval.shape[0] != batch:
            return None
        transposed = (tuple(rc) == (1,)) != bool(chain)
        return "matmul", idx, transposed, ()
    if name in ("add", "sub", "mul") and all(c.primitive.name != "transpose" for c in chain):
        shape = tuple(v.aval.shape)
        if len(shape) > len(out_shape) or (len(shape) == len(out_shape) and shape[0] != 1):
            return None
        other = eqn.invars[1 - pos]
        if name == "mul" and not _is_var(other):
            return None
        sign = -1.0 if (name == "sub" and pos == 1) else 1.0
        return ("scale" if name == "mul" else "bias"), idx, (pos, sign), tuple(chain)
    return None


def _ops():
    import jax.numpy as jnp

    return pe.Ops(jnp.reshape, lambda a, axes, keepdims: jnp.sum(a, axis=axes, keepdims=keepdims), jnp.matmul,
                  lambda a: jnp.swapaxes(a, -1, -2), lambda a, dtype: a.astype(dtype), jnp.sqrt)


def _dense_rows(kind, eqn, detail, chain, g, invals, param, batch, norms):
    import jax

    ops = _ops()
    if kind == "matmul":
        return pe.matmul_rows(ops, invals[0], g, batch, norms, detail, param.dtype)
    pos, sign = detail
    operand = eqn.invars[pos]
    contribution, path = pe.broadcast_rows(ops, kind, g, None if kind == "bias" else invals[1 - pos],
                                           tuple(operand.aval.shape), tuple(eqn.outvars[0].aval.shape), sign, batch)
    if chain:  # back through the broadcasts and reshapes that made the operand from the parameter
        def through_chain(p):
            v = p
            for c in chain:
                v = _bind(c, [v])
            return v

        _, pull = jax.vjp(through_chain, param)
        rows = jax.vmap(lambda c: pull(c.astype(operand.aval.dtype))[0])(contribution)
    else:
        rows = contribution
    return rows.astype(param.dtype), None, path


# ---------------------------------------------------------------------------------------------
# The proof that rows stay apart: the dependence analysis on the jaxpr
# ---------------------------------------------------------------------------------------------

class _Closed:
    __slots__ = ("jaxpr", "consts")

    def __init__(self, jaxpr, consts):
        self.jaxpr, self.consts = jaxpr, consts


def _rows_stay_apart(jaxpr, consts, seed, batch, cache) -> bool:
    """Whether row i of the losses depends on ``seed`` (a variable of ``jaxpr``, batch on axis 0)
    through its row i alone: :func:`unigrad.dependence.prove_rows` from that value, on the program of
    the jaxpr (built once per call of this function's caller, in ``cache``)."""
    from unigrad.dependence import prove_rows
    from ._dependence import from_closed_jaxpr

    if "program" not in cache:
        env = {}
        cache["program"] = from_closed_jaxpr(_Closed(jaxpr, consts), env=env)
        cache["env"] = env
    vid = cache["env"].get(seed)
    if vid is None:
        return False
    return prove_rows(cache["program"], batch, seeds={vid: len(seed.aval.shape)})[0] == "row"
