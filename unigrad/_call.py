"""One call of a transform, and the plan it shares with every call of the same signature.

A transform call goes top-down through four steps:

1. :func:`arguments` flattens the positional arguments once: their leaves, this call's structure,
   and the *signature* -- the structure (dict key order included), each array leaf's type, shape
   and dtype, and each other leaf's exact value (``1``, ``True`` and ``1.0`` differ; so do ``0.0``
   and ``-0.0``).
2. :func:`make_plan` derives what every call with that signature shares: the backend, which leaves
   are differentiated (checked: floating dtypes only), which other leaves are arrays passed as
   inputs (*dynamic*) and which are kept as given (*static*). A :class:`Plan` is immutable.
3. :class:`Call` holds this call's leaves, converted and placed, and builds the flat function of
   the differentiated leaves that backends differentiate. Results are rebuilt with *this call's*
   structures, never a cached one.
4. The transform runs its kernel, eagerly or as a compiled :class:`Program` (one per signature and
   decision, for backends that compile).

Caching is a separate layer (:mod:`unigrad._caches`): a :class:`BoundedCache` of one declared kind
maps a call's key -- its signature, and where the kind says so the Python state ``f`` reads and the
values of the arrays ``f`` is given (:attr:`Call.state`, :attr:`Call.values`) -- to a plan, a decision
(the Jacobian mode) or a program. Each exists because the per-call Python work is a visible share of
small calls (docs/benchmarks.md: the tiny tape ``vjp`` and the compiled JAX per-example Jacobian).
Setting ``UNIGRAD_NO_CACHE=1`` turns every cache off: each call then derives everything anew, which
must give the same results (the test suite runs both ways).
"""

from __future__ import annotations

import inspect
import operator
import os as _os
import warnings
from dataclasses import dataclass

import numpy as np
import optree

from . import _checks, _registry
from ._caches import BoundedCache, CacheKind, caches_enabled  # noqa: F401 (caches_enabled: re-exported)
from ._dtypes import INEXACT
from ._pystate import fingerprint, python_state
from .backend import Backend, uses_traced_value

_NONE = type(None)
_ACTIVE, _DEVICE = _registry.active_backend, _registry._context_device

#: Why each transform's plans and compiled programs are kept per signature alone (see unigrad._caches).
PLANS_WHY = ("the backend, the differentiated leaves and their dtypes, what to convert: from the signature alone "
             "(f is not run)")
PROGRAMS_WHY = ("compile=True: one program per signature, which reads f's Python state when it is traced, as "
                "jax.jit does (pass what changes as an argument; docs/conventions.md)")
REPEATS = CacheKind("compiled calls", "repeats", why="a compiled call's arguments straight to its plan and program "
                    "(Repeats): what decided them, read from the arguments and the selection state")
FLAT = CacheKind("eager calls", "flat plans", why="an eager call's arrays straight to its plan (FlatPlans): "
                 "the plan's own key, read without pytree machinery")


# ---------------------------------------------------------------------------------------------
# The cache layer
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Step 1: the arguments and their signature
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Step 2: the plan
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Step 3: the call
# ---------------------------------------------------------------------------------------------

_LEAF = optree.tree_structure(0)  # the structure of a single array


class Seen:
    """What running ``f`` revealed (output and aux structures) and the batch size it must keep;
    shared by a call and its flat function (the function holding the call would make a cycle)."""

    __slots__ = ("out_tree", "aux_tree", "batch", "out_shapes")

    def __init__(self, batch=None):
        self.out_tree = self.aux_tree = self.out_shapes = None
        self.batch = batch


def flat_function(f, plan: Plan, template, treedef, dynamic, has_aux, fname, seen: Seen):
    """``f`` as a function of the differentiated leaves alone, returning its output leaves (and aux leaves).

    ``template`` is the list of all the arguments' leaves (only its static leaves are read); the
    dynamic leaves come from ``dynamic``. ``treedef`` rebuilds the arguments (None: flat). The
    function carries ``closure_arrays``: the arrays it closes over, for backends whose behaviour
    depends on every input (JAX's scoped 64-bit mode).
    """
    b = plan.backend
    diff_positions, dynamic_positions = plan.diff_positions, plan.dynamic_positions
    bound = b.arguments(dynamic) if dynamic else ()  # what f receives for them (the backend may wrap them)
    direct = treedef is None and plan.argnums is None  # vjp/jvp of arrays: f takes the leaves as they are

    def run(*diff_leaves):
        if direct:
            call_args = diff_leaves
        else:
            leaves = list(template)
            for p, v in zip(diff_positions, diff_leaves):
                leaves[p] = v
            for p, v in zip(dynamic_positions, bound):
                leaves[p] = v
            call_args = leaves if treedef is None else optree.tree_unflatten(treedef, leaves)
        token = _registry.active_backend.set(b)
        try:
            result = f(*call_args)
        except Exception as exc:
            if _checks.is_numpy_conversion(exc):
                raise _checks.numpy_conversion_error(exc, fname) from exc
            if isinstance(exc, TypeError) and "numpy.ndarray" in str(exc) and "operand" in str(exc):
                raise TypeError(
                    f"{fname}: f combines a NumPy array with the {b.name} backend's arrays (a NumPy array closed "
                    f"over by f?); pass it to f as an argument (unigrad converts arguments) or convert it with "
                    f"unigrad.asarray(array, backend={b.name!r}) ({type(exc).__name__}: {exc})") from exc
            raise
        finally:
            _registry.active_backend.reset(token)
        if has_aux:
            if not (isinstance(result, (tuple, list)) and len(result) == 2):
                raise TypeError(f"{fname}: with has_aux=True the function must return a pair "
                                f"(output, aux); got {_describe(b, result)}")
            result, aux = result
        if b.is_array(result):  # the common single array: no pytree machinery
            seen.out_tree = _LEAF
            out_leaves = (result if b.dtype(result) in INEXACT else _checks.check_output(b, result, 0, fname),)
        else:
            out_leaves, seen.out_tree = optree.tree_flatten(result)
            if not out_leaves:
                raise TypeError(f"{fname}: the function returned no arrays ({_describe(b, result)})")
            out_leaves = tuple(o if b.is_array(o) and b.dtype(o) in INEXACT else
                               _checks.check_output(b, o, k, fname) for k, o in enumerate(out_leaves))
        if seen.out_shapes is not None:  # asked for: a decision made from output shapes is re-checked
            seen.out_shapes = tuple(b.shape(o) for o in out_leaves)
        if seen.batch is not None:  # batched_jacobian: f must map a batch (of any size) to a batch
            _checks.batch_size(b, out_leaves, lambda: output_names(seen.out_tree), fname, "output",
                               expected=b.shape(diff_leaves[0])[0])
        if has_aux:
            aux_leaves, seen.aux_tree = optree.tree_flatten(aux)
            return out_leaves, tuple(aux_leaves)
        return out_leaves

    if plan.list_hint is None:
        flat_f = run  # (one frame fewer on every call of f)
    else:
        def flat_f(*diff_leaves):
            try:
                return run(*diff_leaves)
            except Exception as exc:  # whatever went wrong, the list argument is the likely cause: say so
                raise TypeError(f"{fname}: {plan.list_hint} ({type(exc).__name__}: {exc})") from exc
    if dynamic:  # (read with getattr(f, "closure_arrays", ()): none set, no attribute dict made)
        flat_f.closure_arrays = tuple(dynamic)
    return flat_f


def _describe(b, value):
    """A value as a user would name it: internal tracer types are shown as arrays."""
    if b.is_array(value):
        return f"an array of shape {b.shape(value)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    return type(value).__name__


def output_names(out_tree):
    return _checks.leaf_names(unflatten(out_tree, range(out_tree.num_leaves)), "output")


def unflatten(treedef, leaves):
    if treedef is _LEAF or treedef.is_leaf():  # the common single array
        return leaves[0]
    return optree.tree_unflatten(treedef, list(leaves))


class Call:
    """One call of a transform: its plan, its leaves (converted and placed) and its structures."""

    __slots__ = ("plan", "program_key", "_key", "_weak", "args", "treedef", "template", "diff", "dynamic", "f", "has_aux",
                 "fname", "seen", "_flat_f", "program", "_state", "_values")

    def __init__(self, plan: Plan, program_key, f, args, leaves, treedef, has_aux, fname, weak=()):
        # program_key: the signature, dynamic scalars (``weak``) keyed by type (plans, programs, output
        # shapes); key (made when asked): with their values too, for what may depend on values.
        self.plan, self.program_key, self.f, self.args, self.treedef = plan, program_key, f, args, treedef
        self._key, self._weak = (None, (leaves, weak)) if weak else (program_key, None)
        self.has_aux, self.fname = has_aux, fname
        self.seen, self._flat_f, self.program = Seen(), None, None
        b, convert = plan.backend, plan.convert
        if convert:
            leaves = list(leaves)
            for p in convert:
                leaves[p] = self._place(b, leaves[p], p)
        self.template = leaves
        self.diff = tuple([leaves[p] for p in plan.diff_positions])
        self.dynamic = tuple([leaves[p] for p in plan.dynamic_positions])

    def _place(self, b, x, p):
        if not b.is_array(x):
            x = _checks.convert(b, x, f"argument leaf {p}")
        device = self.plan.device
        return x if device is None else b.asarray(x, device=device)

    @property
    def backend(self) -> Backend:
        return self.plan.backend

    @property
    def key(self):
        """The signature with the value of every non-array leaf (see :func:`signature`)."""
        if self._weak is not None:
            self._key, self._weak = exact_key(self.program_key, *self._weak), None
        return self._key

    @property
    def state(self) -> tuple:
        """The Python state ``f`` reads now (:func:`unigrad._pystate.python_state`), read once per call:
        the part of a cache key that an eager call's entries derived from running ``f`` depend on."""
        try:
            return self._state
        except AttributeError:  # (not read yet; calls made without __init__ have no slot value either)
            self._state = python_state(self.f)
            return self._state

    @property
    def values(self):
        """The values of the arrays ``f`` is given but not differentiated (:func:`unigrad._pystate.fingerprint`
        of ``dynamic``; None where one has no value to read), read once per call."""
        try:
            return self._values
        except AttributeError:
            self._values = fingerprint(self.plan.backend, self.dynamic)
            return self._values

    @property
    def flat_f(self):
        """``f`` as a function of the differentiated leaves (see :func:`flat_function`)."""
        fn = self._flat_f
        if fn is None:
            fn = self._flat_f = flat_function(self.f, self.plan, self.template, self.treedef, self.dynamic,
                                              self.has_aux, self.fname, self.seen)
        return fn

    def names(self):
        """Readable names of the differentiated leaves (built only for an error message)."""
        plan = self.plan
        if plan.argnums is None:
            return _diff_names(self.args, range(plan.n_args), True)
        return _diff_names(self.args, plan.argnums, False)

    # results, in this call's structures
    def output(self, leaves):
        return unflatten(self.seen.out_tree, leaves)

    def aux(self, leaves):
        return unflatten(self.seen.aux_tree, leaves)

    def inputs_like(self, leaves):
        """Leaves shaped like the differentiated arguments: one argument's structure for an int
        argnums, a tuple of the arguments' structures otherwise."""
        plan, treedef = self.plan, self.treedef
        if treedef is None:
            return leaves[0] if plan.single else tuple(leaves)
        children = treedef.children()
        which = range(plan.n_args) if plan.argnums is None else plan.argnums
        trees, start = [], 0
        for a in which:
            n = children[a].num_leaves
            trees.append(optree.tree_unflatten(children[a], list(leaves[start:start + n])))
            start += n
        return trees[0] if plan.single else tuple(trees)

    def jacobian_tree(self, jac):
        """``jac[i][j]`` -> the output structure, each leaf replaced by the input structure."""
        return self.output([self.inputs_like(row) for row in jac])

    def blocks_tree(self, blocks):
        """Flat blocks (output-major) as the Jacobian's pytree (see :meth:`jacobian_tree`)."""
        n = len(self.diff)
        if n == 0:
            return self.jacobian_tree([() for _ in range(self.seen.out_tree.num_leaves)])
        if self.seen.out_tree is _LEAF and self.plan.single and self.treedef is None:
            return blocks[0]
        return self.jacobian_tree([blocks[i:i + n] for i in range(0, len(blocks), n)])


def prepare(plans: BoundedCache, f, args, argnums, has_aux, backend, fname, device=None,
            static_args=None) -> Call:
    """The call of ``f`` on ``args``, with the plan of its signature (from ``plans`` or made anew).

    ``static_args`` is None for an eager transform; for a compiled one (``compile=True``), the set of
    argument positions whose Python scalars stay static (``static_argnums``): on a backend that
    compiles, its other Python floats and complex numbers are dynamic inputs of the program (see
    :func:`signature`).
    """
    if static_args and min(static_args) < 0:  # counted from the end of this call's arguments
        static_args = frozenset(a % len(args) for a in static_args if -len(args) <= a < len(args))
    leaves, treedef, sig, weak = signature(args, fname, static_args)
    b = _registry.resolve(backend, leaves)
    active = _registry.active_backend.get()  # inside another transform's f: a nested transform
    if active is not None and not b.capabilities.higher_order and active.name == b.name:
        raise _checks.not_nestable(b, fname)
    if device is None:
        device = _registry.current_device()
    key = None if sig is None else Key((b, device, sig))
    if weak and not b.capabilities.compile:  # runs eagerly: scalars reach f as they are, keyed by value
        key, weak = exact_key(key, leaves, weak), ()
    plan = plans.get(key)
    if plan is None:
        plan = plans.put(key, make_plan(b, device, args, leaves, treedef, argnums, fname, weak))
    return Call(plan, key, f, args, leaves, treedef, has_aux, fname, weak)


class FlatPlans:
    """The plans of eager calls whose arguments are all arrays of types met before (the common small
    call: ``vjp(f, x)``, ``grad(f)(x)``), found in one lookup of a plain tuple: the device chosen now,
    each argument's type, shape and dtype, and the backend the selection rules pick now -- what
    :func:`prepare` keys the same plan on. Anything else (a pytree, a number, a call nested in another
    transform, a ``device=``) goes through :func:`prepare`. Calls found here have no ``key`` (they
    are eager: no cache of programs, shapes or proofs reads it)."""

    __slots__ = ("plans", "flat")

    def __init__(self, plans: BoundedCache):
        self.plans, self.flat = plans, BoundedCache(FLAT, plans.maxsize)

    def prepare(self, f, args, argnums, has_aux, backend, fname) -> Call:
        """:func:`prepare` (eager, no ``device=``), through the flat lookup where the arguments allow."""
        if _ACTIVE.get() is not None:  # nested: the full path checks what may nest
            return prepare(self.plans, f, args, argnums, has_aux, backend, fname)
        sig = [_DEVICE.get() or _registry._getenv("UNIGRAD_DEVICE") or None]  # _registry.current_device()
        for a in args:
            t = type(a)
            if t not in _LEAF_ARRAYS:
                return prepare(self.plans, f, args, argnums, has_aux, backend, fname)
            sig += (t, a.shape, a.dtype)
        sig.append(_registry.resolve(backend, args))
        sig = tuple(sig)
        plan = self.flat.get(sig)
        if plan is None or plan.convert:
            call = prepare(self.plans, f, args, argnums, has_aux, backend, fname)
            if call.treedef is None and not call.plan.convert:
                self.flat.put(sig, call.plan)
            return call
        call = Call.__new__(Call)  # the arguments are the leaves, as they are (nothing to convert)
        call.plan, call.program_key, call._key, call._weak, call.f, call.args = plan, None, None, None, f, args
        call.treedef, call.template, call.has_aux, call.fname = None, args, has_aux, fname
        call.seen, call._flat_f, call.program = Seen(), None, None
        call.diff = args if plan.argnums is None else tuple([args[p] for p in plan.diff_positions])
        call.dynamic = tuple([args[p] for p in plan.dynamic_positions]) if plan.dynamic_positions else ()
        return call


# ---------------------------------------------------------------------------------------------
# Step 4: running a kernel, eagerly or compiled
# ---------------------------------------------------------------------------------------------

class Program:
    """A compiled program of one transform for one signature and decision.

    It takes the differentiated leaves and the dynamic leaves, and returns a flat tuple: the outputs
    (only with ``keep_outputs``), the result blocks and the aux leaves that are arrays; with ``bare``
    (the caller knows that tuple holds one array: a ``grad`` of one leaf, no aux) the array itself,
    which :meth:`__call__` puts back in a tuple (a compiled call then returns what ``jax.jit(jax.grad(f))``
    returns, no tuple to build and index on every call). What tracing
    revealed -- the output and aux structures, and the aux leaves that are not arrays (returned as
    ``f`` gave them) -- is recorded in the program when it is traced. It holds no array of the call
    that built it.
    """

    __slots__ = ("compiled", "out_tree", "aux_tree", "n_out", "n_blocks", "aux_static", "weak", "bare")

    def __init__(self, f, call: Call, kernel, keep_outputs: bool, bare: bool = False):
        plan = call.plan
        b, n = plan.backend, len(plan.diff_positions)
        has_aux, fname, batch, treedef = call.has_aux, call.fname, call.seen.batch, call.treedef
        template = list(call.template)  # static leaves only: the arrays are not kept
        for p in plan.diff_positions + plan.dynamic_positions:
            template[p] = None
        self.out_tree = self.aux_tree = None
        self.n_out = self.n_blocks = 0
        self.aux_static = ()
        self.bare = bare

        def program(*arrays):
            seen = Seen(batch)
            flat_f = flat_function(f, plan, template, treedef, arrays[n:], has_aux, fname, seen)
            outs, blocks, aux = kernel(b, flat_f, arrays[:n])
            outs = tuple(outs) if keep_outputs else ()
            aux = tuple(aux or ())
            self.aux_static = tuple((k, a) for k, a in enumerate(aux) if not b.is_array(a))
            self.out_tree, self.aux_tree, self.n_out, self.n_blocks = seen.out_tree, seen.aux_tree, len(outs), len(blocks)
            flat = outs + tuple(blocks) + tuple(a for a in aux if b.is_array(a))
            if not bare:
                return flat
            if len(flat) != 1 or self.aux_static:
                raise RuntimeError(f"unigrad internal error: {fname}'s compiled program was to return one array, "
                                   f"not {len(flat)}")
            return flat[0]

        # Python floats among the dynamic leaves are traced as weakly typed scalars (x32 * c stays float32)
        self.weak = tuple(n + i for i in plan.weak)
        self.compiled = b.compile(program, weak_scalars=self.weak) if self.weak else b.compile(program)

    def __call__(self, call: Call):
        try:
            flat = self.compiled(*call.diff, *call.dynamic)
        except Exception as exc:
            self.explain(exc, call)
            raise
        if self.bare:
            flat = (flat,)
        seen = call.seen
        seen.out_tree, seen.aux_tree = self.out_tree, self.aux_tree
        n_out, end = self.n_out, self.n_out + self.n_blocks
        if end == len(flat) and not self.aux_static:  # no aux (the common case)
            return flat[:n_out], flat[n_out:], ()
        aux = list(flat[end:])
        for k, a in self.aux_static:
            aux.insert(k, a)
        return flat[:n_out], flat[n_out:end], tuple(aux)

    def explain(self, exc, call: Call):
        """Raise the error that says what to do when ``exc`` (raised by the compiled program for
        ``call``) comes from using a traced value as a Python value (a dynamic Python float, or an
        array: ``if x.max() > 0``); else return."""
        if _uses_value(exc):
            raise TypeError(_weak_hint(call, exc) if self.weak else _value_hint(call, exc)) from exc

    def flat_runner(self, call: Call, index=None):
        """A function of the arguments of calls that repeat ``call``'s signature (a flat signature:
        arrays of the backend, nothing to convert or place, and dynamic Python floats), returning the
        program's flat outputs (only the one at ``index``, where given): what :meth:`__call__` does,
        without building a :class:`Call`. None where ``call`` is not such a call. With ``index``, for
        arguments in the program's own order: the runner ``(fn, index, failed)`` of :meth:`Repeats.run`
        instead of a function (one Python frame fewer on every repeat).

        A compiled function may offer ``specialize(args) -> (fn, translate)``: ``fn`` is itself, leaner,
        for arguments with the types, shapes and dtypes of ``args`` (those of the signature), and
        ``translate(exc)`` the error to raise for an error ``fn`` raised (None: that error).
        """
        plan = call.plan
        if call.treedef is not None or plan.convert:
            return None
        order = plan.diff_positions + plan.dynamic_positions
        if sorted(order) != list(range(len(call.args))):  # (a static leaf: not a repeat's signature)
            return None
        specialize = getattr(self.compiled, "specialize", None)
        fn, translate = (self.compiled, None) if specialize is None else specialize(
            tuple([call.args[p] for p in order]))
        f, has_aux, fname = call.f, call.has_aux, call.fname
        in_order = order == tuple(range(len(order)))

        def failed(exc, args):
            self.explain(exc, Call(plan, None, f, args, args, None, has_aux, fname))
            other = None if translate is None else translate(exc)
            if other is not None:
                raise other from exc

        bare = self.bare
        if in_order and index is not None:  # the runner itself (Repeats.run calls fn; no closure in between)
            return (fn, None, failed) if bare else (fn, index, failed)
        if in_order and not bare:
            def run(args):
                try:
                    return fn(*args)
                except Exception as exc:
                    failed(exc, args)
                    raise
        else:
            def run(args):
                try:
                    flat = fn(*[args[p] for p in order])
                except Exception as exc:
                    failed(exc, args)
                    raise
                if bare:
                    flat = (flat,)
                return flat if index is None else flat[index]
        return run


def block_runner(call: Call, program: Program):
    """A ``finish`` for :meth:`Repeats.remember` of transforms whose result is their Jacobian blocks
    (``jacobian``, ``batched_jacobian``): where one differentiated argument (an int ``argnums``) and
    one output array, without aux, make the result the program's one block as it is (what
    :meth:`Call.blocks_tree` returns for such a call), the runner of that block; else None."""
    if (call.has_aux or program.aux_static or program.out_tree is not _LEAF or not call.plan.single
            or program.n_blocks != 1):
        return None
    return program.flat_runner(call, program.n_out)


class Miss:
    """What :meth:`Repeats.run` returns where it did not run the call: the repeat key (None: the call
    takes the full path) and the runner kept for it (None: none, or not looked up)."""

    __slots__ = ("key", "runner")

    def __init__(self, key, runner=None):
        self.key, self.runner = key, runner


_NO_KEY = Miss(None)


class Repeats:
    """The compiled calls of one transform that repeat a signature: the arguments straight to their
    plan and program, in one dictionary lookup.

    After the first call of a signature, a compiled call's work is the program's: the rest of
    :func:`prepare` and :func:`execute` (the pytree signature, the :class:`Key`, the plan and program
    caches) derives again what the first call derived. A repeat is recognised from what decided
    them: the backend the selection rules pick now (``backend=``'s instance; without ``backend=``, what
    the rules read instead of their outcome: ``use_backend``, ``set_backend`` and ``UNIGRAD_BACKEND`` as
    they are now, the count of registration changes, and the arrays' types, which are in the key
    anyway), the device they place on now, and for each argument its array type, shape and dtype, or
    the type of a Python float or complex that the program takes as a dynamic scalar. Anything else (a pytree, an int, a static float, keyword arguments, a call
    nested in another transform) takes the full path, and so does a call the transform did not
    :meth:`remember` (the transform decides which decisions hold for a whole signature).
    """

    __slots__ = ("entries", "runners", "static", "backend", "device", "fixed")

    def __init__(self, static_args, backend, device, maxsize: int = 32, kind: CacheKind = REPEATS):
        self.entries = BoundedCache(kind, maxsize)
        self.runners = BoundedCache(kind, maxsize)  # key -> the transform's whole call, arguments to result (see remember)
        self.static, self.backend, self.device = static_args or frozenset(), backend, device
        self.fixed = backend if isinstance(backend, Backend) else None  # backend= an instance: itself

    def key(self, args):
        """The repeat key of ``args``, or None when they take the full path."""
        return self.run(args, False).key

    def lookup(self, args):
        """``(runner, key)``: what :meth:`remember` kept for repeats of ``args``' signature (a
        ``(fn, index, failed)`` triple, see :meth:`run`; None: nothing kept), and the repeat key of
        ``args`` (None when they take the full path)."""
        miss = self.run(args, False)
        return miss.runner, miss.key

    def selection(self, args):
        """The repeat key's first two parts, as a list: the device chosen now and the backend (its
        instance, or what the selection rules read). Read inline, without calling the rules: a compiled
        repeat's whole Python work is a few microseconds, and each step is a visible share of it."""
        device = self.device
        if device is None:  # _registry.current_device(), inline: use_device, else UNIGRAD_DEVICE as set now
            device = _DEVICE.get()
            if not device:  # (use_device(None) or "": the variable decides, as in current_device())
                try:  # the variable's raw bytes (None: unset): only compared, never decoded
                    device = _os.environ._data.get(_DEVICE_VAR)
                except AttributeError:  # os.environ replaced by another mapping
                    device = _registry._getenv("UNIGRAD_DEVICE")
        backend = self.backend
        if type(backend) is str:
            b = _registry._instances.get(backend)  # get_backend's own first step
            if b is None:
                b = _registry.resolve(backend, args)
        elif backend is None:  # what the selection rules read, not their outcome (resolve() costs ~1 us):
            try:  # with the arrays' types (below) and the registrations, it decides the backend
                env = _os.environ._data.get(_BACKEND_VAR)
            except AttributeError:
                env = _registry._getenv("UNIGRAD_BACKEND")
            b = (_CONTEXT_BACKEND.get(), _DEFAULT_BACKEND.get(), env, _registry._generation)
        else:
            b = self.fixed if self.fixed is not None else _registry.resolve(backend, args)
        return [device, b]

    def run(self, args, go=True):
        """The transform's result for ``args`` where it repeats a signature whose whole call
        :meth:`remember` kept (a runner); else a :class:`Miss` holding the repeat key (None: the full
        path) and the runner (None: none kept; only when ``go`` is false, which never runs it).

        A runner is ``(fn, index, failed)``: the result is ``fn(*args)[index]`` (``index`` None:
        ``fn(*args)``, a :class:`Program` made ``bare``), and ``failed(exc, args)`` raises the error to
        raise instead of ``exc`` (or returns: ``exc`` itself); ``index`` and ``failed`` None: the result
        is ``fn(args)`` (a function that handles its errors). The key and the run are in this one function: a compiled repeat's
        whole Python work is this, so it reads no more than it must (each step is a visible share of
        a small compiled call) and calls nothing it need not."""
        if _ACTIVE.get() is not None:  # nested: the full path checks what may nest
            return _NO_KEY
        key = self.selection(args)
        if self.static:
            key = self._static_key(args, key)
            if key is None:
                return _NO_KEY
        else:
            for a in args:
                t = type(a)
                summary = _SUMMARIES.get(t)
                if summary is not None:  # an array of a type met before: its type and (shape, dtype)
                    key.append(t)
                    key.append(summary(a))
                elif t is float or t is complex:  # a dynamic Python scalar: its type only
                    key.append(t)
                else:
                    summary = _summary(a)
                    if summary is None:  # an int, a static value, a container: the full path
                        return _NO_KEY
                    key.append(t)
                    key.append(summary(a))
            key = tuple(key)
        # (the dict itself, no method call: a transform made under UNIGRAD_NO_CACHE keeps no runner)
        runner = self.runners.entries.get(key)
        if runner is None or not go:
            return Miss(key, runner)
        fn, index, failed = runner
        if index is None:
            if failed is None:
                return fn(args)
            try:
                return fn(*args)
            except Exception as exc:
                failed(exc, args)
                raise
        try:
            return fn(*args)[index]
        except Exception as exc:
            failed(exc, args)
            raise

    def _static_key(self, args, key):
        """:meth:`run`'s key when some positions are static: a Python float or complex there takes the
        full path (None: one program per value)."""
        static = self.static
        if min(static) < 0:
            static = frozenset(a % len(args) for a in static if -len(args) <= a < len(args))
        for p, a in enumerate(args):
            t = type(a)
            summary = _SUMMARIES.get(t) or _summary(a)
            if summary is not None:
                key.append(t)
                key.append(summary(a))
            elif (t is float or t is complex) and p not in static:
                key.append(t)
            else:
                return None
        return tuple(key)

    def find(self, args, f, has_aux, fname):
        """``(call, key)``: the :class:`Call` of a repeat (its program in ``call.program``) or None, and
        the key to :meth:`remember` the call under (None: it takes the full path)."""
        key = self.key(args)
        return (None, None) if key is None else (self.call(key, f, args, has_aux, fname), key)

    def call(self, key, f, args, has_aux, fname):
        """The :class:`Call` of a repeat (its program in ``call.program``), or None."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        plan, program = entry
        if plan.convert:  # NumPy arrays or numbers to convert (or a device to place on): the full constructor
            call = Call(plan, None, f, args, args, None, has_aux, fname)
        else:  # the arguments are the leaves, as they are
            call = Call.__new__(Call)
            call.plan, call.program_key, call._key, call._weak, call.f, call.args = plan, None, None, None, f, args
            call.treedef, call.template, call.has_aux, call.fname = None, args, has_aux, fname
            call.seen, call._flat_f = Seen(), None
            call.diff = tuple([args[p] for p in plan.diff_positions])
            call.dynamic = tuple([args[p] for p in plan.dynamic_positions])
        call.program = program
        return call

    def remember(self, key, call: Call, finish=None):
        """Keep ``call``'s plan and program for repeats of ``key`` (a flat call run by a program).

        ``finish(call, program)``, when given, may return the transform's whole call for repeats of
        ``key``: a runner (see :meth:`run`; made with :meth:`Program.flat_runner`), or a function of
        the arguments alone (the runner ``(fn, None, None)``); it is kept in ``runners``, and
        :meth:`run` runs it. It returns None where the transform needs the :class:`Call`."""
        if key is None or call.program is None or call.treedef is not None:
            return
        self.entries.put(key, (call.plan, call.program))
        if finish is not None:
            whole = finish(call, call.program)
            if whole is not None:
                self.runners.put(key, whole if type(whole) is tuple else (whole, None, None))


def execute(call: Call, kernel, programs: BoundedCache | None = None, decision=None, keep_outputs=True,
            bare=False):
    """``kernel(backend, flat_f, leaves) -> (outputs, flat result blocks, aux)`` for this call: compiled
    when ``programs`` is given and the backend compiles, else eagerly. ``bare``: the kernel's outputs
    (with ``keep_outputs``), blocks and aux arrays are one array (see :class:`Program`)."""
    b = call.plan.backend
    if not call.diff:
        return _no_inputs(call)
    if programs is None or not b.capabilities.compile:
        outs, blocks, aux = kernel(b, call.flat_f, call.diff)
        return outs, blocks, (aux or ())
    key = programs.kind.key(call, decision)
    program = programs.get(key)
    if program is None:
        program = programs.put(key, Program(call.f, call, kernel, keep_outputs, bare))
        _count_program(programs, call)
    call.program = program  # (for Repeats.remember)
    return program(call)


#: Programs one argument may force (one per static value) before a warning says how to avoid it.
MANY_PROGRAMS = 8


def _count_program(programs: BoundedCache, call: Call):
    """Note the static values of each argument that built a new program; warn (once per transform)
    when one argument has forced more than :data:`MANY_PROGRAMS` of them."""
    if programs.warned or call.treedef is None:  # no treedef: every argument is an array
        return
    plan = call.plan
    dynamic = set(plan.diff_positions).union(plan.dynamic_positions)
    static = {}
    for p, (k, leaf) in enumerate(zip(_leaf_owners(call.treedef), call.template)):
        if p not in dynamic:
            token = _static_token(leaf)
            try:
                hash(token)
            except TypeError:
                token = id(leaf)
            static.setdefault(k, []).append(token)
    for k, tokens in static.items():
        values = programs.values_seen.setdefault(k, set())
        values.add(tuple(tokens))
        if len(values) > MANY_PROGRAMS:
            programs.warned, programs.values_seen = True, {}
            warnings.warn(_many_programs_message(call, k, len(values)), stacklevel=4)
            return


def _argument_name(call: Call, k: int) -> str:
    """``argument k`` with f's parameter name where it has one (``argument 1 ('lr')``)."""
    try:
        params = [p for p in inspect.signature(call.f).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return f"argument {k} ({params[k].name!r})"
    except (TypeError, ValueError, IndexError):
        return f"argument {k}"


def _many_programs_message(call: Call, k: int, n: int) -> str:
    arg = call.args[k]
    kind = type(arg).__name__
    if isinstance(arg, (float, complex)):
        how = ("it is named in static_argnums / static_argnames, so each value is compiled into its own program; "
               "leave it out of them to make it a dynamic input")
    elif isinstance(arg, (bool, int)):
        how = ("Python ints and bools are static (they may set shapes or select code); if this one is only a "
               "number, pass it as a 0-d array (np.asarray(value)) to make it a dynamic input")
    else:
        how = ("its non-array values are static; pass the numbers in it that change as arrays "
               "(np.asarray(value)) or Python floats to make them dynamic inputs")
    article = "an" if kind[:1] in "aeiou" else "a"
    return (f"{call.fname}(compile=True): {_argument_name(call, k)}, {article} {kind}, has forced {n} compiled "
            f"programs, one per value: {how}")


def _uses_value(exc) -> bool:
    """An error of a compiled program's trace from using a traced scalar as a Python value."""
    return uses_traced_value(exc) or (
        isinstance(exc, TypeError) and "symbolic" in str(exc) and "no value yet" in str(exc))  # a plugin's Array


def _value_hint(call: Call, exc) -> str:
    return (f"{call.fname}(compile=True): f used the value of an array as a Python value (an if or while on it, "
            f"bool(), float(), int(), a NumPy conversion); with compile=True f is traced once per signature into "
            f"one program (as jax.jit and tf.function do), where arrays have no values yet. Compute with the "
            f"namespace's functions (xp.where for a branch), pass what decides the branch as a Python value "
            f"(static), or use compile=False ({type(exc).__name__}: {_first_line(exc)})")


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _weak_hint(call: Call, exc) -> str:
    positions = [call.plan.dynamic_positions[i] for i in call.plan.weak]
    owners = sorted({_leaf_owners(optree.tree_structure(tuple(call.args)))[p] for p in positions})
    names = ", ".join(_argument_name(call, k) for k in owners)
    return (f"{call.fname}(compile=True): f used the value of a Python float as a Python value (a branch, "
            f"math.exp, an int); with compile=True Python floats and complex numbers are dynamic inputs of the "
            f"compiled program (traced scalars, as in jax.jit): here {names}. Name it in static_argnums (or "
            f"static_argnames) to compile one program per value, or compute with the namespace's functions "
            f"({type(exc).__name__}: {exc})")


def _no_inputs(call: Call):
    """No leaf to differentiate (an argument that is ``{}``, ``()``, ``[]`` or None): f is evaluated,
    and every result block is empty, as in JAX."""
    b = call.plan.backend
    result = b.evaluate(call.flat_f, ())
    outs, aux = result if call.has_aux else (result, ())
    return outs, (), aux
