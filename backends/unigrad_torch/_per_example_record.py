"""The recorder of ``_per_example``: every ATen operation of one forward pass, with its data flow.

A module of its own because its class derives from torch's ``TorchDispatchMode``: it imports torch at
import, so ``_per_example`` loads it only when a torch call runs (``import unigrad_torch`` must not
import torch).
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class Recorder(TorchDispatchMode):
    """Every ATen operation run while active: ``ops[k] = (func, flat operands, spec, output)``, and the
    program's signature (operations, data flow, shapes, dtypes, literal arguments)."""

    def __init__(self, inputs):
        super().__init__()
        import torch
        self.torch = torch
        self.inputs = inputs
        self.where = {id(t): ("in", k) for k, t in enumerate(inputs)}
        self.ops, self.sig = [], []
        self.broken = False  # an operand depends on the parameters but its origin was not seen
        self.consts = []
        self.writes = []  # (operation index, storage) of every tensor an operation wrote in place
        self.last_write = {}  # storage -> the index of the last operation that wrote into it
        self.edges = {}  # ref of a value later overwritten in place -> its autograd gradient edge
        self.captured = set()  # the storages of tensors f did not make (closed over: a module's buffers...)
        self.captured_writes = []  # the operations that wrote into them (batch norm's running statistics)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        torch = self.torch
        written = self._written(func, args, kwargs) if func._schema.is_mutable else ()
        # (a tensor written in place gets a new autograd history: the gradient edge of the value it held
        # is kept, so G at that value can still be asked for)
        edges = [(self.where.get(id(t)), torch.autograd.graph.get_gradient_edge(t)) for t in written
                 if t.grad_fn is not None]
        out = func(*args, **kwargs)
        if func is torch.ops.aten.detach.default:  # autograd's copies for backward, or the user's detach
            return out
        flat, spec = _flatten(args, kwargs)
        refs = []
        k = len(self.ops)
        for a in flat:
            if isinstance(a, torch.Tensor):
                ref = self.where.get(id(a))
                if ref is None:
                    if a.grad_fn is not None:  # computed from the parameters, by no operation seen here
                        self.broken = True
                    ref = ("c", len(self.consts))
                    self.consts.append(a)
                    self.captured.add(_storage(a))
                if self.last_write and not self.broken:
                    # a value read through another alias (a view, its base) of memory written in place
                    # after that alias was made: the data flow recorded would not be the one that ran
                    w = self.last_write.get(_storage(a))
                    if w is not None and (ref[0] if isinstance(ref[0], int) else -1) < w:
                        self.broken = True
                refs.append((ref, tuple(a.shape), a.dtype))
            else:
                refs.append(a)
        for t in written:
            ptr = _storage(t)
            self.writes.append((k, ptr))
            self.last_write[ptr] = k
            if ptr in self.captured:  # (a view of it made in f too: the same memory)
                self.captured_writes.append(func)
        for ref, edge in edges:
            if ref is not None:
                self.edges.setdefault(ref, edge)
        self.ops.append((func, flat, spec, out))
        self.sig.append((func, spec, tuple(refs)))
        if isinstance(out, (tuple, list)):
            for j, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    self.where[id(o)] = (k, j)
        elif isinstance(out, torch.Tensor):
            self.where[id(out)] = (k, None)
        return out

    def _written(self, func, args, kwargs):
        """The tensors ``func`` writes in place (its schema's ``a!`` arguments)."""
        torch = self.torch
        found = []
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            for t in (value if isinstance(value, (list, tuple)) else (value,)):
                if isinstance(t, torch.Tensor) and t.numel():
                    found.append(t)
        return found

    def stale(self, ref):
        """Whether the value of ``ref`` (or a view of its memory) was written in place after it was made:
        then it no longer holds what the operations that read it saw."""
        if not self.writes:
            return False
        made = ref[0] if isinstance(ref[0], int) else -1
        ptr = _storage(self.value(ref))
        return any(k > made and p == ptr for k, p in self.writes)

    def key(self, losses, batch):
        ref = self.where.get(id(losses))
        if self.broken or ref is None or ref[0] in ("in", "c"):
            return None
        try:
            return hash(tuple(self.sig)), tuple(self.sig), ref, batch
        except TypeError:  # an unhashable literal argument: no cache, no fast path
            return None

    def value(self, ref):
        if ref[0] == "in":
            return self.inputs[ref[1]]
        if ref[0] == "c":
            return self.consts[ref[1]]
        out = self.ops[ref[0]][3]
        return out if ref[1] is None else out[ref[1]]

    def graph(self, losses):
        """The record as a ``torch.fx`` graph (placeholders: the parameters); and node -> ref."""
        import operator

        from torch.fx import Graph

        torch = self.torch
        g = Graph()
        nodes, refs = {}, {}
        for k, x in enumerate(self.inputs):
            node = g.placeholder(f"p{k}")
            node.meta["val"] = x
            nodes[("in", k)] = node
            refs[node] = ("in", k)

        def node_of(ref, value):
            node = nodes.get(ref)
            if node is None:
                if ref[0] == "c":
                    node = g.get_attr(f"c{ref[1]}")
                else:  # a result of an operation with several
                    node = g.call_function(operator.getitem, (nodes[(ref[0], "all")], ref[1]))
                node.meta["val"] = value
                nodes[ref] = node
                refs[node] = ref
            return node

        for k, (func, flat, spec, out) in enumerate(self.ops):
            items = []
            for a in flat:
                if isinstance(a, torch.Tensor):
                    items.append(node_of(self._ref(a, k), a))
                else:
                    items.append(a)
            args, kwargs = _unflatten(items, spec)
            node = g.call_function(func, tuple(args), dict(kwargs))
            node.meta["val"] = out
            if isinstance(out, (tuple, list)):
                nodes[(k, "all")] = node
            else:
                nodes[(k, None)] = node
                refs[node] = (k, None)
        g.output((node_of(self.where[id(losses)], losses),))
        return g, refs

    def _ref(self, a, k):
        """The ref an operand of operation k had when it ran (the signature kept it)."""
        return self._refs_at(k)[id(a)]

    def _refs_at(self, k):
        cache = getattr(self, "_at", None)
        if cache is None or cache[0] != k:
            torch = self.torch
            refs = {}
            flat = self.ops[k][1]
            for a, r in zip(flat, self.sig[k][2]):
                if isinstance(a, torch.Tensor):
                    refs[id(a)] = r[0]
            self._at = cache = (k, refs)
        return cache[1]


def _storage(t):
    """An id of the memory ``t`` lives in (shared by its views); None for an empty tensor."""
    if not t.numel():
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a wrapper): its own identity
        return ("id", id(t))


def _flatten(args, kwargs):
    """``(operands, spec)``: the arguments of an operation as a flat list (lists and tuples opened, to
    any depth, so no tensor is missed) and a hashable description of their structure."""
    flat = []

    def walk(a):
        if isinstance(a, (list, tuple)):
            return (type(a) is tuple, tuple(walk(b) for b in a))
        flat.append(a)
        return None

    spec = (tuple(walk(a) for a in args), tuple((k, walk(v)) for k, v in kwargs.items()))
    return flat, spec


def _unflatten(items, spec):
    """The arguments again, from ``_flatten``'s spec and new operands."""
    it = iter(items)

    def build(sp):
        if sp is None:
            return next(it)
        is_tuple, inner = sp
        built = [build(b) for b in inner]
        return tuple(built) if is_tuple else built

    args = tuple(build(sp) for sp in spec[0])
    return args, {k: build(sp) for k, sp in spec[1]}
