"""``unigrad.checkpoint`` on PyTorch: an ``autograd.Function`` that saves only the block's inputs.

``torch.utils.checkpoint`` (non-reentrant) discards and recomputes through saved-tensor hooks, which
``torch.func``'s reverse-mode transforms refuse ("don't yet support saved tensor hooks"), and the
backend's transforms are all ``torch.func``. So inside a transform the block is a
``torch.autograd.Function`` (``setup_context`` style, usable under every ``torch.func`` transform):
``forward`` runs the block without recording it, the context keeps the inputs, ``backward``
re-runs the block under ``torch.func.vjp`` and pulls the cotangents back (differentiable again:
Hessians work), ``jvp`` pushes tangents through ``torch.func.jvp`` (forward mode recomputes the
block once more), and vmap's rule is generated.

One trap: a ``Function``'s ``forward`` runs with the calling transform's level hidden, so a tensor
of that level the block closes over (instead of taking it as an argument) would lose its
derivative -- silently. While ``forward`` runs, a ``TorchFunctionMode`` looks at the tensors every
operation receives, and ``forward`` raises a TypeError when one was wrapped at a hidden level.

Outside every ``torch.func`` transform (a user's own ``loss.backward()``), the block goes to
``torch.utils.checkpoint`` itself, which handles closures.
"""

from __future__ import annotations

import torch
import torch.func
import torch.utils.checkpoint
from torch.overrides import TorchFunctionMode

__all__ = ["checkpoint"]

_functorch = torch._C._functorch


def checkpoint(f, primals):
    """``tuple(f(*primals))``, its intermediates recomputed in the backward pass."""
    primals = tuple(primals)
    stack = _functorch.get_interpreter_stack()
    if not stack:  # plain autograd: torch's own (closures work there)
        if not torch.is_grad_enabled() or not any(p.requires_grad for p in primals):
            return tuple(f(*primals))
        return tuple(torch.utils.checkpoint.checkpoint(lambda *p: tuple(f(*p)), *primals, use_reentrant=False))
    if len(stack) == 1 and stack[0].key() == _functorch.TransformType.Grad:
        return tuple(_Remat.apply(f, *primals))
    # Nested transforms (hessian, hvp, vmap of grad) or forward mode alone: the block runs as it is. A
    # Function whose backward runs after torch.func.vjp has returned (unigrad's vjp_fn) under an outer
    # jvp or vmap level trips torch's internal level checks (torch 2.13), and forward mode has
    # nothing to rematerialise.
    return tuple(f(*primals))


class _Remat(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(f, *inputs):
        level = _functorch.maybe_current_level()
        check = _ClosureCheck(-1 if level is None else level)
        with check:
            outputs = tuple(f(*inputs))
        if check.found:
            raise TypeError(
                f"checkpoint: {getattr(f, '__name__', 'the block')} used a tensor being differentiated that is "
                f"not one of its arguments (a value it closes over, computed inside the transform); "
                f"rematerialisation recomputes the block from its arguments alone, and torch would drop that "
                f"tensor's derivative. Pass it to the checkpointed function as an argument")
        return outputs

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.f = inputs[0]
        ctx.save_for_backward(*inputs[1:])
        ctx.save_for_forward(*inputs[1:])

    @staticmethod
    def backward(ctx, *cotangents):
        inputs = ctx.saved_tensors
        _, pullback = torch.func.vjp(lambda *p: tuple(ctx.f(*p)), *inputs)
        return (None, *pullback(tuple(cotangents)))

    @staticmethod
    def jvp(ctx, _f_tangent, *tangents):
        inputs = ctx.saved_tensors
        tangents = tuple(torch.zeros_like(p) if t is None else t for t, p in zip(tangents, inputs))
        return tuple(torch.func.jvp(lambda *p: tuple(ctx.f(*p)), inputs, tangents)[1])


class _ClosureCheck(TorchFunctionMode):
    """Notes an operation on a tensor wrapped by a ``torch.func`` level above ``level`` (hidden while a
    ``Function``'s ``forward`` runs): a tensor the block closes over. (It does not raise there: torch
    turns a TypeError inside an operator into ``NotImplemented``.)"""

    def __init__(self, level):
        super().__init__()
        self.level, self.found = level, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.found:
            level = self.level
            for a in (*args, *kwargs.values()):
                if isinstance(a, torch.Tensor):
                    if _functorch.maybe_get_level(a) > level:
                        self.found = True
                elif isinstance(a, (tuple, list)):
                    for b in a:
                        if isinstance(b, torch.Tensor) and _functorch.maybe_get_level(b) > level:
                            self.found = True
        return func(*args, **kwargs)
