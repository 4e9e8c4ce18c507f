"""``--unigrad-devices``: the backend tests (the ``backend`` fixture, the conformance suite, modules
marked ``unigrad_backend``) run once per device named, inside ``unigrad.use_device``; a backend without
the device is skipped with the reason. This machine may have no GPU: a pretend backend that lists
``cuda:0`` stands in for one, and the real suite's selection is read from ``--collect-only``."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import unigrad

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[1]

INNER = '''
import numpy as np
import pytest
import unigrad
from unigrad import _registry
from unigrad.tape import NumpyBackend


class PretendGPU(NumpyBackend):
    name = "pretend_gpu"
    array_modules = ()

    def devices(self):
        return ("cpu", "cuda:0")

    def asarray(self, x, dtype=None, device=None):
        return NumpyBackend.asarray(self, x, dtype=dtype)


unigrad.register_backend("pretend_gpu", PretendGPU, replace=True)


def test_backend_runs_on_the_device(backend, unigrad_device):
    assert _registry.current_device() == unigrad_device  # every transform places its inputs there
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x * x), backend=backend)
    assert list(unigrad.to_numpy(g(np.array([1.0, 2.0])))) == [2.0, 4.0]


@pytest.mark.unigrad_backend("numpy")
def test_marked_module_test(unigrad_device):
    assert _registry.current_device() == unigrad_device
'''


@pytest.fixture
def inner(pytester):
    pytester.makepyfile(test_inner=INNER)
    yield pytester
    unigrad.unregister_backend("pretend_gpu")


def _outcomes(result):
    return {k: v for k, v in result.parseoutcomes().items() if k in ("passed", "skipped", "failed", "errors")}


def test_default_runs_each_test_once_with_no_device(inner):
    result = inner.runpytest("-p", "no:cacheprovider", "--unigrad-backends=numpy,pretend_gpu", "-v")
    assert _outcomes(result) == {"passed": 3}, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_backend_runs_on_the_device?numpy? PASSED*",
                                 "*test_backend_runs_on_the_device?pretend_gpu? PASSED*",
                                 "*test_marked_module_test PASSED*"])


def test_cuda_selects_device_tests_and_skips_backends_without_one(inner):
    result = inner.runpytest("-p", "no:cacheprovider", "--unigrad-backends=numpy,pretend_gpu",
                             "--unigrad-devices=cuda", "-v", "-rs")
    assert _outcomes(result) == {"passed": 1, "skipped": 2}, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*test_backend_runs_on_the_device?numpy-cuda? SKIPPED*",
        "*test_backend_runs_on_the_device?pretend_gpu-cuda? PASSED*",
        "*test_marked_module_test?cuda? SKIPPED*",
    ])
    result.stdout.fnmatch_lines(["SKIPPED*backend 'numpy' has no device 'cuda' here (its devices: cpu)*"])


def test_cpu_and_cuda_run_each_test_on_both(inner):
    result = inner.runpytest("-p", "no:cacheprovider", "--unigrad-backends=numpy,pretend_gpu",
                             "--unigrad-devices=cpu,cuda:0", "-v")
    assert _outcomes(result) == {"passed": 4, "skipped": 2}, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_backend_runs_on_the_device?pretend_gpu-cuda:0? PASSED*"])


def test_the_suite_on_cuda_selects_the_conformance_and_backend_tests():
    """What ``pytest --unigrad-devices=cuda`` collects from the project's own suite: each conformance
    test and each test of a backend module once per device."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         "--unigrad-backends=numpy", "--unigrad-devices=cpu,cuda", str(ROOT / "tests" / "test_conformance.py"),
         str(ROOT / "tests" / "test_backend_torch.py"), "-k", "test_op and sin or test_unused or test_grad"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600).stdout
    ids = [line for line in out.splitlines() if "::" in line]
    assert "tests/test_conformance.py::test_op[numpy-cuda-sin]" in ids, out[-3000:]
    assert "tests/test_conformance.py::test_op[numpy-cpu-sin]" in ids, out[-3000:]
    assert "tests/test_conformance.py::test_unused_input_gets_zeros[numpy-cuda]" in ids, out[-3000:]
    torch_ids = [i for i in ids if i.startswith("tests/test_backend_torch.py")]
    if unigrad.backends().get("torch", {}).get("available"):
        on = {d: [i for i in torch_ids if f"[{d}]" in i or f"[{d}-" in i] for d in ("cpu", "cuda")}
        assert torch_ids and len(on["cpu"]) == len(on["cuda"]) == len(torch_ids) / 2, torch_ids[:6]
