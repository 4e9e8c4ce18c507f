"""Portable programs: small graphs of Array API operations, as readable Python.

A :class:`Program` is a list of lines ``v3 = xp.sin(v1)`` over inputs ``x0, x1...``.
Its source is real Python (``program.source()``) and calling the program runs
exactly that source through ``unigrad.namespace``, so a program runs on every
backend and a failing one prints as code that can be pasted into a file.

Each line may carry a *kink*: where its operation is not differentiable
(``abs`` at 0, ``maximum`` at ties, a ``where`` condition at its threshold, a
``max`` reduction at ties). :meth:`Program.check_point` evaluates the program
on NumPy and says whether a point keeps every kink at a safe distance and every
intermediate finite and bounded, which is how random inputs are kept away from
non-differentiable points.

The strategies that build programs live in :mod:`unigrad.testing.strategies`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Program", "Line", "ProgramCase", "check_program", "check_program_across", "check_programs_across"]


@dataclass(frozen=True)
class Line:
    """``target = expr``; ``kink`` is ``(kind, operands, params)`` for a non-differentiable operation.

    Kinds: ``"zero"`` (not differentiable where ``operands[0]`` is 0: abs, relu, a ``where`` threshold),
    ``"tie"`` (where ``operands[0] == operands[1]``: maximum), ``"max"`` (a max reduction over
    ``params["axis"]`` at ties).
    """

    target: str
    expr: str
    kink: tuple | None = None


class Program:
    """A portable function of ``len(inputs)`` arrays, built from :class:`Line` s.

    Args:
      inputs: ``(name, shape, dtype)`` for each argument.
      lines: the body, in order.
      outputs: names returned (one name: an array; several: a tuple).
    """

    def __init__(self, inputs: Sequence[tuple], lines: Sequence[Line], outputs: Sequence[str]):
        self.inputs = tuple((str(n), tuple(int(s) for s in shape), str(d)) for n, shape, d in inputs)
        self.lines = tuple(lines)
        self.outputs = tuple(outputs)
        self._fn = None

    # ------------------------------------------------------------------ source
    @property
    def input_names(self):
        return [n for n, _, _ in self.inputs]

    def source(self, name: str = "f") -> str:
        """The program as a Python function definition (uses ``unigrad``; ``xp`` is its namespace)."""
        args = ", ".join(self.input_names)
        body = [f"    xp = unigrad.namespace({args})"]
        body += [f"    {line.target} = {line.expr}" for line in self.lines]
        body.append(f"    return {', '.join(self.outputs)}")
        comment = "    # " + "; ".join(f"{n}: {d}{list(s)}" for n, s, d in self.inputs)
        return "\n".join([f"def {name}({args}):", comment] + body)

    def __repr__(self):
        return self.source()

    def __len__(self):
        return len(self.lines)

    @property
    def __name__(self):  # so reports name the function
        return "program"

    def __call__(self, *xs):
        if self._fn is None:
            import unigrad

            namespace = {"unigrad": unigrad}
            exec(compile(self.source(), "<unigrad program>", "exec"), namespace)  # noqa: S102 -- our own source
            self._fn = namespace["f"]
        if len(xs) != len(self.inputs):
            raise TypeError(f"program takes {len(self.inputs)} arguments; got {len(xs)}")
        return self._fn(*xs)

    # ------------------------------------------------------------------ checks at a point
    def intermediates(self, inputs: Sequence[np.ndarray]) -> dict:
        """Every named value at ``inputs``, computed with NumPy (through the tape's namespace)."""
        from ..tape import _namespace as xp

        env = dict(zip(self.input_names, (np.asarray(x) for x in inputs)))
        with np.errstate(all="ignore"):
            for line in self.lines:
                env[line.target] = np.asarray(eval(line.expr, {"xp": xp}, env))  # noqa: S307 -- our own source
        return env

    def check_point(self, inputs: Sequence[np.ndarray], *, margin: float = 1e-2, bound: float = 1e3) -> str | None:
        """None when ``inputs`` are a safe point; else why not (a kink within ``margin``, a value
        beyond ``bound`` or not finite)."""
        from ..tape import _namespace as xp

        env = dict(zip(self.input_names, (np.asarray(x) for x in inputs)))
        with np.errstate(all="ignore"):
            for line in self.lines:
                if line.kink is not None:
                    d = _kink_distance(line.kink, env, xp)
                    if d < margin:
                        return f"{line.target} = {line.expr}: within {d:.2g} of a non-differentiable point"
                v = np.asarray(eval(line.expr, {"xp": xp}, env))  # noqa: S307
                env[line.target] = v
                if v.size and not np.all(np.isfinite(v)):
                    return f"{line.target} = {line.expr}: not finite"
                if v.size and float(np.max(np.abs(v))) > bound:
                    return f"{line.target} = {line.expr}: magnitude {float(np.max(np.abs(v))):.3g} > {bound:g}"
        return None

    def pruned(self) -> "Program":
        """The same program without lines the outputs do not use."""
        needed = set(self.outputs)
        keep = []
        for line in reversed(self.lines):
            if line.target in needed:
                keep.append(line)
                needed |= _names_in(line)
        keep.reverse()
        return Program(self.inputs, keep, self.outputs)

    def renumbered(self) -> "Program":
        """Intermediates renamed v0, v1... in order (after pruning)."""
        mapping = {line.target: f"v{k}" for k, line in enumerate(self.lines)}
        lines = [Line(mapping[line.target], _rename(line.expr, mapping),
                      None if line.kink is None else (line.kink[0], tuple(_rename(o, mapping) for o in line.kink[1]),
                                                      line.kink[2]))
                 for line in self.lines]
        return Program(self.inputs, lines, [mapping.get(o, o) for o in self.outputs])


def _names_in(line: Line) -> set:
    import re

    return set(re.findall(r"\b[vx]\d+\b", line.expr))


def _rename(expr: str, mapping: dict) -> str:
    import re

    return re.sub(r"\bv\d+\b", lambda m: mapping.get(m.group(0), m.group(0)), expr)


def _kink_distance(kink, env, xp) -> float:
    kind, operands, params = kink
    vals = [np.asarray(eval(o, {"xp": xp}, env)) for o in operands]  # noqa: S307
    if kind == "zero":
        d = np.abs(vals[0])
    elif kind == "tie":
        d = np.abs(vals[0] - vals[1])
    elif kind == "max":
        x = vals[0]
        axis = params.get("axis")
        axes = tuple(range(x.ndim)) if axis is None else tuple(a % x.ndim for a in (
            (axis,) if isinstance(axis, int) else axis)) if x.ndim else ()
        if x.size == 0 or math.prod(x.shape[a] for a in axes) < 2:
            return math.inf
        rest = [a for a in range(x.ndim) if a not in axes]
        x = np.transpose(x, rest + list(axes)).reshape(math.prod(x.shape[a] for a in rest), -1)
        top = np.sort(np.real(x), axis=-1)[:, -2:]
        d = top[:, 1] - top[:, 0]
    else:
        raise ValueError(f"unknown kink kind {kind!r}")
    d = np.real(d)
    return float(np.min(d)) if d.size else math.inf


class ProgramCase:
    """A program with the inputs it is checked at; its repr is paste-able Python."""

    def __init__(self, program: Program, inputs: Sequence[np.ndarray]):
        self.program, self.inputs = program, tuple(inputs)

    def __iter__(self):
        return iter((self.program, self.inputs))

    def in_single_precision(self) -> "ProgramCase":
        """The same program at float32 (complex64) inputs: what a backend that declares no float64 is
        checked at (it would compute float64 inputs in float32). Itself where no input is 64-bit."""
        single = {"float64": "float32", "complex128": "complex64"}
        if not any(d in single for _, _, d in self.program.inputs):
            return self
        program = Program([(n, shape, single.get(d, d)) for n, shape, d in self.program.inputs],
                          self.program.lines, self.program.outputs)
        return ProgramCase(program, [np.asarray(x).astype(single.get(np.asarray(x).dtype.name, np.asarray(x).dtype))
                                     for x in self.inputs])

    def __repr__(self):
        np_repr = np.array2string
        lines = [self.program.source(), ""]
        for (name, _, dtype), x in zip(self.program.inputs, self.inputs):
            x = np.asarray(x)
            if x.size == 0:  # np.array([]) would lose the shape (0, 2)
                lines.append(f"{name} = np.zeros({tuple(x.shape)!r}, dtype=np.{dtype})")
                continue
            body = np_repr(x, separator=", ", precision=17, floatmode="unique", threshold=10**6)
            lines.append(f"{name} = np.array({body}, dtype=np.{dtype})")
        lines.append(f"f({', '.join(self.program.input_names)})")
        return "\n".join(lines)


def check_program(case, backend="numpy", *, reference: str | None = "numpy", order: int = 1, seed: int = 0,
                  redraw_inconclusive: bool = True):
    """Check a program at its inputs on ``backend``: :func:`check_grads` (finite differences, to
    ``order``) and, when ``reference`` differs from ``backend``, :func:`compare` against it.

    Raises AssertionError (GradientCheckError, or the comparison table) on the first problem. Where
    finite differences are inconclusive at the inputs (a kink or a jump within their reach, see
    :class:`FiniteDifferencesInconclusive`), the point proves nothing either way: inside a hypothesis
    test it is rejected (``hypothesis.reject()``: hypothesis draws another), elsewhere, or with
    ``redraw_inconclusive=False``, the exception propagates.

    Example (the program suite, for a plugin backend)::

        @given(strategies.program_cases())
        def test_programs(case):
            check_program(case, backend="mine")
    """
    from ._check_grads import check_grads
    from ._compare import assert_backends_agree

    from ._check_grads import FiniteDifferencesInconclusive

    program, inputs = case
    try:
        check_grads(program, inputs, order=order, backend=backend, seed=seed, argnums=tuple(range(len(inputs))))
        name = backend if isinstance(backend, str) else backend.name
        if reference is not None and reference != name:
            assert_backends_agree(program, inputs, backends=[reference, backend], argnums="all", order=order,
                                  seed=seed, reference=reference, repeats=0)
    except FiniteDifferencesInconclusive:
        if redraw_inconclusive and _in_hypothesis():
            from hypothesis import reject

            reject()
        raise


def _in_hypothesis() -> bool:
    """Whether a hypothesis test is running (so ``reject()`` re-draws instead of failing)."""
    try:
        from hypothesis.control import currently_in_test_context
    except ImportError:
        return False
    return currently_in_test_context()


def _pairwise_error(a_list, b_list) -> float:
    worst, scale = 0.0, 1.0
    for a, b in zip(a_list, b_list):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return math.inf
        if a.size:
            scale = max(scale, float(np.max(np.abs(a))), float(np.max(np.abs(b))))
            with np.errstate(invalid="ignore"):
                d = np.abs(a.astype(np.complex128) - b.astype(np.complex128))
            worst = max(worst, float(np.max(np.where(np.isnan(d), np.inf, d))))
    return worst / scale


def check_program_across(case, backends: Sequence[str], *, order: int = 1, seed: int = 0,
                         redraw_inconclusive: bool = True) -> None:
    """A program on many backends, cheaply: :func:`check_grads` on the NumPy tape (finite differences,
    to ``order``), then on each other backend the value, a JVP and a VJP (and, with ``order=2``, the JVP
    of the VJP) against the tape's, at the pairwise tolerance of the dtype. Finite differences run once,
    on the tape: a backend that matches the tape to rounding matches what the tape was checked against.
    A backend that does not is then run through the full :func:`compare` with the tape, whose table is
    the AssertionError's message (so a disagreement is diagnosed exactly as ``compare`` would).

    Inside a hypothesis test, a point where finite differences are inconclusive is re-drawn.
    """
    from .. import _api, _registry
    from ._check_grads import FiniteDifferencesInconclusive, check_grads
    from ._compare import PAIRWISE_TOLERANCES, _random_directions, assert_backends_agree

    program, inputs = case
    argnums = tuple(range(len(inputs)))
    try:
        check_grads(program, inputs, order=order, backend="numpy", seed=seed, argnums=argnums)
    except FiniteDifferencesInconclusive:
        if redraw_inconclusive and _in_hypothesis():
            from hypothesis import reject

            reject()
        raise
    tangents = _random_directions([(np.shape(x), np.iscomplexobj(x)) for x in inputs], seed, 0)

    def measure(name, program, inputs):
        b = _registry.get_backend(name)
        dtypes = [np.asarray(x).dtype.name for x in inputs]
        xs = [b.asarray(np.asarray(x)) for x in inputs]
        ts = [b.asarray(t, dtype=d) for t, d in zip(tangents, dtypes)]

        def flat(*a):
            out = program(*a)
            return out if isinstance(out, tuple) else (out,)
        outs, vjp_fn = _api.vjp(flat, *xs, backend=b)
        outs_np = [np.asarray(b.to_numpy(o)) for o in outs]
        cts = _random_directions([(o.shape, np.iscomplexobj(o)) for o in outs_np], seed, 1)
        cts_b = tuple(b.asarray(c, dtype=b.dtype(o)) for c, o in zip(cts, outs))
        got = {"value": outs_np, "vjp": [np.asarray(b.to_numpy(g)) for g in vjp_fn(cts_b)],
               "jvp": [np.asarray(b.to_numpy(t)) for t in _api.jvp(flat, tuple(xs), tuple(ts), backend=b)[1]]}
        if order >= 2 and b.capabilities.higher_order:
            def vjp_of(*a):
                return _api.vjp(flat, *a, backend=b)[1](cts_b)
            got["second"] = [np.asarray(b.to_numpy(s)) for s in _api.jvp(vjp_of, tuple(xs), tuple(ts), backend=b)[1]]
        return got

    references = {}  # the tape's measurements, at each precision a backend is checked at
    is_complex = any(np.iscomplexobj(x) for x in inputs)
    for name in backends:
        b = _registry.get_backend(name)
        if name == "numpy" or (is_complex and not b.capabilities.complex):
            continue
        # a backend that declares no float64 is checked at float32, against the tape at float32
        single = not b.capabilities.float64
        program_b, inputs_b = ProgramCase(*case).in_single_precision() if single else case
        tol = max(PAIRWISE_TOLERANCES.get(np.asarray(x).dtype.name, 1e-8) for x in inputs_b)
        if single not in references:
            references[single] = measure("numpy", program_b, inputs_b)
        try:
            got = measure(name, program_b, inputs_b)
            agree = all(_pairwise_error(got[q], references[single][q]) <= tol for q in got)
        except Exception:  # noqa: BLE001 -- the full comparison reports what raised
            agree = False
        if not agree:
            assert_backends_agree(program_b, inputs_b, backends=["numpy", name], argnums=argnums, order=order,
                                  seed=seed, reference="numpy", repeats=0)


def check_programs_across(cases, backends: Sequence[str], *, seed: int = 0, batch: int = 100,
                          compiled_backends: Sequence[str] = ("jax",)) -> dict:
    """Many programs on many backends at once: the bulk form of :func:`check_program_across`.

    Each case is checked on the NumPy tape against finite differences (:func:`check_grads`, first
    order); a case where finite differences are inconclusive is left out (counted, not failed). A backend
    that declares no float64 gets the cases at float32 (complex64), compared with the tape's at float32. Then
    for each other backend the cases are run ``batch`` at a time as ONE function of all their inputs
    -- value, JVP and VJP of every program in one call; for the backends in ``compiled_backends``
    (JAX, whose eager operations each compile once per shape), one ``backend.compile`` per batch
    instead -- and each program's slice is compared with the tape's at the pairwise tolerance. A
    program that differs (or a batch that raises) is re-run alone through :func:`compare` with the
    tape, whose table is the AssertionError's message.

    Returns:
      ``{"compared": programs checked against finite differences and on every backend,
      "inconclusive": programs left out, "backends": the backends compared}``.
    """
    from .. import _registry
    from ._check_grads import FiniteDifferencesInconclusive, check_grads
    from ._compare import assert_backends_agree

    kept, inconclusive = [], 0
    for case in cases:
        program, inputs = case
        try:
            check_grads(program, inputs, order=1, backend="numpy", seed=seed, argnums=tuple(range(len(inputs))))
        except FiniteDifferencesInconclusive:
            inconclusive += 1
            continue
        kept.append(case)
    tape = _registry.get_backend("numpy")
    references = {}  # precision -> the tape's measurements of the kept cases, at that precision
    used = ["numpy"]
    for name in backends:
        if name == "numpy":
            continue
        b = _registry.get_backend(name)
        used.append(name)
        # a backend that declares no float64 is checked at float32, against the tape at float32
        single = not b.capabilities.float64
        cases_b = [ProgramCase(*case).in_single_precision() for case in kept] if single else kept
        if single not in references:
            references[single] = [_measure_batch(tape, [case], seed, compiled=False)[0] for case in cases_b]
        reference = references[single]
        index = [k for k, case in enumerate(cases_b) if b.capabilities.complex
                 or not any(np.iscomplexobj(x) for x in case.inputs)]
        for start in range(0, len(index), batch):
            chunk = index[start:start + batch]
            try:
                got = _measure_batch(b, [cases_b[k] for k in chunk], seed,
                                     compiled=b.capabilities.compile and b.name in compiled_backends)
            except Exception:  # noqa: BLE001 -- each program alone finds the one that raises
                got = [None] * len(chunk)
            for k, measured in zip(chunk, got):
                program, inputs = cases_b[k]
                dtypes = [np.asarray(x).dtype.name for x in inputs]
                tol = max(_pairwise_tolerance(d) for d in dtypes)
                if measured is not None and all(_pairwise_error(measured[q], reference[k][q]) <= tol
                                                for q in measured):
                    continue
                assert_backends_agree(program, inputs, backends=["numpy", name], argnums=tuple(range(len(inputs))),
                                      seed=seed, reference="numpy", repeats=0)
    return {"compared": len(kept), "inconclusive": inconclusive, "backends": used}


def _pairwise_tolerance(dtype):
    from ._compare import PAIRWISE_TOLERANCES

    return PAIRWISE_TOLERANCES.get(dtype, 1e-8)


def _measure_batch(b, cases, seed, compiled):
    """Value, JVP and VJP of every case's program on backend ``b``, as one function of all inputs."""
    from .. import _api, _registry
    from ._compare import _random_directions

    spans, flat_inputs, tangents = [], [], []
    for program, inputs in cases:
        spans.append((len(flat_inputs), len(flat_inputs) + len(inputs), program))
        flat_inputs += [np.asarray(x) for x in inputs]
        tangents += _random_directions([(np.shape(x), np.iscomplexobj(x)) for x in inputs], seed, 0)
    n = len(flat_inputs)

    def combined(*xs):
        outs = []
        for start, stop, program in spans:
            out = program(*xs[start:stop])
            outs.extend(out if isinstance(out, tuple) else (out,))
        return tuple(outs)

    # the outputs' shapes and dtypes (for the cotangents): from a NumPy evaluation of the programs
    token = _registry.active_backend.set(_registry.get_backend("numpy"))
    try:
        shapes = [(np.shape(o), np.iscomplexobj(o)) for o in combined(*flat_inputs)]
    finally:
        _registry.active_backend.reset(token)
    counts = []
    for start, stop, program in spans:
        counts.append(len(program.outputs))
    cotangents = []
    k = 0
    for c in counts:
        cotangents += _random_directions(shapes[k:k + c], seed, 1)
        k += c

    def kernel(*args):
        xs, ts, cts = args[:n], args[n:2 * n], args[2 * n:]
        outs, t_out = _api.jvp(combined, tuple(xs), tuple(ts), backend=b)
        _, vjp_fn = _api.vjp(combined, *xs, backend=b)
        return tuple(outs) + tuple(t_out) + tuple(vjp_fn(tuple(cts)))

    dtypes = [x.dtype.name for x in flat_inputs]
    out_dtypes = []
    args = ([b.asarray(x) for x in flat_inputs] + [b.asarray(t, dtype=d) for t, d in zip(tangents, dtypes)])
    token = _registry.active_backend.set(b)
    try:
        out_dtypes = [o.dtype.name for o in (np.asarray(z) for z in _numpy_outputs(combined, flat_inputs))]
        args += [b.asarray(c if np.iscomplexobj(c) or not d.startswith("complex") else c.astype(d), dtype=d)
                 for c, d in zip(cotangents, out_dtypes)]
        run = b.compile(kernel) if compiled else kernel
        result = [np.asarray(b.to_numpy(r)) for r in run(*args)]
    finally:
        _registry.active_backend.reset(token)
    m = len(shapes)
    values, jvps, vjps = result[:m], result[m:2 * m], result[2 * m:]
    measured, k = [], 0
    for (start, stop, program), c in zip(spans, counts):
        measured.append({"value": values[k:k + c], "jvp": jvps[k:k + c], "vjp": vjps[start:stop]})
        k += c
    return measured


def _numpy_outputs(combined, flat_inputs):
    from .. import _registry

    token = _registry.active_backend.set(_registry.get_backend("numpy"))
    try:
        return combined(*flat_inputs)
    finally:
        _registry.active_backend.reset(token)
