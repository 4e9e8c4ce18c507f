"""The test suite's own set-up (tests/conftest.py): the hypothesis seed, the pinned example counts, and
the one rule for optional extras -- on a machine without them, each test that needs one is listed as
skipped with its reason, and the tests of the same modules that do not need it still run."""

from __future__ import annotations

import datetime
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import conftest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_hypothesis_seed_is_the_date_unless_given():
    today = int(datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d"))
    assert conftest.hypothesis_seed({}) in (today, today + 1)  # (a run that crosses midnight)
    assert conftest.hypothesis_seed({"UNIGRAD_HYPOTHESIS_SEED": "12345"}) == 12345
    if "UNIGRAD_HYPOTHESIS_SEED" not in os.environ:
        assert conftest.HYPOTHESIS_SEED // 10000 >= 2026  # a date, not a constant


def test_thorough_profile_raises_every_pinned_count(monkeypatch):
    monkeypatch.setattr(conftest, "PROFILE", "ci")
    assert conftest.examples(4, thorough=200) == 4
    monkeypatch.setattr(conftest, "PROFILE", "thorough")
    assert conftest.examples(4, thorough=200) == 200
    assert conftest.examples(5) == 500  # the thorough profile's own count
    assert conftest.examples(1000, thorough=200) == 1000  # never fewer than the default


def _configured(monkeypatch, profile, args):
    """conftest's pytest_configure on a stand-in config (``args``: the command line); returns the options."""
    import types

    monkeypatch.setattr(conftest, "PROFILE", profile)
    option = types.SimpleNamespace(hypothesis_seed="7", unigrad_programs=100)
    conftest.pytest_configure(types.SimpleNamespace(option=option,
                                                    invocation_params=types.SimpleNamespace(args=tuple(args))))
    return option


def test_ci_runs_fewer_conformance_programs_unless_told(monkeypatch):
    assert _configured(monkeypatch, "ci", ["tests"]).unigrad_programs == conftest.CONFORMANCE_PROGRAMS < 100
    assert _configured(monkeypatch, "ci", ["--unigrad-programs=100"]).unigrad_programs == 100
    assert _configured(monkeypatch, "thorough", ["tests"]).unigrad_programs == 100


def test_slow_cases_of_a_module_get_the_slow_marker():
    import types

    class Item:
        def __init__(self, name, module):
            self.name, self.module, self.markers = name, module, []

        def add_marker(self, marker):
            self.markers.append(marker.name)

    module = types.SimpleNamespace(SLOW_CASES={"test_a[jax-compiled]"})
    items = [Item("test_a[jax-compiled]", module), Item("test_a[jax-eager]", module),
             Item("test_a[jax-compiled]", types.SimpleNamespace())]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.markers for item in items] == [["slow"], [], []]


def _pytest(*args, env=None, prelude=""):
    code = prelude + "import sys, pytest\nsys.exit(pytest.main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})),
                          capture_output=True, text=True, timeout=600)


def test_the_seed_is_in_the_header_and_seeds_hypothesis():
    result = _pytest("tests/test_tape_structure.py", "--collect-only", env={"UNIGRAD_HYPOTHESIS_SEED": "4242"},
                     prelude="import hypothesis.core as core\nimport atexit\n"
                             "atexit.register(lambda: print('forced seed', core.global_force_seed))\n")
    assert "hypothesis profile 'ci', seed 4242 (replay with UNIGRAD_HYPOTHESIS_SEED=4242" in result.stdout, result.stdout
    assert "forced seed 4242" in result.stdout, result.stdout[-2000:]


BLOCK_EXTRAS = '''
import importlib.abc, sys
BLOCKED = {"dask", "distributed", "cloudpickle", "array_api_strict"}


class NotInstalled(importlib.abc.MetaPathFinder):  # as if the optional extras were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
'''


def test_without_the_optional_extras_each_skipped_test_says_why(tmp_path):
    report = tmp_path / "report.xml"
    result = _pytest("tests/test_dask.py", "tests/test_tape_namespace.py", "tests/test_docs.py", "-k",
                     "not test_docs or docstring_examples_run and dask", "-rs", f"--junitxml={report}",
                     prelude=BLOCK_EXTRAS)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    cases = {}  # test id -> None (passed) or the skip reason
    for case in ET.parse(report).getroot().iter("testcase"):
        skip = case.find("skipped")
        cases[f"{case.get('classname')}::{case.get('name')}"] = None if skip is None else skip.get("message")
    skipped = {name: why for name, why in cases.items() if why is not None}
    dask_reason = "needs dask, dask.array, distributed, cloudpickle, not installed (pip install 'unigrad[dask]')"
    strict_reason = "needs array_api_strict, not installed (pip install 'unigrad[test]')"
    for name, why in skipped.items():  # every skip, one per test, with the reason naming the extra
        assert dask_reason in why or strict_reason in why or "needs dask, dask.array, not installed" in why, (name, why)
    assert any("test_docstring_examples_run[unigrad.dask]" in name for name in skipped), sorted(cases)
    assert sum("test_dask" in name for name in skipped) >= 7, sorted(skipped)
    assert sum("test_tape_namespace" in name for name in skipped) >= 30, sorted(skipped)
    for name in ("test_imports_are_lazy", "test_traced_fill_values_and_endpoints_keep_their_derivative",
                 "test_namespace_info"):  # the tests that need no extra still run
        assert any(name in n and why is None for n, why in cases.items()), (name, sorted(cases))
