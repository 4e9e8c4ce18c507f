"""A jaxpr (``jax.make_jaxpr``) as a :class:`~._program.Program`: JAX-native code for the same rules.

Call primitives (``pjit``, ``remat``, ``closed_call``) are inlined; ``cond`` keeps its branches as sub-programs (every branch counts); values computed from
constants alone are folded (so a gather's indices built from constants are known to the rules). JAX
primitive names appear as ``lax.<name>`` in the rule table. Imported only when JAX is in use.

Loops (``scan``, ``while``: what ``fori_loop``, ``map`` and ``cumsum``-like code lower to) become one
node holding the body (and a while's predicate) as sub-programs; the rules iterate the body to a fixed
point (:mod:`._sets`, :mod:`._rows`). For index sets (``unroll=True``, :func:`jaxpr_program`) a loop
whose trip count is known is unrolled instead when small enough (the body once per iteration, the
counter and every value computed from constants folded, so ``x.at[k].set(..)`` in a ``fori_loop`` is
exact); a ``cond`` whose index is known inlines the branch taken.

Custom derivative rules (``jax.custom_jvp``, ``jax.custom_vjp``): derivatives come from the *rule*, not
from the primal program (``call_jaxpr``), so the primal is never analysed alone. A ``custom_jvp_call``
is replaced by its JVP program (:func:`custom_jvp_jaxpr`), each tangent input given the primal's value
id; a ``custom_vjp_call`` (its ``bwd`` is Python that no jaxpr shows) is one node without a rule
(patterns widen with a reason, the row proof answers "unknown" so the probe decides).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from unigrad.dependence import Aval, Node, Program, Rule, codes, register_rules

# The jaxpr's primitives, under "lax.": the class of dependence of each (unigrad.dependence's rule kinds). A
# zero-derivative primitive's rows must hold in value too (``in_value``: JAX evaluates a proved f one row at
# a time), so its rows are tracked where other engines' need not be.
register_rules("lax.", [
    ("neg add_any sub convert_element_type copy copy_p real_ imag_ reduce_precision select_n clamp max min "
         "add_jaxvals abs", Rule("elementwise", "linear")),
    ("add", Rule("elementwise", "linear")),
    ("mul", Rule("elementwise", "bilinear")),
    ("div", Rule("elementwise", "divide")),
    ("exp exp2 log log1p expm1 sqrt rsqrt cbrt sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh "
         "logistic integer_pow pow atan2 erf erfc erf_inv lgamma digamma square tan",
         Rule("elementwise", "nonlinear")),
    ("sign floor ceil round is_finite eq ne lt le gt ge and or not xor iota argmax argmin stop_gradient "
         "shift_left shift_right_logical shift_right_arithmetic population_count nextafter rem_int random_bits "
         "random_seed random_wrap random_unwrap threefry2x32", Rule("zero", in_value=True)),
    ("reshape transpose broadcast_in_dim squeeze expand_dims slice dynamic_slice concatenate pad rev gather tile "
         "dynamic_update_slice", Rule("structural")),
    ("reduce_sum reduce_max reduce_min", Rule("reduce", "linear")),
    ("reduce_prod", Rule("reduce", "nonlinear")),
    ("cumsum cummax cummin", Rule("scan", "linear")),
    ("cumprod cumlogsumexp", Rule("scan", "nonlinear")),
    ("sort", Rule("lane", "linear")),
    ("dot_general", Rule("einsum", "bilinear")),
    ("pjit closed_call core_call custom_jvp_call custom_vjp_call custom_vjp_call_jaxpr remat remat2 checkpoint "
         "custom_lin jit", Rule("call")),
    ("scan while", Rule("loop")),
    ("scan_index scan_stack", Rule("structural")),  # an unrolled scan's slices and stacked outputs
    ("scatter scatter-add scatter_add scatter-sub scatter_sub scatter-min scatter_min scatter-max scatter_max",
         Rule("scatter", "linear")),
    ("scatter-mul scatter_mul", Rule("scatter", "nonlinear")),
    ("cond", Rule("call", branches=True)),
])

# operand positions that are data (the rest are indices or predicates: no derivative flows through them)
_DATA = {
    "gather": (0,), "dynamic_slice": (0,), "dynamic_update_slice": (0, 1), "integer_pow": (0,),
    "convert_element_type": (0,), "iota": (), "argmax": (), "argmin": (),
    "scatter": (0, 2), "scatter-add": (0, 2), "scatter_add": (0, 2), "scatter-sub": (0, 2), "scatter_sub": (0, 2),
    "scatter-mul": (0, 2), "scatter_mul": (0, 2), "scatter-min": (0, 2), "scatter_min": (0, 2),
    "scatter-max": (0, 2), "scatter_max": (0, 2),
}
_CALLS = ("pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "jit")
# custom derivative rules whose derivative no jaxpr shows (a Python bwd, a linearized rule): no rule
_OPAQUE = ("custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin")
_CUSTOM_DEPTH = 4  # custom_jvp rules expanded inside custom_jvp rules (a rule calling its own function)
_UNROLL = 4000  # equations an unrolled loop may add to an index-set program (beyond: one loop node)



def jaxpr_program(f, args, unroll=True, order=2):
    """The program of ``f`` at the shapes and dtypes of ``args`` (NumPy arrays); loops with a known trip
    count unrolled where small (what index sets want). ``order``: the derivatives the program must be
    sound for (1: Jacobian patterns and rows; 2: Hessian patterns too)."""
    import jax
    closed = jax.make_jaxpr(f)(*args)
    return from_closed_jaxpr(closed, unroll=unroll, order=order)


def from_closed_jaxpr(closed, env=None, unroll=False, unknown=(), order=2):
    """The program of a closed jaxpr; ``env``, a dict when given, receives its variables' value ids.
    ``unroll``: unroll loops whose trip count is known, when small (else every loop is one node).
    ``unknown``: ids of constants whose values the program must not use (arrays a transform's ``f`` is
    given, which change from call to call with the same shapes: an index array), as for tracers.
    ``order``: 1 when only first derivatives and values are read from the program (patterns of
    Jacobians, rows), 2 when second derivatives are too (Hessian patterns); see :meth:`_custom_jvp`."""
    builder = _Builder(unroll, order)
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
    def __init__(self, unroll=False, order=2, depth=0):
        self.nodes, self.known, self.count = [], {}, 0
        self.unroll = unroll
        self.order = order  # derivatives of the current equation that must be sound (0: its value only)
        self.depth = depth  # custom_jvp rules being expanded around the current equation
        self.primal_only = {}  # id -> equation of a JVP program that no tangent reaches (needs order - 1)

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
            if id(eqn) in self.primal_only and self.primal_only[id(eqn)] is eqn:
                saved, self.order = self.order, self.order - 1
                try:
                    self._eqn(eqn, env)
                finally:
                    self.order = saved
            else:
                self._eqn(eqn, env)

    def _eqn(self, eqn, env):
        """One equation into nodes (or folded, inlined, expanded)."""
        name = eqn.primitive.name
        atoms = [self.atom(a, env) for a in eqn.invars]
        if all(k is None for k, _ in atoms):  # constants only: fold
            try:
                vals = eqn.primitive.bind(*[v for _, v in atoms], **eqn.params)
                vals = vals if eqn.primitive.multiple_results else [vals]
                for v, val in zip(eqn.outvars, vals):
                    self.known[self.key(v, env)] = val
                return
            except Exception:
                pass
        if name == "custom_jvp_call":
            self._custom_jvp(eqn, atoms, env)
            return
        if name in _OPAQUE:
            self._opaque(eqn, atoms, env, f"{name} (a jax.custom_vjp function): its derivative is its "
                         f"Python bwd rule, which the analysis cannot read")
            return
        inner = _inner(eqn) if name in _CALLS else None
        if inner is not None:
            self._inline(inner, atoms, eqn, env)
            return
        if name == "cond":
            self._cond(eqn, atoms, env)
            return
        if name == "scan":
            self._scan(eqn, atoms, env)
            return
        if name == "while":
            self._while(eqn, atoms, env)
            return
        n = len(atoms)
        data = frozenset(_DATA.get(name, range(1, n) if name == "select_n" else range(n)))
        traced = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i in data}
        index = {i: k for i, (k, _) in enumerate(atoms) if k is not None and i not in data}
        outs = [self.key(v, env) for v in eqn.outvars]
        node = Node("lax." + name, _binder(eqn.primitive), [v for _, v in atoms], traced, dict(eqn.params), outs,
                    [tuple(v.aval.shape) for v in eqn.outvars], site=_site(eqn), prim=eqn.primitive, data=data,
                    index=index)
        if name.startswith("scatter"):  # where its updates land, computed when the analysis asks
            node.targets = functools.partial(_scatter_targets, node)
        self.nodes.append(node)

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

    # ---------------------------------------------------------------------- custom derivatives
    def _custom_jvp(self, eqn, atoms, env):
        """A ``jax.custom_jvp`` call: its JVP program (the user's rule, as JAX applies it) inlined, each
        tangent input the primal's own value id, each output the join of the values that may stand for
        it (see :func:`custom_jvp_jaxpr` for why this is sound for patterns, rows and Hessians).

        Where only the call's value is needed (``self.order`` 0) the primal program is inlined: it is
        what JAX evaluates. That is the case inside a JVP program for an equation no tangent reaches
        (a rule calling its own function for ``ans``, as ``defjvps`` does: ``jax.nn.relu``): the
        rule's first derivative is linear in the tangents, so such a value enters the call's
        derivative as a coefficient -- its value (and its rows, for the row proof) matter, its own
        derivative only for the next order. A Hessian pattern (order 2) thus expands the rule of a rule
        once more (an ``ans`` multiplying the tangent pairs its derivative with the tangent's set)."""
        if self.order <= 0:
            return self._inline(_inner(eqn), atoms, eqn, env)
        if self.depth >= _CUSTOM_DEPTH:
            return self._opaque(eqn, atoms, env, f"custom_jvp rules nested more than {_CUSTOM_DEPTH} deep (a rule "
                                f"calling its own function)")
        try:
            closed, order, nd = custom_jvp_jaxpr(eqn, atoms)
        except Exception as exc:  # the rule could not be traced at these shapes: no rule, never the primal
            return self._opaque(eqn, atoms, env, f"the custom_jvp rule could not be traced ({type(exc).__name__}: "
                                f"{exc})")
        marked = _primal_only(closed.jaxpr, closed.jaxpr.invars[nd:2 * nd])
        before = {k: self.primal_only[k] for k in marked if k in self.primal_only}  # (the same program, nested)
        self.depth += 1
        self.primal_only.update(marked)
        try:
            got = self._apply(closed, [atoms[i] for i in order])
        finally:
            self.depth -= 1
            for k in marked:
                self.primal_only.pop(k, None)
            self.primal_only.update(before)
        self._bind_outs(eqn.outvars, got, env)

    def _opaque(self, eqn, atoms, env, reason):
        """One node without a rule: every output depends on every input (sets, with ``reason``); the
        row proof answers unknown."""
        n = len(atoms)
        traced = {i: k for i, (k, _) in enumerate(atoms) if k is not None}
        outs = [self.key(v, env) for v in eqn.outvars]
        self.nodes.append(Node("lax.custom_call_without_rule", None, [v for _, v in atoms], traced,
                               {"reason": reason}, outs, [tuple(v.aval.shape) for v in eqn.outvars],
                               site=_site(eqn), prim=eqn.primitive, data=frozenset(range(n))))

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
        b = _Builder(self.unroll, self.order, self.depth)
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


def custom_jvp_jaxpr(eqn, atoms):
    """The JVP program of a ``custom_jvp_call`` equation: ``(closed, order, nd)``, ``closed`` a closed
    jaxpr whose inputs are ``[atoms[i] for i in order]`` (the ``nd`` traced inexact primals, then their
    tangents, then the traced non-float operands; known operands are its constants) and whose outputs
    stand for the call's outputs. It is traced by re-binding the primitive inside ``jax.jvp`` under
    ``jax.make_jaxpr``: JAX applies the user's rule, as it does when it differentiates ``f``.

    Each float output is ``c + p + t``: ``c`` the primal program's value (what ``f`` computes when not
    differentiated), ``p`` the rule's primal output, ``t`` its tangent output; an addition is a linear,
    elementwise join in every domain, so each output depends on whatever any of the three depends on.
    The tangent inputs get the value ids of their primals (a tangent's element j moves with input j):

    (a) Jacobian pattern: ``t = J(x) dx`` and the JVP program's dependence of ``t`` on ``dx`` covers
        the support of ``J`` (the interpreter is sound on that program); labelling ``dx_j`` as ``x_j``
        only adds the dependence on ``x`` (a superset).
    (b) Row proof: row i of ``t`` depends on rows i of ``x`` and ``dx`` only => ``J`` is block
        diagonal; ``c`` and ``p`` carry the value's rows (what a row evaluated alone must reproduce),
        index and predicate operands of the rule are tracked as in any jaxpr.
    (c) Hessian pattern: second derivatives through the call are ``d/dx (J(x) dx)``, the interactions
        of ``x`` and ``dx`` in the JVP program; the pairs interpreter is sound on that program with
        ``x`` and ``dx`` apart, and giving ``dx_j`` the label of ``x_j`` maps each recorded pair to the
        pair of labels (rules are unions of their operands' sets, so the merged run is the image of the
        separate one). Downstream pairs use the output's set, which covers ``J``'s support by (a).
    Any exception (a rule that cannot be traced abstractly) is the caller's to turn into "no rule"."""
    key = None
    if all(k is not None for k, _ in atoms):  # (known operands are constants of the program: not cached)
        key = (id(eqn.params["call_jaxpr"]), id(eqn.params.get("jvp_jaxpr_fun")),
               tuple((tuple(val.shape), str(val.dtype)) for _, val in atoms))
        try:
            hit = _JVP_CACHE.get(key)
        except TypeError:  # an unhashable (symbolic) dimension
            key, hit = None, None
        if hit is not None and hit[0] is eqn.params["call_jaxpr"] and hit[1] is eqn.params.get("jvp_jaxpr_fun"):
            return hit[2]
    got = _custom_jvp_jaxpr(eqn, atoms)
    if key is not None:
        if len(_JVP_CACHE) >= 256:
            try:
                _JVP_CACHE.pop(next(iter(_JVP_CACHE)))
            except (KeyError, RuntimeError, StopIteration):  # (another thread evicted it)
                pass
        _JVP_CACHE[key] = (eqn.params["call_jaxpr"], eqn.params.get("jvp_jaxpr_fun"), got)
    return got


# JVP programs of custom_jvp calls, by the identity of the call's programs (held, so ids stay theirs)
# and the operands' shapes: a jitted library function (jax.nn.relu) is the same equation in every trace
_JVP_CACHE: dict = {}


def _custom_jvp_jaxpr(eqn, atoms):
    import jax
    import jax.numpy as jnp

    prim = eqn.primitive
    params = prim.get_bind_params(eqn.params)
    call = eqn.params["call_jaxpr"]
    traced = [i for i, (k, _) in enumerate(atoms) if k is not None]
    diff = [i for i in traced if jnp.issubdtype(atoms[i][1].dtype, jnp.inexact)]
    rest = [i for i in traced if i not in diff]
    known = [None if k is not None else val for k, val in atoms]

    def jvp_program(dp, dt, rp):
        args = list(known)
        for i, a in zip(rest, rp):
            args[i] = a

        def call_with(*d):
            a2 = list(args)
            for i, a in zip(diff, d):
                a2[i] = a
            return prim.bind(*a2, **params)

        po, to = jax.jvp(call_with, tuple(dp), tuple(dt))
        full = list(args)
        for i, a in zip(diff, dp):
            full[i] = a
        pc = jax.core.eval_jaxpr(call.jaxpr, call.consts, *full)
        outs = []
        for c, p, t in zip(pc, po, to):
            inexact = jnp.issubdtype(c.dtype, jnp.inexact)
            outs.append(c + p + t.astype(c.dtype) if inexact and t.dtype != jax.dtypes.float0 else c)
        return outs

    spec = [jax.ShapeDtypeStruct(atoms[i][1].shape, atoms[i][1].dtype) for i in diff]
    rspec = [jax.ShapeDtypeStruct(atoms[i][1].shape, atoms[i][1].dtype) for i in rest]
    closed = jax.make_jaxpr(jvp_program)(spec, spec, rspec)
    return closed, diff + diff + rest, len(diff)


def _primal_only(jaxpr, tangents):
    """``{id(eqn): eqn}`` for the equations of ``jaxpr`` that no value computed from ``tangents`` reaches."""
    tainted = set(tangents)
    marked = {}
    for eqn in jaxpr.eqns:
        if any(type(v).__name__ != "Literal" and v in tainted for v in eqn.invars):
            tainted.update(eqn.outvars)
        else:
            marked[id(eqn)] = eqn
    return marked


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


def _scatter_targets(node):
    """Where each update element of a jaxpr scatter lands: ``(anywhere, surely)``, arrays of the
    updates' shape holding 1 + the flat index of the operand element (0: dropped). ``anywhere`` covers
    every way the index mode may place it; ``surely`` (None if unknown) the elements certainly written.
    None when the indices are computed from the input."""
    import jax.numpy as jnp

    idx = node.args[1]
    if type(idx).__name__ == "Aval":
        return None
    dn = node.params["dimension_numbers"]
    op_shape, up_shape = node.shape(0), node.shape(2)
    window = iter([up_shape[d] for d in dn.update_window_dims])
    batching = tuple(getattr(dn, "operand_batching_dims", ()))
    sizes = tuple(1 if d in dn.inserted_window_dims or d in batching else next(window) for d in range(len(op_shape)))
    gdn = jax.lax.GatherDimensionNumbers(
        offset_dims=tuple(dn.update_window_dims), collapsed_slice_dims=tuple(dn.inserted_window_dims),
        start_index_map=tuple(dn.scatter_dims_to_operand_dims), operand_batching_dims=batching,
        start_indices_batching_dims=tuple(getattr(dn, "scatter_indices_batching_dims", ())))
    mode = jax.lax.GatherScatterMode.from_any(node.params.get("mode"))
    modes = {jax.lax.GatherScatterMode.CLIP: ("clip",), jax.lax.GatherScatterMode.FILL_OR_DROP: ("fill",)}.get(
        mode, ("clip", "fill"))  # an index promised in bounds: either, to be safe
    got = []
    with jax.ensure_compile_time_eval():
        for m in modes:
            g = jax.lax.gather(jnp.asarray(codes(op_shape), dtype=jnp.int32), jnp.asarray(np.asarray(idx)), gdn,
                               sizes, mode=m, fill_value=0)
            got.append(np.asarray(g, dtype=np.int64).reshape(up_shape))
    anywhere = np.stack([g.ravel() for g in got])  # (ways, updates)
    return anywhere, (got[0] if len(got) == 1 or np.array_equal(got[0], got[1]) else None)
