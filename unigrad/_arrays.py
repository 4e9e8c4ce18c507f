"""Array helpers: the namespace of arrays, conversions, and evaluating ``f`` as the transforms do."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import optree

from . import _checks, _registry
from ._signature import _is_dynamic as is_dynamic
from ._signature import arguments
from ._dtypes import dtype_name

__all__ = ["namespace", "asarray", "to_numpy", "to_native", "evaluate"]

_PY_SCALARS = (bool, int, float, complex)


def evaluate(f: Callable, *args, backend=None, device=None):
    """``f(*args)`` evaluated exactly as unigrad's transforms evaluate it.

    The arguments' arrays (NumPy arrays, NumPy floating scalars, other backends' arrays) are
    converted to the backend with their dtypes kept, placed on ``device``, ``unigrad.namespace``
    inside ``f`` answers with the backend's namespace, and the backend's own set-up applies -- on
    JAX, the scoped 64-bit mode when a floating input is 64-bit. Calling ``f`` directly on JAX
    arrays outside a transform computes float64 inputs in float32 (JAX's default), silently; this
    does not.

    Args:
      f: any function of arrays (pytrees allowed).
      *args: its arguments; non-array arguments reach ``f`` unchanged.
      backend: backend name or object (default by selection order).
      device: place the arrays on this device.

    Returns:
      What ``f`` returns, with the backend's arrays.

    Example:
      >>> unigrad.evaluate(lambda x: x * 2, np.arange(3.0))
      array([0., 2., 4.])
    """
    leaves, treedef, _ = arguments(args, "evaluate")
    b = _registry.resolve(backend, leaves)
    if device is None:
        device = _registry.current_device()
    converted, arrays = [], []
    for x in leaves:
        if b.is_array(x) or is_dynamic(x):
            x = _checks.convert(b, x, "an argument of evaluate")
            if device is not None:
                x = b.asarray(x, device=device)
            arrays.append(x)
        converted.append(x)
    bound = iter(b.arguments(tuple(arrays)))
    converted = [next(bound) if b.is_array(x) else x for x in converted]
    call_args = converted if treedef is None else optree.tree_unflatten(treedef, converted)

    def run():
        token = _registry.active_backend.set(b)
        try:
            return f(*call_args)
        finally:
            _registry.active_backend.reset(token)

    run.closure_arrays = tuple(arrays)
    return b.evaluate(run, ())



def namespace(*arrays: Any) -> Any:
    """The Array API namespace for ``arrays`` (NumPy arrays and scalars: the tape's namespace).

    Example:
      >>> def loss(w, x):
      ...     xp = unigrad.namespace(w, x)
      ...     return xp.sum(xp.tanh(x @ w) ** 2)
    """
    active = _registry.active_backend.get()
    if active is not None:  # inside a transform: its backend's namespace, if the arrays are its own
        own = False
        for x in arrays:
            if active.is_array(x):
                own = True
            elif not isinstance(x, _PY_SCALARS):
                break
        else:
            if own:
                return active.namespace()
    owner = _registry.arrays_owner(arrays, "namespace: arrays of backends {!r} and {!r} are mixed")
    return _registry.get_backend(owner or _registry.DEFAULT).namespace()


def asarray(x: Any, backend=None, dtype=None, device=None) -> Any:
    """``x`` as an array of ``backend`` (default: by selection order), dtype kept unless given.

    Args:
      x: NumPy array, Python scalar or nested list, or another backend's array.
      backend: backend name or object.
      dtype: dtype name (``"float32"``) or the backend's dtype object.
      device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu"``.
    """
    b = _registry.resolve(backend, [x])
    if not b.is_array(x):
        owner = _registry._array_owner(x)
        x = _registry.get_backend(owner).to_numpy(x) if owner else np.asarray(x)
    if dtype is not None and not isinstance(dtype, str):
        dtype = dtype_name(dtype)
    return b.asarray(x, dtype=dtype, device=device)


def to_numpy(x: Any) -> Any:
    """A NumPy array with the values of any backend's array (or a pytree of them)."""
    def one(v):
        if isinstance(v, np.ndarray):
            return v
        owner = _registry._array_owner(v)
        if owner is None:
            return np.asarray(v)
        return _registry.get_backend(owner).to_numpy(v)
    return optree.tree_map(one, x)


def to_native(x: Any) -> Any:
    """The framework's own array for any backend's array (or a pytree of them); other values unchanged.

    On TensorFlow, ``unigrad.namespace``'s functions return ``unigrad_tensorflow.Array`` s (tensors with
    the Array API's operators); this gives the ``tf.Tensor`` each holds, as ``tf.convert_to_tensor``
    does. Every other backend's arrays are already the framework's own and come back as they are.
    Transforms and :func:`evaluate` return native arrays already.

    Args:
      x: an array or a pytree of arrays.

    Returns:
      ``x`` with each array the framework's own type.

    Example:
      >>> unigrad.to_native(np.arange(3.0))
      array([0., 1., 2.])
    """
    def one(v):
        owner = _registry._array_owner(v)
        return v if owner is None else _registry.get_backend(owner).to_native(v)
    return optree.tree_map(one, x)
