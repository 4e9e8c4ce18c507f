"""Per-example Jacobians through unigrad (compile=True) against each framework's own compiled form.

The problem: a small MLP 32 -> 64 -> 16 with tanh, batch 256, float32; the Jacobian of each
example's output with respect to its input, shape (256, 16, 32).

Native forms (hand-written, the floor):
  jax:        jax.jit(jax.vmap(jax.jacrev(f_one_example)))
  torch:      torch.func.vmap(torch.func.jacrev(f_one_example))
  tensorflow: tf.function around GradientTape.batch_jacobian

On JAX also the same MLP divided by the batch size, ``f(x) / x.shape[0]`` (a mean-reduced output: rows
independent, but f on one example is another function), against ``jit(vmap(jacrev(f_one / B)))``, and
forward mode (``mode="fwd"``) against ``jit(vmap(jacfwd(f_one)))``.

Reported: unigrad time / native time per backend (target <= 1.1): the median over interleaved
rounds of the per-round ratio (and the ratio of the best rounds); absolute times are the best round. Run: python benchmarks/bench_batched_jacobian.py [--quick] [--json] [--backends ...]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import unigrad
from bench_tape import batched_jacobian_numpy, batched_mlp, batched_problem, ratio, show, timed_rounds

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




def mlp_mean(w1, b1, w2, x):
    """The MLP divided by the batch size: reads ``x.shape[0]`` as a number."""
    return mlp(w1, b1, w2, x) / x.shape[0]


def native_mean(w1, b1, w2, x):
    """JAX's own compiled per-example Jacobian of ``mlp_mean``: one example's output divided by B."""
    import jax
    import jax.numpy as jnp

    batch = x.shape[0]

    def one(w1, b1, w2, xi):
        return jnp.tanh(jnp.tanh(xi @ w1 + b1) @ w2) / batch

    fn = jax.jit(jax.vmap(jax.jacrev(one, argnums=3), in_axes=(None, None, None, 0)))
    args = [jnp.asarray(a) for a in (w1, b1, w2, x)]
    return (lambda: fn(*args).block_until_ready()), (lambda: np.asarray(fn(*args)))


def native_forward(w1, b1, w2, x):
    """JAX's own compiled per-example Jacobian in forward mode: ``jit(vmap(jacfwd(f_one)))``."""
    import jax
    import jax.numpy as jnp

    def one(w1, b1, w2, xi):
        return jnp.tanh(jnp.tanh(xi @ w1 + b1) @ w2)

    fn = jax.jit(jax.vmap(jax.jacfwd(one, argnums=3), in_axes=(None, None, None, 0)))
    args = [jnp.asarray(a) for a in (w1, b1, w2, x)]
    return (lambda: fn(*args).block_until_ready()), (lambda: np.asarray(fn(*args)))


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
        if name == "jax":  # f / x.shape[0]: f on one example is another function; the exact sum trick runs
            mean_call, mean_value = native_mean(w1, b1, w2, x)
            ours_mean = caller(unigrad.batched_jacobian(mlp_mean, argnums=3, backend=name, compile=True))
            np.testing.assert_allclose(unigrad.to_numpy(ours_mean()), mean_value(), rtol=2e-5, atol=2e-7)
            for call in (mean_call, ours_mean):
                call()
            rounds = timed_rounds([mean_call, ours_mean], number, repeat)
            results[name]["mean_ratio"] = ratio(rounds, 1, 0)
            # forward mode: the exact sum trick with each unit tangent held once (unigrad_jax._broadcasts)
            # against jit(vmap(jacfwd(f_one)))
            fwd_call, fwd_value = native_forward(w1, b1, w2, x)
            ours_fwd = caller(unigrad.batched_jacobian(mlp, argnums=3, backend=name, compile=True, mode="fwd"))
            np.testing.assert_allclose(unigrad.to_numpy(ours_fwd()), fwd_value(), rtol=2e-5, atol=2e-6)
            for call in (fwd_call, ours_fwd):
                call()
            rounds = timed_rounds([fwd_call, ours_fwd], number, repeat)
            results[name]["forward_ratio"] = ratio(rounds, 1, 0)
    return results


def run_tape(number=20, repeat=15):
    """The NumPy tape's batched_jacobian with its default proof of independent rows (read from the
    recording on every call) and without any check (``check_independence="never"``), against the
    hand-written vectorised NumPy per-example Jacobian (bench_tape's problem)."""
    w1, b1, w2, x = batched_problem()
    proved = unigrad.batched_jacobian(batched_mlp, argnums=3)
    trusted = unigrad.batched_jacobian(batched_mlp, argnums=3, check_independence="never")
    want = batched_jacobian_numpy(w1, b1, w2, x)
    rounds = timed_rounds([lambda: batched_jacobian_numpy(w1, b1, w2, x), lambda: proved(w1, b1, w2, x),
                           lambda: trusted(w1, b1, w2, x)], number, repeat)
    for jac in (proved, trusted):  # (after timing: the first round is the process's first work)
        np.testing.assert_allclose(jac(w1, b1, w2, x), want, rtol=2e-5, atol=1e-6)
    t_hand, t_proved, t_trusted = (min(col) for col in zip(*rounds))
    return {"hand": t_hand, "proved": t_proved, "never": t_trusted,
            "hand_over_proved": 1 / ratio(rounds, 1, 0), "hand_over_never": 1 / ratio(rounds, 2, 0),
            "first_round_hand_over_proved": rounds[0][0] / rounds[0][1]}


def run_tape_fresh(n, quick=False):
    """``run_tape`` as the first work of ``n`` fresh processes."""
    import json
    import subprocess
    out = []
    for _ in range(n):
        done = subprocess.run([sys.executable, __file__, "--tape-only", "--json"] + (["--quick"] if quick else []),
                              capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--backends", default="jax,torch,tensorflow")
    parser.add_argument("--tape-fresh", type=int, default=0, metavar="N",
                        help="the tape's batched_jacobian (proved rows) as the first work of N fresh processes")
    parser.add_argument("--tape-only", action="store_true", help="only the tape comparison, in this process")
    args = parser.parse_args(argv)
    if args.tape_only:
        show(run_tape(*((5, 3) if args.quick else (20, 15))), args.json, report_tape)
        return 0
    available = {n for n, info in unigrad.backends().items() if info["available"]}
    names = [n for n in args.backends.split(",") if n in available]
    results = run(names, args.quick)
    if args.tape_fresh:
        results["tape_fresh"] = run_tape_fresh(args.tape_fresh, args.quick)
    show(results, args.json, report)
    return 0


def report_tape(t):
    print(f"  tape (numpy), first work of this process: hand {t['hand'] * 1e3:.3f} ms   proved "
          f"{t['proved'] * 1e3:.3f} ms   never {t['never'] * 1e3:.3f} ms   hand/proved {t['hand_over_proved']:.2f} "
          f"(goal >= 0.5), hand/never {t['hand_over_never']:.2f}; first round hand/proved "
          f"{t['first_round_hand_over_proved']:.2f}")


def report(r):
    print(f"per-example Jacobian, MLP {N_IN}-{N_HID}-{N_OUT} tanh, batch {B}, float32 (target ratio <= 1.1)")
    fresh = r.pop("tape_fresh", None)
    for name, v in r.items():
        print(f"  {name:11s} native {v['native_seconds'] * 1e3:8.3f} ms   unigrad {v['unigrad_seconds'] * 1e3:8.3f} ms"
              f"   ratio {v['ratio']:.2f} (of the best rounds {v['ratio_of_best']:.2f});"
              f" separable=True {v['separable_seconds'] * 1e3:8.3f} ms ratio {v['separable_ratio']:.2f}"
              f"{'' if v['compiled'] else '  (eager: backend compiles nothing)'}"
              + (f"; eager (compile=False) ratio {v['eager_ratio']:.2f}" if "eager_ratio" in v else "")
              + (f"; f / x.shape[0] ratio {v['mean_ratio']:.2f}" if "mean_ratio" in v else "")
              + (f"; forward mode ratio {v['forward_ratio']:.2f}" if "forward_ratio" in v else ""))
    if fresh:
        hp = [t["hand_over_proved"] for t in fresh]
        hn = [t["hand_over_never"] for t in fresh]
        first = [t["first_round_hand_over_proved"] for t in fresh]
        print(f"  tape as the first work of {len(fresh)} fresh processes: hand/proved {min(hp):.2f}-{max(hp):.2f} "
              f"(goal >= 0.5), hand/never {min(hn):.2f}-{max(hn):.2f}; first round hand/proved "
              f"{min(first):.2f}-{max(first):.2f}")


if __name__ == "__main__":
    sys.exit(main())
