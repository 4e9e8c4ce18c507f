"""``check_grads``: finite-difference and transpose checks of JVPs and VJPs, recursively to any order."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import optree

from .. import _api, _registry
from .. import finite_differences as fd
from .._dtypes import COMPLEX

__all__ = ["check_grads", "GradientCheckError", "FiniteDifferencesInconclusive", "TOLERANCES", "FD_SAFETY"]


class GradientCheckError(AssertionError):
    """A derivative disagreed with finite differences or with its own transpose."""


class FiniteDifferencesInconclusive(Exception):
    """Finite differences could not decide at this point: their own error estimate is larger than the
    tolerance (a jump or a kink at or next to the point, values too large or not finite nearby), or the
    point is a non-differentiable point where the derivative is a convention. This says nothing against
    the derivative: it is not an ``AssertionError``. Check at another point.
    """


# The finite-difference error estimate is an estimate: a derivative is judged against finite
# differences with the tolerance widened by FD_SAFETY times it; where that widening is larger than the
# tolerance itself, finite differences cannot decide and the check is inconclusive instead of passing.
FD_SAFETY = 10.0


# Per computation dtype: (rtol, atol) against finite differences, and rtol of the exact transpose test.
TOLERANCES = {
    "float64": {"fd": (1e-5, 1e-7), "transpose": 1e-9},
    "complex128": {"fd": (1e-5, 1e-7), "transpose": 1e-9},
    "float32": {"fd": (3e-3, 1e-4), "transpose": 1e-4},
    "complex64": {"fd": (3e-3, 1e-4), "transpose": 1e-4},
    "float16": {"fd": (5e-2, 5e-3), "transpose": 2e-2},
    "bfloat16": {"fd": (1e-1, 2e-2), "transpose": 5e-2},
}


def _worst(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float, fd_error=None):
    """Judge ``actual`` against ``expected`` (finite differences with elementwise estimated error
    ``fd_error``, or None for an exact reference).

    Returns None when every element is within tolerance; else ``(kind, index, actual, expected, excess,
    fd_error_there)`` of the worst element, ``kind`` ``"fail"`` (beyond the tolerance widened by
    ``FD_SAFETY`` x the finite-difference error) or ``"inconclusive"`` (within it only because finite
    differences are too uncertain to tell).
    """
    actual = np.asarray(actual, dtype=np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected)
                        else np.float64)
    expected = np.asarray(expected, dtype=actual.dtype)
    if actual.shape != expected.shape:
        return "fail", (), actual, expected, np.inf, 0.0
    if actual.size == 0:
        return None
    fd_error = np.zeros(expected.shape) if fd_error is None else np.broadcast_to(
        np.asarray(fd_error, dtype=np.float64), expected.shape)
    finite = np.isfinite(expected) & np.isfinite(fd_error)
    scale = max(1.0, float(np.max(np.abs(np.where(finite, expected, 0)), initial=0.0)))
    err = np.abs(actual - expected)
    bound = atol * scale + rtol * np.abs(expected)
    slack = FD_SAFETY * fd_error
    ok = err <= bound  # NaN counts as bad
    unsure = ~ok & (~finite | ((err <= bound + slack) & (slack > bound)))
    within = ~ok & finite & (err <= bound + slack) & (slack <= bound)
    bad = ~ok & ~unsure & ~within
    if not bad.any() and not unsure.any():
        return None
    kind = "fail" if bad.any() else "inconclusive"
    chosen = bad if bad.any() else unsure
    with np.errstate(all="ignore"):
        excess = np.where(chosen, np.nan_to_num(err / np.maximum(bound, 1e-300), nan=np.inf), -1)
    idx = np.unravel_index(int(np.argmax(excess)), err.shape)
    return kind, idx, actual[idx], expected[idx], excess[idx], float(fd_error[idx])


def _inner(xs, ys) -> complex:
    """Real part of the bilinear product sum(x * y) (no conjugation: the house complex convention)."""
    total = 0.0
    for x, y in zip(xs, ys):
        total += np.real(np.sum(np.asarray(x, np.complex128) * np.asarray(y, np.complex128)))
    return float(total)


def _random_like(rng, x: np.ndarray, dtype_name: str) -> np.ndarray:
    v = rng.standard_normal(np.shape(x))
    if dtype_name in COMPLEX:
        v = v + 1j * rng.standard_normal(np.shape(x))
    return v


class _Checker:
    def __init__(self, f, args, backend, rng, tolerances, fd_method, argnums):
        self.f, self.rng, self.fd_method = f, rng, fd_method
        self.args = tuple(args)
        self.argnums = floating_argnums(self.args) if argnums is None else (
            (argnums,) if isinstance(argnums, int) else tuple(argnums))
        diff = tuple(self.args[i] for i in self.argnums)
        leaves, self.treedef = optree.tree_flatten(diff)
        self.names = _api._arg_names(diff, self.argnums)
        self.backend = _registry.resolve(backend, leaves)
        b = self.backend
        self.leaves = [_api._convert(b, x, self.names[k]) for k, x in enumerate(leaves)]
        self.dtypes = [b.dtype(x) for x in self.leaves]
        worst = max(self.dtypes, key=lambda d: TOLERANCES.get(d, TOLERANCES["float64"])["fd"][0])
        self.tol = dict(TOLERANCES.get(worst, TOLERANCES["float64"]))
        if tolerances:
            self.tol.update(tolerances)
        self.fd_dtypes = [fd.fd_dtype(d, b.capabilities.float64) for d in self.dtypes]

    def flat(self, fn):
        return flat_function(fn, self.args, self.argnums, self.treedef)

    def numpy_eval(self, g):
        """g as a function of NumPy arrays in the finite-difference dtype, returning NumPy arrays."""
        b = self.backend

        def h(*arrays):
            xs = [b.asarray(np.asarray(a).astype(dt), dtype=dt.name) for a, dt in zip(arrays, self.fd_dtypes)]
            return [np.asarray(b.to_numpy(o), dtype=np.complex128 if b.dtype(o) in COMPLEX else np.float64)
                    for o in b.evaluate(g, xs)]
        return h

    def run(self, fn, order, modes, derived):
        """Checks of ``fn``; ``derived`` names how fn was derived from f ("" for f itself, "VJP", "JVP of VJP")."""
        label = (lambda check: check if not derived else f"{check} of {derived}")
        g = self.flat(fn)
        b = self.backend
        primals = self.leaves
        points = [np.asarray(b.to_numpy(x)).astype(dt) for x, dt in zip(primals, self.fd_dtypes)]
        outputs = b.evaluate(g, primals)
        out_dtypes = [b.dtype(o) for o in outputs]
        tangents = [_random_like(self.rng, p, d) for p, d in zip(points, self.dtypes)]
        cotangents = [_random_like(self.rng, b.to_numpy(o), d) for o, d in zip(outputs, out_dtypes)]
        tangents_b = tuple(b.asarray(t, dtype=d) for t, d in zip(tangents, self.dtypes))
        cotangents_b = tuple(b.asarray(c, dtype=d) for c, d in zip(cotangents, out_dtypes))
        numpy_g = self.numpy_eval(g)
        rtol, atol = self.tol["fd"]
        jvp_out = vjp_out = None
        estimates = {}

        def fd_along(k, only_k, local=False):
            """Finite differences along the tangent of argument k alone (computed once per argument);
            ``local``: from steps a thousand times smaller, asked for when the default ones disagree."""
            if (k, local) not in estimates:
                estimates[k, local] = self.fd_estimate(numpy_g, points, only_k, local=local)
            return estimates[k, local]

        def one_hot(k):
            return [t if j == k else np.zeros_like(t) for j, t in enumerate(tangents)]

        if "fwd" in modes:
            _, jvp_out = _api.jvp(g, primals, tangents_b, backend=b)
            jvp_np = [np.asarray(b.to_numpy(t)) for t in jvp_out]
            for k in range(len(primals)):  # one argument at a time, so a failure names its argument
                only_k = one_hot(k)
                only_k_b = tuple(b.asarray(t, dtype=d) for t, d in zip(only_k, self.dtypes))
                _, ad = _api.jvp(g, primals, only_k_b, backend=b) if len(primals) > 1 else (None, jvp_out)
                value, error = fd_along(k, only_k)
                ad_np = [np.asarray(b.to_numpy(a)) for a in ad]
                for i, (a, e, ee) in enumerate(zip(ad_np, value, error)):
                    bad = _worst(a, _real_if_real(e, out_dtypes[i]), rtol, atol, ee)
                    if bad is not None:
                        value_l, error_l = fd_along(k, only_k, local=True)
                        bad = _worst(a, _real_if_real(value_l[i], out_dtypes[i]), rtol, atol, error_l[i])
                    if bad is not None:
                        self.settle(label("JVP"), self.names[k], i, bad, "finite differences", numpy_g, points,
                                    only_k, lambda side_values, i=i: _real_if_real(side_values[i], out_dtypes[i]),
                                    ad_np[i])
        if "rev" in modes:
            _, vjp_fn = _api.vjp(g, *primals, backend=b)
            vjp_out = vjp_fn(cotangents_b)
            vjp_np = [np.asarray(b.to_numpy(c)) for c in vjp_out]
            # linearity: a VJP is linear in its cotangent (a custom bwd that clips or squares g is not)
            scaled = vjp_fn(tuple(b.asarray(-3.0 * c, dtype=d) for c, d in zip(cotangents, out_dtypes)))
            for k, (s_k, v_k) in enumerate(zip(scaled, vjp_np)):
                bad = _worst(np.asarray(b.to_numpy(s_k)), -3.0 * v_k, self.tol["transpose"], self.tol["transpose"])
                if bad is not None:
                    self.fail(label("linearity test vjp(-3 u) == -3 vjp(u)"), self.names[k], None, bad,
                              "-3 x the VJP of u (a VJP is linear in its cotangent: is a custom bwd non-linear in g?)")
            for k in range(len(primals)):
                only_k = one_hot(k)
                lhs = _inner([vjp_np[k]], [tangents[k]])
                for local in (False, True):
                    value, error = fd_along(k, only_k, local)
                    rhs = _inner(cotangents, [_real_if_real(e, d) for e, d in zip(value, out_dtypes)])
                    rhs_error = sum(float(np.sum(np.abs(np.asarray(c)) * np.asarray(ee))) if np.size(ee) else 0.0
                                    for c, ee in zip(cotangents, error))
                    bad = _worst(np.asarray(lhs), np.asarray(rhs), rtol, atol, np.asarray(rhs_error))
                    if bad is None:
                        break
                if bad is not None:
                    self.settle(label("VJP"), self.names[k], None, bad,
                                "finite differences (dot-product test <vjp(u), v> vs <u, fd_jvp(v)>)", numpy_g,
                                points, only_k,
                                lambda side_values: np.asarray(_inner(cotangents, [_real_if_real(e, d) for e, d in
                                                                                   zip(side_values, out_dtypes)])),
                                np.asarray(lhs))
        if jvp_out is not None and vjp_out is not None:
            lhs = _inner(cotangents, jvp_np)
            rhs = _inner(vjp_np, tangents)
            bad = _worst(np.asarray(lhs), np.asarray(rhs), self.tol["transpose"], self.tol["transpose"])
            if bad is not None and not self.at_kink(numpy_g, points, tangents):
                self.fail(label("transpose test <u, J v> vs <J^T u, v>"), "all arguments", None, bad,
                          "the VJP (they must agree exactly up to rounding)")
        if order > 1:
            if not b.capabilities.higher_order:
                raise ValueError(f"check_grads: backend {b.name!r} does not nest transforms; use order=1")
            n = len(primals)
            if "fwd" in modes:
                fixed_t = tangents_b

                def jvp_of(*leaves):
                    return _api.jvp(g, leaves, fixed_t, backend=b)[1]
                self.run_derived(jvp_of, n, order - 1, modes, label("JVP"))
            if "rev" in modes:
                fixed_c = cotangents_b

                def vjp_of(*leaves):
                    return _api.vjp(g, *leaves, backend=b)[1](fixed_c)
                self.run_derived(vjp_of, n, order - 1, modes, label("VJP"))

    def run_derived(self, fn, n, order, modes, derived):
        sub = object.__new__(_Checker)
        sub.__dict__.update(self.__dict__)
        sub.args = tuple(self.leaves)
        sub.argnums = tuple(range(n))
        sub.treedef = optree.tree_structure(tuple(self.leaves))
        sub.run(fn, order, modes, derived)

    def fd_estimate(self, numpy_g, points, tangents, side="central", local=False):
        """(values, errors): finite differences of numpy_g along tangents, with their error estimates."""
        rtol, atol = self.tol["fd"]
        if self.fd_method == "complex_step" and side == "central":  # exact to rounding: no error to estimate
            value = fd.directional_derivative(numpy_g, points, tangents, method="complex_step")
            return value, [np.zeros(np.shape(v)) for v in value]
        est = fd.estimate_directional(numpy_g, points, tangents, side=side, rtol=min(rtol, atol) / 100,
                                      local=local or side != "central")
        return est.value, est.error

    def at_kink(self, numpy_g, points, tangents) -> bool:
        """Whether f is not differentiable at the point along ``tangents``: its one-sided derivatives
        both converge and differ by more than the tolerance."""
        rtol, atol = self.tol["fd"]
        (fw, fw_err), (bw, bw_err) = (self.fd_estimate(numpy_g, points, tangents, side) for side in
                                      ("forward", "backward"))
        for a, b_, ea, eb in zip(fw, bw, fw_err, bw_err):
            if not np.size(a):
                continue
            gap = np.abs(a - b_)
            scale = max(1.0, float(np.max(np.abs(a))), float(np.max(np.abs(b_))))
            if np.any(gap > (atol + rtol) * scale + FD_SAFETY * (ea + eb)):
                return True
        return False

    def settle(self, check, arg_name, output_index, bad, against, numpy_g, points, tangents, project, actual):
        """A derivative missed finite differences: decide between "wrong" and "cannot tell here".

        At a kink on the point itself (the one-sided derivatives differ), a derivative between the two
        one-sided ones is a valid convention and finite differences are inconclusive; one outside them is
        wrong. Otherwise a "fail" is a failure and an "inconclusive" is inconclusive.
        """
        rtol, atol = self.tol["fd"]
        (fw, fw_err), (bw, bw_err) = (self.fd_estimate(numpy_g, points, tangents, side) for side in
                                      ("forward", "backward"))
        plus, minus = np.asarray(project(fw)), np.asarray(project(bw))
        plus_err = np.asarray(project(fw_err)) if output_index is not None else None
        gap = np.abs(plus - minus)
        scale = max(1.0, float(np.max(np.abs(plus), initial=0.0)), float(np.max(np.abs(minus), initial=0.0)))
        sides_err = 0.0 if plus_err is None else float(np.max(np.abs(plus_err), initial=0.0))
        if np.size(gap) and np.all(np.isfinite(gap)) and float(np.max(gap)) > (atol + rtol) * scale + FD_SAFETY * sides_err:
            lo, hi = np.minimum(np.real(plus), np.real(minus)), np.maximum(np.real(plus), np.real(minus))
            slack = (atol + rtol) * scale
            if np.all((np.real(actual) >= lo - slack) & (np.real(actual) <= hi + slack)):
                raise FiniteDifferencesInconclusive(
                    f"check_grads [{self.backend.name}]: finite differences inconclusive here: {check.strip()} for "
                    f"{arg_name} is at a non-differentiable point (the one-sided derivatives differ), where the "
                    f"derivative is a convention; it lies between them. Check at another point.")
            self.fail(check, arg_name, output_index, ("fail",) + tuple(bad[1:]), against + " (at a kink: "
                      "not between the one-sided derivatives)")
        self.fail(check, arg_name, output_index, bad, against)

    def fail(self, check, arg_name, output_index, bad, against):
        kind, idx, actual, expected, excess, fd_err = bad
        where = f", output {output_index}" if output_index is not None else ""
        at = f" at index {tuple(int(i) for i in idx)}" if idx != () else ""
        if kind == "inconclusive":
            raise FiniteDifferencesInconclusive(
                f"check_grads [{self.backend.name}]: finite differences inconclusive here: {check.strip()} for "
                f"{arg_name}{where}{at}: got {actual!r}, finite differences give {expected!r} with an estimated "
                f"error of {fd_err:.3g}, too large to decide at rtol={self.tol['fd'][0]:g}, "
                f"atol={self.tol['fd'][1]:g}. This does not say the derivative is wrong; check at another point.")
        fd_note = f"; finite-difference error estimate {fd_err:.2g}" if fd_err else ""
        raise GradientCheckError(
            f"check_grads [{self.backend.name}]: {check.strip()} check failed for {arg_name}{where}{at}: "
            f"got {actual!r}, expected {expected!r} from {against} "
            f"(error {excess:.3g}x the tolerance rtol={self.tol['fd'][0]:g}, atol={self.tol['fd'][1]:g}"
            f"{fd_note})")


def _inexact_leaf(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, (float, complex)):
        return True
    if isinstance(x, (int,)) or not hasattr(x, "dtype"):
        return False
    try:
        dt = np.dtype(x.dtype)
        kind, name = dt.kind, dt.name
    except TypeError:  # a framework dtype NumPy does not know (torch.float32...): ask its name
        kind, name = "", str(x.dtype)
    # bfloat16 (ml_dtypes) has kind "V": its name says it is floating
    return kind in ("f", "c") or any(k in name for k in ("float", "complex"))


def floating_argnums(args, who="check_grads") -> tuple:
    """The default of ``check_grads``, ``compare``, ``assert_backends_agree`` and ``unigrad check``: every
    argument whose leaves are all floating-point or complex arrays (or Python floats)."""
    chosen = []
    for i, arg in enumerate(args):
        leaves = optree.tree_leaves(arg)
        if leaves and all(_inexact_leaf(x) for x in leaves):
            chosen.append(i)
    if not chosen:
        raise TypeError(f"{who}: no argument holds only floating-point arrays to differentiate; pass argnums")
    return tuple(chosen)


def flat_function(fn, args, argnums, treedef):
    """``fn`` as a function of the leaves of ``args[argnums]`` (structured as ``treedef``), the other
    arguments fixed, returning a flat tuple of output leaves."""
    def g(*leaves):
        diff = optree.tree_unflatten(treedef, list(leaves))
        call = list(args)
        for k, i in enumerate(argnums):
            call[i] = diff[k]
        return tuple(optree.tree_leaves(fn(*call)))
    return g


def _real_if_real(x, dtype_name):
    return np.real(x) if dtype_name not in COMPLEX else x


def check_grads(f: Callable, args: Sequence, *, order: int = 2, modes=("fwd", "rev"), argnums=None,
                backend=None, seed: int | None = 0, rng: np.random.Generator | None = None,
                tolerances: dict | None = None, fd_method: str = "central") -> None:
    """Check ``f``'s derivatives on ``backend`` against finite differences and against each other.

    Order 1, in random directions ``v`` (inputs) and ``u`` (outputs):
      - JVP: ``jvp(f, args, v)`` against a finite-difference directional derivative, per argument;
      - VJP: the dot-product test ``<vjp(u), v> == <u, fd_jvp(v)>``, per argument, and linearity
        ``vjp(-3 u) == -3 vjp(u)`` (a custom ``bwd`` must be linear in its cotangent);
      - transpose: ``<u, J v>`` (from jvp) ``== <J^T u, v>`` (from vjp), exact up to rounding.
    Order k > 1 repeats the checks on the derived functions ``x -> jvp(f, x, v)`` and
    ``x -> vjp(f, x)(u)`` ("JVP of VJP", "VJP of VJP"...).

    Args:
      f: function of ``args`` returning an array or pytree of arrays.
      args: tuple of arguments (pytrees allowed); NumPy arrays are converted to the backend.
      order: derivative order to check (2 by default, as autograd does).
      modes: subset of ``("fwd", "rev")``.
      argnums: which arguments to differentiate (default: every floating-point argument, as ``compare``).
      backend: backend name or object (default: selection order).
      seed, rng: the directions come from ``rng`` or ``np.random.default_rng(seed)`` -- never the global RNG.
      tolerances: overrides for the dtype's entry of :data:`TOLERANCES` (``{"fd": (rtol, atol), "transpose": r}``).
      fd_method: ``"central"`` (Ridders' extrapolation with an error estimate) or ``"complex_step"``.

    Finite differences estimate their own error (:func:`unigrad.finite_differences.estimate_directional`:
    the step is shrunk and extrapolated until successive estimates agree); the tolerance is widened by
    :data:`FD_SAFETY` times that estimate. Where the widening would exceed the tolerance itself, or the
    point is a kink (the one-sided derivatives differ and the derivative lies between them), finite
    differences cannot decide: :class:`FiniteDifferencesInconclusive` is raised, which is not an
    ``AssertionError`` and never means the derivative is wrong.

    Raises:
      GradientCheckError: naming the check ("VJP of JVP"...), the argument, the worst element's index and
        both values.
      FiniteDifferencesInconclusive: finite differences cannot decide at this point.

    Example:
      >>> check_grads(lambda x: unigrad.namespace(x).sin(x) ** 2, (np.linspace(0, 1, 5),))
    """
    modes = tuple(modes)
    if not modes or any(m not in ("fwd", "rev") for m in modes):
        raise ValueError(f"check_grads: modes must be a non-empty subset of ('fwd', 'rev'); got {modes!r}")
    if not isinstance(order, int) or order < 1:
        raise ValueError(f"check_grads: order must be a positive int; got {order!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"check_grads: args must be a tuple of arguments; got {type(args).__name__}")
    rng = rng if rng is not None else np.random.default_rng(seed)
    checker = _Checker(f, args, backend, rng, tolerances, fd_method, argnums)
    checker.run(f, order, modes, "")
