"""``Backend.host_callback`` on TensorFlow (``unigrad.bridge`` inside ``tf.function`` or ``tf.vectorized_map``):
``tf.py_function``."""

from __future__ import annotations

import tensorflow as tf


def host_callback(fn, tensors, out_specs):
    """``fn`` (NumPy in, NumPy out) as one ``tf.py_function``, its outputs given their static shapes. Its
    derivatives are the bridge's rule's (``tf.custom_gradient``), so it needs no gradient of its own."""

    def host(*values):
        return [tf.convert_to_tensor(o) for o in fn(*(v.numpy() for v in values))]

    outputs = tf.py_function(host, list(tensors), Tout=[tf.as_dtype(dtype) for _, dtype in out_specs])
    for o, (shape, _) in zip(outputs, out_specs):
        o.set_shape(shape)
    return tuple(outputs)
