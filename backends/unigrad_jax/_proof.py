"""Per-example Jacobians by proof on JAX: the rows of ``f`` read from its jaxpr.

``batch_rows`` traces ``f`` once per signature (``jax.make_jaxpr``; the core caches the answer) and runs
unigrad's row analysis over it (:mod:`unigrad.dependence`): MIXED names the operation that mixes rows,
ROW proves them independent, and then the sum trick is exact for ``f``. It never offers to compute one
example alone: JAX's sum trick holds each unit vector once, not once per example (``_broadcasts``), and
is as fast as ``vmap(jacrev(f_one))`` in both modes, so no analysis of whether ``f`` on one example is a
row of ``f`` (the batch size read as a number, positions in the batch: the analysis that shipped silent
wrong answers) stands between a proof and the answer.
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

    _, closed = closed_jaxpr(f, primals, has_aux)
    with _x64(f, primals):
        # the arrays f is given but not differentiated (its closure_arrays) are constants of the jaxpr whose
        # values change from call to call: the proof, kept per signature, must hold for any of them
        unknown = {id(a) for a in getattr(f, "closure_arrays", ())}
        verdict, detail = prove_rows(from_closed_jaxpr(closed, unknown=unknown), primals[0].shape[0])
    return verdict, detail, False

