"""Least squares by gradient descent -- the gradient of a scalar loss, never a Jacobian.

The loss of a linear model, ``mean((X @ w + b - y) ** 2)``, is a scalar; ``unigrad.grad`` returns
its gradient with respect to ``(w, b)`` from ONE reverse sweep (a vector-Jacobian product with
the cotangent 1), at a small multiple of the forward pass's cost. The residuals' Jacobian, a
(samples x features) matrix, is never formed.

Run it:    python examples/linear_regression.py [backend]
Check it:  unigrad check examples/linear_regression.py:loss
"""

import sys

import numpy as np

import unigrad


def loss(w, b, X, y):
    """Mean squared error of the linear model X @ w + b."""
    xp = unigrad.namespace(w, X)
    residual = xp.matmul(X, w) + b - y
    return xp.mean(residual ** 2)


def loss_inputs(seed=0, samples=200, features=5):
    """Noisy data from known weights; starting parameters at zero (float64)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((samples, features))
    true_w, true_b = rng.standard_normal(features), 0.5
    y = X @ true_w + true_b + 0.01 * rng.standard_normal(samples)
    return np.zeros(features), np.zeros(()), X, y


def fit(backend=None, learning_rate=0.3, tolerance=1e-10, max_steps=500):
    """Gradient descent on (w, b) until the gradient is below ``tolerance``; returns NumPy arrays."""
    w, b, X, y = loss_inputs()
    X, y = unigrad.asarray(X, backend=backend), unigrad.asarray(y, backend=backend)  # the data: converted once
    gradient = unigrad.grad(loss, argnums=(0, 1), backend=backend)  # d loss / d w and d loss / d b
    for _ in range(max_steps):
        # the parameters stay NumPy float64 (each backend takes them as they are); the update is NumPy's
        grad_w, grad_b = (unigrad.to_numpy(g) for g in gradient(w, b, X, y))
        assert grad_w.dtype == np.float64  # float64 in, float64 out, on every backend
        w, b = w - learning_rate * grad_w, b - learning_rate * grad_b
        if max(np.max(np.abs(grad_w)), abs(float(grad_b))) < tolerance:
            break
    return w, b


def main(backend=None):
    w, b = fit(backend)
    _, _, X, y = loss_inputs()
    # the exact least-squares solution, for comparison
    solution, *_ = np.linalg.lstsq(np.c_[X, np.ones(len(X))], y, rcond=None)
    error = max(np.max(np.abs(w - solution[:-1])), abs(float(b) - solution[-1]))
    print(f"{backend or 'numpy'}: w = {np.round(w, 4)}, b = {float(b):.4f}; max |error| vs lstsq = {error:.1e}")
    assert error < 1e-6, error


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
