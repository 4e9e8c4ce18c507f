"""Per-example Jacobians by proof on torch: the rows of ``f`` read from its ATen graph.

``batch_rows`` traces ``f`` once per signature with ``make_fx`` on fake tensors (shapes and dtypes only:
a value read -- ``bool(x)``, ``x.item()``, ``x.numpy()`` -- cannot be traced, and then the core reads
portable ``f`` on the NumPy tape, which follows values call by call, or probes) and runs unigrad's row
analysis over the graph (:mod:`unigrad.dependence`, its torch.fx front-end): MIXED names the operation
that mixes rows (and the user's line, found by running ``f`` once more on fake tensors), ROW proves them
independent, an operation without a rule answers "unknown". Native torch code (``torch.nn.functional``,
``nn.Module`` through ``functional_call``) is proved this way instead of probed.
"""

from __future__ import annotations


def fx_graph(f, primals, has_aux):
    """``f``'s outputs (aux left out) traced into an ATen ``torch.fx`` graph on fake tensors."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    def outputs(*p):
        result = f(*p)
        return tuple(result[0]) if has_aux else tuple(result)

    with torch.inference_mode(False):
        return make_fx(outputs, tracing_mode="fake", _allow_non_fake_inputs=True)(*primals)


def batch_rows(f, primals, has_aux):
    from unigrad.dependence import prove_rows
    from ._dependence import fx_program

    def outputs(*p):
        result = f(*p)
        return tuple(result[0]) if has_aux else tuple(result)

    graph = fx_graph(f, primals, has_aux)
    ids = {}
    verdict, detail = prove_rows(fx_program(graph, ids=ids), primals[0].shape[0])
    if verdict == "mixed" and detail.node is not None and detail.node.site is None:
        try:
            detail.node.site = _site(outputs, primals, graph, ids, detail.node)
        except Exception:  # the message goes without the line
            pass
    return verdict, detail, False


def _site(outputs, primals, graph, ids, node):
    """The user's ``file:line`` of the operation behind ``node``: ``f`` run again on fake tensors, each
    ATen operation noted with the innermost frame outside unigrad and the libraries."""
    import operator

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    by_vid = {v: n for n, v in ids.items()}
    target = next((by_vid[v] for v in node.outs if v in by_vid), None)
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    if target is None or target not in calls:
        return None
    nth = [n for n in calls if n.target is target.target].index(target)  # the n-th call of that operation

    class Sites(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sites = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is not torch.ops.aten.detach.default:
                self.sites.append((func, _user_site()))
            return func(*args, **(kwargs or {}))

    with torch.inference_mode(False), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = [mode.from_tensor(p) for p in primals]
        with Sites() as seen:
            outputs(*fakes)
    same = [site for func, site in seen.sites if func is target.target]
    return same[nth] if nth < len(same) else None


def _user_site():
    """``file:line (in name)`` of the innermost frame outside unigrad, this adapter and the libraries."""
    import os
    import sys

    import unigrad

    skip = (os.path.dirname(os.path.abspath(unigrad.__file__)), os.path.dirname(os.path.abspath(__file__)))
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(skip) or "site-packages" in name or name.startswith("<")):
            return f"{os.path.basename(name)}:{frame.f_lineno} (in {frame.f_code.co_name})"
        frame = frame.f_back
    return None
