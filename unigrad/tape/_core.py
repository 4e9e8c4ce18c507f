"""The tape's engine: the reverse and forward traces and their sweeps (``record``, ``backward``, ``push``).

How it works, in one page:

* A transform opens a *trace* one level above the current depth (a contextvar,
  so threads and async tasks never see each other's traces, and the depth is
  restored when ``f`` raises). Its inputs are wrapped in tracers of that trace.
* Every operation is a :class:`Primitive`. ``bind`` finds the highest-level
  tracer among the arguments and lets that trace process the call; the trace
  unwraps its own tracers and binds again one level down, so traces nest to any
  depth and in any mix of forward and reverse.
* A reverse trace appends each traced call to its tape (a list, in execution
  order, which is a topological order); the backward sweep walks it once from
  the end -- iteratively, no recursion limit.
* A forward trace carries a tangent beside each value and applies the JVP rules
  as it goes.
* Rules are written with the traced operations themselves, so the backward
  sweep can be traced again (hessians, hvps, third derivatives).
* Batches: a cotangent (or tangent) may carry extra *leading* axes -- a batch
  of basis vectors. That is how a Jacobian is one sweep rather than a loop over
  rows. Rules stay batch-agnostic because every axis parameter is stored as a
  negative number (counted from the end), and broadcasting is undone (reverse)
  or aligned (forward) here, centrally, for primitives flagged ``broadcasts``.
* Results belong to the caller (``_owned``) and each cotangent has its value's
  dtype (``_like_dtype``).

Primitives and tracers are defined in ``_tracer``; the few primitives the engine
itself applies (reshape, sum, broadcast_to, real, astype) are looked up by name in
the registry the rule table fills, so this module imports no rule.
"""

from __future__ import annotations

from sys import getrefcount as _refs

import numpy as np

from ._tracer import (PRIMITIVES, FTracer, LeakedTracerError, Primitive, RTracer, Shell, Trace, Tracer,  # noqa: F401
                      _depth, _ndim, _shape, bind, concrete)

# Values smaller than this (elements) stay on the reverse tape even when no rule reads them: a Shell
# would cost more time than the memory it frees. (Tests set it to 0 to check every rule's Primitive.keeps.)
_SHELL_MIN = 2048

# Cotangents of at least this many elements are scaled in their own memory when the sweep alone holds
# them (a unary elementwise rule): fewer fresh pages, and a smaller peak, on batched sweeps.
_INPLACE_MIN = 2048


def _local_refs():
    a = np.empty(1)
    return _refs(a)


# What sys.getrefcount reports for an array held by one local variable alone (interpreters differ in
# whether the call's own argument counts): the sweep's test that nothing else can see a cotangent.
_LOCAL_REFS = _local_refs()


class ReverseTrace(Trace):
    __slots__ = ("tape", "released")

    def __init__(self):  # (Trace.__init__ written out: a trace per transform call)
        self.level = _depth.get() + 1
        self.active = True
        self.released = False
        self.tape = []  # entries: None for an input, else (prim, parents, args, ans, params)

    def process(self, prim, args, params):
        if not self.active:
            self._leaked(prim)
        # the hottest loop of the tape: plain statements, no helper calls
        vals, parents = list(args), []
        nested = False  # does a lower-level tracer remain after unwrapping this level?
        i = 0
        for a in args:
            if isinstance(a, Tracer):
                tr = a.trace
                if tr is self:
                    a_value = vals[i] = a.value
                    parents.append((i, a.index))
                    if isinstance(a_value, Tracer):
                        nested = True
                elif tr.level == self.level:  # another trace of this level: a value that escaped its transform
                    tr._leaked(prim)
                else:
                    nested = True
            i += 1
        i_end = i  # (len(vals))
        if nested:
            ans = prim(*vals, **params)
        else:
            ans = prim.impl(*vals, **params) if params else prim.impl(*vals)
        vjps = prim.vjps
        if vjps is None:
            return ans
        if prim.partial:
            parents = [(i, j) for i, j in parents if vjps[i] is not None]
            if not parents:
                return ans
        tape = self.tape
        if prim.twin is not None and not nested and tape[parents[0][1]] is None:
            # a unary function of an input: its twin's slope reads the input (held for the trace's life
            # anyway) instead of the result, which is then not kept (tanh: 1/cosh(x)^2, not 1 - ans^2)
            prim = prim.twin
        drops = prim.drops
        if drops is None or nested:
            tape.append((prim, parents, vals, ans, params))
        else:  # keep only what the rules read: a Shell of a large unread value, so it is freed with its tracer
            drop_ans, drop_args = drops
            for i in drop_args:  # (a rule's named keyword parameters count too: skipped here)
                if i < i_end:
                    v = vals[i]
                    if type(v) is np.ndarray and v.size >= _SHELL_MIN:
                        vals[i] = Shell(v)
            if drop_ans and type(ans) is np.ndarray and ans.size >= _SHELL_MIN:
                tape.append((prim, parents, vals, Shell(ans), params))
            else:
                tape.append((prim, parents, vals, ans, params))
        return RTracer(self, ans, len(tape) - 1)


class ForwardTrace(Trace):
    __slots__ = ("batch_shape",)

    def __init__(self, batch_shape=()):
        super().__init__()
        self.batch_shape = batch_shape

    def process(self, prim, args, params):
        if not self.active:
            self._leaked(prim)
        vals, tans = [], []
        for a in args:
            if isinstance(a, Tracer) and a.trace.level == self.level:
                if a.trace is not self:
                    a.trace._leaked(prim)
                vals.append(a.value)
                tans.append(a.tangent)
            else:
                vals.append(a)
                tans.append(None)
        ans = bind(prim, vals, params)
        if prim.vjps is None:
            return ans
        if prim.jvp_joint is not None:
            t_out = prim.jvp_joint(tans, ans, *vals, **params)
        else:
            t_out = None
            for i, t in enumerate(tans):
                if t is None:
                    continue
                rule = prim.jvps[i]
                if rule is None:
                    continue
                if prim.broadcasts:
                    t = _align(t, vals[i], ans)
                c = rule(t, ans, *vals, **params)
                t_out = c if t_out is None else t_out + c
        if t_out is None:
            return ans
        want = tuple(self.batch_shape) + tuple(np.shape(ans) if not isinstance(ans, Tracer) else ans.shape)
        if tuple(t_out.shape) != want:
            t_out = PRIMITIVES["broadcast_to"](t_out, want)
        return FTracer(self, ans, t_out)


def _align(t, x, ans):
    """Reshape a batched tangent of ``x`` so it broadcasts against ``ans``: (*batch, 1.., *x.shape)."""
    xnd, and_ = np.ndim(x) if not isinstance(x, Tracer) else x.ndim, _ndim(ans)
    if and_ <= xnd:
        return t
    nb = t.ndim - xnd
    shape = tuple(t.shape)
    return PRIMITIVES["reshape"](t, shape[:nb] + (1,) * (and_ - xnd) + shape[nb:])


def unbroadcast(c, shape, nb):
    """Sum a batched cotangent ``c`` (``nb`` leading batch axes) down to ``(*batch, *shape)``."""
    cshape = _shape(c)
    if cshape[nb:] == tuple(shape):
        return c
    lead = len(cshape) - nb - len(shape)
    nd = len(cshape)
    axes = [nb + k - nd for k in range(lead)]
    axes += [nb + lead + k - nd for k, s in enumerate(shape) if s == 1 and cshape[nb + lead + k] != 1]
    if axes:
        c = PRIMITIVES["sum"](c, axis=tuple(axes), keepdims=True)
    return PRIMITIVES["reshape"](c, cshape[:nb] + tuple(shape))


# ------------------------------------------------------------------------------- reverse sweep

def backward(trace: ReverseTrace, out_indices, cotangents, n_inputs, input_values, batch_shape=(), release=False):
    """Pull ``cotangents`` (each with ``batch_shape`` leading axes) back to the first ``n_inputs`` tape entries.

    ``release``: drop each entry once pulled back, so the forward's intermediates are freed during the
    sweep; the trace cannot be swept again.
    """
    tape = trace.tape
    if trace.released:
        raise RuntimeError("this trace was swept with release=True; it cannot be swept again")
    trace.released = release
    cts = {}
    for idx, g in zip(out_indices, cotangents):
        if idx is None:
            continue
        old = cts.get(idx)
        cts[idx] = g if old is None else old + g
    nb = len(batch_shape)
    start = max(cts, default=-1)
    pop, get = cts.pop, cts.get
    for idx in range(start, n_inputs - 1, -1):
        g = pop(idx, None)
        if g is None:
            continue
        prim, parents, vals, ans, params = tape[idx]
        slope = prim.slope
        if slope is not None:  # unary elementwise: g * slope, in g's memory when the sweep alone holds g
            d = slope(ans, vals[0])
            if (type(g) is np.ndarray and type(d) is np.ndarray and g.size >= _INPLACE_MIN and g.base is None
                    and g.dtype == d.dtype and d.shape == g.shape[g.ndim - d.ndim:] and _refs(g) == _LOCAL_REFS
                    and g.flags.writeable):
                c = np.multiply(g, d, out=g)
            else:
                c = g * d
            d = None
            pidx = parents[0][1]
            old = get(pidx)
            cts[pidx] = c if old is None else old + c
            old = c = g = None
            if release:
                tape[idx] = None
            continue
        vjps, broadcasts = prim.vjps, prim.broadcasts
        for i, pidx in parents:
            c = vjps[i](g, ans, *vals, **params) if params else vjps[i](g, ans, *vals)
            if broadcasts:  # traced values and cotangents all have .shape and .dtype
                x = vals[i]
                if c.shape[nb:] != x.shape or c.ndim != x.ndim + nb:
                    c = unbroadcast(c, _shape(x), nb)
                if c.dtype != x.dtype:  # mixed dtypes: each value's cotangent in its own dtype
                    c = _like_dtype(c, x)
            old = get(pidx)
            if old is None:
                cts[pidx] = c
            elif (type(old) is np.ndarray and type(c) is np.ndarray and old.base is None and _refs(old) == _LOCAL_REFS + 1
                  and old.shape == c.shape and old.dtype == c.dtype and old.flags.writeable):
                np.add(old, c, out=old)  # only cts holds old (+ the local, + getrefcount's argument): sum in place
            else:
                cts[pidx] = old + c
            old = c = None  # not held past their use: the sweep's peak memory counts every live array
        g = None
        if release:
            tape[idx] = None
    grads = []
    for i in range(n_inputs):
        v = input_values[i]
        g = cts.get(i)
        if g is None:
            g = np.zeros(tuple(batch_shape) + _shape(v), dtype=v.dtype)
        else:
            if type(g) is not np.ndarray or g.dtype is not v.dtype:  # (a dtype is one object per kind)
                g = _like_dtype(g, v)
            g = _owned(g, cotangents, grads)
        grads.append(g)
    return tuple(grads)


def _like_dtype(c, x):
    """The cotangent ``c`` of ``x`` in x's dtype, as torch and JAX give it: a float32 input mixed with
    float64 data gets a float32 gradient, a real input the real part of a complex cotangent."""
    if not hasattr(c, "dtype"):
        c = np.asarray(c)
    cd, xd = c.dtype, x.dtype
    if cd == xd:
        return c
    if cd.kind == "c" and xd.kind != "c":
        c = PRIMITIVES["real"](c)
    if xd.kind in "fc" and c.dtype != xd:
        c = PRIMITIVES["astype"](c, dtype=np.dtype(xd))
    return c


def _owned(r, received, handed):
    """``r`` as a result the caller owns: a writable NumPy array (a 0-d array for a scalar) whose memory
    belongs to no array the caller gave (``received``) nor to a result handed out before it
    (``handed``); copied only when it would. Rules return fresh arrays or views of their cotangent, so
    without this a result can be (a view of) the caller's cotangent, or one array for two inputs
    (``a + b``). A Tracer (a nested transform's value) is returned as it is."""
    if type(r) is not np.ndarray:
        return r if isinstance(r, Tracer) else np.asarray(r)
    owner = r.base  # NumPy points every view's base at the array that owns the memory
    if owner is None:
        owner = r
    elif not r.flags.writeable:  # a broadcast view
        return r.copy()
    for a in received:
        if a is owner or (type(a) is np.ndarray and a.base is owner):
            return r.copy()
    for a in handed:
        if a is owner or (type(a) is np.ndarray and a.base is owner):
            return r.copy()
    return r


def _run_traced(trace, f, inputs, has_aux):
    """``f(*inputs)`` one level deeper; the depth is restored and the trace closed even if ``f`` raises."""
    token = _depth.set(trace.level)
    try:
        result = f(*inputs)
    finally:
        _depth.reset(token)
        trace.active = False
    return result if has_aux else (result, ())


def record(f, primals, has_aux, kept=False):
    """Run ``f`` under a new reverse trace. Returns (trace, out_values, out_indices, aux).

    The values returned are arrays the caller owns: none is a primal or a view of one, and with
    ``kept`` (the trace outlives the call: ``vjp``'s ``vjp_fn`` sweeps it later) none is a value the
    tape holds, so mutating ``out`` in place cannot change what ``vjp_fn`` computes.
    """
    trace = ReverseTrace()
    n = len(primals)
    trace.tape.extend([None] * n)  # the inputs' entries
    token = _depth.set(trace.level)  # (_run_traced written out: a frame less on every call)
    try:
        result = f(*[RTracer(trace, primals[i], i) for i in range(n)])
    finally:
        _depth.reset(token)
        trace.active = False
    outs, aux = result if has_aux else (result, ())
    out_values, out_indices = [], []
    for o in outs:
        if isinstance(o, RTracer) and o.trace is trace:
            v = o.value
            if type(v) is np.ndarray:  # (_strip's common case)
                v = v.copy() if kept else _owned(v, primals, out_values)  # kept: a fresh copy
            else:
                v = _strip(o, trace, kept)
                v = v if kept else _owned(v, primals, out_values)
            out_values.append(v)
            out_indices.append(o.index)
        else:
            out_values.append(_owned(_strip(o, trace), primals, out_values))
            out_indices.append(None)
    aux = tuple([_strip(a, trace, kept) for a in aux]) if aux else ()
    return trace, tuple(out_values), out_indices, aux


def _strip(a, trace, kept=False):
    """The value of ``a`` under ``trace``'s level; with ``kept``, a copy of an array the tape holds."""
    held = kept and isinstance(a, RTracer) and a.trace is trace
    while isinstance(a, Tracer) and a.trace.level >= trace.level:
        a = a.value
    if isinstance(a, np.generic):
        return np.asarray(a)
    return a.copy() if held and type(a) is np.ndarray else a


def push(f, primals, tangents, has_aux, batch_shape=()):
    """Run ``f`` under a new forward trace. Returns (out_values, out_tangents, aux): arrays the caller
    owns (none is, or is a view of, a primal, a tangent or another result), each tangent in its
    output's dtype."""
    trace = ForwardTrace(batch_shape)
    outs, aux = _run_traced(trace, f, [FTracer(trace, p, t) for p, t in zip(primals, tangents)], has_aux)
    values, tans = [], []
    received = tuple(primals) + tuple(tangents)
    for o in outs:
        if isinstance(o, FTracer) and o.trace is trace:
            v = _owned(_strip(o.value, trace), received, values)
            values.append(v)
            tans.append(_owned(_like_dtype(_strip(o.tangent, trace), v), received, values + tans))
        else:
            values.append(_owned(_strip(o, trace), received, values))
            tans.append(np.zeros(tuple(batch_shape) + _shape(o), dtype=o.dtype))
    return tuple(values), tuple(tans), tuple(_strip(a, trace) for a in aux)
