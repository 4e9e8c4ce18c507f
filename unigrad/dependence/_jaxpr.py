"""A jaxpr (``jax.make_jaxpr``) as a :class:`~._program.Program`: JAX-native code for the same rules.

Call primitives (``pjit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``, ``closed_call``) are
inlined; ``cond`` keeps its branches as sub-programs (every branch counts); values computed from
constants alone are folded (so a gather's indices built from constants are known to the rules). JAX
primitive names appear as ``lax.<name>`` in the rule table. Imported only when JAX is in use.
"""

from __future__ import annotations

import numpy as np

from ._program import Node, Program

# operand positions that are data (the rest are indices or predicates: no derivative flows through them)
_DATA = {
    "gather": (0,), "dynamic_slice": (0,), "dynamic_update_slice": (0, 1), "integer_pow": (0,),
    "convert_element_type": (0,), "iota": (), "argmax": (), "argmin": (),
}
_CALLS = ("pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "remat",
          "checkpoint", "custom_lin", "jit")


class Aval:
    """A value known only by its shape and dtype (an input-dependent value of the jaxpr)."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def jaxpr_program(f, args):
    """The program of ``f`` at the shapes and dtypes of ``args`` (NumPy arrays)."""
    import jax
    closed = jax.make_jaxpr(f)(*args)
    return from_closed_jaxpr(closed)


def from_closed_jaxpr(closed, env=None, unknown=()):
    """The program of a closed jaxpr; ``env``, a dict when given, receives its variables' value ids.
    ``unknown``: ids of constants whose values the program must not use (arrays a transform's ``f`` is
    given, which change from call to call with the same shapes: an index array), as for tracers."""
    builder = _Builder()
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
    def __init__(self):
        self.nodes, self.known, self.count = [], {}, 0

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
            n = len(atoms)
            data = frozenset(_DATA.get(name, range(1, n) if name == "select_n" else range(n)))
            traced = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i in data}
            outs = [self.key(v, env) for v in eqn.outvars]
            self.nodes.append(Node("lax." + name, _binder(eqn.primitive), [v for _, v in atoms], traced,
                                   dict(eqn.params), outs, [tuple(v.aval.shape) for v in eqn.outvars],
                                   site=_site(eqn), prim=eqn.primitive, data=data))

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
        subs = []
        for branch in eqn.params["branches"]:
            b = _Builder()
            b.count = self.count + 10_000_000 * (len(subs) + 1)  # ids apart from the outer program's
            benv = {}
            for v, c in zip(branch.jaxpr.constvars, branch.consts):
                b.known[b.key(v, benv)] = c
            inputs = []
            for v, (k, val) in zip(branch.jaxpr.invars, atoms[1:]):
                if k is None:
                    b.known[b.key(v, benv)] = val
                inputs.append(b.key(v, benv))
            b.walk(branch.jaxpr, benv)
            outputs, shapes = b.outs(branch.jaxpr, benv)
            subs.append(Program(inputs, [tuple(v.aval.shape) for v in branch.jaxpr.invars], b.nodes, outputs, shapes))
        traced = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i > 0}
        outs = [self.key(v, env) for v in eqn.outvars]
        node = Node("lax.cond", None, [v for _, v in atoms], traced, {}, outs,
                    [tuple(v.aval.shape) for v in eqn.outvars], site=_site(eqn), inner=subs,
                    data=frozenset(range(1, len(atoms))), extra_positions=tuple(range(1, len(atoms))))
        self.nodes.append(node)


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
