"""Finite differences: the reference that no autodiff rule can share a bug with.

Central differences with Richardson extrapolation (error O(h^4)), a step
chosen per dtype and per magnitude of the point, and the complex step for
functions analytic in their (real) inputs (error O(h^2) with no cancellation,
so h can be tiny). Evaluation is never below float32: float16 and bfloat16
points are promoted before differencing.

Functions here take and return NumPy arrays; ``unigrad.testing`` wraps them
around backend functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["fd_dtype", "step_size", "directional_derivative", "jacobian", "estimate_directional", "Estimate"]

# Columns of the extrapolation tableau (error terms cancelled per estimate): more gains nothing in practice.
_COLUMNS = 6


def fd_dtype(dtype, allow_float64: bool = True) -> np.dtype:
    """The dtype finite differences are evaluated in for inputs of ``dtype``: float64 / complex128
    where allowed, else float32 / complex64 -- never below float32."""
    kind = np.dtype(dtype).kind if not str(dtype) == "bfloat16" else "f"
    if kind == "c":
        return np.dtype(np.complex128 if allow_float64 else np.complex64)
    return np.dtype(np.float64 if allow_float64 else np.float32)


def step_size(dtype, scale: float = 1.0, *, richardson: bool = True) -> float:
    """Step for central differences: eps**(1/5) with Richardson (error h^4), eps**(1/3) without (h^2),
    scaled by the magnitude of the point."""
    eps = np.finfo(np.dtype(dtype) if np.dtype(dtype).kind != "c" else np.float64 if np.dtype(dtype).itemsize == 16
                   else np.float32).eps
    power = 1 / 5 if richardson else 1 / 3
    return float(eps ** power * max(1.0, scale))


def _combine(outs_plus, outs_minus, h):
    return [(p - m) / (2 * h) for p, m in zip(outs_plus, outs_minus)]


def directional_derivative(f: Callable, primals: Sequence[np.ndarray], tangents: Sequence[np.ndarray], *,
                           method: str = "central", step: float | None = None, richardson: bool = True):
    """Estimate the JVP ``J(primals) @ tangents`` of ``f(*primals) -> list of arrays`` in O(1) evaluations.

    Args:
      f: takes NumPy arrays (the promoted dtype), returns a list/tuple of arrays.
      primals, tangents: matching lists of arrays (already in the evaluation dtype).
      method: ``"central"`` or ``"complex_step"`` (f must be analytic and accept complex input;
        primals must be real).
      step: the step h; default from :func:`step_size` for the primals' dtype and magnitude.
      richardson: combine steps h and h/2 to cancel the h^2 error term (central only).

    Returns:
      A list of arrays, one per output of f.
    """
    primals = [np.asarray(p) for p in primals]
    tangents = [np.asarray(t) for t in tangents]
    dtype = np.result_type(*primals) if primals else np.float64
    if method == "complex_step":
        if np.dtype(dtype).kind == "c":
            raise ValueError("complex_step needs real primals")
        h = step if step is not None else 1e-20 if np.dtype(dtype) == np.float64 else 1e-10
        outs = f(*[p + 1j * h * t for p, t in zip(primals, tangents)])
        return [np.imag(o) / h for o in outs]
    if method != "central":
        raise ValueError(f"method must be 'central' or 'complex_step'; got {method!r}")
    scale = max([float(np.max(np.abs(p), initial=0.0)) for p in primals] + [0.0])
    tscale = max([float(np.max(np.abs(t), initial=0.0)) for t in tangents] + [0.0]) or 1.0
    h = step if step is not None else step_size(dtype, scale, richardson=richardson) / tscale

    def central(hh):
        plus = f(*[p + hh * t for p, t in zip(primals, tangents)])
        minus = f(*[p - hh * t for p, t in zip(primals, tangents)])
        return _combine([np.asarray(o) for o in plus], [np.asarray(o) for o in minus], hh)

    d_h = central(h)
    if not richardson:
        return d_h
    d_h2 = central(h / 2)
    return [(4 * b - a) / 3 for a, b in zip(d_h, d_h2)]


def jacobian(f: Callable, primals: Sequence[np.ndarray], **kwargs):
    """Full finite-difference Jacobian: ``jac[i][j]`` of shape ``out_i.shape + primal_j.shape``.

    One directional derivative per input element (a testing tool, meant for small inputs).
    """
    primals = [np.asarray(p) for p in primals]
    columns = None
    for j, p in enumerate(primals):
        for flat_index in range(p.size):
            tangents = [np.zeros_like(q) for q in primals]
            tangents[j].reshape(-1)[flat_index] = 1
            d = directional_derivative(f, primals, tangents, **kwargs)
            if columns is None:
                columns = [[[] for _ in primals] for _ in d]
            for i, di in enumerate(d):
                columns[i][j].append(di)
    if columns is None:  # every input is empty: evaluate once for output shapes
        outs = f(*primals)
        return [[np.zeros(np.shape(o) + p.shape, dtype=np.result_type(o, p)) for p in primals] for o in outs]
    jac = []
    for i, per_input in enumerate(columns):
        row = []
        for j, p in enumerate(primals):
            cols = per_input[j]
            out_shape = np.shape(columns[i][next(k for k, c in enumerate(per_input) if c)][0])
            if not cols:
                row.append(np.zeros(out_shape + p.shape))
                continue
            stacked = np.stack(cols, axis=-1)  # out_shape + (p.size,)
            row.append(stacked.reshape(out_shape + p.shape))
        jac.append(row)
    return jac


# ---------------------------------------------------------------------------------------------
# Finite differences that estimate their own error (Ridders' extrapolation)
# ---------------------------------------------------------------------------------------------

@dataclass
class Estimate:
    """A finite-difference derivative with its estimated error, per output of f.

    Attributes:
      value: one array per output of f: the best estimate of each element.
      error: arrays of the same shapes: the estimated absolute error of each element (the
        disagreement of successive extrapolated estimates, and never below the rounding error of
        the difference quotient that produced it). ``inf`` where no two estimates agreed (a jump,
        or values that are not finite at every step tried).
      steps: the step of the difference quotient each element's estimate came from (same shapes).
      evaluations: how many times f was called.
    """

    value: list
    error: list
    steps: list
    evaluations: int = 0

    def max_relative_error(self) -> float:
        """max over elements of error / max(1, |value|)."""
        worst = 0.0
        for v, e in zip(self.value, self.error):
            if np.size(v):
                worst = max(worst, float(np.max(np.abs(e) / np.maximum(1.0, np.abs(v)))))
        return worst


def _as_float(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def estimate_directional(f: Callable, primals: Sequence[np.ndarray], tangents: Sequence[np.ndarray], *,
                         side: str = "central", rtol: float = 1e-11, first_step: float | None = None,
                         shrink: float = 2.0, max_rows: int | None = None, local: bool = False) -> Estimate:
    """The directional derivative ``J(primals) @ tangents`` of ``f(*primals) -> list of arrays``, with
    an estimate of its own error.

    Ridders' method: difference quotients at steps ``h, h / shrink, h / shrink**2, ...`` are
    extrapolated to step 0 (Neville's tableau: error terms h^2, h^4... for central differences; h,
    h^2... one-sided). For every output element the estimate kept is the one whose extrapolation
    agrees best with its neighbours in the tableau; that disagreement is the element's error
    estimate. Steps shrink until every element's error is below ``rtol * max(1, |value|)``, or the
    step reaches the rounding limit of the evaluation dtype. So the step is chosen per direction and
    per element: a fast-varying function gets a small step, a kink or a jump close to the point is
    stepped under (the estimates before and after disagree, those after agree), and a point where
    nothing converges (at a jump) reports an infinite or large error instead of a wrong number.

    Args:
      f: takes NumPy arrays (the evaluation dtype), returns a list/tuple of arrays.
      primals, tangents: matching lists of arrays.
      side: ``"central"``, ``"forward"`` (x + h v, h > 0) or ``"backward"`` (x - h v): the one-sided
        derivatives tell a kink at the point itself (they differ) from a smooth point.
      rtol: stop shrinking once every element is this accurate (relative above 1, absolute below).
      first_step: the largest step along the unit-max-norm direction (default 0.1 x max(1, |x|)).
      shrink: the ratio of successive steps.
      max_rows: the most steps tried (default: down to the rounding limit).
      local: start a thousand times closer (but well above the rounding limit). Extrapolation from
        large steps can converge to a neighbouring branch -- eigenvectors whose sign flips between the
        point and the first steps, say -- so when an estimate and a derivative disagree, the local
        estimate is the one that speaks for the point.

    Returns:
      An :class:`Estimate`.
    """
    if side not in ("central", "forward", "backward"):
        raise ValueError(f"side must be 'central', 'forward' or 'backward'; got {side!r}")
    primals = [np.asarray(p) for p in primals]
    tangents = [np.asarray(t) for t in tangents]
    dtype = np.result_type(*primals) if primals else np.dtype(np.float64)
    real = np.dtype(dtype).kind != "c"
    eps = float(np.finfo(np.dtype(dtype) if real else (np.float64 if np.dtype(dtype).itemsize == 16
                                                        else np.float32)).eps)
    scale = max([float(np.max(np.abs(p), initial=0.0)) for p in primals] + [1.0])
    tscale = max([float(np.max(np.abs(t), initial=0.0)) for t in tangents] + [0.0]) or 1.0
    h = (first_step if first_step is not None else 0.1 * scale) / tscale
    # The smallest useful step: below it rounding in f(x +- h v) swamps the difference.
    floor = eps ** 0.5 * scale / tscale
    if local:
        h = max(16 * floor, 1e-3 * h)
    if max_rows is None:
        max_rows = max(3, int(math.ceil(math.log(max(h / floor, 1.0)) / math.log(shrink))) + 1)
    power = 2 if side == "central" else 1
    sign = -1.0 if side == "backward" else 1.0
    evaluations = 0
    with np.errstate(all="ignore"):
        base = None
        if side != "central":
            base = [_as_float(o) for o in f(*primals)]
            evaluations += 1

        def quotient(step):
            nonlocal evaluations
            plus = [_as_float(o) for o in f(*[p + sign * step * t for p, t in zip(primals, tangents)])]
            evaluations += 1
            if side == "central":
                minus = [_as_float(o) for o in f(*[p - step * t for p, t in zip(primals, tangents)])]
                evaluations += 1
            else:
                minus = base
            q = [sign * (a - b) / (step if side != "central" else 2 * step) for a, b in zip(plus, minus)]
            # rounding: each value carries ~ a few eps of its magnitude; the quotient divides that by h
            noise = [8 * eps * (np.abs(a) + np.abs(b)) / (step if side != "central" else 2 * step) + 1e-300
                     for a, b in zip(plus, minus)]
            return q, noise

        best = err = steps = None
        prev_row = None
        step = h
        for row in range(max_rows):
            q, noise = quotient(step)
            if best is None:
                best = [np.array(x, copy=True) for x in q]
                err = [np.full(np.shape(x), np.inf) for x in q]
                steps = [np.full(np.shape(x), step) for x in q]
            cur = [q]
            fac = shrink ** power
            for j in range(1, min(row, _COLUMNS) + 1):
                prev = prev_row[j - 1]
                cur.append([(fac * a - b) / (fac - 1) for a, b in zip(cur[j - 1], prev)])
                for k in range(len(q)):
                    e = np.maximum(np.abs(cur[j][k] - cur[j - 1][k]), np.abs(cur[j][k] - prev[k]))
                    e = np.where(np.isfinite(e), np.maximum(e, noise[k] * (1 + 2 * j)), np.inf)
                    better = e < err[k]
                    if np.any(better):
                        best[k] = np.where(better, cur[j][k], best[k])
                        err[k] = np.where(better, e, err[k])
                        steps[k] = np.where(better, step, steps[k])
                fac *= shrink ** power
            prev_row = cur
            if row >= 2 and all(np.all(e <= rtol * np.maximum(1.0, np.abs(b))) for e, b in zip(err, best)):
                break
            step /= shrink
    return Estimate(best, err, steps, evaluations)
