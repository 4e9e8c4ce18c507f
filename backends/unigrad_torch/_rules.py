"""Custom derivative rules on PyTorch: one ``torch.autograd.Function`` with ``setup_context``, ``jvp``
and a generated vmap rule, so it works under plain autograd and under every ``torch.func`` transform.

* forward: the rule's ``fwd`` (its residuals are extra outputs, marked non-differentiable, saved for
  backward as ``torch.func`` asks), or its ``fun``;
* backward: ``bwd`` -- or, with only a JVP rule, the transpose of ``t -> jvp(primals, t)``
  (``torch.func.vjp`` of that linear map);
* jvp: the JVP rule -- or, with only ``bwd``, its transpose (``torch.func.vjp`` of ``g -> bwd(res, g)``).

Forward over forward (``jacfwd`` of ``jacfwd``) raises: torch.func gives the outer level zeros for what
an ``autograd.Function``'s ``jvp`` computes (measured, torch 2.13), and a silent zero is worse than an
error. Forward over reverse, reverse over forward and reverse over reverse work.

Second order: where an outer transform differentiates the rule (the saved inputs are wrapped by
``torch.func``, or require grad with grad mode on: ``create_graph=True``), backward and jvp run
``fwd`` again on the saved inputs, so the residuals carry the outer derivatives; first order uses
the saved residuals. Complex values: torch's reverse mode is the conjugate of unigrad's (JAX's)
convention, so cotangents are conjugated on the way into ``bwd`` and out of it.
"""

from __future__ import annotations

import contextvars

import torch
import torch.func

__all__ = ["apply_rule"]

_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
# Set while a rule's forward runs. torch.func runs a Function's forward below every grad level, each of
# which the Function itself handles (only vmap levels remain, by the generated vmap rule), and plain
# autograd runs it with grad off: a custom function called there (JAX's idiom ``return f(x), res`` in
# fwd) is evaluated plainly. (Applying the Function again from inside its forward would re-enter the
# same torch.func level without end.)
_IN_FORWARD = contextvars.ContextVar("unigrad_torch_rule_forward", default=False)


class _Info:
    """What ``forward`` learnt (the number of outputs); passed through ``apply`` as a non-tensor input."""

    __slots__ = ("n_out",)

    def __init__(self):
        self.n_out = None


def _conj(x):
    return x.conj().resolve_conj() if x is not None and x.is_complex() else x


class _RuleFunction(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(rule, info, *arrays):
        token = _IN_FORWARD.set(True)
        try:
            if rule.fwd is not None:
                outs, res = rule.fwd(*arrays)
            else:
                outs, res = rule.primal(*arrays), ()
        finally:
            _IN_FORWARD.reset(token)
        info.n_out = len(outs)
        # An input returned as it is (a residual x, an identity) must be a view to be saved; and so must a
        # value returned twice (JAX's ``return x, (x, theta)``: an output that is also a residual), or
        # marking the residual non-differentiable would mark the output too (plain autograd then gives it
        # no derivative at all: zeros).
        seen, results = [], []
        for v in (*outs, *res):
            if any(v is a for a in arrays) or any(v is u for u in seen):
                v = v.view_as(v)
            seen.append(v)
            results.append(v)
        return tuple(results)

    @staticmethod
    def setup_context(ctx, inputs, output):
        rule, info, *arrays = inputs
        ctx.rule, ctx.n_in, ctx.n_out = rule, len(arrays), info.n_out
        res = output[info.n_out:]
        if res:
            ctx.mark_non_differentiable(*res)
        ctx.save_for_backward(*arrays, *output[:info.n_out], *res)
        ctx.save_for_forward(*arrays, *output[:info.n_out], *res)

    @staticmethod
    def backward(ctx, *grads):
        rule, n_in, n_out = ctx.rule, ctx.n_in, ctx.n_out
        saved = ctx.saved_tensors
        arrays, outs, res = saved[:n_in], saved[n_in:n_in + n_out], saved[n_in + n_out:]
        grads = tuple(torch.zeros_like(o) if g is None else _conj(g) for g, o in zip(grads[:n_out], outs))
        if rule.bwd is not None:
            cts = rule.bwd(_residuals(rule, arrays, res), grads)
        else:
            zeros = tuple(torch.zeros_like(a) for a in arrays)
            _, pullback = torch.func.vjp(lambda *t: tuple(rule.jvp(arrays, t)[1]), *zeros)
            cts = _transposed(pullback, grads)
        return (None, None, *(_conj(c) for c in cts))

    @staticmethod
    def jvp(ctx, *tangents):
        rule, n_in, n_out = ctx.rule, ctx.n_in, ctx.n_out
        if _forward_levels() > 1:
            raise NotImplementedError(
                f"{rule.name}: forward mode over forward mode (jacfwd of jacfwd, jvp of jvp) through a custom rule "
                f"is not supported on the torch backend: torch.func drops the outer tangent of an "
                f"autograd.Function's jvp (measured: zeros, torch 2.13). Use forward over reverse (unigrad.hessian, "
                f"unigrad.hvp), reverse over forward, or another backend")
        saved = ctx.saved_tensors
        arrays, outs, res = saved[:n_in], saved[n_in:n_in + n_out], saved[n_in + n_out:]
        tangents = tuple(torch.zeros_like(a) if t is None else t for t, a in zip(tangents[2:], arrays))
        if rule.jvp is not None:
            tangents_out = tuple(rule.jvp(arrays, tangents)[1])
        else:
            res = _residuals(rule, arrays, res)
            zeros = tuple(torch.zeros_like(o) for o in outs)
            _, pullback = torch.func.vjp(lambda *g: tuple(rule.bwd(res, g)), *zeros)
            tangents_out = _transposed(pullback, tangents)
        return (*tangents_out, *(None for _ in res))


def _transposed(pullback, values):
    """The (unconjugated) transpose of a linear map applied to ``values``, from torch's pullback (which
    gives the conjugate transpose for complex values)."""
    return tuple(_conj(c) for c in pullback(tuple(_conj(v) for v in values)))


def _forward_levels():
    """How many torch.func forward-mode (jvp) levels are active."""
    stack = torch._C._functorch.get_interpreter_stack() or ()
    jvp = torch._C._functorch.TransformType.Jvp
    return sum(1 for interpreter in stack if interpreter.key() == jvp)


def _residuals(rule, arrays, saved):
    """The saved residuals, or fresh ones computed from the inputs when an outer transform differentiates
    them (second order: the saved ones would be constants to it)."""
    if any(_wrapped(a) or (a.requires_grad and torch.is_grad_enabled()) for a in arrays):
        return tuple(rule.fwd(*arrays)[1])
    return saved


def apply_rule(rule, arrays):
    if _IN_FORWARD.get():  # every grad level has been handled by the Function around it (see above)
        return tuple(rule.primal(*arrays))
    info = _Info()
    result = _RuleFunction.apply(rule, info, *arrays)
    if not isinstance(result, tuple):
        result = (result,)
    return tuple(result[:info.n_out])
