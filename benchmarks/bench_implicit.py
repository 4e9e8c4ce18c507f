"""Derivatives of solutions (unigrad.custom_root / custom_fixed_point, issue 39): memory against unrolled
differentiation, time against jaxopt on JAX and torchopt on torch, and the rows those peers cannot produce.

Problems (float64):
  ridge:       the validation loss of ridge regression (200 training rows, 50 features, 100 validation rows),
               differentiated with respect to the regularisation strength through the inner solution; the
               inner solver a dense solve, its optimality condition the inner gradient, the derivative's
               linear solves conjugate gradients (tol 1e-10 on every side).
  fixed point: z = tanh(W z + x), 100 unknowns (|W| = 0.5: a contraction), 60 iterations from 0; the gradient
               of 0.5 |z|^2 with respect to W and x; the derivative's linear solves normal-equation CG
               (the only iterative solver all three have for a non-symmetric system), tol 1e-10.

Sections:
  (a) memory: peak bytes of the gradient of the fixed point's loss, implicit (custom_fixed_point) against
      unrolled (differentiating every iteration), as the iteration count grows -- tracemalloc on the NumPy
      tape; on torch the rise of the peak RSS over one call in a fresh process (after a one-iteration warm-up
      call; it does not see allocations below the pages already touched); the gradient
      with respect to x (a vector: what the unrolled tape keeps per iteration shows, not a W-sized result);
      and the time ratio unrolled / implicit.
  (b) time: unigrad / peer per call (target <= 1.2), each the median of per-round ratios over interleaved
      rounds: on JAX compiled (unigrad's compile=True against jax.jit of jaxopt's implicit_diff) and eager;
      on torch eager (torchopt.diff.implicit.custom_root; torch has no compiled form for either here).
      Every side's gradient is checked against the others' before timing.
  (c) rows the peers cannot produce: forward mode (jacfwd) and the second derivative (hessian) of the
      ridge loss, timed with unigrad and checked against the closed form; each peer is tried on the same
      call and its error recorded (jaxopt's custom_root is a custom_vjp: no forward mode, google/jaxopt#474;
      torchopt's is an autograd.Function without forward mode, metaopt/torchopt#223).

The load average (1 minute) is recorded with each section: the machine may be shared.

Run: python benchmarks/bench_implicit.py [--quick] [--json] [--backends numpy,jax,torch]
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import pathlib
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import unigrad  # noqa: E402
from unigrad import _memory  # noqa: E402
from bench_tape import have, ratio, show, timed_rounds  # noqa: E402

TOL = 1e-10
RIDGE = dict(train=200, valid=100, features=50, lam=0.7)
FIXED = dict(size=100, iterations=60)
MEMORY_ITERATIONS = (10, 30, 100, 300, 1000)
MEMORY_SIZE = {"numpy": 300, "torch": 1000}


def _load():
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------------------------------------
# The problems' data (NumPy float64), and their closed forms
# ---------------------------------------------------------------------------------------------

@functools.cache
def ridge_data(seed=0):
    rng = np.random.default_rng(seed)
    f = RIDGE["features"]
    xt, yt = rng.standard_normal((RIDGE["train"], f)), rng.standard_normal(RIDGE["train"])
    xv, yv = rng.standard_normal((RIDGE["valid"], f)), rng.standard_normal(RIDGE["valid"])
    return xt.T @ xt, xt.T @ yt, xv, yv  # the inner problem needs only X^T X and X^T y


def ridge_closed_form(lam):
    """The validation loss's first and second derivatives in lam."""
    xtx, xty, xv, yv = ridge_data()
    a = xtx + lam * np.eye(len(xty))
    w = np.linalg.solve(a, xty)
    dw = -np.linalg.solve(a, w)
    d2w = -2 * np.linalg.solve(a, dw)
    r = xv @ w - yv
    return r @ (xv @ dw), (xv @ dw) @ (xv @ dw) + r @ (xv @ d2w)


@functools.cache
def fixed_data(size, seed=1):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((size, size))
    return 0.5 * w / np.linalg.norm(w, 2), rng.standard_normal(size)


# ---------------------------------------------------------------------------------------------
# unigrad: written once with the array namespace; the constants are the backend's arrays
# ---------------------------------------------------------------------------------------------

def unigrad_ridge(xtx, xty, xv, yv):
    """The ridge validation loss of lam, by custom_root (the constants: arrays of one backend)."""
    def optimality(w, lam):
        return xtx @ w - xty + lam * w

    @unigrad.custom_root(optimality, solve="cg", symmetric=True, linear_tol=TOL)
    def fit(init, lam):
        xp = unigrad.namespace(lam, xtx)
        a = xtx + lam * xp.eye(xtx.shape[0], dtype=xtx.dtype)
        return xp.linalg.solve(a, xty[:, None])[:, 0]

    def loss(lam):
        xp = unigrad.namespace(lam, xtx)
        r = xv @ fit(None, lam) - yv
        return 0.5 * xp.sum(r * r)

    return loss


def _tanh_map(z, w, x):
    return unigrad.namespace(z, w).tanh(w @ z + x)


def _iterate(init, w, x, iterations):
    z = init
    for _ in range(iterations):
        z = _tanh_map(z, w, x)
    return z


def unigrad_fixed(iterations, implicit=True):
    """0.5 |z|^2 of the fixed point z = tanh(W z + x) (implicit) or of its unrolled iterations."""
    solver = functools.partial(_iterate, iterations=iterations)
    if implicit:
        solver = unigrad.custom_fixed_point(_tanh_map, solve="normal_cg", linear_tol=TOL)(solver)

    def loss(w, x):
        xp = unigrad.namespace(w, x)
        z = solver(xp.zeros(x.shape, dtype=x.dtype), w, x)
        return 0.5 * xp.sum(z * z)

    return loss


# ---------------------------------------------------------------------------------------------
# The peers, the same problems in their own arrays
# ---------------------------------------------------------------------------------------------

def jaxopt_ridge(xtx, xty, xv, yv):
    import jax.numpy as jnp
    from jaxopt import implicit_diff, linear_solve

    def optimality(w, lam):
        return xtx @ w - xty + lam * w

    @implicit_diff.custom_root(optimality, solve=functools.partial(linear_solve.solve_cg, tol=TOL))
    def fit(init, lam):
        return jnp.linalg.solve(xtx + lam * jnp.eye(xtx.shape[0]), xty)

    def loss(lam):
        r = xv @ fit(None, lam) - yv
        return 0.5 * jnp.sum(r * r)

    return loss


def jaxopt_fixed(iterations):
    import jax.numpy as jnp
    from jaxopt import implicit_diff, linear_solve

    def tanh_map(z, w, x):
        return jnp.tanh(w @ z + x)

    @implicit_diff.custom_fixed_point(tanh_map, solve=functools.partial(linear_solve.solve_normal_cg, tol=TOL))
    def solver(init, w, x):
        z = init
        for _ in range(iterations):
            z = tanh_map(z, w, x)
        return z

    def loss(w, x):
        z = solver(jnp.zeros_like(x), w, x)
        return 0.5 * jnp.sum(z * z)

    return loss


def torchopt_ridge(xtx, xty, xv, yv):
    import torch
    from torchopt.diff.implicit import custom_root
    from torchopt.linear_solve import solve_cg

    def optimality(w, lam):
        return xtx @ w - xty + lam * w

    @custom_root(optimality, argnums=1, solve=solve_cg(rtol=TOL))
    def fit(init, lam):
        with torch.no_grad():
            return torch.linalg.solve(xtx + lam * torch.eye(xtx.shape[0], dtype=xtx.dtype), xty)

    def loss(lam):
        r = xv @ fit(torch.zeros_like(xty), lam) - yv
        return 0.5 * torch.sum(r * r)

    return loss


def torchopt_fixed(iterations):
    import torch
    from torchopt.diff.implicit import custom_root
    from torchopt.linear_solve import solve_normal_cg

    def residual(z, w, x):
        return torch.tanh(w @ z + x) - z

    @custom_root(residual, argnums=(1, 2), solve=solve_normal_cg(rtol=TOL))
    def solver(init, w, x):
        with torch.no_grad():
            z = init
            for _ in range(iterations):
                z = torch.tanh(w @ z + x)
            return z

    def loss(w, x):
        z = solver(torch.zeros_like(x), w, x)
        return 0.5 * torch.sum(z * z)

    return loss


# ---------------------------------------------------------------------------------------------
# (a) memory and time, implicit against unrolled
# ---------------------------------------------------------------------------------------------

def torch_peak_child(iterations, implicit):
    """In a fresh process: the rise of the peak RSS (VmHWM, reset before the call) over one gradient call on
    torch, after warm-up calls of both forms on a 10-unknown problem (torch.func's and the rules' one-time
    allocations made, kernels loaded). A fresh process per measurement: memory a bigger call freed stays in
    the process's heap, and a later call that reuses it does not move the peak RSS."""
    b = unigrad.get_backend("torch")
    small = [b.asarray(a) for a in fixed_data(10)]
    for form in (True, False):  # the first use of torch.func and of the rules allocates about 90 MiB, once
        unigrad.grad(unigrad_fixed(60, form), argnums=1, backend="torch")(*small)
    w, x = (b.asarray(a) for a in fixed_data(MEMORY_SIZE["torch"]))
    gc.collect()
    reset, read = _memory._rss_peak_counter()  # VmHWM, reset through /proc/self/clear_refs
    reset()
    before = read()
    unigrad.grad(unigrad_fixed(iterations, implicit), argnums=1, backend="torch")(w, x)
    return read() - before


def _torch_peak(iterations, implicit):
    import json
    import subprocess

    out = subprocess.run([sys.executable, "-W", "ignore", __file__, "--torch-memory-child",
                          f"{iterations},{int(implicit)}"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def memory(backends, quick=False):
    results = {}
    for backend in [b for b in backends if b in MEMORY_SIZE]:
        b = unigrad.get_backend(backend)
        size = MEMORY_SIZE[backend]
        w, x = (b.asarray(a) for a in fixed_data(size))
        rows = results[backend] = {"size": size, "load_average": _load(), "iterations": {}}
        for iterations in (MEMORY_ITERATIONS[::2] if quick else MEMORY_ITERATIONS):
            fns = []
            for implicit in (True, False):
                g = unigrad.grad(unigrad_fixed(iterations, implicit), argnums=1, backend=backend)
                fns.append(functools.partial(g, w, x))
            implicit_g, unrolled_g = (fn() for fn in fns)
            if iterations >= 30:  # converged (a contraction by 0.5 or less): the same gradient both ways
                np.testing.assert_allclose(unigrad.to_numpy(implicit_g), unigrad.to_numpy(unrolled_g), rtol=1e-6,
                                           atol=1e-9)
            if backend == "torch":
                peaks = [_torch_peak(iterations, implicit) for implicit in (True, False)]
            else:
                peaks = []
                for fn in fns:
                    gc.collect()
                    peaks.append(_memory.peak_bytes(b, fn))
            rounds = timed_rounds(fns, 1, 3 if quick else 7)
            rows["iterations"][str(iterations)] = {
                "implicit_peak_bytes": peaks[0], "unrolled_peak_bytes": peaks[1],
                "implicit_seconds": min(r[0] for r in rounds), "unrolled_seconds": min(r[1] for r in rounds),
                "unrolled_over_implicit_time": ratio(rounds, 1, 0)}
            print(f"  done: memory {backend} {iterations} iterations", file=sys.stderr, flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# (b) time against the peers
# ---------------------------------------------------------------------------------------------

def _block(value):
    for leaf in (value if isinstance(value, (tuple, list)) else (value,)):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
    return value


def _close(name, got, want, rtol=1e-7):
    got = [np.asarray(unigrad.to_numpy(g) if not hasattr(g, "detach") else g.detach().numpy()) for g in got]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-10, err_msg=name)


def _jax_sides(problem, compiled):
    """(unigrad call, jaxopt call, the unigrad gradient as NumPy)."""
    import jax
    import jax.numpy as jnp

    x64 = jax.enable_x64(True)
    with x64:
        if problem == "ridge":
            consts = [jnp.asarray(a) for a in ridge_data()]
            args = (jnp.asarray(RIDGE["lam"]),)
            ours, theirs, argnums = unigrad_ridge(*consts), jaxopt_ridge(*consts), 0
        else:
            args = tuple(jnp.asarray(a) for a in fixed_data(FIXED["size"]))
            ours, theirs, argnums = unigrad_fixed(FIXED["iterations"]), jaxopt_fixed(FIXED["iterations"]), (0, 1)
        peer = jax.grad(theirs, argnums=argnums)
        peer = jax.jit(peer) if compiled else peer
    mine = unigrad.grad(ours, argnums=argnums, backend="jax", compile=compiled)

    def unigrad_call():
        return _block(mine(*args))

    def peer_call():
        with jax.enable_x64(True):
            return _block(peer(*args))

    return unigrad_call, peer_call


def _torch_sides(problem):
    import torch

    if problem == "ridge":
        consts = [torch.as_tensor(a) for a in ridge_data()]
        args = (torch.tensor(RIDGE["lam"], dtype=torch.float64),)
        ours, theirs, argnums = unigrad_ridge(*consts), torchopt_ridge(*consts), 0
    else:
        args = tuple(torch.as_tensor(a) for a in fixed_data(FIXED["size"]))
        ours, theirs, argnums = unigrad_fixed(FIXED["iterations"]), torchopt_fixed(FIXED["iterations"]), (0, 1)
    mine = unigrad.grad(ours, argnums=argnums, backend="torch")

    def unigrad_call():
        return mine(*args)

    def peer_call():
        leaves = [a.detach().requires_grad_(True) for a in args]
        return torch.autograd.grad(theirs(*leaves), leaves)

    return unigrad_call, peer_call


def _as_list(g):
    return list(g) if isinstance(g, (tuple, list)) else [g]


def peers(backends, quick=False):
    results = {}
    cases = []
    if "jax" in backends and have("jaxopt"):
        cases += [("jax", "jaxopt", problem, compiled) for problem in ("ridge", "fixed_point")
                  for compiled in (True, False)]
    if "torch" in backends and have("torchopt"):
        cases += [("torch", "torchopt", problem, False) for problem in ("ridge", "fixed_point")]
    for backend, peer, problem, compiled in cases:
        if backend == "jax":
            ours, theirs = _jax_sides(problem, compiled)
        else:
            ours, theirs = _torch_sides(problem)
        mine, other = _as_list(ours()), _as_list(theirs())  # first calls: tracing, compiling
        other = [np.asarray(unigrad.to_numpy(g) if not hasattr(g, "detach") else g.detach().numpy()) for g in other]
        _close(f"{backend} {problem}: unigrad against {peer}", mine, other)
        if problem == "ridge":
            _close(f"{backend} ridge: against the closed form", mine, [ridge_closed_form(RIDGE["lam"])[0]])
        number, repeat = (3, 5) if quick else (10, 15)
        if backend == "jax" and not compiled:
            number = 2 if quick else 3
        load = _load()
        rounds = timed_rounds([ours, theirs], number, repeat)
        key = f"{problem}_{backend}{'_compiled' if compiled else '_eager'}"
        results[key] = {"peer": peer, "unigrad_seconds": min(r[0] for r in rounds),
                        "peer_seconds": min(r[1] for r in rounds), "ratio": ratio(rounds, 0, 1),
                        "load_average": [load, _load()]}
        print(f"  done: {key}", file=sys.stderr, flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# (c) forward mode and second order: unigrad timed and checked, the peers tried
# ---------------------------------------------------------------------------------------------

def _first_line(error):
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}" if str(error).strip() else \
        type(error).__name__


def _try(fn):
    """The peer's attempt: 'works' with its value, or the error's first line."""
    try:
        return "works", fn()
    except Exception as error:  # the record of what the peer cannot do
        return _first_line(error), None


def beyond(backends, quick=False):
    results = {}
    first, second = ridge_closed_form(RIDGE["lam"])
    for backend in [b for b in backends if b in ("jax", "torch", "numpy")]:
        b = unigrad.get_backend(backend)
        if backend == "jax":
            import jax
            import jax.numpy as jnp

            with jax.enable_x64(True):
                consts = [jnp.asarray(a) for a in ridge_data()]
                lam = jnp.asarray(RIDGE["lam"])
        else:
            consts = [b.asarray(a) for a in ridge_data()]
            lam = b.asarray(np.asarray(RIDGE["lam"]))
        loss = unigrad_ridge(*consts)
        rows = results[backend] = {"load_average": _load()}
        forms = [("jacfwd", unigrad.jacfwd(loss, backend=backend), first),
                 ("hessian", unigrad.hessian(loss, backend=backend), second)]
        if backend == "jax":
            forms += [("jacfwd_compiled", unigrad.jacfwd(loss, backend=backend, compile=True), first),
                      ("hessian_compiled", unigrad.hessian(loss, backend=backend, compile=True), second)]
        for name, fn, want in forms:
            got = float(np.asarray(unigrad.to_numpy(fn(lam))))
            np.testing.assert_allclose(got, want, rtol=1e-8, err_msg=f"{backend} {name}")
            rounds = timed_rounds([lambda: _block(fn(lam))], 2 if quick else 5, 3 if quick else 7)
            rows[name] = {"seconds": min(r[0] for r in rounds), "value": got, "closed_form": want}
        if backend == "jax" and have("jaxopt"):
            theirs = jaxopt_ridge(*consts)

            def attempt(transform):
                with jax.enable_x64(True):
                    return float(transform(theirs)(lam))

            rows["jacfwd"]["jaxopt"] = _try(lambda: attempt(jax.jacfwd))[0]
            rows["hessian"]["jaxopt"] = _try(lambda: attempt(jax.hessian))[0]
        if backend == "torch" and have("torchopt"):
            import torch

            theirs = torchopt_ridge(*consts)
            rows["jacfwd"]["torchopt"] = _try(lambda: float(torch.func.jacfwd(theirs)(lam)))[0]
            rows["hessian"]["torchopt"] = _try(lambda: float(torch.func.hessian(theirs)(lam)))[0]

            def double_backward():  # reverse over reverse, the form torch.autograd offers
                leaf = lam.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(theirs(leaf), leaf, create_graph=True)
                (h,) = torch.autograd.grad(g, leaf)
                return float(h)

            status, value = _try(double_backward)
            rows["hessian"]["torchopt_double_backward"] = (
                status if value is None else f"runs: {value:.6g} against the closed form {second:.6g}")
        print(f"  done: forward and second order on {backend}", file=sys.stderr, flush=True)
    return results


# ---------------------------------------------------------------------------------------------

def run(backends, quick=False, sections=("memory", "peers", "beyond")):
    results = {"load_average_start": _load()}
    if "memory" in sections:
        results["memory"] = memory(backends, quick)
    if "peers" in sections:
        results["peers"] = peers(backends, quick)
    if "beyond" in sections:
        results["beyond"] = beyond(backends, quick)
    results["load_average_end"] = _load()
    return results


def report(results):
    print(f"load average (1 min) at the start {results['load_average_start']}, at the end "
          f"{results['load_average_end']}")
    for backend, rows in results.get("memory", {}).items():
        print(f"(a) memory, fixed point of tanh(W z + x), {rows['size']} unknowns, gradient in x on "
              f"{backend} (load {rows['load_average']}; {'tracemalloc' if backend == 'numpy' else 'peak RSS rise'})")
        for k, row in rows["iterations"].items():
            print(f"    {k:>5} iterations: implicit {row['implicit_peak_bytes'] / 2**20:8.2f} MiB "
                  f"{row['implicit_seconds'] * 1e3:8.1f} ms   unrolled {row['unrolled_peak_bytes'] / 2**20:8.2f} MiB "
                  f"{row['unrolled_seconds'] * 1e3:8.1f} ms   time unrolled / implicit "
                  f"{row['unrolled_over_implicit_time']:.2f}")
    if results.get("peers"):
        print("(b) time, unigrad / peer (median of per-round ratios; target <= 1.2)")
        for key, row in results["peers"].items():
            print(f"    {key:<26} unigrad {row['unigrad_seconds'] * 1e3:8.2f} ms  {row['peer']} "
                  f"{row['peer_seconds'] * 1e3:8.2f} ms  ratio {row['ratio']:.2f}  (load {row['load_average']})")
    for backend, rows in results.get("beyond", {}).items():
        print(f"(c) ridge loss, forward mode and second derivative on {backend} (load {rows['load_average']})")
        for name in [k for k in rows if k != "load_average"]:
            row = rows[name]
            peers_said = "; ".join(f"{k}: {v}" for k, v in row.items() if k.startswith(("jaxopt", "torchopt")))
            print(f"    {name:<16} unigrad {row['seconds'] * 1e3:8.2f} ms (closed form to 1e-8)"
                  + (f"  | {peers_said}" if peers_said else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--backends", default="numpy,jax,torch")
    parser.add_argument("--sections", default="memory,peers,beyond")
    parser.add_argument("--torch-memory-child", help=argparse.SUPPRESS)  # ITERATIONS,IMPLICIT: one measurement
    args = parser.parse_args(argv)
    if args.torch_memory_child:
        iterations, implicit = (int(v) for v in args.torch_memory_child.split(","))
        print(torch_peak_child(iterations, bool(implicit)))
        return
    available = {n for n, i in unigrad.backends().items() if i["available"]}
    backends = [b for b in args.backends.split(",") if b in available]
    start = time.perf_counter()
    results = run(backends, args.quick, tuple(args.sections.split(",")))
    results["seconds"] = time.perf_counter() - start
    show(results, args.json, report)


if __name__ == "__main__":
    main()
