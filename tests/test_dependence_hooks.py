"""The one analysis of traced programs, read through ``Backend.dependence_program``: a backend's own front-end
gives sparsity patterns and row proofs for code written in its framework, and a plugin gets the same by
building :class:`unigrad.dependence.Program` itself from the public API. The core names no framework: no
module under ``unigrad/`` imports torch, jax or tensorflow, at module level or inside a function, and
importing every one of them loads none."""

from __future__ import annotations

import json
import pathlib
import pkgutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

import unigrad
from unigrad.dependence import Node, Program, Rule, SparsityWarning, register_rules

from conftest import framework_imports, skip_unless

FRAMEWORKS = ("torch", "jax", "tensorflow")
ROOT = pathlib.Path(unigrad.__file__).parent


def _banded(n):
    return (np.eye(n - 1, n) + np.eye(n - 1, n, k=1)).astype(int)


@pytest.mark.parametrize("bk", ["torch", "tensorflow"])
def test_framework_native_code_gets_an_exact_pattern(bk):
    """torch- and TensorFlow-native f (their own operations: the tape cannot trace them) are read from their
    ATen graph / tf.function graph; the pattern was dense before."""
    fw = skip_unless(bk)
    skip_unless("scipy")
    x = np.linspace(0.1, 1.0, 5)
    if bk == "torch":
        xb = fw.tensor(x)

        def f(x):
            return fw.sin(x[1:]) * x[:-1]
    else:
        xb = fw.constant(x)

        def f(x):
            return fw.sin(x[1:]) * x[:-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SparsityWarning)  # exact: no widening
        pattern = unigrad.jacobian_sparsity(f, xb)
    np.testing.assert_array_equal(pattern.toarray().astype(int), _banded(5))
    got = unigrad.sparse_jacobian(f, format="dense")(xb)
    np.testing.assert_allclose(unigrad.to_numpy(got), unigrad.to_numpy(unigrad.jacobian(f)(xb)), rtol=1e-12)
    assert unigrad.sparse_jacobian(f).plan(xb).n_colors == 2


# ------------------------------------------------------------------------------ a plugin's own front-end

class _Opaque:
    """A value the NumPy tape cannot trace through (its own 'framework' operation)."""


def _hand_erf(x):
    """An operation of the plugin's engine: applied to a tape tracer it raises (the tape cannot read it)."""
    if not isinstance(x, np.ndarray):
        raise TypeError("handmade: erf takes the engine's arrays only")
    from math import erf

    return np.vectorize(erf)(x)


def _handmade_backend(calls, op):
    """A tape subclass standing for a plugin whose code the tape cannot trace, with a front-end that builds
    its program by hand: one node ``hand.<op>`` from the input to the output."""
    from unigrad.tape import NumpyBackend

    register_rules("hand.", {"erf": Rule("elementwise", "nonlinear")})

    class Handmade(NumpyBackend):
        name = "handmade"
        array_modules = ()

        def dependence_program(self, f, primals, *, has_aux=False, unknown=()):
            calls.append(f)
            shape = tuple(primals[0].shape)
            node = Node(f"hand.{op}", _hand_erf, [primals[0]], {0: 0}, {}, [1], [shape])
            return Program([0], [shape], [node], [1], [shape])

    return Handmade


@pytest.mark.parametrize("op", ["erf", "mystery"])
def test_a_plugin_front_end_gives_patterns_and_row_proofs(register_backend, op):
    """A plugin's dependence_program, built from the public unigrad.dependence API alone, is what
    jacobian_sparsity and batched_jacobian's proof read where the tape cannot trace f; an operation without
    a rule widens (dense, with the reason) and the proof then answers unknown (the probe decides)."""
    skip_unless("scipy")
    calls = []
    register_backend("handmade", _handmade_backend(calls, op))

    def f(x):
        return _hand_erf(x)

    x = np.linspace(-1.0, 1.0, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pattern = unigrad.jacobian_sparsity(f, x, backend="handmade")
    assert calls, "the plugin's dependence_program was not read"
    if op == "erf":
        np.testing.assert_array_equal(pattern.toarray(), np.eye(4, dtype=bool))
        assert pattern.reasons == ()
    else:
        assert pattern.toarray().all() and any("hand.mystery" in r or "mystery" in r for r in pattern.reasons)
        assert any(issubclass(w.category, SparsityWarning) for w in seen)
    calls.clear()
    from unigrad import _batched

    call = _batched.prepare(_batched.BoundedCache(_batched.PLANS, 0), f, (x.reshape(4, 1),), 0, False, "handmade",
                            "batched_jacobian")
    verdict, _, _, _, _ = _batched.prove_independence(call, 4, False, 0, _batched.Proofs(0))
    assert calls and verdict == ("row" if op == "erf" else "unknown")


# ------------------------------------------------------------------------------ the core names no framework

#: unigrad.testing measures the frameworks themselves (their own relu at a kink, torch's global no-grad mode):
#: it imports them inside the functions that do, never when it is imported (the next test)
VALIDATION = ROOT / "testing"


def test_no_core_module_imports_a_framework():
    offenders = {str(p.relative_to(ROOT.parent)): found for p in sorted(ROOT.rglob("*.py"))
                 if VALIDATION not in p.parents and (found := framework_imports(p))}
    assert not offenders, f"framework imports in the core (they belong in backends/): {offenders}"


def test_the_scan_catches_each_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import sys\nimport torch\nfrom jax import numpy\n\ndef f():\n    import tensorflow as tf\n"
                      "    __import__('torch.nn')\n    importlib.import_module('jax')\n    return sys.modules['torch']\n")
    assert sorted(m for _, m in framework_imports(sample)) == ["jax", "jax", "tensorflow", "torch", "torch",
                                                                 "torch.nn"]


def test_importing_every_core_module_loads_no_framework():
    modules = sorted(m.name for m in pkgutil.walk_packages([str(ROOT)], prefix="unigrad.")
                     if m.name != "unigrad.__main__")  # (runs the command line)
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(json.dumps(sorted(m for m in {list(FRAMEWORKS)!r} if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []
    assert "unigrad.dependence._rows" in modules and "unigrad.per_example._transform" in modules
