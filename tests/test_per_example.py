"""per_example_grad and per_example_grad_norms: the same values as materialised per-example gradients on
every backend, the dense-layer paths of the tape (and the proof that keeps them exact), and the errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import unigrad
from unigrad.per_example import layers as _per_example

B = 5
# float64 parameters, gradients compared in float64: skipped on a backend that computes no float64 (conftest)
FLOAT64_TESTS = ("test_equals_materialised_per_example_gradients_on_every_backend",)


def make_params(rng, d_in=4, hidden=6, n_out=3, dtype=np.float64):
    return {"W1": rng.standard_normal((d_in, hidden)).astype(dtype),
            "b1": rng.standard_normal(hidden).astype(dtype),
            "W2": rng.standard_normal((n_out, hidden)).astype(dtype),  # used transposed
            "b2": rng.standard_normal(n_out).astype(dtype)}


def mlp_losses(p, x, labels):
    """Per-example cross-entropy of a 2-layer MLP; x of shape (B, d) or (B, T, d) (then summed over T)."""
    xp = unigrad.namespace(p["W1"], x)
    h = xp.tanh(x @ p["W1"] + p["b1"])
    z = h @ p["W2"].T + p["b2"]
    logp = z - xp.log(xp.sum(xp.exp(z), axis=-1, keepdims=True))
    if x.ndim == 3:
        return -xp.sum(logp[..., 0], axis=1)
    return -xp.take_along_axis(logp, xp.reshape(xp.asarray(labels), (-1, 1)), axis=1)[:, 0]


def mixing_losses(p, x, labels):
    """Rows are mixed after the first layer (centred over the batch): W1 and b1 need materialising;
    after the second layer rows stay apart again."""
    xp = unigrad.namespace(p["W1"], x)
    h = xp.tanh(x @ p["W1"] + p["b1"])
    h = h - xp.mean(h, axis=0)
    z = h @ p["W2"].T + p["b2"]
    return xp.sum(z * z, axis=1)


def reference_rows(f, params, x, labels):
    """Materialised per-example gradients: one grad of each example's loss, a loop (the oracle)."""
    rows = []
    for i in range(x.shape[0]):
        def one(p):
            return f(p, x, labels)[i]
        rows.append(unigrad.grad(one)(params))
    return {k: np.stack([r[k] for r in rows]) for k in params}


def reference_norms(rows):
    return np.sqrt(sum(np.sum(v.reshape(v.shape[0], -1) ** 2, axis=1) for v in rows.values()))


def to_backend(tree, backend):
    return {k: unigrad.asarray(v, backend=backend) for k, v in tree.items()}


@pytest.mark.parametrize("compile", [False, True])
def test_equals_materialised_per_example_gradients_on_every_backend(backend, compile):
    check_against_materialised(backend, compile, "rows")


@pytest.mark.parametrize("case", ["sequence", "mixing"])
@pytest.mark.parametrize("name", ["numpy", "torch", "tensorflow"])  # (JAX: the mixing case in test_proof_...)
def test_equals_materialised_per_example_gradients_where_programs_are_read(name, case):
    check_against_materialised(fast_backend(name), False, case)


def check_against_materialised(backend, compile, case):
    rng = np.random.default_rng(0)
    params = make_params(rng)
    x = rng.standard_normal((B, 3, 4) if case == "sequence" else (B, 4))
    labels = rng.integers(3, size=B)
    f = mixing_losses if case == "mixing" else mlp_losses
    want = reference_rows(f, params, x, labels)
    args = (to_backend(params, backend), unigrad.asarray(x, backend=backend), labels)
    pe = unigrad.per_example_grad(f, batch_argnum=(1, 2), backend=backend, compile=compile)
    got = pe(*args)
    assert set(got) == set(params)
    for k in params:
        g = unigrad.to_numpy(got[k])
        assert g.shape == (B, *params[k].shape) and g.dtype == params[k].dtype, k
        np.testing.assert_allclose(g, want[k], rtol=1e-9, atol=1e-12, err_msg=k)
    norms = unigrad.per_example_grad_norms(f, batch_argnum=(1, 2), backend=backend, compile=compile)(*args)
    np.testing.assert_allclose(unigrad.to_numpy(norms), reference_norms(want), rtol=1e-9)
    assert set(pe.paths) == {f"argument 0['{k}']" for k in params}


FAST = ["numpy", "jax", "torch", "tensorflow"]  # the backends whose programs per_example_grad reads (the tape's
# record, the jaxpr, the ATen operations torch ran, the graph TensorFlow traced)


def fast_backend(name):
    if name != "numpy" and not unigrad.backends().get(name, {}).get("available"):
        pytest.skip(f"{name} is not installed")
    return name


def problem(name, seed, f):
    """(backend, params, x, labels, per_example_grad of f) for one of the FAST backends."""
    backend = fast_backend(name)
    rng = np.random.default_rng(seed)
    params = make_params(rng)
    x, labels = rng.standard_normal((B, 4)), rng.integers(3, size=B)
    return backend, params, x, labels, unigrad.per_example_grad(f, batch_argnum=(1, 2), backend=backend)


@pytest.mark.parametrize("name", FAST)
def test_dense_layers_from_one_backward_pass(name):
    backend, params, x, labels, pe = problem(name, 1, mlp_losses)
    rng = np.random.default_rng(1)
    pe(params, x, labels)
    assert pe.paths == {"argument 0['W1']": _per_example.DENSE, "argument 0['b1']": _per_example.BIAS,
                        "argument 0['W2']": _per_example.DENSE, "argument 0['b2']": _per_example.BIAS}
    pn = unigrad.per_example_grad_norms(mlp_losses, batch_argnum=(1, 2), backend=backend)
    pn(params, x, labels)
    assert pn.paths["argument 0['W1']"] == _per_example.DENSE_OUTER  # |x|^2 |g|^2: one position per example
    if name in ("jax", "tensorflow"):  # the same proof inside jit / tf.function (the labels traced: values unknown)
        pc = unigrad.per_example_grad_norms(mlp_losses, batch_argnum=(1, 2), backend=backend, compile=True)
        pc(params, x, labels)
        assert pc.paths == pn.paths
    seq = rng.standard_normal((B, 3, 4))
    pn(params, seq, labels)
    assert pn.paths["argument 0['W1']"] == _per_example.DENSE_GHOST  # 3 positions: (X X^T) * (G G^T)


@pytest.mark.parametrize("name", FAST)
def test_proof_materialises_what_rows_mix_after(name):
    backend, params, x, labels, pe = problem(name, 2, mixing_losses)
    got = {k: unigrad.to_numpy(v) for k, v in pe(params, x, labels).items()}
    assert pe.paths["argument 0['W1']"] == pe.paths["argument 0['b1']"] == _per_example.MATERIALISED
    assert pe.paths["argument 0['W2']"] == _per_example.DENSE
    # the one-backward-pass rows would be wrong for W1 here: the proof is what keeps the result exact
    want = reference_rows(mixing_losses, params, x, labels)
    wrong = np.einsum("bd,bk->bdk", x, _layer_cotangent(params, x))
    assert np.abs(wrong - want["W1"]).max() > 1e-3
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)


def _layer_cotangent(params, x):
    """d sum(mixing_losses) / d (x @ W1): what the dense path would have used for W1."""
    def of_layer(y):
        xp = unigrad.namespace(y)
        h = xp.tanh(y + params["b1"])
        h = h - xp.mean(h, axis=0)
        z = h @ params["W2"].T + params["b2"]
        return xp.sum(z * z)
    return unigrad.grad(of_layer)(x @ params["W1"])


@pytest.mark.parametrize("name", FAST)
def test_parameter_used_twice(name):
    """Materialised on the tape and JAX; on torch both dense uses' factors stacked along positions (the
    gradient of each example is the sum of both uses' X^T G)."""
    backend = fast_backend(name)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4))
    x = rng.standard_normal((B, 4))

    def f(w, x):
        xp = unigrad.namespace(w, x)
        return xp.sum(xp.tanh(xp.tanh(x @ w) @ w), axis=1)

    pe = unigrad.per_example_grad(f, backend=backend)
    got = pe(w, x)
    assert pe.paths == {"argument 0": _per_example.SHARED if name == "torch" else _per_example.MATERIALISED}
    np.testing.assert_allclose(unigrad.to_numpy(got), unigrad.jacobian(f)(w, x), rtol=1e-12)


def test_matches_vmap_of_grad_of_one_example():
    rng = np.random.default_rng(4)
    params = make_params(rng, dtype=np.float32)
    x, labels = rng.standard_normal((B, 4)).astype(np.float32), rng.integers(3, size=B)

    def one(p, xi, yi):
        return mlp_losses(p, xi[None], yi[None])[0]

    want = unigrad.vmap(unigrad.grad(one), in_axes=(None, 0, 0))(params, x, labels)
    got = unigrad.per_example_grad(mlp_losses, batch_argnum=(1, 2))(params, x, labels)
    for k in params:
        assert got[k].dtype == np.float32
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6)


def test_scalar_loss_is_refused_with_the_reason():
    w, x = np.ones(3), np.ones((4, 3))
    for backend in ("numpy", "jax"):
        if backend not in unigrad.backends() or not unigrad.backends()[backend]["available"]:
            continue
        with pytest.raises(ValueError, match=r"one loss per example, an array of shape \(4,\); got shape \(\)"
                                             r".*without the final sum or mean"):
            unigrad.per_example_grad(lambda w, x: (x @ w).sum(), backend=backend)(w, x)


def test_argument_errors():
    w, x = np.ones(3), np.ones((4, 3))
    with pytest.raises(ValueError, match="argument 0 is both a parameter"):
        unigrad.per_example_grad(lambda w, x: x @ w, argnums=0, batch_argnum=0)
    with pytest.raises(ValueError, match="argument 1 has 2 examples|argument 2 has 2 examples"):
        unigrad.per_example_grad(lambda w, x, y: x @ w + y, batch_argnum=(1, 2))(w, x, np.ones(2))
    with pytest.raises(ValueError, match="batch_argnum 3 is out of range"):
        unigrad.per_example_grad(lambda w, x: x @ w, batch_argnum=3)(w, x)
    with pytest.raises(TypeError, match="batch_argnum must be an int"):
        unigrad.per_example_grad(lambda w, x: x @ w, batch_argnum="x")


def test_batched_jacobian_on_parameters_points_to_per_example_grad():
    w, x = np.ones((3, 2)), np.ones((4, 3))
    with pytest.raises(ValueError, match=r"expected 3.*unigrad\.per_example_grad.*in_axes=\(None, 0\)"):
        unigrad.batched_jacobian(lambda w, x: (x @ w).sum(1))(w, x)


@pytest.mark.parametrize("name", FAST)
def test_no_examples_gives_empty_rows(name):
    backend = fast_backend(name)
    params = make_params(np.random.default_rng(5))
    x, labels = np.zeros((0, 4)), np.zeros((0,), dtype=np.int64)
    got = unigrad.per_example_grad(mlp_losses, batch_argnum=(1, 2), backend=backend)(params, x, labels)
    assert {k: unigrad.to_numpy(v).shape for k, v in got.items()} == {k: (0, *v.shape) for k, v in params.items()}
    norms = unigrad.per_example_grad_norms(mlp_losses, batch_argnum=(1, 2), backend=backend)(params, x, labels)
    assert unigrad.to_numpy(norms).shape == (0,)


# ---------------------------------------------------------------------------------------------
# torch: native code (nn.Module through functional_call), read from the ATen operations it ran
# ---------------------------------------------------------------------------------------------

def torch_model(torch, d_in, hidden, n_out, norm, dtype):
    layers = [torch.nn.Linear(d_in, hidden)] + ([torch.nn.LayerNorm(hidden)] if norm else []) + [
        torch.nn.Tanh(), torch.nn.Linear(hidden, n_out)]
    return torch.nn.Sequential(*layers).to(dtype)


@pytest.mark.parametrize("dtype, sequence, norm", [("float32", False, False), ("float64", True, False),
                                                   ("float64", False, True)])
def test_torch_module_norms_equal_torch_func(dtype, sequence, norm):
    """An nn.Module's per-example losses (cross-entropy, over positions for a sequence): the dense
    layers' and LayerNorm's norms from one backward pass; the values
    those of torch.func's vmap(grad) to rounding."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    model = torch_model(torch, 4, 6, 3, norm, dt)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn((B, 2, 4) if sequence else (B, 4), dtype=dt)
    y = torch.randint(3, (B, 2) if sequence else (B,))

    def losses(p, x, y):
        z = torch.func.functional_call(model, p, (x,))
        if sequence:  # the batch merged with the positions for the loss, then split back
            return torch.nn.functional.cross_entropy(z.reshape(-1, 3), y.reshape(-1), reduction="none").reshape(
                x.shape[0], -1).sum(1)
        return torch.nn.functional.cross_entropy(z, y, reduction="none")

    def one(p, xi, yi):
        return losses(p, xi[None], yi[None])[0]

    grads = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(params, x, y)
    want = torch.sqrt(sum((g.reshape(B, -1) ** 2).sum(1) for g in grads.values()))
    pn = unigrad.per_example_grad_norms(losses, batch_argnum=(1, 2))
    got = pn(params, x, y)
    assert got.dtype == dt
    torch.testing.assert_close(got, want, rtol=2e-5 if dtype == "float32" else 1e-10, atol=0)
    dense = _per_example.DENSE_GHOST if sequence else _per_example.DENSE_OUTER
    last = "3" if norm else "2"
    assert pn.paths[f"argument 0['0.weight']"] == pn.paths[f"argument 0['{last}.weight']"] == dense
    assert pn.paths[f"argument 0['0.bias']"] == pn.paths[f"argument 0['{last}.bias']"] == _per_example.BIAS
    if norm:  # LayerNorm's scale and shift: xhat * G and G summed over positions, one backward pass too
        assert pn.paths["argument 0['1.weight']"] == _per_example.NORM
        assert pn.paths["argument 0['1.bias']"] == _per_example.BIAS
    rows = unigrad.per_example_grad(losses, batch_argnum=(1, 2))(params, x, y)
    for k in params:
        torch.testing.assert_close(rows[k], grads[k], rtol=2e-5 if dtype == "float32" else 1e-10, atol=1e-6)


def test_torch_rows_mixed_through_views_and_in_place_operations_are_materialised():
    """The record follows views, transposes and in-place operations on the layer's output: rows mixed
    through any of them make the parameter materialised (the one-pass rows would be wrong)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    w = torch.randn(4, 6, dtype=torch.float64)
    x = torch.randn(B, 4, dtype=torch.float64)

    def in_place(y):
        y = y.clone()
        y -= y.mean(0)
        return y

    mixes = {"view": lambda y: y.view(B, 2, 3) - y.view(B, 2, 3).mean(0),
             "transpose": lambda y: y.T.T - y.T.mean(1), "slice": lambda y: y[:, :3] - y[:, :3].mean(0),
             "in place": in_place}
    for name, mix in mixes.items():
        def f(w, x):
            return (mix(torch.tanh(x @ w)) ** 2).reshape(B, -1).sum(1)

        pe = unigrad.per_example_grad(f)
        got = pe(w, x)
        assert pe.paths == {"argument 0": _per_example.MATERIALISED}, name
        torch.testing.assert_close(got, torch.func.jacrev(f)(w, x), rtol=1e-12, atol=1e-12, msg=name)


def test_torch_program_read_each_call():
    """The analysis belongs to the program a call ran: a branch on the data that mixes rows on one
    call and not on the next is read again, and both results are right."""
    torch = pytest.importorskip("torch")
    w = torch.randn(4, 3, dtype=torch.float64)

    def f(w, x):
        y = torch.tanh(x @ w)
        if bool(x.sum() > 0):
            y = y - y.mean(0)
        return (y ** 2).sum(1)

    pe = unigrad.per_example_grad(f)
    for sign, path in ((1, _per_example.MATERIALISED), (-1, _per_example.DENSE), (1, _per_example.MATERIALISED)):
        x = sign * (torch.rand(B, 4, dtype=torch.float64) + 0.1)
        got = pe(w, x)
        assert pe.paths == {"argument 0": path}
        torch.testing.assert_close(got, torch.func.jacrev(f)(w, x), rtol=1e-12, atol=1e-12)


def test_torch_under_no_grad_and_inference_mode():
    """The one-pass path under the caller's no_grad (grad mode restored after), and the materialised
    path for inference tensors (they cannot take part in a backward pass)."""
    torch = pytest.importorskip("torch")
    w, x = torch.randn(4, 3, dtype=torch.float64), torch.randn(B, 4, dtype=torch.float64)

    def f(w, x):
        return torch.tanh(x @ w).sum(1)

    want = torch.func.jacrev(f)(w, x)
    pe = unigrad.per_example_grad(f)
    with torch.no_grad():
        torch.testing.assert_close(pe(w, x), want, rtol=1e-12, atol=1e-12)
        assert not torch.is_grad_enabled() and pe.paths == {"argument 0": _per_example.DENSE}
    with torch.inference_mode():
        torch.testing.assert_close(pe(w.clone(), x.clone()), want, rtol=1e-12, atol=1e-12)
        assert pe.paths == {"argument 0": _per_example.MATERIALISED}


# ---------------------------------------------------------------------------------------------
# TensorFlow: native code (tf.matmul, tf.nn), read from the graph f builds in a tf.function
# ---------------------------------------------------------------------------------------------

def tf_native_losses(tf, sequence):
    def losses(p, x, y):
        if sequence:  # Keras' Dense over positions: tensordot (Reshape -> MatMul -> Reshape)
            h = tf.tanh(tf.tensordot(x, p["W1"], axes=1) + p["b1"])
            z = tf.matmul(h, p["W2"], transpose_b=True) + p["b2"]  # BatchMatMulV2 with adj_y
            ce = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.reshape(y, (-1,)), tf.reshape(z, (-1, 3)))
            return tf.reduce_sum(tf.reshape(ce, (tf.shape(x)[0], -1)), axis=1)
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, p["W1"]), p["b1"]))
        z = tf.matmul(h, p["W2"], transpose_b=True) + p["b2"]
        return tf.nn.sparse_softmax_cross_entropy_with_logits(y, z)
    return losses


@pytest.mark.parametrize("sequence", [False, True])
def test_tensorflow_native_norms_equal_vectorized_map_of_gradients(sequence):
    """TensorFlow-native per-example losses: dense layers and biases from one backward pass in the traced
    graph, the values those of tf.vectorized_map over per-example GradientTape gradients."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(6)
    params = {k: tf.constant(v, tf.float32) for k, v in make_params(rng, dtype=np.float32).items()}
    x = tf.constant(rng.standard_normal((B, 2, 4) if sequence else (B, 4)), tf.float32)
    y = tf.constant(rng.integers(3, size=(B, 2) if sequence else B))
    losses = tf_native_losses(tf, sequence)

    def one(xy):
        with tf.GradientTape() as tape:
            tape.watch(params)
            loss = losses(params, xy[0][None], xy[1][None])[0]
        return tape.gradient(loss, params)

    want = tf.vectorized_map(one, (x, y))
    pe = unigrad.per_example_grad(losses, batch_argnum=(1, 2))
    got = pe(params, x, y)
    for k in params:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=2e-5, atol=1e-6, err_msg=k)
    assert pe.paths == {"argument 0['W1']": _per_example.DENSE, "argument 0['b1']": _per_example.BIAS,
                        "argument 0['W2']": _per_example.DENSE, "argument 0['b2']": _per_example.BIAS}
    pn = unigrad.per_example_grad_norms(losses, batch_argnum=(1, 2))
    norms = tf.sqrt(sum(tf.reduce_sum(tf.reshape(want[k] ** 2, (B, -1)), 1) for k in params))
    np.testing.assert_allclose(pn(params, x, y).numpy(), norms.numpy(), rtol=2e-5)
    dense = _per_example.DENSE_GHOST if sequence else _per_example.DENSE_OUTER
    assert pn.paths["argument 0['W1']"] == pn.paths["argument 0['W2']"] == dense


def test_tensorflow_reshaped_bias_and_scale():
    """A bias or a scale reshaped on its way to the layer (tf.reshape, tf.expand_dims) takes the one-pass
    path too; the rows equal GradientTape's Jacobian of the losses."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(9)
    p = {"W": tf.constant(rng.standard_normal((4, 3))), "b": tf.constant(rng.standard_normal(3)),
         "s": tf.constant(rng.standard_normal(3))}
    x = tf.constant(rng.standard_normal((B, 4)))

    def f(p, x):
        h = tf.tanh(tf.matmul(x, p["W"]) + tf.reshape(p["b"], (1, -1))) * tf.expand_dims(p["s"], 0)
        return tf.reduce_sum(h * h, axis=1)

    pe = unigrad.per_example_grad(f)
    got = pe(p, x)
    assert pe.paths == {"argument 0['W']": _per_example.DENSE, "argument 0['b']": _per_example.BIAS,
                        "argument 0['s']": _per_example.SCALE}
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(p)
        out = f(p, x)
    want = tape.jacobian(out, p, experimental_use_pfor=False)
    for k in p:
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-12, atol=1e-12, err_msg=k)


def test_tensorflow_eager_calls_trace_once_per_signature():
    """Eager calls run one tf.function per signature (f traced once, then not again); an f that reads
    values cannot be traced and runs eagerly, materialised, and right."""
    tf = pytest.importorskip("tensorflow")
    traces = itertools.count()  # opaque to f's state fingerprint (a list f appends to is state that changes)
    w = tf.constant(np.random.default_rng(7).standard_normal((4, 3)))

    def f(w, x):
        next(traces)
        return tf.reduce_sum(tf.tanh(tf.matmul(x, w)), axis=1)

    pe = unigrad.per_example_grad(f)
    for n in (5, 5, 5, 6, 6):
        x = tf.constant(np.random.default_rng(n).standard_normal((n, 4)))
        got = pe(w, x)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(w)
            out = f(w, x)
        want = tape.jacobian(out, w, experimental_use_pfor=False)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
        assert pe.paths == {"argument 0": _per_example.DENSE}
    # per signature: one trace of f for the rows and one for their check (one more backward pass, in the
    # same graph), then none; and the reference's 5 eager calls
    assert next(traces) == 2 * 2 + 5

    def reads(w, x):
        scale = 2.0 if bool(tf.reduce_sum(x) > 0) else 1.0  # a value read: no graph
        return tf.reduce_sum(tf.tanh(tf.matmul(x, w)) * scale, axis=1)

    pr = unigrad.per_example_grad(reads)
    x = tf.constant(np.random.default_rng(8).standard_normal((B, 4)))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(w)
        out = reads(w, x)
    want = tape.jacobian(out, w, experimental_use_pfor=False)
    np.testing.assert_allclose(pr(w, x).numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    assert pr.paths == {"argument 0": _per_example.MATERIALISED}
