"""A torch.fx graph of ATen operations as a :class:`~._program.Program`: native torch code for the same rules.

The graph is what ``torch.fx.experimental.proxy_tensor.make_fx`` traces (its ``call_function`` nodes are
``torch.ops.aten`` overloads, multiple results read with ``operator.getitem``), or one built the same
way from the operations a call actually ran (``unigrad_torch._per_example`` records them with a
``TorchDispatchMode``, which is how ``make_fx`` itself traces). Each ATen operation becomes one node
named ``aten.<name>`` in the rule table; a few are put into the table's classes here:

* ``view``/``_unsafe_view``/``reshape`` are ``aten.reshape``, ``permute`` is ``aten.permute_dims``;
* ``addmm(c, a, b)`` is two nodes, ``mm(a, b)`` then ``add(c, .)``;
* reductions and softmax-like operations get ``axis``/``keepdims`` from their schema;
* ``gather`` and ``nll_loss_forward`` (no reduction) are ``take`` along their class axis, with a loss
  reduced over the batch a reduction.

Values computed from literal arguments alone (``arange``, ``full``) are folded, so index operands built
from them are known to the structural rules; placeholders' and constants' values are not (a constant
``get_attr`` tensor is FREE but its value unknown). An operation without a rule, or a Python callable
that is not an ATen operation, answers "unknown" in the row domain: the proof gives up, never guesses.
"""

from __future__ import annotations

import operator

import numpy as np

from unigrad.dependence import Aval, Node, Program, Rule, register_rules, rule_for

# ATen operations (a torch.fx graph), under "aten.": the class of dependence of each.
register_rules("aten.", [
    ("add sub rsub neg clone _to_copy alias lift_fresh_copy where clamp clamp_min clamp_max abs maximum minimum "
         "masked_fill remainder fmod positive conj real imag", Rule("elementwise", "linear")),
    ("mul", Rule("elementwise", "bilinear")),
    ("div", Rule("elementwise", "divide")),
    ("tanh exp exp2 log log2 log10 log1p expm1 sqrt rsqrt sin cos tan asin acos atan sinh cosh asinh acosh atanh "
         "sigmoid relu gelu silu softplus elu leaky_relu hardtanh erf erfc reciprocal pow atan2 logit square xlogy "
         "mish hardsigmoid hardswish threshold", Rule("elementwise", "nonlinear")),
    ("eq ne lt le gt ge sign floor ceil round trunc logical_and logical_or logical_not logical_xor bitwise_and "
         "bitwise_or bitwise_not bitwise_xor isnan isinf isfinite ones_like zeros_like full_like empty_like "
         "scalar_tensor arange full zeros ones empty new_zeros new_ones new_full new_empty argmax argmin detach "
         "_local_scalar_dense rand rand_like randn randn_like randint bernoulli", Rule("zero")),
    ("reshape permute_dims t transpose expand unsqueeze squeeze select slice cat stack flip roll index "
         "index_select narrow repeat constant_pad_nd diagonal", Rule("structural")),
    ("sum mean amax amin nll_loss_reduced", Rule("reduce", "linear")),
    ("prod logsumexp var std norm linalg_vector_norm", Rule("reduce", "nonlinear")),
    ("cumsum", Rule("scan", "linear")),
    ("cumprod logcumsumexp", Rule("scan", "nonlinear")),
    ("_softmax _log_softmax native_layer_norm", Rule("lane", "nonlinear")),
    ("mm bmm", Rule("matmul", "bilinear")),
    ("gather nll_loss_forward", Rule("take", "linear")),
    ("convolution max_pool1d max_pool2d max_pool3d max_pool1d_with_indices max_pool2d_with_indices "
         "max_pool3d_with_indices avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d _adaptive_avg_pool2d "
         "_adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d native_group_norm native_batch_norm_eval "
         "reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d "
         "upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d "
         "upsample_linear1d upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d",
         Rule("per_sample", "nonlinear", rows=(0,))),  # (each over the axes after the first two only)
    ("embedding", Rule("per_sample", "linear", rows=())),  # a lookup in its weight (never a row)
    ("_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_attention_math "
         "_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention",
         Rule("per_sample", "nonlinear", rows=(0, 1, 2))),  # queries, keys, values: (B, heads, T, d)
    ("native_batch_norm_training", Rule("lane", "nonlinear")),  # statistics over the batch
])



_RENAME = {"view": "reshape", "_unsafe_view": "reshape", "reshape": "reshape", "permute": "permute_dims",
           "softmax": "_softmax", "log_softmax": "_log_softmax"}
_REDUCE = frozenset({"sum", "mean", "amax", "amin", "prod", "logsumexp", "var", "std", "norm",
                     "linalg_vector_norm"})
_AXIS = frozenset({"_softmax", "_log_softmax", "cumsum", "cumprod", "logcumsumexp", "gather"})
# positions (among tensor operands) that carry no derivative
_NOT_DATA = {"where": (0,), "gather": (1,), "index": None, "index_select": (1,), "masked_fill": (1,),
             "nll_loss_forward": (1, 2, 3), "embedding": (1,)}
_FOLD_LIMIT = 1 << 20


def fx_program(graph, ids=None, in_place=False) -> Program:
    """The program of a ``torch.fx`` graph (or GraphModule) of ATen operations.

    Shapes are read from each node's ``meta["val"]`` (``make_fx`` sets it; so does the recorder).
    ``ids``, a dict when given, receives each fx node's value id in the program. ``in_place``: the
    graph's data flow is known to be exact across in-place operations (no value is read through an
    alias written after it was made: the per-example recorder checks this), so an elementwise
    operation in place (``relu_``, ``add_``) takes its out-of-place rule; otherwise it has none.
    """
    import torch
    from torch.utils import _pytree

    graph = getattr(graph, "graph", graph)
    vids, known = {}, {}
    inputs, input_shapes, nodes = [], [], []
    outputs, output_shapes = [], []
    count = [0]
    fused = set()
    aliases = _Aliases()

    def new():
        count[0] += 1
        return count[0] - 1

    def vid(n):  # the value id a node's tensor has now (another after a write through one of its aliases)
        return aliases.current.get(n, vids[n]) if n in vids else None

    for fx_node in graph.nodes:
        op = fx_node.op
        val = fx_node.meta.get("val")
        if op == "placeholder":
            vids[fx_node] = new()
            inputs.append(vids[fx_node])
            input_shapes.append(tuple(val.shape) if hasattr(val, "shape") else ())
            continue
        if op == "get_attr":
            vids[fx_node] = new()  # a constant: independent of the inputs, its value unknown here
            continue
        if op == "output":
            results = fx_node.args[0]
            results = results if isinstance(results, (tuple, list)) else (results,)
            for r in results:
                if isinstance(r, torch.fx.Node) and r in vids and not isinstance(vid(r), tuple):
                    outputs.append(vid(r))
                    v = r.meta.get("val")
                    output_shapes.append(tuple(v.shape) if hasattr(v, "shape") else ())
                else:
                    outputs.append(None)
                    output_shapes.append(tuple(np.shape(r)) if not hasattr(r, "shape") else tuple(r.shape))
            continue
        target = fx_node.target
        if fx_node in fused:  # the reshape back of a product over positions (below): already its output
            continue
        if op == "call_function" and target is operator.getitem:
            base = vid(fx_node.args[0])
            vids[fx_node] = base[fx_node.args[1]] if isinstance(base, tuple) else new()
            aliases.item(fx_node)
            if fx_node.args[0] in known and isinstance(known[fx_node.args[0]], (tuple, list)):
                known[fx_node] = known[fx_node.args[0]][fx_node.args[1]]
            continue
        flat, spec = _pytree.tree_flatten((fx_node.args, fx_node.kwargs))
        operand_at = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]
        multiple = isinstance(val, (tuple, list))
        outs = tuple(new() for _ in val) if multiple else new()
        vids[fx_node] = outs
        out_list = list(outs) if multiple else [outs]
        out_shapes = [tuple(v.shape) if hasattr(v, "shape") else () for v in (val if multiple else [val])]
        if not isinstance(target, torch._ops.OpOverload) or op != "call_function":
            what = getattr(target, "__name__", str(target))
            nodes.append(Node(f"python.{what}", None, [], {k: vid(flat[i]) for k, i in enumerate(operand_at)
                                                          if not isinstance(vid(flat[i]), tuple)},
                              {}, out_list, out_shapes))
            continue
        name = target._schema.name.split("::")[-1]
        if in_place and name.endswith("_") and not name.startswith("_") and target._schema.is_mutable and rule_for(
                "aten." + name[:-1]).kind == "elementwise" and target._schema.arguments[0].alias_info is not None:
            # in place (relu_, add_): the value it makes is a new node (the recorder refuses programs that
            # then read the old value through another alias), the same rule as the operation out of place
            name = name[:-1]
        bound = _bind(target, fx_node.args, fx_node.kwargs)
        written = aliases.operation(fx_node, target, bound)
        if written:  # a write that other views of the tensor see: their values change without an edge
            rebound = aliases.write(written, [flat[i] for i in operand_at], vid, new, known)
            if rebound is not None:
                nodes.append(rebound)
        # fold what literal arguments alone decide (arange, full): index operands the rules can read
        if all(flat[i] in known for i in operand_at) and torch.Tag.nondeterministic_seeded not in target.tags:
            try:
                args, kwargs = _pytree.tree_unflatten([known.get(a, a) if isinstance(a, torch.fx.Node) else a
                                                       for a in flat], spec)
                value = target(*args, **kwargs)
                if sum(t.numel() for t in (value if isinstance(value, (tuple, list)) else [value])) <= _FOLD_LIMIT:
                    known[fx_node] = value
                    continue
            except Exception:
                pass
        values = [_value(flat[i], known) for i in operand_at]
        not_data = _NOT_DATA.get(name, ())
        data = frozenset(range(len(values))) if not_data is not None else frozenset({0})
        data = frozenset(k for k in data if k not in (not_data or ()))
        traced = {k: vid(flat[i]) for k, i in enumerate(operand_at)
                  if k in data and flat[i] not in known and not isinstance(vid(flat[i]), tuple)}
        fn = _runner(target, flat, spec, operand_at)
        params = {}
        folded = positions_product(fx_node)
        if folded is not None:  # x (B, T.., d) -> (B*T.., d) @ w -> (B, T.., k): one product over positions
            x_node, back = folded
            fused.add(back)
            at = 1 if name == "addmm" else 0
            w_val, x_val = values[at + 1], _value(x_node, known)
            mm_traced = {}
            if x_node not in known:
                mm_traced[0] = vid(x_node)
            if at + 1 in traced:
                mm_traced[1] = traced[at + 1]
            back_shape = tuple(back.meta["val"].shape)
            out = vids[back] = new()
            mid = new() if name == "addmm" else out
            nodes.append(Node("aten.mm", None, [x_val, w_val], mm_traced, {}, [mid], [back_shape],
                              data=frozenset({0, 1})))
            if name == "addmm":
                add_traced = {1: mid}
                if 0 in traced:
                    add_traced[0] = traced[0]
                nodes.append(Node("aten.add", None, [values[0], Aval(back_shape, None)], add_traced, {}, [out],
                                  [back_shape], data=frozenset({0, 1})))
            continue
        if name == "addmm":  # c + a @ b: a product, then a sum
            mid = new()
            mm_traced = {k - 1: v for k, v in traced.items() if k in (1, 2)}
            nodes.append(Node("aten.mm", _runner(torch.ops.aten.mm.default, [None, None], _pytree.tree_flatten(
                ((0, 1), {}))[1], [0, 1]), values[1:3], mm_traced, {}, [mid], [out_shapes[0]],
                data=frozenset({0, 1})))
            add_traced = {k: v for k, v in traced.items() if k == 0}
            add_traced[1] = mid
            nodes.append(Node("aten.add", None, [values[0], Aval(out_shapes[0], None)], add_traced, {}, out_list,
                              out_shapes, data=frozenset({0, 1})))
            continue
        if name in _REDUCE:
            dims = bound.get("dim")
            if isinstance(dims, int):
                dims = (dims,)
            params = {"axis": tuple(dims) if dims else None, "keepdims": bool(bound.get("keepdim", False))}
        elif name in _AXIS or name in _RENAME and _RENAME[name] in _AXIS:
            params = {"axis": bound.get("dim")}
        elif name == "native_layer_norm":  # normalised over its trailing axes
            params = {"axis": tuple(range(-len(bound["normalized_shape"]), 0))}
        elif name == "native_batch_norm":  # in training, normalised with statistics over the batch
            nd = len(values[0].shape)
            if bound.get("training", True):
                name, params = "native_batch_norm_training", {"axis": tuple(a for a in range(nd) if a != 1)}
            else:
                name = "native_batch_norm_eval"
        elif name == "permute":
            params = {"axes": tuple(bound["dims"])}
        elif name in ("t", "transpose"):  # as a permutation (the rules read one)
            nd = len(values[0].shape)
            axes = list(range(nd))
            d0, d1 = (0, 1) if name == "t" else (bound["dim0"], bound["dim1"])
            if nd >= 2:
                axes[d0 % nd], axes[d1 % nd] = axes[d1 % nd], axes[d0 % nd]
            name, params = "permute", {"axes": tuple(axes)}
        elif name == "nll_loss_forward":
            nd = len(values[0].shape) if hasattr(values[0], "shape") else 0
            if bound.get("reduction", 1) != 0 or nd != 2:
                name = "nll_loss_reduced"
                params = {"axis": None, "keepdims": False}
            else:
                params = {"axis": 1, "drop": True}
        nodes.append(Node("aten." + _RENAME.get(name, name), fn, values, traced, params, out_list, out_shapes,
                          data=data))
    if ids is not None:
        ids.update((k, v) for k, v in vids.items() if not isinstance(v, tuple))
    return Program(inputs, input_shapes, nodes, outputs, output_shapes)


_RESHAPES = ("view", "_unsafe_view", "reshape")


class _Aliases:
    """The nodes of a graph that share one tensor's storage -- views (their schema returns an alias of
    an argument: ``select``, ``slice``, ``t``, ``view``, ``unbind``...) and in-place results -- so that a
    write through one of them is seen to reach the others.

    The graph's edges do not show such a write: ``make_fx`` and the recorder of ``unigrad_torch._per_example``
    give the other views (and the base) their old identities, so ``h[0] += h[1]; loss(h)`` reads as a
    ``loss`` of the unchanged ``h``, whose rows look apart. After a write to a tensor with views, every
    node sharing its storage is therefore rebound (``current``) to an output of an operation that has
    no rule (``aliased_write``), which depends on all of them and on the written values: the proof
    gives up there (unknown), never guesses. A write to a tensor without views (``relu_(h)``,
    ``h += b``) is followed by the edges themselves and is left alone.
    """

    def __init__(self):
        self.parent, self.members, self.viewed, self.lists, self.current = {}, {}, set(), set(), {}

    def root(self, n):
        while n in self.parent:
            n = self.parent[n]
        return n

    def union(self, a, b, view):
        ra, rb = self.root(a), self.root(b)
        if ra is not rb:
            self.parent[ra] = rb
            self.members.setdefault(rb, {rb}).update(self.members.pop(ra, {ra}))
            if ra in self.viewed:
                self.viewed.add(rb)
        if view:
            self.viewed.add(rb)

    def item(self, fx_node):
        """``getitem`` of a node that returns a list of views (``unbind``, ``split``): a view too."""
        if fx_node.args[0] in self.lists:
            self.union(fx_node, fx_node.args[0], True)

    def operation(self, fx_node, target, bound):
        """Note the aliases ``fx_node`` makes (from its schema); return the nodes it writes to."""
        import torch

        schema, written = target._schema, []
        for arg in schema.arguments:
            info = arg.alias_info
            if info is None:
                continue
            value = bound.get(arg.name)
            operands = [v for v in (value if isinstance(value, (list, tuple)) else [value])
                        if isinstance(v, torch.fx.Node)]
            for ret in schema.returns:
                r = ret.alias_info
                if r is not None and set(r.before_set) & set(info.before_set):
                    for v in operands:
                        self.union(fx_node, v, not r.is_write)
                    if isinstance(ret.type, torch.ListType):
                        self.lists.add(fx_node)
            if info.is_write:
                written.extend(operands)
        return written

    def write(self, written, operands, vid, new, known):
        """The ``aliased_write`` node rebinding every node that shares storage with a written tensor
        that has views (None where none has)."""
        group = set()
        for w in written:
            r = self.root(w)
            if r in self.viewed:
                group |= self.members.get(r, {r})
        if not group:
            return None
        members = sorted(group, key=lambda n: n.name)
        ins = [v for v in (vid(n) for n in members + list(operands)) if v is not None and not isinstance(v, tuple)]
        for n in members:
            known.pop(n, None)
        outs = [new() for _ in members]
        shapes = [tuple(getattr(n.meta.get("val"), "shape", ())) for n in members]
        self.current.update(zip(members, outs))
        return Node("aliased_write", None, [Aval((), None)] * len(ins), dict(enumerate(ins)), {}, outs, shapes,
                    data=frozenset(range(len(ins))))


def _aten_name(fx_node):
    import torch

    target = fx_node.target
    if fx_node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    return target._schema.name.split("::")[-1]


def positions_product(fx_node):
    """``(x, back)`` when ``fx_node`` is ``mm(reshape(x), w)`` (or ``addmm(c, reshape(x), w)``) with x of
    shape (B, T.., d) flattened to (B*T.., d), and its one use ``back`` reshapes the product to (B, T.., k):
    how ATen spells ``x @ w`` and ``linear`` over positions. Else None."""
    name = _aten_name(fx_node)
    if name not in ("mm", "addmm") or fx_node.kwargs:
        return None
    a = fx_node.args[1 if name == "addmm" else 0]
    if _aten_name(a) not in _RESHAPES or len(fx_node.users) != 1:
        return None
    x = a.args[0]
    back = next(iter(fx_node.users))
    if _aten_name(back) not in _RESHAPES:
        return None
    try:
        xs, a_s = tuple(x.meta["val"].shape), tuple(a.meta["val"].shape)
        out, back_s = tuple(fx_node.meta["val"].shape), tuple(back.meta["val"].shape)
    except (AttributeError, KeyError):
        return None
    if len(xs) < 3 or len(a_s) != 2 or xs[-1] != a_s[1] or xs[:-1] != back_s[:-1] or back_s[-1] != out[1]:
        return None
    n = 1
    for s in xs[:-1]:
        n *= s
    return (x, back) if n == a_s[0] else None


def _bind(target, args, kwargs):
    """Arguments by name, defaults filled in, from the operation's schema."""
    bound = {}
    for k, a in enumerate(target._schema.arguments):
        if k < len(args) and not a.kwarg_only:
            bound[a.name] = args[k]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _value(fx_node, known):
    if fx_node in known:
        v = known[fx_node]
        return v.detach().cpu().numpy() if hasattr(v, "detach") else v
    val = fx_node.meta.get("val")
    return Aval(getattr(val, "shape", ()), getattr(val, "dtype", None))


def _runner(target, flat, spec, operand_at):
    """The operation on NumPy operands (the structural rules apply it to arrays of row numbers)."""
    def fn(*operands, **_params):
        import torch
        from torch.utils import _pytree

        items = list(flat)
        for i, v in zip(operand_at, operands):
            items[i] = torch.as_tensor(np.asarray(v)) if not isinstance(v, torch.Tensor) else v
        args, kwargs = _pytree.tree_unflatten(items, spec)
        out = target(*args, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.detach().cpu().numpy()
    return fn
