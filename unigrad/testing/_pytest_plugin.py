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
                    help="comma-separated devices for the `device` fixture: cpu, cuda, cuda:N, gpu, or 'all'")


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
    """A device string; GPU devices are skipped cleanly where the backend under test has none."""
    name = request.param
    if name != "cpu" and "backend" in request.fixturenames:
        import unigrad

        b = unigrad.get_backend(request.getfixturevalue("backend"))
        kinds = {d.split(":")[0] for d in b.devices()}
        if not ({"cuda", "gpu"} & kinds):
            pytest.skip(f"no GPU for backend {b.name!r}")
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
