"""``TensorflowBackend``: unigrad's backend contract on TensorFlow's native autodiff.

Reverse mode is ``tf.GradientTape`` (Jacobians with ``tape.jacobian`` /
``tape.batch_jacobian``, vectorised by pfor), forward mode is
``tf.autodiff.ForwardAccumulator`` (Jacobians pushed through
``tf.vectorized_map``), ``vmap`` is ``tf.vectorized_map`` and ``compile`` is
``tf.function``. What the adapter adds on top of TensorFlow is the contract:

* zeros, never None, for inputs the outputs do not use (``UnconnectedGradients.ZERO``)
  and dense gradients (``IndexedSlices`` from gathers are densified);
* a cotangent or tangent of the wrong shape is an error, never broadcast;
* every primal is a fresh tensor (``tf.identity``): TensorFlow tracks watched
  tensors by identity, so a tensor passed twice, or also captured by ``f``'s
  closure, would otherwise receive the sum of its gradients; ``f`` also sees
  plain tensors, never ``tf.Variable``;
* the complex convention is JAX's. TensorFlow's gradient of a real function of
  complex ``z`` is the conjugate of JAX's, so complex cotangents are conjugated
  going in and complex gradients coming out (forward mode needs nothing);
* ``chunk_size`` bounds pfor's ``parallel_iterations`` (or the rows given to
  one ``tf.vectorized_map``);
* where TensorFlow's own machinery fails on ``f``, another exact way, never its raw error: forward
  mode over a gradient that holds ``IndexedSlices`` (``tf.scatter_nd``'s) becomes two reverse sweeps
  (real dtypes), and what pfor cannot vectorise (a Jacobian of ``tf.einsum("ii->i")``, the HVPs of a
  ``tf.scan``) runs one row at a time with a :class:`SlowMapWarning`; a reverse-mode Jacobian inside the
  adapter's own forward pass computes its rows in a loop (pfor's function, differentiated again there,
  failed with TensorFlow's own errors: ``_tape_jacobian``).
"""

from __future__ import annotations

import contextvars
import threading
import warnings

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import record as _record  # noqa: E402
from tensorflow.python.framework.func_graph import FuncGraph as _FuncGraph  # noqa: E402

import unigrad  # noqa: E402
from unigrad import Backend, Capabilities  # noqa: E402
from unigrad.backend import uses_traced_value  # noqa: E402

from . import _array, _host, _namespace, _rules, _sparse  # noqa: E402
from ._array import Array  # noqa: E402
from ._namespace import _gpu_count, tf_device_name  # noqa: E402

__all__ = ["TensorflowBackend"]

_ZERO = tf.UnconnectedGradients.ZERO
_SCALARS = (bool, int, float, complex)


class SlowMapWarning(UserWarning):
    """A map TensorFlow cannot vectorise ran one element at a time: a vmap whose function uses an array's
    value in Python (eagerly) or holds what pfor has no conversion for, or the rows of a Jacobian
    (``tape.jacobian`` / ``batch_jacobian``) whose pfor failed, computed in a loop. The values are the
    same; only the speed differs."""


def _first_line(exc) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if "Error" in line or "()" in line] or text.splitlines() or [""]
    return lines[-1].strip()


class TensorflowBackend(Backend):
    """unigrad on TensorFlow: GradientTape, ForwardAccumulator, pfor and tf.function."""

    name = "tensorflow"
    array_modules = ("tensorflow", "unigrad_tensorflow")  # tf.Tensor, and the Arrays f receives
    capabilities = Capabilities(forward_mode=True, vmap=True, compile=True, higher_order=True,
                                complex=True, float64=True, custom_rules=True)
    accepts_dlpack = True  # foreign arrays come through asarray, which tries DLPack first
    # Eager tape.batch_jacobian wraps pfor's loop in a new tf.function on every call (a trace per call and
    # "N out of the last N calls to pfor.<locals>.f triggered tf.function retracing"): one program per
    # signature instead (measured: bench_batched_jacobian's eager TensorFlow row).
    traces_batched_jacobian = True
    mutable_arrays = False  # immutable arrays: vjp_fn cannot see a caller's write

    def special(self, name):
        from ._special import FUNCTIONS

        return FUNCTIONS.get(name)

    # ---------------------------------------------------------------- arrays
    def namespace(self):
        return _array.namespace

    def version(self):
        return tf.__version__

    def devices(self):
        return ("cpu",) + tuple(f"cuda:{i}" for i in range(_gpu_count()))

    def device(self, x):
        """``"cpu"`` or ``"cuda:N"`` (None for a graph tensor TensorFlow has not placed)."""
        name = _plain(x).device
        if not name:
            return None
        kind, _, index = name.rpartition("device:")[2].partition(":")
        return "cpu" if kind == "CPU" else f"cuda:{index or 0}" if kind == "GPU" else name

    def is_array(self, x):
        return isinstance(x, (tf.Tensor, tf.Variable, Array))

    def asarray(self, x, dtype=None, device=None):
        """A plain ``tf.Tensor`` (never an :class:`Array`: those exist only while ``f`` runs)."""
        where = tf_device_name(device)
        if type(x) is Array:
            x = x._t
        elif isinstance(x, tf.Variable):
            x = tf.convert_to_tensor(x)
        elif not isinstance(x, tf.Tensor):
            x = _from_foreign(x)
        if dtype is not None and x.dtype != tf.as_dtype(dtype):
            x = tf.cast(x, tf.as_dtype(dtype))
        if where is not None and not _placed_on(x, where):
            with tf.device(where):
                x = tf.identity(x)
        return x

    def to_numpy(self, x):
        try:
            return _plain(x).numpy()
        except (AttributeError, NotImplementedError) as exc:
            raise TypeError(f"to_numpy: {type(x).__name__} is symbolic (inside tf.function or tf.vectorized_map) "
                            f"and has no value yet") from exc

    def to_native(self, x):
        """The ``tf.Tensor`` an :class:`Array` holds (a tensor or Variable as it is)."""
        return _plain(x)

    def zeros(self, shape, dtype, device=None):
        """Zeros as a plain tensor (the core hands them back to the user: never an :class:`Array`)."""
        with _namespace._on(device):
            return tf.zeros(tuple(shape), tf.as_dtype(dtype))

    def shape(self, x):
        dims = _plain(x).shape.as_list()
        if None in dims:
            raise ValueError(f"the shape of {x.name if hasattr(x, 'name') else x} is not fully known ({dims}); "
                             f"unigrad needs static shapes inside tf.function")
        return tuple(dims)

    def dtype(self, x):
        return x.dtype.name

    def cast(self, x, dtype):
        return tf.cast(_plain(x), tf.as_dtype(dtype))

    def zeros_like(self, x):
        return tf.zeros_like(_plain(x))

    def ones_like(self, x):
        return tf.ones_like(_plain(x))

    def stop_gradient(self, x):
        return _rules.stop_gradient(x)  # an Array stays an Array (inside f)

    def apply_rule(self, rule, arrays):
        """``tf.custom_gradient`` whose gradient function calls the rule (``_rules``)."""
        return _rules.apply_rule(rule, arrays)

    def arguments(self, arrays):
        """What ``f`` receives for its non-differentiated array arguments ``arrays``: :class:`Array` s, like the
        differentiated ones the transforms hand it. The core binds those arguments inside its flat
        function, out of the adapter's reach: it has to call this where it assembles ``f``'s arguments
        (until it does, ``f`` gets them as plain ``tf.Tensor`` s; see docs/guide.md)."""
        return tuple(Array(a) if isinstance(a, tf.Tensor) else
                     Array(tf.convert_to_tensor(a)) if isinstance(a, tf.Variable) else a for a in arrays)

    def evaluate(self, f, primals):
        """``f(*primals)`` as the transforms call it: on :class:`Array` s, plain tensors back."""
        return _tree_plain(_call(f, primals))

    # ---------------------------------------------------------------- reverse and forward mode
    def vjp(self, f, primals, *, has_aux=False):
        primals = _fresh(primals)
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(primals)
            outputs, aux = _split(_call(f, primals), has_aux)

        def vjp_fn(cotangents):
            cotangents = _check_like(tuple(cotangents), outputs, "cotangent", "output")
            grads = tape.gradient(list(outputs), list(primals), output_gradients=[_conj(c) for c in cotangents],
                                  unconnected_gradients=_ZERO)
            return tuple(_conj(_dense(g, p)) for g, p in zip(grads, primals))

        return outputs, vjp_fn, aux

    def jvp(self, f, primals, tangents, *, has_aux=False):
        primals = _fresh(primals)
        tangents = _check_like(tuple(tangents), primals, "tangent", "primal")
        return _push(f, primals, tangents, has_aux)

    # ---------------------------------------------------------------- Jacobians
    def jacrev(self, f, primals, *, chunk_size=None, has_aux=False):
        primals = _fresh(primals)
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(primals)
            outputs, aux = _split(_call(f, primals), has_aux)
        jac = []
        for o in outputs:
            if _size(o) == 0 or not primals:
                jac.append(tuple(tf.zeros(o.shape + p.shape, p.dtype) for p in primals))
                continue
            blocks = _tape_jacobian(tape, o, list(primals), chunk_size)
            jac.append(tuple(_conj(_dense(b, p, o.shape + p.shape)) for b, p in zip(blocks, primals)))
        return outputs, tuple(jac), aux

    def jacfwd(self, f, primals, *, chunk_size=None, has_aux=False):
        primals = _fresh(primals)
        outputs, aux = _split(_call(f, primals), has_aux)

        def push(tangents):
            return _push(f, primals, tuple(tangents), has_aux)[1]

        n_in = sum(_size(p) for p in primals)
        columns = self._map_chunks(lambda *tangents: push(tangents), lambda start, stop: self._basis(primals, start, stop),
                                   n_in, chunk_size, self._specs(outputs))
        return outputs, _columns_to_blocks(columns, outputs, primals), aux

    #: per_example_rows takes directions= (norms come with each example's <g_i, V>: unigrad.per_example checks them)
    per_example_directions = True

    def per_example_rows(self, f, primals, batch, *, norms=False, fname="per_example_grad", memo=None,
                         directions=None, weights=None):
        """Per-example gradients read from ``f``'s graph while a ``tf.function`` traces (the core runs this in
        one: ``traces_batched_jacobian``): dense layers by their rules (``_per_example``)."""
        from ._per_example import tf_rows
        return tf_rows(self, f, tuple(primals), batch, norms, fname, directions, weights)

    def dependence_program(self, f, primals, *, has_aux=False, unknown=()):
        """``f``'s ``tf.function`` graph in ``unigrad.dependence``'s form (``_dependence``): TensorFlow-native
        code's sparsity patterns and row proofs."""
        from ._proof import graph_of

        return graph_of(lambda *p: _tree_plain(_call(f, p)), tuple(_plain(p) for p in primals), has_aux)[0]

    def batch_rows(self, f, primals, *, has_aux=False):
        """Rows of ``f`` proved from its ``tf.function`` graph: ``(verdict, detail, False)`` (see ``_proof``)."""
        from ._proof import batch_rows
        return batch_rows(lambda *p: _tree_plain(_call(f, p)), tuple(_plain(p) for p in primals), has_aux)

    def batched_jacobian(self, f, primals, *, mode="rev", chunk_size=None, has_aux=False):
        """Per-example Jacobians: ``tape.batch_jacobian`` (rev) or a vectorised ForwardAccumulator (fwd).

        The primals of one dtype are flattened to ``(B, n)`` and concatenated into one watched tensor
        (f gets views of it), and so are the outputs, so one pfor sweep serves every block.
        """
        primals = _fresh(primals)
        batch = primals[0].shape[0]
        in_groups = _groups(primals)
        flats = tuple(_concat_rows([primals[j] for j in group], batch) for group in in_groups)

        def call(*flat):
            views = [None] * len(primals)
            for group, x in zip(in_groups, flat):
                pieces = tf.split(x, [_size(primals[j]) // max(batch, 1) for j in group], axis=1)
                for j, piece in zip(group, pieces):
                    views[j] = tf.reshape(piece, primals[j].shape)
            outs, aux = _split(_call(f, views), has_aux)
            for k, o in enumerate(outs):
                if o.shape.rank == 0 or o.shape[0] != batch:
                    raise ValueError(f"batched_jacobian: output {k} has shape {tuple(o.shape)}; expected a leading "
                                     f"batch axis of size {batch}, the inputs' batch size")
            return outs, aux

        if mode == "fwd":
            outputs, aux = call(*flats)
            flat_outputs = tuple(tf.zeros((batch, _size(o) // batch), o.dtype) for o in outputs)
            blocks = {}
            for g, x in enumerate(flats):
                def push(unit, g=g, x=x):  # the same unit tangent for every example
                    with tf.autodiff.ForwardAccumulator(x, tf.broadcast_to(unit, x.shape)) as acc:
                        outs, _ = call(*flats[:g], x, *flats[g + 1:])
                    return tuple(tf.reshape(_dense(acc.jvp(o, unconnected_gradients=_ZERO), o), (batch, -1))
                                 for o in outs)

                def units(start, stop, x=x):
                    return tf.eye(x.shape[1], dtype=x.dtype)[start:stop]

                columns = self._map_chunks(push, lambda start, stop: (units(start, stop),), x.shape[1], chunk_size,
                                           self._specs(flat_outputs))  # per output: (n, B, m_i)
                for i, cols in enumerate(columns):
                    blocks[i, g] = tf.transpose(cols, (1, 2, 0))
            return outputs, _assemble(blocks, outputs, primals, in_groups, None, batch, conj=False), aux

        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
            tape.watch(flats)
            outputs, aux = call(*flats)
            out_groups = _groups(outputs)
            targets = [_concat_rows([outputs[i] for i in group], batch) for group in out_groups]
        blocks = {}
        for h, t in enumerate(targets):
            for g, x in enumerate(flats):
                if t.shape[1] == 0 or x.shape[1] == 0:
                    blocks[h, g] = tf.zeros((batch, t.shape[1], x.shape[1]), x.dtype)
                    continue
                blocks[h, g] = _tape_jacobian(tape, t, x, chunk_size, batch=True)
        return outputs, _assemble(blocks, outputs, primals, in_groups, out_groups, batch, conj=True), aux

    # ---------------------------------------------------------------- second order
    def hessian(self, f, primals, *, chunk_size=None):
        """Reverse over reverse: nested tapes, the outer Jacobian vectorised by pfor.

        Measured against forward over reverse (a ForwardAccumulator around a tape, vectorised over the
        input basis) on a 40-input function: 3x faster eagerly, 1.2x faster under tf.function. Complex
        primals take forward over reverse, which gives the JAX convention by construction.
        """
        primals = _fresh(primals)
        if any(p.dtype.is_complex for p in primals):
            columns = self._map_chunks(lambda *tangents: _hvp(f, primals, tangents),
                                       lambda start, stop: self._basis(primals, start, stop),
                                       sum(_size(p) for p in primals), chunk_size, self._specs(primals))
            return _columns_to_blocks(columns, primals, primals)
        with tf.GradientTape(persistent=True, watch_accessed_variables=False) as outer:
            outer.watch(primals)
            grads = _gradient(f, primals)
        jac = []
        for g, p in zip(grads, primals):
            if _size(p) == 0:
                jac.append(tuple(tf.zeros(p.shape + q.shape, q.dtype) for q in primals))
                continue
            blocks = _tape_jacobian(outer, g, list(primals), chunk_size)
            jac.append(tuple(_dense(b, q, p.shape + q.shape) for b, q in zip(blocks, primals)))
        return tuple(jac)

    def hvp(self, f, primals, tangents):
        primals = _fresh(primals)
        return _hvp(f, primals, _check_like(tuple(tangents), primals, "tangent", "primal"))

    def checkpoint(self, f, primals):
        """The block as a ``tf.custom_gradient`` that recomputes it in the backward pass (``_checkpoint``)."""
        from ._checkpoint import checkpoint

        return checkpoint(f, primals)

    @property
    def while_loop(self):
        """``tf.while_loop`` (:func:`_while_loop`) for ``unigrad.linear_solve``'s CG on symbolic values, or None
        (it then solves densely) where the graph being built is one that TensorFlow differentiates
        symbolically (:func:`_symbolically_differentiated`): there custom rules are not seen, and TensorFlow
        would differentiate the loop's iterations -- measured: errors in pfor's conversion of ``while_grad``,
        or an approximate derivative; the dense solve's LU is differentiated exactly."""
        return None if _symbolically_differentiated() else _while_loop

    # ---------------------------------------------------------------- vmap and compile
    def vmap(self, f, in_axes, out_axes=0, chunk_size=None):
        in_axes = list(in_axes)

        def mapped(*args):
            mapped_at = [k for k, ax in enumerate(in_axes) if ax is not None]
            args = [_plain(a) for a in args]
            elems = tuple(_namespace.moveaxis(args[k], in_axes[k], 0) for k in mapped_at)
            sizes = {e.shape[0] for e in elems}
            if len(sizes) != 1:
                raise ValueError(f"vmap: mapped axes must all have one size; got sizes {sorted(sizes)}")
            size = sizes.pop()

            def body(slices):
                call = list(args)
                for k, s in zip(mapped_at, slices):
                    call[k] = s
                return tuple(_plain(o) for o in _call(f, call))

            try:
                pieces = [_vectorized_map(body, tuple(e[start:stop] for e in elems))
                          for start, stop in (_chunks(size, chunk_size) or [(0, 0)])]
            except Exception as exc:
                # TensorFlow could not vectorise f. Either f uses an array's value in Python (an if on it):
                # pfor traces f into a graph, where arrays have no values, and eagerly the elements can
                # still be mapped one by one, f seeing values. Or pfor has no conversion for what f's
                # graph holds (the derivative of a tf.scan's while loop inside another derivative, say):
                # the elements mapped one by one give the same values, eagerly or in a program. Where
                # one element fails too, that error is f's own and is raised
                traced = uses_traced_value(exc)
                if not size or (traced and not tf.executing_eagerly()):
                    raise
                columns = _one_at_a_time(body, elems, size)
                if traced:
                    message = (f"vmap: f uses the value of an array as a Python value ({_first_line(exc)}); "
                               f"TensorFlow cannot vectorise such a function, so its {size} elements are mapped "
                               f"one at a time. Keep it vectorised with the namespace's functions (xp.where for a "
                               f"branch)")
                else:
                    message = (f"TensorFlow cannot vectorise a map over f or its derivatives ({_first_line(exc)}), "
                               f"so its {size} elements are mapped one at a time (the same values, more slowly)")
                warnings.warn(message, SlowMapWarning, stacklevel=2)
                pieces = [columns]
            outs = pieces[0] if len(pieces) == 1 else [tf.concat(list(p), 0) for p in zip(*pieces)]
            return tuple(_namespace.moveaxis(o, 0, out_axes) for o in outs)

        return mapped

    def compile(self, fn, weak_scalars=()):
        """``tf.function`` without autograph, called through its concrete function per input signature.

        ``weak_scalars``: arguments that are Python floats (or complex). ``tf.function`` would trace anew
        for every value; they enter the program as float64 (complex128) tensors, and ``fn`` receives
        them as :class:`WeakScalar` s, which keep a Python number's weak dtype rule (``x32 * c`` stays
        float32, as in the eager call).

        Autograph is off: unigrad's transforms are plain Python over static shapes. Shapes are never
        relaxed (no ``reduce_retracing``): the core keeps one compiled function per static signature,
        and the transforms need static shapes to build their bases. Calling the concrete function
        directly skips ``tf.function``'s per-call argument binding: measured 175 us against 350 us per
        call on a tiny gradient (``reduce_retracing=True``: 323 us, an ``input_signature``: 368 us).
        """
        weak = tuple(weak_scalars)
        if weak:
            inner = fn

            def fn(*arrays):
                arrays = list(arrays)
                for i in weak:
                    arrays[i] = _array.WeakScalar(arrays[i])
                return inner(*arrays)

        function = tf.function(fn, autograph=False)
        concrete, trace_lock = {}, threading.Lock()

        def compiled(*arrays):
            if weak:
                arrays = list(arrays)
                for i in weak:
                    arrays[i] = _weak_tensor(arrays[i])
            for a in arrays:
                if not isinstance(a, tf.Tensor):
                    # A tf.Variable is read (a concrete function traced for a Variable takes a resource
                    # handle, one traced for a tensor takes values: the same key must serve both).
                    arrays = tuple(tf.convert_to_tensor(v) if isinstance(v, tf.Variable) else v for v in arrays)
                    if not all(isinstance(v, tf.Tensor) for v in arrays):
                        return function(*arrays)
                    break
            key = tuple((tuple(a.shape), a.dtype) for a in arrays)
            program = concrete.get(key)
            if program is None:
                # One trace at a time per program: threads sharing a transform meet its first call together,
                # and a trace of one tf.function is the one TensorFlow state unigrad lets threads share
                # (docs/conventions.md, threads); after the first call per signature the lock is not taken
                with trace_lock:
                    program = concrete.get(key)
                    if program is None:
                        program = concrete[key] = function.get_concrete_function(*arrays)
            return program(*arrays)

        compiled.function = function
        return compiled

    # ---------------------------------------------------------------- bridge and sparse results
    # (the contract's hooks for unigrad.bridge and the sparse transforms: _host, _sparse)
    def host_callback(self, fn, arrays, out_specs, *, jvp=None):
        """``tf.py_function`` (see ``_host``); ``jvp`` is not needed: TensorFlow differentiates the bridge's
        rule (``tf.custom_gradient``), never the callback itself."""
        return _host.host_callback(fn, [_plain(x) for x in arrays], out_specs)

    def sparse_matrix(self, values, structure, format, fname):
        """A ``tf.sparse.SparseTensor`` (``"auto"``, ``"coo"``); other layouts: a ValueError (see ``_sparse``)."""
        return _sparse.sparse_matrix(_plain(values), structure, format, fname)

    def dense_matrix(self, values, structure):
        return _sparse.dense_matrix(_plain(values), structure)

    def sparse_to_numpy(self, matrix):
        return _sparse.sparse_to_numpy(_plain(matrix))


# -------------------------------------------------------------------- helpers

def _symbolically_differentiated() -> bool:
    """Whether the ops being built now may be differentiated by TensorFlow's symbolic gradients (which
    ignore the tapes' recorded custom rules) rather than by the tapes: a pfor loop body (``tf.vectorized_map``,
    the Jacobians' ``tape.jacobian`` / ``batch_jacobian``: pfor traces it under the name scope ``loop_body``)
    or a graph nested in another (a ``tf.while_loop`` or ``tf.map_fn`` body, a ``tf.function`` called from
    one), whose enclosing tapes record the call and differentiate its graph."""
    if tf.executing_eagerly():
        return False
    if any(part.startswith("loop_body") for part in tf.get_current_name_scope().split("/")):
        return True
    graph, functions = tf.compat.v1.get_default_graph(), 0
    while isinstance(graph, _FuncGraph):
        functions += 1
        graph = graph.outer_graph
    return functions > 1


def _while_loop(cond, body, state):
    """``tf.while_loop`` on a tuple ``state`` of arrays whose dtypes and shapes ``body`` keeps; ``cond`` and
    ``body`` see :class:`Array` s, TensorFlow tensors. Nothing differentiates the loop (the implicit rules
    give the solution's derivatives): a symbolic gradient through it is NaN (:func:`_not_differentiated`)."""
    state = tuple(state)
    inside = any(type(s) is Array for s in state)
    tensors = tuple(tf.convert_to_tensor(_plain(s)) for s in state)

    def loop_cond(*values):
        return tf.convert_to_tensor(_plain(cond(tuple(Array(v) for v in values))))

    def loop_body(*values):
        out = tuple(tf.convert_to_tensor(_plain(o)) for o in body(tuple(Array(v) for v in values)))
        for k, (o, v) in enumerate(zip(out, tensors)):
            if o.dtype != v.dtype or not o.shape.is_compatible_with(v.shape):
                raise TypeError(f"while_loop: body changes state[{k}] from {v.dtype.name} {v.shape} to "
                                f"{o.dtype.name} {o.shape}; the state must keep its dtypes and shapes")
        return out

    out = _not_differentiated(*tf.while_loop(loop_cond, loop_body, tensors))
    return tuple(Array(o) for o in out) if inside else tuple(out)


@tf.custom_gradient
def _not_differentiated(*values):
    """The loop's results, whose symbolic gradient is NaN (loud: the derivative of the iterations would be an
    approximation), with a warning where TensorFlow builds it: a ``tf.GradientTape`` outside a ``tf.function``
    that holds the loop (a unigrad transform compiled there) sees the function's graph, not linear_solve's
    rules. (TensorFlow may build that gradient as soon as the function is called under such a tape.)"""
    def nan(*cotangents, **kwargs):
        warnings.warn("linear_solve's CG loop (tf.while_loop) is being differentiated by TensorFlow's symbolic "
                      "gradients of the graph that holds it (as for a tf.GradientTape around a compiled unigrad "
                      "transform), which do not apply linear_solve's derivative rules: that derivative is NaN. "
                      "Take derivatives with unigrad's transforms (compile=True) instead", RuntimeWarning,
                      stacklevel=2)
        return [None if c is None or not c.dtype.is_floating else c * tf.constant(float("nan"), c.dtype)
                for c in cotangents]
    return values, nan


def _fresh(primals):
    """New tensors for the primals (see the module docstring: TensorFlow watches tensors by identity)."""
    return tuple(tf.identity(_plain(p)) for p in primals)


def _split(result, has_aux):
    """``(outputs, aux)`` of one call of a flat f, as plain tensors; aux tensors come back detached."""
    if not has_aux:
        return tuple([_plain(o) for o in result]), None
    outputs, aux = result
    aux = tuple(_plain(a) for a in aux)
    return (tuple([_plain(o) for o in outputs]),
            tuple(tf.stop_gradient(a) if isinstance(a, (tf.Tensor, tf.Variable)) else a for a in aux))


def _weak_tensor(c):
    """A Python float (complex) as a float64 (complex128) tensor. TensorFlow's eager scalar cache
    matches values by equality, so ``tf.constant(-0.0)`` may return a cached ``0.0``: a value with a
    zero part goes through NumPy."""
    if type(c) is complex:
        return tf.constant(c, tf.complex128) if c.real and c.imag else tf.constant(np.array(c, np.complex128))
    return tf.constant(c, tf.float64) if c else tf.constant(np.array(c, np.float64))


def _plain(x):
    return x._t if type(x) is Array or type(x) is _array.WeakScalar else x


def _tree_plain(tree):
    if type(tree) is Array:
        return tree._t
    if type(tree) in (tuple, list):
        return type(tree)(_tree_plain(v) for v in tree)
    if isinstance(tree, dict):
        return type(tree)((k, _tree_plain(v)) for k, v in tree.items())
    return tree


def _call(f, arrays):
    """``f`` on the tensors ``arrays`` as :class:`Array` s, with the namespace in its inside-``f`` mode."""
    token = _array._INSIDE.set(True)
    try:
        return f(*[Array(a) if isinstance(a, tf.Tensor) else a for a in arrays])
    finally:
        _array._INSIDE.reset(token)


def _outside_f(method):
    """A transform method run from inside another transform's ``f``: the namespace back in its plain mode
    while it works, and its results handed to that ``f`` as :class:`Array` s."""
    def run(self, *args, **kwargs):
        if not _array._INSIDE.get():
            return method(self, *args, **kwargs)
        token = _array._INSIDE.set(False)
        try:
            result = method(self, *args, **kwargs)
        finally:
            _array._INSIDE.reset(token)
        return _to_inside(result)
    run.__name__ = run.__qualname__ = method.__name__
    run.__doc__ = method.__doc__
    return run


def _to_inside(result):
    if isinstance(result, tf.Tensor):
        return Array(result)
    if type(result) in (tuple, list):
        return type(result)(_to_inside(v) for v in result)
    if callable(result) and not isinstance(result, type):  # vjp_fn, a vmapped function
        inner = result

        def call_from_inside(*args, **kwargs):
            token = _array._INSIDE.set(False)
            try:
                out = inner(*args, **kwargs)
            finally:
                _array._INSIDE.reset(token)
            return _to_inside(out) if _array._INSIDE.get() else out
        return call_from_inside
    return result


def _conj(x):
    return tf.math.conj(x) if x.dtype.is_complex else x


def _size(x):
    return x.shape.num_elements()


def _dense(g, like, shape=None):
    """A dense tensor for a gradient TensorFlow may give as None or IndexedSlices."""
    if g is None:
        return tf.zeros(like.shape if shape is None else shape, like.dtype)
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    return g


def _check_like(values, references, what, of):
    """TensorFlow broadcasts a wrong-shaped output gradient silently; unigrad never does."""
    values = tuple(_plain(v) for v in values)
    if len(values) != len(references):
        raise ValueError(f"expected {len(references)} {what}s, one per {of}; got {len(values)}")
    for k, (v, r) in enumerate(zip(values, references)):
        if not isinstance(v, (tf.Tensor, tf.Variable)) or v.shape.as_list() != r.shape.as_list() or v.dtype != r.dtype:
            got = (f"shape {tuple(v.shape)}, dtype {v.dtype.name}" if isinstance(v, (tf.Tensor, tf.Variable))
                   else type(v).__name__)
            raise ValueError(f"{what} {k} has {got}; expected shape {tuple(r.shape)}, dtype {r.dtype.name} "
                             f"(those of {of} {k})")
    return values


def _chunks(n, chunk_size):
    if chunk_size is None or chunk_size >= n:
        return [(0, n)] if n else []
    return [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]


def _pfor_options(chunk_size):
    """tape.jacobian / batch_jacobian options for a chunk size: pfor chunks, or a plain loop for 1."""
    if chunk_size is None:
        return {"experimental_use_pfor": True}
    if chunk_size == 1:  # pfor rejects parallel_iterations=1
        return {"experimental_use_pfor": False, "parallel_iterations": 1}
    return {"experimental_use_pfor": True, "parallel_iterations": chunk_size}


def _one_at_a_time(body, elems, size):
    """``body`` mapped over the ``size`` elements of ``elems`` without vectorising, its outputs stacked: eagerly
    a Python loop; in a graph the first element alone (its outputs give the others' signature) and the
    rest in one ``tf.map_fn``, so the graph holds two copies of ``body``, not ``size``."""
    if tf.executing_eagerly() or size == 1:
        rows = [body(tuple(e[i] for e in elems)) for i in range(size)]
        return [tf.stack(list(column), 0) for column in zip(*rows)]
    first = body(tuple(e[0] for e in elems))
    rest = tf.map_fn(lambda row: tuple(body(tuple(row))), tuple(e[1:] for e in elems),
                     fn_output_signature=tuple(tf.TensorSpec(o.shape, o.dtype) for o in first))
    return [tf.concat([o[None], r], 0) for o, r in zip(first, rest)]


def _tape_jacobian(tape, target, sources, chunk_size, batch=False):
    """``tape.jacobian`` (``tape.batch_jacobian`` with ``batch``), vectorised by pfor. Where pfor has no
    conversion for the gradient's graph (``tf.einsum("ii->i", ...)``'s: "Encountered an exception while
    vectorizing the jacobian computation"), the rows are computed in a loop instead, TensorFlow's own
    remedy (``experimental_use_pfor=False``), with a :class:`SlowMapWarning`: the same values."""
    jacobian = tape.batch_jacobian if batch else tape.jacobian
    options = _pfor_options(chunk_size)
    if options["experimental_use_pfor"] and _FORWARD_DEPTH.get():
        # inside the adapter's forward pass (a ForwardAccumulator): a derivative taken later of pfor's function
        # makes TensorFlow build that function's forward pass with JVPs, which fails with its own error
        # (concrete_function: a TypeError constructing InternalError, or "returned too few gradients";
        # jacfwd(jacfwd(jacrev(f))) and jacrev(jacfwd(jacrev(f))) through linear_solve, TF 2.21): the rows in a
        # loop, TensorFlow's remedy, the same values
        options = {"experimental_use_pfor": False, "parallel_iterations": chunk_size}
    if options["experimental_use_pfor"] and not tf.executing_eagerly() and _record.could_possibly_record():
        # in a program, under a tape that may differentiate the Jacobian: pfor in a function of its own, as
        # eagerly (see _pfor_apart)
        jacobian = _pfor_apart(jacobian)
    try:
        return jacobian(target, sources, unconnected_gradients=_ZERO, **options)
    except ValueError as exc:
        if not options["experimental_use_pfor"] or "experimental_use_pfor" not in str(exc):
            raise
        cause = _first_line(exc.__cause__ or exc.__context__ or exc)
    except AttributeError as exc:
        # pfor differentiating a function that is itself a gradient of custom rules, at third order (jacrev of
        # jacrev of jacrev through custom_fixed_point): TensorFlow's own error, not f's
        if not options["experimental_use_pfor"] or "python_grad_func" not in str(exc):
            raise
        cause = _first_line(exc)
    rows = _size(target) // max(target.shape[0], 1) if batch else _size(target)
    warnings.warn(f"TensorFlow cannot vectorise the rows of this Jacobian ({cause}), so they are computed one "
                  f"at a time ({rows} in a loop; the same values, more slowly)", SlowMapWarning, stacklevel=4)
    return jacobian(target, sources, unconnected_gradients=_ZERO, experimental_use_pfor=False,
                    parallel_iterations=chunk_size)


def _pfor_apart(jacobian):
    """``jacobian`` run in a ``tf.function`` of its own. In a program pfor builds its loop body in the program's
    graph and converts its ops there; a tape around it then differentiates the converted ops, not the custom
    rules recorded on the body's (whose code runs on copies that tapes do not see): a compiled
    ``jacrev(jacrev(f))`` through ``unigrad.linear_solve`` gave half the closed form. Eagerly pfor runs in a
    function of its own, which the tape differentiates from its graph (TensorFlow's symbolic gradients, that
    see through the copies): the right value; so here too."""
    def apart(target, sources, **options):
        return tf.function(lambda: jacobian(target, sources, **options), autograph=False)()
    return apart


def _vectorized_map(body, elems):
    """``tf.vectorized_map``; in a program under a tape or accumulator that may differentiate the map, in a
    function of its own (as eagerly: see :func:`_pfor_apart`; a compiled ``jacrev(jacfwd(f))`` through a
    custom rule gave zeros on the diagonal)."""
    if not tf.executing_eagerly() and _record.could_possibly_record():
        try:
            return tf.function(lambda: tf.vectorized_map(body, elems), autograph=False)()
        except Exception:  # noqa: BLE001
            # TensorFlow's forward mode could not record the call (measured: "'NoneType' object cannot be
            # interpreted as an integer" in record_operation, jacfwd(jacfwd) of a scalar's linear_solve): inlined
            pass
    return tf.vectorized_map(body, elems)


def _columns_to_blocks(columns, rows_like, primals):
    """Pushed-forward basis columns (per row owner, ``(n_in, *row.shape)``) as ``jac[i][j]`` of shape
    ``rows_like[i].shape + primals[j].shape``."""
    sizes = [_size(p) for p in primals]
    jac = []
    for row, cols in zip(rows_like, columns):
        cols = tf.transpose(tf.reshape(cols, (sum(sizes), _size(row))))  # (row size, n_in)
        jac.append(tuple(tf.reshape(c, row.shape + p.shape) for c, p in zip(tf.split(cols, sizes, axis=1), primals)))
    return tuple(jac)


# TensorFlow's forward mode inside its own forward mode (a ForwardAccumulator nested in another, eager)
# returns wrong second derivatives when an intermediate is an operand twice (tensorflow/tensorflow#127753,
# TF 2.21: (m * m) * m gives 2.4 for 4.2; measured here, jvp of jvp of a 5-term polynomial in 1/x^2 was
# off by 4 orders of magnitude), and the wrong value stays cached for later nested passes. Forward over
# reverse, reverse over forward and reverse over reverse are right. So a forward pass started inside
# another of the adapter's forward passes is two reverse sweeps instead: J t = d/du <J^T u, t>.
_FORWARD_DEPTH = contextvars.ContextVar("unigrad_tensorflow_forward_depth", default=0)


def _push(f, primals, tangents, has_aux):
    """``(outputs, tangents_out, aux)``: ``f`` pushed forward along ``tangents``.

    Where TensorFlow's forward mode fails on ``f`` and reverse mode does not (forward over a gradient
    that holds ``IndexedSlices``, as ``tf.scatter_nd``'s does: "'IndexedSlices' object has no
    attribute '_id'"), real primals take the same ``J t`` from two reverse sweeps; elsewhere the forward
    mode's error is raised."""
    depth = _FORWARD_DEPTH.get()
    real = not any(p.dtype.is_complex for p in primals)
    if depth and real:
        return _push_by_two_vjps(f, primals, tangents, has_aux)
    token = _FORWARD_DEPTH.set(depth + 1)
    try:
        with tf.autodiff.ForwardAccumulator(primals, tangents) as acc:
            outputs, aux = _split(_call(f, primals), has_aux)
        return outputs, tuple(_dense(acc.jvp(o, unconnected_gradients=_ZERO), o) for o in outputs), aux
    except Exception as exc:
        if not real or uses_traced_value(exc):  # (f's own error in any mode)
            raise
        failed = exc
    finally:
        _FORWARD_DEPTH.reset(token)
    try:
        result = _push_by_two_vjps(f, primals, tangents, has_aux)
    except Exception:
        result = None  # reverse mode fails too: the forward mode's error is raised
    if result is not None and not any(o.dtype.is_complex for o in result[0]):  # (J^T u: conjugate-linear in complex u)
        return result
    raise failed


def _push_by_two_vjps(f, primals, tangents, has_aux):
    """The JVP as the transpose of the VJP (real dtypes): ``J t`` is the gradient in ``u`` of ``<J^T u, t>``,
    which is linear in ``u`` (so ``u = 0`` serves)."""
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(primals)
        outputs, aux = _split(_call(f, primals), has_aux)
    us = [tf.zeros_like(o) for o in outputs]
    with tf.GradientTape(watch_accessed_variables=False) as transpose:
        transpose.watch(us)
        grads = tape.gradient(list(outputs), list(primals), output_gradients=us, unconnected_gradients=_ZERO)
        total = tf.zeros((), outputs[0].dtype) if outputs else None
        for g, p, t in zip(grads, primals, tangents):
            total = total + tf.cast(tf.reduce_sum(_dense(g, p) * t), total.dtype)
    if not outputs:
        return outputs, (), aux
    pushed = transpose.gradient(total, us, unconnected_gradients=_ZERO)
    return outputs, tuple(_dense(j, o) for j, o in zip(pushed, outputs)), aux


def _gradient(f, primals):
    """TensorFlow's gradient of the scalar ``f`` (its convention), dense, zeros where unconnected."""
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(primals)
        (output,) = _call(f, primals)
        output = _plain(output)
    grads = tape.gradient(output, list(primals), unconnected_gradients=_ZERO)
    return [_dense(g, p) for g, p in zip(grads, primals)]


def _hvp(f, primals, tangents):
    """Forward over reverse, conjugated for complex primals (the JAX convention). Where TensorFlow's forward
    mode fails over the gradient (``tf.scatter_nd``'s holds ``IndexedSlices``), real primals take reverse
    over reverse: ``H t`` is the gradient of ``<grad f, t>`` (``H`` is symmetric)."""
    try:
        with tf.autodiff.ForwardAccumulator(primals, tangents) as acc:
            grads = _gradient(f, primals)
        return tuple(_conj(_dense(acc.jvp(g, unconnected_gradients=_ZERO), g)) for g in grads)
    except Exception as exc:
        if any(p.dtype.is_complex for p in primals) or uses_traced_value(exc):
            raise
        failed = exc
    try:
        with tf.GradientTape(watch_accessed_variables=False) as outer:
            outer.watch(primals)
            total = tf.add_n([tf.reduce_sum(g * t) for g, t in zip(_gradient(f, primals), tangents)])
        return tuple(_dense(h, p) for h, p in zip(outer.gradient(total, list(primals), unconnected_gradients=_ZERO),
                                                  primals))
    except Exception:
        pass  # reverse over reverse fails too: the forward mode's error is raised
    raise failed


def _groups(arrays):
    """Indices of ``arrays`` grouped by dtype, in order of first appearance."""
    groups = {}
    for k, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(k)
    return list(groups.values())


def _concat_rows(arrays, batch):
    """``(B, n_1 + n_2 + ...)``: the arrays flattened per example and concatenated (no copy for one 2-D array)."""
    flat = [a if a.shape.rank == 2 else tf.reshape(a, (batch, _size(a) // max(batch, 1))) for a in arrays]
    return flat[0] if len(flat) == 1 else tf.concat(flat, axis=1)


def _assemble(blocks, outputs, primals, in_groups, out_groups, batch, conj):
    """Cut the ``(B, M, N)`` group blocks into ``jac[i][j]`` of shape ``(B, *out_i[1:], *in_j[1:])``.

    ``conj``: the blocks come from reverse mode, TensorFlow's conjugate convention for complex primals.
    """
    per_example = lambda a: _size(a) // max(batch, 1)  # noqa: E731
    out_groups = out_groups or [[i] for i in range(len(outputs))]
    jac = [[None] * len(primals) for _ in outputs]
    for h, out_group in enumerate(out_groups):
        for g, in_group in enumerate(in_groups):
            rows = tf.split(blocks[h, g], [per_example(outputs[i]) for i in out_group], axis=1)
            for i, row in zip(out_group, rows):
                for j, block in zip(in_group, tf.split(row, [per_example(primals[j]) for j in in_group], axis=2)):
                    shape = (batch, *outputs[i].shape[1:], *primals[j].shape[1:])
                    block = tf.reshape(block, shape)
                    jac[i][j] = _conj(block) if conj else block
    return tuple(tuple(row) for row in jac)


def _placed_on(x, where):
    device = x.device
    return device == where or device.endswith("device:" + where.lstrip("/"))


def _from_foreign(x):
    """A tensor from NumPy, a Python scalar, or another framework's array (DLPack, else through NumPy)."""
    if isinstance(x, (np.ndarray, np.generic, *_SCALARS, list, tuple)):
        return tf.convert_to_tensor(np.asarray(x))  # copies, whatever the strides
    if hasattr(x, "__dlpack__"):
        try:
            return _namespace.from_dlpack(x)
        except Exception:  # tensors that require grad, dtypes DLPack cannot carry...
            pass
        return tf.convert_to_tensor(np.asarray(unigrad.to_numpy(x)))
    return tf.convert_to_tensor(np.asarray(x))


for _name in ("vjp", "jvp", "jacrev", "jacfwd", "batched_jacobian", "per_example_jacobian", "value_and_grad",
              "hessian", "hvp", "vmap"):
    setattr(TensorflowBackend, _name, _outside_f(getattr(TensorflowBackend, _name)))
