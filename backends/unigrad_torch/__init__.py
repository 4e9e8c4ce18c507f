"""unigrad's PyTorch backend: the unigrad contract on ``torch.func``.

Every transform is a ``torch.func`` transform (``vjp``, ``jvp``, ``vmap``), so
they nest to any order and compose with the caller's own ``torch.func`` code --
except the calls an optimiser makes thousands of times: ``grad``/``value_and_grad``
and the Hessian-vector product run on plain ``torch.autograd`` where nothing needs
``torch.func`` (``_plain``: no transform around the call, no input in a graph the
caller records), at the cost of the native call (benchmarks/bench_calls.py).
What this adapter adds to ``torch.func`` is the part of the contract torch does
not give by itself:

* Grad mode and inference mode: the transforms work under ``torch.no_grad()``
  and ``torch.inference_mode()``. Inference mode is left *locally* (inference
  tensors, which autograd cannot save, are copied first); the caller's grad mode
  is kept, as ``torch.func`` keeps it: its transforms differentiate ``f`` at
  their own level whatever the outer mode. So under ``no_grad`` the results are
  plain tensors with no graph, even for inputs that require grad, and no graph
  outlives the call; with grad on, a result stays differentiable by
  ``torch.autograd`` (as ``torch.func``'s). The caller's modes are restored on
  the way out, also when ``f`` raises.
* Thread safety: torch's forward-mode dual level is process-global, so all
  forward-mode work of this backend holds one re-entrant lock.
* Complex numbers: torch's reverse mode returns the conjugate of unigrad's
  (JAX's) convention; cotangents are conjugated going in and results coming out.
* Non-tensor ``aux`` leaves pass through (``torch.func`` accepts only tensors there).
* The namespace (``_namespace``): ``array_api_compat.torch`` with unigrad's rules where torch's
  differ (empty ``max``, ``median``, functions of a Hermitian matrix).
* Conversion: NumPy arrays with negative strides, read-only or non-native byte
  order, ml_dtypes bfloat16, DLPack producers, unigrad device strings.
* An ``f`` that writes into its arguments (``x.mul_(2)``): the write is differentiated as
  written, on copies of the arrays (:func:`_on_copies`), and the caller's tensors are never
  changed. Forward mode, ``vmap`` and plain evaluations hand ``f`` copies up front (they would
  let the write through into the caller's memory); reverse mode runs ``f`` on copies after
  torch refused the write into a leaf that requires grad (before writing anything), so the
  common call pays no copy (:func:`_retried_on_copies`).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading

import numpy as np
import torch
import torch.func

from unigrad import Backend, Capabilities
from unigrad.backend import chunks

from ._inplace import LEAF_WRITE as _LEAF_WRITE
from . import _namespace as _torch_namespace
from . import _rules, _sparse

__all__ = ["TorchBackend"]

# torch's forward-mode AD keeps its dual level in process-global state
# (torch.autograd.forward_ad._current_level and torch.func's JVP_NESTING): two threads inside
# torch.func.jvp at once share one level, and whichever leaves first destroys the other's tangents
# (silent zeros) or makes it raise. Every forward-mode computation here holds this lock. It is
# re-entrant because forward-mode work nests (jacfwd of a function that calls jvp). The price:
# forward-mode work runs one thread at a time, and an f that waits for another thread's
# forward-mode work (not just starts it) would deadlock.
_FORWARD_LOCK = threading.RLock()

_DTYPE_NAMES = {
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
    torch.complex64: "complex64", torch.complex128: "complex128", torch.bool: "bool",
    torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8",
}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
for _name in ("uint16", "uint32", "uint64"):  # present in newer torch versions only
    if isinstance(getattr(torch, _name, None), torch.dtype):
        _DTYPES[_name] = getattr(torch, _name)
        _DTYPE_NAMES[getattr(torch, _name)] = _name

_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")
_functorch = torch._C._functorch  # the wrapped tensors of torch.func's transforms (carries_derivative)


class TorchBackend(Backend):
    """PyTorch through ``torch.func``: reverse and forward mode, vmap, nesting to any order."""

    name = "torch"
    array_modules = ("torch",)
    # compile=False: measured (see ``compile``), torch.compile does not pay off for this backend.
    capabilities = Capabilities(forward_mode=True, vmap=True, compile=False, higher_order=True,
                                complex=True, float64=True, custom_rules=True)
    # mode="auto" goes forward only where the outputs have more than twice the inputs' elements: at small
    # sizes torch's forward mode is never faster than its reverse mode (vmapped jvp vs vjp, 1.02-1.09x
    # slower, R^2->R^3 to R^20->R^50), and as the outer transform of a nested one (a Jacobian of a metric
    # made from a Jacobian) 2-5x slower (functorch runs Python decompositions for forward AD over a grad
    # level); with many more outputs than inputs it wins (issue 37, benchmarks/bench_clients.py).
    forward_ratio = 2
    # ``asarray`` takes objects with ``__dlpack__`` (JAX arrays...) directly, without a NumPy copy.
    accepts_dlpack = True
    # torch 2.13's forward AD turns the tangent of every Python number in ``f`` (``2.0 * x``, ``x + 1.0``) into a
    # ZeroTensor whose arithmetic runs through Python reference ops, about 1-2 ms per operation whatever the
    # size: measured on the Brusselator, N = 32 (12 colours, float64, 2 CPU cores), vmap of torch.func.jvp
    # 15-22 ms, the transposed VJP below 2.9 ms, the same numbers (benchmarks/bench_sparse.py). The sparse
    # transforms run their forward passes as transposed VJPs here.
    forward_by_reverse = True

    def copy(self, x):
        return x.clone()

    def evaluate(self, f, primals):
        """``f(*primals)`` on copies (:func:`_on_copies`): the core's plain forward evaluations (a first
        ``jacobian`` call runs ``f`` once for its output shapes) must not let ``f`` write into the caller's
        tensors."""
        return _on_copies(f)(*primals)

    def special(self, name):
        return _SPECIAL.get(name)

    # ------------------------------------------------------------------ arrays
    def namespace(self):
        return _torch_namespace

    def version(self):
        return torch.__version__

    def asarray(self, x, dtype=None, device=None):
        """``x`` (tensor, NumPy array, scalar, nested list, DLPack producer) as a tensor.

        ``dtype`` None keeps x's dtype (NumPy float64 stays float64); else a canonical name
        (``"bfloat16"``) or a ``torch.dtype``. ``device`` None keeps x's device (CPU for host
        data); else ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"gpu"`` (= ``"cuda:0"``) or a ``torch.device``.
        """
        target_dtype = None if dtype is None else _torch_dtype(dtype)
        target_device = None if device is None else _torch_device(device, self.devices)
        if isinstance(x, torch.Tensor):
            tensor = x
        elif isinstance(x, (np.ndarray, np.generic)):
            tensor = _from_numpy(np.asarray(x))
        elif hasattr(x, "__dlpack__") and not isinstance(x, (bool, int, float, complex)):
            try:
                tensor = torch.from_dlpack(x)
            except (RuntimeError, TypeError, ValueError, BufferError):
                # e.g. a dtype or device DLPack cannot carry: go through the producer's NumPy view
                tensor = _from_numpy(np.asarray(x))
        else:
            tensor = _from_numpy(np.asarray(x))
        if target_dtype is not None or target_device is not None:
            tensor = tensor.to(device=target_device, dtype=target_dtype)
        return tensor

    def to_numpy(self, x):
        """A NumPy array with x's values (bfloat16 as ml_dtypes.bfloat16 when available, else float32).

        Inside ``grad``-like transforms the primal value is returned; inside ``vmap`` there is no
        single value to return, which raises TypeError.
        """
        x = _primal_value(x)
        # Inside a transform, functorch would wrap the results of the ops below again.
        with _functorch_disabled():
            x = x.detach()
            if x.device.type != "cpu":
                x = x.cpu()
            x = x.resolve_conj().resolve_neg()
            if x.dtype == torch.bfloat16:
                try:
                    import ml_dtypes
                except ImportError:
                    return x.float().numpy()
                return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            return x.numpy()

    def is_array(self, x):
        # The values f sees inside torch.func transforms (grad-tracking, batched, dual) are Tensors too.
        return isinstance(x, torch.Tensor)

    def devices(self):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return ("cpu", *(f"cuda:{i}" for i in range(count)))

    def device(self, x):
        return x.device

    def dtype(self, x):
        name = _DTYPE_NAMES.get(x.dtype)
        return name if name is not None else str(x.dtype).removeprefix("torch.")

    def shape(self, x):
        return tuple(x.shape)

    def cast(self, x, dtype):
        return x.to(_torch_dtype(dtype))

    def zeros_like(self, x):
        return torch.zeros_like(x)

    def stop_gradient(self, x):
        return x.detach()

    def apply_rule(self, rule, arrays):
        """A ``torch.autograd.Function`` whose backward and jvp call the rule (``_rules``)."""
        return _rules.apply_rule(rule, arrays)

    # ------------------------------------------------------------------ first order
    def vjp(self, f, primals, *, has_aux=False):
        with _caller_grad_mode(), _numpy_calls_rejected():
            primals = _usable(primals)
            if not primals:  # torch.func refuses an empty primal list; nothing to differentiate
                outputs, aux = _call(f, (), has_aux)
                return outputs, (lambda cotangents: ()), aux
            if has_aux:
                split = _AuxSplit(f)
                outputs, pullback, tensor_aux = _retried_on_copies(
                    lambda g: torch.func.vjp(g, *primals, has_aux=True), split)
                aux = split.merge(tensor_aux)
            else:
                outputs, pullback = _retried_on_copies(lambda g: torch.func.vjp(g, *primals), f)
                aux = None

        def vjp_fn(cotangents):
            # torch's pullback builds a graph (for higher derivatives) exactly when grad mode is on:
            # it is inside an enclosing transform's level, and it is not under the caller's no_grad,
            # where the gradients must come back as plain tensors.
            with _caller_grad_mode():
                cotangents = tuple(_conj(_on_device_of(c, o)) for c, o in zip(_usable(cotangents), outputs))
                grads = pullback(cotangents)
            return _fresh(tuple(_conj(g) for g in grads), cotangents)

        return tuple(outputs), vjp_fn, aux

    def jvp(self, f, primals, tangents, *, has_aux=False):
        with _FORWARD_LOCK, _caller_grad_mode(), _numpy_calls_rejected():
            primals = _usable(primals)
            tangents = tuple(_on_device_of(t, p) for t, p in zip(_usable(tangents), primals))
            if not primals:
                outputs, aux = _call(f, (), has_aux)
                return outputs, tuple(torch.zeros_like(o) for o in outputs), aux
            f = _on_copies(f)
            if has_aux:
                split = _AuxSplit(f)
                outputs, tangents_out, tensor_aux = torch.func.jvp(split, primals, tangents, has_aux=True)
                aux = split.merge(tensor_aux)
            else:
                outputs, tangents_out = torch.func.jvp(f, primals, tangents)
                aux = None
        outputs = _fresh(tuple(outputs), primals + tangents)
        return outputs, _fresh(_tangents_as_outputs(tangents_out, outputs), primals + tangents + outputs), aux

    def linear_products(self, f, point):
        """``(v -> J v, u -> J^T u)`` with ``J`` the Jacobian of ``f`` at ``point``, on values
        (``unigrad.linear_solve``'s iterative solvers; ``f`` is the operator itself, or custom_root's optimality
        in ``x``): one recording of ``f`` at a leaf copy of ``point``; ``J^T u`` by ``torch.autograd.grad`` on
        it, retained; ``J v`` by the same backward pass recorded once with a symbolic ``u`` and then
        differentiated in ``u`` (it is linear in ``u``: its VJP is ``J``), one backward pass a product. For a
        small system that is about 0.6x ``torch.func.vjp``'s pullback and a tenth of ``torch.func.jvp`` (whose
        levels, pytrees and decompositions let them nest and be differentiated in turn, which these products
        never are). None where plain autograd does not serve: inside a ``torch.func`` transform, in forward
        mode or inference mode (the core then takes ``vjp``'s pullback and the operator itself)."""
        like = point
        if (_current_level() is not None or torch.is_inference_mode_enabled() or _forward_ad._current_level >= 0
                or not isinstance(like, torch.Tensor) or not like.dtype.is_floating_point):
            return None
        with torch.enable_grad(), _numpy_calls_rejected():
            point = like.detach().clone().requires_grad_(True)
            out = f(point)
        if not isinstance(out, torch.Tensor) or out.shape != like.shape or out.dtype != like.dtype:
            return None  # (the core's own products say what is wrong)
        if out.grad_fn is None:  # f does not depend on v: A = 0
            zero = lambda v: torch.zeros_like(like)  # noqa: E731
            return zero, zero
        recorded = []

        def transposed(u):
            (g,) = torch.autograd.grad(out, point, u, retain_graph=True, allow_unused=True)
            return torch.zeros_like(like) if g is None else g

        def forward(v):  # (RuntimeError where f's backward is not differentiable: the core then takes f's JVP)
            if not recorded:  # A^T w for a symbolic w, recorded once
                with torch.enable_grad():
                    w = torch.zeros_like(like).requires_grad_(True)
                    (g,) = torch.autograd.grad(out, point, w, retain_graph=True, create_graph=True)
                if g is None or g.grad_fn is None:
                    raise RuntimeError("linear_products: the backward pass is not differentiable in its cotangent")
                recorded.append((w, g))
            w, g = recorded[0]
            (av,) = torch.autograd.grad(g, w, v, retain_graph=True, allow_unused=True)
            if av is None:  # the backward pass does not reach w (once_differentiable's Error node): not A v = 0
                raise RuntimeError("linear_products: the backward pass is not differentiable in its cotangent")
            return av
        return forward, transposed

    # ------------------------------------------------------------------ gradients on plain autograd
    def value_and_grad(self, f, primals, *, has_aux=False, check=None):
        """One reverse sweep. Where plain ``torch.autograd`` serves the call (:func:`_plain`: no
        ``torch.func`` transform or dual level around it, no input in a graph the caller records), it
        runs on ``torch.autograd.grad``: the same numbers as ``torch.func.vjp`` (the same backward
        formulas), at a third of its cost on small problems, without the ``torch._dynamo`` import
        (about 1 s) that ``torch.func``'s backward does on first use (torch 2.13; benchmarks/bench_calls.py).
        Elsewhere ``torch.func.vjp`` (the base class's), which nests in any transform.
        """
        if not _plain(primals):
            return super().value_and_grad(f, primals, has_aux=has_aux, check=check)
        leaves = tuple([p.detach().requires_grad_() for p in primals])
        outputs, aux = _retried_on_copies(lambda g: _recorded(g, leaves, has_aux), f)
        if check is not None:
            check(outputs)
        y = outputs[0]
        if not y.requires_grad:  # y does not depend on the leaves
            return (y,), tuple([torch.zeros_like(x) for x in leaves]), aux
        grads = _backward((y,), leaves, (torch.ones_like(y),))
        for g in grads:
            if g is None or g.is_complex():  # an unused leaf, or torch's complex convention: convert
                grads = tuple([torch.zeros_like(x) if g is None else _conj(g) for g, x in zip(grads, leaves)])
                break
        # The gradients are the engine's new tensors (what the pullback of the base class returned too:
        # it only ever handed back its own cotangent, which here autograd makes itself).
        return (y.detach(),), grads, aux

    def hvp(self, f, primals, tangents):
        """``H @ tangents`` of a scalar ``f``. Where plain autograd serves the call (:func:`_plain`):
        reverse over reverse (the gradient recorded with ``create_graph``, then pulled back along
        the tangents), which torch runs 3-8x faster than ``torch.func.jvp`` of ``torch.func.grad``
        (benchmarks/bench_calls.py) and which needs no forward-mode lock. For a real ``f`` the
        Hessian is symmetric (also as a real-bilinear form of complex inputs), so the pullback is
        the product; complex inputs get unigrad's convention, that of ``jvp`` of ``grad`` (the
        conjugate of torch's). Elsewhere forward over reverse on ``torch.func`` (the base class's).
        """
        if not _plain(primals):
            return super().hvp(f, primals, tangents)
        leaves = tuple([p.detach().requires_grad_() for p in primals])
        tangents = tuple([_on_device_of(t, p) for t, p in zip(tangents, primals)])
        y = _retried_on_copies(lambda g: _recorded(g, leaves, False), f)[0][0]
        # (create_graph records the backward sweep whatever the grad mode: the engine sets it)
        grads = _backward((y,), leaves, (torch.ones_like(y),), create_graph=True) if y.requires_grad else ()
        pairs = [(g, t) for g, t in zip(grads, tangents) if g is not None and g.requires_grad]
        if not pairs:  # f is at most linear in its inputs
            return tuple([torch.zeros_like(p) for p in primals])
        hv = _backward(tuple([g for g, _ in pairs]), leaves, tuple([t for _, t in pairs]))
        return _fresh(tuple([torch.zeros_like(p) if h is None else _conj(h) for h, p in zip(hv, primals)]),
                      primals + tangents)

    # ------------------------------------------------------------------ maps and Jacobians
    def vmap(self, f, in_axes, out_axes=0, chunk_size=None):
        return self._vmap(_on_copies(f), in_axes, out_axes, chunk_size)

    def vmap_rows(self, fn, n_args):
        """``vmap`` without the copies that guard the caller's arguments: the rows are the transform's own
        basis rows, and ``fn`` a pullback or a ``jvp`` (which copies ``f``'s primals itself). The copy of a
        whole chunk of rows cost about 6% of a per-example Jacobian (issue 37 item 7)."""
        return self._vmap(fn, (0,) * n_args, 0, None)

    def _vmap(self, f, in_axes, out_axes, chunk_size):
        in_dims = tuple(in_axes)
        mapped = torch.func.vmap(f, in_dims=in_dims, out_dims=out_axes, chunk_size=chunk_size)

        def call(*args):
            size = next(a.shape[ax] for a, ax in zip(args, in_dims) if ax is not None)
            with _numpy_calls_rejected():
                if size == 0:
                    return _vmap_empty(f, args, in_dims, out_axes)
                return tuple(mapped(*args))

        return call

    # jacrev and the reverse-mode batched_jacobian are the base class's: one VJP pulled back over
    # ``unit_basis`` / ``example_basis`` rows by ``map_chunks``, which vmaps with torch.func.vmap
    # (measured: as fast as the former torch-specific copies, see the report of issue 10).

    def jacrev(self, f, primals, *, chunk_size=None, has_aux=False):
        """Reverse-mode Jacobian: :meth:`record_for_jacrev` where plain ``torch.autograd`` serves the call,
        else the base class's (``torch.func.vjp`` over the output basis, vmapped)."""
        recorded = self.record_for_jacrev(f, primals, has_aux=has_aux)
        if recorded is None:
            return super().jacrev(f, primals, chunk_size=chunk_size, has_aux=has_aux)
        outputs, finish, aux = recorded
        return outputs, finish(chunk_size), aux

    def record_for_jacrev(self, f, primals, *, has_aux=False):
        """``(outputs, finish, aux)``, ``finish(chunk_size)`` the blocks of :meth:`jacrev`, where plain
        ``torch.autograd`` serves the call (:func:`_plain`, real inputs and outputs; else None): ``f``
        recorded once, then the output basis pulled back ``chunk_size`` rows at a time by
        ``torch.autograd.grad`` under ``torch.func.vmap`` -- what ``torch.func.jacrev`` runs, without the
        levels and pytrees of its ``vjp`` (which exist so that it nests): its numbers, at about 0.7x its cost
        for a small ``f``, where a library builds the transform inline on every call (issue 37).
        ``mode="auto"`` learns the output shapes from this recording and finishes from it where reverse
        mode is chosen."""
        if not _plain(primals) or any(p.is_complex() for p in primals):
            return None
        leaves = tuple([p.detach().requires_grad_() for p in primals])
        outputs, aux = _retried_on_copies(lambda g: _recorded(g, leaves, has_aux), f)
        if any(o.is_complex() or not o.dtype.is_floating_point for o in outputs):  # (unigrad's conventions there)
            return None
        live = [k for k, o in enumerate(outputs) if o.requires_grad]
        recorded = tuple(outputs[k] for k in live)
        outputs = _fresh(tuple(o.detach() for o in outputs), primals)  # (an output that is an input: a copy)

        def pull(*cotangents):  # (unused leaves: zeros, which vmap repeats over the rows)
            grads = torch.autograd.grad(recorded, leaves, cotangents, retain_graph=True, allow_unused=True)
            return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves))

        def finish(chunk_size):
            vmapped = torch.func.vmap(pull)
            n_out = sum(o.numel() for o in outputs)
            pieces = []
            for start, stop in chunks(n_out, chunk_size):
                basis = self.unit_basis(outputs, start, stop)
                if live:
                    pieces.append(tuple(vmapped(*(basis[k] for k in live))))
                else:
                    pieces.append(tuple(torch.zeros((stop - start, *x.shape), dtype=x.dtype, device=x.device)
                                        for x in leaves))
            if not pieces:
                rows = tuple(torch.zeros((0, *x.shape), dtype=x.dtype, device=x.device) for x in leaves)
            else:
                rows = pieces[0] if len(pieces) == 1 else tuple(torch.cat(r, dim=0) for r in zip(*pieces))
            return self._split_rows(rows, outputs, leaves, rows_are_outputs=True)
        return outputs, finish, aux

    def jacfwd(self, f, primals, *, chunk_size=None, has_aux=False):
        """JVPs of the input basis, vmapped by ``torch.func.vmap``, ``chunk_size`` columns at a time.

        Not the base class's: ``f`` is evaluated once, inside the vmapped JVPs (no separate forward
        pass), and random ops in ``f`` draw once per chunk (vmap randomness "same").
        """
        with _FORWARD_LOCK, _caller_grad_mode(), _numpy_calls_rejected():
            primals = _usable(primals)
            n = sum(p.numel() for p in primals)
            outputs, pushed, aux = _push_rows(f, primals, lambda a, b: self.unit_basis(primals, a, b), n,
                                              chunk_size, has_aux)
        sizes = [p.numel() for p in primals]
        jac = []
        for o, columns in zip(outputs, pushed):  # columns: (n_in, *out.shape)
            columns = columns.reshape(columns.shape[0], o.numel()).T  # (out_size, n_in)
            jac.append(tuple(block.reshape(tuple(o.shape) + tuple(p.shape))
                             for block, p in zip(columns.split(sizes, dim=1), primals)))
        return outputs, tuple(jac), aux

    #: per_example_rows takes directions= (norms come with each example's <g_i, V>: unigrad.per_example checks them)
    per_example_directions = True

    def per_example_rows(self, f, primals, batch, *, norms=False, fname="per_example_grad", memo=None,
                         directions=None, weights=None):
        """Per-example gradients read from the ATen operations ``f`` ran: layers by their rules (``_per_example``);
        ``memo`` keeps the analysis of each program recorded."""
        from ._per_example import torch_rows
        return torch_rows(self, f, tuple(primals), batch, norms, fname, memo, getattr(f, "closure_arrays", ()),
                          directions, weights)

    def dependence_program(self, f, primals, *, has_aux=False, unknown=()):
        """``f``'s ATen graph (``make_fx`` on fake tensors) in ``unigrad.dependence``'s form (``_dependence``):
        torch-native code's sparsity patterns and row proofs."""
        from ._proof import fx_graph
        from ._dependence import fx_program

        return fx_program(fx_graph(f, tuple(primals), has_aux))

    def batch_rows(self, f, primals, *, has_aux=False):
        """Rows of ``f`` proved from its ATen graph (``make_fx``): ``(verdict, detail, False)`` (see ``_proof``)."""
        from ._proof import batch_rows
        return batch_rows(f, tuple(primals), has_aux)

    def batched_jacobian(self, f, primals, *, mode="rev", chunk_size=None, has_aux=False):
        """Per-example Jacobians by the sum trick (rows independent, so one sweep serves every example).

        Reverse: the base class's (one VJP; the cotangent "unit vector k in every example" pulls back
        row k of all B Jacobians at once; vmapped over k). Forward: the unit tangents of every input
        at once (the same unit vector in every example), vmapped over the input elements k, ``f``
        evaluated once inside the vmapped JVPs. Measured on an MLP 32->64->16 (tanh, B=256, float32,
        CPU, torch 2.13), against ``vmap`` over B of the Jacobian of f on a batch of one: reverse
        0.72 ms vs 0.92 ms, forward 2.1 ms vs 4.9 ms (a Python loop over B: 270 ms).
        """
        if mode != "fwd":
            return super().batched_jacobian(f, primals, mode=mode, chunk_size=chunk_size, has_aux=has_aux)
        with _FORWARD_LOCK, _caller_grad_mode(), _numpy_calls_rejected():
            primals = _usable(primals)
            batch = primals[0].shape[0]  # the core never passes an empty batch
            firsts = [p[:1] for p in primals]  # one example each: the basis of one example, then repeated

            def rows(start, stop):
                return tuple(r.expand(stop - start, batch, *p.shape[1:])
                             for r, p in zip(self.unit_basis(firsts, start, stop), primals))

            n = sum(math.prod(p.shape[1:]) for p in primals)
            outputs, pushed, aux = _push_rows(f, primals, rows, n, chunk_size, has_aux)
        sizes = [math.prod(p.shape[1:]) for p in primals]
        jac = []
        for o, columns in zip(outputs, pushed):  # columns: (n_in, B, *out.shape[1:])
            row = []
            for block, p in zip(columns.split(sizes), primals):
                block = block.movedim(0, -1)  # (B, *out.shape[1:], n_j)
                row.append(block.reshape(tuple(o.shape) + tuple(p.shape[1:])))
            jac.append(tuple(row))
        return outputs, tuple(jac), aux

    def checkpoint(self, f, primals):
        """The block as an ``autograd.Function`` that saves only its inputs (``_checkpoint``)."""
        from ._checkpoint import checkpoint

        return checkpoint(f, primals)

    # ------------------------------------------------------------------ compile
    def compile(self, fn):
        """``fn`` unchanged: ``torch.compile`` does not pay off here (so ``capabilities.compile`` is False).

        Measured on the reverse-mode batched Jacobian of an MLP 32->64->16 (tanh, B=256, float32,
        2 CPU cores, gcc, torch 2.13):

        * unigrad's compiled program (the core's flat function inside this backend's transforms):
          Dynamo cannot trace the core's optree flattening inside the ``torch.func`` transform
          ("Expected treespec to be an instance of PyTreeSpec but got optree.PyTreeSpec"), drops the
          whole frame and runs it eagerly: no speed-up (about 1.0-1.2 ms either way) after a first
          call of 2.5-6 s.
        * the bare torch.func sum trick, hand-written: 0.27-0.42 ms compiled vs 0.9-1.2 ms eager,
          but 27 s of compilation on the first call in a fresh process and ~2 s more for every new
          batch size -- and the traced graph would bypass this backend's forward-mode lock and
          grad-mode handling, whose thread safety under Dynamo is unproven.
        """
        return fn

    # ------------------------------------------------------------------ bridge and sparse results
    # (the contract's hooks for unigrad.bridge and the sparse transforms: _sparse)
    def carries_derivative(self, x):
        """A ``torch.func`` wrapped tensor (a grad or jvp level), whose ``to_numpy`` would be its value alone; a
        vmap's batched tensor is not one (it has no data to hand over: the bridge says so)."""
        return _functorch.is_functorch_wrapped_tensor(x) and not _functorch.is_batchedtensor(x)

    def sparse_matrix(self, values, structure, format, fname):
        """A sparse CSR (``"auto"``, ``"csr"``), CSC or COO tensor on the values' device (see ``_sparse``)."""
        return _sparse.sparse_matrix(values, structure, format, fname)

    def dense_matrix(self, values, structure):
        return _sparse.dense_matrix(values, structure)

    def sparse_to_numpy(self, matrix):
        return _sparse.sparse_to_numpy(matrix)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _caller_modes_under_inference():
    grad_enabled = torch.is_grad_enabled()  # False under inference mode
    with torch.inference_mode(False), torch.set_grad_enabled(grad_enabled):
        yield


class _caller_grad_mode:
    """Inference mode off inside, grad mode as the caller has it; the caller's modes come back after,
    also on errors.

    ``torch.inference_mode(False)`` alone would switch grad mode on, and an outer level with grad on
    records a graph from every input that requires grad into the results (the ``grad_fn`` of a
    gradient computed under the caller's ``no_grad``). ``torch.func`` enables grad at its own levels.
    Outside inference mode (the common case) nothing is switched: the grad mode is read and, should the
    block leave it changed, put back (a tenth of the generator's cost, which every VJP, pullback and JVP
    paid twice or more: issue 37).
    """

    __slots__ = ("grad_enabled", "slow")

    def __enter__(self):
        if torch.is_inference_mode_enabled():
            self.slow = _caller_modes_under_inference()
            return self.slow.__enter__()
        self.slow, self.grad_enabled = None, torch.is_grad_enabled()

    def __exit__(self, *exc):
        if self.slow is not None:
            return self.slow.__exit__(*exc)
        if torch.is_grad_enabled() != self.grad_enabled:
            torch.set_grad_enabled(self.grad_enabled)
        return False


_CAPTURED_WRITE = re.compile(r"in-place operation \((\S+)\) that would mutate a captured Tensor")


@contextlib.contextmanager
def _numpy_calls_rejected():
    """A NumPy function called inside ``f`` on a tensor being transformed (``np.median(x)``) ends in
    torch's ``Tensor.__array__``, which raises a RuntimeError about ``numpy()``/``requires grad`` (or
    about batched tensors); that becomes a TypeError that says what happened and what to use instead.
    So does ``torch.func``'s refusal of a write into a tensor ``f`` closes over (batch norm's running
    statistics in training mode)."""
    try:
        yield
    except RuntimeError as exc:
        found = _CAPTURED_WRITE.search(str(exc))
        if found is not None:
            raise TypeError(
                f"the function wrote in place ({found.group(1)}) into a tensor other than the arrays being "
                "differentiated (one it closes over, such as batch norm's running statistics in training mode): "
                "torch.func, on which this transform runs, cannot differentiate that. Put the module in eval "
                "mode (model.eval()), or use unigrad.per_example_grad, or unigrad.grad of tensors that do not "
                "require grad, which run such a function once on plain torch.autograd") from exc
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "__array__" and "torch" in code.co_filename:
                raise TypeError(
                    "a NumPy function (np.median, np.asarray...) was called inside the function on a torch "
                    "tensor that unigrad is differentiating or mapping: NumPy cannot carry its derivative. "
                    "Use the array namespace instead: xp = unigrad.namespace(x); xp.median(x)") from exc
            tb = tb.tb_next
        raise


_current_level = torch._C._functorch.maybe_current_level
_forward_ad = torch.autograd.forward_ad
_unpack_dual = torch._VF._unpack_dual


def _plain(primals) -> bool:
    """Plain ``torch.autograd`` serves a reverse sweep at ``primals``: no ``torch.func`` transform is
    running (its wrapped tensors need ``torch.func``'s own transforms to nest), no input is a dual
    tensor of forward mode (``detach`` would drop its tangent), inference mode is off and no input is an
    inference tensor, and no input requires grad while grad mode is on (the caller is recording a graph
    through the call: ``torch.func``'s results stay connected to it, which a detached sweep's would not).
    Decided from this thread's state and the inputs alone: forward-mode work in other threads (the dual
    level is process-global) must not change which way a call goes, nor its last bit."""
    if _current_level() is not None or torch.is_inference_mode_enabled():
        return False
    recording = torch.is_grad_enabled()
    duals = _forward_ad._current_level >= 0  # (torch has one dual level, 0; without it nothing is dual)
    for p in primals:
        if p.is_inference() or (recording and p.requires_grad) or (duals and _unpack_dual(p, 0)[1] is not None):
            return False
    return True


def _autograd_grad(outputs, inputs, grad_outputs, create_graph=False):
    return torch.autograd.grad(outputs, inputs, grad_outputs, create_graph=create_graph, allow_unused=True)


def _engine_agrees(engine) -> bool:
    """``engine`` (torch's private ``_engine_run_backward``, called as ``torch.autograd.grad`` calls it)
    gives ``torch.autograd.grad``'s first and second derivatives of a small function, and accumulates
    nothing into ``.grad``."""
    try:
        with torch.inference_mode(False), torch.enable_grad():
            x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
            y = (x ** 3).sum()
            (g,) = engine((y,), (torch.ones_like(y),), True, True, (x,), True, accumulate_grad=False)
            v = torch.tensor([1.0, -1.0], dtype=torch.float64)
            (h,) = engine((g,), (v,), False, False, (x,), True, accumulate_grad=False)
        return g.tolist() == [3.0, 12.0] and h.tolist() == [6.0, -12.0] and x.grad is None
    except Exception:  # noqa: BLE001 -- any failure: the public function serves every call
        return False


# torch.autograd.grad is a Python wrapper around the engine call ``torch.autograd.graph._engine_run_backward``:
# argument normalisation, ``_make_grads`` (the unit cotangent of a scalar, shape and dtype checks) and the
# __torch_function__ check cost about 13 us a call, a quarter of a 45 us gradient of a 64-element function
# and most of unigrad's overhead over ``torch.autograd.grad`` there (benchmarks/bench_calls.py, torch 2.13).
# Where none of that work applies -- plain tensors and no torch function mode (``_has_torch_function``), and
# cotangents made here with their output's shape and dtype -- ``_backward`` calls the engine function with
# the arguments torch.autograd.grad itself passes it. The function is private: it is used only where it
# exists and, checked once at import, gives torch.autograd.grad's results; else torch.autograd.grad serves.
_ENGINE = getattr(getattr(torch.autograd, "graph", None), "_engine_run_backward", None)
if _ENGINE is not None and not _engine_agrees(_ENGINE):
    _ENGINE = None
_has_torch_function = torch._C._has_torch_function


def _backward(outputs, inputs, grad_outputs, create_graph=False):
    """``torch.autograd.grad(outputs, inputs, grad_outputs, create_graph=..., allow_unused=True)``
    (tuples of tensors; ``grad_outputs`` with the outputs' shapes and dtypes: else the public function,
    which says what is wrong)."""
    if _ENGINE is None or _has_torch_function(outputs + inputs + grad_outputs):
        return _autograd_grad(outputs, inputs, grad_outputs, create_graph)
    for o, c in zip(outputs, grad_outputs):
        if o.shape != c.shape or o.dtype != c.dtype:
            return _autograd_grad(outputs, inputs, grad_outputs, create_graph)
    return _ENGINE(outputs, grad_outputs, create_graph, create_graph, inputs, True, accumulate_grad=False)


def _recorded(f, leaves, has_aux):
    """``f(*leaves)`` with grad mode on (the caller's mode back after, also on errors): ``(outputs,
    aux)`` as :func:`_call` gives them. (A NumPy function called on a tensor gets
    :func:`_numpy_calls_rejected`'s error, inline: a context manager costs microseconds per call.)"""
    enabled = torch.is_grad_enabled()
    torch._C._set_grad_enabled(True)
    try:
        return _call(f, leaves, has_aux)
    except RuntimeError:
        with _numpy_calls_rejected():
            raise
    finally:
        torch._C._set_grad_enabled(enabled)


def _usable(arrays):
    """Inference tensors cannot be saved for backward: replace them by ordinary copies.

    Call with inference mode off (a clone made inside inference mode is an inference tensor again).
    """
    return tuple(a.clone() if a.is_inference() else a for a in arrays)


def _on_device_of(x, reference):
    # Cotangents and tangents converted from NumPy by the core land on the CPU; they belong with
    # the value they pair with.
    return x if x.device == reference.device else x.to(reference.device)


def _conj(x):
    # Materialised: a lazily conjugated tensor cannot become a NumPy array. (conj().resolve_conj()
    # rather than conj_physical, which has no vmap batching rule and falls back to a slow loop.)
    return x.conj().resolve_conj() if x.is_complex() else x


def _on_copies(f):
    """``f`` called with a copy of each tensor it is given (``clone``, differentiable at every level).

    An ``f`` that writes into its argument (``x.mul_(2)``) then writes into a tensor of its own, which
    every mode differentiates as written (the function ``x -> f(x)``, with the write part of it), and
    never into the caller's memory (forward mode and ``vmap`` would write through their dual and batched
    tensors into it). Forward mode, ``vmap`` and plain evaluations use it up front; reverse mode only
    after a refused write (:func:`_retried_on_copies`), where it would cost a tenth of a call: measured on
    a 64-element function (torch 2.13, CPU time on 2 busy cores), the copies add about 13 us to a 110 us
    gradient (which takes none) and about 24 us to a 265 us ``jvp``.
    """
    def on_copies(*arrays):
        return f(*[a.clone() if isinstance(a, torch.Tensor) else a for a in arrays])

    return on_copies




def _retried_on_copies(run, f):
    """``run(f)``; where ``f`` wrote into one of the leaves that require grad it was given (its arguments in
    reverse mode: plain autograd's leaves, ``torch.func.vjp``'s inputs), which torch refuses before writing
    anything, ``run`` again on :func:`_on_copies` of ``f``. So ``f`` then runs twice: what it does before the
    write (printing, appending to a list, updating a buffer) happens twice. A write into a leaf of the
    caller's own (a closed-over tensor that requires grad) is refused again, with torch's error."""
    try:
        return run(f)
    except RuntimeError as exc:
        if _LEAF_WRITE.search(str(exc)) is None:
            raise
    return run(_on_copies(f))


def _call(f, primals, has_aux):
    result = f(*primals)
    if has_aux:
        outputs, aux = result
        return tuple(outputs), tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in aux)
    return tuple(result), None


class _AuxSplit:
    """Wraps ``f`` with ``has_aux``: tensor aux leaves go through torch.func (which unwraps them from
    the transform); the other leaves (strings, numbers, None...) are kept here and merged back."""

    def __init__(self, f):
        self.f = f
        self.is_tensor = self.others = ()

    def __call__(self, *primals):
        outputs, aux = self.f(*primals)
        aux = tuple(aux)
        self.is_tensor = tuple(isinstance(a, torch.Tensor) for a in aux)
        self.others = tuple(None if t else a for a, t in zip(aux, self.is_tensor))
        return outputs, tuple(a for a, t in zip(aux, self.is_tensor) if t)

    def merge(self, tensors, index=None):
        """The aux leaves in their order; ``index`` picks one row of tensors batched by a vmap."""
        tensors = iter(tensors)
        return tuple((next(tensors) if index is None else next(tensors)[index]) if t else a
                     for a, t in zip(self.others, self.is_tensor))


def _push_rows(f, primals, make_rows, n, chunk_size, has_aux):
    """JVPs of ``f`` at ``primals`` along ``n`` tangent rows, vmapped chunk by chunk.

    ``make_rows(start, stop)`` gives rows ``start:stop``, one array per primal (``Backend.map_chunks``'s
    convention). Returns ``(outputs, pushed, aux)``; ``pushed[i]`` is ``(n, *outputs[i].shape)``. Call
    with the forward lock held. All rows belong to one evaluation of ``f``: random ops inside draw
    once per chunk (vmap randomness "same").
    """
    f = _on_copies(f)
    if n == 0:  # nothing to push: evaluate f plainly
        outputs, aux = _call(f, primals, has_aux)
        return outputs, tuple(torch.zeros((0, *o.shape), dtype=o.dtype, device=o.device) for o in outputs), aux
    split = _AuxSplit(f) if has_aux else None

    def push(*tangents):
        if has_aux:
            return torch.func.jvp(split, primals, tangents, has_aux=True)
        return torch.func.jvp(f, primals, tangents)

    mapped = torch.func.vmap(push, randomness="same")
    outputs = aux = None
    pieces = []
    for start, stop in chunks(n, chunk_size):
        result = mapped(*make_rows(start, stop))
        pieces.append(result[1])
        if outputs is None:
            # vmap broadcast the (unmapped) outputs and aux over the basis: take one copy
            outputs = tuple(o[0] for o in result[0])
            if has_aux:
                aux = split.merge(result[2], index=0)
    pushed = tuple(torch.cat([p[i] for p in pieces]) if len(pieces) > 1 else pieces[0][i]
                   for i in range(len(outputs)))
    return outputs, _tangents_as_outputs(pushed, outputs), aux


_SPECIAL = {name: getattr(torch.special, name) for name in (
    "gammaln", "digamma", "erf", "erfc", "erfinv", "ndtr", "log_ndtr", "ndtri", "expit", "logit", "xlogy",
    "xlog1py", "i0e", "i1e")}
_SPECIAL["polygamma"] = torch.special.polygamma  # (n, x)
_SPECIAL["multigammaln"] = torch.special.multigammaln  # (a, d)


try:  # a functorch transform's wrapper (batched, grad-tracking): no storage of the caller's
    from torch._C._functorch import is_functorch_wrapped_tensor as _is_wrapped
except ImportError:  # (a torch without it: every tensor is asked for its storage)
    _is_wrapped = None


def _wrapped(t) -> bool:
    return _is_wrapped is not None and isinstance(t, torch.Tensor) and _is_wrapped(t)


def _fresh(results, received):
    """``results`` owned by the caller, as on every backend: a result that is (a view of) a tensor the
    caller passed in (``received``), or of an earlier result, is cloned. torch returns its input itself
    for an identity (``vjp_fn(ct)[0] is ct``), and a caller writing into that result would change their
    own argument. Tensors of an enclosing transform (functorch wrappers, which expose no storage) are
    that transform's values, not the caller's memory, and are left as they are: they are recognised
    first (``is_functorch_wrapped_tensor``, a fraction of a microsecond), since asking one for its storage
    raises an error that costs about 20 us to make -- twice per pullback inside a vmapped Jacobian, and
    on every value of a nested transform (issue 37)."""
    seen = set()
    for t in received:
        if _wrapped(t):
            continue
        try:
            seen.add(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError, AttributeError):
            pass
    out = []
    for r in results:
        if _wrapped(r):
            out.append(r)
            continue
        try:
            ptr = r.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError, AttributeError):
            out.append(r)
            continue
        if ptr in seen and r.numel():
            out.append(r.clone())  # fresh memory (inside an enclosing transform, possibly that level's tensor)
            continue
        seen.add(ptr)
        out.append(r)
    return tuple(out)


def _tangents_as_outputs(tangents, outputs):
    """Each tangent in its output's dtype.

    torch's forward mode can return a 0-d float32 output's tangent as float64 when ``f`` combines it
    with a Python float (``x * 2.0``, ``x + 1.0``): the scalar becomes a float64 tensor whose zero
    tangent loses the "wrapped number" mark that keeps it out of type promotion
    (pytorch/pytorch#90065, still so in torch 2.13 under ``torch.func.jvp``). The tangent of a
    float32 output is float32 (the contract, as JAX); the values are those of the float64
    computation rounded once.
    """
    return tuple(t if t.dtype == o.dtype else t.to(o.dtype) for t, o in zip(tangents, outputs))


def _vmap_empty(f, args, in_dims, out_axis):
    """vmap over an axis of size 0: f runs on one example of zeros, then the map axis is cut to 0."""
    one = []
    for a, ax in zip(args, in_dims):
        if ax is None:
            one.append(a)
        else:
            shape = list(a.shape)
            shape[ax] = 1
            one.append(torch.zeros(shape, dtype=a.dtype, device=a.device))
    outputs = torch.func.vmap(f, in_dims=in_dims, out_dims=out_axis)(*one)
    return tuple(o.narrow(out_axis % o.ndim, 0, 0) for o in outputs)


def _functorch_disabled():
    disable = getattr(torch._C, "_DisableFuncTorch", None)
    return disable() if disable is not None else contextlib.nullcontext()


def _primal_value(x):
    """The plain tensor under the wrappers of grad-like transforms (there is none inside vmap)."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(x):
        if functorch.is_batchedtensor(x):
            raise TypeError("to_numpy: a value inside vmap has no single NumPy value; convert the "
                            "results of the map instead")
        x = functorch.get_unwrapped(x)
    return x


def _torch_dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    found = _DTYPES.get(dtype) if isinstance(dtype, str) else None
    if found is None:
        raise ValueError(f"dtype must be a dtype name such as 'float32' or 'bfloat16' (one of "
                         f"{sorted(_DTYPES)}) or a torch.dtype; got {dtype!r}")
    return found


def _torch_device(device, available):
    """A unigrad device string (``cpu``, ``cuda``, ``cuda:N``, ``gpu``) or a torch.device as a torch.device."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        name = device.strip().lower()
        if name == "gpu":
            name = "cuda:0"
        if name == "cpu":
            return torch.device("cpu")
        if _CUDA_DEVICE.fullmatch(name):
            index = int(name[5:]) if ":" in name else 0
            if index >= (torch.cuda.device_count() if torch.cuda.is_available() else 0):
                raise ValueError(f"device={device!r} is not available to torch; available devices: "
                                 f"{', '.join(available())}")
            return torch.device(name)
        try:  # other torch device types ("mps", "xpu"...) as torch names them
            return torch.device(name)
        except RuntimeError:
            pass
    raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N', 'gpu' or a torch.device; got {device!r} "
                     f"(available: {', '.join(available())})")


def _from_numpy(a):
    """A tensor sharing ``a``'s memory where torch allows it, else a copy; dtype kept."""
    if a.dtype.name == "bfloat16":  # ml_dtypes.bfloat16 (JAX's): same bits as torch.bfloat16
        return torch.from_numpy(np.array(a.view(np.int16))).view(torch.bfloat16)
    if a.dtype.kind not in "biufc":
        raise TypeError(f"cannot convert a NumPy array of dtype {a.dtype} to a torch tensor")
    # torch.from_numpy rejects negative strides and non-native byte order, and warns on read-only arrays
    if any(s < 0 for s in a.strides) or not a.dtype.isnative or not a.flags.writeable:
        a = np.array(a, dtype=a.dtype.newbyteorder("="), copy=True)
    return torch.from_numpy(a)
