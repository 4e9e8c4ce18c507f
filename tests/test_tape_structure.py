"""The tape's modules form layers: no import cycle, no import hidden below definitions or inside a
function to break one (issue 10)."""

from __future__ import annotations

import ast
import pathlib

import unigrad.tape

TAPE = pathlib.Path(unigrad.tape.__file__).parent


def _imports(path):
    """(the tape modules ``path`` imports, the line numbers of imports not at the top)."""
    tree = ast.parse(path.read_text())
    found, late = set(), []
    body_started = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found.update(n.split(".")[0] for n in names)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if body_started and (isinstance(node, ast.ImportFrom) and node.level == 1):
                late.append(node.lineno)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            body_started = True
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            late += [n.lineno for n in ast.walk(fn) if isinstance(n, ast.ImportFrom) and n.level == 1]
    return found, late


def test_tape_modules_have_no_import_cycle_and_import_at_the_top():
    graph = {}
    for path in TAPE.glob("*.py"):
        deps, late = _imports(path)
        assert late == [], f"{path.name}: imports of tape modules below the top or inside functions at lines {late}"
        graph[path.stem] = {d for d in deps if (TAPE / f"{d}.py").exists()}
    done, visiting = set(), []

    def visit(m):
        assert m not in visiting, f"import cycle: {' -> '.join(visiting[visiting.index(m):] + [m])}"
        if m in done:
            return
        visiting.append(m)
        for d in graph.get(m, ()):
            visit(d)
        visiting.pop()
        done.add(m)
    for m in graph:
        visit(m)
