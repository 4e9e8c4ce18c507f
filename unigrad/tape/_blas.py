"""Small matrix products on one BLAS thread.

A multithreaded BLAS wakes its thread pool for every product above a small size. On a busy machine
(other processes on every core) each wake-up waits for a core: the tape's per-example Jacobian of a
32-64-16 MLP (batch 256) went from 0.6 ms to 121 ms with two busy processes on two cores, and stayed
at 0.6 ms on one BLAS thread. The tape issues many such mid-sized products, so it runs those below
:data:`SMALL` multiply-adds on one thread, restoring the count right after: the user's setting is
never changed beyond the product (threadpoolctl finds the BLAS libraries NumPy loaded). Large
products keep every thread.
"""

from __future__ import annotations

import numpy as np

#: Multiply-adds (m * k * n, times the batch) below which a product runs on one BLAS thread.
SMALL = 1 << 24

_LIBS = []  # the BLAS controllers whose thread count can be set (found once, on the first product)
_FOUND = []


def _blas_libraries():
    if not _FOUND:
        try:
            from threadpoolctl import ThreadpoolController

            _LIBS.extend(lib for lib in ThreadpoolController().select(user_api="blas").lib_controllers
                         if hasattr(lib, "set_num_threads"))
        except Exception:  # threadpoolctl missing or unable to read a library: products run as they are
            pass
        _FOUND.append(True)
    return _LIBS


def matmul(a, b):
    """``np.matmul(a, b)``; on one BLAS thread when the product is small (see the module docstring)."""
    a_shape, b_shape = np.shape(a), np.shape(b)
    if len(a_shape) < 2 or len(b_shape) < 1:
        return np.matmul(a, b)
    work = np.prod(a_shape, dtype=np.int64) * (b_shape[-1] if len(b_shape) > 1 else 1)
    if work >= SMALL or work < 4096:  # tiny products never wake the pool
        return np.matmul(a, b)
    libs = _blas_libraries()
    restore = []
    for lib in libs:
        n = lib.get_num_threads()
        if n is not None and n > 1:
            lib.set_num_threads(1)
            restore.append((lib, n))
    try:
        return np.matmul(a, b)
    finally:
        for lib, n in restore:
            lib.set_num_threads(n)
