"""A traced program in one normal form, from the tape's recording of a call or from a jaxpr.

A :class:`Program` is its inputs (value ids and shapes), its nodes in execution order and its outputs.
A :class:`Node` is one primitive applied: its name (the key of the rule table), ``fn`` (the operation on
NumPy arrays, which the structural rules apply to integer index arrays), every positional argument's
value (constants as they are, traced ones as arrays or shells with a ``shape``), which positions are
traced values (their ids) and carry a derivative, its parameters, its output ids and shapes, and where
in the user's code it was recorded when that is known.

The tape's own recording (``_core.record``) keeps only differentiable operations; for sparsity
detection :func:`trace_tape` records every operation (comparisons and other results without a
derivative too) under a trace of its own, and notes control flow on traced values (``bool(x)``) and
values read as constants (an index computed from the input), which make a code-level pattern widen.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../unigrad


@dataclass
class Node:
    name: str
    fn: object  # callable(*args, **params) on NumPy arrays, or None
    args: list  # every positional argument: constants, or (for traced positions) a value with .shape
    traced: dict  # position -> value id, for traced positions that carry a derivative
    params: dict
    outs: list  # value ids
    out_shapes: list
    site: str | None = None  # "file:line" of the user's code that recorded it
    inner: object = None  # sub-programs (a jaxpr cond's branches)
    prim: object = None
    data: frozenset = frozenset()  # positions that are data (not indices): what a derivative flows through
    extra_positions: tuple = ()  # a call's operand positions, in the order of its sub-programs' inputs
    index: dict = field(default_factory=dict)  # position -> value id, for traced operands that carry no
    # derivative (an index, a predicate): what the value, not the derivative, depends on (jaxprs)
    targets: object = None  # a scatter's front-end: () -> (anywhere, surely), where each update element lands
    # (arrays of the updates' shape, 1 + the flat index of the operand element, 0: dropped; ``anywhere`` one
    # row per way the index mode may place it, ``surely`` the elements certainly written or None), or None
    # when the indices are computed from the input

    def shape(self, pos):
        return tuple(np.shape(self.args[pos])) if not hasattr(self.args[pos], "shape") else tuple(
            self.args[pos].shape)


class Aval:
    """A value a front-end knows only by its shape and dtype: an argument of a :class:`Node` that depends on
    the inputs, or a constant whose value must not be read. (The rules look for the name ``Aval``.)"""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


@dataclass
class Program:
    inputs: list  # value ids
    input_shapes: list
    nodes: list
    outputs: list  # value id, or None for an output that is not traced (a constant)
    output_shapes: list
    reasons: list = field(default_factory=list)  # why a code-level pattern must widen (trace_tape)


def user_site(skip_internal=True):
    """``file:line`` of the innermost frame outside unigrad (and NumPy/JAX), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not (fname.startswith(_PACKAGE) or "site-packages" in fname or "<frozen" in fname
                or fname.startswith(os.path.dirname(np.__file__))):
            return f"{os.path.basename(fname)}:{frame.f_lineno} (in {frame.f_code.co_name})"
        frame = frame.f_back
    return None


# --------------------------------------------------------------------------------------- the tape

def from_tape(trace, n_inputs, out_indices, input_values, out_values=()):
    """The program of a tape recording (``_core.record``'s trace): entries ``(prim, parents, vals, ans,
    params)`` in execution order, the first ``n_inputs`` being the inputs."""
    nodes = []
    tape = trace.tape
    for idx in range(n_inputs, len(tape)):
        entry = tape[idx]
        if entry is None:
            continue
        prim, parents, vals, ans, params = entry
        vjps = prim.vjps
        data = _data_positions(prim, len(vals))
        traced = {i: j for i, j in parents if i in data}
        nodes.append(Node(prim.name, getattr(prim, "impl", None), list(vals), traced, dict(params), [idx], [tuple(np.shape(ans))
                          if not hasattr(ans, "shape") else tuple(ans.shape)], prim=prim, data=data))
    return Program(list(range(n_inputs)), [tuple(np.shape(v)) if not hasattr(v, "shape") else tuple(v.shape)
                                           for v in input_values], nodes, list(out_indices),
                   [tuple(np.shape(o)) if not hasattr(o, "shape") else tuple(o.shape) for o in out_values])


def _data_positions(prim, n):
    vjps = prim.vjps
    if vjps is None:
        return frozenset()
    if not isinstance(vjps, (tuple, list)):  # rules made per node (a checkpointed block): every input is data
        return frozenset(range(n))
    return frozenset(i for i in range(min(n, len(vjps))) if vjps[i] is not None)


def trace_tape(f, args, sites=False):
    """Run ``f(*args)`` on the NumPy tape under a detection trace: every operation recorded (a result
    without a derivative is traced too, so its later use is seen). Returns ``(program, outputs)``."""
    from ..tape._core import _run_traced
    trace = _DetectTrace(sites)
    n = len(args)
    inputs = [_DTracer(trace, np.asarray(a), i) for i, a in enumerate(args)]
    trace.ids = n
    result = _run_traced(trace, f, inputs, True)  # (has_aux: the result as f returned it)
    outs = result if isinstance(result, (tuple, list)) else (result,)
    out_ids, out_shapes = [], []
    for o in outs:
        if isinstance(o, _DTracer) and o.trace is trace and not isinstance(o, _Tainted):
            out_ids.append(o.index)
            out_shapes.append(tuple(np.shape(o._v)))
        else:
            out_ids.append(None)
            out_shapes.append(tuple(np.shape(o)))
    program = Program(list(range(n)), [tuple(np.shape(a)) for a in args], trace.nodes, out_ids, out_shapes,
                      trace.reasons)
    return program, outs


def _tracer_classes():
    from ..tape import _functions, _linalg
    from ..tape._tracer import RTracer, Trace, Tracer, concrete
    exempt = {_functions.where.__code__}  # where's condition: both branches are counted, its value is not needed
    # namespace functions whose result is decided by the values they read (indices, counts, orders)
    deciding = {getattr(_functions, n).__code__ for n in (
        "argsort", "argmax", "argmin", "nonzero", "count_nonzero", "searchsorted", "all", "any", "unique_all",
        "unique_counts", "unique_inverse", "unique_values", "repeat", "take", "take_along_axis", "_normalize_index")
        if hasattr(getattr(_functions, n, None), "__code__")}
    if hasattr(getattr(_linalg, "matrix_rank", None), "__code__"):
        deciding.add(_linalg.matrix_rank.__code__)

    def reader():
        frame = sys._getframe(2)
        if frame.f_code is concrete.__code__:
            frame = frame.f_back
        return frame.f_code if frame is not None else None

    class DetectTrace(Trace):
        __slots__ = ("nodes", "reasons", "ids", "sites")

        def __init__(self, sites):
            super().__init__()
            self.nodes, self.reasons, self.ids, self.sites = [], [], 0, sites

        def note(self, what):
            site = user_site()
            reason = f"{what} at {site}" if site else what
            if reason not in self.reasons:
                self.reasons.append(reason)

        def process(self, prim, args, params):
            if not self.active:
                self._leaked(prim)
            vals, traced, nested = list(args), {}, False
            for i, a in enumerate(args):
                if isinstance(a, Tracer):
                    if a.trace is self:
                        v = vals[i] = a._v
                        if isinstance(v, Tracer):
                            nested = True
                        if not isinstance(a, Tainted) and prim.vjps is not None and i < len(prim.vjps) \
                                and prim.vjps[i] is not None:
                            traced[i] = a.index
                    elif a.trace.level >= self.level:
                        a.trace._leaked(prim)
                    else:
                        nested = True
            for key, p in params.items():
                if _holds_tracer(p, self):
                    self.note(f"{prim.name} parameter {key!r} computed from the input")
                    params = dict(params)
                    params[key] = _untraced(p, self)
            ans = prim(*vals, **params) if nested else prim.impl(*vals, **params)
            out = self.ids
            self.ids += 1
            shape = tuple(np.shape(ans)) if not hasattr(ans, "shape") else tuple(ans.shape)
            self.nodes.append(Node(prim.name, prim.impl, vals, traced, dict(params), [out], [shape],
                                   site=user_site() if self.sites else None, prim=prim,
                                   data=_data_positions(prim, len(vals))))
            return (Tainted if prim.vjps is None else DTracer)(self, ans, out)

    class DTracer(RTracer):
        __slots__ = ("_v",)

        @property
        def value(self):
            if reader() in deciding:
                self.trace.note("indices or a count computed from the input's values")
            return self._v

        @value.setter
        def value(self, v):
            self._v = v

        @property
        def shape(self):
            return tuple(np.shape(self._v))

        @property
        def dtype(self):
            return np.result_type(self._v)

        @property
        def ndim(self):
            return np.ndim(self._v)

        def __bool__(self):
            self.trace.note("control flow on a traced value (bool)")
            return bool(concrete(self._v))

    class Tainted(DTracer):
        """A result without a derivative (a comparison, an argmax): reading its value as a constant
        (an index computed from the input) makes the code-level pattern depend on the values."""
        __slots__ = ()

        @property
        def value(self):
            if reader() not in exempt:
                self.trace.note("a value computed from the input read as a constant (an index, a count, a branch)")
            return self._v

        @value.setter
        def value(self, v):
            self._v = v

    return DetectTrace, DTracer, Tainted


def _holds_tracer(p, trace):
    if isinstance(p, (tuple, list)):
        return any(_holds_tracer(q, trace) for q in p)
    return getattr(p, "trace", None) is trace


def _untraced(p, trace):
    if isinstance(p, tuple):
        return tuple(_untraced(q, trace) for q in p)
    if isinstance(p, list):
        return [_untraced(q, trace) for q in p]
    return p._v if getattr(p, "trace", None) is trace else p


_DetectTrace, _DTracer, _Tainted = _tracer_classes()


# --------------------------------------------------------------------------- value-dependence check

def same_structure(p, q):
    """Whether two recordings of one function (at two points) are the same program as the rules read
    it: the same primitives, shapes, parameters (index arrays included), and the same constant
    operands where a rule reads them (indices of gathers, the zeros of a constant matrix). A difference
    means the program depends on the input's values (a sort, an index computed from the input)."""
    from ._rules import rule_for
    if len(p.nodes) != len(q.nodes) or p.output_shapes != q.output_shapes or p.outputs != q.outputs:
        return False
    for a, b in zip(p.nodes, q.nodes):
        if a.name != b.name or a.out_shapes != b.out_shapes or a.traced != b.traced:
            return False
        if not _same(a.params, b.params):
            return False
        kind = rule_for(a.name).kind
        for pos in range(len(a.args)):
            if pos in a.traced:
                continue
            if kind in ("structural", "linear_probe") and pos not in a.data:
                if not _same(a.args[pos], b.args[pos]):
                    return False
            elif kind == "matmul":
                if not _same(np.asarray(_concrete(a.args[pos])) != 0, np.asarray(_concrete(b.args[pos])) != 0):
                    return False
    return True


def _concrete(x):
    from ..tape._tracer import concrete
    return concrete(x)


def _same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = _concrete(a), _concrete(b)
        return np.shape(a) == np.shape(b) and bool(np.all(np.asarray(a) == np.asarray(b)))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def nearby(values, seed=0, scale=0.25):
    """Random points near ``values`` (NumPy arrays): generic values keeping each entry's sign."""
    rng = np.random.default_rng(seed + 4242)
    out = []
    for v in values:
        v = np.asarray(v)
        mag = float(np.mean(np.abs(v))) if v.size else 1.0
        mag = mag if np.isfinite(mag) and mag > 0 else 1.0
        step = scale * (np.abs(v) + mag) * np.abs(rng.standard_normal(v.shape))
        if v.dtype.kind == "c":
            step = step * np.exp(2j * np.pi * rng.random(v.shape))
        else:
            step = np.where(v < 0, -step, step)
        out.append(np.asarray(v + step, dtype=v.dtype))
    return out
