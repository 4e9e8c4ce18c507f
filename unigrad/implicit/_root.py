"""``unigrad.custom_root`` and ``unigrad.custom_fixed_point``: the derivative of a solver's result by the
implicit function theorem.

At a root ``F(x*, p) = 0``, ``dx* = -(d_x F)^{-1} d_p F dp``. The decorated solver becomes one custom-rule
call on the explicit arrays ``(init, *params)``:

* primal: the solver, as plain code (nothing differentiates its iterations), then the optimality
  residual ``max |F(x*, p)|`` checked against ``tol``;
* JVP: ``rhs = -d_p F(x*, p) dp`` (a JVP of ``F``), then ``linear_solve`` of ``d_x F(x*, p) dx = rhs``
  (its matvec a JVP of ``F`` in ``x``; its operands ``x*`` and ``p``, explicit);
* VJP: ``u`` from the transposed system ``d_x F^T u = g`` (the same linear solve, transposed), then
  ``p``'s cotangent ``-d_p F^T u`` (a VJP of ``F``).

``x*`` inside the rules is this same function called again, so its own derivative (second order:
the rules differentiated) is the implicit one too; the linear solves are ``linear_solve``'s rule,
differentiable in their operands. ``init`` gets a zero derivative. A pytree solution is one vector inside
(``_Solution``, ``_flat``); ``has_aux``'s floating-point arrays are extra outputs of zero derivative.

``d_p F`` is taken over the floating-point array leaves of the params that ``argnums`` selects (all params by
default, ``_Params``); the other leaves (Python numbers, strings, integer arrays, options) are held as they
are. The params outside ``argnums`` stay explicit arrays of the rule, but pass ``stop_gradient`` first: their
derivative is zero at every order (inside the rules too, so a second derivative is the one of the solution
with those params frozen), and no rule closes over a traced array.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import optree

from .._api import asarray
from .._api import to_numpy
from .._custom import _Call, _stop_one, backend_for
from .._dtypes import INEXACT
from ..backend import Rule
from ._flat import Flat, is_single
from ._linear_solve import (Operator, apply_solve, check_nested_transforms, check_on_failure,
                            check_solve, current_backend, derivative_pass, held_jvp, held_vjp, on_values, order_above,
                            report)

__all__ = ["custom_root", "custom_fixed_point"]


def custom_root(optimality: Callable, *, solve: Any = "gmres", tol: float | None = None,
                linear_tol: float | None = None, maxiter: int | None = None, symmetric: bool = False,
                on_failure: str = "raise", has_aux: bool = False, argnums: int | tuple[int, ...] | None = None
                ) -> Callable:
    """A decorator: ``solver(init, *params) -> x`` with ``optimality(x, *params) = 0`` at its result,
    differentiated with respect to ``params`` by the implicit function theorem, in both modes and to any
    order, on every backend (MLX too: every nesting, compiled, tested to the fourth order, docs/implicit.md).

    The solver runs as plain code -- no derivative goes through its iterations, and it may use any
    operations on the values it is given (NumPy, SciPy: its result is converted to the backend's
    array). The derivative is ``dx = -(d_x F)^{-1} d_params F dparams`` with ``F = optimality``: a
    linear solve with ``d_x F`` (matrix-free: JVPs and VJPs of ``F``).

    Args:
      optimality: ``F(x, *params)``, of ``x``'s shape (``x``'s structure for a pytree solution), zero at the
        solution. For an argmin, the gradient of the objective (``d_x F`` is then its Hessian: symmetric).
      solve: the linear solver for ``d_x F`` (see :func:`unigrad.linear_solve`; default ``"gmres"``;
        ``"cg"`` with ``symmetric=True`` for an argmin at a minimum, ``"lu"`` for small dense problems).
      tol: the largest ``max |F(x, *params)|`` accepted at the solver's result (default 1e-6 in
        float64, 1e-3 in float32).
      linear_tol: ``linear_solve``'s ``tol`` for the derivative's linear solves.
      maxiter: ``linear_solve``'s ``maxiter``.
      symmetric: ``d_x F`` is symmetric (an argmin): the transposed system uses ``d_x F`` itself.
      on_failure: a failed check (optimality residual or linear solve residual): ``"raise"``
        (:class:`unigrad.implicit.ConvergenceError`, the default), ``"warn"`` or ``"ignore"``.
      has_aux: the solver returns ``(x, aux)``; the decorated function returns ``(x, aux)`` too, ``aux``
        as the solver gave it and not differentiated (its floating-point arrays of the backend with a
        zero derivative; an integer array of a compiled program is refused: return a count as a Python int).
      argnums: which params the solution is differentiated with respect to: an int or a tuple of ints,
        positions in the solver's call ``solver(init, *params)`` -- ``init`` is 0 (it is also the position
        of the solution ``x`` in ``optimality(x, *params)``, as in torchopt's ``argnums``), the first param
        is 1, negative positions count from the end; a position naming ``init``, out of range or repeated
        raises a ValueError. Default None: every param. A param outside ``argnums`` is a constant of the
        implicit rule: its derivative is zero (also where a transform asks for it, and at every order:
        the derivatives are those of the solution with that param frozen, as for JAX's
        ``nondiff_argnums``), ``d_params F`` is taken over the others only (fewer JVP/VJP inputs), and
        it may be anything (a Python int such as an iteration count, a string, a dict of options, None).

    Returns:
      A decorator; the decorated function is called as ``solver(init, *params)``. ``init`` (an array,
      a pytree or None) gets a zero derivative; ``params`` may be pytrees, whose floating-point array
      leaves are differentiated (their other leaves -- Python numbers, strings, integer arrays -- are
      constants); the solution ``x`` is an array or a pytree of arrays (a tuple, list or dict) sharing
      one real floating dtype, solved as one vector (its leaves ravelled and concatenated; a mixed-dtype
      pytree raises a TypeError).

    Example:
      >>> def sqrt_newton(init, a):           # x with x**2 - a = 0, by Newton's method
      ...     x = init
      ...     for _ in range(30):
      ...         x = 0.5 * (x + a / x)
      ...     return x
      >>> root = unigrad.custom_root(lambda x, a: x ** 2 - a)(sqrt_newton)
      >>> unigrad.grad(lambda a: unigrad.namespace(a).sum(root(np.ones(2), a)))(np.array([4.0, 9.0]))
      array([0.25      , 0.16666667])
    """
    if not callable(optimality):
        raise TypeError(f"custom_root: optimality must be a callable F(x, *params); got {type(optimality).__name__}")
    check_solve(solve)
    check_on_failure(on_failure)
    argnums = _check_argnums(argnums)

    def decorator(solver: Callable) -> Callable:
        if not callable(solver):
            raise TypeError(f"custom_root: the decorated solver must be callable; got {type(solver).__name__}")
        return _RootSolver(solver, optimality, dict(solve=solve, tol=tol, linear_tol=linear_tol, maxiter=maxiter,
                                                    symmetric=symmetric, on_failure=on_failure), has_aux=has_aux,
                           argnums=argnums)

    return decorator


def custom_fixed_point(fixed_point: Callable, **options) -> Callable:
    """``custom_root`` for a fixed point ``x = T(x, *params)``: the optimality function is
    ``T(x, *params) - x`` (so ``d_x F = d_x T - I``; ``symmetric`` only where ``d_x T`` is).

    Args:
      fixed_point: ``T(x, *params)``.
      **options: those of :func:`custom_root` (``argnums`` too: positions in ``solver(init, *params)``,
        ``init`` being 0).

    Returns:
      A decorator for ``solver(init, *params) -> x`` with ``x = T(x, *params)`` at its result.

    Example:
      >>> def iterate(init, p):
      ...     x = init
      ...     for _ in range(200):
      ...         x = 0.5 * unigrad.namespace(x).cos(x) + p
      ...     return x
      >>> solver = unigrad.custom_fixed_point(lambda x, p: 0.5 * unigrad.namespace(x).cos(x) + p)(iterate)
      >>> g = unigrad.grad(lambda p: solver(np.zeros(1), p)[0])(np.array([0.2]))
    """
    if not callable(fixed_point):
        raise TypeError(f"custom_fixed_point: T must be a callable T(x, *params); got {type(fixed_point).__name__}")

    def residual(x, *params):
        t = fixed_point(x, *params)
        if is_single(x):
            return t - x
        try:  # a pytree solution: leaf by leaf
            return optree.tree_map(lambda t, x: t - x, t, x)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"custom_fixed_point: T(x, *params) has structure {optree.tree_structure(t)}; it must "
                            f"have the solution's structure {optree.tree_structure(x)} ({exc})") from None

    residual.__name__ = f"{getattr(fixed_point, '__name__', 'T')} - x"
    return custom_root(residual, **options)


class _RootSolver:
    """The decorated solver: one custom-rule call per use (see the module docstring)."""

    def __init__(self, solver, optimality, options, has_aux=False, argnums=None):
        functools.update_wrapper(self, solver)
        self.solver, self.optimality, self.options, self.has_aux = solver, optimality, options, has_aux
        self.argnums = argnums
        self.name = getattr(solver, "__name__", type(solver).__name__)

    def __call__(self, init, *params):
        call = _Solution(self)
        wrt = _resolve_argnums(self.argnums, len(params), self.name)
        if wrt is not None:  # the constants: a zero derivative at every order, before the rule sees them
            backend = backend_for(optree.tree_leaves((init, params)))
            params = tuple(p if i in wrt else optree.tree_map(lambda v: _stop_one(backend, v), p)
                           for i, p in enumerate(params))
        call.wrt = wrt
        x = _solve_root(call, init, params)
        aux = None
        if self.has_aux:
            x, arrays = x
            aux = call.rebuild_aux(arrays)
        if call.flat is not None:
            x = call.flat.unravel(x)
        return (x, aux) if self.has_aux else x

    def operator(self, split):
        o = self.options
        optimality = self.optimality

        def at(arrays, x):  # F(x, *params), the params' floating-point arrays put in place by split.rebuild
            return optimality(x, *split.rebuild(arrays))

        def linearized(operands):  # d_x F is the Jacobian of x -> F(x, *params) at x*
            x, arrays = operands
            return (lambda x: at(arrays, x)), x

        def matvec(v, operands):  # d_x F(x, *params) v
            x, arrays = operands
            return held_jvp(current_backend(), at, arrays, (x,), (v,))[1]

        return Operator(matvec, solve=o["solve"], symmetric=o["symmetric"], tol=o["linear_tol"],
                        maxiter=o["maxiter"], on_failure=o["on_failure"],
                        name=f"{self.name}: the linear solve with d_x optimality", linearized=linearized)

    def primal(self, backend, init, params):
        x = self.solver(init, *params)
        b = backend
        if not b.is_array(x):
            x = asarray(x, backend=b)
        residual_value = self.optimality(x, *params)
        if tuple(b.shape(residual_value)) != tuple(b.shape(x)):
            raise ValueError(f"{self.name}: optimality(x, *params) has shape {tuple(b.shape(residual_value))}; it "
                             f"must have the solution's shape {tuple(b.shape(x))} (one equation per unknown)")
        tol = self.options["tol"]
        if tol is None:
            tol = 1e-6 if "64" in str(backend.dtype(x)) else 1e-3
        try:
            values = np.abs(np.asarray(to_numpy(residual_value)))
        except Exception:  # symbolic (inside vmap or a compiled program): no value to check here
            return x
        worst = float(np.max(values)) if values.size else 0.0
        if not worst <= tol:
            report(self.options["on_failure"],
                   f"{self.name}: the solver's result is not a root: max |optimality(x, *params)| = {worst:.3g}, above "
                   f"tol={tol:.3g}; a derivative by the implicit function theorem at this point would be wrong. Let "
                   f"the solver converge (more iterations, a better start) or raise tol", worst, tol)
        return x


class _Solution(_RootSolver):
    """One call of a decorated solver, on its solution as one vector: a pytree solution (the solver's result a
    tuple, list or dict of arrays) ravelled into one (``_flat``), ``optimality`` called on the pytree and its
    result ravelled the same way; a single array as it is. The structure is the solver's result's, known once
    the solver has run (every rule runs it first: ``x*`` inside the rules is this same call again).

    With ``has_aux`` the solver returns ``(x, aux)``, ``aux`` not differentiated: its floating-point arrays of
    the backend leave the rule as extra outputs of zero derivative (so a compiled program's traced values are
    returned, not leaked), its other leaves (numbers, strings, integer arrays with a value) are kept as the
    first run gave them; an integer array without a value (a compiled program's) raises a TypeError."""

    def __init__(self, root: _RootSolver):  # (not _RootSolver's: nothing to wrap)
        self.root, self.options, self.name, self.has_aux = root, root.options, root.name, False
        self.solver, self.optimality = self._solve, self._optimality
        self.wrt = None  # the 0-based positions in params of those differentiated (None: all)
        self.flat = self.aux_tree = None
        self.aux_leaves, self.aux_outputs, self.aux_arrays = [], [], ()

    def _solve(self, init, *params):
        out = self.root.solver(init, *params)
        backend = current_backend() or backend_for(optree.tree_leaves((init, params)))
        if self.root.has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                got = f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list)) else \
                    type(out).__name__
                raise TypeError(f"{self.name}: with has_aux=True the solver must return a pair (x, aux); got {got}")
            out, aux = out
            self._keep_aux(aux, backend)
        if is_single(out):
            self.flat = None
            return out
        self.flat = Flat(out, backend, f"{self.name}: the solution")
        return self.flat.ravel(out, "the solver's result")

    def _keep_aux(self, aux, backend):
        paths, leaves, tree = optree.tree_flatten_with_path(aux)
        arrays, outputs = [], []
        for path, leaf in zip(paths, leaves):
            output = backend.is_array(leaf) and backend.dtype(leaf) in INEXACT
            if backend.is_array(leaf) and not output:
                try:  # an integer or bool array with a value: kept as it is
                    to_numpy(leaf)
                except Exception:  # symbolic (a compiled program): it cannot leave the rule but as an output
                    raise TypeError(
                        f"{self.name}: aux leaf {''.join(f'[{k!r}]' for k in path) or '(the root)'} is a symbolic "
                        f"{backend.name} array of dtype {backend.dtype(leaf)} (a compiled program); aux may hold "
                        f"floating-point arrays there, and numbers (an iteration count: a Python int)") from None
            outputs.append(output)
            if output:
                arrays.append(leaf)
        if self.aux_tree is None:  # (the first run's; the later runs, at the same point, give the same)
            self.aux_tree, self.aux_leaves, self.aux_outputs = tree, leaves, outputs
        self.aux_arrays = tuple(arrays)

    def rebuild_aux(self, arrays):
        """``aux`` with the rule's outputs in place of its floating-point arrays."""
        arrays = iter(arrays)
        leaves = [next(arrays) if output else leaf for leaf, output in zip(self.aux_leaves, self.aux_outputs)]
        return optree.tree_unflatten(self.aux_tree, leaves)

    def _optimality(self, x, *params):
        if self.flat is None:
            return self.root.optimality(x, *params)
        return self.flat.ravel(self.root.optimality(self.flat.unravel(x), *params), "optimality(x, *params)")


def _solve_root(root: _Solution, init, params):
    """``x`` (one array), or ``(x, aux_arrays)`` with ``has_aux``, from one custom-rule call."""
    backend = backend_for(optree.tree_leaves((init, params)))
    # a NumPy start on another backend: that backend's arrays (the solver then meets one kind of array)
    init = optree.tree_map(lambda v: asarray(v, backend=backend) if isinstance(v, np.ndarray) and not
                           backend.is_array(v) else v, init)
    args = (init, *params)
    with_aux = root.root.has_aux

    def custom_root_call(init, *params):  # (the name errors show)
        with on_values(backend, (init, params)) as (init, params):
            x = root.primal(backend, init, params)
            return (x, root.aux_arrays) if with_aux else x

    call = _Call("jvp", custom_root_call, (), args)
    call.name = root.name
    backend = call.b
    split = _Params(params, backend, root.wrt)
    op = root.operator(split)
    optimality = root.optimality

    def solution(init, params):
        out = _solve_root(root, init, params)
        return out if with_aux else (out, ())

    def d_params(params):  # (x, *w) -> F(x, p) over the differentiated leaves w of params, and where it is taken
        leaves = split.leaves(params)
        primals = tuple(leaves[k] for k in split.wrt_at)
        return (lambda x, *w: optimality(x, *split.rebuild_wrt(leaves, w))), primals

    def tangent(x, arrays, params, dparams, guard):
        """The JVP rule's ``(outputs, tangents)`` at the solution ``x``: ``dx = -A^{-1} (d_params F) dparams``."""
        if split.wrt_at:
            f, p = d_params(params)
            dleaves = split.leaves(tuple(dparams))
            _, change = held_jvp(backend, f, x, p, tuple(dleaves[k] for k in split.wrt_at))
            dx = guard(apply_solve(op, -change, (x, split.arrays(params))))
        else:  # nothing differentiated: (a call with argnums naming only params without floating-point arrays)
            dx = None
        return ((x, arrays), (dx, tuple(None for _ in arrays))) if with_aux else (x, dx)

    def jvp_rule(primals, tangents):
        with derivative_pass(backend, f"custom_root ({root.name})", "jvp", runs_solver=True):
            guard = check_nested_transforms(backend)
            init, *params = primals
            _, *dparams = tangents
            params = tuple(params)
            x, arrays = solution(init, params)
            return tangent(x, arrays, params, dparams, guard)

    def jvp_given(primals, tangents, out):  # (Rule.jvp_given: the solution the forward computation gave, MLX)
        with derivative_pass(backend, f"custom_root ({root.name})", "jvp"):
            guard = check_nested_transforms(backend)
            _, *params = primals
            _, *dparams = tangents
            params = tuple(params)
            x, arrays = out if with_aux else (out, ())
            # Where enclosing transforms differentiate this pass, x (computed on copies of the values) is a constant
            # to them. A Newton step from x keeps x's value (F(x) = 0 within the checked tolerance) and doubles the
            # orders of its derivative in the params that are right (the implicit one, -A^{-1} d_params F, from the
            # first step: its A^{-1} F term contributes d(A^{-1}) F = 0 at a root): k steps give the 2^k - 1 orders
            # that the enclosing transforms differentiate.
            steps = order_above(backend).bit_length() if split.wrt_at else 0
            for _ in range(steps):
                x = x - apply_solve(op, optimality(x, *params), (x, split.arrays(params)))
            return tangent(x, arrays, params, dparams, guard)

    def fwd(init, *params):
        x, arrays = solution(init, params)
        return ((x, arrays) if with_aux else x), (x, params)

    def bwd(residuals, g):
        with derivative_pass(backend, f"custom_root ({root.name})", "vjp"):
            guard = check_nested_transforms(backend)
            x, params = residuals
            if with_aux:
                g = g[0]  # (aux has no derivative)
            if not split.wrt_at:
                return (None,) * (1 + len(params))
            u = guard(apply_solve(op.T, g, (x, split.arrays(params))))
            f, p = d_params(params)
            _, pullback = held_vjp(backend, f, x, p)
            return (None, *split.cotangents([-c for c in pullback(u)]))

    def residuals(out, init, *params):  # fwd's residuals from the solution the forward computation gave
        return (out[0] if with_aux else out), tuple(params)

    call.user_jvp, call.user_fwd, call.user_bwd, call.user_residuals = jvp_rule, fwd, bwd, residuals
    call.user_jvp_given = jvp_given
    return call.apply(Rule(root.name, fun=call.flat_fun, fwd=call.flat_fwd, bwd=call.flat_bwd, jvp=call.flat_jvp,
                           residuals=call.flat_residuals, jvp_given=call.flat_jvp_given))


class _Params:
    """Where the derivative with respect to ``params`` is taken: their leaves that are floating-point arrays
    of ``backend`` (the rule's arrays, ``diff_at``; the linear solves' operands), among those the leaves of
    the params in ``wrt`` (0-based positions; None: all), ``wrt_at``, over which ``d_params F`` is taken.
    The other leaves (numbers, strings, integer arrays, None...) are held as the first call gave them: the
    rules meet params of the same structure, arrays in place of arrays."""

    def __init__(self, params, backend, wrt):
        paths, leaves, self.treedef = optree.tree_flatten_with_path(tuple(params))
        self.static = leaves
        self.diff_at = tuple(k for k, v in enumerate(leaves) if backend.is_array(v) and backend.dtype(v) in INEXACT)
        self.wrt_at = tuple(k for k in self.diff_at if wrt is None or paths[k][0] in wrt)

    def leaves(self, params):
        return self.treedef.flatten_up_to(tuple(params))

    def arrays(self, params):
        leaves = self.leaves(params)
        return tuple(leaves[k] for k in self.diff_at)

    def _placed(self, leaves, at, values):
        """The params of ``leaves`` with ``values`` at the leaf positions ``at``."""
        leaves = list(leaves)
        for k, v in zip(at, values):
            leaves[k] = v
        return tuple(optree.tree_unflatten(self.treedef, leaves))

    def rebuild(self, arrays):
        """The params with ``arrays`` (those of ``diff_at``) in place."""
        return self._placed(self.static, self.diff_at, arrays)

    def rebuild_wrt(self, leaves, arrays):
        """The params of ``leaves`` with ``arrays`` (those of ``wrt_at``) in place."""
        return self._placed(leaves, self.wrt_at, arrays)

    def cotangents(self, cts):
        """One cotangent pytree per param from the cotangents of the ``wrt_at`` leaves (None elsewhere: zeros)."""
        return self._placed([None] * self.treedef.num_leaves, self.wrt_at, cts)


def _check_argnums(argnums):
    """``custom_root``'s ``argnums`` as a tuple of ints (None as it is), the checks that need no call."""
    if argnums is None:
        return None
    single = isinstance(argnums, int) and not isinstance(argnums, bool)
    seq = (argnums,) if single else argnums
    if not isinstance(seq, (tuple, list)) or not seq or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in seq):
        raise TypeError(f"custom_root: argnums must be None, an int or a non-empty tuple of ints (positions in "
                        f"solver(init, *params), init being 0); got {argnums!r}")
    if 0 in seq:
        raise ValueError(f"custom_root: argnums={argnums!r} names position 0, init (the solution's place in "
                         f"optimality(x, *params)), which has no derivative; the params are positions 1, 2, ...")
    return tuple(int(a) for a in seq)


def _resolve_argnums(argnums, n, name):
    """The 0-based positions in ``params`` (``n`` of them) that ``argnums`` names, or None for all."""
    if argnums is None:
        return None
    out = []
    for a in argnums:
        if not -n <= a <= n or a == 0:
            what = "init (position 0)" if a in (0, -n - 1) else "no argument"
            raise ValueError(
                f"{name}: argnums names position {a}, {what}: the solver was called as "
                f"solver(init, *params) with {n} param{'s' if n != 1 else ''}, so argnums must lie in "
                + (f"1..{n} (or -{n}..-1 from the end)" if n else "nothing (there are no params)")
                + "; init has no derivative")
        i = a - 1 if a > 0 else n + a
        if i in out:
            raise ValueError(f"{name}: argnums={argnums!r} names param {i + 1} twice")
        out.append(i)
    return frozenset(out)
