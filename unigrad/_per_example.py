"""Per-example gradients with respect to shared parameters, and their norms.

``per_example_grad(f)(params, batch)`` is row i of the Jacobian of ``f``'s per-example losses with
respect to the parameters: ``d f(params, batch)[i] / d params``. Two ways to get it:

* **Materialised** (every backend): the Jacobian rows themselves, ``jacrev`` of the loss vector
  (vectorised over the examples' unit cotangents: a batch of cotangents on the tape, ``vmap`` of the
  VJP on torch and JAX, ``pfor`` on TensorFlow). Exact for any ``f``; it costs about B backward
  passes of the batch.
* **Dense layers** (the tape; JAX in ``_per_example_jaxpr.py``, torch in ``_per_example_torch.py``,
  TensorFlow in ``_per_example_tf.py``, the same method on their programs, the formulas shared in
  ``_per_example_common.py``): ``f`` is recorded once, and each parameter whose one use is a matrix
  product ``Y = X @ W`` (``W`` directly or through a transpose) or a bias ``Y = Z + b`` (or a scale
  ``Z * s``) gets its rows from one ordinary backward pass: with ``G`` the cotangent of ``Y`` for the
  cotangent ``ones(B)``, example i's gradient is ``X_i^T G_i`` (``G_i`` summed over the bias's
  broadcast axes). That is exact when row i of the losses depends on ``Y`` through ``Y_i`` alone,
  which is *proved* from the recorded program (:mod:`unigrad.dependence`, the one analysis of
  traced programs: every operation from ``Y`` to the losses keeps rows apart); where the proof
  fails, or the parameter is used another way, that parameter is materialised. Norms of dense layers never form ``X_i^T G_i``: for one position
  per example its squared norm is ``|x_i|^2 |g_i|^2`` (Goodfellow 2015), for P positions
  ``sum((X_i X_i^T) * (G_i G_i^T))`` when ``P^2`` is below the layer's size ("ghost clipping",
  Li et al. 2022).

Which way each parameter took is kept on the returned function as ``.paths`` (its last call).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import _checks
from . import _per_example_common as _common
from . import _per_example_jaxpr as _jaxpr
from . import _per_example_tf as _tf
from . import _per_example_torch as _torch
from ._per_example_common import (BIAS, CONV, CONV_GHOST, DENSE, DENSE_GHOST, DENSE_OUTER,  # noqa: F401
                                  EMBEDDING, EMBEDDING_GHOST, MATERIALISED, NORM, SCALE, SHARED, SHARED_SUMMED)
from ._per_example_common import check_losses as _check_losses
from ._caches import BoundedCache, CacheKind
from ._call import PLANS_WHY, PROGRAMS_WHY, execute, prepare
from ._custom import custom_rules_seen
from ._transform import _wraps, promoted_blocks
from .backend import uses_traced_value

__all__ = ["per_example_grad", "per_example_grad_norms"]


def _kinds(fname):
    """What a per-example transform keeps, and what each entry depends on (unigrad._caches)."""
    return {
        "plans": CacheKind(fname, "plans", why=PLANS_WHY),
        "programs": CacheKind(fname, "compiled programs", why=PROGRAMS_WHY, program=True),
        "graphs": CacheKind(fname, "eager TensorFlow programs", ("state",),
                            "an eager call on TensorFlow runs one graph traced per signature (its pfor would trace "
                            "one on every call): a trace freezes f's Python state, which an eager call must see as "
                            "it is now", program=True),
        "untraceable": CacheKind(fname, "eager TensorFlow f that cannot be traced", ("state",),
                                 "whether f could be traced into a graph, as it reads its Python state now", program=True),
        "paths": CacheKind(fname, "paths of a traced program",
                           why="which way each parameter took (.paths), read when a program was traced: kept under the "
                               "key of that program (built by its own kind: compiled programs, eager TensorFlow "
                               "programs)", program=True),
        "analyses": CacheKind(fname, "torch analyses of a recorded program",
                              why="keyed by the recorded program itself (its operations, data flow, shapes, dtypes "
                                  "and literal arguments; f runs and is recorded on every call)"),
    }


_KINDS = {fname: _kinds(fname) for fname in ("per_example_grad", "per_example_grad_norms")}



def per_example_grad(f: Callable, argnums=0, batch_argnum=1, *, backend=None, compile: bool = False,
                     device=None) -> Callable:
    """Per-example gradients of ``f``'s per-example losses with respect to shared parameters.

    ``f(*args)`` runs on the whole batch and returns one loss per example, shape ``(B,)``, where B is
    the leading axis of every array in ``args[batch_argnum]``. Example i's gradient is
    ``d f(*args)[i] / d args[argnums]``: row i of the Jacobian of the losses. When the losses are
    computed example by example (``f(params, x)[i] == loss(params, x[i])``) this is exactly
    ``vmap(grad(loss), in_axes=(None, 0))(params, x)``, computed without a Python loop over examples.
    A scalar loss (summed or averaged over the batch) is refused: its split into examples is not
    defined by its value; return the per-example losses instead (drop the final sum or mean).
    (``unigrad.dask.per_example_grad``, over Dask arrays, takes the loss of *one* example and maps
    it; a loss written for one example that also works on a batch gives the same values here.)

    On the NumPy tape, JAX, torch and TensorFlow, parameters used by dense layers (``x @ W``,
    ``x @ W.T``, ``+ b``, ``* s``; ``nn.Linear`` on torch, ``tf.matmul``/``tf.nn.bias_add`` on
    TensorFlow; on torch also convolutions, embeddings, LayerNorm's and GroupNorm's scale and shift,
    attention's projections, a weight used several times) get their rows from one ordinary backward
    pass, where the program proves that rows of the losses stay apart after the layer; others are
    materialised as Jacobian rows (about B backward passes; every parameter on plugins). The returned
    function's ``.paths`` maps each parameter leaf to the way it took on the last call.

    Args:
      f: ``f(*args)`` returning the per-example losses, a real array of shape ``(B,)``.
      argnums: int or tuple of ints: the parameters (pytrees allowed), shared by all examples.
      batch_argnum: int or tuple of ints: the arguments holding the batch on axis 0 (pytrees allowed;
        integer arrays such as labels too). Not differentiated.
      backend: backend name or object.
      compile: one compiled program per signature on backends that compile (``jax.jit``,
        ``tf.function``).
      device: place the inputs on this device.

    Returns:
      A function of the same arguments returning the gradients in the structure of
      ``args[argnums]``, each leaf of shape ``(B, *leaf.shape)``.

    Example:
      >>> loss = lambda w, x: (x @ w) ** 2          # one loss per row of x
      >>> unigrad.per_example_grad(loss)(np.ones(2), np.array([[1.0, 0.0], [1.0, 2.0]]))
      array([[ 2.,  0.],
             [ 6., 12.]])
    """
    return _PerExample(f, argnums, batch_argnum, backend, compile, device, norms=False).function()


def per_example_grad_norms(f: Callable, argnums=0, batch_argnum=1, *, backend=None, compile: bool = False,
                           device=None) -> Callable:
    """The Euclidean norm of each example's gradient over all parameters, as differential privacy needs.

    The same gradients as :func:`per_example_grad` (the same ``f``, arguments and rules), reduced to
    ``sqrt(sum over parameter leaves of |g_i|^2)``. On the NumPy tape, JAX, torch and TensorFlow, dense
    layers' norms come from one backward pass without forming the per-example gradients
    (``|x_i|^2 |g_i|^2``; for sequences ``sum((X_i X_i^T) * (G_i G_i^T))``); see ``.paths`` on the
    returned function.

    Args:
      f: ``f(*args)`` returning the per-example losses, shape ``(B,)``.
      argnums: the parameters.
      batch_argnum: the arguments holding the batch on axis 0.
      backend: backend name or object.
      compile: one compiled program per signature on backends that compile.
      device: place the inputs on this device.

    Returns:
      A function of the same arguments returning an array of shape ``(B,)``.

    Example:
      >>> loss = lambda w, x: (x @ w) ** 2
      >>> unigrad.per_example_grad_norms(loss)(np.ones(2), np.array([[1.0, 0.0], [0.0, 2.0]]))
      array([2., 8.])
    """
    return _PerExample(f, argnums, batch_argnum, backend, compile, device, norms=True).function()


class _PerExample:
    """One per-example transform: its options, its caches, and the function it returns."""

    def __init__(self, f, argnums, batch_argnum, backend, compile, device, norms):
        self.fname = "per_example_grad_norms" if norms else "per_example_grad"
        self.batch_argnums = _argnum_tuple(batch_argnum, "batch_argnum", self.fname)
        self.argnums = argnums
        own = _argnum_tuple(argnums, "argnums", self.fname)
        both = sorted(set(own) & set(self.batch_argnums))
        if both:
            raise ValueError(f"{self.fname}: argument {both[0]} is both a parameter (argnums={argnums!r}) and "
                             f"the batch (batch_argnum={batch_argnum!r}); the parameters are shared by all examples")
        self.f, self.backend, self.device, self.norms = f, backend, device, norms
        kinds = _KINDS[self.fname]
        self.plans, self.paths = BoundedCache(kinds["plans"]), BoundedCache(kinds["paths"], 64)
        self.programs = BoundedCache(kinds["programs"]) if compile else None
        self.analyses = BoundedCache(kinds["analyses"], 64)  # torch: the analysis of each program recorded
        self.graphs = BoundedCache(kinds["graphs"])  # TensorFlow: eager calls' programs
        self.untraceable = BoundedCache(kinds["untraceable"], 64)

    def function(self):
        def per_example_f(*args):
            return self(per_example_f, args)

        per_example_f.paths = {}
        _wraps(per_example_f, self.f, self.fname)
        return per_example_f

    def __call__(self, wrapper, args):
        fname = self.fname
        for k in self.batch_argnums:
            if not -len(args) <= k < len(args):
                raise ValueError(f"{fname}: batch_argnum {k} is out of range for a call with {len(args)} "
                                 f"positional arguments")
        call = prepare(self.plans, self.f, args, self.argnums, False, self.backend, fname, self.device)
        b = call.backend
        batch = _batch_size(b, [args[k] for k in self.batch_argnums], self.batch_argnums, fname)
        if batch == 0 and call.diff:  # no example: empty rows (vmap and jacrev of zero rows are refused by some engines)
            wrapper.paths = dict(zip(call.names(), [MATERIALISED] * len(call.diff)))
            if self.norms:
                return b.zeros((0,), b.dtype(call.diff[0]), device=b.device(call.diff[0]))
            return call.inputs_like([b.zeros((0, *b.shape(x)), b.dtype(x), device=b.device(x)) for x in call.diff])
        tape = _tape_backend(b)
        if tape is not None and call.diff:
            outs, blocks, paths = _tape_rows(call.flat_f, call.diff, batch, self.norms, fname)
            blocks = tuple(b.cast(x, d) if b.dtype(x) != d else x for x, d in zip(blocks, _result_dtypes(
                b, outs, call.diff, self.norms)))
        elif call.diff and _torch.is_torch_backend(b) and (found := _unless_custom_rules(lambda: _torch.torch_rows(
                b, call.flat_f, call.diff, batch, self.norms, fname, self.analyses, call.dynamic))) is not None:
            outs, blocks, paths = found
            blocks = tuple(b.cast(x, d) if b.dtype(x) != d else x for x, d in zip(blocks, _result_dtypes(
                b, outs, call.diff, self.norms)))
        elif call.diff and _jaxpr.is_jax_backend(b) and (found := self._jax(call, batch)) is not None:
            blocks, paths = found
            blocks = tuple(b.cast(x, d) if b.dtype(x) != d else x for x, d in zip(blocks, _result_dtypes(
                b, (call.diff[0],), call.diff, self.norms)))
        elif call.diff and _tf.is_tf_backend(b) and (found := self._tf(call, batch)) is not None:
            blocks, paths = found
            blocks = tuple(b.cast(x, d) if b.dtype(x) != d else x for x, d in zip(blocks, _result_dtypes(
                b, (call.diff[0],), call.diff, self.norms)))
        else:
            norms = self.norms

            def kernel(b, flat_f, leaves):
                return _materialised(b, flat_f, leaves, batch, norms, fname)[:2] + ((),)

            outs, blocks, _ = execute(call, kernel, self.programs, keep_outputs=False)
            paths = [MATERIALISED] * len(call.diff)
        names = call.names() if call.diff else []
        wrapper.paths = dict(zip(names, paths or [MATERIALISED] * len(names)))
        if self.norms:
            if not call.diff:
                return b.zeros((batch,), "float32")
            return blocks[0]
        if not call.diff:
            return call.inputs_like(())
        return call.inputs_like(list(blocks))


    def _jax(self, call, batch):
        """JAX: ``(blocks, paths)`` read from the jaxpr of ``f`` (traced on every eager call, once per signature
        compiled), or None where an eager ``f`` cannot be traced (it uses an array's value in Python, ``if
        x.max() > 1``): then every parameter is materialised, eagerly (JAX's VJP runs such an f)."""
        found = {}
        kernel = _program_kernel(_jaxpr.jax_rows, batch, self.norms, self.fname, found)
        try:
            _, blocks, _ = execute(call, kernel, self.programs, keep_outputs=False)
        except Exception as exc:
            if self.programs is not None or "paths" in found or not uses_traced_value(exc):
                raise  # (compiled: Program.explain said what to do)
            return None
        return blocks, self._paths(call, found, self.programs)

    def _tf(self, call, batch):
        """TensorFlow: ``(blocks, paths)`` from the graph ``f`` builds in a ``tf.function`` (one per signature,
        eager calls too: TensorFlow's pfor would trace anew on every eager call), or None for an ``f``
        that cannot be traced into a graph (it reads values): then the materialised path runs eagerly."""
        if call.program_key is None or self.untraceable.lookup(call) is not None:
            return None
        norms, fname, found = self.norms, self.fname, {}

        kernel = _program_kernel(_tf.tf_rows, batch, norms, fname, found)
        # compiled: a program per signature; eager: per value of the Python state f reads too (self.graphs)
        programs = self.programs if self.programs is not None else self.graphs
        try:
            _, blocks, _ = execute(call, kernel, programs, "graph", keep_outputs=False)
        except Exception:
            if "paths" in found:  # traced, then failed running: not a tracing problem
                raise
            self.untraceable.store(call, True)
            return None
        return blocks, self._paths(call, found, programs, "graph")

    def _paths(self, call, found, programs, decision=None):
        """The paths the program that ran took: read when it was traced (``found``), else those kept for it
        (a program traced its kernel once: its paths are its key's)."""
        if programs is None:  # eager: traced on this call
            return found.get("paths")
        key = programs.kind.key(call, decision)
        if "paths" in found:
            return self.paths.put(key, found["paths"])
        return self.paths.get(key)


def _materialised(b, flat_f, leaves, batch, norms, fname):
    """``(outputs, blocks, paths)``: every parameter's rows as Jacobian rows (or one block of norms)."""
    outs, jac, _ = b.jacrev(flat_f, leaves)
    _check_losses(b, outs, batch, fname)
    rows = promoted_blocks(b, outs, leaves, jac)[0]
    paths = [MATERIALISED] * len(leaves)
    if not norms:
        return outs, tuple(rows), paths
    # (through evaluate: the backend's scope for its arrays, such as JAX's 64-bit mode)
    return outs, (b.evaluate(lambda *r: _norm_of_rows(b, r, batch), rows),), paths


def _program_kernel(fast_rows, batch, norms, fname, found):
    """The kernel of a backend whose per-example rows are read from its program (``fast_rows``: JAX's
    jaxpr, TensorFlow's graph), traced once per signature: the fast path, or every parameter
    materialised where ``f`` called a custom rule; the paths taken go to ``found["paths"]``."""
    def kernel(b, flat_f, leaves):
        rows = _unless_custom_rules(lambda: fast_rows(b, flat_f, leaves, batch, norms, fname))
        if rows is None:
            rows = _materialised(b, flat_f, leaves, batch, norms, fname)
        outs, blocks, found["paths"] = rows
        return outs, blocks, ()

    return kernel


def _unless_custom_rules(rows):
    """``rows()`` (a fast path's ``(outputs, blocks, paths)``, or None), or None where ``f`` called a
    custom_vjp / custom_jvp function and a parameter took a dense-layer path: the proof that keeps a
    layer's rows apart reads the forward program, and the derivative through a custom function is its
    rule's, which may combine rows (then everything is materialised, with the rule)."""
    with custom_rules_seen() as seen:
        found = rows()
    if seen and found is not None and any(p != MATERIALISED for p in found[2]):
        return None
    return found


def _argnum_tuple(value, what, fname):
    items = value if isinstance(value, (tuple, list)) else (value,)
    for k in items:
        if not isinstance(k, int) or isinstance(k, bool):
            raise TypeError(f"{fname}: {what} must be an int or a tuple of ints; got {value!r}")
    return tuple(items)


def _batch_size(b, batch_args, argnums, fname):
    """B: the common leading axis of every array leaf of the batch arguments."""
    import optree

    sizes = {}
    for k, a in zip(argnums, batch_args):
        for leaf in optree.tree_leaves(a):
            shape = np.shape(leaf) if not b.is_array(leaf) else b.shape(leaf)
            if not hasattr(leaf, "shape") and not b.is_array(leaf):
                continue  # a Python number or a string: not part of the batch
            if not shape:
                raise ValueError(f"{fname}: argument {k} (batch_argnum) has a 0-d array; every array of the "
                                 f"batch needs the examples on axis 0")
            sizes.setdefault(shape[0], k)
    if not sizes:
        raise ValueError(f"{fname}: the batch arguments {argnums} hold no array; batch_argnum names the "
                         f"arguments with the examples on axis 0")
    if len(sizes) > 1:
        raise ValueError(f"{fname}: the batch arguments' leading axes differ: "
                         + ", ".join(f"argument {k} has {n} examples" for n, k in sizes.items()))
    return next(iter(sizes))


def _norm_of_rows(b, rows, batch):
    """sqrt(sum over leaves of the squared entries of each example's row), in the widest dtype."""
    xp = b.namespace()
    total = None
    for r in rows:
        sq = xp.sum(xp.reshape(r * r, (batch, -1)), axis=1)
        total = sq if total is None else total + sq
    return xp.sqrt(total)


def _result_dtypes(b, outs, leaves, norms):
    want = [_checks.promote(b.dtype(outs[0]), b.dtype(x)) for x in leaves]
    if norms:
        return [max(want, key=lambda d: np.dtype(d).itemsize)]
    return want


def _tape_backend(b):
    from .tape import NumpyBackend  # (only here: the core imports the tape through the registry)

    return b if isinstance(b, NumpyBackend) else None


# ---------------------------------------------------------------------------------------------
# The tape: dense layers found in the recorded program
# ---------------------------------------------------------------------------------------------

def _tape_rows(flat_f, leaves, batch, norms, fname):
    """``(outputs, blocks, paths)``: per-example gradient rows (or one block of norms) on the tape."""
    from .tape._core import backward, record
    from .tape._tracer import Tracer

    trace, outs, out_idx, _ = record(flat_f, leaves, False)
    _check_losses(_NumpyShapes, outs, batch, fname)
    out_index = out_idx[0]
    n = len(leaves)
    nested = any(isinstance(x, Tracer) for x in leaves)
    plans = [None] * n if nested or out_index is None else _dense_plans(trace, leaves, outs, out_index, batch)
    fast = {k: p for k, p in enumerate(plans) if p is not None}
    rows = [None] * n
    sq_norms = [None] * n
    paths = [MATERIALISED] * n
    if fast:
        cts = _cotangents_at(trace, out_index, np.ones((batch,), dtype=outs[0].dtype),
                             {p[1] for p in fast.values()})
        for k, (kind, idx, detail) in fast.items():
            entry = trace.tape[idx]
            g = cts.get(idx)
            if g is None:
                g = np.zeros(np.shape(entry[3]), dtype=entry[3].dtype)
            rows[k], sq_norms[k], paths[k] = _dense_rows(kind, entry, detail, g, leaves[k], batch, norms)
    slow = [k for k in range(n) if k not in fast]
    if slow:
        if out_index is None:  # the losses do not depend on the parameters
            full = [np.zeros((batch, *np.shape(x)), dtype=x.dtype) for x in leaves]
        else:
            basis = np.eye(batch, dtype=outs[0].dtype)
            full = backward(trace, [out_index], (basis,), n, leaves, batch_shape=(batch,))
        for k in slow:
            rows[k] = full[k]
    if not norms:
        return outs, tuple(rows), paths
    return outs, (_common.total_norms(_NUMPY, sq_norms, rows, batch),), paths


class _NumpyShapes:
    """What ``_check_losses`` reads of a backend, for plain NumPy values."""

    @staticmethod
    def shape(x):
        return tuple(np.shape(x))

    @staticmethod
    def dtype(x):
        return np.dtype(x.dtype).name


def _dense_plans(trace, leaves, outs, out_index, batch):
    """For each of the first ``n`` tape entries (the parameters): None, or ``(kind, consumer index,
    detail)`` when the parameter's one use is a dense layer whose rows stay apart up to the losses
    (proved by the dependence analysis, :func:`unigrad.dependence.prove_rows` from the layer's output)."""
    from .dependence import from_tape, prove_rows

    tape, n = trace.tape, len(leaves)
    program = None
    uses: dict = {}
    for idx in range(n, len(tape)):
        entry = tape[idx]
        if entry is None:
            continue
        for i, p in entry[1]:
            uses.setdefault(p, []).append((idx, i))
    proved: dict = {}
    plans = []
    for k in range(n):
        plan = _dense_plan(tape, uses, k, batch)
        if plan is not None:
            consumer = plan[1]
            if consumer not in proved:
                if program is None:
                    program = from_tape(trace, n, [out_index], leaves, outs)
                seeds = {consumer: np.ndim(tape[consumer][3])}
                proved[consumer] = prove_rows(program, batch, seeds=seeds)[0] == "row"
            if not proved[consumer]:
                plan = None
        plans.append(plan)
    return plans


def _dense_plan(tape, uses, k, batch):
    mine = uses.get(k, [])
    if len(mine) != 1:
        return None
    idx, i = mine[0]
    prim, parents, vals, ans, params = tape[idx]
    x = vals[i]
    if not (hasattr(x, "dtype") and hasattr(ans, "dtype")):  # an entry of another kind (a checkpointed block)
        return None
    if np.dtype(x.dtype).kind != "f" or np.dtype(ans.dtype).kind != "f":
        return None
    transposed = False
    if prim.name in ("matrix_transpose", "permute_dims") and np.ndim(x) == 2:
        if prim.name == "permute_dims" and tuple(a % 2 for a in params["axes"]) != (1, 0):
            return None
        onward = uses.get(idx, [])
        if len(onward) != 1:
            return None
        idx, i = onward[0]
        prim, parents, vals, ans, params = tape[idx]
        transposed = True
    ash = np.shape(ans)
    if not ash or ash[0] != batch:
        return None
    if prim.name == "matmul":
        other = vals[0]
        if i != 1 or np.ndim(vals[1]) != 2 or np.ndim(other) < 2 or len(ash) != np.ndim(other) \
                or np.shape(other)[0] != batch:
            return None
        return "matmul", idx, transposed
    if transposed:
        return None
    if prim.name in ("add", "subtract", "multiply"):
        shape = np.shape(x)
        if len(shape) > len(ash) or (len(shape) == len(ash) and shape[0] != 1):
            return None  # the parameter has an axis along the batch: not shared by rows
        sign = -1.0 if (prim.name == "subtract" and i == 1) else 1.0
        return ("scale" if prim.name == "multiply" else "bias"), idx, (i, sign)
    return None


def _cotangents_at(trace, out_index, cotangent, wanted):
    """One reverse sweep from the losses with ``cotangent``; the cotangents of the entries ``wanted``
    (each complete when the sweep reaches it: the tape is in execution order)."""
    from .tape._core import _like_dtype, unbroadcast

    tape = trace.tape
    cts = {out_index: cotangent}
    found = {}
    stop = min(wanted)
    for idx in range(out_index, stop - 1, -1):
        g = cts.pop(idx, None)
        if g is None:
            continue
        if idx in wanted:
            found[idx] = g
            if idx == stop:
                break
        entry = tape[idx]
        if entry is None:
            continue
        prim, parents, vals, ans, params = entry
        for i, p in parents:
            if p < stop:
                continue
            c = prim.vjps[i](g, ans, *vals, **params) if params else prim.vjps[i](g, ans, *vals)
            if prim.broadcasts:
                v = vals[i]
                if c.shape != v.shape:
                    c = unbroadcast(c, np.shape(v), 0)
                if c.dtype != v.dtype:
                    c = _like_dtype(c, v)
            old = cts.get(p)
            cts[p] = c if old is None else old + c
    return found


_NUMPY = _common.Ops(np.reshape, lambda a, axes, keepdims: np.sum(a, axis=axes, keepdims=keepdims), np.matmul,
                     lambda a: np.swapaxes(a, -1, -2), lambda a, dtype: np.ascontiguousarray(a, dtype=dtype), np.sqrt)


def _dense_rows(kind, entry, detail, g, param, batch, norms):
    """``(rows or None, squared norms or None, path)`` of one parameter from its layer's cotangent."""
    prim, parents, vals, ans, params = entry
    if kind == "matmul":
        return _common.matmul_rows(_NUMPY, np.asarray(vals[0]), np.asarray(g), batch, norms, detail, param.dtype)
    i, sign = detail
    other = None if kind == "bias" else np.asarray(vals[1 - i])
    rows, path = _common.broadcast_rows(_NUMPY, kind, np.asarray(g), other, np.shape(param), np.shape(ans), sign, batch)
    return rows.astype(param.dtype, copy=False), None, path
