"""Framework-neutral dtype names, read without importing any framework."""

from __future__ import annotations

FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})
COMPLEX = frozenset({"complex64", "complex128"})
INEXACT = FLOATING | COMPLEX

# The real dtype paired with each complex dtype, and the reverse.
REAL_OF_COMPLEX = {"complex64": "float32", "complex128": "float64"}


_NAMES: dict = {}  # dtype object -> canonical name; numpy's dtype.name alone costs microseconds


def dtype_name(dtype) -> str:
    """Canonical name of a NumPy, torch, JAX, TensorFlow or MLX dtype ("float32", "int64", "bool"...)."""
    try:
        return _NAMES[dtype]
    except (KeyError, TypeError):
        pass
    name = _dtype_name(dtype)
    try:
        _NAMES[dtype] = name
    except TypeError:  # an unhashable dtype-like: not cached
        pass
    return name


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):  # torch's and MLX's dtypes have no .name; their str is "torch.float32",
        name = str(dtype)          # "mlx.core.float64": the name after the module path
        if name.replace(".", "").replace("_", "").isalnum():
            name = name.rsplit(".", 1)[-1]
    return {"double": "float64", "float": "float32", "half": "float16", "cfloat": "complex64",
            "cdouble": "complex128", "bool_": "bool", "long": "int64", "int": "int32"}.get(name, name)


def is_inexact(name: str) -> bool:
    return name in INEXACT


def is_complex(name: str) -> bool:
    return name in COMPLEX
