"""The TensorFlow backend: its transforms against the NumPy tape, its namespace against NumPy, and
the points where TensorFlow's own behaviour differs from the contract (None gradients, broadcast
cotangents, IndexedSlices, tensors watched by identity, the conjugate complex convention)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")



import numpy as np  # noqa: E402
import optree  # noqa: E402
import pytest  # noqa: E402

from conftest import skip_module_unless  # noqa: E402

tf = skip_module_unless("tensorflow")
pytestmark = pytest.mark.unigrad_backend("tensorflow")  # run on each device --unigrad-devices names

import array_api_compat.numpy as anp  # noqa: E402

import unigrad  # noqa: E402
from unigrad.testing import check_grads  # noqa: E402
from unigrad.testing._threads import assert_threads_exact  # noqa: E402

TF = "tensorflow"


@pytest.fixture(scope="module")
def b():
    return unigrad.get_backend(TF)


def _np(x):
    return unigrad.to_numpy(x)


def _close(a, e, rtol=1e-10, atol=1e-12):
    np.testing.assert_allclose(_np(a), _np(e), rtol=rtol, atol=atol)


def _tree_close(a, e, **kw):
    if isinstance(e, (tuple, list)):
        assert isinstance(a, (tuple, list)) and len(a) == len(e), (a, e)
        for x, y in zip(a, e):
            _tree_close(x, y, **kw)
    else:
        _close(a, e, **kw)


rng = np.random.default_rng(0)
X = rng.standard_normal((4, 3))
W = rng.standard_normal((3, 2))
U = rng.standard_normal(3)
V = rng.standard_normal(2)


# Portable functions: the same code runs on TensorFlow tensors and on the tape.

def loss(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sum(xp.tanh(xp.matmul(x, w)) ** 2) + xp.sum(w ** 3) / 3.0


def smooth(u, v):
    xp = unigrad.namespace(u, v)
    return xp.sin(u) * xp.exp(v[:1]) + xp.log(1.0 + u * u) * xp.sum(v)


def rows(x, y):
    """Batch to batch, rows independent; two inputs of different ranks, two outputs."""
    xp = unigrad.namespace(x, y)
    s = xp.sum(y * y, axis=(1, 2))
    return xp.tanh(x) * xp.expand_dims(s, axis=1), xp.sum(xp.sin(x), axis=1)


# ------------------------------------------------------------------ the transforms against the tape

TRANSFORMS = {
    "grad": lambda be: unigrad.grad(loss, argnums=(0, 1), backend=be)(W, X),
    "value_and_grad_aux": lambda be: unigrad.value_and_grad(
        lambda w: (loss(w, X), {"w": w * 2.0}), has_aux=True, backend=be)(W),
    "vjp": lambda be: unigrad.vjp(smooth, U, V, backend=be)[1](np.arange(3.0)),
    "jvp": lambda be: unigrad.jvp(smooth, (U, V), (np.ones(3), np.arange(2.0)), backend=be),
    "jac_rev": lambda be: unigrad.jacobian(smooth, argnums=(0, 1), mode="rev", backend=be)(U, V),
    "jac_rev_chunk1": lambda be: unigrad.jacobian(smooth, argnums=(0, 1), mode="rev", chunk_size=1,
                                                  backend=be)(U, V),
    "jac_rev_chunk2": lambda be: unigrad.jacobian(smooth, argnums=(0, 1), mode="rev", chunk_size=2,
                                                  backend=be)(U, V),
    "jac_fwd": lambda be: unigrad.jacobian(smooth, argnums=(0, 1), mode="fwd", backend=be)(U, V),
    "jac_fwd_chunk2": lambda be: unigrad.jacobian(smooth, argnums=(0, 1), mode="fwd", chunk_size=2,
                                                  backend=be)(U, V),
    "jac_auto_pytree": lambda be: unigrad.jacobian(lambda p: smooth(p["u"], p["v"][0]), backend=be)(
        {"u": U, "v": (V,)}),
    "batched_rev": lambda be: unigrad.batched_jacobian(rows, argnums=(0, 1), mode="rev", backend=be)(
        X, X[:, :2, None] * X[:, None, 1:]),
    "batched_rev_chunk2": lambda be: unigrad.batched_jacobian(rows, argnums=(0, 1), mode="rev", chunk_size=2,
                                                              backend=be)(X, X[:, :2, None] * X[:, None, 1:]),
    "batched_fwd": lambda be: unigrad.batched_jacobian(rows, argnums=(0, 1), mode="fwd", backend=be)(
        X, X[:, :2, None] * X[:, None, 1:]),
    "batched_fwd_chunk2_aux": lambda be: unigrad.batched_jacobian(
        lambda x: (unigrad.namespace(x).exp(x) * x[:, :1], x * 3.0), mode="fwd", chunk_size=2, has_aux=True,
        backend=be)(X),
    "hessian": lambda be: unigrad.hessian(loss, argnums=(0, 1), backend=be)(W, X[:2]),
    "hvp": lambda be: unigrad.hvp(loss, (W, X[:2]), (np.ones((3, 2)), np.ones((2, 3))), backend=be),
    "vmap": lambda be: unigrad.vmap(smooth, in_axes=(0, None), backend=be)(X, V),
    "vmap_axes_chunk": lambda be: unigrad.vmap(lambda a, c: (a * c, unigrad.namespace(a).sum(a)), in_axes=(1, 0),
                                               out_axes=-1, chunk_size=2, backend=be)(X, U),
    "vmap_of_grad": lambda be: unigrad.vmap(unigrad.grad(lambda w, x: loss(w, x[None]), backend=be),
                                            in_axes=(None, 0), backend=be)(W, X),
}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_transforms_match_the_tape(name):
    got, want = TRANSFORMS[name](TF), TRANSFORMS[name]("numpy")
    flat_got, flat_want = unigrad.to_numpy(got), unigrad.to_numpy(want)
    leaves_got, tree_got = optree.tree_flatten(flat_got)
    leaves_want, tree_want = optree.tree_flatten(flat_want)
    assert tree_got == tree_want
    for a, e in zip(leaves_got, leaves_want):
        assert a.shape == e.shape and a.dtype == e.dtype, (a.shape, e.shape, a.dtype, e.dtype)
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 4])
def test_backend_hessian_matches_the_tape(b, chunk_size):
    """The adapter's own Hessian (reverse over reverse, for scalar f), which the core may call directly."""
    f = lambda w, x: (loss(w, x),)  # noqa: E731
    got = b.hessian(f, (tf.constant(W), tf.constant(X[:2])), chunk_size=chunk_size)
    want = unigrad.hessian(loss, argnums=(0, 1), backend="numpy")(W, X[:2])
    _tree_close(got, want)


def test_results_are_tensorflow_tensors_and_backend_is_inferred():
    x = tf.constant(X)
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2))(x)  # no backend=: inferred from x
    assert isinstance(g, tf.Tensor) and g.dtype == tf.float64
    _close(g, 2 * X)
    assert unigrad.namespace(x) is unigrad.get_backend(TF).namespace()
    j = unigrad.batched_jacobian(lambda x: x * 2.0)(tf.Variable(X))  # Variables are arrays too
    assert isinstance(j, tf.Tensor)


# ------------------------------------------------------------------ TensorFlow's pitfalls

def test_unused_and_unconnected_inputs_get_zeros_of_their_dtype(b):
    g = unigrad.grad(lambda x, y: unigrad.namespace(x).sum(x ** 2), argnums=(0, 1), backend=TF)(
        np.ones(3, np.float32), np.ones((2, 2)))
    assert isinstance(g[1], tf.Tensor) and g[1].dtype == tf.float64
    _close(g[1], np.zeros((2, 2)))
    # an output that is a constant inside f: TensorFlow gives None, unigrad zeros
    _close(unigrad.grad(lambda x: tf.constant(3.0, tf.float64), backend=TF)(np.ones(2)), np.zeros(2))
    _, t = unigrad.jvp(lambda x: tf.ones_like(x) * 2.0, (np.ones(3),), (np.ones(3),), backend=TF)
    _close(t, np.zeros(3))
    for mode in ("rev", "fwd"):
        j = unigrad.jacobian(lambda x, y: x * 2.0, argnums=(0, 1), mode=mode, backend=TF)(np.ones(2), np.ones(3))
        _close(j[1], np.zeros((2, 3)))
        j = unigrad.batched_jacobian(lambda x, y: x * 2.0, argnums=(0, 1), mode=mode, backend=TF)(
            np.ones((2, 2)), np.ones((2, 3)))
        _close(j[1], np.zeros((2, 2, 3)))
    h = b.hessian(lambda x, y: (tf.reduce_sum(x ** 3),), (tf.ones(2), tf.ones(3)))
    _close(h[1][1], np.zeros((3, 3)))
    _close(h[0][0], 6 * np.eye(2))


def test_wrong_shape_cotangents_and_tangents_raise_instead_of_broadcasting(b):
    _, vjp_fn = unigrad.vjp(lambda x: x * 2.0, tf.ones((2, 3)))
    for bad in (tf.ones(3), tf.ones((1, 3)), tf.constant(1.0)):
        with pytest.raises(ValueError, match="never broadcast"):
            vjp_fn(bad)
    # the adapter checks too, below the core (TensorFlow alone would broadcast a scalar)
    _, vjp_flat, _ = b.vjp(lambda x: (x * 2.0,), (tf.ones((2, 3)),))
    with pytest.raises(ValueError, match=r"cotangent 0 has shape \(\), dtype float32; expected shape \(2, 3\)"):
        vjp_flat((tf.constant(1.0),))
    with pytest.raises(ValueError, match="tangent 0 has shape"):
        b.jvp(lambda x: (x * 2.0,), (tf.ones((2, 3)),), (tf.ones(3),))


def test_primals_are_watched_separately_from_each_other_and_from_closures():
    x = tf.constant([1.0, 2.0])
    # the same tensor passed twice: each argument gets its own partial derivative, not the sum
    grads = unigrad.vjp(lambda a, c: a * 2.0 + c * 3.0, x, x)[1](tf.ones(2))
    _close(grads[0], [2.0, 2.0])
    _close(grads[1], [3.0, 3.0])
    # f closes over the very tensor it is differentiated at: the closure is a constant
    _close(unigrad.grad(lambda a: tf.reduce_sum(a * x))(x), [1.0, 2.0])
    _close(unigrad.jvp(lambda a: a * x, (x,), (tf.ones(2),))[1], [1.0, 2.0])
    _close(unigrad.jacobian(lambda a: a * x, mode="rev")(x), np.diag([1.0, 2.0]))


def test_gather_gradients_are_dense(b):
    def f(x):
        return tf.reduce_sum(tf.gather(x, [0, 0, 2]) ** 2)

    g = unigrad.grad(f)(tf.constant([1.0, 2.0, 3.0]))
    assert type(g) is type(tf.constant(0.0)), type(g)  # not IndexedSlices
    _close(g, [4.0, 0.0, 6.0])
    _, vjp_fn, _ = b.vjp(lambda x: (tf.gather(x, [1]),), (tf.ones((3, 2)),))
    (g,) = vjp_fn((tf.ones((1, 2)),))
    assert isinstance(g, tf.Tensor) and not isinstance(g, tf.IndexedSlices)
    _close(g, [[0, 0], [1, 1], [0, 0]])
    _close(unigrad.hvp(f, (tf.constant([1.0, 2.0, 3.0]),), (tf.ones(3),))[0], [4.0, 0.0, 2.0])


def test_variables_are_read_into_plain_tensors_and_aux_is_detached():
    seen = []

    def f(x):
        seen.append(type(x))
        return tf.reduce_sum(x ** 2), {"double": x * 2.0, "label": "kept"}

    g, aux = unigrad.grad(f, has_aux=True)(tf.Variable([1.0, 2.0]))
    _close(g, [2.0, 4.0])
    assert not issubclass(seen[0], tf.Variable)
    assert isinstance(aux["double"], tf.Tensor) and aux["label"] == "kept"
    with tf.GradientTape() as tape:  # aux carries no gradient: a tape outside sees no path through it
        v = tf.constant([1.0, 2.0])
        tape.watch(v)
        _, aux = unigrad.grad(f, has_aux=True)(v)
    assert tape.gradient(aux["double"], v) is None


def test_complex_follows_the_jax_convention(b):
    z = tf.constant(3 + 4j, tf.complex128)
    _close(unigrad.grad(lambda z: tf.math.real(z * tf.math.conj(z)))(z), 6 - 8j)
    zs = np.array([3 + 4j, 1 - 2j])
    xp = lambda a: unigrad.namespace(a)  # noqa: E731
    abs2 = lambda z: xp(z).sum(xp(z).real(z) ** 2 + xp(z).imag(z) ** 2)  # noqa: E731
    _close(unigrad.grad(abs2, backend=TF)(zs), 2 * np.conj(zs))
    # holomorphic: vjp(ct) = ct * f'(z), jvp(t) = f'(z) t, both Jacobians f'(z)
    ct = np.array([1 - 1j, 2 + 0.5j])
    _close(unigrad.vjp(lambda z: z * z, zs, backend=TF)[1](ct)[0], ct * 2 * zs)
    _close(unigrad.jvp(lambda z: z * z, (zs,), (ct,), backend=TF)[1], ct * 2 * zs)
    for mode in ("rev", "fwd"):
        _close(unigrad.jacobian(lambda z: z * z, mode=mode, backend=TF)(zs), np.diag(2 * zs))
        _close(unigrad.batched_jacobian(lambda z: z * z, mode=mode, backend=TF)(zs[:, None]),
               (2 * zs)[:, None, None])
    # a complex output of a real input, and second order: as on the tape
    real_in = lambda x: xp(x).add(xp(x).multiply(x, 1 + 2j), x * x)  # noqa: E731
    _close(unigrad.vjp(real_in, U, backend=TF)[1](U * 1j)[0], unigrad.vjp(real_in, U)[1](U * 1j)[0])
    quartic = lambda z: xp(z).sum(xp(z).real(z * xp(z).conj(z)) ** 2)  # noqa: E731
    _close(unigrad.hvp(quartic, (zs,), (ct,), backend=TF)[0], unigrad.hvp(quartic, (zs,), (ct,))[0])
    _close(b.hessian(lambda z: (quartic(z),), (tf.constant(zs),))[0][0], unigrad.hessian(quartic)(zs))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_gradient_and_jacobian_dtypes_equal_the_input_dtype(b, dtype):
    x = unigrad.asarray(np.array([0.5, 1.0, 1.5]), backend=TF, dtype=dtype)
    assert b.dtype(x) == dtype
    f = lambda x: x * x * 3.0  # noqa: E731 -- a Python scalar keeps the dtype
    tol = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-6, "float64": 1e-12}[dtype]
    v = np.array([0.5, 1.0, 1.5])
    for result, want in ((unigrad.grad(lambda x: tf.reduce_sum(f(x)))(x), 6 * v),
                         (unigrad.vjp(f, x)[1](x)[0], 6 * v * v), (unigrad.jvp(f, (x,), (x,))[1], 6 * v * v),
                         (unigrad.hvp(lambda x: tf.reduce_sum(f(x)), (x,), (x,))[0], 6 * v)):
        assert b.dtype(result) == dtype
        _close(np.asarray(_np(result), np.float64), want, rtol=tol, atol=tol)
    for mode in ("rev", "fwd"):
        j = unigrad.jacobian(f, mode=mode)(x)
        assert b.dtype(j) == dtype
        _close(np.asarray(_np(j), np.float64), np.diag(6 * v), rtol=tol, atol=tol)


def test_mixed_dtype_inputs_and_outputs_in_batched_jacobians():
    def f(x, y):
        xp = unigrad.namespace(x, y)
        return x * xp.astype(xp.sum(y, axis=1, keepdims=True), xp.float32), xp.sin(y) * 2.0

    args = (X.astype(np.float32), X[:, :2])
    for mode in ("rev", "fwd"):
        got = unigrad.batched_jacobian(f, argnums=(0, 1), mode=mode, backend=TF)(*args)
        want = unigrad.batched_jacobian(f, argnums=(0, 1), mode=mode, backend="numpy")(*args)
        for g_row, w_row in zip(got, want):
            for g, w in zip(g_row, w_row):
                assert g.dtype.name == w.dtype.name
                _close(g, w, rtol=1e-5, atol=1e-6)


def test_zero_size_zero_dim_scalars_and_strided_numpy_inputs(b):
    assert b.shape(unigrad.grad(lambda x: tf.reduce_sum(x ** 2), backend=TF)(np.zeros((0, 3)))) == (0, 3)
    g = unigrad.grad(lambda x: x ** 3, backend=TF)(2.0)  # a Python float is float64
    assert b.dtype(g) == "float64" and b.shape(g) == ()
    _close(g, 12.0)
    for mode in ("rev", "fwd"):
        assert b.shape(unigrad.jacobian(lambda x: x * 2.0, mode=mode, backend=TF)(np.zeros(0))) == (0, 0)
        assert b.shape(unigrad.jacobian(lambda x: tf.reduce_sum(x, axis=1), mode=mode, backend=TF)(
            np.zeros((2, 0)))) == (2, 2, 0)
        assert b.shape(unigrad.batched_jacobian(lambda x: x[:, :0], mode=mode, backend=TF)(np.ones((2, 3)))) == (2, 0, 3)
        _close(unigrad.jacobian(lambda x: x ** 2, mode=mode, backend=TF)(np.array(3.0)), 6.0)
    assert b.shape(unigrad.vmap(lambda r: r * 2.0, backend=TF)(np.zeros((0, 3)))) == (0, 3)
    base = np.arange(1.0, 13.0).reshape(3, 4)
    for x in (base.T, base[::-1, ::-2], np.asfortranarray(base)):
        _close(unigrad.grad(lambda x: unigrad.namespace(x).sum(x ** 2), backend=TF)(x), 2 * x)


def test_an_exception_inside_f_leaves_no_tape_or_accumulator_behind():
    from tensorflow.python.eager import record  # TensorFlow's own "is anything recording?" flag

    def bad(x):
        _ = x * 2.0
        raise KeyError("inside f")

    x = tf.ones((2, 2))
    calls = [lambda: unigrad.grad(lambda x: tf.reduce_sum(bad(x)))(x),
             lambda: unigrad.jvp(bad, (x,), (x,)),
             lambda: unigrad.jacobian(bad, mode="rev")(x),
             lambda: unigrad.jacobian(bad, mode="fwd")(x),
             lambda: unigrad.batched_jacobian(bad, mode="rev", check_independence="never")(x),
             lambda: unigrad.batched_jacobian(bad, mode="fwd", check_independence="never")(x),
             lambda: unigrad.hvp(lambda x: tf.reduce_sum(bad(x)), (x,), (x,)),
             lambda: unigrad.vmap(bad)(x)]
    for call in calls:
        with pytest.raises(KeyError):
            call()
        assert not record.could_possibly_record()
    _close(unigrad.grad(lambda x: tf.reduce_sum(x ** 2))(x), 2 * np.ones((2, 2)))


def test_concurrent_threads_give_exact_results():
    xs = [rng.standard_normal((3, 3)) for _ in range(8)]

    def work(x):
        x = tf.constant(x)
        return (unigrad.grad(lambda w: loss(w, x))(tf.constant(W)),
                unigrad.jvp(lambda x: tf.sin(x) * x, (x,), (x,))[1],
                unigrad.batched_jacobian(lambda x: tf.tanh(x) * x[:, :1], mode="rev",
                                         check_independence="never")(x))

    assert_threads_exact(work, xs)


# ------------------------------------------------------------------ compile, devices, conversion

def test_compiled_transforms_match_eager(b):
    x, w = tf.constant(X), tf.constant(W)
    for transform in (unigrad.grad, unigrad.jacfwd, unigrad.batched_jacobian):
        f = (lambda w, x: tf.tanh(x @ w) * 2.0) if transform is unigrad.batched_jacobian else loss
        argnums = 1 if transform is unigrad.batched_jacobian else 0
        eager = transform(f, argnums=argnums)
        compiled = transform(f, argnums=argnums, compile=True)
        for scale in (1.0, 2.0):  # the second call runs the traced program on new values
            _close(compiled(w * scale, x), eager(w * scale, x))
    # the adapter's compile is a tf.function, and its transforms trace with static shapes
    fn = b.compile(lambda x: b.vmap(lambda r: (tf.reduce_sum(r ** 2),), [0], 0, 2)(x))
    assert isinstance(fn.function, tf.types.experimental.PolymorphicFunction)
    _close(fn(x)[0], np.sum(X ** 2, axis=1))


def test_compiled_variable_then_tensor_of_one_shape():
    """A program traced for a tf.Variable takes a resource handle: a tf.Tensor of the same shape and
    dtype next used to crash it (and a Variable after a tensor), through the direct path and the whole."""
    g = unigrad.grad(loss, compile=True)
    want = unigrad.grad(loss, backend="numpy")(W, X)
    for w in (tf.Variable(W), tf.constant(W), tf.Variable(W), tf.constant(W)):
        _close(g(w, tf.constant(X)), want)
        _close(g(w, tf.Variable(X)), want)


def test_devices_and_conversion(b):
    assert b.devices()[0] == "cpu" and all(d.startswith("cuda:") for d in b.devices()[1:])
    x = b.asarray(np.arange(3.0), device="cpu")
    assert b.device(x) == "cpu" and b.dtype(x) == "float64" and b.shape(x) == (3,)
    assert b.dtype(b.asarray(np.arange(3.0), dtype="bfloat16")) == "bfloat16"
    assert b.dtype(b.cast(x, "float32")) == "float32" and b.dtype(b.zeros_like(x)) == "float64"
    assert b.is_array(tf.Variable([1.0])) and not b.is_array(np.ones(2))
    assert b.version() == tf.__version__
    with pytest.raises(ValueError, match="unknown device"):
        b.asarray(x, device="tpu")
    if len(b.devices()) == 1:  # TensorFlow would silently place it on the CPU
        with pytest.raises(ValueError, match="not available"):
            b.asarray(x, device="cuda")
    else:
        y = b.asarray(x, device="cuda")
        assert b.device(y) == "cuda:0"
        _close(unigrad.grad(lambda v: tf.reduce_sum(v ** 2))(y), 2 * np.arange(3.0))


class _DLPackOnly:
    """Another framework's array, as unigrad sees it: the DLPack protocol, and ``__array__`` (counted)."""

    def __init__(self, array, exportable=True):
        self.array, self.exportable, self.through_numpy = array, exportable, 0

    def __dlpack__(self, **kwargs):
        if not self.exportable:  # torch refuses tensors that require grad like this
            raise BufferError("cannot export this array")
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __array__(self, dtype=None, copy=None):
        self.through_numpy += 1
        return np.asarray(self.array, dtype=dtype)


def test_arrays_of_other_frameworks_convert_by_dlpack_safely(b):
    memory = np.zeros(16)
    start = (-memory.ctypes.data % 64) // 8
    aligned = memory[start:start + 6].reshape(2, 3)
    aligned[:] = np.arange(6.0).reshape(2, 3)
    source = _DLPackOnly(aligned)
    converted = b.asarray(source)
    assert source.through_numpy == 0  # DLPack, not NumPy
    _close(converted, np.arange(6.0).reshape(2, 3))
    aligned[0, 0] = 100.0  # copied on the device, not shared: TensorFlow tensors must never change
    assert _np(converted)[0, 0] == 0.0
    # 8 bytes further the data is not 64-byte aligned: TensorFlow would take it through DLPack, and its
    # kernels would then abort the whole process; it is copied through NumPy instead
    _close(b.asarray(_DLPackOnly(memory[start + 1:start + 7])), memory[start + 1:start + 7])
    _close(b.asarray(_DLPackOnly(aligned[:, ::2])), aligned[:, ::2])  # strides TensorFlow cannot take
    refused = _DLPackOnly(aligned, exportable=False)  # an array that cannot be exported at all
    _close(b.asarray(refused), aligned)
    assert refused.through_numpy == 1
    _close(unigrad.namespace(tf.ones(1)).from_dlpack(_DLPackOnly(aligned)), aligned)
    torch = __import__("sys").modules.get("torch")  # only if something already imported it (slow to import)
    if torch is not None:
        t = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
        _close(unigrad.grad(lambda v: tf.reduce_sum(v ** 2), backend=TF)(t), 2 * t.numpy())


# ------------------------------------------------------------------ the namespace, op by op

A = rng.standard_normal((3, 4))
B = rng.standard_normal((3, 4))
POS = rng.uniform(0.5, 2.0, (3, 4))
UNIT = rng.uniform(-0.9, 0.9, (3, 4))
A3 = rng.standard_normal((2, 3, 4))
C = rng.standard_normal((4, 2))
U3, V4, W3 = rng.standard_normal(3), rng.standard_normal(4), rng.standard_normal(3)
SQ = rng.standard_normal((3, 3)) + 3 * np.eye(3)
SPD = SQ @ SQ.T + np.eye(3)
SPECIAL = np.array([-0.0, 0.0, -1.5, 2.5, np.inf, -np.inf, np.nan])
TIES = np.array([[1.0, 2.0, 1.0, 2.0], [0.0, 0.0, 3.0, -1.0]])
INF = float("inf")


def _op(name, fn, *args, grad=True, ref=None):
    """One namespace case: ``fn(xp, *args)``; ``ref(np_args...)`` when NumPy spells it differently."""
    return pytest.param(fn, args, grad, ref, id=name)


def _getitem(name, index, array=A):
    return _op(f"getitem_{name}", lambda xp, a: xp.getitem(a, index), array, ref=lambda a: a[index])


NAMESPACE_CASES = [
    *[_op(n, lambda xp, a, n=n: getattr(xp, n)(a), a) for n, a in [
        ("exp", A), ("expm1", A), ("log", POS), ("log1p", POS), ("log2", POS), ("log10", POS), ("sqrt", POS),
        ("sin", A), ("cos", A), ("tan", UNIT), ("sinh", A), ("cosh", A), ("tanh", A), ("asin", UNIT),
        ("acos", UNIT), ("atan", A), ("asinh", A), ("acosh", POS + 1.0), ("atanh", UNIT), ("abs", A),
        ("negative", A), ("positive", A), ("square", A), ("sign", A), ("reciprocal", POS), ("floor", 3 * A),
        ("ceil", 3 * A), ("trunc", 3 * A), ("round", 3 * A)]],
    *[_op(n, lambda xp, a, n=n: getattr(xp, n)(a), a, grad=False) for n, a in [
        ("real", A + 2j * B), ("imag", A + 2j * B), ("conj", A + 2j * B), ("isnan", SPECIAL), ("isinf", SPECIAL),
        ("isfinite", SPECIAL), ("signbit", SPECIAL), ("logical_not", A > 0)]],
    *[_op(n, lambda xp, a, c, n=n: getattr(xp, n)(a, c), a, c) for n, a, c in [
        ("add", A, B), ("subtract", A, B), ("multiply", A, B), ("divide", A, POS), ("pow", POS, A),
        ("maximum", A, B), ("minimum", A, B), ("atan2", A, B), ("hypot", A, B), ("logaddexp", A, B),
        ("copysign", A, B)]],
    *[_op(n, lambda xp, a, c, n=n: getattr(xp, n)(a, c), a, c, grad=False) for n, a, c in [
        ("floor_divide", 3 * A, POS), ("remainder", 3 * A, POS), ("equal", A, A * (A > 0)),
        ("not_equal", A, A * (A > 0)), ("less", A, B), ("less_equal", A, B), ("greater", A, B),
        ("greater_equal", A, B), ("logical_and", A > 0, B > 0), ("logical_or", A > 0, B > 0),
        ("logical_xor", A > 0, B > 0)]],
    _op("where", lambda xp, a, c: xp.where(a > 0, a, c), A, B),
    _op("where_scalar", lambda xp, a: xp.where(a > 0, a, 0.5), A),
    _op("clip_scalars", lambda xp, a: xp.clip(a, -0.5, 0.5), A),
    _op("clip_arrays", lambda xp, a, lo: xp.clip(a, lo, lo + 1.0), A, B),
    _op("sum", lambda xp, a: xp.sum(a), A),
    _op("sum_axis_keepdims", lambda xp, a: xp.sum(a, axis=(0, 2), keepdims=True), A3),
    _op("sum_bool", lambda xp, a: xp.sum(a > 0, axis=1), A, grad=False),
    _op("mean", lambda xp, a: xp.mean(a, axis=0), A),
    _op("var", lambda xp, a: xp.var(a, axis=1, correction=1), A),
    _op("std", lambda xp, a: xp.std(a, correction=1), A),
    _op("std_keepdims", lambda xp, a: xp.std(a, axis=-1, keepdims=True), A3),
    _op("max", lambda xp, a: xp.max(a, axis=1), A),
    _op("min", lambda xp, a: xp.min(a), A),
    _op("prod", lambda xp, a: xp.prod(a, axis=0), POS),
    _op("logsumexp", lambda xp, a: xp.logsumexp(a, axis=1), A, ref=lambda a: np.log(np.sum(np.exp(a), axis=1))),
    _op("cumulative_sum", lambda xp, a: xp.cumulative_sum(a, axis=1), A),
    _op("cumulative_sum_initial", lambda xp, a: xp.cumulative_sum(a, axis=0, include_initial=True), A),
    _op("cumulative_prod", lambda xp, a: xp.cumulative_prod(a, axis=1), POS),
    _op("all", lambda xp, a: xp.all(a > -1, axis=0), A, grad=False),
    _op("any", lambda xp, a: xp.any(a > 1, axis=1, keepdims=True), A, grad=False),
    _op("count_nonzero", lambda xp, a: xp.count_nonzero(a > 0, axis=1), A, grad=False),
    _op("reshape", lambda xp, a: xp.reshape(a, (4, -1)), A),
    _op("permute_dims", lambda xp, a: xp.permute_dims(a, (2, 0, 1)), A3),
    _op("matrix_transpose", lambda xp, a: xp.matrix_transpose(a), A3),
    _op("moveaxis", lambda xp, a: xp.moveaxis(a, 0, -1), A3),
    _op("expand_dims", lambda xp, a: xp.expand_dims(a, axis=-2), A),
    _op("squeeze", lambda xp, a: xp.squeeze(a[:, :1], axis=1), A),
    _op("flip", lambda xp, a: xp.flip(a, axis=0), A),
    _op("flip_all", lambda xp, a: xp.flip(a), A),
    _op("roll", lambda xp, a: xp.roll(a, 2, axis=1), A),
    _op("roll_flat", lambda xp, a: xp.roll(a, -5), A),
    _op("concat", lambda xp, a, c: xp.concat([a, c], axis=1), A, B),
    _op("concat_none", lambda xp, a, c: xp.concat([a, c], axis=None), A, B),
    _op("stack", lambda xp, a, c: xp.stack([a, c], axis=1), A, B),
    _op("unstack", lambda xp, a: xp.unstack(a, axis=1), A),
    _op("tile", lambda xp, a: xp.tile(a, (2, 1, 1)), A),
    _op("repeat", lambda xp, a: xp.repeat(a, 2, axis=1), A),
    _op("broadcast_to", lambda xp, a: xp.broadcast_to(a[:1], (2, 3, 4)), A),
    _op("take", lambda xp, a: xp.take(a, xp.asarray([2, 0, -1]), axis=1), A),
    _op("take_along_axis", lambda xp, a: xp.take_along_axis(a, xp.argsort(a, axis=0), axis=0), A),
    *[_getitem(name, index) for name, index in [
        ("slices", (slice(1, None), slice(None, None, -2))), ("ellipsis", (Ellipsis, 1)), ("newaxis", (None, 0)),
        ("int_array", [0, 2, 2]), ("int_array_axis1", (slice(None), np.array([1, 3]))),
        ("two_arrays", (np.array([0, 1]), np.array([2, -1]))), ("array_then_slice", (np.array([0, 2]), slice(1, None))),
        ("int_and_array", (1, np.array([0, 3]))), ("mask", A > 0),
        ("mask_axis1", (slice(None), np.array([True, False, True, False])))]],
    _getitem("separated_arrays", (np.array([0, 1]), slice(None), np.array([1, 0])), A3),
    _getitem("arrays_around_newaxis", (np.array([[0], [1]]), None, np.array([2, 3])), A3[0]),
    _op("sort", lambda xp, a: xp.sort(a, axis=1), A),
    _op("sort_descending", lambda xp, a: xp.sort(a, axis=0, descending=True), A),
    _op("argsort", lambda xp, a: xp.argsort(a, axis=1), TIES, grad=False),
    _op("argsort_descending_stable", lambda xp, a: xp.argsort(a, axis=1, descending=True), TIES, grad=False),
    _op("argmax", lambda xp, a: xp.argmax(a, axis=1), A, grad=False),
    _op("argmax_flat", lambda xp, a: xp.argmax(a), A, grad=False),
    _op("argmin_keepdims", lambda xp, a: xp.argmin(a, axis=0, keepdims=True), A, grad=False),
    _op("matmul", lambda xp, a, c: xp.matmul(a, c), A, C),
    _op("matmul_matrix_vector", lambda xp, a, v: xp.matmul(a, v), A, V4),
    _op("matmul_vector_matrix", lambda xp, u, a: xp.matmul(u, a), U3, A),
    _op("matmul_vectors", lambda xp, v, w: xp.matmul(v, w), V4, V4 + 1.0),
    _op("matmul_broadcast", lambda xp, a, c: xp.matmul(a, c), A3, C),
    _op("tensordot", lambda xp, a, c: xp.tensordot(a, c, axes=1), A, C),
    _op("tensordot_pairs", lambda xp, a, c: xp.tensordot(a, c, axes=([0, 1], [0, 1])), A, B),
    _op("vecdot", lambda xp, a, c: xp.vecdot(a, c), A, B),
    _op("outer", lambda xp, u, v: xp.outer(u, v), U3, V4),
    _op("dot", lambda xp, a, c: xp.dot(a, c), A3, C),
    _op("einsum", lambda xp, a, c: xp.einsum("bij,jk->bki", a, c), A3, C),
    _op("trace", lambda xp, a: xp.trace(a), SQ),
    _op("trace_offset", lambda xp, a: xp.linalg.trace(a, offset=1), A),
    _op("diagonal", lambda xp, a: xp.linalg.diagonal(a, offset=-1), A),
    _op("diag_vector", lambda xp, u: xp.diag(u, k=1), U3),
    _op("diag_matrix", lambda xp, a: xp.diag(a), A),
    _op("tril", lambda xp, a: xp.tril(a, k=1), A),
    _op("triu", lambda xp, a: xp.triu(a), A),
    _op("solve_vector", lambda xp, m, u: xp.linalg.solve(m, u), SQ, U3),
    _op("solve_matrix_broadcast", lambda xp, m, c: xp.linalg.solve(m, c), SQ, A3[:, :, :2]),
    _op("inv", lambda xp, m: xp.linalg.inv(m), SQ),
    _op("det", lambda xp, m: xp.linalg.det(m), SQ),
    _op("slogdet", lambda xp, m: xp.linalg.slogdet(m).logabsdet, -SQ),
    _op("slogdet_sign", lambda xp, m: xp.linalg.slogdet(m).sign, -SQ, grad=False),
    _op("cholesky", lambda xp, m: xp.linalg.cholesky(m), SPD),
    _op("cholesky_upper", lambda xp, m: xp.linalg.cholesky(m, upper=True), SPD),
    _op("qr_r", lambda xp, a: xp.linalg.qr(a).R, A.T),
    _op("eigh_values", lambda xp, m: xp.linalg.eigh(m).eigenvalues, SPD),
    _op("eigvalsh", lambda xp, m: xp.linalg.eigvalsh(m), SPD),
    _op("svd_values", lambda xp, a: xp.linalg.svd(a, full_matrices=False).S, A),
    _op("svdvals", lambda xp, a: xp.linalg.svdvals(a), A3),
    _op("vector_norm", lambda xp, a: xp.linalg.vector_norm(a), A),
    _op("vector_norm_axis_ord1", lambda xp, a: xp.linalg.vector_norm(a, axis=1, ord=1), A),
    _op("vector_norm_inf", lambda xp, a: xp.linalg.vector_norm(a, ord=INF, keepdims=True), A),
    _op("vector_norm_ord3", lambda xp, a: xp.linalg.vector_norm(a, axis=0, ord=3), A),
    *[_op(f"matrix_norm_{o}", lambda xp, a, o=o: xp.linalg.matrix_norm(a, ord=o), A3) for o in
      ("fro", "nuc", 2, -2, 1, -1, INF, -INF)],
    _op("pinv", lambda xp, a: xp.linalg.pinv(a), A),
    *[_op(f"matrix_power_{n}", lambda xp, m, n=n: xp.linalg.matrix_power(m, n), SQ) for n in (3, -2, 0)],
    _op("cross", lambda xp, u, w: xp.linalg.cross(u, w), U3, W3),
    _op("matrix_rank", lambda xp, a: xp.linalg.matrix_rank(a), A3, grad=False),
    *[_op(name, fn, grad=False) for name, fn in [
        ("zeros", lambda xp: xp.zeros((2, 3))), ("ones_float32", lambda xp: xp.ones(3, dtype=xp.float32)),
        ("eye_offset", lambda xp: xp.eye(3, 4, k=1)), ("full", lambda xp: xp.full((2,), 3.5)),
        ("full_int", lambda xp: xp.full((2,), 3)), ("arange", lambda xp: xp.arange(5)),
        ("arange_float", lambda xp: xp.arange(0, 1, 0.25)), ("linspace", lambda xp: xp.linspace(0, 1, 5)),
        ("linspace_open", lambda xp: xp.linspace(0.0, 1.0, 4, endpoint=False)),
        ("asarray_nested", lambda xp: xp.asarray([[1.0, 2.0]])), ("asarray_float32", lambda xp: xp.asarray(
            [1, 2], dtype=xp.float32)), ("zeros_like", lambda xp: xp.zeros_like(xp.asarray(A))),
        ("ones_like_dtype", lambda xp: xp.ones_like(xp.asarray(A), dtype=xp.float32)),
        ("meshgrid", lambda xp: xp.meshgrid(xp.asarray(U3), xp.asarray(V4)))]],
]


def _scalarise(fn):
    def scalar(*args):
        xp = unigrad.namespace(*args)
        out = fn(xp, *args)
        return sum(xp.sum(xp.sin(o)) for o in out) if isinstance(out, tuple) else xp.sum(xp.sin(out))
    return scalar


@pytest.mark.parametrize(("fn", "args", "grad", "ref"), NAMESPACE_CASES)
def test_namespace_matches_numpy_and_its_gradients_match_the_tape(fn, args, grad, ref):
    xp = unigrad.get_backend(TF).namespace()
    got = fn(xp, *[tf.constant(a) for a in args])
    want = ref(*args) if ref is not None else fn(anp, *args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g).__name__ == "Array" and isinstance(unigrad.to_native(g), tf.Tensor)  # the standard's arrays
        w = np.asarray(w)
        assert _np(g).dtype == w.dtype, (_np(g).dtype, w.dtype)
        np.testing.assert_allclose(_np(g), w, rtol=1e-10, atol=1e-12)
    if not grad:
        return
    argnums = tuple(i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f")
    f = _scalarise(fn)
    got = unigrad.grad(f, argnums=argnums, backend=TF)(*args)
    try:
        want = unigrad.grad(f, argnums=argnums, backend="numpy")(*args)
    except AttributeError:  # not on the tape: finite differences, both modes and the transpose test
        check_grads(f, args, order=1, argnums=argnums, backend=TF)
        return
    _tree_close(got, want, rtol=1e-9, atol=1e-11)


def test_namespace_promotion_and_dtype_utilities():
    xp = unigrad.get_backend(TF).namespace()
    x32, x64 = tf.ones(2, tf.float32), tf.ones(2, tf.float64)
    assert xp.multiply(x32, 2.0).dtype == tf.float32 and (x32 * 2.0).dtype == tf.float32  # weak scalars
    assert xp.add(x32, x64).dtype == tf.float64 and xp.matmul(x32, x64).dtype == tf.float64
    assert xp.add(tf.ones(2, tf.int32), 1.5).dtype == tf.float64
    assert xp.multiply(x32, 1j).dtype == tf.complex64
    assert xp.where(x32 > 0, x32, 0).dtype == tf.float32 and xp.concat([x32, x64]).dtype == tf.float64
    assert xp.isdtype(xp.float32, "real floating") and xp.isdtype(xp.int8, ("bool", "signed integer"))
    assert not xp.isdtype(xp.complex64, "real floating") and xp.isdtype(xp.uint8, "unsigned integer")
    assert xp.result_type(xp.float32, xp.float64) == xp.float64 and xp.can_cast(xp.float32, xp.float64)
    assert xp.finfo(xp.float32).eps == np.finfo(np.float32).eps and xp.iinfo(xp.int8).max == 127
    assert xp.finfo(xp.bfloat16).bits == 16 and xp.size(xp.zeros((2, 3))) == 6
    assert xp.astype(x32, xp.float16).dtype == tf.float16 and xp.astype(x32, "float64").dtype == tf.float64
    assert xp.linalg.qr(tf.constant(A)).Q.shape == (3, 3)
    with pytest.raises(ValueError, match="square"):
        xp.linalg.inv(tf.constant(A))
    _close(xp.linalg.vector_norm(tf.zeros(3, tf.float64)), 0.0)
    _close(unigrad.grad(lambda x: xp.linalg.vector_norm(x))(tf.zeros(3, tf.float64)), np.zeros(3))  # not NaN


def test_threads_sharing_a_compiled_program_trace_it_once():
    """A compiled program's first call for a signature traces under the program's lock: threads that meet
    it together trace one tf.function once, never concurrently (docs/conventions.md, Threads)."""
    import threading
    import time

    b = unigrad.get_backend("tensorflow")
    compiled = b.compile(lambda x: (x * 2.0,))
    real, calls, inside, overlap = compiled.function.get_concrete_function, [], [0], []

    def slow_trace(*args):  # a trace that takes long enough for every thread to arrive meanwhile
        inside[0] += 1
        overlap.append(inside[0])
        time.sleep(0.2)
        calls.append(1)
        try:
            return real(*args)
        finally:
            inside[0] -= 1

    compiled.function.get_concrete_function = slow_trace
    x = tf.constant(np.arange(3.0))
    barrier, results = threading.Barrier(4), []

    def run():
        barrier.wait()
        results.append(compiled(x)[0].numpy())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and max(overlap) == 1
    for r in results:
        np.testing.assert_array_equal(r, [0.0, 2.0, 4.0])
