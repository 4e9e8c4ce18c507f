"""Per-example Jacobians (``batched_jacobian``): rows proved independent from the traced program, or probed.

The sum trick: for ``f`` mapping a batch to a batch with independent rows, pulling back the k-th unit
cotangent of every example at once gives every example's row k in one VJP (forward mode: the k-th
unit tangent of every example gives every column k). The work is vectorised over the per-example
size, never a Python loop over the batch. It is exact only for independent rows, so the rows are
proved independent from the traced program (:func:`prove_independence`, :mod:`unigrad.dependence`):
the tape's recording of every call, a jaxpr, an ATen graph or a TensorFlow graph once per signature,
portable ``f`` on the tape for other backends. Only where no proof can be made are they probed (``check_independence``); a probe's verdict
is kept for a signature only when it was reached at a generic point (see :func:`_settle_independence`),
never from values that may hide a coupling.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import _checks, _memory
from ._caches import BoundedCache, CacheKind
from ._call import _LEAF, Call, prepare
from ._plan import PLANS_WHY
from ._program import PROGRAMS_WHY, block_runner, execute
from ._repeats import Miss, Repeats
from ._answer_check import checked_kernel, describe_rows, failed_rows, probed_kernel
from ._custom import custom_rules_seen
from ._transform import (FALLBACKS_NAME, FALLBACKS_WHY, SHAPES_WHY, _wraps, budget_chunk, choose_mode,
                         promoted_blocks, real_to_complex, reverse_complex_error, run_auto, static_arguments)
from ._dtypes import COMPLEX

__all__ = ["batched_jacobian", "check_batch_independence"]

_INDEPENDENCE = ("once", "always", "never")

# What batched_jacobian keeps, and what each entry depends on (unigrad._caches).
_T = "batched_jacobian"
PLANS = CacheKind(_T, "plans", why=PLANS_WHY)
SHAPES = CacheKind(_T, "output shapes", why=SHAPES_WHY, program=True)
CHUNKS = CacheKind(_T, "chunk sizes", why="from a memory budget: memory, not the result", program=True)
PROOFS = CacheKind(_T, "row proofs from the backend's program", ("state",),
                   "f traced by the backend (a jaxpr, an ATen graph, a TensorFlow graph) as it reads its Python state "
                   "now; the arrays f is given are unknown values of the program")
TAPE_PROOFS = CacheKind(_T, "row proofs on the tape", ("state", "values"),
                        "portable f traced on the NumPy tape, which reads the values of the arrays f is given (an index "
                        "array picks rows)")
SETTLED = CacheKind(_T, "probe verdicts", ("state", "values"),
                    "a probe runs f at the call's values; kept only where both probes were conclusive and no custom "
                    "rule (opaque to every proof) was met")
PROGRAMS = CacheKind(_T, "compiled programs", why=PROGRAMS_WHY, program=True)
FALLBACKS = CacheKind(_T, FALLBACKS_NAME, why=FALLBACKS_WHY, program=True)
REFUTED = CacheKind(_T, "refuted shortcuts", ("state",),
                    "a shortcut that computes one example alone (separable, a row program) whose answer failed its "
                    "check for this signature: the sum trick runs instead; f's program depends on its Python state")
TRACED = CacheKind(_T, "eager TensorFlow programs", ("state",),
                   "an eager call on a backend whose vectorised map traces anyway (TensorFlow's pfor) runs one program "
                   "traced per signature: a trace freezes f's Python state, which an eager call must see as it is now",
                   program=True)
REPEATS = CacheKind(_T, "compiled repeats", why="keyed by the arguments of a compiled call (Repeats); only calls whose "
                    "proof holds for the whole signature (or whose probed values are kept with them) are kept")


def batched_jacobian(f: Callable, argnums=0, *, mode: str = "auto", chunk_size: int | None = None,
                     has_aux: bool = False, check_independence: str = "once", separable: bool = False,
                     backend=None, compile: bool = False, device=None, memory_budget=None,
                     static_argnums=(), static_argnames=()) -> Callable:
    """Per-example Jacobians of ``f``, which maps a batch to a batch with independent rows.

    Every input and output has the batch on axis 0 (size B). The work is vectorised over B:
    the per-example Jacobians come from one sweep with a batch of cotangents (or tangents) the
    size of one example's output (or input), never from a Python loop over B.

    Args:
      f: function from batched arrays to batched arrays; row b of the output may depend only on
        row b of the inputs.
      argnums: int or tuple of ints.
      mode: ``"rev"``, ``"fwd"`` or ``"auto"`` (by per-example sizes).
      chunk_size: at most this many basis vectors at a time.
      has_aux: return ``(jacobians, aux)``.
      check_independence: the rows are proved independent from the traced program (the tape's
        recording of every call; a jaxpr, torch's ATen graph or a ``tf.function`` graph once per
        signature; portable ``f`` on the tape for other backends), and a dependent ``f`` (batch norm, ``x - x.mean(0)``) raises ValueError naming
        the operation and line, on every call. Only where no proof can be made (an operation
        without a row rule, ``f`` the tape cannot trace) the rows are probed -- one JVP with a
        random tangent on one example, at the call's point and at a random nearby point: with
        ``"once"`` (default) on the first call of each signature, the verdict kept only when both
        probes were conclusive; with ``"always"`` on every call. ``"never"``: no proof and no probe
        (the caller vouches). A probe that cannot decide (non-finite tangents) raises too. Blocks that
        do not stand on a proof over the program that runs (a probe's verdict, a custom rule, a proof
        on the tape for another engine, a one-example shortcut) are checked on every call by one JVP
        (or VJP) of the whole batch with a random vector on every row (``unigrad._answer_check``): a
        shortcut that fails it gives way to the sum trick, anything else raises ValueError naming the
        rows. With ``"always"`` blocks that stand on a proof are checked too.
      separable: the caller states that ``f`` may also be evaluated one example at a time,
        ``f(x)[b] == f(x[b:b+1])[0]`` (f uses neither the batch size nor positions in the batch).
        A backend may then vectorise batch-of-one Jacobians (``jax.vmap`` of ``jax.jacfwd``), which
        its compiler can simplify better. Its answer is checked as any shortcut's (above). JAX takes that
        form by itself in forward mode when its analysis shows it (rows independent, and no value made
        from the batch size or positions in a trace with a symbolic batch size). In reverse mode a
        proof over the program that runs takes the exact sum trick instead (as fast there, unchecked).
        Default False.
      backend: backend name or object.
      compile: one compiled program per signature (``jax.jit``, ``tf.function``), which reads the Python
        values ``f`` reads besides its arguments (a global, a closed-over NumPy array) when it is traced,
        as ``jax.jit`` does: pass what changes as an argument. Eager calls on TensorFlow run as one traced
        program per signature and per value of that Python state (its vectorised map would trace anew on
        every call): a changed global is seen, as in any eager call. What is kept between calls, and
        keyed on what: docs/conventions.md.
      device: place the inputs on this device.
      memory_budget: bytes or a size (``"2GB"``) for the result and the work together; the chunk
        size is chosen from the measured peak of one VJP (or JVP) of the batch, once per signature.
        Ignored when ``chunk_size`` is given.
      static_argnums: with ``compile=True``, positions of arguments whose Python floats are static
        (see :func:`unigrad.value_and_grad`); other Python floats are dynamic inputs.
      static_argnames: the same by parameter name.

    Returns:
      A function; each block has shape ``(B, *out_shape[1:], *in_shape[1:])``.

    Example:
      >>> x = np.ones((4, 3))
      >>> unigrad.batched_jacobian(lambda x: x ** 2)(x).shape
      (4, 3, 3)
    """
    _checks.check_mode(mode, "batched_jacobian")
    _checks.check_chunk(chunk_size, "batched_jacobian")
    if check_independence not in _INDEPENDENCE:
        raise ValueError(f"batched_jacobian: check_independence must be one of {_INDEPENDENCE}; "
                         f"got {check_independence!r}")
    if not isinstance(separable, bool):
        raise TypeError(f"batched_jacobian: separable must be True or False; got {separable!r}")
    budget = _memory.parse_budget(memory_budget, "batched_jacobian") if chunk_size is None else None
    plans, shapes, settled, chunks = BoundedCache(PLANS), BoundedCache(SHAPES, 64), BoundedCache(SETTLED, 64), \
        BoundedCache(CHUNKS, 64)
    proofs = Proofs()
    # compiled repeats whose proof (on the tape) or probe read the values of the arrays f is given: the
    # repeat key -> True, and (repeat key, those values) -> True for each value proved or probed
    needs_values, settled_values = BoundedCache(REPEATS, 64), BoundedCache(REPEATS, 64)
    checked_repeats = BoundedCache(REPEATS, 64)  # repeat keys whose program checks its answer
    refuted = BoundedCache(REFUTED, 64)
    fallbacks = BoundedCache(FALLBACKS, 64)
    programs = BoundedCache(PROGRAMS) if compile else None
    traced = BoundedCache(TRACED)  # eager calls on a backend that traces its per-example Jacobian anyway (see below)
    static = static_arguments(f, static_argnums, static_argnames, argnums, "batched_jacobian") if compile else None

    def b_method(per_example):
        # per_example: False (the sum trick) or True (declared separable, or a proof that says so)
        def method_of(b):
            return b.per_example_jacobian if per_example else b.batched_jacobian
        return method_of

    def kernel_for(chosen, chunk, per_example, recorded=None):
        method_of = b_method(per_example)

        def kernel(b, flat_f, leaves):
            if recorded is not None:  # the tape's recording that the proof read: swept, not recorded again
                outs, jac, aux = b.batched_jacobian(flat_f, leaves, mode=chosen, chunk_size=chunk, has_aux=has_aux,
                                                    recorded=recorded)
            else:
                outs, jac, aux = method_of(b)(flat_f, leaves, mode=chosen, chunk_size=chunk, has_aux=has_aux)
            if chosen == "rev" and real_to_complex(b, outs, leaves):  # rows would hold Re J alone
                if mode == "rev":
                    raise reverse_complex_error("batched_jacobian")
                outs, jac, aux = method_of(b)(flat_f, leaves, mode="fwd", chunk_size=chunk, has_aux=has_aux)
            return outs, tuple(block for row in promoted_blocks(b, outs, leaves, jac) for block in row), aux
        return kernel

    kernels = {(m, p): kernel_for(m, chunk_size, p) for m in ("rev", "fwd") for p in (False, True)}

    repeats = Repeats(static, backend, device) if compile else None

    def batched_jacobian_f(args, miss):
        """The call on ``args`` that :meth:`Repeats.run` did not run (``miss``: its :class:`Miss`, None
        without compile)."""
        key = None if miss is None else miss.key
        call = None if key is None else repeats.call(key, f, args, has_aux, "batched_jacobian")
        if call is not None and needs_values.entries.get(key):
            values = call.values
            if values is None or (key, values) not in settled_values.entries:
                call = None  # arrays f is given have values the proof (or probe) has not seen: the full path
        if call is not None:  # a repeat of a compiled signature whose rows were proved for the signature
            _, blocks, aux = call.program(call)
            if checked_repeats.entries.get(key):  # its program checks its answer (see below)
                blocks, rows, _ = _checked_blocks(call.backend, blocks)
                if rows:
                    call = None  # the full path decides: the exact form, or the error naming the rows
            if call is not None:
                jac = call.blocks_tree(blocks)
                return (jac, call.aux(aux)) if has_aux else jac
        call = prepare(plans, f, args, argnums, has_aux, backend, "batched_jacobian", device, static)
        batch = _checks.batch_size(call.backend, call.diff, call.names, "batched_jacobian", "input")
        if batch == 0:
            return _empty_batched_jacobian(call, has_aux)
        call.seen.batch = batch
        verdict, recorded, per_example, exact = "unknown", None, separable, False
        if check_independence != "never" and batch >= 2:
            verdict, detail, recorded, provable, exact = prove_independence(call, batch, has_aux, argnums, proofs)
            if verdict == "mixed":
                b = call.backend  # arrays f is given with another leading size: the differentiated are parameters?
                other = any(b.is_array(a) and len(b.shape(a)) and b.shape(a)[0] != batch for a in call.dynamic)
                raise _mixed_error(detail, _parameter_hint(argnums) if other else "")
            per_example = separable or (verdict == "row" and bool(provable))
            if per_example and refuted.lookup(call):  # its check failed before: the sum trick
                per_example = False
        if verdict != "row" and check_independence != "never":
            if check_independence == "always" or settled.lookup(call) is None:
                # no proof: the probe. A custom rule met on the way is opaque to every proof and may mix rows
                # at other values only: its verdict holds for this call alone ("once" probes every call)
                with custom_rules_seen() as seen:
                    independent = _settle_independence(call, batch, has_aux)
                if independent and not seen:
                    settled.store(call, True)
        chosen = mode if mode != "auto" else choose_mode(shapes, call, per_example=True)
        # The answer checks itself (unigrad._answer_check) wherever it does not stand on a proof over the
        # program that runs: a probe's verdict, a proof on the tape for another engine, a custom rule, a
        # shortcut that computes one example alone (separable, JAX's row program). check_independence="never":
        # the caller vouches.
        exact = exact and verdict == "row"

        def attempt(m):
            # Reverse mode over a program proved to keep its rows apart: the sum trick, exact, so unchecked (a
            # one-example shortcut is checked on every call; on JAX, the sum trick is as fast as the shortcut,
            # docs/performance.md). Forward mode keeps the shortcut, whose unbatched unit tangents fold into the
            # first product where the sum trick repeats them B times, unless the backend's sum trick holds them
            # once too (forward_sum_trick_folds: JAX).
            folds = m == "rev" or call.backend.forward_sum_trick_folds
            shortcut = per_example if not (exact and folds) else False
            # "always": the proof is checked too (one more product a call), as a probe runs every call
            check = check_independence != "never" and batch >= 2 and (
                check_independence == "always" or not (exact and not shortcut))
            return m, run(call, m, shortcut, recorded, check, key, verdict) + (shortcut,)

        if mode == "auto":  # forward mode that raises (no forward rule for f) falls back to reverse
            chosen, (blocks, aux, rows, shortcut) = run_auto(fallbacks, call, attempt, chosen, "rev",
                                                             "batched_jacobian")
        else:
            chosen, (blocks, aux, rows, shortcut) = attempt(chosen)
        if rows and shortcut:  # the shortcut's analysis was wrong: the sum trick, exact for independent rows
            refuted.store(call, True)
            blocks, aux, rows = run(call, chosen, False, None, not exact or check_independence == "always", key,
                                    verdict)
        if rows:
            raise _check_error(rows[0], rows[1])
        jac = call.blocks_tree(blocks)
        return (jac, call.aux(aux)) if has_aux else jac

    def checked_runner(call, program):
        """A runner for repeats of a signature whose program checks its answer (one block, no aux): the
        program's flat outputs, the check read, the block returned; a failed check takes the full path
        (which falls back from a refuted shortcut or raises)."""
        if (call.has_aux or program.aux_static or program.out_tree is not _LEAF or not call.plan.single
                or program.n_blocks != 2):
            return None
        flat = program.flat_runner(call)
        b = call.backend
        if flat is None:
            return None

        def whole(args):
            block, checked = flat(args)[program.n_out:]
            if failed_rows(b, checked)[0]:
                return batched_jacobian_f(args, None)
            return block
        return whole

    def run(call, chosen, per_example, recorded, check, key, verdict):
        """``(blocks, aux, failed)``: the per-example blocks by ``per_example``'s method, and where ``check``,
        checked (``failed``: ``(rows, worst)`` where the check failed, else None)."""
        if recorded is not None and chosen == "rev" and budget is None and programs is None:
            kernel, decision = kernel_for(chosen, chunk_size, per_example, recorded), None
        else:
            kernel = kernels.get((chosen, per_example)) or kernels.setdefault(
                (chosen, per_example), kernel_for(chosen, chunk_size, per_example))
            decision = (chosen, per_example)
        if budget is not None:
            chunk = budget_chunk(chunks, shapes, call, chosen, True, budget, "batched_jacobian")
            kernel, decision = kernel_for(chosen, chunk, per_example), (chosen, chunk, per_example)
        if check and per_example and budget is None and chunk_size is None and not has_aux and getattr(
                call.backend, "per_example_probe", False):
            # the shortcut checked through its own one-example function: no pass over the blocks (see
            # unigrad._answer_check.probed_kernel)
            method = b_method(per_example)

            def probed(b, flat_f, leaves, probe):
                outs, jac, aux, products = method(b)(flat_f, leaves, mode=chosen, chunk_size=None, has_aux=False,
                                                     probe=probe)
                return outs, tuple(block for row in promoted_blocks(b, outs, leaves, jac) for block in row), aux, \
                    products
            kernel = probed_kernel(probed, kernel, chosen == "fwd")
            decision = None if decision is None else (*decision, "probed")
        elif check:  # (in the blocks' own mode: the derivative rules the user gave, a custom_vjp's in reverse)
            kernel = checked_kernel(kernel, has_aux, forward=chosen == "fwd")
            decision = None if decision is None else (*decision, "checked")
        if programs is None and call.backend.traces_batched_jacobian:
            _, blocks, aux = traced_once(call, kernel, traced, decision)
        else:
            _, blocks, aux = execute(call, kernel, programs, decision, keep_outputs=False)
        failed = None
        if check:
            blocks, rows, worst = _checked_blocks(call.backend, blocks)
            failed = (rows, worst) if rows else None
        if key is not None and failed is None and (programs is not None or not call.backend.traces_batched_jacobian):
            # Repeats skip the proof and the probe: only when both were settled for the whole signature
            # (a proof kept per signature, not one made per call because the program changes with the
            # values; no Python float whose value the proof saw), or the caller vouches. The proof and the
            # probe read the values of the arrays f is given too (an index array): such a repeat keeps no
            # runner (Repeats.run would skip the check), and one with other values of them takes the full
            # path (settled_values). A program that checks its answer keeps a runner that reads the check
            # (checked_repeats), and is kept only once its check passed.
            if check_independence == "never":
                repeats.remember(key, call, block_runner)
            elif check_independence == "once" and not call.plan.weak:
                kept, by_value = proofs.kept(call)
                if kept and (verdict == "row" or settled.lookup(call)):
                    if call.plan.dynamic_positions and (by_value or verdict != "row"):  # values decided it
                        repeats.remember(key, call)
                        needs_values.put(key, True)
                        values = call.values
                        if values is not None:
                            settled_values.put((key, values), True)
                    else:
                        repeats.remember(key, call, checked_runner if check else block_runner)
                    if check:
                        checked_repeats.put(key, True)
                    else:
                        checked_repeats.entries.pop(key, None)
        return blocks, aux, failed

    return _with_parameter_hint(batched_jacobian_f, f, argnums, repeats)


_BATCH_AXIS_ERRORS = ("batch size", "leading batch axis", "leading (batch) axes differ")


def _with_parameter_hint(run, f, argnums, repeats):
    """The transform: a repeat that ``repeats`` (None without compile) runs whole, else ``run(args,
    miss)``; its batch-axis errors also say where per-example gradients with respect to shared
    parameters are (the usual reason an argument has no batch axis)."""
    def batched_jacobian_f(*args):
        try:
            if repeats is None:
                return run(args, None)
            miss = repeats.run(args)
            if type(miss) is not Miss:  # a repeat whose whole call is the program's one block
                return miss
            return run(args, miss)
        except ValueError as exc:
            text = str(exc)
            if not text.startswith("batched_jacobian:") or not any(k in text for k in _BATCH_AXIS_ERRORS):
                raise
            raise ValueError(f"{text}. {_parameter_hint(argnums)}") from None

    _wraps(batched_jacobian_f, f, "batched_jacobian")
    return batched_jacobian_f


def _parameter_hint(argnums) -> str:
    """What to use for per-example gradients with respect to parameters (an argument without a batch axis)."""
    return (f"batched_jacobian differentiates batched arguments (argnums={argnums!r}): every one needs the examples "
            f"on axis 0. For per-example gradients with respect to parameters shared by all examples, use "
            f"unigrad.per_example_grad(f, argnums=..., batch_argnum=...) (f returning one loss per example), or "
            f"unigrad.vmap(unigrad.grad(loss), in_axes=(None, 0)) with the loss of one example")


def _checked_blocks(b, blocks):
    """The blocks of a checking kernel without its check array, the rows whose check failed and the worst
    relative difference (:mod:`unigrad._answer_check`)."""
    blocks = tuple(blocks)
    checked, blocks = blocks[-1], blocks[:-1]
    try:
        rows, worst = failed_rows(b, checked)
    except Exception:  # abstract values inside another framework's transform (jax.jit): nothing to read there,
        rows, worst = [], 0.0  # as for the probe (docs/transforms.md)
    return blocks, rows, worst


def _check_error(rows, worst):
    error = ValueError(
        f"batched_jacobian: the per-example Jacobians fail their check: for a random vector on every example, "
        f"one JVP (VJP in reverse mode) of the whole batch differs from the per-example blocks in "
        f"{describe_rows(rows)} (relative "
        f"difference up to {worst:.3g}), so the rows of f are not independent here (an operation or a custom "
        f"rule that moves one example's derivative into another, perhaps only at some values). Per-example "
        f"Jacobians would be wrong. Use jacobian() for the full Jacobian, or pass check_independence='never' "
        f"if this is intended")
    error.dependent_rows = True
    return error


def _mixed_error(detail, hint=""):
    error = ValueError(
        f"batched_jacobian: the rows of f are not independent: {detail.describe()} mixes the examples of the "
        f"batch; per-example Jacobians would be wrong. Use jacobian() for the full Jacobian (does f normalise "
        f"over the batch, e.g. batch norm or x - x.mean(0)?), or pass check_independence='never' if this is "
        f"intended" + (f". {hint}" if hint else ""))
    error.dependent_rows = True
    return error


class Proofs:
    """The row proofs of one transform: ``program`` from the backend's own trace of ``f`` (per signature and
    Python state: the arrays ``f`` is given are unknown values there), ``tape`` from portable ``f`` on the
    NumPy tape (per value of those arrays too)."""

    __slots__ = ("program", "tape")

    def __init__(self, maxsize: int = 64):
        self.program, self.tape = BoundedCache(PROOFS, maxsize), BoundedCache(TAPE_PROOFS, maxsize)

    def kept(self, call: Call):
        """``(kept, by_value)`` for a call of a non-tape backend: whether a proof is kept that covers its
        signature (not one made per call), and whether it holds only for the values of the arrays f is given
        (read on the tape)."""
        cached = self.program.lookup(call)
        if cached is None:
            return False, False
        if cached[0] != _BY_VALUE:
            return True, False
        return self.tape.lookup(call) is not None, True


def prove_independence(call: Call, batch: int, has_aux: bool, argnums, proofs: Proofs):
    """Prove from the traced program whether ``f``'s rows are independent.

    Returns ``(verdict, detail, recorded, separable, exact)``: verdict ``"row"`` (proved independent),
    ``"mixed"`` (detail: the :class:`unigrad.dependence.Mixed` naming the operation and line) or
    ``"unknown"`` (an operation without a row rule, or no program to read: the caller probes);
    ``recorded`` the NumPy tape's recording of this call (swept by the caller, not recorded again);
    ``separable`` whether a row may be computed alone (the backend's per-example path); ``exact`` whether
    the proof was made over the program that runs (the tape's recording of this call, the backend's own
    program), with no custom rule in it (whose derivative no program shows), so the sum trick's answer
    needs no check.

    The NumPy tape: the recording of this call, read on every call (linear in its nodes), so values
    that change the program (control flow) are always proved for the values given. A backend with
    its own program (JAX's jaxpr): once per signature. Other backends: portable ``f`` traced on the
    tape, once per signature when the recorded program does not change with the values (checked at a
    random nearby point), else on every call.
    """
    from . import dependence
    b = call.backend
    if b.name == "numpy":
        from .tape import _core
        with custom_rules_seen() as seen:
            recorded = _core.record(call.flat_f, call.diff, has_aux)
        trace, outs, out_idx, _ = recorded
        program = dependence.from_tape(trace, len(call.diff), out_idx, call.diff, outs)
        verdict, detail = dependence.prove_rows(program, batch)
        if verdict == "mixed":
            detail = _located(call.flat_f, call.diff, has_aux, batch) or detail
        return verdict, detail, recorded, False, not seen
    cached = proofs.program.lookup(call)
    if cached is not None and cached[0] != _BY_VALUE:
        return cached[0], cached[1], None, cached[2], True
    if cached is None:
        try:
            with custom_rules_seen() as seen:
                got = b.batch_rows(call.flat_f, call.diff, has_aux=has_aux)
                if got is None:  # the backend's program in the neutral form, read here
                    got = _program_rows(b, call, batch, has_aux)
            if got is not None and seen:  # the derivative is the rule's, which the program does not show
                got = ("unknown", f"f calls {seen[0]}, whose derivative is a custom rule", False)
        except Exception as exc:  # the backend could not trace f: portable code may still be read on the tape
            got = None
            failure = ("unknown", f"{b.name} could not trace f ({type(exc).__name__}: {exc})", False)
        else:
            failure = None
        if got is not None and got[0] != "unknown":  # the backend's own program, where the arrays f is given
            proofs.program.store(call, got)  # are unknown values: the proof holds for the signature (and state)
            return got[0], got[1], None, got[2], True
        if got is not None:  # an operation without a row rule (or a custom rule): portable f may still be
            failure = got    # proved on the tape, else this is the answer
        proofs.program.store(call, (_BY_VALUE, failure))
    else:
        failure = cached[1]
    # Portable f on the tape, which reads the values of the arrays f is given (an index array picks rows):
    # its proof is kept per value of them too (TAPE_PROOFS), not per signature.
    cached = proofs.tape.lookup(call)
    if cached is not None:
        return cached[0], cached[1], None, cached[2], False
    got, per_call = _tape_proof(call, batch, has_aux, argnums)
    if got[0] == "unknown" and failure is not None:
        got = failure
    if not per_call:
        proofs.tape.store(call, got)
    return got[0], got[1], None, got[2], False


_BY_VALUE = "by value"  # a signature whose proof is read on the tape, per value of the arrays f is given


def _program_rows(b, call: Call, batch: int, has_aux: bool):
    """``batch_rows``' answer from ``b.dependence_program`` (None where the backend has none)."""
    program = b.dependence_program(call.flat_f, call.diff, has_aux=has_aux, unknown=call.dynamic)
    if program is None:
        return None
    from .dependence import prove_rows

    verdict, detail = prove_rows(program, batch)
    return verdict, detail, False


def _tape_proof(call: Call, batch, has_aux, argnums):
    """Portable ``f`` traced on the NumPy tape with the call's values: ``((verdict, detail, False),
    per_call)``, per_call when the program changes with the values (it must be proved on every call)."""
    import optree

    from . import dependence
    b = call.backend
    try:
        host = optree.tree_map(lambda a: np.asarray(b.to_numpy(a)) if b.is_array(a) else a, list(call.args),
                               none_is_leaf=True)
        np_call = prepare(BoundedCache(PLANS, 0), call.f, tuple(host), argnums, has_aux, "numpy", "batched_jacobian")

        def outputs(*leaves):
            result = np_call.flat_f(*leaves)
            return tuple(result[0]) if has_aux else tuple(result)

        diff = [np.asarray(x) for x in np_call.diff]
        program, _ = dependence.trace_tape(outputs, diff, sites=True)
        per_call = bool(program.reasons)
        if not per_call:
            try:
                other, _ = dependence.trace_tape(outputs, dependence.nearby(diff))
                per_call = not dependence.same_structure(program, other)
            except Exception:
                per_call = True
    except Exception as exc:  # not portable code (f calls its framework directly): the probe decides
        return ("unknown", f"f could not be traced on the NumPy tape ({type(exc).__name__}: {exc})", False), False
    verdict, detail = dependence.prove_rows(program, batch)
    return (verdict, detail, False), per_call


def _located(flat_f, leaves, has_aux, batch):
    """The operation that mixes rows with the user's file and line: the call traced again with its
    sites recorded (on the error path only). None when that cannot be done (nested transforms)."""
    from . import dependence
    try:
        def outputs(*x):
            result = flat_f(*x)
            return tuple(result[0]) if has_aux else tuple(result)
        program, _ = dependence.trace_tape(outputs, [np.asarray(x) for x in leaves], sites=True)
        verdict, detail = dependence.prove_rows(program, batch)
    except Exception:
        return None
    return detail if verdict == "mixed" else None
_EAGER = object()  # a signature whose f could not be traced: it runs eagerly


def traced_once(call: Call, kernel, traced: BoundedCache, decision):
    """An eager call on a backend whose vectorised per-example Jacobian traces a program on every
    eager call (TensorFlow's pfor wraps its loop in a new ``tf.function`` each time: a trace per call,
    and its "retracing" warnings): run it as one program per signature instead, and per value of the
    Python state ``f`` reads (``traced``'s kind depends on it: a trace freezes it, and an eager call must
    see it as it is now). An ``f`` that cannot be traced (it reads values, ``x.numpy()``) runs eagerly,
    as before, for that signature and state."""
    if traced.lookup(call, decision) is _EAGER:
        return execute(call, kernel, None)
    try:
        return execute(call, kernel, traced, decision, keep_outputs=False)
    except Exception:
        traced.store(call, _EAGER, decision)  # replaces the program that failed to trace
        return execute(call, kernel, None)


def _empty_batched_jacobian(call: Call, has_aux):
    """Batch size 0 (which torch's vmap and TensorFlow's batch_jacobian reject), or nothing to
    differentiate: f's output shapes from one evaluation, and empty blocks."""
    b = call.backend
    result = b.evaluate(call.flat_f, call.diff)
    outputs, aux = (result if has_aux else (result, None))
    jac = tuple(tuple(b.zeros((0, *b.shape(o)[1:], *b.shape(x)[1:]), b.dtype(o), device=b.device(o))
                      for x in call.diff) for o in outputs)
    out = call.jacobian_tree(jac)
    return (out, call.aux(tuple(b.stop_gradient(a) if b.is_array(a) else a for a in aux))) if has_aux else out


def _settle_independence(call: Call, batch: int, has_aux: bool, seed: int = 0) -> bool:
    """Probe the rows at the call's point and at a random nearby point; raise ValueError if either finds
    them dependent, or if neither can decide (non-finite tangents at both). Returns whether the verdict
    "independent" is settled for the signature: both probes ran on concrete values and were
    conclusive. A probe at one point alone cannot settle it: ``x * mean(x)`` is coupled, yet its
    coupling vanishes where x is 0; and at a point where f's derivatives are infinite the tangents of
    independent rows are NaN (inf * 0)."""
    if batch < 2:
        return True
    here = _probe(call, call.diff, batch, has_aux, seed)
    if here == "abstract":  # inside another framework's transform (jit, grad): probed on a concrete call
        return False
    try:
        elsewhere = _probe(call, _nearby(call, seed), batch, has_aux, seed + 1)
    except ValueError as exc:
        if getattr(exc, "dependent_rows", False):
            raise
        elsewhere = "inconclusive"
    except Exception:  # f is not defined at the random point (a domain error)
        elsewhere = "inconclusive"
    if here == "inconclusive" and elsewhere != "independent":
        raise ValueError("batched_jacobian: cannot tell whether the rows of f are independent: the probe's "
                         "tangents are not finite at this point (inf or NaN derivatives), nor at a random point "
                         "nearby; pass check_independence='never' if the rows are independent")
    return here == "independent" and elsewhere == "independent"


def _nearby(call: Call, seed: int):
    """The differentiated leaves moved to a random point near the call's: generic values, where a
    coupling that vanishes at special values (zeros, a warm-up call) does not. Real values move away
    from zero, so a function defined for positive inputs stays defined."""
    b = call.backend
    rng = np.random.default_rng(seed + 12345)
    moved = []
    for x in call.diff:
        v = b.to_numpy(x)
        scale = float(np.mean(np.abs(v))) if v.size else 1.0
        scale = scale if np.isfinite(scale) and scale > 0 else 1.0
        step = 0.25 * (np.abs(v) + scale) * np.abs(rng.standard_normal(v.shape))
        if v.dtype.kind == "c":
            step = step * np.exp(2j * np.pi * rng.random(v.shape))
        else:  # away from zero, keeping the sign: inputs stay in domains such as x > 0 (sqrt, log)
            step = np.where(v < 0, -step, step)
        moved.append(b.asarray(np.asarray(v + step, dtype=v.dtype), device=b.device(x)))
    return tuple(moved)


def _probe(call: Call, leaves, batch, has_aux, seed):
    """One JVP with a random tangent on one example: ``"independent"``, ``"inconclusive"`` (non-finite
    tangents), ``"abstract"`` (no concrete values to read), or a ValueError for dependent rows."""
    b = call.backend
    rng = np.random.default_rng(seed + batch)
    k = int(rng.integers(batch))
    tangents = []
    for x in leaves:
        shape = b.shape(x)
        v = np.zeros(shape, dtype=np.complex128 if b.dtype(x) in COMPLEX else np.float64)
        v[k] = rng.standard_normal(shape[1:])
        tangents.append(b.asarray(v, dtype=b.dtype(x), device=b.device(x)))
    try:
        outputs, tangents_out, _ = b.jvp(call.flat_f, tuple(leaves), tuple(tangents), has_aux=has_aux)
    except Exception as exc:  # f has no forward mode (a jax.custom_vjp function): the same probe, reversed
        try:
            return _probe_reverse(call, leaves, batch, has_aux, rng, k)
        except ValueError as rev:
            if getattr(rev, "dependent_rows", False):
                raise
            raise exc from None
        except Exception:
            raise exc from None
    try:
        probed = [np.abs(b.to_numpy(to)).astype(np.float64) for to in tangents_out]
    except Exception:  # abstract values inside another framework transform (jit, grad): nothing to read
        return "abstract"
    return _verdict(b, outputs, probed, batch, k, "perturbing example {k} changes output {i} of example {j}")


def _probe_reverse(call: Call, leaves, batch, has_aux, rng, k):
    """The probe as one VJP: a random cotangent on example ``k`` of every batched output; any other
    example's input cotangent above rounding is a coupling (row k of the outputs reads row j)."""
    b = call.backend
    outputs, vjp_fn, _ = b.vjp(call.flat_f, tuple(leaves), has_aux=has_aux)
    cotangents = []
    for o in outputs:
        shape = b.shape(o)
        v = np.zeros(shape, dtype=np.complex128 if b.dtype(o) in COMPLEX else np.float64)
        if len(shape) and shape[0] == batch:
            v[k] = rng.standard_normal(shape[1:])
        cotangents.append(b.asarray(v, dtype=b.dtype(o), device=b.device(o)))
    grads = vjp_fn(tuple(cotangents))
    try:
        probed = [np.abs(b.to_numpy(g)).astype(np.float64) for g in grads]
    except Exception:  # abstract values inside another framework transform (jit, grad): nothing to read
        return "abstract"
    return _verdict(b, leaves, probed, batch, k, "example {k} of the outputs depends on example {j} of input {i}")


def _verdict(b, values, probed, batch, k, says):
    """``"independent"`` or ``"inconclusive"`` from the probed derivatives (``probed[i]`` the size of
    ``values[i]``; only row ``k`` moved), or a ValueError for dependent rows."""
    verdict = "independent"
    for i, (o, d) in enumerate(zip(values, probed)):
        if d.ndim == 0 or d.shape[0] != batch:
            continue
        d = d.reshape(batch, -1)
        finite = np.isfinite(d).all(axis=1)
        d = np.where(np.isfinite(d), d, 0.0).max(axis=1, initial=0.0)
        own, d[k] = d[k], 0.0
        finite[k] = True
        j = int(np.argmax(d))
        eps = np.finfo(np.float64 if b.dtype(o) in ("float64", "complex128") else np.float32).eps
        # An example whose inputs do not move has exactly zero tangents (0 * x is 0): anything above
        # rounding relative to the moved example's own change is a coupling.
        if d[j] > 100 * eps * own or (own == 0 and d[j] > 0):
            error = ValueError(
                f"batched_jacobian: the rows of f are not independent: {says.format(k=k, i=i, j=j)} "
                f"(|d out/d in| up to {d[j]:.3g}); per-example Jacobians would be wrong. "
                f"Use jacobian() for the full Jacobian (does f normalise over the batch, e.g. batch norm or "
                f"x - x.mean(0)?), or pass check_independence='never' if this is intended")
            error.dependent_rows = True  # told apart from a domain error of f at the probe's nearby point
            raise error
        if not finite.all():
            verdict = "inconclusive"
    return verdict


def check_batch_independence(f: Callable, *args, argnums=0, backend=None, seed: int = 0) -> None:
    """Check whether ``f``'s rows (axis 0) are independent; raise ValueError if not.

    As ``batched_jacobian`` does: a proof from the traced program (the operation that mixes rows is
    named), and only where none can be made, a probe (one JVP with a random tangent on one example,
    at the given point and at a random nearby point).

    Args:
      f: function from batched arrays to batched arrays.
      *args: the point.
      argnums: int or tuple of ints: the batched arguments to check.
      backend: backend name or object.
      seed: seed of the probe's random tangents.

    Returns:
      None; raises ValueError for dependent rows or a probe that cannot decide.

    Example:
      >>> unigrad.check_batch_independence(lambda x: x - x.mean(axis=0), np.ones((3, 2)))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: batched_jacobian: the rows of f are not independent: ...
    """
    call = prepare(BoundedCache(PLANS, 0), f, args, argnums, False, backend, "check_batch_independence")
    batch = _checks.batch_size(call.backend, call.diff, call.names, "check_batch_independence", "input")
    if batch >= 2:
        verdict, detail, _, _, _ = prove_independence(call, batch, False, argnums, Proofs(0))
        if verdict == "mixed":
            raise _mixed_error(detail)
        if verdict == "row":
            return
    _settle_independence(call, batch, False, seed)
