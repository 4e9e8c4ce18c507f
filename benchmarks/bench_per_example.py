"""Per-example gradient norms (differential privacy's clipping step) against torch.func and peers.

Four problems, each one's result the gradient norm of every example over all parameters, float32:
  * MLP 784-256-10 (tanh, softmax cross-entropy), batch 128;
  * a small CNN: conv2d(1->16, 3x3, padding 1) - relu - conv2d(16->32, 3x3, stride 2, padding 1) - relu -
    linear(32*14*14 -> 10), 28x28 inputs, batch 64;
  * a sequence model: embedding(2000, 64) - LayerNorm - linear(64 -> 2000), per-token cross-entropy summed
    over 32 tokens, batch 64;
  * a transformer: TransformerEncoderLayer(64, 4 heads, 128) - linear, 32 tokens, batch 64.
Reported as ratios to ``torch.func``'s ``vmap(grad(loss))`` followed by the norms, measured in the same
run (median of per-round ratios, the rounds' range beside it), with the machine's load average:
  * unigrad.per_example_grad_norms on the NumPy tape (MLP only: dense layers found in the recorded
    program, norms from one backward pass)                                         (goal <= 0.2)
  * unigrad.per_example_grad_norms on torch (the ATen operations of one forward pass read by the
    dependence analysis: dense layers, convolutions, embeddings, LayerNorm from one backward pass)
                                                                                   (goal <= 0.2)
    and on JAX (MLP only, compile=True, the jaxpr read the same way)
  * Opacus (GradSampleModule, hooks) and BackPACK (BatchL2Grad), when installed (``pip install
    unigrad[bench]``) and when they support the model's layers; skipped otherwise.
  * TensorFlow, when installed: unigrad.per_example_grad_norms on TensorFlow (eager calls: one
    tf.function per signature, the graph read by the dependence analysis: norms from one backward
    pass) against TensorFlow's own per-example form, a tf.function of ``tf.vectorized_map`` over
    per-example GradientTape gradients, then the norms; reported as their own ratio (median of the
    per-round ratios, with the lowest and highest round).

Every contestant's norms are checked against torch.func's before timing. torch runs with one thread
here (restored afterwards): on a loaded machine its spinning worker threads distort the ratios.

Run: python benchmarks/bench_per_example.py [--quick] [--json] [--only mlp,cnn,sequence,transformer]
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


class _Ratio(float):
    """A median ratio with its per-round values (``benchmarks/run.py`` hands in its own, the same)."""

    per_round: tuple = ()

    @property
    def spread(self):
        return min(self.per_round), max(self.per_round)


def ratio(rounds, i, j):
    """Time of function i over time of function j: the median of the per-round ratios."""
    value = _Ratio(statistics.median(r[i] / r[j] for r in rounds))
    value.per_round = tuple(r[i] / r[j] for r in rounds)
    return value


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


CNN_BATCH = 64
SEQ = dict(batch=64, tokens=32, vocabulary=2000, width=64)


def module_contestants(model, loss_sum, loss_none, batch, n_batch, per_token=False):
    """``{name: function}`` for an ``nn.Module`` and its loss: torch.func, unigrad torch, Opacus, BackPACK.

    ``loss_none(z, y)`` is each example's loss, ``loss_sum`` the criterion summed over the batch (the form
    Opacus and BackPACK take); ``batch`` the inputs and targets as torch tensors."""
    import copy

    import torch
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p, xi, yi):
        return loss_none(functional_call(model, p, (xi[None],)), yi[None])[0]

    per_example = vmap(grad(one), in_dims=(None, 0, 0))

    def torch_func():
        g = per_example(params, *batch)
        return torch.sqrt(sum((v.reshape(n_batch, -1) ** 2).sum(1) for v in g.values())).numpy()

    def losses(p, x, y):
        return loss_none(functional_call(model, p, (x,)), y)

    on_torch = unigrad.per_example_grad_norms(losses, batch_argnum=(1, 2), backend="torch")
    found = {"torch.func vmap(grad)": torch_func, "unigrad torch": lambda: on_torch(params, *batch).numpy()}
    pristine = copy.deepcopy(model)
    try:
        from opacus import GradSampleModule

        sampled = GradSampleModule(copy.deepcopy(model), loss_reduction="sum")

        def opacus():
            sampled.zero_grad(set_to_none=True)
            for q in sampled.parameters():
                q.grad_sample = None
            loss_sum(sampled(batch[0]), batch[1]).backward()
            return torch.sqrt(sum((q.grad_sample.reshape(n_batch, -1) ** 2).sum(1)
                                  for q in sampled.parameters())).detach().numpy()

        found["Opacus (hooks)"] = opacus
    except Exception:  # not installed, or a layer it does not support
        pass
    try:
        from backpack import backpack, extend
        from backpack.extensions import BatchL2Grad

        extended = extend(pristine)

        def backpack_l2():
            extended.zero_grad(set_to_none=True)
            with backpack(BatchL2Grad()):
                loss_sum(extended(batch[0]), batch[1]).backward()
            return torch.sqrt(sum(q.batch_l2 for q in extended.parameters())).detach().numpy()

        found["BackPACK (BatchL2Grad)"] = backpack_l2
    except Exception:
        pass
    return found


def cnn_contestants(seed=0):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(32 * 14 * 14, 10))
    x, y = torch.randn(CNN_BATCH, 1, 28, 28), torch.randint(10, (CNN_BATCH,))
    ce = torch.nn.functional.cross_entropy
    return module_contestants(model, lambda z, t: ce(z, t, reduction="sum"),
                              lambda z, t: ce(z, t, reduction="none"), (x, y), CNN_BATCH)


def sequence_contestants(seed=0):
    import torch

    torch.manual_seed(seed)
    b, t, v, d = SEQ["batch"], SEQ["tokens"], SEQ["vocabulary"], SEQ["width"]
    model = torch.nn.Sequential(torch.nn.Embedding(v, d), torch.nn.LayerNorm(d), torch.nn.Linear(d, v))
    x, y = torch.randint(v, (b, t)), torch.randint(v, (b, t))
    ce = torch.nn.functional.cross_entropy

    def per_example(z, target):
        return ce(z.reshape(-1, v), target.reshape(-1), reduction="none").reshape(target.shape[0], -1).sum(1)

    return module_contestants(model, lambda z, target: ce(z.reshape(-1, v), target.reshape(-1), reduction="sum"),
                              per_example, (x, y), b)


TRANSFORMER = dict(batch=64, tokens=32, width=64, heads=4, hidden=128)


def transformer_contestants(seed=0):
    import torch

    torch.manual_seed(seed)
    b, t, d = TRANSFORMER["batch"], TRANSFORMER["tokens"], TRANSFORMER["width"]
    model = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(d, TRANSFORMER["heads"], TRANSFORMER["hidden"],
                                                                 dropout=0.0, batch_first=True),
                                torch.nn.Flatten(), torch.nn.Linear(t * d, 10))
    x, y = torch.randn(b, t, d), torch.randint(10, (b,))
    ce = torch.nn.functional.cross_entropy
    return module_contestants(model, lambda z, target: ce(z, target, reduction="sum"),
                              lambda z, target: ce(z, target, reduction="none"), (x, y), b)


PROBLEMS = {"mlp": lambda: contestants(*problem()), "cnn": cnn_contestants, "sequence": sequence_contestants,
            "transformer": transformer_contestants}
TITLES = {"mlp": f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}",
          "cnn": f"CNN conv2d-relu-conv2d-relu-linear on 28x28, batch {CNN_BATCH}",
          "sequence": (f"embedding({SEQ['vocabulary']}, {SEQ['width']})-LayerNorm-linear, {SEQ['tokens']} tokens, "
                       f"batch {SEQ['batch']}"),
          "transformer": (f"TransformerEncoderLayer({TRANSFORMER['width']}, {TRANSFORMER['heads']} heads, "
                          f"{TRANSFORMER['hidden']})-linear, {TRANSFORMER['tokens']} tokens, "
                          f"batch {TRANSFORMER['batch']}")}


def load_average():
    try:
        import os

        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run(quick=False, only=None):
    import torch

    # One torch thread while this runs (restored after): on a loaded machine torch's spinning worker
    # threads cost it far more than the other engines, and the ratios would measure that instead.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick, only)
    finally:
        torch.set_num_threads(threads)


def _run(quick, only=None):
    """The MLP's results at the top level (as before), the other problems under their names."""
    results = {}
    for key in only or PROBLEMS:
        found = PROBLEMS[key]()
        results[key] = _measure(found, quick)
        results[key]["load_average"] = load_average()
    top = results.pop("mlp", {})
    top.update(results)
    return top


def _measure(found, quick):
    names = list(found)
    reference = found[names[0]]()
    for name in names[1:]:
        try:
            got = found[name]()
        except Exception as exc:  # a peer that does not support one of the layers
            print(f"  ({name} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:100]})")
            del found[name]
            continue
        if not np.allclose(got, reference, rtol=1e-3, atol=1e-5):
            raise AssertionError(f"{name}: norms differ from torch.func's by up to "
                                 f"{np.max(np.abs(got - reference)):.3g}")
    names = list(found)
    number, repeat = (2, 3) if quick else (5, 9)
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
    parts = [("mlp", results)] + [(k, results[k]) for k in ("cnn", "sequence", "transformer") if k in results]
    for key, res in parts:
        if "seconds" not in res:
            continue
        load = res.get("load_average")
        print(f"per-example gradient norms, {TITLES[key]}, float32"
              + (f" (load average {load:.2f})" if load is not None else ""))
        for name, seconds in res["seconds"].items():
            r = res["ratio_vs_torch_func"].get(name)
            spread = ""
            if r is not None and getattr(r, "per_round", ()):
                low, high = r.spread
                spread = f" (rounds {low:.3f}-{high:.3f})"
            tail = f"  ratio to torch.func {float(r):.3f}{spread}" if r is not None else "  (reference)"
            print(f"  {name:26s} {seconds * 1e3:8.2f} ms{tail}")
        tf_ratio = res.get("unigrad_tensorflow_vs_native")
        if tf_ratio:
            print(f"  unigrad tensorflow / TensorFlow vectorized_map: {tf_ratio['median']:.3f} "
                  f"(rounds {tf_ratio['low']:.3f}-{tf_ratio['high']:.3f})")


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return float(value) if value is not None else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", default=None, help="comma-separated problems among mlp,cnn,sequence,transformer")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    results = run(args.quick, only)
    if args.json:
        print(json.dumps(_plain(results), indent=2))
    else:
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
