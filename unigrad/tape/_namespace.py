"""The Array API namespace of the tape: ``unigrad.namespace(x)`` for NumPy arrays and traced values.

This module only assembles: the standard's main functions from ``_functions`` (whose elementwise
functions are the rule table's rows themselves), composites (statistics, softmax, NumPy spellings)
from ``_composites``, the ``linalg`` extension from ``_linalg``, and NumPy's own functions on traced
values from ``_numpy_dispatch``. Importing it gives traced values their operators and methods.
On plain NumPy inputs every function returns what NumPy computes.

Functions whose results carry no derivative (``argsort``, ``argmax``, ``searchsorted``,
``nonzero``, ``unique_*``, ``count_nonzero``, ``all``, ``any``, comparisons) return plain NumPy
arrays even for traced inputs.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _composites as _C
from . import _fft as fft  # noqa: F401 -- the namespace's fft extension
from . import _linalg as linalg  # noqa: F401 -- the namespace's linalg extension
from . import _numpy_dispatch
from ._composites import *  # noqa: F401,F403
from ._tracer import Primitive, Tracer, concrete  # noqa: F401
from ._functions import *  # noqa: F401,F403
from ._functions import ELEMENTWISE, __array_api_version__, __array_namespace_info__  # noqa: F401
from ._tracer import _ndim, _shape  # noqa: F401 -- used by tests and tools
from ._functions import _arr, _axes, _axis1, _is_complex, _is_traced  # noqa: F401 -- likewise
from ._functions import (clip, getitem, matmul, matrix_transpose, max, min, permute_dims, prod, reshape,  # noqa: A004
                         squeeze, sum)

# -------------------------------------------------------------------- operators and methods of traced values


def _reflected(fn):
    if isinstance(fn, Primitive):
        return _binary(fn, reflected=True)
    return lambda self, other: fn(other, self)


def _binary(prim, reflected=False):
    """The operator method of a binary primitive: ``Primitive.__call__`` written out for two operands (the
    highest-level trace processes the call; the left operand's on a tie), one frame less per operator."""
    if reflected:
        def operator(self, other):
            top = self.trace
            if isinstance(other, Tracer):
                tr = other.trace
                if tr.level >= top.level:  # other is the left operand: it wins a tie
                    top = tr
            return top.process(prim, (other, self), {})
    else:
        def operator(self, other):
            top = self.trace
            if isinstance(other, Tracer):
                tr = other.trace
                if tr.level > top.level:
                    top = tr
            return top.process(prim, (self, other), {})
    operator.__name__ = operator.__qualname__ = prim.name
    return operator


def _method(fn):
    """``fn`` as a method: a primitive is a callable object, not a function, so Python would not bind it."""
    return lambda self, *args: fn(self, *args)


def _no_setitem(self, key, value):
    raise TypeError("traced arrays are immutable: instead of x[i] = v, build a new array, e.g. "
                    "xp.where(mask, v, x) or xp.concat([...]) (the tape records values, not memory)")


def _reshape_method(self, *shape, order="C"):
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        shape = shape[0]
    return _numpy_dispatch.reshape(self, shape, order=order)


def _transpose_method(self, *axes):
    if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
        axes = axes[0]
    return permute_dims(self, tuple(axes) if axes else tuple(range(self.ndim))[::-1])


def _namespace_of(self, api_version=None):
    return sys.modules[__name__]


def _install_operators():
    E = ELEMENTWISE
    for name, fn in {"__add__": E["add"], "__sub__": E["subtract"], "__mul__": E["multiply"],
                     "__truediv__": E["divide"], "__pow__": E["pow"], "__matmul__": matmul,
                     "__mod__": E["remainder"], "__floordiv__": E["floor_divide"], "__lt__": E["less"],
                     "__le__": E["less_equal"], "__gt__": E["greater"], "__ge__": E["greater_equal"],
                     "__eq__": E["equal"], "__ne__": E["not_equal"]}.items():
        setattr(Tracer, name, _binary(fn) if isinstance(fn, Primitive) else _method(fn))
    for name, fn in [("__radd__", E["add"]), ("__rsub__", E["subtract"]), ("__rmul__", E["multiply"]),
                     ("__rtruediv__", E["divide"]), ("__rpow__", E["pow"]), ("__rmatmul__", matmul),
                     ("__rmod__", E["remainder"]), ("__rfloordiv__", E["floor_divide"])]:
        setattr(Tracer, name, _reflected(fn))
    Tracer.__neg__ = _method(E["negative"])
    Tracer.__pos__ = lambda self: self
    Tracer.__abs__ = _method(E["abs"])
    Tracer.__getitem__ = getitem
    Tracer.__setitem__ = _no_setitem
    Tracer.__hash__ = object.__hash__
    Tracer.__array_namespace__ = _namespace_of
    Tracer.T = property(lambda self: permute_dims(self, tuple(range(self.ndim))[::-1]))
    Tracer.mT = property(matrix_transpose)
    Tracer.real = property(E["real"])
    Tracer.imag = property(E["imag"])
    Tracer.conj = Tracer.conjugate = _method(E["conj"])
    Tracer.sum = lambda self, axis=None, dtype=None, keepdims=False: sum(self, axis=axis, dtype=dtype,
                                                                         keepdims=keepdims)
    Tracer.prod = lambda self, axis=None, dtype=None, keepdims=False: prod(self, axis=axis, dtype=dtype,
                                                                           keepdims=keepdims)
    Tracer.mean = lambda self, axis=None, keepdims=False: _C.mean(self, axis=axis, keepdims=keepdims)
    Tracer.var = lambda self, axis=None, ddof=0, keepdims=False: _C.var(self, axis=axis, correction=ddof,
                                                                        keepdims=keepdims)
    Tracer.std = lambda self, axis=None, ddof=0, keepdims=False: _C.std(self, axis=axis, correction=ddof,
                                                                        keepdims=keepdims)
    Tracer.max = lambda self, axis=None, keepdims=False: max(self, axis=axis, keepdims=keepdims)
    Tracer.min = lambda self, axis=None, keepdims=False: min(self, axis=axis, keepdims=keepdims)
    Tracer.cumsum = lambda self, axis=None: _C.cumsum(self, axis=axis)
    Tracer.cumprod = lambda self, axis=None: _C.cumprod(self, axis=axis)
    Tracer.clip = lambda self, min=None, max=None: clip(self, min, max)  # noqa: A002
    Tracer.dot = lambda self, other: _C.dot(self, other)
    Tracer.reshape = _reshape_method
    Tracer.transpose = _transpose_method
    Tracer.swapaxes = lambda self, axis1, axis2: _C.swapaxes(self, axis1, axis2)
    Tracer.squeeze = lambda self, axis=None: squeeze(self, axis)
    Tracer.flatten = Tracer.ravel = lambda self, order="C": _numpy_dispatch.ravel(self, order=order)
    Tracer.astype = lambda self, dtype, copy=True: astype(self, dtype)  # noqa: F405
    Tracer.copy = lambda self: self  # traced values are immutable
    Tracer.__array_ufunc__ = _numpy_dispatch.array_ufunc
    Tracer.__array_function__ = _numpy_dispatch.array_function


_install_operators()
