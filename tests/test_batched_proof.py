"""batched_jacobian proves independent rows from the traced program instead of probing them.

The tape reads its recording of every call; JAX its jaxpr once per signature; torch and TensorFlow
read portable f on the tape. Proof MIXED raises on every call naming the operation and line; proof ROW
computes without a probe; only an operation without a row rule falls back to the probe.
"""

from __future__ import annotations

import numpy as np
import pytest

import unigrad
from unigrad import _batched
from unigrad.dependence import _rules

xp = unigrad.namespace
BACKENDS = [n for n in ("numpy", "torch", "jax", "tensorflow") if unigrad.backends().get(n, {}).get("available")]


def value_dependent(x):
    """Rows independent only while every entry is positive: a probe at positive data is fooled."""
    return xp(x).where(xp(x).min(x) > 0, x * x, x - xp(x).mean(x, axis=0))


@pytest.mark.parametrize("engine", BACKENDS)
def test_value_dependent_coupling_raises_on_every_call(engine):
    rng = np.random.default_rng(0)
    positive = rng.random((4, 3)) + 0.5
    for compile in (False, True):
        for mode in ("rev", "fwd"):
            jac = unigrad.batched_jacobian(value_dependent, mode=mode, backend=engine, compile=compile)
            for x in (positive, -positive, positive):  # first call with positive data, then negative
                with pytest.raises(ValueError, match=r"not independent: .*(sum|mean|Sum|Mean) over the batch axis at "
                                                     r".*test_batched_proof.py:\d+"):
                    jac(x)


def _blocks(f, x):
    """The per-example Jacobians as the diagonal blocks of the full Jacobian (NumPy tape)."""
    full = np.asarray(unigrad.jacobian(f)(x))
    return np.stack([full[b, ..., b, :] for b in range(x.shape[0])])


def batch_size(x):
    return xp(x).sin(x) / x.shape[0]


def reshaped_mean(x):  # a mean over a non-batch axis of a reshaped batch
    return xp(x).mean(xp(x).reshape(x * x, (x.shape[0], 2, x.shape[1] // 2)), axis=2) / x.shape[0]


@pytest.mark.parametrize("engine", BACKENDS)
@pytest.mark.parametrize("f", [batch_size, reshaped_mean], ids=["batch_size", "reshaped_mean"])
def test_f_using_the_batch_size_is_right(engine, f):
    x = np.random.default_rng(1).standard_normal((5, 4))
    want = _blocks(f, x)
    for compile in (False, True):
        jac = unigrad.batched_jacobian(f, backend=engine, compile=compile)
        jac(np.zeros_like(x))  # a warm-up call settles nothing that changes results
        np.testing.assert_allclose(unigrad.to_numpy(jac(x)), want, rtol=1e-6, atol=1e-12)


def _no_probe(*args, **kwargs):
    raise AssertionError("the probe ran on a proved path")


@pytest.mark.parametrize("engine", BACKENDS)
def test_proved_rows_run_no_probe(engine, monkeypatch):
    monkeypatch.setattr(_batched, "_settle_independence", _no_probe)
    rng = np.random.default_rng(2)
    w, x = rng.standard_normal((3, 2)), rng.standard_normal((6, 3))
    f = lambda x, w: xp(x).tanh(x @ w) * xp(x).sum(x, axis=1, keepdims=True)  # noqa: E731
    jac = unigrad.batched_jacobian(f, backend=engine, check_independence="always")
    got = unigrad.to_numpy(jac(x, w))
    np.testing.assert_allclose(got, _blocks(lambda x: f(x, w), x), rtol=1e-6, atol=1e-12)


def test_unknown_primitive_falls_back_to_the_probe(monkeypatch):
    """Without a row rule for tanh the proof gives up, and the probe decides (once per signature)."""
    monkeypatch.delitem(_rules.TABLE, "tanh")
    probes = []
    original = _batched._settle_independence
    monkeypatch.setattr(_batched, "_settle_independence", lambda *a, **k: probes.append(1) or original(*a, **k))
    x = np.random.default_rng(3).standard_normal((4, 3))
    jac = unigrad.batched_jacobian(lambda x: xp(x).tanh(x))
    jac(x), jac(x)
    assert probes == [1]
    with pytest.raises(ValueError, match="not independent"):  # the probe still refuses a coupling
        unigrad.batched_jacobian(lambda x: xp(x).tanh(x - xp(x).mean(x, axis=0)))(x)


def test_tape_proof_reads_the_recording_of_each_call():
    """Control flow on values: each call's own recording is proved (the coupled branch raises, the
    independent one does not), with no verdict kept from an earlier call."""
    def f(x):
        if xp(x).max(x) > 10:
            return x - xp(x).mean(x, axis=0)
        return x * 2.0

    jac = unigrad.batched_jacobian(f)
    small = np.ones((3, 2))
    np.testing.assert_allclose(jac(small), np.broadcast_to(2 * np.eye(2), (3, 2, 2)))
    with pytest.raises(ValueError, match="not independent"):
        jac(small * 20)
    np.testing.assert_allclose(jac(small), np.broadcast_to(2 * np.eye(2), (3, 2, 2)))


def test_output_with_the_batch_on_another_axis_is_refused():
    with pytest.raises(ValueError, match="output 0 has the batch on axis 1"):
        unigrad.batched_jacobian(lambda x: xp(x).reshape(x.T, (x.shape[0], x.shape[1])) * 1.0)(np.ones((3, 3)))


def test_jax_native_coupling_is_named_from_the_jaxpr():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.asarray(np.random.default_rng(4).standard_normal((4, 3)))
    jac = unigrad.batched_jacobian(lambda x: jnp.cumsum(x, axis=0), backend="jax", compile=True)
    for _ in range(2):
        with pytest.raises(ValueError, match="cumsum along the batch axis"):
            jac(x)


def test_native_torch_rows_proved_from_the_aten_graph(monkeypatch):
    """Native torch code (F.linear, log_softmax) cannot be read on the tape: its ATen graph (make_fx on
    fake tensors) proves it, without a probe: independent rows computed, mixed rows refused with the
    operation and the user's line."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(_batched, "_settle_independence", _no_probe)
    lin = torch.nn.Linear(3, 4).double()
    x = torch.randn(5, 3, dtype=torch.float64)

    def rows(x):
        return torch.log_softmax(torch.nn.functional.linear(torch.tanh(x), lin.weight, lin.bias), -1)

    def mixed(x):
        h = torch.nn.functional.linear(x, lin.weight, lin.bias)
        return h - h.mean(0)

    got = unigrad.batched_jacobian(rows)(x)
    want = torch.stack([torch.autograd.functional.jacobian(lambda r: rows(r[None])[0], x[i]) for i in range(5)])
    torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"not independent: mean over the batch axis at test_batched_proof.py:\d+ "
                                         r"\(in mixed\)"):
        unigrad.batched_jacobian(mixed)(x)
