"""The backend contract.

A backend works on *flat tuples of its own arrays*. The core (``unigrad._call``,
``unigrad._api``) owns pytrees, ``argnums``, ``has_aux`` bookkeeping, conversion
of inputs and every user-facing error; a backend only differentiates.

Conventions every method follows:

* ``f`` is a flat function: ``f(*primals) -> tuple of arrays``; when
  ``has_aux`` is true it returns ``(tuple_of_outputs, tuple_of_aux)``. The core
  sets ``f.closure_arrays``: the backend's arrays ``f`` closes over (the
  non-differentiated array arguments), for backends whose behaviour depends on
  every input (JAX's scoped 64-bit mode); read it with ``getattr(f,
  "closure_arrays", ())``.
* ``vjp_fn(cotangents)`` takes a *tuple* with one cotangent per output, each of
  exactly the output's shape and dtype (the core has checked and cast them),
  and returns a tuple with one cotangent per primal -- zeros, never ``None``,
  for a primal the outputs do not use.
* Jacobians are returned as ``jac[i][j]`` with shape
  ``outputs[i].shape + primals[j].shape``.
* The generic defaults always pass ``has_aux`` by keyword.

The whole contract, one table (docs/plugins.md has the same):

=========================  ========  =====================================================
method                     status    default / note
=========================  ========  =====================================================
``name``                   required  class attribute; the registry sets it to the name the
                                     backend was registered under
``array_modules``          required  class attribute: top-level modules of its array types (how
                                     unigrad picks the backend from inputs without importing)
``namespace()``            required  the Array API namespace of the backend's arrays
``asarray(x, dtype, device)`` required  NumPy arrays, Python scalars, own arrays
``to_numpy(x)``            required
``is_array(x)``            required  own arrays, including values ``f`` sees in a transform
``vjp(f, primals, *, has_aux=False)``  required  ``(outputs, vjp_fn, aux)``
``jvp(f, primals, tangents, *, has_aux=False)``  required  ``(outputs, tangents_out, aux)``
``capabilities``           optional  all False by default: declare what you deliver
``devices()``              optional  ``("cpu",)``
``version()``, ``shape``, ``dtype``, ``device``, ``cast``, ``matches``,
``zeros``, ``zeros_like``, ``ones_like``, ``stop_gradient``, ``copy``  optional  from the namespace
``mutable_arrays``         optional  True: ``vjp`` copies what the caller holds (False: JAX, TF)
``signature_attribute``    optional  None: arrays stand in repeat keys by ``(shape, dtype)`` (JAX: ``aval``)
``forward_by_reverse``     optional  False: sparse forward passes as transposed VJPs (torch: True)
``forward_ratio``          optional  1: ``mode="auto"`` goes forward where outputs > ratio x inputs (torch: 2)
``evaluate(f, primals)``   optional  ``f(*primals)``; the core's plain forward evaluations
``output_shapes(f, primals, has_aux)``  optional  the outputs' shapes from ``evaluate`` (JAX: traced, no work)
``special(name)``          optional  None: unigrad.special's formulas (the framework's own functions)
``arguments(arrays)``      optional  the arrays; what ``f`` receives for its other array arguments
``value_and_grad(f, primals, *, has_aux, check)``  optional  one ``vjp`` with a unit cotangent
``vmap(f, in_axes, out_axes, chunk_size)``  optional  a Python loop (``capabilities.vmap`` False)
``jacrev`` / ``jacfwd``    optional  ``vjp`` / ``jvp`` over a unit basis, via ``map_chunks``
``record_for_jacrev``      optional  None: ``mode="auto"`` learns shapes from ``vjp`` (torch: one plain recording)
``linear_products(f, point)``  optional  None: ``linear_solve`` iterates with ``vjp``'s pullback (torch: plain autograd)
``while_loop(cond, body, state)``  optional  None: ``linear_solve`` solves densely on symbolic values (JAX, TF: loops)
``vmap_rows(fn, n_args)``  optional  ``vmap`` over axis 0, for ``map_chunks``' own basis rows (torch: no copies)
``batched_jacobian``       optional  the sum trick over the per-example basis
``per_example_jacobian``   optional  ``batched_jacobian`` (used with ``separable=True``)
``forward_sum_trick_folds``  optional  False: forward mode takes a proved one-example shortcut, checked (JAX: True)
``dependence_program``     optional  None: ``f`` in ``unigrad.dependence``'s neutral form (row proofs, sparsity)
``batch_rows``             optional  None: the core reads ``dependence_program`` (else portable ``f`` on the tape)
``per_example_rows``       optional  None: per-example gradients from ``f``'s program (else materialised)
``hessian`` / ``hvp``      optional  forward over reverse
``compile(fn)``            optional  ``fn`` itself (``capabilities.compile`` False)
``apply_rule(rule, arrays)``  optional  a custom derivative (:class:`Rule`); declare
                                     ``capabilities.custom_rules``. Default: a clear error
``checkpoint(f, primals)`` optional  ``f(*primals)``; with ``custom_rules`` (not overridden): a rule
                                     keeping only ``primals`` whose ``bwd`` re-runs ``vjp``
``carries_derivative(x)``  optional  False: ``unigrad.bridge`` hands own arrays over as data
``host_callback(fn, arrays, out_specs, jvp=)``  optional  None: no bridge out of traced programs (a clear error)
``primals_from_jvp_rule``  optional  False: ``apply_rule`` takes primal outputs from ``fun``, not from ``jvp``
``sparse_matrix(values, structure, format, fname)``  optional  ``scipy.sparse`` (CSR for ``"auto"``)
``sparse_finisher(values, structure, format, fname)``  optional  ``sparse_matrix`` on every call
``dense_matrix(values, structure)``  optional  a NumPy scatter, then ``asarray``
``sparse_to_numpy(matrix)``  optional  ``toarray()`` of ``scipy.sparse``, else ``to_numpy``
=========================  ========  =====================================================

The generic defaults call these namespace functions: ``eye(n, m, k=, dtype=,
device=)``, ``zeros(shape, dtype=, device=)``, ``zeros_like``, ``ones_like``,
``reshape``, ``permute_dims``, ``broadcast_to``, ``stack``, ``concat``,
``astype``. Helpers adapters may use: :func:`chunks`, :meth:`Backend.unit_basis`,
:meth:`Backend.example_basis`, :meth:`Backend.map_chunks`.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ._dtypes import dtype_name

__all__ = ["Backend", "Capabilities", "Rule", "TracedValueError", "chunks", "fft_norm", "uses_traced_value"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend supports natively. Every field defaults to False (float64 to True: NumPy-based
    engines compute it): a backend declares what it delivers, and the conformance suite proves each
    declared capability and skips the undeclared ones.

    Attributes:
      forward_mode: ``jvp`` is true forward mode (not emulated by two VJPs).
      vmap: ``vmap`` vectorises instead of looping in Python.
      compile: ``compile`` returns a compiled function (jit / tf.function).
      higher_order: transforms nest (``hessian``, ``hvp``, ``check_grads(order=2)``).
      complex: complex inputs and outputs are differentiated.
      float64: float64 is computed in float64.
      custom_rules: ``apply_rule`` maps custom derivative rules (``custom_vjp``, ``custom_jvp``,
        ``stop_gradient``) to the engine's own mechanism, in both modes and nested.
    """

    forward_mode: bool = False
    vmap: bool = False
    compile: bool = False
    higher_order: bool = False
    complex: bool = False
    float64: bool = True
    custom_rules: bool = False


class Backend(abc.ABC):
    """Base class of every backend; subclass it and register the subclass.

    The required methods are abstract: a subclass missing one cannot be instantiated (the registry
    reports the TypeError naming them).

    Class attribute ``array_modules`` names the top-level modules whose array
    types the backend owns (``("torch",)``); the core uses it to infer the
    backend from input arrays without importing anything.
    """

    name: str = "abstract"
    array_modules: tuple[str, ...] = ()
    capabilities: Capabilities = Capabilities()
    #: ``mode="auto"`` picks forward mode where the outputs have more than this many times the inputs'
    #: elements (1: where they have more; a choice of speed only). An engine whose forward mode costs
    #: more than its reverse mode at small sizes sets more (torch: 2, see its adapter).
    forward_ratio: float = 1
    #: ``asarray`` takes other frameworks' arrays directly (objects with ``__dlpack__``, zero-copy).
    accepts_dlpack: bool = False
    #: Its eager ``batched_jacobian`` would trace a program on every call anyway (TensorFlow's pfor):
    #: the core then runs eager per-example Jacobians as one compiled program per signature.
    traces_batched_jacobian: bool = False
    #: Its ``batched_jacobian`` (the sum trick) holds each unit vector of the per-example basis once, not once
    #: per example, in forward mode too (JAX: ``_broadcasts``), so it is as fast as computing one example
    #: alone: the core takes that exact method in both modes wherever the rows are proved independent, and
    #: a one-example shortcut (which must check its answer) only where the user declares ``separable=True``
    #: or no proof is exact. False: in forward mode the shortcut, checked, is the faster.
    forward_sum_trick_folds: bool = False
    #: The backend's arrays can be written in place (NumPy, torch); False for immutable ones (JAX,
    #: TensorFlow). ``vjp``'s ``vjp_fn`` outlives the call, so on a mutable backend the core hands the
    #: backend copies of the caller's arrays and the caller copies of the outputs: nothing the caller
    #: holds is memory that ``vjp_fn`` reads (see :meth:`copy`).
    mutable_arrays: bool = True
    #: The name of an attribute of the backend's arrays that stands for their shape and dtype in the keys
    #: of compiled repeats (``unigrad._repeats.Repeats``), read instead of ``shape`` and ``dtype``: hashable,
    #: and equal for two arrays only where their shapes and dtypes are equal (it may tell more apart).
    #: JAX: ``aval`` (one attribute, where ``shape`` and ``dtype`` are two Python properties over it).
    #: None: the pair ``(shape, dtype)``.
    signature_attribute: str | None = None
    #: Its forward mode is much slower than its reverse mode on ordinary code: the sparse transforms run their
    #: forward passes (one JVP per colour) as transposed VJPs instead (torch; see ``TorchBackend``).
    forward_by_reverse: bool = False

    # ------------------------------------------------------------------ required
    @abc.abstractmethod
    def namespace(self):
        """The Array API namespace for this backend's arrays."""
        raise NotImplementedError

    @abc.abstractmethod
    def asarray(self, x, dtype=None, device=None):
        """Convert ``x`` (NumPy array, Python scalar, own array) to an own array."""
        raise NotImplementedError

    @abc.abstractmethod
    def to_numpy(self, x):
        """A NumPy copy (or view) of an own array."""
        raise NotImplementedError

    @abc.abstractmethod
    def is_array(self, x) -> bool:
        """True for own arrays, including the values ``f`` sees inside a transform."""
        raise NotImplementedError

    def devices(self) -> tuple[str, ...]:
        """Device names this backend can place arrays on (``"cpu"``, ``"cuda:0"``...)."""
        return ("cpu",)

    @abc.abstractmethod
    def vjp(self, f, primals, *, has_aux=False):
        """Returns ``(outputs, vjp_fn, aux)``; ``aux`` is ``None`` without ``has_aux``."""
        raise NotImplementedError

    @abc.abstractmethod
    def jvp(self, f, primals, tangents, *, has_aux=False):
        """Returns ``(outputs, tangents_out, aux)``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers
    def version(self) -> str:
        return ""

    def shape(self, x) -> tuple[int, ...]:
        return tuple(int(d) for d in x.shape)

    def dtype(self, x) -> str:
        """Canonical dtype name of an own array (``"float32"``...)."""
        return dtype_name(x.dtype)

    def device(self, x):
        """The device object of an own array, as the namespace's creation functions take it
        (``x.device`` where the array has one, else ``"cpu"``)."""
        from array_api_compat import device

        try:
            return device(x)
        except Exception:  # not an Array API array (a plugin's own type): its attribute, or the CPU
            return getattr(x, "device", "cpu")

    def to_native(self, x):
        """The framework's own array for an own array (the identity unless the backend wraps its arrays,
        as TensorFlow's namespace does)."""
        return x

    def cast(self, x, dtype: str):
        """``x`` converted to the dtype named ``dtype``."""
        xp = self.namespace()
        return xp.astype(x, getattr(xp, dtype))

    def matches(self, value, reference) -> bool:
        """``value`` is an own array with ``reference``'s shape, dtype and device (it needs no checks)."""
        return (self.is_array(value) and self.shape(value) == self.shape(reference)
                and self.dtype(value) == self.dtype(reference) and self.device(value) == self.device(reference))

    def copy(self, x):
        """An array equal to ``x`` that shares no memory with it (differentiable inside a transform)."""
        return self.namespace().asarray(x, copy=True)

    def zeros_like(self, x):
        return self.namespace().zeros_like(x)

    def ones_like(self, x):
        return self.namespace().ones_like(x)

    def zeros(self, shape, dtype: str, device=None):
        """An array of zeros with the dtype named ``dtype``, on ``device`` (a device object or None)."""
        xp = self.namespace()
        return xp.zeros(tuple(shape), dtype=getattr(xp, dtype), device=device)

    def arguments(self, arrays):
        """What ``f`` receives for its non-differentiated array arguments (the core binds them inside
        the flat function, out of the backend's reach): the arrays themselves by default; a backend
        whose transforms hand ``f`` wrapped arrays (TensorFlow's Array API arrays) wraps these too."""
        return arrays

    def evaluate(self, f, primals):
        """``f(*primals)`` outside any transform (the core's plain forward evaluations go through it:
        a backend can set up what its arrays need, e.g. JAX's scoped 64-bit mode)."""
        return f(*primals)

    def output_shapes(self, f, primals, has_aux=False):
        """The shapes of ``f``'s outputs at ``primals`` (aux left out), as a tuple of tuples: from one
        :meth:`evaluate` by default; a backend that traces may find them without computing (a
        first call of a transform asks for them to choose its mode)."""
        outputs = self.evaluate(f, primals)
        if has_aux:
            outputs = outputs[0]
        return tuple(self.shape(o) for o in outputs)

    def stop_gradient(self, x):
        """``x`` detached from any transform (used for ``aux`` values)."""
        return x

    def special(self, name: str):
        """The backend's own special function ``name`` (``"gammaln"``, ``"erf"``... see
        :mod:`unigrad.special`), differentiable in its transforms, or None: :mod:`unigrad.special` then
        uses a formula in other special functions and the namespace, where it has one. ``polygamma`` is
        called as ``(n, x)`` and ``multigammaln`` as ``(a, d)``, with Python ints ``n`` and ``d``."""
        return None

    # ------------------------------------------------------------------ optional
    def vmap(self, f, in_axes: Sequence[int | None], out_axes: int = 0, chunk_size=None):
        """Map flat ``f`` over axis ``in_axes[k]`` of argument ``k`` (None: not mapped).

        Generic default: a Python loop over the mapped axis, stacked on
        ``out_axes``. Backends with a vectorising map override it.
        """
        xp = self.namespace()

        def mapped(*args):
            sizes = {self.shape(a)[ax] for a, ax in zip(args, in_axes) if ax is not None}
            if len(sizes) != 1:
                raise ValueError(f"vmap: mapped axes must all have one size; got sizes {sorted(sizes)}")
            (size,) = sizes
            rows = []
            for i in range(size):
                row_args = [a if ax is None else _take(xp, a, i, ax) for a, ax in zip(args, in_axes)]
                rows.append(f(*row_args))
            if size == 0:
                raise ValueError("vmap: the generic (looping) vmap cannot map over an axis of size 0")
            return tuple(xp.stack([r[k] for r in rows], axis=out_axes) for k in range(len(rows[0])))

        return mapped

    def jacrev(self, f, primals, *, chunk_size=None, has_aux=False):
        """Reverse-mode Jacobian: returns ``(outputs, jac, aux)``.

        Generic default: one VJP, pulled back over the identity basis of the
        outputs -- vectorised with ``vmap`` when the backend has one, in
        chunks of ``chunk_size`` rows.
        """
        outputs, vjp_fn, aux = self.vjp(f, primals, has_aux=has_aux)
        return outputs, self.jacobian_of_vjp(outputs, vjp_fn, primals, chunk_size), aux

    def jacobian_of_vjp(self, outputs, vjp_fn, primals, chunk_size=None):
        """The blocks ``jac[i][j]`` of :meth:`jacrev`, from its VJP already made (``vjp_fn`` at ``primals``,
        giving ``outputs``): a transform that evaluated ``f`` for reverse mode to learn its output shapes
        (``mode="auto"``) finishes from that pass."""
        n_out = sum(math.prod(self.shape(o)) for o in outputs)
        rows = self.map_chunks(lambda *g: vjp_fn(g), lambda a, b: self.unit_basis(outputs, a, b), n_out, chunk_size,
                               self._specs(primals))  # per primal: (n_out, *primal.shape)
        return self._split_rows(rows, outputs, primals, rows_are_outputs=True)

    def jacfwd(self, f, primals, *, chunk_size=None, has_aux=False):
        """Forward-mode Jacobian: returns ``(outputs, jac, aux)``; pushes the input basis through ``jvp``.
        Without a vectorising ``vmap`` (one JVP per column, in a Python loop) the first column's JVP gives
        the outputs and aux too: no plain evaluation of ``f`` besides the JVPs."""
        n_in = sum(math.prod(self.shape(p)) for p in primals)
        if self.capabilities.vmap or n_in == 0:
            outputs, aux, push_f = self._forward(f, primals, has_aux)
            return outputs, self.jacobian_of_jvp(outputs, push_f, primals, chunk_size), aux
        first = tuple(r[0] for r in self.unit_basis(primals, 0, 1))
        outputs, column, aux = self.jvp(f, primals, first, has_aux=has_aux)
        push_f = (lambda *p: f(*p)[0]) if has_aux else f
        outputs = tuple(outputs)
        return outputs, self.jacobian_of_jvp(outputs, push_f, primals, chunk_size, first=tuple(column)), aux

    def jacobian_of_jvp(self, outputs, push_f, primals, chunk_size=None, first=None):
        """The blocks ``jac[i][j]`` of :meth:`jacfwd` after its plain evaluation (``outputs`` of ``f`` at
        ``primals``; ``push_f``: ``f`` without its aux): the input basis pushed through :meth:`jvp`. A
        transform that evaluated ``f`` to learn its output shapes (``mode="auto"``) finishes from there.
        ``first``: the first column's JVP already taken (one per output), the basis pushed from the second."""
        n_in = sum(math.prod(self.shape(p)) for p in primals)
        skip = 0 if first is None else 1
        cols = self.map_chunks(lambda *t: self.jvp(push_f, primals, t, has_aux=False)[1],
                               lambda a, b: self.unit_basis(primals, a + skip, b + skip), n_in - skip, chunk_size,
                               self._specs(outputs))  # per output: (n_in - skip, *out.shape)
        if first is not None:
            xp = self.namespace()
            cols = tuple(xp.concat([xp.stack([c]), r], axis=0) for c, r in zip(first, cols))
        return self._split_rows(cols, primals, outputs, rows_are_outputs=False)

    def batched_jacobian(self, f, primals, *, mode="rev", chunk_size=None, has_aux=False):
        """Per-example Jacobians of ``f`` mapping a batch to a batch, rows independent.

        Returns ``(outputs, jac, aux)`` with ``jac[i][j]`` of shape
        ``(B, *out_i.shape[1:], *primal_j.shape[1:])``. Generic default: the
        sum trick -- for independent rows, pulling back the k-th unit cotangent
        *of every example at once* gives all B rows k in one VJP (reverse), or
        pushing forward the k-th unit tangent of every example gives all
        columns k in one JVP (forward). The work loops (or vmaps) over the
        per-example size, never over B.
        """
        xp = self.namespace()
        if mode == "fwd":
            outputs, aux, push_f = self._forward(f, primals, has_aux)
            jac = [[None] * len(primals) for _ in outputs]
            for j, p in enumerate(primals):
                basis = self.example_basis(p)  # (n_j, *primal.shape)
                n_j = self.shape(basis)[0]
                tangents_j = lambda t, j=j: tuple(t if k == j else self.zeros_like(q) for k, q in enumerate(primals))
                pushed = self.map_chunks(lambda t: self.jvp(push_f, primals, tangents_j(t), has_aux=False)[1],
                                         lambda a, b: (basis[a:b],), n_j, chunk_size, self._specs(outputs))
                for i, out in enumerate(outputs):
                    # pushed[i]: (n_j, B, *out[1:]) -> (B, *out[1:], *in_j[1:])
                    out_tail, in_tail = self.shape(out)[1:], self.shape(p)[1:]
                    t = xp.reshape(pushed[i], (n_j, self.shape(out)[0], math.prod(out_tail)))
                    t = xp.permute_dims(t, (1, 2, 0))
                    jac[i][j] = xp.reshape(t, (self.shape(out)[0], *out_tail, *in_tail))
            return outputs, tuple(tuple(r) for r in jac), aux
        outputs, vjp_fn, aux = self.vjp(f, primals, has_aux=has_aux)
        jac = [[None] * len(primals) for _ in outputs]
        for i, out in enumerate(outputs):
            basis = self.example_basis(out)  # (m_i, *out.shape)
            cot = lambda g, i=i: tuple(g if k == i else self.zeros_like(o) for k, o in enumerate(outputs))
            pulled = self.map_chunks(lambda g: vjp_fn(cot(g)), lambda a, b: (basis[a:b],), self.shape(basis)[0],
                                     chunk_size, self._specs(primals))
            for j, p in enumerate(primals):
                g = pulled[j]  # (m_i, B, *in_j[1:])
                out_tail, in_tail = self.shape(out)[1:], self.shape(p)[1:]
                g = xp.permute_dims(g, (1, 0, *range(2, 2 + len(in_tail))))
                jac[i][j] = xp.reshape(g, (self.shape(out)[0], *out_tail, *in_tail))
        return outputs, tuple(tuple(r) for r in jac), aux

    # ------------------------------------------------------------------ hooks: reading f's own program
    def dependence_program(self, f, primals, *, has_aux=False, unknown=()):
        """``f`` traced by the backend into :class:`unigrad.dependence.Program`, the neutral form the one
        analysis of traced programs reads (its nodes named ``"<prefix>.<op>"``, their rules registered
        with :func:`unigrad.dependence.register_rules`), or None: no program of its own (the default;
        the core then reads portable ``f`` on the NumPy tape).

        What it gives: proofs of independent rows for ``batched_jacobian`` (:meth:`batch_rows`' default)
        and sparsity patterns for ``jacobian_sparsity`` / ``sparse_jacobian`` of ``f`` written with the
        framework's own operations. ``unknown``: arrays ``f`` closes over whose values change from call
        to call (the non-differentiated array arguments): the program must treat them as unknown
        values, so a proof made once holds for any of them. The outputs are ``f``'s outputs (its aux
        left out where ``has_aux``)."""
        return None

    def batch_rows(self, f, primals, *, has_aux=False):
        """A proof about ``f``'s rows read from the backend's own traced program, once per signature and
        Python state: ``(verdict, detail, separable)`` with verdict ``"row"`` (independent), ``"mixed"``
        (detail: a ``unigrad.dependence.Mixed`` naming the operation) or ``"unknown"``, and ``separable``
        whether each row may be computed alone (``per_example_jacobian``): True or False.

        Default None: the core reads :meth:`dependence_program` with ``unigrad.dependence.prove_rows``
        (``separable`` False), and where there is none, portable ``f`` on the NumPy tape, or probes.
        Override to tell separable programs apart (a program that shows each row computed alone)."""
        return None

    def per_example_rows(self, f, primals, batch, *, norms=False, fname="per_example_grad", memo=None):
        """Per-example gradients read from ``f``'s program: ``f(*primals)`` returns one loss per example
        (shape ``(batch,)``), ``primals`` are the parameters. Returns ``(outputs, blocks, paths)``: the
        outputs of ``f``, one block of rows ``(batch, *p.shape)`` per parameter (with ``norms``: one block,
        the ``(batch,)`` norms over all parameters), and per parameter the path it took (the names in
        :mod:`unigrad.per_example.layers`); None: this path does not apply (the default), and the core
        materialises every parameter's rows as Jacobian rows.

        The layers a backend finds (a matrix product, a bias, a convolution...) get their rows from one
        ordinary backward pass with the formulas of :mod:`unigrad.per_example.layers`, where its program
        proves that the losses' rows stay apart after the layer (``unigrad.dependence.prove_rows``).
        ``memo``: a bounded cache the backend may keep per-program analyses in, keyed by the program it
        recorded. The core runs this inside the transform's compiled program where there is one, or
        the backend's traced one for eager calls (``traces_batched_jacobian``).

        A backend that sets ``per_example_directions = True`` takes ``directions=`` and ``weights=`` too
        (with ``norms``: one random direction per parameter -- an array of its shape, or a pair ``(u, w)``
        for a matrix, ``V = u w^T`` -- and one random weight per example) and returns after the norms each
        example's ``sum_k <g_ik, V_k>`` (``layers.matmul_dots`` / ``layers.total_dots``), then, where it can
        from the recording it has, ``<gradient of sum_i r_i loss_i, V>`` (``layers.direction_dot``; else the
        core takes one more VJP); only the norms where a formula gives no such product. The core checks
        norms read from factors with them (``unigrad._answer_check.norms_verdicts``). Norms that come without
        the products (a backend without ``directions=``, a formula that gives none) are never used: the
        core asks for the rows instead (``norms=False``), checks them and makes the norms from them."""
        return None

    #: per_example_rows takes ``directions=`` (see there); False: the core asks this backend for rows, never
    #: norms, so that what it reads is checked
    per_example_directions = False

    #: ``while_loop(cond, body, state) -> state``: a loop on symbolic values (in a compiled program, under
    #: ``vmap``), where the backend has one (JAX: ``lax.while_loop``; TensorFlow: ``tf.while_loop``, a property
    #: that is None where TensorFlow would differentiate the loop's graph itself); None: ``unigrad.linear_solve``
    #: solves densely there instead of iterating
    while_loop = None

    #: the namespace's ``linalg.solve`` maps under ``vmap``; False (MLX: its LU has no batching rule, its inverse
    #: has): ``unigrad.linear_solve``'s dense solve on symbolic values multiplies by ``linalg.inv`` instead
    solve_under_vmap = True

    #: ``linear_products(f, point) -> (matvec, rmatvec)``, or None: ``v -> J v`` and ``u -> J^T u`` with ``J`` the
    #: Jacobian of ``f`` at ``point`` (``f``, ``point`` and the products of one shape), for products on VALUES
    #: that nothing differentiates (``unigrad.linear_solve``'s iterative solvers run them every step: ``f`` the
    #: operator itself, or custom_root's optimality in ``x`` at the solution), where the backend has leaner
    #: products than :meth:`vjp`'s pullback and :meth:`jvp`, which must nest and be differentiable (torch: plain
    #: ``torch.autograd.grad`` on one retained recording, outside ``torch.func``'s transforms). The hook may
    #: return None for a call it does not serve. None: ``vjp``'s pullback and the operator itself
    linear_products = None

    #: ``record_for_jacrev(f, primals, *, has_aux=False) -> (outputs, finish, aux)``, or None: ``f`` evaluated
    #: once for :meth:`jacrev`, ``finish(chunk_size)`` its blocks, where the backend's own ``jacrev`` has such a
    #: split (torch: a plain autograd recording; the method may return None for a call it does not serve).
    #: ``jacobian(mode="auto")`` learns a new signature's output shapes from that evaluation and finishes from
    #: it where reverse mode is chosen, as it does from :meth:`vjp` for the base class's ``jacrev``
    record_for_jacrev = None

    def per_example_jacobian(self, f, primals, *, mode="rev", chunk_size=None, has_aux=False):
        """``batched_jacobian`` for an ``f`` that may also be evaluated one example at a time
        (``f(x)[i] == f(x[i:i+1])[0]``: the core checks it once per signature when it probes the batch).

        A backend may vectorise per-example Jacobians of batch-of-one calls (``jax.vmap`` of
        ``jax.jacrev``), which its compiler can simplify better; the default is ``batched_jacobian``.
        """
        return self.batched_jacobian(f, primals, mode=mode, chunk_size=chunk_size, has_aux=has_aux)

    def value_and_grad(self, f, primals, *, has_aux=False, check=None):
        """``(outputs, gradients, aux)`` of a flat ``f`` with one real scalar output: one reverse sweep
        with a unit cotangent. ``check(outputs)`` runs between the forward and the backward sweep (it
        raises for an output that is not a real scalar).

        Generic default: ``vjp``. A backend whose ``vjp_fn`` keeps the forward's intermediates for
        further calls may override it to free them during its single sweep.
        """
        outputs, vjp_fn, aux = self.vjp(f, primals, has_aux=has_aux)
        if check is not None:
            check(outputs)
        return outputs, tuple(vjp_fn((self.ones_like(outputs[0]),))), aux

    def hessian(self, f, primals, *, chunk_size=None):
        """Hessian of a scalar-output flat ``f``: ``jac[j][k]`` of shape ``primal_j.shape + primal_k.shape``.

        Generic default: forward over reverse, ``jacfwd`` of one plain VJP (a ``jacrev`` of a scalar
        output would vmap over one unit cotangent: measured 1.2-2.2x slower on torch).
        """

        def gradient(*p):
            outputs, vjp_fn, _ = self.vjp(f, p, has_aux=False)
            return tuple(vjp_fn((self.namespace().ones_like(outputs[0]),)))

        _, jac, _ = self.jacfwd(gradient, primals, chunk_size=chunk_size, has_aux=False)
        return jac

    def hvp(self, f, primals, tangents):
        """Hessian-vector product of a scalar-output flat ``f`` (forward over reverse): one per primal."""

        def gradient(*p):
            outputs, vjp_fn, _ = self.vjp(f, p, has_aux=False)
            return tuple(vjp_fn((self.namespace().ones_like(outputs[0]),)))

        _, hv, _ = self.jvp(gradient, primals, tangents, has_aux=False)
        return hv

    def compile(self, fn: Callable, weak_scalars: tuple = ()) -> Callable:
        """A compiled version of ``fn`` (same signature); the default compiles nothing.

        ``weak_scalars`` (passed only when not empty) are the positions of arguments that are Python
        floats or complex numbers: each call may bring a new value, which must not build a new
        program. They are weakly typed, as in ``jax.jit``: ``fn`` must compute ``x32 * c`` in float32,
        as an eager call with the Python number would.
        """
        return fn

    def apply_rule(self, rule, arrays):
        """Apply a custom derivative rule (:class:`Rule`: flat callables ``fun``, ``fwd``/``bwd``
        and/or ``jvp``) to ``arrays`` (own arrays, traced or not); returns the tuple of outputs, whose
        derivatives in every mode and at every order are the rule's (the missing mode is the transpose of
        the given one). Declare ``capabilities.custom_rules`` when implemented. There is no generic
        default: the base class raises rather than differentiate through ``fun`` (a silently wrong answer).
        """
        raise unsupported_rules(self, rule.name)

    def checkpoint(self, f, primals):
        """``f(*primals)`` (a tuple of arrays) as one block whose reverse-mode derivative recomputes
        ``f`` from ``primals`` instead of keeping its intermediates (``unigrad.checkpoint``).

        ``f`` is a flat function of own arrays returning a tuple of own arrays. Default: ``f(*primals)``
        -- the same derivatives, nothing saved -- except on a backend with ``capabilities.custom_rules``
        that does not override this method: there ``unigrad.checkpoint`` applies a generic rule whose
        residuals are ``primals`` and whose ``bwd`` re-runs this backend's ``vjp``
        (``unigrad._checkpoint.rule_checkpoint``).
        """
        return tuple(f(*primals))

    # ------------------------------------------------------------------ bridge and sparse results
    # Hooks through which the core reaches what only the framework has, for ``unigrad.bridge`` (a call
    # out of a traced program, derivatives a value hides) and the sparse transforms (the framework's
    # sparse types). Each is optional: the default works on any backend (see docs/plugins.md).

    #: ``apply_rule`` takes an operation's primal outputs from what the rule's ``jvp`` returns, also where
    #: the backend maps that ``jvp`` over a batch of tangents with the primals unbatched (JAX: a
    #: ``custom_jvp`` under ``jax.vmap``, in ``jacfwd`` and ``hessian``): outputs computed with the tangents
    #: would then come out batched. ``unigrad.bridge`` computes them by a call of their own where this is
    #: True. False: the operation's outputs are ``fun``'s, and the bridge takes both the primal and the
    #: tangent outputs from one call.
    primals_from_jvp_rule: bool = False

    def carries_derivative(self, x) -> bool:
        """Whether own array ``x`` is a traced value whose :meth:`to_numpy` would give its value without
        its derivative (the tape's tracers, ``torch.func``'s wrapped tensors): ``unigrad.bridge`` refuses
        to hand such a value to another backend as data, where its derivative would silently be lost.

        Default False: own arrays are data, or are tracers with no value at all (JAX, TensorFlow), whose
        :meth:`to_numpy` raises."""
        return False

    def host_callback(self, fn, arrays, out_specs, *, jvp=None):
        """``fn`` called on the host from inside a program this backend traces (compiled code, a
        vectorising ``vmap``), where ``arrays`` hold no data: JAX's ``jax.pure_callback``, TensorFlow's
        ``tf.py_function``. ``unigrad.bridge`` calls it for a function of another backend.

        Args:
          fn: ``fn(*numpy_arrays)`` returns a tuple of NumPy arrays, one per entry of ``out_specs``.
          arrays: own arrays (traced), ``fn``'s arguments.
          out_specs: the outputs' ``(shape, dtype name)`` list.
          jvp: None, or ``jvp(primals, tangents) -> tangents_out`` (tuples of own arrays): the call's
            forward-mode derivative, for a backend whose forward mode would meet the callback without one
            (JAX differentiates the primal call inside a rule's ``fwd`` in ``hessian``). Reverse mode needs
            nothing here: the bridge wraps the call in a rule (:meth:`apply_rule`).

        Returns:
          A tuple of own arrays (the outputs, with the shapes and dtypes of ``out_specs``), or None: the
          backend has no host callback (the default), and ``unigrad.bridge`` raises a TypeError saying
          to call the function outside that transform.
        """
        return None

    def sparse_matrix(self, values, structure, format, fname):
        """``values`` as the backend's own sparse matrix (``sparse_jacobian``, ``sparse_hessian``).

        Args:
          values: an own 1-d array, one value per non-zero of ``structure`` in CSR order.
          structure: the plan's :class:`unigrad.sparse.Structure`: the shape and the index arrays of every
            layout; ``structure.converted(key, make)`` keeps the backend's copy of one, once per plan.
          format: ``"auto"`` (the backend's usual sparse type), ``"csr"``, ``"csc"`` or ``"coo"``.
          fname: the transform's name, for errors.

        Returns:
          The ``structure.shape`` matrix.

        Raises:
          ValueError: naming ``fname``, for a format the backend has no type for, and the formats it has.

        Default: a ``scipy.sparse`` array in that layout (CSR for ``"auto"``) of a host copy of the values:
        the NumPy tape's result, and that of every backend without a sparse type of its own.
        """
        return structure.to_scipy(self.to_numpy(values), "csr" if format == "auto" else format)

    def sparse_finisher(self, values, structure, format, fname):
        """``v -> sparse_matrix(v, structure, format, fname)`` for every later call whose ``v`` is like
        ``values`` (the same type, dtype, shape and device: the outputs of one compiled program); what
        :meth:`sparse_matrix` checks or converts on each call may be done once here (JAX: a ``BCOO`` from
        its parts, after one checked construction). Default: :meth:`sparse_matrix` on every call."""
        return lambda v: self.sparse_matrix(v, structure, format, fname)

    def dense_matrix(self, values, structure):
        """``values`` (as for :meth:`sparse_matrix`) as the dense ``structure.shape`` own array, zeros off the
        pattern (``format="dense"``). Default: scattered in NumPy (``structure.to_dense``), then
        :meth:`asarray` on the values' device; a framework's own scatter keeps it on its device."""
        return self.asarray(structure.to_dense(self.to_numpy(values)), device=self.device(values))

    def sparse_to_numpy(self, matrix):
        """A dense NumPy copy of a matrix :meth:`sparse_matrix` or :meth:`dense_matrix` returned (the checks
        of ``unigrad.testing`` read results through it). Default: ``matrix.toarray()`` for a
        ``scipy.sparse`` array, else :meth:`to_numpy`."""
        if hasattr(matrix, "toarray"):
            return matrix.toarray()
        return self.to_numpy(matrix)

    # ------------------------------------------------------------------ helpers for adapters
    def unit_basis(self, arrays, start, stop):
        """Rows ``start:stop`` of the identity over the concatenated, flattened ``arrays``.

        Returns one array per input, shaped ``(stop - start, *array.shape)``.
        """
        xp = self.namespace()
        n = stop - start
        out, offset = [], 0
        for a in arrays:
            shape = self.shape(a)
            size = math.prod(shape)
            # row r is global index start + r; column c is offset + c: ones where c = r + start - offset
            block = xp.eye(n, size, k=start - offset, dtype=a.dtype, device=self.device(a))
            out.append(xp.reshape(block, (n, *shape)))
            offset += size
        return tuple(out)

    def example_basis(self, x):
        """``(m, *x.shape)``: the m = prod(x.shape[1:]) unit vectors of one example, repeated over the batch."""
        xp = self.namespace()
        shape = self.shape(x)
        m = math.prod(shape[1:])
        eye = xp.eye(m, dtype=x.dtype, device=self.device(x))  # (m, m)
        eye = xp.reshape(eye, (m, 1, m))
        eye = xp.broadcast_to(eye, (m, shape[0], m))
        return xp.reshape(eye, (m, *shape))

    def _forward(self, f, primals, has_aux):
        """The outputs and aux of ``f`` (one plain evaluation), and ``f`` without its aux for pushing tangents."""
        result = self.evaluate(f, primals)
        outputs, aux = result if has_aux else (result, None)
        return outputs, aux, ((lambda *p: f(*p)[0]) if has_aux else f)

    def _specs(self, arrays):
        return [(self.shape(a), self.dtype(a), self.device(a)) for a in arrays]

    def map_chunks(self, fn, make_rows, n, chunk_size, out_specs):
        """``fn(*row)`` for each of ``n`` rows, stacked on a new axis 0 (one result per ``out_specs`` entry).

        ``make_rows(start, stop)`` builds the arguments' rows ``start:stop`` (a tuple of arrays), so at most
        ``chunk_size`` rows exist at a time. Each chunk is vmapped when the backend has a vectorising
        ``vmap``, else looped; a chunk of one row is one call (no ``vmap`` around it: a Jacobian of a scalar
        output is one VJP, which a transform around it then differentiates as such).
        """
        xp = self.namespace()
        pieces = []
        for start, stop in chunks(n, chunk_size):
            rows = make_rows(start, stop)
            if self.capabilities.vmap and stop - start > 1:
                pieces.append(tuple(self.vmap_rows(lambda *r: tuple(fn(*r)), len(rows))(*rows)))
            else:
                results = [tuple(fn(*(r[k] for r in rows))) for k in range(stop - start)]
                pieces.append(tuple(xp.stack([res[i] for res in results]) for i in range(len(out_specs))))
        if not pieces:
            return tuple(self.zeros((0, *shape), dtype, device=device) for shape, dtype, device in out_specs)
        if len(pieces) == 1:
            return pieces[0]
        return tuple(xp.concat([p[i] for p in pieces], axis=0) for i in range(len(out_specs)))

    def vmap_rows(self, fn, n_args):
        """:meth:`vmap` of ``fn`` over axis 0 of its ``n_args`` arguments, for :meth:`map_chunks`: the rows
        are made by the transform itself (basis rows), and ``fn`` is a pullback or a push (a VJP's ``vjp_fn``,
        :meth:`jvp`), never the caller's ``f`` taking them as its arguments. A backend whose ``vmap`` guards
        the caller's arguments (torch's copies them, for an ``f`` that writes into its input) may leave that
        guard out here."""
        return self.vmap(fn, [0] * n_args)

    _basis, _example_basis, _map_chunks = unit_basis, example_basis, map_chunks  # their former names

    def _split_rows(self, rows, row_owners, col_owners, rows_are_outputs):
        """Turn stacked basis results into ``jac[i_out][j_in]`` blocks of shape out.shape + in.shape."""
        xp = self.namespace()
        if rows_are_outputs:
            # rows: per primal, (n_out, *primal.shape)
            outputs, primals, per_primal = row_owners, col_owners, rows
            jac, offset = [], 0
            for out in outputs:
                oshape = self.shape(out)
                size = math.prod(oshape)
                jac.append(tuple(xp.reshape(per_primal[j][offset:offset + size], (*oshape, *self.shape(p)))
                                 for j, p in enumerate(primals)))
                offset += size
            return tuple(jac)
        # forward: rows: per output, (n_in, *out.shape); split n_in over primals, move to the end
        cols_per_output, primals, outputs = rows, row_owners, col_owners
        n_in = sum(math.prod(self.shape(p)) for p in primals)
        jac = []
        for i, out in enumerate(outputs):
            oshape = self.shape(out)
            t = xp.reshape(cols_per_output[i], (n_in, math.prod(oshape)))
            t = xp.permute_dims(t, (1, 0))  # (out_size, n_in)
            blocks, offset = [], 0
            for p in primals:
                pshape = self.shape(p)
                size = math.prod(pshape)
                blocks.append(xp.reshape(t[:, offset:offset + size], (*oshape, *pshape)))
                offset += size
            jac.append(tuple(blocks))
        return tuple(jac)


@dataclass(frozen=True, eq=False)
class Rule:
    """A custom derivative as data: flat callables on tuples of one backend's arrays, what
    :meth:`Backend.apply_rule` receives (``unigrad.custom_vjp``, ``custom_jvp``, ``checkpoint``, the bridge
    and ``stop_gradient`` build them; a backend maps one to its engine's own custom-derivative mechanism).

    Attributes:
      name: the function's name, for error messages.
      fun: ``fun(*arrays) -> tuple of outputs`` (None: the outputs of ``fwd``).
      fwd: ``fwd(*arrays) -> (outputs, residuals)``, both tuples of arrays (None with ``jvp`` only).
      bwd: ``bwd(residuals, cotangents) -> tuple`` with one cotangent per array, each of the array's
        shape and dtype (zeros, never None). ``cotangents``: one per output (None may stand for zeros).
        Linear in ``cotangents``.
      jvp: ``jvp(primals, tangents) -> (outputs, tangents_out)``; ``tangents``: one per array (None may
        stand for zeros); linear in ``tangents``.
      residuals: ``residuals(arrays, outputs) -> residuals``, what ``fwd(*arrays)[1]`` gives, from the
        outputs the forward computation gave (None: run ``fwd``). A backend whose engine hands its VJP rule
        the outputs (MLX) may take the residuals from there instead of running ``fwd`` again: no second
        forward computation (an implicit rule's solver), and no value read in a derivative pass.
      jvp_given: ``jvp_given(primals, tangents, outputs) -> (outputs, tangents_out)``, ``jvp`` given the outputs
        the forward computation gave (None: ``jvp`` computes them). A backend whose engine hands its JVP rule
        no outputs (MLX) may keep the outputs of its forward computation and call this instead: an implicit
        rule's JVP then runs no solver again, and reads no value where an enclosing transform differentiates it.

    At least one of the pairs (``fwd``, ``bwd``) and ``jvp`` is given; both may be. Every callable
    may be called with the backend's traced values, any number of times, and is differentiable code.
    """

    name: str
    fun: Callable | None = None
    fwd: Callable | None = None
    bwd: Callable | None = None
    jvp: Callable | None = None
    residuals: Callable | None = None
    jvp_given: Callable | None = None

    def __post_init__(self):
        if (self.fwd is None) != (self.bwd is None):
            raise ValueError(f"Rule {self.name!r}: fwd and bwd are given together")
        if self.bwd is None and self.jvp is None:
            raise ValueError(f"Rule {self.name!r}: give fwd and bwd, or jvp, or both")
        if self.fun is None and self.fwd is None:
            raise ValueError(f"Rule {self.name!r}: fun is needed when only jvp is given")

    def primal(self, *arrays):
        """The outputs (a tuple), computed by ``fun`` (else ``fwd``)."""
        if self.fun is not None:
            return tuple(self.fun(*arrays))
        return tuple(self.fwd(*arrays)[0])


def unsupported_rules(b, name):
    """The error for a custom derivative rule on a backend without ``capabilities.custom_rules``."""
    return NotImplementedError(
        f"{name}: the {b.name!r} backend does not support custom derivative rules "
        f"(capabilities.custom_rules is False), so it cannot differentiate a custom_vjp/custom_jvp function "
        f"or stop_gradient; choose another backend (numpy, torch, jax, tensorflow)")


class TracedValueError(TypeError):
    """``f`` asked for the value of an array that has none yet (``bool``, ``float``, ``int`` or NumPy
    conversion of an array traced into a program, an ``if`` on it). A backend raises it from its own
    array type; :func:`uses_traced_value` also knows the frameworks' own errors of that kind."""


#: The frameworks' errors for the value of a traced array, by class name (no framework is imported):
#: JAX's tracer conversions, TensorFlow's graph-mode bool.
_TRACED_VALUE_ERRORS = frozenset({"ConcretizationTypeError", "TracerBoolConversionError",
                                  "TracerIntegerConversionError", "TracerArrayConversionError",
                                  "OperatorNotAllowedInGraphError"})


def uses_traced_value(exc: BaseException) -> bool:
    """Whether ``exc`` comes from ``f`` using the value of a traced array as a Python value (an ``if``
    on it, ``float(x)``): :class:`TracedValueError`, or the frameworks' own errors of that kind, also
    where one was raised from (the ``__cause__`` / ``__context__`` chain)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, TracedValueError) or {c.__name__ for c in type(exc).__mro__} & _TRACED_VALUE_ERRORS:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def chunks(n: int, chunk_size: int | None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(n)`` in pieces of at most ``chunk_size`` (all at once for None)."""
    if chunk_size is None or chunk_size >= n:
        return [(0, n)] if n else []
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer or None; got {chunk_size!r}")
    return [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]


_chunks = chunks  # the name adapters used before it was public


def numpy_copies(fn, positions):
    """``fn`` called with a copy of its arguments at ``positions`` (NumPy arrays the caller owns): what a
    compiled repeat hands a program that may read a NumPy argument in place after returning (``jax.jit``)."""
    if positions == (0,):  # (the common differentiated NumPy array, first)
        def run(x, *rest):
            return fn(x.copy(), *rest)
        return run

    def run(*args):
        args = list(args)
        for k in positions:
            args[k] = args[k].copy()
        return fn(*args)
    return run


_FFT_NORMS = ("backward", "ortho", "forward")
_FFT_NORM_SWAP = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def fft_norm(norm: str | None, fname: str, *, swap: bool = False) -> str:
    """The ``norm`` argument of an Array API ``fft`` function, checked: one rule for every namespace.

    Args:
      norm: ``"backward"`` (also for None), ``"ortho"`` or ``"forward"``.
      fname: the function's name, for the error message (``"rfft"``).
      swap: return the norm of the paired transform instead (``hfft`` is an ``irfft`` with it).

    Returns:
      The norm's name.

    Raises:
      ValueError: any other ``norm``, naming ``fft.<fname>`` and the three allowed values.

    Example:
      >>> from unigrad.backend import fft_norm
      >>> fft_norm(None, "fft"), fft_norm("forward", "hfft", swap=True)
      ('backward', 'backward')
    """
    norm = "backward" if norm is None else norm
    if norm not in _FFT_NORMS:
        raise ValueError(f'fft.{fname}: invalid norm value {norm!r}; should be "backward", "ortho" or "forward"')
    return _FFT_NORM_SWAP[norm] if swap else norm


def _take(xp, a, i, axis):
    index = [slice(None)] * len(a.shape)
    index[axis] = i
    return a[tuple(index)]
