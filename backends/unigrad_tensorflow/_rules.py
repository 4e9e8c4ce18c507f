"""Custom derivative rules on TensorFlow: the rule recorded as one operation on every tape and accumulator.

This is what ``tf.custom_gradient`` does inside, plus a forward function: ``tf.custom_gradient``
gives accumulators nothing (measured: ``ForwardAccumulator`` then differentiates the forward ops
eagerly, and gives zeros under ``tf.vectorized_map``), so the operation is recorded with
``record_operation(..., backward_function, forward_function)``:

* backward: the rule's ``bwd`` -- or, with only a JVP rule, the transpose of ``t -> jvp(primals, t)``
  (a ``GradientTape`` over that linear map);
* forward: the JVP rule -- or, with only ``bwd``, its transpose (a ``GradientTape`` over ``g -> bwd(res, g)``).

The forward function runs with recording stopped (tapes and accumulators), so its residuals are
constants to every tape; where a tape or accumulator may record the gradient function (second
order), ``fwd`` runs again there on the inputs, so the residuals carry the outer derivatives.
The user's code sees :class:`Array` s, as inside any transform; TensorFlow sees tensors.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import forwardprop_util
from tensorflow.python.eager import record as _record

from . import _array
from ._array import Array

__all__ = ["apply_rule", "stop_gradient"]


def _plain(x):
    return x._t if type(x) is Array else x


def _user(fn, *args):
    """``fn`` on ``args`` (tuples of tensors, wrapped as Arrays) with the namespace in its inside-``f``
    mode; the results' tensors come back plain."""
    token = _array._INSIDE.set(True)
    try:
        result = fn(*[_wrap(a) for a in args])
    finally:
        _array._INSIDE.reset(token)
    return _unwrap(result)


def _wrap(tree):
    if isinstance(tree, tf.Tensor):
        return Array(tree)
    if type(tree) in (tuple, list):
        return type(tree)(_wrap(v) for v in tree)
    return tree


def _unwrap(tree):
    if type(tree) is Array:
        return tree._t
    if type(tree) in (tuple, list):
        return type(tree)(_unwrap(v) for v in tree)
    return tree


def apply_rule(rule, arrays):
    inside = _array._INSIDE.get() or any(type(a) is Array for a in arrays)
    xs = tuple(tf.convert_to_tensor(_plain(a)) for a in arrays)
    if pywrap_tfe.TFE_Py_TapeSetIsStopped():  # nothing records (a rule's own fwd calling the function)
        outs = _user(lambda *a: rule.primal(*a), *xs)
        return tuple(Array(o) for o in outs) if inside else tuple(outs)
    with _record.stop_recording():  # tapes and accumulators see the rule, not the ops of fwd
        if rule.fwd is not None:
            outs, res = _user(lambda *a: rule.fwd(*a), *xs)
        else:
            outs, res = _user(lambda *a: rule.primal(*a), *xs), ()
        outs = [tf.identity(o) for o in outs]  # fresh tensors: an input returned as it is stays itself
    res = tuple(res)

    def residuals():
        if rule.fwd is not None and _record.could_possibly_record():
            return tuple(_user(lambda *a: rule.fwd(*a)[1], *xs))  # second order: functions of the inputs
        return res

    def backward_function(*cotangents):
        cotangents = tuple(tf.zeros_like(o) if c is None else _conj(c) for c, o in zip(cotangents, outs))
        if rule.bwd is not None:
            cts = _user(lambda r, g: rule.bwd(r, g), residuals(), cotangents)
        else:  # the transpose of the JVP rule
            zeros = [tf.zeros_like(x) for x in xs]
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(zeros)
                tangents_out = _user(lambda p, t: rule.jvp(p, t)[1], xs, tuple(zeros))
            cts = [_conj(c) for c in tape.gradient(list(tangents_out), zeros,
                                                   output_gradients=[_conj(c) for c in cotangents],
                                                   unconnected_gradients=tf.UnconnectedGradients.ZERO)]
        return [_conj(c) for c in cts]

    def forward_function(*tangents):
        tangents = tuple(tf.zeros_like(x) if t is None else t for t, x in zip(tangents, xs))
        if rule.jvp is not None:
            return list(_user(lambda p, t: rule.jvp(p, t)[1], xs, tangents))
        r = residuals()  # the transpose of bwd
        zeros = [tf.zeros_like(o) for o in outs]
        with forwardprop_util.push_forwardprop_state():  # else the accumulator's own jvp work records nothing
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(zeros)
                cts = _user(lambda r_, g: rule.bwd(r_, g), r, tuple(zeros))
        return [_conj(t) for t in tape.gradient(list(cts), zeros, output_gradients=[_conj(t) for t in tangents],
                                                unconnected_gradients=tf.UnconnectedGradients.ZERO)]

    _record.record_operation(f"unigrad_rule_{rule.name}", outs, list(xs), backward_function, forward_function)
    return tuple(Array(o) for o in outs) if inside else tuple(outs)


def _conj(c):
    return tf.math.conj(c) if c.dtype.is_complex else c


def stop_gradient(x):
    """``tf.stop_gradient``, an :class:`Array` kept an :class:`Array` (inside ``f``)."""
    if type(x) is Array:
        return Array(tf.stop_gradient(x._t))
    return tf.stop_gradient(x)
