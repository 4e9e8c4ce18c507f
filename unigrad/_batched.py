"""Per-example Jacobians (``batched_jacobian``) and the probe that refuses dependent rows.

The sum trick: for ``f`` mapping a batch to a batch with independent rows, pulling back the k-th unit
cotangent of every example at once gives every example's row k in one VJP (forward mode: the k-th
unit tangent of every example gives every column k). The work is vectorised over the per-example
size, never a Python loop over the batch. It is exact only for independent rows, so the rows are
probed (``check_independence``); a verdict is kept for a signature only when it was reached at a
generic point (see :func:`_settle_independence`), never from values that may hide a coupling.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import _checks, _memory
from ._call import BoundedCache, Call, execute, prepare
from ._transform import _wraps, budget_chunk, choose_mode, promoted_blocks
from ._dtypes import COMPLEX

__all__ = ["batched_jacobian", "check_batch_independence"]

_INDEPENDENCE = ("once", "always", "never")


def batched_jacobian(f: Callable, argnums=0, *, mode: str = "auto", chunk_size: int | None = None,
                     has_aux: bool = False, check_independence: str = "once", separable: bool = False,
                     backend=None, compile: bool = False, device=None, memory_budget=None) -> Callable:
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
      check_independence: ``"once"`` (default) probes the rows on the first call of each
        signature -- one JVP with a random tangent on one example, at the call's point and at a
        random nearby point (so a coupling that vanishes at the call's values, such as a warm-up
        call with zeros, is still found) -- and keeps the verdict only when both probes were
        conclusive; ``"always"`` probes on every call; ``"never"`` trusts the caller. A dependent
        ``f`` (batch norm, ``x - x.mean(0)``) raises ValueError instead of returning wrong
        Jacobians; so does a probe that cannot decide (non-finite tangents).
      separable: the caller states that ``f`` may also be evaluated one example at a time,
        ``f(x)[b] == f(x[b:b+1])[0]`` (f uses neither the batch size nor positions in the batch).
        A backend may then vectorise batch-of-one Jacobians (``jax.vmap`` of ``jax.jacrev``), which
        its compiler can simplify better. Not checked: this is a statement about every input, and no
        sample of values can prove it. Default False.
      backend: backend name or object.
      compile: one compiled program per signature (``jax.jit``, ``tf.function``).
      device: place the inputs on this device.
      memory_budget: bytes or a size (``"2GB"``) for the result and the work together; the chunk
        size is chosen from the measured peak of one VJP (or JVP) of the batch, once per signature.
        Ignored when ``chunk_size`` is given.

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
    plans, shapes, settled, chunks = BoundedCache(), BoundedCache(64), BoundedCache(64), BoundedCache(64)
    programs = BoundedCache() if compile else None

    def kernel_for(chosen, chunk):
        def kernel(b, flat_f, leaves):
            method = b.per_example_jacobian if separable else b.batched_jacobian
            outs, jac, aux = method(flat_f, leaves, mode=chosen, chunk_size=chunk, has_aux=has_aux)
            return outs, tuple(block for row in promoted_blocks(b, outs, leaves, jac) for block in row), aux
        return kernel

    kernels = {"rev": kernel_for("rev", chunk_size), "fwd": kernel_for("fwd", chunk_size)}

    def batched_jacobian_f(*args):
        call = prepare(plans, f, args, argnums, has_aux, backend, "batched_jacobian", device)
        batch = _checks.batch_size(call.backend, call.diff, call.names, "batched_jacobian", "input")
        if batch == 0:
            return _empty_batched_jacobian(call, has_aux)
        call.seen.batch = batch
        if check_independence == "always" or (check_independence == "once" and settled.get(call.key) is None):
            if _settle_independence(call, batch, has_aux):
                settled.put(call.key, True)
        chosen = mode if mode != "auto" else choose_mode(shapes, call, per_example=True)
        kernel, decision = kernels[chosen], chosen
        if budget is not None:
            chunk = budget_chunk(chunks, shapes, call, chosen, True, budget, "batched_jacobian")
            kernel, decision = kernel_for(chosen, chunk), (chosen, chunk)
        _, blocks, aux = execute(call, kernel, programs, decision, keep_outputs=False)
        jac = call.blocks_tree(blocks)
        return (jac, call.aux(aux)) if has_aux else jac

    _wraps(batched_jacobian_f, f, "batched_jacobian")
    return _with_parameter_hint(batched_jacobian_f, f, argnums)


_BATCH_AXIS_ERRORS = ("batch size", "leading batch axis", "leading (batch) axes differ")


def _with_parameter_hint(run, f, argnums):
    """``run`` whose batch-axis errors also say where per-example gradients with respect to shared
    parameters are (the usual reason an argument has no batch axis)."""
    def batched_jacobian_f(*args):
        try:
            return run(*args)
        except ValueError as exc:
            text = str(exc)
            if not text.startswith("batched_jacobian:") or not any(k in text for k in _BATCH_AXIS_ERRORS):
                raise
            raise ValueError(
                f"{text}. batched_jacobian differentiates batched arguments (argnums={argnums!r}): every one needs "
                f"the examples on axis 0. For per-example gradients with respect to parameters shared by all "
                f"examples, use unigrad.per_example_grad(f, argnums=..., batch_argnum=...) (f returning one loss "
                f"per example), or unigrad.vmap(unigrad.grad(loss), in_axes=(None, 0)) with the loss of one "
                f"example") from None

    _wraps(batched_jacobian_f, f, "batched_jacobian")
    return batched_jacobian_f


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
    outputs, tangents_out, _ = b.jvp(call.flat_f, tuple(leaves), tuple(tangents), has_aux=has_aux)
    try:
        probed = [np.abs(b.to_numpy(to)).astype(np.float64) for to in tangents_out]
    except Exception:  # abstract values inside another framework transform (jit, grad): nothing to read
        return "abstract"
    verdict = "independent"
    for i, (o, d) in enumerate(zip(outputs, probed)):
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
                f"batched_jacobian: the rows of f are not independent: perturbing example {k} changes output "
                f"{i} of example {j} (|d out/d in| up to {d[j]:.3g}); per-example Jacobians would be wrong. "
                f"Use jacobian() for the full Jacobian (does f normalise over the batch, e.g. batch norm or "
                f"x - x.mean(0)?), or pass check_independence='never' if this is intended")
            error.dependent_rows = True  # told apart from a domain error of f at the probe's nearby point
            raise error
        if not finite.all():
            verdict = "inconclusive"
    return verdict


def check_batch_independence(f: Callable, *args, argnums=0, backend=None, seed: int = 0) -> None:
    """Probe whether ``f``'s rows (axis 0) are independent; raise ValueError if not.

    One JVP with a random tangent on one example, at the given point and at a random nearby point:
    any change to another example's outputs means ``batched_jacobian`` would be wrong for ``f``.

    Args:
      f: function from batched arrays to batched arrays.
      *args: the point.
      argnums: int or tuple of ints: the batched arguments to probe.
      backend: backend name or object.
      seed: seed of the random tangents.

    Returns:
      None; raises ValueError for dependent rows or a probe that cannot decide.

    Example:
      >>> unigrad.check_batch_independence(lambda x: x - x.mean(axis=0), np.ones((3, 2)))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: batched_jacobian: the rows of f are not independent: ...
    """
    call = prepare(BoundedCache(0), f, args, argnums, False, backend, "check_batch_independence")
    batch = _checks.batch_size(call.backend, call.diff, call.names, "check_batch_independence", "input")
    _settle_independence(call, batch, False, seed)
