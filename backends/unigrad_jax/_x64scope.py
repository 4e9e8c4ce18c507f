"""JAX's scoped 64-bit mode for a computation: one floor under the adapter (``__init__``) and its proof
modules, which all need it.

The rule (the adapter's module docstring): a computation runs under ``jax.enable_x64`` where one of its
floating or complex arrays, or an array ``f`` closes over, is 64-bit; JAX's global setting is never changed.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np

from unigrad.backend import numpy_copies

# Dtypes JAX truncates to 32 bits outside the x64 context, by type code (hashing a dtype costs more
# than the rest of the test; two codes can name one dtype, e.g. 'l' and 'q' for int64 on Linux).
# _WIDE_CHARS: every 64-bit dtype (conversions keep them all); _WIDE_FLOAT_CHARS: the floating and
# complex ones, which alone decide the precision of a computation (see the module docstring).
_WIDE = frozenset(np.dtype(n) for n in ("float64", "complex128", "int64", "uint64"))
_WIDE_CHARS = frozenset(c for c in np.typecodes["All"] if np.dtype(c) in _WIDE)
_WIDE_FLOAT_CHARS = frozenset(c for c in _WIDE_CHARS if np.dtype(c).kind in "fc")
_NO_CONTEXT = contextlib.nullcontext()


def _wide(arrays, chars=_WIDE_FLOAT_CHARS) -> bool:
    """Is some array in ``arrays`` of a dtype in ``chars`` (default: float64 or complex128)?"""
    for a in arrays:
        d = getattr(a, "dtype", None)
        if d is not None and getattr(d, "char", None) in chars:
            return True
    return False


def _x64(f, *groups):
    """The scoped x64 context for a computation of flat ``f`` on the arrays in ``groups``: when some
    floating or complex array among them or among the arrays ``f`` closes over (``f.closure_arrays``,
    set by the core) is 64-bit, and x64 is not on already. ``f`` may be None."""
    if not jax.config.jax_enable_x64:  # reads the thread-local value first, so nesting is free
        if f is not None and _wide(getattr(f, "closure_arrays", ())):
            return jax.enable_x64(True)
        for group in groups:
            if _wide(group):
                return jax.enable_x64(True)
    return _NO_CONTEXT


def _thread_local_x64():
    """JAX's ``jax_enable_x64`` state object where it is the one ``jax.enable_x64(True)`` sets, by
    ``swap_local`` / ``set_local`` with no hook to run (jax 0.10): then :func:`in_x64` enters the same
    thread-local scope without the context manager's Python layers (about 3 us of a 15 us compiled call,
    measured). None where this JAX is laid out otherwise: the public context manager then."""
    try:
        from jax._src import config as _config

        state = _config.enable_x64
        if (getattr(state, "_update_thread_local_hook", True) is None and callable(getattr(state, "swap_local", None))
                and callable(getattr(state, "set_local", None))):
            return state
    except Exception:  # pragma: no cover - another JAX's internals
        pass
    return None


_X64_STATE = _thread_local_x64()


def copying(fn, copies, x64):
    """``fn`` called with a copy of its arguments at positions ``copies`` (NumPy arrays the caller owns,
    ``unigrad.backend.numpy_copies``), inside the scoped x64 mode where ``x64``; the common case (one float64
    NumPy array first) in one Python frame between a compiled repeat and its program."""
    copied = numpy_copies(fn, copies)
    if not x64:
        return copied
    state = _X64_STATE
    if state is None or copies != (0,):
        def in_scope(*args):
            return in_x64(copied, args)
        return in_scope
    swap, restore = state.swap_local, state.set_local

    def copy_first_x64(x, *rest):
        prev = swap(True)
        try:
            return fn(x.copy(), *rest)
        finally:
            restore(prev)
    return copy_first_x64


def in_x64(fn, args):
    """``fn(*args)`` inside the scoped, thread-local x64 mode (what ``with jax.enable_x64(True)`` does; the
    previous thread-local value is back afterwards, on an error too). The compiled hot path's scope."""
    state = _X64_STATE
    if state is None:
        with jax.enable_x64(True):
            return fn(*args)
    prev = state.swap_local(True)
    try:
        return fn(*args)
    finally:
        state.set_local(prev)


def _x64_dtypes(*dtypes):
    """The scoped x64 context when one of ``dtypes`` (NumPy dtypes) is 64-bit, integers too: conversions
    keep dtypes."""
    if not jax.config.jax_enable_x64:
        for d in dtypes:
            if d.char in _WIDE_CHARS:
                return jax.enable_x64(True)
    return _NO_CONTEXT
