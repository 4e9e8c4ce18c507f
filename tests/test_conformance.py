"""The conformance suite (unigrad.testing.conformance) on every installed backend (--unigrad-backends),
and proof that it can fail: deliberately broken backends are caught, an unknown backend fails the run,
and ``coverage_report`` gives the per-op table."""

import os
import pathlib
import subprocess
import sys

import pytest

from unigrad.testing.conformance import *  # noqa: F401,F403
from unigrad.testing import conformance

from conftest import BUGS, CONFORMANCE_BUGS, make_broken_backend, skip_unless

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The per-op tests on JAX compile each operation for each case's shapes in eager mode (seconds an op), and the
# derivatives of jax.numpy's own functions are JAX's: the default run keeps on JAX the ops unigrad's JAX namespace
# overrides (abs, clip, pow, linalg.vector_norm) and a representative of each kind (smooth unary, piecewise,
# complex parts, broadcasting binary, reductions, scans, each decomposition, each manipulation family, indexing,
# sort); the ops below run on JAX in the thorough job (marker slow, through conftest's SLOW_CASES). Every op still
# runs on the tape, torch, TensorFlow and the autograd plugin by default.
JAX_THOROUGH_OPS = (
    "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "expm1", "log1p", "log2", "log10", "negative",
    "positive", "sinh", "square", "tan", "ceil", "trunc", "round", "imag",  # smooth or piecewise unary: JAX's own
    "subtract", "multiply", "hypot",  # add, divide, atan2, maximum, remainder keep binary ops and broadcasting
    "mean", "min", "std", "cumulative_sum",  # sum, max, var, cumulative_prod stay
    "matrix_transpose", "linalg.diagonal", "linalg.outer", "linalg.trace",
    # decompositions: cholesky, eigh, svdvals, det, solve and matrix_norm stay
    "linalg.svd", "linalg.eigvalsh", "linalg.qr", "linalg.pinv", "linalg.inv", "linalg.slogdet",
    "expand_dims", "squeeze", "permute_dims", "moveaxis", "flip", "stack", "triu",
    "logaddexp", "copysign", "minimum", "linalg.matrix_power", "linalg.cross", "tensordot",
)
assert len(set(JAX_THOROUGH_OPS)) == len(JAX_THOROUGH_OPS)
# TensorFlow's namespace is unigrad's own, and tests/test_backend_tensorflow.py checks it op by op (values against
# NumPy, gradients against the tape): of the per-op conformance cases on TensorFlow, the slowest ops that test
# also checks run in the thorough job; every other op, all the other decompositions included, stays here.
TF_THOROUGH_OPS = ("linalg.pinv", "linalg.cholesky", "hypot", "std", "minimum", "prod", "linalg.matrix_norm")
# Every nesting of three modes over a custom rule on TensorFlow: nested eager tapes and pfor, 75-85 s a rule kind on
# 2 CPU cores (the other backends take 5 s together): in the thorough job.
SLOW_CASES = ({f"test_op[jax-{op}]" for op in JAX_THOROUGH_OPS}
              | {f"test_op[tensorflow-{op}]" for op in TF_THOROUGH_OPS}
              | {f"test_custom_rules_third_derivatives_in_every_nesting[tensorflow-{kind}]"
                 for kind in ("custom_vjp", "custom_jvp")})
assert set(JAX_THOROUGH_OPS + TF_THOROUGH_OPS) <= set(conformance._BY_NAME)

# bug -> the ops of the suite that must catch it
CAUGHT_BY = {"where_broadcast": ["where"], "inv_no_jvp": ["linalg.inv"], "det_vjp_transposed": ["linalg.det"],
             "sin_scale": ["sin"], "matmul_transposed": ["matmul"], "broadcast_sum": ["multiply"],
             "second_derivative": ["sin"]}


def _env(extra_path=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), str(ROOT), str(ROOT / "backends"),
                                         env.get("PYTHONPATH", "")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


@pytest.mark.parametrize("bug", CONFORMANCE_BUGS + BUGS)
def test_conformance_catches_a_broken_backend(bug, register_backend):
    cls = make_broken_backend(bug)
    name = register_backend(cls.name, cls)
    for op_name in CAUGHT_BY[bug]:
        for fast in (True, False):
            rows = conformance.run_op(name, conformance._BY_NAME[op_name], fast=fast)
            assert any(r.verdict in ("fail", "error") for r in rows), conformance.coverage_table(rows, f"{bug} fast={fast}")
        # the same op on the real tape passes
        assert all(r.verdict == "pass" for r in conformance.run_op("numpy", conformance._BY_NAME[op_name]))
    if bug == "where_broadcast":  # only the broadcasting cases are wrong; the others pass
        rows = conformance.run_op(name, conformance._BY_NAME["where"])
        assert {r.case for r in rows if r.verdict == "fail"} == {"2x3 3 2x1"}, conformance.coverage_table(rows)


def _broken_plugin(tmp_path, bug):
    (tmp_path / "broken_plugin.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import unigrad\n"
        "from conftest import make_broken_backend\n"
        f"cls = make_broken_backend({bug!r})\n"
        "unigrad.register_backend(cls.name, cls)\n")


def _pytest(tmp_path, *args):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
               "unigrad.testing.conformance", *args]
    return subprocess.run(command, cwd=tmp_path, env=_env([tmp_path]), capture_output=True, text=True, timeout=600)


def test_the_suite_fails_a_broken_plugin_backend(tmp_path):
    # as a plugin author runs it: pytest --pyargs unigrad.testing.conformance --unigrad-backends=NAME
    _broken_plugin(tmp_path, "where_broadcast")
    result = _pytest(tmp_path, "-p", "broken_plugin", "--unigrad-backends=broken_where_broadcast",
                     "-k", "test_op and (where or sin or matmul)")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "FAILED" in out and "test_op[broken_where_broadcast-where]" in out, out
    assert "3 passed" in out or "passed" in out  # sin and matmul pass: only where is wrong


@pytest.mark.parametrize("name", ["nmupy", "pytorch"])
def test_an_unknown_backend_fails_the_run(tmp_path, name):
    result = _pytest(tmp_path, f"--unigrad-backends={name}", "-k", "test_unused_input_gets_zeros")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out  # before: "1 skipped", exit 0
    assert "does not load" in out and name in out, out
    assert "skipped" not in out.splitlines()[-1], out


def test_coverage_report():
    table, ok = conformance.coverage_report("numpy")
    assert ok, table
    assert table.splitlines()[0].startswith("unigrad conformance: backend 'numpy'")
    for op in conformance.OPS:  # every op has a row, with its verdicts
        assert f"\n{op.name} " in table, op.name
    for column in ("JVP", "VJP", "FD", "tape", "verdict"):
        assert column in table.splitlines()[1]
    assert table.rstrip().endswith("overall: PASS")


def test_coverage_report_fails_a_broken_backend(register_backend):
    cls = make_broken_backend("inv_no_jvp")
    name = register_backend(cls.name, cls)
    table, ok = conformance.coverage_report(name)
    assert not ok
    assert table.rstrip().endswith("overall: FAIL")
    assert "linalg.inv" in table and "fail" in table


def test_coverage_report_of_an_unknown_backend_raises():
    with pytest.raises(ValueError, match="nmupy"):
        conformance.coverage_report("nmupy")


# ------------------------------------------------------------------ what test_op reports

def _row(verdict, **kw):
    return conformance.CaseResult("sin", "elementwise", "3", "float64", 1, verdict=verdict, **kw)


def test_an_inconclusive_case_is_a_skip_with_its_reason():
    rows = [_row("pass"), _row("inconclusive", message="no stable estimate: kink inside the step")]
    with pytest.raises(pytest.skip.Exception, match="finite differences inconclusive.*kink inside the step"):
        conformance._conclude(rows, "sin", "numpy")
    conformance._conclude([_row("pass")], "sin", "numpy")  # all pass: no outcome raised
    with pytest.raises(pytest.fail.Exception):  # a failure beside an inconclusive case still fails
        conformance._conclude(rows + [_row("fail")], "sin", "numpy")


def test_a_failure_names_the_backend_finite_differences_contradict(monkeypatch):
    # the tape itself wrong by 0.1 % in sin: torch's rows fail against the tape, and the failure says that
    # finite differences contradict the tape, not torch
    skip_unless("torch")
    from unigrad.tape import _primitives as P

    cos = P.cos
    monkeypatch.setattr(P.sin, "vjps", (lambda g, ans, x: g * (cos(x) * 1.001),))
    monkeypatch.setattr(P.sin, "jvps", (lambda t, ans, x: t * (cos(x) * 1.001),))
    rows = conformance.run_op("torch", conformance._BY_NAME["sin"], fast=True)
    failed = [r for r in rows if r.verdict == "fail"]
    # (at float32, finite differences are too coarse to contradict 0.1 %: such a row names no one)
    assert any(r.fd_disagrees == ("numpy",) for r in failed), conformance.coverage_table(rows)
    assert not any("torch" in r.fd_disagrees for r in rows), conformance.coverage_table(rows)
    with pytest.raises(pytest.fail.Exception, match=r"disagrees with finite differences: numpy \(the tape"):
        conformance._conclude(rows, "sin", "torch")
    tape_rows = conformance.run_op("numpy", conformance._BY_NAME["sin"])
    assert any(r.verdict == "fail" for r in tape_rows)  # and the tape's own test fails
