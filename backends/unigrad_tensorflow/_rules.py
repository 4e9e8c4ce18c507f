"""Custom derivative rules on TensorFlow: the rule recorded as one operation on every tape and accumulator.

This is what ``tf.custom_gradient`` does inside, plus a forward function: ``tf.custom_gradient``
gives accumulators nothing (measured: ``ForwardAccumulator`` then differentiates the forward ops
eagerly, and gives zeros under ``tf.vectorized_map``), so the operation is recorded with
``record_operation(..., backward_function, forward_function)``:

* backward: the rule's ``bwd`` -- or, with only a JVP rule, the transpose of ``t -> jvp(primals, t)``
  (a ``GradientTape`` over that linear map);
* forward: the JVP rule -- or, with only ``bwd``, its transpose (a ``GradientTape`` over ``g -> bwd(res, g)``).

A rule's code may itself use transforms (``unigrad.linear_solve``'s rules are made of JVPs, VJPs and
linear solves whose matvec is a JVP), so it never runs with recording stopped (TensorFlow's
``stop_recording`` blinds every tape, the ones the rule opens too). What the active tapes and
accumulators must not see is kept from them by isolation instead (:func:`_isolated`): the code runs on
copies of its inputs that no active tape or accumulator knows, so it records nothing on them while the
tapes and accumulators it opens itself work. ``fwd`` runs so; where a tape or accumulator may record
the gradient function (second order), ``fwd`` runs again there on the inputs, so the residuals carry
the outer derivatives.

The forward function runs while its accumulator is busy, and TensorFlow lets only the tapes and
accumulators older than a busy one record: a tape opened inside would record nothing (measured: a
gradient of None). So the JVP is computed isolated, and recorded as one operation of its own on
``(primals, tangents)`` (:func:`_code_op`) for the older tapes and accumulators, whose derivatives
(reverse over forward, forward over forward) are those of the JVP's code -- recursively, to any order.
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
    if pywrap_tfe.TFE_Py_TapeSetIsStopped() or not pywrap_tfe.TFE_Py_TapeSetPossibleGradientTypes(xs):
        # nothing watches the inputs (a rule's own fwd calling the function on its isolated copies): no record
        outs = _user(lambda *a: rule.primal(*a), *xs)
        return tuple(Array(o) for o in outs) if inside else tuple(outs)
    if rule.fwd is not None:  # tapes and accumulators see the rule, not the ops of fwd
        outs, res = _isolated(lambda *a: _user(lambda *b: rule.fwd(*b), *a), xs)
    else:
        outs, res = _isolated(lambda *a: _user(lambda *b: rule.primal(*b), *a), xs), ()
    outs = _fresh(outs)
    res = tuple(res)
    n = len(xs)

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

    def tangent_map(*primals_and_tangents):  # (primals, tangents) -> the JVP, on plain tensors
        primals, tangents = primals_and_tangents[:n], primals_and_tangents[n:]
        if rule.jvp is not None:
            return list(_user(lambda p, t: rule.jvp(p, t)[1], primals, tangents))
        r = _user(lambda *a: rule.fwd(*a)[1], *primals) if rule.fwd is not None else ()  # the transpose of bwd
        zeros = [tf.zeros(o.shape, o.dtype) for o in outs]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(zeros)
            cts = _user(lambda r_, g: rule.bwd(r_, g), r, tuple(zeros))
        return [_conj(t) for t in tape.gradient(list(cts), zeros, output_gradients=[_conj(t) for t in tangents],
                                                unconnected_gradients=tf.UnconnectedGradients.ZERO)]

    def forward_function(*tangents):
        tangents = tuple(tf.zeros_like(x) if t is None else t for t, x in zip(tangents, xs))
        return _code_op(f"unigrad_rule_{rule.name}_jvp", tangent_map, xs + tangents)

    _record.record_operation(f"unigrad_rule_{rule.name}", outs, list(xs), backward_function, forward_function)
    return tuple(Array(o) for o in outs) if inside else tuple(outs)


def _isolated(fn, xs):
    """``fn(*xs)`` run on copies of ``xs`` that no active tape or accumulator knows (made with recording
    stopped), with the accumulators' state pushed: the active tapes and accumulators record none of its
    ops, and the tapes and accumulators ``fn`` opens itself record as anywhere (even while an accumulator
    is busy computing a forward function, where TensorFlow lets only older tapes record)."""
    with _record.stop_recording():
        copies = tuple(tf.identity(x) for x in xs)
    with forwardprop_util.push_forwardprop_state():
        return fn(*copies)


def _fresh(tensors):
    """New tensors with the values of ``tensors``, made with recording stopped: the outputs of a recorded
    operation (an input or a copy returned as it is would otherwise be two tensors' derivative at once)."""
    with _record.stop_recording():
        return [tf.identity(t) for t in tensors]


def _code_op(name, fn, xs):
    """``fn(*xs)`` (tensors to a list of tensors), computed isolated (:func:`_isolated`) and recorded as one
    operation on ``xs`` whose derivatives are those of ``fn``'s code: backward, a tape over ``fn`` on ``xs``
    (run where it is asked for, so its own ops are recorded for a higher order); forward, the JVP of
    ``fn`` by an accumulator, itself such an operation. Called in a forward function, it is recorded
    for the tapes and accumulators older than the busy one only: those that differentiate the JVP."""
    outs = _fresh(_isolated(fn, xs))
    if not pywrap_tfe.TFE_Py_TapeSetPossibleGradientTypes(xs):
        return outs
    n = len(xs)

    def backward_function(*cotangents):
        cotangents = [tf.zeros_like(o) if c is None else c for c, o in zip(cotangents, outs)]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(xs)
            again = fn(*xs)
        return tape.gradient(list(again), list(xs), output_gradients=cotangents,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)

    def pushed(*primals_and_tangents):
        primals, tangents = primals_and_tangents[:n], primals_and_tangents[n:]
        with tf.autodiff.ForwardAccumulator(list(primals), list(tangents)) as accumulator:
            again = fn(*primals)
        return [accumulator.jvp(o, unconnected_gradients=tf.UnconnectedGradients.ZERO) for o in again]

    def forward_function(*tangents):
        tangents = tuple(tf.zeros_like(x) if t is None else t for t, x in zip(tangents, xs))
        return _code_op(f"{name}_jvp", pushed, xs + tangents)

    _record.record_operation(name, outs, list(xs), backward_function, forward_function)
    return outs


def _conj(c):
    return tf.math.conj(c) if c.dtype.is_complex else c


def stop_gradient(x):
    """``tf.stop_gradient``, an :class:`Array` kept an :class:`Array` (inside ``f``)."""
    if type(x) is Array:
        return Array(tf.stop_gradient(x._t))
    return tf.stop_gradient(x)
