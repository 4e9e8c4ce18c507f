"""Traced values and primitives: the vocabulary the rule table and the engine share.

A :class:`Primitive` is one operation of the tape (its NumPy implementation and its derivative
rules); calling it finds the highest-level tracer among its arguments and lets that tracer's trace
process the call (``_core`` holds the traces and the sweeps). A :class:`Tracer` is a value being
traced: it behaves like an array (``_namespace`` gives it its operators and methods).
:func:`concrete` is the NumPy value under every level of tracing.
"""

from __future__ import annotations

import contextvars

import numpy as np

_depth: contextvars.ContextVar[int] = contextvars.ContextVar("unigrad_tape_depth", default=0)


class LeakedTracerError(RuntimeError):
    """A traced value escaped the transform that created it and was used later."""


PRIMITIVES: dict = {}  # name -> Primitive, filled by the rule table at import (the engine looks up its few here)


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
    ``slope``: for a unary elementwise primitive whose VJP is ``g * slope(ans, x)``, that ``slope``:
    the sweep multiplies by it itself (in the cotangent's memory when nothing else holds it). None
    while ``vjps`` is not the rule it was made with (a test's monkeypatch).
    ``twin``: the same primitive with a slope that reads ``x`` where this one reads ``ans``; the reverse
    tape records an application to one of the trace's inputs (held anyway) with the twin, so the result
    need not be kept (None: no such form).
    """

    __slots__ = ("name", "impl", "vjps", "jvps", "jvp_joint", "broadcasts", "partial", "elementwise", "ufunc",
                 "keeps", "drops", "slope", "twin", "_given", "__weakref__")

    def __init__(self, name, impl, vjps=(), jvps=(), *, jvp_joint=None, broadcasts=False, elementwise=False,
                 ufunc=None, keeps=None, slope=None):
        self.name, self.impl = name, impl
        self.slope, self.twin = None, None
        self.vjps, self.jvps, self.jvp_joint, self.broadcasts = vjps, jvps, jvp_joint, broadcasts
        self.partial = vjps is not None and None in vjps  # some arguments have a zero derivative
        self.elementwise, self.ufunc = elementwise, ufunc
        # which of (ans, arg0, arg1, ...) the VJP rules read the values of (None: all); the reverse tape
        # keeps only those and a Shell (shape and dtype) of the others, so unneeded intermediates are freed
        self._given = (vjps, keeps, slope)  # the rules, what they were said to read, their slope
        self.keeps = vjp_reads(vjps) if keeps is None else tuple(keeps)
        self.slope = slope

    def __setattr__(self, name, value):
        if name == "vjps" and hasattr(self, "keeps"):  # new rules (a test's monkeypatch): read them again
            rules, given, slope = self._given
            self.keeps = tuple(given) if value is rules and given is not None else vjp_reads(value)
            object.__setattr__(self, "slope", slope if value is rules else None)
        object.__setattr__(self, name, value)
        if name == "keeps":  # the engine's form: None, or (drop ans?, indices of the args not read)
            object.__setattr__(self, "drops", None if value is None or all(value) else
                               (not value[0], tuple(i - 1 for i in range(1, len(value)) if not value[i])))

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


_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_FAST_LOAD_FAST", "LOAD_CLOSURE",
                    "LOAD_DEREF", "DELETE_FAST"})


def reads(fn, first=0):
    """Which positional parameters of ``fn``, from the ``first``-th on, its body reads: a tuple of bools
    (positions past the tuple count as read), or None when that cannot be told (not a plain function,
    ``*args`` read, ``locals()``/``vars()`` called). Read means named at all, passed on to a helper
    included: a conservative answer, from the bytecode."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    import dis
    names = code.co_varnames[:code.co_argcount]
    used = set(code.co_cellvars)  # captured by an inner function
    for ins in dis.get_instructions(code):
        if ins.opname in _LOADS:
            arg = ins.argval
            used.update(arg if isinstance(arg, tuple) else (arg,))
        elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in ("locals", "vars", "eval", "exec"):
            return None
    if code.co_flags & 0x04 and code.co_varnames[code.co_argcount + code.co_kwonlyargcount] in used:
        return None  # reads *args: every position past the named ones
    return tuple(n in used for n in names[first:])


def vjp_reads(vjps):
    """The union of ``reads`` over a primitive's VJP rules ``rule(g, ans, *args, **params)``, for
    (ans, arg0, arg1, ...); None (keep every value) when any rule cannot be read."""
    rules = [r for r in vjps or () if r is not None]
    if not rules:
        return None
    got = [reads(rule, first=1) for rule in rules]
    if any(r is None for r in got):
        return None
    n = max(len(r) for r in got)  # past a rule's named positions: read
    out = tuple(any(r[i] if i < len(r) else True for r in got) for i in range(n))
    return None if all(out) else out


class Shell:
    """What the reverse tape keeps of a value no VJP rule reads: its shape and dtype (the sweep
    unbroadcasts and casts with them). Anything else fails loudly rather than computing with it."""

    __slots__ = ("shape", "dtype", "ndim", "size")
    __array_ufunc__ = None

    def __init__(self, a):
        self.shape, self.dtype, self.ndim, self.size = a.shape, a.dtype, a.ndim, a.size

    def __array__(self, dtype=None, copy=None):
        raise TypeError("internal error: a VJP rule read a value the tape did not keep (Primitive.keeps)")

    def __repr__(self):
        return f"Shell(shape={self.shape}, dtype={self.dtype})"


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


def concrete(x):
    """The NumPy value of ``x`` under every level of tracing (``x`` itself when it is not traced)."""
    while isinstance(x, Tracer):
        x = x.value
    return x


def _ndim(x):
    return x.ndim if isinstance(x, Tracer) else np.ndim(x)


def _shape(x):
    return tuple(x.shape) if isinstance(x, Tracer) else np.shape(x)


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

    def __bool__(self):
        # Kept: `if x > 0:` and `while err > tol:` are control flow on values, as in HIPS autograd and
        # eager JAX/torch; the branch taken is traced, and a comparison carries no derivative anyway.
        return bool(concrete(self))

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
        return f"Traced<{type(self).__name__} level={self.trace.level}>({concrete(self)!r})"

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
