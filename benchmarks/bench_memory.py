"""Peak memory of the NumPy tape, measured with tracemalloc (NumPy reports its buffers to it).

Reports peak bytes in units of one input's size (so the figures do not depend on n):
  * vjp (forward + one vjp_fn call) and grad of sum(sin(x) * exp(-x * x) + tanh(x)), n elements,
    unigrad against HIPS autograd (make_vjp / grad) on the same function   (target: unigrad <= autograd)
  * jacobian and batched_jacobian with chunk_size c: the peak grows with c, not with the number of
    basis vectors (the bound chunk_size gives)

Run: python benchmarks/bench_memory.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import unigrad
from unigrad import _memory


def peak_bytes(fn):
    """Peak bytes allocated (traced by tracemalloc: NumPy reports its buffers) while ``fn()`` runs, above
    what existed before: the measurement ``memory_budget`` uses on the tape."""
    return _memory.peak_bytes(unigrad.get_backend("numpy"), fn)


def smooth(x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x) * xp.exp(-x * x) + xp.tanh(x))


def smooth_autograd(x):
    import autograd.numpy as anp
    return anp.sum(anp.sin(x) * anp.exp(-x * x) + anp.tanh(x))


def mlp_rows(w1, w2, x):
    xp = unigrad.namespace(w1, x)
    return xp.tanh(xp.tanh(x @ w1) @ w2)


def run(quick=False):
    n = 200_000 if quick else 2_000_000
    x = np.random.default_rng(0).standard_normal(n)
    size = x.nbytes
    results = {"n": n}

    def ug_vjp():
        _, vjp_fn = unigrad.vjp(smooth, x)
        return vjp_fn(1.0)

    def ug_grad():
        return unigrad.grad(smooth)(x)

    # each call once before measuring: a process's first call fills caches (dispatch, signatures, the
    # first-call imports) that are no per-input memory (about 0.08 input sizes at n = 2e6)
    ug_vjp(), ug_grad()
    results["unigrad_vjp"] = peak_bytes(ug_vjp) / size
    results["unigrad_grad"] = peak_bytes(ug_grad) / size
    try:
        import autograd
        from autograd import make_vjp

        def ag_vjp():
            vjp_fn, _ = make_vjp(smooth_autograd)(x)
            return vjp_fn(1.0)

        ag_vjp(), autograd.grad(smooth_autograd)(x)
        results["autograd_vjp"] = peak_bytes(ag_vjp) / size
        results["autograd_grad"] = peak_bytes(lambda: autograd.grad(smooth_autograd)(x)) / size
    except ImportError:
        pass

    # the bound chunk_size gives: peak bytes of a Jacobian, by chunk size (the full Jacobian itself is
    # the result, so it is subtracted: what is left is the sweep's working memory)
    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((64, 256)) / 8, rng.standard_normal((256, 64)) / 16
    xs = rng.standard_normal((128, 64))
    chunks = {}
    for c in (1, 8, 64):
        jac = unigrad.jacobian(mlp_rows, argnums=2, mode="rev", chunk_size=c)
        batched = unigrad.batched_jacobian(mlp_rows, argnums=2, mode="rev", chunk_size=c,
                                           check_independence="never")
        full_bytes = 128 * 64 * 128 * 64 * 8
        per_example_bytes = 128 * 64 * 64 * 8
        chunks[c] = {"jacobian_working_MB": (peak_bytes(lambda: jac(w1, w2, xs)) - full_bytes) / 1e6,
                     "batched_jacobian_working_MB": (peak_bytes(lambda: batched(w1, w2, xs)) - per_example_bytes)
                     / 1e6}
    results["chunks"] = chunks
    return results


def report(r):
    print(f"peak memory, in input sizes, of sum(sin(x) * exp(-x * x) + tanh(x)), n = {r['n']:,} (tracemalloc)")
    for what in ("vjp", "grad"):
        ours, theirs = r[f"unigrad_{what}"], r.get(f"autograd_{what}")
        peer = f"   autograd {theirs:5.1f}   ratio {ours / theirs:.2f} (target <= 1)" if theirs else ""
        print(f"  {what:5s} unigrad {ours:5.1f}{peer}")
    print("working memory of a rev-mode Jacobian (MB, result excluded) by chunk_size, MLP 64-256-64, batch 128")
    for c, v in r["chunks"].items():
        print(f"  chunk_size {c:3d}   jacobian {v['jacobian_working_MB']:8.1f}   "
              f"batched_jacobian {v['batched_jacobian_working_MB']:8.1f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.quick)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
