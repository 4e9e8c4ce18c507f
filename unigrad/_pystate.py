"""The Python state a function reads, as a fingerprint: what an *eager* call that runs a program traced
once per signature must check before it reuses that program.

Eager TensorFlow computes ``batched_jacobian``, ``sparse_jacobian`` and per-example gradients with
``pfor``, which traces a program on every call (a second or more, and "retracing" warnings). unigrad
traces it once per signature instead. A trace reads ``f``'s Python values once: a global, a closed-over
NumPy array or a number in a dict that changes between eager calls would be frozen in the program, and
the next eager call would return the old numbers, where the user asked for eager semantics
(``compile=False``). :func:`python_state` is the part of the key that changes with those values: the
contents of ``f``'s closure cells, defaults and the globals its code names (in the functions it
calls too, as far as they are reachable), with arrays read by value (a digest of their bytes) and
containers, plain objects and user-defined classes walked to a bounded depth. A class is read as an
instance is: the attributes in its own ``__dict__`` and those of the bases the user defined
(``Cfg.scale = 2.0`` between calls is a change; an instance's class is read with it), never
``builtins``', the standard library's or a framework's classes (:func:`_user_class`), whose ids stand
for them. Variables (``tf.Variable``) are read when the
program runs and need no entry. What it cannot see (state behind a C extension, a file, an object
graph deeper than the bound) is the contract of ``compile=True`` (docs/transforms.md).
"""

from __future__ import annotations

import collections
import collections.abc
import hashlib
import sys
import types
import weakref

import numpy as np

__all__ = ["digest", "fingerprint", "python_state"]

#: How deep containers, objects and called functions are followed, and how many values at most.
DEPTH, BUDGET = 4, 2048

_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_OPAQUE = (types.ModuleType, type, types.BuiltinFunctionType, types.MethodWrapperType)
#: Packages whose classes are read by id only: their class attributes are code and constants, not the
#: user's state (and walking them would spend the budget); the standard library's are too.
_LIBRARIES = frozenset({
    "builtins", "numpy", "scipy", "jax", "jaxlib", "flax", "optax", "equinox", "haiku", "tensorflow", "keras",
    "tf_keras", "torch", "torchvision", "functorch", "mlx", "autograd", "dask", "distributed", "pandas",
    "sklearn", "unigrad", "typing_extensions",
}) | frozenset(sys.stdlib_module_names)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (or type()), not a C type


def _user_class(cls) -> bool:
    """Whether ``cls`` is a class the user defined: a Python class statement's, outside
    :data:`_LIBRARIES` and outside unigrad's own plugin packages (``unigrad_*``)."""
    if not cls.__flags__ & _HEAPTYPE:
        return False
    package = (getattr(cls, "__module__", None) or "builtins").partition(".")[0]
    return package not in _LIBRARIES and not package.startswith("unigrad_")


def digest(a) -> tuple:
    """An array's value as a hashable tuple: its shape, dtype and the 20-byte SHA-1 digest of its bytes
    (hashed in place, no copy of a contiguous array; SHA-1 runs at about twice BLAKE2b's speed on CPUs
    with SHA instructions, and a key needs no resistance to a chosen collision)."""
    a = np.ascontiguousarray(a)
    data = a.data if a.dtype.kind != "O" and a.size else a.tobytes()
    return a.shape, a.dtype.str, hashlib.sha1(data, usedforsecurity=False).digest()


def python_state(f) -> tuple:
    """A hashable fingerprint of the Python values ``f`` reads (see the module docstring): equal
    fingerprints, equal values, as far as the walk reaches.

    Example:
      >>> scale = [2.0]
      >>> f = lambda x: x * scale[0]
      >>> before = python_state(f); scale[0] = 3.0
      >>> python_state(f) == before
      False
    """
    walk = _Walk()
    return tuple(walk.value(f, DEPTH))


class _Walk:
    __slots__ = ("out", "seen", "left")

    def __init__(self):
        self.out, self.seen, self.left = [], set(), BUDGET

    def value(self, x, depth):
        self.left -= 1
        out = self.out
        t = type(x)
        if t in _SCALARS:
            out.append((t, x.hex() if t is float else x))
            return out
        if isinstance(x, np.ndarray) or isinstance(x, np.generic):
            out.append(digest(x))
            return out
        if isinstance(x, type) and _user_class(x):
            if self.left <= 0 or depth <= 0 or id(x) in self.seen:
                out.append((t, id(x)))
            else:
                self.klass(x, depth)
            return out
        if self.left <= 0 or depth <= 0 or isinstance(x, _OPAQUE) or id(x) in self.seen:
            out.append((t, id(x)))  # the object itself (its contents are out of reach)
            return out
        self.seen.add(id(x))
        if t is types.FunctionType:  # (the commonest object met: before the ABC checks below)
            self.function(x, depth)
        elif isinstance(x, (tuple, list, set, frozenset, collections.deque)):  # (namedtuples, subclasses too)
            out.append((t, len(x)))
            for item in (sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x):
                self.value(item, depth - 1)
        elif isinstance(x, collections.abc.Mapping):  # dict, OrderedDict, defaultdict, mappingproxy...
            out.append((t, len(x)))
            for k, v in x.items():
                self.value(k, depth - 1)
                self.value(v, depth - 1)
        elif isinstance(x, (bytearray, memoryview)):
            out.append((t, bytes(x)))
        elif isinstance(x, types.FunctionType):
            self.function(x, depth)
        elif isinstance(x, types.MethodType):
            self.value(x.__self__, depth - 1)
            self.function(x.__func__, depth)
        elif isinstance(x, (classmethod, staticmethod)):  # (in a class's __dict__)
            out.append((t,))
            self.value(x.__func__, depth)
        elif isinstance(x, property):
            out.append((t,))
            for accessor in (x.fget, x.fset, x.fdel):
                self.value(accessor, depth - 1)
        elif t.__name__ == "partial" and hasattr(x, "func"):
            self.value(x.func, depth - 1)
            self.value(x.args, depth - 1)
            self.value(x.keywords, depth - 1)
        else:
            self.array_or_object(x, t, depth)
        return out

    def array_or_object(self, x, t, depth):
        module = t.__module__ or ""
        name = t.__name__
        if "Variable" in name:  # read when the program runs: its identity is enough
            self.out.append((t, id(x)))
            return
        if module.startswith(("jax", "tensorflow", "torch")) and hasattr(x, "shape"):
            try:  # a framework's array, closed over: its value
                self.value(np.asarray(x), depth)
            except Exception:  # (a torch tensor that requires grad)
                self.out.append((t, id(x)))
            return
        attributes = getattr(x, "__dict__", None)
        self.out.append((t, id(x)))
        if _user_class(t) and id(t) not in self.seen:  # its class attributes (read through x: x.scale)
            self.klass(t, depth - 1)
        if isinstance(attributes, dict):
            self.value(attributes, depth - 1)
        for name in getattr(t, "__slots__", ()):
            if isinstance(name, str) and hasattr(x, name):
                self.value(getattr(x, name), depth - 1)
        call = getattr(t, "__call__", None)
        if isinstance(call, types.FunctionType):
            self.function(call, depth - 1)

    def klass(self, cls, depth):
        """A user-defined class (:func:`_user_class`): its own attributes and its user-defined bases'.
        A class is a namespace, as a module's globals are: its attributes are read at the class's own
        depth (``Cfg.table["k"]`` as deep as ``TABLE["k"]``), except classes, one level down (a chain of
        classes ends at the depth bound); dunder entries (``__module__``, ``__doc__``, ``__init__``...)
        are left out. Each class is read once per walk (cycles), within the walk's budget."""
        for c in cls.__mro__:
            if c is not cls and (not _user_class(c) or id(c) in self.seen):
                continue
            self.seen.add(id(c))
            self.out.append((type, id(c)))
            if self.left <= 0:
                continue
            entries = vars(c)
            self.out.append(len(entries))
            for name, v in entries.items():
                if name[:2] == "__" == name[-2:]:
                    continue
                self.value(name, 0)
                self.value(v, depth - 1 if isinstance(v, type) else depth)

    def function(self, fn, depth):
        code = fn.__code__
        self.out.append((code,))
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents, depth - 1)
            except ValueError:  # an empty cell (a name assigned later)
                self.out.append(("empty",))
        self.value(fn.__defaults__, depth - 1)
        self.value(fn.__kwdefaults__, depth - 1)
        env = fn.__globals__
        for name in _global_names(code):
            if name in env:
                self.value(name, 0)
                self.value(env[name], depth - 1)


_NAMES: dict = {}  # code object -> the global names it and its nested code objects read


def _global_names(code):
    names = _NAMES.get(code)
    if names is None:
        found, stack = [], [code]
        while stack:
            c = stack.pop()
            found.extend(c.co_names)
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        names = _NAMES[code] = tuple(dict.fromkeys(found))
        if len(_NAMES) > 4096:
            _NAMES.clear()
    return names


_DIGESTS: dict = {}  # id of an immutable array (JAX's, TensorFlow's eager tensors) -> (weak reference, digest)


def fingerprint(b, arrays):
    """The values of ``arrays`` (arrays of backend ``b``) as a hashable tuple: each array's :func:`digest`;
    None when one has no value to read (a tracer of an enclosing ``jax.jit``). Arrays that cannot change
    (JAX arrays, TensorFlow eager tensors) are read once: their digest is kept while they live, so
    weights passed again on every call cost a lookup."""
    parts = []
    for x in arrays:
        t = type(x)
        immutable = (t.__name__ == "ArrayImpl" and t.__module__.startswith("jax")) or t.__name__ == "EagerTensor"
        if immutable:
            hit = _DIGESTS.get(id(x))
            if hit is not None and hit[0]() is x:
                parts.append(hit[1])
                continue
        try:
            value = digest(b.to_numpy(x))
        except Exception:  # an abstract value (inside another framework's transform): nothing to key on
            return None
        if immutable and len(_DIGESTS) < 4096:
            try:
                ref = weakref.ref(x, lambda _, k=id(x): _DIGESTS.pop(k, None))
            except TypeError:
                pass
            else:
                _DIGESTS[id(x)] = (ref, value)
        parts.append(value)
    return tuple(parts)
