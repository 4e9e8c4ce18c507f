"""The layers torch's per-example path reads: each use of a parameter in the recorded ATen program, and
what that use adds to each example's gradient, from G (the gradient of the summed losses at the layer's
output, one backward pass) and values the forward pass recorded.

A parameter takes the fast path when *every* one of its uses is a layer below and, for each, the row
proof (``unigrad.dependence.prove_rows`` seeded at the layer's output) shows that row i of the losses
depends on that output through its row i alone. Then example i's gradient is the sum over the uses of
``d loss_i / d y_u,i`` contracted with what the layer multiplied the parameter by, and ``G_u``'s row i
is that derivative. The uses:

* dense ``mm``/``addmm``/``bmm`` of a leading one (the parameter through any views and transposes,
  ``F.linear(x, w.T)``, ``einsum``), over positions too, the examples on any axis of the product
  reshaped back (attention's projections see (positions, B, features)): ``X_i^T G_i`` (or ``G_i^T X_i``
  for a transposed use);
* ``convolution`` (1-d, 2-d, 3-d, any stride, padding, dilation, groups): per group j,
  ``G_ij^T U_ij`` with ``U_i`` the input's patches (``unfold``, 1-d and 2-d), P output positions; the
  rows themselves as torch's weight gradient of one convolution with the examples as groups;
* ``embedding``: ``G_i``'s rows added into the looked-up rows (none into ``padding_idx``);
* broadcast biases and scales (``add``/``sub``/``mul``, the parameter directly or through views such as
  ``b.view(1, -1, 1, 1)``), ``addmm``'s and ``convolution``'s bias: ``G_i`` (times the other factor)
  summed over the broadcast axes;
* LayerNorm's and GroupNorm's weight and bias: ``xhat * G`` (``G``) summed over positions, with ``xhat``
  the normalised input rebuilt from the recorded mean and reciprocal deviation; BatchNorm's in eval mode
  (its running statistics; in training mode the rows mix, and the proof refuses what comes before it).

Dense and convolution uses are factored as ``L_i^T R_i`` (per group, ``L`` of shape (B, groups, P, a),
``R`` (B, groups, P, c)), so norms never form the gradient where ghost clipping is cheaper:
``sum((L_i L_i^T) * (R_i R_i^T))`` when ``P^2 <= a c``. Several such uses of one parameter with the same
layout are stacked along positions (the norm of the sum, not the sum of norms); other combinations sum
each use's rows, except a table used by lookups and dense layers (tied embeddings), whose one-hot rows
stack with the dense ones. Embedding norms use ``sum_{t,s} [idx_t = idx_s] g_t . g_s`` where ``P^2`` is
at most the vocabulary size.
"""

from __future__ import annotations

import math
import operator

from unigrad.per_example import layers as pe

_VIEWS = ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "alias")  # element order kept
_TRANSPOSES = ("t", "transpose", "permute")


class Use:
    """One use of a parameter by a layer: ``kind``, ``seed`` (the fx node of the layer's output whose rows
    must stay apart), ``capture`` (the node whose gradient is G, reshaped to ``seed_shape``), ``nodes``
    (name -> fx node of a recorded value the contribution reads; turned into recorder refs) and ``info``."""

    __slots__ = ("kind", "seed", "capture", "seed_shape", "nodes", "refs", "info", "g_index", "axes", "axis")

    def __init__(self, kind, seed, capture=None, nodes=None, axes=(0,), **info):
        self.kind, self.seed, self.capture = kind, seed, capture if capture is not None else seed
        self.seed_shape = _shape(seed)
        self.nodes, self.info, self.refs, self.g_index = nodes or {}, info, {}, None
        # the seed's axes that may hold the examples (the proof picks one: attention's projections see
        # (positions, B, features)); dense layers and broadcasts only, the others have them first
        self.axes, self.axis = tuple(axes), axes[0] if axes else 0

    def resolve(self, refs):
        """Recorder refs for the nodes read; False when one has none."""
        for name, node in self.nodes.items():
            ref = refs.get(node)
            if ref is None:
                return False
            self.refs[name] = ref
        if self.kind == "norm" and self.info["which"] == "weight" and self.info["layer"] != "batch":
            # the mean and 1/deviation it computed: its outputs 1 and 2
            ref = refs.get(self.seed)
            if ref is None or ref[1] != 0:
                return False
            self.refs["mean"], self.refs["rstd"] = (ref[0], 1), (ref[0], 2)
        return True

    # -- contributions ---------------------------------------------------------------------------
    def factors(self, rec, g, batch):
        """``(L, R)``: example i's gradient (in the layout (groups, a, c)) is ``L_i^T R_i``; or None."""
        import torch

        if self.kind == "dense":  # rows of X and G laid out as the seed, the examples' axis first
            x = rec.value(self.refs["x"]).detach()
            lead, ax = self.seed_shape[:-1], self.axis
            xs = x.reshape(*lead, x.shape[-1]).movedim(ax, 0).reshape(batch, 1, -1, x.shape[-1])
            gs = g.movedim(ax, 0).reshape(batch, 1, -1, g.shape[-1])
            return (gs, xs) if self.info["transposed"] else (xs, gs)
        if self.kind == "conv" and len(self.info["kernel"]) <= 2:
            x = rec.value(self.refs["x"]).detach()
            info = self.info
            groups, kernel = info["groups"], info["kernel"]
            if len(kernel) == 1:  # 1-d as 2-d with a height of one
                x = x.unsqueeze(2)
                kernel, stride = (1, kernel[0]), (1, info["stride"][0])
                padding, dilation = (0, info["padding"][0]), (1, info["dilation"][0])
            else:
                stride, padding, dilation = info["stride"], info["padding"], info["dilation"]
            u = torch.nn.functional.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
            u = u.reshape(batch, groups, -1, u.shape[-1]).transpose(2, 3)  # (B, groups, P, C_in/groups * k)
            gs = g.reshape(batch, groups, g.shape[1] // groups, -1).transpose(2, 3)  # (B, groups, P, C_out/groups)
            return gs, u
        return None

    def conv_rows(self, rec, g, batch, shape):
        """A convolution's rows as the weight gradient of one convolution with the examples as groups."""
        import torch

        x = rec.value(self.refs["x"]).detach()
        info = self.info
        groups = info["groups"]
        xs = x.reshape(1, -1, *x.shape[2:])
        gs = g.reshape(1, -1, *g.shape[2:])
        shell = torch.empty((batch * shape[0], *shape[1:]), dtype=x.dtype, device=x.device)  # (sizes only)
        spatial = len(shape) - 2
        _, rows, _ = torch.ops.aten.convolution_backward(
            gs, xs, shell, None, list(info["stride"]), list(info["padding"]), list(info["dilation"]), False,
            [0] * spatial, batch * groups, [False, True, False])
        return rows.reshape(batch, *shape)

    def rows(self, rec, g, batch, shape):
        """Example i's gradient from this use, shape ``(batch, *shape)``."""
        import torch

        if self.kind == "conv":
            return self.conv_rows(rec, g, batch, shape)
        fac = self.factors(rec, g, batch)
        if fac is not None:
            left, right = fac
            return torch.matmul(left.transpose(2, 3), right).reshape(batch, *shape)
        kind, info = self.kind, self.info
        if kind == "embedding":
            idx, gs = self._lookups(rec, g, batch)
            out = torch.zeros((batch, shape[0], gs.shape[-1]), dtype=gs.dtype, device=gs.device)
            return out.scatter_add_(1, idx.unsqueeze(-1).expand(gs.shape), gs)
        if kind == "broadcast":
            c = g if info["other"] is None else g * rec.value(self.refs["other"]).detach()
            nd, op_shape, ax = len(self.seed_shape), info["operand_shape"], self.axis
            padded = (1,) * (nd - len(op_shape)) + op_shape
            axes = tuple(a for a in range(nd) if a != ax and padded[a] == 1 and self.seed_shape[a] != 1)
            if axes:
                c = c.sum(axes, keepdim=True)
            c = c.movedim(ax, 0).reshape(batch, *shape)
            return -c if info["sign"] < 0 else c
        if kind == "channels":  # a convolution's bias: G summed over the positions
            return g.sum(tuple(range(2, g.dim()))).reshape(batch, *shape)
        if kind == "norm":
            if info["which"] == "bias":
                c = g
            else:
                c = g * self._normalised(rec)
            if info["layer"] == "layer":  # (B, positions.., *normalized_shape)
                axes = tuple(range(1, len(self.seed_shape) - len(shape)))
            else:  # group norm, batch norm: (B, C, spatial..)
                axes = tuple(range(2, len(self.seed_shape)))
            return (c.sum(axes) if axes else c).reshape(batch, *shape)
        raise AssertionError(kind)

    def embedding_squares(self, rec, g, batch, vocabulary, direction=None):
        """``(squared norms, dots or None)`` of one embedding use -- the dots each example's ``<g_i, V>``
        from the same lookups (the norms' check) where ``direction`` is given -- or None where forming the
        rows is cheaper."""
        import torch

        idx, gs = self._lookups(rec, g, batch)
        positions = idx.shape[1]
        if positions * positions > vocabulary:
            return None
        same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(gs.dtype)
        sq = (same * torch.matmul(gs, gs.transpose(1, 2))).sum((1, 2))
        return sq, None if direction is None else _lookup_dots(idx, gs, direction)

    def _lookups(self, rec, g, batch):
        idx = rec.value(self.refs["indices"]).reshape(batch, -1).long()
        gs = g.reshape(batch, idx.shape[1], -1)
        pad = self.info["padding_idx"]
        if pad >= 0:  # the padding row gets no gradient (torch's embedding backward)
            gs = gs * (idx != pad).unsqueeze(-1).to(gs.dtype)
        return idx, gs

    def _normalised(self, rec):
        x = rec.value(self.refs["x"]).detach()
        mean = rec.value(self.refs["mean"]).detach()
        if self.info["layer"] == "batch":  # in eval mode: the running statistics
            var = rec.value(self.refs["var"]).detach()
            shape = (1, -1) + (1,) * (x.dim() - 2)
            return (x - mean.reshape(shape)) / (var.reshape(shape) + self.info["eps"]).sqrt()
        rstd = rec.value(self.refs["rstd"]).detach()
        if self.info["layer"] == "layer":
            return (x - mean) * rstd
        n, groups = mean.shape
        xs = x.reshape(n, groups, -1)
        return ((xs - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)).reshape(x.shape)


def parameter_rows(uses, rec, gs, param, batch, norms, direction=None):
    """``(rows or None, squared norms or None, path, dots or None)`` of one parameter from its uses' G; with
    ``direction`` (the parameter's shape), each example's ``<L_i^T R_i, V>`` where the squared norms come
    from the factors (``pe.total_dots``: the check of the norms), else None."""
    import torch

    shape, dtype = tuple(param.shape), param.dtype
    gl = [gs[u.g_index].detach().reshape(u.seed_shape) for u in uses]
    if len(uses) == 1 and uses[0].kind == "conv":
        positions, k = math.prod(gl[0].shape[2:]), math.prod(shape[1:])
        if not norms or positions * positions > k * shape[0] // uses[0].info["groups"] or len(shape) > 4:
            # the rows by torch's own weight gradient, the examples as groups (no patches formed)
            return uses[0].conv_rows(rec, gl[0], batch, shape).to(dtype), None, pe.CONV, None
    if norms and len(uses) > 1 and {u.kind for u in uses} == {"dense", "embedding"}:
        tied = _tied_squares(uses, gl, rec, batch, shape, direction)
        if tied is not None:
            return None, tied[0].to(dtype), pe.SHARED, tied[1]
    facs = [u.factors(rec, g, batch) for u, g in zip(uses, gl)]
    stacked = all(f is not None for f in facs) and len({f[0].shape[1:2] + f[0].shape[3:] + f[1].shape[3:]
                                                         for f in facs}) == 1
    if stacked:
        left = torch.cat([f[0] for f in facs], 2) if len(facs) > 1 else facs[0][0]
        right = torch.cat([f[1] for f in facs], 2) if len(facs) > 1 else facs[0][1]
        positions, a, c = left.shape[2], left.shape[3], right.shape[3]
        kind = uses[0].kind if len(uses) == 1 else "shared"
        if norms and positions * positions <= a * c:
            if positions == 1:
                sq = ((left ** 2).sum(3) * (right ** 2).sum(3)).sum((1, 2))
            else:
                ll = torch.matmul(left, left.transpose(2, 3))
                rr = torch.matmul(right, right.transpose(2, 3))
                sq = (ll * rr).sum((1, 2, 3))
            path = {"dense": pe.DENSE_OUTER if positions == 1 else pe.DENSE_GHOST, "conv": pe.CONV_GHOST,
                    "shared": pe.SHARED}[kind]
            dot = None
            if isinstance(direction, tuple) and left.shape[1] == 1 and (a, c) == shape:
                dot = _factor_dots(left[:, 0], right[:, 0], direction)  # a matrix's V = u w^T: (L_i u) (R_i w)
            elif direction is not None:  # example i's gradient is L_i^T R_i in the layout (groups, a, c)
                v = torch.outer(*direction) if isinstance(direction, tuple) else direction
                v = v.detach().to(left.dtype).reshape(left.shape[1], a, c)
                dot = (torch.matmul(left, v) * right).sum((1, 2, 3))
            return None, sq.to(dtype), path, dot
        rows = torch.matmul(left.transpose(2, 3), right).reshape(batch, *shape)
        return rows.to(dtype), None, {"dense": pe.DENSE, "conv": pe.CONV, "shared": pe.SHARED}[kind], None
    if len(uses) == 1:
        u, g = uses[0], gl[0]
        if norms and u.kind == "embedding":
            ghost = u.embedding_squares(rec, g, batch, shape[0], direction)
            if ghost is not None:
                return None, ghost[0].to(dtype), pe.EMBEDDING_GHOST, ghost[1]
        path = {"embedding": pe.EMBEDDING, "norm": pe.NORM if u.info.get("which") == "weight" else pe.BIAS,
                "channels": pe.BIAS,
                "broadcast": pe.BIAS if u.info.get("other") is None else pe.SCALE}[u.kind]
        return u.rows(rec, g, batch, shape).to(dtype), None, path, None
    total = None
    for u, g in zip(uses, gl):
        r = u.rows(rec, g, batch, shape)
        total = r if total is None else total + r
    return total.to(dtype), None, pe.SHARED_SUMMED, None


def _lookup_dots(idx, gs, direction):
    """Each example's ``<g_i, V>`` for the gradient of a table from lookups, ``g_i = sum_p e_{idx_ip} gs_ip^T``:
    ``sum_p u[idx_ip] (gs_ip . w)`` for ``V = u w^T``, else ``sum_p <V[idx_ip], gs_ip>``."""
    if isinstance(direction, tuple):
        u, w = (t.detach().to(gs.dtype) for t in direction)
        return (u[idx] * (gs @ w)).sum(1)
    return (direction.detach().to(gs.dtype)[idx] * gs).sum((1, 2))


def _factor_dots(left, right, direction):
    """Each example's ``<L_i^T R_i, V>`` for factors ``(B, P, a)`` and ``(B, P, c)``."""
    if isinstance(direction, tuple):
        u, w = (t.detach().to(left.dtype) for t in direction)
        return ((left @ u) * (right @ w)).sum(1)
    return ((left @ direction.detach().to(left.dtype)) * right).sum((1, 2))


def _tied_squares(uses, gl, rec, batch, shape, direction=None):
    """``(squared norms, dots or None)`` of a table used both by embeddings and by dense layers (tied input
    and output embeddings, ``h @ E.T``): every use is ``L^T R`` with ``L`` of width ``V`` -- one-hot rows for
    a lookup, G or X for a dense use -- stacked along positions, ghost clipped with the lookups' block of
    ``L L^T`` from index comparisons and the mixed blocks gathered from the dense ``L`` at the indices.
    With ``direction``, each example's ``<g_i, V>`` from the same factors (the norms' check: every use's
    dot, summed). None where ``P^2 > V d`` (then the rows are formed)."""
    import torch

    vocabulary, width = shape
    parts = []
    for u, g in zip(uses, gl):
        if u.kind == "embedding":
            idx, gs = u._lookups(rec, g, batch)
            parts.append((idx, None, gs))
        else:
            left, right = u.factors(rec, g, batch)
            if left.shape[3] != vocabulary or right.shape[3] != width:
                return None
            parts.append((None, left[:, 0], right[:, 0]))
    positions = sum(p[2].shape[1] for p in parts)
    if positions * positions > vocabulary * width:
        return None
    right = torch.cat([p[2] for p in parts], 1)
    rows = []
    for idx_i, left_i, _ in parts:
        blocks = []
        for idx_j, left_j, _ in parts:
            if idx_i is not None and idx_j is not None:
                blocks.append((idx_i.unsqueeze(2) == idx_j.unsqueeze(1)).to(right.dtype))
            elif idx_i is not None:  # one-hot rows against dense rows: the dense rows at the indices
                blocks.append(torch.gather(left_j, 2, idx_i.unsqueeze(1).expand(-1, left_j.shape[1], -1))
                              .transpose(1, 2))
            elif idx_j is not None:
                blocks.append(torch.gather(left_i, 2, idx_j.unsqueeze(1).expand(-1, left_i.shape[1], -1)))
            else:
                blocks.append(torch.matmul(left_i, left_j.transpose(1, 2)))
        rows.append(torch.cat(blocks, 2))
    gram = torch.cat(rows, 1)
    sq = (gram * torch.matmul(right, right.transpose(1, 2))).sum((1, 2))
    if direction is None:
        return sq, None
    dots = [_lookup_dots(idx, gs, direction) if idx is not None else _factor_dots(left, gs, direction)
            for idx, left, gs in parts]
    return sq, sum(dots[1:], dots[0])


# ---------------------------------------------------------------------------------------------
# Finding the uses on the fx graph of a record
# ---------------------------------------------------------------------------------------------

def find_uses(p, batch):
    """The uses of the parameter placeholder ``p``, each a layer above; None when one is not."""
    val = p.meta["val"]
    if not val.is_floating_point():
        return None
    uses = []
    if not _walk(p, p, batch, [], uses):
        return None
    return uses or None


def _walk(p, node, batch, chain, uses):
    """Each use of ``node`` (``p`` through the views and transposes in ``chain``)."""
    for user in list(node.users):
        if _count(user, node) != 1:
            return False
        name = _aten(user)
        if name in _VIEWS or name in _TRANSPOSES:
            if not _walk(p, user, batch, chain + [user], uses):
                return False
            continue
        order = _order(p, chain)
        if order is None:
            return False
        use = _classify(node, user, name, batch, order == "transposed", bool(chain) and order == "kept")
        if use is None:
            return False
        uses.append(use)
    return True


def _order(p, chain):
    """How the chain of views and transposes arranges the parameter's entries: "same" (no chain),
    "kept" (their order kept: reshapes, added or removed axes of one), "transposed" (a matrix's
    transpose, maybe with axes of one), or None. Found by running the chain on the entries' numbers."""
    import torch

    if not chain:
        return "same"
    shape = _shape(p)
    numbers = torch.arange(math.prod(shape)).reshape(shape)
    v = numbers
    try:
        for node in chain:
            v = node.target(v, *node.args[1:], **node.kwargs)
    except Exception:
        return None
    if v.numel() != numbers.numel():
        return None
    if torch.equal(v.reshape(-1), numbers.reshape(-1)):
        return "kept"
    if len(shape) == 2 and torch.equal(v.reshape(shape[1], shape[0]), numbers.T) and [
            n for n in v.shape if n != 1] == [shape[1], shape[0]]:
        return "transposed"
    return None


def _product_back(user, rows, width):
    """The one use of a product's result when it is a reshape to (B, positions.., width) of its ``rows``
    rows in their order (then example i's rows are the i-th block); else None."""
    if len(user.users) != 1:
        return None
    back = next(iter(user.users))
    if _aten(back) not in ("view", "_unsafe_view", "reshape"):
        return None
    shape = _shape(back)
    return back if len(shape) >= 2 and shape[-1] == width and math.prod(shape[:-1]) == rows else None


def _classify(operand, user, name, batch, transposed, viewed):
    import torch

    from ._dependence import _bind, positions_product

    if name == "bmm" and not user.kwargs and user.args[1] is operand and user.args[0] is not operand:
        # x (1, N, d) @ w (1, d, k) (how einsum spells x @ W), its result reshaped back
        a, out = user.args[0], _shape(user)
        back = _product_back(user, out[1], out[2]) if out[0] == 1 else None
        axes = _batch_axes(back, batch)
        if not axes:
            return None
        return Use("dense", back, user, nodes={"x": a}, transposed=transposed, axes=axes)
    if name in ("mm", "addmm") and not user.kwargs:
        at = 1 if name == "addmm" else 0
        folded = positions_product(user)
        a, out = user.args[at], _shape(user)
        if folded is not None:  # x (.., d) flattened, the product, reshaped back to (.., k)
            seed = folded[1]
        elif out[0] == batch:
            seed = user
        else:  # rows of several examples each, reshaped back after (the examples on one of its axes)
            seed = _product_back(user, out[0], out[1])
        axes = _batch_axes(seed, batch) if seed is not user else (0,)
        if not axes:
            return None
        if user.args[at + 1] is operand and a is not operand and (not viewed or len(_shape(operand)) == 2):
            return Use("dense", seed, user, nodes={"x": a}, transposed=transposed, axes=axes)
        if name == "addmm" and user.args[0] is operand and not transposed:
            return _broadcast(operand, user, seed, None, 1.0, axes)
        return None
    if transposed:
        return None
    if name == "convolution":
        bound = _bind(user.target, user.args, user.kwargs)
        weight = bound["weight"]
        x = bound["input"]
        if bound["transposed"] or len(_shape(weight)) not in (3, 4, 5) or not isinstance(x, torch.fx.Node) or (
                _shape(x)[0] != batch or _shape(user)[0] != batch):
            return None
        spatial = len(_shape(weight)) - 2
        if weight is operand and not viewed and bound["bias"] is not operand:
            return Use("conv", user, nodes={"x": x}, groups=int(bound["groups"]),
                       kernel=_shape(weight)[2:], stride=_ints(bound["stride"], spatial),
                       padding=_ints(bound["padding"], spatial), dilation=_ints(bound["dilation"], spatial))
        if bound["bias"] is operand and weight is not operand:
            return Use("channels", user)
        return None
    if viewed and name not in ("add", "sub", "mul", "add_", "sub_", "mul_"):
        return None
    if name == "embedding":
        bound = _bind(user.target, user.args, user.kwargs)
        idx = bound["indices"]
        if bound["weight"] is not operand or bound["scale_grad_by_freq"] or len(_shape(operand)) != 2 or \
                not isinstance(idx, torch.fx.Node) or not _shape(idx) or _shape(idx)[0] != batch:
            return None
        return Use("embedding", user, nodes={"indices": idx}, padding_idx=int(bound["padding_idx"]))
    if name == "native_batch_norm":  # in eval mode: a per-channel affine map of each example
        bound = _bind(user.target, user.args, user.kwargs)
        which = "weight" if bound["weight"] is operand else "bias" if bound["bias"] is operand else None
        out = [u for u in user.users if u.target is operator.getitem and u.args[1] == 0]
        stats = bound["running_mean"], bound["running_var"]
        if which is None or bound["weight"] is bound["bias"] or bound["training"] or len(out) != 1 or not all(
                isinstance(v, torch.fx.Node) for v in stats) or _shape(out[0])[0] != batch:
            return None
        return Use("norm", out[0], nodes={"x": bound["input"], "mean": stats[0], "var": stats[1]} if which == "weight"
                   else None, which=which, layer="batch", eps=float(bound["eps"]))
    if name in ("native_layer_norm", "native_group_norm"):
        bound = _bind(user.target, user.args, user.kwargs)
        which = "weight" if bound["weight"] is operand else "bias" if bound["bias"] is operand else None
        x = bound["input"]
        out = [u for u in user.users if u.target is operator.getitem and u.args[1] == 0]
        if which is None or bound["weight"] is bound["bias"] or len(out) != 1 or _shape(out[0])[0] != batch or len(
                _shape(operand)) >= len(_shape(out[0])):  # (a scale over the batch axis too: not shared by rows)
            return None
        layer = "layer" if name == "native_layer_norm" else "group"
        return Use("norm", out[0], nodes={"x": x} if which == "weight" else None, which=which, layer=layer)
    if name in ("add_", "sub_", "mul_") and user.args[1] is operand:  # into another value, in place
        name = name[:-1]
    if name not in ("add", "sub", "mul") or user.target._overloadname != "Tensor":
        return None
    if user.kwargs.get("alpha", 1) != 1 or len(user.args) != 2:
        return None
    pos = 0 if user.args[0] is operand else 1
    other = user.args[1 - pos]
    out = _shape(user)
    if not isinstance(other, torch.fx.Node) or len(_shape(other)) > len(out) or not out:
        return None
    sign = -1.0 if (name == "sub" and pos == 1) else 1.0
    return _broadcast(operand, user, user, other if name == "mul" else None, sign, _batch_axes(user, batch, True))


def _broadcast(operand, user, seed, other, sign, axes):
    shape, out = _shape(operand), _shape(seed)
    if len(shape) > len(out):
        return None
    padded = (1,) * (len(out) - len(shape)) + shape
    axes = tuple(a for a in axes if padded[a] == 1)  # (an axis of the parameter along the batch: not shared)
    if not axes:
        return None
    return Use("broadcast", seed, user, nodes={"other": other} if other is not None else None,
               operand_shape=shape, other=other, sign=sign, axes=axes)


def _batch_axes(node, batch, last=False):
    """The axes of ``node``'s value as long as the batch (the last one too when ``last``), first first."""
    if node is None:
        return ()
    shape = _shape(node)
    return tuple(a for a in range(len(shape) if last else len(shape) - 1) if shape[a] == batch)


def _ints(v, n):
    v = tuple(int(a) for a in (v if isinstance(v, (list, tuple)) else (v,)))
    return v * n if len(v) == 1 else v


def _count(user, node):
    from torch.utils import _pytree

    flat, _ = _pytree.tree_flatten((user.args, user.kwargs))
    return sum(1 for a in flat if a is node)


def _aten(node):
    from ._dependence import _aten_name
    return _aten_name(node)


def _shape(node):
    return tuple(node.meta["val"].shape)
