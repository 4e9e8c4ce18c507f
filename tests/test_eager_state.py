"""Eager calls that run a program traced once per signature (TensorFlow's batched_jacobian and
sparse passes) must still see f's Python state as it is at each call: a global, a closed-over NumPy
array or a value in a dict changed between eager calls gave the first call's numbers (found by the
audit). unigrad._pystate.python_state is the part of the key that follows that state."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import unigrad
from unigrad._pystate import python_state

STATE = {"scale": 1.0}
WEIGHTS = np.array([1.0, 2.0, 3.0])


def _helper(x):
    return x * STATE["scale"]


def test_python_state_follows_what_f_reads():
    A = np.array([1.0, 2.0])
    box = {"k": [1, 2]}

    class Config:
        def __init__(self):
            self.temperature = 0.5

    cfg = Config()

    def f(x, c=2.0):
        return _helper(x) * A * box["k"][0] * cfg.temperature * c

    before = python_state(f)
    assert python_state(f) == before  # nothing changed: the same fingerprint (no new trace)
    for change, undo in [
        (lambda: A.__setitem__(0, 9.0), lambda: A.__setitem__(0, 1.0)),                 # closed-over array, in place
        (lambda: STATE.__setitem__("scale", 3.0), lambda: STATE.__setitem__("scale", 1.0)),  # a global, via a helper
        (lambda: box["k"].__setitem__(0, 7), lambda: box["k"].__setitem__(0, 1)),      # nested containers
        (lambda: setattr(cfg, "temperature", 0.7), lambda: setattr(cfg, "temperature", 0.5)),  # an object's attribute
        (lambda: setattr(f, "__defaults__", (3.0,)), lambda: setattr(f, "__defaults__", (2.0,))),  # a default
    ]:
        change()
        assert python_state(f) != before
        undo()
        assert python_state(f) == before
    import collections

    buffer, table = collections.deque([1.0, 2.0]), collections.OrderedDict(scale=1.0)

    def h(x):
        return x * buffer[-1] * table["scale"]

    before = python_state(h)
    buffer.append(3.0)
    assert python_state(h) != before
    before = python_state(h)
    table["scale"] = 2.0
    assert python_state(h) != before
    g = functools.partial(lambda x, w: x * w, w=np.array([1.0]))
    before = python_state(g)
    g.keywords["w"][0] = 2.0
    assert python_state(g) != before


class _Defaults:
    eps = 1e-3
    table = {"k": 1.0}  # a class-level dict, written in place
    weights = np.array([1.0, 2.0])  # a class-level array, written in place


class _Cfg(_Defaults):
    scale = 1.0

    @classmethod
    def doubled(cls):
        return 2 * cls.scale


def test_python_state_reads_user_defined_classes():
    """A class f reads is read as an instance is (issue 36: ``Cfg.scale = 2.0`` between calls kept TensorFlow's
    traced program): its own attributes, its user-defined bases', through the class or an instance of it."""
    cfg = _Cfg()

    def through_the_class(x):
        return x * _Cfg.scale * _Cfg.table["k"] * _Cfg.weights[0] * _Cfg.eps

    def through_an_instance(x):
        return x * cfg.scale

    for f in (through_the_class, through_an_instance):
        before = python_state(f)
        assert python_state(f) == before
        for change, undo in [
            (lambda: setattr(_Cfg, "scale", 2.0), lambda: setattr(_Cfg, "scale", 1.0)),           # the class's own
            (lambda: setattr(_Defaults, "eps", 1e-4), lambda: setattr(_Defaults, "eps", 1e-3)),   # a base's
            (lambda: _Defaults.table.__setitem__("k", 3.0), lambda: _Defaults.table.__setitem__("k", 1.0)),  # in place
            (lambda: _Defaults.weights.__setitem__(0, 5.0), lambda: _Defaults.weights.__setitem__(0, 1.0)),
            (lambda: setattr(_Cfg, "added", 1), lambda: delattr(_Cfg, "added")),                  # a new attribute
        ]:
            change()
            assert python_state(f) != before
            undo()
            assert python_state(f) == before

    def through_a_classmethod(x):
        return x * _Cfg.doubled()

    before = python_state(through_a_classmethod)
    _Cfg.scale = 4.0
    try:
        assert python_state(through_a_classmethod) != before
    finally:
        _Cfg.scale = 1.0


def test_python_state_reads_library_classes_by_id_and_bounds_classes():
    """builtins', the standard library's and frameworks' classes stay opaque (their id); a user class that
    refers to itself, or holds many attributes, costs a bounded walk."""
    import collections

    from unigrad import _pystate

    assert not any(_pystate._user_class(c) for c in (int, object, np.ndarray, collections.OrderedDict,
                                                     warnings.WarningMessage, unigrad.dependence.Aval))
    assert _pystate._user_class(_Cfg) and _pystate._user_class(_Defaults)

    def reads_libraries(x):
        return x, np.ndarray, collections.OrderedDict, unigrad.dependence.Aval

    assert len(python_state(reads_libraries)) < 12  # ids, not their attributes

    class Node:
        pass

    Node.parent, Node.me = Node, Node()  # a cycle through the class and an instance of it
    Big = type("Big", (), {f"a{i}": [i] for i in range(10_000)})

    def f(x):
        return x, Node, Big

    state = python_state(f)
    assert state == python_state(f)
    assert len(state) < 5 * 10_000  # each attribute once, as a dict's items (nothing walked twice)
    Big.a5[0] = -1  # (within the budget: read)
    assert python_state(f) != state


def test_python_state_is_bounded_on_cycles_and_large_containers():
    loop = []
    loop.append(loop)
    big = list(range(100_000))

    def f(x):
        return x, loop, big

    assert python_state(f) == python_state(f)


@pytest.fixture
def tf():
    return pytest.importorskip("tensorflow")


def _changing(tf, transform, f, x, want_of):
    for s in (1.0, 2.0, 5.0):
        STATE["scale"] = s
        WEIGHTS[:] = [s, 2 * s, 3 * s]
        try:
            got = transform(x)
        finally:
            STATE["scale"] = 1.0
        got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
        np.testing.assert_allclose(got, want_of(s), rtol=1e-12, err_msg=f"scale {s}")
    WEIGHTS[:] = [1.0, 2.0, 3.0]


def test_tensorflow_eager_batched_jacobian_sees_state_changed_between_calls(tf):
    def f(x):
        xp = unigrad.namespace(x)
        return xp.sin(x) * STATE["scale"] * xp.asarray(WEIGHTS)

    x = tf.constant(np.random.default_rng(0).standard_normal((4, 3)))
    bj = unigrad.batched_jacobian(f, backend="tensorflow")
    _changing(tf, bj, f, x, lambda s: np.stack([np.diag(np.cos(r) * s * WEIGHTS) for r in x.numpy()]))


def test_tensorflow_eager_sparse_jacobian_sees_state_changed_between_calls(tf):
    def g(x):
        return x[1:] * x[:-1] * STATE["scale"]

    v = np.random.default_rng(1).standard_normal(5)
    sj = unigrad.sparse_jacobian(g, backend="tensorflow", format="dense")

    def want(s):
        J = np.zeros((4, 5))
        J[np.arange(4), np.arange(4)] = v[1:] * s
        J[np.arange(4), np.arange(1, 5)] = v[:-1] * s
        return J

    _changing(tf, sj, g, tf.constant(v), want)


def test_tensorflow_eager_program_is_reused_while_state_is_unchanged(tf):
    import itertools

    traces = itertools.count()  # opaque to the fingerprint (a list that grows would be state that changes)

    def f(x):
        next(traces)
        xp = unigrad.namespace(x)
        return xp.sin(x) * STATE["scale"]

    x = tf.constant(np.ones((3, 2)))
    bj = unigrad.batched_jacobian(f, backend="tensorflow")
    bj(x)
    settled = next(traces)
    for _ in range(3):
        bj(x)
    assert next(traces) == settled + 1  # one program for one signature and one state: no trace per call


def test_tensorflow_eager_per_example_grad_sees_state_changed_between_calls(tf):
    def loss(w, x):
        return (x @ w * STATE["scale"]) ** 2  # one loss per row of x (the dense-layer fast path)

    w = tf.constant([1.0, -0.5], dtype=tf.float64)
    x = tf.constant(np.random.default_rng(2).standard_normal((4, 2)))
    grads = unigrad.per_example_grad(loss, backend="tensorflow")
    norms = unigrad.per_example_grad_norms(loss, backend="tensorflow")
    for s in (1.0, 3.0):
        STATE["scale"] = s
        try:
            g, n = grads(w, x).numpy(), norms(w, x).numpy()
        finally:
            STATE["scale"] = 1.0
        want = 2 * (x.numpy() @ w.numpy() * s)[:, None] * s * x.numpy()
        np.testing.assert_allclose(g, want, rtol=1e-12, err_msg=f"scale {s}")
        np.testing.assert_allclose(n, np.linalg.norm(want, axis=1), rtol=1e-12, err_msg=f"scale {s}")


# ------------------------------------------------------------ f that uses an array's value in Python

def _branching_losses(w, x):
    xp = unigrad.namespace(w, x)
    if xp.max(x) > 10:  # a Python branch on an array's value
        x = x * 2
    return xp.sum((x * w) ** 2, axis=1)


def _branching(x):
    xp = unigrad.namespace(x)
    if x[0] > 1.0:
        return x ** 2
    return xp.roll(x, 1) ** 3


@pytest.mark.parametrize("bk", ["jax", "tensorflow"])
def test_per_example_grad_of_f_that_branches_on_a_value(bk):
    """Eagerly such an f is read as it runs (JAX's program cannot be traced: every parameter is
    materialised instead of a bare TracerBoolConversionError); compiled, one clear error."""
    pytest.importorskip({"jax": "jax", "tensorflow": "tensorflow"}[bk])
    w, x = np.array([1.0, 2.0, 3.0]), np.arange(12.0).reshape(4, 3) / 2  # max 5.5: no doubling
    want = np.stack([2 * (r * w) * r for r in x])
    t = unigrad.per_example_grad(_branching_losses, backend=bk)
    np.testing.assert_allclose(unigrad.to_numpy(t(w, x)), want, rtol=1e-12)
    np.testing.assert_allclose(unigrad.to_numpy(t(w, 3 * x)), 4 * 9 * want, rtol=1e-12)  # max 16.5: doubled
    with pytest.raises(TypeError, match=r"per_example_grad\(compile=True\): f used the value of an array.*xp\.where"):
        unigrad.per_example_grad(_branching_losses, backend=bk, compile=True)(w, x)


@pytest.mark.parametrize("bk", ["jax", "tensorflow"])
def test_sparse_jacobian_of_f_that_branches_on_a_value(bk):
    """Eager TensorFlow maps such an f one element at a time, with a warning that says why (its vectorised
    map traces f into a graph, and a bare 'in user code' TypeError came out); compiled, one clear error. The
    pattern is read per call (control flow on a value widens it), so both branches are right."""
    pytest.importorskip({"jax": "jax", "tensorflow": "tensorflow"}[bk])
    pytest.importorskip("scipy")
    sj = unigrad.sparse_jacobian(_branching, backend=bk, format="dense")
    for x in (np.array([2.0, 1.0, 3.0]), np.array([0.5, 1.0, 3.0])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = unigrad.to_numpy(unigrad.jacobian(_branching, backend="numpy")(x))
            got = unigrad.to_numpy(sj(x))
        np.testing.assert_allclose(got, want, rtol=1e-12)
    with pytest.raises(TypeError, match=r"sparse_jacobian\(compile=True\): f used the value of an array"):
        unigrad.sparse_jacobian(_branching, backend=bk, compile=True)(np.array([2.0, 1.0, 3.0]))


def test_tensorflow_eager_vmap_of_f_that_branches_on_a_value_warns_and_is_right():
    """Forward-mode Jacobians on TensorFlow vectorise f itself (pfor over tangents): such an f is mapped one
    element at a time, eagerly, with a SlowMapWarning naming the fix."""
    pytest.importorskip("tensorflow")
    from unigrad_tensorflow._backend import SlowMapWarning

    w, x = np.array([1.0, 2.0, 3.0]), np.arange(12.0).reshape(4, 3) / 2
    with pytest.warns(SlowMapWarning, match="xp.where"):
        got = unigrad.jacobian(_branching_losses, mode="fwd", backend="tensorflow")(w, x)
    want = unigrad.jacobian(_branching_losses, mode="fwd", backend="numpy")(w, x)
    np.testing.assert_allclose(unigrad.to_numpy(got), want, rtol=1e-12)
