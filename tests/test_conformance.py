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

from conftest import BUGS, CONFORMANCE_BUGS, make_broken_backend

ROOT = pathlib.Path(__file__).resolve().parents[1]
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
