"""Audit: per-example fast paths against materialised per-example Jacobians, on programs built to
fool the proofs (writes through views on torch, values overwritten after a layer read them)."""

from __future__ import annotations

import numpy as np
import pytest

import unigrad

torch = pytest.importorskip("torch")

B, D, H = 6, 4, 3


def _params():
    rng = np.random.default_rng(1)
    return ({"W": torch.tensor(rng.standard_normal((D, H))), "b": torch.tensor(rng.standard_normal(H)),
             "s": torch.tensor(rng.standard_normal(H))}, torch.tensor(rng.standard_normal((B, D))))


# Each writes into the layer's output through a view, moving one row's value into another's:
# the rows of the losses are NOT independent of the layer's rows.
def row_added_through_select(p, x):
    h = x @ p["W"] + p["b"]
    v = h[0]
    v.add_(h[1])
    return (h * h).sum(1)


def rows_shifted_by_setitem(p, x):
    h = x @ p["W"] + p["b"]
    h[1:] = h[:-1].clone()
    return (h * h).sum(1)


def row_written_through_transpose(p, x):
    h = x @ p["W"] + p["b"]
    ht = h.t()
    ht[:, 0] += ht[:, 1]
    return (h ** 2).sum(1)


def row_written_through_view_of_view(p, x):
    h = (x @ p["W"]) * p["s"]
    g = h.view(B, H)
    g[2] = g[3]
    return (h * h).sum(1)


def losses_written_through_select(p, x):
    h = x @ p["W"] + p["b"]
    losses = (h * h).sum(1)
    losses[0] = losses[1]
    return losses


def clone_written_with_another_row(p, x):
    h = x @ p["W"] + p["b"]
    h2 = h.clone()
    h2[0] += h[1]
    return (h2 ** 2).sum(1)


WRITES = [row_added_through_select, rows_shifted_by_setitem, row_written_through_transpose,
          row_written_through_view_of_view, losses_written_through_select, clone_written_with_another_row]


def _reference_rows(f, params, x):
    """Row i: torch's own Jacobian of loss i (an oracle with no unigrad in it)."""
    names = list(params)
    rows = []
    for i in range(B):
        def loss_i(*values):
            return f(dict(zip(names, values)), x.clone())[i]
        rows.append(torch.autograd.functional.jacobian(loss_i, tuple(v.clone() for v in params.values())))
    return {k: torch.stack([r[j] for r in rows]).numpy() for j, k in enumerate(names)}


@pytest.mark.parametrize("f", WRITES, ids=lambda f: f.__name__)
def test_torch_per_example_grad_with_a_write_through_a_view(f):
    params, x = _params()
    want = _reference_rows(f, params, x)
    got = unigrad.per_example_grad(f, backend="torch")({k: v.clone() for k, v in params.items()}, x.clone())
    for k in want:
        np.testing.assert_allclose(got[k].detach().numpy(), want[k], atol=1e-10, err_msg=k)
    norms = unigrad.per_example_grad_norms(f, backend="torch")({k: v.clone() for k, v in params.items()}, x.clone())
    want_norms = np.sqrt(sum(np.sum(v.reshape(B, -1) ** 2, 1) for v in want.values()))
    np.testing.assert_allclose(norms.detach().numpy(), want_norms, rtol=1e-10)


def test_torch_per_example_grad_keeps_in_place_writes_without_views_fast():
    """The fix must not give up on a write nothing else sees (``h += b`` after the layer)."""
    params, x = _params()

    def f(p, x):
        h = x @ p["W"] + p["b"]
        h.mul_(2.0)  # h's one reader is this write
        return (torch.tanh(h) ** 2).sum(1)

    def same(p, x):
        h = 2.0 * (x @ p["W"] + p["b"])
        return (torch.tanh(h) ** 2).sum(1)

    pe = unigrad.per_example_grad(f, backend="torch")
    got = pe(params, x)
    want = _reference_rows(same, params, x)
    for k in want:
        np.testing.assert_allclose(got[k].detach().numpy(), want[k], atol=1e-10, err_msg=k)


def test_torch_per_example_grad_layer_input_overwritten_after_the_layer():
    """X of ``X @ W`` overwritten in place after the product: X_i^T G_i would read the new X (torch's
    own backward refuses this f); unigrad must not return the fast path's number."""
    params, x = _params()

    def f(p, x):
        a = x.clone()
        h = a @ p["W"] + p["b"]
        a.mul_(2.0)
        return (h * h).sum(1) + a.sum(1)

    def same(p, x):
        a = x.clone()
        h = a @ p["W"] + p["b"]
        return (h * h).sum(1) + (2.0 * a).sum(1)

    want = _reference_rows(same, params, x)
    try:
        got = unigrad.per_example_grad(f, backend="torch")(params, x)
    except RuntimeError as exc:  # torch's "modified by an inplace operation", as torch.func gives
        assert "inplace" in str(exc)
        return
    for k in want:
        np.testing.assert_allclose(got[k].detach().numpy(), want[k], atol=1e-10, err_msg=k)


def _bj_writes():
    def select_add(x):
        h = x * 2.0
        v = h[0]
        v.add_(h[1])
        return h

    def shifted(x):
        h = x.sin()
        h[1:] = h[:-1].clone()
        return h

    def through_transpose(x):
        h = x.sin()
        h.t()[:, 0] += 1.0 * h.t()[:, 1]
        return h

    def clone_then_write(x):
        h = x.sin()
        h2 = h.clone()
        h2[0] += h[1]
        return h2
    return [select_add, shifted, through_transpose, clone_then_write]


@pytest.mark.parametrize("f", _bj_writes(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("check", ["once", "always"])
def test_torch_batched_jacobian_with_a_write_through_a_view_raises(f, check):
    """make_fx's graph gives views their old identities: a proof over its edges alone said "rows
    independent" and the sum trick returned wrong blocks, silently, on every check setting."""
    x = torch.tensor(np.random.default_rng(0).standard_normal((5, 3)))
    with pytest.raises(ValueError, match="not independent"):
        unigrad.batched_jacobian(f, backend="torch", check_independence=check)(x.clone())


def test_torch_batched_jacobian_write_through_a_view_within_rows():
    """A write through a view that keeps rows apart: right blocks (proved or probed)."""
    x = torch.tensor(np.random.default_rng(0).standard_normal((5, 3)))

    def f(x):
        h = x.sin()
        h[:, 0] *= 2.0
        return h

    got = unigrad.batched_jacobian(f, backend="torch")(x.clone()).numpy()
    scale = np.array([2.0, 1.0, 1.0])
    want = np.stack([np.diag(np.cos(r) * scale) for r in x.numpy()])
    np.testing.assert_allclose(got, want, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Custom derivative rules: the proofs read f's forward program, the derivative is the rule's
# ---------------------------------------------------------------------------------------------

def _smear_vjp():
    @unigrad.custom_vjp
    def smear(h):
        return h * 1.0

    def bwd(res, g):  # a rule that combines rows the forward pass keeps apart
        return (g + unigrad.namespace(g).sum(g, axis=0, keepdims=True),)

    smear.defvjp(lambda h: (h * 1.0, None), bwd)
    return smear


def _smear_jvp():
    @unigrad.custom_jvp
    def smear(h):
        return h * 1.0

    @smear.defjvp
    def rule(primals, tangents):
        (h,), (t,) = primals, tangents
        return h * 1.0, t + unigrad.namespace(t).sum(t, axis=0, keepdims=True)

    return smear


@pytest.mark.parametrize("kind", ["vjp", "jvp"])
@pytest.mark.parametrize("name", ["numpy", "torch", "jax"])  # (where fast paths read programs)
def test_per_example_grad_through_a_custom_rule_that_mixes_rows(name, kind):
    backend = name
    pytest.importorskip(backend)
    smear = _smear_vjp() if kind == "vjp" else _smear_jvp()

    def loss(p, x):
        xp = unigrad.namespace(p["W"], x)
        return xp.sum(xp.sin(smear(x @ p["W"] + p["b"])), axis=1)

    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    x = rng.standard_normal((4, 3))
    pb = {k: unigrad.asarray(v, backend=backend) for k, v in params.items()}
    xb = unigrad.asarray(x, backend=backend)
    full = unigrad.jacobian(loss, backend=backend)(pb, xb)  # (4, *param): row i is example i's gradient
    got = unigrad.per_example_grad(loss, backend=backend)(pb, xb)
    for k in params:
        np.testing.assert_allclose(unigrad.to_numpy(got[k]), unigrad.to_numpy(full[k]), atol=1e-10, err_msg=k)
    norms = unigrad.per_example_grad_norms(loss, backend=backend)(pb, xb)
    want = np.sqrt(sum(np.sum(unigrad.to_numpy(full[k]).reshape(4, -1) ** 2, 1) for k in params))
    np.testing.assert_allclose(unigrad.to_numpy(norms), want, rtol=1e-10)


@pytest.mark.parametrize("kind", ["vjp", "jvp"])
@pytest.mark.parametrize("name", ["numpy", "torch", "jax"])  # (where rows are proved from programs)
def test_batched_jacobian_through_a_custom_rule_that_mixes_rows_raises(name, kind):
    backend = name
    pytest.importorskip(backend)
    smear = _smear_vjp() if kind == "vjp" else _smear_jvp()

    def f(x):
        return unigrad.namespace(x).sin(smear(x))

    x = unigrad.asarray(np.random.default_rng(0).standard_normal((4, 2)), backend=backend)
    with pytest.raises(ValueError, match="not independent"):
        unigrad.batched_jacobian(f, backend=backend)(x)


def _jax_native_smear():
    jax = pytest.importorskip("jax")

    @jax.custom_jvp
    def smear(h):
        return h

    smear.defjvp(lambda p, t: (p[0], t[0] + t[0].sum(0, keepdims=True)))
    return jax, smear


def test_sparse_jacobian_of_a_native_jax_custom_jvp_rule():
    jax, smear = _jax_native_smear()

    def f(x):
        return jax.numpy.sin(smear(x))

    x = jax.numpy.asarray(np.random.default_rng(0).standard_normal((4, 2)))
    dense = np.asarray(unigrad.jacobian(f, backend="jax")(x)).reshape(8, 8)
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        sparse = np.asarray(unigrad.sparse_jacobian(f, backend="jax", format="dense")(x)).reshape(8, 8)
    np.testing.assert_allclose(sparse, dense, atol=1e-12)


def test_batched_jacobian_of_a_native_jax_custom_rule_that_mixes_rows_raises():
    jax, smear = _jax_native_smear()
    x = jax.numpy.asarray(np.random.default_rng(0).standard_normal((4, 2)))
    with pytest.raises(ValueError, match="not independent"):
        unigrad.batched_jacobian(lambda x: jax.numpy.sin(smear(x)), backend="jax")(x)


def test_tape_per_example_grad_with_a_checkpointed_block():
    """A parameter whose one use is a unigrad.checkpoint block: the tape's dense-layer search met the
    block's tape entry (no dtype) and raised AttributeError; now that parameter is materialised."""
    rng = np.random.default_rng(0)

    def loss(p, x):
        xp = unigrad.namespace(p["W"], x)
        h = unigrad.checkpoint(lambda a, b: xp.tanh(a @ b))(x, p["W"])
        return xp.sum((h @ p["V"]) ** 2, axis=1)

    params = {"W": rng.standard_normal((3, 4)), "V": rng.standard_normal((4, 2))}
    x = rng.standard_normal((5, 3))
    full = unigrad.jacobian(loss)(params, x)
    got = unigrad.per_example_grad(loss)(params, x)
    for k in params:
        np.testing.assert_allclose(got[k], full[k], atol=1e-12, err_msg=k)
    norms = unigrad.per_example_grad_norms(loss)(params, x)
    np.testing.assert_allclose(norms, np.sqrt(sum(np.sum(full[k].reshape(5, -1) ** 2, 1) for k in params)))
