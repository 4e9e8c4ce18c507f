"""compare_implementations on real ports beyond the MLP of test_implementations.py: a small conv net and a
transformer block (layer norm, multi-head causal self-attention, GELU MLP), each hand-written natively in
NumPy-on-the-tape, PyTorch, JAX and TensorFlow taking the SAME canonical inputs (PyTorch's layouts: NCHW
images, OIHW kernels, (out, in) weights; every other port converts inside f, differentiably). Correct
float32 ports never raise a false alarm (20 seeds in the thorough job); the classic porting bugs of each are
caught and placed -- the parameter whose gradient differs, the first tap whose forward value differs, the
last tap whose cotangent still agrees -- on every ordered pair of engines in the thorough job, and on a
representative subset by default (every bug once; for the conv net every engine on each side, for the block
NumPy, PyTorch and TensorFlow -- JAX's first eager run of the block compiles for 16 s). Also two defects of
TensorFlow's own the ports found (tf.nn.gelu in float64, tf.nn.moments' second derivative), and ports that
compute in float32 whatever their inputs (a Flax module) or refuse float64 (a Keras layer)."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

import unigrad
from unigrad.testing import DISAGREE, compare_implementations, tap

from conftest import missing_reason, optional

FRAMEWORKS = ("numpy", "torch", "jax", "tensorflow")
SQRT2 = math.sqrt(2.0)


def installed():
    return [name for name in FRAMEWORKS if name == "numpy" or optional(name) is not None]


def pair_cases(bugs, default):
    """pytest params (bug, reference, where): every ordered pair of engines for every bug, the ``default``
    ones in the default suite and the rest in the thorough job (slow); a pair with a missing engine skips."""
    for bug in bugs:
        for reference, where in itertools.permutations(FRAMEWORKS, 2):
            reason = missing_reason(*(n for n in (reference, where) if n != "numpy"))
            marks = [pytest.mark.skipif(reason is not None, reason=reason or "")]
            if (reference, where) != default[bug]:
                marks.append(pytest.mark.slow)
            yield pytest.param(bug, reference, where, marks=marks, id=f"{bug}-{reference}-vs-{where}")


def check_placed(report, expected, order):
    """The report says what ``expected`` says: (the parameters whose gradients differ, the one that differs
    most, the first tap whose forward value differs, the first tap -- from the outputs back -- whose cotangent
    differs, whether the outputs differ); ``order`` lists the taps in backward order."""
    grads, most, first_forward, first_cotangent, outputs_differ = expected
    assert report.verdict == DISAGREE, report
    vjp = [r for r in report.differences if r.quantity == "vjp"]
    assert {r.leaf for r in vjp} == grads, report
    if most is not None:  # the gradients place a local bug: its layer's parameters differ most, relatively
        assert vjp[0].leaf.startswith(most) and f"`{vjp[0].leaf}`" in report.summary, report
    assert (not report.leaf("output", "value")[0].ok) == outputs_differ, report
    assert report.first_forward_difference == first_forward, report
    assert report.first_cotangent_difference == first_cotangent, report
    if first_cotangent is not None and order.index(first_cotangent) > 0:  # the one before it still agrees
        assert report.last_agreeing_cotangent == order[order.index(first_cotangent) - 1], report


# ------------------------------------------------------------------------------------------------
# A small conv net: conv1 (3x3, 'SAME') + bias -> ReLU -> 2x2 max pool -> conv2 (3x3, 'SAME') + bias ->
# ReLU -> global average pool -> dense. Canonical layout PyTorch's: x (N, C, H, W), kernels (O, I, kh, kw),
# dense weight (out, in). Taps in the canonical layout too (NCHW): an NHWC port transposes around a tap.
# ------------------------------------------------------------------------------------------------

N, C_IN, HW, C1, C2, CLASSES = 2, 2, 8, 4, 4, 3
CONV_BUGS = ("kernel_flip", "kernel_io", "padding", "dropped_bias")
CONV_TAPS = ["conv1", "pool", "conv2", "features", "logits"]  # execution order


def conv_params(seed, zero_bias=False, dtype="float32"):
    rng = np.random.default_rng(seed)

    def w(*shape):  # fan-in scaled, as at initialisation
        return rng.standard_normal(shape) / math.sqrt(np.prod(shape[1:]))
    params = {"conv1": {"weight": w(C1, C_IN, 3, 3), "bias": 0.1 * rng.standard_normal(C1)},
              "conv2": {"weight": w(C2, C1, 3, 3), "bias": 0.1 * rng.standard_normal(C2)},
              "fc": {"weight": w(CLASSES, C2), "bias": 0.1 * rng.standard_normal(CLASSES)}}
    if zero_bias:
        params["conv2"]["bias"] = np.zeros(C2)
    x = rng.standard_normal((N, C_IN, HW, HW))
    cast = (lambda a: a.astype(dtype))
    return {k: {n: cast(v) for n, v in layer.items()} for k, layer in params.items()}, cast(x)


# The bugs, each a classic of conv ports:
#   kernel_flip   conv1's kernel flipped in space: a true convolution (scipy.signal.convolve2d, a textbook
#                 formula) where every framework computes a cross-correlation
#   kernel_io     conv2's kernel with its input and output channels swapped: OIHW read as IOHW, or
#                 transposed to HWOI where HWIO is meant (silent when C_in == C_out)
#   padding       conv2 unpadded ('VALID', padding 0) where the original pads ('SAME', padding 1); the
#                 global average pool hides the smaller feature map from the output's shape
#   dropped_bias  conv2's bias dropped (zero at initialisation: the outputs agree)
ALL_BUT_FC_BIAS = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight"}
CONV_EXPECTED = {
    # a gross forward bug changes every value after it, so every gradient but the last bias' (the cotangent
    # itself) differs, the buggy layer's not always most: the taps place it -- the first forward value that
    # differs; the cotangents part where the backward pass first reads a differing forward value (the ReLU
    # after conv2, whose mask the forward values set)
    "kernel_flip": (ALL_BUT_FC_BIAS, None, "conv1", "conv2", True),
    "kernel_io": (ALL_BUT_FC_BIAS, None, "conv2", "conv2", True),
    # the unpadded map has another shape: conv2's forward value and cotangent
    "padding": (ALL_BUT_FC_BIAS, None, "conv2", "conv2", True),
    # a local bug the gradients place: the dropped bias' alone differs, no tap's value
    "dropped_bias": ({"conv2.bias"}, "conv2.bias", None, None, False),
}


def numpy_conv(bug=None):
    """Portable code on the NumPy tape: zero padding by concatenation, im2col by slicing, one matmul."""
    def pad(x, p):
        xp = unigrad.namespace(x)
        n, c, h, w = x.shape
        rows = xp.zeros((n, c, p, w), dtype=x.dtype)
        x = xp.concat([rows, x, rows], axis=2)
        cols = xp.zeros((n, c, h + 2 * p, p), dtype=x.dtype)
        return xp.concat([cols, x, cols], axis=3)

    def conv2d(x, layer, padding=1, flip=False, swap_io=False, use_bias=True):
        xp = unigrad.namespace(x)
        w = layer["weight"]
        if flip:
            w = xp.flip(w, axis=(2, 3))
        if swap_io:
            w = xp.permute_dims(w, (1, 0, 2, 3))
        if padding:
            x = pad(x, padding)
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        ho, wo = h - kh + 1, wd - kw + 1
        patches = xp.stack([x[:, :, i:i + ho, j:j + wo] for i in range(kh) for j in range(kw)], axis=2)
        y = xp.reshape(xp.reshape(w, (o, c * kh * kw)) @ xp.reshape(patches, (n, c * kh * kw, ho * wo)),
                       (n, o, ho, wo))
        return y + xp.reshape(layer["bias"], (1, o, 1, 1)) if use_bias else y

    def f(p, x):
        xp = unigrad.namespace(x)
        h = tap("conv1", conv2d(x, p["conv1"], flip=bug == "kernel_flip"))
        n, c, hh, ww = h.shape
        h = tap("pool", xp.max(xp.reshape(xp.maximum(h, 0.0), (n, c, hh // 2, 2, ww // 2, 2)), axis=(3, 5)))
        h = tap("conv2", conv2d(h, p["conv2"], padding=0 if bug == "padding" else 1, swap_io=bug == "kernel_io",
                                use_bias=bug != "dropped_bias"))
        h = tap("features", xp.mean(xp.maximum(h, 0.0), axis=(2, 3)))
        return tap("logits", h @ xp.matrix_transpose(p["fc"]["weight"]) + p["fc"]["bias"])
    return f


def torch_conv(bug=None):
    import torch
    import torch.nn.functional as F

    def f(p, x):
        w1 = p["conv1"]["weight"].flip((2, 3)) if bug == "kernel_flip" else p["conv1"]["weight"]
        h = tap("conv1", F.conv2d(x, w1, p["conv1"]["bias"], padding=1))
        h = tap("pool", F.max_pool2d(F.relu(h), 2))
        w2 = p["conv2"]["weight"].transpose(0, 1) if bug == "kernel_io" else p["conv2"]["weight"]
        h = tap("conv2", F.conv2d(h, w2, None if bug == "dropped_bias" else p["conv2"]["bias"],
                                  padding=0 if bug == "padding" else 1))
        h = tap("features", torch.mean(F.relu(h), dim=(2, 3)))
        return tap("logits", F.linear(h, p["fc"]["weight"], p["fc"]["bias"]))
    return f


def jax_conv(bug=None):
    import jax
    import jax.numpy as jnp

    def nchw_tap(name, h):  # taps compare the canonical layout
        return tap(name, h.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1)

    def conv(x, layer, padding="SAME", flip=False, swap_io=False, use_bias=True):  # NHWC, kernel HWIO
        kernel = layer["weight"].transpose(2, 3, 0, 1) if swap_io else layer["weight"].transpose(2, 3, 1, 0)
        if flip:
            kernel = kernel[::-1, ::-1]
        y = jax.lax.conv_general_dilated(x, kernel, (1, 1), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + layer["bias"] if use_bias else y

    def max_pool(x):  # flax.linen.max_pool's window
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def f(p, x):
        x = x.transpose(0, 2, 3, 1)  # NCHW -> NHWC
        h = nchw_tap("conv1", conv(x, p["conv1"], flip=bug == "kernel_flip"))
        h = nchw_tap("pool", max_pool(jax.nn.relu(h)))
        h = nchw_tap("conv2", conv(h, p["conv2"], padding="VALID" if bug == "padding" else "SAME",
                                   swap_io=bug == "kernel_io", use_bias=bug != "dropped_bias"))
        h = tap("features", jnp.mean(jax.nn.relu(h), axis=(1, 2)))
        return tap("logits", h @ p["fc"]["weight"].T + p["fc"]["bias"])
    return f


def tensorflow_conv(bug=None):
    import tensorflow as tf

    def nchw_tap(name, h):
        return tf.transpose(tap(name, tf.transpose(h, (0, 3, 1, 2))), (0, 2, 3, 1))

    def conv(x, layer, padding="SAME", flip=False, swap_io=False, use_bias=True):  # NHWC, kernel HWIO
        kernel = tf.transpose(layer["weight"], (2, 3, 0, 1) if swap_io else (2, 3, 1, 0))
        if flip:
            kernel = tf.reverse(kernel, axis=[0, 1])
        y = tf.nn.conv2d(x, kernel, strides=1, padding=padding)
        return tf.nn.bias_add(y, layer["bias"]) if use_bias else y

    def f(p, x):
        x = tf.transpose(x, (0, 2, 3, 1))
        h = nchw_tap("conv1", conv(x, p["conv1"], flip=bug == "kernel_flip"))
        h = nchw_tap("pool", tf.nn.max_pool2d(tf.nn.relu(h), 2, 2, "VALID"))
        h = nchw_tap("conv2", conv(h, p["conv2"], padding="VALID" if bug == "padding" else "SAME",
                                   swap_io=bug == "kernel_io", use_bias=bug != "dropped_bias"))
        h = tap("features", tf.reduce_mean(tf.nn.relu(h), axis=(1, 2)))
        return tap("logits", tf.matmul(h, p["fc"]["weight"], transpose_b=True) + p["fc"]["bias"])
    return f


CONVS = {name: functools.lru_cache(maxsize=None)(port) for name, port in
         (("numpy", numpy_conv), ("torch", torch_conv), ("jax", jax_conv), ("tensorflow", tensorflow_conv))}


def conv_default_pairs():
    """The default suite's (reference, buggy engine) per bug: each engine once on each side."""
    pairs = [("torch", "jax"), ("jax", "tensorflow"), ("tensorflow", "numpy"), ("numpy", "torch")]
    return dict(zip(CONV_BUGS, pairs))


def test_correct_conv_ports_agree_on_every_engine():
    names = installed()
    assert len(names) >= 2
    impls = {name: CONVS[name]() for name in names}
    for seed in range(2):
        params, x = conv_params(seed)
        # the first seed with each port against finite differences of itself (the slow test: 20 seeds, the
        # Jacobian, second order)
        report = compare_implementations(impls, (params, x), seed=seed, jacobian=False, finite_differences=seed == 0)
        assert report.ok, report
        assert all(i.rounding == "float64 run" for i in report.implementations)
        assert all(r.ratio <= 1 for r in report.leaves)
        assert [t.name for t in report.taps] == CONV_TAPS
        assert all(t.forward_ok and t.cotangent_ok for t in report.taps)
        assert report.last_agreeing_cotangent == "conv1"
        # the gradients are the real ones, not only equal to each other: each port against finite differences
        if seed == 0:
            assert all(c.status == "ok" for i in report.implementations for c in i.result.checks), report
            assert {c.quantity for c in report["numpy"].result.checks} >= {"jvp", "vjp", "transpose"}


@pytest.mark.slow
def test_correct_conv_ports_agree_over_twenty_seeds():
    impls = {name: CONVS[name]() for name in installed()}
    for seed in range(20):
        params, x = conv_params(seed)
        # the Jacobian (8 s of the 19 s per seed) for the first three seeds
        report = compare_implementations(impls, (params, x), seed=seed, order=2, jacobian="auto" if seed < 3 else False)
        assert report.ok, (seed, report)
        assert all(r.ratio <= 1 for r in report.leaves)
        assert any(r.quantity == "second" for r in report.leaves)
        assert any(r.quantity == "jacobian" for r in report.leaves) == (seed < 3)


@pytest.mark.parametrize("bug, reference, where", list(pair_cases(CONV_BUGS, conv_default_pairs())))
def test_each_conv_porting_bug_is_caught_and_placed(bug, reference, where):
    params, x = conv_params(3, zero_bias=bug == "dropped_bias")
    report = compare_implementations({reference: CONVS[reference](), f"{where} (bug)": (where, CONVS[where](bug))},
                                     (params, x), jacobian=False, finite_differences=False)
    check_placed(report, CONV_EXPECTED[bug], CONV_TAPS[::-1])
    if bug == "padding":  # the tap says why: the unpadded map is smaller
        conv2 = next(t for t in report.taps if t.name == "conv2")
        assert conv2.forward[0].status == "shape" and "(2, 4, 4, 4) vs (2, 4, 2, 2)" in conv2.forward[0].message


# ------------------------------------------------------------------------------------------------
# A transformer block (GPT-2's): x + attn(ln_1(x)), then + mlp(ln_2(.)); causal multi-head self-attention,
# GELU (exact erf) MLP. Canonical layout PyTorch's nn.Linear: weight (out, in); c_attn's output is
# [q | k | v], heads contiguous within each. Taps in one layout everywhere: attention weights
# (heads, query, key).
# ------------------------------------------------------------------------------------------------

T, C, HEADS = 4, 8, 2
D = C // HEADS
BLOCK_BUGS = ("gelu_tanh", "ln_eps", "transposed_weight", "dropped_bias", "softmax_axis", "mask",
              "stop_gradient", "custom_rule")
BLOCK_TAPS = ["ln_1", "qkv", "attn_weights", "attn", "ln_2", "c_fc", "gelu", "out"]  # execution order


def block_params(seed, zero_bias=False, dtype="float32"):
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.standard_normal(shape) / math.sqrt(shape[-1])
    params = {"ln_1": {"weight": 1 + 0.1 * rng.standard_normal(C), "bias": 0.1 * rng.standard_normal(C)},
              "attn": {"c_attn": {"weight": w(3 * C, C), "bias": 0.1 * rng.standard_normal(3 * C)},
                       "c_proj": {"weight": w(C, C), "bias": 0.1 * rng.standard_normal(C)}},
              "ln_2": {"weight": 1 + 0.1 * rng.standard_normal(C), "bias": 0.1 * rng.standard_normal(C)},
              "mlp": {"c_fc": {"weight": w(4 * C, C), "bias": 0.1 * rng.standard_normal(4 * C)},
                      "c_proj": {"weight": w(C, 4 * C), "bias": 0.1 * rng.standard_normal(C)}}}
    if zero_bias:
        params["attn"]["c_proj"]["bias"] = np.zeros(C)
    x = rng.standard_normal((T, C))
    return _cast(params, dtype), x.astype(dtype)


def _cast(tree, dtype):
    return {k: _cast(v, dtype) if isinstance(v, dict) else v.astype(dtype) for k, v in tree.items()}


# The bugs (each in the one place a port would make it):
#   gelu_tanh          the MLP's GELU in its tanh approximation (jax.nn.gelu's and Keras' default)
#   ln_eps             ln_1's epsilon 1e-6 (Flax's and Keras' default) where PyTorch's is 1e-5
#   transposed_weight  attn.c_proj's (square) weight used untransposed ((in, out) read as (out, in))
#   dropped_bias       attn.c_proj's bias dropped (zero at initialisation: the outputs agree)
#   softmax_axis       the attention's softmax over the queries instead of the keys
#   mask               the causal mask off by one: each position sees the next one too
#   stop_gradient      a detach / stop_gradient on ln_1's output in one port only
#   custom_rule        a custom GELU whose forward value is right and whose derivative misses the
#                      x * phi(x) term: only gradients can see it
EVERYTHING = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
              "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
              "mlp.c_proj.weight"}  # every gradient but the last bias' (which is the output's cotangent)
BLOCK_EXPECTED = {
    # (the parameters whose gradients differ, the layer whose parameters' gradients differ most -- where the
    # gradients place a bug, or None where they cannot -- the first tap whose forward value differs, the first
    # tap, from the outputs back, whose cotangent differs, whether the outputs differ). A forward bug changes
    # the values the backward pass reads below it: the cotangents part at the GELU's input (its derivative
    # reads the forward value) whatever the bug above; the forward taps place it.
    "gelu_tanh": (EVERYTHING, "mlp.c_fc", "gelu", "c_fc", True),  # the layer before the GELU leads
    "ln_eps": (EVERYTHING, None, "ln_1", "c_fc", True),
    "transposed_weight": (EVERYTHING, None, "attn", "c_fc", True),
    "dropped_bias": ({"attn.c_proj.bias"}, "attn.c_proj.bias", None, None, False),
    "softmax_axis": (EVERYTHING, None, "attn_weights", "c_fc", True),
    "mask": (EVERYTHING, None, "attn_weights", "c_fc", True),
    # nothing below the stop is differentiated on one side: ln_1's parameters' gradients, its cotangent
    "stop_gradient": ({"ln_1.weight", "ln_1.bias"}, "ln_1", None, "ln_1", False),
    # the forward values agree; the cotangent parts at the GELU's input, and every gradient below it differs
    "custom_rule": (EVERYTHING - {"mlp.c_proj.weight"}, "mlp.c_fc", None, "c_fc", False),
}


def numpy_block(bug=None):
    """Portable code on the NumPy tape; one head at a time."""
    def ln(x, p, eps):
        xp = unigrad.namespace(x)
        mu = xp.mean(x, axis=-1, keepdims=True)
        var = xp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / xp.sqrt(var + eps) * p["weight"] + p["bias"]

    def linear(x, p, transpose=True, use_bias=True):
        w = unigrad.namespace(x).matrix_transpose(p["weight"]) if transpose else p["weight"]
        return x @ w + p["bias"] if use_bias else x @ w

    def gelu(h):
        if bug == "gelu_tanh":
            return 0.5 * h * (1 + unigrad.namespace(h).tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        return 0.5 * h * (1 + unigrad.special.erf(h / SQRT2))

    @unigrad.custom_vjp
    def gelu_wrong_backward(h):
        return gelu(h)

    def fwd(h):
        return gelu(h), h

    def bwd(h, g):
        return (g * 0.5 * (1 + unigrad.special.erf(h / SQRT2)),)
    gelu_wrong_backward.defvjp(fwd, bwd)

    def f(p, x):
        xp = unigrad.namespace(x)
        h = tap("ln_1", ln(x, p["ln_1"], 1e-6 if bug == "ln_eps" else 1e-5))
        if bug == "stop_gradient":
            h = unigrad.stop_gradient(h)
        qkv = tap("qkv", linear(h, p["attn"]["c_attn"]))
        allowed = xp.asarray(np.tril(np.ones((T, T), dtype=bool), k=1 if bug == "mask" else 0))
        weights = []
        for i in range(HEADS):
            q, k = (qkv[:, j * C + i * D: j * C + (i + 1) * D] for j in range(2))
            s = xp.where(allowed, (q @ xp.matrix_transpose(k)) / math.sqrt(D), -1e9)
            axis = 0 if bug == "softmax_axis" else -1
            e = xp.exp(s - xp.max(s, axis=axis, keepdims=True))
            weights.append(e / xp.sum(e, axis=axis, keepdims=True))
        weights = tap("attn_weights", xp.stack(weights))
        y = xp.concat([weights[i] @ qkv[:, 2 * C + i * D: 2 * C + (i + 1) * D] for i in range(HEADS)], axis=-1)
        a = tap("attn", linear(y, p["attn"]["c_proj"], transpose=bug != "transposed_weight",
                               use_bias=bug != "dropped_bias"))
        x = x + a
        m = tap("c_fc", linear(tap("ln_2", ln(x, p["ln_2"], 1e-5)), p["mlp"]["c_fc"]))
        m = tap("gelu", gelu_wrong_backward(m) if bug == "custom_rule" else gelu(m))
        return tap("out", x + linear(m, p["mlp"]["c_proj"]))
    return f


def torch_block(bug=None):
    import torch
    import torch.nn.functional as F

    class GeluWrongBackward(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(h):
            return F.gelu(h)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            (h,) = ctx.saved_tensors
            return g * 0.5 * (1 + torch.erf(h / SQRT2))

        @staticmethod
        def jvp(ctx, t):
            (h,) = ctx.saved_tensors
            return t * 0.5 * (1 + torch.erf(h / SQRT2))

    def f(p, x):
        h = tap("ln_1", F.layer_norm(x, (C,), p["ln_1"]["weight"], p["ln_1"]["bias"],
                                     eps=1e-6 if bug == "ln_eps" else 1e-5))
        if bug == "stop_gradient":
            h = h.detach()
        qkv = tap("qkv", F.linear(h, p["attn"]["c_attn"]["weight"], p["attn"]["c_attn"]["bias"]))
        q, k, v = (t.reshape(T, HEADS, D).transpose(0, 1) for t in qkv.split(C, dim=-1))
        s = q @ k.transpose(-2, -1) / math.sqrt(D)
        mask = torch.ones(T, T, dtype=torch.bool).tril(diagonal=1 if bug == "mask" else 0)
        w = tap("attn_weights", torch.softmax(s.masked_fill(~mask, float("-inf")),
                                              dim=-2 if bug == "softmax_axis" else -1))
        y = (w @ v).transpose(0, 1).reshape(T, C)
        w_proj = p["attn"]["c_proj"]["weight"]
        a = tap("attn", F.linear(y, w_proj.T if bug == "transposed_weight" else w_proj,
                                 None if bug == "dropped_bias" else p["attn"]["c_proj"]["bias"]))
        x = x + a
        h2 = tap("ln_2", F.layer_norm(x, (C,), p["ln_2"]["weight"], p["ln_2"]["bias"], eps=1e-5))
        m = tap("c_fc", F.linear(h2, p["mlp"]["c_fc"]["weight"], p["mlp"]["c_fc"]["bias"]))
        if bug == "custom_rule":
            m = GeluWrongBackward.apply(m)
        else:
            m = F.gelu(m, approximate="tanh" if bug == "gelu_tanh" else "none")
        m = tap("gelu", m)
        return tap("out", x + F.linear(m, p["mlp"]["c_proj"]["weight"], p["mlp"]["c_proj"]["bias"]))
    return f


def jax_block(bug=None):
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def gelu_wrong_backward(h):
        return jax.nn.gelu(h, approximate=False)

    @gelu_wrong_backward.defjvp
    def gelu_jvp(primals, tangents):
        (h,), (t,) = primals, tangents
        return gelu_wrong_backward(h), t * 0.5 * (1 + jax.scipy.special.erf(h / SQRT2))

    def ln(x, p, eps):  # Flax's LayerNorm
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * p["weight"] + p["bias"]

    def dense(x, p, transpose=True, use_bias=True):  # Flax's Dense: kernel (in, out)
        kernel = p["weight"].T if transpose else p["weight"]
        return x @ kernel + p["bias"] if use_bias else x @ kernel

    def f(p, x):
        h = tap("ln_1", ln(x, p["ln_1"], 1e-6 if bug == "ln_eps" else 1e-5))
        if bug == "stop_gradient":
            h = jax.lax.stop_gradient(h)
        q, k, v = jnp.split(tap("qkv", dense(h, p["attn"]["c_attn"])), 3, axis=-1)
        q, k, v = (t.reshape(T, HEADS, D) for t in (q, k, v))
        s = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
        mask = jnp.tril(jnp.ones((T, T), bool), k=1 if bug == "mask" else 0)
        w = tap("attn_weights", jax.nn.softmax(jnp.where(mask, s, jnp.finfo(s.dtype).min),
                                               axis=-2 if bug == "softmax_axis" else -1))
        y = jnp.einsum("hqk,khd->qhd", w, v).reshape(T, C)
        x = x + tap("attn", dense(y, p["attn"]["c_proj"], transpose=bug != "transposed_weight",
                                  use_bias=bug != "dropped_bias"))
        m = tap("c_fc", dense(tap("ln_2", ln(x, p["ln_2"], 1e-5)), p["mlp"]["c_fc"]))
        m = tap("gelu", gelu_wrong_backward(m) if bug == "custom_rule" else
                jax.nn.gelu(m, approximate=bug == "gelu_tanh"))
        return tap("out", x + dense(m, p["mlp"]["c_proj"]))
    return f


def tensorflow_block(bug=None):
    import tensorflow as tf

    def gelu(h):
        if bug == "gelu_tanh":  # written out: tf.nn.gelu(approximate=True) rounds its constant to float32
            c = tf.constant(math.sqrt(2 / math.pi), h.dtype)
            return 0.5 * h * (1 + tf.tanh(c * (h + tf.constant(0.044715, h.dtype) * h ** 3)))
        if bug == "tf_nn_gelu":  # in float64, TensorFlow's own exact GELU is off by 1e-8 relative (below)
            return tf.nn.gelu(h, approximate=False)
        return 0.5 * h * (1 + tf.math.erf(h / SQRT2))

    @tf.custom_gradient
    def gelu_wrong_backward(h):
        def grad(g):
            return g * 0.5 * (1 + tf.math.erf(h / SQRT2))
        return gelu(h), grad

    def ln(x, p, eps):
        if bug == "tf_nn_moments":  # Keras 2's LayerNormalization: its second derivative is wrong (below)
            mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
            return tf.nn.batch_normalization(x, mean, var, offset=p["bias"], scale=p["weight"], variance_epsilon=eps)
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + eps) * p["weight"] + p["bias"]

    def dense(x, p, transpose=True, use_bias=True):
        y = tf.matmul(x, p["weight"], transpose_b=transpose)
        return y + p["bias"] if use_bias else y

    def f(p, x):
        h = tap("ln_1", ln(x, p["ln_1"], 1e-6 if bug == "ln_eps" else 1e-5))
        if bug == "stop_gradient":
            h = tf.stop_gradient(h)
        q, k, v = tf.split(tap("qkv", dense(h, p["attn"]["c_attn"])), 3, axis=-1)
        q, k, v = (tf.transpose(tf.reshape(t, (T, HEADS, D)), (1, 0, 2)) for t in (q, k, v))
        s = tf.matmul(q, k, transpose_b=True) / math.sqrt(D)
        mask = tf.linalg.band_part(tf.ones((T, T), tf.bool), -1, 1 if bug == "mask" else 0)
        s = tf.where(mask, s, tf.constant(-1e9, s.dtype))
        w = tap("attn_weights", tf.nn.softmax(s, axis=-2 if bug == "softmax_axis" else -1))
        y = tf.reshape(tf.transpose(tf.matmul(w, v), (1, 0, 2)), (T, C))
        x = x + tap("attn", dense(y, p["attn"]["c_proj"], transpose=bug != "transposed_weight",
                                  use_bias=bug != "dropped_bias"))
        m = tap("c_fc", dense(tap("ln_2", ln(x, p["ln_2"], 1e-5)), p["mlp"]["c_fc"]))
        m = tap("gelu", gelu_wrong_backward(m) if bug == "custom_rule" else gelu(m))
        return tap("out", x + dense(m, p["mlp"]["c_proj"]))
    return f


BLOCKS = {name: functools.lru_cache(maxsize=None)(port) for name, port in
          (("numpy", numpy_block), ("torch", torch_block), ("jax", jax_block), ("tensorflow", tensorflow_block))}


# JAX's first eager run of the block compiles each of its operations (about 16 s of CPU): the default suite
# runs the block on the other three engines (JAX's ports of the MLP and the conv net run there), the thorough
# job on all four
DEFAULT_BLOCK_ENGINES = ("numpy", "torch", "tensorflow")


def block_default_pairs():
    """The default suite's (reference, buggy engine) per bug: every ordered pair of the default engines."""
    pairs = list(itertools.permutations(DEFAULT_BLOCK_ENGINES, 2))
    return {bug: pairs[k % len(pairs)] for k, bug in enumerate(BLOCK_BUGS)}


def test_correct_block_ports_agree():
    names = [name for name in installed() if name in DEFAULT_BLOCK_ENGINES]
    assert len(names) >= 2
    impls = {name: BLOCKS[name]() for name in names}
    params, x = block_params(0)
    # each port against finite differences of itself too (the slow test: 20 seeds, second order, four engines)
    report = compare_implementations(impls, (params, x), seed=0)
    assert report.ok, report
    assert all(i.rounding == "float64 run" for i in report.implementations)
    assert all(r.ratio <= 1 for r in report.leaves)
    assert all(c.status == "ok" for i in report.implementations for c in i.result.checks), report
    assert [t.name for t in report.taps] == BLOCK_TAPS
    assert all(t.forward_ok and t.cotangent_ok for t in report.taps)
    assert report.last_agreeing_cotangent == "ln_1"


@pytest.mark.slow
def test_correct_block_ports_agree_over_twenty_seeds():
    impls = {name: BLOCKS[name]() for name in installed()}
    for seed in range(20):
        params, x = block_params(seed)
        report = compare_implementations(impls, (params, x), seed=seed, order=2)
        assert report.ok, (seed, report)
        assert all(r.ratio <= 1 for r in report.leaves)


@pytest.mark.parametrize("bug, reference, where", list(pair_cases(BLOCK_BUGS, block_default_pairs())))
def test_each_block_porting_bug_is_caught_and_placed(bug, reference, where):
    params, x = block_params(3, zero_bias=bug == "dropped_bias")
    buggy = f"{where} (bug)"
    report = compare_implementations({reference: BLOCKS[reference](), buggy: (where, BLOCKS[where](bug))},
                                     (params, x), jacobian=False, finite_differences=bug == "custom_rule")
    check_placed(report, BLOCK_EXPECTED[bug], BLOCK_TAPS[::-1])
    if bug == "custom_rule":  # only the buggy side misses finite differences of itself
        assert report[buggy].result.check("vjp", "fd").status == "fail", report
        assert report[reference].result.check("vjp", "fd").status == "ok", report
    if bug == "stop_gradient":  # the report says why the buggy side has no cotangent there
        ln_1 = next(t for t in report.taps if t.name == "ln_1")
        assert "no cotangent reached it in " + buggy in ln_1.cotangent[0].message, report


def test_tensorflow_exact_gelu_is_off_in_float64():
    """A real defect only a float64 comparison shows: ``tf.nn.gelu(approximate=False)`` scales by
    ``math_ops.cast(0.7071067811865476, dtype)``, and casting a Python float makes a float32 tensor first, so
    in float64 its 1/sqrt(2) is 0.70710677 (relative error 1.7e-8). A TensorFlow port using it agrees with the
    others in float32 and is caught by the float64 runs, at the tap `gelu`."""
    skip = missing_reason("tensorflow")
    if skip:
        pytest.skip(skip)
    import tensorflow as tf
    from scipy.special import erf

    h = np.linspace(-3, 3, 61)
    exact = 0.5 * h * (1 + erf(h / SQRT2))
    off = np.max(np.abs(tf.nn.gelu(tf.constant(h), approximate=False).numpy() - exact))
    assert 1e-9 < off < 1e-7  # the float32 constant's size; erf itself is right to 1e-16 here
    assert np.max(np.abs(tf.math.erf(tf.constant(h)).numpy() - erf(h))) < 1e-15
    params, x = block_params(4)
    report = compare_implementations({"numpy": BLOCKS["numpy"](), "tensorflow": BLOCKS["tensorflow"]("tf_nn_gelu")},
                                     (params, x), jacobian=False, finite_differences=False)
    assert report.verdict == DISAGREE and report.first_forward_difference == "gelu", report
    gelu = next(t for t in report.taps if t.name == "gelu").forward[0]
    assert gelu.error <= gelu.threshold  # within float32 rounding...
    assert gelu.error64 > gelu.tolerance64  # ...and not in float64


def layer_norms():
    """A layer norm then tanh, on the tape and in TensorFlow by ``tf.nn.moments`` (Keras 2's LayerNormalization)."""
    import tensorflow as tf

    def numpy_ln(p, x):
        xp = unigrad.namespace(x)
        mu = xp.mean(x, axis=-1, keepdims=True)
        return xp.tanh((x - mu) / xp.sqrt(xp.mean((x - mu) ** 2, axis=-1, keepdims=True) + 1e-5) * p["weight"] +
                       p["bias"])

    def tensorflow_ln(p, x):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return tf.tanh(tf.nn.batch_normalization(x, mean, var, p["bias"], p["weight"], 1e-5))
    return numpy_ln, tensorflow_ln


def test_tensorflow_moments_have_a_wrong_second_derivative():
    """A real defect only a second-order comparison shows: ``tf.nn.moments`` (which Keras 2's
    LayerNormalization calls) computes the variance around ``stop_gradient(mean)``. The first derivative is
    right (the variance's derivative in the mean is zero at the mean), the second is not. A TensorFlow port
    using it agrees with the others to first order and differs in the JVP of the VJP, where TensorFlow's own
    answer also misses finite differences of itself."""
    skip = missing_reason("tensorflow")
    if skip:
        pytest.skip(skip)
    numpy_ln, tensorflow_ln = layer_norms()
    rng = np.random.default_rng(0)
    params = {"weight": (1 + 0.1 * rng.standard_normal(6)).astype("float32"),
              "bias": (0.1 * rng.standard_normal(6)).astype("float32")}
    x = rng.standard_normal((3, 6)).astype("float32")
    impls = {"numpy": numpy_ln, "tensorflow": tensorflow_ln}
    first = compare_implementations(impls, (params, x), argnums=(0, 1))
    assert first.ok, first
    report = compare_implementations(impls, (params, x), argnums=(0, 1), order=2, jacobian=False)
    assert report.verdict == DISAGREE
    assert {r.quantity for r in report.differences} == {"second"}, report
    assert "argument 1" in {r.leaf for r in report.differences}, report  # the input's, whose moments they are
    assert report["tensorflow"].result.check("second", "fd").status == "fail", report
    assert report["numpy"].result.check("second", "fd").status == "ok", report


@pytest.mark.slow
def test_a_keras_style_layer_norm_in_the_block_is_caught_at_second_order():
    """The same defect in the TensorFlow block (its layer norms by ``tf.nn.moments``): the Hessian-vector
    products of the attention's and ln_1's parameters differ."""
    skip = missing_reason("tensorflow")
    if skip:
        pytest.skip(skip)
    params, x = block_params(5)
    impls = {"numpy": BLOCKS["numpy"](), "tensorflow": BLOCKS["tensorflow"]("tf_nn_moments")}
    assert compare_implementations(impls, (params, x), jacobian=False, finite_differences=False).ok
    report = compare_implementations(impls, (params, x), order=2, jacobian=False)
    assert {r.quantity for r in report.differences} == {"second"}, report
    assert {r.leaf for r in report.differences} >= {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight"}, report
    assert report["tensorflow"].result.check("second", "fd").status == "fail", report


# ------------------------------------------------------------------------------------------------
# What a model-hub port taught compare_implementations: a Flax module computes in its own dtype (float32)
# whatever its inputs', a Keras layer refuses float64 weights beside float32 activations
# ------------------------------------------------------------------------------------------------

def _dense_tanh(p, x):
    xp = unigrad.namespace(x)
    return xp.tanh(x @ xp.matrix_transpose(p["weight"]) + p["bias"])


def _dense_tanh_in_float32(p, x):  # as a Flax module with dtype=float32: its "float64" run is float32
    xp = unigrad.namespace(x)
    w, b, x = (xp.astype(a, xp.float32) for a in (p["weight"], p["bias"], x))
    return xp.tanh(x @ xp.matrix_transpose(w) + b)


def _dense_tanh_refusing_float64(p, x):  # as a Keras layer: float64 weights beside float32 activations raise
    if any(a.dtype == np.float64 for a in (p["weight"], p["bias"])):
        raise TypeError("cannot compute MatMul as input #1 was expected to be a float tensor but is a double tensor")
    return _dense_tanh(p, x)


def _dense_inputs():
    rng = np.random.default_rng(0)
    return ({"weight": rng.standard_normal((3, 4)).astype("float32"), "bias": rng.standard_normal(3).astype("float32")},
            rng.standard_normal((5, 4)).astype("float32"))


def test_a_port_computing_in_float32_whatever_its_inputs_is_no_float64_reference():
    """Its float64 run returns float32: taken as a float64 reference, its float32 rounding broke the float64
    agreement (1e-9) and its finite differences (float64 steps read float32 rounding): a false alarm on a
    correct port. It is held to the fixed float32 tolerance instead, and the report says why."""
    report = compare_implementations({"ref": ("numpy", _dense_tanh), "port": ("numpy", _dense_tanh_in_float32)},
                                     _dense_inputs())
    assert report.ok, report
    assert report["ref"].rounding == "float64 run"
    assert report["port"].rounding == "none: given float64 inputs, it computed its outputs in float32"
    assert report["port"].result64 is None and report["port"].result.checks == []
    assert "port: not checked against finite differences: it computes in float32" in "\n".join(report.reasons)
    assert all(r.how.startswith("fixed: 0.0001") for r in report.leaves), report
    # and it still catches a bug in such a port: a dropped bias
    bad = compare_implementations({"ref": ("numpy", _dense_tanh),
                                   "port": ("numpy", lambda p, x: _dense_tanh_in_float32({**p, "bias": 0 * p["bias"]},
                                                                                          x))}, _dense_inputs())
    assert bad.verdict == DISAGREE and bad.differences[0].leaf in ("bias", "weight"), bad


def test_a_port_refusing_float64_is_compared_without_its_finite_differences():
    """Its float64 run fails, so finite differences run around the float32 point, whose perturbations are
    float64 and raise: that exception escaped compare_implementations. Now the comparisons stand and the report
    says the checks could not run."""
    report = compare_implementations({"ref": ("numpy", _dense_tanh), "port": ("numpy", _dense_tanh_refusing_float64)},
                                     _dense_inputs())
    assert report.ok, report
    assert report["port"].rounding.startswith("none: the float64 run failed (")
    assert "\n" not in report["port"].rounding
    assert any(line.startswith("port: not checked against finite differences: evaluating f there raised TypeError")
               for line in report.reasons), report.reasons
    assert all(c.status == "ok" for c in report["ref"].result.checks) and report["ref"].result.checks
