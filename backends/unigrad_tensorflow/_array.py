"""The arrays of TensorFlow's Array API namespace: ``tf.Tensor`` with the Array API's operators.

A ``tf.Tensor``'s own operators are TensorFlow's: ``@`` needs 2-D operands, mixed dtypes raise
instead of promoting, ``x[int_array]`` raises, there is no ``.T``/``.mT``/``.size`` and ``.shape`` is
a ``TensorShape``. TensorFlow can change that only process-wide (``experimental_enable_numpy_behavior``),
which unigrad never does. So the adapter hands ``f`` :class:`Array` -- a thin view holding one
``tf.Tensor`` -- and takes the tensor back out of whatever ``f`` returns:

* operators, indexing and attributes follow the Array API standard (they are the namespace's
  functions), and every result is again an :class:`Array`;
* TensorFlow's own functions take it as the tensor it holds (``__tf_tensor__``: ``tf.nn.relu(x)``
  works and returns a plain ``tf.Tensor``);
* ``tf.Tensor`` on the left of an arithmetic operator (``W @ x`` with a captured ``W``): TensorFlow
  tries its own operator first and calls the right operand's reflected operator only when converting
  that operand raises ``TypeError``. Conversion from inside a ``tf.Tensor`` operator therefore raises
  ``TypeError``, and the Array API operator runs. (Comparisons of a ``tf.Tensor`` with an ``Array``
  have no such fallback in TensorFlow: they are TensorFlow's, on the held tensor.)
* GradientTape, ForwardAccumulator, tf.function and vectorized_map only ever see the tensors: the
  adapter wraps after it has set them up and unwraps before it hands results back.

The namespace's functions take :class:`Array` s and plain tensors anywhere and return :class:`Array` s
wherever they are called, so a portable function means the same inside a transform and outside it.
What leaves unigrad is TensorFlow's own: the transforms (and ``unigrad.evaluate``) return plain tensors,
and ``unigrad.to_native(x)`` or ``tf.convert_to_tensor(x)`` give the tensor an :class:`Array` holds.
While ``f`` runs (``inside()``), NumPy and DLPack refuse an :class:`Array` (the derivative would be lost);
outside, they read its values.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import types

import numpy as np
import tensorflow as tf
from unigrad.backend import TracedValueError

from . import _namespace as _raw
from ._tensors import TensorHolder

__all__ = ["Array"]

# Set (True) while the adapter evaluates the user's ``f``; reset inside the adapter's own transforms.
_INSIDE = contextvars.ContextVar("unigrad_tensorflow_inside_f", default=False)


def inside():
    return _INSIDE.get()


_OPERAND_TYPES = (tf.Tensor, tf.Variable, bool, int, float, complex)


def _operator_codes():
    """The code objects of TensorFlow's binary-operator wrapper (``tf.Tensor.__add__`` and the rest)."""
    codes = set()
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor"):
        method = getattr(tf.Tensor, f"__{name}__", None)
        try:
            code = inspect.unwrap(method).__code__
        except (AttributeError, ValueError, TypeError):
            continue
        codes.add(code)
    return frozenset(codes)


_TF_OPERATOR_CODES = _operator_codes()
_FRAMES = 24  # how far up a conversion looks for TensorFlow's operator wrapper


def _from_tf_operator():
    frame = sys._getframe(2)
    for _ in range(_FRAMES):
        if frame is None:
            return False
        if frame.f_code in _TF_OPERATOR_CODES:
            return True
        frame = frame.f_back
    return False


def plain(x):
    """The tensor an :class:`Array` (or a :class:`WeakScalar`) holds (anything else as it is)."""
    return x._t if type(x) is Array or type(x) is WeakScalar else x


def wrap(x):
    """``x`` as an :class:`Array` when it is a ``tf.Tensor`` (Variables are read)."""
    if isinstance(x, tf.Tensor):
        return Array(x)
    if isinstance(x, tf.Variable):
        return Array(tf.convert_to_tensor(x))
    return x


def _operand(other):
    if type(other) is Array:
        return other._t
    if isinstance(other, _OPERAND_TYPES):
        return other
    mod = type(other).__module__.partition(".")[0]
    if mod == "numpy":
        return other
    return NotImplemented


class _Deferred(TypeError):
    """Raised by a conversion inside a ``tf.Tensor`` operator, so that TensorFlow calls our reflected one.

    TensorFlow re-raises this very exception when the reflected operator fails too: the reflected
    operator then writes its own error into it."""


# The conversion error TensorFlow may re-raise, while its reflected operator runs.
_DEFERRED = contextvars.ContextVar("unigrad_tensorflow_deferred", default=None)


def _binary(fname, reflected=False):
    def op(self, other):
        if type(other) is WeakScalar:  # a Python float of a compiled program: it takes this array's dtype
            other = other._against(self._t.dtype)
        other = _operand(other)
        if other is NotImplemented:
            return NotImplemented
        fn = getattr(_raw, fname)
        try:
            return Array(fn(other, self._t) if reflected else fn(self._t, other))
        except tf.errors.OpError as exc:  # never a raw TensorFlow error from an operator
            raise ValueError(f"{'reflected ' if reflected else ''}operator {fname} of unigrad TensorFlow arrays: "
                             f"{exc.message}") from None
        except (TypeError, ValueError) as exc:
            deferred = _DEFERRED.get() if reflected else None
            if deferred is not None:  # TensorFlow will raise the deferral: make it say what went wrong
                deferred.args = (f"{fname} of a tf.Tensor and a unigrad TensorFlow array: {exc}",)
            raise
    op.__name__ = f"__{'r' if reflected else ''}{fname}__"
    return op


class Array(TensorHolder):
    """A ``tf.Tensor`` with the Array API standard's operators and attributes (see the module docstring).

    ``tf.convert_to_tensor(x)`` (or any TensorFlow function) gives the tensor it holds.
    """

    __slots__ = ()
    __array_ufunc__ = None  # NumPy defers: ndarray + Array runs Array.__radd__
    __hash__ = None

    def __init__(self, tensor):
        self._t = tensor

    # ------------------------------------------------------------ TensorFlow and NumPy interop
    def __tf_tensor__(self, dtype=None, name=None):
        if _from_tf_operator():
            # tf.Tensor's operator then calls ours, reflected (TensorFlow's documented fallback)
            deferred = _Deferred("a tf.Tensor operator met a unigrad TensorFlow array: its reflected operator "
                                 "implements the operation")
            _DEFERRED.set(deferred)
            raise deferred
        return self._t.__tf_tensor__(dtype, name)

    def __array__(self, dtype=None, copy=None):
        if not _INSIDE.get():  # outside a transform: the values (np.asarray, printing, tests)
            value = self._scalar_or_array()
            return value if dtype is None else value.astype(dtype)
        raise TypeError(
            "NumPy cannot take a unigrad TensorFlow array inside a transform (np.asarray, np.median...): the "
            "result would be a constant and its derivative silently lost. Use the Array API namespace, "
            "xp = unigrad.namespace(x) (xp.median is not in the standard: xp.sort and indexing, or tfp)")

    def __dlpack__(self, /, *, stream=None, max_version=None, dl_device=None, copy=None):
        if not _INSIDE.get():
            if stream is not None and self.device == "cpu":
                raise ValueError("__dlpack__: stream must be None for an array on the CPU")
            return tf.experimental.dlpack.to_dlpack(self._t)
        # as torch refuses to export a tensor that requires grad: the importer would hold a constant and the
        # derivative would be silently lost (the arrays exist only while a transform runs f)
        raise BufferError("__dlpack__: a unigrad TensorFlow array cannot be exported inside a transform (the "
                          "derivative would be lost); use the Array API namespace on it")

    def __dlpack_device__(self, /):
        device = self.device or "cpu"
        return (1, 0) if device == "cpu" else (2, int(device.rpartition(":")[2] or 0))  # kDLCPU, kDLCUDA

    def __array_namespace__(self, /, *, api_version=None):
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"unsupported Array API version {api_version!r}")
        return namespace

    # ------------------------------------------------------------ attributes
    @property
    def dtype(self):
        return self._t.dtype

    @property
    def shape(self):
        return tuple(self._t.shape.as_list()) if self._t.shape.rank is not None else None

    @property
    def ndim(self):
        return self._t.shape.rank

    @property
    def size(self):
        return self._t.shape.num_elements()

    @property
    def device(self):
        name = self._t.device
        if not name:
            return None
        kind, _, index = name.rpartition("device:")[2].partition(":")
        return "cpu" if kind == "CPU" else f"cuda:{index or 0}" if kind == "GPU" else name

    @property
    def T(self):
        if self._t.shape.rank != 2:
            raise ValueError(f"x.T is defined for 2-D arrays (the Array API standard); got shape {self.shape}: "
                             f"use xp.permute_dims(x, axes) or x.mT")
        return Array(tf.transpose(self._t))

    @property
    def mT(self):
        return Array(_raw.matrix_transpose(self._t))

    def to_device(self, device, /, *, stream=None):
        if stream is not None:
            raise ValueError("to_device: TensorFlow has no streams (stream must be None)")
        return Array(_raw.asarray(self._t, device=device))

    def __getattr__(self, name):
        # TensorFlow's public tensor attributes (x.numpy(), x.get_shape(), x.graph...) of the held tensor;
        # never its private ones, which TensorFlow's internals probe to recognise a tensor
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._t, name)

    def __repr__(self):
        return f"unigrad_tensorflow.Array({self._t!r})"

    __str__ = __repr__

    # ------------------------------------------------------------ Python conversions
    def _scalar_or_array(self):
        try:
            return np.asarray(self._t.numpy())  # a 0-d array, never a NumPy scalar
        except (AttributeError, NotImplementedError):
            raise TracedValueError("NumPy cannot take a symbolic TensorFlow array (inside tf.function or vmap): it "
                                   "has no value yet") from None

    def _scalar_value(self, kind):
        if self._t.shape.rank != 0:
            raise TypeError(f"{kind}() of a unigrad TensorFlow array needs a 0-d array; got shape {self.shape}")
        try:
            value = self._t.numpy()
        except (AttributeError, NotImplementedError):
            raise TracedValueError(f"{kind}() of a symbolic TensorFlow array (inside tf.function or vmap): it has "
                                   f"no value yet; keep it an array (xp.where for control flow)") from None
        return value.item()

    def __bool__(self):
        return bool(self._scalar_value("bool"))

    def __int__(self):
        return int(self._scalar_value("int"))

    def __float__(self):
        return float(self._scalar_value("float"))

    def __complex__(self):
        return complex(self._scalar_value("complex"))

    def __index__(self):
        if not self._t.dtype.is_integer:
            raise TypeError(f"only integer arrays can be used as an index; got dtype {self._t.dtype.name}")
        return int(self._scalar_value("index"))

    def __len__(self):
        if not self._t.shape.rank:
            raise TypeError("len() of a 0-d array")
        n = self._t.shape[0]
        if n is None:
            raise TypeError("len() of an array whose first dimension is not known")
        return n

    def __iter__(self):
        for k in range(len(self)):
            yield Array(self._t[k])

    # ------------------------------------------------------------ indexing
    def __getitem__(self, key):
        if type(key) is tuple:
            key = tuple(plain(k) for k in key)
        else:
            key = plain(key)
        try:
            return Array(_raw.getitem(self._t, key))
        except tf.errors.OpError as exc:
            raise IndexError(f"index {key!r} into an array of shape {self.shape}: {exc.message}") from None

    def __setitem__(self, key, value):
        raise TypeError("unigrad's TensorFlow arrays are immutable, as tf.Tensor is: build the new array instead, "
                        "e.g. xp.where(mask, value, x)")

    # ------------------------------------------------------------ unary operators
    def __neg__(self):
        return Array(_raw.negative(self._t))

    def __pos__(self):
        return Array(_raw.positive(self._t))

    def __abs__(self):
        return Array(_raw.abs(self._t))

    def __invert__(self):
        return Array(_raw.bitwise_invert(self._t))

    # ------------------------------------------------------------ binary operators
    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("subtract"), _binary("subtract", True)
    __mul__, __rmul__ = _binary("multiply"), _binary("multiply", True)
    __truediv__, __rtruediv__ = _binary("divide"), _binary("divide", True)
    __floordiv__, __rfloordiv__ = _binary("floor_divide"), _binary("floor_divide", True)
    __mod__, __rmod__ = _binary("remainder"), _binary("remainder", True)
    __pow__, __rpow__ = _binary("pow"), _binary("pow", True)
    __matmul__, __rmatmul__ = _binary("matmul"), _binary("matmul", True)
    __and__, __rand__ = _binary("bitwise_and"), _binary("bitwise_and", True)
    __or__, __ror__ = _binary("bitwise_or"), _binary("bitwise_or", True)
    __xor__, __rxor__ = _binary("bitwise_xor"), _binary("bitwise_xor", True)
    __lshift__, __rlshift__ = _binary("bitwise_left_shift"), _binary("bitwise_left_shift", True)
    __rshift__, __rrshift__ = _binary("bitwise_right_shift"), _binary("bitwise_right_shift", True)
    __lt__, __le__ = _binary("less"), _binary("less_equal")
    __gt__, __ge__ = _binary("greater"), _binary("greater_equal")
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")


# -------------------------------------------------------------------- the public namespace

def _unwrap_arg(a):
    t = type(a)
    if t is Array:
        return a._t
    if t is WeakScalar:
        return a  # resolved against the other arguments by the boundary
    if t is list or t is tuple:
        for v in a:
            if type(v) is Array:
                return t(plain(v) for v in a)
    return a


def wrap_result(out):
    """Tensors in a namespace function's result (one, or a tuple / list / named tuple of them) as Arrays."""
    if isinstance(out, tf.Tensor):
        return Array(out)
    t = type(out)
    if t is tuple or t is list:
        return t(wrap_result(v) for v in out)
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return t(*(wrap_result(v) for v in out))
    return out


def _boundary(fn):
    def public(*args, **kwargs):
        if kwargs:
            kwargs = {k: _unwrap_arg(v) for k, v in kwargs.items()}
        args = [_unwrap_arg(a) for a in args]
        if WeakScalar in map(type, args) or (kwargs and WeakScalar in map(type, kwargs.values())):
            args, kwargs = _resolve_weak(args, kwargs)
        return wrap_result(fn(*args, **kwargs))
    public.__name__ = public.__qualname__ = fn.__name__
    public.__doc__ = fn.__doc__
    public.__wrapped__ = fn
    try:
        public.__signature__ = inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    return public


_NOT_WRAPPED = {"tf_device_name"}
_PACKAGE = __name__.rpartition(".")[0]
_SUBMODULES = ("linalg", "fft")


def public_module(raw, name):
    """A module with ``raw``'s public names, its functions behind the Array boundary (see the docstring)."""
    mod = types.ModuleType(name, raw.__doc__)
    for key, value in vars(raw).items():
        if key.startswith("_") and not key.startswith("__array"):
            continue
        if key.startswith("__") and key not in ("__array_api_version__", "__array_namespace_info__"):
            continue
        if key == "annotations":
            continue
        if isinstance(value, types.FunctionType) and not value.__module__.startswith(_PACKAGE):
            continue  # a helper the implementation imports (typing.NamedTuple)
        if isinstance(value, type) and issubclass(value, TensorHolder):
            continue
        if isinstance(value, types.FunctionType) and key not in _NOT_WRAPPED:
            value = _boundary(value)
        elif isinstance(value, types.ModuleType):
            if key not in _SUBMODULES:  # the modules the implementation imports (np, tf, math...)
                continue
            value = public_module(value, f"{name}.{key}")
        mod.__dict__[key] = value
    return mod


# -------------------------------------------------------------------- weak scalars of compiled programs

class WeakScalar(Array):
    """A Python float (or complex) that is a dynamic input of a compiled program (``compile=True``).

    ``jax.jit`` traces a Python float as a *weakly typed* scalar: ``x32 * c`` stays float32, as in
    an eager call with the number, and a new value reuses the program. ``tf.function`` has no such
    thing (it would retrace for every value), so the program takes the number as a float64 (or
    complex128) tensor and ``f`` receives it as this array, which follows the eager rules of a Python
    number: combined with an array it takes the array's dtype (the namespace's weak-scalar rule);
    combined with numbers it stays a weak number; a namespace function of it alone gives what the
    function gives for the Python number (a float64 array).
    """

    __slots__ = ()

    def _against(self, dtype):
        """The tensor as a Python number combined with an array of ``dtype`` would be converted."""
        want = _raw._weak(0j if self._t.dtype.is_complex else 0.0, dtype)
        return self._t if want == self._t.dtype else tf.cast(self._t, want)

    def __repr__(self):
        return f"unigrad_tensorflow.WeakScalar({self._t!r})"

    __str__ = __repr__

    def __neg__(self):
        return WeakScalar(-self._t)

    def __pos__(self):
        return self

    def __abs__(self):
        return WeakScalar(tf.abs(self._t)) if not self._t.dtype.is_complex else Array(tf.abs(self._t))


_NUMBERS = (bool, int, float, complex)
_COMPARISONS = {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"}


def _weak_binary(fname, reflected=False):
    def op(self, other):
        fn = getattr(_raw, fname)
        if isinstance(other, _NUMBERS) or type(other) is WeakScalar:
            # number with number: computed as Python would (float64 / complex128), still a weak number
            o = other._t if type(other) is WeakScalar else other
            out = fn(o, self._t) if reflected else fn(self._t, o)
            return Array(out) if fname in _COMPARISONS or out.dtype.is_integer or out.dtype.is_bool \
                else WeakScalar(out)
        if type(other) is Array or isinstance(other, (tf.Tensor, tf.Variable)):
            o = plain(other)
            mine = self._against(o.dtype)
        else:
            o, mine = _operand(other), self._t
            if o is NotImplemented:
                return NotImplemented
        return Array(fn(o, mine) if reflected else fn(mine, o))
    op.__name__ = f"__{'r' if reflected else ''}{fname}__"
    return op


for _name in ("add", "subtract", "multiply", "divide", "floor_divide", "remainder", "pow", "matmul",
              "less", "less_equal", "greater", "greater_equal", "equal", "not_equal"):
    _dunder = {"subtract": "sub", "multiply": "mul", "divide": "truediv", "floor_divide": "floordiv",
               "remainder": "mod", "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge",
               "equal": "eq", "not_equal": "ne"}.get(_name, _name)
    setattr(WeakScalar, f"__{_dunder}__", _weak_binary(_name))
    if _name not in _COMPARISONS:
        setattr(WeakScalar, f"__r{_dunder}__", _weak_binary(_name, True))
del _name, _dunder


def _resolve_weak(args, kwargs):
    """A namespace function's arguments with each :class:`WeakScalar` converted as the Python number
    would be: to the promoted dtype of the other arrays among them, or float64 / complex128 alone."""
    arrays = [plain(a) for a in list(args) + list(kwargs.values())
              if type(a) is not WeakScalar and isinstance(plain(a), (tf.Tensor, tf.Variable))]
    dtype = _raw.result_type(*arrays) if arrays else None

    def resolve(a):
        if type(a) is not WeakScalar:
            return a
        return a._t if dtype is None else a._against(dtype)

    return [resolve(a) for a in args], {k: resolve(v) for k, v in kwargs.items()}


#: The public namespace, ``unigrad_tensorflow.namespace``: built here, where the boundary is, so that the
#: modules above (the package, ``_backend``) import it and nothing imports the package from below.
namespace = public_module(_raw, _PACKAGE + ".namespace")
