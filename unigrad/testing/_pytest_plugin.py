"""unigrad's pytest plugin: inert in other projects' test runs unless they ask for it.

Installing unigrad registers this module through the ``pytest11`` entry point, so it is loaded into
every pytest run of the environment. A library must not change other projects' tests: by itself this
plugin adds only command-line options, one ini setting and fixtures whose names start with
``unigrad_``, and it imports no framework at collection. What it offers:

- ``unigrad_backend``: a backend name, one test per selected backend (``--unigrad-backends``, default all
  installed); a backend named explicitly that does not load fails the test, one merely installed is
  skipped with the reason. ``unigrad_backends`` (session scope): the list of them that load, for one test
  that compares them all (works with hypothesis' ``@given``).
- ``unigrad_device``: the device of the test, one test per device named by ``--unigrad-devices`` for tests
  that take ``unigrad_backend`` or are marked ``unigrad_backend(name)``, each inside
  ``unigrad.use_device(device)``; skipped where the backend has no such device.

A project that wants the short names -- ``backend`` and ``device`` fixtures, and every test of a backend
run on each device -- opts in, in any of three ways: the ini setting ``unigrad_fixtures = true``
(``[tool.pytest.ini_options]`` in pyproject.toml, or pytest.ini), passing ``--unigrad-backends`` or
``--unigrad-devices`` on the command line (the conformance suite's documented command does), or loading
``unigrad.testing.pytest_fixtures`` as a plugin (``-p unigrad.testing.pytest_fixtures``, or
``pytest_plugins = ["unigrad.testing.pytest_fixtures"]`` in a root conftest.py)::

    def test_my_gradient(backend):
        g = unigrad.grad(loss, backend=backend)(w)

    def test_agree(unigrad_backends):
        unigrad.testing.assert_backends_agree(loss, (w,), backends=unigrad_backends)
"""

from __future__ import annotations

import pytest

from ._pytest_common import _explicit, _has_device, _load_failure, _selected_backends, _selected_devices

_FIXTURES_PLUGIN = "unigrad-fixtures"


def pytest_addoption(parser):
    group = parser.getgroup("unigrad")
    group.addoption("--unigrad-backends", default=None,
                    help="comma-separated backend names for the unigrad_backend (and, opted in, backend) fixture, "
                         "or 'all' installed (the default); passing it opts in to the backend and device fixtures")
    group.addoption("--unigrad-conformance", default="fast", choices=("fast", "full"),
                    help="per-op conformance checks: 'fast' (default: finite differences on the NumPy tape, the "
                         "backend against the tape to rounding, all cases of an op in one call; a case that "
                         "differs is re-run in full) or 'full' (every case compared with finite differences "
                         "of the backend's own function too)")
    group.addoption("--unigrad-programs", default=100, type=int,
                    help="random programs the conformance suite compares on each backend (default 100)")
    group.addoption("--unigrad-devices", default=None,
                    help="comma-separated devices to run the backend tests on (and for the device fixture): "
                         "cpu (default), cuda, cuda:N, gpu, or 'all' (cpu,cuda); a backend without the device "
                         "is skipped with the reason; passing it opts in to the backend and device fixtures")
    parser.addini("unigrad_fixtures", type="bool", default=False,
                  help="unigrad: provide the `backend` and `device` fixtures (and run each backend's tests on "
                       "every --unigrad-devices device), not only the unigrad_-prefixed ones")


def pytest_configure(config):
    config.addinivalue_line("markers", "unigrad_backend(name): the module's tests drive this backend; they run on "
                                       "each device --unigrad-devices names (skipped where it has none)")
    if _opted_in(config):
        from . import pytest_fixtures

        if not config.pluginmanager.is_registered(pytest_fixtures):  # (or the project loaded it itself)
            config.pluginmanager.register(pytest_fixtures, _FIXTURES_PLUGIN)


def _opted_in(config) -> bool:
    """Whether the project asked for the short-named fixtures (see the module docstring)."""
    return bool(config.getini("unigrad_fixtures") or config.getoption("--unigrad-backends") is not None
                or config.getoption("--unigrad-devices") is not None)


def pytest_generate_tests(metafunc):
    if "unigrad_backend" in metafunc.fixturenames:
        names = _selected_backends(metafunc.config)
        metafunc.parametrize("unigrad_backend", names, ids=names, indirect=True)
    if "unigrad_device" in metafunc.fixturenames and _selected_devices(metafunc.config) != ["cpu"] and (
            "unigrad_backend" in metafunc.fixturenames or metafunc.definition.get_closest_marker("unigrad_backend")):
        devices = _selected_devices(metafunc.config)
        metafunc.parametrize("unigrad_device", devices, ids=devices, indirect=True)


@pytest.fixture
def unigrad_backend(request):
    """A backend name; parametrised over ``--unigrad-backends``.

    A backend named explicitly (``--unigrad-backends=mine``) that is unknown or fails to import FAILS each
    test with its error: a misspelt name must not pass as "all skipped". With the default ``all``, only
    installed backends are listed, and one that fails to load is skipped with the reason.
    """
    import unigrad

    name = request.param
    try:
        unigrad.get_backend(name)
    except Exception as exc:  # noqa: BLE001 -- any import error of a plugin is reported as is
        if _explicit(request.config):
            pytest.fail(_load_failure(name, exc), pytrace=False)
        pytest.skip(f"backend {name!r} unavailable: {exc}")
    return name


@pytest.fixture
def unigrad_device(request):
    """The device of this test (None: no device set, the default). Parametrised over ``--unigrad-devices``
    for tests taking ``unigrad_backend`` (or, opted in, ``backend``) or marked ``unigrad_backend(name)``: the
    test runs inside ``unigrad.use_device(device)``, or is skipped where its backend has no such device."""
    device = getattr(request, "param", None)
    if device is None:
        yield None
        return
    import unigrad

    marker = request.node.get_closest_marker("unigrad_backend")
    name = request.getfixturevalue("unigrad_backend") if "unigrad_backend" in request.fixturenames \
        else marker.args[0]
    try:
        b = unigrad.get_backend(name)
    except Exception as exc:  # noqa: BLE001 -- the backend fixture (or the module) reports a load failure
        pytest.skip(f"backend {name!r} unavailable: {exc}")
    if not _has_device(b, device):
        pytest.skip(f"backend {b.name!r} has no device {device!r} here (its devices: {', '.join(map(str, b.devices()))})")
    with unigrad.use_device(device):
        yield device


@pytest.fixture(scope="session")
def unigrad_backends(request):
    """The names of the backends selected by ``--unigrad-backends`` that load (with ``all``, others are left
    out; a backend named explicitly that does not load fails the test)."""
    import unigrad

    names = []
    for name in _selected_backends(request.config):
        try:
            unigrad.get_backend(name)
        except Exception as exc:  # noqa: BLE001
            if _explicit(request.config):
                pytest.fail(_load_failure(name, exc), pytrace=False)
            continue
        names.append(name)
    if not names:
        pytest.skip("no selected backend loads")
    return names
