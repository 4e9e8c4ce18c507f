"""Newton-CG with Hessian-vector products: second-order optimisation without the Hessian.

Newton-CG solves ``H p = -g`` by conjugate gradients, which only ever needs products ``H v``.
``unigrad.hvp(f, primals, tangents)`` computes one by forward-over-reverse differentiation at a
few gradients' cost, so the n x n Hessian is never built -- the point when n is large.

The problem: L2-regularised logistic regression (a smooth, strictly convex loss).

Run it:    python examples/newton_cg_hvp.py [backend]
Check it:  unigrad check examples/newton_cg_hvp.py:logistic_loss --order 2
"""

import sys

import numpy as np
from scipy.optimize import minimize

import unigrad


def logistic_loss(w, X, labels):
    """Mean logistic loss of labels in {0, 1} under scores X @ w, plus 0.01 * |w|^2 / 2."""
    xp = unigrad.namespace(w, X)
    scores = xp.matmul(X, w)
    # log(1 + exp(s)) - label * s, written to stay finite for large |s|
    softplus = xp.maximum(scores, 0.0 * scores) + xp.log1p(xp.exp(-xp.abs(scores)))
    return xp.mean(softplus - labels * scores) + 0.005 * xp.sum(w * w)


def logistic_loss_inputs(seed=0, samples=300, features=20):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((samples, features))
    labels = (X @ rng.standard_normal(features) + 0.5 * rng.standard_normal(samples) > 0).astype(np.float64)
    return 0.1 * rng.standard_normal(features), X, labels


def solve(backend=None):
    w0, X, labels = logistic_loss_inputs()
    X_b, labels_b = unigrad.asarray(X, backend=backend), unigrad.asarray(labels, backend=backend)
    value_and_grad = unigrad.value_and_grad(logistic_loss, backend=backend)

    def fun(w):
        # the loss and its gradient from one sweep (jac=True below). Evaluate through a transform:
        # on JAX, float64 is float64 inside unigrad's transforms, not in a plain call
        value, gradient = value_and_grad(w, X_b, labels_b)
        return float(unigrad.to_numpy(value)), np.asarray(unigrad.to_numpy(gradient))

    def hessp(w, v):
        # H(w) @ v without H: forward-mode derivative of the gradient in direction v
        (product,) = unigrad.hvp(lambda w: logistic_loss(w, X_b, labels_b), (w,), (v,), backend=backend)
        return np.asarray(unigrad.to_numpy(product))  # one product per primal

    return minimize(fun, w0, jac=True, hessp=hessp, method="Newton-CG", options={"xtol": 1e-10}), hessp


def main(backend=None):
    result, hessp = solve(backend)
    w0, X, labels = logistic_loss_inputs()
    print(f"{backend or 'numpy'}: {result.message} after {result.nit} Newton steps, "
          f"{result.nhev} Hessian-vector products; loss {result.fun:.8f}")
    assert result.success, result.message
    # at the optimum the gradient vanishes ...
    p = 1 / (1 + np.exp(-X @ result.x))
    grad = X.T @ (p - labels) / len(labels) + 0.01 * result.x
    assert np.max(np.abs(grad)) < 1e-6, grad
    # ... and the Hessian-vector products are those of the Hessian written out by hand
    hessian = X.T @ (X * (p * (1 - p))[:, None]) / len(labels) + 0.01 * np.eye(X.shape[1])
    v = np.random.default_rng(1).standard_normal(X.shape[1])
    np.testing.assert_allclose(hessp(result.x, v), hessian @ v, rtol=1e-10, atol=1e-12)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
