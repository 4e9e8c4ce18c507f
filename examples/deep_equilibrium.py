"""A deep-equilibrium layer trained on every backend: the derivative of a fixed point, not of its iterations.

The layer's output is the fixed point ``Z = tanh(Z W^T + X U^T + b)`` (one row per example), found by
plain fixed-point iteration; a linear read-out ``Z v`` is fitted to targets ``y``. The solver is
wrapped in ``unigrad.custom_fixed_point``: nothing differentiates its iterations, the gradient with
respect to ``W``, ``U`` and ``b`` comes from the implicit function theorem (one linear solve with
``I - d_Z T`` per gradient), so memory does not grow with the number of iterations.

The model is written once with the array namespace (``xp = unigrad.namespace(...)``); ``main()``
trains it for a few gradient steps on every installed backend that differentiates custom rules with
nested transforms, and asserts that

- the losses of every step agree across backends (float64 to rounding; float32 on MLX to 1e-5),
- the implicit gradient equals the gradient of the unrolled iterations (differentiating all of them
  on the NumPy tape), and a central finite difference of the loss,
- the loss went down.

A backend that cannot take the derivatives nested in the implicit rule says so with a
NotImplementedError rather than a wrong gradient (docs/implicit.md, "Limits"): it is reported as
left out, with the error's message.

Run it:  python examples/deep_equilibrium.py
"""

from __future__ import annotations

import numpy as np

import unigrad

ITERATIONS = 80  # the contraction factor is <= 0.5 (|W| <= 0.5, tanh 1-Lipschitz): 0.5**80 is far below 1e-12
STEPS, LEARNING_RATE = 5, 0.5


def layer_map(z, w, u, b, x):
    """One application of the layer, T(Z) = tanh(Z W^T + X U^T + b)."""
    xp = unigrad.namespace(z, w)
    return xp.tanh(z @ xp.matrix_transpose(w) + x @ xp.matrix_transpose(u) + b)


def iterate(init, w, u, b, x):
    """The forward solver: plain fixed-point iteration (runs as plain code, nothing differentiates it)."""
    z = init
    for _ in range(ITERATIONS):
        z = layer_map(z, w, u, b, x)
    return z


equilibrium = unigrad.custom_fixed_point(layer_map)(iterate)


def loss(params, x, y, solver=equilibrium):
    """Mean squared error of the read-out of the equilibrium; ``solver=iterate`` gives the unrolled model."""
    xp = unigrad.namespace(x, params["w"])
    z0 = xp.zeros((x.shape[0], params["w"].shape[0]), dtype=x.dtype)
    z = solver(z0, params["w"], params["u"], params["b"], x)
    r = z @ params["v"] - y
    return xp.mean(r * r)


def problem(seed=0, batch=16, features=3, width=6):
    """Parameters (spectral norm of W at 0.5: the map is a contraction), inputs and targets, in NumPy float64."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((width, width))
    params = {"w": 0.5 * w / np.linalg.norm(w, 2), "u": rng.standard_normal((width, features)) / np.sqrt(features),
              "b": np.zeros(width), "v": rng.standard_normal(width) / np.sqrt(width)}
    x = rng.standard_normal((batch, features))
    return params, x, np.sin(x.sum(axis=1))


def train(backend, steps=STEPS):
    """Gradient descent on ``backend``: the loss of each step, and the first step's gradient (NumPy)."""
    params, x, y = problem()
    losses, first = [], None
    step = unigrad.value_and_grad(loss, backend=backend)
    for _ in range(steps):
        value, grads = step(params, x, y)
        grads = {k: np.asarray(unigrad.to_numpy(g), dtype=np.float64) for k, g in grads.items()}
        first = grads if first is None else first
        losses.append(float(unigrad.to_numpy(value)))
        params = {k: params[k] - LEARNING_RATE * grads[k] for k in params}
    return losses, first


def check_gradient(first):
    """The implicit gradient against the unrolled iterations' gradient and a central finite difference."""
    params, x, y = problem()
    unrolled = unigrad.grad(lambda p: loss(p, x, y, solver=iterate), backend="numpy")(params)
    for k in params:
        np.testing.assert_allclose(first[k], unrolled[k], rtol=1e-8, atol=1e-12, err_msg=k)
    h, direction = 1e-5, {k: np.random.default_rng(1).standard_normal(v.shape) for k, v in params.items()}
    shifted = [float(loss({k: params[k] + s * h * direction[k] for k in params}, x, y)) for s in (1, -1)]
    fd = (shifted[0] - shifted[1]) / (2 * h)
    along = sum(float(np.sum(first[k] * direction[k])) for k in params)
    assert abs(fd - along) <= 1e-7 * max(1.0, abs(fd)), (fd, along)
    return max(float(np.max(np.abs(first[k] - unrolled[k]))) for k in params), abs(fd - along)


def main(backends=None):
    """Run on ``backends`` (names; default every installed backend): {name: result}, {name: why it was left out}."""
    installed = backends or [name for name, info in unigrad.backends().items() if info["available"]]
    installed = ["numpy"] + [name for name in installed if name != "numpy"]  # the NumPy tape first: the reference
    results, left_out = {}, {}
    for name in installed:
        try:
            losses, first = train(name)
        except NotImplementedError as error:  # a refusal, never a wrong number (see the docstring)
            left_out[name] = str(error)
            print(f"{name:>10}: left out: {str(error).splitlines()[0]}")
            continue
        results[name] = losses
        line = f"{name:>10}: losses = " + " ".join(f"{v:.10f}" for v in losses)
        if name == "numpy":
            unrolled_diff, fd_diff = check_gradient(first)
            line += f"  (|implicit - unrolled| = {unrolled_diff:.1e}, |implicit - finite difference| = {fd_diff:.1e})"
        else:
            diff = max(abs(a - b) for a, b in zip(losses, results["numpy"]))
            line += f"  (max |difference| from numpy: {diff:.1e})"
            # float64 agrees to rounding; a backend that computes no float64 (MLX) gets float32's accuracy
            assert diff < (1e-12 if unigrad.get_backend(name).capabilities.float64 else 1e-5), (name, diff)
        assert losses[-1] < 0.9 * losses[0], (name, losses)  # it trains
        print(line)
    return results, left_out


if __name__ == "__main__":
    main()
