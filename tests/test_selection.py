"""Backend discovery, registration and selection; threads; exceptions; a light import."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import unigrad
from unigrad import _registry
from unigrad.tape import NumpyBackend
from unigrad.testing._threads import assert_threads_exact


class Tagged(NumpyBackend):
    """The tape under another name, so tests can see which backend ran."""

    calls: list

    def __init__(self, tag):
        self.name = tag
        self.calls = []

    def vjp(self, f, primals, *, has_aux=False):
        self.calls.append("vjp")
        return super().vjp(f, primals, has_aux=has_aux)

    def value_and_grad(self, f, primals, *, has_aux=False, check=None):
        self.calls.append("value_and_grad")
        return super().value_and_grad(f, primals, has_aux=has_aux, check=check)


@pytest.fixture
def tagged():
    made = {}
    for tag in ("alpha", "beta", "gamma", "delta"):
        made[tag] = Tagged(tag)
        unigrad.register_backend(tag, lambda b=made[tag]: b)
    yield made
    for tag in made:
        unigrad.unregister_backend(tag)


def used(tagged):
    return [t for t, b in tagged.items() if b.calls]


def run_grad(**kwargs):
    return unigrad.grad(lambda x: (x ** 2).sum(), **kwargs)(np.ones(2))


def test_selection_precedence(tagged, monkeypatch):
    monkeypatch.setenv("UNIGRAD_BACKEND", "delta")
    unigrad.set_backend("gamma")
    try:
        with unigrad.use_backend("beta"):
            run_grad(backend="alpha")
            assert used(tagged) == ["alpha"]
            tagged["alpha"].calls.clear()
            run_grad()
            assert used(tagged) == ["beta"]
            tagged["beta"].calls.clear()
        run_grad()
        assert used(tagged) == ["gamma"]
        tagged["gamma"].calls.clear()
    finally:
        unigrad.set_backend(None)
    run_grad()
    assert used(tagged) == ["delta"]
    tagged["delta"].calls.clear()
    monkeypatch.delenv("UNIGRAD_BACKEND")
    run_grad()
    assert used(tagged) == []  # the default numpy backend


def test_use_backend_is_restored_after_an_exception(tagged):
    with pytest.raises(RuntimeError):
        with unigrad.use_backend("alpha"):
            raise RuntimeError("boom")
    assert _registry.current_backend_name() == os.environ.get("UNIGRAD_BACKEND", "numpy")


def test_use_backend_is_per_thread_and_per_task(tagged):
    seen = {}
    barrier = threading.Barrier(2)

    def worker(tag):
        with unigrad.use_backend(tag):
            barrier.wait()
            seen[tag] = _registry.current_backend_name()

    threads = [threading.Thread(target=worker, args=(t,)) for t in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"alpha": "alpha", "beta": "beta"}

    async def task(tag):
        with unigrad.use_backend(tag):
            await asyncio.sleep(0.01)
            return _registry.current_backend_name()

    async def main():
        return await asyncio.gather(task("gamma"), task("delta"))

    assert asyncio.run(main()) == ["gamma", "delta"]


def test_register_backend_rules(tagged):
    with pytest.raises(ValueError, match="already registered"):
        unigrad.register_backend("alpha", lambda: Tagged("alpha"))
    with pytest.raises(TypeError, match="callable"):
        unigrad.register_backend("zeta", 3)
    unigrad.register_backend("zeta", lambda: "not a backend")
    try:
        with pytest.raises(TypeError, match="not a unigrad.Backend"):
            unigrad.get_backend("zeta")
    finally:
        unigrad.unregister_backend("zeta")


def test_a_broken_plugin_does_not_break_the_others():
    def broken():
        raise ImportError("No module named 'missing_framework'")

    unigrad.register_backend("broken", broken)
    try:
        with pytest.raises(ImportError, match="could not be loaded.*missing_framework"):
            unigrad.get_backend("broken")
        report = unigrad.backends()
        assert report["broken"]["available"] is False and "missing_framework" in report["broken"]["error"]
        assert report["numpy"]["available"] is True
        np.testing.assert_allclose(run_grad(), 2.0)
    finally:
        unigrad.unregister_backend("broken")


def test_backends_report_lists_without_loading_and_loads_when_asked():
    names = unigrad.backends()
    assert "numpy" in names and names["numpy"]["available"] is True
    full = unigrad.backends(load=True)
    assert full["numpy"]["loaded"] and full["numpy"]["devices"] == ["cpu"]
    assert full["numpy"]["capabilities"]["higher_order"]


def test_listing_backends_imports_no_framework():
    """unigrad.backends() lists what is installed from the packages' presence and metadata: no framework is
    imported (it took seconds when it loaded every backend), and a framework that is installed is listed
    available with its version."""
    import importlib.util
    import json
    import subprocess
    import sys

    code = ("import json, sys, unigrad; r = unigrad.backends(); "
            "print(json.dumps({'loaded': [m for m in ('torch', 'jax', 'tensorflow', 'autograd') if m in sys.modules], "
            "'report': r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["loaded"] == []
    for name in ("torch", "jax", "tensorflow"):
        if name in got["report"]:
            installed = importlib.util.find_spec(name) is not None
            assert got["report"][name]["available"] is installed
            assert got["report"][name]["loaded"] is False
            if installed:
                assert got["report"][name]["version"], got["report"][name]


def test_a_backend_whose_package_is_missing_is_listed_unavailable(monkeypatch):
    from unigrad import _registry

    monkeypatch.setitem(_registry._FRAMEWORK_MODULES, "torch", ("torch", "no_such_module_for_unigrad"))
    monkeypatch.delitem(_registry._instances, "torch", raising=False)
    report = unigrad.backends()
    if "torch" in report:
        assert report["torch"]["available"] is False and "no_such_module_for_unigrad" in report["torch"]["error"]


def test_backend_inferred_from_inputs_and_mixing_rejected():
    class ArrayA:
        pass

    class ArrayB:
        pass

    ArrayA.__module__, ArrayB.__module__ = "fake_a.core", "fake_b"

    class OwnsA(Tagged):
        array_modules = ("fake_a",)

        def __init__(self):
            super().__init__("owns_a")

    class OwnsB(Tagged):
        array_modules = ("fake_b",)

        def __init__(self):
            super().__init__("owns_b")

    unigrad.register_backend("owns_a", OwnsA)
    unigrad.register_backend("owns_b", OwnsB)
    try:
        assert _registry.resolve(None, [np.ones(2), ArrayA()]).name == "owns_a"
        assert _registry.resolve(None, [ArrayB(), 1.0]).name == "owns_b"
        assert _registry.resolve("numpy", [ArrayA()]).name == "numpy"  # explicit wins
        with pytest.raises(TypeError, match="inputs mix arrays of backends 'owns_a' and 'owns_b'"):
            _registry.resolve(None, [ArrayA(), ArrayB()])
    finally:
        unigrad.unregister_backend("owns_a")
        unigrad.unregister_backend("owns_b")


def test_threads_give_exact_results():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((6, 3)) for _ in range(8)]
    w = rng.standard_normal((3, 2))

    def f(x):
        xp = unigrad.namespace(x)
        return xp.sum(xp.tanh(x @ w) ** 2)

    def work(x):
        return (unigrad.grad(f)(x), unigrad.hessian(lambda x: f(x))(x[:2]),
                unigrad.jacobian(lambda x: x @ w, mode="fwd")(x))

    assert_threads_exact(work, xs, repeats=5)


def test_an_exception_inside_f_leaves_no_state():
    from unigrad.tape import _core

    def bad(x):
        y = x * 2
        raise KeyError("inside f")

    for transform in (unigrad.grad, unigrad.jacfwd, unigrad.hessian):
        with pytest.raises(KeyError):
            transform(bad)(np.ones(2))
        assert _core._depth.get() == 0
        assert _registry.active_backend.get() is None
    with pytest.raises(KeyError):
        unigrad.jvp(bad, (np.ones(2),), (np.ones(2),))
    assert _core._depth.get() == 0
    np.testing.assert_allclose(run_grad(), 2.0)


def test_import_unigrad_imports_no_framework():
    code = ("import sys, numpy as np, unigrad; unigrad.grad(lambda x: (x ** 2).sum())(np.ones(2)); "
            "unigrad.backends(load=False); "
            "print(sorted(m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "UNIGRAD_BACKEND": ""})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_thread_harness_catches_shared_state():
    import itertools

    counter = itertools.count()  # shared between threads: results depend on scheduling
    with pytest.raises(AssertionError):
        assert_threads_exact(lambda x: np.array(float(next(counter))) * x, [np.ones(2)] * 4)
    def only_in_the_main_thread(x):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("not thread-safe")
        return x

    with pytest.raises(AssertionError, match="raised in threads"):
        assert_threads_exact(only_in_the_main_thread, [np.ones(2)] * 2)


def test_inferring_a_torch_array_loads_no_plugin():
    """A torch tensor's backend is found among the first-party adapters before any third-party plugin is loaded
    (the HIPS autograd plugin imported autograd on a torch user's first call)."""
    import subprocess
    import sys

    code = ("import sys, torch, unigrad; from unigrad import _registry; eps = _registry._discover(); "
            "assert 'autograd' in eps, 'no plugin'; "
            "_registry._entry_points = dict(sorted(eps.items(), key=lambda kv: kv[0] != 'autograd')); "  # plugin first
            "print(_registry._array_owner(torch.ones(2)), 'autograd' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if "No module named 'torch'" in done.stderr or "no plugin" in done.stderr:
        pytest.skip("needs torch and the autograd plugin installed")
    assert done.stdout.split() == ["torch", "False"], done.stderr
