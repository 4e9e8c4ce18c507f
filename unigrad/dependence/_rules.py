"""The rule table: for each primitive (the tape's; a framework's, registered by its front-end with
:func:`register_rules` under a prefix), its class of dependence, which answers in both abstract domains.

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

_UNKNOWN = Rule("unknown", "nonlinear")

#: The prefixes front-ends registered rules under (``register_rules``): prefix -> whether its names are exact
#: (no variadic suffix to strip: TensorFlow's op types end in digits, MatMul, BatchMatMulV2).
PREFIXES: dict = {}


def register_rules(prefix: str, rules, *, exact: bool = False) -> None:
    """Add a front-end's operations to the rule table, under ``prefix`` (``"lax."``, ``"aten."``, ``"tf."``; a
    plugin's own): ``rules`` maps a space-separated string of operation names to the :class:`Rule` they all
    follow (``{"add sub neg": Rule("elementwise", "linear")}``). A front-end names its program's nodes
    ``prefix + name``; an operation without a rule is ``unknown`` (dense, a reason given: sound). ``exact``:
    names are looked up as they are (the tape's variadic primitives, ``concat2``, otherwise lose their digits).
    Registering again replaces the entries given."""
    if not (isinstance(prefix, str) and prefix.endswith(".")):
        raise ValueError(f"register_rules: prefix must be a string ending in '.'; got {prefix!r}")
    for names, rule in dict(rules).items():
        if not isinstance(rule, Rule):
            raise TypeError(f"register_rules: {names!r} must map to a Rule; got {type(rule).__name__}")
        _put(names, rule, prefix)
    PREFIXES[prefix] = exact


def rule_for(name: str) -> Rule:
    """The rule of the operation ``name`` (a tape primitive, or a front-end's ``prefix.name``); ``unknown``
    where there is none."""
    r = TABLE.get(name)
    if r is None:
        prefix, dot, _ = name.partition(".")
        if dot and PREFIXES.get(prefix + "."):  # exact names
            return _UNKNOWN
        base = name.rstrip("0123456789")  # the tape's variadic primitives: concat2, einsum3
        r = TABLE.get(base, _UNKNOWN)
    return r


def op_name(name: str) -> str:
    """``name`` without a registered front-end's prefix (``lax.scan`` -> ``scan``)."""
    prefix, dot, rest = name.partition(".")
    return rest if dot and prefix + "." in PREFIXES else name


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
