"""compare / assert_backends_agree: verdicts, kinks, errors, dtypes, devices and the renderings.

Most tests compare the NumPy tape with variants of itself (registered for the test), so each
verdict is known exactly; test_all_installed_backends_agree runs every installed backend.
"""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

import unigrad
from unigrad.tape import NumpyBackend
from unigrad.tape import _namespace as tape_xp
from unigrad.tape import _primitives as P
from unigrad.tape._core import Primitive
from unigrad.testing import (AGREE, CONVENTION, DISAGREE, Comparison, assert_backends_agree, compare)


def loss(params, x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.tanh(xp.matmul(x, params["w"]) + params["b"]) ** 2)


def relu(x):
    xp = unigrad.namespace(x)
    return xp.maximum(x, xp.zeros_like(x))


def sin_sum(x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x) * x)


RNG = np.random.default_rng(7)
PARAMS = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}
X = RNG.standard_normal((4, 3))


def backend_with(name, **namespace_overrides):
    """A NumpyBackend subclass called ``name`` whose namespace overrides some functions."""
    ns = types.ModuleType(f"namespace_{name}")
    ns.__dict__.update({k: v for k, v in vars(tape_xp).items() if not k.startswith("__")})
    ns.__dict__.update(namespace_overrides)
    return type(name, (NumpyBackend,), {"name": name, "array_modules": (), "namespace": lambda self: ns})


def maximum_with_tie_weight(weight):
    """maximum whose derivative at a tie goes ``weight`` to x1 and ``1 - weight`` to x2."""
    def wx(x, y):
        xv, yv = P.concrete(x), P.concrete(y)
        return np.where(xv == yv, weight, np.where(xv > yv, 1.0, 0.0)).astype(np.result_type(xv, yv))

    prim = Primitive("maximum", np.maximum,
                     vjps=(lambda g, ans, x, y: g * wx(x, y), lambda g, ans, x, y: g * (1 - wx(x, y))),
                     jvps=(lambda t, ans, x, y: t * wx(x, y), lambda t, ans, x, y: t * (1 - wx(x, y))),
                     broadcasts=True)
    return lambda x1, x2, /: prim(tape_xp._arr(x1), tape_xp._arr(x2))


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------

def test_all_installed_backends_agree(unigrad_backends):
    report = compare(loss, (PARAMS, X), backends=unigrad_backends, argnums=(0, 1))
    assert report.verdict == AGREE, report.table()
    assert [r.label for r in report.results][0] == ("numpy" if "numpy" in unigrad_backends else unigrad_backends[0])
    for r in report.results:
        if not unigrad.get_backend(r.backend).capabilities.float64:
            # float64 inputs: a backend that computes none is left out, saying how to include it
            assert r.status == "skipped" and "float32" in r.message, (r.status, r.message)
            continue
        assert r.status == "ok" and r.verdict == AGREE
        assert set(r.times) == {"value", "jvp", "vjp", "jacobian"}
        assert all(t > 0 for t in r.times.values())
    # at float32 every backend is compared (float32's tolerances)
    report = compare(loss, (PARAMS, X), backends=unigrad_backends, argnums=(0, 1), dtype="float32")
    assert report.verdict == AGREE, report.table()
    assert all(r.status == "ok" and r.verdict == AGREE for r in report.results), report.table()


def test_clone_agrees_exactly_and_pairwise_errors_are_zero(register_backend):
    register_backend("clone", backend_with("clone"))
    report = compare(loss, (PARAMS, X), backends=["numpy", "clone"], argnums=(0, 1), order=2)
    assert report.ok and report.verdict == AGREE
    assert report.pairwise[("numpy", "clone")] == {"value": 0.0, "jvp": 0.0, "vjp": 0.0, "jacobian": 0.0,
                                                    "second": 0.0}
    clone = report["clone"]
    assert {(c.quantity, c.against) for c in clone.checks} >= {
        ("jvp", "fd"), ("vjp", "fd"), ("transpose", "self"), ("jacobian", "fd"), ("second", "fd"),
        ("value", "numpy"), ("jvp", "numpy"), ("vjp", "numpy"), ("jacobian", "numpy"), ("second", "numpy")}
    assert all(c.status == "ok" for c in clone.checks)
    assert max(c.error for c in clone.checks if c.against == "fd") < 1e-8
    # the arrays are there, flattened: one VJP per input leaf (b, w in key order, then x)
    assert [v.shape for v in clone.vjp] == [(2,), (3, 2), (4, 3)]
    assert clone.jacobian[0][1].shape == (3, 2)


def test_convention_difference_at_a_kink(register_backend):
    register_backend("relu_left", backend_with("relu_left", maximum=maximum_with_tie_weight(0.0)))
    x = np.array([0.0, 1.5, -0.5])
    report = compare(relu, (x,), backends=["numpy", "relu_left"])
    assert report.verdict == CONVENTION and report.ok
    assert report["numpy"].verdict == AGREE  # the tape's 1/2 at a tie is the central difference
    assert report["relu_left"].verdict == CONVENTION
    assert any("non-differentiable point" in line for line in report.reasons)
    assert "~" in report.table()
    assert_backends_agree(relu, (x,), backends=["numpy", "relu_left"])  # does not raise


def test_an_invalid_answer_at_a_kink_disagrees(register_backend):
    register_backend("relu_wild", backend_with("relu_wild", maximum=maximum_with_tie_weight(3.0)))
    x = np.array([0.0, 1.5, -0.5])
    report = compare(relu, (x,), backends=["numpy", "relu_wild"])
    assert report.verdict == DISAGREE
    assert report["relu_wild"].verdict == DISAGREE
    assert any("not between the one-sided derivatives" in line for line in report.reasons), report.table()


def test_near_a_kink_is_judged_by_one_sided_differences(register_backend):
    # 1e-5 from relu's kink: the central difference (step ~1e-3) straddles the kink, the one-sided
    # ones do not and agree with each other -- and with every correct backend
    register_backend("clone", backend_with("clone"))
    report = compare(relu, (np.array([1e-5, -1e-5, 0.5]),), backends=["numpy", "clone"])
    assert report.verdict == AGREE, report.table()


def test_convention_difference_in_second_order_at_a_kink():
    def absolute(x):
        return unigrad.namespace(x).abs(x)
    report = compare(absolute, (np.array([0.0, 1.0]),), backends=["numpy"], order=2)
    assert report.ok
    assert report["numpy"].check("second", "fd").status == "kink"


def test_a_backend_that_raises_is_an_error_not_a_crash(register_backend):
    class Raising(NumpyBackend):
        name = "raising"
        array_modules = ()

        def vjp(self, f, primals, *, has_aux=False):
            raise RuntimeError("no reverse mode today")

    register_backend("raising", Raising)
    report = compare(sin_sum, (np.linspace(-1, 1, 5),), backends=["numpy", "raising"])
    assert report.verdict == "error" and not report.ok
    assert report["raising"].status == "error"
    assert report["raising"].verdict == "error: RuntimeError in VJP"
    assert "VJP raised RuntimeError: no reverse mode today" in report["raising"].message
    assert report["numpy"].verdict == AGREE
    with pytest.raises(AssertionError, match="no reverse mode today"):
        assert_backends_agree(sin_sum, (np.linspace(-1, 1, 5),), backends=["numpy", "raising"])


def test_unknown_backend_is_reported():
    report = compare(sin_sum, (np.ones(3),), backends=["numpy", "no_such_backend"])
    assert report["no_such_backend"].status == "error"
    assert "unknown backend 'no_such_backend'" in report["no_such_backend"].message
    assert report.verdict == "error"


def test_a_missing_device_is_skipped():
    report = compare(sin_sum, (np.ones(3),), backends=["numpy"], devices=("cpu", "cuda:7"))
    assert [r.label for r in report.results] == ["numpy@cpu", "numpy@cuda:7"]
    skipped = report["numpy@cuda:7"]
    assert skipped.status == "skipped" and skipped.verdict.startswith("skipped: no device 'cuda:7'")
    assert report.verdict == AGREE


def test_wrong_dtype_breaks_the_contract(register_backend):
    class Float32Grads(NumpyBackend):
        name = "float32_grads"
        array_modules = ()

        def vjp(self, f, primals, *, has_aux=False):
            outputs, vjp_fn, aux = super().vjp(f, primals, has_aux=has_aux)
            return outputs, (lambda cts: tuple(np.asarray(c, dtype=np.float32) for c in vjp_fn(cts))), aux

    register_backend("float32_grads", Float32Grads)
    report = compare(sin_sum, (np.linspace(-1, 1, 5),), backends=["numpy", "float32_grads"])
    assert report["float32_grads"].verdict == DISAGREE
    assert any("has dtype float32; expected float64" in line for line in report.reasons), report.reasons


def test_a_wrong_value_disagrees(register_backend):
    shifted = Primitive("sin", lambda x: np.sin(x) + 1e-6, vjps=P.sin.vjps, jvps=P.sin.jvps)
    register_backend("shifted", backend_with("shifted", sin=lambda x, /: shifted(tape_xp._arr(x))))
    def sum_of_sin(x):  # its derivative, cos, does not use sin's value
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x))

    report = compare(sum_of_sin, (np.linspace(0.1, 1, 5),), backends=["numpy", "shifted"])
    shifted_result = report["shifted"]
    assert shifted_result.verdict == DISAGREE
    assert shifted_result.check("value", "numpy").status == "fail"
    # its derivatives are right: only the value is flagged
    assert all(c.status == "ok" for c in shifted_result.checks if c.quantity != "value")


def test_float32_uses_float32_tolerances(register_backend):
    register_backend("clone", backend_with("clone"))
    report = compare(loss, (PARAMS, X), backends=["numpy", "clone"], argnums=(0, 1), dtype="float32")
    assert report.ok
    assert report.tolerances["dtype"] == "float32" and report.tolerances["fd"] == 3e-3
    assert report["clone"].dtypes["value"] == ["float32"]
    assert report["clone"].dtypes["vjp"] == ["float32"] * 3


def test_complex_inputs(unigrad_backends):
    def energy(z):  # real output of a complex input: grad is 2 conj(z) in the house (JAX) convention
        xp = unigrad.namespace(z)
        return xp.sum(xp.real(z * xp.conj(z)))

    def holomorphic(z):
        xp = unigrad.namespace(z)
        return xp.sin(z) * z

    z = np.array([1 + 2j, -0.5 + 0.25j, 3 - 1j])
    backends = [b for b in unigrad_backends if unigrad.get_backend(b).capabilities.complex
                and unigrad.get_backend(b).capabilities.float64]  # complex128
    for f in (energy, holomorphic):
        report = compare(f, (z,), backends=backends)
        assert report.verdict == AGREE, report.table()
    # the VJP with the (seeded) cotangent u is u * 2 conj(z): JAX's convention, on every backend
    u = np.random.default_rng([0, 1]).standard_normal(())
    for r in compare(energy, (z,), backends=backends).results:
        np.testing.assert_allclose(r.vjp[0], u * 2 * np.conj(z), rtol=1e-12)


def test_zero_size_and_0d_inputs(register_backend):
    register_backend("clone", backend_with("clone"))

    def f(x, s):
        xp = unigrad.namespace(x, s)
        return xp.sin(x) * s, xp.exp(s)

    report = compare(f, (np.zeros((0, 3)), np.array(0.5)), backends=["numpy", "clone"], argnums=(0, 1))
    assert report.verdict == AGREE, report.table()
    assert [o.shape for o in report["clone"].outputs] == [(0, 3), ()]


def test_pytree_names_in_messages(register_backend):
    class Bad(NumpyBackend):
        name = "bad_b"
        array_modules = ()

        def vjp(self, f, primals, *, has_aux=False):  # doubles the cotangent of the second leaf ("w")
            outputs, vjp_fn, aux = super().vjp(f, primals, has_aux=has_aux)
            return outputs, (lambda cts: tuple(c * 2 if k == 1 else c for k, c in enumerate(vjp_fn(cts)))), aux

    register_backend("bad_b", Bad)
    report = compare(loss, (PARAMS, X), backends=["numpy", "bad_b"], argnums=(0, 1), jacobian=False)
    assert report["bad_b"].verdict == DISAGREE
    message = report["bad_b"].check("vjp", "numpy").message
    assert "argument 0['w']" in message and "differs from numpy's" in message


def test_jacobian_auto_skips_large_problems():
    x = np.linspace(-1, 1, 100)
    report = compare(lambda x: unigrad.namespace(x).sin(x), (x,), backends=["numpy"])
    assert report["numpy"].jacobian is None and "Jac fd" not in report.table()
    forced = compare(lambda x: unigrad.namespace(x).sin(x), (x,), backends=["numpy"], jacobian=True)
    assert forced["numpy"].jacobian[0][0].shape == (100, 100)


def test_seed_fixes_the_directions():
    a = compare(sin_sum, (np.linspace(-1, 1, 5),), backends=["numpy"], seed=3)
    b = compare(sin_sum, (np.linspace(-1, 1, 5),), backends=["numpy"], seed=3)
    c = compare(sin_sum, (np.linspace(-1, 1, 5),), backends=["numpy"], seed=4)
    np.testing.assert_array_equal(a["numpy"].jvp[0], b["numpy"].jvp[0])
    assert not np.array_equal(a["numpy"].jvp[0], c["numpy"].jvp[0])


def test_arguments_are_validated():
    with pytest.raises(TypeError, match="argument 1 is differentiated .* but is int64"):
        compare(lambda x, n: x * n, (np.ones(2), np.arange(2)), argnums=(0, 1), backends=["numpy"])
    with pytest.raises(ValueError, match="dtype must be one of"):
        compare(sin_sum, (np.ones(2),), dtype="int32", backends=["numpy"])
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        compare(sin_sum, (np.ones(2),), order=3, backends=["numpy"])
    with pytest.raises(ValueError, match="reference 'torchy' is not among"):
        compare(sin_sum, (np.ones(2),), backends=["numpy"], reference="torchy")
    with pytest.raises(TypeError, match="args must be a tuple"):
        compare(sin_sum, np.ones(2), backends=["numpy"])


def test_non_differentiated_arguments_pass_through():
    def scaled(x, scale, axis):
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x) * scale, axis=axis)

    report = compare(scaled, (np.ones((2, 3)), np.array([1.0, 2.0, 3.0]), 1), backends=["numpy"], argnums=0)
    assert report.ok and report["numpy"].outputs[0].shape == (2,)


# ---------------------------------------------------------------------------------------------
# Renderings
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def report(register_backend):
    register_backend("relu_left", backend_with("relu_left", maximum=maximum_with_tie_weight(0.0)))
    return compare(relu, (np.array([0.0, 1.5, -0.5]),), backends=["numpy", "relu_left"])


def test_table(report):
    table = report.table()
    assert str(report) == table == repr(report)
    lines = table.splitlines()
    assert lines[0].startswith("unigrad compare: relu")
    header = next(line for line in lines if line.startswith("backend"))
    for column in ("device", "value", "JVP fd", "JVP ref", "VJP fd", "VJP ref", "transpose", "Jac fd", "verdict"):
        assert column in header
    assert any(line.startswith("numpy (ref)") and line.endswith("agree") for line in lines)
    assert any(line.startswith("relu_left") and line.endswith("convention difference") for line in lines)
    assert "overall: convention difference" in table


def test_markdown(report):
    md = report.to_markdown()
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert rows[0].startswith("| backend | device | value |")
    assert rows[1].startswith("|---|")
    assert len(rows) == 4  # header, rule, two backends
    assert "Overall: **convention difference**" in md


def test_json_and_dict(report):
    d = report.to_dict()
    assert json.loads(report.to_json()) == json.loads(json.dumps(d))
    assert d["verdict"] == CONVENTION and d["ok"] is True and d["reference"] == "numpy"
    assert [b["label"] for b in d["backends"]] == ["numpy", "relu_left"]
    checks = d["backends"][1]["checks"]
    assert {"quantity", "against", "error", "tolerance", "status", "message"} <= set(checks[0])
    assert d["pairwise"][0]["a"] == "numpy" and d["pairwise"][0]["b"] == "relu_left"
    assert set(d["backends"][0]["times_s"]) == {"value", "jvp", "vjp", "jacobian"}


def test_json_has_no_nan_or_inf(register_backend):
    register_backend("relu_wild", backend_with("relu_wild", maximum=maximum_with_tie_weight(math.inf)))
    report = compare(relu, (np.array([0.0, 1.5]),), backends=["numpy", "relu_wild"])
    text = report.to_json()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)


def test_comparison_lookup(report):
    assert isinstance(report, Comparison)
    with pytest.raises(KeyError, match="no backend 'torch'"):
        report["torch"]


# ---------------------------------------------------------------------------------------------
# One default for which arguments are checked; timings of the first call apart from the steady state
# ---------------------------------------------------------------------------------------------

def sin_off(x, /):
    prim = Primitive("sin", np.sin, vjps=(lambda g, ans, x: g * P.cos(x) * 1.01,),
                     jvps=(lambda t, ans, x: t * P.cos(x) * 1.01,))
    return prim(tape_xp._arr(x))


def two_arguments(w, x, n):
    xp = unigrad.namespace(w, x)
    return xp.sum(w * n) + xp.sum(xp.sin(x))  # the bug (in sin) only shows in x's derivative


def test_every_floating_argument_is_checked_by_default(register_backend):
    register_backend("off", backend_with("off", sin=sin_off))
    args = (np.ones(3), np.array([0.2, 0.5, 0.9]), 3)  # the int is passed through, not differentiated
    report = compare(two_arguments, args, backends=["numpy", "off"], repeats=0)
    assert report.argnums == (0, 1)  # before: (0,), and the wrong derivative of x passed unseen
    assert report.verdict == DISAGREE and report["off"].verdict == DISAGREE
    with pytest.raises(AssertionError, match="argument 1"):
        assert_backends_agree(two_arguments, args, backends=["numpy", "off"], repeats=0)
    # an explicit argnums still narrows it
    assert compare(two_arguments, args, backends=["numpy", "off"], argnums=0, repeats=0).ok


def test_timings_show_the_first_call_apart_from_the_steady_state(register_backend):
    register_backend("clone", backend_with("clone"))
    report = compare(sin_sum, (np.linspace(0, 1, 4),), backends=["numpy", "clone"], repeats=2)
    header = report.table().splitlines()[3]
    assert "ms first value/JVP/VJP/Jac" in header and "ms steady value/JVP/VJP/Jac" in header
    for r in report.results:
        assert set(r.first_times) == set(r.times) == {"value", "jvp", "vjp", "jacobian"}
    d = report.to_dict()["backends"][0]
    assert set(d["first_call_times_s"]) == set(d["times_s"])
    once = compare(sin_sum, (np.linspace(0, 1, 4),), backends=["numpy"], repeats=0)
    assert once["numpy"].times == {} and set(once["numpy"].first_times) == {"value", "jvp", "vjp", "jacobian"}
    assert "ms steady" not in once.table()
