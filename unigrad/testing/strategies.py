"""Hypothesis strategies: shapes, dtypes, arrays away from kinks, and random portable programs.

Everything is built from hypothesis draws, so hypothesis shrinks it: a failing
program shrinks to fewer lines, simpler operations and smaller shapes, and is
printed as Python source::

    from hypothesis import given
    from unigrad.testing import check_grads, strategies as ust

    @given(ust.program_cases())
    def test_tape(case):
        check_grads(case.program, case.inputs, order=1)

Requires ``hypothesis`` (``pip install 'unigrad[test]'``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from ._programs import Line, Program, ProgramCase

__all__ = ["shapes", "dtypes", "arrays", "programs", "program_inputs", "program_cases", "OPERATIONS",
           "Program", "ProgramCase"]


# ---------------------------------------------------------------------------------------------
# Shapes, dtypes, arrays
# ---------------------------------------------------------------------------------------------

def _draw_shape(draw, min_dims, max_dims, min_side, max_side):
    ndim = draw(st.integers(min_dims, max_dims))
    low = max(min_side, 1) if max_side >= 1 else 0
    # side 2 first (what shapes shrink to): the smallest side at which a transposed or
    # un-broadcast derivative shows; side 1 last
    options = [k for k in range(max(low, 2), max_side + 1)] + ([1] if low <= 1 <= max_side else [])
    sides = [draw(st.sampled_from(options)) if options else low for _ in range(ndim)]
    if min_side == 0 and ndim and draw(st.integers(0, 7)) == 7:
        sides[draw(st.integers(0, ndim - 1))] = 0
    return tuple(sides)


@st.composite
def _shapes(draw, min_dims, max_dims, min_side, max_side):
    return _draw_shape(draw, min_dims, max_dims, min_side, max_side)


def shapes(*, min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4):
    """Array shapes, 0-d included; with ``min_side=0``, one shape in eight is zero-size (one side 0).

    They shrink towards ``min_dims`` dimensions of side 2 -- the smallest side at which a transposed
    or un-broadcast derivative shows -- and never towards zero-size shapes, where no bug can show.
    """
    if not 0 <= min_dims <= max_dims or not 0 <= min_side <= max_side:
        raise ValueError("shapes: need 0 <= min_dims <= max_dims and 0 <= min_side <= max_side")
    return _shapes(min_dims, max_dims, min_side, max_side)


def dtypes(*, real: bool = True, complex: bool = False, float32: bool = True):
    """Canonical dtype names: ``"float64"`` first (what a failure shrinks to), then float32, complex."""
    names = []
    if real:
        names += ["float64"] + (["float32"] if float32 else [])
    if complex:
        names += ["complex128"] + (["complex64"] if float32 else [])
    if not names:
        raise ValueError("dtypes: ask for real or complex dtypes (or both)")
    return st.sampled_from(names)


@functools.lru_cache(maxsize=64)
def _element(lo, hi, avoid, margin):
    """Floats in [lo, hi], moved out of (k - margin, k + margin) for every kink k in ``avoid``."""
    base = st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)

    def away(v):
        for k in avoid:
            if abs(v - k) < margin:
                v = k + margin if v >= k else k - margin
                v = min(max(v, lo), hi)
        return v
    return base.map(away) if avoid else base


def _draw_array(draw, shape, dtype, lo, hi, avoid, margin, unique):
    n = math.prod(shape)
    is_complex = np.dtype(dtype).kind == "c"
    parts = []
    for _ in range(2 if is_complex else 1):
        if unique and n > 1:
            parts.append(_draw_spread(draw, n, lo, hi, avoid, margin))
        else:
            elem = _element(float(lo), float(hi), tuple(avoid), float(margin))
            parts.append(np.asarray(draw(st.lists(elem, min_size=n, max_size=n)), dtype=np.float64))
    a = parts[0] + 1j * parts[1] if is_complex else parts[0]
    return np.asarray(a).reshape(shape).astype(dtype)


def spread_gap(n, lo, hi, avoid, margin):
    """``(gap, cells)`` of :func:`arrays` with ``unique=True``: n values are placed more than ``gap``
    apart (``margin``, halved while n of them do not fit in [lo, hi]), one per cell of width 2 * gap."""
    gap = margin
    while True:
        width = 2 * gap
        cells = [lo + k * width for k in range(int((hi - lo) / width))]
        cells = [c for c in cells if all(min(abs(c + gap / 2 - k), abs(c + 1.5 * gap - k)) >= margin
                                         and not c + gap / 2 <= k <= c + 1.5 * gap for k in avoid)]
        if len(cells) >= n or gap < 1e-6:
            break
        gap /= 2  # a small domain for many elements: closer together, still distinct
    if len(cells) < n:
        raise ValueError(f"arrays: cannot place {n} distinct values in [{lo}, {hi}] away from {avoid}")
    return gap, cells


def _draw_spread(draw, n, lo, hi, avoid, margin):
    """n values in [lo, hi], pairwise more than ``gap`` apart (see :func:`spread_gap`) and ``margin``
    from each kink: each value sits in [gap / 2, gap] of its own cell of width 2 * gap."""
    gap, cells = spread_gap(n, lo, hi, avoid, margin)
    chosen = draw(st.lists(st.sampled_from(cells), min_size=n, max_size=n, unique=True))
    # in [gap / 2, gap] of each cell: neighbours are then at least 1.5 * gap apart, so the promise
    # "more than gap apart" survives rounding to float32 (a hair over one gap did not: 0.04999999999999996)
    offsets = draw(st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n))
    return np.asarray([c + gap / 2 + u * gap for c, u in zip(chosen, offsets)], dtype=np.float64)


@st.composite
def _arrays(draw, shape_st, dtype_st, lo, hi, avoid, margin, unique):
    return _draw_array(draw, draw(shape_st), draw(dtype_st), lo, hi, avoid, margin, unique)


def arrays(shape, dtype="float64", *, elements: tuple = (-2.0, 2.0), avoid: Sequence[float] = (0.0,),
           margin: float = 0.05, unique: bool = True):
    """NumPy arrays with elements in ``elements = (lo, hi)``, at least ``margin`` from every value in
    ``avoid`` (the kinks: 0 for abs and relu, by default), and a margin apart from each other by
    default (no near-ties for max or sort). Complex dtypes draw real and imaginary parts that way.

    Args:
      shape: a tuple or a strategy of tuples (e.g. :func:`shapes`).
      dtype: a dtype name or a strategy of names (e.g. :func:`dtypes`).
      elements: the domain ``(lo, hi)``.
      avoid: values to keep ``margin`` away from.
      unique: keep elements at least ``margin`` apart (closer when the domain is too small for that
        many: still distinct).
    """
    shape_st = shape if isinstance(shape, st.SearchStrategy) else st.just(tuple(shape))
    dtype_st = dtype if isinstance(dtype, st.SearchStrategy) else st.just(str(dtype))
    lo, hi = elements
    return _arrays(shape_st, dtype_st, lo, hi, tuple(avoid), margin, unique)


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------

def _broadcast(*shapes_):
    try:
        return tuple(np.broadcast_shapes(*shapes_))
    except ValueError:
        return None


def _matmul_shape(a, b):
    if not a or not b:
        return None
    if len(a) == 1 and len(b) == 1:
        return () if a[0] == b[0] else None
    if len(b) == 1:
        return a[:-1] if a[-1] == b[0] else None
    if len(a) == 1:
        return b[:-2] + b[-1:] if a[0] == b[-2] else None
    if a[-1] != b[-2]:
        return None
    batch = _broadcast(a[:-2], b[:-2])
    return None if batch is None else batch + (a[-2], b[-1])


def _transposed(s):
    return s[:-2] + (s[-1], s[-2])


@dataclass(frozen=True)
class Operation:
    """One kind of line a random program can hold.

    ``template`` is formatted with the operand names ``a``, ``b``, ``c`` (and the drawn parameters);
    ``shape`` gives the result's shape from the operands' shapes and the parameters, or None
    when the operands do not fit; ``kink`` names the non-differentiable points (see ``Line``).
    """

    name: str
    arity: int
    template: str
    shape: Callable
    kink: str | None = None
    complex_ok: bool = True
    params: Callable | None = None  # draw, operand shapes -> dict of parameters (None: no parameters)
    family: str = "unary"           # programs draw a family, then an operation of it (a fair mix)


def _same(*shapes_):
    return _broadcast(*shapes_)


def _reduce_params(need_nonempty):
    """Draw ``axis`` (None, an int or a tuple) and ``keepdims``; with ``need_nonempty`` (mean, max)
    never reduce over an axis of size 0 (None when nothing fits)."""
    def draw_params(draw, shp):
        allowed = [k for k in range(len(shp)) if shp[k] > 0 or not need_nonempty]
        choices = ["all"] + (["one"] if allowed else []) + (["many"] if len(allowed) >= 2 else [])
        choice = draw(st.sampled_from(choices))
        if choice == "all":
            if need_nonempty and 0 in shp:
                return None
            axis = None
        elif choice == "one":
            axis = draw(st.sampled_from(allowed))
        else:
            axis = tuple(sorted(draw(st.sets(st.sampled_from(allowed), min_size=2, max_size=len(allowed)))))
        return {"axis": axis, "keepdims": draw(st.booleans())}
    return draw_params


def _reduce_shape(shp, axis=None, keepdims=False):
    nd = len(shp)
    axes = set(range(nd)) if axis is None else {a % nd for a in ((axis,) if isinstance(axis, int) else axis)}
    if keepdims:
        return tuple(1 if k in axes else s for k, s in enumerate(shp))
    return tuple(s for k, s in enumerate(shp) if k not in axes)


def _reshape_params(draw, shp):
    n = math.prod(shp)
    options = [(n,), (1,) + shp]
    if len(shp) >= 2:
        options.append((shp[0] * shp[1],) + shp[2:])
    if len(shp) >= 1 and n > 0:
        options.append(shp[:-1] + (1, shp[-1]))
    return {"shape": draw(st.sampled_from(options))}


def _permute_params(draw, shp):
    return {"perm": tuple(draw(st.permutations(list(range(len(shp))))))}


def _index_params(draw, shp):
    parts = []
    n = draw(st.integers(1, len(shp)))
    for side in shp[:n]:
        options = [":", "1:", ":2", "::2"] + (["0", "-1"] if side > 0 else [])
        parts.append(draw(st.sampled_from(options)))
    return {"index": ", ".join(parts)}


def _index_shape(shp, index):
    parts = index.split(", ")
    out = []
    for side, part in zip(shp, parts):
        if part in ("0", "-1"):
            continue
        out.append(len(range(side)[_slice(part)]))
    return tuple(out) + shp[len(parts):]


def _slice(part):
    pieces = [int(p) if p else None for p in part.split(":")]
    return slice(*pieces)


def _fmt_axis(axis):
    return "None" if axis is None else repr(axis)


OPERATIONS = (
    # elementwise, binary, broadcasting
    Operation("add", 2, "xp.add({a}, {b})", _same, family="binary"),
    Operation("multiply", 2, "xp.multiply({a}, {b})", _same, family="binary"),
    Operation("subtract", 2, "xp.subtract({a}, {b})", _same, family="binary"),
    Operation("divide", 2, "{a} / (1.0 + {b} * {b})", _same, complex_ok=False, family="binary"),
    Operation("pow", 2, "xp.pow(1.0 + {a} * {a}, {b})", _same, complex_ok=False, family="binary"),
    Operation("maximum", 2, "xp.maximum({a}, {b})", _same, kink="tie", complex_ok=False, family="binary"),
    Operation("where", 3, "xp.where({a} > 0.0, {b}, {c})", _same, kink="zero", complex_ok=False,
              family="binary"),
    # elementwise, unary
    Operation("sin", 1, "xp.sin({a})", _same),
    Operation("cos", 1, "xp.cos({a})", _same),
    Operation("tanh", 1, "xp.tanh({a})", _same),
    Operation("exp", 1, "xp.exp({a})", _same),
    Operation("square", 1, "{a} * {a}", _same),
    Operation("negative", 1, "-{a}", _same),
    Operation("log", 1, "xp.log(1.0 + {a} * {a})", _same, complex_ok=False),
    Operation("sqrt", 1, "xp.sqrt(1.0 + {a} * {a})", _same, complex_ok=False),
    Operation("reciprocal", 1, "1.0 / (1.0 + {a} * {a})", _same, complex_ok=False),
    Operation("abs", 1, "xp.abs({a})", _same, kink="zero", complex_ok=False),
    Operation("relu", 1, "xp.maximum({a}, xp.zeros_like({a}))", _same, kink="zero", complex_ok=False),
    # linear algebra
    Operation("matmul", 2, "xp.matmul({a}, {b})", _matmul_shape, family="linalg"),
    Operation("matmul_t", 2, "xp.matmul({a}, xp.matrix_transpose({b}))",
              lambda a, b: _matmul_shape(a, _transposed(b)) if len(a) >= 2 and len(b) >= 2 else None,
              family="linalg"),
    # reductions
    Operation("sum", 1, "xp.sum({a}, axis={axis}, keepdims={keepdims})", _reduce_shape,
              params=_reduce_params(False), family="reduction"),
    Operation("mean", 1, "xp.mean({a}, axis={axis}, keepdims={keepdims})", _reduce_shape,
              params=_reduce_params(True), family="reduction"),
    Operation("max", 1, "xp.max({a}, axis={axis}, keepdims={keepdims})", _reduce_shape, kink="max",
              complex_ok=False, params=_reduce_params(True), family="reduction"),
    # shapes and indexing
    Operation("reshape", 1, "xp.reshape({a}, {shape})", lambda s, shape: tuple(shape), params=_reshape_params,
              family="shape"),
    Operation("permute_dims", 1, "xp.permute_dims({a}, {perm})",
              lambda s, perm: tuple(s[p] for p in perm), params=_permute_params, family="shape"),
    Operation("index", 1, "{a}[{index}]", _index_shape, params=_index_params, family="shape"),
)
FAMILIES = ("binary", "unary", "linalg", "reduction", "shape")
_BY_NAME = {op.name: op for op in OPERATIONS}


def _unary_ok(op, shp):
    if op.name in ("permute_dims",):
        return len(shp) >= 2
    if op.name == "index":
        return len(shp) >= 1
    return True


def _pick(draw, candidates):
    """Pick one of ``candidates`` (name, shape): the most recent one three times in four, so programs
    are mostly chains (and shrink to them); otherwise any."""
    if len(candidates) == 1 or draw(st.integers(0, 3)) < 3:
        return candidates[-1]
    return candidates[len(candidates) - 1 - draw(st.integers(0, len(candidates) - 1))]


def _pick_partner(draw, candidates, first):
    """A second operand: any candidate, preferring (and shrinking to) one of a different shape than
    ``first`` -- broadcasting is where reverse mode goes wrong."""
    others = [c for c in candidates if c[1] != first[1]]
    same = [c for c in candidates if c[1] == first[1]]
    ordered = same + others  # the last one is where _pick starts
    return _pick(draw, ordered)


def _build_line(draw, op, values, target):
    """Operands and parameters for ``op``; returns (Line, shape) or None when nothing fits."""
    if op.arity == 1:
        cands = [v for v in values if _unary_ok(op, v[1])]
        if not cands:
            return None
        a = _pick(draw, cands)
        params = op.params(draw, a[1]) if op.params else {}
        if params is None:
            return None
        shape = op.shape(a[1], **params)
        names = {"a": a[0]}
    elif op.name in ("matmul", "matmul_t"):
        pairs = [(x, y) for x in values for y in values if op.shape(x[1], y[1]) is not None]
        if not pairs:
            return None
        # pairs starting with the most recent value come last, where _pick starts
        pairs.sort(key=lambda pair: (values.index(pair[0]), pair[0] != pair[1]))
        a, b = _pick(draw, pairs)
        params, shape, names = {}, op.shape(a[1], b[1]), {"a": a[0], "b": b[0]}
    else:
        a = _pick(draw, values)
        chosen = [a]
        for _ in range(op.arity - 1):
            target_shape = _broadcast(*(c[1] for c in chosen))
            cands = [v for v in values if _broadcast(target_shape, v[1]) is not None and v not in chosen]
            chosen.append(_pick_partner(draw, cands, a) if cands else a)
        params, shape = {}, _broadcast(*(c[1] for c in chosen))
        names = dict(zip("abc", (c[0] for c in chosen)))
    fmt = dict(names)
    for k, v in params.items():
        fmt[k] = _fmt_axis(v) if k == "axis" else v if k == "index" else repr(v)
    expr = op.template.format(**fmt)
    kink = None
    if op.kink == "zero":
        kink = ("zero", (names["a"],), {})
    elif op.kink == "tie":
        kink = ("tie", (names["a"], names["b"]), {})
    elif op.kink == "max":
        kink = ("max", (names["a"],), {"axis": params["axis"]})
    return Line(target, expr, kink), shape


def _draw_related_shape(draw, base):
    """A shape that broadcasts with ``base`` (sides set to 1, leading dimensions dropped), the same
    shape, or (for matmul) its transpose."""
    if not base:
        return base
    choice = draw(st.integers(0, 3 if len(base) >= 2 else 2))
    if choice == 0:  # some sides set to 1 (at least one: broadcasting is what reverse mode can get wrong)
        ones = draw(st.lists(st.integers(0, len(base) - 1), min_size=1, max_size=len(base), unique=True))
        return tuple(1 if k in ones else s for k, s in enumerate(base))
    if choice == 1:  # fewer leading dimensions
        return base[draw(st.integers(1, len(base))):]
    if choice == 2:
        return base
    return _transposed(base)


@st.composite
def _programs(draw, allowed, dtype_st, max_inputs, max_ops, max_dims, max_side, min_side, multiple_outputs):
    return _draw_program(draw, allowed, draw(dtype_st), max_inputs, max_ops, max_dims, max_side, min_side,
                         multiple_outputs)


def _draw_program(draw, allowed, dt, max_inputs, max_ops, max_dims, max_side, min_side, multiple_outputs):
    is_complex = np.dtype(dt).kind == "c"
    ops = [op for op in allowed if op.complex_ok or not is_complex]
    if not ops:
        raise ValueError(f"programs: no operation in {[op.name for op in allowed]} supports {dt}")
    n_inputs = draw(st.integers(1, max_inputs))
    base = _draw_shape(draw, 0, max_dims, min_side, max_side)
    input_shapes = [base] + [_draw_related_shape(draw, base) for _ in range(n_inputs - 1)]
    values = [(f"x{i}", s) for i, s in enumerate(input_shapes)]
    lines = []
    families = [fam for fam in FAMILIES if any(op.family == fam for op in ops)]
    fallback = next((o for o in ops if o.arity == 1 and o.params is None and o.kink is None), None)
    # One "another line?" draw before each line after the first (as hypothesis' own lists do), so the
    # shrinker deletes any line by deleting its block of draws, not just the last ones.
    for k in range(max_ops):
        if k and draw(st.integers(0, 3)) == 0:
            break
        family = draw(st.sampled_from(families))
        op = draw(st.sampled_from([op for op in ops if op.family == family]))
        built = _build_line(draw, op, values, f"v{k}")
        if built is None:  # nothing fits this operation here: an elementwise one always does
            if fallback is None:
                continue
            built = _build_line(draw, fallback, values, f"v{k}")
        line, shape = built
        lines.append(line)
        values.append((line.target, shape))
    if not lines:
        lines.append(Line("v0", f"xp.sin({values[0][0]})"))
        values.append(("v0", values[0][1]))
    outputs = [values[-1][0]]
    if multiple_outputs and len(values) > 2 and draw(st.booleans()):
        other = _pick(draw, [v for v in values[:-1] if v[0].startswith("v")] or values[:-1])
        outputs.append(other[0])
    inputs = [(name, shape, dt) for name, shape in values[:n_inputs]]
    return Program(inputs, lines, outputs).pruned().renumbered()


def _program_options(max_inputs=3, max_ops=6, dtype="float64", operations=None, max_dims=3, max_side=3,
                     min_side=0, multiple_outputs=True):
    allowed = tuple((_BY_NAME[n] if isinstance(n, str) else n)
                    for n in (operations or [op.name for op in OPERATIONS]))
    dtype_st = dtype if isinstance(dtype, st.SearchStrategy) else st.just(str(dtype))
    return (allowed, dtype_st, max_inputs, max_ops, max_dims, max_side, min_side, multiple_outputs)


def programs(*, max_inputs: int = 3, max_ops: int = 6, dtype="float64", operations: Sequence[str] | None = None,
             max_dims: int = 3, max_side: int = 3, min_side: int = 0, multiple_outputs: bool = True):
    """Random portable programs: 1..``max_inputs`` inputs, 1..``max_ops`` lines of
    :data:`OPERATIONS` (or the names in ``operations``), broadcasting inputs, one output (sometimes two).

    Each line mostly continues the chain from the line before; second operands prefer values of
    another shape (broadcasting). Programs shrink to fewer lines, simpler operations, fewer inputs
    and smaller shapes; lines the outputs do not use are dropped.
    """
    return _programs(*_program_options(max_inputs, max_ops, dtype, operations, max_dims, max_side, min_side,
                                       multiple_outputs))


def _draw_inputs(draw, program, elements, margin, bound):
    # One seed, not one draw per element: far cheaper to generate and to shrink, and what a failure
    # shrinks is the program, not the values.
    lo, hi = elements
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    xs = []
    for _, shape, dtype in program.inputs:
        parts = 2 if np.dtype(dtype).kind == "c" else 1
        v = rng.uniform(lo, hi, size=(parts,) + tuple(shape))
        if lo < 0 < hi:  # keep inputs off 0 (the kink of abs and relu)
            v = np.where(np.abs(v) < margin, np.copysign(margin, v) + v, v)
        x = v[0] + 1j * v[1] if parts == 2 else v[0]
        xs.append(np.asarray(x).astype(dtype))
    xs = tuple(xs)
    assume(program.check_point(xs, margin=margin, bound=bound) is None)
    return xs


@st.composite
def _program_inputs(draw, program, elements, margin, bound):
    return _draw_inputs(draw, program, elements, margin, bound)


def program_inputs(program: Program, *, elements: tuple = (-2.0, 2.0), margin: float = 1e-2,
                   bound: float = 1e3):
    """Inputs for ``program`` at which every kink is at least ``margin`` away and every intermediate
    is finite and at most ``bound`` in magnitude (other draws are rejected with ``assume``)."""
    return _program_inputs(program, tuple(elements), margin, bound)


@st.composite
def _program_cases(draw, options, elements, margin, bound):
    allowed, dtype_st, *rest = options
    program = _draw_program(draw, allowed, draw(dtype_st), *rest)
    # built in a composite (not map/flatmap), so hypothesis prints the case's own repr: Python source
    return ProgramCase(program, _draw_inputs(draw, program, elements, margin, bound))


def program_cases(*, elements: tuple = (-2.0, 2.0), margin: float = 1e-2, bound: float = 1e3, **kwargs):
    """A :class:`ProgramCase` (a program and its inputs). ``elements``, ``margin`` and ``bound`` go to
    :func:`program_inputs`, the other keyword arguments to :func:`programs`."""
    return _program_cases(_program_options(**kwargs), tuple(elements), margin, bound)
