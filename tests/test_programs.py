"""Random portable programs: the strategies themselves, check_grads on the NumPy tape, and every
installed backend against the others (``compare``) on the same programs.

Examples per test come from the hypothesis profile (tests/conftest.py): ``ci`` by default,
``UNIGRAD_HYPOTHESIS_PROFILE=thorough`` for a long run.
"""

from __future__ import annotations

import numpy as np
import pytest

from hypothesis import HealthCheck, find, given, settings

import hypothesis.strategies as st

import unigrad
from unigrad.testing import (FiniteDifferencesInconclusive, Program, ProgramCase, check_program,
                             check_program_across, check_programs_across)
from unigrad.testing import strategies as ust
from unigrad.testing._programs import Line

from conftest import examples

# ---------------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------------


# Each case goes through check_program / check_program_across: a point where finite differences are
# inconclusive (a kink or jump within their reach) is re-drawn, never failed.

@given(ust.program_cases())
def test_tape_first_order(case):
    check_program(case, backend="numpy", reference=None, order=1)


@given(ust.program_cases(max_ops=3))
def test_tape_second_order(case):
    check_program(case, backend="numpy", reference=None, order=2)


@given(ust.program_cases(max_ops=3, dtype="complex128"))
def test_tape_complex(case):
    check_program(case, backend="numpy", reference=None, order=1)


# The bulk run: PROGRAMS random programs (200 by default, new ones each day with the date's seed; 5,000 with the
# thorough profile), each checked against finite differences on the tape and compared on every installed
# backend, in batches (one call, and for JAX one compiled program, per hundred programs). (500 by default took
# minutes of the 2-core budget; test_catch_bugs.py proves the bulk run catches each broken backend with 300.)
PROGRAMS = examples(200, thorough=5000)


def test_random_programs_agree_across_backends(unigrad_backends):
    cases = []

    @settings(max_examples=PROGRAMS + PROGRAMS // 20, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(ust.program_cases(max_ops=4, max_dims=2, max_side=3))
    def draw(case):
        cases.append(case)

    draw()
    stats = check_programs_across(cases, unigrad_backends)
    assert stats["backends"] == ["numpy"] + [b for b in unigrad_backends if b != "numpy"]
    assert stats["compared"] + stats["inconclusive"] == len(cases)
    assert stats["compared"] >= PROGRAMS, stats


@settings(max_examples=examples(4, thorough=200))
@given(ust.program_cases(max_ops=3, dtype="float32"))
def test_backends_agree_float32(unigrad_backends, case):
    check_program_across(case, unigrad_backends)


@settings(max_examples=examples(4, thorough=200))
@given(ust.program_cases(max_ops=3, dtype="complex128"))
def test_backends_agree_complex(unigrad_backends, case):
    check_program_across(case, unigrad_backends)  # backends without complex support are left out


@settings(max_examples=examples(3, thorough=100))
@given(ust.program_cases(max_ops=2, max_side=2))
def test_backends_agree_second_order(unigrad_backends, case):
    nesting = [b for b in unigrad_backends if unigrad.get_backend(b).capabilities.higher_order]
    check_program_across(case, nesting, order=2)


# ---------------------------------------------------------------------------------------------
# The strategies
# ---------------------------------------------------------------------------------------------


def test_shapes_include_0d_and_zero_size():
    assert find(ust.shapes(), lambda s: s == ()) == ()
    empty = find(ust.shapes(), lambda s: 0 in s)
    assert 0 in empty and len(empty) == 1
    assert find(ust.shapes(min_dims=2), lambda s: True) == (2, 2)  # shrinks to side 2


@given(ust.shapes(min_dims=1, max_dims=2, min_side=1, max_side=3))
def test_shapes_respect_bounds(shape):
    assert 1 <= len(shape) <= 2 and all(1 <= s <= 3 for s in shape)


@given(ust.arrays(ust.shapes(max_dims=2, max_side=3), ust.dtypes(complex=True), elements=(-1.0, 1.0), margin=0.1))
def test_arrays_domain_dtype_and_kinks(x):
    assert x.dtype.name in ("float64", "float32", "complex128", "complex64")
    parts = [x.real, x.imag] if np.iscomplexobj(x) else [x]
    for p in parts:
        assert np.all(np.abs(p) <= 1.0 + 1e-6)
        assert np.all(np.abs(p) >= 0.1 - 1e-6)  # away from the kink at 0
    if x.size > 1 and not np.iscomplexobj(x):
        gaps = np.diff(np.sort(x.ravel().astype(np.float64)))
        gap, _ = ust.spread_gap(x.size, -1.0, 1.0, (0.0,), 0.1)  # the margin, halved while x.size do not fit
        assert gaps.min() > gap  # no near-ties, after rounding to the dtype too


def test_arrays_spacing_survives_rounding():
    # the thorough profile found 0.04999999999999996 against a strict 0.05: values sat a hair over one
    # gap apart, and rounding took the hair off. Now they sit at least 1.5 gaps apart.
    cells = [-1.0 + k * 0.2 for k in range(10)]
    for dtype in ("float64", "float32"):
        x = ust._draw_spread(lambda strategy: _extreme(strategy, cells), 2, -1.0, 1.0, (), 0.1).astype(dtype)
        assert abs(float(x[1]) - float(x[0])) >= 0.1


def _extreme(strategy, cells):
    """A stand-in for hypothesis' draw: two neighbouring cells, the first value as high in its cell and
    the second as low in its cell as the strategy allows."""
    import hypothesis.strategies as st

    text = repr(strategy)
    if "sampled_from" in text:
        return [cells[3], cells[4]]
    return [st.floats(0.0, 0.5).validate() or 0.5, 0.0]


SHRINK = settings(derandomize=True, database=None, max_examples=2000)  # the same result under any profile


def test_programs_shrink_to_one_line():
    program = find(ust.programs(), lambda p: "xp.matmul(" in p.source(), settings=SHRINK)
    assert len(program) == 1
    assert program.lines[0].expr == "xp.matmul(x0, x0)"
    assert program.inputs == (("x0", (2,), "float64"),)  # the smallest shape matmul takes: a vector of side 2
    program = find(ust.programs(), lambda p: "xp.exp(" in p.source(), settings=SHRINK)
    assert program.source() == ("def f(x0):\n    # x0: float64[]\n    xp = unigrad.namespace(x0)\n"
                                "    v0 = xp.exp(x0)\n    return v0")


@given(ust.program_cases(max_ops=5))
def test_program_source_is_what_runs(case):
    program, inputs = case
    namespace = {"unigrad": unigrad, "np": np}
    exec(repr(case), namespace)  # the case's repr is a script: source, inputs and the call
    expected = namespace["f"](*inputs)
    result = program(*inputs)
    env = program.intermediates(inputs)
    results = result if isinstance(result, tuple) else (result,)
    expecteds = expected if isinstance(expected, tuple) else (expected,)
    assert len(results) == len(program.outputs)
    for r, e, name in zip(results, expecteds, program.outputs):
        np.testing.assert_array_equal(np.asarray(r), np.asarray(e))
        np.testing.assert_array_equal(np.asarray(r), env[name])
    assert repr(program) == program.source()
    # every line is used (dead lines are pruned) and intermediates are numbered in order
    assert [line.target for line in program.lines] == [f"v{k}" for k in range(len(program))]


def test_pruned_and_renumbered():
    program = Program([("x0", (2,), "float64")],
                      [Line("v0", "xp.sin(x0)"), Line("v1", "xp.cos(x0)"), Line("v2", "xp.exp(v1)")], ["v2"])
    tidy = program.pruned().renumbered()
    assert [(line.target, line.expr) for line in tidy.lines] == [("v0", "xp.cos(x0)"), ("v1", "xp.exp(v0)")]
    assert tidy.outputs == ("v1",)


def test_check_point_keeps_away_from_kinks_and_overflow():
    program = Program([("x0", (3,), "float64"), ("x1", (3,), "float64")],
                      [Line("v0", "xp.abs(x0)", ("zero", ("x0",), {})),
                       Line("v1", "xp.maximum(v0, x1)", ("tie", ("v0", "x1"), {})),
                       Line("v2", "xp.max(v1, axis=None, keepdims=False)", ("max", ("v1",), {"axis": None})),
                       Line("v3", "xp.exp(v2 * 5.0)")], ["v3"])
    x1 = np.array([0.1, 0.2, 0.3])
    assert program.check_point([np.array([0.5, -0.7, 0.2]), x1]) is None
    assert "v0 = xp.abs(x0)" in program.check_point([np.array([0.001, -0.7, 0.2]), x1])
    assert "v1 = xp.maximum(v0, x1)" in program.check_point([np.array([0.5, -0.7, 0.305]), x1])
    assert "v2 = xp.max" in program.check_point([np.array([0.5, -0.505, 0.2]), x1])
    assert "magnitude" in program.check_point([np.array([0.5, -0.7, 1.5]), x1])


def test_failing_program_prints_as_python():
    @settings(max_examples=200, derandomize=True, database=None, print_blob=False)
    @given(ust.program_cases())
    def no_tanh(case):
        assert "xp.tanh(" not in case.program.source()

    with pytest.raises(AssertionError) as info:
        no_tanh()
    report = "\n".join(getattr(info.value, "__notes__", [])) + str(info.value)
    assert "def f(x0):" in report and "v0 = xp.tanh(x0)" in report, report
    assert "x0 = np.array(" in report


@settings(max_examples=examples(5))
@given(ust.program_cases(max_ops=3))
def test_check_program_on_the_tape(case):
    check_program(case, backend="numpy", order=1)


def test_program_case_unpacks():
    program = Program([("x0", (), "float64")], [Line("v0", "xp.sin(x0)")], ["v0"])
    case = ProgramCase(program, (np.array(0.5),))
    p, xs = case
    assert p is program and xs[0] == 0.5
    np.testing.assert_allclose(program(np.array(0.5)), np.sin(0.5))


def test_zero_size_input_prints_with_its_shape():
    # a float64[0, 2] input printed as np.array([], dtype=np.float64): the pasted reproducer lost the shape
    program = Program([("x0", (0, 2), "float64")], [Line("v0", "xp.sum(xp.sin(x0), axis=0)")], ["v0"])
    case = ProgramCase(program, (np.zeros((0, 2)),))
    namespace = {"unigrad": unigrad, "np": np}
    exec(repr(case), namespace)  # noqa: S102
    assert namespace["x0"].shape == (0, 2)
    assert namespace["f"](namespace["x0"]).shape == (2,)


def test_inconclusive_point_is_redrawn_not_failed():
    # remainder exactly on its jump: finite differences cannot decide there; inside hypothesis the
    # point is rejected (re-drawn), outside it the distinct exception says so
    program = Program([("x0", (2,), "float64")], [Line("v0", "xp.remainder(x0, 1.0)")], ["v0"])
    case = ProgramCase(program, (np.array([2.0, 0.5]),))
    with pytest.raises(FiniteDifferencesInconclusive):
        check_program(case, backend="numpy", reference=None)
    seen = []

    @settings(max_examples=5, database=None, derandomize=True)
    @given(st.integers(0, 3))
    def search(k):
        seen.append(k)
        check_program(case, backend="numpy", reference=None)

    from hypothesis.errors import Unsatisfiable

    with pytest.raises(Unsatisfiable):  # every draw rejected: none failed
        search()
    assert seen
