"""``compare_implementations``: two (or more) implementations of one model, each in its own framework,
checked against each other and against finite differences -- and where they part.

Each implementation ``f`` is written natively for its framework (torch ops, ``jnp``, ``tf``, NumPy on
the tape, portable code) and takes the SAME arguments in one canonical layout (NumPy arrays given;
a port converts to its own layout inside ``f``, differentiably). For each implementation, by its own
engine, the machinery of :func:`unigrad.testing.compare` measures the value, a VJP with a random
cotangent ``u``, a JVP with a random tangent ``v`` (one seed: the same ``u`` and ``v`` for every
implementation), the Jacobian when small and, with ``order=2``, the JVP of the VJP (a Hessian-vector
product for a scalar output). Each implementation is checked against finite differences of itself
(the checks ``compare`` makes), then every pair is compared leaf by leaf: per output leaf (value,
JVP), per differentiated input leaf (VJP, JVP of VJP) and per Jacobian block, each named by its
pytree path (``fc1.weight``).

Tolerances in float32 come from the implementations themselves: each implementation also runs in
float64 (where its backend computes float64), and ``|q32 - q64|`` (largest over the leaf) is that
implementation's rounding error ``e`` for the quantity ``q``. By the triangle inequality
``|a32 - b32| <= e_a + e_b + |a64 - b64|``, so two correct implementations -- which agree in float64
-- differ in float32 by at most ``e_a + e_b``; the threshold is ``factor * (e_a + e_b)`` plus a floor
of a few float32 epsilons of the leaf's scale, and the float64 results are held to agree to
``float64`` (relative, default 1e-9) on their own. A porting bug moves the float64 results apart,
where rounding is nine orders of magnitude below anything a bug does.

Taps (:func:`tap`) mark intermediate values; inside a comparison they record the forward value and
the cotangent flowing back through them, so the report names the first tap whose forward value
differs and the last (in backward order) whose cotangent still agrees.
"""

from __future__ import annotations

import contextvars
import json
import math
from dataclasses import dataclass, field

import numpy as np
import optree

from .. import _api, _registry
from .._custom import backend_for, custom_vjp
from .._dtypes import INEXACT
from ._check_grads import FiniteDifferencesInconclusive
from ._compare import (AGREE, CONVENTION, DISAGREE, INCONCLUSIVE, NAMES, PAIRWISE_TOLERANCES, BackendResult,
                       _cell, _device_available, _ms, _num, _Problem, _Run, _tolerances, markdown_table, md_escape,
                       own_checks, text_table)

__all__ = ["compare_implementations", "assert_implementations_agree", "tap", "ImplementationComparison",
           "LeafResult", "TapResult", "IMPLEMENTATION_TOLERANCES"]

#: Defaults of ``compare_implementations``' ``tolerances``: ``factor`` times the two sides' estimated
#: rounding errors, plus ``floor_eps`` machine epsilons of the leaf's scale, bounds a float32 (or
#: lower precision) difference; float64 results must agree to ``float64`` relative to the leaf's scale.
IMPLEMENTATION_TOLERANCES = {"factor": 4.0, "floor_eps": 8.0, "float64": 1e-9}

# a leaf's scale, for thresholds, is at least this fraction of the largest leaf of the same quantity
# (a leaf whose exact value is 0 differs by rounding of its neighbours' size)
_SCALE_FLOOR = 1e-3

_LABELS = {"value": "value", "jvp": "JVP", "vjp": "gradient (VJP)", "jacobian": "Jacobian",
           "second": "JVP of VJP", "forward": "forward value", "cotangent": "cotangent"}
_SHORT = {"value": "value", "jvp": "JVP", "vjp": "VJP", "jacobian": "Jac", "second": "2nd"}


# ---------------------------------------------------------------------------------------------
# Taps
# ---------------------------------------------------------------------------------------------

_RECORDER: contextvars.ContextVar = contextvars.ContextVar("unigrad_tap_recorder", default=None)


class _Recorder:
    """What the taps of one implementation saw in one pass: forward values and cotangents by key."""

    def __init__(self):
        self.order: list = []            # keys, in execution order
        self.forward: dict = {}          # key -> NumPy array, or None when the value could not be read
        self.backward: dict = {}         # key -> NumPy array, or None
        self.backward_order: list = []   # keys, in the order the cotangents arrived
        self._counts: dict = {}

    def key(self, name):
        n = self._counts.get(name, 0)
        self._counts[name] = n + 1
        return name if n == 0 else f"{name}[{n}]"

    def forward_value(self, key, x):
        if key not in self.forward or self.forward[key] is None:
            self.forward[key] = _readable(x)

    def cotangent(self, key, g):
        if key not in self.backward:
            self.backward_order.append(key)
        self.backward[key] = _readable(g)

    def wrap(self, key, x):
        self.order.append(key)
        b = backend_for([x])
        if not b.is_array(x) or b.dtype(x) not in INEXACT:
            self.forward_value(key, x)
            return x
        self.forward_value(key, x)  # None here when x is a tracer: fwd below reads it then

        def fwd(v):
            self.forward_value(key, v)
            return v, None

        def bwd(_, g):
            self.cotangent(key, g)
            return (g,)
        identity = custom_vjp(_identity)
        identity.defvjp(fwd, bwd)
        return identity(x)


def _identity(x):
    return x


def _readable(x):
    """``x`` as a float64 (or complex128) NumPy copy, or None when it holds no value (a tracer)."""
    try:
        a = np.asarray(_api.to_numpy(x))
    except Exception:  # a traced value (JAX, TensorFlow graphs): recorded where it is concrete instead
        return None
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def tap(name: str, value):
    """Mark an intermediate value for :func:`compare_implementations`: returns ``value`` unchanged.

    Outside a comparison ``tap`` returns ``value`` itself (the same object: no operation, no cost). Inside
    one it records the forward value and, through an identity with a custom derivative rule, the
    cotangent that flows back through it; derivatives are unchanged (the rule passes the cotangent on
    as it is). Call it with the same name in each implementation at the same point (a layer's output,
    say); a name used again in one call (a loop) is recorded as ``name[1]``, ``name[2]``...; a pytree
    value is recorded leaf by leaf (``name.key``).

    Args:
      name: the tap's name in the report.
      value: an array of any backend, or a pytree of arrays.

    Returns:
      ``value``.

    Example:
      >>> x = np.ones(3)
      >>> unigrad.testing.tap("hidden", x) is x
      True
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"tap: name must be a non-empty str; got {name!r}")
    recorder = _RECORDER.get()
    if recorder is None:
        return value
    paths, leaves, treedef = optree.tree_flatten_with_path(value)
    out = [recorder.wrap(recorder.key(name + "".join(f".{p}" for p in path)), leaf)
           for path, leaf in zip(paths, leaves)]
    return optree.tree_unflatten(treedef, out)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

@dataclass
class LeafResult:
    """One quantity of one leaf compared between two implementations.

    ``error`` is ``max |a - b|`` over the leaf (in the compared dtype), ``scale`` ``max(|a|, |b|)``,
    ``relative`` their ratio; ``threshold`` what ``error`` may reach for rounding alone (``how`` says
    how it was chosen) and ``ratio = error / threshold``. ``rounding`` holds each side's estimated
    rounding error (``|q32 - q64|``) where it was measured; ``error64`` / ``tolerance64`` the float64
    difference and its tolerance when both sides ran in float64.
    """

    quantity: str        # "value", "jvp", "vjp", "jacobian", "second", "forward" (a tap), "cotangent" (a tap)
    leaf: str            # the output or input leaf's path ("fc1.weight"), "out -> in" for a Jacobian block, or a tap
    pair: tuple
    error: float
    scale: float
    threshold: float
    how: str
    rounding: tuple = (None, None)
    error64: float | None = None
    tolerance64: float | None = None
    status: str = "ok"   # "ok", "fail", "shape" (shapes differ), "missing" (not recorded on one side)
    message: str = ""

    @property
    def relative(self) -> float:
        return self.error / self.scale if self.scale > 0 else (0.0 if self.error == 0 else math.inf)

    @property
    def ratio(self) -> float:
        return self.error / self.threshold if self.threshold > 0 else (0.0 if self.error == 0 else math.inf)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        what = f"the {_LABELS[self.quantity]} of `{self.leaf}`" if self.quantity not in ("forward", "cotangent") \
            else f"the {_LABELS[self.quantity]} at tap `{self.leaf}`"
        if self.status in ("shape", "missing"):
            return f"{what}: {self.message} ({self.pair[0]} vs {self.pair[1]})"
        text = (f"{what} differs between {self.pair[0]} and {self.pair[1]} by {self.error:.2e} "
                f"(relative {self.relative:.1e}; threshold {self.threshold:.2e}, {self.ratio:.3g}x it)")
        if self.error64 is not None and self.tolerance64 is not None and self.error64 > self.tolerance64:
            text += f"; in float64 by {self.error64:.2e} (tolerance {self.tolerance64:.1e})"
        return text + (f": {self.message}" if self.message else "")


@dataclass
class TapResult:
    """One tap compared across implementations: its forward value and its cotangent."""

    name: str
    position: int                 # execution order (in the first implementation that recorded it)
    backward_position: int | None  # the order its cotangent arrived (None: no cotangent reached it)
    forward: list = field(default_factory=list)    # LeafResult per pair
    cotangent: list = field(default_factory=list)  # LeafResult per pair

    @property
    def forward_ok(self) -> bool:
        return all(r.status in ("ok", "missing") for r in self.forward)

    @property
    def cotangent_ok(self) -> bool:
        return all(r.status in ("ok", "missing") for r in self.cotangent)


@dataclass
class ImplementationResult:
    """One implementation: its label, backend and what was measured (a :class:`BackendResult` in the
    compared dtype, and one in float64 when it ran there to estimate rounding)."""

    label: str
    backend: str
    function: str
    result: BackendResult
    result64: BackendResult | None = None
    rounding: str = ""           # how its rounding errors were estimated
    taps: _Recorder | None = None
    taps64: _Recorder | None = None
    output_names: list = field(default_factory=list)  # the output leaves' paths

    @property
    def status(self):
        return self.result.status

    @property
    def verdict(self):
        return self.result.verdict


class ImplementationComparison:
    """The report of :func:`compare_implementations`.

    ``str(report)`` / ``report.table()`` is a terminal report, ``report.to_markdown()`` Markdown,
    ``report.to_dict()`` / ``report.to_json()`` the machine-readable form. ``report.verdict`` is
    ``"agree"``, ``"convention difference"``, ``"DISAGREE"``, ``"finite differences inconclusive"`` or
    ``"error"``; ``report.ok`` is true for the first two. ``report.leaves`` holds a :class:`LeafResult`
    per quantity, leaf and pair, ``report.differences`` the failing ones (largest relative difference
    first), ``report.taps`` a :class:`TapResult` per tap in execution order, with
    ``first_forward_difference``, ``last_agreeing_cotangent`` and ``first_cotangent_difference``.
    ``report.summary`` says it in one sentence.
    """

    def __init__(self, implementations, leaves, taps, dtype, argnums, seed, order, tolerances, threshold_note):
        self.implementations, self.leaves, self.taps = implementations, leaves, taps
        self.dtype, self.argnums, self.seed, self.order = dtype, argnums, seed, order
        self.tolerances, self.threshold_note = tolerances, threshold_note

    def __getitem__(self, label) -> ImplementationResult:
        for impl in self.implementations:
            if impl.label == label:
                return impl
        raise KeyError(f"no implementation {label!r}; have {[i.label for i in self.implementations]}")

    # ------------------------------------------------------------------ verdicts
    @property
    def differences(self) -> list:
        """The failing leaf comparisons (not taps): the parameters' gradients (VJP) first, then the outputs,
        second derivatives, JVPs and Jacobian blocks; within each, largest relative difference first (the
        buggy layer's parameters lead)."""
        return sorted((r for r in self.leaves if not r.ok), key=lambda r: (_PRIORITY[r.quantity], -_rank(r)))

    def leaf(self, name, quantity="vjp") -> list:
        """The :class:`LeafResult` of every pair for one leaf and quantity."""
        return [r for r in self.leaves if r.leaf == name and r.quantity == quantity]

    def _fd_reasons(self):
        return [f"{impl.label} {NAMES[c.quantity]}: {c.message}" for impl in self.implementations
                if impl.status == "ok" for c in impl.result.checks if c.status != "ok"]

    @property
    def verdict(self) -> str:
        if any(i.status == "error" for i in self.implementations) or \
                sum(i.status == "ok" for i in self.implementations) < 2:
            return "error"
        statuses = {c.status for i in self.implementations if i.status == "ok" for c in i.result.checks}
        if "fail" in statuses or self.differences or any(not t.forward_ok or not t.cotangent_ok for t in self.taps):
            return DISAGREE
        if "inconclusive" in statuses:
            return INCONCLUSIVE
        if "kink" in statuses:
            return CONVENTION
        return AGREE

    @property
    def ok(self) -> bool:
        return self.verdict in (AGREE, CONVENTION)

    @property
    def first_forward_difference(self) -> str | None:
        """The first tap (in execution order) whose forward value differs between implementations."""
        return next((t.name for t in self.taps if not t.forward_ok), None)

    def _backward_taps(self):
        return sorted((t for t in self.taps if t.backward_position is not None), key=lambda t: t.backward_position)

    @property
    def first_cotangent_difference(self) -> str | None:
        """The first tap, in backward order (from the outputs back), whose cotangent differs."""
        return next((t.name for t in self._backward_taps() if not t.cotangent_ok), None)

    @property
    def last_agreeing_cotangent(self) -> str | None:
        """The last tap, in backward order, whose cotangent still agrees (before the first that differs;
        the last tap of all when none differs)."""
        last = None
        for t in self._backward_taps():
            if not t.cotangent_ok:
                break
            last = t.name
        return last

    @property
    def reasons(self) -> list:
        # an implementation that ran can carry a note too (finite differences or taps it could not check)
        lines = [f"{i.label}: {i.result.message}" for i in self.implementations if i.result.message]
        lines += [r.describe() for r in self.differences]
        for name, kind in ((self.first_forward_difference, "forward"), (self.first_cotangent_difference, "cotangent")):
            if name is not None:
                t = next(t for t in self.taps if t.name == name)
                lines.append(max((r for r in getattr(t, kind) if not r.ok), key=lambda r: r.ratio).describe())
        lines += self._fd_reasons()
        return lines

    @property
    def summary(self) -> str:
        """One sentence: what differs, where the implementations part, and how well the rest agrees."""
        if self.verdict == "error":
            return "; ".join(f"{i.label}: {i.result.message}" for i in self.implementations if i.status != "ok") \
                or "fewer than two implementations ran"
        agreeing = [r for r in self.leaves if r.ok and r.scale > 0]
        rest = max((r.relative for r in agreeing), default=0.0)
        parts = []
        diffs = self.differences
        if diffs:
            worst = diffs[0]
            parts.append(f"the {_LABELS[worst.quantity]} of `{worst.leaf}` differs by {worst.relative:.1e} "
                         f"(relative, {worst.pair[0]} vs {worst.pair[1]})")
            others = sorted({f"{_SHORT[r.quantity]} `{r.leaf}`" for r in diffs[1:]})
            if others:
                parts.append(f"{len(others)} more differ ({', '.join(others[:6])}{', ...' if len(others) > 6 else ''})")
        fd = self._fd_reasons()
        if fd:
            parts.append(f"against finite differences: {fd[0]}" + (f" (and {len(fd) - 1} more)" if len(fd) > 1 else ""))
        if self.first_forward_difference is not None:
            parts.append(f"forward values first differ at tap `{self.first_forward_difference}`")
        if self.first_cotangent_difference is not None:
            where = self.last_agreeing_cotangent
            parts.append(f"cotangents first differ at tap `{self.first_cotangent_difference}`"
                         + (f" (they still agree at `{where}`)" if where else ""))
        if not parts:
            return f"everything agrees (largest relative difference {rest:.1e}, within the thresholds)"
        return "; ".join(parts) + f"; everything else agrees to {rest:.1e}"

    # ------------------------------------------------------------------ rendering
    def _title(self):
        labels = " vs ".join(f"{i.label} ({i.backend})" for i in self.implementations)
        return (f"unigrad compare_implementations: {labels}  (argnums {self.argnums}, {self.dtype}, seed "
                f"{self.seed}, order {self.order})")

    def _legend(self):
        return ("fd columns: each implementation against finite differences of itself (in float64 where it "
                "ran there; ! = fails); error = max|a-b| over the leaf, relative = error / max(|a|,|b|), "
                "err/thr = error / threshold (ok up to 1), float64 = the float64 runs' difference")

    def _impl_rows(self):
        cols = [("jvp", "fd"), ("vjp", "fd"), ("transpose", "self")]
        if any(i.result.jacobian is not None for i in self.implementations):
            cols.append(("jacobian", "fd"))
        if self.order >= 2:
            cols.append(("second", "fd"))
        timed = [q for q in ("value", "jvp", "vjp", "jacobian", "second")
                 if any(q in i.result.first_times for i in self.implementations)]
        steady = any(i.result.times for i in self.implementations)
        names = "/".join(_SHORT[q] for q in timed)
        header = ["implementation", "backend", "rounding estimate"] + [
            f"{_SHORT.get(q, q)} {a}" if q != "transpose" else "transpose" for q, a in cols] + [
            f"ms {'steady' if steady else 'first'} {names}", "vs itself"]
        rows = []
        for i in self.implementations:
            r = i.result
            cells = [_cell(r.check(q, a)) if r.status == "ok" else "" for q, a in cols]
            times = r.times if steady else r.first_times
            ms = "/".join(_ms(times.get(q)) for q in timed) if r.status == "ok" else ""
            rows.append([i.label, i.backend, i.rounding] + cells + [ms, r.verdict if r.status == "ok" else
                                                                    r.message[:60]])
        return header, rows

    def _leaf_rows(self):
        """One row per (quantity, leaf): its worst pair."""
        worst = {}
        for r in self.leaves:
            k = (r.quantity, r.leaf)
            if k not in worst or _rank(r) > _rank(worst[k]) or (r.ok == worst[k].ok and r.ratio > worst[k].ratio):
                worst[k] = r
        header = ["quantity", "leaf", "worst pair", "error", "relative", "threshold", "err/thr", "float64", "status"]
        rows = []
        for r in worst.values():
            rows.append([_SHORT.get(r.quantity, r.quantity), r.leaf, f"{r.pair[0]}/{r.pair[1]}", _e(r.error),
                         _e(r.relative), _e(r.threshold), f"{r.ratio:.2g}",
                         "-" if r.error64 is None else _e(r.error64), _status(r)])
        return header, rows

    def _tap_rows(self):
        header = ["#", "tap", "forward err/thr", "forward", "backward #", "cotangent err/thr", "cotangent"]
        rows = []
        for t in self.taps:
            fw = max(t.forward, key=lambda r: r.ratio, default=None)
            ct = max(t.cotangent, key=lambda r: r.ratio, default=None)
            rows.append([t.position, t.name, "-" if fw is None else f"{fw.ratio:.2g}",
                         "-" if fw is None else ("ok" if t.forward_ok else "DIFFERS"),
                         "-" if t.backward_position is None else t.backward_position,
                         "-" if ct is None else f"{ct.ratio:.2g}",
                         "-" if ct is None else ("ok" if t.cotangent_ok else "DIFFERS")])
        return header, rows

    def _tap_lines(self):
        if not self.taps:
            return []
        lines = [f"first forward difference: {_tick(self.first_forward_difference)}",
                 f"cotangents, from the outputs back: agree down to {_tick(self.last_agreeing_cotangent)}, "
                 f"first differ at {_tick(self.first_cotangent_difference)}"]
        return lines

    def table(self) -> str:
        """The report as plain text for a terminal."""
        lines = [self._title(), f"thresholds: {self.threshold_note}", self._legend(), ""]
        lines += text_table(*self._impl_rows()) + [""]
        lines += text_table(*self._leaf_rows())
        if self.taps:
            lines += ["", "taps (execution order):"] + text_table(*self._tap_rows()) + self._tap_lines()
        lines += ["", f"overall: {self.verdict}: {self.summary}"]
        lines += ["  " + r for r in self.reasons]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The report as Markdown tables, with the verdict and reasons below them."""
        lines = [f"**{self._title()}**", "", f"Thresholds: {self.threshold_note}. {self._legend()}.", ""]
        lines += markdown_table(*self._impl_rows()) + [""] + markdown_table(*self._leaf_rows())
        if self.taps:
            lines += ["", "Taps, in execution order:", ""] + markdown_table(*self._tap_rows())
            lines += [""] + [f"- {md_escape(x)}" for x in self._tap_lines()]
        lines += ["", f"Overall: **{self.verdict}**: {md_escape(self.summary)}."]
        if self.reasons:
            lines += [""] + [f"- {md_escape(r)}" for r in self.reasons]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """A JSON-compatible dict (non-finite numbers become strings)."""
        def leaf(r):
            return {"quantity": r.quantity, "leaf": r.leaf, "pair": list(r.pair), "error": _num(r.error),
                    "scale": _num(r.scale), "relative": _num(r.relative), "threshold": _num(r.threshold),
                    "ratio": _num(r.ratio), "how": r.how, "rounding": [_num(x) for x in r.rounding],
                    "error64": _num(r.error64), "tolerance64": _num(r.tolerance64), "status": r.status,
                    "message": r.message or None}
        impls = [{"label": i.label, "backend": i.backend, "function": i.function, "status": i.status,
                  "message": i.result.message or None, "verdict": i.verdict, "rounding": i.rounding,
                  "checks": [{"quantity": c.quantity, "against": c.against, "error": _num(c.error),
                              "tolerance": c.tolerance, "status": c.status, "message": c.message or None}
                             for c in i.result.checks]} for i in self.implementations]
        taps = [{"name": t.name, "position": t.position, "backward_position": t.backward_position,
                 "forward_ok": t.forward_ok, "cotangent_ok": t.cotangent_ok,
                 "forward": [leaf(r) for r in t.forward], "cotangent": [leaf(r) for r in t.cotangent]}
                for t in self.taps]
        return {"dtype": self.dtype, "argnums": list(self.argnums), "seed": self.seed, "order": self.order,
                "tolerances": self.tolerances, "thresholds": self.threshold_note, "verdict": self.verdict,
                "ok": self.ok, "summary": self.summary, "implementations": impls,
                "leaves": [leaf(r) for r in self.leaves], "taps": taps,
                "first_forward_difference": self.first_forward_difference,
                "last_agreeing_cotangent": self.last_agreeing_cotangent,
                "first_cotangent_difference": self.first_cotangent_difference, "reasons": self.reasons}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self):
        return self.table()

    def __repr__(self):
        return self.table()


_PRIORITY = {"vjp": 0, "value": 1, "second": 2, "jvp": 3, "jacobian": 4}


def _rank(r: LeafResult) -> float:
    """Failing results rank by relative difference (the buggy layer's parameters first)."""
    rel = r.relative
    return (math.inf if r.status in ("shape",) else rel) if not r.ok else -1.0


def _e(x):
    return "0" if x == 0 else ("inf" if not math.isfinite(x) else f"{x:.1e}")


def _status(r):
    return {"ok": "ok", "fail": "DIFFERS", "shape": "SHAPE", "missing": "missing"}[r.status]


def _tick(name):
    return "-" if name is None else f"`{name}`"


# ---------------------------------------------------------------------------------------------
# Comparing two arrays
# ---------------------------------------------------------------------------------------------

def _max_abs_diff(a, b) -> float:
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    d = np.where(np.isnan(a) & np.isnan(b), 0.0, d)
    d = np.where(np.isnan(d), np.inf, d)
    return float(np.max(d)) if d.size else 0.0


def _max_abs(*xs) -> float:
    m = 0.0
    for x in xs:
        if x is not None and x.size:
            x = np.abs(x)
            x = x[np.isfinite(x)]
            if x.size:
                m = max(m, float(np.max(x)))
    return m


class _Judge:
    """How two implementations' arrays are held to each other (the thresholds' one definition)."""

    def __init__(self, dtype: str, tol: dict):
        self.dtype, self.tol = dtype, tol
        self.eps = float(np.finfo(np.dtype(dtype if dtype != "bfloat16" else "float32")).eps) * (
            2 ** 16 if dtype == "bfloat16" else 1)
        self.low = dtype not in ("float64", "complex128")

    def __call__(self, quantity, leaf, pair, a, b, a64=None, b64=None, qscale=0.0, qscale64=0.0) -> LeafResult:
        if a is None or b is None:
            side = pair[0] if a is None else pair[1]
            return LeafResult(quantity, leaf, pair, 0.0, 0.0, 0.0, "", status="missing",
                              message=f"no value recorded by {side}")
        if a.shape != b.shape:
            return LeafResult(quantity, leaf, pair, math.inf, 0.0, 0.0, "", status="shape",
                              message=f"shapes differ: {a.shape} vs {b.shape}")
        t = self.tol
        err, scale = _max_abs_diff(a, b), _max_abs(a, b)
        floor_scale = max(scale, _SCALE_FLOOR * qscale)
        rounding, err64, tol64 = (None, None), None, None
        if "pairwise" in t:
            threshold = t["pairwise"] * floor_scale
            how = f"fixed: {t['pairwise']:g} x scale (tolerances['pairwise'])"
        elif not self.low:
            threshold = t["float64"] * floor_scale
            how = f"float64: {t['float64']:g} x scale"
        elif a64 is not None and b64 is not None and a64.shape == a.shape and b64.shape == b.shape:
            e_a, e_b = _max_abs_diff(a, a64), _max_abs_diff(b, b64)
            rounding = (e_a, e_b)
            threshold = t["factor"] * (e_a + e_b) + t["floor_eps"] * self.eps * floor_scale
            how = "estimated"
            err64 = _max_abs_diff(a64, b64)
            tol64 = t["float64"] * max(_max_abs(a64, b64), _SCALE_FLOOR * qscale64)
        else:
            threshold = PAIRWISE_TOLERANCES.get(self.dtype, 1e-4) * floor_scale
            how = f"fixed: {PAIRWISE_TOLERANCES.get(self.dtype, 1e-4):g} x scale (no float64 run on both sides)"
        bad = err > threshold or (err64 is not None and err64 > tol64)
        if err == 0 and (err64 is None or err64 <= tol64):
            bad = False
        return LeafResult(quantity, leaf, pair, err, scale, threshold, how, rounding, err64, tol64,
                          "fail" if bad else "ok")


# ---------------------------------------------------------------------------------------------
# Running the implementations
# ---------------------------------------------------------------------------------------------

def _parse(impls):
    if not isinstance(impls, dict):
        raise TypeError(f"compare_implementations: impls must be a dict mapping a label to (backend, f) or a "
                        f"backend name to f; got {type(impls).__name__}")
    if len(impls) < 2:
        raise ValueError(f"compare_implementations: impls needs at least two implementations; got {len(impls)}")
    out = []
    for label, spec in impls.items():
        if not isinstance(label, str):
            raise TypeError(f"compare_implementations: impls' keys must be str labels; got {label!r}")
        if callable(spec):
            backend, f = label, spec
        elif isinstance(spec, (tuple, list)) and len(spec) == 2 and callable(spec[1]):
            backend, f = spec
        else:
            raise TypeError(f"compare_implementations: impls[{label!r}] must be a function (the key names its "
                            f"backend) or a pair (backend, function); got {type(spec).__name__}")
        out.append((label, backend, f))
    return out


def _path_names(args, argnums):
    """Dotted pytree paths of the differentiated leaves (``fc1.weight``); ``argument i`` prefixes them
    when several arguments are differentiated (a bare array argument is ``argument i``)."""
    names = []
    for i in argnums:
        paths, _, _ = optree.tree_flatten_with_path(args[i])
        for path in paths:
            inner = ".".join(str(p) for p in path)
            if len(argnums) == 1 and inner:
                names.append(inner)
            else:
                names.append(f"argument {i}" + (f".{inner}" if inner else ""))
    return names


def _output_names(f, problem, run):
    """Dotted paths of f's output leaves (``logits``, ``0``...), or ``output k``."""
    try:
        token = _registry.active_backend.set(run.b)
        try:
            args_b = tuple(optree.tree_map(run.convert, a) for a in problem.args)
            out = f(*args_b)
        finally:
            _registry.active_backend.reset(token)
        paths, _, _ = optree.tree_flatten_with_path(out)
        names = [".".join(str(p) for p in path) for path in paths]
        if len(names) == 1 and not names[0]:
            return ["output"]
        return [n or f"output {k}" for k, n in enumerate(names)]
    except Exception:  # names are decoration; the runs report real errors
        return None


def _function_name(f):
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__


def _record_taps(run) -> _Recorder | None:
    """One VJP of ``run``'s function with the random cotangent, taps recording."""
    r, b = run.result, run.b
    if r.status != "ok":
        return None
    recorder = _Recorder()
    cts_b = tuple(b.asarray(c, dtype=d, device=run.device) for c, d in zip(run.cotangents, r.dtypes["value"]))
    token = _RECORDER.set(recorder)
    try:
        _, pullback = _api.vjp(run.g, *run.diff_b, backend=b)
        pullback(cts_b)
    except Exception as exc:  # the measured quantities stand; the taps are reported missing
        r.message = (r.message + "; " if r.message else "") + f"recording the taps raised {type(exc).__name__}: {exc}"
    finally:
        _RECORDER.reset(token)
    return recorder


def _run(label, backend, f, args, argnums, dtype, seed, jacobian, order, repeats, device, names):
    problem = _Problem(f, args, argnums, dtype, seed)
    problem.names = names
    try:
        b = _registry.get_backend(backend)
    except Exception as exc:
        name = backend if isinstance(backend, str) else getattr(backend, "name", str(backend))
        r = BackendResult(backend=name, device=device, label=label, status="error",
                          message=f"could not load the backend {name!r}: {type(exc).__name__}: {exc}",
                          verdict=f"error: {type(exc).__name__} loading the backend")
        return problem, None, r
    run = _Run(problem, b, device, label, jacobian, order, repeats)
    if not _device_available(b, device):
        run.result.status, run.result.message = "error", f"no device {device!r} (has {', '.join(b.devices())})"
        run.result.verdict = "error: no such device"
        return problem, run, run.result
    if any(d in ("float64", "complex128") for d in problem.leaf_dtypes) and not b.capabilities.float64:
        run.result.status = "error"
        run.result.message = "computes no float64: compare at float32 (dtype='float32')"
        run.result.verdict = "error: no float64"
        return problem, run, run.result
    run.run()
    return problem, run, run.result


def compare_implementations(impls: dict, args, *, argnums=0, dtype: str | None = None, order: int = 1,
                            seed: int = 0, tolerances: dict | None = None, repeats: int = 0, jacobian="auto",
                            device: str = "cpu", estimate_rounding: bool = True,
                            finite_differences: bool = True) -> ImplementationComparison:
    """Compare implementations of one function written in different frameworks: values and
    derivatives, leaf by leaf, against each other and against finite differences.

    Each implementation runs on its own engine: unigrad converts ``args`` to its backend's arrays and
    computes the value, a VJP (one random cotangent, the same for all), a JVP (one random tangent),
    the Jacobian when small and, with ``order=2``, the JVP of the VJP (a Hessian-vector product where
    the output is a scalar). Every pair is compared per output leaf, per differentiated input leaf and
    per Jacobian block; each implementation is checked against finite differences of itself. Values
    marked with :func:`tap` inside the implementations are compared too, forward and backward.

    In float32 (or lower), each implementation also runs in float64 where its backend can, and
    ``|q32 - q64|`` estimates its rounding error in each quantity ``q``, leaf by leaf: two sides
    may differ by ``factor`` (default 4) times the sum of their estimated rounding errors plus
    ``floor_eps`` (default 8) epsilons of the leaf's scale, and their float64 results must agree to
    ``float64`` (default 1e-9) relative. Without a float64 run on both sides the threshold is
    :data:`PAIRWISE_TOLERANCES` relative to the leaf's scale; in float64, ``float64`` relative. The
    report says which.

    Args:
      impls: ``{label: (backend, f)}`` or ``{backend: f}``; each ``f`` written for its framework,
        taking the arguments in ``args``' layout (a port converts to its own layout inside ``f``).
      args: the tuple of arguments (pytrees of NumPy arrays, or any backend's arrays), the same for all.
      argnums: int or tuple of ints: the differentiated arguments (default 0: the parameters first).
      dtype: cast every floating argument to this dtype (None keeps the arguments' dtypes).
      order: 2 also compares the JVP of the VJP.
      seed: seeds the random tangent and cotangent.
      tolerances: overrides: ``factor``, ``floor_eps``, ``float64`` (see above), ``pairwise`` (a fixed
        threshold relative to each leaf's scale, in place of the rounding estimate), and ``fd`` /
        ``transpose`` for the finite-difference checks (as :func:`compare`'s).
      repeats: time each quantity this many more times after the first call (0: the first call only).
      jacobian: ``"auto"`` (when inputs x outputs <= 4096 elements), True or False.
      device: the device every implementation runs on.
      estimate_rounding: run in float64 to estimate rounding (default); False holds float32 results
        to :data:`PAIRWISE_TOLERANCES`.
      finite_differences: check each implementation against finite differences of itself (default).

    Returns:
      An :class:`ImplementationComparison`: ``print(report)``, ``report.ok``, ``report.summary``.

    Example:
      >>> def ref(p, x):
      ...     return unigrad.namespace(x).tanh(x @ p["w"])
      >>> def port(p, x):                  # the same on the tape, written differently
      ...     return unigrad.namespace(x).tanh((p["w"].T @ x.T).T)
      >>> rng = np.random.default_rng(0)
      >>> p, x = {"w": rng.standard_normal((3, 2))}, rng.standard_normal((4, 3))
      >>> report = unigrad.testing.compare_implementations({"ref": ("numpy", ref), "port": ("numpy", port)},
      ...                                                  (p, x))
      >>> report.ok
      True
    """
    if not isinstance(order, int) or order not in (1, 2):
        raise ValueError(f"compare_implementations: order must be 1 or 2; got {order!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 0:
        raise ValueError(f"compare_implementations: repeats must be an int >= 0; got {repeats!r}")
    if jacobian not in ("auto", True, False):
        raise ValueError(f"compare_implementations: jacobian must be 'auto', True or False; got {jacobian!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"compare_implementations: args must be a tuple of arguments; got {type(args).__name__}")
    tol = dict(IMPLEMENTATION_TOLERANCES)
    fd_overrides = {}
    if tolerances:
        unknown = set(tolerances) - {"factor", "floor_eps", "float64", "pairwise", "fd", "transpose"}
        if unknown:
            raise ValueError(f"compare_implementations: tolerances keys must be among 'factor', 'floor_eps', "
                             f"'float64', 'pairwise', 'fd', 'transpose'; got {sorted(unknown)}")
        fd_overrides = {k: v for k, v in tolerances.items() if k in ("fd", "transpose")}
        tol.update({k: v for k, v in tolerances.items() if k not in ("fd", "transpose")})
    specs = _parse(impls)
    args = tuple(args)
    _, argnums_t, _ = _api._normalize_argnums(argnums, len(args), "compare_implementations")
    names = _path_names(args, argnums_t)

    implementations, runs = [], []
    for label, backend, f in specs:
        problem, run, r = _run(label, backend, f, args, argnums_t, dtype, seed, jacobian, order, repeats, device,
                               names)
        impl = ImplementationResult(label, r.backend, _function_name(f), r)
        implementations.append(impl)
        runs.append((problem, run))
    ok = [(impl, p, run) for impl, (p, run) in zip(implementations, runs) if impl.status == "ok"]
    compared = next((impl.result.dtypes["value"] for impl, _, _ in ok), None)
    leaf_dtypes = ok[0][1].leaf_dtypes if ok else []
    dtypes = [d for d in list(leaf_dtypes) + list(compared or []) if d in PAIRWISE_TOLERANCES]
    worst = max(dtypes, key=lambda d: PAIRWISE_TOLERANCES[d]) if dtypes else "float64"
    judge = _Judge(worst, tol)

    # rounding: the same implementations in float64
    runs64, computes_low = {}, {}
    for impl, problem, run in ok:
        impl.taps = _record_taps(run)
        if not judge.low or "pairwise" in tol:
            impl.rounding = "not needed (float64)" if not judge.low else "not used (tolerances['pairwise'])"
            continue
        if not estimate_rounding or not run.b.capabilities.float64:
            impl.rounding = "none: no float64" if estimate_rounding else "off"
            continue
        # the arguments as the compared run got them (already rounded to the compared dtype), in float64
        _, run64, r64 = _run(impl.label, run.b, problem.f, problem.args, argnums_t, "float64", seed, jacobian,
                             order, 0, device, names)
        # a port that computes in float32 whatever its inputs (a Flax module's dtype, a Keras layer's policy)
        # returns float32 from its "float64" run: no measure of its rounding, and no float64 reference
        low64 = sorted({d for q in ("value", "jvp") for d in r64.dtypes.get(q, [])
                        if d in PAIRWISE_TOLERANCES and d not in ("float64", "complex128")})
        if r64.status == "ok" and not low64:
            impl.result64, runs64[impl.label] = r64, run64
            impl.taps64 = _record_taps(run64)
            impl.rounding = "float64 run"
        elif r64.status == "ok":
            impl.rounding = f"none: given float64 inputs, it computed its outputs in {', '.join(low64)}"
            computes_low[impl.label] = ", ".join(low64)
        else:
            impl.rounding = f"none: the float64 run failed ({r64.message.splitlines()[0] if r64.message else ''})"

    # each against finite differences of itself
    for impl, problem, run in ok:
        out_names = _output_names(problem.f, problem, run) or [f"output {k}" for k in range(len(run.result.outputs))]
        impl.output_names = out_names
        if finite_differences and impl.label in computes_low:
            # finite differences step in float64 and would read its float32 rounding as derivatives
            run.result.message = (run.result.message + "; " if run.result.message else "") + (
                f"not checked against finite differences: it computes in {computes_low[impl.label]} whatever "
                f"its inputs' dtype")
        elif finite_differences:
            # in float64 where it ran there: every argument in float64 (a port may refuse mixed dtypes),
            # and the tighter tolerances show more
            fd_run = runs64.get(impl.label, run)
            t = _tolerances(fd_run.p, [fd_run.result], fd_overrides, impl.label)
            try:
                run.result.checks += own_checks(fd_run, fd_run.p, t, lambda k, n=out_names: _at(n, k, "output"),
                                                lambda k: _at(names, k, "input"))
            except Exception as exc:  # f cannot be evaluated where finite differences need it (a port refusing
                # the float64 points a float32 run's perturbations make): the comparisons stand, the checks not
                run.result.message = (run.result.message + "; " if run.result.message else "") + (
                    f"not checked against finite differences: evaluating f there raised {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")
        statuses = {c.status for c in run.result.checks}
        run.result.verdict = (DISAGREE if "fail" in statuses else INCONCLUSIVE if "inconclusive" in statuses
                              else CONVENTION if "kink" in statuses else AGREE)

    leaves, taps = _pairs(ok, judge, names)
    how = _threshold_note(judge, tol, implementations)
    dtype_name = dtype or worst
    return ImplementationComparison(implementations, leaves, taps, dtype_name, argnums_t, seed, order,
                                    {**tol, **fd_overrides}, how)


def _at(names, k, what):
    return names[k] if k is not None and k < len(names) else f"{what} {k}"


def _threshold_note(judge, tol, implementations):
    if "pairwise" in tol:
        return f"fixed by tolerances['pairwise']: {tol['pairwise']:g} x each leaf's scale"
    if not judge.low:
        return f"float64: differences up to {tol['float64']:g} x each leaf's scale"
    note = (f"{judge.dtype}: a difference may reach {tol['factor']:g} x (|{judge.dtype} - float64| of side A + "
            f"of side B) + {tol['floor_eps']:g} eps x the leaf's scale -- each implementation's rounding error "
            f"estimated by running it in float64 too; float64 results must agree to {tol['float64']:g} x scale")
    missing = [i.label for i in implementations if i.status == "ok" and i.result64 is None]
    if missing:
        note += (f"; without a float64 run ({', '.join(missing)}): "
                 f"{PAIRWISE_TOLERANCES.get(judge.dtype, 1e-4):g} x scale")
    return note


def _leaf_arrays(result, quantity):
    """The arrays of one quantity of one result, one per leaf (Jacobian blocks row by row), or None."""
    if result is None:
        return None
    if quantity == "value":
        return result.outputs
    if quantity == "jacobian":
        return None if result.jacobian is None else [block for row in result.jacobian for block in row]
    return getattr(result, quantity)


def _as64(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def _pairs(ok, judge, in_names):
    leaves = []
    for i, (ia, _, _) in enumerate(ok):
        for ib, _, _ in ok[i + 1:]:
            pair = (ia.label, ib.label)
            out_names = ia.output_names
            for q in ("value", "jvp", "vjp", "jacobian", "second"):
                qa, qb = _leaf_arrays(ia.result, q), _leaf_arrays(ib.result, q)
                if qa is None or qb is None:
                    continue
                if len(qa) != len(qb):
                    leaves.append(LeafResult(q, "(all)", pair, math.inf, 0.0, 0.0, "", status="shape",
                                             message=f"{len(qa)} vs {len(qb)} leaves"))
                    continue
                qa64, qb64 = _leaf_arrays(ia.result64, q), _leaf_arrays(ib.result64, q)
                a = [_as64(x) for x in qa]
                b = [_as64(x) for x in qb]
                a64 = [_as64(x) for x in qa64] if qa64 is not None and len(qa64) == len(a) else [None] * len(a)
                b64 = [_as64(x) for x in qb64] if qb64 is not None and len(qb64) == len(b) else [None] * len(b)
                qscale = _max_abs(*a, *b)
                qscale64 = _max_abs(*a64, *b64)
                for k in range(len(a)):
                    if q in ("value", "jvp"):
                        name = _at(out_names, k, "output")
                    elif q == "jacobian":
                        n = len(in_names)
                        name = f"{_at(out_names, k // n, 'output')} -> {in_names[k % n]}"
                    else:
                        name = _at(in_names, k, "input")
                    leaves.append(judge(q, name, pair, a[k], b[k], a64[k], b64[k], qscale, qscale64))
    return leaves, _tap_results(ok, judge)


def _tap_results(ok, judge):
    order, backward = [], []
    for impl, _, _ in ok:
        rec = impl.taps
        if rec is None:
            continue
        order += [k for k in rec.order if k not in order]
        backward += [k for k in rec.backward_order if k not in backward]
    taps = []
    for pos, key in enumerate(order):
        t = TapResult(key, pos, backward.index(key) if key in backward else None)
        for i, (ia, _, _) in enumerate(ok):
            for ib, _, _ in ok[i + 1:]:
                pair = (ia.label, ib.label)
                for what, bucket in (("forward", t.forward), ("cotangent", t.cotangent)):
                    def get(impl, rec):
                        d = None if rec is None else (rec.forward if what == "forward" else rec.backward)
                        return None if d is None else d.get(key)
                    a, b = get(ia, ia.taps), get(ib, ib.taps)
                    a64, b64 = get(ia, ia.taps64), get(ib, ib.taps64)
                    if what == "cotangent":
                        if a is None and b is None:
                            continue  # no cotangent reached this tap on either side (not differentiated)
                        # no cotangent reached it on one side (a stop_gradient below): a zero cotangent
                        missing = [impl.label for impl, x in ((ia, a), (ib, b)) if x is None]
                        a, b, a64, b64 = _zero_for_missing(a, b, a64, b64, ia, ib, key)
                    else:
                        missing = []
                    r = judge(what, key, pair, a, b, a64, b64, _max_abs(a, b), _max_abs(a64, b64))
                    if missing and r.status == "fail":
                        r.message = (f"no cotangent reached it in {missing[0]}: its value there depends on no "
                                     f"differentiated input (a stop_gradient / detach before it?)")
                    bucket.append(r)
        taps.append(t)
    return taps


def _zero_for_missing(a, b, a64, b64, ia, ib, key):
    """Cotangents at a tap that no cotangent reached on one side are zeros: the same shape as the tap's
    forward value there."""
    def zero(impl, rec):
        x = None if rec is None else rec.forward.get(key)
        return None if x is None else np.zeros_like(x)
    if a is None and key in (ia.taps.order if ia.taps else ()):
        a, a64 = zero(ia, ia.taps), zero(ia, ia.taps64) if ia.taps64 is not None else None
    if b is None and key in (ib.taps.order if ib.taps else ()):
        b, b64 = zero(ib, ib.taps), zero(ib, ib.taps64) if ib.taps64 is not None else None
    return a, b, a64, b64


def assert_implementations_agree(impls: dict, args, **kwargs) -> ImplementationComparison:
    """:func:`compare_implementations`, raising AssertionError unless the implementations agree (the
    message: the summary -- which leaf differs, at which tap they part -- then the report). Returns the
    report otherwise. Where finite differences cannot decide and nothing differs, raises
    :class:`FiniteDifferencesInconclusive`, which is not an AssertionError.

    Example:
      >>> def ref(x):
      ...     return unigrad.namespace(x).sin(x)
      >>> def port(x):
      ...     return unigrad.namespace(x).cos(x - np.pi / 2)
      >>> _ = unigrad.testing.assert_implementations_agree({"ref": ("numpy", ref), "port": ("numpy", port)},
      ...                                                  (np.linspace(0, 1, 4),))
    """
    report = compare_implementations(impls, args, **kwargs)
    if report.verdict == INCONCLUSIVE:
        raise FiniteDifferencesInconclusive("finite differences inconclusive here (this does not say any "
                                            "derivative is wrong; check at another point)\n" + report.table())
    if not report.ok:
        raise AssertionError(f"implementations do not agree: {report.summary}\n\n{report.table()}")
    return report
