"""Per-example gradients on TensorFlow: dense layers found in the graph ``f`` builds inside a ``tf.function``.

The same method as the tape's, JAX's and torch's (``unigrad/per_example/_tape.py``, ``unigrad_jax._per_example``,
``unigrad_torch._per_example``; the formulas are shared, ``unigrad.per_example.layers``), for native TensorFlow
code (``tf.matmul``, ``tf.nn.bias_add``, Keras layers' math) and portable code alike:

1. The kernel runs inside a ``tf.function`` (one per signature, eager calls too: no retracing), so
   ``f`` adds its operations to a graph. They are read right after ``f`` returns: a parameter whose one
   use is ``MatMul``/``BatchMatMulV2`` (through ``Identity``/``Transpose``, with the ``transpose_b``/
   ``adj_y`` attributes; over positions as ``Reshape -> MatMul -> Reshape``, how ``tensordot`` and
   Keras' ``Dense`` spell it), a bias (``AddV2``/``BiasAdd``/``Sub`` of a broadcast parameter, directly
   or through ``Reshape``/``ExpandDims``/``Squeeze``) or a scale (``Mul``) is a candidate.
2. The dependence analysis's TensorFlow front-end (``_dependence``) proves, from the
   layer's output to the losses, that row i of the losses depends on the layer's output through its
   row i alone; only then the parameter takes the fast path.
3. ``G = tf.gradients(sum(losses), [Y...])`` in the same graph (one backward pass); ``X`` is the
   layer's input tensor. Norms ``|x_i|^2 |g_i|^2``, ghost ``sum((X_i X_i^T) * (G_i G_i^T))`` or rows
   ``X_i^T G_i``.

Other parameters are materialised with the backend's ``jacrev`` of the losses, in the same graph.
"""

from __future__ import annotations

from unigrad.per_example import layers as pe

_PASS = frozenset({"Identity", "Snapshot"})
_RESHAPES = frozenset({"Reshape", "ExpandDims", "Squeeze"})


def _ops():
    import tensorflow as tf

    return pe.Ops(tf.reshape, lambda a, axes, keepdims: tf.reduce_sum(a, axis=axes, keepdims=keepdims), tf.matmul,
                  tf.linalg.matrix_transpose, lambda a, dtype: tf.cast(a, dtype), tf.sqrt)


def tf_rows(b, flat_f, leaves, batch, norms, fname, directions=None, weights=None):
    """``(outputs, blocks, paths)`` (``TensorflowBackend.per_example_rows``) read from ``f``'s graph. Called
    while a ``tf.function`` traces (the graph is read); run eagerly, every parameter is materialised."""
    import tensorflow as tf

    n = len(leaves)
    rows, squares, paths = [None] * n, [None] * n, [pe.MATERIALISED] * n
    dots = [None] * n
    fast, losses, weighted = {}, None, None
    if not tf.executing_eagerly():
        graph = tf.compat.v1.get_default_graph()
        xs = [tf.identity(x) for x in leaves]  # fresh tensors: the operations reading them are f's
        start = len(graph.get_operations())
        outs = b.evaluate(flat_f, xs)
        pe.check_losses(b, outs, batch, fname)
        losses = outs[0]
        plans = _plans(graph.get_operations()[start:], xs, losses, batch)
        if plans:
            seeds = []
            for plan in plans.values():
                if all(plan.seed is not s for s in seeds):
                    seeds.append(plan.seed)
            gs = tf.gradients(tf.reduce_sum(losses), seeds, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            for k, plan in plans.items():
                g = gs[next(i for i, s in enumerate(seeds) if s is plan.seed)]
                rows[k], squares[k], paths[k] = plan.rows(g, leaves[k], batch, norms)
                if squares[k] is not None and directions is not None:  # (norms from X and G: matmul_rows)
                    dots[k] = pe.matmul_dots(_ops(), plan.x, g, batch, plan.transposed, directions[k])
            fast = plans
            if norms and directions is not None and weights is not None:  # the norms check's gradient, same graph
                weighted = tf.gradients(tf.reduce_sum(losses * tf.cast(weights, losses.dtype)), xs,
                                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    slow = [k for k in range(n) if k not in fast]
    if slow:
        # (the other arguments as f sees them: Arrays)
        outs2 = pe.materialise(b, flat_f, leaves, slow, rows, fixed=b.arguments(tuple(leaves)))
        pe.check_losses(b, outs2, batch, fname)
        if losses is None:
            losses = outs2[0]
    if not norms:
        return (losses,), tuple(rows), paths
    total = pe.total_norms(_ops(), squares, rows, batch)
    dot = None if directions is None else pe.total_dots(_ops(), dots, rows, directions, batch)
    if dot is None:
        return (losses,), (total,), paths
    if weighted is None:
        return (losses,), (total, dot), paths
    return (losses,), (total, dot, pe.direction_dot(_ops(), weighted, directions, dot.dtype)), paths


class _Plan:
    __slots__ = ("kind", "seed", "x", "other", "transposed", "sign", "operand_shape")

    def __init__(self, kind, seed, x=None, other=None, transposed=False, sign=1.0, operand_shape=None):
        self.kind, self.seed, self.x, self.other, self.transposed, self.sign = kind, seed, x, other, transposed, sign
        self.operand_shape = operand_shape  # a bias or scale reshaped on its way to the layer (b[None], reshape)

    def rows(self, g, param, batch, norms):
        import tensorflow as tf

        if self.kind == "matmul":
            return pe.matmul_rows(_ops(), self.x, g, batch, norms, self.transposed, param.dtype)
        shape = tuple(param.shape) if self.operand_shape is None else self.operand_shape
        rows, path = pe.broadcast_rows(_ops(), self.kind, g, self.other, shape, tuple(self.seed.shape.as_list()),
                                       self.sign, batch)
        if self.operand_shape is not None:  # (reshapes keep the order of elements)
            rows = tf.reshape(rows, (batch, *param.shape))
        return tf.cast(rows, param.dtype), None, path


def _plans(ops, xs, losses, batch):
    """leaf -> :class:`_Plan` for each parameter whose one use is a dense layer whose rows stay apart
    up to the losses (proved by the dependence analysis from the layer's output)."""
    from unigrad.dependence import prove_rows
    from ._dependence import graph_program

    mine = {id(op) for op in ops}
    found = {}
    for k, x in enumerate(xs):
        try:
            plan = _find(x, mine, batch)
        except Exception:  # an operation whose attributes or shapes cannot be read: materialised
            plan = None
        if plan is not None:
            found[k] = plan
    if not found:
        return {}
    ids = {}
    try:
        program = graph_program(ops, xs, [losses], ids=ids)
    except Exception:  # shapes not static: every parameter materialised
        return {}
    proved, plans = {}, {}
    for k, plan in found.items():
        ref = plan.seed.ref()
        if ref not in proved:
            vid = ids.get(ref)
            proved[ref] = vid is not None and prove_rows(program, batch, seeds={vid: plan.seed.shape.rank})[0] == "row"
        if proved[ref]:
            plans[k] = plan
    return plans


def _only_use(t, mine):
    """The one operation (among f's) using tensor ``t``, using it once, following identities; else None."""
    while True:
        users = [op for op in t.consumers() if id(op) in mine]
        if len(users) != 1 or sum(1 for i in users[0].inputs if i is t) != 1:
            return None, None
        op = users[0]
        if op.type in _PASS:
            t = op.outputs[0]
            continue
        return op, t


def _static(t):
    s = t.shape
    return None if s.rank is None or any(d is None for d in s.as_list()) else tuple(s.as_list())


def _const(t):
    import tensorflow as tf

    op = t.op
    while op.type in _PASS:
        op = op.inputs[0].op
    return tf.make_ndarray(op.get_attr("value")) if op.type == "Const" else None


def _find(p, mine, batch):
    """A :class:`_Plan` for parameter ``p`` (a fresh identity of the leaf) used once by a dense layer, else None."""
    import numpy as np

    if not p.dtype.is_floating:
        return None
    op, operand = _only_use(p, mine)
    if op is None:
        return None
    transposed, reshaped = False, False
    shape = _static(p)
    while op.type in _RESHAPES:  # a bias or scale reshaped first (b[None], tf.reshape(b, (1, -1)))
        reshaped = True
        op, operand = _only_use(op.outputs[0], mine)
        if op is None:
            return None
    if op.type == "Transpose" and len(shape) == 2 and not reshaped:
        perm = _const(op.inputs[1])
        if perm is None or tuple(np.asarray(perm) % 2) != (1, 0):
            return None
        transposed = True
        op, operand = _only_use(op.outputs[0], mine)
        if op is None:
            return None
    out = _static(op.outputs[0]) if op.outputs else None
    if out is None or not out:
        return None
    if op.type in ("MatMul", "BatchMatMulV2", "BatchMatMulV3") and not reshaped:
        if op.type == "MatMul":
            ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
        else:
            ta, tb = op.get_attr("adj_x"), op.get_attr("adj_y")
        a = op.inputs[0]
        a_shape = _static(a)
        if ta or op.inputs[1] is not operand or op.inputs[0] is operand or len(_static(operand)) != 2 \
                or a_shape is None or len(a_shape) < 2:
            return None
        transposed = transposed != bool(tb)
        seed, x = op.outputs[0], a
        if op.type == "MatMul" and a_shape[0] != batch:  # over positions: Reshape(x) -> MatMul -> Reshape back
            folded = _positions(op, a, mine)
            if folded is None:
                return None
            x, seed = folded
        if _static(seed)[0] != batch or _static(x)[0] != batch:
            return None
        return _Plan("matmul", seed, x=x, transposed=transposed)
    if transposed or op.type not in ("AddV2", "Add", "BiasAdd", "Sub", "Mul"):
        return None
    pos = 0 if op.inputs[0] is operand else 1
    other = op.inputs[1 - pos]
    if op.type == "BiasAdd":
        if pos != 1 or (op.get_attr("data_format") in (b"NCHW", "NCHW") and len(out) > 2):
            return None
    if _static(other) != out or out[0] != batch:
        return None
    operand_shape = _static(operand)
    if operand_shape is None or len(operand_shape) > len(out) or (
            len(operand_shape) == len(out) and operand_shape[0] != 1):
        return None  # the parameter has an axis along the batch: not shared by the rows
    sign = -1.0 if (op.type == "Sub" and pos == 1) else 1.0
    kind = "scale" if op.type == "Mul" else "bias"
    return _Plan(kind, op.outputs[0], other=other if kind == "scale" else None, sign=sign,
                 operand_shape=operand_shape if reshaped else None)


def _positions(matmul, a, mine):
    """``(x, back)`` when ``a`` is ``Reshape(x)`` of x (B, T.., d) to (B*T.., d) and the product's one use
    reshapes it back to (B, T.., k); else None."""
    if a.op.type != "Reshape":
        return None
    x = a.op.inputs[0]
    back_op, _ = _only_use(matmul.outputs[0], mine)
    if back_op is None or back_op.type != "Reshape":
        return None
    back = back_op.outputs[0]
    xs, a_s, out, back_s = _static(x), _static(a), _static(matmul.outputs[0]), _static(back)
    if None in (xs, a_s, out, back_s) or len(xs) < 3 or xs[-1] != a_s[1] or xs[:-1] != back_s[:-1] \
            or back_s[-1] != out[1]:
        return None
    size = 1
    for s in xs[:-1]:
        size *= s
    return (x, back) if size == a_s[0] else None
