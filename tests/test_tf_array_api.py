"""TensorFlow and the Array API standard: the arrays ``f`` receives inside every transform (operators,
indexing, attributes, promotion), and the namespace's functions against ``array_api_strict``."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import math  # noqa: E402

import numpy as np  # noqa: E402
import optree  # noqa: E402
import pytest  # noqa: E402

from conftest import optional, requires, skip_module_unless  # noqa: E402

tf = skip_module_unless("tensorflow")

import unigrad  # noqa: E402

TF = "tensorflow"
rng = np.random.default_rng(3)
M = rng.standard_normal((3, 3))
V = rng.standard_normal(3)
X = rng.standard_normal((4, 3))


def _leaves(tree):
    return optree.tree_leaves(tree, is_leaf=lambda x: isinstance(x, tf.Tensor))


def _same(got, want, rtol=1e-9):
    got, want = _leaves(got), optree.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is not unigrad_tensorflow().Array  # results are plain tensors
        np.testing.assert_allclose(unigrad.to_numpy(g), w, rtol=rtol, atol=1e-12)


def unigrad_tensorflow():
    import unigrad_tensorflow as m
    return m


# ------------------------------------------------------------------ portable functions, operators included

seen = []


def portable(v, m):
    """Array API code with operators only: 1-D matmul, integer-array and boolean indexing, .T / .mT,
    reflected operators, Python scalars."""
    seen.append(v)
    xp = v.__array_namespace__()
    y = m @ v                   # 2-D @ 1-D
    z = v @ m.T @ v             # 1-D @ 2-D @ 1-D: a scalar
    picked = v[xp.asarray([2, 0])] * 2.0 + v[v > -10.0][0]
    return (xp.sum(xp.tanh(y) ** 2) + z + xp.sum(picked) + (1.0 / (3.0 + v))[0] + (2.0 ** v)[1]
            - xp.sum(m.mT @ v) + abs(-v)[2] + (-v)[0])


def batched(x, m):
    seen.append(x)
    m = unigrad.namespace(x).asarray(m)  # m is not differentiated here: see the guide (arguments)
    return (x @ m.mT) ** 2 + x[:, 0:1] * x.T.T - 1.0


def batched2(x, m):
    seen.append(x)
    return (x * m) ** 2 + x[:, 0:1] * m.T.T - m[:, [2]]


@pytest.mark.parametrize("compile", [False, True])
def test_portable_function_with_operators_runs_in_every_transform(compile):
    kw = {"compile": True} if compile else {}
    transforms = {
        "grad": lambda b, **k: unigrad.grad(portable, argnums=(0, 1), backend=b, **k)(V, M),
        "jacrev": lambda b, **k: unigrad.jacobian(portable, mode="rev", argnums=(0, 1), backend=b, **k)(V, M),
        "jacfwd": lambda b, **k: unigrad.jacobian(portable, mode="fwd", argnums=(0, 1), backend=b, **k)(V, M),
        "hessian": lambda b, **k: unigrad.hessian(portable, argnums=(0, 1), backend=b, **k)(V, M),
        "bj_rev": lambda b, **k: unigrad.batched_jacobian(batched2, mode="rev", argnums=(0, 1), backend=b,
                                                          **k)(X, X[::-1] + 1.0),
        "bj_fwd": lambda b, **k: unigrad.batched_jacobian(batched, mode="fwd", backend=b, **k)(X, M),
    }
    if not compile:
        transforms.update({
            "vjp": lambda b: unigrad.vjp(portable, V, M, backend=b)[1](unigrad.asarray(1.0, backend=b)),
            "jvp": lambda b: unigrad.jvp(portable, (V, M), (V, M), backend=b)[1],
            "hvp": lambda b: unigrad.hvp(portable, (V, M), (V, M), backend=b),
            "vmap": lambda b: unigrad.vmap(lambda r, m: unigrad.namespace(r).sum(m @ r) + r[0], backend=b)(
                X, np.stack([M] * 4)),
        })
    Array = unigrad_tensorflow().Array
    for name, run in transforms.items():
        want = run("numpy")
        seen.clear()
        got = run(TF, **kw) if name in ("grad", "jacrev", "jacfwd", "hessian", "bj_rev", "bj_fwd") else run(TF)
        _same(got, want)
        if name != "vmap":
            # (batched_jacobian also reads portable f on the NumPy tape to prove its rows independent: those
            # calls see the analysis's tracers; every call TensorFlow runs sees Arrays)
            from unigrad.tape._tracer import Tracer
            seen[:] = [a for a in seen if not isinstance(a, Tracer)]
            assert seen and all(type(a) is Array for a in seen), (name, {type(a) for a in seen})


def test_attributes_of_the_arrays_f_receives():
    got = {}

    def f(x):
        xp = unigrad.namespace(x)
        got.update(shape=x.shape, dtype=x.dtype, device=x.device, size=x.size, ndim=x.ndim, T=x.T.shape,
                   mT=x.mT.shape, ns=x.__array_namespace__(), same=xp is x.__array_namespace__(),
                   ns_version=x.__array_namespace__(api_version="2024.12"), len=len(x), item=float(x[0, 0]),
                   rows=[r.shape for r in x])
        return xp.sum(x)

    unigrad.grad(f, backend=TF)(X)
    assert got["shape"] == (4, 3) and type(got["shape"]) is tuple
    assert got["dtype"] == tf.float64 and got["dtype"] == got["ns"].float64
    assert got["device"] == "cpu" and got["size"] == 12 and got["ndim"] == 2 and got["len"] == 4
    assert got["T"] == (3, 4) and got["mT"] == (3, 4) and got["same"]
    assert got["ns"] is got["ns_version"] is unigrad_tensorflow().namespace
    assert got["item"] == X[0, 0] and got["rows"] == [(3,)] * 4
    # .T is for 2-D arrays only (the standard): a clear error naming the portable spelling
    with pytest.raises(ValueError, match="permute_dims"):
        unigrad.grad(lambda x: unigrad.namespace(x).sum(x[None].T), backend=TF)(X)


def test_type_promotion_and_python_scalars_follow_the_standard():
    dtypes = {}

    def f(x64, x32):
        dtypes.update(mixed=(x32 + x64).dtype, rmixed=(x64 * x32).dtype, weak=(x32 * 2.0).dtype,
                      rweak=(2.0 - x32).dtype, int_weak=(x32 + 1).dtype, cmp=(x32 < x64).dtype,
                      mm=(x32 @ x64[:3]).dtype, np_left=(np.ones(3) + x32[:3]).dtype)
        return unigrad.namespace(x64).sum(x64 * x32)

    unigrad.grad(f, argnums=(0, 1), backend=TF)(V, V.astype(np.float32))
    assert dtypes["mixed"] == dtypes["rmixed"] == tf.float64
    assert dtypes["weak"] == dtypes["rweak"] == dtypes["int_weak"] == tf.float32
    assert dtypes["cmp"] == tf.bool and dtypes["mm"] == tf.float64
    assert dtypes["np_left"] == tf.float64  # NumPy defers to the array's reflected operator


def test_tf_tensor_on_the_left_and_tensorflow_functions_on_the_arrays():
    W = tf.constant(M)  # captured by f: a plain tf.Tensor

    def f(v):
        assert isinstance(tf.nn.relu(v), tf.Tensor)  # TensorFlow's own functions take the arrays
        return unigrad.namespace(v).sum((W @ v) ** 2) + tf.reduce_sum(tf.nn.softplus(v)) + (W * 1.0 - v)[0, 0]

    def g(v):
        return np.sum((M @ v) ** 2) + np.sum(np.log1p(np.exp(v))) + M[0, 0] - v[0]

    want = unigrad.grad(lambda v: unigrad.namespace(v).sum((unigrad.namespace(v).asarray(M) @ v) ** 2)
                        + unigrad.namespace(v).sum(unigrad.namespace(v).log1p(unigrad.namespace(v).exp(v)))
                        - v[0], backend="numpy")(V)
    _same(unigrad.grad(f, backend=TF)(V), want)
    _same(unigrad.grad(f, backend=TF, compile=True)(V), want)
    assert np.isfinite(g(V))


def test_results_aux_and_asarray_are_plain_tensors():
    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(x ** 2), {"x": x * 1.0, "n": xp.zeros(2)}

    g, aux = unigrad.grad(f, has_aux=True, backend=TF)(V)
    assert type(g).__name__ == "EagerTensor" and all(type(a).__name__ == "EagerTensor" for a in aux.values())
    out = unigrad.vmap(lambda r: r * 2.0, backend=TF)(X)
    assert type(out).__name__ == "EagerTensor"
    assert isinstance(unigrad.asarray(V, backend=TF), tf.Tensor)
    xp = unigrad.namespace(tf.constant(V))
    total = xp.sum(tf.constant(V))  # the namespace returns Arrays outside a transform too
    assert type(total) is unigrad_tensorflow().Array and type(unigrad.to_native(total)).__name__ == "EagerTensor"


def test_nested_transforms_hand_f_arrays():
    def inner_grad_dot(v):
        g = unigrad.grad(lambda u: (u @ u) * 1.0)(v)  # 2 v, as an Array inside the outer f
        assert type(g) is unigrad_tensorflow().Array
        return g @ v

    _same(unigrad.grad(inner_grad_dot, backend=TF)(V), 4 * V)


def test_what_cannot_work_says_what_to_use_instead():
    with pytest.raises(TypeError, match="immutable.*xp.where"):
        unigrad.grad(lambda x: x.__setitem__(0, 1.0), backend=TF)(V)
    with pytest.raises(TypeError, match="NumPy cannot take"):
        unigrad.grad(lambda x: np.median(x), backend=TF)(V)
    with pytest.raises(ValueError, match="matmul: the contracted dimensions differ"):
        unigrad.grad(lambda x: unigrad.namespace(x).sum(x @ x[:2]), backend=TF)(V)
    # a tf.Tensor on the left: TensorFlow raises its conversion error, which carries ours
    with pytest.raises((TypeError, ValueError), match="matmul: the contracted dimensions differ"):
        unigrad.grad(lambda x: unigrad.namespace(x).sum(tf.constant(M[:2, :2]) @ x), backend=TF)(V)


# ------------------------------------------------------------------ the namespace against array_api_strict

strict = optional("array_api_strict")  # the oracle; the tests that use it say so (needs_strict)
needs_strict = requires("array_api_strict")


def _tfx():
    return unigrad_tensorflow().namespace


def _as(xp, a, dtype):
    return xp.asarray(np.asarray(a), dtype=getattr(xp, dtype))


def _check(got, want):
    got_np, want_np = np.asarray(unigrad.to_numpy(got)), np.asarray(want)
    assert got_np.dtype == want_np.dtype, (got_np.dtype, want_np.dtype)
    np.testing.assert_array_equal(got_np, want_np)


CASES = [  # (name, call(xp, *arrays), inputs as (values, dtype))
    ("full 0.1", lambda xp: xp.full((), 0.1), ()),
    ("full 1e300", lambda xp: xp.full((2,), 1e300), ()),
    ("full_like 0.1", lambda xp, x: xp.full_like(x, 0.1), (([1.0, 2.0], "float64"),)),
    ("full int", lambda xp: xp.full((2,), 3), ()),
    ("sum uint8", lambda xp, x: xp.sum(x), (([200, 100], "uint8"),)),
    ("prod uint8", lambda xp, x: xp.prod(x), (([200, 100], "uint8"),)),
    ("sum int8", lambda xp, x: xp.sum(x), (([100, 100], "int8"),)),
    ("cumulative_sum uint8", lambda xp, x: xp.cumulative_sum(x), (([200, 100], "uint8"),)),
    ("cumulative_sum uint8 initial", lambda xp, x: xp.cumulative_sum(x, include_initial=True),
     (([200, 100], "uint8"),)),
    ("bitwise_and", lambda xp, a, b: xp.bitwise_and(a, b), (([12, 10], "int32"), ([10, 6], "int32"))),
    ("bitwise_or", lambda xp, a, b: xp.bitwise_or(a, b), (([12, 10], "uint8"), ([10, 6], "uint8"))),
    ("bitwise_xor bool", lambda xp, a, b: xp.bitwise_xor(a, b), (([True, False], "bool"), ([True, True], "bool"))),
    ("bitwise_invert", lambda xp, a: xp.bitwise_invert(a), (([0, 5, 255], "uint8"),)),
    ("bitwise_left_shift", lambda xp, a, b: xp.bitwise_left_shift(a, b), (([1, 3], "int64"), ([2, 4], "int64"))),
    ("bitwise_right_shift", lambda xp, a, b: xp.bitwise_right_shift(a, b),
     (([16, 255], "uint8"), ([2, 4], "uint8"))),
    ("unique_values", lambda xp, x: xp.sort(xp.unique_values(x)), (([3, 1, 3, 2, 1], "int64"),)),
    ("unique_counts", lambda xp, x: xp.take(xp.unique_counts(x).counts, xp.argsort(xp.unique_counts(x).values)),
     (([3, 1, 3, 2, 1, 3], "int64"),)),
    ("unique_inverse", lambda xp, x: xp.reshape(xp.take(xp.unique_inverse(x).values,
                                                        xp.reshape(xp.unique_inverse(x).inverse_indices, (-1,))),
                                                (2, 2)),
     (([[3.0, 1.0], [3.0, 2.0]], "float64"),)),
    ("unique_all indices", lambda xp, x: xp.take(x, xp.unique_all(x).indices) == xp.unique_all(x).values,
     (([5, 1, 5, 2, 1], "int32"),)),
    ("unique_counts complex", lambda xp, x: xp.sum(xp.unique_counts(x).counts) + xp.unique_counts(x).counts.shape[0],
     (([1 + 1j, 2, 1 + 1j, 2, 3j], "complex64"),)),
    ("nextafter", lambda xp, a, b: xp.nextafter(a, b),
     (([1.0, 1.0, 0.0, -2.0, 3.0], "float64"), ([2.0, 0.0, -1.0, -3.0, 3.0], "float64"))),
    ("nextafter f32", lambda xp, a, b: xp.nextafter(a, b), (([1.0, 0.0], "float32"), ([0.0, 1.0], "float32"))),
    ("diff prepend append", lambda xp, x, p: xp.diff(x, prepend=p, append=p),
     (([1.0, 4.0, 9.0], "float64"), ([0.5], "float64"))),
    ("diff axis 0 n 2", lambda xp, x: xp.diff(x, axis=0, n=2), (([[1, 2], [4, 8], [9, 27]], "int64"),)),
    ("expand_dims positional", lambda xp, x: xp.expand_dims(x, 1), (([1.0, 2.0], "float32"),)),
    ("meshgrid", lambda xp, a, b: xp.stack(xp.meshgrid(a, b)), (([1, 2, 3], "int64"), ([4, 5], "int64"))),
    ("floor int", lambda xp, x: xp.floor(x), (([1, -2], "int32"),)),
    ("ceil int", lambda xp, x: xp.ceil(x), (([1, -2], "int64"),)),
    ("trunc int", lambda xp, x: xp.trunc(x), (([1, -2], "int16"),)),
    ("abs uint8", lambda xp, x: xp.abs(x), (([0, 7, 255], "uint8"),)),
    ("negative uint8", lambda xp, x: xp.negative(x), (([0, 7, 255], "uint8"),)),
    ("sign uint8", lambda xp, x: xp.sign(x), (([0, 7, 255], "uint8"),)),
    ("pow uint8", lambda xp, a, b: xp.pow(a, b), (([2, 3, 7, 0], "uint8"), ([3, 5, 0, 0], "uint8"))),
    ("pow uint64", lambda xp, a, b: xp.pow(a, b), (([3, 2], "uint64"), ([41, 63], "uint64"))),
    ("matmul uint32", lambda xp, a, b: xp.matmul(a, b),
     (([[1, 2], [3, 4]], "uint32"), ([[4000000000, 1], [2, 3]], "uint32"))),
    ("matmul uint64 vector", lambda xp, a, b: xp.matmul(a, b), (([[1, 2], [3, 4]], "uint64"), ([5, 6], "uint64"))),
    ("matmul int8 wraps", lambda xp, a, b: xp.matmul(a, b), (([[100, 100]], "int8"), ([[2], [1]], "int8"))),
    ("tensordot uint16", lambda xp, a, b: xp.tensordot(a, b, axes=1), (([1, 2], "uint16"), ([3, 4], "uint16"))),
    ("slogdet complex", lambda xp, x: xp.linalg.slogdet(x).logabsdet,
     (([[2 + 1j, 0], [0, 3]], "complex128"),)),
    ("vecdot", lambda xp, a, b: xp.vecdot(a, b), (([[1.0, 2.0]], "float64"), ([3.0, 4.0], "float64"))),
    ("trace uint8", lambda xp, x: xp.linalg.trace(x), (([[200, 0], [0, 100]], "uint8"),)),
]


@needs_strict
@pytest.mark.parametrize("name, call, inputs", CASES, ids=[c[0] for c in CASES])
def test_namespace_functions_match_array_api_strict(name, call, inputs):
    tfx = _tfx()
    want = call(strict, *[_as(strict, v, d) for v, d in inputs])
    got = call(tfx, *[_as(tfx, v, d) for v, d in inputs])
    if name == "slogdet complex":  # the standard's real log|det| (the value itself to rounding)
        assert got.dtype == tf.float64
        np.testing.assert_allclose(unigrad.to_numpy(got), np.asarray(want), rtol=1e-14)
        return
    _check(got, want)


@needs_strict
def test_namespace_errors_and_info_match_the_standard():
    tfx = _tfx()
    assert float(tfx.full((), 0.1)) == 0.1  # the value was rounded through float32 before
    with pytest.raises(ValueError, match="vecdot"):
        tfx.vecdot(tf.ones(3), tf.ones(1))
    with pytest.raises(ValueError):
        strict.vecdot(strict.ones(3), strict.ones(1))
    assert isinstance(tfx.meshgrid(tf.ones(2)), list)
    for xp in (tfx, strict):
        info = xp.__array_namespace_info__()
        assert set(info.default_dtypes()) == {"real floating", "complex floating", "integral", "indexing"}
        assert info.default_device() in info.devices()
        assert set(info.dtypes(kind="integral")) == set(strict.__array_namespace_info__().dtypes(kind="integral"))
        assert info.capabilities()["boolean indexing"] is True
    for x in (tfx.float32, tf.ones(2, tf.float32)):
        fi = tfx.finfo(x)
        assert type(fi.eps) is float and fi.eps == strict.finfo(strict.float32).eps
        assert type(fi.max) is float and fi.bits == 32 and type(fi.smallest_normal) is float
    ii = tfx.iinfo(tf.ones(2, tf.uint8))
    assert (ii.min, ii.max, ii.bits) == (0, 255, 8) and type(ii.max) is int
    assert math.isclose(tfx.finfo(tfx.complex128).eps, np.finfo(np.float64).eps)
    assert tfx.finfo(tfx.complex64).dtype == tfx.float32  # the real dtype, as the standard says


def test_the_backend_hook_for_non_differentiated_arguments():
    b = unigrad.get_backend(TF)
    Array = unigrad_tensorflow().Array
    wrapped = b.arguments((tf.constant(M), tf.Variable(V), 3, "label"))
    assert type(wrapped[0]) is Array and type(wrapped[1]) is Array and wrapped[2:] == (3, "label")
    assert b.is_array(wrapped[0]) and b.shape(wrapped[0]) == (3, 3) and b.dtype(wrapped[1]) == "float64"


def test_non_differentiated_arguments_are_arrays_too():
    kinds = []

    def f(v, m):
        kinds.append(type(m))
        return unigrad.namespace(v).sum(m.T @ v)

    _same(unigrad.grad(f, backend=TF)(V, M), M @ np.ones(3))
    assert kinds == [unigrad_tensorflow().Array]


def test_python_conversions_of_symbolic_arrays_say_why():
    def f(x):
        if x[0] > 0:  # Python control flow on a value: fine eagerly, not inside tf.function
            return x * 2.0
        return x

    _same(unigrad.jacobian(f, backend=TF)(V.clip(0.1)), 2.0 * np.eye(3))
    with pytest.raises(TypeError, match="symbolic TensorFlow array"):
        unigrad.jacobian(f, backend=TF, compile=True)(V.clip(0.1))


def test_dlpack_both_ways():
    got = {}

    def f(x):
        got["device"] = x.__dlpack_device__()
        with pytest.raises(BufferError, match="derivative would be lost"):  # as torch with requires_grad
            np.from_dlpack(x)
        return x * 2.0

    unigrad.jacobian(f, backend=TF)(V)
    assert got["device"] == (1, 0)
    tfx = _tfx()
    np.testing.assert_array_equal(unigrad.to_numpy(tfx.from_dlpack(np.arange(3.0), device="cpu")), np.arange(3.0))
    with pytest.raises(ValueError, match="copy=False"):
        tfx.from_dlpack(np.arange(3.0), copy=False)


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "uint64"])
def test_shifts_by_the_bit_width_or_more_follow_python(dtype):
    """array-api-tests found 1 << 32 == -2**31 on int32: TensorFlow clamps a shift of the bit width or
    more. The standard (and Python) give 0 for <<, and the sign fill for >>."""
    xp = unigrad_tensorflow().namespace
    bits = np.dtype(dtype).itemsize * 8
    vals = [1, 5, int(np.iinfo(dtype).max)] + ([-1, -7] if dtype[0] == "i" else [])
    for s in (1, bits - 1, bits, bits + 3):
        a = xp.asarray(np.array(vals, dtype=dtype))
        sh = xp.asarray(np.full(len(vals), s, dtype=dtype))
        left, right = np.asarray(xp.bitwise_left_shift(a, sh)), np.asarray(a >> sh)
        want_left = [np.array((v << s) % 2 ** bits, dtype=np.uint64).astype(dtype) if s < bits else 0
                     for v in vals]
        assert left.tolist() == [int(w) for w in want_left], (s, left)
        assert right.tolist() == [v >> s for v in vals], (s, right)


def test_empty_arange_and_far_diagonals_of_eye():
    """array-api-tests: arange(1, 0, 1) raised TensorFlow's 'Requires start <= limit'; eye(0, k=2**63)
    raised an int64 overflow. NumPy's values: an empty range, a matrix of zeros."""
    xp = unigrad_tensorflow().namespace
    for args, dtype in [((1, 0, 1), xp.uint8), ((0, 5, -1), xp.int64), ((1.0, 0.5), None), ((5, 0, -2), xp.int16)]:
        got = xp.arange(*args, dtype=dtype)
        want = np.arange(*args)
        assert got.shape == want.shape and np.asarray(got).tolist() == want.tolist(), args
    for n, m, k in [(0, None, 2 ** 63), (3, 4, 2 ** 70), (3, 4, -2 ** 70), (3, 4, 4), (3, 4, -3), (3, 4, 1)]:
        np.testing.assert_array_equal(np.asarray(xp.eye(n, m, k=k)), np.eye(n, m, k=k))


def test_complex_expm1_and_log1p_special_values_follow_the_standard():
    """array-api-tests' special cases: TensorFlow's complex expm1/log1p kernels gave NaN where the
    standard (C99) defines values; ordinary points keep the kernels' accuracy (NumPy's own complex log1p
    loses it near 0) and derivatives."""
    xp = unigrad_tensorflow().namespace
    inf, nan, pi = math.inf, math.nan, math.pi
    cases = {
        "expm1": [(complex(inf, 0), complex(inf, 0)), (complex(-inf, inf), complex(-1, 0)),
                  (complex(inf, inf), complex(inf, nan)), (complex(-inf, nan), complex(-1, 0)),
                  (complex(inf, nan), complex(inf, nan)), (complex(nan, 0), complex(nan, 0)),
                  (complex(-0.0, 0), complex(0, 0)), (1e-10 + 1e-10j, np.expm1(1e-10 + 1e-10j))],
        "log1p": [(complex(-1, 0), complex(-inf, 0)), (complex(2, inf), complex(inf, pi / 2)),
                  (complex(-inf, 1), complex(inf, pi)), (complex(inf, 1), complex(inf, 0)),
                  (complex(-inf, inf), complex(inf, 3 * pi / 4)), (complex(inf, inf), complex(inf, pi / 4)),
                  (complex(inf, nan), complex(inf, nan)), (complex(nan, inf), complex(inf, nan)),
                  (1e-10 + 1e-10j, complex(0.5 * math.log1p(2e-10 + 2e-20), math.atan2(1e-10, 1 + 1e-10)))],
    }
    for name, pairs in cases.items():
        got = np.asarray(getattr(xp, name)(xp.asarray(np.array([z for z, _ in pairs]))))
        want = np.array([w for _, w in pairs])
        np.testing.assert_array_equal(np.isnan(got.real), np.isnan(want.real), err_msg=name)
        np.testing.assert_array_equal(np.isnan(got.imag), np.isnan(want.imag), err_msg=name)
        ok = ~np.isnan(want.real)
        np.testing.assert_allclose(got.real[ok], want.real[ok], rtol=1e-9, err_msg=name)
        ok = ~np.isnan(want.imag)
        np.testing.assert_allclose(got.imag[ok], want.imag[ok], rtol=1e-9, atol=1e-300, err_msg=name)
    z = np.array([0.3 + 0.2j, -0.5 + 1.5j])
    for name in ("expm1", "log1p"):
        f = lambda v: unigrad.namespace(v).real(getattr(unigrad.namespace(v), name)(v) * (1 - 2j))  # noqa: E731
        g_tf, g_tape = (unigrad.to_numpy(unigrad.grad(lambda v: unigrad.namespace(v).sum(f(v)), backend=b)(z))
                        for b in (TF, "numpy"))
        np.testing.assert_allclose(g_tf, g_tape, rtol=1e-12)


def test_repeat_counts_of_any_integer_dtype_and_expand_dims_axis_error():
    """array-api-tests: repeat with an int8 array of counts reached TensorFlow's kernel (int32/int64 only);
    expand_dims out of bounds must raise IndexError (the standard), kept a ValueError too."""
    xp = unigrad_tensorflow().namespace
    for dtype in ("int8", "uint8", "int16", "int64"):
        got = xp.repeat(xp.asarray([False, True, True]), xp.asarray(np.array([1, 0, 2], dtype=dtype)))
        assert np.asarray(got).tolist() == [False, True, True]
    assert np.asarray(xp.repeat(xp.asarray([1.0, 2.0]), xp.asarray(np.array(2, dtype="uint8")))).tolist() == [
        1.0, 1.0, 2.0, 2.0]
    for axis in (2, -3, 7):
        with pytest.raises(IndexError, match="out of bounds"):
            xp.expand_dims(xp.asarray([1.0]), axis=axis)
        with pytest.raises(ValueError):
            xp.expand_dims(xp.asarray([1.0]), axis=axis)


def test_complex_pinv_and_diagonals_outside_the_matrix():
    """array-api-tests: tf.linalg.pinv refused complex matrices; diag_part raised for an offset outside the
    matrix (the standard: an empty diagonal, a zero trace). Values against NumPy, pinv's gradient
    against the tape's."""
    xp = unigrad_tensorflow().namespace
    for shape in [(3, 4), (2, 5, 3)]:
        a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        np.testing.assert_allclose(np.asarray(xp.linalg.pinv(xp.asarray(a))), np.linalg.pinv(a), atol=1e-12)
    for shape in [(0, 2, 3), (2, 0, 3), (2, 3, 0)]:  # zero-size matrices: TensorFlow's pinv raised
        got = xp.linalg.pinv(xp.asarray(np.ones(shape)))
        assert got.shape == np.linalg.pinv(np.ones(shape)).shape
    a = rng.standard_normal((2, 3, 3)).astype(np.float32)  # rtol an array of x's batch shape, float32
    np.testing.assert_allclose(np.asarray(xp.linalg.pinv(xp.asarray(a), rtol=xp.asarray(np.float32([0.1, 0.9])))),
                               np.linalg.pinv(a, rtol=np.array([0.1, 0.9])), atol=1e-4)
    for shape, offset in [((3, 4), 4), ((3, 4), -3), ((3, 4), 3), ((2, 0), 1), ((0, 3), 0), ((2, 3, 3), -2)]:
        x = rng.standard_normal(shape)
        got = np.asarray(xp.linalg.diagonal(xp.asarray(x), offset=offset))
        want = np.diagonal(x, offset=offset, axis1=-2, axis2=-1)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want)
        np.testing.assert_allclose(np.asarray(xp.linalg.trace(xp.asarray(x), offset=offset)),
                                   np.trace(x, offset=offset, axis1=-2, axis2=-1))
    c = rng.standard_normal((3, 3)) + 1j * rng.standard_normal((3, 3))

    def f(z):
        ns = unigrad.namespace(z)
        return ns.sum(ns.abs(ns.linalg.pinv(z)) ** 2)

    np.testing.assert_allclose(unigrad.to_numpy(unigrad.grad(f, backend=TF)(c)),
                               unigrad.grad(f, backend="numpy")(c), rtol=1e-9)


def test_slice_bounds_may_be_0d_arrays_of_any_integer_dtype():
    """array-api-tests' test_repeat slices its result with 0-d int8 arrays (``out[start:end]``): TensorFlow's
    slicing took only Python ints and int32/int64 tensors."""
    xp = unigrad_tensorflow().namespace
    x, m = np.arange(10.0), np.arange(12.0).reshape(3, 4)
    a, b, s = (xp.asarray(np.array(v, dtype=d)) for v, d in ((2, "int8"), (7, "uint8"), (2, "int16")))
    for got, want in [(xp.asarray(x)[a:b], x[2:7]), (xp.asarray(x)[a:b:s], x[2:7:2]), (xp.asarray(x)[::s], x[::2]),
                      (xp.asarray(m)[a, a:b], m[2, 2:7]), (xp.asarray(m)[1:a, ...], m[1:2, ...])]:
        np.testing.assert_array_equal(np.asarray(got), want)
    g = unigrad.grad(lambda v: unigrad.namespace(v).sum(v[a:b] ** 2), backend=TF)(x)
    np.testing.assert_allclose(unigrad.to_numpy(g), np.where((np.arange(10) >= 2) & (np.arange(10) < 7), 2 * x, 0))


def test_complex_log_of_large_values_does_not_overflow():
    """array-api-tests' test_log10 drew complex64 2**64: TensorFlow's complex log squares |z| in float32
    and gave NaN above 1.8e19. log, log2 and log10 now follow NumPy there; derivatives are unchanged."""
    xp = unigrad_tensorflow().namespace
    z = np.array([1.8446743e19 + 5.886384e15j, 3e38 + 1j, 1 + 1j, -1 + 0j, complex(math.inf, math.nan)],
                 dtype=np.complex64)
    for name in ("log", "log2", "log10"):
        got = np.asarray(getattr(xp, name)(xp.asarray(z)))
        want = getattr(np, name)(z.astype(np.complex128))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30, equal_nan=True, err_msg=name)
    c = np.array([0.3 + 0.2j, -2 + 1j])

    def f(v):
        ns = unigrad.namespace(v)
        return ns.sum(ns.real(ns.log10(v) * (1 - 2j)))

    np.testing.assert_allclose(unigrad.to_numpy(unigrad.grad(f, backend=TF)(c)), unigrad.grad(f, backend="numpy")(c),
                               rtol=1e-12)
