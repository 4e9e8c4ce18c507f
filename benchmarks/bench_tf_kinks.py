"""What TensorFlow's namespace pays for recording ``maximum`` with unigrad's VJP and JVP (one operation).

The namespace's ``maximum`` / ``minimum`` / ``pow`` are recorded on TensorFlow's tapes and accumulators
as one operation with a backward and a forward function (``_recorded.py``), so that forward mode
follows the same rule at ties as reverse mode. Before, they were ``tf.custom_gradient`` functions (a
reverse rule only). The problem: ``unigrad.grad`` of a portable MLP loss with relu written
``xp.maximum(h, 0.0)``, eager, on TensorFlow, with the relu done three ways in the same run:

  recorded         the namespace's ``xp.maximum`` (now)
  custom_gradient  the same rule as a ``tf.custom_gradient`` (the namespace before), written here
  tf.maximum       TensorFlow's own op, its own tie rule (what the wrapping costs over nothing)

Reported: time ratios, the median over interleaved rounds, for a medium MLP (batch 128, 784-256-256-10)
and a tiny one (batch 4, 8-8-8-2: per-call overhead).

Run: python benchmarks/bench_tf_kinks.py [--quick]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import unigrad  # noqa: E402
import unigrad_tensorflow  # noqa: E402
from bench_tape import mlp_problem, ratio, timed_rounds  # noqa: E402


@tf.custom_gradient
def _maximum_custom_gradient(x1, x2):
    """The namespace's maximum before: the tie rule as a reverse-only custom gradient."""
    def grad(g):
        wins, tie = tf.greater(x1, x2), tf.equal(x1, x2)
        zero, half = tf.zeros_like(g), g * tf.constant(0.5, g.dtype)
        g1 = tf.where(wins, g, tf.where(tie, half, zero))
        g2 = tf.where(wins | tie, tf.where(tie, half, zero), g)
        g2 = tf.where(tf.math.is_nan(x1) | tf.math.is_nan(x2), zero, g2)
        return g1, tf.reduce_sum(g2)
    return tf.maximum(x1, x2), grad


def _relu(how):
    def recorded(h, xp):
        return xp.maximum(h, 0.0)

    def custom_gradient(h, xp):
        t = unigrad.to_native(h)
        return unigrad_tensorflow.Array(_maximum_custom_gradient(t, tf.zeros((), t.dtype)))

    def native(h, xp):
        t = unigrad.to_native(h)
        return unigrad_tensorflow.Array(tf.maximum(t, tf.zeros((), t.dtype)))
    return {"recorded": recorded, "custom_gradient": custom_gradient, "tf.maximum": native}[how]


def loss_with(how):
    relu = _relu(how)

    def loss(params, x, onehot):
        xp = unigrad.namespace(x, *params)
        h = x
        for k in range(0, len(params) - 2, 2):
            h = relu(h @ params[k] + params[k + 1], xp)
        logits = h @ params[-2] + params[-1]
        shifted = logits - xp.logsumexp(logits, axis=1, keepdims=True)
        return -xp.sum(shifted * onehot) / x.shape[0]
    return loss


def run(quick=False):
    results = {}
    for label, sizes, batch, number in (("medium", (784, 256, 256, 10), 128, 5), ("tiny", (8, 8, 8, 2), 4, 50)):
        params, x, onehot = mlp_problem(batch=batch, sizes=sizes)
        params = [tf.constant(p) for p in params]
        x, onehot = tf.constant(x), tf.constant(onehot)
        hows = ("recorded", "custom_gradient", "tf.maximum")
        grads = [unigrad.grad(loss_with(h), backend="tensorflow") for h in hows]
        fns = [lambda g=g: g(params, x, onehot) for g in grads]
        for fn in fns:
            fn()  # warm up
        reference = [np.concatenate([np.ravel(a) for a in g]) for g in (fn() for fn in fns)]
        assert np.allclose(reference[0], reference[1], rtol=1e-12, atol=1e-14), "recorded != custom_gradient"
        rounds = timed_rounds(fns, number, 3 if quick else 15)
        results[label] = {
            "recorded_ms": 1e3 * sorted(r[0] for r in rounds)[len(rounds) // 2],
            "recorded / custom_gradient": ratio(rounds, 0, 1),
            "recorded / tf.maximum": ratio(rounds, 0, 2),
        }
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for label, row in run(args.quick).items():
        print(f"{label:7s} grad of the MLP, eager: recorded {row['recorded_ms']:.2f} ms; "
              f"recorded / custom_gradient {row['recorded / custom_gradient']:.3f}; "
              f"recorded / tf.maximum {row['recorded / tf.maximum']:.3f}")


if __name__ == "__main__":
    main()
