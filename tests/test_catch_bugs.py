"""Every checker can fail: backends with deliberately wrong derivatives are caught by check_grads,
by compare / assert_backends_agree, by the random-program search and by ``unigrad check``.

The broken backends (tests/conftest.py) are the NumPy tape with one rule changed:
``sin_scale`` (d sin off by 1e-3 relative), ``matmul_transposed`` (VJP of matmul uses b, not b^T),
``broadcast_sum`` (VJP of multiply takes the first row of a broadcast axis instead of summing it),
``second_derivative`` (first derivatives right, second derivatives wrong).
"""

from __future__ import annotations

import functools
import io
import inspect

import numpy as np
import pytest
from hypothesis import Phase, given, settings

import unigrad
from unigrad._cli import main
from unigrad.testing import (AGREE, DISAGREE, GradientCheckError, assert_backends_agree, check_grads,
                             check_program, compare)
from unigrad.testing import strategies as ust


def f_sin(x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x) * x)


def f_matmul(a, b):
    xp = unigrad.namespace(a, b)
    return xp.tanh(xp.matmul(a, b))


def f_multiply(a, b):
    xp = unigrad.namespace(a, b)
    return xp.multiply(a, b)


RNG = np.random.default_rng(42)
# bug -> (function, arguments, order needed, the quantities compare must flag against finite differences)
CASES = {
    "sin_scale": (f_sin, (RNG.standard_normal(4),), 1, {"jvp", "vjp", "jacobian"}),
    # (more inputs than outputs: the Jacobian is computed in reverse mode, so it is wrong too)
    "matmul_transposed": (f_matmul, (RNG.standard_normal((3, 3)), RNG.standard_normal((3, 3))), 1,
                          {"vjp", "transpose", "jacobian"}),
    "broadcast_sum": (f_multiply, (RNG.standard_normal((3, 4)), RNG.standard_normal((1, 4))), 1,
                      {"vjp", "transpose", "jacobian"}),
    "second_derivative": (f_sin, (RNG.standard_normal(4),), 2, {"second"}),
}
BUGS = list(CASES)


@pytest.mark.parametrize("broken_backend", BUGS, indirect=True)
def test_the_broken_backend_computes_right_values(broken_backend):
    # the bugs are in derivatives only: a value check alone would pass
    f, args, _, _ = CASES[broken_backend.removeprefix("broken_")]
    for backend in ("numpy", broken_backend):
        np.testing.assert_allclose(unigrad.to_numpy(unigrad.vjp(f, *args, backend=backend)[0]),
                                   unigrad.to_numpy(f(*args)), rtol=1e-15)


@pytest.mark.parametrize("broken_backend", BUGS, indirect=True)
def test_check_grads_catches(broken_backend):
    bug = broken_backend.removeprefix("broken_")
    f, args, order, _ = CASES[bug]
    check_grads(f, args, order=order)  # the real tape passes
    with pytest.raises(GradientCheckError) as info:
        check_grads(f, args, order=order, backend=broken_backend)
    message = str(info.value)
    assert broken_backend in message
    expected_check = {"sin_scale": "JVP check", "matmul_transposed": "VJP check", "broadcast_sum": "VJP check",
                      "second_derivative": "JVP of JVP check"}[bug]
    assert expected_check in message
    if bug == "second_derivative":
        check_grads(f, args, order=1, backend=broken_backend)  # first derivatives are right
    if bug in ("matmul_transposed", "broadcast_sum"):
        # the JVP is right: forward mode alone passes, reverse mode alone fails
        check_grads(f, args, order=1, modes=("fwd",), backend=broken_backend)
        with pytest.raises(GradientCheckError, match="VJP check failed for argument"):
            check_grads(f, args, order=1, modes=("rev",), backend=broken_backend)


@pytest.mark.parametrize("broken_backend", BUGS, indirect=True)
def test_compare_catches(broken_backend):
    bug = broken_backend.removeprefix("broken_")
    f, args, order, flagged = CASES[bug]
    report = compare(f, args, backends=["numpy", broken_backend], argnums="all", order=order)
    assert report.verdict == DISAGREE and not report.ok
    assert report["numpy"].verdict == AGREE
    broken = report[broken_backend]
    assert broken.verdict == DISAGREE
    failed_fd = {c.quantity for c in broken.checks if c.status == "fail" and c.against in ("fd", "self")}
    assert failed_fd == flagged
    failed_pairwise = {c.quantity for c in broken.checks if c.status == "fail" and c.against == "numpy"}
    assert failed_pairwise and failed_pairwise <= {"jvp", "vjp", "jacobian", "second"}
    assert "value" not in failed_pairwise
    table = report.table()
    assert f"{broken_backend}  " in table and "DISAGREE" in table
    with pytest.raises(AssertionError) as info:
        assert_backends_agree(f, args, backends=["numpy", broken_backend], argnums="all", order=order)
    assert broken_backend in str(info.value) and "overall: DISAGREE" in str(info.value)


@pytest.mark.parametrize("broken_backend", BUGS, indirect=True)
def test_compare_blames_the_broken_reference_not_the_others(broken_backend):
    bug = broken_backend.removeprefix("broken_")
    f, args, order, _ = CASES[bug]
    report = compare(f, args, backends=[broken_backend, "numpy"], argnums="all", order=order,
                     reference=broken_backend)
    assert report[broken_backend].verdict == DISAGREE
    assert report["numpy"].verdict == AGREE


# The random-program search: the strategies and checks of tests/test_programs.py (check_program:
# check_grads on the backend, then compare with the NumPy tape), against a broken backend, with a
# fixed seed. It must find a failing program and shrink it to a small one that names the culprit.
@pytest.mark.parametrize("broken_backend", BUGS, indirect=True)
def test_program_search_catches(broken_backend):
    bug = broken_backend.removeprefix("broken_")
    order = CASES[bug][2]
    failures = []

    @settings(max_examples=500, derandomize=True, database=None, deadline=None, print_blob=False)
    @given(ust.program_cases(max_ops=4))
    def search(case):
        try:
            check_program(case, backend=broken_backend, reference="numpy", order=order)
        except Exception:
            failures.append(case)
            raise

    with pytest.raises(Exception):
        search()
    assert failures, "the search found no failing program"
    minimal = failures[-1]  # hypothesis replays the shrunk example last
    source = minimal.program.source()
    culprit = {"sin_scale": "xp.sin(", "second_derivative": "xp.sin(", "matmul_transposed": "xp.matmul(",
               "broadcast_sum": "xp.multiply("}[bug]
    assert culprit in source, source
    assert len(minimal.program) <= 2, source
    # the shrunk program fails on the broken backend and passes on the real one
    with pytest.raises(AssertionError):
        check_program(minimal, backend=broken_backend, order=order)
    check_program(minimal, backend="numpy", order=order)


MODULE = "import unigrad\n\n\n" + "\n\n".join(inspect.getsource(f) for f in (f_sin, f_matmul, f_multiply))


@pytest.mark.parametrize("broken_backend", BUGS, indirect=True)
def test_cli_check_catches(broken_backend, tmp_path):
    bug = broken_backend.removeprefix("broken_")
    path = tmp_path / "functions.py"
    path.write_text(MODULE)
    target, shapes = {"sin_scale": ("f_sin", ["4"]), "second_derivative": ("f_sin", ["4"]),
                      "matmul_transposed": ("f_matmul", ["3,3", "3,3"]),
                      "broadcast_sum": ("f_multiply", ["3,4", "1,4"])}[bug]
    order = CASES[bug][2]
    argv = ["check", f"{path}:{target}", "--shapes", *shapes, "--backends", f"numpy,{broken_backend}",
            "--order", str(order)]
    out = io.StringIO()
    assert main(argv + ["--backends", "numpy"], out=io.StringIO()) == 0  # the real tape alone passes
    assert main(argv, out=out) == 1
    text = out.getvalue()
    transform = {"sin_scale": "JVP:", "second_derivative": "JVP of VJP:", "matmul_transposed": "VJP:",
                 "broadcast_sum": "VJP:"}[bug]
    assert f"{broken_backend} {transform}" in text, text
    assert "overall: DISAGREE" in text


# The bulk random-program run of tests/test_programs.py (check_programs_across: finite differences on
# the tape, every backend against the tape in batches, a differing program re-run through compare)
# and its per-case form (check_program_across, to second order): both must catch every bug.
@pytest.mark.parametrize("broken_backend", BUGS, indirect=True)
def test_bulk_program_run_catches(broken_backend):
    from unigrad.testing import check_program_across, check_programs_across

    bug = broken_backend.removeprefix("broken_")
    if bug == "second_derivative":  # first derivatives are right: the second-order form must catch it
        @settings(max_examples=200, derandomize=True, database=None, deadline=None, print_blob=False,
                  phases=[Phase.generate])  # finding it is the point here; shrinking is tested above
        @given(ust.program_cases(max_ops=3, max_side=2))
        def search(case):
            check_program_across(case, ["numpy", broken_backend], order=2)

        with pytest.raises(AssertionError, match="JVP of VJP"):
            search()
        return
    cases = _bulk_cases()
    with pytest.raises(AssertionError) as info:
        check_programs_across(cases, ["numpy", broken_backend])
    assert broken_backend in str(info.value) and "overall: DISAGREE" in str(info.value)


@functools.lru_cache(maxsize=1)
def _bulk_cases():
    """300 programs drawn once (derandomized) for every bug, checked once on the real tape."""
    from unigrad.testing import check_programs_across

    cases = []

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(ust.program_cases(max_ops=4, max_dims=2, max_side=3))
    def draw(case):
        cases.append(case)

    draw()
    assert check_programs_across(cases, ["numpy"])["compared"] >= 290  # the real tape passes
    return tuple(cases)
