"""The cost of ``unigrad.bridge``: a torch function called from JAX, against the same function run natively.

For n elements (float32): ``f(x) = tanh(x) * 2`` written with torch.

  * call: ``unigrad.evaluate`` of the bridged f on a JAX array (DLPack both ways) against f on a
    torch tensor, as a ratio and as microseconds of overhead; at large n the ratio goes to 1 when the
    hand-over copies nothing;
  * hand-over: ``torch.from_dlpack`` of a JAX array against a NumPy copy of it (what a copy would cost);
  * grad: ``unigrad.grad`` of ``sum(f(x)^2)`` on JAX with f bridged to torch, against the same gradient
    on the torch backend (the bridge recomputes f in the backward pass: expect about 1.5-2x).

Run: python benchmarks/bench_bridge.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import unigrad


def best_time(fn, rounds):
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def paired_ratio(a, b, rounds):
    """Median over rounds of time(a) / time(b), each round timing both (shared-machine noise cancels)."""
    a(), b()
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ratios)


def run(quick=False):
    import jax
    import torch

    def f(x):
        return torch.tanh(x) * 2

    bridged = unigrad.bridge(f, backend="torch")

    def loss_torch(x):
        return (f(x) ** 2).sum()

    def loss_bridged(x):
        y = bridged(x)
        return unigrad.namespace(y).sum(y ** 2)

    rounds = 5 if quick else 25
    results = {}
    for n in ((1_000, 1_000_000) if quick else (1_000, 1_000_000, 10_000_000)):
        host = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        x_jax, x_torch = jax.device_put(host), torch.from_numpy(host.copy())
        call = lambda: jax.block_until_ready(unigrad.evaluate(bridged, x_jax, backend="jax"))  # noqa: E731
        native = lambda: f(x_torch)  # noqa: E731
        r = {"call_ratio": paired_ratio(call, native, rounds)}
        r["call_overhead_us"] = (best_time(call, rounds) - best_time(native, rounds)) * 1e6
        r["dlpack_us"] = best_time(lambda: torch.from_dlpack(x_jax), rounds) * 1e6
        r["numpy_copy_us"] = best_time(lambda: np.array(x_jax), rounds) * 1e6
        grad_bridged = unigrad.grad(loss_bridged, backend="jax")
        grad_native = unigrad.grad(loss_torch, backend="torch")
        np.testing.assert_allclose(np.asarray(grad_bridged(x_jax)), grad_native(x_torch).numpy(), rtol=1e-5)
        r["grad_ratio"] = paired_ratio(lambda: jax.block_until_ready(grad_bridged(x_jax)),
                                       lambda: grad_native(x_torch), rounds)
        results[n] = r
    return results


def report(results):
    print("bridge: torch f(x) = tanh(x) * 2 called from JAX (float32), against f run natively on torch")
    for n, r in results.items():
        print(f"  n = {int(n):>10,}   call ratio {r['call_ratio']:6.2f} (+{r['call_overhead_us']:7.1f} us)   "
              f"DLPack hand-over {r['dlpack_us']:6.1f} us vs a copy {r['numpy_copy_us']:8.1f} us   "
              f"grad ratio {r['grad_ratio']:5.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.quick)
    print(json.dumps(results, indent=2)) if args.json else report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
