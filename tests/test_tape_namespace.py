"""The tape's namespace against the Array API standard (issue 12 §2), with ``array_api_strict`` (the
standard's reference implementation) as the oracle for the functions that were missing or wrong."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import unigrad

from conftest import optional, requires

strict = optional("array_api_strict")  # the oracle; the tests that use it say so (needs_strict)
needs_strict = requires("array_api_strict")
xp = unigrad.namespace(np.ones(2))


def both(fn, *arrays):
    """``fn(namespace, *arrays)`` on the tape and on array_api_strict, as NumPy arrays."""
    ours = fn(xp, *arrays)
    theirs = fn(strict, *(strict.asarray(a) for a in arrays))
    return ours, theirs


def same(ours, theirs):
    if isinstance(theirs, tuple):
        assert len(ours) == len(theirs)
        for o, t in zip(ours, theirs):
            same(o, t)
        return
    t = np.asarray(theirs)
    assert np.asarray(ours).dtype == t.dtype, (np.asarray(ours).dtype, t.dtype)
    np.testing.assert_array_equal(ours, t)


I8 = np.array([-7, 3, 0, 100], np.int8)
J8 = np.array([2, 5, -1, 1], np.int8)
U8 = np.array([200, 100, 7, 255], np.uint8)
V8 = np.array([3, 2, 1, 0], np.uint8)


@needs_strict
@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
                                  "bitwise_right_shift"])
@pytest.mark.parametrize("pair", [(I8, np.abs(J8)), (U8, V8)], ids=["int8", "uint8"])
def test_bitwise_binary(name, pair):
    same(*both(lambda ns, a, b: getattr(ns, name)(a, b), *pair))


@needs_strict
@pytest.mark.parametrize("x", [I8, U8, np.array([True, False])], ids=["int8", "uint8", "bool"])
def test_bitwise_invert(x):
    same(*both(lambda ns, a: ns.bitwise_invert(a), x))


@needs_strict
@pytest.mark.parametrize("name", ["sum", "prod", "cumulative_sum", "cumulative_prod"])
@pytest.mark.parametrize("x", [U8, I8, np.array([1.5, 2.0], np.float32)], ids=["uint8", "int8", "float32"])
def test_small_integers_accumulate_in_64_bits(name, x):
    same(*both(lambda ns, a: getattr(ns, name)(a), x))
    same(*both(lambda ns, a: getattr(ns, name)(a, dtype=ns.uint8 if a.dtype == ns.uint8 else a.dtype), x))


@needs_strict
def test_cumulative_sum_include_initial_of_uint8():
    same(*both(lambda ns, a: ns.cumulative_sum(a, include_initial=True), U8))


@needs_strict
def test_vecdot_keeps_the_dtype_and_refuses_mismatched_sizes():
    same(*both(lambda ns, a, b: ns.vecdot(a, b), U8, V8))
    same(*both(lambda ns, a, b: ns.vecdot(a, b), np.ones((2, 3)), np.arange(3.0)))
    for ns in (xp, strict):
        with pytest.raises(ValueError):
            ns.vecdot(ns.asarray(np.ones(3)), ns.asarray(np.ones(1)))


@needs_strict
def test_expand_dims_positional_axis():
    same(*both(lambda ns, a: ns.expand_dims(a, 0), np.ones((2, 3))))
    same(*both(lambda ns, a: ns.expand_dims(a, axis=-1), np.ones((2, 3))))


@needs_strict
@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "full", "eye", "arange", "linspace", "zeros_like",
                                  "ones_like", "empty_like", "full_like", "from_dlpack", "expand_dims", "vecdot"])
def test_signatures_are_the_standards(name):
    ours = [(p.name, p.kind) for p in inspect.signature(getattr(xp, name)).parameters.values()]
    theirs = [(p.name, p.kind) for p in inspect.signature(getattr(strict, name)).parameters.values()]
    assert ours == theirs


@needs_strict
def test_creation_functions_values():
    same(xp.arange(5), strict.arange(5))
    same(xp.arange(1, 7, 2, dtype=xp.float32), strict.arange(1, 7, 2, dtype=strict.float32))
    same(xp.eye(3, 4, k=1), strict.eye(3, 4, k=1))
    same(xp.linspace(0.0, 1.0, 5, endpoint=False), strict.linspace(0.0, 1.0, 5, endpoint=False))
    same(xp.full((2,), 3, dtype=xp.int16), strict.full((2,), 3, dtype=strict.int16))
    with pytest.raises(ValueError, match="device"):
        xp.zeros(3, device="gpu")


def test_traced_fill_values_and_endpoints_keep_their_derivative():
    def f(a):
        ns = unigrad.namespace(a)
        return ns.sum(ns.full((3,), a[0]) * 2 + ns.linspace(a[0], a[1], 3)) + ns.sum(ns.full_like(a, a[1]))
    g = unigrad.grad(f, backend="numpy")(np.array([1.0, 3.0]))
    np.testing.assert_allclose(g, [6 + 1.5, 1.5 + 2])  # linspace's 3 points weigh (1, 1/2, 0) and (0, 1/2, 1)


@needs_strict
def test_unique_nextafter_diff_against_strict():
    x = np.array([3.0, 1.0, 3.0, 2.0])
    same(*both(lambda ns, a: ns.unique_values(a), x))
    same(*both(lambda ns, a: tuple(ns.unique_counts(a)), x))
    same(*both(lambda ns, a: tuple(ns.unique_inverse(a)), x))
    same(*both(lambda ns, a: ns.nextafter(a, a + 1), x))
    same(*both(lambda ns, a, p: ns.diff(a, prepend=p, append=p), x, np.array([0.5])))


@needs_strict
def test_finfo_iinfo_take_arrays_and_give_python_numbers():
    for t in (xp.float32, np.ones(2, np.float32)):
        info = xp.finfo(t)
        ref = strict.finfo(strict.float32)
        assert type(info.eps) is float and info.eps == ref.eps and info.max == ref.max and info.bits == 32
        assert info.smallest_normal == ref.smallest_normal and info.dtype == np.float32
    info = xp.iinfo(U8)
    assert type(info.max) is int and info.max == strict.iinfo(strict.uint8).max and info.min == 0


def test_namespace_info():
    info = xp.__array_namespace_info__()
    assert set(info.dtypes()) >= {"float32", "float64", "int64", "bool"}
    assert info.default_dtypes()["real floating"] == np.float64
