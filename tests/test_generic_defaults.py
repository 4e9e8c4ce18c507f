"""The Backend base class's generic defaults, on a backend that implements only the required methods.

This is what a minimal plugin gets: jacrev, jacfwd, batched_jacobian, hessian, hvp and vmap built
from its vjp and jvp (looped, or through its vmap when it declares one). The NumPy tape, which
overrides them all, is the reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from unigrad.tape import NumpyBackend

_TAPE = NumpyBackend()


def _make(vmap: bool):
    class Minimal(unigrad.Backend):
        """Only the required methods (delegated to the tape); everything else is the base's."""

        name = f"minimal_{'vmap' if vmap else 'loop'}"
        capabilities = unigrad.Capabilities(vmap=vmap, higher_order=True)  # the tape nests: second order is delivered

        def namespace(self):
            return _TAPE.namespace()

        def asarray(self, x, dtype=None, device=None):
            return _TAPE.asarray(x, dtype=dtype, device=device)

        def to_numpy(self, x):
            return _TAPE.to_numpy(x)

        def is_array(self, x):
            return _TAPE.is_array(x)

        def device(self, x):
            return "cpu"

        def vjp(self, f, primals, *, has_aux=False):
            return _TAPE.vjp(f, primals, has_aux=has_aux)

        def jvp(self, f, primals, tangents, *, has_aux=False):
            return _TAPE.jvp(f, primals, tangents, has_aux=has_aux)

    return Minimal


@pytest.fixture(params=[False, True], ids=["looped", "vmapped"])
def minimal(request):
    cls = _make(request.param)
    unigrad.register_backend(cls.name, cls)
    yield cls.name
    unigrad.unregister_backend(cls.name)


def layer(w, x):
    xp = unigrad.namespace(w, x)
    return xp.tanh(x @ w)


def layer_aux(w, x):
    y = layer(w, x)
    return y, {"mean": unigrad.namespace(y).mean(y)}


@pytest.fixture
def data():
    rng = np.random.default_rng(5)
    return rng.standard_normal((3, 2)), rng.standard_normal((4, 3))


def _close(a, b):
    np.testing.assert_allclose(unigrad.to_numpy(a), unigrad.to_numpy(b), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mode", ["rev", "fwd"])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_jacobian(minimal, data, mode, chunk_size):
    got = unigrad.jacobian(layer, argnums=(0, 1), mode=mode, chunk_size=chunk_size, backend=minimal)(*data)
    want = unigrad.jacobian(layer, argnums=(0, 1), mode=mode, backend="numpy")(*data)
    _close(got[0], want[0])
    _close(got[1], want[1])


@pytest.mark.parametrize("mode", ["rev", "fwd"])
def test_jacobian_with_aux(minimal, data, mode):
    got, aux = unigrad.jacobian(layer_aux, mode=mode, has_aux=True, backend=minimal)(*data)
    want, want_aux = unigrad.jacobian(layer_aux, mode=mode, has_aux=True, backend="numpy")(*data)
    _close(got, want)
    _close(aux["mean"], want_aux["mean"])


@pytest.mark.parametrize("mode", ["rev", "fwd"])
@pytest.mark.parametrize("chunk_size", [None, 1])
def test_batched_jacobian(minimal, data, mode, chunk_size):
    w, x = data
    got, aux = unigrad.batched_jacobian(layer_aux, argnums=1, mode=mode, chunk_size=chunk_size, has_aux=True,
                                        backend=minimal)(w, x)
    want = unigrad.batched_jacobian(layer, argnums=1, mode=mode, backend="numpy")(w, x)
    assert unigrad.to_numpy(got).shape == (4, 2, 3)
    _close(got, want)
    _close(aux["mean"], np.tanh(x @ w).mean())


def test_second_order_and_vmap(minimal, data):
    w, x = data

    def loss(w):
        return unigrad.namespace(w).sum(layer(w, x) ** 2)

    _close(unigrad.hessian(loss, backend=minimal)(w), unigrad.hessian(loss, backend="numpy")(w))
    v = np.ones_like(w)
    _close(unigrad.hvp(loss, (w,), (v,), backend=minimal)[0], unigrad.hvp(loss, (w,), (v,), backend="numpy")[0])
    _close(unigrad.vmap(lambda r: layer(w, r), backend=minimal)(x), layer(w, x))
