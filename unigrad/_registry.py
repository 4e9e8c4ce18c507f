"""Backend discovery, registration and selection.

Backends come from the ``unigrad.backends`` entry-point group (the NumPy tape
included) and from :func:`register_backend`. Entry points are loaded lazily:
a broken plugin does not break the others, and its import error is raised
when someone asks for it by name. The current backend lives in contextvars.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import os
import sys
import threading

import numpy as np
from importlib import metadata
from typing import Callable, Iterator

from .backend import Backend

__all__ = ["backends", "get_backend", "set_backend", "use_backend", "use_device", "register_backend",
           "did_you_mean"]

ENTRY_POINT_GROUP = "unigrad.backends"
DEFAULT = "numpy"
# The pip extra that installs each first-party backend, for error messages.
_EXTRAS = {"torch": "unigrad[torch]", "jax": "unigrad[jax]", "tensorflow": "unigrad[tensorflow]"}

_context_backend: contextvars.ContextVar = contextvars.ContextVar("unigrad_use_backend", default=None)
_default_backend: contextvars.ContextVar = contextvars.ContextVar("unigrad_set_backend", default=None)

# The backend whose transform is running the user's function right now: ``namespace(x)`` inside f
# answers with that backend's namespace (so a plugin sharing another backend's array types still
# gets its own operations).
active_backend: contextvars.ContextVar = contextvars.ContextVar("unigrad_active_backend", default=None)

_lock = threading.RLock()
_factories: dict[str, Callable[[], Backend]] = {}  # runtime registrations
_entry_points: dict[str, metadata.EntryPoint] | None = None
_instances: dict[str, Backend] = {}
_errors: dict[str, BaseException] = {}
# Counts the changes of runtime registrations (register_backend, unregister_backend): the backend the
# selection rules pick for given contexts, variables and array types changes only with it (read by
# the compiled repeat keys, unigrad._repeats.Repeats, instead of running resolve() on every call).
_generation = 0


def _discover() -> dict[str, metadata.EntryPoint]:
    global _entry_points
    if _entry_points is None:
        with _lock:
            if _entry_points is None:
                found = {}
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    found.setdefault(ep.name, ep)
                _entry_points = found
    return _entry_points


def register_backend(name: str, factory: Callable[[], Backend], *, replace: bool = False) -> None:
    """Register a backend at run time.

    Args:
      name: the name users select it by.
      factory: a zero-argument callable (usually the Backend subclass) returning the backend.
        A class attribute ``array_modules`` on it lets unigrad infer the backend from inputs.
      replace: allow replacing an existing registration of the same name.

    Example:
      >>> unigrad.register_backend("mine", MyBackend)           # doctest: +SKIP
      >>> unigrad.grad(f, backend="mine")(x)                    # doctest: +SKIP
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_backend: name must be a non-empty string; got {name!r}")
    if not callable(factory):
        raise TypeError(f"register_backend: factory must be callable; got {type(factory).__name__}")
    with _lock:
        if not replace and (name in _factories or name in _instances):
            raise ValueError(f"register_backend: a backend named {name!r} is already registered; pass replace=True")
        _factories[name] = factory
        _instances.pop(name, None)
        _errors.pop(name, None)
        _owners.clear()
        _registered()


def unregister_backend(name: str) -> None:
    """Remove a runtime registration (entry-point backends come back on the next lookup)."""
    with _lock:
        _factories.pop(name, None)
        _instances.pop(name, None)
        _errors.pop(name, None)
        _owners.clear()
        _registered()


def _registered() -> None:
    """A registration changed: count it (see ``_generation``)."""
    global _generation
    _generation += 1


def _names() -> list[str]:
    names = list(_discover())
    for n in _factories:
        if n not in names:
            names.append(n)
    return names


def _factory(name: str):
    if name in _factories:
        return _factories[name]
    ep = _discover().get(name)
    if ep is None:
        return None
    return ep.load()


def get_backend(name: str | Backend | None = None) -> Backend:
    """The backend object for ``name`` (or the current one when ``name`` is None).

    Raises:
      ValueError: unknown name; the message lists the available backends and the extra to install.
      ImportError: the backend is installed but failed to import (the original error is chained).
    """
    if type(name) is str:  # the common case first (an ABC's isinstance is slow)
        inst = _instances.get(name)
        if inst is not None:
            return inst
    elif isinstance(name, Backend):
        return name
    if name is None:
        name = current_backend_name()
    if not isinstance(name, str):
        raise TypeError(f"backend must be a backend name or a Backend instance; got {type(name).__name__}")
    inst = _instances.get(name)
    if inst is not None:
        return inst
    with _lock:
        inst = _instances.get(name)
        if inst is not None:
            return inst
        try:
            factory = _factory(name)
            if factory is None:
                available = ", ".join(sorted(_names())) or "none"
                hint = f" Install it with `pip install '{_EXTRAS[name]}'`." if name in _EXTRAS else ""
                raise ValueError(f"unknown backend {name!r}{did_you_mean(name, _names())}; available backends: "
                                 f"{available}.{hint}")
            inst = factory()
        except ValueError:
            raise
        except Exception as exc:  # a broken plugin: remember and report it, do not poison the others
            _errors[name] = exc
            hint = f" (install with `pip install '{_EXTRAS[name]}'`)" if name in _EXTRAS else ""
            raise ImportError(f"backend {name!r} is registered but could not be loaded{hint}: "
                              f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(inst, Backend):
            raise TypeError(f"backend factory for {name!r} returned {type(inst).__name__}, not a unigrad.Backend")
        if inst.name != name:  # the name it is selected by (a class may be registered under several)
            inst.name = name
        _instances[name] = inst
        _errors.pop(name, None)
        return inst


_ALIASES = {"pytorch": "torch", "tf": "tensorflow", "np": "numpy", "tape": "numpy", "jnp": "jax"}


def did_you_mean(name, choices) -> str:
    """`` (did you mean 'torch'?)`` for a misspelt or aliased backend name, else ``""``."""
    if not isinstance(name, str):
        return ""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    match = lowered.get(name.lower())
    if match is None and _ALIASES.get(name.lower()) in choices:
        match = _ALIASES[name.lower()]
    if match is None:
        close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
        match = lowered[close[0]] if close else None
    return f" (did you mean {match!r}?)" if match else ""


def backends(*, load: bool = False) -> dict[str, dict]:
    """What is installed: one entry per backend name, listed without importing any framework.

    Each entry has ``available`` (its packages are installed: found without importing them), ``loaded``
    (imported already), ``version``, ``devices``, ``capabilities`` (dict) and ``error`` (why it is
    unavailable, or None). A backend not loaded yet reports its framework's version from the package
    metadata (first-party backends) and ``None`` for what only its instance knows (devices, capabilities);
    a package that is found may still fail to import, which ``get_backend`` (or ``load=True``) reports.

    Args:
      load: import every backend first (as ``unigrad info`` does): ``available`` then means it loads,
        ``devices`` and ``capabilities`` are filled, ``error`` holds an import failure.

    Example:
      >>> sorted(unigrad.backends())                      # doctest: +SKIP
      ['jax', 'numpy', 'tensorflow', 'torch']
    """
    report = {}
    for name in _names():
        inst = _instances.get(name)
        if load and inst is None:
            try:
                inst = get_backend(name)
            except Exception:  # (its error is in _errors)
                inst = None
        entry = {"available": None, "loaded": inst is not None, "version": None, "devices": None,
                 "capabilities": None, "error": None}
        if inst is not None:
            entry.update(available=True, version=inst.version(), devices=list(inst.devices()),
                         capabilities=dict(inst.capabilities.__dict__))
        elif name in _errors:
            exc = _errors[name]
            entry.update(available=False, error=f"{type(exc).__name__}: {exc}")
        else:
            missing = _missing_modules(name)
            entry.update(available=not missing, version=_framework_version(name),
                         error=f"not installed: no module {missing[0]!r}" if missing else None)
        report[name] = entry
    return report


#: The modules each first-party backend needs besides its adapter (found, never imported, by ``backends``).
_FRAMEWORK_MODULES = {"numpy": ("numpy",), "torch": ("torch",), "jax": ("jax", "jaxlib"),
                      "tensorflow": ("tensorflow",)}
#: The distributions that install each first-party framework, for its version (the first one installed).
_FRAMEWORK_DISTRIBUTIONS = {"numpy": ("numpy",), "torch": ("torch",), "jax": ("jax",),
                            "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos",
                                           "tf-nightly")}


def _missing_modules(name) -> list:
    """The modules a backend needs that are not installed (``importlib.util.find_spec`` of top-level
    names: nothing is imported): its adapter's package and, for a first-party backend, its framework."""
    import importlib.util

    needed = list(_FRAMEWORK_MODULES.get(name, ()))
    ep = _discover().get(name) if name not in _factories else None
    if ep is not None:
        needed.insert(0, ep.module.partition(".")[0])
    missing = []
    for module in needed:
        if module in sys.modules:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


def _framework_version(name):
    """A first-party backend's framework version from the installed package's metadata (None: unknown)."""
    for dist in _FRAMEWORK_DISTRIBUTIONS.get(name, ()):
        try:
            return metadata.version(dist)
        except Exception:  # not this distribution (or broken metadata: no version to show)
            continue
    return None


def set_backend(name: str | Backend | None) -> None:
    """Set the default backend of the current context (thread or async task and what it starts later).

    Below ``use_backend`` and ``backend=`` in precedence; ``None`` clears it.
    New threads start from an empty context on Python < 3.14: call it there too, or pass ``backend=``.
    """
    if name is not None:
        get_backend(name)  # fail now, not at the first transform
    _default_backend.set(name)


@contextlib.contextmanager
def use_backend(name: str | Backend) -> Iterator[Backend]:
    """Context manager selecting a backend for the code inside it (contextvars: thread- and async-safe).

    Example:
      >>> with unigrad.use_backend("numpy"):
      ...     g = unigrad.grad(f)(x)          # doctest: +SKIP
    """
    b = get_backend(name)
    token = _context_backend.set(b)
    try:
        yield b
    finally:
        _context_backend.reset(token)


def _getenv(name: str) -> str | None:
    """``os.environ.get(name)``, read on every call (the variables may change at run time), but without
    the KeyError that ``os.environ.get`` raises and catches inside for an unset variable: microseconds
    on every transform. Goes through ``os.environ``'s own encoded mapping where CPython has one."""
    data = getattr(os.environ, "_data", None)
    if data is None:
        return os.environ.get(name)
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = os.environ.encodekey(name)
    raw = data.get(key)
    return None if raw is None else os.environ.decodevalue(raw)


_ENV_KEYS: dict = {}  # variable name -> its key in os.environ's encoded mapping


_context_device: contextvars.ContextVar = contextvars.ContextVar("unigrad_use_device", default=None)


@contextlib.contextmanager
def use_device(device: str | None) -> Iterator[str | None]:
    """Context manager: transforms called inside place their inputs on ``device`` unless given ``device=``.

    Example:
      >>> with unigrad.use_device("cuda"):
      ...     g = unigrad.grad(loss, backend="torch")(w)   # doctest: +SKIP
    """
    token = _context_device.set(device)
    try:
        yield device
    finally:
        _context_device.reset(token)


def current_device() -> str | None:
    """The device transforms place inputs on by default: ``use_device`` > ``UNIGRAD_DEVICE`` > None (leave them)."""
    return _context_device.get() or _getenv("UNIGRAD_DEVICE") or None


def current_backend_name() -> str:
    for var in (_context_backend, _default_backend):
        v = var.get()
        if v is not None:
            return v if isinstance(v, str) else v.name
    return _getenv("UNIGRAD_BACKEND") or DEFAULT


_NOT_OWNED = frozenset((np.ndarray, float, int, complex, bool, np.generic, type(None), str))  # (a set: one hash)


def _array_owner(x) -> str | None:
    """Name of the registered backend whose ``array_modules`` own type(x), without importing anything."""
    t = type(x)
    if t in _NOT_OWNED:
        return None
    owner = _owners.get(t, _UNKNOWN)
    if owner is _UNKNOWN:
        owner = _find_owner(t)
        if owner is not None:  # a type no backend owns may get one when its framework's adapter loads
            _owners[t] = owner
    return owner


_UNKNOWN = object()
_owners: dict = {}  # array type -> backend name (cleared when registrations change)


def arrays_owner(arrays, mixed: str) -> str | None:
    """Name of the backend owning the arrays among ``arrays`` (None where none does: NumPy arrays and
    Python scalars only). Two owners: TypeError with ``mixed.format(first, other)``."""
    owner = None
    for x in arrays:
        name = _array_owner(x)
        if name is not None:
            if owner is not None and owner != name:
                raise TypeError(mixed.format(owner, name))
            owner = name
    return owner


def _find_owner(t) -> str | None:
    mod = t.__module__.partition(".")[0]
    if mod in ("builtins", "numpy"):
        return None
    for name in _names():  # the backends loaded already first: finding their arrays loads nothing
        cls = _factories.get(name) or _instances.get(name)
        if cls is not None and mod in getattr(cls, "array_modules", ()):
            return name
    # first-party adapters first: an array of their framework is theirs without loading a plugin (a third-party
    # plugin is loaded, its framework imported, only for an array type no first-party adapter owns)
    for name in sorted(_names(), key=lambda n: not _first_party(n)):
        cls = _factories.get(name)
        if cls is None:
            inst = _instances.get(name)
            if inst is not None:
                cls = inst
            else:
                ep = _discover().get(name)
                if ep is None:
                    continue
                # Only load a plugin whose framework is already imported: an array of it can exist.
                root = ep.value.partition(":")[0].partition(".")[0]
                modules = _KNOWN_MODULES.get(root)
                if modules and not any(m in sys.modules for m in modules):
                    continue
                owns = _FIRST_PARTY_ARRAYS.get(root)
                if owns is not None and mod not in owns:  # a first-party adapter owns its framework's arrays only
                    continue
                try:
                    cls = _factory(name)
                except Exception:
                    continue
        for m in getattr(cls, "array_modules", ()):
            if m == mod:
                return name
    return None


def _first_party(name) -> bool:
    """Whether ``name`` is the entry point of one of unigrad's own adapters (not a runtime registration)."""
    ep = None if name in _factories else _discover().get(name)
    return ep is not None and ep.value.partition(":")[0].partition(".")[0] in _KNOWN_MODULES


# First-party adapters and the frameworks they wrap, so inference never loads an adapter whose
# framework is not even imported (a TensorFlow import costs seconds). Third-party plugins are
# loaded (cheaply: only their module) when an unknown array type shows up.
_KNOWN_MODULES = {"unigrad_torch": ("torch",), "unigrad_jax": ("jax", "jaxlib"),
                  "unigrad_tensorflow": ("tensorflow",), "unigrad": ()}
# The top-level modules of the array types each first-party adapter owns (its ``array_modules``): an
# array of another framework does not load it (the NumPy tape's import is a visible part of a first call).
_FIRST_PARTY_ARRAYS = {"unigrad_torch": ("torch",), "unigrad_jax": ("jax", "jaxlib"),
                       "unigrad_tensorflow": ("tensorflow", "unigrad_tensorflow"), "unigrad": ("unigrad",)}


def resolve(explicit, leaves) -> Backend:
    """Selection order: explicit > use_backend > set_backend > UNIGRAD_BACKEND > input arrays > numpy."""
    if explicit is not None:
        return get_backend(explicit)
    v = _context_backend.get()
    if v is None:
        v = _default_backend.get()
    if v is not None:
        return get_backend(v)
    env = _getenv("UNIGRAD_BACKEND")
    if env:
        return get_backend(env)
    owner = None
    for x in leaves:
        t = type(x)
        if t in _NOT_OWNED:  # NumPy arrays and Python scalars, the common case, without a call
            continue
        name = _owners.get(t)  # a type met before (_array_owner's own first step, without the call)
        if name is None:
            name = _array_owner(x)
            if name is None:
                continue
        if owner is None:
            owner = name
        elif owner != name:
            raise TypeError(f"inputs mix arrays of backends {owner!r} and {name!r}; pass backend= to choose one")
    owner = owner or DEFAULT
    inst = _instances.get(owner)
    return inst if inst is not None else get_backend(owner)
