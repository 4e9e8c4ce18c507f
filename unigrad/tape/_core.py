"""The tape's engine: traces, tracers, ``bind`` and the forward and backward sweeps.

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
"""

from __future__ import annotations

import contextvars

import numpy as np

_depth: contextvars.ContextVar[int] = contextvars.ContextVar("unigrad_tape_depth", default=0)


class LeakedTracerError(RuntimeError):
    """A traced value escaped the transform that created it and was used later."""


class Primitive:
    """One operation of the tape: its NumPy implementation and its derivative rules.

    ``vjps[i](g, ans, *args, **params)`` is the cotangent of argument i;
    ``jvps[i](t, ans, *args, **params)`` the tangent contribution of argument i.
    ``None`` as a rule means a zero derivative; ``vjps=None`` marks a
    primitive whose outputs are not differentiable (comparisons, argmax...).
    ``jvp_joint(tangents, ans, *args, **params)`` replaces the per-argument JVP
    rules where one formula is simpler (tangents hold None for constants).
    ``elementwise``: the namespace exports the primitive itself under ``name``;
    ``ufunc``: the NumPy ufunc it computes, which NumPy dispatches to it on traced values.
    """

    __slots__ = ("name", "impl", "vjps", "jvps", "jvp_joint", "broadcasts", "partial", "elementwise", "ufunc",
                 "__weakref__")

    def __init__(self, name, impl, vjps=(), jvps=(), *, jvp_joint=None, broadcasts=False, elementwise=False,
                 ufunc=None):
        self.name, self.impl = name, impl
        self.vjps, self.jvps, self.jvp_joint, self.broadcasts = vjps, jvps, jvp_joint, broadcasts
        self.partial = vjps is not None and None in vjps  # some arguments have a zero derivative
        self.elementwise, self.ufunc = elementwise, ufunc

    def __call__(self, *args, **params):
        top = None  # the highest-level trace among the arguments processes the call
        for a in args:
            if isinstance(a, Tracer):
                tr = a.trace
                if top is None or tr.level > top.level:
                    top = tr
        if top is None:
            return self.impl(*args, **params)
        return top.process(self, args, params)

    def __repr__(self):
        return f"<primitive {self.name}>"


def bind(prim: Primitive, args, params):
    """Apply ``prim``: the highest-level trace among the arguments processes it (see ``Primitive.__call__``)."""
    return prim(*args, **params)


class Trace:
    __slots__ = ("level", "active")

    def __init__(self):
        self.level = _depth.get() + 1
        self.active = True

    def _leaked(self, prim):
        raise LeakedTracerError(
            f"a traced value from a finished unigrad transform was passed to {prim.name}: values computed "
            f"inside f must not be kept and reused after the transform returns (return them instead)")


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
        level = self.level
        i = 0
        for a in args:
            if isinstance(a, Tracer):
                tr = a.trace
                if tr.level == level:
                    if tr is not self:
                        tr._leaked(prim)
                    a_value = vals[i] = a.value
                    parents.append((i, a.index))
                    if isinstance(a_value, Tracer):
                        nested = True
                else:
                    nested = True
            i += 1
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
            t_out = broadcast_to(t_out, want)
        return FTracer(self, ans, t_out)


def _align(t, x, ans):
    """Reshape a batched tangent of ``x`` so it broadcasts against ``ans``: (*batch, 1.., *x.shape)."""
    xnd, and_ = np.ndim(x) if not isinstance(x, Tracer) else x.ndim, _ndim(ans)
    if and_ <= xnd:
        return t
    nb = t.ndim - xnd
    shape = tuple(t.shape)
    return reshape(t, shape[:nb] + (1,) * (and_ - xnd) + shape[nb:])


def _ndim(x):
    return x.ndim if isinstance(x, Tracer) else np.ndim(x)


def _shape(x):
    return tuple(x.shape) if isinstance(x, Tracer) else np.shape(x)


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
        c = reduce_sum(c, axis=tuple(axes), keepdims=True)
    return reshape(c, cshape[:nb] + tuple(shape))


class Tracer:
    """A value being traced by one trace. Behaves like an array (operators, shape, dtype, .T)."""

    __slots__ = ("trace", "value")
    __array_ufunc__ = None  # make NumPy defer to our reflected operators
    __array_priority__ = 1000

    # The value is a NumPy array or scalar (or a lower-level tracer), which have these attributes;
    # a Python scalar does not.
    @property
    def shape(self):
        try:
            return self.value.shape
        except AttributeError:
            return np.shape(self.value)

    @property
    def dtype(self):
        try:
            return self.value.dtype
        except AttributeError:
            return np.result_type(self.value)

    @property
    def ndim(self):
        try:
            return self.value.ndim
        except AttributeError:
            return np.ndim(self.value)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def device(self):
        return "cpu"

    def __len__(self):
        s = self.shape
        if not s:
            raise TypeError("len() of a 0-d traced array")
        return s[0]

    def primal_value(self):
        """The concrete NumPy value under every level of tracing."""
        v = self.value
        while isinstance(v, Tracer):
            v = v.value
        return v

    def __bool__(self):
        # Kept: `if x > 0:` and `while err > tol:` are control flow on values, as in HIPS autograd and
        # eager JAX/torch; the branch taken is traced, and a comparison carries no derivative anyway.
        return bool(self.primal_value())

    # float(x), int(x), complex(x) and operator.index(x) would turn a traced value into a constant and
    # silently drop its derivative: they raise, as np.asarray(x) does.
    def __float__(self):
        raise _conversion_error("float")

    def __int__(self):
        raise _conversion_error("int")

    def __complex__(self):
        raise _conversion_error("complex")

    def __index__(self):
        raise _conversion_error("operator.index")

    def __repr__(self):
        return f"Traced<{type(self).__name__} level={self.trace.level}>({self.primal_value()!r})"

    def __hash__(self):
        return id(self)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "a traced array cannot be converted to a NumPy array inside a unigrad transform (that would drop "
            "its derivative); use unigrad.namespace(x) functions instead of np.* on traced values")


def _conversion_error(kind):
    return TypeError(
        f"{kind}() of a traced array inside a unigrad transform would drop its derivative; keep it an array "
        f"(x.sum(), xp.reshape(x, ()), x[0]...), or take its value as a constant explicitly with "
        f"unigrad.to_numpy(x). bool(x) and comparisons (if x > 0:) still work for control flow")


class RTracer(Tracer):
    __slots__ = ("index",)

    def __init__(self, trace, value, index):
        self.trace, self.value, self.index = trace, value, index


class FTracer(Tracer):
    __slots__ = ("tangent",)

    def __init__(self, trace, value, tangent):
        self.trace, self.value, self.tangent = trace, value, tangent


def zeros(shape, dtype):
    return np.zeros(shape, dtype=dtype)


def _lower(x, trace):
    """The value of ``x`` one level below ``trace`` (x itself if it is not traced by it)."""
    if isinstance(x, Tracer) and x.trace is trace:
        return x.value
    return x


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
            cts[pidx] = c if old is None else old + c
        if release:
            tape[idx] = None
    grads = []
    for i in range(n_inputs):
        v = input_values[i]
        g = cts.get(i)
        if g is None:
            g = np.zeros(tuple(batch_shape) + _shape(v), dtype=v.dtype)
        else:
            g = _owned(_like_dtype(g, v), cotangents, grads)
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
        c = real(c)
    if xd.kind in "fc" and c.dtype != xd:
        c = astype(c, dtype=np.dtype(xd))
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
    outs, aux = _run_traced(trace, f, [RTracer(trace, primals[i], i) for i in range(n)], has_aux)
    out_values, out_indices = [], []
    for o in outs:
        if isinstance(o, RTracer) and o.trace is trace:
            out_values.append(_owned(_strip(o, trace, kept), primals, out_values))
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


# These two are used by the engine itself; the rule table defines them (import cycle broken at the end).
from ._primitives import astype, broadcast_to, real, reduce_sum, reshape  # noqa: E402
