"""The rule table: for each primitive (the tape's names and JAX's), its class of dependence, which
answers in both abstract domains.

* Element index sets (:mod:`._sets`): which inputs each element of a value depends on, a boolean
  ``scipy.sparse`` matrix (elements x inputs), and for Hessians the pairs of inputs that interact
  non-linearly. Structural operations apply the primitive's own implementation to an integer array
  of element codes (``1 + flat index``, 0 for "no element"), so one rule is exact for reshape,
  transpose, slicing, gathers, concatenation, flips, rolls, broadcasts, pads...
* Batch rows (:mod:`._rows`): each value is FREE (independent of the batch), ROW along a negative
  axis d (its row i depends on input row i only), or MIXED (with the node that mixed rows).

Every class is sound: where a rule cannot be exact it answers a larger set (never a smaller one); an
unknown primitive answers "dense" (every output element depends on everything its inputs depend on)
with a reason, and in the row domain "unknown" (the caller falls back to a probe).
"""

from __future__ import annotations

import math

import numpy as np

# ---------------------------------------------------------------------------------------- classes
# kind: "elementwise" | "structural" | "reduce" | "scan" | "lane" | "matmul" | "einsum" | "core"
#       | "take" (a gather along an axis, the index an operand without derivative) | "linear_probe" | "zero"
#       | "per_sample" (each example's output from its own input alone: the batch on axis 0 of the
#         operand positions in ``extra["rows"]`` stays on axis 0 of every output; a convolution, a pooling)
#       | "call" | "loop" (a jaxpr scan or while: its body iterated to a fixed point) | "scatter" | "unknown"
# order: "linear" (no second derivative), "bilinear" (products of distinct operands), "divide",
#        "nonlinear"


class Rule:
    __slots__ = ("kind", "order", "extra")

    def __init__(self, kind, order="linear", **extra):
        self.kind, self.order, self.extra = kind, order, extra

    def __repr__(self):
        return f"Rule({self.kind!r}, {self.order!r})"


TABLE: dict = {}


def _put(names, rule, ns=""):
    for n in names.split():
        TABLE[ns + n] = rule


# the tape's primitives
_put("negative positive add subtract real imag conj astype deg2rad rad2deg where clip abs fabs maximum "
     "minimum fmax fmin copysign remainder", Rule("elementwise", "linear"))
_put("multiply", Rule("elementwise", "bilinear"))
_put("divide", Rule("elementwise", "divide"))
_put("exp expm1 log log1p log2 log10 sqrt sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh square exp2 "
     "sinc reciprocal sigmoid pow atan2 hypot logaddexp logaddexp2", Rule("elementwise", "nonlinear"))
_put("sign floor ceil trunc round equal not_equal less less_equal greater greater_equal isnan isinf isfinite "
     "signbit logical_and logical_or logical_xor logical_not floor_divide nextafter bitwise_and bitwise_or "
     "bitwise_xor bitwise_invert bitwise_left_shift bitwise_right_shift", Rule("zero"))
_put("reshape broadcast_to permute_dims matrix_transpose flip roll concat getitem take_along_axis",
     Rule("structural"))
_put("sum max min", Rule("reduce", "linear"))
_put("prod", Rule("reduce", "nonlinear"))
_put("cumsum", Rule("scan", "linear"))
_put("fft rfft irfft", Rule("lane", "linear"))
_put("matmul", Rule("matmul", "bilinear"))
_put("einsum", Rule("einsum", "bilinear"))
_put("inv det", Rule("core", "nonlinear", core_in=2, core_out=None))
_put("solve", Rule("core", "nonlinear", core_in=2, core_out=None))
_put("slogdet cholesky eigh eig svd qr pinv", Rule("core", "nonlinear", core_in=2, core_out=1))
_put("scatter_add put_along_add", Rule("linear_probe", "linear"))

# JAX's primitives (jaxpr), under "lax."
_put("neg add_any sub convert_element_type copy copy_p real_ imag_ reduce_precision select_n clamp max min "
     "add_jaxvals abs", Rule("elementwise", "linear"), "lax.")
_put("add", Rule("elementwise", "linear"), "lax.")
_put("mul", Rule("elementwise", "bilinear"), "lax.")
_put("div", Rule("elementwise", "divide"), "lax.")
_put("exp exp2 log log1p expm1 sqrt rsqrt cbrt sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh "
     "logistic integer_pow pow atan2 erf erfc erf_inv lgamma digamma square tan",
     Rule("elementwise", "nonlinear"), "lax.")
_put("sign floor ceil round is_finite eq ne lt le gt ge and or not xor iota argmax argmin stop_gradient "
     "shift_left shift_right_logical shift_right_arithmetic population_count nextafter rem_int random_bits "
     "random_seed random_wrap random_unwrap threefry2x32", Rule("zero"), "lax.")
_put("reshape transpose broadcast_in_dim squeeze expand_dims slice dynamic_slice concatenate pad rev gather tile "
     "dynamic_update_slice", Rule("structural"), "lax.")
_put("reduce_sum reduce_max reduce_min", Rule("reduce", "linear"), "lax.")
_put("reduce_prod", Rule("reduce", "nonlinear"), "lax.")
_put("cumsum cummax cummin", Rule("scan", "linear"), "lax.")
_put("cumprod cumlogsumexp", Rule("scan", "nonlinear"), "lax.")
_put("sort", Rule("lane", "linear"), "lax.")
_put("dot_general", Rule("einsum", "bilinear"), "lax.")
_put("pjit closed_call core_call custom_jvp_call custom_vjp_call custom_vjp_call_jaxpr remat remat2 checkpoint "
     "custom_lin jit", Rule("call"), "lax.")
_put("scan while", Rule("loop"), "lax.")
_put("scan_index scan_stack", Rule("structural"), "lax.")  # an unrolled scan's slices and stacked outputs
_put("scatter scatter-add scatter_add scatter-sub scatter_sub scatter-min scatter_min scatter-max scatter_max",
     Rule("scatter", "linear"), "lax.")
_put("scatter-mul scatter_mul", Rule("scatter", "nonlinear"), "lax.")
_put("cond", Rule("call", branches=True), "lax.")

# ATen operations (a torch.fx graph, see ._fx), under "aten."
_put("add sub rsub neg clone _to_copy alias lift_fresh_copy where clamp clamp_min clamp_max abs maximum minimum "
     "masked_fill remainder fmod positive conj real imag", Rule("elementwise", "linear"), "aten.")
_put("mul", Rule("elementwise", "bilinear"), "aten.")
_put("div", Rule("elementwise", "divide"), "aten.")
_put("tanh exp exp2 log log2 log10 log1p expm1 sqrt rsqrt sin cos tan asin acos atan sinh cosh asinh acosh atanh "
     "sigmoid relu gelu silu softplus elu leaky_relu hardtanh erf erfc reciprocal pow atan2 logit square xlogy "
     "mish hardsigmoid hardswish threshold", Rule("elementwise", "nonlinear"), "aten.")
_put("eq ne lt le gt ge sign floor ceil round trunc logical_and logical_or logical_not logical_xor bitwise_and "
     "bitwise_or bitwise_not bitwise_xor isnan isinf isfinite ones_like zeros_like full_like empty_like "
     "scalar_tensor arange full zeros ones empty new_zeros new_ones new_full new_empty argmax argmin detach "
     "_local_scalar_dense rand rand_like randn randn_like randint bernoulli", Rule("zero"), "aten.")
_put("reshape permute_dims t transpose expand unsqueeze squeeze select slice cat stack flip roll index "
     "index_select narrow repeat constant_pad_nd diagonal", Rule("structural"), "aten.")
_put("sum mean amax amin nll_loss_reduced", Rule("reduce", "linear"), "aten.")
_put("prod logsumexp var std norm linalg_vector_norm", Rule("reduce", "nonlinear"), "aten.")
_put("cumsum", Rule("scan", "linear"), "aten.")
_put("cumprod logcumsumexp", Rule("scan", "nonlinear"), "aten.")
_put("_softmax _log_softmax native_layer_norm", Rule("lane", "nonlinear"), "aten.")
_put("mm bmm", Rule("matmul", "bilinear"), "aten.")
_put("gather nll_loss_forward", Rule("take", "linear"), "aten.")
_put("convolution max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices "
     "max_pool3d_with_indices avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d _adaptive_avg_pool2d "
     "_adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d native_group_norm native_batch_norm_eval "
     "reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d "
     "upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d "
     "upsample_linear1d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d",
     Rule("per_sample", "nonlinear", rows=(0,)), "aten.")  # (each over the axes after the first two only)
_put("embedding", Rule("per_sample", "linear", rows=()), "aten.")  # a lookup in its weight (never a row)
_put("_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_attention_math "
     "_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention",
     Rule("per_sample", "nonlinear", rows=(0, 1, 2)), "aten.")  # queries, keys, values: (B, heads, T, d)
_put("native_batch_norm_training", Rule("lane", "nonlinear"), "aten.")  # statistics over the batch

# TensorFlow graph operations (a FuncGraph, see ._tfgraph), under "tf." with TensorFlow's op type names
_put("AddV2 Add AddN Sub Neg BiasAdd Cast Select SelectV2 Maximum Minimum Abs ClipByValue Real Imag Conj FloorMod "
     "Relu Relu6 LeakyRelu", Rule("elementwise", "linear"), "tf.")
_put("Mul MulNoNan", Rule("elementwise", "bilinear"), "tf.")
_put("RealDiv Div DivNoNan", Rule("elementwise", "divide"), "tf.")
_put("Tanh Sigmoid Exp Expm1 Log Log1p Sqrt Rsqrt Square SquaredDifference Pow Reciprocal Inv Sin Cos Tan Asin "
     "Acos Atan Atan2 Sinh Cosh Asinh Acosh Atanh Softplus Softsign Elu Selu Gelu Erf Erfc Xlogy Xdivy Xlog1py "
     "Lgamma Digamma CrossEntropyOperands", Rule("elementwise", "nonlinear"), "tf.")
_put("Less LessEqual Greater GreaterEqual Equal NotEqual LogicalAnd LogicalOr LogicalNot IsNan IsInf IsFinite "
     "Sign Floor Ceil Round Rint FloorDiv TruncateDiv Shape ShapeN Size Rank ZerosLike OnesLike ArgMax ArgMin "
     "StopGradient PreventGradient OneHot Range Cast.integer RandomUniform RandomStandardNormal "
     "StatelessRandomUniformV2 StatelessRandomNormalV2", Rule("zero"), "tf.")
_put("Reshape Transpose ConjugateTranspose ExpandDims Squeeze ConcatV2 Concat Pack Unpack StridedSlice Slice "
     "GatherV2 GatherNd Tile Pad PadV2 MirrorPad ReverseV2 Roll BroadcastTo Split SplitV Fill MatrixDiagPartV3 "
     "MatrixBandPart", Rule("structural"), "tf.")
_put("GatherV2.indexed", Rule("gather", "linear"), "tf.")
_put("Sum Mean Max Min CrossEntropyLoss", Rule("reduce", "linear"), "tf.")
_put("Prod EuclideanNorm", Rule("reduce", "nonlinear"), "tf.")
_put("Cumsum", Rule("scan", "linear"), "tf.")
_put("Cumprod CumulativeLogsumexp", Rule("scan", "nonlinear"), "tf.")
_put("Softmax LogSoftmax SparseSoftmaxCrossEntropyWithLogits SoftmaxCrossEntropyWithLogits", Rule("lane", "nonlinear"),
     "tf.")
_put("TopKV2 FFT IFFT RFFT IRFFT FFT2D IFFT2D RFFT2D IRFFT2D", Rule("lane", "linear"), "tf.")
_put("Complex ComplexAbs", Rule("elementwise", "nonlinear"), "tf.")
_put("MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 Einsum", Rule("einsum", "bilinear"), "tf.")

_UNKNOWN = Rule("unknown", "nonlinear")


def rule_for(name: str) -> Rule:
    r = TABLE.get(name)
    if r is None and name.startswith("tf."):  # TensorFlow's op types are exact names (MatMul, BatchMatMulV2)
        return _UNKNOWN
    if r is None:
        base = name.rstrip("0123456789")  # the tape's variadic primitives: concat2, einsum3
        r = TABLE.get(base, _UNKNOWN)
    return r


# ------------------------------------------------------------------------------ shared helpers

def codes(shape, start=1):
    """Element codes ``start + flat index`` in ``shape`` (int64)."""
    return np.arange(start, start + math.prod(shape), dtype=np.int64).reshape(shape)


def neg_axes(axis, ndim):
    if axis is None:
        return tuple(range(-ndim, 0))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    return tuple(sorted(int(a) - ndim if a >= 0 else int(a) for a in axis))


def einsum_spec(node):
    """(labels per operand, out labels) of a tape einsum or a jaxpr dot_general."""
    if "labels" in node.params:  # a tape einsum, a TensorFlow product
        return [tuple(lab) for lab in node.params["labels"]], tuple(node.params["out"])
    (lc, rc), (lb, rb) = node.params["dimension_numbers"]
    ls, rs = node.shape(0), node.shape(1)
    lab_l = [None] * len(ls)
    lab_r = [None] * len(rs)
    nxt = 0
    out = []
    for a, b in zip(lb, rb):
        lab_l[a] = lab_r[b] = nxt
        out.append(nxt)
        nxt += 1
    for a, b in zip(lc, rc):
        lab_l[a] = lab_r[b] = nxt
        nxt += 1
    for k in range(len(ls)):
        if lab_l[k] is None:
            lab_l[k] = nxt
            out.append(nxt)
            nxt += 1
    for k in range(len(rs)):
        if lab_r[k] is None:
            lab_r[k] = nxt
            out.append(nxt)
            nxt += 1
    return [tuple(lab_l), tuple(lab_r)], tuple(out)


def reduce_axes(node, ndim):
    """Negative axes reduced, and keepdims, of a tape or jaxpr reduction."""
    p = node.params
    if "axes" in p:  # jaxpr
        return neg_axes(p["axes"], ndim), False
    return neg_axes(p.get("axis"), ndim), bool(p.get("keepdims", False))


def lane_axes(node, ndim):
    """Negative axes along which every output element depends on the whole lane."""
    p = node.params
    if "axis" in p:
        return neg_axes(p["axis"], ndim)
    if "dimension" in p:
        return neg_axes(p["dimension"], ndim)
    if "fft_lengths" in p:
        return tuple(range(-len(p["fft_lengths"]), 0))
    return tuple(range(-ndim, 0))
