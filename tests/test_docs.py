"""The documentation: the site builds with warnings as errors, every page is in it, the API
reference covers every public name, and the code in the docstrings and in the pages runs."""

from __future__ import annotations

import contextvars
import doctest
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import unigrad
import unigrad.testing

from conftest import requires, skip_unless

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"


def test_the_site_builds_strictly(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        skip_unless(module)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(MKDOCS),
                             "--site-dir", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("unigrad.batched_jacobian", "unigrad.testing.compare", "unigrad.per_example_grad"):
        assert name in api  # the reference was generated from the docstrings, not left empty
    assert "unigrad.Backend" in (tmp_path / "site" / "api-backend" / "index.html").read_text()
    assert (tmp_path / "site" / "performance" / "index.html").is_file()
    _check_examples_render_as_code(api)
    _check_search_ranks_the_public_api_first(tmp_path / "site" / "search" / "search_index.json")


def _check_examples_render_as_code(api_html):
    """The docstrings' ``Example:`` doctests are code blocks, one line per ``>>>`` line (not a
    paragraph that runs the lines together)."""
    start = api_html.index('id="unigrad.vjp"')
    vjp = api_html[start:api_html.index('id="unigrad.jvp"')]
    code = re.search(r"<pre>(.*?)</pre>", vjp, flags=re.S)
    assert code, "unigrad.vjp's example is not rendered as a code block"
    lines = [line for line in re.sub(r"<[^>]+>", "", code.group(1)).splitlines() if line.strip()]
    assert lines[0].startswith("&gt;&gt;&gt; out, vjp_fn = unigrad.vjp(") and len(lines) == 3, lines
    assert "<blockquote>" not in vjp


def _check_search_ranks_the_public_api_first(index_path):
    """Searching "batched_jacobian" should find unigrad.batched_jacobian before the plugin contract's
    Backend.batched_jacobian: the API page's search boost is above the contract page's."""
    import json

    index = json.loads(index_path.read_text())
    boosts = {d["location"]: d.get("boost", 1) for d in index["docs"]}
    public, contract = boosts["api/#unigrad.batched_jacobian"], boosts["api-backend/#unigrad.Backend.batched_jacobian"]
    assert public > 1 > contract, (public, contract)
    # The page's search splits words with the index's separator (a JavaScript pattern this one is also
    # a Python pattern for): the query must be one of the words of the entry's title, not a piece of
    # "unigrad.batched_jacobian(f:"
    separator = re.compile(index["config"]["separator"])

    def words(text):
        return {w.lower() for w in separator.split(re.sub(r"<[^>]+>", " ", text)) if w}

    title = next(d["title"] for d in index["docs"] if d["location"] == "api/#unigrad.batched_jacobian")
    assert words("batched_jacobian") == {"batched_jacobian"}
    assert {"batched_jacobian", "unigrad", "argnums"} <= words(title), sorted(words(title))[:20]


def _nav_pages():
    return re.findall(r":\s*([\w-]+\.md)\s*$", MKDOCS.read_text(), flags=re.M)


def test_every_page_is_in_the_navigation():
    pages = _nav_pages()
    assert sorted(pages) == sorted(p.name for p in DOCS.glob("*.md")), "docs/*.md and mkdocs.yml's nav differ"
    for required in ("getting-started.md", "backends.md", "portable-functions.md", "transforms.md",
                     "validation.md", "conventions.md", "performance.md", "devices.md", "plugins.md", "design.md",
                     "api.md", "examples.md"):
        assert required in pages


def test_the_api_reference_covers_every_public_name():
    text = (DOCS / "api.md").read_text() + (DOCS / "api-backend.md").read_text()
    documented = set(re.findall(r"^::: ([\w.]+)", text, flags=re.M))
    for name in unigrad.__all__:
        assert f"unigrad.{name}" in documented, f"docs/api.md lacks ::: unigrad.{name}"
    for name in unigrad.testing.__all__:
        assert f"unigrad.testing.{name}" in documented, f"docs/api.md lacks ::: unigrad.testing.{name}"


def test_the_benchmark_plots_are_committed_and_shown():
    text = (DOCS / "performance.md").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    assert len(pictures) >= 2
    for picture in pictures:
        data = (DOCS / picture).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, picture


# ------------------------------------------------------------------ docstring examples

def _public_modules():
    """Every module of the unigrad package (docstring examples live beside the code they show)."""
    names = ["unigrad"]
    for info in pkgutil.walk_packages(unigrad.__path__, "unigrad."):
        if info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def _doctests(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(module, module_name, extraglobs={"np": np, "unigrad": unigrad}) if t.examples]


# modules whose examples use an optional extra: skipped where it is missing (tests/conftest.py, one rule)
EXAMPLES_NEED = {"unigrad.dask": ("dask", "dask.array"), "unigrad.testing.strategies": ("hypothesis",),
                 "unigrad.testing.fuzz": ("hypothesis",)}


@pytest.mark.parametrize("module_name", [pytest.param(m, marks=requires(*EXAMPLES_NEED[m])) if m in EXAMPLES_NEED
                                         else m for m in _public_modules()])
def test_docstring_examples_run(module_name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures = []
    for test in _doctests(module_name):
        out = []
        # each in a copy of the current context: an example that calls set_backend / use_backend /
        # use_device (context variables) leaves nothing behind for the tests that follow
        result = contextvars.copy_context().run(runner.run, test, out=out.append)
        if result.failed:
            failures.append("".join(out))
    assert not failures, "\n".join(failures)


def test_the_docstrings_have_examples_to_run():
    # the doctest test above must not pass by finding nothing: the transforms' examples are there
    names = {t.name for m in _public_modules() for t in _doctests(m)}
    for public in ("grad", "vjp", "jvp", "jacobian", "batched_jacobian", "hessian", "hvp", "evaluate"):
        where = f"{getattr(unigrad, public).__module__}.{public}"
        assert where in names, f"unigrad.{public} has no docstring example"


# ------------------------------------------------------------------ code on the pages

PAGES_WITH_CODE = ["index.md", "getting-started.md", "backends.md", "portable-functions.md", "transforms.md",
                   "devices.md", "custom-derivatives.md", "sparse.md", "riemannian.md", "implicit.md"]


@pytest.mark.parametrize("page", PAGES_WITH_CODE)
def test_the_pages_python_runs(page, capsys):
    text = (DOCS / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{page} has no Python to run"
    code = "\n".join(blocks)
    for framework in ("torch", "jax", "tensorflow"):
        if f'backend="{framework}"' in code:
            skip_unless(framework)
    exec(compile(code, str(DOCS / page), "exec"), {"__name__": f"docs_{page[:-3]}"})


# ------------------------------------------------------------------ what the plugin guide and the models page claim

def test_registering_a_class_under_a_second_name_names_the_new_backend():
    """docs/plugins.md's example, line by line: each ``expression  # "value"`` holds."""
    pytest.importorskip("unigrad_autograd")
    from unigrad_autograd import AutogradBackend

    text = (DOCS / "plugins.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "hips2" in b)
    unigrad.register_backend("hips2", AutogradBackend)
    try:
        claims = re.findall(r"^(\S.*?)\s+#\s*\"(\w+)\"", block, flags=re.M)
        assert len(claims) == 3
        for expression, value in claims:
            assert eval(expression, {"unigrad": unigrad, "AutogradBackend": AutogradBackend}) == value, expression
    finally:
        unigrad.unregister_backend("hips2")


def test_the_models_page_shows_the_tested_example():
    """Every Python block of docs/models.md is an excerpt of examples/using_models.py (which
    tests/test_examples.py runs), so the page cannot drift from code that works."""
    import textwrap

    example = (ROOT / "examples" / "using_models.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "models.md").read_text(), flags=re.S)
    assert len(blocks) >= 10
    for block in blocks:
        assert block in example or textwrap.dedent(block) in example, block


def _contract_rows():
    """The members of backend.py's contract table, each with its status (``required``/``optional``)."""
    doc = importlib.import_module("unigrad.backend").__doc__
    table = doc[doc.index("The whole contract, one table"):]
    rows = {}
    for line in table.splitlines():
        match = re.match(r"^(``.+?``(?:.*?``.+?``)*)\s+(required|optional)(?:\s|$)", line)
        if match:
            for name in re.findall(r"``(\w+)", match.group(1)):
                rows[name] = match.group(2)
    return rows


def test_the_plugin_guide_and_the_contract_agree():
    """docs/plugins.md's "Required" table names exactly the members backend.py's table calls required
    (the abstract methods, the name and the array modules), and names every optional member somewhere."""
    rows = _contract_rows()
    required = {name for name, status in rows.items() if status == "required"}
    assert set(unigrad.Backend.__abstractmethods__) <= required
    assert set(unigrad.Backend.__abstractmethods__) | {"name", "array_modules"} == required, required
    guide = (DOCS / "plugins.md").read_text()
    block = guide[guide.index("Required:"):guide.index("Keep the `has_aux=False` defaults")]
    first_cells = re.findall(r"^\| (`[^|]+)\|", block, flags=re.M)  # "`to_numpy(x)`, `is_array(x)` "
    in_guide = {name for cell in first_cells for name in re.findall(r"`(\w+)", cell)}
    assert in_guide == required, (sorted(in_guide), sorted(required))
    missing = sorted(name for name in rows if f"`{name}" not in guide)
    assert not missing, f"docs/plugins.md never names {missing}"
    assert "unigrad._custom" not in guide  # the contract's types are public: unigrad.backend.Rule
