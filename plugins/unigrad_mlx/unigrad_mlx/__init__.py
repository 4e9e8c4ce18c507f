"""``unigrad_mlx``: a unigrad backend over Apple MLX, built on unigrad's public contract only.

unigrad hands a backend *flat* functions (``f(*primals) -> tuple of arrays``) and flat tuples of its
own arrays; the core does pytrees, ``argnums``, ``has_aux``, conversions and every error. MLX has
the transforms themselves: ``mx.vjp`` and ``mx.jvp`` (true forward mode), ``mx.vmap``,
``mx.compile`` and ``mx.custom_function``, and they nest to any order. What this module adds:

* ``mx.vjp`` takes the cotangents together with the primals (there is no pullback to keep), so
  ``vjp`` evaluates ``f`` once for the outputs and ``vjp_fn`` runs ``mx.vjp`` at the primals for each
  call (MLX is lazy: the outputs' forward pass runs only when they are read).
* Complex numbers are not declared: MLX 0.32's VJPs of complex functions follow no one convention
  (``mx.multiply``, ``mx.exp``, ``mx.sin``... give the conjugate of unigrad's (JAX's), ``mx.power`` and the
  ``**`` operator give unigrad's own), so no conjugation at the boundary can make them all right, and
  ``z ** 2`` reaches MLX directly. unigrad refuses complex inputs on this backend rather than answer
  wrongly. Complex values *inside* ``f`` (real in, real out) still reach MLX: the conjugation below is
  what its primitives need, and the namespace's ``pow`` has rules of its own; MLX's ``**`` operator on a
  complex ``mx.array`` keeps MLX's defect (a wrong gradient: write ``xp.pow``).
* float64: MLX computes some float64 functions at float32 accuracy, so the backend does not declare
  ``float64`` and converts float64 inputs to float32, as ``mx.array`` does (see ``MlxBackend.capabilities``).
"""

from __future__ import annotations

import contextlib
import threading

import mlx.core as mx
import numpy as np

import unigrad
from unigrad.backend import TracedValueError, chunks

from . import _linalg, _namespace, _rules

# xp.linalg: built from the namespace's functions, so _linalg imports _namespace and the package joins
# them here (the namespace importing _linalg back would make the two a circle of imports).
_namespace.linalg = _linalg

__all__ = ["MlxBackend"]
__version__ = "0.1.0"

# MLX's graph transforms keep per-process state in C++ (the trace of a transform in progress); two
# threads differentiating at once gave wrong results in our runs (test_threads_give_exact_results).
# One re-entrant lock makes this backend's transforms take turns; nested transforms re-enter it.
_LOCK = threading.RLock()


def _conj(x):
    return mx.conj(x) if x.dtype == mx.complex64 else x


def _like(value, reference):
    """``value`` with ``reference``'s dtype (a gradient has its primal's dtype)."""
    if value.dtype == reference.dtype:
        return value
    return _namespace.astype(value, reference.dtype)


def _outputs(f, has_aux):
    """``f`` returning only its outputs, as the list MLX's transforms want, and the list its aux lands in."""
    aux_out = []

    def traced(*primals):
        result = f(*primals)
        outputs, aux = result if has_aux else (result, None)
        if has_aux:
            aux_out.append(tuple(mx.stop_gradient(a) if isinstance(a, mx.array) else a for a in aux))
        # a zero-size output as a constant: MLX's transforms do not walk back from it (the namespace's
        # _constant_if_empty says why; its derivative is empty whatever it was computed from)
        return [_namespace._constant_if_empty(o) for o in outputs]

    return traced, aux_out


def _join(arrays):
    """Arrays as one flat array (each flattened, in order; their common dtype)."""
    if len(arrays) == 1:
        return arrays[0]
    return mx.concatenate([mx.reshape(a, (-1,)) for a in arrays]) if arrays else mx.zeros((0,))


def _joined(traced):
    """``traced`` with its outputs as ONE array (:func:`_join`). ``mx.vjp`` of several outputs that are one
    array in MLX's graph (``f`` returning ``y`` twice; ``mx.sum`` of a 0-d ``y`` is ``y``) keeps only one of
    their cotangents (MLX 0.32.4: ``vjp(lambda x: [s, s], [x], [1, 10])`` gives 1, not 11): a wrong answer.
    Joined, each output is its own slice of a concatenation, whose VJP adds them up as it should."""
    def joined(*primals):
        return [_join(traced(*primals))]
    return joined


@contextlib.contextmanager
def _indices_said_plainly():
    """MLX's gather and scatter refuse to differentiate through indices that depend on a differentiated
    value. The namespace's integer results and ``take`` indices carry no derivative, so only indices made
    by MLX's own operators reach this: the ValueError says what to write instead. An operation without a JVP
    rule in MLX (scatter: the VJP of an indexing, which forward over reverse meets) raises a
    NotImplementedError (a RuntimeError, as MLX's) that names it and reverse mode as the way out."""
    try:
        yield
    except ValueError as exc:
        if "with respect to indices" not in str(exc):
            raise
        raise ValueError(
            "f indexes with an integer array computed from a differentiated value by MLX's own operators "
            "(x[i], mx.take, x.at[i]); indices carry no derivative, but MLX cannot differentiate through "
            "them: compute them with the namespace (xp.argsort, xp.astype, ...), index with xp.take / "
            f"xp.take_along_axis, or write mx.stop_gradient(i). MLX said: {exc}") from exc
    except RuntimeError as exc:
        if "JVP not yet implemented" not in str(exc):
            raise
        op = str(exc).split("]")[0].lstrip("[") if str(exc).startswith("[") else "an operation"
        raise NotImplementedError(
            f"forward mode cannot differentiate f on MLX {mx.__version__}: MLX has no JVP rule for {op} (an indexing "
            f"x[i] in f scatters in its VJP, so forward over reverse meets a scatter). Use reverse mode: jacrev or "
            f"jacobian(mode='rev'), hessian(mode='rev-rev'), or mode='auto', which falls back to reverse mode by "
            f"itself. MLX said: {exc}") from exc


class MlxBackend(unigrad.Backend):
    """Apple MLX: reverse and forward mode, vmap, compile and custom rules, to any order, on the CPU."""

    # The name users select it by; unigrad's registry knows the backend by its entry-point name
    # (pyproject.toml): keep the two equal.
    name = "mlx"
    array_modules = ("mlx",)
    # float64 False: MLX holds float64 arrays on the CPU (its GPUs have none), but its CPU kernels compute
    # sin, cos, exp and erf of float64 at float32 accuracy (relative errors 5e-8 to 2e-7, measured in
    # tests/test_mlx.py), so float64 is not "computed in float64". As MLX itself does, asarray turns
    # NumPy float64 into float32 (and complex128 into complex64, MLX's only complex type).
    # complex False: MLX's complex VJPs disagree with each other on the convention (see the module's text).
    capabilities = unigrad.Capabilities(forward_mode=True, vmap=True, compile=True, higher_order=True,
                                        complex=False, float64=False, custom_rules=True)
    # An mx.array can be written in place (x[...] = v), so the core hands vjp copies.
    mutable_arrays = True
    # MLX's LU (LUF) has no batching rule, its inverse has: unigrad.linear_solve's symbolic dense solve inverts
    solve_under_vmap = False

    def namespace(self):
        return _namespace

    def version(self):
        from importlib.metadata import version

        return version("mlx")

    def asarray(self, x, dtype=None, device=None):
        return _namespace.asarray(x, dtype=dtype, device=device)

    def to_numpy(self, x):
        """A NumPy copy of ``x`` (bfloat16 as ``ml_dtypes.bfloat16`` where available, else float32: NumPy
        has no bfloat16 of its own)."""
        if not isinstance(x, mx.array):
            return np.asarray(x)
        if x.size == 0:
            # nothing to read, so nothing is evaluated: MLX 0.32.4's CPU kernels, run on some graphs of
            # zero-size arrays (derivatives broadcast into an empty shape), died of a floating-point
            # exception or spun without end in our runs of the conformance suite's random programs
            return np.zeros(x.shape, dtype=_namespace.numpy_dtype(x.dtype))
        if x.dtype == mx.bfloat16:
            dtype = _namespace.numpy_dtype(x.dtype)  # ml_dtypes' bfloat16, else float32
            if dtype == np.float32:
                return np.array(x.astype(mx.float32))
            return np.array(x.view(mx.uint16)).view(dtype)
        return np.array(x, copy=True)

    def is_array(self, x):
        return isinstance(x, mx.array)

    def devices(self):
        return ("cpu",)

    def device(self, x):
        return "cpu"

    def copy(self, x):
        return mx.array(x)

    def stop_gradient(self, x):
        return mx.stop_gradient(x)

    def transforms_tracing(self):
        """The kinds (``"vjp"``, ``"jvp"``, ``"vmap"``, ``"compile"``) of this backend's transforms tracing the
        code that runs now, outermost first (no ``"vjp"`` or ``"jvp"`` at first order: a custom rule's
        derivative pass runs after its transform's function has returned). ``unigrad.implicit`` reads it: in a
        derivative pass an enclosing ``"vjp"`` / ``"jvp"`` differentiates, its rules read no value and their nested
        transforms close over nothing (docs/implicit.md). MLX's own transforms called directly (``mx.grad``) are not
        seen."""
        return _rules.TRACING.get()

    def apply_rule(self, rule, arrays):
        """A ``mx.custom_function`` made for this call, whose ``vjp`` and ``jvp`` call the rule (``_rules``)."""
        return _rules.apply_rule(rule, arrays)

    def dependence_program(self, f, primals, *, has_aux=False, unknown=()):
        """``f``'s program read from ``mx.export_function`` in ``unigrad.dependence``'s form (``_dependence``):
        for code written with ``mlx.core`` itself, proofs of independent rows for ``batched_jacobian``
        and sparsity patterns for ``jacobian_sparsity`` / ``sparse_jacobian``."""
        from ._dependence import export_program

        with _LOCK:
            return export_program(f, tuple(primals), has_aux=has_aux, unknown=unknown)

    # ------------------------------------------------------------------ transforms

    def vjp(self, f, primals, *, has_aux=False):
        primals = tuple(primals)
        traced, aux_out = _outputs(f, has_aux)
        with _LOCK:
            outputs = tuple(traced(*primals))

        def vjp_fn(cotangents):
            cts = [_conj(c) for c in cotangents]
            with _LOCK, _indices_said_plainly():
                _, grads = mx.vjp(_rules.traced_by("vjp", _joined(traced)), list(primals), [_join(cts)])
            return tuple(_like(_conj(g), p) for g, p in zip(grads, primals))

        return outputs, vjp_fn, (aux_out[0] if has_aux else None)

    def jvp(self, f, primals, tangents, *, has_aux=False):
        traced, aux_out = _outputs(f, has_aux)
        with _LOCK, _indices_said_plainly():
            outputs, tangents_out = mx.jvp(_rules.traced_by("jvp", traced), list(primals), list(tangents))
        tangents_out = tuple(_like(t, o) for t, o in zip(tangents_out, outputs))
        return tuple(outputs), tangents_out, (aux_out[-1] if has_aux else None)

    def vmap(self, f, in_axes, out_axes=0, chunk_size=None):
        in_axes = tuple(in_axes)

        def run(*args):
            return tuple(f(*args))

        mapped = mx.vmap(_rules.traced_by("vmap", run), in_axes=in_axes, out_axes=out_axes)
        if chunk_size is None:
            def whole(*args):
                with _LOCK:
                    return mapped(*args)
            return whole

        def chunked(*args):
            sizes = {a.shape[ax] for a, ax in zip(args, in_axes) if ax is not None}
            if len(sizes) != 1:
                raise ValueError(f"vmap: mapped axes must all have one size; got sizes {sorted(sizes)}")
            (size,) = sizes
            pieces = []
            with _LOCK:
                for start, stop in chunks(size, chunk_size) or [(0, 0)]:
                    part = [a if ax is None else _slice(a, ax, start, stop) for a, ax in zip(args, in_axes)]
                    pieces.append(mapped(*part))
            if len(pieces) == 1:
                return pieces[0]
            return tuple(mx.concatenate([p[k] for p in pieces], axis=out_axes) for k in range(len(pieces[0])))

        return chunked

    def compile(self, fn, weak_scalars=()):
        # mx.compile traces fn once per signature (shapes, dtypes); Python numbers among the arguments
        # are constants of the program (MLX compiles again for a new value: the answer stays right).
        compiled = mx.compile(_rules.traced_by("compile", fn))

        def run(*args):
            try:
                with _LOCK:
                    return compiled(*args)
            except ValueError as exc:
                if "eval" in str(exc) and ("compile" in str(exc) or "transformations" in str(exc)):
                    raise TracedValueError(f"f reads the value of an array traced by mx.compile: {exc}") from exc
                raise

        return run


def _slice(a, axis, start, stop):
    index = [slice(None)] * a.ndim
    index[axis] = slice(start, stop)
    return a[tuple(index)]
