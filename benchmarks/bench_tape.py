"""The NumPy tape against a hand-written NumPy backprop and HIPS autograd, in one process.

Reports ratios (not absolute times; each the median over interleaved rounds of the per-round ratio,
absolute times the best round):
  * gradient of an MLP loss (784-256-256-10, tanh, softmax cross-entropy, batch 128, float64):
    unigrad.grad / hand-written forward+backprop   (target <= 1.10)
    autograd.grad / hand-written forward+backprop  (for reference)
    unigrad.grad / forward alone
  * a tiny vjp (x of shape (3,), sum(sin(x)**2)): unigrad / autograd   (target <= 0.5), with a 0-d
    array as the cotangent and with a Python float (as autograd's vjp is called), and the same
    function's grad made once and called many times (target <= 0.5)
  * per-example Jacobian d y_b / d x_b of y = tanh(tanh(x @ w1 + b1) @ w2), MLP 32-64-16, B = 256,
    float32: unigrad.batched_jacobian on the tape / a hand-written vectorised NumPy Jacobian
    (target <= 2), measured after the other work (warm) and, with --fresh N, as the first work of N
    fresh processes (``--batched-only``: only this comparison, run first), and while two other
    processes keep the cores busy (hand / tape, target >= 0.3: the tape's small products run on one
    BLAS thread)

Run: python benchmarks/bench_tape.py [--quick] [--json] [--fresh N] [--batched-only] [--tiny-only]
(``--tiny-only``: only the tiny vjp and grad, for runs in several fresh processes)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit

import numpy as np

import unigrad


def timed_rounds(fns, number, repeat):
    """``repeat`` rounds; in each, the mean seconds per call of every function over ``number`` calls.
    The functions' runs are interleaved, so a slow spell of a shared machine hits all of them alike."""
    return [[timeit.timeit(fn, number=number) / number for fn in fns] for _ in range(repeat)]


def have(module):
    """Whether ``module`` imports (a peer a benchmark compares with, skipped when absent)."""
    try:
        __import__(module)
        return True
    except Exception:
        return False


def ratio(rounds, i, j):
    """Time of function i over time of function j: the median of the per-round ratios. A round's two
    runs are adjacent in time, so a machine whose speed drifts from round to round (shared cores)
    moves both alike; the median ignores the rounds a spike hit one side of."""
    return statistics.median(r[i] / r[j] for r in rounds)


def mlp_problem(seed=0, batch=128, sizes=(784, 256, 256, 10)):
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        params.append(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in))
        params.append(np.zeros(n_out))
    x = rng.standard_normal((batch, sizes[0]))
    onehot = np.eye(sizes[-1])[rng.integers(sizes[-1], size=batch)]
    return params, x, onehot


def mlp_loss(params, x, onehot):
    """Portable: runs on the tape (and on every backend) through the Array API namespace."""
    xp = unigrad.namespace(x, *params)
    h = x
    for k in range(0, len(params) - 2, 2):
        h = xp.tanh(h @ params[k] + params[k + 1])
    logits = h @ params[-2] + params[-1]
    shifted = logits - xp.logsumexp(logits, axis=1, keepdims=True)
    return -xp.sum(onehot * shifted) / x.shape[0]


def mlp_loss_autograd(params, x, onehot):
    import autograd.numpy as anp
    from autograd.scipy.special import logsumexp

    h = x
    for k in range(0, len(params) - 2, 2):
        h = anp.tanh(h @ params[k] + params[k + 1])
    logits = h @ params[-2] + params[-1]
    shifted = logits - logsumexp(logits, axis=1, keepdims=True)
    return -anp.sum(onehot * shifted) / x.shape[0]


def mlp_forward_numpy(params, x, onehot):
    h = x
    for k in range(0, len(params) - 2, 2):
        h = np.tanh(h @ params[k] + params[k + 1])
    logits = h @ params[-2] + params[-1]
    m = logits.max(axis=1, keepdims=True)
    shifted = logits - (np.log(np.exp(logits - m).sum(axis=1, keepdims=True)) + m)
    return -np.sum(onehot * shifted) / x.shape[0]


def mlp_backprop_numpy(params, x, onehot):
    """Hand-written forward and backward pass: the floor any tape is measured against."""
    hs = [x]
    h = x
    for k in range(0, len(params) - 2, 2):
        h = np.tanh(h @ params[k] + params[k + 1])
        hs.append(h)
    logits = h @ params[-2] + params[-1]
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=1, keepdims=True)
    shifted = logits - (np.log(s) + m)
    loss = -np.sum(onehot * shifted) / x.shape[0]
    d = (e / s * onehot.sum(axis=1, keepdims=True) - onehot) / x.shape[0]
    grads = [None] * len(params)
    for k in range(len(params) - 2, -1, -2):
        grads[k] = hs[k // 2].T @ d
        grads[k + 1] = d.sum(axis=0)
        if k:
            d = (d @ params[k].T) * (1 - hs[k // 2] ** 2)
    return loss, grads


def tiny(x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x) ** 2)


def batched_problem(seed=0, batch=256, sizes=(32, 64, 16)):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal(sizes[:2]) / np.sqrt(sizes[0])).astype(np.float32)
    b1 = (rng.standard_normal(sizes[1]) / 4).astype(np.float32)
    w2 = (rng.standard_normal(sizes[1:]) / np.sqrt(sizes[1])).astype(np.float32)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    return w1, b1, w2, x


def batched_mlp(w1, b1, w2, x):
    xp = unigrad.namespace(x, w1)
    return xp.tanh(xp.tanh(x @ w1 + b1) @ w2)


def batched_jacobian_numpy(w1, b1, w2, x):
    """d y_b / d x_b for every example b, by hand: diag(1 - y_b^2) w2^T diag(1 - h_b^2) w1^T, vectorised
    over the batch: (B, 16, 32)."""
    h = np.tanh(x @ w1 + b1)  # (B, 64)
    y = np.tanh(h @ w2)  # (B, 16)
    m = w2.T[None, :, :] * (1 - h * h)[:, None, :]  # (B, 16, 64)
    return (1 - y * y)[:, :, None] * (m @ w1.T)  # (B, 16, 32)


def run_batched(number=20, repeat=15):
    """Tape batched_jacobian (w.r.t. x) against the hand-written one: (seconds, ratio rounds)."""
    w1, b1, w2, x = batched_problem()
    jac = unigrad.batched_jacobian(batched_mlp, argnums=3, check_independence="never")
    np.testing.assert_allclose(jac(w1, b1, w2, x), batched_jacobian_numpy(w1, b1, w2, x), rtol=2e-5, atol=1e-6)
    rounds = timed_rounds([lambda: batched_jacobian_numpy(w1, b1, w2, x), lambda: jac(w1, b1, w2, x)],
                          number, repeat)
    t_hand, t_ug = (min(col) for col in zip(*rounds))
    return {"hand": t_hand, "unigrad": t_ug, "ratio": ratio(rounds, 1, 0),
            "first_round": {"hand": rounds[0][0], "unigrad": rounds[0][1]}}


def run_loaded(seconds=20.0, number=10, repeat=9):
    """The batched comparison while two other processes keep the cores busy (a shared machine):
    ``run_batched``'s result plus ``hand_over_tape`` (target >= 0.3). The busy processes stop by
    themselves after ``seconds`` and are ended here as soon as the comparison is done."""
    import subprocess
    busy = [subprocess.Popen([sys.executable, "-c", f"import time\nend = time.time() + {seconds}\n"
                              "while time.time() < end: pass"]) for _ in range(2)]
    try:
        result = run_batched(number, repeat)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    result["hand_over_tape"] = 1.0 / result["ratio"]
    return result


def run_fresh(n):
    """``--batched-only`` in ``n`` fresh processes: the comparison as each process's first work."""
    import subprocess
    out = []
    for _ in range(n):
        done = subprocess.run([sys.executable, __file__, "--batched-only", "--json"], capture_output=True,
                              text=True, check=True)
        out.append(json.loads(done.stdout))
    return out


def run(quick=False):
    import autograd

    number, repeat = (5, 3) if quick else (10, 15)
    params, x, onehot = mlp_problem()
    # Correctness first: a benchmark of wrong answers is worthless.
    g_ref = mlp_backprop_numpy(params, x, onehot)[1]
    g_ug = unigrad.grad(mlp_loss)(params, x, onehot)
    for a, b in zip(g_ug, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)

    grad_ug = unigrad.grad(mlp_loss)
    grad_ag = autograd.grad(mlp_loss_autograd)
    mlp_rounds = timed_rounds([lambda: mlp_backprop_numpy(params, x, onehot),
                               lambda: mlp_forward_numpy(params, x, onehot),
                               lambda: grad_ug(params, x, onehot),
                               lambda: grad_ag(params, x, onehot)], number, repeat)
    t_hand, t_fwd, t_ug, t_ag = (min(col) for col in zip(*mlp_rounds))

    result = {
        "mlp_grad_seconds": {"hand_backprop": t_hand, "forward_only": t_fwd, "unigrad": t_ug, "autograd": t_ag},
        "mlp_ratio_unigrad_vs_hand": ratio(mlp_rounds, 2, 0),
        "mlp_ratio_autograd_vs_hand": ratio(mlp_rounds, 3, 0),
        "mlp_ratio_unigrad_vs_forward": ratio(mlp_rounds, 2, 1),
        "mlp_ratio_unigrad_vs_autograd": ratio(mlp_rounds, 2, 3),
    }
    result.update(run_tiny(quick))
    batched = run_batched(*((10, 5) if quick else (20, 15)))
    loaded = run_loaded(number=5 if quick else 10, repeat=5 if quick else 9)
    result.update({
        "batched_jacobian": batched,
        "batched_jacobian_loaded": loaded,
        "targets": {"mlp_ratio_unigrad_vs_hand": 1.10, "tiny_ratio_unigrad_vs_autograd": 0.5,
                    "tiny_float_ratio_unigrad_vs_autograd": 0.5,
                    "tiny_grad_ratio_unigrad_vs_autograd": 0.5,
                    "batched_jacobian_ratio": 2.0, "batched_jacobian_loaded_hand_over_tape": 0.3,
                    "batched_jacobian_fresh_hand_over_tape": 0.5},
    })
    return result


def run_tiny(quick=False):
    """The tiny vjp and the tiny grad made once, unigrad against HIPS autograd, interleaved."""
    import autograd
    import autograd.numpy as anp

    xs = np.array([0.1, 0.2, 0.3])
    ones = np.ones(())

    def ug_vjp():
        out, fn = unigrad.vjp(tiny, xs)
        return fn(ones)

    def ug_vjp_float():
        out, fn = unigrad.vjp(tiny, xs)
        return fn(1.0)

    ag_vjp_maker = autograd.make_vjp(lambda x: anp.sum(anp.sin(x) ** 2))

    def ag_vjp():
        fn, out = ag_vjp_maker(xs)
        return fn(1.0)

    np.testing.assert_allclose(ug_vjp()[0], ag_vjp(), rtol=1e-12)
    np.testing.assert_allclose(ug_vjp_float()[0], ag_vjp(), rtol=1e-12)
    ug_grad = unigrad.grad(tiny)  # made once, called many times
    ag_grad = autograd.grad(lambda x: anp.sum(anp.sin(x) ** 2))
    np.testing.assert_allclose(ug_grad(xs), ag_grad(xs), rtol=1e-12)
    tn, tr = (200, 3) if quick else (1000, 30)
    tiny_rounds = timed_rounds([ug_vjp, ag_vjp, lambda: ug_grad(xs), lambda: ag_grad(xs), ug_vjp_float], tn, tr)
    t_tiny_ug, t_tiny_ag, t_grad_ug, t_grad_ag, t_float_ug = (min(col) for col in zip(*tiny_rounds))
    return {
        "tiny_vjp_seconds": {"unigrad": t_tiny_ug, "autograd": t_tiny_ag},
        "tiny_ratio_unigrad_vs_autograd": ratio(tiny_rounds, 0, 1),
        "tiny_float_vjp_seconds": {"unigrad": t_float_ug, "autograd": t_tiny_ag},
        "tiny_float_ratio_unigrad_vs_autograd": ratio(tiny_rounds, 4, 1),
        "tiny_grad_seconds": {"unigrad": t_grad_ug, "autograd": t_grad_ag},
        "tiny_grad_ratio_unigrad_vs_autograd": ratio(tiny_rounds, 2, 3),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (noisier)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--fresh", type=int, default=0, metavar="N",
                        help="also run the batched_jacobian comparison as the first work of N fresh processes")
    parser.add_argument("--batched-only", action="store_true",
                        help="only the batched_jacobian comparison, as this process's first work")
    parser.add_argument("--tiny-only", action="store_true",
                        help="only the tiny vjp and grad against HIPS autograd")
    args = parser.parse_args(argv)
    if args.batched_only:
        show(run_batched(*((10, 5) if args.quick else (20, 15))), args.json, report_batched)
        return 0
    if args.tiny_only:
        show(run_tiny(args.quick), args.json, report_tiny)
        return 0
    results = run(args.quick)
    if args.fresh:
        results["batched_jacobian_fresh"] = run_fresh(args.fresh)
    show(results, args.json, report)
    return 0


def show(results, as_json, report_fn):
    """Print ``results`` as JSON, or as ``report_fn`` words them."""
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        report_fn(results)


def report(r):
    s = r["mlp_grad_seconds"]
    print("MLP 784-256-256-10, batch 128, float64 (gradient of the loss)")
    print(f"  hand-written backprop {s['hand_backprop'] * 1e3:8.2f} ms   forward alone {s['forward_only'] * 1e3:.2f} ms")
    print(f"  unigrad tape          {s['unigrad'] * 1e3:8.2f} ms   {r['mlp_ratio_unigrad_vs_hand']:.2f}x hand "
          f"(target <= 1.10), {r['mlp_ratio_unigrad_vs_forward']:.1f}x forward")
    print(f"  HIPS autograd         {s['autograd'] * 1e3:8.2f} ms   {r['mlp_ratio_autograd_vs_hand']:.2f}x hand")
    report_tiny(r)
    print("per-example Jacobian, MLP 32-64-16, B = 256, float32 (tape batched_jacobian / hand-written NumPy)")
    report_batched(r["batched_jacobian"], "after other work")
    if "batched_jacobian_loaded" in r:
        report_batched(r["batched_jacobian_loaded"], "two other busy processes")
        print(f"    hand / tape under load {r['batched_jacobian_loaded']['hand_over_tape']:.2f} (target >= 0.3)")
    fresh = r.get("batched_jacobian_fresh")
    if fresh:
        ratios = [f["ratio"] for f in fresh]
        times = [f["unigrad"] * 1e3 for f in fresh]
        firsts = [f["first_round"]["unigrad"] / f["first_round"]["hand"] for f in fresh]
        print(f"  first work of {len(fresh)} fresh processes: unigrad {min(times):.3f}-{max(times):.3f} ms, "
              f"ratio {min(ratios):.2f}-{max(ratios):.2f} (target <= 2); first round alone "
              f"{min(firsts):.2f}-{max(firsts):.2f}; hand / tape {1 / max(ratios):.2f}-{1 / min(ratios):.2f} "
              f"(target >= 0.5)")


def report_tiny(r):
    t = r["tiny_vjp_seconds"]
    print("tiny vjp: x of shape (3,), sum(sin(x)**2)")
    print(f"  unigrad {t['unigrad'] * 1e6:6.1f} us   autograd {t['autograd'] * 1e6:6.1f} us   "
          f"ratio {r['tiny_ratio_unigrad_vs_autograd']:.2f} (target <= 0.5)")
    if "tiny_float_vjp_seconds" in r:
        t = r["tiny_float_vjp_seconds"]
        print("tiny vjp, the cotangent a Python float (vjp_fn(1.0), as autograd's is called)")
        print(f"  unigrad {t['unigrad'] * 1e6:6.1f} us   autograd {t['autograd'] * 1e6:6.1f} us   "
              f"ratio {r['tiny_float_ratio_unigrad_vs_autograd']:.2f} (target <= 0.5)")
    if "tiny_grad_seconds" in r:
        t = r["tiny_grad_seconds"]
        print("tiny grad made once, called many times")
        print(f"  unigrad {t['unigrad'] * 1e6:6.1f} us   autograd {t['autograd'] * 1e6:6.1f} us   "
              f"ratio {r['tiny_grad_ratio_unigrad_vs_autograd']:.2f} (target <= 0.5)")


def report_batched(b, when="first work of this process"):
    first = b["first_round"]
    print(f"  {when}: hand {b['hand'] * 1e3:.3f} ms   unigrad {b['unigrad'] * 1e3:.3f} ms   "
          f"ratio {b['ratio']:.2f} (target <= 2); first round alone {first['unigrad'] / first['hand']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
