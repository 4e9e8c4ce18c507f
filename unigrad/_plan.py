"""The plan of a call: what every call with one signature shares (step 2 of a transform call, see
:mod:`unigrad._call`).

:func:`make_plan` derives the backend, which leaves are differentiated (checked: floating dtypes
only), which other leaves are arrays passed as inputs (*dynamic*) and which are kept as given
(*static*). A :class:`Plan` is immutable, kept per signature (a plan never runs ``f``).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _checks
from ._dtypes import INEXACT
from ._signature import _LEAF_ARRAYS, _is_dynamic
from .backend import Backend

#: Why each transform's plans and compiled programs are kept per signature alone (see unigrad._caches).
PLANS_WHY = ("the backend, the differentiated leaves and their dtypes, what to convert: from the signature alone "
             "(f is not run)")


@dataclass(frozen=True, eq=False)
class Plan:
    """What every call with one signature shares (built by :func:`make_plan`).

    Attributes:
      backend: the backend the call runs on.
      device: where inputs are placed (None: left where they are).
      n_args: the number of positional arguments.
      argnums: the differentiated arguments (None: all of them, for vjp/jvp/hvp).
      single: ``argnums`` was an int: results have that argument's structure, not a tuple's.
      diff_positions: where the differentiated leaves are among all the arguments' leaves.
      dynamic_positions: where the other array leaves are (converted, inputs of compiled programs).
      convert: positions of leaves to convert or place (not already arrays of the backend, where wanted).
      dtypes: the differentiated leaves' dtype names.
      list_hint: a differentiated argument is a list or tuple of Python scalars (for error messages).
      weak: which of the dynamic leaves (indices into ``dynamic_positions``) are Python floats or
        complex numbers passed to a compiled program as weakly typed scalars (see :func:`signature`).
    """

    backend: Backend
    device: object
    n_args: int
    argnums: tuple | None
    single: bool
    diff_positions: tuple
    dynamic_positions: tuple
    convert: frozenset
    dtypes: tuple
    list_hint: str | None
    weak: tuple = ()



def make_plan(b: Backend, device, args, leaves, treedef, argnums, fname, weak=()) -> Plan:
    """The plan of a call (see :class:`Plan`). Raises for arguments that cannot be differentiated."""
    n_args = len(args)
    if argnums is None:
        single, which, rest = False, tuple(range(n_args)), ()
    else:
        if not n_args:
            raise TypeError(f"{fname}: the function must be called with at least one positional argument")
        single, which, rest = _checks.normalize_argnums(argnums, n_args, fname)
    counts = [1] * n_args if treedef is None else [c.num_leaves for c in treedef.children()]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    diff_positions = tuple(i for a in which for i in range(starts[a], starts[a + 1]))
    is_array = b.is_array
    convert, dtypes, dynamic = set(), [], []
    names = None
    for k, p in enumerate(diff_positions):
        x = leaves[p]
        if device is not None or not is_array(x):
            convert.add(p)
            if not is_array(x):
                names = names or _diff_names(args, which, argnums is None)
                x = _checks.convert(b, x, names[k])  # raises a TypeError naming the argument
        elif type(x) not in _LEAF_ARRAYS and len(_LEAF_ARRAYS) < 64:
            _LEAF_ARRAYS.add(type(x))  # an array type: a pytree leaf (learnt for the flat signature)
        name = b.dtype(x)
        if name not in INEXACT:
            names = names or _diff_names(args, which, argnums is None)
            raise TypeError(
                f"{fname}: {names[k]} has dtype {name}; only floating-point or complex inputs can be "
                f"differentiated (cast it, e.g. to float64, or leave it out of argnums)")
        if name.startswith("complex") and not b.capabilities.complex:
            # a backend that does not declare complex gives no derivatives of it, never unchecked ones
            names = names or _diff_names(args, which, argnums is None)
            raise TypeError(
                f"{fname}: {names[k]} has dtype {name}, and the {b.name} backend does not differentiate complex "
                f"numbers (capabilities.complex is False); use a backend that does (numpy, torch, jax, tensorflow)")
        dtypes.append(name)
    weak_dynamic = []
    for a in rest:
        for p in range(starts[a], starts[a + 1]):
            x = leaves[p]
            if is_array(x):
                dynamic.append(p)
                if device is not None:
                    convert.add(p)
            elif _is_dynamic(x):
                dynamic.append(p)
                convert.add(p)
            elif weak and p in weak:  # a Python float: handed to the program as it is (weakly typed)
                weak_dynamic.append(len(dynamic))
                dynamic.append(p)
    list_hint = None
    for a in which:
        x = args[a]
        if isinstance(x, (list, tuple)) and x and all(isinstance(v, (int, float)) for v in x):
            list_hint = (f"argument {a} is a {type(x).__name__} (a pytree of {len(x)} scalars, each "
                         f"differentiated on its own, so f receives a {type(x).__name__} of 0-d arrays); to "
                         f"differentiate with respect to one array, pass np.asarray({'[...]' if isinstance(x, list) else '(...)'})")
            break
    return Plan(b, device, n_args, None if argnums is None else which, single, diff_positions,
                tuple(dynamic), frozenset(convert), tuple(dtypes), list_hint, tuple(weak_dynamic))



def _diff_names(args, which, all_args):
    if all_args:
        return _checks.arg_names(args, range(len(args)), "primal")
    if len(which) == 1 and isinstance(which, tuple):
        return _checks.leaf_names(args[which[0]], f"argument {which[0]}")
    return _checks.arg_names(tuple(args[i] for i in which), which)
