"""``scipy.optimize.minimize`` with exact gradients from any backend.

SciPy's optimisers take NumPy in and want ``(value, gradient)`` back (``jac=True``).
``unigrad.value_and_grad`` gives both from one forward and one reverse sweep on whichever
backend is chosen; the same portable objective runs on the NumPy tape, PyTorch, JAX,
TensorFlow or a plugin.

Run it:    python examples/scipy_minimize.py [backend]
Check it:  unigrad check examples/scipy_minimize.py:rosenbrock
"""

import sys

import numpy as np
from scipy.optimize import minimize

import unigrad


def rosenbrock(x):
    """The Rosenbrock function in n dimensions: a curved valley, minimum 0 at x = (1, ..., 1)."""
    xp = unigrad.namespace(x)
    return xp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def rosenbrock_inputs(seed=0, n=6):
    return (np.random.default_rng(seed).uniform(-1.5, 1.5, n),)


def numpy_objective(f, backend=None):
    """``x -> (f(x), grad f(x))`` as float64 NumPy values, for SciPy."""
    value_and_grad = unigrad.value_and_grad(f, backend=backend)

    def objective(x):
        value, gradient = value_and_grad(x)
        return float(unigrad.to_numpy(value)), np.asarray(unigrad.to_numpy(gradient), dtype=np.float64)

    return objective


def solve(backend=None):
    (x0,) = rosenbrock_inputs()
    return minimize(numpy_objective(rosenbrock, backend), x0, jac=True, method="L-BFGS-B",
                    options={"gtol": 1e-10, "ftol": 1e-15, "maxiter": 1000})


def main(backend=None):
    result = solve(backend)
    print(f"{backend or 'numpy'}: {result.message} after {result.nit} iterations; x = {np.round(result.x, 6)}")
    assert result.success, result.message
    np.testing.assert_allclose(result.x, np.ones_like(result.x), atol=1e-5)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
