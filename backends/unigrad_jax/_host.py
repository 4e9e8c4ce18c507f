"""``Backend.host_callback`` on JAX (``unigrad.bridge`` inside ``jax.jit`` or ``jax.vmap``): ``jax.pure_callback``."""

from __future__ import annotations

import jax
import numpy as np


def host_callback(fn, arrays, out_specs, jvp):
    """``jax.pure_callback`` (sequential under vmap), inside a ``jax.custom_jvp`` whose rule is ``jvp`` (the
    bridged JVP): an outer forward-mode trace (``hessian``: forward over reverse) differentiates the primal
    call of a rule's ``fwd`` too, and a callback alone has no JVP."""
    shapes = tuple(jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype in out_specs)

    def host(*xs):
        return tuple(jax.pure_callback(fn, shapes, *xs, vmap_method="sequential"))

    if jvp is None:
        return host(*arrays)
    call = jax.custom_jvp(host)

    @call.defjvp
    def call_jvp(primals, tangents):
        # The outputs from their own callback: under a vmap over tangents (jacfwd) the primal outputs
        # stay unbatched, as JAX expects of them.
        return host(*primals), tuple(jvp(tuple(primals), tuple(tangents)))

    return tuple(call(*arrays))
