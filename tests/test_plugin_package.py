"""The worked third-party plugin (plugins/unigrad_autograd): it installs as its own package, its
entry point registers the backend, and it passes the whole conformance suite in a fresh process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import skip_module_unless

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugins" / "unigrad_autograd"

skip_module_unless("autograd")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The plugin installed (not editable, no dependencies) into a scratch directory, as pip would
    install it anywhere: only its own pyproject.toml says what it is and where its entry point is."""
    import importlib.util

    target = tmp_path_factory.mktemp("site")
    # with setuptools at hand, build offline with it; otherwise (a Python 3.12+ venv has none) let pip
    # fetch the build backend the plugin's pyproject.toml names
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *offline,
                             "--target", str(target), str(PLUGIN)],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.fail(f"pip could not install the plugin package:\n{result.stdout}\n{result.stderr}")
    return target


def _env(site):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # the scratch install first: the copy pip made is the one under test
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def test_the_entry_point_registers_the_backend_by_its_name(installed):
    code = ("import numpy as np, unigrad, unigrad_autograd; "
            "info = unigrad.backends()['autograd']; assert info['available'], info; "
            "b = unigrad.get_backend('autograd'); assert b.name == 'autograd'; "
            "assert unigrad_autograd.__file__.startswith(%r), unigrad_autograd.__file__; "
            "g = unigrad.grad(lambda x: unigrad.namespace(x).sum(unigrad.namespace(x).sin(x) ** 2), "
            "backend='autograd')(np.array([0.1, 0.2, 0.3])); "
            "np.testing.assert_allclose(g, np.sin(2 * np.array([0.1, 0.2, 0.3])), rtol=1e-14); print('ok')"
            % str(installed))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(installed), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_the_plugin_passes_the_conformance_suite(installed, tmp_path):
    # What a plugin author runs (docs/plugins.md), in a fresh process, from a directory with no
    # conftest of this project's: only unigrad's pytest plugin and the installed packages.
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
                             "unigrad.testing.conformance", "--unigrad-backends=autograd"],
                            cwd=tmp_path, env=_env(installed), capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) >= 20, output  # the suite ran, not skipped away
    assert " failed" not in output and " error" not in output, output


def test_the_guide_quotes_the_plugins_code_as_it_is():
    # docs/plugins.md walks through the plugin: the lines it shows must be the plugin's own
    guide = (ROOT / "docs" / "plugins.md").read_text()
    source = (PLUGIN / "unigrad_autograd" / "__init__.py").read_text()
    block = guide.split("class AutogradBackend(unigrad.Backend):", 1)[1].split("```", 1)[0]
    for line in block.splitlines():
        if line.strip():
            assert line in source, f"docs/plugins.md shows a line the plugin does not have: {line!r}"
    toml = (PLUGIN / "pyproject.toml").read_text()
    assert 'autograd = "unigrad_autograd:AutogradBackend"' in toml and 'autograd = "unigrad_autograd:AutogradBackend"' in guide
