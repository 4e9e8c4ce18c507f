"""The core's modules form layers: no import -- at module level or inside a function -- points from a
lower module up to ``unigrad/__init__`` or to a module that imports it back.

Every ``import`` and ``from ... import`` in every module under ``unigrad/`` is read (with ``ast``: imports
inside functions count, they run as surely as the others, only later), resolved to the module it loads,
and the graph must have no cycle. ``unigrad.testing``, ``unigrad.dask`` and the CLI sit above the package
root (they use the public API, and the root does not import them); anything the root imports must not
import the root or anything above it again.
"""

from __future__ import annotations

import ast
import pathlib

import unigrad

ROOT = pathlib.Path(unigrad.__file__).parent


def _modules():
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, package)
    return mods


def _targets(mods, module, package, node):
    """The unigrad modules an import statement loads (a name imported from a package that is not one of its
    modules is the package's attribute: the package itself)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == "unigrad" or a.name.startswith("unigrad.")]
    if node.level:
        base = module.split(".") if package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
        if target != "unigrad" and not target.startswith("unigrad."):
            return []
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target for a in node.names]


def import_graph():
    """``{module: {modules it imports}}`` over every module under ``unigrad/``, function-level imports included."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for module, (path, package) in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(t for t in _targets(mods, module, package, node) if t in mods and t != module)
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_points_up():
    graph = import_graph()
    found = cycles(graph)
    detail = "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{m} -> {t}" for m in c for t in sorted(graph[m]) if t in c) + ")"
        for c in found)
    assert not found, f"modules that import each other, at module level or inside a function: {detail}"


def test_the_package_root_reaches_no_module_that_imports_it():
    graph = import_graph()
    reached, todo = set(), ["unigrad"]
    while todo:
        m = todo.pop()
        for t in graph[m]:
            if t not in reached:
                reached.add(t)
                todo.append(t)
    upward = sorted(m for m in reached if "unigrad" in graph[m])
    assert not upward, f"modules unigrad/__init__ imports that import the package root back: {upward}"


def test_the_checks_catch_an_import_that_points_up():
    """The checkers fail on a graph with a function-level import of the root (a deliberate mutation)."""
    graph = import_graph()
    graph["unigrad._call"] = graph["unigrad._call"] | {"unigrad"}
    assert cycles(graph)


def test_backends_import_only_unigrads_public_api():
    """The first-party adapters import what a third-party plugin can: no private module of unigrad
    (``unigrad._call``, ``unigrad.dependence._rules``...), at module level or inside a function."""
    backends = ROOT.parent / "backends"
    offenders = []
    for path in sorted(backends.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "unigrad" and any(p.startswith("_") for p in parts[1:]):
                    offenders.append(f"{path.relative_to(backends)}:{node.lineno} {name}")
    assert not offenders, f"backends importing unigrad's private modules: {offenders}"


#: Adapters whose modules import nothing from their own package's ``__init__`` (issue 36, item 5). The JAX
#: and torch adapters are not listed yet: JAX's ``_proof`` imports ``_x64`` and torch's ``_per_example``
#: imports ``_LEAF_WRITE`` from their packages; add each here once its layering is honest.
HONEST_ADAPTERS = ("backends/unigrad_tensorflow", "backends/unigrad_jax", "backends/unigrad_torch", "plugins/unigrad_mlx",
                   "plugins/unigrad_autograd")


def package_root_imports(package_dir):
    """``file:line name`` for every import, anywhere in a module of ``package_dir`` other than its
    ``__init__``, that loads a name from the package's ``__init__`` (``import pkg``, ``from pkg import x``
    or ``from . import x`` where ``x`` is not one of its modules): a module below the package reaching
    up into it."""
    package = package_dir.name
    modules = {p.stem for p in package_dir.glob("*.py")} | {p.name for p in package_dir.iterdir()
                                                            if (p / "__init__.py").exists()}
    found = []
    for path in sorted(package_dir.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name == package]
            elif isinstance(node, ast.ImportFrom) and ((node.level == 1 and not node.module)
                                                       or (not node.level and node.module == package)):
                names = [a.name for a in node.names if a.name not in modules]
            found += [f"{path.name}:{node.lineno} {name}" for name in names]
    return found


def test_adapter_modules_do_not_import_their_own_package():
    """A module of an adapter imports the modules beside it, never its package's ``__init__`` (what the
    package builds from them): TensorFlow's ``_array`` imported ``unigrad_tensorflow`` for its public
    namespace and ``_backend`` ``from . import namespace``, both inside functions, hiding a circle from
    the import checks. The public namespace is now built in ``_array``, one floor down."""
    for relative in HONEST_ADAPTERS:
        package_dir = ROOT.parent / relative
        if package_dir.is_dir():
            assert not package_root_imports(package_dir), (relative, package_root_imports(package_dir))


def test_the_package_root_check_catches_an_import_of_the_package(tmp_path):
    package_dir = tmp_path / "unigrad_example"
    package_dir.mkdir()
    (package_dir / "__init__.py").write_text("from ._a import A\nNAMESPACE = object()\n")
    (package_dir / "_a.py").write_text("A = 1\n\ndef late():\n    from . import NAMESPACE\n    return NAMESPACE\n")
    (package_dir / "_b.py").write_text("def later():\n    import unigrad_example\n    from . import _a\n")
    assert package_root_imports(package_dir) == ["_a.py:4 NAMESPACE", "_b.py:2 unigrad_example"]
