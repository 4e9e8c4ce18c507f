"""The public transforms.

Each transform reads top-down: :func:`unigrad._call.prepare` flattens the arguments and finds the
plan of their signature (what is differentiated, converted, placed; see ``_call.py``), the
backend runs the transform's kernel on the flat leaves -- eagerly, or as a compiled program with
``compile=True`` -- and the result is rebuilt in this call's structures. Per-example Jacobians and
the independence probe are in ``_batched.py``; argument checks and their messages in ``_checks.py``;
array helpers (``namespace``, ``asarray``, ``to_numpy``, ``to_native``, ``evaluate``) in ``_arrays.py``; the memory
budget in ``_memory.py``.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import optree

from . import _checks, _registry
from ._batched import batched_jacobian, check_batch_independence
from ._hessian import hessian, value_jacobian_and_hessian  # noqa: F401 -- (public names kept here too)
from ._arrays import asarray, evaluate, namespace, to_native, to_numpy
from ._caches import BoundedCache, CacheKind
from ._call import _LEAF, Call, FlatPlans, prepare, unflatten
from ._plan import PLANS_WHY
from ._program import PROGRAMS_WHY, block_runner, execute
from ._repeats import Miss, Repeats
from ._signature import reject_lazy
from . import _memory
from ._transform import (_ITEMSIZE, FALLBACKS_NAME, FALLBACKS_WHY, SHAPES_WHY, _flatten_blocks, _size,  # noqa: F401
                         _wraps, budget_chunk, choose_mode, mode_for_shapes, output_shapes, promoted_blocks,
                         real_to_complex, reverse_complex_error, run_auto, static_arguments)
from ._checks import check_chunk, check_mode, scalar_check
from .backend import Backend

__all__ = [
    "vjp", "jvp", "grad", "value_and_grad", "jacobian", "jacrev", "jacfwd", "batched_jacobian",
    "hessian", "hvp", "hessian_vector_product", "vmap", "evaluate", "namespace", "asarray", "to_numpy", "to_native",
    "check_batch_independence",
]


# Names the validation tools use (unigrad.testing), kept where they have always been.
_convert = _checks.convert
_arg_names = _checks.arg_names
_leaf_names = _checks.leaf_names


def _normalize_argnums(argnums, nargs, fname):
    return _checks.normalize_argnums(argnums, nargs, fname)


# What the transforms of this module keep, and what each entry depends on (unigrad._caches).
_MEMORY_WHY = "from a memory budget: memory, not the result"
PRIMAL_PLANS = CacheKind("vjp/jvp/hvp", "plans", why=PLANS_WHY)
GRAD_PLANS = CacheKind("grad", "plans", why=PLANS_WHY)
GRAD_PROGRAMS = CacheKind("grad", "compiled programs", why=PROGRAMS_WHY, program=True)
JACOBIAN_PLANS = CacheKind("jacobian", "plans", why=PLANS_WHY)
JACOBIAN_SHAPES = CacheKind("jacobian", "output shapes", why=SHAPES_WHY, program=True)
JACOBIAN_CHUNKS = CacheKind("jacobian", "chunk sizes", why=_MEMORY_WHY, program=True)
JACOBIAN_PROGRAMS = CacheKind("jacobian", "compiled programs", why=PROGRAMS_WHY, program=True)
JACOBIAN_FALLBACKS = CacheKind("jacobian", FALLBACKS_NAME, why=FALLBACKS_WHY, program=True)
HVP_PLANS = CacheKind("hessian_vector_product", "plans", why=PLANS_WHY)
HVP_PRIMAL_PLANS = CacheKind("hessian_vector_product", "plans of the primals alone (tangents to check)",
                             why=PLANS_WHY)
HVP_PROGRAMS = CacheKind("hessian_vector_product", "compiled programs", why=PROGRAMS_WHY, program=True)
VMAP_CHUNKS = CacheKind("vmap", "chunk sizes", why=_MEMORY_WHY + " (keyed by the mapped arrays' types, shapes, "
                        "dtypes and axes: vmap has no differentiated arguments to plan)")

# The plans of vjp, jvp and hvp calls (functions, not transforms: one cache for all of them). A plan
# depends on the arguments alone, never on f.
_PRIMAL_PLANS = BoundedCache(PRIMAL_PLANS, 64)
_PRIMAL_FLAT = FlatPlans(_PRIMAL_PLANS)  # the same plans, for calls on arrays alone: one lookup


def _tangent_leaves(call: Call, tangents, fname):
    """The tangents' leaves, checked against the primals' structure, shapes, dtypes and devices."""
    b = call.backend
    treedef = call.treedef if call.treedef is not None else optree.tree_structure(tuple(call.args))
    try:
        leaves = treedef.flatten_up_to(tuple(tangents))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{fname}: tangents must have the structure of primals, {treedef}; ({exc})") from None
    return tuple(
        tl if b.matches(tl, p) else _checks.check_like(b, tl, p, lambda k=k: "tangent for " + call.names()[k], fname)
        for k, (tl, p) in enumerate(zip(leaves, call.diff)))


def _cotangent_name(out_tree, k):
    return _checks.leaf_names(optree.tree_unflatten(out_tree, list(range(out_tree.num_leaves))), "cotangent")[k]


def _primals_tuple(primals, tangents, fname):
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError(f"{fname}: primals and tangents must be tuples or lists; got {type(primals).__name__} and "
                        f"{type(tangents).__name__}")
    if len(primals) != len(tangents):
        raise ValueError(f"{fname}: primals and tangents must have the same length; got {len(primals)} and "
                         f"{len(tangents)}")
    return tuple(primals)


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
      ``output`` and returns a tuple with one cotangent per primal, shaped like the primal. ``vjp_fn``
      computes at the point of this call whatever the caller later writes into the primals, the output
      or aux (on backends with mutable arrays it works on copies); arrays that ``f`` closes over are
      read as they are when ``vjp_fn`` runs.

    Example:
      >>> out, vjp_fn = unigrad.vjp(lambda x: x ** 2, np.arange(3.0))
      >>> vjp_fn(np.ones(3))
      (array([0., 2., 4.]),)
    """
    call = _PRIMAL_FLAT.prepare(f, primals, None, has_aux, backend, "vjp")
    b = call.plan.backend
    if b.mutable_arrays:  # vjp_fn outlives the call: it must read nothing the caller can write into
        copy = b.copy  # (a NumPy array's own copy inline: a call less per array)
        outputs, vjp_flat, aux = b.vjp(call.flat_f, tuple([x.copy() if type(x) is np.ndarray else copy(x)
                                                           for x in call.diff]), has_aux=has_aux)
        outputs = tuple([o.copy() if type(o) is np.ndarray else copy(o) for o in outputs])
        if aux:
            aux = tuple([b.copy(a) if b.is_array(a) else a for a in aux])
    else:
        outputs, vjp_flat, aux = b.vjp(call.flat_f, call.diff, has_aux=has_aux)
    out_tree = call.seen.out_tree
    flat = call.treedef is None  # (and argnums None: the result is the tuple of the leaves' cotangents)

    scalar = outputs[0] if out_tree is _LEAF and type(outputs[0]) is np.ndarray and outputs[0].ndim == 0 \
        and outputs[0].dtype.kind == "f" else None  # a real scalar output: a Python float cotangent is cast at once

    def vjp_fn(cotangent):
        if out_tree is _LEAF and b.matches(cotangent, outputs[0]):  # one output, a cotangent needing no checks
            cts = vjp_flat((cotangent,))
            return cts if flat and type(cts) is tuple else call.inputs_like(cts)
        if scalar is not None and type(cotangent) is float:  # (check_like's answer for it, without its work)
            cts = vjp_flat((np.asarray(cotangent, dtype=scalar.dtype),))
            return cts if flat and type(cts) is tuple else call.inputs_like(cts)
        try:
            cts = (cotangent,) if out_tree is _LEAF else out_tree.flatten_up_to(cotangent)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"vjp_fn: the cotangent must have the structure of the output, {out_tree}; "
                             f"got {optree.tree_structure(cotangent, none_is_leaf=True)} ({exc})") from None
        checked = []
        for k, (c, o) in enumerate(zip(cts, outputs)):
            if not b.matches(c, o):
                c = _checks.check_like(b, c, o, lambda k=k, o=o: f"{_cotangent_name(out_tree, k)} (for an output of "
                                       f"shape {b.shape(o)}, dtype {b.dtype(o)})", "vjp_fn")
            checked.append(c)
        return call.inputs_like(vjp_flat(tuple(checked)))

    out = outputs[0] if out_tree is _LEAF else unflatten(out_tree, outputs)
    if has_aux:
        return out, vjp_fn, call.aux(aux)
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
    primals = _primals_tuple(primals, tangents, "jvp")
    call = prepare(_PRIMAL_PLANS, f, primals, None, has_aux, backend, "jvp")
    tan_leaves = _tangent_leaves(call, tangents, "jvp")
    outputs, tangents_out, aux = call.backend.jvp(call.flat_f, call.diff, tan_leaves, has_aux=has_aux)
    result = (call.output(outputs), call.output(tangents_out))
    return result + (call.aux(aux),) if has_aux else result


# ---------------------------------------------------------------------------------------------
# grad / value_and_grad
# ---------------------------------------------------------------------------------------------

def value_and_grad(f: Callable, argnums=0, has_aux: bool = False, backend=None, *, compile: bool = False,
                   device=None, static_argnums=(), static_argnames=()) -> Callable:
    """A function returning ``(f(*args), gradient)`` of a scalar-valued ``f``.

    Args:
      f: returns a real scalar (shape ``()``), or ``(scalar, aux)`` with ``has_aux``.
      argnums: int or tuple of ints: which positional arguments to differentiate.
      has_aux: return ``((value, aux), gradient)``.
      backend: backend name or object.
      compile: run the whole transform as one compiled program (``jax.jit``, ``tf.function``) on
        backends that compile (elsewhere it runs eagerly), built once per signature: the argument
        structure, each array's shape and dtype, and the exact value of each non-array argument that
        is static. As in ``jax.jit``, Python floats and complex numbers are dynamic, weakly typed
        inputs of the program (``x32 * c`` stays float32; a new value does not recompile); ints,
        bools, strings and other values are static.
      device: place the inputs on this device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu"``).
      static_argnums: with ``compile=True``, the arguments whose Python floats are static too
        (``f`` uses their values in Python: a branch, ``math.exp``); one program per value.
      static_argnames: the same, by ``f``'s parameter names.

    Returns:
      A function of the same arguments; the gradient has the structure of
      ``args[argnums]`` (a tuple of those when argnums is a tuple).

    Example:
      >>> unigrad.value_and_grad(lambda x: (x ** 2).sum())(np.arange(3.0))
      (array(5.), array([0., 2., 4.]))
    """
    return _value_and_grad(f, argnums, has_aux, backend, compile, device, static_argnums, static_argnames, True)


def _value_and_grad(f, argnums, has_aux, backend, compile, device, static_argnums, static_argnames, keep_value):
    """``value_and_grad`` (``keep_value``) or ``grad``: a compiled ``grad`` returns no value from its
    program (one output array fewer to hand back on every call)."""
    plans = BoundedCache(GRAD_PLANS)
    programs = BoundedCache(GRAD_PROGRAMS) if compile else None
    static = static_arguments(f, static_argnums, static_argnames, argnums, "grad") if compile else None

    def kernel(b, flat_f, leaves):
        return b.value_and_grad(flat_f, leaves, has_aux=has_aux,
                                check=lambda outputs: scalar_check(b, outputs, "grad"))

    repeats = Repeats(static, backend, device) if compile else None
    flat = FlatPlans(plans) if not compile and device is None else None

    def finish(call, program):
        """A repeat's whole call, arguments to result, where the results need no structure but the
        program's: no aux (see ``Repeats.remember``)."""
        if has_aux or program.aux_static:
            return None
        single, n_out, out_tree = call.plan.single, program.n_out, program.out_tree
        if not keep_value:
            if single:
                return program.flat_runner(call, 0)
            run = program.flat_runner(call)
            return None if run is None else (lambda args: tuple(run(args)))
        run = program.flat_runner(call)
        if run is None or out_tree is not _LEAF:
            return None

        def value_and_grad_run(args):
            flat = run(args)
            return flat[0], (flat[n_out] if single else tuple(flat[n_out:]))
        return value_and_grad_run

    def value_and_grad_f(*args, **kwargs):
        if repeats is not None and not kwargs:
            miss = repeats.run(args)
            if type(miss) is not Miss:  # a repeat of a compiled signature: arguments to the program to the result
                return miss
            key = miss.key
            call = None if key is None else repeats.call(key, f, args, has_aux, "grad")
        else:
            call, key = None, None
        if call is not None:  # a repeat of a compiled signature: straight to its program
            outputs, grads, aux = call.program(call)
        else:
            if flat is not None and not kwargs:  # eager, on arrays alone: the plan in one lookup
                call = flat.prepare(f, args, argnums, has_aux, backend, "grad")
            else:
                g = f if not kwargs else (lambda *a: f(*a, **kwargs))
                call = prepare(plans, g, args, argnums, has_aux, backend, "grad", device,
                               static if not kwargs else None)
            outputs, grads, aux = execute(call, kernel, programs if not kwargs else None, keep_outputs=keep_value,
                                          bare=not keep_value and not has_aux and len(call.diff) == 1)
            if key is not None:
                repeats.remember(key, call, finish)
        if not call.diff:
            scalar_check(call.backend, outputs, "grad")
        grads = call.inputs_like(grads)
        if not keep_value:
            return (grads, call.aux(aux)) if has_aux else grads
        value = call.output(outputs)
        return ((value, call.aux(aux)), grads) if has_aux else (value, grads)

    _wraps(value_and_grad_f, f, "value_and_grad" if keep_value else "grad")
    return value_and_grad_f


def grad(f: Callable, argnums=0, has_aux: bool = False, backend=None, *, compile: bool = False,
         device=None, static_argnums=(), static_argnames=()) -> Callable:
    """The gradient of a scalar-valued ``f`` (reverse mode, one backward pass).

    Args:
      f: returns a real scalar, or ``(scalar, aux)`` with ``has_aux``.
      argnums: int or tuple of ints.
      has_aux: return ``(gradient, aux)``.
      backend: backend name or object.
      compile: one compiled program per signature (see :func:`value_and_grad`).
      device: place the inputs on this device.
      static_argnums: with ``compile=True``, positions of arguments whose Python floats are static
        (see :func:`value_and_grad`).
      static_argnames: the same by parameter name.

    Returns:
      A function of the same arguments returning the gradient, shaped like ``args[argnums]``
      (``(gradient, aux)`` with ``has_aux``).

    Example:
      >>> unigrad.grad(lambda x: (x ** 2).sum())(np.arange(3.0))
      array([0., 2., 4.])
    """
    return _value_and_grad(f, argnums, has_aux, backend, compile, device, static_argnums, static_argnames, False)


# ---------------------------------------------------------------------------------------------
# Jacobians
# ---------------------------------------------------------------------------------------------

def jacobian(f: Callable, argnums=0, *, mode: str = "auto", chunk_size: int | None = None,
             has_aux: bool = False, backend=None, compile: bool = False, device=None,
             memory_budget=None, static_argnums=(), static_argnames=()) -> Callable:
    """The Jacobian of ``f`` with respect to ``args[argnums]``.

    Args:
      f: function returning an array or a pytree of arrays.
      argnums: int or tuple of ints.
      mode: ``"rev"`` (one VJP per output element, vectorised), ``"fwd"`` (one JVP per input
        element, vectorised) or ``"auto"``: forward when the inputs have fewer elements than the
        outputs, else reverse (from the shapes, once per signature); where forward mode raises (an
        operation the engine has no forward rule for, a JAX ``custom_vjp``, TensorFlow control flow that
        pfor cannot vectorise), reverse mode, remembered for the signature (docs/transforms.md, "Modes").
      chunk_size: at most this many basis vectors at a time, to bound memory.
      has_aux: return ``(jacobian, aux)``.
      backend: backend name or object.
      compile: one compiled program per signature (``jax.jit``, ``tf.function``; Python floats are
        dynamic inputs, see :func:`value_and_grad`).
      device: place the inputs on this device.
      memory_budget: bytes (``2e9``) or a size (``"2GB"``, ``"512MiB"``) for the result and the work
        together; the chunk size is chosen from it, from the measured peak of one VJP (or JVP), once
        per signature. Ignored when ``chunk_size`` is given.
      static_argnums: with ``compile=True``, positions of arguments whose Python floats are static
        (see :func:`value_and_grad`).
      static_argnames: the same by parameter name.

    Returns:
      A function; for an output of shape ``O`` and an input of shape ``I`` the block has shape
      ``O + I``; pytrees nest as the output's structure around the input's structure.

    Example:
      >>> unigrad.jacobian(lambda x: x ** 2)(np.arange(3.0))
      array([[0., 0., 0.],
             [0., 2., 0.],
             [0., 0., 4.]])
    """
    check_mode(mode, "jacobian")
    check_chunk(chunk_size, "jacobian")
    budget = _memory.parse_budget(memory_budget, "jacobian") if chunk_size is None else None
    plans, shapes = BoundedCache(JACOBIAN_PLANS), BoundedCache(JACOBIAN_SHAPES, 64)
    chunks, fallbacks = BoundedCache(JACOBIAN_CHUNKS, 64), BoundedCache(JACOBIAN_FALLBACKS, 64)
    programs = BoundedCache(JACOBIAN_PROGRAMS) if compile else None
    static = static_arguments(f, static_argnums, static_argnames, argnums, "jacobian") if compile else None

    def kernel_for(chosen, chunk):
        def kernel(b, flat_f, leaves):
            method = b.jacrev if chosen == "rev" else b.jacfwd
            outs, jac, aux = method(flat_f, leaves, chunk_size=chunk, has_aux=has_aux)
            if chosen == "rev" and real_to_complex(b, outs, leaves):  # rows would hold Re J alone
                if mode == "rev":
                    raise reverse_complex_error("jacobian")
                outs, jac, aux = b.jacfwd(flat_f, leaves, chunk_size=chunk, has_aux=has_aux)
            return outs, _flatten_blocks(promoted_blocks(b, outs, leaves, jac)), aux
        return kernel

    kernels = {"rev": kernel_for("rev", chunk_size), "fwd": kernel_for("fwd", chunk_size)}

    repeats = Repeats(static, backend, device) if compile else None

    def jacobian_f(*args):
        if repeats is not None:
            miss = repeats.run(args)
            if type(miss) is not Miss:  # a repeat whose whole call is the program's one block
                return miss
            key = miss.key
            call = None if key is None else repeats.call(key, f, args, has_aux, "jacobian")
        else:
            call, key = None, None
        if call is not None:  # a repeat of a compiled signature (mode and chunk follow from it)
            _, blocks, aux = call.program(call)
            jac = call.blocks_tree(blocks)
            return (jac, call.aux(aux)) if has_aux else jac
        call = prepare(plans, f, args, argnums, has_aux, backend, "jacobian", device, static)
        first = _first_pass(call, programs, shapes, fallbacks) if mode == "auto" and budget is None and call.diff \
            else None
        if first is not None:  # a signature met for the first time: its shapes from the Jacobian's own pass
            done = _first_call(call, first, shapes, fallbacks, chunk_size, has_aux, kernels["rev"])
            if done is not None:
                jac = call.blocks_tree(done[0])
                return (jac, call.aux(done[1])) if has_aux else jac
        chosen = mode if mode != "auto" else choose_mode(shapes, call, per_example=False) if call.diff else "rev"

        def run(chosen):
            kernel, decision = kernels[chosen], chosen
            if budget is not None and call.diff:
                chunk = budget_chunk(chunks, shapes, call, chosen, False, budget, "jacobian")
                kernel, decision = kernel_for(chosen, chunk), (chosen, chunk)
            return execute(call, kernel, programs, decision, keep_outputs=False)

        # "auto" never keeps a mode f cannot do: forward mode that raises falls back to reverse (run_auto)
        _, blocks, aux = run(chosen) if mode != "auto" else run_auto(fallbacks, call, run, chosen, "rev", "jacobian")
        if key is not None:
            repeats.remember(key, call, block_runner)
        jac = call.blocks_tree(blocks)
        return (jac, call.aux(aux)) if has_aux else jac

    _wraps(jacobian_f, f, "jacobian")
    return jacobian_f


def _first_pass(call: Call, programs, shapes, fallbacks):
    """How ``mode="auto"`` learns this call's output shapes from the evaluation of ``f`` that its Jacobian
    needs anyway, rather than from one of its own: ``"rev"`` (one VJP, then pulled back over the basis),
    ``"fwd"`` (one plain evaluation, then the basis pushed through JVPs), or None (its own evaluation).

    Where the call runs eagerly, the signature's shapes are not known yet and the backend's Jacobian is
    the generic one (:meth:`Backend.jacrev` / :meth:`Backend.jacfwd`, which evaluate ``f`` first): on an
    engine that prefers reverse mode at small sizes (``forward_ratio`` > 1: torch) the VJP, else the plain
    evaluation (the autograd plugin, eager MLX; a VJP's recorded pass would be thrown away where forward
    mode is chosen). A transform built on every call (``jacobian(f)(x)`` inline, nested in another
    transform's ``f``) meets every signature for the first time: where the mode chosen is that pass's,
    ``f`` is evaluated once, not twice."""
    b = call.backend
    if ((programs is not None and b.capabilities.compile) or not b.capabilities.forward_mode
            or shapes.lookup(call) is not None or fallbacks.lookup(call) is not None):
        return None
    if b.forward_ratio > 1:  # (a backend's own jacrev evaluates f first: only through its record_for_jacrev)
        return "rev" if type(b).jacrev is Backend.jacrev or b.record_for_jacrev is not None else None
    return "fwd" if type(b).jacfwd is Backend.jacfwd else None


def _first_call(call: Call, first, shapes, fallbacks, chunk_size, has_aux, reverse_kernel):
    """``(blocks, aux)`` of ``jacobian(mode="auto")`` for ``call`` from the pass :func:`_first_pass` named,
    where the mode chosen from the shapes of its outputs is that pass's; None where it is the other mode
    (the shapes are kept: the caller goes on as for a known signature). From the plain evaluation, forward
    mode that raises falls back to reverse (``reverse_kernel``), as everywhere in "auto"."""
    b = call.backend
    if first == "rev":
        try:
            recorded = None if b.record_for_jacrev is None else b.record_for_jacrev(call.flat_f, call.diff,
                                                                                    has_aux=has_aux)
            if recorded is None:
                outputs, vjp_fn, aux = b.vjp(call.flat_f, call.diff, has_aux=has_aux)
                finish = functools.partial(b.jacobian_of_vjp, outputs, vjp_fn, call.diff)
            else:
                outputs, finish, aux = recorded
        except Exception:  # (f without a reverse rule where forward mode may be chosen: the caller's path
            return None    # decides, and raises f's own error where both fail)
        if mode_for_shapes(call, shapes.store(call, tuple(b.shape(o) for o in outputs)), False) != "rev":
            return None
        if real_to_complex(b, outputs, call.diff):  # reverse rows would hold Re J alone: the caller goes forward
            return None
        jac = finish(chunk_size)
        return _flatten_blocks(promoted_blocks(b, outputs, call.diff, jac)), (aux or ())
    outputs, aux, push_f = b._forward(call.flat_f, call.diff, has_aux)
    if mode_for_shapes(call, shapes.store(call, tuple(b.shape(o) for o in outputs)), False) != "fwd":
        return None

    def run(chosen):
        if chosen == "rev":
            _, blocks, rev_aux = execute(call, reverse_kernel)
            return blocks, rev_aux
        jac = b.jacobian_of_jvp(outputs, push_f, call.diff, chunk_size)
        return _flatten_blocks(promoted_blocks(b, outputs, call.diff, jac)), (aux or ())
    return run_auto(fallbacks, call, run, "fwd", "rev", "jacobian")


def jacrev(f: Callable, argnums=0, *, chunk_size=None, has_aux=False, backend=None, compile=False,
           device=None, static_argnums=(), static_argnames=()) -> Callable:
    """``jacobian(f, argnums, mode="rev")``: best when outputs have fewer elements than inputs.

    Example:
      >>> unigrad.jacrev(lambda x: (x ** 2).sum())(np.arange(3.0))
      array([0., 2., 4.])
    """
    return jacobian(f, argnums, mode="rev", chunk_size=chunk_size, has_aux=has_aux, backend=backend,
                    compile=compile, device=device, static_argnums=static_argnums, static_argnames=static_argnames)


def jacfwd(f: Callable, argnums=0, *, chunk_size=None, has_aux=False, backend=None, compile=False,
           device=None, static_argnums=(), static_argnames=()) -> Callable:
    """``jacobian(f, argnums, mode="fwd")``: best when inputs have fewer elements than outputs.

    Example:
      >>> unigrad.jacfwd(lambda x: x * np.arange(1.0, 3.0))(np.array(2.0))
      array([1., 2.])
    """
    return jacobian(f, argnums, mode="fwd", chunk_size=chunk_size, has_aux=has_aux, backend=backend,
                    compile=compile, device=device, static_argnums=static_argnums, static_argnames=static_argnames)


# ---------------------------------------------------------------------------------------------
# Second order
# ---------------------------------------------------------------------------------------------

def _hvp_product(b, flat_f, primals, tangents, fname):
    """``H @ tangents`` of a flat ``f`` at ``primals`` (one block per primal), ``f`` checked to return a
    real scalar where it runs, inside the backend's sweep (no separate forward pass)."""

    def scalar_f(*leaves):
        outputs = flat_f(*leaves)
        scalar_check(b, outputs, fname)
        return outputs

    closure = getattr(flat_f, "closure_arrays", None)
    if closure is not None:
        scalar_f.closure_arrays = closure
    return tuple(b.hvp(scalar_f, primals, tangents))


def _hvp_kernel(fname):
    """The kernel of ``hessian_vector_product``: its leaves are the primals' and then the tangents'
    (``f`` of them all ignores the tangents); the result blocks are ``H @ tangents``."""

    def kernel(b, flat_f, leaves):
        n = len(leaves) // 2
        tangents = leaves[n:]

        def f_of_primals(*primals):
            return flat_f(*primals, *tangents)

        closure = getattr(flat_f, "closure_arrays", None)
        if closure is not None:
            f_of_primals.closure_arrays = closure
        return (), _hvp_product(b, f_of_primals, leaves[:n], tangents, fname), ()
    return kernel


def hvp(f: Callable, primals, tangents, backend=None, *, compile: bool = False):
    """Hessian-vector product of a scalar-valued ``f`` at ``primals`` along ``tangents``.

    Evaluates once; :func:`hessian_vector_product` is the reusable transform (``compile=``, ``device=``,
    ``argnums``) for loops that ask for many products. The cost of a few gradients, never the Hessian.
    Complex inputs: ``jvp`` of ``grad`` in unigrad's convention (docs/conventions.md), which equals the
    pullback of ``grad`` along ``tangents`` (``v^T H``): for a real ``f`` there is one product.

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
    if compile:
        raise TypeError("hvp evaluates once and keeps nothing to compile; for a compiled, reusable form use "
                        "unigrad.hessian_vector_product(f, argnums=..., compile=True)(*primals, tangents)")
    primals = _primals_tuple(primals, tangents, "hvp")
    call = _PRIMAL_FLAT.prepare(f, primals, None, False, backend, "hvp")
    b = call.plan.backend
    if not b.capabilities.higher_order:
        raise _checks.not_nestable(b, "hvp")
    tan_leaves = _tangent_leaves(call, tangents, "hvp")
    if not call.diff:  # nothing to differentiate ({}, (), None): f is checked, and the result is empty
        scalar_check(b, b.evaluate(call.flat_f, ()), "hvp")
        return call.inputs_like(())
    return call.inputs_like(_hvp_product(b, call.flat_f, call.diff, tan_leaves, "hvp"))


def hessian_vector_product(f: Callable, argnums=0, *, backend=None, compile: bool = False, device=None,
                           static_argnums=(), static_argnames=()) -> Callable:
    """The Hessian-vector product of a scalar-valued ``f`` as a reusable function: ``hvp_f(*args,
    tangents)`` returns ``H @ tangents``, ``H`` the Hessian of ``f`` with respect to ``args[argnums]``.

    What a trust-region or Newton-CG loop calls many times: the plan of each signature is made once,
    and with ``compile=True`` the whole product is one compiled program per signature (``jax.jit``,
    ``tf.function``), as for :func:`grad`. Forward over reverse (``jvp`` of the gradient: the cost of a
    few gradients, never the Hessian); on torch outside ``torch.func`` reverse over reverse, which torch
    runs faster; the two give the same product, the Hessian of a real ``f`` being symmetric. Complex
    inputs follow ``jvp`` of ``grad`` in unigrad's convention (docs/conventions.md).

    Args:
      f: returns a real scalar.
      argnums: int or tuple of ints: the arguments the Hessian is taken with respect to.
      backend: backend name or object.
      compile: one compiled program per signature (Python floats are dynamic inputs, see
        :func:`value_and_grad`).
      device: place the inputs on this device.
      static_argnums: with ``compile=True``, positions (in ``f``'s arguments) of arguments whose Python
        floats are static.
      static_argnames: the same by parameter name.

    Returns:
      A function of ``f``'s positional arguments followed by one more, the tangents: shaped like
      ``args[argnums]`` (a tuple of those when argnums is a tuple), floating dtypes (cast to the
      argument's dtype), never broadcast. It returns ``H @ tangents`` in the same structure.

    Example:
      >>> hvp_f = unigrad.hessian_vector_product(lambda x: (x ** 3).sum())
      >>> hvp_f(np.array([1.0, 2.0]), np.ones(2))
      array([ 6., 12.])
    """
    fname = "hessian_vector_product"
    static = static_arguments(f, static_argnums, static_argnames, argnums, fname) if compile else None
    # The transform's arguments are f's and then the tangents: the tangents are differentiated leaves of
    # the plan (converted and checked for a floating dtype like the primals, inputs of the program), which
    # f never sees. A static position counted from the end of f's arguments is one further from the end.
    static_all = None if static is None else frozenset(a - 1 if a < 0 else a for a in static)
    plans, primal_plans = BoundedCache(HVP_PLANS), BoundedCache(HVP_PRIMAL_PLANS)
    programs = BoundedCache(HVP_PROGRAMS) if compile else None
    repeats = Repeats(static_all, backend, device) if compile else None
    flat = FlatPlans(plans) if not compile and device is None else None
    kernel = _hvp_kernel(fname)
    positions: dict = {}  # the number of f's arguments -> (single, argnums and the tangents' position)

    def with_tangents(*args):  # f of the transform's arguments
        return f(*args[:-1])

    with_tangents.__wrapped__ = f  # (parameter names for messages)

    def where(n_args):
        found = positions.get(n_args)
        if found is None:
            if not n_args:
                raise TypeError(f"{fname}: the function must be called with f's arguments and then the tangents")
            single, which, _ = _checks.normalize_argnums(argnums, n_args - 1, fname)
            found = positions.setdefault(n_args, (single, which + (n_args - 1,)))
        return found

    def result(call, single, blocks):
        if call.treedef is None and single:
            return blocks[0]
        trees = call.inputs_like(tuple(blocks) + call.diff[len(blocks):])  # (the tangents' own tree last)
        return trees[0] if single else trees[:-1]

    def hvp_f(*args):
        if repeats is not None:
            miss = repeats.run(args)
            if type(miss) is not Miss:  # a repeat of a compiled signature: arguments to the program to H v
                return miss
            key = miss.key
            call = None if key is None else repeats.call(key, with_tangents, args, False, fname)
        else:
            call, key = None, None
        single, which = where(len(args))
        if call is not None:
            _, blocks, _ = call.program(call)
            return result(call, single, blocks)
        call = None
        try:
            if flat is not None:
                call = flat.prepare(with_tangents, args, which, False, backend, fname)
            else:
                call = prepare(plans, with_tangents, args, which, False, backend, fname, device, static_all)
        except TypeError:  # a tangent of an integer dtype, or a Python int: checked below, which says which
            pass
        if call is None or not _tangents_fit(call, args, single, which):
            call, key = _checked_tangents_call(args, single, which), None  # not remembered: the tangents changed
        b = call.plan.backend
        if not b.capabilities.higher_order:
            raise _checks.not_nestable(b, fname)
        if not call.diff:  # nothing to differentiate: f is checked, the result is empty
            scalar_check(b, b.evaluate(call.flat_f, ()), fname)
            return result(call, single, ())
        _, blocks, _ = execute(call, kernel, programs, keep_outputs=False, bare=len(call.diff) == 2)
        if key is not None:
            repeats.remember(key, call, _hvp_runner)
        return result(call, single, blocks)

    def _checked_tangents_call(args, single, which):
        """The call of ``args`` whose tangents were checked against the primals (structure, shapes and
        dtypes, one ValueError naming the argument) and cast or placed like them: the slow path."""
        primal_call = prepare(primal_plans, f, args[:-1], which[:-1] if not single else which[0], False,
                              backend, fname, device, static)
        expected = optree.tree_structure(args[which[0]] if single else tuple(args[a] for a in which[:-1]))
        try:
            leaves = expected.flatten_up_to(args[-1])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{fname}: the tangents (the last argument) must have the structure of "
                             f"{'argument ' + str(which[0]) if single else 'the arguments ' + str(which[:-1])}, "
                             f"{expected}; ({exc})") from None
        b = primal_call.plan.backend
        names = primal_call.names
        checked = [_checks.check_like(b, t, p, lambda k=k: "tangent for " + names()[k], fname)
                   for k, (t, p) in enumerate(zip(leaves, primal_call.diff))]
        args = args[:-1] + (optree.tree_unflatten(expected, checked),)
        return prepare(plans, with_tangents, args, which, False, backend, fname, device, static_all)

    _wraps(hvp_f, f, fname)
    return hvp_f


def _tangents_fit(call, args, single, which) -> bool:
    """The tangents (the last argument) have the structure of the primals ``args[which[:-1]]`` and each
    leaf the shape, dtype and device of its primal: the call needs no checks (the common case)."""
    diff = call.diff
    n = len(diff) // 2
    if call.treedef is None:
        if not single:
            return False
    else:
        children = call.treedef.children()
        expected = children[which[0]] if single else optree.tree_structure(tuple(args[a] for a in which[:-1]))
        if children[-1] != expected:
            return False
    matches = call.plan.backend.matches
    for k in range(n):
        if not matches(diff[n + k], diff[k]):
            return False
    return len(diff) == 2 * n


def _hvp_runner(call, program):
    """The ``finish`` of a compiled ``hessian_vector_product`` (see ``Repeats.remember``): where one
    primal array and its tangent are the call's only differentiated leaves (an int ``argnums``, no
    pytree), the product is the program's one block."""
    if len(call.diff) == 2 and call.treedef is None:  # (the tangents fitted: argnums is an int)
        return program.flat_runner(call, 0)
    return None


# ---------------------------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------------------------

def _vmap_budget_chunk(b, flat_f, leaves, axes, size, budget):
    """How many examples of a vmap fit in ``budget``: one example's call, measured, is what each costs."""
    one = [x if ax is None else _take_one(b, x, ax) for x, ax in zip(leaves, axes)]
    outputs = []
    per_example = _memory.peak_bytes(b, lambda: outputs.extend(b.evaluate(flat_f, one)))
    result_bytes = size * sum(_size(b.shape(o)) * _ITEMSIZE.get(b.dtype(o), 8) for o in outputs)
    return _memory.chunk_for_budget(budget, size, result_bytes, per_example, "vmap")


def _take_one(b, x, axis):
    index = [slice(None)] * len(b.shape(x))
    index[axis] = 0
    return x[tuple(index)]


def vmap(f: Callable, in_axes=0, out_axes: int = 0, *, chunk_size: int | None = None,
         backend=None, memory_budget=None) -> Callable:
    """Map ``f`` over an axis of its arguments.

    Args:
      f: function of arrays.
      in_axes: int, None, or a tuple with one entry (int, None or a pytree prefix) per positional
        argument: the mapped axis of each, None for unmapped.
      out_axes: the axis of the outputs that holds the map.
      chunk_size: map at most this many at a time (bounds memory).
      backend: backend name or object.
      memory_budget: bytes or a size (``"2GB"``) for the result and the work together; the chunk size
        is chosen from the measured peak of ``f`` on one example. Ignored when ``chunk_size`` is given.

    Returns:
      A function of the same arguments; each output has the mapped axis at ``out_axes``.

    Example:
      >>> unigrad.vmap(lambda x: (x ** 2).sum())(np.ones((4, 3)))
      array([3., 3., 3., 3.])
    """
    check_chunk(chunk_size, "vmap")
    if not isinstance(out_axes, int) or isinstance(out_axes, bool):
        raise TypeError(f"vmap: out_axes must be an int; got {out_axes!r}")
    budget = _memory.parse_budget(memory_budget, "vmap") if chunk_size is None else None
    chunks = BoundedCache(VMAP_CHUNKS, 64)

    def vmapped(*args):
        if isinstance(in_axes, (tuple, list)):
            if len(in_axes) != len(args):
                raise ValueError(f"vmap: in_axes has {len(in_axes)} entries but the function was called with "
                                 f"{len(args)} positional arguments")
            prefix = tuple(in_axes)
        else:
            prefix = (in_axes,) * len(args)
        leaves, treedef = optree.tree_flatten(tuple(args), none_is_leaf=False)
        reject_lazy(leaves, args, "vmap")
        axes = optree.broadcast_prefix(prefix, tuple(args), none_is_leaf=True)
        b = _registry.resolve(backend, leaves)
        leaves = [_checks.convert(b, x, "vmap argument") for x in leaves]
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

        chunk = chunk_size
        if budget is not None and chunk is None:
            key = VMAP_CHUNKS.key_of((b, tuple(flat_axes), tuple((type(x), b.shape(x), b.dtype(x)) for x in leaves)))
            chunk = chunks.get(key)
            if chunk is None:
                chunk = chunks.put(key, _vmap_budget_chunk(b, flat_f, leaves, flat_axes, size, budget))
        outs = b.vmap(flat_f, flat_axes, out_axes, chunk)(*leaves)
        return optree.tree_unflatten(store["tree"], list(outs))

    _wraps(vmapped, f, "vmap")
    return vmapped
