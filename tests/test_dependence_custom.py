"""JAX's custom derivative rules (``jax.custom_jvp``, ``jax.custom_vjp``) in the dependence analysis.

Derivatives come from the rule, not from the primal program: a rule that combines elements the primal
keeps apart must show in the patterns (``jacobian_sparsity``, ``sparse_jacobian``, ``hessian_sparsity``)
and in the row proof (``batched_jacobian`` raises for rows the rule mixes). A ``custom_jvp`` is read
through its JVP program (exact for ``jax.nn.relu``, ``softplus``, ``logaddexp``...); a ``custom_vjp``'s
Python bwd cannot be read: dense with a reason, rows decided by the probe (run in reverse mode, since a
custom_vjp function has no forward mode).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import unigrad
from unigrad import _batched
from unigrad.dependence import SparsityWarning, prove_rows

jax = pytest.importorskip("jax")
jnp = jax.numpy

from unigrad_jax._dependence import from_closed_jaxpr  # noqa: E402


@jax.custom_jvp
def smear(h):
    return h * 1.0


smear.defjvp(lambda p, t: (p[0] * 1.0, t[0] + t[0].sum(0, keepdims=True)))  # the rule mixes rows


@jax.custom_vjp
def smear_vjp(h):
    return h * 1.0


smear_vjp.defvjp(lambda h: (h * 1.0, None), lambda _, g: (g + g.sum(0, keepdims=True),))


@jax.custom_vjp
def clip_grad(h):
    return h * 1.0


clip_grad.defvjp(lambda h: (h * 1.0, None), lambda _, g: (jnp.clip(g, -0.5, 0.5),))  # rows kept apart


@jax.custom_jvp
def scaled(h):
    return h * h


scaled.defjvp(lambda p, t: (p[0] * p[0], t[0] * smear(p[0]) * 2.0))  # a coefficient whose derivative mixes


@jax.custom_jvp
def batch_scaled(h):
    return h * 1.0


batch_scaled.defjvp(lambda p, t: (p[0] * 1.0, t[0] * p[0].shape[0]))  # the rule reads the batch size


def safe_log(x):
    return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0)


W = np.random.default_rng(3).standard_normal((3, 3))
X = np.random.default_rng(0).standard_normal((4, 3))

MIXING = {
    "custom_jvp": (lambda x: jnp.sin(smear(x)), "auto"),
    "custom_vjp": (lambda x: jnp.sin(smear_vjp(x)), "rev"),
}
PROVED = {  # JAX's own custom_jvp functions (in this JAX version) and where-based safe functions
    "relu": lambda x: jax.nn.relu(x) * 2.0,
    "softplus": jax.nn.softplus,
    "logaddexp": lambda x: jnp.logaddexp(x, 2.0 * x),
    "safe_log_of_relu": lambda x: safe_log(jax.nn.relu(x)) + jax.nn.silu(x),
    "mlp": lambda x: jax.nn.log_softmax(jax.nn.softplus(jax.nn.relu(x @ W) @ W), axis=-1),
}


def _support(f, x, mode, points=3):
    rng = np.random.default_rng(1)
    jac = jax.jit(jax.jacrev(f) if mode == "rev" else jax.jacfwd(f))
    n = x.size
    out = np.zeros((int(np.prod(jax.eval_shape(f, x).shape)), n), dtype=bool)
    for p in [x] + [rng.standard_normal(x.shape) for _ in range(points - 1)]:
        out |= np.asarray(jac(jnp.asarray(p))).reshape(-1, n) != 0
    return out


def _pattern(f, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pat = unigrad.jacobian_sparsity(f, jnp.asarray(x))
    return np.asarray(pat.toarray()).astype(bool), [str(w.message) for w in caught
                                                    if issubclass(w.category, SparsityWarning)]


@pytest.mark.parametrize("name", sorted(MIXING))
def test_a_rule_that_mixes_elements_shows_in_the_pattern_and_sparse_jacobian(name):
    f, mode = MIXING[name]
    got, reasons = _pattern(f, X)
    truth = _support(f, jnp.asarray(X), mode)
    assert not (truth & ~got).any(), f"non-zeros outside the pattern at {np.argwhere(truth & ~got)[:3]}"
    if name == "custom_vjp":
        assert any("bwd rule" in r for r in reasons), reasons
    x = jnp.asarray(X)
    dense = np.asarray(unigrad.jacobian(f, backend="jax")(x))
    for compile in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SparsityWarning)
            sparse = unigrad.sparse_jacobian(f, backend="jax", format="dense", mode=mode, compile=compile)(x)
        np.testing.assert_allclose(np.asarray(sparse), dense.reshape(12, 12), atol=1e-12)


@pytest.mark.parametrize("name", sorted(MIXING))
def test_batched_jacobian_of_a_rule_that_mixes_rows_raises(name):
    f, _ = MIXING[name]
    for compile in (False, True):
        with pytest.raises(ValueError, match="not independent"):
            unigrad.batched_jacobian(f, backend="jax", compile=compile)(jnp.asarray(X))


def test_the_row_proof_names_the_rule_or_gives_up():
    mixed = prove_rows(from_closed_jaxpr(jax.make_jaxpr(MIXING["custom_jvp"][0])(X)), 4)
    assert mixed[0] == "mixed" and "reduce_sum over the batch axis" in mixed[1].describe()
    unknown = prove_rows(from_closed_jaxpr(jax.make_jaxpr(MIXING["custom_vjp"][0])(X)), 4)
    assert unknown[0] == "unknown" and "bwd rule" in unknown[1]


def test_a_custom_vjp_with_rows_apart_is_probed_in_reverse_and_right(monkeypatch):
    """No forward mode for a custom_vjp: the probe runs as a VJP; the blocks are the dense Jacobian's."""
    probed = []
    original = _batched._probe_reverse
    monkeypatch.setattr(_batched, "_probe_reverse", lambda *a: probed.append(1) or original(*a))

    def f(x):
        return jnp.sin(clip_grad(x * x))

    x = jnp.asarray(X)
    dense = np.asarray(jax.jacrev(f)(x))
    want = np.stack([dense[i, :, i, :] for i in range(4)])
    for compile in (False, True):
        got = np.asarray(unigrad.batched_jacobian(f, backend="jax", compile=compile)(x))
        np.testing.assert_allclose(got, want, atol=1e-12)
    assert probed


def test_a_rule_reading_the_batch_size_is_not_computed_one_row_at_a_time():
    """Proved ROW (a scale per element) but the rule reads x.shape[0]: one row alone would get 1."""
    def f(x):
        return jnp.sin(batch_scaled(x))

    x = jnp.asarray(X)
    dense = np.asarray(unigrad.jacobian(f, backend="jax")(x))
    want = np.stack([dense[i, :, i, :] for i in range(4)])
    for compile in (False, True):
        got = np.asarray(unigrad.batched_jacobian(f, backend="jax", compile=compile)(x))
        np.testing.assert_allclose(got, want, atol=1e-12)


def _no_probe(*args, **kwargs):
    raise AssertionError("the probe ran on a proved path")


@pytest.mark.parametrize("name", sorted(PROVED))
def test_common_custom_rules_stay_exact_and_proved(name, monkeypatch):
    f = PROVED[name]
    got, reasons = _pattern(f, X)
    truth = _support(f, jnp.asarray(X), "fwd", points=4)
    np.testing.assert_array_equal(got, truth)
    assert reasons == []
    monkeypatch.setattr(_batched, "_settle_independence", _no_probe)
    x = jnp.asarray(X)
    got = np.asarray(unigrad.batched_jacobian(f, backend="jax")(x))
    np.testing.assert_allclose(got, np.asarray(jax.vmap(jax.jacrev(f))(x)), rtol=1e-6, atol=1e-12)


HESSIANS = {
    "mixing_rule": lambda x: jnp.sum(jnp.sin(smear(x))),
    # the rule's coefficient smear(x) enters the second derivative through its own (mixing) rule
    "rule_calling_a_mixing_rule": lambda x: jnp.sum(scaled(x)),
    "relu_squared": lambda x: jnp.sum(jax.nn.relu(x) ** 2 * x[::-1]),
    "softplus": lambda x: jnp.sum(jax.nn.softplus(x) * x),
}


@pytest.mark.parametrize("name", sorted(HESSIANS))
def test_hessian_patterns_through_custom_rules(name):
    f = HESSIANS[name]
    x = np.random.default_rng(2).standard_normal(6)
    got = np.asarray(unigrad.hessian_sparsity(f, jnp.asarray(x)).toarray()).astype(bool)
    hess = jax.jit(jax.hessian(f))
    truth = np.zeros_like(got)
    for p in [x] + [np.random.default_rng(s).standard_normal(6) for s in range(2)]:
        truth |= np.asarray(hess(jnp.asarray(p))) != 0
    np.testing.assert_array_equal(got, truth)


def test_per_example_grad_through_a_rule_that_mixes_rows():
    """The per-example path proves rows from the loss's jaxpr: a mixing rule must stop the proof (the
    primal alone kept rows apart: per-example gradients were off by up to 14.6)."""
    rng = np.random.default_rng(0)
    params = {"W": jnp.asarray(rng.standard_normal((3, 4))), "V": jnp.asarray(rng.standard_normal((4, 2)))}
    x = jnp.asarray(rng.standard_normal((5, 3)))

    def loss(p, x):
        return jnp.sum((smear(jnp.tanh(x @ p["W"])) @ p["V"]) ** 2, axis=1)

    full = jax.jacrev(loss)(params, x)
    for compile in (False, True):
        got = unigrad.per_example_grad(loss, backend="jax", compile=compile)(params, x)
        for k in params:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(full[k]), rtol=1e-5, atol=1e-5, err_msg=k)
