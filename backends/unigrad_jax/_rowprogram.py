"""One example of ``f`` computed alone, where ``f`` reads the batch size as a number (``x / x.shape[0]``).

``per_example_jacobian`` maps a one-example Jacobian over the batch (``vmap(jacrev(f_one))``, which XLA
simplifies best). Calling ``f`` on a batch of one is that one-example function only where ``f`` uses
neither the batch size nor positions in the batch (``_proof._separable``). Many functions with
independent rows do read the batch size -- a mean-reduced loss divides by it -- and then ``f`` on one
example computes another number. This module builds the right one-example function from ``f``'s
program instead: ``f`` traced with a *symbolic* batch size ``b``, then evaluated equation by equation on
one example, every shape parameter at ``b = 1`` and every value made from the batch size
(``dim_as_value``) at the call's batch size. That is row i of ``f`` for every i where the rows are
independent (proved before this runs: the core calls ``per_example_jacobian`` only then) and no value
is made from positions in the batch (an ``iota`` over it, random bits, a loop over the batch with a
carry): those, and custom rules (whose derivative the program does not show), give None, and the sum
trick -- exact for any ``f`` with independent rows -- is used instead.
"""

from __future__ import annotations

import jax
import numpy as np

from ._batchvalues import _at, constants_stay_rowwise, same_program

#: Call-like primitives evaluated by inlining their program (their semantics are the program's; ``remat``
#: only changes what the backward pass stores).
_INLINE = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint"})
_NAME = "b"


def row_function(f, primals, batch, concrete=None):
    """``one(*example) -> outputs of one example`` built from ``f``'s program at a symbolic batch size (see
    the module docstring), or None where it cannot be shown equal to a row of ``f``. ``f`` returns a tuple
    of arrays; ``batch`` is the call's batch size; ``concrete``, where given, ``f``'s program traced at the
    call's shapes, which the symbolic one must be (no Python decision on the batch size)."""
    from jax import export

    try:
        (b,) = export.symbolic_shape(_NAME)
        specs = [jax.ShapeDtypeStruct((b,) + tuple(p.shape[1:]), p.dtype) for p in primals]
        closed = jax.make_jaxpr(f)(*specs)
    except Exception:  # f reads the batch size where a number must be concrete (a Python loop over it)
        return None
    if not _evaluable(closed.jaxpr) or not constants_stay_rowwise(closed.jaxpr):
        return None
    if concrete is not None and not same_program(closed, concrete, batch):
        return None
    jaxpr, consts = closed.jaxpr, closed.consts

    def one(*example):
        outs = _evaluate(jaxpr, consts, [x[None] for x in example], batch)
        return tuple(o[0] for o in outs)

    return one


def _symbolic(shape):
    return any(not isinstance(d, (int, np.integer)) for d in shape)


def _evaluable(jaxpr) -> bool:
    """Can ``jaxpr`` be evaluated one example at a time by :func:`_evaluate`: no value made from positions
    in the batch or from nothing at the batch's shape, no loop over the batch, no custom rule, no program
    inside an equation other than an inlined call's?"""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dim_as_value":
            continue
        if name in _INLINE:
            inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            if inner is None or not _evaluable(getattr(inner, "jaxpr", inner)):
                return False
            continue
        if any(hasattr(v, "eqns") or hasattr(v, "jaxpr") or callable(v) for v in eqn.params.values()):
            return False  # a loop, a branch, a custom rule: their programs are not rewritten here
        made = any(_symbolic(getattr(v.aval, "shape", ())) for v in eqn.outvars)
        given = any(_symbolic(getattr(getattr(v, "aval", None), "shape", ())) for v in eqn.invars)
        if made and not given and name != "broadcast_in_dim":  # a batch-shaped value from nothing: iota, random
            return False
    return True


def _evaluate(jaxpr, consts, args, batch):
    """The outputs of ``jaxpr`` (traced at the symbolic batch size) for one example (``args``: arrays of
    batch 1): shapes at ``b = 1``, values made from the batch size (``dim_as_value``) at ``batch``."""
    one, full = {_NAME: 1}, {_NAME: batch}
    env = {}

    def read(v):
        return v.val if type(v).__name__ == "Literal" else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        invals = [read(v) for v in eqn.invars]
        if name == "dim_as_value":
            (out,) = eqn.outvars
            outs = [jax.numpy.asarray(_at(eqn.params["dim"], full), dtype=out.aval.dtype)]
        elif name in _INLINE:
            inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            outs = _evaluate(getattr(inner, "jaxpr", inner), getattr(inner, "consts", ()), invals, batch)
        else:
            params = {k: _at(v, one) for k, v in eqn.params.items()}
            outs = eqn.primitive.bind(*invals, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in jaxpr.outvars]
