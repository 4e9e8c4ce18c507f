"""The public transforms.

Everything user-facing happens here, once, for every backend: pytrees are
flattened, ``argnums`` select what is differentiated, inputs are converted,
shapes and dtypes are checked, and results are put back into the user's
structure. Backends only see flat tuples of their own arrays.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import optree

from . import _registry
from ._dtypes import COMPLEX, INEXACT, dtype_name
from .backend import Backend

__all__ = [
    "vjp", "jvp", "grad", "value_and_grad", "jacobian", "jacrev", "jacfwd", "batched_jacobian",
    "hessian", "hvp", "vmap", "namespace", "asarray", "to_numpy", "check_batch_independence",
]

_PY_SCALARS = (bool, int, float, complex)


# ---------------------------------------------------------------------------------------------
# Conversion and checks
# ---------------------------------------------------------------------------------------------

def _convert(b: Backend, x, what: str):
    """``x`` as an array of backend ``b``, dtype kept (a Python float becomes float64)."""
    if b.is_array(x):
        return x
    if isinstance(x, (np.ndarray, np.generic)) or isinstance(x, _PY_SCALARS):
        return b.asarray(np.asarray(x))
    owner = _registry._array_owner(x)
    if owner is not None:  # another backend's array: zero-copy through DLPack where b takes it, else NumPy
        if b.accepts_dlpack and hasattr(x, "__dlpack__"):
            return b.asarray(x)
        return b.asarray(_registry.get_backend(owner).to_numpy(x))
    if hasattr(x, "__array__"):
        return b.asarray(np.asarray(x))
    raise TypeError(f"{what} must be an array or a Python scalar; got {type(x).__name__}")


def _keep_or_convert(b: Backend, x):
    """Non-differentiated leaves: NumPy arrays and foreign arrays become backend arrays; the rest stays."""
    if isinstance(x, np.ndarray) and not b.is_array(x):
        return b.asarray(x)
    if isinstance(x, _PY_SCALARS) or x is None or isinstance(x, (str, bytes)) or b.is_array(x):
        return x
    if _registry._array_owner(x) is not None:
        return _convert(b, x, "argument")
    return x


def _leaf_names(tree, prefix: str) -> list[str]:
    """Readable names of the leaves of ``tree``: ``x``, ``argument 1['w'][0]``..."""
    paths, _, _ = optree.tree_flatten_with_path(tree)
    return [prefix + "".join(f"[{p!r}]" for p in path) for path in paths]


def _arg_names(args_tuple, positions, word="argument") -> list[str]:
    """Leaf names of a tuple of arguments: ``argument 0``, ``argument 1['w'][0]``..."""
    paths, _, _ = optree.tree_flatten_with_path(tuple(args_tuple))
    return [f"{word} {positions[p[0]]}" + "".join(f"[{q!r}]" for q in p[1:]) for p in paths]


def _check_like(b: Backend, value, reference, what: str, fname: str):
    """One policy for cotangents and tangents: the reference's shape exactly; a floating dtype
    (complex too for a complex reference) cast to the reference's dtype; anything else is an error."""
    if isinstance(value, _PY_SCALARS) and not isinstance(value, bool):
        value = np.asarray(value)
        if value.dtype.kind == "i":
            value = value.astype(np.float64)
    try:
        value = _convert(b, value, what)
    except TypeError as exc:
        raise TypeError(f"{fname}: {exc}") from None
    want_shape, got_shape = b.shape(reference), b.shape(value)
    want_dtype, got_dtype = b.dtype(reference), b.dtype(value)
    if got_shape != want_shape:
        raise ValueError(f"{fname}: {what} has shape {got_shape}; expected {want_shape} "
                         f"(the shape of the value it pairs with; it is never broadcast)")
    if got_dtype not in INEXACT or (got_dtype in COMPLEX and want_dtype not in COMPLEX):
        raise ValueError(f"{fname}: {what} has dtype {got_dtype}; expected {want_dtype} "
                         f"(a floating{' or complex' if want_dtype in COMPLEX else ''} dtype is cast to it)")
    if got_dtype != want_dtype:
        value = b.cast(value, want_dtype)
    if b.device(value) != b.device(reference):
        value = b.asarray(value, device=b.device(reference))
    return value


def _tangent_leaves(t, tangents, fname):
    """The tangents' leaves, checked against the primals' structure, shapes, dtypes and devices."""
    b = t.backend
    try:
        leaves = t.treedef.flatten_up_to(tuple(tangents))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{fname}: tangents must have the structure of primals, {t.treedef}; ({exc})") from None
    return tuple(
        tl if b.matches(tl, p) else _check_like(b, tl, p, "tangent for " + t.names_fn()[k], fname)
        for k, (tl, p) in enumerate(zip(leaves, t.leaves)))


_ARGNUMS: dict = {}  # (argnums, nargs) -> (single, argnums, other positions) for the valid ones (checked once)


def _normalize_argnums(argnums, nargs: int, fname: str):
    # only exact ints are cached: True == 1 would otherwise find 1's entry and skip its TypeError
    exact = type(argnums) is int or (type(argnums) is tuple and all(type(a) is int for a in argnums))
    key = (argnums, nargs) if exact else None
    known = _ARGNUMS.get(key) if key is not None else None
    if known is not None:
        return known
    single = isinstance(argnums, int) and not isinstance(argnums, bool)
    seq = (argnums,) if single else argnums
    if not isinstance(seq, (tuple, list)) or not seq or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in seq):
        raise TypeError(f"{fname}: argnums must be an int or a non-empty tuple of ints; got {argnums!r}")
    out = []
    for a in seq:
        if not -nargs <= a < nargs:
            raise ValueError(f"{fname}: argnums={argnums!r} is out of range for a function called with "
                             f"{nargs} positional argument{'s' if nargs != 1 else ''}")
        a = a % nargs
        if a in out:
            raise ValueError(f"{fname}: argnums={argnums!r} repeats argument {a}")
        out.append(a)
    result = single, tuple(out), tuple(i for i in range(nargs) if i not in out)
    if key is not None and len(_ARGNUMS) < 1024:
        _ARGNUMS[key] = result
    return result


# Array types met as leaves (optree flattens them to themselves): a flat argument list of these needs no
# pytree flattening. Array types are not pytree nodes; registering one as a node after it was met here
# would not be seen.
_LEAF_ARRAYS: set = {np.ndarray}
_FLAT_TREES: dict = {}  # (n, none_is_leaf) -> the structure of a tuple of n leaves


def _flat_tree(n: int, none_is_leaf: bool):
    tree = _FLAT_TREES.get((n, none_is_leaf))
    if tree is None:
        tree = _FLAT_TREES[n, none_is_leaf] = optree.tree_structure((0,) * n, none_is_leaf=none_is_leaf)
        _TOKENS[id(tree)] = ("flat", n, none_is_leaf)
    return tree


# Stand-ins for the structures above in cache keys (hashing an optree structure costs as much as the
# rest of a key together). Keyed by id: these structures live as long as the process, so no other
# object ever has their id.
_TOKENS: dict = {}


def _remember(cache: dict, key, value, maxsize: int = 32):
    """``cache[key] = value``, dropping the oldest entry when full (safe when threads share the cache)."""
    while len(cache) >= maxsize:
        try:
            cache.pop(next(iter(cache)), None)
        except (StopIteration, RuntimeError):  # emptied or changed by another thread meanwhile
            break
    cache[key] = value


_PRIMAL_PROTOS: dict = {}  # the prototypes of vjp, jvp and hvp calls (see _Traced)


def _signature(args):
    """``(key, leaves)``: the arguments' structure with each leaf's type, shape and dtype, and the leaves,
    when every leaf is an array of a type met before; ``(None, None)`` otherwise. Arguments that are
    arrays themselves (the common case) need no pytree flattening."""
    sig = []
    for a in args:
        t = type(a)
        if t not in _LEAF_ARRAYS:
            break
        sig.append(t)
        sig.append(a.shape)
        sig.append(a.dtype)
    else:
        return tuple(sig), args
    leaves, treedef = optree.tree_flatten(args, none_is_leaf=True)
    sig = [treedef]  # not a type: no flat signature equals a pytree one
    for a in leaves:
        t = type(a)
        if t not in _LEAF_ARRAYS:
            return None, None
        sig.append(t)
        sig.append(a.shape)
        sig.append(a.dtype)
    return tuple(sig), leaves


def _positions(sig, n_args, which):
    """Where the leaves of the arguments ``which`` are among all the arguments' leaves (see ``_signature``)."""
    flat = not sig or isinstance(sig[0], type)  # (no arguments: an empty signature)
    counts = [1] * n_args if flat else [c.num_leaves for c in sig[0].children()]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    return tuple(i for a in which for i in range(starts[a], starts[a + 1]))


_DYNAMIC = object()  # marks a non-differentiated leaf that is an array (an input of a compiled program)


def _flat_function(f, b, fname, has_aux, assemble, seen, dynamic_leaves):
    """``f`` as a function of the differentiated leaves alone, with the other arrays bound to ``dynamic_leaves``.

    It returns the output leaves (and the aux leaves), checked, and records the structures it met in
    ``seen`` (out_tree, aux_tree); ``seen[2]``, when set, is the batch size every output must keep.
    """

    def flat_f(*diff_leaves):
        call = diff_leaves if assemble is None else assemble(diff_leaves, dynamic_leaves)
        token = _registry.active_backend.set(b)
        try:
            result = f(*call)
        finally:
            _registry.active_backend.reset(token)
        if has_aux:
            if not (isinstance(result, (tuple, list)) and len(result) == 2):
                raise TypeError(f"{fname}: with has_aux=True the function must return a pair "
                                f"(output, aux); got {type(result).__name__}")
            result, aux = result
        if b.is_array(result):  # the common single array: no pytree machinery
            seen[0] = _LEAF
            out_leaves = (result if b.dtype(result) in INEXACT else _check_output(b, result, 0, fname),)
        else:
            out_leaves, seen[0] = optree.tree_flatten(result)
            if not out_leaves:
                raise TypeError(f"{fname}: the function returned no arrays ({result!r})")
            out_leaves = tuple(o if b.is_array(o) and b.dtype(o) in INEXACT else
                               _check_output(b, o, k, fname) for k, o in enumerate(out_leaves))
        if seen[2] is not None:  # batched_jacobian: f must map a batch (of any size) to a batch
            _batch_size(b, out_leaves, lambda: _output_names(seen[0]), fname, "output",
                        expected=b.shape(diff_leaves[0])[0])
        if has_aux:
            aux_leaves, seen[1] = optree.tree_flatten(aux)
            return out_leaves, tuple(aux_leaves)
        return out_leaves

    return flat_f


class _Traced:
    """One call of a transform: the backend, the differentiated leaves and the flat function.

    Non-differentiated arguments are split into array leaves (``dynamic``: converted to the
    backend, inputs of a compiled program) and everything else (``static``: kept as given,
    part of a compiled program's cache key).

    Every transform call builds one, so the common case is fast: when every positional argument is
    already an array of the backend, what the general path derives from the arguments' types, shapes
    and dtypes (structures, checks, the cache key) is kept in the transform's ``protos`` and reused by
    the next call with the same signature, which then only reads each argument's type, shape and dtype.
    """

    __slots__ = ("backend", "leaves", "treedef", "fname", "dynamic", "static", "other_tree", "has_aux", "_key",
                 "_dtypes", "_diff", "_argnums", "_single", "_flat", "_seen", "_f", "_flat_f", "_assemble", "_call",
                 "as_given", "_positions")

    # What running f revealed (its output and aux structures) and the batch size f must keep, in a list
    # that flat_f shares: flat_f holding the _Traced itself would make a reference cycle per call.
    out_tree = property(lambda self: self._seen[0], lambda self, v: self._seen.__setitem__(0, v))
    aux_tree = property(lambda self: self._seen[1], lambda self, v: self._seen.__setitem__(1, v))
    batch = property(lambda self: self._seen[2], lambda self, v: self._seen.__setitem__(2, v))

    def __init__(self, f, args, argnums, has_aux, backend, fname, all_args=False, device=None, protos=None):
        self.fname, self.has_aux, self._key = fname, has_aux, False
        self._seen = [None, None, None]  # out_tree, aux_tree, batch
        # flat_f and the assembly of f's arguments are built on first use: a compiled call needs neither
        self._f, self._flat_f = f, None
        if device is None:
            device = _registry.current_device()
        proto_key = None
        if protos is not None and device is None:
            sig, arg_leaves = _signature(args)
            if sig is not None:
                b = _registry.resolve(backend, arg_leaves)
                proto_key = (b, has_aux, sig)
                try:
                    proto = protos.get(proto_key)
                except TypeError:  # an unhashable shape or dtype: no prototype
                    proto, proto_key = None, None
                if proto is not None:
                    self._adopt(proto, b, args, arg_leaves)
                    return
        if all_args:  # vjp / jvp: every primal is differentiated
            single, argnums, rest = False, None, ()
            diff = args if type(args) is tuple else tuple(args)
            others = ()
        else:
            if not args:
                raise TypeError(f"{fname}: the function must be called with at least one positional argument")
            single, argnums, rest = _normalize_argnums(argnums, len(args), fname)
            diff = args[argnums[0]] if single else tuple([args[i] for i in argnums])
            others = tuple([args[i] for i in rest])
        self._diff, self._argnums, self._single = diff, argnums, single
        # Fast path: every argument is an array of a type met before (a pytree leaf): no flattening.
        if single:
            flat = type(diff) in _LEAF_ARRAYS
            if flat:
                raw_leaves, treedef = [diff], _LEAF
        else:
            for a in diff:
                if type(a) not in _LEAF_ARRAYS:
                    flat = False
                    break
            else:
                flat = True
                raw_leaves, treedef = list(diff), _flat_tree(len(diff), False)
        if not flat:
            raw_leaves, treedef = optree.tree_flatten(diff)
            # flat all the same when each differentiated argument is one leaf (then the canonical structure)
            flat = treedef.num_nodes == 1 if single else treedef.num_nodes == len(raw_leaves) + 1 == len(diff) + 1
            if flat:
                treedef = _LEAF if single else _flat_tree(len(diff), False)
        self.treedef, self._flat = treedef, flat
        if not others:
            other_leaves, self.other_tree = (), None
        else:
            for a in others:
                if type(a) not in _LEAF_ARRAYS:
                    other_leaves, other_tree = optree.tree_flatten(others, none_is_leaf=True)
                    if other_tree.num_nodes == len(other_leaves) + 1 == len(others) + 1:
                        other_tree = _flat_tree(len(others), True)  # the canonical structure
                    self.other_tree = other_tree
                    break
            else:
                other_leaves, self.other_tree = list(others), _flat_tree(len(others), True)
        b = self.backend = _registry.resolve(backend, raw_leaves + other_leaves if other_leaves else raw_leaves)
        is_array, dtype = b.is_array, b.dtype
        dtypes = []
        for k, x in enumerate(raw_leaves):
            if device is not None or not is_array(x):
                x = raw_leaves[k] = self._place(x, k, device)
                proto_key = None  # converted: not the arguments as given
            elif type(x) not in _LEAF_ARRAYS and len(_LEAF_ARRAYS) < 64:
                _LEAF_ARRAYS.add(type(x))  # an array type: a pytree leaf (learnt for the fast path above)
            name = dtype(x)
            if name not in INEXACT:
                raise TypeError(
                    f"{fname}: {self.names_fn()[k]} has dtype {name}; only floating-point or complex inputs can be "
                    f"differentiated (cast it, e.g. to float64, or leave it out of argnums)")
            dtypes.append(name)
        self.leaves, self._dtypes = tuple(raw_leaves), tuple(dtypes)
        dynamic, static = [], []
        for v in other_leaves:
            if not is_array(v):
                proto_key = None
                v = _keep_or_convert(b, v)
                if not is_array(v):
                    static.append(v)
                    continue
            dynamic.append(v if device is None else b.asarray(v, device=device))
            static.append(_DYNAMIC)
        self.dynamic, self.static = tuple(dynamic), tuple(static)
        self._call = (len(args), rest, all_args)
        self._assemble = None if all_args and flat else False
        self.as_given = proto_key is not None  # every leaf an array of b, as given
        if proto_key is not None:  # the next call with this signature starts here
            sig, n = proto_key[2], len(args)
            diff_at = _positions(sig, n, range(n) if all_args else argnums)
            # None: the differentiated leaves are all the leaves, in order (vjp's case: nothing to pick)
            self._positions = (None if diff_at == tuple(range(len(arg_leaves))) else diff_at,
                               _positions(sig, n, rest))
            _remember(protos, proto_key, (self.treedef, self.other_tree, self.static, self._dtypes, self.static_key(),
                                          argnums, single, self._call, self._assemble, flat, self._positions))

    def _adopt(self, proto, b, args, arg_leaves):
        """Fill in from a prototype: a former call whose arguments had this structure and these leaf
        types, shapes and dtypes (``arg_leaves``: this call's leaves, see ``_signature``)."""
        (self.treedef, self.other_tree, self.static, self._dtypes, self._key, argnums, single, self._call,
         self._assemble, self._flat, self._positions) = proto
        self.backend, self._argnums, self._single, self.as_given = b, argnums, single, True
        diff_at, dynamic_at = self._positions
        if diff_at is None:
            self.leaves = arg_leaves if type(arg_leaves) is tuple else tuple(arg_leaves)
        else:
            self.leaves = tuple([arg_leaves[i] for i in diff_at])
        self.dynamic = tuple([arg_leaves[i] for i in dynamic_at]) if dynamic_at else ()
        if argnums is None:
            self._diff = args if type(args) is tuple else tuple(args)
        else:
            self._diff = args[argnums[0]] if single else tuple([args[i] for i in argnums])

    @property
    def flat_f(self):
        """``f`` as a function of the differentiated leaves (see ``_flat_function``)."""
        fn = self._flat_f
        if fn is None:
            fn = self._flat_f = _flat_function(self._f, self.backend, self.fname, self.has_aux, self.assembly(),
                                               self._seen, self.dynamic)
        return fn

    def assembly(self):
        """``assemble(diff_leaves, dynamic_leaves)`` -> the positional arguments of ``f`` (None: the leaves)."""
        if self._assemble is False:
            n_args, rest, all_args = self._call
            if all_args:
                treedef = self.treedef
                self._assemble = lambda diff_leaves, dynamic_leaves: optree.tree_unflatten(treedef, list(diff_leaves))
            else:
                self._assemble = self._assembler(n_args, self._argnums, rest, self._single, self._flat)
        return self._assemble

    def _place(self, x, k, device):
        b = self.backend
        if not b.is_array(x):
            x = _convert(b, x, self.names_fn()[k])
        return x if device is None else b.asarray(x, device=device)

    def names_fn(self):
        """Readable names of the differentiated leaves (built only for an error message)."""
        if self._argnums is None:
            return _arg_names(self._diff, range(len(self._diff)), "primal")
        if self._single:
            return _leaf_names(self._diff, f"argument {self._argnums[0]}")
        return _arg_names(self._diff, self._argnums)

    def _assembler(self, n_args, argnums, rest, single, flat):
        """``assemble(diff_leaves, dynamic_leaves)``: the positional arguments to call ``f`` with."""
        treedef, other_tree, static = self.treedef, self.other_tree, self.static
        # the other arguments are arrays, one each: the dynamic leaves are those arguments, in order
        rest_flat = other_tree is None or (other_tree.num_nodes == len(static) + 1 == len(rest) + 1
                                           and all(v is _DYNAMIC for v in static))

        def assemble(diff_leaves, dynamic_leaves):
            call = [None] * n_args
            if single:
                call[argnums[0]] = diff_leaves[0] if flat else optree.tree_unflatten(treedef, list(diff_leaves))
            else:
                tree = diff_leaves if flat else optree.tree_unflatten(treedef, list(diff_leaves))
                for i, v in zip(argnums, tree):
                    call[i] = v
            if rest:
                if rest_flat:
                    others = dynamic_leaves
                else:
                    it = iter(dynamic_leaves)
                    others = optree.tree_unflatten(other_tree, [next(it) if v is _DYNAMIC else v for v in static])
                for i, v in zip(rest, others):
                    call[i] = v
            return call
        return assemble

    def static_key(self):
        """The signature a compiled program or a cached decision depends on: argument structure,
        non-array arguments, shapes and dtypes (None when something is not hashable). Computed once,
        and hashed once (it is looked up in several caches per call)."""
        if self._key is False:
            b, dynamic = self.backend, self.dynamic
            try:
                key = _Key((b.name, _TOKENS.get(id(self.treedef), self.treedef),
                            _TOKENS.get(id(self.other_tree), self.other_tree), self.static, self.has_aux,
                            tuple(map(b.shape, self.leaves)), self._dtypes,
                            tuple(map(b.shape, dynamic)), tuple(map(b.dtype, dynamic))))
            except TypeError:
                key = None
            self._key = key
        return self._key

    def output(self, leaves):
        return _unflatten(self.out_tree, leaves)

    def aux(self, leaves):
        return _unflatten(self.aux_tree, leaves)

    def inputs_like(self, leaves):
        if self._flat:
            return leaves[0] if self._single else tuple(leaves)
        return optree.tree_unflatten(self.treedef, list(leaves))

    def jacobian_tree(self, jac):
        """jac[i][j] -> the output structure, each leaf replaced by the input structure."""
        return self.output([self.inputs_like(row) for row in jac])

    def blocks_tree(self, blocks):
        """The flat blocks (output-major) as the Jacobian's pytree (see ``jacobian_tree``)."""
        if self._seen[0] is _LEAF and self._single and self._flat:  # one output, one input array
            return blocks[0]
        return self.jacobian_tree(_unflatten_blocks(blocks, len(self.leaves)))

    def shell(self):
        """A copy with the structures and none of the arrays: what rebuilding a result needs."""
        s = _Traced.__new__(_Traced)
        s.backend, s.fname, s.has_aux, s.treedef, s.other_tree = (self.backend, self.fname, self.has_aux,
                                                                   self.treedef, self.other_tree)
        s._flat, s._single, s._seen = self._flat, self._single, list(self._seen)
        s.leaves, s.dynamic = (None,) * len(self.leaves), (None,) * len(self.dynamic)
        return s

    def program_inputs(self):
        """Where the program's inputs (leaves, then the other arrays) are among the arguments' leaves
        (``_signature``), for a call whose leaves are all arrays as given."""
        diff_at, dynamic_at = self._positions
        return (tuple(range(len(self.leaves))) if diff_at is None else diff_at) + dynamic_at


_LEAF = optree.tree_structure(0)  # the tree of a single array
_TOKENS[id(_LEAF)] = ("leaf",)


class _Key:
    """A cache key (a tuple) whose hash is computed once: hashing pytree structures is not free."""

    __slots__ = ("items", "hash")

    def __init__(self, items):
        self.items, self.hash = items, hash(items)

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        return self is other or (type(other) is _Key and self.hash == other.hash and self.items == other.items)


def _unflatten(treedef, leaves):
    if treedef is _LEAF or treedef.is_leaf():  # the common single array: no need for optree's general machinery
        return leaves[0]
    return optree.tree_unflatten(treedef, list(leaves))


class _Programs:
    """Compiled programs of one transform, one per static signature (``compile=True``).

    A program takes the differentiated leaves and the other array leaves and returns a flat tuple:
    the outputs (only with ``keep_outputs``: a Jacobian's caller never sees them, and each output of
    a compiled program is a buffer to hand back), the transform's result blocks and the aux leaves.
    The structures seen while tracing are kept beside it to rebuild the user's pytrees. A program
    holds no array of the call that built it.
    """

    def __init__(self, maxsize=32, keep_outputs=True):
        self.entries, self.maxsize, self.keep_outputs = {}, maxsize, keep_outputs

    def run(self, f, t, kernel):
        key = t.static_key()
        entry = self.entries.get(key) if key is not None else None
        if entry is None:
            entry = self._build(f, t, kernel)
            if key is not None:
                _remember(self.entries, key, entry, self.maxsize)
        compiled, meta = entry
        flat = compiled(*t.leaves, *t.dynamic)
        seen = t._seen
        seen[0], seen[1], n_out, n_blocks = meta
        end = n_out + n_blocks
        return flat[:n_out], flat[n_out:end], flat[end:]

    def _build(self, f, t, kernel):
        b, n, keep = t.backend, len(t.leaves), self.keep_outputs
        fname, has_aux, assemble = t.fname, t.has_aux, t.assembly()
        batch = t.batch
        meta = [None, None, 0, 0]  # out_tree, aux_tree, n_out, n_blocks: known once traced

        def program(*arrays):
            seen = [None, None, batch]
            flat_f = _flat_function(f, b, fname, has_aux, assemble, seen, arrays[n:])
            outs, blocks, aux = kernel(b, flat_f, arrays[:n])
            outs = tuple(outs) if keep else ()
            meta[:] = seen[0], seen[1], len(outs), len(blocks)
            return outs + tuple(blocks) + tuple(aux or ())

        return b.compile(program), meta


_MISS = object()


class _DirectCalls:
    """Repeat calls of a compiled transform, straight to their program.

    A call whose positional arguments are all arrays of the backend, as given, with no device
    setting, is settled -- structures, checks, the transform's decisions, the program, and how to
    rebuild the result -- by the backend and the arguments' types, shapes and dtypes. The first such
    call goes the whole way and leaves here what the next one needs: the program, where its inputs
    are among the arguments, and a structure-only copy of the call to rebuild the result with. On the
    hot path of a compiled call, every step of Python it skips is time the native call does not have.
    """

    def __init__(self, backend, finish):
        self.entries, self.backend, self.finish = {}, backend, finish

    def call(self, args):
        """The result, or ``_MISS`` when this call's signature has no program yet."""
        sig, leaves = _signature(args)
        if sig is None or _registry.current_device() is not None:
            return _MISS
        try:
            entry = self.entries.get((_registry.resolve(self.backend, leaves), sig))
        except TypeError:  # an unhashable shape or dtype
            return _MISS
        if entry is None:
            return _MISS
        compiled, meta, order, shell = entry
        flat = compiled(*[leaves[i] for i in order])
        n_out, n_blocks = meta[2], meta[3]
        end = n_out + n_blocks
        return self.finish(shell, flat[:n_out], flat[n_out:end], flat[end:])

    def remember(self, t, args, programs):
        """After a call ran ``programs``' program for ``t``: the next call with this signature goes direct."""
        key = t.static_key()
        entry = programs.entries.get(key) if t.as_given and key is not None else None
        if entry is not None:
            compiled, meta = entry
            _remember(self.entries, (t.backend, _signature(args)[0]), (compiled, meta, t.program_inputs(), t.shell()))


def _direct_first(direct, transform_f):
    """``transform_f``, tried through ``direct`` first (keyword arguments always take the whole way)."""
    if direct is None:
        return transform_f

    def direct_or_whole(*args, **kwargs):
        if not kwargs:
            result = direct.call(args)
            if result is not _MISS:
                return result
        return transform_f(*args, **kwargs)

    return direct_or_whole


def _execute(f, t, kernel, programs):
    """Run ``kernel(backend, flat_f, leaves) -> (outputs, flat result blocks, aux)``, compiled when asked."""
    if programs is None:
        outs, blocks, aux = kernel(t.backend, t.flat_f, t.leaves)
        return outs, blocks, (aux or ())
    return programs.run(f, t, kernel)


def _output_names(out_tree):
    return _leaf_names(_unflatten(out_tree, range(out_tree.num_leaves)), "output")


def _check_output(b: Backend, o, k, fname):
    if not b.is_array(o):
        if isinstance(o, (float, complex)) and not isinstance(o, bool):
            o = b.asarray(np.asarray(o))
        else:
            raise TypeError(f"{fname}: the function must return arrays (or a pytree of arrays); "
                            f"output leaf {k} is {type(o).__name__}")
    name = b.dtype(o)
    if name not in INEXACT:
        raise TypeError(f"{fname}: output leaf {k} has dtype {name}; only floating-point or complex outputs "
                        f"can be differentiated")
    return o


# ---------------------------------------------------------------------------------------------
# vjp / jvp
# ---------------------------------------------------------------------------------------------

def vjp(f: Callable, *primals, has_aux: bool = False, backend=None):
    """Evaluate ``f(*primals)`` and return its vector-Jacobian product function.

    Args:
      f: function of ``len(primals)`` arguments returning an array or a pytree of arrays
        (``(output, aux)`` with ``has_aux``).
      *primals: the point; arrays or pytrees of arrays (NumPy arrays and Python scalars are converted).
      has_aux: ``f`` returns ``(output, aux)``; aux is returned as is, not differentiated.
      backend: backend name or object; default by selection order.

    Returns:
      ``(output, vjp_fn)`` or ``(output, vjp_fn, aux)``. ``vjp_fn(cotangent)`` takes a pytree like
      ``output`` and returns a tuple with one cotangent per primal, shaped like the primal.

    Example:
      >>> out, vjp_fn = unigrad.vjp(lambda x: x ** 2, np.arange(3.0))
      >>> vjp_fn(np.ones(3))
      (array([0., 2., 4.]),)
    """
    t = _Traced(f, primals, None, has_aux, backend, "vjp", all_args=True, protos=_PRIMAL_PROTOS)
    b = t.backend
    outputs, vjp_flat, aux = b.vjp(t.flat_f, t.leaves, has_aux=has_aux)
    out_tree = t.out_tree

    def vjp_fn(cotangent):
        if out_tree is _LEAF and b.matches(cotangent, outputs[0]):  # one output, a cotangent needing no checks
            return t.inputs_like(vjp_flat((cotangent,)))
        try:
            cts = (cotangent,) if out_tree is _LEAF else out_tree.flatten_up_to(cotangent)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"vjp_fn: the cotangent must have the structure of the output, {out_tree}; "
                             f"got {optree.tree_structure(cotangent, none_is_leaf=True)} ({exc})") from None
        names = None
        checked = []
        for k, (c, o) in enumerate(zip(cts, outputs)):
            if not b.matches(c, o):
                names = names or _leaf_names(optree.tree_unflatten(out_tree, list(range(len(cts)))), "cotangent")
                c = _check_like(b, c, o, f"{names[k]} (for an output of shape {b.shape(o)}, "
                                         f"dtype {b.dtype(o)})", "vjp_fn")
            checked.append(c)
        grads = vjp_flat(tuple(checked))
        return t.inputs_like(grads)

    out = _unflatten(out_tree, outputs)
    if has_aux:
        return out, vjp_fn, t.aux(aux)
    return out, vjp_fn


def jvp(f: Callable, primals, tangents, has_aux: bool = False, backend=None):
    """Evaluate ``f(*primals)`` and its Jacobian-vector product with ``tangents``.

    Args:
      f: function of ``len(primals)`` arguments.
      primals: tuple (or list) of arguments; pytrees allowed.
      tangents: same structure, shapes and (floating) dtypes as ``primals``.
      has_aux: ``f`` returns ``(output, aux)``.
      backend: backend name or object.

    Returns:
      ``(output, tangent_out)`` or ``(output, tangent_out, aux)``.

    Example:
      >>> unigrad.jvp(lambda x: x ** 2, (np.arange(3.0),), (np.ones(3),))[1]
      array([0., 2., 4.])
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError(f"jvp: primals and tangents must be tuples or lists; got {type(primals).__name__} and "
                        f"{type(tangents).__name__}")
    if len(primals) != len(tangents):
        raise ValueError(f"jvp: primals and tangents must have the same length; got {len(primals)} and "
                         f"{len(tangents)}")
    t = _Traced(f, tuple(primals), None, has_aux, backend, "jvp", all_args=True, protos=_PRIMAL_PROTOS)
    b = t.backend
    tan_leaves = _tangent_leaves(t, tangents, "jvp")
    outputs, tangents_out, aux = b.jvp(t.flat_f, t.leaves, tan_leaves, has_aux=has_aux)
    result = (t.output(outputs), t.output(tangents_out))
    return result + (t.aux(aux),) if has_aux else result


# ---------------------------------------------------------------------------------------------
# grad / value_and_grad
# ---------------------------------------------------------------------------------------------

def _scalar_check(b, outputs, fname):
    if len(outputs) != 1 or b.shape(outputs[0]) != ():
        shapes = [b.shape(o) for o in outputs]
        raise TypeError(f"{fname} requires a function with one scalar (shape ()) output; got "
                        f"{'outputs of shapes ' + str(shapes) if len(shapes) != 1 else 'shape ' + str(shapes[0])}. "
                        f"Use vjp or jacobian for non-scalar outputs")
    if b.dtype(outputs[0]) in COMPLEX:
        raise TypeError(f"{fname} requires a real-valued output; got dtype {b.dtype(outputs[0])}. "
                        f"Use vjp with an explicit cotangent for complex outputs")


def _grad_kernel(b, flat_f, leaves, has_aux):
    return b.value_and_grad(flat_f, leaves, has_aux=has_aux, check=lambda outputs: _scalar_check(b, outputs, "grad"))


def value_and_grad(f: Callable, argnums=0, has_aux: bool = False, backend=None, *, compile: bool = False,
                   device=None) -> Callable:
    """A function returning ``(f(*args), gradient)`` of a scalar-valued ``f``.

    Args:
      f: returns a real scalar (shape ``()``), or ``(scalar, aux)`` with ``has_aux``.
      argnums: int or tuple of ints: which positional arguments to differentiate.
      has_aux: return ``((value, aux), gradient)``.
      backend: backend name or object.
      compile: run the whole transform as one compiled program (``jax.jit``, ``tf.function``...),
        built once per static signature (argument structure, non-array arguments, shapes, dtypes).
      device: place the inputs on this device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu"``).

    Returns:
      A function of the same arguments; the gradient has the structure of
      ``args[argnums]`` (a tuple of those when argnums is a tuple).

    Example:
      >>> unigrad.value_and_grad(lambda x: (x ** 2).sum())(np.arange(3.0))
      (array(5.), array([0., 2., 4.]))
    """
    programs = _Programs() if compile else None
    protos = {}  # argument signatures met (see _Traced)

    def kernel(b, flat_f, leaves):
        return _grad_kernel(b, flat_f, leaves, has_aux)

    def finish(t, outputs, grads, aux):
        value, grads = t.output(outputs), t.inputs_like(grads)
        return ((value, t.aux(aux)), grads) if has_aux else (value, grads)

    direct = _DirectCalls(backend, finish) if compile else None

    def value_and_grad_f(*args, **kwargs):
        g = f if not kwargs else (lambda *a: f(*a, **kwargs))
        t = _Traced(g, args, argnums, has_aux, backend, "grad", device=device, protos=protos)
        outputs, grads, aux = _execute(g, t, kernel, programs if not kwargs else None)
        if direct is not None and not kwargs:
            direct.remember(t, args, programs)
        return finish(t, outputs, grads, aux)

    value_and_grad_f = _direct_first(direct, value_and_grad_f)
    _wraps(value_and_grad_f, f, "value_and_grad")
    return value_and_grad_f


def grad(f: Callable, argnums=0, has_aux: bool = False, backend=None, *, compile: bool = False,
         device=None) -> Callable:
    """The gradient of a scalar-valued ``f`` (reverse mode, one backward pass).

    Args:
      f: returns a real scalar, or ``(scalar, aux)`` with ``has_aux``.
      argnums: int or tuple of ints.
      has_aux: return ``(gradient, aux)``.
      backend: backend name or object.
      compile: one compiled program per static signature (see :func:`value_and_grad`).
      device: place the inputs on this device.

    Example:
      >>> unigrad.grad(lambda x: (x ** 2).sum())(np.arange(3.0))
      array([0., 2., 4.])
    """
    vg = value_and_grad(f, argnums, has_aux, backend, compile=compile, device=device)

    def grad_f(*args, **kwargs):
        (value, grads) = vg(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    _wraps(grad_f, f, "grad")
    return grad_f


# ---------------------------------------------------------------------------------------------
# Jacobians
# ---------------------------------------------------------------------------------------------

_MODES = ("auto", "rev", "fwd")


def _check_mode(mode, fname):
    if mode not in _MODES:
        raise ValueError(f"{fname}: mode must be one of {_MODES}; got {mode!r}")


def _check_chunk(chunk_size, fname):
    if chunk_size is not None and (not isinstance(chunk_size, int) or isinstance(chunk_size, bool)
                                   or chunk_size < 1):
        raise ValueError(f"{fname}: chunk_size must be a positive int or None; got {chunk_size!r}")


class _ModeCache:
    """Output sizes per static signature, so ``mode="auto"`` evaluates ``f`` only on a new signature."""

    def __init__(self, maxsize=64):
        self.sizes, self.maxsize = {}, maxsize

    def output_shapes(self, t):
        """The shapes of ``f``'s outputs for this call's signature (one plain forward evaluation per signature)."""
        key = t.static_key()
        shapes = self.sizes.get(key) if key is not None else None
        if shapes is None:
            outputs = t.backend.evaluate(t.flat_f, t.leaves)
            if t.has_aux:
                outputs = outputs[0]
            shapes = tuple(t.backend.shape(o) for o in outputs)
            if key is not None:
                _remember(self.sizes, key, shapes, self.maxsize)
        return shapes

    def choose(self, t, per_example):
        """``"fwd"`` when the (per-example) inputs have fewer elements than the outputs, else ``"rev"``."""
        key = (t.static_key(), per_example, "mode")
        mode = self.sizes.get(key)
        if mode is None:
            n_out = sum(math.prod(s[1:] if per_example else s) for s in self.output_shapes(t))
            n_in = sum(math.prod(t.backend.shape(x)[1:] if per_example else t.backend.shape(x)) for x in t.leaves)
            mode = "fwd" if n_in < n_out else "rev"
            if key[0] is not None:
                _remember(self.sizes, key, mode, self.maxsize)
        return mode


def _finish_jacobian(t, outs, blocks, aux):
    return t.blocks_tree(blocks), t.aux(aux)


def _finish_jacobian_no_aux(t, outs, blocks, aux):
    return t.blocks_tree(blocks)


def _flatten_blocks(jac):
    return tuple(block for row in jac for block in row)


def _unflatten_blocks(blocks, n_in):
    return [blocks[i:i + n_in] for i in range(0, len(blocks), n_in)]


def jacobian(f: Callable, argnums=0, *, mode: str = "auto", chunk_size: int | None = None,
             has_aux: bool = False, backend=None, compile: bool = False, device=None) -> Callable:
    """The Jacobian of ``f`` with respect to ``args[argnums]``.

    Args:
      f: function returning an array or a pytree of arrays.
      argnums: int or tuple of ints.
      mode: ``"rev"`` (one VJP per output element, vectorised), ``"fwd"`` (one JVP per input
        element, vectorised) or ``"auto"``: forward when the inputs have fewer elements than the
        outputs, else reverse (decided once per input signature).
      chunk_size: at most this many basis vectors at a time, to bound memory.
      has_aux: return ``(jacobian, aux)``.
      backend: backend name or object.
      compile: one compiled program per static signature (``jax.jit``, ``tf.function``...).
      device: place the inputs on this device.

    Returns:
      A function; for an output of shape ``O`` and an input of shape ``I`` the block has shape
      ``O + I``; pytrees nest as the output's structure around the input's structure.

    Example:
      >>> unigrad.jacobian(lambda x: x ** 2)(np.arange(3.0))
      array([[0., 0., 0.],
             [0., 2., 0.],
             [0., 0., 4.]])
    """
    _check_mode(mode, "jacobian")
    _check_chunk(chunk_size, "jacobian")
    modes, protos = _ModeCache(), {}
    programs = {"rev": _Programs(keep_outputs=False), "fwd": _Programs(keep_outputs=False)} if compile else None

    def kernel_for(chosen):
        def kernel(b, flat_f, leaves):
            method = b.jacrev if chosen == "rev" else b.jacfwd
            outs, jac, aux = method(flat_f, leaves, chunk_size=chunk_size, has_aux=has_aux)
            return outs, _flatten_blocks(jac), aux
        return kernel

    kernels = {"rev": kernel_for("rev"), "fwd": kernel_for("fwd")}

    finish = _finish_jacobian if has_aux else _finish_jacobian_no_aux
    direct = _DirectCalls(backend, finish) if compile else None  # the mode is kept per signature

    def jacobian_f(*args):
        t = _Traced(f, args, argnums, has_aux, backend, "jacobian", device=device, protos=protos)
        chosen = mode if mode != "auto" else modes.choose(t, per_example=False)
        outs, blocks, aux = _execute(f, t, kernels[chosen], programs[chosen] if programs else None)
        if direct is not None:
            direct.remember(t, args, programs[chosen])
        return finish(t, outs, blocks, aux)

    jacobian_f = _direct_first(direct, jacobian_f)
    _wraps(jacobian_f, f, "jacobian")
    return jacobian_f


def jacrev(f: Callable, argnums=0, *, chunk_size=None, has_aux=False, backend=None, compile=False,
           device=None) -> Callable:
    """``jacobian(f, argnums, mode="rev")``: best when outputs have fewer elements than inputs."""
    return jacobian(f, argnums, mode="rev", chunk_size=chunk_size, has_aux=has_aux, backend=backend,
                    compile=compile, device=device)


def jacfwd(f: Callable, argnums=0, *, chunk_size=None, has_aux=False, backend=None, compile=False,
           device=None) -> Callable:
    """``jacobian(f, argnums, mode="fwd")``: best when inputs have fewer elements than outputs."""
    return jacobian(f, argnums, mode="fwd", chunk_size=chunk_size, has_aux=has_aux, backend=backend,
                    compile=compile, device=device)


_INDEPENDENCE = ("once", "always", "never")


def batched_jacobian(f: Callable, argnums=0, *, mode: str = "auto", chunk_size: int | None = None,
                     has_aux: bool = False, check_independence: str = "once", backend=None,
                     compile: bool = False, device=None) -> Callable:
    """Per-example Jacobians of ``f``, which maps a batch to a batch with independent rows.

    Every input and output has the batch on axis 0 (size B). The work is vectorised over B:
    the per-example Jacobians come from one sweep with a batch of cotangents (or tangents) the
    size of one example's output (or input), never from a Python loop over B.

    Args:
      f: function from batched arrays to batched arrays; row b of the output may depend only on
        row b of the inputs.
      argnums: int or tuple of ints.
      mode: ``"rev"``, ``"fwd"`` or ``"auto"`` (by per-example sizes).
      chunk_size: at most this many basis vectors at a time.
      has_aux: return ``(jacobians, aux)``.
      check_independence: ``"once"`` (default) probes, on the first call for each input signature,
        that the rows are independent -- one JVP with a random tangent on one example; ``"always"``
        probes on every call; ``"never"`` trusts the caller. A dependent ``f`` (batch norm,
        ``x - x.mean(0)``) raises ValueError instead of returning wrong Jacobians.
      backend: backend name or object.
      compile: one compiled program per static signature (``jax.jit``, ``tf.function``...).
      device: place the inputs on this device.

    Returns:
      A function; each block has shape ``(B, *out_shape[1:], *in_shape[1:])``.

    Example:
      >>> x = np.ones((4, 3))
      >>> unigrad.batched_jacobian(lambda x: x ** 2)(x).shape
      (4, 3, 3)
    """
    _check_mode(mode, "batched_jacobian")
    _check_chunk(chunk_size, "batched_jacobian")
    if check_independence not in _INDEPENDENCE:
        raise ValueError(f"batched_jacobian: check_independence must be one of {_INDEPENDENCE}; "
                         f"got {check_independence!r}")
    modes, protos = _ModeCache(), {}
    plans = {}  # signature -> (separable, mode): decided once per signature (the probes are not free)

    def kernel_for(chosen, separable):
        def kernel(b, flat_f, leaves):
            method = b.per_example_jacobian if separable else b.batched_jacobian
            outs, jac, aux = method(flat_f, leaves, mode=chosen, chunk_size=chunk_size, has_aux=has_aux)
            return outs, _flatten_blocks(jac), aux
        return kernel

    kernels = {(m, sep): kernel_for(m, sep) for m in ("rev", "fwd") for sep in (False, True)}
    programs = {key: _Programs(keep_outputs=False) for key in kernels} if compile else None

    def plan(t):
        """(mode, separable, batch size) for this call: decided once per signature (probes are not free)."""
        key = t.static_key()
        known = plans.get(key) if key is not None and check_independence != "always" else None
        if known is not None:
            return known
        batch = _batch_size(t.backend, t.leaves, t.names_fn, "batched_jacobian", "input")
        if batch == 0:
            return None, False, 0
        t.batch = batch
        # Separable: f may also be evaluated one example at a time, and a backend may vectorise that
        # (jax.vmap of a batch-of-one Jacobian). Only once the probe has confirmed it for this signature,
        # and never when a non-differentiated array could be batched too.
        separable, settled = False, True
        if check_independence != "never":
            settled = _probe_independence(t, batch, has_aux)  # not on abstract values: again next call
            separable = settled and not any(t.backend.shape(d)[:1] == (batch,) for d in t.dynamic) and \
                _probe_separable(t, batch, has_aux)
        known = (mode if mode != "auto" else modes.choose(t, per_example=True), separable, batch)
        if settled and key is not None:
            _remember(plans, key, known)
        return known

    finish = _finish_jacobian if has_aux else _finish_jacobian_no_aux
    direct = _DirectCalls(backend, finish) if compile and check_independence != "always" else None

    def batched_jacobian_f(*args):
        t = _Traced(f, args, argnums, has_aux, backend, "batched_jacobian", device=device, protos=protos)
        chosen, separable, t.batch = plan(t)
        if t.batch == 0:
            return _empty_batched_jacobian(t, has_aux)
        kernel = (chosen, separable)
        outs, blocks, aux = _execute(f, t, kernels[kernel], programs[kernel] if programs else None)
        if direct is not None and plans.get(t.static_key()) is not None:  # the plan is settled
            direct.remember(t, args, programs[kernel])
        return finish(t, outs, blocks, aux)

    batched_jacobian_f = _direct_first(direct, batched_jacobian_f)
    _wraps(batched_jacobian_f, f, "batched_jacobian")
    return batched_jacobian_f


def _batch_size(b, arrays, names_fn, fname, role, expected=None):
    sizes = set()
    for k, x in enumerate(arrays):
        shape = b.shape(x)
        if not shape:
            raise ValueError(f"{fname}: {names_fn()[k]} is 0-d; every {role} needs a leading batch axis")
        if expected is not None and shape[0] != expected:
            raise ValueError(f"{fname}: {names_fn()[k]} has batch size {shape[0]} (shape {shape}); expected "
                             f"{expected}, the inputs' batch size: f must map a batch to a batch")
        sizes.add(shape[0])
    if len(sizes) > 1:
        raise ValueError(f"{fname}: the inputs' leading (batch) axes differ: "
                         + ", ".join(f"{n} has {b.shape(x)[0]}" for n, x in zip(names_fn(), arrays)))
    return sizes.pop() if sizes else 0


def _empty_batched_jacobian(t, has_aux):
    """Batch size 0 (which torch's vmap and TensorFlow's batch_jacobian reject): f's output shapes from
    one evaluation, and empty blocks."""
    b = t.backend
    result = b.evaluate(t.flat_f, t.leaves)  # also checks that every output has batch size 0
    outputs, aux = (result if has_aux else (result, None))
    jac = tuple(tuple(b.zeros((0, *b.shape(o)[1:], *b.shape(x)[1:]), b.dtype(o), device=b.device(o))
                      for x in t.leaves) for o in outputs)
    out = t.jacobian_tree(jac)
    return (out, t.aux(tuple(b.stop_gradient(a) if b.is_array(a) else a for a in aux))) if has_aux else out


def _probe_independence(t, batch, has_aux=False, seed=0):
    """Raise ValueError if perturbing one example changes another example's outputs.

    Returns whether the probe could run (not when the values are abstract, inside jit or grad)."""
    if batch < 2:
        return True
    b = t.backend
    rng = np.random.default_rng(seed + batch)
    k = int(rng.integers(batch))
    tangents = []
    for x in t.leaves:
        shape = b.shape(x)
        v = np.zeros(shape, dtype=np.complex128 if b.dtype(x) in COMPLEX else np.float64)
        v[k] = rng.standard_normal(shape[1:])
        tangents.append(b.asarray(v, dtype=b.dtype(x), device=b.device(x)))
    outputs, tangents_out, _ = b.jvp(t.flat_f, t.leaves, tuple(tangents), has_aux=has_aux)
    try:
        probed = [np.abs(b.to_numpy(to)).astype(np.float64) for to in tangents_out]
    except Exception:  # abstract values inside another framework transform (jit, grad): nothing to read;
        return False   # the probe runs on the first concrete call instead
    for i, (o, d) in enumerate(zip(outputs, probed)):
        if d.ndim == 0 or d.shape[0] != batch:
            continue
        d = d.reshape(batch, -1).max(axis=1, initial=0.0)
        own, d[k] = d[k], 0.0
        j = int(np.argmax(d))
        eps = np.finfo(np.float64 if b.dtype(o) in ("float64", "complex128") else np.float32).eps
        if d[j] > 100 * eps * max(own, 1.0):
            raise ValueError(
                f"batched_jacobian: the rows of f are not independent: perturbing example {k} changes output "
                f"{i} of example {j} (|d out/d in| up to {d[j]:.3g}); per-example Jacobians would be wrong. "
                f"Use jacobian() for the full Jacobian (does f normalise over the batch, e.g. batch norm or "
                f"x - x.mean(0)?), or pass check_independence='never' if this is intended")
    return True


def _probe_separable(t, batch, has_aux, seed=0):
    """Does f give example k the same outputs alone (a batch of one) as inside the batch? (f may use
    its position in the batch, ``xp.arange(x.shape[0])``: then only whole-batch evaluation is right.)"""
    b = t.backend
    k = int(np.random.default_rng(seed + batch).integers(batch))
    whole = b.evaluate(t.flat_f, t.leaves)
    try:
        alone = b.evaluate(t.flat_f, tuple(x[k:k + 1] for x in t.leaves))
    except Exception:  # f needs the whole batch (fixed sizes, reshapes over it...): not separable
        return False
    if has_aux:
        whole, alone = whole[0], alone[0]
    for w, a in zip(whole, alone):
        # a batch of one may round differently (other BLAS kernels): compare to the dtype's precision
        rtol = 1e-10 if b.dtype(a) in ("float64", "complex128") else 1e-3
        w, a = b.to_numpy(w[k:k + 1]).astype(np.complex128), b.to_numpy(a).astype(np.complex128)
        if w.shape != a.shape or not np.all(np.abs(w - a) <= rtol * max(1.0, float(np.max(np.abs(w), initial=0)))):
            return False
    return True


def check_batch_independence(f: Callable, *args, argnums=0, backend=None, seed: int = 0) -> None:
    """Probe whether ``f``'s rows (axis 0) are independent; raise ValueError if not.

    One JVP with a random tangent on one example: any change to another example's outputs
    means ``batched_jacobian`` would be wrong for ``f``.
    """
    t = _Traced(f, args, argnums, False, backend, "check_batch_independence")
    batch = _batch_size(t.backend, t.leaves, t.names_fn, "check_batch_independence", "input")
    _probe_independence(t, batch, False, seed)


# ---------------------------------------------------------------------------------------------
# Second order
# ---------------------------------------------------------------------------------------------

def hessian(f: Callable, argnums=0, *, chunk_size: int | None = None, backend=None, compile: bool = False,
            device=None) -> Callable:
    """The Hessian of ``f`` (forward over reverse: ``jacfwd(jacrev(f))``).

    Args:
      f: function; for a scalar output the result is ``H[j][k]`` of shape ``in_j + in_k``;
        for a non-scalar output of shape ``O`` the blocks have shape ``O + in_j + in_k``.
      argnums: int or tuple of ints.
      chunk_size: bound on the tangents pushed at a time.
      backend: backend name or object.
      compile: one compiled program per static signature.
      device: place the inputs on this device.

    Example:
      >>> unigrad.hessian(lambda x: (x ** 3).sum())(np.array([1.0, 2.0]))
      array([[ 6.,  0.],
             [ 0., 12.]])
    """
    _check_chunk(chunk_size, "hessian")
    programs = {True: _Programs(keep_outputs=False), False: _Programs(keep_outputs=False)} if compile else None
    shapes, protos = _ModeCache(), {}

    def nested(b, flat_f, leaves):
        def gradient(*p):  # the outputs ride along as aux: no value escapes the transform by side effect
            outs, jac, _ = b.jacrev(flat_f, p)
            return _flatten_blocks(jac), tuple(b.stop_gradient(o) for o in outs)

        _, jac2, outputs = b.jacfwd(gradient, leaves, chunk_size=chunk_size, has_aux=True)
        return tuple(outputs), _flatten_blocks(jac2), ()

    def scalar(b, flat_f, leaves):  # the backend's own Hessian (its fastest form: nested tapes on TensorFlow)
        return (), _flatten_blocks(b.hessian(flat_f, leaves, chunk_size=chunk_size)), ()

    def hessian_f(*args):
        t = _Traced(f, args, argnums, False, backend, "hessian", device=device, protos=protos)
        is_scalar = shapes.output_shapes(t) == ((),)
        _, blocks, _ = _execute(f, t, scalar if is_scalar else nested,
                                programs[is_scalar] if programs else None)
        # blocks, in order: output i, input j, input k -> d/d in_k of (d out_i / d in_j)
        n = len(t.leaves)
        n_out = len(blocks) // (n * n)
        return t.output([t.inputs_like([t.inputs_like(list(blocks[(i * n + j) * n:(i * n + j + 1) * n]))
                                        for j in range(n)]) for i in range(n_out)])

    _wraps(hessian_f, f, "hessian")
    return hessian_f


def hvp(f: Callable, primals, tangents, backend=None):
    """Hessian-vector product of a scalar-valued ``f`` at ``primals`` along ``tangents``.

    Forward over reverse: the cost of a few gradients, never the Hessian.

    Args:
      f: function of ``len(primals)`` arguments returning a real scalar.
      primals: tuple of arguments (pytrees allowed).
      tangents: same structure, shapes and dtypes.
      backend: backend name or object.

    Returns:
      A tuple, one entry per primal, shaped like the primal: ``H @ tangents``.

    Example:
      >>> unigrad.hvp(lambda x: (x ** 3).sum(), (np.array([1.0, 2.0]),), (np.ones(2),))
      (array([ 6., 12.]),)
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError("hvp: primals and tangents must be tuples or lists")
    t = _Traced(f, tuple(primals), None, False, backend, "hvp", all_args=True, protos=_PRIMAL_PROTOS)
    b = t.backend
    tan_leaves = _tangent_leaves(t, tangents, "hvp")
    outputs = b.evaluate(t.flat_f, t.leaves)
    _scalar_check(b, outputs, "hvp")
    return t.inputs_like(b.hvp(t.flat_f, t.leaves, tan_leaves))


# ---------------------------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------------------------

def vmap(f: Callable, in_axes=0, out_axes: int = 0, *, chunk_size: int | None = None,
         backend=None) -> Callable:
    """Map ``f`` over an axis of its arguments.

    Args:
      f: function of arrays.
      in_axes: int, None, or a tuple with one entry (int, None or a pytree prefix) per positional
        argument: the mapped axis of each, None for unmapped.
      out_axes: the axis of the outputs that holds the map.
      chunk_size: map at most this many at a time (bounds memory).
      backend: backend name or object.

    Example:
      >>> unigrad.vmap(lambda x: (x ** 2).sum())(np.ones((4, 3)))
      array([3., 3., 3., 3.])
    """
    _check_chunk(chunk_size, "vmap")
    if not isinstance(out_axes, int) or isinstance(out_axes, bool):
        raise TypeError(f"vmap: out_axes must be an int; got {out_axes!r}")

    def vmapped(*args):
        if isinstance(in_axes, (tuple, list)):
            if len(in_axes) != len(args):
                raise ValueError(f"vmap: in_axes has {len(in_axes)} entries but the function was called with "
                                 f"{len(args)} positional arguments")
            prefix = tuple(in_axes)
        else:
            prefix = (in_axes,) * len(args)
        leaves, treedef = optree.tree_flatten(tuple(args), none_is_leaf=False)
        axes = optree.broadcast_prefix(prefix, tuple(args), none_is_leaf=True)
        b = _registry.resolve(backend, leaves)
        leaves = [_convert(b, x, "vmap argument") for x in leaves]
        flat_axes = []
        size = None
        for x, ax in zip(leaves, axes):
            if ax is None:
                flat_axes.append(None)
                continue
            nd = len(b.shape(x))
            if not isinstance(ax, int) or not -nd <= ax < max(nd, 1) or nd == 0:
                raise ValueError(f"vmap: in_axes entry {ax!r} is out of range for an argument of shape "
                                 f"{b.shape(x)}")
            ax %= nd
            flat_axes.append(ax)
            if size is None:
                size = b.shape(x)[ax]
            elif b.shape(x)[ax] != size:
                raise ValueError(f"vmap: mapped axes have different sizes ({size} and {b.shape(x)[ax]})")
        if size is None:
            raise ValueError("vmap: at least one argument must be mapped (in_axes are all None)")
        store = {}

        def flat_f(*xs):
            result = f(*optree.tree_unflatten(treedef, list(xs)))
            out_leaves, store["tree"] = optree.tree_flatten(result)
            return tuple(out_leaves)

        outs = b.vmap(flat_f, flat_axes, out_axes, chunk_size)(*leaves)
        return optree.tree_unflatten(store["tree"], list(outs))

    _wraps(vmapped, f, "vmap")
    return vmapped


# ---------------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------------

def namespace(*arrays):
    """The Array API namespace for ``arrays`` (NumPy arrays and scalars: the tape's namespace).

    Example:
      >>> def loss(w, x):
      ...     xp = unigrad.namespace(w, x)
      ...     return xp.sum(xp.tanh(x @ w) ** 2)
    """
    active = _registry.active_backend.get()
    if active is not None:  # inside a transform: its backend's namespace, if the arrays are its own
        own = False
        for x in arrays:
            if active.is_array(x):
                own = True
            elif not isinstance(x, _PY_SCALARS):
                break
        else:
            if own:
                return active.namespace()
    owner = None
    for x in arrays:
        name = _registry._array_owner(x)
        if name is not None:
            if owner is not None and owner != name:
                raise TypeError(f"namespace: arrays of backends {owner!r} and {name!r} are mixed")
            owner = name
    return _registry.get_backend(owner or _registry.DEFAULT).namespace()


def asarray(x, backend=None, dtype=None, device=None):
    """``x`` as an array of ``backend`` (default: by selection order), dtype kept unless given.

    Args:
      x: NumPy array, Python scalar or nested list, or another backend's array.
      backend: backend name or object.
      dtype: dtype name (``"float32"``) or the backend's dtype object.
      device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu"``.
    """
    b = _registry.resolve(backend, [x])
    if not b.is_array(x):
        owner = _registry._array_owner(x)
        x = _registry.get_backend(owner).to_numpy(x) if owner else np.asarray(x)
    if dtype is not None and not isinstance(dtype, str):
        dtype = dtype_name(dtype)
    return b.asarray(x, dtype=dtype, device=device)


def to_numpy(x) -> np.ndarray:
    """A NumPy array with the values of any backend's array (or a pytree of them)."""
    def one(v):
        if isinstance(v, np.ndarray):
            return v
        owner = _registry._array_owner(v)
        if owner is None:
            return np.asarray(v)
        return _registry.get_backend(owner).to_numpy(v)
    return optree.tree_map(one, x)


def _wraps(wrapper, f, kind):
    name = getattr(f, "__name__", type(f).__name__)
    wrapper.__name__ = f"{kind}({name})"
    wrapper.__qualname__ = wrapper.__name__
    wrapper.__doc__ = getattr(f, "__doc__", None)
    wrapper.__wrapped__ = f
