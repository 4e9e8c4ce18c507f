"""``unigrad.checkpoint`` on TensorFlow: a ``tf.custom_gradient`` whose gradient recomputes the block.

``tf.recompute_grad`` is not used: it refuses forward mode ("tried to transpose grad") and so
``ForwardAccumulator`` around a tape (``hvp``), and it drops the derivative of a tensor the block
closes over without a word. Here:

* the forward pass runs the block on ``tf.stop_gradient`` copies of its inputs, so no tape records
  what happens inside (the memory saved); a tape records an operation only when it watches one of
  its inputs, so if an output comes out watched anyway -- or carrying a forward-mode tangent --
  the block used a watched tensor it closes over, and that is a TypeError instead of a lost
  derivative;
* the gradient re-runs the block under a fresh ``GradientTape`` and pulls the cotangents back:
  TensorFlow's ops all the way, so outer tapes record it (Hessians by nested tapes).

Forward mode runs the block as it is: when an input carries a ``ForwardAccumulator`` tangent
(``jvp``, ``jacfwd``, ``hvp``'s accumulator around a tape) -- TensorFlow's forward mode through a
``custom_gradient`` gave zero tangents here (TensorFlow 2.20) -- and so does a call with no tape or
accumulator active (plain evaluation).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import forwardprop_util, record

from . import _array
from ._array import Array

__all__ = ["checkpoint"]


def checkpoint(f, primals):
    """``tuple(f(*primals))`` (``primals`` tensors or :class:`Array` s), recomputed in the backward pass."""
    inside = _array._INSIDE.get()
    tensors = tuple(_plain(p) for p in primals)
    name = getattr(f, "__name__", "the block")

    def run(xs):
        token = _array._INSIDE.set(True)
        try:
            outputs = f(*[Array(x) for x in xs])
        finally:
            _array._INSIDE.reset(token)
        return [_plain(o) for o in outputs]

    if not record.could_possibly_record() or _has_tangents(tensors):
        outputs = run(tensors)  # nothing records, or forward mode: the block as it is
    else:
        @tf.custom_gradient
        def block(*xs):
            outputs = run([tf.stop_gradient(x) for x in xs])
            if record.should_record_backprop(outputs) or _has_tangents(outputs):
                raise TypeError(
                    f"checkpoint: {name} used a tensor being differentiated that is not one of its arguments "
                    f"(a value it closes over, computed inside the transform); rematerialisation recomputes "
                    f"the block from its arguments alone, so pass it to the checkpointed function as an argument")

            def gradient(*cotangents):
                with tf.GradientTape(watch_accessed_variables=False) as tape:
                    tape.watch(xs)
                    recomputed = run(xs)
                return tape.gradient(recomputed, list(xs), output_gradients=list(cotangents),
                                     unconnected_gradients=tf.UnconnectedGradients.ZERO)

            return outputs, gradient

        outputs = block(*tensors)
        outputs = [outputs] if isinstance(outputs, tf.Tensor) else outputs
    return tuple(Array(o) if inside else o for o in outputs)


def _has_tangents(tensors):
    """Does an active ``ForwardAccumulator`` hold a tangent for one of ``tensors``?"""
    try:
        return bool(forwardprop_util.pack_tangents(tensors).tangents)
    except Exception:  # an internal API: if it is gone, say nothing rather than fail every call
        return False


def _plain(x):
    return x._t if type(x) is Array else x
