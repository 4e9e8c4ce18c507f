"""Running transforms from several threads at once, to prove results are exact (no shared state)."""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np

from .._api import to_numpy

__all__ = ["assert_threads_exact"]


def assert_threads_exact(work: Callable, inputs: Sequence, *, repeats: int = 3) -> None:
    """Run ``work(inputs[i])`` in ``len(inputs)`` threads started together, ``repeats`` times each, and
    assert every result equals (bitwise) the one computed alone beforehand.

    ``work`` returns an array or a tuple/list of arrays of any backend. An exception in a thread is
    re-raised here with the thread's index.
    """
    def run(x):
        out = work(x)
        return [to_numpy(r) for r in (out if isinstance(out, (tuple, list)) else (out,))]

    expected = [run(x) for x in inputs]
    results, errors = [None] * len(inputs), []
    barrier = threading.Barrier(len(inputs))

    def worker(i):
        try:
            barrier.wait()
            for _ in range(repeats):
                results[i] = run(inputs[i])
        except Exception as exc:  # reported below with the thread's index
            errors.append((i, exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise AssertionError(f"transforms raised in threads: {errors}") from errors[0][1]
    for i, (got, want) in enumerate(zip(results, expected)):
        for k, (a, e) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(a, e, err_msg=f"thread {i}, result {k}")
