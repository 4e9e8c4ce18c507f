"""Rematerialisation on the tape: ``checkpoint(f, args)`` keeps only the block's inputs.

A reverse trace records a checkpointed block as one *node* entry (its inputs, and ``f``) followed
by one *output* entry per result; nothing ``f`` computes inside is kept. When the backward sweep
reaches the node, it re-records ``f`` on the kept inputs with a fresh reverse trace, sweeps that
trace once (releasing it as it goes) and hands the inputs' cotangents to the sweep. The
recomputation is written with traced operations like every rule, so it can itself be
differentiated (``hessian``, ``hvp``) and it takes batched cotangents (Jacobians in one sweep).

Several outputs: each output entry's rule returns a :class:`_Parts` (the cotangent of that output,
by position), ``+`` merges them, and the node's rule reads them all at once; the node computes the
inputs' cotangents once for all its inputs (the sweep asks input by input) and keeps them on the
:class:`_Parts` it was given, which only this node's entry ever sees.

Forward traces run ``f`` as it is (forward mode stores nothing to rematerialise), and so does a
call on untraced values. A value of the recording trace that ``f`` closes over instead of taking
as an argument would need a derivative the node cannot give: the trace is switched off while ``f``
runs, so such a use raises (a TypeError that says so) instead of losing the derivative.
"""

from __future__ import annotations

import numpy as np

from ._core import _SHELL_MIN, ReverseTrace, backward, record
from ._tracer import LeakedTracerError, RTracer, Shell, Tracer

__all__ = ["checkpoint"]


def checkpoint(f, args):
    """``tuple(f(*args))``, recorded by reverse traces as one rematerialised block (module docstring)."""
    top = None
    for a in args:
        if isinstance(a, Tracer) and (top is None or a.trace.level > top.level):
            top = a.trace
    if top is None or not isinstance(top, ReverseTrace):  # untraced, or forward mode: f as it is
        return tuple(f(*args))
    return _record_block(top, f, args)


class _Node:
    """What the tape keeps of a checkpointed block besides its inputs: ``f`` and its outputs' shapes
    and dtypes (for the zero cotangent of an output the rest of the program did not use)."""

    __slots__ = ("f", "shapes", "dtypes")
    shape = ()  # read by the sweep's chunk-size estimate (``_tape_elements``): the node holds no array

    def __init__(self, f, outs):
        self.f = f
        self.shapes = tuple(tuple(np.shape(o)) if not isinstance(o, Tracer) else tuple(o.shape) for o in outs)
        self.dtypes = tuple(o.dtype for o in outs)


class _Parts:
    """The cotangents of a block's outputs gathered by position (``+`` merges), and, once the node
    has pulled them back, the inputs' cotangents (``grads``)."""

    __slots__ = ("parts", "grads")

    def __init__(self, parts):
        self.parts, self.grads = parts, None

    def __add__(self, other):
        parts = dict(self.parts)
        for j, g in other.parts.items():
            old = parts.get(j)
            parts[j] = g if old is None else old + g
        return _Parts(parts)


class _Rule:
    """A primitive-like entry for the sweep: ``vjps[i]``, ``broadcasts`` and ``slope`` (None: the rules
    are called) are all it reads."""

    __slots__ = ("name", "vjps", "broadcasts", "slope")

    def __init__(self, name, vjps):
        self.name, self.vjps, self.broadcasts, self.slope = name, vjps, False, None

    def __repr__(self):
        return f"<primitive {self.name}>"


def _output_vjp(g, ans, node, index):
    return _Parts({index: g})


class _NodeRules:
    """``vjps[i]`` of a node: the cotangent of input ``i``, from one pull-back shared by all inputs."""

    __slots__ = ()

    def __getitem__(self, i):
        return lambda g, node, *vals, parents: _pull_back(g, node, vals, parents)[i]


def _pull_back(g: _Parts, node: _Node, vals, parents):
    """Re-record ``node.f`` on the kept inputs and sweep it: the cotangents of the traced inputs."""
    if g.grads is not None:
        return g.grads
    batch_shape = None
    for j, part in g.parts.items():
        nb = len(part.shape) - len(node.shapes[j])
        batch_shape = tuple(part.shape[:nb])
        break
    cotangents = [g.parts.get(j) for j in range(len(node.shapes))]
    cotangents = [c if c is not None else np.zeros(batch_shape + shape, dtype=dtype)
                  for c, shape, dtype in zip(cotangents, node.shapes, node.dtypes)]
    positions = [i for i, _ in parents]

    def block(*inputs):
        call = list(vals)
        for i, x in zip(positions, inputs):
            call[i] = x
        return tuple(node.f(*call))

    inputs = [vals[i] for i in positions]
    trace, _, out_indices, _ = record(block, inputs, has_aux=False)
    grads = backward(trace, out_indices, cotangents, len(inputs), inputs, batch_shape=batch_shape, release=True)
    g.grads = dict(zip(positions, grads))
    return g.grads


_NODE = _Rule("checkpoint", _NodeRules())
_OUTPUT = _Rule("checkpoint_output", (_output_vjp,))


def _record_block(trace: ReverseTrace, f, args):
    if not trace.active:
        trace._leaked(_NODE)
    vals, parents = list(args), []
    for i, a in enumerate(args):
        if isinstance(a, Tracer) and a.trace.level == trace.level:
            if a.trace is not trace:
                a.trace._leaked(_NODE)
            vals[i] = a.value
            parents.append((i, a.index))
    trace.active = False  # f sees its arguments one level down; a value of this trace it closes over raises
    try:
        outs = checkpoint(f, vals)  # the traces below record (or run) the block their own way
    except LeakedTracerError as exc:
        raise TypeError(
            "checkpoint: the checkpointed function used a traced value that is not one of its arguments "
            "(a value it closes over, computed inside the transform, or one kept from a finished "
            "transform); rematerialisation recomputes the block from its arguments alone, so pass every "
            f"such value to the checkpointed function as an argument ({exc})") from exc
    finally:
        trace.active = True
    node = _Node(f, outs)
    tape = trace.tape
    k = len(tape)
    # The node's rules read the sweep's keyword ``parents``; its ``ans`` is the node itself.
    tape.append((_NODE, parents, vals, node, {"parents": parents}))
    results = []
    for j, o in enumerate(outs):
        kept = Shell(o) if type(o) is np.ndarray and o.size >= _SHELL_MIN else o  # no rule reads it
        tape.append((_OUTPUT, [(0, k)], [node], kept, {"index": j}))
        results.append(RTracer(trace, o, k + 1 + j))
    return tuple(results)
