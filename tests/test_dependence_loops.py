"""JAX's structured control flow and scatters in the dependence analysis (the jaxpr front-end).

Sparsity: every detected pattern covers the dense Jacobian's non-zeros at random points, and is
exactly their support where the rule is exact (loops with a known trip count, static indices); indices
or trip counts computed from the input widen soundly and say so. Rows: FREE / ROW / MIXED / unknown
for loops, scatters and dynamic slices, and the value coupling of a predicate computed from several
rows (a while loop's trip count, ``where(min(x) > 0, ..)``) gives the proof up instead of claiming ROW.
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
lax = jax.lax

from unigrad_jax._dependence import from_closed_jaxpr, jaxpr_program  # noqa: E402


def stencil(u, axis=0):
    return u + 0.1 * (jnp.roll(u, 1, axis=axis) - 2.0 * u + jnp.roll(u, -1, axis=axis)) * jnp.cos(u)


def _support(f, x, points=3, seed=0):
    """Union of the dense Jacobian's non-zeros at x and at random points near it (forward mode: a
    while loop whose trip count is traced has no reverse mode; a custom_vjp no forward mode)."""
    rng = np.random.default_rng(seed)
    try:
        jax.eval_shape(jax.jacfwd(f), jnp.asarray(x))
        jac = jax.jit(jax.jacfwd(f))
    except TypeError:
        jac = jax.jit(jax.jacrev(f))
    out = None
    for k in range(points):
        p = x if k == 0 else x + 0.5 * (np.abs(x) + 1) * rng.uniform(-1, 1, x.shape)
        j = np.asarray(jac(jnp.asarray(p)))
        j = j.reshape(-1, x.size) != 0
        out = j if out is None else out | j
    return out


def _pattern(f, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = unigrad.jacobian_sparsity(f, jnp.asarray(x))
    return p.toarray(), p.reasons, [w for w in caught if issubclass(w.category, SparsityWarning)]


@jax.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


_softplus.defjvp(lambda p, t: (_softplus(p[0]), jax.nn.sigmoid(p[0]) * t[0]))


@jax.custom_vjp
def _cube(x):
    return x ** 3


_cube.defvjp(lambda x: (x ** 3, x), lambda x, g: (3 * x ** 2 * g,))

RNG = np.random.default_rng(7)
V = RNG.standard_normal(8)
M = RNG.standard_normal((3, 4))
PERM = np.array([2, 0, 3, 1])

# name: (f, x, exact): exact: the pattern is the dense support (else a superset that must cover it)
SPARSITY = {
    "cumsum": (lambda x: jnp.cumsum(x), V, True),
    "cumsum_reverse_2d": (lambda x: lax.cumsum(x, axis=1, reverse=True), M, True),
    "scan_ys": (lambda x: lax.scan(lambda c, xi: (c + jnp.sin(xi), c * xi), 1.0, x)[1], V, True),
    "scan_reverse_carry": (lambda x: lax.scan(lambda c, xi: (c * xi, c), 1.0, x, reverse=True)[0], V, True),
    "scan_consts_and_two_carries": (lambda x: lax.scan(lambda c, xi: ((c[1] * x[0], c[0] + xi), c[0]),
                                                       (1.0, 2.0), x[1:])[1], V, True),
    "fori_stencil_1": (lambda x: lax.fori_loop(0, 1, lambda k, u: stencil(u), x), V, True),
    "fori_stencil_3": (lambda x: lax.fori_loop(0, 3, lambda k, u: stencil(u), x), V, True),
    "fori_counter_indexes": (lambda x: lax.fori_loop(0, 3, lambda k, u: u.at[k].set(u[k + 1] * u[k + 2]), x), V, True),
    "fori_counter_dynamic_slice": (lambda x: lax.fori_loop(
        1, 4, lambda k, u: lax.dynamic_update_slice(u, lax.dynamic_slice(u, (k - 1,), (2,)) ** 2, (k + 2,)), x),
        V, True),
    "while_known_count": (lambda x: lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, stencil(c[1])),
                                                   (0, x))[1], V, True),
    "nested_scan": (lambda x: lax.fori_loop(0, 2, lambda k, u: lax.fori_loop(0, 2, lambda j, w: stencil(w), u) * u,
                                            x), V, True),
    "cond_static_index": (lambda x: lax.switch(1, [lambda u: u[::-1] * 1.0, lambda u: u * 2.0], x), V, True),
    "scatter_set": (lambda x: x.at[1].set(x[3] * 2.0), V, True),
    "scatter_add_duplicates": (lambda x: x.at[jnp.array([1, 1, 2])].add(x[:3] ** 2), V, True),
    "scatter_mul": (lambda x: x.at[2].mul(x[5]), V, True),
    "scatter_max": (lambda x: x.at[jnp.array([0, 4])].max(x[6:] * 3.0), V, False),  # (either may win)
    "scatter_2d_column": (lambda x: x.at[:, jnp.array([0, 0, 3])].add(x[:, 1:] ** 2), M, True),
    "scatter_2d_row_set": (lambda x: x.at[PERM[:2] % 3].set(x[1:] * x[:-1]), M, True),
    "scatter_out_of_bounds_dropped": (lambda x: x.at[jnp.array([1, 9])].add(x[:2] ** 2), V, True),
    "dynamic_update_static": (lambda x: lax.dynamic_update_slice(x, x[:2] * 2.0, (3,)), V, True),
    "checkpoint": (lambda x: jax.checkpoint(lambda u: jnp.sin(u) * u[0])(x), V, True),
    "custom_jvp": (lambda x: _softplus(x ** 3) * jnp.roll(x, 1), V, True),  # read through its rule
    # too long to unroll, a known trip count: the body applied 700 times to the sets (a fixed point
    # would join u and its flip: an even number of flips is the identity)
    "fori_long_exact_passes": (lambda x: lax.fori_loop(0, 700, lambda k, u: jnp.flip(u) * 1.0001, x), V, True),
    # supersets that must cover
    "custom_vjp": (lambda x: _softplus(_cube(x)) * jnp.roll(x, 1), V, False),  # a Python bwd: dense
    "scan_over_cap": (lambda x: lax.scan(lambda c, xi: (c + xi, c), 0.0, jnp.tile(x, 700))[1][:5], V, False),
    # too long to unroll: the body iterated to its fixed point, exact here (i meets n-1-i, nothing else)
    "fori_long_fixed_point": (lambda x: lax.fori_loop(0, 3000, lambda k, u: u + 1e-3 * jnp.sin(u[::-1]), x), V,
                              True),
}
VALUE_DEPENDENT = {  # indices or trip counts computed from the input: sound supersets, with a reason
    "while_value_predicate": (lambda x: lax.while_loop(lambda u: jnp.sum(u * u) < 50.0, lambda u: stencil(u) * 1.5,
                                                       x), None),
    "switch_traced_index": (lambda x: lax.switch(jnp.argmax(x) % 2, [lambda u: u[::-1] * 1.0, jnp.sin], x), None),
    "scatter_traced_index": (lambda x: x.at[jnp.argmax(x)].set(x[0] * x[1]), "scatter with indices computed"),
    "gather_traced_index": (lambda x: x[jnp.argmin(x)] * x, "start indices computed"),
    "dynamic_slice_traced": (lambda x: lax.dynamic_slice(x, (jnp.argmax(x) % 4,), (3,)) ** 2, "start indices computed"),
    "dynamic_update_traced": (lambda x: lax.dynamic_update_slice(x, x[:2] * x[2:4], (jnp.argmax(x),)),
                              "start indices computed"),
    "fori_traced_bound": (lambda x: lax.fori_loop(0, jnp.argmax(x), lambda k, u: stencil(u), x), None),
}


@pytest.mark.parametrize("name", sorted(SPARSITY))
def test_loop_and_scatter_patterns(name):
    f, x, exact = SPARSITY[name]
    got, reasons, _ = _pattern(f, x)
    truth = _support(f, x)
    assert not (truth & ~got).any(), f"non-zeros outside the pattern at {np.argwhere(truth & ~got)[:3]}"
    if exact:
        np.testing.assert_array_equal(got, truth)
        assert reasons == ()
    else:
        assert got.sum() > truth.sum()


@pytest.mark.parametrize("name", sorted(VALUE_DEPENDENT))
def test_value_dependent_loops_and_indices_widen_soundly(name):
    f, why = VALUE_DEPENDENT[name]
    got, reasons, caught = _pattern(f, V)
    truth = _support(f, V, points=4)
    assert not (truth & ~got).any(), f"non-zeros outside the pattern at {np.argwhere(truth & ~got)[:3]}"
    assert got.sum() > truth.sum() or got.all()  # a superset: any index, any trip count may be taken
    if why is not None:
        assert any(why in r for r in reasons) and caught


def test_gather_at_traced_indices_reads_only_what_its_window_may_cover():
    """Rows picked by indices computed from the input: output (i, j) may read column j of any row."""
    f = lambda x: x[jnp.argsort(x[:, 0])[:2]] * 2.0  # noqa: E731
    got, reasons, caught = _pattern(f, M)
    truth = _support(f, M, points=5)
    assert not (truth & ~got).any() and caught and any("indices computed" in r for r in reasons)
    np.testing.assert_array_equal(got, np.tile(np.eye(4, dtype=bool), (2, M.shape[0])))


def test_a_fixed_point_past_the_cap_widens_to_everything_and_says_so(monkeypatch):
    from unigrad.dependence import _sets
    monkeypatch.setattr(_sets, "_FIXED_POINT", 5)  # a band spreads one element a pass: 12 needs more than 5
    x = np.linspace(0.1, 1.0, 24)
    f = lambda u: lax.fori_loop(0, 3000, lambda k, w: stencil(w) * 0.9, u)  # noqa: E731
    got, reasons, caught = _pattern(f, x)
    assert got.all() and any("did not reach a fixed point" in r for r in reasons) and caught


def test_the_pattern_grows_with_the_trip_count():
    """A loop of tridiagonal stencil updates: T steps give a band of half-width T, exactly."""
    x = np.linspace(0.1, 1.0, 12)
    widths = []
    for steps in (1, 2, 4):
        f = lambda u, steps=steps: lax.fori_loop(0, steps, lambda k, w: stencil(w), u)  # noqa: E731
        p = unigrad.jacobian_sparsity(f, jnp.asarray(x))
        np.testing.assert_array_equal(p.toarray(), _support(f, x))
        widths.append(int(p.toarray()[0].sum()))
    assert widths == [3, 5, 9]


def test_sparse_jacobian_of_a_fori_loop_equals_the_dense_one():
    x = np.linspace(0.1, 1.0, 10)
    f = lambda u: lax.fori_loop(0, 2, lambda k, w: stencil(w), u)  # noqa: E731
    jac = unigrad.sparse_jacobian(f, sparsity="detect", backend="jax", format="dense")
    got = np.asarray(unigrad.to_numpy(jac(jnp.asarray(x))))
    want = np.asarray(jax.jacfwd(f)(jnp.asarray(x)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    pattern = unigrad.jacobian_sparsity(f, jnp.asarray(x)).toarray()
    np.testing.assert_array_equal(pattern, _support(f, x))
    assert pattern.sum() == 10 * 5  # a band of half-width 2, wrapping around (roll): 5 a row


def test_hessian_pattern_through_a_loop_covers_the_dense_hessian():
    x = np.linspace(0.1, 1.0, 8)
    f = lambda u: jnp.sum(lax.fori_loop(0, 2, lambda k, w: w + 0.1 * jnp.roll(w, 1) * w, u) ** 2)  # noqa: E731
    h = unigrad.hessian_sparsity(f, jnp.asarray(x)).toarray()
    truth = np.zeros_like(h)
    hess = jax.jit(jax.hessian(f))
    for p in (x, x[::-1] + 0.3):
        truth |= np.asarray(hess(jnp.asarray(p))) != 0
    assert not (truth & ~h).any()
    assert not h.all()  # still sparse: u_i meets its neighbours within 2 steps only


# ------------------------------------------------------------------------------------ batch rows

B = 4
X = np.random.default_rng(8).standard_normal((B, 3))
W = np.random.default_rng(9).standard_normal((3, 3))


def _rows(f):
    closed = jax.make_jaxpr(lambda x: (f(x),))(jnp.asarray(X))
    verdict, detail = prove_rows(from_closed_jaxpr(closed), B)
    return verdict, detail.describe() if hasattr(detail, "describe") else detail


def rnn(x):  # a scan over features, the batch in the carry: per-row state
    h, ys = lax.scan(lambda h, xt: (jnp.tanh(h * 0.5 + xt), h * xt), jnp.zeros(x.shape[0]), x.T)
    return ys.T + h[:, None]


ROWS = {
    "rnn_over_features": rnn,
    "fori_stencil_features": lambda x: lax.fori_loop(0, 3, lambda k, u: stencil(u, axis=1), x),
    "cumsum_features": lambda x: jnp.cumsum(x, axis=1),
    "map_over_rows": lambda x: lax.map(lambda r: jnp.sin(r) @ W, x),
    "while_free_predicate": lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.5),
                                                     (0, x))[1],
    "where_row_predicate": lambda x: jnp.where(x > 0, x * x, 2.0 * x),
    "argmax_features": lambda x: x * jnp.take_along_axis(x, jnp.argmax(x, axis=1)[:, None], axis=1),
    "scatter_static_column": lambda x: x.at[:, 1].set(x[:, 0] * 2.0),
    "dynamic_slices_free_start": lambda x: lax.fori_loop(0, 2, lambda k, u: lax.dynamic_update_slice(
        u, lax.dynamic_slice(u, (0, k), (B, 1)) * 2.0, (0, k + 1)), x),
    "cond_free_predicate": lambda x: lax.cond(W[0, 0] > 0, lambda u: u * 2.0, jnp.sin, x),
    # indices from the loop counter (computed in the program, the same for every row), batch axis whole
    "fori_set_column_k": lambda x: lax.fori_loop(0, 2, lambda k, u: u.at[:, k + 1].set(u[:, k] * 2.0), x),
    "fori_gather_columns_k": lambda x: lax.fori_loop(0, 2, lambda k, u: u[:, jnp.arange(3) * 0 + k] * u, x),
    "custom_jvp": lambda x: _softplus(x ** 3) @ W,
}
MIXED = {
    "scan_over_batch_with_carry": (lambda x: lax.scan(lambda c, r: (c + r, c + r), jnp.zeros(3), x)[1],
                                   "carries state from one row of the batch to the next"),
    "carry_accumulates_over_batch": (lambda x: lax.fori_loop(0, 2, lambda k, u: u + jnp.sum(u, axis=0), x),
                                     "reduce_sum over the batch axis"),
    "scatter_adds_rows": (lambda x: (x * 1.0).at[jnp.array([0, 0, 1, 2])].add(x), "scatter-add combines rows"),
}
UNKNOWN = {  # rows independent in derivative, coupled in value: the proof gives up (a probe, the sum trick)
    "while_batch_predicate": (lambda x: lax.while_loop(lambda u: jnp.max(jnp.abs(u)) < 100.0, lambda u: u * 2.0, x),
                              "trip count"),
    "where_min_predicate": (lambda x: jnp.where(jnp.min(x) > 0, x * x, 2.0 * x), "several rows"),
    "argmax_over_batch": (lambda x: x * jnp.take(jnp.arange(4.0), jnp.argmax(x[:, 0])), "several rows"),
    "switch_on_batch_sum": (lambda x: lax.switch((jnp.sum(x) > 0).astype(int), [lambda u: u * 2, jnp.sin], x),
                            "several rows"),
    "scatter_traced_index": (lambda x: x.at[:, jnp.argmax(x[:, 0]) % 3].set(0.0), "several rows"),
    "stop_gradient_of_batch_mean": (lambda x: x * lax.stop_gradient(jnp.mean(x ** 2, axis=0)), "no derivative flows"),
    "custom_vjp": (lambda x: _softplus(_cube(x)) @ W, "bwd rule"),  # probed (tests/test_dependence_custom.py)
    "fori_set_row_k": (lambda x: lax.fori_loop(0, 2, lambda k, u: u.at[k + 1].set(u[k] * 2.0), x),
                       "cuts across the batch axis"),
    "fori_gather_rows_k": (lambda x: lax.fori_loop(0, 2, lambda k, u: u[jnp.arange(B) * 0 + k] * u, x),
                           "cuts across the batch axis"),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_loop_rows_proved_independent(name):
    assert _rows(ROWS[name]) == ("row", None)


@pytest.mark.parametrize("name", sorted(MIXED))
def test_loop_rows_found_mixed(name):
    f, why = MIXED[name]
    verdict, detail = _rows(f)
    assert verdict == "mixed" and why in detail and "test_dependence_loops.py" in detail


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_value_coupled_rows_give_the_proof_up(name):
    f, why = UNKNOWN[name]
    verdict, detail = _rows(f)
    assert verdict == "unknown" and why in detail


def _blocks(f, x):
    full = np.asarray(jax.jacfwd(f)(jnp.asarray(x)))
    return np.stack([full[b, ..., b, :] for b in range(x.shape[0])])


def _no_probe(*args, **kwargs):
    raise AssertionError("the probe ran on a proved path")


def test_batched_jacobian_of_a_scan_is_proved_and_native(monkeypatch):
    """A JAX-native RNN-like scan: proved (no probe), equal to vmap(jacrev(one row)); in both modes by the exact
    sum trick (its basis held once: as fast as vmap(jacfwd(one row)), docs/performance.md), never a one-example
    shortcut that would have to check itself."""
    monkeypatch.setattr(_batched, "_settle_independence", _no_probe)
    used = []
    cls = type(unigrad.get_backend("jax"))
    original = cls.per_example_jacobian
    monkeypatch.setattr(cls, "per_example_jacobian", lambda self, *a, **k: used.append(1) or original(self, *a, **k))
    x = jnp.asarray(X)
    want = np.asarray(jax.vmap(jax.jacrev(lambda r: rnn(r[None])[0]))(x))
    for mode in ("fwd", "rev"):
        used.clear()
        for compile in (False, True):
            got = np.asarray(unigrad.batched_jacobian(rnn, backend="jax", compile=compile, mode=mode)(x))
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
        assert not used  # the rows were proved: the exact sum trick


@pytest.mark.parametrize("name", ["where_min_predicate", "argmax_over_batch", "stop_gradient_of_batch_mean"])
def test_value_coupled_rows_are_not_computed_one_row_at_a_time(name):
    """Rows coupled through a predicate or an index (no derivative flows): the per-example path would
    evaluate each row alone (min, argmax of one row): the exact sum trick is used instead."""
    f, _ = UNKNOWN[name]
    x = X.copy()
    x[:2] = np.abs(x[:2]) + 0.1  # rows 0 and 1 positive alone, not the batch
    for compile in (False, True):
        got = np.asarray(unigrad.batched_jacobian(f, backend="jax", compile=compile)(jnp.asarray(x)))
        np.testing.assert_allclose(got, _blocks(f, x), rtol=1e-6, atol=1e-12)


def test_scan_over_the_batch_with_a_counter_is_not_evaluated_one_row_at_a_time():
    """Iteration t of a scan over the batch knows it is row t through a carried counter: rows are
    independent (ROW), but one row alone would be iteration 0: the sum trick, not the per-example path."""
    def f(x):
        return lax.scan(lambda k, r: (k + 1.0, jnp.sin(r) * k), 0.0, x)[1]

    assert _rows(f) == ("row", None)
    got = np.asarray(unigrad.batched_jacobian(f, backend="jax")(jnp.asarray(X)))
    np.testing.assert_allclose(got, _blocks(f, X), rtol=1e-6, atol=1e-12)


def test_unrolled_and_looped_programs_agree_on_rows():
    """The index-set program (loops unrolled) and the row program (loops as nodes) of one f."""
    f = ROWS["fori_stencil_features"]
    unrolled = jaxpr_program(lambda x: (f(x),), [X])
    looped = from_closed_jaxpr(jax.make_jaxpr(lambda x: (f(x),))(jnp.asarray(X)))
    assert any(n.name == "lax.scan" for n in looped.nodes)
    assert not any(n.name == "lax.scan" for n in unrolled.nodes)
    assert prove_rows(unrolled, B) == prove_rows(looped, B) == ("row", None)
