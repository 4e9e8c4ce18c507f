"""JAX's scoped 64-bit mode for a computation: one floor under the adapter (``__init__``) and its proof
modules, which all need it.

The rule (the adapter's module docstring): a computation runs under ``jax.enable_x64`` where one of its
floating or complex arrays, or an array ``f`` closes over, is 64-bit; JAX's global setting is never changed.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np

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


def _x64_dtypes(*dtypes):
    """The scoped x64 context when one of ``dtypes`` (NumPy dtypes) is 64-bit, integers too: conversions
    keep dtypes."""
    if not jax.config.jax_enable_x64:
        for d in dtypes:
            if d.char in _WIDE_CHARS:
                return jax.enable_x64(True)
    return _NO_CONTEXT
