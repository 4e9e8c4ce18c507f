"""A memory budget instead of a chunk size: ``memory_budget="2GB"`` on ``jacobian``,
``batched_jacobian`` and ``vmap``.

A chunk of c basis vectors (or c mapped examples) costs about c times what one costs, on top of the
result itself. What one costs is *measured*, once per signature: the peak bytes of one VJP (reverse),
one JVP (forward) or one call of ``f`` on one example (vmap), on the backend itself -- with
``tracemalloc`` for the NumPy tape (NumPy reports its buffers to it) and, elsewhere, the rise of the
process's peak resident memory (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``) -- the same
counters the tests hold the budget against. The chunk size is then the budget, less the result,
divided by that cost (``chunk_for_budget`` says what is set aside).
"""

from __future__ import annotations

import gc
import math
import re
import tracemalloc

_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_budget(budget, fname: str) -> int | None:
    """Bytes from ``2_000_000_000``, ``"2GB"``, ``"512 MiB"``...; None stays None."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise TypeError(f"{fname}: memory_budget must be a number of bytes or a string like '2GB'; got {budget!r}")
    if isinstance(budget, (int, float)):
        value = float(budget)
    elif isinstance(budget, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", budget)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"{fname}: memory_budget {budget!r} is not a size like '2GB', '512MiB' or 1e9")
        value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    else:
        raise TypeError(f"{fname}: memory_budget must be a number of bytes or a string like '2GB'; "
                        f"got {type(budget).__name__}")
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"{fname}: memory_budget must be positive; got {budget!r}")
    return int(value)


def _rss_peak_counter():
    """``(reset, read)`` for the process's peak resident bytes, or None where the OS has no such counter."""
    try:
        with open("/proc/self/status") as fh:
            if "VmHWM" not in fh.read():
                return None
    except OSError:
        return None

    def reset():
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
        except OSError:
            pass

    def read():
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM"):
                    return int(line.split()[1]) * 1024
                if line.startswith("VmRSS"):
                    rss = int(line.split()[1]) * 1024
        return rss

    return reset, read


def peak_bytes(backend, fn) -> int:
    """Peak bytes that ``fn()`` allocates on ``backend`` (above what existed before it ran)."""
    gc.collect()
    if backend.name == "numpy" or type(backend).__module__.startswith("unigrad.tape"):
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            fn()
            return max(0, tracemalloc.get_traced_memory()[1] - base)
        finally:
            if started:
                tracemalloc.stop()
    counter = _rss_peak_counter()
    if counter is None:
        return 0
    reset, read = counter
    reset()
    base = read()
    fn()
    return max(0, read() - base)


def chunk_for_budget(budget: int, n_rows: int, result_bytes: int, per_row_bytes: int, fname: str) -> int:
    """The largest chunk whose rows fit in what the budget leaves: the peak is about the forward's
    intermediates and one row (``per_row_bytes``, measured together), the chunk's other rows, and the
    result twice (the chunks' pieces, then the blocks assembled from them)."""
    left = budget - 2 * result_bytes - per_row_bytes
    if left < 0:
        raise ValueError(f"{fname}: the result ({result_bytes:,} bytes, held twice while it is assembled) and "
                         f"one basis vector's work ({per_row_bytes:,} bytes) need more than memory_budget "
                         f"({budget:,} bytes)")
    if per_row_bytes <= 0:
        return max(1, n_rows)
    return int(max(1, min(n_rows, 1 + left // per_row_bytes)))
