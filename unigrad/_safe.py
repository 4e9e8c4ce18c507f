"""NaN-safe building blocks for functions with a branch or a norm, on every backend.

The classic trap: ``where(x > 0, log(x), 0.0)`` has value 0 at ``x = 0`` but gradient NaN on every
backend. Reverse mode multiplies the branch that is not taken by a zero cotangent, and the
derivative of ``log`` at 0 is infinite: ``0 * inf = NaN``. The cure is the "double where": give
each branch only inputs where it is finite (``log(where(x > 0, x, 1.0))``), then select.
``safe_where`` is that pattern; ``safe_norm`` is the Euclidean norm with it (its derivative at the
zero vector is 0, where ``jax.numpy.linalg.vector_norm``'s is NaN; the backends' namespaces give 0 too).

Both are written with ``unigrad.namespace``, so they run on every backend, in every transform, to
any order of differentiation.
"""

from __future__ import annotations

from typing import Callable

from ._arrays import namespace

__all__ = ["safe_where", "safe_norm"]


def _branch(fn, xp, values):
    return fn(values) if callable(fn) else xp.zeros_like(values) + fn


def safe_where(condition, x, fn_true: Callable | object, fn_false: Callable | object, *,
               fill_true=1.0, fill_false=1.0):
    """``where(condition, fn_true(x), fn_false(x))``, each branch evaluated only where it is taken.

    Where ``condition`` is False, ``fn_true`` sees ``fill_true`` instead of ``x`` (and ``fn_false``
    sees ``fill_false`` where it is True), so a branch that is infinite or NaN off its domain does
    not poison the derivative: the result's derivative is that of the branch taken, finite where it
    is finite.

    Args:
      condition: boolean array, broadcastable with ``x`` (computed from ``x``, typically).
      x: the array both branches are functions of (an array of the backend, a NumPy array or a
        Python scalar).
      fn_true: elementwise function of ``x`` for the elements where ``condition`` holds, or a
        constant value.
      fn_false: the same where ``condition`` does not hold.
      fill_true: a value at which ``fn_true`` is finite and differentiable (default 1.0: ``log``,
        ``sqrt``, ``1 / x``...). It never reaches the result.
      fill_false: the same for ``fn_false``.

    Returns:
      An array of the broadcast shape of ``condition`` and ``x``.

    Example:
      >>> def f(x):
      ...     xp = unigrad.namespace(x)
      ...     return unigrad.safe_where(x > 0, x, xp.log, 0.0)
      >>> unigrad.grad(f)(0.0)   # the single where gives NaN
      array(0.)
    """
    xp = namespace(x)
    if not hasattr(x, "shape"):
        x = xp.asarray(x)
    zeros = xp.zeros_like(x)
    x_true = xp.where(condition, x, zeros + fill_true)
    x_false = xp.where(condition, zeros + fill_false, x)
    return xp.where(condition, _branch(fn_true, xp, x_true), _branch(fn_false, xp, x_false))


def safe_norm(x, axis=None, keepdims: bool = False, ord=2):  # noqa: A002 (the Array API name)
    """``vector_norm(x, axis=axis, keepdims=keepdims, ord=ord)`` whose derivative at the zero vector is 0.

    The norm is not differentiable at 0; an array library's own ``vector_norm`` may give NaN there
    (``jax.numpy.linalg``'s: 0 / 0; the JAX backend's namespace gives 0). ``safe_norm`` gives 0 on
    every backend, and the exact derivative
    elsewhere: the zero vectors are replaced by ones before the norm and their result by 0.

    Args:
      x: array (of the backend, NumPy, or a Python scalar).
      axis: the axis or axes the norm is taken over; None: all of them.
      keepdims: keep the reduced axes with size 1.
      ord: the order of the norm (``vector_norm``'s ``ord``).

    Returns:
      The norms, as ``vector_norm`` returns them.

    Example:
      >>> unigrad.grad(lambda x: unigrad.safe_norm(x))(np.zeros(3))
      array([0., 0., 0.])
    """
    xp = namespace(x)
    if not hasattr(x, "shape"):
        x = xp.asarray(x)
    if axis is not None and not isinstance(axis, int):
        axis = tuple(axis)
    zero = x == 0
    zero_kept = xp.all(zero, axis=axis, keepdims=True)  # broadcasts against x
    safe_x = xp.where(zero_kept, xp.ones_like(x), x)
    norm = xp.linalg.vector_norm(safe_x, axis=axis, keepdims=keepdims, ord=ord)
    return xp.where(xp.all(zero, axis=axis, keepdims=keepdims), xp.zeros_like(norm), norm)
