"""Custom derivative rules on the tape: a :class:`Primitive` made at run time for each call.

``apply_rule(rule, arrays)`` binds a fresh primitive to the arrays. Its implementation runs the rule's
``fwd`` (or ``fun``) on NumPy values; its rules call the user's rule with the traced values of the
level that asks, so derivatives of derivatives differentiate the rule itself:

* VJP: ``bwd(residuals, g)``. The residuals are those ``fwd`` computed when the arguments are the
  very NumPy values it ran on (first order); on traced arguments (a nested transform) ``fwd`` runs
  again on them, so the residuals carry the outer derivatives. With only a JVP rule: reverse mode
  over ``t -> jvp(primals, t)`` recorded with the tape's own ops (the transpose of a linear map).
* JVP: the rule's ``jvp``; with only ``bwd``: its transpose, reverse mode over ``g -> bwd(res, g)``.

The tape sees one output per primitive: several outputs travel packed into one flat array
(``_primitives._join``/``_split``, as the decompositions' results do). A batch of cotangents or
tangents (a Jacobian's one sweep) meets the user's rule one row at a time, since a rule is written
for one; the transposed forms take the whole batch in one sweep.
"""

from __future__ import annotations

import numpy as np

from . import _primitives as P
from ._core import backward, record
from ._tracer import Primitive, Tracer, _ndim, _shape

__all__ = ["apply_rule", "stop_gradient"]

stop_gradient = P.defprim("stop_gradient", lambda x: x, vjp=(None,), jvp=(None,))


def apply_rule(rule, arrays):
    arrays = tuple(arrays)
    if not any(isinstance(a, Tracer) for a in arrays):
        return tuple(rule.primal(*arrays))  # nothing is being differentiated
    made = _Made(rule, len(arrays))
    packed = made.primitive(*arrays)
    return made.unpack(packed)


class _Made:
    """The primitive of one call of a rule, and what its implementation learnt (output shapes, residuals)."""

    def __init__(self, rule, n):
        self.rule, self.n = rule, n
        self.specs = None  # (shape, dtype) per output, set by the implementation
        self.stash = None  # (arguments, residuals) of the last fwd on NumPy values
        self.cache = None  # (g, args, cotangents): one bwd call serves every argument's VJP rule
        self.primitive = Primitive(f"custom:{rule.name}", self.impl,
                                   vjps=tuple(self.vjp_rule(i) for i in range(n)),
                                   jvps=(None,) * n, jvp_joint=self.jvp_joint)

    # -------------------------------------------------------------------- packing
    @property
    def packed(self):
        return len(self.specs) != 1

    def cores(self):
        return [s for s, _ in self.specs]

    def dtype(self):
        return np.result_type(*[d for _, d in self.specs])

    def impl(self, *arrays):
        if self.rule.fwd is not None:
            outs, res = self.rule.fwd(*arrays)
            self.stash = (arrays, res)
        else:
            outs = self.rule.primal(*arrays)
        outs = [np.asarray(o) for o in outs]
        if self.specs is None:
            self.specs = tuple((o.shape, o.dtype) for o in outs)
        if len(outs) == 1:
            return outs[0]
        return P._pack_np(outs, ())

    def unpack(self, value):
        """The outputs of a packed value (any leading axes), each in its own dtype."""
        if not self.packed:
            return (value,)
        parts = P._split(value, self.cores())
        return tuple(p if np.dtype(p.dtype) == d else P.astype(p, dtype=d) for p, (_, d) in zip(parts, self.specs))

    def pack(self, parts):
        if not self.packed:
            return parts[0]
        return P._join(list(parts), self.cores(), self.dtype())

    def residuals(self, args):
        stash = self.stash
        if stash is not None and len(stash[0]) == len(args) and all(a is b for a, b in zip(stash[0], args)):
            return stash[1]
        return self.rule.fwd(*args)[1]  # traced arguments: residuals that carry the outer derivatives

    # -------------------------------------------------------------------- reverse mode
    def vjp_rule(self, i):
        def rule(g, ans, *args):
            cache = self.cache
            if cache is None or cache[0] is not g or any(a is not b for a, b in zip(cache[1], args)):
                cache = self.cache = (g, args, self.cotangents(g, ans, args))
            return cache[2][i]
        return rule

    def cotangents(self, g, ans, args):
        nb = _ndim(g) - _ndim(ans)
        if self.rule.bwd is None:  # the transpose of the JVP rule, the whole batch in one sweep
            zeros = tuple(np.zeros(_shape(a), dtype=a.dtype) for a in args)

            def linear(*tangents):
                return (self.pack(self.rule.jvp(args, tangents)[1]),)

            trace, _, out_indices, _ = record(linear, zeros, False)
            return backward(trace, out_indices, (g,), len(args), zeros, batch_shape=_shape(g)[:nb])
        res = self.residuals(args)
        one = lambda gs: tuple(self.rule.bwd(res, self.unpack(gs[0])))  # noqa: E731
        return _rows(one, (g,), nb, [(_shape(a), a.dtype) for a in args])

    # -------------------------------------------------------------------- forward mode
    def jvp_joint(self, tangents, ans, *args):
        k = next(j for j, t in enumerate(tangents) if t is not None)
        nb = _ndim(tangents[k]) - _ndim(args[k])
        batch = _shape(tangents[k])[:nb]
        full = tuple(np.zeros(batch + _shape(a), dtype=a.dtype) if t is None else t for t, a in zip(tangents, args))
        if self.rule.jvp is not None:
            one = lambda ts: (self.pack(self.rule.jvp(args, ts)[1]),)  # noqa: E731
            return _rows(one, full, nb, [(_shape(ans), ans.dtype)])[0]
        # the transpose of bwd: reverse mode over g -> bwd(res, g), the whole batch in one sweep
        res = self.residuals(args)
        zero = np.zeros(_shape(ans), dtype=ans.dtype)

        def linear(g):
            return tuple(self.rule.bwd(res, self.unpack(g)))

        trace, _, out_indices, _ = record(linear, (zero,), False)
        (t_out,) = backward(trace, out_indices, full, 1, (zero,), batch_shape=batch)
        return t_out


def _rows(fn, batched, nb, out_specs):
    """``fn(items)`` (a tuple of results) applied to each row of the ``nb`` leading axes of ``batched``,
    stacked back; ``out_specs`` (shape, dtype) give the results' shapes for an empty batch."""
    if nb == 0:
        return tuple(fn(batched))
    size = _shape(batched[0])[0]
    if size == 0:
        rest = _shape(batched[0])[1:nb]
        return tuple(np.zeros((0, *rest, *s), dtype=d) for s, d in out_specs)
    rows = [_rows(fn, tuple(b[r] for b in batched), nb - 1, out_specs) for r in range(size)]
    return tuple(_stack([row[j] for row in rows]) for j in range(len(rows[0])))


def _stack(values):
    if not any(isinstance(v, Tracer) for v in values):
        return np.stack([np.asarray(v) for v in values])
    return P.concat(*[P.reshape(v, (1, *_shape(v))) for v in values], axis=-(_ndim(values[0]) + 1))


