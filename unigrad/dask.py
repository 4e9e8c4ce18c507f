"""Per-example transforms over Dask arrays: out of core, and on a cluster.

``unigrad.dask.batched_jacobian``, ``unigrad.dask.vmap`` and ``unigrad.dask.per_example_grad`` take
Dask arrays chunked along the batch axis (axis 0) and return Dask arrays: nothing is computed until
the result is. Each block of examples is evaluated on a worker by the ordinary in-memory transform
(any backend; ``backend=`` and ``compile=`` are passed through), and the results equal the in-memory
results on the same data.

What travels:
  * the function, its options and the arguments that are not batched (parameters) form one task of
    the graph, so each worker receives them once, not once per block;
  * each block task reads one block of examples and returns one block of results.

Each worker process builds the in-memory transform once per ``unigrad.dask`` transform (a small,
bounded cache keyed by the transform's id), so a compiled program (``compile=True``) is built once
per block shape on each worker and reused for every block of that shape.

``import unigrad`` does not import this module's dependencies: ``import unigrad.dask`` does not
import dask either; the transforms import it when called. Install with ``pip install unigrad[dask]``.

Example:
  >>> import dask.array as da, numpy as np, unigrad.dask
  >>> X = da.from_array(np.random.rand(10_000, 8), chunks=2_500)   # or unigrad.dask.from_memmap(...)
  >>> W = np.random.rand(8, 3)
  >>> J = unigrad.dask.batched_jacobian(lambda x, w: unigrad.namespace(x).tanh(x @ w))(X, W)
  >>> J.shape, J.chunks[0]                                          # a Dask array, not yet computed
  ((10000, 3, 8), (2500, 2500, 2500, 2500))
"""

from __future__ import annotations

import collections
import threading
import uuid
from typing import Callable

import numpy as np
import optree

from ._caches import CacheKind
from ._checks import _is_lazy, _reject_lazy  # noqa: F401 (the guard of the in-memory transforms, one floor down)
from ._pystate import python_state

__all__ = ["batched_jacobian", "vmap", "per_example_grad", "from_memmap"]



# ---------------------------------------------------------------------------------------------
# Lazy arrays given to the in-memory transforms
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# Worker side: one in-memory transform per unigrad.dask transform and worker process
# ---------------------------------------------------------------------------------------------

class _Spec:
    """What every block task of one call shares: the transform's id, how to build it, and the
    arguments that are not batched. One task of the graph, sent to each worker once."""

    __slots__ = ("token", "kind", "f", "options", "treedef", "leaves", "batched_at")

    def __init__(self, token, kind, f, options, treedef, leaves, batched_at):
        self.token, self.kind, self.f, self.options = token, kind, f, options
        self.treedef, self.leaves, self.batched_at = treedef, leaves, batched_at

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __setstate__(self, state):
        for s, v in zip(self.__slots__, state):
            setattr(self, s, v)
        with _cache_lock:
            _received[self.token] += 1


_cache_lock = threading.Lock()
_cache: collections.OrderedDict = collections.OrderedDict()  # token -> in-memory transform (this process)
_CACHE_SIZE = 32
_builds = collections.Counter()  # token -> transforms built in this process (read by the tests)
_received = collections.Counter()  # token -> specs unpickled in this process (read by the tests)


def _in_memory(kind, f, options):
    """The in-memory transform that ``kind`` stands for."""
    import unigrad

    options = dict(options)
    if kind == "batched_jacobian":
        argnums = options.pop("argnums")
        return unigrad.batched_jacobian(f, argnums, **options)
    if kind == "vmap":
        in_axes = options.pop("in_axes")
        return unigrad.vmap(f, in_axes, **options)
    # per_example_grad: vmap(grad); backend= for both, chunk_size for vmap, the rest for grad
    in_axes, chunk_size, backend = options.pop("in_axes"), options.pop("chunk_size"), options.get("backend")
    argnums = options.pop("argnums")
    return unigrad.vmap(unigrad.grad(f, argnums, **options), in_axes, chunk_size=chunk_size, backend=backend)


def _transform(spec):
    """This process's in-memory transform for ``spec`` (built on first use; bounded, least recently used out)."""
    with _cache_lock:
        t = _cache.get(spec.token)
        if t is not None:
            _cache.move_to_end(spec.token)
            return t
    t = _in_memory(spec.kind, spec.f, spec.options)
    with _cache_lock:
        if spec.token not in _cache:  # another thread of this worker may have built it meanwhile
            _cache[spec.token] = t
            _builds[spec.token] += 1
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return _cache[spec.token]


def _run_block(spec, *blocks):
    """Evaluate one block of examples: the in-memory transform on the block's arguments; NumPy leaves out."""
    import unigrad

    leaves = list(spec.leaves)
    for k, block in zip(spec.batched_at, blocks):
        leaves[k] = block
    args = optree.tree_unflatten(spec.treedef, leaves)
    out = _transform(spec)(*args)
    return tuple(np.asarray(unigrad.to_numpy(leaf)) for leaf in optree.tree_leaves(out))


def _pick(results, j):
    return results[j]


def _builds_here():
    """{token: number of in-memory transforms built} in this process (for the tests, via ``Client.run``)."""
    with _cache_lock:
        return dict(_builds)


def _received_here():
    """{token: number of specs (f, options, parameters) unpickled} in this process (for the tests)."""
    with _cache_lock:
        return dict(_received)


# ---------------------------------------------------------------------------------------------
# Client side
# ---------------------------------------------------------------------------------------------

def _import_dask():
    try:
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("unigrad.dask needs dask: pip install 'unigrad[dask]'") from e
    return da, HighLevelGraph


PROBES = CacheKind("unigrad.dask", "output specs", ("state",),
                   "f run on stand-in values on the client (the output graph's shapes and dtypes), as it reads its "
                   "Python state now")
WORKERS = CacheKind("unigrad.dask", "in-memory transforms on the workers", ("state",),
                    "a worker builds one in-memory transform per token from the f it received; an f pickled for a "
                    "call carries the values it read then, so the token holds a hash of f's Python state")


class _Transform:
    """A ``unigrad.dask`` transform: a function of Dask arrays returning Dask arrays (see the module doc)."""

    def __init__(self, kind, f, options, batched_of):
        self.kind, self.f, self.options = kind, f, options
        # batched_of(args, treedef, leaves) -> the flat indices (none_is_leaf=True) of the batched leaves
        self._batched_of = batched_of
        self.token = f"{kind}-{uuid.uuid4().hex}"  # the workers' cache key for this transform (see _call)
        self._probes = {}  # PROBES key -> (output treedef, [(shape after the batch axis, dtype)])
        name = getattr(f, "__name__", type(f).__name__)
        self.__name__ = self.__qualname__ = f"unigrad.dask.{kind}({name})"
        self.__doc__ = getattr(f, "__doc__", None)
        self.__wrapped__ = f

    def __call__(self, *args):
        return self._call(args, self.options, self.token)

    def _call(self, args, options, token):
        da, HighLevelGraph = _import_dask()
        # A worker keeps the in-memory transform it built from the first f it received for a token; an f
        # pickled now carries the values it reads now: a new Python state is a new token (WORKERS)
        state = python_state(self.f)
        token = f"{token}-{hash(WORKERS.key_of(token, self.f, state=state)) & 0xFFFFFFFFFFFFFFFF:016x}"
        leaves, treedef = optree.tree_flatten(args, none_is_leaf=True)
        paths = optree.tree_paths(args, none_is_leaf=True)
        names = [f"argument {p[0]}" + "".join(f"[{q!r}]" for q in p[1:]) for p in paths]
        batched = sorted(self._batched_of(args, treedef, leaves))
        fname = f"unigrad.dask.{self.kind}"
        if not batched:
            raise ValueError(f"{fname}: no argument is batched; give the examples as a Dask array chunked "
                             f"along axis 0")
        dask_at = [k for k in batched if isinstance(leaves[k], da.Array) and leaves[k].ndim > 0]
        if not dask_at:
            raise TypeError(f"{fname}: no batched argument is a Dask array with a batch axis; give the examples as "
                            f"a Dask array chunked along axis 0 (its chunks are the blocks)")
        reference = (dask_at[0], leaves[dask_at[0]].shape[0], leaves[dask_at[0]].chunks[0])
        for k in batched:
            x = leaves[k]
            if not isinstance(x, da.Array):
                if _is_lazy(x):
                    raise TypeError(f"{fname}: {names[k]} is a {type(x).__name__}; a batched argument must be a "
                                    f"Dask array or an in-memory array")
                x = np.asarray(x)
            if x.ndim == 0:
                raise ValueError(f"{fname}: {names[k]} is batched but has shape {x.shape}; a batched argument "
                                 f"needs a batch axis (axis 0)")
            if x.shape[0] != reference[1]:
                raise ValueError(f"{fname}: {names[k]} has {x.shape[0]} examples (shape {x.shape}) but "
                                 f"{names[reference[0]]} has {reference[1]}")
            wanted = (reference[2],) + tuple((s,) for s in x.shape[1:])  # one chunk beyond the batch axis
            if not isinstance(x, da.Array):  # a batched in-memory array: blocked like the Dask ones
                x = da.from_array(x, chunks=wanted)
            elif x.chunks != wanted:
                x = x.rechunk(wanted)
            leaves[k] = x
        for k, x in enumerate(leaves):
            if k not in batched and _is_lazy(x):
                raise TypeError(f"{fname}: {names[k]} is a Dask collection but is not mapped; compute it first "
                                f"(shared arguments such as parameters are sent to each worker once)")
        chunks0 = reference[2]
        out_tree, out_specs = self._probe(args, treedef, leaves, batched, options, state)

        spec = _Spec(token, self.kind, self.f, options, treedef,
                     tuple(None if k in batched else x for k, x in enumerate(leaves)), tuple(batched))
        call = uuid.uuid4().hex
        name = f"unigrad-{self.kind}-{call}"
        spec_key = f"unigrad-spec-{call}"
        inputs = [leaves[k] for k in batched]
        layer = {spec_key: spec}
        for i in range(len(chunks0)):
            layer[(name, i)] = (_run_block, spec_key, *[(x.name, i) + (0,) * (x.ndim - 1) for x in inputs])
        graph = HighLevelGraph.merge(*[x.__dask_graph__() for x in inputs])
        layers, dependencies = dict(graph.layers), dict(graph.dependencies)
        layers[name], dependencies[name] = layer, {x.name for x in inputs}
        outputs = []
        for j, (shape, dtype) in enumerate(out_specs):
            out_name = f"{name}-{j}"
            pick = {(out_name, i) + (0,) * len(shape): (_pick, (name, i), j) for i in range(len(chunks0))}
            out_graph = HighLevelGraph({**layers, out_name: pick}, {**dependencies, out_name: {name}})
            chunks = (chunks0,) + tuple((s,) for s in shape)
            outputs.append(da.Array(out_graph, out_name, chunks,
                                    meta=np.empty((0,) * (len(shape) + 1), dtype=dtype)))
        return optree.tree_unflatten(out_tree, outputs)

    def _probe(self, args, treedef, leaves, batched, options, state):
        """The output's structure, and each output leaf's shape past the batch axis and dtype.

        ``batched_jacobian`` runs the in-memory transform on a batch of no examples (no values are read);
        ``vmap`` and ``per_example_grad`` on one example of zeros (Dask's own meta inference also calls
        functions on stand-in values). Once per signature, on the client, never compiled.
        """
        sig = tuple((k, tuple(leaves[k].shape[1:]), str(leaves[k].dtype)) for k in batched)
        shared_sig = tuple((type(x).__name__, getattr(x, "shape", None), str(getattr(x, "dtype", "")))
                           for k, x in enumerate(leaves) if k not in batched)
        try:
            key = PROBES.key_of((treedef, sig, shared_sig, repr(options.get("in_axes"))), self.f, state=state)
            known = self._probes.get(key)
        except TypeError:
            known, key = None, None
        if known is not None:
            return known
        n = 0 if self.kind == "batched_jacobian" else 1
        stand_in = list(leaves)
        for k in batched:
            stand_in[k] = np.zeros((n,) + tuple(leaves[k].shape[1:]), dtype=leaves[k].dtype)
        options = dict(options)
        if "compile" in options:
            options["compile"] = False
        import unigrad

        out = _in_memory(self.kind, self.f, options)(*optree.tree_unflatten(treedef, stand_in))
        out_leaves, out_tree = optree.tree_flatten(out, none_is_leaf=True)
        specs = []
        for j, leaf in enumerate(out_leaves):
            value = np.asarray(unigrad.to_numpy(leaf)) if leaf is not None else None
            if value is None or value.ndim == 0 or value.shape[0] != n:
                raise ValueError(f"unigrad.dask.{self.kind}: output leaf {j} has shape "
                                 f"{None if value is None else value.shape} on a batch of {n}; every output "
                                 f"(aux included) must have the batch on axis 0")
            specs.append((value.shape[1:], value.dtype))
        known = (out_tree, specs)
        if key is not None:
            if len(self._probes) >= 16:
                self._probes.pop(next(iter(self._probes)))
            self._probes[key] = known
        return known


def _lazy_leaves(args, treedef, leaves):
    return {k for k, x in enumerate(leaves) if _is_lazy(x)}


def _leaves_of_positions(args, positions):
    """Flat leaf indices (none_is_leaf=True) of the positional arguments at ``positions``."""
    out, start = set(), 0
    for i, a in enumerate(args):
        n = optree.tree_structure(a, none_is_leaf=True).num_leaves
        if i in positions:
            out.update(range(start, start + n))
        start += n
    return out


def _mapped_by_in_axes(in_axes, fname):
    """in_axes -> batched_of; None: the Dask arrays are mapped (axis 0), everything else is shared."""
    if in_axes is None:
        return _lazy_leaves
    entries = in_axes if isinstance(in_axes, (tuple, list)) else None
    if entries is None and in_axes != 0:
        raise ValueError(f"{fname}: in_axes must be None (map the Dask arrays), 0, or a tuple of 0 and None "
                         f"per positional argument; got {in_axes!r} (blocks are taken along axis 0 only)")
    for e in entries or ():
        if e is not None and e != 0:
            raise ValueError(f"{fname}: in_axes entries must be 0 or None; got {in_axes!r} "
                             f"(blocks are taken along axis 0 only: move the axis first)")

    def batched_of(args, treedef, leaves):
        if entries is None:
            return set(range(len(leaves)))
        if len(entries) != len(args):
            raise ValueError(f"{fname}: in_axes has {len(entries)} entries but the function was called with "
                             f"{len(args)} positional arguments")
        return _leaves_of_positions(args, {i for i, e in enumerate(entries) if e == 0})
    return batched_of


def _in_axes_for(args, batched, treedef):
    """The in-memory vmap's in_axes (one entry per positional argument) for these batched leaves."""
    axes, start = [], 0
    for a in args:
        n = optree.tree_structure(a, none_is_leaf=True).num_leaves
        mine = [k in batched for k in range(start, start + n)]
        if all(mine) and n:
            axes.append(0)
        elif not any(mine):
            axes.append(None)
        else:  # a pytree with batched and shared leaves: a prefix tree of 0 and None
            sub = iter(mine)
            axes.append(optree.tree_map(lambda _: 0 if next(sub) else None, a, none_is_leaf=True))
        start += n
    return tuple(axes)


class _Mapped(_Transform):
    """vmap and per_example_grad: the in-memory vmap's in_axes follow the batched leaves of each call."""

    def __call__(self, *args):
        leaves, treedef = optree.tree_flatten(args, none_is_leaf=True)
        in_axes = _in_axes_for(args, self._batched_of(args, treedef, leaves), treedef)
        # the workers keep one in-memory transform per in_axes (a new pattern of batched arguments)
        return self._call(args, dict(self.options, in_axes=in_axes), f"{self.token}-{in_axes!r}")


def batched_jacobian(f: Callable, argnums=0, **kwargs) -> Callable:
    """``unigrad.batched_jacobian`` over Dask arrays chunked along the batch axis, block by block.

    Args:
      f: as for :func:`unigrad.batched_jacobian` (a batch in, a batch out, rows independent).
      argnums: int or tuple of ints: which positional arguments to differentiate; they are batched.
      **kwargs: passed to :func:`unigrad.batched_jacobian` on each worker (``mode``, ``chunk_size``,
        ``check_independence``, ``backend``, ``compile``, ``device``...).

    Returns:
      A function of the same arguments. Dask arrays and the differentiated arguments are batched (split
      into the Dask arrays' blocks along axis 0; other axes are rechunked to one chunk); any other
      argument (parameters) is sent to each worker once. It returns Dask arrays (NumPy blocks) with the
      structure and values of the in-memory result: blocks of shape ``(b, *out_shape[1:], *in_shape[1:])``.

    Example:
      >>> J = unigrad.dask.batched_jacobian(model, argnums=0)(X_dask, params)   # lazy  # doctest: +SKIP
      >>> J.sum(axis=0).compute()                                              # doctest: +SKIP
    """
    if not isinstance(argnums, (int, tuple)) or isinstance(argnums, bool):
        raise TypeError(f"unigrad.dask.batched_jacobian: argnums must be an int or a tuple of ints; got {argnums!r}")
    positions = argnums if isinstance(argnums, tuple) else (argnums,)

    def batched_of(args, treedef, leaves):
        pos = {p % len(args) for p in positions if -len(args) <= p < len(args)}
        return _lazy_leaves(args, treedef, leaves) | _leaves_of_positions(args, pos)

    return _Transform("batched_jacobian", f, dict(kwargs, argnums=argnums), batched_of)


def vmap(f: Callable, in_axes=None, **kwargs) -> Callable:
    """``unigrad.vmap`` over Dask arrays chunked along the mapped axis (axis 0), block by block.

    Args:
      f: a function of one example's arguments.
      in_axes: None (default): every Dask array is mapped along axis 0 and every other argument is
        shared (sent to each worker once); or 0, or a tuple of 0 / None per positional argument as in
        :func:`unigrad.vmap` (an in-memory array marked 0 is split into the same blocks).
      **kwargs: passed to :func:`unigrad.vmap` on each worker (``chunk_size``, ``backend``).

    Returns:
      A function returning Dask arrays: every output leaf has the examples on axis 0.
    """
    if "out_axes" in kwargs and kwargs["out_axes"] != 0:
        raise ValueError("unigrad.dask.vmap: out_axes must be 0 (results are blocked along axis 0)")
    kwargs.pop("out_axes", None)
    return _Mapped("vmap", f, dict(kwargs, in_axes=None), _mapped_by_in_axes(in_axes, "unigrad.dask.vmap"))


def per_example_grad(f: Callable, argnums=0, *, in_axes=None, chunk_size=None, **kwargs) -> Callable:
    """Per-example gradients, ``vmap(grad(f, argnums))``, over Dask arrays chunked along axis 0.

    Args:
      f: the loss of one example, a real scalar: typically ``f(params, x, y)``.
      argnums: which positional arguments to differentiate (usually the parameters, which are shared).
      in_axes: None (default): the Dask arrays are mapped, the rest shared; or as in :func:`vmap`.
      chunk_size: passed to the in-memory vmap.
      **kwargs: passed to :func:`unigrad.grad` on each worker (``has_aux``, ``backend``, ``compile``...).

    Returns:
      A function returning Dask arrays: the gradient for each example, shaped like the differentiated
      arguments with the examples on axis 0.

    Example:
      >>> G = unigrad.dask.per_example_grad(loss)(params, X_dask, y_dask)  # (N, *params.shape)  # doctest: +SKIP
    """
    return _Mapped("per_example_grad", f, dict(kwargs, argnums=argnums, in_axes=None, chunk_size=chunk_size),
                   _mapped_by_in_axes(in_axes, "unigrad.dask.per_example_grad"))


# ---------------------------------------------------------------------------------------------
# Data on disk
# ---------------------------------------------------------------------------------------------

class _MemmapSource:
    """A file read by slices: each ``[...]`` maps the file, copies the slice out and unmaps it.

    Unlike an ``np.memmap`` (which pickles as its whole contents), it pickles as its path, so a graph
    reading it stays small; the pages read are not kept mapped (they do not stay in the worker's RSS).
    """

    def __init__(self, path, shape, dtype, offset, order):
        self.path, self.shape, self.dtype, self.offset, self.order = str(path), tuple(shape), np.dtype(dtype), \
            offset, order
        self.ndim = len(self.shape)

    def __getitem__(self, index):
        m = np.memmap(self.path, dtype=self.dtype, mode="r", shape=self.shape, offset=self.offset, order=self.order)
        try:
            return np.array(m[index])
        finally:
            del m


def from_memmap(path, shape=None, dtype=None, *, chunks, offset: int = 0, order: str = "C"):
    """A Dask array reading a binary file (raw, or ``.npy``) block by block.

    Args:
      path: a ``.npy`` file (shape, dtype and offset read from its header when not given) or a raw file.
      shape, dtype: the array's shape and dtype (required for a raw file).
      chunks: Dask chunks; for the transforms here, examples per block along axis 0 (an int is fine).
      offset: bytes before the data in a raw file.
      order: ``"C"`` or ``"F"``.

    Returns:
      A Dask array whose tasks open the file themselves: the graph carries the path, not the data.
    """
    da, _ = _import_dask()
    path = str(path)
    if shape is None or dtype is None:
        if not path.endswith(".npy"):
            raise ValueError("from_memmap: shape and dtype are required for a file that is not .npy")
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                    else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read(fh)
            offset, order = fh.tell(), ("F" if fortran else "C")
    if isinstance(chunks, int):
        chunks = (chunks,) + tuple(shape[1:])
    source = _MemmapSource(path, shape, dtype, offset, order)
    return da.from_array(source, chunks=chunks, name=f"unigrad-memmap-{uuid.uuid4().hex}", asarray=False,
                         meta=np.empty((0,) * len(shape), dtype=dtype))
