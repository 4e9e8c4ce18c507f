"""Memory of ``unigrad.checkpoint``: a gradient through a deep chain of blocks, checkpointed or not.

The function: ``depth`` blocks, each ``width`` elementwise operations (sin, scale) on a vector of n
elements, then a sum. Plain, the backward pass needs every block's intermediates at once; with
each block checkpointed, it keeps only the blocks' inputs and recomputes one block at a time.

  * the NumPy tape: peak bytes of ``unigrad.grad`` (tracemalloc, ``unigrad._memory.peak_bytes``),
    checkpointed / plain, and the time ratio (the price: one more forward pass);
  * PyTorch: the rise of peak resident memory (VmHWM) of the same gradient on the torch backend,
    each measured in a fresh subprocess (the allocator keeps freed pages), checkpointed / plain.

Ratios below 1 are memory saved. Run: python benchmarks/bench_checkpoint.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import unigrad
from unigrad import _memory


def block(x, width):
    xp = unigrad.namespace(x)
    for _ in range(width):
        x = xp.sin(x) * 1.01
    return x


def chain(remat, depth, width):
    step = unigrad.checkpoint(block) if remat else block

    def f(x):
        for _ in range(depth):
            x = step(x, width)
        return unigrad.namespace(x).sum(x)
    return f


def tape(n, depth, width, rounds):
    x = np.random.default_rng(0).standard_normal(n)
    b = unigrad.get_backend("numpy")
    result = {"n": n, "depth": depth, "width": width}
    grads = {name: unigrad.grad(chain(name == "checkpoint", depth, width)) for name in ("plain", "checkpoint")}
    np.testing.assert_allclose(grads["checkpoint"](x), grads["plain"](x), rtol=1e-12)
    for name, g in grads.items():
        g(x)
        result[f"{name}_peak_MB"] = _memory.peak_bytes(b, lambda: g(x)) / 1e6
    times = {name: [] for name in grads}
    for _ in range(rounds):
        for name, g in grads.items():
            start = time.perf_counter()
            g(x)
            times[name].append(time.perf_counter() - start)
    result["memory_ratio"] = result["checkpoint_peak_MB"] / result["plain_peak_MB"]
    result["time_ratio"] = statistics.median(c / p for c, p in zip(times["checkpoint"], times["plain"]))
    return result


_TORCH_CHILD = """
import sys, numpy as np, torch, unigrad
from unigrad import _memory
sys.path.insert(0, {here!r})
import bench_checkpoint as bc
x = torch.from_numpy(np.random.default_rng(0).standard_normal({n}))
g = unigrad.grad(bc.chain({remat}, {depth}, {width}), backend="torch")
g(x[:16])  # warm up torch.func on a small input: its one-off allocations are not the gradient's
print(_memory.peak_bytes(unigrad.get_backend("torch"), lambda: g(x)))
"""


def torch_rss(n, depth, width):
    """Peak RSS rise (MB) of the torch gradient, plain and checkpointed, each in its own process."""
    here = os.path.dirname(os.path.abspath(__file__))
    result = {"n": n, "depth": depth, "width": width}
    for name, remat in (("plain", False), ("checkpoint", True)):
        code = _TORCH_CHILD.format(here=here, n=n, depth=depth, width=width, remat=remat)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        result[f"{name}_peak_MB"] = int(out.stdout.split()[-1]) / 1e6
    result["memory_ratio"] = result["checkpoint_peak_MB"] / max(result["plain_peak_MB"], 1e-9)
    return result


def run(quick=False):
    n = 100_000 if quick else 1_000_000
    results = {"tape": tape(n, depth=16, width=8, rounds=3 if quick else 7)}
    try:
        import torch  # noqa: F401
    except ImportError:
        return results
    results["torch"] = torch_rss(n, depth=16, width=8)
    return results


def report(results):
    r = results["tape"]
    print(f"checkpoint: gradient through {r['depth']} blocks of {r['width']} ops, n = {r['n']:,} (float64)")
    print(f"  tape   peak {r['plain_peak_MB']:8.1f} MB plain   {r['checkpoint_peak_MB']:8.1f} MB checkpointed   "
          f"memory ratio {r['memory_ratio']:.3f}   time ratio {r['time_ratio']:.2f}")
    if "torch" in results:
        r = results["torch"]
        print(f"  torch  peak RSS rise {r['plain_peak_MB']:8.1f} MB plain   {r['checkpoint_peak_MB']:8.1f} MB "
              f"checkpointed   memory ratio {r['memory_ratio']:.3f}")


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
