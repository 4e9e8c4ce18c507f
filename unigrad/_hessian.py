"""Second derivatives: :func:`hessian` and :func:`value_jacobian_and_hessian`.

Both nest two derivatives of the flat ``f`` (``_call.py``): the inner one is reverse mode (a VJP of a
scalar output, else a reverse Jacobian), the outer one forward (``mode="fwd-rev"``, JAX's
``jacfwd(jacrev(f))``) or reverse (``"rev-rev"``, for engines or functions without forward mode);
``"auto"`` is forward over reverse, falling back to reverse over reverse where forward mode raises
(:func:`unigrad._transform.run_auto`). The value and the first derivative come out of the same
evaluation: the outer derivative's outputs are the inner one's blocks, and ``f``'s outputs (and aux)
ride along as aux of the outer derivative, as ``jax.jacfwd(jax.jacrev(f, has_aux=True), has_aux=True)``.
"""

from __future__ import annotations

from typing import Callable

from . import _checks
from ._caches import BoundedCache, CacheKind
from ._call import prepare
from ._checks import check_chunk
from ._plan import PLANS_WHY
from ._program import PROGRAMS_WHY, execute
from ._transform import (FALLBACKS_NAME, FALLBACKS_WHY, SHAPES_WHY, _flatten_blocks, _wraps, output_shapes,
                         promoted_blocks, real_to_complex, run_auto, static_arguments)

__all__ = ["hessian", "value_jacobian_and_hessian", "MODES"]

#: The modes of the second-order transforms: (outer) over (inner).
MODES = ("fwd-rev", "rev-rev", "auto")

# What the transforms of this module keep, and what each entry depends on (unigrad._caches).
HESSIAN_PLANS = CacheKind("hessian", "plans", why=PLANS_WHY)
HESSIAN_SHAPES = CacheKind("hessian", "output shapes", why=SHAPES_WHY, program=True)
HESSIAN_PROGRAMS = CacheKind("hessian", "compiled programs", why=PROGRAMS_WHY, program=True)
HESSIAN_FALLBACKS = CacheKind("hessian", FALLBACKS_NAME, why=FALLBACKS_WHY, program=True)
VJH = "value_jacobian_and_hessian"
VJH_PLANS = CacheKind(VJH, "plans", why=PLANS_WHY)
VJH_SHAPES = CacheKind(VJH, "output shapes", why=SHAPES_WHY, program=True)
VJH_PROGRAMS = CacheKind(VJH, "compiled programs", why=PROGRAMS_WHY, program=True)
VJH_FALLBACKS = CacheKind(VJH, FALLBACKS_NAME, why=FALLBACKS_WHY, program=True)


def check_mode(mode, fname):
    """A ValueError naming the choices for a mode that is not one of :data:`MODES`."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"{fname}: mode must be one of 'fwd-rev' (forward over reverse, the default), 'rev-rev' "
                         f"(reverse over reverse: for engines or functions without forward mode) or 'auto' "
                         f"(forward over reverse, reverse over reverse where forward mode raises); got {mode!r}")


def _outer_modes(mode, b):
    """(the outer mode to run first, the one to fall back to) for ``mode``: ``"fwd"`` or ``"rev"``."""
    if mode == "rev-rev":
        return "rev", "rev"
    if mode == "fwd-rev":
        return "fwd", "fwd"
    # auto: a backend whose JVP is two VJPs (no true forward mode) goes reverse over reverse at once
    return ("fwd" if b.capabilities.forward_mode else "rev"), "rev"


def _nested(outer, scalar, has_aux, chunk_size, keep_jacobian, fname):
    """The kernel of the second derivative: ``outer`` (``"fwd"``: ``jacfwd``, ``"rev"``: ``jacrev``) of the
    first, a reverse-mode derivative (one VJP of a unit cotangent where ``scalar``: the signature's output
    is one scalar, re-checked where it runs; else ``jacrev``). ``f``'s outputs and aux ride along as aux of
    the outer derivative (detached: no value escapes a transform by side effect). Its blocks: with
    ``keep_jacobian`` the first derivative's (output i, input j, in the dtype ``jacobian`` gives), then the
    second's (output i, input j, input k)."""

    def kernel(b, flat_f, leaves):
        n_out = []

        def first(*p):
            if scalar:
                outs, vjp_fn, aux = b.vjp(flat_f, p, has_aux=has_aux)
                if len(outs) == 1 and b.shape(outs[0]) == ():
                    blocks = tuple(vjp_fn((b.ones_like(outs[0]),)))
                else:  # f returned other shapes than the signature's first call: the general form
                    outs, jac, aux = b.jacrev(flat_f, p, has_aux=has_aux)
                    blocks = _flatten_blocks(jac)
            else:
                outs, jac, aux = b.jacrev(flat_f, p, has_aux=has_aux)
                blocks = _flatten_blocks(jac)
            if real_to_complex(b, outs, p):  # a real input's VJP is real: Im J would be lost, silently
                raise ValueError(f"{fname}: a complex output of a real input: the inner derivative is reverse mode, "
                                 f"which would lose the imaginary part; make the input complex")
            n_out[:] = [len(outs)]
            carried = tuple(b.stop_gradient(o) for o in outs) + tuple(
                b.stop_gradient(a) if b.is_array(a) else a for a in (aux or ()))
            return blocks, carried

        method = b.jacfwd if outer == "fwd" else b.jacrev
        jac1, jac2, carried = method(first, leaves, chunk_size=chunk_size, has_aux=True)
        k = n_out[0]
        outs, aux = tuple(carried[:k]), tuple(carried[k:])
        blocks = _flatten_blocks(jac2)
        if keep_jacobian:
            n = len(leaves)
            rows = [tuple(jac1[i * n:(i + 1) * n]) for i in range(k)]
            blocks = _flatten_blocks(promoted_blocks(b, outs, leaves, rows)) + tuple(blocks)
        return outs, blocks, aux

    return kernel


def _hessian_tree(call, blocks):
    """Flat blocks (output i, input j, input k) nested as output structure, then input, then input."""
    n = len(call.diff)
    n_out = call.seen.out_tree.num_leaves
    return call.output([call.inputs_like([call.inputs_like(list(blocks[(i * n + j) * n:(i * n + j + 1) * n]))
                                          for j in range(n)]) for i in range(n_out)])


def hessian(f: Callable, argnums=0, *, mode: str = "fwd-rev", chunk_size: int | None = None,
            has_aux: bool = False, backend=None, compile: bool = False, device=None, static_argnums=(),
            static_argnames=()) -> Callable:
    """The Hessian of ``f`` (forward over reverse: ``jacfwd(jacrev(f))``, by default).

    Args:
      f: function; for a scalar output the result is ``H[j][k]`` of shape ``in_j + in_k``;
        for a non-scalar output of shape ``O`` the blocks have shape ``O + in_j + in_k``.
      argnums: int or tuple of ints.
      mode: ``"fwd-rev"`` (forward over reverse, the default; for a scalar output the backend's own
        Hessian, which on TensorFlow is nested tapes), ``"rev-rev"`` (reverse over reverse: for
        engines or functions without forward mode, such as HIPS autograd's ``inv`` or a JAX
        ``custom_vjp``) or ``"auto"`` (forward over reverse, and reverse over reverse where forward
        mode raises, remembered for the signature). All give the same Hessian.
      chunk_size: bound on the basis vectors of the outer derivative at a time.
      has_aux: ``f`` returns ``(output, aux)``; the function returns ``(hessian, aux)``.
      backend: backend name or object.
      compile: one compiled program per signature (Python floats are dynamic inputs, see
        :func:`value_and_grad`).
      device: place the inputs on this device.
      static_argnums: with ``compile=True``, positions of arguments whose Python floats are static.
      static_argnames: the same by parameter name.

    Returns:
      A function returning the Hessian blocks, nested as output structure, then input, then input
      (``(hessian, aux)`` with ``has_aux``).

    Example:
      >>> unigrad.hessian(lambda x: (x ** 3).sum())(np.array([1.0, 2.0]))
      array([[ 6.,  0.],
             [ 0., 12.]])
    """
    fname = "hessian"
    check_mode(mode, fname)
    check_chunk(chunk_size, fname)
    plans, shapes = BoundedCache(HESSIAN_PLANS), BoundedCache(HESSIAN_SHAPES, 64)
    fallbacks = BoundedCache(HESSIAN_FALLBACKS, 64)
    programs = BoundedCache(HESSIAN_PROGRAMS) if compile else None
    static = static_arguments(f, static_argnums, static_argnames, argnums, fname) if compile else None
    kernels = {(outer, scalar): _nested(outer, scalar, has_aux, chunk_size, False, fname)
               for outer in ("fwd", "rev") for scalar in (False, True)}

    def own(b, flat_f, leaves):  # the backend's own Hessian (its fastest form: nested tapes on TensorFlow)
        return (), _flatten_blocks(b.hessian(flat_f, leaves, chunk_size=chunk_size)), ()

    def hessian_f(*args):
        call = prepare(plans, f, args, argnums, has_aux, backend, fname, device, static)
        b = call.backend
        if not b.capabilities.higher_order:
            raise _checks.not_nestable(b, fname)
        # Scalar or not is decided from the signature's output shapes, and re-checked on what f returned
        # this time (its shapes may depend on values): the backend's scalar form is wrong for other outputs.
        is_scalar = output_shapes(shapes, call) == ((),)

        def run(outer):
            if outer == "rev" or not is_scalar or has_aux:
                return execute(call, kernels[outer, is_scalar], programs, (outer, is_scalar), keep_outputs=False)
            call.seen.out_shapes = ()  # () asks flat_f to record the shapes
            try:
                result = execute(call, own, programs, "own", keep_outputs=False)
                if call.seen.out_shapes not in ((), ((),)):
                    result = execute(call, kernels["fwd", False], None)  # the general form, right for any output
            finally:
                call.seen.out_shapes = None
            return result

        first, fallback = _outer_modes(mode, b)
        _, blocks, aux = run_auto(fallbacks if mode == "auto" else None, call, run, first, fallback, fname)
        hess = _hessian_tree(call, blocks)
        return (hess, call.aux(aux)) if has_aux else hess

    _wraps(hessian_f, f, fname)
    return hessian_f


def value_jacobian_and_hessian(f: Callable, argnums=0, *, mode: str = "fwd-rev", chunk_size: int | None = None,
                               has_aux: bool = False, backend=None, compile: bool = False, device=None,
                               static_argnums=(), static_argnames=()) -> Callable:
    """``f``'s value, Jacobian (the gradient, for a scalar ``f``) and Hessian from one evaluation.

    One nested derivative, as ``jax.jacfwd(jax.jacrev(f, has_aux=True), has_aux=True)`` gives it: the
    outer derivative's outputs are the Jacobian, and ``f``'s value (and aux) ride along as its aux. The
    cost of :func:`hessian` alone, where calling ``f``, :func:`jacobian` and :func:`hessian` separately
    costs three passes.

    Args:
      f: function returning an array or a pytree of arrays (``(output, aux)`` with ``has_aux``).
      argnums: int or tuple of ints.
      mode: ``"fwd-rev"`` (the default), ``"rev-rev"`` or ``"auto"``, as in :func:`hessian`.
      chunk_size: bound on the basis vectors of the outer derivative at a time.
      has_aux: ``f`` returns ``(output, aux)``; aux is returned last, not differentiated.
      backend: backend name or object.
      compile: one compiled program per signature (Python floats are dynamic inputs, see
        :func:`value_and_grad`).
      device: place the inputs on this device.
      static_argnums: with ``compile=True``, positions of arguments whose Python floats are static.
      static_argnames: the same by parameter name.

    Returns:
      A function returning ``(value, jacobian, hessian)`` (``(value, jacobian, hessian, aux)`` with
      ``has_aux``): the value as ``f`` returns it, the Jacobian as :func:`jacobian` returns it (for a
      scalar ``f``, the gradient, shaped like ``args[argnums]``) and the Hessian as :func:`hessian` does.

    Example:
      >>> value, g, h = unigrad.value_jacobian_and_hessian(lambda x: (x ** 3).sum())(np.array([1.0, 2.0]))
      >>> value, g
      (array(9.), array([ 3., 12.]))
      >>> h
      array([[ 6.,  0.],
             [ 0., 12.]])
    """
    check_mode(mode, VJH)
    check_chunk(chunk_size, VJH)
    plans, shapes = BoundedCache(VJH_PLANS), BoundedCache(VJH_SHAPES, 64)
    fallbacks = BoundedCache(VJH_FALLBACKS, 64)
    programs = BoundedCache(VJH_PROGRAMS) if compile else None
    static = static_arguments(f, static_argnums, static_argnames, argnums, VJH) if compile else None
    kernels = {(outer, scalar): _nested(outer, scalar, has_aux, chunk_size, True, VJH)
               for outer in ("fwd", "rev") for scalar in (False, True)}

    def value_jacobian_and_hessian_f(*args):
        call = prepare(plans, f, args, argnums, has_aux, backend, VJH, device, static)
        b = call.backend
        if not b.capabilities.higher_order:
            raise _checks.not_nestable(b, VJH)
        is_scalar = output_shapes(shapes, call) == ((),)  # (a VJP of one cotangent: re-checked where it runs)

        def run(outer):
            return execute(call, kernels[outer, is_scalar], programs, (outer, is_scalar), keep_outputs=True)

        first, fallback = _outer_modes(mode, b)
        outs, blocks, aux = run_auto(fallbacks if mode == "auto" else None, call, run, first, fallback, VJH)
        n_jac = len(outs) * len(call.diff)
        result = (call.output(outs), call.blocks_tree(blocks[:n_jac]), _hessian_tree(call, blocks[n_jac:]))
        return result + (call.aux(aux),) if has_aux else result

    _wraps(value_jacobian_and_hessian_f, f, VJH)
    return value_jacobian_and_hessian_f
