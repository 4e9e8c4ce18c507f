"""``unigrad.bridge``: a function written for one backend, called as one differentiable operation from another.

``bridge(f, backend="torch")`` called inside a transform on backend B (JAX, say) is a custom rule on
B (``unigrad.backend.Rule``, applied with ``Backend.apply_rule``) whose every callable runs on the
inner backend A:

* ``fun``: the arguments are handed to A (DLPack where both sides speak it: no copy where the
  memory allows, else through one NumPy copy), ``f`` runs on A, the results come back to B the same way;
* ``bwd``: A's VJP of ``f`` at the kept inputs (they are the residuals: ``f`` runs again there, as a
  checkpoint would), itself bridged -- so when B differentiates ``bwd`` again (a Hessian), that is
  A's VJP of A's VJP, to any order both backends reach;
* ``jvp``: A's JVP of ``f``, bridged the same way (absent where A has no forward mode: B then
  transposes ``bwd``).

Traced values without data -- inside ``compile=True`` on JAX (``jax.jit``) or TensorFlow
(``tf.function``), or in ``jax.vmap`` -- cross as host round trips, through B's
``Backend.host_callback`` (JAX: ``jax.pure_callback``, looping over a vmapped axis; TensorFlow:
``tf.py_function``), their output shapes found once per signature by running the function on zeros.
A backend without one (PyTorch inside ``torch.func.vmap``, so its ``jacfwd`` and ``hessian``) raises a
TypeError that says so. What else differs between frameworks is asked of the backends too:
``Backend.carries_derivative`` (a traced value that must not be handed over as data) and
``Backend.primals_from_jvp_rule`` (a JVP rule whose primal outputs must not depend on the tangents).
This module names no framework.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import optree

from . import _registry
from ._custom import Rule, backend_for
from ._dtypes import INEXACT
from .backend import Backend

__all__ = ["bridge"]


def bridge(f: Callable, backend) -> Callable:
    """``f``, written for ``backend``, as one differentiable operation any backend's transform can call.

    Inside a transform on another backend, the arguments reach ``f`` as ``backend``'s arrays, ``f``
    runs there, and the results come back as the calling backend's arrays; reverse mode calls
    ``backend``'s VJP, forward mode its JVP, higher orders nest both. Outside any transform, or
    called with ``backend``'s own arrays, ``f`` simply runs.

    Args:
      f: a function of arrays (pytrees allowed) returning an array or a pytree of arrays, written
        with ``backend``'s own operations (``torch.func.functional_call`` of a module, ``jax.numpy``...)
        or with ``unigrad.namespace``. Non-array leaves (Python numbers, strings) are passed as they
        are; integer arrays are handed over as constants.
      backend: the backend ``f`` runs on (a name or a backend object).

    Returns:
      A function with ``f``'s signature, returning the calling backend's arrays.

    Example:
      >>> import torch
      >>> def torch_sin(x):
      ...     return torch.sin(x)
      >>> g = unigrad.grad(lambda x: unigrad.bridge(torch_sin, "torch")(x).sum(), backend="jax")
      >>> g(np.zeros(3))   # cos(0) = 1, computed by torch, returned as a JAX array
      Array([1., 1., 1.], dtype=float64)
    """
    if not callable(f):
        raise TypeError(f"bridge: f must be callable; got {type(f).__name__}")
    inner = _registry.get_backend(backend)  # an unknown name fails here, with the registry's message
    name = getattr(f, "__name__", type(f).__name__)

    @functools.wraps(f)
    def bridged(*args):
        leaves, treedef = optree.tree_flatten(args)
        outer = backend_for(leaves)
        if outer.name == inner.name:
            return f(*args)
        diff = tuple(k for k, x in enumerate(leaves) if outer.is_array(x) and outer.dtype(x) in INEXACT)
        others = tuple(k for k, x in enumerate(leaves) if k not in diff and _is_array(x))
        seen = {}

        def on_inner(*arrays):
            call = list(leaves)
            for k, x in zip(diff, arrays):
                call[k] = x
            for k in others:  # integer arrays, NumPy arrays: constants on the inner backend
                call[k] = _hand_over(leaves[k], _owner(leaves[k]), inner)
            token = _registry.active_backend.set(inner)
            try:
                result = f(*optree.tree_unflatten(treedef, call))
            finally:
                _registry.active_backend.reset(token)
            outs, seen["tree"] = optree.tree_flatten(result)
            for k, o in enumerate(outs):
                if not inner.is_array(o):
                    raise TypeError(f"bridge: {name} must return arrays of the {inner.name} backend (or a pytree of "
                                    f"them); output leaf {k} is a {type(o).__name__}")
            return tuple(outs)

        on_inner.__name__ = name
        arrays = tuple(leaves[k] for k in diff)
        outs = _Side(inner, outer, on_inner, name).apply(arrays)
        return optree.tree_unflatten(seen["tree"], list(outs))

    return bridged


class _Side:
    """One function of ``inner``'s arrays (``fn(*arrays) -> tuple``), applied to ``outer``'s arrays as a rule."""

    def __init__(self, inner, outer, fn, name):
        self.inner, self.outer, self.fn, self.name = inner, outer, fn, name
        self.out_specs = {}  # input specs -> output (shape, dtype) list

    def apply(self, arrays):
        if not arrays:
            return self.call(arrays)
        rule = Rule(name=f"bridge:{self.name}", fun=lambda *xs: self.call(xs), fwd=self.fwd, bwd=self.bwd,
                    jvp=self.jvp if self.inner.capabilities.forward_mode else None)
        return tuple(self.outer.apply_rule(rule, arrays))

    def fwd(self, *arrays):
        # The residuals are the inputs: bwd runs f again on the inner side. A backend may run fwd again
        # on traced inputs (the tape, for a second derivative): the outputs are then the rule's own.
        if any(self.outer.carries_derivative(x) for x in arrays):
            return self.apply(arrays), tuple(arrays)
        return self.call(arrays), tuple(arrays)

    def bwd(self, residuals, cotangents):
        inner, n = self.inner, len(residuals)
        specs = self.specs(residuals)
        cotangents = tuple(self.outer.zeros(shape, dtype) if c is None else c
                           for c, (shape, dtype) in zip(cotangents, specs))

        def vjp(*arrays):
            _, vjp_fn, _ = inner.vjp(self.fn, arrays[:n])
            return tuple(vjp_fn(arrays[n:]))

        return _Side(inner, self.outer, vjp, self.name + ".vjp").apply(tuple(residuals) + cotangents)

    def jvp(self, primals, tangents):
        inner, n = self.inner, len(primals)
        tangents = tuple(self.outer.zeros_like(p) if t is None else t for t, p in zip(tangents, primals))

        def push(*arrays):
            outputs, tangents_out, _ = inner.jvp(self.fn, arrays[:n], arrays[n:])
            return tuple(outputs) + tuple(tangents_out)

        both = _Side(inner, self.outer, push, self.name + ".jvp").apply(tuple(primals) + tangents)
        m = len(both) // 2
        if self.outer.primals_from_jvp_rule:
            # The backend uses a JVP rule's outputs as the primal outputs: under a vmap over tangents
            # (JAX's jacfwd, hessian) they must stay unbatched, which outputs of the tangents' call are not.
            return self.call(tuple(primals)), both[m:]
        return both[:m], both[m:]

    # ------------------------------------------------------------------ running on the inner backend
    def call(self, arrays):
        """``fn`` on the inner backend, from and to the outer backend's arrays."""
        outer, inner = self.outer, self.inner
        try:
            handed = tuple(_hand_over(x, outer, inner) for x in arrays)
        except Exception as exc:  # a traced value with no data here: a host round trip, where there is one
            return self.through_host(arrays, exc)
        outputs = inner.evaluate(self.fn, handed)
        self.out_specs[_specs(outer, arrays)] = [(inner.shape(o), inner.dtype(o)) for o in outputs]
        return tuple(_hand_over(o, inner, outer) for o in outputs)

    def through_host(self, arrays, exc):
        """``fn`` on traced ``arrays`` of the outer backend, by its host callback; a TypeError where it has none."""
        outer, inner = self.outer, self.inner
        outputs = None
        if type(outer).host_callback is not Backend.host_callback:  # (specs run fn on zeros: only for a callback)
            jvp = (lambda p, t: self.jvp(p, t)[1]) if inner.capabilities.forward_mode else None
            outputs = outer.host_callback(self.run_host, tuple(arrays), self.specs(arrays), jvp=jvp)
        if outputs is None:
            raise TypeError(
                f"bridge: {self.name} was called with a traced {outer.name} value that holds no data "
                f"({type(arrays[0]).__name__}: inside {outer.name}'s vmap or compiled code), and the {outer.name} "
                f"backend has no host callback to run the {inner.name} function from there; call it outside "
                f"that transform ({type(exc).__name__}: {exc})") from exc
        return tuple(outputs)

    def run_host(self, *numpy_arrays):
        """``fn`` on NumPy inputs (a host callback), NumPy outputs."""
        inner = self.inner
        outputs = inner.evaluate(self.fn, tuple(inner.asarray(np.asarray(a)) for a in numpy_arrays))
        return tuple(np.asarray(inner.to_numpy(o)) for o in outputs)

    def specs(self, arrays):
        """The outputs' ``(shape, dtype)`` for inputs like ``arrays`` (run once on zeros if not yet seen)."""
        key = _specs(self.outer, arrays)
        found = self.out_specs.get(key)
        if found is None:
            inner = self.inner
            zeros = tuple(inner.zeros(shape, dtype) for shape, dtype in key)
            outputs = inner.evaluate(self.fn, zeros)
            found = self.out_specs[key] = [(inner.shape(o), inner.dtype(o)) for o in outputs]
        return found


def _specs(b, arrays):
    return tuple((tuple(b.shape(x)), b.dtype(x)) for x in arrays)


def _is_array(x):
    return isinstance(x, np.ndarray) or _registry._array_owner(x) is not None


def _owner(x):
    name = _registry._array_owner(x)
    return _registry.get_backend(name or _registry.DEFAULT)


def _hand_over(x, source, target):
    """``x`` (an array of ``source``) as an array of ``target``: by DLPack where ``target`` takes it
    (no copy where the memory allows), else through one NumPy copy. Raises for a traced value."""
    x = source.to_native(x)  # (TensorFlow's inside-f view: its tensor)
    if source.carries_derivative(x):  # its value alone would silently drop that derivative
        raise TypeError(f"a {source.name} value being differentiated cannot be handed over as data")
    if target.accepts_dlpack and hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        try:
            return target.asarray(x)
        except Exception:
            pass
    return target.asarray(np.asarray(source.to_numpy(x)))
