"""unigrad is typed for the libraries that build on it (PEP 561): the package ships ``py.typed``, and a client
of the public API (``unigrad``, ``unigrad.testing``, ``unigrad.backend``) written as a library would, with its
own annotations under ``mypy --strict``, type-checks against the signatures unigrad ships
(``tests/typed_client.py``), while calls that are wrong by them are rejected (``tests/typed_client_error.py``:
the check can fail). mypy's settings: ``tests/mypy_client.ini`` (unigrad and NumPy read for their signatures,
the frameworks unigrad imports inside functions skipped: a few seconds, not minutes). By hand::

    python -m mypy --config-file tests/mypy_client.ini tests/typed_client.py
"""

from __future__ import annotations

import pathlib
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")


def _mypy(path, cache):
    """mypy's exit status and report on ``path``, run from the repository root (where ``unigrad`` is found)."""
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(TESTS / "mypy_client.ini"),
                           "--cache-dir", str(cache), "--no-error-summary", str(path.relative_to(ROOT))],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_the_package_ships_its_py_typed_marker():
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11 on)
    assert (ROOT / "unigrad" / "py.typed").is_file()
    with open(ROOT / "pyproject.toml", "rb") as fh:
        config = tomllib.load(fh)
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["unigrad"]  # installed with the package
    assert any(r.startswith("mypy") for r in config["project"]["optional-dependencies"]["test"])


def test_a_typed_client_passes_mypy_and_wrong_calls_fail(tmp_path):
    status, report = _mypy(TESTS / "typed_client.py", tmp_path)
    assert status == 0 and report.strip() == "", report
    status, report = _mypy(TESTS / "typed_client_error.py", tmp_path)  # (the cache of the first run: seconds)
    assert status == 1, report
    errors = [line for line in report.splitlines() if ": error:" in line]
    expected = ['Argument "has_aux" to "grad" has incompatible type "str"; expected "bool"',
                'Argument "chunk_size" to "jacobian" has incompatible type "str"; expected "int | None"',
                'Argument "order" to "check_grads" has incompatible type "str"; expected "int"',
                'Unexpected keyword argument "argnum" for "value_and_grad"']
    assert len(errors) == len(expected), report
    for line, message in zip(errors, expected):
        assert message in line, report


def test_the_typed_client_runs():
    """The client is right as well as well typed: its own checks against closed forms and check_grads."""
    runpy.run_path(str(TESTS / "typed_client.py"), run_name="__main__")
