"""memory_budget: the chunk size is chosen from a measured cost, and the measured peak stays within it."""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from unigrad._memory import parse_budget, peak_bytes

RNG = np.random.default_rng(1)
W1, W2 = RNG.standard_normal((64, 256)) / 8, RNG.standard_normal((256, 64)) / 16
TAPE = unigrad.get_backend("numpy")


def mlp_rows(w1, w2, x):
    xp = unigrad.namespace(w1, x)
    return xp.tanh(xp.tanh(x @ w1) @ w2)


def test_parse_budget():
    assert parse_budget("2GB", "f") == 2 * 10 ** 9
    assert parse_budget("512 MiB", "f") == 512 * 2 ** 20
    assert parse_budget(1e6, "f") == 10 ** 6
    assert parse_budget(None, "f") is None
    with pytest.raises(ValueError, match="not a size"):
        parse_budget("lots", "jacobian")
    with pytest.raises(ValueError, match="positive"):
        parse_budget(0, "jacobian")
    with pytest.raises(TypeError, match="memory_budget"):
        unigrad.jacobian(mlp_rows, memory_budget=[1])


@pytest.mark.parametrize("budget", ["60MB", "14MB"])
def test_batched_jacobian_peak_within_the_budget(budget):
    x = RNG.standard_normal((128, 64))
    want = unigrad.batched_jacobian(mlp_rows, argnums=2, check_independence="never")(W1, W2, x)
    bj = unigrad.batched_jacobian(mlp_rows, argnums=2, memory_budget=budget, check_independence="never")
    np.testing.assert_allclose(bj(W1, W2, x), want, rtol=1e-12)
    peak = peak_bytes(TAPE, lambda: bj(W1, W2, x))
    assert peak <= parse_budget(budget, "t"), (peak, budget)


def test_a_smaller_budget_chunks_more_and_peaks_lower():
    x = RNG.standard_normal((16, 64))
    peaks = []
    for budget in ("1GB", "30MB"):
        jac = unigrad.jacobian(mlp_rows, argnums=2, memory_budget=budget)
        np.testing.assert_allclose(jac(W1, W2, x), unigrad.jacobian(mlp_rows, argnums=2)(W1, W2, x), rtol=1e-12)
        peaks.append(peak_bytes(TAPE, lambda: jac(W1, W2, x)))
    assert peaks[1] <= 30e6 < peaks[0], peaks


def test_a_budget_smaller_than_the_result_says_so():
    with pytest.raises(ValueError, match="need more than memory_budget"):
        unigrad.jacobian(mlp_rows, argnums=2, memory_budget="4MB")(W1, W2, RNG.standard_normal((16, 64)))


def test_vmap_budget():
    x = RNG.standard_normal((512, 64))
    f = lambda x: mlp_rows(W1, W2, x[None])[0]  # noqa: E731
    want = unigrad.vmap(f)(x)
    got = unigrad.vmap(f, memory_budget="2MB")(x)
    np.testing.assert_allclose(got, want, rtol=1e-12)
