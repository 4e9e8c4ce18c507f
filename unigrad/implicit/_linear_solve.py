"""``unigrad.linear_solve``: ``x`` with ``A x = b`` for a matrix-free ``A``, and its derivatives, as linear solves.

One custom rule (:class:`unigrad.backend.Rule`, both modes given) on the explicit arrays ``(b,
operands)``, ``operands`` being the arrays ``matvec`` closes over (``_closure``) or, inside
``custom_root``, the point and parameters the Jacobian is taken at:

* primal: the solver, on values (no derivative through its iterations), then the residual check;
* JVP: ``dx = A^{-1} (db - dA x)``, ``dA x`` the JVP of ``operands -> matvec(x)``; the solve is this
  same function again, so the tangent is differentiable in turn (any order);
* VJP: ``u = A^{-T} g`` (the transposed operator: ``matvec``'s VJP, or ``matvec`` itself where
  ``symmetric``), then ``b``'s cotangent ``u`` and the operands' ``-(d/d operands) <u, A x>``.

Both rules are given because each mode's rule solves a system: transposing the JVP rule would need
the transpose of the solver's iterations, which are not linear in ``b``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any, Callable

import numpy as np
import optree

from .._api import jvp as _jvp
from .._api import asarray, namespace
from .._api import vjp as _vjp
from .. import _registry
from .._custom import _Call, backend_for
from .._dtypes import INEXACT
from ..backend import Rule
from . import _closure
from ._flat import Flat, is_single
from ._solvers import SOLVERS, NoValue, dense_solve, looped_cg, no_reads, norm, reads_allowed, scalar

__all__ = ["linear_solve", "ConvergenceError", "ConvergenceWarning"]

ON_FAILURE = ("raise", "warn", "ignore")


class ConvergenceError(RuntimeError):
    """A solver's result fails its check (a linear solve's residual, a root's optimality residual): a
    derivative computed from it would be wrong. ``residual`` and ``tolerance`` are attributes."""

    def __init__(self, message, residual=None, tolerance=None):
        super().__init__(message)
        self.residual, self.tolerance = residual, tolerance


class ConvergenceWarning(RuntimeWarning):
    """The warning form of :class:`ConvergenceError` (``on_failure="warn"``)."""


def current_backend():
    """The backend of the rule being run (``_Call.run`` sets it), for the transforms nested in a rule: the
    arrays alone do not name it (a plugin's traced values may look like NumPy's)."""
    return _registry.active_backend.get()


def _unguarded(value):
    return value


def nested_probe(backend):
    """The VJP of ``t -> 3 t`` at 0.5, taken where it is called: 3 where a transform nested there works."""
    _, pullback = _vjp(lambda t: 3.0 * t, asarray(np.array(0.5), backend=backend), backend=backend)
    return pullback(asarray(np.array(1.0), backend=backend))[0]


def check_nested_transforms(backend):
    """Refuse where a transform nested in this rule's code would give zeros: the implicit rules are made of
    nested JVPs and VJPs, and a zero there is a wrong derivative, silently. (Measured on TensorFlow while
    its rules ran their code with recording stopped, which blinds the tapes opened inside too; its rules
    now isolate that code instead, and no backend is known to fail the probe: it stays for plugins, and
    for code run under ``tf.stop_recording()``.) The probe: the VJP of ``t -> 3 t`` must be 3.

    Returns ``guard(value)``: the value itself where the probe was read and passed (NotImplementedError where
    it failed); where the probe is symbolic (a compiled program), the value times ``1`` if the probe gives 3
    at run time and ``NaN`` if not -- a loud result rather than a wrong one."""
    if backend is None:
        return _unguarded
    probe = nested_probe(backend)
    try:
        got = scalar(probe)
    except NoValue:
        xp = namespace(probe)
        ones = xp.ones_like(probe)
        factor = xp.where(probe == 3.0, ones, ones * float("nan"))
        return lambda value: value * xp.astype(factor, value.dtype)
    if got != 3.0:
        raise NotImplementedError(
            f"linear_solve / custom_root on the {backend.name} backend: a transform nested in a custom rule's "
            f"code gives {got} here for the derivative 3 of t -> 3 t, and the implicit rules are made of nested "
            f"JVPs and VJPs; refusing rather than returning a wrong derivative")
    return _unguarded


#: the nestings in which an enclosing transform differentiates a JVP rule (the outer transform's mode: jvp, vjp)
_NESTING_EXAMPLES = {("jvp", "jvp"): "jvp of jvp, jacfwd(jacfwd)", ("vjp", "jvp"): "jacrev(jacfwd), grad of jvp"}


def _tracing(backend):
    """The entries of ``backend.transforms_tracing()`` now (the MLX plugin: ``"vjp"``, ``"jvp"``, ``"vmap"``,
    ``"compile"``, outermost first); empty elsewhere."""
    tracing = getattr(backend, "transforms_tracing", None)
    return tuple(tracing()) if tracing is not None else ()


def _outer(backend):
    """The derivative transforms (``"vjp"``, ``"jvp"``, outermost first) that differentiate the rule pass running
    now (``transforms_tracing()``: MLX); empty at first order and on backends that do not say."""
    return tuple(e for e in _tracing(backend) if e in ("vjp", "jvp"))


def _nesting(outer, mode):
    """``jvp(vjp(f))``: the transforms of ``outer`` around a rule's pass in ``mode``."""
    return "".join(f"{m}(" for m in outer + (mode,)) + "f" + ")" * (len(outer) + 1)


def order_above(backend) -> int:
    """How many enclosing derivative transforms differentiate the rule pass running now (MLX says; 0 elsewhere)."""
    return len(_outer(backend))


# A rule's nested transforms at arrays they are not taken in (the solution x in d/d(operands) A x, the operands in
# A^T u as a VJP of v -> A v): where an enclosing transform differentiates the pass (MLX), those arrays are more
# primals of the nested transform (their cotangents dropped, their tangents zero) rather than closed over. MLX
# loses an enclosing transform's derivative through what a nested transform in a rule closes over: third
# derivatives through linear_solve came out 0 in every nesting, right once nothing was closed over.

def _held(backend, fn, held):
    """``(arrays, g)``: the floating-point arrays among ``held``'s leaves, and ``g(*arrays, *p) = fn(held, *p)``
    with those arrays in their places."""
    leaves, tree = optree.tree_flatten(held, none_is_leaf=True)
    at = [k for k, a in enumerate(leaves) if backend.is_array(a) and backend.dtype(a) in INEXACT]
    n = len(at)

    def g(*args):
        placed = list(leaves)
        for k, a in zip(at, args[:n]):
            placed[k] = a
        return fn(optree.tree_unflatten(tree, placed), *args[n:])
    return tuple(leaves[k] for k in at), g


def _zero_like_tangents(tangents):
    """A 0-d zero computed from the tangents (0 times the first one's sum: no indexing, whose VJP scatters and has
    no JVP on MLX; 0.0 where there is none)."""
    for t in optree.tree_leaves(tangents):
        return 0.0 * namespace(t).sum(t)
    return 0.0


def held_vjp(backend, fn, held, primals):
    """``(outputs, pullback)`` of ``p -> fn(held, *p)`` (``pullback`` gives one cotangent per primal)."""
    if not order_above(backend):
        return _vjp(lambda *p: fn(held, *p), *primals, backend=backend)
    arrays, g = _held(backend, fn, held)
    outputs, pullback = _vjp(g, *arrays, *primals, backend=backend)
    return outputs, lambda cotangent: tuple(pullback(cotangent))[len(arrays):]


def held_jvp(backend, fn, held, primals, tangents):
    """``(outputs, tangents_out)`` of ``p -> fn(held, *p)`` along ``tangents``."""
    if not order_above(backend):
        return _jvp(lambda *p: fn(held, *p), tuple(primals), tuple(tangents), backend=backend)
    arrays, g = _held(backend, fn, held)
    # zeros made from the tangents, so that under vmap (a Jacobian's batch of tangents) they carry its batch as the
    # tangents do: MLX's matmul JVP adds the two operands' terms with addmm, which fails under vmap where one term
    # is batched and the other not ("input c must broadcast to the output shape")
    scale = _zero_like_tangents(tangents)
    zeros = tuple(namespace(a).zeros_like(a) * scale for a in arrays)
    return _jvp(g, (*arrays, *primals), (*zeros, *tangents), backend=backend)


def derivative_pass(backend, name, mode, runs_solver=False):
    """The context a rule's derivative pass runs in (``mode``: ``"jvp"`` for the JVP rule, ``"vjp"`` for the VJP
    rule). Elsewhere than on a backend with ``transforms_tracing()`` (MLX), and at first order, nothing changes.
    On MLX, where enclosing transforms differentiate the pass (second and higher derivatives), the pass reads no
    value (:func:`no_reads`: dense solves, residuals made NaN rather than read, the solution computed again by a
    dense solve in a JVP rule): MLX drops the enclosing derivative of a rule that reads (docs/implicit.md); its
    nested transforms close over nothing (:func:`held_vjp`, :func:`held_jvp`). The VJP rule also takes its
    residuals from the outputs MLX hands it (``Rule.residuals``: the solution, no solver run again). That gives
    every nesting of ``linear_solve``'s rules, under ``vmap`` and ``compile=True`` too.
    ``runs_solver``: the pass must run the user's solver (``custom_root``'s JVP rule where the backend kept no
    outputs for it: MLX hands a JVP rule none, ``Rule.jvp_given``), which is plain code that may read; such a
    pass, differentiated, is refused (:func:`check_not_differentiated`)."""
    outer = _outer(backend)
    if not outer:
        return contextlib.nullcontext()
    if runs_solver:
        check_not_differentiated(backend, name, mode)
    return no_reads()


@contextlib.contextmanager
def on_values(backend, tree):
    """The arrays a rule's primal computation (a solver: plain code that reads values) runs on: on a backend
    whose transforms are tracing now (``transforms_tracing()``: MLX), fresh arrays of their values. MLX loses an
    enclosing transform's derivative through a custom function's input when the forward runs a transform
    closing over that input and then reads a value (``tests/test_implicit.py::test_mlx_defect_behind_the_copies``:
    the symmetric solvers' pullback of ``matvec``, a user's solver that differentiates its optimality); on
    copies the forward touches no array of the enclosing graph. Where a copy cannot be made (symbolic values:
    ``mx.compile``, ``vmap``) the forward reads nothing either (:func:`no_reads`)."""
    if not _tracing(backend) or not reads_allowed():
        yield tree
        return
    try:
        copied = optree.tree_map(
            lambda a: backend.asarray(np.asarray(backend.to_numpy(a)), dtype=backend.dtype(a)) if backend.is_array(a)
            else a, tree, none_is_leaf=True)
    except Exception:
        with no_reads():
            yield tree
        return
    yield copied


def check_not_differentiated(backend, name, mode):
    """Refuse a derivative pass that must run the user's solver (``custom_root``'s JVP rule without the forward's
    outputs) where an enclosing transform differentiates it (see :func:`derivative_pass`): on MLX an inner forward
    mode through ``custom_root`` / ``custom_fixed_point`` where the plugin kept no outputs for the rule."""
    outer = _outer(backend)
    if not outer:
        return
    nesting = _nesting(outer, mode)
    examples = _NESTING_EXAMPLES.get((outer[-1], mode))
    examples = f" (as in {examples})" if examples else ""
    raise NotImplementedError(
        f"{name} on the {backend.name} backend: this derivative of order {len(outer) + 1} through custom_root / "
        f"custom_fixed_point "
        f"is not supported on MLX: this rule's forward-mode (JVP) derivative is being differentiated by an "
        f"enclosing {outer[-1]}, the nesting {nesting}{examples}; MLX hands a JVP rule no outputs and none were "
        f"kept for this call (Rule.jvp_given), so it must run your solver again to have the solution, and MLX "
        f"drops the enclosing derivative of a rule that reads a value (measured: zeros), so the result would be "
        f"wrong, not an error. On MLX derivatives through custom_root work over VJPs (hessian, hvp, jacfwd(grad), "
        f"jacrev(grad), jacrev(jacrev), jacfwd(jacrev)), and in every nesting where the plugin keeps the forward's "
        f"outputs for the JVP rule (unigrad_mlx does); otherwise use another backend (numpy, jax, torch, "
        f"tensorflow). See docs/implicit.md")


def report(on_failure, message, residual, tolerance):
    if on_failure == "raise":
        raise ConvergenceError(message, residual, tolerance)
    if on_failure == "warn":
        warnings.warn(message, ConvergenceWarning, stacklevel=4)


def default_tol(dtype_name: str) -> float:
    """The default relative tolerance: 1e-10 for float64 (and complex128), 1e-5 below."""
    return 1e-10 if "64" in dtype_name and "complex64" not in dtype_name else 1e-5


def check_on_failure(on_failure):
    if on_failure not in ON_FAILURE:
        raise ValueError(f"on_failure must be one of {ON_FAILURE}; got {on_failure!r}")


def check_solve(solve, name="solve"):
    if callable(solve):
        return
    if solve not in SOLVERS:
        raise ValueError(f"{name} must be one of {sorted(SOLVERS)} or a callable solve(matvec, b) -> x; got {solve!r}")


def held_to_direct(transposed, direct, like):
    """``u -> A^T u`` by ``transposed`` (a backend's ``linear_products``), for the residual check of a transposed
    solve, with its component along one fixed random ``r`` replaced by ``(A r) . u``, ``A r`` by the core's own
    product ``direct``: ``r . (A^T u) = (A r) . u`` for the true ``A^T``. Where ``transposed`` is right, nothing
    changes (to rounding); where it is wrong, the solution its iterations found leaves ``r . (A^T x - b)`` in the
    residual, and the check fails rather than passing on the same products. (``direct`` is a plain call: a user's
    ``torch.autograd.Function`` without ``torch.func`` support serves as well.)"""
    rng = np.random.default_rng(20261207)
    xp = namespace(like)
    r = asarray(rng.standard_normal(tuple(int(d) for d in like.shape)), backend=current_backend())
    r = xp.astype(r, like.dtype)
    rr = xp.sum(r * r)
    made = []

    def check(u):
        if not made:
            made.append(direct(r))
        product = transposed(u)
        return product + ((xp.sum(made[0] * u) - xp.sum(r * product)) / rr) * r
    return check


@dataclasses.dataclass(frozen=True)
class Operator:
    """A linear operator ``v -> matvec(v, operands)`` with how to solve it and its transpose.

    ``matvec(v, operands)`` is linear in ``v``; ``rmatvec`` its transpose (None: from ``matvec``'s VJP,
    or ``matvec`` itself where ``symmetric``)."""

    matvec: Callable
    solve: Any = "cg"
    transpose_solve: Any = None
    symmetric: bool = False
    tol: float | None = None
    maxiter: int | None = None
    on_failure: str = "raise"
    rmatvec: Callable | None = None
    name: str = "linear_solve"
    transposes: Callable | None = None  # (the operator .T was made from: its matvec, whose VJP this one is)
    #: ``linearized(operands) -> (g, point)``: ``A`` (of the operator ``.T`` was made from, where ``transposes``) is
    #: the Jacobian of ``g`` at ``point`` (custom_root: the optimality in ``x``, at the solution), for a backend's
    #: ``linear_products``; None: the matvec itself, at any point (it is linear)
    linearized: Callable | None = None
    #: the operator ``.T`` was made from: the transpose of a transpose is that operator again. (Made anew, it kept
    #: ``linearized`` -- the Jacobian of the operator two transposes back -- for an operator that is its
    #: transpose: torch's ``linear_products`` then solved with A^T where A was asked, and its residual check, on
    #: the same products, passed; a third derivative through custom_root was 2-4% off, silently.)
    transposed_from: "Operator | None" = None

    def apply(self, v, operands):
        return self.matvec(v, operands)

    def apply_transpose(self, u, operands):
        if self.symmetric:
            return self.matvec(u, operands)
        if self.rmatvec is not None:
            return self.rmatvec(u, operands)
        xp = namespace(u)
        # linear: any point will do, but not zeros: the tape's JVP of power is where(t == 0, 0, ...), whose
        # derivative in t vanishes at t = 0 (a matvec that is a JVP, custom_root's, would transpose to zero)
        _, pullback = held_vjp(current_backend(), lambda operands, v: self.matvec(v, operands), operands,
                               (xp.ones_like(u),))
        return pullback(u)[0]

    @property
    def T(self) -> "Operator":
        if self.symmetric:
            return self
        if self.transposed_from is not None:  # (A^T)^T is A itself, with its own linearized and names
            return self.transposed_from
        return dataclasses.replace(self, matvec=self.apply_transpose, rmatvec=self.matvec,
                                   solve=self.transpose_solve or self.solve, transpose_solve=self.solve,
                                   name=f"{self.name} (transposed)", transposes=self.matvec, transposed_from=self)

    def _linear_maps(self, operands, like):
        """``(mv, rmv, check)`` for an iterative solve on values: ``A v``, ``A^T u`` and the ``A v`` the residual
        is checked with. The transpose is ONE pullback of ``matvec`` (it is linear: its VJP at any point is
        ``A^T``), built once and reused by every iteration, where a fresh VJP per product would run the forward
        pass again each time; a transposed operator iterates with that pullback of the operator it transposes;
        with ``symmetric`` the pullback serves as ``A`` too (one backward pass an iteration, where ``matvec``
        may be a JVP), and the residual is still checked with ``matvec`` itself, so a ``symmetric=True`` that
        does not hold is seen there. Where the backend offers ``linear_products`` (torch, outside its transforms),
        both products come from its one recording of the operator (of custom_root's optimality at the solution,
        ``linearized``) instead, and the residual is checked with the core's own product (``matvec``; for a
        transposed operator held to it along a random direction, :func:`held_to_direct`): a wrong product is a
        failed residual, never a wrong solution."""
        xp = namespace(like)
        base = self.transposes if self.transposes is not None else self.matvec
        backend = current_backend()
        hook = getattr(backend, "linear_products", None)
        products = None
        if hook is not None:
            g, point = (self.linearized(operands) if self.linearized is not None else
                        ((lambda v: base(v, operands)), xp.ones_like(like)))
            products = hook(g, point)

        def direct(v):
            return base(v, operands)
        if products is not None:  # the backend's leaner products of base (the residual: base itself)
            product, transposed = products
            failed = []

            def forward(v):  # A v by the backend's product, or by base where that cannot run (a backward pass
                if not failed:  # that is not differentiable: a custom torch.autograd.Function's), from then on
                    try:
                        return product(v)
                    except RuntimeError:
                        failed.append(True)
                return direct(v)
            if self.transposes is not None:  # (the residual held to the core's own A: see held_to_direct)
                return transposed, forward, held_to_direct(transposed, direct, like)
            return (transposed if self.symmetric else forward), transposed, direct
        # linear: any point will do, but not zeros (see apply_transpose)
        _, pullback = _vjp(lambda v: base(v, operands), xp.ones_like(like), backend=backend)

        def transposed(u):
            return pullback(u)[0]

        if self.transposes is not None:  # this is A^T of base: A^T v by the pullback, (A^T)^T = base
            return transposed, direct, transposed
        if self.symmetric:
            return transposed, transposed, direct
        return direct, transposed, direct

    # ------------------------------------------------------------------ the primal computation, on values
    def primal(self, b, operands):
        mv = lambda v: self.matvec(v, operands)  # noqa: E731
        guard = check_nested_transforms(current_backend())
        try:
            if not reads_allowed():
                raise NoValue("no reads")
            return self._iterate(b, operands, mv)
        except NoValue:
            # inside vmap (a Jacobian's batch of tangents, a batch of problems) or a compiled program: no value
            # to steer a Python loop by. CG runs as the backend's compiled loop where it has one (its residual,
            # symbolic, checked in the program: a solution that did not converge comes out NaN); else A is
            # materialised and solved densely
            looped = self._looped(b, operands)
            if looped is not None:
                return guard(looped)
            return guard(dense_solve(mv, b, current_backend(), symbolic=True))

    def _looped(self, b, operands):
        """The solution by :func:`looped_cg` (``"cg"``, or ``"normal_cg"`` on the normal equations), where the
        backend has a compiled loop (``while_loop``); None otherwise. NaN where it did not converge."""
        backend = current_backend()
        loop = getattr(backend, "while_loop", None)
        if loop is None or self.solve not in ("cg", "normal_cg"):
            return None
        xp = namespace(b)
        tol = self.tol if self.tol is not None else default_tol(str(b.dtype))
        size = int(np.prod(tuple(int(s) for s in b.shape)))
        maxiter = self.maxiter if self.maxiter is not None else max(10 * size, 100)
        mv, rmv, _ = self._linear_maps(operands, b)
        if self.solve == "normal_cg":
            x, _ = looped_cg(lambda v: rmv(mv(v)), rmv(b), tol=tol, maxiter=maxiter, loop=loop)
            bb = xp.sum(b * b)
            residual = xp.sqrt(xp.sum((mv(x) - b) ** 2) / xp.where(bb > 0, bb, xp.ones_like(bb)))
        else:
            x, residual = looped_cg(mv, b, tol=tol, maxiter=maxiter, loop=loop)
        converged = (residual <= 10.0 * tol) | (xp.sum(b * b) == 0)
        return x * xp.where(converged, xp.ones_like(residual), xp.ones_like(residual) * float("nan"))

    def _iterate(self, b, operands, mv):
        xp = namespace(b)
        tol = self.tol if self.tol is not None else default_tol(str(b.dtype))
        size = int(np.prod(tuple(int(s) for s in b.shape)))
        maxiter = self.maxiter if self.maxiter is not None else max(10 * size, 100)
        bnorm = norm(xp, b)
        if bnorm == 0.0:
            return xp.zeros_like(b)  # the tangent of an unperturbed input, often: no work, and exact
        backend = current_backend()
        mv, rmv, check = self._linear_maps(operands, b)
        if callable(self.solve):
            x, iterations, method = self.solve(mv, b), None, getattr(self.solve, "__name__", "solve")
        else:
            x, iterations = SOLVERS[self.solve](mv, b, tol=tol, maxiter=maxiter, rmatvec=rmv, backend=backend)
            method = repr(self.solve)
        if backend is not None and backend.carries_derivative(x):
            raise TypeError(f"{self.name}: matvec uses a traced array it does not expose (a global?), whose "
                            f"derivative the rule cannot give; reach it through a closure, a default argument, "
                            f"functools.partial or an object's attribute, which linear_solve differentiates")
        residual = norm(xp, check(x) - b) / bnorm
        bound = 10.0 * tol
        if not residual <= bound:  # (NaN fails too)
            spent = f" after {iterations} iterations (maxiter={maxiter})" if iterations is not None else ""
            report(self.on_failure,
                   f"{self.name}: solve={method} did not converge{spent}: relative residual |A x - b| / |b| = "
                   f"{residual:.3g}, above the tolerance {bound:.3g} (10 * tol); a derivative computed from this "
                   f"solution would be wrong. Raise maxiter, choose another solver (cg needs a symmetric positive "
                   f"definite A; gmres, bicgstab or lu take any non-singular A), or check that A is not singular or "
                   f"ill-conditioned", residual, bound)
        return x


def apply_solve(op: Operator, b, operands):
    """``A^{-1} b`` with ``A = op(., operands)``, as one custom-rule call (differentiable in ``b`` and
    ``operands``, both modes, any order)."""

    def linear_solve(b, operands):  # (the name errors show)
        with on_values(backend, (b, operands)) as (b, operands):
            return op.primal(b, operands)

    call = _Call("jvp", linear_solve, (), (b, operands))
    call.name = op.name
    backend = call.b

    def jvp_rule(primals, tangents):
        with derivative_pass(backend, op.name, "jvp"):
            guard = check_nested_transforms(backend)
            b, operands = primals
            db, doperands = tangents
            x = apply_solve(op, b, operands)
            rhs = db
            if optree.tree_leaves(operands):
                _, change = held_jvp(backend, op.apply, x, (operands,), (doperands,))
                rhs = rhs - change
            return x, guard(apply_solve(op, rhs, operands))

    def fwd(b, operands):
        x = apply_solve(op, b, operands)
        return x, (x, operands)

    def bwd(residuals, g):
        with derivative_pass(backend, op.name, "vjp"):
            guard = check_nested_transforms(backend)
            x, operands = residuals
            u = guard(apply_solve(op.T, g, operands))
            if not optree.tree_leaves(operands):
                return u, operands
            _, pullback = held_vjp(backend, op.apply, x, (operands,))
            (ct,) = pullback(u)
            return u, optree.tree_map(lambda c: -c, ct)

    def residuals(x, b, operands):  # fwd's residuals from the solution the forward computation gave
        return x, operands

    call.user_jvp, call.user_fwd, call.user_bwd, call.user_residuals = jvp_rule, fwd, bwd, residuals
    return call.apply(Rule(op.name, fun=call.flat_fun, fwd=call.flat_fwd, bwd=call.flat_bwd, jvp=call.flat_jvp,
                           residuals=call.flat_residuals))


def linear_solve(matvec: Callable, b, *, solve: Any = "cg", tol: float | None = None, maxiter: int | None = None,
                 symmetric: bool = False, transpose_solve: Any = None, on_failure: str = "raise"):
    """``x`` with ``matvec(x) = b``, matrix-free, differentiable with respect to ``b`` and to the arrays
    ``matvec`` closes over, in both modes and to any order, on every backend (MLX: first and second order in
    every nesting, compiled too, tested to the fourth order, docs/implicit.md).

    The derivative does not go through the solver's iterations: it is a linear solve itself,
    ``dx = A^{-1} (db - dA x)`` in forward mode and the transposed system ``A^T u = g`` in reverse
    mode (``A^T`` from a VJP of ``matvec``, or ``matvec`` itself where ``symmetric=True``).

    Args:
      matvec: ``v -> A v``, linear in ``v``, mapping an array of ``b``'s shape to one of the same shape
        (a pytree of ``b``'s structure and shapes to another, for a pytree ``b``).
        The arrays it closes over (closure cells, default arguments, ``functools.partial`` arguments,
        pytrees of them, and those of the functions it holds) are differentiated; arrays reached
        through globals or object attributes are constants.
      b: the right-hand side, a floating-point array of any shape, or a pytree (tuple, list, dict) of
        arrays of one real floating dtype: solved as one vector (the leaves ravelled and concatenated; a
        mixed-dtype pytree raises a TypeError naming the leaves).
      solve: ``"cg"`` (``A`` symmetric positive definite), ``"gmres"``, ``"bicgstab"``, ``"normal_cg"``
        (any non-singular ``A``), ``"lu"`` or ``"cholesky"`` (dense: ``A`` materialised by ``matvec``
        of the identity columns, then the namespace's ``linalg``), or a callable
        ``solve(matvec, b) -> x`` of your own (run on values; its result is checked like the others).
      tol: the relative residual ``|A x - b| / |b|`` the iterative solvers stop at (default 1e-10 in
        float64, 1e-5 in float32). The result is checked against ``10 * tol`` whatever the solver.
      maxiter: the most iterations (matvecs, for ``gmres``) of an iterative solver (default
        ``max(10 * b.size, 100)``).
      symmetric: ``A`` is symmetric: the transposed system (reverse mode) uses ``matvec`` itself.
      transpose_solve: the solver for the transposed system ``A^T u = g`` (default: ``solve``).
      on_failure: what a failed residual check does: ``"raise"`` (:class:`ConvergenceError`, the
        default), ``"warn"`` (:class:`ConvergenceWarning`) or ``"ignore"``.

    Returns:
      ``x``, an array of ``b``'s shape, dtype and backend (a pytree of ``b``'s structure for a pytree ``b``).

    Example:
      >>> def solution(scale):
      ...     xp = unigrad.namespace(scale)
      ...     return unigrad.linear_solve(lambda v: scale * v + 0.5 * v, xp.ones(3) * 2.0)
      >>> unigrad.grad(lambda s: unigrad.namespace(s).sum(solution(s)))(np.array(1.5))  # d/ds 6 / (s + 1/2)
      array(-1.5)
    """
    check_solve(solve)
    if transpose_solve is not None:
        check_solve(transpose_solve, "transpose_solve")
    check_on_failure(on_failure)
    if not callable(matvec):
        raise TypeError(f"linear_solve: matvec must be a callable v -> A v; got {type(matvec).__name__}")
    rebuild, found = _closure.convert(matvec, keep=_floating_array)
    backend = backend_for(optree.tree_leaves(b) + list(found))
    flat = None
    if is_single(b):
        if not backend.is_array(b):
            b = asarray(b, backend=backend)

        def closed(v, operands):
            return rebuild(operands)(v)
    else:  # a pytree: solved as one vector (its leaves ravelled and concatenated), cut back at the end
        flat = Flat(b, backend, "linear_solve: b")
        b = flat.ravel(b, "b")

        def closed(v, operands):
            return flat.ravel(rebuild(operands)(flat.unravel(v)), "matvec(v)")

    op = Operator(closed, solve=solve, transpose_solve=transpose_solve, symmetric=symmetric, tol=tol,
                  maxiter=maxiter, on_failure=on_failure)
    x = apply_solve(op, b, tuple(found))
    return x if flat is None else flat.unravel(x)


def _floating_array(x) -> bool:
    """A leaf ``linear_solve`` differentiates: an array-like of a floating dtype, not NumPy's (NumPy arrays
    are never traced: constants)."""
    if not _closure.array_like(x):
        return False
    dtype = str(x.dtype)
    return "float" in dtype or "complex" in dtype
