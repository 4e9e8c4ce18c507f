"""JAX's sum trick under jit evaluates the linear program with the basis axis beside the batch and each unit
vector held once (``unigrad_jax._broadcasts``): the blocks must be the ones a ``vmap`` of the pullback (or
push) gives, and the dense Jacobian's diagonal blocks, for programs that meet every rule there (a product
the broadcast commutes with or not, transposes, scalars, calls, custom rules, loops, several arrays); and
the first product must run once per unit vector, not once per example (the reason it exists)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

import unigrad  # noqa: E402

B = 5
_RNG = np.random.default_rng(0)
W1 = jnp.asarray(_RNG.standard_normal((4, 6)), jnp.float32)
W2 = jnp.asarray(_RNG.standard_normal((6, 3)), jnp.float32)
M = jnp.asarray(_RNG.standard_normal((3, 4)), jnp.float32)


@jax.custom_vjp
def _clipped_square(u):
    return u * u


_clipped_square.defvjp(lambda u: (u * u, u), lambda u, g: (2.0 * u * g,))


def _inner_jit(x):
    return jax.jit(lambda u: jnp.tanh(u @ W1))(x) @ W2


def _scan(x):
    def step(carry, col):
        return carry * 0.5 + col, carry * col
    return jax.lax.scan(step, jnp.zeros(x.shape[0]), x.T)[1].T


PROGRAMS = {  # name -> (f, per-example input shapes, reverse only)
    "linear_out": (lambda x: jnp.tanh(x @ W1) @ W2, [(4,)], False),
    "tanh_out": (lambda x: jnp.tanh(jnp.tanh(x @ W1) @ W2), [(4,)], False),
    "transposed_weight": (lambda x: jnp.sin(x) @ M.T, [(4,)], False),
    "einsum_left": (lambda x: jnp.einsum("oi,bi->bo", M, x ** 2), [(4,)], False),
    "per_example_matrix": (lambda x: jnp.einsum("bij,jk->bik", jnp.cos(x), W1[:, :2]), [(3, 4)], False),
    "batch_dims": (lambda x: jnp.einsum("bij,bj->bi", x, x[:, 0]), [(3, 3)], False),
    "scalar_out": (lambda x: jnp.sum(x ** 2, axis=1) * 3.0 - 1.0, [(4,)], False),
    "scaled_and_negated": (lambda x: -(x @ W1) / 2.0 + (x @ W1) * 0.25, [(4,)], False),
    "dtype_change": (lambda x: (x.astype(jnp.float16) @ W1.astype(jnp.float16)).astype(jnp.float32), [(4,)], False),
    "reshape_sum": (lambda x: jnp.sum(jnp.reshape(jnp.tanh(x), (x.shape[0], 2, 3)), axis=-1), [(6,)], False),
    "matrix_out": (lambda x: jnp.reshape(x @ W1, (x.shape[0], 2, 3)), [(4,)], False),
    "inner_jit": (_inner_jit, [(4,)], False),
    "relu_custom_jvp": (lambda x: jax.nn.relu(x @ W1) @ W2, [(4,)], False),
    "custom_vjp": (lambda x: _clipped_square(x) @ W1, [(4,)], True),
    "scan": (_scan, [(4,)], False),
    "cond": (lambda x: jax.lax.cond(True, lambda u: u @ W1, lambda u: -u @ W1, jnp.sin(x)), [(4,)], False),
    "two_in_two_out": (lambda x, y: (jnp.tanh(x @ W1) + y, jnp.sum(x * y[:, :4], axis=1)), [(4,), (6,)], False),
}


def _args(shapes):
    rng = np.random.default_rng(1)
    return [jnp.asarray(rng.standard_normal((B, *s)), jnp.float32) for s in shapes]


def _outputs(f):
    """``f`` returning a tuple of outputs."""
    return lambda *a: (lambda o: o if isinstance(o, tuple) else (o,))(f(*a))


def _dense_blocks(f, args):
    """Per output, per input: the dense Jacobian's diagonal blocks ``(B, *out[1:], *in[1:])``."""
    outs = _outputs(f)(*args)
    blocks = []
    for k in range(len(outs)):
        full = jax.jacrev(lambda *a: _outputs(f)(*a)[k], argnums=tuple(range(len(args))))(*args)
        blocks.append([np.stack([np.asarray(j)[(b,) + (slice(None),) * (outs[k].ndim - 1) + (b,)]
                                 for b in range(B)]) for j in full])
    return blocks


@pytest.mark.parametrize("mode", ["rev", "fwd"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_laid_out_blocks_are_the_mapped_ones(name, mode):
    f, shapes, reverse_only = PROGRAMS[name]
    if reverse_only and mode == "fwd":
        pytest.skip("a custom_vjp has no forward mode")
    b = unigrad.get_backend("jax")
    args = _args(shapes)

    def blocks(*a):
        return b.batched_jacobian(_outputs(f), a, mode=mode)[1]

    laid_out = jax.jit(blocks)(*args)  # traced: the evaluator of _broadcasts
    mapped = blocks(*args)  # eager: one vmap of the pullback (push)
    want = _dense_blocks(f, args)
    for k, row in enumerate(want):
        for j, w in enumerate(row):
            np.testing.assert_allclose(np.asarray(laid_out[k][j]), np.asarray(mapped[k][j]), rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(np.asarray(laid_out[k][j]), w, rtol=2e-3 if name == "dtype_change" else 2e-5,
                                       atol=2e-3 if name == "dtype_change" else 2e-5, err_msg=f"output {k}, input {j}")


def _dots(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _dots(inner)


@pytest.mark.parametrize("mode", ["rev", "fwd"])
def test_the_first_product_runs_once_per_unit_vector_not_once_per_example(mode):
    """An MLP whose first (reverse: last) layer is linear: the unit vectors meet that weight in a product with no
    batch axis (``e_k @ W``: the identity folded in, as in ``vmap(jacrev(f_one))``), where a ``vmap`` of the
    pullback multiplies a (n, B, ...) repetition of them."""
    b = unigrad.get_backend("jax")
    batch = 11  # a size no other axis has
    x = jnp.ones((batch, 4), jnp.float32)
    f = PROGRAMS["linear_out"][0]
    closed = jax.make_jaxpr(lambda x: b.batched_jacobian(lambda u: (f(u),), (x,), mode=mode)[1])(x)
    unbatched = [e for e in _dots(closed.jaxpr)
                 if all(batch not in v.aval.shape for v in list(e.invars) + list(e.outvars))]
    weight = W2.shape if mode == "rev" else W1.shape
    assert any(tuple(v.aval.shape) == weight for e in unbatched for v in e.invars), \
        [[tuple(v.aval.shape) for v in e.invars] for e in _dots(closed.jaxpr)]


def test_unified_api_compiled_batched_jacobian_takes_the_laid_out_path(monkeypatch):
    """Through the public API (compile=True), in both modes: the evaluator runs, and the blocks are the dense
    Jacobian's. Eagerly, one vmap of the pullback (an equation at a time would dispatch more)."""
    import unigrad_jax

    used = []
    real = unigrad_jax.linear_map
    monkeypatch.setattr(unigrad_jax, "linear_map", lambda *a, **k: used.append(1) or real(*a, **k))
    f = PROGRAMS["linear_out"][0]
    (x,) = _args([(4,)])
    want = _dense_blocks(f, [x])[0][0]
    for mode in ("rev", "fwd"):
        for compile in (True, False):
            used.clear()
            got = unigrad.batched_jacobian(f, backend="jax", compile=compile, mode=mode)(x)
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
            assert bool(used) == compile, (mode, compile)
            got, aux = unigrad.batched_jacobian(lambda x: (f(x), {"tag": "kept", "mean": jnp.mean(x)}), backend="jax",
                                                compile=compile, mode=mode, has_aux=True)(x)  # aux through linearize
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
            assert aux["tag"] == "kept" and float(aux["mean"]) == pytest.approx(float(jnp.mean(x)))
