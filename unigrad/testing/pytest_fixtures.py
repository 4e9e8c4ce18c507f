"""The short-named fixtures of unigrad's pytest plugin, for projects that opt in (see
:mod:`unigrad.testing._pytest_plugin`): ``backend`` (one test per selected backend: the
``unigrad_backend`` fixture under its short name), ``device`` (one test per ``--unigrad-devices`` device;
the test places its inputs itself), and every test of a backend run on each device named, inside
``unigrad.use_device``.

Loaded by the plugin itself where the project sets ``unigrad_fixtures = true`` or passes
``--unigrad-backends`` / ``--unigrad-devices``; or by the project: ``-p unigrad.testing.pytest_fixtures``,
``pytest_plugins = ["unigrad.testing.pytest_fixtures"]`` in its root conftest.py.
"""

from __future__ import annotations

import pytest

from ._pytest_common import _has_device, _selected_devices


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        devices = _selected_devices(metafunc.config)
        metafunc.parametrize("device", devices, ids=devices, indirect=True)


@pytest.fixture
def backend(unigrad_backend):
    """A backend name, parametrised over ``--unigrad-backends`` (``unigrad_backend`` under its short name)."""
    return unigrad_backend


@pytest.fixture(autouse=True)
def _unigrad_on_device(unigrad_device):
    """Every test of a backend (it takes ``backend`` or is marked ``unigrad_backend(name)``) runs on each
    device ``--unigrad-devices`` names, inside ``unigrad.use_device`` (see ``unigrad_device``)."""
    return unigrad_device


@pytest.fixture
def device(request):
    """A device string, parametrised over ``--unigrad-devices``; skipped cleanly where the backend under
    test (the ``backend`` fixture) has no such device. The test places its inputs itself."""
    name = request.param
    if name != "cpu" and "backend" in request.fixturenames:
        import unigrad

        b = unigrad.get_backend(request.getfixturevalue("backend"))
        if not _has_device(b, name):
            pytest.skip(f"backend {b.name!r} has no device {name!r} here (its devices: {', '.join(map(str, b.devices()))})")
    return name
