"""Each component of a call's signature, changed alone between two calls, gives a fresh result.

A transform keeps, per signature, a plan (and, with ``compile=True``, a program): see
``unigrad/_call.py``. The signature is the argument structure (dict key order included), each
array's shape, dtype and device, the values of static arguments, and the backend; ``argnums``,
``has_aux`` and ``compile`` belong to the transform. For each component, a test here makes two
calls of one transform that differ in that component only, and checks the second result against
the same call on a transform made and run with every cache off (:func:`uncached`), so the reference
cannot share anything with the transform under test.

Floats: with ``compile=True`` Python floats may be dynamic (not part of the signature), so for them
only the result is checked, never whether a program was reused.

``test_dropping_a_component_is_caught`` (marker ``slow``) proves these tests can fail: it reruns
this file with the key builder mutated to ignore one component (``tests/_key_mutations.py``) and
asserts that at least three of that component's tests fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import optree
import pytest

import unigrad
from unigrad import _call, _repeats
from unigrad.tape import NumpyBackend

from conftest import assert_same, outcome as _outcome, uncached

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax", "tensorflow")}
COMPILERS = [name for name in ("jax", "tensorflow") if HAVE[name]]
BACKENDS = ["numpy"] + [name for name in ("torch", "jax", "tensorflow") if HAVE[name]]


def runs(*names):
    """``(backend, compile)`` pairs for parametrize, of the installed backends among ``names``
    (``"jax-compiled"``: backend jax, compile=True); the eager tape and the compiled programs are where
    the caches are (eager JAX and TensorFlow add time, not cases)."""
    pairs = [(n.partition("-")[0], n.endswith("-compiled")) for n in names]
    kept = [(p, n) for p, n in zip(pairs, names) if p[0] in BACKENDS]
    return pytest.mark.parametrize("bk,compile", [p for p, _ in kept], ids=[n for _, n in kept])


TAPE_AND_PROGRAMS = ("numpy", "jax-compiled", "tensorflow-compiled")


# ------------------------------------------------------------------------------------ the reference

def second_call_is_fresh(make, first, second, context=contextlib.nullcontext):
    """``make()`` builds a transform; it is called with ``first`` then ``second`` (argument tuples);
    the second outcome must be what a transform made with every cache off gives for ``second``.
    ``context(i)`` (i = 0, 1) is entered around call i (a backend or device setting)."""
    t = make()
    with context(0):
        _outcome(lambda: t(*first))
    with context(1):
        got = _outcome(lambda: t(*second))
    with uncached(), context(1):
        want = _outcome(lambda: make()(*second))
    assert_same(got, want)
    return got


def test_the_reference_uses_no_cache():
    cache = _call.BoundedCache(_repeats.REPEATS)
    cache.put("k", 1)
    with uncached():
        assert cache.get("k") is None
        assert _call.BoundedCache(_repeats.REPEATS).put("j", 2) == 2
        assert not _call.caches_enabled()
    assert cache.get("k") == 1
    calls = []

    def f(x):
        calls.append(1)
        return unigrad.namespace(x).sum(x * x)

    x = np.ones(3)
    unigrad.vjp(f, x)
    with uncached():
        unigrad.vjp(f, x)
    assert len(calls) == 2


# ------------------------------------------------------------------------------------ structure

def weighted(p, y):
    """Weights each leaf of ``p`` by its position: a different structure gives a different gradient."""
    xs = optree.tree_leaves(p)
    xp = unigrad.namespace(*xs)
    total = xp.sum(y * y)
    for k, x in enumerate(xs):
        total = total + xp.sum(xp.sin(x) * (k + 1.0))
    return total


TRANSFORMS = {
    "grad": lambda f, **kw: unigrad.grad(f, **kw),
    "value_and_grad": lambda f, **kw: unigrad.value_and_grad(f, **kw),
    "jacobian": lambda f, **kw: unigrad.jacobian(f, **kw),
    "hessian": lambda f, **kw: unigrad.hessian(f, **kw),
}


@pytest.mark.parametrize("transform", ["grad", "jacobian"])
@runs("numpy", "jax-compiled")
def test_key_structure_same_leaves_other_nesting(transform, bk, compile):
    a, b, c = np.array([0.1, 0.2]), np.array([0.3, 0.4]), np.array([0.5, 0.6])
    second_call_is_fresh(lambda: TRANSFORMS[transform](weighted, backend=bk, compile=compile),
                         ((a, b), c), (a, (b, c)))


@pytest.mark.parametrize("bk", COMPILERS + ["numpy"])
def test_key_structure_tuple_then_list(bk):
    def kind(p):  # reads the container type: a list doubles
        xp = unigrad.namespace(*p)
        return xp.sum(p[0] * p[1]) * (2.0 if isinstance(p, list) else 1.0)

    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    second_call_is_fresh(lambda: unigrad.grad(kind, backend=bk, compile=True), ((a, b),), ([a, b],))


def by_order(p):
    """Weights the values of dict ``p`` by their position in its key order."""
    xp = unigrad.namespace(*p.values())
    total = 0.0
    for k, v in enumerate(p.values()):
        total = total + xp.sum(v * v) * (k + 1.0)
    return total


@pytest.mark.parametrize("transform", ["grad", "jacobian"])
@runs(*TAPE_AND_PROGRAMS)
def test_key_structure_dict_key_order(transform, bk, compile):
    a, b = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    got = second_call_is_fresh(lambda: TRANSFORMS[transform](by_order, backend=bk, compile=compile),
                               ({"a": a, "b": b},), ({"b": b, "a": a},))
    if transform == "grad":  # and the reference is right: "b" comes first, weight 1
        np.testing.assert_allclose(unigrad.to_numpy(got[1]["b"]), 2 * b)
        np.testing.assert_allclose(unigrad.to_numpy(got[1]["a"]), 4 * a)


# ------------------------------------------------------------------------------------ shapes

def coupled(x):  # rows coupled through the batch mean; a batch of one row is trivially independent
    xp = unigrad.namespace(x)
    return x * xp.mean(x, axis=0)


@runs("numpy", "torch", "jax-compiled", "tensorflow-compiled")
def test_key_shapes_batch_of_one_then_a_coupled_batch(bk, compile):
    x1 = np.array([[0.5, 1.0, 1.5]])
    x4 = np.arange(12.0).reshape(4, 3) / 7.0 + 0.1
    got = second_call_is_fresh(lambda: unigrad.batched_jacobian(coupled, backend=bk, compile=compile), (x1,), (x4,))
    assert got[0] == "raised"  # the reference refuses: the rows are not independent


def outer_sin(x):
    xp = unigrad.namespace(x)
    return xp.sin(x)[:, None] * x[None, :]


@pytest.mark.parametrize("transform", ["jacobian", "hessian"])
@runs("numpy", "jax-compiled")
def test_key_shapes_other_length(transform, bk, compile):
    f = outer_sin if transform == "jacobian" else (lambda x: unigrad.namespace(x).sum(outer_sin(x)))
    second_call_is_fresh(lambda: TRANSFORMS[transform](f, backend=bk, compile=compile),
                         (np.array([0.1, 0.2]),), (np.array([0.1, 0.2, 0.3]),))


# ------------------------------------------------------------------------------------ dtypes

def cube_sum(x):
    return unigrad.namespace(x).sum(x * x * x)


DTYPE_TRANSFORMS = {
    "grad": lambda bk, c: unigrad.grad(cube_sum, backend=bk, compile=c),
    "jacobian": lambda bk, c: unigrad.jacobian(lambda x: x * x, backend=bk, compile=c),
    "batched_jacobian": lambda bk, c: unigrad.batched_jacobian(lambda x: x * x, backend=bk, compile=c),
    "vjp": lambda bk, c: (lambda x: unigrad.vjp(lambda v: v * v, x, backend=bk)[1](unigrad.asarray(
        np.ones(x.shape), backend=bk, dtype=x.dtype.name if x.dtype.kind == "f" else "float64"))),
}


@pytest.mark.parametrize("transform", list(DTYPE_TRANSFORMS))
@runs("numpy", "torch", "jax-compiled")
def test_key_dtypes_float64_then_int64(transform, bk, compile):
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    got = second_call_is_fresh(lambda: DTYPE_TRANSFORMS[transform](bk, compile), (x,), (x.astype(np.int64),))
    assert got == ("raised", TypeError)  # an integer array is never differentiated


@pytest.mark.parametrize("transform", ["grad", "jacobian"])
@runs("numpy", "jax-compiled")
def test_key_dtypes_float64_then_float32(transform, bk, compile):
    x = np.array([[1.0, 2.0], [3.0, 4.0]]) + 1e-9
    got = second_call_is_fresh(lambda: DTYPE_TRANSFORMS[transform](bk, compile), (x,), (x.astype(np.float32),))
    assert got[0] == "ok" and unigrad.to_numpy(optree.tree_leaves(got[1])[0]).dtype == np.float32


# ------------------------------------------------------------------------------------ devices

class _TwoDevices(NumpyBackend):
    """The NumPy tape with a second, pretend device ``cpu:1``: every placement is logged."""

    name = "two_devices"
    array_modules = ()
    placed: list = []

    def devices(self):
        return ("cpu", "cpu:1")

    def asarray(self, x, dtype=None, device=None):
        if device is not None:
            type(self).placed.append(str(device))
        return NumpyBackend.asarray(self, x, dtype=dtype, device=None if device == "cpu:1" else device)


@pytest.fixture
def two_devices(register_backend):
    _TwoDevices.placed = []
    return register_backend(_TwoDevices.name, _TwoDevices)


DEVICE_TRANSFORMS = {
    "grad": lambda bk: unigrad.grad(cube_sum, backend=bk),
    "value_and_grad": lambda bk: unigrad.value_and_grad(cube_sum, backend=bk),
    "jacobian": lambda bk: unigrad.jacobian(lambda x: x * x, backend=bk),
    "vjp": lambda bk: (lambda x: unigrad.vjp(cube_sum, x, backend=bk)[1](np.float64(1.0))),
}


@pytest.mark.parametrize("order", [("cpu:1", None), (None, "cpu:1")], ids=str)
@pytest.mark.parametrize("transform", list(DEVICE_TRANSFORMS))
def test_key_devices_placement_follows_this_call(transform, order, two_devices):
    x = np.array([1.0, 2.0, 3.0])
    log = []

    @contextlib.contextmanager
    def on(i):
        _TwoDevices.placed = []
        with unigrad.use_device(order[i]):
            yield
        log.append(list(_TwoDevices.placed))

    second_call_is_fresh(lambda: DEVICE_TRANSFORMS[transform](two_devices), (x,), (x,), context=on)
    first, second, fresh = log
    assert second == fresh, f"placements of the second call {second}; of a fresh transform {fresh}"
    assert (order[1] or "none") in (second or ["none"])


# ------------------------------------------------------------------------------------ static values

def pick_row(x, k):
    return unigrad.namespace(x).sum(x[k] ** 2)


def signed(x, flip):
    xp = unigrad.namespace(x)
    return xp.sum(-x * x if flip else x * x * x)


def reduce_by(x, how):
    xp = unigrad.namespace(x)
    return xp.sum(x * x) if how == "sum" else xp.max(x * x * x)


STATIC = {"int": (pick_row, 0, 1), "bool": (signed, False, True), "str": (reduce_by, "sum", "max")}


@pytest.mark.parametrize("kind", list(STATIC))
@pytest.mark.parametrize("bk", COMPILERS + ["numpy"])
def test_key_static_values(kind, bk):
    f, v1, v2 = STATIC[kind]
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    second_call_is_fresh(lambda: unigrad.value_and_grad(f, backend=bk, compile=True), (x, v1), (x, v2))


@pytest.mark.parametrize("bk", COMPILERS)
def test_key_static_int_drives_a_shape(bk):
    def first_k(x, k):
        return unigrad.namespace(x).sum(x[:k] ** 2)

    got = second_call_is_fresh(lambda: unigrad.grad(first_k, backend=bk, compile=True),
                               (np.arange(4.0), 2), (np.arange(4.0), 3))
    np.testing.assert_array_equal(unigrad.to_numpy(got[1]), [0.0, 2.0, 4.0, 0.0])


@runs(*TAPE_AND_PROGRAMS)
def test_float_arguments_give_the_right_result(bk, compile):
    # Python floats may be dynamic arguments of a program: only the numbers are checked
    def scaled(x, s):
        return unigrad.namespace(x).sum(x * x * s)

    x = np.array([1.0, 2.0])
    got = second_call_is_fresh(lambda: unigrad.grad(scaled, backend=bk, compile=compile), (x, 0.5), (x, 2.0))
    np.testing.assert_allclose(unigrad.to_numpy(got[1]), 4.0 * x)
    got = second_call_is_fresh(lambda: unigrad.grad(scaled, backend=bk, compile=compile), (x, 0.0), (x, -0.0))
    np.testing.assert_array_equal(unigrad.to_numpy(got[1]), [0.0, 0.0])


# ------------------------------------------------------------------------------------ backend

@pytest.mark.parametrize("transform", ["grad", "jacobian", "vjp"])
@pytest.mark.parametrize("bk", [b for b in ("torch", "jax") if HAVE[b]])
def test_key_backend_from_the_context(transform, bk):
    make = {"grad": lambda: unigrad.grad(cube_sum), "jacobian": lambda: unigrad.jacobian(lambda x: x * x),
            "vjp": lambda: (lambda x: unigrad.vjp(cube_sum, x)[1](np.float64(1.0)))}[transform]
    x = np.array([1.0, 2.0, 3.0])
    on = lambda i: unigrad.use_backend(("numpy", bk)[i])  # noqa: E731
    got = second_call_is_fresh(make, (x,), (x,), context=on)
    assert unigrad.backends()[bk]["available"] and got[0] == "ok"
    assert unigrad.to_numpy(optree.tree_leaves(got[1])[0]).dtype == np.float64


@pytest.mark.parametrize("bk", [b for b in ("torch", "jax") if HAVE[b]])
def test_key_backend_explicit_on_vjp(bk):
    x = np.array([1.0, 2.0, 3.0])

    def pullback(backend):
        return unigrad.vjp(cube_sum, x, backend=backend)[1](np.float64(1.0))

    pullback("numpy")
    got = _outcome(lambda: pullback(bk))
    with uncached():
        want = _outcome(lambda: pullback(bk))
    assert_same(got, want)


# ------------------------------------------------------------------------------------ argnums

ARGNUMS_TRANSFORMS = ["grad", "value_and_grad", "jacobian", "hessian"]


@pytest.mark.parametrize("transform", ARGNUMS_TRANSFORMS)
@runs("numpy", "jax-compiled")
def test_key_argnums_two_transforms(transform, bk, compile):
    def f(x, y):
        xp = unigrad.namespace(x, y)
        return xp.sum(xp.sin(x) * y * y)

    x, y = np.array([0.1, 0.2]), np.array([0.3, 0.4])
    first = TRANSFORMS[transform](f, argnums=0, backend=bk, compile=compile)
    first(x, y)
    second_call_is_fresh(lambda: TRANSFORMS[transform](f, argnums=1, backend=bk, compile=compile), (x, y), (x, y))


# ------------------------------------------------------------------------------------ has_aux

def with_aux(x):
    xp = unigrad.namespace(x)
    return xp.sin(x) * x, x * 3.0


HAS_AUX = {
    "jacrev": lambda h, bk: unigrad.jacobian(with_aux, mode="rev", has_aux=h, backend=bk),
    "jacfwd": lambda h, bk: unigrad.jacobian(with_aux, mode="fwd", has_aux=h, backend=bk),
    "jacobian": lambda h, bk: unigrad.jacobian(with_aux, has_aux=h, backend=bk),
    "batched_jacobian": lambda h, bk: unigrad.batched_jacobian(with_aux, has_aux=h, backend=bk),
}


@pytest.mark.parametrize("first", [False, True], ids=["without-then-with", "with-then-without"])
@pytest.mark.parametrize("transform", list(HAS_AUX))
@pytest.mark.parametrize("bk", ["numpy"])
def test_key_has_aux_two_transforms(transform, first, bk):
    x = np.array([[0.1, 0.2], [0.3, 0.4]])
    HAS_AUX[transform](first, bk)(x)
    got = second_call_is_fresh(lambda: HAS_AUX[transform](not first, bk), (x,), (x,))
    assert got[0] == "ok" and isinstance(got[1], tuple) and len(got[1]) == 2
    second = unigrad.to_numpy(got[1][1])
    if not first:  # has_aux=True: the aux output as f returned it
        np.testing.assert_array_equal(second, 3.0 * x)
    else:  # has_aux=False: the Jacobian of the second output, 3 I (its entries sum to 3 per input)
        assert second.shape != x.shape and np.isclose(second.sum(), 3.0 * x.size)


# ------------------------------------------------------------------------------------ compile

COMPILE_TRANSFORMS = {
    "grad": lambda f, bk, c: unigrad.grad(f, backend=bk, compile=c),
    "value_and_grad": lambda f, bk, c: unigrad.value_and_grad(f, backend=bk, compile=c),
    "jacobian": lambda f, bk, c: unigrad.jacobian(f, backend=bk, compile=c),
}


@pytest.mark.parametrize("first", [True, False], ids=["compiled-then-eager", "eager-then-compiled"])
@pytest.mark.parametrize("transform", ["grad", "jacobian"])
@pytest.mark.parametrize("bk", COMPILERS)
def test_key_compile_two_transforms(transform, first, bk):
    """``compile`` changes how often f runs: a program traces it once, eagerly it runs on every call."""
    if first is False and not _call.caches_enabled():
        pytest.skip("counts the runs of a cached program (UNIGRAD_NO_CACHE is set)")
    runs = []

    def f(x):
        runs.append(1)
        return unigrad.namespace(x).sum(x * x * x)

    x = np.array([1.0, 2.0])
    t = COMPILE_TRANSFORMS[transform](f, bk, first)
    t(x), t(x)

    def count(make):
        t = make()
        t(x)
        del runs[:]
        t(x)
        return len(runs)

    # (with every cache off a program is rebuilt on each call, so the count is checked against the rule)
    got = count(lambda: COMPILE_TRANSFORMS[transform](f, bk, not first))
    assert (got > 0) == first, f"compile={not first}: f ran {got} times in a repeated call"
    second_call_is_fresh(lambda: COMPILE_TRANSFORMS[transform](f, bk, not first), (x,), (x + 1.0,))


# ------------------------------------------------------------------------------------ the mutations

COMPONENTS = ("structure", "shapes", "dtypes", "devices", "static", "backend", "argnums", "has_aux", "compile")


@pytest.mark.slow
@pytest.mark.parametrize("component", COMPONENTS)
def test_dropping_a_component_is_caught(component, tmp_path):
    """The tests above, rerun with the key builder ignoring ``component`` (tests/_key_mutations.py):
    at least three of that component's tests fail."""
    here = os.path.dirname(os.path.abspath(__file__))
    report = tmp_path / "report.json"
    env = dict(os.environ, UNIGRAD_KEY_MUTATION=component, UNIGRAD_KEY_MUTATION_REPORT=str(report),
               TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    env.pop("UNIGRAD_NO_CACHE", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_key_mutations",
                           "-m", "not slow", "-k", f"test_key_{component}", os.path.join(here, "test_call_keys.py")],
                          env=env, capture_output=True, text=True, timeout=900, cwd=here)
    out = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert report.exists(), out
    result = json.loads(report.read_text())
    assert result["applied"] > 0, f"the mutation of {component!r} was never used: the key builder moved?\n{out}"
    failed = result["failed"]
    assert len(failed) >= 3, f"dropping {component!r} from the key failed only {failed}\n{out}"
