"""Batch rows: a proof that a program's rows are independent, or the operation that mixes them.

Each value is FREE (absent from the environment: it does not depend on the batch), ROW along a negative
axis d (an int: its row i, along d, depends on input row i only), :class:`Mixed` (rows combined, with
the node that did it), or :class:`Unknown` (an operation without a row rule: the proof gives up). The
walk is linear in the number of nodes; structural operations without a shortcut apply their own
implementation to an array of row numbers, which is exact for all of them.
"""

from __future__ import annotations

import math

import numpy as np

from ._rules import einsum_spec, lane_axes, reduce_axes, rule_for


class Mixed:
    __slots__ = ("node", "why")

    def __init__(self, node, why):
        self.node, self.why = node, why

    def describe(self):
        where = f" at {self.node.site}" if self.node is not None and self.node.site else ""
        return f"{self.why}{where}"


class Blocked(tuple):
    """ROW along a negative axis whose length is the batch times ``m``, rows in consecutive blocks of m
    (element j belongs to row ``j // m``): a batch merged with the axes after it, ``(B, T, C) -> (B*T, C)``,
    as a sequence loss reshapes it. ``Blocked(d, 1)`` is never made: that is plain ROW ``d``."""
    __slots__ = ()

    def __new__(cls, axis, m):
        return tuple.__new__(cls, (axis, m))

    @property
    def axis(self):
        return self[0]

    @property
    def m(self):
        return self[1]


class Strided(Blocked):
    """Like :class:`Blocked`, the batch merged with other axes on one axis, but as the *inner* factor
    (element j belongs to row ``j % batch``): ``(T, B, C) -> (T*B, C)``, as attention's output projection
    reshapes it. ``m`` is the number of elements per row."""
    __slots__ = ()


def _row(axis, m, strided=False):
    if m == 1:
        return axis
    return Strided(axis, m) if strided else Blocked(axis, m)


def _row_numbers(n, m, strided, batch):
    """1 + the row of each of the n elements of a merged axis (m elements per row)."""
    return 1 + (np.arange(n, dtype=np.int64) % batch if strided else np.arange(n, dtype=np.int64) // m)


class Unknown:
    __slots__ = ("why",)

    def __init__(self, why):
        self.why = why


def prove_rows(program, batch, seeds=None):
    """``("row", None)``, ``("mixed", Mixed)`` or ``("unknown", why)`` for a program whose inputs all
    have the batch (size ``batch``) on axis 0, and whose outputs must have it on axis 0.

    ``seeds`` (value id -> number of dimensions), when given, replaces the inputs: the question is then
    whether row i of every output depends on those values through their row i alone (on axis 0), every
    other value held constant -- what per-example gradients need of a layer's output."""
    env = {}
    if seeds is not None:  # (value id -> its number of dimensions, or (dimensions, the batch's axis))
        env.update({vid: (s[1] - s[0] if isinstance(s, tuple) else -s) for vid, s in seeds.items()})
    else:
        for vid, shape in zip(program.inputs, program.input_shapes):
            if len(shape) and shape[0] == batch:
                env[vid] = -len(shape)
    _walk(program, env, batch)
    unknown = None
    for k, (vid, shape) in enumerate(zip(program.outputs, program.output_shapes)):
        s = env.get(vid) if vid is not None else None
        if s is None:
            continue
        if isinstance(s, Mixed):
            return "mixed", s
        if isinstance(s, Unknown):
            unknown = unknown or s
            continue
        if isinstance(s, Blocked):  # (or Strided)
            return "mixed", Mixed(None, f"output {k} has the batch merged with other axes on its axis "
                                        f"{s.axis + len(shape)}")
        if s != -len(shape):
            return "mixed", Mixed(None, f"output {k} has the batch on axis {s + len(shape)}, not 0")
    if unknown is not None:
        return "unknown", unknown.why
    return "row", None


def _walk(program, env, batch):
    for node in program.nodes:
        ins = {pos: env[vid] for pos, vid in node.traced.items() if vid in env}
        if not ins:
            continue
        bad = [s for s in ins.values() if isinstance(s, Mixed)] or [s for s in ins.values() if isinstance(s, Unknown)]
        if bad:
            out = bad[0]
            for vid in node.outs:
                env[vid] = out
            continue
        try:
            outs = _apply(node, ins, batch)
        except Exception as exc:  # a rule that cannot read this node: give up, never guess
            outs = [Unknown(f"the row rule for {node.name!r} failed ({type(exc).__name__}: {exc})")] * len(node.outs)
        for vid, s in zip(node.outs, outs):
            if s is not None:
                env[vid] = s


def _name(node):
    return node.name.split(".", 1)[1] if node.name.startswith(("lax.", "aten.")) else node.name


_KEEP_BLOCKS = frozenset({"elementwise", "reduce", "scan", "lane", "take", "matmul"})


def _apply(node, ins, batch):
    if any(isinstance(s, Blocked) for s in ins.values()):
        return _apply_blocked(node, ins, batch)
    return _apply_rows(node, ins, batch)


def _apply_blocked(node, ins, batch):
    """A merged batch (:class:`Blocked`) through the rules that only move the axis it is on (the same
    rule answers where that axis goes; the blocks stay), and structural operations (row numbers)."""
    n_out = len(node.outs)
    kind = rule_for(node.name).kind
    ms = {(s.m, type(s)) if isinstance(s, Blocked) else (1, int) for s in ins.values()}
    if kind == "structural":
        return [_structural(node, ins, batch)]
    if kind not in _KEEP_BLOCKS or len(ms) != 1:
        return [Unknown(f"{_name(node)} of a batch merged with other axes")] * n_out
    m, kind_of_merge = ms.pop()
    strided = kind_of_merge is Strided
    outs = _apply_rows(node, {pos: s.axis if isinstance(s, Blocked) else s for pos, s in ins.items()}, batch)
    return [_row(o, m, strided) if isinstance(o, int) and not isinstance(o, bool) else o for o in outs]


def _apply_rows(node, ins, batch):
    rule = rule_for(node.name)
    kind = rule.kind
    n_out = len(node.outs)
    if kind == "zero":
        return [None] * n_out
    if kind == "elementwise":
        shape = node.out_shapes[0]
        axes = set()
        for pos, d in ins.items():
            s = node.shape(pos)
            if len(s) + d < 0 or s[d] != shape[d]:
                return [Mixed(node, f"{_name(node)} broadcasts the batch axis")]
            axes.add(d)
        if len(axes) > 1:
            return [Mixed(node, f"{_name(node)} combines rows along different axes")]
        return [axes.pop()]
    if kind == "reduce":
        (pos, d), = ins.items()
        axes, keep = reduce_axes(node, len(node.shape(pos)))
        if d in axes:
            return [Mixed(node, f"{_name(node)} over the batch axis")]
        return [d if keep else d + sum(1 for a in axes if a > d)]
    if kind in ("scan", "lane"):
        outs = []
        for pos, d in ins.items():
            if d in lane_axes(node, len(node.shape(pos))):
                return [Mixed(node, f"{_name(node)} along the batch axis")] * n_out
            outs.append(d)
        if len(set(outs)) > 1:
            return [Mixed(node, f"{_name(node)} combines rows along different axes")] * n_out
        return [outs[0]] * n_out
    if kind == "structural":
        return [_structural(node, ins, batch)]
    if kind == "per_sample":
        rows_at = rule.extra.get("rows", (0,))
        for pos, d in ins.items():
            if pos not in rows_at:
                return [Unknown(f"{_name(node)} with a row-dependent operand {pos}")] * n_out
            if d != -len(node.shape(pos)):
                return [Mixed(node, f"{_name(node)} acts across the batch axis")] * n_out
        n = node.shape(next(iter(ins)))[0]
        return [-len(s) if s and s[0] == n else Unknown(f"{_name(node)} changes the batch axis")
                for s in node.out_shapes]
    if kind == "take":  # out[.., i, .., j] = x[.., i, .., index[.., i, .., j]] along one axis (the index: no derivative)
        if set(ins) != {0}:
            return [Unknown(f"{_name(node)} with a row-dependent operand other than its data")] * n_out
        d = ins[0]
        nd = len(node.shape(0))
        axis = node.params["axis"] % nd - nd
        out_shape = node.out_shapes[0]
        if d == axis:
            return [Mixed(node, f"{_name(node)} along the batch axis")] + [None] * (n_out - 1)
        out_d = d + 1 if node.params.get("drop") and d < axis else d
        if len(out_shape) + out_d < 0 or out_shape[out_d] != node.shape(0)[d]:
            return [Unknown(f"{_name(node)} keeps fewer rows than its data has")] * n_out
        return [out_d] + [None] * (n_out - 1)
    if kind == "matmul":
        found = set()
        for pos, d in ins.items():
            contracted, kept = (-1, -2) if pos == 0 else (-2, -1)
            if d == contracted:
                return [Mixed(node, "matmul contracts the batch axis")]
            found.add(d)
        if len(found) > 1:
            return [Mixed(node, "matmul combines rows along different axes")]
        return [found.pop()]
    if kind == "einsum":
        labels, out = einsum_spec(node)
        found = set()
        for pos, d in ins.items():
            lab = labels[pos]
            label = lab[d]
            if lab.count(label) > 1:
                return [Unknown(f"{_name(node)} takes a diagonal of the batch axis")]
            if label not in out:
                return [Mixed(node, f"{_name(node)} contracts the batch axis")]
            found.add(label)
        if len(found) > 1:
            return [Mixed(node, f"{_name(node)} combines rows along different axes")]
        return [out.index(found.pop()) - len(out)]
    if kind == "core":
        core_in = rule.extra.get("core_in", 2)
        outs = []
        for shape in node.out_shapes:
            got = set()
            for pos, d in ins.items():
                s = node.shape(pos)
                p = d + len(s)
                if p >= len(s) - core_in or p >= len(shape) or shape[p] != batch:
                    return [Mixed(node, f"{_name(node)} acts across the batch axis")] * n_out
                got.add(p - len(shape))
            if len(got) > 1:
                return [Mixed(node, f"{_name(node)} combines rows along different axes")] * n_out
            outs.append(got.pop())
        return outs
    if kind == "call" and node.inner is not None:
        results = None
        for sub in (node.inner if isinstance(node.inner, list) else [node.inner]):
            env = {}
            for pos, vid in zip(node.extra_positions, sub.inputs):
                if pos in ins:
                    env[vid] = ins[pos]
            _walk(sub, env, batch)
            got = [env.get(v) if v is not None else None for v in sub.outputs]
            if results is None:
                results = got
            else:
                results = [a if b is None or b == a else (b if a is None else
                           (a if isinstance(a, Mixed) else b if isinstance(b, Mixed)
                            else Mixed(node, f"{_name(node)} branches put the batch on different axes")))
                           for a, b in zip(results, got)]
        return results
    return [Unknown(f"no row rule for the primitive {_name(node)!r}")] * n_out


def _structural(node, ins, batch):
    name = _name(node)
    blocked = any(isinstance(s, Blocked) for s in ins.values())
    if name == "reshape" and not blocked:
        (pos, d), = ins.items()
        s, t = node.shape(pos), node.out_shapes[0]
        prefix = math.prod(s[:d + len(s)])
        for q in range(len(t)):
            if math.prod(t[:q]) == prefix and t[q] == batch:
                return q - len(t)
        # the batch merged with other axes (or split): read from row numbers below
    elif name in ("permute_dims", "transpose"):
        (pos, d), = ins.items()
        axes = node.params.get("axes", node.params.get("permutation"))
        nd = len(node.shape(pos))
        m, strided = (d.m, isinstance(d, Strided)) if blocked else (1, False)
        d = d.axis if blocked else d
        return _row(list(int(a) % nd for a in axes).index(d + nd) - nd, m, strided)
    elif name == "matrix_transpose":
        (pos, d), = ins.items()
        if blocked:
            return _row({-1: -2, -2: -1}.get(d.axis, d.axis), d.m, isinstance(d, Strided))
        return {-1: -2, -2: -1}.get(d, d)
    if name == "gather" and "dimension_numbers" in node.params and set(ins) == {0}:
        # a jaxpr gather whose operand and indices share the batch as their first batching axis (what
        # take_along_axis makes): row i reads row i, whatever the indices' values
        dn = node.params["dimension_numbers"]
        d = ins[0]
        if d == -len(node.shape(0)) and tuple(getattr(dn, "operand_batching_dims", ()))[:1] == (0,) and tuple(
                getattr(dn, "start_indices_batching_dims", ()))[:1] == (0,) and 0 not in tuple(dn.offset_dims):
            return -len(node.out_shapes[0])
    # every other structural operation: its own implementation applied to row numbers (0: not a row)
    args = list(node.args)
    for pos in sorted(node.data):
        shape = node.shape(pos)
        if pos in ins:
            d, m = (ins[pos].axis, ins[pos].m) if isinstance(ins[pos], Blocked) else (ins[pos], 1)
            rows = _row_numbers(shape[d], m, isinstance(ins[pos], Strided), batch).reshape(
                [-1 if k == d + len(shape) else 1 for k in range(len(shape))])
            args[pos] = np.broadcast_to(rows, shape).copy()
        else:
            args[pos] = np.zeros(shape, dtype=np.int64)
    for pos, a in enumerate(args):
        if pos not in node.data and type(a).__name__ == "Aval":
            return Unknown(f"{name}: an index operand is computed from the input")
    out = np.asarray(node.fn(*args, **node.params))
    if not out.any():
        return None
    nd = out.ndim
    for q in range(nd):
        if batch == 0 or out.shape[q] % batch or not out.shape[q]:
            continue
        m = out.shape[q] // batch  # rows in blocks of m along q (m == 1: plain rows), or every batch-th
        for strided in ((False, True) if m > 1 else (False,)):
            expected = _row_numbers(out.shape[q], m, strided, batch).reshape([-1 if k == q else 1
                                                                             for k in range(nd)])
            if np.all((out == expected) | (out == 0)):
                return _row(q - nd, m, strided)
    return Mixed(node, f"{name} moves or combines rows of the batch")
