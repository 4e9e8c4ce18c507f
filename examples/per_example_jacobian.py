"""Per-example Jacobians of a batch of outputs -- one vectorised call, no Python loop over examples.

``features`` maps a batch x of shape (B, n) to a batch of shape (B, m); row b of the output depends
only on row b of the input. ``unigrad.batched_jacobian`` returns the B Jacobians d out[b] / d x[b],
shape (B, m, n), from m (or n) vectorised sweeps -- never B of them, and never the full
(B*m) x (B*n) Jacobian, which is zero off its diagonal blocks.

``chunk_size=k`` bounds the memory: at most k of those sweeps run at once (each carries the
whole batch), so peak memory is about k times one sweep's, for the same result.

Run it:    python examples/per_example_jacobian.py
Check it:  unigrad check examples/per_example_jacobian.py:features
           unigrad check examples/per_example_jacobian.py:jacobian_penalty     (derivatives OF the
           per-example Jacobians: a second-order check through batched_jacobian)
"""

import numpy as np

import unigrad


def features(x, w):
    """A batch of feature vectors: tanh(x @ w) * x[:, :1], shape (B, m) for x (B, n), w (n, m)."""
    xp = unigrad.namespace(x, w)
    return xp.tanh(xp.matmul(x, w)) * x[:, :1]


def features_inputs(seed=0, batch=6, n=4, m=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, n)), rng.standard_normal((n, m)) / np.sqrt(n)


def per_example_jacobians(x, w, backend=None, check_independence="once", chunk_size=None):
    """d features(x, w)[b] / d x[b] for every example b: shape (B, m, n).

    ``batched_jacobian`` first probes (once per input signature) that the rows really are
    independent, and raises instead of returning wrong Jacobians for f like batch norm.
    """
    return unigrad.batched_jacobian(features, argnums=0, backend=backend, chunk_size=chunk_size,
                                    check_independence=check_independence)(x, w)


def jacobian_penalty(x, w):
    """Mean squared Frobenius norm of the per-example Jacobians (a Jacobian regulariser)."""
    jac = per_example_jacobians(x, w)
    xp = unigrad.namespace(jac)
    return xp.mean(xp.sum(jac * jac, axis=(1, 2)))


jacobian_penalty_inputs = features_inputs


def expected(x, w):
    """The same Jacobians written out by hand, for the printout."""
    z = np.tanh(x @ w)                                   # (B, m)
    jac = (1 - z ** 2)[:, :, None] * w.T[None] * x[:, :1, None]
    jac[:, :, 0] += z                                    # d/dx[:, 0] of the x[:, :1] factor
    return jac


def main():
    x, w = features_inputs()
    want = expected(x, w)
    installed = [name for name, info in unigrad.backends().items() if info["available"]]
    for name in sorted(installed, key=lambda n: n != "numpy"):  # the NumPy tape first
        jac = unigrad.to_numpy(per_example_jacobians(x, w, backend=name))
        chunked = unigrad.to_numpy(per_example_jacobians(x, w, backend=name, chunk_size=1))  # one sweep at a time
        error = float(np.max(np.abs(jac - want)))
        print(f"{name:>10}: per-example Jacobians {jac.shape} (B, m, n); max |error| vs hand-written: {error:.1e}")
        single = not unigrad.get_backend(name).capabilities.float64  # MLX: float32's accuracy
        assert jac.shape == want.shape and error < (1e-5 if single else 1e-12), (name, error)
        np.testing.assert_allclose(chunked, jac, rtol=1e-6 if single else 1e-14, atol=1e-7 if single else 1e-15)


if __name__ == "__main__":
    main()
