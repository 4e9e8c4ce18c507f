"""``check_grads``: finite-difference and transpose checks of JVPs and VJPs, recursively to any order."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import optree

from .. import _api, _registry
from .. import finite_differences as fd
from .._dtypes import COMPLEX

__all__ = ["check_grads", "GradientCheckError", "TOLERANCES"]


class GradientCheckError(AssertionError):
    """A derivative disagreed with finite differences or with its own transpose."""


# Per computation dtype: (rtol, atol) against finite differences, and rtol of the exact transpose test.
TOLERANCES = {
    "float64": {"fd": (1e-5, 1e-7), "transpose": 1e-9},
    "complex128": {"fd": (1e-5, 1e-7), "transpose": 1e-9},
    "float32": {"fd": (3e-3, 1e-4), "transpose": 1e-4},
    "complex64": {"fd": (3e-3, 1e-4), "transpose": 1e-4},
    "float16": {"fd": (5e-2, 5e-3), "transpose": 2e-2},
    "bfloat16": {"fd": (1e-1, 2e-2), "transpose": 5e-2},
}


def _worst(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float):
    """Index, values and excess of the worst element, or None when all are within tolerance."""
    actual = np.asarray(actual, dtype=np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected)
                        else np.float64)
    expected = np.asarray(expected, dtype=actual.dtype)
    if actual.shape != expected.shape:
        return (), actual, expected, np.inf
    if actual.size == 0:
        return None
    scale = max(1.0, float(np.max(np.abs(expected))))
    err = np.abs(actual - expected)
    bound = atol * scale + rtol * np.abs(expected)
    bad = ~(err <= bound)  # NaN counts as bad
    if not bad.any():
        return None
    excess = np.where(bad, np.nan_to_num(err / np.maximum(bound, 1e-300), nan=np.inf), 0)
    idx = np.unravel_index(int(np.argmax(excess)), err.shape)
    return idx, actual[idx], expected[idx], excess[idx]


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
        self.argnums = tuple(range(len(args))) if argnums is None else (
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
        if "fwd" in modes:
            _, jvp_out = _api.jvp(g, primals, tangents_b, backend=b)
            jvp_np = [np.asarray(b.to_numpy(t)) for t in jvp_out]
            for k in range(len(primals)):  # one argument at a time, so a failure names its argument
                only_k = [t if j == k else np.zeros_like(t) for j, t in enumerate(tangents)]
                only_k_b = tuple(b.asarray(t, dtype=d) for t, d in zip(only_k, self.dtypes))
                _, ad = _api.jvp(g, primals, only_k_b, backend=b) if len(primals) > 1 else (None, jvp_out)
                expected = fd.directional_derivative(numpy_g, points, only_k, method=self.fd_method)
                for i, (a, e) in enumerate(zip(ad, expected)):
                    bad = _worst(b.to_numpy(a), _real_if_real(e, out_dtypes[i]), rtol, atol)
                    if bad is not None:
                        self.fail(label("JVP"), self.names[k], i, bad, "finite differences")
        if "rev" in modes:
            _, vjp_fn = _api.vjp(g, *primals, backend=b)
            vjp_out = vjp_fn(cotangents_b)
            vjp_np = [np.asarray(b.to_numpy(c)) for c in vjp_out]
            for k in range(len(primals)):
                only_k = [t if j == k else np.zeros_like(t) for j, t in enumerate(tangents)]
                expected_dir = fd.directional_derivative(numpy_g, points, only_k, method=self.fd_method)
                lhs = _inner([vjp_np[k]], [tangents[k]])
                rhs = _inner(cotangents, [_real_if_real(e, d) for e, d in zip(expected_dir, out_dtypes)])
                bad = _worst(np.asarray(lhs), np.asarray(rhs), rtol, atol)
                if bad is not None:
                    self.fail(label("VJP"), self.names[k], None, bad,
                              "finite differences (dot-product test <vjp(u), v> vs <u, fd_jvp(v)>)")
        if jvp_out is not None and vjp_out is not None:
            lhs = _inner(cotangents, jvp_np)
            rhs = _inner(vjp_np, tangents)
            bad = _worst(np.asarray(lhs), np.asarray(rhs), self.tol["transpose"], self.tol["transpose"])
            if bad is not None:
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

    def fail(self, check, arg_name, output_index, bad, against):
        idx, actual, expected, excess = bad
        where = f", output {output_index}" if output_index is not None else ""
        at = f" at index {tuple(int(i) for i in idx)}" if idx != () else ""
        raise GradientCheckError(
            f"check_grads [{self.backend.name}]: {check.strip()} check failed for {arg_name}{where}{at}: "
            f"got {actual!r}, expected {expected!r} from {against} "
            f"(error {excess:.3g}x the tolerance rtol={self.tol['fd'][0]:g}, atol={self.tol['fd'][1]:g})")


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
      - VJP: the dot-product test ``<vjp(u), v> == <u, fd_jvp(v)>``, per argument;
      - transpose: ``<u, J v>`` (from jvp) ``== <J^T u, v>`` (from vjp), exact up to rounding.
    Order k > 1 repeats the checks on the derived functions ``x -> jvp(f, x, v)`` and
    ``x -> vjp(f, x)(u)`` ("JVP of VJP", "VJP of VJP"...).

    Args:
      f: function of ``args`` returning an array or pytree of arrays.
      args: tuple of arguments (pytrees allowed); NumPy arrays are converted to the backend.
      order: derivative order to check (2 by default, as autograd does).
      modes: subset of ``("fwd", "rev")``.
      argnums: which arguments to differentiate (default all).
      backend: backend name or object (default: selection order).
      seed, rng: the directions come from ``rng`` or ``np.random.default_rng(seed)`` -- never the global RNG.
      tolerances: overrides for the dtype's entry of :data:`TOLERANCES` (``{"fd": (rtol, atol), "transpose": r}``).
      fd_method: ``"central"`` (with Richardson) or ``"complex_step"``.

    Raises:
      GradientCheckError: naming the check ("VJP of JVP"...), the argument, the worst element's index and
        both values.

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
