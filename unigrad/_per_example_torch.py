"""Per-example gradients on torch: dense layers found in the ATen program the call ran.

The same method as the tape's and JAX's (``_per_example.py``, ``_per_example_jaxpr.py``), for native
torch code (``torch.func.functional_call`` of an ``nn.Module``, ``F.linear``, ``x @ W``) and portable code:

1. ``f`` runs once, an ordinary forward pass with grad on for the parameters, under a
   ``TorchDispatchMode`` that records every ATen operation it runs (the mechanism ``make_fx`` traces
   with), with the data flow between them. Views and in-place operations are followed by the tensors'
   identities; an operand that depends on the parameters but was not produced by a recorded operation
   makes the record unusable (then everything is materialised, as before).
2. For a new program (its operations, data flow, shapes, dtypes and literal arguments are the cache
   key), the record becomes a ``torch.fx`` graph, read by the dependence analysis's fx front-end
   (``unigrad.dependence._fx``). A parameter whose one use is a dense layer -- ``mm``/``addmm`` (through
   ``t``/``transpose``; over positions: reshape, product, reshape back), a bias (``addmm``'s, or
   ``add``/``sub`` of a broadcast parameter), a scale (``mul``) -- takes the fast path where the row
   proof shows that row i of the losses depends on the layer's output through its row i alone.
3. ``G``, the gradient of ``sum(losses)`` with respect to those layers' outputs, comes from one
   ``torch.autograd.grad`` of this very forward pass; ``X`` is the layer's recorded input. Norms:
   ``|x_i|^2 |g_i|^2``, ghost ``sum((X_i X_i^T) * (G_i G_i^T))`` or ``X_i^T G_i``, as on the other engines.

Parameters the trick does not cover (used twice, by a convolution, before rows mix...) are
materialised with the backend's ``jacrev`` of the losses.
"""

from __future__ import annotations

import sys

from . import _per_example_common as pe

_MAX_PLANS = 64


def is_torch_backend(b) -> bool:
    module = sys.modules.get("unigrad_torch")
    return module is not None and isinstance(b, getattr(module, "TorchBackend", ()))


def torch_rows(b, flat_f, leaves, batch, norms, fname, cache, dynamic=()):
    """``(outputs, blocks, paths)``: rows (or one block of norms) of per-example gradients on torch, or
    None where this path does not apply. ``cache`` (a BoundedCache) keeps the analysis of each program seen."""
    import torch

    n = len(leaves)
    if any(torch._C._functorch.is_functorch_wrapped_tensor(x) for x in leaves):
        return None  # inside torch.func's own transforms: the materialised path
    if any(isinstance(a, torch.Tensor) and a.is_inference() for a in dynamic):
        return None  # inference tensors f closes over cannot take part in a backward pass: materialised
    with torch.inference_mode(False), torch.enable_grad():
        inputs = [x.detach().clone() if x.is_inference() else x.detach() for x in leaves]
        for x in inputs:
            if x.is_floating_point():
                x.requires_grad_(True)
        from ._per_example_torch_record import Recorder

        recorder = Recorder(inputs)
        with recorder:
            outs = flat_f(*inputs)
        pe.check_losses(b, outs, batch, fname)
        losses = outs[0]
        key = recorder.key(losses, batch)
        analysis = cache.get(key) if key is not None else None
        if analysis is None:
            analysis = _Analysis(recorder, losses, n, batch) if key is not None else _Analysis.none(n)
            if key is not None:
                cache.put(key, analysis)
        fast = analysis.plans
        rows, squares, paths = [None] * n, [None] * n, [pe.MATERIALISED] * n
        if fast:
            ys = [recorder.value(ref) for ref in analysis.captures]
            usable = [y.requires_grad for y in ys]
            grads = torch.autograd.grad(losses.sum(), [y for y, u in zip(ys, usable) if u], allow_unused=True)
            it = iter(grads)
            gs = [next(it) if u else None for u in usable]
            gs = [torch.zeros_like(y) if g is None else g for g, y in zip(gs, ys)]
            for k, plan in fast.items():
                rows[k], squares[k], paths[k] = plan.rows(recorder, gs[plan.capture], leaves[k], batch, norms)
    losses = losses.detach()
    slow = [k for k in range(n) if k not in fast]
    if slow:
        from ._transform import promoted_blocks

        def of_slow(*s):
            merged = list(leaves)
            for k, v in zip(slow, s):
                merged[k] = v
            return flat_f(*merged)

        outs2, jac, _ = b.jacrev(of_slow, [leaves[k] for k in slow])
        for k, r in zip(slow, promoted_blocks(b, outs2, [leaves[k] for k in slow], jac)[0]):
            rows[k] = r
    if not norms:
        return (losses,), tuple(r.detach() for r in rows), paths
    return (losses,), (pe.total_norms(_ops(), squares, rows, batch).detach(),), paths


# ---------------------------------------------------------------------------------------------
# The analysis of one program: which parameters are dense layers whose rows stay apart
# ---------------------------------------------------------------------------------------------

class _Plan:
    __slots__ = ("kind", "capture", "x", "other", "transposed", "sign", "seed_shape", "positions")

    def __init__(self, kind, capture, seed_shape, x=None, other=None, transposed=False, sign=1.0):
        self.kind, self.capture, self.seed_shape = kind, capture, seed_shape
        self.x, self.other, self.transposed, self.sign = x, other, transposed, sign

    def rows(self, recorder, g, param, batch, norms):
        """``(rows or None, squared norms or None, path)`` from G, the gradient at the captured output."""
        g = g.detach().reshape(self.seed_shape)
        if self.kind == "matmul":
            x = recorder.value(self.x).detach()
            return pe.matmul_rows(_ops(), x, g, batch, norms, self.transposed, param.dtype)
        other = None if self.kind == "bias" else recorder.value(self.other).detach()
        rows, path = pe.broadcast_rows(_ops(), self.kind, g, other, tuple(param.shape), self.seed_shape, self.sign,
                                       batch)
        return rows.to(param.dtype), None, path


def _ops():
    import torch

    return pe.Ops(lambda a, shape: a.reshape(shape), lambda a, axes, keepdims: a.sum(axes, keepdim=keepdims),
                  torch.matmul, lambda a: a.transpose(-1, -2), lambda a, dtype: a.contiguous().to(dtype),
                  torch.sqrt)


class _Analysis:
    """The plans of one program: ``plans`` (leaf -> _Plan) and ``captures`` (the refs whose gradient is G)."""

    def __init__(self, recorder, losses, n, batch):
        from .dependence import prove_rows
        from .dependence._fx import fx_program

        self.plans, self.captures = {}, []
        graph, refs = recorder.graph(losses)
        ids = {}
        program = fx_program(graph, ids=ids)
        placeholders = [node for node in graph.nodes if node.op == "placeholder"]
        proved = {}
        for k in range(n):
            found = _find(placeholders[k], batch)
            if found is None:
                continue
            plan, seed, capture_node = found
            if seed not in proved:
                vid = ids.get(seed)
                proved[seed] = vid is not None and prove_rows(
                    program, batch, seeds={vid: len(plan.seed_shape)})[0] == "row"
            if not proved[seed]:
                continue
            ref = refs[capture_node]
            if ref not in self.captures:
                self.captures.append(ref)
            plan.capture = self.captures.index(ref)
            if plan.x is not None:
                plan.x = refs[plan.x]
            if plan.other is not None:
                plan.other = refs.get(plan.other)
                if plan.other is None:
                    continue
            self.plans[k] = plan

    @classmethod
    def none(cls, n):
        self = cls.__new__(cls)
        self.plans, self.captures = {}, []
        return self


def _aten(node):
    from .dependence._fx import _aten_name
    return _aten_name(node)


def _only_use(node):
    """The one node using ``node``, using it once; else None."""
    from torch.utils import _pytree

    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    flat, _ = _pytree.tree_flatten((user.args, user.kwargs))
    return user if sum(1 for a in flat if a is node) == 1 else None


def _shape(node):
    return tuple(node.meta["val"].shape)


def _find(p, batch):
    """``(plan, seed node, capture node)`` for a parameter whose one use is a dense layer, else None."""
    import torch

    from .dependence._fx import positions_product

    val = p.meta["val"]
    if not val.is_floating_point():
        return None
    user = _only_use(p)
    if user is None:
        return None
    operand, transposed = p, False
    name = _aten(user)
    if name in ("t", "transpose", "permute") and val.dim() == 2:
        if name == "permute" and tuple(d % 2 for d in user.args[1]) != (1, 0):
            return None
        operand, transposed, user = user, True, _only_use(user)
        if user is None:
            return None
        name = _aten(user)
    if name in ("mm", "addmm") and not user.kwargs:
        at = 1 if name == "addmm" else 0
        folded = positions_product(user)
        seed, x = (folded[1], folded[0]) if folded is not None else (user, user.args[at])
        if user.args[at + 1] is operand:
            a = user.args[at]
            if _shape(seed)[0] != batch or (folded is None and (len(_shape(a)) != 2 or _shape(a)[0] != batch)):
                return None
            del x
            return _Plan("matmul", user, _shape(seed), x=a, transposed=transposed), seed, user
        if name == "addmm" and user.args[0] is operand and not transposed and len(_shape(p)) <= 2 and (
                len(_shape(p)) < 2 or _shape(p)[0] == 1) and _shape(seed)[0] == batch:
            return _Plan("bias", user, _shape(seed)), seed, user
        return None
    if transposed or name not in ("add", "sub", "mul") or user.target._overloadname != "Tensor":
        return None
    if user.kwargs.get("alpha", 1) != 1 or len(user.args) != 2:
        return None
    pos = 0 if user.args[0] is p else 1
    other = user.args[1 - pos]
    out = _shape(user)
    if not isinstance(other, torch.fx.Node) or _shape(other) != out or not out or out[0] != batch:
        return None
    shape = _shape(p)
    if len(shape) > len(out) or (len(shape) == len(out) and shape[0] != 1):
        return None  # the parameter has an axis along the batch: not shared by the rows
    sign = -1.0 if (name == "sub" and pos == 1) else 1.0
    if name == "mul":
        return _Plan("scale", user, out, other=other, sign=sign), user, user
    return _Plan("bias", user, out, sign=sign), user, user
