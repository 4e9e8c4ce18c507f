"""One call of a transform, and the plan it shares with every call of the same signature.

A transform call goes top-down through four steps:

1. :func:`unigrad._signature.arguments` flattens the positional arguments once: their leaves, this call's
   structure, and the *signature* (:mod:`unigrad._signature`).
2. :func:`unigrad._plan.make_plan` derives what every call with that signature shares: a :class:`Plan`
   (:mod:`unigrad._plan`).
3. :class:`Call` (here) holds this call's leaves, converted and placed, and builds the flat function of
   the differentiated leaves that backends differentiate. Results are rebuilt with *this call's*
   structures, never a cached one. :func:`prepare` makes it; :class:`FlatPlans`, the same in one lookup
   for eager calls on arrays alone.
4. The transform runs its kernel, eagerly or as a compiled :class:`unigrad._program.Program` (one per
   signature and decision, for backends that compile: :mod:`unigrad._program`); a compiled call that
   repeats a signature goes straight to its program (:mod:`unigrad._repeats`).

Caching is a separate layer (:mod:`unigrad._caches`): a :class:`BoundedCache` of one declared kind
maps a call's key -- its signature, and where the kind says so the Python state ``f`` reads and the
values of the arrays ``f`` is given (:attr:`Call.state`, :attr:`Call.values`) -- to a plan, a decision
(the Jacobian mode) or a program. Each exists because the per-call Python work is a visible share of
small calls (docs/benchmarks.md: the tiny tape ``vjp`` and the compiled JAX per-example Jacobian).
Setting ``UNIGRAD_NO_CACHE=1`` turns every cache off: each call then derives everything anew, which
must give the same results (the test suite runs both ways).
"""

from __future__ import annotations

import optree

from . import _checks, _registry
from ._caches import BoundedCache, CacheKind, caches_enabled  # noqa: F401 (caches_enabled: re-exported)
from ._dtypes import INEXACT
from ._plan import PLANS_WHY, Plan, _diff_names, make_plan  # noqa: F401 (PLANS_WHY, Plan: re-exported)
from ._pystate import fingerprint, python_state
from ._signature import _LEAF_ARRAYS, Key, arguments, exact_key, reject_lazy, signature  # noqa: F401
from .backend import Backend

_ACTIVE, _DEVICE = _registry.active_backend, _registry._context_device

FLAT = CacheKind("eager calls", "flat plans", why="an eager call's arrays straight to its plan (FlatPlans): "
                 "the plan's own key, read without pytree machinery")


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
    # every argument an array that is differentiated, in order (vjp, jvp; grad of f(x)): f takes the leaves as they are
    direct = treedef is None and (plan.argnums is None or len(template) == 1 == len(diff_positions))

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
