"""unigrad's pytest plugin is loaded into every pytest run of an environment where unigrad is installed
(the ``pytest11`` entry point): another project's tests must run as if it were not there. Here a foreign
test file with its own ``backend`` fixture and its own ``@pytest.mark.parametrize("backend", ...)`` runs in
a fresh pytest process (``pytester.runpytest_subprocess``: what the outer run imported hides nothing):
it passes untouched, and no framework is imported. The same file with the project opted in
(``unigrad_fixtures = true``) gets the short-named fixtures, and the prefixed ones work without opting in.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

FOREIGN = '''
import sys

import pytest


@pytest.fixture
def backend():
    return "mine"


@pytest.fixture
def device():
    return "abacus"


def test_own_fixture(backend, device):
    assert (backend, device) == ("mine", "abacus")


@pytest.mark.parametrize("backend", ["a", "b"])
def test_own_parametrization(backend):
    assert backend in ("a", "b")


def test_no_framework_was_imported():
    assert not {"torch", "jax", "tensorflow"} & set(sys.modules), sorted({"torch", "jax", "tensorflow"} & set(sys.modules))
'''

PREFIXED = '''
import sys


def test_prefixed(unigrad_backend):
    assert isinstance(unigrad_backend, str)


def test_nothing_loaded_at_collection():
    # collected and run after test_prefixed[numpy] only: the numpy backend imports no framework
    assert not {"torch", "jax", "tensorflow"} & set(sys.modules)
'''

OPTED_IN = '''
def test_short_names(backend, device):
    assert isinstance(backend, str) and device == "cpu"
'''


def test_a_foreign_suite_runs_untouched_and_imports_no_framework(pytester):
    pytester.makepyfile(test_foreign=FOREIGN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=4)


def test_the_prefixed_fixtures_need_no_opting_in(pytester):
    pytester.makepyfile(test_prefixed=PREFIXED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--unigrad-backends=numpy")
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("how", ["ini", "option", "plugin"])
def test_a_project_that_opts_in_gets_the_short_names(pytester, how):
    pytester.makepyfile(test_opted=OPTED_IN)
    args = ["-p", "no:cacheprovider", "-q", "-k", "numpy"]  # (one backend run: loading the others takes long)
    if how == "ini":
        pytester.makeini("[pytest]\nunigrad_fixtures = true\n")
    elif how == "option":
        args.append("--unigrad-backends=numpy")
    else:
        args += ["-p", "unigrad.testing.pytest_fixtures"]
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=1)


def test_without_opting_in_the_short_names_are_not_there(pytester):
    pytester.makepyfile(test_opted=OPTED_IN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'backend' not found*"])
