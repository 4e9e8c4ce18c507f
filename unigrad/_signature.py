"""The signature of a call: what identifies it for every cache (step 1 of a transform call, see
:mod:`unigrad._call`).

:func:`arguments` flattens the positional arguments once: their leaves, this call's structure, and the
*signature* -- the structure (dict key order included), each array leaf's type, shape and dtype, and
each other leaf's exact value (``1``, ``True`` and ``1.0`` differ; so do ``0.0`` and ``-0.0``). With
the backend and the device it is the :class:`Key` of a call's plan; the cache kinds of
:mod:`unigrad._caches` build on it.
"""

from __future__ import annotations

import operator
import os as _os

import numpy as np
import optree

from . import _checks, _registry

_NONE = type(None)


class Key:
    """A signature used as a cache key: a tuple whose hash is computed once (it is looked up in
    several caches per call, and hashing pytree structures is not free)."""

    __slots__ = ("items", "hash")

    def __init__(self, items):
        self.items, self.hash = items, hash(items)

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        return self is other or (type(other) is Key and self.hash == other.hash and self.items == other.items)


# Array types met as leaves: an argument list of these needs no pytree flattening. (Array types are not
# pytree nodes; one registered as a node after it was met here would not be seen.) Bounded.
_LEAF_ARRAYS: set = {np.ndarray}

_SHAPE_DTYPE = operator.attrgetter("shape", "dtype")
# Array type -> what stands for an array's shape and dtype in a compiled repeat's key (Repeats.lookup):
# ``(shape, dtype)``, or the owning backend's ``signature_attribute`` (JAX's ``aval``). Bounded.
_SUMMARIES: dict = {np.ndarray: _SHAPE_DTYPE}
_DEVICE_VAR = _os.environ.encodekey("UNIGRAD_DEVICE") if hasattr(_os.environ, "encodekey") else None
_BACKEND_VAR = _os.environ.encodekey("UNIGRAD_BACKEND") if hasattr(_os.environ, "encodekey") else None
_CONTEXT_BACKEND, _DEFAULT_BACKEND = _registry._context_backend, _registry._default_backend


def _summary(a):
    """The function giving the key's stand-in for an array's shape and dtype, for ``a``'s type (None:
    ``a`` is not an array, or is a container). Remembered per type where its backend is loaded (its
    ``signature_attribute`` is known); for another type the pair ``(shape, dtype)``, this time."""
    t = type(a)
    if t is float or t is complex or isinstance(a, (tuple, list, dict)):
        return None
    owner = _registry._array_owner(a)
    if owner is None:
        return None
    inst = _registry._instances.get(owner)
    name = None if inst is None else getattr(inst, "signature_attribute", None)
    if not (hasattr(a, "shape") and hasattr(a, "dtype") and (name is None or hasattr(a, name))):
        return None  # an object of the framework that is no array: the full path says what is wrong
    if inst is None:  # not loaded yet: (shape, dtype) is right for every backend; decide next time
        return _SHAPE_DTYPE
    summary = _SHAPE_DTYPE if name is None else operator.attrgetter(name)
    if len(_SUMMARIES) < 64:
        _SUMMARIES[t] = summary
    if len(_LEAF_ARRAYS) < 64:
        _LEAF_ARRAYS.add(t)  # (as in signature())
    return summary



def _static_token(x):
    """What identifies a non-array leaf in a signature: its type and its exact value."""
    t = type(x)
    if t is float:
        return t, x.hex()  # 0.0 and -0.0 differ; every NaN is the same
    if t is complex:
        return t, x.real.hex(), x.imag.hex()
    if isinstance(x, np.generic):
        return t, x.tobytes()
    return t, x  # bool, int, str, None, enums, functions...: the type and the value's own equality



def _is_dynamic(x) -> bool:
    """A non-differentiated leaf that is an array (an input of a compiled program, converted to the
    backend): arrays of any backend, NumPy arrays, and NumPy floating scalars (``arr.mean()``)."""
    if isinstance(x, np.ndarray):
        return True
    if isinstance(x, np.generic):
        return x.dtype.kind in "fc"
    if isinstance(x, (bool, int, float, complex, str, bytes, _NONE)):
        return False
    return _registry._array_owner(x) is not None



def reject_lazy(leaves, args, fname):
    """A Dask array (or another lazy collection) among the leaves: a TypeError pointing to
    ``unigrad.dask`` (the in-memory transforms would pull it into memory whole)."""
    for a in leaves:
        if type(a).__module__.partition(".")[0] == "dask":
            _checks._reject_lazy(tuple(args), fname)



def arguments(args, fname="transform"):
    """``(leaves, treedef, signature)`` of a tuple of positional arguments.

    ``treedef`` is None when every argument is an array of a type met before, or a number (the
    common case: no pytree machinery). ``signature`` is None when a leaf cannot be hashed (then
    nothing is cached).
    """
    return signature(args, fname)[:3]



def _is_weak(x) -> bool:
    """A Python float or complex (not a subclass such as NumPy's float64, which is an array scalar)."""
    t = type(x)
    return t is float or t is complex



def signature(args, fname="transform", static_args=None):
    """``(leaves, treedef, signature, weak)``: :func:`arguments`, for compiled calls too.

    ``static_args`` is None for an eager call: every non-array leaf is part of the signature by its
    exact value. For a compiled call it is the set of argument positions whose Python scalars stay
    static (``static_argnums``); every other Python float or complex leaf is a *dynamic*, weakly typed
    input of the program (as in ``jax.jit``): the signature keeps only its type, and ``weak`` lists
    those leaves' positions, so a new step size finds the same program (:func:`exact_key` adds
    their values back, for what may depend on values).
    """
    sig, weak = [], []
    for p, a in enumerate(args):  # the common case: arrays and numbers, no pytree machinery
        t = type(a)
        if t in _LEAF_ARRAYS:
            sig.append(t)
            sig.append(a.shape)
            sig.append(a.dtype)
        elif static_args is not None and (t is float or t is complex) and p not in static_args:
            weak.append(p)
            sig.append(t)
        elif len(_LEAF_ARRAYS) < 64 and not isinstance(a, (tuple, list, dict)) and _registry._array_owner(a):
            _LEAF_ARRAYS.add(t)  # an array type met for the first time: a leaf (the next call takes this path)
            sig.append(t)
            sig.append(a.shape)
            sig.append(a.dtype)
        else:
            break
    else:
        return args, None, tuple(sig), weak
    leaves, treedef = optree.tree_flatten(args)
    reject_lazy(leaves, args, fname)
    sig = [treedef]  # not a type: no flat signature equals a pytree one
    if "{" in repr(treedef):  # optree structures of dicts compare equal whatever the key order
        sig.append(_dict_orders(args))
    weak, owner = [], None
    for p, a in enumerate(leaves):
        t = type(a)
        if t in _LEAF_ARRAYS or _is_dynamic(a):
            sig.append(t)
            sig.append(getattr(a, "shape", ()))
            sig.append(getattr(a, "dtype", None))
            continue
        if static_args is not None and (t is float or t is complex):
            if static_args:
                owner = owner or _leaf_owners(treedef)
            if not static_args or owner[p] not in static_args:
                weak.append(p)
                sig.append(t)
                continue
        sig.append(_static_token(a))
    sig = tuple(sig)
    try:
        hash(sig)
    except TypeError:
        sig = None
    return leaves, treedef, sig, weak



def exact_key(key, leaves, weak):
    """``key`` (a program's signature) with the values of the dynamic scalars at ``weak`` added."""
    return None if key is None else Key(key.items + (tuple([_static_token(leaves[p]) for p in weak]),))



def _leaf_owners(treedef):
    """The argument position of each leaf of a tuple of arguments."""
    owner = []
    for a, child in enumerate(treedef.children()):
        owner.extend([a] * child.num_leaves)
    return owner



def _dict_orders(tree):
    """The key order of every dict in ``tree`` (depth first), for signatures."""
    orders, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            orders.append(tuple(node))
            stack.extend(node.values())
        elif isinstance(node, (tuple, list)):
            stack.extend(node)
    return tuple(orders)
