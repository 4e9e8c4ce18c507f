"""How batched_jacobian scales with the batch size, on every installed backend, against a Python loop
of per-example Jacobians on the same backend (the thing batched_jacobian exists to avoid).

MLP 32-64-16 (tanh), float32, B from 16 to 1024: seconds per call (best of a few rounds), and the
loop's time over batched_jacobian's at the sizes where the loop is still affordable.

Run: python benchmarks/bench_scaling.py [--quick] [--json] [--plot PATH.png] [--backends numpy,jax,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import unigrad  # noqa: E402

N_IN, N_HID, N_OUT = 32, 64, 16


def mlp(w1, w2, x):
    xp = unigrad.namespace(w1, x)
    return xp.tanh(xp.tanh(x @ w1) @ w2)


def _ready(out):
    """Wait for asynchronous results (JAX dispatches and returns at once)."""
    for leaf in out if isinstance(out, (list, tuple)) else (out,):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return out


def best_seconds(fn, number, repeat):
    _ready(fn())  # warm up: compilation, caches, the independence probe
    return min(timeit.repeat(lambda: _ready(fn()), number=number, repeat=repeat)) / number


def run(backends, quick=False):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((N_IN, N_HID)) / np.sqrt(N_IN)).astype(np.float32)
    w2 = (rng.standard_normal((N_HID, N_OUT)) / np.sqrt(N_HID)).astype(np.float32)
    sizes = (16, 64, 256) if quick else (16, 64, 256, 1024)
    number, repeat = (2, 2) if quick else (5, 7)
    results = {}
    for name in backends:
        b = unigrad.get_backend(name)
        compiled = b.capabilities.compile
        batched = unigrad.batched_jacobian(mlp, argnums=2, backend=name, compile=compiled)
        single = unigrad.jacobian(lambda w1, w2, xi: mlp(w1, w2, xi[None])[0], argnums=2, backend=name,
                                  compile=compiled)
        W1, W2 = unigrad.asarray(w1, backend=name), unigrad.asarray(w2, backend=name)
        rows = []
        for B in sizes:
            x = unigrad.asarray(rng.standard_normal((B, N_IN)).astype(np.float32), backend=name)
            t_batched = best_seconds(lambda: batched(W1, W2, x), number, repeat)
            row = {"batch": B, "batched_seconds": t_batched}
            if B <= 64:  # the loop costs B calls: measured only where it stays affordable
                def loop():
                    return [single(W1, W2, x[i]) for i in range(B)]
                row["loop_seconds"] = best_seconds(loop, 1, repeat)
                row["loop_over_batched"] = row["loop_seconds"] / t_batched
            rows.append(row)
        results[name] = rows
    return results


def report(results):
    print(f"batched_jacobian, MLP {N_IN}-{N_HID}-{N_OUT} tanh, float32: seconds per call by batch size")
    for name, rows in results.items():
        cells = "  ".join(f"B={r['batch']}: {r['batched_seconds'] * 1e3:.2f} ms"
                          + (f" (loop {r['loop_over_batched']:.0f}x slower)" if "loop_over_batched" in r else "")
                          for r in rows)
        print(f"  {name:11s} {cells}")


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in results.items():
        ax.loglog([r["batch"] for r in rows], [r["batched_seconds"] * 1e3 for r in rows], marker="o", label=name)
        looped = [r for r in rows if "loop_seconds" in r]
        if looped:
            ax.loglog([r["batch"] for r in looped], [r["loop_seconds"] * 1e3 for r in looped], linestyle=":",
                      marker="x", color=ax.lines[-1].get_color(), label=f"{name}, Python loop")
    ax.set_xlabel("batch size B")
    ax.set_ylabel("ms per call")
    ax.set_title(f"batched_jacobian, MLP {N_IN}-{N_HID}-{N_OUT}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", metavar="PATH")
    parser.add_argument("--backends", default="numpy,jax,torch,tensorflow")
    args = parser.parse_args(argv)
    available = {n for n, info in unigrad.backends().items() if info["available"]}
    results = run([n for n in args.backends.split(",") if n in available], args.quick)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        report(results)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
