"""Per-example gradient norms (differential privacy's clipping step) against torch.func and peers.

The problem: an MLP 784-256-10 (tanh, softmax cross-entropy), float32, batch 128; the result is each
example's gradient norm over all parameters. Reported as ratios to ``torch.func``'s
``vmap(grad(loss))`` followed by the norms, measured in the same run (median of per-round ratios):
  * unigrad.per_example_grad_norms on the NumPy tape (dense layers found in the recorded program:
    norms from one backward pass)                                                  (goal <= 0.2)
  * unigrad.per_example_grad_norms on torch (the ATen operations of one forward pass read by the
    dependence analysis: norms from one backward pass)                             (goal <= 0.2)
    and on JAX (compile=True, the jaxpr read the same way)
  * Opacus (GradSampleModule, hooks) and BackPACK (BatchL2Grad), when installed (``pip install
    unigrad[bench]``); skipped when absent.
  * TensorFlow, when installed: unigrad.per_example_grad_norms on TensorFlow (eager calls: one
    tf.function per signature, the graph read by the dependence analysis: norms from one backward
    pass) against TensorFlow's own per-example form, a tf.function of ``tf.vectorized_map`` over
    per-example GradientTape gradients, then the norms; reported as their own ratio (median of the
    per-round ratios, with the lowest and highest round).

Every contestant's norms are checked against torch.func's before timing. torch runs with one thread
here (restored afterwards): on a loaded machine its spinning worker threads distort the ratios.

Run: python benchmarks/bench_per_example.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit

import numpy as np

import unigrad

SIZES = (784, 256, 10)
BATCH = 128


def timed_rounds(fns, number, repeat):
    """``repeat`` rounds of interleaved runs; in each, the mean seconds per call of every function."""
    return [[timeit.timeit(fn, number=number) / number for fn in fns] for _ in range(repeat)]


def ratio(rounds, i, j):
    """Time of function i over time of function j: the median of the per-round ratios."""
    return statistics.median(r[i] / r[j] for r in rounds)


def problem(seed=0):
    rng = np.random.default_rng(seed)
    (n_in, n_hidden, n_out) = SIZES
    params = {"W1": (rng.standard_normal((n_in, n_hidden)) / np.sqrt(n_in)).astype(np.float32),
              "b1": np.zeros(n_hidden, np.float32),
              "W2": (rng.standard_normal((n_hidden, n_out)) / np.sqrt(n_hidden)).astype(np.float32),
              "b2": np.zeros(n_out, np.float32)}
    x = rng.standard_normal((BATCH, n_in)).astype(np.float32)
    labels = rng.integers(n_out, size=BATCH)
    return params, x, labels


def losses(params, x, labels):
    """Portable per-example cross-entropy losses, shape (B,)."""
    xp = unigrad.namespace(x, params["W1"])
    h = xp.tanh(x @ params["W1"] + params["b1"])
    z = h @ params["W2"] + params["b2"]
    top = xp.max(z, axis=-1, keepdims=True)
    logp = z - top - xp.log(xp.sum(xp.exp(z - top), axis=-1, keepdims=True))
    picked = xp.take_along_axis(logp, xp.reshape(xp.asarray(labels), (-1, 1)), axis=-1)
    return -picked[:, 0]


def contestants(params, x, labels):
    """``{name: zero-argument function returning the norms as NumPy}``; the reference first."""
    import torch
    from torch.func import grad, vmap

    tp = {k: torch.from_numpy(v) for k, v in params.items()}
    tx, ty = torch.from_numpy(x), torch.from_numpy(labels)

    def loss_one(p, xi, yi):
        z = torch.tanh(xi @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
        return -torch.gather(torch.log_softmax(z, dim=-1), 0, yi[None])[0]

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def torch_func():
        g = per_example(tp, tx, ty)
        return torch.sqrt(sum((v.reshape(BATCH, -1) ** 2).sum(1) for v in g.values())).numpy()

    tape = unigrad.per_example_grad_norms(losses, batch_argnum=(1, 2))
    on_torch = unigrad.per_example_grad_norms(losses, batch_argnum=(1, 2), backend="torch")
    found = {"torch.func vmap(grad)": torch_func,
             "unigrad tape": lambda: tape(params, x, labels),
             "unigrad torch": lambda: on_torch(params, tx, ty).numpy()}
    if "jax" in {n for n, i in unigrad.backends().items() if i["available"]}:
        import jax.numpy as jnp

        on_jax = unigrad.per_example_grad_norms(losses, batch_argnum=(1, 2), backend="jax", compile=True)
        jp = {k: jnp.asarray(v) for k, v in params.items()}
        jx, jy = jnp.asarray(x), jnp.asarray(labels)
        found["unigrad jax (compile)"] = lambda: np.asarray(on_jax(jp, jx, jy).block_until_ready())
    if "tensorflow" in {n for n, i in unigrad.backends().items() if i["available"]}:
        found.update(tensorflow_contestants(params, x, labels))
    model = torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.Tanh(),
                                torch.nn.Linear(SIZES[1], SIZES[2]))
    with torch.no_grad():
        model[0].weight.copy_(tp["W1"].T)
        model[0].bias.copy_(tp["b1"])
        model[2].weight.copy_(tp["W2"].T)
        model[2].bias.copy_(tp["b2"])
    import copy

    pristine = copy.deepcopy(model)  # (Opacus's hooks stay on `model`; BackPACK extends a clean copy)
    try:
        from opacus import GradSampleModule

        sampled = GradSampleModule(model, loss_reduction="sum")
        criterion = torch.nn.CrossEntropyLoss(reduction="sum")

        def opacus():
            sampled.zero_grad(set_to_none=True)
            for p in sampled.parameters():
                p.grad_sample = None
            criterion(sampled(tx), ty).backward()
            return torch.sqrt(sum((p.grad_sample.reshape(BATCH, -1) ** 2).sum(1)
                                  for p in sampled.parameters())).detach().numpy()

        found["Opacus (hooks)"] = opacus
    except ImportError:
        pass
    try:
        from backpack import backpack, extend
        from backpack.extensions import BatchL2Grad

        extended = extend(pristine)
        criterion_bp = extend(torch.nn.CrossEntropyLoss(reduction="sum"))

        def backpack_l2():
            extended.zero_grad(set_to_none=True)
            with backpack(BatchL2Grad()):
                criterion_bp(extended(tx), ty).backward()
            return torch.sqrt(sum(p.batch_l2 for p in extended.parameters())).detach().numpy()

        found["BackPACK (BatchL2Grad)"] = backpack_l2
    except ImportError:
        pass
    return found


TF_NATIVE = "TensorFlow vectorized_map"
TF_UNIGRAD = "unigrad tensorflow"


def tensorflow_contestants(params, x, labels):
    """TensorFlow's own per-example gradient norms (a tf.function of tf.vectorized_map of per-example
    gradients) and unigrad's on TensorFlow (eager calls)."""
    import tensorflow as tf

    tp = {k: tf.constant(v) for k, v in params.items()}
    tx, ty = tf.constant(x), tf.constant(labels)

    def loss_one(p, xi, yi):
        z = tf.tanh(xi[None] @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
        return tf.nn.sparse_softmax_cross_entropy_with_logits(yi[None], z)[0]

    @tf.function(autograph=False)
    def native(p, xs, ys):
        def one(xy):
            with tf.GradientTape() as tape:
                tape.watch(p)
                loss = loss_one(p, xy[0], xy[1])
            return tape.gradient(loss, p)

        g = tf.vectorized_map(one, (xs, ys))
        return tf.sqrt(tf.add_n([tf.reduce_sum(tf.reshape(v * v, (BATCH, -1)), 1) for v in g.values()]))

    on_tf = unigrad.per_example_grad_norms(losses, batch_argnum=(1, 2), backend="tensorflow")
    return {TF_NATIVE: lambda: native(tp, tx, ty).numpy(), TF_UNIGRAD: lambda: on_tf(tp, tx, ty).numpy()}


def run(quick=False):
    import torch

    # One torch thread while this runs (restored after): on a loaded machine torch's spinning worker
    # threads cost it far more than the other engines, and the ratios would measure that instead.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick):
    params, x, labels = problem()
    found = contestants(params, x, labels)
    names = list(found)
    reference = found[names[0]]()
    for name in names[1:]:
        got = found[name]()
        if not np.allclose(got, reference, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"{name}: norms differ from torch.func's by up to "
                                 f"{np.max(np.abs(got - reference)):.3g}")
    number, repeat = (3, 3) if quick else (10, 9)
    # the materialised forms are slow: they run fewer times per round
    fns = [found[n] for n in names]
    rounds = timed_rounds(fns, number, repeat)
    best = [min(r[k] for r in rounds) for k in range(len(names))]
    results = {"seconds": dict(zip(names, best)),
               "ratio_vs_torch_func": {n: ratio(rounds, k, 0) for k, n in enumerate(names) if k}}
    if TF_NATIVE in names:
        i, j = names.index(TF_UNIGRAD), names.index(TF_NATIVE)
        per_round = [r[i] / r[j] for r in rounds]
        results["unigrad_tensorflow_vs_native"] = {"median": statistics.median(per_round), "low": min(per_round),
                                                   "high": max(per_round)}
    return results


def report(results):
    print(f"per-example gradient norms, MLP {'-'.join(map(str, SIZES))}, float32, batch {BATCH}")
    for name, seconds in results["seconds"].items():
        r = results["ratio_vs_torch_func"].get(name)
        spread = ""
        if r is not None and getattr(r, "per_round", ()):
            low, high = r.spread
            spread = f" (rounds {low:.2f}-{high:.2f})"
        tail = f"  ratio to torch.func {float(r):.3f}{spread}" if r is not None else "  (reference)"
        print(f"  {name:26s} {seconds * 1e3:8.2f} ms{tail}")
    tf_ratio = results.get("unigrad_tensorflow_vs_native")
    if tf_ratio:
        print(f"  unigrad tensorflow / TensorFlow vectorized_map: {tf_ratio['median']:.3f} "
              f"(rounds {tf_ratio['low']:.3f}-{tf_ratio['high']:.3f})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.quick)
    if args.json:
        print(json.dumps({k: {n: float(v) for n, v in d.items()} for k, d in results.items()}, indent=2))
    else:
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
