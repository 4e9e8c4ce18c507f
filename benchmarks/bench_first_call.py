"""The first call of ``batched_jacobian`` in a fresh process, against the framework's own first call.

A new user's first call pays for tracing and compiling; unigrad's must not cost much more than the
native form's. Each measurement is a fresh Python process that imports NumPy, unigrad and the
framework and converts the inputs to the framework's arrays (all untimed: the framework's own start-up
is not unigrad's), then times the first call of the computation, and the second for reference.

The problem is bench_batched_jacobian's: an MLP 32 -> 64 -> 16 with tanh, batch 256, float32.

Native forms (the first call includes their tracing and compiling):
  jax:        jax.jit(jax.vmap(jax.jacrev(f_one_example)))
  torch:      torch.func.vmap(torch.func.jacrev(f_one_example))
  tensorflow: tf.function around GradientTape.batch_jacobian

unigrad: ``batched_jacobian(mlp, argnums=3, backend=name)`` as a user writes it (rows proved
independent), with ``compile=True`` on JAX and TensorFlow (the form the native one matches), and
without on TensorFlow too (eager: one traced program per signature).

Reported: per form, the median over fresh processes of the first call's seconds, and unigrad / native
(target <= 1.5). Processes of the forms alternate, so a slow spell of a shared machine hits all alike.

Run: python benchmarks/bench_first_call.py [--quick] [--json] [--backends jax,torch,tensorflow] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FORMS = {"jax": ("native", "unigrad-compiled"), "torch": ("native", "unigrad"),
         "tensorflow": ("native", "unigrad-compiled", "unigrad")}


def child(name, form):
    """One fresh process's measurement: ``{"first": s, "second": s}``."""
    import numpy as np

    import unigrad
    from bench_batched_jacobian import mlp, native, problem

    w1, b1, w2, x = problem()
    if form == "native":
        # native() builds the function and its inputs (the framework's arrays); nothing traced yet
        call, _ = native(name, w1, b1, w2, x)
    else:
        args = [unigrad.asarray(a, backend=name) for a in (w1, b1, w2, x)]
        unigrad.get_backend(name)  # the adapter's import: part of the set-up, like the framework's
        jac = unigrad.batched_jacobian(mlp, argnums=3, backend=name, compile=form.endswith("compiled"))

        def call():
            out = jac(*args)
            if hasattr(out, "block_until_ready"):
                out.block_until_ready()
            return out
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = call()
        np.asarray(unigrad.to_numpy(out) if form != "native" else out)
        times.append(time.perf_counter() - start)
    return {"first": times[0], "second": times[1]}


def run(names, runs=5):
    here = os.path.dirname(os.path.abspath(__file__))
    results = {}
    for name in names:
        got = {form: [] for form in FORMS[name]}
        for _ in range(runs):
            for form in FORMS[name]:
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, form],
                                      capture_output=True, text=True, cwd=here)
                if done.returncode:
                    raise RuntimeError(f"{name} {form}: {done.stderr[-2000:]}")
                got[form].append(json.loads(done.stdout.strip().splitlines()[-1]))
        first = {form: [r["first"] for r in rs] for form, rs in got.items()}
        native_first = statistics.median(first["native"])
        results[name] = {
            form: {"first_median_s": statistics.median(v), "first_min_s": min(v), "first_max_s": max(v),
                   "second_median_s": statistics.median(r["second"] for r in got[form]),
                   "ratio_to_native": statistics.median(v) / native_first}
            for form, v in first.items()}
    return results


def report(results):
    print("first call of batched_jacobian in a fresh process (after imports), MLP 32-64-16, batch 256 "
          "(target unigrad / native <= 1.5)")
    for name, forms in results.items():
        for form, r in forms.items():
            print(f"  {name:10s} {form:17s} first {r['first_median_s'] * 1e3:8.1f} ms "
                  f"(range {r['first_min_s'] * 1e3:.1f}-{r['first_max_s'] * 1e3:.1f})   second "
                  f"{r['second_median_s'] * 1e3:7.2f} ms"
                  + ("" if form == "native" else f"   unigrad / native {r['ratio_to_native']:.2f}"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--backends", default="jax,torch,tensorflow")
    parser.add_argument("--runs", type=int, default=0, help="fresh processes per form (default 5, --quick 2)")
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "FORM"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        print(json.dumps(child(*args.child)))
        return 0
    import unigrad
    available = {n for n, info in unigrad.backends().items() if info["available"]}
    names = [n for n in args.backends.split(",") if n in available and n in FORMS]
    results = run(names, args.runs or (2 if args.quick else 5))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
