"""Each non-differentiable point follows its documented rule in reverse AND forward mode, on every backend,
eager and compiled (docs/conventions.md); a difference between modes is only where the table says so.

One portable function packs the points: output k is one kink, so a Jacobian shows every rule at once
(``jacrev`` rows are reverse mode, ``jacfwd`` columns forward mode).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import unigrad

NAN, INF = math.nan, math.inf

# The point: z[k] for each input slot.
Z = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 2.0, 2.0, -1.0, 0.0])


def kinks(z):
    """The points whose derivatives are finite (a NaN or inf would reach every row in reverse mode, as
    0 * NaN, through the indexing: those points are :data:`ALONE`)."""
    xp = unigrad.namespace(z)
    return xp.stack([
        xp.maximum(z[0], 0.0),              # 0: relu at 0
        xp.maximum(0.0, z[1]),              # 1
        xp.minimum(z[2], 0.0),              # 2
        xp.minimum(0.0, z[3]),              # 3
        xp.maximum(z[4], z[5]),             # 4: a tie
        xp.maximum(z[5], z[4]),             # 5
        xp.minimum(z[4], z[5]),             # 6
        xp.abs(z[6]),                       # 7
        xp.clip(z[6], 0.0, 1.0),            # 8: lower bound
        xp.clip(z[7], 0.0, 1.0),            # 9: upper bound
        xp.pow(z[8], 0.0),                  # 10
        z[9] ** z[10],                      # 11: base 0
        xp.remainder(z[11], z[12]),         # 12: an exact multiple
        xp.sign(z[13]),                     # 13
        xp.max(z[4:7]),                     # 14: a reduction's tie (z[6] = 0 is below it)
        xp.min(-z[4:7]),                    # 15
    ])


def rule():
    """The documented derivative of each output (docs/conventions.md, "The rules chosen"): the same in
    reverse and forward mode."""
    j = np.zeros((16, Z.size))
    j[0, 0] = j[1, 1] = j[2, 2] = j[3, 3] = 0.5
    j[4, 4:6] = j[5, 4:6] = j[6, 4:6] = 0.5
    j[8, 6] = j[9, 7] = 1.0
    j[12, 11:13] = (1.0, 2.0)  # 1 and -floor(2 / -1)
    j[14, 4:6], j[15, 4:6] = 0.5, -0.5  # a reduction's tie splits, as maximum's (MLX's own JVP: all to one)
    return j  # abs, pow(x, 0.0), 0 ** 2 (both inputs) and sign: 0


# (function of a vector, point, reverse-mode Jacobian, forward-mode Jacobian where a backend's differs:
# the cells docs/conventions.md shows as "rev A / fwd B")
ALONE = {
    "x ** y at a negative base": (lambda z: z[:1] ** z[1:], [-2.0, 2.0], [[-4.0, NAN]],
                                  {b: [[NAN, NAN]] for b in ("torch", "jax", "autograd", "mlx")}),
    "sqrt at 0": (lambda z: unigrad.namespace(z).sqrt(z), [0.0], [[INF]], {}),
    "the where trap": (lambda z: unigrad.namespace(z).where(z > 0, unigrad.namespace(z).log(z), 0.0 * z), [0.0],
                       [[NAN]], {b: [[0.0]] for b in ("numpy", "torch", "jax", "tensorflow", "autograd")}),
}

BACKENDS = [n for n, info in unigrad.backends().items() if info["available"]]


def assert_same(got, want, what):
    got = np.asarray(unigrad.to_numpy(got), dtype=np.float64)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), "\n".join(
        f"{what}: output {i}, input {k}: {got[i, k]} where the rule gives {want[i, k]}"
        for i, k in zip(*np.nonzero(bad)))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", BACKENDS)
def test_every_kink_follows_its_rule_in_both_modes(name, compile):
    assert_same(unigrad.jacrev(kinks, backend=name, compile=compile)(Z), rule(), f"{name} reverse mode")
    assert_same(unigrad.jacfwd(kinks, backend=name, compile=compile)(Z), rule(), f"{name} forward mode")
    for what, (fn, point, rev, fwd) in ALONE.items() if not compile else ():  # (time: eager only)
        point = np.array(point)
        assert_same(unigrad.jacrev(fn, backend=name, compile=compile)(point), np.array(rev),
                    f"{name} reverse mode, {what}")
        assert_same(unigrad.jacfwd(fn, backend=name, compile=compile)(point), np.array(fwd.get(name, rev)),
                    f"{name} forward mode, {what} (docs/conventions.md shows rev / fwd where they differ)")


@pytest.mark.parametrize("name", BACKENDS)
def test_the_issue_example_gives_one_number_in_both_modes(name):
    """sum(maximum(x, 0)) + sum(abs(x)) at 0: grad 1/2 each (sum 1.5) and jvp along ones 1.5 (TensorFlow's
    forward mode gave 3)."""
    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.maximum(x, 0.0)) + xp.sum(xp.abs(x))

    x = np.zeros(3)
    g = unigrad.to_numpy(unigrad.grad(f, backend=name)(x))
    _, t = unigrad.jvp(f, (x,), (np.ones(3),), backend=name)
    assert np.array_equal(g, [0.5, 0.5, 0.5])
    assert float(unigrad.to_numpy(t)) == 1.5


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_tensorflow_ties_in_forward_mode_under_hessian_and_batched_jacobian(compile):
    """The recorded maximum is differentiated again (second order) and vectorised (pfor) with its rule."""
    def f(x, y):
        xp = unigrad.namespace(x, y)
        return xp.sum(xp.maximum(x * x, y) * x)

    x, y = np.array([1.0, 2.0, 0.5]), np.array([1.0, 1.0, 1.0])  # a tie at x = 1
    for name in ("numpy", "tensorflow"):
        h = unigrad.hessian(f, backend=name, compile=compile)(x, y)
        hf = unigrad.jacfwd(unigrad.grad(f), backend=name, compile=compile)(x, y)
        if name == "numpy":
            want_h, want_hf = unigrad.to_numpy(h), unigrad.to_numpy(hf)
        else:
            np.testing.assert_allclose(unigrad.to_numpy(h), want_h, rtol=1e-12)
            np.testing.assert_allclose(unigrad.to_numpy(hf), want_hf, rtol=1e-12)
    g = lambda x, y: unigrad.namespace(x).maximum(x, y)  # noqa: E731
    bj = unigrad.batched_jacobian(g, argnums=(0, 1), mode="fwd", backend="tensorflow", compile=compile)(
        x[:, None], y[:, None])
    assert np.array_equal(np.ravel(unigrad.to_numpy(bj[0])), [0.5, 1.0, 0.0])
    assert np.array_equal(np.ravel(unigrad.to_numpy(bj[1])), [0.5, 0.0, 1.0])


def test_tensorflow_namespace_outside_a_transform_is_tensorflow_plain():
    """No tape: the recorded functions run the plain ops (the same values), and a tape of the user's own,
    outside a tf.function that calls them, still gets the rule (through the graph's gradient)."""
    tf = pytest.importorskip("tensorflow")
    import unigrad_tensorflow

    xp = unigrad_tensorflow.namespace
    x = tf.constant([0.0, 1.0, -1.0], tf.float64)
    assert np.array_equal(np.asarray(xp.maximum(x, 0.0)), [0.0, 1.0, 0.0])

    @tf.function
    def relu(t):
        return unigrad.to_native(xp.maximum(t, 0.0))

    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(relu(x))
    assert np.array_equal(tape.gradient(y, x).numpy(), [0.5, 1.0, 0.0])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_remainder_zero_has_the_divisors_sign_and_the_derivative_is_kept():
    """remainder(0., -1.) is -0.0 (the standard, NumPy); at exact multiples the derivative stays 1 and
    -floor(x1 / x2) in both modes, eager and compiled."""
    pytest.importorskip("tensorflow")
    import unigrad_tensorflow

    xp = unigrad_tensorflow.namespace
    a = np.array([0.0, -0.0, 2.0, -2.0, 3.0, 0.5, -0.5, np.nan, 1.0])
    b = np.array([-1.0, 1.0, -1.0, 1.0, 1.5, -1.0, 1.0, 1.0, np.inf])
    got, want = np.asarray(xp.remainder(xp.asarray(a), xp.asarray(b))), np.remainder(a, b)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    assert np.signbit(np.asarray(xp.asarray(np.array(0.0)) % -1.0))  # the operator too

    def f(x, y):
        return unigrad.namespace(x).sum(unigrad.namespace(x).remainder(x, y))

    x, y = np.array([2.0, 0.0, 1.3, -2.0]), np.array([-1.0, -1.0, 0.5, 1.0])
    for compile in (False, True):
        for transform in (unigrad.grad, unigrad.jacfwd):
            gx, gy = transform(f, argnums=(0, 1), backend="tensorflow", compile=compile)(x, y)
            assert np.array_equal(unigrad.to_numpy(gx), [1.0, 1.0, 1.0, 1.0])
            assert np.array_equal(unigrad.to_numpy(gy), -np.floor_divide(x, y))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_compare_calls_the_differences_the_table_shows_conventions_and_still_catches_nan_where_f_is_smooth():
    from unigrad.testing import compare
    from unigrad.testing._compare import CONVENTION, DISAGREE

    def trap(x):  # rev nan / fwd 0 on every backend
        xp = unigrad.namespace(x)
        return xp.where(x > 0, xp.log(x), 0.0 * x)

    report = compare(trap, (np.zeros(2),), backends=["numpy"], repeats=0)
    assert report.verdict == CONVENTION and report.ok, report.table()

    def power(x, y):  # d/dy NaN at a negative base; torch's forward mode NaN in d/dx's column too
        return x ** y

    names = [n for n in ("numpy", "torch") if n in BACKENDS]
    report = compare(power, (np.array(-2.0), np.array(2.0)), argnums=(0, 1), backends=names, repeats=0)
    assert report.verdict == CONVENTION and report.ok, report.table()

    # the same NaN where f is smooth is a wrong derivative
    @unigrad.custom_vjp
    def sin(x):
        return unigrad.namespace(x).sin(x)

    sin.defvjp(lambda x: (sin(x), x), lambda x, g: (g * math.nan,))
    report = compare(lambda x: sin(x), (np.array([0.3, 0.7]),), backends=["numpy"], repeats=0)
    assert report.verdict == DISAGREE and not report.ok, report.table()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_tensorflow_logaddexp_is_smooth_at_a_tie():
    """logaddexp is smooth: at x1 == x2 its derivative is 1/2 each and its second derivative 1/4, in both
    modes (TensorFlow's namespace gave 1 and 0, differentiating max + log1p(exp(-|x1 - x2|)))."""
    pytest.importorskip("tensorflow")

    def f(x, y):
        return unigrad.namespace(x).sum(unigrad.namespace(x).logaddexp(x, y))

    x, y = np.array([1.0, 0.3, -2.0]), np.array([1.0, 1.1, 5.0])
    for transform in (unigrad.grad, unigrad.jacfwd):
        want = transform(f, argnums=(0, 1), backend="numpy")(x, y)
        got = transform(f, argnums=(0, 1), backend="tensorflow")(x, y)
        for g, w in zip(got, want):
            np.testing.assert_allclose(unigrad.to_numpy(g), w, rtol=1e-14)
    np.testing.assert_allclose(unigrad.to_numpy(unigrad.hessian(f, backend="tensorflow")(x, y)),
                               unigrad.hessian(f, backend="numpy")(x, y), rtol=1e-12)
    assert float(unigrad.to_numpy(unigrad.grad(f, backend="tensorflow")(x, y))[0]) == pytest.approx(0.5, abs=1e-15)
