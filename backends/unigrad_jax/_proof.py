"""Per-example Jacobians by proof on JAX: the rows of ``f`` read from its jaxpr.

``batch_rows`` traces ``f`` once per signature (``jax.make_jaxpr``; the core caches the answer) and runs
unigrad's row analysis over it (:mod:`unigrad.dependence`): MIXED names the operation that mixes rows,
ROW proves them independent. When they are, ``f`` is traced a second time with a *symbolic* batch size
(``jax.export.symbolic_shape``): if no value of the program is made from the batch size
(``dim_as_value``: ``x / x.shape[0]``) or from positions in the batch (an ``iota`` over it), each row
is computed by the same program whatever the batch size, so the per-example Jacobian may be taken of
one row alone and vectorised over rows -- JAX's own ``vmap(jacrev(f_one))``, which XLA simplifies
best. Otherwise the sum trick, exact for any ``f`` with independent rows, is used.
"""

from __future__ import annotations

import jax

from ._x64scope import _x64


def closed_jaxpr(f, primals, has_aux):
    """``(outputs, closed)``: ``f`` with its aux left out, and its jaxpr at the primals' shapes and dtypes (in
    the call's 64-bit scope)."""
    def outputs(*p):
        result = f(*p)
        return tuple(result[0]) if has_aux else tuple(result)

    specs = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in primals]
    with _x64(f, primals):
        return outputs, jax.make_jaxpr(outputs)(*specs)


def batch_rows(backend, f, primals, has_aux):
    from unigrad.dependence import prove_rows
    from ._dependence import from_closed_jaxpr

    outputs, closed = closed_jaxpr(f, primals, has_aux)
    with _x64(f, primals):
        # the arrays f is given but not differentiated (its closure_arrays) are constants of the jaxpr whose
        # values change from call to call: the proof, kept per signature, must hold for any of them
        unknown = {id(a) for a in getattr(f, "closure_arrays", ())}
        verdict, detail = prove_rows(from_closed_jaxpr(closed, unknown=unknown), primals[0].shape[0])
        # True: one example is f on a batch of one; "program": one example is computed from f's program, the
        # batch size kept (f reads it: x / x.shape[0]), handed back to per_example_jacobian as proof=
        separable = verdict == "row" and (_separable(outputs, primals, closed) or (
            _ROW_PROGRAM if _row_program(outputs, primals, closed) else False))
    return verdict, detail, separable


def _separable(f, primals, concrete):
    """Does every row of ``f`` come from the same program whatever the batch size (no value made from
    the batch size or from positions in the batch, and the program at a symbolic batch size is the one
    traced at the call's shapes, ``concrete``: no Python decision on the batch size)? False when that
    cannot be shown."""
    from jax import export

    from ._batchvalues import constants_stay_rowwise, same_program
    try:
        (b,) = export.symbolic_shape("b")
        specs = [jax.ShapeDtypeStruct((b,) + tuple(p.shape[1:]), p.dtype) for p in primals]
        closed = jax.make_jaxpr(f)(*specs)
    except Exception:  # f reads the batch size as a number, or closes over batch-shaped arrays
        return False
    return (_clean(closed.jaxpr) and constants_stay_rowwise(closed.jaxpr)
            and same_program(closed, concrete, primals[0].shape[0]))


_ROW_PROGRAM = "program"


def _row_program(f, primals, concrete):
    """Is one example of ``f`` computable alone from its program where ``f`` reads the batch size as a number
    (``x / x.shape[0]``: ``_rowprogram``)? Then ``per_example_jacobian`` maps that over the batch."""
    from ._rowprogram import row_function
    return row_function(f, primals, primals[0].shape[0], concrete) is not None


def _symbolic(shape):
    return any(not isinstance(d, int) for d in shape)


def _clean_rule(eqn):
    """Is the JVP program of a ``custom_jvp_call`` (the user's rule) clean too? False if it cannot be
    traced at the symbolic shapes."""
    from ._dependence import Aval, custom_jvp_jaxpr
    atoms = [(None, v.val) if type(v).__name__ == "Literal" else (0, Aval(v.aval.shape, v.aval.dtype))
             for v in eqn.invars]
    try:
        closed, _, _ = custom_jvp_jaxpr(eqn, atoms)
    except Exception:
        return False
    return _clean(closed.jaxpr, rules=False)


def _clean(jaxpr, rules=True):
    """``rules``: check the JVP programs of ``custom_jvp`` calls too (False inside such a program: a
    first derivative evaluates the custom calls it holds, their primal programs, checked here anyway)."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dim_as_value":
            return False
        made = any(_symbolic(getattr(v.aval, "shape", ())) for v in eqn.outvars)
        given = any(_symbolic(getattr(getattr(v, "aval", None), "shape", ())) for v in eqn.invars)
        if made and not given and name != "broadcast_in_dim":  # a batch-shaped value from nothing: iota, random
            return False
        if name == "scan" and not isinstance(eqn.params.get("length"), int) and eqn.params.get("num_carry"):
            return False  # a scan over the batch with a carry: iteration t may know it is row t (a counter)
        if name == "custom_jvp_call" and rules and not _clean_rule(eqn):
            return False  # the rule (what a per-row jacrev runs) reads the batch size or positions
        for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
            inner = eqn.params.get(key)
            inner = getattr(inner, "jaxpr", inner)
            if inner is not None and hasattr(inner, "eqns") and not _clean(inner, rules):
                return False
        for branch in eqn.params.get("branches", ()):
            if not _clean(branch.jaxpr, rules):
                return False
        for key in ("body_jaxpr", "cond_jaxpr"):
            inner = eqn.params.get(key)
            if inner is not None and not _clean(getattr(inner, "jaxpr", inner), rules):
                return False
    return True
