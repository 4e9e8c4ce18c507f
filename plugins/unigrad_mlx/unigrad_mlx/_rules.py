"""Custom derivative rules (``unigrad.custom_vjp``, ``custom_jvp``, ``checkpoint``) on MLX: one
``mx.custom_function`` per call, whose ``vjp`` and ``jvp`` call the rule.

The missing mode is the transpose of the given one (``bwd`` is linear in its cotangents, a JVP rule in
its tangents): a VJP from the JVP rule is ``mx.vjp`` of ``t -> jvp(primals, t)``, a JVP from ``bwd`` is
``mx.vjp`` of ``g -> bwd(residuals, g)``, the primals (residuals) passed to that ``mx.vjp`` as primals too, not
closed over (:func:`_transposed`). MLX treats what a custom function closes over as constants,
so the residuals are recomputed from the primals inside each rule (``fwd`` again): they then carry the
derivatives of outer transforms (second order). Where the rule says its residuals from its outputs
(``Rule.residuals``: the implicit rules' solution), the VJP takes them from the outputs MLX hands it,
which carry those derivatives too, and no solver runs again. MLX hands a JVP rule no outputs: where the rule
takes them (``Rule.jvp_given``), the JVP is given the outputs this call's forward computation gave (kept by the
custom function of this call, made for it alone), so no solver runs again there either.

``TRACING`` records which of this backend's transforms are tracing the code that runs now
(``MlxBackend.transforms_tracing``): every ``mx.vjp`` / ``mx.jvp`` / ``mx.vmap`` / ``mx.compile`` the backend
calls runs its function through :func:`traced_by`.
"""

from __future__ import annotations

import contextvars

import mlx.core as mx

__all__ = ["apply_rule", "traced_by", "TRACING"]

# The kinds ("vjp", "jvp", "vmap", "compile") of this backend's mx.vjp / mx.jvp / mx.vmap / mx.compile calls
# whose function is running now, outermost first: what runs now is differentiated by each "vjp" and "jvp". A
# transform's derivative pass (a custom rule's vjp or jvp, called once the function has returned) is not in its
# own entry. A ContextVar: each thread and
# each asyncio task sees its own (no global state).
TRACING: contextvars.ContextVar = contextvars.ContextVar("unigrad_mlx_tracing", default=())


def traced_by(mode, f):
    """``f``, recorded in ``TRACING`` as traced by a ``mode`` transform while it runs (give this, not ``f``,
    to ``mx.vjp`` / ``mx.jvp``)."""
    def traced(*args):
        token = TRACING.set(TRACING.get() + (mode,))
        try:
            return f(*args)
        finally:
            TRACING.reset(token)
    return traced


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _conj(x):
    return mx.conj(x) if x.dtype == mx.complex64 else x


def apply_rule(rule, arrays):
    arrays = tuple(arrays)
    n = len(arrays)

    def residuals(primals):
        return tuple(rule.fwd(*primals)[1])

    given = []  # the outputs of this call's forward computation (for Rule.jvp_given)

    @mx.custom_function
    def apply(*xs):
        outputs = tuple(rule.primal(*xs))
        if rule.jvp_given is not None:
            given[:] = [outputs]
        return outputs

    @apply.vjp
    def apply_vjp(primals, cotangents, outputs):
        primals, outputs = _tuple(primals), _tuple(outputs)
        cotangents = [mx.zeros_like(o) if c is None else c for c, o in zip(_tuple(cotangents), outputs)]
        if rule.bwd is not None:
            # MLX's cotangents follow its (conjugate) complex convention, the rule's unigrad's
            res = rule.residuals(primals, outputs) if rule.residuals is not None else residuals(primals)
            cts = tuple(_conj(c) for c in rule.bwd(res, tuple(_conj(c) for c in cotangents)))
        else:  # the transpose of the JVP rule, the primals passed to mx.vjp too (see _transposed)
            cts = _transposed(lambda p, t: rule.jvp(p, t)[1], primals, [mx.zeros_like(p) for p in primals],
                              cotangents)
        return tuple(cts) if n > 1 else cts[0]

    @apply.jvp
    def apply_jvp(primals, tangents):
        primals = _tuple(primals)
        tangents = tuple(mx.zeros_like(p) if t is None else t for t, p in zip(_tuple(tangents), primals))
        if rule.jvp_given is not None and given:
            return tuple(_tuple(rule.jvp_given(primals, tangents, given[0])[1]))
        if rule.jvp is not None:
            return tuple(_tuple(rule.jvp(primals, tangents)[1]))
        # the transpose of bwd (unigrad's convention: no conjugation), from MLX's conjugating vjp, the residuals
        # passed to mx.vjp too (see _transposed)
        zeros = [mx.zeros_like(o) for o in rule.primal(*primals)]
        out = _transposed(rule.bwd, residuals(primals), zeros, [_conj(t) for t in tangents])
        return tuple(_conj(o) for o in out)

    return tuple(apply(*arrays))


def _inexact(x):
    return isinstance(x, mx.array) and (mx.issubdtype(x.dtype, mx.floating) or
                                         mx.issubdtype(x.dtype, mx.complexfloating))


def _transposed(linear, fixed, zeros, cotangents):
    """The transpose of ``v -> linear(fixed, v)`` (linear in ``v``), applied to ``cotangents``: ``mx.vjp`` at
    ``v = zeros``. The floating-point arrays of ``fixed`` (a rule's primals or residuals) are primals of that
    ``mx.vjp`` too, their cotangents dropped, rather than arrays the function closes over: MLX loses the
    derivative of enclosing transforms through a closure of a nested ``mx.vjp`` here -- a third derivative in
    reverse mode, each level evaluating f before it records f again (as ``MlxBackend.vjp`` does), came out 0
    (``tests/test_backend_mlx.py::test_custom_rules_third_derivatives``)."""
    fixed = tuple(fixed)
    at = [k for k, x in enumerate(fixed) if _inexact(x)]
    m = len(at)

    def function(*args):
        placed = list(fixed)
        for k, a in zip(at, args[:m]):
            placed[k] = a
        return list(_tuple(linear(tuple(placed), tuple(args[m:]))))

    _, cts = mx.vjp(traced_by("vjp", function), [fixed[k] for k in at] + list(zeros), list(cotangents))
    return tuple(cts[m:])
