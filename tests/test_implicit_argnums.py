"""custom_root / custom_fixed_point with argnums: which params are differentiated, the others constants of
the implicit rule (zero derivative at every order, any Python value allowed), against the closed form of
x = (a b)^(1/p), the root of x^p - a b."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import unigrad
from unigrad.implicit import _linear_solve

BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(module is not None and importlib.util.find_spec(module) is None,
                                                       reason=f"{module} is not installed"))
            for name, module in [("numpy", None), ("torch", "torch"), ("jax", "jax"), ("tensorflow", "tensorflow")]]
A, B = np.array([2.0, 3.0, 0.5]), np.array([5.0, 1.5, 4.0])


def newton(init, a, b, p, options):
    """x with x**p = a*b by Newton's method (plain code); p a Python int, options a dict or None."""
    options = options or {"steps": 25, "method": "newton"}
    assert options["method"] == "newton"
    x = init
    for _ in range(options["steps"]):
        x = x - (x ** p - a * b) / (p * x ** (p - 1))
    return x


def optimality(x, a, b, p, options):
    return x ** p - a * b


def root(argnums):
    return unigrad.custom_root(optimality, argnums=argnums)(newton)


def solve(solver, a, b, p=3, options=None):
    return solver(unigrad.namespace(a).ones(a.shape, dtype=a.dtype), a, b, p, options)


def closed_form(a, b, p):
    """x and its first and second derivatives in a and b (elementwise)."""
    x = (a * b) ** (1.0 / p)
    q = 1.0 / p
    return x, x * q / a, x * q / b, x * q * (q - 1) / a ** 2, x * q * q / (a * b), x * q * (q - 1) / b ** 2


def _np(x):
    return np.asarray(unigrad.to_numpy(x))


# every argnums on the tape; one param and both on the others (the default is tests/test_implicit.py's)
FIRST_ORDER = [("numpy", argnums) for argnums in (None, 1, 2, (1, 2), (-3,))] + [
    pytest.param(backend.values[0], argnums, marks=backend.marks)
    for backend in BACKENDS[1:] for argnums in (1, (1, 2))]


@pytest.mark.parametrize("backend, argnums", FIRST_ORDER, ids=str)
def test_first_derivatives_in_both_modes(backend, argnums):
    """Jacobians in a and b (forward and reverse) and a gradient: the closed form for the params argnums
    names (-3 of the 4 params is b), exactly zero for the other array param, though the transform asks."""
    solver = root(argnums)
    named = {None: {1, 2}, 1: {1}, 2: {2}, (1, 2): {1, 2}, (-3,): {2}}[argnums]
    _, da, db, *_ = closed_form(A, B, 3)
    want = [np.diag(da) if 1 in named else np.zeros((3, 3)), np.diag(db) if 2 in named else np.zeros((3, 3))]
    for mode in ("fwd", "rev"):
        jac = unigrad.jacobian(lambda a, b: solve(solver, a, b), argnums=(0, 1), mode=mode, backend=backend)(A, B)
        for got, expected, position in zip(jac, want, (1, 2)):
            if position in named:
                np.testing.assert_allclose(_np(got), expected, rtol=1e-9, atol=1e-12)
            else:
                assert np.all(_np(got) == 0.0), (mode, position, _np(got))
    grads = unigrad.grad(lambda a, b: unigrad.namespace(a).sum(solve(solver, a, b)), argnums=(0, 1),
                         backend=backend)(A, B)
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(_np(got), expected.sum(axis=0), rtol=1e-9, atol=0)


@pytest.mark.parametrize("mode", ["fwd-rev", "rev-rev"])
@pytest.mark.parametrize("argnums", [1, (1, 2)], ids=str)
@pytest.mark.parametrize("backend", [BACKENDS[0], BACKENDS[1], BACKENDS[2]])
def test_second_derivatives(backend, argnums, mode):
    """The Hessian in (a, b) of sum(w * x): with argnums=(1, 2) the closed form; with argnums=1 that of the
    solution with b frozen -- the a-a block only, the mixed and b-b blocks exactly zero (symmetric: the
    rules see b as a constant too, not only x's first derivative)."""
    solver = root(argnums)
    w = np.array([1.0, -2.0, 0.5])
    _, _, _, daa, dab, dbb = closed_form(A, B, 3)
    both = argnums == (1, 2)
    want = [[np.diag(w * daa), np.diag(w * dab) if both else np.zeros((3, 3))],
            [np.diag(w * dab) if both else np.zeros((3, 3)), np.diag(w * dbb) if both else np.zeros((3, 3))]]

    def f(a, b):
        return unigrad.namespace(a).sum(unigrad.namespace(a).asarray(w) * solve(solver, a, b))

    hess = unigrad.hessian(f, argnums=(0, 1), mode=mode, backend=backend)(A, B)
    for i in range(2):
        for j in range(2):
            got = _np(hess[i][j])
            if both or i == j == 0:
                np.testing.assert_allclose(got, want[i][j], rtol=1e-8, atol=1e-12)
            else:
                assert np.all(got == 0.0), (i, j, got)


def test_constants_may_be_any_python_value_and_default_argnums_still_differentiates_every_array():
    """Non-array params (an int power, a dict of options with a string, None, a pytree param holding an int)
    pass to the solver and the optimality function as they are; without argnums every floating-point array
    leaf of every param is differentiated (before argnums, an int param made every derivative raise)."""
    x, da, db, *_ = closed_form(A, B, 2)
    options = {"steps": 40, "method": "newton"}
    default = root(None)
    np.testing.assert_allclose(_np(solve(default, A, B, 2, options)), x, rtol=1e-12)
    jac = unigrad.jacobian(lambda a, b: solve(default, a, b, 2, options), argnums=(0, 1))(A, B)
    np.testing.assert_allclose(_np(jac[0]), np.diag(da), rtol=1e-9)
    np.testing.assert_allclose(_np(jac[1]), np.diag(db), rtol=1e-9)

    @unigrad.custom_root(lambda x, ab, scale: x ** ab["p"] - ab["a"] * ab["b"] * scale, argnums=1)
    def tree_solver(init, ab, scale):  # a dict param with an int leaf; scale (a float array) not in argnums
        return newton(init, ab["a"], ab["b"] * scale, ab["p"], None)

    scale = np.array(1.0)
    cts = unigrad.grad(lambda ab, s: np.sum(tree_solver(np.ones(3), {**ab, "p": 3}, s)), argnums=(0, 1))(
        {"a": A, "b": B}, scale)
    _, da3, db3, *_ = closed_form(A, B, 3)
    np.testing.assert_allclose(_np(cts[0]["a"]), da3, rtol=1e-9)
    np.testing.assert_allclose(_np(cts[0]["b"]), db3, rtol=1e-9)
    assert float(_np(cts[1])) == 0.0
    jac = unigrad.jacfwd(lambda ab, s: tree_solver(np.ones(3), {**ab, "p": 3}, s), argnums=(0, 1))(
        {"a": A, "b": B}, scale)
    np.testing.assert_allclose(_np(jac[0]["a"]), np.diag(da3), rtol=1e-9)
    np.testing.assert_allclose(_np(jac[0]["b"]), np.diag(db3), rtol=1e-9)
    assert np.all(_np(jac[1]) == 0.0)
    # with has_aux: aux as the solver gave it, x differentiated in b only
    counted = unigrad.custom_root(optimality, argnums=2, has_aux=True)(
        lambda init, a, b, p, options: (newton(init, a, b, p, options), {"steps": 25, "method": "newton"}))
    (ga, gb), aux = unigrad.grad(lambda a, b: (lambda x, aux: (np.sum(x), aux))(*solve(counted, a, b)),
                                 argnums=(0, 1), has_aux=True)(A, B)
    assert aux == {"steps": 25, "method": "newton"} and np.all(_np(ga) == 0.0)
    np.testing.assert_allclose(_np(gb), db3, rtol=1e-9)
    # argnums naming only the int param: nothing is differentiated, every derivative is zero
    for mode in ("fwd", "rev"):
        for block in unigrad.jacobian(lambda a, b: solve(root(3), a, b), argnums=(0, 1), mode=mode)(A, B):
            assert np.all(_np(block) == 0.0)


def test_only_the_argnums_params_enter_d_params_F(monkeypatch):
    """The speed point: the VJP and JVP of F in the params are taken over the params argnums names only."""
    sizes = []  # (the rules' nested transforms: unigrad.implicit._linear_solve's held_vjp / held_jvp take them)
    real_vjp, real_jvp = _linear_solve._vjp, _linear_solve._jvp
    monkeypatch.setattr(_linear_solve, "_vjp",
                        lambda f, *p, **k: sizes.append(("vjp", len(p))) or real_vjp(f, *p, **k))
    monkeypatch.setattr(_linear_solve, "_jvp",
                        lambda f, p, t, **k: sizes.append(("jvp", len(p))) or real_jvp(f, p, t, **k))
    for argnums, n in ((2, 1), ((1, 2), 2)):
        sizes.clear()
        unigrad.grad(lambda a, b: np.sum(solve(root(argnums), a, b)), argnums=(0, 1))(A, B)
        unigrad.jacfwd(lambda a, b: solve(root(argnums), a, b), argnums=(0, 1))(A, B)
        # (the matvecs' JVPs in x have one primal; d_params F's are the others)
        assert ("vjp", n) in sizes and ("jvp", n) in sizes, sizes
        assert all(count in (1, n) for _, count in sizes), sizes


def test_fixed_point_with_argnums():
    """custom_fixed_point passes argnums on: the Newton map's fixed point, differentiated in b only."""
    def newton_map(x, a, b, p, options):
        return x - (x ** p - a * b) / (p * x ** (p - 1))

    solver = unigrad.custom_fixed_point(newton_map, argnums=(2,))(newton)
    _, _, db, *_ = closed_form(A, B, 3)
    jac = unigrad.jacrev(lambda a, b: solve(solver, a, b), argnums=(0, 1))(A, B)
    assert np.all(_np(jac[0]) == 0.0)
    np.testing.assert_allclose(_np(jac[1]), np.diag(db), rtol=1e-9)


def test_bad_argnums_are_refused():
    for bad in ("1", 1.0, True, (), (1, "2"), [1, None]):
        with pytest.raises(TypeError, match=r"custom_root: argnums must be None, an int or a non-empty tuple of "
                                            r"ints \(positions in solver\(init, \*params\), init being 0\); got"):
            unigrad.custom_root(optimality, argnums=bad)
    with pytest.raises(ValueError, match=r"argnums=0 names position 0, init .* the params are positions 1, 2"):
        unigrad.custom_root(optimality, argnums=0)
    with pytest.raises(ValueError, match=r"argnums=\(1, 0\) names position 0"):
        unigrad.custom_fixed_point(optimality, argnums=(1, 0))
    for bad, what in ((5, "5, no argument"), (-5, "-5, init \\(position 0\\)"), ((1, -6), "-6, no argument")):
        with pytest.raises(ValueError, match=rf"newton: argnums names position {what}: the solver was called as "
                                             rf"solver\(init, \*params\) with 4 params, so argnums must lie in "
                                             rf"1..4 \(or -4..-1 from the end\); init has no derivative"):
            solve(root(bad), A, B)
    with pytest.raises(ValueError, match=r"newton: argnums=\(2, -3\) names param 2 twice"):
        solve(root((2, -3)), A, B)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_with_a_new_constant_gives_the_new_answer(backend):
    """compile=True: a new value of a param outside argnums -- the int power (a static argument: a program of
    its own), the array b (an input of the program), a Python float scale (a dynamic weak scalar) --
    gives the new solution and derivative, never the first program's."""
    @unigrad.custom_root(lambda x, a, b, p, scale: x ** p - a * b * scale, argnums=1)
    def scaled(init, a, b, p, scale):
        return newton(init, a, b * scale, p, None)

    def value_and_derivative(a, b, p, scale):
        xp = unigrad.namespace(a)
        return xp.sum(scaled(xp.ones(a.shape, dtype=a.dtype), a, b, p, scale))

    g = unigrad.value_and_grad(value_and_derivative, backend=backend, compile=True)
    for b, p, scale in ((B, 3, 1.0), (B, 2, 1.0), (2 * B, 2, 1.0), (2 * B, 2, 0.5), (B, 3, 1.0)):
        x, da, *_ = closed_form(A, b * scale, p)
        value, gradient = g(A, b, p, scale)
        np.testing.assert_allclose(float(_np(value)), x.sum(), rtol=1e-9)
        np.testing.assert_allclose(_np(gradient), da, rtol=1e-9)
