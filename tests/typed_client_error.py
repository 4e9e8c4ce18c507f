"""Calls of unigrad's public API that are wrong by its annotations: tests/test_typing.py asserts that mypy
rejects each (the check can fail). Never run."""

from __future__ import annotations

import numpy as np

import unigrad
import unigrad.testing


def energy(x: np.ndarray) -> float:
    return float(np.sum(x ** 2))


unigrad.grad(energy, has_aux="yes")  # has_aux: bool
unigrad.jacobian(energy, chunk_size="all")  # chunk_size: int | None
unigrad.testing.check_grads(energy, (np.ones(2),), order="2")  # order: int
unigrad.value_and_grad(energy, argnum=0)  # no such keyword: argnums
