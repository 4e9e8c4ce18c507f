"""Compiled calls with a new Python float every call, against each framework's own compiled form.

A user's loop passes a number that changes on every call (a step size, a temperature): with
``compile=True`` a Python float is a dynamic, weakly typed input of the program, so a new value must
not build a new program. The problem: ``grad`` of ``sum(sin(c * x) * c)`` for x of shape (64,),
float32, called 50 times with 50 distinct floats.

Native forms:
  jax:        jax.jit(jax.grad(f)) called with the Python float (jit traces it as a weak scalar)
  tensorflow: tf.function of a GradientTape gradient, called with the number as a tensor (a Python
              float would retrace tf.function on every call)

Reported: unigrad time / native time for the 50 calls (target <= 1.5), the median over interleaved
rounds; and the growth of the process (resident set size) over 2000 further such calls of unigrad
(target: none to speak of -- one program serves every value).

Run: python benchmarks/bench_calls.py [--quick] [--json] [--backends ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import unigrad
from bench_tape import ratio, timed_rounds

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

N = 64
CALLS = 50
MEMORY_CALLS = 2000


def loss(x, c):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x * c) * c)


def native(name, x):
    """The framework's own compiled gradient, as a function of the float."""
    if name == "jax":
        import jax
        import jax.numpy as jnp

        fn = jax.jit(jax.grad(lambda x, c: jnp.sum(jnp.sin(x * c) * c)))
        xj = jnp.asarray(x)
        return lambda c: fn(xj, c), xj
    import tensorflow as tf

    @tf.function
    def fn(x, c):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(tf.sin(x * c) * c)
        return tape.gradient(y, x)

    xt = tf.constant(x)
    return lambda c: fn(xt, tf.constant(c, tf.float32)), xt


def rss_bytes() -> int:
    """The process's resident set size now (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def run_backend(name, quick=False):
    x = np.linspace(-1.0, 1.0, N).astype(np.float32)
    native_fn, xb = native(name, x)
    ours = unigrad.grad(loss, backend=name, compile=True)
    values = iter(np.random.default_rng(0).uniform(0.1, 2.0, 10 ** 6).tolist())  # never the same float twice
    np.testing.assert_allclose(unigrad.to_numpy(ours(xb, 0.75)), unigrad.to_numpy(native_fn(0.75)), rtol=1e-5)

    def fifty(fn):
        def run():
            for _ in range(CALLS):
                out = fn(next(values))
            unigrad.to_numpy(out)  # wait for the last result (JAX dispatches asynchronously)
        return run

    # many short rounds (each 50 calls of each form, adjacent in time): one round is about a millisecond,
    # so a shared machine's spikes hit single rounds; the median of 61 per-round ratios reads through them
    rounds = timed_rounds([fifty(lambda c: ours(xb, c)), fifty(native_fn)],
                          number=1, repeat=15 if quick else 61)
    before = rss_bytes()
    for _ in range(MEMORY_CALLS):
        out = ours(xb, next(values))
    unigrad.to_numpy(out)
    grown = rss_bytes() - before
    per_round = sorted(r[0] / r[1] for r in rounds)
    return {"ratio_50_floats": ratio(rounds, 0, 1), "ratio_iqr": (per_round[len(per_round) // 4],
                                                                  per_round[(3 * len(per_round)) // 4]),
            "ratio_of_best": min(r[0] for r in rounds) / min(r[1] for r in rounds),
            "unigrad_50_calls_s": min(r[0] for r in rounds),
            "native_50_calls_s": min(r[1] for r in rounds), "rss_growth_2000_calls_MiB": grown / 2 ** 20}


def run(names, quick=False):
    results = {}
    for name in names:
        try:
            results[name] = run_backend(name, quick)
        except ImportError as exc:
            results[name] = {"skipped": str(exc)}
    return results


def report(results):
    for name, r in results.items():
        if "skipped" in r:
            print(f"  {name}: skipped ({r['skipped']})")
            continue
        print(f"  {name}: 50 calls with distinct floats, unigrad / native = {r['ratio_50_floats']:.2f} "
              f"(middle half of rounds {r['ratio_iqr'][0]:.2f}-{r['ratio_iqr'][1]:.2f}, of the best rounds "
              f"{r['ratio_of_best']:.2f}; target <= 1.5; {r['unigrad_50_calls_s'] * 1e3:.2f} ms vs "
              f"{r['native_50_calls_s'] * 1e3:.2f} ms); "
              f"2000 more calls grew the process by {r['rss_growth_2000_calls_MiB']:.1f} MiB")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--backends", nargs="*", default=["jax", "tensorflow"])
    args = parser.parse_args(argv)
    names = [n for n in args.backends if unigrad.backends().get(n, {}).get("available")]
    results = run(names, args.quick)
    if args.json:
        print(json.dumps(results, indent=2, default=float))
    else:
        report(results)


if __name__ == "__main__":
    sys.exit(main())
