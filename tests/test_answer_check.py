"""Per-example Jacobians check themselves (unigrad._answer_check): where the blocks do not stand on a proof
over the program that runs (a probe's verdict, a custom rule, a shortcut that computes one example alone),
one JVP of the whole batch with a random tangent on every row is compared with them, inside the same
compiled program; a failure falls back to the exact form (a refuted shortcut) or raises the ValueError
naming the rows. Issue 36, repros r15 and r24.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import unigrad
from unigrad import _answer_check, _batched


@unigrad.custom_jvp
def rowmix_big(x):
    return x * 1.0


@rowmix_big.defjvp
def _rowmix_big_jvp(primals, tangents):
    """Moves row i-1's tangent into row i where x > 10 (r24): rows mixed at some values only."""
    (x,), (t,) = primals, tangents
    xp = unigrad.namespace(x)
    return rowmix_big(x), t + xp.where(x > 10.0, 0.5, 0.0) * xp.roll(t, 1, axis=0)


def _points(dtype=np.float64):
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((4, 3)).astype(dtype)
    xbig = xb.copy()
    xbig[1, 1] = 20.0
    return xb, xbig


@pytest.mark.parametrize("check", ["once", "always"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_a_custom_rule_that_mixes_rows_at_some_values_is_caught_on_every_call(backend, check, compile):
    dtype = np.float32 if backend == "mlx" else np.float64
    xb, xbig = _points(dtype)
    bj = unigrad.batched_jacobian(rowmix_big, backend=backend, check_independence=check, compile=compile)
    for _ in range(2):  # a quiet call, then the values where the rule mixes rows: never the identity there
        got = unigrad.to_numpy(bj(xb))
        np.testing.assert_allclose(got, np.broadcast_to(np.eye(3), (4, 3, 3)), atol=1e-6)
        with pytest.raises(ValueError, match=r"fail their check.*in rows? 0"):
            bj(xbig)
    if not compile:  # the first call at the mixing values too (nothing kept from a quiet call)
        with pytest.raises(ValueError, match="not independent"):
            unigrad.batched_jacobian(rowmix_big, backend=backend, check_independence=check)(xbig)


def test_check_never_is_the_callers_word():
    """check_independence="never": no proof, no probe, no check (the sum trick's blocks as they are)."""
    _, xbig = _points()
    got = unigrad.batched_jacobian(rowmix_big, check_independence="never")(xbig)
    assert not np.allclose(got, np.broadcast_to(np.eye(3), (4, 3, 3)))


# ------------------------------------------------- the checker catches a wrong answer, on every backend

@pytest.mark.parametrize("forward", [True, False], ids=["jvp", "vjp"])
def test_the_check_fails_exactly_the_rows_whose_blocks_are_wrong(backend, forward):
    dtype = np.float32 if backend == "mlx" else np.float64
    b = unigrad.get_backend(backend)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 2)).astype(dtype)
    x = rng.standard_normal((5, 3)).astype(dtype)

    def f(x):  # rows independent: out[b] = tanh(x[b] @ w), d out[b] / d x[b] = diag(1 - out^2) @ w.T
        xp = unigrad.namespace(x)
        return (xp.tanh(x @ xp.asarray(w)),)

    out = np.tanh(x @ w)
    right = (1 - out ** 2)[:, :, None] * w.T[None]  # (5, 2, 3)
    xs = (b.asarray(x),)
    outs = (b.asarray(out),)
    for wrong_row, scale in ((None, 1.0), (3, 1.001 if dtype == np.float64 else 1.01), (0, 0.0)):
        blocks = right.copy()
        if wrong_row is not None:
            blocks[wrong_row] *= scale
        err, size = _answer_check.row_residuals(b, f, xs, outs, (b.asarray(blocks),), False, forward)
        rows, worst = _answer_check.failed_rows(b, b.evaluate(
            lambda e, s: _answer_check.verdicts(b, e, s, str(dtype.__name__)), (err, size)))
        assert rows == ([] if wrong_row is None else [wrong_row]), (rows, worst)


def test_a_clipping_custom_vjp_is_not_a_false_alarm():
    """A bwd that is not linear in its cotangent has no Jacobian one VJP can check: no error, and the blocks
    are what jacrev gives (unit cotangents)."""
    @unigrad.custom_vjp
    def clip_grad(h):
        return h * 1.0

    def fwd(h):
        return h * 1.0, None

    def bwd(_, g):
        return (unigrad.namespace(g).clip(g, -0.5, 0.5),)

    clip_grad.defvjp(fwd, bwd)

    def f(x):
        return unigrad.namespace(x).sin(clip_grad(x * x))

    x = np.random.default_rng(2).standard_normal((4, 3))
    dense = unigrad.to_numpy(unigrad.jacrev(f)(x))
    want = np.stack([dense[i, :, i, :] for i in range(4)])
    np.testing.assert_allclose(unigrad.batched_jacobian(f)(x), want, atol=1e-12)


# ------------------------------------------------- JAX: values made from the batch size or positions (r15)

def _jax_cases():
    import jax.numpy as jnp

    return {
        "count": lambda x: jnp.sin(x) / jnp.ones((x.shape[0],)).sum(),
        "positions": lambda x: x * jnp.cumsum(jnp.ones((x.shape[0], 1)), axis=0),
        "first_row_mask": lambda x: x * (1.0 + jnp.zeros_like(x).at[0].set(1.0)),
        "branch": lambda x: x * 2.0 if x.shape[0] != 3 else x * 7.0,
        "ones_like_sum": lambda x: x * jnp.ones_like(x).sum(0),
        "concat": lambda x: x * jnp.concatenate([jnp.ones((1, 2)), 2 * jnp.ones((x.shape[0] - 1, 2))]),
        "pad": lambda x: x * jnp.pad(jnp.ones((x.shape[0] - 1, 2)), ((1, 0), (0, 0)), constant_values=3.0),
        "roll": lambda x: x * jnp.roll(jnp.arange(1.0, 1.0 + x.shape[0])[:, None], 1, axis=0),
        "sort": lambda x: x * jnp.sort(-jnp.cumsum(jnp.ones((x.shape[0],))))[:, None],
        "softmax": lambda x: x * jax_nn().softmax(jnp.zeros((x.shape[0],)))[:, None],
        "mean_scaled": lambda x: jnp.tanh(x) * jnp.mean(jnp.ones((x.shape[0], 2)) * 3.0),
    }


def jax_nn():
    import jax
    return jax.nn


JAX_CASES = ["count", "positions", "first_row_mask", "branch", "ones_like_sum", "concat", "pad", "roll", "sort",
             "softmax", "mean_scaled"]


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", JAX_CASES)
def test_jax_values_from_the_batch_size_or_positions_are_right(name, compile):
    jax = pytest.importorskip("jax")
    f = _jax_cases()[name]
    x = jax.numpy.asarray(np.arange(1.0, 7.0, dtype=np.float32).reshape(3, 2))
    full = np.asarray(jax.jacfwd(f)(x))
    want = np.stack([full[i, :, i, :] for i in range(3)])
    bj = unigrad.batched_jacobian(f, backend="jax", compile=compile)
    for _ in range(2):  # a repeat too (compiled: the repeat path)
        np.testing.assert_allclose(np.asarray(bj(x)), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["rev", "fwd"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_a_refuted_jax_shortcut_is_remembered(monkeypatch, mode, compile):
    """The one-example shortcut, taken on JAX only where the user declares separable=True and no proof is
    exact (here a custom rule), for an f that is not separable (it counts the batch): the shortcut's answer
    fails its check, the sum trick gives the right blocks, and later calls of the signature take the sum
    trick directly (one failed check, no second attempt), itself checked on every call (no exact proof)."""
    jax = pytest.importorskip("jax")
    f = _jax_cases()["count"]
    x = jax.numpy.asarray(np.arange(1.0, 7.0, dtype=np.float32).reshape(3, 2))
    full = np.asarray(jax.jacfwd(f)(x))
    want = np.stack([full[i, :, i, :] for i in range(3)])
    failures = []
    real = _answer_check.failed_rows

    def spy(*a, **k):
        got = real(*a, **k)
        failures.append(bool(got[0]))
        return got

    monkeypatch.setattr(_batched, "failed_rows", spy)
    bj = unigrad.batched_jacobian(lambda x: f(rowmix_big(x)), backend="jax", mode=mode, compile=compile,
                                  separable=True)  # (x under 10: rowmix_big is the identity there)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(bj(x)), want, rtol=1e-6)
    assert failures[0] and not any(failures[1:]) and len(failures) == 4, failures


@pytest.mark.parametrize("mode", ["rev", "fwd"])
@pytest.mark.parametrize("name", JAX_CASES + ["mlp", "mlp_mean", "relu"])
def test_jax_never_computes_one_example_alone_where_a_proof_is_exact(name, mode, monkeypatch):
    """Where the jaxpr proves the rows independent, JAX takes the exact sum trick in both modes (as fast as
    ``vmap(jacrev(f_one))``: _broadcasts) and never the one-example shortcut, whose analysis (is ``f`` on one
    example a row of ``f``?) shipped silent wrong answers for these functions (r15): declared separable or
    not, nothing to check, and the right blocks."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    w = jnp.ones((2, 4)) / 3
    f = {"mlp": lambda x: jnp.tanh(x @ w) @ w.T, "mlp_mean": lambda x: jnp.tanh(x @ w) @ w.T / x.shape[0],
         "relu": lambda x: jax.nn.relu(x) * 2}.get(name) or _jax_cases()[name]
    x = jnp.asarray(np.arange(1.0, 7.0, dtype=np.float32).reshape(3, 2))
    b = unigrad.get_backend("jax")
    assert b.batch_rows(lambda x: (f(x),), (x,), has_aux=False)[::2] == ("row", False)
    shortcut, checks = [], []
    monkeypatch.setattr(type(b), "per_example_jacobian", lambda *a, **k: shortcut.append(1))
    real = _answer_check.failed_rows
    monkeypatch.setattr(_batched, "failed_rows", lambda *a, **k: checks.append(1) or real(*a, **k))
    full = np.asarray(jax.jacfwd(f)(x))
    want = np.stack([full[i, :, i, :] for i in range(3)])
    for compile in (False, True):
        for separable in (False, True):
            bj = unigrad.batched_jacobian(f, backend="jax", mode=mode, compile=compile, separable=separable)
            for _ in range(2):
                np.testing.assert_allclose(np.asarray(bj(x)), want, rtol=1e-6, atol=1e-7)
    assert shortcut == [] and checks == []


def test_batched_jacobian_auto_falls_back_to_reverse_where_forward_mode_raises():
    """A JAX custom_vjp has no forward mode: mode="auto" (forward here: fewer inputs than outputs per
    example) goes reverse, remembered for the signature, with the right blocks."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    @jax.custom_vjp
    def cv(u):
        return jnp.sin(u)

    cv.defvjp(lambda u: (jnp.sin(u), u), lambda u, g: (jnp.cos(u) * g,))

    def f(x):  # (B, 2) -> (B, 6): forward mode by the shapes
        return jnp.concatenate([cv(x), x ** 2, x], axis=1)

    x = jnp.asarray(np.arange(1.0, 7.0, dtype=np.float32).reshape(3, 2))
    full = np.asarray(jax.jacrev(f)(x))
    want = np.stack([full[i, :, i, :] for i in range(3)])
    bj = unigrad.batched_jacobian(f, backend="jax")
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(bj(x)), want, rtol=1e-6)
    with pytest.raises(Exception, match="custom_vjp"):
        unigrad.batched_jacobian(f, backend="jax", mode="fwd")(x)


# ------------------------------------------------- per-example gradients read from f's program check themselves

def _losses(w, xb):
    xp = unigrad.namespace(w, xb)
    return xp.sum(xp.tanh(xb @ w) ** 2, axis=1)


def test_per_example_rows_from_a_wrong_analysis_give_way_to_the_exact_rows(monkeypatch):
    """A dense layer's rows given to the wrong examples (the tape's reader made wrong here): the check (one
    backward pass with a random weight per example) refuses them, and every parameter is materialised."""
    from unigrad.per_example import _tape

    rng = np.random.default_rng(3)
    w, xb = rng.standard_normal((3, 2)), rng.standard_normal((5, 3))
    truth = unigrad.to_numpy(unigrad.jacrev(_losses)(w, xb))  # (5, 3, 2): the rows
    real = _tape.tape_rows

    def swapped(*a, **k):
        got = real(*a, **k)
        if got is None:
            return got
        outs, blocks, paths = got
        return outs, tuple(np.asarray(x)[[1, 0, 2, 3, 4]] for x in blocks), paths

    pe = unigrad.per_example_grad(_losses, argnums=0, batch_argnum=1)
    np.testing.assert_allclose(pe(w, xb), truth, atol=1e-12)
    assert pe.paths and set(pe.paths.values()) != {"materialised"}  # the fast path, checked and right
    monkeypatch.setattr(_tape, "tape_rows", swapped)
    np.testing.assert_allclose(pe(w, xb), truth, atol=1e-12)
    assert set(pe.paths.values()) == {"materialised"}, pe.paths


def test_per_example_norms_from_a_wrong_analysis_give_way_to_the_exact_norms(backend, monkeypatch):
    """Norms read from a dense layer's factors (|x_i|^2 |g_i|^2, never the rows) come with each example's
    <g_i, V> from the same factors; their sum weighted by a random r_i is checked against one backward
    pass of sum_i r_i loss_i. With G read for the
    wrong examples (the shared formulas -- torch's own factors -- made wrong here), the check refuses the
    fast path and every parameter is materialised: the norms stay right."""
    from unigrad.per_example import layers

    b = unigrad.get_backend(backend)
    if backend != "numpy" and not b.per_example_directions:  # (the tape's reader is the core's own)
        pytest.skip(f"{backend}: per_example_rows takes no directions (its norms are not read from factors)")
    rng = np.random.default_rng(4)
    w, xb = rng.standard_normal((3, 2)), rng.standard_normal((5, 3))
    rows = unigrad.to_numpy(unigrad.jacrev(_losses)(w, xb)).reshape(5, -1)
    truth = np.sqrt(np.sum(rows ** 2, axis=1))
    dtype = np.float32 if backend == "mlx" else np.float64
    norms = unigrad.per_example_grad_norms(_losses, argnums=0, batch_argnum=1, backend=backend)
    got = unigrad.to_numpy(norms(w.astype(dtype), xb.astype(dtype)))
    np.testing.assert_allclose(got, truth, rtol=1e-5)
    assert set(norms.paths.values()) == {layers.DENSE_OUTER}, norms.paths  # the fast path, checked and right

    def flipped(g):
        return unigrad.namespace(g).flip(g, axis=0)

    real_rows, real_dots = layers.matmul_rows, layers.matmul_dots
    monkeypatch.setattr(layers, "matmul_rows", lambda ops, x, g, *a: real_rows(ops, x, flipped(g), *a))
    monkeypatch.setattr(layers, "matmul_dots", lambda ops, x, g, *a: real_dots(ops, x, flipped(g), *a))
    if backend == "torch":
        from unigrad_torch import _per_example_layers as torch_layers

        real_factors = torch_layers.Use.factors

        def factors(self, rec, g, batch):
            got = real_factors(self, rec, g, batch)
            return None if got is None else (got[0], got[1].flip(0))
        monkeypatch.setattr(torch_layers.Use, "factors", factors)
    wrong = unigrad.per_example_grad_norms(_losses, argnums=0, batch_argnum=1, backend=backend)
    got = unigrad.to_numpy(wrong(w.astype(dtype), xb.astype(dtype)))
    np.testing.assert_allclose(got, truth, rtol=1e-5)
    assert set(wrong.paths.values()) == {"materialised"}, wrong.paths


def test_norms_without_their_dots_are_read_as_rows_and_checked(monkeypatch):
    """A reader whose norms come without each example's <g_i, V> (a plugin without directions=, a formula that
    gives none) cannot have them checked: the core asks it for rows instead, checks those, and makes the norms
    from them. Here the tape's reader gives wrong norms and no dots: they are never used; its rows are right
    (the fast path, checked), then read for the wrong examples (refused: materialised). Norms right throughout."""
    from unigrad.per_example import _tape, layers

    rng = np.random.default_rng(7)
    w, xb = rng.standard_normal((3, 2)), rng.standard_normal((5, 3))
    truth = np.sqrt(np.sum(unigrad.to_numpy(unigrad.jacrev(_losses)(w, xb)).reshape(5, -1) ** 2, axis=1))
    real, calls, swap = _tape.tape_rows, [], [False]

    def no_dots(f, leaves, batch, norms, *a):
        calls.append(norms)
        outs, blocks, paths = real(f, leaves, batch, norms, *a)
        if norms:
            return outs, (2.0 * blocks[0],), paths
        return outs, tuple(np.asarray(x)[[1, 0, 2, 3, 4]] for x in blocks) if swap[0] else blocks, paths

    monkeypatch.setattr(_tape, "tape_rows", no_dots)
    norms = unigrad.per_example_grad_norms(_losses, argnums=0, batch_argnum=1)
    np.testing.assert_allclose(norms(w, xb), truth, rtol=1e-12)
    assert calls == [True, False] and set(norms.paths.values()) == {layers.DENSE}, (calls, norms.paths)
    swap[0] = True
    np.testing.assert_allclose(norms(w, xb), truth, rtol=1e-12)
    assert set(norms.paths.values()) == {"materialised"}, norms.paths


def test_the_checks_run_in_the_arrays_scope_on_jax():
    """The checks' arithmetic on float64 JAX arrays runs inside the backend's scope (JAX's 64-bit mode), as
    the products it compares do: outside it JAX truncates to float32 (with a warning), and a float64 check
    held to float64's tolerance would be computed in float32."""
    pytest.importorskip("jax")
    from scipy import sparse

    rng = np.random.default_rng(5)
    x, w, xb = rng.standard_normal((4, 3)), rng.standard_normal((3, 2)), rng.standard_normal((5, 3))
    pattern = sparse.csr_array(np.eye(3, dtype=bool) | np.eye(3, k=1, dtype=bool) | np.eye(3, k=-1, dtype=bool))

    def banded(v):
        xp = unigrad.namespace(v)
        return xp.sin(v) * xp.concat([v[1:], v[:1] * 0.0]) + xp.concat([v[:1] * 0.0, v[:-1]])

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # JAX's "float64 ... will be truncated to dtype float32"
        unigrad.batched_jacobian(lambda v: rowmix_big(v), backend="jax", mode="fwd")(x)  # (a custom rule: checked)
        unigrad.batched_jacobian(lambda v: rowmix_big(v), backend="jax", mode="rev")(x)
        for mode in ("fwd", "rev"):  # a given pattern: checked
            unigrad.sparse_jacobian(banded, sparsity=pattern, backend="jax", mode=mode)(x[0])
        unigrad.per_example_grad(_losses, backend="jax")(w, xb)
        unigrad.per_example_grad_norms(_losses, backend="jax")(w, xb)


def test_always_checks_the_answer_of_a_proof_too(monkeypatch):
    """A proof over the program that runs is trusted by default (the exact sum trick, unchecked);
    check_independence="always" checks it too. Here the proof is made wrong on purpose (f mixes rows, the
    proof is forced to say it does not): the default gives the sum trick's blocks unchecked, "always" refuses
    them with the ValueError naming the rows."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 3))

    def centred(x):
        xp = unigrad.namespace(x)
        return xp.tanh(x - xp.mean(x, axis=0))

    real = _batched.prove_independence
    monkeypatch.setattr(_batched, "prove_independence",
                        lambda call, *a, **k: ("row", None, real(call, *a, **k)[2], False, True))
    unigrad.batched_jacobian(centred, mode="rev")(x)  # the forced proof trusted: no check, no error
    with pytest.raises(ValueError, match="fail their check.*VJP in reverse mode"):
        unigrad.batched_jacobian(centred, mode="rev", check_independence="always")(x)
