"""The sum trick's unit products, laid out as JAX's own per-example Jacobian lays them out.

The sum trick (``_sum_trick``) pulls the k-th unit cotangent of every example back at once (or pushes the
k-th unit tangent forward): a basis vector repeated over the batch, mapped over k. Mapped by ``jax.vmap``,
that costs 1.13-1.18x JAX's own ``jit(vmap(jacrev(f_one)))`` on an MLP 32-64-16 (batch 256), for two
reasons XLA does not undo:

* ``vmap`` moves the basis axis in front of the batch at the first operation that mixes mapped and
  unmapped operands, so the products run basis-major and the blocks are transposed at the end, where the
  native program is batch-major throughout and writes its blocks in place;
* the basis vector is repeated over the batch, so a first linear operation (``e_k @ W``: a row of ``W``)
  runs once per example, where the native program holds ``e_k`` once and XLA folds the identity in.

This module evaluates the linear program (the pullback's jaxpr, or the linearized push's) equation by
equation instead, with the basis axis kept at one place beside the batch (``layout``: right after it in
reverse mode, where the rows go; last in forward mode, where the columns go), and each basis vector kept
as a *broadcast* over the batch (:class:`Broadcast`: only its base exists) for as long as the operations
commute with that. Every equation that takes a mapped value is mapped by ``jax.vmap`` alone, its outputs
put back at the layout's axis; JAX's own batching rules do the work, so nothing here is an analysis that
could be wrong. An operation commutes with a broadcast where that is an identity of linear algebra for
every value: a ``dot_general`` whose contracted and batch axes are all the base's (each entry of the
broadcast axes is the same product), an elementwise operation of one operand (or with a scalar), a sum of
broadcasts laid out alike, a transpose; anything else gets the broadcast written out first. The result is
the ``vmap`` form's, as the program states it (rounding aside: XLA may sum products of other shapes in
another order).
"""

from __future__ import annotations

import contextlib

import jax
from jax import lax

#: Call-like primitives whose program is evaluated inline (their semantics are the program's; ``remat`` only
#: changes what a backward pass stores, and this program is not differentiated).
_INLINE = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint"})

#: Elementwise operations of one operand with no shape in their parameters: they commute with a broadcast.
_UNARY = frozenset({"neg", "convert_element_type", "copy", "copy_p", "real", "imag", "conj", "reduce_precision"})

#: Elementwise operations of several operands of one shape (or scalars): a mapped operand and an unmapped one
#: are laid out alike before ``vmap`` sees them (its rule would otherwise move the basis axis to the front).
_ELEMENTWISE = frozenset({"add", "add_any", "sub", "mul", "div", "max", "min", "select_n", "pow", "atan2",
                          "nextafter", "rem", "and", "or", "xor", "eq", "ne", "lt", "le", "gt", "ge"}) | _UNARY


def reverse_layout(ndim):
    """Reverse mode: the basis right after the batch axis (rows of per-example Jacobians, ``(B, n_out, ...)``)."""
    return min(1, ndim)


def forward_layout(ndim):
    """Forward mode: the basis last (columns of per-example Jacobians, ``(B, ..., n_in)``)."""
    return ndim


class Mapped:
    """A value of logical ``shape`` for every basis vector at once: ``array`` holds the basis axis at
    ``layout(len(shape))``."""

    __slots__ = ("array", "shape")

    def __init__(self, array, shape):
        self.array, self.shape = array, tuple(shape)


class Broadcast:
    """``broadcast_in_dim(base, shape, dims)`` not written out: ``dims`` (increasing) are the axes of ``shape``
    that the axes of ``base`` (a :class:`Mapped` value, or an array) become; the others repeat it."""

    __slots__ = ("base", "shape", "dims")

    def __init__(self, base, shape, dims):
        self.base, self.shape, self.dims = base, tuple(shape), tuple(dims)


def repeated_basis(rows, shapes, batch, layout):
    """Unit vectors ``rows`` (per block ``(n, *shape)``: ``Backend.unit_basis``'s) as the arguments of
    :func:`linear_map`'s ``apply``: each one example's, repeated over a leading batch of ``batch`` (not written
    out), the basis axis at the layout's place."""
    return tuple(Broadcast(Mapped(jax.numpy.moveaxis(r, 0, layout(len(shape))), shape), (batch, *shape),
                           range(1, 1 + len(shape)))
                 for r, shape in zip(rows, shapes))


def linear_map(fun, specs, layout):
    """``apply(*args) -> outputs``: ``fun`` (a linear function of arrays shaped as ``specs``) traced once and
    evaluated with ``args`` each an array, a :class:`Mapped` or a :class:`Broadcast`; every output comes back
    with the basis axis at ``layout(ndim)`` (broadcast over the basis where it does not depend on it)."""
    closed = jax.make_jaxpr(fun)(*specs)

    def apply(*args, size):
        ev = _Evaluator(layout, size)
        outs = ev.evaluate(closed.jaxpr, closed.consts, args)
        return [ev.mapped_array(o, v.aval) for o, v in zip(outs, closed.jaxpr.outvars)]

    return apply


class _Evaluator:
    def __init__(self, layout, size):
        self.layout, self.size = layout, size

    # -- values -------------------------------------------------------------------------------------
    def written(self, x):
        """A broadcast written out (a mapped value stays mapped)."""
        if not isinstance(x, Broadcast):
            return x
        shape, dims = x.shape, x.dims
        return self.map_call(lambda b: [lax.broadcast_in_dim(b, shape, dims)], [x.base], [shape])[0]

    def repeated(self, x, shape):
        """An unmapped array of logical ``shape`` repeated over the basis, the basis axis at the layout's place."""
        axis = self.layout(len(shape))
        full = tuple(shape[:axis]) + (self.size,) + tuple(shape[axis:])
        return lax.broadcast_in_dim(x, full, tuple(a + (a >= axis) for a in range(len(shape))))

    def mapped_array(self, x, aval):
        """An output as an array with the basis axis at the layout's place."""
        x = self.written(x)
        if isinstance(x, Mapped):
            return x.array
        return self.repeated(jax.numpy.broadcast_to(jax.numpy.asarray(x, aval.dtype), aval.shape), tuple(aval.shape))

    def map_call(self, fn, invals, out_shapes):
        """``fn(*arrays) -> list`` applied to every basis vector by ``jax.vmap``, outputs at the layout's axis."""
        if not any(isinstance(x, Mapped) for x in invals):
            return fn(*invals)
        in_axes = [self.layout(len(x.shape)) if isinstance(x, Mapped) else None for x in invals]
        arrays = [x.array if isinstance(x, Mapped) else x for x in invals]
        outs = jax.vmap(lambda *a: list(fn(*a)), in_axes=in_axes,
                        out_axes=[self.layout(len(s)) for s in out_shapes], axis_size=self.size)(*arrays)
        return [Mapped(o, s) for o, s in zip(outs, out_shapes)]

    def laid_alike(self, x, shape):
        """An unmapped operand of an elementwise operation, mapped (repeated) as its mapped operands are."""
        if isinstance(x, Mapped) or jax.numpy.ndim(x) == 0 or tuple(jax.numpy.shape(x)) != tuple(shape):
            return x
        return Mapped(self.repeated(x, shape), shape)

    # -- the program ---------------------------------------------------------------------------------
    def evaluate(self, jaxpr, consts, args):
        env = {}

        def read(v):
            return v.val if type(v).__name__ == "Literal" else env[v]

        for v, c in zip(jaxpr.constvars, consts):
            env[v] = c
        for v, a in zip(jaxpr.invars, args):
            env[v] = a
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, invals)
            for v, o in zip(eqn.outvars, outs):
                if type(v).__name__ != "DropVar":
                    env[v] = o
        return [read(v) for v in jaxpr.outvars]

    def equation(self, eqn, invals):
        ctx = getattr(eqn, "ctx", None)  # (the equation's context, as jax.core.eval_jaxpr applies it)
        with ctx.manager if ctx is not None else contextlib.nullcontext():
            return self._equation(eqn, invals)

    def _equation(self, eqn, invals):
        name = eqn.primitive.name
        if name in _INLINE and any(isinstance(x, (Mapped, Broadcast)) for x in invals):
            inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
            if inner is not None:
                return self.evaluate(getattr(inner, "jaxpr", inner), getattr(inner, "consts", ()), invals)
        if any(isinstance(x, Broadcast) for x in invals):
            outs = self.folded(eqn, invals)
            if outs is not None:
                return outs
            invals = [self.written(x) for x in invals]
        out_shapes = [tuple(v.aval.shape) for v in eqn.outvars]
        if name in _ELEMENTWISE and any(isinstance(x, Mapped) for x in invals):
            invals = [self.laid_alike(x, out_shapes[0]) for x in invals]
        return self.map_call(lambda *a: _bind(eqn.primitive, eqn.params, a), invals, out_shapes)

    # -- broadcasts kept ------------------------------------------------------------------------------
    def folded(self, eqn, invals):
        """The outputs of ``eqn`` with its broadcast operands kept where it commutes with them, else None."""
        name = eqn.primitive.name
        if name == "dot_general":
            return self.dot(eqn, *invals)
        if name in _UNARY:
            (x,) = invals
            return [self.on_base(eqn.primitive, eqn.params, [x.base], x)]
        if name in ("add", "add_any", "sub", "mul", "div"):
            return self.binary(eqn, invals)
        if name == "transpose":
            return [self.transposed(invals[0], tuple(eqn.params["permutation"]))]
        return None

    def on_base(self, primitive, params, bases, like):
        """``primitive`` applied to bases of broadcasts laid out as ``like``: the same broadcast of the result."""
        (out,) = self.map_call(lambda *a: _bind(primitive, params, a), bases, [tuple(_logical(like.base))])
        return Broadcast(out, like.shape, like.dims)

    def binary(self, eqn, invals):
        a, b = invals
        if isinstance(a, Broadcast) and isinstance(b, Broadcast):
            if a.shape != b.shape or a.dims != b.dims:
                return None
            return [self.on_base(eqn.primitive, eqn.params, [a.base, b.base], a)]
        x, other = (a, b) if isinstance(a, Broadcast) else (b, a)
        if eqn.primitive.name not in ("mul", "div") or isinstance(other, Mapped) or jax.numpy.ndim(other) != 0:
            return None  # (a sum with an array, a product with a mapped value: written out)
        if eqn.primitive.name == "div" and x is b:
            return None
        bases = [x.base, other] if x is a else [other, x.base]
        return [self.on_base(eqn.primitive, eqn.params, bases, x)]

    def transposed(self, x, permutation):
        """The base's axes land at ``permutation.index(d)``; the base is transposed to keep them increasing."""
        landed = [permutation.index(d) for d in x.dims]
        order = tuple(sorted(range(len(landed)), key=landed.__getitem__))
        base = x.base
        if order != tuple(range(len(order))):
            shape = tuple(_logical(base)[i] for i in order)
            (base,) = self.map_call(lambda b: [lax.transpose(b, order)], [base], [shape])
        return Broadcast(base, tuple(x.shape[p] for p in permutation), tuple(sorted(landed)))

    def dot(self, eqn, lhs, rhs):
        """``dot_general`` of one broadcast and one value, where every broadcast axis is a free axis of the
        product: the product of the base, broadcast along the same axes of the result."""
        if isinstance(lhs, Broadcast) == isinstance(rhs, Broadcast):
            return None
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        left = isinstance(lhs, Broadcast)
        x = lhs if left else rhs
        if any(a not in x.dims for a in (tuple(lc) + tuple(lb) if left else tuple(rc) + tuple(rb))):
            return None
        at = {d: i for i, d in enumerate(x.dims)}  # an axis of the broadcast -> its base's axis
        if left:
            numbers = ((tuple(at[a] for a in lc), tuple(rc)), (tuple(at[a] for a in lb), tuple(rb)))
        else:
            numbers = ((tuple(lc), tuple(at[a] for a in rc)), (tuple(lb), tuple(at[a] for a in rb)))
        # the result's axes: batch axes, then the left operand's free axes, then the right's, each in order
        nl, nr = len(_logical(lhs)), len(_logical(rhs))
        axes = [None] * len(lb) + [("l", a) for a in range(nl) if a not in lc and a not in lb] \
            + [("r", a) for a in range(nr) if a not in rc and a not in rb]
        side = "l" if left else "r"
        dims = tuple(i for i, ax in enumerate(axes) if ax is None or ax[0] != side or ax[1] in at)
        out_shape = tuple(eqn.outvars[0].aval.shape)
        params = dict(eqn.params, dimension_numbers=numbers)
        operands = [x.base, rhs] if left else [lhs, x.base]
        (out,) = self.map_call(lambda *a: _bind(eqn.primitive, params, a), operands, [tuple(out_shape[d] for d in dims)])
        return [Broadcast(out, out_shape, dims)]


def _logical(x):
    return x.shape if isinstance(x, (Mapped, Broadcast)) else jax.numpy.shape(x)


def _bind(primitive, params, invals):
    """``primitive`` applied as ``jax.core.eval_jaxpr`` applies it; a list of outputs."""
    bound = primitive.get_bind_params(params)
    subfuns, params = bound if isinstance(bound, tuple) else ((), bound)  # (older JAX: subfunctions too)
    outs = primitive.bind(*subfuns, *invals, **params)
    return outs if primitive.multiple_results else [outs]
