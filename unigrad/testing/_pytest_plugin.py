"""unigrad's pytest plugin: ``--unigrad-backends``, ``--unigrad-devices``, and the ``backend``,
``device`` and ``unigrad_backends`` fixtures.

Registered through the ``pytest11`` entry point, so any project that installs
unigrad can parametrise its tests over every installed backend::

    def test_my_gradient(backend):
        g = unigrad.grad(loss, backend=backend)(w)

or compare all of them in one test (``unigrad_backends`` is the list of selected, loadable
backends; session-scoped, so it works with hypothesis' ``@given``)::

    def test_agree(unigrad_backends):
        unigrad.testing.assert_backends_agree(loss, (w,), backends=unigrad_backends)

Devices: ``--unigrad-devices=cuda`` (or ``cpu,cuda``, ``cuda:1``, ``all``) runs every test that takes the
``backend`` fixture -- the conformance suite included -- once per device, inside
``unigrad.use_device(device)`` so that every transform places its inputs there; a backend without that
device is skipped with the reason. Tests of one framework mark their module
``pytestmark = pytest.mark.unigrad_backend("torch")`` to be run on the devices too. With the default
(``cpu``) nothing is parametrised and no device is set.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("unigrad")
    group.addoption("--unigrad-backends", default="all",
                    help="comma-separated backend names for the `backend` fixture, or 'all' installed (default)")
    group.addoption("--unigrad-conformance", default="fast", choices=("fast", "full"),
                    help="per-op conformance checks: 'fast' (default: finite differences on the NumPy tape, the "
                         "backend against the tape to rounding, all cases of an op in one call; a case that "
                         "differs is re-run in full) or 'full' (every case compared with finite differences "
                         "of the backend's own function too)")
    group.addoption("--unigrad-programs", default=100, type=int,
                    help="random programs the conformance suite compares on each backend (default 100)")
    group.addoption("--unigrad-devices", default="cpu",
                    help="comma-separated devices to run the backend tests on (and for the `device` fixture): "
                         "cpu (default), cuda, cuda:N, gpu, or 'all' (cpu,cuda); a backend without the device "
                         "is skipped with the reason")


def pytest_configure(config):
    config.addinivalue_line("markers", "unigrad_backend(name): the module's tests drive this backend; they run on "
                                       "each device --unigrad-devices names (skipped where it has none)")


def _selected_backends(config):
    from unigrad import backends as installed

    wanted = config.getoption("--unigrad-backends")
    if wanted == "all":
        return [name for name, info in installed().items() if info["available"]]
    return [w.strip() for w in wanted.split(",") if w.strip()]


def _selected_devices(config):
    wanted = config.getoption("--unigrad-devices")
    if wanted == "all":
        return ["cpu", "cuda"]
    return [w.strip() for w in wanted.split(",") if w.strip()]


def pytest_generate_tests(metafunc):
    if "backend" in metafunc.fixturenames:
        names = _selected_backends(metafunc.config)
        metafunc.parametrize("backend", names, ids=names, indirect=True)
    if "device" in metafunc.fixturenames:
        devices = _selected_devices(metafunc.config)
        metafunc.parametrize("device", devices, ids=devices, indirect=True)
    elif ("backend" in metafunc.fixturenames or metafunc.definition.get_closest_marker("unigrad_backend")) \
            and _selected_devices(metafunc.config) != ["cpu"]:
        devices = _selected_devices(metafunc.config)
        metafunc.parametrize("unigrad_device", devices, ids=devices, indirect=True)


def _has_device(b, device: str) -> bool:
    """Whether backend ``b`` lists ``device``: "cuda"/"gpu" any GPU, "cuda:1" that one."""
    kind, _, index = str(device).partition(":")
    names = [str(d) for d in b.devices()]
    if kind == "cpu":
        return True
    if kind in ("cuda", "gpu"):
        gpus = [d for d in names if d.split(":")[0] in ("cuda", "gpu")]
        return bool(gpus) if not index else any(d.partition(":")[2] == index for d in gpus)
    return str(device) in names


@pytest.fixture(autouse=True)
def unigrad_device(request):
    """The device of this test (None: no device set, the default). Parametrised over ``--unigrad-devices``
    for tests taking the ``backend`` fixture or marked ``unigrad_backend(name)``: the test runs inside
    ``unigrad.use_device(device)``, or is skipped where its backend has no such device."""
    device = getattr(request, "param", None)
    if device is None:
        yield None
        return
    import unigrad

    marker = request.node.get_closest_marker("unigrad_backend")
    name = request.getfixturevalue("backend") if "backend" in request.fixturenames else marker.args[0]
    try:
        b = unigrad.get_backend(name)
    except Exception as exc:  # noqa: BLE001 -- the backend fixture (or the module) reports a load failure
        pytest.skip(f"backend {name!r} unavailable: {exc}")
    if not _has_device(b, device):
        pytest.skip(f"backend {b.name!r} has no device {device!r} here (its devices: {', '.join(map(str, b.devices()))})")
    with unigrad.use_device(device):
        yield device


def _explicit(config) -> bool:
    """Whether the backends were named on the command line (not ``all`` installed)."""
    return config.getoption("--unigrad-backends") != "all"


def _load_failure(name, exc) -> str:
    return (f"backend {name!r} was asked for with --unigrad-backends but does not load: {type(exc).__name__}: {exc}. "
            f"Check the name (`unigrad info` lists the installed backends) and that its package imports.")


@pytest.fixture
def backend(request):
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
