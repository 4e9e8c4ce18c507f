"""The cache layer: what a transform derives once and keeps, and the one key every cache builds.

A transform keeps what it derives for a call (a plan, a compiled program, a row proof, a sparsity
pattern, a probe's verdict...) in a :class:`BoundedCache`, and every such cache is of one
:class:`CacheKind`, declared at import next to the transform that fills it: which transform, a name,
what its entries depend on besides the call's signature, and why. The key is built in one place,
:meth:`CacheKind.key`, from what the kind declares:

- the **signature** (always): the backend, the device, the arguments' tree structure, each array's
  type, shape and dtype, each other leaf's exact value (``Call.key``); for compiled programs, the
  signature with the program's dynamic Python scalars by type (``Call.program_key``, ``program=True``);
- ``state``: the Python state ``f`` reads (:func:`unigrad._pystate.python_state`: closure cells,
  defaults, the globals its code names, the functions it calls, containers and objects to a bounded
  depth, arrays by the digest of their bytes). Everything derived by running or tracing ``f``
  that a later call relies on for its *result* (a proof, a pattern, a probe's verdict, a program
  traced for an eager call) depends on it: an eager call must see ``f`` as it is now;
- ``values``: the values of the arrays ``f`` is given but not differentiated with respect to (their
  digests): what a trace reads them for (an index array picks rows; a constant matrix's zeros are a
  product's) is kept per value of them.

Decisions of speed alone (the Jacobian mode ``"auto"`` picks, a chunk size from a memory budget)
are kept per signature: they do not change a result, and a result that must not follow them is
re-checked on the call (see ``hessian``). A ``compile=True`` program is kept per signature and
reads ``f``'s Python state when it is traced, as ``jax.jit`` does (docs/conventions.md).

:func:`kinds` lists every kind declared: the in-suite test of state changes
(``tests/test_cache_keys_state.py``) runs each cached transform against each kind of change and
fails for a kind whose transform it does not know. ``UNIGRAD_NO_CACHE=1`` turns every cache off.
"""

from __future__ import annotations

from . import _registry
from ._pystate import python_state

__all__ = ["BoundedCache", "CacheKind", "caches_enabled", "kinds"]

_KINDS: list = []  # every CacheKind, in the order declared (filled at import)
_PARTS = frozenset({"state", "values"})


def caches_enabled() -> bool:
    """False when the environment variable ``UNIGRAD_NO_CACHE`` is set to a true value."""
    return (_registry._getenv("UNIGRAD_NO_CACHE") or "0").lower() not in ("1", "true", "yes", "on")


class CacheKind:
    """One kind of cached entry: the transform that keeps it, its name, what it depends on besides the
    signature (``depends``: ``"state"``, ``"values"``), and the reason (see the module docstring).

    ``program``: keyed by ``Call.program_key`` (dynamic Python scalars of a compiled call by type)
    instead of ``Call.key`` (every non-array leaf by value).
    """

    __slots__ = ("transform", "name", "state", "values", "program", "why")

    def __init__(self, transform: str, name: str, depends=(), why: str = "", program: bool = False):
        depends = frozenset(depends)
        if not depends <= _PARTS:
            raise ValueError(f"CacheKind {transform}.{name}: depends must be among {sorted(_PARTS)}; got "
                             f"{sorted(depends)}")
        self.transform, self.name, self.why, self.program = transform, name, why, program
        self.state, self.values = "state" in depends, "values" in depends
        _KINDS.append(self)

    @property
    def depends(self) -> tuple:
        return tuple(p for p in ("state", "values") if getattr(self, p))

    def key(self, call, *extra):
        """The key of ``call``'s entry (``extra``: the transform's decision, such as the mode), or None
        when it has none (an unhashable signature, or an array whose value cannot be read: nothing is
        kept). The one place a cache key is built."""
        base = call.program_key if self.program else call.key
        if base is None:
            return None
        parts = [base]
        if self.state:
            parts.append(call.state)
        if self.values and call.plan.dynamic_positions:
            values = call.values
            if values is None:  # (a tracer of an enclosing jax.jit: no value to key on)
                return None
            parts.append(values)
        parts.extend(extra)
        return tuple(parts)

    def key_of(self, signature, f=None, *extra, state=None):
        """The key of an entry of a transform that has no :class:`~unigrad._call.Call` (``vmap``,
        ``unigrad.dask``): ``signature`` (hashable, None: nothing is kept) and, where the kind depends on
        it, the Python state ``f`` reads now (``state``: that state, read already). A kind that depends
        on ``values`` needs a call."""
        if signature is None:
            return None
        if self.values:
            raise TypeError(f"{self!r} depends on the values of the arrays f is given: key it by a call")
        parts = [signature]
        if self.state:
            parts.append(python_state(f) if state is None else state)
        parts.extend(extra)
        return tuple(parts)

    def __repr__(self):
        return f"CacheKind({self.transform}.{self.name}, depends={self.depends})"


def kinds() -> tuple:
    """Every :class:`CacheKind` declared."""
    return tuple(_KINDS)


class BoundedCache:
    """A small map from keys to what was derived for them; the oldest entry goes first when full.

    ``kind`` (a :class:`CacheKind`) says what its keys hold: :meth:`lookup` and :meth:`store` key a
    call's entry by it. :meth:`get` and :meth:`put` take a key made elsewhere (the repeat keys of
    :class:`unigrad._repeats.Repeats`, made from the arguments of a compiled call). Safe when threads
    share it (a lost insertion only costs a recomputation). With caches off (``UNIGRAD_NO_CACHE``,
    read when the cache is made) it stores nothing.
    """

    __slots__ = ("kind", "entries", "maxsize", "values_seen", "warned")

    def __init__(self, kind: CacheKind, maxsize: int = 32):
        if not isinstance(kind, CacheKind):
            raise TypeError(f"BoundedCache: kind must be a CacheKind (declared at import, see unigrad._caches); "
                            f"got {kind!r}")
        self.kind = kind
        self.entries: dict = {}
        self.maxsize = maxsize if caches_enabled() else 0
        self.values_seen: dict = {}  # a cache of programs: argument position -> the static values that built one
        self.warned = False

    def get(self, key):
        return None if key is None else self.entries.get(key)

    def put(self, key, value):
        if key is None or not self.maxsize:
            return value
        entries = self.entries
        while len(entries) >= self.maxsize:
            try:
                entries.pop(next(iter(entries)), None)
            except (StopIteration, RuntimeError):  # emptied or changed by another thread meanwhile
                break
        entries[key] = value
        return value

    def lookup(self, call, *extra):
        """The entry kept for ``call`` (and ``extra``), or None."""
        return self.get(self.kind.key(call, *extra))

    def store(self, call, value, *extra):
        """Keep ``value`` for ``call`` (and ``extra``); returns ``value``."""
        return self.put(self.kind.key(call, *extra), value)
