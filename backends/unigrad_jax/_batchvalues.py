"""Values a program makes from the batch size or from positions in the batch, seen in a jaxpr traced at a
symbolic batch size ``b`` -- the reasons one example may NOT be computed alone (``_proof``, ``_rowprogram``).

Two ways a program reads the batch without ``x.shape[0]`` arithmetic (``dim_as_value``, seen elsewhere):

* a **batch-shaped constant** -- ``jnp.ones((b,))``, ``jnp.zeros_like(x)``: a ``broadcast_in_dim`` of
  something that is not batch-shaped -- is the same on every row only while every operation treats its
  rows alike. Reduced over the batch (``ones((b,)).sum()`` is ``b``), scanned (``cumsum``: positions),
  written at a position (``.at[0].set``), concatenated, padded, rolled, sorted, sliced or reshaped across
  the batch, it holds the batch size or positions, and one example computed alone gets other numbers.
  :func:`constants_stay_rowwise` follows every such value and allows it only into operations that act
  on each row by itself (elementwise ones, broadcasts and transposes, reductions that leave the batch
  axis alone, calls and scans whose programs do the same).
* a **Python decision on the batch size** (``if x.shape[0] != 3``): at a symbolic ``b`` JAX decides such
  a comparison one way for every batch size, so the symbolic program may not be the program that runs.
  :func:`same_program` compares it, with ``b`` set to the call's batch size, with the program traced at
  the call's shapes: the same primitives, literals, parameters and constants, or no shortcut.

Both are sound in one direction only: where they say yes the shortcut's answer is still checked
(``unigrad._answer_check``); where they say no the sum trick, exact for any ``f`` with independent rows,
runs instead.
"""

from __future__ import annotations

import enum

import numpy as np

#: Primitives that act on each element (so on each row) by itself: a batch-shaped constant through them
#: stays the same on every row.
ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "clamp",
    "conj", "convert_element_type", "copy", "copy_p", "cos", "cosh", "digamma", "div", "eq", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expm1", "floor", "ge", "gt", "igamma", "imag", "integer_pow", "is_finite", "le",
    "lgamma", "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg", "nextafter", "not", "or",
    "pow", "real", "reduce_precision", "rem", "round", "rsqrt", "select_n", "sign", "sin", "sinh", "sqrt",
    "square", "sub", "tan", "tanh", "xor",
})
#: Primitives whose ``axes`` parameter says what they reduce: row-wise where it leaves axis 0 alone.
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                        "argmax", "argmin"})
#: Call-like primitives whose program is followed inside.
CALLS = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint"})


def symbolic(shape) -> bool:
    return any(not isinstance(d, (int, np.integer)) for d in shape)


def _shape(v):
    return getattr(getattr(v, "aval", None), "shape", ())


def _literal(v) -> bool:
    return type(v).__name__ == "Literal"


def _inner(eqn):
    for key in ("jaxpr", "call_jaxpr"):
        inner = eqn.params.get(key)
        if inner is not None:
            return getattr(inner, "jaxpr", inner)
    return None


def constants_stay_rowwise(jaxpr, constants=frozenset()) -> bool:
    """Does every batch-shaped value of ``jaxpr`` (traced at a symbolic batch size) that is made from no
    input -- ``constants``: such values among its inputs -- only meet operations that treat each row by
    itself? False where one is reduced, scanned, indexed, concatenated, reshaped... across the batch."""
    return _walk(jaxpr, set(constants)) is not None


def _walk(jaxpr, const):
    """The batch-shaped constants among ``jaxpr``'s outputs (a set of indices), or None where a constant
    meets an operation across the batch. ``const``: the constants among its inputs (variables)."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [v for v in eqn.invars if not _literal(v)]
        met = [v for v in ins if v in const]
        batch_in = any(symbolic(_shape(v)) for v in eqn.invars)
        inner = _inner(eqn)
        if name in CALLS and inner is not None:
            outs = _walk(inner, {iv for iv, ov in zip(inner.invars, eqn.invars) if not _literal(ov) and ov in const})
            if outs is None:
                return None
            const.update(v for k, v in enumerate(eqn.outvars) if k in outs)
            continue
        if name == "scan" and met:
            outs = _scan(eqn, const)
            if outs is None:
                return None
            const.update(v for k, v in enumerate(eqn.outvars) if k in outs)
            continue
        if met and not _rowwise(eqn, name):
            return None
        # a batch-shaped result made from nothing batch-shaped (a broadcast of a scalar), or from constants
        # alone, is a constant; one that reads an input of the program is not
        made = [v for v in eqn.outvars if symbolic(_shape(v))]
        if made and (not batch_in or (met and len(met) == sum(symbolic(_shape(v)) for v in ins))):
            const.update(made)
    return {k for k, v in enumerate(jaxpr.outvars) if not _literal(v) and v in const}


def _scan(eqn, const):
    """A scan whose operands hold batch-shaped constants: its body walked with them (the first iteration
    has the most: a carry that meets an input stays so), never scanning along a constant's batch axis."""
    body = eqn.params["jaxpr"]
    body = getattr(body, "jaxpr", body)
    n_consts, n_carry = eqn.params.get("num_consts", 0), eqn.params.get("num_carry", 0)
    inner = set()
    for k, (iv, ov) in enumerate(zip(body.invars, eqn.invars)):
        if _literal(ov) or ov not in const:
            continue
        if k >= n_consts + n_carry and symbolic(_shape(ov)[:1]):
            return None  # scanned along the batch: iteration t is row t
        inner.add(iv)
    outs = _walk(body, inner)
    if outs is None:
        return None
    # carries out and stacked outputs: constants where the body's are
    return outs


def _rowwise(eqn, name) -> bool:
    """Does ``eqn`` treat each row of the batch-shaped constants it reads by itself (where the batch axis
    is: the symbolic dimension, wherever a transpose moved it)?"""
    if name in ELEMENTWISE:
        out = _shape(eqn.outvars[0])
        return all(tuple(_shape(v)) == tuple(out) or not _shape(v) for v in eqn.invars)
    if name in ("broadcast_in_dim", "transpose"):  # the batch axis moves, its rows stay apart
        return True
    if name in REDUCTIONS:
        axes = tuple(eqn.params.get("axes", ()))
        return not any(symbolic(_shape(v)[a:a + 1]) for v in eqn.invars for a in axes)
    if name == "squeeze":
        dims = tuple(eqn.params.get("dimensions", ()))
        return not any(symbolic(_shape(v)[d:d + 1]) for v in eqn.invars for d in dims)
    return False


def same_program(symbolic_closed, concrete_closed, batch: int) -> bool:
    """Is the program traced at the symbolic batch size ``b``, with ``b = batch``, the program traced at the
    call's shapes (no Python decision on the batch size took another way)? False where that cannot be
    shown."""
    try:
        return _same(symbolic_closed.jaxpr, concrete_closed.jaxpr, {"b": batch}, _at) and _same_consts(
            symbolic_closed.consts, concrete_closed.consts)
    except Exception:
        return False


def _at(value, env):
    """``value`` (a parameter) with every symbolic dimension evaluated in ``env``: the object itself where it
    holds none, a tuple or list (a named tuple of its own type: gather's dimension numbers) rebuilt where
    it does."""
    if isinstance(value, (tuple, list)):
        items = [_at(v, env) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if hasattr(value, "_evaluate") and not isinstance(value, (int, np.integer)):
        return int(value._evaluate(env))
    return value


def _same_consts(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=True):
            return False
    return True


def _same(sym, conc, env, at) -> bool:
    # Values made from the batch size alone (dim_as_value, and scalar arithmetic on it: x / x.shape[0]) are
    # equations of the symbolic program and literals of the concrete one: left out, and matched with any
    # literal there.
    wild = set()
    kept = []
    for eqn in sym.eqns:
        if eqn.primitive.name == "dim_as_value" or (
                eqn.invars and all(_literal(v) or v in wild for v in eqn.invars)
                and any(not _literal(v) and v in wild for v in eqn.invars) and not any(symbolic(_shape(v)) for v in eqn.outvars)):
            wild.update(eqn.outvars)
            continue
        kept.append(eqn)
    if len(kept) != len(conc.eqns) or len(sym.outvars) != len(conc.outvars):
        return False

    def same_atom(v, w):
        if not _literal(v) and v in wild:
            return _literal(w)
        return _literal(v) == _literal(w) and (not _literal(v) or _same_value(v.val, w.val))

    if not all(same_atom(v, w) for v, w in zip(sym.outvars, conc.outvars)):
        return False
    for es, ec in zip(kept, conc.eqns):
        if es.primitive is not ec.primitive or len(es.invars) != len(ec.invars):
            return False
        if not all(same_atom(v, w) for v, w in zip(es.invars, ec.invars)):
            return False
        if set(es.params) != set(ec.params):
            return False
        for key, ps in es.params.items():
            if not _same_param(ps, ec.params[key], env, at):
                return False
    return True


def _same_param(ps, pc, env, at) -> bool:
    inner_s = getattr(ps, "jaxpr", ps)
    inner_c = getattr(pc, "jaxpr", pc)
    if hasattr(inner_s, "eqns"):
        return hasattr(inner_c, "eqns") and _same(inner_s, inner_c, env, at) and _same_consts(
            getattr(ps, "consts", ()), getattr(pc, "consts", ()))
    if isinstance(ps, (tuple, list)) and ps and any(hasattr(getattr(p, "jaxpr", p), "eqns") for p in ps):
        return (isinstance(pc, (tuple, list)) and len(ps) == len(pc)
                and all(_same_param(a, b, env, at) for a, b in zip(ps, pc)))
    return _same_value(at(ps, env), pc)


_PLAIN = (int, float, complex, str, bytes, bool, type(None), np.dtype, np.generic, enum.Enum)


def _same_value(a, b) -> bool:
    """Equal data (numbers, strings, dtypes, arrays, tuples and named tuples of them); other objects (a
    custom rule's function, a new object each trace, whose program is checked apart) by type."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) or (hasattr(a, "shape") and hasattr(a, "dtype")):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=True))
    if isinstance(a, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same_value(x, y) for x, y in zip(a, b)))
    if isinstance(a, _PLAIN):
        equal = a == b
        return equal if isinstance(equal, bool) else bool(np.all(equal))
    return type(a) is type(b)
