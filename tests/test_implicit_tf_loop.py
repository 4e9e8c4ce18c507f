"""TensorFlow's compiled CG loop (``TensorflowBackend.while_loop``: ``tf.while_loop``): where
``unigrad.linear_solve`` has no values to steer a Python loop by (``compile=True``), CG runs as one graph
loop instead of materialising ``A``; where TensorFlow would differentiate the loop's graph symbolically
(pfor's loop bodies: ``vmap``, the Jacobians; nested graphs) it solves densely, deliberately. Every
derivative is checked against the closed form of a ridge regression."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import unigrad

tf = pytest.importorskip("tensorflow")

TF = "tensorflow"
RNG = np.random.default_rng(7)
N = 30  # features: the dense path would take 30 matvecs and an LU
X_TRAIN, Y_TRAIN = RNG.standard_normal((60, N)), RNG.standard_normal(60)
X_VALID, Y_VALID = RNG.standard_normal((15, N)), RNG.standard_normal(15)
LAM = 0.7


def _closed_form(lam):
    """The validation loss of ridge regression, and its first and second derivatives in lam."""
    a = X_TRAIN.T @ X_TRAIN + lam * np.eye(N)
    w = np.linalg.solve(a, X_TRAIN.T @ Y_TRAIN)
    r = X_VALID @ w - Y_VALID
    dw = -np.linalg.solve(a, w)
    d2w = -2 * np.linalg.solve(a, dw)
    return 0.5 * r @ r, r @ (X_VALID @ dw), (X_VALID @ dw) @ (X_VALID @ dw) + r @ (X_VALID @ d2w)


def _validation_loss(w):
    xp = unigrad.namespace(w)
    r = xp.asarray(X_VALID, dtype=w.dtype) @ w - xp.asarray(Y_VALID, dtype=w.dtype)
    return 0.5 * xp.sum(r * r)


def by_linear_solve(lam, solve="cg", maxiter=None):
    xp = unigrad.namespace(lam)
    x, y = xp.asarray(X_TRAIN, dtype=lam.dtype), xp.asarray(Y_TRAIN, dtype=lam.dtype)
    w = unigrad.linear_solve(lambda v: xp.matrix_transpose(x) @ (x @ v) + lam * v, xp.matrix_transpose(x) @ y,
                             solve=solve, symmetric=True, maxiter=maxiter)
    return _validation_loss(w)


def _ridge_gradient(w, lam):
    xp = unigrad.namespace(w)
    x, y = xp.asarray(X_TRAIN, dtype=w.dtype), xp.asarray(Y_TRAIN, dtype=w.dtype)
    return xp.matrix_transpose(x) @ (x @ w - y) + lam * w


def _ridge_solver(init, lam):  # plain code, nothing differentiates it: the normal equations
    xp = unigrad.namespace(lam)
    x, y = xp.asarray(X_TRAIN, dtype=lam.dtype), xp.asarray(Y_TRAIN, dtype=lam.dtype)
    a = xp.matrix_transpose(x) @ x + lam * xp.eye(N, dtype=lam.dtype)
    return xp.linalg.solve(a, (xp.matrix_transpose(x) @ y)[:, None])[:, 0]


def by_root(lam, solve="cg"):
    w = unigrad.custom_root(_ridge_gradient, solve=solve, symmetric=True)(_ridge_solver)(None, lam)
    return _validation_loss(w)


@pytest.fixture
def paths(monkeypatch):
    """Which way linear_solve solved: ``looped_cg`` calls are counted; ``dense`` lists the dense solves (a test
    that forbids them sets ``paths.forbid_dense``: a dense solve then raises)."""
    from unigrad.implicit import _linear_solve

    class Paths:
        looped = 0
        dense = 0
        forbid_dense = False

    seen = Paths()
    looped_cg, dense_solve = _linear_solve.looped_cg, _linear_solve.dense_solve

    def counted_loop(*args, **kwargs):
        seen.looped += 1
        return looped_cg(*args, **kwargs)

    def counted_dense(*args, **kwargs):
        if seen.forbid_dense:
            raise AssertionError("linear_solve materialised A (the dense path) where CG should run as tf.while_loop")
        seen.dense += 1
        return dense_solve(*args, **kwargs)

    monkeypatch.setattr(_linear_solve, "looped_cg", counted_loop)
    monkeypatch.setattr(_linear_solve, "dense_solve", counted_dense)
    return seen


@pytest.mark.parametrize("fn", [functools.partial(by_linear_solve, solve="cg"),
                                functools.partial(by_linear_solve, solve="normal_cg"),
                                functools.partial(by_root, solve="cg")], ids=["cg", "normal_cg", "custom_root"])
def test_a_compiled_gradient_runs_cg_as_a_graph_loop(fn, paths):
    """compile=True: the solve and the transposed solve of the gradient run as tf.while_loop (A never
    materialised: a dense solve raises here), and the gradient is the closed form's."""
    paths.forbid_dense = True
    value, gradient, _ = _closed_form(LAM)
    got = unigrad.value_and_grad(fn, backend=TF, compile=True)(np.array(LAM))
    np.testing.assert_allclose(float(np.asarray(got[0])), value, rtol=1e-9)
    np.testing.assert_allclose(float(np.asarray(got[1])), gradient, rtol=1e-8)
    assert paths.looped >= 1


def test_a_compiled_second_derivative_through_the_loop(paths):
    """grad of grad in one program: every linear solve of both rules (forward, transposed, and those of the
    rules' own derivatives) a graph loop, and the closed form's second derivative."""
    paths.forbid_dense = True
    _, _, second = _closed_form(LAM)
    for fn in (by_linear_solve, by_root):
        got = unigrad.grad(unigrad.grad(fn, backend=TF), backend=TF, compile=True)(np.array(LAM))
        np.testing.assert_allclose(float(np.asarray(got)), second, rtol=1e-7, err_msg=fn.__name__)
    assert paths.looped >= 4


@pytest.mark.slow  # (25 s: pfor's traces)
def test_a_compiled_hessian_and_jacobians_keep_the_dense_solve_under_pfor(paths):
    """TensorFlow's Jacobians vectorise with pfor, whose loop body TensorFlow may differentiate symbolically
    (not by the tapes that apply linear_solve's rules): there the solves are dense, and exact."""
    _, _, second = _closed_form(LAM)
    got = unigrad.hessian(by_linear_solve, backend=TF, compile=True)(np.array(LAM))
    np.testing.assert_allclose(float(np.asarray(got)), second, rtol=1e-7)
    got = unigrad.jacfwd(unigrad.grad(by_linear_solve, backend=TF), backend=TF, compile=True)(np.array(LAM))
    np.testing.assert_allclose(float(np.asarray(got)), second, rtol=1e-7)
    with warnings.catch_warnings():
        # eagerly: the inner Jacobian's pfor runs in a tf.function that the outer tape differentiates
        # symbolically (a loop there would give the loop's NaN derivative, and a SlowMapWarning)
        warnings.simplefilter("error")
        got = unigrad.jacrev(unigrad.jacrev(by_linear_solve, backend=TF), backend=TF)(np.array(LAM))
    np.testing.assert_allclose(float(np.asarray(got)), second, rtol=1e-7)
    assert paths.looped >= 1 and paths.dense >= 1  # the first derivative's solves loop, pfor's are dense


def test_eager_keeps_the_python_loop(monkeypatch):
    """Eagerly the values are readable: CG stays the Python loop (with its raising residual check)."""
    from unigrad.implicit import _linear_solve

    def refuse(*args, **kwargs):
        raise AssertionError("the graph loop ran eagerly")

    monkeypatch.setattr(_linear_solve, "looped_cg", refuse)
    monkeypatch.setattr(_linear_solve, "dense_solve", refuse)
    _, gradient, _ = _closed_form(LAM)
    np.testing.assert_allclose(float(np.asarray(unigrad.grad(by_linear_solve, backend=TF)(np.array(LAM)))), gradient,
                               rtol=1e-8)
    with pytest.raises(unigrad.implicit.ConvergenceError, match="did not converge after 2 iterations"):
        unigrad.grad(functools.partial(by_linear_solve, maxiter=2), backend=TF)(np.array(LAM))


def test_a_compiled_loop_that_does_not_converge_gives_nan(paths):
    """In a program the residual is symbolic: a loop stopped short (maxiter) cannot raise, so the solution
    and its derivatives come out NaN -- loud, never a wrong number (as JAX's lax.while_loop)."""
    short = unigrad.value_and_grad(functools.partial(by_linear_solve, maxiter=3), backend=TF, compile=True)
    value, gradient = short(np.array(LAM))
    assert np.isnan(float(np.asarray(value))) and np.isnan(float(np.asarray(gradient)))
    assert paths.looped >= 1 and paths.dense == 0


@pytest.mark.slow  # (7 s: pfor's traces)
def test_a_batch_of_problems_under_vmap_is_solved_densely(paths):
    """vmap of the gradient over several regularisations: pfor's loop body, where the solves are dense
    (deliberately: see test_a_compiled_hessian_and_jacobians_keep_the_dense_solve_under_pfor), eagerly and
    inside a compiled derivative of the map."""
    lams = np.array([0.3, 0.7, 2.0])
    want = np.array([_closed_form(lam)[1] for lam in lams])
    want2 = np.array([_closed_form(lam)[2] for lam in lams])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no SlowMapWarning: pfor vectorises the dense solves)
        got = unigrad.vmap(unigrad.grad(by_linear_solve, backend=TF), backend=TF)(lams)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-8)
        mapped = unigrad.vmap(unigrad.grad(by_linear_solve, backend=TF), backend=TF)
        got = unigrad.grad(lambda lam: unigrad.namespace(lam).sum(mapped(lam)), backend=TF, compile=True)(lams)
        np.testing.assert_allclose(np.asarray(got), want2, rtol=1e-7)
    assert paths.looped == 0 and paths.dense >= 2


def test_a_tape_around_a_compiled_transform_gets_nan_not_the_loops_derivative():
    """A tf.GradientTape outside the program differentiates its graph symbolically, through the loop's
    iterations rather than linear_solve's rules: that derivative (an approximation) is NaN, with a warning."""
    lam = tf.constant(LAM, tf.float64)
    compiled = unigrad.grad(by_linear_solve, backend=TF, compile=True)
    with pytest.warns(RuntimeWarning, match="symbolic gradients"):
        with tf.GradientTape() as tape:
            tape.watch(lam)
            gradient = compiled(lam)
        second = tape.gradient(gradient, lam)
    np.testing.assert_allclose(float(np.asarray(gradient)), _closed_form(LAM)[1], rtol=1e-8)
    assert np.isnan(float(np.asarray(second)))


def test_the_loop_state_must_keep_its_dtypes():
    backend = unigrad.get_backend(TF)

    @tf.function(autograph=False)
    def run(x):
        return backend.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 2.0), (tf.constant(0), x))

    assert float(run(tf.constant(1.5, tf.float64))[1]) == 12.0

    @tf.function(autograph=False)
    def wrong(x):
        return backend.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, tf.cast(s[1], tf.float32)),
                                  (tf.constant(0), x))

    with pytest.raises(TypeError, match=r"body changes state\[1\] from float64"):
        wrong(tf.constant(1.5, tf.float64))


def test_the_loop_is_offered_only_where_the_tapes_differentiate():
    """The property: the loop in a tf.function's own graph (and eagerly), None in pfor's loop body and in a
    graph nested in another (a tf.while_loop's or tf.map_fn's body), which TensorFlow differentiates
    symbolically."""
    backend = unigrad.get_backend(TF)
    seen = {}

    def look(name, value):
        seen[name] = backend.while_loop is not None
        return value

    assert backend.while_loop is not None  # eager

    @tf.function(autograph=False)
    def program(x):
        look("program", x)
        tf.vectorized_map(lambda v: look("pfor", v), x)
        tf.vectorized_map(lambda v: look("second pfor", v), x)
        tf.while_loop(lambda k: k < 2, lambda k: look("while body", k + 1), [tf.constant(0)])
        tf.map_fn(lambda v: look("map_fn", v), x)
        return look("program, after", x)

    program(tf.ones(3))
    tf.vectorized_map(lambda v: look("eager pfor", v), tf.ones(3))
    assert seen == {"program": True, "pfor": False, "second pfor": False, "while body": False, "map_fn": False,
                    "program, after": True, "eager pfor": False}


_M = RNG.standard_normal((4, 4))
A_SMALL, B_SMALL = _M @ _M.T + 4 * np.eye(4), RNG.standard_normal(4)


def _two_parameters(s):  # the rule's operand (the shift) and its right-hand side both move with s
    xp = unigrad.namespace(s)
    matrix, b = xp.asarray(A_SMALL, dtype=s.dtype), xp.asarray(B_SMALL, dtype=s.dtype)
    return xp.sum(unigrad.linear_solve(lambda v: matrix @ v + xp.sum(s) * v, b * s[0], symmetric=True)) * s[1]


@pytest.mark.parametrize("nesting", ["jacrev(jacrev), compiled"] + [  # (the others 4 to 5 s each)
    pytest.param(n, marks=pytest.mark.slow) for n in ("jacrev(jacfwd), compiled", "jacfwd(jacfwd)", "jacfwd(jacfwd), compiled")])
def test_nested_jacobians_through_the_rules(nesting):
    """A Jacobian nested in another transform's program vectorises with pfor in a function of its own
    (``_pfor_apart``, ``_vectorized_map``), as eagerly at the top: pfor inlined in the graph converted the rules'
    code, and the tape or accumulator around it then missed every term flowing through the rules' isolated
    inputs (measured: half of a compiled jacrev(jacrev), a zero diagonal in a compiled jacrev(jacfwd), an
    asymmetric jacfwd(jacfwd)). Against the NumPy tape's Hessian."""
    outer, inner = (unigrad.jacrev if nesting.startswith("jacrev") else unigrad.jacfwd,
                    unigrad.jacrev if "(jacrev)" in nesting else unigrad.jacfwd)
    x = np.array([0.7, 1.3])
    want = np.asarray(unigrad.hessian(_two_parameters, backend="numpy")(x))
    got = outer(inner(_two_parameters, backend=TF), backend=TF, compile="compiled" in nesting)(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-9)
