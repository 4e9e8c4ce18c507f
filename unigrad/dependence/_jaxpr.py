"""A jaxpr (``jax.make_jaxpr``) as a :class:`~._program.Program`: JAX-native code for the same rules.

Call primitives (``pjit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``, ``closed_call``) are
inlined; ``cond`` keeps its branches as sub-programs (every branch counts); values computed from
constants alone are folded (so a gather's indices built from constants are known to the rules). JAX
primitive names appear as ``lax.<name>`` in the rule table. Imported only when JAX is in use.

Loops (``scan``, ``while``: what ``fori_loop``, ``map`` and ``cumsum``-like code lower to) become one
node holding the body (and a while's predicate) as sub-programs; the rules iterate the body to a fixed
point (:mod:`._sets`, :mod:`._rows`). For index sets (``unroll=True``, :func:`jaxpr_program`) a loop
whose trip count is known is unrolled instead when small enough (the body once per iteration, the
counter and every value computed from constants folded, so ``x.at[k].set(..)`` in a ``fori_loop`` is
exact); a ``cond`` whose index is known inlines the branch taken.
"""

from __future__ import annotations

import numpy as np

from ._program import Node, Program

# operand positions that are data (the rest are indices or predicates: no derivative flows through them)
_DATA = {
    "gather": (0,), "dynamic_slice": (0,), "dynamic_update_slice": (0, 1), "integer_pow": (0,),
    "convert_element_type": (0,), "iota": (), "argmax": (), "argmin": (),
    "scatter": (0, 2), "scatter-add": (0, 2), "scatter_add": (0, 2), "scatter-sub": (0, 2), "scatter_sub": (0, 2),
    "scatter-mul": (0, 2), "scatter_mul": (0, 2), "scatter-min": (0, 2), "scatter_min": (0, 2),
    "scatter-max": (0, 2), "scatter_max": (0, 2),
}
_CALLS = ("pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "remat",
          "remat2", "checkpoint", "custom_lin", "jit")
_UNROLL = 4000  # equations an unrolled loop may add to an index-set program (beyond: one loop node)


class Aval:
    """A value known only by its shape and dtype (an input-dependent value of the jaxpr)."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def jaxpr_program(f, args, unroll=True):
    """The program of ``f`` at the shapes and dtypes of ``args`` (NumPy arrays); loops with a known trip
    count unrolled where small (what index sets want)."""
    import jax
    closed = jax.make_jaxpr(f)(*args)
    return from_closed_jaxpr(closed, unroll=unroll)


def from_closed_jaxpr(closed, env=None, unroll=False, unknown=()):
    """The program of a closed jaxpr; ``env``, a dict when given, receives its variables' value ids.
    ``unroll``: unroll loops whose trip count is known, when small (else every loop is one node).
    ``unknown``: ids of constants whose values the program must not use (arrays a transform's ``f`` is
    given, which change from call to call with the same shapes: an index array), as for tracers."""
    builder = _Builder(unroll)
    jaxpr = closed.jaxpr
    env = {} if env is None else env
    for v, c in zip(jaxpr.constvars, closed.consts):
        if _is_tracer(c) or id(c) in unknown:  # (made inside an enclosing trace, jit: its value is not known here)
            builder.key(v, env)
        else:
            builder.known[builder.key(v, env)] = c
    inputs = [builder.key(v, env) for v in jaxpr.invars]
    builder.walk(jaxpr, env)
    outputs, shapes = builder.outs(jaxpr, env)
    return Program(inputs, [tuple(v.aval.shape) for v in jaxpr.invars], builder.nodes, outputs, shapes)


class _Builder:
    def __init__(self, unroll=False):
        self.nodes, self.known, self.count = [], {}, 0
        self.unroll = unroll

    def key(self, var, env):
        k = env.get(var)
        if k is None:
            k = env[var] = self.count
            self.count += 1
        return k

    def atom(self, a, env):
        """(key or None, value or Aval)."""
        if hasattr(a, "val") and not hasattr(a, "count") and type(a).__name__ == "Literal":
            return None, a.val
        k = self.key(a, env)
        if k in self.known:
            return None, self.known[k]
        return k, Aval(a.aval.shape, a.aval.dtype)

    def outs(self, jaxpr, env):
        outputs, shapes = [], []
        for v in jaxpr.outvars:
            k, val = self.atom(v, env)
            outputs.append(k)
            shapes.append(tuple(np.shape(val)) if not isinstance(val, Aval) else val.shape)
        return outputs, shapes

    def walk(self, jaxpr, env):
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            atoms = [self.atom(a, env) for a in eqn.invars]
            if all(k is None for k, _ in atoms):  # constants only: fold
                try:
                    vals = eqn.primitive.bind(*[v for _, v in atoms], **eqn.params)
                    vals = vals if eqn.primitive.multiple_results else [vals]
                    for v, val in zip(eqn.outvars, vals):
                        self.known[self.key(v, env)] = val
                    continue
                except Exception:
                    pass
            inner = _inner(eqn) if name in _CALLS else None
            if inner is not None:
                self._inline(inner, atoms, eqn, env)
                continue
            if name == "cond":
                self._cond(eqn, atoms, env)
                continue
            if name == "scan":
                self._scan(eqn, atoms, env)
                continue
            if name == "while":
                self._while(eqn, atoms, env)
                continue
            n = len(atoms)
            data = frozenset(_DATA.get(name, range(1, n) if name == "select_n" else range(n)))
            traced = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i in data}
            index = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i not in data}
            outs = [self.key(v, env) for v in eqn.outvars]
            self.nodes.append(Node("lax." + name, _binder(eqn.primitive), [v for _, v in atoms], traced,
                                   dict(eqn.params), outs, [tuple(v.aval.shape) for v in eqn.outvars],
                                   site=_site(eqn), prim=eqn.primitive, data=data, index=index))

    def _inline(self, inner, atoms, eqn, env):
        sub, consts = inner
        sub_env = {}
        for v, c in zip(sub.constvars, consts):
            self.known[self.key(v, sub_env)] = c
        for v, (k, val) in zip(sub.invars, atoms):
            if k is None:
                self.known[self.key(v, sub_env)] = val
            else:
                sub_env[v] = k
        self.walk(sub, sub_env)
        for v, w in zip(eqn.outvars, sub.outvars):
            if type(w).__name__ == "Literal":
                self.known[self.key(v, env)] = w.val
            else:
                k = self.key(w, sub_env)
                if k in self.known:
                    self.known[self.key(v, env)] = self.known[k]
                else:
                    env[v] = k

    def _cond(self, eqn, atoms, env):
        branches = eqn.params["branches"]
        if atoms[0][0] is None:  # the index is known: only that branch runs (lax.switch clamps it)
            taken = branches[int(np.clip(np.asarray(atoms[0][1]), 0, len(branches) - 1))]
            self._bind_outs(eqn.outvars, self._apply(taken, atoms[1:]), env)
            return
        known = [None if k is not None else val for k, val in atoms[1:]]
        subs = [self._sub(branch, known, j + 1) for j, branch in enumerate(branches)]
        self._node("lax.cond", eqn, atoms, env, subs, {}, data=range(1, len(atoms)), extra=range(1, len(atoms)))

    # ------------------------------------------------------------------------------------ loops
    def _scan(self, eqn, atoms, env):
        p = eqn.params
        nc, ncar, length, closed = p["num_consts"], p["num_carry"], int(p["length"]), p["jaxpr"]
        if self.unroll and 0 < length * (_size(closed.jaxpr) + len(eqn.invars) + len(eqn.outvars)) <= _UNROLL:
            consts, carry, xs = atoms[:nc], list(atoms[nc:nc + ncar]), atoms[nc + ncar:]
            ys = [[None] * length for _ in eqn.outvars[ncar:]]
            for t in (range(length - 1, -1, -1) if p["reverse"] else range(length)):
                got = self._apply(closed, consts + carry + [self._slice(a, t) for a in xs])
                carry = got[:ncar]
                for j, a in enumerate(got[ncar:]):
                    ys[j][t] = a
            self._bind_outs(eqn.outvars[:ncar], carry, env)
            self._bind_outs(eqn.outvars[ncar:], [self._stack(col, v) for col, v in zip(ys, eqn.outvars[ncar:])], env)
            return
        # one node: the body with the consts it knows (a carry or a slice of xs changes every iteration)
        body = self._sub(closed, [val if k is None and i < nc else None for i, (k, val) in enumerate(atoms)])
        self._node("lax.scan", eqn, atoms, env, [body],
                   {"length": length, "reverse": bool(p["reverse"]), "num_consts": nc, "num_carry": ncar})

    def _while(self, eqn, atoms, env):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = atoms[:cn], atoms[cn:cn + bn], list(atoms[cn + bn:])
        if self.unroll:  # run it while the predicate is known (a counter, a bound from constants)
            size, budget = _size(p["body_jaxpr"].jaxpr), _UNROLL
            while budget >= size:
                mark = len(self.nodes)
                (k, pred), = self._apply(p["cond_jaxpr"], cconsts + carry)
                del self.nodes[mark:]  # (the predicate's own nodes: not part of the result)
                if k is not None:  # the trip count depends on the input: the rest is a loop node
                    break
                if not bool(np.asarray(pred)):
                    self._bind_outs(eqn.outvars, carry, env)
                    return
                carry = self._apply(p["body_jaxpr"], bconsts + carry)
                budget -= max(size, 1)
            atoms = cconsts + bconsts + carry
        known = [val if k is None and i < cn + bn else None for i, (k, val) in enumerate(atoms)]
        body = self._sub(p["body_jaxpr"], known[cn:], 1)
        cond = self._sub(p["cond_jaxpr"], known[:cn] + known[cn + bn:], 2)
        self._node("lax.while", eqn, atoms, env, [body, cond], {"cond_nconsts": cn, "body_nconsts": bn},
                   data=range(cn, len(atoms)))

    # --------------------------------------------------------------------------------- helpers
    def _node(self, name, eqn, atoms, env, inner, params, data=None, extra=None):
        """One node holding sub-programs; its operands in ``extra`` (all by default) are their inputs."""
        data = frozenset(range(len(atoms)) if data is None else data)
        traced = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i in data}
        index = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i not in data}
        outs = [self.key(v, env) for v in eqn.outvars]
        self.nodes.append(Node(name, None, [v for _, v in atoms], traced, params, outs,
                               [tuple(v.aval.shape) for v in eqn.outvars], site=_site(eqn), inner=inner,
                               data=data, extra_positions=tuple(range(len(atoms)) if extra is None else extra),
                               index=index))

    def _sub(self, closed, known, offset=1):
        """A self-contained program of a closed jaxpr: its inputs are its invars, those with a value in
        ``known`` (not None) folded as constants."""
        b = _Builder(self.unroll)
        b.count = self.count + 10_000_000 * offset  # ids apart from the outer program's
        benv = {}
        for v, c in zip(closed.jaxpr.constvars, closed.consts):
            k = b.key(v, benv)
            if not _is_tracer(c):
                b.known[k] = c
        inputs = []
        for v, val in zip(closed.jaxpr.invars, known):
            k = b.key(v, benv)
            if val is not None:
                b.known[k] = val
            inputs.append(k)
        b.walk(closed.jaxpr, benv)
        outputs, shapes = b.outs(closed.jaxpr, benv)
        return Program(inputs, [tuple(v.aval.shape) for v in closed.jaxpr.invars], b.nodes, outputs, shapes)

    def _apply(self, closed, atoms):
        """A closed jaxpr inlined on ``atoms`` ((key or None, value) pairs): its outputs as atoms."""
        sub_env = {}
        for v, c in zip(closed.jaxpr.constvars, closed.consts):
            k = self.key(v, sub_env)
            if not _is_tracer(c):
                self.known[k] = c
        for v, (k, val) in zip(closed.jaxpr.invars, atoms):
            if k is None:
                self.known[self.key(v, sub_env)] = val
            else:
                sub_env[v] = k
        self.walk(closed.jaxpr, sub_env)
        return [self.atom(w, sub_env) for w in closed.jaxpr.outvars]

    def _bind_outs(self, outvars, atoms, env):
        for v, (k, val) in zip(outvars, atoms):
            if k is None:
                self.known[self.key(v, env)] = val
            else:
                env[v] = k

    def _slice(self, atom, t):
        """Element ``t`` along axis 0 of a scanned operand (a structural node when it is traced)."""
        k, val = atom
        if k is None:
            return None, np.asarray(val)[t]
        out = self.count
        self.count += 1
        shape = tuple(val.shape[1:])
        self.nodes.append(Node("lax.scan_index", lambda a, t=t: np.asarray(a)[t], [val], {0: k}, {}, [out],
                               [shape], data=frozenset({0})))
        return out, Aval(shape, val.dtype)

    def _stack(self, col, var):
        """A scan's stacked output from its per-iteration atoms."""
        if all(k is None for k, _ in col):
            return None, np.stack([np.asarray(v) for _, v in col])
        out = self.count
        self.count += 1
        shape = tuple(var.aval.shape)
        self.nodes.append(Node("lax.scan_stack", lambda *a: np.stack([np.asarray(x) for x in a]),
                               [v for _, v in col], {t: k for t, (k, _) in enumerate(col) if k is not None}, {},
                               [out], [shape], data=frozenset(range(len(col)))))
        return out, Aval(shape, var.aval.dtype)


def _size(jaxpr):
    """Equations of a jaxpr, sub-jaxprs (loops times their length) included: the cost of unrolling it."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr", "body_jaxpr"):
            inner = eqn.params.get(key)
            inner = getattr(inner, "jaxpr", inner)
            if inner is not None and hasattr(inner, "eqns"):
                total += _size(inner) * int(eqn.params.get("length", 1))
        for branch in eqn.params.get("branches", ()):
            total += _size(branch.jaxpr)
    return total


def _is_tracer(c):
    import jax
    return isinstance(c, jax.core.Tracer)


def _inner(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        j = eqn.params.get(key)
        if j is None:
            continue
        if hasattr(j, "jaxpr") and hasattr(j, "consts"):
            return j.jaxpr, j.consts
        if hasattr(j, "eqns"):
            return j, ()
    return None


def _binder(prim):
    def fn(*args, **params):
        import jax
        import jax.numpy as jnp
        with jax.ensure_compile_time_eval():  # concrete values, also inside an enclosing jit's trace
            out = prim.bind(*[jnp.asarray(a) for a in args], **params)
        return out[0] if prim.multiple_results else out
    return fn


def _site(eqn):
    try:
        from jax._src import source_info_util
        return source_info_util.summarize(eqn.source_info)
    except Exception:
        return None
