"""Your own derivative: ``custom_vjp``, ``custom_jvp`` and ``stop_gradient``, once, on every backend.

The user writes a rule at the level of pytrees (JAX's vocabulary); this module turns it into a
:class:`Rule` -- a small frozen object of *flat* callables on tuples of arrays -- with every check
and error message in one place, and hands it to the backend (``Backend.apply_rule``), which maps it
to its own mechanism (the tape: a primitive made at run time; JAX: ``jax.custom_jvp``/``custom_vjp``;
PyTorch: ``torch.autograd.Function``; TensorFlow: ``tf.custom_gradient``; plugins: their own).

A rule gives one mode and the backends derive the other by transposition: a ``bwd`` is linear in
its cotangent and a JVP rule in its tangent, so forward mode of a ``custom_vjp`` is the transpose of
``bwd``, and reverse mode of a ``custom_jvp`` the transpose of its rule. Rules are differentiable
code (written with the namespace's ops), so second derivatives differentiate the rule itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from typing import Any, Callable

import numpy as np
import optree

from . import _registry
from ._dtypes import INEXACT
from .backend import Backend, Rule  # noqa: F401  (Rule: unigrad.backend's, re-exported here)
from .backend import unsupported_rules as _unsupported

__all__ = ["custom_vjp", "custom_jvp", "stop_gradient", "Rule"]

# Proofs about f's rows read its forward program, and a custom rule's derivative is not that program's
# (a rule may combine rows the forward pass keeps apart). Code that proves from a forward trace listens
# here (custom_rules_seen): each custom function called meanwhile is noted.
_SEEN: contextvars.ContextVar = contextvars.ContextVar("unigrad_custom_rules_seen", default=None)


@contextlib.contextmanager
def custom_rules_seen():
    """A list receiving the name of every custom_vjp / custom_jvp function called inside the block."""
    seen: list = []
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


def _note(fun):
    seen = _SEEN.get()
    if seen is not None:
        seen.append(_name(fun))


def backend_for(leaves):
    """The backend a rule runs on: the transform's (``active_backend``) when the arrays are its own or
    NumPy's, else the one their arrays select."""
    active = _registry.active_backend.get()
    if active is not None:
        for x in leaves:
            if isinstance(x, (np.ndarray, np.generic, bool, int, float, complex)) or x is None:
                continue
            if not active.is_array(x) and _registry._array_owner(x) not in (None, active.name):
                break
        else:
            return active
    return _registry.resolve(None, leaves)


def _resolve_kwargs(fun, args, kwargs):
    if not kwargs:
        return tuple(args)
    try:
        bound = inspect.signature(fun).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{_name(fun)}: {exc}") from None
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(f"{_name(fun)}: keyword-only arguments are not supported by custom rules; pass "
                        f"{sorted(bound.kwargs)} positionally")
    return tuple(bound.args)


def _name(fun):
    return getattr(fun, "__name__", type(fun).__name__)


def _normalize_nondiff(nondiff_argnums):
    if isinstance(nondiff_argnums, int):
        nondiff_argnums = (nondiff_argnums,)
    out = tuple(sorted(set(int(i) for i in nondiff_argnums)))
    if any(i < 0 for i in out):
        raise ValueError(f"nondiff_argnums must be non-negative ints; got {nondiff_argnums!r}")
    return out


class _Call:
    """One call of a custom function: its arguments split into the arrays the rule differentiates and
    everything else, and the flat callables of its :class:`Rule`, with the checks."""

    def __init__(self, kind, fun, nondiff_argnums, args):
        self.kind, self.fun, self.name = kind, fun, _name(fun)
        n = len(args)
        for i in nondiff_argnums:
            if i >= n:
                raise ValueError(f"{self.name}: nondiff_argnums contains {i}, but the function was called with "
                                 f"{n} positional arguments")
        self.args = args
        self.nondiff_pos = nondiff_argnums
        self.diff_pos = tuple(i for i in range(n) if i not in nondiff_argnums)
        diff_args = tuple(args[i] for i in self.diff_pos)
        self.leaves, self.treedef = optree.tree_flatten(diff_args)
        self.b = b = backend_for(self.leaves)
        self.arg_trees = self.treedef.children()
        # which leaves the rule differentiates: floating arrays of the backend
        self.array_at = tuple(k for k, x in enumerate(self.leaves) if b.is_array(x) and b.dtype(x) in INEXACT)
        self.arrays = tuple(self.leaves[k] for k in self.array_at)
        self.specs = tuple((b.shape(x), b.dtype(x), _device(b, x)) for x in self.arrays)
        self.out_tree = self.res_tree = None
        self.res_static = ()

    # -------------------------------------------------------------- helpers
    def nondiff(self):
        return tuple(self.args[i] for i in self.nondiff_pos)

    def leaf_name(self, k):
        """The name of differentiable leaf ``k`` (``argument 1['w']``)."""
        names = _leaf_names(self.args, self.diff_pos)
        return names[self.array_at[k]]

    def rebuild(self, arrays):
        """The positional arguments with the rule's arrays in place of the originals."""
        leaves = list(self.leaves)
        for k, a in zip(self.array_at, arrays):
            leaves[k] = a
        diff = optree.tree_unflatten(self.treedef, leaves)
        args = list(self.args)
        for i, v in zip(self.diff_pos, diff):
            args[i] = v
        return args

    def diff_only(self, arrays, fill):
        """The differentiated arguments only (a tuple), arrays in place; ``fill(k, leaf)`` for the others."""
        leaves = [fill(k, x) for k, x in enumerate(self.leaves)]
        for k, a in zip(self.array_at, arrays):
            leaves[k] = a
        return tuple(optree.tree_unflatten(self.treedef, leaves))

    def run(self, fn, *args):
        token = _registry.active_backend.set(self.b)
        try:
            return fn(*args)
        finally:
            _registry.active_backend.reset(token)

    def outputs(self, out, who):
        leaves, tree = optree.tree_flatten(out)
        if not leaves:
            raise TypeError(f"{self.name}: {who} returned no arrays")
        b = self.b
        for k, o in enumerate(leaves):
            if not b.is_array(o) or b.dtype(o) not in INEXACT:
                what = f"an array of dtype {b.dtype(o)}" if b.is_array(o) else type(o).__name__
                raise TypeError(f"{self.name}: {who} returned {what} as output {k}; a function with a custom "
                                f"rule returns floating-point arrays of the {b.name} backend")
        if self.out_tree is None:
            self.out_tree = tree
            self.out_specs = tuple((b.shape(o), b.dtype(o), _device(b, o)) for o in leaves)
        elif tree != self.out_tree:
            raise TypeError(f"{self.name}: {who} returned outputs of structure {tree}; the function's outputs "
                            f"have structure {self.out_tree}")
        return tuple(leaves)

    # -------------------------------------------------------------- the flat callables
    def flat_fun(self, *arrays):
        return self.outputs(self.run(self.fun, *self.rebuild(arrays)), "the function")

    def flat_fwd(self, *arrays):
        result = self.run(self.user_fwd, *self.rebuild(arrays))
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"{self.name}: fwd must return a pair (output, residuals); got {type(result).__name__}"
                            + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))
        out, res = result
        outs = self.outputs(out, "fwd")
        return outs, self._residual_arrays(res)

    def _residual_arrays(self, res):
        leaves, self.res_tree = optree.tree_flatten(res)
        b = self.b
        self.res_static = tuple((k, x) for k, x in enumerate(leaves) if not b.is_array(x))
        return tuple(x for x in leaves if b.is_array(x))

    def flat_residuals(self, arrays, outputs):
        """What :meth:`flat_fwd` gives as residuals, from the (flat) outputs the forward computation gave:
        ``user_residuals(out, *args)`` (``Rule.residuals``)."""
        out = optree.tree_unflatten(self.out_tree, list(outputs))
        return self._residual_arrays(self.run(self.user_residuals, out, *self.rebuild(arrays)))

    def flat_bwd(self, residuals, cotangents):
        leaves = list(residuals)
        for k, x in self.res_static:
            leaves.insert(k, x)
        res = optree.tree_unflatten(self.res_tree, leaves)
        b = self.b
        cts = [b.zeros(shape, dtype, device=device) if c is None else c
               for c, (shape, dtype, device) in zip(cotangents, self.out_specs)]
        g = optree.tree_unflatten(self.out_tree, cts) if self.out_tree is not None else cts[0]
        result = self.run(self.user_bwd, *self.nondiff(), res, g)
        n = len(self.diff_pos)
        if not isinstance(result, (tuple, list)) or len(result) != n:
            got = f"a {type(result).__name__} of length {len(result)}" if isinstance(result, (tuple, list)) else \
                type(result).__name__
            raise TypeError(f"{self.name}: bwd must return a tuple with one cotangent per differentiated argument "
                            f"({n}: positions {list(self.diff_pos)}); got {got}")
        return self.cotangent_leaves(result, "bwd", "cotangent")

    def cotangent_leaves(self, per_arg, who, what):
        """The leaves of ``per_arg`` (one pytree per differentiated argument, None for zeros) for the rule's
        arrays, checked against each array's shape and dtype; zeros for None."""
        b = self.b
        flat = []
        for i, (tree, ct) in enumerate(zip(self.arg_trees, per_arg)):
            if ct is None:
                flat.extend([None] * tree.num_leaves)
                continue
            try:
                flat.extend(tree.flatten_up_to(ct))
            except (ValueError, TypeError) as exc:
                raise TypeError(f"{self.name}: {who} returned a {what} of structure "
                                f"{optree.tree_structure(ct, none_is_leaf=True)} for argument {self.diff_pos[i]}, "
                                f"whose structure is {tree} ({exc})") from None
        out = []
        for k, pos in enumerate(self.array_at):
            c = flat[pos]
            shape, dtype, device = self.specs[k]
            if c is None:
                out.append(b.zeros(shape, dtype, device=device))
                continue
            if not b.is_array(c):
                raise TypeError(f"{self.name}: {who} returned {type(c).__name__} as the {what} for "
                                f"{self.leaf_name(k)}; expected an array of shape {shape}, dtype {dtype} (or None "
                                f"for zeros)")
            if b.shape(c) != shape or b.dtype(c) != dtype:
                raise ValueError(f"{self.name}: {who} returned a {what} of shape {b.shape(c)}, dtype {b.dtype(c)} "
                                 f"for {self.leaf_name(k)}; expected shape {shape}, dtype {dtype} (those of the "
                                 f"argument)")
            out.append(c)
        return tuple(out)

    def flat_jvp(self, primals, tangents):
        return self._jvp_result(self.run(self.user_jvp, *self.nondiff(), *self._jvp_args(primals, tangents)))

    def flat_jvp_given(self, primals, tangents, outputs):
        """:meth:`flat_jvp` by ``user_jvp_given(*nondiff, primals, tangents, out)``, ``out`` the (flat) outputs the
        forward computation gave (``Rule.jvp_given``)."""
        out = optree.tree_unflatten(self.out_tree, list(outputs))
        return self._jvp_result(self.run(self.user_jvp_given, *self.nondiff(),
                                         *self._jvp_args(primals, tangents), out))

    def _jvp_args(self, primals, tangents):
        """The JVP rule's ``(primals, tangents)``: the differentiated arguments, arrays in place (zeros for
        None tangents)."""
        b = self.b
        tangents = tuple(b.zeros(s, d, device=dev) if t is None else t
                         for t, (s, d, dev) in zip(tangents, self.specs))
        return self.diff_only(primals, lambda k, x: x), self.diff_only(tangents, lambda k, x: _zero_tangent(x))

    def _jvp_result(self, result):
        """``(outputs, tangents)``, flat and checked, from what a JVP rule returned."""
        b = self.b
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"{self.name}: the JVP rule must return a pair (output, tangent_out); got "
                            f"{type(result).__name__}")
        out, tan = result
        outs = self.outputs(out, "the JVP rule")
        try:
            tans = self.out_tree.flatten_up_to(tan)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"{self.name}: the JVP rule returned tangents of structure "
                            f"{optree.tree_structure(tan, none_is_leaf=True)}; the outputs have structure "
                            f"{self.out_tree} ({exc})") from None
        checked = []
        for k, (o, t) in enumerate(zip(outs, tans)):
            if t is None:
                checked.append(b.zeros_like(o))
                continue
            if not b.is_array(t) or b.shape(t) != b.shape(o) or b.dtype(t) != b.dtype(o):
                got = f"shape {b.shape(t)}, dtype {b.dtype(t)}" if b.is_array(t) else type(t).__name__
                raise ValueError(f"{self.name}: the JVP rule returned a tangent of {got} for output {k}; expected "
                                 f"shape {b.shape(o)}, dtype {b.dtype(o)} (those of the output)")
            checked.append(t)
        return outs, tuple(checked)

    def apply(self, rule):
        b = self.b
        if not getattr(b.capabilities, "custom_rules", False):
            raise _unsupported(b, self.name)
        outs = b.apply_rule(rule, self.arrays)
        if self.out_tree is None:  # a backend that computed nothing through the flat callables (cannot be)
            raise RuntimeError(f"{self.name}: the {b.name} backend returned outputs without calling the rule")
        return optree.tree_unflatten(self.out_tree, list(outs))


def _zero_tangent(x):
    if isinstance(x, float):
        return 0.0
    if isinstance(x, complex):
        return 0j
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "fc":
        return np.zeros_like(x)
    return None


def _device(b, x):
    try:
        return b.device(x)
    except Exception:
        return None


def _leaf_names(args, positions):
    paths, _, _ = optree.tree_flatten_with_path(tuple(args[i] for i in positions))
    return [f"argument {positions[p[0]]}" + "".join(f"[{q!r}]" for q in p[1:]) for p in paths]


# ------------------------------------------------------------------------------------------- public

class _CustomFunction:
    """What custom_vjp and custom_jvp share: the function, its non-differentiated positions, and the
    decorator-factory form (``custom_vjp(nondiff_argnums=(1,))`` without a function)."""

    def __new__(cls, fun=None, nondiff_argnums=()):
        if fun is None:
            return functools.partial(cls, nondiff_argnums=nondiff_argnums)
        return super().__new__(cls)

    def __init__(self, fun, nondiff_argnums=()):
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = _normalize_nondiff(nondiff_argnums)


class custom_vjp(_CustomFunction):
    """A function with a reverse-mode rule of your own, used by every backend and both modes.

    ``f = unigrad.custom_vjp(f)`` then ``f.defvjp(fwd, bwd)``, as in JAX:

    * ``fwd(*args) -> (output, residuals)``: the output and what ``bwd`` needs (pytrees);
    * ``bwd(*nondiff_args, residuals, g) -> tuple`` with one cotangent per differentiated argument
      (a pytree like the argument, or None for zeros), ``g`` shaped like the output. ``bwd`` must be
      linear in ``g``.

    Forward mode (``jvp``, ``jacfwd``, forward-over-reverse ``hessian``) is the transpose of ``bwd``,
    on every backend (JAX itself refuses it). ``bwd`` is differentiable code: second derivatives
    differentiate it. Arguments the rule differentiates are the floating-point arrays among the
    arguments' leaves; other leaves (Python numbers, integer arrays) are constants whose entry in
    ``bwd``'s result is ignored.

    Args:
      fun: the function (its output: an array or a pytree of floating-point arrays).
      nondiff_argnums: positions of arguments that are not differentiated (hashable options,
        functions...); they are passed first to ``bwd``.

    Returns:
      A callable with ``defvjp``. ``custom_vjp(nondiff_argnums=(1,))`` without ``fun`` is a decorator.

    Example:
      >>> @unigrad.custom_vjp
      ... def clip_gradient(x):
      ...     return x
      >>> def fwd(x):
      ...     return x, None
      >>> def bwd(res, g):
      ...     xp = unigrad.namespace(g)
      ...     return (xp.clip(g, -1.0, 1.0),)
      >>> clip_gradient.defvjp(fwd, bwd)
      >>> unigrad.grad(lambda x: (3.0 * clip_gradient(x)).sum())(np.ones(2))
      array([1., 1.])
    """

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.fwd = self.bwd = None

    def defvjp(self, fwd: Callable, bwd: Callable):
        """Set the rule: ``fwd(*args) -> (output, residuals)``, ``bwd(*nondiff, residuals, g) -> cotangents``."""
        if not callable(fwd) or not callable(bwd):
            raise TypeError(f"{_name(self.fun)}.defvjp: fwd and bwd must be callables")
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args, **kwargs):
        if self.fwd is None:
            raise AttributeError(f"{_name(self.fun)}: no rule defined; call {_name(self.fun)}.defvjp(fwd, bwd) first")
        _note(self.fun)
        call = _Call("vjp", self.fun, self.nondiff_argnums, _resolve_kwargs(self.fun, args, kwargs))
        call.user_fwd, call.user_bwd = self.fwd, self.bwd
        return call.apply(Rule(call.name, fun=call.flat_fun, fwd=call.flat_fwd, bwd=call.flat_bwd))


class custom_jvp(_CustomFunction):
    """A function with a forward-mode rule of your own, used by every backend and both modes.

    ``f = unigrad.custom_jvp(f)`` then ``f.defjvp(rule)`` (or ``@f.defjvp``), as in JAX:
    ``rule(*nondiff_args, primals, tangents) -> (output, tangent_out)``, ``primals`` and
    ``tangents`` tuples of the differentiated arguments. The rule must be linear in ``tangents``;
    reverse mode is its transpose, on every backend. The rule is differentiable code: second
    derivatives differentiate it.

    Args:
      fun: the function.
      nondiff_argnums: positions of arguments that are not differentiated; passed first to the rule.

    Returns:
      A callable with ``defjvp``. ``custom_jvp(nondiff_argnums=(1,))`` without ``fun`` is a decorator.

    Example:
      >>> @unigrad.custom_jvp
      ... def softplus(x):
      ...     xp = unigrad.namespace(x)
      ...     return xp.logaddexp(x, 0.0)
      >>> @softplus.defjvp
      ... def softplus_jvp(primals, tangents):
      ...     (x,), (t,) = primals, tangents
      ...     xp = unigrad.namespace(x)
      ...     return softplus(x), t / (1.0 + xp.exp(-x))
      >>> unigrad.grad(lambda x: softplus(x).sum())(np.zeros(2))
      array([0.5, 0.5])
    """

    def __init__(self, fun, nondiff_argnums=()):
        super().__init__(fun, nondiff_argnums)
        self.jvp = None

    def defjvp(self, rule: Callable):
        """Set the rule ``rule(*nondiff, primals, tangents) -> (output, tangent_out)``; returns it (a decorator)."""
        if not callable(rule):
            raise TypeError(f"{_name(self.fun)}.defjvp: the rule must be callable")
        self.jvp = rule
        return rule

    def __call__(self, *args, **kwargs):
        if self.jvp is None:
            raise AttributeError(f"{_name(self.fun)}: no rule defined; call {_name(self.fun)}.defjvp(rule) first")
        _note(self.fun)
        call = _Call("jvp", self.fun, self.nondiff_argnums, _resolve_kwargs(self.fun, args, kwargs))
        call.user_jvp = self.jvp
        return call.apply(Rule(call.name, fun=call.flat_fun, jvp=call.flat_jvp))


def stop_gradient(x: Any) -> Any:
    """``x`` with a zero derivative, at every order and in both modes, on every backend.

    Args:
      x: an array or a pytree of arrays (NumPy arrays and numbers are returned as they are).

    Returns:
      The same values; derivatives through them are zero (``x * stop_gradient(x)`` has gradient ``x``).

    Example:
      >>> unigrad.grad(lambda x: (x * unigrad.stop_gradient(x)).sum())(np.array([1.0, 2.0]))
      array([1., 2.])
    """
    leaves, tree = optree.tree_flatten(x)
    if not leaves:
        return x
    b = backend_for(leaves)
    return optree.tree_unflatten(tree, [_stop_one(b, v) for v in leaves])


def _stop_one(b, v):
    if not b.is_array(v):
        return v
    if type(b).stop_gradient is not Backend.stop_gradient:
        return b.stop_gradient(v)
    if getattr(b.capabilities, "custom_rules", False) and b.dtype(v) in INEXACT:
        return b.apply_rule(_zero_rule(b, b.shape(v), b.dtype(v), _device(b, v)), (v,))[0]
    if b.dtype(v) not in INEXACT:
        return v
    raise _unsupported(b, "stop_gradient")


def _zero_rule(b, shape, dtype, device):
    """stop_gradient as a rule, for a backend with custom rules and no ``stop_gradient`` of its own."""
    def fun(x):
        return (x,)

    def fwd(x):
        return (x,), ()

    def bwd(res, cts):
        return (b.zeros(shape, dtype, device=device),)

    def jvp(primals, tangents):
        return (primals[0],), (b.zeros(shape, dtype, device=device),)

    return Rule("stop_gradient", fun=fun, fwd=fwd, bwd=bwd, jvp=jvp)
