"""The lowest floor of TensorFlow's Array API namespace: tensors from anything, promotion, axes, devices.

Every other module of the namespace (``_shapes``, ``_linalg``, ``_fft``, ``_namespace``, ``_array``)
imports these helpers; this module imports none of them. :class:`TensorHolder` is the base of
``unigrad_tensorflow.Array`` (defined in ``_array``, above), here so that ``_tensor`` can take the
tensor out of an ``Array`` without importing it.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import math

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


class TensorHolder:
    """What holds one ``tf.Tensor`` in ``_t``: the base of ``unigrad_tensorflow.Array``."""

    __slots__ = ("_t",)


_SCALARS = (builtins.bool, int, float, complex)
_COMPLEX_OF = {tf.float16: tf.complex64, tf.bfloat16: tf.complex64, tf.float32: tf.complex64,
               tf.float64: tf.complex128}


def _dt(dtype):
    """A tf.DType from a tf.DType, a NumPy dtype or a dtype name (None stays None)."""
    return None if dtype is None else tf.as_dtype(dtype)


def _tensor(x, dtype=None):
    """``x`` as a tensor: tensors stay, Variables are read, anything else goes through NumPy (dtype kept)."""
    if isinstance(x, TensorHolder):
        x = x._t
    elif isinstance(x, tf.Variable):
        x = tf.convert_to_tensor(x)
    if not isinstance(x, tf.Tensor):
        x = tf.convert_to_tensor(np.asarray(x))
    return x if dtype is None or x.dtype == dtype else tf.cast(x, dtype)


def _scalar(s, dtype):
    """A Python scalar as a tensor of ``dtype``."""
    return tf.cast(s, dtype) if isinstance(s, builtins.bool) else tf.constant(s, dtype)


def _weak(s, dtype):
    """The dtype a Python scalar ``s`` combined with a tensor of ``dtype`` gives (Array API weak scalars)."""
    if isinstance(s, builtins.bool) or (isinstance(s, int) and not dtype.is_bool):
        return dtype
    if isinstance(s, float):
        return dtype if (dtype.is_floating or dtype.is_complex) else tf.float64
    if isinstance(s, complex):
        return dtype if dtype.is_complex else _COMPLEX_OF.get(dtype, tf.complex128)
    return tf.as_dtype(np.result_type(dtype.as_numpy_dtype, s))


def result_type(*arrays_and_dtypes):
    """Array API type promotion (NumPy's table; Python scalars are weak)."""
    dtypes = [a.dtype if isinstance(a, (tf.Tensor, tf.Variable)) else tf.as_dtype(a)
              for a in arrays_and_dtypes if not isinstance(a, _SCALARS)]
    scalars = [a for a in arrays_and_dtypes if isinstance(a, _SCALARS)]
    if not dtypes:
        return tf.as_dtype(np.result_type(*scalars))
    out = dtypes[0]
    if builtins.any(d != out for d in dtypes[1:]):
        out = tf.as_dtype(np.result_type(*(d.as_numpy_dtype for d in dtypes)))
    for s in scalars:
        out = _weak(s, out)
    return out


def _promote(*xs):
    """Tensors of one promoted dtype (Python scalars converted weakly)."""
    if builtins.all(isinstance(x, tf.Tensor) for x in xs) and len({x.dtype for x in xs}) == 1:
        return xs
    xs = [x if isinstance(x, _SCALARS) else _tensor(x) for x in xs]
    if builtins.all(isinstance(x, _SCALARS) for x in xs):
        xs = [_tensor(x) for x in xs]
    dtype = result_type(*xs)
    return [_scalar(x, dtype) if isinstance(x, _SCALARS) else _tensor(x, dtype) for x in xs]


def _shape_arg(shape):
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def _axes(axis, ndim):
    """``axis`` (None, int or sequence) as a sorted list of non-negative ints."""
    if axis is None:
        return list(range(ndim))
    axes = [int(axis)] if isinstance(axis, (int, np.integer)) else [int(a) for a in axis]
    out = []
    for a in axes:
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"axis {a} is out of bounds for an array of dimension {ndim}")
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {axis!r}")
    return sorted(out) if ndim else []


def _count(x, axes):
    """Number of elements reduced over ``axes`` (static when the shape is known)."""
    dims = [x.shape[a] for a in axes]
    if builtins.all(d is not None for d in dims):
        return math.prod(dims)
    return tf.reduce_prod(tf.gather(tf.shape(x), axes))


# -------------------------------------------------------------------- devices

def tf_device_name(device):
    """TensorFlow's name for a unigrad device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu:0"``) or a TF name."""
    if device is None:
        return None
    name = getattr(device, "name", device)  # tf.config.LogicalDevice
    if not isinstance(name, str):
        raise TypeError(f"device must be a string like 'cpu' or 'cuda:0'; got {type(device).__name__}")
    if name.startswith("/"):
        return name
    kind, _, index = name.strip().lower().partition(":")
    if kind not in ("cpu", "cuda", "gpu") or not (index or "0").isdigit():
        raise ValueError(f"unknown device {device!r}; expected 'cpu', 'cuda', 'cuda:N', 'gpu', 'gpu:N' or a "
                         f"TensorFlow device name")
    if kind != "cpu" and int(index or 0) >= _gpu_count():
        # TensorFlow's soft placement would silently use the CPU instead.
        raise ValueError(f"device {device!r} is not available: TensorFlow sees {_gpu_count()} GPU(s)")
    return f"/{'CPU' if kind == 'cpu' else 'GPU'}:{index or 0}"


@functools.lru_cache(maxsize=None)
def _gpu_count():
    return len(tf.config.list_logical_devices("GPU"))


def _on(device):
    name = tf_device_name(device)
    return tf.device(name) if name else contextlib.nullcontext()


def _accumulator(dtype):
    """The dtype sum/prod/cumulative_sum accumulate an array of ``dtype`` in (the standard's default):
    bool and signed integers in int64, unsigned integers in uint64, floating point in its own dtype."""
    if dtype.is_bool or (dtype.is_integer and not dtype.is_unsigned):
        return tf.int64
    if dtype.is_unsigned:
        return tf.uint64
    return dtype
