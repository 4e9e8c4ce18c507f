"""Every cached transform against every kind of change in the Python state ``f`` reads.

unigrad keeps what it derives per call (plans, proofs, patterns, probes' verdicts, traced programs:
``unigrad._caches``). What depends on running or tracing ``f`` is keyed by the Python state ``f`` reads
too, and what a trace reads array values for, by those values. Here each transform in
:data:`TRANSFORMS` is called, the state ``f`` reads is changed in one of the ways in :data:`CHANGES`,
and the second call must give what a transform made and run with every cache off gives
(:func:`conftest.uncached`): the same numbers, or the same error (rows that became dependent).

``compile=True`` programs on a backend that compiles (JAX, TensorFlow) read ``f``'s state when they
are traced, as ``jax.jit`` does (docs/conventions.md): there the second call gives either that or
the fresh answer, never a third one (an old program decompressed with a new pattern, say).

:func:`test_every_cache_kind_belongs_to_a_registered_transform` fails for a cache kind whose transform
is not in :data:`TRANSFORMS`; the mutation tests prove the comparison catches a key that drops the
state or the values.

The default run keeps every transform and change on the NumPy tape and torch, and representatives on
JAX and TensorFlow (each of their cases costs traces); the rest is ``slow`` (the thorough job).
"""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

import unigrad
from unigrad import _caches

from conftest import assert_same, outcome, uncached

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax", "tensorflow", "scipy")}
BACKENDS = ["numpy"] + [name for name in ("torch", "jax", "tensorflow") if HAVE[name]]
COMPILERS = ("jax", "tensorflow")

B, D = 4, 3


# ----------------------------------------------------------------------------------------- the state

COUPLED = False  # a global flag
PERM_IN_PLACE = np.arange(B)  # a closed-over index array, written in place
PERM_REBOUND = np.arange(B)  # a closed-over index array, the name rebound
MIX = np.eye(B)  # a closed-over matrix, written in place
ALPHA = 1.0  # a global Python float


def _flag(w, x):
    xp = unigrad.namespace(w, x)
    out = xp.sin(x * w)
    if COUPLED:
        out = out + xp.flip(x, axis=0) * w
    return out


def _make_closure():
    coupled = False

    def core(w, x):
        xp = unigrad.namespace(w, x)
        out = xp.sin(x * w)
        if coupled:
            out = out + xp.flip(x, axis=0) * w
        return out

    def rebind(value):
        nonlocal coupled
        coupled = value

    return core, rebind


_closure, _rebind = _make_closure()


def _in_place(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sin(x * w) + xp.take(x, xp.asarray(PERM_IN_PLACE), axis=0) * w


def _rebound(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sin(x * w) + xp.take(x, xp.asarray(PERM_REBOUND), axis=0) * w


def _matrix(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sin(x * w) + (xp.asarray(MIX, dtype=x.dtype) @ x) * w


def _float(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sin(x * w * ALPHA)


class _Defaults:
    table = {"alpha": 1.0}  # a class-level dict written in place, read through a subclass


class _Settings(_Defaults):
    """Class attributes f reads through the class (``_Settings.coupled``), not through an instance."""
    coupled = False
    perm = np.arange(B)  # a class-level array, written in place


def _class_flag(w, x):
    xp = unigrad.namespace(w, x)
    out = xp.sin(x * w)
    if _Settings.coupled:
        out = out + xp.flip(x, axis=0) * w
    return out


def _class_array(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sin(x * w) + xp.take(x, xp.asarray(_Settings.perm), axis=0) * w


def _base_dict(w, x):
    xp = unigrad.namespace(w, x)
    return xp.sin(x * w * _Settings.table["alpha"])


def _float_argument(w, x, alpha):
    xp = unigrad.namespace(w, x)
    return xp.sin(x * w * alpha)


def _set_flag(value):
    global COUPLED
    COUPLED = value


def _set_in_place(reverse):
    PERM_IN_PLACE[:] = np.arange(B)[::-1] if reverse else np.arange(B)


def _set_rebound(reverse):
    global PERM_REBOUND
    PERM_REBOUND = np.arange(B)[::-1].copy() if reverse else np.arange(B)


def _set_matrix(dense):
    MIX[...] = 1.0 if dense else np.eye(B)


def _set_float(changed):
    global ALPHA
    ALPHA = 2.5 if changed else 1.0


def _set_class_flag(value):
    _Settings.coupled = value


def _set_class_array(reverse):
    _Settings.perm[:] = np.arange(B)[::-1] if reverse else np.arange(B)


def _set_base_dict(changed):
    _Defaults.table["alpha"] = 2.5 if changed else 1.0


#: kind of change -> (f(w, x), set(changed: bool)); "float argument" changes an argument instead
CHANGES = {
    "global flag": (_flag, _set_flag),
    "rebound closure variable": (_closure, _rebind),
    "array written in place": (_in_place, _set_in_place),
    "array name rebound": (_rebound, _set_rebound),
    "closed-over matrix": (_matrix, _set_matrix),
    "global float": (_float, _set_float),
    "class attribute": (_class_flag, _set_class_flag),
    "class-level array written in place": (_class_array, _set_class_array),
    "base class dict written in place": (_base_dict, _set_base_dict),
    "float argument": (_float_argument, None),
}


# ------------------------------------------------------------------------------------- the transforms

def _scalar(core):
    def loss(w, x, *rest):
        return unigrad.namespace(w, x).sum(core(w, x, *rest) ** 2)
    return loss


def _flat_of_x(core):
    def f(x, w, *rest):
        return unigrad.namespace(w, x).reshape(core(w, x, *rest), (-1,))
    return f


def _scalar_of_x(core):
    loss = _scalar(core)

    def f(x, w, *rest):
        return loss(w, x, *rest)
    return f


def _per_example_losses(core):
    def f(w, x, *rest):
        return unigrad.namespace(w, x).sum(core(w, x, *rest) ** 2, axis=1)
    return f


def _primal_functions(core, backend):
    """vjp, jvp and hvp are functions, not transforms: one call of each."""
    def run(w, x, *rest):
        xp_ones = unigrad.asarray(np.ones((B, D)), backend=backend)
        out, pullback = unigrad.vjp(lambda x: core(w, x, *rest), x, backend=backend)
        _, tangent = unigrad.jvp(lambda x: core(w, x, *rest), (x,), (xp_ones,), backend=backend)
        hvp = unigrad.hvp(lambda x: _scalar(core)(w, x, *rest), (x,), (xp_ones,), backend=backend)
        return out, pullback(xp_ones), tangent, hvp
    return run


def _vmap(core, backend):
    """vmap over a batch of parameters (each row of ``ws`` one w), the whole batch x given to each."""
    mapped = {n: unigrad.vmap(core, in_axes=(0, None) + (None,) * n, backend=backend, memory_budget="1GB")
              for n in (0, 1)}

    def run(w, x, *rest):
        xp = unigrad.namespace(w)
        ws = xp.stack([w, 2 * w, 3 * w])
        return mapped[len(rest)](ws, x, *rest)
    return run


def _hessian_vector_product(core, backend, compile):
    t = unigrad.hessian_vector_product(_scalar_of_x(core), backend=backend, compile=compile)

    def run(w, x, *rest):
        v = unigrad.asarray(np.linspace(-1.0, 1.0, B * D).reshape(B, D), backend=backend)
        return t(x, w, *rest, v)
    return run


def _swap(t):
    """A transform of f(x, w, ...) called as (w, x, ...)."""
    def run(w, x, *rest):
        return t(x, w, *rest)
    return run


#: transform (the ``transform`` of its cache kinds) -> make(core, backend, compile) -> a function of (w, x, ...);
#: ``compile`` None: the transform has no compiled form
TRANSFORMS = {
    "grad": lambda core, bk, c: unigrad.grad(_scalar(core), backend=bk, compile=c),
    "jacobian": lambda core, bk, c: unigrad.jacobian(core, argnums=1, backend=bk, compile=c),
    "hessian": lambda core, bk, c: _swap(unigrad.hessian(_scalar_of_x(core), backend=bk, compile=c)),
    "value_jacobian_and_hessian": lambda core, bk, c: _swap(unigrad.value_jacobian_and_hessian(
        _scalar_of_x(core), mode="auto", backend=bk, compile=c)),
    "vjp/jvp/hvp": lambda core, bk, c: _primal_functions(core, bk),
    "batched_jacobian": lambda core, bk, c: unigrad.batched_jacobian(core, argnums=1, backend=bk, compile=c),
    "per_example_grad": lambda core, bk, c: unigrad.per_example_grad(_per_example_losses(core), backend=bk,
                                                                     compile=c),
    "per_example_grad_norms": lambda core, bk, c: unigrad.per_example_grad_norms(_per_example_losses(core),
                                                                                 backend=bk, compile=c),
    "sparse_jacobian": lambda core, bk, c: _swap(unigrad.sparse_jacobian(_flat_of_x(core), format="dense", backend=bk,
                                                                         compile=c)),
    "sparse_hessian": lambda core, bk, c: _swap(unigrad.sparse_hessian(_scalar_of_x(core), format="dense", backend=bk,
                                                                       compile=c)),
    "vmap": lambda core, bk, c: _vmap(core, bk),
    "hessian_vector_product": _hessian_vector_product,
}
NO_COMPILE = {"vjp/jvp/hvp", "vmap"}
NEEDS_SCIPY = {"sparse_jacobian", "sparse_hessian"}
#: kinds shared by several transforms (unigrad._call's Repeats and FlatPlans), and transforms tested elsewhere
ELSEWHERE = {
    "compiled calls": "every compiled transform above (Repeats)",
    "eager calls": "grad and vjp above (FlatPlans)",
    "unigrad.dask": "tests/test_dask.py::test_a_new_python_state_reaches_the_workers",
}


#: cases whose first call raises too (a matrix product over the batch mixes rows whatever the matrix holds)
FIRST_RAISES = {("batched_jacobian", "closed-over matrix")}


#: the class-attribute changes the default run keeps, per backend (eager): where a stale key showed
#: before the Python-state walk read classes (tests/test_cache_state.py::test_a_walk_blind_to_classes_is_caught)
CLASS_DEFAULTS = {
    "numpy": {("sparse_jacobian", "class attribute"), ("sparse_hessian", "class-level array written in place"),
              ("sparse_jacobian", "class-level array written in place")},
    "torch": {("sparse_jacobian", "class attribute")},
    "jax": {("batched_jacobian", "class-level array written in place")},
    "tensorflow": {("batched_jacobian", "class attribute"), ("sparse_jacobian", "class-level array written in place"),
                   ("per_example_grad", "base class dict written in place")},
}


def _default(transform, change, backend, compile):
    """The default run's share of the cross product (the rest is slow)."""
    if change.startswith(("class", "base class")):
        return not compile and (transform, change) in CLASS_DEFAULTS[backend]
    if backend in ("numpy", "torch"):
        return not compile or backend == "numpy"
    if backend == "jax":
        return change in ("global flag", "array written in place") and (
            not compile or transform in ("batched_jacobian", "sparse_jacobian", "grad"))
    return change == "global flag" and not compile and transform in (
        "batched_jacobian", "sparse_jacobian", "per_example_grad", "grad")


def _cases():
    for backend in BACKENDS:
        for compile in (False, True):
            for transform in TRANSFORMS:
                if compile and transform in NO_COMPILE:
                    continue
                for change in CHANGES:
                    marks = [] if _default(transform, change, backend, compile) else [pytest.mark.slow]
                    mode = "compiled" if compile else "eager"
                    yield pytest.param(transform, change, backend, compile, marks=marks,
                                       id=f"{transform}-{change.replace(' ', '_')}-{backend}-{mode}")


@pytest.fixture
def state():
    """Every kind of state at its first value, before and after the test."""
    def reset():
        for _, setter in CHANGES.values():
            if setter is not None:
                setter(False)
    reset()
    yield
    reset()


def _arguments(backend, change, changed):
    rng = np.random.default_rng(7)
    w = unigrad.asarray(rng.uniform(0.5, 1.5, D), backend=backend)
    x = unigrad.asarray(rng.uniform(-1.0, 1.0, (B, D)), backend=backend)
    return (w, x, 2.5 if changed else 1.0) if change == "float argument" else (w, x)


def second_call(transform, change, backend, compile):
    """``(first, second, fresh)``: the outcomes of a transform's call before and after the change, and of
    a transform made and run with every cache off after it."""
    core, setter = CHANGES[change]
    make = TRANSFORMS[transform]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = make(core, backend, compile)
        first = outcome(lambda: t(*_arguments(backend, change, False)))
        first = outcome(lambda: t(*_arguments(backend, change, False)))  # (a compiled call's repeat path)
        if setter is not None:
            setter(True)
        second = outcome(lambda: t(*_arguments(backend, change, True)))
        with uncached():
            fresh = outcome(lambda: make(core, backend, compile)(*_arguments(backend, change, True)))
    return first, second, fresh


def _check(transform, change, backend, compile):
    if transform in NEEDS_SCIPY and not HAVE["scipy"]:
        pytest.skip("sparse transforms need scipy (unigrad[sparse])")
    first, second, fresh = second_call(transform, change, backend, compile)
    if first[0] == "raised" and (transform, change) not in FIRST_RAISES:
        raise AssertionError(f"the first call raised {first[1].__name__}: the case tests nothing")
    if compile and backend in COMPILERS and change != "float argument":
        # a compiled program keeps the state it was traced with (jax.jit's contract): that or the fresh answer
        try:
            assert_same(second, first)
            return
        except AssertionError:
            pass
    assert_same(second, fresh)


@pytest.mark.parametrize("transform,change,bk,compile", list(_cases()))
def test_second_call_sees_the_state_as_it_is_now(state, transform, change, bk, compile):
    _check(transform, change, bk, compile)


def test_every_change_changes_the_answer(state):
    """Each kind of change changes what f computes (else the cases above could not fail)."""
    for change, (core, setter) in CHANGES.items():
        before = outcome(lambda: TRANSFORMS["jacobian"](core, "numpy", False)(*_arguments("numpy", change, False)))
        if setter is not None:
            setter(True)
        after = outcome(lambda: TRANSFORMS["jacobian"](core, "numpy", False)(*_arguments("numpy", change, True)))
        with pytest.raises(AssertionError):
            assert_same(after, before)


def test_every_cache_kind_belongs_to_a_registered_transform():
    """A cached transform not in TRANSFORMS (nor tested elsewhere, ELSEWHERE) fails here: register it."""
    import unigrad.dask  # noqa: F401 -- (its kinds are declared at import)
    import unigrad.sparse  # noqa: F401

    known = set(TRANSFORMS) | set(ELSEWHERE)
    strays = [k for k in _caches.kinds() if k.transform not in known]
    assert not strays, f"cache kinds of transforms this test does not run: {strays}; add them to TRANSFORMS"
    assert {k.transform for k in _caches.kinds()} >= set(TRANSFORMS), "a transform in TRANSFORMS keeps no cache"
    for kind in _caches.kinds():
        assert kind.why, f"{kind!r} says nothing of why it is keyed as it is"


# --------------------------------------------------------------- the comparison catches a key that forgets

def _dropping(monkeypatch, part):
    """Every cache key built without ``part`` (``"state"`` or ``"values"``)."""
    real = _caches.CacheKind.key

    def key(self, call, *extra):
        saved = getattr(self, part)
        setattr(self, part, False)
        try:
            return real(self, call, *extra)
        finally:
            setattr(self, part, saved)

    monkeypatch.setattr(_caches.CacheKind, "key", key)


#: (transform, change, backend, part dropped): each gives a stale answer when the key forgets that part
MUTANTS = [
    ("sparse_jacobian", "global flag", "numpy", "state"),
    ("sparse_jacobian", "closed-over matrix", "numpy", "state"),
    ("sparse_hessian", "rebound closure variable", "numpy", "state"),
    ("batched_jacobian", "global flag", "torch", "state"),
    ("batched_jacobian", "array written in place", "torch", "state"),
    pytest.param("batched_jacobian", "global flag", "jax", "state", marks=pytest.mark.slow),
    pytest.param("per_example_grad", "global float", "tensorflow", "state", marks=pytest.mark.slow),
    pytest.param("batched_jacobian", "global flag", "tensorflow", "state", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("transform,change,bk,part", MUTANTS)
def test_a_key_without_the_state_is_caught(state, monkeypatch, transform, change, bk, part):
    if bk not in BACKENDS:
        pytest.skip(f"{bk} is not installed")
    _dropping(monkeypatch, part)
    if transform == "batched_jacobian":  # its answer checks itself (below): blinded here, to test the keys
        from unigrad import _batched

        monkeypatch.setattr(_batched, "failed_rows", lambda *a, **k: ([], 0.0))
    with pytest.raises(AssertionError):
        _check(transform, change, bk, False)


def test_a_stale_row_proof_is_caught_by_the_answer_check(state, monkeypatch):
    """The class of mistake, not the instance (issue 36): with every key blind to the Python state, the row
    proof kept for the identity permutation is stale once the permutation reverses (the rows mix), yet
    batched_jacobian's check of its answer (unigrad._answer_check) refuses it: no wrong number."""
    if "torch" not in BACKENDS:
        pytest.skip("torch is not installed")
    _dropping(monkeypatch, "state")
    _check("batched_jacobian", "array written in place", "torch", False)


#: (transform, change, backend): each gave a stale answer when the walk read a class by its id alone
BLIND_TO_CLASSES = [
    ("sparse_jacobian", "class attribute", "numpy"),
    ("sparse_hessian", "class-level array written in place", "numpy"),
    ("per_example_grad", "base class dict written in place", "tensorflow"),
    pytest.param("batched_jacobian", "class attribute", "tensorflow", marks=pytest.mark.slow),
    pytest.param("batched_jacobian", "class-level array written in place", "jax", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("transform,change,bk", BLIND_TO_CLASSES)
def test_a_walk_blind_to_classes_is_caught(state, monkeypatch, transform, change, bk):
    """The class-attribute changes fail the comparison when the Python-state walk reads no class (as it
    did before issue 36): the cases above test the walk's reading of classes."""
    if bk not in BACKENDS:
        pytest.skip(f"{bk} is not installed")
    from unigrad import _pystate

    monkeypatch.setattr(_pystate, "_user_class", lambda cls: False)
    with pytest.raises(AssertionError):
        _check(transform, change, bk, False)


def test_a_key_without_the_values_is_caught(monkeypatch):
    """A detected pattern kept per signature alone reuses the pattern of another index array."""
    pytest.importorskip("scipy")
    _dropping(monkeypatch, "values")

    def f(x, perm):
        xp = unigrad.namespace(x)
        return xp.sin(xp.take(x, perm, axis=0))

    x, reverse = np.linspace(0.1, 0.9, 4), np.arange(4)[::-1].copy()
    want = np.cos(x[::-1])[:, None] * np.eye(4)[::-1]
    np.testing.assert_allclose(unigrad.sparse_jacobian(f, format="dense")(x, reverse), want)  # (fresh: right)
    sj = unigrad.sparse_jacobian(f, format="dense")
    sj(x, np.arange(4))
    with pytest.raises(ValueError, match="fails its check"):  # the stale pattern is caught by the answer's check
        sj(x, reverse)
    from unigrad.sparse import _transforms  # blind to the check: the keys alone decide, and the pattern is stale

    monkeypatch.setattr(_transforms, "failed_rows", lambda *a, **k: ([], 0.0))
    sj = unigrad.sparse_jacobian(f, format="dense")
    sj(x, np.arange(4))
    assert not np.allclose(sj(x, reverse), want)  # stale: the identity's pattern


def test_docs_say_what_each_cache_is_keyed_on():
    """docs/conventions.md's table names every kind of kept entry."""
    import pathlib

    import unigrad.dask  # noqa: F401
    import unigrad.sparse  # noqa: F401

    text = (pathlib.Path(__file__).parents[1] / "docs" / "conventions.md").read_text()
    section = text.split("## What unigrad keeps between calls", 1)[1].split("\n## ", 1)[0]
    missing = sorted({k.name for k in _caches.kinds() if k.name not in section})
    assert not missing, f"docs/conventions.md does not say what these are keyed on: {missing}"


# ------------------------------------------------- a custom rule that mixes rows at some values only

@unigrad.custom_jvp
def _sometimes_mixing(x):
    return x * 1.0


@_sometimes_mixing.defjvp
def _sometimes_mixing_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    xp = unigrad.namespace(x)
    mix = xp.where(xp.max(x) > 10, 1.0, 0.0)  # the rule mixes rows only where some value is above 10
    return _sometimes_mixing(x), t + mix * xp.flip(t, axis=0)


@pytest.mark.parametrize("bk", BACKENDS)
def test_once_keeps_no_verdict_for_f_with_a_custom_rule(bk):
    """A custom rule is opaque to every proof: its probe's verdict is never kept for the signature under
    check_independence='once', so values where the rule mixes rows are refused on a later call (they gave
    the per-example blocks of the sum trick, wrong by the mixed entries)."""
    bj = unigrad.batched_jacobian(_sometimes_mixing, backend=bk)
    small = unigrad.asarray(np.ones((4, 3)), backend=bk)
    np.testing.assert_allclose(unigrad.to_numpy(bj(small)), np.broadcast_to(np.eye(3), (4, 3, 3)))
    with pytest.raises(ValueError, match="not independent"):
        bj(unigrad.asarray(np.full((4, 3), 20.0), backend=bk))
    np.testing.assert_allclose(unigrad.to_numpy(bj(small)), np.broadcast_to(np.eye(3), (4, 3, 3)))
