"""Per-example Jacobians by proof on TensorFlow: the rows of ``f`` read from its graph.

``batch_rows`` traces ``f`` once per signature into a ``tf.function`` graph (``get_concrete_function``
with ``tf.TensorSpec`` s of the primals' shapes and dtypes; the core caches the answer per signature) and
runs unigrad's row analysis over its operations (:mod:`unigrad.dependence`, its TensorFlow graph
front-end): MIXED names the operation that mixes rows and the user's line (from the operation's
traceback), ROW proves them independent, an operation without a rule answers "unknown" (then the core
reads portable ``f`` on the NumPy tape, or probes). An ``f`` that reads values (``x.numpy()``,
``bool(x)``) cannot be traced into a graph: the core falls back the same way. Native TensorFlow code
(``tf.matmul``, ``tf.nn``, Keras layers' functions) is proved this way instead of probed.
"""

from __future__ import annotations

import tensorflow as tf


def graph_of(f, primals, has_aux):
    """``(program, nodes_of)``: ``f``'s outputs (aux left out) traced into a ``tf.function`` graph at the
    primals' shapes and dtypes, as ``unigrad.dependence``'s program; ``nodes_of`` maps a node's id to its op."""
    from ._dependence import graph_program

    def outputs(*p):
        result = f(*p)
        return tuple(result[0]) if has_aux else tuple(result)

    specs = [tf.TensorSpec(p.shape, p.dtype) for p in primals]
    graph = tf.function(outputs, autograph=False).get_concrete_function(*specs).graph
    nodes_of = {}
    program = graph_program(graph.get_operations(), graph.inputs[:len(primals)], graph.outputs, nodes_of=nodes_of)
    return program, nodes_of


def batch_rows(f, primals, has_aux):
    """``(verdict, detail, False)``; ``f`` takes and returns plain tensors (the backend's ``evaluate``)."""
    from unigrad.dependence import prove_rows
    from ._dependence import op_site

    program, nodes_of = graph_of(f, primals, has_aux)
    verdict, detail = prove_rows(program, primals[0].shape[0])
    if verdict == "mixed" and detail.node is not None and detail.node.site is None:
        op = nodes_of.get(id(detail.node))
        if op is not None:
            detail.node.site = op_site(op)
    return verdict, detail, False
