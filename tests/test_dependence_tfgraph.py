"""The dependence analysis's TensorFlow graph front-end: tf.function graphs read by the one rule table.

Each op class answers FREE (no dependence on the batch), ROW (row i depends on input row i only), MIXED
(with the operation named) or unknown (no rule: the proof gives up, never guesses)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import unigrad  # noqa: E402
from unigrad_tensorflow._dependence import graph_program  # noqa: E402
from conftest import row_verdict  # noqa: E402

B = 5
RNG = np.random.default_rng(0)
W = tf.constant(RNG.standard_normal((4, 3)), tf.float64)
X2 = RNG.standard_normal((B, 4))
X3 = RNG.standard_normal((B, 6, 4))
LABELS = tf.constant(RNG.integers(3, size=B))


def program_of(f, x):
    concrete = tf.function(f, autograph=False).get_concrete_function(tf.TensorSpec(x.shape, tf.float64))
    graph = concrete.graph
    return graph_program(graph.get_operations(), graph.inputs[:1], graph.outputs)


def verdict(f, x):
    """"free", "row", "mixed: <why>" or "unknown: <why>" for f(x) with x's rows the batch."""
    return row_verdict(program_of(f, x), x.ndim, B)


CASES = [
    # FREE: no derivative flows (comparisons, shapes, stop_gradient, argmax)
    ("compare", lambda x: tf.reduce_sum(tf.cast(x > 0, tf.float64), 1), X2, "free"),
    ("stop gradient", lambda x: tf.broadcast_to(tf.reduce_sum(tf.stop_gradient(x)), (B,)), X2, "free"),
    ("argmax", lambda x: tf.cast(tf.argmax(x, 0), tf.float64), X2, "free"),
    # ROW: elementwise, products with a constant, reductions and lanes off the batch axis, structure
    ("elementwise", lambda x: tf.reduce_sum(tf.tanh(x) * 2 + tf.exp(x) / (1 + x ** 2) - tf.nn.relu(x), 1), X2, "row"),
    ("matmul", lambda x: tf.matmul(x, W), X2, "row"),
    ("matmul transpose_b", lambda x: tf.matmul(x, tf.transpose(W), transpose_b=True), X2, "row"),
    ("matmul transpose_a", lambda x: tf.matmul(tf.transpose(x), W, transpose_a=True), X2, "row"),
    ("batch matmul", lambda x: tf.reduce_sum(tf.matmul(x, x, adjoint_b=True), (1, 2)), X3, "row"),
    ("over positions", lambda x: tf.reduce_sum(x @ W, (1, 2)), X3, "row"),
    ("einsum", lambda x: tf.einsum("btd,dk->bk", x, W), X3, "row"),
    ("bias add", lambda x: tf.nn.bias_add(x, tf.ones(4, tf.float64)), X2, "row"),
    ("mean axis 1", lambda x: tf.reduce_mean(x, 1), X2, "row"),
    ("max keepdims", lambda x: tf.reduce_max(x, axis=-1, keepdims=True), X2, "row"),
    ("softmax last", lambda x: tf.reduce_sum(tf.nn.log_softmax(x), 1), X2, "row"),
    ("sparse cross-entropy", lambda x: tf.nn.sparse_softmax_cross_entropy_with_logits(LABELS, x[:, :3]), X2, "row"),
    ("cross-entropy", lambda x: tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(x), x), X2, "row"),
    ("reshape transpose", lambda x: tf.reduce_sum(tf.transpose(tf.reshape(x, (B, 2, 12)), (2, 0, 1)), (0, 2)), X3,
     "row"),
    ("expand squeeze", lambda x: tf.squeeze(tf.expand_dims(x, 1), 1), X2, "row"),
    ("concat axis 1", lambda x: tf.reduce_sum(tf.concat([x, x * 2], 1), 1), X2, "row"),
    ("strided slice", lambda x: x[:, 1:3] * x[:, ::2], X2, "row"),
    ("gather constant", lambda x: tf.gather(x, [2, 0], axis=1), X2, "row"),
    ("gather_nd constant", lambda x: tf.gather_nd(x, [[0, 1], [1, 1]]), X2, "mixed: GatherNd moves or combines rows"),
    ("unstack axis 1", lambda x: tf.unstack(x, axis=1)[2] * tf.unstack(x, axis=1)[1], X2, "row"),
    ("unstack second", lambda x: tf.broadcast_to(tf.reduce_sum(tf.unstack(x, axis=1)[1]), (B,)), X2,
     "mixed: Sum over the batch axis"),
    ("split second", lambda x: tf.reduce_mean(tf.split(x, 2, axis=1)[1], 0), X2, "mixed: Mean over the batch axis"),
    ("gather computed", lambda x: tf.gather(x, tf.argmax(x, 1), axis=1, batch_dims=1), X2, "row"),
    ("where", lambda x: tf.reduce_sum(tf.where(x > 0, x, x * x), 1), X2, "row"),
    ("cumsum axis 1", lambda x: tf.cumsum(x, axis=1), X2, "row"),
    ("roll axis 1", lambda x: tf.roll(x, 1, axis=1), X2, "row"),
    ("fft last axis", lambda x: tf.math.real(tf.signal.fft(tf.cast(x, tf.complex128))), X2, "row"),
    ("cast float32", lambda x: tf.cast(x, tf.float32), X2, "row"),
    ("batch size", lambda x: x / tf.cast(tf.shape(x)[0], tf.float64), X2, "row"),
    # MIXED: the batch axis reduced, scanned, contracted, moved
    ("mean over batch", lambda x: tf.reduce_sum(x - tf.reduce_mean(x, 0), 1), X2, "mixed: Mean over the batch axis"),
    ("softmax over batch", lambda x: tf.transpose(tf.nn.softmax(tf.transpose(x))), X2,
     "mixed: Softmax along the batch axis"),
    ("cumsum over batch", lambda x: tf.cumsum(x, 0), X2, "mixed: Cumsum along the batch axis"),
    ("contract batch", lambda x: x @ (tf.transpose(x) @ x), X2, "mixed: MatMul contracts the batch axis"),
    ("roll batch", lambda x: tf.roll(x, 1, axis=0), X2, "mixed: Roll moves or combines rows of the batch"),
    ("fft over batch", lambda x: tf.math.real(tf.transpose(tf.signal.fft(tf.cast(tf.transpose(x), tf.complex128)))), X2,
     "mixed: FFT along the batch axis"),
    ("reverse batch", lambda x: tf.reverse(x, [0]), X2, "mixed: ReverseV2 moves or combines rows of the batch"),
    ("one row", lambda x: x + x[:1], X2, "mixed: StridedSlice moves or combines rows of the batch"),
    ("rows on two axes", lambda x: x + tf.reduce_sum(x, 1), np.ones((B, B)),
     "mixed: AddV2 combines rows along different axes"),
    ("sort over batch", lambda x: tf.sort(x, axis=0), X2, "mixed: TopKV2 along the batch axis"),
    ("gather along batch", lambda x: tf.gather(x, tf.argmax(x[:, 0])[None] + tf.zeros(B, tf.int64)), X2,
     "unknown: GatherV2.indexed along the batch axis at indices computed in the program"),
    # unknown: no rule (the caller materialises or probes)
    ("sort rows", lambda x: tf.sort(x, axis=1), X2, "row"),
    ("no rule", lambda x: tf.math.bessel_i1e(x), X2, "unknown: no row rule for the primitive 'BesselI1e'"),
    ("nested function", lambda x: tf.function(lambda y: y * 2, autograph=False)(x), X2,
     "unknown: no row rule for the primitive 'PartitionedCall'"),
]


@pytest.mark.parametrize("name, f, x, want", CASES, ids=[c[0] for c in CASES])
def test_rule_per_op_class(name, f, x, want):
    got = verdict(f, x)
    if want.startswith("mixed"):
        assert got.startswith(want), got
    else:
        assert got == want


def test_control_flow_gives_up():
    """tf.cond on a traced value (StatelessIf) has no row rule: the proof says unknown, never a verdict."""
    def f(x):
        return tf.cond(tf.reduce_sum(x) > 0, lambda: x * 2, lambda: x - tf.reduce_mean(x, 0))
    assert verdict(f, X2).startswith("unknown: no row rule for the primitive 'StatelessIf'")


def test_native_tensorflow_rows_proved_without_a_probe(monkeypatch):
    """batched_jacobian of TensorFlow-native f: ROW proved from the graph (no probe), equal to the
    per-example Jacobians; a mixing f refused on every call, naming the operation and the user's line."""
    from unigrad import _batched

    probes = []
    monkeypatch.setattr(_batched, "_settle_independence", lambda *a, **k: probes.append(a) or True)

    def good(x):
        return tf.nn.log_softmax(tf.tanh(tf.matmul(x, W)))

    x = tf.constant(X2)
    got = unigrad.batched_jacobian(good, backend="tensorflow")(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = good(x)
    np.testing.assert_allclose(got.numpy(), tape.batch_jacobian(y, x).numpy(), rtol=1e-12)
    assert not probes

    def mixing(x):
        h = tf.tanh(tf.matmul(x, W))
        return h - tf.reduce_mean(h, axis=0)  # the line named

    line = mixing.__code__.co_firstlineno + 2
    bj = unigrad.batched_jacobian(mixing, backend="tensorflow")
    for _ in range(2):
        with pytest.raises(ValueError, match=rf"not independent: Mean over the batch axis at "
                                             rf"test_dependence_tfgraph.py:{line} \(in mixing\)"):
            bj(x)
    assert not probes


def test_unknown_op_leaves_it_to_the_probe(monkeypatch):
    """An operation without a row rule: the proof gives up and the probe decides (once per signature)."""
    from unigrad import _batched

    probes = []
    real = _batched._settle_independence
    monkeypatch.setattr(_batched, "_settle_independence", lambda *a, **k: probes.append(1) or real(*a, **k))

    def f(x):
        return tf.math.bessel_i1e(x) * 2.0

    bj = unigrad.batched_jacobian(f, backend="tensorflow")
    got = bj(tf.constant(X2))
    assert probes == [1]
    x = tf.constant(X2)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    np.testing.assert_allclose(got.numpy(), tape.batch_jacobian(y, x).numpy(), rtol=1e-12)


def test_portable_f_with_an_op_without_a_graph_rule_is_read_on_the_tape(monkeypatch):
    """A graph operation without a row rule makes the graph's proof give up; portable f is then read on
    the NumPy tape (no probe): its rows proved, or the mixing operation named."""
    from unigrad import _batched
    from unigrad.dependence import _rules

    monkeypatch.delitem(_rules.TABLE, "tf.Tanh")
    probes = []
    monkeypatch.setattr(_batched, "_settle_independence", lambda *a, **k: probes.append(a) or True)
    xp = unigrad.namespace

    def good(x):
        return xp(x).tanh(x) * 2.0

    def mixing(x):
        return x - xp(x).mean(xp(x).tanh(x), axis=0)  # (the graph: unknown before the mean)

    x = tf.constant(X2)
    got = unigrad.batched_jacobian(good, backend="tensorflow")(x)
    np.testing.assert_allclose(got.numpy(), np.stack([np.diag(2 / np.cosh(r) ** 2) for r in X2]), rtol=1e-12)
    with pytest.raises(ValueError, match="not independent: sum over the batch axis at test_dependence_tfgraph"):
        unigrad.batched_jacobian(mixing, backend="tensorflow")(x)
    assert not probes
