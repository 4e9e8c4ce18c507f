"""TensorFlow's namespace at the boundary: a standard namespace wherever it is called (its functions return
``unigrad_tensorflow.Array`` s outside transforms too), native arrays out of every transform on every backend,
boolean scalar indices, and the ``fft`` extension with its derivatives against the tape's."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import optree  # noqa: E402
import pytest  # noqa: E402

import unigrad  # noqa: E402

TF = "tensorflow"
rng = np.random.default_rng(22)
W = rng.standard_normal(3)
X = rng.standard_normal((4, 3))


def _tf():
    return pytest.importorskip("tensorflow")


def _u():
    _tf()
    import unigrad_tensorflow
    return unigrad_tensorflow


def _np(tree):
    return [np.asarray(unigrad.to_numpy(v)) for v in optree.tree_leaves(tree)]


def _close(got, want, rtol=1e-10, atol=1e-12):
    got, want = _np(got), _np(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ one portable f, everywhere

def loss(w, x):
    """The issue's example: ``x @ w``, 2-D times 1-D. ``xp.asarray`` makes the user's own tensors Arrays
    (a no-op on the Arrays a transform passes)."""
    xp = unigrad.namespace(w, x)
    w, x = xp.asarray(w), xp.asarray(x)
    return xp.sum(xp.tanh(x @ w) ** 2) + (x.T @ x)[0, 1] * 0.5


def loss_operators_only(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sum(xp.tanh(x @ w) ** 2) + (x.T @ x)[0, 1] * 0.5


def test_a_portable_function_means_one_thing_plainly_under_evaluate_and_in_every_transform():
    tf = _tf()
    Array = _u().Array
    want_value = float(np.sum(np.tanh(X @ W) ** 2) + (X.T @ X)[0, 1] * 0.5)
    want_grad = unigrad.grad(loss, argnums=(0, 1), backend="numpy")(W, X)

    plain = loss(tf.constant(W), tf.constant(X))  # called directly on the user's own tensors
    assert type(plain) is Array and plain.shape == ()
    assert float(plain) == pytest.approx(want_value, rel=1e-12)
    xp = unigrad.namespace(tf.constant(W))
    assert float(xp.asarray(X) @ xp.asarray(W) @ xp.ones(4)) == pytest.approx(float(X @ W @ np.ones(4)), rel=1e-12)
    evaluated = unigrad.evaluate(loss_operators_only, W, X, backend=TF)  # f gets Arrays, a tensor comes back
    assert type(evaluated).__name__ == "EagerTensor" and float(evaluated) == pytest.approx(want_value, rel=1e-12)

    for compile in (False, True):
        kw = {"backend": TF, "compile": compile}
        value, g = unigrad.value_and_grad(loss, argnums=(0, 1), **kw)(W, X)
        assert float(value) == pytest.approx(want_value, rel=1e-12)
        _close(g, want_grad)
        _close(unigrad.jacobian(loss, mode="fwd", **kw)(W, X), want_grad[0])
        _close(unigrad.hessian(loss, **kw)(W, X), unigrad.hessian(loss, backend="numpy")(W, X))
    out, vjp_fn = unigrad.vjp(loss, W, X, backend=TF)
    assert float(out) == pytest.approx(want_value, rel=1e-12)
    _close(vjp_fn(tf.constant(1.0, tf.float64)), want_grad)
    _close(unigrad.jvp(loss, (W, X), (W, X), backend=TF)[1],
           unigrad.jvp(loss, (W, X), (W, X), backend="numpy")[1])
    _close(unigrad.hvp(loss, (W, X), (W, X), backend=TF), unigrad.hvp(loss, (W, X), (W, X), backend="numpy"))
    _close(unigrad.vmap(loss, in_axes=(None, 0), backend=TF)(W, np.stack([X, 2 * X])),
           np.array([float(loss(W, X)), float(loss(W, 2 * X))]))


def test_the_users_own_tensors_keep_tensorflows_operators():
    tf = _tf()
    with pytest.raises(Exception, match="ndims|rank|shape"):  # TensorFlow's matmul: 2-D operands only
        tf.constant(X) @ tf.constant(W)


# ------------------------------------------------------------------ the namespace's functions return Arrays

def _calls():
    return {
        "zeros": lambda xp, t: xp.zeros((2, 3)),
        "ones_like": lambda xp, t: xp.ones_like(t),
        "arange": lambda xp, t: xp.arange(4),
        "arange uint8": lambda xp, t: xp.arange(1, 7, 2, dtype=xp.uint8),  # TensorFlow has no Range kernel
        "tile uint16": lambda xp, t: xp.tile(xp.asarray([1, 2], dtype=xp.uint16), (2,)),  # nor a Tile kernel
        "getitem int8": lambda xp, t: xp.asarray(t)[xp.asarray(1, dtype=xp.int8)],
        "getitem 10-d": lambda xp, t: xp.reshape(t, (2,) + (1,) * 8 + (2,))[1, ..., None, 0, ::-1],
        "linspace": lambda xp, t: xp.linspace(0.0, 1.0, 5),
        "eye": lambda xp, t: xp.eye(3, k=1),
        "full": lambda xp, t: xp.full((2,), 0.1),
        "asarray": lambda xp, t: xp.asarray([1.0, 2.0]),
        "from_dlpack": lambda xp, t: xp.from_dlpack(np.arange(3.0)),
        "sin": lambda xp, t: xp.sin(t),
        "add": lambda xp, t: xp.add(t, 1.0),
        "matmul": lambda xp, t: xp.matmul(xp.reshape(t, (2, 2)), t[:2]),
        "sum": lambda xp, t: xp.sum(t),
        "where": lambda xp, t: xp.where(t > 2.0, t, 0.0),
        "getitem": lambda xp, t: xp.asarray(t)[xp.asarray([2, 0])],
        "getitem mixed int dtypes": lambda xp, t: xp.reshape(xp.asarray(t), (2, 2))[
            xp.asarray(1, dtype=xp.int64), xp.asarray(0, dtype=xp.int32)],
        "stack": lambda xp, t: xp.stack([t, t]),
        "linalg.inv": lambda xp, t: xp.linalg.inv(xp.reshape(t, (2, 2))),
        "fft.fft": lambda xp, t: xp.fft.fft(xp.astype(t, xp.complex128)),
        "unique_all": lambda xp, t: xp.unique_all(t),
        "meshgrid": lambda xp, t: xp.meshgrid(t, t),
        "unstack": lambda xp, t: xp.unstack(xp.reshape(t, (2, 2))),
        "linalg.svd": lambda xp, t: xp.linalg.svd(xp.reshape(t, (2, 2))),
        "nonzero": lambda xp, t: xp.nonzero(t),
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_every_namespace_function_returns_arrays_outside_transforms(name):
    tf = _tf()
    u = _u()
    xp = u.namespace
    t = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
    strict = pytest.importorskip("array_api_strict")
    call = _calls()[name]
    got = call(xp, t)  # a plain tf.Tensor in
    got_from_array = call(xp, xp.asarray(t))  # and an Array
    want = call(strict, strict.asarray(np.asarray(t)))
    leaves = optree.tree_leaves(got, is_leaf=lambda v: type(v) is u.Array)
    assert leaves and all(type(v) is u.Array for v in leaves), {type(v) for v in leaves}
    assert type(got) is type(got_from_array)
    if name in ("nonzero", "unstack"):
        assert type(got) is tuple
    if name == "meshgrid":
        assert type(got) is list  # since the 2024.12 standard
    want_leaves = [w for w in optree.tree_leaves(tuple(want) if hasattr(want, "_fields") else want)]
    for g, w in zip(leaves, want_leaves):
        assert type(g.shape) is tuple and g.shape == w.shape
        if name != "linalg.svd":  # singular vectors: equal up to signs
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-12)


def test_the_way_out_is_to_native_or_convert_to_tensor_and_numpy_reads_arrays_outside():
    tf = _tf()
    u = _u()
    a = u.namespace.asarray([1.0, 2.0])
    native = unigrad.to_native(a)
    assert type(native).__name__ == "EagerTensor" and native is tf.convert_to_tensor(a)
    assert unigrad.to_native({"a": a, "n": 3})["a"] is native and unigrad.to_native(native) is native
    np.testing.assert_array_equal(np.asarray(a), [1.0, 2.0])  # outside a transform NumPy reads it
    np.testing.assert_array_equal(np.from_dlpack(a), [1.0, 2.0])
    with pytest.raises(TypeError, match="NumPy cannot take"):  # inside, the derivative would be lost
        unigrad.grad(lambda x: np.asarray(x).sum(), backend=TF)(W)
    # an Array a user holds is an input like any other: backend inferred, result native
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2))(a)
    assert type(g).__name__ == "EagerTensor"
    np.testing.assert_array_equal(g.numpy(), [2.0, 4.0])


@pytest.mark.parametrize("name", ["numpy", "torch", "jax", "tensorflow"])
def test_transforms_return_the_backends_native_arrays_on_every_backend(name):
    """The one rule (docs/guide.md): transforms and evaluate return the framework's own arrays, which
    ``to_native`` hands back unchanged."""
    if name != "numpy":
        pytest.importorskip(name)
    backend = name

    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.sin(x) * xp.ones_like(x)), {"double": x * 2.0}

    g, aux = unigrad.grad(f, has_aux=True, backend=backend)(W)
    results = [g, aux["double"], unigrad.jacobian(lambda x: f(x)[1]["double"], backend=backend)(W),
               unigrad.evaluate(lambda x: f(x)[0], W, backend=backend)]
    for r in results:
        assert unigrad.to_native(r) is r, type(r)
    np.testing.assert_allclose(np.asarray(unigrad.to_numpy(g)), np.cos(W), rtol=1e-12)


# ------------------------------------------------------------------ x[True], x[False]

INDICES = [True, False, (True, 0), (0, True), (Ellipsis, True), (True, slice(None), 1), ([0, 2], True),
           (None, False), (slice(None), True, [0, 2]), (np.bool_(True),), (np.array(False), 1)]


def _index_id(k):
    return repr(k).replace(" ", "")


@pytest.mark.parametrize("index", INDICES, ids=_index_id)
def test_boolean_scalar_index_adds_an_axis_as_numpy_does(index):
    tf = _tf()
    xp = _u().namespace
    x = np.arange(24.0).reshape(4, 3, 2)
    got = xp.asarray(x)[index]
    want = x[index]
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)
    # a 0-d boolean tensor: its value may be unknown in a graph; 1 or 0 positions
    if index is True or index is False:
        run = tf.function(lambda t, b: tf.convert_to_tensor(xp.asarray(t)[b]), autograph=False)
        assert tuple(run(tf.constant(x), tf.constant(index)).shape) == want.shape


@pytest.mark.parametrize("compile", [False, True])
def test_boolean_scalar_index_in_transforms_with_derivatives(compile):
    """``x[True]``, ``x[False]`` and ``x[k]`` with ``k`` an argument, eager and compiled; the derivative
    against NumPy's own indexing (ones where an element is selected)."""
    x = rng.standard_normal((2, 3))

    def f(x, k):
        xp = unigrad.namespace(x)
        return xp.sum(x[k] ** 2) + xp.sum(x[k, 1]) + xp.sum(x[True] * 0.5) + xp.sum(x[False] * 7.0)

    kw = {"backend": TF, "compile": compile}
    _tf()
    for k in (True, False):
        selected = 1.0 if k else 0.0
        want = selected * 2 * x + 0.5 + selected * (np.arange(2)[:, None] == 1) * 1.0
        _close(unigrad.grad(f, **kw)(x, k), want)
        jac = unigrad.jacobian(lambda x, k: x[k], **kw)(x, k)
        assert tuple(jac.shape) == ((1,) if k else (0,)) + (2, 3, 2, 3)
        if k:
            _close(jac, np.eye(6).reshape(1, 2, 3, 2, 3))
        _close(unigrad.jvp(lambda x: x[k], (x,), (x,), backend=TF)[1], x[k])


# ------------------------------------------------------------------ fft

FFT_CASES = [  # (name, call(fft namespace, x), real input?)
    ("fft", lambda f, x: f.fft(x), False),
    ("fft n=6 ortho", lambda f, x: f.fft(x, n=6, norm="ortho"), False),
    ("ifft axis=0 forward", lambda f, x: f.ifft(x, axis=0, norm="forward"), False),
    ("fftn", lambda f, x: f.fftn(x), False),
    ("ifftn s", lambda f, x: f.ifftn(x, s=(3, 5), axes=(0, 1)), False),
    ("rfft", lambda f, x: f.rfft(x), True),
    ("rfft n=3 axis=0", lambda f, x: f.rfft(x, n=3, axis=0), True),
    ("irfft", lambda f, x: f.irfft(x), False),
    ("irfft n=5 ortho", lambda f, x: f.irfft(x, n=5, norm="ortho"), False),
    ("rfftn", lambda f, x: f.rfftn(x), True),
    ("irfftn", lambda f, x: f.irfftn(x, axes=(0, 1)), False),
    ("hfft", lambda f, x: f.hfft(x), False),
    ("ihfft forward", lambda f, x: f.ihfft(x, norm="forward"), True),
    ("fftshift", lambda f, x: f.fftshift(x), True),
    ("ifftshift axes", lambda f, x: f.ifftshift(x, axes=1), True),
]


def _fft_input(real):
    x = rng.standard_normal((4, 4))
    return x if real else x + 1j * rng.standard_normal((4, 4))


@pytest.mark.parametrize("name, call, real", FFT_CASES, ids=[c[0] for c in FFT_CASES])
def test_fft_values_match_numpy(name, call, real):
    xp = _u().namespace
    x = _fft_input(real)
    got = call(xp.fft, xp.asarray(x))
    want = call(np.fft, x)
    assert type(got) is _u().Array
    assert got.dtype.as_numpy_dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)
    single = call(xp.fft, xp.asarray(x.astype(np.float32 if real else np.complex64)))
    assert single.dtype.as_numpy_dtype == call(np.fft, x.astype(np.float32 if real else np.complex64)).dtype


@pytest.mark.parametrize("name, call, real", FFT_CASES, ids=[c[0] for c in FFT_CASES])
def test_fft_derivatives_match_the_tapes(name, call, real):
    """A real function of each transform (real and imaginary parts weighted), differentiated in both
    modes, complex inputs included (the JAX convention on both)."""
    x = _fft_input(real)
    weights = rng.standard_normal(np.asarray(call(np.fft, x)).shape), rng.standard_normal(
        np.asarray(call(np.fft, x)).shape)

    def f(x):
        xp = unigrad.namespace(x)
        y = call(xp.fft, x)
        return xp.sum(xp.real(y) * xp.asarray(weights[0])) + xp.sum(xp.imag(y) * xp.asarray(weights[1])) \
            if xp.isdtype(y.dtype, "complex floating") else xp.sum(y * xp.asarray(weights[0]))

    tangent = _fft_input(real)
    _close(unigrad.grad(f, backend=TF)(x), unigrad.grad(f, backend="numpy")(x), rtol=1e-9, atol=1e-10)
    _close(unigrad.jvp(f, (x,), (tangent,), backend=TF)[1], unigrad.jvp(f, (x,), (tangent,), backend="numpy")[1],
           rtol=1e-9, atol=1e-10)


def test_fft_frequencies_and_errors():
    tf = _tf()
    xp = _u().namespace
    np.testing.assert_array_equal(np.asarray(xp.fft.fftfreq(5, d=0.5)), np.fft.fftfreq(5, d=0.5))
    np.testing.assert_array_equal(np.asarray(xp.fft.rfftfreq(6)), np.fft.rfftfreq(6))
    assert xp.fft.fftfreq(4, dtype=xp.float32).dtype == tf.float32
    with pytest.raises(ValueError, match="invalid norm"):
        xp.fft.fft(xp.ones(3, dtype=xp.complex128), norm="sideways")
    with pytest.raises(TypeError, match="must be real"):
        xp.fft.rfft(xp.ones(3, dtype=xp.complex128))
    with pytest.raises(ValueError, match="Invalid number of FFT data points"):
        xp.fft.fft(xp.ones(3, dtype=xp.complex128), n=0)


# ------------------------------------------------------------------ special values the standard fixes

def test_hypot_and_logaddexp_special_values_with_derivatives_in_every_mode():
    xp = _u().namespace
    inf, nan = np.inf, np.nan
    got = xp.hypot(xp.asarray([1e308, nan, inf, 3.0, -0.0]), xp.asarray([1.0, inf, nan, -4.0, 0.0]))
    np.testing.assert_array_equal(np.asarray(got), [1e308, inf, inf, 5.0, 0.0])  # the naive form overflowed
    got = xp.logaddexp(xp.asarray([inf, -inf, 0.0]), xp.asarray([inf, -inf, 0.0]))
    np.testing.assert_allclose(np.asarray(got), [inf, -inf, np.log(2.0)], rtol=1e-15)  # was NaN, NaN
    x = np.array([1.0, -2.0, 0.5])  # -2 ties with the constant 2: the derivative is still x / hypot

    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.hypot(x, 2.0) ** 3)

    for mode in ("grad", "jvp", "hessian"):
        run = {"grad": lambda b: unigrad.grad(f, backend=b)(x),
               "jvp": lambda b: unigrad.jvp(f, (x,), (np.ones(3),), backend=b)[1],
               "hessian": lambda b: unigrad.hessian(f, backend=b)(x)}[mode]
        _close(run(TF), run("numpy"), rtol=1e-12)
