"""``unigrad.checkpoint``: rematerialisation, one spelling on every backend.

The core's part is small: flatten the arguments, pick the backend, bind the non-array leaves, and
hand the backend a flat function of the array leaves (:meth:`unigrad.Backend.checkpoint`). Each
backend recomputes in its own way: the tape re-records the block in the backward sweep
(``unigrad/tape/_remat.py``), JAX uses ``jax.checkpoint``, PyTorch an ``autograd.Function`` that
saves only the inputs (``torch.utils.checkpoint`` refuses ``torch.func`` transforms), TensorFlow a
``tf.custom_gradient`` that recomputes under a tape. A backend without its own gets the contract's
default, which runs the block as it is (same derivatives, no memory saved).
"""

from __future__ import annotations

import functools
from typing import Callable

import optree

from . import _registry

__all__ = ["checkpoint"]


def checkpoint(f: Callable) -> Callable:
    """``f`` whose reverse-mode derivative recomputes its forward pass instead of storing it.

    A gradient through ``checkpoint(f)`` keeps only ``f``'s arguments (and results) during the
    forward pass and runs ``f`` again during the backward pass: memory traded for one more forward
    evaluation per block. Derivatives are the same as those of ``f`` (to rounding), in both modes,
    to any order, eagerly and with ``compile=True``. Forward mode and plain evaluation just run ``f``.

    Args:
      f: a function of arrays (pytrees allowed) returning an array or a pytree of arrays, written
        with ``unigrad.namespace`` or the backend's own operations. Every traced value it uses must
        be one of its arguments: a value it closes over (weights computed inside the transform)
        cannot be recomputed from the arguments, and raises a TypeError on the tape and on PyTorch.
        Non-array leaves of the arguments (Python numbers, strings, None) are passed as they are.

    Returns:
      A function with ``f``'s signature and results.

    Example:
      >>> def block(x, w):
      ...     xp = unigrad.namespace(x, w)
      ...     return xp.tanh(x @ w)
      >>> def loss(x, w):
      ...     for _ in range(10):
      ...         x = unigrad.checkpoint(block)(x, w)
      ...     return (x ** 2).sum()
      >>> g = unigrad.grad(loss, argnums=1)(np.ones((2, 3)), np.eye(3))
    """
    if not callable(f):
        raise TypeError(f"checkpoint: f must be callable; got {type(f).__name__}")

    @functools.wraps(f)
    def checkpointed(*args, **kwargs):
        leaves, treedef = optree.tree_flatten((args, kwargs))
        b = _backend_of(leaves)
        positions = tuple(k for k, x in enumerate(leaves) if b.is_array(x))
        seen = {}

        def flat_f(*arrays):
            call = list(leaves)
            for k, x in zip(positions, arrays):
                call[k] = x
            call_args, call_kwargs = optree.tree_unflatten(treedef, call)
            result = f(*call_args, **call_kwargs)
            outs, out_tree = optree.tree_flatten(result)
            for k, o in enumerate(outs):
                if not b.is_array(o):
                    raise TypeError(f"checkpoint: {_name(f)} must return arrays (of the {b.name} backend) or a "
                                    f"pytree of them; output leaf {k} is a {type(o).__name__}")
            seen["tree"] = out_tree
            return tuple(outs)

        flat_f.__name__ = flat_f.__qualname__ = _name(f)  # errors name the user's function
        outs = b.checkpoint(flat_f, tuple(leaves[k] for k in positions))
        return optree.tree_unflatten(seen["tree"], list(outs))

    return checkpointed


def _backend_of(leaves):
    """The backend running ``f`` (the transform's, if it owns the arrays), else the arrays' owner."""
    active = _registry.active_backend.get()
    if active is not None and any(active.is_array(x) for x in leaves):
        return active
    owner = None
    for x in leaves:
        name = _registry._array_owner(x)
        if name is not None:
            if owner is not None and owner != name:
                raise TypeError(f"checkpoint: the arguments mix arrays of backends {owner!r} and {name!r}")
            owner = name
    if owner is None:
        return active if active is not None else _registry.get_backend(_registry.DEFAULT)
    return _registry.get_backend(owner)


def _name(f):
    return getattr(f, "__name__", type(f).__name__)
