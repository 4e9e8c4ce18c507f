"""check_grads: passes on correct functions (every installed backend, float64 and float32, complex,
pytrees, argnums, order 3) and, on deliberately wrong derivatives, fails with a message naming the
check, the argument, the worst element and both values."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from conftest import skip_unless

import unigrad
from unigrad.tape import NumpyBackend
from unigrad.tape import _namespace as tape_xp
from unigrad.tape import _primitives as P
from unigrad.tape._core import Primitive
from unigrad.testing import GradientCheckError, check_grads

Pair = collections.namedtuple("Pair", "w b")


def smooth(x, y):
    xp = unigrad.namespace(x, y)
    return xp.sum(xp.tanh(xp.matmul(x, y)) * xp.sin(x[:, :1])) + xp.exp(y[0, 0] / 4)


def mlp(params, x):
    xp = unigrad.namespace(x)
    hidden = xp.tanh(xp.matmul(x, params["layers"][0].w) + params["layers"][0].b)
    return xp.mean((xp.matmul(hidden, params["layers"][1].w) + params["layers"][1].b) ** 2), hidden


RNG = np.random.default_rng(3)
X, Y = RNG.standard_normal((3, 2)), RNG.standard_normal((2, 4))
PARAMS = {"layers": [Pair(RNG.standard_normal((2, 3)), RNG.standard_normal(3)),
                     Pair(RNG.standard_normal((3, 1)), RNG.standard_normal(1))]}


def test_order_three_on_the_tape():
    check_grads(smooth, (X, Y), order=3)


# check_grads to second order, both modes, on JAX and TensorFlow (tens of seconds each) is also the default run's
# conformance test test_check_grads_second_order[jax/tensorflow] (a function of the same kind and an MLP); here those
# two cases run in the thorough job (marker slow, through conftest's SLOW_CASES), the other backends by default.
SLOW_CASES = {"test_every_backend_order_two[jax]", "test_every_backend_order_two[tensorflow]"}


def test_every_backend_order_two(backend):
    order = 2 if unigrad.get_backend(backend).capabilities.higher_order else 1
    check_grads(smooth, (X, Y), order=order, backend=backend)


def test_every_backend_float32(backend):
    check_grads(smooth, (X.astype(np.float32), Y.astype(np.float32)), order=1, backend=backend)


def test_every_backend_complex(backend):
    if not unigrad.get_backend(backend).capabilities.complex:
        pytest.skip(f"{backend} has no complex support")

    def holomorphic(z):
        xp = unigrad.namespace(z)
        return xp.sin(z) * z + xp.exp(z / 3)

    def real_valued(z):  # not holomorphic: the house (JAX) convention decides the VJP
        xp = unigrad.namespace(z)
        return xp.sum(xp.real(z * xp.conj(z))) + xp.sum(xp.imag(z) ** 3)

    z = np.array([0.5 + 1j, -0.3 + 0.2j, 1.1 - 0.7j])
    check_grads(holomorphic, (z,), order=1, backend=backend)
    check_grads(real_valued, (z,), order=1, backend=backend)


def test_complex_second_order_on_the_tape():
    def f(z):
        xp = unigrad.namespace(z)
        return xp.sum(xp.abs(z) ** 2 + xp.real(xp.sin(z)))

    check_grads(f, (np.array([0.5 + 1j, -0.3 + 0.2j]),), order=2)


def test_pytrees_and_argnums():
    check_grads(mlp, (PARAMS, RNG.standard_normal((5, 2))), order=2)  # tuple output, dict/list/namedtuple input
    check_grads(mlp, (PARAMS, RNG.standard_normal((5, 2))), order=1, argnums=0)

    def with_axis(x, axis):
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x), axis=axis)

    check_grads(with_axis, (X, 1), argnums=0, order=2)  # the int argument is passed through


def test_modes_one_at_a_time():
    check_grads(smooth, (X, Y), order=2, modes=("fwd",))
    check_grads(smooth, (X, Y), order=2, modes=("rev",))


def test_bad_arguments():
    with pytest.raises(ValueError, match="modes must be"):
        check_grads(smooth, (X, Y), modes=("sideways",))
    with pytest.raises(ValueError, match="order must be a positive int"):
        check_grads(smooth, (X, Y), order=0)
    with pytest.raises(TypeError, match="args must be a tuple"):
        check_grads(smooth, X)


# ---------------------------------------------------------------------------------------------
# Messages: which check, which argument, the worst element and both values
# ---------------------------------------------------------------------------------------------

def backend_class(name, **overrides):
    ns = type(tape_xp)(f"namespace_{name}")
    ns.__dict__.update({k: v for k, v in vars(tape_xp).items() if not k.startswith("__")})
    ns.__dict__.update(overrides)
    return type(name, (NumpyBackend,), {"name": name, "array_modules": (), "namespace": lambda self: ns})


def sin_with(vjp_rule=None, jvp_rule=None):
    prim = Primitive("sin", np.sin, vjps=(vjp_rule or P.sin.vjps[0],), jvps=(jvp_rule or P.sin.jvps[0],))
    return lambda x, /: prim(tape_xp._arr(x))


def cos_with(vjp_ok=True, jvp_ok=True):
    """cos whose own derivative rules are right or have the wrong sign."""
    vjp_sign, jvp_sign = (1 if vjp_ok else -1), (1 if jvp_ok else -1)
    return Primitive("cos", np.cos, vjps=(lambda g, ans, x: g * (-P.sin(x)) * vjp_sign,),
                     jvps=(lambda t, ans, x: t * (-P.sin(x)) * jvp_sign,))


def sin_of(x):
    xp = unigrad.namespace(x)
    return xp.sin(x)


def parse(message):
    """(got, expected) from a check_grads message ("got np.float64(0.5), expected np.float64(0.49)")."""
    number = r"(?:np\.float64\()?([-+\d.eE]+)\)?"
    match = re.search(rf"got {number}, expected {number}", message)
    return float(match.group(1)), float(match.group(2))


def test_jvp_message_names_argument_index_and_values(register_backend):
    off = register_backend("off", backend_class(
        "off", sin=sin_with(lambda g, ans, x: g * P.cos(x) * 1.01, lambda t, ans, x: t * P.cos(x) * 1.01)))
    x = np.array([0.1, 0.9, -0.4])
    with pytest.raises(GradientCheckError) as info:
        check_grads(lambda a, b: unigrad.namespace(a).sin(b) * a, (np.ones(3), x), backend=off)
    message = str(info.value)
    assert message.startswith("check_grads [off]: JVP check failed for argument 1, output 0 at index (")
    index = int(re.search(r"at index \((\d+),\)", message).group(1))
    got, expected = parse(message)
    assert got / expected == pytest.approx(1.01, rel=1e-6)
    assert "from finite differences" in message and "the tolerance" in message
    assert 0 <= index < 3


def test_pytree_argument_names(register_backend):
    off = register_backend("off", backend_class(
        "off", sin=sin_with(lambda g, ans, x: g * P.cos(x) * 1.01, lambda t, ans, x: t * P.cos(x) * 1.01)))

    def f(tree):
        xp = unigrad.namespace(tree["a"])
        return xp.sin(tree["b"][1]) + tree["a"]

    tree = {"a": np.ones(2), "b": [np.ones(2), np.array([0.3, 0.6])]}
    with pytest.raises(GradientCheckError, match=r"JVP check failed for argument 0\['b'\]\[1\]"):
        check_grads(f, (tree,), backend=off)


def test_vjp_message(register_backend):
    vjp_only = register_backend("vjp_only", backend_class(
        "vjp_only", sin=sin_with(vjp_rule=lambda g, ans, x: g * P.cos(x) * 1.01)))
    with pytest.raises(GradientCheckError, match=r"\[vjp_only\]: VJP check failed for argument 0: got .*, expected "
                                                 r".*dot-product test"):
        check_grads(sin_of, (np.array([0.2, 0.5]),), backend=vjp_only)
    # forward mode alone is right
    check_grads(sin_of, (np.array([0.2, 0.5]),), backend=vjp_only, modes=("fwd",))


def test_transpose_message(register_backend):
    vjp_only = register_backend("vjp_only", backend_class(
        "vjp_only", sin=sin_with(vjp_rule=lambda g, ans, x: g * P.cos(x) * 1.01)))
    # finite differences too lax to notice; the exact transpose test still does
    with pytest.raises(GradientCheckError, match=r"transpose test <u, J v> vs <J\^T u, v> check failed for all "
                                                 r"arguments.*the VJP"):
        check_grads(sin_of, (np.array([0.2, 0.5]),), backend=vjp_only, tolerances={"fd": (0.5, 0.5)})


def test_second_order_messages_name_the_nesting(register_backend):
    wrong_cos = cos_with(vjp_ok=False, jvp_ok=False)
    second = register_backend("second", backend_class("second", sin=sin_with(
        lambda g, ans, x: g * wrong_cos(x), lambda t, ans, x: t * wrong_cos(x))))
    x = np.array([0.2, 0.5])
    check_grads(sin_of, (x,), backend=second, order=1)  # first derivatives are right
    with pytest.raises(GradientCheckError, match=r"JVP of JVP check failed for argument 0, output 0"):
        check_grads(sin_of, (x,), backend=second, order=2, modes=("fwd",))
    with pytest.raises(GradientCheckError, match=r"VJP of VJP check failed for argument 0"):
        check_grads(sin_of, (x,), backend=second, order=2, modes=("rev",))


def test_mixed_second_order_message_follows_jax_naming(register_backend):
    # sin's VJP rule uses a cos whose forward-mode rule is wrong: only forward-over-reverse fails,
    # i.e. the JVP of the function x -> vjp(f, x)(u): JAX calls this check "JVP of VJP"
    fwd_wrong = cos_with(vjp_ok=True, jvp_ok=False)
    mixed = register_backend("mixed", backend_class("mixed", sin=sin_with(vjp_rule=lambda g, ans, x: g * fwd_wrong(x))))
    x = np.array([0.2, 0.5])
    check_grads(sin_of, (x,), backend=mixed, order=2, modes=("fwd",))  # forward over forward is right
    with pytest.raises(GradientCheckError, match=r"JVP of VJP check failed"):
        check_grads(sin_of, (x,), backend=mixed, order=2)


# ---------------------------------------------------------------------------------------------
# No false alarms: finite differences that estimate their own error (issue 9, section 1). Each case was
# flagged by the fixed-step finite differences check_grads used before (asserted below where cheap), and
# its derivative is right.
# ---------------------------------------------------------------------------------------------

from unigrad import finite_differences as fd  # noqa: E402
from unigrad.testing import FiniteDifferencesInconclusive, compare  # noqa: E402


def fast_varying(x):
    xp = unigrad.namespace(x)
    return xp.sin(xp.pow(1.0 + 4.0 * x ** 2, x))


def fast_varying_exact(x):
    g = (1 + 4 * x ** 2) ** x
    return np.cos(g) * g * (np.log(1 + 4 * x ** 2) + 8 * x ** 2 / (1 + 4 * x ** 2))


def test_fast_varying_function_is_not_a_false_alarm():
    x = np.array([1.9554875, 2.198625])  # derivatives about -505 where the fixed step gave -499 and -35
    old = fd.directional_derivative(lambda a: [np.sin(np.power(1 + 4 * a ** 2, a))], [x], [np.ones(2)])[0]
    assert np.max(np.abs(old - fast_varying_exact(x))) > 5  # the fixed step misses by far more than the tolerance
    est = fd.estimate_directional(lambda a: [np.sin(np.power(1 + 4 * a ** 2, a))], [x], [np.ones(2)], rtol=1e-10)
    np.testing.assert_allclose(est.value[0], fast_varying_exact(x), rtol=1e-9)
    assert np.all(np.abs(est.value[0] - fast_varying_exact(x)) <= 10 * est.error[0] + 1e-9)
    check_grads(fast_varying, (x,), order=1)


def exp_sin_program(x0):
    xp = unigrad.namespace(x0)
    v1 = x0 + x0
    v2 = xp.exp(v1)
    v3 = xp.sin(v2)
    v4 = v3 + v2
    return xp.sin(v4)


def test_exp_sin_program_at_the_reported_point(unigrad_backends):
    x0 = np.array([0.047286498801026866, 1.8018547853037412])  # was "JVP 3.26536 against FD 3.26528"
    check_grads(exp_sin_program, (x0,), order=2)
    for name in _float64(unigrad_backends):
        check_grads(exp_sin_program, (x0,), order=1, backend=name)
    report = compare(exp_sin_program, (x0,), backends=unigrad_backends, repeats=0)
    assert report.verdict == "agree", report


def _float64(names):
    """The backends that compute float64: these points (a tie 1.6e-5 apart, a jump 3.3e-4 away) are
    float64's; at float32 the finite-difference step spans them (MLX computes no float64)."""
    return [n for n in names if unigrad.get_backend(n).capabilities.float64]


def minimum(x):
    return unigrad.namespace(x).min(x)


def sort(x):
    return unigrad.namespace(x).sort(x)


def remainder(x):
    return unigrad.namespace(x).remainder(x, 1.0)


@pytest.mark.parametrize("f, x", [
    (minimum, np.array([0.3, 0.3 + 1.6e-5, 0.9])),     # a near-tie 1.6e-5 apart
    (sort, np.array([0.3, 0.3 + 1.6e-5, -0.7])),
    (remainder, np.array([2.00033, 0.5])),            # 3.3e-4 from the jump at 2
], ids=["min_near_tie", "sort_near_tie", "mod_near_jump"])
def test_kink_or_jump_inside_the_old_step_is_not_a_false_alarm(f, x, unigrad_backends):
    check_grads(f, (x,), order=2 if f is not remainder else 1)
    for name in _float64(unigrad_backends):
        check_grads(f, (x,), order=1, backend=name)


def eigenvectors(x):
    xp = unigrad.namespace(x)
    return xp.linalg.eigh(x + xp.matrix_transpose(x))[1]


def test_batched_eigh_sign_flip_within_the_step_is_not_a_false_alarm():
    rng = np.random.default_rng(0)
    draws = [(rng.standard_normal((4, 3, 3)), rng.standard_normal((4, 3, 3))) for _ in range(68)]
    for x, _ in (draws[26], draws[67]):  # a sign flip of an eigenvector within 1e-3 of the point
        check_grads(eigenvectors, (x,), order=1)


def test_a_jump_at_the_point_is_inconclusive_not_wrong():
    with pytest.raises(FiniteDifferencesInconclusive, match="inconclusive") as info:
        check_grads(remainder, (np.array([2.0, 0.5]),), order=1)
    assert not isinstance(info.value, AssertionError)  # never reads as "derivative wrong"
    report = compare(remainder, (np.array([2.0, 0.5]),), backends=["numpy"], repeats=0)
    assert report.verdict == "finite differences inconclusive" and not report.ok
    assert "this does not say the derivative is wrong" in report.table()


def test_a_wrong_derivative_next_to_a_jump_is_still_caught(register_backend):
    off = register_backend("off", backend_class(
        "off", sin=sin_with(lambda g, ans, x: g * P.cos(x) * 1.001, lambda t, ans, x: t * P.cos(x) * 1.001)))

    def f(x):
        xp = unigrad.namespace(x)
        return xp.sin(xp.remainder(x, 1.0))

    with pytest.raises(GradientCheckError, match="JVP check failed"):
        check_grads(f, (np.array([2.00033, 0.5]),), order=1, backend=off)


def test_estimate_reports_its_error():
    est = fd.estimate_directional(lambda a: [np.exp(a)], [np.array([0.0, 1.0, 3.0])], [np.ones(3)])
    np.testing.assert_allclose(est.value[0], np.exp([0.0, 1.0, 3.0]), rtol=1e-10)
    assert np.all(est.error[0] < 1e-8) and np.all(est.error[0] > 0)
    jump = fd.estimate_directional(lambda a: [np.floor(a)], [np.array([1.0])], [np.ones(1)])
    assert not jump.error[0][0] < 1e-3  # no two steps agree at a jump: a large or infinite error, not a number


def test_every_floating_argument_is_checked_by_default(register_backend):
    # argnums defaults to every floating-point argument; the int is passed through
    off = register_backend("off", backend_class(
        "off", sin=sin_with(lambda g, ans, x: g * P.cos(x) * 1.01, lambda t, ans, x: t * P.cos(x) * 1.01)))

    def f(a, b, n):
        xp = unigrad.namespace(a, b)
        return a * n + xp.sin(b)

    with pytest.raises(GradientCheckError, match="argument 1"):
        check_grads(f, (np.ones(2), np.array([0.2, 0.4]), 3), backend=off)


def test_floating_argnums_default():
    from unigrad.testing._check_grads import floating_argnums

    args = (np.ones(2), 3, {"a": 1.5, "b": np.zeros(1, np.float32)}, np.arange(3), True, [np.ones(1), 2])
    assert floating_argnums(args) == (0, 2)
    ml_dtypes = skip_unless("ml_dtypes")
    assert floating_argnums((np.arange(3), np.ones(2, dtype=ml_dtypes.bfloat16))) == (1,)  # dtype kind "V"
    with pytest.raises(TypeError, match="no argument holds only floating-point arrays"):
        floating_argnums((np.arange(3), 2))
