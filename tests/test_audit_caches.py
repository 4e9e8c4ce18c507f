"""Audit: what transforms keep per signature (shapes and dtypes) must not hide what depends on values.

batched_jacobian's row proof (a jaxpr's constants, portable f on the tape) and its probe's verdict read
the values of the arrays f is given but not differentiated (an index array). Kept per signature, a
proof made with the identity permutation was reused for a reversing one: the sum trick's wrong blocks,
silently, on JAX and TensorFlow whatever check_independence said, and on torch with "once"."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import unigrad

B, D = 5, 3


def permuted(x, perm):
    xp = unigrad.namespace(x)
    return xp.sin(xp.take(x, perm, axis=0))


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("check", ["once", "always"])
def test_batched_jacobian_proof_follows_the_values_of_an_index_array(backend, compile, check):
    if check == "always" and backend not in ("jax", "tensorflow"):
        pytest.skip("'always' was wrong on JAX and TensorFlow only (the proof); 'once' covers the probe")
    x = unigrad.asarray(np.random.default_rng(0).standard_normal((B, D)), backend=backend)
    identity = unigrad.asarray(np.arange(B), backend=backend)
    reverse = unigrad.asarray(np.arange(B)[::-1].copy(), backend=backend)
    bj = unigrad.batched_jacobian(permuted, backend=backend, compile=compile, check_independence=check)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):  # a second call: the repeat path of compile=True
            got = unigrad.to_numpy(bj(x, identity))
            np.testing.assert_allclose(got, np.stack([np.diag(np.cos(r)) for r in unigrad.to_numpy(x)]), atol=1e-12)
        for _ in range(2):
            with pytest.raises(ValueError, match="not independent"):
                bj(x, reverse)
        got = unigrad.to_numpy(bj(x, identity))  # and back: still the right blocks
        np.testing.assert_allclose(got, np.stack([np.diag(np.cos(r)) for r in unigrad.to_numpy(x)]), atol=1e-12)


def test_batched_jacobian_repeat_with_new_weights_of_the_same_shape(monkeypatch):
    """Weights passed as non-differentiated arrays, new values each call (a training loop): right blocks
    on every call. The jaxpr proof treats the arrays f is given as unknown values, so it holds for the
    signature: one proof, and every later call takes the compiled repeat path."""
    jnp = pytest.importorskip("jax.numpy")
    from unigrad import _batched

    proofs = []
    real = _batched.prove_independence
    monkeypatch.setattr(_batched, "prove_independence", lambda *a, **k: proofs.append(1) or real(*a, **k))
    rng = np.random.default_rng(1)

    def layer(w, x):
        xp = unigrad.namespace(w, x)
        return xp.tanh(x @ w)

    bj = unigrad.batched_jacobian(layer, argnums=1, backend="jax", compile=True)
    x = jnp.asarray(rng.standard_normal((B, D)).astype(np.float32))
    for step in range(3):
        w = jnp.asarray(rng.standard_normal((D, 2)).astype(np.float32))
        for _ in range(2):
            got = np.asarray(bj(w, x))
            wn, xn = np.asarray(w, np.float64), np.asarray(x, np.float64)
            want = np.stack([(1 - np.tanh(r @ wn) ** 2)[:, None] * wn.T for r in xn])
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(proofs) == 1


def test_batched_jacobian_inside_jax_jit_with_an_index_array():
    """Inside the user's own jax.jit the index array is a tracer: no fingerprint to read, and no crash
    (the values-keyed caches are skipped; the probe is abstract there, as before)."""
    jax = pytest.importorskip("jax")
    run = jax.jit(lambda x, idx: unigrad.batched_jacobian(permuted, backend="jax")(x, idx))
    x = jax.numpy.ones((4, 3))
    assert run(x, jax.numpy.arange(4)).shape == (4, 3, 3)
