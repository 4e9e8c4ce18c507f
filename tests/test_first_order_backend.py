"""A backend that declares ``higher_order=False`` never returns a silent zero for a second derivative:
the core refuses nested transforms on it, and the conformance suite skips its nested parts with the reason.

The backend here is what a first-order plugin is (mygrad was): the tape, with each transform cutting
its inputs loose from outer transforms -- so nested transforms, if allowed, would give zeros.
"""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from unigrad.tape import NumpyBackend
from unigrad.tape._tracer import concrete
from unigrad.testing import conformance


class FirstOrder(NumpyBackend):
    capabilities = unigrad.Capabilities(forward_mode=True, higher_order=False, complex=True)

    def vjp(self, f, primals, *, has_aux=False):
        return super().vjp(f, tuple(concrete(p) for p in primals), has_aux=has_aux)

    def jvp(self, f, primals, tangents, *, has_aux=False):
        return super().jvp(f, tuple(concrete(p) for p in primals), tuple(concrete(t) for t in tangents),
                           has_aux=has_aux)


def cube(x):
    return unigrad.namespace(x).sum(x ** 3)


@pytest.fixture
def first_order(register_backend):
    return register_backend("first_order_test", FirstOrder)


def test_the_refusal_is_needed(first_order):
    """Without the core's check the backend's own hessian is all zeros (what a plugin author saw)."""
    b = unigrad.get_backend(first_order)
    h = b.hessian(lambda x: (cube(x),), (np.array([1.0, 2.0]),))
    assert np.all(np.asarray(h[0][0]) == 0)


def test_nested_transforms_are_refused(first_order):
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(unigrad.grad(cube, backend=first_order)(x), 3 * x ** 2)  # first order works
    with pytest.raises(NotImplementedError, match="hessian: the 'first_order_test' backend does not nest"):
        unigrad.hessian(cube, backend=first_order)(x)
    with pytest.raises(NotImplementedError, match="hvp: .* does not nest transforms"):
        unigrad.hvp(cube, (x,), (x,), backend=first_order)
    with pytest.raises(NotImplementedError, match="grad: .*higher_order is False"):
        unigrad.grad(lambda x: unigrad.namespace(x).sum(unigrad.grad(cube, backend=first_order)(x)),
                     backend=first_order)(x)
    # a transform of another backend inside f stays allowed
    g = unigrad.grad(lambda x: unigrad.namespace(x).sum(x * unigrad.to_numpy(
        unigrad.grad(cube, backend="numpy")(unigrad.to_numpy(x)))), backend=first_order)(x)
    np.testing.assert_allclose(g, 3 * x ** 2)


def test_conformance_skips_the_nested_parts_with_the_reason(first_order):
    with pytest.raises(pytest.skip.Exception, match="hessian parts are skipped: first_order_test does not declare "
                                                    "higher_order"):
        conformance.test_exception_inside_f_leaves_no_state(first_order)
    rng = np.random.default_rng(1234)
    data = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    with pytest.raises(pytest.skip.Exception, match="hvp part is skipped"):
        conformance.test_threads_give_exact_results(first_order, data)
