"""``linalg`` of the JAX backend's namespace: ``jax.numpy.linalg``, except ``vector_norm``, whose
derivative at the zero vector is 0 (as the tape, torch and TensorFlow; JAX's own is NaN, 0 / 0)."""

from __future__ import annotations

import jax
import jax.numpy as _jnp
import jax.numpy.linalg as _linalg
from jax.numpy.linalg import *  # noqa: F401,F403

__all__ = ["vector_norm"]


def __getattr__(name):
    return getattr(_linalg, name)


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):  # noqa: A002 (the Array API name)
    """``jax.numpy.linalg.vector_norm`` with derivative 0 at the zero vector and JAX's elsewhere: the
    zero vectors are replaced by ones before the norm, and their norm by 0 (the double ``where``)."""
    if not isinstance(x, jax.core.Tracer):  # eager, concrete: nothing to differentiate
        return _linalg.vector_norm(x, axis=axis, keepdims=keepdims, ord=ord)
    if axis is not None and not isinstance(axis, int):
        axis = tuple(axis)
    zero = _jnp.all(x == 0, axis=axis, keepdims=True)
    norm = _linalg.vector_norm(_jnp.where(zero, _jnp.ones_like(x), x), axis=axis, keepdims=keepdims, ord=ord)
    zero_out = zero if keepdims else _jnp.reshape(zero, norm.shape)
    return _jnp.where(zero_out, _jnp.zeros_like(norm), norm)
