"""Per-example Jacobians through unigrad (compile=True) against each framework's own compiled form.

The problem: a small MLP 32 -> 64 -> 16 with tanh, batch 256, float32; the Jacobian of each
example's output with respect to its input, shape (256, 16, 32).

Native forms (hand-written, the floor):
  jax:        jax.jit(jax.vmap(jax.jacrev(f_one_example)))
  torch:      torch.func.vmap(torch.func.jacrev(f_one_example))
  tensorflow: tf.function around GradientTape.batch_jacobian

Reported: unigrad time / native time per backend (target <= 1.1): the median over interleaved
rounds of the per-round ratio (and the ratio of the best rounds); absolute times are the best round. Run: python benchmarks/bench_batched_jacobian.py [--quick] [--json] [--backends ...]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import unigrad
from bench_tape import ratio, show, timed_rounds

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

B, N_IN, N_HID, N_OUT = 256, 32, 64, 16


def problem(seed=0):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((N_IN, N_HID)) / np.sqrt(N_IN)).astype(np.float32)
    b1 = (0.1 * rng.standard_normal(N_HID)).astype(np.float32)
    w2 = (rng.standard_normal((N_HID, N_OUT)) / np.sqrt(N_HID)).astype(np.float32)
    x = rng.standard_normal((B, N_IN)).astype(np.float32)
    return w1, b1, w2, x


def mlp(w1, b1, w2, x):
    """Portable: a batch (B, 32) to a batch (B, 16), rows independent."""
    xp = unigrad.namespace(w1, b1, w2, x)
    return xp.tanh(xp.tanh(x @ w1 + b1) @ w2)




def native(name, w1, b1, w2, x):
    """The hand-written, framework-native compiled per-example Jacobian, and its inputs."""
    if name == "jax":
        import jax
        import jax.numpy as jnp

        def one(w1, b1, w2, xi):
            return jnp.tanh(jnp.tanh(xi @ w1 + b1) @ w2)

        fn = jax.jit(jax.vmap(jax.jacrev(one, argnums=3), in_axes=(None, None, None, 0)))
        args = [jnp.asarray(a) for a in (w1, b1, w2, x)]
        return (lambda: fn(*args).block_until_ready()), (lambda: np.asarray(fn(*args)))
    if name == "torch":
        import torch
        from torch.func import jacrev, vmap

        def one(xi, w1, b1, w2):
            return torch.tanh(torch.tanh(xi @ w1 + b1) @ w2)

        fn = vmap(jacrev(one), in_dims=(0, None, None, None))
        args = [torch.from_numpy(a) for a in (x, w1, b1, w2)]
        return (lambda: fn(*args)), (lambda: fn(*args).numpy())
    if name == "tensorflow":
        import tensorflow as tf

        @tf.function
        def fn(w1, b1, w2, x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.tanh(tf.tanh(x @ w1 + b1) @ w2)
            return tape.batch_jacobian(y, x)

        args = [tf.constant(a) for a in (w1, b1, w2, x)]
        return (lambda: fn(*args)), (lambda: fn(*args).numpy())
    raise ValueError(name)


def run(backends, quick=False):
    # Many short interleaved runs: the best of each is the least disturbed by a shared machine (XLA and
    # TensorFlow run on all cores, so another process stretches a run); a few seconds per backend.
    number, repeat = (5, 3) if quick else (10, 80)
    w1, b1, w2, x = problem()
    results = {}
    for name in backends:
        b = unigrad.get_backend(name)
        native_call, native_value = native(name, w1, b1, w2, x)
        args = [unigrad.asarray(a, backend=name) for a in (w1, b1, w2, x)]
        # the default (the sum trick: exact for any f with independent rows) and separable=True (the
        # caller states f runs one example at a time: the backend may vmap batch-of-one Jacobians)
        ours = unigrad.batched_jacobian(mlp, argnums=3, backend=name, compile=b.capabilities.compile)
        ours_sep = unigrad.batched_jacobian(mlp, argnums=3, backend=name, compile=b.capabilities.compile,
                                            separable=True)

        def caller(transform):
            def call():
                out = transform(*args)
                if hasattr(out, "block_until_ready"):
                    out.block_until_ready()
                return out
            return call

        # TensorFlow's eager call too (compile=False: one traced program per signature, as pfor needs)
        eager = [unigrad.batched_jacobian(mlp, argnums=3, backend=name)] if name == "tensorflow" else []
        calls = [caller(t) for t in [ours, ours_sep] + eager]
        for t in [ours, ours_sep] + eager:
            np.testing.assert_allclose(unigrad.to_numpy(t(*args)), native_value(), rtol=2e-5, atol=2e-6)
        for call in [native_call] + calls:  # warm up: compilation, caches, the independence probe
            call()
        rounds = timed_rounds([native_call] + calls, number, repeat)
        t_native, t_ours, t_sep = (min(col) for col in list(zip(*rounds))[:3])
        results[name] = {"native_seconds": t_native, "unigrad_seconds": t_ours, "ratio": ratio(rounds, 1, 0),
                         "ratio_of_best": t_ours / t_native, "separable_seconds": t_sep,
                         "separable_ratio": ratio(rounds, 2, 0), "compiled": b.capabilities.compile}
        if eager:
            results[name]["eager_ratio"] = ratio(rounds, 3, 0)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--backends", default="jax,torch,tensorflow")
    args = parser.parse_args(argv)
    available = {n for n, info in unigrad.backends().items() if info["available"]}
    names = [n for n in args.backends.split(",") if n in available]
    show(run(names, args.quick), args.json, report)
    return 0


def report(r):
    print(f"per-example Jacobian, MLP {N_IN}-{N_HID}-{N_OUT} tanh, batch {B}, float32 (target ratio <= 1.1)")
    for name, v in r.items():
        print(f"  {name:11s} native {v['native_seconds'] * 1e3:8.3f} ms   unigrad {v['unigrad_seconds'] * 1e3:8.3f} ms"
              f"   ratio {v['ratio']:.2f} (of the best rounds {v['ratio_of_best']:.2f});"
              f" separable=True {v['separable_seconds'] * 1e3:8.3f} ms ratio {v['separable_ratio']:.2f}"
              f"{'' if v['compiled'] else '  (eager: backend compiles nothing)'}"
              + (f"; eager (compile=False) ratio {v['eager_ratio']:.2f}" if "eager_ratio" in v else ""))


if __name__ == "__main__":
    sys.exit(main())
