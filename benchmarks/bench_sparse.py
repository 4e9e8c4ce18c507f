"""Sparse Jacobians and Hessians (unigrad.sparse_jacobian / sparse_hessian) against the dense
transforms on each backend, and against asdex on JAX (when installed), side by side in one run.

Problems (float64):
  brusselator N=32, N=64: the 2-D Brusselator's right-hand side, 2 N^2 unknowns, 6 non-zeros a row
                          (examples/brusselator_newton.py);
  tridiagonal n=10^4:     a banded map, 3 non-zeros a row (3 colours is optimal);
  rosenbrock n=10^4:      the Hessian of the chained Rosenbrock function (tridiagonal; 3 colours).

Every transform is compiled where the backend compiles (compile=True: jax.jit, tf.function) and
timed after a first call (the pattern, the colouring and the program are made once per signature).

Dense results do not fit this machine beyond a few thousand unknowns (the dense Jacobian alone at
N=64 is 8192^2 x 8 B = 512 MiB, and its vectorised forward pass holds several such arrays): the
dense time is then measured at two smaller sizes of the same problem and extrapolated as
``a + b n^2`` through those two points (a dense Jacobian writes n^2 entries, from n passes of O(n)
each; ``a`` is the fixed cost of a call) -- ``dense_seconds_estimated``, marked so in the report. The
dense memory is its result alone, n^2 x 8 bytes: a lower bound. Sparse memory is the measured peak of
one call (tracemalloc on the NumPy tape; the rise of the process's peak RSS elsewhere, which does not
see small allocations), and never less than the result itself (values and indices).

Reported per problem and backend: sparse seconds, dense seconds (measured or estimated), the
speed-up dense / sparse (goal >= 50 at N = 64), the memory ratio (goal >= 100), the colours beside
the known optimum, and on JAX the ratio unigrad / asdex (goal <= 1.2) with both colour counts: the
median over 15 rounds of 20 calls of each, the two alternated on their own (no dense call between).

With TensorFlow among the backends, one more row: the Brusselator N = 32 eagerly (``compile=False``),
sparse against dense, and the sparse first call.

Run: python benchmarks/bench_sparse.py [--quick] [--json] [--backends numpy,jax,torch,tensorflow]
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys

import numpy as np
from scipy import sparse

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import unigrad  # noqa: E402
from unigrad import _memory  # noqa: E402
from bench_tape import have, ratio, show, timed_rounds  # noqa: E402
from brusselator_newton import brusselator, brusselator_pattern, initial_state  # noqa: E402


def tridiagonal_map(x):
    xp = unigrad.namespace(x)
    left = xp.concat([xp.zeros_like(x[:1]), x[:-1]])
    right = xp.concat([x[1:], xp.zeros_like(x[:1])])
    return xp.sin(x) * 2.0 + left * x + right ** 2


def rosenbrock(x):
    xp = unigrad.namespace(x)
    return xp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def tridiagonal(n):
    return sparse.diags_array([1, 1, 1], offsets=[-1, 0, 1], shape=(n, n), dtype=bool)


def _problem(name, size):
    """``(kind, f, args, pattern, unknowns, optimum colours)`` of a problem at a size."""
    if name == "brusselator":
        return "jacobian", brusselator, (initial_state(size), size), brusselator_pattern(size), 2 * size * size, None
    x = np.linspace(-1.2, 1.3, size)
    if name == "tridiagonal":
        return "jacobian", tridiagonal_map, (x,), tridiagonal(size), size, 3
    return "hessian", rosenbrock, (x,), tridiagonal(size), size, 3


# (name, size, the two sizes the dense time is measured at; None: dense measured at the size itself)
PROBLEMS = [("brusselator", 32, None), ("brusselator", 64, (24, 32)), ("tridiagonal", 10_000, (1500, 3000)),
            ("rosenbrock", 10_000, (1500, 3000))]
QUICK = [("brusselator", 32, None), ("tridiagonal", 10_000, (1000, 2000))]


def _block(value):
    for attr in ("block_until_ready",):
        if hasattr(value, attr):
            return getattr(value, attr)()
    if hasattr(value, "data") and hasattr(value.data, "block_until_ready"):  # BCOO
        value.data.block_until_ready()
    return value


def _sparse_fn(kind, f, args, pattern, backend):
    """The compiled sparse transform, its pattern detected (as asdex detects its own): on a backend that
    reads its own program (JAX, torch, TensorFlow) the pattern is proved over it and the values are not
    checked (plan.checked False); on the NumPy tape they are, on every call. The detected pattern must be
    the problem's."""
    b = unigrad.get_backend(backend)
    if kind == "jacobian":
        transform = unigrad.sparse_jacobian(f, backend=backend, compile=True)
    else:
        transform = unigrad.sparse_hessian(f, backend=backend, compile=True)
    call_args = tuple(b.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
    plan = transform.plan(*call_args)
    if (plan.pattern != sparse.csr_array(pattern, dtype=bool)).nnz:
        raise AssertionError(f"{backend}: the detected pattern is not the problem's")
    return (lambda: _block(transform(*call_args))), plan


def _dense_fn(kind, f, args, backend):
    b = unigrad.get_backend(backend)
    transform = (unigrad.jacobian if kind == "jacobian" else unigrad.hessian)(f, backend=backend, compile=True)
    call_args = tuple(b.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
    return lambda: _block(transform(*call_args))


def _asdex_fn(kind, f, args):
    import asdex
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        x = jnp.asarray(args[0])
        g = (lambda x: f(x, *args[1:]))
        make = asdex.jacobian if kind == "jacobian" else asdex.hessian
        fn = jax.jit(make(g, x))
        coloring = (asdex.jacobian_coloring if kind == "jacobian" else asdex.hessian_coloring)(g, x)
        fn(x).data.block_until_ready()

    def call():
        with jax.enable_x64(True):
            return fn(x).data.block_until_ready()

    return call, coloring.num_colors


def _time(fns, quick, number=None):
    for fn in fns:
        fn()  # the first call: plan, colouring, compilation
    number, repeat = number or ((1, 3) if quick else (3, 7))
    return timed_rounds(fns, number, repeat)


def run(backends, quick=False):
    results = {}
    for name, size, dense_at in (QUICK if quick else PROBLEMS):
        kind, f, args, pattern, n, optimum = _problem(name, size)
        key = f"{name}_{size}"
        results[key] = entry = {"unknowns": n, "nnz": int(pattern.nnz), "optimum_colours": optimum}
        for backend in backends:
            sparse_call, plan = _sparse_fn(kind, f, args, pattern, backend)
            row = entry[backend] = {"colours": plan.n_colors, "mode": plan.mode, "checked": plan.checked}
            fns = [sparse_call]
            if dense_at is None:
                fns.append(_dense_fn(kind, f, args, backend))
            asdex_colours = None
            if backend == "jax" and have("asdex"):
                asdex_call, asdex_colours = _asdex_fn(kind, f, args)
            rounds = _time(fns, quick)
            row["sparse_seconds"] = min(r[0] for r in rounds)
            row["sparse_peak_measured"] = _memory.peak_bytes(unigrad.get_backend(backend), sparse_call)
            row["sparse_peak_bytes"] = max(row["sparse_peak_measured"], plan.nnz * (8 + 2 * 8))
            if dense_at is None:
                row["dense_seconds"] = min(r[1] for r in rounds)
                row["speedup"] = 1.0 / ratio(rounds, 0, 1)
            else:
                small = []
                for s in dense_at:
                    _, fs, args_s, _, n_s, _ = _problem(name, s)
                    dense_s = _dense_fn(kind, fs, args_s, backend)
                    small.append((n_s, min(r[0] for r in _time([dense_s], quick))))
                (n1, t1), (n2, t2) = small
                slope = max((t2 - t1) / (n2 ** 2 - n1 ** 2), 0.0)
                fixed = max(t1 - slope * n1 ** 2, 0.0)
                row["dense_measured"] = {str(k): t for k, t in small}
                row["dense_exponent"] = math.log(t2 / t1) / math.log(n2 / n1)  # as measured, for reference
                row["dense_seconds_estimated"] = fixed + slope * n ** 2
                row["speedup"] = row["dense_seconds_estimated"] / row["sparse_seconds"]
            row["dense_result_bytes"] = n * n * 8
            row["memory_ratio"] = row["dense_result_bytes"] / max(row["sparse_peak_bytes"], 1)
            if asdex_colours is not None:
                # Its own rounds, the two alone (a dense call of 0.1-0.2 s between them evicted the caches
                # of whichever ran next), each round 20 calls of each: the small problems' calls last
                # 0.1-0.3 ms, and one scheduler spike on a shared machine decided a round of 3.
                head = _time([sparse_call, asdex_call], quick, number=(5, 5) if quick else (20, 15))
                row["asdex_colours"] = int(asdex_colours)
                row["asdex_seconds"] = min(r[1] for r in head)
                row["ratio_vs_asdex"] = ratio(head, 0, 1)
            print(f"  done: {key} on {backend}", file=sys.stderr, flush=True)  # progress (long runs)
    return results


def eager_tensorflow(size=32):
    """Eager TensorFlow (``compile=False``) on the Brusselator: sparse and dense seconds per call after a
    first call, 3 alternated rounds of one call each (a dense eager call takes 1-2 s: pfor traces anew
    on every call; the sparse passes are one traced program per signature)."""
    kind, f, args, pattern, n, _ = _problem("brusselator", size)
    b = unigrad.get_backend("tensorflow")
    call_args = tuple(b.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
    sparse_t = unigrad.sparse_jacobian(f, sparsity=pattern, backend="tensorflow")
    dense_t = unigrad.jacobian(f, backend="tensorflow")
    import time

    start = time.perf_counter()
    sparse_t(*call_args)
    first = time.perf_counter() - start
    rounds = _time([lambda: sparse_t(*call_args), lambda: dense_t(*call_args)], True)
    return {"unknowns": n, "sparse_first_seconds": first, "sparse_seconds": min(r[0] for r in rounds),
            "dense_seconds": min(r[1] for r in rounds), "speedup": 1.0 / ratio(rounds, 0, 1)}


def report(results):
    print("sparse vs dense (compile=True; speed-up = dense time / sparse time; memory = dense result / sparse peak)")
    for key, entry in results.items():
        if key.endswith("_tensorflow_eager"):
            print(f"{key} (compile=False): sparse {entry['sparse_seconds'] * 1e3:.1f} ms (first call "
                  f"{entry['sparse_first_seconds']:.2f} s), dense {entry['dense_seconds'] * 1e3:.0f} ms, "
                  f"speed-up {entry['speedup']:.0f}x")
            continue
        print(f"{key}: {entry['unknowns']} unknowns, {entry['nnz']} non-zeros, optimum colours "
              f"{entry['optimum_colours'] or 'unknown'}")
        for backend, row in entry.items():
            if not isinstance(row, dict):
                continue
            dense = (f"dense {row['dense_seconds'] * 1e3:9.1f} ms" if "dense_seconds" in row else
                     f"dense ~{row['dense_seconds_estimated'] * 1e3:8.0f} ms (estimated from n = "
                     f"{', '.join(row['dense_measured'])}, measured growth n^{row['dense_exponent']:.2f})")
            line = (f"  {backend:<10} {row['colours']:3d} colours ({row['mode']}{', checked' if row.get('checked') else ''})  sparse {row['sparse_seconds'] * 1e3:8.2f} ms"
                    f"  {dense}  speed-up {row['speedup']:8.1f}x  memory {row['memory_ratio']:8.0f}x")
            if "ratio_vs_asdex" in row:
                line += (f"  | asdex {row['asdex_seconds'] * 1e3:.2f} ms, {row['asdex_colours']} colours: "
                         f"unigrad/asdex {row['ratio_vs_asdex']:.2f}")
            print(line)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--backends", default="numpy,jax,torch,tensorflow")
    args = parser.parse_args(argv)
    available = {n for n, i in unigrad.backends().items() if i["available"]}
    backends = [b for b in args.backends.split(",") if b in available]
    results = run(backends, args.quick)
    if "tensorflow" in backends:
        results["brusselator_32_tensorflow_eager"] = eager_tensorflow(32)
    show(results, args.json, report)


if __name__ == "__main__":
    main()
