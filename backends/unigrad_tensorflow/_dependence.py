"""A TensorFlow graph as a :class:`~._program.Program`: native TensorFlow code for the same rules.

The graph is the ``FuncGraph`` of a ``tf.function`` (``get_concrete_function`` with ``tf.TensorSpec`` s),
or the operations a kernel being traced inside a ``tf.function`` has just added to it (the per-example
transforms read the operations ``f`` made, then add their own). Each operation becomes one node named
``tf.<OpType>`` in the rule table (:mod:`._rules`), its operands' static shapes read from the graph:

* ``Const`` values are known, and so is any operation whose operands are all known (folded eagerly,
  outside the graph): reduction indices, permutations, shapes, slice bounds, gather indices;
* ``Identity`` (and ``Snapshot``, ``IdentityN``) are the value they pass on;
* ``MatMul``/``BatchMatMulV2`` (their ``transpose``/``adj`` attributes, broadcast batch axes) and
  ``Einsum`` are products with labelled axes; ``BiasAdd`` a broadcast sum along its channel axis;
* reductions (``Sum``, ``Mean``, ``Max``...) read their axes, ``Cumsum``/``Cumprod`` their axis;
  ``Softmax``/``LogSoftmax`` act along the last axis, and so do the two results of
  ``SparseSoftmaxCrossEntropyWithLogits`` (the loss a reduction over it);
* structural operations (``Reshape``, ``Transpose``, ``ExpandDims``, ``Squeeze``, ``ConcatV2``,
  ``StridedSlice``, ``GatherV2`` with known indices, ``Tile``, ``Pad``...) run as the operation itself,
  eagerly, on arrays of row numbers -- exact for every one of them -- with their other operands known;
* ``GatherV2`` with indices computed in the graph reads its ``axis`` and ``batch_dims``.

An operation without a rule (``StatelessIf``, ``While``, a nested ``PartitionedCall``, anything not
listed) answers "unknown" in the row domain: the proof gives up and the caller probes; it never guesses.
"""

from __future__ import annotations

import functools
import inspect
import os

import numpy as np

from unigrad.dependence import Aval, Node, Program, Rule, register_rules

# TensorFlow graph operations (a FuncGraph), under "tf." with TensorFlow's op type names, which are exact
# (MatMul, BatchMatMulV2: no variadic suffix).
register_rules("tf.", [
    ("AddV2 Add AddN Sub Neg BiasAdd Cast Select SelectV2 Maximum Minimum Abs ClipByValue Real Imag Conj FloorMod "
         "Relu Relu6 LeakyRelu", Rule("elementwise", "linear")),
    ("Mul MulNoNan", Rule("elementwise", "bilinear")),
    ("RealDiv Div DivNoNan", Rule("elementwise", "divide")),
    ("Tanh Sigmoid Exp Expm1 Log Log1p Sqrt Rsqrt Square SquaredDifference Pow Reciprocal Inv Sin Cos Tan Asin "
         "Acos Atan Atan2 Sinh Cosh Asinh Acosh Atanh Softplus Softsign Elu Selu Gelu Erf Erfc Xlogy Xdivy Xlog1py "
         "Lgamma Digamma CrossEntropyOperands", Rule("elementwise", "nonlinear")),
    ("Less LessEqual Greater GreaterEqual Equal NotEqual LogicalAnd LogicalOr LogicalNot IsNan IsInf IsFinite "
         "Sign Floor Ceil Round Rint FloorDiv TruncateDiv Shape ShapeN Size Rank ZerosLike OnesLike ArgMax ArgMin "
         "StopGradient PreventGradient OneHot Range Cast.integer RandomUniform RandomStandardNormal "
         "StatelessRandomUniformV2 StatelessRandomNormalV2", Rule("zero")),
    ("Reshape Transpose ConjugateTranspose ExpandDims Squeeze ConcatV2 Concat Pack Unpack StridedSlice Slice "
         "GatherV2 GatherNd Tile Pad PadV2 MirrorPad ReverseV2 Roll BroadcastTo Split SplitV Fill MatrixDiagPartV3 "
         "MatrixBandPart", Rule("structural")),
    ("GatherV2.indexed", Rule("gather", "linear")),
    ("Sum Mean Max Min CrossEntropyLoss", Rule("reduce", "linear")),
    ("Prod EuclideanNorm", Rule("reduce", "nonlinear")),
    ("Cumsum", Rule("scan", "linear")),
    ("Cumprod CumulativeLogsumexp", Rule("scan", "nonlinear")),
    ("Softmax LogSoftmax SparseSoftmaxCrossEntropyWithLogits SoftmaxCrossEntropyWithLogits", Rule("lane", "nonlinear")),
    ("TopKV2 FFT IFFT RFFT IRFFT FFT2D IFFT2D RFFT2D IRFFT2D", Rule("lane", "linear")),
    ("Complex ComplexAbs", Rule("elementwise", "nonlinear")),
    ("MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 Einsum", Rule("einsum", "bilinear")),
], exact=True)

_FOLD_LIMIT = 1 << 16  # elements: larger results computed from constants alone stay unknown (FREE)

_ALIAS = frozenset({"Identity", "Snapshot", "EnsureShape", "CheckNumerics"})
_REDUCE = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "EuclideanNorm"})
_SCAN = frozenset({"Cumsum", "Cumprod", "CumulativeLogsumexp"})
_LAST_AXIS = frozenset({"Softmax", "LogSoftmax", "TopKV2", "FFT", "IFFT", "RFFT", "IRFFT"})
_LAST_TWO = frozenset({"FFT2D", "IFFT2D", "RFFT2D", "IRFFT2D"})
_NOT_DATA = {"Select": (0,), "SelectV2": (0,)}  # operand positions without a derivative
_STRUCTURAL_DATA = {"GatherV2": ("params",), "GatherNd": ("params",), "Fill": ("value",)}  # data operands by name (others: type T)



def graph_program(ops, inputs, outputs, ids=None, nodes_of=None) -> Program:
    """The program of TensorFlow graph operations ``ops`` (in the graph's order) with ``inputs`` (tensors:
    the batched values, placeholders or the results of earlier operations) and ``outputs`` (tensors).

    Tensors made by operations outside ``ops`` that are not ``inputs`` (captured values, variables) are
    constants: independent of the inputs, their values unknown. ``ids`` (a dict, when given) receives
    each tensor's value id (keyed by ``tensor.ref()``); ``nodes_of`` (a dict) the graph operation behind
    each node (keyed by ``id(node)``), for the user's line of an operation that mixes rows.
    """
    import tensorflow as tf

    vids, known = {}, {}
    count = [0]

    def new():
        count[0] += 1
        return count[0] - 1

    def shape_of(t):
        s = t.shape
        if s.rank is None or any(d is None for d in s.as_list()):
            raise ValueError(f"{t.name} has no static shape ({s})")
        return tuple(s.as_list())

    input_ids, input_shapes = [], []
    for t in inputs:
        vid = vids[t.ref()] = new()
        input_ids.append(vid)
        input_shapes.append(shape_of(t))
    nodes = []
    for op in ops:
        if all(o.ref() in vids for o in op.outputs) and op.outputs:
            continue  # an input made by this operation (a fresh identity of a placeholder)
        kind = op.type
        if kind == "Const":
            known[op.outputs[0].ref()] = tf.make_ndarray(op.get_attr("value"))
            continue
        ins = list(op.inputs)
        if kind in _ALIAS or kind == "IdentityN":
            for k, o in enumerate(op.outputs):
                src = ins[k] if kind == "IdentityN" else ins[0]
                if src.ref() in vids:
                    vids[o.ref()] = vids[src.ref()]
                elif src.ref() in known:
                    known[o.ref()] = known[src.ref()]
            continue
        if op.outputs and not any(i.ref() in vids for i in ins) and not op.op_def.is_stateful \
                and not ins_of_resource(ins) and all(i.ref() in known for i in ins):
            value = _fold(op, [known[i.ref()] for i in ins])  # computed from constants alone
            if value is not None:
                for o, v in zip(op.outputs, value):
                    known[o.ref()] = v
                continue
        if not any(i.ref() in vids for i in ins):
            continue  # independent of the inputs (a constant, a capture, a random draw): FREE
        outs = [new() for _ in op.outputs]
        for o, vid in zip(op.outputs, outs):
            vids[o.ref()] = vid
        try:
            out_shapes = [shape_of(o) for o in op.outputs]
            made = _nodes(op, ins, outs, out_shapes, vids, known, shape_of, new)
        except Exception as exc:  # shapes unknown, an attribute unread: the proof gives up here
            made = [Node(f"tf.{kind}", None, [], {k: vids[i.ref()] for k, i in enumerate(ins) if i.ref() in vids},
                         {"unreadable": f"{type(exc).__name__}: {exc}"}, outs, [()] * len(outs))]
            made[0].name = f"tf.unreadable.{kind}"
        for node in made:
            if nodes_of is not None:
                nodes_of[id(node)] = op
            nodes.append(node)
    out_ids, out_shapes = [], []
    for t in outputs:
        out_ids.append(vids.get(t.ref()))
        out_shapes.append(shape_of(t))
    if ids is not None:
        ids.update(vids)
    return Program(input_ids, input_shapes, nodes, out_ids, out_shapes)


def ins_of_resource(ins):
    import tensorflow as tf
    return any(i.dtype == tf.resource or i.dtype == tf.variant for i in ins)


def _aval(t, shape_of):
    return Aval(shape_of(t), t.dtype)


def _axes(value, nd):
    axes = np.asarray(value).reshape(-1)
    return tuple(int(a) % nd - nd for a in axes) if nd else ()


def _nodes(op, ins, outs, out_shapes, vids, known, shape_of, new):
    """The nodes of one graph operation that depends on the inputs."""
    kind = op.type
    name = f"tf.{kind}"
    traced = {k: vids[i.ref()] for k, i in enumerate(ins) if i.ref() in vids}
    avals = [known[i.ref()] if i.ref() in known else _aval(i, shape_of) for i in ins]
    all_pos = frozenset(range(len(ins)))
    if kind == "Cast":
        floating = op.get_attr("DstT").is_floating or op.get_attr("DstT").is_complex
        if not floating:
            return [Node("tf.Cast.integer", None, avals, {}, {}, outs, out_shapes)]
        return [Node(name, None, avals, traced, {}, outs, out_shapes, data=all_pos)]
    if kind in _REDUCE:
        nd = len(avals[0].shape)
        if 1 not in known_positions(ins, known):
            return [_unknown(name, traced, outs, out_shapes, "reduction axes computed in the graph")]
        params = {"axis": _axes(known[ins[1].ref()], nd), "keepdims": bool(op.get_attr("keep_dims"))}
        return [Node(name, None, avals[:1], {0: traced[0]} if 0 in traced else {}, params, outs, out_shapes,
                     data=frozenset({0}))]
    if kind in _SCAN:
        if ins[1].ref() not in known:
            return [_unknown(name, traced, outs, out_shapes, "scan axis computed in the graph")]
        nd = len(avals[0].shape)
        params = {"axis": _axes(known[ins[1].ref()], nd)}
        return [Node(name, None, avals[:1], {0: traced[0]} if 0 in traced else {}, params, outs, out_shapes,
                     data=frozenset({0}))]
    if kind in _LAST_AXIS or kind in _LAST_TWO:
        params = {"axis": -1 if kind in _LAST_AXIS else (-2, -1)}
        return [Node(name, None, avals[:1], {0: traced[0]} if 0 in traced else {}, params, outs, out_shapes,
                     data=frozenset({0}))]
    if kind in ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"):
        # the loss: a reduction over the classes of the logits (and, dense, the labels) combined elementwise;
        # the second result (the loss's gradient): each class from the whole lane
        data = frozenset({0}) if kind.startswith("Sparse") else all_pos
        t = {k: v for k, v in traced.items() if k in data}
        made = []
        if len(t) > 1:
            both = new()
            made.append(Node("tf.CrossEntropyOperands", None, avals, t, {}, [both], [tuple(avals[0].shape)],
                             data=data))
            t, avals_loss = {0: both}, [Aval(avals[0].shape, None)]
        else:
            avals_loss = avals
        made.append(Node("tf.CrossEntropyLoss", None, avals_loss, t, {"axis": (-1,), "keepdims": False},
                         outs[:1], out_shapes[:1], data=frozenset({0}) if len(avals_loss) == 1 else data))
        made.append(Node(f"tf.{kind}", None, avals, {k: v for k, v in traced.items() if k in data}, {"axis": -1},
                         outs[1:], out_shapes[1:], data=data))
        return made
    if kind in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"):
        labels, out = _product_labels(op, [len(a.shape) for a in avals], [a.shape for a in avals])
        return [Node(name, None, avals, traced, {"labels": labels, "out": out}, outs, out_shapes, data=all_pos)]
    if kind == "BiasAdd":
        bias = avals[1]
        if op.get_attr("data_format") in (b"NCHW", "NCHW") and len(avals[0].shape) > 2:
            bias = Aval(tuple(bias.shape) + (1,) * (len(avals[0].shape) - 2), bias.dtype)
        return [Node(name, None, [avals[0], bias], traced, {}, outs, out_shapes, data=all_pos)]
    if kind == "GatherV2" and ins[1].ref() not in known:
        if ins[2].ref() not in known:
            return [_unknown(name, traced, outs, out_shapes, "gather axis computed in the graph")]
        nd = len(avals[0].shape)
        axis = int(np.asarray(known[ins[2].ref()])) % nd
        batch_dims = int(op.get_attr("batch_dims"))
        if batch_dims < 0:
            batch_dims += len(avals[1].shape)
        params = {"axis": axis, "batch_dims": batch_dims, "index_rank": len(avals[1].shape)}
        return [Node("tf.GatherV2.indexed", None, avals, {0: traced[0]} if 0 in traced else {}, params, outs,
                     out_shapes, data=frozenset({0}))]
    from unigrad.dependence import rule_for
    if rule_for(name).kind == "structural":
        data = _structural_data(op)
        t = {k: v for k, v in traced.items() if k in data}
        if set(traced) - data:
            return [_unknown(name, traced, outs, out_shapes, "an index operand computed from the input")]
        # one node per result (Unpack, Split): each its own result of the operation on row numbers
        return [Node(name, _runner(op, k), avals, t, {}, [vid], [shape], data=data)
                for k, (vid, shape) in enumerate(zip(outs, out_shapes))]
    data = all_pos - frozenset(_NOT_DATA.get(kind, ()))
    if rule_for(name).kind == "zero":  # no derivative flows through (a comparison, a shape): nothing traced
        data = frozenset()
    return [Node(name, None, avals, {k: v for k, v in traced.items() if k in data}, {}, outs, out_shapes, data=data)]


def known_positions(ins, known):
    return {k for k, i in enumerate(ins) if i.ref() in known}


def _unknown(name, traced, outs, out_shapes, why):
    return Node(f"{name} ({why})", None, [], traced, {}, outs, out_shapes)


def _product_labels(op, ranks, shapes):
    """(labels per operand, out labels) of a matrix product or an Einsum, as a tape einsum has them."""
    kind = op.type
    if kind == "Einsum":
        equation = op.get_attr("equation")
        equation = equation.decode() if isinstance(equation, bytes) else equation
        if "..." in equation or "->" not in equation:
            raise ValueError(f"einsum {equation!r}: only explicit labels are read")
        lhs, out = equation.replace(" ", "").split("->")
        return [tuple(s) for s in lhs.split(",")], tuple(out)
    if kind == "MatMul":
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    else:
        ta, tb = op.get_attr("adj_x"), op.get_attr("adj_y")
    ra, rb = ranks
    nb = max(ra, rb) - 2
    batch = [f"b{k}" for k in range(nb)]
    la = batch[nb - (ra - 2):] + (["k", "m"] if ta else ["m", "k"])
    lb = batch[nb - (rb - 2):] + (["n", "k"] if tb else ["k", "n"])
    # a batch axis of size 1 broadcast against a longer one is not the same axis: a label of its own
    sa, sb = shapes
    for q in range(nb):
        ia, ib = q - nb + (ra - 2), q - nb + (rb - 2)
        if ia >= 0 and ib >= 0 and sa[ia] != sb[ib]:
            if sa[ia] == 1:
                la[ia] = f"a{q}"
            elif sb[ib] == 1:
                lb[ib] = f"c{q}"
    out = batch + ["m", "n"]
    return [tuple(la), tuple(lb)], tuple(out)


def _structural_data(op):
    names = _STRUCTURAL_DATA.get(op.type)
    positions, k = set(), 0
    for arg in op.op_def.input_arg:
        n = _arg_count(op, arg)
        is_data = arg.name in names if names else arg.type_attr == "T"
        if is_data:
            positions.update(range(k, k + n))
        k += n
    return frozenset(positions)


def _arg_count(op, arg):
    if arg.number_attr:
        return int(op.get_attr(arg.number_attr))
    if arg.type_list_attr:
        return len(op.get_attr(arg.type_list_attr))
    return 1


def _raw_call(op, values):
    """Run the operation ``op`` eagerly (outside any graph being built) on NumPy ``values`` for its
    operands, with its own attributes; returns its results as NumPy arrays."""
    import tensorflow as tf

    raw = getattr(tf.raw_ops, op.type)
    names = _raw_names(op.type)  # (raw_ops may rename an input or attribute: ExpandDims' dim, Squeeze's squeeze_dims)
    kwargs, k = {}, 0
    for arg, name in zip(op.op_def.input_arg, names):
        n = _arg_count(op, arg)
        if arg.number_attr or arg.type_list_attr:
            kwargs[name] = [values[j] for j in range(k, k + n)]
        else:
            kwargs[name] = values[k]
        k += n
    skip = {arg.number_attr for arg in op.op_def.input_arg if arg.number_attr}
    attrs = [a.name for a in op.op_def.attr if a.type not in ("type", "list(type)") and a.name not in skip]
    for attr, name in zip(attrs, names[len(op.op_def.input_arg):]):
        kwargs[name] = op.get_attr(attr)
    with tf.init_scope(), tf.device("/CPU:0"):
        out = raw(**kwargs)
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(o) for o in outs]


@functools.lru_cache(maxsize=None)
def _raw_names(op_type):
    """The keyword names of ``tf.raw_ops.<op_type>``'s parameters: its inputs, then its attributes that
    are not inferred, in the order of the op's definition."""
    import tensorflow as tf

    return tuple(k for k in inspect.signature(getattr(tf.raw_ops, op_type)).parameters if k != "name")


def _fold(op, values):
    try:
        outs = _raw_call(op, values)
    except Exception:
        return None
    if sum(o.size for o in outs) > _FOLD_LIMIT:
        return None
    return outs


def _runner(op, k=0):
    """The operation on NumPy operands (the structural rules apply it to arrays of row numbers): data
    operands as int64, the others as they are known; its result ``k``."""
    data = _structural_data(op)
    if op.type in ("Reshape", "ExpandDims", "Squeeze"):
        shape = tuple(op.outputs[0].shape.as_list())
        return lambda x, *_: np.reshape(x, shape)

    def fn(*values):
        vals = [np.asarray(v, dtype=np.int64) if j in data else v for j, v in enumerate(values)]
        return _raw_call(op, vals)[k]
    return fn


# ------------------------------------------------------------------------------------ the user's line

def op_site(op):
    """``file:line (in name)`` of the innermost frame of ``op``'s traceback outside unigrad, its backends
    and the installed libraries; None when there is none."""
    import unigrad

    skip = (os.path.dirname(os.path.abspath(unigrad.__file__)),
            os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(unigrad.__file__))), "backends"))
    try:
        frames = list(op.traceback)
    except Exception:
        return None
    for frame in reversed(frames):
        name = frame.filename
        if not (name.startswith(skip) or "site-packages" in name or name.startswith("<")):
            return f"{os.path.basename(name)}:{frame.lineno} (in {frame.name})"
    return None
