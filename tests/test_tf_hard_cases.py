"""TensorFlow at the hard points: the same derivative as the tape, torch and JAX where TensorFlow's own
gradient differs (maximum ties, x ** 0, d/dy x ** y for x < 0, sqrt in the untaken branch of a where),
and errors where TensorFlow returns a value (max of nothing, NumPy on a traced array)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from conftest import skip_module_unless  # noqa: E402

tf = skip_module_unless("tensorflow")

import unigrad  # noqa: E402
from unigrad.testing import check_grads  # noqa: E402

TF = "tensorflow"


def xp_(*a):
    return unigrad.namespace(*a)


def _grad(f, args, argnums=0, backend=TF, **kw):
    g = unigrad.grad(f, argnums=argnums, backend=backend, **kw)(*args)
    return tuple(unigrad.to_numpy(v) for v in g) if isinstance(g, tuple) else unigrad.to_numpy(g)


POINTS = [  # (name, f, args, argnums, the derivative of the tape, torch and JAX)
    ("maximum(x, 0) at 0", lambda x: xp_(x).maximum(x, 0.0), (0.0,), 0, 0.5),
    ("maximum(0, x) at 0", lambda x: xp_(x).maximum(0.0, x), (0.0,), 0, 0.5),
    ("minimum(x, 0) at 0", lambda x: xp_(x).minimum(x, 0.0), (0.0,), 0, 0.5),
    ("minimum(0, x) at 0", lambda x: xp_(x).minimum(0.0, x), (0.0,), 0, 0.5),
    ("x ** 0 at 0", lambda x: x ** 0, (0.0,), 0, 0.0),
    ("x ** 0.0 at 0", lambda x: x ** 0.0, (0.0,), 0, 0.0),
    ("xp.pow(x, 0.0) at 0", lambda x: xp_(x).pow(x, 0.0), (0.0,), 0, 0.0),
    ("x ** y, d/dy at (-2, 2)", lambda x, y: x ** y, (-2.0, 2.0), 1, np.nan),
    ("x ** y, d/dx at (-2, 2)", lambda x, y: x ** y, (-2.0, 2.0), 0, -4.0),
    ("x ** y, d/dx at (0, 0)", lambda x, y: x ** y, (0.0, 0.0), 0, 0.0),
    ("x ** y, d/dy at (0, 2)", lambda x, y: x ** y, (0.0, 2.0), 1, 0.0),
    ("where(x > 0, sqrt(x), 0) at -1", lambda x: xp_(x).where(x > 0, xp_(x).sqrt(x), 0.0), (-1.0,), 0, np.nan),
    ("sqrt at 0", lambda x: xp_(x).sqrt(x), (0.0,), 0, np.inf),
]


@pytest.mark.parametrize("name, f, args, argnums, want", POINTS, ids=[p[0] for p in POINTS])
@pytest.mark.parametrize("compile", [False, True])
def test_hard_points_agree_with_the_other_backends(name, f, args, argnums, want, compile):
    got = _grad(f, args, argnums, compile=compile)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_grad(f, args, argnums, backend="numpy"), want)  # the tape's rule too


def test_maximum_ties_split_evenly_with_broadcasting_and_order_does_not_matter():
    x, y = np.array([1.0, 2.0, 0.5, 1.0]), np.array(1.0)
    for f in (lambda x, y: xp_(x).sum(xp_(x).maximum(x, y)), lambda x, y: xp_(x).sum(xp_(x).maximum(y, x))):
        gx, gy = _grad(f, (x, y), (0, 1))
        np.testing.assert_array_equal(gx, [0.5, 1.0, 0.0, 0.5])
        np.testing.assert_array_equal(gy, 0.5 + 1.0 + 0.5)
        for k, want in enumerate(_grad(f, (x, y), (0, 1), backend="numpy")):
            np.testing.assert_array_equal((gx, gy)[k], want)
    # NaN propagates in the value; a NaN operand takes no derivative through the other one
    gx, gy = _grad(lambda x, y: xp_(x).sum(xp_(x).maximum(x, y)), (np.array([np.nan, 2.0]), np.array([1.0, 3.0])),
                   (0, 1))
    np.testing.assert_array_equal(gy, [0.0, 1.0])
    assert np.isnan(unigrad.to_numpy(xp_(tf.constant(np.nan)).maximum(tf.constant(np.nan), 1.0)))


def test_rewritten_derivatives_stay_right_away_from_the_hard_points():
    """sqrt, maximum, minimum and pow have gradients of their own now: forward, reverse and second order
    against finite differences and the transpose test, and their Hessians against the tape's."""
    rng = np.random.default_rng(2)
    x, y = rng.uniform(0.5, 2.0, 3), rng.uniform(0.5, 2.0, (2, 1))

    def f(x, y):
        xp = xp_(x)
        return xp.sum(xp.sqrt(x) * xp.maximum(x, y) ** 1.5 + x ** y + xp.minimum(y, x) + xp.pow(2.0, x))

    check_grads(f, (x, y), order=2, backend=TF)
    want = unigrad.hessian(f, argnums=(0, 1), backend="numpy")(x, y)
    for compile in (False, True):
        got = unigrad.hessian(f, argnums=(0, 1), backend=TF, compile=compile)(x, y)
        for row_g, row_w in zip(got, want):
            for g, w in zip(row_g, row_w):
                np.testing.assert_allclose(unigrad.to_numpy(g), w, rtol=1e-10)
    jf = unigrad.jacfwd(lambda x: xp_(x).sqrt(x) ** x, backend=TF)(x)
    np.testing.assert_allclose(unigrad.to_numpy(jf), unigrad.jacfwd(lambda x: xp_(x).sqrt(x) ** x)(x), rtol=1e-12)
    z = np.array([1.0 + 2.0j, -0.5 + 0.25j])  # complex: the adapter's (JAX's) convention, as the tape
    fz = lambda z: xp_(z).sum(xp_(z).abs(xp_(z).sqrt(z) ** (1.5 + 0.5j)) ** 2)  # noqa: E731
    np.testing.assert_allclose(_grad(fz, (z,)), _grad(fz, (z,), backend="numpy"), rtol=1e-10)
    # integer and unsigned arrays keep TensorFlow's kernels
    assert unigrad.to_numpy(xp_(tf.constant([3])).maximum(tf.constant([3]), 2)).tolist() == [3]
    assert unigrad.to_numpy(xp_(tf.constant([3])).pow(tf.constant([3]), 2)).tolist() == [9]


def test_max_and_min_of_nothing_raise_value_error():
    for name in ("max", "min"):
        with pytest.raises(ValueError, match=f"{name} of an empty array"):
            unigrad.grad(lambda x: getattr(xp_(x), name)(x), backend=TF)(np.zeros(0))
        with pytest.raises(ValueError, match=f"{name} of an empty array"):
            getattr(xp_(tf.zeros((2, 0))), name)(tf.zeros((2, 0)), axis=1)
    # an empty axis that is not reduced is fine
    assert unigrad.to_numpy(xp_(tf.zeros((2, 0))).max(tf.zeros((2, 0)), axis=0)).shape == (0,)


def test_numpy_functions_on_traced_arrays_raise_instead_of_returning_a_constant():
    with pytest.raises(TypeError, match="NumPy cannot take"):
        unigrad.grad(lambda x: np.median(x), backend=TF)(np.array([3.0, 1.0, 2.0, 0.0]))
    with pytest.raises(TypeError, match="NumPy cannot take"):
        unigrad.jacobian(lambda x: np.asarray(x) * 2.0, backend=TF)(np.ones(2))


def test_a_reverse_pass_over_a_forward_pass_sees_the_recorded_output():
    """A recorded op's JVP that reads its output (pow's d/dx2 = x1 ** x2 log x1) is differentiated through
    that output too: grad of jvp of 2 ** x and of y ** x was 0 on TensorFlow, silently."""
    x, v, y = np.array([0.7, 1.3, 1.9]), np.array([0.3, -0.2, 0.5]), np.array([1.1, 0.4, 2.2])
    for f in (lambda x: xp_(x).sum(xp_(x).pow(2.0, x) * x), lambda x: xp_(x).sum(xp_(x).pow(xp_(x).asarray(y), x))):
        want = unigrad.grad(lambda x: unigrad.jvp(f, (x,), (v,), backend="numpy")[1], backend="numpy")(x)
        for compile in (False, True):
            got = unigrad.grad(lambda x: unigrad.jvp(f, (x,), (v,), backend=TF)[1], backend=TF, compile=compile)(x)
            np.testing.assert_allclose(unigrad.to_numpy(got), want, rtol=1e-12)


# ---------------------------------------------------------------- TensorFlow's forward mode and pfor, where they fail
# (issue 36, ../shared/repros/r20, r21): the same values by another exact way, never the framework's raw error

_SCATTER_INDEX = [[3], [0], [0], [5], [2]]


def _scatter_loss(x):  # x0^2 + (x1 + x2)^2 + x3^2 + x4^2 (index 0 receives x1 and x2), x5 unused
    return tf.reduce_sum(tf.scatter_nd(tf.constant(_SCATTER_INDEX), x[:5], [6]) ** 2)


_SCATTER_HESSIAN = np.diag([2.0, 2.0, 2.0, 2.0, 2.0, 0.0]) + 2.0 * (np.eye(6, k=1) + np.eye(6, k=-1)) * (
    np.add.outer(np.arange(6), np.arange(6)) == 3)


def test_forward_over_a_scatter_nd_gradient_is_computed_in_reverse():
    """TensorFlow's forward mode over tf.scatter_nd's gradient (which holds IndexedSlices) raised
    "'IndexedSlices' object has no attribute '_id'": sparse_hessian, hvp and jvp of the gradient now give
    the closed-form values (by reverse over reverse)."""
    x, v = np.linspace(0.1, 0.6, 6), np.linspace(-1.0, 1.0, 6)
    np.testing.assert_array_equal(unigrad.to_numpy(unigrad.hessian(_scatter_loss, backend=TF)(x)), _SCATTER_HESSIAN)
    for compile in (False, True):
        with pytest.warns(UserWarning, match="pattern was widened"):  # (no rule for tf.ScatterNd: detection widens)
            got = unigrad.sparse_hessian(_scatter_loss, format="dense", backend=TF, compile=compile)(x)
        np.testing.assert_allclose(unigrad.to_numpy(got), _SCATTER_HESSIAN, atol=1e-15)
    (hv,) = unigrad.hvp(_scatter_loss, (x,), (v,), backend=TF)
    np.testing.assert_allclose(unigrad.to_numpy(hv), _SCATTER_HESSIAN @ v, atol=1e-15)
    _, pushed = unigrad.jvp(unigrad.grad(_scatter_loss, backend=TF), (x,), (v,), backend=TF)
    np.testing.assert_allclose(unigrad.to_numpy(pushed), _SCATTER_HESSIAN @ v, atol=1e-15)


@pytest.mark.slow  # (TensorFlow builds a second-order while loop's graph three times: about 15 s)
def test_sparse_hessian_of_a_scan_is_mapped_one_colour_at_a_time():
    """pfor cannot vectorise the HVP of a tf.scan (its while loop's TensorLists): the colours' passes are
    mapped one at a time, with a SlowMapWarning, and give the tape's Hessian of the same recurrence."""
    from unigrad_tensorflow._backend import SlowMapWarning

    def scanned(x):
        return tf.reduce_sum(tf.scan(lambda a, b: a * b + tf.sin(b), x) ** 2)

    def looped(x):  # the same recurrence on the tape
        xp, a, total = xp_(x), x[0], x[0] ** 2
        for k in range(1, x.shape[0]):
            a = a * x[k] + xp.sin(x[k])
            total = total + a ** 2
        return total

    x = np.linspace(0.1, 0.6, 6)
    want = unigrad.to_numpy(unigrad.hessian(looped, backend="numpy")(x))
    with pytest.warns(SlowMapWarning, match="cannot vectorise"):
        got = unigrad.sparse_hessian(scanned, format="dense", sparsity=np.ones((6, 6), bool), backend=TF)(x)
    np.testing.assert_allclose(unigrad.to_numpy(got), want, rtol=1e-12)


def test_jacobians_pfor_cannot_vectorise_are_computed_row_by_row():
    """pfor has no conversion for the gradient of tf.einsum("ii->i", ...): jacobian, sparse_jacobian, hessian
    and batched_jacobian raised TensorFlow's error (whose advice, experimental_use_pfor=False, unigrad does
    not expose); now they loop over the rows, with a SlowMapWarning, and give the closed form."""
    from unigrad_tensorflow._backend import SlowMapWarning

    def diag_squared(x):
        return tf.einsum("ii->i", tf.reshape(x, (3, 3))) ** 2

    x = np.linspace(0.1, 0.9, 9)
    want = np.zeros((3, 9))
    want[[0, 1, 2], [0, 4, 8]] = 2 * x[[0, 4, 8]]
    for t in (unigrad.jacobian(diag_squared, backend=TF), unigrad.sparse_jacobian(diag_squared, format="dense",
                                                                                   backend=TF)):
        with pytest.warns(SlowMapWarning, match="rows of this Jacobian"):
            np.testing.assert_allclose(unigrad.to_numpy(t(x)), want, rtol=1e-15)
    with pytest.warns(SlowMapWarning):
        hess = unigrad.hessian(lambda x: tf.reduce_sum(diag_squared(x) ** 2), backend=TF)(x)
    np.testing.assert_allclose(unigrad.to_numpy(hess), np.diag(np.where(np.arange(9) % 4 == 0, 12 * x ** 2, 0.0)),
                               rtol=1e-14)
    xb = np.stack([x, -2 * x])
    with pytest.warns(SlowMapWarning):
        blocks = unigrad.batched_jacobian(lambda xb: tf.einsum("bii->bi", tf.reshape(xb, (2, 3, 3))) ** 2,
                                          backend=TF)(xb)
    np.testing.assert_allclose(unigrad.to_numpy(blocks), np.stack([want, -2 * want]), rtol=1e-15)


def test_a_forward_pass_that_fails_both_ways_raises_fs_own_error():
    """The reverse fallback of a failed forward pass never hides f's own error."""
    def broken(x):
        raise ValueError("broken on purpose")

    with pytest.raises(ValueError, match="broken on purpose"):
        unigrad.jvp(broken, (np.ones(2),), (np.ones(2),), backend=TF)
    with pytest.raises(ValueError, match="broken on purpose"):
        unigrad.hvp(broken, (np.ones(2),), (np.ones(2),), backend=TF)
