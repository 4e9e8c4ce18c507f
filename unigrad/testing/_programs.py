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

__all__ = ["Program", "Line", "ProgramCase", "check_program"]


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
