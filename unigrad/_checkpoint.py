"""``unigrad.checkpoint``: rematerialisation, one spelling on every backend.

The core's part is small: flatten the arguments, pick the backend, bind the non-array leaves, and
hand the backend a flat function of the array leaves (:meth:`unigrad.Backend.checkpoint`). Each
backend recomputes in its own way: the tape re-records the block in the backward sweep
(``unigrad/tape/_remat.py``), JAX uses ``jax.checkpoint``, PyTorch an ``autograd.Function`` that
saves only the inputs (``torch.utils.checkpoint`` refuses ``torch.func`` transforms), TensorFlow a
``tf.custom_gradient`` that recomputes under a tape. A plugin with custom rules that does not
override the method gets :func:`rule_checkpoint` (a rule keeping only the inputs); one without runs
the block as it is (same derivatives, no memory saved).
"""

from __future__ import annotations

import functools
from typing import Callable

import optree

from . import _registry
from ._custom import Rule
from ._dtypes import INEXACT
from .backend import Backend

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
        arrays = tuple(leaves[k] for k in positions)
        if type(b).checkpoint is Backend.checkpoint and b.capabilities.custom_rules:
            outs = rule_checkpoint(b, flat_f, arrays)  # the contract's generic default for plugins
        else:
            outs = b.checkpoint(flat_f, arrays)
        return optree.tree_unflatten(seen["tree"], list(outs))

    return checkpointed


def rule_checkpoint(b, f, primals):
    """The generic rematerialisation, for a backend with custom rules: a rule whose residuals are the
    floating ``primals`` (the others are bound), whose ``bwd`` runs ``b.vjp`` of ``f`` on them and whose
    JVP is ``b.jvp`` (forward mode has nothing to keep)."""
    primals = tuple(primals)
    floating = [k for k, p in enumerate(primals) if b.dtype(p) in INEXACT]
    if not floating:
        return tuple(f(*primals))
    name = getattr(f, "__name__", "checkpoint")
    if len(floating) < len(primals):  # a rule differentiates floating arrays: bind the others
        def on_floating(*xs):
            call = list(primals)
            for k, x in zip(floating, xs):
                call[k] = x
            return f(*call)

        on_floating.__name__ = name
        return rule_checkpoint(b, on_floating, [primals[k] for k in floating])

    def run(*inputs):
        outputs = tuple(f(*inputs))
        # Untraced inputs and a traced output: f used a traced value it closes over, whose derivative the
        # rule cannot give (it differentiates its arguments). Said, never dropped.
        plain = b.stop_gradient
        if all(type(plain(p)) is type(p) for p in inputs) and any(type(plain(o)) is not type(o) for o in outputs):
            raise TypeError(f"checkpoint: {name} used a traced value that is not one of its arguments (a value it "
                            f"closes over, computed inside the transform); pass it to the checkpointed function "
                            f"as an argument")
        return outputs

    def bwd(residuals, cotangents):
        outputs, vjp_fn, _ = b.vjp(f, residuals)
        return tuple(vjp_fn(tuple(b.zeros_like(o) if c is None else c for c, o in zip(cotangents, outputs))))

    def jvp(inputs, tangents):
        tangents = tuple(b.zeros_like(p) if t is None else t for t, p in zip(tangents, inputs))
        outputs, tangents_out, _ = b.jvp(f, inputs, tangents)
        return tuple(outputs), tuple(tangents_out)

    rule = Rule(name=name, fun=run, fwd=lambda *p: (run(*p), p), bwd=bwd,
                jvp=jvp if b.capabilities.forward_mode else None)
    return tuple(b.apply_rule(rule, primals))


def _backend_of(leaves):
    """The backend running ``f`` (the transform's, if it owns the arrays), else the arrays' owner."""
    active = _registry.active_backend.get()
    if active is not None and any(active.is_array(x) for x in leaves):
        return active
    owner = _registry.arrays_owner(leaves, "checkpoint: the arguments mix arrays of backends {!r} and {!r}")
    if owner is None:
        return active if active is not None else _registry.get_backend(_registry.DEFAULT)
    return _registry.get_backend(owner)


def _name(f):
    return getattr(f, "__name__", type(f).__name__)
