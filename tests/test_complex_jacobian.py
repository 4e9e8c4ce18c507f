"""Complex Jacobians do not depend on the mode ``jacobian`` picks by shape.

Found by the audit: ``jacobian(lambda x: x * (1 + 2j))`` of a real ``x`` returned 1 instead of 1 + 2j
in reverse mode (a real input's VJP is real: rows pulled back from unit cotangents keep ``Re J``), and
``mode="auto"``, which picks the mode by shape, did so for square and wide functions. For a complex
input the two modes give different matrices where ``f`` is not holomorphic, so ``auto`` takes the reverse
one (the convention ``grad`` and ``vjp`` follow) whatever the shapes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import unigrad

# complex128 inputs: skipped on a backend that computes no float64 (conftest)
FLOAT64_TESTS = ("test_auto_mode_of_a_complex_input_is_the_reverse_one_whatever_the_shapes",)


def _np(x):
    return np.asarray(unigrad.to_numpy(x))


@pytest.mark.parametrize("compile", [False, True])
def test_complex_output_of_a_real_input(backend, compile):
    x = unigrad.asarray(np.array([1.0, 2.0, 3.0]), backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        square = unigrad.jacobian(lambda x: x * (1 + 2j), backend=backend, compile=compile)(x)
        wide = unigrad.jacobian(lambda x: unigrad.namespace(x).sum(x * (1 - 1j))[None], backend=backend,
                                compile=compile)(x)
    np.testing.assert_allclose(_np(square), np.eye(3) * (1 + 2j))
    np.testing.assert_allclose(_np(wide), np.full((1, 3), 1 - 1j))
    with pytest.raises(ValueError, match="complex output with respect to a real input"):
        unigrad.jacrev(lambda x: x * (1 + 2j), backend=backend)(x)


def test_auto_mode_of_a_complex_input_is_the_reverse_one_whatever_the_shapes(backend):
    z = unigrad.asarray(np.array([1 + 1j, 2 - 1j, 0.5j]), backend=backend)

    def g(z):  # not holomorphic: the modes differ, auto must not depend on the shapes
        return z * unigrad.namespace(z).conj(z)

    def wide(z):
        return unigrad.namespace(z).sum(g(z))[None]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for h in (g, wide):
            np.testing.assert_allclose(_np(unigrad.jacobian(h, backend=backend)(z)),
                                       _np(unigrad.jacrev(h, backend=backend)(z)), atol=1e-12)

        def energy(z):  # a real output: the Jacobian's one row is the gradient, 2 conj(z)
            xp = unigrad.namespace(z)
            return xp.sum(xp.real(z * xp.conj(z)))[None]

        np.testing.assert_allclose(_np(unigrad.jacobian(energy, backend=backend)(z))[0], 2 * np.conj(_np(z)),
                                   atol=1e-12)
        # holomorphic f: both modes agree, so jacrev stays available there
        np.testing.assert_allclose(_np(unigrad.jacrev(lambda z: z ** 2, backend=backend)(z)),
                                   _np(unigrad.jacfwd(lambda z: z ** 2, backend=backend)(z)), atol=1e-12)


@pytest.mark.parametrize("compile", [False, True])
def test_batched_and_sparse_jacobians_of_a_complex_output_of_a_real_input(backend, compile):
    x = unigrad.asarray(np.arange(6.0).reshape(2, 3), backend=backend)
    y = unigrad.asarray(np.arange(4.0), backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blocks = unigrad.batched_jacobian(lambda x: x * (1 + 2j), backend=backend, compile=compile)(x)
        np.testing.assert_allclose(_np(blocks), np.stack([np.eye(3) * (1 + 2j)] * 2))
        wide = unigrad.sparse_jacobian(lambda y: unigrad.namespace(y).sum(y * (1 + 2j))[None], backend=backend,
                                       compile=compile, format="dense")(y)  # one row: reverse had fewer colours
        np.testing.assert_allclose(_np(wide), np.full((1, 4), 1 + 2j))
    with pytest.raises(ValueError, match="complex output with respect to a real input"):
        unigrad.batched_jacobian(lambda x: x * (1 + 2j), backend=backend, mode="rev")(x)
    with pytest.raises(ValueError, match="complex output with respect to a real input"):
        unigrad.sparse_jacobian(lambda y: y * (1 + 2j), backend=backend, mode="rev")(y)
