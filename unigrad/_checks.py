"""Argument checks and conversions: every user-facing error about inputs and outputs is written here.

Messages name the argument (``argument 1['w'][0]``), the expected and the actual shape or dtype,
and are the same on every backend.
"""

from __future__ import annotations

import numpy as np
import optree

from . import _registry
from ._dtypes import COMPLEX, INEXACT
from .backend import Backend

_PY_SCALARS = (bool, int, float, complex)
_MODES = ("auto", "rev", "fwd")


def convert(b: Backend, x, what: str):
    """``x`` as an array of backend ``b``, dtype kept (a Python float becomes float64)."""
    if b.is_array(x):
        return x
    if isinstance(x, (np.ndarray, np.generic)) or isinstance(x, _PY_SCALARS):
        return b.asarray(np.asarray(x))
    owner = _registry._array_owner(x)
    if owner is not None:  # another backend's array: zero-copy through DLPack where b takes it, else NumPy
        if b.accepts_dlpack and hasattr(x, "__dlpack__"):
            return b.asarray(x)
        return b.asarray(_registry.get_backend(owner).to_numpy(x))
    if isinstance(x, (list, tuple)):
        raise TypeError(f"{what} is a {type(x).__name__}; pass an array (np.asarray(...)) instead")
    if hasattr(x, "__array__"):
        return b.asarray(np.asarray(x))
    raise TypeError(f"{what} must be an array or a Python scalar; got {type(x).__name__}")


def leaf_names(tree, prefix: str) -> list[str]:
    """Readable names of the leaves of ``tree``: ``x``, ``argument 1['w'][0]``..."""
    paths, _, _ = optree.tree_flatten_with_path(tree)
    return [prefix + "".join(f"[{p!r}]" for p in path) for path in paths]


def arg_names(args_tuple, positions, word="argument") -> list[str]:
    """Leaf names of a tuple of arguments: ``argument 0``, ``argument 1['w'][0]``..."""
    paths, _, _ = optree.tree_flatten_with_path(tuple(args_tuple))
    return [f"{word} {positions[p[0]]}" + "".join(f"[{q!r}]" for q in p[1:]) for p in paths]


def check_like(b: Backend, value, reference, what, fname: str):
    """One policy for cotangents and tangents: the reference's shape exactly; a floating dtype
    (complex too for a complex reference) cast to the reference's dtype; anything else is an error.
    ``what`` names the value in messages (a string, or a function making it: names cost time)."""
    if type(value) is float:  # the common unit cotangent of a scalar output
        value = b.asarray(np.asarray(value))
    elif isinstance(value, _PY_SCALARS) and not isinstance(value, bool):
        value = np.asarray(value)
        if value.dtype.kind == "i":
            value = value.astype(np.float64)
    if not b.is_array(value):
        try:
            value = convert(b, value, _name(what))
        except TypeError as exc:
            raise TypeError(f"{fname}: {exc}") from None
    want_shape, got_shape = b.shape(reference), b.shape(value)
    want_dtype, got_dtype = b.dtype(reference), b.dtype(value)
    if got_shape != want_shape:
        raise ValueError(f"{fname}: {_name(what)} has shape {got_shape}; expected {want_shape} "
                         f"(the shape of the value it pairs with; it is never broadcast)")
    if got_dtype not in INEXACT or (got_dtype in COMPLEX and want_dtype not in COMPLEX):
        raise ValueError(f"{fname}: {_name(what)} has dtype {got_dtype}; expected {want_dtype} "
                         f"(a floating{' or complex' if want_dtype in COMPLEX else ''} dtype is cast to it)")
    if got_dtype != want_dtype:
        value = b.cast(value, want_dtype)
    if b.device(value) != b.device(reference):
        value = b.asarray(value, device=b.device(reference))
    return value


def _name(what) -> str:
    return what if isinstance(what, str) else what()


def normalize_argnums(argnums, nargs: int, fname: str):
    """``(single, argnums as a tuple of non-negative ints, the other positions)``; exact ints only."""
    single = type(argnums) is int or (isinstance(argnums, int) and not isinstance(argnums, bool))
    seq = (argnums,) if single else argnums
    if not isinstance(seq, (tuple, list)) or not seq or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in seq):
        raise TypeError(f"{fname}: argnums must be an int or a non-empty tuple of ints; got {argnums!r}")
    out = []
    for a in seq:
        if not -nargs <= a < nargs:
            raise ValueError(f"{fname}: argnums={argnums!r} is out of range for a function called with "
                             f"{nargs} positional argument{'s' if nargs != 1 else ''}")
        a = int(a) % nargs
        if a in out:
            raise ValueError(f"{fname}: argnums={argnums!r} repeats argument {a}")
        out.append(a)
    return single, tuple(out), tuple(i for i in range(nargs) if i not in out)


def check_output(b: Backend, o, k, fname):
    """An output leaf of ``f``: an array (a Python float is taken as a 0-d array) of a floating dtype."""
    if not b.is_array(o):
        if isinstance(o, (float, complex)) and not isinstance(o, bool):
            o = b.asarray(np.asarray(o))
        else:
            hint = ""
            if isinstance(o, (tuple, list, dict)):
                hint = " (does f return (output, aux)? then pass has_aux=True)"
            elif isinstance(o, np.ndarray) or _registry._array_owner(o) is not None:
                hint = (f" of another library than the {b.name} backend (did f call NumPy functions, or close "
                        f"over a NumPy array, on traced values? use xp = unigrad.namespace(x))")
            raise TypeError(f"{fname}: the function must return arrays (or a pytree of arrays); "
                            f"output leaf {k} is {type(o).__name__}{hint}")
    name = b.dtype(o)
    if name not in INEXACT:
        raise TypeError(f"{fname}: output leaf {k} has dtype {name}; only floating-point or complex outputs "
                        f"can be differentiated")
    return o


def scalar_check(b: Backend, outputs, fname):
    if len(outputs) != 1 or b.shape(outputs[0]) != ():
        shapes = [b.shape(o) for o in outputs]
        hint = (" (does f return (output, aux)? then pass has_aux=True)" if len(shapes) == 2 else "")
        raise TypeError(f"{fname} requires a function with one scalar (shape ()) output; got "
                        f"{'outputs of shapes ' + str(shapes) if len(shapes) != 1 else 'shape ' + str(shapes[0])}"
                        f"{hint}. Use vjp or jacobian for non-scalar outputs")
    if b.dtype(outputs[0]) in COMPLEX:
        raise TypeError(f"{fname} requires a real-valued output; got dtype {b.dtype(outputs[0])}. "
                        f"Use vjp with an explicit cotangent for complex outputs")


def batch_size(b: Backend, arrays, names_fn, fname, role, expected=None):
    """The common leading (batch) axis of ``arrays``; 0 when there are none."""
    sizes = set()
    for k, x in enumerate(arrays):
        shape = b.shape(x)
        if not shape:
            raise ValueError(f"{fname}: {names_fn()[k]} is 0-d; every {role} needs a leading batch axis")
        if expected is not None and shape[0] != expected:
            raise ValueError(f"{fname}: {names_fn()[k]} has batch size {shape[0]} (shape {shape}); expected "
                             f"{expected}, the inputs' batch size: f must map a batch to a batch")
        sizes.add(shape[0])
    if len(sizes) > 1:
        raise ValueError(f"{fname}: the inputs' leading (batch) axes differ: "
                         + ", ".join(f"{n} has {b.shape(x)[0]}" for n, x in zip(names_fn(), arrays)))
    return sizes.pop() if sizes else 0


def check_mode(mode, fname):
    if mode not in _MODES:
        raise ValueError(f"{fname}: mode must be one of {_MODES}; got {mode!r}")


def check_chunk(chunk_size, fname):
    if chunk_size is None:
        return
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool):
        raise TypeError(f"{fname}: chunk_size must be a positive int or None; got {type(chunk_size).__name__} "
                        f"{chunk_size!r}")
    if chunk_size < 1:
        raise ValueError(f"{fname}: chunk_size must be a positive int or None; got {chunk_size!r}")


# What each framework says when a traced value is turned into a NumPy array (np.sin(x) on a torch tensor
# that requires grad, np.asarray of a JAX tracer or of a symbolic TensorFlow tensor, the tape's own).
_NUMPY_CONVERSION = ("Can't call numpy() on Tensor that requires grad", "TracerArrayConversionError",
                     "The numpy conversion method __array__() was called on traced array",
                     "Cannot convert a symbolic", "numpy() is only available when eager execution",
                     "a traced array cannot be converted to a NumPy array", "does not support ufuncs",
                     "Cannot access storage of TensorWrapper", "NumPy cannot take a unigrad TensorFlow array")


def is_numpy_conversion(exc: BaseException) -> bool:
    """Did ``exc`` come from converting a traced value to a NumPy array (on any backend)?"""
    text = f"{type(exc).__name__}: {exc}"
    return any(s in text for s in _NUMPY_CONVERSION)


def numpy_conversion_error(exc: BaseException, fname: str) -> TypeError:
    """The error for ``f`` turning a traced value into a NumPy array: where SciPy's own code did it
    (``scipy.integrate.odeint(rhs, y0, t)`` on a traced ``y0``), it names that function and points to a
    custom rule or ``bridge``; else it points to the namespace's functions."""
    caller = _library_caller(exc, "scipy")
    if caller is not None:
        return TypeError(
            f"{fname}: {caller} (SciPy's own code) was called on a traced value; its result would be a constant "
            f"and the derivative silently lost. Give that computation a derivative with unigrad.custom_vjp or "
            f"unigrad.custom_jvp (an adjoint or implicit rule), or run it where it can be differentiated with "
            f"unigrad.bridge; SciPy's special functions have differentiable versions in unigrad.special "
            f"({type(exc).__name__}: {exc})")
    return TypeError(
        f"{fname}: f converted a traced value to NumPy (a NumPy function such as np.sin called on it, or "
        f"np.asarray); that would drop its derivative. Inside f use xp = unigrad.namespace(x) and xp.sin(x), "
        f"and arrays of the same backend ({type(exc).__name__}: {exc})")


def _library_caller(exc: BaseException, library: str):
    """``"scipy.integrate.odeint"``: the outermost function of ``library`` on the traceback of ``exc`` (its
    module path without private parts), or None."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module == library or module.startswith(library + "."):
            public = ".".join(part for part in module.split(".") if not part.startswith("_"))
            return f"{public}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return None


def promote(a: str, b: str) -> str:
    """The dtype two floating or complex dtype names promote to (the Array API's table; bfloat16 and
    float16 together give float32)."""
    if a == b:
        return a
    if "bfloat16" in (a, b):
        other = b if a == "bfloat16" else a
        if other == "float16":
            return "float32"
        return other if other in ("float32", "float64", "complex64", "complex128") else "bfloat16"
    return np.result_type(np.dtype(a), np.dtype(b)).name


def not_nestable(b: Backend, fname: str) -> NotImplementedError:
    """The error for a nested transform (hessian, hvp, a transform inside ``f``) on a backend that does not
    declare ``higher_order``: it would differentiate nothing and return zeros, never an answer."""
    return NotImplementedError(
        f"{fname}: the {b.name!r} backend does not nest transforms (capabilities.higher_order is False), so "
        f"second derivatives (hessian, hvp, a transform inside f) would silently be zeros; use a backend "
        f"that declares higher_order (numpy, torch, jax, tensorflow)")


# ---------------------------------------------------------------------------------------------
# Lazy (Dask) arguments of the in-memory transforms
# ---------------------------------------------------------------------------------------------

_LAZY_TRANSFORMS = ("batched_jacobian", "vmap", "per_example_grad")  # what unigrad.dask offers


def _is_lazy(x) -> bool:
    """A Dask collection (array, dataframe, delayed), recognised without importing dask."""
    return hasattr(type(x), "__dask_graph__")


_EAGER_TYPES = (np.ndarray, float, int, complex, bool, type(None))


def _reject_lazy(args, fname: str) -> None:
    """Raise TypeError if an argument of an in-memory transform is a Dask array (or any Dask collection).

    The in-memory transforms would pull it into memory whole (NumPy's ``__array__``) and return NumPy
    arrays: out of core data belongs to ``unigrad.dask``. Cheap on the common path: plain arrays are
    recognised by type, and only containers are flattened.

    Args:
      args: the positional arguments of the call (a tuple; pytrees are searched).
      fname: the transform's name, for the message (``"batched_jacobian"``, ``"vmap"``, ``"grad"``...).
    """
    for k, a in enumerate(args):
        if type(a) in _EAGER_TYPES:
            continue
        if _is_lazy(a):
            _lazy_error(fname, f"argument {k}", a)
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):  # not an array: maybe a container
            paths, leaves, _ = optree.tree_flatten_with_path(a, none_is_leaf=True)
            for path, leaf in zip(paths, leaves):
                if _is_lazy(leaf):
                    _lazy_error(fname, f"argument {k}" + "".join(f"[{p!r}]" for p in path), leaf)


def _lazy_error(fname, where, x):
    target = fname if fname in _LAZY_TRANSFORMS else ("per_example_grad" if fname in ("grad", "value_and_grad")
                                                  else None)
    use = (f"unigrad.dask.{target}(f, ...)" if target is not None
           else "unigrad.dask (batched_jacobian, vmap, per_example_grad)")
    raise TypeError(f"{fname}: {where} is a lazy {type(x).__module__}.{type(x).__name__} "
                    f"(shape {getattr(x, 'shape', '?')}); the in-memory transforms would pull it into memory whole. "
                    f"Use {use} to evaluate it block by block and get a Dask array back, "
                    f"or call .compute() on it first.")
