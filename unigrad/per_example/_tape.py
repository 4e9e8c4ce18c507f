"""Per-example gradients on the tape, unigrad's own engine: dense layers found in the recording of the call
(what a framework backend's ``per_example_rows`` does with its own program).

``f`` is recorded once; each parameter whose one use is a matrix product ``Y = X @ W`` (``W`` directly or
through a transpose) or a bias ``Y = Z + b`` (or a scale ``Z * s``) gets its rows from one ordinary
backward pass, where the recorded program proves that row i of the losses depends on ``Y`` through
``Y_i`` alone (:mod:`unigrad.dependence`); the formulas are :mod:`unigrad.per_example.layers`'. Other
parameters are materialised: the Jacobian rows of the losses, one backward sweep with a batch of
cotangents.
"""

from __future__ import annotations

import numpy as np

from . import layers as _common
from .layers import BIAS, DENSE, MATERIALISED, SCALE  # noqa: F401
from .layers import check_losses as _check_losses

def tape_rows(flat_f, leaves, batch, norms, fname, directions=None, weights=None):
    """``(outputs, blocks, paths)``: per-example gradient rows (or one block of norms) on the tape; with
    ``norms`` and ``directions`` (one array per leaf), a second block: each example's ``<g_i, V>``
    (``unigrad.per_example.layers.total_dots``), where every parameter gives one; with ``weights`` too, a
    third: ``<gradient of sum_i r_i loss_i, V>`` from one more sweep of the same recording."""
    from ..tape._core import backward, record
    from ..tape._tracer import Tracer

    trace, outs, out_idx, _ = record(flat_f, leaves, False)
    _check_losses(_NumpyShapes, outs, batch, fname)
    out_index = out_idx[0]
    n = len(leaves)
    nested = any(isinstance(x, Tracer) for x in leaves)
    plans = [None] * n if nested or out_index is None else _dense_plans(trace, leaves, outs, out_index, batch)
    fast = {k: p for k, p in enumerate(plans) if p is not None}
    rows = [None] * n
    sq_norms = [None] * n
    dots = [None] * n
    paths = [MATERIALISED] * n
    if fast:
        cts = _cotangents_at(trace, out_index, np.ones((batch,), dtype=outs[0].dtype),
                             {p[1] for p in fast.values()})
        for k, (kind, idx, detail) in fast.items():
            entry = trace.tape[idx]
            g = cts.get(idx)
            if g is None:
                g = np.zeros(np.shape(entry[3]), dtype=entry[3].dtype)
            rows[k], sq_norms[k], paths[k] = _dense_rows(kind, entry, detail, g, leaves[k], batch, norms)
            if sq_norms[k] is not None and directions is not None:
                dots[k] = _common.matmul_dots(_NUMPY, np.asarray(entry[2][0]), np.asarray(g), batch, detail,
                                              directions[k])
    slow = [k for k in range(n) if k not in fast]
    if slow:
        if out_index is None:  # the losses do not depend on the parameters
            full = [np.zeros((batch, *np.shape(x)), dtype=x.dtype) for x in leaves]
        else:
            basis = np.eye(batch, dtype=outs[0].dtype)
            full = backward(trace, [out_index], (basis,), n, leaves, batch_shape=(batch,))
        for k in slow:
            rows[k] = full[k]
    if not norms:
        return outs, tuple(rows), paths
    total = _common.total_norms(_NUMPY, sq_norms, rows, batch)
    dot = None if directions is None else _common.total_dots(_NUMPY, dots, rows, directions, batch)
    if dot is None:
        return outs, (total,), paths
    if weights is None or out_index is None or not fast:
        return outs, (total, dot), paths
    weighted = backward(trace, [out_index], (np.asarray(weights, dtype=outs[0].dtype),), n, leaves)
    return outs, (total, dot, _common.direction_dot(_NUMPY, weighted, directions, dot.dtype)), paths


class _NumpyShapes:
    """What ``_check_losses`` reads of a backend, for plain NumPy values."""

    @staticmethod
    def shape(x):
        return tuple(np.shape(x))

    @staticmethod
    def dtype(x):
        return np.dtype(x.dtype).name


def _dense_plans(trace, leaves, outs, out_index, batch):
    """For each of the first ``n`` tape entries (the parameters): None, or ``(kind, consumer index,
    detail)`` when the parameter's one use is a dense layer whose rows stay apart up to the losses
    (proved by the dependence analysis, :func:`unigrad.dependence.prove_rows` from the layer's output)."""
    from ..dependence import from_tape, prove_rows

    tape, n = trace.tape, len(leaves)
    program = None
    uses: dict = {}
    for idx in range(n, len(tape)):
        entry = tape[idx]
        if entry is None:
            continue
        for i, p in entry[1]:
            uses.setdefault(p, []).append((idx, i))
    proved: dict = {}
    plans = []
    for k in range(n):
        plan = _dense_plan(tape, uses, k, batch)
        if plan is not None:
            consumer = plan[1]
            if consumer not in proved:
                if program is None:
                    program = from_tape(trace, n, [out_index], leaves, outs)
                seeds = {consumer: np.ndim(tape[consumer][3])}
                proved[consumer] = prove_rows(program, batch, seeds=seeds)[0] == "row"
            if not proved[consumer]:
                plan = None
        plans.append(plan)
    return plans


def _dense_plan(tape, uses, k, batch):
    mine = uses.get(k, [])
    if len(mine) != 1:
        return None
    idx, i = mine[0]
    prim, parents, vals, ans, params = tape[idx]
    x = vals[i]
    if not (hasattr(x, "dtype") and hasattr(ans, "dtype")):  # an entry of another kind (a checkpointed block)
        return None
    if np.dtype(x.dtype).kind != "f" or np.dtype(ans.dtype).kind != "f":
        return None
    transposed = False
    if prim.name in ("matrix_transpose", "permute_dims") and np.ndim(x) == 2:
        if prim.name == "permute_dims" and tuple(a % 2 for a in params["axes"]) != (1, 0):
            return None
        onward = uses.get(idx, [])
        if len(onward) != 1:
            return None
        idx, i = onward[0]
        prim, parents, vals, ans, params = tape[idx]
        transposed = True
    ash = np.shape(ans)
    if not ash or ash[0] != batch:
        return None
    if prim.name == "matmul":
        other = vals[0]
        if i != 1 or np.ndim(vals[1]) != 2 or np.ndim(other) < 2 or len(ash) != np.ndim(other) \
                or np.shape(other)[0] != batch:
            return None
        return "matmul", idx, transposed
    if transposed:
        return None
    if prim.name in ("add", "subtract", "multiply"):
        shape = np.shape(x)
        if len(shape) > len(ash) or (len(shape) == len(ash) and shape[0] != 1):
            return None  # the parameter has an axis along the batch: not shared by rows
        sign = -1.0 if (prim.name == "subtract" and i == 1) else 1.0
        return ("scale" if prim.name == "multiply" else "bias"), idx, (i, sign)
    return None


def _cotangents_at(trace, out_index, cotangent, wanted):
    """One reverse sweep from the losses with ``cotangent``; the cotangents of the entries ``wanted``
    (each complete when the sweep reaches it: the tape is in execution order)."""
    from ..tape._core import _like_dtype, unbroadcast

    tape = trace.tape
    cts = {out_index: cotangent}
    found = {}
    stop = min(wanted)
    for idx in range(out_index, stop - 1, -1):
        g = cts.pop(idx, None)
        if g is None:
            continue
        if idx in wanted:
            found[idx] = g
            if idx == stop:
                break
        entry = tape[idx]
        if entry is None:
            continue
        prim, parents, vals, ans, params = entry
        for i, p in parents:
            if p < stop:
                continue
            c = prim.vjps[i](g, ans, *vals, **params) if params else prim.vjps[i](g, ans, *vals)
            if prim.broadcasts:
                v = vals[i]
                if c.shape != v.shape:
                    c = unbroadcast(c, np.shape(v), 0)
                if c.dtype != v.dtype:
                    c = _like_dtype(c, v)
            old = cts.get(p)
            cts[p] = c if old is None else old + c
    return found


_NUMPY = _common.Ops(np.reshape, lambda a, axes, keepdims: np.sum(a, axis=axes, keepdims=keepdims), np.matmul,
                     lambda a: np.swapaxes(a, -1, -2), lambda a, dtype: np.ascontiguousarray(a, dtype=dtype), np.sqrt)


def _dense_rows(kind, entry, detail, g, param, batch, norms):
    """``(rows or None, squared norms or None, path)`` of one parameter from its layer's cotangent."""
    prim, parents, vals, ans, params = entry
    if kind == "matmul":
        return _common.matmul_rows(_NUMPY, np.asarray(vals[0]), np.asarray(g), batch, norms, detail, param.dtype)
    i, sign = detail
    other = None if kind == "bias" else np.asarray(vals[1 - i])
    rows, path = _common.broadcast_rows(_NUMPY, kind, np.asarray(g), other, np.shape(param), np.shape(ans), sign, batch)
    return rows.astype(param.dtype, copy=False), None, path
