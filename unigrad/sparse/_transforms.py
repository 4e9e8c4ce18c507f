"""``sparse_jacobian`` and ``sparse_hessian``: detect (or take) the pattern, colour it, run the
compressed passes, decompress -- the pattern and colouring once per signature (a :class:`SparsePlan`
in a bounded cache, next to the call plan), the passes on every call, eagerly or compiled."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import _registry
from .._batched import traced_once
from .._caches import BoundedCache, CacheKind
from .._call import prepare
from .._plan import PLANS_WHY
from .._program import PROGRAMS_WHY, execute
from .._repeats import Repeats
from .._signature import _SUMMARIES, _static_token, _summary
from .._checks import check_chunk, promote, scalar_check
from .._custom import custom_rules_seen
from .._dtypes import COMPLEX
from .._answer_check import failed_rows
from .._transform import _wraps, real_to_complex, reverse_complex_error, run_auto
from . import _coloring, _compress, _decompress, _pattern

__all__ = ["SparsePlan", "sparse_jacobian", "sparse_hessian"]

_MODES = ("auto", "fwd", "rev")


@dataclass(frozen=True, eq=False)
class SparsePlan:
    """What a sparse transform derives once per signature: the pattern, its colouring and how to
    read each non-zero out of the compressed passes.

    Attributes:
      pattern: the sparsity pattern, a boolean ``scipy.sparse.csr_array`` of shape ``(m, n)`` (outputs x
        inputs, each flattened and concatenated in order); for a Hessian ``(n, n)``, symmetric.
      coloring: the :class:`~unigrad.sparse.Coloring` used (``n_colors`` passes per call).
      mode: ``"fwd"`` (one JVP per colour), ``"rev"`` (one VJP per colour) or ``"star"`` (one HVP per colour).
      source: ``"given"`` (``sparsity=<matrix>``) or ``"detected"``.
      reasons: why a detected pattern was widened (empty when exact by rule; see
        :func:`unigrad.jacobian_sparsity`).
      dtype: the dtype of the values (outputs' and inputs' dtypes promoted).
      index, seeds, groups, structure: the compression and decompression index arrays (NumPy).
      checked: whether every call checks its values (one more product of ``f``: docs/sparse.md). False only
        for a detected pattern proved over the program the backend runs (:func:`unigrad.dependence.
        proved_on_backend`: a jaxpr, an ATen graph, nothing widened, no custom rule met).
    """

    pattern: object
    coloring: _coloring.Coloring
    mode: str
    source: str
    reasons: tuple
    dtype: str
    index: np.ndarray
    seeds: tuple
    groups: np.ndarray | None
    structure: _decompress.Structure
    checked: bool = True
    cache: dict = field(default_factory=dict, repr=False)  # arrays derived from the plan once (seed tangents)

    @property
    def n_colors(self) -> int:
        return self.coloring.n_colors

    @property
    def shape(self):
        return self.structure.shape

    @property
    def nnz(self) -> int:
        return self.structure.nnz

    def __repr__(self):
        return (f"SparsePlan(shape={self.shape}, nnz={self.nnz}, mode={self.mode!r}, n_colors={self.n_colors}, "
                f"order={self.coloring.order!r}, source={self.source!r})")


def _check_format(format, fname):
    if format not in _decompress.FORMATS:
        raise ValueError(f"{fname}: format must be one of {_decompress.FORMATS}; got {format!r}")


def _pattern_for(call, sparsity, shape, kind, argnums, backend, fname, has_aux):
    if sparsity is None or (isinstance(sparsity, str) and sparsity == "detect"):
        f = call.f
        if has_aux:  # the pattern of the output alone (aux is not differentiated)
            def f(*args):
                return _aux_pair(call.f(*args), fname)[0]
        with custom_rules_seen() as seen:  # a custom rule's derivative is not what its program shows
            found = _pattern.detect(kind, f, call.args, argnums, backend, fname)
        reasons = tuple(getattr(found, "reasons", ()))
        pattern = _pattern.as_pattern(found, shape, fname, symmetric=kind == "hessian")
        # Proved over the program that runs (the backend's own trace, shapes only): the values need no check.
        # A pattern read on the NumPy tape for another engine, or on the tape itself (whose program follows
        # Python control flow on values call by call), is an analysis: checked on every call.
        proved = not seen and not reasons and _pattern.proved(kind, f, call.args, argnums, backend, pattern)
        return pattern, "detected", reasons, proved
    return _pattern.as_pattern(sparsity, shape, fname, symmetric=kind == "hessian"), "given", (), False


def _aux_pair(result, fname):
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError(f"{fname}: with has_aux=True the function must return a pair (output, aux); "
                        f"got {type(result).__name__}")
    return result


def _make_plan(call, kind, sparsity, mode, argnums, backend, fname, has_aux, found=None) -> SparsePlan:
    """The plan of ``call``: its pattern (``found``: the pattern of that plan, not detected again), colouring
    and mode."""
    b = call.backend
    outputs = b.evaluate(call.flat_f, call.diff)
    if has_aux:
        outputs = outputs[0]
    if kind == "hessian":
        scalar_check(b, outputs, fname)
    shapes = [b.shape(x) for x in call.diff]
    n = sum(math.prod(s) for s in shapes)
    m = n if kind == "hessian" else sum(math.prod(b.shape(o)) for o in outputs)
    dtype = b.dtype(outputs[0])
    for a in tuple(outputs) + tuple(call.diff):
        dtype = promote(dtype, b.dtype(a))
    if found is None:
        pattern, source, reasons, proved = _pattern_for(call, sparsity, (m, n), kind, argnums, backend, fname,
                                                        has_aux)
    else:
        pattern, source, reasons, proved = found.pattern, found.source, found.reasons, not found.checked
    if kind == "hessian":
        coloring, chosen = _coloring.star_coloring(pattern), "star"
    else:
        # Reverse mode loses Im J where a complex output depends on a real input (a real input's VJP is real):
        # "auto" then takes forward. For a complex input, forward gives other matrices than reverse where f
        # is not holomorphic: "auto" takes reverse, the convention grad and vjp follow, whatever the colour
        # counts, as jacobian does (docs/conventions.md)
        lossy = real_to_complex(b, outputs, call.diff)
        if mode == "rev" and lossy:
            raise reverse_complex_error(fname)
        complex_in = any(b.dtype(x) in COMPLEX for x in call.diff)
        candidates = []
        if mode == "fwd" or (mode == "auto" and b.capabilities.forward_mode and (lossy or not complex_in)):
            candidates.append((_coloring.column_coloring(pattern), "fwd"))
        if mode == "rev" or (mode == "auto" and not lossy):
            candidates.append((_coloring.row_coloring(pattern), "rev"))
        if not candidates:  # auto, lossy, on a backend without forward mode: its JVP is two VJPs
            candidates.append((_coloring.column_coloring(pattern), "fwd"))
        coloring, chosen = min(candidates, key=lambda c: c[0].n_colors)  # a tie keeps forward (listed first)
    index = _decompress.recovery(pattern, coloring)
    seeds = _compress.seeds_of(coloring.colors, shapes) if chosen != "rev" else ()
    groups = _compress.groups_of(coloring.colors, coloring.n_colors, m) if chosen == "rev" else None
    return SparsePlan(pattern, coloring, chosen, source, reasons, dtype, index, seeds, groups, _decompress.Structure(pattern),
                      checked=not proved)


_SCALARS = frozenset({bool, int, float, complex, str})


def _kinds(fname):
    """What a sparse transform keeps, and what each entry depends on (unigrad._caches)."""
    return {
        "plans": CacheKind(fname, "plans", why=PLANS_WHY),
        "detected": CacheKind(fname, "detected patterns and colourings", ("state", "values"),
                              "the pattern is read from f's traced program as f reads its Python state now, and from "
                              "the values of the arrays f is given (an index array, a constant matrix's zeros)"),
        "given": CacheKind(fname, "colourings of a given pattern", ("state",),
                           "the outputs' shapes and dtypes come from running f, as it reads its Python state now"),
        "programs": CacheKind(fname, "compiled programs", why=PROGRAMS_WHY + "; one per sparse plan", program=True),
        "repeats": CacheKind(fname, "compiled repeats", why="a compiled call's arguments (Python scalars by value; "
                             "never with an array f is given, whose values a detected pattern reads) to its plan, "
                             "program and decompression"),
        "traced": CacheKind(fname, "eager TensorFlow programs", ("state",),
                            "an eager call on a backend whose vectorised map traces anyway runs one program traced "
                            "per signature: a trace freezes f's Python state, which an eager call must see as it is "
                            "now", program=True),
    }


_KINDS = {fname: _kinds(fname) for fname in ("sparse_jacobian", "sparse_hessian")}


class _Repeats(Repeats):
    """The repeat cache of compiled sparse calls (:class:`unigrad._repeats.Repeats`), keyed as a sparse call's
    plan is: a sparse transform keeps every Python scalar static, as an eager call does (the pattern
    detected for one value of ``N`` or ``c`` says nothing of another), so a scalar is in the key by its
    type and exact value (``_static_token``: ``1``, ``True``, ``1.0`` differ, so do ``0.0`` and ``-0.0``),
    never by its type alone. Arrays by type, shape and dtype; the device and backend chosen now; a call
    nested in another transform, a pytree, None: the full path. The
    result is one matrix whatever the arguments' structure, so a call with static scalars (whose plan
    was made on the pytree path) is remembered too."""

    __slots__ = ("diff",)

    def __init__(self, backend, device, argnums, kind):
        super().__init__(None, backend, device, kind=kind)
        # None: a given pattern (no array's values matter); else the differentiated positions (argnums)
        self.diff = None if argnums is None else frozenset(
            (argnums,) if isinstance(argnums, int) else (a for a in argnums if isinstance(a, int)))

    def key(self, args):
        if _registry.active_backend.get() is not None:
            return None
        sig = self.selection(args)  # the device and backend, read as the dense repeats read them
        sig.append(len(args))
        diff = self.diff
        if diff is not None and min(diff, default=0) < 0:  # negative argnums: positions of this call
            diff = {a % len(args) for a in diff if -len(args) <= a < len(args)}
        for p, a in enumerate(args):
            t = type(a)
            if t in _SCALARS:
                sig.append(_static_token(a))
                continue
            if diff is not None and p not in diff:
                return None  # an array f is given (indices): the pattern depends on its values (the full path)
            summary = _SUMMARIES.get(t) or _summary(a)
            if summary is None:  # a container, None, an object: the full path
                return None
            sig.append(t)
            sig.append(summary(a))
        return tuple(sig)

    def remember(self, key, call):
        if key is not None and call.program is not None:
            self.entries.put(key, (call.plan, call.program))


def _refuse_missed(b, checked, fname, plan):
    """The ValueError for a sparse result whose check failed (``_compress.check_values``): the pattern
    misses non-zeros of the matrix; never a silently wrong sparse matrix."""
    try:
        rows, worst = failed_rows(b, checked)
    except Exception:  # abstract values inside another framework's transform: nothing to read there
        return
    if rows:
        source = getattr(plan, "source", "")
        why = ("the pattern given as sparsity= is too small: pass one that covers every non-zero "
               "(unigrad.testing.check_sparsity_covers tests one)" if source == "given" else
               "the detected pattern is wrong (an analysis of f's program missed a dependence: please report it); "
               "pass sparsity= with the right pattern, or use the dense transform")
        raise ValueError(f"{fname}: the sparse result fails its check: for random u and v, u^T J v from one "
                         f"{'VJP' if getattr(plan, 'mode', '') == 'rev' else 'JVP'} of f differs from the sparse "
                         f"matrix's (relative difference {worst:.3g}), so the matrix has non-zeros outside its "
                         f"pattern: {why}")


def _transform(f, kind, argnums, sparsity, mode, format, chunk_size, backend, compile, device, fname, has_aux):
    if mode not in _MODES:
        raise ValueError(f"{fname}: mode must be one of {_MODES}; got {mode!r}")
    _check_format(format, fname)
    check_chunk(chunk_size, fname)
    kinds = _KINDS[fname]
    detect = sparsity is None or (isinstance(sparsity, str) and sparsity == "detect")
    plans, sparse_plans = BoundedCache(kinds["plans"]), BoundedCache(kinds["detected" if detect else "given"], 64)
    programs = BoundedCache(kinds["programs"]) if compile else None
    repeats = _Repeats(backend, device, argnums if detect else None, kinds["repeats"]) if compile else None
    finishers = BoundedCache(kinds["repeats"]) if compile else None
    traced = BoundedCache(kinds["traced"])  # eager calls on a backend whose vectorised passes trace anyway (passes)

    def plan_of(call):
        if not call.diff:
            raise ValueError(f"{fname}: argnums selects no array to differentiate")
        plan = sparse_plans.lookup(call)
        if plan is None:
            plan = sparse_plans.store(call, _make_plan(call, kind, sparsity, mode, argnums, backend, fname, has_aux))
        return plan

    def kernel_of(plan):
        passes = _compress.kernel(plan, chunk_size, has_aux)

        def run(b, flat_f, leaves):
            if plan.nnz == 0:  # nothing to compute: no pass at all (f runs once for aux)
                aux = _compress.plain_aux(b, flat_f, leaves) if has_aux else ()
                return (), (b.zeros((0,), plan.dtype, device=b.device(leaves[0])),
                            b.asarray(np.zeros((2, 0), np.float32))), aux
            return passes(b, flat_f, leaves)  # (values, and their check: _compress.kernel)

        return run

    def passes(call, plan):
        # The program is the plan's (held by the key): a new plan (new values of the arrays f is given, or a new
        # Python state on a call that took the full path) is never decompressed from another plan's passes
        decision = ("sparse", plan.mode, plan)
        if programs is not None or not call.backend.traces_batched_jacobian:
            return execute(call, kernel_of(plan), programs, decision, keep_outputs=False)
        # Eager, on a backend whose vectorised passes trace a program on every eager call (TensorFlow:
        # tf.vectorized_map and tape.jacobian's pfor wrap their loop in a new tf.function each time, ~1.5 s
        # a call on the Brusselator): the passes run as one program per signature and per value of the
        # Python state f reads, as batched_jacobian's do; an f that cannot be traced runs eagerly.
        return traced_once(call, kernel_of(plan), traced, decision)

    def transformed(*args):
        if repeats is not None:  # a compiled call repeating a signature: its program, then its finisher
            call, key = repeats.find(args, f, has_aux, fname)
            kept = None if call is None else finishers.get(key)
            if kept is not None:
                finish, kept_plan = kept
                _, blocks, aux = call.program(call)
                _refuse_missed(call.backend, blocks[1], fname, kept_plan)
                return (finish(blocks[0]), call.aux(aux)) if has_aux else finish(blocks[0])
        call = prepare(plans, f, args, argnums, has_aux, backend, fname, device)
        plan = plan_of(call)
        if mode == "auto" and plan.mode == "fwd":  # forward mode that raises falls back to reverse (run_auto)
            ran = [plan]

            def run(chosen):
                if chosen == "fwd":
                    return passes(call, plan)
                reverse = _make_plan(call, kind, sparsity, "rev", argnums, backend, fname, has_aux, found=plan)
                result = passes(call, reverse)
                ran[0] = sparse_plans.store(call, reverse)  # (kept once it worked: the next calls go reverse)
                return result

            _, blocks, aux = run_auto(None, call, run, "fwd", "rev", fname)
            plan = ran[0]
        else:
            _, blocks, aux = passes(call, plan)
        _refuse_missed(call.backend, blocks[1], fname, plan)
        finish = _decompress.finisher(call.backend, blocks[0], plan.structure, format, fname)
        if repeats is not None and key is not None and call.program is not None:
            repeats.remember(key, call)
            finishers.put(key, (finish, plan))
        matrix = finish(blocks[0])
        return (matrix, call.aux(aux)) if has_aux else matrix

    def plan(*args) -> SparsePlan:
        """The :class:`SparsePlan` (pattern, colouring, mode) for these arguments' signature."""
        return plan_of(prepare(plans, f, args, argnums, has_aux, backend, fname, device))

    _wraps(transformed, f, fname)
    transformed.plan = plan
    return transformed


def sparse_jacobian(f: Callable, argnums=0, *, sparsity=None, mode: str = "auto", format: str = "auto",
                    chunk_size: int | None = None, has_aux: bool = False, backend=None, compile: bool = False,
                    device=None) -> Callable:
    """The Jacobian of ``f`` as a sparse matrix, from one JVP (or VJP) per colour of its pattern.

    The outputs are flattened and concatenated (in the output pytree's order) into ``m`` rows, the
    differentiated arguments likewise into ``n`` columns: the result is one ``m x n`` matrix. Once
    per signature the pattern is detected (or taken from ``sparsity``) and coloured; every call then
    costs one vectorised pass per colour, not one per row or column.

    Args:
      f: function returning an array or a pytree of arrays.
      argnums: int or tuple of ints: the differentiated positional arguments.
      sparsity: ``None`` or ``"detect"`` -- found by :func:`unigrad.jacobian_sparsity`; or the pattern
        itself, an ``m x n`` ``scipy.sparse`` matrix or array-like (its non-zero entries). A given
        pattern must cover every non-zero of the Jacobian (check one with
        :func:`unigrad.testing.check_sparsity_covers`): a non-zero outside it is not computed.
      mode: ``"fwd"`` (column colouring, JVPs), ``"rev"`` (row colouring, VJPs) or ``"auto"``: the
        one with fewer colours (forward on a tie); where forward mode raises (an operation the engine
        has no forward rule for, a JAX ``custom_vjp``, TensorFlow control flow that pfor cannot
        vectorise), reverse mode, kept in the signature's plan.
      format: ``"auto"`` -- the backend's sparse type (NumPy: ``scipy.sparse.csr_array``; torch: a
        sparse CSR tensor; JAX: ``jax.experimental.sparse.BCOO``; TensorFlow: ``tf.sparse.SparseTensor``);
        ``"dense"``; ``"scipy"`` (a ``scipy.sparse.csr_array`` on any backend); ``"csr"``, ``"csc"``,
        ``"coo"`` in the backend's type where it has that layout.
      chunk_size: at most this many colours per vectorised pass.
      has_aux: ``f`` returns ``(output, aux)``; the function then returns ``(jacobian, aux)``, aux as
        ``f`` gave it (not differentiated; its arrays detached).
      backend: backend name or object.
      compile: one compiled program per signature (``jax.jit``, ``tf.function``); a call repeating a
        signature (arrays' types, shapes and dtypes, Python scalars' exact values) goes straight to it.
        Eagerly on TensorFlow the compressed passes are one traced program per signature as well (its
        vectorised map would trace anew on every call): ``f``'s Python code runs once per signature.
      device: place the inputs on this device.

    Returns:
      A function of ``f``'s arguments returning the sparse Jacobian (``(jacobian, aux)`` with
      ``has_aux``). Its ``plan(*args)`` returns the
      :class:`SparsePlan` of those arguments' signature: ``pattern``, ``coloring``, ``mode``.

    Example:
      >>> import scipy.sparse
      >>> def f(x):
      ...     return x[1:] ** 2 - x[:-1]
      >>> pattern = scipy.sparse.eye_array(3, 4) + scipy.sparse.eye_array(3, 4, k=1)  # 2 non-zeros a row
      >>> jac = unigrad.sparse_jacobian(f, sparsity=pattern)
      >>> jac(np.arange(4.0)).toarray()
      array([[-1.,  2.,  0.,  0.],
             [ 0., -1.,  4.,  0.],
             [ 0.,  0., -1.,  6.]])
      >>> jac.plan(np.arange(4.0)).n_colors
      2
    """
    return _transform(f, "jacobian", argnums, sparsity, mode, format, chunk_size, backend, compile, device,
                      "sparse_jacobian", has_aux)


def sparse_hessian(f: Callable, argnums=0, *, sparsity=None, format: str = "auto", chunk_size: int | None = None,
                   has_aux: bool = False, backend=None, compile: bool = False, device=None) -> Callable:
    """The Hessian of a scalar-valued ``f`` as a sparse matrix, from one HVP per colour of a star
    colouring of its (symmetric) pattern.

    Args:
      f: function returning a real scalar (``(scalar, aux)`` with ``has_aux``).
      argnums: int or tuple of ints; their elements, flattened and concatenated, index the ``n x n`` result.
      sparsity: ``None`` / ``"detect"`` (:func:`unigrad.hessian_sparsity`) or an ``n x n`` pattern
        (symmetrised: ``A | A^T``). A given pattern must cover every non-zero of the Hessian.
      format: as for :func:`sparse_jacobian`.
      chunk_size: at most this many colours per vectorised pass.
      has_aux: ``f`` returns ``(scalar, aux)``; the function then returns ``(hessian, aux)``.
      backend: backend name or object.
      compile: one compiled program per signature (see :func:`sparse_jacobian`, eager TensorFlow too).
      device: place the inputs on this device.

    Returns:
      A function returning the sparse Hessian (``(hessian, aux)`` with ``has_aux``); ``plan(*args)`` gives its :class:`SparsePlan`.

    Example:
      >>> import scipy.sparse
      >>> def rosenbrock(x):
      ...     xp = unigrad.namespace(x)
      ...     return xp.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)
      >>> tridiagonal = scipy.sparse.diags_array([1, 1, 1], offsets=[-1, 0, 1], shape=(1000, 1000), dtype=bool)
      >>> hess = unigrad.sparse_hessian(rosenbrock, sparsity=tridiagonal)
      >>> hess(np.zeros(1000)).nnz, hess.plan(np.zeros(1000)).n_colors
      (2998, 3)
    """
    return _transform(f, "hessian", argnums, sparsity, "auto", format, chunk_size, backend, compile, device,
                      "sparse_hessian", has_aux)
