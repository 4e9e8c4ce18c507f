"""Differential fuzzing of unigrad's fast paths: generated programs that break analyses, and oracles.

Every fast path of unigrad stands on an analysis -- a proof that the rows of a batch are independent,
a row program evaluated at one example, a probe, a sparsity pattern, a cache keyed on the Python
state ``f`` reads. This module generates what breaks such analyses and compares each fast path with
the exact, slow answer:

- :func:`batch_cases`: batch programs ``f(x)`` (``x`` of shape ``(B, n)``) that use the batch size or
  positions in the batch (``x / ones((B,)).sum()``, ``x * cumulative_sum(ones((B, 1)))``, a concat,
  roll, sort or softmax of a batch-shaped constant, a Python branch on ``x.shape[0]``...), programs
  that mix rows (``x - mean(x, 0)``, ``roll(x, 1, axis=0)``), plain row-wise ones, and custom rules
  (``unigrad.custom_jvp`` / ``custom_vjp``) whose derivative moves one example's tangent into another
  only at some values. Each case holds one to three calls' inputs for the same transform object.
- :func:`state_cases`: functions that read Python state -- a global, a rebound closure variable, a
  class attribute, an instance attribute, a NumPy array written in place -- changed between two calls
  of the same transform.
- Oracles: :func:`check_batched_jacobian`, :func:`check_per_example_grad`, :func:`check_sparse_jacobian`
  (each fast path against the dense :func:`unigrad.jacobian`, computed in reverse mode on the NumPy
  tape, or on the program's own framework for a framework-native program) and
  :func:`check_state_case` (the transform called twice against a fresh one built after the change).

Each case's ``repr`` is Python source that runs as printed, so a failure shrinks and prints as a
program to paste into a file::

    from hypothesis import given
    from unigrad.testing import fuzz

    @given(fuzz.batch_cases(family="batch_size"))
    def test_blocks(case):
        fuzz.check_batched_jacobian(case, "jax", check_independence="always")

The oracle of :func:`check_batched_jacobian`: the blocks equal the diagonal blocks of the dense
Jacobian at every call, or -- only for a program whose rows are structurally mixed -- the call raises
the ``ValueError`` that says the rows are not independent. A row-independent program refused fails.

Requires ``hypothesis`` (``pip install 'unigrad[test]'``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

#: The module name of a generated case's code (its classes' ``__module__``): a user's module, as the code a user
#: writes lives in (without one, ``exec`` makes its classes look built-in, and the Python-state walk rightly
#: treats built-in classes as opaque).
CASE_MODULE = "fuzz_case"

__all__ = ["BatchCase", "StateCase", "FuzzFailure", "FAMILIES", "STATE_KINDS", "STATE_TRANSFORMS",
           "BATCH_INGREDIENTS", "JAX_BATCH_INGREDIENTS", "MIXED_INGREDIENTS", "ROW_OPERATIONS",
           "batch_cases", "state_cases", "check_batched_jacobian", "check_per_example_grad",
           "check_sparse_jacobian", "check_state_case", "dense_jacobian", "diagonal_blocks", "tolerances"]

FAMILIES = ("row", "batch_size", "mixed", "custom_rule")


class FuzzFailure(AssertionError):
    """A fast path disagreed with the exact answer (or refused a program it must accept)."""


# ---------------------------------------------------------------------------------------------
# The pieces of batch programs
# ---------------------------------------------------------------------------------------------
# Each line is formatted with {v} (the current value, shape (B, k)), {out} (the new name), {t} (a
# temporary name), {W} (the program's weight literal) and {B} (the first call's batch size). Row-wise
# operations keep row b of the output a function of row b of the input alone.

ROW_OPERATIONS = {
    "sin": ["{out} = xp.sin({v})"],
    "tanh": ["{out} = xp.tanh({v})"],
    "square": ["{out} = {v} * {v}"],
    "gauss": ["{out} = xp.exp(-0.5 * {v} * {v})"],
    "matmul": ["{out} = xp.matmul({v}, {W})"],
    "row_sum": ["{out} = {v} + xp.sum({v} * {v}, axis=1, keepdims=True)"],  # reduces within a row only
}

# Values made from the batch size or from positions in the batch, combined with the current value
# elementwise: the rows stay independent, but evaluating f at one example gives other numbers.
BATCH_INGREDIENTS = {
    "count": ["{out} = {v} / xp.sum(xp.ones((x.shape[0],), dtype=x.dtype))"],
    "positions": ["{out} = {v} * xp.cumulative_sum(xp.ones((x.shape[0], 1), dtype=x.dtype), axis=0)"],
    "first_row": ["{out} = {v} * xp.where(xp.cumulative_sum(xp.ones_like({v}), axis=0) == 1.0, 2.0, 1.0)"],
    "ones_like_sum": ["{out} = {v} / xp.sum(xp.ones_like({v}), axis=0)"],
    "concat": ["{t} = xp.concat([xp.zeros((1, 1), dtype=x.dtype), xp.ones((x.shape[0], 1), dtype=x.dtype)], axis=0)",
               "{out} = {v} * (1.0 + {t}[:-1])"],
    "roll": ["{t} = xp.cumulative_sum(xp.ones((x.shape[0], 1), dtype=x.dtype), axis=0)",
             "{out} = {v} * xp.roll({t}, 1, axis=0)"],
    "sort": ["{t} = -xp.cumulative_sum(xp.ones((x.shape[0], 1), dtype=x.dtype), axis=0)",
             "{out} = {v} * xp.sort({t}, axis=0)"],
    "softmax": ["{t} = xp.exp(xp.cumulative_sum(xp.ones((x.shape[0], 1), dtype=x.dtype), axis=0))",
                "{out} = {v} * ({t} / xp.sum({t}, axis=0))"],
    "branch_size": ["{out} = {v} * 0.5 if x.shape[0] != {B} else {v} * 1.5"],
    "branch_many": ["{out} = {v} * 1.5 if x.shape[0] > 1 else {v}"],
}

# The same for JAX in its own words, where the portable namespace has no such operation (an indexed
# update, pad, jax.nn.softmax) -- programs using them run on the "jax" backend only.
JAX_BATCH_INGREDIENTS = {
    "at_set": ["{out} = {v} * (1.0 + jnp.zeros_like({v}).at[0].set(1.0))"],
    "ones_sum": ["{out} = {v} / jnp.ones((x.shape[0],)).sum()"],
    "pad": ["{t} = jnp.pad(jnp.ones((x.shape[0], 1), x.dtype), ((1, 0), (0, 0)))",
            "{out} = {v} * (1.0 + {t}[:-1])"],
    "softmax": ["{out} = {v} * jax.nn.softmax(jnp.cumsum(jnp.ones((x.shape[0], 1), x.dtype), axis=0), axis=0)"],
    "cumsum": ["{out} = {v} * jnp.cumsum(jnp.ones((x.shape[0], 1), x.dtype), axis=0)"],
}

# Operations whose output row b depends on other rows' inputs.
MIXED_INGREDIENTS = {
    "center": ["{out} = {v} - xp.mean({v}, axis=0)"],
    "roll_rows": ["{out} = xp.roll({v}, 1, axis=0)"],
    "batch_sum": ["{out} = {v} + xp.sum({v}, axis=0, keepdims=True)"],
    "batch_scale": ["{out} = {v} * xp.sum({v} * {v})"],
}

# Custom rules that move tangents (cotangents) between rows where x > threshold, and only there.
# (jvp, its transpose); roll first: it moves one example's tangent into ONE other example, the flow a
# probe that perturbs one example misses most often (what the simplest example uses)
_CUSTOM_MIX = {
    "roll": ("{m} * xp.roll({t}, 1, axis=0)", "xp.roll({m} * {t}, -1, axis=0)"),
    "mean": ("{m} * xp.mean({t}, axis=0, keepdims=True)", "xp.mean({m} * {t}, axis=0, keepdims=True)"),
}


# ---------------------------------------------------------------------------------------------
# Batch cases
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchCase:
    """A generated batch program ``f`` and the inputs of its calls, all given to one transform object.

    Attributes:
      family: ``"row"``, ``"batch_size"``, ``"mixed"`` or ``"custom_rule"``.
      rows: ``"independent"`` (row b of f's output depends on row b of x alone, for every x) or
        ``"mixed"`` (structurally mixed: ``"custom_rule"`` cases mix at some values only).
      framework: None for a portable program (``unigrad.namespace``), ``"jax"`` for one in JAX's words.
      source: the whole program, Python that defines ``f`` (and ``losses`` for per-example gradients).
      inputs: one array ``x`` (float64, shape ``(B, n)``) per call.
      weights: the parameters of ``losses(w, xb) = sum(f(xb @ w), axis=1)``.
      uses: the names of what the family added (ingredients, or the rule's kind and mixing).
    """

    family: str
    rows: str
    framework: str | None
    source: str
    inputs: tuple
    weights: np.ndarray = field(compare=False)
    uses: tuple = ()

    def __repr__(self):
        calls = "\n".join(f"x{k} = np.array({np.asarray(x).tolist()!r})" for k, x in enumerate(self.inputs))
        return (f"# unigrad.testing.fuzz case: family {self.family!r}, rows {self.rows}"
                f"{', uses ' + ', '.join(self.uses) if self.uses else ''}\n"
                f"import numpy as np\nimport unigrad\n{self.source}\n{calls}\n"
                f"w = np.array({np.asarray(self.weights).tolist()!r})\n"
                f"# the calls of one transform object: {', '.join(f'f(x{k})' for k in range(len(self.inputs)))}")

    def _repr_pretty_(self, printer, cycle):  # hypothesis prints a failing example with this
        printer.text(repr(self))

    @property
    def functions(self):
        """``(f, losses)``, made from the source (once per case)."""
        cached = self.__dict__.get("_functions")
        if cached is None:
            import unigrad

            namespace = {"unigrad": unigrad, "np": np, "__name__": CASE_MODULE}
            if self.framework == "jax":
                import jax
                import jax.numpy as jnp
                namespace.update(jax=jax, jnp=jnp)
            exec(compile(self.source, "<unigrad fuzz case>", "exec"), namespace)  # noqa: S102 -- our own source
            cached = (namespace["f"], namespace["losses"])
            object.__setattr__(self, "_functions", cached)
        return cached

    @property
    def f(self):
        return self.functions[0]

    @property
    def losses(self):
        return self.functions[1]


def _bounded(case, bound=1e3):
    """Whether f and the losses are finite and at most ``bound`` in magnitude at every call's input:
    a chain of squares overflows, and a wrong answer must not hide in an infinity."""
    import unigrad

    with np.errstate(all="ignore"):
        for x in case.inputs:
            for value in (case.f(x), case.losses(case.weights, x)):
                value = np.asarray(unigrad.to_numpy(value), dtype=np.float64)
                if not np.all(np.isfinite(value)) or (value.size and np.max(np.abs(value)) > bound):
                    return False
    return True


def _weight_literal(draw, n):
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    w = np.round(rng.uniform(-1.0, 1.0, size=(n, n)), 2)
    w[np.abs(w) < 0.1] = 0.5
    return w


def _emit(templates, v, counter, W, B):
    """Lines for one piece: ``(lines, new value name)``."""
    out, t = f"v{counter[0]}", f"t{counter[0]}"
    counter[0] += 1
    return [line.format(v=v, out=out, t=t, W=W, B=B) for line in templates], out


def _row_ops(draw, max_ops):
    return draw(st.lists(st.sampled_from(sorted(ROW_OPERATIONS)), max_size=max_ops))


def _custom_prelude(draw):
    kind = draw(st.sampled_from(["custom_jvp", "custom_vjp"]))
    mix = draw(st.sampled_from(list(_CUSTOM_MIX)))
    threshold = draw(st.sampled_from([10.0, 0.5]))
    jvp_mix, vjp_mix = _CUSTOM_MIX[mix]
    mask = f"xp.where(x > {threshold!r}, 0.5, 0.0)"
    if kind == "custom_jvp":
        body = [
            "@unigrad.custom_jvp",
            "def rule(x):",
            "    return unigrad.namespace(x).sin(x)",
            "",
            "@rule.defjvp",
            "def rule_jvp(primals, tangents):",
            "    (x,), (t,) = primals, tangents",
            "    xp = unigrad.namespace(x)",
            f"    # moves tangents between rows where x > {threshold!r} (and only there)",
            f"    return xp.sin(x), xp.cos(x) * t + {jvp_mix.format(m=mask, t='t')}",
        ]
    else:
        body = [
            "@unigrad.custom_vjp",
            "def rule(x):",
            "    return unigrad.namespace(x).sin(x)",
            "",
            "def rule_fwd(x):",
            "    return unigrad.namespace(x).sin(x), x",
            "",
            "def rule_bwd(x, g):",
            "    xp = unigrad.namespace(x)",
            f"    # moves cotangents between rows where x > {threshold!r} (and only there)",
            f"    return (xp.cos(x) * g + {vjp_mix.format(m=mask, t='g')},)",
            "",
            "rule.defvjp(rule_fwd, rule_bwd)",
        ]
    return "\n".join(body) + "\n\n", threshold, f"{kind}/{mix}"


@st.composite
def _batch_cases(draw, family, framework, max_ops, max_calls):
    n = draw(st.integers(1, 3))
    # a custom rule's flow between two rows hides best in a larger batch (from a probe of one example)
    B = draw(st.sampled_from([4, 3, 2]) if family == "custom_rule" else st.integers(2, 4))
    W_values = _weight_literal(draw, n)
    W = f"xp.asarray({W_values.tolist()!r}, dtype=x.dtype)" if framework is None else \
        f"jnp.asarray({W_values.tolist()!r}, dtype=x.dtype)"
    counter = [0]
    lines, v, uses, prelude, threshold = [], "x", [], "", None
    if framework == "jax":
        lines.append("xp = jnp")
    pre = _row_ops(draw, max_ops if family != "custom_rule" else 0)
    for name in pre:
        new, v = _emit(ROW_OPERATIONS[name], v, counter, W, B)
        lines += new
    if family == "batch_size":
        table = JAX_BATCH_INGREDIENTS if framework == "jax" else BATCH_INGREDIENTS
        names = sorted(table)
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2))
        for name in chosen:
            new, v = _emit(table[name], v, counter, W, B)
            lines += new
        uses = tuple(chosen)
    elif family == "mixed":
        name = draw(st.sampled_from(sorted(MIXED_INGREDIENTS)))
        new, v = _emit(MIXED_INGREDIENTS[name], v, counter, W, B)
        lines += new
        uses = (name,)
    elif family == "custom_rule":
        prelude, threshold, use = _custom_prelude(draw)
        out = f"v{counter[0]}"
        counter[0] += 1
        lines.append(f"{out} = rule({v})")
        v, uses = out, (use,)
    elif family != "row":
        raise ValueError(f"batch_cases: family must be one of {FAMILIES}; got {family!r}")
    for name in _row_ops(draw, max_ops):
        new, v = _emit(ROW_OPERATIONS[name], v, counter, W, B)
        lines += new
    if family == "row" and not pre and v == "x":
        new, v = _emit(ROW_OPERATIONS["sin"], v, counter, W, B)
        lines += new
    head = "def f(x):" if framework is None else "def f(x):  # JAX's own words: runs on the jax backend only"
    body = ([] if framework == "jax" else ["    xp = unigrad.namespace(x)"]) + [f"    {ln}" for ln in lines]
    source = (("import jax\nimport jax.numpy as jnp\n\n" if framework == "jax" else "") + prelude
              + "\n".join([head] + body + [f"    return {v}"]) + "\n\n"
              + "def losses(w, xb):  # one loss per example, for per_example_grad(losses, 0, 1)\n"
              + "    xp = unigrad.namespace(w, xb)\n"
              + "    return xp.sum(f(xp.matmul(xb, w)), axis=1)\n")
    # the calls: same shape, another point; the last one sometimes at another batch size
    n_calls = draw(st.integers(1, max_calls))
    sizes = [B] * n_calls
    if n_calls > 1 and draw(st.integers(0, 3)) == 0:
        sizes[-1] = draw(st.sampled_from([b for b in (2, 3, 5) if b != B]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    # which calls put values above a high threshold of a custom rule (the first pattern is what the
    # simplest example, and a shrunk failure, use)
    trigger = draw(st.sampled_from(_TRIGGERS)) if threshold is not None and threshold > 5.0 else "no call"
    inputs = []
    for call, size in enumerate(sizes):
        x = rng.uniform(-1.5, 1.5, size=(size, n))
        if trigger == "every call" or (trigger == "last call" and call == n_calls - 1) or (
                trigger == "first call" and call == 0):
            # trigger the custom rule's mixing at some entries of this call (absent at others)
            hits = draw(st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, n - 1)), min_size=1,
                                 max_size=2))
            for r, c in hits:
                x[r, c] = threshold + 10.0
        inputs.append(np.round(x, 3))
    weights = np.round(rng.uniform(-1.0, 1.0, size=(n, n)), 3)
    rows = "independent" if family in ("row", "batch_size") else "mixed"
    case = BatchCase(family, rows, framework, source, tuple(inputs), weights, uses)
    assume(_bounded(case))
    return case


_TRIGGERS = ("every call", "last call", "first call", "no call")


def batch_cases(*, family: str = "batch_size", framework: str | None = None, max_ops: int = 2,
                max_calls: int = 2):
    """:class:`BatchCase` s of one family: row-wise operations around what the family adds.

    Args:
      family: ``"row"`` (row-wise operations only), ``"batch_size"`` (one or two values made from the
        batch size or positions: :data:`BATCH_INGREDIENTS`, and with ``framework="jax"`` also
        :data:`JAX_BATCH_INGREDIENTS`), ``"mixed"`` (one of :data:`MIXED_INGREDIENTS`) or
        ``"custom_rule"`` (a ``custom_jvp`` or ``custom_vjp`` whose rule mixes rows where x > a
        threshold; with the threshold 10 some calls put values above it, others not).
      framework: None (portable programs, every backend) or ``"jax"`` (programs in ``jax.numpy``).
      max_ops: row-wise operations before and after (each).
      max_calls: inputs per case (same shape; a last call sometimes at another batch size).
    """
    if family not in FAMILIES:
        raise ValueError(f"batch_cases: family must be one of {FAMILIES}; got {family!r}")
    if framework not in (None, "jax"):
        raise ValueError(f"batch_cases: framework must be None or 'jax'; got {framework!r}")
    return _batch_cases(family, framework, max_ops, max_calls)


# ---------------------------------------------------------------------------------------------
# Oracles for batch cases
# ---------------------------------------------------------------------------------------------

def tolerances(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing a fast path with the dense Jacobian at ``dtype``."""
    return (2e-4, 2e-5) if np.dtype(dtype).itemsize <= 4 else (1e-7, 1e-10)


def _backend_input(x, backend):
    import unigrad

    b = unigrad.get_backend(backend)
    dtype = "float64" if b.capabilities.float64 else "float32"
    return unigrad.asarray(np.asarray(x, dtype=dtype), backend=backend)


def dense_jacobian(case_f: Callable, args: Sequence, argnums=0, *, framework: str | None = None):
    """The exact dense Jacobian, as NumPy: reverse mode on the NumPy tape (float64) for a portable
    ``f``; on the framework's own backend for a framework-native one (a fresh transform)."""
    import unigrad

    backend = framework or "numpy"
    args = [_backend_input(a, backend) for a in args]
    return unigrad.to_numpy(unigrad.jacobian(case_f, argnums=argnums, mode="rev", backend=backend)(*args))


def diagonal_blocks(full: np.ndarray, batch: int) -> tuple[np.ndarray, float]:
    """``(blocks, largest off-diagonal entry)`` of a dense Jacobian of shape ``(B, *out, B, *in)``."""
    out_dims = (full.ndim - 2) // 2
    moved = np.moveaxis(full, 1 + out_dims, 1)  # (B, B, *out, *in)
    blocks = np.stack([moved[b, b] for b in range(batch)])
    off = moved.copy()
    for b in range(batch):
        off[b, b] = 0
    return blocks, float(np.max(np.abs(off))) if off.size else 0.0


def _is_mixed_rows_error(exc) -> bool:
    return isinstance(exc, ValueError) and (getattr(exc, "dependent_rows", False)
                                            or "not independent" in str(exc))


def _where(case, what, call):
    return f"{what}, call {call} (x{call} in the case below) of {len(case.inputs)}:\n{case!r}"


def _assert_close(got, want, case, what, call, dtype):
    rtol, atol = tolerances(dtype)
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise FuzzFailure(f"{_where(case, what, call)}\nshape {got.shape}, the exact answer's {want.shape}")
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        worst = float(np.max(np.abs(got - want)))
        raise FuzzFailure(f"{_where(case, what, call)}\nwrong by up to {worst:.3g} (rtol {rtol}, atol {atol})\n"
                          f"got   {np.round(got, 5).tolist()}\nexact {np.round(want, 5).tolist()}")


def _refusal_allowed(case, exc, what, call):
    """A mixed-rows ValueError is an answer only for a structurally mixed program."""
    if not _is_mixed_rows_error(exc):
        raise exc
    if case.rows != "mixed":
        raise FuzzFailure(f"{_where(case, what, call)}\nrefused a program whose rows are independent: {exc}") \
            from exc


def check_batched_jacobian(case: BatchCase, backend, *, check_independence: str = "once",
                           compile: bool = False, **options) -> list:
    """Call one ``unigrad.batched_jacobian(case.f, ...)`` on each of ``case.inputs`` in turn; each
    result must equal the diagonal blocks of the dense Jacobian at that input, or -- only where
    ``case.rows == "mixed"`` -- the call raises the ValueError that says the rows are not independent.

    Returns the outcomes, one per call (``"blocks"`` or ``"refused"``); raises :class:`FuzzFailure`.
    """
    import unigrad

    what = (f"batched_jacobian(f, backend={_name(backend)!r}, check_independence={check_independence!r}, "
            f"compile={compile!r}{''.join(f', {k}={v!r}' for k, v in options.items())})")
    transform = unigrad.batched_jacobian(case.f, backend=backend, check_independence=check_independence,
                                         compile=compile, **options)
    outcomes = []
    for call, x in enumerate(case.inputs):
        full = dense_jacobian(case.f, [x], framework=case.framework)
        want, off = diagonal_blocks(full, x.shape[0])
        if case.rows == "independent" and off > 1e-6:  # the generator's own promise
            raise FuzzFailure(f"{_where(case, 'the generator', call)}\nrows said independent, but the dense "
                              f"Jacobian mixes them (off-diagonal {off:.3g})")
        xb = _backend_input(x, backend)
        try:
            got = transform(xb)
        except Exception as exc:  # noqa: BLE001 -- judged below
            _refusal_allowed(case, exc, what, call)
            outcomes.append("refused")
            continue
        _assert_close(unigrad.to_numpy(got), want, case, what, call, unigrad.to_numpy(xb).dtype)
        outcomes.append("blocks")
    return outcomes


def check_per_example_grad(case: BatchCase, backend, *, compile: bool = False, norms: bool = False) -> list:
    """One ``unigrad.per_example_grad(case.losses, argnums=0, batch_argnum=1)`` called on each input
    ``xb`` with the parameters ``case.weights``: the rows of the dense Jacobian of the per-example
    losses (defined whether or not f mixes rows); with ``norms``, ``per_example_grad_norms`` against
    those rows' norms. A mixed-rows ValueError is accepted only for a structurally mixed program.
    Returns the outcomes; raises :class:`FuzzFailure`."""
    import unigrad

    name = "per_example_grad_norms" if norms else "per_example_grad"
    what = f"{name}(losses, argnums=0, batch_argnum=1, backend={_name(backend)!r}, compile={compile!r})"
    transform = getattr(unigrad, name)(case.losses, argnums=0, batch_argnum=1, backend=backend, compile=compile)
    outcomes = []
    for call, x in enumerate(case.inputs):
        want = dense_jacobian(case.losses, [case.weights, x], framework=case.framework)
        if norms:
            want = np.sqrt(np.sum(want.reshape(want.shape[0], -1) ** 2, axis=1))
        w, xb = _backend_input(case.weights, backend), _backend_input(x, backend)
        try:
            got = transform(w, xb)
        except Exception as exc:  # noqa: BLE001
            _refusal_allowed(case, exc, what, call)
            outcomes.append("refused")
            continue
        _assert_close(unigrad.to_numpy(got), want, case, what, call, unigrad.to_numpy(xb).dtype)
        outcomes.append("norms" if norms else "rows")
    return outcomes


def check_sparse_jacobian(case: BatchCase, backend, *, mode: str = "auto", compile: bool = False) -> list:
    """One ``unigrad.sparse_jacobian(case.f, format="dense")`` called on each input: the dense
    Jacobian, reshaped to ``(m, n)``. Returns the outcomes; raises :class:`FuzzFailure`."""
    import unigrad

    what = f"sparse_jacobian(f, mode={mode!r}, format='dense', backend={_name(backend)!r}, compile={compile!r})"
    transform = unigrad.sparse_jacobian(case.f, mode=mode, format="dense", backend=backend, compile=compile)
    for call, x in enumerate(case.inputs):
        full = dense_jacobian(case.f, [x], framework=case.framework)
        xb = _backend_input(x, backend)
        got = unigrad.to_numpy(transform(xb))
        _assert_close(got, full.reshape(got.shape) if full.size == got.size else full, case, what, call,
                      unigrad.to_numpy(xb).dtype)
    return ["matrix"] * len(case.inputs)


def _name(backend):
    return backend if isinstance(backend, str) else getattr(backend, "name", repr(backend))


# ---------------------------------------------------------------------------------------------
# Python state changed between calls
# ---------------------------------------------------------------------------------------------

STATE_KINDS = ("global", "closure", "class_attribute", "instance_attribute", "array_in_place")
# the transforms with caches of their own first (the simplest example uses the first)
STATE_TRANSFORMS = ("batched_jacobian", "per_example_grad", "sparse_jacobian", "grad", "value_and_grad", "jacobian",
                    "hessian")

# How f reads the state S (a float; for "array_in_place" an array of shape (n,)): {S} is the expression.
_STATE_SETUP = {
    "global": ("S = {v0}", "S", "S = {v}"),
    "closure": ("def make():\n    s = {v0}\n\n    def set_s(value):\n        nonlocal s\n        s = value\n"
                "{body}    return f, set_s\n\nf, set_s = make()", "s", "set_s({v})"),
    "class_attribute": ("class Config:\n    scale = {v0}", "Config.scale", "Config.scale = {v}"),
    "instance_attribute": ("class Config:\n    def __init__(self):\n        self.scale = {v0}\n\n"
                           "config = Config()", "config.scale", "config.scale = {v}"),
    "array_in_place": ("S = np.full({n}, {v0})", "S", "S[...] = {v}"),
}


@dataclass(frozen=True)
class StateCase:
    """A function that reads Python state, the transform applied to it, and the change between two calls.

    Attributes:
      kind: one of :data:`STATE_KINDS`.
      transform: one of :data:`STATE_TRANSFORMS`.
      usage: ``"scale"`` (f multiplies by the state) or ``"branch"`` (a Python ``if`` on it).
      source: Python defining ``f`` (and the state); ``change(value)`` source lines set the state.
      values: the state's value at the first call and at the second.
      inputs: the arguments of each call (``(x,)``, or ``(w, xb)`` for per_example_grad).
    """

    kind: str
    transform: str
    usage: str
    source: str
    change: str
    values: tuple
    inputs: tuple

    def __repr__(self):
        args = ", ".join(f"np.array({np.asarray(a).tolist()!r})" for a in self.inputs)
        first, second = (self.change.format(v=v) for v in self.values)
        return (f"# unigrad.testing.fuzz state case: {self.kind}, read by {self.usage}; "
                f"transform {self.transform}\nimport numpy as np\nimport unigrad\n{self.source}\n"
                f"args = ({args},)\n{first}\nt = {_TRANSFORM_SOURCE[self.transform]}\nt(*args)\n{second}\n"
                f"t(*args)  # must equal a fresh {_TRANSFORM_SOURCE[self.transform]}(*args)")

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))

    def namespace(self):
        """A fresh namespace in which the source has run: ``f`` and the state live there."""
        import unigrad

        namespace = {"unigrad": unigrad, "np": np, "__name__": CASE_MODULE}
        exec(compile(self.source, "<unigrad fuzz state case>", "exec"), namespace)  # noqa: S102
        return namespace

    def set_state(self, namespace, value):
        exec(compile(self.change.format(v=value), "<unigrad fuzz state change>", "exec"), namespace)  # noqa: S102


_TRANSFORM_SOURCE = {
    "grad": "unigrad.grad(f)", "value_and_grad": "unigrad.value_and_grad(f)", "jacobian": "unigrad.jacobian(f)",
    "hessian": "unigrad.hessian(f)", "batched_jacobian": "unigrad.batched_jacobian(f)",
    "per_example_grad": "unigrad.per_example_grad(f, argnums=0, batch_argnum=1)",
    "sparse_jacobian": "unigrad.sparse_jacobian(f, format='dense')",
}


def _state_body(transform, usage, state):
    """The body of f (indented by 4), reading ``state``."""
    if transform == "per_example_grad":
        core = "xp.sin(xp.matmul(xb, w))"
        out = "xp.sum({y}, axis=1)"
        head, xp = "def f(w, xb):", "unigrad.namespace(w, xb)"
        like = "w"
    else:
        core = "xp.sin(x)"
        out = "xp.sum({y})" if transform in ("grad", "value_and_grad", "hessian") else "{y}"
        head, xp = "def f(x):", "unigrad.namespace(x)"
        like = "x"
    if usage == "scale":
        value = f"xp.asarray({state}, dtype={like}.dtype)"
        y = f"{core} * {value}"
        lines = [f"    y = {y}"]
    else:  # a Python branch on the state
        lines = [f"    y = {core} * 3.0 if float(np.max({state})) > 0.75 else xp.cos({core})"]
    return "\n".join([head, f"    xp = {xp}"] + lines + [f"    return {out.format(y='y')}"]) + "\n"


@st.composite
def _state_cases(draw, kinds, transforms):
    kind = draw(st.sampled_from(kinds))
    transform = draw(st.sampled_from(transforms))
    usage = draw(st.sampled_from(["scale", "branch"]))
    v0 = 1.0  # the second value changes the answer: another scale, or the other side of the branch
    v1 = draw(st.sampled_from([2.0, -1.0, 0.5] if usage == "scale" else [0.5, -1.0]))
    n = draw(st.integers(1, 3))
    B = draw(st.integers(2, 3))
    setup, state, change = _STATE_SETUP[kind]
    body = _state_body(transform, usage, state)
    if kind == "closure":
        inner = "".join("    " + ln + "\n" if ln else "\n" for ln in body.splitlines())
        source = setup.format(v0=v0, body=inner + "\n") + "\n"
    else:
        source = setup.format(v0=v0, n=n) + "\n\n\n" + body
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if transform == "per_example_grad":
        inputs = (np.round(rng.uniform(-1, 1, size=(n, n)), 3), np.round(rng.uniform(-1.5, 1.5, size=(B, n)), 3))
    elif transform == "hessian":
        inputs = (np.round(rng.uniform(-1.5, 1.5, size=(n,)), 3),)
    else:
        inputs = (np.round(rng.uniform(-1.5, 1.5, size=(B, n)), 3),)
    return StateCase(kind, transform, usage, source, change, (v0, v1), inputs)


def state_cases(*, kinds: Sequence[str] = STATE_KINDS, transforms: Sequence[str] = STATE_TRANSFORMS):
    """:class:`StateCase` s: f reads a piece of Python state (:data:`STATE_KINDS`), multiplying by it
    or branching on it; the state has one value at the first call of a transform and another at the
    second."""
    for k in kinds:
        if k not in STATE_KINDS:
            raise ValueError(f"state_cases: kinds must be among {STATE_KINDS}; got {k!r}")
    for t in transforms:
        if t not in STATE_TRANSFORMS:
            raise ValueError(f"state_cases: transforms must be among {STATE_TRANSFORMS}; got {t!r}")
    return _state_cases(tuple(kinds), tuple(transforms))


def _make_transform(name, f, backend):
    import unigrad

    if name == "per_example_grad":
        return unigrad.per_example_grad(f, argnums=0, batch_argnum=1, backend=backend)
    if name == "sparse_jacobian":
        return unigrad.sparse_jacobian(f, format="dense", backend=backend)
    return getattr(unigrad, name)(f, backend=backend)


def check_state_case(case: StateCase, backend, *, fresh: Callable[[], contextlib.AbstractContextManager] | None = None):
    """Call one transform of ``case.f`` with the state at ``case.values[0]``, change the state, call it
    again: each result must equal that of a fresh transform built (inside ``fresh()``, a context that
    switches caches off, where given) after the state took its value. Raises :class:`FuzzFailure`."""
    import optree

    import unigrad

    namespace = case.namespace()
    f = namespace["f"]
    transform = _make_transform(case.transform, f, backend)
    args = [_backend_input(a, backend) for a in case.inputs]
    for call, value in enumerate(case.values):
        case.set_state(namespace, value)
        got = transform(*args)
        with (fresh() if fresh is not None else contextlib.nullcontext()):
            want = _make_transform(case.transform, f, backend)(*args)
        got_leaves, want_leaves = optree.tree_leaves(got), optree.tree_leaves(want)
        dtype = unigrad.to_numpy(args[-1]).dtype
        rtol, atol = tolerances(dtype)
        for a, b in zip(got_leaves, want_leaves):
            a, b = np.asarray(unigrad.to_numpy(a), np.float64), np.asarray(unigrad.to_numpy(b), np.float64)
            if a.shape != b.shape or not np.allclose(a, b, rtol=rtol, atol=atol):
                raise FuzzFailure(
                    f"{_TRANSFORM_SOURCE[case.transform]} on {_name(backend)!r}, call {call} (state "
                    f"{value!r}): differs from a fresh transform\ngot   {np.round(a, 5).tolist()}\n"
                    f"fresh {np.round(b, 5).tolist()}\n{case!r}")
