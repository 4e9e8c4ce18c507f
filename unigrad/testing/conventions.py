"""Measure what each backend returns at non-differentiable points, and write the table.

    python -m unigrad.testing.conventions              # print the Markdown table
    python -m unigrad.testing.conventions --write docs/conventions.md
    python -m unigrad.testing.conventions --check docs/conventions.md   # exit 1 if stale

The table is measured, never typed: it stays true as frameworks change. ``KINKS`` is also
what ``compare`` and the conformance suite consult to tell a convention difference from a bug.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

import unigrad

__all__ = ["KINKS", "Kink", "measure", "render", "parse"]


@dataclass(frozen=True)
class Kink:
    name: str
    expression: str  # as shown in the table
    fn: Callable  # portable function of the arguments
    args: tuple  # the non-differentiable point
    argnums: tuple = (0,)


def _xp(*a):
    return unigrad.namespace(*a)


def _relu(x):
    """The framework's own relu: the namespace's, else ``jax.nn.relu`` / ``tf.nn.relu``."""
    xp = _xp(x)
    if hasattr(xp, "relu"):
        return xp.relu(x)
    name = getattr(xp, "__name__", "")
    if name in ("jax.numpy", "unigrad_jax._namespace"):
        import jax

        return jax.nn.relu(x)
    if "tensorflow" in name:
        import tensorflow as tf

        return tf.nn.relu(x)
    raise AttributeError(f"the namespace {name or xp!r} has no relu")


KINKS = (
    Kink("abs at 0", "d/dx abs(x), x = 0", lambda x: _xp(x).abs(x), (0.0,)),
    Kink("relu at 0", "d/dx maximum(x, 0), x = 0", lambda x: _xp(x).maximum(x, 0.0), (0.0,)),
    Kink("maximum(0, x) at 0", "d/dx maximum(0, x), x = 0", lambda x: _xp(x).maximum(0.0, x), (0.0,)),
    Kink("minimum(x, 0) at 0", "d/dx minimum(x, 0), x = 0", lambda x: _xp(x).minimum(x, 0.0), (0.0,)),
    Kink("minimum(0, x) at 0", "d/dx minimum(0, x), x = 0", lambda x: _xp(x).minimum(0.0, x), (0.0,)),
    Kink("native relu at 0", "d/dx relu(x), x = 0 (the framework's own relu)", _relu, (0.0,)),
    Kink("maximum tie", "d/d(x, y) maximum(x, y), x = y = 1", lambda x, y: _xp(x, y).maximum(x, y), (1.0, 1.0),
         (0, 1)),
    Kink("maximum tie, swapped", "d/d(x, y) maximum(y, x), x = y = 1", lambda x, y: _xp(x, y).maximum(y, x),
         (1.0, 1.0), (0, 1)),
    Kink("minimum tie", "d/d(x, y) minimum(x, y), x = y = 1", lambda x, y: _xp(x, y).minimum(x, y), (1.0, 1.0),
         (0, 1)),
    Kink("minimum tie, swapped", "d/d(x, y) minimum(y, x), x = y = 1", lambda x, y: _xp(x, y).minimum(y, x),
         (1.0, 1.0), (0, 1)),
    Kink("max reduction tie", "d/dx max(x), x = [1, 1, 0]", lambda x: _xp(x).max(x), (np.array([1.0, 1.0, 0.0]),)),
    Kink("max of empty", "d/dx max(x), x = [] (empty)", lambda x: _xp(x).max(x), (np.zeros(0),)),
    Kink("median, even count", "d/dx median(x), x = [3, 1, 2, 0]", lambda x: _xp(x).median(x),
         (np.array([3.0, 1.0, 2.0, 0.0]),)),
    Kink("clip lower bound", "d/dx clip(x, 0, 1), x = 0", lambda x: _xp(x).clip(x, 0.0, 1.0), (0.0,)),
    Kink("clip upper bound", "d/dx clip(x, 0, 1), x = 1", lambda x: _xp(x).clip(x, 0.0, 1.0), (1.0,)),
    Kink("sqrt at 0", "d/dx sqrt(x), x = 0", lambda x: _xp(x).sqrt(x), (0.0,)),
    Kink("norm at 0", "d/dx vector_norm(x), x = [0, 0]", lambda x: _xp(x).linalg.vector_norm(x),
         (np.zeros(2),)),
    Kink("safe_norm at 0", "d/dx unigrad.safe_norm(x), x = [0, 0]", lambda x: unigrad.safe_norm(x), (np.zeros(2),)),
    Kink("where, NaN in untaken branch", "d/dx where(x > 0, sqrt(x), 0), x = -1",
         lambda x: _xp(x).where(x > 0, _xp(x).sqrt(x), 0.0 * x), (-1.0,)),
    Kink("where, log trap", "d/dx where(x > 0, log(x), 0), x = 0",
         lambda x: _xp(x).where(x > 0, _xp(x).log(x), 0.0 * x), (0.0,)),
    Kink("safe_where", "d/dx unigrad.safe_where(x > 0, x, log, 0), x = 0",
         lambda x: unigrad.safe_where(x > 0, x, _xp(x).log, 0.0), (0.0,)),
    Kink("x ** 0 at 0", "d/dx x ** 0.0, x = 0", lambda x: x ** 0.0, (0.0,)),
    Kink("pow(x, 0.0) at 0", "d/dx pow(x, 0.0) (the namespace function), x = 0", lambda x: _xp(x).pow(x, 0.0),
         (0.0,)),
    Kink("x ** int 0 at 0", "d/dx x ** 0 (integer exponent), x = 0", lambda x: x ** 0, (0.0,)),
    Kink("pow, base 0", "d/dy x ** y, x = 0, y = 2", lambda x, y: x ** y, (0.0, 2.0), (1,)),
    Kink("pow, negative base", "d/dy x ** y, x = -2, y = 2", lambda x, y: x ** y, (-2.0, 2.0), (1,)),
    Kink("pow, negative base, both", "d/d(x, y) x ** y, x = -2, y = 2", lambda x, y: x ** y, (-2.0, 2.0), (0, 1)),
    Kink("pow, base 0, both", "d/d(x, y) x ** y, x = 0, y = 0.5", lambda x, y: x ** y, (0.0, 0.5), (0, 1)),
    Kink("floor", "d/dx floor(x), x = 1.5", lambda x: _xp(x).floor(x), (1.5,)),
    Kink("round", "d/dx round(x), x = 0.5", lambda x: _xp(x).round(x), (0.5,)),
    Kink("sign at 0", "d/dx sign(x), x = 0", lambda x: _xp(x).sign(x), (0.0,)),
)


def _format(value) -> str:
    v = np.asarray(value, dtype=np.float64)
    if v.ndim == 0:
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f"{f:g}"
    return "[" + ", ".join(_format(e) for e in v.ravel()) + "]"


def _cell(transform, kink, name) -> str:
    """The derivative of ``kink`` at its point by ``transform`` (``grad`` or ``jacfwd``: for a scalar
    function both give the gradient's shape), formatted, or ``error: <exception>``."""
    def scalar(*a, _k=kink):
        return _xp(*a).sum(_k.fn(*a))
    try:
        g = transform(scalar, argnums=kink.argnums, backend=name)(*[np.asarray(a, dtype=np.float64) for a in kink.args])
        return ", ".join(_format(unigrad.to_numpy(v)) for v in g) if len(kink.argnums) > 1 \
            else _format(unigrad.to_numpy(g[0]))
    except Exception as exc:  # a backend that cannot even evaluate the point is worth a cell too
        return f"error: {type(exc).__name__}"


def measure(backends=None, kinks=KINKS) -> dict[str, dict[str, str]]:
    """``{kink name: {backend: cell}}`` for the installed backends: the derivative measured in reverse mode
    (``grad``) and in forward mode (``jacfwd``); the cell is the value when both modes give it, and
    ``rev A / fwd B`` when they differ."""
    if backends is None:
        backends = [n for n, info in unigrad.backends().items() if info["available"]]
    table = {}
    for kink in kinks:
        row = {}
        for name in backends:
            rev, fwd = _cell(unigrad.grad, kink, name), _cell(unigrad.jacfwd, kink, name)
            row[name] = rev if rev == fwd else f"rev {rev} / fwd {fwd}"
        table[kink.name] = row
    return table


def render(table: dict[str, dict[str, str]], versions: dict[str, str] | None = None) -> str:
    backends = list(next(iter(table.values())).keys()) if table else []
    lines = [
        "# Non-differentiable points: what each backend returns",
        "",
        "Generated, never typed: every cell is *measured* in float64, in reverse mode through",
        "`unigrad.grad(..., backend=...)` and in forward mode through `unigrad.jacfwd`; a cell shows one value",
        "where both modes give it and `rev A / fwd B` where they differ (an error cell names the exception).",
        "Regenerate the whole file, after any change to a backend or a rule, with one command (all installed",
        "backends):",
        "",
        "    python -m unigrad.testing.conventions --write docs/conventions.md",
        "",
        "`tests/test_conventions.py` fails when a committed cell differs from a fresh measurement. Where",
        "backends differ here, `unigrad.testing.compare` reports a *convention difference*, not a",
        "failure. The tape's rules are documented in docs/tape.md.",
        "",
    ]
    if versions:
        lines.append("Measured with: " + ", ".join(f"{b} {versions[b]}" for b in backends if b in versions) + ".")
        lines.append("")
    lines.append("| point | " + " | ".join(backends) + " |")
    lines.append("|---|" + "---|" * len(backends))
    expressions = {k.name: k.expression for k in KINKS}
    for name, row in table.items():
        lines.append(f"| {expressions[name]} | " + " | ".join(row[b] for b in backends) + " |")
    lines += [
        "",
        "## The rules chosen where backends could differ",
        "",
        "- `d/dy x ** y` at a negative base `x`: NaN (the derivative `log(x) x ** y` does not exist in",
        "  the reals), as NumPy's tape, torch and JAX compute it; `d/dx` there is `y x ** (y - 1)`.",
        "- `remainder(x1, x2)`: derivative 1 for `x1` and `-floor(x1 / x2)` for `x2`, exact multiples",
        "  included; a zero result has the divisor's sign (`remainder(0., -1.)` is `-0.0`, as NumPy).",
        "- `d/dx x ** 0` at `x = 0`: 0, as NumPy and torch. JAX's own rule for a *floating* exponent",
        "  (`x ** 0.0`) computes `0 * 0 ** -1 = NaN`; its integer-exponent rule (`x ** 0`) gives 0.",
        "  On JAX the namespace functions `xp.pow(x, 0.0)` / `xp.power` give 0 (their own rule at",
        "  that point); the *operator* `x ** 0.0` on a JAX array is JAX's own and gives NaN: unigrad",
        "  cannot change it without changing JAX's rule table for every JAX user in the process. In",
        "  portable code write `xp.pow(x, y)`, or an integer exponent.",
        "- `d/dx abs(x)` at 0: 0; `d/dx clip(x, lo, hi)` at a bound: 1 (the closed interval passes `x`",
        "  through); `d/dx vector_norm(x)` at the zero vector: 0. The JAX namespace's `abs`, `clip` and",
        "  `linalg.vector_norm` follow these rules (`jax.numpy`'s own give 1, 0.5 and NaN); JAX code",
        "  outside the namespace (`jnp.abs`, `jax.nn.relu`...) keeps JAX's.",
        "- `max` / `min` (and `argmax` / `argmin`) of an empty set: ValueError, as NumPy and JAX (the",
        "  torch namespace converts torch's RuntimeError).",
        "- `median`: the true median (the mean of the two middle values of an even count), with the",
        "  derivative split evenly between them, where the namespace has a `median` (the torch",
        "  namespace's replaces `torch.median`, which returns the lower of the two).",
        "- A NumPy function called inside `f` on a value being differentiated (`np.median(x)`): a",
        "  TypeError on torch and JAX that names the namespace function to use.",
        "- Forward and reverse mode follow the same rule at every point above, eager and with",
        "  `compile=True`. On TensorFlow the namespace's `maximum`, `minimum`, `pow` and `remainder` are",
        "  recorded on tapes and accumulators as one operation with unigrad's VJP *and* JVP (a",
        "  `tf.custom_gradient` sets the reverse rule only, and `ForwardAccumulator` would apply",
        "  TensorFlow's own JVP: `maximum(x, 0)` at 0 had derivative 1 in forward mode). Where a backend's",
        "  forward mode cannot follow, the table shows `rev A / fwd B`:",
        "  - the `where` trap below, on every backend: a reverse-mode trap (forward mode selects the tangent",
        "    of the branch taken, so it gives 0);",
        "  - a Jacobian column of `x ** y` on torch, JAX, autograd and MLX (their own JVP of `pow`): a forward",
        "    pass multiplies the *other* input's derivative (NaN at a negative base, inf at `0 ** 0.5`) by",
        "    its zero tangent, and gets NaN where reverse mode, which gives each input its own cotangent,",
        "    gets a number. The tape and TensorFlow add a zero tangent's term as 0 (a select, never a",
        "    product), so both modes give `-4, nan` at `x = -2, y = 2`.",
        "- `compare` reports all of these as convention differences: at a point where `f` has no",
        "  derivative along the direction (a kink; a singularity such as `log` at 0; NaN beside the",
        "  point, as for a negative base), a NaN derivative and a difference between modes or backends",
        "  are conventions. At a point where `f` is smooth they are still `DISAGREE`.",
        "",
        "## The `where` trap, and the NaN-safe helpers",
        "",
        "`grad(lambda x: xp.where(x > 0, xp.log(x), 0.0))(0.0)` is NaN on every backend, though the",
        "value is 0 and the branch taken is the constant: reverse mode multiplies the branch *not*",
        "taken by a zero cotangent, and `log'(0) = inf`, so `0 * inf = NaN` (likewise `sqrt` at",
        "negative inputs, `1 / x` at 0). The cure is the double `where`: give each branch only inputs",
        "where it is finite, then select. unigrad provides it, on every backend and to any order:",
        "",
        "- `unigrad.safe_where(condition, x, fn_true, fn_false, *, fill_true=1.0, fill_false=1.0)`:",
        "  `where(condition, fn_true(x), fn_false(x))`, where `fn_true` sees `fill_true` instead of `x`",
        "  wherever `condition` is False (and `fn_false` sees `fill_false` where it is True); either",
        "  branch may be a constant. `safe_where(x > 0, x, xp.log, 0.0)` has derivative 0 at 0.",
        "- `unigrad.safe_norm(x, axis=None, keepdims=False, ord=2)`: `vector_norm` with derivative 0",
        "  at the zero vector and the exact one elsewhere, on every backend and for any array library's",
        "  own `vector_norm` (`jax.numpy.linalg.vector_norm` gives NaN there; the JAX namespace's gives 0).",
        "",
        "## What the caller holds",
        "",
        "Nothing the caller holds can change a result. `vjp` returns a `vjp_fn` that outlives the call: it",
        "computes at the call's point whatever the caller later writes into the primals (NumPy arrays,",
        "pytree leaves, the backend's own arrays), the output or aux. On backends whose arrays can be",
        "written in place (the tape, torch, plugins by default: `Backend.mutable_arrays`) the core hands",
        "the backend copies of the caller's arrays and the caller copies of the outputs; JAX's and",
        "TensorFlow's arrays are immutable. No result shares memory with an array the caller passed in",
        "(torch returns its input itself for an identity; unigrad clones it). The conformance suite holds",
        "every backend to this (`test_nothing_the_caller_holds_changes_a_vjp_fn`).",
        "",
        "An `f` that writes into its own arguments (`x.mul_(2.0)` on torch) is differentiated as written",
        "(`d/dx sum((2 x) ** 2) = 8 x`) by the torch transforms (not inside `unigrad.checkpoint`, where torch",
        "refuses it), and never writes into the caller's tensor: forward mode, `vmap` and plain evaluations",
        "hand `f` copies of its arguments, and reverse mode (where torch refuses a write into a leaf that",
        "requires grad before writing anything) runs `f` again on copies, so whatever `f` does before the",
        "write happens twice there. A write into a tensor of the caller's that `f` closes over and that",
        "requires grad still gets torch's own error.",
        "",
        "Arrays that `f` closes over are read when `f` runs: an eager transform sees a name rebound (or an",
        "array written) between calls, while a `compile=True` program on a backend that compiles (JAX,",
        "TensorFlow) keeps the value it was traced with, as `jax.jit` does. Pass arrays that change as",
        "arguments.",
        "",
        '## What unigrad keeps between calls, and what it is keyed on',
        '',
        'A transform keeps what it derives once for a call and reuses it when a call repeats (`unigrad._caches`).',
        "Each kept entry is keyed on the call's **signature** -- the backend, the device, the arguments' tree",
        "structure (dict key order included), each array's type, shape and dtype, each other argument's exact",
        'value -- and, where the entry was derived by running or tracing `f`, on more:',
        '',
        '- the **Python state `f` reads**: its closure cells, defaults, the globals its code names, the',
        '  functions it calls, containers and objects they hold to a bounded depth, the attributes of classes',
        '  you defined (and of their bases you defined) as those of instances, arrays by a digest of',
        '  their bytes (`unigrad._pystate.python_state`). A global flag, a rebound closure variable, a',
        '  closed-over array written in place or rebound, a global float, a class attribute: a change is a new',
        '  key, so an eager call sees `f` as it is now;',
        '- the **values of the arrays `f` is given** but not differentiated with respect to (an index array,',
        '  a constant matrix), by digest, where a trace reads them.',
        '',
        '| what is kept | keyed on |',
        '| --- | --- |',
        '| plans (backend, differentiated leaves, dtypes), flat plans, plans of the primals alone (tangents to check) of `hessian_vector_product`, repeats and compiled repeats of compiled calls | signature (f is not run; a compiled repeat of `batched_jacobian` or a sparse transform is kept only where its proof or pattern holds for the whole signature) |',
        '| output shapes (the mode `"auto"` picks, `hessian`\'s scalar form), chunk sizes from a memory budget | signature: speed and memory only, never the result (`hessian` re-checks the shape `f` returned) |',
        "| row proofs from the backend's program (jaxpr, ATen graph, TensorFlow graph) | signature + Python state |",
        "| signatures whose forward mode raised (mode 'auto') of `jacobian`, `batched_jacobian`, `hessian`, `value_jacobian_and_hessian` "
        "(sparse transforms keep reverse mode in their plan) | signature: speed only (both modes give the same "
        "derivative; a fallback is kept only where reverse mode worked) |",
        "| refuted shortcuts (`batched_jacobian`: one example computed alone, whose answer failed its check) | "
        "signature + Python state |",
        '| row proofs on the tape, probe verdicts | signature + Python state + values |',
        '| detected patterns and colourings (`sparse_jacobian`, `sparse_hessian`) | signature + Python state + values |',
        "| colourings of a given pattern | signature + Python state (the outputs' shapes come from running `f`) |",
        '| eager TensorFlow programs (`batched_jacobian`, sparse passes, per-example gradients), eager TensorFlow f that cannot be traced | signature + Python state |',
        '| paths of a traced program (`.paths`) | the key of the program they were read from |',
        '| torch analyses of a recorded program | the recorded program itself (`f` runs on every call) |',
        "| `unigrad.dask`: output specs, in-memory transforms on the workers | signature + Python state (a worker's transform is keyed by a token that holds a hash of it) |",
        "| compiled programs (`compile=True`) | signature, with dynamic Python floats by type: the program reads `f`'s Python state when it is traced, as `jax.jit` does |",
        '',
        'Two consequences. With `check_independence="once"`, `batched_jacobian` keeps a probe\'s verdict only where',
        'no custom rule was met: a `custom_vjp` / `custom_jvp` rule is opaque to every proof and may mix rows at some',
        'values only, so such an `f` is probed on every call. And a `compile=True` program on a backend that compiles',
        '(JAX, TensorFlow) keeps the state it was traced with (above); on the tape and torch `compile=True` runs',
        'eagerly and sees the state as it is now. `tests/test_cache_state.py` runs every cached transform against each',
        'kind of change; a cache of a transform it does not run fails it. `UNIGRAD_NO_CACHE=1` turns every cache off.',
        '',
        '## Threads',
        '',
        'Transforms may be called from several threads at once, one transform object shared by all of them,',
        'and give bitwise the results of the same calls made one at a time (`unigrad.testing.assert_threads_exact`;',
        'the conformance suite runs it on every backend). What threads share is:',
        '',
        "- the selection state, in `contextvars` (a new thread starts with none of another's `use_backend`);",
        '- the bounded caches above: dictionaries, whose single operations are atomic under the GIL, with a race',
        '  costing at most a recomputation (a value is derived from its key alone, so two threads store the same);',
        "- a shared transform's compiled programs. On TensorFlow the trace of a program for a new signature is",
        '  made under a lock held by that program (the first call of a signature; later calls take no lock), so',
        "  two threads never trace one `tf.function` together; torch's forward-mode level, process-global, is",
        '  guarded by a lock of the torch backend.',
        '',
        'Measured for issue 28, with all four frameworks loaded and `PYTHONFAULTHANDLER=1`: 16 runs of 8 threads x',
        '50 calls each (gradients, forward Jacobians, `batched_jacobian` eager and compiled, `sparse_jacobian` and',
        '`hvp`, two threads per engine) and 3 runs of TensorFlow alone: no fault, every result equal to the one',
        'computed alone. One segmentation fault was seen once, in a TensorFlow case, in an earlier run, and not',
        'since; where one recurs, the faulthandler traceback pytest prints says in which frame.',
        "",
        "## Other rules, the same on every backend (enforced by the adapters)",
        "",
        "| rule | behaviour |",
        "|---|---|",
        "| input the output does not use | gradient of zeros with the input's dtype, never None |",
        "| integer or bool input to differentiate, or output | TypeError naming the argument and dtype |",
        "| cotangent / tangent of the wrong shape | ValueError; never broadcast |",
        "| cotangent / tangent dtype | a floating (or, for complex values, complex) dtype is cast to the "
        "value's dtype; integer, bool, or complex for a real value: ValueError |",
        "| gradient dtype | the input's dtype (float16, bfloat16, float32, float64, complex64, complex128) |",
        "| Python scalars and NumPy inputs | converted with their dtype kept (a Python float is float64) |",
        "| precision of a call | NumPy's promotion: 64-bit iff some floating-point or complex input array of the "
        "call (differentiated or not) is 64-bit; integer arrays never decide. JAX runs such a call, eager or "
        "compiled, in the scoped `jax.enable_x64` context (never the global flag); otherwise JAX computes "
        "int64 inputs in int32 |",
        "| functions of a Hermitian (real symmetric) matrix: `linalg.cholesky`, `eigh`, `eigvalsh` | read the "
        "Hermitian part (x + x^H) / 2 on every backend (JAX's `symmetrize_input=True`): the value of a Hermitian "
        "input is unchanged, the gradient is Hermitian, a JVP uses the Hermitian part of the tangent. "
        "(torch's and TensorFlow's own functions read the lower triangle; their namespaces convert) |",
        "| complex | JAX's convention: the VJP is the unconjugated transpose of the JVP; for real f of "
        "complex z, grad of abs(z)**2 is 2 conj(z) (torch and TensorFlow natively return the conjugate; "
        "their adapters convert) |",
        "| complex Hessian-vector products | `hvp` and `hessian_vector_product` of a real `f` of complex z are "
        "`jvp` of `grad` in this convention: with H_R the Hessian of f(a + ib) in the real coordinates (a, b), the "
        "product is conj(H_R v) written as a complex vector. The pullback of `grad` along v (`v^T H`, torch's "
        "`vhp`) is the same vector, so there is one product (tested on every backend that declares complex). "
        "torch computes it reverse over reverse and converts |",
        '| complex Jacobians | `jacobian` of a complex input follows the reverse convention, the one `grad` and `vjp` follow (for a real output its row is the gradient, 2 conj(z) for abs(z)**2): `mode="auto"` picks reverse whatever the shapes, since for an `f` that is not holomorphic forward mode (`jacfwd`) gives another matrix; both agree where `f` is holomorphic. A complex output of a real input: forward mode in `"auto"`; `mode="rev"` / `jacrev` raise ValueError (a real input\'s VJP is real: the imaginary part would be lost) |',
    ]
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, dict[str, str]]:
    """The measured table back from its Markdown: ``{expression: {backend: cell}}``."""
    lines, started = [], False
    for ln in text.splitlines():  # the first table only: the page has other tables after it
        if ln.startswith("| "):
            lines.append(ln)
            started = True
        elif started and not ln.startswith("|"):
            break
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    backends = header[1:]
    table = {}
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if cells[0] == "rule":  # the second table starts
            break
        table[cells[0]] = dict(zip(backends, cells[1:]))
    return table


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="PATH")
    parser.add_argument("--check", metavar="PATH")
    parser.add_argument("--backends", help="comma-separated (default: all installed)")
    args = parser.parse_args(argv)
    names = args.backends.split(",") if args.backends else [
        n for n, info in unigrad.backends().items() if info["available"]]
    versions = {n: unigrad.get_backend(n).version() for n in names}
    text = render(measure(names), versions)
    if args.write:
        with open(args.write, "w") as fh:
            fh.write(text)
    elif args.check:
        with open(args.check) as fh:
            if fh.read() != text:
                print(f"{args.check} is stale: regenerate it with --write", file=sys.stderr)
                return 1
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
