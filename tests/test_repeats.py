"""The repeat cache of compiled transforms (``unigrad._repeats.Repeats``): a call that repeats a flat
signature goes straight to its program, and everything that decided the program makes it miss.

Each test makes a first call (which the transform remembers), then a second call that differs in
one component, and checks both that the repeat path was not taken (spies on ``Repeats.call`` and
``Repeats.run``) and that the result equals a fresh, uncached transform's. A hit is checked to happen where it must
(the same signature with a new Python float), so the tests cannot pass by never taking it.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import unigrad

from conftest import uncached

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")


def loss(x, c):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x * c) * c)


def rows(x, c):
    xp = unigrad.namespace(x)
    return xp.tanh(x * c) * x


def fresh(transform, f, args, **options):
    with uncached():
        return transform(f, **options)(*args)


def jnp_array(a):
    return unigrad.asarray(np.asarray(a), backend="jax")


def check(got, want):
    got, want = unigrad.to_numpy(got), unigrad.to_numpy(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_new_float_repeats_and_is_used(repeat_hits):
    g = unigrad.grad(loss, backend="jax", compile=True)
    x = jnp_array(np.linspace(-1, 1, 5).astype(np.float32))
    g(x, 0.5)
    got = g(x, 1.25)
    assert repeat_hits == [False, True]
    check(got, fresh(unigrad.grad, loss, (x, 1.25), backend="jax", compile=True))


@pytest.mark.parametrize("second", ["shape", "dtype", "array-for-float", "int-for-float", "numpy-array"])
def test_a_changed_argument_misses(repeat_hits, second):
    g = unigrad.grad(loss, backend="jax", compile=True)
    x32 = np.linspace(-1, 1, 5).astype(np.float32)
    first = (jnp_array(x32), 0.5)
    args = {"shape": (jnp_array(np.linspace(-1, 1, 7).astype(np.float32)), 0.5),
            "dtype": (jnp_array(x32.astype(np.float64)), 0.5),
            "array-for-float": (jnp_array(x32), jnp_array(np.float32(0.5))),
            "int-for-float": (jnp_array(x32), 2),
            "numpy-array": (x32, 0.5)}[second]
    g(*first)
    got = g(*args)
    assert True not in repeat_hits
    check(got, fresh(unigrad.grad, loss, args, backend="jax", compile=True))
    g(*args)  # the second signature is remembered too (an int is static: never a repeat)
    assert repeat_hits.count(True) == (second != "int-for-float")


def test_a_static_float_never_repeats(repeat_hits):
    g = unigrad.grad(loss, backend="jax", compile=True, static_argnums=1)
    x = jnp_array(np.linspace(-1, 1, 5).astype(np.float32))
    g(x, 0.5)
    got = g(x, 0.75)
    assert not any(repeat_hits)
    check(got, fresh(unigrad.grad, loss, (x, 0.75), backend="jax", compile=True, static_argnums=1))


def test_the_backend_and_device_chosen_now_are_part_of_the_key(repeat_hits):
    g = unigrad.grad(loss, compile=True)  # no backend=: chosen on every call
    x = np.linspace(-1, 1, 5)
    with unigrad.use_backend("jax"):
        g(x, 0.5)
        g(x, 0.6)
    got = g(x, 0.7)  # the NumPy tape now: not the JAX program
    assert repeat_hits == [False, True, False]
    assert isinstance(got, np.ndarray)
    check(got, fresh(unigrad.grad, loss, (x, 0.7), backend="numpy"))
    with unigrad.use_backend("jax"), unigrad.use_device("cpu"):
        g(x, 0.8)
    assert repeat_hits[-1] is False


def test_a_call_inside_another_transform_takes_the_full_path(repeat_hits):
    g = unigrad.grad(loss, backend="jax", compile=True)
    x = jnp_array(np.linspace(-1, 1, 5))
    g(x, 0.5)
    outer = unigrad.grad(lambda x: unigrad.namespace(x).sum(g(x, 0.5) ** 2), backend="jax")(x)
    assert repeat_hits[-1] is False
    with uncached():
        want = unigrad.grad(lambda x: unigrad.namespace(x).sum(
            unigrad.grad(loss, backend="jax", compile=True)(x, 0.5) ** 2), backend="jax")(x)
    check(outer, want)


def test_jacobian_repeats(repeat_hits):
    jac = unigrad.jacobian(rows, backend="jax", compile=True)
    x = jnp_array(np.linspace(-1, 1, 4).reshape(2, 2))
    jac(x, 0.5)
    got = jac(x, 1.5)
    assert repeat_hits == [False, True]
    check(got, fresh(unigrad.jacobian, rows, (x, 1.5), backend="jax", compile=True))


def test_batched_jacobian_repeats_only_a_signature_proved_for_all_values(repeat_hits):
    x = jnp_array(np.linspace(-1, 1, 6).reshape(3, 2))
    proved = unigrad.batched_jacobian(lambda x: rows(x, 2.0), backend="jax", compile=True)
    want = fresh(unigrad.batched_jacobian, lambda x: rows(x, 2.0), (x,), backend="jax", compile=True)
    repeat_hits.clear()
    proved(x)
    check(proved(x), want)
    assert repeat_hits == [False, True]
    # a Python float the proof saw: proved for its value only, so never a repeat
    repeat_hits.clear()
    with_float = unigrad.batched_jacobian(rows, backend="jax", compile=True)
    with_float(x, 0.5)
    with_float(x, 0.5)
    assert repeat_hits == [False, False]
    # probed on every call: never a repeat
    repeat_hits.clear()
    always = unigrad.batched_jacobian(lambda x: rows(x, 2.0), backend="jax", compile=True,
                                      check_independence="always")
    always(x)
    always(x)
    assert repeat_hits == [False, False]


def test_batched_jacobian_repeat_still_sees_a_mixing_f_of_another_signature(repeat_hits):
    def f(x):
        xp = unigrad.namespace(x)
        return x - xp.mean(x, axis=0) if x.shape[0] > 3 else x * x

    bj = unigrad.batched_jacobian(f, backend="jax", compile=True)
    small = jnp_array(np.ones((3, 2)))
    bj(small)
    bj(small)
    assert repeat_hits == [False, True]
    with pytest.raises(ValueError, match="not independent"):
        bj(jnp_array(np.ones((4, 2))))
    with pytest.raises(ValueError, match="not independent"):
        bj(jnp_array(np.ones((4, 2))))


def pair(c, x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x * c) * x)


@pytest.mark.parametrize("form", ["value_and_grad", "argnums-tuple", "float64", "float-first"])
def test_each_whole_call_runner_gives_the_uncached_result(repeat_hits, form):
    """A repeat of grad / value_and_grad runs as one runner (found and run by ``Repeats.run``): each of its forms
    (value and gradient, a tuple of gradients, a 64-bit signature run under x64, arguments the
    program takes in another order) gives what an uncached transform gives, on the hit itself."""
    x32 = np.linspace(-1, 1, 5).astype(np.float32)
    if form == "value_and_grad":
        transform, f, options, args = unigrad.value_and_grad, loss, {}, lambda c: (jnp_array(x32), c)
    elif form == "argnums-tuple":
        transform, f, options = unigrad.grad, lambda x, y, c: loss(x * y, c), {"argnums": (0, 1)}
        args = lambda c: (jnp_array(x32), jnp_array(x32[::-1].copy()), c)  # noqa: E731
    elif form == "float64":
        transform, f, options, args = unigrad.grad, loss, {}, lambda c: (jnp_array(x32.astype(np.float64)), c)
    else:  # the float first: the program takes (x, c), the call gives (c, x)
        transform, f, options, args = unigrad.grad, pair, {"argnums": 1}, lambda c: (c, jnp_array(x32))
    g = transform(f, backend="jax", compile=True, **options)
    g(*args(0.5))
    got = g(*args(1.25))
    assert repeat_hits == [False, True]
    want = fresh(transform, f, args(1.25), backend="jax", compile=True, **options)
    for a, b in zip(optree_leaves(got), optree_leaves(want)):
        check(a, b)
    if form == "float64":
        assert unigrad.to_numpy(got).dtype == np.float64


def optree_leaves(tree):
    import optree

    return optree.tree_leaves(tree)


@pytest.mark.parametrize("rule", ["use_backend", "set_backend", "UNIGRAD_BACKEND"])
def test_each_rule_choosing_the_backend_now_is_part_of_the_key(repeat_hits, monkeypatch, rule):
    """A transform without ``backend=`` that repeated on JAX while a rule chose JAX takes the full path
    (here: the NumPy tape) as soon as that rule no longer chooses it."""
    import contextlib

    g = unigrad.grad(loss, compile=True)
    x = np.linspace(-1, 1, 5)

    @contextlib.contextmanager
    def jax_chosen():
        if rule == "use_backend":
            with unigrad.use_backend("jax"):
                yield
        elif rule == "set_backend":
            unigrad.set_backend("jax")
            try:
                yield
            finally:
                unigrad.set_backend(None)
        else:
            monkeypatch.setenv("UNIGRAD_BACKEND", "jax")
            yield
            monkeypatch.delenv("UNIGRAD_BACKEND")

    with jax_chosen():
        g(x, 0.5)
        on_jax = g(x, 0.6)
    assert repeat_hits == [False, True]
    assert not isinstance(on_jax, np.ndarray)
    got = g(x, 0.7)
    assert repeat_hits[-1] is False and isinstance(got, np.ndarray)
    check(got, fresh(unigrad.grad, loss, (x, 0.7), backend="numpy"))


@pytest.mark.parametrize("context", [None, ""])
def test_the_device_variable_set_now_is_part_of_the_key(repeat_hits, monkeypatch, context):
    """``UNIGRAD_DEVICE`` is read on every call (the repeat key holds its raw value): setting it makes a
    repeated signature miss, and unsetting it again finds the first program. ``use_device`` with an
    empty device leaves the choice to the variable, in the key as in the full path."""
    import contextlib

    monkeypatch.delenv("UNIGRAD_DEVICE", raising=False)
    g = unigrad.grad(loss, backend="jax", compile=True)
    x = jnp_array(np.linspace(-1, 1, 5).astype(np.float32))
    with contextlib.nullcontext() if context is None else unigrad.use_device(context):
        g(x, 0.5)
        g(x, 0.6)
        assert repeat_hits == [False, True]
        monkeypatch.setenv("UNIGRAD_DEVICE", "cpu")
        got = g(x, 0.7)
        assert repeat_hits[-1] is False
        check(got, fresh(unigrad.grad, loss, (x, 0.7), backend="jax", compile=True, device="cpu"))
        monkeypatch.delenv("UNIGRAD_DEVICE")
        repeat_hits.clear()
        got = g(x, 0.8)
        assert repeat_hits == [True]
        check(got, fresh(unigrad.grad, loss, (x, 0.8), backend="jax", compile=True))


def test_a_weak_or_strong_scalar_array_and_a_python_float_give_their_own_results(repeat_hits):
    """JAX's key stand-in for an array is its abstract value, which holds the weak type: a weakly typed
    0-d array (``jnp.asarray(0.5)``), a float32 one and a Python float are three signatures, each with
    the uncached result, in any order."""
    import jax.numpy as jnp

    g = unigrad.grad(pair, argnums=1, backend="jax", compile=True)  # the gradient of the second argument
    x = jnp_array(np.linspace(-1, 1, 5).astype(np.float32))
    scalars = [jnp.asarray(0.5), jnp.asarray(0.5, dtype=jnp.float32), 0.5]
    assert scalars[0].weak_type and not scalars[1].weak_type
    for c in scalars + scalars[::-1]:
        check(g(c, x), fresh(unigrad.grad, pair, (c, x), argnums=1, backend="jax", compile=True))
    assert repeat_hits.count(True) == 3  # the second half repeats the first, signature by signature


def test_the_x64_context_of_the_call_gives_the_uncached_result(repeat_hits):
    """JAX's own cache holds the x64 state: a signature remembered outside ``jax.enable_x64`` and
    repeated inside it (and back) gives what an uncached transform gives there, 32-bit and 64-bit
    arrays alike."""
    import jax

    g = unigrad.grad(loss, backend="jax", compile=True)
    x32 = jnp_array(np.linspace(-1, 1, 5).astype(np.float32))
    x64 = jnp_array(np.linspace(-1, 1, 5))  # float64 (unigrad.asarray keeps NumPy's dtype)
    for x in (x32, x64):
        g(x, 0.5)
        with jax.enable_x64(True):
            inside = g(x, 0.1 + 1e-12)
            want = fresh(unigrad.grad, loss, (x, 0.1 + 1e-12), backend="jax", compile=True)
        check(inside, want)
        check(g(x, 0.1 + 1e-12), fresh(unigrad.grad, loss, (x, 0.1 + 1e-12), backend="jax", compile=True))
    assert unigrad.to_numpy(g(x64, 0.5)).dtype == np.float64


def test_an_array_stands_in_the_key_by_its_backends_signature_attribute():
    """``Backend.signature_attribute``: JAX arrays by their ``aval`` (one attribute), NumPy arrays by
    ``(shape, dtype)``; either is equal for two arrays only where shapes and dtypes are equal."""
    from unigrad import _signature

    a, b = jnp_array(np.ones((2, 3), np.float32)), jnp_array(np.zeros((2, 3), np.float32))
    unigrad.grad(loss, backend="jax", compile=True)(a, 0.5)  # the JAX backend is loaded
    summary = _signature._summary(a)
    assert summary(a) is a.aval and summary(a) == summary(b)
    assert summary(a) != summary(jnp_array(np.ones((3, 2), np.float32)))
    assert summary(a) != summary(jnp_array(np.ones((2, 3), np.float64)))
    n = np.ones((2, 3))
    assert _signature._SUMMARIES[np.ndarray](n) == ((2, 3), np.dtype("float64"))
    assert _signature._summary(0.5) is None and _signature._summary(3) is None and _signature._summary((a,)) is None
    import jax

    # an object of JAX's modules without an aval (no array): no key, the full path
    assert _signature._summary(jax.ShapeDtypeStruct((2, 3), np.float32)) is None


def two_outputs(x, c):
    xp = unigrad.namespace(x)
    return xp.tanh(x * c), x * x


def with_aux(x, c):
    return rows(x, c), unigrad.namespace(x).sum(x)


@pytest.mark.parametrize("transform", ["jacobian", "batched_jacobian"])
@pytest.mark.parametrize("form", ["one-block", "argnums-tuple", "two-outputs", "has-aux", "float64"])
def test_jacobian_repeats_give_the_uncached_result_in_every_form(repeat_hits, monkeypatch, transform, form):
    """A repeat of ``jacobian`` / ``batched_jacobian`` whose result is the program's one block runs whole
    (``block_runner``); the other forms (blocks for a tuple of arguments, a tuple of outputs, aux) go
    through the repeat's Call. Each is a hit on the second call and equals an uncached transform."""
    x32 = np.linspace(-1, 1, 6).reshape(3, 2).astype(np.float32)
    f, options, args = rows, {}, lambda c: (jnp_array(x32), c)
    if form == "argnums-tuple":
        f, options = (lambda x, y, c: rows(x * y, c)), {"argnums": (0, 1)}
        args = lambda c: (jnp_array(x32), jnp_array(x32[::-1].copy()), c)  # noqa: E731
    elif form == "two-outputs":
        f = two_outputs
    elif form == "has-aux":
        f, options = with_aux, {"has_aux": True}
    elif form == "float64":
        args = lambda c: (jnp_array(x32.astype(np.float64)), c)  # noqa: E731
    if transform == "batched_jacobian":
        options["check_independence"] = "never"  # (remembered whatever the proof: the runner is under test)
    from unigrad import _repeats

    built = []  # the repeat Calls built (a runner builds none)
    spied = _repeats.Repeats.call
    monkeypatch.setattr(_repeats.Repeats, "call", lambda self, *a: built.append(1) or spied(self, *a))
    make = getattr(unigrad, transform)
    g = make(f, backend="jax", compile=True, **options)
    g(*args(0.5))
    got = g(*args(1.25))
    assert repeat_hits == [False, True]
    assert len(built) == (1 if form in ("one-block", "float64") else 2)
    want = fresh(make, f, args(1.25), backend="jax", compile=True, **options)
    got_leaves, want_leaves = optree_leaves(got), optree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for a, b in zip(got_leaves, want_leaves):
        if isinstance(b, (float, int)):
            assert a == b
        else:
            check(a, b)
    if form == "float64":
        assert unigrad.to_numpy(got).dtype == np.float64


def test_a_registration_change_makes_a_repeat_without_backend_miss(repeat_hits):
    """Without ``backend=`` the key holds what the selection rules read, and the count of registration
    changes: a backend registered anew under the name ``set_backend`` chose runs the next call (its
    own program), not the repeat of the old one."""
    from unigrad_jax import JaxBackend

    made = []

    class Counting(JaxBackend):
        def compile(self, fn, weak_scalars=()):
            made.append(self)
            return super().compile(fn, weak_scalars)

    g = unigrad.grad(loss, compile=True)
    x = jnp_array(np.linspace(-1, 1, 5).astype(np.float32))
    unigrad.register_backend("jax_counting", Counting)
    try:
        unigrad.set_backend("jax_counting")
        g(x, 0.5)
        g(x, 0.6)
        assert repeat_hits == [False, True] and len(made) == 1
        unigrad.register_backend("jax_counting", Counting, replace=True)  # a new instance under the name
        got = g(x, 0.7)
        assert repeat_hits[-1] is False
        assert len(made) == 2 and made[1] is not made[0] and made[1] is unigrad.get_backend("jax_counting")
    finally:
        unigrad.set_backend(None)
        unigrad.unregister_backend("jax_counting")
    check(got, fresh(unigrad.grad, loss, (x, 0.7), backend="jax", compile=True))


def test_a_backend_instance_passed_as_backend_repeats(repeat_hits):
    b = unigrad.get_backend("jax")
    g = unigrad.grad(loss, backend=b, compile=True)
    x = jnp_array(np.linspace(-1, 1, 5).astype(np.float32))
    g(x, 0.5)
    got = g(x, 0.6)
    assert repeat_hits == [False, True]
    check(got, fresh(unigrad.grad, loss, (x, 0.6), backend="jax", compile=True))


@pytest.mark.parametrize("engine", ["jax", "tensorflow"])
@pytest.mark.parametrize("form", ["array", "one-leaf-dict", "float-first", "two-leaves"])
def test_a_compiled_grad_of_one_leaf_returns_the_uncached_gradient(engine, form):
    """A compiled ``grad`` of one leaf, without aux, has a program returning the gradient itself (not a
    1-tuple: ``Program.bare``); the first call, its repeats, the full path (a pytree) and the
    reordered runner give the eager gradient, on every compiling backend. Two leaves: no bare program."""
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} not installed")
    x32 = np.linspace(-1, 1, 5).astype(np.float32)
    x = unigrad.asarray(x32, backend=engine)
    f, argnums, args = loss, 0, lambda c: (x, c)
    if form == "one-leaf-dict":
        f, args = (lambda p, c: loss(p["w"], c)), (lambda c: ({"w": x}, c))
    elif form == "float-first":
        f, argnums, args = pair, 1, (lambda c: (c, x))
    elif form == "two-leaves":
        f, args = (lambda p, c: loss(p[0] * p[1], c)), (lambda c: ((x, x), c))
    g = unigrad.grad(f, argnums=argnums, backend=engine, compile=True)
    for c in (0.5, 0.75, 1.25):
        got, want = g(*args(c)), unigrad.grad(f, argnums=argnums, backend=engine)(*args(c))
        for a, b in zip(optree_leaves(got), optree_leaves(want)):
            np.testing.assert_allclose(unigrad.to_numpy(a), unigrad.to_numpy(b), rtol=1e-5)
            assert unigrad.to_numpy(a).dtype == np.float32
        assert len(optree_leaves(got)) == (2 if form == "two-leaves" else 1)


@pytest.mark.parametrize("form", ["grad-float64", "grad-float32", "value_and_grad", "jacobian", "numpy-dynamic",
                                  "int64-dynamic", "big-endian"])
def test_numpy_arrays_reach_the_compiled_program_as_they_are(repeat_hits, monkeypatch, form):
    """Issue 37 item 3: a compiled JAX transform called with NumPy arrays of a floating dtype (and a new
    Python float each call) runs its repeats with no conversion of its own (``jax.jit`` takes the NumPy
    arrays), keeping float64, and gives the eager NumPy-tape result (an independent engine) on every
    call. A NumPy integer array or a non-native byte order is still converted (the full path), with the
    same results."""
    from unigrad_jax import JaxBackend

    x64 = np.linspace(-1, 1, 5)
    transform, f, argnums, args = unigrad.grad, loss, 0, lambda c: (x64, c)
    if form == "grad-float32":
        args = lambda c: (x64.astype(np.float32), c)  # noqa: E731
    elif form == "value_and_grad":
        transform = unigrad.value_and_grad
    elif form == "jacobian":
        transform, f = unigrad.jacobian, rows
    elif form in ("numpy-dynamic", "int64-dynamic"):
        w = x64[::-1].copy() if form == "numpy-dynamic" else np.arange(5)
        f, argnums, args = (lambda x, w, c: loss(x * w, c)), 0, (lambda c: (x64, w, c))
    elif form == "big-endian":
        args = lambda c: (x64.astype(">f8"), c)  # noqa: E731
    imports = []
    real_import = JaxBackend._import
    monkeypatch.setattr(JaxBackend, "_import", lambda self, x: imports.append(1) or real_import(self, x))
    g = transform(f, argnums=argnums, backend="jax", compile=True)
    for n, c in enumerate((0.5, 0.75, 1.25)):
        del imports[:]
        got = g(*args(c))
        want = transform(f, argnums=argnums, backend="numpy")(*args(c))
        for a, b in zip(optree_leaves(got), optree_leaves(want)):
            a, b = unigrad.to_numpy(a), unigrad.to_numpy(b)
            assert a.dtype.name == b.dtype.name and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-6 if b.dtype == np.float32 else 1e-12, atol=1e-15)
        converted = form in ("int64-dynamic", "big-endian")
        assert bool(imports) == (n == 0 or converted), imports
    assert repeat_hits.count(True) == 2


def test_a_numpy_array_written_after_a_compiled_call_leaves_its_result_alone():
    """``jax.jit`` may read a NumPy argument in place while it computes after returning (asynchronous
    dispatch, zero-copy on the CPU): a repeat that hands NumPy arrays to the program hands it a copy, so
    writing into the caller's array right after the call never changes the gradient it returned."""
    g = unigrad.grad(loss, backend="jax", compile=True)
    x = np.linspace(-1.0, 1.0, 2_000_000)
    want = np.cos(x * 0.5) * 0.25  # d/dx sum(sin(c x) c) at c = 0.5
    g(x, 0.25)
    for _ in range(6):  # (unguarded, most of these reads saw the write)
        mine = x.copy()
        got = g(mine, 0.5)
        mine[:] = 7.0
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
