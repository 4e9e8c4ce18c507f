"""Derivatives of solutions (unigrad.linear_solve, custom_root, custom_fixed_point) on every backend,
against closed forms and finite differences; and the checks that refuse a non-converged solution."""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest

import unigrad
from unigrad.implicit import ConvergenceError, ConvergenceWarning
from unigrad.testing import check_grads

RNG = np.random.default_rng(0)
X_TRAIN, Y_TRAIN = RNG.standard_normal((20, 4)), RNG.standard_normal(20)
X_VALID, Y_VALID = RNG.standard_normal((10, 4)), RNG.standard_normal(10)
LAM = 0.7
W_MIX = RNG.standard_normal((3, 3)) * 0.3

# MLX: first order in both modes agrees with the closed forms, and so does every nesting of second derivatives
# (docs/implicit.md; test_mlx_*). The generic second-order tests below skip MLX: MLX computes in float32, too coarse
# for their float64 tolerances and their finite differences.
NO_SECOND_ORDER = {"mlx"}

# Moved to the thorough job (conftest's SLOW_CASES): JAX's eager second order re-traces each nested transform;
# TensorFlow's eager nested tapes and pfor traces (measured 8 to 22 s each on 2 CPU cores).
SLOW_CASES = {*(f"test_third_derivatives_in_every_nesting[{b}-{route}]" for b in ("jax", "tensorflow")
               for route in ("linear_solve", "custom_root", "custom_fixed_point")),  # (JAX: 126 s for the three)
              "test_ridge_hyperparameter_second_derivative[jax-linear_solve]",
              "test_ridge_hyperparameter_second_derivative[jax-custom_root]",
              "test_linear_solve_second_order_in_a_non_symmetric_closed_over_matrix[jax-gmres]",
              "test_linear_solve_second_order_in_a_non_symmetric_closed_over_matrix[jax-lu]",
              "test_linear_solve_second_order_in_a_non_symmetric_closed_over_matrix[torch-lu]",
              "test_fixed_point_against_finite_differences[jax]",
              "test_a_batch_of_root_problems_under_vmap[jax]",
              "test_a_batch_of_pytree_root_problems_under_vmap[jax]",
              "test_a_batch_of_pytree_root_problems_under_vmap[tensorflow]",
              "test_linear_solve_second_order_in_a_non_symmetric_closed_over_matrix[tensorflow-gmres]",
              "test_linear_solve_second_order_in_a_non_symmetric_closed_over_matrix[tensorflow-lu]",
              "test_fixed_point_against_finite_differences[tensorflow]",
              "test_a_batch_of_root_problems_under_vmap[tensorflow]",
              "test_ridge_second_derivative_in_every_nesting[tensorflow]",
              "test_a_dict_solution_second_derivative[jax]",
              "test_a_dict_solution_second_derivative[tensorflow]",
              "test_a_tuple_solution_of_a_fixed_point[jax]",
              "test_a_tuple_solution_of_a_fixed_point[tensorflow]"}


def _np(x):
    return np.asarray(unigrad.to_numpy(x))


def _tolerance(backend):
    return 1e-4 if backend == "mlx" else 1e-9  # MLX computes float32


def _ridge_closed_form(lam):
    """Validation loss of ridge regression, and its first and second derivatives in lam."""
    a = X_TRAIN.T @ X_TRAIN + lam * np.eye(4)
    w = np.linalg.solve(a, X_TRAIN.T @ Y_TRAIN)
    r = X_VALID @ w - Y_VALID
    dw = -np.linalg.solve(a, w)
    d2w = -2 * np.linalg.solve(a, dw)
    return 0.5 * r @ r, r @ (X_VALID @ dw), (X_VALID @ dw) @ (X_VALID @ dw) + r @ (X_VALID @ d2w)


def _data(like, *arrays):
    xp = unigrad.namespace(like)
    return [xp.asarray(a, dtype=like.dtype) for a in arrays]


def _ridge_gradient(w, lam):  # the inner objective's gradient: zero at the ridge solution
    xp = unigrad.namespace(w)
    x, y = _data(w, X_TRAIN, Y_TRAIN)
    return xp.matrix_transpose(x) @ (x @ w - y) + lam * w


def _ridge_solver(init, lam):  # plain code: nothing differentiates it
    xp = unigrad.namespace(lam)
    x, y = _data(lam, X_TRAIN, Y_TRAIN)
    a = xp.matrix_transpose(x) @ x + lam * xp.eye(4, dtype=lam.dtype)
    return xp.linalg.solve(a, (xp.matrix_transpose(x) @ y)[:, None])[:, 0]


def _validation_loss(w):
    xp = unigrad.namespace(w)
    x, y = _data(w, X_VALID, Y_VALID)
    r = x @ w - y
    return 0.5 * xp.sum(r * r)


def loss_by_root(lam, solve="cg"):
    w = unigrad.custom_root(_ridge_gradient, solve=solve, symmetric=True)(_ridge_solver)(None, lam)
    return _validation_loss(w)


def loss_by_linear_solve(lam, solve="cg"):
    xp = unigrad.namespace(lam)
    x, y = _data(lam, X_TRAIN, Y_TRAIN)
    w = unigrad.linear_solve(lambda v: xp.matrix_transpose(x) @ (x @ v) + lam * v, xp.matrix_transpose(x) @ y,
                             solve=solve, symmetric=True)
    return _validation_loss(w)


@pytest.mark.parametrize("route", ["linear_solve", "custom_root"])
def test_ridge_hyperparameter_gradient_both_modes(backend, route):
    fn = loss_by_linear_solve if route == "linear_solve" else loss_by_root
    value, gradient, _ = _ridge_closed_form(LAM)
    rtol = _tolerance(backend)
    np.testing.assert_allclose(float(_np(unigrad.evaluate(fn, np.array(LAM), backend=backend))), value, rtol=rtol)
    np.testing.assert_allclose(float(_np(unigrad.grad(fn, backend=backend)(np.array(LAM)))), gradient, rtol=rtol)
    np.testing.assert_allclose(float(_np(unigrad.jacfwd(fn, backend=backend)(np.array(LAM)))), gradient, rtol=rtol)
    _, tangent = unigrad.jvp(fn, (np.array(LAM),), (np.array(1.0),), backend=backend)
    np.testing.assert_allclose(float(_np(tangent)), gradient, rtol=rtol)


@pytest.mark.parametrize("route", ["linear_solve", "custom_root"])
def test_ridge_hyperparameter_second_derivative(backend, route):
    if backend in NO_SECOND_ORDER:
        pytest.skip(f"{backend}: see NO_SECOND_ORDER")
    fn = loss_by_linear_solve if route == "linear_solve" else loss_by_root
    _, _, second = _ridge_closed_form(LAM)
    rtol = 1e-8
    h = float(_np(unigrad.hessian(fn, backend=backend)(np.array(LAM))))
    np.testing.assert_allclose(h, second, rtol=rtol)
    if backend in ("numpy", "jax"):  # reverse over reverse too (torch: see docs; TensorFlow: the next test)
        h = float(_np(unigrad.jacrev(unigrad.grad(fn, backend=backend), backend=backend)(np.array(LAM))))
        np.testing.assert_allclose(h, second, rtol=rtol)


def test_tensorflow_a_jacobian_inside_a_forward_pass():
    """TensorFlow: a reverse-mode Jacobian (pfor, a tf.function) inside the adapter's forward pass (an
    accumulator), differentiated again, made TensorFlow build the function's forward pass with JVPs and fail
    with its own error after minutes (a TypeError constructing InternalError in jacfwd(jacfwd(jacrev)),
    "returned too few gradients" in jacrev(jacfwd(jacrev)), through linear_solve): there the rows are computed
    in a loop, the tape's value in seconds."""
    pytest.importorskip("tensorflow")
    lam = np.array(LAM)
    for modes in (("fwd", "fwd", "rev"), ("rev", "fwd", "rev")):
        want = float(_np(_nested(loss_by_linear_solve, modes, "numpy")(lam)))
        got = float(_np(_nested(loss_by_linear_solve, modes, "tensorflow")(lam)))
        np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=str(modes))


@pytest.mark.parametrize("route", ["linear_solve", "custom_root", "custom_fixed_point"])
def test_third_derivatives_in_every_nesting(backend, route):
    """Every nesting of three modes (jacfwd / jacrev) through each route against the tape's: the rules differentiated
    twice. torch refuses two forward levels through a custom rule (NotImplementedError, docs/custom-derivatives.md),
    and nothing else may refuse. A sweep of these found two silent wrong answers: 0 on MLX (nested transforms
    closing over the solution) and 2-4% off on torch through the fixed point (a transposed operator transposed
    again); and TensorFlow's own errors where a pfor Jacobian ran inside a forward pass (now a loop there)."""
    if backend == "numpy":
        pytest.skip("the reference")
    fn, lam = _ROUTES[route], np.array(LAM)
    rtol = 2e-5 if backend == "mlx" else 1e-7
    for modes in [(a, b, c) for a in ("fwd", "rev") for b in ("fwd", "rev") for c in ("fwd", "rev")]:
        want = float(_np(_nested(fn, modes, "numpy")(lam)))
        nesting = "(".join("jacfwd" if m == "fwd" else "jacrev" for m in modes) + "(f)))"
        if backend == "torch" and modes.count("fwd") > 1:  # (two forward levels anywhere in the nesting)
            with pytest.raises(NotImplementedError, match="forward mode over forward mode"):
                _nested(fn, modes, backend)(lam)
            continue
        np.testing.assert_allclose(float(_np(_nested(fn, modes, backend)(lam))), want, rtol=rtol, err_msg=nesting)


def test_ridge_second_derivative_in_every_nesting(backend):
    """Every way of nesting the two modes, through both routes, against the closed form: on TensorFlow the
    rules' JVPs run while an accumulator is busy, where a tape opened inside records nothing unless the rule
    isolates its code (backends/unigrad_tensorflow/_rules.py)."""
    if backend not in ("numpy", "tensorflow"):
        pytest.skip("the tape and TensorFlow; test_ridge_hyperparameter_second_derivative covers the others")
    _, _, second = _ridge_closed_form(LAM)
    lam, one = np.array(LAM), np.array(1.0)
    for fn in (loss_by_linear_solve, loss_by_root):
        nestings = {
            "jacrev(grad)": lambda: unigrad.jacrev(unigrad.grad(fn, backend=backend), backend=backend)(lam),
            "jacfwd(grad)": lambda: unigrad.jacfwd(unigrad.grad(fn, backend=backend), backend=backend)(lam),
            "jacfwd(jacfwd)": lambda: unigrad.jacfwd(unigrad.jacfwd(fn, backend=backend), backend=backend)(lam),
            "jacrev(jacfwd)": lambda: unigrad.jacrev(unigrad.jacfwd(fn, backend=backend), backend=backend)(lam),
            "jvp(jvp)": lambda: unigrad.jvp(lambda t: unigrad.jvp(fn, (t,), (one,), backend=backend)[1], (lam,),
                                            (one,), backend=backend)[1],
            "hvp": lambda: unigrad.hvp(fn, (lam,), (one,), backend=backend)[0],
            "hessian, compiled": lambda: unigrad.hessian(fn, backend=backend, compile=True)(lam),
        }
        for name, nested in nestings.items():
            np.testing.assert_allclose(float(_np(nested())), second, rtol=1e-8, err_msg=f"{fn.__name__}: {name}")


def test_a_transform_that_gives_zeros_in_a_rule_is_refused(monkeypatch):
    """The rules' probe: where a VJP nested in a rule's code gives zeros (as TensorFlow's did while its rules
    ran with recording stopped), the implicit rules raise rather than return a wrong derivative."""
    from unigrad.implicit import _linear_solve

    real_probe = _linear_solve.nested_probe
    assert float(_np(real_probe(unigrad.get_backend("numpy")))) == 3.0
    monkeypatch.setattr(_linear_solve, "nested_probe", lambda backend: 0.0 * real_probe(backend))
    for fn in (loss_by_linear_solve, loss_by_root):
        with pytest.raises(NotImplementedError, match="nested in a custom rule"):
            unigrad.grad(fn)(np.array(LAM))


def _mlx_or_skip():
    try:
        return unigrad.get_backend("mlx")
    except (ValueError, ImportError):
        pytest.skip("the unigrad_mlx plugin is not installed")


def loss_by_fixed_point(lam):
    solver = unigrad.custom_fixed_point(_tanh_map)(_iterate)
    (direction,) = _data(lam, np.array([0.3, -0.2, 0.5]))
    return unigrad.namespace(lam).sum(solver(np.zeros(3), lam * direction))


_ROUTES = {"linear_solve": loss_by_linear_solve, "custom_root": loss_by_root, "custom_fixed_point": loss_by_fixed_point}
_ONE = np.array(1.0)


def _two_outputs(f):
    return lambda x: unigrad.namespace(x).stack([f(x), 2.0 * f(x)])


# On MLX (docs/implicit.md) every second derivative works, eagerly and compiled: over one VJP, and an inner forward
# mode. Each nesting's value at the first output (the two-output ones: f and 2 f).
_MLX_SECOND_ORDER = {
    "hessian": lambda f, x: unigrad.hessian(f, backend="mlx")(x),
    "hvp": lambda f, x: unigrad.hvp(f, (x,), (_ONE,), backend="mlx")[0],
    "jacfwd(grad)": lambda f, x: unigrad.jacfwd(unigrad.grad(f, backend="mlx"), backend="mlx")(x),
    "jacrev(grad)": lambda f, x: unigrad.jacrev(unigrad.grad(f, backend="mlx"), backend="mlx")(x),
    # (a scalar f: the inner jacrev is one VJP, not mapped by vmap)
    "jacrev(jacrev)": lambda f, x: unigrad.jacrev(unigrad.jacrev(f, backend="mlx"), backend="mlx")(x),
    "jacfwd(jacrev)": lambda f, x: unigrad.jacfwd(unigrad.jacrev(f, backend="mlx"), backend="mlx")(x),
    # the inner Jacobian of two outputs: a VJP mapped by vmap inside the enclosing transform (73% off before the
    # VJP rule read nothing and took the solution from MLX's outputs)
    "jacrev(jacrev), two outputs": lambda f, x: unigrad.jacrev(unigrad.jacrev(_two_outputs(f), backend="mlx"),
                                                               backend="mlx")(x)[0],
    "jacfwd(jacrev), two outputs": lambda f, x: unigrad.jacfwd(unigrad.jacrev(_two_outputs(f), backend="mlx"),
                                                               backend="mlx")(x)[0],
}
# compile=True: zeros through linear_solve while the solvers' forwards tried to read inside mx.compile's trace
# (some reads of constants succeed there); right since no forward reads under a transform that traces
_MLX_COMPILED = {
    "hessian": lambda f, x: unigrad.hessian(f, backend="mlx", compile=True)(x),
    "jacrev(grad)": lambda f, x: unigrad.jacrev(unigrad.grad(f, backend="mlx"), backend="mlx", compile=True)(x),
    "jacrev(jacrev), two outputs": lambda f, x: unigrad.jacrev(unigrad.jacrev(_two_outputs(f), backend="mlx"),
                                                               backend="mlx", compile=True)(x)[0],
}
# an inner forward mode: the JVP rule differentiated (zeros while it read: MLX drops the enclosing derivative of
# a rule that reads; now it reads nothing there, and custom_root's is given the forward's solution)
_MLX_INNER_FORWARD = {
    "jvp(jvp)": ("jvp(jvp", lambda f, x: unigrad.jvp(lambda t: unigrad.jvp(f, (t,), (_ONE,), backend="mlx")[1], (x,),
                                                     (_ONE,), backend="mlx")[1]),
    "jacfwd(jacfwd)": ("jvp(jvp", lambda f, x: unigrad.jacfwd(unigrad.jacfwd(f, backend="mlx"), backend="mlx")(x)),
    "jacrev(jacfwd)": ("vjp(jvp", lambda f, x: unigrad.jacrev(unigrad.jacfwd(f, backend="mlx"), backend="mlx")(x)),
    "grad(jvp)": ("vjp(jvp", lambda f, x: unigrad.grad(lambda t: unigrad.jvp(f, (t,), (_ONE,), backend="mlx")[1],
                                                       backend="mlx")(x)),
    "jacfwd(jacfwd), compiled": ("jvp(jvp", lambda f, x: unigrad.jacfwd(unigrad.jacfwd(f, backend="mlx"), backend="mlx",
                                                                       compile=True)(x)),
}


def _second_derivative(route):
    if route == "custom_fixed_point":
        return float(_np(unigrad.hessian(_ROUTES[route], backend="numpy")(np.array(LAM))))
    return _ridge_closed_form(LAM)[2]


@pytest.mark.parametrize("route", sorted(_ROUTES))
@pytest.mark.parametrize("nesting", sorted(_MLX_SECOND_ORDER) + [f"{k}, compiled" for k in sorted(_MLX_COMPILED)])
def test_mlx_second_derivatives_over_one_vjp(route, nesting):
    """On MLX the second derivatives whose inner derivative is a VJP -- hessian, hvp, jacfwd(grad), jacrev(grad),
    jacrev(jacrev) / jacfwd(jacrev), of a scalar f and of two outputs (the VJP mapped by vmap), eagerly and with
    compile=True -- agree with the closed form (the ridge routes) or the tape's (the fixed point), in float32: the
    VJP rule's residuals come from the outputs MLX hands it, it reads no value when an enclosing transform
    differentiates it, and the solvers' forward computations run on copies of their arrays' values, or read
    nothing where there are no values (docs/implicit.md)."""
    _mlx_or_skip()
    compiled = nesting.endswith(", compiled")
    nested = _MLX_COMPILED[nesting[:-len(", compiled")]] if compiled else _MLX_SECOND_ORDER[nesting]
    got = float(np.ravel(_np(nested(_ROUTES[route], np.array(LAM))))[0])
    np.testing.assert_allclose(got, _second_derivative(route), rtol=2e-5)


@pytest.mark.parametrize("route", sorted(_ROUTES))
@pytest.mark.parametrize("nesting", sorted(_MLX_INNER_FORWARD))
def test_mlx_inner_forward_mode(route, nesting):
    """An inner forward mode (jvp of jvp, jacfwd(jacfwd), jacrev(jacfwd), grad of jvp, compiled too) agrees with
    the closed form on MLX on every route: the JVP rule reads nothing when differentiated, and custom_root's is
    given the solution the forward computation gave (``Rule.jvp_given``) and takes one Newton step from it."""
    _mlx_or_skip()
    _, nested = _MLX_INNER_FORWARD[nesting]
    got = float(np.ravel(_np(nested(_ROUTES[route], np.array(LAM))))[0])
    np.testing.assert_allclose(got, _second_derivative(route), rtol=2e-5)


_THREE_MODES = [(a, b, c) for a in ("fwd", "rev") for b in ("fwd", "rev") for c in ("fwd", "rev")]


def _nested(f, modes, backend):
    for m in reversed(modes):
        f = (unigrad.jacfwd if m == "fwd" else unigrad.jacrev)(f, backend=backend)
    return f


@pytest.mark.parametrize("route", sorted(_ROUTES))
@pytest.mark.parametrize("modes", _THREE_MODES + [("rev",) * 4, ("fwd", "rev", "fwd", "rev")],
                         ids=lambda m: "".join(x[0] for x in m))
def test_mlx_third_and_fourth_derivatives(route, modes):
    """Every nesting of three modes (and two of four) through each route on MLX against the tape. A rule pass two
    enclosing transforms differentiate gave 0 (grad of grad of grad, every route) while its nested transforms
    closed over the solution and the operands (``held_vjp`` / ``held_jvp``), and 2% off through the fixed point in
    forward mode with one Newton step from the forward's solution (``order_above``: the steps double the right
    orders)."""
    _mlx_or_skip()
    fn, lam = _ROUTES[route], np.array(LAM)
    want = float(_np(_nested(fn, modes, "numpy")(lam)))
    np.testing.assert_allclose(float(_np(_nested(fn, modes, "mlx")(lam))), want, rtol=1e-5)


@pytest.mark.parametrize("route", ["custom_root", "custom_fixed_point"])
def test_mlx_a_jvp_rule_that_must_run_the_solver_is_refused_when_differentiated(route, monkeypatch):
    """Where the plugin has no outputs to give custom_root's JVP rule (``Rule.jvp_given`` not taken), the rule
    must run the solver again, which reads: differentiated, that gave 0 on MLX, so it raises, naming MLX, the
    nesting, why, and the nestings that work."""
    _mlx_or_skip()
    import dataclasses

    from unigrad_mlx import _rules
    real = _rules.apply_rule
    monkeypatch.setattr(_rules, "apply_rule", lambda rule, arrays: real(dataclasses.replace(rule, jvp_given=None),
                                                                        arrays))
    named, nested = _MLX_INNER_FORWARD["jacfwd(jacfwd)"]
    pattern = (r"on the mlx backend: this derivative of order 2 through custom_root / custom_fixed_point is not "
               rf"supported on MLX.*the nesting {re.escape(named)}\(f\)\).*must run your solver again.*so the "
               r"result would be wrong, not an error. On MLX derivatives through custom_root work over VJPs")
    with pytest.raises(NotImplementedError, match=pattern):
        nested(_ROUTES[route], np.array(LAM))
    # first order: no enclosing transform, the solver runs again and nothing is refused
    np.testing.assert_allclose(float(_np(unigrad.jacfwd(_ROUTES[route], backend="mlx")(np.array(LAM)))),
                               float(_np(unigrad.grad(_ROUTES[route], backend="numpy")(np.array(LAM)))), rtol=1e-4)


def test_mlx_a_gradient_runs_the_solver_no_more_than_its_forward_passes():
    """On MLX the VJP rule takes the solution from the outputs MLX hands it (``Rule.residuals``), not from the
    solver run again: a gradient runs the solver once per forward pass of f (two: the plugin's VJP records f
    again when it pulls back), where running ``fwd`` again made it three; a JVP runs it once."""
    _mlx_or_skip()
    calls = []

    def solver(init, lam):
        calls.append(1)
        return _ridge_solver(init, lam)

    def loss(lam):
        return _validation_loss(unigrad.custom_root(_ridge_gradient, solve="cg", symmetric=True)(solver)(None, lam))

    g = unigrad.grad(loss, backend="mlx")
    for _ in range(2):
        del calls[:]
        np.testing.assert_allclose(float(_np(g(np.array(LAM)))), _ridge_closed_form(LAM)[1], rtol=1e-4)
        assert len(calls) == 2
    # forward mode: the JVP rule is given the solution the forward computation gave (Rule.jvp_given), where it
    # ran the solver again (two runs)
    del calls[:]
    _, tangent = unigrad.jvp(loss, (np.array(LAM),), (_ONE,), backend="mlx")
    np.testing.assert_allclose(float(_np(tangent)), _ridge_closed_form(LAM)[1], rtol=1e-4)
    assert len(calls) == 1


def _cubic(x, a, b):  # x^3 + a x - b = 0, one equation per entry
    return x ** 3 + a * x - b


def _newton(init, a, b):
    """A solver that differentiates its optimality (a unigrad transform closing over the params) and reads
    values to stop: on MLX, such a forward lost the enclosing derivative (zeros) before it ran on copies."""
    xp = unigrad.namespace(a)
    x = xp.ones_like(a) if init is None else init
    for _ in range(50):
        slope = xp.sum(unigrad.jacobian(lambda x: _cubic(x, a, b))(x), axis=-1)  # (diagonal)
        step = _cubic(x, a, b) / slope
        x = x - step
        if float(xp.max(xp.abs(step))) < 1e-7:
            break
    return x


@pytest.mark.parametrize("nesting", sorted(_MLX_SECOND_ORDER) + ["jacfwd(jacfwd)", "jacrev(jacfwd)"])
def test_mlx_second_order_through_a_solver_that_differentiates_and_reads(nesting):
    """A Newton solver that takes a unigrad Jacobian of the optimality (closing over the params) and reads its
    step: the Hessian of a loss of its root in (a, b) on MLX equals the tape's. With the solver run on the
    params themselves rather than copies of their values, this came out 100% off (zeros), silently."""
    _mlx_or_skip()
    root = unigrad.custom_root(_cubic, solve="cg")(_newton)

    def loss(p):
        xp = unigrad.namespace(p)
        x = root(None, p[:2], p[2:])
        return xp.sum(xp.sin(x) * x)

    p = np.array([0.5, 1.5, 2.0, 3.0])
    want = _np(unigrad.hessian(loss, backend="numpy")(p))
    p32 = p.astype(np.float32)
    if nesting == "hvp":  # (along a vector: H v)
        v = np.array([1.0, -2.0, 0.5, 3.0])
        got, want = _np(unigrad.hvp(loss, (p32,), (v.astype(np.float32),), backend="mlx")[0]), want @ v
    else:
        got = _np((_MLX_SECOND_ORDER.get(nesting) or _MLX_INNER_FORWARD[nesting][1])(loss, p32))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.max(np.abs(want)))


@pytest.mark.parametrize("solve", ["gmres", "lu", "bicgstab", "normal_cg"])
def test_mlx_second_order_in_a_non_symmetric_closed_over_matrix(solve):
    """The Hessian (16 x 16) of sum(sin(A^-1 b)) in the matrix matvec closes over, forward and reverse over one
    VJP, eagerly and compiled, and the second derivatives (4 x 16 x 16) of the solution itself, sin(A^-1 b) (the
    inner Jacobian a VJP mapped by vmap; an inner forward mode), on MLX against the tape (normal_cg: its products
    are a pullback of matvec, read in its loop)."""
    _mlx_or_skip()
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 4)) + 4 * np.eye(4), rng.standard_normal(4)

    def solution(a):
        xp = unigrad.namespace(a)
        return xp.sin(unigrad.linear_solve(lambda v: a @ v, xp.asarray(b, dtype=a.dtype), solve=solve))

    def f(a):
        return unigrad.namespace(a).sum(solution(a))

    a32 = a.astype(np.float32)
    want = _np(unigrad.hessian(f, backend="numpy")(a))
    got = {nesting: _MLX_SECOND_ORDER[nesting](f, a32) for nesting in ("hessian", "jacrev(grad)")}
    got.update({f"{nesting}, compiled": _MLX_COMPILED[nesting](f, a32) for nesting in ("hessian", "jacrev(grad)")})
    for nesting, value in got.items():
        np.testing.assert_allclose(_np(value), want, rtol=1e-4, atol=1e-5 * np.max(np.abs(want)), err_msg=nesting)
    want = _np(unigrad.jacrev(unigrad.jacrev(solution, backend="numpy"), backend="numpy")(a))
    for outer, inner in (("jacrev", "jacrev"), ("jacfwd", "jacrev"), ("jacfwd", "jacfwd")):
        value = getattr(unigrad, outer)(getattr(unigrad, inner)(solution, backend="mlx"), backend="mlx")(a32)
        np.testing.assert_allclose(_np(value), want, rtol=1e-4, atol=1e-5 * np.max(np.abs(want)),
                                   err_msg=f"{outer}({inner})")


@pytest.mark.parametrize("closure", [True, False])
def test_mlx_defect_behind_the_copies(closure):
    """Why the solvers' forward computations run on copies of their arrays' values on MLX (docs/implicit.md), in
    MLX alone: a custom function's forward that runs an ``mx.vjp`` of a function closing over the custom
    function's input, then reads the result, loses the outer derivative: ``grad(grad)`` of ``lam^2`` gives 0,
    not 2. With the input a primal of the nested ``mx.vjp`` instead, 2. unigrad's solvers do the first (a
    pullback of ``matvec`` at its operands, then reads). When this test fails with closure=True, MLX has fixed
    it: the copies may go."""
    _mlx_or_skip()
    import mlx.core as mx

    @mx.custom_function
    def square(lam):
        if closure:
            product = mx.vjp(lambda w: [lam * w], [mx.ones(())], [mx.ones(())])[1][0]
        else:
            product = mx.vjp(lambda l, w: [l * w], [lam, mx.ones(())], [mx.ones(())])[1][1]
        float(product)  # a read, as the solvers' loops make
        return lam * lam

    @square.vjp
    def square_vjp(primals, cotangent, output):
        lam = primals[0] if isinstance(primals, (list, tuple)) else primals
        return 2 * lam * cotangent

    x = mx.array(1.5)
    assert mx.grad(square)(x).item() == 3.0
    assert mx.grad(mx.grad(square))(x).item() == (0.0 if closure else 2.0)


@pytest.mark.parametrize("route", sorted(_ROUTES))
def test_mlx_first_derivatives_in_every_mode(route):
    """The refusal leaves first derivatives alone: grad, jacrev, jacfwd, jvp and vjp against the closed form
    (the ridge routes) or the tape's derivative of the same function (the fixed point), in float32."""
    _mlx_or_skip()
    fn, lam = _ROUTES[route], np.array(LAM)
    if route == "custom_fixed_point":
        want = float(_np(unigrad.grad(fn, backend="numpy")(lam)))
    else:
        want = _ridge_closed_form(LAM)[1]
    _, pullback = unigrad.vjp(fn, lam, backend="mlx")
    got = {"grad": unigrad.grad(fn, backend="mlx")(lam),
           "jacrev": unigrad.jacrev(fn, backend="mlx")(lam),
           "jacfwd": unigrad.jacfwd(fn, backend="mlx")(lam),
           "jvp": unigrad.jvp(fn, (lam,), (_ONE,), backend="mlx")[1],
           "vjp": pullback(np.array(1.0, dtype=np.float32))[0]}
    for mode, value in got.items():
        np.testing.assert_allclose(float(_np(value)), want, rtol=1e-4, err_msg=mode)


def test_mlx_a_linear_solve_in_a_custom_jvp_rule_is_first_order():
    """grad of a custom_jvp function transposes its rule with mx.vjp inside the plugin (counted as a
    transform): a linear_solve the rule calls is differentiated once there, and a JVP the rule takes through
    linear_solve is differentiated by that transpose; both agree with the closed form."""
    _mlx_or_skip()

    def solved(s, b):  # (A + s I)^-1 b
        (a,) = _data(s, A_SPD)
        return unigrad.linear_solve(lambda v: a @ v + s * v, b, symmetric=True)

    @unigrad.custom_jvp
    def h(s):
        return unigrad.namespace(s).sum(solved(s, _data(s, B_RHS)[0]))

    @h.defjvp
    def h_jvp(primals, tangents):  # d/ds sum((A + s I)^-1 b) = -sum((A + s I)^-1 x), x = (A + s I)^-1 b
        (s,), (ds,) = primals, tangents
        x = solved(s, _data(s, B_RHS)[0])
        return h(s), -unigrad.namespace(s).sum(solved(s, ds * x))

    s0 = 0.7
    inverse = np.linalg.inv(A_SPD + s0 * np.eye(4))
    want = -np.sum(inverse @ inverse @ B_RHS)
    np.testing.assert_allclose(float(_np(unigrad.grad(h, backend="mlx")(np.array(s0)))), want, rtol=1e-4)
    np.testing.assert_allclose(float(_np(unigrad.jvp(h, (np.array(s0),), (_ONE,), backend="mlx")[1])), want,
                               rtol=1e-4)

    @unigrad.custom_jvp
    def h2(s):
        return h(s)

    @h2.defjvp
    def h2_jvp(primals, tangents):  # a rule that takes a JVP through linear_solve: its JVP rule, transposed by
        (s,), (ds,) = primals, tangents  # the plugin's mx.vjp, is differentiated (refused while it read values)
        _, dx = unigrad.jvp(lambda s: solved(s, _data(s, B_RHS)[0]), (s,), (ds,))
        return h2(s), unigrad.namespace(s).sum(dx)

    np.testing.assert_allclose(float(_np(unigrad.grad(h2, backend="mlx")(np.array(s0)))), want, rtol=1e-4)


SOLVES = ["cg", "gmres", "bicgstab", "normal_cg", "lu", "cholesky"]


def _spd(n=4):
    m = RNG.standard_normal((n, n))
    return m @ m.T + n * np.eye(n)


A_SPD, B_RHS = _spd(), RNG.standard_normal(4)


@pytest.mark.parametrize("solve", SOLVES)
def test_linear_solve_derivatives_in_b_and_in_the_closed_over_matrix(solve):
    """grad in the matrix matvec closes over and in b, against the closed forms (-u x^T and u, with
    A^T u = the cotangent), and forward mode, on the tape."""
    symmetric = solve in ("cg", "cholesky")

    def f(a, b):
        xp = unigrad.namespace(a, b)
        return xp.sum(xp.sin(unigrad.linear_solve(lambda v: a @ v, b, solve=solve, symmetric=symmetric)))

    ga, gb = unigrad.grad(f, argnums=(0, 1))(A_SPD, B_RHS)
    x = np.linalg.solve(A_SPD, B_RHS)
    u = np.linalg.solve(A_SPD.T, np.cos(x))
    np.testing.assert_allclose(gb, u, rtol=1e-8)
    np.testing.assert_allclose(ga, -np.outer(u, x), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(unigrad.jacfwd(f, argnums=1)(A_SPD, B_RHS), u, rtol=1e-8)


@pytest.mark.parametrize("solve", ["gmres", "lu"])
def test_linear_solve_second_order_in_a_non_symmetric_closed_over_matrix(backend, solve):
    if backend in NO_SECOND_ORDER:
        pytest.skip(f"{backend}: see NO_SECOND_ORDER")
    a = A_SPD + RNG.standard_normal((4, 4))  # not symmetric: the transposed solve needs matvec's VJP

    def f(a, b):
        xp = unigrad.namespace(a, b)
        return xp.sin(unigrad.linear_solve(lambda v: a @ v, b, solve=solve))

    modes = ("rev",) if backend == "torch" else ("fwd", "rev")  # torch: forward over forward raises
    check_grads(f, (a, B_RHS), order=2, modes=modes, backend=backend)


def _tanh_map(x, p):
    xp = unigrad.namespace(x, p)
    (w,) = _data(x, W_MIX)
    return xp.tanh(w @ x + p)


def _iterate(init, p):
    x = init
    for _ in range(100):
        x = _tanh_map(x, p)
    return x


def test_fixed_point_against_finite_differences(backend):
    """x = tanh(W x + p): the implicit derivative agrees with finite differences through the whole
    solver, and with differentiating the 100 iterations themselves."""
    solver = unigrad.custom_fixed_point(_tanh_map)(_iterate)
    p = np.array([0.3, -0.2, 0.5])
    fn = lambda p: solver(np.zeros(3), p)  # noqa: E731
    if backend not in NO_SECOND_ORDER:  # (MLX's float32 is too coarse for these finite differences anyway)
        # second order on the tape and JAX; torch: forward over forward raises for every custom rule
        check_grads(fn, (p,), order=2 if backend in ("numpy", "jax") else 1, backend=backend)
    implicit = _np(unigrad.jacobian(fn, backend=backend)(p))
    unrolled = _np(unigrad.jacobian(lambda p: _iterate(unigrad.namespace(p).zeros(3, dtype=p.dtype), p),
                                    backend=backend)(p))
    np.testing.assert_allclose(implicit, unrolled, rtol=_tolerance(backend) * 100, atol=1e-6)


class _Operator:
    def __init__(self, a):
        self.a = a

    def matvec(self, v):
        return self.a @ v


@pytest.mark.parametrize("how", ["closure", "default", "partial", "method"])
def test_the_arrays_matvec_reaches_are_differentiated(backend, how):
    """matvec's arrays, reached through a closure, a default argument, functools.partial or a bound
    method's object, all get their derivative (-u x^T), not a silent zero."""
    from functools import partial

    def f(a):
        xp = unigrad.namespace(a)
        b = xp.asarray(B_RHS, dtype=a.dtype)
        if how == "closure":
            matvec = lambda v: a @ v  # noqa: E731
        elif how == "default":
            matvec = lambda v, a=a: a @ v  # noqa: E731
        elif how == "partial":
            matvec = partial(lambda m, v: m @ v, a)
        else:
            matvec = _Operator(a).matvec
        return xp.sum(unigrad.linear_solve(matvec, b, symmetric=True))

    x = np.linalg.solve(A_SPD, B_RHS)
    u = np.linalg.solve(A_SPD, np.ones(4))
    np.testing.assert_allclose(_np(unigrad.grad(f, backend=backend)(A_SPD)), -np.outer(u, x),
                               rtol=_tolerance(backend) * 10, atol=1e-6)


def _newton_sqrt(init, a):
    x = init
    for _ in range(30):
        x = 0.5 * (x + a / x)
    return x


def test_a_root_whose_jacobian_is_transposed(backend):
    """x**2 - a = 0, solved by Newton's method: d sqrt(a) / da = 1 / (2 sqrt(a)) in both modes. Reverse mode
    transposes the optimality Jacobian (gmres, not symmetric) through a VJP of its JVP -- at a point where
    the tape's JVP of power is linear (see Operator.apply_transpose)."""
    root = unigrad.custom_root(lambda x, a: x ** 2 - a)(_newton_sqrt)
    a = np.array([4.0, 9.0, 2.0])
    want = np.diag(0.5 / np.sqrt(a))
    for mode in ("rev", "fwd"):
        jac = _np(unigrad.jacobian(lambda a: root(np.ones(3), a), mode=mode, backend=backend)(a))
        np.testing.assert_allclose(jac, want, rtol=_tolerance(backend) * 10, atol=1e-7)


def test_a_batch_of_root_problems_under_vmap(backend):
    """100 square roots at once: vmap of the gradient, and batched_jacobian. Inside vmap the linear solves
    have no values to iterate on and solve densely (Operator.primal)."""
    root = unigrad.custom_root(lambda x, a: x ** 2 - a)(_newton_sqrt)
    a = np.linspace(0.5, 10.0, 100)[:, None]

    def one(a):
        xp = unigrad.namespace(a)
        return xp.sum(root(xp.ones(a.shape, dtype=a.dtype), a))

    want = 0.5 / np.sqrt(a)
    np.testing.assert_allclose(_np(unigrad.vmap(unigrad.grad(one, backend=backend), backend=backend)(a)), want,
                               rtol=_tolerance(backend) if backend == "mlx" else 1e-9)
    per_example = unigrad.batched_jacobian(lambda a: root(unigrad.namespace(a).ones(a.shape, dtype=a.dtype), a),
                                           backend=backend)(a)
    np.testing.assert_allclose(_np(per_example).reshape(-1, 1), want, rtol=_tolerance(backend) if backend == "mlx" else 1e-9)


@pytest.mark.parametrize("solve", ["cg", "normal_cg", "gmres"])
@pytest.mark.parametrize("route", ["linear_solve", "custom_root"])
def test_compiled(backend, route, solve, monkeypatch):
    """compile=True: no values for a Python loop to read. CG (and CG on the normal equations) runs as the
    backend's compiled loop where it has one (JAX's lax.while_loop, TensorFlow's tf.while_loop), the other
    solvers and backends solve densely; all give the closed form."""
    if backend not in ("jax", "tensorflow"):
        pytest.skip("compile=True runs eagerly on this backend (the other tests cover it)")
    from unigrad.implicit import _linear_solve

    looped = []
    real = _linear_solve.looped_cg
    monkeypatch.setattr(_linear_solve, "looped_cg", lambda *a, **k: looped.append(1) or real(*a, **k))
    fn = functools.partial(loss_by_linear_solve if route == "linear_solve" else loss_by_root, solve=solve)
    _, gradient, _ = _ridge_closed_form(LAM)
    got = float(_np(unigrad.grad(fn, backend=backend, compile=True)(np.array(LAM))))
    np.testing.assert_allclose(got, gradient, rtol=1e-9)
    assert bool(looped) == (backend in ("jax", "tensorflow") and solve in ("cg", "normal_cg")), looped


def test_a_compiled_loop_that_does_not_converge_gives_nan():
    """In a compiled program the residual is symbolic: a CG loop that stops short (maxiter) cannot raise, so
    its solution comes out NaN -- loud, never a wrong number."""
    pytest.importorskip("jax")
    a_spd = unigrad.asarray(A_SPD, backend="jax")

    def total(b, maxiter=None):  # the gradient in b: A^{-1} 1 (A symmetric), by the transposed solve
        return unigrad.namespace(b).sum(unigrad.linear_solve(lambda v: a_spd @ v, b, maxiter=maxiter))

    b = np.asarray(B_RHS)
    short = unigrad.grad(functools.partial(total, maxiter=2), backend="jax", compile=True)(b)
    assert np.all(np.isnan(_np(short)))
    full = unigrad.grad(total, backend="jax", compile=True)(b)
    np.testing.assert_allclose(_np(full), np.linalg.solve(A_SPD, np.ones(4)), rtol=1e-9)


def test_a_non_converged_linear_solve_raises_or_warns():
    with pytest.raises(ConvergenceError, match="did not converge after 2 iterations") as info:
        unigrad.linear_solve(lambda v: A_SPD @ v, B_RHS, maxiter=2)
    assert info.value.residual > info.value.tolerance
    with pytest.warns(ConvergenceWarning, match="relative residual"):
        unigrad.linear_solve(lambda v: A_SPD @ v, B_RHS, maxiter=2, on_failure="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unigrad.linear_solve(lambda v: A_SPD @ v, B_RHS, maxiter=2, on_failure="ignore")
    # cg on an indefinite matrix stops and is caught, where it would return a wrong solution
    indefinite = np.diag([1.0, -2.0, 3.0, 0.5])
    with pytest.raises(ConvergenceError, match="cg needs a symmetric positive definite"):
        unigrad.linear_solve(lambda v: indefinite @ v, B_RHS)
    # a singular matrix: no solution to differentiate
    with pytest.raises(ConvergenceError):
        unigrad.linear_solve(lambda v: np.diag([1.0, 0.0, 1.0, 1.0]) @ v, B_RHS, solve="gmres")
    with pytest.raises(ValueError, match="solve must be one of"):
        unigrad.linear_solve(lambda v: v, B_RHS, solve="qr")


def test_a_non_converged_root_solver_is_refused_in_every_mode(backend):
    """A solver stopped after 3 iterations is not at a root: its derivative by the implicit function theorem
    would be wrong, so the call raises (the default) -- or warns."""
    def early(init, p):
        x = init
        for _ in range(3):
            x = _tanh_map(x, p)
        return x

    solver = unigrad.custom_fixed_point(_tanh_map)(early)
    p = np.array([0.3, -0.2, 0.5])
    with pytest.raises(ConvergenceError, match="not a root"):
        solver(np.zeros(3), p)
    with pytest.raises(ConvergenceError, match="not a root"):
        unigrad.grad(lambda p: unigrad.namespace(p).sum(solver(np.zeros(3), p)), backend=backend)(p)
    with pytest.raises(ConvergenceError, match="not a root"):
        unigrad.jacfwd(lambda p: solver(np.zeros(3), p), backend=backend)(p)
    warned = unigrad.custom_fixed_point(_tanh_map, on_failure="warn")(early)
    with pytest.warns(ConvergenceWarning, match="max \\|optimality"):
        warned(np.zeros(3), p)


def test_the_docs_example():
    """docs/implicit.md's ten-line example (also run by tests/test_docs.py), checked against the closed form."""
    from pathlib import Path
    import re

    text = (Path(__file__).parent.parent / "docs" / "implicit.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    scope: dict = {}
    exec(compile(code, "docs/implicit.md", "exec"), scope)
    a = scope["X"].T @ scope["X"] + 0.7 * np.eye(scope["X"].shape[1])
    w = np.linalg.solve(a, scope["X"].T @ scope["y"])
    r = scope["X_valid"] @ w - scope["y_valid"]
    np.testing.assert_allclose(_np(scope["g"]), r @ (scope["X_valid"] @ -np.linalg.solve(a, w)), rtol=1e-8)


# ------------------------------------------------------------------ pytrees of solutions, has_aux

def _intercept_ridge_closed_form(lam):
    """{"w", "b"} minimising 0.5 |X w + b - y|^2 + 0.5 lam |w|^2 (b not penalised), the validation loss, and
    its first and second derivatives in lam: theta = A^{-1} Xa^T y with Xa = [X, 1], A = Xa^T Xa + lam D."""
    xa, xva = np.hstack([X_TRAIN, np.ones((20, 1))]), np.hstack([X_VALID, np.ones((10, 1))])
    d = np.diag([1.0] * 4 + [0.0])
    a = xa.T @ xa + lam * d
    theta = np.linalg.solve(a, xa.T @ Y_TRAIN)
    dtheta = -np.linalg.solve(a, d @ theta)
    d2theta = -2 * np.linalg.solve(a, d @ dtheta)
    r = xva @ theta - Y_VALID
    return theta, 0.5 * r @ r, r @ (xva @ dtheta), (xva @ dtheta) @ (xva @ dtheta) + r @ (xva @ d2theta)


def _intercept_ridge_gradient(p, lam):  # a dict in, the same dict out: zero at the solution
    xp = unigrad.namespace(lam)
    x, y = _data(lam, X_TRAIN, Y_TRAIN)
    r = x @ p["w"] + p["b"] - y
    return {"w": xp.matrix_transpose(x) @ r + lam * p["w"], "b": xp.sum(r)}


def _intercept_ridge_solver(init, lam):  # plain code; b a 0-d array
    xp = unigrad.namespace(lam)
    (x, y), ones = _data(lam, X_TRAIN, Y_TRAIN), xp.ones((20, 1), dtype=lam.dtype)
    xa = xp.concat([x, ones], axis=1)
    d = xp.asarray(np.diag([1.0] * 4 + [0.0]), dtype=lam.dtype)
    theta = xp.linalg.solve(xp.matrix_transpose(xa) @ xa + lam * d, (xp.matrix_transpose(xa) @ y)[:, None])[:, 0]
    return {"w": theta[:4], "b": theta[4]}


def _intercept_validation_loss(p):
    xp = unigrad.namespace(p["w"])
    x, y = _data(p["w"], X_VALID, Y_VALID)
    r = x @ p["w"] + p["b"] - y
    return 0.5 * xp.sum(r * r)


def loss_by_dict_root(lam):
    p = unigrad.custom_root(_intercept_ridge_gradient, solve="cg", symmetric=True)(_intercept_ridge_solver)(None, lam)
    return _intercept_validation_loss(p)


def test_a_dict_solution_of_a_ridge_problem_with_an_intercept(backend):
    """custom_root on a solution {"w": (4,), "b": ()}: the value and the derivative in lam in both modes
    against the closed form (second order where the backend has it)."""
    theta, _, gradient, _ = _intercept_ridge_closed_form(LAM)
    rtol = _tolerance(backend)
    lam = np.array(LAM)
    p = unigrad.evaluate(lambda lam: unigrad.custom_root(_intercept_ridge_gradient)(_intercept_ridge_solver)(None, lam),
                         lam, backend=backend)
    assert isinstance(p, dict) and sorted(p) == ["b", "w"] and tuple(p["b"].shape) == ()
    np.testing.assert_allclose(_np(p["w"]), theta[:4], rtol=rtol)
    np.testing.assert_allclose(float(_np(p["b"])), theta[4], rtol=rtol)
    np.testing.assert_allclose(float(_np(unigrad.grad(loss_by_dict_root, backend=backend)(lam))), gradient,
                               rtol=rtol)
    # forward mode: the Jacobian of each leaf in lam, d theta / d lam = -A^{-1} D theta
    xa = np.hstack([X_TRAIN, np.ones((20, 1))])
    dtheta = -np.linalg.solve(xa.T @ xa + LAM * np.diag([1.0] * 4 + [0.0]), np.append(theta[:4], 0.0))
    jac = unigrad.jacfwd(lambda lam: unigrad.custom_root(_intercept_ridge_gradient)(_intercept_ridge_solver)(
        None, lam), backend=backend)(lam)
    np.testing.assert_allclose(_np(jac["w"]), dtheta[:4], rtol=rtol * 10, atol=1e-9)
    np.testing.assert_allclose(float(_np(jac["b"])), dtheta[4], rtol=rtol * 10, atol=1e-9)


def test_a_dict_solution_second_derivative(backend):
    if backend in NO_SECOND_ORDER:
        pytest.skip(f"{backend}: see NO_SECOND_ORDER")
    _, _, _, second = _intercept_ridge_closed_form(LAM)
    np.testing.assert_allclose(float(_np(unigrad.hessian(loss_by_dict_root, backend=backend)(np.array(LAM)))),
                               second, rtol=1e-8)


M_BLOCK = _spd(5)  # the system on a tuple (v: (4,), s: ()): [[M11, m12], [m12^T, m22]] [v; s] = [b1; b2]


def _block_matvec(m):
    return lambda t: (m[:4, :4] @ t[0] + m[:4, 4] * t[1], unigrad.namespace(m).sum(m[4, :4] * t[0]) + m[4, 4] * t[1])


def test_a_tuple_solution_of_linear_solve(backend):
    """linear_solve with b a tuple (a (4,) array, a 0-d array) and a matvec on that structure: the solution,
    and the gradient in b (u = M^{-1} g) and in the closed-over matrix (-u x^T) against NumPy, in both modes."""
    b1, b2 = B_RHS, np.array(0.8)
    x = np.linalg.solve(M_BLOCK, np.append(b1, b2))

    def f(m, b):
        xp = unigrad.namespace(m)
        v, s = unigrad.linear_solve(_block_matvec(m), b, symmetric=True)
        return xp.sum(xp.sin(v)) + 2.0 * s

    rtol = _tolerance(backend)
    got = unigrad.evaluate(lambda m, b: unigrad.linear_solve(_block_matvec(m), b, solve="gmres"), M_BLOCK, (b1, b2),
                           backend=backend)
    assert isinstance(got, tuple) and tuple(got[1].shape) == ()
    np.testing.assert_allclose(np.append(_np(got[0]), _np(got[1])), x, rtol=rtol)
    u = np.linalg.solve(M_BLOCK, np.append(np.cos(x[:4]), 2.0))
    gm, (gb1, gb2) = unigrad.grad(f, argnums=(0, 1), backend=backend)(M_BLOCK, (b1, b2))
    np.testing.assert_allclose(_np(gm), -np.outer(u, x), rtol=rtol * 10, atol=1e-7)
    np.testing.assert_allclose(np.append(_np(gb1), _np(gb2)), u, rtol=rtol * 10)
    # forward mode: the tangent along one direction of (M, b)
    dm, db1, db2 = RNG.standard_normal((5, 5)), RNG.standard_normal(4), np.array(0.3)
    _, tangent = unigrad.jvp(f, (M_BLOCK, (b1, b2)), (dm, (db1, db2)), backend=backend)
    dx = np.linalg.solve(M_BLOCK, np.append(db1, db2) - dm @ x)
    np.testing.assert_allclose(float(_np(tangent)), np.append(np.cos(x[:4]), 2.0) @ dx, rtol=rtol * 10)


def test_a_tuple_solution_of_a_fixed_point(backend):
    """custom_fixed_point on a tuple (x, y) = (tanh(W x + p), 0.5 cos(y) + q): finite differences at first
    order (second on the tape and JAX), and the derivative of the unrolled iterations."""
    def t(z, p, q):
        xp = unigrad.namespace(p)
        return _tanh_map(z[0], p), 0.5 * xp.cos(z[1]) + q

    def iterate(init, p, q):
        z = init
        for _ in range(100):
            z = t(z, p, q)
        return z

    solver = unigrad.custom_fixed_point(t)(iterate)

    def fn(p, q):
        xp = unigrad.namespace(p)
        x, y = solver((xp.zeros(3, dtype=p.dtype), xp.zeros(2, dtype=p.dtype)), p, q)
        return xp.concat([x, y * y])

    p, q = np.array([0.3, -0.2, 0.5]), np.array([0.1, 0.4])
    order = 2 if backend in ("numpy", "jax") else 1
    if backend not in NO_SECOND_ORDER:
        check_grads(fn, (p, q), order=order, backend=backend)
    implicit = unigrad.jacobian(fn, argnums=(0, 1), backend=backend)(p, q)

    def unrolled(p, q):
        xp = unigrad.namespace(p)
        x, y = iterate((xp.zeros(3, dtype=p.dtype), xp.zeros(2, dtype=p.dtype)), p, q)
        return xp.concat([x, y * y])

    want = unigrad.jacobian(unrolled, argnums=(0, 1), backend=backend)(p, q)
    for got, expected in zip(implicit, want):
        np.testing.assert_allclose(_np(got), _np(expected), rtol=_tolerance(backend) * 100, atol=1e-6)


def test_has_aux_returns_aux_undifferentiated(backend):
    """has_aux=True: the solver returns (x, aux); aux comes back as the solver gave it (a Python count, an
    array of the backend) with a zero derivative, x with the implicit one (1 / (2 sqrt a)); also compiled."""
    def newton(init, a):
        x = _newton_sqrt(init, a)
        return x, {"iterations": 30, "a_seen": a * 1.0, "x": x}

    def with_an_integer_array(init, a):
        return _newton_sqrt(init, a), unigrad.namespace(a).asarray([30])

    root = unigrad.custom_root(lambda x, a: x ** 2 - a, has_aux=True)(newton)
    a = np.array([4.0, 9.0])

    def f(a):
        xp = unigrad.namespace(a)
        x, aux = root(xp.ones(a.shape, dtype=a.dtype), a)
        return xp.sum(x) + xp.sum(aux["x"]) + xp.sum(aux["a_seen"]), aux

    rtol = _tolerance(backend)
    for compile_ in ((False, True) if backend in ("jax", "tensorflow") else (False,)):
        g, aux = unigrad.grad(f, has_aux=True, backend=backend, compile=compile_)(a)
        np.testing.assert_allclose(_np(g), 0.5 / np.sqrt(a), rtol=rtol)  # aux adds nothing
        assert aux["iterations"] == 30
        np.testing.assert_allclose(_np(aux["x"]), np.sqrt(a), rtol=rtol)
        np.testing.assert_allclose(_np(aux["a_seen"]), a, rtol=rtol)
    jac = unigrad.jacfwd(lambda a: root(unigrad.namespace(a).ones(a.shape, dtype=a.dtype), a)[0], backend=backend)(a)
    np.testing.assert_allclose(_np(jac), np.diag(0.5 / np.sqrt(a)), rtol=rtol, atol=1e-7)
    with pytest.raises(TypeError, match=r"has_aux=True the solver must return a pair \(x, aux\); got ndarray"):
        unigrad.custom_root(lambda x, a: x ** 2 - a, has_aux=True)(_newton_sqrt)(np.ones(2), a)
    # an integer array in aux: kept where it has a value; refused in a compiled program (it would leak)
    counted = unigrad.custom_root(lambda x, a: x ** 2 - a, has_aux=True)(with_an_integer_array)

    def g(a):
        x, steps = counted(unigrad.namespace(a).ones(a.shape, dtype=a.dtype), a)
        return unigrad.namespace(a).sum(x), steps

    if backend in ("jax", "tensorflow"):
        with pytest.raises(TypeError, match=r"aux leaf \(the root\) is a symbolic .* array of dtype int"):
            unigrad.grad(g, has_aux=True, backend=backend, compile=True)(a)
    gradient, steps = unigrad.grad(g, has_aux=True, backend=backend)(a)
    np.testing.assert_allclose(_np(gradient), 0.5 / np.sqrt(a), rtol=rtol)
    assert _np(steps).tolist() == [30]


def test_pytree_solution_errors_name_the_leaves():
    """Mixed dtypes, integer leaves, and an optimality or matvec of another structure or shape: TypeError or
    ValueError naming what is wrong, never a silent promotion."""
    two = np.array([4.0, 9.0])
    mixed = unigrad.custom_root(lambda x, a: x)(lambda init, a: {"u": a, "v": a.astype(np.float32)})
    with pytest.raises(TypeError, match=r"share one floating dtype.*\['u'\]: float64, \['v'\]: float32"):
        mixed(None, two)
    integer = unigrad.custom_root(lambda x, a: x)(lambda init, a: (a, np.arange(2)))
    with pytest.raises(TypeError, match=r"leaf \[1\] has dtype int64"):
        integer(None, two)
    other = unigrad.custom_root(lambda x, a: x["u"])(lambda init, a: {"u": a})
    with pytest.raises(TypeError, match="optimality.*has structure.*solution's structure"):
        other(None, two)
    shape = unigrad.custom_root(lambda x, a: {"u": x["u"][:1]})(lambda init, a: {"u": a})
    with pytest.raises(ValueError, match=r"optimality.*shape \(1,\) at leaf \['u'\].*shape \(2,\)"):
        shape(None, two)
    with pytest.raises(TypeError, match=r"linear_solve: b: .*share one floating dtype"):
        unigrad.linear_solve(lambda t: t, (two, two.astype(np.float32)))
    with pytest.raises(TypeError, match=r"matvec\(v\) has structure"):
        unigrad.linear_solve(lambda t: t[0], (two, two))


def test_the_docs_pytree_example():
    """docs/implicit.md's dict-solution example, against the closed form d theta / d lam = -A^{-1} D theta."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "implicit.md").read_text()
    code = next(c for c in re.findall(r"```python\n(.*?)```", text, flags=re.S) if 'p["w"]' in c)
    scope: dict = {}
    exec(compile(code, "docs/implicit.md", "exec"), scope)
    xa = np.hstack([scope["X"], np.ones((30, 1))])
    d = np.diag([1.0, 1.0, 1.0, 0.0])
    a = xa.T @ xa + 0.7 * d
    want = -np.linalg.solve(a, d @ np.linalg.solve(a, xa.T @ scope["y"]))
    np.testing.assert_allclose(np.append(_np(scope["jac"]["w"]), _np(scope["jac"]["b"])), want, rtol=1e-8)


def _fixed_point_loss(p):
    """0.5 |z|^2 at z = tanh(W z + p): a non-symmetric d_x F, solved by normal-equation CG."""
    xp = unigrad.namespace(p)
    z = unigrad.custom_fixed_point(_tanh_map, solve="normal_cg")(_iterate)(xp.zeros_like(p), p)
    return 0.5 * xp.sum(z * z)


@pytest.mark.parametrize("solve", ["cg", "gmres", "normal_cg"])
def test_torch_iterates_with_plain_autograd_products_and_checks_them(monkeypatch, solve):
    """On torch the iterative solvers' products come from one recording, by plain ``torch.autograd.grad``
    (``linear_products``: ``J^T u`` a backward pass, ``J v`` the backward pass differentiated in its
    cotangent), not ``torch.func``'s transforms -- d_x F for custom_root, at the solution: the same
    derivatives (closed forms, finite differences). Their answers stand checked: the residual is checked
    with the operator itself, so a wrong product is a ConvergenceError, never a wrong derivative."""
    pytest.importorskip("torch")
    import torch

    b = type(unigrad.get_backend("torch"))
    real = b.linear_products
    served = []

    def spy(self, f, point):
        out = real(self, f, point)
        served.append(out is not None)
        return out
    monkeypatch.setattr(b, "linear_products", spy)
    lam = torch.tensor(LAM, dtype=torch.float64)
    _, gradient, _ = _ridge_closed_form(LAM)
    for fn in (loss_by_linear_solve, loss_by_root):
        del served[:]
        got = unigrad.grad(functools.partial(fn, solve=solve), backend="torch")(lam)
        np.testing.assert_allclose(float(got), gradient, rtol=1e-8)
        assert served and all(served), served
    p = np.array([0.3, -0.2, 0.5])
    del served[:]
    check_grads(_fixed_point_loss, (p,), order=1, modes=("rev",), backend="torch")
    assert served and all(served), served
    # second order: the rules differentiated (where a torch.func transform runs, the hook stands aside)
    h = unigrad.hessian(functools.partial(loss_by_root, solve=solve), backend="torch")(lam)
    np.testing.assert_allclose(float(h), _ridge_closed_form(LAM)[2], rtol=1e-7)

    def wrong(self, f, point):  # J v and J^T u doubled: the iterations solve 2 A x = b
        out = real(self, f, point)
        return None if out is None else tuple((lambda v, g=g: 2.0 * g(v)) for g in out)
    monkeypatch.setattr(b, "linear_products", wrong)
    for fn in (loss_by_linear_solve, loss_by_root):
        with pytest.raises(ConvergenceError, match="did not converge"):
            unigrad.grad(functools.partial(fn, solve=solve), backend="torch")(lam)
    # a transposed solve (a gradient through a non-symmetric d_x F): its residual by the core's own A^T, where it
    # was checked with the same doubled products and passed
    with pytest.raises(ConvergenceError, match="did not converge"):
        unigrad.grad(_fixed_point_loss, backend="torch")(torch.tensor(p))


def test_torch_third_derivatives_through_a_non_linear_root():
    """Reverse over reverse over reverse through custom_fixed_point (d_x F non-symmetric and not constant) on torch
    against the tape: a transposed operator transposed again kept the Jacobian of the operator two transposes back
    for torch's linear_products, which then solved with A^T where A was asked (2-4% off, silently); (A^T)^T is now
    A itself (``Operator.transposed_from``)."""
    pytest.importorskip("torch")
    fn, lam = _ROUTES["custom_fixed_point"], np.array(LAM)

    def third(backend):
        return float(_np(unigrad.jacrev(unigrad.jacrev(unigrad.jacrev(fn, backend=backend), backend=backend),
                                        backend=backend)(lam)))
    np.testing.assert_allclose(third("torch"), third("numpy"), rtol=1e-8)
    grad3 = unigrad.grad(unigrad.grad(unigrad.grad(fn, backend="torch"), backend="torch"), backend="torch")(lam)
    np.testing.assert_allclose(float(_np(grad3)), third("numpy"), rtol=1e-8)


def test_a_batch_of_pytree_root_problems_under_vmap(backend):
    """A dict solution, {"r": sqrt(a), "c": cbrt(a)}, for 50 values of a at once: vmap of the gradient and
    batched_jacobian against the closed forms (the ravelled solution inside vmap, where the linear solves
    have no values to iterate on)."""

    def optimality(z, a):
        return {"r": z["r"] ** 2 - a, "c": z["c"] ** 3 - a}

    def newton(init, a):
        z = dict(init)
        for _ in range(60):
            z = {"r": z["r"] - (z["r"] ** 2 - a) / (2 * z["r"]), "c": z["c"] - (z["c"] ** 3 - a) / (3 * z["c"] ** 2)}
        return z

    root = unigrad.custom_root(optimality, solve="lu")(newton)
    a = np.linspace(0.5, 10.0, 50)[:, None]

    def both(a):
        xp = unigrad.namespace(a)
        one = xp.ones(a.shape, dtype=a.dtype)
        z = root({"r": one, "c": one}, a)
        return xp.concat([z["r"], 2.0 * z["c"]], axis=-1)

    want = np.hstack([0.5 / np.sqrt(a), 2.0 / (3.0 * np.cbrt(a) ** 2)])  # d/da of sqrt(a), 2 cbrt(a)
    got = unigrad.vmap(unigrad.jacobian(both, backend=backend), backend=backend)(a)
    np.testing.assert_allclose(_np(got).reshape(50, 2), want, rtol=_tolerance(backend) if backend == "mlx" else 1e-9)
    per_example = unigrad.batched_jacobian(both, backend=backend)(a)
    np.testing.assert_allclose(_np(per_example).reshape(50, 2), want, rtol=_tolerance(backend) if backend == "mlx" else 1e-9)


def test_torch_products_fall_back_where_a_backward_is_not_differentiable():
    """A matvec through a custom torch.autograd.Function marked once_differentiable: ``J v`` by the
    recording's double backward cannot run, so the solver's products fall back to the matvec itself, and
    the solution and its gradient are still the closed forms (non-symmetric A, GMRES and normal CG)."""
    torch = pytest.importorskip("torch")
    from torch.autograd.function import once_differentiable

    a_np = np.array([[3.0, 1.0, 0.0], [0.5, 2.0, 0.3], [0.0, -0.4, 1.5]])
    a = torch.tensor(a_np)

    class Apply(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            return a @ v

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            return a.T @ g

    b_np = np.array([1.0, -2.0, 0.5])
    for solve in ("gmres", "normal_cg"):
        def loss(b):
            x = unigrad.linear_solve(Apply.apply, b, solve=solve)
            return (x * x).sum()
        b = torch.tensor(b_np)
        x = np.linalg.solve(a_np, b_np)
        np.testing.assert_allclose(float(loss(b)), x @ x, rtol=1e-8)
        got = unigrad.grad(loss, backend="torch")(b)
        np.testing.assert_allclose(got.numpy(), 2 * np.linalg.solve(a_np.T, x), rtol=1e-7)
