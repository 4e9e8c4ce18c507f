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

from typing import Callable, Sequence

import numpy as np

__all__ = ["fd_dtype", "step_size", "directional_derivative", "jacobian"]


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
