"""What real clients pay (issue 37): unigrad called as a library calls its autodiff layer, against the
native form of the same computation, in the same run.

Rows (each: unigrad / native, the median over interleaved rounds of the per-round ratio):

  flat_inline / flat_reused (torch; autograd plugin): ``unigrad.jacobian(f)(x)`` built on every call, and
      one transform reused, for a tiny f (an immersion of R^2 into R^3), against ``torch.func.jacrev(f)(x)``
      (``autograd.jacobian(f)(x)`` on the plugin).
  nested (torch): the derivative of a pullback metric, ``jacobian(lambda u: J(u).T @ J(u))`` with
      ``J = unigrad.jacobian(immersion)``, both built inline on every call, against ``torch.func.jacrev``
      nested by hand the same way (target <= 1.2).
  numpy_into_jit (jax): ``grad(f, backend="jax", compile=True)`` called with a float64 NumPy array and a new
      Python float each call, against ``jax.jit(jax.grad(f))`` called the same way with float64 enabled by
      ``jax.enable_x64(True)`` around each call (unigrad never flips the global flag: it enters that scope
      itself) (target <= 1.3); also against the same given a copy of the array (the safe form: jit may
      read a NumPy argument in place after returning, so a write into it right after the call could change
      the result; unigrad hands the program a copy), against the native calls inside one scope for the
      whole round (the floor: no scope to enter per call), and unigrad given a JAX array.
  batched_closure / batched_parameters (torch): ``batched_jacobian(f)(x)`` of an MLP 32-64-16 (batch 256,
      float32) whose weights f closes over (plain tensors; ``nn.Parameter``s, which require grad), against
      ``torch.func.vmap(torch.func.jacrev(f))(x)``; also the count of answer checks run (expected 0: the
      rows are proved, the exact sum trick runs).

A shared machine moves both sides of a round alike; the median of per-round ratios ignores rounds a spike
hit one side of. Peers that are not installed are skipped. torch runs on one thread (both sides), which
keeps a loaded machine's rounds comparable.

Run: python benchmarks/bench_clients.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import timeit

import numpy as np

import unigrad
from bench_tape import ratio, show

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def rounds_of(fns, number, repeat, contexts=None):
    """``repeat`` rounds of the mean seconds per call of each function over ``number`` calls, the functions
    interleaved within a round; ``contexts[k]`` (a function making a context manager) is entered around the
    k-th function's timed calls, outside the timing of each call."""
    contexts = contexts or [contextlib.nullcontext] * len(fns)
    out = []
    for _ in range(repeat):
        row = []
        for fn, ctx in zip(fns, contexts):
            with ctx():
                row.append(timeit.timeit(fn, number=number) / number)
        out.append(row)
    return out


def immersion_torch(u):
    import torch
    a, b = u[0], u[1]
    return torch.stack([torch.sin(a) * torch.cos(b), torch.sin(a) * torch.sin(b), torch.cos(a)])


def run_torch(quick):
    import torch

    torch.set_num_threads(1)
    u = torch.tensor([0.7, 0.3], dtype=torch.float64)
    reused = unigrad.jacobian(immersion_torch)

    def flat_inline():
        return unigrad.jacobian(immersion_torch)(u)

    def flat_native():
        return torch.func.jacrev(immersion_torch)(u)

    def metric(u):
        J = unigrad.jacobian(immersion_torch)
        return J(u).T @ J(u)

    def nested():
        return unigrad.jacobian(lambda v: metric(v))(u)

    def metric_native(u):
        J = torch.func.jacrev(immersion_torch)
        return J(u).T @ J(u)

    def nested_native():
        return torch.func.jacrev(lambda v: metric_native(v))(u)

    torch.testing.assert_close(flat_inline(), flat_native())
    torch.testing.assert_close(nested(), nested_native())
    number, repeat = (20, 5) if quick else (50, 25)
    rounds = rounds_of([flat_native, flat_inline, lambda: reused(u)], number, repeat)
    results = {"flat_inline": ratio(rounds, 1, 0), "flat_reused": ratio(rounds, 2, 0),
               "flat_native_seconds": min(r[0] for r in rounds)}
    rounds = rounds_of([nested_native, nested], max(number // 5, 4), repeat)
    results["nested"] = ratio(rounds, 1, 0)
    results["nested_native_seconds"] = min(r[0] for r in rounds)
    results.update(run_batched(quick))
    return results


def run_batched(quick):
    """torch batched_jacobian of an MLP whose weights f closes over, against vmap(jacrev(f))."""
    import torch

    from unigrad import _batched

    rng = np.random.default_rng(0)
    w1 = torch.from_numpy((rng.standard_normal((32, 64)) / np.sqrt(32)).astype(np.float32))
    b1 = torch.from_numpy((0.1 * rng.standard_normal(64)).astype(np.float32))
    w2 = torch.from_numpy((rng.standard_normal((64, 16)) / 8).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((256, 32)).astype(np.float32))
    p1, q1, p2 = (torch.nn.Parameter(t.clone()) for t in (w1, b1, w2))

    def closure(x):
        return torch.tanh(torch.tanh(x @ w1 + b1) @ w2)

    def parameters(x):
        return torch.tanh(torch.tanh(x @ p1 + q1) @ p2)

    checks = []
    real = {name: getattr(_batched, name) for name in ("checked_kernel", "probed_kernel")}

    def counted(name):
        def spy(*a, **k):
            checks.append(name)
            return real[name](*a, **k)
        return spy

    results = {}
    number, repeat = (3, 5) if quick else (5, 25)
    try:
        for name in real:
            setattr(_batched, name, counted(name))
        for row, f in (("batched_closure", closure), ("batched_parameters", parameters)):
            ours, native = unigrad.batched_jacobian(f), torch.func.vmap(torch.func.jacrev(f))
            torch.testing.assert_close(ours(x), native(x).detach())
            rounds = rounds_of([lambda: native(x), lambda: ours(x)], number, repeat)
            results[row] = ratio(rounds, 1, 0)
        results["batched_answer_checks_run"] = len(checks)
    finally:
        for name, fn in real.items():
            setattr(_batched, name, fn)
    return results


def run_autograd(quick):
    import autograd
    import autograd.numpy as anp

    def immersion(u):
        return anp.stack([anp.sin(u[0]) * anp.cos(u[1]), anp.sin(u[0]) * anp.sin(u[1]), anp.cos(u[0])])

    u = np.array([0.7, 0.3])
    reused = unigrad.jacobian(immersion, backend="autograd")
    native = autograd.jacobian(immersion)
    np.testing.assert_allclose(unigrad.to_numpy(reused(u)), native(u), rtol=1e-12)
    number, repeat = (20, 5) if quick else (100, 25)
    rounds = rounds_of([lambda: autograd.jacobian(immersion)(u),
                        lambda: unigrad.jacobian(immersion, backend="autograd")(u), lambda: reused(u)],
                       number, repeat)
    return {"flat_inline": ratio(rounds, 1, 0), "flat_reused": ratio(rounds, 2, 0)}


def run_jax(quick):
    import jax
    import jax.numpy as jnp

    def f(x, c):
        return jnp.sum(jnp.sin(x) * c)

    x = np.linspace(0.0, 1.0, 64)  # float64 NumPy
    floats = iter(np.linspace(0.5, 1.5, 10_000_000).tolist())
    ours = unigrad.grad(f, backend="jax", compile=True)
    native = jax.jit(jax.grad(f))
    with jax.enable_x64(True):
        want = np.asarray(native(x, 0.75))
    got = ours(x, 0.75)
    assert got.dtype == np.float64
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-14)
    number, repeat = (200, 5) if quick else (500, 25)
    jx = unigrad.asarray(x, backend="jax")

    def scoped():  # float64 without the global flag: the scope entered on every call, as unigrad must
        with jax.enable_x64(True):
            return native(x, next(floats))

    def scoped_copy():  # the same, safe against a write into x while the program runs (what unigrad does)
        with jax.enable_x64(True):
            return native(x.copy(), next(floats))

    rounds = rounds_of([lambda: native(x, next(floats)), lambda: ours(x, next(floats)),
                        lambda: ours(jx, next(floats)), scoped, scoped_copy], number, repeat,
                       [lambda: jax.enable_x64(True)] + [contextlib.nullcontext] * 4)
    return {"numpy_into_jit": ratio(rounds, 1, 3), "numpy_into_jit_vs_copy": ratio(rounds, 1, 4),
            "numpy_into_jit_vs_x64_on": ratio(rounds, 1, 0), "jax_array_into_jit": ratio(rounds, 2, 3),
            "native_seconds": min(r[3] for r in rounds)}


def run(quick=False):
    out = {"load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None, "cpus": os.cpu_count()}
    if importlib.util.find_spec("torch"):
        out["torch"] = run_torch(quick)
    if importlib.util.find_spec("autograd"):
        out["autograd"] = run_autograd(quick)
    if importlib.util.find_spec("jax"):
        out["jax"] = run_jax(quick)
    out["load_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return out


def report(r):
    load = "unknown" if r.get("load") is None else f"{r['load']:.1f} -> {r['load_after']:.1f}"
    print(f"load average {load} on {r['cpus']} CPUs (ratios: unigrad / native)")
    t = r.get("torch")
    if t:
        print(f"  torch  jacobian(f)(x) built per call  {t['flat_inline']:.2f}x torch.func.jacrev   "
              f"(reused: {t['flat_reused']:.2f}x; native {t['flat_native_seconds'] * 1e6:.0f} us)")
        print(f"  torch  nested pullback-metric derivative  {t['nested']:.2f}x nested jacrev (target <= 1.2; "
              f"native {t['nested_native_seconds'] * 1e3:.2f} ms)")
        print(f"  torch  batched_jacobian, closure MLP  {t['batched_closure']:.2f}x vmap(jacrev); nn.Parameter "
              f"weights {t['batched_parameters']:.2f}x; answer checks run: {t['batched_answer_checks_run']}")
    a = r.get("autograd")
    if a:
        print(f"  autograd plugin  jacobian(f)(x) built per call {a['flat_inline']:.2f}x autograd.jacobian "
              f"(reused: {a['flat_reused']:.2f}x)")
    j = r.get("jax")
    if j:
        print(f"  jax  grad(compile=True), float64 NumPy + new float  {j['numpy_into_jit']:.2f}x jit(grad) in an x64 "
              f"scope per call (target <= 1.3; {j['numpy_into_jit_vs_copy']:.2f}x the same given a copy of the "
              f"array), {j['numpy_into_jit_vs_x64_on']:.2f}x with x64 on for the whole round; given a JAX array "
              f"{j['jax_array_into_jit']:.2f}x (native {j['native_seconds'] * 1e6:.0f} us)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    show(run(args.quick), args.json, report)


if __name__ == "__main__":
    sys.exit(main())
