"""Eager ``vjp`` and ``grad`` on arrays alone find their plan in one lookup (``unigrad._call.FlatPlans``):
the lookup is taken on a repeat, and whatever decided the plan (shape, dtype, the backend chosen now,
a call nested in another transform) makes it miss. Results are checked against uncached calls."""

from __future__ import annotations

import os

import numpy as np
import pytest

import unigrad
from unigrad import _api, _call

from conftest import uncached


def f(x):
    xp = unigrad.namespace(x)
    return xp.sum(xp.sin(x) ** 2)


@pytest.fixture
def full(monkeypatch):
    """How many calls went through the full ``prepare`` (the flat lookup missed or did not apply),
    not counting the uncached reference calls."""
    count = []
    real = _call.prepare

    def spy(*args, **kwargs):
        if not os.environ.get("UNIGRAD_NO_CACHE"):
            count.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_call, "prepare", spy)
    # vjp's module-level plans start empty here (other tests may have met these signatures before)
    monkeypatch.setattr(_api, "_PRIMAL_FLAT", _call.FlatPlans(_call.BoundedCache(_api.PRIMAL_PLANS, 64)))
    return count


def reference_vjp(x):
    with uncached():
        out, fn = unigrad.vjp(f, x)
        return out, fn(np.ones(()))


def check_vjp(x):
    out, fn = unigrad.vjp(f, x)
    (g,) = fn(np.ones(()))
    want_out, (want_g,) = reference_vjp(x)
    assert type(g) is type(want_g) and g.dtype == want_g.dtype and g.shape == want_g.shape
    np.testing.assert_allclose(unigrad.to_numpy(out), unigrad.to_numpy(want_out), rtol=1e-6)
    np.testing.assert_allclose(unigrad.to_numpy(g), unigrad.to_numpy(want_g), rtol=1e-6)


def test_a_repeat_takes_the_lookup_and_a_new_shape_or_dtype_misses(full):
    x = np.linspace(0.1, 0.9, 3)
    check_vjp(x)
    check_vjp(x + 1.0)  # same signature: no full prepare
    assert len(full) == 1
    check_vjp(np.linspace(0.1, 0.9, 4))  # shape
    check_vjp(x.astype(np.float32))  # dtype
    assert len(full) == 3


def test_grad_made_once_takes_the_lookup(full):
    g = unigrad.grad(f)
    x = np.linspace(0.1, 0.9, 3)
    g(x)
    got = g(x * 2)
    assert len(full) == 1
    with uncached():
        want = unigrad.grad(f)(x * 2)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    g(x.astype(np.float32))
    assert len(full) == 2


def test_the_backend_chosen_now_is_part_of_the_key(full):
    pytest.importorskip("jax")
    x = np.linspace(0.1, 0.9, 3)
    check_vjp(x)
    with unigrad.use_backend("jax"):
        out, fn = unigrad.vjp(f, x)  # converted to JAX: not the tape's plan
        (g,) = fn(unigrad.asarray(np.ones(()), backend="jax"))
    assert type(g).__module__.partition(".")[0] in ("jax", "jaxlib")
    np.testing.assert_allclose(unigrad.to_numpy(g), reference_vjp(x)[1][0], rtol=1e-6)


def test_a_nested_call_takes_the_full_path(full):
    x = np.linspace(0.1, 0.9, 3)
    unigrad.vjp(f, x)

    def outer(x):
        out, fn = unigrad.vjp(f, x)
        return fn(np.ones(()))[0].sum()

    before = len(full)
    got = unigrad.grad(outer)(x)
    assert len(full) > before  # the inner vjp saw traced values: full path
    with uncached():
        want = unigrad.grad(outer)(x)
    np.testing.assert_allclose(got, want, rtol=1e-12)
