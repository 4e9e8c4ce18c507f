"""Per-example gradients with respect to shared parameters, and their norms.

``per_example_grad(f)(params, batch)`` is row i of the Jacobian of ``f``'s per-example losses with
respect to the parameters: ``d f(params, batch)[i] / d params``. Two ways to get it:

* **Materialised** (every backend): the Jacobian rows themselves, ``jacrev`` of the loss vector
  (vectorised over the examples' unit cotangents: a batch of cotangents on the tape, ``vmap`` of the
  VJP on torch and JAX, ``pfor`` on TensorFlow). Exact for any ``f``; it costs about B backward
  passes of the batch.
* **Dense layers** (the tape, in ``_tape.py``; a backend's ``per_example_rows`` reads its own program the
  same way -- JAX's jaxpr, torch's ATen operations, TensorFlow's graph, in their packages under
  ``backends/`` -- with the formulas of :mod:`unigrad.per_example.layers`): ``f`` is recorded once, and
  each parameter whose one use is a matrix
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

from .. import _checks
from .._answer_check import failed_rows, norm_weights, norms_verdicts, random_directions, rows_verdicts
from .._caches import BoundedCache, CacheKind
from .._call import prepare
from .._plan import PLANS_WHY
from .._program import PROGRAMS_WHY, execute
from .._custom import custom_rules_seen
from .._transform import _wraps, promoted_blocks
from ..backend import Backend, uses_traced_value
from . import _tape
from .layers import MATERIALISED
from .layers import check_losses as _check_losses

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
        "analyses": CacheKind(fname, "analyses of a recorded program",
                              why="a backend's per_example_rows keeps its analysis of each program it records (the "
                                  "memo), keyed by the recorded program itself (torch: its operations, data flow, "
                                  "shapes, dtypes and literal arguments; f runs and is recorded on every call)"),
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
        self.analyses = BoundedCache(kinds["analyses"], 64)  # per_example_rows' memo (torch: one per program)
        self.graphs = BoundedCache(kinds["graphs"])  # eager calls' programs (TensorFlow)
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
        reader = _reader(b) if call.diff else None
        found = None if reader is None else self._read(call, batch, reader)
        if found is not None:  # read from f's program (layers by their rules, the rest materialised)
            outs, blocks, paths = found
            blocks = tuple(b.cast(x, d) if b.dtype(x) != d else x for x, d in zip(blocks, _result_dtypes(
                b, outs, call.diff, self.norms)))
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


    def _read(self, call, batch, reader):
        """``(outputs, blocks, paths)`` read from ``f``'s program by ``reader`` (see :func:`_reader`), inside the
        transform's compiled program where there is one, else the backend's program traced per signature and
        Python state (``traces_batched_jacobian``: TensorFlow's pfor would trace anew on every eager call), else
        eagerly; or None where an eager ``f`` cannot be traced (it uses an array's value in Python, ``if
        x.max() > 1``; it reads values, ``x.numpy()``): then every parameter is materialised, eagerly."""
        b, found = call.backend, {}
        kernel = _program_kernel(reader, batch, self.norms, self.fname, found, self.analyses)
        if self.programs is not None and b.capabilities.compile:  # ("rows": never the materialised program's key)
            programs, decision = self.programs, "rows"
        elif b.traces_batched_jacobian:
            if call.program_key is None or self.untraceable.lookup(call) is not None:
                return None
            programs, decision = self.graphs, "graph"
        else:
            programs, decision = None, None
        try:
            outs, blocks, _ = execute(call, kernel, programs, decision)
            blocks, checked = tuple(blocks[:-1]), blocks[-1]
            try:
                failed = failed_rows(b, checked)[0]
            except Exception:  # abstract values inside another framework's transform: nothing to read there
                failed = []
            if failed:  # the analysis was wrong for this f: every parameter materialised (exact)
                return None
        except Exception as exc:
            if "paths" in found:  # traced, then failed running: not a tracing problem
                raise
            if programs is self.graphs:
                self.untraceable.store(call, True)
                return None
            if programs is None and uses_traced_value(exc):
                return None
            raise  # (compiled: Program.explain said what to do)
        return outs, blocks, self._paths(call, found, programs, decision)

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


def _reader(b):
    """How per-example rows are read from ``b``'s programs: ``reader(b, f, leaves, batch, norms, fname,
    memo) -> (outputs, blocks, paths) | None`` -- the tape's recording (``_tape``), a backend's
    ``per_example_rows``; None where ``b`` has neither (every parameter is materialised)."""
    from ..tape import NumpyBackend  # (only here: the core imports the tape through the registry)

    if isinstance(b, NumpyBackend):
        def tape_reader(b, f, leaves, batch, norms, fname, memo, directions=None, weights=None):
            return _tape.tape_rows(f, leaves, batch, norms, fname, directions, weights)
        tape_reader.directions = True
        return tape_reader
    if type(b).per_example_rows is Backend.per_example_rows:
        return None

    def reader(b, f, leaves, batch, norms, fname, memo, directions=None, weights=None):
        if directions is None:
            return b.per_example_rows(f, leaves, batch, norms=norms, fname=fname, memo=memo)
        return b.per_example_rows(f, leaves, batch, norms=norms, fname=fname, memo=memo, directions=directions,
                                  weights=weights)
    # a backend whose per_example_rows takes directions= (norms with each example's <g_i, V>: checked)
    reader.directions = bool(getattr(b, "per_example_directions", False))
    return reader


def _program_kernel(reader, batch, norms, fname, found, memo):
    """The kernel that reads per-example rows from ``f``'s program (:func:`_reader`): the fast path, or every
    parameter materialised where ``f`` called a custom rule (or the reader does not apply); the paths taken
    go to ``found["paths"]``."""
    def kernel(b, flat_f, leaves):
        directions = weights = None
        floating = all(b.dtype(x) in ("float16", "bfloat16", "float32", "float64") for x in leaves)
        if norms and getattr(reader, "directions", False) and floating:
            directions, weights = random_directions(b, leaves), norm_weights(b, batch, leaves[0])

        def read(as_norms, directions, weights):
            return _unless_custom_rules(lambda: reader(b, flat_f, leaves, batch, as_norms, fname, memo,
                                                       directions=directions, weights=weights))

        # A reader that gives norms without each example's <g_i, V> (a plugin without directions=, a formula
        # that gives none) is asked for rows: those are checked below, and the norms made from them.
        as_rows = norms and directions is None and floating
        rows = read(norms and not as_rows, directions, weights)
        if rows is not None and norms and not as_rows and floating and len(rows[1]) == 1 and any(
                path != MATERIALISED for path in rows[2]):
            as_rows = True
            rows = read(False, None, None)
        if rows is None:
            as_rows = False
            rows = _materialised(b, flat_f, leaves, batch, norms, fname)
        outs, blocks, found["paths"] = rows
        # The rows of dense layers stand on the analysis of f's program: they check themselves
        # (unigrad._answer_check.rows_verdicts: one more backward pass of the batch, in the same program).
        # Norms read from factors come with each example's <g_i, V> from the same factors: with a random weight
        # per example, their weighted sum is checked against one more backward pass (norms_verdicts).
        # Materialised rows are Jacobian rows (exact).
        checked = b.asarray(np.zeros((2, 0), np.float32))
        fast = any(path != MATERIALISED for path in found["paths"] or ())
        if norms and not as_rows and len(blocks) > 1:  # (norms, dots[, the engine's side of the check])
            norm, dots, engine = blocks[0], blocks[1], (blocks[2] if len(blocks) > 2 else None)
            blocks = (norm,)
            if fast:
                try:
                    checked = b.evaluate(lambda *_: norms_verdicts(b, flat_f, tuple(leaves), tuple(outs), norm,
                                                                   dots, directions, weights, engine),
                                         (*leaves, norm, dots))  # (the arrays that set evaluate's scope)
                except Exception:  # f the engine cannot differentiate again as a whole (as for rows): unchecked
                    pass
        if (not norms or as_rows) and fast:
            try:
                checked = b.evaluate(lambda *_: rows_verdicts(b, flat_f, tuple(leaves), tuple(outs), tuple(blocks),
                                                              batch), (*leaves, *blocks))
            except Exception:  # f the engine cannot differentiate again as a whole (torch.func refuses a write into
                pass           # batch norm's running statistics, before writing): the rows go unchecked
        if as_rows:
            blocks = (b.evaluate(lambda *r: _norm_of_rows(b, r, batch), tuple(blocks)),)
        return outs, tuple(blocks) + (checked,), ()

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
