"""How libraries call unigrad (issue 37): transforms built inline on every call and nested, on torch and
the tape, and torch's per-example Jacobian of a model whose weights ``f`` closes over. Each test checks
the result against an independent truth (a closed form, ``torch.func`` nested by hand, the dense
Jacobian on the tape) and the work that must not be done (an evaluation of ``f`` for its shapes, a copy
of the basis rows, an answer check on a proved path), so that none can pass by doing less.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import skip_module_unless

torch = skip_module_unless("torch")

import unigrad  # noqa: E402
import unigrad_torch  # noqa: E402


def immersion(u):
    """The unit sphere's parametrisation, R^2 -> R^3 (portable)."""
    xp = unigrad.namespace(u)
    a, b = u[0], u[1]
    return xp.stack([xp.sin(a) * xp.cos(b), xp.sin(a) * xp.sin(b), xp.cos(a)])


def immersion_jacobian(u):
    """Its Jacobian in closed form."""
    a, b = u
    return np.array([[np.cos(a) * np.cos(b), -np.sin(a) * np.sin(b)],
                     [np.cos(a) * np.sin(b), np.sin(a) * np.cos(b)],
                     [-np.sin(a), 0.0]])


def counted(f, calls):
    def g(*args):
        calls.append(1)
        return f(*args)
    return g


@pytest.mark.parametrize("backend", ["torch", "autograd", "numpy"])
def test_an_inline_jacobian_evaluates_f_no_more_than_its_mode_needs(backend):
    """``jacobian(f)(x)`` built on every call meets its signature for the first time on every call: its
    shapes come from the evaluation the chosen mode makes anyway (torch: reverse mode's VJP; the autograd
    plugin: forward mode's plain evaluation, then one JVP per input element, looped), so ``f`` runs once
    for reverse and once plus once per input for a looped forward mode -- one evaluation fewer than
    before -- and the Jacobian is the closed form's; the same with ``has_aux``. (The tape has Jacobians
    of its own: ``mode="auto"`` evaluates ``f`` for its shapes there.)"""
    if backend == "autograd":
        pytest.importorskip("autograd")
    u = np.array([0.7, 0.3])
    x = unigrad.asarray(u, backend=backend)
    expected = {"torch": 1, "autograd": 3, "numpy": 1}[backend]
    calls = []
    for _ in range(2):
        del calls[:]
        jac = unigrad.jacobian(counted(immersion, calls), mode="rev" if backend == "numpy" else "auto",
                               backend=backend)(x)
        np.testing.assert_allclose(unigrad.to_numpy(jac), immersion_jacobian(u), rtol=1e-12)
        assert len(calls) == expected
    del calls[:]
    jac, aux = unigrad.jacobian(counted(lambda v: (immersion(v), {"n": 3}), calls), has_aux=True, backend=backend)(x)
    np.testing.assert_allclose(unigrad.to_numpy(jac), immersion_jacobian(u), rtol=1e-12)
    assert aux == {"n": 3}
    assert len(calls) == {"torch": 1, "autograd": 3, "numpy": 2}[backend]


def test_a_looped_forward_jacobian_evaluates_f_once_per_column():
    """On a backend without a vectorising vmap (the autograd plugin) forward mode loops one JVP per input
    element; the outputs and aux come from the first of them, with no plain evaluation besides: a reused
    transform runs ``f`` once per column, with one primal or two, with aux or without, and gives the
    closed form."""
    pytest.importorskip("autograd")
    u = np.array([0.7, 0.3])
    calls = []
    jac = unigrad.jacobian(counted(immersion, calls), backend="autograd", mode="fwd")
    for _ in range(2):
        del calls[:]
        np.testing.assert_allclose(jac(u), immersion_jacobian(u), rtol=1e-12)
        assert len(calls) == 2
    two = unigrad.jacobian(counted(lambda a, b: (immersion(unigrad.namespace(a).stack([a[0], b[0]])), {"k": 1}),
                                   calls), argnums=(0, 1), has_aux=True, backend="autograd", mode="fwd")
    for _ in range(2):
        del calls[:]
        (ja, jb), aux = two(u[:1], u[1:])
        np.testing.assert_allclose(np.concatenate([ja, jb], axis=1), immersion_jacobian(u), rtol=1e-12)
        assert aux == {"k": 1} and len(calls) == 2


def test_an_inline_jacobian_whose_forward_mode_raises_falls_back_to_reverse(monkeypatch):
    """On the autograd plugin a first call's forward mode runs from its plain evaluation; where the engine
    has no forward rule (here: every JVP raises, as HIPS autograd does for an operation without one), the
    call falls back to reverse mode and remembers the signature, as ``mode="auto"`` does everywhere."""
    pytest.importorskip("autograd")
    b = unigrad.get_backend("autograd")

    def no_forward(*args, **kwargs):
        raise NotImplementedError("no forward-mode rule")

    monkeypatch.setattr(type(b), "jvp", no_forward)
    u = np.array([0.7, 0.3])
    jac = unigrad.jacobian(immersion, backend="autograd")
    np.testing.assert_allclose(jac(u), immersion_jacobian(u), rtol=1e-12)
    np.testing.assert_allclose(jac(u), immersion_jacobian(u), rtol=1e-12)  # (the fallback remembered)
    with pytest.raises(NotImplementedError):
        unigrad.jacobian(immersion, backend="autograd", mode="fwd")(u)


def test_torch_auto_goes_forward_only_for_many_more_outputs(monkeypatch):
    """On torch ``mode="auto"`` goes forward only where the outputs have more than ``forward_ratio`` (2)
    times the inputs' elements: reverse for R^2 -> R^3 and R^2 -> R^4, forward for R^2 -> R^5; each
    Jacobian equals the one of the other mode."""
    assert unigrad.get_backend("torch").forward_ratio == 2
    modes = []
    real_fwd = unigrad_torch.TorchBackend.jacfwd
    monkeypatch.setattr(unigrad_torch.TorchBackend, "jacfwd",
                        lambda self, *a, **k: modes.append("fwd") or real_fwd(self, *a, **k))
    x = torch.tensor([0.7, 0.3], dtype=torch.float64)
    for m, want in ((3, []), (4, []), (5, ["fwd"])):
        del modes[:]
        f = lambda v, m=m: torch.sin(torch.arange(1.0, m + 1, dtype=v.dtype) * v[0]) * v[1]  # noqa: E731
        got = unigrad.jacobian(f)(x)
        assert modes == want, m
        other = unigrad.jacobian(f, mode="fwd" if not want else "rev")(x)
        torch.testing.assert_close(got, other, rtol=1e-12, atol=1e-14)


def test_a_nested_pullback_metric_derivative_matches_torch_func_and_the_tape():
    """The derivative of the pullback metric ``J(u).T @ J(u)`` with ``J = jacobian(immersion)``, both built
    inline: the same on torch as ``torch.func.jacrev`` nested by hand, and as the tape's (another engine)."""
    def metric(u):
        J = unigrad.jacobian(immersion)
        return J(u).T @ J(u)

    def derivative(u):
        return unigrad.jacobian(lambda v: metric(v))(u)

    u = np.array([0.7, 0.3])
    x = torch.tensor(u)
    got = derivative(x)
    native = torch.func.jacrev(lambda v: torch.func.jacrev(immersion)(v).T @ torch.func.jacrev(immersion)(v))(x)
    torch.testing.assert_close(got, native, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got.numpy(), derivative(u), rtol=1e-12, atol=1e-14)
    # the sphere's metric is diag(1, sin(a)^2): its one non-zero derivative is d/da sin(a)^2 = sin(2a)
    want = np.zeros((2, 2, 2))
    want[1, 1, 0] = np.sin(2 * u[0])
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)


def test_torch_jacobian_maps_its_basis_rows_without_copies(monkeypatch):
    """``map_chunks`` vmaps a pullback over basis rows of its own: torch's guard of ``vmap``'s arguments
    (a copy of each, for an ``f`` that writes into its input) is left out there (``vmap_rows``), while an
    ``f`` that writes into its argument still gets the right Jacobian in both modes and leaves the
    caller's tensor as it was."""
    copies = []
    real = unigrad_torch._on_copies
    monkeypatch.setattr(unigrad_torch, "_on_copies", lambda f: copies.append(f) or real(f))
    x = torch.tensor([0.7, 0.3], dtype=torch.float64)
    jac = unigrad.jacobian(immersion, mode="rev")(x)
    np.testing.assert_allclose(jac.numpy(), immersion_jacobian(x.numpy()), rtol=1e-12)
    assert copies == []

    def writes(v):
        v.mul_(2.0)
        return torch.sin(v)

    before = x.clone()
    for mode in ("rev", "fwd"):
        got = unigrad.jacobian(writes, mode=mode)(x)
        np.testing.assert_allclose(got.numpy(), np.diag(2 * np.cos(2 * before.numpy())), rtol=1e-12)
        torch.testing.assert_close(x, before)


def test_fresh_asks_no_wrapped_tensor_for_its_storage(monkeypatch):
    """``_fresh`` (results the caller owns) recognises a functorch wrapper without asking it for its
    storage (an error that costs about 20 us), and still copies a plain result that is the caller's own
    tensor (a pullback of the identity returns its cotangent)."""
    asked = []
    real = torch.Tensor.untyped_storage

    def spy(self):
        asked.append(torch._C._functorch.is_functorch_wrapped_tensor(self))
        return real(self)

    monkeypatch.setattr(torch.Tensor, "untyped_storage", spy)

    def inside(t):
        (out,) = unigrad_torch._fresh((t * 2,), (t,))
        return out

    torch.testing.assert_close(torch.func.vmap(inside)(torch.ones(3, 2)), torch.full((3, 2), 2.0))
    assert True not in asked
    _, vjp_fn = unigrad.vjp(lambda v: v, torch.ones(3))
    ct = torch.ones(3)
    (g,) = vjp_fn(ct)
    assert g is not ct and g.untyped_storage().data_ptr() != ct.untyped_storage().data_ptr()
    torch.testing.assert_close(g, ct)


def test_batched_jacobian_of_a_closure_mlp_takes_the_proved_path(monkeypatch):
    """torch ``batched_jacobian`` of an MLP whose weights ``f`` closes over (plain tensors, and parameters
    that require grad): its rows are proved independent, so the exact sum trick runs and no answer check
    (nor probe) is run; the blocks equal ``torch.func.vmap(jacrev(f))``'s."""
    from unigrad import _batched

    ran = []
    for name in ("checked_kernel", "probed_kernel"):
        real = getattr(_batched, name)
        monkeypatch.setattr(_batched, name, lambda *a, _real=real, _name=name, **k: ran.append(_name) or _real(*a, **k))
    gen = torch.Generator().manual_seed(0)
    w1, b1, w2 = torch.randn(6, 8, generator=gen), torch.randn(8, generator=gen), torch.randn(8, 3, generator=gen)
    p1, q1, p2 = (torch.nn.Parameter(t.clone()) for t in (w1, b1, w2))
    x = torch.randn(5, 6, generator=gen)
    for f in (lambda x: torch.tanh(torch.tanh(x @ w1 + b1) @ w2), lambda x: torch.tanh(torch.tanh(x @ p1 + q1) @ p2)):
        ours = unigrad.batched_jacobian(f)
        for _ in range(2):
            torch.testing.assert_close(ours(x), torch.func.vmap(torch.func.jacrev(f))(x).detach())
    assert ran == []
    # (the spies see a check where one runs: a shortcut's answer is checked -- in forward mode: in reverse mode a
    # proof over the program takes the exact sum trick even where the caller declared f separable)
    unigrad.batched_jacobian(lambda x: torch.tanh(x @ w1), separable=True)(x)
    assert ran == []
    unigrad.batched_jacobian(lambda x: torch.tanh(x @ w1), separable=True, mode="fwd")(x)
    assert ran


def test_transforms_built_on_every_call_leave_nothing_behind():
    """A transform built inline on every call keeps its caches to itself: once dropped, nothing holds it
    (no per-call work can grow with the number of transforms a library has built)."""
    import gc
    import weakref

    x = torch.tensor([0.7, 0.3], dtype=torch.float64)
    refs = []
    for _ in range(20):
        J = unigrad.jacobian(immersion)
        np.testing.assert_allclose(J(x).numpy(), immersion_jacobian(x.numpy()), rtol=1e-12)
        refs.append(weakref.ref(J))
    del J
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_the_callers_grad_mode_costs_no_context_outside_inference_mode(monkeypatch):
    """Every torch VJP, pullback and JVP keeps the caller's grad mode; outside inference mode that needs
    no ``inference_mode(False)`` context (a few microseconds each, several per nested call), and under the
    caller's inference mode or ``no_grad`` the Jacobian is still the closed form's, with no graph."""
    entered = []
    real = torch.inference_mode
    monkeypatch.setattr(torch, "inference_mode", lambda *a, **k: entered.append(a) or real(*a, **k))
    x = torch.tensor([0.7, 0.3], dtype=torch.float64)
    want = immersion_jacobian(x.numpy())
    for mode in ("rev", "fwd"):
        np.testing.assert_allclose(unigrad.jacobian(immersion, mode=mode)(x).numpy(), want, rtol=1e-12)
    assert entered == []
    for outer in (real, torch.no_grad):
        with outer():
            for mode in ("rev", "fwd"):
                jac = unigrad.jacobian(immersion, mode=mode)(x.clone())
                assert jac.grad_fn is None and not jac.requires_grad
                np.testing.assert_allclose(jac.numpy(), want, rtol=1e-12)
        assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert entered  # (under inference mode the context is entered: the spy sees it)
