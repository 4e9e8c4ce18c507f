"""Compiled calls that repeat a signature: the arguments straight to their plan and program
(:class:`Repeats`), the whole call in one lookup where the transform allows it."""

from __future__ import annotations

import os as _os

from . import _registry
from ._caches import BoundedCache, CacheKind
from ._call import Call, Seen
from ._signature import _BACKEND_VAR, _CONTEXT_BACKEND, _DEFAULT_BACKEND, _DEVICE_VAR, _SUMMARIES, _summary
from .backend import Backend

_ACTIVE, _DEVICE = _registry.active_backend, _registry._context_device

REPEATS = CacheKind("compiled calls", "repeats", why="a compiled call's arguments straight to its plan and program "
                    "(Repeats): what decided them, read from the arguments and the selection state")


class Miss:
    """What :meth:`Repeats.run` returns where it did not run the call: the repeat key (None: the call
    takes the full path) and the runner kept for it (None: none, or not looked up)."""

    __slots__ = ("key", "runner")

    def __init__(self, key, runner=None):
        self.key, self.runner = key, runner



_NO_KEY = Miss(None)



class Repeats:
    """The compiled calls of one transform that repeat a signature: the arguments straight to their
    plan and program, in one dictionary lookup.

    After the first call of a signature, a compiled call's work is the program's: the rest of
    :func:`prepare` and :func:`execute` (the pytree signature, the :class:`Key`, the plan and program
    caches) derives again what the first call derived. A repeat is recognised from what decided
    them: the backend the selection rules pick now (``backend=``'s instance; without ``backend=``, what
    the rules read instead of their outcome: ``use_backend``, ``set_backend`` and ``UNIGRAD_BACKEND`` as
    they are now, the count of registration changes, and the arrays' types, which are in the key
    anyway), the device they place on now, and for each argument its array type, shape and dtype, or
    the type of a Python float or complex that the program takes as a dynamic scalar. Anything else (a pytree, an int, a static float, keyword arguments, a call
    nested in another transform) takes the full path, and so does a call the transform did not
    :meth:`remember` (the transform decides which decisions hold for a whole signature).
    """

    __slots__ = ("entries", "runners", "static", "backend", "device", "fixed")

    def __init__(self, static_args, backend, device, maxsize: int = 32, kind: CacheKind = REPEATS):
        self.entries = BoundedCache(kind, maxsize)
        self.runners = BoundedCache(kind, maxsize)  # key -> the transform's whole call, arguments to result (see remember)
        self.static, self.backend, self.device = static_args or frozenset(), backend, device
        self.fixed = backend if isinstance(backend, Backend) else None  # backend= an instance: itself

    def key(self, args):
        """The repeat key of ``args``, or None when they take the full path."""
        return self.run(args, False).key

    def lookup(self, args):
        """``(runner, key)``: what :meth:`remember` kept for repeats of ``args``' signature (a
        ``(fn, index, failed)`` triple, see :meth:`run`; None: nothing kept), and the repeat key of
        ``args`` (None when they take the full path)."""
        miss = self.run(args, False)
        return miss.runner, miss.key

    def selection(self, args):
        """The repeat key's first two parts, as a list: the device chosen now and the backend (its
        instance, or what the selection rules read). Read inline, without calling the rules: a compiled
        repeat's whole Python work is a few microseconds, and each step is a visible share of it."""
        device = self.device
        if device is None:  # _registry.current_device(), inline: use_device, else UNIGRAD_DEVICE as set now
            device = _DEVICE.get()
            if not device:  # (use_device(None) or "": the variable decides, as in current_device())
                try:  # the variable's raw bytes (None: unset): only compared, never decoded
                    device = _os.environ._data.get(_DEVICE_VAR)
                except AttributeError:  # os.environ replaced by another mapping
                    device = _registry._getenv("UNIGRAD_DEVICE")
        backend = self.backend
        if type(backend) is str:
            b = _registry._instances.get(backend)  # get_backend's own first step
            if b is None:
                b = _registry.resolve(backend, args)
        elif backend is None:  # what the selection rules read, not their outcome (resolve() costs ~1 us):
            try:  # with the arrays' types (below) and the registrations, it decides the backend
                env = _os.environ._data.get(_BACKEND_VAR)
            except AttributeError:
                env = _registry._getenv("UNIGRAD_BACKEND")
            b = (_CONTEXT_BACKEND.get(), _DEFAULT_BACKEND.get(), env, _registry._generation)
        else:
            b = self.fixed if self.fixed is not None else _registry.resolve(backend, args)
        return [device, b]

    def run(self, args, go=True):
        """The transform's result for ``args`` where it repeats a signature whose whole call
        :meth:`remember` kept (a runner); else a :class:`Miss` holding the repeat key (None: the full
        path) and the runner (None: none kept; only when ``go`` is false, which never runs it).

        A runner is ``(fn, index, failed)``: the result is ``fn(*args)[index]`` (``index`` None:
        ``fn(*args)``, a :class:`Program` made ``bare``), and ``failed(exc, args)`` raises the error to
        raise instead of ``exc`` (or returns: ``exc`` itself); ``index`` and ``failed`` None: the result
        is ``fn(args)`` (a function that handles its errors). The key and the run are in this one function: a compiled repeat's
        whole Python work is this, so it reads no more than it must (each step is a visible share of
        a small compiled call) and calls nothing it need not."""
        if _ACTIVE.get() is not None:  # nested: the full path checks what may nest
            return _NO_KEY
        key = self.selection(args)
        if self.static:
            key = self._static_key(args, key)
            if key is None:
                return _NO_KEY
        else:
            for a in args:
                t = type(a)
                summary = _SUMMARIES.get(t)
                if summary is not None:  # an array of a type met before: its type and (shape, dtype)
                    key.append(t)
                    key.append(summary(a))
                elif t is float or t is complex:  # a dynamic Python scalar: its type only
                    key.append(t)
                else:
                    summary = _summary(a)
                    if summary is None:  # an int, a static value, a container: the full path
                        return _NO_KEY
                    key.append(t)
                    key.append(summary(a))
            key = tuple(key)
        # (the dict itself, no method call: a transform made under UNIGRAD_NO_CACHE keeps no runner)
        runner = self.runners.entries.get(key)
        if runner is None or not go:
            return Miss(key, runner)
        fn, index, failed = runner
        if index is None:
            if failed is None:
                return fn(args)
            try:
                return fn(*args)
            except Exception as exc:
                failed(exc, args)
                raise
        try:
            return fn(*args)[index]
        except Exception as exc:
            failed(exc, args)
            raise

    def _static_key(self, args, key):
        """:meth:`run`'s key when some positions are static: a Python float or complex there takes the
        full path (None: one program per value)."""
        static = self.static
        if min(static) < 0:
            static = frozenset(a % len(args) for a in static if -len(args) <= a < len(args))
        for p, a in enumerate(args):
            t = type(a)
            summary = _SUMMARIES.get(t) or _summary(a)
            if summary is not None:
                key.append(t)
                key.append(summary(a))
            elif (t is float or t is complex) and p not in static:
                key.append(t)
            else:
                return None
        return tuple(key)

    def find(self, args, f, has_aux, fname):
        """``(call, key)``: the :class:`Call` of a repeat (its program in ``call.program``) or None, and
        the key to :meth:`remember` the call under (None: it takes the full path)."""
        key = self.key(args)
        return (None, None) if key is None else (self.call(key, f, args, has_aux, fname), key)

    def call(self, key, f, args, has_aux, fname):
        """The :class:`Call` of a repeat (its program in ``call.program``), or None."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        plan, program = entry
        if plan.convert:  # NumPy arrays or numbers to convert (or a device to place on): the full constructor
            call = Call(plan, None, f, args, args, None, has_aux, fname)
        else:  # the arguments are the leaves, as they are
            call = Call.__new__(Call)
            call.plan, call.program_key, call._key, call._weak, call.f, call.args = plan, None, None, None, f, args
            call.treedef, call.template, call.has_aux, call.fname = None, args, has_aux, fname
            call.seen, call._flat_f = Seen(), None
            call.diff = tuple([args[p] for p in plan.diff_positions])
            call.dynamic = tuple([args[p] for p in plan.dynamic_positions])
        call.program = program
        return call

    def remember(self, key, call: Call, finish=None):
        """Keep ``call``'s plan and program for repeats of ``key`` (a flat call run by a program).

        ``finish(call, program)``, when given, may return the transform's whole call for repeats of
        ``key``: a runner (see :meth:`run`; made with :meth:`Program.flat_runner`), or a function of
        the arguments alone (the runner ``(fn, None, None)``); it is kept in ``runners``, and
        :meth:`run` runs it. It returns None where the transform needs the :class:`Call`."""
        if key is None or call.program is None or call.treedef is not None:
            return
        self.entries.put(key, (call.plan, call.program))
        if finish is not None:
            whole = finish(call, call.program)
            if whole is not None:
                self.runners.put(key, whole if type(whole) is tuple else (whole, None, None))
