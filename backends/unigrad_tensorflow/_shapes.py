"""Shapes of TensorFlow's Array API namespace: reshape, broadcasting, axes, joining and tiling.

One floor above ``_tensors``: linear algebra (``_linalg``) and the namespace build on these.
"""

from __future__ import annotations

import builtins
import functools

import tensorflow as tf

from ._tensors import _axes, _promote, _shape_arg, _tensor

_SIGNED = {tf.uint8: tf.int8, tf.uint16: tf.int16, tf.uint32: tf.int32, tf.uint64: tf.int64}

__all__ = ["reshape", "broadcast_to", "broadcast_arrays", "permute_dims", "matrix_transpose", "moveaxis",
           "expand_dims", "squeeze", "flip", "roll", "concat", "stack", "unstack", "tile", "repeat"]


def reshape(x, /, shape, *, copy=None):
    return tf.reshape(_tensor(x), _shape_arg(shape))


def broadcast_to(x, /, shape):
    return tf.broadcast_to(_tensor(x), _shape_arg(shape))


def broadcast_arrays(*arrays):
    arrays = [_tensor(a) for a in arrays]
    if len(arrays) < 2:
        return arrays
    shape = functools.reduce(tf.broadcast_static_shape, (a.shape for a in arrays))
    if not shape.is_fully_defined():  # data-dependent sizes (a boolean mask inside tf.function)
        shape = functools.reduce(tf.broadcast_dynamic_shape, (tf.shape(a) for a in arrays))
    return [tf.broadcast_to(a, shape) for a in arrays]


def permute_dims(x, /, axes):
    return tf.transpose(_tensor(x), [int(a) for a in axes])


def matrix_transpose(x, /):
    x = _tensor(x)
    if x.shape.rank < 2:
        raise ValueError(f"matrix_transpose needs an array of at least 2 dimensions; got shape {tuple(x.shape)}")
    return tf.linalg.matrix_transpose(x)


def moveaxis(x, source, destination, /):
    x = _tensor(x)
    nd = x.shape.rank
    src = _axes(source, nd) if isinstance(source, int) else [int(s) % nd for s in source]
    dst = _axes(destination, nd) if isinstance(destination, int) else [int(d) % nd for d in destination]
    order = [a for a in range(nd) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return tf.transpose(x, order)


class AxisError(ValueError, IndexError):
    """An axis out of bounds: an IndexError as the standard says, and a ValueError as before (NumPy's
    AxisError is both)."""


def expand_dims(x, /, axis=0):
    x = _tensor(x)
    nd = x.shape.rank + 1
    if not -nd <= axis < nd:
        raise AxisError(f"expand_dims: axis {axis} is out of bounds for the result of dimension {nd}")
    return tf.expand_dims(x, axis)


def squeeze(x, /, axis):
    x = _tensor(x)
    axes = _axes(axis, x.shape.rank)
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of size {x.shape[a]}")
    return tf.squeeze(x, axes) if axes else x


def flip(x, /, *, axis=None):
    x = _tensor(x)
    return tf.reverse(x, _axes(axis, x.shape.rank))


def roll(x, /, shift, *, axis=None):
    x = _tensor(x)
    if axis is None:
        return tf.reshape(tf.roll(tf.reshape(x, [-1]), shift, 0), tf.shape(x))
    axes = [axis] if isinstance(axis, int) else list(axis)
    shifts = [shift] * len(axes) if isinstance(shift, int) else list(shift)
    return tf.roll(x, shifts, axes)


def concat(arrays, /, *, axis=0):
    arrays = _promote(*arrays)
    if axis is None:
        return tf.concat([tf.reshape(a, [-1]) for a in arrays], 0)
    return tf.concat(list(arrays), _axes(axis, arrays[0].shape.rank)[0])


def stack(arrays, /, *, axis=0):
    return tf.stack(list(_promote(*arrays)), axis=axis)


def unstack(x, /, *, axis=0):
    return tuple(tf.unstack(_tensor(x), axis=axis))


def tile(x, repetitions, /):
    x = _tensor(x)
    reps = [int(r) for r in repetitions]
    nd = builtins.max(x.shape.rank, len(reps))
    x = tf.reshape(x, [1] * (nd - x.shape.rank) + x.shape.as_list())
    reps = [1] * (nd - len(reps)) + reps
    if x.dtype.is_unsigned:  # no Tile kernel for uint16 and wider: tiled as the signed integers of their bits
        return tf.bitcast(tf.tile(tf.bitcast(x, _SIGNED[x.dtype]), reps), x.dtype)
    return tf.tile(x, reps)


def repeat(x, repeats, /, *, axis=None):
    x = _tensor(x)
    if axis is None:
        x, axis = tf.reshape(x, [-1]), 0
    if not isinstance(repeats, int):  # any integer dtype (TensorFlow's kernel takes int32/int64 only)
        repeats = tf.cast(_tensor(repeats), tf.int64)
    return tf.repeat(x, repeats, axis=axis)
