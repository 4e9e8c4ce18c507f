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

torch (eager: torch.compile does not pay off there, see the adapter's ``compile``): the per-call
overhead of ``grad`` and of ``hessian_vector_product`` (and the evaluating ``hvp``) against the fastest
native form, on a small problem (``sum(sin(x) * x)``, x of shape (64,), float32: a call of tens of
microseconds, where overhead shows) and a medium one (``mean(tanh(X @ W) ** 2)``, W (64, 64), X (256, 64),
float32, differentiated in W). Native forms:
  grad: torch.autograd.grad on a detached input that requires grad (a user's usual form), and
        torch.func.grad(f)
  hvp:  double backward (torch.autograd.grad with create_graph, then again along v), and
        torch.func.jvp(torch.func.grad(f))
Reported: unigrad / fastest native (per round, the faster of the two), the median and the middle half
of the rounds (target <= 1.2), and each native form's time; and the first call in a fresh process
(``import torch, unigrad`` untimed; then unigrad's first ``grad`` call, against the first call of each
native form, each in its own process).

Run: python benchmarks/bench_calls.py [--quick] [--json] [--backends ...] [--first-calls N]
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


# ---------------------------------------------------------------------------------------------
# torch: eager grad and hvp against the native forms
# ---------------------------------------------------------------------------------------------

def torch_problems():
    """``{name: (f, args, v)}``: f differentiated in its first argument, v a tangent for it."""
    import torch

    rng = np.random.default_rng(0)

    def small(x):
        return torch.sum(torch.sin(x) * x)

    def medium(w, data):
        return torch.mean(torch.tanh(data @ w) ** 2)

    def tensor(*shape):
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))

    return {"small": (small, (tensor(N),), tensor(N)),
            "medium": (medium, (tensor(64, 64) / 8, tensor(256, 64)), tensor(64, 64))}


def torch_forms(f, args, v):
    """``{"grad": {form: fn()}, "hvp": {form: fn()}}``: unigrad's forms first, then the native ones."""
    import torch

    x, rest = args[0], args[1:]

    def autograd_grad():
        xr = x.detach().requires_grad_()
        return torch.autograd.grad(f(xr, *rest), xr)[0]

    def double_backward():
        xr = x.detach().requires_grad_()
        (g,) = torch.autograd.grad(f(xr, *rest), xr, create_graph=True)
        return torch.autograd.grad(g, xr, v)[0]

    func_grad = torch.func.grad(f)
    func_grad_of_x = torch.func.grad(lambda x: f(x, *rest))
    ours_grad = unigrad.grad(f, backend="torch")
    ours_hvp = unigrad.hessian_vector_product(f, backend="torch")
    of_x = (lambda x: f(x, *rest)) if rest else f
    return {"grad": {"unigrad.grad": lambda: ours_grad(*args),
                     "torch.autograd.grad": autograd_grad,
                     "torch.func.grad": lambda: func_grad(*args)},
            "hvp": {"unigrad.hessian_vector_product": lambda: ours_hvp(*args, v),
                    "unigrad.hvp": lambda: unigrad.hvp(of_x, (x,), (v,), backend="torch")[0],
                    "double backward": double_backward,
                    "torch.func.jvp(grad)": lambda: torch.func.jvp(func_grad_of_x, (x,), (v,))[1]}}


def run_torch(quick=False):
    results = {}
    for problem, (f, args, v) in torch_problems().items():
        for kind, forms in torch_forms(f, args, v).items():
            names = list(forms)
            outs = {name: fn() for name, fn in forms.items()}
            want = outs[names[-1]].numpy()
            for name, out in outs.items():  # every form computes the same thing
                np.testing.assert_allclose(out.numpy(), want, rtol=2e-4, atol=1e-6)
            number = max(1, int(2e-3 / min(timed_rounds(list(forms.values()), 20, 1)[0])))  # ~2 ms a form
            rounds = timed_rounds(list(forms.values()), number, 15 if quick else 61)
            natives = [k for k, name in enumerate(names) if not name.startswith("unigrad")]
            for r in rounds:  # a last column: the faster native form of the round
                r.append(min(r[k] for k in natives))
            entry = {"seconds": {name: min(r[k] for r in rounds) for k, name in enumerate(names)}}
            for k, name in enumerate(names):
                if name.startswith("unigrad"):
                    per_round = sorted(r[k] / r[-1] for r in rounds)
                    entry[name] = {"over_fastest_native": ratio(rounds, k, len(names)),
                                   "middle_half": (per_round[len(per_round) // 4],
                                                   per_round[(3 * len(per_round)) // 4])}
            results[f"{kind}_{problem}"] = entry
    return results


def first_call_child(form):
    """One fresh process: the seconds of the first call of ``form`` (torch and unigrad imported before)."""
    import time

    import torch

    x = torch.linspace(-1, 1, N)

    def f(x):
        return torch.sum(torch.sin(x) * x)

    if form == "unigrad.grad":
        call = unigrad.grad(f, backend="torch")
    elif form == "torch.func.grad":
        call = torch.func.grad(f)
    else:
        def call(x):
            xr = x.detach().requires_grad_()
            return torch.autograd.grad(f(xr), xr)[0]
    start = time.perf_counter()
    call(x)
    return time.perf_counter() - start


def first_calls(runs=3):
    """The median over ``runs`` fresh processes of each form's first call (seconds); forms alternate."""
    import statistics
    import subprocess

    forms = ("unigrad.grad", "torch.autograd.grad", "torch.func.grad")
    got = {form: [] for form in forms}
    for _ in range(runs):
        for form in forms:
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--first-call-child", form],
                                  capture_output=True, text=True, check=True,
                                  cwd=os.path.dirname(os.path.abspath(__file__)))
            got[form].append(float(done.stdout.split()[-1]))
    return {form: statistics.median(times) for form, times in got.items()}


def report_torch(r):
    for key, entry in r.items():
        if key == "first_call_s":
            print("  torch: first grad call in a fresh process (median s): " +
                  ", ".join(f"{form} {s * 1e3:.1f} ms" for form, s in entry.items()))
            continue
        natives = ", ".join(f"{name} {s * 1e6:.1f} us" for name, s in entry["seconds"].items()
                            if not name.startswith("unigrad"))
        for name, value in entry.items():
            if name.startswith("unigrad"):
                low, high = value["middle_half"]
                print(f"  torch {key}: {name} / fastest native = {float(value['over_fastest_native']):.2f} "
                      f"(middle half of rounds {low:.2f}-{high:.2f}; target <= 1.2; "
                      f"{entry['seconds'][name] * 1e6:.1f} us; {natives})")


def run(names, quick=False, first_call_runs=0):
    results = {}
    for name in names:
        try:
            if name == "torch":
                results[name] = run_torch(quick)
                if first_call_runs:
                    results[name]["first_call_s"] = first_calls(first_call_runs)
            else:
                results[name] = run_backend(name, quick)
        except ImportError as exc:
            results[name] = {"skipped": str(exc)}
    return results


def report(results):
    for name, r in results.items():
        if "skipped" in r:
            print(f"  {name}: skipped ({r['skipped']})")
            continue
        if name == "torch":
            report_torch(r)
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
    parser.add_argument("--backends", nargs="*", default=["jax", "tensorflow", "torch"])
    parser.add_argument("--first-calls", type=int, default=3, metavar="N",
                        help="torch: fresh processes for the first-call times (0: none)")
    parser.add_argument("--first-call-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_call_child:
        print(first_call_child(args.first_call_child))
        return 0
    names = [n for n in args.backends if unigrad.backends().get(n, {}).get("available")]
    results = run(names, args.quick, args.first_calls)
    if args.json:
        print(json.dumps(results, indent=2, default=float))
    else:
        report(results)


if __name__ == "__main__":
    sys.exit(main())
