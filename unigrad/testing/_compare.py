"""``compare``: one function on every backend, checked against each other and against finite differences.

For each backend (and device) ``compare`` evaluates the value, a VJP with a
random cotangent ``u``, a JVP with a random tangent ``v`` (the same ``u`` and
``v`` for every backend: one seed), the Jacobian when the problem is small and,
with ``order=2``, the JVP of the VJP (a Hessian-vector product for a scalar
function). Then it checks:

* against finite differences of the backend's own function, evaluated in
  float64 where the backend has it: ``J v`` (JVP and Jacobian), the dot-product
  test ``<J^T u, v> == <u, J v>`` (VJP) and the exact transpose test between
  the backend's own JVP and VJP;
* against the reference backend (the NumPy tape when it is compared): every
  quantity, with the tighter "pairwise" tolerance of the dtype.

Non-differentiable points: when a derivative misses the central finite
difference, one-sided differences along ``v`` decide. If they agree, the
point is smooth there and the derivative is wrong (DISAGREE). If they differ,
the point is a kink: an answer lying between the two one-sided derivatives
(on the segment joining them, elementwise) is a valid convention and is
reported as "convention difference"; anything else is DISAGREE.

Errors are ``max |a - b| / max(1, max |a|, max |b|)``: relative for values
above 1, absolute below (a derivative that should be 0 and is 1e-17 is fine).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import optree

from .. import _api, _registry
from .. import finite_differences as fd
from .._dtypes import COMPLEX, INEXACT
from ._check_grads import FD_SAFETY, TOLERANCES, FiniteDifferencesInconclusive, flat_function, floating_argnums

__all__ = ["compare", "assert_backends_agree", "Comparison", "BackendResult", "PAIRWISE_TOLERANCES",
           "AGREE", "DISAGREE", "CONVENTION", "INCONCLUSIVE"]

AGREE = "agree"
DISAGREE = "DISAGREE"
CONVENTION = "convention difference"
INCONCLUSIVE = "finite differences inconclusive"

# Two backends computing the same thing in the same dtype differ by rounding only.
PAIRWISE_TOLERANCES = {
    "float64": 1e-8, "complex128": 1e-8,
    "float32": 1e-4, "complex64": 1e-4,
    "float16": 1e-2, "bfloat16": 5e-2,
}

# What each quantity is called in messages and tables.
NAMES = {"value": "value", "jvp": "JVP", "vjp": "VJP", "transpose": "transpose test", "jacobian": "Jacobian",
         "second": "JVP of VJP"}
_TIMED = ("value", "jvp", "vjp", "jacobian", "second")


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

@dataclass
class Check:
    """One comparison of one quantity: its error, the tolerance, and what it means."""

    quantity: str           # "value", "jvp", "vjp", "transpose", "jacobian", "second"
    against: str            # "fd", "self" (transpose) or the reference backend's label
    error: float
    tolerance: float
    status: str             # "ok", "kink" (a valid one-sided answer at a kink), "inconclusive" (finite
    #                         differences too uncertain here to decide either way) or "fail"
    message: str = ""


@dataclass
class BackendResult:
    """Everything ``compare`` measured for one backend on one device.

    Arrays are NumPy copies, flattened: ``outputs[i]``; ``jvp[i]`` per output; ``vjp[j]`` and
    ``second[j]`` per differentiated input leaf; ``jacobian[i][j]`` of shape ``out_i + in_j``.
    """

    backend: str
    device: str
    label: str
    version: str = ""
    status: str = "ok"      # "ok", "error", "skipped"
    message: str = ""       # why it errored or was skipped
    outputs: list | None = None
    jvp: list | None = None
    vjp: list | None = None
    jacobian: list | None = None
    second: list | None = None
    times: dict = field(default_factory=dict)   # seconds per quantity, steady state (best call after the first)
    first_times: dict = field(default_factory=dict)  # seconds per quantity, first call (includes warm-up)
    dtypes: dict = field(default_factory=dict)  # quantity -> dtype names of its arrays
    checks: list = field(default_factory=list)  # Check objects
    verdict: str = AGREE

    def check(self, quantity: str, against: str) -> Check | None:
        for c in self.checks:
            if c.quantity == quantity and (c.against == against or (against == "ref" and c.against not in
                                                                    ("fd", "self", "dtype"))):
                return c
        return None

    @property
    def reasons(self) -> list[str]:
        """Human-readable lines for every failed check and every convention difference."""
        if self.status != "ok":
            return [f"{self.label}: {self.message}"]
        return [f"{self.label} {NAMES[c.quantity]}: {c.message}" for c in self.checks if c.status != "ok"]


class Comparison:
    """The report of :func:`compare`: per-backend results, pairwise errors and a verdict.

    ``str(report)`` / ``report.table()`` is a terminal table, ``report.to_markdown()`` a Markdown
    table, ``report.to_dict()`` / ``report.to_json()`` the machine-readable form.
    ``report.verdict`` is ``"agree"``, ``"convention difference"``, ``"DISAGREE"`` or ``"error"``;
    ``report.ok`` is true for the first two. ``report["torch"]`` is that backend's
    :class:`BackendResult`; ``report.pairwise[("numpy", "torch")]["vjp"]`` a pairwise error.
    """

    def __init__(self, function: str, argnums, dtype, seed, order, reference, results, pairwise, tolerances,
                 input_names):
        self.function, self.argnums, self.dtype, self.seed, self.order = function, argnums, dtype, seed, order
        self.reference, self.results, self.pairwise = reference, results, pairwise
        self.tolerances, self.input_names = tolerances, input_names

    # ------------------------------------------------------------------ verdicts
    @property
    def verdict(self) -> str:
        verdicts = [r.verdict for r in self.results]
        if DISAGREE in verdicts:
            return DISAGREE
        if any(v.startswith("error") for v in verdicts) or not any(r.status == "ok" for r in self.results):
            return "error"
        if INCONCLUSIVE in verdicts:
            return INCONCLUSIVE
        if CONVENTION in verdicts:
            return CONVENTION
        return AGREE

    @property
    def ok(self) -> bool:
        return self.verdict in (AGREE, CONVENTION)

    def __getitem__(self, label: str) -> BackendResult:
        for r in self.results:
            if r.label == label:
                return r
        raise KeyError(f"no backend {label!r} in this comparison; have {[r.label for r in self.results]}")

    @property
    def reasons(self) -> list[str]:
        return [line for r in self.results for line in r.reasons]

    # ------------------------------------------------------------------ rendering
    def _columns(self):
        cols = [("value", "ref"), ("jvp", "fd"), ("jvp", "ref"), ("vjp", "fd"), ("vjp", "ref"),
                ("transpose", "self")]
        if any(r.jacobian is not None for r in self.results):
            cols += [("jacobian", "fd"), ("jacobian", "ref")]
        if self.order >= 2:
            cols += [("second", "fd"), ("second", "ref")]
        return cols

    def _rows(self):
        cols = self._columns()
        short = {"value": "value", "jvp": "JVP", "vjp": "VJP", "transpose": "transpose", "jacobian": "Jac",
                 "second": "2nd"}
        header = ["backend", "device"]
        for q, against in cols:
            header.append(short[q] if q in ("value", "transpose") else f"{short[q]} {against}")
        timed = [q for q in _TIMED if any(q in r.first_times for r in self.results)]
        steady = any(r.times for r in self.results)
        names = "/".join(short[q] for q in timed)
        header += [f"ms first {names}"] + ([f"ms steady {names}"] if steady else []) + ["verdict"]
        rows = []
        for r in self.results:
            row = [r.backend + (" (ref)" if r.label == self.reference else ""), r.device]
            for q, against in cols:
                if r.status != "ok":
                    row.append("")
                elif against == "ref" and r.label == self.reference:
                    row.append("ref")
                else:
                    row.append(_cell(r.check(q, against)))
            row.append("/".join(_ms(r.first_times.get(q)) for q in timed) if r.status == "ok" else "")
            if steady:
                row.append("/".join(_ms(r.times.get(q)) for q in timed) if r.status == "ok" else "")
            verdict = r.verdict
            row.append(verdict if len(verdict) <= 60 else verdict[:57] + "...")
            rows.append(row)
        return header, rows

    def _title(self):
        dtype = self.dtype or self.tolerances.get("dtype", "input dtypes")
        return (f"unigrad compare: {self.function}  (argnums {self.argnums}, {dtype}, seed {self.seed}, "
                f"order {self.order}, reference {self.reference})")

    def _legend(self):
        t = self.tolerances
        return (f"errors are max|a-b| / max(1,|a|,|b|); fd = vs finite differences (tol {t['fd']:.0e}), "
                f"ref = vs {self.reference} (tol {t['pairwise']:.0e}), transpose = <u,Jv> vs <J^T u,v> "
                f"(tol {t['transpose']:.0e}); ! = over tolerance, ~ = valid one-sided value at a kink, "
                f"? = finite differences inconclusive here")

    def table(self) -> str:
        """The report as a plain-text table for a terminal."""
        header, rows = self._rows()
        lines = [self._title(), self._legend(), ""] + text_table(header, rows)
        lines.append("")
        lines.append(f"overall: {self.verdict}")
        lines += ["  " + r for r in self.reasons]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The report as a Markdown table (with the verdict and reasons below it)."""
        header, rows = self._rows()
        lines = [f"**{self._title()}**", ""] + markdown_table(header, rows)
        lines += ["", f"Overall: **{self.verdict}**. {self._legend()}."]
        if self.reasons:
            lines.append("")
            lines += [f"- {md_escape(r)}" for r in self.reasons]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """A JSON-compatible dict (non-finite numbers become strings)."""
        backends = []
        for r in self.results:
            backends.append({
                "backend": r.backend, "device": r.device, "label": r.label, "version": r.version,
                "status": r.status, "message": r.message or None, "verdict": r.verdict,
                "times_s": {k: _num(v) for k, v in r.times.items()},
                "first_call_times_s": {k: _num(v) for k, v in r.first_times.items()},
                "checks": [{"quantity": c.quantity, "against": c.against, "error": _num(c.error),
                            "tolerance": c.tolerance, "status": c.status, "message": c.message or None}
                           for c in r.checks],
                "output_shapes": None if r.outputs is None else [list(o.shape) for o in r.outputs],
                "reasons": r.reasons,
            })
        return {
            "function": self.function, "argnums": list(self.argnums), "inputs": self.input_names,
            "dtype": self.dtype, "seed": self.seed, "order": self.order, "reference": self.reference,
            "tolerances": self.tolerances, "verdict": self.verdict, "ok": self.ok, "backends": backends,
            "pairwise": [{"a": a, "b": b, **{q: _num(e) for q, e in errs.items()}}
                         for (a, b), errs in self.pairwise.items()],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return self.table()


def text_table(header, rows) -> list:
    """Lines of a plain-text table, columns padded to their widest cell (a header and a rule first)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return lines


def md_escape(x) -> str:
    return str(x).replace("|", "\\|")


def markdown_table(header, rows) -> list:
    """Lines of a Markdown table."""
    lines = ["| " + " | ".join(md_escape(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else str(x)


def _cell(check: Check | None) -> str:
    if check is None:
        return "-"
    e = check.error
    text = "0" if e == 0 else ("inf" if not math.isfinite(e) else f"{e:.1e}")
    return text + {"ok": "", "kink": "~", "inconclusive": "?", "fail": "!"}[check.status]


def _ms(seconds):
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


# ---------------------------------------------------------------------------------------------
# Error measures
# ---------------------------------------------------------------------------------------------

def _as_np(x) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _error(a_list, b_list):
    """``(error, where)``: max|a-b| / max(1, |a|, |b|) over lists of arrays, and the worst element
    as ``(k, index, a, b)``; inf with ``where = (k, "shape", a.shape, b.shape)`` on a shape mismatch."""
    if len(a_list) != len(b_list):
        return math.inf, (None, "count", len(a_list), len(b_list))
    scale, worst, where = 1.0, 0.0, None
    pairs = []
    for k, (a, b) in enumerate(zip(a_list, b_list)):
        a, b = _as_np(a), _as_np(b)
        if a.shape != b.shape:
            return math.inf, (k, "shape", a.shape, b.shape)
        pairs.append((k, a, b))
        if a.size:
            scale = max(scale, float(np.max(np.abs(a))), float(np.max(np.abs(b))))
    for k, a, b in pairs:
        if not a.size:
            continue
        d = np.abs(a - b)
        d = np.where(np.isnan(a) & np.isnan(b), 0.0, d)  # NaN where both are NaN agrees
        d = np.where(np.isnan(d), np.inf, d)
        i = int(np.argmax(d))
        if where is None or d.flat[i] > worst:
            worst = float(d.flat[i])
            where = (k, np.unravel_index(i, a.shape), a.flat[i], b.flat[i])
    if not math.isfinite(scale):
        scale = 1.0
    return worst / scale, where


def _segment_error(x_list, plus_list, minus_list):
    """Distance of each element of x from the segment [minus, plus] (elementwise; complex too), normalised."""
    scale, worst, where = 1.0, 0.0, None
    for k, (x, p, m) in enumerate(zip(x_list, plus_list, minus_list)):
        x, p, m = _as_np(x), _as_np(p), _as_np(m)
        if x.shape != p.shape:
            return math.inf, (k, "shape", x.shape, p.shape)
        if not x.size:
            continue
        scale = max(scale, float(np.max(np.abs(x))), float(np.max(np.abs(p))), float(np.max(np.abs(m))))
        d = p - m
        dd = np.abs(d) ** 2
        t = np.clip(np.real(np.conj(d) * (x - m)) / np.where(dd == 0, 1, dd), 0, 1)
        dist = np.abs(x - (m + t * d))
        dist = np.where(np.isnan(dist), np.inf, dist)
        i = int(np.argmax(dist))
        if where is None or dist.flat[i] > worst:
            worst = float(dist.flat[i])
            where = (k, np.unravel_index(i, x.shape), x.flat[i], (m.flat[i], p.flat[i]))
    return worst / scale, where


def _has_nan(xs) -> bool:
    return any(bool(np.any(np.isnan(_as_np(x)))) for x in xs)


def _inner(xs, ys) -> float:
    """Real part of the unconjugated pairing sum(x * y) (the house complex convention)."""
    return float(sum(np.real(np.sum(_as_np(x).astype(np.complex128) * _as_np(y))) for x, y in zip(xs, ys)))


def _inner_interval(us, minus, plus):
    """The range of <u, w> over w between minus and plus elementwise."""
    lo = hi = 0.0
    for u, m, p in zip(us, minus, plus):
        a = np.real(_as_np(u).astype(np.complex128) * _as_np(m))
        b = np.real(_as_np(u).astype(np.complex128) * _as_np(p))
        lo += float(np.sum(np.minimum(a, b)))
        hi += float(np.sum(np.maximum(a, b)))
    return lo, hi


def _scalar_error(a, b):
    return abs(a - b) / max(1.0, abs(a), abs(b)) if math.isfinite(a) and math.isfinite(b) else (
        0.0 if a == b else math.inf)


def _fmt(x):
    x = complex(x) if np.iscomplexobj(x) else float(x)
    return f"{x:.8g}" if isinstance(x, float) else f"({x.real:.8g}{x.imag:+.8g}j)"


# ---------------------------------------------------------------------------------------------
# Finite differences with one-sided fallbacks
# ---------------------------------------------------------------------------------------------

class _Directional:
    """Finite differences of ``fn`` (NumPy in, list of NumPy out) at ``points`` along ``tangents``, each
    with its own error estimate (Ridders' extrapolation): central computed on demand, one-sided only when
    something misses it."""

    def __init__(self, fn, points, tangents, rtol=1e-9):
        self.fn, self.points, self.tangents, self.rtol = fn, points, tangents, rtol
        self._central = self._sides = self._local = None

    def _estimate(self, side, local=False):
        est = fd.estimate_directional(self.fn, self.points, self.tangents, side=side, rtol=self.rtol, local=local)
        return [_as_np(v) for v in est.value], [np.asarray(e, dtype=np.float64) for e in est.error]

    def local_with_error(self):
        """(values, errors) from steps a thousand times smaller: what speaks for the point when the
        default estimate and a derivative disagree (the large steps may reach another branch)."""
        if self._local is None:
            self._local = self._estimate("central", local=True)
        return self._local

    def central(self):
        return self.central_with_error()[0]

    def central_with_error(self):
        """(values, errors): the central estimate and its elementwise estimated error."""
        if self._central is None:
            self._central = self._estimate("central")
        return self._central

    def sides(self):
        """(forward, backward) one-sided derivatives."""
        return tuple(v for v, _ in self.sides_with_error())

    def sides_with_error(self):
        if self._sides is None:
            self._sides = (self._estimate("forward", local=True), self._estimate("backward", local=True))
        return self._sides

    def has_kink(self, tol) -> bool:
        """The one-sided derivatives differ by more than ``tol`` plus their own uncertainty."""
        (plus, plus_err), (minus, minus_err) = self.sides_with_error()
        return _widened_error(plus, minus, [a + b for a, b in zip(plus_err, minus_err)])[0] > tol

    def singular(self) -> bool:
        """No one-sided derivative exists here: a one-sided estimate is not finite (f is NaN or infinite
        beside the point: a negative base of a real power) or has no stable value (its estimated error is
        above 1 % of it: a singularity such as log at 0, the ``where`` trap)."""
        for values, errors in self.sides_with_error():
            for v, e in zip(values, errors):
                v, e = np.asarray(v), np.asarray(e, dtype=np.float64)
                if not v.size:
                    continue
                if not (np.all(np.isfinite(v)) and np.all(np.isfinite(e))):
                    return True
                if float(np.max(e)) > _UNSTABLE * max(1.0, float(np.max(np.abs(v)))):
                    return True
        return False

    def no_derivative(self, tol) -> bool:
        """f has no derivative along the tangent here (a kink or a singularity): every mode's answer, and
        NaN, is a convention (docs/conventions.md), not a number finite differences can check."""
        return self.has_kink(tol) or self.singular()


# A one-sided estimate whose own error is above this fraction of it has no stable value.
_UNSTABLE = 1e-2


def _widened_error(ad, fd_values, fd_errors):
    """``(error, slack, where)``: the error of ``ad`` against finite differences after taking off
    ``FD_SAFETY`` x their estimated error, elementwise, normalised like :func:`_error`; ``slack`` is the
    largest normalised amount taken off (how uncertain the finite differences are)."""
    if len(ad) != len(fd_values):
        return math.inf, 0.0, (None, "count", len(ad), len(fd_values))
    scale, worst, slack, where = 1.0, 0.0, 0.0, None
    pairs = []
    for k, (a, b, e) in enumerate(zip(ad, fd_values, fd_errors)):
        a, b = _as_np(a), _as_np(b)
        if a.shape != b.shape:
            return math.inf, 0.0, (k, "shape", a.shape, b.shape)
        pairs.append((k, a, b, np.broadcast_to(np.asarray(e, dtype=np.float64), b.shape)))
        if a.size:
            finite = np.isfinite(b)
            scale = max(scale, float(np.max(np.abs(np.where(np.isfinite(a), a, 0)))),
                        float(np.max(np.abs(np.where(finite, b, 0)))))
    for k, a, b, e in pairs:
        if not a.size:
            continue
        with np.errstate(invalid="ignore"):
            taken = FD_SAFETY * np.where(np.isnan(e), np.inf, e)
            d = np.abs(a - b)
            d = np.where(np.isnan(a) & np.isnan(b), 0.0, d)
            d = np.where(np.isnan(d), np.inf, d)
            d = np.where(np.isinf(taken), 0.0, np.maximum(d - taken, 0.0))
        slack = max(slack, float(np.max(taken)))
        i = int(np.argmax(d))
        if where is None or d.flat[i] > worst:
            worst = float(d.flat[i])
            where = (k, np.unravel_index(i, a.shape), a.flat[i], b.flat[i])
    return worst / scale, slack / scale, where


def _inconclusive(quantity, slack, tol, what=""):
    return Check(quantity, "fd", slack, tol, "inconclusive",
                 f"finite differences inconclusive here{what}: their estimated error ({slack / FD_SAFETY:.2e}) "
                 f"is too large to decide at tolerance {tol:.0e}; this does not say the derivative is wrong")


def _check_directional(quantity, dd: _Directional, ad, tol, what) -> Check:
    """``ad`` (a list of arrays, the AD directional derivative) against finite differences."""
    central, central_err = dd.central_with_error()
    err, where = _error(ad, central)
    if err <= tol:
        return Check(quantity, "fd", err, tol, "ok")
    if where is not None and where[1] == "shape":
        return Check(quantity, "fd", err, tol, "fail",
                     f"{what(where[0])} has shape {where[2]}; finite differences give {where[3]}")
    central, central_err = dd.local_with_error()
    err, where = _error(ad, central)
    if err <= tol:
        return Check(quantity, "fd", err, tol, "ok")
    err_w, slack, where_w = _widened_error(ad, central, central_err)
    if err_w <= tol:
        if slack <= tol:  # within the tolerance once the (small) uncertainty of finite differences is allowed
            return Check(quantity, "fd", err, tol, "ok")
        conclusive = False
    else:
        conclusive = True
    (plus, plus_err), (minus, minus_err) = dd.sides_with_error()
    if dd.singular() and (_has_nan(ad) or _segment_error(ad, plus, minus)[0] <= tol):
        return Check(quantity, "fd", err, tol, "kink",
                     "convention difference at a point where f has no derivative (a singularity, or NaN "
                     "beside it): NaN, or a value between the one-sided estimates (docs/conventions.md)")
    gap, gap_slack, _ = _widened_error(plus, minus, [a + b for a, b in zip(plus_err, minus_err)])
    if gap <= tol:  # smooth along v: the one-sided estimates agree; trust them with the central one
        if not conclusive:
            return _inconclusive(quantity, slack, tol)
        k, idx, a, b = where_w if where_w is not None else where
        return Check(quantity, "fd", err, tol, "fail",
                     f"differs from finite differences: {what(k)} at index {_idx(idx)}: {_fmt(a)} vs "
                     f"{_fmt(b)} (error {err_w:.2e} > tolerance {tol:.0e})")
    seg_err, seg_where = _segment_error(ad, plus, minus)
    if seg_err <= tol:
        return Check(quantity, "fd", err, tol, "kink",
                     "convention difference at a non-differentiable point: a valid one-sided value "
                     "(between the one-sided derivatives along the tangent)")
    k, idx, a, (m, p) = seg_where
    return Check(quantity, "fd", err, tol, "fail",
                 f"differs from finite differences at a non-differentiable point: {what(k)} at index "
                 f"{_idx(idx)}: {_fmt(a)} is not between the one-sided derivatives {_fmt(m)} and {_fmt(p)} "
                 f"(error {seg_err:.2e} > tolerance {tol:.0e})")


def _idx(idx):
    return tuple(int(i) for i in idx)


# ---------------------------------------------------------------------------------------------
# The problem, as every backend sees it
# ---------------------------------------------------------------------------------------------

def _complex_of(dtype: str) -> str:
    return {"float32": "complex64", "float16": "complex64", "bfloat16": "complex64"}.get(dtype, "complex128")


class _Problem:
    """The function, its arguments as NumPy, the differentiated leaves and the random directions."""

    def __init__(self, f, args, argnums, dtype, seed):
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"compare: args must be a tuple of arguments; got {type(args).__name__}")
        self.f, self.seed = f, seed
        args = tuple(args)
        if argnums is None:
            argnums = floating_argnums(args, "compare")
        elif argnums == "all":
            argnums = tuple(range(len(args)))
        _, self.argnums, _ = _api._normalize_argnums(argnums, len(args), "compare")
        if dtype is not None and dtype not in INEXACT:
            raise ValueError(f"compare: dtype must be one of {sorted(INEXACT)} or None; got {dtype!r}")
        self.dtype = dtype

        def to_numpy(x, differentiated):
            if isinstance(x, bool):
                return x
            if isinstance(x, (int, float, complex)):
                if not differentiated:  # a Python number the function may use as such (a scale, an axis)
                    return x
                x = np.asarray(x)
            elif isinstance(x, (np.ndarray, np.generic)) or _registry._array_owner(x) is not None:
                x = np.asarray(_api.to_numpy(x))
            else:
                return x
            if dtype is not None and x.dtype.kind == "f":
                x = x.astype(dtype if dtype not in COMPLEX else {"complex64": "float32"}.get(dtype, "float64"))
            elif dtype is not None and x.dtype.kind == "c":
                x = x.astype(dtype if dtype in COMPLEX else _complex_of(dtype))
            return x

        self.args = tuple(optree.tree_map(lambda x, i=i: to_numpy(x, i in self.argnums), a)
                          for i, a in enumerate(args))
        diff = tuple(self.args[i] for i in self.argnums)
        leaves, self.treedef = optree.tree_flatten(diff)
        self.names = _api._arg_names(diff, self.argnums)
        for name, x in zip(self.names, leaves):
            if not isinstance(x, np.ndarray) or x.dtype.kind not in "fc":
                kind = x.dtype.name if isinstance(x, np.ndarray) else type(x).__name__
                raise TypeError(f"compare: {name} is differentiated (argnums={self.argnums}) but is {kind}; "
                                f"only floating-point or complex arrays can be differentiated")
        if not leaves:
            raise ValueError(f"compare: the differentiated arguments {self.argnums} hold no arrays")
        self.leaves = leaves
        self.leaf_dtypes = [x.dtype.name for x in leaves]
        self.tangents = _random_directions([(x.shape, x.dtype.kind == "c") for x in leaves], seed, 0)

    def cotangents(self, outputs):
        return _random_directions([(o.shape, np.iscomplexobj(o)) for o in outputs], self.seed, 1)

    def flat_function(self, args_b):
        """f as a function of the differentiated leaves only, returning a flat tuple of output leaves."""
        return flat_function(self.f, args_b, self.argnums, self.treedef)


def _random_directions(specs, seed, stream):
    rng = np.random.default_rng([abs(int(seed)), stream])
    out = []
    for shape, is_complex in specs:
        v = rng.standard_normal(shape)
        if is_complex:
            v = v + 1j * rng.standard_normal(shape)
        out.append(np.asarray(v))
    return out


def _in_backend(b, fn, *xs):
    """Call ``fn`` with ``b`` as the running backend, so ``unigrad.namespace`` answers with b's namespace
    even for array types b shares with another backend (a plugin over NumPy arrays, say), and through
    ``b.evaluate`` when the backend has one (JAX: float64 needs its scoped x64 context)."""
    token = _registry.active_backend.set(b)
    try:
        evaluate = getattr(b, "evaluate", None)
        return evaluate(fn, xs) if callable(evaluate) else fn(*xs)
    finally:
        _registry.active_backend.reset(token)


def _device_available(b, device: str) -> bool:
    have = [str(d).lower() for d in b.devices()]
    d = str(device).lower()
    if d in have:
        return True
    kind, _, index = d.partition(":")
    gpu_like = ("cuda", "gpu")
    if kind == "cpu":
        return any(h.startswith("cpu") for h in have)
    if kind in gpu_like:
        return any(h.partition(":")[0] in gpu_like and (not index or h.partition(":")[2] in (index, ""))
                   for h in have)
    return False


# ---------------------------------------------------------------------------------------------
# Running one backend
# ---------------------------------------------------------------------------------------------

class _Run:
    """One backend on one device: converted arguments, measured quantities, finite differences."""

    def __init__(self, problem: _Problem, b, device, label, jacobian, order, repeats=1):
        self.p, self.b, self.device, self.repeats = problem, b, device, repeats
        self.result = BackendResult(backend=b.name, device=device, label=label, version=_version(b))
        self.jacobian_wanted, self.order = jacobian, order
        self.fd_f = self.fd_second = None

    def convert(self, x):
        if isinstance(x, np.ndarray):
            return self.b.asarray(x, device=self.device)
        return x

    def numpy(self, x):
        if self.b.is_array(x):
            return np.asarray(self.b.to_numpy(x))
        return np.asarray(_api.to_numpy(x))

    def timed(self, quantity, fn):
        """Run ``fn`` once (the first call: tracing, compilation, caches warming up) and then ``repeats``
        more times (the steady state); keep the last result, the first call's time and the best later time."""
        start = time.perf_counter()
        out = fn()
        self.result.first_times[quantity] = time.perf_counter() - start
        best = math.inf
        for _ in range(self.repeats):
            start = time.perf_counter()
            out = fn()
            best = min(best, time.perf_counter() - start)
        if self.repeats:
            self.result.times[quantity] = best
        return out

    def dtypes(self, arrays):
        return [self.b.dtype(a) if self.b.is_array(a) else np.asarray(a).dtype.name for a in arrays]

    def run(self):
        r, p, b = self.result, self.p, self.b
        step = "converting the inputs"
        try:
            args_b = tuple(optree.tree_map(self.convert, a) for a in p.args)
            g = p.flat_function(args_b)
            diff_b = [self.convert(x) for x in p.leaves]
            self.g, self.diff_b = g, diff_b

            step = "evaluating f"
            outputs = self.timed("value", lambda: _in_backend(b, g, *diff_b))
            if not outputs:
                raise TypeError("f returned no arrays")
            r.outputs = [self.numpy(o) for o in outputs]
            r.dtypes["value"] = self.dtypes(outputs)
            tangents_b = [b.asarray(t, dtype=d, device=self.device) for t, d in zip(p.tangents, p.leaf_dtypes)]
            cts = p.cotangents(r.outputs)
            self.cotangents = cts
            cts_b = tuple(b.asarray(c, dtype=d, device=self.device) for c, d in zip(cts, r.dtypes["value"]))

            step = "JVP"
            _, tan_out = self.timed("jvp", lambda: _api.jvp(g, diff_b, tangents_b, backend=b))
            r.jvp = [self.numpy(t) for t in tan_out]
            r.dtypes["jvp"] = self.dtypes(tan_out)

            step = "VJP"
            grads = self.timed("vjp", lambda: _api.vjp(g, *diff_b, backend=b)[1](cts_b))
            r.vjp = [self.numpy(c) for c in grads]
            r.dtypes["vjp"] = self.dtypes(grads)

            n_in = sum(x.size for x in p.leaves)
            n_out = sum(o.size for o in r.outputs)
            if self.jacobian_wanted is True or (self.jacobian_wanted == "auto" and n_in * n_out <= 4096):
                step = "Jacobian"
                jac = self.timed("jacobian",
                                 lambda: _api.jacobian(g, argnums=tuple(range(len(diff_b))), backend=b)(*diff_b))
                r.jacobian = [[self.numpy(block) for block in row] for row in jac]

            if self.order >= 2:
                step = "JVP of VJP"
                if not b.capabilities.higher_order:
                    r.message = "does not nest transforms: second order not checked"
                else:
                    def vjp_of(*x):
                        return _api.vjp(g, *x, backend=b)[1](cts_b)
                    second = self.timed("second", lambda: _api.jvp(vjp_of, diff_b, tangents_b, backend=b)[1])
                    r.second = [self.numpy(s) for s in second]
                    r.dtypes["second"] = self.dtypes(second)
        except Exception as exc:  # a backend that raises is reported, not propagated
            r.status = "error"
            r.message = f"{step} raised {type(exc).__name__}: {exc}"
            r.verdict = f"error: {type(exc).__name__} in {step}"
        return r

    # ------------------------------------------------------------------ finite differences
    def _fd_dtypes(self):
        return [fd.fd_dtype(d, self.b.capabilities.float64) for d in self.p.leaf_dtypes]

    def _points(self):
        return [x.astype(dt) for x, dt in zip(self.p.leaves, self._fd_dtypes())]

    def _numpy_fn(self, fn):
        b, dts = self.b, self._fd_dtypes()

        def h(*arrays):
            xs = [b.asarray(np.asarray(a).astype(dt), dtype=dt.name, device=self.device) for a, dt in zip(arrays, dts)]
            return [_as_np(self.numpy(o)) for o in _in_backend(b, fn, *xs)]
        return h

    def directional_f(self) -> _Directional:
        if self.fd_f is None:
            tangents = [t.astype(dt) for t, dt in zip(self.p.tangents, self._fd_dtypes())]
            self.fd_f = _Directional(self._numpy_fn(self.g), self._points(), tangents)
        return self.fd_f

    def directional_second(self) -> _Directional:
        if self.fd_second is None:
            b, g = self.b, self.g
            cts = [b.asarray(c, device=self.device) for c in self.cotangents]

            def vjp_of(*x):
                return _api.vjp(g, *x, backend=b)[1](tuple(cts))
            tangents = [t.astype(dt) for t, dt in zip(self.p.tangents, self._fd_dtypes())]
            self.fd_second = _Directional(self._numpy_fn(vjp_of), self._points(), tangents)
        return self.fd_second


def _version(b):
    try:
        return str(b.version())
    except Exception:  # a version string is decoration; never fail the comparison for it
        return ""


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------

def _tolerances(problem, results, overrides, reference):
    dtypes = list(problem.leaf_dtypes)
    ordered = sorted(results, key=lambda r: r.label != reference)
    for r in ordered:
        if "value" in r.dtypes:
            dtypes += r.dtypes["value"]
            break
    if problem.dtype is not None:
        dtypes.append(problem.dtype)
    known = [d for d in dtypes if d in TOLERANCES]
    worst = max(known, key=lambda d: TOLERANCES[d]["fd"][0]) if known else "float64"
    tol = {"dtype": worst, "fd": TOLERANCES[worst]["fd"][0], "pairwise": PAIRWISE_TOLERANCES[worst],
           "transpose": TOLERANCES[worst]["transpose"]}
    if overrides:
        unknown = set(overrides) - {"fd", "pairwise", "transpose"}
        if unknown:
            raise ValueError(f"compare: tolerances keys must be 'fd', 'pairwise', 'transpose'; got {sorted(unknown)}")
        tol.update(overrides)
    return tol


def _jacobian_times(jacobian, tangents, output_dtypes):
    """J v from the blocks jac[i][j] (out_i + in_j), or None where J v is not defined by the blocks.

    With complex inputs the blocks follow the house convention: for a real output the JVP is
    Re(sum(J * v)); a complex output of complex inputs has no single complex Jacobian unless f is
    holomorphic, so it is compared between backends only.
    """
    out = []
    for row, out_dtype in zip(jacobian, output_dtypes):
        total = None
        for block, v in zip(row, tangents):
            v = _as_np(v)
            if np.iscomplexobj(v) and out_dtype in COMPLEX:
                return None
            term = np.tensordot(_as_np(block), v, axes=v.ndim) if v.ndim else _as_np(block) * v
            if out_dtype not in COMPLEX:
                term = np.real(term)
            total = term if total is None else total + term
        out.append(total)
    return out


def own_checks(run, problem: _Problem, tol, output_name, input_name) -> list:
    """One run's checks against finite differences of its own function (JVP, the VJP's dot-product
    test, the Jacobian, the JVP of the VJP), the transpose test and the dtype contract.
    ``output_name(k)`` / ``input_name(k)`` name output and input leaves in messages.
    (``compare`` and ``compare_implementations`` both call it.)"""
    r, checks = run.result, []
    dd = run.directional_f()
    checks.append(_check_directional("jvp", dd, r.jvp, tol["fd"], output_name))
    checks.append(_vjp_dot_check(dd, r, problem, tol["fd"]))
    checks.append(_transpose_check(r, problem, run, tol))
    jv = None if r.jacobian is None else _jacobian_times(r.jacobian, problem.tangents, r.dtypes["value"])
    if jv is not None:
        checks.append(_check_directional("jacobian", dd, jv, tol["fd"], lambda k: f"(J v) for {output_name(k)}"))
    if r.second is not None:
        c = _check_directional("second", run.directional_second(), r.second, tol["fd"], input_name)
        if c.status in ("fail", "inconclusive") and dd.no_derivative(tol["fd"]):
            # f itself has a kink here: its second derivative is a convention, not a number to check
            c = Check("second", "fd", c.error, c.tolerance, "kink",
                      "not checked: f has a non-differentiable point here, so second derivatives are "
                      "conventions")
        checks.append(c)
    return checks + _dtype_checks(r, problem)


def _analyse(problem: _Problem, runs, reference, tol):
    names = problem.names

    def output_name(k):
        return f"output {k}"

    def input_name(k):
        return names[k] if k is not None and k < len(names) else f"input {k}"

    # Checks of each backend against finite differences of its own function.
    for run in runs:
        if run.result.status == "ok":
            run.result.checks += own_checks(run, problem, tol, output_name, input_name)

    ok_runs = [run for run in runs if run.result.status == "ok"]
    ref_run = next((run for run in ok_runs if run.result.label == reference), None)
    if ref_run is not None:
        _against_reference(ok_runs, ref_run, tol, names)
    for run in runs:
        r = run.result
        if r.status == "error":
            continue
        if r.status == "skipped":
            r.verdict = f"skipped: {r.message}"
            continue
        statuses = {c.status for c in r.checks}
        r.verdict = (DISAGREE if "fail" in statuses else INCONCLUSIVE if "inconclusive" in statuses
                     else CONVENTION if "kink" in statuses else AGREE)
    return _pairwise_errors(ok_runs)


_QUANTITIES = ("value", "jvp", "vjp", "jacobian", "second")


def _measured(result, quantity):
    """The arrays a backend measured for ``quantity`` (None when it was not measured)."""
    return getattr(result, "outputs" if quantity == "value" else quantity)


def _arrays_of(result, quantity):
    return _flatten(_measured(result, quantity) or [])


def _pairwise_errors(ok_runs):
    """{(label_a, label_b): {quantity: error}} for every pair of backends that ran."""
    pairwise = {}
    for i, ra in enumerate(ok_runs):
        for rb in ok_runs[i + 1:]:
            a, b = ra.result, rb.result
            pairwise[(a.label, b.label)] = {
                q: _error(_arrays_of(a, q), _arrays_of(b, q))[0] for q in _QUANTITIES
                if _measured(a, q) is not None and _measured(b, q) is not None}
    return pairwise


def _against_reference(ok_runs, ref_run, tol, names):
    """Check every backend's quantities against the reference's, with the pairwise tolerance."""
    ref = ref_run.result
    kink = []  # computed at most once: does f have a kink at the point (judged on the reference)?

    def point_has_kink():
        if not kink:
            kink.append(ref_run.directional_f().no_derivative(tol["fd"]))
        return kink[0]

    for run in ok_runs:
        r = run.result
        if r is ref:
            continue
        if r.dtypes.get("value") != ref.dtypes.get("value"):
            r.checks.append(Check("value", "dtype", math.inf, 0.0, "fail",
                                  f"output dtypes {r.dtypes.get('value')} differ from {ref.label}'s "
                                  f"{ref.dtypes.get('value')}"))
        for q in _QUANTITIES:
            if _measured(r, q) is None or _measured(ref, q) is None:
                continue
            err, where = _error(_arrays_of(r, q), _arrays_of(ref, q))
            if err <= tol["pairwise"]:
                r.checks.append(Check(q, ref.label, err, tol["pairwise"], "ok"))
                continue
            own_fd, ref_fd = r.check(q, "fd"), ref.check(q, "fd")
            own_ok = own_fd is None or own_fd.status != "fail"
            if q != "value" and own_ok and ref_fd is not None and ref_fd.status == "fail":
                # the reference is the one that misses finite differences: not this backend's fault
                r.checks.append(Check(q, ref.label, err, tol["pairwise"], "ok",
                                      f"differs from {ref.label}'s, whose {NAMES[q]} misses finite differences"))
            elif q != "value" and own_ok and point_has_kink():
                r.checks.append(Check(q, ref.label, err, tol["pairwise"], "kink",
                                      f"differs from {ref.label}'s at a non-differentiable point "
                                      f"(error {err:.2e}): a different valid convention"))
            else:
                r.checks.append(Check(q, ref.label, err, tol["pairwise"], "fail",
                                      _pairwise_message(q, ref.label, r, where, err, tol["pairwise"], names)))


def _dtype_checks(r, problem):
    """The contract: tangents out have the outputs' dtypes, cotangents in have the inputs' dtypes."""
    checks = []
    want = {"jvp": r.dtypes.get("value"), "vjp": problem.leaf_dtypes, "second": problem.leaf_dtypes}
    what = {"jvp": "output", "vjp": "input", "second": "input"}
    for q, expected in want.items():
        got = r.dtypes.get(q)
        if got is None or expected is None:
            continue
        for k, (g, e) in enumerate(zip(got, expected)):
            if g != e:
                name = problem.names[k] if what[q] == "input" else f"output {k}"
                checks.append(Check(q, "dtype", math.inf, 0.0, "fail",
                                    f"result for {name} has dtype {g}; expected {e} (the {what[q]}'s dtype)"))
                break
    return checks


def _flatten(x):
    if x and isinstance(x[0], list):
        return [block for row in x for block in row]
    return list(x)


def _pairwise_message(q, ref_label, r, where, err, tol, names):
    if where is None:
        return f"differs from {ref_label}'s (error {err:.2e} > tolerance {tol:.0e})"
    k, idx, a, b = where
    if idx == "shape":
        return f"differs from {ref_label}'s: shape {a} vs {b}"
    if idx == "count":
        return f"differs from {ref_label}'s: {a} arrays vs {b}"
    if q in ("vjp", "second"):
        what = names[k] if k < len(names) else f"input {k}"
    elif q == "jacobian":
        n = len(names)
        what = f"block [output {k // n}][{names[k % n]}]"
    else:
        what = f"output {k}"
    return (f"differs from {ref_label}'s: {what} at index {_idx(idx)}: {_fmt(a)} vs {_fmt(b)} "
            f"(error {err:.2e} > tolerance {tol:.0e})")


def _vjp_dot_check(dd, r, problem, tol) -> Check:
    """The dot-product test <J^T u, v> (from the VJP) == <u, J v> (J v from finite differences)."""
    cts = problem.cotangents(r.outputs)
    if len(r.vjp) != len(problem.tangents) or any(v.shape != t.shape for v, t in zip(r.vjp, problem.tangents)):
        bad = next((k for k, (v, t) in enumerate(zip(r.vjp, problem.tangents)) if v.shape != t.shape), None)
        detail = (f"the cotangent for {problem.names[bad]} has shape {r.vjp[bad].shape}; expected "
                  f"{problem.tangents[bad].shape}") if bad is not None else (
            f"returned {len(r.vjp)} cotangents for {len(problem.tangents)} inputs")
        return Check("vjp", "fd", math.inf, tol, "fail", detail)
    lhs = _inner(r.vjp, problem.tangents)
    central, central_err = dd.central_with_error()
    rhs = _inner(cts, central)
    err = _scalar_error(lhs, rhs)
    if err <= tol:
        return Check("vjp", "fd", err, tol, "ok")
    central, central_err = dd.local_with_error()
    rhs = _inner(cts, central)
    err = _scalar_error(lhs, rhs)
    if err <= tol:
        return Check("vjp", "fd", err, tol, "ok")
    rhs_err = sum(float(np.sum(np.abs(_as_np(c)) * e)) for c, e in zip(cts, central_err) if np.size(e))
    norm = max(1.0, abs(lhs), abs(rhs)) if math.isfinite(rhs) else max(1.0, abs(lhs))
    slack = FD_SAFETY * rhs_err / norm if math.isfinite(rhs_err) else math.inf
    err_w = max(err - slack, 0.0) if math.isfinite(slack) else 0.0
    (plus, plus_err), (minus, minus_err) = dd.sides_with_error()
    gap = _widened_error(plus, minus, [a + b for a, b in zip(plus_err, minus_err)])[0]
    if err_w <= tol and slack <= tol:
        return Check("vjp", "fd", err, tol, "ok")
    if dd.singular():
        lo, hi = _inner_interval(cts, minus, plus)
        if math.isnan(lhs) or (math.isfinite(lo) and math.isfinite(hi) and lo <= lhs <= hi):
            return Check("vjp", "fd", err, tol, "kink",
                         "convention difference at a point where f has no derivative (a singularity, or NaN "
                         "beside it): <J^T u, v> is NaN or between the one-sided estimates (docs/conventions.md)")
    if gap <= tol:
        if err_w <= tol:
            return _inconclusive("vjp", slack, tol, " (dot-product test)")
        return Check("vjp", "fd", err_w, tol, "fail",
                     f"fails the dot-product test against finite differences: <J^T u, v> = {lhs:.10g} (VJP) vs "
                     f"<u, J v> = {rhs:.10g} (finite differences) (error {err_w:.2e} > tolerance {tol:.0e})")
    lo, hi = _inner_interval(cts, minus, plus)
    slack_k = tol * max(1.0, abs(lo), abs(hi))
    if lo - slack_k <= lhs <= hi + slack_k:
        return Check("vjp", "fd", err, tol, "kink",
                     "convention difference at a non-differentiable point: <J^T u, v> lies between the "
                     "one-sided values of <u, J v>")
    return Check("vjp", "fd", err, tol, "fail",
                 f"fails the dot-product test at a non-differentiable point: <J^T u, v> = {lhs:.10g} is not "
                 f"between the one-sided values {lo:.10g} and {hi:.10g} of <u, J v>")


def _transpose_check(r, problem, run, tol) -> Check:
    cts = problem.cotangents(r.outputs)
    shapes_ok = len(r.jvp) == len(cts) and all(np.shape(j) == c.shape for j, c in zip(r.jvp, cts)) and all(
        np.shape(v) == t.shape for v, t in zip(r.vjp, problem.tangents))
    if not shapes_ok:
        return Check("transpose", "self", math.inf, tol["transpose"], "fail",
                     "JVP or VJP results have the wrong shapes (see the JVP and VJP checks)")
    lhs = _inner(cts, r.jvp)
    rhs = _inner(r.vjp, problem.tangents)
    err = _scalar_error(lhs, rhs)
    if err <= tol["transpose"]:
        return Check("transpose", "self", err, tol["transpose"], "ok")
    if run.directional_f().no_derivative(tol["fd"]):
        return Check("transpose", "self", err, tol["transpose"], "kink",
                     "JVP and VJP use different conventions at a non-differentiable point (or both give NaN "
                     "there; docs/conventions.md shows each backend's reverse and forward mode)")
    return Check("transpose", "self", err, tol["transpose"], "fail",
                 f"JVP and VJP are not transposes of each other: <u, J v> = {lhs:.12g} (JVP) vs "
                 f"<J^T u, v> = {rhs:.12g} (VJP) (error {err:.2e} > tolerance {tol['transpose']:.0e})")


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------

def _select_backends(backends):
    if backends is None or backends == "all":
        return [name for name, info in _registry.backends(load=True).items() if info["available"]]
    if isinstance(backends, str):
        return [s.strip() for s in backends.split(",") if s.strip()]
    return list(backends)


def compare(f: Callable, args: Sequence, backends="all", devices=("cpu",), argnums=None, dtype: str | None = None,
            seed: int = 0, *, order: int = 1, reference: str | None = None, jacobian="auto",
            tolerances: dict | None = None, repeats: int = 1) -> Comparison:
    """Run ``f`` and its derivatives on several backends and compare them with each other and with
    finite differences.

    Args:
      f: a portable function (it uses ``unigrad.namespace(...)``), returning an array or a pytree of arrays.
      args: tuple of arguments (pytrees allowed); NumPy arrays, Python scalars or any backend's arrays.
        Every backend gets the same values.
      backends: ``"all"`` installed and importable backends (default), a comma-separated string, or a
        list of names / Backend objects.
      devices: devices to run on (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu"``); a backend without the
        device is reported as skipped.
      argnums: int, tuple of ints or ``"all"``: which arguments are differentiated. Default (None):
        every floating-point argument -- each argument whose leaves are all floating or complex arrays or
        Python floats (integer, boolean and other arguments are passed through) -- as ``check_grads``
        and ``unigrad check`` do.
      dtype: cast every floating argument to this dtype (complex ones to the matching complex dtype);
        None keeps the arguments' dtypes.
      seed: seeds the random tangent ``v`` and cotangent ``u`` (the same for every backend).
      order: 2 also compares the JVP of the VJP (a Hessian-vector product for a scalar f).
      reference: the backend the others are compared with; default ``"numpy"`` when compared, else the
        first one.
      jacobian: ``"auto"`` (when inputs x outputs <= 4096 elements), True or False.
      repeats: after the first call of each quantity (timed on its own: it includes tracing,
        compilation and warm-up), time it this many more times and report the fastest as the steady
        state; 0 times the first call only.
      tolerances: overrides, e.g. ``{"fd": 1e-4, "pairwise": 1e-6, "transpose": 1e-8}``; defaults come
        from :data:`TOLERANCES` and :data:`PAIRWISE_TOLERANCES` for the dtype.

    Returns:
      A :class:`Comparison`. ``print(report)`` shows the table; ``report.ok`` says whether every
      backend agrees (or differs only by a convention at a non-differentiable point).

    Example:
      >>> def f(x):
      ...     xp = unigrad.namespace(x)
      ...     return xp.sum(xp.sin(x) ** 2)
      >>> print(compare(f, (np.linspace(0, 1, 5),)))          # doctest: +SKIP
    """
    if not isinstance(order, int) or order not in (1, 2):
        raise ValueError(f"compare: order must be 1 or 2; got {order!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 0:
        raise ValueError(f"compare: repeats must be an int >= 0; got {repeats!r}")
    if jacobian not in ("auto", True, False):
        raise ValueError(f"compare: jacobian must be 'auto', True or False; got {jacobian!r}")
    problem = _Problem(f, args, argnums, dtype, seed)
    names = _select_backends(backends)
    if not names:
        raise ValueError("compare: no backend to compare (none is installed and importable?)")
    if reference is not None and reference in names:  # the reference's row comes first
        names.remove(reference)
        names.insert(0, reference)
    elif reference is None and "numpy" in names:
        names.remove("numpy")
        names.insert(0, "numpy")
    devices = (devices,) if isinstance(devices, str) else tuple(devices)
    if not devices:
        raise ValueError("compare: devices must name at least one device")
    runs = []
    for name in names:
        for device in devices:
            label_name = name if isinstance(name, str) else name.name
            label = label_name if len(devices) == 1 else f"{label_name}@{device}"
            try:
                b = _registry.get_backend(name)
            except Exception as exc:
                r = BackendResult(backend=label_name, device=device, label=label, status="error",
                                  message=f"could not load the backend: {type(exc).__name__}: {exc}",
                                  verdict=f"error: {type(exc).__name__} loading the backend")
                runs.append(_Failed(r))
                continue
            run = _Run(problem, b, device, label, jacobian, order, repeats)
            r = run.result
            if device == "all":
                raise ValueError("compare: devices='all' is not supported; list the devices")
            if not _device_available(b, device):
                r.status, r.message = "skipped", f"no device {device!r} (has {', '.join(b.devices())})"
            elif any(d in COMPLEX for d in problem.leaf_dtypes) and not b.capabilities.complex:
                r.status, r.message = "skipped", "no complex support"
            elif any(d in ("float64", "complex128") for d in problem.leaf_dtypes) and not b.capabilities.float64:
                # it would compute in float32 what the others compute in float64: held to float64's tolerances
                # it fails, held to float32's the others' comparison is blunted; compared at float32 it is exact
                r.status, r.message = "skipped", ("computes no float64 (capabilities.float64 False): compare at "
                                                  "float32 to include it (dtype='float32', --dtype float32)")
            else:
                run.run()
            runs.append(run)
    labels = [run.result.label for run in runs]
    if reference is None:
        reference = "numpy" if "numpy" in labels else labels[0]
    elif reference not in labels:
        raise ValueError(f"compare: reference {reference!r} is not among the compared backends {labels}")
    tol = _tolerances(problem, [run.result for run in runs], tolerances, reference)
    pairwise = _analyse(problem, runs, reference, tol)
    fname = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
    return Comparison(fname, problem.argnums, dtype, seed, order, reference, [run.result for run in runs],
                      pairwise, tol, problem.names)


class _Failed:
    """A backend that could not even be loaded: only its result."""

    def __init__(self, result):
        self.result = result


def assert_backends_agree(f: Callable, args: Sequence, **kwargs) -> Comparison:
    """:func:`compare`, raising AssertionError (whose message is the table) unless every backend agrees
    or differs only by a convention at a non-differentiable point. Returns the report otherwise.
    Where finite differences cannot decide (and nothing disagrees), raises
    :class:`FiniteDifferencesInconclusive` instead, which is not an AssertionError.

    Example:
      >>> assert_backends_agree(f, (x,), backends=["numpy", "torch"])     # doctest: +SKIP
    """
    report = compare(f, args, **kwargs)
    if report.verdict == INCONCLUSIVE:
        raise FiniteDifferencesInconclusive("finite differences inconclusive here (this does not say any "
                                            "derivative is wrong; check at another point)\n" + report.table())
    if not report.ok:
        raise AssertionError("backends do not agree\n" + report.table())
    return report
