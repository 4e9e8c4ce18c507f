"""What the transforms share, one floor below them (``_api`` and ``_batched`` both import it): the
Jacobian mode chosen by shape, the output shapes of a signature, the chunk size from a memory budget,
result blocks in their promoted dtype, and the wrapper's name.
"""

from __future__ import annotations

import inspect

from . import _checks, _memory
from ._dtypes import COMPLEX
from ._caches import BoundedCache
from ._call import Call


def _flatten_blocks(jac):
    return tuple(block for row in jac for block in row)


def promoted_blocks(b, outputs, leaves, jac):
    """``jac[i][j]`` in the dtype both output i and input j promote to, whatever the mode: reverse mode
    pulls back to the input's dtype, forward mode pushes to the output's, and ``mode="auto"`` must not
    change a result's dtype by choosing between them."""
    out = []
    for o, row in zip(outputs, jac):
        blocks = []
        for x, block in zip(leaves, row):
            want = _checks.promote(b.dtype(o), b.dtype(x))
            blocks.append(block if b.dtype(block) == want else b.cast(block, want))
        out.append(tuple(blocks))
    return tuple(out)


#: Why output shapes are kept per signature alone (see unigrad._caches).
SHAPES_WHY = ("the mode 'auto' picks, the scalar form of hessian: speed only, and a result that must not follow a "
              "shape that changed (hessian's scalar form) is re-checked on what f returned")


def output_shapes(shapes: BoundedCache, call: Call):
    """The shapes of ``f``'s outputs for this call's signature: one plain forward evaluation per
    signature (``Backend.output_shapes``: a backend that traces finds them without computing) (shapes follow from the signature: array shapes and exact non-array values; a compiled
    program's dynamic scalars are traced, so shapes cannot depend on them: its key leaves them out)."""
    known = shapes.lookup(call)
    if known is None:
        known = shapes.store(call, tuple(call.backend.output_shapes(call.flat_f, call.diff, call.has_aux)))
    return known


def choose_mode(shapes: BoundedCache, call: Call, per_example: bool) -> str:
    """``"fwd"`` when the (per-example) inputs have fewer elements than the outputs (fewer than
    ``backend.forward_ratio`` times: :func:`mode_for_shapes`), else ``"rev"``
    (a choice of speed only: both give the same Jacobian). A backend without true forward mode
    (``capabilities.forward_mode`` False: its JVP is two VJPs) always gets ``"rev"``. A complex input:
    ``"rev"`` whatever the shapes (for a function that is not holomorphic the two modes give different
    matrices; the reverse one is the house convention, the one ``grad`` and ``vjp`` follow), unless a
    complex output depends on a real input (then the kernel goes forward: :func:`real_to_complex`)."""
    b = call.backend
    if not b.capabilities.forward_mode:
        return "rev"
    if any(b.dtype(x) in COMPLEX for x in call.diff):  # one convention whatever the shapes (see conventions)
        return "rev"
    return mode_for_shapes(call, output_shapes(shapes, call), per_example)


def mode_for_shapes(call: Call, out_shapes, per_example: bool) -> str:
    """:func:`choose_mode`'s choice from the output shapes: ``"fwd"`` where the outputs have more than
    ``backend.forward_ratio`` times the inputs' elements (1 but on an engine whose forward mode costs
    more at small sizes: torch's, nested in another transform, runs several times slower than reverse)."""
    b = call.backend
    if not b.capabilities.forward_mode or any(b.dtype(x) in COMPLEX for x in call.diff):
        return "rev"
    skip = 1 if per_example else 0
    n_out = sum(_size(s[skip:]) for s in out_shapes)
    n_in = sum(_size(b.shape(x)[skip:]) for x in call.diff)
    return "fwd" if n_in * b.forward_ratio < n_out else "rev"


#: The name of the caches of signatures whose forward mode failed (one per transform that falls back).
FALLBACKS_NAME = "signatures whose forward mode raised (mode 'auto')"
#: Why the signatures whose forward mode failed are kept per signature alone (see unigrad._caches).
FALLBACKS_WHY = ("where mode='auto' chose forward mode and it raised while reverse mode worked, the next calls go "
                 "straight to reverse mode: speed only (both modes give the same derivative; a call whose reverse mode "
                 "raises too raises the forward error)")


def run_auto(fallbacks: BoundedCache | None, call: Call, run, first: str, fallback: str, fname: str):
    """``run(first)``, the mode ``"auto"`` chose from the shapes, unless it raises: then ``run(fallback)``.

    "auto" must never pick a mode ``f`` cannot do: an engine may have no forward rule for an operation
    (HIPS autograd's ``inv``), forward mode may refuse a function (a JAX ``custom_vjp``) or fail to
    vectorise it (TensorFlow's ``tf.cond`` / ``tf.scan`` under pfor), where reverse mode works. Both modes
    give the same derivative, so falling back changes speed, never the result. Where ``fallback`` raises
    too, the error is ``f``'s own (a bug reverse mode hits as well): the first error is raised, with a
    note naming the second. A signature that fell back is remembered in ``fallbacks`` (None: nothing is
    kept): its next calls run ``fallback`` at once. ``first == fallback``: ``run(first)`` alone.
    """
    if first == fallback or (fallbacks is not None and fallbacks.lookup(call) is not None):
        return run(fallback)
    try:
        return run(first)
    except Exception as exc:  # (KeyboardInterrupt and the like are not caught)
        error = exc
    try:
        result = run(fallback)
    except Exception as second:
        failed = second
    else:
        if fallbacks is not None:
            fallbacks.store(call, True)
        return result
    if hasattr(error, "add_note"):  # (Python 3.11+)
        error.add_note(f"{fname}: mode='auto' tried {fallback!r} after this error, and it raised too: "
                       f"{type(failed).__name__}: {_message(failed)}")
    raise error


def _message(exc) -> str:
    text = " ".join(str(exc).split())  # (a framework's message may start with a line that says little)
    return (text[:300] + "...") if len(text) > 300 else (text or "(no message)")


def _size(shape):
    n = 1
    for s in shape:
        n *= s
    return n


_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}


def budget_chunk(chunks: BoundedCache, shapes: BoundedCache, call: Call, chosen: str, per_example: bool,
                 budget: int, fname: str) -> int:
    """The chunk size that keeps a Jacobian within ``budget`` bytes, once per signature and mode: the
    peak of one VJP (rev) or JVP (fwd) of the whole call, measured on the backend, is what each basis
    vector of a chunk costs; the result itself is set aside first (see ``_memory.py``)."""
    known = chunks.lookup(call, chosen)
    if known is not None:
        return known
    b, skip = call.backend, 1 if per_example else 0
    out_shapes = output_shapes(shapes, call)
    n_out = sum(_size(s[skip:]) for s in out_shapes)
    n_in = sum(_size(b.shape(x)[skip:]) for x in call.diff)
    batch = b.shape(call.diff[0])[0] if per_example else 1
    itemsize = max([_ITEMSIZE.get(d, 8) for d in call.plan.dtypes] or [8])
    result_bytes = batch * n_out * n_in * itemsize
    if chosen == "rev":
        def one():
            outputs, vjp_fn, _ = b.vjp(call.flat_f, call.diff, has_aux=call.has_aux)
            return vjp_fn(tuple(b.ones_like(o) for o in outputs))
    else:
        def one():
            return b.jvp(call.flat_f, call.diff, tuple(b.ones_like(x) for x in call.diff), has_aux=call.has_aux)
    per_row = _memory.peak_bytes(b, one)
    n_rows = n_out if chosen == "rev" else n_in
    return chunks.store(call, _memory.chunk_for_budget(budget, n_rows, result_bytes, per_row, fname), chosen)


def _wraps(wrapper, f, kind):
    name = getattr(f, "__name__", type(f).__name__)
    wrapper.__name__ = f"{kind}({name})"
    wrapper.__qualname__ = wrapper.__name__
    wrapper.__doc__ = getattr(f, "__doc__", None)
    wrapper.__wrapped__ = f


def static_arguments(f, static_argnums, static_argnames, argnums, fname) -> frozenset:
    """The positions of ``f``'s arguments whose Python scalars a compiled program keeps static
    (``static_argnums`` and the positional parameters named in ``static_argnames``, as in ``jax.jit``).

    Negative positions count from the end of each call's arguments (resolved by the call). An
    argument both differentiated and static is a ValueError, and so is a name ``f`` has no
    positional parameter for.
    """
    nums = _int_tuple(static_argnums, "static_argnums", fname)
    names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames or ())
    if names:
        try:
            params = [p.name for p in inspect.signature(f).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        for name in names:
            if not isinstance(name, str) or name not in params:
                raise ValueError(f"{fname}: static_argnames names {name!r}, which is not a positional parameter of "
                                 f"f (its positional parameters: {params})")
            nums += (params.index(name),)
    if argnums is not None:
        diff = _int_tuple(argnums, "argnums", fname)
        both = sorted(set(diff) & set(nums))
        if both:
            raise ValueError(f"{fname}: argument {both[0]} is both differentiated (argnums={argnums!r}) and static "
                             f"(static_argnums / static_argnames); a static argument is a constant of the program")
    return frozenset(nums)


def _int_tuple(value, name, fname):
    if value is None:
        return ()
    values = (value,) if isinstance(value, int) else value
    try:
        values = tuple(values)
    except TypeError:
        values = (value,)
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{fname}: {name} must be an int or a tuple of ints; got {value!r}")
    return values


def real_to_complex(b, outputs, leaves) -> bool:
    """Does some complex output depend on some real input? Reverse mode cannot give such a block: a VJP
    with respect to a real input is real (the real part of ``c^T J``), so rows pulled back from unit
    cotangents hold ``Re J`` and lose ``Im J`` -- silently, where forward mode pushes real tangents
    and gets the complex columns. (JAX's ``jacrev`` refuses complex outputs for the same reason.)"""
    return any(b.dtype(o) in COMPLEX for o in outputs) and any(b.dtype(x) not in COMPLEX for x in leaves)


def reverse_complex_error(fname) -> ValueError:
    """The error of ``mode="rev"`` where :func:`real_to_complex` holds."""
    return ValueError(f"{fname}: reverse mode (mode='rev') cannot differentiate a complex output with respect to a "
                      f"real input (a real input's VJP is real: the imaginary part would be lost); use mode='fwd' "
                      f"or 'auto', or make the input complex")
