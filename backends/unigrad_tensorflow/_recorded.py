"""Namespace functions recorded as one operation with unigrad's VJP *and* JVP at their hard points.

``tf.custom_gradient`` sets only the reverse rule: a ``ForwardAccumulator`` ignores it and applies
TensorFlow's own JVPs to the ops inside, so ``maximum(x, 0)`` at 0 had derivative 1/2 in reverse mode
and 1 in forward mode (docs/conventions.md). :func:`recorded` makes a function whose call is recorded,
on every active tape and accumulator, as one operation with a backward function (the VJP) and a
forward function (the JVP), both written with TensorFlow ops so that they are differentiated in turn
(second order in any nesting). The same mechanism as ``unigrad.custom_vjp`` on TensorFlow (``_rules``),
without its user-facing checks.

Cost: eagerly, when nothing records (no tape or accumulator, or recording stopped), the primal runs as it is,
with no wrapping at all. Inside a graph (``tf.function``, ``tf.vectorized_map``) the primal also goes through
``tf.custom_gradient`` (with recording stopped, so no tape sees it twice): TensorFlow's symbolic
gradients of a function called under a tape *outside* the graph read the op registry, not the tape,
and still get the reverse rule.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import context as _context
from tensorflow.python.eager import record as _record

__all__ = ["recorded"]


def recorded(name, primal, vjp, jvp):
    """``op(*xs)``: ``primal(*xs)`` (one output tensor), with derivative rules of its own in both modes.

    Args:
        name: the operation's name on the tape (for TensorFlow's messages).
        primal: ``primal(*xs) -> y``, TensorFlow ops on tensors.
        vjp: ``vjp(g, y, *xs) -> (gx_1, ..., gx_n)``: each cotangent summed down to its input's shape.
        jvp: ``jvp(tangents, y, *xs) -> ty`` with ``ty`` of ``y``'s shape; a tangent is None for an input
            that has none (do not multiply a derivative by a zero made up for it: 0 * inf is NaN).

    Returns:
        the function, to be called on tensors (the caller has converted and promoted them).

    Example:
        >>> twice = recorded("twice", lambda x: 2 * x, lambda g, y, x: (2 * g,), lambda t, y, x: 2 * t[0])
    """
    @tf.custom_gradient
    def in_graph(*xs):
        y = primal(*xs)
        return y, lambda g: list(vjp(g, y, *xs))

    def op(*xs):
        run = primal if _context.executing_eagerly() else in_graph
        if pywrap_tfe.TFE_Py_TapeSetIsEmpty() or pywrap_tfe.TFE_Py_TapeSetIsStopped():
            return run(*xs)  # nothing watches here: nothing to record
        pywrap_tfe.TFE_Py_TapeSetStopOnThread()  # record.stop_recording(), without a generator's cost
        try:
            y = run(*xs)
        finally:
            pywrap_tfe.TFE_Py_TapeSetRestartOnThread()

        def backward(g):
            if g is None:
                return [None] * len(xs)
            return list(vjp(g, y, *xs))

        def forward(*tangents):
            if all(t is None for t in tangents):
                return [None]
            # ``y`` again, as this op: when this runs, ``y`` is not yet recorded on the tapes that watch
            # (TensorFlow computes the JVPs before it records the op), so a rule reading ``y`` would give
            # a reverse pass over this JVP no derivative through it (grad of jvp of 2 ** x was 0)
            return [jvp(tangents, op(*xs), *xs)]

        _record.record_operation(name, [y], list(xs), backward, forward)
        return y

    op.__name__ = op.__qualname__ = name
    return op
