"""unigrad's JAX backend: ``jax.vjp`` / ``jax.jvp`` / ``jax.vmap`` / ``jax.jit`` behind the unigrad contract.

JAX's own conventions are the house conventions (complex gradients, zeros for
unused inputs), so the adapter mostly passes through. Its namespace (``_namespace``) is
``jax.numpy`` but for ``pow``, ``abs``, ``clip`` and ``linalg.vector_norm``, whose derivatives at
their kinks follow the other backends (docs/conventions.md). The one thing it adds
is float64 without a global switch: JAX truncates 64-bit values to 32 bits
unless ``jax_enable_x64`` is on. Flipping that flag would change every other
JAX user in the process, so transforms, conversions and compiled calls run
inside the scoped, thread-local ``jax.enable_x64(True)`` context instead, and
only when one rule says so:

  A call runs under x64 iff some *floating-point or complex* input array of the
  call is 64-bit (float64, complex128): a differentiated input, a tangent or
  cotangent, or a non-differentiated array argument (which reaches the adapter
  as ``f.closure_arrays`` of the flat function, or as an argument of a compiled
  program). Integer arrays never decide.

Eager and compiled calls follow the same rule, so they compute in the same
precision. It is NumPy's and torch's promotion: float32 data with int64 labels
computes in float32 (JAX then computes the labels in int32, as it does without
x64: integer values beyond the int32 range are not kept), and one float64 array
makes the whole call float64.

Conversions (``asarray``, ``cast``, ``zeros``...) keep every dtype exactly,
int64 included.

Limitation: a float64 JAX array that ``f`` closes over by itself (not an
argument of the transformed call), with 32-bit inputs, is computed as JAX
computes it without x64: in 32 bits. So is code the user runs on float64 JAX
arrays outside unigrad's transforms.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import unigrad
from unigrad import Backend, Capabilities
from unigrad.backend import chunks

from . import _host, _rules, _sparse
from . import _namespace as _jax_namespace

__all__ = ["JaxBackend"]

from ._broadcasts import forward_layout, linear_map, repeated_basis, reverse_layout
from ._x64scope import _NO_CONTEXT, _WIDE_CHARS, _WIDE_FLOAT_CHARS, _wide, _x64, _x64_dtypes, copying, in_x64  # noqa: F401


def _numpy_calls_rejected(method):
    """``method`` with JAX's error for a NumPy function called on a traced value inside ``f``
    (``np.median(x)``: ``TracerArrayConversionError``) turned into a TypeError that says what to use."""
    @functools.wraps(method)
    def checked(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except jax.errors.TracerArrayConversionError as exc:
            raise _numpy_call_error() from exc

    return checked


def _numpy_call_error():
    return TypeError(
        "a NumPy function (np.median, np.asarray...) was called inside the function on a JAX array "
        "that unigrad is differentiating, mapping or compiling: NumPy cannot carry its derivative. "
        "Use the array namespace instead: xp = unigrad.namespace(x); xp.median(x)")


def _traced(arrays) -> bool:
    """True when we are inside another trace (jit, vmap, grad): chunk loops must be traced loops."""
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def _offsets(sizes):
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out, total


class _Basis:
    """The unit vectors of a concatenation of flattened blocks, handed out split back into the blocks.

    ``templates`` describe the blocks (``_templates``: the outputs for reverse
    mode, the inputs for forward mode; one example's part of them for the sum trick, where ``batch``
    repeats every unit vector over a leading batch axis: one cotangent/tangent per example at once).
    ``rows`` are ``Backend.unit_basis``'s; what JAX adds is ``one_hot`` and the traced chunk loop of
    ``map``.
    """

    def __init__(self, backend, templates, batch=None):
        self.backend, self.templates, self.batch = backend, tuple(templates), batch
        self.shapes = [tuple(t.shape) for t in self.templates]
        self.dtypes = [t.dtype for t in self.templates]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.offsets, self.n = _offsets(self.sizes)

    def rows(self, start, stop):
        """Unit vectors ``start..stop-1``: per block ``(stop - start, [batch,] *shape)`` (as ``jax.jacrev``)."""
        rows = self.backend.unit_basis(self.templates, start, stop)
        if self.batch is None:
            return rows
        return tuple(jnp.broadcast_to(r[:, None], (stop - start, self.batch, *shape))
                     for r, shape in zip(rows, self.shapes))

    def one_hot(self, k):
        """Unit vector ``k`` (a traced index), per block ``([batch,] *shape)``: O(size) memory per vector."""
        blocks = []
        for shape, size, dtype, offset in zip(self.shapes, self.sizes, self.dtypes, self.offsets):
            block = jnp.reshape((jnp.arange(size) == k - offset).astype(dtype), shape)
            blocks.append(block if self.batch is None else jnp.broadcast_to(block, (self.batch, *shape)))
        return tuple(blocks)

    def map(self, fn, chunk_size, traced):
        """``fn(*unit_vector)`` for every unit vector, stacked on a new leading axis (``fn`` returns a tuple).

        Vectorised with ``jax.vmap``; with ``chunk_size``, at most that many at a time: a traced loop
        (``lax.map`` with ``batch_size``) inside jit or another transform, a Python loop over vmapped
        chunks in eager mode (where ``lax.map`` would compile a new scan on every call).
        """
        n = self.n
        if chunk_size is None or chunk_size >= n:
            return tuple(jax.vmap(fn)(*self.rows(0, n)))
        if traced:
            return tuple(lax.map(lambda k: fn(*self.one_hot(k)), jnp.arange(n), batch_size=chunk_size))
        pieces = [jax.vmap(fn)(*self.rows(start, stop)) for start, stop in chunks(n, chunk_size)]
        return tuple(jnp.concatenate([p[i] for p in pieces], axis=0) for i in range(len(pieces[0])))


def _arrays_only_aux(f):
    """``f`` with its aux reduced to its array leaves (vmap cannot return strings or floats).

    Returns ``(g, restore)``: ``restore(array_aux)`` puts the other leaves back in place.
    """
    kept = {}

    def g(*primals):
        outputs, aux = f(*primals)
        kept["aux"] = tuple(aux)
        return tuple(outputs), tuple(a for a in aux if isinstance(a, jax.Array))

    def restore(array_aux):
        arrays = iter(array_aux)
        return tuple(next(arrays) if isinstance(a, jax.Array) else a for a in kept["aux"])

    return g, restore


_SPECIAL = frozenset({"gammaln", "digamma", "polygamma", "erf", "erfc", "erfinv", "ndtr", "log_ndtr", "ndtri", "expit",
                      "logit", "xlogy", "xlog1py", "i0e", "i1e", "betaln", "multigammaln"})


class JaxBackend(Backend):
    """The JAX backend: native ``vjp``/``jvp``, vmapped Jacobians, ``jit``, float64 via scoped x64."""

    name = "jax"
    array_modules = ("jax", "jaxlib")  # concrete arrays live in jaxlib, tracers in jax._src
    capabilities = Capabilities(forward_mode=True, vmap=True, compile=True, higher_order=True,
                                complex=True, float64=True, custom_rules=True)
    accepts_dlpack = True  # asarray takes objects with __dlpack__ (torch tensors...) directly
    mutable_arrays = False  # immutable arrays: vjp_fn cannot see a caller's write
    # the abstract value: shape, dtype and weak type in one attribute (shape and dtype are properties over it)
    signature_attribute = "aval"

    def special(self, name):
        from jax.scipy import special

        return getattr(special, name, None) if name in _SPECIAL else None

    # ------------------------------------------------------------------ arrays
    def namespace(self):
        """``jax.numpy`` with unigrad's derivatives at a few non-differentiable points (``_namespace``)."""
        return _jax_namespace

    def version(self):
        return jax.__version__

    def is_array(self, x):
        return isinstance(x, jax.Array)  # tracers are registered as jax.Array too

    def devices(self):
        names = ["cpu"]
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:  # no GPU backend in this jaxlib
            gpus = []
        names += [f"cuda:{i}" for i in range(len(gpus))]
        return tuple(names)

    def _device(self, device):
        """A unigrad device string ("cpu", "cuda", "cuda:1", "gpu", "gpu:1"), a jax.Device or a sharding
        (what ``device(x)`` returns for an array spread over several devices) -> where to place."""
        if isinstance(device, (jax.Device, jax.sharding.Sharding)):
            return device
        if not isinstance(device, str):
            raise TypeError(f"device must be a device name like 'cpu' or 'cuda:0', or a jax.Device; "
                            f"got {type(device).__name__}")
        kind, _, index = device.lower().partition(":")
        if kind == "cpu":
            found = jax.devices("cpu")
        elif kind in ("cuda", "gpu"):
            try:
                found = jax.devices("gpu")
            except RuntimeError:
                found = []
        else:
            raise ValueError(f"unknown device {device!r}; the jax backend has {list(self.devices())}")
        try:
            i = int(index) if index else 0
        except ValueError:
            raise ValueError(f"unknown device {device!r}; the jax backend has {list(self.devices())}") from None
        if not 0 <= i < len(found):
            raise ValueError(f"device {device!r} is not available; the jax backend has {list(self.devices())}")
        return found[i]

    def device(self, x):
        """The jax.Device holding ``x``; None for a traced value (the trace decides placement) and for a
        ``jax.ShapeDtypeStruct`` (a template of the unit basis of one example)."""
        if isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct)):
            return None
        devices = x.devices()
        return next(iter(devices)) if len(devices) == 1 else x.sharding

    def asarray(self, x, dtype=None, device=None):
        target = None if dtype is None else jnp.dtype(dtype)
        place = None if device is None else self._device(device)
        if isinstance(x, jax.core.Tracer):  # inside a transform: placement belongs to the trace
            return x if target is None or x.dtype == target else self.cast(x, target.name)
        if not isinstance(x, jax.Array):
            x = self._import(x)
        if target is not None and x.dtype != target:
            x = self.cast(x, target.name)
        if isinstance(place, jax.sharding.Sharding):  # keep a batch sharded as its reference is
            if x.sharding != place:
                x = jax.device_put(x, place)
        elif place is not None and place not in x.devices():
            x = jax.device_put(x, place)
        return x

    def _import(self, x):
        """A jax array from NumPy data, a Python scalar or list, or another framework's array.

        Always under x64, so the dtype is kept exactly (int64 stays int64, float64 stays float64).
        Non-native byte order (``'>f8'`` on a little-endian machine), which JAX rejects, is converted
        to native order, values kept.
        """
        with jax.enable_x64(True):
            if not isinstance(x, (np.ndarray, np.generic)) and hasattr(x, "__dlpack__"):
                try:
                    return jnp.from_dlpack(x)  # zero-copy where the producer allows it
                except Exception:  # e.g. a torch tensor that requires grad, negative strides, another device
                    x = unigrad.to_numpy(x)
            x = np.asarray(x)
            if not x.dtype.isnative:
                x = x.astype(x.dtype.newbyteorder("="))
            return jnp.asarray(x)

    def to_numpy(self, x):
        return np.asarray(x)

    def shape(self, x):
        return tuple(x.shape)

    def cast(self, x, dtype):
        target = jnp.dtype(dtype)
        with _x64_dtypes(x.dtype, target):
            return x.astype(target)

    def zeros_like(self, x):
        with _x64_dtypes(x.dtype):
            return jnp.zeros_like(x)

    def ones_like(self, x):
        with _x64_dtypes(x.dtype):
            return jnp.ones_like(x)

    def zeros(self, shape, dtype, device=None):
        target = jnp.dtype(dtype)
        with _x64_dtypes(target):
            out = jnp.zeros(tuple(shape), dtype=target)
            return out if device is None else jax.device_put(out, device)

    def stop_gradient(self, x):
        with _x64_dtypes(x.dtype):
            return lax.stop_gradient(x)

    def apply_rule(self, rule, arrays):
        """``jax.custom_vjp`` or ``jax.custom_jvp``, chosen by the mode that meets the call (``_rules``)."""
        return _rules.apply_rule(rule, arrays)

    @_numpy_calls_rejected
    def evaluate(self, f, primals):
        """``f(*primals)`` outside any transform, under x64 by the module's rule (a 64-bit floating
        primal or closure array).

        The core's plain forward evaluations go through it (``Backend.evaluate``).
        """
        primals = tuple(primals)
        with _x64(f, primals):
            return f(*primals)

    def output_shapes(self, f, primals, has_aux=False):
        """The outputs' shapes from a trace (``jax.eval_shape``): nothing computed, and none of the
        op-by-op compilations an eager first evaluation costs. An ``f`` that cannot be traced (it reads
        values) is evaluated."""
        primals = tuple(primals)

        def outputs(*p):
            result = f(*p)
            return tuple(result[0]) if has_aux else tuple(result)

        try:
            with _x64(f, primals):
                shapes = jax.eval_shape(outputs, *primals)
        except Exception:
            return super().output_shapes(f, primals, has_aux)
        return tuple(tuple(s.shape) for s in shapes)

    # ------------------------------------------------------------------ vjp / jvp
    @_numpy_calls_rejected
    def vjp(self, f, primals, *, has_aux=False):
        primals = tuple(primals)
        with _x64(f, primals):
            outputs, pullback, aux = _jax_vjp(f, primals, has_aux)

        def vjp_fn(cotangents):
            cotangents = tuple(cotangents)
            with _x64(f, primals, cotangents):
                return tuple(pullback(_like(cotangents, outputs)))

        return outputs, vjp_fn, aux

    @_numpy_calls_rejected
    def jvp(self, f, primals, tangents, *, has_aux=False):
        primals, tangents = tuple(primals), tuple(tangents)
        with _x64(f, primals, tangents):
            tangents = _like(tangents, primals)
            if has_aux:
                outputs, tangents_out, aux = jax.jvp(f, primals, tangents, has_aux=True)
            else:
                (outputs, tangents_out), aux = jax.jvp(f, primals, tangents), None
        return tuple(outputs), tuple(tangents_out), aux

    # ------------------------------------------------------------------ Jacobians
    @_numpy_calls_rejected
    def jacrev(self, f, primals, *, chunk_size=None, has_aux=False):
        """One VJP, its pullback vmapped over the unit cotangents (``chunk_size`` at a time)."""
        primals = tuple(primals)
        with _x64(f, primals):
            outputs, pullback, aux = _jax_vjp(f, primals, has_aux)
            basis = _Basis(self, _templates(outputs))
            rows = basis.map(lambda *g: tuple(pullback(g)), chunk_size, _traced(primals))  # (n_out, *primal.shape)
            jac = tuple(tuple(jnp.reshape(rows[j][offset:offset + o.size], (*o.shape, *p.shape))
                              for j, p in enumerate(primals))
                        for o, offset in zip(outputs, basis.offsets))
        return outputs, jac, aux

    @_numpy_calls_rejected
    def jacfwd(self, f, primals, *, chunk_size=None, has_aux=False):
        """JVPs vmapped over the unit tangents (``chunk_size`` at a time)."""
        primals = tuple(primals)
        with _x64(f, primals):
            basis = _Basis(self, _templates(primals))
            outputs, columns, aux = _push_basis(f, primals, basis, chunk_size, has_aux)
            jac = []
            for o, column in zip(outputs, columns):  # column: (n_in, *o.shape)
                t = jnp.reshape(column, (basis.n, o.size)).T
                jac.append(tuple(jnp.reshape(t[:, offset:offset + p.size], (*o.shape, *p.shape))
                                 for p, offset in zip(primals, basis.offsets)))
        return outputs, tuple(jac), aux

    @_numpy_calls_rejected
    def batched_jacobian(self, f, primals, *, mode="rev", chunk_size=None, has_aux=False):
        """Per-example Jacobians by the sum trick, vectorised over the per-example size, never over B.

        ``f`` is a batch function (the core checks every call maps the whole batch to a batch), so
        the method exact for any ``f`` with independent rows is used; see :func:`_sum_trick`.
        Under jit, each unit vector is held once, not once per example, and the products run batch-major
        (``_broadcasts``): measured against JAX's own ``vmap(jacrev(f_one))`` / ``vmap(jacfwd(f_one))`` on
        MLPs 32-64-16 (batch 256), 0.99-1.09x in both modes (docs/performance.md), so the core takes this
        exact method wherever the rows are proved independent (``forward_sum_trick_folds``).
        """
        primals = tuple(primals)
        with _x64(f, primals):
            return _sum_trick(self, f, primals, primals[0].shape[0], mode, chunk_size, has_aux, _traced(primals))

    #: per_example_jacobian takes probe= (tangents in forward mode, cotangents in reverse) and returns, with the
    #: blocks, the one-example function's JVP (VJP) along them (unigrad._answer_check.probed_kernel checks the
    #: shortcut with it)
    per_example_probe = True
    #: the sum trick holds each unit tangent once, not once per example (_broadcasts), as fast in forward mode as
    #: computing one example alone: the core takes it wherever the rows are proved independent
    forward_sum_trick_folds = True

    @_numpy_calls_rejected
    def per_example_jacobian(self, f, primals, *, mode="rev", chunk_size=None, has_aux=False, probe=None):
        """``jax.vmap`` over examples of the Jacobian of a batch-of-one call: JAX's own
        ``vmap(jacrev(f_single))`` (``jacfwd`` in forward mode). The core takes it only where the user
        declares ``separable=True`` and no proof is exact (a custom rule, ``check_independence="never"``),
        and checks its answer unless told never to. Chunked or with aux: the sum trick.
        """
        primals = tuple(primals)

        def summed():  # the sum trick (and no products along a probe: the core checks the blocks instead)
            result = self.batched_jacobian(f, primals, mode=mode, chunk_size=chunk_size, has_aux=has_aux)
            return result if probe is None else (*result, None)

        if has_aux or chunk_size is not None:
            return summed()
        n = len(primals)

        def one(*example):  # one example of every primal -> one example of every output
            return tuple(o[0] for o in f(*(p[None] for p in example)))

        def jacobian_one(*example, probe_one=None):
            """One example's outputs and Jacobian; with ``probe_one`` (that example's part of the probe), also
            the product along it: in reverse mode one more pullback of the same forward pass, in forward mode
            a JVP."""
            if mode == "fwd":
                outputs = one(*example)
                jac = jax.jacfwd(one, argnums=tuple(range(n)))(*example)
                if probe_one is None:
                    return outputs, jac
                return outputs, jac, tuple(jax.jvp(one, tuple(example), tuple(probe_one))[1])
            outputs, pullback = jax.vjp(one, *example)
            basis = _Basis(self, _templates(outputs))
            rows = jax.vmap(lambda *g: tuple(pullback(g)))(*basis.rows(0, basis.n))  # per primal (n_out, *p)
            jac = tuple(tuple(jnp.reshape(rows[j][offset:offset + size], (*shape, *example[j].shape))
                              for j in range(n))
                        for shape, size, offset in zip(basis.shapes, basis.sizes, basis.offsets))
            if probe_one is None:
                return outputs, jac
            # (a pullback of its own: a row added to the basis would hide its identity from XLA, which folds
            # it into the first product)
            return outputs, jac, tuple(pullback(_like(tuple(probe_one), outputs)))

        if probe is not None:  # the one-example function's product along the probe, beside its Jacobian
            with _x64(f, primals):
                outputs, jac, along = jax.vmap(lambda example, p: jacobian_one(*example, probe_one=p))(
                    primals, tuple(probe))
            return tuple(outputs), tuple(tuple(row) for row in jac), None, tuple(along)
        with _x64(f, primals):
            outputs, jac = jax.vmap(jacobian_one)(*primals)
        return tuple(outputs), tuple(tuple(row) for row in jac), None

    #: per_example_rows takes directions= (norms come with each example's <g_i, V>: unigrad.per_example checks them)
    per_example_directions = True

    def per_example_rows(self, f, primals, batch, *, norms=False, fname="per_example_grad", memo=None,
                         directions=None, weights=None):
        """Per-example gradients read from ``f``'s jaxpr: dense layers by their rules (``_per_example``)."""
        from ._per_example import jax_rows
        return jax_rows(self, f, tuple(primals), batch, norms, fname, directions, weights)

    def dependence_program(self, f, primals, *, has_aux=False, unknown=()):
        """``f``'s jaxpr in ``unigrad.dependence``'s form (``_dependence``): JAX-native code's sparsity patterns;
        loops with a known trip count unrolled where small."""
        from ._dependence import from_closed_jaxpr
        from ._proof import closed_jaxpr

        _, closed = closed_jaxpr(f, tuple(primals), has_aux)
        return from_closed_jaxpr(closed, unroll=True, unknown={id(a) for a in unknown})

    def batch_rows(self, f, primals, *, has_aux=False):
        """Rows of ``f`` proved from its jaxpr: ``(verdict, detail, False)`` (see ``_proof``: never a shortcut)."""
        from ._proof import batch_rows
        return batch_rows(self, f, tuple(primals), has_aux)

    # ------------------------------------------------------------------ second order
    @_numpy_calls_rejected
    def hessian(self, f, primals, *, chunk_size=None):
        """``jacfwd`` of ``jax.grad``: forward over reverse, ``chunk_size`` tangents at a time."""
        primals = tuple(primals)
        argnums = tuple(range(len(primals)))
        gradient = jax.grad(lambda *p: f(*p)[0], argnums=argnums)
        with _x64(f, primals):  # the wrapper below no longer carries f's closure arrays
            _, jac, _ = self.jacfwd(lambda *p: tuple(gradient(*p)), primals, chunk_size=chunk_size)
        return jac

    @_numpy_calls_rejected
    def hvp(self, f, primals, tangents):
        """``jax.jvp`` of ``jax.grad``: one forward-over-reverse sweep, no Hessian."""
        primals, tangents = tuple(primals), tuple(tangents)
        gradient = jax.grad(lambda *p: f(*p)[0], argnums=tuple(range(len(primals))))
        with _x64(f, primals, tangents):
            _, hv = jax.jvp(gradient, primals, _like(tangents, primals))
        return tuple(hv)

    def while_loop(self, cond, body, state):
        """``jax.lax.while_loop``: a loop in a compiled program or under ``vmap`` (``unigrad.linear_solve``'s CG
        on symbolic values, where a Python loop cannot read its residual)."""
        return lax.while_loop(cond, body, state)

    def checkpoint(self, f, primals):
        """``jax.checkpoint`` of the block (``unigrad.checkpoint``): its residuals are recomputed in the
        backward pass. JAX traces the values ``f`` closes over as inputs, so closures work."""
        primals = tuple(primals)
        with _x64(f, primals):
            return tuple(jax.checkpoint(lambda *p: tuple(f(*p)))(*primals))

    # ------------------------------------------------------------------ vmap / compile
    def vmap(self, f, in_axes, out_axes=0, chunk_size=None):
        in_axes = tuple(in_axes)
        vectorised = jax.vmap(lambda *a: tuple(f(*a)), in_axes=in_axes, out_axes=out_axes)

        @_numpy_calls_rejected
        def mapped(*args):
            with _x64(f, args):
                size = next(a.shape[ax] for a, ax in zip(args, in_axes) if ax is not None)
                if chunk_size is None or chunk_size >= size:
                    return tuple(vectorised(*args))
                return _chunked_vmap(f, args, in_axes, out_axes, chunk_size)

        return mapped

    def compile(self, fn, weak_scalars=()):
        """``jax.jit(fn)``, traced and run under x64 by the module's rule: when a floating or complex
        argument is 64-bit (the compiled program receives every array of the call as an argument;
        integer arguments never decide; Python floats, ``weak_scalars``, never do either: jit traces
        them as weakly typed scalars, so a new value reuses the program). jit caches per x64 state."""
        jitted = jax.jit(fn)
        closure = getattr(fn, "closure_arrays", ())
        wide_closure = _wide(closure)

        @functools.wraps(fn)
        def compiled(*args):  # the hot path of every compiled call: no context manager (nor config read) unless needed
            try:
                if wide_closure or _wide(args):
                    return in_x64(jitted, args)
                return jitted(*args)
            except jax.errors.TracerArrayConversionError as exc:
                raise _numpy_call_error() from exc

        def specialize(args, copies=()):
            """``(fn, translate)`` for calls whose arguments have the types, shapes and dtypes of ``args``:
            ``fn`` is the jitted function itself when neither they nor the closure are 64-bit (then x64
            does not apply, whatever the configuration says), and ``translate(exc)`` is the error to
            raise instead of an error ``fn`` raised (None: raise it as it is). For 64-bit arguments ``fn``
            enters the x64 scope without testing them again (a repeat's float64 NumPy input: issue 37).
            ``copies``: positions of NumPy arrays ``fn`` hands the program a copy of (the core's
            ``Program.flat_runner``), in the same frame."""
            x64 = bool(wide_closure or _wide(args))
            if copies:
                return copying(jitted, tuple(copies), x64), _translate
            return (wide if x64 else jitted), _translate

        def wide(*args):
            return in_x64(jitted, args)

        compiled.specialize = specialize
        compiled.specialize_copies = True
        compiled.takes_numpy = True  # jit takes NumPy arrays as jnp.asarray converts them (float64 under x64)
        return compiled

    # ------------------------------------------------------------------ bridge and sparse results
    # (the contract's hooks for unigrad.bridge and the sparse transforms: _host, _sparse)
    primals_from_jvp_rule = True  # a custom_jvp's outputs are its rule's primal outputs, unbatched under vmap

    def host_callback(self, fn, arrays, out_specs, *, jvp=None):
        """``jax.pure_callback`` in a ``jax.custom_jvp`` whose rule is ``jvp`` (see ``_host``)."""
        return _host.host_callback(fn, arrays, out_specs, jvp)

    def sparse_matrix(self, values, structure, format, fname):
        """``BCOO`` (``"auto"``, ``"coo"``) or ``BCSR`` (``"csr"``); ``"csc"``: a ValueError (see ``_sparse``)."""
        return _sparse.sparse_matrix(values, structure, format, fname)

    def sparse_finisher(self, values, structure, format, fname):
        """A ``BCOO`` from its parts for values like ``values``, after one checked construction."""
        return _sparse.sparse_finisher(values, structure, format, fname)

    def dense_matrix(self, values, structure):
        """One ``jax.jit`` scatter per plan."""
        return _sparse.dense_matrix(values, structure)

    def sparse_to_numpy(self, matrix):
        return _sparse.sparse_to_numpy(matrix)


# ---------------------------------------------------------------------------------------------
# Helpers of the transforms
# ---------------------------------------------------------------------------------------------

def _translate(exc):
    """The error a compiled function raises instead of ``exc`` (see ``JaxBackend.compile``), or None."""
    return _numpy_call_error() if isinstance(exc, jax.errors.TracerArrayConversionError) else None


def _jax_vjp(f, primals, has_aux):
    if has_aux:
        outputs, pullback, aux = jax.vjp(f, *primals, has_aux=True)
        return tuple(outputs), pullback, tuple(aux)
    outputs, pullback = jax.vjp(f, *primals)
    return tuple(outputs), pullback, None


def _like(values, references):
    """``values`` cast to the references' dtypes where they differ (JAX rejects a dtype mismatch)."""
    return tuple(v if v.dtype == r.dtype else v.astype(r.dtype) for v, r in zip(values, references))


def _push_basis(f, primals, basis, chunk_size, has_aux):
    """``(outputs, columns, aux)``: every unit tangent of ``basis`` pushed forward through ``f``.

    ``columns`` holds per output an array ``(basis.n, *out.shape)``.
    """
    g, restore = _arrays_only_aux(f) if has_aux else (f, None)
    if chunk_size is None or chunk_size >= basis.n:
        # One vmapped jvp with the primal outputs unbatched, as jax.jacfwd does.
        result = jax.vmap(lambda *t: jax.jvp(g, primals, t, has_aux=has_aux),
                          out_axes=(None, 0, None) if has_aux else (None, 0))(*basis.rows(0, basis.n))
        return tuple(result[0]), tuple(result[1]), restore(result[2]) if has_aux else None
    # Chunks: linearize once (one forward pass), then push each chunk through the linear map.
    outputs, push, aux = _linearized(f, primals, has_aux)
    return outputs, basis.map(lambda *t: tuple(push(*t)), chunk_size, _traced(primals)), aux


def _linearized(f, primals, has_aux):
    """``(outputs, push, aux)``: ``jax.linearize`` of ``f`` (one forward pass), its aux's non-array leaves kept."""
    g, restore = _arrays_only_aux(f) if has_aux else (f, None)
    if has_aux:
        outputs, push, aux = jax.linearize(g, *primals, has_aux=True)
        return tuple(outputs), push, restore(aux)
    outputs, push = jax.linearize(g, *primals)
    return tuple(outputs), push, None


def _sum_trick(backend, f, primals, batch, mode, chunk_size, has_aux, traced):
    """Per-example Jacobians of a batch function with independent rows, exact for any such ``f``.

    Reverse: the k-th unit cotangent of every example at once, pulled back in one VJP, gives row k
    of every example's Jacobian (rows are independent, so nothing mixes); vmapped over k.
    Forward: the k-th unit tangent of every example, pushed forward, gives column k.
    """
    if mode == "fwd":
        basis = _Basis(backend, _templates(primals, example=True), batch)
        if traced and (chunk_size is None or chunk_size >= basis.n):
            return _push_laid_out(backend, f, primals, basis, batch, has_aux)
        outputs, columns, aux = _push_basis(f, primals, basis, chunk_size, has_aux)
        _check_batch(outputs, batch)
        jac = []
        for o, column in zip(outputs, columns):  # column: (n_in, B, *o.shape[1:])
            m = math.prod(o.shape[1:])
            t = jnp.transpose(jnp.reshape(column, (basis.n, batch, m)), (1, 2, 0))  # (B, m, n_in)
            jac.append(tuple(jnp.reshape(t[:, :, offset:offset + size], (batch, *o.shape[1:], *shape))
                             for shape, size, offset in zip(basis.shapes, basis.sizes, basis.offsets)))
        return outputs, tuple(jac), aux
    outputs, pullback, aux = _jax_vjp(f, primals, has_aux)
    _check_batch(outputs, batch)
    basis = _Basis(backend, _templates(outputs, example=True), batch)
    if traced and (chunk_size is None or chunk_size >= basis.n):
        # The pullback's program evaluated with the basis axis right after the batch (rows written in place,
        # (B, n_out, *primal[1:])) and each unit cotangent one example's, broadcast over the batch only where
        # an operation needs it written out (_broadcasts: as JAX's own vmap(jacrev(f_one)) lays it out)
        pull = linear_map(lambda *g: tuple(pullback(g)), _templates(outputs), reverse_layout)
        rows = tuple(pull(*repeated_basis(backend.unit_basis(basis.templates, 0, basis.n), basis.shapes, batch,
                                          reverse_layout), size=basis.n))
    elif chunk_size is None or chunk_size >= basis.n:
        # Eager: one vmap of the pullback (an equation at a time would dispatch more). The unit cotangents laid
        # out batch first, (B, n_out, ...), mapped over their second axis, rows written there too
        rows = tuple(jax.vmap(lambda *g: tuple(pullback(g)), in_axes=1, out_axes=1)(
            *(jnp.broadcast_to(r[None], (batch, basis.n, *shape)) for r, shape in
              zip(backend.unit_basis(basis.templates, 0, basis.n), basis.shapes))))  # (B, n_out, *primal[1:])
    else:
        rows = tuple(jnp.moveaxis(r, 0, 1) for r in basis.map(lambda *g: tuple(pullback(g)), chunk_size, traced))
    jac = tuple(tuple(jnp.reshape(rows[j][:, offset:offset + size], (batch, *shape, *p.shape[1:]))
                      for j, p in enumerate(primals))
                for shape, size, offset in zip(basis.shapes, basis.sizes, basis.offsets))
    return outputs, jac, aux


def _push_laid_out(backend, f, primals, basis, batch, has_aux):
    """The forward sum trick in one pass: the linearized push's program evaluated with the basis axis last
    (columns written in place, ``(B, *out[1:], n_in)``) and each unit tangent one example's, broadcast over the
    batch only where an operation needs it written out (_broadcasts: as JAX's own ``vmap(jacfwd(f_one))``
    lays it out, where a ``vmap`` of the push repeats the first product over the batch, 1.5-3x)."""
    outputs, push, aux = _linearized(f, primals, has_aux)
    _check_batch(outputs, batch)
    apply = linear_map(lambda *t: tuple(push(*t)), _templates(primals), forward_layout)
    columns = apply(*repeated_basis(backend.unit_basis(basis.templates, 0, basis.n), basis.shapes, batch,
                                    forward_layout), size=basis.n)  # per output (B, *out[1:], n_in)
    jac = tuple(tuple(jnp.reshape(column[..., offset:offset + size], (*o.shape, *shape))
                      for shape, size, offset in zip(basis.shapes, basis.sizes, basis.offsets))
                for o, column in zip(outputs, columns))
    return outputs, jac, aux


def _templates(arrays, example=False):
    """The shape and dtype of each array, or of one example of it (axis 0 dropped): the blocks of a
    unit basis, built on the default device as ``jax.jacrev`` builds it (a sharded array's sharding
    does not fit the basis)."""
    return [jax.ShapeDtypeStruct(a.shape[1:] if example else a.shape, a.dtype) for a in arrays]


def _check_batch(outputs, batch):
    for k, o in enumerate(outputs):
        if o.ndim == 0 or o.shape[0] != batch:
            raise ValueError(f"batched_jacobian: output {k} has shape {tuple(o.shape)}; expected a leading batch "
                             f"axis of size {batch}, the inputs' batch size: f must map a batch to a batch")


def _chunked_vmap(f, args, in_axes, out_axes, chunk_size):
    """``vmap`` at most ``chunk_size`` at a time: mapped axes moved to the front, results back to out_axes."""
    moved = [jnp.moveaxis(a, ax, 0) for a, ax in zip(args, in_axes) if ax is not None]

    def one(rows):  # rows: one slice per mapped argument
        rows = iter(rows)
        return tuple(f(*(a if ax is None else next(rows) for a, ax in zip(args, in_axes))))

    if _traced(args):
        outs = lax.map(one, tuple(moved), batch_size=chunk_size)
    else:
        step = jax.vmap(lambda *rows: one(rows))
        size = moved[0].shape[0]
        pieces = [step(*(m[start:stop] for m in moved)) for start, stop in chunks(size, chunk_size)]
        outs = tuple(jnp.concatenate([p[i] for p in pieces], axis=0) for i in range(len(pieces[0])))
    return tuple(jnp.moveaxis(o, 0, out_axes) for o in outs)
