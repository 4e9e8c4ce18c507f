"""Custom derivative rules on JAX: ``jax.custom_vjp`` for reverse mode, ``jax.custom_jvp`` for forward mode.

JAX refuses forward mode on a ``jax.custom_vjp`` function, and reverse mode of a ``jax.custom_jvp``
is the transpose of its rule. So the form handed to JAX is chosen by the transform that will
process the call first (the innermost differentiating trace, found by walking the current trace and
its parents past ``vmap``'s batch traces):

* a reverse trace (``jax.vjp``/``grad``/``jacrev``: JAX's ``LinearizeTrace``) or none: a rule with
  ``bwd`` becomes ``jax.custom_vjp`` -- JAX calls ``bwd`` itself, also when it is not linear
  (gradient clipping), and differentiates it for second derivatives;
* a forward trace (``jax.jvp``/``jacfwd``: ``JVPTrace``): ``jax.custom_jvp``, whose tangent is the
  rule's ``jvp``, or else the transpose of ``bwd`` (``jax.linear_transpose`` of ``g -> bwd(res, g)``).
  Reverse mode over that form (JAX transposing the transposed ``bwd``) gives ``bwd`` back.

A rule with only a JVP rule is always ``jax.custom_jvp``.
"""

from __future__ import annotations

import jax
from jax._src import core as _jax_core

__all__ = ["apply_rule"]


def _forward_on_top() -> bool:
    """Is the innermost differentiating trace a forward-mode (JVP) trace?"""
    trace = getattr(_jax_core, "trace_ctx", None)
    trace = getattr(trace, "trace", None)
    for _ in range(64):
        if trace is None:
            return False
        name = type(trace).__name__
        if name == "JVPTrace":
            return True
        if name != "BatchTrace":  # LinearizeTrace, a jaxpr or the eval trace: not forward mode here
            return False
        trace = getattr(trace, "parent_trace", None)
    return False


def apply_rule(rule, arrays):
    arrays = tuple(arrays)
    if rule.bwd is not None and not _forward_on_top():
        return _as_custom_vjp(rule)(*arrays)
    return _as_custom_jvp(rule)(*arrays)


def _as_custom_vjp(rule):
    f = jax.custom_vjp(lambda *xs: tuple(rule.primal(*xs)))

    def fwd(*xs):
        outs, res = rule.fwd(*xs)
        return tuple(outs), tuple(res)

    def bwd(res, cotangents):
        return tuple(rule.bwd(res, tuple(cotangents)))

    f.defvjp(fwd, bwd)
    return f


def _as_custom_jvp(rule):
    f = jax.custom_jvp(lambda *xs: tuple(rule.primal(*xs)))

    def jvp(primals, tangents):
        if rule.jvp is not None:
            outs, tangents_out = rule.jvp(tuple(primals), tuple(tangents))
            return tuple(outs), tuple(tangents_out)
        outs, res = rule.fwd(*primals)
        outs = tuple(outs)
        structs = [jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs]
        transposed = jax.linear_transpose(lambda *g: tuple(rule.bwd(res, g)), *structs)
        return outs, tuple(transposed(tuple(tangents)))

    f.defjvp(jvp)
    return f
