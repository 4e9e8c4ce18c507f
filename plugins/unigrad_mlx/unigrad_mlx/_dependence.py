"""An MLX program as a :class:`unigrad.dependence.Program`: MLX-native code for the proofs and patterns.

``mx.export_function`` with a callback (MLX's public, still experimental export API) hands over the
traced program of ``f`` at the primals' shapes: its inputs, its constants (with their values) and each
primitive with its arguments, operands and results (names, shapes, dtypes). Each primitive becomes one
node named ``mlx.<Primitive>`` in unigrad's rule table (registered below); a few need reading:

* ``Reduce`` (``[type, axes]``: sum, prod, min, max; and/or have no derivative) keeps the reduced axes,
  which a ``Squeeze`` then drops; ``Scan`` (``[type, axis, reverse, inclusive]``) is a cumulative
  operation; ``LogSumExp`` and ``Softmax`` act along the last axis;
* ``Matmul`` is a product with labelled axes (broadcast batch axes); ``AddMM`` that product, then a sum;
* structural primitives (``Reshape``, ``Transpose``, ``Slice``, ``ExpandDims``, ``Squeeze``,
  ``Concatenate``, ``Broadcast``, ``Split``, ``Pad``, ``Flatten``, and ``Gather``/``GatherAxis`` at known
  indices) run here, in NumPy, on arrays of element numbers -- exact for each;
* constants, and what primitives compute from constants alone (``Arange``, a ``Broadcast`` of a
  scalar, index arithmetic), are folded where the operation is one of those above: a gather's indices
  built from them are known. A constant that is one of the arrays the call passes in ``unknown`` (equal
  to it in shape, dtype and value: MLX does not keep the Python object) is not read.

Everything else -- a gather at indices computed from the input, a scatter, a convolution, a custom
function, any primitive not listed -- has no rule: the proof of rows answers "unknown" (the core then
probes) and a sparsity pattern widens with the reason. It never guesses. ``mx.stop_gradient`` leaves
no trace in an exported program, so the program sees the dependence it cuts: larger, never smaller.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from unigrad.dependence import Aval, Node, Program, Rule, register_rules

register_rules("mlx.", [
    ("Add Subtract Negative Abs Maximum Minimum Select Full Copy Real Imag Conjugate Remainder "
         "AsType.float", Rule("elementwise", "linear")),
    ("Multiply", Rule("elementwise", "bilinear")),
    ("Divide", Rule("elementwise", "divide")),
    ("Exp Expm1 Log Log1p Sqrt Square Sin Cos Tan ArcSin ArcCos ArcTan ArcTan2 Sinh Cosh Tanh ArcSinh ArcCosh "
         "ArcTanh Sigmoid Erf ErfInv Power LogAddExp", Rule("elementwise", "nonlinear")),
    ("Equal NotEqual Less LessEqual Greater GreaterEqual LogicalNot LogicalAnd LogicalOr Floor Ceil Round Sign "
         "IsNaN IsInf ArgReduce ArgSort ArgPartition AsType.integer Reduce.logical Arange StopGradient "
         "BitwiseBinary BitwiseInvert FloorDivide", Rule("zero")),
    ("Reshape Flatten Unflatten Transpose Slice ExpandDims Squeeze Concatenate Broadcast Split Pad Gather "
         "GatherAxis", Rule("structural")),
    ("Reduce.sum Reduce.min Reduce.max", Rule("reduce", "linear")),
    ("Reduce.prod LogSumExp", Rule("reduce", "nonlinear")),
    ("Scan.sum Scan.min Scan.max", Rule("scan", "linear")),
    ("Scan.prod Scan.logaddexp", Rule("scan", "nonlinear")),
    ("Softmax", Rule("lane", "nonlinear")),
    ("Sort Partition", Rule("lane", "linear")),
    ("Matmul", Rule("einsum", "bilinear")),
], exact=True)

_REDUCE = {0: "logical", 1: "logical", 2: "sum", 3: "prod", 4: "min", 5: "max"}  # mlx Reduce::ReduceType
_SCAN = {0: "max", 1: "min", 2: "sum", 3: "prod", 4: "logaddexp"}  # mlx Scan::ReduceType
_NOT_DATA = {"Select": (0,)}  # operand positions that carry no derivative
_INDEXED = frozenset({"Gather", "GatherAxis"})  # structural with index operands after the first
_FOLD_LIMIT = 1 << 16  # elements: larger values computed from constants alone are not kept



def export_program(f, primals, *, has_aux=False, unknown=()) -> Program:
    """The program of ``f`` (flat: primals to a tuple of outputs; ``(outputs, aux)`` with ``has_aux``) at
    the primals' shapes and dtypes, read from ``mx.export_function``. ``unknown``: arrays ``f`` closes over
    whose values the program must not read (the core's non-differentiated arguments)."""
    def outputs(*p):
        result = f(*p)
        return tuple(result[0]) if has_aux else tuple(result)

    records = []
    mx.export_function(records.append, outputs, *primals)
    hidden = [_host(a) for a in unknown if isinstance(a, mx.array)]
    return _program(records, hidden)


def _host(a):
    if a.dtype == mx.bfloat16:
        a = a.astype(mx.float32)
    return np.array(a)


def _is_hidden(value, hidden):
    return any(h.shape == value.shape and h.dtype == value.dtype and np.array_equal(h, value, equal_nan=True)
               for h in hidden)


def _program(records, hidden) -> Program:
    vids, known, avals = {}, {}, {}
    count = [0]

    def new():
        count[0] += 1
        return count[0] - 1

    inputs, input_shapes, nodes = [], [], []
    out_names = []
    for record in records:
        kind = record["type"]
        if kind in ("inputs", "keyword_inputs"):
            for name, shape, dtype in record.get("inputs", record.get("keywords", ())):
                vids[name] = new()
                avals[name] = Aval(shape, dtype)
                inputs.append(vids[name])
                input_shapes.append(tuple(shape))
        elif kind == "outputs":
            out_names = [(name, tuple(shape)) for name, shape, _ in record["outputs"]]
        elif kind == "constants":
            for name, value in record["constants"]:
                host = _host(value)
                avals[name] = Aval(host.shape, value.dtype)
                if not _is_hidden(host, hidden):
                    known[name] = host
        elif kind == "primitive":
            nodes.extend(_primitive(record, vids, known, avals, new))
    outputs = [vids.get(name) for name, _ in out_names]
    return Program(inputs, input_shapes, nodes, outputs, [shape for _, shape in out_names])


def _primitive(record, vids, known, avals, new):
    """The nodes of one primitive (none where it does not depend on the inputs; its value folded where
    its operands are known and it is one of the operations run here)."""
    name, args = record["name"], record["arguments"]
    ins = [n for n, _, _ in record["inputs"]]
    outs = record["outputs"]
    for n, shape, dtype in outs:
        avals[n] = Aval(shape, dtype)
    if not any(n in vids for n in ins):
        if all(n in known for n in ins):
            try:
                values = _run(name, args, [known[n] for n in ins], [tuple(o[1]) for o in outs], [o[2] for o in outs])
            except Exception:  # not an operation run here: its value stays unknown (and independent of f's inputs)
                values = None
            if values is not None and sum(v.size for v in values) <= _FOLD_LIMIT:
                for (n, _, _), v in zip(outs, values):
                    known[n] = v
        return []
    out_ids = [new() for _ in outs]
    for (n, _, _), vid in zip(outs, out_ids):
        vids[n] = vid
    out_shapes = [tuple(o[1]) for o in outs]
    operands = [known[n] if n in known else avals[n] for n in ins]
    traced = {k: vids[n] for k, n in enumerate(ins) if n in vids}
    everything = frozenset(range(len(ins)))

    def node(label, data, params=None, fn=None, operand_list=None, out=None, shapes=None):
        return Node(f"mlx.{label}", fn, operands if operand_list is None else operand_list,
                    {k: v for k, v in traced.items() if k in data}, params or {},
                    out_ids if out is None else out, out_shapes if shapes is None else shapes, data=data)

    if name == "AsType":
        floating = np.dtype(_np_dtype(args[0])).kind in "fc"
        return [node("AsType.float" if floating else "AsType.integer", everything if floating else frozenset())]
    if name == "Reduce":
        label = f"Reduce.{_REDUCE.get(int(args[0]), 'unknown')}"
        return [node(label, frozenset({0}) if label != "Reduce.logical" else frozenset(),
                     {"axis": tuple(int(a) for a in args[1]), "keepdims": True})]
    if name == "LogSumExp":
        return [node("LogSumExp", frozenset({0}), {"axis": (-1,), "keepdims": True})]
    if name == "Scan":
        return [node(f"Scan.{_SCAN.get(int(args[0]), 'unknown')}", frozenset({0}),
                     {"axis": int(args[1]), "reverse": bool(args[2])})]
    if name in ("Softmax",):
        return [node(name, frozenset({0}), {"axis": -1})]
    if name in ("Sort", "Partition"):
        return [node(name, frozenset({0}), {"axis": int(args[-1])})]
    if name == "Matmul":
        return [node(name, everything, _product_labels([operands[0].shape, operands[1].shape]))]
    if name == "AddMM":  # alpha * (a @ b) + beta * c: the product, then a sum with c
        product = new()
        a, b, c = operands
        first = Node("mlx.Matmul", None, [a, b], {k: v for k, v in traced.items() if k < 2},
                     _product_labels([a.shape, b.shape]), [product], out_shapes, data=frozenset({0, 1}))
        summed = {0: product, **({1: traced[2]} if 2 in traced else {})}
        if 0 not in traced and 1 not in traced:
            summed.pop(0)
        second = Node("mlx.Add", None, [Aval(out_shapes[0], None), c], summed, {}, out_ids, out_shapes,
                      data=frozenset({0, 1}))
        return ([first] if (0 in traced or 1 in traced) else []) + [second]
    if name in _INDEXED and any(k in traced or not isinstance(operands[k], np.ndarray)
                                for k in range(1, len(ins))):
        why = "indices computed from the input" if any(k in traced for k in range(1, len(ins))) \
            else "indices whose values change from call to call"
        return [Node(f"mlx.{name}", None, [], traced, {"reason": f"mlx {name} at {why}"}, out_ids, out_shapes)]
    if name in _STRUCTURAL:
        data = frozenset({0}) if name in _INDEXED else everything
        # one node per result (Split): each its own result of the primitive on element numbers
        return [node(name, data, fn=_structural_fn(name, args, tuple(shape), j), out=[vid], shapes=[tuple(shape)])
                for j, (vid, (_, shape, _)) in enumerate(zip(out_ids, outs))]
    data = everything - frozenset(_NOT_DATA.get(name, ()))
    return [node(name, data)]


def _np_dtype(dtype):
    """The NumPy dtype of an MLX dtype (bfloat16 as float32)."""
    text = str(dtype).rsplit(".", 1)[-1]
    return np.float32 if text == "bfloat16" else np.dtype(text)


def _product_labels(shapes):
    """An MLX matmul's operands and result as labelled axes (``labels``, ``out``): broadcast batch axes
    (a size-1 batch axis against a longer one gets its own label), one-dimensional operands as NumPy
    promotes them."""
    sa, sb = (tuple(s) for s in shapes)
    la_core = ["m", "k"] if len(sa) >= 2 else ["k"]
    lb_core = ["k", "n"] if len(sb) >= 2 else ["k"]
    ra, rb = len(sa) - len(la_core), len(sb) - len(lb_core)
    nb = max(ra, rb)
    batch = [f"b{q}" for q in range(nb)]
    la, lb = batch[nb - ra:] + la_core, batch[nb - rb:] + lb_core
    for q in range(nb):
        ia, ib = q - nb + ra, q - nb + rb
        if ia >= 0 and ib >= 0 and sa[ia] != sb[ib]:
            if sa[ia] == 1:
                la[ia] = f"a{q}"
            elif sb[ib] == 1:
                lb[ib] = f"c{q}"
    out = batch + (["m"] if len(sa) >= 2 else []) + (["n"] if len(sb) >= 2 else [])
    return {"labels": [tuple(la), tuple(lb)], "out": tuple(out)}


# ------------------------------------------------------------------ primitives run here, in NumPy

def _structural_fn(name, args, shape, k):
    """Result ``k`` of the structural primitive ``name`` on NumPy operands (element numbers)."""
    def fn(*values, **_):
        return _run(name, args, values, [shape], [None], k=k)[0]
    return fn


def _gather(x, indices, axes, sizes):
    """MLX's ``Gather``: out[i..., s...] = x[start(i) + s], start along ``axes`` from the (broadcast)
    indices, 0 elsewhere; the result is ``indices' shape + sizes``."""
    indices = np.broadcast_arrays(*indices) if indices else []
    lead = indices[0].shape if indices else ()
    starts = [np.zeros(lead, dtype=np.int64) for _ in range(x.ndim)]
    for axis, index in zip(axes, indices):
        index = index.astype(np.int64)
        starts[axis] = np.where(index < 0, index + x.shape[axis], index)
    grids = []
    for d in range(x.ndim):
        start = starts[d].reshape(lead + (1,) * x.ndim)
        offset = np.arange(sizes[d]).reshape((1,) * len(lead) + tuple(sizes[d] if e == d else 1
                                                                       for e in range(x.ndim)))
        grids.append(start + offset)
    if any(np.any((g < 0) | (g >= n)) for g, n in zip(grids, x.shape)):
        raise IndexError("gather out of bounds")
    return x[tuple(grids)]


def _pad(x, value, axes, low, high):
    width = [(0, 0)] * x.ndim
    for a, lo, hi in zip(axes, low, high):
        width[a] = (int(lo), int(hi))
    return np.pad(x, width, constant_values=0) + np.pad(np.zeros_like(x), width, constant_values=1) * value


def _run(name, args, values, shapes, dtypes, k=None):
    """The primitive ``name`` with MLX's ``args`` on NumPy ``values``: its results as a list (only result
    ``k`` where it is given), each of shape ``shapes[j]``. Raises for a primitive not run here."""
    v = [np.asarray(a) for a in values]
    if name in ("Reshape", "Flatten", "Unflatten"):
        res = [np.reshape(v[0], shapes[0])]
    elif name == "Transpose":
        res = [np.transpose(v[0], [int(a) for a in args[0]])]
    elif name == "Slice":
        start, stop, step = args
        res = [v[0][tuple(slice(int(a), int(b), int(c)) for a, b, c in zip(start, stop, step))]]
    elif name == "ExpandDims":
        res = [np.expand_dims(v[0], tuple(int(a) for a in args[0]))]
    elif name == "Squeeze":
        res = [np.squeeze(v[0], axis=tuple(int(a) for a in args[0]))]
    elif name == "Concatenate":
        res = [np.concatenate(v, axis=int(args[0]))]
    elif name == "Broadcast":
        res = [np.broadcast_to(v[0], shapes[0])]
    elif name == "Split":
        res = np.split(v[0], [int(a) for a in args[0]], axis=int(args[1]))
    elif name == "Pad":
        res = [_pad(v[0], v[1], args[0], args[1], args[2])]
    elif name == "Gather":
        res = [_gather(v[0], v[1:], [int(a) for a in args[0]], [int(s) for s in args[1]])]
    elif name == "GatherAxis":
        res = [np.take_along_axis(v[0], np.broadcast_to(v[1], shapes[0]).astype(np.int64), axis=int(args[0]))]
    elif name in ("Full", "Copy"):
        res = [np.broadcast_to(v[0], shapes[0]).copy()]
    elif name == "Arange":
        start, stop, step = (float(a) for a in args)
        res = [np.arange(start, stop, step)[:math.prod(shapes[0])].astype(_np_dtype(dtypes[0]))]
    elif name == "AsType":
        res = [v[0].astype(_np_dtype(args[0]))]
    elif name in _ARITHMETIC:
        res = [np.asarray(_ARITHMETIC[name](*v))]
    else:
        raise NotImplementedError(name)
    if k is not None:
        res = [res[k]]
        shapes = [shapes[0]]
    for r, shape in zip(res, shapes):
        if tuple(r.shape) != tuple(shape):
            raise ValueError(f"mlx {name}: computed shape {r.shape}, the program says {tuple(shape)}")
    return res


_ARITHMETIC = {"Add": np.add, "Subtract": np.subtract, "Multiply": np.multiply, "Negative": np.negative,
               "FloorDivide": np.floor_divide, "Remainder": np.remainder, "Maximum": np.maximum,
               "Minimum": np.minimum}
_STRUCTURAL = frozenset({"Reshape", "Flatten", "Unflatten", "Transpose", "Slice", "ExpandDims", "Squeeze",
                         "Concatenate", "Broadcast", "Split", "Pad", "Gather", "GatherAxis"})
