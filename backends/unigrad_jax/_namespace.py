"""The JAX backend's Array API namespace: ``jax.numpy`` with the few functions whose derivative at a
non-differentiable point differs from the one the other backends give (docs/conventions.md).

* ``pow`` / ``power``: derivative 0 with respect to the base at ``x1 = 0, x2 = 0`` (``x ** 0`` is
  the constant 1), as NumPy's tape and torch. JAX's own rule for a floating exponent computes
  ``0 * 0 ** -1 = NaN`` there. Only these functions: the operator ``x ** 0.0`` on a JAX array is
  JAX's own and still gives NaN (unigrad does not change JAX's rule table, which every JAX user in
  the process shares).
* ``abs``: derivative 0 at 0 for real inputs (``sign(x)``), as the tape, torch and TensorFlow; JAX's
  own gives 1.
* ``clip``: derivative 1 at the bounds (the closed interval passes ``x`` through), as the tape, torch
  and TensorFlow; JAX's own (``minimum(maximum(x, min), max)``) gives 0.5 there.
* ``linalg.vector_norm``: derivative 0 at the zero vector, as the tape, torch and TensorFlow; JAX's
  own gives NaN (0 / 0). See ``_linalg``.

Values are ``jax.numpy``'s everywhere; every other name is ``jax.numpy``'s own. The functions
above are plain ``jax.numpy`` code (a double ``where``), so they work in every transform, under
``jit``, and to any order of differentiation. Called eagerly on concrete arrays (nothing can be
differentiated there) they are ``jax.numpy``'s own functions. Under ``jit`` they cost what
``jax.numpy``'s do (measured, x of 1000 float32: the jitted gradient of all four, 82 us against
83 us); an eager, unjitted ``jax.grad`` pays their few extra dispatches (pow 6.2 ms against 2.8 ms,
clip 6.6 against 1.3, vector_norm 5.6 against 3.0, on a loaded 2-core machine).
"""

from __future__ import annotations

import builtins as _builtins

import jax
import jax.numpy as _jnp
from jax.numpy import *  # noqa: F401,F403 (the namespace is jax.numpy's, but for the names below)
from jax.numpy import __array_api_version__, __array_namespace_info__  # noqa: F401

from . import _linalg as linalg  # noqa: F401

__all__ = ["pow", "power", "abs", "absolute", "clip", "linalg"]


def __getattr__(name):  # anything ``import *`` does not copy (jax.numpy's own lazy names)
    return getattr(_jnp, name)


def _traced(*args):
    """Is some argument a traced value? Only a traced call can be differentiated: an eager call on
    concrete arrays takes ``jax.numpy``'s own function (the same values, no extra dispatches)."""
    return _builtins.any(isinstance(a, jax.core.Tracer) for a in args)  # (``any`` here is jax.numpy's)


def pow(x1, x2, /):  # noqa: A001 (the Array API name)
    """``jax.numpy.pow`` whose derivative at ``x1 = 0, x2 = 0`` is 0 (not NaN), JAX's elsewhere.

    The double ``where``: at that point the result is the constant 1 and ``jax.numpy.pow`` sees
    ``x1 = 1``, where its derivatives are finite (so no NaN reaches any order of differentiation);
    elsewhere value and derivatives are ``jax.numpy.pow``'s. JAX's own derivative with respect to
    ``x2`` at ``x1 = 0`` is 0 too. A Python int exponent goes to ``jax.numpy.pow`` unchanged (JAX's
    integer power, already 0 there).
    """
    if isinstance(x2, int) or not _traced(x1, x2) or not _jnp.issubdtype(_jnp.result_type(x1, x2), _jnp.inexact):
        return _jnp.power(x1, x2)
    kink = (x1 == 0) & (x2 == 0)
    return _jnp.where(kink, 1.0, _jnp.power(_jnp.where(kink, 1.0, x1), x2))


power = pow


def abs(x, /):  # noqa: A001
    """``jax.numpy.abs`` whose derivative at 0 is 0 for real ``x`` (``x * sign(x)``: the same values,
    the derivative ``sign(x)``)."""
    if not _traced(x) or not _jnp.issubdtype(_jnp.result_type(x), _jnp.floating):
        return _jnp.abs(x)
    return x * _jnp.sign(x)


absolute = abs


def clip(x, /, min=None, max=None):  # noqa: A002
    """``jax.numpy.clip`` whose derivative with respect to ``x`` is 1 on the closed interval, bounds
    included (0 strictly outside it)."""
    clipped = _jnp.clip(x, min, max)
    if (min is None and max is None) or not _traced(x, min, max):
        return clipped
    inside = None
    if min is not None:
        inside = x >= min
    if max is not None:
        inside = (x <= max) if inside is None else inside & (x <= max)
    return _jnp.where(inside, x, clipped)
