"""Random portable programs: the strategies themselves, check_grads on the NumPy tape, and every
installed backend against the others (``compare``) on the same programs.

Examples per test come from the hypothesis profile (tests/conftest.py): ``ci`` by default,
``UNIGRAD_HYPOTHESIS_PROFILE=thorough`` for a long run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings

import unigrad
from unigrad.testing import Program, ProgramCase, assert_backends_agree, check_grads, check_program
from unigrad.testing import strategies as ust
from unigrad.testing._programs import Line

# ---------------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------------


@given(ust.program_cases())
def test_tape_first_order(case):
    check_grads(case.program, case.inputs, order=1)


@given(ust.program_cases(max_ops=3))
def test_tape_second_order(case):
    check_grads(case.program, case.inputs, order=2)


@given(ust.program_cases(max_ops=3, dtype="complex128"))
def test_tape_complex(case):
    check_grads(case.program, case.inputs, order=1)


@given(ust.program_cases(max_ops=4))
def test_backends_agree(unigrad_backends, case):
    assert_backends_agree(case.program, case.inputs, backends=unigrad_backends, argnums="all")


@settings(max_examples=4)
@given(ust.program_cases(max_ops=3, dtype="float32"))
def test_backends_agree_float32(unigrad_backends, case):
    assert_backends_agree(case.program, case.inputs, backends=unigrad_backends, argnums="all")


@settings(max_examples=4)
@given(ust.program_cases(max_ops=3, dtype="complex128"))
def test_backends_agree_complex(unigrad_backends, case):
    complex_ok = [b for b in unigrad_backends if unigrad.get_backend(b).capabilities.complex]
    assert_backends_agree(case.program, case.inputs, backends=complex_ok, argnums="all")


@settings(max_examples=3)
@given(ust.program_cases(max_ops=2, max_side=2))
def test_backends_agree_second_order(unigrad_backends, case):
    nesting = [b for b in unigrad_backends if unigrad.get_backend(b).capabilities.higher_order]
    assert_backends_agree(case.program, case.inputs, backends=nesting, argnums="all", order=2, jacobian=False)


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


@given(ust.arrays(ust.shapes(max_side=3), ust.dtypes(complex=True), elements=(-1.0, 1.0), margin=0.1))
def test_arrays_domain_dtype_and_kinks(x):
    assert x.dtype.name in ("float64", "float32", "complex128", "complex64")
    parts = [x.real, x.imag] if np.iscomplexobj(x) else [x]
    for p in parts:
        assert np.all(np.abs(p) <= 1.0 + 1e-6)
        assert np.all(np.abs(p) >= 0.1 - 1e-6)  # away from the kink at 0
    if x.size > 1 and not np.iscomplexobj(x):
        gaps = np.diff(np.sort(x.ravel().astype(np.float64)))
        assert gaps.min() > 0.05  # no near-ties


def test_programs_shrink_to_one_line():
    program = find(ust.programs(), lambda p: "xp.matmul(" in p.source())
    assert len(program) == 1
    assert program.lines[0].expr == "xp.matmul(x0, x0)"
    assert program.inputs == (("x0", (2,), "float64"),)  # the smallest shape matmul takes: a vector of side 2
    program = find(ust.programs(), lambda p: "xp.exp(" in p.source())
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


@settings(max_examples=5)
@given(ust.program_cases(max_ops=3))
def test_check_program_on_the_tape(case):
    check_program(case, backend="numpy", order=1)


def test_program_case_unpacks():
    program = Program([("x0", (), "float64")], [Line("v0", "xp.sin(x0)")], ["v0"])
    case = ProgramCase(program, (np.array(0.5),))
    p, xs = case
    assert p is program and xs[0] == 0.5
    np.testing.assert_allclose(program(np.array(0.5)), np.sin(0.5))
