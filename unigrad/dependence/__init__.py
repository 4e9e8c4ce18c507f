"""Dependence analysis of a traced program: sparsity patterns and proofs of independent rows.

One interpreter walks a recorded program in one neutral form (:class:`Program` of :class:`Node` s) -- the
NumPy tape's recording of a call, or a backend's own program read by its front-end
(``Backend.dependence_program``: a jaxpr in ``unigrad_jax``, a torch.fx graph of ATen operations in
``unigrad_torch``, a TensorFlow graph in ``unigrad_tensorflow``; a plugin's) -- and propagates abstract
values through one table of per-primitive rules (:mod:`._rules`; a front-end adds its operations with
:func:`register_rules`):

* element index sets (:mod:`._sets`): which inputs each output element depends on (the Jacobian's
  sparsity pattern), and which pairs of inputs interact non-linearly (the Hessian's);
* batch rows (:mod:`._rows`): whether every value is independent of the batch, a function of its own
  row along one axis, or mixes rows (and which operation, at which line of the user's code, mixed them).

Both are sound: an operation without a rule, control flow on a traced value, or an index computed from
the input widens the answer (to dense where it must) and records why (``pattern.reasons``); a pattern
is never smaller than the truth at any input.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np

from ._program import Aval, Node, Program, from_tape, nearby, same_structure, trace_tape, user_site  # noqa: F401
from ._rows import Mixed, Unknown, prove_rows  # noqa: F401
from ._rules import Rule, codes, op_name, register_rules, rule_for  # noqa: F401
from ._sets import SetInterpreter

# The analysis (jacobian_sparsity, hessian_sparsity, prove_rows) and what a backend's front-end builds its
# program from (Program, Node, Rule, register_rules, rule_for, codes, Mixed, Unknown: docs/plugins.md).
__all__ = ["jacobian_sparsity", "hessian_sparsity", "SparsityWarning", "prove_rows", "Program", "Node", "Aval", "Rule",
           "register_rules", "rule_for", "op_name", "codes", "Mixed", "Unknown"]


class SparsityWarning(UserWarning):
    """The detected pattern was widened (control flow on values, an operation without a rule)."""


def _sp():
    try:
        import scipy.sparse as sp
    except ImportError as exc:  # pragma: no cover - scipy is the [sparse] extra
        raise ImportError("unigrad.jacobian_sparsity needs scipy: pip install 'unigrad[sparse]'") from exc
    return sp


def _argnums(argnums, n_args, fname):
    nums = (argnums,) if isinstance(argnums, (int, np.integer)) else tuple(argnums)
    for a in nums:
        if not isinstance(a, (int, np.integer)) or not -n_args <= a < n_args:
            raise ValueError(f"{fname}: argnums {argnums!r} out of range for {n_args} positional argument(s)")
    return tuple(int(a) % n_args for a in nums)


def _program_of(f, args, argnums, backend, fname):
    """(program, reasons): f traced on the tape (portable code, whatever backend), else by the backend's
    own front-end (``Backend.dependence_program``: JAX-, torch- or TensorFlow-native code), else None with
    the reason."""
    from .. import _registry
    nums = _argnums(argnums, len(args), fname)
    b = _registry.resolve(backend, [a for a in args if a is not None])
    host = [np.asarray(b.to_numpy(a)) if b.is_array(a) else a for a in args]
    for k in nums:
        host[k] = np.asarray(host[k])
        if host[k].dtype.kind not in "fc":
            host[k] = host[k].astype(np.float64)

    def flat(*diff):
        call = list(host)
        for k, v in zip(nums, diff):
            call[k] = v
        return f(*call)

    try:
        from ..tape import NumpyBackend
        token = _registry.active_backend.set(NumpyBackend())
        try:
            diff = [host[k] for k in nums]
            program, _ = trace_tape(flat, diff, sites=True)
            if not program.reasons:  # the same program at a random nearby point, or it depends on values
                for scale in (4.0, 0.25, 0.01):
                    try:
                        other, _ = trace_tape(flat, nearby(diff, scale=scale))
                    except Exception:  # f undefined there (a domain error): try closer
                        continue
                    if not same_structure(program, other):
                        program.reasons.append("the recorded program changes with the input's values (a sort, an "
                                               "index or a branch computed from the input)")
                    break
        finally:
            _registry.active_backend.reset(token)
        return program, None
    except Exception as exc:  # not portable code: the backend's own program, if it reads one
        tape_error = f"{type(exc).__name__}: {exc}"
    try:
        program = _native_program(f, args, nums, b, host)
    except Exception as exc:
        return None, f"f could not be traced on the tape ({tape_error}) nor by the {b.name} backend " \
                     f"({type(exc).__name__}: {exc})"
    if program is not None:
        return program, None
    return None, f"f could not be traced on unigrad's tape ({tape_error}), and the {b.name} backend reads no " \
                 f"program of its own (Backend.dependence_program)"


def _native_program(f, args, nums, b, host):
    """``f``'s program as the backend ``b`` traces it (``Backend.dependence_program``; None where it reads
    none), the differentiated arguments ``host[k]`` converted to ``b``'s arrays, the others as given."""
    native = list(args)

    def on_backend(*diff):
        call = list(native)
        for k, v in zip(nums, diff):
            call[k] = v
        out = f(*call)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return b.dependence_program(on_backend, [b.asarray(host[k]) for k in nums])


def proved_on_backend(f, args, pattern, *, argnums=0, backend=None, hessian=False) -> bool:
    """Is ``pattern`` (a detected one, for instance read on the NumPy tape) proved for the program the
    backend runs: the pattern read from the backend's own program (a jaxpr, an ATen graph traced on fake
    tensors: shapes only, so it holds for every value of the signature), with nothing widened, lies inside
    it? False where the backend reads no program, cannot trace ``f`` or had to widen. A sparse transform
    whose pattern is proved so needs no check of its values (:mod:`unigrad.sparse`)."""
    from .. import _registry
    try:
        nums = _argnums(argnums, len(args), "proved_on_backend")
        b = _registry.resolve(backend, [a for a in args if a is not None])
        host = [np.asarray(b.to_numpy(a)) if b.is_array(a) else a for a in args]
        program = _native_program(f, args, nums, b, host)
    except Exception:
        return False
    if program is None or program.reasons:
        return False
    env, n = _input_sets(program)
    interp = SetInterpreter(n, hessian=hessian)
    interp.run(program, env)
    if interp.reasons:
        return False
    native = interp.hessian_pattern().tocsr() if hessian else _output_rows(program, env, n)
    if native.shape != pattern.shape:
        return False
    native = native.astype(bool)
    return (native.astype(np.int8) - native.multiply(pattern.astype(bool)).astype(np.int8)).count_nonzero() == 0


def _output_rows(program, env, n):
    """The Jacobian pattern of ``program``'s outputs (rows), from the interpreter's ``env``."""
    sp = _sp()
    rows = []
    for vid, shape in zip(program.outputs, program.output_shapes):
        size = int(np.prod(shape, dtype=np.int64))
        m = env.get(vid) if vid is not None else None
        rows.append(m if m is not None else sp.csr_array((size, n), dtype=bool))
    return sp.vstack(rows, format="csr").astype(bool) if rows else sp.csr_array((0, n), dtype=bool)


def _finish(matrix, reasons, fname):
    matrix.reasons = tuple(reasons)
    if reasons:
        warnings.warn(f"{fname}: the pattern was widened: " + "; ".join(reasons), SparsityWarning, stacklevel=3)
    return matrix


def _input_sets(program):
    sp = _sp()
    sizes = [int(np.prod(s, dtype=np.int64)) for s in program.input_shapes]
    n = sum(sizes)
    env, start = {}, 0
    for vid, size in zip(program.inputs, sizes):
        env[vid] = sp.csr_array((np.ones(size, dtype=bool), (np.arange(size), np.arange(start, start + size))),
                                shape=(size, n))
        start += size
    return env, n


def jacobian_sparsity(f: Callable, *args: Any, argnums=0, backend=None) -> Any:
    """The sparsity pattern of ``f``'s Jacobian, detected from its traced program.

    Portable ``f`` (``xp = unigrad.namespace(x)``) is traced once on the NumPy tape whatever backend
    its arguments belong to (the pattern is a property of the code); JAX-native ``f`` through its
    jaxpr. Sound: control flow on traced values, an index computed from the input, or an operation
    without a rule widens the pattern (to dense where it must), warns with :class:`SparsityWarning`,
    and lists why in ``pattern.reasons``; a non-zero of the Jacobian at any input is never missing.
    ``where`` counts both branches; matmul with a constant operand uses that operand's zeros.

    Args:
      f: function of arrays returning an array or a tuple of arrays.
      *args: the point (its values decide the shapes, and the branch taken by any control flow).
      argnums: int or tuple of ints: the arguments the Jacobian is taken with respect to.
      backend: backend name or object the arguments belong to (default: from the arguments).

    Returns:
      A boolean ``scipy.sparse.csr_array`` of shape (outputs, inputs): rows are the flattened outputs
      (concatenated in order), columns the flattened differentiated arguments (concatenated). Its
      ``reasons`` attribute is a tuple of strings, empty when no widening was needed.

    Example:
      >>> def f(x):
      ...     xp = unigrad.namespace(x)
      ...     return x[1:] * x[:-1] + xp.sin(x[1:])
      >>> unigrad.jacobian_sparsity(f, np.ones(4)).toarray().astype(int)
      array([[1, 1, 0, 0],
             [0, 1, 1, 0],
             [0, 0, 1, 1]])
    """
    return _pattern(f, args, argnums, backend, "jacobian_sparsity", hessian=False)


def hessian_sparsity(f: Callable, *args: Any, argnums=0, backend=None) -> Any:
    """The sparsity pattern of the Hessian of a scalar ``f``: which pairs of inputs interact non-linearly.

    Detected as :func:`jacobian_sparsity` is (the tape, or a jaxpr), tracking for every operation
    whether it is linear (``+``, sums, indexing: no pair), bilinear (``*``, matmul: pairs across its
    operands) or non-linear (``sin``, ``exp``: every pair within an element's inputs). For an ``f`` with
    several outputs the union over outputs. Sound, as :func:`jacobian_sparsity`.

    Args:
      f: function of arrays returning a scalar (or arrays: the union over their elements).
      *args: the point.
      argnums: int or tuple of ints: the arguments the Hessian is taken with respect to.
      backend: backend name or object the arguments belong to (default: from the arguments).

    Returns:
      A symmetric boolean ``scipy.sparse.csr_array`` (inputs x inputs) with a ``reasons`` attribute.

    Example:
      >>> def f(x):
      ...     xp = unigrad.namespace(x)
      ...     return xp.sum((x[1:] - x[:-1] ** 2) ** 2)
      >>> unigrad.hessian_sparsity(f, np.ones(3)).toarray().astype(int)
      array([[1, 1, 0],
             [1, 1, 1],
             [0, 1, 1]])
    """
    return _pattern(f, args, argnums, backend, "hessian_sparsity", hessian=True)


def _pattern(f, args, argnums, backend, fname, hessian):
    sp = _sp()
    program, failure = _program_of(f, args, argnums, backend, fname)
    if program is None:
        n = sum(int(np.size(args[k])) for k in _argnums(argnums, len(args), fname))
        m = n if hessian else _output_size(f, args, backend, fname, failure)
        return _finish(sp.csr_array(np.ones((m, n), dtype=bool)), [failure], fname)
    env, n = _input_sets(program)
    interp = SetInterpreter(n, hessian=hessian)
    interp.run(program, env)
    reasons = list(program.reasons) + interp.reasons
    if program.reasons:  # control flow or indices that depend on values: any path may be taken
        m = n if hessian else sum(int(np.prod(s, dtype=np.int64)) for s in program.output_shapes)
        return _finish(sp.csr_array(np.ones((m, n), dtype=bool)), reasons, fname)
    if hessian:
        return _finish(interp.hessian_pattern().tocsr(), reasons, fname)
    return _finish(_output_rows(program, env, n), reasons, fname)


def _output_size(f, args, backend, fname, failure):
    """The number of output elements of ``f``, from one evaluation on the backend (the arguments converted,
    as a transform would): the rows of a dense pattern where no program could be read. An ``f`` that cannot
    run either is an error that says both (never a pattern of a guessed size)."""
    from .. import _registry

    b = _registry.resolve(backend, [a for a in args if a is not None])
    call = tuple(b.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
    token = _registry.active_backend.set(b)
    try:
        out = b.evaluate(lambda *a: f(*a), call)
    except Exception as exc:
        raise TypeError(f"{fname}: f could not be traced to read its pattern ({failure}), nor evaluated on the "
                        f"{b.name} backend to find its output size ({type(exc).__name__}: {exc})") from exc
    finally:
        _registry.active_backend.reset(token)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(int(np.prod(b.shape(o), dtype=np.int64)) if b.is_array(o) else int(np.size(o)) for o in outs)
