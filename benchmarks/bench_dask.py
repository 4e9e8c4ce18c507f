"""Per-example Jacobians streamed from disk through unigrad.dask, on 1 and 2 worker processes.

The problem: the MLP 32 -> 64 -> 16 (tanh, float32) of bench_batched_jacobian.py, over N examples
stored in a .npy file on disk and read block by block (``unigrad.dask.from_memmap``). For each
example the Jacobian of its output with respect to its input, (16, 32); the run keeps each
example's Frobenius norm (N floats come back) and the sum of all Jacobians, so the Jacobians
themselves (N x 2 KB: 2 GB for a million examples) are never held at once anywhere.

For each number of workers: a LocalCluster of that many worker processes (one thread each, a
memory limit per worker: the budget), a warm-up run on a few blocks (each worker imports the
backend and compiles its program once), then the timed run over all N examples. Reported:
examples per second (warm), the same with the warm-up included, and each worker's peak resident
memory (VmHWM, from the worker's start) against the budget. The results are checked against the
in-memory ``unigrad.batched_jacobian`` on a sample of examples.

    python benchmarks/bench_dask.py                      # 100,000 examples (a short run)
    python benchmarks/bench_dask.py --examples 1000000   # the full run
    options: --workers 1,2  --backend jax  --block 10000  --memory-limit 1GB  --data PATH  --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import unigrad  # noqa: E402
from bench_batched_jacobian import mlp, problem  # noqa: E402


def make_data(path: pathlib.Path, n: int, n_in: int, seed: int = 0) -> None:
    """Write n examples (float32) to a .npy file, a million rows at a time at most."""
    data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, n_in))
    step = 200_000
    for start in range(0, n, step):
        stop = min(n, start + step)
        data[start:stop] = np.random.default_rng(seed + start).standard_normal((stop - start, n_in), dtype=np.float32)
    data.flush()
    del data


def _peak_rss_bytes():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return float("nan")


def _parse_bytes(text: str) -> int:
    from dask.utils import parse_bytes
    return parse_bytes(text)


def run_one(n_workers, path, block, backend, memory_limit, params):
    import dask
    import distributed

    import unigrad.dask as ud

    w1, b1, w2 = params
    X = ud.from_memmap(path, chunks=block)
    n = X.shape[0]
    jac = ud.batched_jacobian(mlp, argnums=3, backend=backend, compile=True)
    with distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", memory_limit=memory_limit) as cluster, \
            distributed.Client(cluster) as client:
        start = time.perf_counter()
        warm_n = min(n, 2 * n_workers * block)
        client.compute(jac(w1, b1, w2, X[:warm_n]).sum(axis=0), sync=True)  # each worker: import, compile
        warmup = time.perf_counter() - start
        start = time.perf_counter()
        J = jac(w1, b1, w2, X)
        norms, total = dask.compute(da_norms(J), J.sum(axis=0))
        seconds = time.perf_counter() - start
        peaks = client.run(_peak_rss_bytes)
    return {"workers": n_workers, "examples": n, "seconds": seconds, "warmup_seconds": warmup,
            "examples_per_second": n / seconds, "examples_per_second_with_warmup": n / (seconds + warmup),
            "peak_rss_bytes": sorted(peaks.values()), "memory_limit_bytes": _parse_bytes(memory_limit),
            "norms": norms, "total": total}


def da_norms(J):
    return ((J ** 2).sum(axis=(1, 2))) ** 0.5


def check(result, path, backend, params, n_sample=64, seed=0):
    """The streamed results against the in-memory batched_jacobian on a sample of examples."""
    x = np.load(path, mmap_mode="r")
    rows = np.sort(np.random.default_rng(seed).choice(x.shape[0], size=min(n_sample, x.shape[0]), replace=False))
    J = unigrad.to_numpy(unigrad.batched_jacobian(mlp, argnums=3, backend=backend)(*params, np.asarray(x[rows])))
    expected = np.sqrt((J.astype(np.float64) ** 2).sum(axis=(1, 2)))
    np.testing.assert_allclose(result["norms"][rows], expected, rtol=1e-5)  # float32 sums of 512 squares
    assert result["total"].shape == (16, 32) and np.all(np.isfinite(result["total"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--backend", default="jax")
    parser.add_argument("--block", type=int, default=10_000, help="examples per block (Dask chunk)")
    parser.add_argument("--memory-limit", default="1GB", help="per worker: the budget")
    parser.add_argument("--data", help="the .npy file (made if missing; default: in the temp directory)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    w1, b1, w2, _ = problem()
    params = (w1, b1, w2)
    path = pathlib.Path(args.data or pathlib.Path(tempfile.gettempdir()) / f"unigrad_bench_dask_{args.examples}.npy")
    if not path.exists():
        start = time.perf_counter()
        make_data(path, args.examples, w1.shape[0])
        print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s")
    size = path.stat().st_size
    print(f"per-example Jacobians (16, 32) of an MLP 32-64-16, {args.examples:,} examples from {path} "
          f"({size / 1e6:.0f} MB; the Jacobians: {args.examples * 16 * 32 * 4 / 1e9:.2f} GB), blocks of "
          f"{args.block:,}, backend {args.backend} (compile=True), budget {args.memory_limit} per worker")
    results = []
    for n_workers in [int(w) for w in args.workers.split(",")]:
        r = run_one(n_workers, path, args.block, args.backend, args.memory_limit, params)
        check(r, path, args.backend, params)
        peaks = ", ".join(f"{p / 2**20:.0f} MiB" for p in r["peak_rss_bytes"])
        print(f"  {n_workers} worker(s): {r['examples_per_second']:,.0f} examples/s warm ({r['seconds']:.1f} s), "
              f"{r['examples_per_second_with_warmup']:,.0f} examples/s with the warm-up ({r['warmup_seconds']:.1f} s); "
              f"peak RSS per worker {peaks} of {r['memory_limit_bytes'] / 2**20:.0f} MiB")
        results.append({k: v for k, v in r.items() if k not in ("norms", "total")})
    if len(results) > 1:
        print(f"  speed-up {results[-1]['workers']} workers / {results[0]['workers']}: "
              f"{results[-1]['examples_per_second'] / results[0]['examples_per_second']:.2f}x (warm), on "
              f"{os.cpu_count()} CPU cores")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
