"""Per-example gradients on torch: layers found in the ATen program the call ran.

The same method as the tape's and JAX's (``unigrad/per_example/_tape.py``, ``unigrad_jax._per_example``), for native
torch code (``torch.func.functional_call`` of an ``nn.Module``, ``F.linear``, ``x @ W``) and portable code:

1. ``f`` runs once, an ordinary forward pass with grad on for the parameters, under a
   ``TorchDispatchMode`` that records every ATen operation it runs (the mechanism ``make_fx`` traces
   with), with the data flow between them. Views and in-place operations are followed by the tensors'
   identities; an operand that depends on the parameters but was not produced by a recorded operation
   makes the record unusable (then everything is materialised, as before).
2. For a new program (its operations, data flow, shapes, dtypes and literal arguments are the cache
   key), the record becomes a ``torch.fx`` graph, read by the dependence analysis's fx front-end
   (``_dependence``). A parameter every use of which is a layer ``_per_example_layers``
   knows -- ``mm``/``addmm`` (through transposes; over positions: reshape, product, reshape back), a
   convolution, an embedding, a bias or scale (``addmm``'s, a convolution's, ``add``/``sub``/``mul`` of a
   broadcast parameter, through views), LayerNorm's or GroupNorm's weight and bias -- takes the fast path
   where the row proof shows that row i of the losses depends on each layer's output through its row i alone.
3. ``G``, the gradient of ``sum(losses)`` with respect to those layers' outputs, comes from one
   ``torch.autograd.grad`` of this very forward pass; ``X`` (patches, indices, normalised inputs) are the
   layer's recorded values. Norms: ``|x_i|^2 |g_i|^2``, ghost ``sum((X_i X_i^T) * (G_i G_i^T))`` or
   ``X_i^T G_i``, as on the other engines; see ``_per_example_layers`` for the other layers.

Parameters the trick does not cover (a use no rule reads, rows mixed after the layer...) are
materialised with the backend's ``jacrev`` of the losses -- except where the recorded forward pass wrote
into a tensor ``f`` did not make (batch norm's running statistics in training mode, a counter ``f`` closes
over): ``torch.func`` refuses to run such an ``f`` (it would write again), so their Jacobian rows come from
this very forward pass (:func:`_rows_of_this_pass`), and ``f`` runs once, as a call of the model would.
"""

from __future__ import annotations

from unigrad.per_example import layers as pe

from ._inplace import LEAF_WRITE

_MAX_PLANS = 64


def torch_rows(b, flat_f, leaves, batch, norms, fname, cache, dynamic=(), directions=None, weights=None):
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
        from ._per_example_record import Recorder

        recorder = Recorder(inputs)
        try:
            with recorder:
                outs = flat_f(*inputs)
        except RuntimeError as exc:
            if LEAF_WRITE.search(str(exc)) is None:
                raise
            return None  # f writes into a parameter (torch refused it): materialised, the transforms run f on copies
        pe.check_losses(b, outs, batch, fname)
        losses = outs[0]
        key = recorder.key(losses, batch)
        analysis = cache.get(key) if key is not None and cache is not None else None
        if analysis is None:
            analysis = _Analysis(recorder, losses, n, batch) if key is not None else _Analysis.none(n)
            if key is not None and cache is not None:
                cache.put(key, analysis)
        fast = analysis.plans
        rows, squares, paths = [None] * n, [None] * n, [pe.MATERIALISED] * n
        dots = [None] * n
        # f wrote into a tensor it closes over: the other parameters' rows from this pass, not a second run
        this_pass = [k for k in range(n) if k not in fast] if recorder.captured_writes else []
        # the norms check's gradient of sum_i r_i loss_i, from this recording (unigrad._answer_check.norms_verdicts)
        weigh = bool(fast) and norms and directions is not None and weights is not None and all(
            x.requires_grad for x in inputs)
        weighted = None
        if fast:
            ys = [recorder.value(ref) for ref in analysis.captures]
            # (a layer output later overwritten in place: G at the value it held, by its gradient edge)
            edges = [recorder.edges.get(ref) for ref in analysis.captures]
            usable = [e is not None or y.requires_grad for y, e in zip(ys, edges)]
            grads = torch.autograd.grad(losses.sum(), [y if e is None else e for y, e, u in zip(ys, edges, usable)
                                                        if u], allow_unused=True,
                                        retain_graph=bool(this_pass) or weigh)
            it = iter(grads)
            gs = [next(it) if u else None for u in usable]
            gs = [torch.zeros_like(y) if g is None else g for g, y in zip(gs, ys)]
            from ._per_example_layers import parameter_rows

            for k, uses in fast.items():
                rows[k], squares[k], paths[k], dots[k] = parameter_rows(
                    uses, recorder, gs, leaves[k], batch, norms, None if directions is None else directions[k])
        if weigh:
            weighted = torch.autograd.grad((losses * weights.to(losses.dtype)).sum(), inputs, allow_unused=True,
                                           retain_graph=bool(this_pass))
            weighted = [torch.zeros_like(x) if g is None else g.detach() for g, x in zip(weighted, inputs)]
        if this_pass:
            _rows_of_this_pass(losses, inputs, this_pass, rows, batch)
    losses = losses.detach()
    slow = [] if this_pass else [k for k in range(n) if k not in fast]
    if slow:
        pe.materialise(b, flat_f, leaves, slow, rows)
    if not norms:
        return (losses,), tuple(r.detach() for r in rows), paths
    total = pe.total_norms(_ops(), squares, rows, batch).detach()
    dot = None if directions is None else pe.total_dots(_ops(), dots, rows, directions, batch)
    if dot is None:
        return (losses,), (total,), paths
    if weighted is None:
        return (losses,), (total, dot.detach()), paths
    return (losses,), (total, dot.detach(), pe.direction_dot(_ops(), weighted, directions, dot.dtype).detach()), paths


def _rows_of_this_pass(losses, inputs, slow, rows, batch):
    """The rows of the parameters at positions ``slow``, written into ``rows``: the Jacobian rows of the losses
    of the forward pass that ran (``d losses[i] / d inputs[k]``, statistics over the batch included), by
    autograd's backward pass vectorised over the B unit cotangents (``is_grads_batched``), or one backward pass
    per example where a backward formula has no batching rule. For an ``f`` that wrote into a tensor it closes
    over (batch norm's running statistics in training mode), which ``torch.func`` would refuse to run again."""
    import torch

    wanted = [k for k in slow if inputs[k].requires_grad]
    grads = [None] * len(wanted)
    if wanted and losses.requires_grad:
        xs = [inputs[k] for k in wanted]
        eye = torch.eye(batch, dtype=losses.dtype, device=losses.device)
        try:
            grads = torch.autograd.grad(losses, xs, eye, is_grads_batched=True, allow_unused=True,
                                        retain_graph=True)
        except (RuntimeError, NotImplementedError):  # no batching rule for a backward formula: B passes
            each = [torch.autograd.grad(losses[i], xs, allow_unused=True, retain_graph=True) for i in range(batch)]
            grads = [None if any(e[j] is None for e in each) else torch.stack([e[j] for e in each])
                     for j in range(len(xs))]
    found = dict(zip(wanted, grads))
    for k in slow:
        g, x = found.get(k), inputs[k]
        if g is None:
            g = torch.zeros((batch, *x.shape), dtype=x.dtype, device=x.device)
        rows[k] = g.conj().resolve_conj() if g.is_complex() else g  # (unigrad's convention: the conjugate)


# ---------------------------------------------------------------------------------------------
# The analysis of one program: which parameters are used by layers whose rows stay apart
# ---------------------------------------------------------------------------------------------

def _ops():
    import torch

    return pe.Ops(lambda a, shape: a.reshape(shape), lambda a, axes, keepdims: a.sum(axes, keepdim=keepdims),
                  torch.matmul, lambda a: a.transpose(-1, -2), lambda a, dtype: a.contiguous().to(dtype),
                  torch.sqrt)


class _Analysis:
    """The plans of one program: ``plans`` (leaf -> its uses, see ``_per_example_layers``) and
    ``captures`` (the refs whose gradient is G)."""

    def __init__(self, recorder, losses, n, batch):
        from unigrad.dependence import prove_rows
        from ._dependence import fx_program

        from ._per_example_layers import find_uses

        self.plans, self.captures = {}, []
        graph, refs = recorder.graph(losses)
        ids = {}
        program = fx_program(graph, ids=ids, in_place=True)
        placeholders = [node for node in graph.nodes if node.op == "placeholder"]
        proved = {}
        for k in range(n):
            uses = find_uses(placeholders[k], batch)
            if uses is None:
                continue
            for use in uses:  # the first of the seed's possible batch axes that the proof holds for
                vid = ids.get(use.seed)
                for axis in use.axes:
                    key = (use.seed, axis)
                    if key not in proved:
                        proved[key] = vid is not None and prove_rows(
                            program, batch, seeds={vid: (len(use.seed_shape), axis)})[0] == "row"
                    if proved[key]:
                        use.axis = axis
                        break
                else:
                    use.axis = None
            if not all(use.axis is not None and use.resolve(refs) and use.capture in refs for use in uses):
                continue
            if any(recorder.stale(r) for u in uses for r in u.refs.values()) or any(
                    recorder.stale(refs[u.capture]) and refs[u.capture] not in recorder.edges for u in uses):
                continue  # a value the rows read was overwritten in place later in f: materialised
            for use in uses:
                ref = refs[use.capture]
                if ref not in self.captures:
                    self.captures.append(ref)
                use.g_index = self.captures.index(ref)
            self.plans[k] = uses

    @classmethod
    def none(cls, n):
        self = cls.__new__(cls)
        self.plans, self.captures = {}, []
        return self
