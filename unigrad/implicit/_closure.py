"""Closure conversion: the arrays a ``matvec`` closes over, made explicit.

A custom rule differentiates its explicit arguments only, and backends disagree about a rule that
uses a traced value it closes over (measured: the tape raises, JAX raises, torch fails at second
order, the autograd plugin returns zeros). So ``linear_solve`` finds the arrays ``matvec`` closes
over and rebuilds ``matvec`` as a function of them: ``convert(matvec)`` returns ``(rebuild, found)``
with ``rebuild(values)`` a copy of ``matvec`` in which each found array is replaced by the value at
its index.

Where it looks: the closure cells and default arguments of Python functions (and, recursively, of
the functions those hold), the ``func``, ``args`` and ``keywords`` of ``functools.partial``, the
attributes of a bound method's object and of callable objects (rebuilt as shallow copies), inside
pytrees (tuples, lists, dicts) held there. What it does not see: globals (arrays reached that way
are constants to the rule); ``linear_solve`` refuses a ``matvec`` whose result still carries a
derivative on the backends that can tell (:meth:`Backend.carries_derivative`).
"""

from __future__ import annotations

import copy
import functools
import numbers
import types

import numpy as np
import optree

__all__ = ["convert"]


def array_like(x) -> bool:
    """A leaf that may be a traced array: array-like, not NumPy's (NumPy arrays are never traced)."""
    if x is None or isinstance(x, (np.ndarray, np.generic, numbers.Number, str, bytes)):
        return False
    return hasattr(x, "shape") and hasattr(x, "dtype")


def convert(fn, keep=array_like):
    """``(rebuild, found)``: the arrays (leaves accepted by ``keep``) ``fn`` closes over, and
    ``rebuild(values) -> fn'`` with ``values[i]`` in place of ``found[i]``."""
    found: list = []
    rebuild = _lift(fn, found, keep, set())
    return rebuild, found


def _keep_as_is(value):
    return lambda values: value


def _lift(value, found, keep, seen):
    if isinstance(value, functools.partial):
        func = _lift(value.func, found, keep, seen)
        args = _lift(tuple(value.args), found, keep, seen)
        keywords = _lift(dict(value.keywords), found, keep, seen)
        return lambda values: functools.partial(func(values), *args(values), **keywords(values))
    if isinstance(value, types.FunctionType):
        if id(value) in seen:  # a recursive function holds itself
            return _keep_as_is(value)
        seen = seen | {id(value)}
        before = len(found)
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(_lift(cell.cell_contents, found, keep, seen))
            except ValueError:  # an empty cell (a name assigned later)
                cells.append(None)
        defaults = _lift(value.__defaults__, found, keep, seen) if value.__defaults__ else None
        if len(found) == before:
            return _keep_as_is(value)
        originals = value.__closure__ or ()

        def rebuilt(values):
            closure = tuple(original if lift is None else types.CellType(lift(values))
                            for original, lift in zip(originals, cells))
            new = types.FunctionType(value.__code__, value.__globals__, value.__name__,
                                     defaults(values) if defaults else None, closure)
            new.__kwdefaults__ = value.__kwdefaults__
            new.__dict__.update(value.__dict__)
            return new

        return rebuilt
    if isinstance(value, types.MethodType):  # a bound method: its object's arrays
        owner = _lift(value.__self__, found, keep, seen)
        function = value.__func__
        return lambda values: types.MethodType(function, owner(values))
    if isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType)):
        return _keep_as_is(value)
    if keep(value):
        index = len(found)
        found.append(value)
        return lambda values: values[index]
    if hasattr(value, "__dict__") and not isinstance(value, (tuple, list, dict)):
        return _lift_object(value, found, keep, seen)
    if isinstance(value, (tuple, list, dict)):
        leaves, tree = optree.tree_flatten(value, none_is_leaf=True)
        if len(leaves) == 1 and leaves[0] is value:
            return _keep_as_is(value)
        before = len(found)
        lifted = [_lift(leaf, found, keep, seen) for leaf in leaves]
        if len(found) == before:
            return _keep_as_is(value)
        return lambda values: optree.tree_unflatten(tree, [lift(values) for lift in lifted])
    return _keep_as_is(value)


def _lift_object(value, found, keep, seen):
    """An object's attributes (its ``__dict__``, one level of objects at a time): where arrays are found, a
    shallow copy (``copy.copy``) with the attributes replaced; the object itself is never changed."""
    if id(value) in seen or len(seen) > 64:  # a cycle, or a large object graph: its arrays stay constants
        return _keep_as_is(value)
    seen = seen | {id(value)}
    before = len(found)
    lifted = {}
    for name, attribute in vars(value).items():
        start = len(found)
        lift = _lift(attribute, found, keep, seen)
        if len(found) > start:
            lifted[name] = lift
    if len(found) == before:
        return _keep_as_is(value)

    def rebuilt(values):
        new = copy.copy(value)
        for name, lift in lifted.items():
            object.__setattr__(new, name, lift(values))
        return new

    return rebuilt
