"""The NumPy reference tape: unigrad's embedded default backend (``numpy``)."""

from __future__ import annotations

import math

import numpy as np

from ..backend import Backend, Capabilities, _chunks
from . import _core, _remat
from . import _namespace as namespace_module
from . import _rules, _special
from ._core import backward, push, record
from ._tracer import Tracer, concrete

__all__ = ["NumpyBackend"]

_DTYPE_NAMES: dict = {}  # np.dtype -> canonical name (np.dtype.name is slow on the hot path)

# Bound on the elements of all batched intermediates of one sweep when no chunk_size is given.
_SWEEP_BUDGET = 2 ** 26


class NumpyBackend(Backend):
    """Reverse and forward mode over NumPy, nestable to any order, Jacobians as batched sweeps."""

    name = "numpy"
    array_modules = ("unigrad",)  # the tape's traced values; plain NumPy arrays are the default anyway
    capabilities = Capabilities(forward_mode=True, vmap=False, compile=False, higher_order=True,
                                complex=True, float64=True, custom_rules=True)

    def namespace(self):
        return namespace_module

    def version(self):
        return np.__version__

    def asarray(self, x, dtype=None, device=None):
        if device not in (None, "cpu") and str(device) != "cpu":
            raise ValueError(f"the numpy backend has only the 'cpu' device; got device={device!r}")
        if dtype is not None and str(dtype) == "bfloat16":
            raise TypeError("the numpy backend has no bfloat16 arithmetic; use float16/float32, or the torch, "
                            "jax or tensorflow backend")
        if isinstance(x, Tracer):
            return x if dtype is None else namespace_module.astype(x, dtype)
        return np.asarray(x, dtype=dtype)

    def to_numpy(self, x):
        if isinstance(x, Tracer):
            x = concrete(x)
        return np.asarray(x)

    def is_array(self, x):
        return isinstance(x, (np.ndarray, Tracer, np.generic))

    def devices(self):
        return ("cpu",)

    def device(self, x):
        return "cpu"

    def dtype(self, x):
        d = x.dtype
        name = _DTYPE_NAMES.get(d)
        if name is None:
            name = _DTYPE_NAMES[d] = np.dtype(d).name
        return name

    def shape(self, x):
        return tuple(x.shape)

    def cast(self, x, dtype):
        return namespace_module.astype(x, np.dtype(dtype))

    def matches(self, value, reference):
        return type(value) is np.ndarray and value.shape == reference.shape and value.dtype == reference.dtype

    def zeros_like(self, x):
        return np.zeros(x.shape, dtype=x.dtype)

    def stop_gradient(self, x):
        return _rules.stop_gradient(x) if isinstance(x, Tracer) else x  # a primitive with a zero derivative

    def apply_rule(self, rule, arrays):
        """A primitive made at run time whose VJP and JVP call the rule (``_rules``)."""
        return _rules.apply_rule(rule, arrays)

    def checkpoint(self, f, primals):
        """The block recorded as one node that keeps only ``primals`` and re-records ``f`` in the
        backward sweep (``_remat``)."""
        return _remat.checkpoint(f, tuple(primals))

    def special(self, name):
        return _special.FUNCTIONS.get(name)  # (SciPy is imported when one of them runs)

    def copy(self, x):
        return x.copy() if type(x) is np.ndarray else x  # a traced value is not the caller's memory

    def carries_derivative(self, x):
        """A tracer: its ``to_numpy`` is its value alone (``unigrad.bridge`` must not hand it over as data)."""
        return isinstance(x, Tracer)

    # ---------------------------------------------------------------- the two required transforms
    def vjp(self, f, primals, *, has_aux=False):
        # (the core hands vjp copies of the caller's arrays and copies the outputs it returns: Backend.mutable_arrays)
        trace, outs, out_idx, aux = record(f, primals, has_aux)
        n = len(primals)

        def vjp_fn(cotangents):
            return backward(trace, out_idx, cotangents, n, primals)

        return outs, vjp_fn, (aux if has_aux else None)

    def value_and_grad(self, f, primals, *, has_aux=False, check=None):
        """One sweep that drops each tape entry once it is pulled back: the forward's intermediates are
        freed as the sweep goes, so the gradients' arrays reuse their memory (fewer fresh pages)."""
        trace, outs, out_idx, aux = record(f, primals, has_aux)
        if check is not None:
            check(outs)
        out = outs[0]
        if type(out) is np.ndarray:  # (np.ones and np.ones_like: a microsecond of Python around this)
            seed = np.empty(out.shape, out.dtype)
            seed.fill(1)
        else:
            seed = self.ones_like(out)
        grads = backward(trace, out_idx, (seed,), len(primals), primals, release=True)
        return outs, grads, (aux if has_aux else None)

    def jvp(self, f, primals, tangents, *, has_aux=False):
        outs, tans, aux = push(f, primals, tangents, has_aux)
        return outs, tans, (aux if has_aux else None)

    # ---------------------------------------------------------------- batched sweeps
    def _chunk(self, chunk_size, n_rows, trace_elems):
        if chunk_size is not None:
            return chunk_size
        return max(1, min(n_rows, _SWEEP_BUDGET // max(1, trace_elems)))

    def jacrev(self, f, primals, *, chunk_size=None, has_aux=False):
        trace, outs, out_idx, aux = record(f, primals, has_aux)
        n_out = sum(math.prod(np.shape(o)) for o in outs)
        chunk = self._chunk(chunk_size, n_out, _tape_elements(trace) + sum(math.prod(np.shape(p)) for p in primals))
        rows = _Stacked(n_out, primals)
        for start, stop in _chunks(n_out, chunk):
            basis = self._basis(outs, start, stop)
            rows.put(start, stop, backward(trace, out_idx, basis, len(primals), primals, batch_shape=(stop - start,)))
        jac = self._split_rows(rows.result(), outs, primals, rows_are_outputs=True)
        return outs, jac, (aux if has_aux else None)

    def jacfwd(self, f, primals, *, chunk_size=None, has_aux=False):
        n_in = sum(math.prod(np.shape(p)) for p in primals)
        chunk = chunk_size or max(1, min(n_in, _SWEEP_BUDGET // max(1, 64 * n_in)))
        outs = aux = None
        columns = None
        for start, stop in _chunks(n_in, chunk):
            basis = self._basis(primals, start, stop)
            outs, tans, aux = push(f, primals, basis, has_aux, batch_shape=(stop - start,))
            if columns is None:
                columns = _Stacked(n_in, outs)
            columns.put(start, stop, tans)
        if outs is None:
            outs, _, aux = push(f, primals, tuple(np.zeros((0, *np.shape(p)), p.dtype) for p in primals), has_aux,
                                batch_shape=(0,))
            columns = _Stacked(0, outs)
        jac = self._split_rows(columns.result(), primals, outs, rows_are_outputs=False)
        return outs, jac, (aux if has_aux else None)

    def batched_jacobian(self, f, primals, *, mode="rev", chunk_size=None, has_aux=False, recorded=None):
        """``recorded``: ``record(f, primals, has_aux)``'s result, when the caller has it already (the
        proof of independent rows reads the same recording): reverse mode sweeps it instead of recording."""
        xp = namespace_module
        if mode == "fwd":
            outs = aux = None
            jac_cols = []  # per primal j: per output i: (B, *out[1:], *in_j[1:])
            for j, p in enumerate(primals):
                basis = self._example_basis(p)  # (n_j, *p.shape)
                n_j = basis.shape[0]
                pieces = []
                for start, stop in _chunks(n_j, chunk_size):
                    tangents = tuple(basis[start:stop] if k == j else
                                     np.zeros((stop - start, *np.shape(q)), dtype=q.dtype)
                                     for k, q in enumerate(primals))
                    outs, tans, aux = push(f, primals, tangents, has_aux, batch_shape=(stop - start,))
                    pieces.append(tans)
                if outs is None:
                    outs, _, aux = push(f, primals, tuple(np.zeros((0, *np.shape(q)), q.dtype) for q in primals),
                                        has_aux, batch_shape=(0,))
                    pieces = [tuple(np.zeros((0, *np.shape(o)), o.dtype) for o in outs)]
                blocks = []
                for i, o in enumerate(outs):
                    t = xp.concat([pc[i] for pc in pieces], axis=0) if len(pieces) > 1 else pieces[0][i]
                    out_tail, in_tail = o.shape[1:], p.shape[1:]
                    t = xp.reshape(t, (n_j, o.shape[0], math.prod(out_tail)))
                    t = xp.permute_dims(t, (1, 2, 0))
                    blocks.append(xp.reshape(t, (o.shape[0], *out_tail, *in_tail)))
                jac_cols.append(blocks)
            jac = tuple(tuple(jac_cols[j][i] for j in range(len(primals))) for i in range(len(outs)))
            return outs, jac, (aux if has_aux else None)
        trace, outs, out_idx, aux = recorded if recorded is not None else record(f, primals, has_aux)
        jac = []
        for i, o in enumerate(outs):
            basis = self._example_basis(o)  # (m_i, *o.shape)
            m_i = basis.shape[0]
            pieces = []
            for start, stop in _chunks(m_i, chunk_size):
                cts = tuple(basis[start:stop] if k == i else np.zeros((stop - start, *np.shape(q)), dtype=q.dtype)
                            for k, q in enumerate(outs))
                pieces.append(backward(trace, out_idx, cts, len(primals), primals, batch_shape=(stop - start,)))
            row = []
            for j, p in enumerate(primals):
                g = xp.concat([pc[j] for pc in pieces], axis=0) if len(pieces) > 1 else (
                    pieces[0][j] if pieces else np.zeros((0, *np.shape(p)), p.dtype))
                in_tail = p.shape[1:]
                g = xp.permute_dims(g, (1, 0, *range(2, 2 + len(in_tail))))
                row.append(xp.reshape(g, (o.shape[0], *o.shape[1:], *in_tail)))
            jac.append(tuple(row))
        return outs, tuple(jac), (aux if has_aux else None)


class _Stacked:
    """Chunks of a batched sweep's results stacked on a leading axis of ``n`` rows, one array per
    ``owner`` (a primal or an output): each chunk is written into its place in one array allocated
    for the whole (the Jacobian is held once, not as pieces and then their concatenation). A
    traced chunk (the Jacobian is itself being differentiated) is concatenated instead."""

    __slots__ = ("n", "owners", "arrays", "pieces")

    def __init__(self, n, owners):
        self.n, self.owners, self.arrays, self.pieces = n, owners, None, []

    def put(self, start, stop, parts):
        if not self.pieces and all(type(p) is np.ndarray for p in parts) and (start, stop) != (0, self.n):
            if self.arrays is None:
                self.arrays = [np.empty((self.n, *p.shape[1:]), dtype=p.dtype) for p in parts]
            if all(a.dtype == p.dtype and a.shape[1:] == p.shape[1:] for a, p in zip(self.arrays, parts)):
                for a, p in zip(self.arrays, parts):
                    a[start:stop] = p
                return
        if self.arrays is not None:  # (not expected: a traced or differently typed chunk after plain ones)
            self.pieces.append([a[:start] for a in self.arrays])
            self.arrays = None
        self.pieces.append(parts)  # a single chunk is the result as it is

    def result(self):
        if self.arrays is not None:
            return self.arrays
        if not self.pieces:
            return [np.zeros((0, *np.shape(o)), dtype=o.dtype) for o in self.owners]
        if len(self.pieces) == 1:
            return list(self.pieces[0])
        return [namespace_module.concat([pc[j] for pc in self.pieces], axis=0) for j in range(len(self.owners))]


def _tape_elements(trace):
    total = 0
    for entry in trace.tape:
        if entry is not None:
            total += math.prod(_core._shape(entry[3]))
    return total
