"""A bilevel hyperparameter problem: the regularisation strength of logistic regression, tuned by gradient.

Inner problem: L2-regularised logistic regression on a training set,
``w*(t) = argmin_w  sum_i log(1 + exp(x_i.w)) - y_i x_i.w + exp(t)/2 |w|^2``, solved by Newton's
method as plain code (no derivative goes through its iterations). Its optimality condition is the
inner gradient ``X^T (sigmoid(X w) - y) + exp(t) w = 0`` (``unigrad.custom_root``; its Jacobian in
``w`` is the inner Hessian, symmetric positive definite, so the derivative's linear solves are
``cg``). Outer problem: the validation loss of ``w*(t)``, differentiated with respect to the
log-regularisation ``t`` by the implicit function theorem, and a few steps of gradient descent on it.

``main()`` runs the outer loop on every installed backend whose custom rules take nested
derivatives (a backend that cannot raises NotImplementedError and is reported as left out), and
asserts that

- the hypergradient agrees with a central finite difference of the validation loss through the
  whole Newton solver,
- every backend takes the same outer steps (float64 to 1e-10; float32 on MLX to 1e-4),
- the validation loss went down.

Run it:  python examples/bilevel_logistic.py
"""

from __future__ import annotations

import numpy as np

import unigrad

NEWTON_STEPS = 12  # quadratic convergence from w = 0: the inner gradient is at rounding after 6 to 8
OUTER_STEPS, OUTER_RATE = 4, 2.0


def _data(like, *arrays):
    xp = unigrad.namespace(like)
    return [xp.asarray(a, dtype=like.dtype) for a in arrays]


def _sigmoid(xp, z):
    return 1 / (1 + xp.exp(-z))


def inner_gradient(w, t, x, y):
    """The optimality condition: the inner objective's gradient in w, zero at its minimiser."""
    xp = unigrad.namespace(w, t)
    return xp.matrix_transpose(x) @ (_sigmoid(xp, x @ w) - y) + xp.exp(t) * w


@unigrad.custom_root(inner_gradient, solve="cg", symmetric=True)
def fit(init, t, x, y):
    """Newton's method on the inner problem: plain code, run on whatever arrays it is given."""
    xp = unigrad.namespace(t, x)
    w = init
    eye = xp.eye(x.shape[1], dtype=x.dtype)
    for _ in range(NEWTON_STEPS):
        p = _sigmoid(xp, x @ w)
        hessian = xp.matrix_transpose(x) @ (x * (p * (1 - p))[:, None]) + xp.exp(t) * eye
        w = w - xp.linalg.solve(hessian, inner_gradient(w, t, x, y)[:, None])[:, 0]
    return w


def validation_loss(t, data):
    """The outer objective: the mean logistic loss on the validation set of the inner solution w*(t)."""
    xp = unigrad.namespace(t)
    x_train, y_train, x_valid, y_valid = _data(t, *data)
    w = fit(xp.zeros(x_train.shape[1], dtype=t.dtype), t, x_train, y_train)
    z = x_valid @ w
    return xp.mean(xp.log(1 + xp.exp(z)) - y_valid * z)


def problem(seed=0, train=40, valid=200, features=8):
    """Training and validation sets (NumPy float64), labels in {0, 1} from a noisy linear model."""
    rng = np.random.default_rng(seed)
    truth = rng.standard_normal(features)
    sets = []
    for n in (train, valid):
        x = rng.standard_normal((n, features))
        y = (x @ truth + 2.0 * rng.standard_normal(n) > 0).astype(np.float64)
        sets += [x, y]
    return tuple(sets)


def outer_descent(backend, t0=-2.0, steps=OUTER_STEPS):
    """Gradient descent on t: the (t, loss, hypergradient) of each step, as floats."""
    data, t, history = problem(), np.array(t0), []
    step = unigrad.value_and_grad(validation_loss, backend=backend)
    for _ in range(steps):
        value, g = step(t, data)
        value, g = float(unigrad.to_numpy(value)), float(unigrad.to_numpy(g))
        history.append((float(t), value, g))
        t = t - OUTER_RATE * g
    return history


def finite_difference(t, h=1e-5):
    """The hypergradient by a central difference through the whole Newton solver (the NumPy arrays)."""
    data = problem()
    return (float(validation_loss(np.array(t + h), data)) - float(validation_loss(np.array(t - h), data))) / (2 * h)


def main(backends=None):
    """Run on ``backends`` (names; default every installed backend): {name: result}, {name: why it was left out}."""
    installed = backends or [name for name, info in unigrad.backends().items() if info["available"]]
    installed = ["numpy"] + [name for name in installed if name != "numpy"]  # the NumPy tape first: the reference
    results, left_out = {}, {}
    for name in installed:
        try:
            history = outer_descent(name)
        except NotImplementedError as error:  # a refusal, never a wrong number (see the docstring)
            left_out[name] = str(error)
            print(f"{name:>10}: left out: {str(error).splitlines()[0]}")
            continue
        results[name] = history
        (t0, v0, g0), (t1, v1, _) = history[0], history[-1]
        line = (f"{name:>10}: t {t0:+.6f} -> {t1:+.6f}, validation loss {v0:.10f} -> {v1:.10f}, "
                f"first dloss/dt = {g0:+.6e}")
        if name == "numpy":
            worst = 0.0
            for t, _, g in history:
                fd = finite_difference(t)
                worst = max(worst, abs(fd - g))
                assert abs(fd - g) <= 1e-7 * max(abs(fd), 1e-3), (t, g, fd)
            line += f"  (max |hypergradient - finite difference| = {worst:.1e})"
        else:
            tol = 1e-10 if unigrad.get_backend(name).capabilities.float64 else 1e-4
            diff = max(abs(a - b) for row, ref in zip(history, results["numpy"]) for a, b in zip(row, ref))
            assert diff < tol, (name, diff)
            line += f"  (max |difference| from numpy: {diff:.1e})"
        assert history[-1][1] < history[0][1], (name, history)  # the outer loop lowers the validation loss
        print(line)
    return results, left_out


if __name__ == "__main__":
    main()
