"""Running a transform's kernel (step 4 of a transform call, see :mod:`unigrad._call`): eagerly, or as a
compiled :class:`Program`, one per signature and decision for backends that compile; and the errors that
say what to do where ``f`` uses a traced value as a Python value."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import optree

from ._caches import BoundedCache
from ._call import _LEAF, Call, Seen, flat_function
from ._signature import _leaf_owners, _static_token
from .backend import numpy_copies, uses_traced_value

PROGRAMS_WHY = ("compile=True: one program per signature, which reads f's Python state when it is traced, as "
                "jax.jit does (pass what changes as an argument; docs/conventions.md)")


class Program:
    """A compiled program of one transform for one signature and decision.

    It takes the differentiated leaves and the dynamic leaves, and returns a flat tuple: the outputs
    (only with ``keep_outputs``), the result blocks and the aux leaves that are arrays; with ``bare``
    (the caller knows that tuple holds one array: a ``grad`` of one leaf, no aux) the array itself,
    which :meth:`__call__` puts back in a tuple (a compiled call then returns what ``jax.jit(jax.grad(f))``
    returns, no tuple to build and index on every call). What tracing
    revealed -- the output and aux structures, and the aux leaves that are not arrays (returned as
    ``f`` gave them) -- is recorded in the program when it is traced. It holds no array of the call
    that built it.
    """

    __slots__ = ("compiled", "out_tree", "aux_tree", "n_out", "n_blocks", "aux_static", "weak", "bare")

    def __init__(self, f, call: Call, kernel, keep_outputs: bool, bare: bool = False):
        plan = call.plan
        b, n = plan.backend, len(plan.diff_positions)
        has_aux, fname, batch, treedef = call.has_aux, call.fname, call.seen.batch, call.treedef
        template = list(call.template)  # static leaves only: the arrays are not kept
        for p in plan.diff_positions + plan.dynamic_positions:
            template[p] = None
        self.out_tree = self.aux_tree = None
        self.n_out = self.n_blocks = 0
        self.aux_static = ()
        self.bare = bare

        def program(*arrays):
            seen = Seen(batch)
            flat_f = flat_function(f, plan, template, treedef, arrays[n:], has_aux, fname, seen)
            outs, blocks, aux = kernel(b, flat_f, arrays[:n])
            outs = tuple(outs) if keep_outputs else ()
            aux = tuple(aux or ())
            self.aux_static = tuple((k, a) for k, a in enumerate(aux) if not b.is_array(a))
            self.out_tree, self.aux_tree, self.n_out, self.n_blocks = seen.out_tree, seen.aux_tree, len(outs), len(blocks)
            flat = outs + tuple(blocks) + tuple(a for a in aux if b.is_array(a))
            if not bare:
                return flat
            if len(flat) != 1 or self.aux_static:
                raise RuntimeError(f"unigrad internal error: {fname}'s compiled program was to return one array, "
                                   f"not {len(flat)}")
            return flat[0]

        # Python floats among the dynamic leaves are traced as weakly typed scalars (x32 * c stays float32)
        self.weak = tuple(n + i for i in plan.weak)
        self.compiled = b.compile(program, weak_scalars=self.weak) if self.weak else b.compile(program)

    def __call__(self, call: Call):
        try:
            flat = self.compiled(*call.diff, *call.dynamic)
        except Exception as exc:
            self.explain(exc, call)
            raise
        if self.bare:
            flat = (flat,)
        seen = call.seen
        seen.out_tree, seen.aux_tree = self.out_tree, self.aux_tree
        n_out, end = self.n_out, self.n_out + self.n_blocks
        if end == len(flat) and not self.aux_static:  # no aux (the common case)
            return flat[:n_out], flat[n_out:], ()
        aux = list(flat[end:])
        for k, a in self.aux_static:
            aux.insert(k, a)
        return flat[:n_out], flat[n_out:end], tuple(aux)

    def explain(self, exc, call: Call):
        """Raise the error that says what to do when ``exc`` (raised by the compiled program for
        ``call``) comes from using a traced value as a Python value (a dynamic Python float, or an
        array: ``if x.max() > 0``); else return."""
        if _uses_value(exc):
            raise TypeError(_weak_hint(call, exc) if self.weak else _value_hint(call, exc)) from exc

    def _takes_as_given(self, call: Call) -> bool:
        """Does the compiled function take the leaves that ``call``'s plan converts as they are? Where it
        declares ``takes_numpy`` (``jax.jit`` takes NumPy arrays, as ``jnp.asarray`` would convert them,
        without a dispatched conversion per argument), for NumPy arrays (``np.ndarray`` itself) of a
        floating or complex dtype in native byte order, with no device to place on: what a repeat's key
        (type, shape and dtype) pins down. Anything else (a NumPy integer array, a scalar, another
        framework's array, ``device=``) is converted by the full path.

        The program gets a NumPy copy of each (a plain memory copy, no dispatch): ``jax.jit`` may read a
        NumPy argument in place while it computes after returning (asynchronous dispatch, zero-copy on
        the CPU), so a caller writing into the array right after the call would change a result it
        holds -- what ``jnp.asarray``'s copy prevented, and what ``jax.jit`` called directly allows."""
        if call.plan.device is not None or not getattr(self.compiled, "takes_numpy", False):
            return False
        for p in call.plan.convert:
            x = call.args[p]
            if type(x) is not np.ndarray or x.dtype.kind not in "fc" or not x.dtype.isnative:
                return False
        return True

    def flat_runner(self, call: Call, index=None):
        """A function of the arguments of calls that repeat ``call``'s signature (a flat signature:
        arrays of the backend, nothing to convert or place -- or NumPy arrays that the compiled function
        takes as they are, see :meth:`_takes_as_given` -- and dynamic Python floats), returning the
        program's flat outputs (only the one at ``index``, where given): what :meth:`__call__` does,
        without building a :class:`Call`. None where ``call`` is not such a call. With ``index``, for
        arguments in the program's own order: the runner ``(fn, index, failed)`` of :meth:`Repeats.run`
        instead of a function (one Python frame fewer on every repeat).

        A compiled function may offer ``specialize(args) -> (fn, translate)``: ``fn`` is itself, leaner,
        for arguments with the types, shapes and dtypes of ``args`` (those of the signature), and
        ``translate(exc)`` the error to raise for an error ``fn`` raised (None: that error). One that
        sets ``specialize_copies`` takes ``specialize(args, copies)``: ``fn`` then hands the program a copy
        of the NumPy arrays at positions ``copies`` itself.
        """
        plan = call.plan
        if call.treedef is not None or (plan.convert and not self._takes_as_given(call)):
            return None
        order = plan.diff_positions + plan.dynamic_positions
        if sorted(order) != list(range(len(call.args))):  # (a static leaf: not a repeat's signature)
            return None
        specialize = getattr(self.compiled, "specialize", None)
        # NumPy arrays handed to the program: each a private copy (see _takes_as_given), made by the
        # specialised function itself where it offers to (``specialize_copies``: one frame for the call)
        copies = tuple(sorted(order.index(p) for p in plan.convert))
        if specialize is None:
            fn, translate = self.compiled, None
        elif copies and getattr(self.compiled, "specialize_copies", False):
            (fn, translate), copies = specialize(tuple([call.args[p] for p in order]), copies), ()
        else:
            fn, translate = specialize(tuple([call.args[p] for p in order]))
        if copies:
            fn = numpy_copies(fn, copies)
        f, has_aux, fname = call.f, call.has_aux, call.fname
        in_order = order == tuple(range(len(order)))

        def failed(exc, args):
            self.explain(exc, Call(plan, None, f, args, args, None, has_aux, fname))
            other = None if translate is None else translate(exc)
            if other is not None:
                raise other from exc

        bare = self.bare
        if in_order and index is not None:  # the runner itself (Repeats.run calls fn; no closure in between)
            return (fn, None, failed) if bare else (fn, index, failed)
        if in_order and not bare:
            def run(args):
                try:
                    return fn(*args)
                except Exception as exc:
                    failed(exc, args)
                    raise
        else:
            def run(args):
                try:
                    flat = fn(*[args[p] for p in order])
                except Exception as exc:
                    failed(exc, args)
                    raise
                if bare:
                    flat = (flat,)
                return flat if index is None else flat[index]
        return run



def block_runner(call: Call, program: Program):
    """A ``finish`` for :meth:`Repeats.remember` of transforms whose result is their Jacobian blocks
    (``jacobian``, ``batched_jacobian``): where one differentiated argument (an int ``argnums``) and
    one output array, without aux, make the result the program's one block as it is (what
    :meth:`Call.blocks_tree` returns for such a call), the runner of that block; else None."""
    if (call.has_aux or program.aux_static or program.out_tree is not _LEAF or not call.plan.single
            or program.n_blocks != 1):
        return None
    return program.flat_runner(call, program.n_out)



def execute(call: Call, kernel, programs: BoundedCache | None = None, decision=None, keep_outputs=True,
            bare=False):
    """``kernel(backend, flat_f, leaves) -> (outputs, flat result blocks, aux)`` for this call: compiled
    when ``programs`` is given and the backend compiles, else eagerly. ``bare``: the kernel's outputs
    (with ``keep_outputs``), blocks and aux arrays are one array (see :class:`Program`)."""
    b = call.plan.backend
    if not call.diff:
        return _no_inputs(call)
    if programs is None or not b.capabilities.compile:
        outs, blocks, aux = kernel(b, call.flat_f, call.diff)
        return outs, blocks, (aux or ())
    key = programs.kind.key(call, decision)
    program = programs.get(key)
    if program is None:
        program = programs.put(key, Program(call.f, call, kernel, keep_outputs, bare))
        _count_program(programs, call)
    call.program = program  # (for Repeats.remember)
    return program(call)



#: Programs one argument may force (one per static value) before a warning says how to avoid it.
MANY_PROGRAMS = 8


def _count_program(programs: BoundedCache, call: Call):
    """Note the static values of each argument that built a new program; warn (once per transform)
    when one argument has forced more than :data:`MANY_PROGRAMS` of them."""
    if programs.warned or call.treedef is None:  # no treedef: every argument is an array
        return
    plan = call.plan
    dynamic = set(plan.diff_positions).union(plan.dynamic_positions)
    static = {}
    for p, (k, leaf) in enumerate(zip(_leaf_owners(call.treedef), call.template)):
        if p not in dynamic:
            token = _static_token(leaf)
            try:
                hash(token)
            except TypeError:
                token = id(leaf)
            static.setdefault(k, []).append(token)
    for k, tokens in static.items():
        values = programs.values_seen.setdefault(k, set())
        values.add(tuple(tokens))
        if len(values) > MANY_PROGRAMS:
            programs.warned, programs.values_seen = True, {}
            warnings.warn(_many_programs_message(call, k, len(values)), stacklevel=4)
            return



def _argument_name(call: Call, k: int) -> str:
    """``argument k`` with f's parameter name where it has one (``argument 1 ('lr')``)."""
    try:
        params = [p for p in inspect.signature(call.f).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return f"argument {k} ({params[k].name!r})"
    except (TypeError, ValueError, IndexError):
        return f"argument {k}"



def _many_programs_message(call: Call, k: int, n: int) -> str:
    arg = call.args[k]
    kind = type(arg).__name__
    if isinstance(arg, (float, complex)):
        how = ("it is named in static_argnums / static_argnames, so each value is compiled into its own program; "
               "leave it out of them to make it a dynamic input")
    elif isinstance(arg, (bool, int)):
        how = ("Python ints and bools are static (they may set shapes or select code); if this one is only a "
               "number, pass it as a 0-d array (np.asarray(value)) to make it a dynamic input")
    else:
        how = ("its non-array values are static; pass the numbers in it that change as arrays "
               "(np.asarray(value)) or Python floats to make them dynamic inputs")
    article = "an" if kind[:1] in "aeiou" else "a"
    return (f"{call.fname}(compile=True): {_argument_name(call, k)}, {article} {kind}, has forced {n} compiled "
            f"programs, one per value: {how}")



def _uses_value(exc) -> bool:
    """An error of a compiled program's trace from using a traced scalar as a Python value."""
    return uses_traced_value(exc) or (
        isinstance(exc, TypeError) and "symbolic" in str(exc) and "no value yet" in str(exc))  # a plugin's Array



def _value_hint(call: Call, exc) -> str:
    return (f"{call.fname}(compile=True): f used the value of an array as a Python value (an if or while on it, "
            f"bool(), float(), int(), a NumPy conversion); with compile=True f is traced once per signature into "
            f"one program (as jax.jit and tf.function do), where arrays have no values yet. Compute with the "
            f"namespace's functions (xp.where for a branch), pass what decides the branch as a Python value "
            f"(static), or use compile=False ({type(exc).__name__}: {_first_line(exc)})")



def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""



def _weak_hint(call: Call, exc) -> str:
    positions = [call.plan.dynamic_positions[i] for i in call.plan.weak]
    owners = sorted({_leaf_owners(optree.tree_structure(tuple(call.args)))[p] for p in positions})
    names = ", ".join(_argument_name(call, k) for k in owners)
    return (f"{call.fname}(compile=True): f used the value of a Python float as a Python value (a branch, "
            f"math.exp, an int); with compile=True Python floats and complex numbers are dynamic inputs of the "
            f"compiled program (traced scalars, as in jax.jit): here {names}. Name it in static_argnums (or "
            f"static_argnames) to compile one program per value, or compute with the namespace's functions "
            f"({type(exc).__name__}: {exc})")



def _no_inputs(call: Call):
    """No leaf to differentiate (an argument that is ``{}``, ``()``, ``[]`` or None): f is evaluated,
    and every result block is empty, as in JAX."""
    b = call.plan.backend
    result = b.evaluate(call.flat_f, ())
    outs, aux = result if call.has_aux else (result, ())
    return outs, (), aux
