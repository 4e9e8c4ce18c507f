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

from ._rules import einsum_spec, lane_axes, neg_axes, op_name, reduce_axes, rule_for


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


def _merged_rows(n, m, strided, batch):
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
        idx = {pos: env[vid] for pos, vid in node.index.items() if vid in env}
        if not ins and not idx:
            continue
        bad = [s for s in ins.values() if isinstance(s, Mixed)] or [s for s in ins.values() if isinstance(s, Unknown)]
        if bad:
            out = bad[0]
            if isinstance(out, Mixed) and rule_for(node.name).kind == "zero" and rule_for(node.name).extra.get("in_value"):
                # (stop_gradient(mean(x, 0)), argmax over the batch: rows coupled in value, not in derivative)
                out = Unknown(f"{_name(node)}{_where(node)} of a value that mixes rows ({out.describe()}): no "
                              f"derivative flows through it, but the value of every row depends on the others")
            for vid in node.outs:
                env[vid] = out
            continue
        try:
            outs = _apply_index(node, ins, idx, batch) if idx else _apply(node, ins, batch)
        except Exception as exc:  # a rule that cannot read this node: give up, never guess
            outs = [Unknown(f"the row rule for {node.name!r} failed ({type(exc).__name__}: {exc})")] * len(node.outs)
        for vid, s in zip(node.outs, outs):
            if s is not None:
                env[vid] = s


def _where(node):
    return f" at {node.site}" if node.site else ""


def _apply_index(node, ins, idx, batch):
    """A node whose index or predicate operands (no derivative flows through them, but they decide its
    value) depend on the batch. Rows stay apart only where row i of the value is decided by row i of
    them: a ``select_n`` predicate, a comparison's operands, a row-wise gather's indices, a loop's
    predicate read by its own rule. Anything else: the proof gives up (not MIXED: the derivative of
    row i may still depend on row i alone, a probe and the sum trick decide), with the reason."""
    n_out = len(node.outs)
    name = _name(node)
    for s in idx.values():
        if isinstance(s, (Mixed, Unknown)):
            why = s.why if isinstance(s, Unknown) else f"{s.describe()} mixes rows"
            return [Unknown(f"{name}{_where(node)} reads an index or a predicate computed from several rows of the "
                            f"batch ({why}): the value of every row depends on the others")] * n_out
    kind = rule_for(node.name).kind
    if kind in ("elementwise", "zero"):  # a predicate or an operand without derivative, read element by element
        return _apply(node, {**ins, **idx}, batch)
    if kind == "loop":
        return _loop(node, ins, idx, batch)
    if kind == "structural" and name == "gather" and set(idx) == {1}:
        got = _structural(node, ins, batch, idx)
        if got is not None and not isinstance(got, Mixed):
            return [got]
    return [Unknown(f"{name}{_where(node)} takes indices computed from the batch values")] * n_out


def _zero(node, ins, batch):
    """An operation without derivative (a comparison, a rounding, argmax, stop_gradient): no
    derivative flows through it, but its value does (a per-example evaluation must see the same)."""
    n_out = len(node.outs)
    name = _name(node)
    axes = {s for s in ins.values()}
    if len(axes) != 1 or any(isinstance(s, Blocked) for s in axes):
        return [Unknown(f"{name}{_where(node)} combines rows along different axes")] * n_out
    d = axes.pop()
    if name in ("argmax", "argmin") and "axes" in node.params:
        (pos,) = ins
        red = neg_axes(node.params["axes"], len(node.shape(pos)))
        if d in red:
            return [Unknown(f"{name}{_where(node)} over the batch axis: its value depends on every row")] * n_out
        return [d + sum(1 for a in red if a > d)] * n_out
    for pos in ins:
        if node.shape(pos) != tuple(node.out_shapes[0]):
            return [Unknown(f"no row rule for the value of {name}{_where(node)}")] * n_out
    if name.startswith("random") or name in ("iota", "rng_bit_generator", "rng_uniform"):
        return [Unknown(f"no row rule for the value of {name}{_where(node)}")] * n_out
    return [d] * n_out


_LOOP_PASSES = 12  # passes over a loop body for the row states of its carries (each may change twice)


def _join(a, b, node):
    if a is None or a == b and type(a) is type(b):
        return b
    if b is None:
        return a
    for s in (a, b):
        if isinstance(s, Mixed):
            return s
    for s in (a, b):
        if isinstance(s, Unknown):
            return s
    return Unknown(f"the carry of {_name(node)}{_where(node)} holds the batch on different axes in different "
                   f"iterations")


def _loop(node, ins, idx, batch):
    """A scan or while loop (not unrolled): the body walked until its carries' row states are fixed
    (FREE < ROW(d) < MIXED; each iteration's state is within the joined one). A scan along the batch
    axis itself is a map over rows when no carry picks up a row (:func:`_scan_over_rows`). A while loop
    whose predicate depends on the batch stops on all rows at once: each row's value depends on the
    others through the trip count (Unknown: the derivative of row i may still be row i's alone)."""
    n_out = len(node.outs)
    name = _name(node)
    body = node.inner[0]
    scan = op_name(node.name) == "scan"
    if scan:
        nc, ncar = node.params["num_consts"], node.params["num_carry"]
        first, shift = nc, 0
        over = [pos for pos, s in ins.items() if pos >= nc + ncar and s == -len(node.shape(pos))
                and not isinstance(s, Blocked)]
        if over or any(isinstance(s, Blocked) and s.axis == -len(node.shape(pos)) for pos, s in ins.items()
                       if pos >= nc + ncar):
            return _scan_over_rows(node, ins, over, batch)
    else:
        cn, bn = node.params["cond_nconsts"], node.params["body_nconsts"]
        first, shift = cn + bn, cn
        ncar = len(node.args) - first
    carries = range(first, first + ncar)
    fixed = {pos - shift: s for pos, s in ins.items() if pos not in carries}  # (a scan's slices: the same axis)
    carry = {pos: ins[pos] for pos in carries if pos in ins}
    for _ in range(_LOOP_PASSES):
        env = {}
        for k, vid in enumerate(body.inputs):
            s = carry.get(k + shift) if k + shift in carries else fixed.get(k)
            if s is not None:
                env[vid] = s
        _walk(body, env, batch)
        got = [env.get(v) if v is not None else None for v in body.outputs]
        changed = False
        for j, pos in enumerate(carries):
            new = _join(carry.get(pos), got[j], node)
            if new is not carry.get(pos) and not (new == carry.get(pos) and type(new) is type(carry.get(pos))):
                carry[pos], changed = new, True
        if not changed:
            break
    else:
        return [Unknown(f"{name}{_where(node)}: no fixed point of its carries' rows")] * n_out
    outs = [carry.get(pos) for pos in carries]
    if scan:
        return outs + got[ncar:]  # a slice's negative axes are those of the stacked output
    cond = node.inner[1]
    env = {}
    for k, vid in enumerate(cond.inputs):
        s = idx.get(k) if k < shift else carry.get(k - shift + first)
        if s is not None:
            env[vid] = s
    _walk(cond, env, batch)
    pred = env.get(cond.outputs[0]) if cond.outputs[0] is not None else None
    if pred is not None:
        why = pred.describe() if isinstance(pred, Mixed) else getattr(pred, "why", f"ROW {pred}")
        return [Unknown(f"{name}{_where(node)} stops on a predicate computed from the batch ({why}): every row's "
                        f"value depends on the others through the trip count")] * n_out
    return outs


def _scan_over_rows(node, ins, over, batch):
    """A scan whose scanned operands carry the batch on the scanned axis: iteration t reads row t. Its
    outputs are ROW when nothing but those rows depends on the batch and no carry picks up a row (a
    map over rows); a carry that does passes row t to row t+1: MIXED where it reaches an output."""
    n_out = len(node.outs)
    name = _name(node)
    nc, ncar = node.params["num_consts"], node.params["num_carry"]
    if set(ins) != set(over):
        return [Unknown(f"{name}{_where(node)} scans over the batch axis with other operands that depend on the "
                        f"batch")] * n_out
    body = node.inner[0]
    current = {body.inputs[pos] for pos in over}
    carried = set()  # body inputs (carries) holding earlier rows
    for _ in range(ncar + 2):
        now, before = _taint(body, current, carried)
        new = {body.inputs[nc + j] for j, v in enumerate(body.outputs[:ncar]) if v in now or v in before}
        if new <= carried:
            break
        carried |= new
    outs = []
    for j, v in enumerate(body.outputs):
        if v is None or (v not in now and v not in before):
            outs.append(None)
        elif j < ncar or v in before:
            outs.append(Mixed(node, f"{name} carries state from one row of the batch to the next"))
        else:
            outs.append(-len(node.out_shapes[j]))
    return outs


def _taint(program, current, carried):
    """Values that depend (through any operand, an index included) on ``current`` and on ``carried``."""
    now, before = set(current), set(carried)
    for node in program.nodes:
        ids = list(node.traced.values()) + list(node.index.values())
        if any(v in now for v in ids):
            now.update(node.outs)
        if any(v in before for v in ids):
            before.update(node.outs)
    return now, before


def _name(node):
    return op_name(node.name)


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
    if kind == "zero":  # a jaxpr's rows must hold in value too (JAX evaluates a proved f one row at a time)
        return _zero(node, ins, batch) if rule.extra.get("in_value") else [None] * n_out
    if kind == "loop":
        return _loop(node, ins, {}, batch)
    if kind == "scatter":
        return [_scatter(node, ins, batch)] + [None] * (n_out - 1)
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
    if kind == "gather":  # TensorFlow's GatherV2 with computed indices (no derivative): out = x.shape[:axis] +
        # index.shape[batch_dims:] + x.shape[axis + 1:], the first batch_dims axes shared by x and the index
        if set(ins) != {0}:
            return [Unknown(f"{_name(node)} with a row-dependent operand other than its data")] * n_out
        nd = len(node.shape(0))
        p = ins[0] + nd
        axis, bd, ir = node.params["axis"], node.params["batch_dims"], node.params["index_rank"]
        if p == axis:  # rows picked by indices whose values decide (the identity keeps them apart)
            return [Unknown(f"{_name(node)}{_where(node)} along the batch axis at indices computed in the program")]
        out_shape = node.out_shapes[0]
        q = p if p < axis else p + ir - bd - 1
        if not 0 <= q < len(out_shape) or out_shape[q] != node.shape(0)[p]:
            return [Unknown(f"{_name(node)}: the batch axis not found in its result")]
        return [q - len(out_shape)]
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
    why = node.params.get("reason") if kind == "unknown" and isinstance(node.params.get("reason"), str) else None
    return [Unknown(f"{why}{_where(node)}" if why else f"no row rule for the primitive {_name(node)!r}")] * n_out


def _structural(node, ins, batch, idx=None):
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
    if name == "gather" and "dimension_numbers" in node.params and set(ins) <= {0}:
        # a jaxpr gather whose operand and indices share the batch as their first batching axis (what
        # take_along_axis makes): row i reads row i, whatever the values of the indices (FREE, or row i's)
        dn = node.params["dimension_numbers"]
        d = ins.get(0, -len(node.shape(0)))
        if d == -len(node.shape(0)) and tuple(getattr(dn, "operand_batching_dims", ()))[:1] == (0,) and tuple(
                getattr(dn, "start_indices_batching_dims", ()))[:1] == (0,) and 0 not in tuple(dn.offset_dims) and (
                not idx or idx == {1: -len(node.shape(1))}):
            return -len(node.out_shapes[0])
        if idx:
            return None
        if type(node.args[1]).__name__ == "Aval":
            return _window(node, ins, node.shape(0), set(dn.collapsed_slice_dims) | set(dn.start_index_map) | set(
                getattr(dn, "operand_batching_dims", ())), tuple(dn.offset_dims), tuple(node.params["slice_sizes"]),
                {0: None})
    if name in ("dynamic_slice", "dynamic_update_slice") and any(
            type(a).__name__ == "Aval" for pos, a in enumerate(node.args) if pos not in node.data):
        return _dynamic(node, ins)
    # every other structural operation: its own implementation applied to row numbers (0: not a row)
    args = list(node.args)
    for pos in sorted(node.data):
        args[pos] = _row_numbers(node.shape(pos), ins.get(pos), batch)
    for pos, a in enumerate(args):
        if pos not in node.data and type(a).__name__ == "Aval":
            return Unknown(f"{name}: an index operand is computed from the input")
    return _rows_of(np.asarray(node.fn(*args, **node.params)), node, batch)


def _row_numbers(shape, state, batch):
    """1 + the row each element of a value belongs to (0: FREE)."""
    if state is None:
        return np.zeros(shape, dtype=np.int64)
    d, m = (state.axis, state.m) if isinstance(state, Blocked) else (state, 1)
    rows = _merged_rows(shape[d], m, isinstance(state, Strided), batch).reshape(
        [-1 if k == d + len(shape) else 1 for k in range(len(shape))])
    return np.broadcast_to(rows, shape).copy()


def _dynamic(node, ins):
    """dynamic_slice / dynamic_update_slice at starts computed in the program (FREE: the same for every
    row). Along an axis taken whole the start is clamped to 0, so rows along it stay where they are."""
    name = _name(node)
    axes = {s.axis if isinstance(s, Blocked) else s for s in ins.values()}
    states = set(ins.values())
    if len(states) != 1:
        return Unknown(f"{name}{_where(node)} at starts computed in the program, rows along different axes")
    state = states.pop()
    d = axes.pop()
    big = node.shape(0)
    small = node.shape(1) if name == "dynamic_update_slice" else tuple(node.params["slice_sizes"])
    whole = small[d] == big[d]
    if name == "dynamic_slice" and whole:
        return state
    if name == "dynamic_update_slice" and (whole or set(ins) == {0}):  # (a FREE update over some rows: kept)
        return state
    return Unknown(f"{name}{_where(node)} at starts computed in the program cuts across the batch axis")


def _scatter(node, ins, batch):
    """A jaxpr scatter with known indices: each output element gathers the rows of the operand element
    it keeps and of the updates landing on it (``Node.targets``, the front-end's); rows combined:
    MIXED. Indices computed in the program: rows stay apart when the operand alone carries them and
    the updates are FREE... which cannot be told from here in general: the proof gives up."""
    name = _name(node)
    targets = node.targets() if node.targets is not None else None
    if targets is None:
        dn = node.params["dimension_numbers"]
        op_shape = node.shape(0)
        batching = set(getattr(dn, "operand_batching_dims", ()))
        window = [p for p in range(len(op_shape)) if p not in dn.inserted_window_dims and p not in batching]
        up_shape = node.shape(2)
        sizes = [1] * len(op_shape)
        for p, u in zip(window, dn.update_window_dims):
            sizes[p] = up_shape[u]
        return _window(node, ins, op_shape, set(dn.inserted_window_dims) | set(dn.scatter_dims_to_operand_dims)
                       | batching, tuple(dn.update_window_dims), tuple(sizes), {0: "same", 2: "window"})
    anywhere, surely = targets
    out = _row_numbers(node.shape(0), ins.get(0), batch).ravel()
    if name == "scatter" and surely is not None:
        out[surely[surely > 0] - 1] = 0  # overwritten
    up = _row_numbers(node.shape(2), ins.get(2), batch).ravel()
    way, src = np.nonzero(anywhere)
    dst, rows = anywhere[way, src] - 1, up[src]
    dst, rows = dst[rows > 0], rows[rows > 0]
    big = np.iinfo(np.int64).max
    lo = np.where(out > 0, out, big)
    hi = out.copy()
    np.minimum.at(lo, dst, rows)
    np.maximum.at(hi, dst, rows)
    if np.any((lo != big) & (lo != hi)):
        return Mixed(node, f"{name} combines rows of the batch")
    return _rows_of(np.where(lo == big, 0, lo).reshape(node.out_shapes[0]), node, batch)


def _window(node, ins, op_shape, indexed, window_dims, sizes, roles):
    """A gather or scatter at indices computed in the program (FREE: the same for every row) that takes
    the batch axis whole as a window axis no index moves: row i stays row i. ``roles``: position ->
    None (the gather's operand: the batch goes to its window axis in the output), "same" (the
    scatter's operand: same axis), "window" (the scatter's updates: their window axis)."""
    name = _name(node)
    found = set()
    nd = len(op_shape)
    if roles.get(0) == "same" and set(ins) == {0}:  # FREE updates anywhere: element j keeps operand row j's
        return ins[0]
    for pos, s in ins.items():
        if isinstance(s, Blocked) or pos not in roles:
            return Unknown(f"{name}{_where(node)} at indices computed in the program")
        shape = node.shape(pos)
        axis = s + len(shape)
        if roles[pos] == "window":  # the updates' window axis -> the operand axis it writes along
            if axis not in window_dims:
                return Unknown(f"{name}{_where(node)} scatters the batch axis at indices computed in the program")
            p = _operand_axis(node, window_dims.index(axis))
        else:
            p = axis
        if p is None or p in indexed or sizes[p] != op_shape[p]:
            return Unknown(f"{name}{_where(node)} at indices computed in the program cuts across the batch axis")
        found.add(p)
    if len(found) != 1:
        return Unknown(f"{name}{_where(node)} combines rows along different axes")
    p = found.pop()
    out_nd = len(node.out_shapes[0])
    if roles.get(0) is None:  # gather: the operand's window axes go to offset_dims in order
        dn = node.params["dimension_numbers"]
        collapsed = set(dn.collapsed_slice_dims) | set(getattr(dn, "operand_batching_dims", ()))
        rank = [q for q in range(nd) if q not in collapsed].index(p)
        return window_dims[rank] - out_nd
    return p - nd


def _operand_axis(node, k):
    """The operand axis of a scatter's k-th update window axis."""
    dn = node.params["dimension_numbers"]
    batching = set(getattr(dn, "operand_batching_dims", ()))
    window = [p for p in range(len(node.shape(0))) if p not in dn.inserted_window_dims and p not in batching]
    return window[k] if k < len(window) else None


def _rows_of(out, node, batch):
    """The row state of a value from its row numbers (0: FREE), or MIXED when they are not in order."""
    name = _name(node)
    if not out.any():
        return None
    nd = out.ndim
    for q in range(nd):
        if batch == 0 or out.shape[q] % batch or not out.shape[q]:
            continue
        m = out.shape[q] // batch  # rows in blocks of m along q (m == 1: plain rows), or every batch-th
        for strided in ((False, True) if m > 1 else (False,)):
            expected = _merged_rows(out.shape[q], m, strided, batch).reshape([-1 if k == q else 1
                                                                             for k in range(nd)])
            if np.all((out == expected) | (out == 0)):
                return _row(q - nd, m, strided)
    return Mixed(node, f"{name} moves or combines rows of the batch")
