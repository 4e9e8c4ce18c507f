"""Element index sets: which inputs each element depends on (first order), and which pairs of inputs
interact non-linearly (second order), propagated through a :class:`~._program.Program` by the rule
table. A value's set is a boolean ``scipy.sparse.csr_array`` (elements x inputs); the pairs are one
global boolean matrix (inputs x inputs), the union over every operation, as SparseConnectivityTracer's
global Hessian tracer keeps it (a superset of each output's own Hessian pattern)."""

from __future__ import annotations

import math

import numpy as np

from ._rules import codes, einsum_spec, lane_axes, op_name, reduce_axes, rule_for

_PAIR_LIMIT = 20_000_000  # pairs a rule may enumerate before it answers a (sound) superset instead
_FIXED_POINT = 100  # passes over a loop's body before its carries are widened to everything they may reach
_EXACT_PASSES = 2000  # a loop with a known trip count up to this is iterated exactly (not unrolled: too long)
_WORK = 20_000_000  # set elements a loop's passes may process before it widens (sound, with a reason)


def _sp():
    import scipy.sparse as sp
    return sp


def empty(rows, n):
    return _sp().csr_array((rows, n), dtype=bool)


def pattern(rows, cols, shape):
    """A boolean csr_array with ones at (rows, cols) (duplicates allowed)."""
    rows = np.asarray(rows, dtype=np.int64).ravel()
    cols = np.asarray(cols, dtype=np.int64).ravel()
    if rows.size:
        key = np.unique(rows * shape[1] + cols)
        rows, cols = key // shape[1], key % shape[1]
    return _sp().csr_array((np.ones(rows.size, dtype=bool), (rows, cols)), shape=shape)


def select(code, n_src):
    """Rows picking source rows ``code - 1`` (code 0: an empty row)."""
    code = np.asarray(code, dtype=np.int64).ravel()
    rows = np.nonzero(code)[0]
    return pattern(rows, code[rows] - 1, (code.size, n_src))


def _or(parts, rows, n):
    out = None
    for p in parts:
        out = p if out is None else out + p
    return empty(rows, n) if out is None else out.astype(bool)


class SetInterpreter:
    """Runs a program over element index sets. ``hessian``: also collect the interacting pairs."""

    def __init__(self, n_inputs: int, hessian: bool = False):
        self.n = n_inputs
        self.hessian = hessian
        self.pairs = []  # (A, B): A.T @ B are interacting pairs
        self.reasons = []

    def widen(self, reason):
        if reason not in self.reasons:
            self.reasons.append(reason)

    def _pair(self, a, b):
        if self.hessian and a.nnz and b.nnz:
            self.pairs.append((a, b))

    def hessian_pattern(self):
        h = empty(self.n, self.n)
        for a, b in self.pairs:
            h = h + (a.T @ b).astype(bool)
        return (h + h.T).astype(bool)

    def run(self, program, env):
        for node in program.nodes:
            ins = {pos: env[vid] for pos, vid in node.traced.items() if vid in env}
            ins = {pos: m for pos, m in ins.items() if m.nnz}
            if not ins:
                continue
            outs = self.apply(node, ins)
            for vid, m in zip(node.outs, outs):
                if m is not None:
                    env[vid] = m
        return env

    # ------------------------------------------------------------------------------- the rules
    def apply(self, node, ins):
        rule = rule_for(node.name)
        kind = rule.kind
        if kind == "zero":
            return [None] * len(node.outs)
        if kind == "call":
            return self._call(node, ins, rule)
        if kind == "unknown":
            why = node.params.get("reason") if isinstance(node.params.get("reason"), str) else None
            return self._unknown(node, ins, why or f"no rule for the primitive {node.name!r}")
        method = getattr(self, "_" + kind, None)
        if method is None:
            return self._unknown(node, ins, f"no rule for the primitive {node.name!r}")
        try:
            return method(node, ins, rule)
        except Exception as exc:  # a rule that cannot read this node's parameters: widen, never guess
            return self._unknown(node, ins, f"the rule for {node.name!r} failed ({type(exc).__name__}: {exc})")

    def _unknown(self, node, ins, reason):
        self.widen(reason + (f" at {node.site}" if node.site else "") + ": its outputs depend on all of its inputs")
        union = _or([_sp().csr_array(np.asarray(m.sum(axis=0)).reshape(1, -1) > 0) for m in ins.values()], 1, self.n)
        if self.hessian:
            self._pair(union, union)
        outs = []
        for shape in node.out_shapes:
            size = math.prod(shape)
            outs.append(_sp().csr_array(np.ones((size, 1), dtype=bool)) @ union if size else empty(0, self.n))
        return [o.astype(bool) for o in outs]

    def _elementwise(self, node, ins, rule):
        shape = node.out_shapes[0]
        size = math.prod(shape)
        parts = {}
        for pos, m in ins.items():
            c = np.broadcast_to(codes(node.shape(pos)), shape)
            parts[pos] = (select(c, m.shape[0]) @ m).astype(bool)
        out = _or(parts.values(), size, self.n)
        if self.hessian:
            if rule.order == "nonlinear":
                self._pair(out, out)
            elif rule.order == "bilinear":
                ps = list(parts.values())
                for i in range(len(ps)):
                    for j in range(i + 1, len(ps)):
                        self._pair(ps[i], ps[j])
            elif rule.order == "divide" and 1 in parts:
                self._pair(parts[1], parts[1])
                if 0 in parts:
                    self._pair(parts[0], parts[1])
        return [out]

    def _structural(self, node, ins, rule):
        unknown = [pos for pos, a in enumerate(node.args) if pos not in node.data and type(a).__name__ == "Aval"]
        if unknown and op_name(node.name) in ("dynamic_slice", "dynamic_update_slice"):
            return self._dynamic(node, ins)
        if unknown:  # a gather (or other move) by indices computed from the input: any element may be read
            self.widen(f"{node.name} with indices computed from the input" + (f" at {node.site}" if node.site
                       else "") + ": each of its output elements may read any element its window may cover")
            got = self._gather_anywhere(node, ins) if op_name(node.name) == "gather" and set(ins) == {0} else None
            return [got if got is not None else self._spread(node, ins, node.out_shapes[0])]
        args = list(node.args)
        offset, stack = 1, []
        for pos in sorted(node.data):
            shape = node.shape(pos)
            if pos in ins:
                args[pos] = codes(shape, offset)
                offset += math.prod(shape)
                stack.append(ins[pos])
            else:
                args[pos] = np.zeros(shape, dtype=np.int64)
        for pos, a in enumerate(args):
            if pos not in node.data and type(a).__name__ == "Aval":
                raise ValueError("an index operand is computed from the input")
        out = np.asarray(node.fn(*args, **node.params)).astype(np.int64)
        src = _sp().vstack(stack, format="csr") if len(stack) > 1 else stack[0]
        return [(select(out, src.shape[0]) @ src).astype(bool)]

    def _spread(self, node, ins, shape):
        """Every element of ``shape`` depending on every input element (a linear, order-free superset)."""
        union = _or([_sp().csr_array(np.asarray(m.sum(axis=0)).reshape(1, -1) > 0) for m in ins.values()], 1, self.n)
        return (_sp().csr_array(np.ones((math.prod(shape), 1), dtype=bool)) @ union).astype(bool)

    def _gather_anywhere(self, node, ins):
        """A jaxpr gather at indices computed from the input: output element e may read, along each
        operand axis an index moves, any position its window coordinate allows (a start clamped into
        range), and along the others exactly its window coordinate. None when too large to list (or
        with batching axes): the caller spreads."""
        dn = node.params["dimension_numbers"]
        op_shape, out_shape = node.shape(0), tuple(node.out_shapes[0])
        sizes = tuple(node.params["slice_sizes"])
        if tuple(getattr(dn, "operand_batching_dims", ())) or math.prod(out_shape) * math.prod(op_shape) > _PAIR_LIMIT:
            return None
        collapsed, moved = set(dn.collapsed_slice_dims), set(dn.start_index_map)
        grid = np.indices(out_shape).reshape(len(out_shape), -1) if out_shape else np.zeros((0, 1), np.int64)
        offsets = iter(dn.offset_dims)
        allowed = np.ones((grid.shape[1],) + tuple(op_shape), dtype=bool)
        for p, n_p in enumerate(op_shape):
            w = np.zeros(grid.shape[1], dtype=np.int64) if p in collapsed else grid[next(offsets)]
            c = np.arange(n_p)[None, :]
            ok = (c >= w[:, None]) & (c <= w[:, None] + n_p - sizes[p]) if p in moved else c == w[:, None]
            allowed &= ok.reshape((grid.shape[1],) + tuple(n_p if q == p else 1 for q in range(len(op_shape))))
        rows, cols = np.nonzero(allowed.reshape(grid.shape[1], -1))
        return (pattern(rows, cols, (grid.shape[1], ins[0].shape[0])) @ ins[0]).astype(bool)

    def _dynamic(self, node, ins):
        """dynamic_slice / dynamic_update_slice with start indices computed from the input: the union
        over every start the clamping allows, one axis at a time (a Kronecker product of bands)."""
        sp = _sp()
        update = op_name(node.name) == "dynamic_update_slice"
        self.widen(f"{node.name} with start indices computed from the input" + (f" at {node.site}" if node.site
                   else "") + ": every start it may take counts")
        big = node.shape(0)
        small = node.shape(1) if update else tuple(node.params["slice_sizes"])
        starts = node.args[2:] if update else node.args[1:]
        band = sp.csr_array(np.ones((1, 1), dtype=bool))
        for d, (n_big, n_small) in enumerate(zip(big, small)):
            st = starts[d]
            if type(st).__name__ == "Aval":
                possible = np.arange(n_big - n_small + 1)
            else:
                possible = np.array([int(np.clip(np.asarray(st), 0, n_big - n_small))])
            i = np.repeat(np.arange(n_small), possible.size)
            band = sp.kron(band, pattern(i + np.tile(possible, n_small), i, (n_big, n_small)), format="csr")
        outs = []
        if update:  # out = operand (where not overwritten: kept, a superset) and the update, anywhere allowed
            parts = [ins[0]] if 0 in ins else []
            if 1 in ins:
                parts.append((band @ ins[1]).astype(bool))
            outs.append(_or(parts, math.prod(big), self.n))
        else:
            outs.append((band.T @ ins[0]).astype(bool))
        return outs

    def _scatter(self, node, ins, rule):
        """A jaxpr scatter (``x.at[i].set/add/mul/min/max``): out[j] <- operand[j] (unless a ``set``
        surely overwrites it) and every update element that lands on j. Where each update lands is
        read from a gather of element codes with the scatter's own indices (its transpose); indices
        computed from the input: every update may land anywhere."""
        size = math.prod(node.shape(0))
        targets = node.targets() if node.targets is not None else None
        parts = []
        if targets is None:
            self.widen(f"{node.name} with indices computed from the input" + (f" at {node.site}" if node.site
                       else "") + ": each update may land on any element")
        if 0 in ins:
            m = ins[0]
            if op_name(node.name) == "scatter" and targets is not None and targets[1] is not None:
                keep = np.ones(size, dtype=bool)
                keep[targets[1][targets[1] > 0] - 1] = False  # surely overwritten by an update
                on = np.nonzero(keep)[0]
                m = (pattern(on, on, (size, size)) @ m).astype(bool)
            parts.append(m)
        if 2 in ins:
            if targets is None:
                parts.append(self._spread(node, {2: ins[2]}, node.shape(0)))
            else:
                t = targets[0]
                way, src = np.nonzero(t)
                parts.append((pattern(t[way, src] - 1, src, (size, t.shape[1])) @ ins[2]).astype(bool))
        out = _or(parts, size, self.n)
        if self.hessian and rule.order == "nonlinear":
            self._pair(out, out)
        return [out]

    def _loop(self, node, ins, rule):
        """A scan or a while loop not unrolled: its body run to a fixed point over the carries' sets
        (each carry the union of its sets over iterations, a scan's slices the union of every slice);
        every iteration's sets are within it, whatever the trip count. At the cap: everything the
        loop's operands depend on."""
        body = node.inner[0]
        scan = op_name(node.name) == "scan"
        if scan:
            nc, ncar, length = node.params["num_consts"], node.params["num_carry"], node.params["length"]
            first = nc  # first carry position
        else:
            first = node.params["cond_nconsts"] + node.params["body_nconsts"]
            ncar = len(node.args) - first
        carries = range(first, first + ncar)
        fixed = {}  # body input position -> set, for consts and slices
        for pos, m in ins.items():
            if pos in carries:
                continue
            if scan and pos >= first + ncar:  # the union of every slice of a scanned operand
                s = m.shape[0] // length if length else 0
                if s == 0:
                    continue
                k = np.arange(length * s)
                m = (pattern(k % s, k, (s, length * s)) @ m).astype(bool)
            fixed[pos - (0 if scan else node.params["cond_nconsts"])] = m
        carry = {pos: ins[pos] for pos in carries if pos in ins}
        shift = 0 if scan else node.params["cond_nconsts"]

        def step():
            env = {}
            for k, vid in enumerate(body.inputs):
                m = fixed.get(k) if (k + shift) not in carries else carry.get(k + shift)
                if m is not None and m.nnz:
                    env[vid] = m
            self.run(body, env)
            return [env.get(v) if v is not None else None for v in body.outputs]

        if scan and not any(pos >= first + ncar for pos in ins) and 0 < length <= _EXACT_PASSES:
            # a known trip count and nothing scanned (a fori_loop): the body applied exactly `length`
            # times to the carries' sets; once a pass changes nothing, none after it will (same body,
            # same constants), so the carries are exact for the body's rules whatever the length;
            # each y the union of its sets over the passes
            ys, work = [None] * (len(body.outputs) - ncar), 0
            for _ in range(length):
                got = step()
                ys = [y if g is None else g if y is None else (y + g).astype(bool) for y, g in zip(ys, got[ncar:])]
                new = {pos: got[j] for j, pos in enumerate(carries) if got[j] is not None and got[j].nnz}
                same = new.keys() == carry.keys() and all(not (new[p] != carry[p]).nnz for p in new)
                carry = new
                work += sum(m.nnz for m in new.values())
                if same or work > _WORK:
                    break
            if work > _WORK:  # (a fixed point from here would only take more)
                return self._unknown(node, ins, f"{node.name} too costly to follow ({length} iterations)")
            return [carry.get(pos) for pos in carries] + [
                None if y is None else _sp().vstack([y] * length, format="csr") for y in ys]
        work = 0
        for _ in range(_FIXED_POINT):
            got = step()
            work += sum(m.nnz for m in carry.values())
            if work > _WORK:
                return self._unknown(node, ins, f"{node.name} too costly to follow to a fixed point")
            changed = False
            for j, pos in enumerate(carries):
                new = got[j]
                if new is None or not new.nnz:
                    continue
                old = carry.get(pos)
                joined = new if old is None else (old + new).astype(bool)
                if old is None or (joined != old).nnz:
                    carry[pos], changed = joined, True
            if not changed:
                break
        else:
            return self._unknown(node, ins, f"{node.name} did not reach a fixed point in {_FIXED_POINT} passes")
        outs = [carry.get(pos) for pos in carries]
        if scan:
            for j, y in enumerate(got[ncar:]):
                outs.append(None if y is None else _sp().vstack([y] * length, format="csr") if length else
                            empty(0, self.n))
        return outs

    def _reduce(self, node, ins, rule):
        (pos, m), = ins.items()
        in_shape = node.shape(pos)
        axes, _ = reduce_axes(node, len(in_shape))
        keep = tuple(1 if k - len(in_shape) in axes else s for k, s in enumerate(in_shape))
        target = np.broadcast_to(codes(keep, 0), in_shape).ravel()
        p = pattern(target, np.arange(target.size), (math.prod(keep), target.size))
        out = (p @ m).astype(bool)
        if self.hessian and rule.order == "nonlinear":
            self._pair(out, out)
        return [out]

    def _scan(self, node, ins, rule):
        (pos, m), = ins.items()
        shape = node.shape(pos)
        axis = node.params["axis"]
        axis = axis if axis >= 0 else axis + len(shape)
        reverse = bool(node.params.get("reverse", False))
        n = shape[axis] if shape else 1
        lanes = np.moveaxis(codes(shape, 0), axis, -1).reshape(-1, n) if shape else codes((1, 1), 0)
        if lanes.shape[0] * n * (n + 1) // 2 > _PAIR_LIMIT:
            return self._lane(node, ins, rule)
        hi, lo = np.tril_indices(n)  # output position hi depends on inputs up to it
        if reverse:
            hi, lo = n - 1 - hi, n - 1 - lo
        p = pattern(lanes[:, hi], lanes[:, lo], (m.shape[0], m.shape[0]))
        out = (p @ m).astype(bool)
        if self.hessian and rule.order == "nonlinear":
            self._pair(out, out)
        return [out]

    def _lane(self, node, ins, rule):
        outs = []
        parts = []
        for pos, m in ins.items():
            in_shape = node.shape(pos)
            axes = lane_axes(node, len(in_shape))
            keep = tuple(1 if k - len(in_shape) in axes else s for k, s in enumerate(in_shape))
            target = np.broadcast_to(codes(keep, 0), in_shape).ravel()
            parts.append((keep, (pattern(target, np.arange(target.size), (math.prod(keep), target.size)) @ m)))
        for shape in node.out_shapes:
            got = []
            for keep, r in parts:
                c = np.broadcast_to(codes(keep), shape)
                got.append(select(c, r.shape[0]) @ r)
            out = _or(got, math.prod(shape), self.n)
            if self.hessian and rule.order == "nonlinear":
                self._pair(out, out)
            outs.append(out)
        return outs

    def _matmul(self, node, ins, rule):
        from ..tape._tracer import concrete
        a_shape, b_shape = node.shape(0), node.shape(1)
        batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
        m_, k_, n_ = a_shape[-2], a_shape[-1], b_shape[-1]
        nb = math.prod(batch)
        out_c = codes((nb, m_, n_), 0)
        ac = np.broadcast_to(codes(a_shape, 0), batch + (m_, k_)).reshape(nb, m_, k_)
        bc = np.broadcast_to(codes(b_shape, 0), batch + (k_, n_)).reshape(nb, k_, n_)
        size = nb * m_ * n_
        parts = []
        if 0 in ins:  # out(b, i, j) <- a(b, i, k) where b(b, k, j) may be non-zero
            bnz = (np.ones(b_shape, dtype=bool) if 1 in ins else np.asarray(concrete(node.args[1])) != 0)
            bnz = np.broadcast_to(bnz, batch + (k_, n_)).reshape(nb, k_, n_)
            beta, kk, j = np.nonzero(bnz)
            if beta.size * m_ > _PAIR_LIMIT:
                return self._einsum_like(node, ins, rule, [(0, 1, 2), (0, 2, 3)], (0, 1, 3), batch)
            i = np.arange(m_)
            rows = out_c[beta[:, None], i[None, :], j[:, None]]
            cols = ac[beta[:, None], i[None, :], kk[:, None]]
            parts.append((pattern(rows, cols, (size, ins[0].shape[0])) @ ins[0]).astype(bool))
        if 1 in ins:
            anz = (np.ones(a_shape, dtype=bool) if 0 in ins else np.asarray(concrete(node.args[0])) != 0)
            anz = np.broadcast_to(anz, batch + (m_, k_)).reshape(nb, m_, k_)
            beta, i, kk = np.nonzero(anz)
            if beta.size * n_ > _PAIR_LIMIT:
                return self._einsum_like(node, ins, rule, [(0, 1, 2), (0, 2, 3)], (0, 1, 3), batch)
            j = np.arange(n_)
            rows = out_c[beta[:, None], i[:, None], j[None, :]]
            cols = bc[beta[:, None], kk[:, None], j[None, :]]
            parts.append((pattern(rows, cols, (size, ins[1].shape[0])) @ ins[1]).astype(bool))
        if self.hessian and 0 in ins and 1 in ins:  # bilinear: a(b, i, k) with b(b, k, j)
            keys_a = (np.arange(nb)[:, None, None] * k_ + np.arange(k_)[None, None, :]) + 0 * ac
            keys_b = (np.arange(nb)[:, None, None] * k_ + np.arange(k_)[None, :, None]) + 0 * bc
            ra = pattern(keys_a, ac, (nb * k_, ins[0].shape[0])) @ ins[0]
            rb = pattern(keys_b, bc, (nb * k_, ins[1].shape[0])) @ ins[1]
            self._pair(ra.astype(bool), rb.astype(bool))
        return [_or(parts, size, self.n)]

    def _einsum(self, node, ins, rule):
        labels, out = einsum_spec(node)
        if len(labels) == 2 and len(ins) == 1:  # one operand a constant: its zeros count
            (pos, m), = ins.items()
            const = node.args[1 - pos]
            if type(const).__name__ != "Aval":
                got = self._einsum_constant(node, m, pos, labels, out, const)
                if got is not None:
                    return [got]
        return self._einsum_like(node, ins, rule, labels, out, None)

    def _einsum_constant(self, node, m, pos, labels, out_labels, const):
        """Operand ``pos`` times a constant: out element <- operand element where the constant entry
        joining them is non-zero (its non-zeros enumerated, the other labels ranging freely)."""
        from ..tape._tracer import concrete
        nz = np.asarray(concrete(const)) != 0
        lab_c, lab_x = labels[1 - pos], labels[pos]
        sizes = {}
        for lab, shape in ((lab_c, nz.shape), (lab_x, node.shape(pos))):
            for ax, l in enumerate(lab):
                sizes[l] = shape[ax]
        coords = np.nonzero(nz)
        keep = np.ones(coords[0].shape, dtype=bool)
        first = {}
        for ax, l in enumerate(lab_c):  # a repeated label (a diagonal): its coordinates must agree
            if l in first:
                keep &= coords[ax] == coords[first[l]]
            else:
                first[l] = ax
        fixed = {l: coords[ax][keep] for l, ax in first.items()}
        free = [l for l in dict.fromkeys(lab_x + tuple(out_labels)) if l not in fixed]
        n_nz = int(keep.sum())
        n_free = math.prod(sizes[l] for l in free)
        if n_nz * n_free > _PAIR_LIMIT:
            return None
        grid = np.indices([sizes[l] for l in free]).reshape(len(free), -1) if free else np.zeros((0, 1), np.int64)
        value = {l: fixed[l][:, None] for l in fixed}
        value.update({l: grid[k][None, :] for k, l in enumerate(free)})

        def flat(lab, shape):
            idx = np.zeros((n_nz, max(n_free, 1)), dtype=np.int64)
            for ax, l in enumerate(lab):
                idx = idx * shape[ax] + value[l]
            return idx

        rows = flat(tuple(out_labels), node.out_shapes[0])
        cols = flat(lab_x, node.shape(pos))
        size = math.prod(node.out_shapes[0])
        return (pattern(rows, cols, (size, m.shape[0])) @ m).astype(bool)

    def _einsum_like(self, node, ins, rule, labels, out_labels, batch):
        """Every operand element whose labels shared with the output agree with an output element's
        feeds it (the values of other operands are not looked at: a superset where they have zeros)."""
        out_shape = node.out_shapes[0]
        if batch is not None:  # matmul as an einsum over a flattened, broadcast batch
            return self._unknown(node, ins, "matmul too large to enumerate")
        sizes = {}
        for pos, lab in enumerate(labels):
            for ax, l in enumerate(lab):
                sizes[l] = node.shape(pos)[ax]

        def keys(shape, lab, wanted):
            k = np.zeros(shape, dtype=np.int64)
            for l in wanted:
                ax = lab.index(l)
                coord = np.arange(shape[ax]).reshape([-1 if d == ax else 1 for d in range(len(shape))])
                k = k * sizes[l] + coord
            return np.broadcast_to(k, shape)

        size = math.prod(out_shape)
        parts = []
        for pos, m in ins.items():
            lab = labels[pos]
            wanted = [l for l in dict.fromkeys(lab) if l in out_labels]
            nkeys = math.prod(sizes[l] for l in wanted)
            r = (pattern(keys(node.shape(pos), lab, wanted), np.arange(m.shape[0]), (nkeys, m.shape[0])) @ m)
            b = pattern(np.arange(size), keys(out_shape, out_labels, wanted), (size, nkeys))
            parts.append((b @ r).astype(bool))
        if self.hessian:
            pos = list(ins)
            for i in range(len(pos)):
                for j in range(i + 1, len(pos)):
                    li, lj = labels[pos[i]], labels[pos[j]]
                    shared = [l for l in dict.fromkeys(li) if l in lj]
                    nk = math.prod(sizes[l] for l in shared)
                    mi, mj = ins[pos[i]], ins[pos[j]]
                    ri = pattern(keys(node.shape(pos[i]), li, shared), np.arange(mi.shape[0]), (nk, mi.shape[0])) @ mi
                    rj = pattern(keys(node.shape(pos[j]), lj, shared), np.arange(mj.shape[0]), (nk, mj.shape[0])) @ mj
                    self._pair(ri.astype(bool), rj.astype(bool))
        return [_or(parts, size, self.n)]

    def _core(self, node, ins, rule):
        core_in = rule.extra.get("core_in", 2)
        nbatch = max(0, len(node.shape(0)) - core_in)
        outs = []
        for shape in node.out_shapes:
            got = []
            for pos, m in ins.items():
                s = node.shape(pos)
                p = 0
                while p < min(nbatch, len(s), len(shape)) and s[p] == shape[p]:
                    p += 1
                keep = s[:p]
                target = np.broadcast_to(codes(keep, 0).reshape(keep + (1,) * (len(s) - p)), s).ravel()
                r = pattern(target, np.arange(target.size), (math.prod(keep), target.size)) @ m
                c = np.broadcast_to(codes(keep).reshape(keep + (1,) * (len(shape) - p)), shape)
                got.append(select(c, r.shape[0]) @ r)
            out = _or(got, math.prod(shape), self.n)
            if self.hessian:
                self._pair(out, out)
            outs.append(out)
        return outs

    def _linear_probe(self, node, ins, rule):
        (pos, m), = ins.items()
        g_shape = node.shape(pos)
        gsize = math.prod(g_shape)
        out_shape = node.out_shapes[0]
        if gsize * math.prod(out_shape) > _PAIR_LIMIT:
            return self._unknown(node, ins, f"{node.name} too large to enumerate")
        args = list(node.args)
        args[pos] = np.eye(gsize, dtype=np.float64).reshape((gsize,) + g_shape)
        params = dict(node.params)
        if "nb" in params:
            params["nb"] = params["nb"] + 1
        res = np.asarray(node.fn(*args, **params)).reshape(gsize, -1)
        src, dst = np.nonzero(res)
        return [(pattern(dst, src, (res.shape[1], gsize)) @ m).astype(bool)]

    def _call(self, node, ins, rule):
        subs = node.inner if isinstance(node.inner, list) else [node.inner]
        results = None
        for sub in subs:
            env = {}
            for pos, vid in zip(node.extra_positions, sub.inputs):
                if pos in ins:
                    env[vid] = ins[pos]
            self.run(sub, env)
            got = [env.get(v) if v is not None else None for v in sub.outputs]
            results = got if results is None else [
                a if b is None else (b if a is None else (a + b).astype(bool)) for a, b in zip(results, got)]
        return results
