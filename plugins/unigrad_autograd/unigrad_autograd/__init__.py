"""``unigrad_autograd``: a unigrad backend over HIPS autograd, written from docs/plugins.md.

unigrad hands a backend *flat* functions (``f(*primals) -> tuple of arrays``) and flat tuples of
its own arrays; the core does pytrees, ``argnums``, ``has_aux``, conversions and every error.
So a backend is a handful of methods. autograd differentiates functions of one argument, so
each transform traces ``lambda primals: f(*primals)`` over the tuple of primals; autograd boxes
the tuple and unboxes the result, and its container rules give zeros for unused inputs.
Everything not defined here (Jacobians, batched Jacobians, hessian, hvp, vmap) is unigrad's
generic default, built from ``vjp`` and ``jvp``.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import numpy as np
from autograd.builtins import tuple as boxed_tuple
from autograd.core import make_jvp, make_vjp
from autograd.numpy.numpy_boxes import ArrayBox
from autograd.tracer import getval, trace_stack

import unigrad

from . import _linalg, _namespace, _rules

# xp.linalg: built from the namespace's functions, so _linalg imports _namespace and the package joins them
# here (the namespace importing _linalg back would make the two a circle of imports).
_namespace.linalg = _linalg

__all__ = ["AutogradBackend"]
__version__ = "0.1.0"

# autograd keeps one process-wide trace counter and increments it without try/finally: two threads
# tracing at once can hand a nested trace a lower level than its parent (wrong higher-order
# derivatives), and an exception inside f leaves the counter raised. One re-entrant lock makes
# this backend's transforms take turns (nested transforms re-enter it), and each transform puts
# the counter back as it found it.
_LOCK = threading.RLock()


@contextlib.contextmanager
def _autograd_turn():
    with _LOCK:
        level = trace_stack.top
        try:
            with warnings.catch_warnings():
                # autograd warns when an output does not depend on the input; unigrad's contract
                # says that is fine: the derivative is zeros.
                warnings.filterwarnings("ignore", message="Output seems independent of input")
                yield
        finally:
            trace_stack.top = level


def _split(f, has_aux, n_primals):
    """``f`` as autograd wants it (one argument: the primal, or the tuple of primals; one output: the
    output, or the boxed tuple of outputs), the list its aux values land in, and a list that holds True
    once ``f`` has run when its one output was returned alone. One primal and one output are passed as
    they are: autograd's tuple boxes cost about 50 us a pass (a third of a small ``f``'s JVP)."""
    aux_out, single = [], []

    def traced(primals):
        result = f(primals) if n_primals == 1 else f(*primals)
        outputs, aux = result if has_aux else (result, None)
        if has_aux:
            aux_out.append(tuple(getval(a) for a in aux))  # aux comes back detached
        single[:] = [len(outputs) == 1]
        return outputs[0] if single[0] else boxed_tuple(outputs)

    return traced, aux_out, single


def _packed(values, n):
    """The one value autograd takes for ``n`` of them (see :func:`_split`)."""
    return values[0] if n == 1 else tuple(values)


class AutogradBackend(unigrad.Backend):
    """HIPS autograd: reverse and forward mode over NumPy, to any order, CPU only."""

    # The name users select it by. unigrad's registry knows the backend by its entry-point name
    # (pyproject.toml); keep the two equal.
    name = "autograd"
    # ArrayBox lives in autograd.numpy.numpy_boxes: an ArrayBox passed in names this backend.
    array_modules = ("autograd",)
    capabilities = unigrad.Capabilities(forward_mode=True, vmap=False, compile=False, higher_order=True,
                                        complex=True, float64=True, custom_rules=True)

    def namespace(self):
        return _namespace

    def copy(self, x):
        return x.copy() if type(x) is np.ndarray else x  # a boxed (traced) value is not the caller's memory

    def version(self):
        from importlib.metadata import version

        return version("autograd")

    def asarray(self, x, dtype=None, device=None):
        _namespace._cpu(device)
        if isinstance(x, ArrayBox):
            return x if dtype is None else _namespace.astype(x, dtype)
        if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
            x = np.from_dlpack(x)  # another framework's CPU array, without a copy
        return np.asarray(x, dtype=dtype)

    def to_numpy(self, x):
        return np.asarray(getval(x))

    def is_array(self, x):
        # Inside a transform f sees ArrayBoxes; autograd's reductions return NumPy scalars.
        return isinstance(x, (np.ndarray, np.generic, ArrayBox))

    def devices(self):
        return ("cpu",)

    def device(self, x):
        # The generic default asks array_api_compat, which knows nothing of ArrayBox.
        return "cpu"

    def stop_gradient(self, x):
        return getval(x)

    def apply_rule(self, rule, arrays):
        """A ``primitive`` made for this call, whose ``defvjp``/``defjvp`` rules call the rule (``_rules``)."""
        return _rules.apply_rule(rule, arrays)

    def vjp(self, f, primals, *, has_aux=False):
        n = len(primals)
        traced, aux_out, single = _split(f, has_aux, n)
        with _autograd_turn():
            pullback, outputs = make_vjp(traced, _packed(primals, n))
        outputs = (outputs,) if single[0] else tuple(outputs)

        def vjp_fn(cotangents):
            # one cotangent per output in, one per primal out (autograd's zeros for unused primals)
            with _autograd_turn():
                grads = pullback(cotangents[0] if single[0] else tuple(cotangents))
            grads = (grads,) if n == 1 else grads
            return _owned(tuple(_like(g, p) for g, p in zip(grads, primals)), tuple(cotangents))

        return outputs, vjp_fn, (aux_out[0] if has_aux else None)

    def jvp(self, f, primals, tangents, *, has_aux=False):
        n = len(primals)
        traced, aux_out, single = _split(f, has_aux, n)
        with _autograd_turn():
            outputs, tangents_out = make_jvp(traced, _packed(primals, n))(_packed(tangents, n))
        if single[0]:
            outputs, tangents_out = (outputs,), (tangents_out,)
        tangents_out = tuple(_like(t, o) for t, o in zip(tangents_out, outputs))
        received = tuple(primals) + tuple(tangents)
        outputs = _owned(tuple(outputs), received)
        return outputs, _owned(tangents_out, received + outputs), (aux_out[0] if has_aux else None)


def _owned(results, received):
    """``results`` owned by the caller: a NumPy result that may share memory with an array the caller
    passed in or with an earlier result (autograd returns its input itself for an identity) is copied.
    A boxed value (a nested transform's) is left as it is."""
    out = []
    for r in results:
        if type(r) is np.ndarray and any(type(a) is np.ndarray and np.may_share_memory(r, a)
                                         for a in received + tuple(out)):
            r = r.copy()
        out.append(r)
    return tuple(out)


def _like(value, reference):
    """``value`` with ``reference``'s dtype: autograd's rules sometimes promote float32 to float64
    (and yield a real zero for a complex input that nothing used)."""
    want = _dtype(reference)
    if _dtype(value) == want:
        return value
    if np.iscomplexobj(getval(value)) and not np.issubdtype(want, np.complexfloating):
        value = _namespace.real(value)
    return value.astype(want) if hasattr(value, "astype") else np.asarray(value, dtype=want)


def _dtype(x):
    return np.result_type(getval(x))
